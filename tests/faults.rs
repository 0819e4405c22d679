//! The fault campaign's clock and flood tests (issue 13): clocks that disagree between threads,
//! step backward, jump ten years or run past the limiter's lifetime, and floods of new keys.
//! The soak and the long fuzz are scripts (`scripts/soak.sh`); their figures are in
//! `docs/guide/guarantees-and-testing.md`.
//!
//! What skew does, stated as the tests check it. Every decision is the exact algorithm's at the
//! reading it was given, so:
//! - over any run, a bucket admits at most `burst + floor(rate · (r_max − r_min))`, where the
//!   `r` are the readings; with every reading within `±s` of true time over a true span `t`,
//!   that is `burst + floor(rate · (t + 2s))`: skew can add at most `rate · 2s` admissions;
//! - a schedule that conforms in true time (the exact bucket would admit every request) is
//!   refused only where the skew explains it: every refusal's `retry_after` is at most `2s`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use common::bounds::Algo;
use common::model::refill_bound;
use proptest::prelude::*;
use tollgate::{
    KeyedBuilder, KeyedLimiter, Limiter, ManualClock, Nanos, Outcome, Rate, TokenBucket, WhenFull,
};

const MS: u64 = 1_000_000;

/// A direct bucket and a keyed one (on key 0), the same quota, fed the same readings.
fn buckets(q: TokenBucket) -> (Limiter<ManualClock>, KeyedLimiter<u64, ManualClock>) {
    let keyed = KeyedBuilder::new(q).capacity(64).build_with_clock(ManualClock::new()).unwrap();
    (Limiter::with_clock(q, ManualClock::new()), keyed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Requests spaced at least one token apart in true time (so the exact bucket admits them
    /// all), each read through a clock off by up to `±skew`: every refusal asks for at most
    /// `2·skew`, and the total stays within the bound on the readings.
    #[test]
    fn skew_refuses_only_what_it_explains(
        per_token in prop::sample::select(vec![3_000u64, 100_000, MS]),
        burst in 1u64..6,
        skew in 0u64..=MS,
        steps in prop::collection::vec((0u64..3, 0u64..=2_000), 1..200),
    ) {
        let q = TokenBucket::new(Rate::per(1, Duration::from_nanos(per_token)), burst).unwrap();
        let (direct, keyed) = buckets(q);
        // True time starts at `skew`, so that every reading is at or above 0.
        let mut t = skew;
        let (mut r_min, mut r_max, mut admitted) = (u64::MAX, 0u64, [0u64; 2]);
        for (gap, err) in steps {
            t += per_token * (1 + gap);
            // An error in [−skew, skew], from a draw in [0, 2000].
            let r = (t + skew * err / 1_000).saturating_sub(skew);
            (r_min, r_max) = (r_min.min(r), r_max.max(r));
            let decisions = [direct.check_at(Nanos::new(r)), keyed.check_at(&0, Nanos::new(r))];
            prop_assert_eq!(decisions[0], decisions[1]);
            for (d, a) in decisions.iter().zip(&mut admitted) {
                if d.is_allowed() {
                    *a += 1;
                } else {
                    let wait = d.retry_after_nanos().unwrap().as_u64();
                    prop_assert!(wait <= 2 * skew, "refused for {wait} ns with a skew of {skew} ns");
                }
            }
        }
        let bound = u128::from(burst) + refill_bound(&q, r_max - r_min);
        prop_assert!(u128::from(admitted[0]) <= bound, "{} > {bound}", admitted[0]);
    }
}

/// Two threads, one key, clocks 1 ms behind and 1 ms ahead of a shared simulated time that
/// moves as they go: the direct and the keyed bucket each admit at most `burst + floor(rate ·
/// (span + 2 ms))` over the run.
#[test]
fn threads_with_skewed_clocks_never_over_admit() {
    let q = TokenBucket::new(Rate::per(1, Duration::from_micros(10)), 8).unwrap();
    let (direct, keyed) = buckets(q);
    let time = AtomicU64::new(MS);
    let admitted = [AtomicU64::new(0), AtomicU64::new(0)];
    std::thread::scope(|s| {
        for offset in [-(MS as i64), MS as i64] {
            let (direct, keyed, time, admitted) = (&direct, &keyed, &time, &admitted);
            s.spawn(move || {
                for i in 0..200_000u64 {
                    let t = time.fetch_add(i % 3, Relaxed);
                    let r = Nanos::new(t.checked_add_signed(offset).unwrap());
                    if direct.check_at(r).is_allowed() {
                        admitted[0].fetch_add(1, Relaxed);
                    }
                    if keyed.check_at(&0, r).is_allowed() {
                        admitted[1].fetch_add(1, Relaxed);
                    }
                }
            });
        }
    });
    let span = time.load(Relaxed) - MS;
    let bound = u128::from(q.burst()) + refill_bound(&q, span + 2 * MS);
    // No lower bound here: when the thread ahead runs alone for a while, the one behind then
    // waits out the 2 ms between their clocks, which is `rate · 2 ms` tokens (200) against a
    // run of well under a millisecond. The refusal bound is the proptest's, above.
    for (name, a) in ["direct", "keyed"].iter().zip(&admitted) {
        let got = u128::from(a.load(Relaxed));
        assert!(got <= bound, "{name}: {got} admitted over {span} ns, bound {bound}");
        assert!(got >= u128::from(q.burst()), "{name}: only {got}");
    }
}

/// Every algorithm, direct and keyed, on readings that step back, jump ten years, and run past
/// the end of the limiter's time: no panic, and never more than the bound over the readings.
/// A keyed table's time stops at its lifetime: drained just past it, it admits nothing at any
/// later reading (a direct limiter's time runs to the end of `u64` nanoseconds, nearly).
#[test]
fn backward_steps_jumps_and_the_end_of_time() {
    const YEAR: u64 = 365 * 86_400 * 1_000_000_000;
    let readings = [0, 1_000 * MS, 0, 10 * YEAR, 10 * YEAR - 1_000 * MS, 10 * YEAR + 1, 0];
    for algo in Algo::all(Duration::from_secs(1)) {
        let clock = ManualClock::new();
        for (kind, l) in [("direct", algo.direct(&clock)), ("keyed", algo.keyed(&clock, 64, WhenFull::Deny))]
        {
            let mut admitted = 0u128;
            for r in readings {
                admitted += (0..40).filter(|_| l.check_at(7, Nanos::new(r)).is_allowed()).count() as u128;
            }
            let bound = algo.bound(10 * YEAR + 1);
            assert!(admitted <= bound, "{} {kind}: {admitted} > {bound}", algo.name);
            let end = l.lifetime().map_or(u64::MAX - 1, |e| e.as_u64() + 1);
            let drained = (0..1_000).filter(|_| l.check_at(7, Nanos::new(end)).is_allowed()).count();
            assert!(drained < 1_000, "{} {kind}: never drained past the end", algo.name);
            for r in [end.saturating_add(YEAR), u64::MAX - 1, u64::MAX] {
                let d = l.check_at(7, Nanos::new(r));
                assert!(!d.is_allowed(), "{} {kind}: admitted at {r} after time stopped: {d:?}", algo.name);
            }
        }
    }
}

/// A flood: 100 times the table's capacity in new keys, each seen once, 64 per 100 µs, each
/// taking a token, so that the table is soon full of keys that are not full (a key refills in
/// 3.2 ms, in which 2,048 new keys arrive), while 16 keys run at exactly their quota. Under each
/// table-full policy the table's memory stays what it was, it never tracks more than its
/// capacity, and the well-behaved keys are never admitted beyond their quota. Under `Deny` and
/// `Allow` they are never refused: they are never full, so never evicted. Under `EvictFullest`
/// a forced eviction may take one of them (they are the stalest buckets), and its ghost brings
/// it back no fuller than it was; the test prints how often one was refused.
#[test]
fn a_flood_of_new_keys_leaves_the_well_behaved_keys_their_quota() {
    const CAPACITY: usize = 1_024;
    const GOOD: usize = 16;
    const ROUND: u64 = 100_000;
    const ROUNDS_PER_TOKEN: u64 = 32;
    let per_token = ROUND * ROUNDS_PER_TOKEN;
    let q = TokenBucket::new(Rate::per(1, Duration::from_nanos(per_token)), 4).unwrap();
    for when_full in [WhenFull::Deny, WhenFull::Allow, WhenFull::EvictFullest] {
        let l: KeyedLimiter<u64, ManualClock> = KeyedBuilder::new(q)
            .capacity(CAPACITY)
            .when_full(when_full)
            .build_with_clock(ManualClock::new())
            .unwrap();
        let memory = l.memory_bytes();
        let (mut admitted, mut refused) = ([0u64; GOOD], [0u64; GOOD]);
        let mut good_table_full = 0u64;
        let (mut flood, mut flood_admitted) = (1u64 << 32, 0u64);
        let rounds = 100 * CAPACITY as u64 / 64;
        for round in 0..rounds {
            let now = Nanos::new(round * ROUND);
            // Each well-behaved key once per token, staggered.
            for k in (0..GOOD).filter(|&k| round % ROUNDS_PER_TOKEN == k as u64 % ROUNDS_PER_TOKEN) {
                match l.check_at(&(k as u64), now).outcome() {
                    Outcome::Allowed => admitted[k] += 1,
                    Outcome::Untracked => panic!("{when_full:?}: well-behaved key {k} untracked"),
                    other => {
                        refused[k] += 1;
                        good_table_full += u64::from(other == Outcome::TableFull);
                    }
                }
            }
            for _ in 0..64 {
                flood_admitted += u64::from(l.check_at(&flood, now).is_allowed());
                flood += 1;
            }
            assert!(l.len() <= l.stats().capacity, "{when_full:?}: {:?}", l.stats());
        }
        assert_eq!(l.memory_bytes(), memory, "{when_full:?}: the table grew");
        let span = rounds * ROUND;
        for k in 0..GOOD {
            assert!(
                u128::from(admitted[k]) <= u128::from(q.burst()) + refill_bound(&q, span),
                "{when_full:?}"
            );
            if when_full != WhenFull::EvictFullest {
                assert_eq!(refused[k], 0, "{when_full:?}: well-behaved key {k} refused");
            }
        }
        let s = l.stats();
        assert!(
            s.refused > 0 || when_full == WhenFull::EvictFullest,
            "{when_full:?}: the flood never filled the table"
        );
        println!(
            "{when_full:?}: {} flood keys, {flood_admitted} admitted (untracked included); {} inserts, {} evictions, {} forced, \
             {} refused room; well-behaved keys: {} admitted, {} refused ({good_table_full} for want of room)",
            flood - (1 << 32),
            s.inserts,
            s.evictions,
            s.forced_evictions,
            s.refused,
            admitted.iter().sum::<u64>(),
            refused.iter().sum::<u64>(),
        );
    }
}

/// A clock whose readings are given in advance, one per read (the last one repeats): a thread
/// that read the clock and was then descheduled while others decided at later readings is
/// played as a stale reading followed by a fresh one.
struct Scripted(std::sync::Mutex<std::collections::VecDeque<u64>>);

impl Scripted {
    fn new(ms: &[u64]) -> Scripted {
        Scripted(std::sync::Mutex::new(ms.iter().map(|ms| ms * MS).collect()))
    }
    fn left(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl tollgate::Clock for Scripted {
    fn now(&self) -> Nanos {
        let mut q = self.0.lock().unwrap();
        let ns = if q.len() > 1 { q.pop_front().unwrap() } else { q[0] };
        Nanos::new(ns)
    }
}

/// Ten a second, a burst of one: after a take at 1,000 ms the stamp is 1,000 ms. A check that
/// read 950 ms (stale: that take read a later clock) finds the stamp ahead of its reading and
/// decides again at a fresh one, 1,200 ms, where a token is there: allowed, where the stale
/// reading alone refused it. A denial at a fresh reading (1,250 ms: the stamp, 1,200, is not
/// ahead of it) reads the clock once. `check_at` never reads the clock.
#[test]
fn a_denial_on_a_stale_reading_is_decided_again_at_a_fresh_one() {
    let q = TokenBucket::new(Rate::per_second(10), 1).unwrap();
    // The first reading is the limiter's origin.
    let script = [0, 1_000, 950, 1_200, 1_250, 1_250];
    let expect = [Outcome::Allowed, Outcome::Allowed, Outcome::Denied];

    for counted in [false, true] {
        let direct = Limiter::with_clock(q, Scripted::new(&script));
        let direct = if counted { direct.with_counters() } else { direct };
        assert_eq!([direct.check(), direct.check(), direct.check()].map(|d| d.outcome()), expect);
        assert_eq!(direct.clock().left(), 1, "one reading per check, two for the stale one");
        if counted {
            let c = direct.counters().unwrap();
            assert_eq!((c.allowed, c.denied, c.decisions()), (2, 1, 3), "counted once each: {c:?}");
        }
        // A caller's time is not read again, even where the stamp is ahead of it.
        let at = Limiter::with_clock(q, Scripted::new(&[0, 1_000, 2_000]));
        assert_eq!(at.check().outcome(), Outcome::Allowed);
        assert_eq!(at.check_at(Nanos::new(950 * MS)).outcome(), Outcome::Denied);
        assert_eq!(at.clock().left(), 1, "check_at read the clock");
    }

    for counted in [false, true] {
        let keyed = KeyedBuilder::<TokenBucket, u64>::new(q)
            .counters(counted)
            .build_with_clock(Scripted::new(&script))
            .unwrap();
        assert_eq!([keyed.check(&7u64), keyed.check(&7u64), keyed.check(&7u64)].map(|d| d.outcome()), expect);
        assert_eq!(keyed.clock().left(), 1, "one reading per check, two for the stale one");
        if counted {
            let c = keyed.counters().unwrap();
            assert_eq!((c.allowed, c.denied, c.decisions()), (2, 1, 3), "counted once each: {c:?}");
        }
        let at = KeyedBuilder::<TokenBucket, u64>::new(q)
            .counters(counted)
            .build_with_clock(Scripted::new(&[0, 1_000, 2_000]))
            .unwrap();
        assert_eq!(at.check(&7u64).outcome(), Outcome::Allowed);
        assert_eq!(at.check_at(&7u64, Nanos::new(950 * MS)).outcome(), Outcome::Denied);
        assert_eq!(at.clock().left(), 1, "check_at read the clock");
    }
}
