//! Sliding log: exactly "at most `N` in any window `W`", for one state ([`SlidingLogLimiter`])
//! or per key ([`KeyedSlidingLog`]).
//!
//! A log keeps the expiry (`admitted at + W`) of each of the last `N` admitted units in a ring,
//! oldest first. `n` more fit at `t` exactly when the `n`-th oldest has expired: then every
//! window ending at `t` holds at most `N − n` older units. Deciding reads one entry, and a
//! binary search over the ring counts what is left; memory is `8·N` bytes per key, fixed.
//!
//! Unlike every other algorithm here, the state is `N` words, so a decision takes a lock: a
//! `Mutex` around the one log, or around the shard of the keyed table. The critical section is
//! a few dozen instructions and never allocates, blocks on I/O or panics.
//!
//! # Time
//!
//! Expiries are stored as nanoseconds since the limiter's creation plus `W`, and never move
//! back: a decision whose clock reads earlier than the newest admission is stored as if at
//! that admission (its units expire later than they would: fewer admissions, never more).

pub(crate) mod keyed;

use core::time::Duration;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crossbeam_utils::CachePadded;

use crate::engine::direct::{Algorithm, Direct};
use crate::policies::window::check_window;
use crate::{ConfigError, Decision, DefaultClock, Nanos, Outcome, UpdateError};

/// Elapsed time is clamped below 2^63 ns (292 years), so that `t + W` fits a `u64`.
const MAX_ELAPSED: u64 = (1 << 63) - 1;

/// At most `limit` in any sliding window of `window`, exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

impl SlidingLog {
    /// The largest limit: 2^16 (512 KiB of log per key).
    pub const MAX_LIMIT: u64 = 1 << 16;

    /// At most `limit` (1 to 2^16) in any `window` (1 ns to 2^62 ns).
    pub fn new(limit: u64, window: Duration) -> Result<SlidingLog, ConfigError> {
        let window = check_window("sliding-log", limit, Self::MAX_LIMIT, window)?;
        Ok(SlidingLog { limit, window })
    }

    /// The limit per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Bytes of log one key (or one direct limiter) holds: `8·limit`.
    pub const fn log_bytes(&self) -> usize {
        #[expect(clippy::cast_possible_truncation, reason = "the limit is at most 2^16")]
        let n = self.limit as usize;
        8 * n
    }

    fn entries(&self) -> usize {
        usize::try_from(self.limit).expect("at most 2^16")
    }

    /// Decides `n` units at `now` (ns since the origin) on the log `ring` whose oldest entry is
    /// at `head`; stores them when `take` and they fit. Returns the decision and, when stored,
    /// the expiry written.
    #[inline(always)]
    fn decide(
        &self,
        ring: &mut [u64],
        head: &mut usize,
        now: u64,
        n: u64,
        take: bool,
    ) -> (Decision, Option<u64>) {
        let len = ring.len();
        let at = |i: usize| ring[wrap(*head + i, len)];
        let now = now.min(MAX_ELAPSED);
        let newest = at(len - 1);
        // A keyed log whose limit was lowered at runtime keeps its longer ring: only the
        // newest `limit` entries count, from `skip` on (0 when the ring is the limit's size).
        let skip = len.saturating_sub(usize::try_from(self.limit).unwrap_or(len));
        // Entries at or before `now` have expired; they are the oldest (the ring is sorted
        // from `head`): `expired` of the counted ones.
        let expired = partition_point(len, |i| at(i) <= now).saturating_sub(skip);
        #[expect(clippy::cast_possible_truncation, reason = "at most 2^16")]
        let remaining = |k: usize| k as u32;
        let reset = |newest: u64| Nanos::new(newest.saturating_sub(now));
        if n > self.limit {
            return (
                Decision::from_nanos(Outcome::Insufficient, remaining(expired), Nanos::ZERO, reset(newest)),
                None,
            );
        }
        if n == 0 {
            return (
                Decision::from_nanos(Outcome::Allowed, remaining(expired), Nanos::ZERO, reset(newest)),
                None,
            );
        }
        let n = usize::try_from(n).expect("at most the limit");
        let nth = at(skip + n - 1);
        if nth > now {
            let retry = Nanos::new(nth - now);
            return (Decision::from_nanos(Outcome::Denied, remaining(expired), retry, reset(newest)), None);
        }
        let expiry = (now + self.window).max(newest);
        let decision =
            Decision::from_nanos(Outcome::Allowed, remaining(expired - n), Nanos::ZERO, reset(expiry));
        if !take {
            return (decision, None);
        }
        for i in 0..n {
            ring[wrap(*head + i, len)] = expiry;
        }
        *head = wrap(*head + n, len);
        (decision, Some(expiry))
    }

    /// Takes back the `n` units a charge at `at` (ns since the origin) stored with `expiry`,
    /// if nothing has been admitted on the log since (the caller checks that its count of
    /// admitted units, less what refunds gave back, still equals the count the charge left): then the log's newest `n` entries are those units (or, after a refund of an
    /// older charge at the same instant, units with the same expiry, which count the same).
    /// They leave, and entries expiring at `at` take the place of the ones the charge
    /// overwrote: those had expired by `at`, so from `at` on the log answers exactly as if the
    /// charge had not happened, and before it (a clock that steps back) it admits no more.
    /// Otherwise nothing is given back: the units stay spent, which errs toward refusal.
    fn refund(ring: &mut [u64], head: usize, at: u64, expiry: u64, n: u64) -> bool {
        let len = ring.len();
        let Ok(n) = usize::try_from(n) else { return false };
        if n == 0 || n > len {
            return false;
        }
        let idx = |i: usize| wrap(head + i, len);
        if (len - n..len).any(|i| ring[idx(i)] != expiry) {
            return false;
        }
        // Drop the newest `n`, then insert `n` entries of `at` at their sorted place among the
        // older ones (all at most `expiry`, and `at ≤ expiry`).
        let p = partition_point(len - n, |i| ring[idx(i)] < at);
        for i in (p..len - n).rev() {
            ring[idx(i + n)] = ring[idx(i)];
        }
        for i in p..p + n {
            ring[idx(i)] = at;
        }
        true
    }
}

/// `i` as a position in a ring of `len`, for `i < 2·len` (a head below `len` plus an offset
/// below `len`): `i mod len` without a division (`%` cost a decision a `div` for every entry
/// it read).
#[inline(always)]
fn wrap(i: usize, len: usize) -> usize {
    debug_assert!(i < 2 * len, "{i} in a ring of {len}");
    // Branch-free: which side of `len` the index falls on follows the key's head, which a
    // branch predictor cannot learn.
    i - (len & usize::from(i >= len).wrapping_neg())
}

/// The first `i` in `0..len` where `pred(i)` is false (`pred` true then false).
#[inline]
fn partition_point(len: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One log: the ring, the position of its oldest entry, the units ever admitted (less what
/// refunds gave back; moved on by a configuration change, so that no earlier charge is
/// refunded across it), and the current configuration.
#[doc(hidden)]
#[derive(Debug)]
pub struct State {
    ring: Box<[u64]>,
    head: usize,
    admitted: u64,
    config: SlidingLog,
}

/// A direct sliding-log limiter: at most `N` in any window `W`, exactly, for one state.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Nanos, SlidingLog, SlidingLogLimiter};
///
/// // 3 per second, in any second.
/// let l = SlidingLogLimiter::with_clock(SlidingLog::new(3, Duration::from_secs(1))?, ManualClock::new());
/// let ms = |m: u64| Nanos::new(m * 1_000_000);
/// assert!(l.check_at(ms(0)).is_allowed());
/// assert!(l.check_n_at(ms(600), 2).is_allowed());
/// let d = l.check_at(ms(999));
/// assert!(!d.is_allowed());
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(1))); // the unit of 0 ms leaves at 1000
/// assert!(l.check_at(ms(1000)).is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type SlidingLogLimiter<C = DefaultClock> = Direct<SlidingLog, C>;

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Nothing panics while the lock is held; a poisoned lock still holds a sorted log.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn elapsed(now: Nanos, origin: Nanos) -> u64 {
    now.saturating_sub(origin).as_u64()
}

/// The log under a lock: `N` words do not fit one CAS. The lock is held for the decision only
/// (a binary search and at most `n` stores), never across I/O or an allocation.
impl Algorithm for SlidingLog {
    type State = CachePadded<Mutex<State>>;

    fn new_state(&self) -> Self::State {
        let state =
            State { ring: vec![0; self.entries()].into_boxed_slice(), head: 0, admitted: 0, config: *self };
        CachePadded::new(Mutex::new(state))
    }

    fn direct_check(&self, state: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        self.direct_charge(state, now, origin, n).0
    }

    fn direct_peek(&self, state: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        let e = elapsed(now, origin);
        let mut s = lock(state);
        let State { ring, head, config, .. } = &mut *s;
        config.decide(ring, head, e, n, false).0
    }

    /// The receipt: the instant of the charge, the expiry it wrote and the count of units
    /// admitted with it.
    fn direct_charge(
        &self,
        state: &Self::State,
        now: Nanos,
        origin: Nanos,
        n: u64,
    ) -> (Decision, Option<[u64; 3]>) {
        let e = elapsed(now, origin);
        let mut s = lock(state);
        let State { ring, head, admitted, config } = &mut *s;
        let (d, expiry) = config.decide(ring, head, e, n, true);
        let Some(expiry) = expiry else { return (d, None) };
        *admitted += n;
        (d, Some([e.min(MAX_ELAPSED), expiry, *admitted]))
    }

    /// Exact if nothing was admitted on the log between the charge and the refund; otherwise
    /// nothing comes back (see `SlidingLog::refund`).
    fn direct_refund(
        &self,
        state: &Self::State,
        [at, expiry, admitted]: [u64; 3],
        n: u64,
        _: Nanos,
        _: impl Fn() -> Nanos,
    ) {
        let mut s = lock(state);
        if s.admitted == admitted {
            let head = s.head;
            if SlidingLog::refund(&mut s.ring, head, at, expiry, n) {
                // So that an older charge's refund, next in a chain of refunds, finds its own
                // units the newest again.
                s.admitted -= n;
            }
        }
    }

    fn direct_current(&self, state: &Self::State) -> Option<SlidingLog> {
        Some(lock(state).config)
    }

    /// Keeps the newest entries, as many as the new limit holds, each expiring when it was
    /// going to; the new ring is allocated before the lock is taken.
    fn direct_update(&self, state: &Self::State, new: SlidingLog) -> Result<Option<SlidingLog>, UpdateError> {
        let mut ring = vec![0; new.entries()].into_boxed_slice();
        let mut s = lock(state);
        let len = s.ring.len();
        let keep = len.min(ring.len());
        // The ring is sorted from `head`, oldest first: the newest `keep` go to the end of the
        // new ring, in order, after expired (zero) entries.
        for i in 0..keep {
            ring[ring.len() - keep + i] = s.ring[(s.head + len - keep + i) % len];
        }
        s.ring = ring;
        s.head = 0;
        s.config = new;
        s.admitted += 1;
        Ok(None)
    }
}
