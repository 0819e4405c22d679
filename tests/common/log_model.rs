//! The sliding log's definition, unit by unit: at most `N` units with `t` in `(now − W, now]`.
//! Shares no code with the engine.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;

use tollgate::Outcome;

/// (outcome, remaining, retry in ns (denied), reset in ns)
pub type LogAnswer = (Outcome, u64, u64, u64);

#[derive(Clone, Debug)]
pub struct LogModel {
    limit: u64,
    window: u64,
    /// Admission instants of the units, oldest first.
    units: VecDeque<u64>,
}

impl LogModel {
    pub fn new(limit: u64, window: u64) -> LogModel {
        LogModel { limit, window, units: VecDeque::new() }
    }

    /// `n` units at `now` (ns since creation). A `now` before the newest admission is stored as
    /// that admission (the engine's rule: expiries never move back).
    pub fn check_n(&mut self, now: u64, n: u64, take: bool) -> LogAnswer {
        let w = u128::from(self.window);
        let live: Vec<u64> =
            self.units.iter().copied().filter(|&t| u128::from(t) + w > u128::from(now)).collect();
        let count = live.len() as u64;
        let newest = self.units.back().copied();
        let reset = |newest: Option<u64>| {
            newest.map_or(0, |t| u64::try_from((u128::from(t) + w).saturating_sub(u128::from(now))).unwrap())
        };
        let remaining = self.limit - count;
        if n > self.limit {
            return (Outcome::Insufficient, remaining, 0, reset(newest));
        }
        if n == 0 {
            return (Outcome::Allowed, remaining, 0, reset(newest));
        }
        if count + n > self.limit {
            // The `k`-th oldest live unit must leave, `k = count + n − limit`.
            let k = usize::try_from(count + n - self.limit).unwrap();
            let retry = u64::try_from(u128::from(live[k - 1]) + w - u128::from(now)).unwrap();
            return (Outcome::Denied, remaining, retry, reset(newest));
        }
        let at = newest.map_or(now, |t| t.max(now));
        if take {
            for _ in 0..n {
                self.units.push_back(at);
            }
            while self.units.len() as u64 > self.limit {
                self.units.pop_front();
            }
        }
        (Outcome::Allowed, remaining - n, 0, reset(Some(at)))
    }
}
