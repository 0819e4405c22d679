//! A RESP server in front of tollgate's keyed token bucket, compatible with redis-cell's
//! `CL.THROTTLE`: clients that already speak it (any Redis client library, `redis-cli`,
//! `redis-benchmark`) get tollgate's exact, lock-free decisions over the network.
//!
//! `CL.THROTTLE key max_burst count period [quantity]` answers as redis-cell does: limited
//! (0/1), the limit (`max_burst + 1`), the tokens remaining, the retry-after in seconds (`-1`
//! when allowed, or when the quantity can never fit), and the seconds until the bucket is full
//! again, seconds rounded as redis-cell rounds them (truncated, plus one if the rest is at least
//! a millisecond). The integer arguments are read as Redis reads its own: decimal digits, no
//! sign, no leading zero (`+5` and `05` are errors; redis-cell, which parses with Rust's
//! `parse`, takes both).
//!
//! # Quotas
//!
//! Each distinct `(max_burst, count, period)` is a keyed table of its own. Quotas **declared**
//! in the configuration ([`Config::quotas`], `--quota 15:30:60`) are built at start, each with
//! the capacity it was declared with, and are never dropped: no client can take their room.
//! Others (**undeclared**) are built on first use, each holding [`Config::capacity`] keys, up
//! to [`Config::max_quotas`] of them at once, each filling within
//! [`Config::max_fill_time`]: at the limit, one unused for its quota's fill time (so every key
//! in it is full again, and dropping it changes no answer) makes room for a new one; otherwise
//! the new quota is refused, never served by dropping state (that would admit more than the
//! quota). A flood of distinct shapes therefore costs at most `max_quotas` tables, holds them
//! at most `max_fill_time` past its last call, and never touches a declared quota;
//! `max_quotas = 0` serves the declared quotas only.
//!
//! # Authentication
//!
//! With users configured ([`Config::users`]: `--requirepass` for Redis's `default` user,
//! `--user name:password` for more), a connection must `AUTH password`, `AUTH user password`
//! or `HELLO 3 AUTH user password` before anything but `QUIT`: other commands get `-NOAUTH`,
//! a wrong password `-WRONGPASS` (counted in `INFO` as `auth_failures`), and until it
//! authenticates a request may hold 10 arguments of 16 KiB each, Redis's limits for
//! unauthenticated clients. Passwords are compared in constant time.
//!
//! # As a service
//!
//! The binary reads its configuration from flags or from a TOML file ([`file`](mod@file)), reloads the
//! file on SIGHUP ([`Server::reload`]: tables keep their state; a file that cannot be served is
//! refused whole), and on SIGTERM stops accepting and closes each connection once it has
//! answered what it received ([`Server::shutdown`], [`Server::drained`]). Logs go through
//! `tracing`: the binary writes them as text or JSON lines; a library user installs its own
//! subscriber. Warnings a flood could repeat (refused connections, failed `AUTH`s) are paced
//! by a tollgate bucket, ten at once and one a second, each saying how many it held back.
//!
//! # The rest
//!
//! Also `PING`, `ECHO`, `QUIT`, `HELLO` (RESP2 and RESP3: the replies of the other commands are
//! the same in both), `COMMAND`, `INFO` with the server's counters, and the few commands clients
//! send on connecting (`CLIENT …`, `SELECT 0`, `CONFIG GET`). Unknown commands and bad
//! arguments get errors that say what was wrong, and the connection goes on; a frame whose
//! lengths cannot be read, or a request over a limit, gets its error and then the connection
//! is closed, as Redis does (see [`resp`]). Silent connections are closed after the idle
//! timeout, so that they cannot hold every connection slot.

#![cfg_attr(docsrs, feature(doc_cfg))]
pub mod file;
pub mod resp;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tollgate::{Decision, KeyedLimiter, Outcome, Rate, TokenBucket, WhenFull};

use resp::{reply, Limits, Parsed, Parser};

/// How the server is bounded, what it serves, and who may use it.
#[derive(Clone, Debug)]
pub struct Config {
    /// Keys per undeclared quota's table.
    pub capacity: usize,
    /// Undeclared `(max_burst, count, period)` quotas held at once, each a table of
    /// `capacity` keys (0: only the declared quotas are served).
    pub max_quotas: usize,
    /// The longest fill time (`(max_burst + 1) × period / count`) an undeclared quota may
    /// have: its table is held at least this long after its last call.
    pub max_fill_time: Duration,
    /// The declared quotas: built at start, never dropped.
    pub quotas: Vec<Quota>,
    /// Who may connect: none, and anyone may; otherwise every connection authenticates.
    pub users: Vec<User>,
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
            max_fill_time: Duration::from_secs(3600),
            quotas: Vec::new(),
            users: Vec::new(),
            max_connections: 1024,
            limits: Limits::default(),
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// A declared quota: `max_burst:count:period[:capacity]` (`15:30:60`, `15:30:60:100000`), the
/// three numbers of `CL.THROTTLE` and the keys its table holds (default: the server's
/// [`Config::capacity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// `max_burst` (the burst is one more).
    pub max_burst: u64,
    /// Tokens per period.
    pub count: u64,
    /// The period, in seconds.
    pub period: u64,
    /// Keys its table holds.
    pub capacity: Option<usize>,
}

impl std::str::FromStr for Quota {
    type Err = String;

    fn from_str(s: &str) -> Result<Quota, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(format!("quota {s:?} is not max_burst:count:period[:capacity] (as `15:30:60`)"));
        }
        let int = |i: usize, name: &str| {
            strict_u64(parts[i].as_bytes())
                .ok_or_else(|| format!("quota {s:?}: {name} {:?} is not a non-negative integer", parts[i]))
        };
        let capacity = match parts.get(3) {
            None => None,
            Some(c) => Some(
                usize::try_from(int(3, "capacity")?)
                    .map_err(|_| format!("quota {s:?}: capacity {c:?} is too large"))?,
            ),
        };
        Ok(Quota {
            max_burst: int(0, "max_burst")?,
            count: int(1, "count")?,
            period: int(2, "period")?,
            capacity,
        })
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.max_burst, self.count, self.period)?;
        match self.capacity {
            Some(c) => write!(f, ":{c}"),
            None => Ok(()),
        }
    }
}

/// A user who may `AUTH`: `name:password` (the password is everything after the first colon).
/// `--requirepass` is the user `default`, as in Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// The name given to `AUTH name password`.
    pub name: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User").field("name", &self.name).field("password", &"***").finish()
    }
}

impl std::str::FromStr for User {
    type Err = String;

    fn from_str(s: &str) -> Result<User, String> {
        match s.split_once(':') {
            Some((name, password)) if !name.is_empty() && !password.is_empty() => {
                Ok(User { name: name.to_owned(), password: password.to_owned() })
            }
            _ => Err("a user is name:password, both non-empty".to_owned()),
        }
    }
}

/// Why a [`Config`] cannot be served.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A declared quota the server cannot hold.
    Quota {
        /// The quota, as declared.
        quota: Quota,
        /// Why.
        reason: String,
    },
    /// A quota declared twice.
    DuplicateQuota(Quota),
    /// A user named twice.
    DuplicateUser(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Quota { quota, reason } => write!(f, "quota {quota}: {reason}"),
            ConfigError::DuplicateQuota(q) => {
                write!(f, "quota {}:{}:{} is declared twice", q.max_burst, q.count, q.period)
            }
            ConfigError::DuplicateUser(name) => write!(f, "user {name:?} is given twice"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `bytes` as Redis reads an integer argument: decimal digits, no sign, no leading zero (but
/// `0` itself), within `u64`.
fn strict_u64(bytes: &[u8]) -> Option<u64> {
    match bytes {
        [] | [b'0', _, ..] => None,
        _ if !bytes.iter().all(u8::is_ascii_digit) => None,
        _ => std::str::from_utf8(bytes).ok()?.parse().ok(),
    }
}

/// `a == b` in a time that depends on their lengths only, not on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What one connection is: authenticated or not.
#[derive(Debug)]
struct Session {
    authenticated: bool,
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
    quotas_refused: AtomicU64,
    auth_failures: AtomicU64,
    noauth_refusals: AtomicU64,
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
    /// Declared: never dropped, not counted against `max_quotas`.
    pinned: bool,
    /// Milliseconds since the server started, at the last decision (written under the tables'
    /// read lock, read under their write lock: see [`Server::evict_idle`]).
    last_used_ms: AtomicU64,
    /// How long the table must go unused before dropping it loses nothing: its quota's time
    /// from empty to full, plus a margin for the two clocks (the table's TSC, the server's
    /// `Instant`) drifting apart.
    idle_ms: u64,
}

/// The server: its tables and counters. Serve it with [`Server::serve`]; replace its
/// configuration with [`Server::reload`]; stop it with [`Server::shutdown`].
#[derive(Debug)]
pub struct Server {
    /// The configuration in force: read by every command, replaced whole by a reload.
    config: ArcSwap<Config>,
    tables: RwLock<HashMap<QuotaKey, QuotaTable>>,
    /// Held while a table is built (see `add_table`) and while a reload rebuilds the declared
    /// quotas.
    building: Mutex<()>,
    counters: Counters,
    /// Bounded by the configuration the server started with (a reload does not change it).
    connections: Arc<Semaphore>,
    max_connections: usize,
    /// `true` once [`Server::shutdown`] is called: listeners stop accepting, and connections
    /// close once the requests they hold are answered.
    stopping: watch::Sender<bool>,
    /// Paces the warnings a flood could repeat (refused connections, failed AUTHs): a
    /// tollgate bucket of 10, refilled at one a second; what it refuses is counted in the next
    /// warning it lets through.
    log_gate: Option<tollgate::Limiter>,
    log_suppressed: AtomicU64,
    /// The decisions of undeclared tables since dropped, so that the `undeclared` series
    /// only grows: allowed, denied.
    retired: [AtomicU64; 2],
    started: Instant,
    /// More series for GET /metrics, written before each scrape ([`Server::add_report`]).
    reports: Reports,
}

/// Reports added by [`Server::add_report`].
#[derive(Default)]
struct Reports(Mutex<Vec<Box<dyn Fn() + Send + Sync>>>);

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len();
        write!(f, "Reports({n})")
    }
}

/// What a [`Server::reload`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Quotas declared now that were not: built (or an undeclared table of theirs kept and pinned).
    pub declared: Vec<Quota>,
    /// Quotas no longer declared: their tables kept, as undeclared ones (dropped once idle).
    pub undeclared: Vec<Quota>,
    /// The settings the reload could not change, which a restart applies.
    pub needs_restart: Vec<&'static str>,
}

/// After a command: go on, or close the connection once the replies are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// The seconds' histograms' buckets (`le`): 1 µs to 10 s, so that a fleet's latencies add up
/// across instances (a summary's quantiles do not).
const SECONDS_BUCKETS: [f64; 19] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 1.0, 10.0,
];

/// The recorder behind GET /metrics: every histogram whose name ends in `_seconds` (the Envoy
/// service's decisions, the Redis round trips) as a Prometheus histogram of
/// [`SECONDS_BUCKETS`].
fn prometheus_recorder() -> metrics_exporter_prometheus::PrometheusRecorder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &SECONDS_BUCKETS)
        .expect("the buckets are not empty")
        .build_recorder()
}

impl Server {
    /// A server with `config`, its declared quotas built (each writes every slot of its
    /// table: tens of milliseconds per million keys).
    pub fn new(config: Config) -> Result<Arc<Server>, ConfigError> {
        validate(&config)?;
        let max_connections = config.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let server = Server {
            connections: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            config: ArcSwap::from_pointee(Config { quotas: Vec::new(), ..config.clone() }),
            tables: RwLock::new(HashMap::new()),
            building: Mutex::new(()),
            counters: Counters::default(),
            stopping: watch::channel(false).0,
            // A constant quota, always valid: `ok()` only spares the server a panic path.
            log_gate: TokenBucket::new(Rate::per_second(1), 10).ok().map(tollgate::Limiter::new),
            log_suppressed: AtomicU64::new(0),
            retired: [AtomicU64::new(0), AtomicU64::new(0)],
            started: Instant::now(),
            reports: Reports::default(),
        };
        server.reload(config)?;
        Ok(Arc::new(server))
    }

    /// Replaces the configuration, keeping every table's state: quotas newly declared are
    /// built (or, where an undeclared table of theirs exists, it is kept and pinned), quotas
    /// no longer declared become undeclared (kept until they go idle, so that no decision is
    /// lost), and users, request limits, idle timeout and the bounds on undeclared quotas
    /// apply from the next command (limits and idle timeout from the next connection). The
    /// connection bound, and a declared quota's capacity once its table exists, change only
    /// at a restart ([`Reloaded::needs_restart`]). A configuration that cannot be served is
    /// refused whole, and the running one kept.
    pub fn reload(&self, config: Config) -> Result<Reloaded, ConfigError> {
        validate(&config)?;
        let mut report = Reloaded::default();
        if config.max_connections.clamp(1, Semaphore::MAX_PERMITS) != self.max_connections {
            report.needs_restart.push("max_connections");
        }
        let declared = |q: &Quota| (q.max_burst, q.count, q.period);
        // One rebuild at a time, and no undeclared table built meanwhile.
        let _building = self.building.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let missing: Vec<Quota> = {
            let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            config.quotas.iter().filter(|q| !tables.contains_key(&declared(q))).copied().collect()
        };
        // Built outside the tables' lock: decisions go on meanwhile.
        let mut built = Vec::with_capacity(missing.len());
        for quota in missing {
            let capacity = quota.capacity.unwrap_or(config.capacity);
            let table = self
                .build_table(declared(&quota), capacity, true)
                .map_err(|reason| ConfigError::Quota { quota, reason })?;
            built.push((declared(&quota), table));
        }
        let mut tables = self.tables.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, table) in tables.iter_mut() {
            let pin = config.quotas.iter().find(|q| declared(q) == *key);
            match (table.pinned, pin) {
                (false, Some(q)) => {
                    report.declared.push(*q);
                    if q.capacity.is_some_and(|c| c as u64 > table.limiter.capacity()) {
                        report.needs_restart.push("quota.capacity");
                    }
                }
                (true, None) => {
                    let (max_burst, count, period) = *key;
                    report.undeclared.push(Quota { max_burst, count, period, capacity: None });
                    // Counted as used now, so that it is held for a fill time from here.
                    table.last_used_ms.fetch_max(self.now_ms(), Relaxed);
                }
                _ => {}
            }
            table.pinned = pin.is_some();
        }
        for (key, table) in built {
            let quota = config.quotas.iter().find(|q| declared(q) == key).copied();
            report.declared.extend(quota);
            tables.insert(key, table);
        }
        self.config.store(Arc::new(config));
        Ok(report)
    }

    /// Stops the server: every listener stops accepting, and every connection closes once it
    /// has answered the requests it has received (a request still arriving is not waited
    /// for). [`Server::connections`] says how many are still open.
    pub fn shutdown(&self) {
        self.stopping.send_replace(true);
    }

    /// The connections open now.
    pub fn connections(&self) -> u64 {
        self.counters.connected.load(Relaxed)
    }

    /// Waits until no connection is open, or `timeout` has passed: whether none is.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.connections() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Whether a warning a flood could repeat may be written now, and how many were held
    /// back since the last one written.
    fn may_log(&self) -> Option<u64> {
        if self.log_gate.as_ref().map_or(true, |gate| gate.check().is_allowed()) {
            // Relaxed: a count for the log, ordered with nothing.
            Some(self.log_suppressed.swap(0, Relaxed))
        } else {
            self.log_suppressed.fetch_add(1, Relaxed);
            None
        }
    }

    /// Whether connections must authenticate.
    fn auth_required(&self) -> bool {
        !self.config.load().users.is_empty()
    }

    /// Accepts connections on `listener`, each on its own task, for as long as the task runs.
    /// A failed accept (a connection reset before it was accepted, or no file descriptor
    /// left) is counted and retried after a pause; it never stops the server.
    /// Returns once [`Server::shutdown`] is called.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut stopping = self.stopping.subscribe();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopping.wait_for(|&s| s) => return,
            };
            let mut stream = match accepted {
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
                if let Some(suppressed) = self.may_log() {
                    tracing::warn!(
                        max_connections = self.max_connections,
                        suppressed,
                        "connection refused: the server serves its most connections at once"
                    );
                }
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
        let (limits, idle_timeout) = {
            let config = self.config.load();
            (config.limits, config.idle_timeout)
        };
        let mut stopping = self.stopping.subscribe();
        let mut draining = false;
        let mut parser = Parser::new(limits);
        let mut session = Session { authenticated: !self.auth_required() };
        parser.set_authenticated(session.authenticated);
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        loop {
            // Every complete request in the buffer, replies batched (pipelining costs one write
            // per read), written out whenever they pass 64 KiB.
            let mut flow = Flow::Continue;
            while flow == Flow::Continue {
                match parser.next(&mut input) {
                    Parsed::Request(args) => {
                        flow = self.execute(&args, &mut out, &mut session);
                        parser.set_authenticated(session.authenticated);
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
            // On shutdown, every request the client sent before it is answered: what has
            // arrived is read without waiting for more, answered, and then the connection is
            // closed, between requests.
            if *stopping.borrow_and_update() {
                if draining {
                    return close(stream).await;
                }
                draining = true;
                loop {
                    match stream.try_read_buf(&mut input) {
                        Ok(0) => break,
                        Ok(_) if input.len() < limits.max_request_bytes.saturating_mul(4) => {}
                        Ok(_) => break,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            let read = async {
                let read = stream.read_buf(&mut input);
                match idle_timeout {
                    Some(idle) => tokio::time::timeout(idle, read).await.ok(),
                    None => Some(read.await),
                }
            };
            let n = tokio::select! {
                n = read => match n {
                    Some(n) => n?,
                    None => return close(stream).await, // idle: the slot goes to someone else
                },
                _ = stopping.changed() => continue, // answered above, then closed
            };
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// Runs one command, appending its reply.
    fn execute(&self, args: &[Vec<u8>], out: &mut BytesMut, session: &mut Session) -> Flow {
        bump(&self.counters.commands);
        let name = args[0].to_ascii_uppercase();
        let arity = |want: &str, ok: bool, out: &mut BytesMut| {
            if !ok {
                reply::error(out, &format!("ERR wrong number of arguments for '{want}' command"));
            }
            ok
        };
        if !session.authenticated && !matches!(name.as_slice(), b"AUTH" | b"HELLO" | b"QUIT") {
            bump(&self.counters.noauth_refusals);
            reply::error(out, "NOAUTH Authentication required.");
            return Flow::Continue;
        }
        match name.as_slice() {
            b"AUTH" => match args.len() {
                2 => self.auth(b"default", &args[1], out, session),
                3 => self.auth(&args[1], &args[2], out, session),
                _ => {
                    arity("auth", false, out);
                }
            },
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
            b"HELLO" => self.hello(args, out, session),
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

    /// `AUTH [user] password`: the user's password, compared in constant time.
    fn auth(&self, user: &[u8], password: &[u8], out: &mut BytesMut, session: &mut Session) {
        if !self.check_password(user, password, out) {
            return;
        }
        session.authenticated = true;
        reply::simple(out, "OK");
    }

    /// Whether `user` has `password`; if not, the error is written.
    fn check_password(&self, user: &[u8], password: &[u8], out: &mut BytesMut) -> bool {
        if !self.auth_required() {
            reply::error(
                out,
                "ERR AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            );
            return false;
        }
        // Every user's password is compared, so that the time taken does not say which names
        // exist.
        let mut ok = false;
        for u in &self.config.load().users {
            ok |= same_secret(u.name.as_bytes(), user) & same_secret(u.password.as_bytes(), password);
        }
        if !ok {
            bump(&self.counters.auth_failures);
            if let Some(suppressed) = self.may_log() {
                let user = String::from_utf8_lossy(&user[..user.len().min(64)]).into_owned();
                tracing::warn!(%user, suppressed, "AUTH refused: wrong user or password");
            }
            reply::error(out, "WRONGPASS invalid username-password pair or user is disabled.");
        }
        ok
    }

    /// `HELLO [protover [AUTH username password] [SETNAME name]]`.
    fn hello(&self, args: &[Vec<u8>], out: &mut BytesMut, session: &mut Session) {
        let version =
            match args.get(1).map(|v| std::str::from_utf8(v).ok().and_then(|v| v.parse::<u32>().ok())) {
                None => 2,
                Some(Some(v @ (2 | 3))) => v,
                Some(_) => {
                    reply::error(out, "NOPROTO unsupported protocol version");
                    return;
                }
            };
        let mut at = 2;
        let mut credentials = None;
        while at < args.len() {
            match args[at].to_ascii_uppercase().as_slice() {
                b"AUTH" if at + 2 < args.len() => {
                    credentials = Some((&args[at + 1], &args[at + 2]));
                    at += 3;
                }
                b"SETNAME" if at + 1 < args.len() => at += 2,
                _ => {
                    let shown = String::from_utf8_lossy(&args[at][..args[at].len().min(32)]).into_owned();
                    reply::error(out, &format!("ERR Syntax error in HELLO option '{shown}'"));
                    return;
                }
            }
        }
        match credentials {
            Some((user, password)) => {
                if !self.check_password(user, password, out) {
                    return;
                }
                session.authenticated = true;
            }
            None if !session.authenticated => {
                bump(&self.counters.noauth_refusals);
                reply::error(
                    out,
                    "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                     HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                     select the RESP protocol version at the same time",
                );
                return;
            }
            None => {}
        }
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
            strict_u64(a).ok_or_else(|| {
                let shown = String::from_utf8_lossy(&a[..a.len().min(32)]).into_owned();
                format!(
                    "ERR {name} must be a non-negative integer (decimal digits, no sign, no leading zero), got '{shown}'"
                )
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

    /// A table for `key` holding `capacity` keys (writes every slot: built outside the
    /// tables' lock).
    fn build_table(&self, key: QuotaKey, capacity: usize, pinned: bool) -> Result<QuotaTable, String> {
        let quota = quota_of(key)?;
        let limiter = KeyedLimiter::<Vec<u8>>::builder(quota)
            .capacity(capacity)
            .when_full(WhenFull::EvictFullest)
            .counters(true) // for GET /metrics: a load and store per decision
            .build()
            .map_err(|e| format!("cannot hold this quota: {e}"))?;
        let fill_ms = quota.fill_time().as_u64().div_ceil(1_000_000);
        let idle_ms = fill_ms.saturating_add(fill_ms / 100).saturating_add(10);
        Ok(QuotaTable { limiter, pinned, last_used_ms: AtomicU64::new(self.now_ms()), idle_ms })
    }

    /// Builds the table of an undeclared quota (on its first use). At `max_quotas`, a table
    /// unused for longer than its quota's fill time makes room: every key in it is full again,
    /// so dropping it changes no answer (a key a table does not hold is a full bucket).
    /// Otherwise the quota is refused. Declared tables are never dropped.
    fn add_table(&self, key: QuotaKey) -> Result<(), String> {
        let quota = quota_of(key).map_err(|e| format!("ERR {e}"))?;
        let (max_burst, count, period) = key;
        let shape = format!("(max_burst {max_burst}, count {count}, period {period})");
        let config = self.config.load_full();
        if config.max_quotas == 0 {
            bump(&self.counters.quotas_refused);
            return Err(format!(
                "ERR quota {shape} is not declared, and this server serves only its declared quotas (--quota)"
            ));
        }
        let fill = quota.fill_time().as_duration();
        if fill > config.max_fill_time {
            bump(&self.counters.quotas_refused);
            return Err(format!(
                "ERR quota {shape} fills in {} s, longer than the {} s allowed for a quota not declared \
                 (--max-fill-time); declare it (--quota {max_burst}:{count}:{period})",
                fill.as_secs_f64().ceil(),
                config.max_fill_time.as_secs()
            ));
        }
        // One table built at a time, so that the tables never hold more than `max_quotas + 1`
        // undeclared tables' memory, however many connections ask for new quotas at once.
        let _building = self.building.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        {
            let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if tables.contains_key(&key) {
                return Ok(()); // built by another connection meanwhile
            }
            // A hint: taken again under the write lock by `evict_idle`.
            if self.undeclared(&tables) >= config.max_quotas && self.idlest(&tables).is_none() {
                bump(&self.counters.quotas_refused);
                return Err(too_many_quotas(config.max_quotas));
            }
        }
        // Built outside the tables' lock (it writes every slot of the table): decisions on the
        // other quotas go on meanwhile.
        let table = self.build_table(key, config.capacity, false).map_err(|e| format!("ERR {e}"))?;
        let mut tables = self.tables.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tables.contains_key(&key) {
            return Ok(()); // built by another connection meanwhile
        }
        if self.undeclared(&tables) >= config.max_quotas && !self.evict_idle(&mut tables) {
            bump(&self.counters.quotas_refused);
            return Err(too_many_quotas(config.max_quotas));
        }
        tables.insert(key, table);
        Ok(())
    }

    /// The undeclared tables held.
    fn undeclared(&self, tables: &HashMap<QuotaKey, QuotaTable>) -> usize {
        tables.values().filter(|t| !t.pinned).count()
    }

    /// The undeclared table unused the longest, if it has gone unused for longer than its fill
    /// time.
    fn idlest(&self, tables: &HashMap<QuotaKey, QuotaTable>) -> Option<QuotaKey> {
        let now = self.now_ms();
        tables
            .iter()
            .filter(|(_, t)| !t.pinned)
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
        if let Some(c) = tables.remove(&k).and_then(|t| t.limiter.counters()) {
            // Relaxed: statistics.
            self.retired[0].fetch_add(c.allowed, Relaxed);
            self.retired[1].fetch_add(c.denied, Relaxed);
        }
        bump(&self.counters.quotas_evicted);
        true
    }

    /// Writes the server's counts to the current `metrics` recorder, as absolute values (see
    /// [`metrics_page`](Server::metrics_page) for the series). Each declared quota is a
    /// `quota` label (`15:30:60`); the undeclared ones, which clients choose, are one,
    /// `undeclared`, so that the label set stays bounded.
    pub fn report_metrics(&self) {
        use metrics::{counter, gauge};
        let c = &self.counters;
        let total = |name: &'static str, v: &AtomicU64| counter!(name).absolute(v.load(Relaxed));
        total("tollgate_server_connections_received_total", &c.connections_received);
        total("tollgate_server_connections_rejected_total", &c.rejected_connections);
        total("tollgate_server_accept_errors_total", &c.accept_errors);
        total("tollgate_server_commands_total", &c.commands);
        total("tollgate_server_throttle_calls_total", &c.throttle_calls);
        total("tollgate_server_throttle_limited_total", &c.throttle_limited);
        total("tollgate_server_protocol_errors_total", &c.protocol_errors);
        total("tollgate_server_unknown_commands_total", &c.unknown_commands);
        total("tollgate_server_auth_failures_total", &c.auth_failures);
        total("tollgate_server_noauth_refusals_total", &c.noauth_refusals);
        total("tollgate_server_quotas_evicted_total", &c.quotas_evicted);
        total("tollgate_server_quotas_refused_total", &c.quotas_refused);
        #[expect(clippy::cast_precision_loss, reason = "gauges are floats; these counts are far below 2^53")]
        {
            gauge!("tollgate_server_connections").set(c.connected.load(Relaxed) as f64);
            let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut undeclared = [self.retired[0].load(Relaxed), self.retired[1].load(Relaxed)];
            let (mut keys, mut capacity, mut declared) = ([0u64; 2], [0u64; 2], 0u64);
            for ((max_burst, count, period), t) in tables.iter() {
                let i = usize::from(!t.pinned);
                keys[i] += t.limiter.len();
                capacity[i] += t.limiter.capacity();
                let Some(s) = t.limiter.counters() else { continue };
                if t.pinned {
                    declared += 1;
                    let quota = format!("{max_burst}:{count}:{period}");
                    counter!("tollgate_server_decisions_total", "quota" => quota.clone(), "outcome" => "allowed")
                        .absolute(s.allowed);
                    counter!("tollgate_server_decisions_total", "quota" => quota, "outcome" => "denied")
                        .absolute(s.denied);
                } else {
                    undeclared[0] += s.allowed;
                    undeclared[1] += s.denied;
                }
            }
            counter!("tollgate_server_decisions_total", "quota" => "undeclared", "outcome" => "allowed")
                .absolute(undeclared[0]);
            counter!("tollgate_server_decisions_total", "quota" => "undeclared", "outcome" => "denied")
                .absolute(undeclared[1]);
            let held = u64::try_from(tables.len()).unwrap_or(u64::MAX);
            gauge!("tollgate_server_quotas", "kind" => "declared").set(declared as f64);
            gauge!("tollgate_server_quotas", "kind" => "undeclared")
                .set(held.saturating_sub(declared) as f64);
            for (i, kind) in ["declared", "undeclared"].into_iter().enumerate() {
                gauge!("tollgate_server_keys", "kind" => kind).set(keys[i] as f64);
                gauge!("tollgate_server_keys_capacity", "kind" => kind).set(capacity[i] as f64);
            }
        }
    }

    /// The server's counts in the Prometheus text format, through `recorder` (which the
    /// binary keeps for its `/metrics` page): connections, commands, `CL.THROTTLE` calls and
    /// refusals, protocol and authentication errors, quotas held, refused and evicted, keys
    /// and capacity, and decisions by quota and outcome (`tollgate_server_*`).
    pub fn metrics_page(&self, recorder: &metrics_exporter_prometheus::PrometheusRecorder) -> String {
        metrics::with_local_recorder(recorder, || {
            self.report_metrics();
            for report in self.reports.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
                report();
            }
        });
        recorder.handle().render()
    }

    /// Adds series to GET /metrics: `report` writes them to the `metrics` facade (as
    /// absolute values) before each scrape, e.g. Envoy's rate limit service's statistics.
    pub fn add_report(&self, report: impl Fn() + Send + Sync + 'static) {
        self.reports.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Box::new(report));
    }

    /// Serves `GET /metrics` (the [`metrics_page`](Server::metrics_page)) on `listener` until
    /// [`Server::shutdown`]; any other path is a 404. HTTP/1.1, on hyper.
    pub async fn serve_metrics(self: Arc<Self>, listener: TcpListener) {
        use http_body_util::Full;
        use hyper::{body::Incoming, Request, Response, StatusCode};
        let recorder = Arc::new(prometheus_recorder());
        let mut stopping = self.stopping.subscribe();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopping.wait_for(|&s| s) => return,
            };
            let Ok((stream, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let (server, recorder) = (Arc::clone(&self), Arc::clone(&recorder));
            let page = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = if req.uri().path() == "/metrics" {
                    Response::builder()
                        .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                        .body(Full::new(bytes::Bytes::from(server.metrics_page(&recorder))))
                } else {
                    Response::builder()
                        .status(StatusCode::NOT_FOUND)
                        .body(Full::new(bytes::Bytes::from_static(b"only /metrics\n")))
                };
                std::future::ready(response)
            });
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, page).await;
            });
        }
    }

    fn info(&self) -> String {
        let c = &self.counters;
        let config = self.config.load();
        let tables = self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let keys: u64 = tables.values().map(|t| t.limiter.len()).sum();
        let capacity: u64 = tables.values().map(|t| t.limiter.capacity()).sum();
        let bytes: usize = tables.values().map(|t| t.limiter.memory_bytes()).sum();
        format!(
            "# Server\r\nserver:tollgate\r\ntollgate_version:{}\r\nuptime_in_seconds:{}\r\n\
             \r\n# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\
             \r\n# Stats\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\naccept_errors:{}\r\n\
             total_commands_processed:{}\r\nthrottle_calls:{}\r\nthrottle_limited:{}\r\n\
             protocol_errors:{}\r\nunknown_commands:{}\r\nauth_failures:{}\r\nnoauth_refusals:{}\r\n\
             \r\n# Keyspace\r\nquotas:{}\r\nquotas_declared:{}\r\nmax_quotas:{}\r\nquotas_evicted:{}\r\nquotas_refused:{}\r\n\
             keys:{}\r\nkeys_capacity:{}\r\ntables_bytes:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            self.started.elapsed().as_secs(),
            c.connected.load(Relaxed),
            self.max_connections,
            c.connections_received.load(Relaxed),
            c.rejected_connections.load(Relaxed),
            c.accept_errors.load(Relaxed),
            c.commands.load(Relaxed),
            c.throttle_calls.load(Relaxed),
            c.throttle_limited.load(Relaxed),
            c.protocol_errors.load(Relaxed),
            c.unknown_commands.load(Relaxed),
            c.auth_failures.load(Relaxed),
            c.noauth_refusals.load(Relaxed),
            tables.len(),
            tables.values().filter(|t| t.pinned).count(),
            config.max_quotas,
            c.quotas_evicted.load(Relaxed),
            c.quotas_refused.load(Relaxed),
            keys,
            capacity,
            bytes,
        )
    }
}

/// The refusal of an undeclared quota at the limit of `max_quotas`.
fn too_many_quotas(max_quotas: usize) -> String {
    format!(
        "ERR this server holds {max_quotas} undeclared (max_burst, count, period) quotas, its limit (--max-quotas), \
         and each was used within its fill time; declare the quotas you rely on (--quota)"
    )
}

/// Whether a server could serve `config`, without building anything: users and quotas given
/// once each, every declared quota a bucket tollgate can keep, capacities above zero. (A
/// capacity beyond what the machine's memory holds is found only when the table is built.)
pub fn check(config: &Config) -> Result<(), ConfigError> {
    validate(config)?;
    for q in &config.quotas {
        if q.capacity.unwrap_or(config.capacity) == 0 {
            return Err(ConfigError::Quota { quota: *q, reason: "a capacity of 0 keys".into() });
        }
    }
    Ok(())
}

/// Refuses a configuration the server cannot serve (its declared quotas are checked as they
/// are built).
fn validate(config: &Config) -> Result<(), ConfigError> {
    let mut users: Vec<&str> = config.users.iter().map(|u| u.name.as_str()).collect();
    users.sort_unstable();
    if let Some(w) = users.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::DuplicateUser(w[0].to_owned()));
    }
    for (i, q) in config.quotas.iter().enumerate() {
        let key = (q.max_burst, q.count, q.period);
        if config.quotas[..i].iter().any(|p| (p.max_burst, p.count, p.period) == key) {
            return Err(ConfigError::DuplicateQuota(*q));
        }
        quota_of(key).map_err(|reason| ConfigError::Quota { quota: *q, reason })?;
    }
    Ok(())
}

/// The token bucket of `CL.THROTTLE`'s `(max_burst, count, period)`.
fn quota_of((max_burst, count, period): QuotaKey) -> Result<TokenBucket, String> {
    if count == 0 || period == 0 {
        return Err("Zero rates are not supported".into());
    }
    let burst = max_burst.checked_add(1).ok_or("max_burst is too large")?;
    TokenBucket::new(Rate::per(count, Duration::from_secs(period)), burst)
        .map_err(|e| format!("invalid quota: {e}"))
}

/// The commands this server knows (for `COMMAND COUNT`).
const COMMANDS: [&str; 11] =
    ["CL.THROTTLE", "AUTH", "PING", "ECHO", "QUIT", "HELLO", "COMMAND", "INFO", "SELECT", "CLIENT", "CONFIG"];

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
        run_in(server, cmd, &mut Session { authenticated: true })
    }

    fn run_in(server: &Server, cmd: &[&str], session: &mut Session) -> Vec<u8> {
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let mut out = BytesMut::new();
        server.execute(&args, &mut out, session);
        out.to_vec()
    }

    fn server(config: Config) -> Arc<Server> {
        Server::new(config).unwrap()
    }

    /// redis-cell's README: `CL.THROTTLE user123 15 30 60` on a fresh key gives 0, 16, 15, -1, 2.
    #[test]
    fn the_redis_cell_vector() {
        let server = server(Config { capacity: 1024, ..Config::default() });
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
        let server = server(Config { capacity: 1024, max_quotas: 2, ..Config::default() });
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
        assert!(cmd(&c).contains("2 undeclared"));
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
        let server = server(Config { capacity: 1024, max_quotas: 2, ..Config::default() });
        let err = |cmd: &[&str]| String::from_utf8(run(&server, cmd)).unwrap();
        assert!(err(&["CL.THROTTLE", "k", "15", "0", "60"]).starts_with("-ERR Zero rates"));
        assert!(err(&["CL.THROTTLE", "k", "15", "30", "0"]).starts_with("-ERR Zero rates"));
        assert!(
            err(&["CL.THROTTLE", "k", "-1", "30", "60"]).contains("max_burst must be a non-negative integer")
        );
        assert!(err(&["CL.THROTTLE", "k", "-1", "30", "60"]).contains("got '-1'"));
        // Redis's own integer arguments refuse a sign and leading zeros; so does this server.
        assert!(err(&["CL.THROTTLE", "k", "+5", "30", "60"]).contains("no sign, no leading zero), got '+5'"));
        assert!(err(&["CL.THROTTLE", "k", "05", "30", "60"]).contains("got '05'"));
        assert!(err(&["CL.THROTTLE", "k", "5", "30", "60", " 1"]).contains("quantity must be"));
        assert!(err(&["CL.THROTTLE", "k", "15", "30"]).contains("wrong number of arguments"));
        assert!(err(&["CL.THROTTLE", "k", "18446744073709551615", "30", "60"]).starts_with("-ERR"));
        assert!(err(&["NOPE", "a"]).starts_with("-ERR unknown command 'NOPE', with 1 arguments"));
        assert!(err(&["CL.THROTTLE", "k", "1", "30", "60"]).starts_with("*5"));
        assert!(err(&["CL.THROTTLE", "k", "2", "30", "60"]).starts_with("*5"));
        assert!(err(&["CL.THROTTLE", "k", "3", "30", "60"]).contains("2 undeclared"));
        // Both tables were just used, and their fill time is a minute: neither makes room.
        assert!(err(&["INFO"]).contains("quotas_evicted:0\r\n"));
        assert_eq!(err(&["PING"]), "+PONG\r\n");
        assert_eq!(err(&["HELLO", "4"]), "-NOPROTO unsupported protocol version\r\n");
        assert!(err(&["HELLO", "3"]).starts_with("%5\r\n"));
        assert!(err(&["INFO"]).contains("throttle_calls:"));
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        assert_eq!(strict_u64(b"0"), Some(0));
        assert_eq!(strict_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in
            [&b""[..], b"+5", b"05", b"00", b"-0", b" 5", b"5 ", b"18446744073709551616", b"1e3", b"\xff"]
        {
            assert_eq!(strict_u64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Issue 34: a stranger sending a few shapes with a fill time of a year
    /// (`CL.THROTTLE a 10 1 31536000`) took every table until a restart. Declared quotas are
    /// never displaced, a shape filling beyond `max_fill_time` is refused, and the undeclared
    /// tables are bounded in number.
    #[test]
    fn a_flood_of_shapes_cannot_lock_out_the_declared_quotas() {
        let declared: Quota = "15:30:60:64".parse().unwrap();
        let server = server(Config {
            capacity: 64,
            max_quotas: 2,
            quotas: vec![declared],
            max_fill_time: Duration::from_secs(3600),
            ..Config::default()
        });
        let cmd = |c: &[&str]| String::from_utf8(run(&server, c)).unwrap();
        // A year's fill: refused outright, naming the bound and the way to declare it.
        let year = cmd(&["CL.THROTTLE", "a", "10", "1", "31536000"]);
        assert!(
            year.contains("longer than the 3600 s allowed") && year.contains("--quota 10:1:31536000"),
            "{year}"
        );
        // Shapes within the bound take the two undeclared tables, then are refused.
        for i in 0..50 {
            let got = cmd(&["CL.THROTTLE", "a", &i.to_string(), "1", "60"]);
            assert_eq!(got.starts_with("*5"), i < 2, "{i}: {got}");
        }
        // The declared quota answers throughout, with its own state.
        for i in 0..16 {
            let got = cmd(&["CL.THROTTLE", "user123", "15", "30", "60"]);
            assert!(got.starts_with("*5\r\n:0\r\n:16\r\n"), "{i}: {got}");
        }
        assert!(cmd(&["CL.THROTTLE", "user123", "15", "30", "60"]).starts_with("*5\r\n:1\r\n"));
        let info = cmd(&["INFO"]);
        assert!(info.contains("quotas:3\r\nquotas_declared:1\r\n"), "{info}");
        assert!(info.contains("quotas_refused:49\r\n"), "{info}");
        // Only declared quotas, when asked.
        let strict = server_only_declared();
        let got = String::from_utf8(run(&strict, &["CL.THROTTLE", "a", "1", "1", "1"])).unwrap();
        assert!(got.contains("is not declared"), "{got}");
        assert!(String::from_utf8(run(&strict, &["CL.THROTTLE", "a", "1", "2", "3"]))
            .unwrap()
            .starts_with("*5"));
    }

    fn server_only_declared() -> Arc<Server> {
        server(Config {
            capacity: 16,
            max_quotas: 0,
            quotas: vec!["1:2:3".parse().unwrap()],
            ..Config::default()
        })
    }

    #[test]
    fn declared_quotas_and_users_are_checked() {
        let q = |s: &str| s.parse::<Quota>();
        assert_eq!(q("15:30:60"), Ok(Quota { max_burst: 15, count: 30, period: 60, capacity: None }));
        assert_eq!(q("15:30:60:100").unwrap().capacity, Some(100));
        assert!(q("15:30").unwrap_err().contains("max_burst:count:period"));
        assert!(q("15:+30:60").unwrap_err().contains("count \"+30\""));
        let bad = |config: Config| Server::new(config).unwrap_err().to_string();
        let twice = vec![q("1:2:3").unwrap(), q("1:2:3:10").unwrap()];
        assert_eq!(
            bad(Config { capacity: 8, quotas: twice, ..Config::default() }),
            "quota 1:2:3 is declared twice"
        );
        let zero = vec![q("1:0:3").unwrap()];
        assert!(bad(Config { capacity: 8, quotas: zero, ..Config::default() })
            .contains("quota 1:0:3: Zero rates"));
        let users = vec!["a:x".parse().unwrap(), "a:y".parse().unwrap()];
        assert_eq!(bad(Config { capacity: 8, users, ..Config::default() }), "user \"a\" is given twice");
        assert!("nopass".parse::<User>().is_err() && ":x".parse::<User>().is_err());
        assert_eq!("u:p:q".parse::<User>().unwrap().password, "p:q");
        assert!(!format!("{:?}", "u:secret".parse::<User>().unwrap()).contains("secret"));
    }

    #[test]
    fn a_connection_authenticates_before_anything_else() {
        let users = vec!["default:s3cret".parse().unwrap(), "ops:hunter2".parse().unwrap()];
        let server = server(Config { capacity: 16, users, ..Config::default() });
        let mut s = Session { authenticated: false };
        let mut cmd = |c: &[&str]| String::from_utf8(run_in(&server, c, &mut s)).unwrap();
        assert_eq!(cmd(&["PING"]), "-NOAUTH Authentication required.\r\n");
        assert_eq!(cmd(&["CL.THROTTLE", "k", "1", "1", "1"]), "-NOAUTH Authentication required.\r\n");
        assert!(cmd(&["HELLO", "3"]).starts_with("-NOAUTH HELLO must be called"));
        assert!(cmd(&["AUTH", "wrong"]).starts_with("-WRONGPASS"));
        assert!(cmd(&["AUTH", "ops", "s3cret"]).starts_with("-WRONGPASS"));
        assert!(cmd(&["AUTH"]).contains("wrong number of arguments for 'auth'"));
        assert_eq!(cmd(&["PING"]), "-NOAUTH Authentication required.\r\n");
        assert_eq!(cmd(&["AUTH", "s3cret"]), "+OK\r\n");
        assert_eq!(cmd(&["PING"]), "+PONG\r\n");
        let info = cmd(&["INFO"]);
        assert!(info.contains("auth_failures:2\r\nnoauth_refusals:4\r\n"), "{info}");
        // HELLO with AUTH authenticates a new connection in one step.
        let mut s = Session { authenticated: false };
        let mut cmd = |c: &[&str]| String::from_utf8(run_in(&server, c, &mut s)).unwrap();
        assert!(cmd(&["HELLO", "3", "AUTH", "ops", "nope"]).starts_with("-WRONGPASS"));
        assert!(cmd(&["HELLO", "3", "AUTH", "ops", "hunter2", "SETNAME", "x"]).starts_with("%5\r\n"));
        assert!(cmd(&["CL.THROTTLE", "k", "1", "1", "1"]).starts_with("*5"));
        assert!(cmd(&["HELLO", "3", "BOGUS"]).contains("Syntax error in HELLO option 'BOGUS'"));
        // Without users, AUTH says there is nothing to authenticate against.
        let open = server_only_declared();
        let got = String::from_utf8(run(&open, &["AUTH", "x"])).unwrap();
        assert!(got.contains("without any password configured"), "{got}");
    }
}
