//! Multi-limit admission (`check_all`): nginx's semantics for several `limit_req`, all or
//! nothing, against a sequential model; and refunds that never leave a limit more permissive
//! than a twin that was never charged.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    check_all, Admit, Clock, Decision, FixedWindow, FixedWindowLimiter, Keyed, KeyedAlgorithm, KeyedBuilder,
    KeyedLimiter, Limiter, ManualClock, Nanos, Nginx, NginxLimiter, Outcome, Rate, Receipt, SlidingLog,
    SlidingLogLimiter, SlidingWindow, SlidingWindowLimiter, TokenBucket,
};

const MS: u64 = 1_000_000;

/// One limit's configuration; built twice (engine and model) on the same clock.
#[derive(Clone, Debug)]
enum Spec {
    Bucket {
        per_sec: u64,
        burst: u64,
    },
    Fixed {
        limit: u64,
        window_ms: u64,
    },
    Sliding {
        limit: u64,
        window_ms: u64,
    },
    Nginx {
        per_sec: u64,
        burst: u64,
        nodelay: bool,
        delay: u64,
    },
    Log {
        limit: u64,
        window_ms: u64,
    },
    /// One key of a keyed token bucket (other keys come and go on it too).
    Keyed {
        per_sec: u64,
        burst: u64,
    },
    /// One key of a keyed table of another algorithm (`Keyed<A, u64>`): a fixed window, a
    /// sliding window, nginx or the sliding log, as the direct specs above.
    KeyedPolicy(Box<Spec>),
}

/// A keyed table, as the tests drive it: one key as a limit, another key's plain decision.
trait Table {
    fn limit<'a>(&'a self, key: &'a u64) -> Box<dyn Admit + 'a>;
    fn check(&self, key: u64);
}

impl<P: KeyedAlgorithm> Table for Keyed<P, u64, ManualClock> {
    fn limit<'a>(&'a self, key: &'a u64) -> Box<dyn Admit + 'a> {
        Box::new(Keyed::limit(self, key))
    }
    fn check(&self, key: u64) {
        let _ = Keyed::check(self, &key);
    }
}

/// A keyed table and the key this limit stands for, with another key's decision before each
/// charge, so that the table is not this key's alone.
struct OneKey<T: Table> {
    limiter: T,
    key: u64,
}

impl<T: Table> Admit for OneKey<T> {
    fn charge(&self, n: u64) -> (Decision, Option<Receipt>) {
        self.limiter.check(self.key + 1);
        self.limiter.limit(&self.key).charge(n)
    }

    fn refund(&self, r: Receipt) {
        self.limiter.limit(&self.key).refund(r);
    }

    fn peek_n(&self, n: u64) -> Decision {
        self.limiter.limit(&self.key).peek_n(n)
    }
}

fn one_policy_key<P: KeyedAlgorithm + 'static>(p: P, clock: ManualClock) -> Box<dyn Admit> {
    let limiter = Keyed::builder(p).capacity(64).seeds([5; 8]).build_with_clock(clock).unwrap();
    Box::new(OneKey { limiter, key: 42 })
}

impl Spec {
    fn build(&self, clock: &ManualClock) -> Box<dyn Admit> {
        let c = clock.clone();
        match *self {
            Spec::Bucket { per_sec, burst } => {
                Box::new(Limiter::with_clock(TokenBucket::new(Rate::per_second(per_sec), burst).unwrap(), c))
            }
            Spec::Fixed { limit, window_ms } => Box::new(FixedWindowLimiter::with_clock(
                FixedWindow::new(limit, Duration::from_millis(window_ms)).unwrap(),
                c,
            )),
            Spec::Sliding { limit, window_ms } => Box::new(SlidingWindowLimiter::with_clock(
                SlidingWindow::new(limit, Duration::from_millis(window_ms)).unwrap(),
                c,
            )),
            Spec::Nginx { per_sec, burst, nodelay, delay } => {
                let q = Nginx::per_second(per_sec).unwrap().burst(burst).unwrap();
                let q = if nodelay { q.nodelay() } else { q.delay(delay) };
                Box::new(NginxLimiter::with_clock(q, c))
            }
            Spec::Log { limit, window_ms } => Box::new(SlidingLogLimiter::with_clock(
                SlidingLog::new(limit, Duration::from_millis(window_ms)).unwrap(),
                c,
            )),
            Spec::Keyed { per_sec, burst } => {
                let q = TokenBucket::new(Rate::per_second(per_sec), burst).unwrap();
                let limiter = KeyedBuilder::new(q).capacity(64).seeds([3; 8]).build_with_clock(c).unwrap();
                Box::new(OneKey { limiter, key: 42 })
            }
            Spec::KeyedPolicy(ref inner) => match **inner {
                Spec::Fixed { limit, window_ms } => {
                    one_policy_key(FixedWindow::new(limit, Duration::from_millis(window_ms)).unwrap(), c)
                }
                Spec::Sliding { limit, window_ms } => {
                    one_policy_key(SlidingWindow::new(limit, Duration::from_millis(window_ms)).unwrap(), c)
                }
                Spec::Nginx { per_sec, burst, nodelay, delay } => {
                    let q = Nginx::per_second(per_sec).unwrap().burst(burst).unwrap();
                    one_policy_key(if nodelay { q.nodelay() } else { q.delay(delay) }, c)
                }
                Spec::Log { limit, window_ms } => {
                    one_policy_key(SlidingLog::new(limit, Duration::from_millis(window_ms)).unwrap(), c)
                }
                _ => unreachable!("keyed tables of another algorithm: nginx, the windows, the log"),
            },
        }
    }
}

fn word_specs() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (1u64..6, 50u64..2000).prop_map(|(limit, window_ms)| Spec::Fixed { limit, window_ms }),
        (1u64..6, 1000u64..5000).prop_map(|(limit, window_ms)| Spec::Sliding { limit, window_ms }),
        (1u64..20, 0u64..6, any::<bool>(), 0u64..4)
            .prop_map(|(per_sec, burst, nodelay, delay)| Spec::Nginx { per_sec, burst, nodelay, delay }),
    ]
}

fn specs() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (1u64..20, 1u64..6).prop_map(|(per_sec, burst)| Spec::Bucket { per_sec, burst }),
        word_specs(),
        word_specs().prop_map(|s| Spec::KeyedPolicy(Box::new(s))),
        (1u64..6, 50u64..2000)
            .prop_map(|(limit, window_ms)| Spec::KeyedPolicy(Box::new(Spec::Log { limit, window_ms }))),
        (1u64..6, 50u64..2000).prop_map(|(limit, window_ms)| Spec::Log { limit, window_ms }),
        (1u64..20, 1u64..6).prop_map(|(per_sec, burst)| Spec::Keyed { per_sec, burst }),
    ]
}

/// One step of a refund script.
#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Check(u64),
    Charge(u64),
    Refund(prop::sample::Index),
}

/// The reference: every limit alone, peeked in order; if all admit, each is checked.
fn model_all(limits: &[Box<dyn Admit>], n: u64) -> (bool, Vec<Decision>) {
    let peeks: Vec<Decision> = limits.iter().map(|l| l.peek_n(n)).collect();
    let all = peeks.iter().all(Decision::is_allowed);
    if all {
        let taken = limits.iter().map(|l| l.charge(n).0).collect();
        (true, taken)
    } else {
        (false, peeks)
    }
}

fn max_delay(ds: &[Decision]) -> Duration {
    ds.iter().map(Decision::delay).max().unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Engine and model see the same arrivals on the same clock: the engine admits exactly when
    /// every limit alone would, answers with the largest delay and the fewest remaining, and
    /// leaves every limit in the model's state (compared through a peek of each).
    #[test]
    fn all_or_nothing_matches_the_sequential_model(
        specs in prop::collection::vec(specs(), 1..4),
        ops in prop::collection::vec((0u64..700, 0u64..3), 1..60),
    ) {
        let clock = ManualClock::new();
        let engine: Vec<Box<dyn Admit>> = specs.iter().map(|s| s.build(&clock)).collect();
        let model: Vec<Box<dyn Admit>> = specs.iter().map(|s| s.build(&clock)).collect();
        let refs: Vec<&dyn Admit> = engine.iter().map(|b| &**b).collect();
        for (dt, n) in ops {
            clock.advance(Duration::from_millis(dt));
            let got = check_all(&refs, n);
            let (admitted, answers) = model_all(&model, n);
            prop_assert_eq!(got.is_allowed(), admitted, "at {:?}", clock.now());
            if admitted {
                prop_assert_eq!(got.delay(), max_delay(&answers));
                prop_assert_eq!(got.outcome() == Outcome::Delayed, answers.iter().any(|d| d.outcome() == Outcome::Delayed));
                prop_assert_eq!(got.remaining(), answers.iter().map(Decision::remaining).min().unwrap());
            } else {
                let never = answers.iter().any(|d| d.retry_after().is_none());
                prop_assert_eq!(got.retry_after().is_none(), never);
                if !never {
                    let longest = answers.iter().filter_map(Decision::retry_after).max().unwrap();
                    prop_assert_eq!(got.retry_after(), Some(longest));
                }
            }
            for (e, m) in engine.iter().zip(&model) {
                prop_assert_eq!(e.peek_n(1), m.peek_n(1));
            }
        }
    }

    /// A charge refunded later, with other decisions before, between and after: everything the
    /// engine admits, apart from the refunded charge, a twin that only ever sees those
    /// admitted requests admits too (in lockstep, on the same clock). So a refund never hands
    /// out capacity the limit did not have, even when the cap at full has since absorbed part
    /// of the charge (bucket) or its excess has leaked (nginx).
    #[test]
    fn late_refunds_never_add_capacity(
        spec in specs(),
        before in prop::collection::vec((0u64..400, 1u64..3), 0..6),
        charge_n in 1u64..3,
        between in prop::collection::vec((0u64..900, 1u64..3), 0..6),
        after in prop::collection::vec((0u64..400, 1u64..3), 0..6),
    ) {
        let clock = ManualClock::new();
        let engine = spec.build(&clock);
        let twin = spec.build(&clock);
        let step = |dt: u64, n: u64| -> Result<(), TestCaseError> {
            clock.advance(Duration::from_millis(dt));
            if engine.charge(n).0.is_allowed() {
                prop_assert!(twin.charge(n).0.is_allowed(), "the twin refuses {} at {:?}", n, clock.now());
            }
            Ok(())
        };
        for &(dt, n) in &before {
            step(dt, n)?;
        }
        let (_, receipt) = engine.charge(charge_n);
        for &(dt, n) in &between {
            step(dt, n)?;
        }
        if let Some(r) = receipt {
            engine.refund(r);
        }
        for &(dt, n) in &after {
            step(dt, n)?;
        }
    }

    /// Several charges outstanding at once, refunded in any order, with plain decisions and
    /// clock advances before, between and after: everything the engine admits on its own, a
    /// twin that never saw any of the refunded charges admits too (in lockstep, on the same
    /// clock). This is the case where a refund bound read from the charge's stored word breaks
    /// (an older charge refunded first moves the newer one down).
    #[test]
    fn overlapping_refunds_in_any_order_never_add_capacity(
        spec in specs(),
        script in prop::collection::vec(
            prop_oneof![
                (0u64..700).prop_map(Step::Advance),
                (1u64..3).prop_map(Step::Check),
                (1u64..3).prop_map(Step::Charge),
                any::<prop::sample::Index>().prop_map(Step::Refund),
            ],
            1..40,
        ),
    ) {
        let clock = ManualClock::new();
        let engine = spec.build(&clock);
        let twin = spec.build(&clock);
        let mut receipts: Vec<Receipt> = Vec::new();
        for step in script {
            match step {
                Step::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Step::Check(n) => {
                    if engine.charge(n).0.is_allowed() {
                        prop_assert!(twin.charge(n).0.is_allowed(), "the twin refuses {} at {:?}", n, clock.now());
                    }
                }
                Step::Charge(n) => receipts.extend(engine.charge(n).1),
                Step::Refund(i) if !receipts.is_empty() => {
                    let r = receipts.swap_remove(i.index(receipts.len()));
                    engine.refund(r);
                }
                Step::Refund(_) => {}
            }
        }
    }

    /// At the charge's own instant a refund is exact: the limit is exactly its twin again.
    #[test]
    fn immediate_refunds_are_exact(
        spec in specs(),
        before in prop::collection::vec((0u64..400, 1u64..3), 0..8),
        charge_n in 1u64..3,
    ) {
        let clock = ManualClock::new();
        let engine = spec.build(&clock);
        let twin = spec.build(&clock);
        for (dt, n) in before {
            clock.advance(Duration::from_millis(dt));
            prop_assert_eq!(engine.charge(n).0, twin.charge(n).0);
        }
        if let (_, Some(r)) = engine.charge(charge_n) {
            engine.refund(r);
        }
        for n in 0..=6 {
            prop_assert_eq!(engine.peek_n(n), twin.peek_n(n));
        }
        clock.advance(Duration::from_millis(1234));
        for n in 0..=6 {
            prop_assert_eq!(engine.peek_n(n), twin.peek_n(n));
        }
    }
}

/// nginx with two zones (REFERENCE.md §1.3): a per-client zone `rate=1r/s burst=5` and a
/// per-server zone `rate=1r/s burst=5 delay=3`, requests at t = 0. The client's delays (1..5 s)
/// are the larger and win; the seventh is rejected by the client's zone and the server's zone,
/// charged nothing, still has the room it had.
#[test]
fn two_zones_largest_delay_wins_and_a_rejection_charges_nothing() {
    let clock = ManualClock::new();
    let client = NginxLimiter::with_clock(Nginx::per_second(1).unwrap().burst(5).unwrap(), clock.clone());
    let server = NginxLimiter::with_clock(Nginx::per_second(1).unwrap().burst(6).unwrap().delay(3), clock);
    let zones: [&dyn Admit; 2] = [&client, &server];
    let got: Vec<(Outcome, u64)> =
        (0..7).map(|_| check_all(&zones, 1)).map(|d| (d.outcome(), d.delay().as_secs())).collect();
    use Outcome::*;
    assert_eq!(
        got,
        [(Allowed, 0), (Delayed, 1), (Delayed, 2), (Delayed, 3), (Delayed, 4), (Delayed, 5), (Denied, 0)]
    );
    // The server zone was charged 6 times, not 7: its excess is 5 requests, so one more fits.
    assert_eq!(Admit::peek_n(&server, 1).outcome(), Delayed);
    assert_eq!(Admit::peek_n(&server, 2).outcome(), Denied);
}

/// A refusal reports the longest wait any limit asks for, and `None` when one never admits.
#[test]
fn refusals_report_the_longest_wait() {
    let clock = ManualClock::new();
    let fast = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
    let slow = Limiter::with_clock(TokenBucket::per_minute(1).unwrap(), clock.clone());
    let limits: [&dyn Admit; 2] = [&fast, &slow];
    assert!(check_all(&limits, 1).is_allowed());
    clock.set(Nanos::new(500 * MS));
    let d = check_all(&limits, 1);
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(59_500)));
    let too_big = check_all(&limits, 2);
    assert_eq!(too_big.outcome(), Outcome::Insufficient);
    assert_eq!(too_big.retry_after(), None);
    // Neither limit lost anything to the refusals.
    assert_eq!(fast.peek_n(1).outcome(), Outcome::Denied);
    clock.set(Nanos::new(1000 * MS));
    assert!(fast.peek_n(1).is_allowed());
}

/// Owned limiters join `check_all` as they are: a reference, a `Box` or an `Arc` to a limit
/// (or to a `dyn Admit`) is that limit, and a refusal refunds through it what it charged.
#[test]
fn limits_behind_pointers_join_check_all() {
    let clock = ManualClock::new();
    let bucket = |per_sec| Limiter::with_clock(TokenBucket::per_second(per_sec).unwrap(), clock.clone());
    let shared = std::sync::Arc::new(bucket(2));
    let boxed: Box<dyn Admit> = Box::new(bucket(2));
    let arced: std::sync::Arc<dyn Admit> = std::sync::Arc::new(bucket(2));
    let last = bucket(1);
    let by_ref = &last;
    let limits: [&dyn Admit; 4] = [&shared, &boxed, &arced, &by_ref];
    assert!(check_all(&limits, 1).is_allowed());
    // The last limit is empty: refused, and the three before it get their token back.
    assert_eq!(check_all(&limits, 1).outcome(), Outcome::Denied);
    assert_eq!(shared.peek_n(1).remaining(), 1, "the Arc's limit was refunded");
    assert_eq!(boxed.peek_n(1).remaining(), 1, "the Box's limit was refunded");
    assert_eq!(arced.peek_n(1).remaining(), 1, "the Arc<dyn Admit>'s limit was refunded");
    // A list built at run time, of boxed limits of any kind.
    let owned: Vec<Box<dyn Admit>> = vec![
        Box::new(bucket(1)),
        Box::new(NginxLimiter::with_clock(Nginx::per_second(1).unwrap(), clock.clone())),
    ];
    let refs: Vec<&dyn Admit> = owned.iter().map(|l| l as &dyn Admit).collect();
    assert!(check_all(&refs, 1).is_allowed());
    assert!(!check_all(&refs, 1).is_allowed());
    // A receipt goes back through whichever pointer reaches its limit.
    let (d, receipt) = shared.charge(1);
    assert!(d.is_allowed());
    Admit::refund(&&*shared, receipt.unwrap());
    assert_eq!(shared.peek_n(1).remaining(), 1);
}

/// The review's trace: two charges on a full bucket, the older refunded first, the clock moves
/// on by a token's time, two decisions, then the newer refund. A bound read from the newer
/// charge's stored stamp gave back a token the refill had already absorbed (3 admitted from a
/// full bucket of 2 at one instant); the elapsed-time bound gives back nothing.
#[test]
fn refunds_in_charge_order_after_a_refill_give_back_nothing_absorbed() {
    let clock = ManualClock::new();
    let l = Limiter::with_clock(TokenBucket::per_second(1).unwrap().with_burst(2).unwrap(), clock.clone());
    clock.set(Nanos::new(10_000 * MS));
    let (_, a) = Admit::charge(&l, 1);
    let (_, b) = Admit::charge(&l, 1);
    Admit::refund(&l, a.unwrap());
    clock.set(Nanos::new(11_000 * MS));
    assert!(l.check().is_allowed());
    assert!(l.check().is_allowed());
    Admit::refund(&l, b.unwrap());
    assert!(!l.check().is_allowed(), "a third at 11 s from a bucket of 2");
}

/// A keyed refund after a decision under a tier with a smaller fill: the review's trace.
#[test]
fn keyed_refunds_account_for_every_tier() {
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(TokenBucket::per_second(1).unwrap().with_burst(10).unwrap())
        .tier("tight", TokenBucket::per_second(1).unwrap())
        .capacity(16)
        .build_with_clock(clock.clone())
        .unwrap();
    let tight = l.tier("tight").unwrap();
    clock.set(Nanos::new(100_000 * MS));
    let (_, r) = l.limit(&5).charge(1);
    assert!(l.check_n_in(&5, tight, 1).is_allowed());
    l.limit(&5).refund(r.unwrap());
    assert!(!l.check_n_in(&5, tight, 1).is_allowed(), "two under burst 1 at one instant");
}

/// Receipts refund only the limit (and key) that issued them; forced-eviction tables issue none.
#[test]
fn receipts_belong_to_their_limit() {
    let clock = ManualClock::new();
    let a = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
    let b = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
    let (_, r) = Admit::charge(&a, 1);
    assert!(b.check().is_allowed());
    Admit::refund(&b, r.unwrap());
    assert!(!b.check().is_allowed(), "another limiter's receipt refunded b");
    let keyed = KeyedLimiter::<u64>::builder(TokenBucket::per_second(1).unwrap())
        .capacity(16)
        .build_with_clock(clock.clone())
        .unwrap();
    let (_, r) = keyed.limit(&1).charge(1);
    assert!(keyed.check(&2).is_allowed());
    keyed.limit(&2).refund(r.unwrap());
    assert!(!keyed.check(&2).is_allowed(), "key 1's receipt refunded key 2");
    let stalest = KeyedLimiter::<u64>::builder(TokenBucket::per_second(1).unwrap())
        .capacity(16)
        .when_full(tollgate::WhenFull::EvictFullest)
        .build_with_clock(clock)
        .unwrap();
    let (d, r) = stalest.limit(&1).charge(1);
    assert!(d.is_allowed() && r.is_none());
}

/// The review's sliding-log trace: two charges refunded in charge order, then a check at an
/// earlier time. The older refund finds a newer admission after it and gives nothing back.
#[test]
fn sliding_log_refunds_in_charge_order_stay_within_the_limit() {
    let clock = ManualClock::new();
    let l =
        SlidingLogLimiter::with_clock(SlidingLog::new(2, Duration::from_nanos(10)).unwrap(), clock.clone());
    assert!(l.check_at(Nanos::new(0)).is_allowed());
    assert!(l.check_at(Nanos::new(5)).is_allowed());
    clock.set(Nanos::new(10));
    let (_, c1) = Admit::charge(&l, 1);
    clock.set(Nanos::new(15));
    let (_, c2) = Admit::charge(&l, 1);
    Admit::refund(&l, c1.unwrap());
    Admit::refund(&l, c2.unwrap());
    // In [5, 15): the unit at 5 and, since the first refund gave nothing back, the one at 10.
    assert!(!l.check_n_at(Nanos::new(12), 2).is_allowed());
}

#[test]
fn no_limits_admit() {
    assert!(check_all(&[], 1).is_allowed());
}
