//! Atomics, from `std` normally and from `loom` under `--cfg tollgate_loom`.
//!
//! Every other module imports its atomics from here, so that the loom models in `loom-tests/`
//! exercise exactly the code that ships. `.ci/test.sh` greps for `sync::atomic` outside this file.

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::Mutex;

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::Mutex;

/// Two words read and compare-and-swapped as one (a shared meter's two buckets): a 16-byte
/// atomic where the CPU has one (portable-atomic: `cmpxchg16b` on x86_64, found at run time),
/// a lock elsewhere; under loom, a loom mutex (loom models no 16-byte atomic), so that the
/// models see every interleaving of the loads and compare-and-swaps around it.
pub(crate) struct AtomicPair {
    #[cfg(not(tollgate_loom))]
    cell: portable_atomic::AtomicU128,
    #[cfg(tollgate_loom)]
    cell: loom::sync::Mutex<u128>,
}

impl core::fmt::Debug for AtomicPair {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("AtomicPair").field(&self.load(Ordering::Relaxed)).finish()
    }
}

impl AtomicPair {
    fn join([a, b]: [u64; 2]) -> u128 {
        u128::from(a) | u128::from(b) << 64
    }

    fn split(v: u128) -> [u64; 2] {
        #[expect(clippy::cast_possible_truncation, reason = "each half, on purpose")]
        let halves = [v as u64, (v >> 64) as u64];
        halves
    }

    pub(crate) fn new(words: [u64; 2]) -> AtomicPair {
        #[cfg(not(tollgate_loom))]
        let cell = portable_atomic::AtomicU128::new(Self::join(words));
        #[cfg(tollgate_loom)]
        let cell = loom::sync::Mutex::new(Self::join(words));
        AtomicPair { cell }
    }

    /// Both words, read at one instant.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> [u64; 2] {
        #[cfg(not(tollgate_loom))]
        let v = self.cell.load(order);
        #[cfg(tollgate_loom)]
        let v = {
            let _ = order;
            *self.cell.lock().unwrap()
        };
        Self::split(v)
    }

    /// Replaces both words with `new` if they are `current`: `Ok`, or `Err` with what they are.
    #[inline]
    pub(crate) fn compare_exchange(
        &self,
        current: [u64; 2],
        new: [u64; 2],
        success: Ordering,
        failure: Ordering,
    ) -> Result<[u64; 2], [u64; 2]> {
        #[cfg(not(tollgate_loom))]
        let r = self.cell.compare_exchange(Self::join(current), Self::join(new), success, failure);
        #[cfg(tollgate_loom)]
        let r = {
            let _ = (success, failure);
            let mut v = self.cell.lock().unwrap();
            if *v == Self::join(current) {
                *v = Self::join(new);
                Ok(Self::join(current))
            } else {
                Err(*v)
            }
        };
        r.map(Self::split).map_err(Self::split)
    }

    /// Whether the two words are updated without a lock on this machine.
    pub(crate) fn is_lock_free() -> bool {
        #[cfg(not(tollgate_loom))]
        return portable_atomic::AtomicU128::is_lock_free();
        #[cfg(tollgate_loom)]
        return false;
    }
}

/// A pause in a retry loop that waits for another thread's progress (a spin hint; under loom,
/// a yield, so that the model lets the other thread run).
#[inline]
pub(crate) fn pause() {
    #[cfg(not(tollgate_loom))]
    core::hint::spin_loop();
    #[cfg(tollgate_loom)]
    loom::thread::yield_now();
}

/// A number no other call in this process returns: the identity of a limiter, which a
/// multi-limit receipt carries so that it refunds only the limit that issued it. Not part of
/// any modelled protocol, so a plain `std` atomic even under loom.
pub(crate) fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The coarse clock's time (`clock/tsc.rs`): raised to `now` (never lowered), or read. Not part
/// of any modelled protocol, so a plain `std` atomic even under loom. Relaxed: the value is a
/// time, read on its own; no other memory is published with it.
#[cfg(feature = "quanta")]
pub(crate) fn coarse_time(raise_to: Option<u64>) -> u64 {
    static RECENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    match raise_to {
        Some(now) => RECENT.fetch_max(now, std::sync::atomic::Ordering::Relaxed).max(now),
        None => RECENT.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Orders a clock read after the loads before it: a refund reads the clock after loading the
/// word, and needs the reading no earlier than any decision that load saw (`AtomicBucket::refund`).
/// A hardware counter read may otherwise run ahead of an earlier load: on x86_64 an `lfence`
/// (which waits for earlier instructions to complete) goes between them, on aarch64 an `isb`
/// (as Linux does before reading `cntvct_el0`). Under loom, the `Acquire` load that saw the
/// decision's `Release` CAS orders the (atomic) manual clock read already. A custom `Clock`
/// that reads a raw counter on another architecture must order itself after earlier loads.
#[inline]
pub(crate) fn clock_after_loads() {
    #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
    // SAFETY: `lfence` has no operands and no effect on memory; SSE2 is baseline on x86_64.
    unsafe {
        core::arch::x86_64::_mm_lfence();
    }
    #[cfg(all(target_arch = "aarch64", not(tollgate_loom)))]
    // SAFETY: `isb` flushes the pipeline; it reads and writes no memory, registers or flags.
    unsafe {
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
}

/// Clears a flag word (stores 0, `Release`) when dropped: a refund's one-at-a-time flag is
/// released even if the clock it reads panics.
pub(crate) struct ClearOnDrop<'a>(pub(crate) &'a AtomicU64);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}
