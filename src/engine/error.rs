//! Construction errors. A denial is an outcome ([`Decision`](crate::Decision)), never an error.

use core::fmt;

use crate::engine::arith::{MAX_BURST, MAX_FILL_UNITS, MAX_UNITS_PER_NANO};

/// Why a limit's configuration, a limiter or a clock could not be built.
///
/// Every variant names the limit that was crossed, so the message alone says how to fix it.
///
/// # One type for every configuration problem
///
/// A `ConfigError` is about a configuration itself: a value out of the range the algorithm or
/// table supports, found wherever the configuration is used. Building anything returns it.
/// Changing a running limiter ([`Direct::set_policy`](crate::Direct::set_policy),
/// [`Keyed::set_policy`](crate::Keyed::set_policy),
/// [`Keyed::set_tier_quota`](crate::Keyed::set_tier_quota),
/// [`Keyed::set_override`](crate::Keyed::set_override)) returns an [`UpdateError`] instead,
/// because such a change can also fail for reasons that are not in the new configuration (an
/// unknown tier, overrides full, an algorithm that cannot change at runtime, a configuration
/// that cannot read the running state). When the new configuration is itself the problem, the
/// `UpdateError` carries this type: [`UpdateError::config_error`] gives it (and so does
/// [`source`](std::error::Error::source)). So a caller that handles configuration problems in
/// one place matches `ConfigError`, taking it out of an `UpdateError` with `config_error`.
///
/// ```
/// use tollgate::{ConfigError, Limiter, TokenBucket};
///
/// fn problem(e: &ConfigError) -> String {
///     format!("bad limit: {e}")
/// }
///
/// let built = TokenBucket::per_second(0).map_err(|e| problem(&e));
/// assert!(built.unwrap_err().contains("zero rates"));
/// let l = Limiter::new(TokenBucket::per_second(10)?); // a fill time of 1 s at most
/// let changed = l.set_policy(TokenBucket::per_minute(10)?).unwrap_err();
/// let inner = changed.config_error().expect("the new quota itself is the problem");
/// assert!(matches!(inner, ConfigError::FillAboveMaxFillTime { .. }), "{inner}");
/// assert!(problem(inner).contains("with_max_fill_time"));
/// # Ok::<(), ConfigError>(())
/// ```
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
    /// The burst exceeds [`TokenBucket::MAX_BURST`](crate::TokenBucket::MAX_BURST).
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
    /// An nginx rate above what its fixed-point arithmetic holds.
    NginxRateTooHigh {
        /// The rate asked for, in requests per second (or per minute, as configured).
        rate: u64,
        /// The largest supported rate.
        max: u64,
    },
    /// An nginx burst above what the packed excess holds.
    NginxBurstTooLarge {
        /// The burst asked for.
        burst: u64,
        /// The largest supported burst.
        max: u64,
    },
    /// A window algorithm's limit of zero: it would admit nothing.
    ZeroLimit {
        /// The algorithm: `"fixed window"`, `"sliding window"` or `"sliding log"`.
        algorithm: &'static str,
    },
    /// A window algorithm's limit above what its packed word (or log) holds.
    LimitTooLarge {
        /// The algorithm.
        algorithm: &'static str,
        /// The limit asked for.
        limit: u64,
        /// The largest supported limit.
        max: u64,
    },
    /// A fixed window's limit above 2^24 − 1 with a window shorter than a second: a wider
    /// count leaves fewer bits for the window's index, which must last.
    WindowTooShortForLimit {
        /// The limit asked for.
        limit: u64,
        /// The window, in nanoseconds.
        window_nanos: u64,
        /// The shortest window for that limit, in nanoseconds.
        min_nanos: u64,
        /// The largest limit of a shorter window.
        max_short: u64,
    },
    /// A window of zero length.
    ZeroWindow {
        /// The algorithm.
        algorithm: &'static str,
    },
    /// A window longer than 2^62 ns (146 years).
    WindowTooLong {
        /// The algorithm.
        algorithm: &'static str,
        /// The window, in nanoseconds.
        window_nanos: u64,
        /// The longest supported window, in nanoseconds.
        max_nanos: u64,
    },
    /// A keyed table with room for no key.
    ZeroCapacity,
    /// A keyed table larger than the table can address (or, for the sliding log, whose logs
    /// would exceed 2^34 entries in all).
    CapacityTooLarge {
        /// The capacity asked for, in keys.
        capacity: u64,
        /// The largest supported capacity for this table.
        max: u64,
    },
    /// A shard count that is not a power of two from 1 to 64.
    InvalidShards {
        /// The shard count asked for.
        shards: u64,
    },
    /// More tiers than a keyed table can name.
    TooManyTiers {
        /// The tiers asked for, the default included.
        tiers: u64,
        /// The most tiers, the default included.
        max: u64,
    },
    /// Room for more per-key overrides than a table can address.
    TooManyOverrides {
        /// The overrides asked for.
        overrides: u64,
        /// The most overrides.
        max: u64,
    },
    /// A keyed tier's fill time (`burst × period / tokens`, or the `max_fill_time` headroom)
    /// beyond what the table's shared time base can count.
    TierFillTooLong {
        /// The fill time asked for, in nanoseconds (saturated).
        fill_nanos: u64,
        /// The longest supported fill time, in nanoseconds.
        max_nanos: u64,
    },
    /// A new quota for a running direct limiter whose fill time exceeds the largest it was
    /// built for ([`TokenBucket::with_max_fill_time`](crate::TokenBucket::with_max_fill_time)).
    FillAboveMaxFillTime {
        /// The new quota's fill time, in nanoseconds (saturated).
        fill_nanos: u64,
        /// The limiter's largest fill time, in nanoseconds.
        max_nanos: u64,
    },
    /// A queued bucket's line ([`Queued`](crate::Queued)) longer than its word has room for
    /// (2^62 of its time units), or, for a running limiter, than the line or fill it was built
    /// with.
    QueueTooLong {
        /// The line asked for, as a wait in nanoseconds (saturated).
        queue_nanos: u64,
        /// The longest line, in nanoseconds.
        max_nanos: u64,
    },
    /// A keyed token bucket whose new keys would start below a full bucket
    /// ([`TokenBucket::with_initial`](crate::TokenBucket::with_initial)). A keyed table reclaims
    /// a key once its bucket has refilled, because a full bucket decides as a fresh key's; with
    /// `initial < burst` it would not, and reclaiming a refilled key would take tokens from it.
    KeyedInitialBelowBurst {
        /// The initial level asked for.
        initial: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// The memory a keyed table asked for could not be had: the allocator refused it (a
    /// capacity larger than the machine, say). Nothing was built.
    OutOfMemory {
        /// What the memory was for.
        what: &'static str,
        /// The bytes asked for.
        bytes: u64,
    },
    /// A table-full policy the table cannot apply: [`WhenFull::EvictFullest`](crate::WhenFull)
    /// keeps ghosts that only a token bucket's state can be summarized by.
    EvictionUnsupported {
        /// The table's algorithm.
        algorithm: &'static str,
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
    /// A meter's rate or bucket of zero where it must pass something.
    MeterZero {
        /// The meter: `"srtcm"`, `"trtcm"` or `"rfc4115"`.
        meter: &'static str,
        /// The parameter: `"cir"`, `"cbs"`, `"pir"`, ...
        what: &'static str,
    },
    /// A meter's rate or bucket above what it counts exactly.
    MeterTooLarge {
        /// The meter.
        meter: &'static str,
        /// The parameter.
        what: &'static str,
        /// The value asked for (bytes per second, or bytes).
        value: u64,
        /// The largest supported.
        max: u64,
    },
    /// A [`Pacer`](crate::Pacer)'s interval between requests is longer than it can schedule.
    IntervalTooLong {
        /// The interval asked for, in nanoseconds.
        nanos: u128,
        /// The longest supported, in nanoseconds.
        max_nanos: u64,
    },
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
            ConfigError::NginxRateTooHigh { rate, max } => {
                write!(f, "nginx rate of {rate} r/s exceeds the maximum of {max} r/s")
            }
            ConfigError::NginxBurstTooLarge { burst, max } => {
                write!(f, "nginx burst of {burst} exceeds the maximum of {max} requests")
            }
            ConfigError::ZeroLimit { algorithm } => {
                write!(f, "a {algorithm} limit of 0 admits nothing: the limit must be at least 1")
            }
            ConfigError::LimitTooLarge { algorithm, limit, max } => {
                write!(f, "a {algorithm} limit of {limit} exceeds the maximum of {max}")
            }
            ConfigError::WindowTooShortForLimit { limit, window_nanos, min_nanos, max_short } => write!(
                f,
                "a fixed window limit of {limit} needs a window of at least {min_nanos} ns, got \
                 {window_nanos} ns (a shorter window counts to {max_short})"
            ),
            ConfigError::ZeroWindow { algorithm } => {
                write!(f, "a {algorithm} of zero length: the window must be at least 1 ns")
            }
            ConfigError::WindowTooLong { algorithm, window_nanos, max_nanos } => write!(
                f,
                "a {algorithm} of {window_nanos} ns exceeds the longest supported window of \
                 {max_nanos} ns (146 years)"
            ),
            ConfigError::ZeroCapacity => f.write_str("a keyed table's capacity must be at least 1 key"),
            ConfigError::CapacityTooLarge { capacity, max } => {
                write!(f, "a keyed capacity of {capacity} keys exceeds this table's maximum of {max}")
            }
            ConfigError::InvalidShards { shards } => {
                write!(f, "{shards} shards: the shard count must be a power of two from 1 to 64")
            }
            ConfigError::TooManyTiers { tiers, max } => {
                write!(f, "{tiers} tiers (the default included) exceed the maximum of {max}")
            }
            ConfigError::TooManyOverrides { overrides, max } => {
                write!(f, "room for {overrides} per-key overrides exceeds the maximum of {max}")
            }
            ConfigError::TierFillTooLong { fill_nanos, max_nanos } => write!(
                f,
                "a keyed tier's fill time of {fill_nanos} ns exceeds the table's maximum of \
                 {max_nanos} ns"
            ),
            ConfigError::FillAboveMaxFillTime { fill_nanos, max_nanos } => write!(
                f,
                "a fill time of {fill_nanos} ns exceeds this limiter's largest of {max_nanos} ns: \
                 build its quota with TokenBucket::with_max_fill_time to allow more"
            ),
            ConfigError::QueueTooLong { queue_nanos, max_nanos } => write!(
                f,
                "a line of {queue_nanos} ns of waiting exceeds the longest of {max_nanos} ns this \
                 bucket has room for"
            ),
            ConfigError::KeyedInitialBelowBurst { initial, burst } => write!(
                f,
                "a keyed table's buckets start full: an initial level {initial} below the burst of \
                 {burst} would make a reclaimed key differ from a refilled one (use it on a \
                 direct limiter)"
            ),
            ConfigError::OutOfMemory { what, bytes } => write!(
                f,
                "could not allocate {bytes} bytes for {what}: lower the capacity (or max_overrides)"
            ),
            ConfigError::EvictionUnsupported { algorithm } => write!(
                f,
                "WhenFull::EvictFullest needs a token bucket's state, and a keyed {algorithm} \
                 has none: use WhenFull::Deny or WhenFull::Allow"
            ),
            ConfigError::WindowTooShort { limit, window_nanos, min_nanos } => write!(
                f,
                "a sliding window of {window_nanos} ns is too short for a limit of {limit}: \
                 it needs at least {min_nanos} ns to last 100 years"
            ),
            ConfigError::Upkeep(why) => write!(f, "could not start the coarse clock: {why}"),
            ConfigError::MeterZero { meter, what } => {
                write!(f, "{meter}'s {what} of 0 would pass nothing: it must be at least 1")
            }
            ConfigError::MeterTooLarge { meter, what, value, max } => {
                write!(f, "{meter}'s {what} of {value} exceeds the maximum of {max}")
            }
            ConfigError::IntervalTooLong { nanos, max_nanos } => write!(
                f,
                "an interval of {nanos} ns between paced requests exceeds the maximum of {max_nanos} ns"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a change to a running limiter (its configuration, a tier's quota, a key's override) was
/// refused. Nothing changed.
///
/// A type of its own, beside [`ConfigError`], because a change can be refused for what the
/// running limiter is, not only for what the new configuration is: the tier is not one of its
/// own, its overrides are full, its algorithm cannot change at runtime, or the new
/// configuration cannot read its state. When the new configuration is itself out of range,
/// the refusal is [`UpdateError::Config`], and [`config_error`](UpdateError::config_error)
/// (like [`source`](std::error::Error::source)) gives the [`ConfigError`] inside: one type to
/// match for every configuration problem, built or changed. A `ConfigError` converts into an
/// `UpdateError` (`?` in a function that returns one).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateError {
    /// The tier is not one of this limiter's.
    UnknownTier {
        /// The tier's index.
        tier: usize,
        /// How many tiers the limiter has, the default included.
        tiers: usize,
    },
    /// The per-key overrides are full (at most half their room is used, so that look-ups of
    /// absent keys stay short); see `KeyedBuilder::max_overrides`.
    OverridesFull {
        /// The most overrides the limiter holds.
        max: u64,
    },
    /// The new configuration does not fit this limiter.
    Config(ConfigError),
    /// The limiter's algorithm cannot change its configuration at runtime (a [`Policy`] of
    /// your own that does not say how).
    ///
    /// [`Policy`]: crate::Policy
    Unsupported,
    /// The new configuration cannot read the limiter's state: `reason` says what may not change.
    Incompatible {
        /// What may not change, and why.
        reason: &'static str,
    },
}

impl UpdateError {
    /// The configuration problem, when the new configuration itself is out of range
    /// ([`UpdateError::Config`]); `None` when the change was refused for what the running
    /// limiter is (an unknown tier, full overrides, an algorithm that cannot change, a state
    /// the new configuration cannot read).
    pub fn config_error(&self) -> Option<&ConfigError> {
        match self {
            UpdateError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::UnknownTier { tier, tiers } => {
                write!(f, "tier {tier} is not one of this limiter's {tiers} tiers")
            }
            UpdateError::OverridesFull { max } => {
                write!(f, "the per-key overrides are full ({max} keys): raise max_overrides")
            }
            UpdateError::Config(e) => write!(f, "the new configuration does not fit: {e}"),
            UpdateError::Unsupported => {
                f.write_str("this limiter's algorithm cannot change its configuration at runtime")
            }
            UpdateError::Incompatible { reason } => {
                write!(f, "the new configuration cannot take over the limiter's state: {reason}")
            }
        }
    }
}

/// The source of [`UpdateError::Config`] is the [`ConfigError`] inside.
impl std::error::Error for UpdateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.config_error().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ConfigError> for UpdateError {
    fn from(e: ConfigError) -> UpdateError {
        UpdateError::Config(e)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::{ConfigError, UpdateError};
    use std::error::Error;

    /// A configuration problem met on a change is the same `ConfigError` a build meets, taken
    /// out of the `UpdateError` by `config_error` and by `source`; other refusals have none.
    #[test]
    fn an_update_error_gives_the_config_error_inside() {
        let inner = ConfigError::BurstTooLarge { burst: 1 << 40 };
        let e = UpdateError::from(inner.clone());
        assert_eq!(e, UpdateError::Config(inner.clone()));
        assert_eq!(e.config_error(), Some(&inner));
        let source = e.source().and_then(|s| s.downcast_ref::<ConfigError>());
        assert_eq!(source, Some(&inner));
        assert!(e.to_string().contains(&inner.to_string()), "{e}");
        for other in [
            UpdateError::Unsupported,
            UpdateError::UnknownTier { tier: 3, tiers: 1 },
            UpdateError::OverridesFull { max: 1 },
            UpdateError::Incompatible { reason: "the window may not change" },
        ] {
            assert_eq!(other.config_error(), None, "{other}");
            assert!(other.source().is_none(), "{other}");
        }
    }
}
