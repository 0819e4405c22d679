//! What the HTTP benchmark examples share.

use axum::Router;

/// `router` writing the five headers tollgate's default layer writes, as constants (the values
/// of the benchmarks' allow-heavy quota: a million a second, a burst of 1,000): the floor of
/// any limiter that writes them (their bytes cost the server and the client).
pub(crate) fn constant_headers(router: Router) -> Router {
    router.layer(tower::util::MapResponseLayer::new(|mut r: axum::response::Response| {
        let h = r.headers_mut();
        for (name, value) in [
            ("ratelimit-policy", "\"per-ip\";q=1000;w=1"),
            ("ratelimit", "\"per-ip\";r=999"),
            ("x-ratelimit-limit", "1000"),
            ("x-ratelimit-remaining", "999"),
            ("x-ratelimit-reset", "1"),
        ] {
            h.insert(name, http::HeaderValue::from_static(value));
        }
        r
    }))
}

/// `router` behind a tower layer that passes every response through unchanged: the cost of
/// mounting any layer with `Router::layer` (axum wraps the route's service and boxes it again),
/// the floor of a limiter layer that writes no headers.
pub(crate) fn pass_through(router: Router) -> Router {
    router.layer(tower::util::MapResponseLayer::new(|r: axum::response::Response| r))
}
