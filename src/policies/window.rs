//! Fixed window: at most `limit` per window of length `W`, windows aligned to the limiter's
//! creation. The cheapest counter; a burst of up to `2·limit` can straddle a boundary.
//!
//! # Layout
//!
//! ```text
//!  63                          24 23                     0
//! +------------------------------+------------------------+
//! |  window index + 1 (40 bits)  |   count (24 bits)      |
//! +------------------------------+------------------------+
//!
//!  63                           b b−1                    0     (a limit above 2^24 − 1:
//! +------------------------------+------------------------+     b = its bits, 25 to 32)
//! | window index + 1 (64 − b)    |   count (b bits)       |
//! +------------------------------+------------------------+
//! ```
//!
//! Window `i` covers `[i·W, (i+1)·W)` ns since the limiter's creation; the word 0 is a fresh key
//! (index 0 never matches a current window, which is stored as `i + 1`). The stored index never
//! moves back: a decision whose clock reads an older window counts in the stored one. 40 bits of windows last
//! 2^40 − 2 windows (34.8 years of 1 ms windows); after that the index saturates, the last window
//! never ends and the limiter only denies. `limit` is at most 2^24 − 1 for any window; a window of
//! a second or more takes a limit up to 2^32 − 1, its count then as wide as the limit needs
//! (`b` = 25 to 32 bits, the index the other `64 − b`: 2^32 − 2 windows of a second, 136 years,
//! at the least). Updated by [`Direct`]'s relaxed CAS loop.

use core::time::Duration;

use crate::engine::arith::Divisor;
use crate::engine::config::WORDS;
use crate::engine::direct::Direct;
use crate::policies::policy::Policy;
use crate::{ConfigError, Decision, DefaultClock, Nanos, Outcome, UpdateError};

/// The count's width for every limit up to [`FixedWindow::MAX_LIMIT`].
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// The shortest window of a limit above [`COUNT_MASK`]: a second.
const LONG_WINDOW: u64 = 1_000_000_000;
/// Elapsed time is clamped below 2^63 ns (292 years), the divisor's range.
const MAX_ELAPSED: u64 = (1 << 63) - 1;

/// The count's width for `limit`: 24 bits, or as many as a larger limit needs (at most 32).
const fn count_bits(limit: u64) -> u32 {
    if limit <= COUNT_MASK {
        COUNT_BITS
    } else {
        64 - limit.leading_zeros()
    }
}

/// `limit` per fixed window of `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
    per_window: Divisor,
    /// Refused units count in the window too ([`FixedWindow::charging_refusals`]).
    charge_refused: bool,
    /// The count's width, [`count_bits`] of the limit.
    bits: u32,
}

impl FixedWindow {
    /// The largest limit of any window: 2^24 − 1.
    pub const MAX_LIMIT: u64 = COUNT_MASK;

    /// The largest limit of a window of a second or more: 2^32 − 1.
    pub const MAX_LONG_LIMIT: u64 = u32::MAX as u64;

    /// At most `limit` per `window` (1 ns to 2^62 ns): a limit up to [`MAX_LIMIT`](Self::MAX_LIMIT)
    /// for any window, up to [`MAX_LONG_LIMIT`](Self::MAX_LONG_LIMIT) for a window of a second
    /// or more.
    pub fn new(limit: u64, window: Duration) -> Result<FixedWindow, ConfigError> {
        let window = check_window("fixed-window", limit, Self::MAX_LONG_LIMIT, window)?;
        if limit > COUNT_MASK && window < LONG_WINDOW {
            return Err(ConfigError::WindowTooShortForLimit {
                limit,
                window_nanos: window,
                min_nanos: LONG_WINDOW,
                max_short: COUNT_MASK,
            });
        }
        Ok(FixedWindow {
            limit,
            window,
            per_window: Divisor::new(window),
            charge_refused: false,
            bits: count_bits(limit),
        })
    }

    /// The count's width in the word: 24 bits, or the bits of a limit above 2^24 − 1 (25 to
    /// 32). Words of one width mean nothing under another: a store that keeps words (a Redis
    /// key, a file) must keep the width with them.
    pub const fn count_bits(&self) -> u32 {
        self.bits
    }

    /// The count's largest value: 2^24 − 1, or 2^b − 1 for a limit of `b` > 24 bits.
    #[inline(always)]
    const fn count_mask(&self) -> u64 {
        (1 << self.bits) - 1
    }

    /// The largest stored index (`i + 1`).
    #[inline(always)]
    const fn max_index(&self) -> u64 {
        (1 << (64 - self.bits)) - 1
    }

    /// This window, counting refused units as well as admitted ones: the count of a window
    /// is every unit asked for in it (up to the count's largest value: 2^24 − 1, or
    /// 2^b − 1 for a limit of `b` > 24 bits), as in limiters that increment a
    /// counter before they compare it (envoyproxy/ratelimit's `INCRBY`, most Redis `INCR`
    /// scripts). A client that keeps asking past the limit stays refused until the window
    /// ends, and its refusals never turn into admissions. Decisions are unchanged otherwise;
    /// refused units are not refundable, and a request of more units than the count's largest
    /// value is refused without counting.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FixedWindow, FixedWindowLimiter, ManualClock, Nanos};
    ///
    /// let w = FixedWindow::new(2, Duration::from_secs(60))?.charging_refusals();
    /// let l = FixedWindowLimiter::with_clock(w, ManualClock::new());
    /// let t = Nanos::ZERO;
    /// assert!(l.check_n_at(t, 1).is_allowed());
    /// assert!(!l.check_n_at(t, 2).is_allowed()); // refused, and counted: 3 of 2
    /// assert!(!l.check_n_at(t, 1).is_allowed()); // one would fit without the refused two
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub const fn charging_refusals(mut self) -> FixedWindow {
        self.charge_refused = true;
        self
    }

    /// Whether refused units count ([`charging_refusals`](FixedWindow::charging_refusals)).
    pub const fn charges_refusals(&self) -> bool {
        self.charge_refused
    }

    /// The count of a window after `n` more units were refused in it, when refusals count
    /// and the count can grow: `count + n`, held at the count's largest value.
    /// A request of more than that largest count is refused without counting.
    #[inline]
    fn refused_count(&self, count: u64, n: u64) -> Option<u64> {
        let mask = self.count_mask();
        let next = count.saturating_add(n).min(mask);
        (self.charge_refused && n > 0 && n <= mask && next > count).then_some(next)
    }

    /// The limit per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }
}

impl Policy for FixedWindow {
    #[inline(always)]
    fn decide(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision) {
        let e = elapsed.as_u64().min(MAX_ELAPSED);
        // The common case first, without dividing: the clock is in the stored window `s − 1`
        // (stored as `s`, short of the lifetime's end), which starts at (s − 1)·W, below 2^63
        // for every index a decision stored; the wrapping difference is below W exactly when
        // the clock is in it. The general path below gives the same answers.
        let stored = word >> self.bits;
        let delta = e.wrapping_sub(stored.wrapping_sub(1).wrapping_mul(self.window));
        if delta < self.window && stored < self.max_index() && n.wrapping_sub(1) < self.limit {
            let count = word & self.count_mask();
            let until_end = self.window - delta;
            #[expect(clippy::cast_possible_truncation, reason = "at most the limit, below 2^32")]
            let remaining = |c: u64| self.limit.saturating_sub(c) as u32;
            if count + n <= self.limit {
                let d = Decision::from_nanos(
                    Outcome::Allowed,
                    remaining(count + n),
                    Nanos::ZERO,
                    Nanos::new(until_end),
                );
                return (Some(word + n), d);
            }
            let stored = self.refused_count(count, n).map(|c| word - count + c);
            let reset = Nanos::new(if count == 0 && stored.is_none() { 0 } else { until_end });
            return (
                stored,
                Decision::from_nanos(Outcome::Denied, remaining(count), Nanos::new(until_end), reset),
            );
        }
        let i = self.per_window.div(e);
        let now_index = (i + 1).min(self.max_index());
        // The window index never moves back: a thread whose clock reads an earlier window than
        // the stored one counts in the stored window (found by loom-tests/tests/window.rs, where a
        // late window-0 write otherwise erased window 1's count).
        let stored = word >> self.bits;
        let (index, count) =
            if stored >= now_index { (stored, word & self.count_mask()) } else { (now_index, 0) };
        // Window `index − 1` ends at index·W; past the lifetime it never does.
        let until_end =
            if index < self.max_index() { index.saturating_mul(self.window) - e } else { u64::MAX };
        let reset = Nanos::new(if count == 0 { 0 } else { until_end });
        let remaining = |c: u64| {
            #[expect(clippy::cast_possible_truncation, reason = "at most the limit, below 2^32")]
            let r = self.limit.saturating_sub(c) as u32;
            r
        };
        if n > self.limit {
            let stored = self.refused_count(count, n).map(|c| (index << self.bits) | c);
            let reset = if stored.is_some() { Nanos::new(until_end) } else { reset };
            return (
                stored,
                Decision::from_nanos(Outcome::Insufficient, remaining(count), Nanos::ZERO, reset),
            );
        }
        if n == 0 {
            return (None, Decision::from_nanos(Outcome::Allowed, remaining(count), Nanos::ZERO, reset));
        }
        if count + n <= self.limit {
            let next = (index << self.bits) | (count + n);
            let d = Decision::from_nanos(
                Outcome::Allowed,
                remaining(count + n),
                Nanos::ZERO,
                Nanos::new(until_end),
            );
            (Some(next), d)
        } else {
            let stored = self.refused_count(count, n).map(|c| (index << self.bits) | c);
            let reset = if stored.is_some() { Nanos::new(until_end) } else { reset };
            let d = Decision::from_nanos(Outcome::Denied, remaining(count), Nanos::new(until_end), reset);
            (stored, d)
        }
    }

    /// Exact: while the window the units were counted in is still the stored one, its count
    /// drops by `n` (the count holds them: counts only grow within a window, and every other
    /// refund takes back only its own). Once the window has moved on, its count no longer
    /// matters and nothing is owed.
    #[inline]
    fn refund(&self, word: u64, _prior: u64, stored: u64, _elapsed: Nanos, n: u64) -> Option<u64> {
        if word >> self.bits != stored >> self.bits || n == 0 {
            return None;
        }
        Some(word - n.min(word & self.count_mask()))
    }

    fn config_words(&self) -> Option<[u64; WORDS]> {
        let [magic, shift] = self.per_window.to_words();
        Some([self.limit, self.window, magic, shift, u64::from(self.charge_refused), 0, 0, 0, 0, 0])
    }

    fn from_config_words(w: [u64; WORDS]) -> Option<FixedWindow> {
        let [limit, window, magic, shift, charge, ..] = w;
        Some(FixedWindow {
            limit,
            window,
            per_window: Divisor::from_words([magic, shift]),
            charge_refused: charge != 0,
            bits: count_bits(limit),
        })
    }

    /// Any new limit of the same count width (both at most 2^24 − 1, or both of `b` > 24
    /// bits); the window's length stays (the state counts in windows).
    fn running_update(&self, new: FixedWindow) -> Result<FixedWindow, UpdateError> {
        if new.window != self.window {
            return Err(UpdateError::Incompatible {
                reason: "a fixed window's length cannot change at runtime: its state counts in windows",
            });
        }
        if new.bits != self.bits {
            return Err(UpdateError::Incompatible {
                reason: "a fixed window's limit cannot change at runtime to one of another width \
                         (at most 2^24 - 1, or as many bits as a larger limit has): its count's width would change",
            });
        }
        Ok(new)
    }
}

impl FixedWindow {
    /// The largest stored index a keyed clock reaches (`i + 1`): two below the most a word with
    /// two bits free can hold, so that a new key's word above a slot's high-water mark (`above`)
    /// fits. 2^38 − 4 windows; 2^30 − 4 (34 years of a second) at the widest count.
    const fn keyed_max_index(&self) -> u64 {
        (1 << (62 - self.bits)) - 4
    }
}

/// Keyed words: see `keyed/policy.rs`. Decided as direct ones: stored words only grow (the
/// index never moves back, and within a window only the count grows).
impl crate::keyed::sealed::KeyedWords for FixedWindow {
    const NAME: &'static str = "fixed window";

    /// Any new limit; the window's length stays (the lines are the window's).
    fn keyed_update(&self, new: FixedWindow) -> Result<FixedWindow, UpdateError> {
        self.running_update(new)
    }

    fn keyed_lifetime(&self) -> Nanos {
        // Windows 0 ..= KEYED_MAX_INDEX − 1, so that `i + 1` stays at or below the keyed maximum.
        Nanos::new(self.keyed_max_index().saturating_mul(self.window).min(MAX_ELAPSED + 1) - 1)
    }

    /// The limit; with refusals counted, the largest count (a refused request up to it is
    /// counted, so it must reach the word).
    #[inline]
    fn most_at_once(&self) -> u64 {
        if self.charge_refused {
            self.count_mask()
        } else {
            self.limit
        }
    }

    /// The current window, nothing counted: what a word of an earlier window decides as.
    #[inline]
    fn fresh(&self, elapsed: Nanos) -> u64 {
        (self.per_window.div(elapsed.as_u64().min(MAX_ELAPSED)) + 1) << self.bits
    }

    /// Every word of an earlier window. A word of window `i` is at most `(i + 1)·2^b − 1`, so
    /// its evicted value + 1 is at most the fresh word of any later window.
    #[inline]
    fn evictable(&self, elapsed: Nanos) -> u64 {
        self.fresh(elapsed)
    }

    /// The mark itself if it is a window with nothing counted, else the next window's fresh
    /// word (a mark `index·2^b + count + 1` is not a state when the count was the limit).
    fn above(&self, mark: u64) -> u64 {
        if mark & self.count_mask() == 0 {
            mark
        } else {
            ((mark >> self.bits) + 1) << self.bits
        }
    }
}

/// Validates a window limiter's `limit` (1 to `max_limit`) and `window` (1 ns to 2^62 ns, the
/// divisor's range); returns the window in nanoseconds. `kind` names the limiter in errors.
pub(crate) fn check_window(
    kind: &'static str,
    limit: u64,
    max_limit: u64,
    window: Duration,
) -> Result<u64, ConfigError> {
    let algorithm = match kind {
        "fixed-window" => "fixed window",
        "sliding-log" => "sliding log",
        _ => "sliding window",
    };
    if limit == 0 {
        return Err(ConfigError::ZeroLimit { algorithm });
    }
    if limit > max_limit {
        return Err(ConfigError::LimitTooLarge { algorithm, limit, max: max_limit });
    }
    let window = Nanos::try_from(window)?.as_u64();
    if window == 0 {
        return Err(ConfigError::ZeroWindow { algorithm });
    }
    if window > 1 << 62 {
        return Err(ConfigError::WindowTooLong { algorithm, window_nanos: window, max_nanos: 1 << 62 });
    }
    Ok(window)
}

/// A direct fixed-window limiter.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FixedWindow, FixedWindowLimiter, ManualClock, Nanos};
///
/// let l = FixedWindowLimiter::with_clock(FixedWindow::new(2, Duration::from_secs(1))?, ManualClock::new());
/// assert!(l.check_at(Nanos::ZERO).is_allowed());
/// assert!(l.check_at(Nanos::new(999_999_999)).is_allowed());
/// assert_eq!(l.check_at(Nanos::new(999_999_999)).retry_after(), Some(Duration::from_nanos(1)));
/// assert!(l.check_at(Nanos::new(1_000_000_000)).is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type FixedWindowLimiter<C = DefaultClock> = Direct<FixedWindow, C>;
