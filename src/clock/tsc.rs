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

/// The interval at which [`CoarseClock`]'s upkeep thread refreshes the time.
pub const COARSE_INTERVAL: Duration = Duration::from_millis(1);

/// A cached time: one upkeep thread stores [`TscClock`]'s reading every [`COARSE_INTERVAL`],
/// and a read is one relaxed load (under 1 ns).
///
/// Decisions see time up to one interval late (more if the upkeep thread is descheduled), so a
/// bucket refills up to that much later than with [`TscClock`]: it can only under-admit. The
/// upkeep thread is tollgate's own, started by the first [`CoarseClock::new`] in the process,
/// and runs until the process exits. It does not use quanta's `Upkeep` (whose time stops when
/// whoever started it drops its handle, and which only one component of a process may start),
/// so nothing outside tollgate can stop this clock.
#[derive(Clone, Debug)]
pub struct CoarseClock {
    _private: (),
}

/// Whether the upkeep thread runs (`Ok`), or why it could not start.
static UPKEEP: OnceLock<Result<(), String>> = OnceLock::new();

/// Moves the kept time (in [`TscClock`]'s nanoseconds; 0 before the thread first runs)
/// forward to `clock`'s, never back.
fn refresh(clock: &TscClock) {
    crate::sync::coarse_time(Some(clock.now().as_u64()));
}

impl CoarseClock {
    /// Starts (once per process) the upkeep thread, and returns a clock reading its time.
    ///
    /// Fails only if the thread cannot be spawned.
    pub fn new() -> Result<CoarseClock, ConfigError> {
        let started = UPKEEP.get_or_init(|| {
            let clock = TscClock::new();
            // The time is current before the first clock is handed out.
            refresh(&clock);
            std::thread::Builder::new()
                .name("tollgate-coarse-clock".into())
                .spawn(move || loop {
                    std::thread::sleep(COARSE_INTERVAL);
                    refresh(&clock);
                })
                .map(drop)
                .map_err(|e| e.to_string())
        });
        match started {
            Ok(()) => Ok(CoarseClock { _private: () }),
            Err(why) => Err(ConfigError::Upkeep(why.clone())),
        }
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Absolute, as `TscClock`'s: the limiter subtracts its origin.
        Nanos::new(crate::sync::coarse_time(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clocks made at different times read one time (absolute, as `TscClock`'s), which only
    /// moves forward.
    #[test]
    fn coarse_clocks_share_one_time() {
        let a = CoarseClock::new().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let b = CoarseClock::new().unwrap();
        let (x, y) = (a.now(), b.now());
        let z = a.now();
        assert!(x <= y && y <= z, "{x:?} {y:?} {z:?}");
        assert!(x.as_u64() > 0, "the time is set before the first clock is handed out");
    }
}
