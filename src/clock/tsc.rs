//! The quanta clocks: TSC reads and the coarse cached time.

use std::sync::OnceLock;
use std::time::Duration;

use crate::{Clock, ConfigError, Nanos};

/// quanta's TSC clock: one `rdtsc` and a fixed-point scale per read, ~1 ns precision.
///
/// Falls back to the OS monotonic clock where quanta finds no usable invariant TSC. The first one
/// in a process calibrates for up to ~200 ms; clones share the calibration. See the
/// [module docs](crate::clock) for skew and suspend.
#[derive(Clone, Debug)]
pub struct TscClock {
    clock: quanta::Clock,
}

impl TscClock {
    /// A clock on quanta's timeline (its origin is the counter's zero, typically boot).
    pub fn new() -> TscClock {
        TscClock { clock: quanta::Clock::new() }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        TscClock::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now(&self) -> Nanos {
        // One `rdtsc` and one fixed-point scale of the absolute count. The limiter subtracts its
        // own origin (saturating), so the clock needs none: one subtraction fewer between the
        // read and the CAS. (Measured faster than `Clock::now()` minus an origin `Instant`.)
        Nanos::new(self.clock.delta_as_nanos(0, self.clock.raw()))
    }
}

/// The interval at which [`CoarseClock::new`]'s upkeep thread refreshes the time.
pub const COARSE_INTERVAL: Duration = Duration::from_millis(1);

/// quanta's `recent` time: a shared value that one upkeep thread refreshes every
/// [`COARSE_INTERVAL`]; a read is one relaxed load (under 1 ns).
///
/// Decisions see time up to one interval late, so a bucket refills up to that much later than
/// with [`TscClock`]: it can only under-admit. The upkeep thread is process-wide and runs until
/// the process exits. If some other code already runs quanta's upkeep thread, this clock reads
/// the time that thread keeps (and is only as fresh as that thread's interval).
#[derive(Clone, Debug)]
pub struct CoarseClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

/// `Ok(Some)`: our upkeep thread runs; `Ok(None)`: another one already did; `Err`: none could start.
static UPKEEP: OnceLock<Result<Option<quanta::Handle>, String>> = OnceLock::new();

impl CoarseClock {
    /// Starts (once per process) the upkeep thread, and returns a clock whose origin is now.
    ///
    /// Fails only if the thread cannot be spawned.
    pub fn new() -> Result<CoarseClock, ConfigError> {
        let started = UPKEEP.get_or_init(|| match quanta::Upkeep::new(COARSE_INTERVAL).start() {
            Ok(handle) => Ok(Some(handle)),
            Err(quanta::Error::UpkeepRunning) => Ok(None),
            Err(e) => Err(e.to_string()),
        });
        match started {
            Ok(_) => {
                let clock = quanta::Clock::new();
                let origin = clock.recent();
                Ok(CoarseClock { clock, origin })
            }
            Err(why) => Err(ConfigError::Upkeep(why.clone())),
        }
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        since(self.clock.recent(), self.origin)
    }
}

/// `now − origin` in nanoseconds, saturating at zero.
#[inline]
fn since(now: quanta::Instant, origin: quanta::Instant) -> Nanos {
    let d = now.saturating_duration_since(origin);
    // In `u64` rather than through `as_nanos`' `u128`, so that the compiler folds the
    // seconds/nanoseconds split of quanta's `Duration::from_nanos` back into the count it came
    // from: no division on the decision path. A `Duration` made from `u64` nanoseconds fits.
    Nanos::new(d.as_secs().wrapping_mul(1_000_000_000).wrapping_add(u64::from(d.subsec_nanos())))
}
