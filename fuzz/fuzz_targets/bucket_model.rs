//! Op sequences on one limiter, compared field by field with the exact model of the documented
//! semantics (`tests/common/model.rs`), and each grant with the ideal bucket's bound. Time moves
//! only through `Op::Advance`/`Op::Back` on a `ManualClock`, so every crash replays.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Limiter, ManualClock, Nanos, Rate, TokenBucket};

#[path = "../../tests/common/model.rs"]
mod model;

use model::{refill_bound, Answer, Model};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Back(u32),
    Check,
    CheckN(u16),
    CheckHuge(u64),
    PeekN(u16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    tokens: u64,
    period: u64,
    burst: u32,
    initial: u32,
    start: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let rate = Rate::per(input.tokens, Duration::from_nanos(input.period));
    let Ok(q) = TokenBucket::new(rate, u64::from(input.burst)) else { return };
    let Ok(q) = q.with_initial(u64::from(input.initial) % (q.burst() + 1)) else { return };
    let clock = ManualClock::new();
    clock.set(Nanos::new(input.start));
    let limiter = Limiter::with_clock(q, clock.clone());
    let mut model = Model::new(&q);
    let mut now = input.start;
    // Forward-only time and grants since creation, for the bound from a full start.
    let mut admitted: u128 = 0;
    let mut frontier = input.start;
    for op in input.ops {
        let elapsed = now.saturating_sub(input.start);
        let (got, want, n) = match op {
            Op::Advance(by) => {
                now = now.saturating_add(u64::from(by));
                clock.set(Nanos::new(now));
                continue;
            }
            Op::AdvanceFar(by) => {
                now = now.saturating_add(by);
                clock.set(Nanos::new(now));
                continue;
            }
            Op::Back(by) => {
                now = now.saturating_sub(u64::from(by));
                clock.set(Nanos::new(now));
                continue;
            }
            Op::Check => (limiter.check(), model.decide(elapsed, 1, true), 1),
            Op::CheckN(n) => (limiter.check_n(n.into()), model.decide(elapsed, n.into(), true), n.into()),
            Op::CheckHuge(n) => (limiter.check_n(n), model.decide(elapsed, n, true), n),
            Op::PeekN(n) => (limiter.peek_n(n.into()), model.decide(elapsed, n.into(), false), 0),
        };
        assert_eq!(Answer::of(&got), want, "at {elapsed} ns after start, {q:?}");
        if got.is_allowed() {
            admitted += u128::from(n);
        }
        frontier = frontier.max(now);
        let span = frontier.saturating_sub(input.start).min(q.lifetime().as_u64());
        let bound = u128::from(q.initial()) + refill_bound(&q, span);
        assert!(admitted <= bound, "admitted {admitted} > {bound} over {span} ns, {q:?}");
    }
});
