//! A bucket's state as the module keeps it, and the engine's decision on it.
//!
//! The state is the bucket's *theoretical arrival time* (TAT): the instant at which it is full
//! again, as redis-cell keeps it (GCRA's one timestamp, `REFERENCE.md` §1.5), but exact: in
//! the quota's own time units (`1/m` ns, the engine's), as whole nanoseconds since the Unix
//! epoch and the units below one. A TAT does not depend on the quota, so a key decided under
//! one quota and then another (redis-cell lets every call bring its own) means the same
//! instant under both; a quota whose units are finer reads it rounded up, toward refusal.
//!
//! Each decision is the engine's ([`TokenBucket::decide_stored`]) on a bucket clock that starts
//! at the decision's instant: the stored TAT becomes the engine's stamp (the instant the bucket
//! was or will be empty: TAT less the fill) on that clock, and the engine's next stamp becomes
//! the next TAT. The key expires at its TAT, when the bucket is full again and a missing key
//! means the same.

use tollgate::{Decision, TokenBucket};

/// The kind of state in `meta`'s top byte: a token bucket's TAT.
const KIND_BUCKET: u64 = 1;

/// One key's state: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Whole nanoseconds since the Unix epoch of the TAT.
    pub tat_ns: u64,
    /// The kind (bits 56–63), the quota's units per nanosecond `m` (bits 48–55), and the TAT's
    /// units below a nanosecond (bits 0–47, below `m`).
    pub meta: u64,
}

impl State {
    /// A bucket state from its fields, if they are one: `1 ≤ m ≤ 64`, the units below `m`.
    pub fn from_parts(tat_ns: u64, meta: u64) -> Option<State> {
        let s = State { tat_ns, meta };
        (meta >> 56 == KIND_BUCKET && (1..=64).contains(&s.m()) && s.sub_units() < s.m()).then_some(s)
    }

    /// redis-cell's value: the TAT as whole nanoseconds since the epoch.
    pub fn from_redis_cell(tat_ns: u64) -> State {
        State::at_units(u128::from(tat_ns), 1)
    }

    fn m(self) -> u64 {
        (self.meta >> 48) & 0xFF
    }

    fn sub_units(self) -> u64 {
        self.meta & ((1 << 48) - 1)
    }

    /// The TAT `units` (of `1/m` ns since the epoch), saturating at the largest instant.
    fn at_units(units: u128, m: u64) -> State {
        let m128 = u128::from(m);
        let ns = u64::try_from(units / m128).unwrap_or(u64::MAX);
        #[expect(clippy::cast_possible_truncation, reason = "below m ≤ 64")]
        let sub = (units % m128) as u64;
        State { tat_ns: ns, meta: KIND_BUCKET << 56 | m << 48 | sub }
    }

    /// The TAT in `1/m` ns units since the epoch, rounded up when this state counts in coarser
    /// units than `m` asks for (never earlier than it was).
    fn units(self, m: u64) -> u128 {
        let own = u128::from(self.m());
        let exact = u128::from(self.tat_ns) * own + u128::from(self.sub_units());
        (exact * u128::from(m)).div_ceil(own)
    }

    /// The instant the bucket is full again: whole nanoseconds since the epoch, rounded up.
    pub fn full_at_ns(self) -> u64 {
        self.tat_ns.saturating_add(u64::from(self.sub_units() > 0))
    }
}

/// `n` tokens under `quota` at `now_ns` (since the Unix epoch) on `state` (`None`: a missing
/// key, a full bucket). Takes them when `take` and they fit: the decision, and the state to
/// store when one was taken. The decision is the engine's, field for field, as a local
/// [`Limiter`](tollgate::Limiter) of `quota` answers at the same instant. `None` only if the
/// engine refuses its own clock (it never does: the clock starts at its offset, at least
/// the fill), so that a module never panics inside Redis.
pub fn decide(
    quota: &TokenBucket,
    state: Option<State>,
    now_ns: u64,
    n: u64,
    take: bool,
) -> Option<(Decision, Option<State>)> {
    let m = quota.units_per_nano();
    let k = u128::from(quota.clock_offset_units());
    let fill = u128::from(quota.burst()) * u128::from(quota.units_per_token());
    let now = u128::from(now_ns) * u128::from(m);
    // The engine's stamp (the empty instant, TAT less the fill) on a bucket clock that reads
    // `k` now; a TAT at or before now is a full bucket (the stamp `k − fill` or below: 0).
    let tat = state.map_or(0, |s| s.units(m));
    let stamp = (tat + k).saturating_sub(fill + now);
    // A TAT further ahead than a stamp holds (a quota of a far longer fill wrote it) is a
    // bucket empty for longer than anything: the largest stamp, toward refusal.
    let stamp = u64::try_from(stamp).unwrap_or(u64::MAX);
    let clock = quota.clock_offset_units();
    let decided = if take {
        quota.decide_stored(stamp, clock, n)
    } else {
        quota.peek_stored(stamp, clock, n).map(|d| (d, None))
    };
    let (decision, next) = decided?;
    // The next stamp is at least `k − fill` (the engine never stores below a full bucket).
    let next = next.map(|word| State::at_units((u128::from(word) + fill + now).saturating_sub(k), m));
    Some((decision, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate::{Limiter, ManualClock, Nanos};

    /// A day in 2026, in ns since the epoch.
    const T0: u64 = 1_780_000_000_000_000_000;

    #[test]
    fn redis_cells_readme_vector() {
        // CL.THROTTLE user123 15 30 60 on a fresh key: 0, 16, 15, -1, 2.
        let q = TokenBucket::redis_cell(15, 30, Duration::from_secs(60)).unwrap();
        let (d, next) = decide(&q, None, T0, 1, true).unwrap();
        let reply = d.cl_throttle(&q);
        assert_eq!(
            (reply.limited, reply.limit, reply.remaining, reply.retry_after, reply.reset_after),
            (0, 16, 15, -1, 2)
        );
        // The TAT is now + T: 2 s ahead, as redis-cell stores it.
        assert_eq!(next.unwrap().full_at_ns(), T0 + 2_000_000_000);
    }

    /// Random traffic at random instants: every decision equals a local limiter's on a clock
    /// started at the first instant, including quotas with fractional nanoseconds per token.
    #[test]
    fn every_decision_is_a_local_limiters() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        for (rate, burst) in [("3/s", 5), ("7/min", 2), ("1000/s", 50), ("1/h", 1), ("13/7s", 4)] {
            let q: TokenBucket = format!("{rate} burst={burst}").parse().unwrap();
            let clock = ManualClock::new();
            let local = Limiter::with_clock(q, clock.clone());
            let mut state = None;
            let mut at = 0u64;
            for _ in 0..2000 {
                at += next() % (q.fill_time().as_u64() / 3 + 1);
                let n = next() % (burst + 2);
                let take = next() % 4 != 0;
                clock.set(Nanos::new(at));
                let want = if take { local.check_n(n) } else { local.peek_n(n) };
                let (got, stored) = decide(&q, state, T0 + at, n, take).unwrap();
                assert_eq!(got, want, "{rate} burst={burst} at {at}: n {n}, take {take}");
                if let Some(s) = stored {
                    state = Some(s);
                }
            }
        }
    }

    #[test]
    fn a_coarser_state_is_read_rounded_up() {
        // A TAT in ns read by a quota of thirds of a ns: the same instant, three units each.
        let s = State::from_redis_cell(10);
        assert_eq!(s.units(3), 30);
        let fine = State::at_units(31, 3);
        assert_eq!((fine.tat_ns, fine.sub_units(), fine.full_at_ns()), (10, 1, 11));
        // Read in whole ns it rounds up, toward refusal.
        assert_eq!(fine.units(1), 11);
        assert_eq!(State::from_parts(fine.tat_ns, fine.meta), Some(fine));
        assert_eq!(State::from_parts(10, 0), None);
        assert_eq!(State::from_parts(10, 1 << 56 | 3 << 48 | 3), None);
    }
}
