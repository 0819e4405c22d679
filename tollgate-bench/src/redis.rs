//! The `redis` workload: one limit shared through a local `redis-server`, started by the
//! benchmark on a free port of 127.0.0.1 (skipped, with a line saying so, when there is none).
//!
//! Compared in one run, on one server: tollgate's round trip (`EVALSHA` of its script, on the
//! server's `TIME`), tollgate's leased mode, and the classic Lua token bucket most users start
//! from, re-implemented from its usual description: `HMGET` of `tokens` and `last_refill`,
//! refill by `elapsed·rate` from a time the *client* passes in (float seconds), consume if
//! enough, `HMSET` both fields and `EXPIRE ceil(2·capacity/rate)` on every call, reply
//! `{allowed, floor(tokens), ceil(missing/rate)}`. Callers are tokio tasks sharing one
//! multiplexed connection per subject, so concurrent callers are pipelined by the client.
//!
//! Two kinds of rows: **throughput** (a quota no caller reaches, so every decision is an
//! admission and the cost is the round trip) and **exactness** (a quota every caller overruns,
//! 1,000/s with a burst of 20: what each admits against `burst + rate·t` on the server's clock).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tollgate::{Rate, TokenBucket};
use tollgate_redis::{LeasedLimiter, RedisLimiter};

/// One subject at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct RedisRow {
    pub subject: String,
    /// `throughput` or `exactness`.
    pub kind: String,
    pub callers: usize,
    pub seconds: f64,
    pub decisions: u64,
    pub per_sec: f64,
    pub admitted: u64,
    /// `burst + floor(rate·t)` over the run on the server's clock (exactness rows).
    pub bound: Option<u64>,
    /// Tokens leased but never spent (leased rows).
    pub stranded: Option<u64>,
    /// The server's time per script call (`INFO commandstats`, `EVALSHA`), µs.
    pub server_us_per_call: Option<f64>,
}

/// The classic script (see the module docs).
const CLASSIC: &str = include_str!("classic_bucket.lua");

pub(crate) struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    pub(crate) fn start() -> Result<Server, String> {
        let port =
            TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
        let dir = std::env::temp_dir().join(format!("tollgate-bench-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("no redis-server ({e}); install it (apt-get install redis-server) for this workload")
            })?;
        let server = Server { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not come up within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The subjects, as one async decision on key `k`.
#[derive(Clone)]
enum Subject {
    Classic { conn: redis::aio::ConnectionManager, script: Arc<redis::Script>, capacity: u64, rate: f64 },
    RoundTrip(RedisLimiter),
    Leased(Arc<LeasedLimiter>),
}

impl Subject {
    fn name(&self) -> &'static str {
        match self {
            Subject::Classic { .. } => "classic Lua (HMGET/HMSET/EXPIRE, client time)",
            Subject::RoundTrip(_) => "tollgate round trip (EVALSHA, server TIME)",
            Subject::Leased(_) => "tollgate leased",
        }
    }

    async fn check(&self, key: &str) -> bool {
        match self {
            Subject::Classic { conn, script, capacity, rate } => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                let mut conn = conn.clone();
                let reply: Vec<i64> = script
                    .key(key)
                    .arg(*capacity)
                    .arg(*rate)
                    .arg(now)
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .expect("the classic script");
                reply.first() == Some(&1)
            }
            Subject::RoundTrip(l) => l.check(key).await.expect("a round-trip decision").is_allowed(),
            Subject::Leased(l) => l.check(key).await.expect("a leased decision").is_allowed(),
        }
    }
}

async fn subject(kind: usize, url: &str, q: TokenBucket, prefix: &str) -> Subject {
    match kind {
        0 => {
            let client = redis::Client::open(url).expect("a URL");
            let conn = redis::aio::ConnectionManager::new(client).await.expect("a connection");
            let rate = q.rate().tokens() as f64 / q.rate().period().as_secs_f64();
            Subject::Classic {
                conn,
                script: Arc::new(redis::Script::new(CLASSIC)),
                capacity: q.burst(),
                rate,
            }
        }
        _ => {
            let l = RedisLimiter::builder(q)
                .url(url)
                .prefix(prefix)
                .timeout(Duration::from_secs(5))
                .connect()
                .await
                .expect("a limiter");
            if kind == 1 {
                Subject::RoundTrip(l)
            } else {
                Subject::Leased(Arc::new(LeasedLimiter::new(l)))
            }
        }
    }
}

/// `CONFIG RESETSTAT`, so that the next `evalsha_usec` counts one subject's calls.
async fn reset_stats(url: &str) {
    let client = redis::Client::open(url).expect("a URL");
    let mut c = client.get_multiplexed_async_connection().await.expect("a connection");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.expect("CONFIG RESETSTAT");
}

/// The server's µs per `EVALSHA` since the last reset.
async fn evalsha_usec(url: &str) -> Option<f64> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.ok()?;
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"))?;
    let field = line.split(',').find_map(|f| f.strip_prefix("usec_per_call="))?;
    field.trim().parse().ok()
}

async fn server_time(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("a URL");
    let mut c = client.get_multiplexed_async_connection().await.expect("a connection");
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
    s * 1_000_000 + us
}

/// `callers` tasks deciding on `key` for `seconds`.
async fn drive(s: &Subject, callers: usize, seconds: f64, key: &str) -> (u64, u64, f64) {
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (s, decisions, admitted, key) =
                (s.clone(), decisions.clone(), admitted.clone(), key.to_owned());
            tokio::spawn(async move {
                while Instant::now() < end {
                    let ok = s.check(&key).await;
                    decisions.fetch_add(1, Relaxed);
                    admitted.fetch_add(u64::from(ok), Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a caller");
    }
    (decisions.load(Relaxed), admitted.load(Relaxed), start.elapsed().as_secs_f64())
}

/// Runs the workload; `Err` says why it was skipped.
pub fn run(quick: bool) -> Result<Vec<RedisRow>, String> {
    let server = Server::start()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let seconds = if quick { 0.2 } else { 3.0 };
    let url = server.url();
    Ok(rt.block_on(async {
        let mut rows = Vec::new();
        // Throughput: a quota nobody reaches (10M/s, burst 1M): every decision admits. The
        // subjects take turns, several rounds each, so that a drift of the shared machine
        // touches all of them; each row is the median round.
        let wide = TokenBucket::new(Rate::per_second(10_000_000), 1_000_000).expect("a quota");
        let rounds = if quick { 1 } else { 5 };
        for callers in [1, 50] {
            let mut subjects = Vec::new();
            for kind in 0..3 {
                let prefix = format!("tp{kind}-{callers}:");
                subjects.push((subject(kind, &url, wide, &prefix).await, prefix, Vec::new()));
            }
            for _ in 0..rounds {
                for (s, prefix, runs) in &mut subjects {
                    reset_stats(&url).await;
                    let (decisions, admitted, secs) =
                        drive(s, callers, seconds / rounds as f64, &format!("{prefix}k")).await;
                    runs.push((decisions as f64 / secs, decisions, admitted, secs, evalsha_usec(&url).await));
                }
            }
            for (s, _, mut runs) in subjects {
                runs.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (per_sec, decisions, admitted, secs, usec) = runs[runs.len() / 2];
                let stranded = match &s {
                    Subject::Leased(l) => Some(l.stats().stranded_tokens + l.stats().outstanding_tokens),
                    _ => None,
                };
                rows.push(RedisRow {
                    subject: s.name().into(),
                    kind: "throughput".into(),
                    callers,
                    seconds: secs,
                    decisions,
                    per_sec,
                    admitted,
                    bound: None,
                    stranded,
                    server_us_per_call: usec,
                });
            }
        }
        // Exactness: 1,000/s with a burst of 20, overrun by 50 callers.
        let tight = TokenBucket::new(Rate::per_second(1000), 20).expect("a quota");
        for kind in 0..3 {
            let prefix = format!("ex{kind}:");
            let s = subject(kind, &url, tight, &prefix).await;
            reset_stats(&url).await;
            let t0 = server_time(&url).await;
            let (decisions, admitted, secs) = drive(&s, 50, seconds, &format!("{prefix}k")).await;
            let t1 = server_time(&url).await;
            let stranded = match &s {
                Subject::Leased(l) => Some(l.stats().stranded_tokens + l.stats().outstanding_tokens),
                _ => None,
            };
            rows.push(RedisRow {
                subject: s.name().into(),
                kind: "exactness".into(),
                callers: 50,
                seconds: secs,
                decisions,
                per_sec: decisions as f64 / secs,
                admitted,
                bound: Some(20 + (t1 - t0) * 1000 / 1_000_000),
                stranded,
                server_us_per_call: evalsha_usec(&url).await,
            });
        }
        rows
    }))
}
