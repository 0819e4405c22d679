//! The same bucket in other systems' terms: GCRA (governor, redis-cell, Redis 8.8's `GCRA`) and
//! redis-cell's `CL.THROTTLE` reply.
//!
//! A token bucket and GCRA are one equation (`REFERENCE.md` §1.5): with emission interval `T` and
//! tolerance `τ`, a bucket of `burst = τ/T + 1` tokens refilled one per `T` admits exactly what
//! GCRA admits, and its empty instant is `TAT − τ − T`. So these are constructors and reply
//! shapes over the same engine, not separate algorithms.

use core::time::Duration;

use crate::{ConfigError, Decision, Nanos, Outcome, Rate, TokenBucket};

impl TokenBucket {
    /// GCRA in governor's terms: one cell per `emission_interval` (`T`), `burst` cells at once
    /// (`τ = T·(burst − 1)`). `TokenBucket::gcra(T, b)` admits what governor's
    /// `TokenBucket::with_period(T).allow_burst(b)` admits.
    pub fn gcra(emission_interval: Duration, burst: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per(1, emission_interval), burst)
    }

    /// redis-cell's `CL.THROTTLE key max_burst count period`: `T = period / count`, truncated to
    /// whole nanoseconds as redis-cell does, and `max_burst + 1` cells at once (redis-cell's
    /// `limit`).
    pub fn redis_cell(max_burst: u64, count: u64, period: Duration) -> Result<TokenBucket, ConfigError> {
        if count == 0 {
            return Err(ConfigError::ZeroRate);
        }
        let period = Nanos::try_from(period)?.as_u64();
        if period == 0 {
            return Err(ConfigError::ZeroPeriod);
        }
        let t = period / count;
        if t == 0 {
            return Err(ConfigError::RateTooHigh { tokens: count, period_nanos: period });
        }
        let burst = max_burst.checked_add(1).ok_or(ConfigError::BurstTooLarge { burst: max_burst })?;
        TokenBucket::new(Rate::per(1, Duration::from_nanos(t)), burst)
    }
}

/// A decision in the shape of redis-cell's `CL.THROTTLE` reply (and Redis 8.8's `GCRA`, whose
/// fields are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClThrottle {
    /// 0 when allowed, 1 when limited.
    pub limited: u8,
    /// `max_burst + 1`: the burst.
    pub limit: u64,
    /// Whole cells left.
    pub remaining: u64,
    /// Seconds until the same request would be allowed; −1 when allowed, and when it never
    /// can be (its quantity exceeds the limit).
    pub retry_after: i64,
    /// Seconds until the bucket is full again.
    pub reset_after: i64,
}

impl Decision {
    /// This decision as redis-cell would reply, for a limiter built with `quota`.
    ///
    /// Seconds are rounded as redis-cell rounds them: truncated, plus one when the remainder is
    /// at least 1 ms.
    pub fn cl_throttle(&self, quota: &TokenBucket) -> ClThrottle {
        let retry_after = match (self.outcome(), self.retry_after_nanos()) {
            (Outcome::Denied, Some(wait)) => redis_cell_seconds(wait),
            _ => -1,
        };
        ClThrottle {
            limited: u8::from(!self.is_allowed()),
            limit: quota.burst(),
            remaining: self.remaining(),
            retry_after,
            reset_after: redis_cell_seconds(self.reset_after_nanos()),
        }
    }
}

/// Truncated seconds, plus one if the remainder is at least 1 ms (redis-cell's reply rounding).
fn redis_cell_seconds(n: Nanos) -> i64 {
    let (secs, rem) = (n.as_u64() / 1_000_000_000, n.as_u64() % 1_000_000_000);
    let secs = secs + u64::from(rem >= 1_000_000);
    // At most 584 years of seconds: far below i64::MAX.
    i64::try_from(secs).unwrap_or(i64::MAX)
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn redis_cell_rounding() {
        for (ns, s) in
            [(0, 0), (999_999, 0), (1_000_000, 1), (1_000_000_000, 1), (1_000_999_999, 1), (1_001_000_000, 2)]
        {
            assert_eq!(redis_cell_seconds(Nanos::new(ns)), s, "{ns} ns");
        }
    }

    #[test]
    fn constructor_errors() {
        assert_eq!(TokenBucket::redis_cell(1, 0, Duration::from_secs(1)), Err(ConfigError::ZeroRate));
        assert_eq!(TokenBucket::redis_cell(1, 1, Duration::ZERO), Err(ConfigError::ZeroPeriod));
        assert!(matches!(
            TokenBucket::redis_cell(1, 2, Duration::from_nanos(1)),
            Err(ConfigError::RateTooHigh { .. })
        ));
        assert!(matches!(
            TokenBucket::redis_cell(u64::MAX, 1, Duration::from_secs(1)),
            Err(ConfigError::BurstTooLarge { .. })
        ));
        assert_eq!(TokenBucket::gcra(Duration::ZERO, 1), Err(ConfigError::ZeroPeriod));
    }
}
