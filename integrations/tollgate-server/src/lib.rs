//! A RESP server in front of tollgate's keyed token bucket, compatible with redis-cell's
//! `CL.THROTTLE`: clients that already speak it (any Redis client library, `redis-cli`,
//! `redis-benchmark`) get tollgate's exact, lock-free decisions over the network.
//!
//! `CL.THROTTLE key max_burst count period [quantity]` answers as redis-cell does: limited
//! (0/1), the limit (`max_burst + 1`), the tokens remaining, the retry-after in seconds (`-1`
//! when allowed, or when the quantity can never fit), and the seconds until the bucket is full
//! again, seconds rounded as redis-cell rounds them (truncated, plus one if the rest is at least
//! a millisecond). Each distinct `(max_burst, count, period)` gets its own keyed table, built on
//! first use, holding up to the server's capacity of keys (full buckets are evicted first); at
//! `max_quotas` tables, one unused for its quota's fill time (so every key in it is full again,
//! and dropping it changes no answer) makes room for a new quota.
//!
//! Also `PING`, `ECHO`, `QUIT`, `HELLO` (RESP2 and RESP3: the replies of the other commands are
//! the same in both), `COMMAND`, `INFO` with the server's counters, and the few commands clients
//! send on connecting (`CLIENT …`, `SELECT 0`, `CONFIG GET`). Unknown commands, bad arguments
//! and refused requests (an argument over the limit, skipped as it arrives, unbuffered; too
//! many arguments) get errors that say what was wrong, and the connection goes on; a frame
//! whose lengths cannot be read, or a request over the request limit, gets its error and then
//! the connection is closed, as Redis does (see [`resp`]). Silent connections are closed after
//! the idle timeout, so that they cannot hold every connection slot.

pub mod resp;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tollgate::{Decision, KeyedLimiter, Outcome, Rate, TokenBucket, WhenFull};

use resp::{reply, Limits, Parsed, Parser};

/// How the server is bounded.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Keys per quota's table.
    pub capacity: usize,
    /// Distinct `(max_burst, count, period)` quotas, each a table of `capacity` keys.
    pub max_quotas: usize,
    /// Connections served at once; more are told so and closed.
    pub max_connections: usize,
    /// What one request may hold.
    pub limits: Limits,
    /// How long a connection may stay silent before the server closes it (`None`: forever).
    pub idle_timeout: Option<Duration>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            capacity: 1 << 20,
            max_quotas: 8,
            max_connections: 1024,
            limits: Limits::default(),
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// The server's counters, as `INFO` shows them.
#[derive(Debug, Default)]
struct Counters {
    connections_received: AtomicU64,
    connected: AtomicU64,
    rejected_connections: AtomicU64,
    accept_errors: AtomicU64,
    commands: AtomicU64,
    throttle_calls: AtomicU64,
    throttle_limited: AtomicU64,
    protocol_errors: AtomicU64,
    unknown_commands: AtomicU64,
    quotas_evicted: AtomicU64,
}

fn bump(c: &AtomicU64) {
    // Relaxed: statistics only.
    c.fetch_add(1, Relaxed);
}

/// Closes a connection the server ends: its replies are written, so shut the write side and
/// read what the client still sends for a moment, so that the close is a FIN, not a reset that
/// could destroy the last reply in flight.
async fn close(mut stream: TcpStream) -> io::Result<()> {
    stream.shutdown().await?;
    let mut sink = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
    Ok(())
}

/// A quota's key: `(max_burst, count, period in seconds)`.
type QuotaKey = (u64, u64, u64);

/// One quota's table, and when a decision last used it.
#[derive(Debug)]
struct QuotaTable {
    limiter: KeyedLimiter<Vec<u8>>,
    /// Milliseconds since the server started, at the last decision (written under the tables'
    /// read lock, read under their write lock: see [`Server::evict_idle`]).
    last_used_ms: AtomicU64,
    /// How long the table must go unused before dropping it loses nothing: its quota's time
    /// from empty to full, plus a margin for the two clocks (the table's TSC, the server's
    /// `Instant`) drifting apart.
    idle_ms: u64,
}

/// The server: its tables and counters. Serve it with [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    config: Config,
    tables: RwLock<HashMap<QuotaKey, QuotaTable>>,
    /// Held while a table is built (see `add_table`).
    building: Mutex<()>,
    counters: Counters,
    connections: Arc<Semaphore>,
    started: Instant,
}

/// After a command: go on, or close the connection once the replies are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

impl Server {
    /// A server with `config`.
    pub fn new(config: Config) -> Arc<Server> {
        Arc::new(Server {
            config,
            tables: RwLock::new(HashMap::new()),
            building: Mutex::new(()),
            counters: Counters::default(),
            connections: Arc::new(Semaphore::new(config.max_connections.clamp(1, Semaphore::MAX_PERMITS))),
            started: Instant::now(),
        })
    }

    /// Accepts connections on `listener`, each on its own task, for as long as the task runs.
    /// A failed accept (a connection reset before it was accepted, or no file descriptor
    /// left) is counted and retried after a pause; it never stops the server.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let mut stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    bump(&self.counters.accept_errors);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            bump(&self.counters.connections_received);
            let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
                bump(&self.counters.rejected_connections);
                tokio::spawn(async move {
                    if stream.write_all(b"-ERR max number of clients reached\r\n").await.is_ok() {
                        let _ = close(stream).await;
                    }
                });
                continue;
            };
            let _ = stream.set_nodelay(true);
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                /// Counts the connection out however its task ends.
                struct Connected<'a>(&'a AtomicU64);
                impl Drop for Connected<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Relaxed);
                    }
                }
                server.counters.connected.fetch_add(1, Relaxed);
                let _connected = Connected(&server.counters.connected);
                let _ = server.connection(stream).await;
                drop(permit);
            });
        }
    }

    async fn connection(&self, mut stream: TcpStream) -> io::Result<()> {
        let limits = self.config.limits;
        let mut parser = Parser::new(limits);
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        loop {
            // Every complete request in the buffer, replies batched (pipelining costs one write
            // per read), written out whenever they pass 64 KiB.
            let mut flow = Flow::Continue;
            while flow == Flow::Continue {
                match parser.next(&mut input) {
                    Parsed::Request(args) => flow = self.execute(&args, &mut out),
                    Parsed::Error(e) => {
                        bump(&self.counters.protocol_errors);
                        reply::error(&mut out, &e);
                    }
                    Parsed::Fatal(e) => {
                        bump(&self.counters.protocol_errors);
                        reply::error(&mut out, &e);
                        flow = Flow::Close;
                    }
                    Parsed::Incomplete => break,
                }
                if out.len() > 64 * 1024 {
                    stream.write_all(&out).await?;
                    out.clear();
                }
            }
            if !out.is_empty() {
                stream.write_all(&out).await?;
                out.clear();
            }
            if flow == Flow::Close {
                return close(stream).await;
            }
            if input.is_empty() && input.capacity() > 256 * 1024 {
                input = BytesMut::with_capacity(16 * 1024); // a large request's buffer, given back
            }
            let read = stream.read_buf(&mut input);
            let n = match self.config.idle_timeout {
                Some(idle) => match tokio::time::timeout(idle, read).await {
                    Ok(n) => n?,
                    Err(_) => return close(stream).await, // idle: the slot goes to someone else
                },
                None => read.await?,
            };
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// Runs one command, appending its reply.
    fn execute(&self, args: &[Vec<u8>], out: &mut BytesMut) -> Flow {
        bump(&self.counters.commands);
        let name = args[0].to_ascii_uppercase();
        let arity = |want: &str, ok: bool, out: &mut BytesMut| {
            if !ok {
                reply::error(out, &format!("ERR wrong number of arguments for '{want}' command"));
            }
            ok
        };
        match name.as_slice() {
            b"CL.THROTTLE" => {
                if arity("cl.throttle", matches!(args.len(), 5 | 6), out) {
                    self.throttle(args, out);
                }
            }
            b"PING" => match args.len() {
                1 => reply::simple(out, "PONG"),
                2 => reply::bulk(out, &args[1]),
                _ => {
                    arity("ping", false, out);
                }
            },
            b"ECHO" => {
                if arity("echo", args.len() == 2, out) {
                    reply::bulk(out, &args[1]);
                }
            }
            b"QUIT" => {
                reply::simple(out, "OK");
                return Flow::Close;
            }
            b"HELLO" => self.hello(args, out),
            b"COMMAND" => match args.get(1).map(|a| a.to_ascii_uppercase()) {
                Some(sub) if sub == b"COUNT" => reply::integer(out, COMMANDS.len() as i64),
                _ => reply::array(out, 0),
            },
            b"INFO" => reply::bulk(out, self.info().as_bytes()),
            b"SELECT" => {
                if arity("select", args.len() == 2, out) {
                    match args[1].as_slice() {
                        b"0" => reply::simple(out, "OK"),
                        _ => reply::error(out, "ERR only database 0 exists"),
                    }
                }
            }
            b"CLIENT" => reply::simple(out, "OK"),
            b"CONFIG" => reply::array(out, 0),
            _ => {
                bump(&self.counters.unknown_commands);
                let shown = String::from_utf8_lossy(&args[0][..args[0].len().min(64)]).into_owned();
                reply::error(
                    out,
                    &format!("ERR unknown command '{shown}', with {} arguments", args.len() - 1),
                );
            }
        }
        Flow::Continue
    }

    fn hello(&self, args: &[Vec<u8>], out: &mut BytesMut) {
        let version =
            match args.get(1).map(|v| std::str::from_utf8(v).ok().and_then(|v| v.parse::<u32>().ok())) {
                None => 2,
                Some(Some(v @ (2 | 3))) => v,
                Some(_) => {
                    reply::error(out, "NOPROTO unsupported protocol version");
                    return;
                }
            };
        // The replies of every other command are the same in RESP2 and RESP3, so the version
        // only changes this one: a map in RESP3, a flat array in RESP2.
        let fields: [(&str, &[u8]); 4] = [
            ("server", b"tollgate"),
            ("version", env!("CARGO_PKG_VERSION").as_bytes()),
            ("mode", b"standalone"),
            ("role", b"master"),
        ];
        if version == 3 {
            out.extend_from_slice(format!("%{}\r\n", fields.len() + 1).as_bytes());
        } else {
            reply::array(out, 2 * (fields.len() + 1));
        }
        for (k, v) in fields {
            reply::bulk(out, k.as_bytes());
            reply::bulk(out, v);
        }
        reply::bulk(out, b"proto");
        reply::integer(out, i64::from(version));
    }

    /// `CL.THROTTLE key max_burst count period [quantity]`.
    fn throttle(&self, args: &[Vec<u8>], out: &mut BytesMut) {
        bump(&self.counters.throttle_calls);
        let int = |i: usize, name: &str| -> Result<u64, String> {
            let a = &args[i];
            std::str::from_utf8(a).ok().and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| {
                let shown = String::from_utf8_lossy(&a[..a.len().min(32)]).into_owned();
                format!("ERR {name} must be a non-negative integer, got '{shown}'")
            })
        };
        let parsed = (|| -> Result<(u64, u64, u64, u64), String> {
            let (max_burst, count, period) = (int(2, "max_burst")?, int(3, "count")?, int(4, "period")?);
            let quantity = if args.len() == 6 { int(5, "quantity")? } else { 1 };
            Ok((max_burst, count, period, quantity))
        })();
        let (max_burst, count, period, quantity) = match parsed {
            Ok(p) => p,
            Err(e) => return reply::error(out, &e),
        };
        let key = (max_burst, count, period);
        loop {
            // The decision is made under the read lock: a table is only dropped under the write
            // lock, after going unused for its fill time, so no decision is ever made on a table
            // that is being dropped (it would be lost).
            {
                let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(t) = tables.get(&key) {
                    let d = t.limiter.check_n(args[1].as_slice(), quantity);
                    let now = self.now_ms();
                    // Relaxed: the write lock that reads it orders it (see `evict_idle`). A max,
                    // not a store: a thread stalled after its load must not write an older time
                    // over a newer one. At most one read-modify-write per table per millisecond.
                    if t.last_used_ms.load(Relaxed) < now {
                        t.last_used_ms.fetch_max(now, Relaxed);
                    }
                    if !d.is_allowed() {
                        bump(&self.counters.throttle_limited);
                    }
                    return write_throttle(out, &d, t.limiter.policy().burst());
                }
            }
            if let Err(e) = self.add_table_off_worker(key) {
                return reply::error(out, &e);
            }
        }
    }

    /// Milliseconds since the server started, rounded up (a table's last use is never earlier
    /// than the decision).
    fn now_ms(&self) -> u64 {
        let e = self.started.elapsed();
        u64::try_from(e.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(u64::from(e.subsec_nanos() % 1_000_000 != 0))
    }

    /// [`add_table`](Server::add_table) without holding up the connections that share this
    /// worker thread: building a table writes every slot (tens of milliseconds for a million
    /// keys), and a wait for another connection's build can be as long. On a multi-threaded
    /// runtime the worker hands its other tasks to another thread first (`block_in_place`); on
    /// a current-thread runtime (which cannot) the build runs in place.
    fn add_table_off_worker(&self, key: QuotaKey) -> Result<(), String> {
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| self.add_table(key))
            }
            _ => self.add_table(key),
        }
    }

    /// Builds the table of this quota (on its first use). At `--max-quotas`, a table unused for
    /// longer than its quota's fill time makes room: every key in it is full again, so dropping
    /// it changes no answer (a key a table does not hold is a full bucket). Otherwise the quota
    /// is refused.
    fn add_table(&self, key: QuotaKey) -> Result<(), String> {
        let (max_burst, count, period) = key;
        if count == 0 || period == 0 {
            return Err("ERR Zero rates are not supported".into());
        }
        let burst = max_burst.checked_add(1).ok_or("ERR max_burst is too large")?;
        let quota = TokenBucket::new(Rate::per(count, Duration::from_secs(period)), burst)
            .map_err(|e| format!("ERR invalid quota: {e}"))?;
        // One table built at a time, so that the tables never hold more than `max_quotas + 1`
        // tables' memory, however many connections ask for new quotas at once.
        let _building = self.building.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        {
            let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if tables.contains_key(&key) {
                return Ok(()); // built by another connection meanwhile
            }
            // A hint: taken again under the write lock by `evict_idle`.
            if tables.len() >= self.config.max_quotas && self.idlest(&tables).is_none() {
                return Err(self.too_many_quotas());
            }
        }
        // Built outside the tables' lock (it writes every slot of the table): decisions on the
        // other quotas go on meanwhile.
        let limiter = KeyedLimiter::<Vec<u8>>::builder(quota)
            .capacity(self.config.capacity)
            .when_full(WhenFull::EvictFullest)
            .build()
            .map_err(|e| format!("ERR cannot hold this quota: {e}"))?;
        let fill_ms = quota.fill_time().as_u64().div_ceil(1_000_000);
        let idle_ms = fill_ms.saturating_add(fill_ms / 100).saturating_add(10);
        let table = QuotaTable { limiter, last_used_ms: AtomicU64::new(self.now_ms()), idle_ms };
        let mut tables = self.tables.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tables.contains_key(&key) {
            return Ok(()); // built by another connection meanwhile
        }
        if tables.len() >= self.config.max_quotas && !self.evict_idle(&mut tables) {
            return Err(self.too_many_quotas());
        }
        tables.insert(key, table);
        Ok(())
    }

    /// The table unused the longest, if it has gone unused for longer than its fill time.
    fn idlest(&self, tables: &HashMap<QuotaKey, QuotaTable>) -> Option<QuotaKey> {
        let now = self.now_ms();
        tables
            .iter()
            .map(|(k, t)| (now.saturating_sub(t.last_used_ms.load(Relaxed)), t.idle_ms, *k))
            .filter(|&(unused, idle_ms, _)| unused > idle_ms)
            .max_by_key(|&(unused, _, _)| unused)
            .map(|(_, _, k)| k)
    }

    /// Drops the [`idlest`](Server::idlest) table, if any. Under the write lock no decision is
    /// in flight, and every decision made under an earlier read lock wrote its time before
    /// releasing it (the lock orders those Relaxed writes before these loads), so the times read
    /// here are the last uses.
    fn evict_idle(&self, tables: &mut HashMap<QuotaKey, QuotaTable>) -> bool {
        let Some(k) = self.idlest(tables) else { return false };
        tables.remove(&k);
        bump(&self.counters.quotas_evicted);
        true
    }

    fn too_many_quotas(&self) -> String {
        format!(
            "ERR this server holds {} distinct (max_burst, count, period) quotas, its limit (--max-quotas), \
             and each was used within its fill time",
            self.config.max_quotas
        )
    }

    fn info(&self) -> String {
        let c = &self.counters;
        let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let keys: u64 = tables.values().map(|t| t.limiter.len()).sum();
        let capacity: u64 = tables.values().map(|t| t.limiter.capacity()).sum();
        format!(
            "# Server\r\nserver:tollgate\r\ntollgate_version:{}\r\nuptime_in_seconds:{}\r\n\
             \r\n# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\
             \r\n# Stats\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\naccept_errors:{}\r\n\
             total_commands_processed:{}\r\nthrottle_calls:{}\r\nthrottle_limited:{}\r\n\
             protocol_errors:{}\r\nunknown_commands:{}\r\n\
             \r\n# Keyspace\r\nquotas:{}\r\nmax_quotas:{}\r\nquotas_evicted:{}\r\nkeys:{}\r\nkeys_capacity:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            self.started.elapsed().as_secs(),
            c.connected.load(Relaxed),
            self.config.max_connections,
            c.connections_received.load(Relaxed),
            c.rejected_connections.load(Relaxed),
            c.accept_errors.load(Relaxed),
            c.commands.load(Relaxed),
            c.throttle_calls.load(Relaxed),
            c.throttle_limited.load(Relaxed),
            c.protocol_errors.load(Relaxed),
            c.unknown_commands.load(Relaxed),
            tables.len(),
            self.config.max_quotas,
            c.quotas_evicted.load(Relaxed),
            keys,
            capacity,
        )
    }
}

/// The commands this server knows (for `COMMAND COUNT`).
const COMMANDS: [&str; 10] =
    ["CL.THROTTLE", "PING", "ECHO", "QUIT", "HELLO", "COMMAND", "INFO", "SELECT", "CLIENT", "CONFIG"];

/// Seconds as redis-cell replies them: truncated, plus one if the rest is at least 1 ms.
fn cell_seconds(d: Duration) -> i64 {
    let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    if d.subsec_millis() >= 1 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// redis-cell's five integers for `d`.
fn write_throttle(out: &mut BytesMut, d: &Decision, limit: u64) {
    let limited = !d.is_allowed();
    let retry = match (limited, d.outcome(), d.retry_after()) {
        (true, Outcome::Denied, Some(wait)) => cell_seconds(wait),
        _ => -1, // allowed, or a quantity that never fits, or no room for the key
    };
    reply::array(out, 5);
    reply::integer(out, i64::from(limited));
    reply::integer(out, i64::try_from(limit).unwrap_or(i64::MAX));
    reply::integer(out, i64::try_from(d.remaining()).unwrap_or(i64::MAX));
    reply::integer(out, retry);
    reply::integer(out, cell_seconds(d.reset_after()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_as_redis_cell_rounds_them() {
        assert_eq!(cell_seconds(Duration::from_millis(2000)), 2);
        assert_eq!(cell_seconds(Duration::from_micros(2_000_999)), 2, "a sub-millisecond rest is dropped");
        assert_eq!(cell_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(cell_seconds(Duration::ZERO), 0);
    }

    fn run(server: &Server, cmd: &[&str]) -> Vec<u8> {
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let mut out = BytesMut::new();
        server.execute(&args, &mut out);
        out.to_vec()
    }

    /// redis-cell's README: `CL.THROTTLE user123 15 30 60` on a fresh key gives 0, 16, 15, -1, 2.
    #[test]
    fn the_redis_cell_vector() {
        let server = Server::new(Config { capacity: 1024, ..Config::default() });
        let got = run(&server, &["CL.THROTTLE", "user123", "15", "30", "60"]);
        assert_eq!(got, b"*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n");
        // Sixteen in all, then limited with a wait of one token (2 s).
        for _ in 0..15 {
            assert!(run(&server, &["cl.throttle", "user123", "15", "30", "60"]).starts_with(b"*5\r\n:0\r\n"));
        }
        let limited = run(&server, &["CL.THROTTLE", "user123", "15", "30", "60"]);
        assert!(
            limited.starts_with(b"*5\r\n:1\r\n:16\r\n:0\r\n:2\r\n"),
            "{}",
            String::from_utf8_lossy(&limited)
        );
        // A quantity beyond the limit never fits: limited, retry -1.
        let never = run(&server, &["CL.THROTTLE", "other", "15", "30", "60", "17"]);
        assert!(
            never.starts_with(b"*5\r\n:1\r\n:16\r\n:16\r\n:-1\r\n"),
            "{}",
            String::from_utf8_lossy(&never)
        );
    }

    #[test]
    fn a_table_unused_for_its_fill_time_makes_room_and_a_busy_one_stays() {
        let server = Server::new(Config { capacity: 1024, max_quotas: 2, ..Config::default() });
        let cmd = |c: &[&str]| String::from_utf8(run(&server, c)).unwrap();
        // Quota A: burst 2 at 2/s (full again 1 s after it empties); B: burst 1 at 1/min; C:
        // burst 1 at 4/s. (Fill times long enough that a stalled test thread does not make a
        // table look idle early.)
        let a = ["CL.THROTTLE", "k", "1", "2", "1"];
        let b = ["CL.THROTTLE", "k", "0", "1", "60"];
        let c = ["CL.THROTTLE", "k", "0", "4", "1"];
        assert!(cmd(&a).starts_with("*5\r\n:0\r\n"));
        assert!(cmd(&b).starts_with("*5\r\n:0\r\n"));
        assert!(cmd(&b).starts_with("*5\r\n:1\r\n"), "B's one token is spent");
        // Both just used: a third quota is refused.
        assert!(cmd(&c).contains("2 distinct"));
        // A goes unused for longer than its fill time (1 s, plus the margin); B keeps being used.
        // The third quota takes A's place, never B's, whose key is empty.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1200) {
            assert!(cmd(&b).starts_with("*5\r\n:1\r\n"));
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(cmd(&c).starts_with("*5\r\n:0\r\n"));
        assert!(cmd(&INFO).contains("quotas_evicted:1\r\n"));
        assert!(cmd(&b).starts_with("*5\r\n:1\r\n"), "B kept its state");
        // A comes back in C's place (now unused for longer than its fill time), as a new table:
        // its key is full, as it was in the dropped one.
        std::thread::sleep(Duration::from_millis(400));
        let again = cmd(&a);
        assert!(again.starts_with("*5\r\n:0\r\n:2\r\n:1\r\n"), "{again:?} {}", cmd(&INFO));
        assert!(cmd(&INFO).contains("quotas_evicted:2\r\n"));
    }

    const INFO: [&str; 1] = ["INFO"];

    #[test]
    fn bad_arguments_are_errors_that_say_what_was_wrong() {
        let server = Server::new(Config { capacity: 1024, max_quotas: 2, ..Config::default() });
        let err = |cmd: &[&str]| String::from_utf8(run(&server, cmd)).unwrap();
        assert!(err(&["CL.THROTTLE", "k", "15", "0", "60"]).starts_with("-ERR Zero rates"));
        assert!(err(&["CL.THROTTLE", "k", "15", "30", "0"]).starts_with("-ERR Zero rates"));
        assert!(err(&["CL.THROTTLE", "k", "-1", "30", "60"])
            .contains("max_burst must be a non-negative integer, got '-1'"));
        assert!(err(&["CL.THROTTLE", "k", "15", "30"]).contains("wrong number of arguments"));
        assert!(err(&["CL.THROTTLE", "k", "18446744073709551615", "30", "60"]).starts_with("-ERR"));
        assert!(err(&["NOPE", "a"]).starts_with("-ERR unknown command 'NOPE', with 1 arguments"));
        assert!(err(&["CL.THROTTLE", "k", "1", "30", "60"]).starts_with("*5"));
        assert!(err(&["CL.THROTTLE", "k", "2", "30", "60"]).starts_with("*5"));
        assert!(err(&["CL.THROTTLE", "k", "3", "30", "60"]).contains("2 distinct"));
        // Both tables were just used, and their fill time is a minute: neither makes room.
        assert!(err(&["INFO"]).contains("quotas_evicted:0\r\n"));
        assert_eq!(err(&["PING"]), "+PONG\r\n");
        assert_eq!(err(&["HELLO", "4"]), "-NOPROTO unsupported protocol version\r\n");
        assert!(err(&["HELLO", "3"]).starts_with("%5\r\n"));
        assert!(err(&["INFO"]).contains("throttle_calls:"));
    }
}
