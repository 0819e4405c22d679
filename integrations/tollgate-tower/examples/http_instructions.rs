//! What a request costs in instructions, which this noisy host does not disturb (the `http_bench`
//! rates move by ±7% between runs): an axum hello-world and a minimal keep-alive client in one
//! process on one thread, `N` requests over one connection, for one subject. Run it under
//! callgrind at two request counts; the difference over the difference in `N` is one request's
//! user-space instructions, server and client (the client's share is the same in every subject):
//!
//! ```sh
//! cargo build --release -p tollgate-tower --features axum --example http_instructions
//! for n in 1000 3000; do N=$n valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/release/examples/http_instructions tollgate; done
//! ```
//!
//! Subjects: `none` (no layer), `pass` (a layer that passes responses through), `const` (the
//! five headers tollgate writes, as constants),
//! `tollgate` (its default headers), `xonly`, `ietf`, `noheaders`, `governor` (tower-governor
//! on the same quota, with its `use_headers`) and `governor_noheaders` (without); each also as
//! `<subject>-outer`. Exclude the first TSC clock's
//! calibration (`OnceCell::initialize`, `clock_gettime`) from the totals: it runs for a fixed
//! time, so its instruction count varies between runs.

#![allow(missing_docs)]

mod shared;

use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::{KeyedLimiter, Rate, TokenBucket};
use tollgate_tower::{Headers, Limit, PeerIp, RateLimitLayer};
use tower::Layer;

/// tower-governor on the same quota (a million a second, a burst of 1,000), with the headers
/// its `use_headers` writes (`x-ratelimit-limit` and `x-ratelimit-remaining` on an admission).
/// `governor_layer!(no_headers)`: its default, no headers on an admission. A macro: the
/// layer's type names a crate this one does not depend on.
macro_rules! governor_layer {
    () => {{
        let mut b = tower_governor::governor::GovernorConfigBuilder::default();
        b.period(std::time::Duration::from_micros(1)).burst_size(1000);
        tower_governor::GovernorLayer { config: Arc::new(b.use_headers().finish().unwrap()) }
    }};
    (no_headers) => {{
        let mut b = tower_governor::governor::GovernorConfigBuilder::default();
        b.period(std::time::Duration::from_micros(1)).burst_size(1000);
        tower_governor::GovernorLayer { config: Arc::new(b.finish().unwrap()) }
    }};
}

fn app(subject: &str) -> Router {
    let router = Router::new().route("/", get(|| async { "hello" }));
    match subject {
        "none" => router,
        "const" => router.layer(shared::constant_headers()),
        "pass" => router.layer(shared::pass_through()),
        "governor" => router.layer(governor_layer!()),
        "governor_noheaders" => router.layer(governor_layer!(no_headers)),
        _ => router.layer(tollgate_layer(subject)),
    }
}

fn tollgate_layer(subject: &str) -> RateLimitLayer {
    let q = TokenBucket::new(Rate::per_second(1_000_000), 1000).unwrap();
    let per_ip = Arc::new(KeyedLimiter::new(q, 100_000).unwrap());
    let layer = RateLimitLayer::new([Limit::keyed("per-ip", per_ip, PeerIp::<64>)]);
    let headers = match subject {
        "tollgate" => Headers::default(),
        "xonly" => Headers { x_ratelimit: true, ..Headers::NONE },
        "ietf" => Headers { ietf: true, ..Headers::NONE },
        _ => Headers::NONE,
    };
    layer.headers(headers)
}

fn main() {
    let subject = std::env::args().nth(1).expect("a subject: none, pass, const, tollgate, xonly, ietf, noheaders, governor, governor_noheaders (each also as <subject>-outer)");
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // `-outer`: the layer around the whole router (`Layer::layer`), not inside it
        // (`Router::layer`, which wraps the route's service and boxes it again).
        // The service's type differs by subject: each is served by this one expansion.
        macro_rules! serve {
            ($service:expr) => {{
                let service = axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                    SocketAddr,
                >($service);
                tokio::spawn(async move { axum::serve(listener, service).await });
            }};
        }
        // `-outer`: the layer around the whole router (`Layer::layer`), not inside it
        // (`Router::layer`, which wraps the route's service and boxes it again).
        let router = Router::new().route("/", get(|| async { "hello" }));
        match subject.strip_suffix("-outer") {
            Some("pass") => serve!(shared::pass_through().layer(router)),
            Some("const") => serve!(shared::constant_headers().layer(router)),
            Some("governor") => serve!(governor_layer!().layer(router)),
            Some("governor_noheaders") => serve!(governor_layer!(no_headers).layer(router)),
            Some(inner) => serve!(tollgate_layer(inner).layer(router)),
            // A router through its own method, as axum users serve one.
            None => {
                let service = app(&subject).into_make_service_with_connect_info::<SocketAddr>();
                tokio::spawn(async move { axum::serve(listener, service).await });
            }
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut bytes = 0;
        for _ in 0..n {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let mut got = 0;
            loop {
                let k = s.read(&mut buf[got..]).await.unwrap();
                got += k;
                if buf[..got].ends_with(b"hello") {
                    break;
                }
            }
            bytes = got;
        }
        println!("{subject}: {bytes} bytes per response");
    });
}
