//! Reservations, cancels, checks and `check_all` charges and refunds on one limiter, compared
//! field by field with the exact model (`tests/common/model.rs`): every reservation's delay or
//! refusal, every cancel's and refund's effect, and the state after each step. Time moves only
//! through `Op::Advance`/`Op::Back` on a `ManualClock`, so every crash replays.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Admit, Cancelled, Limiter, ManualClock, Nanos, Rate, ReserveError, TokenBucket};

#[path = "../../tests/common/model.rs"]
mod model;

use model::{Answer, Model, ModelRefusal};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Back(u32),
    CheckN(u16),
    PeekN(u16),
    /// `n`, and a max wait in ns (`None`: no limit).
    Reserve(u16, Option<u64>),
    Cancel(u16),
    Charge(u16),
    Refund(u16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    tokens: u64,
    period: u64,
    burst: u16,
    initial: u16,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let rate = Rate::per(input.tokens, Duration::from_nanos(input.period));
    let Ok(q) = TokenBucket::new(rate, u64::from(input.burst)) else { return };
    let Ok(q) = q.with_initial(u64::from(input.initial) % (q.burst() + 1)) else { return };
    let limiter = Limiter::with_clock(q, ManualClock::new());
    let mut model = Model::new(&q);
    let mut now = 0u64;
    let mut open = Vec::new();
    let mut receipts = Vec::new();
    for op in input.ops {
        match op {
            Op::Advance(by) => now = now.saturating_add(u64::from(by)),
            Op::AdvanceFar(by) => now = now.saturating_add(by),
            Op::Back(by) => now = now.saturating_sub(u64::from(by)),
            Op::CheckN(n) => {
                let got = limiter.check_n_at(Nanos::new(now), n.into());
                assert_eq!(Answer::of(&got), model.decide(now, n.into(), true), "check_n({n}) at {now}, {q:?}");
            }
            Op::PeekN(n) => {
                let got = limiter.peek_n_at(Nanos::new(now), n.into());
                assert_eq!(Answer::of(&got), model.decide(now, n.into(), false), "peek_n({n}) at {now}, {q:?}");
            }
            Op::Reserve(n, wait) => {
                let max_wait = wait.map_or(Duration::MAX, Duration::from_nanos);
                let got = limiter.reserve_n_at(Nanos::new(now), n.into(), max_wait);
                match (got, model.reserve(now, n.into(), wait.unwrap_or(u64::MAX))) {
                    (Ok(r), Ok(m)) => {
                        assert_eq!(r.delay(), Duration::from_nanos(m.wait_ns), "reserve({n}) at {now}, {q:?}");
                        open.push((r, m));
                    }
                    (Err(ReserveError::Insufficient { .. }), Err(ModelRefusal::Insufficient)) => {}
                    (Err(ReserveError::TooLate { wait, .. }), Err(ModelRefusal::TooLate { wait_ns })) => {
                        assert_eq!(wait, Duration::from_nanos(wait_ns), "reserve({n}) at {now}, {q:?}");
                    }
                    (got, want) => panic!("reserve({n}) at {now}: {got:?} vs the model's {want:?}, {q:?}"),
                }
            }
            Op::Cancel(i) => {
                if open.is_empty() {
                    continue;
                }
                let (r, m) = open.remove(usize::from(i) % open.len());
                let want = if model.cancel(now, &m) { Cancelled::Returned } else { Cancelled::NothingOwed };
                assert_eq!(limiter.cancel_at(Nanos::new(now), r), want, "cancel at {now} of {m:?}, {q:?}");
            }
            Op::Charge(n) => {
                limiter.clock().set(Nanos::new(now));
                let (got, receipt) = Admit::charge(&limiter, n.into());
                let (want, taken) = model.charge(now, n.into());
                assert_eq!(Answer::of(&got), want, "charge({n}) at {now}, {q:?}");
                assert_eq!(receipt.is_some(), taken.is_some());
                if let (Some(r), Some(m)) = (receipt, taken) {
                    receipts.push((r, m));
                }
            }
            Op::Refund(i) => {
                if receipts.is_empty() {
                    continue;
                }
                let (r, m) = receipts.remove(usize::from(i) % receipts.len());
                limiter.clock().set(Nanos::new(now));
                Admit::refund(&limiter, r);
                model.cancel(now, &m);
            }
        }
        let state = limiter.peek_n_at(Nanos::new(now), 1);
        assert_eq!(Answer::of(&state), model.decide(now, 1, false), "state at {now}, {q:?}");
    }
});
