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

use tollgate::{Decision, FixedWindow, Nanos, Nginx, Policy, SlidingWindow, TokenBucket};

/// The kind of state in `meta`'s top byte: a token bucket's TAT.
const KIND_BUCKET: u64 = 1;
/// The other kinds hold the engine's own word (in `tat_ns`'s place) and, in `meta`, a
/// fingerprint of what the word's meaning depends on (22 bits) and the word's clock's origin,
/// whole seconds since the epoch (34 bits).
const KIND_WINDOW: u64 = 2;
const KIND_SLIDING: u64 = 3;
const KIND_NGINX: u64 = 4;
const ORIGIN_BITS: u32 = 34;
const FP_BITS: u32 = 22;
/// Where windows count from: 2020-01-01T00:00:00Z, in seconds since the Unix epoch (a whole
/// number of days: a window that divides a day keeps the epoch's grid). From 1970, a fixed
/// window's 40-bit index would already be spent for windows under 1.6 ms.
pub const WINDOW_EPOCH_S: u64 = 1_577_836_800;
/// The shortest fixed window: its 2^40 indices last 100 years from [`WINDOW_EPOCH_S`].
pub const MIN_FIXED_WINDOW: std::time::Duration = std::time::Duration::from_millis(3);

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
    /// A state from its fields, if they are one: a bucket's with `1 ≤ m ≤ 64` and the units
    /// below `m`; or a word of another kind.
    pub fn from_parts(tat_ns: u64, meta: u64) -> Option<State> {
        let s = State { tat_ns, meta };
        match meta >> 56 {
            KIND_BUCKET => ((1..=64).contains(&s.m()) && s.sub_units() < s.m()).then_some(s),
            KIND_WINDOW | KIND_SLIDING | KIND_NGINX => Some(s),
            _ => None,
        }
    }

    /// What the state counts, for an error.
    pub fn kind_name(self) -> &'static str {
        match self.meta >> 56 {
            KIND_BUCKET => "a token bucket",
            KIND_WINDOW => "a fixed window",
            KIND_SLIDING => "a sliding window",
            _ => "an nginx limit",
        }
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

/// A limit of `TG.*`: a token bucket (the default), or one of the engine's single-word
/// algorithms, in tollgate's string forms after an optional algorithm word: `"10/s
/// burst=20"`, `"window 100/min"`, `"sliding 100/min"`, `"nginx 10r/s burst=5 nodelay"`.
#[derive(Clone, Copy, Debug)]
pub enum Limit {
    Bucket(TokenBucket),
    Window(FixedWindow),
    Sliding(SlidingWindow),
    Nginx(Nginx),
}

impl std::str::FromStr for Limit {
    type Err = String;

    fn from_str(text: &str) -> Result<Limit, String> {
        let trimmed = text.trim_start();
        let (word, rest) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
        let why = |what: &str, e: tollgate::ParseError| format!("the limit '{text}' is not a {what}: {e}");
        Ok(match word {
            "bucket" | "token_bucket" | "gcra" => {
                Limit::Bucket(rest.parse().map_err(|e| why("token bucket", e))?)
            }
            "window" | "fixed_window" => {
                let w: FixedWindow = rest.parse().map_err(|e| why("fixed window", e))?;
                if w.window() < MIN_FIXED_WINDOW {
                    return Err(format!(
                        "the limit '{text}' is a fixed window of {:?}: at least {MIN_FIXED_WINDOW:?} (its windows' count runs out within 100 years otherwise)",
                        w.window()
                    ));
                }
                Limit::Window(w)
            }
            "sliding" | "sliding_window" => {
                Limit::Sliding(rest.parse().map_err(|e| why("sliding window", e))?)
            }
            "nginx" => Limit::Nginx(rest.parse().map_err(|e| why("nginx limit", e))?),
            _ => Limit::Bucket(text.parse().map_err(|e| why("token bucket", e))?),
        })
    }
}

impl Limit {
    /// The most units one decision can admit: what `TG.*` reports as `limit`.
    pub fn most_at_once(&self) -> u64 {
        match self {
            Limit::Bucket(q) => q.burst(),
            Limit::Window(w) => w.limit(),
            Limit::Sliding(w) => w.limit(),
            Limit::Nginx(l) => l.burst_size() + 1,
        }
    }

    /// The kind, the fingerprint of what a stored word's meaning depends on (the window's
    /// length; a window's count width too, a fixed window's when above 24 bits, so that the
    /// fingerprints of 24-bit windows stay as they were; nginx's rate, which its key's expiry
    /// depends on), and whether its clock starts at the key's first decision (else at
    /// [`WINDOW_EPOCH_S`]: windows on the wall clock's grid).
    fn word_kind(&self) -> (u64, u64, bool) {
        let fp = |x: u64| x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FP_BITS);
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match self {
            Limit::Bucket(_) => (KIND_BUCKET, 0, false),
            Limit::Window(w) => {
                let wide = if w.count_bits() > 24 { u64::from(w.count_bits()) << 58 } else { 0 };
                (KIND_WINDOW, fp(ns(w.window()) ^ wide), false)
            }
            Limit::Sliding(w) => {
                (KIND_SLIDING, fp(ns(w.window()) ^ u64::from(64 - w.limit().leading_zeros()) << 58), false)
            }
            Limit::Nginx(l) => (KIND_NGINX, fp(l.millirequests_per_second()), true),
        }
    }
}

/// A decision, and the state to store with the instant it is as good as missing.
pub type Decided = (Decision, Option<(State, u64)>);

/// Why a key's state cannot be decided under a limit: it counts something else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch(pub String);

/// `n` units under `limit` at `now_ns` on `state`, as [`decide`] does for buckets: the
/// decision, the state to store (when something was taken) and when it is as good as missing
/// (ns since the epoch, never early). A state of another kind, or of a window of another
/// length, is a [`Mismatch`], never read under the wrong meaning.
pub fn decide_limit(
    limit: &Limit,
    state: Option<State>,
    now_ns: u64,
    n: u64,
    take: bool,
) -> Result<Option<Decided>, Mismatch> {
    let (kind, fp, own_origin) = limit.word_kind();
    if let Some(s) = state {
        let (held_kind, held_fp) = (s.meta >> 56, (s.meta >> ORIGIN_BITS) & ((1 << FP_BITS) - 1));
        if held_kind != kind || (kind != KIND_BUCKET && held_fp != fp) {
            let what = if held_kind == kind { " of another length or width" } else { "" };
            return Err(Mismatch(format!("holds {}{what}, not what this limit counts", s.kind_name())));
        }
    }
    if let Limit::Bucket(q) = limit {
        return Ok(decide(q, state, now_ns, n, take).map(|(d, next)| (d, next.map(|s| (s, s.full_at_ns())))));
    }
    let origin_s = match state {
        Some(s) => s.meta & ((1 << ORIGIN_BITS) - 1),
        None if own_origin => (now_ns / 1_000_000_000).min((1 << ORIGIN_BITS) - 1),
        None => WINDOW_EPOCH_S,
    };
    let meta = kind << 56 | fp << ORIGIN_BITS | origin_s;
    let word = state.map_or(0, |s| s.tat_ns);
    let elapsed = Nanos::new(now_ns.saturating_sub(origin_s.saturating_mul(1_000_000_000)));
    let (next, decision) = match limit {
        Limit::Window(w) => w.decide(word, elapsed, n),
        Limit::Sliding(w) => w.decide(word, elapsed, n),
        Limit::Nginx(l) => l.decide(word, elapsed, n),
        Limit::Bucket(_) => unreachable!("decided above"),
    };
    let next = next.filter(|_| take).map(|w| {
        // When the state is as good as a missing key: a window's when its counts have aged
        // out (the decision's reset, after an admission); nginx's when its whole field (the
        // excess and the one request's 1,000) has leaked, counted from its last request, which
        // a clock stepped back leaves ahead of now.
        let expires = match limit {
            Limit::Nginx(l) => {
                let last_ns = (origin_s * 1000 + (w >> 24)).saturating_mul(1_000_000);
                let leak = (w & ((1 << 24) - 1))
                    .saturating_mul(1_000_000_000)
                    .div_ceil(l.millirequests_per_second());
                now_ns.max(last_ns).saturating_add(leak)
            }
            _ => now_ns.saturating_add(decision.reset_after_nanos().as_u64()),
        };
        (State { tat_ns: w, meta }, expires)
    });
    Ok(Some((decision, next)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate::{Limiter, ManualClock, Nanos};

    /// A day in 2026, in ns since the epoch.
    const T0: u64 = 1_780_000_000_000_000_000;

    /// xorshift64*: the tests' random numbers, from `seed`.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

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

    /// redis-cell's own test (`it_rate_limits` in its src/cell/mod.rs): a burst of 5, one a
    /// second; (ms after the start, quantity, remaining, reset after ms, retry after ms or -1,
    /// limited), each exact.
    #[test]
    fn redis_cells_own_vectors() {
        let q = TokenBucket::redis_cell(4, 1, Duration::from_secs(1)).unwrap();
        let cases: [(u64, u64, u64, u64, i64, bool); 15] = [
            (0, 6, 5, 0, -1, true),
            (0, 1, 4, 1000, -1, false),
            (0, 1, 3, 2000, -1, false),
            (0, 1, 2, 3000, -1, false),
            (0, 1, 1, 4000, -1, false),
            (0, 1, 0, 5000, -1, false),
            (0, 1, 0, 5000, 1000, true),
            (3000, 1, 2, 3000, -1, false),
            (3100, 1, 1, 3900, -1, false),
            (4000, 1, 1, 4000, -1, false),
            (8000, 1, 4, 1000, -1, false),
            (9500, 1, 4, 1000, -1, false),
            (9500, 0, 4, 1000, -1, false),
            (9500, 2, 2, 3000, -1, false),
            (9500, 5, 2, 3000, 3000, true),
        ];
        let mut state = None;
        for (i, &(at_ms, n, remaining, reset_ms, retry_ms, limited)) in cases.iter().enumerate() {
            let (d, next) = decide(&q, state, T0 + at_ms * 1_000_000, n, true).unwrap();
            let retry = match d.retry_after_nanos() {
                Some(wait) if !d.is_allowed() => i64::try_from(wait.as_u64() / 1_000_000).unwrap(),
                _ => -1,
            };
            let got = (d.remaining(), d.reset_after_nanos().as_u64() / 1_000_000, retry, !d.is_allowed());
            assert_eq!(got, (remaining, reset_ms, retry_ms, limited), "redis-cell's case {i}");
            if let Some(s) = next {
                state = Some(s);
            }
        }
    }

    /// Random traffic at random instants: every decision equals a local limiter's on a clock
    /// started at the first instant, including quotas with fractional nanoseconds per token.
    #[test]
    fn every_decision_is_a_local_limiters() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for (rate, burst) in [("3/s", 5), ("7/min", 2), ("1000/s", 50), ("1/h", 1), ("13/7s", 4)] {
            let q: TokenBucket = format!("{rate} burst={burst}").parse().unwrap();
            let clock = ManualClock::new();
            let local = Limiter::with_clock(q, clock.clone());
            let mut state = None;
            let mut at = 0u64;
            for _ in 0..2000 {
                at += next() % (q.fill_time().as_u64() / 3 + 1);
                let n = next() % (burst + 2);
                let take = !next().is_multiple_of(4);
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

    /// Windows and nginx through the module's states: every decision a local limiter's, on a
    /// clock whose origin is the epoch (windows) or the key's first decision (nginx).
    #[test]
    fn word_kinds_decide_as_local_limiters() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for spec in [
            "window 7/s",
            "window 100/min",
            "sliding 9/2s",
            "sliding 3000/min",
            "nginx 5r/s burst=3 nodelay",
            "nginx 30r/m burst=2",
        ] {
            let limit: Limit = spec.parse().unwrap();
            let mut state: Option<State> = None;
            let mut word = 0u64;
            let mut at = T0;
            for _ in 0..2000 {
                at += next() % 700_000_000;
                let n = next() % 4;
                let take = !next().is_multiple_of(4);
                let (d, stored) = decide_limit(&limit, state, at, n, take).unwrap().unwrap();
                let origin = state.map_or(
                    if matches!(limit, Limit::Nginx(_)) { at / 1_000_000_000 } else { WINDOW_EPOCH_S },
                    |s| s.meta & ((1 << ORIGIN_BITS) - 1),
                ) * 1_000_000_000;
                let elapsed = Nanos::new(at - origin);
                let (w, want) = match limit {
                    Limit::Window(p) => p.decide(word, elapsed, n),
                    Limit::Sliding(p) => p.decide(word, elapsed, n),
                    Limit::Nginx(p) => p.decide(word, elapsed, n),
                    Limit::Bucket(_) => unreachable!(),
                };
                assert_eq!(d, want, "{spec} at {at}: n {n}");
                if take {
                    if let Some(w) = w {
                        word = w;
                    }
                }
                if let Some((s, until)) = stored {
                    assert!(until > at || n == 0, "{spec}: a state that expires at once");
                    state = Some(s);
                }
            }
        }
        // A state of another kind or another window is refused, never misread.
        let w: Limit = "window 10/s".parse().unwrap();
        let (_, stored) = decide_limit(&w, None, T0, 1, true).unwrap().unwrap();
        let s = stored.unwrap().0;
        let other: Limit = "window 10/min".parse().unwrap();
        assert!(decide_limit(&other, Some(s), T0, 1, true).is_err());
        let bucket: Limit = "10/s".parse().unwrap();
        assert_eq!(
            decide_limit(&bucket, Some(s), T0, 1, true).unwrap_err().0,
            "holds a fixed window, not what this limit counts"
        );
        assert!("sliding often".parse::<Limit>().unwrap_err().contains("is not a sliding window"));
        assert!("window 5/2ms".parse::<Limit>().unwrap_err().contains("at least 3ms"));
        // nginx's key lives until its field has leaked from its last request, even when the
        // clock stepped back behind it.
        let l: Limit = "nginx 1r/s burst=4 nodelay".parse().unwrap();
        let (_, first) = decide_limit(&l, None, T0, 5, true).unwrap().unwrap();
        let (s, expires) = first.unwrap();
        assert_eq!(expires, T0 + 5_000_000_000);
        let faster: Limit = "nginx 2r/s burst=4 nodelay".parse().unwrap();
        assert!(decide_limit(&faster, Some(s), T0, 1, true).is_err(), "a rate change would move the expiry");
    }
}
