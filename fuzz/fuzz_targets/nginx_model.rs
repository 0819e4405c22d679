//! nginx `limit_req`: arrival sequences compared with the exact model of the module's algorithm
//! (`tests/common/nginx_model.rs`), on a `ManualClock` moved only by the input.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{ManualClock, Nanos, Nginx, NginxLimiter, Outcome};

#[path = "../../tests/common/nginx_model.rs"]
mod nginx_model;

use nginx_model::NginxModel;

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Back(u32),
    Check,
}

#[derive(Arbitrary, Debug)]
struct Input {
    rate: u32,
    per_minute: bool,
    burst: u16,
    delay: Option<u8>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let rate = u64::from(input.rate);
    let scale = if input.per_minute { 60 } else { 1 };
    let base = if input.per_minute { Nginx::per_minute(rate) } else { Nginx::per_second(rate) };
    let Ok(base) = base else { return };
    let Ok(q) = base.burst(u64::from(input.burst)) else { return };
    let q = match input.delay {
        Some(d) => q.delay(u64::from(d)),
        None => q.nodelay(),
    };
    let limiter = NginxLimiter::with_clock(q, ManualClock::new());
    let mut model = NginxModel::new(rate, scale, u64::from(input.burst), input.delay.map(u64::from));
    let mut now = 0u64;
    for op in input.ops {
        match op {
            Op::Advance(by) => now = now.saturating_add(u64::from(by)),
            Op::AdvanceFar(by) => now = now.saturating_add(by),
            Op::Back(by) => now = now.saturating_sub(u64::from(by)),
            Op::Check => {
                let d = limiter.check_at(Nanos::new(now));
                let wait = match d.outcome() {
                    Outcome::Denied => d.retry_after().unwrap(),
                    _ => d.delay(),
                };
                let got = (
                    d.outcome(),
                    d.remaining(),
                    u64::try_from(wait.as_millis()).unwrap(),
                    u64::try_from(d.reset_after().as_millis()).unwrap(),
                );
                assert_eq!(got, model.check(now), "at {now} ns");
            }
        }
    }
});
