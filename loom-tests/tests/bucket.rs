//! The bucket's CAS loop (`src/policies/bucket/atomic.rs`, every access `Relaxed`): racing decisions on
//! one bucket never grant more than the bucket holds and never lose an update.

#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate::{Limiter, ManualClock, Nanos, Rate, TokenBucket};

use loom_tests::model;

fn spawn_checks(l: &Arc<Limiter<ManualClock>>, ops: &'static [(u64, u64)]) -> thread::JoinHandle<u64> {
    let l = Arc::clone(l);
    thread::spawn(move || {
        ops.iter().filter(|&&(at, n)| l.check_n_at(Nanos::new(at), n).is_allowed()).map(|&(_, n)| n).sum()
    })
}

/// Two threads, two decisions each, at one frozen instant, on a bucket of 3: exactly 3 tokens
/// are granted in every interleaving, and the bucket is then empty. A lost update would grant a
/// fourth; a spurious failure would leave one behind.
#[test]
fn frozen_instant_grants_exactly_the_level() {
    model(|| {
        let q = TokenBucket::new(Rate::per_second(1), 3).unwrap();
        let l = Arc::new(Limiter::with_clock(q, ManualClock::new()));
        let a = spawn_checks(&l, &[(0, 1), (0, 1)]);
        let b = spawn_checks(&l, &[(0, 1), (0, 1)]);
        let granted = a.join().unwrap() + b.join().unwrap();
        assert_eq!(granted, 3);
        assert_eq!(l.peek_n_at(Nanos::ZERO, 0).remaining(), 0);
    });
}

/// Refills between decisions, clocks out of order between threads: 1 token per 10 ns, an
/// empty bucket with room for 10, decisions at 0..=30 ns. Without the cap in play, every grant
/// moves the stamp by exactly its cost, so `granted + level(30 ns) = 3` in every interleaving
/// (conservation), and `granted ≤ 3` (the bound `burst·0 + floor(rate·30 ns)` from empty).
#[test]
fn refill_between_decisions_conserves_tokens() {
    model(|| {
        let q = TokenBucket::new(Rate::per(1, std::time::Duration::from_nanos(10)), 10).unwrap();
        let l = Arc::new(Limiter::with_clock(q.with_initial(0).unwrap(), ManualClock::new()));
        let a = spawn_checks(&l, &[(12, 1), (30, 1)]);
        let b = spawn_checks(&l, &[(25, 2), (10, 1)]);
        let granted = a.join().unwrap() + b.join().unwrap();
        let left = l.peek_n_at(Nanos::new(30), 0).remaining();
        assert!(granted <= 3);
        assert_eq!(granted + left, 3);
    });
}

/// Three threads race for a bucket of 2 at one instant: exactly 2 win.
#[test]
fn three_threads_two_tokens() {
    model(|| {
        let q = TokenBucket::new(Rate::per_second(1), 2).unwrap();
        let l = Arc::new(Limiter::with_clock(q, ManualClock::new()));
        let hs: Vec<_> = (0..3).map(|_| spawn_checks(&l, &[(0, 1)])).collect();
        let granted: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(granted, 2);
    });
}

/// A quota replaced while decisions run (`Direct::set_policy`: a sequence-locked cell and a
/// `changed` flag, `src/engine/config.rs`): each decision uses the old quota or the new one,
/// whole. Burst 2 becoming burst 1 at one instant: both decisions under the old quota grant 2,
/// the first under the old and the second under the new also 2 (the empty instant is kept),
/// both under the new 1; never more, and the limiter ends under the new quota.
#[test]
fn a_quota_replaced_under_decisions() {
    model(|| {
        let q = |burst| TokenBucket::new(Rate::per_second(1), burst).unwrap();
        let built = q(2).with_max_fill_time(std::time::Duration::from_secs(2)).unwrap();
        let l = Arc::new(Limiter::with_clock(built, ManualClock::new()));
        let writer = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.set_policy(q(1)).unwrap())
        };
        let granted = spawn_checks(&l, &[(0, 1), (0, 1)]).join().unwrap();
        writer.join().unwrap();
        assert!((1..=2).contains(&granted), "granted {granted}");
        assert_eq!(l.policy().burst(), 1);
        assert!(l.peek_n_at(Nanos::ZERO, 0).remaining() <= 1);
    });
}
