//! Fixed window as its documentation states it, in `i128`: window `i` covers `[i·W, (i+1)·W)`
//! ns since creation; the index saturates after 2^40 − 2 windows and elapsed time at 2^63 − 1.

#![allow(dead_code, unreachable_pub)]

use tollgate::Outcome;

/// (outcome, remaining, retry ns when denied, reset ns)
pub type WindowAnswer = (Outcome, u64, u64, u64);

#[derive(Clone, Debug)]
pub struct FixedWindowModel {
    limit: i128,
    window: i128,
    state: Option<(i128, i128)>, // (stored index = i + 1, count)
}

impl FixedWindowModel {
    pub fn new(limit: u64, window_ns: u64) -> FixedWindowModel {
        FixedWindowModel { limit: i128::from(limit), window: i128::from(window_ns), state: None }
    }

    pub fn check_n(&mut self, elapsed_ns: u64, n: u64) -> WindowAnswer {
        const MAX_INDEX: i128 = (1 << 40) - 1;
        let e = i128::from(elapsed_ns.min((1 << 63) - 1));
        let i = e / self.window;
        let now_index = (i + 1).min(MAX_INDEX);
        // The stored window never moves back.
        let (index, count) = match self.state {
            Some((s, c)) if s >= now_index => (s, c),
            _ => (now_index, 0),
        };
        let until_end = if index < MAX_INDEX { index * self.window - e } else { i128::from(u64::MAX) };
        let reset = if count == 0 { 0 } else { until_end };
        let n = i128::from(n);
        let u = |x: i128| u64::try_from(x).unwrap();
        if n > self.limit {
            return (Outcome::Insufficient, u(self.limit - count), 0, u(reset));
        }
        if n == 0 {
            return (Outcome::Allowed, u(self.limit - count), 0, u(reset));
        }
        if count + n <= self.limit {
            self.state = Some((index, count + n));
            (Outcome::Allowed, u(self.limit - count - n), 0, u(until_end))
        } else {
            (Outcome::Denied, u(self.limit - count), u(until_end), u(reset))
        }
    }
}
