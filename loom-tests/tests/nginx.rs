//! nginx `limit_req`'s CAS loop (`src/policies/nginx.rs`, every access `Relaxed`): racing requests at one
//! instant are admitted exactly `1 + burst` times, whatever the interleaving, including the race
//! for a key's first request (the "new node" word 0).

#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use tollgate::{ManualClock, Nanos, Nginx, NginxLimiter};

fn spawn_requests(l: &Arc<NginxLimiter<ManualClock>>, n: usize) -> thread::JoinHandle<usize> {
    let l = Arc::clone(l);
    thread::spawn(move || (0..n).filter(|_| l.check_at(Nanos::ZERO).is_allowed()).count())
}

/// `rate=1r/s burst=2`: the first request and two more are admitted (delayed), the rest rejected.
#[test]
fn frozen_instant_admits_one_plus_burst() {
    model(|| {
        let q = Nginx::per_second(1).unwrap().burst(2).unwrap();
        let l = Arc::new(NginxLimiter::with_clock(q, ManualClock::new()));
        let a = spawn_requests(&l, 2);
        let b = spawn_requests(&l, 2);
        assert_eq!(a.join().unwrap() + b.join().unwrap(), 3);
    });
}

/// Two first requests race on a new key: exactly one sees the empty state; with no burst, the
/// other is rejected.
#[test]
fn first_request_race() {
    model(|| {
        let q = Nginx::per_second(1).unwrap();
        let l = Arc::new(NginxLimiter::with_clock(q, ManualClock::new()));
        let a = spawn_requests(&l, 1);
        let b = spawn_requests(&l, 1);
        assert_eq!(a.join().unwrap() + b.join().unwrap(), 1);
    });
}
