//! Reservations and cancels on the direct token bucket (issue 15): the engine against the exact
//! model in `common/model.rs` under random interleavings of checks, peeks, reservations,
//! cancels and clock moves; the admission bound with reservations counted when due; FIFO; and
//! the peers' known cancel bugs as regression tests.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::model::{is_exact, refill_bound, Answer, Model, ModelRefusal, ModelReservation};
use common::strategies::{exact_quota, quota};
use proptest::prelude::*;
use tollgate::{
    Admit, Cancelled, Clock, Decision, KeyedLimiter, Limiter, ManualClock, Nanos, Receipt, Reservation,
    ReserveError, TokenBucket, TscClock, WhenFull,
};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Back(u64),
    CheckN(u64),
    PeekN(u64),
    /// `reserve_n_at` with a max wait (ns; `u64::MAX` for none).
    Reserve(u64, u64),
    /// Cancel the outstanding reservation at this index (modulo their count).
    Cancel(usize),
    /// A `check_all` charge (`Admit::charge`), and the refund of an outstanding one.
    Charge(u64),
    Refund(usize),
}

/// Operations, each on one of `keys` keys (the direct limiter has one).
fn ops(burst: u64, forward_only: bool, keys: u64) -> impl Strategy<Value = Vec<(u64, Op)>> {
    let cost = prop_oneof![6 => 1..=burst, 1 => Just(0u64), 1 => (burst + 1)..=burst.saturating_add(2)];
    let wait = prop_oneof![2 => Just(u64::MAX), 1 => Just(0u64), 2 => 0u64..2_000_000_000, 1 => any::<u64>()];
    let span = prop_oneof![3 => Just(0u64), 4 => 0u64..1_000, 4 => 0u64..3_000_000_000, 1 => 0u64..(1 << 50)];
    let back = if forward_only { 0 } else { 1 };
    let op = prop_oneof![
        3 => span.clone().prop_map(Op::Advance),
        back => span.prop_map(Op::Back),
        3 => cost.clone().prop_map(Op::CheckN),
        1 => cost.clone().prop_map(Op::PeekN),
        5 => (cost, wait).prop_map(|(n, w)| Op::Reserve(n, w)),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => (1..=burst).prop_map(Op::Charge),
        1 => any::<usize>().prop_map(Op::Refund),
    ];
    prop::collection::vec((0..keys, op), 1..80)
}

/// One admission, for the bound: `n` tokens used at `at` ns on `key`.
#[derive(Clone, Copy, Debug)]
struct Use {
    key: u64,
    at: u64,
    n: u64,
}

/// What the model-based run drives: a direct limiter (one key) or a keyed table.
trait Subject {
    fn check(&self, key: u64, now: u64, n: u64) -> Decision;
    fn peek(&self, key: u64, now: u64, n: u64) -> Decision;
    fn reserve(&self, key: u64, now: u64, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError>;
    fn cancel(&self, key: u64, now: u64, r: Reservation) -> Cancelled;
    fn charge(&self, key: u64, now: u64, n: u64) -> (Decision, Option<Receipt>);
    fn refund(&self, key: u64, now: u64, r: Receipt);
}

impl Subject for Limiter<ManualClock> {
    fn check(&self, _: u64, now: u64, n: u64) -> Decision {
        self.check_n_at(Nanos::new(now), n)
    }
    fn peek(&self, _: u64, now: u64, n: u64) -> Decision {
        self.peek_n_at(Nanos::new(now), n)
    }
    fn reserve(&self, _: u64, now: u64, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        self.reserve_n_at(Nanos::new(now), n, max_wait)
    }
    fn cancel(&self, _: u64, now: u64, r: Reservation) -> Cancelled {
        self.cancel_at(Nanos::new(now), r)
    }
    fn charge(&self, _: u64, now: u64, n: u64) -> (Decision, Option<Receipt>) {
        self.clock().set(Nanos::new(now));
        Admit::charge(self, n)
    }
    fn refund(&self, _: u64, now: u64, r: Receipt) {
        self.clock().set(Nanos::new(now));
        Admit::refund(self, r);
    }
}

impl Subject for KeyedLimiter<u64, ManualClock> {
    fn check(&self, key: u64, now: u64, n: u64) -> Decision {
        self.check_n_at(&key, Nanos::new(now), n)
    }
    fn peek(&self, key: u64, now: u64, n: u64) -> Decision {
        self.peek_n_at(&key, Nanos::new(now), n)
    }
    fn reserve(&self, key: u64, now: u64, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        self.reserve_n_at(&key, Nanos::new(now), n, max_wait)
    }
    fn cancel(&self, key: u64, now: u64, r: Reservation) -> Cancelled {
        self.cancel_at(&key, Nanos::new(now), r)
    }
    fn charge(&self, key: u64, now: u64, n: u64) -> (Decision, Option<Receipt>) {
        self.clock().set(Nanos::new(now));
        Admit::charge(&self.limit(&key), n)
    }
    fn refund(&self, key: u64, now: u64, r: Receipt) {
        self.clock().set(Nanos::new(now));
        Admit::refund(&self.limit(&key), r);
    }
}

/// Runs `ops` on `l`, comparing every answer with a model per key. Returns the admissions:
/// checks at their instant, reservations not cancelled at their due time.
fn run(l: &impl Subject, q: TokenBucket, ops: &[(u64, Op)]) -> Result<Vec<Use>, TestCaseError> {
    let mut models: HashMap<u64, Model> = HashMap::new();
    let mut now = 0u64;
    let mut open: Vec<(u64, Reservation, ModelReservation, usize)> = Vec::new();
    let mut receipts: Vec<(u64, Receipt, ModelReservation, usize)> = Vec::new();
    let mut uses: Vec<Option<Use>> = Vec::new();
    // FIFO, per key: the latest due time among reservations made since the last cancel.
    let mut latest_due: HashMap<u64, u64> = HashMap::new();
    for &(key, ref op) in ops {
        let model = models.entry(key).or_insert_with(|| Model::new(&q));
        match *op {
            Op::Advance(d) => now = now.saturating_add(d),
            Op::Back(d) => {
                now = now.saturating_sub(d);
                latest_due.clear(); // FIFO holds on a clock that does not run back
            }
            Op::CheckN(n) => {
                let d = l.check(key, now, n);
                prop_assert_eq!(Answer::of(&d), model.decide(now, n, true), "check_n({}) at {}", n, now);
                if d.is_allowed() && n > 0 {
                    uses.push(Some(Use { key, at: now, n }));
                }
            }
            Op::PeekN(n) => {
                let d = l.peek(key, now, n);
                prop_assert_eq!(Answer::of(&d), model.decide(now, n, false), "peek_n({}) at {}", n, now);
            }
            Op::Reserve(n, wait) => {
                let max_wait = if wait == u64::MAX { Duration::MAX } else { Duration::from_nanos(wait) };
                let got = l.reserve(key, now, n, max_wait);
                let want = model.reserve(now, n, wait);
                match (got, want) {
                    (Ok(r), Ok(m)) => {
                        prop_assert_eq!(
                            r.delay(),
                            Duration::from_nanos(m.wait_ns),
                            "reserve({}) at {}",
                            n,
                            now
                        );
                        prop_assert_eq!(r.tokens(), n);
                        prop_assert_eq!(r.reserved_at(), Nanos::new(now));
                        let due = now.saturating_add(m.wait_ns);
                        if n > 0 {
                            if let Some(&prev) = latest_due.get(&key) {
                                prop_assert!(due >= prev, "FIFO: due at {} after one due at {}", due, prev);
                            }
                            latest_due.insert(key, due);
                        }
                        uses.push((n > 0).then_some(Use { key, at: due, n }));
                        open.push((key, r, m, uses.len() - 1));
                    }
                    (
                        Err(ReserveError::Insufficient { requested, burst }),
                        Err(ModelRefusal::Insufficient),
                    ) => {
                        prop_assert_eq!((requested, burst), (n, q.burst()));
                    }
                    (
                        Err(ReserveError::TooLate { wait, max_wait: allowed }),
                        Err(ModelRefusal::TooLate { wait_ns }),
                    ) => {
                        prop_assert_eq!(wait, Duration::from_nanos(wait_ns));
                        prop_assert!(wait > allowed);
                    }
                    (got, want) => {
                        prop_assert!(false, "reserve({}) at {}: {:?} vs model {:?}", n, now, got, want)
                    }
                }
            }
            Op::Cancel(i) => {
                if open.is_empty() {
                    continue;
                }
                let (key, r, m, use_index) = open.remove(i % open.len());
                let got = l.cancel(key, now, r);
                let want = models.get_mut(&key).expect("a key reserved on").cancel(now, &m);
                let expected = if want { Cancelled::Returned } else { Cancelled::NothingOwed };
                prop_assert_eq!(got, expected, "cancel at {} of {:?}", now, m);
                uses[use_index] = None;
                latest_due.remove(&key);
            }
            Op::Charge(n) => {
                let (d, receipt) = l.charge(key, now, n);
                let (want, taken) = model.charge(now, n);
                prop_assert_eq!(Answer::of(&d), want, "charge({}) at {}", n, now);
                prop_assert_eq!(receipt.is_some(), taken.is_some());
                if let (Some(r), Some(m)) = (receipt, taken) {
                    uses.push(Some(Use { key, at: now, n }));
                    receipts.push((key, r, m, uses.len() - 1));
                }
            }
            Op::Refund(i) => {
                if receipts.is_empty() {
                    continue;
                }
                let (key, r, m, use_index) = receipts.remove(i % receipts.len());
                l.refund(key, now, r);
                models.get_mut(&key).expect("a key charged").cancel(now, &m);
                uses[use_index] = None;
                latest_due.remove(&key);
            }
        }
        // Every field of every key's state, after every step.
        for (&key, model) in &mut models {
            prop_assert_eq!(Answer::of(&l.peek(key, now, 1)), model.decide(now, 1, false), "key {}", key);
        }
    }
    for (_, r, _, _) in open {
        // Not cancelled: dropping a reservation keeps its tokens taken (no Drop to run).
        drop(r);
    }
    Ok(uses.into_iter().flatten().collect())
}

/// Over any span, each key's uses are at most `burst + floor(rate·span)`.
fn check_bound(q: &TokenBucket, mut uses: Vec<Use>) -> Result<(), TestCaseError> {
    prop_assert!(is_exact(q));
    uses.sort_by_key(|u| (u.key, u.at));
    for i in 0..uses.len() {
        let mut sum = 0u128;
        for u in uses[i..].iter().take_while(|u| u.key == uses[i].key) {
            sum += u128::from(u.n);
            let bound = u128::from(q.burst()) + refill_bound(q, u.at - uses[i].at);
            prop_assert!(sum <= bound, "{} tokens in [{}, {}] ns, bound {}", sum, uses[i].at, u.at, bound);
        }
    }
    Ok(())
}

fn direct(q: TokenBucket) -> Limiter<ManualClock> {
    Limiter::with_clock(q, ManualClock::new())
}

/// A table with room to spare: keys are evicted only once full, which no decision can tell.
fn keyed(q: TokenBucket) -> KeyedLimiter<u64, ManualClock> {
    KeyedLimiter::<u64>::builder(q).capacity(64).build_with_clock(ManualClock::new()).expect("a valid table")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every answer equals the model's, under any interleaving, with the clock moving both ways.
    #[test]
    fn reservations_match_the_model(q in quota(), ops in quota().prop_flat_map(|q| ops(q.burst(), false, 1))) {
        run(&direct(q), q, &ops)?;
    }

    /// Over any span, the tokens used (checks when admitted, reservations not cancelled when
    /// due) are at most `burst + floor(rate·span)`: never over-admitted, whatever was cancelled.
    #[test]
    fn admissions_stay_within_the_bound(q in exact_quota(), ops in (1u64..=8).prop_flat_map(|b| ops(b, true, 1))) {
        check_bound(&q, run(&direct(q), q, &ops)?)?;
    }

    /// Per key, a keyed table's reservations are the direct limiter's: every answer equals a
    /// model per key. The clock only moves forward (a keyed table's contract: a key reclaimed
    /// at a later time comes back fresh at an earlier one).
    #[test]
    fn keyed_reservations_match_the_model(q in quota(), ops in quota().prop_flat_map(|q| ops(q.burst(), true, 3))) {
        run(&keyed(q), q, &ops)?;
    }

    /// The bound, per key, on a keyed table.
    #[test]
    fn keyed_admissions_stay_within_the_bound(q in exact_quota(), ops in (1u64..=8).prop_flat_map(|b| ops(b, true, 3))) {
        check_bound(&q, run(&keyed(q), q, &ops)?)?;
    }
}

fn limiter(per_second: u64, burst: u64) -> Limiter<ManualClock> {
    Limiter::with_clock(
        TokenBucket::per_second(per_second).unwrap().with_burst(burst).unwrap(),
        ManualClock::new(),
    )
}

const MS: u64 = 1_000_000;

/// golang/go#56924 and #69419 asked why `CancelAt` gives back less than a reservation took once
/// later reservations exist. Because giving back more over-admits: the later ones were given
/// due times that count on its tokens, a new reservation can only queue at the end of the line,
/// and the tokens given back let it fall due together with them, more at once than the bucket
/// holds. The property tests above found exactly that, first with a full refund (four tokens
/// due at one instant of a bucket of three), then with golang's rule (give back the part
/// beyond the later ones) after two cancels out of order. What holds: while the bucket is in
/// debt, only the latest reservation (or charge) goes back, all of it at its own instant; so a
/// batch cancelled latest-first goes back whole, and any other order gives back less, never
/// more. Once the bucket is out of debt, any charge's unrefilled part goes back, in any order.
#[test]
fn a_cancel_gives_back_the_latest_reservation_whole() {
    // #56924's numbers: 10/s, burst 20; 15 at t0, 10 at +100 ms (due at +500 ms), 2 at +200 ms
    // (due at +700 ms). The 10 is not the latest: cancelling it gives nothing; the 2 is.
    let l = limiter(10, 20);
    let _a = l.reserve_n(15).unwrap();
    l.clock().set(Nanos::new(100 * MS));
    let r = l.reserve_n(10).unwrap();
    assert_eq!(r.delay(), Duration::from_millis(400));
    l.clock().set(Nanos::new(200 * MS));
    let c = l.reserve_n(2).unwrap();
    assert_eq!(c.delay(), Duration::from_millis(500));
    l.clock().set(Nanos::new(300 * MS));
    assert_eq!(l.cancel(r), Cancelled::NothingOwed);
    assert_eq!(l.cancel(c), Cancelled::Returned);
    // Debt of 4 tokens at +300 ms (5 at +200 ms, one refilled), less the 2: due in 200 ms.
    assert_eq!(l.peek().retry_after(), Some(Duration::from_millis(300)));

    // Latest-first: everything comes back, and the bucket is as before the batch.
    let l = limiter(10, 2); // a token every 100 ms
    let batch = [l.reserve_n(2).unwrap(), l.reserve().unwrap(), l.reserve().unwrap()];
    assert_eq!(
        batch.iter().map(Reservation::delay).collect::<Vec<_>>(),
        [0, 100, 200].map(Duration::from_millis)
    );
    for r in batch.into_iter().rev() {
        assert_eq!(l.cancel(r), Cancelled::Returned);
    }
    assert_eq!(l.peek().remaining(), 2);

    // The middle one first: nothing (one is queued behind it); the next reservation is no
    // earlier than the end of the line.
    let [a, b, c] = [l.reserve_n(2).unwrap(), l.reserve().unwrap(), l.reserve().unwrap()];
    assert_eq!(l.cancel(b), Cancelled::NothingOwed);
    assert_eq!(
        l.reserve_n_within(1, Duration::from_millis(200)).unwrap_err(),
        ReserveError::TooLate { wait: Duration::from_millis(300), max_wait: Duration::from_millis(200) }
    );
    assert_eq!(l.cancel(c), Cancelled::Returned);
    assert_eq!(l.cancel(a), Cancelled::NothingOwed); // b's stamp is still the line's end
    assert_eq!(l.peek().retry_after(), Some(Duration::from_millis(200)));
}

/// tikv/pd#10745: a cancel dated before its reservation (a stale `now`) must not mint tokens.
#[test]
fn a_cancel_with_a_stale_clock_gives_nothing() {
    let l = limiter(10, 5);
    l.clock().set(Nanos::new(1_000 * MS));
    let r = l.reserve_n(5).unwrap();
    assert_eq!(l.cancel_at(Nanos::new(999 * MS), r), Cancelled::NothingOwed);
    assert_eq!(l.peek().remaining(), 0);
}

/// A cancel after the refill has covered the reservation gives nothing back; in between, it
/// gives back what was still owed.
#[test]
fn a_cancel_gives_back_what_is_still_owed() {
    let l = limiter(10, 2);
    let r = l.reserve_n(2).unwrap(); // the whole burst, due at once
    l.clock().set(Nanos::new(100 * MS)); // one token refilled since
    assert_eq!(l.cancel(r), Cancelled::Returned);
    assert_eq!(l.peek().remaining(), 2); // one refilled + one owed
    let r = l.reserve_n(2).unwrap();
    l.clock().set(Nanos::new(300 * MS)); // both refilled since
    assert_eq!(l.cancel(r), Cancelled::NothingOwed);
    assert_eq!(l.peek().remaining(), 2);
}

/// Bad input: each case has its own answer and takes nothing.
#[test]
fn bad_input_is_refused_at_once() {
    let l = limiter(10, 2);
    assert_eq!(l.reserve_n(3).unwrap_err(), ReserveError::Insufficient { requested: 3, burst: 2 });
    let zero = l.reserve_n(0).unwrap();
    assert_eq!((zero.delay(), zero.tokens()), (Duration::ZERO, 0));
    assert_eq!(l.cancel(zero), Cancelled::NothingOwed);
    assert_eq!(l.peek().remaining(), 2);
    // A max wait of zero: only what is there now.
    let now = l.reserve_n_within(2, Duration::ZERO).unwrap();
    assert_eq!(
        l.reserve_n_within(1, Duration::ZERO).unwrap_err(),
        ReserveError::TooLate { wait: Duration::from_millis(100), max_wait: Duration::ZERO }
    );
    // Debt of at most one burst: 2 more are due in 200 ms (the fill time), a third never fits.
    let later = l.reserve_n(2).unwrap();
    assert_eq!(later.delay(), Duration::from_millis(200));
    let err = l.reserve_n(1).unwrap_err();
    assert_eq!(
        err,
        ReserveError::TooLate { wait: Duration::from_millis(300), max_wait: Duration::from_millis(200) }
    );
    assert!(err.to_string().contains("300ms"), "{err}");
    // Another limiter's reservation, or one made before the quota changed: not ours to refund.
    let other = limiter(10, 2);
    assert_eq!(other.cancel(later), Cancelled::Foreign);
    l.set_policy(TokenBucket::per_second(10).unwrap().with_burst(2).unwrap()).unwrap();
    assert_eq!(l.cancel(now), Cancelled::Foreign);
}

/// The documented debt bound, exactly: a reservation is refused when its delay (whole
/// nanoseconds, rounded up) exceeds `⌊burst·t/m⌋` ns, the fill time rounded down. At 3/s the
/// quota counts thirds of a nanosecond (`m = 3`, `t = 10⁹`): a burst of 2 fills in
/// 666,666,666.7 ns, so the second burst, due exactly one fill from now, rounds up to
/// 666,666,667 ns and is refused, though `fill_time` (rounded up) says 666,666,667; a token
/// less is due in 333,333,334 ns, and fits. The same per key.
#[test]
fn the_debt_bound_is_the_fill_time_rounded_down() {
    let q = TokenBucket::per_second(3).unwrap().with_burst(2).unwrap();
    assert_eq!((q.units_per_nano(), q.units_per_token()), (3, 1_000_000_000));
    assert_eq!(q.fill_time(), Nanos::new(666_666_667));
    let too_late = ReserveError::TooLate {
        wait: Duration::from_nanos(666_666_667),
        max_wait: Duration::from_nanos(666_666_666),
    };
    let l = Limiter::with_clock(q, ManualClock::new());
    let _now = l.reserve_n(2).unwrap();
    assert_eq!(l.reserve_n(2).unwrap_err(), too_late);
    assert_eq!(l.reserve_n(1).unwrap().delay(), Duration::from_nanos(333_333_334));
    let keyed = keyed_with(q, 8, WhenFull::Deny);
    let _now = keyed.reserve_n(&1, 2).unwrap();
    assert_eq!(keyed.reserve_n(&1, 2).unwrap_err(), too_late);
    assert_eq!(keyed.reserve_n(&1, 1).unwrap().delay(), Duration::from_nanos(333_333_334));
}

/// `acquire_n` returns once the tokens are due, with the due instant (the intended time); a
/// wait it cannot meet is refused at once, taking nothing. Correctness only: how precisely it
/// wakes is a benchmark figure, not a test.
#[test]
fn acquire_waits_until_due() {
    let clock = TscClock::new();
    let l = Limiter::with_clock(TokenBucket::per_second(1000).unwrap().with_burst(1).unwrap(), clock.clone());
    let first = l.acquire().unwrap();
    let second = l.acquire().unwrap();
    assert!(second.as_u64() >= first.as_u64() + 1_000_000, "{first:?} {second:?}");
    assert!(clock.now() >= second, "returned before the tokens were due");
    // A token an hour: the second is due long after any delay of this thread.
    let l = Limiter::with_clock(TokenBucket::per_hour(1).unwrap(), clock);
    l.acquire().unwrap();
    let refused = l.acquire_n(1, Duration::ZERO);
    assert!(matches!(refused, Err(ReserveError::TooLate { .. })), "{refused:?}");
}

fn keyed_with(q: TokenBucket, capacity: usize, when_full: WhenFull) -> KeyedLimiter<u64, ManualClock> {
    KeyedLimiter::<u64>::builder(q)
        .capacity(capacity)
        .shards(1)
        .when_full(when_full)
        .build_with_clock(ManualClock::new())
        .unwrap()
}

/// Per key: the direct limiter's answers (#56924's numbers, as above), each key in its own
/// line, and a cancel that names the wrong key or limiter gives nothing back.
#[test]
fn keyed_reservations_queue_per_key() {
    let l = keyed_with(TokenBucket::per_second(10).unwrap().with_burst(20).unwrap(), 64, WhenFull::Deny);
    let _a = l.reserve_n(&1, 15).unwrap();
    l.clock().set(Nanos::new(100 * MS));
    let r = l.reserve_n(&1, 10).unwrap();
    assert_eq!(r.delay(), Duration::from_millis(400));
    assert_eq!(l.reserve_n(&2, 20).unwrap().delay(), Duration::ZERO); // key 2 has its own line
    l.clock().set(Nanos::new(200 * MS));
    let c = l.reserve_n(&1, 2).unwrap();
    assert_eq!(c.delay(), Duration::from_millis(500));
    assert_eq!(c.ready_at(), Nanos::new(700 * MS));
    assert!(!l.check(&1).is_allowed()); // checks queue behind reservations
    l.clock().set(Nanos::new(300 * MS));
    // Another key's, or another limiter's (direct or keyed), reservation: not ours.
    let other = keyed_with(TokenBucket::per_second(10).unwrap().with_burst(20).unwrap(), 64, WhenFull::Deny);
    let direct = Limiter::with_clock(TokenBucket::per_second(10).unwrap(), ManualClock::new());
    let d = direct.reserve().unwrap();
    assert_eq!(l.cancel(&1, d), Cancelled::Foreign);
    let d = direct.reserve().unwrap();
    assert_eq!(other.cancel(&1, d), Cancelled::Foreign);
    assert_eq!(direct.cancel(l.reserve(&3).unwrap()), Cancelled::Foreign);
    assert_eq!(l.cancel(&2, r), Cancelled::Foreign);
    assert_eq!(l.cancel(&1, c), Cancelled::Returned);
    // Debt of 4 tokens at +300 ms, less the 2: due in 300 ms (the 10 was made at +100).
    assert_eq!(l.peek(&1).retry_after(), Some(Duration::from_millis(300)));
    // A key in debt is never evicted: a sweep finds nothing to reclaim on key 1.
    l.sweep();
    assert_eq!(l.peek(&1).retry_after(), Some(Duration::from_millis(300)));
}

/// Bad input and a full table: each refusal is typed and takes nothing; a key admitted
/// untracked (fail-open) gets a reservation due at once that owes nothing.
#[test]
fn keyed_reservations_refuse_at_once() {
    let q = TokenBucket::per_second(10).unwrap().with_burst(2).unwrap();
    let l = keyed_with(q, 8, WhenFull::Deny);
    assert_eq!(l.reserve_n(&1, 3).unwrap_err(), ReserveError::Insufficient { requested: 3, burst: 2 });
    let zero = l.reserve_n(&1, 0).unwrap();
    assert_eq!((zero.delay(), zero.tokens()), (Duration::ZERO, 0));
    assert_eq!(l.cancel(&1, zero), Cancelled::NothingOwed);
    let _now = l.reserve_n(&1, 2).unwrap();
    let err = l.reserve_n_within(&1, 1, Duration::from_millis(50)).unwrap_err();
    assert_eq!(
        err,
        ReserveError::TooLate { wait: Duration::from_millis(100), max_wait: Duration::from_millis(50) }
    );
    assert_eq!(l.peek(&1).retry_after(), Some(Duration::from_millis(100)), "a refusal took nothing");
    // Fill the table with keys in debt (never evictable), then a new key finds no room.
    let mut key = 100;
    while l.reserve_n(&key, 2).is_ok() {
        let _in_debt = l.reserve_n(&key, 2).unwrap();
        key += 1;
    }
    let err = l.reserve_n(&key, 1).unwrap_err();
    assert_eq!(err, ReserveError::TableFull);
    assert!(err.to_string().contains("no room"), "{err}");

    let open = keyed_with(q, 8, WhenFull::Allow);
    for key in 0..64u64 {
        let r = open.reserve_n(&key, 2).unwrap();
        if r.delay() == Duration::ZERO && open.peek(&key).remaining() == 2 {
            // Admitted untracked: nothing was taken, so nothing is owed.
            assert_eq!(open.cancel(&key, r), Cancelled::NothingOwed);
            return;
        }
        let _ = open.reserve_n(&key, 2).unwrap(); // in debt: never evicted
    }
    panic!("a table of 8 keys tracked 64 keys in debt");
}

/// A table that evicts by force gives nothing back (as its `check_all` receipts), and a cancel
/// after a tier change counts the tokens as they were reserved.
#[test]
fn keyed_cancels_under_evictions_and_tiers() {
    let q = TokenBucket::per_second(10).unwrap().with_burst(2).unwrap();
    let l = keyed_with(q, 64, WhenFull::EvictFullest);
    let r = l.reserve_n(&1, 2).unwrap();
    assert_eq!(l.cancel(&1, r), Cancelled::NothingOwed);
    assert_eq!(l.peek(&1).remaining(), 0);

    let l = KeyedLimiter::<u64>::builder(q)
        .tier("gold", TokenBucket::per_second(10).unwrap().with_burst(2).unwrap())
        .capacity(64)
        .build_with_clock(ManualClock::new())
        .unwrap();
    let gold = l.tier("gold").unwrap();
    l.set_override(&1, gold).unwrap();
    let a = l.reserve_n(&1, 2).unwrap();
    let b = l.reserve(&1).unwrap();
    assert_eq!(b.delay(), Duration::from_millis(100));
    // Gold gets a faster rate: the debt is read at it, and b still goes back whole (latest).
    l.set_tier_quota(gold, TokenBucket::per_second(20).unwrap().with_burst(2).unwrap()).unwrap();
    assert_eq!(l.cancel(&1, b), Cancelled::Returned);
    assert_eq!(l.cancel(&1, a), Cancelled::Returned);
    assert_eq!(l.peek(&1).remaining(), 2);
    assert!(l.acquire_n(&1, 2, Duration::ZERO).is_ok());
    assert!(matches!(l.acquire_n(&1, 1, Duration::ZERO), Err(ReserveError::TooLate { .. })));
}

/// The rate changes while a thread waits: its tokens were taken under the old quota and stay
/// due when they were; later reservations queue behind it at the new rate (within the new
/// quota's one fill of debt); the old reservations are no longer this configuration's to cancel.
#[test]
fn the_rate_changes_mid_wait() {
    let q = TokenBucket::per_second(10).unwrap().with_burst(2).unwrap(); // a token per 100 ms
    let l = std::sync::Arc::new(Limiter::with_clock(
        q.with_max_fill_time(Duration::from_secs(1)).unwrap(),
        ManualClock::new(),
    ));
    let first = l.reserve_n(2).unwrap();
    let queued = l.reserve().unwrap();
    assert_eq!(queued.ready_at(), Nanos::new(100 * MS));
    let waiter = {
        let l = std::sync::Arc::clone(&l);
        std::thread::spawn(move || l.acquire_n(1, Duration::MAX).unwrap()) // due at 200 ms
    };
    // Until the waiter has reserved: the line then ends at 200 ms, and one more token at the
    // old rate is due at 300 ms.
    while l.peek_n(1).retry_after() != Some(Duration::from_millis(300)) {
        std::thread::yield_now();
    }
    l.set_policy(TokenBucket::per_second(20).unwrap().with_burst(10).unwrap()).unwrap();
    // The next token after the line comes 50 ms later, at the new rate.
    let next = l.reserve().unwrap();
    assert_eq!(next.ready_at(), Nanos::new(250 * MS));
    l.clock().set(Nanos::new(250 * MS));
    assert_eq!(waiter.join().unwrap(), Nanos::new(200 * MS), "the waiter's due time did not move");
    // Made under the old quota: not refunded under the new one.
    assert_eq!(l.cancel(first), Cancelled::Foreign);
    assert_eq!(l.cancel(queued), Cancelled::Foreign);
    assert_eq!(l.cancel(next), Cancelled::NothingOwed); // due already
}

/// Per key, the quota changes while a key is in debt: the same rule, and the line is bounded
/// by the new quota's fill.
#[test]
fn a_tier_changes_mid_wait() {
    let q = TokenBucket::per_second(10).unwrap().with_burst(2).unwrap();
    let l = KeyedLimiter::<u64>::builder(q)
        .capacity(64)
        .max_fill_time(Duration::from_secs(1))
        .build_with_clock(ManualClock::new())
        .unwrap();
    let _now = l.reserve_n(&1, 2).unwrap();
    let queued = l.reserve(&1).unwrap();
    assert_eq!(queued.ready_at(), Nanos::new(100 * MS));
    l.set_policy(TokenBucket::per_second(20).unwrap().with_burst(4).unwrap()).unwrap();
    assert_eq!(l.reserve(&1).unwrap().ready_at(), Nanos::new(150 * MS));
    assert_eq!(l.check(&1).retry_after(), Some(Duration::from_millis(200)));
    // The new fill is 200 ms: a line ending past it is refused at once.
    let err = l.reserve_n(&1, 2).unwrap_err();
    assert_eq!(
        err,
        ReserveError::TooLate { wait: Duration::from_millis(250), max_wait: Duration::from_millis(200) }
    );
    assert_eq!(l.cancel(&1, queued), Cancelled::NothingOwed, "not the latest while in debt");
}

/// A deadline already past (a wait of zero): only tokens there now, else refused at once.
#[test]
fn a_deadline_in_the_past_takes_only_what_is_there() {
    let l = limiter(10, 1);
    let deadline = Nanos::ZERO;
    let max_wait = deadline.as_duration().saturating_sub(l.now().as_duration());
    assert!(l.acquire_n(1, max_wait).is_ok());
    assert!(matches!(l.acquire_n(1, max_wait), Err(ReserveError::TooLate { .. })));
    assert_eq!(l.peek().retry_after(), Some(Duration::from_millis(100)), "the refusal took nothing");
}
