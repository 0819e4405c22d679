//! tower middleware for [`tollgate`]: decides every request before the inner service
//! runs, answers a refusal with `429 Too Many Requests`, `Retry-After` (rounded up, never
//! earlier than the limiter's exact wait) and an RFC 9457 problem body, and describes the limits
//! in the IETF `RateLimit` / `RateLimit-Policy` headers (draft 10), the draft-03
//! `RateLimit-Limit/Remaining/Reset` and the de-facto `X-RateLimit-*`, on every response.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::{KeyedLimiter, NginxLimiter, TokenBucket};
//! use tollgate_tower::{ClientIp, HeaderKey, Limit, RateLimitLayer};
//!
//! let per_ip = Arc::new(KeyedLimiter::new("10/s burst=20".parse::<TokenBucket>()?, 100_000)?);
//! let per_key = Arc::new(KeyedLimiter::<String>::new("100/s".parse::<TokenBucket>()?, 10_000)?);
//! let global = Arc::new(NginxLimiter::new("1000r/s burst=200".parse()?));
//! let layer = RateLimitLayer::new([
//!     Limit::keyed("per-ip", per_ip, ClientIp::<64>::new().trust("10.0.0.0/8")?),
//!     Limit::keyed("per-key", per_key, HeaderKey(http::HeaderName::from_static("x-api-key"))),
//!     Limit::direct("global", global), // nginx: over the rate, requests wait (Delayed)
//! ]);
//! // let app = axum::Router::new().route("/", get(handler)).layer(layer);
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A request is charged to every limit that applies to it, in order, all or nothing (as
//! [`tollgate::check_all`]): a refusal by one gives back what the others took. The headers
//! describe the limit closest to refusing (the one that refused, or the one with the fewest
//! units left) and `RateLimit-Policy` lists every limit that applied.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod forwarded;
mod key;
mod limit;

/// The guide: answers, headers, keys and client IPs behind proxies, per-route limits, cost.
pub mod guide {
    #![doc = include_str!("../guide.md")]
}

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use smallvec::SmallVec;
use tollgate::{Decision, Outcome};
use tower::{Layer, Service};

pub use key::{
    BadNetwork, ClientIp, ForwardedHeader, HeaderKey, KeyError, KeyExtractor, PathKey, PathParam,
    PathSegment, PeerAddr, PeerIp,
};
use limit::Taken;
pub use limit::{HeaderQuota, Limit};

/// Which header forms the layer writes. Several may be on at once.
///
/// Each family keeps the meaning its own specification or convention gives its fields, so
/// one response can carry two different times, each right for its readers:
///
/// | field | means | as |
/// |---|---|---|
/// | `RateLimit: "name";r=R;t=T` | `t`: seconds until *more* quota is available (the refusal's wait, or the next unit's once none is left; absent while units remain) | draft-ietf-httpapi-ratelimit-headers-10 |
/// | `RateLimit-Reset` (draft-03) | seconds until the quota is whole again (the bucket full, the window over) | draft-03, Envoy's `DRAFT_VERSION_03` |
/// | `X-RateLimit-Reset` | the same instant: seconds until the quota is whole again, or, with [`ResetForm::UnixSeconds`], that instant as seconds since the Unix epoch | Envoy and most servers (delta seconds); GitHub and X (epoch seconds) |
///
/// Every time is rounded up, so a client that waits it is never early. For a token bucket at
/// 10/min with a burst of 10, one request in: `RateLimit: "l";r=9` (no `t`: units remain)
/// and `X-RateLimit-Reset: 6`; ten in: `r=0;t=6` and `X-RateLimit-Reset: 60`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// IETF draft-10 `RateLimit` and `RateLimit-Policy` (structured fields).
    pub ietf: bool,
    /// draft-03 `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (Envoy's default).
    pub draft03: bool,
    /// The de-facto `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub x_ratelimit: bool,
}

/// How `X-RateLimit-Reset` gives the instant the quota is whole again
/// ([`RateLimitLayer::x_ratelimit_reset`]). The draft-03 `RateLimit-Reset` is always delta
/// seconds, as its draft says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResetForm {
    /// Seconds from now (rounded up): Envoy's, and most servers'.
    #[default]
    DeltaSeconds,
    /// Seconds since the Unix epoch (rounded up), on the server's wall clock: GitHub's and
    /// X's. A client whose clock is off reads it off by as much.
    UnixSeconds,
}

impl Headers {
    /// None: only `Retry-After` on a refusal.
    pub const NONE: Headers = Headers { ietf: false, draft03: false, x_ratelimit: false };
    /// The IETF fields only.
    pub const IETF: Headers = Headers { ietf: true, draft03: false, x_ratelimit: false };
    /// Every form.
    pub const ALL: Headers = Headers { ietf: true, draft03: true, x_ratelimit: true };
}

/// The IETF fields and `X-RateLimit-*`: the standard, and what most clients parse today.
impl Default for Headers {
    fn default() -> Headers {
        Headers { ietf: true, draft03: false, x_ratelimit: true }
    }
}

/// What the layer does with a request a limit admits for later ([`Outcome::Delayed`]: nginx
/// without `nodelay`, a queued bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Delays {
    /// Waits the delay (on tokio's timer), then calls the inner service: nginx's behaviour.
    #[default]
    Wait,
    /// Refuses it, as if denied, with `Retry-After` the delay, and gives its units back.
    Refuse,
}

#[derive(Clone)]
struct Config {
    limits: Vec<Limit>,
    headers: Headers,
    dry_run: bool,
    problem: bool,
    delays: Delays,
    insufficient: StatusCode,
    key_error: StatusCode,
    /// `X-RateLimit-Reset`'s form.
    reset_form: ResetForm,
    /// The application's refusal body ([`RateLimitLayer::refusal_body`]), instead of the
    /// problem details.
    body: Option<RefusalBody>,
    /// What every response of a limit repeats, rendered once (rebuilt by every setter).
    cache: Vec<Cached>,
    /// `RateLimit-Policy` when every limit applies, each as configured.
    policy_all: Option<HeaderValue>,
    /// Whether a limit sends a partition key ([`Limit::partition_key`]): then no value is
    /// the same for every request.
    partitioned: bool,
}

/// A limit's header parts and refusal bodies, rendered once.
#[derive(Clone)]
struct Cached {
    /// `"name";q=Q;w=W`.
    policy_item: String,
    /// `"name";r=`.
    ratelimit_prefix: String,
    /// `Q` (static below 1,024, as every [`number`]: a shared value's clone and drop would
    /// count references on one cache line from every thread).
    limit: HeaderValue,
    /// The problem bodies: denied, insufficient, table full, delayed (refused).
    bodies: [Bytes; 4],
}

impl Config {
    fn new(limits: Vec<Limit>) -> Config {
        let mut c = Config {
            limits,
            headers: Headers::default(),
            dry_run: false,
            problem: true,
            delays: Delays::default(),
            insufficient: StatusCode::TOO_MANY_REQUESTS,
            key_error: StatusCode::BAD_REQUEST,
            reset_form: ResetForm::DeltaSeconds,
            body: None,
            cache: Vec::new(),
            policy_all: None,
            partitioned: false,
        };
        c.render();
        c
    }

    fn render(&mut self) {
        self.cache = self
            .limits
            .iter()
            .map(|l| {
                let name = sf_string(&l.name);
                let body = |kind, status: StatusCode, detail: String| {
                    Bytes::from(problem_json(kind, status, &detail, Some(&l.name)))
                };
                let n = &l.name;
                Cached {
                    policy_item: format!("{name};q={};w={}", l.quota, l.window.as_secs()),
                    ratelimit_prefix: format!("{name};r="),
                    limit: number(l.quota),
                    bodies: [
                        body(QUOTA_EXCEEDED, StatusCode::TOO_MANY_REQUESTS, format!("the limit \"{n}\" is exhausted for now")),
                        body(
                            QUOTA_EXCEEDED,
                            self.insufficient,
                            format!("the request costs more than the limit \"{n}\" ever admits at once: retrying will not help"),
                        ),
                        body(
                            REDUCED_CAPACITY,
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("the limit \"{n}\" tracks as many clients as it can hold: try again later"),
                        ),
                        body(
                            QUOTA_EXCEEDED,
                            StatusCode::TOO_MANY_REQUESTS,
                            format!("the limit \"{n}\" would delay this request; it is configured to refuse instead"),
                        ),
                    ],
                }
            })
            .collect();
        let all: Vec<&str> = self.cache.iter().map(|c| c.policy_item.as_str()).collect();
        self.policy_all = HeaderValue::try_from(all.join(", ")).ok();
        self.partitioned = self.limits.iter().any(|l| l.partition.is_some());
    }
}

/// The [`Layer`]: wraps a service in [`RateLimit`]. Cheap to clone (its configuration is
/// shared).
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl RateLimitLayer {
    /// A layer enforcing `limits`, in order.
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> RateLimitLayer {
        RateLimitLayer { config: Arc::new(Config::new(limits.into_iter().collect())) }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> RateLimitLayer {
        let c = Arc::make_mut(&mut self.config);
        f(c);
        c.render();
        self
    }
    /// Which header forms to write (default: IETF and `X-RateLimit-*`).
    pub fn headers(self, headers: Headers) -> RateLimitLayer {
        self.with(|c| c.headers = headers)
    }

    /// Shadow mode: decide and charge as usual, write the headers, but never refuse or delay a
    /// request (nginx's `limit_req_dry_run`). For trying a limit on live traffic.
    pub fn dry_run(self, on: bool) -> RateLimitLayer {
        self.with(|c| c.dry_run = on)
    }

    /// Whether a refusal carries an RFC 9457 `application/problem+json` body (default: yes).
    pub fn problem_details(self, on: bool) -> RateLimitLayer {
        self.with(|c| c.problem = on)
    }

    /// The body of a limit's refusal, the application's own instead of the problem details:
    /// `body` gets what was refused and gives the `Content-Type` and the bytes. The layer
    /// still sets the status, `Retry-After` and the rate-limit headers. Applies to refusals by
    /// a limit (429, the insufficient status, 503 for a full table), whatever
    /// [`problem_details`](RateLimitLayer::problem_details) says; not to key errors, whose body
    /// stays the problem details (or none, with `problem_details(false)`).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::HeaderValue;
    /// use tollgate_tower::{Limit, RateLimitLayer};
    /// # let limits: Vec<Limit> = Vec::new();
    /// let layer = RateLimitLayer::new(limits).refusal_body(|r| {
    ///     let wait = r.retry_after().map_or(-1, |w| w.as_secs_f64().ceil() as i64);
    ///     let json = format!(r#"{{"error":"rate_limited","limit":"{}","retry_in":{wait}}}"#, r.limit());
    ///     (HeaderValue::from_static("application/json"), Bytes::from(json))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn refusal_body(
        self,
        body: impl Fn(&Refusal<'_>) -> (HeaderValue, Bytes) + Send + Sync + 'static,
    ) -> RateLimitLayer {
        let body: RefusalBody = Arc::new(body);
        self.with(|c| c.body = Some(body))
    }

    /// How `X-RateLimit-Reset` is written (default: [`ResetForm::DeltaSeconds`]); see
    /// [`Headers`] for what every field means.
    pub fn x_ratelimit_reset(self, form: ResetForm) -> RateLimitLayer {
        self.with(|c| c.reset_form = form)
    }

    /// What to do with delayed admissions (default: wait, then serve).
    pub fn delays(self, delays: Delays) -> RateLimitLayer {
        self.with(|c| c.delays = delays)
    }

    /// The status for a request that can never be admitted (its cost exceeds a limit's burst):
    /// 429 without `Retry-After` by default, so that clients do not retry it forever.
    pub fn insufficient_status(self, status: StatusCode) -> RateLimitLayer {
        self.with(|c| c.insufficient = status)
    }

    /// The status for a request a keyed limit finds no key in (no peer address, a missing API
    /// key header): 400 by default.
    pub fn key_error_status(self, status: StatusCode) -> RateLimitLayer {
        self.with(|c| c.key_error = status)
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("RateLimitLayer")
            .field("limits", &c.limits)
            .field("headers", &c.headers)
            .field("dry_run", &c.dry_run)
            .field("delays", &c.delays)
            .field("refusal_body", &c.body.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit { inner, config: Arc::clone(&self.config) }
    }
}

/// The [`Service`]: decides each request, then calls the inner service or answers for it.
///
/// Its response type is the inner service's: the layer builds its own answers (a refusal's
/// problem details) in the inner body type, from [`Bytes`], which axum's `Body`,
/// `http_body_util::Full<Bytes>` and `String` all convert from.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("limits", &self.config.limits).finish_non_exhaustive()
    }
}

/// One limit's answer for a request.
struct Answer {
    /// The limit's index in the configuration.
    index: usize,
    decision: Decision,
}

/// The headers a response gets, rendered before the inner service runs: the values only (the
/// names are statics). Boxed, and absent under [`Headers::NONE`], so that the future carrying
/// it stays one word larger than the inner service's: a response future is moved several times
/// on its way through a stack, and the five values inline would be 200 bytes more each time.
#[derive(Default)]
struct Out(Option<Box<Rendered>>);

#[derive(Default)]
struct Rendered {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    /// `limit`, `remaining`, `reset`, for the forms in `legacy_forms`.
    legacy: Option<[HeaderValue; 3]>,
    /// draft-03's names, `X-RateLimit-*`'s names.
    legacy_forms: [bool; 2],
    /// `X-RateLimit-Reset` when it differs from `legacy`'s reset ([`ResetForm::UnixSeconds`]).
    x_reset: Option<HeaderValue>,
}

impl Out {
    /// Inserts the headers into `h`, with room reserved for them and for `extra` more the
    /// caller inserts after them (one growth of the map at most).
    ///
    /// Inline, and out of line only when there are headers: under `Headers::NONE` a response
    /// pays one test (callgrind: about 30 instructions fewer than a call).
    #[inline]
    fn write(self, h: &mut HeaderMap, extra: usize) {
        match self.0 {
            Some(out) => Out::write_rendered(*out, h, extra),
            // `Headers::NONE`, or nothing to describe.
            None if extra > 0 => h.reserve(extra),
            None => {}
        }
    }

    #[inline(never)]
    fn write_rendered(out: Rendered, h: &mut HeaderMap, extra: usize) {
        static LEGACY: [[HeaderName; 3]; 2] = [
            [
                HeaderName::from_static("ratelimit-limit"),
                HeaderName::from_static("ratelimit-remaining"),
                HeaderName::from_static("ratelimit-reset"),
            ],
            [
                HeaderName::from_static("x-ratelimit-limit"),
                HeaderName::from_static("x-ratelimit-remaining"),
                HeaderName::from_static("x-ratelimit-reset"),
            ],
        ];
        static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
        static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
        let Rendered { policy, ratelimit, legacy, legacy_forms, x_reset } = out;
        let forms = if legacy.is_some() { legacy_forms.iter().filter(|&&on| on).count() } else { 0 };
        h.reserve(usize::from(policy.is_some()) + usize::from(ratelimit.is_some()) + 3 * forms + extra);
        if let Some(v) = policy {
            h.insert(RATELIMIT_POLICY.clone(), v);
        }
        if let Some(v) = ratelimit {
            h.insert(RATELIMIT.clone(), v);
        }
        if let Some(values) = legacy {
            match legacy_forms {
                [true, true] => {
                    for names in &LEGACY {
                        for (name, value) in names.iter().zip(&values) {
                            h.insert(name.clone(), value.clone());
                        }
                    }
                }
                // One form (the usual): its values moved in, not cloned.
                [draft03, x_ratelimit] if draft03 || x_ratelimit => {
                    for (name, value) in LEGACY[usize::from(x_ratelimit)].iter().zip(values) {
                        h.insert(name.clone(), value);
                    }
                }
                _ => {}
            }
        }
        if let Some(v) = x_reset {
            h.insert(LEGACY[1][2].clone(), v);
        }
    }
}

/// What the layer decided.
enum Verdict {
    /// Call the inner service (after `delay`), then add `headers`.
    Serve { headers: Out, delay: Duration },
    /// Answer with this response.
    Refuse(Response<Bytes>),
}

type RefusalBody = Arc<dyn Fn(&Refusal<'_>) -> (HeaderValue, Bytes) + Send + Sync>;

/// A refusal by one of the layer's limits, for an application's own body
/// ([`RateLimitLayer::refusal_body`]).
#[derive(Debug)]
pub struct Refusal<'a> {
    limit: &'a str,
    outcome: Outcome,
    status: StatusCode,
    retry_after: Option<Duration>,
}

impl Refusal<'_> {
    /// The name of the limit that refused.
    pub fn limit(&self) -> &str {
        self.limit
    }

    /// Why: [`Outcome::Denied`] (not now), [`Outcome::Insufficient`] (never: the request costs
    /// more than the limit admits at once), [`Outcome::TableFull`] (a keyed table with no room
    /// for a new client) or [`Outcome::Delayed`] (a delay the layer refuses, [`Delays::Refuse`]).
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The status the response carries.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The exact wait until the request would be admitted (`Retry-After` is this, rounded up
    /// to whole seconds); `None` when no wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl Config {
    fn decide(&self, req: &Parts) -> Verdict {
        match &self.limits[..] {
            [limit] if self.delays == Delays::Wait => self.decide_one(limit, req),
            _ => self.decide_all(req),
        }
    }

    /// [`decide`](Config::decide) for a layer of one limit that waits out its delays (the
    /// common case): what `decide_all` answers, without the lists it keeps for several limits
    /// (callgrind: about 70 instructions fewer a request). Its one charge is the last, never
    /// given back: a plain check.
    #[inline]
    fn decide_one(&self, limit: &Limit, req: &Parts) -> Verdict {
        if !limit.applies(req) {
            return Verdict::Serve { headers: Out::default(), delay: Duration::ZERO };
        }
        let answer = match limit.limit.check(req, limit.cost_of(req)) {
            Ok(decision) => Answer { index: 0, decision },
            Err(e) => return Verdict::Refuse(self.key_error(&e)),
        };
        // Delays are waited out: every admission is admitted.
        if !answer.decision.is_allowed() {
            let headers = self.headers(req, &answer, None, &[], Some(&answer));
            if self.dry_run {
                return Verdict::Serve { headers, delay: Duration::ZERO };
            }
            return Verdict::Refuse(self.refusal(&answer, headers));
        }
        let delay = if self.dry_run { Duration::ZERO } else { answer.decision.delay() };
        let headers = if self.headers == Headers::NONE {
            Out::default()
        } else {
            self.admitted_headers(req, core::slice::from_ref(&answer))
        };
        Verdict::Serve { headers, delay }
    }

    /// [`decide`](Config::decide) for any layer: each limit that applies in turn, until one
    /// refuses (the charges before it given back).
    fn decide_all(&self, req: &Parts) -> Verdict {
        let mut answers: SmallVec<[Answer; 4]> = SmallVec::new();
        let mut receipts: SmallVec<[(usize, Taken); 4]> = SmallVec::new();
        let mut refused: Option<Answer> = None;
        for (index, limit) in self.limits.iter().enumerate() {
            if !limit.applies(req) {
                continue;
            }
            let n = limit.cost_of(req);
            // The last limit's charge is never given back (nothing after it can refuse the
            // request) unless the layer refuses its delays: a plain check, without the receipt
            // a refund would need.
            let charged = if index + 1 == self.limits.len() && self.delays != Delays::Refuse {
                limit.limit.check(req, n).map(|d| (d, None))
            } else {
                limit.limit.charge(req, n)
            };
            let (decision, receipt) = match charged {
                Ok(charged) => charged,
                Err(e) => {
                    self.refund(req, receipts);
                    return Verdict::Refuse(self.key_error(&e));
                }
            };
            if let Some(r) = receipt {
                receipts.push((index, r));
            }
            let admitted = decision.is_allowed()
                && !(decision.outcome() == Outcome::Delayed && self.delays == Delays::Refuse);
            if !admitted {
                refused = Some(Answer { index, decision });
                break;
            }
            answers.push(Answer { index, decision });
        }
        if let Some(refused) = refused {
            let headers = self.headers(req, &refused, None, &answers, Some(&refused));
            if !self.dry_run {
                self.refund(req, receipts);
                return Verdict::Refuse(self.refusal(&refused, headers));
            }
            return Verdict::Serve { headers, delay: Duration::ZERO };
        }
        let delay = if self.dry_run {
            Duration::ZERO
        } else {
            answers.iter().map(|a| a.decision.delay()).max().unwrap_or_default()
        };
        let headers =
            if self.headers == Headers::NONE { Out::default() } else { self.admitted_headers(req, &answers) };
        Verdict::Serve { headers, delay }
    }

    /// The headers of an admitted request (the layer writes some), describing the limit
    /// closest to refusing among `answers`.
    #[inline]
    fn admitted_headers(&self, req: &Parts, answers: &[Answer]) -> Out {
        match closest(answers) {
            Some(a) => {
                // None left: `t` says when the next unit comes.
                let next = (a.decision.remaining() == 0 && self.headers.ietf)
                    .then(|| self.limits[a.index].limit.peek(req, 1).ok().and_then(|d| d.retry_after()))
                    .flatten();
                self.headers(req, a, next, answers, None)
            }
            None => Out::default(),
        }
    }

    fn refund(&self, req: &Parts, receipts: SmallVec<[(usize, Taken); 4]>) {
        for (index, r) in receipts.into_iter().rev() {
            self.limits[index].limit.refund(req, r);
        }
    }

    /// The headers describing `described` (`next`: the wait for one more unit, once none is
    /// left) and listing every limit answered.
    fn headers(
        &self,
        req: &Parts,
        described: &Answer,
        next: Option<Duration>,
        answers: &[Answer],
        refused: Option<&Answer>,
    ) -> Out {
        if self.headers == Headers::NONE {
            return Out::default();
        }
        let mut h = Box::<Rendered>::default();
        let d = &described.decision;
        let remaining = d.remaining();
        let cached = &self.cache[described.index];
        // Seconds until more quota is available: the refusal's wait (or delay), or the next
        // unit's once none is left; none while units remain.
        let t = match d.outcome() {
            Outcome::Allowed | Outcome::Untracked => next.map(ceil_seconds),
            _ => d.wait().map(ceil_seconds),
        };
        let mut described_quota = None;
        if self.headers.ietf {
            // The described limit's partition key, asked for once for both fields.
            let pk = if self.partitioned { self.limits[described.index].pk_param(req) } else { None };
            let (policy, q) = self.policy_and_quota(req, described, answers, refused, pk.as_deref());
            described_quota = q;
            // Exactly as long as the value: `Bytes` takes a full `Vec` as it is, where one with
            // room to spare costs a second allocation for its shared header.
            let len = cached.ratelimit_prefix.len()
                + decimal_len(remaining)
                + t.map_or(0, |t| 3 + decimal_len(t))
                + pk.as_ref().map_or(0, String::len);
            let mut rl = String::with_capacity(len);
            rl.push_str(&cached.ratelimit_prefix);
            push_decimal(&mut rl, remaining);
            if let Some(t) = t {
                rl.push_str(";t=");
                push_decimal(&mut rl, t);
            }
            if let Some(pk) = pk {
                rl.push_str(&pk);
            }
            debug_assert_eq!(rl.len(), len, "the RateLimit value's length was computed exactly");
            h.policy = Some(policy);
            h.ratelimit = HeaderValue::try_from(rl).ok();
        }
        if !self.headers.draft03 && !self.headers.x_ratelimit {
            return Out(Some(h));
        }
        if !self.headers.ietf {
            described_quota = self.limits[described.index].quota_for(req);
        }
        let limit = match described_quota {
            None => cached.limit.clone(),
            Some((q, _)) => number(q),
        };
        let reset_after = ceil_seconds(d.reset_after());
        if self.headers.x_ratelimit && self.reset_form == ResetForm::UnixSeconds {
            // The instant the quota is whole again, on the wall clock, rounded up.
            let since_epoch =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, ceil_seconds);
            h.x_reset = Some(number(since_epoch.saturating_add(reset_after)));
        }
        h.legacy = Some([limit, number(remaining), number(reset_after)]);
        h.legacy_forms = [self.headers.draft03, self.headers.x_ratelimit];
        Out(Some(h))
    }

    /// The `RateLimit-Policy` value for a request, and the described limit's quota for it
    /// when not the limit's own (a keyed token bucket key's tier). `pk`: the described limit's
    /// partition key, asked for already. The value rendered once serves while every limit
    /// answered as configured, without a partition key.
    fn policy_and_quota(
        &self,
        req: &Parts,
        described: &Answer,
        answers: &[Answer],
        refused: Option<&Answer>,
        pk: Option<&str>,
    ) -> (HeaderValue, Option<(u64, Duration)>) {
        let q = self.limits[described.index].quota_for(req);
        // A key's own tier (it extracts the key again and reads its override); the described
        // limit's is `q`. Asked again while rendering only in a layer of several limits where
        // one has a tier for this key.
        let quota =
            |a: &Answer| if a.index == described.index { q } else { self.limits[a.index].quota_for(req) };
        let every = answers.len() + usize::from(refused.is_some()) == self.limits.len();
        let policy = match &self.policy_all {
            Some(p)
                if every
                    && !self.partitioned
                    && answers.iter().chain(refused).all(|a| quota(a).is_none()) =>
            {
                p.clone()
            }
            _ => {
                let mut v = String::new();
                for a in answers.iter().chain(refused) {
                    if !v.is_empty() {
                        v.push_str(", ");
                    }
                    match quota(a) {
                        None => v.push_str(&self.cache[a.index].policy_item),
                        Some((q, w)) => v.push_str(&format!(
                            "{};q={q};w={}",
                            sf_string(&self.limits[a.index].name),
                            w.as_secs()
                        )),
                    }
                    if a.index == described.index {
                        v.push_str(pk.unwrap_or(""));
                    } else if let Some(pk) = self.limits[a.index].pk_param(req) {
                        v.push_str(&pk);
                    }
                }
                HeaderValue::try_from(v).unwrap_or_else(|_| HeaderValue::from_static(""))
            }
        };
        (policy, q)
    }

    /// The answer to a refused request, with its headers.
    fn refusal(&self, refused: &Answer, headers: Out) -> Response<Bytes> {
        let d = &refused.decision;
        let (status, body) = match d.outcome() {
            Outcome::Insufficient => (self.insufficient, 1),
            Outcome::TableFull => (StatusCode::SERVICE_UNAVAILABLE, 2),
            Outcome::Delayed => (StatusCode::TOO_MANY_REQUESTS, 3),
            _ => (StatusCode::TOO_MANY_REQUESTS, 0),
        };
        #[cfg(feature = "metrics")]
        {
            // Labels from the configuration (the limits' names), never from the request.
            let outcome = ["denied", "insufficient", "table_full", "delayed"][body];
            metrics::counter!(
                "tollgate_http_refusals_total",
                "limit" => self.limits[refused.index].name.clone(),
                "outcome" => outcome,
                "status" => status.as_str().to_owned()
            )
            .increment(1);
        }
        let (content_type, body) = match &self.body {
            Some(f) => {
                let limit = &self.limits[refused.index].name;
                let (t, b) = f(&Refusal { limit, outcome: d.outcome(), status, retry_after: d.wait() });
                (Some(t), b)
            }
            None if self.problem => (
                Some(HeaderValue::from_static("application/problem+json")),
                self.cache[refused.index].bodies[body].clone(),
            ),
            None => (None, Bytes::new()),
        };
        let mut r = Response::new(body);
        *r.status_mut() = status;
        let h = r.headers_mut();
        headers.write(h, usize::from(d.wait().is_some()) + usize::from(content_type.is_some()));
        // The delay or the retry-after; none when waiting does not help.
        if let Some(wait) = d.wait() {
            h.insert(RETRY_AFTER, number(ceil_seconds(wait)));
        }
        if let Some(t) = content_type {
            h.insert(CONTENT_TYPE, t);
        }
        r
    }

    /// The answer to a request a keyed limit found no key in.
    fn key_error(&self, e: &KeyError) -> Response<Bytes> {
        let status = self.key_error;
        let body = if self.problem {
            Bytes::from(problem_json("about:blank", status, &e.to_string(), None))
        } else {
            Bytes::new()
        };
        let mut r = Response::new(body);
        *r.status_mut() = status;
        if self.problem {
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        }
        r
    }
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const REDUCED_CAPACITY: &str = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// The answer closest to refusing: the fewest units left; of equals, the longest until full.
fn closest(answers: &[Answer]) -> Option<&Answer> {
    answers.iter().min_by_key(|a| (a.decision.remaining(), std::cmp::Reverse(a.decision.reset_after())))
}

/// How many small numbers [`SMALL`] holds.
const SMALL_LEN: usize = 1024;
/// The digits of 0 to 1,023, one after another (10 + 90·2 + 900·3 + 24·4 bytes).
const DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 24 * 4;
const DIGITS: [u8; DIGITS_LEN] = {
    let mut out = [0u8; DIGITS_LEN];
    let (mut n, mut at) = (0, 0);
    while n < SMALL_LEN {
        let len = decimal_len(n as u64);
        let (mut i, mut m) = (len, n);
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (m % 10) as u8;
            m /= 10;
        }
        at += len;
        n += 1;
    }
    out
};

/// How many decimal digits `n` has.
const fn decimal_len(n: u64) -> usize {
    match n.checked_ilog10() {
        Some(l) => l as usize + 1,
        None => 1,
    }
}

/// The decimal numbers below 1,024, made at compile time: remaining counts and waits in seconds
/// are mostly these, and a header value over a static string is neither allocated nor
/// reference-counted.
static SMALL: [&str; SMALL_LEN] = {
    let mut out = [""; SMALL_LEN];
    let (mut n, mut rest): (usize, &'static [u8]) = (0, &DIGITS);
    while n < SMALL_LEN {
        let (digits, tail) = rest.split_at(decimal_len(n as u64));
        out[n] = match std::str::from_utf8(digits) {
            Ok(s) => s,
            Err(_) => panic!("digits are ASCII"),
        };
        rest = tail;
        n += 1;
    }
    out
};

fn small_decimal(n: u64) -> Option<&'static str> {
    SMALL.get(usize::try_from(n).ok()?).copied()
}

/// Appends `n` in decimal, without the formatting machinery.
fn push_decimal(s: &mut String, n: u64) {
    if let Some(d) = small_decimal(n) {
        s.push_str(d);
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b"0123456789"[(n % 10) as usize];
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.push_str(std::str::from_utf8(&buf[i..]).unwrap_or("0"));
}

/// `n` as a header value: a static one from [`SMALL`] below 1,024.
fn number(n: u64) -> HeaderValue {
    match small_decimal(n) {
        Some(d) => HeaderValue::from_static(d),
        None => HeaderValue::from(n),
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `s` as an RFC 9651 sf-string: quoted, `"` and `\` escaped, and any character outside
/// printable ASCII (which an sf-string cannot hold) written as `?`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// An RFC 9457 problem object, with the IETF draft's `violated-policies` member.
fn problem_json(kind: &str, status: StatusCode, detail: &str, policy: Option<&str>) -> String {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut s = format!(
        "{{\"type\":{},\"title\":{},\"status\":{},\"detail\":{}",
        json_string(kind),
        json_string(title),
        status.as_u16(),
        json_string(detail)
    );
    if let Some(p) = policy {
        s.push_str(&format!(",\"violated-policies\":[{}]", json_string(p)));
    }
    s.push('}');
    s
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project_lite::pin_project! {
    #[project = Projected]
    enum State<F, B, E> {
        // The inner service's response, with the headers to add.
        Inner { #[pin] future: F, headers: Out },
        // The inner service after a delay.
        Delayed { future: BoxFuture<Result<Response<B>, E>>, headers: Out },
        // The layer's own answer, until polled.
        Ready { response: Option<Response<Bytes>> },
    }
}

pin_project_lite::pin_project! {
    /// The [`RateLimit`] service's future: the inner service's response with the headers
    /// added, or the layer's own answer.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Inner { .. } => "Inner",
            State::Delayed { .. } => "Delayed",
            State::Ready { .. } => "Ready",
        };
        f.debug_tuple("ResponseFuture").field(&state).finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: From<Bytes>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (mut out, headers) = match self.project().state.project() {
            Projected::Inner { future, headers } => (future.poll(cx), headers),
            Projected::Delayed { future, headers } => (future.as_mut().poll(cx), headers),
            Projected::Ready { response } => {
                return match response.take() {
                    Some(r) => Poll::Ready(Ok(r.map(B::from))),
                    None => Poll::Pending, // polled after completion
                };
            }
        };
        if let Poll::Ready(Ok(r)) = &mut out {
            std::mem::take(headers).write(r.headers_mut(), 0);
        }
        out
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        match self.config.decide(&parts) {
            Verdict::Refuse(response) => ResponseFuture { state: State::Ready { response: Some(response) } },
            Verdict::Serve { headers, delay } => {
                let req = Request::from_parts(parts, body);
                if delay.is_zero() {
                    return ResponseFuture { state: State::Inner { future: self.inner.call(req), headers } };
                }
                // The service polled ready is the one to call: take it, leave a clone.
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                let future = Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    ready.call(req).await
                });
                ResponseFuture { state: State::Delayed { future, headers } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a verdict answers, as a client would see it: the status (none when served), the
    /// headers, the delay and the body.
    fn seen(v: Verdict) -> (Option<StatusCode>, Vec<(HeaderName, HeaderValue)>, Duration, Bytes) {
        let list = |h: &HeaderMap| h.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        match v {
            Verdict::Serve { headers, delay } => {
                let mut h = HeaderMap::new();
                headers.write(&mut h, 0);
                (None, list(&h), delay, Bytes::new())
            }
            Verdict::Refuse(r) => (Some(r.status()), list(r.headers()), Duration::ZERO, r.into_body()),
        }
    }

    /// A layer of one limit answers what the same limit answers beside a second limit that
    /// never applies: twin layers over twin limiters on one manual clock, given the same
    /// requests at the same instants (a missing key, a key with its own tier, a full table, a
    /// partition key, costs up to more than a burst, a route the limit skips, a described
    /// quota, nginx delays, dry run, every header form), agree on every status, header, delay
    /// and body. The twin's limit is not the last, so it is charged with a receipt rather than
    /// checked, and its policy is rendered per request rather than cached.
    #[test]
    fn a_limit_that_never_applies_changes_nothing() {
        use proptest::prelude::*;
        use tollgate::{KeyedLimiter, ManualClock, Nginx, NginxLimiter, TokenBucket, WhenFull};

        let layer = |kind: u8, clock: &ManualClock, twin: bool| -> RateLimitLayer {
            let limit = match kind {
                0 => {
                    let keys = KeyedLimiter::<String, _>::builder("3/min".parse::<TokenBucket>().unwrap())
                        .tier("gold", "6/min burst=4".parse::<TokenBucket>().unwrap())
                        .capacity(2) // one window of 64 slots: a case's keys fill it
                        .shards(1)
                        .when_full(WhenFull::Deny)
                        .build_with_clock(clock.clone())
                        .unwrap();
                    keys.set_override("k1", keys.tier("gold").unwrap()).unwrap();
                    Limit::keyed(
                        "per-key",
                        Arc::new(keys),
                        crate::HeaderKey(HeaderName::from_static("x-key")),
                    )
                    .partition_key(|p: &Parts| p.headers.get("x-key").map(|v| v.as_bytes().to_vec()))
                }
                1 => Limit::direct(
                    "nginx",
                    Arc::new(NginxLimiter::with_clock(
                        "4r/s burst=3".parse::<Nginx>().unwrap(),
                        clock.clone(),
                    )),
                ),
                _ => Limit::direct(
                    "bucket",
                    Arc::new(tollgate::Limiter::with_clock(
                        "5/s".parse::<TokenBucket>().unwrap(),
                        clock.clone(),
                    )),
                )
                .describe(5, Duration::from_millis(1500)),
            };
            let limit = limit.when(|p: &Parts| p.uri.path() != "/free").cost(|p: &Parts| {
                p.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
            });
            if !twin {
                return RateLimitLayer::new([limit]);
            }
            let never = Limit::direct(
                "never",
                Arc::new(tollgate::Limiter::with_clock("1/h".parse::<TokenBucket>().unwrap(), clock.clone())),
            )
            .when(|_| false);
            RateLimitLayer::new([limit, never])
        };
        let forms = [
            Headers::NONE,
            Headers::default(),
            Headers::ALL,
            Headers { ietf: true, ..Headers::NONE },
            Headers { x_ratelimit: true, ..Headers::NONE },
            Headers { draft03: true, ..Headers::NONE },
        ];
        proptest!(ProptestConfig::with_cases(96), |(
            kind in 0u8..3,
            form in 0usize..6,
            dry_run in any::<bool>(),
            steps in proptest::collection::vec((0u64..200, 0u8..200, 1u64..7, 0u8..8), 1..200),
        )| {
            let (c1, c2) = (ManualClock::new(), ManualClock::new());
            let one = layer(kind, &c1, false).headers(forms[form]).dry_run(dry_run);
            let twin = layer(kind, &c2, true).headers(forms[form]).dry_run(dry_run);
            for (ms, key, cost, path) in steps {
                c1.advance(Duration::from_millis(ms));
                c2.advance(Duration::from_millis(ms));
                let mut b = Request::builder().uri(if path == 0 { "/free" } else { "/" });
                if key < 196 {
                    b = b.header("x-key", format!("k{key}"));
                }
                let (parts, ()) = b.header("x-cost", cost.to_string()).body(()).unwrap().into_parts();
                prop_assert_eq!(seen(one.config.decide(&parts)), seen(twin.config.decide(&parts)));
            }
        });
    }

    #[test]
    fn numbers_render_as_their_decimal_form() {
        let around = |k: u64| k.saturating_sub(3)..=k.saturating_add(3);
        let edges = [0, 9, 10, 99, 100, 999, 1000, 1023, 1024, 65_535, u64::from(u32::MAX), u64::MAX];
        for n in (0..2048).chain(edges.into_iter().flat_map(around)) {
            let mut s = String::from("x=");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x={n}"));
            assert_eq!(number(n).to_str().ok(), Some(n.to_string().as_str()));
        }
    }
}
