//! Multi-thread conservation: threads hammer one bucket on a fixed simulated schedule and are
//! never jointly granted more than the quota, and no taken token is lost.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use common::model::refill_bound;
use tollgate::{Limiter, ManualClock, Nanos, Rate, TokenBucket};

const THREADS: usize = 4;

/// Phases at a frozen instant: exactly the bucket's level is granted, however the threads
/// interleave, so no CAS lost an update and none granted twice.
#[test]
fn frozen_time_grants_exactly_the_level() {
    let q = TokenBucket::new(Rate::per_second(1000), 5_000).unwrap();
    let limiter = Limiter::with_clock(q, ManualClock::new());
    let barrier = Barrier::new(THREADS);
    for phase in 0..20u64 {
        // Each phase starts 1.7 s after the previous: 1,700 tokens refill, capped at 5,000.
        let now = Nanos::new(phase * 1_700_000_000);
        let level = limiter.peek_n_at(now, 0).remaining();
        let granted = AtomicU64::new(0);
        thread::scope(|s| {
            for i in 0..THREADS as u64 {
                let (limiter, barrier, granted) = (&limiter, &barrier, &granted);
                s.spawn(move || {
                    barrier.wait();
                    let mut mine = 0;
                    for k in 0..4_000u64 {
                        let n = 1 + (k + i) % 3;
                        if limiter.check_n_at(now, n).is_allowed() {
                            mine += n;
                        }
                    }
                    granted.fetch_add(mine, Relaxed);
                });
            }
        });
        let left = limiter.peek_n_at(now, 0).remaining();
        assert_eq!(granted.load(Relaxed) + left, level, "phase {phase}");
        assert!(left < 3, "phase {phase}: {left} tokens left after 48,000 attempts");
    }
}

/// Threads on a shared simulated clock that moves forward as they go: the total granted over
/// the whole run never exceeds `burst + floor(rate·span)`.
#[test]
fn moving_time_never_exceeds_the_bound() {
    for (rate, burst) in [
        (Rate::per_second(1_000_000), 64u64),
        (Rate::per(7, Duration::from_nanos(3)), 1_000),
        (Rate::per_second(3), 1),
    ] {
        let q = TokenBucket::new(rate, burst).unwrap();
        let limiter = Limiter::with_clock(q, ManualClock::new());
        let clock = AtomicU64::new(0);
        let granted = AtomicU64::new(0);
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for i in 0..THREADS as u64 {
                let (limiter, clock, granted, barrier) = (&limiter, &clock, &granted, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut mine = 0;
                    for k in 0..200_000u64 {
                        // The schedule: every op moves the shared clock by 0–3 ns; a thread may
                        // decide on a reading that another thread has already passed.
                        let now = clock.fetch_add((k ^ i) % 4, Relaxed);
                        let n = 1 + (k % 2);
                        if limiter.check_n_at(Nanos::new(now), n).is_allowed() {
                            mine += n;
                        }
                    }
                    granted.fetch_add(mine, Relaxed);
                });
            }
        });
        let span = clock.load(Relaxed);
        let bound = u128::from(burst) + refill_bound(&q, span);
        let got = u128::from(granted.load(Relaxed));
        assert!(got <= bound, "{rate:?}: granted {got} over {span} ns, bound {bound}");
    }
}
