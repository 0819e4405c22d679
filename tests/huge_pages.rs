//! Issue 14: a large keyed table is on huge pages whatever the allocator was given back before.
//!
//! glibc serves a large block from recycled heap memory once a block of that size has been
//! freed (it raises its mmap threshold), and those pages are already faulted in as 4 KiB pages:
//! `madvise(MADV_HUGEPAGE)` on them does nothing. The tables now map their large arrays
//! themselves (`src/keyed/pages.rs`), so a table built after large frees still gets huge pages
//! where transparent huge pages are on, and `stats().huge_page_bytes` says how much.

#![cfg(target_os = "linux")]

use std::hint::black_box;
use std::time::Duration;

use tollgate::{KeyedLimiter, KeyedSlidingLog, SlidingLog, TokenBucket};

/// Whether transparent huge pages serve `madvise` requests here.
fn thp_on() -> bool {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    mode.contains("[always]") || mode.contains("[madvise]")
}

/// Large blocks allocated, touched and freed, as a long-running process does before it builds
/// a table. Freeing the 30 MiB block (mmapped) raises glibc's mmap threshold to 30 MiB; the
/// 20 MiB blocks then come from the heap and go back to it, touched: a 20 MiB `Vec` allocated
/// next reuses them, and `madvise` gets it no huge page (0 of 20 MiB on the machine this was
/// written on, against 18 of 20 without the churn).
fn churn_the_heap() {
    for mib in [30usize, 20, 20] {
        let v = vec![1u8; mib << 20];
        black_box(&v);
    }
}

#[test]
fn a_table_built_after_large_frees_is_on_huge_pages() {
    churn_the_heap();
    let l =
        KeyedLimiter::<u64>::builder(TokenBucket::per_second(10).unwrap()).capacity(1 << 19).build().unwrap();
    let s = l.stats();
    assert!(s.memory_bytes >= 16 << 20, "{}", s.memory_bytes);
    if !thp_on() {
        eprintln!("transparent huge pages are off here: nothing to check");
        assert_eq!(s.huge_page_bytes, 0);
        return;
    }
    eprintln!("{} of {} bytes on huge pages", s.huge_page_bytes, s.memory_bytes);
    assert!(s.huge_page_bytes > 0, "no huge pages after the heap was churned: {s:?}");
    assert!(s.huge_page_bytes <= s.memory_bytes);
}

#[test]
fn a_sliding_log_table_built_after_large_frees_is_on_huge_pages() {
    churn_the_heap();
    let log = SlidingLog::new(4, Duration::from_secs(1)).unwrap();
    let l = KeyedSlidingLog::<u64>::builder(log).capacity(1 << 18).build().unwrap();
    let s = l.stats();
    if !thp_on() {
        assert_eq!(s.huge_page_bytes, 0);
        return;
    }
    eprintln!("{} of {} bytes on huge pages", s.huge_page_bytes, s.memory_bytes);
    assert!(s.huge_page_bytes > 0, "no huge pages after the heap was churned: {s:?}");
}

#[test]
fn small_tables_report_no_huge_pages() {
    let l =
        KeyedLimiter::<u64>::builder(TokenBucket::per_second(10).unwrap()).capacity(1000).build().unwrap();
    assert_eq!(l.stats().huge_page_bytes, 0);
}

/// Issue 38: a large flow meter table (every core's and the shared one) is on huge pages too,
/// with its slots aligned: a flow's slot in one cache line.
#[test]
fn flow_meter_tables_are_on_huge_pages() {
    use tollgate::{FlowMeters, Meter, Nanos, SharedFlowMeters};
    churn_the_heap();
    let meter: Meter = "trtcm cir=10Mbit/s cbs=16KiB pir=20Mbit/s pbs=32KiB".parse().unwrap();
    let mut one = FlowMeters::<u64>::new(meter, 1 << 18).unwrap();
    let shared = SharedFlowMeters::<u64>::new(meter, 1 << 18).unwrap();
    for k in 0..1000u64 {
        one.check(&k, Nanos::ZERO, 64);
        shared.check(&k, Nanos::ZERO, 64);
    }
    let small = FlowMeters::<u64>::new(meter, 64).unwrap();
    assert_eq!(small.huge_page_bytes(), 0);
    if !thp_on() {
        assert_eq!((one.huge_page_bytes(), shared.huge_page_bytes()), (0, 0));
        return;
    }
    eprintln!("{} and {} bytes on huge pages", one.huge_page_bytes(), shared.huge_page_bytes());
    assert!(one.huge_page_bytes() > 0 && shared.huge_page_bytes() > 0);
}
