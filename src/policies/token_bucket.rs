//! Quotas: a rate and a burst, compiled once into the fixed-point parameters the bucket uses.
//!
//! # Units
//!
//! The bucket counts time in *units* of `1/m` ns, where `m` (1 to 64) is chosen per quota, and
//! charges every token a whole number `t` of units. Both are integers, so every refill, charge
//! and cap is exact integer arithmetic: the bucket is exactly an ideal token bucket whose
//! per-token time is `t/m` ns, sampled at whole nanoseconds.
//!
//! `t/m` is the smallest such fraction that is at least the true per-token time
//! `T = period / tokens`. It equals `T` whenever `T·m` is an integer for some `m ≤ 64` (every
//! rate of `k` per second with `64·10⁹ / k` a whole number of 1/64 ns, for example 10/s, 3/s,
//! 1.25e10/s), and otherwise exceeds it by less than `1/64` ns, so the effective rate is never
//! above the configured one. The search stops at the smallest `m` that is exact or within 2⁻²⁴
//! of `T`, which keeps the bucket's lifetime (below) as long as possible.

use core::num::NonZeroU64;
use core::time::Duration;

use crate::engine::arith::{Divisor, MAX_BURST, MAX_FILL_UNITS, MAX_UNITS_PER_NANO};
use crate::engine::config::WORDS;
use crate::engine::decision::DecisionHead;
use crate::policies::bucket::{BucketWord, Verdict};
use crate::{ConfigError, Decision, Nanos, Rate};

/// Precision at which the unit search stops early: relative error at most 2⁻²⁴.
const EARLY_PRECISION_SHIFT: u32 = 24;

/// `Decision::meta` for a token bucket of `burst` (≤ 2^32 − 1) tokens at `m` units per ns
/// whose token divides by `per_token`: the burst, `m`, the shift, and the bit that is always set.
const fn decision_meta(burst: u64, m: u64, per_token: Divisor) -> NonZeroU64 {
    use crate::engine::decision::{META_M, META_SET, META_SHIFT};
    let [_, shift] = per_token.to_words();
    let word = burst | m << META_M | 1 << META_SET | shift << META_SHIFT;
    match NonZeroU64::new(word) {
        Some(word) => word,
        None => NonZeroU64::MIN, // never: bit META_SET is set
    }
}

/// A bucket instant: `now = fill + elapsed·m` units, and `floor = now − fill`, the stamp of a
/// bucket that is exactly full. Both are kept so that neither sits on the critical path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) now: u64,
    pub(crate) floor: u64,
}

impl At {
    /// The instant `base` units after a direct limiter's creation: its clock starts at the
    /// quota's offset (its own fill, unless built with headroom), so `now − fill` never
    /// underflows.
    #[inline]
    const fn new(q: &TokenBucket, base: u64) -> At {
        At { now: base + q.offset, floor: base + q.lead }
    }
}

/// A rate limit: a refill rate and a burst (the bucket's capacity), plus the level the bucket
/// starts at (full unless [`with_initial`](TokenBucket::with_initial) says otherwise, as Envoy's).
///
/// # Ranges
///
/// | what | supported |
/// |---|---|
/// | rate | 1 token per 2^62 ns (146 years) to 64 tokens per ns (6.4e10/s); periods from 1 ns to 2^64 − 1 ns |
/// | burst | 1 to 2^32 − 1 tokens |
/// | fill time, `burst × period / tokens` | at most 2^62 ns ≈ 146 years |
/// | cost of one request | 1 to the burst; more is [`Outcome::Insufficient`](crate::Outcome::Insufficient) |
///
/// Every burst up to 2^32 − 1 works with any rate of at least one token per 1.07 s; at one
/// token per day, bursts up to 53,375 do. Anything outside these ranges is a [`ConfigError`]
/// naming the limit.
///
/// # Precision
///
/// The per-token time `T = period / tokens` is rounded **up** to `t/m` ns (the rate down).
/// Exact ([`is_exact`](TokenBucket::is_exact)) when `T·m` is whole for some `m ≤ 64` whose
/// fill time fits (`burst·T·m ≤ 2^62`): 10/s, 1/day, 1.25e10/s, Envoy's 1 per 1 s, …
/// Otherwise the rate's relative error is at most `max(2⁻²⁴, 1/(M·T))`, `T` in ns and `M` the
/// largest `m ≤ 64` with `burst·⌈T·m⌉ ≤ 2^62`: `M = 64` for fill times up to 2^55 ns (1.1
/// years), and a larger burst forces a coarser unit, down to `m = 1`. See
/// [`units_per_token`](TokenBucket::units_per_token).
///
/// # Lifetime
///
/// A limiter counts time from its creation in `1/m` ns units inside one `u64`, so it can run for
/// [`lifetime`](TokenBucket::lifetime): `(2^64 − 1 − 2·fill)/m` ns (with the largest fill time
/// it may be given, [`with_max_fill_time`](TokenBucket::with_max_fill_time)), at least 2^57 ns ≈ 4.5 years, and
/// 584 years for any rate that is exact at `m = 1`. Beyond it the clock stops for the bucket:
/// no more refill, so it never over-admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    rate: Rate,
    burst: u64,
    initial: u64,
    /// `m`: time units per nanosecond.
    units_per_nano: u64,
    /// `t`: time units per token.
    units_per_token: u64,
    /// `burst · t`: the fill time, in units.
    fill_units: u64,
    /// The largest elapsed nanosecond count the units can express; time saturates there.
    max_elapsed: u64,
    /// Divides by `units_per_token`.
    per_token: Divisor,
    /// The two words a token bucket's [`Decision`] starts from: the burst, `m` and the
    /// divisor's shift, packed (`decision_meta`), so that a decision only ORs its outcome in,
    /// and the divisor's multiplier; side by side as in a decision, so that an admission's
    /// copies them as one 16-byte move.
    decision: DecisionHead,
    /// Where a direct limiter's clock starts, in units: the largest fill time the limiter may
    /// be given at runtime ([`with_max_fill_time`](TokenBucket::with_max_fill_time); its own
    /// fill by default). A bucket's clock is `offset + elapsed·m`, so its empty instant means
    /// the same time under every quota of fill at most `offset`. Keyed tables use their own.
    offset: u64,
    /// `offset − fill`: the floor's distance from the clock's start (0 by default), so that a
    /// decision computes the instant and the floor with two independent adds.
    lead: u64,
}

impl TokenBucket {
    /// The largest burst: `2^32 − 1` tokens.
    pub const MAX_BURST: u64 = MAX_BURST;

    /// `rate` with a capacity of `burst` tokens. The bucket starts full.
    pub fn new(rate: Rate, burst: u64) -> Result<TokenBucket, ConfigError> {
        if rate.tokens() == 0 {
            return Err(ConfigError::ZeroRate);
        }
        let period = Nanos::try_from(rate.period())?.as_u64();
        if period == 0 {
            return Err(ConfigError::ZeroPeriod);
        }
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        if burst > MAX_BURST {
            return Err(ConfigError::BurstTooLarge { burst });
        }
        let tokens = rate.tokens();
        if u128::from(period) * u128::from(MAX_UNITS_PER_NANO) < u128::from(tokens) {
            return Err(ConfigError::RateTooHigh { tokens, period_nanos: period });
        }
        let (m, t) = choose_units(tokens, period, burst).ok_or(ConfigError::FillTimeTooLong {
            burst,
            tokens,
            period_nanos: period,
        })?;
        let fill_units = burst * t;
        let per_token = Divisor::new(t);
        Ok(TokenBucket {
            rate,
            burst,
            initial: burst,
            units_per_nano: m,
            units_per_token: t,
            fill_units,
            max_elapsed: (u64::MAX - 2 * fill_units) / m,
            per_token,
            decision: DecisionHead::new(decision_meta(burst, m, per_token), per_token.to_words()[0]),
            offset: fill_units,
            lead: 0,
        })
    }

    /// `n` per second, with a burst of `n`.
    pub fn per_second(n: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per_second(n), n)
    }
    /// `n` per minute, with a burst of `n`.
    pub fn per_minute(n: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per_minute(n), n)
    }
    /// `n` per hour, with a burst of `n`.
    pub fn per_hour(n: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per_hour(n), n)
    }
    /// `n` per day, with a burst of `n`.
    pub fn per_day(n: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per_day(n), n)
    }

    /// Envoy's `envoy.type.v3.TokenBucket`: `max_tokens` capacity, refilled with
    /// `tokens_per_fill` every `fill_interval`, starting full.
    ///
    /// Refill is continuous, as in Envoy's current `AtomicTokenBucketImpl` (1 token per
    /// `fill_interval / tokens_per_fill`), not the legacy timer's step of `tokens_per_fill`.
    pub fn envoy(
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval: Duration,
    ) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(Rate::per(u64::from(tokens_per_fill), fill_interval), u64::from(max_tokens))
    }

    /// The same rate with another burst. The initial level becomes the new burst (full).
    pub fn with_burst(self, burst: u64) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(self.rate, burst)
    }

    /// The same quota, with the bucket starting at `initial` tokens instead of full.
    pub fn with_initial(self, initial: u64) -> Result<TokenBucket, ConfigError> {
        if initial > self.burst {
            return Err(ConfigError::InitialAboveBurst { initial, burst: self.burst });
        }
        Ok(TokenBucket { initial, ..self })
    }

    /// The same quota, in a direct limiter whose quota may later be replaced
    /// ([`Direct::set_policy`](crate::Direct::set_policy)) by one whose fill time
    /// (`burst × period / tokens`) is up to `max` (default: this quota's own fill time). The
    /// headroom shortens the limiter's [`lifetime`](TokenBucket::lifetime) by as much. Keyed
    /// tables take [`KeyedBuilder::max_fill_time`](crate::KeyedBuilder::max_fill_time) instead.
    pub fn with_max_fill_time(self, max: Duration) -> Result<TokenBucket, ConfigError> {
        let m = self.units_per_nano();
        let units = u128::from(Nanos::try_from(max)?.as_u64()) * u128::from(m);
        if units > u128::from(MAX_FILL_UNITS) {
            return Err(ConfigError::FillTimeTooLong {
                burst: self.burst,
                tokens: self.rate.tokens(),
                period_nanos: Nanos::from_duration_saturating(self.rate.period()).as_u64(),
            });
        }
        #[expect(clippy::cast_possible_truncation, reason = "at most MAX_FILL_UNITS")]
        let offset = (units as u64).max(self.fill_units);
        Ok(TokenBucket {
            offset,
            lead: offset - self.fill_units,
            max_elapsed: (u64::MAX - 2 * offset) / m,
            ..self
        })
    }

    /// The largest fill time a direct limiter of this quota may be given at runtime, rounded
    /// up to whole nanoseconds (see [`with_max_fill_time`](TokenBucket::with_max_fill_time)).
    pub fn max_fill_time(&self) -> Nanos {
        Nanos::new(self.offset.div_ceil(self.units_per_nano()))
    }

    /// The configured rate.
    pub const fn rate(&self) -> Rate {
        self.rate
    }
    /// The burst: the bucket's capacity, in tokens.
    #[inline]
    pub const fn burst(&self) -> u64 {
        let burst = self.burst;
        // SAFETY: `new` refuses a burst of 0 or above `MAX_BURST`, every other constructor
        // keeps a built quota's burst, and `from_words` (reachable from outside, see there)
        // clamps what it reads. Told to the compiler, a request of one token is never above
        // the burst: no test on that path.
        unsafe { core::hint::assert_unchecked(burst >= 1 && burst <= MAX_BURST) };
        burst
    }

    /// Whether a request for `n` tokens takes none: `n = 0`, or `n` above the burst (never
    /// fits). Written `n − 1 > burst − 1` (the burst is at least 1), so that for a constant
    /// `n = 1` (`check`) it is false at compile time: no load, no branch.
    #[inline(always)]
    pub(crate) const fn takes_none(&self, n: u64) -> bool {
        n.wrapping_sub(1) > self.burst.wrapping_sub(1)
    }
    /// The level, in tokens, that a new bucket starts at.
    pub const fn initial(&self) -> u64 {
        self.initial
    }
    /// `m`: the bucket counts time in units of `1/m` ns (1 ≤ m ≤ 64).
    #[inline]
    pub const fn units_per_nano(&self) -> u64 {
        let m = self.units_per_nano;
        // SAFETY: every quota is built with `1 ≤ m ≤ MAX_UNITS_PER_NANO`: `new` takes `m` from
        // `choose_units` (which tries 1..=64 only), `compiled_at` from a quota built so, and
        // `from_words`, which any caller can reach through the public
        // `Algorithm::from_config_words`, clamps what it reads into that range. Told to the
        // compiler, a wait's bound (`max_wait · m`) and a division by `m` need no test for
        // zero on a reservation.
        unsafe { core::hint::assert_unchecked(m >= 1 && m <= MAX_UNITS_PER_NANO) };
        m
    }
    /// `t`: each token costs exactly `t` time units, so the effective per-token time is `t/m` ns,
    /// never less than `period / tokens`.
    pub const fn units_per_token(&self) -> u64 {
        self.units_per_token
    }
    /// Whether the bucket runs at exactly the configured rate: its per-token time `t/m` ns equals
    /// `period / tokens`. Otherwise the rate is rounded down (see the type docs for the bound).
    pub fn is_exact(&self) -> bool {
        let period = u128::from(Nanos::from_duration_saturating(self.rate.period()).as_u64());
        u128::from(self.units_per_token) * u128::from(self.rate.tokens())
            == period * u128::from(self.units_per_nano())
    }

    /// The time to refill from empty to full, rounded up to whole nanoseconds.
    pub fn fill_time(&self) -> Nanos {
        Nanos::new(self.fill_units.div_ceil(self.units_per_nano()))
    }
    /// How long after its creation a limiter with this quota keeps refilling (see the type docs).
    pub const fn lifetime(&self) -> Nanos {
        Nanos::new(self.max_elapsed)
    }

    // ---- a bucket whose word is kept elsewhere ----
    //
    // A bucket's whole state is one `u64`, its *stamp*: the instant it was (or will be) empty,
    // on a clock that counts `1/m` ns units from `offset_units()` at its start. These three
    // functions decide on such a word held outside the process (a Redis key, a database row):
    // the store keeps the word and the clock's start, and does the compare-and-set; the
    // decision is this engine's, bit for bit.

    /// The bucket clock `elapsed` after its start: `offset_units() + elapsed·m` units,
    /// saturating at the [lifetime](TokenBucket::lifetime). A stored word is compared with
    /// this clock (see [`decide_stored`](TokenBucket::decide_stored)).
    pub const fn clock_units(&self, elapsed: Nanos) -> u64 {
        self.now_units(elapsed).now
    }

    /// Where a bucket's clock starts, in units: its fill time, or more with
    /// [`with_max_fill_time`](TokenBucket::with_max_fill_time). A bucket holding `offset`
    /// units of clock can take any quota of this unit whose fill is at most that.
    pub const fn clock_offset_units(&self) -> u64 {
        self.offset
    }

    /// Decides `n` tokens on a bucket whose stamp `word` is stored elsewhere, at the bucket
    /// clock `now` ([`clock_units`](TokenBucket::clock_units)). Returns the decision and, when
    /// tokens were taken, the word to store in its place (compare-and-set against `word`).
    /// An absent bucket is a full one: the word `now − fill` (or anything below it).
    ///
    /// The decision is exactly [`Limiter::check_n`](crate::Limiter::check_n)'s at that
    /// instant; `n = 0` and `n > burst` take nothing. `None` when `now` is below the fill
    /// (`clock_units` never returns such a clock), rather than a wrong answer.
    ///
    /// ```
    /// use tollgate::{Nanos, TokenBucket};
    ///
    /// let q = TokenBucket::per_second(2)?;
    /// let now = q.clock_units(Nanos::new(0));
    /// let full = 0; // any word at or below `now − fill` is a full bucket
    /// let (first, word) = q.decide_stored(full, now, 2).unwrap();
    /// assert!(first.is_allowed_now() && first.remaining() == 0);
    /// let (second, none) = q.decide_stored(word.unwrap(), now, 1).unwrap();
    /// assert_eq!(second.retry_after_nanos(), Some(Nanos::new(500_000_000)));
    /// assert_eq!(none, None);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn decide_stored(&self, word: u64, now: u64, n: u64) -> Option<(Decision, Option<u64>)> {
        let at = self.stored_instant(now)?;
        let word = BucketWord::from_raw(word);
        if self.takes_none(n) {
            return Some((word.peek(self, at, n), None));
        }
        Some(match word.decide(self, at, n) {
            Verdict::Take { next } => (next.taken(self, at), Some(next.raw())),
            Verdict::Final(d) => (d, None),
        })
    }

    /// What `n` tokens would get from the stored `word` at the bucket clock `now`, taking
    /// nothing ([`Limiter::peek_n`](crate::Limiter::peek_n)'s answer). `None` as for
    /// [`decide_stored`](TokenBucket::decide_stored).
    pub fn peek_stored(&self, word: u64, now: u64, n: u64) -> Option<Decision> {
        let at = self.stored_instant(now)?;
        Some(BucketWord::from_raw(word).peek(self, at, n))
    }

    fn stored_instant(&self, now: u64) -> Option<At> {
        Some(At { now, floor: now.checked_sub(self.fill_units)? })
    }

    /// This quota counted in `m` units per nanosecond, for a keyed table whose tiers share one
    /// time base: `t = ceil(T·m)`, so the rate is the configured one or lower (exactly as in
    /// [`TokenBucket::new`] when `m` is the quota's own). `lifetime` is the table's. The fill time must
    /// stay within `max_fill` units.
    pub(crate) fn in_units(self, m: u64, max_fill: u64, lifetime: u64) -> Result<TokenBucket, ConfigError> {
        // A keyed table reclaims full buckets as fresh keys: a fresh key must start full.
        if self.initial < self.burst {
            return Err(ConfigError::KeyedInitialBelowBurst { initial: self.initial, burst: self.burst });
        }
        self.compiled_at(m, max_fill, lifetime)
    }

    /// This quota for a running direct limiter built with `built` (see
    /// [`Direct::set_policy`](crate::Direct::set_policy)): counted at its `m`, from its clock's
    /// `offset`, with its lifetime; the fill may be at most that offset.
    pub(crate) fn for_running(self, built: &TokenBucket) -> Result<TokenBucket, ConfigError> {
        let m = built.units_per_nano();
        match self.compiled_at(m, built.offset, built.max_elapsed) {
            Ok(q) => Ok(TokenBucket { offset: built.offset, lead: built.offset - q.fill_units, ..q }),
            Err(ConfigError::TierFillTooLong { fill_nanos, max_nanos }) => {
                Err(ConfigError::FillAboveMaxFillTime { fill_nanos, max_nanos })
            }
            Err(e) => Err(e),
        }
    }

    /// This quota at `m` units per nanosecond: `t = ceil(T·m)`, the fill within `max_fill`.
    fn compiled_at(self, m: u64, max_fill: u64, lifetime: u64) -> Result<TokenBucket, ConfigError> {
        let period = u128::from(Nanos::try_from(self.rate.period())?.as_u64());
        let t = (period * u128::from(m)).div_ceil(u128::from(self.rate.tokens())).max(1);
        let fill = t * u128::from(self.burst);
        if fill > u128::from(max_fill) {
            return Err(ConfigError::TierFillTooLong {
                fill_nanos: u64::try_from(fill.div_ceil(u128::from(m))).unwrap_or(u64::MAX),
                max_nanos: max_fill / m,
            });
        }
        #[expect(clippy::cast_possible_truncation, reason = "t ≤ fill ≤ max_fill, a u64")]
        let (t, fill) = (t as u64, fill as u64);
        let per_token = Divisor::new(t);
        Ok(TokenBucket {
            units_per_nano: m,
            units_per_token: t,
            fill_units: fill,
            max_elapsed: lifetime,
            per_token,
            decision: DecisionHead::new(decision_meta(self.burst, m, per_token), per_token.to_words()[0]),
            offset: fill,
            lead: 0,
            ..self
        })
    }

    /// Where a direct limiter's clock starts, in units: the most debt its word has room for.
    pub(crate) const fn offset_units(&self) -> u64 {
        self.offset
    }

    /// The fill time in units.
    #[inline]
    pub(crate) const fn fill_units(&self) -> u64 {
        self.fill_units
    }

    /// The quota as words, for storage in atomics ([`TokenBucket::from_words`] reverses it).
    pub(crate) fn words(&self) -> [u64; WORDS] {
        [
            self.rate.tokens(),
            Nanos::from_duration_saturating(self.rate.period()).as_u64(),
            self.burst,
            self.initial,
            self.units_per_nano | self.per_token.to_words()[1] << 32,
            self.units_per_token,
            self.max_elapsed,
            self.per_token.to_words()[0],
            self.offset,
            0, // free: a queued bucket's bound (see `Queued`)
        ]
    }

    /// A quota from [`TokenBucket::words`].
    pub(crate) fn from_words(w: [u64; WORDS]) -> TokenBucket {
        let [tokens, period, burst, initial, m_shift, t, max_elapsed, magic, offset, _] = w;
        // The engine reads back only words a quota wrote (`words`), whose burst and `m` are in
        // range; but `Algorithm::from_config_words` is public, so any words can arrive here.
        // Clamped, because `burst` and `units_per_nano` vouch for them to the compiler: the
        // clamp is what keeps that sound. (Words no quota wrote give a nonsense quota, not
        // undefined behaviour.)
        let burst = burst.clamp(1, MAX_BURST);
        let m = (m_shift & 0xffff_ffff).clamp(1, MAX_UNITS_PER_NANO);
        let per_token = Divisor::from_words([magic, m_shift >> 32]);
        TokenBucket {
            rate: Rate::per(tokens, Duration::from_nanos(period)),
            burst,
            initial,
            units_per_nano: m,
            units_per_token: t,
            fill_units: burst * t,
            max_elapsed,
            per_token,
            decision: DecisionHead::new(decision_meta(burst, m, per_token), per_token.to_words()[0]),
            offset,
            lead: offset - burst * t,
        }
    }

    // ---- crate-internal fixed-point helpers, all exact ----

    /// [`Decision`]'s first two words for this quota, outcome `Allowed` (code 0): its packed
    /// word and the multiplier that divides by `t` (never zero: see [`Divisor::new`]).
    #[inline(always)]
    pub(crate) const fn decision_head(&self) -> DecisionHead {
        self.decision
    }

    /// Whether `d`, a check's decision on `n` tokens under this quota, is a denial on a stamp
    /// ahead of the clock reading it was made at: `missing = stamp − (now − cost) > cost`. A
    /// decision that takes leaves its stamp at or below its own reading
    /// (`max(stamp, floor) + cost ≤ now`), so such a stamp was stored at a later reading than
    /// this one: the reading went stale before the word was read (the thread descheduled
    /// between the two while others decided), and the bucket may hold the tokens by now. A
    /// bucket in debt to a reservation, a key started from a ghost (rounded up), and one
    /// decided at a later time (a caller's `check_n_at`, a core whose clock leads) have such
    /// stamps too: deciding those denials again costs a clock read. On the admission path
    /// `missing` is 0: one compare.
    #[inline(always)]
    pub(crate) fn stale(&self, d: &Decision, n: u64) -> bool {
        // Saturating: the keyed counted path reads a tier's quota again for this test, and one
        // replaced meanwhile may cost far more per token than the one `n` was checked against
        // (then the test only decides whether to read the clock again).
        let missing = d.units().0;
        missing != 0 && missing > n.saturating_mul(self.units_per_token)
    }

    /// `n` tokens in units. Callers guarantee `n ≤ burst`, so this is at most `fill_units`.
    #[inline]
    pub(crate) const fn cost_units(&self, n: u64) -> u64 {
        n * self.units_per_token
    }

    /// The bucket's clock: `fill + elapsed·m`, so that a full bucket's stamp (`now − fill`)
    /// never underflows. Saturates at the lifetime, leaving `fill` units of headroom above.
    #[inline]
    pub(crate) const fn now_units(&self, elapsed: Nanos) -> At {
        let e = elapsed.as_u64();
        let e = if e > self.max_elapsed { self.max_elapsed } else { e };
        At::new(self, e * self.units_per_nano())
    }

    /// [`now_units`](TokenBucket::now_units) of `now − origin`, with `now` before `origin` read as
    /// `origin` ([`Nanos::units_since`]).
    #[inline]
    pub(crate) fn instant(&self, now: Nanos, origin: Nanos) -> At {
        At::new(self, now.units_since(origin, self.max_elapsed, self.units_per_nano()))
    }
}

/// Picks `(m, t)`: `t = ceil(T·m)` with `T = period/tokens`, `m` in `1..=64`, `burst·t ≤ 2^62`.
///
/// An exact `m` wins: `tokens / gcd(tokens, period)`, the smallest `m` with `T·m` whole. Failing
/// that, the first `m` within 2⁻²⁴ of `T`; failing that, the `m` with the smallest `t/m` (the
/// most precise), the smallest such `m` on ties. `None` when even `m = 1` overflows the fill time.
fn choose_units(tokens: u64, period: u64, burst: u64) -> Option<(u64, u64)> {
    let fits = |m: u64| -> Option<u64> {
        let t = (u128::from(period) * u128::from(m)).div_ceil(u128::from(tokens));
        let ok = t * u128::from(burst) <= u128::from(MAX_FILL_UNITS);
        #[expect(clippy::cast_possible_truncation, reason = "t ≤ burst·t ≤ 2^62")]
        ok.then_some(t as u64)
    };
    let exact_m = tokens / gcd(tokens, period);
    if exact_m <= MAX_UNITS_PER_NANO {
        if let Some(t) = fits(exact_m) {
            return Some((exact_m, t));
        }
    }
    let mut best: Option<(u64, u64)> = None;
    for m in 1..=MAX_UNITS_PER_NANO {
        let Some(t) = fits(m) else { break }; // `t` only grows with `m`
        let num = u128::from(period) * u128::from(m);
        // The excess of `t/m` over `T`, relative: (t·tokens − num) / num.
        let excess = u128::from(t) * u128::from(tokens) - num;
        if excess << EARLY_PRECISION_SHIFT <= num {
            return Some((m, t));
        }
        // t/m < t_best/m_best  ⇔  t·m_best < t_best·m
        match best {
            Some((bm, bt)) if u128::from(t) * u128::from(bm) >= u128::from(bt) * u128::from(m) => {}
            _ => best = Some((m, t)),
        }
    }
    best
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The precision the docs state: exact when `T·m` is whole for an `m ≤ 64` whose fill
        /// fits; otherwise rounded down by at most `max(2^-24, 1/(M·T))`, `M` the largest
        /// `m ≤ 64` with `burst·⌈T·m⌉ ≤ 2^62`.
        #[test]
        fn the_documented_precision_holds(
            tokens in 1u64..1 << 40,
            period in 1u64..1 << 50,
            burst in 1u64..=MAX_BURST,
        ) {
            let Ok(q) = TokenBucket::new(Rate::per(tokens, Duration::from_nanos(period)), burst) else {
                return Ok(());
            };
            // What `units_per_nano` and `burst` vouch for to the compiler, read from the fields;
            // and a quota's words give back the same quota.
            proptest::prop_assert!((1..=MAX_UNITS_PER_NANO).contains(&q.units_per_nano), "{q:?}");
            proptest::prop_assert!((1..=MAX_BURST).contains(&q.burst), "{q:?}");
            proptest::prop_assert_eq!(TokenBucket::from_words(q.words()), q);
            let (m, t) = (u128::from(q.units_per_nano()), u128::from(q.units_per_token()));
            let (tokens, period, burst) = (u128::from(tokens), u128::from(period), u128::from(burst));
            // Never faster than configured: t/m ≥ period/tokens.
            proptest::prop_assert!(t * tokens >= period * m);
            let fits = |m: u128| burst * (period * m).div_ceil(tokens) <= 1 << 62;
            let exact_m = (1..=64).find(|&m| (period * m) % tokens == 0 && fits(m));
            proptest::prop_assert_eq!(q.is_exact(), exact_m.is_some());
            if exact_m.is_none() {
                let big_m = (1..=64u128).rev().find(|&m| fits(m)).unwrap();
                // excess/period·m ≤ max(2^-24, 1/(M·T)) with T = period/tokens:
                // (t·tokens − period·m)/(period·m) ≤ max(2^-24, tokens/(M·period)).
                let excess = t * tokens - period * m;
                let within_early = excess << 24 <= period * m;
                let within_m = excess * big_m * period <= tokens * period * m;
                proptest::prop_assert!(within_early || within_m, "m {} t {} M {}", m, t, big_m);
            }
        }
    }

    /// A token bucket's decision (the reciprocal form, from the quota's head) and one built
    /// from the same whole fields are equal and hash alike; any field that differs makes them
    /// unequal.
    #[test]
    fn a_quota_decision_equals_the_same_whole_fields() {
        use crate::Outcome;
        use core::hash::BuildHasher;
        let same_hasher = std::collections::hash_map::RandomState::new();
        let q = TokenBucket::per_second(10).unwrap(); // t = 1e8 units, m = 1, burst 10
        for until_full in [0, 1, 99_999_999, 100_000_000, 100_000_001, 999_999_999, 1_000_000_000] {
            let d = Decision::new(q.decision_head(), Outcome::Allowed, 0, until_full);
            let whole =
                Decision::allowed(u32::try_from(d.remaining()).unwrap(), Duration::from_nanos(until_full));
            assert_eq!(d, whole, "until_full {until_full}");
            assert_eq!(same_hasher.hash_one(d), same_hasher.hash_one(whole));
            // One unit nearer full is one more token exactly at each token's boundary.
            let expected = 10 - until_full.div_ceil(100_000_000);
            assert_eq!(d.remaining(), expected, "until_full {until_full}");
            let other = Decision::allowed(u32::try_from(expected).unwrap() + 1, d.reset_after());
            assert_ne!(d, other);
            let denied = Decision::new(q.decision_head(), Outcome::Denied, 5, until_full);
            assert_ne!(d, denied);
        }
    }

    #[test]
    fn round_rates_are_exact() {
        for (q, m, t) in [
            (TokenBucket::per_second(10).unwrap(), 1, 100_000_000),
            (TokenBucket::per_second(3).unwrap(), 3, 1_000_000_000),
            (TokenBucket::per_minute(100).unwrap(), 1, 600_000_000),
            (TokenBucket::per_day(1).unwrap(), 1, 86_400_000_000_000),
            (TokenBucket::new(Rate::per_second(12_500_000_000), 1 << 20).unwrap(), 25, 2),
            (TokenBucket::new(Rate::per_second(10_000_000_000), 1 << 20).unwrap(), 10, 1),
            (TokenBucket::new(Rate::per(64, Duration::from_nanos(1)), 1).unwrap(), 64, 1),
        ] {
            assert_eq!((q.units_per_nano(), q.units_per_token()), (m, t), "{q:?}");
        }
    }

    #[test]
    fn inexact_rates_round_down_within_the_bound() {
        for (tokens, period) in
            [(9_999_999_999u64, 1_000_000_000u64), (7, 1_000_000_001), (1_000_003, 99_999)]
        {
            let q = TokenBucket::new(Rate::per(tokens, Duration::from_nanos(period)), 1).unwrap();
            let (m, t) = (u128::from(q.units_per_nano()), u128::from(q.units_per_token()));
            let (tokens, period) = (u128::from(tokens), u128::from(period));
            // t/m ≥ period/tokens: never faster than configured.
            assert!(t * tokens >= period * m);
            // t/m < period/tokens + 1/64
            assert!(t * tokens * 64 < (period * 64 + tokens) * m);
        }
    }

    #[test]
    fn limits_are_typed_errors_at_their_boundaries() {
        assert_eq!(TokenBucket::per_second(0), Err(ConfigError::ZeroRate));
        assert_eq!(TokenBucket::new(Rate::per(1, Duration::ZERO), 1), Err(ConfigError::ZeroPeriod));
        assert_eq!(TokenBucket::new(Rate::per_second(1), 0), Err(ConfigError::ZeroBurst));
        assert!(TokenBucket::new(Rate::per_second(1), MAX_BURST).is_ok());
        assert_eq!(
            TokenBucket::new(Rate::per_second(1), MAX_BURST + 1),
            Err(ConfigError::BurstTooLarge { burst: MAX_BURST + 1 })
        );
        // 64 tokens per ns is the fastest rate; one more token is too fast.
        assert!(TokenBucket::new(Rate::per(64, Duration::from_nanos(1)), 1).is_ok());
        assert!(matches!(
            TokenBucket::new(Rate::per(65, Duration::from_nanos(1)), 1),
            Err(ConfigError::RateTooHigh { .. })
        ));
        // Fill time: burst × T ≤ 2^62 ns exactly at m = 1.
        let t = 1u64 << 30;
        assert!(TokenBucket::new(Rate::per(1, Duration::from_nanos(t)), (1 << 32) - 1).is_ok());
        assert!(matches!(
            TokenBucket::new(Rate::per(1, Duration::from_nanos(t + 1)), (1 << 32) - 1),
            Err(ConfigError::FillTimeTooLong { .. })
        ));
        assert!(TokenBucket::new(Rate::per_day(1), 53_375).is_ok());
        assert!(matches!(
            TokenBucket::new(Rate::per_day(1), 53_376),
            Err(ConfigError::FillTimeTooLong { .. })
        ));
        // Periods: the slowest rate is one token per 2^62 ns; a period beyond u64 ns is its own error.
        assert!(TokenBucket::new(Rate::per(1, Duration::from_nanos(1 << 62)), 1).is_ok());
        assert!(matches!(
            TokenBucket::new(Rate::per(1, Duration::from_nanos((1 << 62) + 1)), 1),
            Err(ConfigError::FillTimeTooLong { .. })
        ));
        assert!(TokenBucket::new(Rate::per(4, Duration::from_nanos(u64::MAX)), 1).is_ok());
        assert!(matches!(
            TokenBucket::new(Rate::per(1, Duration::from_nanos(u64::MAX) + Duration::from_nanos(1)), 1),
            Err(ConfigError::DurationTooLong { .. })
        ));
        assert_eq!(
            TokenBucket::per_second(5).unwrap().with_initial(6),
            Err(ConfigError::InitialAboveBurst { initial: 6, burst: 5 })
        );
        // Every message names its limit.
        assert!(ConfigError::BurstTooLarge { burst: 1 << 40 }.to_string().contains("4294967295"));
    }

    /// `from_words` keeps `m` and the burst in the range their accessors promise, even from
    /// words no quota wrote: the engine reads back only words a quota wrote, but
    /// `Algorithm::from_config_words` is public, and the accessors' promise rests on this.
    #[test]
    fn words_read_back_keep_m_and_the_burst_in_range() {
        let q = TokenBucket::per_second(10).unwrap();
        let mut w = q.words();
        w[2] = 0; // the burst
        w[4] &= !0xffff_ffff; // m
        let r = TokenBucket::from_words(w);
        assert_eq!((r.units_per_nano, r.burst), (1, 1));
        w[4] |= 0xffff_ffff;
        assert_eq!(TokenBucket::from_words(w).units_per_nano, MAX_UNITS_PER_NANO);
    }

    #[test]
    fn lifetime_is_at_least_four_and_a_half_years() {
        let worst = TokenBucket::new(Rate::per(64, Duration::from_nanos(1)), MAX_BURST).unwrap();
        assert!(worst.lifetime().as_u64() >= 1 << 57);
        assert_eq!(TokenBucket::per_second(10).unwrap().lifetime().as_u64(), u64::MAX - 2 * 1_000_000_000);
    }
}
