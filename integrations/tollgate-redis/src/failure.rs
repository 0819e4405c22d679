//! What a limiter does when Redis does not answer: the policy, the breaker, the counters.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tollgate::TokenBucket;

/// What a decision is when Redis cannot make it (a [transient](crate::Error::is_transient)
/// failure: a timeout, the breaker open, a lost connection, a server loading or failing over).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OnFailure {
    /// Return the error (the default): the caller decides.
    Error,
    /// Fail closed: refuse, with `Decision::denied` and the breaker's remaining cooldown (or
    /// the timeout) as the retry-after. Never over-admits; refuses everything while Redis is down.
    Deny,
    /// Fail open: admit without counting (`Outcome::Untracked`). Nothing limits while Redis is
    /// down.
    Allow,
    /// Decide on a local keyed table with this quota, typically the shared rate divided by the
    /// number of instances ([`share`]). Each instance then admits at most its share while Redis
    /// is down; the fleet at most the sum of the shares, plus what each local bucket held.
    Local(TokenBucket),
}

/// `quota` split between `instances`: the rate divided by `instances` (rounded down) and the
/// burst divided by `instances` (at least 1), for [`OnFailure::Local`].
pub fn share(quota: &TokenBucket, instances: u32) -> Result<TokenBucket, tollgate::ConfigError> {
    let instances = u64::from(instances.max(1));
    let rate = quota.rate();
    let period =
        rate.period().checked_mul(u32::try_from(instances).unwrap_or(u32::MAX)).unwrap_or(Duration::MAX);
    TokenBucket::new(tollgate::Rate::per(rate.tokens(), period), (quota.burst() / instances).max(1))
}

/// What a limiter did, counted since it was built. Every decision call (`check*`, `peek*`) is
/// counted in exactly one of `redis`, `failed_error`, `failed_deny`, `failed_allow` and
/// `local`; the failures of calls to Redis are counted by cause (`server_time` included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Decisions Redis made.
    pub redis: u64,
    /// Calls that returned an error (under `OnFailure::Error`, or a failure that is not transient).
    pub failed_error: u64,
    /// Refusals because Redis could not decide (`OnFailure::Deny`).
    pub failed_deny: u64,
    /// Admissions because Redis could not decide (`OnFailure::Allow`).
    pub failed_allow: u64,
    /// Decisions the local fallback made (`OnFailure::Local`).
    pub local: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Calls that failed otherwise (I/O, the server's error replies).
    pub errors: u64,
    /// Calls not sent because the breaker was open.
    pub short_circuited: u64,
    /// Times the breaker opened.
    pub breaker_trips: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) redis: AtomicU64,
    pub(crate) failed_error: AtomicU64,
    pub(crate) failed_deny: AtomicU64,
    pub(crate) failed_allow: AtomicU64,
    pub(crate) local: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) short_circuited: AtomicU64,
    pub(crate) breaker_trips: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        // Relaxed: statistics; no other memory is published through them.
        c.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            redis: self.redis.load(Relaxed),
            failed_error: self.failed_error.load(Relaxed),
            failed_deny: self.failed_deny.load(Relaxed),
            failed_allow: self.failed_allow.load(Relaxed),
            local: self.local.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            errors: self.errors.load(Relaxed),
            short_circuited: self.short_circuited.load(Relaxed),
            breaker_trips: self.breaker_trips.load(Relaxed),
        }
    }
}

/// A circuit breaker: after `threshold` consecutive transient failures it opens for
/// `cooldown`, during which calls fail at once without touching the network; then it lets one
/// call through (half-open) per cooldown, and the first success closes it.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    start: Instant,
    failures: AtomicU32, // saturating: a breaker that failed 2^32 times stays at the threshold
    /// While open: nanoseconds after `start` at which the next probe may go. 0: closed.
    open_until: AtomicU64,
}

/// Whether a call may go to Redis.
pub(crate) enum Gate {
    Pass,
    Open { retry_in: Duration },
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            start: Instant::now(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    /// The time between probes while open.
    pub(crate) fn cooldown(&self) -> Duration {
        self.cooldown
    }

    fn cooldown_nanos(&self) -> u64 {
        u64::try_from(self.cooldown.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Lets a call through when closed; when open, one call per cooldown (the probe).
    // All Relaxed: the breaker publishes no memory; a racing thread that reads a stale state
    // lets one extra probe through or fails one extra call fast, both harmless.
    pub(crate) fn enter(&self) -> Gate {
        let until = self.open_until.load(Relaxed);
        if until == 0 {
            return Gate::Pass;
        }
        let now = self.now();
        if now < until {
            return Gate::Open { retry_in: Duration::from_nanos(until - now) };
        }
        // Half-open: the caller that moves the deadline is the probe.
        let next = now.saturating_add(self.cooldown_nanos());
        match self.open_until.compare_exchange(until, next, Relaxed, Relaxed) {
            Ok(_) => Gate::Pass,
            Err(_) => Gate::Open { retry_in: self.remaining() },
        }
    }

    /// The time until the next probe; zero when closed.
    pub(crate) fn remaining(&self) -> Duration {
        let until = self.open_until.load(Relaxed);
        Duration::from_nanos(until.saturating_sub(self.now()))
    }

    /// Records a call that Redis answered; true when it closed an open breaker (a probe that
    /// succeeded).
    pub(crate) fn success(&self) -> bool {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
        // A swap only while open, so that the common path stays a load: of racing successes,
        // the one that read the open deadline reports the close.
        self.open_until.load(Relaxed) != 0 && self.open_until.swap(0, Relaxed) != 0
    }

    /// Records a transient failure; true when it opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        let failures = match self.failures.fetch_update(Relaxed, Relaxed, |f| Some(f.saturating_add(1))) {
            Ok(f) | Err(f) => f.saturating_add(1),
        };
        if failures < self.threshold {
            return false;
        }
        let next = self.now().saturating_add(self.cooldown_nanos());
        // Only the failure that opens a closed breaker counts a trip; a failed probe (or a late
        // failure of a call sent before the trip) re-arms the cooldown.
        match self.open_until.compare_exchange(0, next, Relaxed, Relaxed) {
            Ok(_) => true,
            Err(_) => {
                self.open_until.store(next, Relaxed);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_opens_after_the_threshold_and_probes_once_per_cooldown() {
        let b = Breaker::new(3, Duration::from_millis(20));
        assert!(matches!(b.enter(), Gate::Pass));
        assert!(!b.failure() && !b.failure());
        assert!(b.failure(), "the third failure opens it");
        assert!(matches!(b.enter(), Gate::Open { .. }));
        std::thread::sleep(Duration::from_millis(25));
        assert!(matches!(b.enter(), Gate::Pass), "one probe after the cooldown");
        assert!(matches!(b.enter(), Gate::Open { .. }), "and only one");
        assert!(!b.failure(), "a failed probe re-arms, not a new trip");
        std::thread::sleep(Duration::from_millis(25));
        assert!(matches!(b.enter(), Gate::Pass));
        b.success();
        assert!(matches!(b.enter(), Gate::Pass) && matches!(b.enter(), Gate::Pass), "closed again");
    }

    #[test]
    fn a_share_divides_rate_and_burst() {
        let q = TokenBucket::new(tollgate::Rate::per_second(100), 40).unwrap();
        let s = share(&q, 4).unwrap();
        assert_eq!((s.rate().tokens(), s.rate().period(), s.burst()), (100, Duration::from_secs(4), 10));
        assert_eq!(share(&q, 0).unwrap().burst(), 40);
        assert_eq!(share(&q, 1000).unwrap().burst(), 1);
    }
}
