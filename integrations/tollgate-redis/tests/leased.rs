//! Leased mode on a real `redis-server`: tokens are conserved exactly (every token spent was
//! leased; every leased token is spent, stranded or outstanding), the fleet stays within the
//! shared bucket, and leases grow with demand.

mod common;
#[path = "common/demand.rs"]
mod demand;

use std::time::Duration;

use common::Server;
use demand::Op;
use proptest::prelude::*;
use tollgate::{Outcome, Rate, TokenBucket};
use tollgate_redis::{LeasedLimiter, RedisLimiter};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn leased(
    server: &Server,
    q: TokenBucket,
    prefix: &str,
    max_lease: u64,
    ttl: Duration,
) -> LeasedLimiter {
    let redis = RedisLimiter::builder(q)
        .url(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    LeasedLimiter::new(redis).max_lease(max_lease).lease_ttl(ttl)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random demand from up to four instances on one key, in real time: for each instance,
    /// the tokens it admitted equal the tokens it leased less the stranded and the outstanding
    /// ones (nothing admitted that was not leased, nothing leased lost track of); and all the
    /// leases together took from Redis at most `burst + floor(rate·t)` on its clock.
    #[test]
    fn leased_tokens_are_conserved_and_bounded(
        instances in 1usize..=4,
        max_lease in 1u64..=8,
        ttl_ms in 1u64..=30,
        ops in demand::demand(),
    ) {
        let server = Server::start(&[]);
        let rt = rt();
        rt.block_on(async {
            let q = TokenBucket::new(Rate::per_second(200), 10).unwrap();
            let mut fleet = Vec::new();
            for _ in 0..instances {
                fleet.push(leased(&server, q, "conserve:", max_lease, Duration::from_millis(ttl_ms)).await);
            }
            let start = fleet[0].redis().server_time().await.unwrap();
            let mut admitted = vec![0u64; instances];
            for op in &ops {
                match *op {
                    Op::Check(i, n) => {
                        let i = i % instances;
                        let d = fleet[i].check_n("k", n).await.unwrap();
                        if d.is_allowed() {
                            admitted[i] += n;
                        } else {
                            prop_assert_eq!(d.outcome(), Outcome::Denied);
                            prop_assert!(d.retry_after().unwrap() > Duration::ZERO);
                        }
                    }
                    Op::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
            }
            let end = fleet[0].redis().server_time().await.unwrap();
            let mut leased_total = 0;
            for (l, admitted) in fleet.iter().zip(&admitted) {
                let s = l.stats();
                prop_assert_eq!(*admitted, s.leased_tokens - s.stranded_tokens - s.outstanding_tokens + s.unleased_tokens, "{:?}", s);
                leased_total += s.leased_tokens + s.unleased_tokens;
            }
            let bound = 10 + (end - start) * 200 / 1_000_000;
            prop_assert!(leased_total <= bound, "leased {} > burst + rate·t = {}", leased_total, bound);
            Ok(())
        })?;
    }
}

/// Four instances hammering one key for two seconds, well past its rate: the fleet admits
/// within the shared bucket's bound on the server's clock, every admitted token is accounted
/// for, and what is outstanding stays within the sum of the leases.
#[test]
fn a_leased_fleet_stays_within_the_shared_bucket() {
    let server = Server::start(&[]);
    let rt = rt();
    rt.block_on(async {
        let q = TokenBucket::new(Rate::per_second(20_000), 200).unwrap();
        let mut fleet = Vec::new();
        for _ in 0..4 {
            fleet
                .push(std::sync::Arc::new(leased(&server, q, "fleet:", 20, Duration::from_millis(50)).await));
        }
        let start = fleet[0].redis().server_time().await.unwrap();
        let tasks: Vec<_> = fleet
            .iter()
            .map(|l| {
                let l = std::sync::Arc::clone(l);
                tokio::spawn(async move {
                    let end = std::time::Instant::now() + Duration::from_secs(2);
                    let mut admitted = 0u64;
                    while std::time::Instant::now() < end {
                        admitted += u64::from(l.check("shared").await.unwrap().is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        let end = fleet[0].redis().server_time().await.unwrap();
        let bound = 200 + (end - start) * 20_000 / 1_000_000;
        let (mut accounted, mut outstanding) = (0, 0);
        for l in &fleet {
            let s = l.stats();
            eprintln!("{s:?}");
            accounted += s.leased_tokens - s.stranded_tokens - s.outstanding_tokens + s.unleased_tokens;
            outstanding += s.outstanding_tokens;
        }
        eprintln!("admitted {admitted} of bound {bound}");
        assert!(admitted <= bound, "{admitted} > {bound}");
        assert_eq!(admitted, accounted);
        assert!(outstanding <= 4 * 20);
    });
}

/// One instance: leases double while they are spent in time (up to `max_lease`) and halve when
/// they lapse unspent; a request the shared bucket cannot cover is refused with its exact wait.
#[test]
fn leases_follow_demand() {
    let server = Server::start(&[]);
    rt().block_on(async {
        let q = TokenBucket::new(Rate::per_hour(40), 40).unwrap(); // 90 s a token: nothing refills meanwhile
        let l = leased(&server, q, "adapt:", 8, Duration::from_secs(5)).await;
        for _ in 0..15 {
            assert!(l.check("k").await.unwrap().is_allowed_now());
        }
        // Leases of 1, 2, 4, 8: fifteen tokens in four round trips.
        let s = l.stats();
        assert_eq!((s.leases, s.leased_tokens, s.local, s.outstanding_tokens), (4, 15, 11, 0), "{s:?}");
        assert!(l.check("k").await.unwrap().is_allowed_now());
        assert_eq!(l.stats().outstanding_tokens, 7, "a lease of 8, capped");
        // The shared bucket: 40 − 15 − 8 = 17 left. Another instance drains it.
        let other = leased(&server, q, "adapt:", 40, Duration::from_secs(5)).await;
        assert!(other.redis().check_n("k", 17).await.unwrap().is_allowed_now());
        for _ in 0..7 {
            assert!(l.check("k").await.unwrap().is_allowed_now(), "the lease still holds 7");
        }
        let d = l.check("k").await.unwrap();
        assert_eq!(d.outcome(), Outcome::Denied);
        assert!(d.retry_after().unwrap() <= Duration::from_secs(90));
        assert_eq!(l.check_n("k", 41).await.unwrap().outcome(), Outcome::Insufficient);

        // Demand below the rate: leases reach their largest, and nearly every decision is local.
        let q = TokenBucket::new(Rate::per_second(1_000_000), 100_000).unwrap();
        let l = leased(&server, q, "wide:", 1000, Duration::from_secs(5)).await;
        for _ in 0..20_000 {
            assert!(l.check("k").await.unwrap().is_allowed_now());
        }
        let s = l.stats();
        assert!(s.leases <= 30 && s.local >= 19_970, "{s:?}");
    });
}

/// Issue 34: the default lease was a tenth of the burst, so at a burst of 10 every lease was
/// one token and no decision was local. The default now leases up to half a small burst (see
/// `LeasedLimiter::default_max_lease`): a busy key at a burst of 10 is served mostly from
/// leases, and still admits exactly its burst.
#[test]
fn the_default_lease_makes_small_bursts_local() {
    let table: Vec<u64> = [1, 2, 4, 10, 16, 100, 1000].map(LeasedLimiter::default_max_lease).to_vec();
    assert_eq!(table, [1, 1, 2, 5, 8, 10, 100]);
    let server = Server::start(&[]);
    rt().block_on(async {
        let redis = RedisLimiter::builder(TokenBucket::new(Rate::per_minute(10), 10).unwrap())
            .url(server.url())
            .prefix("small:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let l = LeasedLimiter::new(redis).lease_ttl(Duration::from_secs(30));
        let mut admitted = 0;
        for _ in 0..15 {
            if l.check("k").await.unwrap().is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10, "exactly the burst");
        let s = l.stats();
        assert!(s.local >= 5, "most of the burst served locally: {s:?}");
    });
}
