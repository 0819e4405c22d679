//! Sliding-window counter (Cloudflare's): "at most N per W" without fixed-window's boundary
//! burst, in one word. The previous window's count is weighted by the part of it still inside
//! the sliding window:
//!
//! ```text
//! admit n at δ into window i  ⇔  prev·(W − δ) + (curr + n)·W ≤ N·W        (exact integers)
//! ```
//!
//! The estimate assumes the previous window's requests were spread evenly; the test itself is
//! exact integer arithmetic, so nothing rounds.
//!
//! # Layout
//!
//! ```text
//!  63                         2c  2c-1          c  c-1          0
//! +-------------------------------+---------------+---------------+
//! | window index + 1 (64−2c bits) |  curr (c bits) |  prev (c bits)|
//! +-------------------------------+---------------+---------------+
//! ```
//!
//! `c` is the number of bits the limit needs (at most 20). Window `i` covers `[i·W, (i+1)·W)` ns
//! since the limiter's creation; the word 0 is a fresh key. The index has `64 − 2c` bits, so a
//! limiter lasts `2^(64−2c) − 2` windows: construction refuses a window so short that this is
//! under 100 years. The stored index never moves back (a thread whose clock reads an earlier
//! window counts in the stored one, as if at its start). Updated by [`Direct`]'s CAS loop.

use core::time::Duration;

use crate::engine::arith::Divisor;
use crate::engine::config::WORDS;
use crate::engine::direct::Direct;
use crate::policies::policy::Policy;
use crate::policies::window::check_window;
use crate::{ConfigError, Decision, DefaultClock, Nanos, Outcome, UpdateError};

/// Elapsed time is clamped below 2^63 ns (292 years), the divisor's range.
const MAX_ELAPSED: u64 = (1 << 63) - 1;
/// The shortest lifetime construction accepts: 100 years.
const MIN_LIFETIME_NANOS: u128 = 100 * 365 * 86_400 * 1_000_000_000;

/// At most `limit` per sliding window of `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    window: u64,
    per_window: Divisor,
    /// Bits per count.
    bits: u32,
    /// `2^bits − 1`.
    mask: u64,
    /// The largest stored index (`i + 1`).
    max_index: u64,
    /// `3·(2^bits − 1)·window < 2^64`: the admission test fits in `u64` for every pair of
    /// counts the word can hold (every window under 48 days for limits up to 2^16 − 1).
    small: bool,
}

impl SlidingWindow {
    /// The largest limit: 2^20 − 1.
    pub const MAX_LIMIT: u64 = (1 << 20) - 1;

    /// At most `limit` per `window`. The window must be long enough for the limiter to last 100
    /// years: `window · 2^(64 − 2·bits(limit))` ≥ 100 years (any window of 1 ms or more for
    /// limits up to 2,047; 1 s or more up to 65,535).
    pub fn new(limit: u64, window: Duration) -> Result<SlidingWindow, ConfigError> {
        let w = check_window("sliding-window", limit, Self::MAX_LIMIT, window)?;
        let bits = 64 - limit.leading_zeros();
        let max_index = (1u64 << (64 - 2 * bits)) - 1;
        if u128::from(max_index - 1) * u128::from(w) < MIN_LIFETIME_NANOS {
            return Err(ConfigError::WindowTooShort {
                limit,
                window_nanos: w,
                min_nanos: u64::try_from(MIN_LIFETIME_NANOS.div_ceil(u128::from(max_index - 1)))
                    .unwrap_or(u64::MAX),
            });
        }
        // Bounded by the counts' width, not the limit: after a change at runtime
        // (`running_update`) the word may hold counts up to `mask`, and a decision that read
        // the flag before the change decides them under this (the built) policy.
        let mask = (1u64 << bits) - 1;
        let small = u128::from(mask) * u128::from(w) * 3 < 1 << 64;
        Ok(SlidingWindow {
            limit,
            window: w,
            per_window: Divisor::new(w),
            bits,
            mask: (1 << bits) - 1,
            max_index,
            small,
        })
    }

    /// The limit per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Whether `n` more fit with `prev`, `curr` at `delta` into the window.
    #[inline]
    fn fits(&self, prev: u64, curr: u64, delta: u64, n: u64) -> bool {
        if self.small {
            // prev ≤ limit and curr + n ≤ 2·limit: every term is below 3·limit·window.
            let w = self.window;
            return prev * (w - delta) + (curr + n) * w <= self.limit * w;
        }
        let w = u128::from(self.window);
        u128::from(prev) * u128::from(self.window - delta) + u128::from(curr + n) * w
            <= u128::from(self.limit) * w
    }

    /// Whole requests that still fit: `floor((N·W − prev·(W − δ) − curr·W) / W)`, which is
    /// `N − curr − ceil(prev·(W − δ)/W)`, clamped at zero.
    #[inline]
    fn remaining(&self, prev: u64, curr: u64, delta: u64) -> u32 {
        let weighted = ceil_mul_div(prev, self.window - delta, self.window, self.per_window);
        let r = self.limit.saturating_sub(curr).saturating_sub(weighted);
        #[expect(clippy::cast_possible_truncation, reason = "at most the limit, below 2^20")]
        let r = r as u32;
        r
    }

    /// The earliest wait after which `n` fit, given no other request (the estimate never grows
    /// with time, so this is exact). `None` once the index has saturated: windows no longer end.
    fn wait_for(&self, prev: u64, curr: u64, delta: u64, n: u64) -> u64 {
        let (w, limit) = (self.window, self.limit);
        // In this window: prev·(W − δ − x) ≤ (N − curr − n)·W.
        if curr + n <= limit && prev > 0 {
            let x = (w - delta).saturating_sub(mul_div(limit - curr - n, w, prev));
            if delta + x < w {
                return x;
            }
        }
        // In the next one, where prev' = curr and curr' = 0: curr·(W − δ') ≤ (N − n)·W.
        let to_next = w - delta;
        if curr == 0 {
            return to_next;
        }
        let d = w.saturating_sub(mul_div(limit - n, w, curr));
        if d < w {
            return to_next + d;
        }
        // The one after: both counts have aged out.
        to_next + w
    }

    /// Every other case: an older window, a clock behind the stored window, the lifetime's end,
    /// `n = 0` or `n > limit`. Inline, though rare: out of line, its result came back through
    /// memory, and every decision, whatever its path, then went through that memory too (the
    /// paths' results merged there), read back with wider loads than its stores (a failed store
    /// forward): the full window's denial took 1.47× the bucket's, 0.98× inline.
    #[inline(always)]
    fn decide_general(&self, word: u64, e: u64, i: u64, n: u64) -> (Option<u64>, Decision) {
        let (c, mask) = (self.bits, self.mask);
        let now_index = (i + 1).min(self.max_index);
        let stored = word >> (2 * c);
        let (s_curr, s_prev) = ((word >> c) & mask, word & mask);
        let (index, prev, curr) = if stored >= now_index {
            (stored, s_prev, s_curr)
        } else if stored + 1 == now_index {
            (now_index, s_curr, 0)
        } else {
            (now_index, 0, 0)
        };
        let saturated = index >= self.max_index;
        // The effective window starts at (index − 1)·W; a later stored window lies ahead of `e`.
        let start = (index - 1).saturating_mul(self.window);
        let (delta, ahead) = if saturated {
            (0, 0)
        } else if start <= e {
            (e - start, 0)
        } else {
            (0, start - e)
        };
        let reset = |prev: u64, curr: u64| {
            if saturated && (prev | curr) != 0 {
                Nanos::MAX
            } else if curr > 0 {
                Nanos::new(ahead + 2 * self.window - delta)
            } else if prev > 0 {
                Nanos::new(ahead + self.window - delta)
            } else {
                Nanos::ZERO
            }
        };
        if n > self.limit {
            return (
                None,
                Decision::from_nanos(
                    Outcome::Insufficient,
                    self.remaining(prev, curr, delta),
                    Nanos::ZERO,
                    reset(prev, curr),
                ),
            );
        }
        if n == 0 {
            return (
                None,
                Decision::from_nanos(
                    Outcome::Allowed,
                    self.remaining(prev, curr, delta),
                    Nanos::ZERO,
                    reset(prev, curr),
                ),
            );
        }
        if self.fits(prev, curr, delta, n) {
            let next = (index << (2 * c)) | ((curr + n) << c) | prev;
            let left = self.remaining(prev, curr + n, delta);
            return (
                Some(next),
                Decision::from_nanos(Outcome::Allowed, left, Nanos::ZERO, reset(prev, curr + n)),
            );
        }
        let retry =
            if saturated { Nanos::MAX } else { Nanos::new(ahead + self.wait_for(prev, curr, delta, n)) };
        (
            None,
            Decision::from_nanos(
                Outcome::Denied,
                self.remaining(prev, curr, delta),
                retry,
                reset(prev, curr),
            ),
        )
    }
}

/// Keyed words: see `keyed/policy.rs`. The stored index `i + 1` stays at or below
/// `2^(62 − 2c) − 2`, so that every word keeps two bits free. Decided as direct ones: stored
/// words only grow (the index never moves back, and within a window only `curr` grows).
impl crate::keyed::sealed::KeyedWords for SlidingWindow {
    const NAME: &'static str = "sliding window";

    /// As a direct limiter's: any limit within the counts' width, the same window (the lines
    /// depend on the window and the width only).
    fn keyed_update(&self, new: SlidingWindow) -> Result<SlidingWindow, UpdateError> {
        self.running_update(new)
    }

    fn keyed_lifetime(&self) -> Nanos {
        // Two below the most a word with two bits free holds, so that `above` fits.
        let max_index = (1u64 << (62 - 2 * self.bits)) - 4;
        Nanos::new(max_index.saturating_mul(self.window).min(MAX_ELAPSED + 1) - 1)
    }

    #[inline]
    fn most_at_once(&self) -> u64 {
        self.limit
    }

    /// The current window, nothing counted in it or the previous one.
    #[inline]
    fn fresh(&self, elapsed: Nanos) -> u64 {
        (self.per_window.div(elapsed.as_u64().min(MAX_ELAPSED)) + 1) << (2 * self.bits)
    }

    /// Words of window `i − 2` or before, and of window `i − 1` with nothing counted in it:
    /// `(i << 2c) | (1 << c)` (window `i − 1` is stored as `i`). Evicted, such a word leaves
    /// at most this + 1 ≤ the fresh word `(i + 1) << 2c`.
    #[inline]
    fn evictable(&self, elapsed: Nanos) -> u64 {
        let i = self.per_window.div(elapsed.as_u64().min(MAX_ELAPSED));
        (i << (2 * self.bits)) | (1 << self.bits)
    }

    /// The mark itself if it is a window with nothing counted, else the next window's fresh
    /// word.
    fn above(&self, mark: u64) -> u64 {
        let c2 = 2 * self.bits;
        if mark & ((1 << c2) - 1) == 0 {
            mark
        } else {
            ((mark >> c2) + 1) << c2
        }
    }
}

impl Policy for SlidingWindow {
    #[inline(always)]
    fn decide(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision) {
        let (c, mask) = (self.bits, self.mask);
        let e = elapsed.as_u64().min(MAX_ELAPSED);
        let w = self.window;
        // The common cases first: the clock is in the stored window or the one after it (whose
        // `prev` is the stored `curr`), short of the lifetime's end, and 1 ≤ n ≤ limit. Found
        // without dividing: window `s − 1` (stored as `s`) starts at (s − 1)·W, below 2^63 for
        // every index a decision stored, and the wrapping difference is below W exactly when
        // the clock is in it (for the fresh word 0, "window −1" starts at −W). The general path
        // below gives the same answers.
        let stored = word >> (2 * c);
        let delta = e.wrapping_sub(stored.wrapping_sub(1).wrapping_mul(w));
        let in_range = stored + 1 < self.max_index && n.wrapping_sub(1) < self.limit;
        if delta < w && (word >> c) & mask >= self.limit && in_range {
            // The stored window is the current one and alone is full (the common denial):
            // nothing is left, the counts are gone 2W − δ from now, and `n` fit once
            // `curr·(W − δ') ≤ (N − n)·W` in the next window, `q = ⌊(N − n)·W / curr⌋ ≤ W`
            // before that (what `wait_for` finds).
            let q = if self.limit > n { mul_div(self.limit - n, w, (word >> c) & mask) } else { 0 };
            let reset = 2 * w - delta;
            return (
                None,
                Decision::from_nanos(Outcome::Denied, 0, Nanos::new(reset - q), Nanos::new(reset)),
            );
        }
        // The clock's window, its counts as this decision sees them, and δ: the stored window
        // or the next (found above), or, both counts aged out (the stored window two or more
        // before the clock's: a key idle that long, common in a keyed table), the clock's own.
        let view = if delta < 2 * w && in_range {
            Some(if delta < w {
                (stored, (word >> c) & mask, word & mask, delta)
            } else {
                (stored + 1, 0, (word >> c) & mask, delta - w)
            })
        } else {
            let i = self.per_window.div(e);
            (stored < i && i + 1 < self.max_index && n.wrapping_sub(1) < self.limit)
                .then(|| (i + 1, 0, 0, e - i * w))
        };
        let Some((now_index, curr, prev, delta)) = view else {
            return self.decide_general(word, e, self.per_window.div(e), n);
        };
        if curr + n <= self.limit {
            // prev·(W − δ) ≤ (N − curr − n)·W, and what is left is the difference over W: with
            // `small`, one multiplication each side and one reciprocal, every term below 2^63.
            let left = if self.small {
                let (weighted, room) = (prev * (w - delta), (self.limit - curr - n) * w);
                #[expect(clippy::cast_possible_truncation, reason = "at most the limit, below 2^20")]
                (weighted <= room).then(|| self.per_window.div(room - weighted) as u32)
            } else {
                self.fits(prev, curr, delta, n).then(|| self.remaining(prev, curr + n, delta))
            };
            if let Some(left) = left {
                let d = Decision::from_nanos(Outcome::Allowed, left, Nanos::ZERO, Nanos::new(2 * w - delta));
                return (Some((now_index << (2 * c)) | ((curr + n) << c) | prev), d);
            }
        }
        let reset = if curr > 0 {
            2 * w - delta
        } else if prev > 0 {
            w - delta
        } else {
            0
        };
        let retry = Nanos::new(self.wait_for(prev, curr, delta, n));
        let left = self.remaining(prev, curr, delta);
        (None, Decision::from_nanos(Outcome::Denied, left, retry, Nanos::new(reset)))
    }

    /// Exact: the units were counted in window `i`. While `i` is stored, its count drops by
    /// `n`; once `i + 1` is stored, `i`'s count is the previous one, weighted, and drops by `n`
    /// there; after that it no longer counts and nothing is owed.
    #[inline]
    fn refund(&self, word: u64, _prior: u64, stored: u64, _elapsed: Nanos, n: u64) -> Option<u64> {
        let (c, mask) = (self.bits, self.mask);
        let (at, now) = (stored >> (2 * c), word >> (2 * c));
        if n == 0 {
            None
        } else if now == at {
            Some(word - (n.min((word >> c) & mask) << c))
        } else if now == at + 1 {
            Some(word - n.min(word & mask))
        } else {
            None
        }
    }

    fn config_words(&self) -> Option<[u64; WORDS]> {
        let [magic, shift] = self.per_window.to_words();
        let small = u64::from(self.small);
        Some([
            self.limit,
            self.window,
            magic,
            shift,
            u64::from(self.bits),
            self.mask,
            self.max_index,
            small,
            0,
            0,
        ])
    }

    fn from_config_words(w: [u64; WORDS]) -> Option<SlidingWindow> {
        let [limit, window, magic, shift, bits, mask, max_index, small, _, _] = w;
        #[expect(clippy::cast_possible_truncation, reason = "at most 20, as stored")]
        let bits = bits as u32;
        let per_window = Divisor::from_words([magic, shift]);
        Some(SlidingWindow { limit, window, per_window, bits, mask, max_index, small: small != 0 })
    }

    /// Any new limit whose counts fit the width this limiter's word was laid out for (below
    /// the next power of two of the limit it was built with); the window's length stays.
    fn running_update(&self, new: SlidingWindow) -> Result<SlidingWindow, UpdateError> {
        if new.window != self.window {
            return Err(UpdateError::Incompatible {
                reason: "a sliding window's length cannot change at runtime: its state counts in windows",
            });
        }
        if new.limit > self.mask {
            return Err(UpdateError::Incompatible {
                reason: "a sliding window's limit cannot grow past the counts' width it was built with \
                         (the next power of two of its first limit, less one)",
            });
        }
        // `small` is the built policy's: bounded by the counts' width, as every policy of this
        // layout must be (counts stored under one limit are decided under another).
        Ok(SlidingWindow { limit: new.limit, ..*self })
    }
}

/// `floor(a·b / c)`, saturating at `u64::MAX`; a hardware division when `a·b` fits in 64 bits,
/// which it does for every window under 4.9 hours.
#[inline]
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    if a == 0 {
        return 0; // the common denial: no room left at all
    }
    match a.checked_mul(b) {
        Some(x) => x / c,
        None => u64::try_from(u128::from(a) * u128::from(b) / u128::from(c)).unwrap_or(u64::MAX),
    }
}

/// `ceil(a·b / w)` with `w`'s precomputed divisor when `a·b < 2^63`.
#[inline]
fn ceil_mul_div(a: u64, b: u64, w: u64, per_w: Divisor) -> u64 {
    match a.checked_mul(b) {
        Some(x) if x < 1 << 63 => {
            let q = per_w.div(x);
            q + u64::from(q * w != x)
        }
        _ => u64::try_from((u128::from(a) * u128::from(b)).div_ceil(u128::from(w))).unwrap_or(u64::MAX),
    }
}

/// A direct sliding-window-counter limiter.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Nanos, SlidingWindow, SlidingWindowLimiter};
///
/// // 10 per minute; 10 at 0:50 leave no room at 1:00, where a fixed window would reset.
/// let l = SlidingWindowLimiter::with_clock(SlidingWindow::new(10, Duration::from_secs(60))?, ManualClock::new());
/// let s = |secs: u64| Nanos::new(secs * 1_000_000_000);
/// assert!(l.check_n_at(s(50), 10).is_allowed());
/// assert!(!l.check_at(s(60)).is_allowed());
/// // At 1:06 a tenth of the previous window has slid out: one more fits.
/// assert!(l.check_at(s(66)).is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type SlidingWindowLimiter<C = DefaultClock> = Direct<SlidingWindow, C>;
