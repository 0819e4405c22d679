//! Fixed window: boundary behaviour, limits, and the engine against an exact model.

mod common;

use std::time::Duration;

use common::window_model::{answer, FixedWindowModel};
use proptest::prelude::*;
use tollgate::{ConfigError, FixedWindow, FixedWindowLimiter, ManualClock, Nanos, Outcome};

const S: u64 = 1_000_000_000;

/// The documented weakness: `2·limit` can pass within a few nanoseconds across a boundary.
#[test]
fn boundary_burst_is_two_limits() {
    let l = FixedWindowLimiter::with_clock(
        FixedWindow::new(100, Duration::from_secs(60)).unwrap(),
        ManualClock::new(),
    );
    let just_before = Nanos::new(60 * S - 1);
    assert!(l.check_n_at(just_before, 100).is_allowed());
    assert!(!l.check_at(just_before).is_allowed());
    assert!(l.check_n_at(Nanos::new(60 * S), 100).is_allowed());
}

#[test]
fn fields() {
    let l = FixedWindowLimiter::with_clock(
        FixedWindow::new(3, Duration::from_secs(10)).unwrap(),
        ManualClock::new(),
    );
    let d = l.check_n_at(Nanos::new(4 * S), 2);
    assert_eq!((d.outcome(), d.remaining(), d.reset_after()), (Outcome::Allowed, 1, Duration::from_secs(6)));
    let d = l.check_n_at(Nanos::new(5 * S), 2);
    assert_eq!(
        (d.outcome(), d.remaining(), d.retry_after()),
        (Outcome::Denied, 1, Some(Duration::from_secs(5)))
    );
    assert_eq!(l.check_n_at(Nanos::new(5 * S), 4).outcome(), Outcome::Insufficient);
    assert_eq!(l.check_n_at(Nanos::new(10 * S), 3).remaining(), 0);
}

#[test]
fn limits() {
    assert_eq!(
        FixedWindow::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroLimit { algorithm: "fixed window" })
    );
    let zero = FixedWindow::new(0, Duration::from_secs(1)).unwrap_err().to_string();
    assert!(zero.contains("fixed window limit of 0") && !zero.contains("burst"), "{zero}");
    assert_eq!(
        FixedWindow::new(1, Duration::ZERO),
        Err(ConfigError::ZeroWindow { algorithm: "fixed window" })
    );
    assert!(FixedWindow::new(FixedWindow::MAX_LIMIT, Duration::from_nanos(1 << 62)).is_ok());
    // Above 2^24 − 1, a window of a second or more, up to 2^32 − 1.
    assert!(FixedWindow::new(FixedWindow::MAX_LIMIT + 1, Duration::from_secs(1)).is_ok());
    assert!(FixedWindow::new(FixedWindow::MAX_LONG_LIMIT, Duration::from_secs(86_400)).is_ok());
    assert!(matches!(
        FixedWindow::new(FixedWindow::MAX_LONG_LIMIT + 1, Duration::from_secs(1)),
        Err(ConfigError::LimitTooLarge { algorithm: "fixed window", max: FixedWindow::MAX_LONG_LIMIT, .. })
    ));
    let short = FixedWindow::new(FixedWindow::MAX_LIMIT + 1, Duration::from_millis(999));
    assert_eq!(
        short,
        Err(ConfigError::WindowTooShortForLimit {
            limit: FixedWindow::MAX_LIMIT + 1,
            window_nanos: 999_000_000,
            min_nanos: 1_000_000_000,
            max_short: FixedWindow::MAX_LIMIT
        })
    );
    let message = short.unwrap_err().to_string();
    assert!(message.contains("16777216") && message.contains("16777215"), "{message}");
    // The count's width cannot change at runtime.
    let l = FixedWindowLimiter::with_clock(
        FixedWindow::new(10, Duration::from_secs(1)).unwrap(),
        ManualClock::new(),
    );
    assert!(l.set_policy(FixedWindow::new(FixedWindow::MAX_LIMIT, Duration::from_secs(1)).unwrap()).is_ok());
    assert!(l
        .set_policy(FixedWindow::new(FixedWindow::MAX_LIMIT + 1, Duration::from_secs(1)).unwrap())
        .is_err());
    assert!(matches!(
        FixedWindow::new(1, Duration::from_nanos((1 << 62) + 1)),
        Err(ConfigError::WindowTooLong { algorithm: "fixed window", .. })
    ));
}

/// After 2^40 − 2 windows the index saturates: the last window never ends, nothing resets.
#[test]
fn lifetime_saturation() {
    let l = FixedWindowLimiter::with_clock(
        FixedWindow::new(1, Duration::from_nanos(1)).unwrap(),
        ManualClock::new(),
    );
    let late = Nanos::new(1 << 41);
    assert!(l.check_at(late).is_allowed());
    assert!(!l.check_at(Nanos::new(1 << 42)).is_allowed());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn engine_matches_model(
        limit in prop_oneof![
            1u64..=5,
            1u64..=FixedWindow::MAX_LIMIT,
            (FixedWindow::MAX_LIMIT - 3)..=(FixedWindow::MAX_LIMIT + 3),
            FixedWindow::MAX_LIMIT..=FixedWindow::MAX_LONG_LIMIT,
        ],
        window in prop_oneof![1u64..=1_000, 1u64..=10 * S, 1u64..=1 << 62],
        ops in prop::collection::vec((prop_oneof![Just(0u64), 0u64..2_000, 0u64..20 * S, any::<u64>()], any::<bool>(), prop_oneof![0u64..=3, any::<u64>()]), 1..100),
        charging in any::<bool>(),
    ) {
        // A limit above 2^24 − 1 takes a window of a second or more.
        let window = if limit > FixedWindow::MAX_LIMIT { window.max(S) } else { window };
        let q = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
        let (q, mut model) = if charging {
            (q.charging_refusals(), FixedWindowModel::charging(limit, window))
        } else {
            (q, FixedWindowModel::new(limit, window))
        };
        let l = FixedWindowLimiter::with_clock(q, ManualClock::new());
        let mut now = 0u64;
        for (step, back, n) in ops {
            now = if back { now.saturating_sub(step) } else { now.saturating_add(step) };
            let got = answer(&l.check_n_at(Nanos::new(now), n));
            prop_assert_eq!(got, model.check_n(now, n), "n = {} at {} ns", n, now);
        }
    }
}
