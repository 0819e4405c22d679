//! Exact reference models of a token bucket, in `i128`, for differential tests and fuzzing.
//!
//! * [`Model`] implements the *documented* semantics: per-token time `t/m` ns (the quota's
//!   rounding), evaluated at whole nanoseconds since the limiter's creation, time saturating at
//!   the quota's lifetime. The engine must agree with it on every field of every decision.
//! * [`Ideal`] is the textbook bucket at the *configured* rate, `tokens` per `period`, with no
//!   rounding at all. For quotas whose rate is exact in units it must agree with the engine; for
//!   every quota it bounds what the engine may admit.
//!
//! Both keep the bucket as its empty instant `z`: the level at time `x` is
//! `clamp(x − z, 0, burst·τ) / τ` for per-token time `τ`. Nothing here is shared with the
//! engine's code: no `u64` ranges, no reciprocal division, no saturation but the documented one.

#![allow(dead_code, unreachable_pub)]

use tollgate::{Outcome, TokenBucket};

/// What a decision answered, field by field; `retry` is `None` for "never".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub outcome: Outcome,
    pub remaining: u64,
    pub retry_ns: Option<u64>,
    pub reset_ns: u64,
}

impl Answer {
    pub fn of(d: &tollgate::Decision) -> Answer {
        Answer {
            outcome: d.outcome(),
            remaining: d.remaining(),
            retry_ns: d.retry_after_nanos().map(|n| n.as_u64()),
            reset_ns: d.reset_after_nanos().as_u64(),
        }
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    assert!(a >= 0 && b > 0);
    (a + b - 1) / b
}

/// The documented semantics, exactly.
#[derive(Clone, Debug)]
pub struct Model {
    /// Units per ns.
    m: i128,
    /// Units per token.
    t: i128,
    burst: i128,
    /// Nanoseconds after which time stops.
    lifetime: i128,
    /// The empty instant, in units since creation. Negative while credit from the start remains.
    z: i128,
}

impl Model {
    pub fn new(q: &TokenBucket) -> Model {
        let t = i128::from(q.units_per_token());
        Model {
            m: i128::from(q.units_per_nano()),
            t,
            burst: i128::from(q.burst()),
            lifetime: i128::from(q.lifetime().as_u64()),
            z: -i128::from(q.initial()) * t,
        }
    }

    fn instant(&self, elapsed_ns: u64) -> i128 {
        i128::from(elapsed_ns).min(self.lifetime) * self.m
    }

    /// The same bucket (its empty instant) under another quota of the same time unit, as a
    /// keyed limiter's tier change does: the level is re-read under the new rate and burst.
    pub fn requote(&mut self, q: &TokenBucket) {
        assert_eq!(self.m, i128::from(q.units_per_nano()), "tiers share one time unit");
        self.t = i128::from(q.units_per_token());
        self.burst = i128::from(q.burst());
        self.lifetime = i128::from(q.lifetime().as_u64());
    }

    /// Whether the empty instant lies more than `fill_units` before `elapsed_ns`: a keyed table
    /// whose largest fill is `fill_units` may evict the bucket.
    pub fn older_than(&self, elapsed_ns: u64, fill_units: u64) -> bool {
        self.z < self.instant(elapsed_ns) - i128::from(fill_units)
    }

    /// Whether the bucket is strictly past full at `elapsed_ns`: its empty instant lies more than
    /// one fill before now. A keyed table may evict such a bucket (a fresh one is identical).
    pub fn past_full(&self, elapsed_ns: u64) -> bool {
        self.z < self.instant(elapsed_ns) - self.burst * self.t
    }

    /// `check_n` (when `take`) or `peek_n` at `elapsed_ns` since creation.
    pub fn decide(&mut self, elapsed_ns: u64, n: u64, take: bool) -> Answer {
        let now = self.instant(elapsed_ns);
        let fill = self.burst * self.t;
        let n = i128::from(n);
        let z = self.z.max(now - fill);
        let level = |z: i128| u64::try_from((now - z).max(0) / self.t).expect("a level fits u64");
        let reset = |z: i128| u64::try_from(ceil_div(z - (now - fill), self.m)).expect("a wait fits u64");
        if n > self.burst {
            return Answer {
                outcome: Outcome::Insufficient,
                remaining: level(z),
                retry_ns: None,
                reset_ns: reset(z),
            };
        }
        let after = z + n * self.t;
        if n == 0 || after <= now {
            if take && n > 0 {
                self.z = after;
                return Answer {
                    outcome: Outcome::Allowed,
                    remaining: level(after),
                    retry_ns: Some(0),
                    reset_ns: reset(after),
                };
            }
            return Answer {
                outcome: Outcome::Allowed,
                remaining: level(z),
                retry_ns: Some(0),
                reset_ns: reset(z),
            };
        }
        Answer {
            outcome: Outcome::Denied,
            remaining: level(z),
            retry_ns: Some(u64::try_from(ceil_div(after - now, self.m)).expect("a wait fits u64")),
            reset_ns: reset(z),
        }
    }
}

/// The textbook bucket at the configured rate: per-token time `period/tokens` ns, exactly.
///
/// Time is kept multiplied by `tokens`, so that every quantity is an integer.
#[derive(Clone, Debug)]
pub struct Ideal {
    tokens: i128,
    period: i128,
    burst: i128,
    /// The empty instant, in ns × tokens.
    z: i128,
}

impl Ideal {
    pub fn new(q: &TokenBucket) -> Ideal {
        let tokens = i128::from(q.rate().tokens());
        let period = q.rate().period().as_nanos() as i128;
        Ideal { tokens, period, burst: i128::from(q.burst()), z: -i128::from(q.initial()) * period }
    }

    /// Whether `n` tokens are admitted at `ns`, taking them if so.
    pub fn check_n(&mut self, ns: u64, n: u64) -> bool {
        let now = i128::from(ns) * self.tokens;
        let n = i128::from(n);
        if n == 0 || n > self.burst {
            return n == 0;
        }
        let after = self.z.max(now - self.burst * self.period) + n * self.period;
        let ok = after <= now;
        if ok {
            self.z = after;
        }
        ok
    }

    /// Whether the bucket is full at `ns`.
    pub fn is_full(&self, ns: u64) -> bool {
        i128::from(ns) * self.tokens - self.z >= self.burst * self.period
    }
}

/// Whether `q`'s rounded rate equals its configured rate.
pub fn is_exact(q: &TokenBucket) -> bool {
    let r = q.rate();
    u128::from(q.units_per_token()) * u128::from(r.tokens())
        == r.period().as_nanos() * u128::from(q.units_per_nano())
}

/// `floor(rate · span)` at the configured rate: the most a full bucket may add over `span` ns.
pub fn refill_bound(q: &TokenBucket, span_ns: u64) -> u128 {
    u128::from(span_ns) * u128::from(q.rate().tokens()) / q.rate().period().as_nanos()
}

/// Why the model refused a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelRefusal {
    /// `n` above the burst.
    Insufficient,
    /// Due later than allowed: the wait it would have needed, in ns (rounded up).
    TooLate { wait_ns: u64 },
}

/// A reservation the model granted: what a cancel needs, and when it is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelReservation {
    /// The floor (`now − fill`, units) at the reservation's instant.
    pub floor: i128,
    pub n: u64,
    /// Nanoseconds after the reservation's instant that its tokens are due (rounded up).
    pub wait_ns: u64,
    /// The empty instant it left.
    pub stamp: i128,
}

impl Model {
    /// `reserve_n_at` at `elapsed_ns`, allowing a wait of `max_wait_ns` (capped at one fill):
    /// the bucket's empty instant moves to `max(z, now − fill) + n·t`, into the future if need
    /// be, when that is at most the allowed wait past now.
    pub fn reserve(
        &mut self,
        elapsed_ns: u64,
        n: u64,
        max_wait_ns: u64,
    ) -> Result<ModelReservation, ModelRefusal> {
        let now = self.instant(elapsed_ns);
        let fill = self.burst * self.t;
        let floor = now - fill;
        if i128::from(n) > self.burst {
            return Err(ModelRefusal::Insufficient);
        }
        if n == 0 {
            return Ok(ModelReservation { floor, n, wait_ns: 0, stamp: self.z });
        }
        let after = self.z.max(floor) + i128::from(n) * self.t;
        if after <= now {
            self.z = after;
            return Ok(ModelReservation { floor, n, wait_ns: 0, stamp: after });
        }
        // In debt: due at the first whole nanosecond at or after `after`, which is where the
        // next one queues from; at most one fill (in whole ns) or the caller's wait later.
        let wait_ns = ceil_div(after - now, self.m);
        let longest = (fill / self.m).min(i128::from(max_wait_ns));
        let wait_ns_u = u64::try_from(wait_ns).expect("a wait fits u64");
        if wait_ns > longest {
            return Err(ModelRefusal::TooLate { wait_ns: wait_ns_u });
        }
        self.z = now + wait_ns * self.m;
        Ok(ModelReservation { floor, n, wait_ns: wait_ns_u, stamp: self.z })
    }

    /// `cancel_at` (or a `check_all` refund) at `elapsed_ns` of what took `r.n` at floor
    /// `r.floor` and left `r.stamp`, never below the current floor: in debt (`z > now`), all of
    /// it if it is the latest (`z = r.stamp`) and nothing otherwise; out of debt,
    /// `n·t − (floor now − floor then)` when positive. Whether `z` moved back.
    pub fn cancel(&mut self, elapsed_ns: u64, r: &ModelReservation) -> bool {
        let now = self.instant(elapsed_ns);
        let floor = now - self.burst * self.t;
        if r.n == 0 || floor < r.floor {
            return false;
        }
        let owed = if self.z > now {
            if self.z != r.stamp {
                return false;
            }
            i128::from(r.n) * self.t
        } else {
            i128::from(r.n) * self.t - (floor - r.floor)
        };
        if owed <= 0 {
            return false;
        }
        let next = (self.z - owed).max(floor);
        if next >= self.z {
            return false;
        }
        self.z = next;
        true
    }

    /// A queued bucket's `check_n` (when `take`) or `peek_n`, with a line of `queue` units:
    /// allowed when the tokens are there; otherwise admitted for later when they are due (at
    /// the first whole nanosecond, as `reserve`) at most `queue` units from now, the answer
    /// `Delayed`, and the delay in ns alongside; otherwise denied, to retry once the wait fits
    /// the line (rounded up). Also what a refund of the admission needs.
    pub fn queue(
        &mut self,
        elapsed_ns: u64,
        n: u64,
        queue: u64,
        take: bool,
    ) -> (Answer, u64, Option<ModelReservation>) {
        let now = self.instant(elapsed_ns);
        let fill = self.burst * self.t;
        let floor = now - fill;
        let z = self.z.max(floor);
        let after = z + i128::from(n) * self.t;
        if n == 0 || i128::from(n) > self.burst || after <= now {
            let (answer, taken) =
                if take { self.charge(elapsed_ns, n) } else { (self.decide(elapsed_ns, n, false), None) };
            return (answer, 0, taken);
        }
        let wait_ns = ceil_div(after - now, self.m);
        let wait = wait_ns * self.m;
        let reset = |z: i128| u64::try_from(ceil_div(z - floor, self.m)).expect("a wait fits u64");
        if wait <= i128::from(queue) {
            let stamp = now + wait;
            if take {
                self.z = stamp;
            }
            let answer =
                Answer { outcome: Outcome::Delayed, remaining: 0, retry_ns: Some(0), reset_ns: reset(stamp) };
            let delay = u64::try_from(wait_ns).expect("a wait fits u64");
            return (answer, delay, take.then_some(ModelReservation { floor, n, wait_ns: delay, stamp }));
        }
        let retry = ceil_div((wait - i128::from(queue)).max(1), self.m);
        let answer = Answer {
            outcome: Outcome::Denied,
            remaining: u64::try_from((now - z).max(0) / self.t).expect("a level fits u64"),
            retry_ns: Some(u64::try_from(retry).expect("a wait fits u64")),
            reset_ns: reset(z),
        };
        (answer, 0, None)
    }

    /// A `check_all` charge: `check_n` that also returns what its refund needs.
    pub fn charge(&mut self, elapsed_ns: u64, n: u64) -> (Answer, Option<ModelReservation>) {
        let floor = self.instant(elapsed_ns) - self.burst * self.t;
        let a = self.decide(elapsed_ns, n, true);
        let taken = (a.outcome == Outcome::Allowed && n > 0 && i128::from(n) <= self.burst)
            .then_some(ModelReservation { floor, n, wait_ns: 0, stamp: self.z });
        (a, taken)
    }
}
