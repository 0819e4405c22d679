//! `CoarseClock` keeps time on its own: another component that started quanta's upkeep thread
//! and later stops it must not stop tollgate's time (issue 13). Its own process: the upkeep
//! threads are process-wide, and this must be the first code in it to start one.

#![cfg(feature = "quanta")]

use std::time::{Duration, Instant};

use tollgate::{Clock, CoarseClock, Limiter, TokenBucket};

/// Waits until `clock` reads past `after`, for at most 5 s (a loaded machine may deschedule the
/// upkeep thread for a while; it must move eventually).
fn advances(clock: &CoarseClock, after: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if clock.now().as_u64() > after {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn time_goes_on_when_another_upkeep_stops() {
    // Another component runs quanta's upkeep first, then drops its handle (stopping it).
    let theirs = quanta::Upkeep::new(Duration::from_millis(1)).start().expect("quanta's upkeep");
    let clock = CoarseClock::new().expect("a coarse clock");
    let limiter = Limiter::with_clock(TokenBucket::per_second(1000).unwrap(), clock.clone());
    drop(theirs);
    std::thread::sleep(Duration::from_millis(20));

    let t = clock.now().as_u64();
    assert!(advances(&clock, t), "the coarse clock stopped with the other component's upkeep");

    // And a limiter on it refills: drain it, then it admits again.
    while limiter.allow() {}
    let deadline = Instant::now() + Duration::from_secs(5);
    while !limiter.allow() {
        assert!(Instant::now() < deadline, "a drained bucket on the coarse clock never refilled");
        std::thread::sleep(Duration::from_millis(2));
    }
}
