//! The packed bucket state and the pure decision on it. No atomics here; see [`atomic`].
//!
//! # Layout
//!
//! The whole state of a token bucket is one 64-bit *stamp*: the instant, on the bucket's own
//! clock, at which the bucket was (or will be) empty.
//!
//! ```text
//!  63                                                              0
//! +-----------------------------------------------------------------+
//! |             stamp: the empty instant, in units of 1/m ns        |
//! +-----------------------------------------------------------------+
//!
//!            0        stamp             now − fill        now        now + fill      2^64−1
//!   units:   |----------|-------------------|--------------|----------------|-----------|
//!                       `----- credit = now − stamp, capped at fill -----'   `- debt -'
//!                              (tokens = floor(credit / t))                 (reserved)
//! ```
//!
//! * `m` (units per ns, 1..=64) and `t` (units per token) come from the [`TokenBucket`]; `fill = burst·t`.
//! * The bucket's clock is `now = fill + elapsed_ns·m`, counted from the limiter's creation, so
//!   `now − fill` never underflows. It saturates at the quota's lifetime, leaving `fill` units
//!   of headroom below `2^64`.
//! * **Credit** is `now − stamp`: the refill accrued since the bucket was empty. A stamp older than
//!   `now − fill` means a full bucket; it is read as `now − fill` (the cap), so an idle bucket of
//!   any age is simply full: there is no wraparound, because the clock does not wrap within the
//!   lifetime.
//! * **Taking** `n` tokens moves the stamp to `max(stamp, now − fill) + n·t` if that is at most
//!   `now`. The stamp only ever grows.
//! * **A stamp ahead of `now`** means no credit. A limiter writes stamps `≤ now` today; a reader
//!   whose clock runs behind the writer's (TSC skew) sees such a stamp and gets zero credit, no
//!   underflow and no reset. The range `(now, now + fill]` is reserved for a later reservation
//!   capability: a bucket in debt of up to one burst, whose empty instant lies in the future.
//!
//! # Invariants
//!
//! * Every stored stamp is `≤ max(now) ≤ 2^64 − 1 − fill` over all readers' clocks. A take of
//!   `cost ≤ fill` is tested as `stamp ≤ now − cost` (the same test as `max(stamp, now − fill)
//!   ≤ now − cost`, the floor being at most `now − cost`) before `+ cost` is computed, so no
//!   arithmetic can overflow for any `u64` word, stored or not.
//! * Credit left after any decision is at most `fill = burst·t`, so whole tokens fit in a `u32`.
//!
//! # Precision
//!
//! All arithmetic is exact integer arithmetic in units. A bucket is therefore exactly an ideal
//! token bucket with per-token time `t/m ns ≥ period/tokens`, sampled at whole nanoseconds:
//! starting full, it admits at most `burst + floor(span_ns·m/t)` tokens over any span.

pub(crate) mod atomic;

use crate::engine::decision::{Decision, Outcome};
use crate::policies::token_bucket::At;
use crate::TokenBucket;

/// The packed state of one bucket: its empty instant, in units (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BucketWord(u64);

/// What a decision needs done to the bucket.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Verdict {
    /// Admit, by moving the stamp to `next` with a CAS.
    Take { next: BucketWord },
    /// No write: the decision is final.
    Final(Decision),
}

impl BucketWord {
    #[inline]
    pub(crate) const fn from_raw(raw: u64) -> BucketWord {
        BucketWord(raw)
    }

    #[inline]
    pub(crate) const fn raw(self) -> u64 {
        self.0
    }

    /// A bucket holding `tokens` (≤ burst) at the bucket instant `at`.
    #[inline]
    pub(crate) const fn with_tokens(q: &TokenBucket, at: At, tokens: u64) -> BucketWord {
        BucketWord(at.now - q.cost_units(tokens))
    }

    /// The stamp as of `at`: raised to `floor = now − fill` when older, since a bucket holds at
    /// most one burst.
    #[inline]
    const fn base(self, at: At) -> u64 {
        if self.0 > at.floor {
            self.0
        } else {
            at.floor
        }
    }

    /// Decides a request of `n` tokens (`1 ≤ n ≤ burst`) at the bucket instant `at`.
    ///
    /// Admitted iff `base + cost ≤ now`, tested as `base ≤ now − cost` (`now − cost ≥ floor`
    /// since `cost ≤ fill`): no overflow for any word, and the subtraction runs beside the load
    /// instead of after it.
    ///
    /// `base ≤ limit` is `stamp ≤ limit` (the floor is at most `limit`), and the new stamp
    /// `max(stamp, floor) + cost` is computed as `max(stamp + cost, floor + cost)`: the stamp's
    /// side is ready when the word is, the clock's is one add from `now`, so an admission's CAS
    /// waits on one compare and move after the clock read instead of three steps.
    #[inline]
    pub(crate) fn decide(self, q: &TokenBucket, at: At, n: u64) -> Verdict {
        // The take's test below relies on it (every caller refuses larger `n` first).
        debug_assert!(n >= 1 && n <= q.burst(), "decide takes 1 ≤ n ≤ burst, got {n}");
        let cost = q.cost_units(n);
        let limit = at.now - cost;
        if self.0 <= limit {
            // `self.0 + cost ≤ now` and `floor + cost ≤ now`: no overflow.
            Verdict::Take { next: BucketWord((self.0 + cost).max(at.floor + cost)) }
        } else {
            // The stamp is above `limit`, so above the floor: it is the base.
            Verdict::Final(Decision::new(
                q.decision_head(),
                Outcome::Denied,
                self.0 - limit,
                self.0 - at.floor,
            ))
        }
    }

    /// Reserves `n` tokens (`1 ≤ n ≤ burst`) at the bucket instant `at`, now or in the future.
    /// `Ok((next, wait))`: the stamp to store, which is also the instant the tokens are due,
    /// and how many whole nanoseconds after `now` that is. `Err(wait)`: the wait, in whole
    /// nanoseconds (rounded up), the reservation would have needed (more than `max_wait`).
    ///
    /// When the bucket has the tokens, this is [`decide`](BucketWord::decide)'s take. Otherwise
    /// the stamp moves past `now`, into debt: to the first whole nanosecond at or after
    /// `base + cost` (on the limiter's clock, whose instants are `now` plus multiples of `m`),
    /// if that is at most `max_wait` units after `now`. `max_wait` is at most one fill, so
    /// stamps stay at or below `now + fill` (the headroom the clock leaves below 2^64).
    /// Rounding the due instant up, *in the stamp*, is what keeps a reservation's user within
    /// the bucket: the tokens are used at a whole nanosecond, and the next reservation queues
    /// from that nanosecond, not from the fraction before it (two reservations' due times
    /// rounded up independently could otherwise lie closer than their tokens' worth).
    #[inline]
    pub(crate) fn reserve(
        self,
        q: &TokenBucket,
        at: At,
        n: u64,
        max_wait: u64,
    ) -> Result<(BucketWord, u64), u64> {
        let cost = q.cost_units(n);
        let base = self.base(at);
        if base <= at.now - cost {
            return Ok((BucketWord(base + cost), 0));
        }
        let m = q.units_per_nano();
        // `base + cost > now` here. At the end of the lifetime `base + cost` can pass 2^64
        // (`base` up to one fill past `now`): then in `u128`, as the wait is reported.
        let wait_ns = match base.checked_add(cost) {
            // A division only when the unit is not the nanosecond (most rates' is): it sits
            // on the path of every refusal of a reservation.
            Some(due) if m == 1 => due - at.now,
            Some(due) => (due - at.now).div_ceil(m),
            None => wide_wait(base, cost, at.now, m),
        };
        match wait_ns.checked_mul(m) {
            Some(wait) if wait <= max_wait => Ok((BucketWord(at.now + wait), wait_ns)),
            _ => Err(wait_ns),
        }
    }

    /// A queued bucket's decision ([`Queued`](crate::Queued)): take `n` tokens (`1 ≤ n ≤
    /// burst`) now, or for later if they are due at most `queue` units from now
    /// ([`reserve`](BucketWord::reserve)'s stamp); otherwise refuse, with the wait until the
    /// line has room for them: the wait they need less the line, rounded up (never early).
    #[inline]
    pub(crate) fn queue(self, q: &TokenBucket, at: At, n: u64, queue: u64) -> Verdict {
        match self.reserve(q, at, n, queue) {
            Ok((next, _)) => Verdict::Take { next },
            Err(wait_ns) => {
                let base = self.base(at);
                let missing = wait_ns.saturating_mul(q.units_per_nano()).saturating_sub(queue).max(1);
                Verdict::Final(Decision::new(q.decision_head(), Outcome::Denied, missing, base - at.floor))
            }
        }
    }

    /// The decision once a queued take stored `self` at `at`: allowed, or delayed until the
    /// stamp (the whole nanoseconds `reserve` rounded it to).
    #[inline]
    pub(crate) fn queued(self, q: &TokenBucket, at: At) -> Decision {
        if self.0 <= at.now {
            return self.taken(q, at);
        }
        Decision::new(q.decision_head(), Outcome::Delayed, self.0 - at.now, self.0 - at.floor)
    }

    /// The decision once the stamp moved to `self` at `at`.
    #[inline]
    pub(crate) fn taken(self, q: &TokenBucket, at: At) -> Decision {
        Decision::new(q.decision_head(), Outcome::Allowed, 0, self.0 - at.floor)
    }

    /// What deciding `n` tokens (any `n`) would answer, without taking anything. The remaining
    /// count is the current level. `n = 0` is always allowed; `n > burst` is insufficient.
    #[inline]
    pub(crate) fn peek(self, q: &TokenBucket, at: At, n: u64) -> Decision {
        let base = self.base(at);
        let until_full = base - at.floor;
        if n > q.burst() {
            return Decision::new(q.decision_head(), Outcome::Insufficient, 0, until_full);
        }
        let limit = at.now - q.cost_units(n);
        if n == 0 || base <= limit {
            Decision::new(q.decision_head(), Outcome::Allowed, 0, until_full)
        } else {
            Decision::new(q.decision_head(), Outcome::Denied, base - limit, until_full)
        }
    }
}

/// `ceil((base + cost − now) / m)` when `base + cost` passes 2^64.
#[cold]
fn wide_wait(base: u64, cost: u64, now: u64, m: u64) -> u64 {
    let wait = (u128::from(base) + u128::from(cost) - u128::from(now)).div_ceil(u128::from(m));
    u64::try_from(wait).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::{Nanos, Rate};

    fn quotas() -> impl Strategy<Value = TokenBucket> {
        (1u64..=1 << 40, 1u64..=1 << 50, 1u64..=TokenBucket::MAX_BURST).prop_filter_map(
            "outside the supported ranges",
            |(tokens, period, burst)| {
                TokenBucket::new(Rate::per(tokens, Duration::from_nanos(period)), burst).ok()
            },
        )
    }

    proptest! {
        /// Every `u64` decodes, at every bucket instant, for every cost, without panicking, and
        /// the fields it yields stay within their ranges.
        #[test]
        fn every_word_decodes(q in quotas(), raw in any::<u64>(), elapsed in any::<u64>(), n in any::<u64>()) {
            let now = q.now_units(Nanos::new(elapsed));
            let word = BucketWord::from_raw(raw);
            let peeked = word.peek(&q, now, n);
            prop_assert!(peeked.remaining() <= q.burst());
            if raw <= now.now {
                prop_assert!(peeked.reset_after_nanos() <= q.fill_time());
            }
            let n = n % (q.burst() + 1);
            if n > 0 {
                match word.decide(&q, now, n) {
                    Verdict::Take { next } => {
                        prop_assert!(next.raw() <= now.now && next.raw() > raw);
                        let d = next.taken(&q, now);
                        prop_assert!(d.is_allowed() && d.remaining() <= q.burst() - n);
                    }
                    Verdict::Final(d) => {
                        prop_assert_eq!(d.outcome(), Outcome::Denied);
                        prop_assert!(d.retry_after().unwrap() > Duration::ZERO);
                    }
                }
            }
        }

        /// `remaining`, derived on demand from `until_full` and the quota's reciprocal, is the
        /// exact credit in whole tokens, `⌊(now − max(stamp, floor)) / t⌋` (none in debt), for
        /// every stamp from far below the floor to a fill of debt, and every decision kind.
        #[test]
        fn remaining_is_the_exact_credit(
            q in quotas(),
            elapsed in any::<u64>(),
            offset in any::<u64>(),
            n in any::<u64>(),
        ) {
            let now = q.now_units(Nanos::new(elapsed));
            // A stamp anywhere in [floor − fill, now + fill], both ends included often.
            let span = 3 * u128::from(q.fill_units()) + 1;
            let raw = u64::try_from(u128::from(now.floor - q.fill_units().min(now.floor)) + u128::from(offset) % span)
                .unwrap();
            let exact = |stamp: u64| now.now.saturating_sub(stamp.max(now.floor)) / q.units_per_token();
            let word = BucketWord::from_raw(raw);
            prop_assert_eq!(word.peek(&q, now, n).remaining(), exact(raw));
            let n = n % q.burst() + 1;
            match word.decide(&q, now, n) {
                Verdict::Take { next } => prop_assert_eq!(next.taken(&q, now).remaining(), exact(next.raw())),
                Verdict::Final(d) => prop_assert_eq!(d.remaining(), exact(raw)),
            }
            if let Ok((next, _)) = word.reserve(&q, now, n, q.fill_units()) {
                prop_assert_eq!(next.queued(&q, now).remaining(), exact(next.raw()));
            }
        }

        /// Encoding a level and decoding it round-trips, at any instant.
        #[test]
        fn levels_round_trip(q in quotas(), elapsed in any::<u64>(), level in any::<u64>()) {
            let level = level % (q.burst() + 1);
            let now = q.now_units(Nanos::new(elapsed));
            let word = BucketWord::with_tokens(&q, now, level);
            prop_assert_eq!(word.peek(&q, now, 0).remaining(), level);
        }
    }

    #[test]
    fn full_and_empty_boundaries() {
        let q = TokenBucket::per_second(10).unwrap(); // t = 1e8 units (m = 1), fill = 1e9
        let now = q.now_units(Nanos::new(5_000_000_000));
        // Any stamp at or below now − fill reads as exactly full.
        for raw in [0, now.floor - 1, now.floor] {
            assert_eq!(BucketWord(raw).peek(&q, now, 0).remaining(), 10);
        }
        // One unit short of a token is zero tokens, with a 1 ns wait.
        let d = BucketWord(now.now - q.units_per_token() + 1).peek(&q, now, 1);
        assert_eq!((d.outcome(), d.remaining()), (Outcome::Denied, 0));
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
        // A stamp ahead of now (skew) is zero credit, not a wrap to full.
        let d = BucketWord(now.now + 5).peek(&q, now, 1);
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(100_000_005)));
        // The last instant of the lifetime, and beyond it: time saturates.
        let end = q.now_units(q.lifetime());
        assert_eq!(q.now_units(Nanos::MAX), end);
        assert_eq!(end.now, u64::MAX - q.cost_units(q.burst()));
    }
}
