//! What a limiter answers: a small `Copy` decision. A denial is an outcome, not an error.

use core::time::Duration;

use crate::{Nanos, Quota};

/// Whether a request conforms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
/// `Copy` and 24 bytes. It is built without a hardware division: `remaining` comes from a
/// precomputed reciprocal, and the two waits stay in the bucket's exact fixed-point units until
/// an accessor converts them. Every field is exact and rounded toward denial: `remaining` down,
/// `retry_after` and `reset_after` up to the next nanosecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    outcome: Outcome,
    /// The quota's `m`: units per nanosecond (≤ 64).
    units_per_nano: u8,
    /// Whole tokens left after this decision (≤ burst ≤ u32::MAX).
    remaining: u32,
    /// Credit still missing (Denied) or the delay (Delayed), in units; zero otherwise.
    missing: u64,
    /// Units until the bucket is full.
    until_full: u64,
}

impl Decision {
    /// A decision: `left` units of credit remain, `missing` more were needed (zero when allowed),
    /// and the bucket is full again after `until_full` units.
    #[inline]
    pub(crate) fn new(q: &Quota, outcome: Outcome, left: u64, missing: u64, until_full: u64) -> Decision {
        #[expect(clippy::cast_possible_truncation, reason = "m ≤ 64")]
        let units_per_nano = q.units_per_nano() as u8;
        // `left ≤ fill = burst·t` for every state (the base is never below `now − fill`).
        #[expect(clippy::cast_possible_truncation, reason = "left / t ≤ burst ≤ u32::MAX")]
        let remaining = q.tokens_in(left) as u32;
        Decision { outcome, units_per_nano, remaining, missing, until_full }
    }

    /// A decision whose times are already whole nanoseconds.
    #[inline]
    pub(crate) const fn from_nanos(
        outcome: Outcome,
        remaining: u32,
        missing: Nanos,
        until_full: Nanos,
    ) -> Decision {
        Decision {
            outcome,
            units_per_nano: 1,
            remaining,
            missing: missing.as_u64(),
            until_full: until_full.as_u64(),
        }
    }

    /// Two limits' admissions of one request as one: the stronger outcome (a delay over a plain
    /// admission, a counted admission over an untracked one), the longer delay, the fewer
    /// remaining, the later reset.
    pub(crate) fn merge(&self, other: &Decision) -> Decision {
        use Outcome::{Allowed, Delayed, Untracked};
        let outcome = match (self.outcome, other.outcome) {
            (Delayed, _) | (_, Delayed) => Delayed,
            (Untracked, Untracked) => Untracked,
            _ => Allowed,
        };
        let delay = |d: &Decision| if d.outcome == Delayed { d.nanos_ceil(d.missing) } else { Nanos::ZERO };
        Decision::from_nanos(
            outcome,
            self.remaining.min(other.remaining),
            delay(self).max(delay(other)),
            self.reset_after_nanos().max(other.reset_after_nanos()),
        )
    }

    /// This refusal with the wait `retry` (`None`: the request can never pass).
    pub(crate) fn with_retry(&self, retry: Option<Nanos>) -> Decision {
        let outcome = match (self.outcome, retry) {
            (Outcome::Denied, None) => Outcome::Insufficient,
            (o, _) => o,
        };
        let missing = retry.filter(|_| outcome == Outcome::Denied).unwrap_or(Nanos::ZERO);
        Decision::from_nanos(outcome, self.remaining, missing, self.reset_after_nanos())
    }

    fn nanos_ceil(&self, units: u64) -> Nanos {
        Nanos::new(units.div_ceil(u64::from(self.units_per_nano)))
    }

    /// Whether the request was admitted.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed | Outcome::Delayed | Outcome::Untracked)
    }

    /// How long to hold an admitted request before serving it: zero unless the outcome is
    /// [`Outcome::Delayed`].
    #[inline]
    pub fn delay(&self) -> Duration {
        match self.outcome {
            Outcome::Delayed => self.nanos_ceil(self.missing).as_duration(),
            _ => Duration::ZERO,
        }
    }

    /// Allowed, denied for now, or never.
    #[inline]
    pub const fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whole tokens left in the bucket after this decision, rounded down.
    #[inline]
    pub const fn remaining(&self) -> u64 {
        self.remaining as u64
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
        match self.outcome {
            Outcome::Insufficient | Outcome::TableFull => None,
            Outcome::Denied => Some(self.nanos_ceil(self.missing)),
            Outcome::Allowed | Outcome::Delayed | Outcome::Untracked => Some(Nanos::ZERO),
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

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::Decision;

    #[test]
    fn a_decision_is_24_bytes() {
        assert_eq!(core::mem::size_of::<Decision>(), 24);
    }
}
