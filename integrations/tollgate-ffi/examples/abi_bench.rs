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
    }
}
