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

    /// Gives back what is still owed of a charge of `n` tokens made at the instant whose floor
    /// was `charged_floor`: `n·t − (at().floor − charged_floor)`, or nothing once that is not
    /// positive or if the clock reads earlier than the charge. `at()` is read after each load
    /// of the word.
    ///
    /// Why this never hands out capacity the bucket no longer owes, whatever else happened in
    /// between (other charges, other refunds in any order, plain decisions): compare the bucket
    /// with a twin that never saw the refunded charges but made every other admitted decision.
    /// The charge opens a gap of `n·t` between the two stamps. A decision maps a stamp `x` to
    /// `max(x, f) + cost`, which never widens a gap, and narrows it only when the twin is
    /// clamped at its floor (full); the twin's stamp is at least the floor of its last
    /// decision, so all clamps together narrow the gaps by at most how far the floor moved
    /// while some refunded charge was outstanding. A charge's share of that is at most the
    /// floor's advance between it and its refund (every decision the refund's load saw read its
    /// clock no later than the refund does). So at least `n·t − (f_refund − f_charge)` of this
    /// charge is still in the stamp, and taking that off leaves the bucket no fuller than the
    /// twin. At the charge's instant it is the whole charge: exact. `docs/design/admission.md`
    /// has the argument in full.
    #[inline]
    pub(crate) fn refund(&self, q: &Quota, charged_floor: u64, n: u64, at: impl Fn() -> At) {
        let cost = q.cost_units(n);
        let mut cur = self.load();
        loop {
            let floor = at().floor;
            if floor < charged_floor {
                return; // a clock behind the charge's: refund nothing
            }
            let owed = cost.saturating_sub(floor - charged_floor);
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
