//! Async waiting (`until_ready`, the `tokio` feature): no double charge, cancel-safety, and no
//! over-admission when futures are dropped at random points inside `select!`, on the
//! current-thread and the multi-thread runtime.

#![cfg(feature = "tokio")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::{Clock, Limiter, ManualClock, Nanos, TokenBucket, TscClock};

/// governor#196: awaiting readiness and then checking took the tokens twice. `until_ready`
/// takes them once, and says so: the caller does not check again.
#[tokio::test(flavor = "current_thread")]
async fn until_ready_takes_the_tokens_once() {
    let l =
        Limiter::with_clock(TokenBucket::per_second(10).unwrap().with_burst(2).unwrap(), ManualClock::new());
    let due = l.until_ready().await.unwrap();
    assert_eq!(due, l.clock().now());
    assert_eq!(l.peek().remaining(), 1);
}

/// A future dropped before its tokens are due gives them back (it was the latest reservation).
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_wait_gives_its_tokens_back() {
    let l = Limiter::with_clock(TokenBucket::per_second(10).unwrap().with_burst(1).unwrap(), TscClock::new());
    assert!(l.allow());
    let before = l.peek().retry_after().unwrap();
    tokio::select! {
        biased;
        _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        _ = l.until_ready() => panic!("due in ~100 ms, not within 5 ms"),
    }
    // The reservation was cancelled: the next token is as far as before, less the time passed.
    let after = l.peek().retry_after().unwrap();
    assert!(after <= before, "{after:?} > {before:?}: the dropped wait kept its token");
    // And a reservation made now is due when that token is, not one token later.
    let r = l.reserve().unwrap();
    assert!(r.delay() <= before);
    let _ = l.cancel(r);
}

/// Tasks wait for tokens and give up at random points (a `select!` against a random timeout).
/// The completed waits, counted at their due instants, never exceed `burst + floor(rate·span)`
/// over any span: dropping futures never over-admits.
fn random_drops(runtime: tokio::runtime::Runtime) {
    // 2,000 per second (0.5 ms per token, exact in units), burst 4.
    let l = Arc::new(Limiter::with_clock(
        TokenBucket::per_second(2_000).unwrap().with_burst(4).unwrap(),
        TscClock::new(),
    ));
    let done = Arc::new(Mutex::new(Vec::<Nanos>::new()));
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let (l, done) = (Arc::clone(&l), Arc::clone(&done));
            tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ task;
                for _ in 0..40 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let patience = Duration::from_micros(x % 3_000);
                    tokio::select! {
                        due = l.until_ready() => {
                            if let Ok(due) = due {
                                done.lock().unwrap().push(due);
                            }
                        }
                        _ = tokio::time::sleep(patience) => {}
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let mut due = done.lock().unwrap().clone();
    due.sort();
    assert!(!due.is_empty());
    for i in 0..due.len() {
        for (k, d) in due[i..].iter().enumerate() {
            let span = d.as_u64() - due[i].as_u64();
            let bound = 4 + span / 500_000;
            assert!((k as u64 + 1) <= bound, "{} tokens due within {span} ns, bound {bound}", k + 1);
        }
    }
    // Nothing is left owed beyond a fill: the bucket refills to full.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(l.peek().remaining(), 4);
}

#[test]
fn random_drops_never_over_admit_current_thread() {
    random_drops(tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap());
}

#[test]
fn random_drops_never_over_admit_multi_thread() {
    random_drops(
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap(),
    );
}
