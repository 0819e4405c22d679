//! The direct (single-bucket) limiter against its floor and against governor, in one run.
//!
//! * `floor`: one clock read (the same `TscClock` read tollgate does) plus one uncontended
//!   load + CAS on a local `AtomicU64`: the least any clocked lock-free limiter can cost.
//! * `allow-heavy`: a quota that never runs out. `deny-heavy`: one token per hour, spent.
//! * `2-threads`: every core hammers one shared bucket; time per decision per thread.
//!
//! ```sh
//! cargo bench --bench direct
//! python3 scripts/criterion_table.py direct
//! ```

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod workloads;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate::{
    CoarseClock, FixedWindow, FixedWindowLimiter, Limiter, Nginx, NginxLimiter, Rate, SlidingWindow,
    SlidingWindowLimiter, TokenBucket, TscClock,
};
use workloads::{floor_step, on_all_cores};

fn allow_heavy() -> TokenBucket {
    TokenBucket::new(Rate::per_second(10_000_000_000), TokenBucket::MAX_BURST).unwrap()
}

fn deny_heavy() -> TokenBucket {
    TokenBucket::per_hour(1).unwrap()
}

fn governor_allow() -> governor::DefaultDirectRateLimiter {
    governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX))
}

fn governor_deny() -> governor::DefaultDirectRateLimiter {
    governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::MIN))
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct/1-thread");
    g.throughput(Throughput::Elements(1));

    let clock = TscClock::new();
    let word = AtomicU64::new(0);
    g.bench_function("floor", |b| b.iter(|| floor_step(&clock, &word)));
    let coarse = CoarseClock::new().unwrap();
    g.bench_function("floor-coarse", |b| b.iter(|| floor_step(&coarse, &word)));

    let l = Limiter::new(allow_heavy());
    g.bench_function("tollgate/allow-heavy", |b| b.iter(|| black_box(l.check())));
    g.bench_function("tollgate-bool/allow-heavy", |b| b.iter(|| black_box(l.allow())));
    let l = Limiter::with_clock(allow_heavy(), CoarseClock::new().unwrap());
    g.bench_function("tollgate-coarse/allow-heavy", |b| b.iter(|| black_box(l.check())));
    let gov = governor_allow();
    g.bench_function("governor/allow-heavy", |b| b.iter(|| black_box(gov.check())));
    // nginx `limit_req` at a rate it never reaches (1e9 r/s, burst 16,776, nodelay).
    let nginx = NginxLimiter::new(Nginx::per_second(1_000_000_000).unwrap().burst(16_776).unwrap().nodelay());
    g.bench_function("tollgate-nginx/allow-heavy", |b| b.iter(|| black_box(nginx.check())));
    // Fixed window: the largest limit per 100 ms (167M/s: never reached at ~50M decisions/s).
    let fixed = FixedWindowLimiter::new(
        FixedWindow::new(FixedWindow::MAX_LIMIT, Duration::from_millis(100)).unwrap(),
    );
    g.bench_function("tollgate-fixed-window/allow-heavy", |b| b.iter(|| black_box(fixed.check())));
    // Sliding window: 31 per 200 ns (155M/s, never reached). The largest limit, 2^20 − 1, needs
    // windows of 188 s or more for a 100-year lifetime, and would be reached within 30 ms.
    let sliding = SlidingWindowLimiter::new(SlidingWindow::new(31, Duration::from_nanos(200)).unwrap());
    g.bench_function("tollgate-sliding-window/allow-heavy", |b| b.iter(|| black_box(sliding.check())));

    let l = Limiter::new(deny_heavy());
    let _ = l.check();
    g.bench_function("tollgate/deny-heavy", |b| b.iter(|| black_box(l.check())));
    let l = Limiter::with_clock(deny_heavy(), CoarseClock::new().unwrap());
    let _ = l.check();
    g.bench_function("tollgate-coarse/deny-heavy", |b| b.iter(|| black_box(l.check())));
    let gov = governor_deny();
    let _ = gov.check();
    g.bench_function("governor/deny-heavy", |b| b.iter(|| black_box(gov.check())));
    let nginx = NginxLimiter::new(Nginx::per_minute(1).unwrap());
    let _ = nginx.check();
    g.bench_function("tollgate-nginx/deny-heavy", |b| b.iter(|| black_box(nginx.check())));
    let fixed = FixedWindowLimiter::new(FixedWindow::new(1, Duration::from_secs(3600)).unwrap());
    let _ = fixed.check();
    g.bench_function("tollgate-fixed-window/deny-heavy", |b| b.iter(|| black_box(fixed.check())));
    let sliding = SlidingWindowLimiter::new(SlidingWindow::new(1, Duration::from_secs(3600)).unwrap());
    let _ = sliding.check();
    g.bench_function("tollgate-sliding-window/deny-heavy", |b| b.iter(|| black_box(sliding.check())));
    g.finish();
}

fn all_cores(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct/all-cores-one-bucket");
    g.throughput(Throughput::Elements(1));
    let clock = TscClock::new();
    let word = AtomicU64::new(0);
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| on_all_cores(iters, &|_, _| floor_step(&clock, &word)))
    });
    let l = Limiter::new(allow_heavy());
    g.bench_function("tollgate/allow-heavy", |b| {
        b.iter_custom(|iters| {
            on_all_cores(iters, &|_, _| {
                let _ = black_box(l.check());
            })
        })
    });
    let gov = governor_allow();
    g.bench_function("governor/allow-heavy", |b| {
        b.iter_custom(|iters| {
            on_all_cores(iters, &|_, _| {
                let _ = black_box(gov.check());
            })
        })
    });
    let l = Limiter::new(deny_heavy());
    let _ = l.check();
    g.bench_function("tollgate/deny-heavy", |b| {
        b.iter_custom(|iters| {
            on_all_cores(iters, &|_, _| {
                let _ = black_box(l.check());
            })
        })
    });
    let gov = governor_deny();
    let _ = gov.check();
    g.bench_function("governor/deny-heavy", |b| {
        b.iter_custom(|iters| {
            on_all_cores(iters, &|_, _| {
                let _ = black_box(gov.check());
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40);
    targets = one_thread, all_cores
}
criterion_main!(benches);
