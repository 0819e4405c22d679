//! Policies: rate-limiting algorithms whose whole per-key state is one `u64`, decided purely and
//! committed by one CAS loop, shared by every limiter built on them.
//!
//! Every single-word algorithm but the token bucket implements [`Policy`] and runs on
//! [`Direct`] through this file's CAS loop; the token bucket keeps a loop of its own, tuned to
//! the nanosecond (`limiter.rs`), and the sliding log a lock (`log.rs`).

use crossbeam_utils::CachePadded;

use crate::engine::config::WORDS;
use crate::engine::direct::Algorithm;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::{Decision, Nanos, UpdateError};

/// A rate-limiting algorithm over a one-word state.
///
/// `decide` is a pure function of `(word, elapsed, n)`: it reads no clock and touches no
/// atomic, so it can be tested, modelled and fuzzed on its own. A word of 0 is a state nobody
/// has touched yet (a fresh key).
///
/// Open: an algorithm of your own implements it and runs on [`Direct`](crate::Direct) with
/// every method and [`check_all`](crate::check_all), building its answers with [`Decision`]'s
/// public constructors. Keyed tables take only the built-in policies (their safety rests on
/// what each one's words promise), and a policy of your own cannot be replaced at runtime
/// ([`UpdateError::Unsupported`]).
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

    /// This configuration as words, for a limiter whose configuration changes at runtime
    /// (`None`: it cannot). The engine's, for the built-in policies.
    #[doc(hidden)]
    fn config_words(&self) -> Option<[u64; WORDS]> {
        None
    }

    /// A configuration from [`config_words`](Policy::config_words).
    #[doc(hidden)]
    fn from_config_words(words: [u64; WORDS]) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = words;
        None
    }

    /// `new`, as it takes over a running limiter built with `self`: what it may change and how
    /// the state reads under it (see [`Direct::set_policy`](crate::Direct::set_policy)).
    #[doc(hidden)]
    fn running_update(&self, new: Self) -> Result<Self, UpdateError>
    where
        Self: Sized,
    {
        let _ = new;
        Err(UpdateError::Unsupported)
    }
}

/// Every [`Policy`] runs on [`Direct`](crate::Direct) by one load and one CAS: a decision that
/// stores a word takes effect at its successful CAS; one that stores nothing, at the load it
/// decided on.
impl<P: Policy> Algorithm for P {
    type State = CachePadded<AtomicU64>;

    fn config_words(&self) -> Option<[u64; WORDS]> {
        Policy::config_words(self)
    }

    fn from_config_words(words: [u64; WORDS]) -> Option<Self> {
        <P as Policy>::from_config_words(words)
    }

    /// The word means the same under the new policy (each policy's `running_update` says what
    /// may change so that it does).
    fn direct_update(&self, _: &Self::State, new: Self) -> Result<Option<Self>, UpdateError> {
        self.running_update(new).map(Some)
    }

    fn new_state(&self) -> CachePadded<AtomicU64> {
        CachePadded::new(AtomicU64::new(0))
    }

    // Always inline: out of line, its 32-byte decision is returned through memory, and a
    // caller that copies it (16 bytes at a time) reads it back across two of the callee's
    // 8-byte stores: a failed store forward, a dozen cycles, on every decision.
    #[inline(always)]
    fn direct_check(&self, word: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        let elapsed = now.saturating_sub(origin);
        // Relaxed (load, success, failure): the word is self-contained, as the token bucket's in
        // `bucket/atomic.rs`; a failed CAS hands back the value the next decision is made on.
        // Checked by loom-tests/tests/nginx.rs.
        let cur = word.load(Relaxed);
        let (next, decision) = self.decide(cur, elapsed, n);
        let Some(next) = next else { return decision };
        match word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
            Ok(_) => decision,
            Err(seen) => retry(self, word, seen, elapsed, n),
        }
    }

    #[inline]
    fn direct_peek(&self, word: &Self::State, now: Nanos, origin: Nanos, n: u64) -> Decision {
        self.decide(word.load(Relaxed), now.saturating_sub(origin), n).1
    }

    /// The receipt: the word stored and the one it replaced.
    #[inline]
    fn direct_charge(
        &self,
        word: &Self::State,
        now: Nanos,
        origin: Nanos,
        n: u64,
    ) -> (Decision, Option<[u64; 3]>) {
        let elapsed = now.saturating_sub(origin);
        // Relaxed (load, success, failure): as in `check`.
        let mut cur = word.load(Relaxed);
        loop {
            let (next, decision) = self.decide(cur, elapsed, n);
            let Some(next) = next else { return (decision, None) };
            if !decision.is_allowed() {
                // A policy that stores on a denial (none does today) is charged nothing.
                return (decision, None);
            }
            match word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return (decision, Some([cur, next, 0])),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Through [`Policy::refund`]. The clock is read after each load of the word, so every
    /// decision the word reflects read its clock no later (on a consistent clock).
    #[inline]
    fn direct_refund(
        &self,
        word: &Self::State,
        [prior, stored, _]: [u64; 3],
        n: u64,
        origin: Nanos,
        now: impl Fn() -> Nanos,
    ) {
        // Relaxed (load, success, failure): the word is self-contained, as in `check`.
        // Checked by loom-tests/tests/admit.rs.
        let mut cur = word.load(Relaxed);
        loop {
            let elapsed = now().saturating_sub(origin);
            let Some(next) = Policy::refund(self, cur, prior, stored, elapsed, n) else { return };
            match word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }
}

/// The CAS loop after a first attempt failed: out of line, so that the first attempt is
/// straight-line code with nothing hoisted for a loop.
#[cold]
#[inline(never)]
fn retry<P: Policy>(policy: &P, word: &AtomicU64, mut cur: u64, elapsed: Nanos, n: u64) -> Decision {
    loop {
        let (next, decision) = policy.decide(cur, elapsed, n);
        let Some(next) = next else { return decision };
        // Relaxed: as in `check`.
        match word.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
            Ok(_) => return decision,
            Err(seen) => cur = seen,
        }
    }
}
