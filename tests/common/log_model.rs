//! The sliding log's definition, unit by unit: at most `N` units with `t` in `(now − W, now]`.
//! Shares no code with the engine.
//!
//! Each unit is kept as its expiry (`t + W`, with `t` never before the newest admission), so
//! that a window changed at runtime applies to units admitted from then on, as the engine's.
//! The log remembers the newest `capacity` units (its ring: the limit, or for a keyed table the
//! limit it was built with) and counts the newest `limit` of them.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;

use tollgate::Outcome;

/// (outcome, remaining, retry in ns (denied), reset in ns)
pub type LogAnswer = (Outcome, u64, u64, u64);

#[derive(Clone, Debug)]
pub struct LogModel {
    limit: u64,
    window: u64,
    /// Units remembered: the newest `capacity`.
    capacity: u64,
    /// Expiries of the units, oldest first.
    units: VecDeque<u128>,
}

impl LogModel {
    pub fn new(limit: u64, window: u64) -> LogModel {
        LogModel { limit, window, capacity: limit, units: VecDeque::new() }
    }

    /// A direct limiter's change at runtime: the newest units are kept, as many as the new
    /// limit holds, each leaving when it was going to; later units expire under the new window.
    pub fn reconfigure(&mut self, limit: u64, window: u64) {
        self.limit = limit;
        self.window = window;
        self.capacity = limit;
        self.truncate();
    }

    /// A keyed table's change at runtime: the log keeps every entry it has room for (the limit
    /// it was built with) and counts the newest `limit`.
    pub fn reconfigure_keyed(&mut self, limit: u64, window: u64) {
        assert!(limit <= self.capacity, "a keyed log's limit stays within the one it was built with");
        self.limit = limit;
        self.window = window;
    }

    fn truncate(&mut self) {
        while self.units.len() as u64 > self.capacity {
            self.units.pop_front();
        }
    }

    /// `n` units at `now` (ns since creation). A `now` before the newest admission is stored as
    /// that admission (the engine's rule: expiries never move back).
    pub fn check_n(&mut self, now: u64, n: u64, take: bool) -> LogAnswer {
        let now128 = u128::from(now);
        let counted = self.units.len().min(usize::try_from(self.limit).unwrap());
        let live: Vec<u128> =
            self.units.iter().skip(self.units.len() - counted).copied().filter(|&x| x > now128).collect();
        let count = live.len() as u64;
        let newest = self.units.back().copied();
        let reset =
            |newest: Option<u128>| newest.map_or(0, |x| u64::try_from(x.saturating_sub(now128)).unwrap());
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
            let retry = u64::try_from(live[k - 1] - now128).unwrap();
            return (Outcome::Denied, remaining, retry, reset(newest));
        }
        let expiry =
            newest.map_or(now128 + u128::from(self.window), |x| x.max(now128 + u128::from(self.window)));
        if take {
            for _ in 0..n {
                self.units.push_back(expiry);
            }
            self.truncate();
        }
        (Outcome::Allowed, remaining - n, 0, reset(Some(expiry)))
    }
}
