//! The keyed policy tables (`Keyed<P, u64>`) against a `HashMap` of reference models, one per
//! key: shared by `tests/keyed_policy.rs` and the `keyed_policy_model` fuzz target. One shard of
//! 64 slots holding at most 56 keys, so every key's window is the whole shard and the table is
//! full exactly when 56 tracked keys are not evictable, which each model can tell.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::time::Duration;

use tollgate::{Clock, Decision, Keyed, KeyedPolicy, ManualClock, Outcome, WhenFull};

use super::nginx_model::NginxModel;
use super::window_model::{answer, FixedWindowModel, SlidingWindowModel};

/// (outcome, remaining, wait, reset), in the model's units.
pub type Ans = (Outcome, u64, u64, u64);

/// A reference model of one key.
pub trait RefModel: Clone {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans;
    /// Whether the table may evict the key at `now_ns` (its state decides as a new key's).
    fn evictable(&self, now_ns: u64) -> bool;
    /// The engine's decision in this model's units (the window models' by default).
    fn answer(d: &Decision) -> Ans {
        answer(d)
    }
}

impl RefModel for NginxModel {
    fn check_n(&mut self, now_ns: u64, n: u64) -> Ans {
        NginxModel::check_n(self, now_ns, n)
    }
    fn evictable(&self, now_ns: u64) -> bool {
        NginxModel::evictable(self, now_ns)
    }
    fn answer(d: &Decision) -> Ans {
        let wait = match d.outcome() {
            Outcome::Denied => d.retry_after().unwrap(),
            _ => d.delay(),
        };
        let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap();
        (d.outcome(), d.remaining(), ms(wait), ms(d.reset_after()))
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

#[derive(Clone, Debug)]
pub enum Op {
    Advance(u64),
    Check(u64, u64),
    Peek(u64, u64),
    Sweep,
}

/// The 56-key table of the comparison.
pub fn small<P: KeyedPolicy>(
    p: P,
    when_full: WhenFull,
    seeds: [u64; 8],
    clock: &ManualClock,
) -> Keyed<P, u64, ManualClock> {
    let l = Keyed::builder(p)
        .capacity(56)
        .shards(1)
        .when_full(when_full)
        .seeds(seeds)
        .build_with_clock(clock.clone())
        .unwrap();
    assert_eq!((l.capacity(), l.stats().slots), (56, 64));
    l
}

/// Runs `ops` on the table and the models: every field of every decision must equal the
/// model's, and the table must refuse a new key exactly when 56 tracked keys are not evictable.
/// `most` is the most units one decision can admit. The first difference is the error.
pub fn compare<P: KeyedPolicy, M: RefModel>(
    p: P,
    fresh: impl Fn() -> M,
    most: u64,
    ops: impl IntoIterator<Item = Op>,
    fail_open: bool,
    seeds: [u64; 8],
) -> Result<(), String> {
    let clock = ManualClock::new();
    let when_full = if fail_open { WhenFull::Allow } else { WhenFull::Deny };
    let l = small(p, when_full, seeds, &clock);
    let mut models: HashMap<u64, M> = HashMap::new();
    for op in ops {
        let now = clock.now().as_u64();
        match op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::Sweep => {
                l.sweep();
            }
            Op::Peek(k, n) => {
                let want = models.get(&k).cloned().unwrap_or_else(&fresh).check_n(now, n);
                let got = M::answer(&l.peek_n_at(&k, clock.now(), n));
                if got != want {
                    return Err(format!("peek of key {k} cost {n} at {now}: {got:?}, the model {want:?}"));
                }
            }
            Op::Check(k, n) => {
                let got = l.check_n(&k, n);
                models.retain(|_, m| !m.evictable(now));
                let inserting = n >= 1 && n <= most && !models.contains_key(&k);
                if inserting && models.len() >= 56 {
                    let want = if fail_open { Outcome::Untracked } else { Outcome::TableFull };
                    if got.outcome() != want {
                        return Err(format!("key {k} at {now} on a full table: {got:?}, not {want:?}"));
                    }
                    continue;
                }
                let want = if inserting || models.contains_key(&k) {
                    models.entry(k).or_insert_with(&fresh).check_n(now, n)
                } else {
                    fresh().check_n(now, n) // n = 0 or never admissible: a peek
                };
                let got = M::answer(&got);
                if got != want {
                    return Err(format!("key {k} cost {n} at {now}: {got:?}, the model {want:?}"));
                }
            }
        }
        if l.len() > 56 {
            return Err(format!("{} keys tracked", l.len()));
        }
    }
    Ok(())
}
