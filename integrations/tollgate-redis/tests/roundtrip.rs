//! Round-trip mode against a real `redis-server`: the engine's vectors through Redis, a
//! differential test with the local engine, many clients on one key, odd keys and bad input.

mod common;

use std::time::Duration;

use common::Server;
use proptest::prelude::*;
use tollgate::{Decision, Limiter, ManualClock, Nanos, Outcome, Rate, TokenBucket};
use tollgate_redis::{Error, RedisLimiter};

/// Microseconds since the Unix epoch of a day in 2026: schedules replayed from here.
const T0: u64 = 1_780_000_000_000_000;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn limiter(server: &Server, q: TokenBucket, prefix: &str) -> RedisLimiter {
    RedisLimiter::builder(q)
        .url(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// Envoy's `max_tokens=10, tokens_per_fill=1, fill_interval=1s` (REFERENCE.md §1.4): 10 pass at
/// t = 0, the 11th is rejected, rejected at 0.5 s, one passes at 1 s.
#[test]
fn envoy_vector_through_redis() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let q = TokenBucket::envoy(10, 1, Duration::from_secs(1)).unwrap();
        let l = limiter(&server, q, "envoy:").await;
        for i in 0..10 {
            let d = l.check_n_at_server_time("k", 1, T0).await.unwrap();
            assert!(d.is_allowed_now(), "request {i}");
            assert_eq!(d.remaining(), 9 - i);
        }
        let d = l.check_n_at_server_time("k", 1, T0).await.unwrap();
        assert_eq!((d.outcome(), d.retry_after()), (Outcome::Denied, Some(Duration::from_secs(1))));
        assert_eq!(d.reset_after(), Duration::from_secs(10));
        assert!(!l.check_n_at_server_time("k", 1, T0 + 500_000).await.unwrap().is_allowed());
        assert!(l.check_n_at_server_time("k", 1, T0 + 1_000_000).await.unwrap().is_allowed_now());
        assert!(!l.check_n_at_server_time("k", 1, T0 + 1_000_000).await.unwrap().is_allowed());
    });
}

/// governor's `Quota::per_second(5)` (REFERENCE.md §1.5): five at t = 0, the sixth waits 200 ms,
/// exactly five more at 2 s; six at once is insufficient; five at once on a fresh bucket pass.
#[test]
fn governor_vector_through_redis() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let l = limiter(&server, TokenBucket::per_second(5).unwrap(), "gov:").await;
        for _ in 0..5 {
            assert!(l.check_n_at_server_time("k", 1, T0).await.unwrap().is_allowed_now());
        }
        let d = l.check_n_at_server_time("k", 1, T0).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
        let admitted = {
            let mut a = 0;
            for _ in 0..10 {
                a += u32::from(l.check_n_at_server_time("k", 1, T0 + 2_000_000).await.unwrap().is_allowed());
            }
            a
        };
        assert_eq!(admitted, 5);
        assert_eq!(l.check_n_at_server_time("fresh", 6, T0).await.unwrap().outcome(), Outcome::Insufficient);
        assert!(l.check_n_at_server_time("fresh", 5, T0).await.unwrap().is_allowed_now());
        assert_eq!(l.peek_n_at_server_time("fresh", 1, T0).await.unwrap().remaining(), 0);
    });
}

/// Live, on the server's own clock: a fresh key is full, each check takes one, and the key
/// expires once its bucket would be full again (its TTL is the time to full, rounded up).
#[test]
fn live_decisions_and_the_time_to_full_ttl() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let q = TokenBucket::new(Rate::per_second(10), 3).unwrap(); // full again 300 ms after empty
        let l = limiter(&server, q, "live:").await;
        for left in [2, 1, 0] {
            let d = l.check("a").await.unwrap();
            assert!(d.is_allowed_now() && d.remaining() == left, "{d:?}");
        }
        let d = l.check("a").await.unwrap();
        assert_eq!(d.outcome(), Outcome::Denied);
        assert!(d.retry_after().unwrap() <= Duration::from_millis(100));
        let ttl: i64 = server.cli(&["PTTL", "live:a"]).unwrap().trim().parse().unwrap();
        assert!((1..=302).contains(&ttl), "PTTL {ttl} ms: the time to full (≤ 300 ms) plus 2 ms");
        let t = l.server_time().await.unwrap();
        assert!(t > T0 - 365 * 86_400_000_000, "TIME {t} µs");
        // A peek takes nothing and writes nothing for an absent key.
        assert_eq!(l.peek_n("absent", 1).await.unwrap().remaining(), 3);
        assert_eq!(server.cli(&["EXISTS", "live:absent"]).unwrap().trim(), "0");
        assert_eq!(l.stats().redis, 5, "four checks and a peek; TIME is not a decision");
    });
}

fn quota() -> impl Strategy<Value = TokenBucket> {
    let tokens = prop_oneof![1u64..=100, 1u64..=1 << 36, Just(12_500_000_000u64)];
    let period = prop_oneof![Just(1_000_000_000u64), Just(60_000_000_000), 1u64..=1 << 20, 1u64..=1 << 45];
    let burst = prop_oneof![1u64..=20, 1u64..=1 << 32];
    (tokens, period, burst).prop_filter_map("unsupported", |(tokens, period, burst)| {
        TokenBucket::new(Rate::per(tokens, Duration::from_nanos(period)), burst).ok()
    })
}

#[derive(Clone, Debug)]
enum Op {
    Forward(u64),
    Back(u64),
    Check(u64),
    Peek(u64),
}

fn ops(burst: u64) -> impl Strategy<Value = Vec<Op>> {
    let micros = prop_oneof![Just(0u64), 0u64..1_000, 0u64..10_000_000, 0u64..1 << 52];
    let n = prop_oneof![4 => 1..=burst, 1 => Just(0u64), 1 => burst + 1..=burst + 3];
    let op = prop_oneof![
        3 => micros.clone().prop_map(Op::Forward),
        1 => micros.prop_map(Op::Back),
        5 => n.clone().prop_map(Op::Check),
        1 => n.prop_map(Op::Peek),
    ];
    prop::collection::vec(op, 1..60)
}

/// Random schedules replayed on Redis and on a local `Limiter` at the same instants: every
/// decision equal, field for field. A key's clock starts at its first write (a full bucket
/// looks the same from any start), so the local limiter is created there: it matters only when
/// the clock then steps back before that start, where both read the start. (Keys written at a
/// replayed instant get no expiry, so Redis's real time does not meet the replayed clock.)
#[test]
fn redis_decides_as_the_local_engine() {
    let server = Server::start(&[]);
    let rt = rt();
    let l_for = |q| rt.block_on(limiter(&server, q, "diff:"));
    let case = std::sync::atomic::AtomicU32::new(0);
    proptest!(ProptestConfig::with_cases(256), |(q in quota(), ops in ops(20))| {
        let key = format!("case-{}", case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let redis = l_for(q);
        let local = Limiter::with_clock(q, ManualClock::new());
        let mut origin = None;
        let mut now = T0;
        for op in ops {
            let (got, want): (Decision, Decision) = match op {
                Op::Forward(us) => { now = now.saturating_add(us).min(1 << 53); continue }
                Op::Back(us) => { now = now.saturating_sub(us); continue }
                Op::Check(n) => {
                    if n >= 1 && n <= q.burst() {
                        origin.get_or_insert(now);
                    }
                    let at = Nanos::new(now.saturating_sub(origin.unwrap_or(now)).saturating_mul(1000));
                    (rt.block_on(redis.check_n_at_server_time(&key, n, now)).unwrap(), local.check_n_at(at, n))
                }
                Op::Peek(n) => {
                    let at = Nanos::new(now.saturating_sub(origin.unwrap_or(now)).saturating_mul(1000));
                    (rt.block_on(redis.peek_n_at_server_time(&key, n, now)).unwrap(), local.peek_n_at(at, n))
                }
            };
            prop_assert_eq!(got, want, "at +{} µs, {:?}", now.saturating_sub(T0), q);
        }
    });
}
