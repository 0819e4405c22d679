//! What the suite measures: tollgate's limiters, the floors, and the peers, all behind
//! [`Subject`], each deciding one unit per key.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tollgate::{
    Clock, CoarseClock, Decision, FixedWindow, FixedWindowLimiter, KeyedLimiter, KeyedPolicy,
    KeyedSlidingLog, Limiter, Nginx, NginxLimiter, Rate, ReserveError, SlidingLog, SlidingLogLimiter,
    SlidingWindow, SlidingWindowLimiter, TokenBucket, TscClock, WhenFull,
};

use crate::driver::{Subject, BATCH};
use crate::workloads::{floor_step, Floor};

/// The quota regime of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// A quota that never runs out: every decision admits and writes.
    Allow,
    /// One per hour, spent: every decision denies (most limiters then write nothing).
    Deny,
    /// Burst 1 that refills within a nanosecond: every bucket is full again, and evictable,
    /// right after its decision (first-touch churn).
    Refill,
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::Allow => "allow-heavy",
            Load::Deny => "deny-heavy",
            Load::Refill => "refilling",
        }
    }

    fn quota(self) -> TokenBucket {
        match self {
            Load::Allow => {
                TokenBucket::new(Rate::per_second(10_000_000_000), TokenBucket::MAX_BURST).expect("valid")
            }
            Load::Deny => TokenBucket::per_hour(1).expect("valid"),
            Load::Refill => TokenBucket::new(Rate::per_second(10_000_000_000), 1).expect("valid"),
        }
    }

    fn governor(self) -> governor::Quota {
        match self {
            Load::Allow | Load::Refill => governor::Quota::per_second(NonZeroU32::MAX),
            Load::Deny => governor::Quota::per_hour(NonZeroU32::MIN),
        }
    }

    /// (tokens per second, burst) for the `Mutex` peers.
    fn float(self) -> (f64, f64) {
        match self {
            Load::Allow => (1e10, 4e9),
            Load::Deny => (1.0 / 3600.0, 1.0),
            Load::Refill => (1e10, 1.0),
        }
    }
}

/// How a subject is built for a workload.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub load: Load,
    /// Keys the table must hold (tollgate's capacity; the floor's slots follow tollgate's).
    pub capacity: usize,
}

/// A subject's name and a constructor.
pub type Maker = fn(Setup) -> Box<dyn Subject>;

// ---- direct ----------------------------------------------------------------------------------

/// One clock read and one CAS on a single word (`workloads::floor_step`).
struct DirectFloor<C: Clock> {
    clock: C,
    word: AtomicU64,
}

impl<C: Clock + Sync> Subject for DirectFloor<C> {
    fn run(&self, keys: &[u64]) {
        for _ in keys {
            floor_step(&self.clock, &self.word);
        }
    }
}

struct Bucket<C: Clock>(Limiter<C>);

impl<C: Clock + Sync> Subject for Bucket<C> {
    fn run(&self, keys: &[u64]) {
        for _ in keys {
            kept(self.0.check());
        }
    }
}

/// Reservations on the token bucket: `reserve_n(1)`, its answer read as a caller reads it (how
/// long to wait: the reservation's delay, or a refusal's wait) and kept, its tokens taken, as a
/// load generator's would be. Deny-heavy: the bucket is a whole fill in debt, so every
/// reservation is refused at once as too late.
struct Reserve<C: Clock>(Limiter<C>);

impl<C: Clock + Sync> Subject for Reserve<C> {
    fn run(&self, keys: &[u64]) {
        for _ in keys {
            let wait = match self.0.reserve_n(1) {
                Ok(r) => r.delay(),
                Err(ReserveError::TooLate { wait, .. }) => wait,
                Err(_) => Duration::MAX,
            };
            kept(wait);
        }
    }
}

/// Any other single-word policy on the direct engine.
macro_rules! direct_subject {
    ($name:ident, $limiter:ty) => {
        struct $name($limiter);

        impl Subject for $name {
            fn run(&self, keys: &[u64]) {
                for _ in keys {
                    kept(self.0.check());
                }
            }
        }
    };
}

direct_subject!(NginxDirect, NginxLimiter);
direct_subject!(Fixed, FixedWindowLimiter);
direct_subject!(Sliding, SlidingWindowLimiter);
direct_subject!(Log, SlidingLogLimiter);

struct GovDirect(governor::DefaultDirectRateLimiter);

impl Subject for GovDirect {
    fn run(&self, keys: &[u64]) {
        for _ in keys {
            kept(self.0.check());
        }
    }
}

/// The token bucket as the usual pattern writes it: `f64` tokens and a `std::time::Instant`.
#[derive(Debug)]
struct FloatBucket {
    tokens: f64,
    last: Instant,
}

impl FloatBucket {
    fn take(&mut self, now: Instant, (rate, burst): (f64, f64)) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct MutexBucket {
    bucket: Mutex<FloatBucket>,
    params: (f64, f64),
}

impl Subject for MutexBucket {
    fn run(&self, keys: &[u64]) {
        for _ in keys {
            let now = Instant::now();
            kept(self.bucket.lock().expect("not poisoned").take(now, self.params));
        }
    }
}

/// Keeps a subject's answer as a caller does: every field written to memory, to be read by
/// someone the compiler cannot see. By reference, not `black_box(answer)`: that moves the
/// answer into a slot of its own, a copy no caller makes, which reads the fields back with
/// wider loads than the stores that wrote them (a failed store forward, about 3 ns a decision
/// on a 32-byte `Decision` on the Xeon guest of session 14).
#[inline(always)]
fn kept<T>(answer: T) {
    black_box(&answer);
}

/// Spends the only token of a deny-heavy limiter, so that every measured decision denies.
fn spend<T>(load: Load, l: T, check: impl Fn(&T)) -> T {
    if load == Load::Deny {
        check(&l);
    }
    l
}

/// The direct subjects: one state shared by every thread.
pub fn direct_subjects() -> Vec<(&'static str, Maker)> {
    vec![
        ("floor", |_| Box::new(DirectFloor { clock: TscClock::new(), word: AtomicU64::new(0) })),
        ("floor-coarse", |_| {
            let clock = CoarseClock::new().expect("a coarse clock");
            Box::new(DirectFloor { clock, word: AtomicU64::new(0) })
        }),
        ("tollgate", |s| {
            Box::new(Bucket(spend(s.load, Limiter::new(s.load.quota()), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-reserve", |s| {
            Box::new(Reserve(spend(s.load, Limiter::new(s.load.quota()), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-metrics", |s| {
            Box::new(Bucket(spend(s.load, Limiter::new(s.load.quota()).with_counters(), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-coarse", |s| {
            let clock = CoarseClock::new().expect("a coarse clock");
            Box::new(Bucket(spend(s.load, Limiter::with_clock(s.load.quota(), clock), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-nginx", |s| {
            Box::new(NginxDirect(spend(s.load, NginxLimiter::new(nginx_for(s.load)), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-fixed-window", |s| {
            Box::new(Fixed(spend(s.load, FixedWindowLimiter::new(fixed_for(s.load)), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-sliding-window", |s| {
            Box::new(Sliding(spend(s.load, SlidingWindowLimiter::new(sliding_for(s.load)), |l| {
                let _ = l.check();
            })))
        }),
        ("tollgate-sliding-log", |s| {
            let q = match s.load {
                // 100 per µs: never reached (about 40 decisions per µs on one core).
                Load::Allow | Load::Refill => SlidingLog::new(100, Duration::from_micros(1)),
                Load::Deny => SlidingLog::new(1, Duration::from_secs(3600)),
            };
            Box::new(Log(spend(s.load, SlidingLogLimiter::new(q.expect("valid")), |l| {
                let _ = l.check();
            })))
        }),
        ("governor", |s| {
            Box::new(GovDirect(spend(s.load, governor::RateLimiter::direct(s.load.governor()), |l| {
                let _ = l.check();
            })))
        }),
        ("mutex", |s| {
            let b = MutexBucket {
                bucket: Mutex::new(FloatBucket { tokens: s.load.float().1, last: Instant::now() }),
                params: s.load.float(),
            };
            Box::new(spend(s.load, b, |b| b.run(&[0])))
        }),
    ]
}

// ---- keyed -----------------------------------------------------------------------------------

struct KeyedFloor<C: Clock>(Floor<C>);

impl<C: Clock + Sync> Subject for KeyedFloor<C> {
    /// The slot is prefetched before the clock is read, the order tollgate uses: where a TSC
    /// read waits for earlier loads, another order measures that, not a floor (BENCHMARKS.md).
    fn run(&self, keys: &[u64]) {
        for &k in keys {
            self.0.step_prefetched(k);
        }
    }
}

/// The keyed floor in a table that checks keys among four slots of a line
/// ([`Floor::step_select`]).
struct SelectFloor<C: Clock>(Floor<C>);

impl<C: Clock + Sync> Subject for SelectFloor<C> {
    fn run(&self, keys: &[u64]) {
        for &k in keys {
            self.0.step_select(k);
        }
    }
}

struct Keyed<C: Clock>(KeyedLimiter<u64, C>);

impl<C: Clock + Sync> Subject for Keyed<C> {
    fn run(&self, keys: &[u64]) {
        for k in keys {
            kept(self.0.check(k));
        }
    }
}

/// `check` with each key prefetched a few requests ahead (`Keyed::prefetch`), as a caller that
/// sees one request at a time can: it knows the next keys once it has parsed their requests.
struct KeyedPrefetch(KeyedLimiter<u64, TscClock>);

/// How many requests ahead `tollgate-prefetch` prefetches.
const PREFETCH_AHEAD: usize = 4;

impl Subject for KeyedPrefetch {
    fn run(&self, keys: &[u64]) {
        for (i, k) in keys.iter().enumerate() {
            if let Some(ahead) = keys.get(i + PREFETCH_AHEAD) {
                self.0.prefetch(ahead);
            }
            kept(self.0.check(k));
        }
    }
}

/// nginx, a fixed window or a sliding window per key: `Keyed<P, u64>`.
struct KeyedPol<P: KeyedPolicy>(tollgate::Keyed<P, u64, TscClock>);

impl<P: KeyedPolicy + Sync> Subject for KeyedPol<P> {
    fn run(&self, keys: &[u64]) {
        for k in keys {
            kept(self.0.check(k));
        }
    }
}

fn keyed_policy<P: KeyedPolicy + Sync + 'static>(s: Setup, p: P) -> Box<dyn Subject> {
    let l = tollgate::Keyed::<_, u64>::builder(p)
        .capacity(s.capacity)
        .build_with_clock(TscClock::new())
        .expect("valid keyed configuration");
    Box::new(KeyedPol(l))
}

/// nginx `limit_req` per load: a rate never reached (1e9 r/s, burst 16,776, nodelay); one per
/// minute; or 1e9 r/s without a burst, whose nodes drain within 1 ms (evictable soon after).
fn nginx_for(load: Load) -> Nginx {
    match load {
        Load::Allow => Nginx::per_second(1_000_000_000).and_then(|q| q.burst(16_776)).map(Nginx::nodelay),
        Load::Deny => Nginx::per_minute(1),
        Load::Refill => Nginx::per_second(1_000_000_000),
    }
    .expect("valid")
}

/// A fixed window per load: the largest limit per 100 ms (167M/s, never reached); one per hour;
/// or one per 100 ns, so that a key's word is of a past window (evictable) 100 ns later.
fn fixed_for(load: Load) -> FixedWindow {
    match load {
        Load::Allow => FixedWindow::new(FixedWindow::MAX_LIMIT, Duration::from_millis(100)),
        Load::Deny => FixedWindow::new(1, Duration::from_secs(3600)),
        Load::Refill => FixedWindow::new(1, Duration::from_nanos(100)),
    }
    .expect("valid")
}

/// A sliding window per load: 31 per 200 ns (155M/s, never reached; a limit is only as large
/// as the lifetime allows: the largest, 2^20 − 1, needs windows of 188 s or more, and is
/// reached); one per hour; or 31 per 200 ns, evictable two windows on.
fn sliding_for(load: Load) -> SlidingWindow {
    match load {
        Load::Allow | Load::Refill => SlidingWindow::new(31, Duration::from_nanos(200)),
        Load::Deny => SlidingWindow::new(1, Duration::from_secs(3600)),
    }
    .expect("valid")
}

struct KeyedLog(KeyedSlidingLog<u64, TscClock>);

impl Subject for KeyedLog {
    fn run(&self, keys: &[u64]) {
        for k in keys {
            kept(self.0.check(k));
        }
    }
}

/// `check_batch`: one clock read per batch, slots prefetched ahead.
struct KeyedBatch {
    limiter: KeyedLimiter<u64, TscClock>,
    blank: Decision,
}

impl Subject for KeyedBatch {
    fn unit(&self) -> usize {
        BATCH
    }

    fn run(&self, keys: &[u64]) {
        let mut items = [(0u64, 1u64); BATCH];
        let mut out = [self.blank; BATCH];
        for chunk in keys.chunks(BATCH) {
            for (item, &k) in items.iter_mut().zip(chunk) {
                item.0 = k;
            }
            let n = chunk.len();
            // Like any caller's, the keys and costs are not known to the compiler, and the
            // decisions are read: without these the batch's stores are dead code it may drop.
            black_box(&mut items);
            let _ = black_box(self.limiter.check_batch(&items[..n], &mut out[..n]));
            black_box(&mut out);
        }
    }
}

type GovKeyed = governor::DefaultKeyedRateLimiter<u64>;
type GovAhash = governor::RateLimiter<
    u64,
    governor::state::keyed::DefaultKeyedStateStore<u64, ahash::RandomState>,
    governor::clock::DefaultClock,
>;

macro_rules! governor_subject {
    ($name:ident, $limiter:ty) => {
        struct $name($limiter);

        impl Subject for $name {
            fn run(&self, keys: &[u64]) {
                for k in keys {
                    kept(self.0.check_key(k));
                }
            }

            fn reset(&self) {
                // Drops every key whose bucket has refilled: what governor's users must call to
                // bound its memory.
                self.0.retain_recent();
                self.0.shrink_to_fit();
            }
        }
    };
}

governor_subject!(Governor, GovKeyed);
governor_subject!(GovernorAhash, GovAhash);

/// A `Mutex<HashMap>` of float buckets, as the usual pattern writes it (std's SipHash).
struct MutexMap {
    map: Mutex<HashMap<u64, FloatBucket>>,
    params: (f64, f64),
}

impl Subject for MutexMap {
    fn run(&self, keys: &[u64]) {
        for &k in keys {
            let now = Instant::now();
            let mut map = self.map.lock().expect("not poisoned");
            let b = map.entry(k).or_insert(FloatBucket { tokens: self.params.1, last: now });
            kept(b.take(now, self.params));
        }
    }

    fn reset(&self) {
        let mut map = self.map.lock().expect("not poisoned");
        let params = self.params;
        let now = Instant::now();
        // Like `retain_recent`: a bucket that has refilled is the same as no bucket.
        map.retain(|_, b| {
            let mut probe = FloatBucket { tokens: b.tokens, last: b.last };
            probe.take(now, params);
            probe.tokens + 1.0 < params.1
        });
        map.shrink_to_fit();
    }
}

fn keyed<C: Clock>(s: Setup, when_full: WhenFull, clock: C) -> KeyedLimiter<u64, C> {
    KeyedLimiter::<u64>::builder(s.load.quota())
        .capacity(s.capacity)
        .when_full(when_full)
        .build_with_clock(clock)
        .expect("valid keyed configuration")
}

/// Slots of tollgate's table for `capacity` keys: the keyed floor gets as many.
pub fn slots_for(capacity: usize) -> usize {
    let l = KeyedLimiter::<u64>::builder(Load::Allow.quota()).capacity(capacity).build().expect("valid");
    usize::try_from(l.stats().slots).expect("fits")
}

/// The keys tollgate's table asked for `capacity` keys holds at its maximum load (the builder
/// rounds the slots up to a power of two).
pub fn max_load_for(capacity: usize) -> u64 {
    KeyedLimiter::<u64>::builder(Load::Allow.quota()).capacity(capacity).build().expect("valid").capacity()
}

/// The keyed subjects, by name.
pub fn keyed_subject(name: &str) -> Option<Maker> {
    Some(match name {
        "floor" => |s| Box::new(KeyedFloor(Floor::new(slots_for(s.capacity), TscClock::new()))),
        "floor-coarse" => |s| {
            let clock = CoarseClock::new().expect("a coarse clock");
            Box::new(KeyedFloor(Floor::new(slots_for(s.capacity), clock)))
        },
        "floor-coarse-select" => |s| {
            let clock = CoarseClock::new().expect("a coarse clock");
            Box::new(SelectFloor(Floor::new(slots_for(s.capacity), clock)))
        },
        "tollgate" => |s| Box::new(Keyed(keyed(s, WhenFull::Deny, TscClock::new()))),
        "tollgate-coarse" => {
            |s| Box::new(Keyed(keyed(s, WhenFull::Deny, CoarseClock::new().expect("a coarse clock"))))
        }
        "tollgate-batch" => |s| {
            let limiter = keyed(s, WhenFull::Deny, TscClock::new());
            let blank = limiter.peek(&0);
            Box::new(KeyedBatch { limiter, blank })
        },
        "tollgate-evict" => |s| Box::new(Keyed(keyed(s, WhenFull::EvictFullest, TscClock::new()))),
        "tollgate-prefetch" => |s| Box::new(KeyedPrefetch(keyed(s, WhenFull::Deny, TscClock::new()))),
        "tollgate-metrics" => |s| {
            let l = KeyedLimiter::<u64>::builder(s.load.quota())
                .capacity(s.capacity)
                .counters(true)
                .build_with_clock(TscClock::new())
                .expect("valid keyed configuration");
            Box::new(Keyed(l))
        },
        "tollgate-nginx" => |s| keyed_policy(s, nginx_for(s.load)),
        "tollgate-fixed-window" => |s| keyed_policy(s, fixed_for(s.load)),
        "tollgate-sliding-window" => |s| keyed_policy(s, sliding_for(s.load)),
        "tollgate-sliding-log" => |s| {
            // A log of 4 per key: 4 per ns (never reached), or one per hour.
            let log = match s.load {
                Load::Allow | Load::Refill => SlidingLog::new(4, Duration::from_nanos(1)),
                Load::Deny => SlidingLog::new(1, Duration::from_secs(3600)),
            };
            let l = KeyedSlidingLog::<u64>::builder(log.expect("valid"))
                .capacity(s.capacity)
                .build_with_clock(TscClock::new())
                .expect("valid keyed configuration");
            Box::new(KeyedLog(l))
        },
        "governor" => |s| Box::new(Governor(GovKeyed::keyed(s.load.governor()))),
        "governor-ahash" => |s| {
            Box::new(GovernorAhash(GovAhash::dashmap_with_hasher(
                s.load.governor(),
                ahash::RandomState::new(),
            )))
        },
        "mutex" => |s| Box::new(MutexMap { map: Mutex::new(HashMap::new()), params: s.load.float() }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::key;

    /// The select floor holds each key in one slot, found again by later decisions, and
    /// CASes that slot's word on every decision: a table that checks keys, not a stand-in.
    #[test]
    fn the_select_floor_keeps_one_slot_a_key() {
        let floor = Floor::new(1024, TscClock::new());
        let keys: Vec<u64> = (0..700).map(key).collect();
        for round in 1..=3u64 {
            for &k in &keys {
                floor.step_select(k);
            }
            let held = floor.held();
            assert_eq!(held.len(), keys.len(), "each key in one slot, after round {round}");
            for (word, held_key) in held {
                assert!(keys.contains(&held_key), "only the stream's keys are held");
                // Each decision adds an odd number to its slot's word.
                assert_eq!(word % 2, round % 2, "every decision reached its key's slot");
            }
        }
    }
}
