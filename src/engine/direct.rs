//! `Direct<A>`: one limiter type for every algorithm, with one set of methods.
//!
//! What differs between algorithms is how a decision is made and committed on their state, and
//! that is [`Algorithm`]'s: every [`Policy`](crate::Policy) by one load and one CAS
//! (`policy.rs`), the token bucket by its own tuned loop (`limiter.rs`), the sliding log under
//! a lock (`log.rs`). Everything a caller touches is here, once.

use core::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::admit::{Admit, Receipt};
use crate::engine::config::{ConfigCell, WORDS};
use crate::sync::{AtomicU64, Ordering::Relaxed, Ordering::Release};
use crate::{Clock, CounterSnapshot, Counters, Decision, DefaultClock, Nanos, UpdateError};

/// `Direct::flags`: the configuration has been replaced.
const CHANGED: u64 = 1;
/// `Direct::flags`: decisions are counted.
const COUNTING: u64 = 2;

/// An algorithm a [`Direct`] limiter runs: every [`Policy`](crate::Policy) (nginx, the windows,
/// your own), [`TokenBucket`](crate::TokenBucket) and [`SlidingLog`](crate::SlidingLog).
///
/// Its methods are the engine's and hidden: to add an algorithm, implement
/// [`Policy`](crate::Policy), which gives this trait.
pub trait Algorithm {
    /// The limiter's state.
    #[doc(hidden)]
    type State: Send + Sync;
    /// A fresh state.
    #[doc(hidden)]
    fn new_state(&self) -> Self::State;
    /// Decides and commits `n` units at `now` on a limiter created at `origin`.
    #[doc(hidden)]
    fn direct_check(&self, state: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision;
    /// [`direct_check`](Algorithm::direct_check) at a reading of `clock`, the limiter's own:
    /// an algorithm that can tell a denial made on a reading gone stale (its thread descheduled
    /// between the reading and the state's load while others decided at later readings)
    /// decides it again at a fresh one. The token bucket can
    /// (`AtomicBucket::charge_fresh`, in `policies/bucket/atomic.rs`).
    #[doc(hidden)]
    #[inline(always)]
    fn direct_check_clock<C: Clock>(
        &self,
        state: &Self::State,
        clock: &C,
        origin: Nanos,
        n: u64,
    ) -> Decision {
        self.direct_check(state, clock.now(), origin, n)
    }
    /// What `n` units would get at `now`, taking nothing.
    #[doc(hidden)]
    fn direct_peek(&self, state: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision;
    /// `direct_check`, also returning what a refund needs when units were taken.
    #[doc(hidden)]
    fn direct_charge(
        &self,
        state: &Self::State,
        now: Nanos,
        origin: Nanos,
        n: u64,
    ) -> (Decision, Option<[u64; 3]>);
    /// This configuration as words, if it can change at runtime.
    #[doc(hidden)]
    fn config_words(&self) -> Option<[u64; WORDS]> {
        None
    }
    /// A configuration from [`config_words`](Algorithm::config_words).
    #[doc(hidden)]
    fn from_config_words(words: [u64; WORDS]) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = words;
        None
    }
    /// Checks `new` against a limiter built with `self` whose state is `state`: the
    /// configuration to publish (`Some`), or `None` when the change was made in the state.
    #[doc(hidden)]
    fn direct_update(&self, state: &Self::State, new: Self) -> Result<Option<Self>, UpdateError>
    where
        Self: Sized,
    {
        let _ = (state, new);
        Err(UpdateError::Unsupported)
    }
    /// The current configuration, when the state keeps it (the sliding log's).
    #[doc(hidden)]
    fn direct_current(&self, state: &Self::State) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = state;
        None
    }
    /// Gives back what a charge of `n` took; `now` reads the limiter's clock.
    #[doc(hidden)]
    fn direct_refund(
        &self,
        state: &Self::State,
        receipt: [u64; 3],
        n: u64,
        origin: Nanos,
        now: impl Fn() -> Nanos,
    );
}

/// A single-state limiter running any [`Algorithm`]: [`Limiter`](crate::Limiter) (the token
/// bucket), [`NginxLimiter`](crate::NginxLimiter), [`FixedWindowLimiter`](crate::FixedWindowLimiter),
/// [`SlidingWindowLimiter`](crate::SlidingWindowLimiter),
/// [`SlidingLogLimiter`](crate::SlidingLogLimiter), or `Direct<YourPolicy>`.
///
/// Every decision is one clock read and the algorithm's commit: lock-free and allocation-free
/// for the single-word algorithms (one load, one CAS when units are taken), a short lock for the
/// sliding log. Concurrent callers are never jointly granted more than the limit.
///
/// ```
/// use tollgate::{Direct, FixedWindow, Limiter, Nginx, TokenBucket};
///
/// let bucket = Limiter::new("2/s".parse::<TokenBucket>()?);
/// let nginx = Direct::new("10r/s burst=5 nodelay".parse::<Nginx>()?);
/// let window: Direct<FixedWindow> = Direct::new("100/min".parse()?);
/// for _ in 0..2 {
///     assert!(bucket.check().is_allowed_now());
/// }
/// assert!(!bucket.allow());
/// assert!(nginx.check_n(3).is_allowed_now());
/// assert_eq!(window.peek().remaining(), 99); // what `check` would leave
/// # Ok::<(), tollgate::ParseError>(())
/// ```
///
/// The `*_at` methods take `now` from the caller, on this limiter's clock's timeline
/// ([`now`](Direct::now)), so a batch can share one clock read. A `now` before the limiter's
/// creation counts as its creation.
pub struct Direct<A: Algorithm, C: Clock = DefaultClock> {
    state: A::State,
    /// The configuration the limiter was built with, decided on until the first
    /// [`set_policy`](Direct::set_policy).
    algorithm: A,
    /// What sends a decision down the out-of-line path: `CHANGED` once the configuration has
    /// been replaced (decisions then read `config`), `COUNTING` with counters. One load and
    /// one predicted branch for both on the common path.
    flags: AtomicU64,
    origin: Nanos,
    clock: C,
    /// Decision counters, when asked for ([`with_counters`](Direct::with_counters)).
    counters: Option<Arc<Counters>>,
    /// The identity its multi-limit receipts carry.
    id: u64,
    /// The current configuration once replaced, with its generation.
    config: ConfigCell,
    /// Serializes [`set_policy`](Direct::set_policy) calls.
    writer: Mutex<()>,
}

impl<A: Algorithm> Direct<A, DefaultClock> {
    /// A limiter on the default clock ([`TscClock`](crate::TscClock) with the `quanta`
    /// feature), with a fresh state.
    pub fn new(algorithm: A) -> Direct<A, DefaultClock> {
        Direct::with_clock(algorithm, DefaultClock::new())
    }
}

impl<A: Algorithm, C: Clock> Direct<A, C> {
    /// A limiter on `clock`, with a fresh state, counting time from the clock's current reading.
    pub fn with_clock(algorithm: A, clock: C) -> Direct<A, C> {
        let origin = clock.now();
        let config = ConfigCell::new(algorithm.config_words().unwrap_or([0; WORDS]));
        Direct {
            state: algorithm.new_state(),
            algorithm,
            flags: AtomicU64::new(0),
            origin,
            clock,
            counters: None,
            id: crate::sync::next_id(),
            config,
            writer: Mutex::new(()),
        }
    }

    /// This limiter, counting its decisions by outcome ([`counters`](Direct::counters)). A
    /// limiter without counters pays nothing for them (one flag word, read anyway, says
    /// whether a decision takes the out-of-line path); one with them takes that path and an
    /// atomic add on a cache line of the deciding thread's own.
    pub fn with_counters(mut self) -> Direct<A, C> {
        self.counters = Some(Arc::new(Counters::new()));
        // Not yet shared: the flag is set before any decision can read it.
        self.flags = AtomicU64::new(self.flags.load(Relaxed) | COUNTING);
        self
    }

    /// The decisions so far by outcome, if the limiter counts them.
    pub fn counters(&self) -> Option<CounterSnapshot> {
        self.counters.as_ref().map(|c| c.snapshot())
    }

    /// The counters themselves, for a metrics exporter that polls them apart from the limiter.
    pub fn counters_handle(&self) -> Option<Arc<Counters>> {
        self.counters.clone()
    }

    /// One unit now, or how long to wait.
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// `n` units now, all or none. `n = 0` is always allowed and takes nothing; an `n` the
    /// limit can never admit at once is [`Outcome::Insufficient`](crate::Outcome::Insufficient).
    ///
    /// A token bucket's denial made on a clock reading that went stale before the bucket was
    /// read (the thread descheduled between the two while other threads decided at later
    /// readings) is decided again at a fresh reading, once.
    #[inline(always)]
    pub fn check_n(&self, n: u64) -> Decision {
        // Relaxed: as in `check_n_at`.
        match self.flags.load(Relaxed) {
            0 => self.algorithm.direct_check_clock(&self.state, &self.clock, self.origin, n),
            // Counted, as built: decided inline as well, then counted (`count`). Through
            // `check_flagged`, a counted decision took 119 instructions against 52.
            COUNTING => {
                self.count(self.algorithm.direct_check_clock(&self.state, &self.clock, self.origin, n))
            }
            _ => self.check_flagged(None, n),
        }
    }

    /// [`check`](Direct::check) at a caller-supplied `now`.
    #[inline]
    pub fn check_at(&self, now: Nanos) -> Decision {
        self.check_n_at(now, 1)
    }

    /// [`check_n`](Direct::check_n) at a caller-supplied `now`.
    // Always inline: out of line, its 32-byte decision is returned through memory (see
    // `policy.rs`).
    #[inline(always)]
    pub fn check_n_at(&self, now: Nanos, n: u64) -> Decision {
        // Relaxed: a decision that still reads no change after one uses the configuration as
        // built, which the limiter had; `config` is valid from construction on, and its own
        // loads are Acquire (see `engine/config.rs`).
        match self.flags.load(Relaxed) {
            0 => self.algorithm.direct_check(&self.state, now, self.origin, n),
            // Counted, as built: as in `check_n`.
            COUNTING => self.count(self.algorithm.direct_check(&self.state, now, self.origin, n)),
            _ => self.check_flagged(Some(now), n),
        }
    }

    /// `d`, counted: by its outcome's code in this thread's slot, a delay out of line.
    #[inline(always)]
    fn count(&self, d: Decision) -> Decision {
        if let Some(c) = &self.counters {
            c.record(&d);
        }
        d
    }

    /// [`check_n_at`](Direct::check_n_at) with counters or a replaced configuration: out of
    /// line. Inline, the two configurations' paths merged with the common one, which then
    /// read every field through a pointer chosen between them and spilled to the stack (a
    /// dependent load more on each of its steps: 8.2 → 10.9 ns on a coarse clock).
    ///
    /// `now`: the caller's time ([`check_n_at`](Direct::check_n_at)), or `None` to read the
    /// limiter's clock ([`check_n`](Direct::check_n)).
    #[inline(never)]
    fn check_flagged(&self, now: Option<Nanos>, n: u64) -> Decision {
        let replaced = if self.flags.load(Relaxed) & CHANGED != 0 { self.published().0 } else { None };
        let a = replaced.as_ref().unwrap_or(&self.algorithm);
        let d = match now {
            Some(now) => a.direct_check(&self.state, now, self.origin, n),
            None => a.direct_check_clock(&self.state, &self.clock, self.origin, n),
        };
        if let Some(c) = &self.counters {
            c.record(&d);
        }
        d
    }

    /// The published configuration and its generation (`None` before any change, or for an
    /// algorithm that keeps its configuration in its state).
    #[inline]
    fn current(&self) -> (Option<A>, u64) {
        // Relaxed: as in `check_n_at`.
        if self.flags.load(Relaxed) & CHANGED == 0 {
            return (None, 0);
        }
        self.published()
    }

    /// [`current`](Direct::current) once the configuration has been replaced: out of line, a
    /// decision's rare path.
    #[cold]
    #[inline(never)]
    fn published(&self) -> (Option<A>, u64) {
        let (words, generation) = self.config.load();
        (A::from_config_words(words), generation)
    }

    /// The configuration as built, while decisions use it (until the first
    /// [`set_policy`](Direct::set_policy)): read in place, so that an algorithm's own methods
    /// on `Direct` (the token bucket's reservations, `policies/reserve.rs`) address its fields
    /// directly on their common path, and take [`replaced`](Direct::replaced) out of line
    /// otherwise (a pointer chosen between the two cost a dependent load on every step, and
    /// one closure serving both paths was not inlined: a refused reservation took 145
    /// instructions against 62).
    #[inline(always)]
    pub(crate) fn built(&self) -> Option<&A> {
        // Relaxed: as in `check_n_at`.
        (self.flags.load(Relaxed) & CHANGED == 0).then_some(&self.algorithm)
    }

    /// [`built`](Direct::built), and only while nothing counts the decisions: the common path
    /// of an algorithm's own methods that count (reservations), in the same one test.
    #[inline(always)]
    pub(crate) fn built_uncounted(&self) -> Option<&A> {
        // Relaxed: as in `check_n_at`.
        (self.flags.load(Relaxed) == 0).then_some(&self.algorithm)
    }

    /// The counters, for an algorithm's own methods that count.
    #[inline]
    pub(crate) fn counters_ref(&self) -> Option<&Counters> {
        self.counters.as_deref()
    }

    /// The configuration decisions use now and its generation, when it may have been replaced:
    /// the published one, or the built one (generation 0) while none was.
    pub(crate) fn replaced(&self) -> (A, u64)
    where
        A: Clone,
    {
        let (config, generation) = self.current();
        (config.unwrap_or_else(|| self.algorithm.clone()), generation)
    }

    /// The algorithm's state, for the algorithm's own methods on `Direct`.
    #[inline(always)]
    pub(crate) fn state(&self) -> &A::State {
        &self.state
    }

    /// The limiter's creation on its clock, which its time counts from.
    #[inline(always)]
    pub(crate) fn origin(&self) -> Nanos {
        self.origin
    }

    /// The identity its receipts (and reservations) carry.
    #[inline(always)]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Replaces the limiter's configuration, at once and safely under concurrent decisions:
    /// each decision uses either the old or the new one. The state is kept and read under the
    /// new configuration, as a keyed table's tiers are
    /// ([`Keyed::set_tier_quota`](crate::Keyed::set_tier_quota)):
    ///
    /// - **token bucket**: the bucket keeps its *empty instant*; its level is the time it has
    ///   been refilling, at the new rate, capped at the new burst. The new quota is counted in
    ///   the limiter's time unit, and its fill time may be at most the one the limiter was built
    ///   for ([`TokenBucket::with_max_fill_time`](crate::TokenBucket::with_max_fill_time));
    /// - **nginx**: the excess and the last request's time are kept, and leak at the new rate;
    ///   an excess above the new burst refuses until it has leaked below it (nginx's reload);
    /// - **fixed and sliding windows**: the counts are kept and compared with the new limit; the
    ///   window's length may not change (the state counts in windows), and a sliding window's
    ///   limit stays within the counts' width it was built with (below the next power of two);
    /// - **sliding log**: the newest entries are kept (as many as the new limit), each expiring
    ///   when it was going to; a longer window applies to requests admitted from now on.
    ///
    /// Fails, changing nothing, with [`UpdateError`] saying what may not change. A multi-limit
    /// charge made under the old configuration is not refunded under the new one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, ManualClock, TokenBucket};
    ///
    /// let q: TokenBucket = "10/s".parse()?;
    /// let l = Limiter::with_clock(q.with_max_fill_time(Duration::from_secs(10))?, ManualClock::new());
    /// assert_eq!(l.peek().remaining(), 10); // full: empty 1 s ago, at 10/s
    /// l.set_policy("100/s burst=50".parse()?)?;
    /// // The same empty instant, 1 s ago: at 100/s, 100 tokens, capped at the new burst.
    /// assert_eq!(l.peek().remaining(), 50);
    /// assert_eq!(l.policy().burst(), 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&self, new: A) -> Result<(), UpdateError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(published) = self.algorithm.direct_update(&self.state, new)? else { return Ok(()) };
        let words = published.config_words().ok_or(UpdateError::Unsupported)?;
        self.config.store(words);
        // Release, belt and braces: the readers' load of `flags` is Relaxed, so nothing pairs
        // with it. None needs to: the cell synchronizes itself (its Acquire loads pair with
        // `store`'s Release), and both its buffers hold the built configuration at generation
        // 0 from construction on, so a reader that sees `CHANGED` before the new buffer gets
        // the old configuration, whole, with its own generation.
        self.flags.fetch_or(CHANGED, Release);
        Ok(())
    }

    /// Whether one unit was taken now: [`check`](Direct::check) without the details.
    /// True for every admission, delayed ones too ([`Decision::is_allowed`]).
    #[inline]
    pub fn allow(&self) -> bool {
        self.check().is_allowed()
    }

    /// Whether `n` units were taken now.
    #[inline]
    pub fn allow_n(&self, n: u64) -> bool {
        self.check_n(n).is_allowed()
    }

    /// Whether `n` units were taken at a caller-supplied `now`.
    #[inline]
    pub fn allow_n_at(&self, now: Nanos, n: u64) -> bool {
        self.check_n_at(now, n).is_allowed()
    }

    /// What [`check`](Direct::check) would answer now, taking nothing.
    #[inline]
    pub fn peek(&self) -> Decision {
        self.peek_n_at(self.clock.now(), 1)
    }

    /// What [`check_n`](Direct::check_n) would answer now, taking nothing.
    #[inline]
    pub fn peek_n(&self, n: u64) -> Decision {
        self.peek_n_at(self.clock.now(), n)
    }

    /// [`peek`](Direct::peek) at a caller-supplied `now`.
    #[inline]
    pub fn peek_at(&self, now: Nanos) -> Decision {
        self.peek_n_at(now, 1)
    }

    /// [`peek_n`](Direct::peek_n) at a caller-supplied `now`.
    #[inline]
    pub fn peek_n_at(&self, now: Nanos, n: u64) -> Decision {
        match self.current() {
            (Some(config), _) => config.direct_peek(&self.state, now, self.origin, n),
            (None, _) => self.algorithm.direct_peek(&self.state, now, self.origin, n),
        }
    }

    /// The current time on this limiter's clock, for the `*_at` methods.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The current configuration: as built, or as last set by
    /// [`set_policy`](Direct::set_policy) (for the token bucket, as compiled for this limiter).
    pub fn policy(&self) -> A
    where
        A: Clone,
    {
        if let Some(current) = self.algorithm.direct_current(&self.state) {
            return current;
        }
        self.current().0.unwrap_or_else(|| self.algorithm.clone())
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

/// Every direct limiter is a limit of [`check_all`](crate::check_all): its charge is its own
/// decision, and its refund gives back what is still owed (exactly for the token bucket at the
/// charge's instant and for the windows while their window counts; for nginx and the sliding
/// log, exactly if nothing else changed the state since, and nothing otherwise).
impl<A: Algorithm, C: Clock> Admit for Direct<A, C> {
    #[inline]
    fn charge(&self, n: u64) -> (Decision, Option<Receipt>) {
        let now = self.clock.now();
        let (config, generation) = self.current();
        let (d, taken) = match &config {
            Some(c) => c.direct_charge(&self.state, now, self.origin, n),
            None => self.algorithm.direct_charge(&self.state, now, self.origin, n),
        };
        if let Some(c) = &self.counters {
            c.record(&d);
        }
        // The receipt names the configuration's generation: a refund under another gives
        // nothing back.
        (d, taken.map(|words| Receipt::new(self.id, generation, words, n)))
    }

    #[inline]
    fn refund(&self, r: Receipt) {
        let (config, generation) = self.current();
        if let Some((words, n)) = r.take(self.id, generation) {
            let now = || self.clock.now();
            match &config {
                Some(c) => c.direct_refund(&self.state, words, n, self.origin, now),
                None => self.algorithm.direct_refund(&self.state, words, n, self.origin, now),
            }
        }
    }

    #[inline]
    fn peek_n(&self, n: u64) -> Decision {
        Direct::peek_n(self, n)
    }
}

impl<A: Algorithm + Clone + fmt::Debug, C: Clock> fmt::Debug for Direct<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct")
            .field("policy", &self.policy())
            .field("origin", &self.origin)
            .field("remaining", &self.peek_n(0).remaining())
            .finish_non_exhaustive()
    }
}
