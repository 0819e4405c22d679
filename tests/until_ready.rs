//! Async waiting (`until_ready`, the `tokio` feature): no double charge, cancel-safety, and no
//! over-admission when futures are dropped at random points inside `select!`, on the
//! current-thread and the multi-thread runtime.

#![cfg(feature = "tokio")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::{Clock, KeyedLimiter, Limiter, ManualClock, Nanos, ReserveError, TokenBucket, TscClock};

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

/// What the random-drop test waits on: the direct bucket, or two keys of a keyed table.
enum Subject {
    Direct(Limiter<TscClock>),
    Keyed(KeyedLimiter<u64, TscClock>),
}

impl Subject {
    async fn until_ready(&self, key: u64) -> Result<Nanos, ReserveError> {
        match self {
            Subject::Direct(l) => l.until_ready().await,
            Subject::Keyed(l) => l.until_ready(&key).await,
        }
    }

    fn remaining(&self, key: u64) -> u64 {
        match self {
            Subject::Direct(l) => l.peek().remaining(),
            Subject::Keyed(l) => l.peek(&key).remaining(),
        }
    }
}

/// Tasks wait for tokens and give up at random points (a `select!` against a random timeout).
/// The completed waits of each key, counted at their due instants, never exceed
/// `burst + floor(rate·span)` over any span: dropping futures never over-admits.
fn random_drops(runtime: tokio::runtime::Runtime, keyed: bool) {
    // 2,000 per second (0.5 ms per token, exact in units), burst 4.
    let q = TokenBucket::per_second(2_000).unwrap().with_burst(4).unwrap();
    let l = Arc::new(if keyed {
        Subject::Keyed(KeyedLimiter::builder(q).capacity(16).build_with_clock(TscClock::new()).unwrap())
    } else {
        Subject::Direct(Limiter::with_clock(q, TscClock::new()))
    });
    let keys = if keyed { 2 } else { 1 };
    let done = Arc::new(Mutex::new(Vec::<(u64, Nanos)>::new()));
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let (l, done) = (Arc::clone(&l), Arc::clone(&done));
            tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ task;
                let key = task % keys;
                for _ in 0..40 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let patience = Duration::from_micros(x % 3_000);
                    tokio::select! {
                        due = l.until_ready(key) => {
                            if let Ok(due) = due {
                                done.lock().unwrap().push((key, due));
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
    let done = done.lock().unwrap().clone();
    for key in 0..keys {
        let mut due: Vec<Nanos> = done.iter().filter(|(k, _)| *k == key).map(|&(_, d)| d).collect();
        due.sort();
        assert!(!due.is_empty());
        for i in 0..due.len() {
            for (k, d) in due[i..].iter().enumerate() {
                let span = d.as_u64() - due[i].as_u64();
                let bound = 4 + span / 500_000;
                assert!(
                    (k as u64 + 1) <= bound,
                    "key {key}: {} tokens due within {span} ns, bound {bound}",
                    k + 1
                );
            }
        }
    }
    // Nothing is left owed beyond a fill: the buckets refill to full.
    std::thread::sleep(Duration::from_millis(5));
    for key in 0..keys {
        assert_eq!(l.remaining(key), 4);
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap()
}

#[test]
fn random_drops_never_over_admit_current_thread() {
    random_drops(current_thread(), false);
}

#[test]
fn random_drops_never_over_admit_multi_thread() {
    random_drops(multi_thread(), false);
}

#[test]
fn keyed_random_drops_never_over_admit_current_thread() {
    random_drops(current_thread(), true);
}

#[test]
fn keyed_random_drops_never_over_admit_multi_thread() {
    random_drops(multi_thread(), true);
}

/// Per key: a dropped wait gives its key's token back, and another key is untouched.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_keyed_wait_gives_its_tokens_back() {
    let q = TokenBucket::per_second(10).unwrap().with_burst(1).unwrap();
    let l = KeyedLimiter::<str>::builder(q).capacity(16).build_with_clock(ManualClock::new()).unwrap();
    assert!(l.allow("a"));
    tokio::select! {
        biased;
        _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        _ = l.until_ready("a") => panic!("the manual clock never reaches the due time"),
    }
    // Cancelled: the next token of "a" is due when it was before, 100 ms from now.
    assert_eq!(l.peek("a").retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(l.until_ready("b").await.unwrap(), l.clock().now());
    assert_eq!(l.peek("b").remaining(), 0);
}
