//! `KeyedLimiter`: a token bucket per key, in a fixed-size lock-free table.

mod key;
mod policy;
pub(crate) mod table;
mod tiers;

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;

pub use key::{Hashed, IpPrefix, Key, KeyHasher, Words};
pub(crate) use policy::sealed;
pub use policy::{
    Keyed, KeyedFixedWindow, KeyedNginx, KeyedPolicy, KeyedPolicyBuilder, KeyedPolicyLimit,
    KeyedSlidingWindow,
};
use table::{evictable, Now, Params, Rule, Shard, Table, TableStats, MAX_UNITS, WINDOW};
pub use tiers::Tier;
use tiers::{Overrides, Tiers};

use crate::engine::admit::{Admit, Receipt};
use crate::policies::bucket::BucketWord;
use crate::policies::token_bucket::At;
use crate::{Clock, ConfigError, Decision, DefaultClock, Nanos, Outcome, TokenBucket, UpdateError};

/// What a [`KeyedLimiter`] does with a new key when the table has no room for it: every slot
/// of the key's window holds a bucket that is not yet full (full buckets are evicted on the
/// spot), or its shard holds its share of the capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WhenFull {
    /// Refuse the request: [`Outcome::TableFull`]. Fails closed: a flood of new keys cannot
    /// take quota, but new legitimate keys wait until buckets refill or a sweep runs.
    #[default]
    Deny,
    /// Admit the request without counting it: [`Outcome::Untracked`]. Fails open.
    Allow,
    /// Evict the bucket nearest to full in the key's window and track the new key there. The
    /// evicted key leaves a *ghost* (its stamp, rounded toward empty, under a 22-bit tag of
    /// its hash) in its home group, and comes back no fuller than it left, unlike Envoy's LRU
    /// or nginx's forced eviction, which hand a returning key a fresh bucket. A home keeps one
    /// ghost until it has refilled; a second forced eviction from the same home meanwhile is
    /// refused ([`Outcome::TableFull`]). A new key whose tag collides with a ghost's starts
    /// from the ghost's level: less than it would have, never more.
    ///
    /// The new key starts no fuller than the bucket it displaced: a slot's stamps only grow
    /// (that is what makes reuse safe), so the newcomer inherits the victim's level when it is
    /// below a fresh bucket's. Under a flood that has drained every bucket in a window, new keys
    /// there are admitted with next to nothing: this policy then fails closed, like `Deny`.
    EvictFullest,
}

/// How to build a [`KeyedLimiter`].
pub struct KeyedBuilder<K: ?Sized> {
    _key: PhantomData<fn(&K)>,
    tiers: Vec<(String, TokenBucket)>,
    fill_headroom: Nanos,
    max_overrides: usize,
    capacity: usize,
    shards: Option<usize>,
    when_full: WhenFull,
    seeds: Option<[u64; 8]>,
}

impl<K: ?Sized> Clone for KeyedBuilder<K> {
    fn clone(&self) -> Self {
        KeyedBuilder { _key: PhantomData, tiers: self.tiers.clone(), ..*self }
    }
}

impl<K: ?Sized> fmt::Debug for KeyedBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("tiers", &self.tiers)
            .field("max_fill_time", &self.fill_headroom)
            .field("max_overrides", &self.max_overrides)
            .field("capacity", &self.capacity)
            .field("shards", &self.shards)
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}

/// The largest capacity: 2^36 keys.
const MAX_CAPACITY: usize = 1 << 36;
/// The most shards.
const MAX_SHARDS: usize = 64;
/// Bucket instants in a table count from this many units, the largest fill time any tier may
/// have (2^60 units: 36 years at 1 ns), so that one time base serves every tier.
const OFFSET: u64 = 1 << 60;

impl<K: Key + ?Sized> KeyedBuilder<K> {
    /// A builder for a keyed limiter under `quota`, with the defaults below.
    pub fn new(quota: TokenBucket) -> KeyedBuilder<K> {
        KeyedBuilder {
            _key: PhantomData,
            tiers: vec![("default".to_owned(), quota)],
            fill_headroom: Nanos::ZERO,
            max_overrides: 1024,
            capacity: 1 << 16,
            shards: None,
            when_full: WhenFull::Deny,
            seeds: None,
        }
    }

    /// Adds a named tier (up to 254 besides the default), found later with
    /// [`KeyedLimiter::tier`]. Every tier is counted in the default quota's time unit, so a rate
    /// that is exact only at a finer unit is rounded down (by less than one unit per token).
    pub fn tier(mut self, name: impl Into<String>, quota: TokenBucket) -> Self {
        self.tiers.push((name.into(), quota));
        self
    }

    /// The longest fill time (`burst × period / tokens`) a tier may be given later with
    /// [`KeyedLimiter::set_tier_quota`] (default: the longest among the tiers built). A bucket
    /// is reclaimed once it has been full for this long in every tier, so a generous headroom
    /// keeps idle keys in the table longer.
    pub fn max_fill_time(mut self, fill: Duration) -> Self {
        self.fill_headroom = Nanos::from_duration_saturating(fill);
        self
    }

    /// Room for `n` per-key tier overrides (default 1,024); see
    /// [`KeyedLimiter::set_override`].
    pub fn max_overrides(mut self, n: usize) -> Self {
        self.max_overrides = n;
        self
    }

    /// Room for at least `keys` keys (default 65,536). The table allocates the next power of
    /// two of slots at or above `keys × 8/7` up front and never grows; it holds keys up to 7/8
    /// of its slots, so [`KeyedLimiter::capacity`] may exceed `keys`.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The number of shards: a power of two up to 64 (default: 4 per available core).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The table-full policy (default [`WhenFull::Deny`]).
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// Fixed hash seeds, for reproducible tests and benchmarks: the first four place keys, the
    /// last four fingerprint them. By default both are drawn at random per limiter, so that
    /// nobody can aim keys at one window or at a fingerprint collision.
    pub fn seeds(mut self, seeds: [u64; 8]) -> Self {
        self.seeds = Some(seeds);
        self
    }

    /// A limiter on the default clock.
    pub fn build(self) -> Result<KeyedLimiter<K, DefaultClock>, ConfigError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// A limiter on `clock`.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<KeyedLimiter<K, C>, ConfigError> {
        let (slots, shards) = table_slots(self.capacity, shard_count(self.shards)?)?;
        let tiers = Tiers::new(&self.tiers, self.fill_headroom, OFFSET, MAX_UNITS - OFFSET)?;
        if self.max_overrides > MAX_CAPACITY {
            return Err(ConfigError::TooManyOverrides {
                overrides: self.max_overrides as u64,
                max: MAX_CAPACITY as u64,
            });
        }
        let (place, fingerprint) = hashers(self.seeds);
        let origin = clock.now();
        Ok(KeyedLimiter {
            table: Table::new(slots, shards),
            overrides: Overrides::new(self.max_overrides),
            params: Params { tiers, when_full: self.when_full, hasher: place },
            origin,
            clock,
            fingerprint,
            id: crate::sync::next_id(),
            _key: PhantomData,
        })
    }
}

/// The slots and shards of a table for `capacity` keys on up to `shards` shards: the next power
/// of two at or above `capacity × 8/7`, at least one window per shard (small tables get fewer
/// shards).
pub(crate) fn table_slots(capacity: usize, shards: usize) -> Result<(usize, usize), ConfigError> {
    if capacity == 0 {
        return Err(ConfigError::ZeroCapacity);
    }
    if capacity > MAX_CAPACITY {
        return Err(ConfigError::CapacityTooLarge { capacity: capacity as u64, max: MAX_CAPACITY as u64 });
    }
    let slots = (capacity + capacity.div_ceil(7)).next_power_of_two();
    let shards = shards.min((slots / WINDOW).max(1));
    Ok((slots.max(shards * WINDOW), shards))
}

/// Refuses [`WhenFull::EvictFullest`] for tables whose states a ghost cannot summarize (`what`
/// names the table in the error).
pub(crate) fn deny_or_allow(when_full: WhenFull, algorithm: &'static str) -> Result<(), ConfigError> {
    if when_full == WhenFull::EvictFullest {
        return Err(ConfigError::EvictionUnsupported { algorithm });
    }
    Ok(())
}

/// The number of shards asked for (a power of two up to 64), or 4 per available core.
pub(crate) fn shard_count(asked: Option<usize>) -> Result<usize, ConfigError> {
    match asked {
        Some(s) if s.is_power_of_two() && s <= MAX_SHARDS => Ok(s),
        Some(s) => Err(ConfigError::InvalidShards { shards: s as u64 }),
        None => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Ok((4 * cores).next_power_of_two().min(MAX_SHARDS))
        }
    }
}

/// The placement and fingerprint hashers: from fixed seeds (the first four place keys, the
/// last four fingerprint them), or random.
pub(crate) fn hashers(seeds: Option<[u64; 8]>) -> (ahash::RandomState, KeyHasher) {
    match seeds {
        Some([a, b, c, d, e, f, g, h]) => (
            ahash::RandomState::with_seeds(a, b, c, d),
            KeyHasher(ahash::RandomState::with_seeds(e, f, g, h)),
        ),
        None => (ahash::RandomState::new(), KeyHasher(ahash::RandomState::new())),
    }
}

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
pub struct KeyedLimiter<K: Key + ?Sized, C: Clock = DefaultClock> {
    table: Table<K::Words>,
    overrides: Overrides<K::Words>,
    params: Params,
    origin: Nanos,
    clock: C,
    fingerprint: KeyHasher,
    id: u64,
    _key: PhantomData<fn(&K)>,
}

/// One key of a [`KeyedLimiter`], as a limit of [`check_all`](crate::check_all): from
/// [`KeyedLimiter::limit`].
pub struct KeyedLimit<'a, K: Key + ?Sized, C: Clock> {
    limiter: &'a KeyedLimiter<K, C>,
    key: K::Words,
}

impl<K: Key + ?Sized, C: Clock> Admit for KeyedLimit<'_, K, C> {
    /// Tables with [`WhenFull::EvictFullest`] issue no receipts (their refunds give nothing
    /// back): a key evicted before it is full comes back in a slot whose first stamp may
    /// belong to another key's history, below which no refund may go.
    fn charge(&self, n: u64) -> (Decision, Option<Receipt>) {
        let l = self.limiter;
        let t = l.target(self.key);
        prefetch(t.shard.home_ptr(t.home));
        let q = l.params.tiers.get(l.tier_of(t.words, t.hash));
        let base = l.base(l.clock.now());
        let d = l.decide_in(&q, &t, base, n);
        if d.outcome() != Outcome::Allowed || n == 0 || l.params.when_full == WhenFull::EvictFullest {
            return (d, None);
        }
        let at = KeyedLimiter::<K, C>::at(&q, base);
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
    fn refund(&self, r: Receipt) {
        let l = self.limiter;
        let t = l.target(self.key);
        let Some(([charged_now, charged_fill, cost], _)) = r.take(l.id, t.hash) else { return };
        let charged_floor = charged_now - charged_fill;
        let step = |w: u64| {
            // After the word's Acquire load (in `Shard::refund`): see `AtomicBucket::refund`.
            crate::sync::clock_after_loads();
            let now = OFFSET + l.base(l.clock.now());
            if now < charged_now {
                return None; // a clock behind the charge's: refund nothing
            }
            let floor = now - l.params.tiers.min_fill().min(charged_fill);
            let owed = cost.saturating_sub(floor - charged_floor);
            // Never below the evictable line: a bucket full in every tier.
            (owed > 0).then(|| w.saturating_sub(owed).max(evictable(&l.params, now)))
        };
        t.shard.refund(t.words, t.home, step);
    }

    fn peek(&self, n: u64) -> Decision {
        let l = self.limiter;
        l.peek_key(self.key, l.clock.now(), n)
    }
}

impl<K: Key + ?Sized, C: Clock> fmt::Debug for KeyedLimit<'_, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimit").finish_non_exhaustive()
    }
}

/// A snapshot of a [`KeyedLimiter`]'s table.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Keys tracked now (buckets not yet evicted, full or not).
    pub live: u64,
    /// The most keys the table holds.
    pub capacity: u64,
    /// Slots allocated.
    pub slots: u64,
    /// Keys inserted since creation.
    pub inserts: u64,
    /// Full buckets evicted (no decision changes).
    pub evictions: u64,
    /// Buckets evicted before they were full, by [`WhenFull::EvictFullest`].
    pub forced_evictions: u64,
    /// New keys that found no room (denied or admitted untracked by the policy).
    pub refused: u64,
    /// Mean distance of live keys from their home slot.
    pub mean_probe: f64,
    /// The largest distance of a live key from its home slot.
    pub max_probe: u64,
    /// Live keys by distance from their home slot (the last entry: the window's end).
    pub probe_histogram: Vec<u64>,
    /// Bytes the table owns.
    pub memory_bytes: u64,
}

impl<K: Key + ?Sized> KeyedLimiter<K, DefaultClock> {
    /// Room for `capacity` keys under `quota`, on the default clock, refusing new keys when
    /// full. See [`KeyedLimiter::builder`] for the options.
    pub fn new(quota: TokenBucket, capacity: usize) -> Result<KeyedLimiter<K, DefaultClock>, ConfigError> {
        KeyedLimiter::builder(quota).capacity(capacity).build()
    }
}

impl<K: Key + ?Sized> KeyedLimiter<K, DefaultClock> {
    /// A builder for a limiter of `K` under `quota`: `KeyedLimiter::<IpAddr>::builder(q)`, or
    /// `KeyedLimiter::builder(q)` where the binding's type names the key. Same as
    /// [`KeyedBuilder::new`].
    pub fn builder(quota: TokenBucket) -> KeyedBuilder<K> {
        KeyedBuilder::new(quota)
    }
}

impl<K: Key + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Units since the limiter's creation (before the offset), saturating at the lifetime.
    #[inline]
    fn base(&self, now: Nanos) -> u64 {
        let tiers = &self.params.tiers;
        let e = now.saturating_sub(self.origin).as_u64().min(tiers.lifetime());
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

    /// Takes one token from `key`'s bucket now, or says how long to wait.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Takes `n` tokens from `key`'s bucket now, all or none. `n = 0` is always allowed and
    /// takes nothing; `n` above the burst is [`Outcome::Insufficient`]. Neither inserts the key.
    // Always inline (as `check_n_at`, `Keyed`'s and `Direct::check_n_at`): out of line, the
    // decision is returned through memory and the call saves and restores six registers:
    // 1.17× the floor at 1K keys in the criterion bench, 1.12× inline.
    #[inline(always)]
    pub fn check_n<Q>(&self, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        // Hash and start fetching the key's group before reading the clock: on CPUs where a
        // TSC read holds back later loads, the cache miss then overlaps the clock read.
        let t = self.target(key.words(&self.fingerprint));
        prefetch(t.shard.home_ptr(t.home));
        let tier = self.tier_of(t.words, t.hash);
        self.decide(&t, tier, self.base(self.clock.now()), n)
    }

    /// [`check`](KeyedLimiter::check) at a caller-supplied `now` ([`now`](KeyedLimiter::now)).
    #[inline]
    pub fn check_at<Q>(&self, key: &Q, now: Nanos) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n_at(key, now, 1)
    }

    /// [`check_n`](KeyedLimiter::check_n) at a caller-supplied `now`.
    ///
    /// Times must not run ahead of the ones later decisions use: the table reclaims a bucket
    /// once it is full as of the latest time it is given, and a key reclaimed at a later time
    /// comes back fresh at an earlier one. (The same holds for threads whose clocks disagree:
    /// a core whose clock leads by δ can reclaim a bucket δ early, worth up to δ·rate tokens.)
    #[inline(always)]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let t = self.target(key.words(&self.fingerprint));
        self.decide(&t, self.tier_of(t.words, t.hash), self.base(now), n)
    }

    /// [`check_n`](KeyedLimiter::check_n) under `tier`, whatever the key's override: for
    /// callers that know a key's tier per request (a tenant's plan from its credentials). A
    /// tier of another limiter, beyond this one's list, is read as the default.
    #[inline]
    pub fn check_n_in<Q>(&self, key: &Q, tier: Tier, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n_in_at(key, tier, self.clock.now(), n)
    }

    /// [`check_n_in`](KeyedLimiter::check_n_in) at a caller-supplied `now`.
    #[inline]
    pub fn check_n_in_at<Q>(&self, key: &Q, tier: Tier, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let t = self.target(key.words(&self.fingerprint));
        self.decide(&t, self.tier_index(tier), self.base(now), n)
    }

    /// Whether one token was taken from `key`'s bucket now.
    #[inline]
    pub fn allow<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check(key).is_allowed()
    }

    /// `key` as one limit of a multi-limit admission ([`check_all`](crate::check_all)).
    ///
    /// ```
    /// use tollgate::{check_all, Admit, KeyedLimiter, Limiter, TokenBucket};
    ///
    /// let per_client: KeyedLimiter<str> = KeyedLimiter::new(TokenBucket::per_second(5)?, 10_000)?;
    /// let global = Limiter::new(TokenBucket::per_second(1000)?);
    /// let d = check_all(&[&per_client.limit("alice") as &dyn Admit, &global], 1);
    /// assert!(d.is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limit<Q>(&self, key: &Q) -> KeyedLimit<'_, K, C>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        KeyedLimit { limiter: self, key: key.words(&self.fingerprint) }
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

    #[inline]
    fn decide(&self, t: &Target<'_, K::Words>, tier: usize, base: u64, n: u64) -> Decision {
        match self.params.tiers.built(tier) {
            Some(q) => self.decide_in(q, t, base, n),
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
        self.decide_in(&self.params.tiers.get(tier), &self.locate(words, hash), base, n)
    }

    #[inline(always)]
    fn decide_in(&self, q: &TokenBucket, t: &Target<'_, K::Words>, base: u64, n: u64) -> Decision {
        let at = Self::at(q, base);
        if n.wrapping_sub(1) >= q.burst() {
            return self.peek_located(q, t.words, t.hash, at, n);
        }
        let now = Now { p: &self.params, q, at };
        match t.shard.probe(t.home, t.words, &now, n) {
            Some(d) => d,
            None => self.decide_beyond_home(q, t.words, t.hash, base, n),
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

    /// What [`check`](KeyedLimiter::check) would answer now, without taking anything or
    /// inserting the key. `remaining` is the key's level (the initial level if untracked).
    #[inline]
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.peek_n_at(key, self.clock.now(), 1)
    }

    /// What [`check_n`](KeyedLimiter::check_n) would answer at `now`, without taking anything.
    pub fn peek_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.peek_key(key.words(&self.fingerprint), now, n)
    }

    fn peek_key(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
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
    pub fn tier(&self, name: &str) -> Option<Tier> {
        self.params.tiers.find(name)
    }

    /// A tier's current quota, as compiled for this table (in its time unit).
    pub fn tier_quota(&self, tier: Tier) -> TokenBucket {
        self.params.tiers.get(self.tier_index(tier))
    }

    /// A tier's name.
    pub fn tier_name(&self, tier: Tier) -> &str {
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
    pub fn set_tier_quota(&self, tier: Tier, quota: TokenBucket) -> Result<(), UpdateError> {
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
    pub fn set_override<Q>(&self, key: &Q, tier: Tier) -> Result<(), UpdateError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        if tier.index() >= self.params.tiers.len() {
            return Err(UpdateError::UnknownTier { tier: tier.index(), tiers: self.params.tiers.len() });
        }
        let words = key.words(&self.fingerprint);
        self.overrides.set(words, words.hash_with(&self.params.hasher), tier)
    }

    /// Returns `key` to the default tier. Whether it had an override.
    pub fn clear_override<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let words = key.words(&self.fingerprint);
        self.overrides.clear(words, words.hash_with(&self.params.hasher))
    }

    /// The key's override, if it has one.
    pub fn override_of<Q>(&self, key: &Q) -> Option<Tier>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let words = key.words(&self.fingerprint);
        self.overrides.get(words, words.hash_with(&self.params.hasher))
    }

    /// Decides a batch of `(key, cost)` requests with one clock read, writing each decision to
    /// `out` in order: per-packet callers pay for the clock once and for cache misses in
    /// parallel (slots are prefetched a few keys ahead). Decides `min(items.len(), out.len())`
    /// requests and returns that count.
    pub fn check_batch<Q: Borrow<K>>(&self, items: &[(Q, u64)], out: &mut [Decision]) -> usize {
        self.check_batch_at(self.clock.now(), items, out)
    }

    /// [`check_batch`](KeyedLimiter::check_batch) at a caller-supplied `now`.
    pub fn check_batch_at<Q: Borrow<K>>(
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
            |t, n| self.decide(t, self.tier_of(t.words, t.hash), base, n),
        )
    }

    /// Evicts every bucket that has refilled to full (no decision changes) and returns how many.
    /// Takes time proportional to the capacity; run it from a background thread or a timer if
    /// new keys arrive faster than full buckets are reclaimed on insert.
    pub fn sweep(&self) -> usize {
        let below = evictable(&self.params, OFFSET + self.base(self.clock.now()));
        self.table.shards().map(|s| s.sweep(below, &self.params.hasher)).sum()
    }

    /// Keys tracked now, approximately under concurrent inserts.
    pub fn len(&self) -> u64 {
        self.table.shards().map(|s| s.len()).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the table holds (7/8 of its slots).
    pub fn capacity(&self) -> u64 {
        self.table.shards().map(|s| s.capacity()).sum()
    }

    /// Bytes the table owns: slots, headers, ghosts and shard headers.
    pub fn memory_bytes(&self) -> usize {
        self.table.memory() + self.overrides.memory()
    }

    /// A snapshot of the table's figures. Walks every slot: time proportional to the capacity.
    pub fn stats(&self) -> KeyedStats {
        stats_of(&self.table, &self.params.hasher, self.memory_bytes())
    }

    /// The current time on this limiter's clock, for the `*_at` methods.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// How long after its creation this limiter's clock keeps refilling buckets.
    pub fn lifetime(&self) -> Nanos {
        Nanos::new(self.params.tiers.lifetime())
    }

    /// The default tier's current quota, as compiled for this table.
    pub fn quota(&self) -> TokenBucket {
        self.params.tiers.get(0)
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K: Key + ?Sized, C: Clock> fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("quota", &self.quota())
            .field("capacity", &self.capacity())
            .field("when_full", &self.params.when_full)
            .finish_non_exhaustive()
    }
}

/// A key located in the table.
struct Target<'a, W: Words> {
    words: W,
    hash: u64,
    shard: Shard<'a, W>,
    home: usize,
}

impl<'a, W: Words> Target<'a, W> {
    #[inline]
    fn new(table: &'a Table<W>, words: W, hash: u64) -> Target<'a, W> {
        let shard = table.shard(hash);
        Target { words, hash, shard, home: shard.home_of(hash) }
    }
}

/// Decides `min(items.len(), out.len())` requests in order with `decide`, hashing each key
/// with `hash` a few keys ahead and prefetching its group, so that misses overlap continuously.
/// Returns the count.
#[inline]
fn batch<'t, K, Q, W>(
    table: &'t Table<W>,
    items: &[(Q, u64)],
    out: &mut [Decision],
    hash: impl Fn(&K) -> (W, u64),
    decide: impl Fn(&Target<'t, W>, u64) -> Decision,
) -> usize
where
    K: ?Sized,
    Q: Borrow<K>,
    W: Words,
{
    // A sliding window: the key `AHEAD` places on is hashed and its group prefetched while
    // this one is decided.
    const AHEAD: usize = 16;
    let count = items.len().min(out.len());
    let mut ring = [(W::default(), 0u64); AHEAD];
    for i in 0..count + AHEAD {
        let at = i % AHEAD;
        if let Some(j) = i.checked_sub(AHEAD) {
            let (words, hash) = ring[at];
            out[j] = decide(&Target::new(table, words, hash), items[j].1);
        }
        if let Some((key, _)) = items[..count].get(i) {
            let (words, h) = hash(key.borrow());
            let t = Target::new(table, words, h);
            prefetch(t.shard.home_ptr(t.home));
            ring[at] = (words, h);
        }
    }
    count
}

/// A table's figures.
fn stats_of<W: Words>(table: &Table<W>, hasher: &ahash::RandomState, memory: usize) -> KeyedStats {
    let mut t = TableStats::default();
    for shard in table.shards() {
        shard.add_stats(&mut t, hasher);
    }
    KeyedStats {
        live: t.live,
        capacity: t.capacity,
        slots: t.slots,
        inserts: t.inserts,
        evictions: t.evictions,
        forced_evictions: t.forced_evictions,
        refused: t.refused,
        #[expect(clippy::cast_precision_loss, reason = "an average")]
        mean_probe: if t.live == 0 { 0.0 } else { t.total_probe as f64 / t.live as f64 },
        max_probe: t.max_probe,
        probe_histogram: t.probe_histogram,
        memory_bytes: memory as u64,
    }
}

/// Starts fetching the cache line at `p` (x86_64; elsewhere nothing). Never faults.
#[inline]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints the CPU to fetch a key's home group (two cache lines) into L1.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults, whatever the address; `p` points into
        // the table's group array, and `p + 64` at most one line past a group's start.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
