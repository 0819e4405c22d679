//! What a limiter answers: a small `Copy` decision. A denial is an outcome, not an error.

use core::fmt;
use core::hash::{Hash, Hasher};
use core::num::NonZeroU64;
use core::time::Duration;

use crate::engine::arith::Divisor;
use crate::Nanos;

/// Whether a request conforms.
///
/// Three outcomes admit the request ([`Decision::is_allowed`]): [`Allowed`](Outcome::Allowed)
/// and [`Untracked`](Outcome::Untracked) are served now, [`Delayed`](Outcome::Delayed) after
/// [`Decision::delay`]; [`Decision::is_allowed_now`] is true for the first two only. Non-exhaustive:
/// match the ones you act on and treat the rest by `is_allowed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted; its tokens were taken (or, for a peek, would be).
    Allowed,
    /// Not now: retrying after [`Decision::retry_after`] would be allowed, if nothing else takes
    /// the tokens first. Nothing was taken.
    Denied,
    /// Never: the cost exceeds the burst, so no amount of waiting helps. Nothing was taken.
    Insufficient,
    /// Admitted, to be served after [`Decision::delay`]: nginx's `DELAYED` (a leaky bucket
    /// that queues a burst instead of serving it at once). Token buckets never delay.
    Delayed,
    /// Denied because the key is new and a keyed limiter's table has no room for it (the
    /// [`WhenFull::Deny`](crate::WhenFull::Deny) policy). No wait can be computed.
    TableFull,
    /// Admitted without being counted: the key is new and the table has no room for it (the
    /// fail-open [`WhenFull::Allow`](crate::WhenFull::Allow) policy).
    Untracked,
}

/// The outcome of a decision, with what a caller needs for headers and back-off.
///
/// `Copy` and 32 bytes, built with no arithmetic beyond the bucket's own: a token bucket's
/// decision keeps the two waits in the bucket's exact fixed-point units and the quota's
/// reciprocal of a token, and the accessors derive the rest when asked (`remaining` with one
/// multiply, no division). Every field is exact and rounded toward denial: `remaining` down,
/// `retry_after` and `reset_after` up to the next nanosecond.
///
/// Two decisions are equal when every accessor answers the same, whatever form they hold.
///
/// `#[must_use]`: `check` takes tokens whether or not its answer is read, so dropping the
/// answer is almost always a bug.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// let limiter = tollgate::Limiter::new(tollgate::TokenBucket::per_second(1).unwrap());
/// limiter.check(); // error: unused `Decision` that must be used
/// ```
#[derive(Clone, Copy)]
#[must_use = "a decision says whether the request may proceed; `check` has already taken its tokens"]
// `repr(C)`: `meta` and `magic` first and in this order, as `DecisionHead` keeps them.
#[repr(C)]
pub struct Decision {
    /// The outcome, the quota's `m` (units per nanosecond, ≤ 64), and either the whole tokens
    /// left or, with `magic`, the burst and the divisor's shift, packed into one word
    /// (`META_*`), so that a token bucket's decision ORs the outcome into a word the quota
    /// keeps ready (a `DecisionHead`). Never zero (bit `META_SET`), so that `Option<Decision>`
    /// is as small as `Decision`.
    meta: NonZeroU64,
    /// The multiplier that divides by the quota's `t` (units per token; see `Divisor`), when
    /// `meta` holds the burst: then `remaining = burst − ⌈until_full / t⌉`. Zero when `meta`
    /// holds the remaining tokens themselves (every decision not made by a token bucket).
    magic: u64,
    /// Credit still missing (Denied) or the delay (Delayed), in units; zero otherwise.
    missing: u64,
    /// Units until the bucket is full.
    until_full: u64,
}

/// A token bucket decision's first two words (`Decision::meta` and `Decision::magic`), kept
/// ready by its quota (`TokenBucket::decision_head`) in a decision's order, so that an
/// admission copies both with one 16-byte load and store. The engine only reads it: what the
/// words hold is the quota's to say (`token_bucket.rs`, `decision_meta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct DecisionHead {
    meta: NonZeroU64,
    magic: u64,
}

impl DecisionHead {
    /// The head of a decision whose packed word, outcome bits aside, is `meta`. The outcome
    /// bits are cleared here, the one way to build a head: every head's are zero, which
    /// `Decision::new` tells the compiler.
    pub(crate) const fn new(meta: NonZeroU64, magic: u64) -> DecisionHead {
        let meta = match NonZeroU64::new(meta.get() & !META_OUTCOMES) {
            Some(meta) => meta,
            None => NonZeroU64::MIN, // never: bit META_SET is set, and is not an outcome bit
        };
        DecisionHead { meta, magic }
    }
}

/// `Decision::meta`: bits 0–31 the whole tokens left (or the burst), 32–39 the quota's `m`,
/// bit 48 always set, bits 49–54 the divisor's shift, 61–63 the outcome.
pub(crate) const META_M: u32 = 32;
pub(crate) const META_SET: u32 = 48;
pub(crate) const META_SHIFT: u32 = 49;
/// The outcome is the top three bits, so that a test of it is a test of the word's top bits:
/// `is_allowed` is its sign (refusals have bit 63 set), `is_allowed_now` its top two bits,
/// `outcome_code` one shift.
const META_OUTCOME: u32 = 61;
const META_OUTCOMES: u64 = 0b111 << META_OUTCOME;

/// An outcome's code in `Decision::meta`: 0–2 admissions (served now: 0 and 1), 4–6
/// refusals. Every variant by name: a new one cannot be added without a code here and in
/// `Decision::outcome`.
#[inline(always)]
pub(crate) const fn code(outcome: Outcome) -> u64 {
    match outcome {
        Outcome::Allowed => 0,
        Outcome::Untracked => 1,
        Outcome::Delayed => 2,
        Outcome::Denied => 4,
        Outcome::Insufficient => 5,
        Outcome::TableFull => 6,
    }
}

/// The codes' number of values: `outcome_code` is below it.
pub(crate) const OUTCOME_CODES: usize = 8;

impl Decision {
    /// A token bucket's decision, from its quota's `head` (`TokenBucket::decision_head`):
    /// `missing` more units of credit were needed (zero when allowed), and the bucket is full
    /// again after `until_full` units. The tokens left follow from `until_full`
    /// (`left = fill − until_full`, or none while in debt), when asked.
    #[inline(always)]
    pub(crate) fn new(head: DecisionHead, outcome: Outcome, missing: u64, until_full: u64) -> Decision {
        // SAFETY: a head's outcome bits are zero (`DecisionHead::new`, its only constructor,
        // clears them). Told to the compiler, the outcome of this decision is known where the
        // caller's is: an admission's `is_allowed` is a constant, and what it does not read
        // of the decision is never built.
        unsafe { core::hint::assert_unchecked(head.meta.get() & META_OUTCOMES == 0) };
        Decision { meta: head.meta | code(outcome) << META_OUTCOME, magic: head.magic, missing, until_full }
    }

    #[inline(always)]
    const fn packed(outcome: Outcome, m: u64, remaining: u32, missing: u64, until_full: u64) -> Decision {
        debug_assert!(m <= 64, "a quota's m is at most 64: its byte in `meta` needs no mask");
        let meta = remaining as u64 | m << META_M | code(outcome) << META_OUTCOME | 1 << META_SET;
        // Bit META_SET makes the word nonzero: the `None` arm is never taken (and compiled out).
        let meta = match NonZeroU64::new(meta) {
            Some(meta) => meta,
            None => NonZeroU64::MIN,
        };
        Decision { meta, magic: 0, missing, until_full }
    }

    /// A decision whose times are already whole nanoseconds.
    #[inline]
    pub(crate) const fn from_nanos(
        outcome: Outcome,
        remaining: u32,
        missing: Nanos,
        until_full: Nanos,
    ) -> Decision {
        Decision::packed(outcome, 1, remaining, missing.as_u64(), until_full.as_u64())
    }

    /// Two limits' admissions of one request as one: the stronger outcome (a delay over a plain
    /// admission, a counted admission over an untracked one), the longer delay, the fewer
    /// remaining, the later reset.
    pub(crate) fn merge(&self, other: &Decision) -> Decision {
        use Outcome::{Allowed, Delayed, Untracked};
        let outcome = match (self.outcome(), other.outcome()) {
            (Delayed, _) | (_, Delayed) => Delayed,
            (Untracked, Untracked) => Untracked,
            _ => Allowed,
        };
        let delay = |d: &Decision| if d.outcome() == Delayed { d.nanos_ceil(d.missing) } else { Nanos::ZERO };
        Decision::from_nanos(
            outcome,
            self.remaining_u32().min(other.remaining_u32()),
            delay(self).max(delay(other)),
            self.reset_after_nanos().max(other.reset_after_nanos()),
        )
    }

    /// This refusal with the wait `retry` (`None`: the request can never pass).
    pub(crate) fn with_retry(&self, retry: Option<Nanos>) -> Decision {
        let outcome = match (self.outcome(), retry) {
            (Outcome::Denied, None) => Outcome::Insufficient,
            (o, _) => o,
        };
        let missing = retry.filter(|_| outcome == Outcome::Denied).unwrap_or(Nanos::ZERO);
        Decision::from_nanos(outcome, self.remaining_u32(), missing, self.reset_after_nanos())
    }

    /// What the accessors answer, for equality and hashing.
    fn observed(&self) -> (Outcome, u32, Option<Nanos>, Nanos, Nanos) {
        let delay = Nanos::from_duration_saturating(self.delay());
        (self.outcome(), self.remaining_u32(), self.retry_after_nanos(), delay, self.reset_after_nanos())
    }

    /// The two waits in the quota's units, as stored: `(missing, until_full)`.
    #[inline]
    pub(crate) fn units(&self) -> (u64, u64) {
        (self.missing, self.until_full)
    }

    /// `units` in whole nanoseconds, rounded up. Most quotas keep one unit per nanosecond
    /// (`m = 1`): those skip the division, which costs more than the rest of a field read.
    #[inline]
    fn nanos_ceil(&self, units: u64) -> Nanos {
        match self.units_per_nano() {
            1 => Nanos::new(units),
            m => Nanos::new(units.div_ceil(u64::from(m))),
        }
    }

    #[inline]
    const fn units_per_nano(&self) -> u8 {
        #[expect(clippy::cast_possible_truncation, reason = "the byte at META_M")]
        let m = (self.meta.get() >> META_M) as u8;
        m
    }

    /// The whole tokens left: held in `meta`, or `burst − ⌈until_full / t⌉` (none once that
    /// is negative: a bucket in debt) for a token bucket's decision. The limiters' own stamps
    /// keep `until_full ≤ 2^63` (a stamp is at most one fill, ≤ 2^62 units, past its `now`,
    /// and `until_full` counts from one fill before it), within the divisor's range (below
    /// 2^63) for `until_full − 1`; a word from elsewhere (a stored state decided again, a
    /// clock that ran back) can be larger, and is caught by the guard below: more than a fill
    /// owed, so no tokens.
    #[inline]
    const fn remaining_u32(&self) -> u32 {
        #[expect(clippy::cast_possible_truncation, reason = "the low half of `meta`")]
        let low = self.meta.get() as u32;
        if self.magic == 0 || self.until_full == 0 {
            return low; // the remaining itself, or a full bucket (the burst)
        }
        let u = self.until_full - 1;
        if u >= 1 << 63 {
            return 0;
        }
        // ⌈until_full / t⌉ = ⌊(until_full − 1) / t⌋ + 1 for until_full ≥ 1.
        let shift = (self.meta.get() >> META_SHIFT) & 63;
        let owed = Divisor::from_words([self.magic, shift]).div(u) + 1;
        #[expect(clippy::cast_possible_truncation, reason = "below `low`, a u32")]
        let r = (low as u64).saturating_sub(owed) as u32;
        r
    }

    /// An admission served now, with `remaining` whole tokens left and the limit full again
    /// after `reset_after`: for tests, middleware and [`Policy`](crate::Policy) implementations.
    pub fn allowed(remaining: u32, reset_after: Duration) -> Decision {
        Decision::public(Outcome::Allowed, remaining, Duration::ZERO, reset_after)
    }

    /// A refusal that waiting `retry_after` would turn into an admission.
    pub fn denied(remaining: u32, retry_after: Duration, reset_after: Duration) -> Decision {
        Decision::public(Outcome::Denied, remaining, retry_after, reset_after)
    }

    /// A refusal that no wait helps: the cost exceeds what the limit can ever admit at once.
    pub fn insufficient(remaining: u32, reset_after: Duration) -> Decision {
        Decision::public(Outcome::Insufficient, remaining, Duration::ZERO, reset_after)
    }

    /// An admission to be served after `delay` (nginx's `DELAYED`).
    pub fn delayed(remaining: u32, delay: Duration, reset_after: Duration) -> Decision {
        Decision::public(Outcome::Delayed, remaining, delay, reset_after)
    }

    /// A new key refused because a keyed table had no room for it ([`WhenFull::Deny`](crate::WhenFull::Deny)).
    pub fn table_full() -> Decision {
        Decision::public(Outcome::TableFull, 0, Duration::ZERO, Duration::ZERO)
    }

    /// A new key admitted without being counted ([`WhenFull::Allow`](crate::WhenFull::Allow)).
    pub fn untracked() -> Decision {
        Decision::public(Outcome::Untracked, 0, Duration::ZERO, Duration::ZERO)
    }

    /// A decision from whole durations, saturating each at `u64::MAX` ns (584 years).
    fn public(outcome: Outcome, remaining: u32, wait: Duration, reset_after: Duration) -> Decision {
        let nanos = |d: Duration| Nanos::from_duration_saturating(d);
        Decision::from_nanos(outcome, remaining, nanos(wait), nanos(reset_after))
    }

    /// Whether the request was admitted: [`Allowed`](Outcome::Allowed),
    /// [`Delayed`](Outcome::Delayed) (admitted and charged, to be served after
    /// [`delay`](Decision::delay)) or [`Untracked`](Outcome::Untracked) (admitted by a full
    /// table's fail-open policy, not charged). A caller that serves at once, without honouring
    /// delays, wants [`is_allowed_now`](Decision::is_allowed_now).
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        // Codes 0–2 (`code`): the top bit clear.
        self.meta.get() >> 63 == 0
    }

    /// Whether the request may be served now: [`Allowed`](Outcome::Allowed) or
    /// [`Untracked`](Outcome::Untracked). False for [`Delayed`](Outcome::Delayed), which is
    /// admitted (and charged) but must wait [`delay`](Decision::delay) first, and for every
    /// refusal.
    #[inline]
    pub const fn is_allowed_now(&self) -> bool {
        // Codes 0 and 1 (`code`): the top two bits clear.
        self.meta.get() >> 62 == 0
    }

    /// How long to hold an admitted request before serving it: zero unless the outcome is
    /// [`Outcome::Delayed`].
    #[inline]
    pub fn delay(&self) -> Duration {
        match self.outcome() {
            Outcome::Delayed => self.nanos_ceil(self.missing).as_duration(),
            _ => Duration::ZERO,
        }
    }

    /// The outcome's code in `meta` (one per variant, below `OUTCOME_CODES`; see `code`): an
    /// index for per-outcome counters, read without decoding the outcome.
    #[inline]
    pub(crate) const fn outcome_code(&self) -> usize {
        (self.meta.get() >> META_OUTCOME) as usize
    }

    /// Allowed, denied for now, or never.
    #[inline]
    pub const fn outcome(&self) -> Outcome {
        // The code `new` or `packed` wrote: one of these six.
        match self.meta.get() >> META_OUTCOME {
            0 => Outcome::Allowed,
            1 => Outcome::Untracked,
            2 => Outcome::Delayed,
            4 => Outcome::Denied,
            5 => Outcome::Insufficient,
            _ => Outcome::TableFull,
        }
    }

    /// Whole tokens left in the bucket after this decision, rounded down.
    #[inline]
    pub const fn remaining(&self) -> u64 {
        self.remaining_u32() as u64
    }

    /// The exact wait until the same request would be allowed: zero if it was allowed, `None`
    /// if it never will be (its cost exceeds the burst) or if no wait can be computed (the
    /// table was full). Rounded up to the next nanosecond.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_nanos().map(Nanos::as_duration)
    }

    /// [`retry_after`](Decision::retry_after) in nanoseconds.
    #[inline]
    pub fn retry_after_nanos(&self) -> Option<Nanos> {
        match self.outcome() {
            Outcome::Insufficient | Outcome::TableFull => None,
            Outcome::Denied => Some(self.nanos_ceil(self.missing)),
            Outcome::Allowed | Outcome::Delayed | Outcome::Untracked => Some(Nanos::ZERO),
        }
    }

    /// How long this request waits before it is served, whatever the outcome: zero when it
    /// may be served now, the [`delay`](Decision::delay) when [`Delayed`](Outcome::Delayed),
    /// the [`retry_after`](Decision::retry_after) when refused, `None` when no wait helps.
    /// One field for callers that only sleep or answer with a wait (the C ABI's `_try`
    /// functions), decoded once. Rounded up to the next nanosecond.
    #[inline]
    pub fn wait(&self) -> Option<Duration> {
        self.wait_nanos().map(Nanos::as_duration)
    }

    /// [`wait`](Decision::wait) in nanoseconds.
    #[inline]
    pub fn wait_nanos(&self) -> Option<Nanos> {
        match self.outcome() {
            Outcome::Insufficient | Outcome::TableFull => None,
            Outcome::Denied | Outcome::Delayed => Some(self.nanos_ceil(self.missing)),
            Outcome::Allowed | Outcome::Untracked => Some(Nanos::ZERO),
        }
    }

    /// The time until the bucket is full again, if nothing else is taken. Rounded up.
    #[inline]
    pub fn reset_after(&self) -> Duration {
        self.reset_after_nanos().as_duration()
    }

    /// [`reset_after`](Decision::reset_after) in nanoseconds.
    #[inline]
    pub fn reset_after_nanos(&self) -> Nanos {
        self.nanos_ceil(self.until_full)
    }
}

/// Equal when every accessor answers the same: a token bucket's decision and one built from
/// the same whole fields compare equal.
impl PartialEq for Decision {
    fn eq(&self, other: &Decision) -> bool {
        self.observed() == other.observed()
    }
}

impl Eq for Decision {}

impl Hash for Decision {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.observed().hash(state);
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome())
            .field("remaining", &self.remaining_u32())
            .field("retry_after", &self.retry_after())
            .field("delay", &self.delay())
            .field("reset_after", &self.reset_after())
            .finish()
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::Decision;

    #[test]
    fn a_decision_is_32_bytes() {
        assert_eq!(core::mem::size_of::<Decision>(), 32);
        assert_eq!(core::mem::size_of::<Option<Decision>>(), 32);
    }

    #[test]
    fn the_packed_word_gives_back_every_field() {
        use super::Outcome::*;
        use crate::Nanos;
        for o in [Allowed, Denied, Insufficient, Delayed, TableFull, Untracked] {
            for r in [0, 1, u32::MAX] {
                let d = Decision::from_nanos(o, r, Nanos::new(7), Nanos::new(u64::MAX));
                assert_eq!((d.outcome(), d.remaining()), (o, u64::from(r)));
                assert_eq!(d.reset_after_nanos(), Nanos::new(u64::MAX));
                assert_eq!(d.retry_after_nanos().is_some(), !matches!(o, Insufficient | TableFull));
                let at_64 = Decision::packed(o, 64, r, 640, 6400);
                assert_eq!(
                    (at_64.outcome(), at_64.remaining(), at_64.units_per_nano()),
                    (o, u64::from(r), 64)
                );
                assert_eq!(at_64.reset_after_nanos(), Nanos::new(100));
                // The one wait: the delay, the retry-after, zero or never, as the fields say.
                for d in [d, at_64] {
                    let expected = match o {
                        Delayed => Some(Nanos::from_duration_saturating(d.delay())),
                        _ => d.retry_after_nanos(),
                    };
                    assert_eq!(d.wait_nanos(), expected, "{o:?}");
                    assert_eq!(d.wait(), expected.map(Nanos::as_duration));
                }
                let debug = format!("{d:?}");
                assert!(
                    debug.contains(&format!("outcome: {o:?}")) && debug.contains(&format!("remaining: {r}"))
                );
            }
        }
    }
}
