//! The configuration strings of the core (`"10/s burst=20"`, `"10r/s burst=20 nodelay"`,
//! `"100/min"`, `"10/s burst=1 queue=20"`, ...), parsed from any text (bytes that are not UTF-8
//! are read lossily) as every configuration type: `TokenBucket`, `Queued`, `Nginx`,
//! `FixedWindow`, `SlidingWindow`, `SlidingLog`. None of them implements `Display`, so the
//! round trip goes through a canonical string written from the public accessors (rates and
//! windows in `ns`; nginx's `delay=`/`nodelay`, which no accessor shows, carried over as
//! written). Checks: nothing panics; every refusal has a message; what parses round-trips
//! through its canonical string to an equal value; and the same words with their spacing
//! normalized parse to the same result (or error).

#![no_main]

use std::fmt::Debug;
use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use tollgate::{FixedWindow, Nginx, ParseError, Queued, SlidingLog, SlidingWindow, TokenBucket};

/// Parses `s` as `T`: the same result from the normalized spacing, a message for a refusal,
/// and, for a value, `canonical` of it parses back to it.
fn check<T>(s: &str, canonical: impl Fn(&T) -> String)
where
    T: FromStr<Err = ParseError> + PartialEq + Debug,
{
    let got = s.parse::<T>();
    let spaced = s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(spaced.parse::<T>(), got, "{s:?} and {spaced:?} parse differently");
    match got {
        Err(e) => assert!(!e.to_string().is_empty(), "{e:?} has no message"),
        Ok(x) => {
            let text = canonical(&x);
            assert_eq!(text.parse::<T>().as_ref(), Ok(&x), "{s:?} written as {text:?}");
        }
    }
}

fn bucket(q: &TokenBucket) -> String {
    let rate = q.rate();
    format!("{}/{}ns burst={} initial={}", rate.tokens(), rate.period().as_nanos(), q.burst(), q.initial())
}

fn nginx(s: &str, n: &Nginx) -> String {
    let mrps = n.millirequests_per_second();
    // `N r/m` is `N·1000/60` truncated: the least N that gives it.
    let rate = if mrps % 1000 == 0 {
        format!("{}r/s", mrps / 1000)
    } else {
        format!("{}r/m", (mrps * 60).div_ceil(1000))
    };
    let mut text = format!("{rate} burst={}", n.burst_size());
    for word in s.split_whitespace().skip(1) {
        if word == "nodelay" || word.starts_with("delay=") {
            text.push(' ');
            text.push_str(word);
        }
    }
    text
}

fn window(limit: u64, window: std::time::Duration) -> String {
    format!("{limit}/{}ns", window.as_nanos())
}

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let s = &*s;
    check::<TokenBucket>(s, bucket);
    check::<Queued>(s, |q| match q.max_queued() {
        Some(n) => format!("{} queue={n}", bucket(&q.bucket())),
        None => format!("{} queue={}ns", bucket(&q.bucket()), q.max_wait().as_nanos()),
    });
    check::<Nginx>(s, |n| nginx(s, n));
    check::<FixedWindow>(s, |w| window(w.limit(), w.window()));
    check::<SlidingWindow>(s, |w| window(w.limit(), w.window()));
    check::<SlidingLog>(s, |w| window(w.limit(), w.window()));
});
