//! Reservations on a token bucket: tokens taken now or in the future, a time they are due,
//! and cancels that give back what is still owed. The methods here are the direct bucket's
//! (`Direct<TokenBucket>`); the types are the keyed table's too (`keyed/bucket.rs`).
//!
//! A reservation is a charge whose stamp may lie ahead of `now`: the bucket goes into debt of
//! at most one burst (the range `(now, now + fill]` its word keeps for that), and every later
//! charge or reservation reads that stamp, so it queues behind: reservations are served in the
//! order they were made, with no lock and no queue. A cancel is the refund of
//! [`check_all`](crate::check_all)'s receipts (`AtomicBucket::refund` has the argument): while
//! the bucket is in debt, the latest reservation goes back whole and an earlier one gives
//! nothing; out of debt, `cost − (floor now − floor at the reservation)`, never below the
//! current floor. Never more than the reservation put in, in any order.

use core::fmt;
use core::time::Duration;

use crate::engine::direct::Direct;
use crate::engine::wait::sleep_until;
use crate::{Clock, Counters, Nanos, Outcome, TokenBucket};

/// Tokens reserved on a [`Limiter`](crate::Limiter) or for one key of a
/// [`KeyedLimiter`](crate::KeyedLimiter): due at [`ready_at`](Reservation::ready_at), on the
/// limiter's clock.
///
/// The tokens are taken when the reservation is made. Dropping a reservation does **not**
/// give them back: a caller that will not use them calls
/// [`Limiter::cancel`](crate::Direct::cancel) (or [`KeyedLimiter::cancel`](crate::Keyed::cancel)
/// with the key). Not `Clone`: a reservation is cancelled at most once, by construction.
///
/// ```compile_fail
/// let l = tollgate::Limiter::new(tollgate::TokenBucket::per_second(10).unwrap());
/// let r = l.reserve().unwrap();
/// let _ = l.cancel(r);
/// let _ = l.cancel(r); // error: use of moved value
/// ```
#[must_use = "the tokens are taken: wait until `ready_at`, or give them back with `cancel`"]
#[derive(PartialEq, Eq)]
pub struct Reservation {
    /// The issuing limiter (`sync::next_id`), and its configuration's generation (direct) or
    /// the key's hash (keyed).
    owner: u64,
    generation: u64,
    /// Tokens reserved.
    tokens: u64,
    /// The bucket's floor (in units) at the reservation's instant, and the stamp it stored:
    /// what a cancel counts from.
    floor: u64,
    stamp: u64,
    /// When it was made, on the limiter's clock, and how long after that its tokens are due
    /// (in ns, rounded up).
    at: Nanos,
    wait: u64,
    /// Keyed only: the tokens' cost in units under the quota it was made under (a tier may
    /// change before the cancel); 0 for a direct one.
    cost: u64,
}

/// Counts a reservation of tier `tier` (0 for a direct limiter) by what it amounts to: due at
/// once an admission, due later a delayed one (with its wait), too late a denial, over the
/// burst insufficient, no room in a keyed table `table_full`.
#[cold]
pub(crate) fn count_reservation(c: &Counters, tier: usize, r: &Result<Reservation, ReserveError>) {
    use crate::engine::decision::code;
    let outcome = match r {
        Ok(r) if r.wait > 0 => return c.record_delayed(tier, r.wait),
        Ok(_) => Outcome::Allowed,
        Err(ReserveError::TooLate { .. }) => Outcome::Denied,
        Err(ReserveError::Insufficient { .. }) => Outcome::Insufficient,
        Err(ReserveError::TableFull) => Outcome::TableFull,
    };
    #[expect(clippy::cast_possible_truncation, reason = "a code is below OUTCOME_CODES")]
    c.record_tier(tier, code(outcome) as usize);
}

/// The fields of a keyed reservation, for `keyed/bucket.rs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedParts {
    pub(crate) owner: u64,
    pub(crate) key_hash: u64,
    pub(crate) tokens: u64,
    pub(crate) floor: u64,
    pub(crate) stamp: u64,
    pub(crate) cost: u64,
}

impl Reservation {
    /// When the tokens are due, on the limiter's clock (its [`Clock::now`] reading).
    pub fn ready_at(&self) -> Nanos {
        Nanos::new(self.at.as_u64().saturating_add(self.wait))
    }

    /// When the reservation was made, on the limiter's clock.
    pub fn reserved_at(&self) -> Nanos {
        self.at
    }

    /// How long after it was made the tokens are due (zero if at once).
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }

    /// How long after `now` (a reading of the limiter's clock) the tokens are due; zero once
    /// they are.
    pub fn delay_from(&self, now: Nanos) -> Duration {
        Duration::from_nanos(self.ready_at().as_u64().saturating_sub(now.as_u64()))
    }

    /// Whether the tokens are due at `now`.
    pub fn is_ready_at(&self, now: Nanos) -> bool {
        now >= self.ready_at()
    }

    /// The tokens reserved.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// A keyed reservation: made at `at` (the clock's reading), due `wait` ns later.
    pub(crate) fn keyed(parts: KeyedParts, at: Nanos, wait: u64) -> Reservation {
        let KeyedParts { owner, key_hash, tokens, floor, stamp, cost } = parts;
        Reservation { owner, generation: key_hash, tokens, floor, stamp, at, wait, cost }
    }

    /// A keyed reservation's fields (the inverse of [`keyed`](Reservation::keyed)).
    pub(crate) fn keyed_parts(&self) -> KeyedParts {
        KeyedParts {
            owner: self.owner,
            key_hash: self.generation,
            tokens: self.tokens,
            floor: self.floor,
            stamp: self.stamp,
            cost: self.cost,
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tokens", &self.tokens)
            .field("reserved_at", &self.at)
            .field("delay", &self.delay())
            .finish_non_exhaustive()
    }
}

/// Why a reservation was refused. Refusals are immediate: nothing was taken, and no caller
/// ever sleeps to learn that it cannot be served in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// More tokens than the burst: they can never be taken at once.
    Insufficient {
        /// Tokens asked for.
        requested: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// The tokens would be due later than the caller will wait, or later than one burst of
    /// debt allows: more than the quota's fill time from now, `⌊burst·t/m⌋` ns (see
    /// [`Limiter::reserve_n`](crate::Direct::reserve_n)). `max_wait` is the smaller of the two.
    TooLate {
        /// How long after now the tokens would have been due.
        wait: Duration,
        /// The longest wait allowed.
        max_wait: Duration,
    },
    /// Keyed: the key is new and the table has no room for it
    /// ([`WhenFull::Deny`](crate::WhenFull::Deny)). Nothing was taken.
    TableFull,
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::Insufficient { requested, burst } => write!(
                f,
                "cannot reserve {requested} tokens: the burst is {burst}, so they can never be taken at once"
            ),
            ReserveError::TooLate { wait, max_wait } => write!(
                f,
                "the tokens would be due in {wait:?}, later than the {max_wait:?} allowed (refused at once)"
            ),
            ReserveError::TableFull => {
                f.write_str("the key is new and the keyed table has no room for it (refused at once)")
            }
        }
    }
}

impl std::error::Error for ReserveError {}

/// What a [`cancel`](crate::Direct::cancel) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancelled {
    /// What the reservation still owed went back to the bucket: all of it for the latest
    /// reservation of a bucket in debt, or when cancelled at the instant it was made; less the
    /// refill since, out of debt.
    Returned,
    /// Nothing was given back, because nothing could be: the bucket is still in debt and a
    /// reservation was made after this one, which was told a due time that counts on its
    /// tokens (only the latest reservation of a bucket in debt goes back: cancel
    /// latest-first); or, out of debt, the bucket has refilled at least the reservation's
    /// tokens since it was made (it was due, and as good as used); or it reserved no tokens;
    /// or the cancel's clock reads earlier than the reservation's. Keyed, also: the key is no
    /// longer tracked, or the table evicts by force
    /// ([`WhenFull::EvictFullest`](crate::WhenFull::EvictFullest)).
    NothingOwed,
    /// Not this limiter's reservation (or, keyed, not this key's), or made under a
    /// configuration ([`set_policy`](crate::Direct::set_policy)) since replaced: nothing was
    /// given back.
    Foreign,
}

/// The refusal of a reservation due `wait` ns from now, `max_wait_ns` allowed.
#[inline]
pub(crate) fn too_late(q: &TokenBucket, wait: u64, max_wait_ns: u64) -> ReserveError {
    let m = q.units_per_nano();
    // No division for the nanosecond unit (most rates'): a refusal is the common answer of an
    // overloaded reserver.
    let fill = if m == 1 { q.fill_units() } else { q.fill_units() / m };
    ReserveError::TooLate {
        wait: Duration::from_nanos(wait),
        max_wait: Duration::from_nanos(fill.min(max_wait_ns)),
    }
}

impl<C: Clock> Direct<TokenBucket, C> {
    /// One token, now or in the future: [`reserve_n`](Direct::reserve_n) of 1. Refused with
    /// [`ReserveError::TooLate`], taking nothing, if the token would be due more than one fill
    /// time from now: a delay above `⌊burst·t/m⌋` ns (see [`reserve_n`](Direct::reserve_n)).
    #[inline]
    pub fn reserve(&self) -> Result<Reservation, ReserveError> {
        self.reserve_n_at(self.now(), 1, Duration::MAX)
    }

    /// `n` tokens, now or as soon as the bucket has them: the reservation says when they are
    /// due. `n` above the burst is [`ReserveError::Insufficient`]; `n = 0` is due at once and
    /// takes nothing.
    ///
    /// **At most one fill time ahead.** The bucket goes into debt of at most one burst, so the
    /// tokens may be due at most one fill time from now. The reservation is refused with
    /// [`ReserveError::TooLate`], at once and taking nothing, when its delay (in whole
    /// nanoseconds, rounded up, as [`Reservation::delay`] reports it) would exceed
    /// `⌊burst·t/m⌋` ns: the current quota's fill time, `burst × period / tokens` as the quota
    /// counts it (`t` its [`units_per_token`](TokenBucket::units_per_token), `m` its
    /// [`units_per_nano`](TokenBucket::units_per_nano)), rounded down to whole nanoseconds
    /// (where [`fill_time`](TokenBucket::fill_time) rounds up). So a full bucket reserves at
    /// most two bursts at one instant: one due at once, the other spread over the next fill
    /// time. The refusal's `max_wait` is that bound.
    ///
    /// Later checks and reservations queue behind it: a [`check`](Direct::check) is refused
    /// while the bucket is in debt, and reservations are due in the order they were made.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Cancelled, Limiter, ManualClock, ReserveError, TokenBucket};
    ///
    /// let l = Limiter::with_clock(TokenBucket::per_second(10)?.with_burst(2)?, ManualClock::new());
    /// let a = l.reserve_n(2)?; // the whole burst: due at once
    /// assert_eq!(a.delay(), Duration::ZERO);
    /// let b = l.reserve()?; // the next token: due in 100 ms
    /// assert_eq!(b.delay(), Duration::from_millis(100));
    /// assert!(!l.check().is_allowed()); // checks queue behind reservations
    /// assert_eq!(l.cancel(b), Cancelled::Returned); // not needed after all: given back
    /// assert_eq!(l.peek().retry_after(), Some(Duration::from_millis(100)));
    /// // One fill time (200 ms) ahead at most: 2 more tokens are due in 200 ms, exactly the
    /// // bound; one more after them would be due in 300 ms, too late.
    /// assert_eq!(l.reserve_n(2)?.delay(), Duration::from_millis(200));
    /// let late = l.reserve().unwrap_err();
    /// let (wait, max_wait) = (Duration::from_millis(300), Duration::from_millis(200));
    /// assert_eq!(late, ReserveError::TooLate { wait, max_wait });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn reserve_n(&self, n: u64) -> Result<Reservation, ReserveError> {
        self.reserve_n_at(self.now(), n, Duration::MAX)
    }

    /// [`reserve_n`](Direct::reserve_n), refused at once (taking nothing) if the tokens would
    /// be due more than `max_wait` from now: Guava's `tryAcquire(n, timeout)`, without the
    /// sleep. A `max_wait` of zero reserves only what is there now; one above the fill time
    /// changes nothing (the bound of [`reserve_n`](Direct::reserve_n) still holds).
    #[inline]
    pub fn reserve_n_within(&self, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        self.reserve_n_at(self.now(), n, max_wait)
    }

    /// [`reserve_n_within`](Direct::reserve_n_within) at a caller-supplied `now`.
    #[inline(always)]
    pub fn reserve_n_at(&self, now: Nanos, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        // The built quota in place, uncounted; a replaced one or counters out of line
        // (`Direct::built_uncounted`).
        match self.built_uncounted() {
            Some(q) => self.reserve_under(q, 0, now, n, max_wait),
            None => self.reserve_flagged(now, n, max_wait),
        }
    }

    /// [`reserve_n_at`](Direct::reserve_n_at) once the quota has been replaced, or counted.
    #[inline(never)]
    fn reserve_flagged(&self, now: Nanos, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        let r = match self.built() {
            Some(q) => self.reserve_under(q, 0, now, n, max_wait),
            None => {
                let (q, generation) = self.replaced();
                self.reserve_under(&q, generation, now, n, max_wait)
            }
        };
        if let Some(c) = self.counters_ref() {
            count_reservation(c, 0, &r);
        }
        r
    }

    #[inline(always)]
    fn reserve_under(
        &self,
        q: &TokenBucket,
        generation: u64,
        now: Nanos,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, ReserveError> {
        if n > q.burst() {
            return Err(ReserveError::Insufficient { requested: n, burst: q.burst() });
        }
        let at = q.instant(now, self.origin());
        let reservation = |stamp: u64, wait: u64| Reservation {
            owner: self.id(),
            generation,
            tokens: n,
            floor: at.floor,
            stamp,
            at: now,
            wait,
            cost: 0,
        };
        if n == 0 {
            return Ok(reservation(0, 0));
        }
        let m = q.units_per_nano();
        let max_wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        // The most debt: one fill, or the caller's wait. Not rounded to whole nanoseconds: the
        // wait it is compared with is a multiple of `m` (see `BucketWord::reserve`), so the
        // comparison is the same, without a division on the common path.
        match self.state().reserve(q, at, n, q.fill_units().min(max_wait_ns.saturating_mul(m))) {
            Ok((stamp, wait)) => Ok(reservation(stamp, wait)),
            Err(wait) => Err(too_late(q, wait, max_wait_ns)),
        }
    }

    /// Gives back what `r` still owes, by the rule of [`check_all`](crate::check_all)'s refunds:
    ///
    /// - **while the bucket is in debt** (a reservation is still due in the future), the
    ///   latest reservation goes back whole ([`Cancelled::Returned`]), and an earlier one gives
    ///   back nothing ([`Cancelled::NothingOwed`]), however much it reserved: the reservations
    ///   after it were told due times that count on its tokens, a new reservation can only
    ///   queue at the end of the line, and giving any back would let it fall due together with
    ///   them, more at once than the bucket holds. Cancelling a batch latest-first gives back
    ///   all of it;
    /// - **once the bucket is out of debt**, its tokens less what the bucket has refilled since
    ///   it was made, in any order: nothing once the refill covers them.
    ///
    /// A cancel never fills the bucket past full, never gives back more than was reserved,
    /// and never lets the bucket admit more than it would have without the reservation. A
    /// reservation of no tokens, or a cancel whose clock reads earlier than the reservation's,
    /// gives nothing back; one of another limiter, or made before a
    /// [`set_policy`](Direct::set_policy), is [`Cancelled::Foreign`].
    ///
    /// Waits (briefly) for another cancel or refund of this bucket in progress rather than give
    /// up. Dropping a reservation without cancelling it keeps its tokens taken.
    ///
    /// ```
    /// use tollgate::{Cancelled, Limiter, ManualClock, TokenBucket};
    ///
    /// let l = Limiter::with_clock(TokenBucket::per_second(10)?.with_burst(2)?, ManualClock::new());
    /// let (a, b) = (l.reserve_n(2)?, l.reserve()?); // b is due in 100 ms: in debt
    /// assert_eq!(l.cancel(a), Cancelled::NothingOwed); // b counts on a's tokens
    /// assert_eq!(l.cancel(b), Cancelled::Returned); // the latest goes back whole
    /// assert_eq!(l.peek().remaining(), 0); // a's 2 tokens stay spent
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, r: Reservation) -> Cancelled {
        self.cancel_at(self.now(), r)
    }

    /// [`cancel`](Direct::cancel) at a caller-supplied `now`, which must be no earlier than any
    /// decision's on this limiter (as for refunds: see [`Admit::refund`](crate::Admit::refund)).
    pub fn cancel_at(&self, now: Nanos, r: Reservation) -> Cancelled {
        let (q, generation) = self.replaced();
        if r.owner != self.id() || r.generation != generation {
            return Cancelled::Foreign;
        }
        if r.tokens == 0 {
            return Cancelled::NothingOwed;
        }
        if self.state().cancel(&q, r.floor, r.stamp, r.tokens, || q.instant(now, self.origin())) {
            Cancelled::Returned
        } else {
            Cancelled::NothingOwed
        }
    }

    /// One token, waiting for it as long as it takes, up to one fill time:
    /// [`acquire_n`](Direct::acquire_n) of 1 with no limit of the caller's. Refused at once
    /// with [`ReserveError::TooLate`] if the token would be due more than one fill time from
    /// now: a delay above `⌊burst·t/m⌋` ns (see [`reserve_n`](Direct::reserve_n)).
    pub fn acquire(&self) -> Result<Nanos, ReserveError> {
        self.acquire_n(1, Duration::MAX)
    }

    /// Reserves `n` tokens and blocks the thread until they are due; refused at once with
    /// [`ReserveError::TooLate`] (having waited for nothing and taken nothing) if they would be
    /// due more than `max_wait` from now, or more than one fill time from now whatever
    /// `max_wait` says: a delay above `⌊burst·t/m⌋` ns, the bound of
    /// [`reserve_n`](Direct::reserve_n). So it never blocks longer than one fill time. The
    /// wait sleeps for the bulk and spins for the last 100 µs, so it ends within microseconds
    /// of the due time on an idle core.
    ///
    /// Returns the instant the tokens were due, on the limiter's clock: the *intended* time
    /// of whatever they pace, from which a load generator measures latency (coordinated
    /// omission: not from when the thread woke up). On a [`ManualClock`](crate::ManualClock)
    /// it returns only once another thread moves the clock past the due time.
    pub fn acquire_n(&self, n: u64, max_wait: Duration) -> Result<Nanos, ReserveError> {
        let r = self.reserve_n_within(n, max_wait)?;
        let due = r.ready_at();
        sleep_until(self.clock(), due);
        Ok(due)
    }
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl<C: Clock> Direct<TokenBucket, C> {
    /// One token, awaited: [`until_ready_n`](Direct::until_ready_n) of 1.
    pub async fn until_ready(&self) -> Result<Nanos, ReserveError> {
        self.until_ready_n_within(1, Duration::MAX).await
    }

    /// Reserves `n` tokens and waits, asynchronously on tokio's timer, until they are due; the
    /// tokens are then taken (do not [`check`](Direct::check) for them again: that would take
    /// them twice, governor#196). Returns the due instant on the limiter's clock (the intended
    /// time). Refusals are immediate, as [`reserve_n`](Direct::reserve_n)'s.
    ///
    /// **Cancel-safe**: dropping the future before it completes (a `select!` that took another
    /// branch, a timeout) [cancels](Direct::cancel) the reservation, giving back what it still
    /// owes. The wait ends no earlier than the due time, within tokio's timer resolution (1 ms)
    /// after it; for sub-millisecond pacing, use [`acquire_n`](Direct::acquire_n) on a thread.
    pub async fn until_ready_n(&self, n: u64) -> Result<Nanos, ReserveError> {
        self.until_ready_n_within(n, Duration::MAX).await
    }

    /// [`until_ready_n`](Direct::until_ready_n), refused at once if the tokens would be due
    /// more than `max_wait` from now.
    pub async fn until_ready_n_within(&self, n: u64, max_wait: Duration) -> Result<Nanos, ReserveError> {
        let r = self.reserve_n_within(n, max_wait)?;
        Ok(crate::engine::wait::wait_until_due(self.clock(), r.ready_at(), r, |r| {
            let _ = self.cancel(r);
        })
        .await)
    }
}
