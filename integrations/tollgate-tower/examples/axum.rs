//! An axum server with tollgate in front, on 127.0.0.1:3000:
//!
//! ```sh
//! cargo run -p tollgate-tower --features axum --example axum
//! curl -i http://127.0.0.1:3000/                       # per-IP bucket and the global nginx limit
//! curl -i -H 'x-api-key: gold-1' http://127.0.0.1:3000/api   # per-API-key, the "gold" tier
//! for i in $(seq 30); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done
//! ```
//!
//! Every response carries `RateLimit`, `RateLimit-Policy` and `X-RateLimit-*`; a refusal is a
//! 429 with `Retry-After` and an `application/problem+json` body. `--addr HOST:PORT` serves
//! elsewhere; `--requests N` sends N requests to itself, prints the answers and exits (what CI
//! runs).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use http::HeaderName;
use tollgate::{KeyedLimiter, Nginx, NginxLimiter, TokenBucket};
use tollgate_tower::{ClientIp, HeaderKey, Limit, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let addr: SocketAddr = arg("--addr").unwrap_or_else(|| "127.0.0.1:3000".into()).parse()?;

    // 5 per second per client, bursts of 10; behind a proxy, trust its network to read
    // X-Forwarded-For (none here: the socket's peer is the client).
    let per_ip = Arc::new(KeyedLimiter::new("5/s burst=10".parse::<TokenBucket>()?, 100_000)?);
    let client_ip = ClientIp::<64>::new();
    // API keys: 20 per second by default, 100 for keys in the "gold" tier.
    let per_key = Arc::new(
        KeyedLimiter::<String>::builder("20/s".parse::<TokenBucket>()?)
            .tier("gold", "100/s burst=200".parse::<TokenBucket>()?)
            .capacity(10_000)
            .build()?,
    );
    let gold = per_key.tier("gold").expect("built with it");
    for key in ["gold-1", "gold-2"] {
        per_key.set_override(key, gold)?;
    }
    // Everything together: nginx's limit_req, delaying a burst of 50 above 1000 r/s.
    let global = Arc::new(NginxLimiter::new("1000r/s burst=50".parse::<Nginx>()?));

    let layer = RateLimitLayer::new([
        Limit::keyed("per-ip", per_ip, client_ip),
        Limit::keyed("per-key", per_key, HeaderKey(HeaderName::from_static("x-api-key")))
            .when(|req| req.uri.path().starts_with("/api")),
        Limit::direct("global", global),
    ]);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/api", get(|| async { "{\"ok\":true}\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let server = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>());
    match arg("--requests") {
        None => {
            println!("serving on http://{addr}: try `curl -i http://{addr}/`");
            server.await?;
        }
        Some(n) => {
            tokio::spawn(async move { server.await });
            for i in 0..n.parse::<u32>()? {
                let (status, headers) = fetch(addr, if i % 2 == 0 { "/" } else { "/api" }).await?;
                println!("{status} {headers}");
            }
        }
    }
    Ok(())
}

/// A bare HTTP/1.1 GET (no client dependency): the status line and the rate-limit headers.
async fn fetch(addr: SocketAddr, path: &str) -> Result<(String, String), Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req =
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: gold-1\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).await?;
    let mut lines = reply.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<&str> = lines
        .take_while(|l| !l.is_empty())
        .filter(|l| {
            l.to_ascii_lowercase().starts_with("ratelimit") || l.to_ascii_lowercase().starts_with("retry")
        })
        .collect();
    Ok((status, headers.join(" | ")))
}
