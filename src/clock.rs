//! Clocks. Limiters read one once per decision; everything below them takes `now: Nanos`.
//!
//! | clock | read cost here | precision | notes |
//! |---|---|---|---|
//! | [`TscClock`] (default) | ~10 ns (`rdtsc` + scale) | 1 ns | quanta's TSC clock, OS monotonic fallback |
//! | [`CoarseClock`] | <1 ns | the upkeep interval (1 ms) | the TSC clock's time, cached by tollgate's own upkeep thread |
//! | [`StdClock`] | ~20 ns | 1 ns | `std::time::Instant`, for machines whose TSCs disagree |
//! | [`ManualClock`] | one load | 1 ns | moved by hand: tests, simulations, replays |
//!
//! And every limiter has `*_at(now)` methods, so a caller that decides a batch of packets can
//! read the clock once per batch.
//!
//! # TSC caveats, and what tollgate does about them
//!
//! * **Skew across cores.** On machines without synchronized invariant TSCs, two cores can
//!   read different times (quanta#111), and a thread can then see a stamp newer than its `now`.
//!   The bucket's stamp only ever moves forward (`max(stamp, now − fill) + cost`), and a bucket
//!   whose stamp is ahead of `now` simply has no tokens yet: there is no underflow, no reset and
//!   no extra grant. A core that runs behind sees fewer tokens (until its clock catches up); a
//!   core that runs ahead by δ can take tokens up to δ early, so over a span the bound becomes
//!   `burst + rate·(span + δ)`. Where TSCs are not synchronized, use [`StdClock`]. Refunds in
//!   multi-limit admission ([`check_all`](crate::check_all)) need synchronized clocks too: a
//!   refund on a core behind a decision's core by δ can give back up to δ·rate too much.
//! * **Suspend.** quanta follows the OS monotonic clock, which stops during suspend on Linux
//!   (quanta#58). A bucket therefore refills nothing for the time a machine was asleep: it
//!   under-admits after resume, never over-admits.
//! * **Calibration.** The first [`TscClock`] in a process calibrates the TSC against the OS
//!   clock, which can take up to ~200 ms. Create limiters at start-up, not on the first request.
//! * **Backwards.** A [`ManualClock`] may be set backwards. A bucket judged at an earlier time
//!   is judged as of that time (fewer tokens, never more); its stamp never moves back.

use core::fmt;
use core::time::Duration;

use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::Nanos;

/// A source of "now", in nanoseconds since an origin of the clock's choosing.
///
/// Readings from one clock must be comparable. They need not be monotonic: a reading earlier
/// than the bucket's stamp is handled (see the module docs).
pub trait Clock {
    /// The current time.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The default clock: [`TscClock`] with the `quanta` feature, [`StdClock`] without.
#[cfg(feature = "quanta")]
pub type DefaultClock = TscClock;
/// The default clock: [`TscClock`] with the `quanta` feature, [`StdClock`] without.
#[cfg(not(feature = "quanta"))]
pub type DefaultClock = StdClock;

#[cfg(feature = "quanta")]
mod tsc;
#[cfg(feature = "quanta")]
pub use tsc::{CoarseClock, TscClock, COARSE_INTERVAL};

/// `std::time::Instant`: the OS monotonic clock, for machines whose TSCs cannot be trusted.
#[derive(Clone, Copy, Debug)]
pub struct StdClock {
    origin: std::time::Instant,
}

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> StdClock {
        StdClock { origin: std::time::Instant::now() }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        StdClock::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos::from_duration_saturating(self.origin.elapsed())
    }
}

/// A clock moved by hand, shared by its clones. Starts at zero.
///
/// ```
/// use tollgate::{Clock, ManualClock, Nanos};
/// let clock = ManualClock::new();
/// let view = clock.clone();
/// clock.advance(std::time::Duration::from_millis(5));
/// assert_eq!(view.now(), Nanos::new(5_000_000));
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    nanos: std::sync::Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `by`, saturating at [`Nanos::MAX`].
    pub fn advance(&self, by: Duration) {
        let by = Nanos::from_duration_saturating(by).as_u64();
        // Relaxed: the clock is one self-contained value; nothing else is published through it.
        // `fetch_update` rather than `fetch_add`, to saturate instead of wrapping.
        let _ = self.nanos.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_add(by)));
    }

    /// Sets the clock, forwards or backwards.
    pub fn set(&self, now: Nanos) {
        // Relaxed: as in `advance`.
        self.nanos.store(now.as_u64(), Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Relaxed: as in `advance`.
        Nanos::new(self.nanos.load(Relaxed))
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now()).finish()
    }
}
