//! The Rust side of the C ABI's benchmark: the loops of `bench/abi.c`, through tollgate's Rust
//! API. Run both with `bash integrations/tollgate-ffi/bench/run.sh`.

use std::hint::black_box;
use std::time::Instant;

use tollgate::{KeyedLimiter, Limiter, Nanos, TokenBucket};

const N: u64 = 20_000_000;

fn row(name: &str, started: Instant, sink: u64) {
    let ns = started.elapsed().as_secs_f64() * 1e9 / N as f64;
    println!("{name:<28} {ns:7.2} ns/decision  ({sink})");
}

/// Every field of the C decision, folded into one number.
fn fields(d: &tollgate::Decision) -> u64 {
    let retry = d.retry_after_nanos().map_or(u64::MAX, |n| n.as_u64());
    let delay = u64::try_from(d.delay().as_nanos()).unwrap_or(u64::MAX);
    u64::from(d.is_allowed_now()) ^ d.remaining() ^ retry ^ d.reset_after_nanos().as_u64() ^ delay
}

fn main() {
    let q = |s: &str| s.parse::<TokenBucket>().unwrap();
    let allow = Limiter::new(q("1000000000/s burst=1000000000"));
    let deny = Limiter::new(q("1/h"));
    let keyed: KeyedLimiter<u64> = KeyedLimiter::new(q("1/h"), 4096).unwrap();
    for _ in 0..3 {
        let (mut sink, t) = (0u64, Instant::now());
        for _ in 0..N {
            sink += u64::from(black_box(&allow).check().is_allowed_now());
        }
        row("direct check, allow", t, sink);
        let (mut sink, t) = (0u64, Instant::now());
        for _ in 0..N {
            sink += u64::from(black_box(&deny).check().is_allowed_now());
        }
        row("direct check, deny", t, sink);
        let (mut sink, t) = (0u64, Instant::now());
        for i in 0..N {
            sink +=
                u64::from(black_box(&keyed).check_n_at(&(i & 1023), Nanos::new(1000), 1).is_allowed_now());
        }
        row("keyed 1K check_n_at, deny", t, sink);
        // The same, reading every field the C struct carries (the ABI converts them all).
        let (mut sink, t) = (0u64, Instant::now());
        for _ in 0..N {
            sink += fields(&black_box(&allow).check());
        }
        row("direct check, allow, fields", t, sink);
        let (mut sink, t) = (0u64, Instant::now());
        for _ in 0..N {
            sink += fields(&black_box(&deny).check());
        }
        row("direct check, deny, fields", t, sink);
    }
}
