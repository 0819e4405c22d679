//! The layer in front of a real hyper server on 127.0.0.1 (an ephemeral port), driven by a real
//! HTTP client: status codes, every header's exact value at known instants (manual clocks),
//! `Retry-After` rounding, problem bodies, dry-run, delays, per-route limits, several limits at
//! once, key errors, a full table, and many concurrent clients.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tollgate::{
    KeyedLimiter, Limiter, ManualClock, Nginx, NginxLimiter, Queued, QueuedLimiter, TokenBucket, WhenFull,
};
use tollgate_tower::{Delays, HeaderKey, Headers, Limit, PeerIp, RateLimitLayer, ResetForm};
use tower::{Service, ServiceBuilder, ServiceExt};

async fn hello(_: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

/// Serves `layer` around `hello` on 127.0.0.1, each request carrying its connection's peer
/// address; returns the address. The server stops with the test's runtime.
async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let svc = ServiceBuilder::new().layer(layer.clone()).service_fn(hello);
            let svc = tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer);
                svc.clone().oneshot(req)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc)),
            );
        }
    });
    addr
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

async fn get(c: &HttpClient, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = c.request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    Reply { status, headers, body }
}

fn bucket(spec: &str, clock: &ManualClock) -> Arc<KeyedLimiter<tollgate::IpPrefix, ManualClock>> {
    Arc::new(
        KeyedLimiter::builder(spec.parse::<TokenBucket>().unwrap())
            .capacity(1_000)
            .build_with_clock(clock.clone())
            .unwrap(),
    )
}

/// A bucket per string key (an API key, a route parameter) on `clock`, for 100 keys.
fn by_key(spec: &str, clock: &ManualClock) -> Arc<KeyedLimiter<String, ManualClock>> {
    Arc::new(
        KeyedLimiter::builder(spec.parse::<TokenBucket>().unwrap())
            .capacity(100)
            .build_with_clock(clock.clone())
            .unwrap(),
    )
}

/// A per-IP bucket of 2 per second: every header's value at each step, the refusal's status,
/// `Retry-After`, and its problem body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_at_known_instants() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new([Limit::keyed("per-ip", bucket("2/s", &clock), PeerIp::<64>)])
        .headers(Headers::ALL);
    let (addr, c) = (serve(layer).await, client());

    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "hello");
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-ip";q=2;w=1"#));
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=1"#));
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1")); // full again in 500 ms: rounded up
    assert_eq!(r.header("ratelimit-limit"), Some("2"));
    assert_eq!(r.header("ratelimit-remaining"), Some("1"));
    assert_eq!(r.header("ratelimit-reset"), Some("1"));
    assert_eq!(r.header("retry-after"), None);

    // The last token: none left, and `t` says when the next one comes (500 ms: 1 s).
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=0;t=1"#));

    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=0;t=1"#));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        r.body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"the limit \"per-ip\" is exhausted for now","violated-policies":["per-ip"]}"#
    );

    // 500 ms later one token is back.
    clock.advance(Duration::from_millis(500));
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
}

/// Issue 34: one response said `t=6` and `X-RateLimit-Reset: 60`. Each family keeps its own
/// meaning (see `Headers`), pinned here on one bucket of 10 per minute: draft-10's `t` is the
/// wait for more quota; draft-03's `RateLimit-Reset` and the de-facto `X-RateLimit-Reset` are
/// the time until the quota is whole again, as Envoy writes them, or as GitHub's epoch seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_header_family_keeps_its_meaning() {
    let clock = ManualClock::new();
    let per_ip = bucket("10/min", &clock);
    let layer =
        RateLimitLayer::new([Limit::keyed("l", Arc::clone(&per_ip), PeerIp::<64>)]).headers(Headers::ALL);
    let (addr, c) = (serve(layer).await, client());
    // One in: units remain, so no `t`; the quota is whole again in 6 s.
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.header("ratelimit"), Some(r#""l";r=9"#));
    assert_eq!((r.header("ratelimit-reset"), r.header("x-ratelimit-reset")), (Some("6"), Some("6")));
    for _ in 0..9 {
        get(&c, addr, "/", &[]).await;
    }
    // Ten in: the next unit in 6 s (`t`), the whole quota in 60 s (both resets).
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit"), Some(r#""l";r=0;t=6"#));
    assert_eq!(r.header("retry-after"), Some("6"), "Retry-After is never earlier than t");
    assert_eq!((r.header("ratelimit-reset"), r.header("x-ratelimit-reset")), (Some("60"), Some("60")));

    // GitHub's form: the same instant as seconds since the epoch; draft-03's stays a delta.
    let layer = RateLimitLayer::new([Limit::keyed("l", per_ip, PeerIp::<64>)])
        .headers(Headers::ALL)
        .x_ratelimit_reset(ResetForm::UnixSeconds);
    let addr = serve(layer).await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let r = get(&c, addr, "/", &[]).await;
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let epoch: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((before + 60..=after + 61).contains(&epoch), "{before} {epoch} {after}");
    assert_eq!(r.header("ratelimit-reset"), Some("60"));
    assert_eq!(r.header("ratelimit"), Some(r#""l";r=0;t=6"#));
}

/// `Retry-After` is the exact wait rounded up to whole seconds, never down: 1 per 1.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_rounds_up() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new([Limit::keyed("slow", bucket("2/3s burst=1", &clock), PeerIp::<64>)]);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("2")); // 1.5 s
    clock.advance(Duration::from_millis(1_499));
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.header("retry-after"), Some("1")); // 1 ms: still a whole second
    clock.advance(Duration::from_millis(1));
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
}

/// A request that can never fit (its cost above the burst) gets a distinct answer: no
/// `Retry-After`, a detail that says retrying will not help, a configurable status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_fits_is_told_so() {
    let clock = ManualClock::new();
    let limit = Limit::keyed("per-ip", bucket("10/s", &clock), PeerIp::<64>).cost(|req| {
        if req.uri.path() == "/bulk" {
            11
        } else {
            1
        }
    });
    let layer = RateLimitLayer::new([limit]).insufficient_status(StatusCode::PAYLOAD_TOO_LARGE);
    let (addr, c) = (serve(layer).await, client());
    let r = get(&c, addr, "/bulk", &[]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.header("retry-after"), None);
    assert!(r.body.contains("retrying will not help"), "{}", r.body);
    // Nothing was taken.
    assert_eq!(get(&c, addr, "/", &[]).await.header("ratelimit"), Some(r#""per-ip";r=9"#));
}

/// Dry-run: every request is served, and the headers say what enforcing would have done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_never_refuses() {
    let clock = ManualClock::new();
    let layer =
        RateLimitLayer::new([Limit::keyed("per-ip", bucket("1/s", &clock), PeerIp::<64>)]).dry_run(true);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=0;t=1"#));
    assert_eq!(r.header("retry-after"), None);
}

/// Per-route limits in one layer; several limits at once: the headers describe the one closest
/// to refusing, `RateLimit-Policy` lists each, and a refusal by a later limit gives back what
/// the earlier ones took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_route_and_several_limits() {
    let clock = ManualClock::new();
    let per_ip = bucket("10/s", &clock);
    let login = Arc::new(Limiter::with_clock("1/min".parse::<TokenBucket>().unwrap(), clock.clone()));
    let layer = RateLimitLayer::new([
        Limit::keyed("per-ip", Arc::clone(&per_ip), PeerIp::<64>),
        Limit::direct("login", Arc::clone(&login)).when(|req| req.uri.path() == "/login"),
    ]);
    let (addr, c) = (serve(layer).await, client());

    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-ip";q=10;w=1"#));
    let r = get(&c, addr, "/login", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-ip";q=10;w=1, "login";q=1;w=60"#));
    assert_eq!(r.header("ratelimit"), Some(r#""login";r=0;t=60"#));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));

    let r = get(&c, addr, "/login", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("60"));
    assert!(r.body.contains(r#""violated-policies":["login"]"#), "{}", r.body);
    // per-ip took a token for the refused request and got it back: 10 − 2 served = 8 left.
    let peer: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(per_ip.peek(&tollgate::IpPrefix::new(peer)).remaining(), 8);
}

/// A keyed limit that finds no key refuses the request (400 by default), saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_a_bad_request() {
    let keys = Arc::new(KeyedLimiter::<String>::new("5/s".parse::<TokenBucket>().unwrap(), 100).unwrap());
    let layer =
        RateLimitLayer::new([Limit::keyed("per-key", keys, HeaderKey(HeaderName::from_static("x-api-key")))]);
    let (addr, c) = (serve(layer).await, client());
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("no `x-api-key` header"), "{}", r.body);
    let r = get(&c, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=4"#));
}

/// nginx without `nodelay`: a request over the rate waits its delay, then is served (never
/// early); with `Delays::Refuse` it is refused with the delay as `Retry-After`. A queued bucket
/// delays the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_requests_wait_or_are_refused() {
    let nginx = Arc::new(NginxLimiter::new("5r/s burst=2".parse::<Nginx>().unwrap()));
    let layer = RateLimitLayer::new([Limit::direct("nginx", nginx)]);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let start = Instant::now();
    let r = get(&c, addr, "/", &[]).await; // 200 ms of excess at 5 r/s
    assert_eq!(r.status, StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_millis(150), "served after {:?}", start.elapsed());

    let clock = ManualClock::new();
    let queued =
        Arc::new(QueuedLimiter::with_clock("1/s burst=1 queue=5".parse::<Queued>().unwrap(), clock.clone()));
    let layer = RateLimitLayer::new([Limit::direct("queued", queued)]).delays(Delays::Refuse);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.body.contains("configured to refuse"), "{}", r.body);
    // Refused, so given back: the line is as long as before.
    assert_eq!(get(&c, addr, "/", &[]).await.header("retry-after"), Some("1"));
}

/// A keyed table with no room for a new client (`WhenFull::Deny`): 503, reduced capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_is_reduced_capacity() {
    let keys = Arc::new(
        KeyedLimiter::<String>::builder("1/h".parse::<TokenBucket>().unwrap())
            .capacity(8)
            .when_full(WhenFull::Deny)
            .build()
            .unwrap(),
    );
    let layer =
        RateLimitLayer::new([Limit::keyed("per-key", keys, HeaderKey(HeaderName::from_static("x-api-key")))]);
    let (addr, c) = (serve(layer).await, client());
    let mut statuses = Vec::new();
    for k in 0..64 {
        statuses.push(get(&c, addr, "/", &[("x-api-key", &format!("key-{k}"))]).await);
    }
    let full =
        statuses.iter().find(|r| r.status == StatusCode::SERVICE_UNAVAILABLE).expect("the table filled up");
    assert!(full.body.contains("temporary-reduced-capacity"), "{}", full.body);
    assert_eq!(full.header("retry-after"), None);
}

/// Many clients at once on 2 threads, one frozen clock: exactly the burst is admitted per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_exceed_the_quota() {
    let clock = ManualClock::new();
    let keys = Arc::new(
        KeyedLimiter::<String>::builder("50/h".parse::<TokenBucket>().unwrap())
            .capacity(100)
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let layer =
        RateLimitLayer::new([Limit::keyed("per-key", keys, HeaderKey(HeaderName::from_static("x-api-key")))]);
    let addr = serve(layer).await;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(async move {
                let c = client();
                let key = format!("tenant-{}", i % 2);
                let mut ok = 0;
                for _ in 0..20 {
                    ok +=
                        u32::from(get(&c, addr, "/", &[("x-api-key", &key)]).await.status == StatusCode::OK);
                }
                (i % 2, ok)
            })
        })
        .collect();
    let mut admitted = [0; 2];
    for t in tasks {
        let (k, ok) = t.await.unwrap();
        admitted[k] += ok;
    }
    assert_eq!(admitted, [50, 50], "160 requests per key, a burst of 50, a frozen clock");
}

/// The layer is a plain tower service too: no server needed to call it.
#[tokio::test]
async fn the_service_without_a_server() {
    let limiter = Arc::new(Limiter::new("1/h".parse::<TokenBucket>().unwrap()));
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new([Limit::direct("global", limiter)]))
        .service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) });
    let ok = svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let no = svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A keyed token bucket's tiers: `RateLimit-Policy` and `X-RateLimit-Limit` give the key's own
/// tier's quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_tier_is_described() {
    let keys = Arc::new(
        KeyedLimiter::<String>::builder("10/s".parse::<TokenBucket>().unwrap())
            .tier("gold", "100/s burst=300".parse::<TokenBucket>().unwrap())
            .capacity(100)
            .build()
            .unwrap(),
    );
    keys.set_override("vip", keys.tier("gold").unwrap()).unwrap();
    let layer =
        RateLimitLayer::new([Limit::keyed("per-key", keys, HeaderKey(HeaderName::from_static("x-api-key")))]);
    let (addr, c) = (serve(layer).await, client());
    let r = get(&c, addr, "/", &[("x-api-key", "vip")]).await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-key";q=300;w=3"#));
    assert_eq!(r.header("x-ratelimit-limit"), Some("300"));
    let r = get(&c, addr, "/", &[("x-api-key", "someone")]).await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-key";q=10;w=1"#));
}

/// A keyed bucket that waits instead of refusing: a request over the limit reserves its token
/// and is served when it is due; one that would wait longer than allowed is refused at once,
/// with `Retry-After` the time until the line has room; a refused one gives its reservation back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_bucket_can_wait_instead_of_refusing() {
    let clock = ManualClock::new();
    let waiting = bucket("10/s burst=1", &clock); // a token per 100 ms
    let limit =
        Limit::keyed_waiting("per-ip", Arc::clone(&waiting), PeerIp::<64>, Duration::from_millis(150));
    let (addr, c) = (serve(RateLimitLayer::new([limit])).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let start = Instant::now();
    let r = get(&c, addr, "/", &[]).await; // due in 100 ms: waited for, then served
    assert_eq!(r.status, StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_millis(90), "served after {:?}", start.elapsed());
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=0;t=1"#));
    // The line now ends at 100 ms (on the frozen clock): the next is due at 200 ms, past the
    // 150 ms allowed, so it is refused at once; retrying in 50 ms would fit (1 s, rounded up).
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    let peer = tollgate::IpPrefix::new("127.0.0.1".parse().unwrap());
    assert_eq!(
        waiting.peek(&peer).retry_after(),
        Some(Duration::from_millis(200)),
        "the refusal took nothing"
    );

    // Refused by a later limit: the reservation goes back.
    let clock = ManualClock::new();
    let waiting = bucket("10/s burst=1", &clock);
    let closed = Arc::new(Limiter::with_clock("1/h".parse::<TokenBucket>().unwrap(), clock.clone()));
    assert!(closed.check().is_allowed());
    let layer = RateLimitLayer::new([
        Limit::keyed_waiting("per-ip", Arc::clone(&waiting), PeerIp::<64>, Duration::from_secs(1)),
        Limit::direct("closed", closed),
    ]);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waiting.peek(&peer).remaining(), 1, "the waiting bucket's token came back");
}

/// A partition key, when chosen (`Limit::partition_key`): `pk=:base64:` on the limit's policy
/// item and on `RateLimit` when that limit is described; none for a request it has no key for,
/// and none on a limit that does not send one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_key_is_sent_when_chosen() {
    let clock = ManualClock::new();
    let per_key = by_key("2/s", &clock);
    let global = Arc::new(Limiter::with_clock("10/s".parse::<TokenBucket>().unwrap(), clock.clone()));
    // Opaque ids of the application's own, not the keys: `tenant-1`, and two raw bytes.
    let tenant = |req: &http::request::Parts| match req.headers.get("x-api-key")?.as_bytes() {
        b"alice" => Some(b"tenant-1".to_vec()),
        b"carol" => Some(vec![0, 255]),
        _ => None,
    };
    let layer = RateLimitLayer::new([
        Limit::keyed("per-key", per_key, HeaderKey(HeaderName::from_static("x-api-key")))
            .partition_key(tenant),
        Limit::direct("global", global),
    ]);
    let (addr, c) = (serve(layer).await, client());

    let r = get(&c, addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per-key";q=2;w=1;pk=:dGVuYW50LTE=:, "global";q=10;w=1"#)
    );
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=1;pk=:dGVuYW50LTE=:"#));
    let r = get(&c, addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=0;t=1;pk=:dGVuYW50LTE=:"#));
    let r = get(&c, addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=0;t=1;pk=:dGVuYW50LTE=:"#));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-key";q=2;w=1;pk=:dGVuYW50LTE=:"#));

    let r = get(&c, addr, "/", &[("x-api-key", "carol")]).await;
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=1;pk=:AP8=:"#));
    // No id for bob: the fields without `pk`.
    let r = get(&c, addr, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-key";q=2;w=1, "global";q=10;w=1"#));
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=1"#));

    // The limit without a partition key described (the global one closest to refusing): `pk`
    // on the other's policy item only. And two partitioned limits: each item its own.
    let clock = ManualClock::new();
    let per_key = by_key("20/s", &clock);
    let global = Arc::new(Limiter::with_clock("3/s".parse::<TokenBucket>().unwrap(), clock.clone()));
    let region = Arc::new(Limiter::with_clock("5/s".parse::<TokenBucket>().unwrap(), clock.clone()));
    let layer = RateLimitLayer::new([
        Limit::keyed("per-key", per_key, HeaderKey(HeaderName::from_static("x-api-key")))
            .partition_key(tenant),
        Limit::direct("global", global),
        Limit::direct("region", region).partition_key(|_| Some(b"eu".to_vec())),
    ]);
    let (addr, c) = (serve(layer).await, client());
    let r = get(&c, addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""per-key";q=20;w=1;pk=:dGVuYW50LTE=:, "global";q=3;w=1, "region";q=5;w=1;pk=:ZXU=:"#)
    );
    assert_eq!(r.header("ratelimit"), Some(r#""global";r=2"#));
}

/// A limit per route parameter (`PathSegment`): `/users/42` and `/users/%34%32` are one client;
/// a path without the parameter is a 400 that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_parameter_is_a_key() {
    let clock = ManualClock::new();
    let per_user = by_key("2/min", &clock);
    let layer = RateLimitLayer::new([Limit::keyed("per-user", per_user, tollgate_tower::PathSegment(1))]);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/users/42", &[]).await.header("ratelimit"), Some(r#""per-user";r=1"#));
    assert_eq!(
        get(&c, addr, "/users/%34%32/posts", &[]).await.header("ratelimit"),
        Some(r#""per-user";r=0;t=30"#)
    );
    assert_eq!(get(&c, addr, "/users/4%32", &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&c, addr, "/users/7", &[]).await.status, StatusCode::OK);
    let r = get(&c, addr, "/users", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("no segment 1"), "{}", r.body);
}

/// The application's own refusal body (`refusal_body`): its content type and bytes, with the
/// layer's status, `Retry-After` and rate-limit headers; key errors keep the problem details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_can_have_the_applications_body() {
    let clock = ManualClock::new();
    let per_key = by_key("1/2s burst=1", &clock);
    let layer = RateLimitLayer::new([Limit::keyed(
        "per-key",
        per_key,
        HeaderKey(HeaderName::from_static("x-api-key")),
    )
    .cost(|req| req.headers.get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1))])
    .refusal_body(|r| {
        let body = format!(
            "{}:{:?}:{}:{:?}",
            r.limit(),
            r.outcome(),
            r.status().as_u16(),
            r.retry_after().map(|w| w.as_millis())
        );
        (http::HeaderValue::from_static("text/plain"), Bytes::from(body))
    });
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[("x-api-key", "a")]).await.status, StatusCode::OK);
    clock.advance(Duration::from_millis(500));
    let r = get(&c, addr, "/", &[("x-api-key", "a")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body, "per-key:Denied:429:Some(1500)");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("retry-after"), Some("2"));
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=0;t=2"#));
    // Never: no Retry-After, the outcome says so.
    let r = get(&c, addr, "/", &[("x-api-key", "b"), ("x-cost", "2")]).await;
    assert_eq!(r.body, "per-key:Insufficient:429:None");
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("ratelimit"), Some(r#""per-key";r=1"#), "the rate-limit headers stay");
    // A key error is not a limit's refusal: the problem details, as before.
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    // With problem details off the body is still the application's; a full table (503) and a
    // refused delay reach it with their outcomes.
    let full = Arc::new(
        KeyedLimiter::<String>::builder("1/h".parse::<TokenBucket>().unwrap())
            .capacity(1)
            .shards(1)
            .when_full(WhenFull::Deny)
            .build()
            .unwrap(),
    );
    let queued =
        Arc::new(QueuedLimiter::with_clock("1/s burst=1 queue=5".parse::<Queued>().unwrap(), clock.clone()));
    let body = |r: &tollgate_tower::Refusal<'_>| {
        let text = format!("{}:{:?}:{}", r.limit(), r.outcome(), r.status().as_u16());
        (http::HeaderValue::from_static("text/plain"), Bytes::from(text))
    };
    let layer =
        RateLimitLayer::new([Limit::keyed("tenants", full, HeaderKey(HeaderName::from_static("x-api-key")))])
            .problem_details(false)
            .refusal_body(body);
    let (addr, c) = (serve(layer).await, client());
    let mut last = None;
    for k in 0..100 {
        let r = get(&c, addr, "/", &[("x-api-key", &format!("t{k}"))]).await;
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            last = Some(r);
            break;
        }
    }
    let r = last.expect("the table filled up");
    assert_eq!(r.body, "tenants:TableFull:503");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    let layer =
        RateLimitLayer::new([Limit::direct("queued", queued)]).delays(Delays::Refuse).refusal_body(body);
    let (addr, c) = (serve(layer).await, client());
    assert_eq!(get(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let r = get(&c, addr, "/", &[]).await;
    assert_eq!(r.body, "queued:Delayed:429");
    assert_eq!(r.header("retry-after"), Some("1"));
}
