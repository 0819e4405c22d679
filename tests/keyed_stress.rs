//! Multi-thread stress on the keyed table: millions of decisions on random keys from 4 threads,
//! then a per-key conservation check.

#![allow(clippy::cast_possible_truncation, reason = "key indices below 2^16")]

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::rng::xorshift;
use tollgate::{Clock, KeyedBuilder, KeyedLimiter, ManualClock, Outcome, Rate, TokenBucket, WhenFull};

const THREADS: usize = 4;

/// Frozen time, so no bucket refills and none is ever full again once touched: each of 4,096
/// keys is hit from 4 threads in random orders (inserts of the same key race), and each admits
/// exactly its burst of 3, no more and no fewer.
#[test]
fn frozen_time_admits_exactly_the_burst_per_key() {
    const KEYS: u64 = 4_096;
    let q = TokenBucket::new(Rate::per_hour(1), 3).unwrap();
    let l: Arc<KeyedLimiter<u64, ManualClock>> =
        Arc::new(KeyedBuilder::new(q).capacity(8_192).build_with_clock(ManualClock::new()).unwrap());
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (l, admitted) = (Arc::clone(&l), Arc::clone(&admitted));
            std::thread::spawn(move || {
                let mut rng = 0x2545_f491_4f6c_dd1d ^ (t as u64 + 1);
                for _ in 0..250_000 {
                    let k = xorshift(&mut rng) % KEYS;
                    if l.check(&k).is_allowed() {
                        admitted[k as usize].fetch_add(1, Relaxed);
                    }
                }
                // Then every key once more, so that each is surely drained.
                for k in 0..KEYS {
                    for _ in 0..3 {
                        if l.check(&k).is_allowed() {
                            admitted[k as usize].fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (k, a) in admitted.iter().enumerate() {
        assert_eq!(a.load(Relaxed), 3, "key {k}");
    }
    assert_eq!(l.len(), KEYS);
    assert_eq!(l.stats().live, KEYS);
}

/// Moving time, a table a quarter of the key space, sweeps, and each table-full policy: 4
/// threads decide on 16,384 keys while advancing the clock and sweeping. Buckets refill,
/// are evicted (cleanly and by force) and come back; still no key is ever admitted more than
/// `burst + floor(rate · elapsed)` over the run.
#[test]
fn churn_with_eviction_never_over_admits() {
    const KEYS: u64 = 16_384;
    for policy in [WhenFull::Deny, WhenFull::EvictFullest] {
        let q = TokenBucket::new(Rate::per(1, Duration::from_micros(100)), 4).unwrap();
        let clock = ManualClock::new();
        let l: Arc<KeyedLimiter<u64, ManualClock>> = Arc::new(
            KeyedBuilder::new(q).capacity(4_096).when_full(policy).build_with_clock(clock.clone()).unwrap(),
        );
        let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        // Time moves with the work, not with the scheduler: every thread advances the clock
        // every 100 decisions, and thread 0 sweeps every 50,000, so that refills, evictions and
        // sweeps happen however the threads are scheduled.
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (l, admitted, clock) = (Arc::clone(&l), Arc::clone(&admitted), clock.clone());
                std::thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                    let mut refused = 0u64;
                    for i in 0..500_000u64 {
                        if i % 100 == 0 {
                            clock.advance(Duration::from_micros(5));
                        }
                        if t == 0 && i % 50_000 == 0 {
                            l.sweep();
                        }
                        // Skewed: half the traffic on 1/16 of the keys.
                        let r = xorshift(&mut rng);
                        let k = if r & 1 == 0 { (r >> 1) % (KEYS / 16) } else { (r >> 1) % KEYS };
                        let d = l.check_n(&k, 1 + (r >> 40) % 2);
                        if d.is_allowed() {
                            admitted[k as usize].fetch_add(1 + (r >> 40) % 2, Relaxed);
                        } else if d.outcome() == Outcome::TableFull {
                            refused += 1;
                        }
                    }
                    refused
                })
            })
            .collect();
        let refused: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let elapsed = clock.now().as_u64();
        let bound = 4 + elapsed / 100_000;
        for (k, a) in admitted.iter().enumerate() {
            assert!(a.load(Relaxed) <= bound, "{policy:?}: key {k} admitted {} > {bound}", a.load(Relaxed));
        }
        let s = l.stats();
        assert!(s.live <= s.slots);
        assert!(s.evictions > 0, "{policy:?}: {s:?}");
        if policy == WhenFull::EvictFullest {
            assert!(s.forced_evictions > 0 || refused == 0, "{s:?}");
        }
    }
}
