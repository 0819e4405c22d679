//! `Limiter`: one token bucket (a *direct* limiter). Reads the clock once per decision and hands
//! the bucket instant to the bucket; nothing below reads a clock.

use core::fmt;

use crossbeam_utils::CachePadded;

use crate::bucket::atomic::AtomicBucket;
use crate::bucket::BucketWord;
use crate::quota::At;
use crate::{Clock, Decision, DefaultClock, Nanos, Quota};

/// A single token bucket shared by any number of threads.
///
/// Every decision is lock-free and allocation-free: one clock read, one load, and one CAS when
/// tokens are taken. A decision that takes tokens takes effect at its successful CAS; one that
/// takes none (a denial, a peek) at the load it decided on. Concurrent callers are never jointly
/// granted more than the quota: starting full, at most `burst + floor(rate·span)` tokens over
/// any span (see [`Quota`] for the rounding, which only ever lowers the rate).
///
/// ```
/// use tollgate::{Limiter, Quota};
///
/// let limiter = Limiter::new(Quota::per_second(2)?);
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let third = limiter.check();
/// assert!(!third.is_allowed());
/// assert!(third.retry_after().unwrap().as_millis() <= 500);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// The `*_at` methods take `now` from the caller, on this limiter's clock's timeline
/// ([`Limiter::now`]), so a batch can share one clock read. A `now` earlier than a previous one
/// is judged as of that earlier time: the bucket has refilled less, never more.
pub struct Limiter<C: Clock = DefaultClock> {
    bucket: CachePadded<AtomicBucket>,
    quota: Quota,
    origin: Nanos,
    clock: C,
    id: u64,
}

impl Limiter<DefaultClock> {
    /// A limiter on the default clock ([`TscClock`](crate::TscClock) with the `quanta` feature).
    pub fn new(quota: Quota) -> Limiter<DefaultClock> {
        Limiter::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> Limiter<C> {
    /// A limiter on `clock`. Its bucket starts at the quota's initial level (full by default)
    /// at the clock's current time.
    pub fn with_clock(quota: Quota, clock: C) -> Limiter<C> {
        let origin = clock.now();
        let start = quota.now_units(Nanos::ZERO);
        let word = BucketWord::with_tokens(&quota, start, quota.initial());
        Limiter {
            bucket: CachePadded::new(AtomicBucket::new(word)),
            quota,
            origin,
            clock,
            id: crate::sync::next_id(),
        }
    }

    /// The bucket instant of `now`: units since this limiter's creation (see `bucket.rs`).
    #[inline]
    fn instant(&self, now: Nanos) -> At {
        self.quota.instant(now, self.origin)
    }

    /// Takes one token now, or says how long to wait.
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n_at(self.clock.now(), 1)
    }

    /// Takes `n` tokens now, all or none. `n = 0` is always allowed and takes nothing;
    /// `n` above the burst is [`Outcome::Insufficient`](crate::Outcome::Insufficient).
    #[inline]
    pub fn check_n(&self, n: u64) -> Decision {
        self.check_n_at(self.clock.now(), n)
    }

    /// [`check`](Limiter::check) at a caller-supplied `now`.
    #[inline]
    pub fn check_at(&self, now: Nanos) -> Decision {
        self.check_n_at(now, 1)
    }

    /// [`check_n`](Limiter::check_n) at a caller-supplied `now`.
    #[inline]
    pub fn check_n_at(&self, now: Nanos, n: u64) -> Decision {
        self.charge_at(now, n).0
    }

    /// [`check_n_at`](Limiter::check_n_at), also returning, when tokens were taken, the floor
    /// of the instant they were taken at (a multi-limit receipt's).
    #[inline(always)]
    fn charge_at(&self, now: Nanos, n: u64) -> (Decision, Option<u64>) {
        let now = self.instant(now);
        // One comparison for both `n == 0` and `n > burst`: neither touches the word.
        if n.wrapping_sub(1) >= self.quota.burst() {
            return (self.bucket.load().peek(&self.quota, now, n), None);
        }
        let (d, stored) = self.bucket.charge(&self.quota, now, n);
        (d, stored.map(|_| now.floor))
    }

    /// `n` tokens now, and, when they were taken, the floor of the instant they were taken at:
    /// the receipt of a charge in [`check_all`](crate::check_all).
    #[inline]
    pub(crate) fn charge_now(&self, n: u64) -> (Decision, Option<u64>) {
        self.charge_at(self.clock.now(), n)
    }

    /// Gives back what is still owed of `n` tokens charged at the floor `floor` (see
    /// `AtomicBucket::refund`).
    #[inline]
    pub(crate) fn refund_charge(&self, floor: u64, n: u64) {
        self.bucket.refund(&self.quota, floor, n, || self.instant(self.clock.now()));
    }

    /// This limiter's identity, which its multi-limit receipts carry.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether one token was taken now: [`check`](Limiter::check) without the details.
    #[inline]
    pub fn allow(&self) -> bool {
        self.check().is_allowed()
    }

    /// Whether `n` tokens were taken now.
    #[inline]
    pub fn allow_n(&self, n: u64) -> bool {
        self.check_n(n).is_allowed()
    }

    /// Whether `n` tokens were taken at a caller-supplied `now`.
    #[inline]
    pub fn allow_n_at(&self, now: Nanos, n: u64) -> bool {
        self.check_n_at(now, n).is_allowed()
    }

    /// What [`check`](Limiter::check) would answer now, without taking anything.
    /// `remaining` is the current level.
    #[inline]
    pub fn peek(&self) -> Decision {
        self.peek_n_at(self.clock.now(), 1)
    }

    /// What [`check_n`](Limiter::check_n) would answer now, without taking anything.
    #[inline]
    pub fn peek_n(&self, n: u64) -> Decision {
        self.peek_n_at(self.clock.now(), n)
    }

    /// [`peek`](Limiter::peek) at a caller-supplied `now`.
    #[inline]
    pub fn peek_at(&self, now: Nanos) -> Decision {
        self.peek_n_at(now, 1)
    }

    /// [`peek_n`](Limiter::peek_n) at a caller-supplied `now`.
    #[inline]
    pub fn peek_n_at(&self, now: Nanos, n: u64) -> Decision {
        self.bucket.load().peek(&self.quota, self.instant(now), n)
    }

    /// The current time on this limiter's clock, for the `*_at` methods.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: Clock> fmt::Debug for Limiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("quota", &self.quota)
            .field("origin", &self.origin)
            .field("level", &self.peek_n(0).remaining())
            .finish_non_exhaustive()
    }
}
