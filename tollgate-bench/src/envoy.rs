//! The `envoy` workload: Envoy's rate limit service over real gRPC on 127.0.0.1, driven by a
//! tonic client with many requests in flight, in one process and one run with its floor and
//! upstream's Redis pattern.
//!
//! Subjects, each a gRPC server on its own port answering `ShouldRateLimit`:
//! - `floor`: answers every descriptor OK, with a limit, without deciding: the gRPC stack's
//!   cost, which no service can go below;
//! - `tollgate embedded`: tollgate-envoy's service, windows in the process;
//! - `tollgate on Redis`: the same, its windows on a local redis-server (one script call per
//!   request);
//! - `tollgate on Redis, leased rules`: the same rules with `lease: true`, each instance taking
//!   a hot value's hits in batches (`tollgate_redis::LeasedWindows`);
//! - `upstream's pattern`: what envoyproxy/ratelimit sends per request, reproduced on the same
//!   redis-server: a pipeline of `INCRBY key hits` and `EXPIRE key unit` per descriptor, the
//!   decision made from the counts as upstream makes it.
//!
//! Requests carry 1 or 3 descriptors (`k1`, `k2`, `k3`, each a rule of 1,000,000 a second:
//! nothing is refused), their values drawn uniformly from 10 (hot: thousands of requests a
//! second each), 1,000 or 2^20 distinct ones. On Redis,
//! `INFO commandstats` and `INFO cpu` before and after give the commands and the server's CPU
//! per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::redis::Server as RedisServer;

/// One subject, one shape of request.
#[derive(Debug, Clone, Serialize)]
pub struct EnvoyRow {
    pub subject: String,
    pub descriptors: usize,
    pub values: u64,
    pub requests: u64,
    pub per_sec: f64,
    /// Requests per second over the floor's: the median of the rounds' ratios, each round's
    /// subject against the floor's round just before it (a drift of the shared machine
    /// between rounds lands on both sides of each ratio).
    pub vs_floor: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Commands the client sent to Redis per request (`EVALSHA`, `EVAL`, `INCRBY`, `EXPIRE`
    /// in `INFO commandstats`); every request is one round trip (a script call, or a pipeline).
    pub redis_sent: Option<f64>,
    /// Commands Redis executed per request, those of scripts (`TIME`, `GET`, `SET`) included.
    pub redis_commands: Option<f64>,
    /// Redis's CPU per request, µs (`INFO cpu`, user + system).
    pub redis_cpu_us: Option<f64>,
}

/// Rounds in which the subjects take turns (each a ninth of a cell's time: nine ratios make a
/// steadier median on a shared host than five did).
const ROUNDS: usize = 9;

/// One subject's rounds in one cell.
struct Run {
    rates: Vec<f64>,
    requests: u64,
    all: u64,
    hist: Histogram<u64>,
    sent: u64,
    executed: u64,
    cpu: f64,
}

impl Default for Run {
    fn default() -> Run {
        Run {
            rates: Vec::new(),
            requests: 0,
            all: 0,
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds"),
            sent: 0,
            executed: 0,
            cpu: 0.0,
        }
    }
}

/// Requests in flight at once.
const IN_FLIGHT: usize = 64;
/// Each rule's limit: far above what any value gets.
const LIMIT: u32 = 1_000_000;

const RULES: &str = "domain: bench
descriptors:
  - key: k1
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k2
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k3
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

/// The same rules, leased on Redis (`lease: true`: hot values' hits taken in batches).
const LEASED_RULES: &str = "domain: bench
descriptors:
  - key: k1
    rate_limit: {unit: second, requests_per_unit: 1000000, lease: true}
  - key: k2
    rate_limit: {unit: second, requests_per_unit: 1000000, lease: true}
  - key: k3
    rate_limit: {unit: second, requests_per_unit: 1000000, lease: true}
";

/// The subjects' names, as the report finds them.
pub const FLOOR: &str = "floor (gRPC, no decision)";
pub const EMBEDDED: &str = "tollgate embedded";
pub const ON_REDIS: &str = "tollgate on Redis (one script call)";
pub const LEASED: &str = "tollgate on Redis, leased rules";
pub const UPSTREAM: &str = "upstream's pattern (INCRBY + EXPIRE each)";

/// Distinct values of the hot cells: each gets thousands of requests a second.
pub const HOT_VALUES: u64 = 10;

fn status() -> DescriptorStatus {
    DescriptorStatus {
        code: PbCode::Ok as i32,
        current_limit: Some(PbRateLimit {
            requests_per_unit: LIMIT,
            unit: PbUnit::Second as i32,
            ..PbRateLimit::default()
        }),
        limit_remaining: LIMIT - 1,
        duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration { seconds: 1, nanos: 0 }),
        quota: None,
    }
}

/// The floor: OK for every descriptor, nothing decided.
#[derive(Clone, Copy)]
struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = request.into_inner().descriptors.len();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: PbCode::Ok as i32,
            statuses: (0..n).map(|_| status()).collect(),
            ..RateLimitResponse::default()
        }))
    }
}

/// Upstream's Redis pattern: per descriptor, `INCRBY` of the window's key and `EXPIRE` of it
/// for the unit, all of a request's in one pipeline; over the limit when the count passes it.
#[derive(Clone)]
struct Upstream {
    conn: redis::aio::ConnectionManager,
}

#[tonic::async_trait]
impl RateLimitService for Upstream {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let r = request.into_inner();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let hits = u64::from(r.hits_addend.max(1));
        let mut pipe = redis::pipe();
        for d in &r.descriptors {
            // Upstream's cache key: domain_key_value_ and the window's start.
            let mut key = format!("{}_", r.domain);
            for e in &d.entries {
                key.push_str(&e.key);
                key.push('_');
                key.push_str(&e.value);
                key.push('_');
            }
            key.push_str(&now.to_string());
            pipe.cmd("INCRBY").arg(&key).arg(hits).cmd("EXPIRE").arg(&key).arg(1).ignore();
        }
        let mut conn = self.conn.clone();
        let counts: Vec<u64> =
            pipe.query_async(&mut conn).await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let statuses: Vec<DescriptorStatus> = counts
            .iter()
            .map(|&after| {
                let mut s = status();
                if after > u64::from(LIMIT) {
                    s.code = PbCode::OverLimit as i32;
                    s.limit_remaining = 0;
                } else {
                    s.limit_remaining = LIMIT - u32::try_from(after).unwrap_or(LIMIT);
                }
                s
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == PbCode::OverLimit as i32);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { PbCode::OverLimit } else { PbCode::Ok } as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves `service` on a free port; its URL.
async fn serve<S: RateLimitService>(service: S) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await;
    });
    url
}

async fn serve_tollgate(limits: tollgate_envoy::Limits) -> String {
    let service = tollgate_envoy::Service::new(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move {
        let _ = service.serve(listener, std::future::pending()).await;
    });
    url
}

fn request(descriptors: usize, values: u64, x: &mut u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (1..=descriptors)
            .map(|k| {
                // xorshift64*: a value per descriptor, uniform over `values`.
                *x ^= *x >> 12;
                *x ^= *x << 25;
                *x ^= *x >> 27;
                let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D) % values;
                RateLimitDescriptor {
                    entries: vec![Entry { key: format!("k{k}"), value: format!("v{v}") }],
                    ..RateLimitDescriptor::default()
                }
            })
            .collect(),
        hits_addend: 1,
    }
}

/// Drives `url` with `IN_FLIGHT` requests at once for `seconds` (after a quarter as much
/// warm-up): the requests timed, the seconds, the latency histogram (ns), and every request
/// answered (warm-up and drain included).
async fn drive(url: &str, descriptors: usize, values: u64, seconds: f64) -> (u64, f64, Histogram<u64>, u64) {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("the subject's server");
    let timing = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let all = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let (timing, stop, done, all) =
                (Arc::clone(&timing), Arc::clone(&stop), Arc::clone(&done), Arc::clone(&all));
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
                let mut x = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
                while !stop.load(Relaxed) {
                    let r = request(descriptors, values, &mut x);
                    let started = Instant::now();
                    let ok = client.should_rate_limit(r).await.is_ok();
                    all.fetch_add(u64::from(ok), Relaxed);
                    if ok && timing.load(Relaxed) {
                        hist.saturating_record(
                            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
                        );
                        done.fetch_add(1, Relaxed);
                    }
                }
                hist
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds / 4.0)).await;
    timing.store(true, Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    timing.store(false, Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let requests = done.load(Relaxed);
    stop.store(true, Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    for t in tasks {
        if let Ok(h) = t.await {
            hist.add(&h).expect("same bounds");
        }
    }
    (requests, elapsed, hist, all.load(Relaxed))
}

/// The commands clients sent (those the subjects send), every command executed, and the
/// server's CPU seconds (user + system). A call answered NOSCRIPT (failed) is not counted.
async fn redis_counts(conn: &mut redis::aio::ConnectionManager) -> (u64, u64, f64) {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap_or_default();
    let field = |line: &str, name: &str| -> u64 {
        line.split([':', ',']).find_map(|f| f.strip_prefix(name)?.parse().ok()).unwrap_or(0)
    };
    let ran = |l: &str| field(l, "calls=").saturating_sub(field(l, "failed_calls="));
    let lines: Vec<&str> =
        stats.lines().filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:")).collect();
    let sent = lines
        .iter()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_incrby:", "cmdstat_expire:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| ran(l))
        .sum();
    let calls = lines.iter().map(|l| ran(l)).sum();
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.unwrap_or_default();
    let seconds = cpu
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    (sent, calls, seconds)
}

/// The workload; `Err` says why it could not run (no redis-server).
pub fn run(quick: bool) -> Result<Vec<EnvoyRow>, String> {
    let server = RedisServer::start()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let seconds = if quick { 0.2 } else { 2.5 };
    let big: u64 = if quick { 1 << 14 } else { 1 << 20 };
    rt.block_on(async {
        let config = || tollgate_envoy::Config::from_files([("bench.yaml", RULES)], Default::default());
        let config_error = |e: tollgate_envoy::ConfigError| e.to_string();
        // Room for every value at once, at the table's load.
        let keys = usize::try_from(2 * big).unwrap_or(usize::MAX);
        let embedded =
            tollgate_envoy::Limits::new(config().map_err(config_error)?, keys).map_err(config_error)?;
        let windows = tollgate_redis::RedisWindows::builder()
            .url(server.url())
            .prefix("tg:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let on_redis = tollgate_envoy::Limits::new(config().map_err(config_error)?, 16)
            .map_err(config_error)?
            .with_redis(tollgate_envoy::RedisBackend::new(windows, tollgate_envoy::OnRedisFailure::Error));
        let leased_windows = tollgate_redis::RedisWindows::builder()
            .url(server.url())
            .prefix("tgl:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let leased_config =
            tollgate_envoy::Config::from_files([("bench.yaml", LEASED_RULES)], Default::default());
        let leased = tollgate_envoy::Limits::new(leased_config.map_err(config_error)?, 16)
            .map_err(config_error)?
            .with_redis(tollgate_envoy::RedisBackend::new(
                leased_windows,
                tollgate_envoy::OnRedisFailure::Error,
            ));
        let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
        let conn = redis::aio::ConnectionManager::new(client).await.map_err(|e| e.to_string())?;
        let subjects: Vec<(&str, String, bool)> = vec![
            (FLOOR, serve(Floor).await, false),
            (EMBEDDED, serve_tollgate(embedded).await, false),
            (ON_REDIS, serve_tollgate(on_redis).await, true),
            (LEASED, serve_tollgate(leased).await, true),
            (UPSTREAM, serve(Upstream { conn: conn.clone() }).await, true),
        ];
        let mut stats = conn;
        let mut rows = Vec::new();
        // The subjects take turns, round after round, so that a drift of the shared machine
        // touches all of them; requests per second is the median round's.
        let rounds = if quick { 1 } else { ROUNDS };
        for descriptors in [1, 3] {
            for values in [HOT_VALUES, 1000, big] {
                eprintln!("envoy: {descriptors} descriptor(s), {values} values, {rounds} rounds");
                let mut runs: Vec<Run> = subjects.iter().map(|_| Run::default()).collect();
                for _ in 0..rounds {
                    for ((_, url, _), run) in subjects.iter().zip(&mut runs) {
                        let before = redis_counts(&mut stats).await;
                        let (requests, secs, hist, all) =
                            drive(url, descriptors, values, seconds / rounds as f64).await;
                        let after = redis_counts(&mut stats).await;
                        run.rates.push(requests as f64 / secs);
                        run.requests += requests;
                        run.all += all;
                        run.hist.add(&hist).expect("same bounds");
                        run.sent += after.0.saturating_sub(before.0);
                        run.executed += after.1.saturating_sub(before.1);
                        run.cpu += after.2 - before.2;
                    }
                }
                // The floor is the first subject of every round.
                let floor_rates = runs[0].rates.clone();
                for ((name, _, redis), mut run) in subjects.iter().zip(runs) {
                    let mut ratios: Vec<f64> =
                        run.rates.iter().zip(&floor_rates).map(|(r, f)| r / f).collect();
                    ratios.sort_by(f64::total_cmp);
                    run.rates.sort_by(f64::total_cmp);
                    // Per request answered, warm-up and drain included: Redis saw them all.
                    let per = |d: f64| if *redis && run.all > 0 { Some(d / run.all as f64) } else { None };
                    rows.push(EnvoyRow {
                        subject: (*name).to_owned(),
                        descriptors,
                        values,
                        requests: run.requests,
                        per_sec: run.rates[run.rates.len() / 2],
                        vs_floor: ratios[ratios.len() / 2],
                        p50_us: run.hist.value_at_quantile(0.5) as f64 / 1e3,
                        p99_us: run.hist.value_at_quantile(0.99) as f64 / 1e3,
                        redis_sent: per(run.sent as f64),
                        redis_commands: per(run.executed as f64),
                        redis_cpu_us: per(run.cpu * 1e6),
                    });
                }
            }
        }
        Ok(rows)
    })
}
