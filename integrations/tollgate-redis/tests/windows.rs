//! Batches of fixed windows on a real `redis-server` (and a local Cluster): every decision
//! equal to the engine's `FixedWindow` on the Unix epoch's clock, bit for bit (the client
//! checks the word the script wrote against the engine's; this test checks the decisions
//! against the engine run locally on its own words), one script call per batch, expiries at
//! the window's end, and bad input refused. Token buckets in the same batches decide as the
//! round-trip limiter.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Cluster, Server};
use proptest::prelude::*;
use tollgate::{FixedWindow, Nanos, Nginx, Outcome, Policy, Rate, SlidingWindow, TokenBucket};
use tollgate_redis::{
    BucketCheck, Check, Error, NginxCheck, RedisLimiter, RedisWindows, SlidingCheck, WindowCheck,
};

/// Microseconds since the Unix epoch of a day in 2026, on a minute's edge.
const T0: u64 = 1_780_000_020_000_000;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn windows(url: String) -> RedisWindows {
    RedisWindows::builder().url(url).timeout(Duration::from_secs(2)).connect().await.unwrap()
}

fn fw(limit: u64, window: Duration, charge: bool) -> FixedWindow {
    let w = FixedWindow::new(limit, window).unwrap();
    if charge {
        w.charging_refusals()
    } else {
        w
    }
}

#[test]
fn upstreams_counting_window_and_tollgates_on_one_batch() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = windows(server.url()).await;
        let minute = Duration::from_secs(60);
        let (counted, plain) = (fw(3, minute, true), fw(3, minute, false));
        let batch = |n: u64| {
            [
                WindowCheck { key: b"counted", window: counted, n, up_to: 0 },
                WindowCheck { key: b"plain", window: plain, n, up_to: 0 },
            ]
        };
        let at = |s: u64| T0 + s * 1_000_000;
        let d = w.check_all_at_server_time(&batch(2), at(1)).await.unwrap();
        assert!(d.iter().all(|d| d.is_allowed() && d.remaining() == 1));
        assert_eq!(d[0].reset_after(), Duration::from_secs(59));
        let d = w.check_all_at_server_time(&batch(2), at(2)).await.unwrap();
        assert!(d.iter().all(|d| d.outcome() == Outcome::Denied));
        // The counted window took the refused two; the other did not.
        let d = w.check_all_at_server_time(&batch(1), at(3)).await.unwrap();
        assert_eq!((d[0].is_allowed(), d[1].is_allowed()), (false, true));
        // The next minute starts afresh.
        let d = w.check_all_at_server_time(&batch(3), at(60)).await.unwrap();
        assert!(d.iter().all(|d| d.is_allowed() && d.remaining() == 0));
        assert_eq!(w.stats().redis, 4, "one call per batch");
    });
}

#[test]
fn live_keys_expire_when_their_window_ends() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = windows(server.url()).await;
        let check =
            [WindowCheck { key: b"k", window: fw(5, Duration::from_secs(10), false), n: 1, up_to: 0 }];
        let decided = std::time::Instant::now();
        let d = w.check_all(&check).await.unwrap();
        assert!(d[0].is_allowed());
        let pttl: i64 = server.cli(&["PTTL", "tollgate:w:k"]).unwrap().trim().parse().unwrap();
        // The key expires at the window's end (1 ms later, for Redis's millisecond clock): its
        // TTL, read after the decision, is the reset less the time since, within a millisecond
        // or two of rounding.
        let since = i64::try_from(decided.elapsed().as_millis()).unwrap();
        let reset = i64::try_from(d[0].reset_after().as_millis()).unwrap();
        assert!(
            pttl > 0 && pttl <= reset + 2 && pttl >= reset - since - 2,
            "PTTL {pttl} ms, reset {reset} ms, {since} ms since"
        );
        // A look (n = 0) writes nothing.
        let look =
            [WindowCheck { key: b"other", window: fw(5, Duration::from_secs(10), false), n: 0, up_to: 0 }];
        assert!(w.check_all(&look).await.unwrap()[0].is_allowed());
        assert_eq!(server.cli(&["EXISTS", "tollgate:w:other"]).unwrap().trim(), "0");
    });
}

#[test]
fn bad_batches_and_values_are_typed_errors() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = windows(server.url()).await;
        let minute = fw(5, Duration::from_secs(60), false);
        let twice = [
            WindowCheck { key: b"a", window: minute, n: 1, up_to: 0 },
            WindowCheck { key: b"a", window: minute, n: 1, up_to: 0 },
        ];
        let e = w.check_all(&twice).await.unwrap_err();
        assert!(matches!(&e, Error::Batch { reason } if reason.contains("named twice")), "{e}");
        let odd =
            [WindowCheck { key: b"b", window: fw(5, Duration::from_nanos(1_500), false), n: 1, up_to: 0 }];
        let e = w.check_all(&odd).await.unwrap_err();
        assert!(matches!(&e, Error::Batch { reason } if reason.contains("not whole microseconds")), "{e}");
        server.cli(&["SET", "tollgate:w:text", "abc"]).unwrap();
        let e =
            w.check_all(&[WindowCheck { key: b"text", window: minute, n: 1, up_to: 0 }]).await.unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt { reason, .. } if reason.contains("not a tollgate window")),
            "{e}"
        );
        assert!(!e.is_transient());
        // A window's word means nothing under another count width: a key written with a
        // 24-bit count is refused to a limit of 25 bits, and the other way round, each tag
        // named.
        let narrow = fw(10, Duration::from_secs(60), false);
        let wide = fw(1 << 24, Duration::from_secs(60), false);
        w.check_all(&[WindowCheck { key: b"width", window: narrow, n: 1, up_to: 0 }]).await.unwrap();
        let e = w.check_all(&[WindowCheck { key: b"width", window: wide, n: 1, up_to: 0 }]).await.unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt { reason, .. } if reason.contains("25-bit count (tgwA")),
            "{e}"
        );
        w.check_all(&[WindowCheck { key: b"wide", window: wide, n: 1, up_to: 0 }]).await.unwrap();
        assert_eq!(&server.cli(&["GET", "tollgate:w:wide"]).unwrap().as_bytes()[..4], b"tgwA");
        let e = w.check_all(&[WindowCheck { key: b"wide", window: narrow, n: 1, up_to: 0 }]).await.unwrap_err();
        assert!(matches!(&e, Error::Corrupt { reason, .. } if reason.contains("(tgw1")), "{e}");
        // A bad key late in a batch fails it before anything is written: the healthy key
        // before it is not counted. The error names the bad key, spaces and all.
        server.cli(&["SET", "tollgate:w:a b", "x"]).unwrap();
        let bucket = TokenBucket::per_second(5).unwrap();
        let batch = [
            Check::Window(WindowCheck { key: b"healthy", window: minute, n: 1, up_to: 0 }),
            Check::Bucket(BucketCheck { key: b"bucket", quota: bucket, n: 1 }),
            Check::Window(WindowCheck { key: b"a b", window: minute, n: 1, up_to: 0 }),
        ];
        let e = w.decide_all(&batch).await.unwrap_err();
        assert!(matches!(&e, Error::Corrupt { key, .. } if key == "tollgate:w:a b"), "{e:?}");
        assert_eq!(server.cli(&["EXISTS", "tollgate:w:healthy", "tollgate:w:bucket"]).unwrap().trim(), "0");
        server.cli(&["SET", "tollgate:w:b2", "not a bucket"]).unwrap();
        let e = w.decide_all(&[Check::Bucket(BucketCheck { key: b"b2", quota: bucket, n: 1 })]).await.unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt { key, reason } if key == "tollgate:w:b2" && reason.contains("not a tollgate bucket of 36")),
            "{e:?}"
        );
        server.cli(&["RPUSH", "tollgate:w:list", "x"]).unwrap();
        let e =
            w.check_all(&[WindowCheck { key: b"list", window: minute, n: 1, up_to: 0 }]).await.unwrap_err();
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        // The server keeps answering.
        assert_eq!(server.cli(&["PING"]).unwrap().trim(), "PONG");
    });
}

#[test]
fn a_batch_over_a_cluster_is_one_call_per_slot_and_decides_as_one_server() {
    let cluster = Cluster::start();
    let single = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let c = RedisWindows::builder()
            .cluster(cluster.urls())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let s = windows(single.url()).await;
        let window = fw(4, Duration::from_secs(1), true);
        let names: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
        for step in 0..6u64 {
            let checks: Vec<WindowCheck<'_>> = names
                .iter()
                .map(|k| WindowCheck { key: k.as_bytes(), window, n: 1 + step % 2, up_to: 0 })
                .collect();
            let at = T0 + step * 300_000;
            let a = c.check_all_at_server_time(&checks, at).await.unwrap();
            let b = s.check_all_at_server_time(&checks, at).await.unwrap();
            assert_eq!(a, b, "step {step}");
        }
        // Twelve keys spread over the three masters' slots: more than one call per batch.
        assert!(c.stats().redis > 6, "{:?}", c.stats());
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Limits above 2^24 − 1 (a count of 25 to 32 bits in the word, as the engine's), asks in
    /// tenths of the limit: every decision equals the engine's, every word the engine's.
    #[test]
    fn wide_windows_decide_as_the_engine(
        specs in prop::collection::vec(((1u64 << 24)..=u64::from(u32::MAX), 0usize..3, any::<bool>()), 2),
        steps in prop::collection::vec((0u64..30_000_000, prop::collection::vec((0u64..16, 0u64..20), 2)), 1..20),
    ) {
        let server = Server::start(&[]);
        let lengths = [Duration::from_secs(1), Duration::from_secs(60), Duration::from_secs(86_400)];
        let windows_of: Vec<FixedWindow> =
            specs.iter().map(|&(limit, len, charge)| fw(limit, lengths[len], charge)).collect();
        let names = [b"wa".as_slice(), b"wb"];
        rt().block_on(async {
            let w = windows(server.url()).await;
            let mut words = [0u64; 2];
            let mut now = T0;
            for (gap, asks) in &steps {
                now += gap;
                let tenth = |i: usize, k: u64| k * (windows_of[i].limit() / 10);
                let checks: Vec<WindowCheck<'_>> = (0..2)
                    .map(|i| WindowCheck { key: names[i], window: windows_of[i], n: tenth(i, asks[i].0), up_to: 0 })
                    .collect();
                let got = w.take_all_at_server_time(&checks, now).await.unwrap();
                for i in 0..2 {
                    let n = tenth(i, asks[i].0);
                    let (next, want) = windows_of[i].decide(words[i], Nanos::new(now * 1000), n);
                    if let Some(next) = next {
                        words[i] = next;
                    }
                    assert_eq!(got[i].units, if want.is_allowed() { n } else { 0 }, "key {i} at {now} µs");
                    assert_eq!(got[i].decision, want, "key {i} at {now} µs");
                }
            }
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random batches over four keys with their own windows, replayed at increasing instants,
    /// some checks leases: every decision equals the engine's on a local copy of the words, and
    /// every lease takes the most the engine would admit, up to what it asked.
    #[test]
    fn every_decision_is_the_engines(
        specs in prop::collection::vec((1u64..20, 0usize..5, any::<bool>()), 4),
        steps in prop::collection::vec((0u64..3_000_000, prop::collection::vec((0u64..25, 0u64..40), 4)), 1..30),
    ) {
        let server = Server::start(&[]);
        let lengths = [
            Duration::from_secs(1),
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_micros(2_500),
            Duration::from_secs(3 * 3600),
        ];
        let windows_of: Vec<FixedWindow> =
            specs.iter().map(|&(limit, len, charge)| fw(limit, lengths[len], charge)).collect();
        let names = [b"a".as_slice(), b"b", b"c", b"d"];
        rt().block_on(async {
            let w = windows(server.url()).await;
            let mut words: HashMap<usize, u64> = HashMap::new();
            let mut now = T0;
            for (gap, asks) in &steps {
                now += gap;
                let checks: Vec<WindowCheck<'_>> = (0..4)
                    .map(|i| WindowCheck { key: names[i], window: windows_of[i], n: asks[i].0, up_to: asks[i].1 })
                    .collect();
                let got = w.take_all_at_server_time(&checks, now).await.unwrap();
                for i in 0..4 {
                    let (n, up_to) = asks[i];
                    let word = words.entry(i).or_insert(0);
                    let at = Nanos::new(now * 1000);
                    let (mut next, mut want) = windows_of[i].decide(*word, at, n);
                    let mut units = if want.is_allowed() { n } else { 0 };
                    if want.is_allowed() && n > 0 {
                        // The model of a lease: the most units up to `up_to` the engine admits.
                        for t in n + 1..=up_to {
                            let (t_next, t_want) = windows_of[i].decide(*word, at, t);
                            if !t_want.is_allowed() {
                                break;
                            }
                            (next, want, units) = (t_next, t_want, t);
                        }
                    }
                    if let Some(next) = next {
                        *word = next;
                    }
                    assert_eq!(got[i].units, units, "key {i} at {now} µs");
                    assert_eq!(got[i].decision, want, "key {i} at {now} µs");
                }
            }
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Mixed batches of a window and two token buckets, replayed at increasing instants: each
    /// bucket decides as `RedisLimiter` decides on a key of its own at the same instant (the
    /// round-trip limiter's script and the engine agree, `tests/roundtrip.rs`), the window as
    /// the engine.
    #[test]
    fn buckets_in_a_batch_decide_as_the_round_trip_limiter(
        rates in prop::collection::vec((1u64..50, 1u64..20), 2),
        window_limit in 1u64..20,
        steps in prop::collection::vec((0u64..400_000, 0u64..6, 0u64..25, 0u64..4), 1..40),
    ) {
        let server = Server::start(&[]);
        rt().block_on(async {
            let w = windows(server.url()).await;
            let quotas: Vec<TokenBucket> = rates
                .iter()
                .map(|&(per_sec, burst)| TokenBucket::new(Rate::per_second(per_sec), burst).unwrap())
                .collect();
            let mut singles = Vec::new();
            for (i, q) in quotas.iter().enumerate() {
                singles.push(
                    RedisLimiter::builder(*q)
                        .url(server.url())
                        .prefix(format!("single{i}:"))
                        .timeout(Duration::from_secs(2))
                        .connect()
                        .await
                        .unwrap(),
                );
            }
            let window = fw(window_limit, Duration::from_secs(1), false);
            let mut word = 0u64;
            let mut now = T0;
            for &(gap, n0, wn, n1) in &steps {
                now += gap;
                let batch = [
                    Check::Bucket(BucketCheck { key: b"b0", quota: quotas[0], n: n0 }),
                    Check::Window(WindowCheck { key: b"w", window, n: wn, up_to: 0 }),
                    Check::Bucket(BucketCheck { key: b"b1", quota: quotas[1], n: n1 }),
                ];
                let got = w.decide_all_at_server_time(&batch, now).await.unwrap();
                let (next, want) = window.decide(word, Nanos::new(now * 1000), wn);
                if let Some(next) = next {
                    word = next;
                }
                assert_eq!(got[1].decision, want, "window at {now} µs");
                for (j, (single, n)) in singles.iter().zip([n0, n1]).enumerate() {
                    let alone = single.check_n_at_server_time(b"b", n, now).await.unwrap();
                    assert_eq!(got[2 * j].decision, alone, "bucket {j} at {now} µs");
                    let took = if alone.is_allowed() && n > 0 && n <= quotas[j].burst() { n } else { 0 };
                    assert_eq!(got[2 * j].units, took, "bucket {j} at {now} µs");
                }
            }
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Sliding windows in batches (beside a fixed window), replayed at increasing instants:
    /// every decision equals the engine's `SlidingWindow` on a local copy of its word, limits
    /// of every width the engine's layout has.
    #[test]
    fn sliding_windows_decide_as_the_engine(
        specs in prop::collection::vec((prop_oneof![1u64..20, 20u64..70_000, 70_000u64..1_048_575], 0usize..3), 2),
        steps in prop::collection::vec((0u64..2_000_000, prop::collection::vec(0u64..40, 2)), 1..40),
    ) {
        let server = Server::start(&[]);
        let lengths = [Duration::from_secs(1), Duration::from_secs(60), Duration::from_secs(86_400)];
        let windows_of: Vec<SlidingWindow> = specs
            .iter()
            .map(|&(limit, len)| SlidingWindow::new(limit, lengths[len]).or_else(|_| SlidingWindow::new(limit, lengths[2])).unwrap())
            .collect();
        rt().block_on(async {
            let w = windows(server.url()).await;
            let fixed = fw(3, Duration::from_secs(1), false);
            let mut words = [0u64; 2];
            let mut now = T0;
            for (gap, ns) in &steps {
                now += gap;
                let batch = [
                    Check::Sliding(SlidingCheck { key: b"s0", window: windows_of[0], n: ns[0] }),
                    Check::Window(WindowCheck { key: b"f", window: fixed, n: 1, up_to: 0 }),
                    Check::Sliding(SlidingCheck { key: b"s1", window: windows_of[1], n: ns[1] }),
                ];
                let got = w.decide_all_at_server_time(&batch, now).await.unwrap();
                for (j, at) in [(0, 0), (1, 2)] {
                    let (next, want) = windows_of[j].decide(words[j], Nanos::new(now * 1000), ns[j]);
                    if let Some(next) = next {
                        words[j] = next;
                    }
                    assert_eq!(got[at].decision, want, "sliding window {j} at {now} µs");
                }
            }
        });
    }
}

#[test]
fn a_sliding_window_key_holding_something_else_is_an_error() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = windows(server.url()).await;
        server.cli(&["SET", "tollgate:w:s", "tgw1abcdefgh"]).unwrap();
        let check = [Check::Sliding(SlidingCheck {
            key: b"s",
            window: SlidingWindow::new(10, Duration::from_secs(1)).unwrap(),
            n: 1,
        })];
        let e = w.decide_all(&check).await.unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("not a tollgate sliding window"), "{e}");
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// nginx's limit_req in batches, replayed at increasing instants (some behind the last
    /// request, as a clock that stepped back): every decision equals the engine's `Nginx` on a
    /// local copy of its word, whatever the rate, burst and delay.
    #[test]
    fn nginx_decides_as_the_engine(
        rates in prop::collection::vec((1u64..200, any::<bool>(), 0u64..12, 0u8..3), 2),
        steps in prop::collection::vec((0u64..900_000, any::<bool>(), prop::collection::vec(0u64..5, 2)), 1..40),
    ) {
        let server = Server::start(&[]);
        let limits: Vec<Nginx> = rates
            .iter()
            .map(|&(n, per_minute, burst, mode)| {
                let base = if per_minute { Nginx::per_minute(n) } else { Nginx::per_second(n) };
                let l = base.unwrap().burst(burst).unwrap();
                match mode {
                    0 => l,
                    1 => l.nodelay(),
                    _ => l.delay(burst / 2),
                }
            })
            .collect();
        rt().block_on(async {
            let w = windows(server.url()).await;
            // The engine's clock starts 100 s before the first instant, on a whole ms: the steps
            // back (at most 40 × 0.9 s) stay after it.
            let origin_us = T0 - 100_000_000;
            let mut words = [0u64; 2];
            let mut now = T0;
            for (gap, back, ns) in &steps {
                // Now and then the clock steps back (up to 0.9 s), as a failed-over server's may.
                now = if *back { now.saturating_sub(*gap) } else { now + gap };
                let batch = [
                    Check::Nginx(NginxCheck { key: b"n0", limit: limits[0], n: ns[0] }),
                    Check::Nginx(NginxCheck { key: b"n1", limit: limits[1], n: ns[1] }),
                ];
                let got = w.decide_all_at_server_time(&batch, now).await.unwrap();
                for j in 0..2 {
                    // A fresh key is a node at its first request: the engine's word 0 at origin
                    // is one whenever the first request comes (its excess has leaked).
                    let (next, want) = limits[j].decide(words[j], Nanos::new((now - origin_us) * 1000), ns[j]);
                    if let Some(next) = next {
                        words[j] = next;
                    }
                    assert_eq!(got[j].decision, want, "nginx {j} at {now} µs");
                }
            }
        });
    }
}
