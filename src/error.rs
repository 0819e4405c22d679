//! Construction errors. A denial is an outcome ([`Decision`](crate::Decision)), never an error.

use core::fmt;

use crate::quota::{MAX_BURST, MAX_FILL_UNITS, MAX_UNITS_PER_NANO};

/// Why a [`Quota`](crate::Quota) or a clock could not be built.
///
/// Every variant names the limit that was crossed, so the message alone says how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate's token count is zero. Zero rates are not supported: use a burst and no refill
    /// by choosing a very long period instead, or do not build a limiter.
    ZeroRate,
    /// The rate's period is zero.
    ZeroPeriod,
    /// The burst (the bucket's capacity) is zero.
    ZeroBurst,
    /// The burst exceeds [`Quota::MAX_BURST`](crate::Quota::MAX_BURST).
    BurstTooLarge {
        /// The burst that was asked for.
        burst: u64,
    },
    /// The initial level exceeds the burst.
    InitialAboveBurst {
        /// The initial level that was asked for.
        initial: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// A duration does not fit in `u64` nanoseconds (584 years).
    DurationTooLong {
        /// The duration, in nanoseconds.
        nanos: u128,
    },
    /// The rate is faster than one token per 1/64 ns (64 tokens per nanosecond, 6.4e10/s).
    RateTooHigh {
        /// Tokens per period.
        tokens: u64,
        /// The period, in nanoseconds.
        period_nanos: u64,
    },
    /// Refilling the whole burst takes longer than the packed word can count
    /// (`burst × period / tokens` above 2^62 ns ≈ 146 years at 1 ns resolution).
    FillTimeTooLong {
        /// The burst.
        burst: u64,
        /// Tokens per period.
        tokens: u64,
        /// The period, in nanoseconds.
        period_nanos: u64,
    },
    /// A value outside the range a limiter supports.
    OutOfRange {
        /// What the value configures.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest supported value.
        max: u64,
    },
    /// A sliding window too short for its limit: the packed window index would run out within
    /// 100 years.
    WindowTooShort {
        /// The limit.
        limit: u64,
        /// The window, in nanoseconds.
        window_nanos: u64,
        /// The shortest window this limit supports, in nanoseconds.
        min_nanos: u64,
    },
    /// The coarse clock's upkeep thread could not be started.
    Upkeep(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroRate => {
                f.write_str("zero rates are not supported: tokens per period must be at least 1")
            }
            ConfigError::ZeroPeriod => f.write_str("the rate's period must be at least 1 ns"),
            ConfigError::ZeroBurst => f.write_str("the burst must be at least 1 token"),
            ConfigError::BurstTooLarge { burst } => {
                write!(f, "burst {burst} exceeds the maximum of {MAX_BURST} tokens")
            }
            ConfigError::InitialAboveBurst { initial, burst } => {
                write!(f, "initial level {initial} exceeds the burst of {burst} tokens")
            }
            ConfigError::DurationTooLong { nanos } => {
                write!(f, "duration of {nanos} ns exceeds the maximum of {} ns (584 years)", u64::MAX)
            }
            ConfigError::RateTooHigh { tokens, period_nanos } => write!(
                f,
                "rate of {tokens} tokens per {period_nanos} ns exceeds the maximum of \
                 {MAX_UNITS_PER_NANO} tokens per nanosecond"
            ),
            ConfigError::FillTimeTooLong { burst, tokens, period_nanos } => write!(
                f,
                "refilling a burst of {burst} at {tokens} tokens per {period_nanos} ns takes longer \
                 than the maximum fill time of {MAX_FILL_UNITS} ns (about 146 years); \
                 lower the burst or raise the rate"
            ),
            ConfigError::OutOfRange { what, value, max } => {
                write!(f, "{what} of {value} exceeds the maximum of {max}")
            }
            ConfigError::WindowTooShort { limit, window_nanos, min_nanos } => write!(
                f,
                "a sliding window of {window_nanos} ns is too short for a limit of {limit}: \
                 it needs at least {min_nanos} ns to last 100 years"
            ),
            ConfigError::Upkeep(why) => write!(f, "could not start the coarse clock: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}
