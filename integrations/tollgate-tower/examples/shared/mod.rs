//! What the HTTP benchmark examples share.

use axum::response::Response;
use tower::util::MapResponseLayer;

/// A layer that maps every response with a plain function.
pub(crate) type MapLayer = MapResponseLayer<fn(Response) -> Response>;

/// A layer writing the five headers tollgate's default layer writes, as constants (the values
/// of the benchmarks' allow-heavy quota: a million a second, a burst of 1,000): the floor of
/// any limiter that writes them (their bytes cost the server and the client). Written the
/// cheapest way `http` allows: static names and values, room reserved once.
pub(crate) fn constant_headers() -> MapLayer {
    use http::{HeaderName, HeaderValue};
    static HEADERS: [(HeaderName, HeaderValue); 5] = [
        (HeaderName::from_static("ratelimit-policy"), HeaderValue::from_static("\"per-ip\";q=1000;w=1")),
        (HeaderName::from_static("ratelimit"), HeaderValue::from_static("\"per-ip\";r=999")),
        (HeaderName::from_static("x-ratelimit-limit"), HeaderValue::from_static("1000")),
        (HeaderName::from_static("x-ratelimit-remaining"), HeaderValue::from_static("999")),
        (HeaderName::from_static("x-ratelimit-reset"), HeaderValue::from_static("1")),
    ];
    fn write(mut r: Response) -> Response {
        let h = r.headers_mut();
        h.reserve(HEADERS.len());
        for (name, value) in &HEADERS {
            h.insert(name.clone(), value.clone());
        }
        r
    }
    MapResponseLayer::new(write)
}

/// A tower layer that passes every response through unchanged: the cost of mounting any layer
/// (with `Router::layer`, axum wraps the route's service and boxes it again), the floor of a
/// limiter layer that writes no headers.
pub(crate) fn pass_through() -> MapLayer {
    fn same(r: Response) -> Response {
        r
    }
    MapResponseLayer::new(same)
}
