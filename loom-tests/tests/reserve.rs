//! Reservations and cancels on the direct bucket (`src/policies/reserve.rs`,
//! `AtomicBucket::reserve` and `cancel`): a reservation is the decisions' CAS with a stamp that
//! may lie ahead of now; a cancel is the refunds' CAS under their flag, waiting for it. The
//! same per key (`src/keyed/bucket.rs`, `reserve_words` and `cancel_words`): the table's probe
//! and CAS with the reservation's rule, and `Shard::cancel`, waiting for the shard's refund
//! flag.

#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{
    Cancelled, KeyedLimiter, Limiter, ManualClock, Nanos, Outcome, Queued, QueuedLimiter, Rate, TokenBucket,
};

use loom_tests::model;

/// One token per 10 ns, burst 2, empty at 0 ns (so everything waits).
fn limiter() -> Arc<Limiter<ManualClock>> {
    let q = TokenBucket::new(Rate::per(1, Duration::from_nanos(10)), 2).unwrap();
    Arc::new(Limiter::with_clock(q.with_initial(0).unwrap(), ManualClock::new()))
}

/// A reservation racing a check on an empty bucket at 10 ns (one token refilled): the check
/// wins the token and the reservation is due 10 ns later (it queues behind), or the
/// reservation takes it at once and the check is refused (it queues behind the reservation).
/// Never both at once, never a token lost.
#[test]
fn reserve_races_check() {
    model(|| {
        let l = limiter();
        let c = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_at(Nanos::new(10)).is_allowed())
        };
        let r = l.reserve_n_at(Nanos::new(10), 1, Duration::MAX).unwrap();
        let checked = c.join().unwrap();
        assert_eq!(r.delay(), if checked { Duration::from_nanos(10) } else { Duration::ZERO });
        // At 20 ns: two tokens spent if the check won (empty), one if it was refused (one left).
        let wait = if checked { Duration::from_nanos(10) } else { Duration::ZERO };
        assert_eq!(l.peek_n_at(Nanos::new(20), 1).retry_after(), Some(wait));
    });
}

/// A cancel racing a later reservation, both at 0 ns: the first reservation (one token, due at
/// 10 ns) is cancelled while another thread reserves one more. If the cancel runs first, it is
/// the latest and goes back whole, and the new one is due at 10 ns; if the reservation runs
/// first, the cancelled one is no longer the latest and nothing goes back (the new one was told
/// 20 ns, counting on it). Either way nothing is due before its tokens exist.
#[test]
fn cancel_races_reserve() {
    model(|| {
        let l = limiter();
        let first = l.reserve_n_at(Nanos::ZERO, 1, Duration::MAX).unwrap();
        assert_eq!(first.delay(), Duration::from_nanos(10));
        let other = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.reserve_n_at(Nanos::ZERO, 1, Duration::MAX).unwrap().delay())
        };
        let cancelled = l.cancel_at(Nanos::ZERO, first);
        let delay = other.join().unwrap();
        match cancelled {
            Cancelled::Returned => assert_eq!(delay, Duration::from_nanos(10)),
            Cancelled::NothingOwed => assert_eq!(delay, Duration::from_nanos(20)),
            other => panic!("{other:?}"),
        }
        // The line ends where the remaining reservations say: one token after 10 ns or two.
        let end = l.peek_n_at(Nanos::ZERO, 1).retry_after().unwrap() - Duration::from_nanos(10);
        let expected = if cancelled == Cancelled::Returned { 10 } else { 20 };
        assert_eq!(end, Duration::from_nanos(expected));
    });
}

/// Two cancels racing, of the two latest reservations (due at 10 and 20 ns): they serialize on
/// the refund flag (the second waits rather than give up). Latest first, both go back and the
/// bucket is empty at 0 ns again; the other order gives back only the latest (the earlier one
/// was not the latest when it ran). Never more than both.
#[test]
fn cancel_races_cancel() {
    model(|| {
        let l = limiter();
        let a = l.reserve_n_at(Nanos::ZERO, 1, Duration::MAX).unwrap();
        let b = l.reserve_n_at(Nanos::ZERO, 1, Duration::MAX).unwrap();
        let t = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.cancel_at(Nanos::ZERO, b))
        };
        let ca = l.cancel_at(Nanos::ZERO, a);
        let cb = t.join().unwrap();
        assert_eq!(cb, Cancelled::Returned, "the latest always goes back");
        let wait = l.peek_n_at(Nanos::ZERO, 1).retry_after().unwrap();
        match ca {
            Cancelled::Returned => assert_eq!(wait, Duration::from_nanos(10)),
            Cancelled::NothingOwed => assert_eq!(wait, Duration::from_nanos(20)),
            other => panic!("{other:?}"),
        }
    });
}

/// A one-shard table (so every key shares the refund flag), seeds fixed: one token per 10 ns,
/// `burst` (a keyed table's keys start full), with `empty` keys' tokens all taken at 0 ns.
fn keyed(burst: u64, empty: &[u64]) -> Arc<KeyedLimiter<u64, ManualClock>> {
    let q = TokenBucket::new(Rate::per(1, Duration::from_nanos(10)), burst).unwrap();
    let l = Arc::new(
        KeyedLimiter::<u64>::builder(q)
            .capacity(3)
            .shards(1)
            .seeds([1; 8])
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    for key in empty {
        assert!(l.check_n_at(key, Nanos::ZERO, burst).is_allowed());
    }
    l
}

/// `reserve_races_check` on a key that is not in the table yet (full, one token): both insert
/// it (one inserts, the other finds it), and the two decisions serialize on its word as on a
/// direct bucket.
#[test]
fn keyed_reserve_races_check_on_a_new_key() {
    model(|| {
        let l = keyed(1, &[]);
        let c = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_at(&7, Nanos::ZERO).is_allowed())
        };
        let r = l.reserve_n_at(&7, Nanos::ZERO, 1, Duration::MAX).unwrap();
        let checked = c.join().unwrap();
        assert_eq!(r.delay(), if checked { Duration::from_nanos(10) } else { Duration::ZERO });
        let wait = if checked { Duration::from_nanos(10) } else { Duration::ZERO };
        assert_eq!(l.peek_n_at(&7, Nanos::new(10), 1).retry_after(), Some(wait));
        assert_eq!(l.len(), 1, "one bucket for the key");
    });
}

/// `cancel_races_reserve` per key: the cancel (through the shard's refund flag and the
/// table's CAS) gives back whole only while its reservation is the key's latest.
#[test]
fn keyed_cancel_races_reserve() {
    model(|| {
        let l = keyed(2, &[7]);
        let first = l.reserve_n_at(&7, Nanos::ZERO, 1, Duration::MAX).unwrap();
        assert_eq!(first.delay(), Duration::from_nanos(10));
        let other = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.reserve_n_at(&7, Nanos::ZERO, 1, Duration::MAX).unwrap().delay())
        };
        let cancelled = l.cancel_at(&7, Nanos::ZERO, first);
        let delay = other.join().unwrap();
        match cancelled {
            Cancelled::Returned => assert_eq!(delay, Duration::from_nanos(10)),
            Cancelled::NothingOwed => assert_eq!(delay, Duration::from_nanos(20)),
            other => panic!("{other:?}"),
        }
        let end = l.peek_n_at(&7, Nanos::ZERO, 1).retry_after().unwrap() - Duration::from_nanos(10);
        let expected = if cancelled == Cancelled::Returned { 10 } else { 20 };
        assert_eq!(end, Duration::from_nanos(expected));
    });
}

/// Cancels of two keys racing on the one shard's refund flag: a cancel waits for the other
/// rather than give nothing back (a refund would give up), so both go back whole.
#[test]
fn keyed_cancels_of_two_keys_both_go_back() {
    model(|| {
        let l = keyed(1, &[7, 8]);
        let a = l.reserve_n_at(&7, Nanos::ZERO, 1, Duration::MAX).unwrap();
        let b = l.reserve_n_at(&8, Nanos::ZERO, 1, Duration::MAX).unwrap();
        let t = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.cancel_at(&8, Nanos::ZERO, b))
        };
        assert_eq!(l.cancel_at(&7, Nanos::ZERO, a), Cancelled::Returned);
        assert_eq!(t.join().unwrap(), Cancelled::Returned);
        for key in [7, 8] {
            assert_eq!(l.peek_n_at(&key, Nanos::ZERO, 1).retry_after(), Some(Duration::from_nanos(10)));
        }
    });
}

/// A queued bucket (`policies/queued.rs`, `AtomicBucket::queue`): one token per 10 ns, burst 1,
/// a line of one token, full at 0 ns. Two threads check at once: one is served now, the
/// other waits its turn (10 ns), in either order; a third request finds the line full.
#[test]
fn queued_checks_race_into_one_line() {
    model(|| {
        let q = TokenBucket::new(Rate::per(1, Duration::from_nanos(10)), 1).unwrap();
        let l =
            Arc::new(QueuedLimiter::with_clock(Queued::with_max_queued(q, 1).unwrap(), ManualClock::new()));
        let t = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_at(Nanos::ZERO).delay())
        };
        let here = l.check_at(Nanos::ZERO).delay();
        let there = t.join().unwrap();
        let mut delays = [here, there];
        delays.sort();
        assert_eq!(delays, [Duration::ZERO, Duration::from_nanos(10)]);
        let full = l.check_at(Nanos::ZERO);
        assert_eq!(full.outcome(), Outcome::Denied);
        assert_eq!(full.retry_after(), Some(Duration::from_nanos(10)));
    });
}
