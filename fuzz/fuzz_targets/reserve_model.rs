//! Reservations, cancels, checks and `check_all` charges and refunds on one limiter, or on four
//! keys of a keyed table, compared field by field with the exact model (`tests/common/model.rs`,
//! one per key): every reservation's delay or refusal, every cancel's and refund's effect, and
//! the state after each step. Time moves only through `Op::Advance`/`Op::Back` on a
//! `ManualClock` (only forward for a keyed table, its contract), so every crash replays.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{
    Admit, Cancelled, Decision, KeyedLimiter, Limiter, ManualClock, Nanos, Rate, Receipt, Reservation,
    ReserveError, TokenBucket,
};

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
    /// The key the next operations act on (keyed tables; the direct limiter has one).
    Key(u8),
}

/// The limiter under test: direct, or a keyed table (keys 0 to 3).
enum Subject {
    Direct(Limiter<ManualClock>),
    Keyed(KeyedLimiter<u64, ManualClock>),
}

impl Subject {
    fn check(&self, key: u64, now: u64, n: u64) -> Decision {
        match self {
            Subject::Direct(l) => l.check_n_at(Nanos::new(now), n),
            Subject::Keyed(l) => l.check_n_at(&key, Nanos::new(now), n),
        }
    }
    fn peek(&self, key: u64, now: u64, n: u64) -> Decision {
        match self {
            Subject::Direct(l) => l.peek_n_at(Nanos::new(now), n),
            Subject::Keyed(l) => l.peek_n_at(&key, Nanos::new(now), n),
        }
    }
    fn reserve(&self, key: u64, now: u64, n: u64, max_wait: Duration) -> Result<Reservation, ReserveError> {
        match self {
            Subject::Direct(l) => l.reserve_n_at(Nanos::new(now), n, max_wait),
            Subject::Keyed(l) => l.reserve_n_at(&key, Nanos::new(now), n, max_wait),
        }
    }
    fn cancel(&self, key: u64, now: u64, r: Reservation) -> Cancelled {
        match self {
            Subject::Direct(l) => l.cancel_at(Nanos::new(now), r),
            Subject::Keyed(l) => l.cancel_at(&key, Nanos::new(now), r),
        }
    }
    fn charge(&self, key: u64, now: u64, n: u64) -> (Decision, Option<Receipt>) {
        match self {
            Subject::Direct(l) => {
                l.clock().set(Nanos::new(now));
                Admit::charge(l, n)
            }
            Subject::Keyed(l) => {
                l.clock().set(Nanos::new(now));
                Admit::charge(&l.limit(&key), n)
            }
        }
    }
    fn refund(&self, key: u64, now: u64, r: Receipt) {
        match self {
            Subject::Direct(l) => {
                l.clock().set(Nanos::new(now));
                Admit::refund(l, r);
            }
            Subject::Keyed(l) => {
                l.clock().set(Nanos::new(now));
                Admit::refund(&l.limit(&key), r);
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    tokens: u64,
    period: u64,
    burst: u16,
    initial: u16,
    keyed: bool,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let rate = Rate::per(input.tokens, Duration::from_nanos(input.period));
    let Ok(q) = TokenBucket::new(rate, u64::from(input.burst)) else { return };
    let Ok(q) = q.with_initial(u64::from(input.initial) % (q.burst() + 1)) else { return };
    let (limiter, keys, end) = if input.keyed {
        // Keyed tables start every key full (`initial` below the burst is refused).
        let Ok(l) = KeyedLimiter::<u64>::builder(q.with_initial(q.burst()).expect("the burst"))
            .capacity(64)
            .build_with_clock(ManualClock::new())
        else {
            return;
        };
        // Time stays a fill short of the table's lifetime: past it nothing refills (which the
        // model does not know), and in its last fill a reservation's debt would pass the
        // largest word a slot holds, so the table refuses it.
        let end = l.lifetime().as_u64().saturating_sub(q.fill_time().as_u64() + 1);
        (Subject::Keyed(l), 4, end)
    } else {
        (Subject::Direct(Limiter::with_clock(q, ManualClock::new())), 1, u64::MAX)
    };
    let q = if input.keyed { q.with_initial(q.burst()).expect("the burst") } else { q };
    let mut models: Vec<Model> = (0..keys).map(|_| Model::new(&q)).collect();
    let mut key = 0u64;
    let mut now = 0u64;
    let mut open = Vec::new();
    let mut receipts = Vec::new();
    for op in input.ops {
        let model = &mut models[key as usize];
        match op {
            Op::Key(k) => key = u64::from(k) % keys,
            Op::Advance(by) => now = now.saturating_add(u64::from(by)).min(end),
            Op::AdvanceFar(by) => now = now.saturating_add(by).min(end),
            Op::Back(by) => {
                if !input.keyed {
                    now = now.saturating_sub(u64::from(by));
                }
            }
            Op::CheckN(n) => {
                let got = limiter.check(key, now, n.into());
                assert_eq!(
                    Answer::of(&got),
                    model.decide(now, n.into(), true),
                    "check_n({n}) at {now}, {q:?}"
                );
            }
            Op::PeekN(n) => {
                let got = limiter.peek(key, now, n.into());
                assert_eq!(
                    Answer::of(&got),
                    model.decide(now, n.into(), false),
                    "peek_n({n}) at {now}, {q:?}"
                );
            }
            Op::Reserve(n, wait) => {
                let max_wait = wait.map_or(Duration::MAX, Duration::from_nanos);
                let got = limiter.reserve(key, now, n.into(), max_wait);
                match (got, model.reserve(now, n.into(), wait.unwrap_or(u64::MAX))) {
                    (Ok(r), Ok(m)) => {
                        assert_eq!(
                            r.delay(),
                            Duration::from_nanos(m.wait_ns),
                            "reserve({n}) at {now}, {q:?}"
                        );
                        open.push((key, r, m));
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
                let (k, r, m) = open.remove(usize::from(i) % open.len());
                let model = &mut models[k as usize];
                let want = if model.cancel(now, &m) { Cancelled::Returned } else { Cancelled::NothingOwed };
                assert_eq!(limiter.cancel(k, now, r), want, "cancel at {now} of {m:?}, {q:?}");
            }
            Op::Charge(n) => {
                let (got, receipt) = limiter.charge(key, now, n.into());
                let (want, taken) = model.charge(now, n.into());
                assert_eq!(Answer::of(&got), want, "charge({n}) at {now}, {q:?}");
                assert_eq!(receipt.is_some(), taken.is_some());
                if let (Some(r), Some(m)) = (receipt, taken) {
                    receipts.push((key, r, m));
                }
            }
            Op::Refund(i) => {
                if receipts.is_empty() {
                    continue;
                }
                let (k, r, m) = receipts.remove(usize::from(i) % receipts.len());
                limiter.refund(k, now, r);
                models[k as usize].cancel(now, &m);
            }
        }
        for (k, model) in models.iter_mut().enumerate() {
            let state = limiter.peek(k as u64, now, 1);
            assert_eq!(Answer::of(&state), model.decide(now, 1, false), "key {k}'s state at {now}, {q:?}");
        }
    }
});
