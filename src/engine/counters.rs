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
/// Outcomes counted: one slot per outcome code (`Decision::outcome_code`; two codes unused).
const OUTCOMES: usize = crate::engine::decision::OUTCOME_CODES;

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
pub struct Counters {
    /// One slot per owning thread.
    owned: Box<[CachePadded<[AtomicU64; OUTCOMES]>]>,
    /// The slot of every thread without one of its own.
    shared: CachePadded<[AtomicU64; OUTCOMES]>,
}

impl Counters {
    /// Counters at zero.
    pub fn new() -> Counters {
        let zeros = || CachePadded::new(core::array::from_fn(|_| AtomicU64::new(0)));
        Counters { owned: (0..OWNED).map(|_| zeros()).collect(), shared: zeros() }
    }

    /// Counts one decision, by its outcome's code (`Decision::outcome_code`, which
    /// [`snapshot`](Counters::snapshot) reads back by outcome).
    #[inline]
    pub(crate) fn record(&self, d: &Decision) {
        self.record_code(d.outcome_code());
    }

    /// [`record`](Counters::record) by the outcome's code.
    #[inline]
    pub(crate) fn record_code(&self, code: usize) {
        self.record_in(own_slot(), code);
    }

    /// Counts one decision of `code` in `slot`, which the calling thread owns (from
    /// [`SlotRegistry::acquire`]), or in the shared slot.
    #[inline]
    pub(crate) fn record_in(&self, slot: Option<usize>, code: usize) {
        match slot.and_then(|i| self.owned.get(i)) {
            Some(owned) => {
                // Relaxed, and no read-modify-write: this thread is the slot's only writer (see
                // the module docs); the load sees its own last store, or the previous owner's,
                // ordered before it by the registry's mutex.
                let count = &owned[code];
                count.store(count.load(Relaxed).wrapping_add(1), Relaxed);
            }
            // Relaxed: a statistic; see the module docs.
            None => {
                self.shared[code].fetch_add(1, Relaxed);
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

    /// The counts so far.
    pub fn snapshot(&self) -> CounterSnapshot {
        let mut sum = [0u64; OUTCOMES];
        for slot in self.owned.iter().chain(core::iter::once(&self.shared)) {
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

/// This thread's slot: taken from the registry on first use, given back when the thread exits.
#[cfg(not(tollgate_loom))]
#[inline]
fn own_slot() -> Option<usize> {
    thread_local! {
        // No destructor, so reading it costs no registration check; the guard below has one.
        static SLOT: Cell<usize> = const { Cell::new(UNASKED) };
    }
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

/// A limiter's counts at one moment: decisions by outcome (every call that decided: `check`,
/// `check_n`, their `_at` forms, batches, and each limit's own decision in `check_all`, a
/// refunded one included) and, for keyed tables, what the table did.
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
    /// Admitted with a delay ([`Outcome::Delayed`](crate::Outcome::Delayed)).
    pub delayed: u64,
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
}
