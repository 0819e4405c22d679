//! The `metrics` feature: each refusal counted by limit, outcome and status, and nothing for
//! an admitted request.

#![cfg(feature = "metrics")]

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::{Limiter, TokenBucket};
use tollgate_tower::{Limit, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

async fn hello(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

#[test]
fn refusals_are_counted_by_limit_outcome_and_status() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let global = Arc::new(Limiter::new(TokenBucket::per_minute(2).unwrap()));
    let layer = RateLimitLayer::new([Limit::direct("global", global)]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let statuses: Vec<StatusCode> = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let mut out = Vec::new();
            for _ in 0..5 {
                let svc = ServiceBuilder::new().layer(layer.clone()).service_fn(hello);
                let req = Request::get("/").body(Full::new(Bytes::new())).unwrap();
                out.push(svc.oneshot(req).await.unwrap().status());
            }
            out
        })
    });
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(), 3);
    let counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let k = key.key();
            let mut labels: Vec<String> = k.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            labels.sort();
            match value {
                DebugValue::Counter(c) => Some((format!("{}{{{}}}", k.name(), labels.join(",")), c)),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        counted,
        [("tollgate_http_refusals_total{limit=global,outcome=denied,status=429}".to_owned(), 3)],
        "one series, three refusals, nothing for the two admitted"
    );
}
