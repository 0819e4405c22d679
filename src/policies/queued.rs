//! The queued token bucket: a request the bucket cannot serve now waits in line, up to a bound,
//! instead of being refused; beyond the bound it is refused at once. nginx's `burst` without
//! `nodelay`, for the token bucket: [`Outcome::Delayed`] with the wait, as the nginx limiter
//! answers.
//!
//! The line is the bucket's debt: an admission whose tokens are not there yet moves the
//! bucket's empty instant past `now` (a reservation, `BucketWord::reserve`), so later requests
//! queue behind it, in order, with no lock and no queue structure.

use core::fmt;
use core::time::Duration;

use crossbeam_utils::CachePadded;

use crate::engine::config::WORDS;
use crate::engine::direct::{Algorithm, Direct};
use crate::policies::bucket::atomic::AtomicBucket;
use crate::policies::bucket::{BucketWord, Verdict};
use crate::{ConfigError, Decision, DefaultClock, Nanos, TokenBucket, UpdateError};

/// How long the line may be, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// Requests wait at most this many nanoseconds.
    Wait(u64),
    /// At most this many tokens wait (their refill time: `tokens · t` units, exactly).
    Tokens(u64),
}

/// A token bucket whose requests wait in line, up to a bound, rather than be refused: the
/// configuration of a [`QueuedLimiter`].
///
/// A request the bucket can serve now is [`Allowed`](crate::Outcome::Allowed); one it can serve
/// within the bound is admitted [`Delayed`](crate::Outcome::Delayed) by
/// [`Decision::delay`] (its tokens are taken now, for then: serve it after the delay); one that
/// would wait longer is [`Denied`](crate::Outcome::Denied) at once, with
/// [`retry_after`](Decision::retry_after) saying when the line will have room for it. Requests
/// are served in the order they were admitted, at the bucket's rate: never more than
/// `burst + floor(rate·span)` tokens become due over any span.
///
/// The bound is a longest wait ([`new`](Queued::new), `"… queue=500ms"`) or a number of tokens
/// in line ([`with_max_queued`](Queued::with_max_queued), `"… queue=20"`: the line holds at
/// most 20 tokens' worth of refill time). A bucket of burst 1 with a line of 20 is nginx's
/// `rate=… burst=20` without `nodelay`: requests are spaced at the rate, and at most 20 wait.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Outcome, Queued, QueuedLimiter};
///
/// // 10 per second, one at once, and up to 2 more waiting in line.
/// let q: Queued = "10/s burst=1 queue=2".parse()?;
/// let l = QueuedLimiter::with_clock(q, ManualClock::new());
/// assert_eq!(l.check().outcome(), Outcome::Allowed);
/// let second = l.check();
/// assert_eq!(second.outcome(), Outcome::Delayed);
/// assert_eq!(second.delay(), Duration::from_millis(100));
/// assert_eq!(l.check().delay(), Duration::from_millis(200));
/// let refused = l.check(); // a third in line would wait 300 ms: the line is full
/// assert_eq!(refused.outcome(), Outcome::Denied);
/// assert_eq!(refused.retry_after(), Some(Duration::from_millis(100)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The bucket, with headroom for the line (its offset at least `queue`).
    bucket: TokenBucket,
    bound: Bound,
    /// The longest line, in the bucket's units.
    queue: u64,
}

impl Queued {
    /// `bucket`, with requests waiting up to `max_wait` in line.
    pub fn new(bucket: TokenBucket, max_wait: Duration) -> Result<Queued, ConfigError> {
        let nanos = Nanos::try_from(max_wait)?.as_u64();
        Queued::with_bound(bucket, Bound::Wait(nanos))
    }

    /// `bucket`, with at most `tokens` tokens waiting in line (the time the bucket takes to
    /// refill them, exactly).
    pub fn with_max_queued(bucket: TokenBucket, tokens: u64) -> Result<Queued, ConfigError> {
        Queued::with_bound(bucket, Bound::Tokens(tokens))
    }

    fn with_bound(bucket: TokenBucket, bound: Bound) -> Result<Queued, ConfigError> {
        let queue = units(&bucket, bound)?;
        // The bucket's word keeps room for stamps up to its offset past now: make it the line.
        let ns = Nanos::new(queue.div_ceil(bucket.units_per_nano())).max(bucket.max_fill_time());
        let bucket = bucket.with_max_fill_time(ns.as_duration())?;
        Ok(Queued { bucket, bound, queue })
    }

    /// The bucket.
    pub fn bucket(&self) -> TokenBucket {
        self.bucket
    }

    /// The longest wait in line, rounded down to whole nanoseconds.
    pub fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.queue / self.bucket.units_per_nano())
    }

    /// The most tokens in line, when the bound was given in tokens.
    pub fn max_queued(&self) -> Option<u64> {
        match self.bound {
            Bound::Tokens(n) => Some(n),
            Bound::Wait(_) => None,
        }
    }
}

/// The line in `bucket`'s units: at most [`TokenBucket::with_max_fill_time`]'s largest.
fn units(bucket: &TokenBucket, bound: Bound) -> Result<u64, ConfigError> {
    let units = match bound {
        Bound::Wait(ns) => u128::from(ns) * u128::from(bucket.units_per_nano()),
        Bound::Tokens(n) => u128::from(n) * u128::from(bucket.units_per_token()),
    };
    let max = crate::engine::arith::MAX_FILL_UNITS;
    u64::try_from(units).ok().filter(|&u| u <= max).ok_or_else(|| ConfigError::QueueTooLong {
        queue_nanos: u64::try_from(units / u128::from(bucket.units_per_nano())).unwrap_or(u64::MAX),
        max_nanos: max / bucket.units_per_nano(),
    })
}

impl fmt::Debug for Queued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Queued");
        d.field("rate", &self.bucket.rate()).field("burst", &self.bucket.burst());
        match self.bound {
            Bound::Tokens(n) => d.field("max_queued", &n),
            Bound::Wait(_) => d.field("max_wait", &self.max_wait()),
        };
        d.finish()
    }
}

/// A token bucket whose requests wait in line up to a bound: [`Direct`] running [`Queued`].
/// Its `check` answers [`Allowed`](crate::Outcome::Allowed),
/// [`Delayed`](crate::Outcome::Delayed) (serve after [`Decision::delay`]) or
/// [`Denied`](crate::Outcome::Denied) (the line is full).
pub type QueuedLimiter<C = DefaultClock> = Direct<Queued, C>;

impl Algorithm for Queued {
    type State = CachePadded<AtomicBucket>;

    fn config_words(&self) -> Option<[u64; WORDS]> {
        let mut w = self.bucket.words();
        // The bound in the word the bucket leaves free: a kind bit and a value below 2^62
        // (its units are, and a unit is at most a nanosecond or a token).
        w[WORDS - 1] = match self.bound {
            Bound::Wait(ns) => ns,
            Bound::Tokens(n) => 1 << 63 | n,
        };
        Some(w)
    }

    fn from_config_words(w: [u64; WORDS]) -> Option<Queued> {
        let bucket = TokenBucket::from_words(w);
        let value = w[WORDS - 1] & !(1 << 63);
        let bound = if w[WORDS - 1] >> 63 == 0 { Bound::Wait(value) } else { Bound::Tokens(value) };
        // Published by `direct_update`, which checked the line.
        let queue = units(&bucket, bound).ok()?;
        Some(Queued { bucket, bound, queue })
    }

    /// The new bucket counted in this limiter's time unit, as a `Limiter`'s `set_policy` does,
    /// with its line recounted in it; both within the headroom the limiter was built with (its
    /// longest fill or line).
    fn direct_update(&self, _: &Self::State, new: Queued) -> Result<Option<Queued>, UpdateError> {
        let bucket = new.bucket.for_running(&self.bucket)?;
        let queue = units(&bucket, new.bound)?;
        if queue > self.bucket.offset_units() {
            return Err(UpdateError::Config(ConfigError::QueueTooLong {
                queue_nanos: queue / bucket.units_per_nano(),
                max_nanos: self.bucket.offset_units() / bucket.units_per_nano(),
            }));
        }
        Ok(Some(Queued { bucket, bound: new.bound, queue }))
    }

    fn new_state(&self) -> CachePadded<AtomicBucket> {
        let q = &self.bucket;
        CachePadded::new(AtomicBucket::new(BucketWord::with_tokens(q, q.now_units(Nanos::ZERO), q.initial())))
    }

    #[inline]
    fn direct_check(&self, bucket: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        self.direct_charge(bucket, now, origin, n).0
    }

    #[inline]
    fn direct_peek(&self, bucket: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        let (q, at) = (&self.bucket, self.bucket.instant(now, origin));
        let word = bucket.load();
        if q.takes_none(n) {
            return word.peek(q, at, n);
        }
        match word.queue(q, at, n, self.queue) {
            // Served now: a plain peek's answer (the level as it is, see `BucketWord::peek`).
            Verdict::Take { next } if next.raw() <= at.now => word.peek(q, at, n),
            // Served later: what `check` would answer, its delay.
            Verdict::Take { next } => next.queued(q, at),
            Verdict::Final(d) => d,
        }
    }

    /// The receipt: the floor of the instant the tokens were taken at, and the stamp stored
    /// (a delayed admission's is ahead of now: its refund is a cancel's, see
    /// `AtomicBucket::refund`).
    #[inline]
    fn direct_charge(
        &self,
        bucket: &Self::State,
        now: Nanos,
        origin: Nanos,
        n: u64,
    ) -> (Decision, Option<[u64; 3]>) {
        let (q, at) = (&self.bucket, self.bucket.instant(now, origin));
        if q.takes_none(n) {
            return (bucket.load().peek(q, at, n), None);
        }
        let (d, stored) = bucket.queue(q, at, n, self.queue);
        (d, stored.map(|stamp| [at.floor, stamp.raw(), 0]))
    }

    fn direct_refund(
        &self,
        bucket: &Self::State,
        [floor, stamp, _]: [u64; 3],
        n: u64,
        origin: Nanos,
        now: impl Fn() -> Nanos,
    ) {
        bucket.refund(&self.bucket, floor, stamp, n, || self.bucket.instant(now(), origin));
    }
}
