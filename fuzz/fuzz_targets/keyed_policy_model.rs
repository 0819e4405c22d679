//! Op sequences on the keyed policy tables (`Keyed<P, u64>`: nginx, fixed window, sliding
//! window), compared with a `HashMap` of the exact models (`tests/common/`), as
//! `tests/keyed_policy.rs` does: one shard of 64 slots whose window is the whole shard, so the
//! table is full exactly when 56 tracked keys are not evictable (each model states the line).
//! With `WhenFull::Deny` or `Allow`, every field of every decision must match. Time only moves
//! forward.

#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{
    Clock, Decision, FixedWindow, Keyed, KeyedPolicy, ManualClock, NginxQuota, Outcome, SlidingWindow, WhenFull,
};

#[path = "../../tests/common/nginx_model.rs"]
mod nginx_model;
#[path = "../../tests/common/window_model.rs"]
mod window_model;

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

/// (outcome, remaining, wait, reset) in the model's units.
type Ans = (Outcome, u64, u64, u64);

fn nginx_answer(d: &Decision) -> Ans {
    let wait = match d.outcome() {
        Outcome::Denied => d.retry_after().unwrap(),
        _ => d.delay(),
    };
    let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap();
    (d.outcome(), d.remaining(), ms(wait), ms(d.reset_after()))
}

trait RefModel {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans;
    fn evictable(&self, now_ns: u64) -> bool;
}

impl RefModel for NginxModel {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans {
        NginxModel::check_n(self, now_ns, n)
    }
    fn evictable(&self, now_ns: u64) -> bool {
        NginxModel::evictable(self, now_ns)
    }
}

impl RefModel for FixedWindowModel {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans {
        FixedWindowModel::check_n(self, now_ns, n)
    }
    fn evictable(&self, now_ns: u64) -> bool {
        FixedWindowModel::evictable(self, now_ns)
    }
}

impl RefModel for SlidingWindowModel {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans {
        SlidingWindowModel::check_n(self, now_ns, n)
    }
    fn evictable(&self, now_ns: u64) -> bool {
        SlidingWindowModel::evictable(self, now_ns)
    }
}

fn run<P: KeyedPolicy, M: RefModel + Clone>(
    p: P,
    fresh: impl Fn() -> M,
    answer: fn(&Decision) -> Ans,
    most: u64,
    input: &Input,
) {
    let clock = ManualClock::new();
    let when_full = if input.fail_open { WhenFull::Allow } else { WhenFull::Deny };
    let l = Keyed::builder(p)
        .capacity(56)
        .shards(1)
        .when_full(when_full)
        .seeds(input.seeds)
        .build_with_clock::<u64, _>(clock.clone())
        .unwrap();
    let mut models: HashMap<u64, M> = HashMap::new();
    for op in &input.ops {
        let now = clock.now().as_u64();
        match *op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns.into())),
            Op::AdvanceMs(ms) => clock.advance(Duration::from_millis(ms.into())),
            Op::Sweep => {
                l.sweep();
            }
            Op::Peek(k, n) => {
                let (k, n) = (u64::from(k % 80), u64::from(n) % (most + 2));
                let want = models.get(&k).cloned().unwrap_or_else(&fresh).check_n(now, n);
                assert_eq!(answer(&l.peek_n_at(&k, clock.now(), n)), want, "peek {k} {n} at {now}");
            }
            Op::Check(k, n) => {
                let (k, n) = (u64::from(k % 80), u64::from(n) % (most + 2));
                let got = l.check_n(&k, n);
                models.retain(|_, m| !m.evictable(now));
                let inserting = n >= 1 && n <= most && !models.contains_key(&k);
                if inserting && models.len() >= 56 {
                    let want = if input.fail_open { Outcome::Untracked } else { Outcome::TableFull };
                    assert_eq!(got.outcome(), want);
                    continue;
                }
                let want = if inserting || models.contains_key(&k) {
                    models.entry(k).or_insert_with(&fresh).check_n(now, n)
                } else {
                    fresh().check_n(now, n)
                };
                assert_eq!(answer(&got), want, "key {k} cost {n} at {now}");
            }
        }
        assert!(l.len() <= 56);
    }
}

fuzz_target!(|input: Input| {
    match input.kind % 3 {
        0 => {
            let rate = u64::from(input.a % 5_000) + 1;
            let burst = u64::from(input.b % 12);
            let delay = (input.c != 0xff).then_some(u64::from(input.c % 14));
            let base = if input.d { NginxQuota::per_minute(rate) } else { NginxQuota::per_second(rate) };
            let q = base.unwrap().burst(burst).unwrap();
            let q = match delay {
                Some(d) => q.delay(d),
                None => q.nodelay(),
            };
            let model = NginxModel::new(rate, if input.d { 60 } else { 1 }, burst, delay);
            run(q, || model.clone(), nginx_answer, burst + 1, &input);
        }
        1 => {
            let limit = u64::from(input.a % 12) + 1;
            // At least 1 µs: the keyed lifetime (2^38 − 2 windows) then outlasts any input.
            let window = u64::from(input.window_ns).max(1_000);
            let p = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
            run(p, || FixedWindowModel::new(limit, window), window_model::answer, limit, &input);
        }
        _ => {
            let limit = u64::from(input.a % 12) + 1;
            // At least 1 ms: the direct limiter's 100-year lifetime rule.
            let window = u64::from(input.window_ns).max(1_000_000);
            let p = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
            run(p, || SlidingWindowModel::new(limit, window), window_model::answer, limit, &input);
        }
    }
});
