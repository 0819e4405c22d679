//! `Nanos`: the one time type that crosses module boundaries. No clock is read here.

use core::fmt;
use core::time::Duration;

/// [`Nanos::units_since`] for a time before the origin or past `most`.
#[cold]
#[inline(never)]
fn units_since_held(now: Nanos, origin: Nanos, most: u64, m: u64) -> u64 {
    now.saturating_sub(origin).0.min(most) * m
}

/// A count of nanoseconds: an instant on a [`Clock`](crate::Clock)'s timeline, or a span.
///
/// Arithmetic saturates; it never wraps and never panics. `u64` nanoseconds cover 584 years.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// Zero nanoseconds.
    pub const ZERO: Nanos = Nanos(0);
    /// The largest representable value, about 584 years.
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// Wraps a raw nanosecond count.
    #[inline]
    pub const fn new(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// The raw nanosecond count.
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero if `earlier` is later (a clock that appears to go backwards).
    #[inline]
    pub const fn saturating_sub(self, earlier: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(earlier.0))
    }

    /// `m ×` the nanoseconds from `origin` to `self`, held to `0 ..= most` (a time before the
    /// origin is the origin; past `most`, time stops): a limiter's clock in its units. Both
    /// holds sit behind branches that are never taken, on a cold path, which keeps them off
    /// the chain from the clock read to the CAS (two conditional moves were on it).
    #[inline(always)]
    pub(crate) fn units_since(self, origin: Nanos, most: u64, m: u64) -> u64 {
        let (e, before_origin) = self.0.overflowing_sub(origin.0);
        if before_origin || e > most {
            return units_since_held(self, origin, most, m);
        }
        e * m
    }

    /// `self + span`, saturating at [`Nanos::MAX`].
    #[inline]
    pub const fn saturating_add(self, span: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(span.0))
    }

    /// Converts a [`Duration`], saturating at [`Nanos::MAX`] (584 years).
    #[inline]
    pub const fn from_duration_saturating(d: Duration) -> Nanos {
        let n = d.as_nanos();
        if n > u64::MAX as u128 {
            Nanos::MAX
        } else {
            #[expect(clippy::cast_possible_truncation, reason = "checked against u64::MAX above")]
            Nanos(n as u64)
        }
    }

    /// Converts to a [`Duration`]; exact, since every `u64` nanosecond count fits.
    #[inline]
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

impl From<Nanos> for Duration {
    #[inline]
    fn from(n: Nanos) -> Duration {
        n.as_duration()
    }
}

impl TryFrom<Duration> for Nanos {
    type Error = crate::ConfigError;

    /// Fails for durations beyond `u64::MAX` nanoseconds (584 years).
    fn try_from(d: Duration) -> Result<Nanos, Self::Error> {
        u64::try_from(d.as_nanos())
            .map(Nanos)
            .map_err(|_| crate::ConfigError::DurationTooLong { nanos: d.as_nanos() })
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}
