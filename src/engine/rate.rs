//! `Rate`: a number of tokens per period, the plain value a token bucket's quota and a pacer's
//! schedule are both built from. Nothing is validated here: each user checks the ranges it
//! supports when it builds on a rate.

use core::time::Duration;

/// A rate: `tokens` per `period`. Validated when it becomes part of a
/// [`TokenBucket`](crate::TokenBucket) or a [`Pacer`](crate::Pacer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    tokens: u64,
    period: Duration,
}

impl Rate {
    /// `tokens` per `period`. See [`TokenBucket`](crate::TokenBucket) for the supported ranges.
    pub const fn per(tokens: u64, period: Duration) -> Rate {
        Rate { tokens, period }
    }
    /// `tokens` per second.
    pub const fn per_second(tokens: u64) -> Rate {
        Rate::per(tokens, Duration::from_secs(1))
    }
    /// `tokens` per minute.
    pub const fn per_minute(tokens: u64) -> Rate {
        Rate::per(tokens, Duration::from_secs(60))
    }
    /// `tokens` per hour.
    pub const fn per_hour(tokens: u64) -> Rate {
        Rate::per(tokens, Duration::from_secs(3600))
    }
    /// `tokens` per day.
    pub const fn per_day(tokens: u64) -> Rate {
        Rate::per(tokens, Duration::from_secs(86_400))
    }
    /// Tokens per period.
    pub const fn tokens(&self) -> u64 {
        self.tokens
    }
    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }
}
