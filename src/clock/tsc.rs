//! The quanta clocks: TSC reads and the coarse cached time.

use std::sync::OnceLock;
use std::time::Duration;

use crate::{Clock, ConfigError, Nanos};

/// quanta's TSC clock: one `rdtsc` and a fixed-point scale per read, ~1 ns precision.
///
/// Falls back to the OS monotonic clock where quanta finds no usable invariant TSC. The first one
/// in a process calibrates for up to ~200 ms; clones share the calibration. See the
/// [module docs](crate::clock) for skew and suspend.
///
/// On x86-64, when the TSC ticks faster than 1 GHz (every invariant TSC of the last decade),
/// a read is `rdtsc` and one multiply: quanta's scale (a multiply and a variable shift, behind
/// two checks of which clock it runs) is turned at construction into one 0.64 fixed-point
/// factor that gives the same nanosecond for every count (checked when the clock is made).
#[derive(Clone, Debug)]
pub struct TscClock {
    /// Nanoseconds per TSC tick, as a 0.64 fixed-point fraction, when a read may take the TSC
    /// directly; 0 when it goes through quanta (always, off x86-64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    scale: u64,
    clock: quanta::Clock,
}

impl TscClock {
    /// A clock on quanta's timeline (its origin is the counter's zero, typically boot).
    pub fn new() -> TscClock {
        let clock = quanta::Clock::new();
        TscClock { scale: direct_scale(&clock), clock }
    }
}

/// quanta's scale for `clock` as one 0.64 fixed-point factor, or 0 when a read must go
/// through quanta: quanta runs on the OS clock, or its counter ticks at 1 GHz or slower, or its
/// raw reading is not this CPU's `rdtsc`, or the factor would give any other nanosecond than
/// quanta does for a sample of counts.
///
/// quanta converts a count `x` to `x·f / 2^s` (rounded down), with `s < 64`. Scaled, the count
/// 2^63 gives `f·2^(63−s)` exactly, so `F = 2·that = f·2^(64−s)`, and `x·F / 2^64` is the same
/// number for every `x`; `F` fits in 64 bits when `f / 2^s < 1`: a tick under a nanosecond.
#[cfg(target_arch = "x86_64")]
fn direct_scale(clock: &quanta::Clock) -> u64 {
    let half = clock.delta_as_nanos(0, 1 << 63);
    if half >= 1 << 63 {
        return 0; // the OS clock (quanta's identity scale), or a slow counter
    }
    let scale = half << 1;
    // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions.
    let before = unsafe { core::arch::x86_64::_rdtsc() };
    let raw = clock.raw();
    // SAFETY: as above.
    let after = unsafe { core::arch::x86_64::_rdtsc() };
    if !(before <= raw && raw <= after) {
        return 0; // not the TSC (or this thread moved to a core whose TSC disagrees)
    }
    let samples = [1, 3, 999_999_937, raw, raw / 3 * 2, raw.wrapping_mul(7) | 1, u64::MAX / 5, u64::MAX];
    let same = samples.iter().all(|&x| scaled(x, scale) == clock.delta_as_nanos(0, x));
    if same {
        scale
    } else {
        0
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn direct_scale(_: &quanta::Clock) -> u64 {
    0
}

/// `x·scale / 2^64`: the nanoseconds of `x` ticks at `scale` (0.64 fixed point).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn scaled(x: u64, scale: u64) -> u64 {
    // The high half of a 64×64 product: it fits.
    ((u128::from(x) * u128::from(scale)) >> 64) as u64
}

impl Default for TscClock {
    fn default() -> Self {
        TscClock::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now(&self) -> Nanos {
        // The limiter subtracts its own origin (saturating), so the clock needs none: one
        // subtraction fewer between the read and the CAS. (Measured faster than
        // `Clock::now()` minus an origin `Instant`.)
        #[cfg(target_arch = "x86_64")]
        if self.scale != 0 {
            // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions.
            let tsc = unsafe { core::arch::x86_64::_rdtsc() };
            return Nanos::new(scaled(tsc, self.scale));
        }
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

    /// The direct read gives quanta's nanosecond for every count, and reads between two
    /// quanta readings.
    #[test]
    fn the_direct_read_is_quantas_time() {
        let clock = TscClock::new();
        for x in (0..64).map(|b| 1u64 << b).chain((1..1000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        {
            if clock.scale != 0 {
                assert_eq!(scaled(x, clock.scale), clock.clock.delta_as_nanos(0, x), "count {x}");
            }
        }
        let quanta = |c: &TscClock| c.clock.delta_as_nanos(0, c.clock.raw());
        let (a, b, c) = (quanta(&clock), clock.now().as_u64(), quanta(&clock));
        assert!(a <= b && b <= c, "{a} {b} {c}");
        #[cfg(target_arch = "x86_64")]
        eprintln!("direct TSC read: {}", clock.scale != 0);
    }

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
