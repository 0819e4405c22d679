//! Decision counters: how many requests each outcome had, readable at any time.
//!
//! Opt-in per limiter ([`Direct::with_counters`](crate::Direct::with_counters),
//! [`KeyedBuilder::counters`](crate::KeyedBuilder::counters)): a limiter without them pays one
//! predicted branch on a field it reads anyway. With them, a decision adds one to its outcome's
//! count in a stripe of its own thread (16 stripes, each on its own cache lines), so that threads
//! on different cores do not contend for one line; a snapshot sums the stripes.
//!
//! Every access is `Relaxed`: the counts are statistics, read approximately while decisions
//! run, and no other memory is published through them. Each count only grows, so a snapshot is
//! at most the number of decisions made before it returned and at least those that returned
//! before it started.

use core::fmt;
use std::cell::Cell;

use crossbeam_utils::CachePadded;

use crate::engine::decision::code;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::{Decision, Outcome};

/// Stripes: a power of two. More threads than stripes share some, still exactly (atomic adds).
const STRIPES: usize = 16;
/// Outcomes counted: one slot per outcome code (`Decision::outcome_code`; two codes unused).
const OUTCOMES: usize = crate::engine::decision::OUTCOME_CODES;

/// The decision counters of one limiter, shared with whoever polls them (a metrics exporter
/// holds an `Arc<Counters>` from [`Direct::counters_handle`](crate::Direct::counters_handle)
/// or [`Keyed::counters_handle`](crate::Keyed::counters_handle)).
pub struct Counters {
    stripes: Box<[CachePadded<[AtomicU64; OUTCOMES]>]>,
}

impl Counters {
    /// Counters at zero.
    pub fn new() -> Counters {
        Counters {
            stripes: (0..STRIPES)
                .map(|_| CachePadded::new(core::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
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
        // Relaxed: a statistic; see the module docs.
        self.stripes[stripe()][code].fetch_add(1, Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> CounterSnapshot {
        let mut sum = [0u64; OUTCOMES];
        for stripe in self.stripes.iter() {
            for (total, count) in sum.iter_mut().zip(stripe.iter()) {
                // Relaxed: see the module docs.
                *total += count.load(Relaxed);
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

/// This thread's stripe, assigned round-robin on first use.
#[inline]
fn stripe() -> usize {
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|s| {
        let i = s.get();
        if i != usize::MAX {
            return i;
        }
        let i = crate::sync::next_stripe() % STRIPES;
        s.set(i);
        i
    })
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
