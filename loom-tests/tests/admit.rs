//! Multi-limit admission (`src/engine/admit.rs`): charges in order, refunds on a refusal. A decision's
//! successful CAS is `Release` and a refund's load `Acquire` (so that the refund's clock is no
//! earlier than the decisions it saw); refunds of one bucket (one keyed shard) run one at a
//! time. At a frozen clock a refund is exact, so every limit ends having spent exactly one unit
//! per admitted request, whatever the interleaving; with the clock moving, a refund never gives
//! back what the refill has absorbed.

#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{
    check_all, Admit, FixedWindow, FixedWindowLimiter, KeyedBuilder, KeyedLimiter, Limiter, ManualClock,
    Nanos, Outcome, Rate, TokenBucket,
};

use loom_tests::model;

struct Limits {
    a: Limiter<ManualClock>,
    b: Limiter<ManualClock>,
}

/// Two threads admit one request each against two token buckets (2 and 1 tokens), in opposite
/// orders, at one instant. One request at most fits both; both buckets end having spent exactly
/// the admitted count.
#[test]
fn opposite_orders_conserve_both_buckets() {
    model(|| {
        let q = |burst| TokenBucket::new(Rate::per_second(1), burst).unwrap();
        let limits = Arc::new(Limits {
            a: Limiter::with_clock(q(2), ManualClock::new()),
            b: Limiter::with_clock(q(1), ManualClock::new()),
        });
        let l = Arc::clone(&limits);
        let t = thread::spawn(move || u64::from(check_all(&[&l.a as &dyn Admit, &l.b], 1).is_allowed()));
        let here = u64::from(check_all(&[&limits.b as &dyn Admit, &limits.a], 1).is_allowed());
        let admitted = here + t.join().unwrap();
        assert_eq!(admitted, 1, "b admits one; no interleaving refuses both");
        assert_eq!(limits.a.peek_n(0).remaining(), 2 - admitted);
        assert_eq!(limits.b.peek_n(0).remaining(), 1 - admitted);
    });
}

/// The same with a policy limiter (a fixed window of 1) in the middle: its refund is its own
/// (`FixedWindow::refund`), through `Direct`'s CAS loop.
#[test]
fn a_window_between_two_buckets() {
    model(|| {
        let q = TokenBucket::new(Rate::per_second(1), 2).unwrap();
        let a = Arc::new(Limiter::with_clock(q, ManualClock::new()));
        let w = Arc::new(FixedWindowLimiter::with_clock(
            FixedWindow::new(1, Duration::from_secs(60)).unwrap(),
            ManualClock::new(),
        ));
        let (a2, w2) = (Arc::clone(&a), Arc::clone(&w));
        let t = thread::spawn(move || u64::from(check_all(&[&*a2 as &dyn Admit, &*w2], 1).is_allowed()));
        let here = u64::from(check_all(&[&*w as &dyn Admit, &*a], 1).is_allowed());
        let admitted = here + t.join().unwrap();
        assert_eq!(admitted, 1, "the window admits one; no interleaving refuses both");
        assert_eq!(a.peek_n(0).remaining(), 2 - admitted);
        assert_eq!(w.peek_n(0).remaining(), 1 - admitted);
    });
}

/// A key of a keyed table and a direct bucket, in opposite orders: the key's refund goes
/// through the table's CAS (`Shard::refund`), and both limits end having spent exactly one
/// unit per admitted request.
#[test]
fn keyed_key_and_bucket_conserve() {
    model(|| {
        let q = |burst| TokenBucket::new(Rate::per_second(1), burst).unwrap();
        let keyed = Arc::new(
            KeyedLimiter::<u64>::builder(q(1))
                .capacity(3)
                .shards(1)
                .seeds([1; 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        let bucket = Arc::new(Limiter::with_clock(q(2), ManualClock::new()));
        let (k2, b2) = (Arc::clone(&keyed), Arc::clone(&bucket));
        let t = thread::spawn(move || {
            u64::from(check_all(&[&k2.limit(&7u64) as &dyn Admit, &*b2], 1).is_allowed())
        });
        let here = u64::from(check_all(&[&*bucket as &dyn Admit, &keyed.limit(&7u64)], 1).is_allowed());
        let admitted = here + t.join().unwrap();
        assert_eq!(admitted, 1, "the key admits one; no interleaving refuses both");
        assert_eq!(keyed.peek_n_at(&7, Nanos::ZERO, 0).remaining(), 1 - admitted);
        assert_eq!(bucket.peek_n(0).remaining(), 2 - admitted);
    });
}

/// A keyed table of one shard (4 slots under loom, holding 4 keys), one token a second, burst 2.
fn one_shard_table() -> Arc<KeyedLimiter<u64, ManualClock>> {
    let q = TokenBucket::new(Rate::per_second(1), 2).unwrap();
    let l = KeyedBuilder::new(q).capacity(3).shards(1).seeds([1; 8]).build_with_clock(ManualClock::new());
    Arc::new(l.unwrap())
}

/// A refund of key 1 races the eviction of key 1 and the reuse of its slot by key 4. The
/// table (4 slots under loom) holds 4 keys; 1 was charged at 0 and is full again by 10 s, when
/// 2, 3 and 5 are charged (not full) and 4 arrives, evicting 1. The refund (at the clock's 0)
/// either lands on 1 before the eviction, or finds 1 gone, or fails its CAS on 4's stamp and
/// sees 4's key: it never lands on 4, which ends with exactly one token taken.
#[test]
fn refund_races_eviction_and_reuse() {
    model(|| {
        let l = one_shard_table();
        let (_, receipt) = l.limit(&1).charge(1);
        let receipt = receipt.unwrap();
        let late = Nanos::new(10_000_000_000);
        assert!(l.check_at(&2, late).is_allowed());
        assert!(l.check_at(&3, late).is_allowed());
        assert!(l.check_at(&5, late).is_allowed());
        let l2 = Arc::clone(&l);
        let t = thread::spawn(move || l2.check_at(&4, late).outcome());
        l.limit(&1).refund(receipt);
        match t.join().unwrap() {
            Outcome::Allowed => {
                assert_eq!(l.peek_n_at(&4, late, 0).remaining(), 1);
                assert_eq!(l.stats().evictions, 1, "4 took 1's slot");
            }
            // The refund's CAS changed 1's word between the eviction's read and its CAS: the
            // eviction gives up, as it does for any decision racing it (a refusal, never an
            // admission).
            Outcome::TableFull => assert_eq!(l.stats().evictions, 0),
            other => panic!("{other:?}"),
        }
        assert_eq!(l.peek_n_at(&1, late, 0).remaining(), 2, "1 is full again either way");
        assert_eq!(l.peek_n_at(&2, late, 0).remaining(), 1);
        assert_eq!(l.peek_n_at(&3, late, 0).remaining(), 1);
        assert_eq!(l.peek_n_at(&5, late, 0).remaining(), 1);
    });
}

/// Two refunds of one bucket race while the clock moves on (the second review's trace): a full
/// bucket of 2 at 100 s, two charges, both refunded; meanwhile the clock moves to 100.5 s and a
/// plain decision takes a token. Without one-refund-at-a-time, the first refund could load the
/// word, read 100 s, stall while the second refund lowers the word and the decision raises it
/// back to the same value, then CAS it down by a token the refill no longer owes, which shows at
/// 101 s as a second token.
#[test]
fn refunds_racing_a_later_decision_never_add_capacity() {
    model(|| {
        let clock = ManualClock::new();
        clock.set(Nanos::new(100_000_000_000));
        let q = TokenBucket::new(Rate::per_second(1), 2).unwrap();
        let l = Arc::new(Limiter::with_clock(q, clock.clone()));
        let (_, a) = l.charge(1);
        let (_, b) = l.charge(1);
        let (l1, l2) = (Arc::clone(&l), Arc::clone(&l));
        let a = a.unwrap();
        let b = b.unwrap();
        let t1 = thread::spawn(move || l1.refund(a));
        let t2 = thread::spawn(move || l2.refund(b));
        clock.set(Nanos::new(100_500_000_000));
        let admitted = l.check().is_allowed();
        t1.join().unwrap();
        t2.join().unwrap();
        // At 101 s: a full bucket of 2 at 100 s, at most one token refilled since, less the one
        // taken at 100.5 s (the cap absorbs the refill before it): at most one left.
        let left = l.peek_n_at(Nanos::new(101_000_000_000), 0).remaining();
        assert!(!admitted || left <= 1, "left {left} at 101 s after a decision at 100.5 s");
    });
}

/// The keyed analogue: key 7 of a one-shard table (burst 2 at 1/s, full at 100 s) is charged
/// twice, both charges are refunded on two threads, and meanwhile the clock moves to 100.5 s
/// and a decision on key 7 takes a token. Covers the shard's refund flag and the `Release` of
/// `decide_on`: at 101 s at most one token may be left.
#[test]
fn keyed_refunds_racing_a_later_decision_never_add_capacity() {
    model(|| {
        let clock = ManualClock::new();
        clock.set(Nanos::new(100_000_000_000));
        let q = TokenBucket::new(Rate::per_second(1), 2).unwrap();
        let l: Arc<KeyedLimiter<u64, ManualClock>> = Arc::new(
            KeyedBuilder::new(q).capacity(3).shards(1).seeds([1; 8]).build_with_clock(clock.clone()).unwrap(),
        );
        let (_, a) = l.limit(&7).charge(1);
        let (_, b) = l.limit(&7).charge(1);
        let (a, b) = (a.unwrap(), b.unwrap());
        let (l1, l2) = (Arc::clone(&l), Arc::clone(&l));
        let t1 = thread::spawn(move || l1.limit(&7).refund(a));
        let t2 = thread::spawn(move || l2.limit(&7).refund(b));
        clock.set(Nanos::new(100_500_000_000));
        let admitted = l.check(&7).is_allowed();
        t1.join().unwrap();
        t2.join().unwrap();
        let left = l.peek_n_at(&7, Nanos::new(101_000_000_000), 0).remaining();
        assert!(!admitted || left <= 1, "left {left} at 101 s after a decision at 100.5 s");
    });
}

/// Issue 13: refunds of *different* keys of one shard contend for the shard's one refund flag
/// (`Shard::refund`: one refund per shard at a time; a refund that finds the flag taken gives
/// nothing back, which errs toward refusal). Keys 1 and 2 each have one token charged at a
/// frozen clock, and two threads refund them at once: whichever takes the flag gives its
/// token back exactly; the other gets it back too or not at all, never more; and once both are
/// done the flag is free again (a third refund, of key 3, lands). Checked by mutation: without
/// the flag's release (`ClearOnDrop`) the third refund is lost and the model fails.
#[test]
fn refunds_of_two_keys_share_one_shard_flag() {
    model(|| {
        let l = one_shard_table();
        let level = |k: u64| l.peek_n_at(&k, Nanos::ZERO, 0).remaining();
        let receipts: Vec<_> = [1u64, 2, 3]
            .into_iter()
            .map(|k| {
                let (d, r) = l.limit(&k).charge(1);
                assert!(d.is_allowed());
                r.unwrap()
            })
            .collect();
        let mut receipts = receipts.into_iter();
        let (r1, r2, r3) = (receipts.next().unwrap(), receipts.next().unwrap(), receipts.next().unwrap());
        let l2 = Arc::clone(&l);
        let t = thread::spawn(move || l2.limit(&2).refund(r2));
        l.limit(&1).refund(r1);
        t.join().unwrap();
        let (one, two) = (level(1), level(2));
        assert!(one <= 2 && two <= 2, "more than the burst: {one} {two}");
        assert!(one + two >= 3, "both refunds lost: {one} {two}");
        l.limit(&3).refund(r3);
        assert_eq!(level(3), 2, "the shard's refund flag was left taken");
    });
}
