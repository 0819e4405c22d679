//! The round-trip limiter: every decision is one script call on the server's clock.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Script, ScriptInvocation};
use tollgate::{ConfigError, Decision, KeyedLimiter, TokenBucket};

use crate::error::{redact, Error};
use crate::failure::{Breaker, Counters, Gate, OnFailure, Stats};

/// The bucket script: the decision (bucket_core.lua) and its call on one key (bucket.lua).
const BUCKET_LUA: &str = concat!(include_str!("bucket_core.lua"), include_str!("bucket.lua"));

/// The most microseconds the script's doubles hold exactly. The server's TIME (about 2^50.6 µs
/// since 1970) and so every elapsed time stay below it; a lifetime beyond it is never reached.
pub(crate) const MAX_MICROS: u64 = 1 << 53;

/// A decision, made by Redis (with the stamp and the bucket clock it was made on, from which
/// the engine answers any other cost at that instant) or by the failure policy.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    Redis { decision: Decision, stamp: u64, now: u64 },
    Policy(Decision),
}

impl Answer {
    pub(crate) fn decision(self) -> Decision {
        match self {
            Answer::Redis { decision, .. } | Answer::Policy(decision) => decision,
        }
    }
}

/// Where the limiter's buckets live.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl core::fmt::Debug for Conn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> redis::RedisResult<Vec<u8>> {
        match self.clone() {
            Conn::Single(mut c) => invocation.invoke_async(&mut c).await,
            Conn::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
    }

    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }
}

/// A token bucket per key, kept in Redis (standalone or Cluster) and shared by every process
/// that uses the same prefix and quota. Each decision is one `EVALSHA` round trip that decides
/// on the **server's clock**; the bucket's state is the engine's own 64-bit word, so a decision
/// equals what a local [`Limiter`](tollgate::Limiter) would answer at the same instant, field
/// for field (`remaining`, `retry_after`, `reset_after`).
///
/// Cheap to clone (an `Arc`); concurrent calls share one multiplexed connection per server and
/// are pipelined on it. Build one with [`RedisLimiter::builder`].
#[derive(Clone, Debug)]
pub struct RedisLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    link: Link,
    quota: TokenBucket,
    prefix: Vec<u8>,
    script: Script,
    /// The quota's words of the script's argument: m, offset, fill, the last microsecond of the
    /// lifetime, the lifetime in units (see `bucket.lua`).
    quota_words: [u32; 9],
    on_failure: OnFailure,
    fallback: Option<KeyedLimiter<Vec<u8>>>,
}

/// A connection to Redis with what every call through it shares: the timeout, the breaker,
/// the counts, the round-trip histogram.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) conn: Conn,
    pub(crate) timeout: Duration,
    pub(crate) breaker: Breaker,
    pub(crate) counters: Counters,
    /// What answers when Redis cannot, for the breaker's log lines.
    policy: String,
    /// The `limiter` label of the round-trip histogram, when asked for
    /// ([`Builder::round_trip_histogram`]).
    #[cfg(feature = "metrics")]
    histogram: Option<metrics::SharedString>,
}

/// Where Redis is and how long to wait for it: what [`Link::connect`] needs.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) timeout: Duration,
    pub(crate) breaker_threshold: u32,
    pub(crate) breaker_cooldown: Duration,
}

impl Link {
    /// Connects (within the timeout) and asks one `PING`, so that a refused connection or
    /// missing credentials show at startup, not at the first request.
    pub(crate) async fn connect(target: &Target, policy: String) -> Result<Link, Error> {
        let bad_url =
            |url: &str, e: redis::RedisError| Error::Url { url: redact(url), reason: e.to_string() };
        let timeout = target.timeout;
        let conn = if target.cluster {
            let mut nodes = Vec::new();
            for url in &target.urls {
                nodes.push(
                    redis::IntoConnectionInfo::into_connection_info(url.as_str())
                        .map_err(|e| bad_url(url, e))?,
                );
            }
            let client = ClusterClientBuilder::new(nodes)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .map_err(Error::Redis)?;
            let conn = tokio::time::timeout(timeout, client.get_async_connection())
                .await
                .map_err(|_| Error::Timeout { after: timeout })??;
            Conn::Cluster(conn)
        } else {
            let url = target.urls.first().map_or("redis://127.0.0.1:6379", String::as_str);
            let client = redis::Client::open(url).map_err(|e| bad_url(url, e))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                // Reconnect quickly and give up quickly: the breaker paces further attempts.
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(50));
            let conn = tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                .await
                .map_err(|_| Error::Timeout { after: timeout })??;
            Conn::Single(conn)
        };
        // A server that wants credentials it did not get answers a connection with NOAUTH
        // only at the first command: ask one now.
        tokio::time::timeout(timeout, conn.query::<String>(&redis::cmd("PING")))
            .await
            .map_err(|_| Error::Timeout { after: timeout })??;
        Ok(Link {
            conn,
            timeout,
            breaker: Breaker::new(target.breaker_threshold, target.breaker_cooldown),
            counters: Counters::default(),
            policy,
            #[cfg(feature = "metrics")]
            histogram: None,
        })
    }

    /// Whether the connection is to a Cluster (a script's keys must then share a slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs `f` under the breaker and the timeout, counting what happened.
    pub(crate) async fn call<T>(
        &self,
        f: impl core::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Error> {
        let inner = self;
        if let Gate::Open { retry_in } = inner.breaker.enter() {
            Counters::bump(&inner.counters.short_circuited);
            return Err(Error::BreakerOpen { retry_in });
        }
        #[cfg(feature = "metrics")]
        let started = inner.histogram.as_ref().map(|_| std::time::Instant::now());
        let replied = tokio::time::timeout(inner.timeout, f).await;
        #[cfg(feature = "metrics")]
        if let (Some(limiter), Some(started), Ok(_)) = (&inner.histogram, started, &replied) {
            metrics::histogram!("tollgate_redis_round_trip_seconds", "limiter" => limiter.clone())
                .record(started.elapsed());
        }
        let result = match replied {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                Counters::bump(if e.is_timeout() {
                    &inner.counters.timeouts
                } else {
                    &inner.counters.errors
                });
                Err(Error::Redis(e))
            }
            Err(_) => {
                Counters::bump(&inner.counters.timeouts);
                Err(Error::Timeout { after: inner.timeout })
            }
        };
        match &result {
            Err(e) if e.is_transient() => {
                if inner.breaker.failure() {
                    Counters::bump(&inner.counters.breaker_trips);
                    tracing::warn!(
                        error = %e,
                        policy = %inner.policy,
                        cooldown_ms = u64::try_from(inner.breaker.cooldown().as_millis()).unwrap_or(u64::MAX),
                        "Redis breaker opened: calls fail fast, answered by the failure policy; one probe a cooldown"
                    );
                }
            }
            // A server that answers (even with an error about one key) is up.
            _ => {
                if inner.breaker.success() {
                    tracing::info!(policy = %inner.policy, "Redis breaker closed: a probe succeeded, decisions go to Redis again");
                }
            }
        }
        result
    }
}

/// Builds a [`RedisLimiter`]: where Redis is, the key prefix, the timeout, the failure policy.
#[derive(Debug)]
pub struct Builder {
    quota: TokenBucket,
    urls: Vec<String>,
    cluster: bool,
    prefix: Vec<u8>,
    timeout: Duration,
    on_failure: OnFailure,
    breaker_threshold: u32,
    breaker_cooldown: Duration,
    fallback_capacity: usize,
    #[cfg(feature = "metrics")]
    histogram: Option<metrics::SharedString>,
}

impl Builder {
    /// One Redis server (`redis://[user:password@]host:port[/db]`, or `rediss://` without TLS
    /// support compiled in: refused). Default `redis://127.0.0.1:6379`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.urls = vec![url.into()];
        self.cluster = false;
        self
    }

    /// A Redis Cluster, from one or more of its nodes' URLs. Keys are spread over the masters
    /// by their hash slot (a `{tag}` in a key pins it, as everywhere in Cluster); `MOVED` and
    /// `ASK` redirections are followed.
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls = nodes.into_iter().map(Into::into).collect();
        self.cluster = true;
        self
    }

    /// Prepended to every key (default `tollgate:`). Limiters that share a prefix share their
    /// buckets, so give each limit its own.
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a call waits for Redis, connecting included (default 100 ms). Beyond it the
    /// call fails with [`Error::Timeout`] and the failure policy decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a decision is when Redis cannot make it (default [`OnFailure::Error`]).
    pub fn on_failure(mut self, policy: OnFailure) -> Self {
        self.on_failure = policy;
        self
    }

    /// The breaker: open after `failures` consecutive transient failures, probe once per
    /// `cooldown` (defaults 3 and 250 ms, so decisions return to Redis within about a quarter
    /// of a second of its return).
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.breaker_threshold = failures;
        self.breaker_cooldown = cooldown;
        self
    }

    /// Keys the local fallback ([`OnFailure::Local`]) can hold (default 65,536).
    pub fn fallback_capacity(mut self, keys: usize) -> Self {
        self.fallback_capacity = keys;
        self
    }

    /// Records each round trip's latency (a successful reply or Redis's error; not a timeout,
    /// which `tollgate_redis_failures_total` counts) as `tollgate_redis_round_trip_seconds`
    /// `{limiter="name"}` on the `metrics` facade's installed recorder, measured around the
    /// call the limiter times out anyway: two clock reads and a histogram sample per round
    /// trip. Off by default.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn round_trip_histogram(mut self, limiter: impl Into<metrics::SharedString>) -> Self {
        self.histogram = Some(limiter.into());
        self
    }

    /// Connects (within the timeout) and returns the limiter. Fails on a bad URL, a quota that
    /// cannot live in Redis, and a server that refuses the connection or the credentials: a
    /// misconfiguration shows at startup, not at the first request.
    pub async fn connect(self) -> Result<RedisLimiter, Error> {
        let quota = self.quota;
        if quota.initial() < quota.burst() {
            return Err(Error::Config(ConfigError::KeyedInitialBelowBurst {
                initial: quota.initial(),
                burst: quota.burst(),
            }));
        }
        let target = Target {
            urls: self.urls,
            cluster: self.cluster,
            timeout: self.timeout,
            breaker_threshold: self.breaker_threshold,
            breaker_cooldown: self.breaker_cooldown,
        };
        #[cfg_attr(not(feature = "metrics"), expect(unused_mut, reason = "set with the histogram"))]
        let mut link = Link::connect(&target, format!("{:?}", self.on_failure)).await?;
        #[cfg(feature = "metrics")]
        {
            link.histogram = self.histogram;
        }
        let fallback = match &self.on_failure {
            OnFailure::Local(q) => {
                Some(KeyedLimiter::<Vec<u8>>::builder(*q).capacity(self.fallback_capacity).build()?)
            }
            _ => None,
        };
        let quota_words = quota_words(&quota);
        Ok(RedisLimiter {
            inner: Arc::new(Inner {
                link,
                quota,
                prefix: self.prefix,
                script: Script::new(BUCKET_LUA),
                quota_words,
                on_failure: self.on_failure,
                fallback,
            }),
        })
    }
}

/// `x` as big-endian 32-bit limbs.
#[expect(clippy::cast_possible_truncation, reason = "the two halves")]
const fn limbs(x: u64) -> [u32; 2] {
    [(x >> 32) as u32, x as u32]
}

/// The quota's fill (burst·t) in units.
fn fill_units(q: &TokenBucket) -> u64 {
    q.burst() * q.units_per_token()
}

/// The quota's nine words of the bucket script's argument: m, the clock's offset, the fill,
/// the last microsecond of its lifetime and the lifetime in units.
pub(crate) fn quota_words(quota: &TokenBucket) -> [u32; 9] {
    let lifetime = quota.lifetime().as_u64();
    let m = quota.units_per_nano();
    let [oh, ol] = limbs(quota.clock_offset_units());
    let [fh, fl] = limbs(fill_units(quota));
    // At most MAX_MICROS, not below it: a replayed instant may be MAX_MICROS itself, and a
    // lifetime beyond it must not stop the clock there (it stopped one microsecond early,
    // so a decision at 2^53 µs after a key's start was taken at the lifetime's end).
    let [th, tl] = limbs((lifetime / 1000).min(MAX_MICROS));
    let [lh, ll] = limbs(lifetime.saturating_mul(m));
    #[expect(clippy::cast_possible_truncation, reason = "m ≤ 64")]
    let words = [m as u32, oh, ol, fh, fl, th, tl, lh, ll];
    words
}

/// The bucket script's 56-byte argument: `n` tokens taken (if `take` and the quota can hold
/// them; else a peek), under the quota of `quota_words`, at `at` if a replay. Returns it, and
/// whether it takes.
pub(crate) fn bucket_arg(
    quota: &TokenBucket,
    quota_words: &[u32; 9],
    n: u64,
    take: bool,
    at: Option<u64>,
) -> ([u8; 56], bool) {
    // `n = 0` and `n > burst` take nothing: a peek, as the local limiter does.
    let takes = take && n.wrapping_sub(1) < quota.burst();
    let cost = if takes { n * quota.units_per_token() } else { 0 };
    let flags = u32::from(takes) | if at.is_some() { 2 } else { 0 };
    let mut words = [0u32; 14];
    words[0] = flags;
    [words[1], words[2]] = limbs(cost);
    words[3..12].copy_from_slice(quota_words);
    [words[12], words[13]] = limbs(at.unwrap_or(0));
    let mut arg = [0u8; 56];
    for (chunk, w) in arg.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    (arg, takes)
}

/// The decision from the bucket script's 20-byte reply: the engine's own, from the stamp and
/// the clock the script decided on, checked against the script's verdict; with the stamp and
/// the clock.
pub(crate) fn read_bucket_reply(
    quota: &TokenBucket,
    full: &[u8],
    reply: &[u8],
    n: u64,
    takes: bool,
) -> Result<(Decision, u64, u64), Error> {
    let corrupt = |reason: String| Error::Corrupt { key: String::from_utf8_lossy(full).into_owned(), reason };
    let Ok(words) = <[u8; 20]>::try_from(reply) else {
        return Err(corrupt(format!("the script replied {} bytes, not 20", reply.len())));
    };
    let word = |i: usize| {
        u64::from(u32::from_be_bytes([words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]]))
    };
    let taken = word(0);
    let stamp = word(1) << 32 | word(2);
    let now = word(3) << 32 | word(4);
    if taken > 1 {
        return Err(corrupt(format!("the script replied {taken} for taken (0 or 1)")));
    }
    let decided = if takes {
        quota.decide_stored(stamp, now, n)
    } else {
        quota.peek_stored(stamp, now, n).map(|d| (d, None))
    };
    let Some((decision, next)) = decided else {
        return Err(corrupt(format!("the bucket clock {now} is below the fill")));
    };
    if next.is_some() != (taken == 1) {
        return Err(corrupt(format!(
            "the script {} the tokens but the engine {} (stamp {stamp}, clock {now})",
            if taken == 1 { "took" } else { "did not take" },
            if next.is_some() { "would take them" } else { "would not" },
        )));
    }
    Ok((decision, stamp, now))
}

impl RedisLimiter {
    /// A builder for a limiter of `quota` per key. The quota must start full
    /// (`initial == burst`): an idle key expires from Redis once its bucket is full again, and
    /// comes back full.
    pub fn builder(quota: TokenBucket) -> Builder {
        Builder {
            quota,
            urls: Vec::new(),
            cluster: false,
            prefix: b"tollgate:".to_vec(),
            timeout: Duration::from_millis(100),
            on_failure: OnFailure::Error,
            breaker_threshold: 3,
            breaker_cooldown: Duration::from_millis(250),
            fallback_capacity: 1 << 16,
            #[cfg(feature = "metrics")]
            histogram: None,
        }
    }

    /// The quota every key gets.
    pub fn quota(&self) -> &TokenBucket {
        &self.inner.quota
    }

    /// What the limiter did so far, by path and by cause.
    pub fn stats(&self) -> Stats {
        self.inner.link.counters.snapshot()
    }

    /// Writes the limiter's counts and breaker state to the current `metrics` recorder, as
    /// absolute values labelled `limiter="name"` (feature `metrics`; call it before each
    /// scrape): `tollgate_redis_decisions_total{path}` (`redis`, `error`, `deny`, `allow`,
    /// `local`: who decided, Redis or the failure policy), `tollgate_redis_failures_total{cause}`
    /// (`timeout`, `error`, `short_circuited`), `tollgate_redis_breaker_trips_total` and
    /// `tollgate_redis_breaker_open` (1 while open).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn report_metrics(&self, name: &str) {
        use metrics::{counter, gauge};
        let s = self.stats();
        let limiter = name.to_owned();
        for (path, n) in [
            ("redis", s.redis),
            ("error", s.failed_error),
            ("deny", s.failed_deny),
            ("allow", s.failed_allow),
            ("local", s.local),
        ] {
            counter!("tollgate_redis_decisions_total", "limiter" => limiter.clone(), "path" => path)
                .absolute(n);
        }
        for (cause, n) in
            [("timeout", s.timeouts), ("error", s.errors), ("short_circuited", s.short_circuited)]
        {
            counter!("tollgate_redis_failures_total", "limiter" => limiter.clone(), "cause" => cause)
                .absolute(n);
        }
        counter!("tollgate_redis_breaker_trips_total", "limiter" => limiter.clone())
            .absolute(s.breaker_trips);
        let open = self.inner.link.breaker.remaining() > Duration::ZERO;
        gauge!("tollgate_redis_breaker_open", "limiter" => limiter).set(if open { 1.0 } else { 0.0 });
    }

    /// One token for `key`: [`check_n`](RedisLimiter::check_n) with `n = 1`.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        self.check_n(key, 1).await
    }

    /// `n` tokens for `key`, decided by Redis on its clock, as a local
    /// [`Limiter::check_n`](tollgate::Limiter::check_n) would decide at that instant:
    /// `n = 0` and `n > burst` take nothing (the latter is `Insufficient`).
    ///
    /// On a transient failure the [`OnFailure`] policy answers; `Err` under
    /// [`OnFailure::Error`], and for failures no policy can paper over (a key holding
    /// something else, a corrupt value).
    pub async fn check_n(&self, key: impl AsRef<[u8]>, n: u64) -> Result<Decision, Error> {
        self.decide(key.as_ref(), n, true, None).await
    }

    /// What `n` tokens for `key` would get now, taking nothing.
    pub async fn peek_n(&self, key: impl AsRef<[u8]>, n: u64) -> Result<Decision, Error> {
        self.decide(key.as_ref(), n, false, None).await
    }

    /// [`check_n`](RedisLimiter::check_n) as if the server's clock read `micros` (microseconds
    /// since the Unix epoch): for replaying a recorded schedule and for tests that compare
    /// Redis with the local engine instant by instant. Limiters deciding live requests use
    /// the server's clock, never a client's. A key written at a replayed instant gets no
    /// expiry (the replayed clock has no relation to the server's): never mix replays and
    /// live decisions on one key.
    #[doc(hidden)]
    pub async fn check_n_at_server_time(
        &self,
        key: impl AsRef<[u8]>,
        n: u64,
        micros: u64,
    ) -> Result<Decision, Error> {
        self.decide(key.as_ref(), n, true, Some(micros)).await
    }

    /// [`peek_n`](RedisLimiter::peek_n) as if the server's clock read `micros`.
    #[doc(hidden)]
    pub async fn peek_n_at_server_time(
        &self,
        key: impl AsRef<[u8]>,
        n: u64,
        micros: u64,
    ) -> Result<Decision, Error> {
        self.decide(key.as_ref(), n, false, Some(micros)).await
    }

    /// The server's clock (`TIME`), in microseconds since the Unix epoch. On a Cluster, the
    /// clock of whichever node answers: Redis does not synchronize its nodes' clocks, and each
    /// key is decided on the clock of the master that holds it.
    pub async fn server_time(&self) -> Result<u64, Error> {
        let link = &self.inner.link;
        let (secs, micros): (u64, u64) = link.call(link.conn.query(&redis::cmd("TIME"))).await?;
        secs.checked_mul(1_000_000).and_then(|us| us.checked_add(micros)).ok_or_else(|| Error::Corrupt {
            key: String::new(),
            reason: format!("TIME replied {secs} s and {micros} µs, beyond a u64 of microseconds"),
        })
    }

    async fn decide(&self, key: &[u8], n: u64, take: bool, at: Option<u64>) -> Result<Decision, Error> {
        Ok(self.decide_raw(key, n, take, at, n).await?.decision())
    }

    /// `e`, counted as a call that returned an error.
    fn failed(&self, e: Error) -> Error {
        Counters::bump(&self.inner.link.counters.failed_error);
        e
    }

    /// A decision, and where Redis made it, the state it was made on. When Redis cannot
    /// decide, the failure policy answers for `policy_n` tokens (a lease asks Redis for more
    /// than the request that needs it).
    pub(crate) async fn decide_raw(
        &self,
        key: &[u8],
        n: u64,
        take: bool,
        at: Option<u64>,
        policy_n: u64,
    ) -> Result<Answer, Error> {
        let inner = &*self.inner;
        if let Some(micros) = at.filter(|&m| m > MAX_MICROS) {
            return Err(self.failed(Error::TimeOutOfRange { micros }));
        }
        let mut full = Vec::with_capacity(inner.prefix.len() + key.len());
        full.extend_from_slice(&inner.prefix);
        full.extend_from_slice(key);
        // The script's one argument: flags, cost, the quota's words, the replayed instant.
        let (arg, takes) = bucket_arg(&inner.quota, &inner.quota_words, n, take, at);
        let mut invocation = inner.script.key(full.as_slice());
        invocation.arg(&arg[..]);
        let reply = match inner.link.call(inner.link.conn.invoke(&invocation)).await {
            Ok(reply) => reply,
            Err(e) => {
                return self.on_failure(key, policy_n, take, corrupt_value(&full, e)).map(Answer::Policy)
            }
        };
        let (decision, stamp, now) =
            read_bucket_reply(&inner.quota, &full, &reply, n, takes).map_err(|e| self.failed(e))?;
        Counters::bump(&inner.link.counters.redis);
        Ok(Answer::Redis { decision, stamp, now })
    }

    /// A transient failure, answered by the policy; any other failure is returned.
    fn on_failure(&self, key: &[u8], n: u64, take: bool, e: Error) -> Result<Decision, Error> {
        let inner = &*self.inner;
        let c = &inner.link.counters;
        if !e.is_transient() {
            Counters::bump(&c.failed_error);
            return Err(e);
        }
        match (&inner.on_failure, &inner.fallback) {
            (OnFailure::Local(_), Some(local)) => {
                Counters::bump(&c.local);
                Ok(if take { local.check_n(key, n) } else { local.peek_n(key, n) })
            }
            (OnFailure::Error | OnFailure::Local(_), _) => {
                Counters::bump(&c.failed_error);
                Err(e)
            }
            (OnFailure::Deny, _) => {
                Counters::bump(&c.failed_deny);
                let retry = match inner.link.breaker.remaining() {
                    Duration::ZERO => inner.link.timeout,
                    r => r,
                };
                Ok(Decision::denied(0, retry, inner.quota.fill_time().into()))
            }
            (OnFailure::Allow, _) => {
                Counters::bump(&c.failed_allow);
                Ok(Decision::untracked())
            }
        }
    }
}

/// The script's refusal of a value that is not a bucket (`TOLLGATE_CORRUPT`, see
/// [`crate::value`]) as [`Error::Corrupt`] naming the key; any other error as it is.
fn corrupt_value(full: &[u8], e: Error) -> Error {
    match e {
        Error::Redis(e) if e.code() == Some("TOLLGATE_CORRUPT") => Error::Corrupt {
            key: String::from_utf8_lossy(full).into_owned(),
            reason: e.detail().unwrap_or("not a tollgate bucket").to_owned(),
        },
        e => e,
    }
}
