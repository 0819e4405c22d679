//! `AtomicBucket`: the CAS loop that commits a [`BucketWord::decide`]. The only place where a
//! bucket word meets an atomic, and so the only ordering choices for bucket words.
//!
//! # Orderings
//!
//! Decisions need nothing but `Relaxed`: the word is self-contained, no other memory is
//! published through it, and coherence gives all threads one modification order for this
//! single atomic. A successful decision's CAS is `Release` all the same, for refunds
//! ([`AtomicBucket::refund`]), which load `Acquire` and must then read a clock no earlier than
//! the decisions they saw; on x86 that costs nothing. A decision takes effect at its successful CAS (its linearization
//! point); a denial or a peek takes effect at the load it decided on. Checked by
//! `loom-tests/tests/bucket.rs`.

use super::{BucketWord, Verdict};
use crate::engine::decision::Decision;
use crate::policies::token_bucket::At;
use crate::sync::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use crate::TokenBucket;

/// One bucket's state word.
#[derive(Debug)]
#[doc(hidden)]
pub struct AtomicBucket {
    word: AtomicU64,
    /// 1 while a refund runs (see `refund`). Decisions never touch it.
    refunding: AtomicU64,
}

impl AtomicBucket {
    pub(crate) fn new(word: BucketWord) -> AtomicBucket {
        AtomicBucket { word: AtomicU64::new(word.raw()), refunding: AtomicU64::new(0) }
    }

    /// Reads the word. Relaxed: see the module docs.
    #[inline]
    pub(crate) fn load(&self) -> BucketWord {
        BucketWord::from_raw(self.word.load(Relaxed))
    }

    /// Takes `n` tokens (`1 ≤ n ≤ burst`) at the bucket instant `at`, or denies; when it took
    /// them, also returns the word it stored (a multi-limit receipt's, see `refund`).
    ///
    /// Never blocks, allocates or panics. Retries only when another thread changed the word
    /// between our load and our CAS, which means that thread's decision took effect: the loop
    /// is lock-free.
    #[inline]
    pub(crate) fn charge(&self, q: &TokenBucket, at: At, n: u64) -> (Decision, Option<BucketWord>) {
        self.charge_fresh(q, at, n, None::<fn() -> At>)
    }

    /// [`charge`](AtomicBucket::charge) at a reading of the limiter's own clock, `fresh` a new
    /// one: a denial on a stamp ahead of the reading is decided again at a fresh reading, once.
    ///
    /// A decision that takes leaves the stamp at or below its own reading
    /// (`max(stamp, floor) + cost ≤ now`), so a stamp ahead of ours was stored at a later
    /// reading than ours: ours went stale before the load (the thread was descheduled between
    /// the two while others decided), and refusing on it could refuse what the bucket holds
    /// now. A bucket in debt to a reservation has such stamps too, and so does one decided
    /// at a later time by a caller's `check_n_at` or by a core whose clock leads: deciding
    /// those denials again costs a clock read (on a core whose clock lags, every denial
    /// reads it twice). The test is on the denial's path alone. (Always
    /// inline: with the refresher's closure the compiler made it a call, 26 instructions more
    /// on every decision.)
    #[inline(always)]
    pub(crate) fn charge_fresh(
        &self,
        q: &TokenBucket,
        mut at: At,
        n: u64,
        mut fresh: Option<impl FnOnce() -> At>,
    ) -> (Decision, Option<BucketWord>) {
        let mut cur = self.load();
        loop {
            let next = match cur.decide(q, at, n) {
                Verdict::Take { next } => next,
                Verdict::Final(denied) => {
                    if cur.raw() > at.now {
                        if let Some(fresh) = fresh.take() {
                            // Acquire, then the clock after it: pairs with the Release CAS that
                            // stored the stamp we saw (or a later one), so that the new reading
                            // is no earlier than its decision's (`clock_after_loads`).
                            cur = BucketWord::from_raw(self.word.load(Acquire));
                            crate::sync::clock_after_loads();
                            at = fresh();
                            continue;
                        }
                    }
                    return (denied, None);
                }
            };
            // Load and failure Relaxed: the word is self-contained, and the failure value feeds
            // the same decision as the first load. Success Release, for refunds only: a refund
            // that loads this value (Acquire) then reads a clock no earlier than the one this
            // decision used (`refund`). Free on x86, where every locked RMW is a full barrier.
            // Checked by loom-tests/tests/bucket.rs and admit.rs.
            match self.word.compare_exchange_weak(cur.raw(), next.raw(), Release, Relaxed) {
                Ok(_) => return (next.taken(q, at), Some(next)),
                Err(seen) => cur = BucketWord::from_raw(seen), // lost a race: re-decide
            }
        }
    }

    /// A queued bucket's decision ([`BucketWord::queue`]) committed: the same lock-free loop and
    /// orderings as [`charge`](AtomicBucket::charge); when tokens were taken (now or for
    /// later), also the word stored.
    #[inline]
    pub(crate) fn queue(
        &self,
        q: &TokenBucket,
        at: At,
        n: u64,
        queue: u64,
    ) -> (Decision, Option<BucketWord>) {
        let mut cur = self.load();
        loop {
            let next = match cur.queue(q, at, n, queue) {
                Verdict::Take { next } => next,
                Verdict::Final(denied) => return (denied, None),
            };
            // As in `charge`: Relaxed loads, Release on success for the refunds that load this
            // value with Acquire and read their clock after it.
            match self.word.compare_exchange_weak(cur.raw(), next.raw(), Release, Relaxed) {
                Ok(_) => return (next.queued(q, at), Some(next)),
                Err(seen) => cur = BucketWord::from_raw(seen),
            }
        }
    }

    /// Reserves `n` tokens (`1 ≤ n ≤ burst`) at `at`, due at most `max_wait` units (at most
    /// one fill) from now: `Ok((stamp, wait))`, the stamp stored, which is when they are due,
    /// and that many whole nanoseconds from now; or `Err(wait)`, the wait in whole nanoseconds
    /// it would have needed. The same lock-free loop and orderings as
    /// [`charge`](AtomicBucket::charge): a reservation is a charge whose stamp may lie ahead of
    /// `now`, and a later charge or reservation queues behind it (it reads that stamp).
    #[inline]
    pub(crate) fn reserve(&self, q: &TokenBucket, at: At, n: u64, max_wait: u64) -> Result<(u64, u64), u64> {
        let mut cur = self.load();
        loop {
            let (next, wait_ns) = cur.reserve(q, at, n, max_wait)?;
            // As in `charge`: Relaxed loads, Release on success for the refunds (cancels) that
            // load this value with Acquire and read their clock after it.
            match self.word.compare_exchange_weak(cur.raw(), next.raw(), Release, Relaxed) {
                Ok(_) => return Ok((next.raw(), wait_ns)),
                Err(seen) => cur = BucketWord::from_raw(seen),
            }
        }
    }

    /// Cancels a reservation of `n` tokens made at the instant whose floor was `charged_floor`,
    /// which stored `stamp`: gives back what it still owes, by the rule of
    /// [`refund`](AtomicBucket::refund) (with the reservation's stamp): in debt, all of it if it
    /// is the latest and nothing otherwise; out of debt, `n·t` less the floor's advance since.
    ///
    /// Waits for another refund or cancel of this bucket in progress rather than give up (they
    /// are a few instructions each): not lock-free, for that reason; decisions never wait on
    /// it. Whether it gave anything back.
    pub(crate) fn cancel(
        &self,
        q: &TokenBucket,
        charged_floor: u64,
        stamp: u64,
        n: u64,
        at: impl Fn() -> At,
    ) -> bool {
        self.refund_with(true, q, charged_floor, stamp, n, at)
    }

    /// Gives back what is still owed of a charge of `n` tokens made at the instant whose floor
    /// was `charged_floor`, which stored `stamp`: `n·t − (at().floor − charged_floor)`, or
    /// nothing once that is not positive or if the clock reads earlier than the charge. While
    /// the bucket is in debt to a reservation (the word is ahead of `now`), only the latest
    /// charge goes back, whole (see `refund_flagged`): reservations due in the future were
    /// given instants that count on the earlier charges. `at()` is read after each load of the
    /// word.
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
    ///
    /// **One refund at a time.** The bound needs every decision the CAS could overwrite to have
    /// read its clock before this refund did. Decisions only raise the word, so if the word
    /// still holds the value loaded before the clock read, no decision came in between, unless
    /// another refund lowered the word and a decision raised it back to the same value (with a
    /// later clock). So refunds of one bucket are serialized by a flag, and a refund that finds
    /// another in progress gives nothing back (it never waits: lock-free, erring toward
    /// refusal). The new stamp is never below the refund's own floor, which limits the damage
    /// of a decision dated after the refund's clock (which the contract excludes).
    #[inline]
    pub(crate) fn refund(
        &self,
        q: &TokenBucket,
        charged_floor: u64,
        stamp: u64,
        n: u64,
        at: impl Fn() -> At,
    ) {
        self.refund_with(false, q, charged_floor, stamp, n, at);
    }

    /// [`refund`](AtomicBucket::refund) (`wait` false: give up if another refund holds the
    /// flag) and [`cancel`](AtomicBucket::cancel) (`wait` true): whether it gave anything back.
    fn refund_with(
        &self,
        wait: bool,
        q: &TokenBucket,
        charged_floor: u64,
        stamp: u64,
        n: u64,
        at: impl Fn() -> At,
    ) -> bool {
        // Acquire, paired with the Release of the flag's clear: a refund starts after the
        // previous one's CAS in the word's modification order. Checked by
        // loom-tests/tests/admit.rs and reserve.rs.
        while self.refunding.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            if !wait {
                return false;
            }
            crate::sync::pause();
        }
        // Release (on drop, even if the clock panics): see the Acquire above.
        let _clear = crate::sync::ClearOnDrop(&self.refunding);
        let cost = q.cost_units(n);
        // Acquire (and on failure below): pairs with the decisions' Release CAS, so that the
        // clock read after it is no earlier than theirs.
        let mut cur = BucketWord::from_raw(self.word.load(Acquire));
        loop {
            crate::sync::clock_after_loads();
            let now = at();
            let floor = now.floor;
            if floor < charged_floor {
                return false; // a clock behind the charge's: refund nothing
            }
            // In debt, reservations may be due in the future at instants computed with this
            // charge in the stamp: lowering the stamp below any of them would let a new
            // reservation fall due together with it, more at once than the bucket holds. So
            // then only the latest charge goes back (the word is still what it stored), and
            // all of it: the twin is the word less the cost. (In debt the word never went
            // below a stamp still due in the future, so an equal word is that charge's own.)
            // Out of debt every reservation is due already, and what the refill has not
            // covered goes back, in any order (the twin argument above).
            let owed = if cur.raw() > now.now {
                if cur.raw() != stamp {
                    return false;
                }
                cost
            } else {
                cost.saturating_sub(floor - charged_floor)
            };
            if owed == 0 {
                return false;
            }
            let next = cur.raw().saturating_sub(owed).max(floor);
            if next >= cur.raw() {
                return false;
            }
            // Success Relaxed: nothing is published through a refund. Failure Acquire: as the
            // load above. Checked by loom-tests/tests/admit.rs.
            match self.word.compare_exchange_weak(cur.raw(), next, Relaxed, Acquire) {
                Ok(_) => return true,
                Err(seen) => cur = BucketWord::from_raw(seen),
            }
        }
    }
}
