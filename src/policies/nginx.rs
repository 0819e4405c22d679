//! nginx's `limit_req`, exactly: a leaky bucket counted in milli-requests on a millisecond clock,
//! with `burst`, `nodelay` and `delay=N`.
//!
//! Per request, at `now` in whole milliseconds (nginx's `ngx_http_limit_req_module.c`):
//!
//! ```text
//! ms = now − last;   ms < −60000 → 1;   ms < 0 → 0
//! excess = max(0, stored − rate·ms/1000 + 1000)          (integer division, as nginx)
//! excess > burst  → REJECTED, nothing stored
//! otherwise store excess (and last = now unless ms = 0);
//!   excess ≤ delay → PASSED, else DELAYED by (excess − delay)·1000/rate ms
//! ```
//!
//! A key's first request always passes and stores an excess of 0. `rate` is `N·1000/scale` in
//! milli-requests per second (scale 60 for `r/m`), `burst = B·1000`, `delay = D·1000`, and
//! `nodelay` makes the delay unbounded.
//!
//! # Layout
//!
//! ```text
//!  63                                     24 23                       0
//! +-----------------------------------------+--------------------------+
//! | last: ms since the limiter's origin     | excess + 1000, milli-req |
//! +-----------------------------------------+--------------------------+
//! ```
//!
//! The excess is stored plus 1,000, so that a field of 0 is an excess of −1,000: a node whose
//! next arrival leaks to nothing (`max(0, −1000 − leaked + 1000) = 0`), which is exactly nginx's
//! new node, at `last` and every later instant. The word 0 (no state) is then a new node with no
//! special case, and so is a keyed slot's *start word*. In these terms one arrival is
//! `f' = max(0, f − leaked) + 1000` and refuses when `f' > burst + 1000`. 40 bits of
//! milliseconds last 34.8 years from the limiter's creation; the clock saturates there (no more
//! leaking: only denials). 24 bits hold a burst of up to 16,776 requests (with the 1,000, and
//! one more for the keyed table's eviction mark). The word is updated by
//! [`Direct`]'s relaxed CAS loop (see `policy.rs`): it publishes nothing
//! else, and a decision takes effect at its CAS (a rejection at its load). Checked by
//! `loom-tests/tests/nginx.rs`.

use crate::engine::arith::Divisor;
use crate::engine::config::WORDS;
use crate::engine::direct::Direct;
use crate::policies::policy::Policy;
use crate::{ConfigError, Decision, DefaultClock, Nanos, Outcome, UpdateError};

const EXCESS_BITS: u32 = 24;
const EXCESS_MASK: u64 = (1 << EXCESS_BITS) - 1;
const LAST_BITS: u32 = 64 - EXCESS_BITS;
/// The largest `last` in ms since the origin.
const MAX_MS: u64 = (1 << LAST_BITS) - 2;
/// What the excess field holds above the excess: a field of 0 is a new node (module docs).
const BIAS: u64 = 1000;
/// The largest burst: `burst·1000 + 1000`, and one more for a keyed eviction mark, must fit the
/// excess field.
const MAX_BURST: u64 = (EXCESS_MASK - BIAS - 1) / 1000;
const _: () = assert!(MAX_BURST == 16_776);
const _: () = assert!(EXCESS_BITS + LAST_BITS == 64);

/// A `limit_req` configuration: `rate=N r/s` or `r/m`, `burst=B`, and `nodelay` or `delay=D`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nginx {
    /// Milli-requests per second, `N·1000/scale` truncated as nginx does (below 2^54).
    rate: u64,
    /// Divides by `rate` without a hardware division.
    per_rate: Divisor,
    /// `B·1000`.
    burst: u64,
    /// `D·1000`; `u64::MAX` for `nodelay`.
    delay: u64,
}

impl Nginx {
    /// `rate=N r/s`, with no burst.
    pub fn per_second(n: u64) -> Result<Nginx, ConfigError> {
        Nginx::with_scale(n, 1)
    }

    /// `rate=N r/m`, with no burst.
    pub fn per_minute(n: u64) -> Result<Nginx, ConfigError> {
        Nginx::with_scale(n, 60)
    }

    fn with_scale(n: u64, scale: u64) -> Result<Nginx, ConfigError> {
        // Below 2^54 milli-requests per second, so that every quotient below stays in range.
        const MAX_N: u64 = (1 << 54) / 1000;
        if n > MAX_N {
            return Err(ConfigError::NginxRateTooHigh { rate: n, max: MAX_N });
        }
        let rate = n * 1000 / scale;
        if rate == 0 {
            return Err(ConfigError::ZeroRate);
        }
        Ok(Nginx { rate, per_rate: Divisor::new(rate), burst: 0, delay: 0 })
    }

    /// `burst=B`: up to `B` requests above the rate are queued (delayed) rather than rejected.
    pub fn burst(self, b: u64) -> Result<Nginx, ConfigError> {
        if b > MAX_BURST {
            return Err(ConfigError::NginxBurstTooLarge { burst: b, max: MAX_BURST });
        }
        Ok(Nginx { burst: b * 1000, ..self })
    }

    /// The `burst=` value: requests above the rate that are queued (or, with `nodelay`,
    /// passed) rather than rejected.
    pub const fn burst_size(&self) -> u64 {
        self.burst / 1000
    }

    /// The rate in thousandths of a request per second, as nginx keeps it (`rate=30r/m` is 500).
    pub const fn millirequests_per_second(&self) -> u64 {
        self.rate
    }

    /// `nodelay`: the whole burst passes at once; only the excess beyond it is rejected.
    pub fn nodelay(self) -> Nginx {
        Nginx { delay: u64::MAX, ..self }
    }

    /// `delay=D`: the first `D` requests of a burst pass at once, the rest are delayed.
    pub fn delay(self, d: u64) -> Nginx {
        Nginx { delay: d.saturating_mul(1000), ..self }
    }

    /// Decides `n` requests at once at `now` (ms since the origin) on `word`. Returns the word
    /// to store, if any, and the decision.
    ///
    /// nginx counts one request at a time; `n` generalizes it as `n` arrivals in the same
    /// millisecond, all or none: exactly what `n` single requests in a row would do (the
    /// first leaks and clamps at zero, then each adds 1000), and a new node's first request is
    /// free. (One clamp over the sum, `max(0, stored + n·1000 − leaked)`, would let a long-idle
    /// node absorb part of a batch into its leak: more than `n` single arrivals get.) `n = 0`
    /// reports the state and stores nothing; more than `burst + 1` at once can never pass
    /// ([`Outcome::Insufficient`]).
    #[inline(always)]
    fn decide_ms(&self, word: u64, now: u64, n: u64) -> (Option<u64>, Decision) {
        let (last, field) = (word >> EXCESS_BITS, word & EXCESS_MASK);
        // Both below 2^40, so the difference fits an i64.
        let elapsed = now as i64 - last as i64;
        let ms = if elapsed < -60_000 { 1 } else { elapsed.max(0) as u64 };
        // Saturating: a product beyond u64 leaks far more than any field (below 2^24), so the
        // clamp at zero gives nginx's exact answer.
        let leaked = self.rate.saturating_mul(ms) / 1000;
        // nginx's `max(0, excess − leaked + 1000)`, in the biased field.
        let left = field.saturating_sub(leaked);
        if n.wrapping_sub(1) >= self.max_n() {
            // `n = 0` reports; more than `burst + 1` is never admitted. Both store nothing.
            let excess = left.saturating_sub(BIAS);
            if n == 0 {
                return (None, self.passed(excess));
            }
            let d = Decision::from_nanos(Outcome::Insufficient, 0, Nanos::ZERO, self.drain_time(excess));
            return (None, d);
        }
        let add = n * 1000;
        let next = left + add;
        if next > self.burst + BIAS {
            // Accepted once `rate·ms'/1000 ≥ f + add − burst − 1000` with `ms' = now + w − last`
            // (positive: `n ≤ burst/1000 + 1` alone passes on an empty node).
            let need = field + add - self.burst - BIAS;
            let ms_needed = self.ceil_per_rate(need * 1000) as i64; // below 2^35
            let wait = (ms_needed - elapsed).max(0) as u64;
            let d = Decision::from_nanos(
                Outcome::Denied,
                0,
                ms_to_nanos(wait),
                self.drain_time(field.saturating_sub(BIAS)),
            );
            return (None, d);
        }
        let last = if ms != 0 { now } else { last };
        (Some(pack(last, next)), self.passed(next - BIAS))
    }

    /// The most requests one decision can admit: the burst and the one that leaks.
    #[inline]
    fn max_n(&self) -> u64 {
        self.burst / 1000 + 1
    }

    /// `ceil(x / rate)` for `x < 2^62`.
    #[inline]
    fn ceil_per_rate(&self, x: u64) -> u64 {
        self.per_rate.div(x + self.rate - 1)
    }

    #[inline]
    fn passed(&self, excess: u64) -> Decision {
        #[expect(clippy::cast_possible_truncation, reason = "at most MAX_BURST requests")]
        let remaining = (self.burst.saturating_sub(excess) / 1000) as u32;
        if excess <= self.delay {
            Decision::from_nanos(Outcome::Allowed, remaining, Nanos::ZERO, self.drain_time(excess))
        } else {
            let delay = ms_to_nanos(self.per_rate.div((excess - self.delay) * 1000));
            Decision::from_nanos(Outcome::Delayed, remaining, delay, self.drain_time(excess))
        }
    }

    /// The time for `excess` (at most 2^24, a stored excess) to leak away entirely. With the rate
    /// below 2^54, `excess·1000 + rate` stays below 2^62: the reciprocal, not a division.
    #[inline]
    fn drain_time(&self, excess: u64) -> Nanos {
        debug_assert!(excess <= EXCESS_MASK);
        ms_to_nanos(self.ceil_per_rate(excess * 1000))
    }
}

#[inline]
fn ms_to_nanos(ms: u64) -> Nanos {
    Nanos::new(ms.saturating_mul(1_000_000))
}

/// The word of `last` with the biased excess `field`.
#[inline]
fn pack(last: u64, field: u64) -> u64 {
    (last << EXCESS_BITS) | field
}

/// A keyed table's millisecond clock starts here, so that every word it stores is well above
/// 0 (and its evictable line is a word from the first millisecond).
const KEYED_START_MS: u64 = 1 << 16;
/// The largest `last` in a keyed table, whose words keep two bits free (with room for a start
/// word one millisecond later).
const KEYED_MAX_MS: u64 = (1 << (LAST_BITS - 2)) - 3;

/// Keyed words: see `keyed/policy.rs`.
impl crate::keyed::sealed::KeyedWords for Nginx {
    const NAME: &'static str = "nginx limit_req";

    /// The same rate (a fresh key's word and how fast excess leaks), and a burst up to the one
    /// built with (the table's eviction line waits for that burst to leak); any delay.
    fn keyed_update(&self, new: Nginx) -> Result<Nginx, UpdateError> {
        if new.rate != self.rate {
            return Err(UpdateError::Incompatible {
                reason: "a keyed nginx table's rate cannot change at runtime: it fixes when a key's \
                         state is a fresh key's",
            });
        }
        if new.burst > self.burst {
            return Err(UpdateError::Incompatible {
                reason: "a keyed nginx table's burst cannot grow past the one it was built with: \
                         keys are reclaimed once that burst has leaked",
            });
        }
        Ok(new)
    }

    fn keyed_lifetime(&self) -> Nanos {
        Nanos::new((KEYED_MAX_MS - KEYED_START_MS) * 1_000_000 + 999_999)
    }

    #[inline]
    fn most_at_once(&self) -> u64 {
        self.max_n()
    }

    /// A new node, now: its field is 0, and every later arrival on it is a new node's.
    #[inline]
    fn fresh(&self, elapsed: Nanos) -> u64 {
        pack(keyed_ms(elapsed), 0)
    }

    /// Nodes last seen `⌈(burst + 1000)·1000 / rate⌉` ms ago or earlier: they have leaked their
    /// whole field (at most the burst + 1000), so their next arrival is a new node's, now and
    /// later. Below the fresh word.
    #[inline]
    fn evictable(&self, elapsed: Nanos) -> u64 {
        let now = keyed_ms(elapsed);
        let drained = self.ceil_per_rate((self.burst + BIAS) * 1000);
        // `last ≤ now − drained` ⇔ word < pack(now − drained + 1, 0); `drained ≥ 1`.
        (now + 1).checked_sub(drained).map_or(0, |last| pack(last, 0))
    }

    /// The mark itself if it is a new node (field 0: a claimant's fresh word), else a new node
    /// a millisecond after the mark's `last` (an evicted word + 1, whose field is at most the
    /// burst + 1001, below every word of the next millisecond). Every thread decides a start
    /// word as a new node's first request, at its own clock or at the word's `last` if that
    /// is later, so whichever thread decides first on it (the inserter, or another thread on
    /// the same key after a helper made the slot live) finds what a new key should.
    fn above(&self, mark: u64) -> u64 {
        if mark & EXCESS_MASK == 0 {
            mark
        } else {
            pack((mark >> EXCESS_BITS) + 1, 0)
        }
    }

    /// nginx's step with the clock held at or after the word's `last`: a stored word then
    /// always grows (a later `last`, or the same `last` with 1,000·n more excess).
    #[inline(always)]
    fn decide_keyed(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision) {
        self.decide_ms(word, keyed_ms(elapsed).max(word >> EXCESS_BITS), n)
    }
}

/// Keyed milliseconds: whole ms since the limiter's creation, from [`KEYED_START_MS`].
#[inline]
fn keyed_ms(elapsed: Nanos) -> u64 {
    (elapsed.as_u64() / 1_000_000 + KEYED_START_MS).min(KEYED_MAX_MS)
}

impl Policy for Nginx {
    /// nginx's clock has millisecond resolution: `elapsed` is truncated to whole milliseconds
    /// (and saturates after 2^40 − 2 ms, 34.8 years).
    #[inline(always)]
    fn decide(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision) {
        self.decide_ms(word, (elapsed.as_u64() / 1_000_000).min(MAX_MS), n)
    }

    /// Exact or nothing: if the word is still the one the decision stored, the prior word
    /// comes back; otherwise nothing does (the units stay spent, which errs toward refusal).
    /// nginx's excess is clamped at zero after each arrival and leaks in rounded steps, so
    /// once another decision has moved the word, how much of this one is left in it cannot be
    /// bounded from the word alone. (A decision dated more than 60 s before `last` moves `last`
    /// back, nginx's rule; only such a clock can bring a word back to a value it had.)
    #[inline]
    fn refund(&self, word: u64, prior: u64, stored: u64, _elapsed: Nanos, _n: u64) -> Option<u64> {
        (word == stored).then_some(prior)
    }

    fn config_words(&self) -> Option<[u64; WORDS]> {
        let [magic, shift] = self.per_rate.to_words();
        Some([self.rate, magic, shift, self.burst, self.delay, 0, 0, 0, 0, 0])
    }

    fn from_config_words(w: [u64; WORDS]) -> Option<Nginx> {
        let [rate, magic, shift, burst, delay, ..] = w;
        Some(Nginx { rate, per_rate: Divisor::from_words([magic, shift]), burst, delay })
    }

    /// Any new `rate`, `burst` and `delay`: the excess and the last request's time mean the
    /// same under each, as when nginx reloads a zone.
    fn running_update(&self, new: Nginx) -> Result<Nginx, UpdateError> {
        Ok(new)
    }
}

/// One `limit_req` zone entry: a direct limiter with nginx's semantics.
///
/// ```
/// use tollgate::{NginxLimiter, Nginx, ManualClock, Nanos, Outcome};
///
/// // rate=1r/s burst=5: the first passes, the next five are delayed 1..5 s, the seventh rejected.
/// let l = NginxLimiter::with_clock(Nginx::per_second(1)?.burst(5)?, ManualClock::new());
/// let outcomes: Vec<_> = (0..7).map(|_| l.check_at(Nanos::ZERO)).collect();
/// assert_eq!(outcomes[0].outcome(), Outcome::Allowed);
/// assert_eq!(outcomes[3].delay().as_secs(), 3);
/// assert_eq!(outcomes[6].outcome(), Outcome::Denied);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type NginxLimiter<C = DefaultClock> = Direct<Nginx, C>;
