//! The token bucket's keyed table: a bucket per key in the lock-free table (`table.rs`), with
//! tiers, per-key overrides and forced eviction. Reached through [`Keyed`](crate::Keyed).

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use std::sync::Arc;

use super::key::{Key, KeyHasher, Words};
use super::table::{evictable, Decided, Now, Params, Rule, Shard, Table, MAX_UNITS};
use super::tiers::{Overrides, Tier, Tiers};
use super::{
    batch, hashers, prefetch, shard_count, stats_of, table_slots, KeyedBuilder, KeyedStats, Target, WhenFull,
    MAX_CAPACITY,
};
use core::time::Duration;

use crate::engine::admit::Receipt;
use crate::policies::bucket::BucketWord;
use crate::policies::reserve::KeyedParts;
use crate::policies::token_bucket::At;
use crate::{
    Cancelled, Clock, ConfigError, Counters, Decision, Nanos, Outcome, Reservation, ReserveError,
    TokenBucket, UpdateError,
};

/// Bucket instants in a table count from this many units, the largest fill time any tier may
/// have (2^60 units: 36 years at 1 ns), so that one time base serves every tier.
const OFFSET: u64 = 1 << 60;

/// A token bucket per key, for any number of keys, in memory fixed at construction.
///
/// Keys live in a sharded open-addressing table (see [`Key`] for the key types). A decision on a
/// tracked key is one clock read, one hash, a probe of the key's home group, and one CAS: no
/// lock and no allocation. A new key is inserted lock-free; two threads inserting the same key
/// share one bucket. A bucket that has refilled to full is identical to a fresh one, so the
/// table evicts it whenever it needs the room (and [`sweep`](KeyedLimiter::sweep) evicts all of
/// them): memory never grows, and no decision changes. When a new key finds no room, the
/// [`WhenFull`] policy decides.
///
/// ```
/// use tollgate::{KeyedLimiter, TokenBucket};
///
/// let limiter = KeyedLimiter::<u64>::new(TokenBucket::per_second(2)?, 10_000)?;
/// assert!(limiter.check(&7).is_allowed());
/// assert!(limiter.check(&7).is_allowed());
/// assert!(!limiter.check(&7).is_allowed()); // key 7 is out of tokens
/// assert!(limiter.check(&8).is_allowed()); // key 8 has its own bucket
///
/// let by_name = KeyedLimiter::<str>::new(TokenBucket::per_minute(60)?, 1_000)?;
/// assert!(by_name.check("tenant-a").is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// # Memory
///
/// 16 bytes per slot for keys of one word (integers, IPv4, fingerprinted strings), 24 for two
/// (`u128`, IPv6, `IpAddr`, byte arrays of 9 to 16), plus 2 bytes per slot of headers and
/// ghosts. At the table's maximum load of 7/8, a `u64` key costs 20.6 bytes.
///
/// # Time
///
/// The table keeps two bits of each bucket word for the slot's state, so a keyed limiter's
/// clock runs for [`lifetime`](KeyedLimiter::lifetime): a quarter of the direct limiter's
/// (146 years for rates exact at 1 ns, at least 1.1 years for the finest units).
#[doc(hidden)]
pub struct BucketTable<K: Key + ?Sized, C: Clock> {
    table: Table<K::Words>,
    overrides: Overrides<K::Words>,
    params: Params,
    origin: Nanos,
    clock: C,
    pub(crate) fingerprint: KeyHasher,
    id: u64,
    _key: PhantomData<fn(&K)>,
}

impl<K: Key + ?Sized, C: Clock> BucketTable<K, C> {
    /// Tables with [`WhenFull::EvictFullest`] issue no receipts (their refunds give nothing
    /// back): a key evicted before it is full comes back in a slot whose first stamp may
    /// belong to another key's history, below which no refund may go.
    pub(crate) fn charge_words(&self, words: K::Words, n: u64) -> (Decision, Option<Receipt>) {
        let l = self;
        let t = l.target(words);
        prefetch(t.group);
        let q = l.params.tiers.get(l.tier_of(t.words, t.hash));
        let base = l.base(l.clock.now());
        let d = l.decide_in(&q, &t, base, n).decision();
        if d.outcome() != Outcome::Allowed || n == 0 || l.params.when_full == WhenFull::EvictFullest {
            return (d, None);
        }
        let at = Self::at(&q, base);
        (d, Some(Receipt::new(l.id, t.hash, [at.now, q.fill_units(), q.cost_units(n)], n)))
    }

    /// Gives back `cost − (floor now − floor at the charge)`, as `AtomicBucket::refund` does,
    /// with the floor now taken under the smallest fill any tier has had: a decision under
    /// another tier (an override, `check_n_in`, a changed quota) clamps at its own floor,
    /// which is never above that one. So in a table whose tiers have different fill times, a
    /// key of a tier with a longer fill gets back `cost − (its fill − the smallest fill)`, often
    /// nothing: exact refunds need the key's tier to have the smallest fill (one tier, say).
    /// The decision that lowered the smallest fill happens-before any refund that sees its
    /// word (the decisions' CAS is `Release`, the refund's load `Acquire`).
    pub(crate) fn refund_words(&self, words: K::Words, r: Receipt) {
        let l = self;
        let t = l.target(words);
        let Some(([charged_now, charged_fill, cost], _)) = r.take(l.id, t.hash) else { return };
        let charged_floor = charged_now - charged_fill;
        let step = |w: u64| {
            // After the word's Acquire load (in `Shard::refund`): see `AtomicBucket::refund`.
            crate::sync::clock_after_loads();
            let now = OFFSET + l.base(l.clock.now());
            if now < charged_now {
                return None; // a clock behind the charge's: refund nothing
            }
            // In debt to a reservation (the word ahead of now), only the latest charge goes
            // back (see `AtomicBucket::refund_with`), and a charge is never the latest then:
            // its stamp is at most its own now.
            if w > now {
                return None;
            }
            let floor = now - l.params.tiers.min_fill().min(charged_fill);
            let owed = cost.saturating_sub(floor - charged_floor);
            // Never below the evictable line: a bucket full in every tier.
            (owed > 0).then(|| w.saturating_sub(owed).max(evictable(&l.params, now)))
        };
        t.shard.refund(t.words, t.home, step);
    }
}

/// Reservations on a key's bucket (`Keyed::reserve_n_at`, `Keyed::cancel_at`).
impl<K: Key + ?Sized, C: Clock> BucketTable<K, C> {
    /// `n` tokens for the key, now or as soon as its bucket has them, due at most `max_wait`
    /// (and one fill) from `now`: a decision whose stamp may lie ahead of `now`, by the same
    /// lock-free probe and CAS as a check (`Reserve` below), so later checks and reservations
    /// of the key queue behind it.
    pub(crate) fn reserve_words(
        &self,
        words: K::Words,
        now: Nanos,
        n: u64,
        max_wait: Duration,
        counters: &Option<Arc<Counters>>,
    ) -> Result<Reservation, ReserveError> {
        let t = self.target(words);
        let tier = self.tier_of(t.words, t.hash);
        let r = self.reserve_in(&t, tier, now, n, max_wait);
        if let Some(c) = counters {
            crate::policies::reserve::count_reservation(c, tier, &r);
        }
        r
    }

    /// [`reserve_words`](KeyedLimiter::reserve_words) for the key `t` of tier `tier` (its index).
    #[inline(always)]
    fn reserve_in(
        &self,
        t: &Target<'_, K::Words>,
        tier: usize,
        now: Nanos,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, ReserveError> {
        let q = self.params.tiers.get(tier);
        if n > q.burst() {
            return Err(ReserveError::Insufficient { requested: n, burst: q.burst() });
        }
        let at = Self::at(&q, self.base(now));
        let parts = |stamp: u64| KeyedParts {
            owner: self.id,
            key_hash: t.hash,
            tokens: n,
            floor: at.floor,
            stamp,
            cost: q.cost_units(n),
        };
        if n == 0 {
            return Ok(Reservation::keyed(parts(0), now, 0));
        }
        let m = q.units_per_nano();
        let max_wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        // One fill of debt at most, or the caller's wait; and never a word past the largest a
        // slot holds (only near the end of the table's lifetime).
        let limit = q.fill_units().min(max_wait_ns.saturating_mul(m)).min(MAX_UNITS - at.now);
        let rule = Reserve { now: Now { p: &self.params, q: &q, at }, max_wait: limit };
        let d = match Shard::probe_group(t.group, t.words, &rule, n) {
            Some(d) => d.decision(),
            None => t.shard.acquire_next(t.words, t.hash, t.home, &rule, n),
        };
        match d.outcome() {
            Outcome::Allowed | Outcome::Delayed => {
                // `Reserve::taken` leaves the stored stamp in `until_full`, exactly.
                let stamp = at.floor + d.units().1;
                Ok(Reservation::keyed(parts(stamp), now, stamp.saturating_sub(at.now) / m))
            }
            // Admitted without a bucket (`WhenFull::Allow`): due at once, nothing to give back.
            Outcome::Untracked => Ok(Reservation::keyed(parts(0), now, 0)),
            Outcome::TableFull => Err(ReserveError::TableFull),
            _ => Err(ReserveError::TooLate {
                wait: d.retry_after().unwrap_or(Duration::MAX),
                max_wait: Duration::from_nanos((q.fill_units() / m).min(max_wait_ns)),
            }),
        }
    }

    /// Gives back what a reservation of this key still owes, by the rule of
    /// `AtomicBucket::refund` (while the key is in debt, only its latest reservation or charge,
    /// whole; out of debt, the cost less the floor's advance since), with the floors of
    /// [`refund_words`](BucketTable::refund_words): under the smallest fill any tier has had.
    /// `now()` is read after each load of the word.
    pub(crate) fn cancel_words(
        &self,
        words: K::Words,
        r: &Reservation,
        now: impl Fn() -> Nanos,
    ) -> Cancelled {
        let t = self.target(words);
        let p = r.keyed_parts();
        if p.owner != self.id || p.key_hash != t.hash {
            return Cancelled::Foreign;
        }
        // Nothing taken (no tokens, or admitted untracked); or a table whose forced evictions
        // may put the key back in a slot whose first stamp is another key's history, below
        // which nothing may go (as its receipts, see `charge_words`).
        if p.tokens == 0 || p.stamp == 0 || self.params.when_full == WhenFull::EvictFullest {
            return Cancelled::NothingOwed;
        }
        let charged_now = OFFSET + self.base(r.reserved_at());
        let charged_fill = charged_now - p.floor;
        let step = |w: u64| {
            // After the word's Acquire load (in `Shard::cancel`): see `AtomicBucket::refund`.
            crate::sync::clock_after_loads();
            let now = OFFSET + self.base(now());
            if now < charged_now {
                return None; // a clock behind the reservation's: give nothing
            }
            let owed = if w > now {
                // In debt: only the latest, whole (see `AtomicBucket::refund_with`).
                if w != p.stamp {
                    return None;
                }
                p.cost
            } else {
                let floor = now - self.params.tiers.min_fill().min(charged_fill);
                p.cost.saturating_sub(floor - p.floor)
            };
            // Never below the evictable line: a bucket full in every tier.
            (owed > 0).then(|| w.saturating_sub(owed).max(evictable(&self.params, now)))
        };
        if t.shard.cancel(t.words, t.home, step) {
            Cancelled::Returned
        } else {
            Cancelled::NothingOwed
        }
    }
}

/// A reservation's rule: a bucket decision that may go into debt, at most `max_wait` units
/// past `now` (see `BucketWord::reserve`). Everything else is the check's ([`Now`]).
struct Reserve<'a> {
    now: Now<'a>,
    max_wait: u64,
}

/// A reservation's rule over `now`, for the table's tests: a rule that tests a word's state
/// before it decides (`Rule::REFUSES_NOT_LIVE` is false).
#[cfg(all(test, not(tollgate_loom)))]
pub(crate) fn reserve_rule<'a>(now: &Now<'a>, max_wait: u64) -> impl Rule + 'a {
    Reserve { now: *now, max_wait }
}

impl Rule for Reserve<'_> {
    type Taken = BucketWord;
    const GHOSTS: bool = true;

    #[inline]
    fn fresh(&self) -> u64 {
        self.now.fresh()
    }

    #[inline]
    fn evictable(&self) -> u64 {
        self.now.evictable()
    }

    fn decide(&self, w: u64, n: u64) -> Result<(u64, BucketWord), Decision> {
        match BucketWord::from_raw(w).reserve(self.now.q, self.now.at, n, self.max_wait) {
            Ok((next, _)) => Ok((next.raw(), next)),
            // Too late: the wait it would have needed, in whole nanoseconds.
            Err(wait_ns) => Err(Decision::from_nanos(Outcome::Denied, 0, Nanos::new(wait_ns), Nanos::ZERO)),
        }
    }

    /// Allowed (due now) or delayed until the stamp, which `until_full` carries exactly
    /// (`stamp − floor`, in units) for `reserve_words`.
    fn taken(&self, next: BucketWord) -> Decision {
        let (at, stamp) = (self.now.at, next.raw());
        let outcome = if stamp > at.now { Outcome::Delayed } else { Outcome::Allowed };
        Decision::new(self.now.q.decision_head(), outcome, stamp.saturating_sub(at.now), stamp - at.floor)
    }

    #[inline]
    fn hasher(&self) -> &ahash::RandomState {
        self.now.hasher()
    }

    #[inline]
    fn when_full(&self) -> WhenFull {
        self.now.when_full()
    }
}

impl<K: Key + ?Sized, C: Clock> BucketTable<K, C> {
    /// Units since the limiter's creation (before the offset), saturating at the lifetime.
    ///
    /// A branch never taken, not two saturations: both ends go to one cold path, and
    /// the two conditional moves stay off the chain from the clock read to the CAS, which on
    /// every admission is the decision's critical path. The same as `Nanos::units_since`
    /// (the direct limiters'), written out here: through it, the origin, lifetime and `m`
    /// become the cold call's arguments and the compiler loads all three into registers ahead
    /// of the branch, three instructions more on every keyed decision (callgrind: 116 against
    /// 113), where this cold path takes only the table and reads them itself.
    #[inline]
    fn base(&self, now: Nanos) -> u64 {
        self.base_since(now.as_u64().wrapping_sub(self.origin.as_u64()))
    }

    /// [`base`](KeyedLimiter::base) of the time `origin + e mod 2^64`. One test for both ends:
    /// a time before the origin wraps above the span in range (`Tiers::new`).
    #[inline]
    fn base_since(&self, e: u64) -> u64 {
        let tiers = &self.params.tiers;
        if e >= tiers.open() {
            return self.base_saturated(e);
        }
        e * tiers.units_per_nano()
    }

    /// [`base_since`](KeyedLimiter::base_since) for a time before the origin (skew, or a
    /// caller's `now`) or past the lifetime: the origin, or the lifetime's end. The time is at
    /// or after the origin iff `origin + e` does not wrap.
    #[cold]
    #[inline(never)]
    fn base_saturated(&self, e: u64) -> u64 {
        let tiers = &self.params.tiers;
        let e = if e <= u64::MAX - self.origin.as_u64() { e.min(tiers.lifetime()) } else { 0 };
        e * tiers.units_per_nano()
    }

    /// The bucket instant of `base` under `q`.
    #[inline]
    fn at(q: &TokenBucket, base: u64) -> At {
        let now = OFFSET + base;
        At { now, floor: now - q.fill_units() }
    }

    /// The tier a key is decided under: its override, or the default.
    #[inline]
    fn tier_of(&self, words: K::Words, hash: u64) -> usize {
        if self.overrides.is_empty() {
            return 0;
        }
        self.overrides.get(words, hash).map_or(0, Tier::index)
    }

    #[inline]
    fn tier_index(&self, tier: Tier) -> usize {
        let i = tier.index();
        if i < self.params.tiers.len() {
            i
        } else {
            0
        }
    }

    /// Takes `n` tokens from `key`'s bucket now, all or none, counted into `counters` if the
    /// table counts its decisions (built with [`counters`](crate::KeyedBuilder::counters),
    /// which passes them here). `n = 0` is always allowed and takes nothing; `n` above the
    /// burst is [`Outcome::Insufficient`]. Neither inserts the key.
    ///
    /// One compare says "the time is in range, under the default tier's quota as built, not
    /// counted" (`Tiers::uncounted_default`): the uncounted common decision tests it once,
    /// where a test of its own for the counters cost three instructions more on every
    /// decision, and one of the flags apart from the time's range two more. A counted one under
    /// the default tier is decided inline as well, and counted out of line by its outcome's
    /// code alone (a decision returned from an out-of-line call comes back through memory:
    /// 4 ns more).
    // Always inline (as `check_n_at`, `Keyed`'s and `Direct::check_n_at`): out of line, the
    // decision is returned through memory and the call saves and restores six registers:
    // 1.17× the floor at 1K keys in the criterion bench, 1.12× inline.
    #[inline(always)]
    pub(crate) fn check_n_words(
        &self,
        words: K::Words,
        n: u64,
        counters: &Option<Arc<Counters>>,
    ) -> Decision {
        // Hash and start fetching the key's group before reading the clock: on CPUs where a
        // TSC read holds back later loads, the cache miss then overlaps the clock read.
        let t = self.target(words);
        prefetch(t.group);
        debug_assert_eq!(counters.is_some(), self.params.tiers.counted(), "counters iff built to count");
        let now = self.clock.now();
        // The time since the origin, tested with the tiers' flags in one compare (`base`'s
        // test and the flags': a time out of range, before the origin or past the lifetime,
        // takes the general path below; see `Tiers::uncounted_default`).
        let e = now.as_u64().wrapping_sub(self.origin.as_u64());
        match self.params.tiers.uncounted_default(e) {
            // `decide_fresh` written out: called here too, the compiler merged the two arms'
            // copies and the uncounted decision paid for the counted one's branch (101 → 106
            // instructions).
            Some(q) => match self.decide_in(q, &t, e * self.params.tiers.units_per_nano(), n) {
                Decided::Took(d) => d,
                Decided::Final(d) if q.stale(&d, n) => self.decide_late(words, n),
                Decided::Final(d) => d,
            },
            None => {
                let base = self.base_since(e);
                match (counters, self.params.tiers.built_default()) {
                    (Some(c), Some(q)) => {
                        let d = self.decide_fresh(q, &t, base, n);
                        super::count(c, d.outcome_code());
                        d
                    }
                    _ => self.decide_counted(t.words, t.hash, base, n, counters),
                }
            }
        }
    }

    /// [`decide_in`](KeyedLimiter::decide_in) at `base`, a reading of the table's clock: a
    /// denial on a stamp ahead of it ([`TokenBucket::stale`]) is decided again at a fresh one.
    #[inline(always)]
    fn decide_fresh(&self, q: &TokenBucket, t: &Target<'_, K::Words>, base: u64, n: u64) -> Decision {
        match self.decide_in(q, t, base, n) {
            Decided::Took(d) => d,
            Decided::Final(d) if q.stale(&d, n) => self.decide_late(t.words, n),
            Decided::Final(d) => d,
        }
    }

    /// A check's denial on a reading gone stale, decided again at a fresh one
    /// ([`TokenBucket::stale`]).
    #[cold]
    #[inline(never)]
    fn decide_late(&self, words: K::Words, n: u64) -> Decision {
        let t = self.target(words);
        // The word was loaded with Acquire (`Slot::load_live`), pairing with the Release CAS
        // that stored the stamp: the clock read after it is no earlier than that decision's.
        crate::sync::clock_after_loads();
        self.decide_key(&t, self.base(self.clock.now()), n)
    }

    /// [`check_n_words`](KeyedLimiter::check_n_words) off the common path: a key that may have
    /// an override, or a tier changed.
    #[inline(never)]
    fn decide_counted(
        &self,
        words: K::Words,
        hash: u64,
        base: u64,
        n: u64,
        counters: &Option<Arc<Counters>>,
    ) -> Decision {
        let tier = self.tier_of(words, hash);
        let mut d = self.decide(&self.locate(words, hash), tier, base, n);
        // The quota is read again only for a decision that missed time (a denial).
        if d.units().0 != 0 && self.params.tiers.get(tier).stale(&d, n) {
            d = self.decide_late(words, n);
        }
        if let Some(c) = counters {
            c.record_tier(tier, d.outcome_code());
        }
        d
    }

    /// [`check_n`](KeyedLimiter::check_n) at a caller-supplied `now`.
    ///
    /// Times must not run ahead of the ones later decisions use: the table reclaims a bucket
    /// once it is full as of the latest time it is given, and a key reclaimed at a later time
    /// comes back fresh at an earlier one. (The same holds for threads whose clocks disagree:
    /// a core whose clock leads by δ can reclaim a bucket δ early, worth up to δ·rate tokens.)
    #[inline(always)]
    pub(crate) fn check_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        let t = self.target(words);
        self.decide_key(&t, self.base(now), n)
    }

    /// [`check_n_in`](KeyedLimiter::check_n_in) at a caller-supplied `now`.
    #[inline]
    pub(crate) fn check_n_in_at_words(&self, words: K::Words, tier: Tier, now: Nanos, n: u64) -> Decision {
        let t = self.target(words);
        self.decide(&t, self.tier_index(tier), self.base(now), n)
    }

    /// Starts fetching the key's home group ([`Keyed::prefetch`](crate::Keyed::prefetch)).
    #[inline(always)]
    pub(crate) fn prefetch_words(&self, words: K::Words) {
        let t = self.target(words);
        prefetch(t.group);
    }

    /// A key's identity, hash, shard and home group, computed once per decision.
    #[inline]
    fn target(&self, words: K::Words) -> Target<'_, K::Words> {
        self.locate(words, words.hash_with(&self.params.hasher))
    }

    /// [`target`](KeyedLimiter::target) for a key already hashed.
    #[inline]
    fn locate(&self, words: K::Words, hash: u64) -> Target<'_, K::Words> {
        Target::new(&self.table, words, hash)
    }

    /// Decides under the key's tier: inline under the default tier's quota as built while no
    /// key has an override and no tier has changed (no lookup, no index), out of line otherwise.
    /// Counting is the caller's ([`check_n_words`](KeyedLimiter::check_n_words) merges its
    /// test into this one's).
    #[inline(always)]
    fn decide_key(&self, t: &Target<'_, K::Words>, base: u64, n: u64) -> Decision {
        match self.params.tiers.built_default() {
            Some(q) => self.decide_in(q, t, base, n).decision(),
            None => self.decide_tiered(t.words, t.hash, base, n),
        }
    }

    /// [`decide_key`](KeyedLimiter::decide_key) for a key that may have an override, or once a
    /// tier has changed.
    #[inline(never)]
    fn decide_tiered(&self, words: K::Words, hash: u64, base: u64, n: u64) -> Decision {
        let tier = self.tier_of(words, hash);
        self.decide(&self.locate(words, hash), tier, base, n)
    }

    #[inline]
    fn decide(&self, t: &Target<'_, K::Words>, tier: usize, base: u64, n: u64) -> Decision {
        match self.params.tiers.built(tier) {
            Some(q) => self.decide_in(q, t, base, n).decision(),
            None => self.decide_changed(t.words, t.hash, tier, base, n),
        }
    }

    // The functions out of line below take the key's words and hash and locate it again,
    // rather than take the target by reference: a reference would make the common path store
    // the whole target to memory on every decision for the rare one that calls them.

    /// [`decide`](KeyedLimiter::decide) once a tier has been changed: out of line, so that the
    /// common path stays one straight function.
    #[inline(never)]
    fn decide_changed(&self, words: K::Words, hash: u64, tier: usize, base: u64, n: u64) -> Decision {
        self.decide_in(&self.params.tiers.get(tier), &self.locate(words, hash), base, n).decision()
    }

    /// The decision, and whether it was an admission in the home group (which is never
    /// stale: `TokenBucket::stale` tests refusals only, and the test is not made on it).
    #[inline(always)]
    fn decide_in(&self, q: &TokenBucket, t: &Target<'_, K::Words>, base: u64, n: u64) -> Decided {
        let at = Self::at(q, base);
        if q.takes_none(n) {
            return Decided::Final(self.peek_located(q, t.words, t.hash, at, n));
        }
        let now = Now { p: &self.params, q, at };
        match Shard::probe_group(t.group, t.words, &now, n) {
            Some(d) => d,
            None => Decided::Final(self.decide_beyond_home(q, t.words, t.hash, base, n)),
        }
    }

    /// [`decide_in`](KeyedLimiter::decide_in) for a key not live in its home group.
    #[inline(never)]
    fn decide_beyond_home(&self, q: &TokenBucket, words: K::Words, hash: u64, base: u64, n: u64) -> Decision {
        let t = self.locate(words, hash);
        t.shard.acquire_next(words, hash, t.home, &Now { p: &self.params, q, at: Self::at(q, base) }, n)
    }

    /// [`peek_words`](KeyedLimiter::peek_words): `n = 0`, or an `n` above the burst.
    #[cold]
    fn peek_located(&self, q: &TokenBucket, words: K::Words, hash: u64, at: At, n: u64) -> Decision {
        self.peek_words(q, &self.locate(words, hash), at, n)
    }

    pub(crate) fn peek_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        let t = self.target(words);
        let q = self.params.tiers.get(self.tier_of(t.words, t.hash));
        self.peek_words(&q, &t, Self::at(&q, self.base(now)), n)
    }

    fn peek_words(&self, q: &TokenBucket, t: &Target<'_, K::Words>, at: At, n: u64) -> Decision {
        let fresh = Now { p: &self.params, q, at }.fresh();
        let word =
            t.shard.find(t.words, t.home).unwrap_or_else(|| t.shard.first_stamp(t.home, t.hash, fresh));
        BucketWord::from_raw(word).peek(q, at, n)
    }

    /// The tier named `name`, if the limiter was built with it (`"default"` is the default).
    pub(crate) fn tier(&self, name: &str) -> Option<Tier> {
        self.params.tiers.find(name)
    }

    /// A tier's current quota, as compiled for this table (in its time unit).
    pub(crate) fn tier_quota(&self, tier: Tier) -> TokenBucket {
        self.params.tiers.get(self.tier_index(tier))
    }

    /// A tier's name.
    pub(crate) fn tier_name(&self, tier: Tier) -> &str {
        self.params.tiers.name(self.tier_index(tier))
    }

    /// Replaces a tier's quota (the default's too), for every key in it, at once and safely
    /// under concurrent decisions; each decision uses either the old or the new quota.
    ///
    /// A bucket keeps its *empty instant* across the change, and its level is read under the
    /// new quota: the time it has been refilling, at the new rate, capped at the new burst.
    /// Raising a tier's rate therefore credits its keys at the new rate for the time since
    /// they were last empty; lowering its burst cuts every key to at most the new burst. No
    /// key is ever above the burst of the quota it is decided under. The same holds when a key
    /// moves between tiers ([`set_override`](KeyedLimiter::set_override)).
    ///
    /// Fails, changing nothing, if the quota's fill time exceeds the limiter's largest
    /// ([`KeyedBuilder::max_fill_time`]): the table reclaims buckets once they are full in every
    /// tier it may have, and a longer fill would make a reclaimed key differ from one still
    /// tracked.
    pub(crate) fn set_tier_quota(&self, tier: Tier, quota: TokenBucket) -> Result<(), UpdateError> {
        if tier.index() >= self.params.tiers.len() {
            return Err(UpdateError::UnknownTier { tier: tier.index(), tiers: self.params.tiers.len() });
        }
        Ok(self.params.tiers.set(tier.index(), quota)?)
    }

    /// Puts `key` in `tier` for [`check`](KeyedLimiter::check), [`check_n`](KeyedLimiter::check_n),
    /// [`peek`](KeyedLimiter::peek) and the batch API, from now on; see
    /// [`set_tier_quota`](KeyedLimiter::set_tier_quota) for what happens to its tokens. Fails
    /// when the overrides are full ([`KeyedBuilder::max_overrides`]) or the tier is unknown.
    /// Writers take a lock among themselves; decisions never do.
    pub(crate) fn set_override_words(&self, words: K::Words, tier: Tier) -> Result<(), UpdateError> {
        if tier.index() >= self.params.tiers.len() {
            return Err(UpdateError::UnknownTier { tier: tier.index(), tiers: self.params.tiers.len() });
        }
        self.overrides.set(words, words.hash_with(&self.params.hasher), tier, &self.params.tiers)
    }

    /// Returns `key` to the default tier. Whether it had an override.
    pub(crate) fn clear_override_words(&self, words: K::Words) -> bool {
        self.overrides.clear(words, words.hash_with(&self.params.hasher), &self.params.tiers)
    }

    /// The key's override, if it has one.
    pub(crate) fn has_overrides(&self) -> bool {
        !self.overrides.is_empty()
    }

    pub(crate) fn override_of_words(&self, words: K::Words) -> Option<Tier> {
        self.overrides.get(words, words.hash_with(&self.params.hasher))
    }

    /// [`check_batch`](KeyedLimiter::check_batch) at a caller-supplied `now`.
    #[inline(always)]
    pub(crate) fn check_batch_at<Q: Borrow<K>>(
        &self,
        now: Nanos,
        items: &[(Q, u64)],
        out: &mut [Decision],
    ) -> usize {
        let base = self.base(now);
        batch(
            &self.table,
            items,
            out,
            |key: &K| {
                let words = key.words(&self.fingerprint);
                (words, words.hash_with(&self.params.hasher))
            },
            |t, n| self.decide_key(t, base, n),
        )
    }

    /// Evicts every bucket that has refilled to full (no decision changes) and returns how many.
    /// Takes time proportional to the capacity; run it from a background thread or a timer if
    /// new keys arrive faster than full buckets are reclaimed on insert.
    pub(crate) fn sweep(&self) -> usize {
        let below = evictable(&self.params, OFFSET + self.base(self.clock.now()));
        self.table.shards().map(|s| s.sweep(below, &self.params.hasher)).sum()
    }

    /// Keys tracked now, approximately under concurrent inserts.
    pub(crate) fn len(&self) -> u64 {
        self.table.shards().map(|s| s.len()).sum()
    }

    /// The most keys the table holds (7/8 of its slots).
    pub(crate) fn capacity(&self) -> u64 {
        self.table.shards().map(|s| s.capacity()).sum()
    }

    /// Bytes the table owns: slots, headers, ghosts and shard headers.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.table.memory() + self.overrides.memory()
    }

    /// A snapshot of the table's figures. Walks every slot: time proportional to the capacity.
    pub(crate) fn stats(&self) -> KeyedStats {
        stats_of(&self.table, &self.params.hasher, self.memory_bytes())
    }

    /// Inserts, clean evictions and forced evictions, from the shards' counters.
    pub(crate) fn table_counts(&self) -> [u64; 3] {
        self.table.shards().map(|s| s.counts()).fold([0; 3], |[a, b, c], [x, y, z]| [a + x, b + y, c + z])
    }

    /// How long after its creation this limiter's clock keeps refilling buckets.
    pub(crate) fn lifetime(&self) -> Nanos {
        Nanos::new(self.params.tiers.lifetime())
    }

    /// The default tier's current quota, as compiled for this table.
    pub(crate) fn quota(&self) -> TokenBucket {
        self.params.tiers.get(0)
    }

    /// The default tier's quota (see `Keyed::set_policy`).
    pub(crate) fn set_config(&self, new: TokenBucket) -> Result<(), UpdateError> {
        self.set_tier_quota(Tier::DEFAULT, new)
    }

    /// The table-full policy.
    pub(crate) fn when_full(&self) -> WhenFull {
        self.params.when_full
    }

    /// The clock.
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K: Key + ?Sized, C: Clock> fmt::Debug for BucketTable<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketTable")
            .field("quota", &self.quota())
            .field("capacity", &self.capacity())
            .field("when_full", &self.params.when_full)
            .finish_non_exhaustive()
    }
}

/// Builds the token bucket's table.
pub(crate) fn build<K: Key + ?Sized, C: Clock>(
    b: KeyedBuilder<TokenBucket, K>,
    clock: C,
) -> Result<BucketTable<K, C>, ConfigError> {
    let mut tiers = b.tiers;
    tiers.insert(0, ("default".to_owned(), b.config));
    let (slots, shards) = table_slots(b.capacity, shard_count(b.shards)?)?;
    let origin = clock.now();
    let tiers = Tiers::new(&tiers, b.fill_headroom, OFFSET, MAX_UNITS - OFFSET, origin, b.counters)?;
    if b.max_overrides > MAX_CAPACITY {
        return Err(ConfigError::TooManyOverrides {
            overrides: b.max_overrides as u64,
            max: MAX_CAPACITY as u64,
        });
    }
    let (place, fingerprint) = hashers(b.seeds);
    Ok(BucketTable {
        table: Table::new(slots, shards)?,
        overrides: Overrides::new(b.max_overrides)?,
        params: Params { tiers, when_full: b.when_full, hasher: place },
        origin,
        clock,
        fingerprint,
        id: crate::sync::next_id(),
        _key: PhantomData,
    })
}
