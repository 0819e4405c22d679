//! Fixed window on `Direct`'s CAS loop (`src/policies/policy.rs`, every access `Relaxed`): racing
//! requests within one window are admitted exactly `limit` times, and a rollover racing a
//! decision in the old window neither loses the new window's count nor lets the old one leak in.

#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use tollgate::{FixedWindow, FixedWindowLimiter, ManualClock, Nanos};

fn spawn_at(l: &Arc<FixedWindowLimiter<ManualClock>>, times: &'static [u64]) -> thread::JoinHandle<u64> {
    let l = Arc::clone(l);
    thread::spawn(move || times.iter().filter(|&&t| l.check_at(Nanos::new(t)).is_allowed()).count() as u64)
}

/// Limit 3 per 10 ns, 4 attempts in window 0: exactly 3 pass.
#[test]
fn one_window_admits_exactly_the_limit() {
    model(|| {
        let l = Arc::new(FixedWindowLimiter::with_clock(
            FixedWindow::new(3, Duration::from_nanos(10)).unwrap(),
            ManualClock::new(),
        ));
        let a = spawn_at(&l, &[1, 2]);
        let b = spawn_at(&l, &[3, 4]);
        assert_eq!(a.join().unwrap() + b.join().unwrap(), 3);
    });
}

/// Limit 1 per 10 ns: one thread decides late in window 0 while the other opens window 1. Each
/// window admits at most one, and window 1's grant is never overwritten by a window-0 write.
#[test]
fn rollover_race() {
    model(|| {
        let l = Arc::new(FixedWindowLimiter::with_clock(
            FixedWindow::new(1, Duration::from_nanos(10)).unwrap(),
            ManualClock::new(),
        ));
        let a = spawn_at(&l, &[9, 9]);
        let b = spawn_at(&l, &[10, 10]);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a <= 1 && b <= 1);
        assert_eq!(b, 1, "window 1 starts empty whatever window 0 did");
        // Afterwards window 1 is spent.
        assert!(!l.check_at(Nanos::new(11)).is_allowed());
    });
}

/// Refusals counted (`charging_refusals`), limit 2 per 10 ns: two threads ask twice each in
/// window 0. Whatever the interleaving of the CASes (a refusal's store racing an admission's),
/// exactly 2 are admitted: a counted refusal never takes an admission's place nor makes room
/// for another.
#[test]
fn refusals_are_counted_exactly_once() {
    model(|| {
        let l = Arc::new(FixedWindowLimiter::with_clock(
            FixedWindow::new(2, Duration::from_nanos(10)).unwrap().charging_refusals(),
            ManualClock::new(),
        ));
        let a = spawn_at(&l, &[1, 2]);
        let b = spawn_at(&l, &[3, 4]);
        assert_eq!(a.join().unwrap() + b.join().unwrap(), 2);
        let d = l.check_at(Nanos::new(5));
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
    });
}

/// The sliding-window counter on the same loop: limit 2 per 10 ns; two threads decide at the end
/// of window 0 and the start of window 1. The stored index never moves back, so window 1 always
/// sees window 0's grants as its previous count: at most 2 are admitted in total here (at δ = 0
/// of window 1 the previous window still weighs fully).
#[test]
fn sliding_rollover_race() {
    use tollgate::{SlidingWindow, SlidingWindowLimiter};
    model(|| {
        let q = SlidingWindow::new(2, Duration::from_secs(1)).unwrap();
        let l = Arc::new(SlidingWindowLimiter::with_clock(q, ManualClock::new()));
        let t0 = 999_999_999; // last ns of window 0
        let t1 = 1_000_000_000; // first ns of window 1
        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || (0..2).filter(|_| l.check_at(Nanos::new(t0)).is_allowed()).count())
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || (0..2).filter(|_| l.check_at(Nanos::new(t1)).is_allowed()).count())
        };
        let total = a.join().unwrap() + b.join().unwrap();
        assert!(total <= 2, "{total} admitted within 1 ns across a boundary, limit 2");
    });
}
