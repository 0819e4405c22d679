//! Policies: rate-limiting algorithms whose whole per-key state is one `u64`, decided purely and
//! committed by one CAS loop, shared by every limiter built on them.
//!
//! The token bucket ([`Limiter`](crate::Limiter)) keeps a loop of its own, tuned to the
//! nanosecond; every other single-word algorithm implements [`Policy`] and runs on [`Direct`].

use core::fmt;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::{Clock, Decision, DefaultClock, Nanos};

/// A rate-limiting algorithm over a one-word state.
///
/// `decide` is a pure function of `(word, elapsed, n)`: it reads no clock and touches no
/// atomic, so it can be tested, modelled and fuzzed on its own. A word of 0 is a state nobody
/// has touched yet (a fresh key).
pub trait Policy {
    /// Decides `n` units of cost at `elapsed` since the limiter's origin. Returns the word to
    /// store (`None`: store nothing, the decision is final as read) and the decision.
    fn decide(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision);

    /// Gives back what a decision took: it stored `stored` over `prior` for `n` units, and the
    /// state is now `word` at `elapsed` (another decision's clock reading is never later than
    /// `elapsed` for the word it stored). Returns the word to store, or `None` to leave it.
    ///
    /// The result must never admit more than the state would had that decision not happened
    /// (see [`check_all`](crate::check_all)). The default gives nothing back, which is always
    /// safe: the units stay spent.
    #[inline]
    fn refund(&self, word: u64, prior: u64, stored: u64, elapsed: Nanos, n: u64) -> Option<u64> {
        let _ = (word, prior, stored, elapsed, n);
        None
    }
}

/// A single-state limiter running any [`Policy`]: one clock read, one load, and one CAS when
/// the policy changes the state.
///
/// A decision that stores a word takes effect at its successful CAS; one that stores nothing,
/// at the load it decided on.
pub struct Direct<P, C: Clock = DefaultClock> {
    word: CachePadded<AtomicU64>,
    policy: P,
    origin: Nanos,
    clock: C,
    id: u64,
}

impl<P: Policy> Direct<P, DefaultClock> {
    /// A limiter on the default clock, with a fresh state.
    pub fn new(policy: P) -> Direct<P, DefaultClock> {
        Direct::with_clock(policy, DefaultClock::new())
    }
}

impl<P: Policy, C: Clock> Direct<P, C> {
    /// A limiter on `clock`, with a fresh state, counting time from the clock's current reading.
    pub fn with_clock(policy: P, clock: C) -> Direct<P, C> {
        let origin = clock.now();
        Direct {
            word: CachePadded::new(AtomicU64::new(0)),
            policy,
            origin,
            clock,
            id: crate::sync::next_id(),
        }
    }

    /// One unit now.
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n_at(self.clock.now(), 1)
    }

    /// `n` units now, all or none.
    #[inline]
    pub fn check_n(&self, n: u64) -> Decision {
        self.check_n_at(self.clock.now(), n)
    }

    /// One unit at `now` on this limiter's clock.
    #[inline]
    pub fn check_at(&self, now: Nanos) -> Decision {
        self.check_n_at(now, 1)
    }

    /// `n` units at `now` on this limiter's clock. A `now` before the limiter's creation counts
    /// as its creation.
    // Always inline: out of line, its 24-byte decision is returned through memory, and a
    // caller that copies it (16 bytes at a time) reads it back across two of the callee's
    // 8-byte stores: a failed store forward, a dozen cycles, on every decision.
    #[inline(always)]
    pub fn check_n_at(&self, now: Nanos, n: u64) -> Decision {
        let elapsed = now.saturating_sub(self.origin);
        // Relaxed (load, success, failure): the word is self-contained, as the token bucket's in
        // `bucket/atomic.rs`; a failed CAS hands back the value the next decision is made on.
        // Checked by loom-tests/tests/nginx.rs.
        let cur = self.word.load(Relaxed);
        let (next, decision) = self.policy.decide(cur, elapsed, n);
        let Some(next) = next else { return decision };
        match self.word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
            Ok(_) => decision,
            Err(seen) => self.retry(seen, elapsed, n),
        }
    }

    /// The CAS loop after a first attempt failed: out of line, so that the first attempt is
    /// straight-line code with nothing hoisted for a loop.
    #[cold]
    #[inline(never)]
    fn retry(&self, mut cur: u64, elapsed: Nanos, n: u64) -> Decision {
        loop {
            let (next, decision) = self.policy.decide(cur, elapsed, n);
            let Some(next) = next else { return decision };
            // Relaxed: as in `check_n_at`.
            match self.word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return decision,
                Err(seen) => cur = seen,
            }
        }
    }

    /// `n` units now, and the receipt [`refund`](Direct::refund_receipt) needs when they were
    /// taken (the word stored and the one it replaced).
    #[inline]
    pub(crate) fn charge(&self, n: u64) -> (Decision, Option<(u64, u64)>) {
        let elapsed = self.clock.now().saturating_sub(self.origin);
        // Relaxed (load, success, failure): as in `check_n_at`.
        let mut cur = self.word.load(Relaxed);
        loop {
            let (next, decision) = self.policy.decide(cur, elapsed, n);
            let Some(next) = next else { return (decision, None) };
            if !decision.is_allowed() {
                // A policy that stores on a denial (none does today) is charged nothing.
                return (decision, None);
            }
            match self.word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return (decision, Some((cur, next))),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back what a [`charge`](Direct::charge) of `n` took, through the policy's
    /// [`Policy::refund`]. The clock is read after each load of the word, so every decision the
    /// word reflects read its clock no later (on a consistent clock).
    #[inline]
    pub(crate) fn refund_receipt(&self, (prior, stored): (u64, u64), n: u64) {
        // Relaxed (load, success, failure): the word is self-contained, as in `check_n_at`.
        // Checked by loom-tests/tests/admit.rs.
        let mut cur = self.word.load(Relaxed);
        loop {
            let elapsed = self.clock.now().saturating_sub(self.origin);
            let Some(next) = self.policy.refund(cur, prior, stored, elapsed, n) else { return };
            match self.word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// This limiter's identity, which its multi-limit receipts carry.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// What `n` units would get now, taking nothing.
    #[inline]
    pub fn peek_n(&self, n: u64) -> Decision {
        let elapsed = self.clock.now().saturating_sub(self.origin);
        self.policy.decide(self.word.load(Relaxed), elapsed, n).1
    }

    /// The current time on this limiter's clock, for the `*_at` methods.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

impl<P: fmt::Debug, C: Clock> fmt::Debug for Direct<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct").field("policy", &self.policy).finish_non_exhaustive()
    }
}
