//! Redis gone, slow or back: the failure policy answers while it is down, the timeout and the
//! breaker bound every call, and decisions return to Redis soon after it does. Real servers,
//! killed with SIGKILL and restarted on the same port.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::Server;
use tollgate::{Outcome, Rate, TokenBucket};
use tollgate_redis::{share, Error, OnFailure, RedisLimiter};

fn quota() -> TokenBucket {
    TokenBucket::new(Rate::per_second(100), 10).unwrap()
}

async fn limiter(server: &Server, policy: OnFailure) -> RedisLimiter {
    RedisLimiter::builder(quota())
        .url(server.url())
        .timeout(Duration::from_millis(100))
        .breaker(3, Duration::from_millis(250))
        .on_failure(policy)
        .connect()
        .await
        .unwrap()
}

/// The log lines of this test binary, captured by a subscriber installed on first use.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn get() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let writer = logs.clone();
            tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).init();
            logs
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Runs `f` on a multi-threaded runtime, failing (not hanging) after 60 s.
fn run<F: std::future::Future<Output = ()>>(f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), f).await.expect("a call hung") });
}

/// After `server` is back: how long until a decision is Redis's again.
async fn back_to_redis(l: &RedisLimiter) -> Duration {
    let start = Instant::now();
    let before = l.stats().redis;
    while l.stats().redis == before {
        let _ = l.check("probe").await;
        assert!(start.elapsed() < Duration::from_secs(10), "never went back to Redis: {:?}", l.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// Each policy while the server is dead, and the way back.
#[test]
fn every_policy_is_honoured_while_redis_is_down_and_decisions_return_within_a_second() {
    let mut server = Server::start(&[]);
    // The local share: burst 5, and a rate slow enough that no token comes back during the test.
    let local = share(&TokenBucket::new(Rate::per_minute(2), 10).unwrap(), 2).unwrap();
    assert_eq!((local.burst(), local.rate().period()), (5, Duration::from_secs(120)));
    run(async {
        let error = limiter(&server, OnFailure::Error).await;
        let deny = limiter(&server, OnFailure::Deny).await;
        let allow = limiter(&server, OnFailure::Allow).await;
        let fallback = limiter(&server, OnFailure::Local(local)).await;
        let all = [&error, &deny, &allow, &fallback];
        for l in all {
            assert!(l.check("k").await.unwrap().is_allowed_now());
        }
        server.kill();
        for round in 0..8 {
            match error.check("k").await {
                Err(e) => assert!(e.is_transient(), "round {round}: {e}"),
                Ok(d) => panic!("round {round}: {d:?}"),
            }
            let d = deny.check("k").await.unwrap();
            assert_eq!(d.outcome(), Outcome::Denied, "fail closed");
            assert!(d.retry_after().unwrap() > Duration::ZERO);
            assert_eq!(allow.check("k").await.unwrap().outcome(), Outcome::Untracked, "fail open");
            // The local share: the first five pass, the rest wait.
            let d = fallback.check("k").await.unwrap();
            assert_eq!(d.is_allowed_now(), round < 5, "round {round}: {d:?}");
        }
        for l in all {
            let s = l.stats();
            assert!(s.breaker_trips == 1 && s.short_circuited >= 5, "{s:?}");
            assert_eq!(s.timeouts + s.errors + s.short_circuited, 8, "each failed call counted once: {s:?}");
        }
        let s = (error.stats(), deny.stats(), allow.stats(), fallback.stats());
        assert_eq!((s.0.failed_error, s.1.failed_deny, s.2.failed_allow, s.3.local), (8, 8, 8, 8));

        server.restart();
        for l in all {
            let took = back_to_redis(l).await;
            eprintln!("back to Redis {took:?} after its restart");
            assert!(took < Duration::from_secs(1), "{took:?} to go back to Redis");
        }
        // The restarted server lost its keys and scripts (no persistence): a fresh bucket.
        let d = deny.check("k").await.unwrap();
        assert!(d.is_allowed_now() && d.remaining() == 9, "{d:?}");
    });
}

/// A server stuck in a slow command (`DEBUG SLEEP`): calls time out at the limiter's timeout,
/// the breaker opens after three and stops sending, and the first probe after the server
/// recovers closes it.
#[test]
fn a_slow_server_trips_the_timeout_and_the_breaker() {
    let logs = Logs::get();
    let server = Server::start(&[]);
    run(async {
        let l = limiter(&server, OnFailure::Deny).await;
        assert!(l.check("k").await.unwrap().is_allowed_now());
        let port = server.port;
        let sleeper = std::thread::spawn(move || {
            std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "1"])
                .output()
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // the sleep has begun
        for _ in 0..10 {
            let d = l.check("k").await.unwrap();
            assert_eq!(d.outcome(), Outcome::Denied);
        }
        let s = l.stats();
        assert!(s.timeouts >= 3 && s.breaker_trips == 1 && s.short_circuited >= 1, "{s:?}");
        sleeper.join().unwrap();
        let took = back_to_redis(&l).await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(l.check("k").await.unwrap().is_allowed_now());
    });
    // The breaker's transitions, logged for the operator: opened (warn, with the policy and
    // the error), then closed (info). (The other tests' limiters log here too: the lines of a
    // `Deny` limiter are this test's or, alike, the policy test's.)
    let text = logs.text();
    let line = |what: &str| {
        text.lines()
            .find(|l| l.contains(what) && l.contains("policy=Deny"))
            .unwrap_or_else(|| panic!("{what}: {text}"))
            .to_owned()
    };
    let (opened, closed) = (line("Redis breaker opened"), line("Redis breaker closed"));
    assert!(
        opened.contains("WARN") && opened.contains("policy=Deny") && opened.contains("cooldown_ms=250"),
        "{opened}"
    );
    assert!(closed.contains("INFO"), "{closed}");
    assert!(text.find(&opened) < text.find(&closed), "opened, then closed: {text}");
}

/// No server at all at startup: `connect` fails, typed, within its timeout.
#[test]
fn no_server_at_connect_is_a_typed_error() {
    let port = common::free_port();
    run(async {
        let r = RedisLimiter::builder(quota())
            .url(format!("redis://127.0.0.1:{port}"))
            .timeout(Duration::from_millis(200))
            .connect()
            .await;
        match r {
            Err(e @ (Error::Redis(_) | Error::Timeout { .. })) => assert!(e.is_transient(), "{e}"),
            other => panic!("{other:?}"),
        }
    });
}

/// The `metrics` feature: a report while Redis is down says who decided and why, and that the
/// breaker is open.
#[cfg(feature = "metrics")]
#[test]
fn a_metrics_report_says_who_decided_and_the_breaker_state() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let mut server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let l = rt.block_on(limiter(&server, OnFailure::Deny));
    assert!(rt.block_on(l.check("k")).unwrap().is_allowed_now());
    server.kill();
    for _ in 0..5 {
        assert_eq!(rt.block_on(l.check("k")).unwrap().outcome(), Outcome::Denied);
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || l.report_metrics("api"));
    let values: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let k = key.key();
            let mut labels: Vec<String> = k.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            labels.sort();
            let v = match value {
                DebugValue::Counter(c) => c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(_) => f64::NAN,
            };
            (format!("{}{{{}}}", k.name(), labels.join(",")), v)
        })
        .collect();
    let at = |name: &str| values.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    assert_eq!(at("tollgate_redis_decisions_total{limiter=api,path=redis}"), Some(1.0), "{values:?}");
    assert_eq!(at("tollgate_redis_decisions_total{limiter=api,path=deny}"), Some(5.0), "{values:?}");
    assert_eq!(at("tollgate_redis_breaker_trips_total{limiter=api}"), Some(1.0), "{values:?}");
    assert_eq!(at("tollgate_redis_breaker_open{limiter=api}"), Some(1.0), "{values:?}");
    assert!(
        at("tollgate_redis_failures_total{cause=short_circuited,limiter=api}").unwrap() >= 2.0,
        "{values:?}"
    );
}

/// `round_trip_histogram`: one latency sample per round trip, under the limiter's name, in
/// seconds.
#[cfg(feature = "metrics")]
#[test]
fn round_trips_are_timed_into_a_histogram() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let server = Server::start(&[]);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let l = rt
        .block_on(RedisLimiter::builder(quota()).url(server.url()).round_trip_histogram("api").connect())
        .unwrap();
    for _ in 0..3 {
        assert!(rt.block_on(l.check("k")).unwrap().is_allowed_now());
    }
    let samples: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == "tollgate_redis_round_trip_seconds"
                && key.key().labels().any(|l| l.key() == "limiter" && l.value() == "api")
        })
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(h) => h.into_iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(samples.len(), 3, "{samples:?}");
    assert!(samples.iter().all(|&s| s > 0.0 && s < 0.1), "seconds within the timeout: {samples:?}");
}
