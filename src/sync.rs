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
