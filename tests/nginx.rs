//! nginx `limit_req`: the conformance tables of `REFERENCE.md` §1.3, and the engine against an
//! exact model of the module's algorithm under random arrivals.

mod common;

use std::time::Duration;

use common::nginx_model::NginxModel;
use proptest::prelude::*;
use tollgate::{ManualClock, Nanos, Nginx, NginxLimiter, Outcome};

const MS: u64 = 1_000_000;

fn seven_at_zero(q: Nginx) -> Vec<(Outcome, Duration)> {
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    (0..7).map(|_| l.check_at(Nanos::ZERO)).map(|d| (d.outcome(), d.delay())).collect()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn burst_delays_then_rejects() {
    use Outcome::*;
    let q = Nginx::per_second(1).unwrap().burst(5).unwrap();
    let want = [
        (Allowed, secs(0)),
        (Delayed, secs(1)),
        (Delayed, secs(2)),
        (Delayed, secs(3)),
        (Delayed, secs(4)),
        (Delayed, secs(5)),
        (Denied, secs(0)),
    ];
    assert_eq!(seven_at_zero(q), want);
}

#[test]
fn burst_nodelay_passes_then_rejects_and_frees_one_slot_per_second() {
    use Outcome::*;
    let q = Nginx::per_second(1).unwrap().burst(5).unwrap().nodelay();
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    let got: Vec<_> = (0..7).map(|_| l.check_at(Nanos::ZERO).outcome()).collect();
    assert_eq!(got, [Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Denied]);
    // The rejection says when a slot frees: 1 s.
    assert_eq!(l.check_at(Nanos::ZERO).retry_after(), Some(secs(1)));
    assert_eq!(l.check_at(Nanos::new(999 * MS)).outcome(), Denied);
    assert_eq!(l.check_at(Nanos::new(1_000 * MS)).outcome(), Allowed);
    assert_eq!(l.check_at(Nanos::new(1_000 * MS)).outcome(), Denied);
    assert_eq!(l.check_at(Nanos::new(2_000 * MS)).outcome(), Allowed);
}

#[test]
fn burst_with_delay_three() {
    use Outcome::*;
    let q = Nginx::per_second(1).unwrap().burst(5).unwrap().delay(3);
    let want = [
        (Allowed, secs(0)),
        (Allowed, secs(0)),
        (Allowed, secs(0)),
        (Allowed, secs(0)),
        (Delayed, secs(1)),
        (Delayed, secs(2)),
        (Denied, secs(0)),
    ];
    assert_eq!(seven_at_zero(q), want);
}

/// `rate=10r/s` with no burst: 10 ms later the excess is 900 > 0 (rejected); 100 ms later it is 0.
#[test]
fn ten_per_second_without_burst() {
    let q = Nginx::per_second(10).unwrap();
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    assert_eq!(l.check_at(Nanos::ZERO).outcome(), Outcome::Allowed);
    let d = l.check_at(Nanos::new(10 * MS));
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(90)));
    assert_eq!(l.check_at(Nanos::new(100 * MS)).outcome(), Outcome::Allowed);
}

/// `30r/m` is nginx's way to say 0.5 r/s: rate 500 milli-requests per second.
#[test]
fn per_minute_rates() {
    let q = Nginx::per_minute(30).unwrap();
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    assert!(l.check_at(Nanos::ZERO).is_allowed());
    assert!(!l.check_at(Nanos::new(1_999 * MS)).is_allowed());
    assert!(l.check_at(Nanos::new(2_000 * MS)).is_allowed());
}

/// Several arrivals at once: all or none; a new node's first is free; zero stores nothing; more
/// than `burst + 1` can never pass.
#[test]
fn several_at_once() {
    let q = Nginx::per_second(1).unwrap().burst(3).unwrap().nodelay();
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    assert_eq!(l.check_n_at(Nanos::ZERO, 5).outcome(), Outcome::Insufficient);
    assert_eq!(l.check_n_at(Nanos::ZERO, 0).remaining(), 3);
    assert!(l.check_n_at(Nanos::ZERO, 4).is_allowed()); // 1 free + 3 of burst
    assert_eq!(l.check_n_at(Nanos::ZERO, 1).outcome(), Outcome::Denied);
    let d = l.check_n_at(Nanos::new(2_000 * MS), 3);
    assert_eq!((d.outcome(), d.retry_after()), (Outcome::Denied, Some(secs(1))));
    assert!(l.check_n_at(Nanos::new(2_000 * MS), 2).is_allowed());
}

#[test]
fn configuration_errors_are_typed() {
    assert_eq!(Nginx::per_second(0), Err(tollgate::ConfigError::ZeroRate));
    assert!(Nginx::per_second(1).unwrap().burst(16_776).is_ok());
    assert!(matches!(
        Nginx::per_second(1).unwrap().burst(16_777),
        Err(tollgate::ConfigError::NginxBurstTooLarge { burst: 16_777, max: 16_776 })
    ));
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Back(u64),
    Check,
    CheckN(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn engine_matches_nginx_model(
        rate in prop_oneof![1u64..=20, 1u64..=100_000],
        per_minute in any::<bool>(),
        burst in prop_oneof![Just(0u64), 0u64..=10, 0u64..=16_776],
        delay in prop_oneof![Just(None), (0u64..=12).prop_map(Some)],
        ops in prop::collection::vec(prop_oneof![
            3 => prop_oneof![0u64..2 * MS, 0u64..2_000 * MS, 0u64..(1 << 50)].prop_map(Op::Advance),
            1 => prop_oneof![0u64..100 * MS, 0u64..(1 << 40)].prop_map(Op::Back),
            6 => Just(Op::Check),
            1 => prop_oneof![0u64..=3, 0u64..=20_000].prop_map(Op::CheckN),
        ], 1..150),
    ) {
        let base = if per_minute { Nginx::per_minute(rate) } else { Nginx::per_second(rate) }.unwrap();
        let mut q = base.burst(burst).unwrap();
        if let Some(d) = delay { q = q.delay(d) } else { q = q.nodelay() }
        let l = NginxLimiter::with_clock(q, ManualClock::new());
        let mut model = NginxModel::new(rate, if per_minute { 60 } else { 1 }, burst, delay);
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Advance(by) => now = now.saturating_add(by),
                Op::Back(by) => now = now.saturating_sub(by),
                Op::Check | Op::CheckN(_) => {
                    let n = if let Op::CheckN(n) = op { n } else { 1 };
                    let d = l.check_n_at(Nanos::new(now), n);
                    let wait = match d.outcome() { Outcome::Denied => d.retry_after().unwrap(), _ => d.delay() };
                    let got = (d.outcome(), d.remaining(), u64::try_from(wait.as_millis()).unwrap(), u64::try_from(d.reset_after().as_millis()).unwrap());
                    prop_assert_eq!(got, model.check_n(now, n), "n = {} at {} ns", n, now);
                }
            }
        }
    }
}

/// nginx's clock-wrap rule: a `now` more than 60 s behind `last` counts as 1 ms elapsed; up to
/// 60 s behind counts as 0.
#[test]
fn backwards_clock_rule_boundary() {
    let q = Nginx::per_second(1_000).unwrap(); // 1 request per ms, no burst
    let at = |ms: u64| Nanos::new(ms * MS);
    let l = NginxLimiter::with_clock(q, ManualClock::new());
    assert!(l.check_at(at(100_000)).is_allowed());
    assert_eq!(l.check_at(at(100_000 - 60_000)).outcome(), Outcome::Denied); // 0 ms: excess 1000
    assert_eq!(l.check_at(at(100_000 - 60_001)).outcome(), Outcome::Allowed); // 1 ms: excess 0
    let mut model = NginxModel::new(1_000, 1, 0, Some(0));
    assert_eq!(model.check(100_000 * MS).0, Outcome::Allowed);
    assert_eq!(model.check(40_000 * MS).0, Outcome::Denied);
    assert_eq!(model.check(39_999 * MS).0, Outcome::Allowed);
}
