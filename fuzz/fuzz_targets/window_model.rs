//! Fixed window and sliding-window counter: request sequences compared with the exact models
//! (`tests/common/window_model.rs`), on a `ManualClock` moved only by the input.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{FixedWindow, FixedWindowLimiter, ManualClock, Nanos, SlidingWindow, SlidingWindowLimiter};

#[path = "../../tests/common/window_model.rs"]
mod window_model;

use window_model::{answer, FixedWindowModel, SlidingWindowModel, WindowAnswer};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Back(u32),
    Check(u8),
    CheckHuge(u64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    sliding: bool,
    limit: u32,
    window: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let (limit, window) = (u64::from(input.limit), Duration::from_nanos(input.window));
    if input.sliding {
        let Ok(q) = SlidingWindow::new(limit, window) else { return };
        let limiter = SlidingWindowLimiter::with_clock(q, ManualClock::new());
        let mut model = SlidingWindowModel::new(limit, input.window);
        // The model has no index saturation: keep time within the lifetime (≥ 100 years).
        run(input.ops, 1 << 61, |now, n| {
            (answer(&limiter.check_n_at(Nanos::new(now), n)), model.check_n(now, n))
        });
    } else {
        let Ok(q) = FixedWindow::new(limit, window) else { return };
        let limiter = FixedWindowLimiter::with_clock(q, ManualClock::new());
        let mut model = FixedWindowModel::new(limit, input.window);
        run(input.ops, u64::MAX, |now, n| {
            (answer(&limiter.check_n_at(Nanos::new(now), n)), model.check_n(now, n))
        });
    }
});

fn run(ops: Vec<Op>, max_now: u64, mut decide: impl FnMut(u64, u64) -> (WindowAnswer, WindowAnswer)) {
    let mut now = 0u64;
    for op in ops {
        let n = match op {
            Op::Advance(by) => {
                now = now.saturating_add(u64::from(by)).min(max_now);
                continue;
            }
            Op::AdvanceFar(by) => {
                now = now.saturating_add(by).min(max_now);
                continue;
            }
            Op::Back(by) => {
                now = now.saturating_sub(u64::from(by));
                continue;
            }
            Op::Check(n) => u64::from(n),
            Op::CheckHuge(n) => n,
        };
        let (got, want) = decide(now, n);
        assert_eq!(got, want, "n = {n} at {now} ns");
    }
}
