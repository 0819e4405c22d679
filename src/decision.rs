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
}

/// The outcome of a decision, with what a caller needs for headers and back-off.
///
/// 24 bytes and `Copy`. Every field is computed with exact integer arithmetic and rounded
/// toward denial: `remaining` down, `retry_after` and `reset_after` up to the next nanosecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    outcome: Outcome,
    /// Whole tokens left after this decision (≤ burst ≤ u32::MAX).
    remaining: u32,
    /// `Nanos::MAX` when the outcome is `Insufficient`.
    retry_after: Nanos,
    reset_after: Nanos,
}

impl Decision {
    /// A decision: `left` units of credit remain, `missing` more were needed (zero when allowed),
    /// and the bucket is full again after `until_full` units.
    #[inline]
    pub(crate) fn new(q: &Quota, outcome: Outcome, left: u64, missing: u64, until_full: u64) -> Decision {
        Decision {
            outcome,
            remaining: tokens(q, left),
            retry_after: match outcome {
                Outcome::Insufficient => Nanos::MAX,
                _ => q.nanos_ceil(missing),
            },
            reset_after: q.nanos_ceil(until_full),
        }
    }

    /// Whether the request was admitted.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
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
    /// if it never will be (its cost exceeds the burst). Rounded up to the next nanosecond.
    #[inline]
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Insufficient => None,
            _ => Some(self.retry_after.as_duration()),
        }
    }

    /// [`retry_after`](Decision::retry_after) in nanoseconds.
    #[inline]
    pub const fn retry_after_nanos(&self) -> Option<Nanos> {
        match self.outcome {
            Outcome::Insufficient => None,
            _ => Some(self.retry_after),
        }
    }

    /// The time until the bucket is full again, if nothing else is taken. Rounded up.
    #[inline]
    pub const fn reset_after(&self) -> Duration {
        self.reset_after.as_duration()
    }

    /// [`reset_after`](Decision::reset_after) in nanoseconds.
    #[inline]
    pub const fn reset_after_nanos(&self) -> Nanos {
        self.reset_after
    }
}

#[inline]
fn tokens(q: &Quota, units: u64) -> u32 {
    // `units ≤ fill = burst·t` for every state a limiter writes, so this is at most the burst;
    // the clamp keeps arbitrary words in range.
    let n = q.tokens_in(units.min(q.fill_units()));
    #[expect(clippy::cast_possible_truncation, reason = "n ≤ burst ≤ u32::MAX")]
    let n = n as u32;
    n
}
