//! One limit of a layer: a tollgate limiter (direct or keyed, any algorithm), how a request finds
//! its key, which requests it applies to, what a request costs, and how the headers describe it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tollgate::{
    Admit, Algorithm, Clock, Decision, Direct, FixedWindow, Keyed, KeyedAlgorithm, Nginx, Queued, Receipt,
    Reservation, ReserveError, SlidingLog, SlidingWindow, TokenBucket,
};

use crate::key::{KeyError, KeyExtractor};

/// How a configuration reads in `RateLimit-Policy`: `q` units per `w` seconds.
pub trait HeaderQuota {
    /// The quota: what the limit admits at once, from full.
    fn quota(&self) -> u64;
    /// The window: the time over which the quota refills, in whole seconds, rounded up (at
    /// least 1: the header has no sub-second windows).
    fn window(&self) -> Duration;
    /// Whether some key of `table` may be decided under another configuration than the
    /// table's own: when not, [`for_key`](HeaderQuota::for_key) is `None` for every key, and
    /// the layer does not extract the key again to ask.
    fn keys_may_differ<K, C>(table: &Keyed<Self, K, C>) -> bool
    where
        Self: KeyedAlgorithm,
        K: tollgate::Key,
        C: Clock,
    {
        let _ = table;
        false
    }
    /// The configuration `key` is decided under in `table`, when it is not the table's own (a
    /// token bucket key's tier).
    fn for_key<K, C>(table: &Keyed<Self, K, C>, key: &K) -> Option<Self>
    where
        Self: KeyedAlgorithm,
        K: tollgate::Key,
        C: Clock,
    {
        let _ = (table, key);
        None
    }
}

fn whole_seconds(d: Duration) -> Duration {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(s.max(1))
}

/// The burst, refilled over the fill time; per key, the key's tier's.
impl HeaderQuota for TokenBucket {
    fn quota(&self) -> u64 {
        self.burst()
    }
    fn window(&self) -> Duration {
        whole_seconds(self.fill_time().as_duration())
    }
    fn keys_may_differ<K: tollgate::Key, C: Clock>(table: &Keyed<Self, K, C>) -> bool {
        table.has_overrides()
    }
    fn for_key<K: tollgate::Key, C: Clock>(table: &Keyed<Self, K, C>, key: &K) -> Option<Self> {
        table.override_of(key).map(|tier| table.tier_quota(tier))
    }
}

/// The bucket's burst and fill (the line waits beyond it).
impl HeaderQuota for Queued {
    fn quota(&self) -> u64 {
        self.bucket().burst()
    }
    fn window(&self) -> Duration {
        self.bucket().window()
    }
}

/// `burst + 1` requests (nginx passes one more than its burst), leaked over the time the rate
/// takes to pass them.
impl HeaderQuota for Nginx {
    fn quota(&self) -> u64 {
        self.burst_size() + 1
    }
    fn window(&self) -> Duration {
        let millis =
            (self.burst_size() + 1).saturating_mul(1_000_000).div_ceil(self.millirequests_per_second());
        whole_seconds(Duration::from_millis(millis))
    }
}

macro_rules! windowed {
    ($($ty:ty),*) => {$(
        /// The limit per window.
        impl HeaderQuota for $ty {
            fn quota(&self) -> u64 {
                self.limit()
            }
            fn window(&self) -> Duration {
                whole_seconds(<$ty>::window(self))
            }
        }
    )*};
}
windowed!(FixedWindow, SlidingWindow, SlidingLog);

/// What a charge took, for its refund if a later limit refuses the request.
pub(crate) enum Taken {
    /// A `check_all` receipt.
    Receipt(Receipt),
    /// A reservation (a waiting keyed bucket), cancelled.
    Reservation(Reservation),
}

/// What the layer needs of a limit, object-safe so that a layer holds any mix.
pub(crate) trait HttpLimit: Send + Sync {
    /// Takes `n` units for the request.
    fn charge(&self, req: &Parts, n: u64) -> Result<(Decision, Option<Taken>), KeyError>;
    /// Takes `n` units for the request, never to be given back: the last limit's charge (no
    /// later limit can refuse the request after it). A plain decision, without a receipt.
    fn check(&self, req: &Parts, n: u64) -> Result<Decision, KeyError> {
        self.charge(req, n).map(|(d, _)| d)
    }
    /// Gives back a charge of this request's.
    fn refund(&self, req: &Parts, taken: Taken);
    /// What `n` more units would get, taking nothing.
    fn peek(&self, req: &Parts, n: u64) -> Result<Decision, KeyError>;
    /// `(q, w)` for this request when not the limit's own (a keyed token bucket's tier).
    fn describe(&self, req: &Parts) -> Option<(u64, Duration)> {
        let _ = req;
        None
    }
}

struct DirectLimit<A: Algorithm, C: Clock>(Arc<Direct<A, C>>);

impl<A, C> HttpLimit for DirectLimit<A, C>
where
    A: Algorithm + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    fn charge(&self, _: &Parts, n: u64) -> Result<(Decision, Option<Taken>), KeyError> {
        let (d, r) = Admit::charge(&*self.0, n);
        Ok((d, r.map(Taken::Receipt)))
    }
    fn check(&self, _: &Parts, n: u64) -> Result<Decision, KeyError> {
        Ok(self.0.check_n(n))
    }
    fn refund(&self, _: &Parts, taken: Taken) {
        if let Taken::Receipt(r) = taken {
            Admit::refund(&*self.0, r);
        }
    }
    fn peek(&self, _: &Parts, n: u64) -> Result<Decision, KeyError> {
        Ok(self.0.peek_n(n))
    }
}

struct KeyedHttpLimit<A: KeyedAlgorithm, E: KeyExtractor, C: Clock> {
    limiter: Arc<Keyed<A, E::Key, C>>,
    key: E,
}

impl<A, E, C> HttpLimit for KeyedHttpLimit<A, E, C>
where
    A: KeyedAlgorithm + HeaderQuota + 'static,
    E: KeyExtractor,
    C: Clock + Send + Sync + 'static,
    Keyed<A, E::Key, C>: Send + Sync,
{
    fn charge(&self, req: &Parts, n: u64) -> Result<(Decision, Option<Taken>), KeyError> {
        let key = self.key.extract(req)?;
        let (d, r) = Admit::charge(&self.limiter.limit(&key), n);
        Ok((d, r.map(Taken::Receipt)))
    }
    fn check(&self, req: &Parts, n: u64) -> Result<Decision, KeyError> {
        let key = self.key.extract(req)?;
        Ok(self.limiter.check_n(&key, n))
    }
    fn refund(&self, req: &Parts, taken: Taken) {
        if let (Ok(key), Taken::Receipt(r)) = (self.key.extract(req), taken) {
            Admit::refund(&self.limiter.limit(&key), r);
        }
    }
    fn peek(&self, req: &Parts, n: u64) -> Result<Decision, KeyError> {
        let key = self.key.extract(req)?;
        Ok(self.limiter.peek_n(&key, n))
    }
    fn describe(&self, req: &Parts) -> Option<(u64, Duration)> {
        if !A::keys_may_differ(&self.limiter) {
            return None;
        }
        let key = self.key.extract(req).ok()?;
        A::for_key(&self.limiter, &key).map(|q| (q.quota(), q.window()))
    }
}

/// A token bucket per key whose requests over the limit wait in line (a reservation each, up to
/// `max_wait`) instead of being refused.
struct KeyedWaiting<E: KeyExtractor, C: Clock> {
    limiter: Arc<Keyed<TokenBucket, E::Key, C>>,
    key: E,
    max_wait: Duration,
}

impl<E, C> HttpLimit for KeyedWaiting<E, C>
where
    E: KeyExtractor,
    C: Clock + Send + Sync + 'static,
    Keyed<TokenBucket, E::Key, C>: Send + Sync,
{
    fn charge(&self, req: &Parts, n: u64) -> Result<(Decision, Option<Taken>), KeyError> {
        let key = self.key.extract(req)?;
        let reserved = self.limiter.reserve_n_within(&key, n, self.max_wait);
        // The key's state after the reservation (or the refusal), for the headers.
        let state = self.limiter.peek_n(&key, 0);
        let left = u32::try_from(state.remaining()).unwrap_or(u32::MAX);
        let reset = state.reset_after();
        Ok(match reserved {
            Ok(r) if r.delay().is_zero() => (Decision::allowed(left, reset), Some(Taken::Reservation(r))),
            Ok(r) => (Decision::delayed(0, r.delay(), reset), Some(Taken::Reservation(r))),
            // Retry once the wait fits the line.
            Err(ReserveError::TooLate { wait, max_wait }) => {
                (Decision::denied(left, wait.saturating_sub(max_wait), reset), None)
            }
            Err(ReserveError::Insufficient { .. }) => (Decision::insufficient(left, reset), None),
            Err(_) => (Decision::table_full(), None),
        })
    }
    fn refund(&self, req: &Parts, taken: Taken) {
        if let (Ok(key), Taken::Reservation(r)) = (self.key.extract(req), taken) {
            let _ = self.limiter.cancel(&key, r);
        }
    }
    fn peek(&self, req: &Parts, n: u64) -> Result<Decision, KeyError> {
        let key = self.key.extract(req)?;
        Ok(self.limiter.peek_n(&key, n))
    }
    fn describe(&self, req: &Parts) -> Option<(u64, Duration)> {
        if !self.limiter.has_overrides() {
            return None;
        }
        let key = self.key.extract(req).ok()?;
        TokenBucket::for_key(&self.limiter, &key).map(|q| (q.quota(), q.window()))
    }
}

type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
type Cost = Arc<dyn Fn(&Parts) -> u64 + Send + Sync>;
type Partition = Arc<dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync>;

/// One limit of a [`RateLimitLayer`](crate::RateLimitLayer): a limiter shared with the
/// application (an `Arc`: change its quota, read its counters, while the layer uses it), named
/// for the `RateLimit` headers.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{KeyedLimiter, Limiter, Nginx, TokenBucket};
/// use tollgate_tower::{ClientIp, HeaderKey, Limit};
///
/// let per_ip = Arc::new(KeyedLimiter::new("10/s burst=20".parse::<TokenBucket>()?, 100_000)?);
/// let global = Arc::new(tollgate::NginxLimiter::new("1000r/s burst=100 nodelay".parse::<Nginx>()?));
/// let limits = [
///     Limit::keyed("per-ip", per_ip, ClientIp::<64>::new().trust("10.0.0.0/8")?),
///     // Only on the login route, and a login costs 5.
///     Limit::direct("global", global).when(|req| req.uri.path() == "/login").cost(|_| 5),
/// ];
/// # let _ = limits;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Limit {
    pub(crate) name: Arc<str>,
    pub(crate) limit: Arc<dyn HttpLimit>,
    pub(crate) quota: u64,
    pub(crate) window: Duration,
    /// Whether `quota` and `window` were set by [`describe`](Limit::describe).
    pub(crate) described: bool,
    pub(crate) when: Option<Predicate>,
    pub(crate) cost: Option<Cost>,
    pub(crate) partition: Option<Partition>,
}

impl Limit {
    /// One limiter for every request: a global limit.
    pub fn direct<A, C>(name: &str, limiter: Arc<Direct<A, C>>) -> Limit
    where
        A: Algorithm + HeaderQuota + Clone + Send + Sync + 'static,
        C: Clock + Send + Sync + 'static,
    {
        let config = limiter.policy();
        Limit::new(name, Arc::new(DirectLimit(limiter)), config.quota(), config.window())
    }

    /// A limiter per key, the key found by `key`.
    pub fn keyed<A, E, C>(name: &str, limiter: Arc<Keyed<A, E::Key, C>>, key: E) -> Limit
    where
        A: KeyedAlgorithm + HeaderQuota + 'static,
        E: KeyExtractor,
        C: Clock + Send + Sync + 'static,
        Keyed<A, E::Key, C>: Send + Sync,
    {
        let config = limiter.policy();
        Limit::new(name, Arc::new(KeyedHttpLimit { limiter, key }), config.quota(), config.window())
    }

    /// A token bucket per key whose requests over the limit wait in line instead of being
    /// refused: each request reserves its tokens ([`Keyed::reserve_n_within`]), and one due
    /// later is `Delayed` (the layer waits, then serves it: [`Delays`](crate::Delays)); one
    /// that would wait more than `max_wait` (or a fill time) is refused at once, with
    /// `Retry-After` the time until the line has room. A request refused by a later limit gives
    /// its reservation back ([`Keyed::cancel`]).
    pub fn keyed_waiting<E, C>(
        name: &str,
        limiter: Arc<Keyed<TokenBucket, E::Key, C>>,
        key: E,
        max_wait: Duration,
    ) -> Limit
    where
        E: KeyExtractor,
        C: Clock + Send + Sync + 'static,
        Keyed<TokenBucket, E::Key, C>: Send + Sync,
    {
        let config = limiter.policy();
        Limit::new(name, Arc::new(KeyedWaiting { limiter, key, max_wait }), config.quota(), config.window())
    }

    fn new(name: &str, limit: Arc<dyn HttpLimit>, quota: u64, window: Duration) -> Limit {
        Limit {
            name: name.into(),
            limit,
            quota,
            window,
            described: false,
            when: None,
            cost: None,
            partition: None,
        }
    }

    /// Applies the limit only to requests for which `pred` is true (a route, a method): per-route
    /// quotas in one layer.
    pub fn when(mut self, pred: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Limit {
        self.when = Some(Arc::new(pred));
        self
    }

    /// What a request costs this limit (1 by default): a bulk endpoint, a request's size class.
    /// A cost of 0 passes and takes nothing.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Limit {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Sends the bytes `pk` gives for a request as the IETF fields' partition key: `pk=:…:`
    /// (base64) on this limit's `RateLimit-Policy` item and, when this limit is the one
    /// described, on `RateLimit`; none for a request it gives `None`. Off by default: a key
    /// may be personal data (an address, an account), so give an opaque identifier, such as
    /// a keyed hash of the key, not the key itself.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{KeyedLimiter, TokenBucket};
    /// use tollgate_tower::{HeaderKey, Limit};
    ///
    /// let per_key = Arc::new(KeyedLimiter::<String>::new("10/s".parse::<TokenBucket>()?, 10_000)?);
    /// let key = HeaderKey(http::HeaderName::from_static("x-api-key"));
    /// // A tenant id the application keeps for each API key (here, a stand-in).
    /// let tenant_of = |req: &http::request::Parts| Some(req.headers.get("x-tenant")?.as_bytes().to_vec());
    /// let limit = Limit::keyed("per-key", per_key, key).partition_key(tenant_of);
    /// # let _ = limit;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition_key(mut self, pk: impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static) -> Limit {
        self.partition = Some(Arc::new(pk));
        self
    }

    /// Describes the limit in `RateLimit-Policy` as `q` units per `w` (rounded up to whole
    /// seconds) instead of what its configuration says.
    pub fn describe(mut self, q: u64, w: Duration) -> Limit {
        self.quota = q;
        self.window = whole_seconds(w);
        self.described = true;
        self
    }

    /// The name the headers give it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn applies(&self, req: &Parts) -> bool {
        self.when.as_ref().map_or(true, |p| p(req))
    }

    /// `(q, w)` for `req` when not the limit's own: a keyed token bucket key's tier (unless
    /// [`describe`](Limit::describe) fixed it).
    pub(crate) fn quota_for(&self, req: &Parts) -> Option<(u64, Duration)> {
        if self.described {
            return None;
        }
        self.limit.describe(req).filter(|&qw| qw != (self.quota, self.window))
    }

    pub(crate) fn cost_of(&self, req: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |c| c(req))
    }

    /// `;pk=:…:` for `req`, if the limit sends a partition key and has one for it.
    pub(crate) fn pk_param(&self, req: &Parts) -> Option<String> {
        use base64::Engine;
        let pk = self.partition.as_ref()?(req)?;
        Some(format!(";pk=:{}:", base64::engine::general_purpose::STANDARD.encode(pk)))
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("window", &self.window)
            .field("per_route", &self.when.is_some())
            .field("partition_key", &self.partition.is_some())
            .finish_non_exhaustive()
    }
}
