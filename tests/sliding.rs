//! Sliding-window counter: no boundary burst, limits, and the engine against an exact model whose
//! waits come from a search instead of the engine's closed form.

mod common;

use std::time::Duration;

use common::window_model::{answer, SlidingWindowModel};
use proptest::prelude::*;
use tollgate::{ConfigError, ManualClock, Nanos, Outcome, SlidingWindow, SlidingWindowLimiter};

const S: u64 = 1_000_000_000;

/// Where a fixed window lets `2·limit` through around a boundary, the sliding window lets
/// through at most `limit` in any window-long span of this pattern.
#[test]
fn no_boundary_burst() {
    let l = SlidingWindowLimiter::with_clock(
        SlidingWindow::new(100, Duration::from_secs(60)).unwrap(),
        ManualClock::new(),
    );
    assert!(l.check_n_at(Nanos::new(60 * S - 1), 100).is_allowed());
    let at_boundary = l.check_at(Nanos::new(60 * S));
    assert_eq!(at_boundary.outcome(), Outcome::Denied);
    // One slot frees when 1/100 of the previous window has slid out: 0.6 s.
    assert_eq!(at_boundary.retry_after(), Some(Duration::from_millis(600)));
    assert!(l.check_at(Nanos::new(60 * S + 600_000_000)).is_allowed());
    assert!(!l.check_at(Nanos::new(60 * S + 600_000_000)).is_allowed());
}

#[test]
fn limits() {
    assert_eq!(
        SlidingWindow::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroLimit { algorithm: "sliding window" })
    );
    assert_eq!(
        SlidingWindow::new(1, Duration::ZERO),
        Err(ConfigError::ZeroWindow { algorithm: "sliding window" })
    );
    assert!(SlidingWindow::new(2_047, Duration::from_millis(1)).is_ok());
    assert!(matches!(
        SlidingWindow::new(2_048, Duration::from_millis(1)),
        Err(ConfigError::WindowTooShort { .. })
    ));
    assert!(SlidingWindow::new(65_535, Duration::from_secs(1)).is_ok());
    assert!(SlidingWindow::new(SlidingWindow::MAX_LIMIT, Duration::from_secs(200)).is_ok());
    assert!(matches!(
        SlidingWindow::new(SlidingWindow::MAX_LIMIT + 1, Duration::from_secs(60)),
        Err(ConfigError::LimitTooLarge { algorithm: "sliding window", .. })
    ));
    let e = SlidingWindow::new(2_048, Duration::from_millis(1)).unwrap_err().to_string();
    assert!(e.contains("2048") && e.contains("100 years"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn engine_matches_model(
        limit in prop_oneof![1u64..=5, 1u64..=2_047],
        window in prop_oneof![1_000_000u64..=2_000_000, 1_000_000u64..=100 * S],
        ops in prop::collection::vec((prop_oneof![Just(0u64), 0u64..3_000_000, 0u64..200 * S], any::<bool>(), prop_oneof![0u64..=3, 0u64..=3_000]), 1..100),
    ) {
        let q = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
        let l = SlidingWindowLimiter::with_clock(q, ManualClock::new());
        let mut model = SlidingWindowModel::new(limit, window);
        let mut now = 0u64;
        for (step, back, n) in ops {
            now = if back { now.saturating_sub(step) } else { now.saturating_add(step) };
            let got = answer(&l.check_n_at(Nanos::new(now), n));
            prop_assert_eq!(got, model.check_n(now, n), "n = {} at {} ns", n, now);
        }
    }

    /// Never over-admit against the sliding estimate's own promise: in any span of one window
    /// ending at a decision, at most `limit + prev-window weight` … stated exactly: after every
    /// admission the estimate is at most the limit.
    #[test]
    fn estimate_never_exceeds_the_limit(
        limit in 1u64..=50,
        ops in prop::collection::vec((0u64..3 * S, 1u64..=5), 1..200),
    ) {
        let w = 10 * S;
        let l = SlidingWindowLimiter::with_clock(SlidingWindow::new(limit, Duration::from_nanos(w)).unwrap(), ManualClock::new());
        let mut now = 0u64;
        // Admissions per window index, to recompute the estimate independently.
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for (step, n) in ops {
            now += step;
            if l.check_n_at(Nanos::new(now), n).is_allowed() {
                *per_window.entry(now / w).or_default() += n;
                let i = now / w;
                let (curr, prev) = (per_window.get(&i).copied().unwrap_or(0), if i == 0 { 0 } else { per_window.get(&(i - 1)).copied().unwrap_or(0) });
                let delta = now - i * w;
                prop_assert!(u128::from(prev) * u128::from(w - delta) + u128::from(curr) * u128::from(w) <= u128::from(limit) * u128::from(w));
            }
        }
    }
}

/// A limit raised at runtime lets the word hold counts up to the counts' width, and a decision
/// that read the change flag before the change decides them under the policy as built: its
/// fast admission test must not overflow there (found in review: 65,536 per day, built with
/// `3·limit·W < 2^64`, overflowed with `prev + curr ≈ 2^18`; without overflow checks the
/// wrapped sum admitted).
#[test]
fn the_built_policy_decides_counts_up_to_the_width() {
    use tollgate::Policy;
    let day = Duration::from_secs(86_400);
    let built = SlidingWindow::new(65_536, day).unwrap();
    let bits = 17; // the width of 65,536
    let (prev, curr) = (131_071u64, 131_070u64);
    // Window 1 (stored as 2), decided by a clock still in window 0: the general path, δ = 0.
    let word = (2u64 << (2 * bits)) | (curr << bits) | prev;
    for (e, n) in [(0u64, 1u64), (0, 65_536), (1, 1), (86_399_999_999_999, 1), (86_400_000_000_001, 1)] {
        let (next, d) = built.decide(word, Nanos::new(e), n);
        assert_eq!((next, d.outcome()), (None, Outcome::Denied), "at {e} for {n}");
    }
    // The limiter itself, raised to the width and back, never admits past either limit.
    let l = SlidingWindowLimiter::with_clock(built, tollgate::ManualClock::new());
    l.set_policy(SlidingWindow::new(131_071, day).unwrap()).unwrap();
    assert!(l.check_n_at(Nanos::new(86_399_999_999_999), 131_071).is_allowed());
    l.set_policy(built).unwrap();
    assert_eq!(l.check_n_at(Nanos::new(86_400_000_000_000), 1).outcome(), Outcome::Denied);
}
