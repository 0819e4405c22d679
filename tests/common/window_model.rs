//! Fixed window as its documentation states it, in `i128`: window `i` covers `[i·W, (i+1)·W)`
//! ns since creation; the count is 24 bits wide (a limit above 2^24 − 1: as many bits as the
//! limit has), the index the rest of the 64; the index saturates after 2^(64 − b) − 2 windows
//! and elapsed time at 2^63 − 1.

#![allow(dead_code, unreachable_pub)]

use tollgate::Outcome;

/// (outcome, remaining, retry ns when denied, reset ns)
pub type WindowAnswer = (Outcome, u64, u64, u64);

/// An engine decision in the models' terms.
pub fn answer(d: &tollgate::Decision) -> WindowAnswer {
    let retry = match d.outcome() {
        Outcome::Denied => d.retry_after_nanos().unwrap().as_u64(),
        _ => 0,
    };
    (d.outcome(), d.remaining(), retry, d.reset_after_nanos().as_u64())
}

#[derive(Clone, Debug)]
pub struct FixedWindowModel {
    limit: i128,
    window: i128,
    state: Option<(i128, i128)>, // (stored index = i + 1, count)
    /// Refused units count too, up to the count's largest value (`FixedWindow::charging_refusals`).
    charge_refused: bool,
    /// The count's width.
    bits: u32,
}

impl FixedWindowModel {
    pub fn new(limit: u64, window_ns: u64) -> FixedWindowModel {
        FixedWindowModel {
            limit: i128::from(limit),
            window: i128::from(window_ns),
            state: None,
            charge_refused: false,
            bits: if limit < 1 << 24 { 24 } else { 64 - limit.leading_zeros() },
        }
    }

    /// The model of `FixedWindow::charging_refusals`.
    pub fn charging(limit: u64, window_ns: u64) -> FixedWindowModel {
        FixedWindowModel { charge_refused: true, ..FixedWindowModel::new(limit, window_ns) }
    }

    /// Counts `n` refused units of window `index`, if refusals count, `n` is at most the
    /// largest count and the count can grow; whether it did.
    fn charge(&mut self, index: i128, count: i128, n: i128) -> bool {
        let largest = (1i128 << self.bits) - 1;
        let next = (count + n).min(largest);
        let grew = self.charge_refused && n <= largest && next > count;
        if grew {
            self.state = Some((index, next));
        }
        grew
    }

    /// A new limit at runtime: the state is kept (a count above the limit refuses until the
    /// window ends).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = i128::from(limit);
    }

    /// Whether the state decides as a fresh key's at `elapsed_ns` and later: it is of an
    /// earlier window (the keyed table's eviction line).
    pub fn evictable(&self, elapsed_ns: u64) -> bool {
        let now_index = i128::from(elapsed_ns) / self.window + 1;
        self.state.map_or(true, |(s, _)| s < now_index)
    }

    pub fn check_n(&mut self, elapsed_ns: u64, n: u64) -> WindowAnswer {
        let max_index: i128 = (1 << (64 - self.bits)) - 1;
        let e = i128::from(elapsed_ns.min((1 << 63) - 1));
        let i = e / self.window;
        let now_index = (i + 1).min(max_index);
        // The stored window never moves back.
        let (index, count) = match self.state {
            Some((s, c)) if s >= now_index => (s, c),
            _ => (now_index, 0),
        };
        let until_end = if index < max_index { index * self.window - e } else { i128::from(u64::MAX) };
        let reset = if count == 0 { 0 } else { until_end };
        let n = i128::from(n);
        let u = |x: i128| u64::try_from(x).unwrap();
        if n > self.limit {
            let reset = if self.charge(index, count, n) { until_end } else { reset };
            return (Outcome::Insufficient, u((self.limit - count).max(0)), 0, u(reset));
        }
        if n == 0 {
            return (Outcome::Allowed, u((self.limit - count).max(0)), 0, u(reset));
        }
        if count + n <= self.limit {
            self.state = Some((index, count + n));
            (Outcome::Allowed, u(self.limit - count - n), 0, u(until_end))
        } else {
            let reset = if self.charge(index, count, n) { until_end } else { reset };
            (Outcome::Denied, u((self.limit - count).max(0)), u(until_end), u(reset))
        }
    }
}

/// The sliding-window counter as its documentation states it, in `i128`, with the wait found by
/// binary search over time (the estimate never grows, so admission is monotone in time) instead
/// of the engine's closed form. Times stay below the index's lifetime in the tests that use it.
#[derive(Clone, Debug)]
pub struct SlidingWindowModel {
    limit: i128,
    window: i128,
    state: Option<(i128, i128, i128)>, // (index = i + 1, prev, curr)
}

impl SlidingWindowModel {
    pub fn new(limit: u64, window_ns: u64) -> SlidingWindowModel {
        SlidingWindowModel { limit: i128::from(limit), window: i128::from(window_ns), state: None }
    }

    /// A new limit at runtime: both counts are kept.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = i128::from(limit);
    }

    /// Whether the state decides as a fresh key's at `elapsed_ns` and later: it is two windows
    /// old, or one window old with nothing counted in it (the keyed table's eviction line).
    pub fn evictable(&self, elapsed_ns: u64) -> bool {
        let i = i128::from(elapsed_ns) / self.window;
        self.state.map_or(true, |(s, _, c)| s < i || (s == i && c == 0))
    }

    /// (index, prev, curr, δ, ahead) as seen at `e`.
    fn view(&self, e: i128) -> (i128, i128, i128, i128, i128) {
        let now_index = e / self.window + 1;
        let (index, prev, curr) = match self.state {
            Some((s, p, c)) if s >= now_index => (s, p, c),
            Some((s, _, c)) if s + 1 == now_index => (now_index, c, 0),
            _ => (now_index, 0, 0),
        };
        let start = (index - 1) * self.window;
        let (delta, ahead) = if start <= e { (e - start, 0) } else { (0, start - e) };
        (index, prev, curr, delta, ahead)
    }

    fn fits(&self, e: i128, n: i128) -> bool {
        let (_, prev, curr, delta, _) = self.view(e);
        prev * (self.window - delta) + (curr + n) * self.window <= self.limit * self.window
    }

    pub fn check_n(&mut self, elapsed_ns: u64, n: u64) -> WindowAnswer {
        let e = i128::from(elapsed_ns);
        let n = i128::from(n);
        let (index, prev, curr, delta, ahead) = self.view(e);
        let w = self.window;
        let remaining = |p: i128, c: i128| {
            u64::try_from(((self.limit * w - p * (w - delta) - c * w).max(0)) / w).unwrap()
        };
        let reset = |p: i128, c: i128| {
            u64::try_from(if c > 0 {
                ahead + 2 * w - delta
            } else if p > 0 {
                ahead + w - delta
            } else {
                0
            })
            .unwrap()
        };
        if n > self.limit {
            return (Outcome::Insufficient, remaining(prev, curr), 0, reset(prev, curr));
        }
        if n == 0 {
            return (Outcome::Allowed, remaining(prev, curr), 0, reset(prev, curr));
        }
        if self.fits(e, n) {
            self.state = Some((index, prev, curr + n));
            return (Outcome::Allowed, remaining(prev, curr + n), 0, reset(prev, curr + n));
        }
        // The least wait at which n fits: admission is monotone in time.
        let (mut lo, mut hi) = (0i128, ahead + 3 * w);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.fits(e + mid, n) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        (Outcome::Denied, remaining(prev, curr), u64::try_from(lo).unwrap(), reset(prev, curr))
    }
}
