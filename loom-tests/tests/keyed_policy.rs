//! The keyed table's protocols with policy words (`src/keyed/policy.rs`): a fixed window's,
//! a sliding window's and nginx's words in place of the bucket's stamp. Under loom a shard is 4
//! slots in 2 groups of 2 and every key's window is the whole shard. Each model checks that no
//! key's count leaks into another's and that every key's count is conserved.

#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, slot_winner};
use tollgate::{FixedWindow, Keyed, KeyedPolicy, ManualClock, Nanos, Nginx, Outcome, SlidingWindow};

fn table<P: KeyedPolicy>(p: P) -> Arc<Keyed<P, u64, ManualClock>> {
    let l = Keyed::builder(p)
        .capacity(3)
        .shards(1)
        .seeds([1, 2, 3, 4, 5, 6, 7, 8])
        .build_with_clock(ManualClock::new())
        .unwrap();
    Arc::new(l)
}

fn spawn_check<P: KeyedPolicy + Send + Sync + 'static>(
    l: &Arc<Keyed<P, u64, ManualClock>>,
    key: u64,
    at: u64,
) -> thread::JoinHandle<Outcome> {
    let l = Arc::clone(l);
    thread::spawn(move || l.check_at(&key, Nanos::new(at)).outcome())
}

/// Two threads insert the same new key under a fixed window of limit 1: exactly one is
/// admitted (two slots for one key would admit both).
#[test]
fn fixed_window_same_key_inserts_share_one_count() {
    model(|| {
        let l = table(FixedWindow::new(1, Duration::from_nanos(1_000)).unwrap());
        let a = spawn_check(&l, 7, 0);
        let b = spawn_check(&l, 7, 0);
        let allowed =
            [a.join().unwrap(), b.join().unwrap()].iter().filter(|o| **o == Outcome::Allowed).count();
        assert_eq!(allowed, 1);
        assert_eq!(l.len(), 1);
        assert_eq!(l.peek_n_at(&7, Nanos::ZERO, 0).remaining(), 0);
    });
}

/// A fixed window's slot is evicted and reused for another key while a stale reader is
/// mid-decision on the old key. Limit 2 per 1,000 ns: key 4 counts one at 0 ns (window 0),
/// keys 1, 2, 3 one each at 1,000 ns (window 1), so at 1,200 ns key 4's word alone is of an
/// earlier window, and inserting key 9 must evict it, while another thread decides on key 4.
/// Exactly one of the two gets the slot; the other finds the table full. The winner has one
/// left, the loser none counted, and keys 1 to 3 are undisturbed.
#[test]
fn fixed_window_reuse_under_a_stale_reader() {
    model(|| {
        let l = table(FixedWindow::new(2, Duration::from_nanos(1_000)).unwrap());
        assert!(l.check_at(&4, Nanos::ZERO).is_allowed());
        for k in 1..=3 {
            assert!(l.check_at(&k, Nanos::new(1_000)).is_allowed());
        }
        assert_eq!(l.len(), 4);
        let stale = spawn_check(&l, 4, 1_200);
        let reuse = spawn_check(&l, 9, 1_200);
        let (four, nine) = (stale.join().unwrap(), reuse.join().unwrap());
        let left = |k: u64| l.peek_n_at(&k, Nanos::new(1_200), 0).remaining();
        let (winner, loser) = slot_winner((4, four), (9, nine));
        assert_eq!((left(winner), left(loser)), (1, 2));
        for k in 1..=3 {
            assert_eq!(left(k), 1, "key {k} was disturbed");
        }
        assert_eq!(l.len(), 4);
    });
}

/// A sliding-window decision races a sweep of the same key. Limit 2 per 1,000 ns: the key
/// counts one at 0 ns; at 2,000 ns its word is two windows old, so evictable. Either the sweep
/// wins and the decision inserts the key afresh, or the decision wins and the sweep leaves it:
/// either way the key ends with exactly one counted.
#[test]
fn sliding_window_decision_races_a_sweep() {
    model(|| {
        let l = table(SlidingWindow::new(2, Duration::from_nanos(1_000)).unwrap());
        assert!(l.check_at(&7, Nanos::ZERO).is_allowed());
        l.clock().set(Nanos::new(2_000));
        let a = spawn_check(&l, 7, 2_000);
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        assert_eq!(a.join().unwrap(), Outcome::Allowed);
        assert!(sweeper.join().unwrap() <= 1);
        assert_eq!(l.peek_n_at(&7, Nanos::new(2_000), 0).remaining(), 1);
        assert_eq!(l.len(), 1);
    });
}

/// nginx: a node's slot is reused for another key while a stale reader decides on the old
/// key. `rate=1r/s burst=1 nodelay`: key 4 spends its burst at 0 ms; keys 1, 2, 3 at 1,500 ms;
/// at 2,000 ms key 4 has leaked its excess and one request more (its line), the others have
/// not. Key 9's insert must evict key 4 while another thread decides on it: one of them gets
/// the slot, the other finds the table full, and the others' excess is untouched.
#[test]
fn nginx_reuse_under_a_stale_reader() {
    model(|| {
        let q = Nginx::per_second(1).unwrap().burst(1).unwrap().nodelay();
        let l = table(q);
        const MS: u64 = 1_000_000;
        assert!(l.check_n_at(&4, Nanos::ZERO, 2).is_allowed());
        for k in 1..=3 {
            assert!(l.check_n_at(&k, Nanos::new(1_500 * MS), 2).is_allowed());
        }
        let stale = spawn_check(&l, 4, 2_000 * MS);
        let reuse = spawn_check(&l, 9, 2_000 * MS);
        let (four, nine) = (stale.join().unwrap(), reuse.join().unwrap());
        let left = |k: u64| l.peek_n_at(&k, Nanos::new(2_000 * MS), 0).remaining();
        let (winner, loser) = slot_winner((4, four), (9, nine));
        // A new node's first request stores excess 0: the whole burst is left.
        assert_eq!((left(winner), left(loser)), (1, 1));
        assert_eq!(l.check_n_at(&winner, Nanos::new(2_000 * MS), 2).outcome(), Outcome::Denied);
        for k in 1..=3 {
            // Excess 1,000 leaked 500 by 2,000 ms: 500 left, no whole request free.
            assert_eq!(left(k), 0, "key {k} was disturbed");
        }
        assert_eq!(l.len(), 4);
    });
}

/// A keyed fixed window's refund races the eviction of its key and the reuse of its slot: the
/// policy analogue of `admit.rs`'s bucket model. Limit 2 per 1,000 ns; key 1 is charged at
/// 0 ns (window 0); at 10,000 ns keys 2, 3 and 5 count one each and key 4 arrives, evicting key
/// 1 (its word is of an old window). The refund of key 1 (`Shard::refund`, through
/// `FixedWindow::refund`) either lands on key 1 before the eviction (which then fails its CAS
/// and refuses key 4), or finds key 1 gone, or fails its CAS on key 4's word and sees key 4's
/// key: it never lands on key 4, which ends with exactly one counted.
#[test]
fn fixed_window_refund_races_eviction_and_reuse() {
    use tollgate::Admit;
    model(|| {
        let l = table(FixedWindow::new(2, Duration::from_nanos(1_000)).unwrap());
        let (_, receipt) = l.limit(&1).charge(1);
        let receipt = receipt.unwrap();
        let late = Nanos::new(10_000);
        for k in [2, 3, 5] {
            assert!(l.check_at(&k, late).is_allowed());
        }
        let four = spawn_check(&l, 4, 10_000);
        l.limit(&1).refund(receipt);
        match four.join().unwrap() {
            Outcome::Allowed => {
                assert_eq!(l.peek_n_at(&4, late, 0).remaining(), 1);
                assert_eq!(l.stats().evictions, 1, "4 took 1's slot");
            }
            Outcome::TableFull => assert_eq!(l.stats().evictions, 0),
            other => panic!("{other:?}"),
        }
        assert_eq!(l.peek_n_at(&1, late, 0).remaining(), 2, "1 is fresh again either way");
        for k in [2, 3, 5] {
            assert_eq!(l.peek_n_at(&k, late, 0).remaining(), 1, "key {k} was disturbed");
        }
    });
}

/// Issue 13, a suspected refusal, confirmed: a new nginx node whose slot's mark is above its
/// fresh word starts on a *start word*, and its first request must pass like any new node's.
/// When a thread helping the insert makes that word live first, the inserter (or another
/// thread on the same key) decided on it as on an old node seen a moment ago: its first
/// request was delayed or refused. Start words now say so themselves (a pending excess).
///
/// 1 r/s, burst 1: four keys at 0 ms fill the shard; a sweep at 2,000 ms evicts them all,
/// leaving marks above a fresh word at 0 ms; two threads whose clocks read 0 ms (before the
/// sweep) check a new key: one is admitted at once and the other delayed, in every order.
#[test]
fn nginx_first_request_passes_when_a_helper_makes_the_slot_live() {
    model(|| {
        const MS: u64 = 1_000_000;
        let l = table(Nginx::per_second(1).unwrap().burst(1).unwrap());
        for k in 1..=4 {
            assert!(l.check_at(&k, Nanos::ZERO).is_allowed());
        }
        l.clock().set(Nanos::new(2_000 * MS));
        assert_eq!(l.sweep(), 4);
        let a = spawn_check(&l, 7, 0);
        let b = spawn_check(&l, 7, 0);
        let o = [a.join().unwrap(), b.join().unwrap()];
        assert!(o.contains(&Outcome::Allowed) && o.contains(&Outcome::Delayed), "{o:?}");
    });
}

/// Issue 13, bug 3: a receipt only for a charge that stands. A new key's charge commits its
/// slot and computes its first decision; a thread inserting another key (its clock a window
/// later) helps the commit live, with nothing counted, finds it a fresh key's word and evicts
/// it; the charge's retry then finds the table full and, under `WhenFull::Allow`, admits
/// `Untracked`. Before the fix, that admission carried the receipt of the first decision,
/// which no longer stands (with skewed clocks its refund could give back units never charged).
///
/// A fixed window of 2 per 1,000 ns; keys 1 to 3 counted in window 1; the charge of key 7 on
/// the limiter's clock (0 ns, window 0) races key 9 at 1,000 ns.
#[test]
fn an_untracked_admission_carries_no_receipt() {
    use tollgate::{Admit, WhenFull};
    model(|| {
        let l = Arc::new(
            Keyed::<FixedWindow, u64>::builder(FixedWindow::new(2, Duration::from_nanos(1_000)).unwrap())
                .capacity(3)
                .shards(1)
                .when_full(WhenFull::Allow)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        for k in 1..=3 {
            assert!(l.check_at(&k, Nanos::new(1_000)).is_allowed());
        }
        let other = spawn_check(&l, 9, 1_000);
        let (d, receipt) = l.limit(&7).charge(1);
        let nine = other.join().unwrap();
        assert!(matches!(nine, Outcome::Allowed | Outcome::Untracked), "{nine:?}");
        match d.outcome() {
            Outcome::Allowed => assert!(receipt.is_some()),
            Outcome::Untracked => assert!(receipt.is_none(), "an untracked admission with a receipt"),
            other => panic!("{other:?}"),
        }
    });
}
