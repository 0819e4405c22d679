//! The token bucket on [`Direct`]: `Limiter`. Reads the clock once per decision and hands the
//! bucket instant to the bucket; nothing below reads a clock.

use crossbeam_utils::CachePadded;

use crate::engine::config::WORDS;
use crate::engine::direct::{Algorithm, Direct};
use crate::policies::bucket::atomic::AtomicBucket;
use crate::policies::bucket::BucketWord;
use crate::policies::token_bucket::At;
use crate::{Clock, Decision, DefaultClock, Nanos, TokenBucket, UpdateError};

/// A single token bucket shared by any number of threads: [`Direct`] running a [`TokenBucket`].
///
/// Every decision is lock-free and allocation-free: one clock read, one load, and one CAS when
/// tokens are taken. A decision that takes tokens takes effect at its successful CAS; one that
/// takes none (a denial, a peek) at the load it decided on. Concurrent callers are never jointly
/// granted more than the quota: starting full, at most `burst + floor(rate·span)` tokens over
/// any span (see [`TokenBucket`] for the rounding, which only ever lowers the rate).
///
/// ```
/// use tollgate::{Limiter, TokenBucket};
///
/// let limiter = Limiter::new(TokenBucket::per_second(2)?);
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let third = limiter.check();
/// assert!(!third.is_allowed());
/// assert!(third.retry_after().unwrap().as_millis() <= 500);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// A `now` earlier than a previous one is judged as of that earlier time: the bucket has
/// refilled less, never more.
pub type Limiter<C = DefaultClock> = Direct<TokenBucket, C>;

/// The token bucket's own loop (`bucket/atomic.rs`), tuned to the nanosecond. Its bucket starts
/// at the quota's initial level (full by default) at the limiter's creation.
impl Algorithm for TokenBucket {
    type State = CachePadded<AtomicBucket>;

    fn config_words(&self) -> Option<[u64; WORDS]> {
        Some(self.words())
    }

    fn from_config_words(words: [u64; WORDS]) -> Option<TokenBucket> {
        Some(TokenBucket::from_words(words))
    }

    /// The new quota counted in this limiter's time unit, from its clock's start: the bucket's
    /// empty instant means the same time under it.
    fn direct_update(&self, _: &Self::State, new: TokenBucket) -> Result<Option<TokenBucket>, UpdateError> {
        Ok(Some(new.for_running(self)?))
    }

    fn new_state(&self) -> CachePadded<AtomicBucket> {
        let start = self.now_units(Nanos::ZERO);
        CachePadded::new(AtomicBucket::new(BucketWord::with_tokens(self, start, self.initial())))
    }

    #[inline(always)]
    fn direct_check(&self, bucket: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        check_at(self, bucket, self.instant(now, origin), n, None::<fn() -> At>)
    }

    /// `direct_check`, where a denial on a stamp ahead of the reading is decided again at a
    /// fresh one ([`AtomicBucket::charge_fresh`]).
    #[inline(always)]
    fn direct_check_clock<C: Clock>(
        &self,
        bucket: &Self::State,
        clock: &C,
        origin: Nanos,
        n: u64,
    ) -> Decision {
        let fresh = || self.instant(clock.now(), origin);
        check_at(self, bucket, self.instant(clock.now(), origin), n, Some(fresh))
    }

    #[inline]
    fn direct_peek(&self, bucket: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        bucket.load().peek(self, self.instant(now, origin), n)
    }

    /// The receipt: the floor of the instant the tokens were taken at, and the stamp stored.
    #[inline]
    fn direct_charge(
        &self,
        bucket: &Self::State,
        now: Nanos,
        origin: Nanos,
        n: u64,
    ) -> (Decision, Option<[u64; 3]>) {
        let (d, taken) = charge_at(self, bucket, now, origin, n);
        (d, taken.map(|[floor, stamp]| [floor, stamp, 0]))
    }

    /// Gives back `n·t − (floor now − floor at the charge)`, at least nothing (see
    /// `AtomicBucket::refund`): exact at the charge's instant, in any order of refunds while
    /// the bucket is not in debt to a reservation; in debt, only the latest charge's.
    #[inline]
    fn direct_refund(
        &self,
        bucket: &Self::State,
        [floor, stamp, _]: [u64; 3],
        n: u64,
        origin: Nanos,
        now: impl Fn() -> Nanos,
    ) {
        bucket.refund(self, floor, stamp, n, || self.instant(now(), origin));
    }
}

/// `n` tokens at the bucket instant `now`; with `fresh`, a denial on a stamp ahead of it is
/// decided again at a new reading ([`AtomicBucket::charge_fresh`]).
#[inline(always)]
fn check_at(
    q: &TokenBucket,
    bucket: &AtomicBucket,
    now: At,
    n: u64,
    fresh: Option<impl FnOnce() -> At>,
) -> Decision {
    // One comparison for both `n == 0` and `n > burst` (none for `n = 1`): neither touches
    // the word.
    if q.takes_none(n) {
        return bucket.load().peek(q, now, n);
    }
    bucket.charge_fresh(q, now, n, fresh).0
}

/// `n` tokens at `now`, also returning, when tokens were taken, the floor of the instant they
/// were taken at and the stamp stored (a multi-limit receipt's).
#[inline(always)]
fn charge_at(
    q: &TokenBucket,
    bucket: &AtomicBucket,
    now: Nanos,
    origin: Nanos,
    n: u64,
) -> (Decision, Option<[u64; 2]>) {
    let now = q.instant(now, origin);
    // One comparison for both `n == 0` and `n > burst`: neither touches the word.
    if q.takes_none(n) {
        return (bucket.load().peek(q, now, n), None);
    }
    let (d, stored) = bucket.charge(q, now, n);
    (d, stored.map(|stamp| [now.floor, stamp.raw()]))
}
