//! Op sequences on the keyed policy tables (`Keyed<P, u64>`: nginx, fixed window, sliding
//! window), compared with a `HashMap` of the exact models by `tests/common/keyed_models.rs`, as
//! `tests/keyed_policy.rs` does: with `WhenFull::Deny` or `Allow`, every field of every decision
//! must match, and the table must refuse a key exactly when the models say it is full. Time only
//! moves forward.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{FixedWindow, KeyedPolicy, Nginx, SlidingWindow};

#[path = "../../tests/common/keyed_models.rs"]
mod keyed_models;
#[path = "../../tests/common/nginx_model.rs"]
mod nginx_model;
#[path = "../../tests/common/window_model.rs"]
mod window_model;

use keyed_models::{compare, RefModel};
use nginx_model::NginxModel;
use window_model::{FixedWindowModel, SlidingWindowModel};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceMs(u16),
    Check(u8, u8),
    Peek(u8, u8),
    Sweep,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    /// nginx: rate, burst, delay (0xff: nodelay), per minute; windows: limit, window.
    a: u16,
    b: u8,
    c: u8,
    d: bool,
    window_ns: u32,
    fail_open: bool,
    seeds: [u64; 8],
    ops: Vec<Op>,
}

impl Input {
    /// The input's ops in the comparison's terms: 80 keys, costs up to `most + 1`.
    fn ops(&self, most: u64) -> impl Iterator<Item = keyed_models::Op> + '_ {
        self.ops.iter().map(move |op| match *op {
            Op::Advance(ns) => keyed_models::Op::Advance(ns.into()),
            Op::AdvanceMs(ms) => keyed_models::Op::Advance(u64::from(ms) * 1_000_000),
            Op::Check(k, n) => keyed_models::Op::Check(u64::from(k % 80), u64::from(n) % (most + 2)),
            Op::Peek(k, n) => keyed_models::Op::Peek(u64::from(k % 80), u64::from(n) % (most + 2)),
            Op::Sweep => keyed_models::Op::Sweep,
        })
    }

    fn run<P: KeyedPolicy, M: RefModel>(&self, p: P, fresh: impl Fn() -> M, most: u64) {
        if let Err(e) = compare(p, fresh, most, self.ops(most), self.fail_open, self.seeds) {
            panic!("{e}");
        }
    }
}

fuzz_target!(|input: Input| {
    match input.kind % 3 {
        0 => {
            let rate = u64::from(input.a % 5_000) + 1;
            let burst = u64::from(input.b % 12);
            let delay = (input.c != 0xff).then_some(u64::from(input.c % 14));
            let base = if input.d { Nginx::per_minute(rate) } else { Nginx::per_second(rate) };
            let q = base.unwrap().burst(burst).unwrap();
            let q = match delay {
                Some(d) => q.delay(d),
                None => q.nodelay(),
            };
            let model = NginxModel::new(rate, if input.d { 60 } else { 1 }, burst, delay);
            input.run(q, || model.clone(), burst + 1);
        }
        1 => {
            let limit = u64::from(input.a % 12) + 1;
            // At least 1 µs: the keyed lifetime (2^38 − 4 windows) then outlasts any input.
            let window = u64::from(input.window_ns).max(1_000);
            let p = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
            input.run(p, || FixedWindowModel::new(limit, window), limit);
        }
        _ => {
            let limit = u64::from(input.a % 12) + 1;
            // At least 1 ms: the direct limiter's 100-year lifetime rule.
            let window = u64::from(input.window_ns).max(1_000_000);
            let p = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
            input.run(p, || SlidingWindowModel::new(limit, window), limit);
        }
    }
});
