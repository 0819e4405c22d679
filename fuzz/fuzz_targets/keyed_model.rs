//! Op sequences on a keyed limiter, compared with a `HashMap` of exact models
//! (`tests/common/model.rs`), as `tests/keyed.rs` does: one shard of 64 slots whose window is
//! the whole shard, so the table is full exactly when 56 tracked buckets are not full. With
//! `WhenFull::Deny` or `Allow` every field of every decision must match; with `EvictStalest`
//! every admission must be one a never-evicted bucket would also make. Time only moves forward.

#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Clock, KeyedBuilder, ManualClock, Outcome, Quota, Rate, WhenFull};

#[path = "../../tests/common/model.rs"]
mod model;

use model::{Answer, Model};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Check(u8, u8),
    Peek(u8, u8),
    Sweep,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tokens: u16,
    period: u64,
    burst: u8,
    policy: u8,
    seeds: [u64; 8],
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let rate = Rate::per(u64::from(input.tokens), Duration::from_nanos(input.period % (1 << 40)));
    let Ok(q) = Quota::new(rate, u64::from(input.burst % 8)) else { return };
    let policy = [WhenFull::Deny, WhenFull::Allow, WhenFull::EvictStalest][usize::from(input.policy % 3)];
    let clock = ManualClock::new();
    let Ok(l) = KeyedBuilder::new(q)
        .capacity(56)
        .shards(1)
        .when_full(policy)
        .seeds(input.seeds)
        .build_with_clock::<u64, _>(clock.clone())
    else {
        return;
    };
    let q = l.quota();
    let mut models: HashMap<u64, Model> = HashMap::new();
    for op in input.ops {
        let elapsed = clock.now().as_u64();
        match op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns.into())),
            Op::AdvanceFar(ns) => clock.advance(Duration::from_nanos(ns % (1 << 50))),
            Op::Sweep => {
                l.sweep();
            }
            Op::Peek(k, n) if policy != WhenFull::EvictStalest => {
                let (k, n) = (u64::from(k % 80), u64::from(n % 10));
                let want =
                    models.get(&k).cloned().unwrap_or_else(|| Model::new(&q)).decide(elapsed, n, false);
                assert_eq!(Answer::of(&l.peek_n_at(&k, clock.now(), n)), want);
            }
            Op::Peek(..) => {}
            Op::Check(k, n) => {
                let (k, n) = (u64::from(k % 80), u64::from(n % 10));
                let got = l.check_n(&k, n);
                if policy == WhenFull::EvictStalest {
                    if got.outcome() == Outcome::Allowed && n > 0 {
                        let want = models.entry(k).or_insert_with(|| Model::new(&q)).decide(elapsed, n, true);
                        assert_eq!(want.outcome, Outcome::Allowed, "key {k} over-admitted at {elapsed}");
                    }
                    continue;
                }
                models.retain(|_, m| !m.past_full(elapsed));
                let inserting = n >= 1 && n <= q.burst() && !models.contains_key(&k);
                if inserting && models.len() >= 56 {
                    let want =
                        if policy == WhenFull::Allow { Outcome::Untracked } else { Outcome::TableFull };
                    assert_eq!(got.outcome(), want);
                    continue;
                }
                let want = if inserting || models.contains_key(&k) {
                    models.entry(k).or_insert_with(|| Model::new(&q)).decide(elapsed, n, true)
                } else {
                    Model::new(&q).decide(elapsed, n, true)
                };
                assert_eq!(Answer::of(&got), want, "key {k} cost {n} at {elapsed}");
            }
        }
    }
});
