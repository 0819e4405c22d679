//! Multi-limit admission (`src/admit.rs`): charges in order, refunds on a refusal. Every CAS is
//! `Relaxed` (the charge's in `src/bucket/atomic.rs` and `src/policy.rs`, the refunds beside
//! them). At a frozen clock a refund is exact, so every limit ends having spent exactly one
//! unit per admitted request, whatever the interleaving: nothing refused is ever charged, and
//! nothing admitted is ever refunded.

#![cfg(tollgate_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{check_all, Admit, FixedWindow, FixedWindowLimiter, Limiter, ManualClock, Quota, Rate};

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
        let q = |burst| Quota::new(Rate::per_second(1), burst).unwrap();
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
        let q = Quota::new(Rate::per_second(1), 2).unwrap();
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
