//! The `http` benchmark: an axum hello-world on 127.0.0.1 driven by `wrk` (2 threads, 64
//! connections), with no limiter, with tollgate's layer and with tower-governor, on the same
//! per-IP quota, in one run: requests per second and latency p50 / p99.
//!
//! ```sh
//! cargo run --release -p tollgate-tower --features axum --example http_bench            # 10 s per cell
//! cargo run --release -p tollgate-tower --features axum --example http_bench -- --seconds 2 --rounds 1
//! cargo run --release -p tollgate-tower --features axum --example http_bench -- --cells 1,5  # some rows
//! ```
//!
//! `--cells` takes the rows to run by their index in the table (0, no limiter, always runs).
//!
//! Needs `wrk` on the PATH (Debian: `apt-get install wrk`). Every cell runs `--rounds` times
//! (default 2), the rounds interleaved and every other one in reverse order, so that the
//! machine's drift touches every subject alike;
//! the table gives the median of the rounds and their spread. Loads: `allow` (a quota never
//! reached: every request is served and charged) and `deny` (one per hour, spent: every request
//! is answered 429 by the limiter). The limiters write their rate-limit headers on every
//! response (tollgate's default IETF and `X-RateLimit-*`; tower-governor's `use_headers`), so
//! two floors run beside them: no limiter, and no limiter writing the same five headers as
//! constants (what the headers' bytes alone cost); and tollgate once without headers. Cells
//! 0-10 mount each layer with `Router::layer` (axum wraps the route's service and boxes it
//! again, for any layer); cells 11-17 mount the floors, tollgate and tower-governor around the
//! whole router (`Layer::layer`), where a layer costs only its own work. Cell 17 is
//! tower-governor without headers (its default), beside tollgate's `Headers::NONE` (cell 14).
//!
//! Beside the rate, each cell reports the server's CPU time per request (this process's user
//! and system time over the run, from `/proc/self/stat`, divided by the requests wrk counted;
//! wrk is another process): what the server spends on a request, which the rate shows only in
//! part when the server and wrk share the machine's cores, and which moves far less between
//! runs than the rate does.

#![allow(missing_docs)]

mod shared;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::{KeyedLimiter, Rate, TokenBucket};
use tollgate_tower::{Headers, Limit, PeerIp, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Subject {
    None,
    /// No limiter, but a tower layer that passes every response through unchanged: what
    /// mounting any layer on an axum router costs (`Router::layer` wraps the route's service
    /// and boxes it again), the floor of a layer that writes no headers.
    NonePassThrough,
    /// No limiter, but the same five headers tollgate writes, constant: the floor of any
    /// limiter that writes them (their bytes cost the server and the client).
    NoneWithHeaders,
    Tollgate,
    /// `X-RateLimit-*` only: about the header set tower-governor's `use_headers` writes.
    TollgateXOnly,
    TollgateNoHeaders,
    /// `Headers::NONE`, keyed by the connection (its peer port) instead of the peer IP: 64 keys
    /// instead of one, so that no two server threads decide on one bucket's cache line. Tells
    /// whether the one hot key of the other rows costs anything (measured: within the spread;
    /// BENCHMARKS.md, "HTTP").
    TollgatePerConn,
    TowerGovernor,
    /// tower-governor without `use_headers`: no headers on an admission (its default).
    TowerGovernorNoHeaders,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Load {
    Allow,
    Deny,
}

/// The allow-heavy quota's burst, tollgate's and tower-governor's (at a million a second): a
/// size real quotas have, so that the headers carry numbers of their usual length (the runs
/// up to 9cebdf0 used 2^32 − 1 at a billion a second).
const ALLOW_BURST: u64 = 1000;

/// Where a layer is mounted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mount {
    /// `Router::layer`: axum wraps the route's service and boxes it again.
    Route,
    /// `Layer::layer` around the whole router: the layer's service is the one `axum::serve`
    /// calls.
    Outer,
}

fn tollgate_layer(subject: Subject, load: Load) -> RateLimitLayer {
    let q = match load {
        // A million a second, five times the rate served here, refills 1,000 in a
        // millisecond: a decision whose clock read went stale longer than that (its
        // thread descheduled before its CAS) is the only refusal. A burst of 1,000
        // keeps the headers' numbers the size a real quota's are.
        Load::Allow => TokenBucket::new(Rate::per_second(1_000_000), ALLOW_BURST),
        Load::Deny => TokenBucket::per_hour(1),
    }
    .expect("a valid quota");
    if subject == Subject::TollgatePerConn {
        let per = Arc::new(KeyedLimiter::new(q, 100_000).expect("a valid table"));
        let key = |req: &http::request::Parts| -> Result<u64, tollgate_tower::KeyError> {
            let info = req.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>();
            info.map(|i| u64::from(i.0.port())).ok_or(tollgate_tower::KeyError::NoPeerAddress)
        };
        return RateLimitLayer::new([Limit::keyed("per-conn", per, key)]).headers(Headers::NONE);
    }
    let per_ip = Arc::new(KeyedLimiter::new(q, 100_000).expect("a valid table"));
    let layer = RateLimitLayer::new([Limit::keyed("per-ip", per_ip, PeerIp::<64>)]);
    let headers = match subject {
        Subject::Tollgate => Headers::default(),
        Subject::TollgateXOnly => Headers { x_ratelimit: true, ..Headers::NONE },
        _ => Headers::NONE,
    };
    layer.headers(headers)
}

/// Serves `subject` on a fresh runtime of 2 worker threads; returns its address and a handle
/// that stops it when dropped.
fn serve(subject: Subject, load: Load, mount: Mount) -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("a port");
    let addr = listener.local_addr().expect("an address");
    let router = Router::new().route("/", get(|| async { "hello" }));
    // Each subject's service has a type of its own: one expansion serves each.
    // A router is served through its own `into_make_service_with_connect_info`, as axum users
    // serve one; a layer around the router through `axum::ServiceExt`'s, the only way there.
    macro_rules! serve {
        ($service:expr) => {{
            let service = axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                SocketAddr,
            >($service);
            rt.spawn(async move { axum::serve(listener, service).await });
        }};
    }
    macro_rules! serve_router {
        ($router:expr) => {{
            let service = $router.into_make_service_with_connect_info::<SocketAddr>();
            rt.spawn(async move { axum::serve(listener, service).await });
        }};
    }
    macro_rules! mount {
        ($layer:expr) => {{
            let layer = $layer;
            match mount {
                Mount::Route => serve_router!(router.layer(layer)),
                Mount::Outer => serve!(tower::Layer::layer(&layer, router)),
            }
        }};
    }
    match subject {
        Subject::None => serve_router!(router),
        Subject::NoneWithHeaders => mount!(shared::constant_headers()),
        Subject::NonePassThrough => mount!(shared::pass_through()),
        Subject::Tollgate
        | Subject::TollgateXOnly
        | Subject::TollgateNoHeaders
        | Subject::TollgatePerConn => {
            mount!(tollgate_layer(subject, load))
        }
        Subject::TowerGovernor | Subject::TowerGovernorNoHeaders => {
            let mut b = GovernorConfigBuilder::default();
            match load {
                Load::Allow => b.period(Duration::from_micros(1)).burst_size(ALLOW_BURST as u32),
                Load::Deny => b.period(Duration::from_secs(3600)).burst_size(1),
            };
            if subject == Subject::TowerGovernor {
                let config = Arc::new(b.use_headers().finish().expect("a valid quota"));
                mount!(GovernorLayer { config })
            } else {
                let config = Arc::new(b.finish().expect("a valid quota"));
                mount!(GovernorLayer { config })
            }
        }
    }
    (addr, rt)
}

struct Run {
    rps: f64,
    /// The server's CPU time per request, µs.
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    non_2xx: u64,
}

fn micros(s: &str) -> Option<f64> {
    let (n, unit) = s.find(|c: char| c.is_ascii_alphabetic()).map(|i| s.split_at(i))?;
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        _ => return None,
    })
}

/// This process's CPU time so far (user + system, all threads), in µs: `/proc/self/stat`'s
/// `utime` and `stime`, in clock ticks of 10 ms (the kernel's `USER_HZ` on Linux).
fn cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) * 10_000.0
}

fn wrk(addr: SocketAddr, seconds: u64) -> Run {
    let cpu_before = cpu_us();
    let out = Command::new("wrk")
        .args(["-t2", "-c64", &format!("-d{seconds}s"), "--latency", &format!("http://{addr}/")])
        .output()
        .expect("wrk on the PATH (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    let cpu = cpu_us() - cpu_before;
    let mut run = Run { rps: 0.0, cpu_us: 0.0, p50_us: 0.0, p99_us: 0.0, non_2xx: 0 };
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [n, "requests", "in", ..] => run.cpu_us = cpu / n.parse::<f64>().unwrap_or(f64::INFINITY),
            ["Requests/sec:", n] => run.rps = n.parse().unwrap_or(0.0),
            ["50%", v] => run.p50_us = micros(v).unwrap_or(0.0),
            ["99%", v] => run.p99_us = micros(v).unwrap_or(0.0),
            ["Non-2xx", "or", "3xx", "responses:", n] => run.non_2xx = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    assert!(run.rps > 0.0, "wrk printed no rate:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    run
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (seconds, rounds) = (arg("--seconds", 10), arg("--rounds", 2).max(1));
    let cells = [
        (Subject::None, Load::Allow),
        (Subject::NonePassThrough, Load::Allow),
        (Subject::NoneWithHeaders, Load::Allow),
        (Subject::Tollgate, Load::Allow),
        (Subject::TollgateXOnly, Load::Allow),
        (Subject::TollgateNoHeaders, Load::Allow),
        (Subject::TollgatePerConn, Load::Allow),
        (Subject::TowerGovernor, Load::Allow),
        (Subject::Tollgate, Load::Deny),
        (Subject::TollgateXOnly, Load::Deny),
        (Subject::TowerGovernor, Load::Deny),
    ]
    .map(|(s, l)| (s, l, Mount::Route))
    .into_iter()
    .chain([
        (Subject::NonePassThrough, Load::Allow, Mount::Outer),
        (Subject::NoneWithHeaders, Load::Allow, Mount::Outer),
        (Subject::Tollgate, Load::Allow, Mount::Outer),
        (Subject::TollgateNoHeaders, Load::Allow, Mount::Outer),
        (Subject::TowerGovernor, Load::Allow, Mount::Outer),
        (Subject::TollgateXOnly, Load::Allow, Mount::Outer),
        (Subject::TowerGovernorNoHeaders, Load::Allow, Mount::Outer),
    ])
    .collect::<Vec<_>>();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let only: Option<Vec<usize>> = args
        .iter()
        .position(|a| a == "--cells")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|c| c.parse().ok()).collect());
    let cells: Vec<_> = match &only {
        Some(keep) => {
            cells.iter().enumerate().filter(|(i, _)| *i == 0 || keep.contains(i)).map(|(_, c)| *c).collect()
        }
        None => cells.clone(),
    };
    eprintln!("http: {} cells × {rounds} rounds × {seconds} s, wrk -t2 -c64, on {cpu}", cells.len());
    let mut runs: Vec<Vec<Run>> = cells.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        // Odd rounds run the cells in reverse: the host's drift over a round (a round of every
        // cell takes minutes) then touches each cell's median alike, where in one order the
        // last cells ran on a different machine than the first.
        let order: Vec<usize> =
            if round % 2 == 0 { (0..cells.len()).collect() } else { (0..cells.len()).rev().collect() };
        for i in order {
            let (subject, load, mount) = cells[i];
            let (addr, rt) = serve(subject, load, mount);
            let r = wrk(addr, seconds);
            eprintln!(
                "  round {round}: {subject:?} {load:?} {mount:?}: {:.0} req/s, {:.2} µs CPU/request",
                r.rps, r.cpu_us
            );
            drop(rt);
            runs[i].push(r);
        }
    }
    let base = median(runs[0].iter().map(|r| r.rps).collect());
    let base_cpu = median(runs[0].iter().map(|r| r.cpu_us).collect());
    println!("CPU: {cpu}; wrk -t2 -c64 -d{seconds}s, median of {rounds} interleaved rounds\n");
    println!(
        "| subject | load | requests/s (spread) | vs no limiter | server CPU µs/request (spread) | vs no limiter | p50 µs | p99 µs | non-2xx |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (i, &(subject, load, mount)) in cells.iter().enumerate() {
        let rps: Vec<f64> = runs[i].iter().map(|r| r.rps).collect();
        let cpu: Vec<f64> = runs[i].iter().map(|r| r.cpu_us).collect();
        let spread = |v: &[f64]| v.iter().fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let ((lo, hi), (clo, chi)) = (spread(&rps), spread(&cpu));
        let name = match subject {
            Subject::None => "no limiter",
            Subject::NoneWithHeaders => "no limiter, tollgate's headers as constants",
            Subject::NonePassThrough => "no limiter, a pass-through layer",
            Subject::Tollgate => "tollgate-tower",
            Subject::TollgateXOnly => "tollgate-tower, X-RateLimit-* only",
            Subject::TollgateNoHeaders => "tollgate-tower, Headers::NONE",
            Subject::TollgatePerConn => "tollgate-tower, Headers::NONE, per connection",
            Subject::TowerGovernor => "tower-governor 0.7",
            Subject::TowerGovernorNoHeaders => "tower-governor 0.7, no headers",
        };
        let outer = if mount == Mount::Outer { ", around the router" } else { "" };
        let name = format!("{name}{outer}");
        let load = match load {
            Load::Allow => "allow",
            Load::Deny => "deny",
        };
        println!(
            "| {name} | {load} | {:.0} ({lo:.0}–{hi:.0}) | {:+.1}% | {:.2} ({clo:.2}–{chi:.2}) | {:+.1}% | {:.0} | {:.0} | {} |",
            median(rps.clone()),
            (median(rps) / base - 1.0) * 100.0,
            median(cpu.clone()),
            (median(cpu) / base_cpu - 1.0) * 100.0,
            median(runs[i].iter().map(|r| r.p50_us).collect()),
            median(runs[i].iter().map(|r| r.p99_us).collect()),
            runs[i].iter().map(|r| r.non_2xx).sum::<u64>(),
        );
    }
}
