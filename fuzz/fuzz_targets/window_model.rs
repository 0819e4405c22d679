//! Fixed window: request sequences compared with the exact model (`tests/common/window_model.rs`),
//! on a `ManualClock` moved only by the input.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{FixedWindow, FixedWindowLimiter, ManualClock, Nanos, Outcome};

#[path = "../../tests/common/window_model.rs"]
mod window_model;

use window_model::FixedWindowModel;

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
    limit: u32,
    window: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let Ok(q) = FixedWindow::new(u64::from(input.limit), Duration::from_nanos(input.window)) else { return };
    let limiter = FixedWindowLimiter::with_clock(q, ManualClock::new());
    let mut model = FixedWindowModel::new(u64::from(input.limit), input.window);
    let mut now = 0u64;
    for op in input.ops {
        let n = match op {
            Op::Advance(by) => {
                now = now.saturating_add(u64::from(by));
                continue;
            }
            Op::AdvanceFar(by) => {
                now = now.saturating_add(by);
                continue;
            }
            Op::Back(by) => {
                now = now.saturating_sub(u64::from(by));
                continue;
            }
            Op::Check(n) => u64::from(n),
            Op::CheckHuge(n) => n,
        };
        let d = limiter.check_n_at(Nanos::new(now), n);
        let retry = match d.outcome() {
            Outcome::Denied => d.retry_after_nanos().unwrap().as_u64(),
            _ => 0,
        };
        let got = (d.outcome(), d.remaining(), retry, d.reset_after_nanos().as_u64());
        assert_eq!(got, model.check_n(now, n), "n = {n} at {now} ns");
    }
});
