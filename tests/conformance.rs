//! Vectors from `REFERENCE.md` that a token bucket must reproduce: Envoy's token bucket and
//! governor's `per_second(5)` (GCRA with τ = T·(burst − 1) is this bucket, §1.5).

use std::time::Duration;

use tollgate::{Limiter, ManualClock, Nanos, Outcome, Quota};

const MS: u64 = 1_000_000;

/// Envoy `max_tokens=10, tokens_per_fill=1, fill_interval=1s`: 10 pass at t = 0, the 11th is
/// rejected; at 0.5 s still rejected; at 1.0 s one passes.
#[test]
fn envoy_ten_token_example() {
    let q = Quota::envoy(10, 1, Duration::from_secs(1)).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    for _ in 0..10 {
        assert!(l.check_at(Nanos::ZERO).is_allowed());
    }
    assert!(!l.check_at(Nanos::ZERO).is_allowed());
    assert!(!l.check_at(Nanos::new(500 * MS)).is_allowed());
    assert!(l.check_at(Nanos::new(1_000 * MS)).is_allowed());
    assert!(!l.check_at(Nanos::new(1_000 * MS)).is_allowed());
}

/// Envoy `tokens_per_fill=10, fill_interval=10s` refills continuously, 1 per second (the
/// current engine), not 10 at once every 10 s (the legacy timer).
#[test]
fn envoy_refill_is_continuous() {
    let q = Quota::envoy(10, 10, Duration::from_secs(10)).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    assert!(l.check_n_at(Nanos::ZERO, 10).is_allowed());
    assert!(!l.check_at(Nanos::new(999 * MS)).is_allowed());
    assert!(l.check_at(Nanos::new(1_000 * MS)).is_allowed());
}

/// governor `Quota::per_second(5)`: T = 200 ms, burst 5.
#[test]
fn governor_per_second_five() {
    let q = Quota::per_second(5).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    for i in 0..5 {
        let d = l.check_at(Nanos::ZERO);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 4 - i);
    }
    // The sixth is denied; the earliest it conforms is 200 ms.
    let d = l.check_at(Nanos::ZERO);
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
    assert_eq!(d.reset_after(), Duration::from_millis(1_000));
    // At 2000 ms, exactly 5 more (pre-0.8 governor gave 6, governor#249).
    let at = Nanos::new(2_000 * MS);
    assert_eq!((0..10).filter(|_| l.check_at(at).is_allowed()).count(), 5);
    // check_n(6) exceeds the burst: never, and nothing taken.
    let fresh = Limiter::with_clock(q, ManualClock::new());
    let d = fresh.check_n_at(Nanos::ZERO, 6);
    assert_eq!((d.outcome(), d.retry_after(), d.remaining()), (Outcome::Insufficient, None, 5));
    // check_n(5) on a fresh bucket is allowed, and it is then empty for one full period.
    let d = fresh.check_n_at(Nanos::ZERO, 5);
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.reset_after()), (0, Duration::from_secs(1)));
}

/// A bucket may start partly filled (Envoy starts full; that is the default).
#[test]
fn initial_level() {
    let q = Quota::per_second(10).unwrap().with_initial(3).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    assert_eq!(l.peek_at(Nanos::ZERO).remaining(), 3);
    assert!(l.check_n_at(Nanos::ZERO, 3).is_allowed());
    assert!(!l.check_at(Nanos::ZERO).is_allowed());
    assert_eq!(l.peek_at(Nanos::new(700 * MS)).remaining(), 7);
}
