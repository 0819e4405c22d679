//! Fixed windows in Redis, any number of them decided in one round trip: what a service that
//! checks several limits per request (Envoy's rate limit service, a request's several keys)
//! needs to pay one round trip whatever the number of limits.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tollgate::{ConfigError, Decision, FixedWindow, Nanos, Nginx, Policy, SlidingWindow, TokenBucket};

use crate::error::Error;
use crate::failure::{Counters, Stats};
use crate::limiter::{bucket_arg, quota_words, read_bucket_reply, Link, Target, MAX_MICROS};

/// The batch script: the bucket's decision (bucket_core.lua) and the batch (windows.lua).
const WINDOWS_LUA: &str = concat!(include_str!("bucket_core.lua"), include_str!("windows.lua"));

/// The bytes of a window check in the script's argument, after its kind.
const CHECK_BYTES: usize = 28;
/// The bytes of a bucket check, after its kind.
const BUCKET_BYTES: usize = 56;
/// Hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// Fixed windows per key, kept in Redis (standalone or Cluster) and shared by every process
/// that uses the same prefix. [`check_all`](RedisWindows::check_all) decides a batch of
/// windows, each with its own key, limit, length and cost, in **one script call** on the
/// server's clock (on a Cluster, one call per hash slot the batch's keys fall in, sent at
/// once). Windows are aligned on multiples of their length since the Unix epoch.
///
/// Each key holds the engine's own [`FixedWindow`] word, and each decision is the engine's:
/// the client decides again, with the engine, on the word the key held and the instant the
/// script read, and checks that the engine would have stored what the script stored (a
/// mismatch is [`Error::Corrupt`]), so a
/// decision equals what a local [`FixedWindow`] table on a clock starting at the Unix epoch
/// answers at that instant, field for field. A key expires when its window ends. The word's
/// layout depends on the limit's count width ([`FixedWindow::count_bits`]: 24 bits up to
/// 2^24 − 1, wider above), which the value's tag records: a key checked with a limit of
/// another width is [`Error::Corrupt`] until it expires, so give each width its own key.
///
/// Cheap to clone. Failures are returned ([`Error::is_transient`] says which a failure
/// policy may answer); the breaker and the timeout bound every call.
#[derive(Clone, Debug)]
pub struct RedisWindows {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    link: Link,
    prefix: Vec<u8>,
    script: Script,
}

/// One window of a batch: `n` units of `key` under `window`.
#[derive(Clone, Copy, Debug)]
pub struct WindowCheck<'a> {
    /// The key, without the prefix.
    pub key: &'a [u8],
    /// The limit, the length (whole microseconds; whole seconds beyond 71 minutes) and whether
    /// refused units count ([`FixedWindow::charging_refusals`]).
    pub window: FixedWindow,
    /// The units asked for (0: a look that changes nothing).
    pub n: u64,
    /// A lease: when the window has `n` units left, take up to `up_to` of them (all it has,
    /// if fewer); at most `n` (0, say): exactly `n`. [`RedisWindows::take_all`] says how
    /// many were taken.
    pub up_to: u64,
}

/// One token bucket of a batch: `n` tokens of `key` under `quota` (which must start full, as
/// [`RedisLimiter`](crate::RedisLimiter)'s). The key holds the same value as a
/// `RedisLimiter`'s: the two can share keys.
#[derive(Clone, Copy, Debug)]
pub struct BucketCheck<'a> {
    /// The key, without the prefix.
    pub key: &'a [u8],
    /// The bucket's rate and burst.
    pub quota: TokenBucket,
    /// The tokens asked for (0, or more than the burst: a look that takes nothing).
    pub n: u64,
}

/// One sliding window of a batch: `n` units of `key` under `window`, windows aligned on
/// multiples of its length since the Unix epoch. Each decision is the engine's
/// [`SlidingWindow`]'s, bit for bit (the client checks the script's write).
#[derive(Clone, Copy, Debug)]
pub struct SlidingCheck<'a> {
    /// The key, without the prefix.
    pub key: &'a [u8],
    /// The limit and the length (whole microseconds; whole seconds beyond 71 minutes).
    pub window: SlidingWindow,
    /// The units asked for (0: a look that changes nothing).
    pub n: u64,
}

/// nginx's `limit_req` on one key of a batch: `n` requests of `key` under `limit`, each
/// decision the engine's [`Nginx`]'s, bit for bit (the client checks the script's write).
#[derive(Clone, Copy, Debug)]
pub struct NginxCheck<'a> {
    /// The key, without the prefix.
    pub key: &'a [u8],
    /// The rate (below 2^50 milli-requests a second), burst and delay.
    pub limit: Nginx,
    /// The requests asked for (0: a look that changes nothing).
    pub n: u64,
}

/// One check of a mixed batch ([`RedisWindows::decide_all`]).
#[derive(Clone, Copy, Debug)]
pub enum Check<'a> {
    /// A fixed window (or a lease of one).
    Window(WindowCheck<'a>),
    /// A token bucket.
    Bucket(BucketCheck<'a>),
    /// A sliding window.
    Sliding(SlidingCheck<'a>),
    /// nginx's `limit_req`.
    Nginx(NginxCheck<'a>),
}

impl Check<'_> {
    /// The key, without the prefix.
    pub fn key(&self) -> &[u8] {
        match self {
            Check::Window(c) => c.key,
            Check::Bucket(c) => c.key,
            Check::Sliding(c) => c.key,
            Check::Nginx(c) => c.key,
        }
    }
}

/// What a check of [`RedisWindows::take_all`] did.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    /// The decision on the units taken (`n` or, for a lease, more): its `remaining` is what
    /// the window has left after them, its reset when the window ends. A refusal took nothing
    /// (unless the window counts refused units).
    pub decision: Decision,
    /// The units taken: 0 when refused, else `n` or, for a lease, up to `up_to`.
    pub units: u64,
}

/// Builds a [`RedisWindows`].
#[derive(Debug)]
pub struct WindowsBuilder {
    target: Target,
    prefix: Vec<u8>,
}

impl WindowsBuilder {
    /// One Redis server (default `redis://127.0.0.1:6379`).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target.urls = vec![url.into()];
        self.target.cluster = false;
        self
    }

    /// A Redis Cluster, from one or more of its nodes' URLs.
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target.urls = nodes.into_iter().map(Into::into).collect();
        self.target.cluster = true;
        self
    }

    /// Prepended to every key (default `tollgate:w:`).
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a call waits for Redis (default 100 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.target.timeout = timeout;
        self
    }

    /// The breaker: open after `failures` consecutive transient failures, probe once per
    /// `cooldown` (defaults 3 and 250 ms).
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.target.breaker_threshold = failures;
        self.target.breaker_cooldown = cooldown;
        self
    }

    /// Connects (within the timeout): a bad URL, a refused connection or missing credentials
    /// show here.
    pub async fn connect(self) -> Result<RedisWindows, Error> {
        let link = Link::connect(&self.target, "the caller's".to_owned()).await?;
        Ok(RedisWindows {
            inner: Arc::new(Inner { link, prefix: self.prefix, script: Script::new(WINDOWS_LUA) }),
        })
    }
}

impl RedisWindows {
    /// A builder, for a server at `redis://127.0.0.1:6379` until told otherwise.
    pub fn builder() -> WindowsBuilder {
        WindowsBuilder {
            target: Target {
                urls: Vec::new(),
                cluster: false,
                timeout: Duration::from_millis(100),
                breaker_threshold: 3,
                breaker_cooldown: Duration::from_millis(250),
            },
            prefix: b"tollgate:w:".to_vec(),
        }
    }

    /// What the calls did so far (`redis`: batches decided; the failures by cause).
    pub fn stats(&self) -> Stats {
        self.inner.link.counters.snapshot()
    }

    /// Decides every check of `checks`, in one script call per hash slot (one in all on a
    /// single server), on the server's clock; the decisions in the checks' order. A batch
    /// naming one key twice, or a window that is not whole microseconds (or whole seconds
    /// beyond 2^32 µs), is refused before anything is sent.
    pub async fn check_all(&self, checks: &[WindowCheck<'_>]) -> Result<Vec<Decision>, Error> {
        Ok(self.take_all(checks).await?.into_iter().map(|t| t.decision).collect())
    }

    /// [`check_all`](RedisWindows::check_all), with what each check took: a lease
    /// ([`WindowCheck::up_to`]) takes all the window has up to `up_to` when it has the `n`
    /// asked for. Each lease is the engine's decision on the units it took, and the most the
    /// window could give: the client checks both.
    pub async fn take_all(&self, checks: &[WindowCheck<'_>]) -> Result<Vec<Taken>, Error> {
        let checks: Vec<Check<'_>> = checks.iter().map(|&c| Check::Window(c)).collect();
        self.decide(&checks, None).await
    }

    /// [`take_all`](RedisWindows::take_all) for windows and token buckets together, in one
    /// script call per hash slot: each bucket decided as
    /// [`RedisLimiter`](crate::RedisLimiter) decides it (the engine's decision on the stamp
    /// the key held, checked against the script's verdict).
    pub async fn decide_all(&self, checks: &[Check<'_>]) -> Result<Vec<Taken>, Error> {
        self.decide(checks, None).await
    }

    /// [`decide_all`](RedisWindows::decide_all) as if the server's clock read `micros`.
    #[doc(hidden)]
    pub async fn decide_all_at_server_time(
        &self,
        checks: &[Check<'_>],
        micros: u64,
    ) -> Result<Vec<Taken>, Error> {
        if micros > MAX_MICROS {
            return Err(Error::TimeOutOfRange { micros });
        }
        self.decide(checks, Some(micros)).await
    }

    /// [`check_all`](RedisWindows::check_all) as if the server's clock read `micros` (µs since
    /// the Unix epoch), for tests that compare Redis with the engine instant by instant. Keys
    /// written so get no expiry: never mix replays and live decisions on one key.
    #[doc(hidden)]
    pub async fn check_all_at_server_time(
        &self,
        checks: &[WindowCheck<'_>],
        micros: u64,
    ) -> Result<Vec<Decision>, Error> {
        Ok(self.take_all_at_server_time(checks, micros).await?.into_iter().map(|t| t.decision).collect())
    }

    /// [`take_all`](RedisWindows::take_all) as if the server's clock read `micros`.
    #[doc(hidden)]
    pub async fn take_all_at_server_time(
        &self,
        checks: &[WindowCheck<'_>],
        micros: u64,
    ) -> Result<Vec<Taken>, Error> {
        let checks: Vec<Check<'_>> = checks.iter().map(|&c| Check::Window(c)).collect();
        self.decide_all_at_server_time(&checks, micros).await
    }

    async fn decide(&self, checks: &[Check<'_>], at: Option<u64>) -> Result<Vec<Taken>, Error> {
        let inner = &*self.inner;
        let keys: Vec<Vec<u8>> = checks.iter().map(|c| [inner.prefix.as_slice(), c.key()].concat()).collect();
        // Each check's kind and words, and for a bucket whether it takes.
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(checks.len());
        let mut takes = vec![false; checks.len()];
        for (i, (c, key)) in checks.iter().zip(&keys).enumerate() {
            let odd_length = |what: &str, window: Duration| {
                Error::Batch {
                reason: format!(
                    "the {what} of {:?} is {window:?}: not whole microseconds up to 2^32 µs, nor whole seconds up to 2^32 s",
                    String::from_utf8_lossy(key)
                ),
            }
            };
            let mut arg = Vec::with_capacity(4 + BUCKET_BYTES);
            match c {
                Check::Window(w) => {
                    arg.extend_from_slice(&1u32.to_be_bytes());
                    arg.extend_from_slice(&encode(w).ok_or_else(|| odd_length("window", w.window.window()))?);
                }
                Check::Sliding(w) => {
                    arg.extend_from_slice(&3u32.to_be_bytes());
                    arg.extend_from_slice(
                        &encode_sliding(w).ok_or_else(|| odd_length("sliding window", w.window.window()))?,
                    );
                }
                Check::Nginx(c) => {
                    let rate = c.limit.millirequests_per_second();
                    if rate >= 1 << 50 {
                        return Err(Error::Batch {
                            reason: format!(
                                "the nginx rate of {:?} is {rate} milli-requests a second: the script takes less than 2^50",
                                String::from_utf8_lossy(key)
                            ),
                        });
                    }
                    let burst = u32::try_from(c.limit.burst_size() * 1000)
                        .expect("nginx's burst is below 2^24 milli-requests");
                    arg.extend_from_slice(&4u32.to_be_bytes());
                    arg.extend_from_slice(&words7([0, burst, 0], rate, c.n));
                }
                Check::Bucket(b) => {
                    if b.quota.initial() < b.quota.burst() {
                        return Err(Error::Config(ConfigError::KeyedInitialBelowBurst {
                            initial: b.quota.initial(),
                            burst: b.quota.burst(),
                        }));
                    }
                    let (words, take) = bucket_arg(&b.quota, &quota_words(&b.quota), b.n, true, at);
                    arg.extend_from_slice(&2u32.to_be_bytes());
                    arg.extend_from_slice(&words);
                    takes[i] = take;
                }
            }
            args.push(arg);
        }
        refuse_repeats(keys.iter().map(Vec::as_slice))?;
        // One call per hash slot on a Cluster (a script's keys must share one); one in all on a
        // single server.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = if inner.link.is_cluster() { slot(key) } else { 0 };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        let calls = groups.iter().map(|(_, members)| {
            let mut invocation = inner.script.prepare_invoke();
            let mut arg = Vec::with_capacity(4 + members.iter().map(|&i| args[i].len()).sum::<usize>());
            arg.extend_from_slice(&u32::from(at.is_some()).to_be_bytes());
            for &i in members {
                invocation.key(keys[i].as_slice());
                arg.extend_from_slice(&args[i]);
            }
            invocation.arg(arg).arg(at.unwrap_or(0));
            async move { inner.link.call(inner.link.conn.invoke(&invocation)).await }
        });
        let replies = futures_util::future::join_all(calls).await;
        let mut decisions = vec![Taken { decision: Decision::untracked(), units: 0 }; checks.len()];
        for ((_, members), reply) in groups.iter().zip(replies) {
            let reply = reply.map_err(|e| corrupt_value(e, members.iter().map(|&i| keys[i].as_slice())))?;
            let first = &keys[members[0]];
            let corrupt =
                |reason: String| Error::Corrupt { key: String::from_utf8_lossy(first).into_owned(), reason };
            let want = 8 + members
                .iter()
                .map(|&i| match checks[i] {
                    Check::Window(_) => 16,
                    Check::Bucket(_) => 20,
                    Check::Sliding(_) => 32,
                    Check::Nginx(_) => 24,
                })
                .sum::<usize>();
            if reply.len() != want {
                return Err(corrupt(format!(
                    "the script replied {} bytes for {} checks, not {want}",
                    reply.len(),
                    members.len()
                )));
            }
            let word = |at: usize| u64::from_be_bytes(reply[at..at + 8].try_into().expect("8 bytes"));
            let now_us = word(0);
            let mut pos = 8;
            for &i in members {
                let c = match checks[i] {
                    Check::Window(c) => c,
                    Check::Bucket(b) => {
                        let (decision, ..) =
                            read_bucket_reply(&b.quota, &keys[i], &reply[pos..pos + 20], b.n, takes[i])?;
                        let units = if takes[i] && decision.is_allowed() { b.n } else { 0 };
                        decisions[i] = Taken { decision, units };
                        pos += 20;
                        continue;
                    }
                    Check::Sliding(w) => {
                        decisions[i] = read_sliding(&w, &keys[i], &reply[pos..pos + 32], now_us)?;
                        pos += 32;
                        continue;
                    }
                    Check::Nginx(c) => {
                        decisions[i] = read_nginx(&c, &keys[i], &reply[pos..pos + 24], now_us)?;
                        pos += 24;
                        continue;
                    }
                };
                let (held, written) = (word(pos), word(pos + 8));
                pos += 16;
                let now = Nanos::new(now_us.saturating_mul(1000));
                let (mut next, mut decision) = c.window.decide(held, now, c.n);
                let mut units = if decision.is_allowed() { c.n } else { 0 };
                let mut lease_ok = true;
                if c.up_to > c.n && decision.is_allowed() && c.n > 0 && written != 0 {
                    // A lease: the engine's decision on the units the script took (what it
                    // wrote past the engine's word for `n`), which must be all the window
                    // had, up to `up_to`.
                    let took = written.wrapping_sub(next.unwrap_or(0)).wrapping_add(c.n);
                    (next, decision) = c.window.decide(held, now, took);
                    let most = took == c.up_to || decision.remaining() == 0;
                    lease_ok = took >= c.n && took <= c.up_to && decision.is_allowed() && most;
                    units = took;
                }
                if next.unwrap_or(0) != written || !lease_ok {
                    return Err(Error::Corrupt {
                        key: String::from_utf8_lossy(&keys[i]).into_owned(),
                        reason: format!(
                            "the script wrote {written:#x} on {held:#x} at {now_us} µs, the engine {:#x}",
                            next.unwrap_or(0)
                        ),
                    });
                }
                decisions[i] = Taken { decision, units };
            }
            Counters::bump(&inner.link.counters.redis);
        }
        Ok(decisions)
    }
}

/// Refuses a batch that names one key twice (its checks would see each other's writes, and a
/// leasing caller would wait on its own refill).
pub(crate) fn refuse_repeats<'k>(keys: impl Iterator<Item = &'k [u8]>) -> Result<(), Error> {
    let mut sorted: Vec<&[u8]> = keys.collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::Batch {
            reason: format!("the key {:?} is named twice in one batch", String::from_utf8_lossy(w[0])),
        }),
        None => Ok(()),
    }
}

/// A sliding window's decision from the state the key held and the state the script wrote
/// (32 bytes), checked against the engine's.
fn read_sliding(c: &SlidingCheck<'_>, key: &[u8], reply: &[u8], now_us: u64) -> Result<Taken, Error> {
    let word = |at: usize| u64::from(u32::from_be_bytes(reply[at..at + 4].try_into().expect("4 bytes")));
    let corrupt = |reason: String| Error::Corrupt { key: String::from_utf8_lossy(key).into_owned(), reason };
    let (held, written) =
        ((word(0) << 32 | word(4), word(8), word(12)), (word(16) << 32 | word(20), word(24), word(28)));
    let Some(held_word) = sliding_word(&c.window, held.0, held.1, held.2) else {
        return Err(corrupt(format!("the key holds a sliding window {held:?} beyond the limit's layout")));
    };
    let written_word = sliding_word(&c.window, written.0, written.1, written.2);
    let (next, decision) = c.window.decide(held_word, Nanos::new(now_us.saturating_mul(1000)), c.n);
    if written_word != Some(next.unwrap_or(0)) {
        return Err(corrupt(format!(
            "the script wrote {written:?} on {held:?} at {now_us} µs, the engine {:#x}",
            next.unwrap_or(0)
        )));
    }
    Ok(Taken { decision, units: if next.is_some() { c.n } else { 0 } })
}

/// nginx's decision from the state the key held and the state the script wrote (24 bytes),
/// checked against the engine's on a clock whose origin is the earlier of the key's last
/// request and now (the decision depends on their difference only).
fn read_nginx(c: &NginxCheck<'_>, key: &[u8], reply: &[u8], now_us: u64) -> Result<Taken, Error> {
    /// The engine's layout: the last request's ms in the high 40 bits, the field in the low 24.
    const FIELD_BITS: u32 = 24;
    let word = |at: usize| u64::from(u32::from_be_bytes(reply[at..at + 4].try_into().expect("4 bytes")));
    let corrupt = |reason: String| Error::Corrupt { key: String::from_utf8_lossy(key).into_owned(), reason };
    let (held_last, held_field) = (word(0) << 32 | word(4), word(8));
    let (written_last, written_field) = (word(12) << 32 | word(16), word(20));
    let now_ms = now_us / 1000;
    let origin = held_last.min(now_ms);
    let fits =
        |last: u64, field: u64| last.checked_sub(origin).filter(|&d| d < 1 << 40 && field < 1 << FIELD_BITS);
    let Some(held) = fits(held_last, held_field).map(|d| d << FIELD_BITS | held_field) else {
        return Err(corrupt(format!(
            "the key holds an nginx state ({held_last} ms, {held_field}) beyond the engine's"
        )));
    };
    let elapsed = Nanos::new((now_us - origin * 1000).saturating_mul(1000));
    let (next, decision) = c.limit.decide(held, elapsed, c.n);
    let written = match (written_last, written_field) {
        (0, 0) => Some(0),
        (last, field) => fits(last, field).map(|d| d << FIELD_BITS | field),
    };
    if written != Some(next.unwrap_or(0)) {
        return Err(corrupt(format!(
            "the script wrote ({written_last} ms, {written_field}) on ({held_last} ms, {held_field}) at {now_us} µs, the engine {:#x}",
            next.unwrap_or(0)
        )));
    }
    Ok(Taken { decision, units: if next.is_some() { c.n } else { 0 } })
}

/// A window check's 28 bytes: flags, limit, window, n and up_to (two limbs each); `None` for
/// a window the script cannot take.
fn encode(c: &WindowCheck<'_>) -> Option<[u8; CHECK_BYTES]> {
    let (seconds, length) = length_word(c.window.window())?;
    let flags = u32::from(c.window.charges_refusals()) | if seconds { 4 } else { 0 };
    let limit = u32::try_from(c.window.limit()).ok()?;
    Some(words7([flags, limit, length], c.n, c.up_to.max(c.n)))
}

/// A sliding window check's 28 bytes: flags, limit, window, n and the engine's largest stored
/// index (two limbs each, the index at most 2^53).
fn encode_sliding(c: &SlidingCheck<'_>) -> Option<[u8; CHECK_BYTES]> {
    let (seconds, length) = length_word(c.window.window())?;
    let limit = u32::try_from(c.window.limit()).ok()?;
    Some(words7(
        [if seconds { 4 } else { 0 }, limit, length],
        c.n,
        sliding_layout(&c.window).2.min(MAX_MICROS),
    ))
}

/// A window's length as the script takes it: whole microseconds up to 2^32 − 1 (`false`), or
/// whole seconds up to 2^32 − 1 (`true`).
fn length_word(window: Duration) -> Option<(bool, u32)> {
    let ns = u64::try_from(window.as_nanos()).ok()?;
    let micros = (ns % 1000 == 0).then_some(ns / 1000)?;
    match u32::try_from(micros) {
        Ok(us) if us > 0 => Some((false, us)),
        _ if ns % 1_000_000_000 == 0 => Some((true, u32::try_from(ns / 1_000_000_000).ok()?)),
        _ => None,
    }
}

/// Three words, then `a` and `b` as two limbs each, big-endian.
fn words7(first: [u32; 3], a: u64, b: u64) -> [u8; CHECK_BYTES] {
    let mut out = [0u8; CHECK_BYTES];
    #[expect(clippy::cast_possible_truncation, reason = "the limbs")]
    let words = [first[0], first[1], first[2], (a >> 32) as u32, a as u32, (b >> 32) as u32, b as u32];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// The engine's sliding-window word layout for a window's limit: the bits of each count, their
/// mask, and the largest stored index (src/policies/sliding.rs).
fn sliding_layout(window: &SlidingWindow) -> (u32, u64, u64) {
    let bits = 64 - window.limit().leading_zeros();
    (bits, (1 << bits) - 1, (1 << (64 - 2 * bits)) - 1)
}

/// The engine's word of a sliding window's fields, `None` if they do not fit its layout.
fn sliding_word(window: &SlidingWindow, index: u64, curr: u64, prev: u64) -> Option<u64> {
    let (bits, mask, last) = sliding_layout(window);
    (index <= last && curr <= mask && prev <= mask).then(|| (index << (2 * bits)) | (curr << bits) | prev)
}

/// The Cluster hash slot of `key`: CRC16 (XMODEM) of its `{tag}` if it has a non-empty one,
/// else of all of it, modulo 16,384.
fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter().position(|&b| b == b'}').filter(|&close| close > 0).map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

/// The script's refusal of a value that is not the kind its check decides (`TOLLGATE_CORRUPT`,
/// the key first) as [`Error::Corrupt`] naming that key, the longest of `keys` the message
/// starts with (a key may hold spaces); any other error as it is.
fn corrupt_value<'k>(e: Error, keys: impl Iterator<Item = &'k [u8]>) -> Error {
    match e {
        Error::Redis(e) if e.code() == Some("TOLLGATE_CORRUPT") => {
            let detail = e.detail().unwrap_or("a key is not a tollgate value").to_owned();
            let key = keys
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .filter(|k| detail.strip_prefix(k.as_str()).is_some_and(|rest| rest.starts_with(' ')))
                .max_by_key(String::len)
                .unwrap_or_default();
            Error::Corrupt { key, reason: detail }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_are_redis_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // The first `{` with an empty tag: the whole key is hashed, not `bar`.
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{}{bar}"), crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % 16384);
    }
}
