//! Vectors from `REFERENCE.md` that a token bucket must reproduce: Envoy's token bucket and
//! governor's `per_second(5)` (GCRA with τ = T·(burst − 1) is this bucket, §1.5).

use std::time::Duration;

use tollgate::{Limiter, ManualClock, Nanos, Outcome, TokenBucket};

const MS: u64 = 1_000_000;

/// Envoy `max_tokens=10, tokens_per_fill=1, fill_interval=1s`: 10 pass at t = 0, the 11th is
/// rejected; at 0.5 s still rejected; at 1.0 s one passes.
#[test]
fn envoy_ten_token_example() {
    let q = TokenBucket::envoy(10, 1, Duration::from_secs(1)).unwrap();
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
    let q = TokenBucket::envoy(10, 10, Duration::from_secs(10)).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    assert!(l.check_n_at(Nanos::ZERO, 10).is_allowed());
    assert!(!l.check_at(Nanos::new(999 * MS)).is_allowed());
    assert!(l.check_at(Nanos::new(1_000 * MS)).is_allowed());
}

/// governor `Quota::per_second(5)`: T = 200 ms, burst 5.
#[test]
fn governor_per_second_five() {
    let q = TokenBucket::per_second(5).unwrap();
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
    let q = TokenBucket::per_second(10).unwrap().with_initial(3).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    assert_eq!(l.peek_at(Nanos::ZERO).remaining(), 3);
    assert!(l.check_n_at(Nanos::ZERO, 3).is_allowed());
    assert!(!l.check_at(Nanos::ZERO).is_allowed());
    assert_eq!(l.peek_at(Nanos::new(700 * MS)).remaining(), 7);
}

/// redis-cell's README: `CL.THROTTLE user123 15 30 60` on a fresh key → 0, 16, 15, -1, 2.
#[test]
fn redis_cell_readme_vector() {
    let q = TokenBucket::redis_cell(15, 30, Duration::from_secs(60)).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    let reply = l.check_at(Nanos::ZERO).cl_throttle(&q);
    assert_eq!(
        reply,
        tollgate::ClThrottle { limited: 0, limit: 16, remaining: 15, retry_after: -1, reset_after: 2 }
    );
}

/// The same key drained at t = 0, then the algorithm of §1.2 step by step: T = 2 s, DVT = 32 s.
#[test]
fn redis_cell_drained_and_refilling() {
    let q = TokenBucket::redis_cell(15, 30, Duration::from_secs(60)).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    for i in 0..16u64 {
        let r = l.check_at(Nanos::ZERO).cl_throttle(&q);
        assert_eq!((r.limited, r.remaining, r.reset_after), (0, 15 - i, 2 * (i as i64 + 1)));
    }
    // The 17th: limited; TAT = 32 s, allow_at = TAT + T − DVT = 2 s; nothing written.
    let r = l.check_at(Nanos::ZERO).cl_throttle(&q);
    assert_eq!(
        r,
        tollgate::ClThrottle { limited: 1, limit: 16, remaining: 0, retry_after: 2, reset_after: 32 }
    );
    // 1.5 s later: retry in 0.5 s, which redis-cell reports as 1 (remainder ≥ 1 ms).
    let r = l.check_at(Nanos::new(1_500 * MS)).cl_throttle(&q);
    assert_eq!((r.limited, r.retry_after, r.reset_after), (1, 1, 31));
    // 0.9995 ms short of the slot: the sub-millisecond remainder truncates to 0 s.
    let r = l.check_at(Nanos::new(2_000 * MS - 999_500)).cl_throttle(&q);
    assert_eq!((r.limited, r.retry_after), (1, 0));
    // At 2 s, one cell.
    assert_eq!(l.check_at(Nanos::new(2_000 * MS)).cl_throttle(&q).limited, 0);
    // A quantity above the limit can never fit: limited, retry −1, nothing taken.
    let r = l.check_n_at(Nanos::new(2_000 * MS), 17).cl_throttle(&q);
    assert_eq!((r.limited, r.retry_after, r.remaining), (1, -1, 0));
}

/// governor's `Quota::per_second(5)` as GCRA parameters: T = 200 ms, burst 5.
#[test]
fn gcra_constructor_matches_governor() {
    let q = TokenBucket::gcra(Duration::from_millis(200), 5).unwrap();
    let l = Limiter::with_clock(q, ManualClock::new());
    assert_eq!((0..6).filter(|_| l.check_at(Nanos::ZERO).is_allowed()).count(), 5);
    assert_eq!(l.check_at(Nanos::ZERO).retry_after(), Some(Duration::from_millis(200)));
    assert!(l.check_at(Nanos::new(200 * MS)).is_allowed());
}
