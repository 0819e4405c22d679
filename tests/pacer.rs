//! The pacer's schedule: exact intervals (never faster than the rate), distinct slots across
//! threads, the mean of random arrivals, no catch-up burst after a rate change, typed errors.
//! Deterministic (`next_slot` on a manual clock) except one real-clock check of `next`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Arrivals, Clock, ConfigError, ManualClock, Nanos, Pacer, Rate, TscClock};

#[test]
fn even_slots_are_exact_and_never_early() {
    let p = Pacer::with_clock(Rate::per_second(3), ManualClock::new()).unwrap();
    let slots: Vec<u64> = (0..7).map(|_| p.next_slot().as_u64()).collect();
    // 333,333,333.3 ns apart, rounded up in sixteenths: slot 3 is exactly 1 s, never before.
    assert_eq!(slots[0], 0);
    assert_eq!(slots[3], 1_000_000_000);
    assert_eq!(slots[6], 2_000_000_000);
    assert!(slots.windows(2).all(|w| w[1] - w[0] >= 333_333_333));
    let p = Pacer::with_clock(Rate::per_second(1_000_000), ManualClock::new()).unwrap();
    let last = (0..1_000_001).map(|_| p.next_slot()).last().unwrap();
    assert_eq!(last, Nanos::new(1_000_000_000));
}

#[test]
fn threads_share_one_schedule() {
    let p = Arc::new(Pacer::with_clock(Rate::per_second(1_000_000), ManualClock::new()).unwrap());
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || (0..50_000).map(|_| p.next_slot().as_u64()).collect::<Vec<_>>())
        })
        .collect();
    let all: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), 100_000, "two callers got one slot");
    assert_eq!(*all.iter().max().unwrap(), 99_999 * 1_000);
}

#[test]
fn random_arrivals_keep_the_mean_rate() {
    for arrivals in [Arrivals::Uniform, Arrivals::Poisson] {
        let p = Pacer::with_clock(Rate::per_second(1_000_000), ManualClock::new())
            .unwrap()
            .with_arrivals(arrivals);
        let n = 200_000;
        let last = (0..=n).map(|_| p.next_slot().as_u64()).last().unwrap();
        let mean = last as f64 / n as f64;
        // The mean of 200,000 draws is within 1% of 1,000 ns (over 4 standard deviations).
        assert!((mean - 1_000.0).abs() < 10.0, "{arrivals:?}: mean interval {mean} ns");
    }
}

#[test]
fn a_rate_change_sends_no_catch_up_burst() {
    let clock = ManualClock::new();
    let p = Pacer::with_clock(Rate::per(1, Duration::from_millis(1)), clock.clone()).unwrap();
    for _ in 0..10 {
        let _ = p.next_slot();
    }
    // The generator stalled: at 100 ms the schedule is 90 ms behind. A rate change resumes it
    // from now instead of sending the 90 missed slots at once.
    clock.set(Nanos::new(100_000_000));
    p.set_rate(Rate::per(2, Duration::from_millis(1))).unwrap();
    assert_eq!(p.next_slot(), Nanos::new(100_000_000));
    assert_eq!(p.next_slot(), Nanos::new(100_500_000));
    assert_eq!(p.interval(), Duration::from_micros(500));
}

/// The origin is the first slot, the clock's reading at construction, and stays put when a
/// rate change resumes the schedule later.
#[test]
fn the_origin_is_the_first_slot_and_never_moves() {
    let clock = ManualClock::new();
    clock.set(Nanos::new(7_000));
    let p = Pacer::with_clock(Rate::per(1, Duration::from_micros(1)), clock.clone()).unwrap();
    assert_eq!(p.origin(), Nanos::new(7_000));
    assert_eq!(p.next_slot(), p.origin());
    assert_eq!(p.next_slot(), Nanos::new(8_000));
    clock.set(Nanos::new(50_000));
    p.set_rate(Rate::per(1, Duration::from_micros(2))).unwrap();
    assert_eq!(p.next_slot(), Nanos::new(50_000));
    assert_eq!(p.origin(), Nanos::new(7_000), "a rate change resumes the schedule, not its origin");
    assert!(format!("{p:?}").contains("origin"));
}

#[test]
fn bad_rates_are_typed_errors() {
    let c = ManualClock::new();
    assert_eq!(Pacer::with_clock(Rate::per_second(0), c.clone()).unwrap_err(), ConfigError::ZeroRate);
    assert_eq!(
        Pacer::with_clock(Rate::per(1, Duration::ZERO), c.clone()).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert!(matches!(
        Pacer::with_clock(Rate::per(1_000, Duration::from_nanos(1)), c.clone()),
        Err(ConfigError::RateTooHigh { .. })
    ));
    let e = Pacer::with_clock(Rate::per(1, Duration::from_secs(86_400)), c).unwrap_err();
    assert!(matches!(e, ConfigError::IntervalTooLong { .. }), "{e:?}");
    assert!(e.to_string().contains("86400000000000 ns"), "{e}");
}

/// `next` returns the intended time, and not before it. Correctness only: its precision is a
/// benchmark figure.
#[test]
fn next_returns_at_or_after_the_intended_time() {
    let clock = TscClock::new();
    let p = Pacer::with_clock(Rate::per_second(2_000), clock.clone()).unwrap();
    let mut last = None;
    for _ in 0..5 {
        let due = p.next();
        assert!(clock.now() >= due);
        if let Some(prev) = last {
            assert_eq!(due.as_u64() - prev, 500_000);
        }
        last = Some(due.as_u64());
    }
}
