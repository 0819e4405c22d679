//! Differential tests: the engine against the exact models in `common/model.rs`, under random
//! operation sequences and a clock that stands still, creeps, jumps by years and steps back.

mod common;

use std::time::Duration;

use common::model::{is_exact, refill_bound, Answer, Ideal, Model};
use proptest::prelude::*;
use tollgate::{Limiter, ManualClock, Nanos, Rate, TokenBucket};

#[derive(Clone, Debug)]
enum Op {
    /// Move the clock forward (0 ns up to years).
    Advance(u64),
    /// Move the clock back.
    Back(u64),
    Check,
    CheckN(u64),
    PeekN(u64),
}

fn span() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        6 => 0u64..1_000,
        6 => 0u64..10_000_000_000,
        2 => 0u64..(1u64 << 62),                                // up to 146 years
        1 => Just(u64::MAX),
    ]
}

fn ops(burst: u64) -> impl Strategy<Value = Vec<Op>> {
    let cost = prop_oneof![
        4 => 1..=burst,
        1 => Just(0u64),
        1 => (burst + 1)..=burst.saturating_add(3),
        1 => any::<u64>(),
    ];
    let op = prop_oneof![
        3 => span().prop_map(Op::Advance),
        1 => span().prop_map(Op::Back),
        4 => Just(Op::Check),
        4 => cost.clone().prop_map(Op::CheckN),
        2 => cost.prop_map(Op::PeekN),
    ];
    prop::collection::vec(op, 1..120)
}

/// Quotas across the supported ranges, biased towards small bursts (more boundary crossings),
/// and towards the rates users configure.
fn quota() -> impl Strategy<Value = TokenBucket> {
    let tokens = prop_oneof![1u64..=100, 1u64..=1 << 36, Just(12_500_000_000u64), Just(10_000_000_000)];
    let period = prop_oneof![
        Just(1_000_000_000u64),
        Just(60_000_000_000),
        Just(86_400_000_000_000),
        1u64..=1 << 20,
        1u64..=1 << 45,
    ];
    let burst = prop_oneof![1u64..=20, 1u64..=1 << 32];
    (tokens, period, burst, any::<u64>()).prop_filter_map("unsupported", |(tokens, period, burst, init)| {
        let q = TokenBucket::new(Rate::per(tokens, Duration::from_nanos(period)), burst).ok()?;
        let initial = if init % 3 == 0 { init % (burst + 1) } else { burst };
        q.with_initial(initial).ok()
    })
}

/// Quotas whose per-token time is exactly `t/m` ns.
fn exact_quota() -> impl Strategy<Value = TokenBucket> {
    (1u64..=64, 1u64..=1 << 40, 1u64..=1000, prop_oneof![1u64..=20, 1u64..=1 << 32]).prop_filter_map(
        "unsupported",
        |(m, t, a, burst)| {
            // Exact unless the fill time only fits at a coarser unit.
            TokenBucket::new(Rate::per(m * a, Duration::from_nanos(t * a)), burst).ok().filter(is_exact)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The engine agrees with the documented-semantics model on every field of every decision.
    #[test]
    fn engine_matches_model(q in quota(), start in any::<u64>(), ops in ops(20)) {
        let clock = ManualClock::new();
        clock.set(Nanos::new(start));
        let limiter = Limiter::with_clock(q, clock.clone());
        let mut model = Model::new(&q);
        let mut now = start;
        for op in ops {
            let elapsed = now.saturating_sub(start);
            let (got, want) = match op {
                Op::Advance(by) => { now = now.saturating_add(by); clock.set(Nanos::new(now)); continue }
                Op::Back(by) => { now = now.saturating_sub(by); clock.set(Nanos::new(now)); continue }
                Op::Check => (limiter.check(), model.decide(elapsed, 1, true)),
                Op::CheckN(n) => (limiter.check_n(n), model.decide(elapsed, n, true)),
                Op::PeekN(n) => (limiter.peek_n(n), model.decide(elapsed, n, false)),
            };
            prop_assert_eq!(Answer::of(&got), want, "at {} ns after start, quota {:?}", elapsed, q);
        }
    }

    /// A word kept elsewhere (`decide_stored`, `peek_stored`: a Redis key's) decides exactly as
    /// the limiter does, with the store doing what the limiter's CAS does: keep the next word.
    #[test]
    fn stored_words_decide_as_the_limiter(q in quota(), ops in ops(20)) {
        let q = q.with_initial(q.burst()).unwrap(); // an absent word is a full bucket
        let limiter = Limiter::with_clock(q, ManualClock::new());
        let mut word = 0u64;
        let mut now = 0u64;
        for op in ops {
            let clock = q.clock_units(Nanos::new(now));
            let (got, want) = match op {
                Op::Advance(by) => { now = now.saturating_add(by); continue }
                Op::Back(by) => { now = now.saturating_sub(by); continue }
                Op::Check | Op::CheckN(_) => {
                    let n = if let Op::CheckN(n) = op { n } else { 1 };
                    let (d, next) = q.decide_stored(word, clock, n).unwrap();
                    prop_assert_eq!(next.is_some(), d.is_allowed() && n != 0 && n <= q.burst());
                    word = next.unwrap_or(word);
                    (d, limiter.check_n_at(Nanos::new(now), n))
                }
                Op::PeekN(n) => (q.peek_stored(word, clock, n).unwrap(), limiter.peek_n_at(Nanos::new(now), n)),
            };
            prop_assert_eq!(got, want, "at {} ns, quota {:?}", now, q);
        }
        // A clock below the fill is no bucket clock: refused, not misread.
        let start = q.clock_offset_units();
        prop_assert!(q.decide_stored(0, start - 1, 1).is_none() && q.peek_stored(0, start - 1, 1).is_none());
        prop_assert!(q.decide_stored(u64::MAX, start, 1).is_some());
    }

    /// For quotas whose rate is exact in units, the engine decides as the textbook bucket at the
    /// configured rate, with no rounding at all.
    #[test]
    fn exact_quotas_match_the_ideal_bucket(q in exact_quota(), ops in ops(20)) {
        prop_assert!(is_exact(&q));
        let limiter = Limiter::with_clock(q, ManualClock::new());
        let mut ideal = Ideal::new(&q);
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Advance(by) => now = now.saturating_add(by).min(q.lifetime().as_u64()),
                Op::Back(_) => {} // the ideal bucket has no backwards clock
                Op::Check => prop_assert_eq!(limiter.check_at(Nanos::new(now)).is_allowed(), ideal.check_n(now, 1)),
                Op::CheckN(n) | Op::PeekN(n) => {
                    prop_assert_eq!(limiter.check_n_at(Nanos::new(now), n).is_allowed(), ideal.check_n(now, n));
                }
            }
        }
    }

    /// Never over-admit: starting from a full bucket, the engine admits at most
    /// `burst + floor(rate·span)` over any span, at the configured (unrounded) rate. Checked from
    /// every instant at which the bucket is full to every later decision.
    #[test]
    fn admits_at_most_burst_plus_rate_times_span(q in quota(), ops in ops(20)) {
        let limiter = Limiter::with_clock(q.with_initial(q.burst()).unwrap(), ManualClock::new());
        let mut now = 0u64;
        // (time, tokens admitted before this time) at each instant the bucket was full.
        let mut full_at: Vec<(u64, u128)> = vec![(0, 0)];
        let mut admitted: u128 = 0;
        for op in ops {
            let n = match op {
                Op::Advance(by) => { now = now.saturating_add(by).min(q.lifetime().as_u64()); continue }
                Op::Back(_) | Op::PeekN(_) => continue,
                Op::Check => 1,
                Op::CheckN(n) => n,
            };
            if limiter.peek_n_at(Nanos::new(now), 0).remaining() == q.burst() {
                full_at.push((now, admitted));
            }
            if limiter.check_n_at(Nanos::new(now), n).is_allowed() {
                admitted += u128::from(n);
            }
            for &(t0, before) in &full_at {
                let bound = u128::from(q.burst()) + refill_bound(&q, now - t0);
                prop_assert!(admitted - before <= bound, "admitted {} in [{}, {}] > {}", admitted - before, t0, now, bound);
            }
        }
    }
}
