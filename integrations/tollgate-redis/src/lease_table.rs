//! The leases of many keys, shared by the leased bucket ([`LeasedLimiter`](crate::LeasedLimiter))
//! and the leased windows ([`LeasedWindows`](crate::LeasedWindows)): the table, each key's
//! lease, the sizing and the counters. The lock-free part is `lease_word.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::Decision;

use crate::lease_word::{Ended, LeaseWord};
use crate::LeaseStats;

/// One key's lease.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The generation, its units and expiries: the lock-free part.
    word: LeaseWord,
    /// The next lease's size.
    size: AtomicU64,
    /// What a local decision reports as its reset: an instant on the table's clock (the
    /// shared bucket's reset as of the lease, or the window's end).
    reset_at: AtomicU64,
    /// What the shared limit had left when the lease was taken, added to a local decision's
    /// `remaining` (0 for the bucket, whose local decisions report the lease's own).
    shared_left: AtomicU64,
    /// One refill at a time per key; the others wait for it and spend from it.
    pub(crate) refill: tokio::sync::Mutex<()>,
}

/// A lease granted, instants on the table's clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    /// Units taken from the shared limit in all (the request's included).
    pub(crate) taken: u64,
    /// Units left to spend locally.
    pub(crate) units: u64,
    /// When they lapse.
    pub(crate) expires: u64,
    /// What local decisions report as their reset (see [`LeaseTable::spend`]).
    pub(crate) reset_at: u64,
    /// What local decisions add to their `remaining`.
    pub(crate) shared_left: u64,
}

/// Every key's lease, and what they did.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    leases: Mutex<HashMap<Vec<u8>, Arc<Lease>>>,
    max_keys: usize,
    start: Instant,
    local: AtomicU64,
    leases_granted: AtomicU64,
    leased: AtomicU64,
    stranded: AtomicU64,
    unleased: AtomicU64,
    unleased_units: AtomicU64,
}

impl LeaseTable {
    /// A table of at most 65,536 leases.
    pub(crate) fn new() -> LeaseTable {
        LeaseTable {
            leases: Mutex::new(HashMap::new()),
            max_keys: 1 << 16,
            start: Instant::now(),
            local: AtomicU64::new(0),
            leases_granted: AtomicU64::new(0),
            leased: AtomicU64::new(0),
            stranded: AtomicU64::new(0),
            unleased: AtomicU64::new(0),
            unleased_units: AtomicU64::new(0),
        }
    }

    /// At most `keys` (at least 1) keys hold a lease at once.
    pub(crate) fn set_max_keys(&mut self, keys: usize) {
        self.max_keys = keys.max(1);
    }

    /// The table's clock: nanoseconds since it was made.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// What the leases did so far. Lapsed leases not yet collected hold stranded units; live
    /// ones, outstanding units. (Counters are statistics: relaxed, read one by one.)
    pub(crate) fn stats(&self) -> LeaseStats {
        let now = self.now();
        let (mut outstanding, mut lapsed) = (0u64, 0u64);
        for l in self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values() {
            match l.word.current(now) {
                (units, false) => outstanding = outstanding.saturating_add(units),
                (units, true) => lapsed = lapsed.saturating_add(units),
            }
        }
        LeaseStats {
            local: self.local.load(Relaxed),
            leases: self.leases_granted.load(Relaxed),
            leased_tokens: self.leased.load(Relaxed),
            stranded_tokens: self.stranded.load(Relaxed).saturating_add(lapsed),
            outstanding_tokens: outstanding,
            unleased: self.unleased.load(Relaxed),
            unleased_tokens: self.unleased_units.load(Relaxed),
        }
    }

    /// `key`'s lease, made if there is room; `None` when the table is full of live leases.
    pub(crate) fn lease(&self, key: &[u8]) -> Option<Arc<Lease>> {
        let mut leases = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(l) = leases.get(key) {
            return Some(Arc::clone(l));
        }
        if leases.len() >= self.max_keys {
            // Lapsed leases make room; their units strand.
            let now = self.now();
            leases.retain(|_, l| {
                let (units, lapsed) = l.word.current(now);
                let live = !lapsed || Arc::strong_count(l) > 1;
                if !live {
                    self.stranded.fetch_add(units, Relaxed);
                }
                live
            });
            if leases.len() >= self.max_keys {
                return None;
            }
        }
        let lease = Arc::new(Lease {
            word: LeaseWord::new(),
            size: AtomicU64::new(0),
            reset_at: AtomicU64::new(0),
            shared_left: AtomicU64::new(0),
            refill: tokio::sync::Mutex::new(()),
        });
        leases.insert(key.to_vec(), Arc::clone(&lease));
        Some(lease)
    }

    /// `n` units from `lease`, if its current generation holds them and has not lapsed: an
    /// admission whose `remaining` is the lease's units left plus the shared limit's as of the
    /// lease, and whose reset is the lease's.
    pub(crate) fn spend(&self, lease: &Lease, n: u64) -> Option<Decision> {
        let (left, now) = lease.word.spend(n, || self.now())?;
        self.local.fetch_add(1, Relaxed);
        let remaining = lease.shared_left.load(Relaxed).saturating_add(left);
        let reset = lease.reset_at.load(Relaxed).saturating_sub(now);
        Some(Decision::allowed(u32::try_from(remaining).unwrap_or(u32::MAX), Duration::from_nanos(reset)))
    }

    /// Ends `lease`'s generation (what is left of it strands) and sizes the next one: 1 for a
    /// first lease, doubled (up to `largest`) when the last was spent before it lapsed,
    /// halved when it lapsed with units left. Callers hold the lease's refill lock.
    pub(crate) fn end(&self, lease: &Lease, largest: u64) -> (Ended, u64) {
        let ended = lease.word.end(self.now());
        self.stranded.fetch_add(ended.left, Relaxed);
        let size = match lease.size.load(Relaxed) {
            0 => 1,
            s if !ended.lapsed => s.saturating_mul(2).min(largest),
            s if ended.left > 0 => (s / 2).max(1),
            s => s,
        };
        lease.size.store(size, Relaxed);
        (ended, size)
    }

    /// Gives the generation `ended` the units of `grant`.
    pub(crate) fn grant(&self, lease: &Lease, ended: Ended, grant: Grant) {
        self.leases_granted.fetch_add(1, Relaxed);
        self.leased.fetch_add(grant.taken, Relaxed);
        // Relaxed: the two fields are only reported (a local decision may show the previous
        // lease's for an instant); the bound rests on the expiry, which the word's Release
        // store orders before its units.
        lease.reset_at.store(grant.reset_at, Relaxed);
        lease.shared_left.store(grant.shared_left, Relaxed);
        lease.word.grant(ended, grant.units, grant.expires);
    }

    /// A decision made by a plain round trip, which admitted `units`.
    pub(crate) fn unleased(&self, units: u64) {
        self.unleased.fetch_add(1, Relaxed);
        self.unleased_units.fetch_add(units, Relaxed);
    }
}

/// `d` in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
