//! Keyed limiting: a limit per key, for any number of keys, in memory fixed at construction.
//!
//! [`Keyed<A, K>`] is the one keyed type, with one set of methods. The table behind it is the
//! algorithm's: the token bucket's (`bucket.rs`: tiers, per-key overrides, forced eviction) and
//! every single-word policy's (`policy.rs`) share the lock-free table of `table.rs`; the sliding
//! log keeps `N` words per key under shard locks (`policies/log/keyed.rs`).
//!
//! [`FlowMeters<K>`] is the meters' table for a flow pinned to one core (`flows.rs`): owned by
//! one thread, no atomics; [`SharedFlowMeters<K>`] is theirs for flows every core meets
//! (`shared_meters.rs`).

mod bucket;
mod flows;
mod key;
pub(crate) mod pages;
mod policy;
mod shared_meters;
pub(crate) mod table;
mod tiers;

/// The home group, 0 or 1, of a `u64` key whose placement hash is `hash`, in a table of two
/// groups a shard (the loom models' tables): for the models that need keys of one home.
#[cfg(tollgate_loom)]
#[doc(hidden)]
pub fn loom_home_of(hash: u64) -> u64 {
    (table::Table::<[u64; 1]>::place(hash) & 1) as u64
}

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;
use std::sync::Arc;

use bucket::BucketTable;
pub use flows::FlowMeters;
pub use key::{Hashed, IpPrefix, Key, KeyHasher, Words};
pub(crate) use policy::sealed;
pub use policy::KeyedPolicy;
use policy::PolicyTable;
pub(crate) use shared_meters::commit as shared_commit;
pub use shared_meters::SharedFlowMeters;
use table::{Group, Shard, Table, TableStats, WINDOW};
pub use tiers::Tier;

use crate::engine::admit::{Admit, Receipt};
use crate::policies::log::keyed::LogTable;
use crate::{
    Cancelled, Clock, ConfigError, CounterSnapshot, Counters, Decision, DefaultClock, Nanos, Reservation,
    ReserveError, SlidingLog, TokenBucket, UpdateError,
};

/// What a keyed table does with a new key when the table has no room for it: every slot
/// of the key's window holds a key that cannot be reclaimed yet (reclaimable ones are evicted
/// on the spot), or its shard holds its share of the capacity.
///
/// # When a bucket can be reclaimed
///
/// A token bucket is reclaimable once it would be full under every quota its key may be given:
/// once its stamp lies strictly below `now − F`, `F` the longest fill time any tier may have
/// ([`KeyedBuilder::max_fill_time`], by default the longest tier's), in the table's time unit
/// (`1/m` ns). For a key of the longest tier that is from the first clock reading after the
/// instant its bucket refilled (readings come in whole nanoseconds); a key of a tier that
/// fills sooner waits the difference too. So a new key that arrives at the very nanosecond
/// at which the last bucket of its window refills still finds no room (under `Deny`,
/// [`Outcome::TableFull`](crate::Outcome::TableFull)), and one nanosecond later takes a slot.
///
/// The one unit is the slot protocol's, not a rounding: a slot's word only grows, across the
/// keys it holds, which is what keeps a thread still acting on an evicted key from ever
/// committing on the next one (its compare-and-set expects a value the slot never holds
/// again). So an eviction leaves the evicted stamp plus one, and the next key's word starts
/// at or above that; for the next key to start exactly full, and for a refund or a cancel to
/// bring it back to exactly full, the evicted stamp must lie at least one unit below the full
/// line. Reclaiming a bucket at the instant it refills would start the new key one unit short
/// of full (a burst of 1 then refuses its first request), or let a refund give the slot the
/// evicted key's value back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WhenFull {
    /// Refuse the request: [`Outcome::TableFull`](crate::Outcome::TableFull). Fails closed: a flood of new keys cannot
    /// take quota, but new legitimate keys wait until buckets refill or a sweep runs.
    #[default]
    Deny,
    /// Admit the request without counting it: [`Outcome::Untracked`](crate::Outcome::Untracked). Fails open.
    Allow,
    /// Evict the bucket nearest to full in the key's window and track the new key there. The
    /// evicted key leaves a *ghost* (its stamp, rounded toward empty, under a 22-bit tag of
    /// its hash) in its home group, and comes back no fuller than it left, unlike Envoy's LRU
    /// or nginx's forced eviction, which hand a returning key a fresh bucket. A home keeps one
    /// ghost until it has refilled; a second forced eviction from the same home meanwhile is
    /// refused ([`Outcome::TableFull`](crate::Outcome::TableFull)). A new key whose tag collides with a ghost's starts
    /// from the ghost's level: less than it would have, never more.
    ///
    /// The new key starts no fuller than the bucket it displaced: a slot's stamps only grow
    /// (that is what makes reuse safe), so the newcomer inherits the victim's level when it is
    /// below a fresh bucket's. Under a flood that has drained every bucket in a window, new keys
    /// there are admitted with next to nothing: this policy then fails closed, like `Deny`.
    EvictFullest,
}

/// How to build a [`Keyed`] table: from [`Keyed::builder`] (or [`KeyedLimiter::builder`],
/// [`KeyedNginx::builder`], ...), with the key type named by the limiter's type; on a type
/// that names a clock other than the default, from [`Keyed::builder_for_clock`].
///
/// Every table takes a capacity, shards, a table-full policy and seeds; the token bucket's
/// also takes tiers and per-key overrides ([`tier`](KeyedBuilder::tier),
/// [`max_fill_time`](KeyedBuilder::max_fill_time), [`max_overrides`](KeyedBuilder::max_overrides)).
pub struct KeyedBuilder<A, K: ?Sized> {
    pub(crate) config: A,
    pub(crate) capacity: usize,
    pub(crate) shards: Option<usize>,
    pub(crate) when_full: WhenFull,
    pub(crate) seeds: Option<[u64; 8]>,
    /// Tiers besides the default (the token bucket's only).
    pub(crate) tiers: Vec<(String, TokenBucket)>,
    pub(crate) fill_headroom: Nanos,
    pub(crate) max_overrides: usize,
    counters: bool,
    _key: PhantomData<fn(&K)>,
}

impl<A: Clone, K: ?Sized> Clone for KeyedBuilder<A, K> {
    fn clone(&self) -> Self {
        KeyedBuilder { config: self.config.clone(), tiers: self.tiers.clone(), _key: PhantomData, ..*self }
    }
}

impl<A: fmt::Debug, K: ?Sized> fmt::Debug for KeyedBuilder<A, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.config)
            .field("capacity", &self.capacity)
            .field("shards", &self.shards)
            .field("when_full", &self.when_full)
            .field("tiers", &self.tiers)
            .field("max_fill_time", &self.fill_headroom)
            .field("max_overrides", &self.max_overrides)
            .finish_non_exhaustive()
    }
}

/// The largest capacity: 2^36 keys on 64-bit targets (on narrower ones 2^26, whose slots, 16
/// bytes or more each, already span a 32-bit address space).
#[cfg(target_pointer_width = "64")]
const MAX_CAPACITY: usize = 1 << 36;
/// The largest capacity: 2^26 keys where pointers are narrower than 64 bits.
#[cfg(not(target_pointer_width = "64"))]
const MAX_CAPACITY: usize = 1 << 26;
/// The most shards.
const MAX_SHARDS: usize = 64;

impl<A: KeyedAlgorithm, K: Key + ?Sized> KeyedBuilder<A, K> {
    /// A builder for a table of `config` per key, with the defaults below.
    pub fn new(config: A) -> KeyedBuilder<A, K> {
        KeyedBuilder {
            config,
            capacity: 1 << 16,
            shards: None,
            when_full: WhenFull::Deny,
            seeds: None,
            tiers: Vec::new(),
            fill_headroom: Nanos::ZERO,
            max_overrides: 1024,
            counters: false,
            _key: PhantomData,
        }
    }

    /// Count decisions by outcome ([`Keyed::counters`]); off by default. A table without
    /// counters pays at most one predicted branch per decision (the token bucket's `check`
    /// tests them with its tier flags, at no cost of their own); one with them, an atomic add
    /// on a cache line of the deciding thread's own, out of line. What the table itself did
    /// (inserts, clean and forced evictions) is counted either way.
    pub fn counters(mut self, on: bool) -> Self {
        self.counters = on;
        self
    }

    /// Room for at least `keys` keys (default 65,536). The table allocates the next power of
    /// two of slots at or above `keys × 8/7` up front and never grows; the lock-free tables hold
    /// keys up to 7/8 of their slots, so [`Keyed::capacity`] may differ from `keys`.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The number of shards: a power of two up to 64 (default: 4 per available core).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The table-full policy (default [`WhenFull::Deny`]). [`WhenFull::EvictFullest`] needs the
    /// token bucket; other tables refuse it at [`build`](KeyedBuilder::build).
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// Fixed hash seeds, for reproducible tests and benchmarks: the first four place keys, the
    /// last four fingerprint them. By default both are drawn at random per table, so that
    /// nobody can aim keys at one window or at a fingerprint collision.
    pub fn seeds(mut self, seeds: [u64; 8]) -> Self {
        self.seeds = Some(seeds);
        self
    }

    /// A table on the default clock.
    pub fn build(self) -> Result<Keyed<A, K, DefaultClock>, ConfigError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// A table on `clock`.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<Keyed<A, K, C>, ConfigError> {
        // The default tier and each named one, counted apart.
        let counters = self
            .counters
            .then(|| Arc::new(Counters::with_tiers(self.tiers.iter().map(|(name, _)| name.as_str()))));
        Ok(Keyed { table: A::build(self, clock)?, counters })
    }
}

impl<K: Key + ?Sized> KeyedBuilder<TokenBucket, K> {
    /// Adds a named tier (up to 254 besides the default), found later with
    /// [`Keyed::tier`]. Every tier is counted in the default quota's time unit, so a rate
    /// that is exact only at a finer unit is rounded down (by less than one unit per token).
    pub fn tier(mut self, name: impl Into<String>, quota: TokenBucket) -> Self {
        self.tiers.push((name.into(), quota));
        self
    }

    /// The longest fill time (`burst × period / tokens`) a tier may be given later with
    /// [`Keyed::set_tier_quota`] (default: the longest among the tiers built). A bucket is
    /// reclaimed once it would be full even under a quota of this fill time, one unit of the
    /// table's clock past it ([`WhenFull`] has the rule), so a generous headroom keeps idle
    /// keys in the table longer.
    pub fn max_fill_time(mut self, fill: Duration) -> Self {
        self.fill_headroom = Nanos::from_duration_saturating(fill);
        self
    }

    /// Room for `n` per-key tier overrides (default 1,024); see
    /// [`Keyed::set_override`].
    pub fn max_overrides(mut self, n: usize) -> Self {
        self.max_overrides = n;
        self
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

/// An algorithm a [`Keyed`] table holds: [`TokenBucket`], every [`KeyedPolicy`]
/// ([`Nginx`](crate::Nginx), [`FixedWindow`](crate::FixedWindow),
/// [`SlidingWindow`](crate::SlidingWindow)) and [`SlidingLog`]. Sealed: a table's safety rests
/// on what each algorithm's words promise (see `docs/design/keyed-table.md`).
pub trait KeyedAlgorithm: Sized + sealed::Algorithm {
    /// The table the algorithm keeps its keys in.
    #[doc(hidden)]
    type Table<K: Key + ?Sized, C: Clock>: KeyedTable<K, C, Config = Self>;
    /// Builds that table.
    #[doc(hidden)]
    fn build<K: Key + ?Sized, C: Clock>(
        b: KeyedBuilder<Self, K>,
        clock: C,
    ) -> Result<Self::Table<K, C>, ConfigError>;
}

/// What every keyed table does, by a key's identity words. The engine's, and hidden: callers
/// use [`Keyed`].
#[doc(hidden)]
pub trait KeyedTable<K: Key + ?Sized, C: Clock> {
    /// The algorithm's configuration.
    type Config;
    fn fingerprint(&self) -> &KeyHasher;
    fn clock(&self) -> &C;
    /// `n` units for the key now, counted into `counters` when given (they are the table's
    /// own, given iff it was built to count).
    fn check_n_words(&self, words: K::Words, n: u64, counters: &Option<Arc<Counters>>) -> Decision;
    fn check_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision;
    fn peek_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision;
    fn charge_words(&self, words: K::Words, n: u64) -> (Decision, Option<Receipt>);
    fn refund_words(&self, words: K::Words, receipt: Receipt);
    /// Starts fetching the memory a decision on the key reads.
    fn prefetch_words(&self, words: K::Words);
    fn check_batch_at<Q: Borrow<K>>(&self, now: Nanos, items: &[(Q, u64)], out: &mut [Decision]) -> usize;
    fn sweep(&self) -> usize;
    fn len(&self) -> u64;
    fn capacity(&self) -> u64;
    fn memory_bytes(&self) -> usize;
    fn stats(&self) -> KeyedStats;
    /// Inserts, clean evictions and forced evictions, from the shards' counters.
    fn table_counts(&self) -> [u64; 3];
    fn lifetime(&self) -> Nanos;
    fn config(&self) -> Self::Config;
    fn set_config(&self, new: Self::Config) -> Result<(), UpdateError>;
    fn when_full(&self) -> WhenFull;
}

/// Forwards a table's inherent methods to [`KeyedTable`]; every call inlines.
macro_rules! forward_table {
    ($config:ty, $config_of:expr) => {
        type Config = $config;
        #[inline(always)]
        fn fingerprint(&self) -> &KeyHasher {
            &self.fingerprint
        }
        #[inline(always)]
        fn clock(&self) -> &C {
            self.clock()
        }
        #[inline(always)]
        fn check_n_words(&self, words: K::Words, n: u64, counters: &Option<Arc<Counters>>) -> Decision {
            self.check_n_words(words, n, counters)
        }
        #[inline(always)]
        fn check_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
            self.check_n_at_words(words, now, n)
        }
        #[inline]
        fn peek_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
            self.peek_n_at_words(words, now, n)
        }
        #[inline]
        fn charge_words(&self, words: K::Words, n: u64) -> (Decision, Option<Receipt>) {
            self.charge_words(words, n)
        }
        #[inline]
        fn refund_words(&self, words: K::Words, receipt: Receipt) {
            self.refund_words(words, receipt)
        }
        #[inline(always)]
        fn prefetch_words(&self, words: K::Words) {
            self.prefetch_words(words)
        }
        #[inline]
        fn check_batch_at<Q: Borrow<K>>(
            &self,
            now: Nanos,
            items: &[(Q, u64)],
            out: &mut [Decision],
        ) -> usize {
            self.check_batch_at(now, items, out)
        }
        fn sweep(&self) -> usize {
            self.sweep()
        }
        fn len(&self) -> u64 {
            self.len()
        }
        fn capacity(&self) -> u64 {
            self.capacity()
        }
        fn memory_bytes(&self) -> usize {
            self.memory_bytes()
        }
        fn stats(&self) -> KeyedStats {
            self.stats()
        }
        fn table_counts(&self) -> [u64; 3] {
            self.table_counts()
        }
        fn lifetime(&self) -> Nanos {
            self.lifetime()
        }
        fn config(&self) -> $config {
            $config_of(self)
        }
        fn set_config(&self, new: $config) -> Result<(), UpdateError> {
            self.set_config(new)
        }
        fn when_full(&self) -> WhenFull {
            self.when_full()
        }
    };
}

impl<K: Key + ?Sized, C: Clock> KeyedTable<K, C> for BucketTable<K, C> {
    forward_table!(TokenBucket, |t: &Self| t.quota());
}

impl<P: KeyedPolicy, K: Key + ?Sized, C: Clock> KeyedTable<K, C> for PolicyTable<P, K, C> {
    forward_table!(P, |t: &Self| t.policy());
}

impl<K: Key + ?Sized, C: Clock> KeyedTable<K, C> for LogTable<K, C> {
    forward_table!(SlidingLog, |t: &Self| t.log());
}

impl sealed::Algorithm for TokenBucket {}
impl KeyedAlgorithm for TokenBucket {
    type Table<K: Key + ?Sized, C: Clock> = BucketTable<K, C>;
    fn build<K: Key + ?Sized, C: Clock>(
        b: KeyedBuilder<Self, K>,
        clock: C,
    ) -> Result<BucketTable<K, C>, ConfigError> {
        bucket::build(b, clock)
    }
}

impl<P: KeyedPolicy> sealed::Algorithm for P {}
impl<P: KeyedPolicy> KeyedAlgorithm for P {
    type Table<K: Key + ?Sized, C: Clock> = PolicyTable<P, K, C>;
    fn build<K: Key + ?Sized, C: Clock>(
        b: KeyedBuilder<Self, K>,
        clock: C,
    ) -> Result<PolicyTable<P, K, C>, ConfigError> {
        policy::build(b, clock)
    }
}

impl sealed::Algorithm for SlidingLog {}
impl KeyedAlgorithm for SlidingLog {
    type Table<K: Key + ?Sized, C: Clock> = LogTable<K, C>;
    fn build<K: Key + ?Sized, C: Clock>(
        b: KeyedBuilder<Self, K>,
        clock: C,
    ) -> Result<LogTable<K, C>, ConfigError> {
        crate::policies::log::keyed::build(b, clock)
    }
}

/// A limit per key, for any number of keys, in memory fixed at construction: the one keyed
/// type, for every algorithm ([`KeyedAlgorithm`]), with one set of methods.
///
/// | algorithm | alias | table |
/// |---|---|---|
/// | [`TokenBucket`] | [`KeyedLimiter<K>`] | lock-free; tiers, per-key overrides, [`WhenFull::EvictFullest`] |
/// | [`Nginx`](crate::Nginx) | [`KeyedNginx<K>`] | lock-free |
/// | [`FixedWindow`](crate::FixedWindow) | [`KeyedFixedWindow<K>`] | lock-free |
/// | [`SlidingWindow`](crate::SlidingWindow) | [`KeyedSlidingWindow<K>`] | lock-free |
/// | [`SlidingLog`] | [`KeyedSlidingLog<K>`] | a lock per shard, never held across I/O |
///
/// Keys live in a sharded open-addressing table (see [`Key`] for the key types). A decision on
/// a tracked key in a lock-free table is one clock read, one hash, a probe of the key's home
/// group, and one CAS: no lock and no allocation. A new key is inserted lock-free; two threads
/// inserting the same key share one state. A state that decides as a fresh key's (a bucket
/// refilled to full, a past window, an nginx node whose excess has leaked, a wholly expired
/// log) is reclaimed when the room is needed (and [`sweep`](Keyed::sweep) reclaims all of
/// them): memory never grows, and no decision changes. A token bucket is reclaimed from one
/// unit of the table's clock after it refilled, not at that instant ([`WhenFull`] says when
/// exactly, and why). When a new key finds no room, the [`WhenFull`] policy decides.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FixedWindow, Keyed, KeyedLimiter, KeyedNginx, ManualClock, Nanos, Nginx, Outcome, TokenBucket};
///
/// let limiter = KeyedLimiter::<u64>::new(TokenBucket::per_second(2)?, 10_000)?;
/// assert!(limiter.check(&7).is_allowed());
/// assert!(limiter.check(&7).is_allowed());
/// assert!(!limiter.check(&7).is_allowed()); // key 7 is out of tokens
/// assert!(limiter.check(&8).is_allowed()); // key 8 has its own bucket
///
/// // nginx: `limit_req zone=per_ip rate=1r/s burst=2 nodelay;`, per client address.
/// let q = Nginx::per_second(1)?.burst(2)?.nodelay();
/// let per_ip: KeyedNginx<std::net::IpAddr, ManualClock> =
///     Keyed::builder(q).capacity(100_000).build_with_clock(ManualClock::new())?;
/// let alice = "192.0.2.1".parse().unwrap();
/// let outcomes: Vec<_> = (0..4).map(|_| per_ip.check_at(&alice, Nanos::ZERO).outcome()).collect();
/// assert_eq!(outcomes, [Outcome::Allowed, Outcome::Allowed, Outcome::Allowed, Outcome::Denied]);
///
/// // 100 per minute per tenant, in fixed windows.
/// let per_tenant = Keyed::<_, str>::builder(FixedWindow::new(100, Duration::from_secs(60))?).build()?;
/// assert!(per_tenant.check("tenant-a").is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// # Memory
///
/// The lock-free tables: 16 bytes per slot for keys of one word (integers, IPv4, fingerprinted
/// strings), 24 for two (`u128`, IPv6, `IpAddr`, byte arrays of 9 to 16), plus 2 bytes per slot
/// of headers and ghosts; at the table's maximum load of 7/8, a `u64` key costs 20.6 bytes. The
/// sliding log: `8·N` bytes of log and 24 (or 32) of slot per slot.
///
/// # Time
///
/// The lock-free tables keep two bits of each word for the slot's state, so their clocks run
/// for [`lifetime`](Keyed::lifetime): a quarter of the direct limiter's (146 years for token
/// bucket rates exact at 1 ns, at least 1.1 years for the finest units; 8.7 years for nginx).
/// Past it, nothing refills or resets: the table only denies.
pub struct Keyed<A: KeyedAlgorithm, K: Key + ?Sized, C: Clock = DefaultClock> {
    table: A::Table<K, C>,
    counters: Option<Arc<Counters>>,
}

/// A token bucket per key: tiers, per-key overrides, [`WhenFull::EvictFullest`].
pub type KeyedLimiter<K, C = DefaultClock> = Keyed<TokenBucket, K, C>;
/// nginx's `limit_req` per key.
pub type KeyedNginx<K, C = DefaultClock> = Keyed<crate::Nginx, K, C>;
/// A fixed window per key.
pub type KeyedFixedWindow<K, C = DefaultClock> = Keyed<crate::FixedWindow, K, C>;
/// A sliding-window counter per key.
pub type KeyedSlidingWindow<K, C = DefaultClock> = Keyed<crate::SlidingWindow, K, C>;
/// An exact sliding log per key: at most `N` in any window, under a lock per shard.
pub type KeyedSlidingLog<K, C = DefaultClock> = Keyed<SlidingLog, K, C>;

impl<A: KeyedAlgorithm, K: Key + ?Sized> Keyed<A, K, DefaultClock> {
    /// A builder for a table of `config` per key of `K`: `KeyedLimiter::<IpAddr>::builder(q)`,
    /// or `Keyed::builder(q)` where the binding's type names the key. It builds on the default
    /// clock ([`build`](KeyedBuilder::build)) or on any other
    /// ([`build_with_clock`](KeyedBuilder::build_with_clock)).
    ///
    /// Found on the default clock's type only: `Keyed::builder(q)` and
    /// `KeyedLimiter::<K, _>::builder(q)` name no clock, and finished with
    /// `build_with_clock(clock)` they must build on whatever clock that is given (the builder
    /// does not hold one). Were `builder` found on every clock's type, Rust would have no clock
    /// type to pick for those calls (`type annotations needed`). A type that names another
    /// clock takes [`builder_for_clock`](Keyed::builder_for_clock).
    pub fn builder(config: A) -> KeyedBuilder<A, K> {
        KeyedBuilder::new(config)
    }

    /// Room for `capacity` keys under `config`, on the default clock, refusing new keys when
    /// full. See [`builder`](Keyed::builder) for the options.
    pub fn new(config: A, capacity: usize) -> Result<Keyed<A, K, DefaultClock>, ConfigError> {
        KeyedBuilder::new(config).capacity(capacity).build()
    }
}

impl<A: KeyedAlgorithm, K: Key + ?Sized, C: Clock> Keyed<A, K, C> {
    /// [`builder`](Keyed::builder) on a type that names its clock, whatever it is:
    /// `KeyedLimiter::<u64, ManualClock>::builder_for_clock(q)`, finished with
    /// [`build_with_clock`](KeyedBuilder::build_with_clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{KeyedLimiter, ManualClock, TokenBucket};
    ///
    /// type Table = KeyedLimiter<u64, ManualClock>;
    /// let clock = ManualClock::new();
    /// let q = TokenBucket::per_second(1)?;
    /// let t = Table::builder_for_clock(q).capacity(10).build_with_clock(clock.clone())?;
    /// assert!(t.check(&7).is_allowed() && !t.check(&7).is_allowed());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(t.check(&7).is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder_for_clock(config: A) -> KeyedBuilder<A, K> {
        KeyedBuilder::new(config)
    }

    /// One unit for `key` now, or how long to wait.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Starts fetching the memory a decision on `key` reads (its home slots), and returns at
    /// once: nothing is decided, counted or inserted. A caller that sees one request at a time
    /// calls it as soon as it knows the key (when the request is parsed) and decides later:
    /// the cache miss then overlaps with the work in between, as [`check_batch`] overlaps
    /// the misses of a batch. It costs a hash (the decision hashes again) and is a hint: a
    /// key the table does not hold, or a line evicted again before the decision, costs only
    /// the hash.
    ///
    /// ```
    /// use tollgate::{KeyedLimiter, TokenBucket};
    ///
    /// let l = KeyedLimiter::<u64>::new(TokenBucket::per_second(10)?, 1 << 20)?;
    /// let requests = [7u64, 8, 9, 10];
    /// for (i, key) in requests.iter().enumerate() {
    ///     if let Some(ahead) = requests.get(i + 2) {
    ///         l.prefetch(ahead);
    ///     }
    ///     assert!(l.check(key).is_allowed_now());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`check_batch`]: Keyed::check_batch
    #[inline(always)]
    pub fn prefetch<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.prefetch_words(key.words(self.table.fingerprint()));
    }

    /// `n` units for `key` now, all or none. `n = 0` is always allowed and takes nothing; an
    /// `n` the limit can never admit at once is [`Outcome::Insufficient`](crate::Outcome).
    /// Neither inserts the key.
    // Always inline: out of line, the decision is returned through memory and the call saves
    // and restores six registers (1.17× the floor at 1K keys in the criterion bench, 1.12×
    // inline).
    #[inline(always)]
    pub fn check_n<Q>(&self, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.check_n_words(key.words(self.table.fingerprint()), n, &self.counters)
    }

    /// [`check`](Keyed::check) at a caller-supplied `now` ([`now`](Keyed::now)).
    #[inline]
    pub fn check_at<Q>(&self, key: &Q, now: Nanos) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n_at(key, now, 1)
    }

    /// [`check_n`](Keyed::check_n) at a caller-supplied `now`.
    ///
    /// Times must not run ahead of the ones later decisions use: a table reclaims a key once
    /// its state is a fresh key's as of the latest time it is given, and a key reclaimed at a
    /// later time comes back fresh at an earlier one. (The same holds for threads whose clocks
    /// disagree: a core whose clock leads by δ can reclaim a bucket δ early, worth up to
    /// δ·rate tokens.)
    #[inline(always)]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let d = self.table.check_n_at_words(key.words(self.table.fingerprint()), now, n);
        self.record(&d);
        d
    }

    /// Whether one unit was taken for `key` now. True for every admission, delayed ones too.
    #[inline]
    pub fn allow<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check(key).is_allowed()
    }

    /// Whether `n` units were taken for `key` now.
    #[inline]
    pub fn allow_n<Q>(&self, key: &Q, n: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n(key, n).is_allowed()
    }

    /// What [`check`](Keyed::check) would answer now, without taking anything or inserting
    /// the key.
    #[inline]
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.peek_n_at(key, self.now(), 1)
    }

    /// What [`check_n`](Keyed::check_n) would answer now, taking nothing.
    #[inline]
    pub fn peek_n<Q>(&self, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.peek_n_at(key, self.now(), n)
    }

    /// [`peek`](Keyed::peek) at a caller-supplied `now`.
    #[inline]
    pub fn peek_at<Q>(&self, key: &Q, now: Nanos) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.peek_n_at(key, now, 1)
    }

    /// [`peek_n`](Keyed::peek_n) at a caller-supplied `now`.
    #[inline]
    pub fn peek_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.peek_n_at_words(key.words(self.table.fingerprint()), now, n)
    }

    /// Decides a batch of `(key, cost)` requests with one clock read, writing each decision to
    /// `out` in order: per-packet callers pay for the clock once and, in the lock-free tables,
    /// for cache misses in parallel (slots are prefetched a few keys ahead). Decides
    /// `min(items.len(), out.len())` requests and returns that count.
    #[inline]
    pub fn check_batch<Q: Borrow<K>>(&self, items: &[(Q, u64)], out: &mut [Decision]) -> usize {
        self.check_batch_at(self.now(), items, out)
    }

    /// [`check_batch`](Keyed::check_batch) at a caller-supplied `now`.
    #[inline]
    pub fn check_batch_at<Q: Borrow<K>>(
        &self,
        now: Nanos,
        items: &[(Q, u64)],
        out: &mut [Decision],
    ) -> usize {
        if self.counters.is_some() {
            return self.check_batch_counted(now, items, out);
        }
        self.table.check_batch_at(now, items, out)
    }

    /// [`check_batch_at`](Keyed::check_batch_at) with counters: out of line, so that the batch
    /// loop without them is exactly the table's.
    #[cold]
    #[inline(never)]
    fn check_batch_counted<Q: Borrow<K>>(
        &self,
        now: Nanos,
        items: &[(Q, u64)],
        out: &mut [Decision],
    ) -> usize {
        let count = self.table.check_batch_at(now, items, out);
        out[..count].iter().for_each(|d| self.record(d));
        count
    }

    /// Counts a decision, if the table counts them. The count itself is out of line and takes
    /// only the outcome's code: inline, its slot lookup and increment kept the decision and
    /// their own values live across every check of a table without counters (spilled to the
    /// stack), as the direct limiter's merged paths did.
    #[inline(always)]
    fn record(&self, d: &Decision) {
        if let Some(c) = &self.counters {
            count(c, d.outcome_code());
        }
    }

    /// The decisions so far by outcome, and what the table did (inserts, clean and forced
    /// evictions), if the table counts decisions ([`KeyedBuilder::counters`]). Reads a few
    /// counters per shard: it does not walk the table.
    pub fn counters(&self) -> Option<CounterSnapshot> {
        let mut snapshot = self.counters.as_ref()?.snapshot();
        let [inserts, clean, forced] = self.table.table_counts();
        snapshot.inserts = inserts;
        snapshot.evicted_clean = clean;
        snapshot.evicted_forced = forced;
        Some(snapshot)
    }

    /// One tier's decisions so far by outcome (the default's is [`Tier::DEFAULT`]), if the
    /// table counts decisions; [`counters`](Keyed::counters) has every tier's together.
    pub fn tier_counters(&self, tier: Tier) -> Option<CounterSnapshot> {
        self.counters.as_ref()?.tier_snapshot(tier.index())
    }

    /// The decision counters themselves, for a metrics exporter that polls them apart from
    /// the table (decisions only: the table's own counts are in [`counters`](Keyed::counters)).
    pub fn counters_handle(&self) -> Option<Arc<Counters>> {
        self.counters.clone()
    }

    /// `key` as one limit of a multi-limit admission ([`check_all`](crate::check_all)): a
    /// per-client limit beside a global one, in one call.
    ///
    /// ```
    /// use tollgate::{check_all, Admit, KeyedLimiter, Limiter, TokenBucket};
    ///
    /// let per_client = KeyedLimiter::<str>::new(TokenBucket::per_second(5)?, 10_000)?;
    /// let global = Limiter::new(TokenBucket::per_second(1000)?);
    /// let d = check_all(&[&per_client.limit("alice") as &dyn Admit, &global], 1);
    /// assert!(d.is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limit<Q>(&self, key: &Q) -> KeyedLimit<'_, A, K, C>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        KeyedLimit {
            table: &self.table,
            counters: self.counters.as_deref(),
            words: key.words(self.table.fingerprint()),
        }
    }

    /// Reclaims every key whose state is a fresh key's (no decision changes) and returns how
    /// many. Takes time proportional to the capacity; run it from a background thread or a
    /// timer if new keys arrive faster than such keys are reclaimed on insert.
    pub fn sweep(&self) -> usize {
        self.table.sweep()
    }

    /// Keys tracked now, approximately under concurrent inserts.
    pub fn len(&self) -> u64 {
        self.table.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the table holds.
    pub fn capacity(&self) -> u64 {
        self.table.capacity()
    }

    /// Bytes the table owns.
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    /// A snapshot of the table's figures. Walks every slot: time proportional to the capacity.
    pub fn stats(&self) -> KeyedStats {
        self.table.stats()
    }

    /// The current time on this table's clock, for the `*_at` methods.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.table.clock().now()
    }

    /// How long after its creation this table's clock runs (see the type docs).
    pub fn lifetime(&self) -> Nanos {
        self.table.lifetime()
    }

    /// The configuration every key is decided by (for the token bucket: the default tier's
    /// current quota, as compiled for the table).
    pub fn policy(&self) -> A {
        self.table.config()
    }

    /// Replaces the configuration every key is decided by, at once and safely under
    /// concurrent decisions: each decision uses either the old or the new one, and every key
    /// keeps its state, read under the new configuration (as
    /// [`Direct::set_policy`](crate::Direct::set_policy) describes for each algorithm).
    ///
    /// What may change, so that the table can keep reclaiming states by the lines it was
    /// built with: the token bucket's quota up to the table's largest fill time (the default
    /// tier's, as [`set_tier_quota`](Keyed::set_tier_quota)); a window's limit, not its
    /// length (a sliding window's within the counts' width it was built with); nginx's burst
    /// (up to the one built with) and delay, not its rate; the sliding log's window and its
    /// limit up to the one built with (each key's log has that many entries). Fails, changing
    /// nothing, with [`UpdateError`] saying what may not change.
    ///
    /// ```
    /// use tollgate::{FixedWindow, KeyedFixedWindow};
    ///
    /// let per_tenant = KeyedFixedWindow::<str>::new("2/min".parse()?, 1_000)?;
    /// assert!(per_tenant.check("a").is_allowed() && per_tenant.check("a").is_allowed());
    /// assert!(!per_tenant.check("a").is_allowed());
    /// per_tenant.set_policy("5/min".parse()?)?; // the same window, its two requests counted
    /// assert_eq!(per_tenant.peek("a").remaining(), 2);
    /// assert!(per_tenant.set_policy("5/h".parse::<FixedWindow>()?).is_err()); // another window
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&self, new: A) -> Result<(), UpdateError> {
        self.table.set_config(new)
    }

    /// What the table does with a new key when it has no room.
    pub fn when_full(&self) -> WhenFull {
        self.table.when_full()
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        self.table.clock()
    }
}

/// Async waiting per key, on tokio's timer: the `tokio` feature.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl<K: Key + ?Sized, C: Clock> Keyed<TokenBucket, K, C> {
    /// One token for `key`, awaited: [`until_ready_n`](Keyed::until_ready_n) of 1.
    pub async fn until_ready<Q>(&self, key: &Q) -> Result<Nanos, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.until_ready_n_within(key, 1, Duration::MAX).await
    }

    /// Reserves `n` tokens for `key` and waits on tokio's timer until they are due, as
    /// [`Limiter::until_ready_n`](crate::Direct::until_ready_n) does: the tokens are then
    /// taken (do not check for them again), refusals are immediate, and the future is
    /// **cancel-safe** (dropped before it completes, it [cancels](Keyed::cancel) the
    /// reservation).
    pub async fn until_ready_n<Q>(&self, key: &Q, n: u64) -> Result<Nanos, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.until_ready_n_within(key, n, Duration::MAX).await
    }

    /// [`until_ready_n`](Keyed::until_ready_n), refused at once if the tokens would be due
    /// more than `max_wait` from now.
    pub async fn until_ready_n_within<Q>(
        &self,
        key: &Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Nanos, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let r = self.reserve_n_within(key, n, max_wait)?;
        Ok(crate::engine::wait::wait_until_due(self.clock(), r.ready_at(), r, |r| {
            let _ = self.cancel(key, r);
        })
        .await)
    }
}

/// Tiers and per-key overrides: the token bucket's table only.
impl<K: Key + ?Sized, C: Clock> Keyed<TokenBucket, K, C> {
    /// [`check_n`](Keyed::check_n) under `tier`, whatever the key's override: for callers that
    /// know a key's tier per request (a tenant's plan from its credentials). A tier of another
    /// limiter, beyond this one's list, is read as the default.
    #[inline]
    pub fn check_n_in<Q>(&self, key: &Q, tier: Tier, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.check_n_in_at(key, tier, self.now(), n)
    }

    /// [`check_n_in`](Keyed::check_n_in) at a caller-supplied `now`.
    #[inline]
    pub fn check_n_in_at<Q>(&self, key: &Q, tier: Tier, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let d = self.table.check_n_in_at_words(key.words(self.table.fingerprint()), tier, now, n);
        self.record(&d);
        d
    }

    /// One token for `key`, now or in the future: [`reserve_n`](Keyed::reserve_n) of 1.
    /// Refused with [`ReserveError::TooLate`], taking nothing, if the token would be due more
    /// than one fill time of the key's quota from now: a delay above `⌊burst·t/m⌋` ns (see
    /// [`reserve_n`](Keyed::reserve_n)).
    pub fn reserve<Q>(&self, key: &Q) -> Result<Reservation, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.reserve_n_at(key, self.now(), 1, Duration::MAX)
    }

    /// `n` tokens for `key`, now or as soon as its bucket has them: the reservation says when
    /// they are due. Exactly [`Limiter::reserve_n`](crate::Direct::reserve_n), per key: the
    /// key's bucket goes into debt of at most one burst, later checks and reservations of the
    /// key queue behind it (FIFO, with no lock and no queue), and refusals are immediate:
    /// [`ReserveError::Insufficient`] above the key's burst, [`ReserveError::TableFull`] for a
    /// new key with no room ([`WhenFull::Deny`]), and [`ReserveError::TooLate`] when the
    /// tokens would be due more than one fill time from now: when the delay (in whole
    /// nanoseconds, rounded up) would exceed `⌊burst·t/m⌋` ns, the fill time of the key's
    /// quota as the table counts it ([`tier_quota`](Keyed::tier_quota) of the key's tier:
    /// `t` its [`units_per_token`](TokenBucket::units_per_token), `m` its
    /// [`units_per_nano`](TokenBucket::units_per_nano)), rounded down. Under
    /// [`WhenFull::Allow`], a new key with no room gets a reservation due at once that takes
    /// nothing. A key in debt is never evicted. In the last fill time of the table's
    /// [`lifetime`](Keyed::lifetime), the debt allowed shrinks to what is left of it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Cancelled, KeyedLimiter, ManualClock, TokenBucket};
    ///
    /// let q = TokenBucket::per_second(10)?.with_burst(2)?;
    /// let l = KeyedLimiter::<str>::builder(q).capacity(1_000).build_with_clock(ManualClock::new())?;
    /// let a = l.reserve_n("tenant-a", 2)?; // the whole burst: due at once
    /// assert_eq!(a.delay(), Duration::ZERO);
    /// let b = l.reserve("tenant-a")?; // the next token: due in 100 ms
    /// assert_eq!(b.delay(), Duration::from_millis(100));
    /// assert!(!l.check("tenant-a").is_allowed()); // checks queue behind reservations
    /// assert!(l.check("tenant-b").is_allowed()); // every key has its own line
    /// assert_eq!(l.cancel("tenant-a", b), Cancelled::Returned);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_n<Q>(&self, key: &Q, n: u64) -> Result<Reservation, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.reserve_n_at(key, self.now(), n, Duration::MAX)
    }

    /// [`reserve_n`](Keyed::reserve_n), refused at once (taking nothing) if the tokens would
    /// be due more than `max_wait` from now.
    pub fn reserve_n_within<Q>(
        &self,
        key: &Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.reserve_n_at(key, self.now(), n, max_wait)
    }

    /// [`reserve_n_within`](Keyed::reserve_n_within) at a caller-supplied `now` (with the
    /// contract of [`check_n_at`](Keyed::check_n_at)).
    pub fn reserve_n_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.reserve_words(key.words(self.table.fingerprint()), now, n, max_wait, &self.counters)
    }

    /// Gives back what `r`, a reservation of `key`, still owes, by the rule of
    /// [`Limiter::cancel`](crate::Direct::cancel): while the key is in debt only its latest
    /// reservation goes back (whole); once it is out of debt, the tokens less the refill since.
    /// Another key's or another limiter's reservation is [`Cancelled::Foreign`].
    ///
    /// As with [`check_all`](crate::check_all)'s refunds on a keyed table, the refill is
    /// counted under the smallest fill any tier has had, so a key of a tier with a longer fill
    /// gets back less once out of debt; and a table that evicts by force
    /// ([`WhenFull::EvictFullest`]) gives nothing back ([`Cancelled::NothingOwed`]).
    pub fn cancel<Q>(&self, key: &Q, r: Reservation) -> Cancelled
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.cancel_words(key.words(self.table.fingerprint()), &r, || self.now())
    }

    /// [`cancel`](Keyed::cancel) at a caller-supplied `now`, no earlier than any decision's on
    /// this key.
    pub fn cancel_at<Q>(&self, key: &Q, now: Nanos, r: Reservation) -> Cancelled
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.cancel_words(key.words(self.table.fingerprint()), &r, || now)
    }

    /// One token for `key`, waiting for it up to one fill time: [`acquire_n`](Keyed::acquire_n)
    /// of 1 with no limit of the caller's. Refused at once with [`ReserveError::TooLate`] if
    /// the token would be due more than one fill time of the key's quota from now: a delay
    /// above `⌊burst·t/m⌋` ns (see [`reserve_n`](Keyed::reserve_n)).
    pub fn acquire<Q>(&self, key: &Q) -> Result<Nanos, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.acquire_n(key, 1, Duration::MAX)
    }

    /// Reserves `n` tokens for `key` and blocks the thread until they are due (asleep for the
    /// bulk, spinning the last 100 µs); refused at once with [`ReserveError::TooLate`], taking
    /// nothing, if they would be due more than `max_wait` from now, or more than one fill time
    /// of the key's quota from now whatever `max_wait` says: a delay above `⌊burst·t/m⌋` ns,
    /// the bound of [`reserve_n`](Keyed::reserve_n). So it never blocks longer than one fill
    /// time. Returns the due instant on the limiter's clock, as
    /// [`Limiter::acquire_n`](crate::Direct::acquire_n) does.
    pub fn acquire_n<Q>(&self, key: &Q, n: u64, max_wait: Duration) -> Result<Nanos, ReserveError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let due = self.reserve_n_within(key, n, max_wait)?.ready_at();
        crate::engine::wait::sleep_until(self.clock(), due);
        Ok(due)
    }

    /// The tier named `name`, if the limiter was built with it (`"default"` is the default).
    pub fn tier(&self, name: &str) -> Option<Tier> {
        self.table.tier(name)
    }

    /// A tier's current quota, as compiled for this table (in its time unit).
    pub fn tier_quota(&self, tier: Tier) -> TokenBucket {
        self.table.tier_quota(tier)
    }

    /// A tier's name.
    pub fn tier_name(&self, tier: Tier) -> &str {
        self.table.tier_name(tier)
    }

    /// Replaces a tier's quota (the default's too), for every key in it, at once and safely
    /// under concurrent decisions; each decision uses either the old or the new quota.
    ///
    /// A bucket keeps its *empty instant* across the change, and its level is read under the
    /// new quota: the time it has been refilling, at the new rate, capped at the new burst.
    /// Raising a tier's rate therefore credits its keys at the new rate for the time since
    /// they were last empty; lowering its burst cuts every key to at most the new burst. No
    /// key is ever above the burst of the quota it is decided under. The same holds when a key
    /// moves between tiers ([`set_override`](Keyed::set_override)).
    ///
    /// Fails, changing nothing, if the tier is not this limiter's, or if the quota's fill time
    /// exceeds the limiter's largest ([`KeyedBuilder::max_fill_time`]): the table reclaims
    /// buckets once they are full in every tier it may have, and a longer fill would make a
    /// reclaimed key differ from one still tracked.
    pub fn set_tier_quota(&self, tier: Tier, quota: TokenBucket) -> Result<(), UpdateError> {
        self.table.set_tier_quota(tier, quota)
    }

    /// Puts `key` in `tier` for [`check`](Keyed::check), [`check_n`](Keyed::check_n),
    /// [`peek`](Keyed::peek) and the batch API, from now on; see
    /// [`set_tier_quota`](Keyed::set_tier_quota) for what happens to its tokens. Fails when
    /// the overrides are full ([`KeyedBuilder::max_overrides`]) or the tier is unknown.
    /// Writers take a lock among themselves; decisions never do.
    pub fn set_override<Q>(&self, key: &Q, tier: Tier) -> Result<(), UpdateError>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.set_override_words(key.words(self.table.fingerprint()), tier)
    }

    /// Returns `key` to the default tier. Whether it had an override.
    pub fn clear_override<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.clear_override_words(key.words(self.table.fingerprint()))
    }

    /// Whether any key has an override now: one load, for callers that would otherwise look a
    /// key's override up (and extract the key to do so) only to find there are none.
    pub fn has_overrides(&self) -> bool {
        self.table.has_overrides()
    }

    /// The key's override, if it has one.
    pub fn override_of<Q>(&self, key: &Q) -> Option<Tier>
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.table.override_of_words(key.words(self.table.fingerprint()))
    }

    /// The default tier's current quota, as compiled for this table.
    pub fn quota(&self) -> TokenBucket {
        self.table.quota()
    }
}

impl<A: KeyedAlgorithm + fmt::Debug, K: Key + ?Sized, C: Clock> fmt::Debug for Keyed<A, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("policy", &self.policy())
            .field("capacity", &self.capacity())
            .field("when_full", &self.when_full())
            .finish_non_exhaustive()
    }
}

/// One key of a [`Keyed`] table, as a limit of [`check_all`](crate::check_all): from
/// [`Keyed::limit`].
///
/// Refunds give back what each algorithm can prove is still owed: the token bucket
/// `cost − (refill since the charge)` (exact in a table whose tiers share one fill time; none
/// with [`WhenFull::EvictFullest`], whose reused slots may carry another key's history), the
/// windows exactly while the window counts, nginx and the sliding log exactly if nothing else
/// changed the key since the charge, and nothing otherwise.
pub struct KeyedLimit<'a, A: KeyedAlgorithm, K: Key + ?Sized, C: Clock> {
    table: &'a A::Table<K, C>,
    counters: Option<&'a Counters>,
    words: K::Words,
}

impl<A: KeyedAlgorithm, K: Key + ?Sized, C: Clock> Admit for KeyedLimit<'_, A, K, C> {
    #[inline]
    fn charge(&self, n: u64) -> (Decision, Option<Receipt>) {
        let (d, receipt) = self.table.charge_words(self.words, n);
        if let Some(c) = self.counters {
            c.record(&d);
        }
        (d, receipt)
    }

    #[inline]
    fn refund(&self, receipt: Receipt) {
        self.table.refund_words(self.words, receipt);
    }

    #[inline]
    fn peek_n(&self, n: u64) -> Decision {
        self.table.peek_n_at_words(self.words, self.table.clock().now(), n)
    }
}

impl<A: KeyedAlgorithm, K: Key + ?Sized, C: Clock> fmt::Debug for KeyedLimit<'_, A, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimit").field("key", &self.words).finish_non_exhaustive()
    }
}

/// A snapshot of a keyed table's figures ([`Keyed::stats`]).
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
    /// Mean distance of live keys from their home slot, the first of their home group. Keys at
    /// 0 to 3 sit in their home group (new keys fill it from the top: the first key of a group
    /// sits at 3), and a decision on them reads one cache line; a key further on is decided on
    /// a slower path.
    pub mean_probe: f64,
    /// The largest distance of a live key from its home slot.
    pub max_probe: u64,
    /// Live keys by distance from their home slot (the last entry: the window's end).
    pub probe_histogram: Vec<u64>,
    /// Bytes the table owns.
    pub memory_bytes: u64,
    /// Bytes of the table's memory the kernel backs with huge pages now (Linux with
    /// transparent huge pages in `madvise` or `always` mode; 0 elsewhere). Large tables map
    /// their arrays themselves, 2 MiB-aligned, and ask for huge pages before first touching
    /// them, so this does not depend on what the allocator had been given back before.
    pub huge_page_bytes: u64,
}

/// A key located in the table.
struct Target<'a, W: Words> {
    words: W,
    hash: u64,
    shard: Shard<'a, W>,
    home: usize,
    /// The home group itself (`shard`'s group `home`).
    group: &'a Group<W>,
}

impl<'a, W: Words> Target<'a, W> {
    #[inline]
    fn new(table: &'a Table<W>, words: W, hash: u64) -> Target<'a, W> {
        let shard = table.shard(hash);
        Target { words, hash, shard, home: shard.home_of(hash), group: table.home_group(hash) }
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
            prefetch(t.group);
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
        huge_page_bytes: table.huge_page_bytes(),
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

/// Hints the CPU to fetch a key's home group into L1: its one cache line (one-word keys), or
/// its first two (wider keys, whose groups span more). The group after the home is not
/// fetched: the keys that overflow their home are few, and a second line per decision halves
/// the decisions whose misses a core keeps in flight at once.
#[inline(always)]
fn prefetch<W: Words>(group: &Group<W>) {
    let p: *const u8 = (group as *const Group<W>).cast();
    prefetch_line(p);
    if size_of::<Group<W>>() > 64 {
        prefetch_line(p.wrapping_add(64));
    }
}

/// [`Keyed::record`]'s count, out of line.
#[inline(never)]
pub(super) fn count(c: &Counters, code: usize) {
    c.record_code(code);
}

/// `d`, counted into `counters` if the table counts its decisions.
#[inline(always)]
pub(crate) fn tally(d: Decision, counters: &Option<Arc<Counters>>) -> Decision {
    if let Some(c) = counters {
        // By its outcome's code, a delay (nginx's) with its wait: as a direct limiter counts.
        c.record(&d);
    }
    d
}
