//! Leased windows on a real `redis-server`: a window never admits more than its limit across
//! instances, units are conserved exactly (every unit admitted was leased or taken by a round
//! trip; every leased unit is admitted, stranded or outstanding; Redis's count is what was
//! taken), a hot key costs far fewer round trips than checks, and a lease ends with its window.

mod common;
#[path = "common/demand.rs"]
mod demand;

use std::time::Duration;

use common::Server;
use demand::Op;
use proptest::prelude::*;
use tollgate::FixedWindow;
use tollgate_redis::{LeasedWindows, RedisWindows, WindowCheck};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn leased(url: String, ttl: Duration) -> LeasedWindows {
    let windows = RedisWindows::builder()
        .url(url)
        .prefix("lw:")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    LeasedWindows::new(windows).lease_ttl(ttl)
}

/// A window of 100 years: aligned on the epoch, every test runs inside its first one.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The count Redis holds for `key` (after the prefix), 0 when missing.
async fn redis_count(url: &str, key: &str) -> u64 {
    let client = tollgate_redis::redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let raw: Option<Vec<u8>> =
        tollgate_redis::redis::cmd("GET").arg(format!("lw:{key}")).query_async(&mut conn).await.unwrap();
    raw.map_or(0, |v| {
        assert_eq!(&v[..4], b"tgw1");
        u64::from_be_bytes(v[4..12].try_into().unwrap()) & ((1 << 24) - 1)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random demand from up to four instances on one window, in real time: together they
    /// admit at most the limit; each admitted exactly what it leased less what stranded or is
    /// outstanding, plus its round trips' units; and Redis counts exactly what was taken.
    #[test]
    fn a_window_is_never_passed_and_units_are_conserved(
        instances in 1usize..=4,
        limit in 1u64..=120,
        largest in 2u64..=16,
        ttl_ms in 1u64..=30,
        ops in demand::demand(),
    ) {
        let server = Server::start(&[]);
        rt().block_on(async {
            let mut fleet = Vec::new();
            for _ in 0..instances {
                fleet.push(leased(server.url(), Duration::from_millis(ttl_ms)).await);
            }
            let window = FixedWindow::new(limit, CENTURY).unwrap();
            let mut admitted = vec![0u64; instances];
            for op in &ops {
                match *op {
                    Op::Check(i, n) => {
                        let i = i % instances;
                        let check = WindowCheck { key: b"k", window, n, up_to: largest };
                        let d = fleet[i].check_all(&[check]).await.unwrap();
                        if d[0].is_allowed() {
                            admitted[i] += n;
                        }
                    }
                    Op::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
            }
            let mut taken = 0;
            for (i, w) in fleet.iter().enumerate() {
                let s = w.stats();
                assert_eq!(
                    admitted[i],
                    s.leased_tokens - s.stranded_tokens - s.outstanding_tokens + s.unleased_tokens,
                    "instance {i}: {s:?}"
                );
                taken += s.leased_tokens + s.unleased_tokens;
            }
            assert!(admitted.iter().sum::<u64>() <= limit, "{admitted:?} of {limit}");
            assert_eq!(redis_count(&server.url(), "k").await, taken);
        });
    }
}

/// 32 tasks on one hot key with leases of up to 100: most checks are served locally, and the
/// round trips stay well below a tenth of the checks (upstream's pattern sends two commands a
/// check). Every admission is counted in Redis.
#[test]
fn a_hot_key_costs_few_round_trips() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = std::sync::Arc::new(leased(server.url(), Duration::from_millis(50)).await);
        let window = FixedWindow::new(1_000_000, CENTURY).unwrap();
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let w = std::sync::Arc::clone(&w);
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..500 {
                        let check = WindowCheck { key: b"hot", window, n: 1, up_to: 100 };
                        admitted += u64::from(w.check_all(&[check]).await.unwrap()[0].is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        assert_eq!(admitted, 16_000);
        let calls = w.windows().stats().redis;
        let s = w.stats();
        assert!(calls * 20 <= admitted, "{calls} round trips for {admitted} checks: {s:?}");
        assert_eq!(s.local + s.leases + s.unleased, admitted, "{s:?}");
        assert_eq!(redis_count(&server.url(), "hot").await, s.leased_tokens + s.unleased_tokens);
    });
}

/// A lease is spent only in the window it was taken from: once its window ends, the next
/// check goes to Redis, in the new window.
#[test]
fn a_lease_ends_with_its_window() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = leased(server.url(), Duration::from_secs(3600)).await;
        let window = FixedWindow::new(1000, Duration::from_millis(400)).unwrap();
        let check = [WindowCheck { key: b"w", window, n: 1, up_to: 64 }];
        // Leases of 1, then 2 (one unit left), then that unit spent locally.
        for _ in 0..3 {
            assert!(w.check_all(&check).await.unwrap()[0].is_allowed());
        }
        let s = w.stats();
        assert_eq!((s.leases, s.local), (2, 1), "{s:?}");
        let to_end = w.check_all(&check).await.unwrap()[0].reset_after();
        assert!(to_end <= Duration::from_millis(400), "{to_end:?}");
        let local = w.stats().local;
        tokio::time::sleep(to_end + Duration::from_millis(20)).await;
        let d = w.check_all(&check).await.unwrap()[0];
        assert!(d.is_allowed());
        assert_eq!(w.stats().local, local, "a lease outlived its window");
    });
}

/// A batch of a leased check and a plain one, the lease empty: one round trip for both. A
/// check that counts refusals never leases; a key named twice is refused.
#[test]
fn a_batch_refills_and_decides_in_one_round_trip() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = leased(server.url(), Duration::from_secs(3600)).await;
        let window = FixedWindow::new(100, CENTURY).unwrap();
        let counted = FixedWindow::new(100, CENTURY).unwrap().charging_refusals();
        let batch = [
            WindowCheck { key: b"a", window, n: 1, up_to: 10 },
            WindowCheck { key: b"b", window, n: 1, up_to: 0 },
            WindowCheck { key: b"c", window: counted, n: 1, up_to: 10 },
        ];
        let d = w.check_all(&batch).await.unwrap();
        assert!(d.iter().all(|d| d.is_allowed()));
        assert_eq!(w.windows().stats().redis, 1);
        let s = w.stats();
        assert_eq!((s.leases, s.unleased), (1, 2), "{s:?}");
        // The counted window and the plain one took exactly their unit: nothing leased there.
        assert_eq!(redis_count(&server.url(), "b").await, 1);
        assert_eq!(redis_count(&server.url(), "c").await, 1);
        let twice = [batch[0], batch[0]];
        assert!(matches!(w.check_all(&twice).await, Err(tollgate_redis::Error::Batch { .. })));
    });
}

/// With the lease table full, a window check on another key is a plain round trip that takes
/// exactly its units, never a lease nobody spends.
#[test]
fn a_full_lease_table_takes_exactly_the_units() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let w = leased(server.url(), Duration::from_secs(3600)).await.max_keys(1);
        let window = FixedWindow::new(100, CENTURY).unwrap();
        let a = [WindowCheck { key: b"a", window, n: 1, up_to: 50 }];
        let b = [WindowCheck { key: b"b", window, n: 1, up_to: 50 }];
        for _ in 0..3 {
            assert!(w.check_all(&a).await.unwrap()[0].is_allowed());
            assert!(w.check_all(&b).await.unwrap()[0].is_allowed());
        }
        assert_eq!(redis_count(&server.url(), "b").await, 3, "b was leased although it holds no lease");
        assert_eq!(w.stats().unleased_tokens, 3);
    });
}
