//! The queued token bucket (issue 15): `QueuedLimiter` against the exact model
//! (`common/model.rs`, `Model::queue`) under random interleavings of checks, peeks, `check_all`
//! charges and refunds and clock moves; the admission bound with delayed admissions counted
//! when due; FIFO; parsing; and its runtime changes.

mod common;

use std::time::Duration;

use common::model::{is_exact, refill_bound, Answer, Model, ModelReservation};
use common::strategies::{exact_quota, quota};
use proptest::prelude::*;
use tollgate::{
    Admit, ConfigError, ManualClock, Nanos, Outcome, ParseError, Queued, QueuedLimiter, Receipt, TokenBucket,
    UpdateError,
};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Back(u64),
    CheckN(u64),
    PeekN(u64),
    Charge(u64),
    Refund(usize),
}

fn ops(burst: u64, forward_only: bool) -> impl Strategy<Value = Vec<Op>> {
    let cost = prop_oneof![6 => 1..=burst, 1 => Just(0u64), 1 => (burst + 1)..=burst.saturating_add(2)];
    let span = prop_oneof![3 => Just(0u64), 4 => 0u64..1_000, 4 => 0u64..3_000_000_000, 1 => 0u64..(1 << 50)];
    let back = if forward_only { 0 } else { 1 };
    let op = prop_oneof![
        3 => span.clone().prop_map(Op::Advance),
        back => span.prop_map(Op::Back),
        6 => cost.clone().prop_map(Op::CheckN),
        1 => cost.prop_map(Op::PeekN),
        2 => (1..=burst).prop_map(Op::Charge),
        1 => any::<usize>().prop_map(Op::Refund),
    ];
    prop::collection::vec(op, 1..80)
}

/// A bucket and a line, as tokens (`true`) or as a wait in ns.
fn queued(bucket: impl Strategy<Value = TokenBucket>) -> impl Strategy<Value = (Queued, u64)> {
    let bound = prop_oneof![
        (0u64..=64).prop_map(|n| (true, n)),
        prop_oneof![Just(0u64), 1u64..=1_000_000, 1u64..=100_000_000_000].prop_map(|ns| (false, ns)),
    ];
    (bucket, bound).prop_filter_map("a line too long", |(q, (tokens, v))| {
        let (queued, units) = if tokens {
            (Queued::with_max_queued(q, v), u128::from(v) * u128::from(q.units_per_token()))
        } else {
            (Queued::new(q, Duration::from_nanos(v)), u128::from(v) * u128::from(q.units_per_nano()))
        };
        Some((queued.ok()?, u64::try_from(units).ok()?))
    })
}

/// Runs `ops`, comparing every answer (and every delay) with the model. Returns the admissions
/// `(due, n)` not refunded, and whether due times were in admission order.
fn run(q: Queued, queue: u64, ops: &[Op]) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let l = QueuedLimiter::with_clock(q, ManualClock::new());
    let mut model = Model::new(&q.bucket());
    let mut now = 0u64;
    let mut uses: Vec<Option<(u64, u64)>> = Vec::new();
    let mut receipts: Vec<(Receipt, ModelReservation, usize)> = Vec::new();
    let mut last_due: Option<u64> = None;
    for op in ops {
        match *op {
            Op::Advance(d) => now = now.saturating_add(d),
            Op::Back(d) => {
                now = now.saturating_sub(d);
                last_due = None;
            }
            Op::CheckN(n) => {
                let d = l.check_n_at(Nanos::new(now), n);
                let (want, delay, _) = model.queue(now, n, queue, true);
                prop_assert_eq!(Answer::of(&d), want, "check_n({}) at {}", n, now);
                prop_assert_eq!(d.delay(), Duration::from_nanos(delay), "check_n({}) at {}", n, now);
                prop_assert_eq!(d.is_allowed_now(), d.outcome() == Outcome::Allowed);
                if d.is_allowed() && n > 0 && n <= q.bucket().burst() {
                    let due = now + delay;
                    if let Some(prev) = last_due {
                        prop_assert!(due >= prev, "FIFO: due at {} after one due at {}", due, prev);
                    }
                    last_due = Some(due);
                    uses.push(Some((due, n)));
                }
            }
            Op::PeekN(n) => {
                let d = l.peek_n_at(Nanos::new(now), n);
                let (want, delay, _) = model.queue(now, n, queue, false);
                prop_assert_eq!(Answer::of(&d), want, "peek_n({}) at {}", n, now);
                prop_assert_eq!(d.delay(), Duration::from_nanos(delay));
            }
            Op::Charge(n) => {
                l.clock().set(Nanos::new(now));
                let (d, receipt) = Admit::charge(&l, n);
                let (want, delay, taken) = model.queue(now, n, queue, true);
                prop_assert_eq!(Answer::of(&d), want, "charge({}) at {}", n, now);
                prop_assert_eq!(receipt.is_some(), taken.is_some());
                if let (Some(r), Some(m)) = (receipt, taken) {
                    uses.push(Some((now + delay, n)));
                    receipts.push((r, m, uses.len() - 1));
                }
            }
            Op::Refund(i) => {
                if receipts.is_empty() {
                    continue;
                }
                let (r, m, use_index) = receipts.remove(i % receipts.len());
                l.clock().set(Nanos::new(now));
                Admit::refund(&l, r);
                model.cancel(now, &m);
                uses[use_index] = None;
                last_due = None;
            }
        }
        let (want, delay, _) = model.queue(now, 1, queue, false);
        let state = l.peek_n_at(Nanos::new(now), 1);
        prop_assert_eq!(Answer::of(&state), want);
        prop_assert_eq!(state.delay(), Duration::from_nanos(delay));
    }
    Ok(uses.into_iter().flatten().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every answer equals the model's, under any interleaving, with the clock moving both ways.
    #[test]
    fn queued_matches_the_model((q, queue) in queued(quota()), ops in quota().prop_flat_map(|q| ops(q.burst(), false))) {
        run(q, queue, &ops)?;
    }

    /// Over any span, the tokens used (counted when due) are at most `burst + floor(rate·span)`,
    /// whatever was queued and refunded.
    #[test]
    fn queued_admissions_stay_within_the_bound((q, queue) in queued(exact_quota()), ops in (1u64..=8).prop_flat_map(|b| ops(b, true))) {
        prop_assert!(is_exact(&q.bucket()));
        let mut uses = run(q, queue, &ops)?;
        uses.sort_unstable();
        for i in 0..uses.len() {
            let mut sum = 0u128;
            for &(at, n) in &uses[i..] {
                sum += u128::from(n);
                let bound = u128::from(q.bucket().burst()) + refill_bound(&q.bucket(), at - uses[i].0);
                prop_assert!(sum <= bound, "{} tokens in [{}, {}] ns, bound {}", sum, uses[i].0, at, bound);
            }
        }
    }
}

/// nginx's `rate=10r/s burst=20` without `nodelay`, for the bucket: one now, then every request
/// spaced at the rate, at most 20 waiting; the 22nd is refused at once until the line moves.
#[test]
fn a_line_of_twenty_is_nginx_without_nodelay() {
    let l = QueuedLimiter::with_clock("10/s burst=1 queue=20".parse().unwrap(), ManualClock::new());
    assert_eq!(l.check().outcome(), Outcome::Allowed);
    for k in 1..=20u64 {
        let d = l.check();
        assert_eq!(d.outcome(), Outcome::Delayed, "request {k}");
        assert_eq!(d.delay(), Duration::from_millis(100 * k));
        assert!(d.is_allowed() && !d.is_allowed_now());
    }
    let full = l.check();
    assert_eq!(full.outcome(), Outcome::Denied);
    assert_eq!(full.retry_after(), Some(Duration::from_millis(100)));
    l.clock().advance(Duration::from_millis(100));
    assert_eq!(l.check().delay(), Duration::from_millis(2_000)); // the line moved by one
    assert_eq!(l.check().outcome(), Outcome::Denied);
}

/// A line given as a wait; a zero line is a plain bucket; more than the burst at once is
/// insufficient; `peek` takes nothing.
#[test]
fn a_line_by_time() {
    let q: Queued = "100/s burst=5 queue=50ms".parse().unwrap();
    assert_eq!(q.max_wait(), Duration::from_millis(50));
    assert_eq!(q.max_queued(), None);
    let l = QueuedLimiter::with_clock(q, ManualClock::new());
    assert_eq!(l.check_n(5).outcome(), Outcome::Allowed);
    assert_eq!(l.peek_n(5).delay(), Duration::from_millis(50));
    assert_eq!(l.check_n(5).delay(), Duration::from_millis(50));
    assert_eq!(l.peek().outcome(), Outcome::Denied);
    assert_eq!(l.check_n(6).outcome(), Outcome::Insufficient);
    assert!(l.check_n(0).is_allowed_now());

    let plain = QueuedLimiter::with_clock(
        Queued::new(TokenBucket::per_second(2).unwrap(), Duration::ZERO).unwrap(),
        ManualClock::new(),
    );
    assert!(plain.check_n(2).is_allowed_now());
    assert_eq!(plain.check().outcome(), Outcome::Denied);
    assert_eq!(plain.check().retry_after(), Some(Duration::from_millis(500)));
}

/// Every refusal says what was wrong with the input.
#[test]
fn bad_configurations_are_typed_errors() {
    let missing = "10/s".parse::<Queued>().unwrap_err();
    assert_eq!(missing, ParseError::MissingOption { option: "queue", algorithm: "queued token bucket" });
    assert!(missing.to_string().contains("queue="), "{missing}");
    assert!(matches!("10/s queue=".parse::<Queued>(), Err(ParseError::BadNumber { what: "queue", .. })));
    assert!(matches!("10/s queue=5 parsecs".parse::<Queued>(), Err(ParseError::UnknownOption { .. })));
    assert!(matches!("10/s queue=5fortnights".parse::<Queued>(), Err(ParseError::UnknownUnit { .. })));
    assert!(matches!("10/s queue=-5".parse::<Queued>(), Err(ParseError::BadNumber { .. })));
    let huge = Queued::with_max_queued(TokenBucket::per_day(1).unwrap(), 1 << 40).unwrap_err();
    assert!(matches!(huge, ConfigError::QueueTooLong { .. }), "{huge:?}");
    assert!(huge.to_string().contains("exceeds the longest"), "{huge}");
}

/// The rate changes while requests wait: those already in line keep their due times (their
/// tokens were taken), later ones queue behind them at the new rate, and the line's length is
/// recounted under the new quota. A line longer than the limiter has room for is refused.
#[test]
fn the_rate_changes_mid_line() {
    let l = QueuedLimiter::with_clock("10/s burst=1 queue=1s".parse().unwrap(), ManualClock::new());
    assert!(l.check().is_allowed_now());
    assert_eq!(l.check().delay(), Duration::from_millis(100));
    assert_eq!(l.check().delay(), Duration::from_millis(200));
    l.set_policy("20/s burst=1 queue=1s".parse().unwrap()).unwrap();
    // The line ends at 200 ms; the next token after it comes 50 ms later at the new rate.
    assert_eq!(l.check().delay(), Duration::from_millis(250));
    l.set_policy("5/s burst=1 queue=300ms".parse().unwrap()).unwrap();
    // The line (250 ms) plus a token at 5/s (200 ms) is longer than 300 ms: refused.
    let refused = l.check();
    assert_eq!(refused.outcome(), Outcome::Denied);
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(150)));
    assert_eq!(l.policy().max_wait(), Duration::from_millis(300));
    let too_long = l.set_policy("10/s burst=1 queue=2s".parse().unwrap()).unwrap_err();
    assert!(matches!(too_long, UpdateError::Config(ConfigError::QueueTooLong { .. })), "{too_long:?}");
}
