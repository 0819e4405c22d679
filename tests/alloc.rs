//! The decision path allocates nothing: a counting global allocator watches this thread while
//! it decides on every clock.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate::{Clock, Limiter, ManualClock, Nanos, StdClock, TokenBucket};

struct Counting;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to `System` unchanged; it only counts on the watching thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if WATCHING.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if WATCHING.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: as in `dealloc`, and the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    WATCHING.with(|w| w.set(true));
    f();
    WATCHING.with(|w| w.set(false));
    COUNT.with(Cell::get)
}

fn exercise<C: Clock>(limiter: &Limiter<C>) {
    for i in 0..20_000u64 {
        let _ = std::hint::black_box(limiter.check());
        let _ = std::hint::black_box(limiter.check_n(i % 7));
        let _ = std::hint::black_box(limiter.check_n(u64::MAX));
        let _ = std::hint::black_box(limiter.peek());
        let _ = std::hint::black_box(limiter.allow());
        let _ = std::hint::black_box(limiter.check_n_at(Nanos::new(i * 1_000), 2));
    }
}

#[test]
fn the_decision_path_never_allocates() {
    let q = TokenBucket::per_second(1_000).unwrap();
    // Construction may allocate (clock calibration, the upkeep thread); decisions may not.
    let tsc = Limiter::new(q);
    let coarse = Limiter::with_clock(q, tollgate::CoarseClock::new().unwrap());
    let std = Limiter::with_clock(q, StdClock::new());
    let manual = Limiter::with_clock(q, ManualClock::new());
    let n = allocations_during(|| {
        exercise(&tsc);
        exercise(&coarse);
        exercise(&std);
        exercise(&manual);
    });
    assert_eq!(n, 0, "the decision path allocated {n} times");
    // The sliding logs, direct and keyed (inserts, take-overs and refusals included).
    let log = tollgate::SlidingLog::new(4, std::time::Duration::from_micros(50)).unwrap();
    let direct = tollgate::SlidingLogLimiter::new(log);
    let keyed = tollgate::KeyedSlidingLog::<u64>::builder(log).capacity(256).build().unwrap();
    let n = allocations_during(|| {
        for i in 0..50_000u64 {
            let _ = std::hint::black_box(direct.check_n(i % 6));
            let _ = std::hint::black_box(keyed.check_n(&(i % 2048), i % 6));
        }
    });
    assert_eq!(n, 0, "the sliding log allocated {n} times");
    // The counter works: a Vec allocates.
    assert_eq!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))), 1);
}
