//! Op sequences on a keyed limiter, compared with a `HashMap` of exact models
//! (`tests/common/model.rs`), as `tests/keyed.rs` does: one shard of 64 slots whose window is
//! the whole shard, so the table is full exactly when 56 tracked buckets are younger than the
//! largest fill. Three tiers from a pool of quotas exact at 1 ns, per-key overrides, per-call
//! tiers and runtime quota changes (a bucket keeps its empty instant: `Model::requote`). With
//! `WhenFull::Deny` or `Allow` every field of every decision must match; with `EvictFullest`
//! every admission must be one a never-evicted bucket would also make. Time only moves forward.

#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Clock, KeyedLimiter, ManualClock, Outcome, Rate, Tier, TokenBucket, WhenFull};

#[path = "../../tests/common/model.rs"]
mod model;

use model::{Answer, Model};

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceFar(u64),
    Check(u8, u8),
    CheckIn(u8, u8, u8),
    Peek(u8, u8),
    Sweep,
    SetOverride(u8, u8),
    ClearOverride(u8),
    SetTierQuota(u8, u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    picks: [u8; 3],
    headroom_ms: u16,
    policy: u8,
    seeds: [u64; 8],
    ops: Vec<Op>,
}

/// Quotas exact at 1 ns: `tokens` divides 10^6.
const POOL: [(u64, u64, u64); 8] =
    [(1, 100, 1), (2, 10, 3), (5, 1_000, 5), (10, 50, 2), (4, 7, 4), (8, 300, 8), (1, 1, 1), (5, 2_000, 9)];

fn quota(i: u8) -> TokenBucket {
    let (tokens, ms, burst) = POOL[usize::from(i) % POOL.len()];
    TokenBucket::new(Rate::per(tokens, Duration::from_millis(ms)), burst).unwrap()
}

fuzz_target!(|input: Input| {
    let policy = [WhenFull::Deny, WhenFull::Allow, WhenFull::EvictFullest][usize::from(input.policy % 3)];
    let headroom = Duration::from_millis(u64::from(input.headroom_ms % 5_000));
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64>::builder(quota(input.picks[0]))
        .tier("pro", quota(input.picks[1]))
        .tier("free", quota(input.picks[2]))
        .max_fill_time(headroom)
        .capacity(56)
        .shards(1)
        .max_overrides(16)
        .when_full(policy)
        .seeds(input.seeds)
        .build_with_clock(clock.clone())
        .unwrap();
    let tiers = [Tier::DEFAULT, l.tier("pro").unwrap(), l.tier("free").unwrap()];
    let fill = |q: &TokenBucket| q.units_per_token() * q.burst();
    let mut current: Vec<TokenBucket> = tiers.iter().map(|&t| l.tier_quota(t)).collect();
    let max_fill = current.iter().map(fill).max().unwrap().max(headroom.as_nanos() as u64);
    let mut overrides: HashMap<u64, usize> = HashMap::new();
    let mut models: HashMap<u64, Model> = HashMap::new();
    for op in input.ops {
        let elapsed = clock.now().as_u64();
        let (k, tier, n, take) = match op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns.into()));
                continue;
            }
            Op::AdvanceFar(ns) => {
                clock.advance(Duration::from_nanos(ns % (1 << 40)));
                continue;
            }
            Op::Sweep => {
                l.sweep();
                continue;
            }
            Op::SetOverride(k, t) => {
                let (k, t) = (u64::from(k % 80), usize::from(t % 3));
                if l.set_override(&k, tiers[t]).is_ok() {
                    overrides.insert(k, t);
                } else {
                    assert!(overrides.len() >= 16 && !overrides.contains_key(&k));
                }
                continue;
            }
            Op::ClearOverride(k) => {
                let k = u64::from(k % 80);
                assert_eq!(l.clear_override(&k), overrides.remove(&k).is_some());
                continue;
            }
            Op::SetTierQuota(t, q) => {
                let t = usize::from(t % 3);
                let q = quota(q);
                if fill(&q) > max_fill {
                    assert!(l.set_tier_quota(tiers[t], q).is_err());
                } else {
                    l.set_tier_quota(tiers[t], q).unwrap();
                    current[t] = l.tier_quota(tiers[t]);
                }
                continue;
            }
            Op::Check(k, n) => {
                let k = u64::from(k % 80);
                (k, overrides.get(&k).copied().unwrap_or(0), u64::from(n % 12), true)
            }
            Op::CheckIn(k, t, n) => (u64::from(k % 80), usize::from(t % 3), u64::from(n % 12), true),
            Op::Peek(k, n) => {
                let k = u64::from(k % 80);
                (k, overrides.get(&k).copied().unwrap_or(0), u64::from(n % 12), false)
            }
        };
        let got = match op {
            Op::Check(..) => l.check_n(&k, n),
            Op::CheckIn(..) => l.check_n_in(&k, tiers[tier], n),
            _ => l.peek_n_at(&k, clock.now(), n),
        };
        let q = &current[tier];
        if policy == WhenFull::EvictFullest {
            if take && got.outcome() == Outcome::Allowed && n > 0 {
                let m = models.entry(k).or_insert_with(|| Model::new(q));
                m.requote(q);
                let want = m.decide(elapsed, n, true);
                assert_eq!(want.outcome, Outcome::Allowed, "key {k} over-admitted at {elapsed}");
            }
            continue;
        }
        models.retain(|_, m| !m.older_than(elapsed, max_fill));
        let inserting = take && n >= 1 && n <= q.burst() && !models.contains_key(&k);
        if inserting && models.len() >= 56 {
            let want = if policy == WhenFull::Allow { Outcome::Untracked } else { Outcome::TableFull };
            assert_eq!(got.outcome(), want);
            continue;
        }
        let want = match models.get_mut(&k) {
            Some(m) => {
                m.requote(q);
                m.decide(elapsed, n, take)
            }
            None if inserting => models.entry(k).or_insert_with(|| Model::new(q)).decide(elapsed, n, true),
            None => Model::new(q).decide(elapsed, n, take),
        };
        assert_eq!(Answer::of(&got), want, "key {k} tier {tier} cost {n} at {elapsed}");
    }
});
