//! The Rust side of the C ABI's benchmark: the loops of `bench/abi.c`, through tollgate's Rust
//! API. Run both with `bash integrations/tollgate-ffi/bench/run.sh`.

use std::hint::black_box;
use std::time::Instant;

use tollgate::{KeyedLimiter, Limiter, Nanos, TokenBucket};

/// Decisions per loop: 20 M, or `ABI_BENCH_N` (a small count for a callgrind run).
fn decisions() -> u64 {
    std::env::var("ABI_BENCH_N").ok().and_then(|n| n.parse().ok()).unwrap_or(20_000_000)
}

fn row(name: &str, started: Instant, sink: u64) {
    let ns = started.elapsed().as_secs_f64() * 1e9 / decisions() as f64;
    println!("{name:<36} {ns:7.2} ns/decision  ({sink})");
}

/// Every field of the C decision, folded into one number.
fn fields(d: &tollgate::Decision) -> u64 {
    let retry = d.retry_after_nanos().map_or(u64::MAX, |n| n.as_u64());
    let delay = u64::try_from(d.delay().as_nanos()).unwrap_or(u64::MAX);
    u64::from(d.is_allowed_now()) ^ d.remaining() ^ retry ^ d.reset_after_nanos().as_u64() ^ delay
}

/// What `tollgate_*_try_n` returns: the outcome and the one wait (retry-after, or delay).
fn outcome_and_wait(d: &tollgate::Decision) -> u64 {
    (d.outcome() as u64) ^ d.wait_nanos().map_or(u64::MAX, |n| n.as_u64())
}

// Each loop is its own function, so that a callgrind run counts each one's instructions.

#[inline(never)]
fn allowed(l: &Limiter, n: u64) -> u64 {
    (0..n).map(|_| u64::from(black_box(l).check().is_allowed_now())).sum()
}

#[inline(never)]
fn keyed_allowed(k: &KeyedLimiter<u64>, n: u64) -> u64 {
    (0..n)
        .map(|i| u64::from(black_box(k).check_n_at(&(i & 1023), Nanos::new(1000), 1).is_allowed_now()))
        .sum()
}

#[inline(never)]
fn every_field(l: &Limiter, n: u64) -> u64 {
    (0..n).map(|_| fields(&black_box(l).check())).fold(0, u64::wrapping_add)
}

#[inline(never)]
fn keyed_every_field(k: &KeyedLimiter<u64>, n: u64) -> u64 {
    (0..n)
        .map(|i| fields(&black_box(k).check_n_at(&(i & 1023), Nanos::new(1000), 1)))
        .fold(0, u64::wrapping_add)
}

#[inline(never)]
fn with_wait(l: &Limiter, n: u64) -> u64 {
    (0..n).map(|_| outcome_and_wait(&black_box(l).check())).fold(0, u64::wrapping_add)
}

#[inline(never)]
fn keyed_allowed_now(k: &KeyedLimiter<u64>, n: u64) -> u64 {
    (0..n).map(|i| u64::from(black_box(k).check(&(i & 1023)).is_allowed_now())).sum()
}

#[inline(never)]
fn keyed_with_wait(k: &KeyedLimiter<u64>, n: u64) -> u64 {
    (0..n).map(|i| outcome_and_wait(&black_box(k).check(&(i & 1023)))).fold(0, u64::wrapping_add)
}

fn main() {
    let q = |s: &str| s.parse::<TokenBucket>().unwrap();
    let allow = Limiter::new(q("1000000000/s burst=1000000000"));
    let deny = Limiter::new(q("1/h"));
    let keyed: KeyedLimiter<u64> = KeyedLimiter::new(q("1/h"), 4096).unwrap();
    let n = decisions();
    for _ in 0..3 {
        let t = Instant::now();
        row("direct check, allow", t, allowed(&allow, n));
        let t = Instant::now();
        row("direct check, deny", t, allowed(&deny, n));
        let t = Instant::now();
        row("keyed 1K check_n_at, deny", t, keyed_allowed(&keyed, n));
        // The same, reading every field the C struct carries (the ABI converts them all).
        let t = Instant::now();
        row("direct check, allow, fields", t, every_field(&allow, n));
        let t = Instant::now();
        row("direct check, deny, fields", t, every_field(&deny, n));
        let t = Instant::now();
        row("keyed 1K check_n_at, deny, fields", t, keyed_every_field(&keyed, n));
        // What the `_try` functions return: the outcome and the wait.
        let t = Instant::now();
        row("direct try, allow", t, with_wait(&allow, n));
        let t = Instant::now();
        row("direct try, deny", t, with_wait(&deny, n));
        let t = Instant::now();
        row("keyed 1K try, deny", t, keyed_with_wait(&keyed, n));
        let t = Instant::now();
        row("keyed 1K check, deny", t, keyed_allowed_now(&keyed, n));
    }
}
