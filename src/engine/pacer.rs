//! A pacer for load generators: one schedule of intended send times shared by any number of
//! threads.

use core::fmt;
use core::time::Duration;
use std::cell::Cell;

use crate::engine::rate::Rate;
use crate::engine::wait::sleep_until;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::{Clock, ConfigError, DefaultClock, Nanos};

/// The schedule counts in sixteenths of a nanosecond: a rate's interval keeps its fraction
/// (rounded up, slower by under `1/(16·interval_ns)`: 6·10⁻⁵ at a million per second), and a
/// schedule of 2^60 ns (36 years) fits.
const FRACTION: u32 = 4;
/// The longest interval: 2^46 ns (19.5 hours).
const MAX_INTERVAL_NS: u64 = 1 << 46;

/// How the intervals between intended send times are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Arrivals {
    /// Exactly the rate's interval apart: a closed, even schedule.
    #[default]
    Even,
    /// Uniform between zero and twice the interval (the same mean rate).
    Uniform,
    /// Exponential with the interval as mean: a Poisson process, the open workload that
    /// models independent users.
    Poisson,
}

/// Paces requests at one rate across any number of threads, for load generators and benchmark
/// drivers.
///
/// Each call to [`next`](Pacer::next) takes the next slot of one shared schedule and sleeps
/// until it; it returns the slot's *intended* time, from which the caller measures latency. A
/// caller that falls behind gets slots already in the past at once: the schedule does not
/// stretch to the system under test, so a slow response shows up as latency from the intended
/// time rather than as fewer requests (the coordinated omission that closed-loop generators
/// suffer from). One `fetch_add` per slot: no lock, no queue.
///
/// ```
/// use tollgate::{Pacer, Rate};
///
/// let pacer = Pacer::new(Rate::per_second(10_000))?;
/// let first = pacer.next(); // due at once
/// let second = pacer.next(); // 100 µs later
/// assert_eq!(second.as_u64() - first.as_u64(), 100_000);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct Pacer<C: Clock = DefaultClock> {
    /// The next slot, in sixteenths of a nanosecond after `origin`.
    next: AtomicU64,
    /// The mean interval, in sixteenths of a nanosecond.
    interval: AtomicU64,
    arrivals: Arrivals,
    /// The first slot (see [`origin`](Pacer::origin)).
    origin: Nanos,
    clock: C,
}

impl Pacer<DefaultClock> {
    /// A pacer at `rate` on the default clock, its first slot now.
    pub fn new(rate: Rate) -> Result<Pacer<DefaultClock>, ConfigError> {
        Pacer::with_clock(rate, DefaultClock::new())
    }
}

impl<C: Clock> Pacer<C> {
    /// A pacer at `rate` on `clock`, its first slot now.
    pub fn with_clock(rate: Rate, clock: C) -> Result<Pacer<C>, ConfigError> {
        let interval = interval_of(rate)?;
        let origin = clock.now();
        Ok(Pacer {
            next: AtomicU64::new(0),
            interval: AtomicU64::new(interval),
            arrivals: Arrivals::Even,
            origin,
            clock,
        })
    }

    /// The same pacer with intervals drawn as `arrivals` says (the mean rate is unchanged).
    pub fn with_arrivals(mut self, arrivals: Arrivals) -> Pacer<C> {
        self.arrivals = arrivals;
        self
    }

    /// Takes the next slot and sleeps until it (the bulk asleep, the last 100 µs spinning);
    /// returns its intended time on the pacer's clock. A slot already past returns at once.
    pub fn next(&self) -> Nanos {
        let due = self.next_slot();
        sleep_until(&self.clock, due);
        due
    }

    /// Takes the next slot without sleeping: its intended time, for a caller that waits its
    /// own way (an async timer, a busy loop).
    pub fn next_slot(&self) -> Nanos {
        let step = self.step();
        // Relaxed: the slots only need to be distinct and in one order; nothing is published
        // with them.
        let slot = self.next.fetch_add(step, Relaxed);
        Nanos::new(self.origin.as_u64().saturating_add(slot >> FRACTION))
    }

    /// [`next`](Pacer::next) on tokio's timer (1 ms resolution, never early).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn next_async(&self) -> Nanos {
        let due = self.next_slot();
        loop {
            let now = self.clock.now();
            if now >= due {
                return due;
            }
            tokio::time::sleep(Duration::from_nanos(due.as_u64() - now.as_u64())).await;
        }
    }

    /// Changes the rate for the slots taken from now on. Slots already past are dropped rather
    /// than sent as a burst to catch up: the schedule resumes from now at the new rate.
    pub fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        let interval = interval_of(rate)?;
        // Relaxed: as in `next_slot`; a slot taken just before sees the old interval.
        self.interval.store(interval, Relaxed);
        let now = self.clock.now().as_u64().saturating_sub(self.origin.as_u64());
        self.next.fetch_max(now.saturating_mul(1 << FRACTION), Relaxed);
        Ok(())
    }

    /// The schedule's origin, on the pacer's clock: its first slot, the clock's reading when
    /// the pacer was built. Every slot is counted from it (with [`Arrivals::Even`], the `k`-th
    /// slot is `origin + k·interval` until a [`set_rate`](Pacer::set_rate)), and it never
    /// moves, not even when a rate change resumes the schedule from a later instant: a load
    /// generator reports its run's elapsed time, or a slot's place in the run, from here.
    pub fn origin(&self) -> Nanos {
        self.origin
    }

    /// The mean interval between slots.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval.load(Relaxed) >> FRACTION)
    }

    /// The pacer's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The next interval, in sixteenths of a nanosecond.
    fn step(&self) -> u64 {
        let mean = self.interval.load(Relaxed);
        match self.arrivals {
            Arrivals::Even => mean,
            Arrivals::Uniform => {
                #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "at most 2·mean")]
                let step = (unit_random() * 2.0 * mean as f64) as u64;
                step
            }
            Arrivals::Poisson => {
                // Inverse transform: −ln(1 − U)·mean, U uniform in [0, 1). Capped at 64 means
                // (a probability of e⁻⁶⁴): the schedule's range stays bounded.
                let e = -(1.0 - unit_random()).ln();
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "at most 64·mean"
                )]
                let step = (e.min(64.0) * mean as f64) as u64;
                step
            }
        }
    }
}

impl<C: Clock> fmt::Debug for Pacer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("origin", &self.origin)
            .field("interval", &self.interval())
            .field("arrivals", &self.arrivals)
            .finish_non_exhaustive()
    }
}

/// A rate's interval in sixteenths of a nanosecond, rounded up: a pacer never runs faster than
/// its rate.
fn interval_of(rate: Rate) -> Result<u64, ConfigError> {
    if rate.tokens() == 0 {
        return Err(ConfigError::ZeroRate);
    }
    let period = rate.period().as_nanos();
    if period == 0 {
        return Err(ConfigError::ZeroPeriod);
    }
    let tokens = u128::from(rate.tokens());
    // Faster than one slot per nanosecond: the clock cannot tell the slots apart.
    if tokens > period {
        return Err(ConfigError::RateTooHigh {
            tokens: rate.tokens(),
            period_nanos: u64::try_from(period).unwrap_or(u64::MAX),
        });
    }
    let sixteenths = (period * (1 << FRACTION)).div_ceil(tokens);
    if sixteenths > u128::from(MAX_INTERVAL_NS) << FRACTION {
        return Err(ConfigError::IntervalTooLong { nanos: period / tokens, max_nanos: MAX_INTERVAL_NS });
    }
    #[expect(clippy::cast_possible_truncation, reason = "at most 2^50")]
    Ok(sixteenths as u64)
}

/// A uniform draw from [0, 1): splitmix64 on a per-thread state (no contention between the
/// threads sharing a pacer).
fn unit_random() -> f64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            // Distinct per thread and per run: the thread's id and the time it first drew.
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            std::thread::current().id().hash(&mut h);
            std::time::SystemTime::now().hash(&mut h);
            h.finish()
        });
    }
    let x = STATE.with(|s| {
        let x = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(x);
        x
    });
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    #[expect(clippy::cast_precision_loss, reason = "53 bits, exactly representable")]
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    u
}
