//! The decisions of `ShouldRateLimit`, apart from any protocol: upstream's fixed window on
//! tollgate's keyed tables, in the process.
//!
//! Each rule (a descriptor with a `rate_limit`) gets a keyed table of window counters, made on
//! its first request: a [`FixedWindow`] of the rule's unit whose windows start at multiples of
//! the unit since the Unix epoch (the table's clock starts at such a multiple, and each
//! decision is made at the wall-clock time), keyed by the request's values as upstream's cache
//! key is.
//! The table counts every hit, as upstream's `INCRBY` does before it compares: its count after
//! the hits is `after`, the descriptor is over the limit when `after > requests_per_unit`,
//! and `limit_remaining` is `requests_per_unit − after` otherwise. Rejected hits therefore
//! count, and a migration changes no verdict.
//!
//! The table's count is 32 bits wide, as upstream's `requests_per_unit` (a uint32): a hit
//! that would take it past 2^32 − 1 is past every limit, over it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::{
    Decision, FixedWindow, Keyed, ManualClock, Nanos, Nginx, Outcome, Rate, SlidingWindow, TokenBucket,
    WhenFull,
};

use crate::config::Descriptor;
use crate::config::{Algorithm, Config, ConfigError, Domain, Metadata, RateLimit, Unit};
use crate::matching::{Found, Lookup};
use crate::redis::{Decided, RedisBackend};

/// The largest count upstream's window holds (2^32 − 1, its windows being whole seconds),
/// every uint32 limit's: a hit that would take a count past it is over every limit.
pub(crate) const MAX_COUNT: u64 = FixedWindow::MAX_LONG_LIMIT;

/// A rule's table of per-value state.
enum Table {
    /// A fixed window: upstream's counted one (its limit the largest count, refused hits
    /// counted, the rule's limit compared with the count after the hits: [`Spec::counted`]),
    /// or tollgate's with the rule's own quota.
    /// Every table's clock's zero is `origin` ns after the Unix epoch (a window's, a multiple of
    /// its length); tollgate's other algorithms, each with the rule's own quota, take nothing
    /// for a refused hit.
    Window(Keyed<FixedWindow, str, ManualClock>, u64),
    Bucket(Keyed<TokenBucket, str, ManualClock>, u64),
    Sliding(Keyed<SlidingWindow, str, ManualClock>, u64),
    Nginx(Keyed<Nginx, str, ManualClock>, u64),
}

impl Table {
    /// `n` hits of `key` at `now_ns` since the Unix epoch.
    fn check(&self, key: &str, now_ns: u64, n: u64) -> tollgate::Decision {
        let at = |origin: u64| Nanos::new(now_ns.saturating_sub(origin));
        match self {
            Table::Window(t, origin) => t.check_n_at(key, at(*origin), n),
            Table::Bucket(t, origin) => t.check_n_at(key, at(*origin), n),
            Table::Sliding(t, origin) => t.check_n_at(key, at(*origin), n),
            Table::Nginx(t, origin) => t.check_n_at(key, at(*origin), n),
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            Table::Window(t, _) => t.memory_bytes(),
            Table::Bucket(t, _) => t.memory_bytes(),
            Table::Sliding(t, _) => t.memory_bytes(),
            Table::Nginx(t, _) => t.memory_bytes(),
        }
    }
}

/// What a rule's table is made of: what a reload must keep the same for the table (and its
/// counts) to carry over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    algorithm: Algorithm,
    /// The window (or the bucket's period), whole seconds.
    pub(crate) window: u64,
    /// The rule's quota and burst; both 0 for upstream's counted window, whose counts hold for
    /// any limit.
    quota: u32,
    burst: u32,
}

impl Spec {
    /// The spec of a limited rule whose `requests_per_unit` is not 0.
    fn of(r: &RateLimit) -> Spec {
        let window = r.window().map_or(1, |w| w.as_secs());
        if r.counts_rejected() {
            return Spec { algorithm: Algorithm::FixedWindow, window, quota: 0, burst: 0 };
        }
        let burst = match r.algorithm {
            Algorithm::TokenBucket => r.burst.unwrap_or(r.requests_per_unit),
            Algorithm::Nginx => r.burst.unwrap_or(0),
            _ => 0,
        };
        Spec { algorithm: r.algorithm, window, quota: r.requests_per_unit, burst }
    }

    /// Upstream's reset: whole seconds to the end of the window (aligned on the epoch) that
    /// holds `now_ns`.
    fn until_reset(self, now_ns: u64) -> Duration {
        Duration::from_secs(self.window - (now_ns / 1_000_000_000) % self.window)
    }

    pub(crate) fn counted(self) -> bool {
        self.quota == 0
    }

    pub(crate) fn algorithm(self) -> Algorithm {
        self.algorithm
    }

    /// nginx's `limit_req` of an `nginx` rule: `rate=quota r/s` (or `r/m` for a minute),
    /// `burst`, `nodelay`.
    pub(crate) fn nginx(self) -> Result<Nginx, tollgate::ConfigError> {
        let quota = u64::from(self.quota);
        let rate = if self.window == 60 { Nginx::per_minute(quota) } else { Nginx::per_second(quota) };
        Ok(rate?.burst(u64::from(self.burst))?.nodelay())
    }

    /// The fixed window of a `fixed_window` rule: upstream's counts every hit up to the largest
    /// count (the rule's limit is compared with the count); tollgate's has the rule's limit.
    pub(crate) fn fixed_window(self) -> Result<FixedWindow, tollgate::ConfigError> {
        let limit = if self.counted() { MAX_COUNT } else { u64::from(self.quota) };
        FixedWindow::new(limit, Duration::from_secs(self.window))
    }

    /// The sliding window of a `sliding_window` rule.
    pub(crate) fn sliding(self) -> Result<SlidingWindow, tollgate::ConfigError> {
        SlidingWindow::new(u64::from(self.quota), Duration::from_secs(self.window))
    }

    /// The token bucket of a `token_bucket` (or `gcra`) rule: `quota` per window, `burst`.
    pub(crate) fn bucket(self) -> Result<TokenBucket, tollgate::ConfigError> {
        TokenBucket::new(
            Rate::per(u64::from(self.quota), Duration::from_secs(self.window)),
            u64::from(self.burst),
        )
    }

    /// The most hits one value can have at once: the count from which a decision is near the
    /// limit.
    fn capacity(self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => u64::from(self.burst),
            Algorithm::Nginx => u64::from(self.burst) + 1,
            _ => u64::from(self.quota),
        }
    }

    /// A table of `capacity` values made at `now_ns`, or what is wrong with the quota.
    fn table(self, capacity: usize, now_ns: u64) -> Result<Table, tollgate::ConfigError> {
        // Windows start on multiples of the window since the Unix epoch, as upstream's.
        let aligned = now_ns - now_ns % (self.window.saturating_mul(1_000_000_000)).max(1);
        fn build<A: tollgate::KeyedAlgorithm>(
            policy: A,
            capacity: usize,
        ) -> Result<Keyed<A, str, ManualClock>, tollgate::ConfigError> {
            Keyed::<A, str, ManualClock>::builder_for_clock(policy)
                .capacity(capacity)
                .when_full(WhenFull::Deny)
                .build_with_clock(ManualClock::new())
        }
        Ok(match self.algorithm {
            Algorithm::FixedWindow => Table::Window(build(self.fixed_window()?, capacity)?, aligned),
            Algorithm::SlidingWindow => Table::Sliding(build(self.sliding()?, capacity)?, aligned),
            Algorithm::TokenBucket => Table::Bucket(build(self.bucket()?, capacity)?, now_ns),
            Algorithm::Nginx => Table::Nginx(build(self.nginx()?, capacity)?, now_ns),
        })
    }
}

/// A limited rule's state in the service: its table, made on its first request, and its
/// counts (under its full key).
pub(crate) struct RuleSlot {
    /// The rule's full key: its table's name (on Redis, its keys' prefix).
    name: String,
    spec: Spec,
    /// The largest lease on the Redis backend (0: none).
    max_lease: u64,
    table: OnceLock<Arc<Table>>,
    counts: Arc<Counts>,
}

/// Which table counts a decision: a rule's, or a domain's per-request limits of one unit (one
/// table for all of them, so that clients cannot make tables).
#[derive(Clone, Copy)]
pub(crate) enum TableRef<'r> {
    Rule(&'r RuleSlot),
    Override(&'r str, Unit),
}

impl<'r> TableRef<'r> {
    /// The rule's full key, or the domain's per-request limits.
    pub(crate) fn name(self) -> std::borrow::Cow<'r, str> {
        match self {
            TableRef::Rule(slot) => std::borrow::Cow::Borrowed(&slot.name),
            TableRef::Override(domain, _) => std::borrow::Cow::Owned(format!("{domain}|override")),
        }
    }

    /// The largest lease of the rule on the Redis backend (0: none).
    pub(crate) fn max_lease(self) -> u64 {
        match self {
            TableRef::Rule(slot) => slot.max_lease,
            TableRef::Override(..) => 0,
        }
    }

    pub(crate) fn spec(self) -> Spec {
        match self {
            TableRef::Rule(slot) => slot.spec,
            TableRef::Override(_, unit) => {
                Spec { algorithm: Algorithm::FixedWindow, window: unit.seconds(), quota: 0, burst: 0 }
            }
        }
    }
}

/// Where a decision is counted: its rule's counts, or the counts of a statistics name that
/// depends on the request.
#[derive(Clone, Copy)]
pub(crate) enum StatsRef<'r> {
    Rule(&'r Counts),
    /// A name made from the request's values (`detailed_metric`, `value_to_metric`, a
    /// per-request limit), and where its hits go once the statistics hold their budget.
    Key(&'r str, Overflow<'r>),
}

/// Where the hits of a new statistics name go when the statistics are full
/// ([`Limits::with_statistics_budget`]).
#[derive(Clone, Copy)]
pub(crate) enum Overflow<'r> {
    /// The rule's own name (upstream's name without `detailed_metric`).
    Rule(&'r Counts),
    /// The domain's `<domain>.statistics_overflow` (a per-request limit has no rule).
    Domain(&'r str),
}

/// Every statistics name's counts, and the bytes they hold.
#[derive(Default)]
struct Statistics {
    names: HashMap<String, Arc<Counts>, ahash::RandomState>,
    /// Each name's [`statistics_bytes`].
    bytes: usize,
}

/// What a statistics name holds besides its text: the map's entry, the `Arc` and the counts,
/// and its five series in a `/metrics` exporter.
const STATISTICS_ENTRY_BYTES: usize = 640;

/// The copies of a statistics name's text: the map's key, and the labels of its five series
/// in a `/metrics` exporter (which keeps every series it was given).
const STATISTICS_NAME_COPIES: usize = 6;

/// The bytes a statistics name costs the budget.
fn statistics_bytes(name: &str) -> usize {
    name.len().saturating_mul(STATISTICS_NAME_COPIES).saturating_add(STATISTICS_ENTRY_BYTES)
}

/// Where a per-request limit's hits count once the statistics are full: `<domain>.` and this.
pub(crate) const OVERFLOW_NAME: &str = "statistics_overflow";

/// The statistics' default budget: 32 MiB of names and counts.
pub const DEFAULT_STATISTICS_BYTES: usize = 32 << 20;

impl Statistics {
    /// The counts of `name`, made for it whatever the budget (the configuration's own names,
    /// and the overflow names, whose number the configuration bounds).
    fn entry(&mut self, name: &str) -> Arc<Counts> {
        if let Some(c) = self.names.get(name) {
            return Arc::clone(c);
        }
        self.bytes += statistics_bytes(name);
        Arc::clone(self.names.entry(name.to_owned()).or_default())
    }
}

/// One statistics key's counts, each added to with a saturating atomic add.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    total_hits: AtomicU64,
    over_limit: AtomicU64,
    near_limit: AtomicU64,
    within_limit: AtomicU64,
    shadow_mode: AtomicU64,
}

impl Counts {
    /// `n` more in `field`, held at 2^64 − 1: a request's hits can be anything up to it.
    fn add(field: &AtomicU64, n: u64) {
        if n > 0 {
            // Relaxed: a statistic, read on its own by a scrape; nothing is published with it.
            let _ = field.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_add(n)));
        }
    }

    fn snapshot(&self) -> RuleCounts {
        RuleCounts {
            total_hits: self.total_hits.load(Relaxed),
            over_limit: self.over_limit.load(Relaxed),
            near_limit: self.near_limit.load(Relaxed),
            within_limit: self.within_limit.load(Relaxed),
            shadow_mode: self.shadow_mode.load(Relaxed),
        }
    }
}

/// One descriptor's part of a request: an answer known without deciding, or a decision to
/// make.
pub(crate) enum Step<'r> {
    Known(Status),
    Decide(Pending<'r>),
}

impl<'r> Step<'r> {
    pub(crate) fn pending(&self) -> Option<&Pending<'r>> {
        match self {
            Step::Decide(p) => Some(p),
            Step::Known(_) => None,
        }
    }
}

/// A decision to make: `hits` of `key` in `table`, under `limit`.
pub(crate) struct Pending<'r> {
    pub(crate) table: TableRef<'r>,
    pub(crate) key: String,
    pub(crate) limit: CurrentLimit,
    pub(crate) hits: u64,
    pub(crate) stats: StatsRef<'r>,
    pub(crate) shadow: bool,
}

impl Pending<'_> {
    /// The units the decision asks for: the hits, held at the largest count in upstream's
    /// counted window (which counts them all and compares the count with the rule's limit).
    pub(crate) fn units(&self) -> u64 {
        if self.table.spec().counted() {
            self.hits.min(MAX_COUNT)
        } else {
            self.hits
        }
    }
}

/// A request's answer code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The rule's `name` ("" without one).
    pub name: String,
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// The limit that applied (`None`: no rule, or an unlimited one).
    pub current_limit: Option<CurrentLimit>,
    /// What is left in the window (`u32::MAX` for an unlimited rule, as upstream).
    pub limit_remaining: u32,
    /// Until the window ends, in whole seconds, when a limit applied.
    pub duration_until_reset: Option<Duration>,
}

impl Status {
    fn unlimited() -> Status {
        Status { code: Code::Ok, current_limit: None, limit_remaining: u32::MAX, duration_until_reset: None }
    }

    fn no_limit() -> Status {
        Status { code: Code::Ok, current_limit: None, limit_remaining: 0, duration_until_reset: None }
    }
}

/// A request descriptor: its entries, a per-request limit, and its own hits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDescriptor {
    /// `(key, value)` entries, in order.
    pub entries: Vec<(String, String)>,
    /// A limit the request brings for this descriptor (upstream's `limit` override).
    pub limit: Option<(u32, Option<Unit>)>,
    /// The descriptor's own `hits_addend` (0: check without charging).
    pub hits_addend: Option<u64>,
}

/// A `ShouldRateLimit` request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<RequestDescriptor>,
    /// Hits of every descriptor without its own (0 counts as 1).
    pub hits_addend: u32,
}

/// A `ShouldRateLimit` answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub overall_code: Code,
    /// One per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// Headers for Envoy to add to the client's response ([`Settings::response_headers`]).
    pub headers: Vec<(String, String)>,
    /// The request and the `metadata` of the rules it passed, for Envoy's dynamic metadata
    /// ([`Settings::dynamic_metadata`]).
    pub dynamic_metadata: Option<Metadata>,
}

/// The names of the headers that describe the limit to the client (upstream's
/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    /// Upstream's defaults: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    fn default() -> HeaderNames {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The service's settings (upstream's environment variables of the same meaning).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `SHADOW_MODE`: a request over the limit is answered OK overall (its statuses keep
    /// OVER_LIMIT), and counted as `global_shadow_mode`.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every rule is in quota mode (see [`Descriptor::quota_mode`](crate::Descriptor)).
    pub quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`, with the names: the most constraining status as three
    /// headers for the client.
    pub response_headers: Option<HeaderNames>,
    /// `NEAR_LIMIT_RATIO`: above this share of the limit, hits count as near it (default 0.8).
    pub near_limit_ratio: f32,
    /// `RESPONSE_DYNAMIC_METADATA`: answers carry, as upstream's, a struct of the request
    /// (`domain`, `descriptors` with their `entries` as `key=value`, `limit` and `hitsAddend`,
    /// and the request's `hitsAddend`) and the `metadata` of every rule the request passed,
    /// merged (the first value of a key wins; structs merge).
    pub dynamic_metadata: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            near_limit_ratio: 0.8,
            dynamic_metadata: false,
        }
    }
}

/// A request upstream refuses, with upstream's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// `rate limit domain must not be empty`.
    EmptyDomain,
    /// `rate limit descriptor list must not be empty`.
    NoDescriptors,
    /// A per-request limit whose unit is not one (upstream's process crashes on it).
    OverrideUnit { descriptor: usize },
    /// The Redis backend could not decide, and its failure policy is to say so.
    Unavailable(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::EmptyDomain => f.write_str("rate limit domain must not be empty"),
            RequestError::NoDescriptors => f.write_str("rate limit descriptor list must not be empty"),
            RequestError::OverrideUnit { descriptor } => {
                write!(
                    f,
                    "descriptor {descriptor}: the limit override has no unit (UNKNOWN): it limits nothing"
                )
            }
            RequestError::Unavailable(why) => write!(f, "the Redis backend could not decide: {why}"),
        }
    }
}

impl std::error::Error for RequestError {}

/// The counts of one statistics key, as upstream's `ratelimit.service.rate_limit.<key>.*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleCounts {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
}

/// The wall clock, in nanoseconds since the Unix epoch (or a test's).
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

fn system_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Per domain, the per-request limits' tables, one per unit.
type Overrides = HashMap<String, Vec<(Unit, Arc<Table>)>, ahash::RandomState>;

/// A configuration and its counters: what `ShouldRateLimit` decides with.
pub struct Limits {
    config: Config,
    /// Per descriptor of the configuration (by its `index`), its limited rule's state.
    rules: Box<[Option<RuleSlot>]>,
    /// Per domain, the per-request limits' tables, one per unit.
    overrides: RwLock<Overrides>,
    /// Every statistics key's counts (the rules' own included), shared with the limits a
    /// reload makes.
    counts: RwLock<Statistics>,
    /// The most bytes the statistics' names made from requests may bring the statistics to.
    statistics_budget: usize,
    clock: WallClock,
    keys_per_rule: usize,
    settings: Settings,
    /// Requests answered OK overall by the global shadow mode.
    global_shadow: std::sync::atomic::AtomicU64,
    /// Where the windows live when not in the process.
    redis: Option<RedisBackend>,
    /// Each decision's time (kept across reloads).
    latency: Arc<crate::latency::Latency>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits").field("domains", &self.config.domains().count()).finish_non_exhaustive()
    }
}

impl Limits {
    /// Decisions under `config` on the system clock, each rule's table holding up to
    /// `keys_per_rule` distinct values at once. Refuses a rule the tables cannot count.
    pub fn new(config: Config, keys_per_rule: usize) -> Result<Limits, ConfigError> {
        Limits::with_clock(config, keys_per_rule, Arc::new(system_time))
    }

    /// [`new`](Limits::new) on a given wall clock (ns since the Unix epoch).
    pub fn with_clock(config: Config, keys_per_rule: usize, clock: WallClock) -> Result<Limits, ConfigError> {
        Limits::build(config, keys_per_rule, clock, None)
    }

    /// The limits of `config`, with the tables and counts of `previous` where its rules stay.
    fn build(
        config: Config,
        keys_per_rule: usize,
        clock: WallClock,
        previous: Option<&Limits>,
    ) -> Result<Limits, ConfigError> {
        for domain in config.domains() {
            check_rules(domain)?;
        }
        // Counts carry over by name (the same counters, so that a decision of the old limits
        // still in flight is not lost); tables by rule and spec.
        let mut counts = Statistics::default();
        if let Some(p) = previous {
            let old = p.counts.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            counts.names.clone_from(&old.names);
            counts.bytes = old.bytes;
        }
        let old_tables: HashMap<(&str, Spec), &Arc<Table>> = previous
            .iter()
            .flat_map(|p| p.rules.iter().flatten())
            .filter_map(|slot| Some(((slot.name.as_str(), slot.spec), slot.table.get()?)))
            .collect();
        let mut rules: Vec<Option<RuleSlot>> = (0..config.descriptor_count()).map(|_| None).collect();
        for domain in config.domains() {
            each_rule(&domain.root, &mut |rule| {
                let Some(r) = rule.rate_limit.as_ref().filter(|r| !r.unlimited) else { return };
                let spec = Spec::of(r);
                let table = OnceLock::new();
                if let Some(t) = old_tables.get(&(rule.full_key.as_str(), spec)) {
                    let _ = table.set(Arc::clone(t));
                }
                rules[rule.index] = Some(RuleSlot {
                    name: rule.full_key.clone(),
                    spec,
                    max_lease: r.max_lease(),
                    table,
                    counts: counts.entry(&rule.full_key),
                });
            });
        }
        let overrides = previous.map_or_else(HashMap::default, |p| {
            p.overrides
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .filter(|(domain, _)| config.domain(domain).is_some())
                .map(|(domain, tables)| (domain.clone(), tables.clone()))
                .collect()
        });
        Ok(Limits {
            config,
            rules: rules.into_boxed_slice(),
            overrides: RwLock::new(overrides),
            counts: RwLock::new(counts),
            statistics_budget: previous.map_or(DEFAULT_STATISTICS_BYTES, |p| p.statistics_budget),
            clock,
            keys_per_rule: keys_per_rule.max(1),
            settings: Settings::default(),
            global_shadow: std::sync::atomic::AtomicU64::new(0),
            redis: None,
            latency: Arc::default(),
        })
    }

    /// These limits deciding on Redis ([`should_rate_limit_async`](Limits::should_rate_limit_async)),
    /// shared by every instance with the same backend and prefix: every algorithm runs there.
    pub fn with_redis(mut self, backend: RedisBackend) -> Limits {
        self.redis = Some(backend);
        self
    }

    /// The Redis backend, if any.
    pub fn redis(&self) -> Option<&RedisBackend> {
        self.redis.as_ref()
    }

    /// These limits keeping at most about `bytes` of statistics (default
    /// [`DEFAULT_STATISTICS_BYTES`]): names, their counts and the five series each becomes in
    /// a `/metrics` exporter (six copies of the name, and 640 bytes besides), the
    /// configuration's own names always. The names made from requests' values
    /// (`detailed_metric`, `value_to_metric`, per-request limits) are kept until a new one
    /// would bring the statistics past `bytes`; from then on a new name's hits count under its
    /// rule's own name (a per-request limit's under `<domain>.statistics_overflow`), so that
    /// requests of ever new values cannot grow the service's memory. Upstream keeps every name
    /// (its statistics grow without bound).
    pub fn with_statistics_budget(mut self, bytes: usize) -> Limits {
        self.statistics_budget = bytes;
        self
    }

    /// The bytes the statistics hold (names and counts), by the measure of
    /// [`with_statistics_budget`](Limits::with_statistics_budget), and how many names.
    pub fn statistics_memory(&self) -> (usize, usize) {
        let stats = self.counts.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (stats.bytes, stats.names.len())
    }

    /// These limits under `settings`.
    pub fn with_settings(mut self, settings: Settings) -> Limits {
        self.settings = settings;
        self
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Requests the global shadow mode answered OK although over a limit.
    pub fn global_shadow_mode(&self) -> u64 {
        self.global_shadow.load(Relaxed)
    }

    /// Limits under `config` that keep this one's counts where its rules stay: the window
    /// counters of every rule whose path and unit are unchanged (a changed
    /// `requests_per_unit` applies to the counts already made), the per-request limits'
    /// counters, and every statistics key's counts. What a reload makes.
    pub fn reloaded(&self, config: Config) -> Result<Limits, ConfigError> {
        let mut next = Limits::build(config, self.keys_per_rule, Arc::clone(&self.clock), Some(self))?
            .with_settings(self.settings.clone());
        if let Some(redis) = &self.redis {
            next = next.with_redis(redis.clone());
        }
        next.latency = Arc::clone(&self.latency);
        next.global_shadow.store(self.global_shadow_mode(), Relaxed);
        Ok(next)
    }

    /// The memory the window tables made so far hold (allocated up front per table, for
    /// `keys_per_rule` values each), and how many tables there are.
    pub fn memory(&self) -> (usize, usize) {
        let overrides = self.overrides.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tables: Vec<&Arc<Table>> = self
            .rules
            .iter()
            .flatten()
            .filter_map(|slot| slot.table.get())
            .chain(overrides.values().flatten().map(|(_, t)| t))
            .collect();
        (tables.iter().map(|t| t.memory_bytes()).sum(), tables.len())
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The counts kept under statistics key `key` (e.g. `domain.key1_value1`).
    pub fn counts(&self, key: &str) -> RuleCounts {
        self.counts
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .names
            .get(key)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    /// Writes every statistics key's counts to the `metrics` facade under upstream's
    /// Prometheus names, as absolute values: `ratelimit_service_rate_limit_<stat>` for
    /// `total_hits`, `over_limit`, `near_limit`, `within_limit` and `shadow_mode`, labelled
    /// `domain`, `key1` and (from three levels) `key2` as upstream's mapper labels them
    /// (deeper levels add up into their `key2`), after upstream's sanitizing (`:` and `|` as
    /// `_`, the dots of an IPv4 address as `_`). Call it before rendering a scrape.
    ///
    /// Also `ratelimit_service_decision_seconds`, a histogram of the time each request took to
    /// decide (Redis's round trip included) in [`should_rate_limit_async`](Limits::should_rate_limit_async),
    /// the samples since the last call.
    pub fn report_metrics(&self) {
        self.latency.report();
        metrics::counter!("ratelimit_service_global_shadow_mode").absolute(self.global_shadow_mode());
        let counts: Vec<(String, RuleCounts)> = self
            .counts
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .names
            .iter()
            .map(|(key, c)| (key.clone(), c.snapshot()))
            .collect();
        let mut series: HashMap<(String, String, Option<String>), RuleCounts> = HashMap::new();
        for (key, c) in counts {
            let key = sanitize_stat(&key);
            let mut parts = key.splitn(4, '.');
            let domain = parts.next().unwrap_or_default().to_owned();
            let Some(key1) = parts.next() else { continue };
            let key2 = parts.next().map(str::to_owned);
            let total = series.entry((domain, key1.to_owned(), key2)).or_default();
            total.total_hits = total.total_hits.saturating_add(c.total_hits);
            total.over_limit = total.over_limit.saturating_add(c.over_limit);
            total.near_limit = total.near_limit.saturating_add(c.near_limit);
            total.within_limit = total.within_limit.saturating_add(c.within_limit);
            total.shadow_mode = total.shadow_mode.saturating_add(c.shadow_mode);
        }
        for ((domain, key1, key2), c) in series {
            let mut labels = vec![("domain", domain), ("key1", key1)];
            if let Some(key2) = key2 {
                labels.push(("key2", key2));
            }
            for (name, value) in [
                ("ratelimit_service_rate_limit_total_hits", c.total_hits),
                ("ratelimit_service_rate_limit_over_limit", c.over_limit),
                ("ratelimit_service_rate_limit_near_limit", c.near_limit),
                ("ratelimit_service_rate_limit_within_limit", c.within_limit),
                ("ratelimit_service_rate_limit_shadow_mode", c.shadow_mode),
            ] {
                metrics::counter!(name, &labels).absolute(value);
            }
        }
    }

    /// Decides a request as upstream's `ShouldRateLimit` does, on the embedded tables (a
    /// Redis backend is asked only by [`should_rate_limit_async`](Limits::should_rate_limit_async)).
    pub fn should_rate_limit(&self, request: &Request) -> Result<Response, RequestError> {
        self.check_request(request)?;
        let now_ns = (self.clock)();
        let rules = self.rules(request);
        let steps = self.steps(request, &rules);
        let decisions: Vec<Option<Decision>> =
            steps.iter().map(|s| s.pending().and_then(|p| self.decide_local(p, now_ns))).collect();
        Ok(self.finish(request, &rules, steps, decisions, now_ns, None))
    }

    /// [`should_rate_limit`](Limits::should_rate_limit), on the Redis backend when the limits
    /// have one ([`with_redis`](Limits::with_redis)): every descriptor's window in one script
    /// call (one per hash slot on a Cluster), and the backend's failure policy when Redis
    /// cannot answer in time.
    pub async fn should_rate_limit_async(&self, request: &Request) -> Result<Response, RequestError> {
        let started = std::time::Instant::now();
        let answer = self.decide_async(request).await;
        self.latency.record(started.elapsed());
        answer
    }

    async fn decide_async(&self, request: &Request) -> Result<Response, RequestError> {
        let Some(redis) = &self.redis else { return self.should_rate_limit(request) };
        self.check_request(request)?;
        let now_ns = (self.clock)();
        let rules = self.rules(request);
        let steps = self.steps(request, &rules);
        Ok(match redis.decide(self, &steps, now_ns).await? {
            Decided::Each(decisions) => self.finish(request, &rules, steps, decisions, now_ns, None),
            Decided::Failed(code) => {
                let none = vec![None; steps.len()];
                self.finish(request, &rules, steps, none, now_ns, Some(code))
            }
        })
    }

    fn check_request(&self, request: &Request) -> Result<(), RequestError> {
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if matches!(d.limit, Some((_, None))) {
                return Err(RequestError::OverrideUnit { descriptor: i });
            }
        }
        Ok(())
    }

    /// The rule of each of the request's descriptors.
    fn rules<'c>(&'c self, request: &Request) -> Vec<Rule<'c>> {
        let domain = self.config.domain(&request.domain);
        let mut composite = String::new();
        request
            .descriptors
            .iter()
            .map(|d| match domain {
                Some(domain) => Rule::of(domain, d, &mut composite),
                None => Rule::None,
            })
            .collect()
    }

    /// What each descriptor needs: an answer known without deciding, or a decision.
    fn steps<'r>(&'r self, request: &'r Request, rules: &'r [Rule<'_>]) -> Vec<Step<'r>> {
        // Rules another applying rule replaces are neither counted nor reported.
        let replaced: Vec<&str> = rules
            .iter()
            .filter_map(Rule::descriptor)
            .flat_map(|d| d.rate_limit.iter().flat_map(|r| r.replaces.iter().map(String::as_str)))
            .collect();
        let mut steps = Vec::with_capacity(rules.len());
        for (d, rule) in request.descriptors.iter().zip(rules) {
            let hits = d.hits_addend.unwrap_or_else(|| u64::from(request.hits_addend.max(1)));
            steps.push(match rule {
                Rule::None => Step::Known(Status::no_limit()),
                Rule::Plain(descriptor) | Rule::Found(Found { descriptor, .. }) => {
                    let r = descriptor.rate_limit.as_ref().expect("a found rule has a rate_limit");
                    if r.unlimited {
                        Step::Known(Status::unlimited())
                    } else if !r.name.is_empty() && replaced.contains(&r.name.as_str()) {
                        Step::Known(Status::no_limit())
                    } else {
                        let slot =
                            self.rules[descriptor.index].as_ref().expect("every limited rule has a slot");
                        let (shared, stats) = match rule {
                            Rule::Found(f) => (
                                f.shared.as_slice(),
                                StatsRef::Key(&f.stats_key, Overflow::Rule(&slot.counts)),
                            ),
                            _ => (&[][..], StatsRef::Rule(&slot.counts)),
                        };
                        Step::Decide(Pending {
                            limit: CurrentLimit {
                                requests_per_unit: r.requests_per_unit,
                                unit: r.unit.expect("a limited rule has a unit"),
                                name: r.name.clone(),
                            },
                            table: TableRef::Rule(slot),
                            key: cache_key(&d.entries, shared),
                            hits,
                            stats,
                            shadow: descriptor.shadow_mode,
                        })
                    }
                }
                Rule::Override(requests_per_unit, unit, stats_key) => Step::Decide(Pending {
                    limit: CurrentLimit {
                        requests_per_unit: *requests_per_unit,
                        unit: *unit,
                        name: String::new(),
                    },
                    table: TableRef::Override(&request.domain, *unit),
                    key: cache_key(&d.entries, &[]),
                    hits,
                    stats: StatsRef::Key(stats_key, Overflow::Domain(&request.domain)),
                    shadow: false,
                }),
            });
        }
        steps
    }

    /// The response, from each step and its decision (`None`: a limit of 0), or with every
    /// limited descriptor answered `failed` (a failure policy's answer).
    fn finish(
        &self,
        request: &Request,
        rules: &[Rule<'_>],
        steps: Vec<Step<'_>>,
        decisions: Vec<Option<Decision>>,
        now_ns: u64,
        failed: Option<Code>,
    ) -> Response {
        let mut statuses = Vec::with_capacity(rules.len());
        // Per status: whether a limit decided it (not unlimited, not unmatched) and whether
        // its rule is in quota mode.
        let mut kinds = Vec::with_capacity(rules.len());
        for ((step, rule), decision) in steps.into_iter().zip(rules).zip(decisions) {
            let status = match step {
                Step::Known(status) => status,
                Step::Decide(p) => match failed {
                    None => self.account(&p, decision, now_ns),
                    Some(code) => self.failed(&p, code, now_ns),
                },
            };
            let quota = self.settings.quota_mode || rule.descriptor().is_some_and(|d| d.quota_mode);
            kinds.push((status.current_limit.is_some(), quota));
            statuses.push(status);
        }
        // Upstream's overall code: over when a rule not in quota mode is over, or when every
        // quota rule is.
        let (mut failed_rate, mut failed_quota, mut quotas) = (0, 0, 0);
        for (s, &(limited, quota)) in statuses.iter().zip(&kinds) {
            if !limited {
                continue;
            }
            match (s.code, quota) {
                (Code::OverLimit, true) => failed_quota += 1,
                (Code::OverLimit, false) => failed_rate += 1,
                _ => {}
            }
            if quota {
                quotas += 1;
            }
        }
        let mut overall_code = if failed_rate > 0 || (quotas > 0 && quotas == failed_quota) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if overall_code == Code::OverLimit && self.settings.shadow_mode {
            overall_code = Code::Ok;
            self.global_shadow.fetch_add(1, Relaxed);
        }
        let headers = match &self.settings.response_headers {
            Some(names) => headers(names, &statuses, &kinds),
            None => Vec::new(),
        };
        let dynamic_metadata =
            self.settings.dynamic_metadata.then(|| dynamic_metadata(request, rules, &statuses));
        Response { overall_code, statuses, headers, dynamic_metadata }
    }

    /// One descriptor's decision in the embedded table (`None` for a limit of 0: every hit
    /// is over it, nothing is decided).
    pub(crate) fn decide_local(&self, p: &Pending<'_>, now_ns: u64) -> Option<Decision> {
        if p.limit.requests_per_unit == 0 {
            return None;
        }
        Some(self.check(p.table, &p.key, now_ns, p.units()))
    }

    /// One descriptor's status when its decision could not be made: `code`, by the failure
    /// policy, counted as within or over the limit.
    fn failed(&self, p: &Pending<'_>, code: Code, now_ns: u64) -> Status {
        let remaining = self.count(p.stats, |c| {
            Counts::add(&c.total_hits, p.hits);
            if code == Code::Ok {
                Counts::add(&c.within_limit, p.hits);
                p.limit.requests_per_unit
            } else {
                Counts::add(&c.over_limit, p.hits);
                0
            }
        });
        Status {
            code,
            current_limit: Some(p.limit.clone()),
            limit_remaining: remaining,
            duration_until_reset: Some(p.table.spec().until_reset(now_ns)),
        }
    }

    /// One descriptor's status from its decision (upstream's: the count after the hits,
    /// compared with the limit), counted in its statistics.
    fn account(&self, p: &Pending<'_>, decision: Option<Decision>, now_ns: u64) -> Status {
        let (limit, hits, shadow) = (p.limit.clone(), p.hits, p.shadow);
        let spec = p.table.spec();
        // Upstream's reset: the end of the (aligned) window, whole seconds rounded up (its
        // formula) on the clock that decided: a fixed window's decision counts to its end,
        // Redis's on the Redis backend (a lease's decision too); this machine's otherwise.
        let window_reset = match decision {
            Some(d) if spec.algorithm() == Algorithm::FixedWindow && d.reset_after_nanos().as_u64() > 0 => {
                Duration::from_secs(d.reset_after_nanos().as_u64().div_ceil(1_000_000_000))
            }
            _ => spec.until_reset(now_ns),
        };
        // `after`: the count after the hits, as upstream's INCRBY returns it; `over`: the count
        // above which a decision is over the limit.
        let (after, over, reset) = match decision {
            None => (hits, 0, window_reset),
            Some(d) if spec.counted() => {
                // The window's count is what its largest count leaves remaining: after the
                // units it took (the hits, held at 2^32 − 1: `Pending::units`), or before the
                // hits it could not take (a count past 2^32 − 1, past every uint32 limit; a
                // full table answers with nothing remaining). Upstream's `after` is the count
                // before plus every hit.
                let count = MAX_COUNT.saturating_sub(d.remaining());
                let after = match d.outcome() {
                    Outcome::Allowed => count.saturating_add(hits - p.units()),
                    _ => count.saturating_add(hits),
                };
                (after, u64::from(limit.requests_per_unit), window_reset)
            }
            Some(d) => {
                // tollgate's: the algorithm decided, and a refusal took nothing. What the value
                // holds after an admission is its capacity less what remains; a refusal reads
                // as every hit over the limit.
                let capacity = spec.capacity();
                let reset = match spec.algorithm {
                    Algorithm::FixedWindow | Algorithm::SlidingWindow => window_reset,
                    // Whole seconds until the bucket is full again, rounded up.
                    _ => Duration::from_secs(d.reset_after_nanos().as_u64().div_ceil(1_000_000_000)),
                };
                match d.outcome() {
                    Outcome::Allowed => (capacity.saturating_sub(d.remaining()), capacity, reset),
                    _ => (capacity.saturating_add(hits), capacity, reset),
                }
            }
        };
        let before = after.saturating_sub(hits);
        // At most `over`: a ratio of 1 on a limit an f32 rounds up (above 2^24) must not put
        // the near line past the limit, where the counts below would go negative.
        let near = ((over as f64 * f64::from(self.settings.near_limit_ratio)).floor() as u64).min(over);
        let (code, remaining) = self.count(p.stats, |c| {
            Counts::add(&c.total_hits, hits);
            let (code, remaining) = if after > over {
                if before >= over {
                    Counts::add(&c.over_limit, hits);
                } else {
                    Counts::add(&c.over_limit, after - over);
                    Counts::add(&c.near_limit, over - near.max(before));
                }
                (Code::OverLimit, 0)
            } else {
                if after > near {
                    Counts::add(&c.near_limit, if before >= near { hits } else { after - near });
                }
                Counts::add(&c.within_limit, hits);
                (Code::Ok, u32::try_from(over - after).unwrap_or(u32::MAX))
            };
            if code == Code::OverLimit && shadow {
                Counts::add(&c.shadow_mode, if before >= over { hits } else { after - over });
                (Code::Ok, remaining)
            } else {
                (code, remaining)
            }
        });
        Status {
            code,
            current_limit: Some(limit),
            limit_remaining: remaining,
            duration_until_reset: Some(reset),
        }
    }

    /// `f` on the counts of `stats` (those of a name first counted now made for it, within
    /// the statistics' budget; else those it overflows to).
    fn count<T>(&self, stats: StatsRef<'_>, f: impl FnOnce(&Counts) -> T) -> T {
        let (key, overflow) = match stats {
            StatsRef::Rule(counts) => return f(counts),
            StatsRef::Key(key, overflow) => (key, overflow),
        };
        if let Some(c) = self.counts.read().unwrap_or_else(std::sync::PoisonError::into_inner).names.get(key)
        {
            return f(c);
        }
        let mut stats = self.counts.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = if stats.names.contains_key(key)
            || stats.bytes.saturating_add(statistics_bytes(key)) <= self.statistics_budget
        {
            stats.entry(key)
        } else {
            match overflow {
                Overflow::Rule(counts) => {
                    drop(stats);
                    return f(counts);
                }
                Overflow::Domain(domain) => stats.entry(&format!("{domain}.{OVERFLOW_NAME}")),
            }
        };
        drop(stats);
        f(&c)
    }

    /// `n` hits of `key` in `table`, the table made on first use (at `now_ns`).
    fn check(&self, table: TableRef<'_>, key: &str, now_ns: u64, n: u64) -> Decision {
        let make = |spec: Spec| {
            Arc::new(
                spec.table(self.keys_per_rule, now_ns)
                    .expect("every rule's table was made once when the configuration was loaded"),
            )
        };
        let (domain, unit) = match table {
            TableRef::Rule(slot) => return slot.table.get_or_init(|| make(slot.spec)).check(key, now_ns, n),
            TableRef::Override(domain, unit) => (domain, unit),
        };
        // The read lock is held over the decision, so that the table's `Arc` is not touched.
        let overrides = self.overrides.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, t)) = overrides.get(domain).and_then(|ts| ts.iter().find(|(u, _)| *u == unit)) {
            return t.check(key, now_ns, n);
        }
        drop(overrides);
        let mut overrides = self.overrides.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tables = overrides.entry(domain.to_owned()).or_default();
        let t = match tables.iter().find(|(u, _)| *u == unit) {
            Some((_, t)) => Arc::clone(t),
            None => {
                let t = make(table.spec());
                tables.push((unit, Arc::clone(&t)));
                t
            }
        };
        drop(overrides);
        t.check(key, now_ns, n)
    }
}

/// Upstream's response headers: the status with the least remaining (the last one over the
/// limit, outside quota mode, if any), as its limit, remaining and seconds to the window's end.
fn headers(names: &HeaderNames, statuses: &[Status], kinds: &[(bool, bool)]) -> Vec<(String, String)> {
    let mut chosen: Option<&Status> = None;
    let mut least = u32::MAX;
    for (s, &(limited, quota)) in statuses.iter().zip(kinds) {
        if !limited {
            continue;
        }
        if s.code == Code::OverLimit && !quota {
            chosen = Some(s);
            least = 0;
        } else if s.limit_remaining < least {
            chosen = Some(s);
            least = s.limit_remaining;
        }
    }
    let Some(s) = chosen else { return Vec::new() };
    let Some(limit) = &s.current_limit else { return Vec::new() };
    let reset = s.duration_until_reset.unwrap_or_default().as_secs();
    vec![
        (names.limit.clone(), limit.requests_per_unit.to_string()),
        (names.remaining.clone(), s.limit_remaining.to_string()),
        (names.reset.clone(), reset.to_string()),
    ]
}

/// Upstream's dynamic metadata: the request, and the merged `metadata` of the rules whose
/// descriptors passed (limited or not, unlimited ones aside).
fn dynamic_metadata(request: &Request, rules: &[Rule<'_>], statuses: &[Status]) -> Metadata {
    let text = |s: &str| Metadata::String(s.to_owned());
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = vec![(
                "entries".to_owned(),
                Metadata::List(d.entries.iter().map(|(k, v)| text(&format!("{k}={v}"))).collect()),
            )];
            if let Some((requests_per_unit, unit)) = d.limit {
                let unit = unit.map_or("UNKNOWN".to_owned(), |u| u.name().to_uppercase());
                fields.push((
                    "limit".into(),
                    text(&format!("requests_per_unit:{requests_per_unit} unit:{unit}")),
                ));
            }
            if let Some(h) = d.hits_addend {
                fields.push(("hitsAddend".into(), Metadata::Number(h as f64)));
            }
            Metadata::Struct(fields)
        })
        .collect();
    let mut fields = vec![
        ("domain".to_owned(), text(&request.domain)),
        ("descriptors".into(), Metadata::List(descriptors)),
    ];
    if request.hits_addend != 0 {
        fields.push(("hitsAddend".into(), Metadata::Number(f64::from(request.hits_addend))));
    }
    let mut passed = Vec::new();
    for (rule, status) in rules.iter().zip(statuses) {
        let Some(descriptor) = rule.descriptor() else { continue };
        let limited = descriptor.rate_limit.as_ref().is_some_and(|r| !r.unlimited);
        if limited && status.code == Code::Ok && status.current_limit.is_some() {
            if let Some(Metadata::Struct(m)) = &descriptor.metadata {
                merge(&mut passed, m);
            }
        }
    }
    if !passed.is_empty() {
        fields.push(("metadata".into(), Metadata::Struct(passed)));
    }
    Metadata::Struct(fields)
}

/// Upstream's `mergeMetadata`: a key already in `into` keeps its value, unless both are
/// structs, which merge.
fn merge(into: &mut Vec<(String, Metadata)>, from: &[(String, Metadata)]) {
    for (k, v) in from {
        match into.iter_mut().find(|(key, _)| key == k) {
            Some((_, Metadata::Struct(inner))) => {
                if let Metadata::Struct(more) = v {
                    merge(inner, more);
                }
            }
            Some(_) => {}
            None => into.push((k.clone(), v.clone())),
        }
    }
}

/// The rule of one request descriptor.
enum Rule<'c> {
    None,
    /// A rule counted under its own full key.
    Plain(&'c Descriptor),
    /// A rule whose statistics name or counter depends on the match.
    Found(Found<'c>),
    /// A per-request limit: requests per unit, unit, statistics key.
    Override(u32, Unit, String),
}

impl<'c> Rule<'c> {
    fn of(domain: &'c Domain, d: &RequestDescriptor, composite: &mut String) -> Rule<'c> {
        if let Some((requests_per_unit, Some(unit))) = d.limit {
            let mut key = domain.name.clone();
            for (k, v) in &d.entries {
                key.push('.');
                key.push_str(k);
                if !v.is_empty() {
                    key.push('_');
                    key.push_str(v);
                }
            }
            return Rule::Override(requests_per_unit, unit, key);
        }
        match domain.lookup(&d.entries, composite) {
            None => Rule::None,
            Some(Lookup::Plain(descriptor)) => {
                // The fast walk's claim: the full one names the statistics as the rule.
                #[cfg(debug_assertions)]
                {
                    let entries: Vec<(&str, &str)> =
                        d.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    let found =
                        domain.find(&entries).expect("the full walk finds the rule the fast one found");
                    debug_assert!(std::ptr::eq(found.descriptor, descriptor));
                    debug_assert_eq!(found.stats_key, descriptor.full_key);
                    debug_assert!(found.shared.iter().all(Option::is_none));
                }
                Rule::Plain(descriptor)
            }
            Some(Lookup::Full(found)) => Rule::Found(found),
        }
    }

    /// The configuration's descriptor that applies, if one does.
    fn descriptor(&self) -> Option<&'c Descriptor> {
        match self {
            Rule::Plain(d) => Some(d),
            Rule::Found(f) => Some(f.descriptor),
            _ => None,
        }
    }
}

/// Upstream's cache key without its domain prefix and window: `key_value_` per entry, the
/// shared pattern in place of the value where the threshold is shared.
fn cache_key(entries: &[(String, String)], shared: &[Option<String>]) -> String {
    let value = |i: usize, v: &'_ String| shared.get(i).and_then(Option::as_deref).unwrap_or(v).len();
    let mut key =
        String::with_capacity(entries.iter().enumerate().map(|(i, (k, v))| k.len() + value(i, v) + 2).sum());
    for (i, (k, v)) in entries.iter().enumerate() {
        key.push_str(k);
        key.push('_');
        key.push_str(shared.get(i).and_then(Option::as_deref).unwrap_or(v));
        key.push('_');
    }
    key
}

/// `f` on every descriptor below `node`, depth first.
pub(crate) fn each_rule<'c>(
    node: &'c crate::config::Descriptor,
    f: &mut impl FnMut(&'c crate::config::Descriptor),
) {
    for child in node.children() {
        f(child);
        each_rule(child, f);
    }
}

/// Every limited rule's table made once, so that a quota tollgate cannot hold (a sliding
/// window's limit, a rate, burst or window out of range) is refused at load, naming the rule.
fn check_rules(domain: &Domain) -> Result<(), ConfigError> {
    let mut first = None;
    each_rule(&domain.root, &mut |rule| {
        let Some(r) = rule.rate_limit.as_ref().filter(|r| !r.unlimited && r.requests_per_unit > 0) else {
            return;
        };
        let why = Spec::of(r).table(1, 0).err().map(|e| format!("cannot be decided: {e}"));
        if let (Some(why), None) = (why, &first) {
            first = Some((rule, why));
        }
    });
    let Some((rule, why)) = first else { return Ok(()) };
    let r = rule.rate_limit.as_ref().expect("a limited rule");
    Err(ConfigError {
        file: domain.file.clone(),
        line: rule.line,
        message: format!(
            "requests_per_unit {} of '{}' ({}) {why}",
            r.requests_per_unit,
            rule.full_key,
            r.algorithm.name()
        ),
    })
}

/// Upstream's `SanitizeStatName`: `:` and `|` as `_`, and the dots of anything shaped like an
/// IPv4 address (four runs of 1 to 3 digits) as `_`.
pub(crate) fn sanitize_stat(key: &str) -> String {
    let mut out: Vec<char> = key.chars().map(|c| if c == ':' || c == '|' { '_' } else { c }).collect();
    let n = out.len();
    let mut i = 0;
    while i < n {
        // The longest `d{1,3}.d{1,3}.d{1,3}.d{1,3}` starting at i.
        let mut j = i;
        let mut dots = Vec::new();
        let mut ok = true;
        for group in 0..4 {
            let start = j;
            while j < n && out[j].is_ascii_digit() && j - start < 3 {
                j += 1;
            }
            if j == start {
                ok = false;
                break;
            }
            if group < 3 {
                if j < n && out[j] == '.' {
                    dots.push(j);
                    j += 1;
                } else {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            for d in dots {
                out[d] = '_';
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::sanitize_stat;

    #[test]
    fn stat_names_are_sanitized_as_upstreams() {
        assert_eq!(sanitize_stat("edge.remote_address_50.0.0.5"), "edge.remote_address_50_0_0_5");
        assert_eq!(sanitize_stat("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitize_stat("d.version_1.2.3"), "d.version_1.2.3");
        assert_eq!(sanitize_stat("d.k.v"), "d.k.v");
    }
}
