//! The `pacing` workload: how precisely a load generator's threads hit a shared schedule.
//! Two threads (or tasks) share a target rate for a fixed time; each send records
//! `actual − intended` (the send-time error). The waits compared: tollgate's `Pacer::next`
//! (sleep, then spin the last 100 µs), the same slots waited with plain `thread::sleep`, and
//! with tokio's `sleep`; governor's `until_ready` is the peer, its intended times being the
//! ideal schedule at the target rate in the order sends returned. The floor is a bare spin on
//! the TSC to per-thread slots: the host's own error. The achieved rate counts the
//! sends done within the run: a slot sent late, after it, does not count.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tollgate::{Clock, Nanos, Pacer, Rate, TscClock};

/// One way of waiting, measured.
#[derive(Debug, Clone, Serialize)]
pub struct PacingRow {
    pub method: String,
    pub threads: usize,
    pub target_per_sec: u64,
    pub seconds: f64,
    pub sent: u64,
    pub achieved_per_sec: f64,
    /// Send-time error (actual − intended), µs.
    pub error_p50_us: f64,
    pub error_p99_us: f64,
    pub error_p999_us: f64,
    pub error_max_us: f64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn row(method: &str, threads: usize, rate: u64, seconds: f64, sent: u64, h: &Histogram<u64>) -> PacingRow {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    PacingRow {
        method: method.into(),
        threads,
        target_per_sec: rate,
        seconds,
        sent,
        achieved_per_sec: sent as f64 / seconds,
        error_p50_us: us(0.5),
        error_p99_us: us(0.99),
        error_p999_us: us(0.999),
        error_max_us: h.max() as f64 / 1e3,
    }
}

/// Runs `threads` OS threads on one pacer until `seconds` have passed; `wait` waits for a slot
/// its own way and returns when it sent.
fn threaded(
    method: &str,
    threads: usize,
    rate: u64,
    seconds: f64,
    wait: fn(&Pacer<TscClock>) -> (Nanos, Nanos),
) -> PacingRow {
    let clock = TscClock::new();
    let pacer = Arc::new(Pacer::with_clock(Rate::per_second(rate), clock.clone()).expect("a valid rate"));
    let end = clock.now().as_u64() + (seconds * 1e9) as u64;
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let pacer = Arc::clone(&pacer);
            std::thread::spawn(move || {
                crate::driver::pin_to(i);
                let (mut h, mut sent) = (histogram(), 0u64);
                loop {
                    let (intended, actual) = wait(&pacer);
                    if intended.as_u64() >= end {
                        return (h, sent);
                    }
                    h.saturating_record(actual.as_u64().saturating_sub(intended.as_u64()).max(1));
                    // Achieved: sends done within the run (a late slot sent after it does not count).
                    sent += u64::from(actual.as_u64() <= end);
                }
            })
        })
        .collect();
    let (h, sent) = join_threads(handles);
    row(method, threads, rate, seconds, sent, &h)
}

/// Sums the threads' histograms and counts.
fn join_threads(handles: Vec<std::thread::JoinHandle<(Histogram<u64>, u64)>>) -> (Histogram<u64>, u64) {
    let (mut h, mut sent) = (histogram(), 0);
    for t in handles {
        let (th, n) = t.join().expect("a pacing thread");
        h.add(th).expect("same bounds");
        sent += n;
    }
    (h, sent)
}

fn spin_then_sleep(p: &Pacer<TscClock>) -> (Nanos, Nanos) {
    let due = p.next();
    (due, p.clock().now())
}

fn plain_sleep(p: &Pacer<TscClock>) -> (Nanos, Nanos) {
    let due = p.next_slot();
    let now = p.clock().now();
    if due > now {
        std::thread::sleep(Duration::from_nanos(due.as_u64() - now.as_u64()));
    }
    (due, p.clock().now())
}

fn tokio_sleep(threads: usize, rate: u64, seconds: f64) -> PacingRow {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_time()
        .build()
        .expect("a runtime");
    let clock = TscClock::new();
    let pacer = Arc::new(Pacer::with_clock(Rate::per_second(rate), clock.clone()).expect("a valid rate"));
    let end = clock.now().as_u64() + (seconds * 1e9) as u64;
    let (h, sent) = runtime.block_on(async {
        let tasks: Vec<_> = (0..threads)
            .map(|_| {
                let pacer = Arc::clone(&pacer);
                tokio::spawn(async move {
                    let (mut h, mut sent) = (histogram(), 0u64);
                    loop {
                        let due = pacer.next_async().await;
                        if due.as_u64() >= end {
                            return (h, sent);
                        }
                        let now = pacer.clock().now();
                        h.saturating_record(now.as_u64().saturating_sub(due.as_u64()).max(1));
                        sent += u64::from(now.as_u64() <= end);
                    }
                })
            })
            .collect();
        join(tasks).await
    });
    row("tollgate Pacer + tokio sleep (1 ms timer)", threads, rate, seconds, sent, &h)
}

fn governor_until_ready(threads: usize, rate: u64, seconds: f64) -> PacingRow {
    use governor::{Quota, RateLimiter};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_time()
        .build()
        .expect("a runtime");
    let per_second =
        std::num::NonZeroU32::new(u32::try_from(rate).unwrap_or(u32::MAX).max(1)).expect("non-zero");
    // Burst 1: a pacer, not a burst.
    let limiter =
        Arc::new(RateLimiter::direct(Quota::per_second(per_second).allow_burst(std::num::NonZeroU32::MIN)));
    let clock = TscClock::new();
    let start = clock.now().as_u64();
    let end = start + (seconds * 1e9) as u64;
    let order = Arc::new(AtomicU64::new(0));
    let interval = 1e9 / rate as f64;
    let (h, sent) = runtime.block_on(async {
        let tasks: Vec<_> = (0..threads)
            .map(|_| {
                let (limiter, order, clock) = (Arc::clone(&limiter), Arc::clone(&order), clock.clone());
                tokio::spawn(async move {
                    let (mut h, mut sent) = (histogram(), 0u64);
                    loop {
                        limiter.until_ready().await;
                        let now = clock.now().as_u64();
                        if now >= end {
                            return (h, sent);
                        }
                        // Its k-th send was intended at start + k/rate.
                        let k = order.fetch_add(1, Relaxed);
                        let intended = start + (k as f64 * interval) as u64;
                        h.saturating_record(now.saturating_sub(intended).max(1));
                        sent += 1;
                    }
                })
            })
            .collect();
        join(tasks).await
    });
    row("governor until_ready (tokio tasks)", threads, rate, seconds, sent, &h)
}

/// The floor: what this host lets any pacer reach. Each thread spins on the TSC to its own
/// slots of the same schedule (thread `i` takes slots `i`, `i + threads`, ...), sharing nothing:
/// no pacer, no atomic, no sleep. Its error is the host's own (interrupts, a preempted vCPU);
/// a pacer's can only add to it.
fn floor_spin(threads: usize, rate: u64, seconds: f64) -> PacingRow {
    let clock = TscClock::new();
    let start = clock.now().as_u64();
    let end = start + (seconds * 1e9) as u64;
    let interval = 1e9 / rate as f64;
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let clock = clock.clone();
            std::thread::spawn(move || {
                crate::driver::pin_to(i);
                let (mut h, mut sent) = (histogram(), 0u64);
                for k in (i as u64..).step_by(threads) {
                    let intended = start + (k as f64 * interval) as u64;
                    if intended >= end {
                        return (h, sent);
                    }
                    let mut now = clock.now().as_u64();
                    while now < intended {
                        std::hint::spin_loop();
                        now = clock.now().as_u64();
                    }
                    h.saturating_record((now - intended).max(1));
                    sent += u64::from(now <= end);
                }
                (h, sent)
            })
        })
        .collect();
    let (h, sent) = join_threads(handles);
    row("floor: each thread spins on the TSC to its own slots", threads, rate, seconds, sent, &h)
}

/// Sums the tasks' histograms and counts.
async fn join(tasks: Vec<tokio::task::JoinHandle<(Histogram<u64>, u64)>>) -> (Histogram<u64>, u64) {
    let (mut h, mut sent) = (histogram(), 0);
    for t in tasks {
        let (th, n) = t.await.expect("a pacing task");
        h.add(th).expect("same bounds");
        sent += n;
    }
    (h, sent)
}

/// The pacing rows: 2 threads at 1,000,000/s for 2 s (0.2 s when quick). The first is the
/// pacer of record, the last the host's floor.
pub fn run(quick: bool) -> Vec<PacingRow> {
    let (threads, rate, seconds) = (2, 1_000_000, if quick { 0.2 } else { 2.0 });
    vec![
        threaded("tollgate Pacer::next (sleep, then spin)", threads, rate, seconds, spin_then_sleep),
        threaded("tollgate Pacer + thread::sleep", threads, rate, seconds, plain_sleep),
        tokio_sleep(threads, rate, seconds),
        governor_until_ready(threads, rate, seconds),
        floor_spin(threads, rate, seconds),
    ]
}
