//! `AtomicBucket`: the CAS loop that commits a [`BucketWord::decide`]. The only place where a
//! bucket word meets an atomic, and so the only ordering choices for bucket words.
//!
//! # Orderings
//!
//! Every access is `Relaxed`. The word is self-contained: no other memory is published through
//! it, and coherence gives all threads one modification order for this single atomic, which is
//! all the decision needs. A decision takes effect at its successful CAS (its linearization
//! point); a denial or a peek takes effect at the load it decided on. Checked by
//! `loom-tests/tests/bucket.rs`.

use super::{BucketWord, Verdict};
use crate::decision::Decision;
use crate::quota::At;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::Quota;

/// One bucket's state word.
#[derive(Debug)]
pub(crate) struct AtomicBucket {
    word: AtomicU64,
}

impl AtomicBucket {
    pub(crate) fn new(word: BucketWord) -> AtomicBucket {
        AtomicBucket { word: AtomicU64::new(word.raw()) }
    }

    /// Reads the word. Relaxed: see the module docs.
    #[inline]
    pub(crate) fn load(&self) -> BucketWord {
        BucketWord::from_raw(self.word.load(Relaxed))
    }

    /// Takes `n` tokens (`1 ≤ n ≤ burst`) at the bucket instant `at`, or denies.
    ///
    /// Never blocks, allocates or panics. Retries only when another thread changed the word
    /// between our load and our CAS, which means that thread's decision took effect: the loop
    /// is lock-free.
    #[inline]
    pub(crate) fn acquire(&self, q: &Quota, at: At, n: u64) -> Decision {
        self.charge(q, at, n).0
    }

    /// [`acquire`](AtomicBucket::acquire), also returning the word it stored when it took the
    /// tokens: the receipt [`refund`](AtomicBucket::refund) needs.
    #[inline]
    pub(crate) fn charge(&self, q: &Quota, at: At, n: u64) -> (Decision, Option<BucketWord>) {
        let mut cur = self.load();
        loop {
            let next = match cur.decide(q, at, n) {
                Verdict::Take { next } => next,
                Verdict::Final(denied) => return (denied, None),
            };
            // Relaxed (load, success, failure): the word is self-contained, and the failure
            // value feeds the same decision as the first load. Checked by
            // loom-tests/tests/bucket.rs.
            match self.word.compare_exchange_weak(cur.raw(), next.raw(), Relaxed, Relaxed) {
                Ok(_) => return (next.taken(q, at), Some(next)),
                Err(seen) => cur = BucketWord::from_raw(seen), // lost a race: re-decide
            }
        }
    }

    /// Gives back the `n` tokens of a [`charge`](AtomicBucket::charge) that stored `stored`,
    /// as far as they are still owed at the instant `at()` (read after each load of the word).
    ///
    /// The charge moved the stamp up by `n·t`; other decisions may have stacked on top, and the
    /// cap at full may since have absorbed part of it. Any decision since then clamped at a
    /// floor `f ≤ at().floor` (its clock was read before its CAS, which this load saw), and a
    /// clamp at `f` can absorb only what of the charge lies below `f`, so at least
    /// `min(n·t, stored − at().floor)` of it is still in the stamp: taking that much off admits
    /// nothing that the state without the charge would not. At a frozen clock, or at the
    /// charge's own instant, that is all `n·t`: the refund is exact.
    #[inline]
    pub(crate) fn refund(&self, q: &Quota, stored: BucketWord, n: u64, at: impl Fn() -> At) {
        let cost = q.cost_units(n);
        let mut cur = self.load();
        loop {
            let owed = cost.min(stored.raw().saturating_sub(at().floor));
            if owed == 0 {
                return;
            }
            let next = cur.raw().saturating_sub(owed);
            // Relaxed (load, success, failure): as in `charge`; the word is self-contained.
            // Checked by loom-tests/tests/admit.rs.
            match self.word.compare_exchange_weak(cur.raw(), next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = BucketWord::from_raw(seen),
            }
        }
    }
}
