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

#![warn(missing_docs)]

mod forwarded;
mod key;
mod limit;

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
use http_body_util::{Either, Full};
use tollgate::{Decision, Outcome, Receipt};
use tower::{Layer, Service};

pub use key::{
    BadNetwork, ClientIp, ForwardedHeader, HeaderKey, KeyError, KeyExtractor, PathKey, PeerAddr, PeerIp,
};
pub use limit::{HeaderQuota, Limit};

/// Which header forms the layer writes. Several may be on at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// IETF draft-10 `RateLimit` and `RateLimit-Policy` (structured fields).
    pub ietf: bool,
    /// draft-03 `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (Envoy's default).
    pub draft03: bool,
    /// The de-facto `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub x_ratelimit: bool,
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
        RateLimitLayer {
            config: Arc::new(Config {
                limits: limits.into_iter().collect(),
                headers: Headers::default(),
                dry_run: false,
                problem: true,
                delays: Delays::default(),
                insufficient: StatusCode::TOO_MANY_REQUESTS,
                key_error: StatusCode::BAD_REQUEST,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> RateLimitLayer {
        f(Arc::make_mut(&mut self.config));
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

/// The response body: the inner service's, or the layer's own (a refusal's problem details).
pub type Body<B> = Either<B, Full<Bytes>>;

/// One limit's answer for a request.
struct Answer<'a> {
    limit: &'a Limit,
    decision: Decision,
    /// The wait for one more unit once none is left (for `RateLimit`'s `t`), when admitted.
    next: Option<Duration>,
}

/// What the layer decided.
enum Verdict {
    /// Call the inner service (after `delay`), then add `headers`.
    Serve { headers: HeaderMap, delay: Duration },
    /// Answer with this response.
    Refuse(Response<Full<Bytes>>),
}

impl Config {
    fn decide(&self, req: &Parts) -> Verdict {
        let mut answers: Vec<Answer<'_>> = Vec::with_capacity(self.limits.len());
        let mut receipts: Vec<(&Limit, Receipt)> = Vec::new();
        let mut refused: Option<Answer<'_>> = None;
        for limit in self.limits.iter().filter(|l| l.applies(req)) {
            let n = limit.cost_of(req);
            let (decision, receipt) = match limit.limit.charge(req, n) {
                Ok(charged) => charged,
                Err(e) => {
                    refund(req, receipts);
                    return Verdict::Refuse(self.key_error(&e));
                }
            };
            if let Some(r) = receipt {
                receipts.push((limit, r));
            }
            let admitted = decision.is_allowed()
                && !(decision.outcome() == Outcome::Delayed && self.delays == Delays::Refuse);
            if !admitted {
                refused = Some(Answer { limit, decision, next: None });
                break;
            }
            answers.push(Answer { limit, decision, next: None });
        }
        if let Some(refused) = refused {
            if !self.dry_run {
                refund(req, receipts);
                return Verdict::Refuse(self.refusal(req, &refused, &answers));
            }
            let headers = self.headers(req, &refused, &answers, Some(&refused));
            return Verdict::Serve { headers, delay: Duration::ZERO };
        }
        let delay = if self.dry_run {
            Duration::ZERO
        } else {
            answers.iter().map(|a| a.decision.delay()).max().unwrap_or_default()
        };
        let headers = match closest(&answers) {
            Some(i) => {
                let mut described =
                    Answer { limit: answers[i].limit, decision: answers[i].decision, next: None };
                if described.decision.remaining() == 0 && self.headers.ietf {
                    described.next = described.limit.limit.peek(req, 1).ok().and_then(|d| d.retry_after());
                }
                self.headers(req, &described, &answers, None)
            }
            None => HeaderMap::new(),
        };
        Verdict::Serve { headers, delay }
    }

    /// The headers describing `described` (and listing every limit answered), for a response.
    fn headers(
        &self,
        req: &Parts,
        described: &Answer<'_>,
        answers: &[Answer<'_>],
        refused: Option<&Answer<'_>>,
    ) -> HeaderMap {
        let mut h = HeaderMap::new();
        let d = &described.decision;
        let remaining = d.remaining();
        let reset = ceil_seconds(d.reset_after());
        // Seconds until more quota is available: the refusal's wait, or the next unit's once
        // none is left; none while units remain.
        let t = match d.outcome() {
            Outcome::Allowed | Outcome::Untracked => described.next.map(ceil_seconds),
            Outcome::Delayed => Some(ceil_seconds(d.delay())),
            _ => d.retry_after().map(ceil_seconds),
        };
        if self.headers.ietf {
            let mut policy = String::new();
            for a in answers.iter().chain(refused) {
                if !policy.is_empty() {
                    policy.push_str(", ");
                }
                let (q, w) = a.limit.quota_for(req);
                policy.push_str(&format!("{};q={q};w={}", sf_string(&a.limit.name), w.as_secs()));
            }
            let mut rl = format!("{};r={remaining}", sf_string(&described.limit.name));
            if let Some(t) = t {
                rl.push_str(&format!(";t={t}"));
            }
            insert(&mut h, "ratelimit-policy", policy);
            insert(&mut h, "ratelimit", rl);
        }
        for (on, prefix) in [(self.headers.draft03, "ratelimit"), (self.headers.x_ratelimit, "x-ratelimit")] {
            if on {
                insert(&mut h, &format!("{prefix}-limit"), described.limit.quota_for(req).0.to_string());
                insert(&mut h, &format!("{prefix}-remaining"), remaining.to_string());
                insert(&mut h, &format!("{prefix}-reset"), reset.to_string());
            }
        }
        h
    }

    /// The answer to a refused request.
    fn refusal(&self, req: &Parts, refused: &Answer<'_>, answers: &[Answer<'_>]) -> Response<Full<Bytes>> {
        let d = &refused.decision;
        let name = &refused.limit.name;
        let (status, problem, detail, retry) = match d.outcome() {
            Outcome::Insufficient => (
                self.insufficient,
                QUOTA_EXCEEDED,
                format!("the request costs more than the limit \"{name}\" ever admits at once: retrying will not help"),
                None,
            ),
            Outcome::TableFull => (
                StatusCode::SERVICE_UNAVAILABLE,
                REDUCED_CAPACITY,
                format!("the limit \"{name}\" tracks as many clients as it can hold: try again later"),
                None,
            ),
            Outcome::Delayed => (
                StatusCode::TOO_MANY_REQUESTS,
                QUOTA_EXCEEDED,
                format!("the limit \"{name}\" would delay this request; it is configured to refuse instead"),
                Some(d.delay()),
            ),
            _ => (
                StatusCode::TOO_MANY_REQUESTS,
                QUOTA_EXCEEDED,
                format!("the limit \"{name}\" is exhausted for now"),
                d.retry_after(),
            ),
        };
        let mut builder = Response::builder().status(status);
        if let Some(h) = builder.headers_mut() {
            h.extend(self.headers(req, refused, answers, Some(refused)));
            if let Some(wait) = retry {
                h.insert(RETRY_AFTER, HeaderValue::from(ceil_seconds(wait)));
            }
        }
        let body = if self.problem {
            if let Some(h) = builder.headers_mut() {
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            }
            Bytes::from(problem_json(problem, status, &detail, Some(name)))
        } else {
            Bytes::new()
        };
        builder.body(Full::new(body)).unwrap_or_else(|_| plain(status))
    }

    /// The answer to a request a keyed limit found no key in.
    fn key_error(&self, e: &KeyError) -> Response<Full<Bytes>> {
        let status = self.key_error;
        let mut builder = Response::builder().status(status);
        let body = if self.problem {
            if let Some(h) = builder.headers_mut() {
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            }
            Bytes::from(problem_json("about:blank", status, &e.to_string(), None))
        } else {
            Bytes::new()
        };
        builder.body(Full::new(body)).unwrap_or_else(|_| plain(status))
    }
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const REDUCED_CAPACITY: &str = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

fn plain(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn refund(req: &Parts, receipts: Vec<(&Limit, Receipt)>) {
    for (limit, r) in receipts.into_iter().rev() {
        limit.limit.refund(req, r);
    }
}

/// The answer closest to refusing: the fewest units left; of equals, the longest until full.
fn closest(answers: &[Answer<'_>]) -> Option<usize> {
    (0..answers.len()).min_by_key(|&i| {
        let d = &answers[i].decision;
        (d.remaining(), std::cmp::Reverse(d.reset_after()))
    })
}

/// Whole seconds, rounded up: a client that waits this long is never early.
fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn insert(h: &mut HeaderMap, name: &str, value: String) {
    if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
        h.insert(name, value);
    }
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
        Inner { #[pin] future: F, headers: Option<HeaderMap> },
        // The inner service after a delay.
        Delayed { future: BoxFuture<Result<Response<B>, E>>, headers: Option<HeaderMap> },
        // The layer's own answer, until polled.
        Ready { response: Option<Response<Full<Bytes>>> },
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

fn with_headers<B>(mut r: Response<B>, headers: Option<HeaderMap>) -> Response<Body<B>> {
    if let Some(h) = headers {
        r.headers_mut().extend(h);
    }
    r.map(Either::Left)
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Body<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projected::Inner { future, headers } => match future.poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(Ok(with_headers(r, headers.take()))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            Projected::Delayed { future, headers } => match future.as_mut().poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(Ok(with_headers(r, headers.take()))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            Projected::Ready { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r.map(Either::Right))),
                None => Poll::Pending, // polled after completion
            },
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<Body<ResBody>>;
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
                let headers = (!headers.is_empty()).then_some(headers);
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
