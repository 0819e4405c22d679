//! nginx `limit_req` as `REFERENCE.md` §1.3 states it, in `i128`, with an unbounded `last`
//! except for the documented saturation of the clock at 2^40 − 2 ms. Shares no code with the
//! engine.

#![allow(dead_code, unreachable_pub)]

use tollgate::Outcome;

#[derive(Clone, Debug)]
pub struct NginxModel {
    rate: i128,
    burst: i128,
    delay: i128,
    /// `None`: nginx's new node.
    state: Option<(i128, i128)>, // (last ms, excess milli)
}

/// (outcome, remaining, delay or retry in ms, reset in ms)
pub type NginxAnswer = (Outcome, u64, u64, u64);

impl NginxModel {
    /// `rate` r/s (`scale` 1) or r/m (`scale` 60), `burst`, `delay` (None = nodelay).
    pub fn new(rate: u64, scale: u64, burst: u64, delay: Option<u64>) -> NginxModel {
        NginxModel {
            rate: i128::from(rate) * 1000 / i128::from(scale),
            burst: i128::from(burst) * 1000,
            delay: delay.map_or(i128::MAX, |d| i128::from(d) * 1000),
            state: None,
        }
    }

    /// A new configuration at runtime, as nginx's reload: the node (last request, excess) is
    /// kept and leaks at the new rate.
    pub fn reconfigure(&mut self, rate: u64, scale: u64, burst: u64, delay: Option<u64>) {
        let state = self.state;
        *self = NginxModel::new(rate, scale, burst, delay);
        self.state = state;
    }

    fn drain_ms(&self, excess: i128) -> u64 {
        u64::try_from((excess * 1000 + self.rate - 1) / self.rate).unwrap()
    }

    fn passed(&self, excess: i128) -> NginxAnswer {
        let remaining = u64::try_from((self.burst - excess).max(0) / 1000).unwrap();
        if excess <= self.delay {
            (Outcome::Allowed, remaining, 0, self.drain_ms(excess))
        } else {
            let delay = u64::try_from((excess - self.delay) * 1000 / self.rate).unwrap();
            (Outcome::Delayed, remaining, delay, self.drain_ms(excess))
        }
    }

    /// Whether a keyed table may evict the node at `now_ns`: a burst's excess and 1,000
    /// milli-requests more have leaked since its last request (so it decides as a new node).
    /// nginx itself deletes idle nodes after 60 s.
    pub fn evictable(&self, now_ns: u64) -> bool {
        let now = i128::from(now_ns / 1_000_000);
        let drained = ((self.burst + 1000) * 1000 + self.rate - 1) / self.rate;
        self.state.map_or(true, |(last, _)| now - last >= drained)
    }

    /// One request at `now_ns` after the limiter's creation.
    pub fn check(&mut self, now_ns: u64) -> NginxAnswer {
        self.check_n(now_ns, 1)
    }

    /// `n` requests at once (the engine's generalization: `n` of nginx's steps in the same
    /// millisecond, the first one leaking; a new node's first request is free; `n = 0` stores nothing, `n > burst + 1` never passes).
    pub fn check_n(&mut self, now_ns: u64, n: u64) -> NginxAnswer {
        let now = i128::from((now_ns / 1_000_000).min((1 << 40) - 2));
        let n = i128::from(n);
        let leaked_state = self.state.map(|(last, stored)| {
            let raw = now - last;
            let ms = if raw < -60_000 {
                1
            } else if raw < 0 {
                0
            } else {
                raw
            };
            (last, stored, raw, ms, self.rate * ms / 1000)
        });
        if n > self.burst / 1000 + 1 {
            let excess = leaked_state.map_or(0, |(_, stored, _, _, leaked)| (stored - leaked).max(0));
            return (Outcome::Insufficient, 0, 0, self.drain_ms(excess));
        }
        let Some((last, stored, raw, ms, leaked)) = leaked_state else {
            if n == 0 {
                return self.passed(0);
            }
            let excess = (n - 1) * 1000;
            self.state = Some((now, excess));
            return self.passed(excess);
        };
        let excess = (stored + n * 1000 - leaked).max(0);
        if n == 0 {
            return self.passed(excess);
        }
        if excess > self.burst {
            let need = stored + n * 1000 - self.burst;
            let ms_needed = (need * 1000 + self.rate - 1) / self.rate;
            let retry = u64::try_from((ms_needed - raw).max(0)).unwrap();
            return (Outcome::Denied, 0, retry, self.drain_ms(stored));
        }
        // `n` arrivals in one millisecond: nginx's step `n` times, the first leaking.
        let excess = (stored + 1000 - leaked).max(0) + (n - 1) * 1000;
        self.state = Some((if ms != 0 { now } else { last }, excess));
        self.passed(excess)
    }
}
