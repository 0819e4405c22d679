//! Decision counters: how many requests each outcome had, readable at any time.
//!
//! Opt-in per limiter ([`Direct::with_counters`](crate::Direct::with_counters),
//! [`KeyedBuilder::counters`](crate::KeyedBuilder::counters)): a limiter without them pays one
//! predicted branch on a field it reads anyway. With them, a decision adds one to its outcome's
//! count in a slot of its own thread: each of the first [`OWNED`] threads that count (at once;
//! a thread's slot is handed on when it exits) owns one slot in every limiter's counters, on its
//! own cache lines, and adds with a plain load and store, no read-modify-write; threads beyond
//! them share one slot with atomic adds. A snapshot sums the slots.
//!
//! # Ownership
//!
//! A slot has one writer at a time, so its load and store need no atomicity across threads:
//! a slot index is taken from [`SlotRegistry`] under its mutex and given back under it when
//! the thread exits, after the thread's last store (the thread's slot is first cleared, so a
//! count recorded by a later destructor of the thread goes to the shared slot). The mutex
//! orders the old owner's last store before the new owner's first load, so no count is lost
//! across the hand-over (`loom-tests/tests/counters.rs` models it).
//!
//! Every access is `Relaxed`: the counts are statistics, read approximately while decisions
//! run, and no other memory is published through them. Each count only grows, so a snapshot is
//! at most the number of decisions made before it returned and at least those that returned
//! before it started.

use core::fmt;
#[cfg(not(tollgate_loom))]
use std::cell::Cell;

use crossbeam_utils::CachePadded;

use crate::engine::decision::code;
use crate::sync::{AtomicU64, Mutex, Ordering::Relaxed};
use crate::{Decision, Outcome};

/// Threads that own a slot at once; more share one slot, still exactly (atomic adds). Two in
/// the loom model, whose every atomic load is a branch to explore.
#[cfg(not(tollgate_loom))]
pub(crate) const OWNED: usize = 64;
#[cfg(tollgate_loom)]
pub(crate) const OWNED: usize = 2;
/// Outcomes counted: one slot per outcome code (`Decision::outcome_code`); code 3, no
/// outcome's, holds the nanoseconds delayed admissions were told to wait, and code 7 is unused.
const OUTCOMES: usize = crate::engine::decision::OUTCOME_CODES;
/// The slot of the waits' nanoseconds.
const WAITED: usize = 3;
/// The code of a delayed admission.
const DELAYED: usize = 2;

/// Which thread owns which slot: the indices free to take, and the next never taken. Public
/// only to the loom models (`--cfg tollgate_loom`).
#[derive(Debug)]
#[doc(hidden)]
#[cfg_attr(not(tollgate_loom), allow(unreachable_pub))]
pub struct SlotRegistry {
    free: Mutex<(Vec<usize>, usize)>,
}

impl Default for SlotRegistry {
    fn default() -> SlotRegistry {
        SlotRegistry::new()
    }
}

#[cfg_attr(not(tollgate_loom), allow(unreachable_pub))]
impl SlotRegistry {
    /// An empty registry.
    pub fn new() -> SlotRegistry {
        SlotRegistry { free: Mutex::new((Vec::new(), 0)) }
    }

    /// A slot for the calling thread, or `None` when all [`OWNED`] are owned.
    pub fn acquire(&self) -> Option<usize> {
        let mut free = self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = free.0.pop() {
            return Some(i);
        }
        let i = free.1;
        (i < OWNED).then(|| {
            free.1 += 1;
            i
        })
    }

    /// Gives back a slot, after the owner's last store to it.
    pub fn release(&self, slot: usize) {
        self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.push(slot);
    }
}

/// The decision counters of one limiter, shared with whoever polls them (a metrics exporter
/// holds an `Arc<Counters>` from [`Direct::counters_handle`](crate::Direct::counters_handle)
/// or [`Keyed::counters_handle`](crate::Keyed::counters_handle)).
///
/// A keyed table with [tiers](crate::KeyedBuilder::tier) counts each tier apart as well
/// ([`tier_snapshot`](Counters::tier_snapshot)): the default tier in the slots above, every
/// other tier in slots of its own (one per owning thread and tier, 128 bytes each: 8 KiB per
/// tier), written only on the tiered decisions' out-of-line path.
pub struct Counters {
    /// One slot per owning thread, for the default tier (and for a direct limiter): in place,
    /// so that a count is one load from the counters' address, not two.
    owned: [CachePadded<[AtomicU64; OUTCOMES]>; OWNED],
    /// The slot of every thread without one of its own.
    shared: CachePadded<[AtomicU64; OUTCOMES]>,
    /// The other tiers' slots: `(OWNED + 1) × (tiers − 1)`, the slot of thread slot `i` (the
    /// shared one at `i = OWNED`) and tier `t ≥ 1` at `i × (tiers − 1) + t − 1`.
    tiered: Box<[CachePadded<[AtomicU64; OUTCOMES]>]>,
    /// Tiers counted apart, the default included (1 for a direct limiter).
    tiers: usize,
    /// Their names, when there are several (the default's is `"default"`).
    names: Box<[String]>,
}

/// A slot at zero.
fn zeros() -> CachePadded<[AtomicU64; OUTCOMES]> {
    CachePadded::new(core::array::from_fn(|_| AtomicU64::new(0)))
}

impl Counters {
    /// Counters at zero.
    pub fn new() -> Counters {
        Counters::with_tiers(core::iter::empty())
    }

    /// Counters at zero for a table of the tiers named `others` besides the default.
    pub(crate) fn with_tiers<'a>(others: impl ExactSizeIterator<Item = &'a str>) -> Counters {
        let tiers = others.len() + 1;
        let names = match tiers {
            1 => Box::default(),
            _ => core::iter::once("default").chain(others).map(str::to_owned).collect(),
        };
        Counters {
            owned: core::array::from_fn(|_| zeros()),
            shared: zeros(),
            tiered: (0..(OWNED + 1) * (tiers - 1)).map(|_| zeros()).collect(),
            tiers,
            names,
        }
    }

    /// The tiers counted apart, the default included (1 for a direct limiter).
    pub fn tiers(&self) -> usize {
        self.tiers
    }

    /// The name of the tier of index `tier` (`"default"` for 0), or `None` past the tiers.
    pub fn tier_name(&self, tier: usize) -> Option<&str> {
        match tier {
            0 => Some("default"),
            _ => self.names.get(tier).map(String::as_str),
        }
    }

    /// Counts one decision, by its outcome's code (`Decision::outcome_code`, which
    /// [`snapshot`](Counters::snapshot) reads back by outcome).
    #[inline(always)]
    pub(crate) fn record(&self, d: &Decision) {
        let code = d.outcome_code();
        if code == DELAYED {
            self.record_delayed(0, d.delay().as_nanos().try_into().unwrap_or(u64::MAX));
        } else {
            self.record_code(code);
        }
    }

    /// Counts one decision of `code` under tier `tier` (its index in the table's list).
    #[inline]
    pub(crate) fn record_tier(&self, tier: usize, code: usize) {
        self.add_in(own_slot(), tier, code, 1);
    }

    /// Counts one delayed admission under tier `tier`, told to wait `wait_ns`.
    #[cold]
    pub(crate) fn record_delayed(&self, tier: usize, wait_ns: u64) {
        let slot = own_slot();
        self.add_in(slot, tier, DELAYED, 1);
        self.add_in(slot, tier, WAITED, wait_ns);
    }

    /// Adds `amount` to `code`'s count of tier `tier` in `slot`, which the calling thread owns
    /// (from [`SlotRegistry::acquire`]), or in the shared slot; a tier past the counted ones
    /// counts as the default.
    #[inline]
    fn add_in(&self, slot: Option<usize>, tier: usize, code: usize, amount: u64) {
        if tier == 0 || tier >= self.tiers {
            return self.add_default(slot, code, amount);
        }
        let row = slot.filter(|&i| i < OWNED).unwrap_or(OWNED);
        let Some(counts) = self.tiered.get(row * (self.tiers - 1) + tier - 1) else { return };
        if row < OWNED {
            // As in `add_default`: this thread is the slot's only writer.
            let count = &counts[code];
            count.store(count.load(Relaxed).wrapping_add(amount), Relaxed);
        } else {
            // Relaxed: a statistic; see the module docs.
            counts[code].fetch_add(amount, Relaxed);
        }
    }

    /// [`record`](Counters::record) by the outcome's code.
    #[inline(always)]
    pub(crate) fn record_code(&self, code: usize) {
        // One thread-local read and a bound test on the common path; taking a slot, and
        // counting without one, out of line.
        match self.owned.get(own_index()) {
            Some(owned) => {
                // As in `add_default`: this thread is the slot's only writer.
                let count = &owned[code];
                count.store(count.load(Relaxed).wrapping_add(1), Relaxed);
            }
            None => self.record_unowned(code),
        }
    }

    /// [`record_code`](Counters::record_code) on a thread that owns no slot yet, or none.
    #[cold]
    #[inline(never)]
    fn record_unowned(&self, code: usize) {
        self.record_in(own_slot(), code);
    }

    /// Counts one decision of `code` in `slot`, which the calling thread owns (from
    /// [`SlotRegistry::acquire`]), or in the shared slot.
    #[inline]
    pub(crate) fn record_in(&self, slot: Option<usize>, code: usize) {
        self.add_default(slot, code, 1);
    }

    /// Adds `amount` to `code`'s count of the default tier in `slot` (or the shared slot).
    #[inline]
    fn add_default(&self, slot: Option<usize>, code: usize, amount: u64) {
        match slot.and_then(|i| self.owned.get(i)) {
            Some(owned) => {
                // Relaxed, and no read-modify-write: this thread is the slot's only writer (see
                // the module docs); the load sees its own last store, or the previous owner's,
                // ordered before it by the registry's mutex.
                let count = &owned[code];
                count.store(count.load(Relaxed).wrapping_add(amount), Relaxed);
            }
            // Relaxed: a statistic; see the module docs.
            None => {
                self.shared[code].fetch_add(amount, Relaxed);
            }
        }
    }

    /// [`record_in`](Counters::record_in), for the loom model of the owned slots.
    #[cfg(tollgate_loom)]
    #[doc(hidden)]
    pub fn loom_record_in(&self, slot: Option<usize>, outcome: Outcome) {
        #[expect(clippy::cast_possible_truncation, reason = "a code is below OUTCOMES")]
        self.record_in(slot, code(outcome) as usize);
    }

    /// The counts so far, of every tier.
    pub fn snapshot(&self) -> CounterSnapshot {
        let slots = self.owned.iter().chain(core::iter::once(&self.shared)).chain(self.tiered.iter());
        Counters::sum(slots)
    }

    /// The counts so far of one tier of a keyed table (of `Tier::index` `tier`; the default
    /// is 0), or `None` past the table's tiers. A direct limiter has one tier, the default.
    pub fn tier_snapshot(&self, tier: usize) -> Option<CounterSnapshot> {
        if tier >= self.tiers {
            return None;
        }
        if tier == 0 {
            return Some(Counters::sum(self.owned.iter().chain(core::iter::once(&self.shared))));
        }
        let others = self.tiers - 1;
        Some(Counters::sum(self.tiered.iter().skip(tier - 1).step_by(others)))
    }

    /// The counts of `slots` summed.
    fn sum<'a>(slots: impl Iterator<Item = &'a CachePadded<[AtomicU64; OUTCOMES]>>) -> CounterSnapshot {
        let mut sum = [0u64; OUTCOMES];
        for slot in slots {
            for (total, count) in sum.iter_mut().zip(slot.iter()) {
                // Relaxed: see the module docs.
                *total = total.wrapping_add(count.load(Relaxed));
            }
        }
        let count = |o: Outcome| {
            #[expect(clippy::cast_possible_truncation, reason = "a code is below OUTCOMES")]
            let i = code(o) as usize;
            sum[i]
        };
        CounterSnapshot {
            allowed: count(Outcome::Allowed),
            denied: count(Outcome::Denied),
            insufficient: count(Outcome::Insufficient),
            delayed: count(Outcome::Delayed),
            table_full: count(Outcome::TableFull),
            untracked: count(Outcome::Untracked),
            waited_nanos: sum[WAITED],
            ..CounterSnapshot::default()
        }
    }
}

impl Default for Counters {
    fn default() -> Counters {
        Counters::new()
    }
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.snapshot(), f)
    }
}

/// The process's registry of owned slots.
#[cfg(not(tollgate_loom))]
fn registry() -> &'static SlotRegistry {
    static REGISTRY: std::sync::OnceLock<SlotRegistry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(SlotRegistry::new)
}

/// `OwnSlot` values: not asked yet, or none to be had (the shared slot).
#[cfg(not(tollgate_loom))]
const UNASKED: usize = usize::MAX;
#[cfg(not(tollgate_loom))]
const SHARED: usize = usize::MAX - 1;

#[cfg(not(tollgate_loom))]
thread_local! {
    /// This thread's slot, `UNASKED` or `SHARED`. No destructor, so reading it costs no
    /// registration check; the guard of `take_slot` has one.
    static SLOT: Cell<usize> = const { Cell::new(UNASKED) };
}

/// This thread's slot index as it stands: below [`OWNED`] once it owns one, else at or above
/// (not asked yet, or none to be had): the common path's one read.
#[cfg(not(tollgate_loom))]
#[inline(always)]
fn own_index() -> usize {
    SLOT.with(Cell::get)
}

/// This thread's slot: taken from the registry on first use, given back when the thread exits.
#[cfg(not(tollgate_loom))]
#[inline]
fn own_slot() -> Option<usize> {
    let i = SLOT.with(Cell::get);
    if i < OWNED {
        return Some(i);
    }
    if i == SHARED {
        return None;
    }
    take_slot(&SLOT)
}

/// First use on this thread: a slot from the registry, and a guard that gives it back.
#[cfg(not(tollgate_loom))]
#[cold]
fn take_slot(slot: &'static std::thread::LocalKey<Cell<usize>>) -> Option<usize> {
    /// Gives the thread's slot back when the thread exits: the slot marked shared first, so
    /// that a count a later destructor records goes to the shared slot.
    struct Guard(usize, &'static std::thread::LocalKey<Cell<usize>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.1.try_with(|s| s.set(SHARED));
            registry().release(self.0);
        }
    }
    thread_local! {
        static GUARD: Cell<Option<Guard>> = const { Cell::new(None) };
    }
    let taken = registry().acquire();
    // A thread being torn down (its guard already gone) counts in the shared slot.
    let kept = match taken {
        Some(i) => GUARD.try_with(|g| g.set(Some(Guard(i, slot)))).is_ok(),
        None => false,
    };
    match (taken, kept) {
        (Some(i), true) => {
            slot.with(|s| s.set(i));
            Some(i)
        }
        (Some(i), false) => {
            registry().release(i);
            let _ = slot.try_with(|s| s.set(SHARED));
            None
        }
        (None, _) => {
            slot.with(|s| s.set(SHARED));
            None
        }
    }
}

/// Under loom, threads share the process's thread-locals: every count goes to the shared
/// slot, and the model of the owned slots drives [`SlotRegistry`] and
/// [`Counters::record_in`] itself.
#[cfg(tollgate_loom)]
fn own_slot() -> Option<usize> {
    None
}

/// Under loom, no thread owns a slot (see `own_slot`).
#[cfg(tollgate_loom)]
fn own_index() -> usize {
    usize::MAX
}

/// A limiter's counts at one moment: decisions by outcome (every call that decided: `check`,
/// `check_n`, their `_at` forms, batches, and each limit's own decision in `check_all`, a
/// refunded one included; and each reservation of a token bucket, `acquire` and `until_ready`
/// included: due at once is allowed, due later delayed, due past the wait allowed denied,
/// over the burst insufficient) and, for keyed tables, what the table did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CounterSnapshot {
    /// Admitted and served at once ([`Outcome::Allowed`](crate::Outcome::Allowed)).
    pub allowed: u64,
    /// Refused for now ([`Outcome::Denied`](crate::Outcome::Denied)).
    pub denied: u64,
    /// Refused for good: the cost exceeds what the limit admits at once
    /// ([`Outcome::Insufficient`](crate::Outcome::Insufficient)).
    pub insufficient: u64,
    /// Admitted with a delay: [`Outcome::Delayed`](crate::Outcome::Delayed), and
    /// reservations due in the future (`reserve`, `acquire`, `until_ready`: the waits).
    pub delayed: u64,
    /// The delays those admissions were told, summed, in nanoseconds: the time callers waited
    /// or were asked to wait.
    pub waited_nanos: u64,
    /// New keys refused by a full table ([`Outcome::TableFull`](crate::Outcome::TableFull)).
    pub table_full: u64,
    /// New keys admitted uncounted by a full table ([`Outcome::Untracked`](crate::Outcome::Untracked)).
    pub untracked: u64,
    /// Keys placed in a keyed table (0 for direct limiters).
    pub inserts: u64,
    /// Keys reclaimed because their state had become a fresh key's: no decision changed (0 for
    /// direct limiters).
    pub evicted_clean: u64,
    /// Keys evicted before their state was a fresh key's ([`WhenFull::EvictFullest`](crate::WhenFull)).
    pub evicted_forced: u64,
}

impl CounterSnapshot {
    /// Every decision counted.
    pub fn decisions(&self) -> u64 {
        self.allowed + self.denied + self.insufficient + self.delayed + self.table_full + self.untracked
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// More threads than owned slots at once (some count in the shared slot), then hundreds of
    /// short-lived threads one after another (each takes a slot another gave back): every
    /// count is kept.
    #[test]
    fn counts_are_exact_across_owned_shared_and_handed_on_slots() {
        let c = Arc::new(Counters::new());
        let barrier = Arc::new(std::sync::Barrier::new(OWNED + 8));
        let threads: Vec<_> = (0..OWNED + 8)
            .map(|_| {
                let (c, barrier) = (Arc::clone(&c), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait(); // all alive at once: 8 of them without a slot
                    for _ in 0..1000 {
                        c.record_code(0);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(c.snapshot().allowed, (OWNED as u64 + 8) * 1000);
        for _ in 0..300 {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.record_code(4)).join().unwrap();
        }
        assert_eq!(c.snapshot().denied, 300);
        // The slots were given back: a new thread owns one.
        assert!(std::thread::spawn(own_slot).join().unwrap().is_some());
    }

    /// Each tier's counts land in its own slots, from owning and sharing threads alike, and
    /// add up to the total; a tier past the table's counts as the default.
    #[test]
    fn tiers_are_counted_apart_and_together() {
        let c = Arc::new(Counters::with_tiers(["gold", "silver"].into_iter()));
        assert_eq!(
            (c.tiers(), c.tier_name(0), c.tier_name(2), c.tier_name(3)),
            (3, Some("default"), Some("silver"), None)
        );
        let barrier = Arc::new(std::sync::Barrier::new(OWNED + 4));
        let threads: Vec<_> = (0..OWNED + 4)
            .map(|i| {
                let (c, barrier) = (Arc::clone(&c), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..100 {
                        c.record_tier(i % 3, 4);
                    }
                    c.record_delayed(2, 1_000);
                    c.record_tier(9, 0);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let n = OWNED as u64 + 4;
        let per_tier = |t: usize| (0..OWNED + 4).filter(|i| i % 3 == t).count() as u64;
        for t in 0..3 {
            let s = c.tier_snapshot(t).unwrap();
            assert_eq!(s.denied, per_tier(t) * 100, "tier {t}");
        }
        let silver = c.tier_snapshot(2).unwrap();
        assert_eq!((silver.delayed, silver.waited_nanos), (n, n * 1_000));
        assert_eq!(c.tier_snapshot(0).unwrap().allowed, n);
        let all = c.snapshot();
        assert_eq!((all.denied, all.delayed, all.allowed, all.waited_nanos), (n * 100, n, n, n * 1_000));
        assert!(c.tier_snapshot(3).is_none());
    }
}
