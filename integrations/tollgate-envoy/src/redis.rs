//! The Redis backend: a fleet of service instances sharing every rule's windows through Redis
//! (standalone or Cluster), with one script call per request whatever the number of
//! descriptors (one per hash slot on a Cluster, sent at once), on the server's clock, each
//! decision the engine's `FixedWindow` bit for bit (`tollgate_redis::RedisWindows`).
//!
//! Every algorithm runs on Redis, in the request's one script call, each decision the
//! engine's: upstream's windows (every hit counted), tollgate's fixed windows
//! (`count_rejected_hits: false`, any `unit_multiplier`), sliding windows, token buckets
//! (`token_bucket`, `gcra`: `tollgate_redis`'s bucket, as `RedisLimiter` decides it) and
//! nginx's `limit_req`. Fixed windows are leased by rules with `lease: true`
//! (`tollgate_redis::LeasedWindows`: a hot value's hits taken in batches and spent in the
//! process, never past the window's limit fleet-wide).

use std::fmt;

use tollgate::{Decision, FixedWindow, Nginx, SlidingWindow, TokenBucket};
use tollgate_redis::{
    BucketCheck, Check, LeasedWindows, NginxCheck, RedisWindows, SlidingCheck, WindowCheck,
};

use crate::service::{Code, Limits, Pending, RequestError, Step};

/// What a request gets when Redis cannot answer in time (a timeout, a refused connection,
/// the breaker open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRedisFailure {
    /// The call fails (gRPC `UNAVAILABLE`, HTTP 503): Envoy's `failure_mode_deny` decides, as
    /// with upstream when its Redis is down.
    #[default]
    Error,
    /// Every limited descriptor is answered OK (fail open).
    Allow,
    /// Every limited descriptor is answered OVER_LIMIT (fail closed).
    Deny,
    /// The embedded tables decide, each instance alone (a fleet of N admits up to N times the
    /// limit while Redis is away).
    Local,
}

impl OnRedisFailure {
    /// The policy of name `name` (`error`, `allow`, `deny`, `local`).
    pub fn parse(name: &str) -> Option<OnRedisFailure> {
        Some(match name {
            "error" => OnRedisFailure::Error,
            "allow" => OnRedisFailure::Allow,
            "deny" => OnRedisFailure::Deny,
            "local" => OnRedisFailure::Local,
            _ => return None,
        })
    }
}

/// Redis, and what answers when it cannot.
#[derive(Clone)]
pub struct RedisBackend {
    windows: std::sync::Arc<LeasedWindows>,
    on_failure: OnRedisFailure,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend").field("on_failure", &self.on_failure).finish_non_exhaustive()
    }
}

/// How a request's limited descriptors were decided on the Redis backend.
pub(crate) enum Decided {
    /// Each one's decision (`None`: a limit of 0).
    Each(Vec<Option<Decision>>),
    /// Redis could not answer; every limited descriptor gets this code.
    Failed(Code),
}

impl RedisBackend {
    /// Decisions through `windows` (its prefix keeps the service's keys apart), and
    /// `on_failure` when Redis cannot make them.
    /// Rules with `lease: true` lease their hot values' hits (leases live at most 50 ms, and
    /// never past their window).
    pub fn new(windows: RedisWindows, on_failure: OnRedisFailure) -> RedisBackend {
        RedisBackend::with_leases(LeasedWindows::new(windows), on_failure)
    }

    /// [`new`](RedisBackend::new) with leases of the caller's making (their TTL, their
    /// number).
    pub fn with_leases(windows: LeasedWindows, on_failure: OnRedisFailure) -> RedisBackend {
        RedisBackend { windows: std::sync::Arc::new(windows), on_failure }
    }

    /// What the calls did so far (`redis`: script calls).
    pub fn stats(&self) -> tollgate_redis::Stats {
        self.windows.windows().stats()
    }

    /// What the leases did so far.
    pub fn lease_stats(&self) -> tollgate_redis::LeaseStats {
        self.windows.stats()
    }

    /// The policy.
    pub fn on_failure(&self) -> OnRedisFailure {
        self.on_failure
    }

    /// Every step's decision, in as few batches as its keys allow (one, unless two
    /// descriptors of the request share a counter), or the failure policy's.
    pub(crate) async fn decide(
        &self,
        limits: &Limits,
        steps: &[Step<'_>],
        now_ns: u64,
    ) -> Result<Decided, RequestError> {
        let mut decisions: Vec<Option<Decision>> = vec![None; steps.len()];
        // (step, Redis key, limit), for the steps with a limit above 0.
        let mut wanted = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let Some(p) = step.pending().filter(|p| p.limit.requests_per_unit > 0) else { continue };
            let limit = limit_of(p);
            wanted.push((i, redis_key(p, &limit), limit));
        }
        // Rounds in which no key repeats: a key named twice is decided twice, in order.
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        for (w, (_, key, ..)) in wanted.iter().enumerate() {
            match rounds.iter_mut().find(|r| r.iter().all(|&o| wanted[o].1 != *key)) {
                Some(round) => round.push(w),
                None => rounds.push(vec![w]),
            }
        }
        for round in rounds {
            let checks: Vec<Check<'_>> = round
                .iter()
                .map(|&w| {
                    let key = wanted[w].1.as_bytes();
                    match wanted[w].2 {
                        Limit::Window { window, n, up_to } => {
                            Check::Window(WindowCheck { key, window, n, up_to })
                        }
                        Limit::Bucket { quota, n } => Check::Bucket(BucketCheck { key, quota, n }),
                        Limit::Sliding { window, n } => Check::Sliding(SlidingCheck { key, window, n }),
                        Limit::Nginx { limit, n } => Check::Nginx(NginxCheck { key, limit, n }),
                    }
                })
                .collect();
            match self.windows.decide_all(&checks).await {
                Ok(got) => {
                    for (&w, d) in round.iter().zip(got) {
                        decisions[wanted[w].0] = Some(d);
                    }
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(error = %e, policy = ?self.on_failure, "Redis did not decide a request");
                    return match self.on_failure {
                        OnRedisFailure::Error => Err(RequestError::Unavailable(e.to_string())),
                        OnRedisFailure::Allow => Ok(Decided::Failed(Code::Ok)),
                        OnRedisFailure::Deny => Ok(Decided::Failed(Code::OverLimit)),
                        OnRedisFailure::Local => Ok(Decided::Each(
                            steps
                                .iter()
                                .map(|s| s.pending().and_then(|p| limits.decide_local(p, now_ns)))
                                .collect(),
                        )),
                    };
                }
                Err(e) => return Err(RequestError::Unavailable(e.to_string())),
            }
        }
        Ok(Decided::Each(decisions))
    }
}

/// What a step is decided under on Redis.
#[derive(Clone, Copy)]
enum Limit {
    /// A window and its units (upstream's counts every hit up to the largest count; tollgate's
    /// has the rule's limit), and its largest lease.
    Window { window: FixedWindow, n: u64, up_to: u64 },
    /// A token bucket and its tokens.
    Bucket { quota: TokenBucket, n: u64 },
    /// A sliding window and its units.
    Sliding { window: SlidingWindow, n: u64 },
    /// nginx's `limit_req` and its requests.
    Nginx { limit: Nginx, n: u64 },
}

fn limit_of(p: &Pending<'_>) -> Limit {
    let spec = p.table.spec();
    const MADE: &str = "every rule's limit was made once when the configuration was loaded";
    match spec.algorithm() {
        crate::Algorithm::TokenBucket => {
            return Limit::Bucket { quota: spec.bucket().expect(MADE), n: p.hits }
        }
        crate::Algorithm::SlidingWindow => {
            return Limit::Sliding { window: spec.sliding().expect(MADE), n: p.hits }
        }
        crate::Algorithm::Nginx => return Limit::Nginx { limit: spec.nginx().expect(MADE), n: p.hits },
        _ => {}
    }
    Limit::Window { window: spec.fixed_window().expect(MADE), n: p.units(), up_to: p.table.max_lease() }
}

/// A step's Redis key (after the backend's prefix): the table (rule or per-request limits),
/// the window and its kind (or `bucket`, `nginx`), and upstream's cache key. A fixed window's
/// kind names its word's layout, whose count's width depends on the limit: `c32` for
/// upstream's counted windows (32 bits), `u` for tollgate's of a limit up to 2^24 − 1 and
/// `u<bits>` above, so that a reload moving a limit across widths starts a new key instead of
/// reading the old one's word under another layout.
fn redis_key(p: &Pending<'_>, limit: &Limit) -> String {
    let (name, window) = (p.table.name(), p.table.spec().window);
    match limit {
        Limit::Bucket { .. } => format!("{name}|bucket|{}", p.key),
        Limit::Nginx { .. } => format!("{name}|nginx|{}", p.key),
        Limit::Sliding { .. } => format!("{name}|{window}s|s|{}", p.key),
        Limit::Window { window: w, .. } => match (p.table.spec().counted(), w.count_bits()) {
            (true, bits) => format!("{name}|{window}s|c{bits}|{}", p.key),
            (false, 24) => format!("{name}|{window}s|u|{}", p.key),
            (false, bits) => format!("{name}|{window}s|u{bits}|{}", p.key),
        },
    }
}
