//! Sliding log, direct and keyed: request sequences compared with the definition unit by unit
//! (`tests/common/log_model.rs`) on a `ManualClock` moved only by the input, with charges that
//! are refunded at once (multi-limit admission), direct and per key, leaving no trace.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Admit, KeyedSlidingLog, ManualClock, Nanos, SlidingLog, SlidingLogLimiter};

#[path = "../../tests/common/log_model.rs"]
mod log_model;

use log_model::{LogAnswer, LogModel};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Back(u32),
    Check { key: u8, n: u8 },
    Peek { key: u8, n: u8 },
    ChargeAndRefund(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    limit: u16,
    window: u64,
    ops: Vec<Op>,
}

fn answer(d: &tollgate::Decision) -> LogAnswer {
    let retry =
        if d.outcome() == tollgate::Outcome::Denied { d.retry_after_nanos().unwrap().as_u64() } else { 0 };
    (d.outcome(), d.remaining(), retry, d.reset_after_nanos().as_u64())
}

fuzz_target!(|input: Input| {
    let limit = u64::from(input.limit) % 64 + 1;
    let Ok(log) = SlidingLog::new(limit, Duration::from_nanos(input.window)) else { return };
    let window = log.window().as_nanos() as u64;
    let clock = ManualClock::new();
    let direct = SlidingLogLimiter::with_clock(log, clock.clone());
    let keyed = KeyedSlidingLog::<u8>::builder(log).capacity(64).build_with_clock(clock.clone()).unwrap();
    let mut direct_model = LogModel::new(limit, window);
    let mut models: Vec<LogModel> = (0..4).map(|_| LogModel::new(limit, window)).collect();
    let mut now = 0u64;
    // The keyed table's times must not run back (`KeyedSlidingLog::check_n_at`): its keys are
    // decided at the latest time so far.
    let mut keyed_now = 0u64;
    // After a refund the log is exact from the charge's instant on, and stricter before it:
    // the model (which never saw the charge) is exact only while the clock does not step back.
    let mut refunded = false;
    const MAX_NOW: u64 = 1 << 62;
    for op in input.ops {
        match op {
            Op::Advance(by) => now = now.saturating_add(u64::from(by)).min(MAX_NOW),
            Op::AdvanceFar(by) => now = now.saturating_add(by).min(MAX_NOW),
            Op::Back(by) if !refunded => now = now.saturating_sub(u64::from(by)),
            Op::Back(_) => {}
            Op::Check { key, n } => {
                let (n, at) = (u64::from(n % 8), Nanos::new(now));
                assert_eq!(answer(&direct.check_n_at(at, n)), direct_model.check_n(now, n, true));
                let key = key % 4;
                keyed_now = keyed_now.max(now);
                let got = keyed.check_n_at(&key, Nanos::new(keyed_now), n);
                assert_eq!(answer(&got), models[usize::from(key)].check_n(keyed_now, n, true), "key {key}");
            }
            Op::Peek { key, n } => {
                let (n, at) = (u64::from(n % 8), Nanos::new(now));
                assert_eq!(answer(&direct.peek_n_at(at, n)), direct_model.check_n(now, n, false));
                let key = key % 4;
                keyed_now = keyed_now.max(now);
                let got = keyed.peek_n_at(&key, Nanos::new(keyed_now), n);
                assert_eq!(answer(&got), models[usize::from(key)].check_n(keyed_now, n, false), "key {key}");
            }
            Op::ChargeAndRefund(n) => {
                clock.set(Nanos::new(now));
                let n = u64::from(n % 8);
                let before: Vec<_> = (0..=8).map(|k| direct.peek_n_at(Nanos::new(now), k)).collect();
                if let (_, Some(receipt)) = direct.charge(n) {
                    direct.refund(receipt);
                    refunded = true;
                }
                let after: Vec<_> = (0..=8).map(|k| direct.peek_n_at(Nanos::new(now), k)).collect();
                assert_eq!(before, after, "a charge refunded at once leaves no trace");
                // The same for one key of the keyed table, whose times never run back: its model
                // never sees the charge and stays exact.
                if now >= keyed_now {
                    keyed_now = now;
                    let key = (n % 4) as u8;
                    let at = Nanos::new(now);
                    let before: Vec<_> = (0..=8).map(|k| keyed.peek_n_at(&key, at, k)).collect();
                    let limit = keyed.limit(&key);
                    if let (_, Some(receipt)) = limit.charge(n) {
                        limit.refund(receipt);
                    }
                    let after: Vec<_> = (0..=8).map(|k| keyed.peek_n_at(&key, at, k)).collect();
                    assert_eq!(before, after, "a keyed charge refunded at once leaves no trace");
                }
            }
        }
    }
});
