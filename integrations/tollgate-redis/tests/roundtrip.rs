//! Round-trip mode against a real `redis-server`: the engine's vectors through Redis, a
//! differential test with the local engine, many clients on one key, odd keys and bad input.

mod common;

use std::time::Duration;

use common::Server;
use proptest::prelude::*;
use tollgate::{Decision, Limiter, ManualClock, Nanos, Outcome, Rate, TokenBucket};
use tollgate_redis::{redis, Error, RedisLimiter};

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
        // 3 per minute: nothing refills between the calls, however slow the machine.
        let q = TokenBucket::new(Rate::per_minute(3), 3).unwrap(); // full again 60 s after empty
        let l = limiter(&server, q, "live:").await;
        for left in [2, 1, 0] {
            let d = l.check("a").await.unwrap();
            assert!(d.is_allowed_now() && d.remaining() == left, "{d:?}");
        }
        let d = l.check("a").await.unwrap();
        assert_eq!(d.outcome(), Outcome::Denied);
        assert!(d.retry_after().unwrap() <= Duration::from_secs(20));
        let ttl: i64 = server.cli(&["PTTL", "live:a"]).unwrap().trim().parse().unwrap();
        assert!((50_000..=60_002).contains(&ttl), "PTTL {ttl} ms: the time to full (≤ 60 s) plus 2 ms");
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

/// The quota the parallel clients share: 1,000/s, burst 20.
fn shared_quota() -> TokenBucket {
    TokenBucket::new(Rate::per_second(1000), 20).unwrap()
}

/// Hammers `key` on `url` for `seconds`; the number admitted.
async fn hammer(url: String, seconds: f64) -> u64 {
    let l = RedisLimiter::builder(shared_quota())
        .url(url)
        .prefix("par:")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut admitted = 0;
    while std::time::Instant::now() < end {
        admitted += u64::from(l.check("shared").await.unwrap().is_allowed());
    }
    admitted
}

/// The child process of `many_clients_share_one_limit`: does nothing unless started by it.
#[test]
#[ignore = "a child process of many_clients_share_one_limit"]
fn hammer_child() {
    let Ok(url) = std::env::var("TOLLGATE_REDIS_HAMMER_URL") else { return };
    let admitted = rt().block_on(hammer(url, 2.0));
    println!("admitted={admitted}");
}

/// Four instances as tasks and two as processes, each with its own connection, hammer one key
/// for two seconds. Over the run, on the server's clock, the total admitted is at most
/// `burst + floor(rate·t)`, and (every client always asking) not far below it.
#[test]
fn many_clients_share_one_limit() {
    let server = Server::start(&[]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let probe = runtime.block_on(limiter(&server, shared_quota(), "par:"));
    let start = runtime.block_on(probe.server_time()).unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "hammer_child", "--ignored", "--nocapture", "--test-threads", "1"])
                .env("TOLLGATE_REDIS_HAMMER_URL", server.url())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let tasks: Vec<_> = (0..4).map(|_| runtime.spawn(hammer(server.url(), 2.0))).collect();
    let mut admitted: u64 = runtime.block_on(async {
        let mut sum = 0;
        for t in tasks {
            sum += t.await.unwrap();
        }
        sum
    });
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        // libtest prints the count on its own "test hammer_child ... " line.
        let count = text.split("admitted=").nth(1).expect("the child's count");
        admitted +=
            count.chars().take_while(char::is_ascii_digit).collect::<String>().parse::<u64>().unwrap();
    }
    let end = runtime.block_on(probe.server_time()).unwrap();
    let bound = 20 + (end - start) * 1000 / 1_000_000;
    assert!(
        admitted <= bound,
        "{admitted} admitted over {} µs: more than burst + rate·t = {bound}",
        end - start
    );
    assert!(admitted * 10 >= bound * 8, "{admitted} admitted over {} µs: far below {bound}", end - start);
}

/// Keys are bytes: NUL, invalid UTF-8, CRLF, braces (a Cluster hash tag), spaces, empty.
#[test]
fn keys_with_odd_bytes_are_separate_buckets() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let l = limiter(&server, TokenBucket::new(Rate::per_minute(1), 1).unwrap(), "odd:").await;
        let keys: [&[u8]; 7] = [b"", b"\0", b"\xff\xfe", b"a\r\nb", b"{tag}x", b"with space", b"\0\0"];
        for k in keys {
            assert!(l.check(k).await.unwrap().is_allowed_now(), "{k:?}");
        }
        for k in keys {
            assert!(!l.check(k).await.unwrap().is_allowed(), "{k:?} kept its own bucket");
        }
        assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "7");
    });
}

/// `SCRIPT FLUSH` mid-run (a restart, a failover, an operator): the next call reloads the
/// script (`NOSCRIPT` → load → retry) and the bucket's state is untouched.
#[test]
fn a_flushed_script_is_reloaded() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let l = limiter(&server, TokenBucket::new(Rate::per_minute(1), 3).unwrap(), "flush:").await;
        assert_eq!(l.check("k").await.unwrap().remaining(), 2);
        assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap().trim(), "OK");
        assert_eq!(l.check("k").await.unwrap().remaining(), 1);
        assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap().trim(), "OK");
        assert_eq!(l.peek_n("k", 1).await.unwrap().remaining(), 1);
        assert_eq!(l.stats().failed_error, 0);
    });
}

/// What a key holds when it is not a bucket: typed errors naming the key, whatever the failure
/// policy (no policy fixes data), and the connection goes on working.
#[test]
fn a_key_that_is_not_a_bucket_is_a_typed_error() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let l = RedisLimiter::builder(TokenBucket::per_second(5).unwrap())
            .url(server.url())
            .prefix("bad:")
            .on_failure(tollgate_redis::OnFailure::Allow)
            .connect()
            .await
            .unwrap();
        server.cli(&["HSET", "bad:hash", "tokens", "5"]).unwrap();
        server.cli(&["SET", "bad:short", "not a bucket"]).unwrap();
        // 28 bytes of garbage (the length of the untagged format before issue 34), 36 bytes
        // of garbage (the length of a bucket), and a bucket with one byte damaged.
        server.cli(&["SET", "bad:garbage28", &"x".repeat(28)]).unwrap();
        server.cli(&["SET", "bad:garbage36", &"y".repeat(36)]).unwrap();
        match l.check("hash").await {
            Err(Error::Redis(e)) => assert_eq!(e.code(), Some("WRONGTYPE"), "{e}"),
            other => panic!("{other:?}"),
        }
        let corrupt = |r: Result<tollgate::Decision, Error>, key: &str, why: &str| match r {
            Err(Error::Corrupt { key: k, reason }) => {
                assert_eq!(k, key);
                assert!(reason.contains(why), "{reason}");
            }
            other => panic!("{key}: {other:?}"),
        };
        corrupt(l.check("short").await, "bad:short", "12 bytes, not a tollgate bucket of 36");
        corrupt(l.check("garbage28").await, "bad:garbage28", "28 bytes");
        corrupt(l.check("garbage36").await, "bad:garbage36", "tag tgb1");
        assert!(l.check("fine").await.unwrap().is_allowed_now());
        // What Redis holds for a bucket is what `BucketValue` reads, and writes back alike.
        let raw = {
            let client = redis::Client::open(server.url()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            redis::cmd("GET").arg("bad:fine").query_async::<Vec<u8>>(&mut c).await.unwrap()
        };
        let v = tollgate_redis::BucketValue::decode(&raw).unwrap();
        assert_eq!(v.encode().as_slice(), raw.as_slice());
        assert_eq!(v.units_per_nano, 1, "5/s is exact at 1 unit a ns");
        // One byte of a bucket damaged: the script's check word refuses it.
        let mut damaged = raw.clone();
        damaged[20] ^= 0x01;
        {
            let client = redis::Client::open(server.url()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            redis::cmd("SET").arg("bad:damaged").arg(&damaged).query_async::<()>(&mut c).await.unwrap();
        }
        corrupt(l.check("damaged").await, "bad:damaged", "check word");
        let s = l.stats();
        assert_eq!((s.failed_error, s.failed_allow, s.redis), (5, 0, 1));
    });
}

/// A quota of another unit on the same keys: the bucket restarts empty on the new quota's
/// clock (never a free burst); one of the same unit keeps the empty instant, as `set_policy`.
#[test]
fn a_changed_quota_never_mints_tokens() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let slow = limiter(&server, TokenBucket::new(Rate::per_minute(1), 5).unwrap(), "q:").await;
        assert!(slow.check("k").await.unwrap().is_allowed_now());
        // 7 per 3 s counts in 1/7 ns units (m = 7): another clock.
        let other_unit = TokenBucket::new(Rate::per(7, Duration::from_secs(3)), 5).unwrap();
        assert_ne!(other_unit.units_per_nano(), slow.quota().units_per_nano());
        let l = limiter(&server, other_unit, "q:").await;
        assert_eq!(l.peek_n("k", 1).await.unwrap().remaining(), 0, "restarted empty");
        assert_eq!(slow.peek_n("k", 1).await.unwrap().remaining(), 4, "a peek writes no restart");
        assert!(!l.check("k").await.unwrap().is_allowed());
        assert_eq!(slow.peek_n("k", 1).await.unwrap().remaining(), 0, "a take keeps the restart");
        // Same unit (m = 1), faster rate: the empty instant keeps its meaning. Drained by the
        // slow quota, the bucket is empty for the fast one too, and refills at its rate.
        let fast = limiter(&server, TokenBucket::new(Rate::per_second(1), 5).unwrap(), "q:").await;
        assert!(slow.check_n("j", 5).await.unwrap().is_allowed_now());
        let d = fast.peek_n("j", 1).await.unwrap();
        assert_eq!(d.remaining(), 0);
        assert!(d.retry_after().unwrap() <= Duration::from_secs(1), "{d:?}");
        // A fast quota's write keeps the key until the slow quota's bucket is full: slow took
        // 4 of 5 (the fast bucket still full), fast takes 1, and both are then empty for
        // slow: the key must outlive slow's refill (about 296 s), not fast's (1 s).
        assert!(slow.check_n("i", 4).await.unwrap().is_allowed_now());
        assert_eq!(fast.check("i").await.unwrap().remaining(), 4);
        assert_eq!(slow.peek_n("i", 1).await.unwrap().remaining(), 0);
        let ttl: i64 = server.cli(&["PTTL", "q:i"]).unwrap().trim().parse().unwrap();
        assert!(ttl > 290_000, "PTTL {ttl} ms: the key would vanish before the slow bucket refills");
    });
}

/// Bad connection strings and credentials fail at `connect`, typed, without the password.
#[test]
fn bad_urls_and_credentials_fail_at_connect() {
    let server = Server::start(&["--requirepass", "s3cret"]);
    rt().block_on(async {
        let q = TokenBucket::per_second(5).unwrap();
        for url in ["not a url", "http://127.0.0.1:6379", "redis://127.0.0.1:99999", "redis://:hunter2@[::1"]
        {
            match RedisLimiter::builder(q).url(url).connect().await {
                Err(e @ Error::Url { .. }) => assert!(!e.to_string().contains("hunter2"), "{e}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port);
        match RedisLimiter::builder(q).url(&wrong).timeout(Duration::from_secs(2)).connect().await {
            Err(Error::Redis(e)) => {
                assert_eq!(e.kind(), tollgate_redis::redis::ErrorKind::AuthenticationFailed, "{e}")
            }
            other => panic!("{other:?}"),
        }
        let none = server.url();
        match RedisLimiter::builder(q).url(&none).timeout(Duration::from_secs(2)).connect().await {
            Err(Error::Redis(e)) => assert_eq!(e.code(), Some("NOAUTH"), "{e}"),
            other => panic!("{other:?}"),
        }
        let right = format!("redis://:s3cret@127.0.0.1:{}", server.port);
        let l = RedisLimiter::builder(q).url(&right).connect().await.unwrap();
        assert!(l.check("k").await.unwrap().is_allowed_now());
        // A quota that does not start full cannot live in Redis.
        let half = q.with_initial(2).unwrap();
        assert!(matches!(RedisLimiter::builder(half).url(&right).connect().await, Err(Error::Config(_))));
    });
}
