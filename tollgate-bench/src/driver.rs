//! The measuring loop. Every thread decides batches of keys and reads the TSC once between
//! batches (throughput, and each batch's time per decision in a histogram); then it times
//! single calls, each between two fenced TSC reads, with the timer's own cost measured on an
//! empty call and taken out (latency per call).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::workloads::key;

/// The batch of `check_batch` (and the granularity of the timed batches above it).
pub const BATCH: usize = 32;

/// Timed batches last about this long. The TSC is read once per batch (the end of one batch is
/// the start of the next), so the timer costs about 1% of a batch. On a virtual machine a
/// spinning thread loses a few µs thousands of times a second and tens of µs hundreds of times
/// a second (`machine::Noise` measures both): a 2 µs batch is long enough that a short loss
/// at most doubles it, and short enough that long losses land in fewer than 0.1% of batches,
/// so the p99.9 shows the limiter rather than the hypervisor as far as it can. The batch size
/// follows from the warm-up's speed; `--batch-us` changes the length.
pub const BATCH_NANOS: f64 = 2000.0;

/// The most decisions in one timed batch.
const MAX_BATCH: usize = 1 << 16;

/// Decisions per timed batch of `target` ns for a subject that takes `ns` per decision: a
/// multiple of [`BATCH`] from there up, within 4..=[`MAX_BATCH`].
fn batch_for(target: f64, ns: f64) -> usize {
    let n = (target / ns.max(0.1)).round() as usize;
    let n = if n >= BATCH { n / BATCH * BATCH } else { n };
    n.clamp(4, MAX_BATCH)
}

/// A limiter, or a floor, as the suite drives it.
pub trait Subject: Sync {
    /// Decides one unit for every key of `keys`, in order.
    fn run(&self, keys: &[u64]);

    /// Restores a bounded state between repetitions, outside the timing (peers whose maps grow
    /// with every new key).
    fn reset(&self) {}

    /// Keys per call of the subject's own API: [`BATCH`] for `check_batch`, 1 for the rest.
    /// The latency pass times one call of this many keys.
    fn unit(&self) -> usize {
        1
    }
}

/// Does nothing: the latency pass times it to learn what the timer and the call cost.
struct Empty;

impl Subject for Empty {
    #[inline(never)]
    fn run(&self, keys: &[u64]) {
        let _ = std::hint::black_box(keys);
    }
}

/// Where a thread's keys come from.
#[derive(Debug)]
pub enum Keys {
    /// A pre-generated stream per thread (at least 256 keys), cycled through.
    Streams(Vec<Vec<u64>>),
    /// A key never used before for every decision.
    Fresh,
}

/// What one thread measured.
struct Span {
    ops: u64,
    nanos: u64,
    hist: Histogram<u64>,
    calls: Histogram<u64>,
    batch: usize,
}

/// One repetition of one cell.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Decisions, all threads.
    pub ops: u64,
    /// Mean over threads of each thread's time per decision, in ns.
    pub ns_per_op: f64,
    /// Decisions per second, all threads: the sum of every thread's own rate.
    pub ops_per_sec: f64,
    /// Time per decision in picoseconds, one record per batch, all threads.
    pub hist: Histogram<u64>,
    /// Time per call in picoseconds, less the timer's, one record per decision, all threads.
    pub calls: Histogram<u64>,
    /// Decisions per timed batch (the first thread's).
    pub batch: usize,
}

/// A fresh histogram of picoseconds per decision: 1 ps to 100 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000_000, 3).expect("valid bounds")
}

/// How a cell is timed.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Untimed, before each repetition.
    pub warmup: Duration,
    /// Timed.
    pub duration: Duration,
    /// Pin thread `i` to CPU `i`.
    pub pin: bool,
    /// The length of a timed batch, ns.
    pub batch_nanos: f64,
    /// Timed one call at a time, after `duration`.
    pub latency: Duration,
}

/// Runs `subject` on `threads` threads: a warm-up, then the timed part. Fresh keys are drawn
/// from `fresh`, which hands each thread a range of 2^40 indices no one has used.
pub fn measure<S: Subject + ?Sized>(
    subject: &S,
    keys: &Keys,
    threads: usize,
    timing: Timing,
    fresh: &AtomicU64,
) -> Sample {
    let Timing { warmup, duration, pin, batch_nanos, latency } = timing;
    let clock = quanta::Clock::new();
    let barrier = Barrier::new(threads);
    let spans: Vec<Span> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (clock, barrier) = (&clock, &barrier);
                s.spawn(move || {
                    if pin {
                        pin_to(t);
                    }
                    let mut source = match keys {
                        Keys::Streams(streams) => Source::stream(&streams[t % streams.len()]),
                        Keys::Fresh => Source::fresh(fresh.fetch_add(1 << 40, Relaxed)),
                    };
                    barrier.wait();
                    let (ops, nanos) = run_for(subject, &mut source, clock, warmup, BATCH, None);
                    let batch = batch_for(batch_nanos, nanos as f64 / ops as f64);
                    barrier.wait();
                    let mut hist = histogram();
                    let (ops, nanos) = run_for(subject, &mut source, clock, duration, batch, Some(&mut hist));
                    barrier.wait();
                    let calls = time_calls(subject, &mut source, clock, latency);
                    Span { ops, nanos, hist, calls, batch }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).collect()
    });
    let (mut hist, mut calls) = (histogram(), histogram());
    for span in &spans {
        hist.add(&span.hist).expect("same bounds");
        calls.add(&span.calls).expect("same bounds");
    }
    let ops = spans.iter().map(|s| s.ops).sum();
    let ns_per_op = spans.iter().map(|s| s.nanos as f64 / s.ops as f64).sum::<f64>() / spans.len() as f64;
    let ops_per_sec = spans.iter().map(|s| s.ops as f64 * 1e9 / s.nanos as f64).sum();
    Sample { ops, ns_per_op, ops_per_sec, hist, calls, batch: spans[0].batch }
}

/// Decides batches until `duration` has passed; returns the decisions and the nanoseconds.
#[inline(never)]
fn run_for<S: Subject + ?Sized>(
    subject: &S,
    source: &mut Source<'_>,
    clock: &quanta::Clock,
    duration: Duration,
    batch: usize,
    mut hist: Option<&mut Histogram<u64>>,
) -> (u64, u64) {
    let limit = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let start = clock.raw();
    let mut last = start;
    let mut ops = 0u64;
    loop {
        let keys = source.next(batch);
        let n = keys.len() as u64;
        subject.run(keys);
        let now = clock.raw();
        ops += n;
        if let Some(hist) = hist.as_deref_mut() {
            let ps = clock.delta_as_nanos(last, now) * 1000 / n;
            hist.saturating_record(ps.max(1));
        }
        last = now;
        let spent = clock.delta_as_nanos(start, now);
        if spent >= limit {
            return (ops, spent.max(1));
        }
    }
}

/// Times single calls of `subject` for `duration`, each between two fenced TSC reads, and
/// returns their latency per decision in picoseconds. What the same reads cost around an empty
/// call (its median, measured first on this thread) is subtracted, so the histogram holds the
/// subject's time and not the timer's; a call faster than the timer records 1 ps.
///
/// This is how single requests see the limiter: a platform interruption lands on the one call
/// it hits, where a timed batch spreads it over every decision of the batch.
#[inline(never)]
fn time_calls<S: Subject + ?Sized>(
    subject: &S,
    source: &mut Source<'_>,
    clock: &quanta::Clock,
    duration: Duration,
) -> Histogram<u64> {
    let mut empty = histogram();
    let calibrate = Duration::from_millis(2).min(duration);
    timed_calls(&Empty as &dyn Subject, source, clock, calibrate, 1, 0, &mut empty);
    let overhead = empty.value_at_quantile(0.5);
    let mut hist = histogram();
    timed_calls(subject, source, clock, duration, subject.unit(), overhead, &mut hist);
    hist
}

/// Records each call's picoseconds per decision, less `overhead` ps per call, in `hist`.
fn timed_calls<S: Subject + ?Sized>(
    subject: &S,
    source: &mut Source<'_>,
    clock: &quanta::Clock,
    duration: Duration,
    unit: usize,
    overhead: u64,
    hist: &mut Histogram<u64>,
) {
    let limit = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let start = clock.raw();
    let mut n = 0u32;
    loop {
        let keys = source.next(unit);
        let before = fenced(clock);
        subject.run(keys);
        let after = fenced(clock);
        let ps = clock.delta_as_nanos(before, after) * 1000;
        let per = ps.saturating_sub(overhead) / keys.len() as u64;
        hist.saturating_record_n(per.max(1), keys.len() as u64);
        n = n.wrapping_add(1);
        if n % 64 == 0 && clock.delta_as_nanos(start, after) >= limit {
            return;
        }
    }
}

/// A TSC read that waits for every earlier instruction and holds back every later one
/// (`lfence` on both sides on x86_64), so the timed call starts and ends between the reads.
#[inline(always)]
fn fenced(clock: &quanta::Clock) -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` has no operands and needs only SSE2, which x86_64 always has.
    unsafe {
        std::arch::x86_64::_mm_lfence();
        let t = clock.raw();
        std::arch::x86_64::_mm_lfence();
        t
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let t = clock.raw();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        t
    }
}

/// A thread's keys, a batch at a time.
enum Source<'a> {
    Stream { keys: &'a [u64], at: usize },
    Fresh { next: u64, buf: Vec<u64> },
}

impl<'a> Source<'a> {
    fn stream(keys: &'a [u64]) -> Source<'a> {
        assert!(!keys.is_empty());
        Source::Stream { keys, at: 0 }
    }

    fn fresh(from: u64) -> Source<'a> {
        Source::Fresh { next: from, buf: vec![0; MAX_BATCH] }
    }

    #[inline]
    fn next(&mut self, n: usize) -> &[u64] {
        match self {
            Source::Stream { keys, at } => {
                // A batch longer than the stream takes the whole stream.
                let n = n.min(keys.len());
                if *at + n > keys.len() {
                    *at = 0;
                }
                let i = *at;
                *at += n;
                &keys[i..i + n]
            }
            Source::Fresh { next, buf } => {
                for slot in &mut buf[..n] {
                    *slot = key(*next);
                    *next += 1;
                }
                &buf[..n]
            }
        }
    }
}

/// Pins the calling thread to CPU `t` modulo the CPUs this process may use (Linux only).
#[cfg(target_os = "linux")]
pub fn pin_to(t: usize) {
    // SAFETY: `set` is a plain bit set owned by this frame; the calls read or write only it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        let cpus: Vec<usize> =
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        if cpus.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[t % cpus.len()], &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
    }
}

#[cfg(not(target_os = "linux"))]
pub fn pin_to(_: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_last_about_two_microseconds() {
        assert_eq!(batch_for(BATCH_NANOS, 100.0), 20);
        assert_eq!(batch_for(BATCH_NANOS, 20.0), 96);
        assert_eq!(batch_for(BATCH_NANOS, 1.0), 1984);
        assert_eq!(batch_for(1e9, 1.0), MAX_BATCH);
        assert_eq!(batch_for(BATCH_NANOS, 10_000.0), 4);
    }

    #[test]
    fn fresh_keys_never_repeat_and_streams_wrap() {
        let mut f = Source::fresh(0);
        let a = f.next(8).to_vec();
        let b = f.next(8).to_vec();
        assert!(a.iter().all(|k| !b.contains(k)));
        let keys: Vec<u64> = (0..300).collect();
        let mut s = Source::stream(&keys);
        assert_eq!(s.next(200)[0], 0);
        assert_eq!(s.next(200)[0], 0, "a batch that would run past the end starts over");
    }

    struct Count(AtomicU64);

    impl Subject for Count {
        fn run(&self, keys: &[u64]) {
            self.0.fetch_add(keys.len() as u64, Relaxed);
        }
    }

    #[test]
    fn every_decision_is_counted_once() {
        let c = Count(AtomicU64::new(0));
        let keys = Keys::Streams(vec![vec![1; 256], vec![2; 256]]);
        let ms = Duration::from_millis(5);
        let timing = Timing { warmup: ms, duration: ms, pin: false, batch_nanos: BATCH_NANOS, latency: ms };
        let s = measure(&c, &keys, 2, timing, &AtomicU64::new(0));
        assert!(s.ops > 0 && s.ops <= c.0.load(Relaxed));
        assert!(!s.hist.is_empty() && !s.calls.is_empty());
        assert!(s.ns_per_op > 0.0 && s.ops_per_sec > 0.0);
    }
}
