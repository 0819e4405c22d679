//! Upstream's HTTP endpoints over real HTTP on 127.0.0.1 with hyper's client: `/json` in and
//! out in proto3 JSON with 200 and 429, 400 for what it cannot take, and `/healthcheck`.

use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate_envoy::{Config, Limits, LoadOptions, Service};

async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let files: Vec<(String, String)> = ["basic.yaml", "reload.yaml"]
        .iter()
        .map(|f| ((*f).to_owned(), std::fs::read_to_string(dir.join(f)).unwrap()))
        .collect();
    let service =
        Service::new(Limits::new(Config::from_files(files, LoadOptions::default()).unwrap(), 100).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        service
            .serve_http(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    (url, stop)
}

async fn post(url: &str, path: &str, body: &str) -> (u16, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req =
        hyper::Request::post(format!("{url}{path}")).body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let r = client.request(req).await.unwrap();
    let status = r.status().as_u16();
    let ctype = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, ctype, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_in_json_out_with_upstreams_codes() {
    let (url, stop) = start().await;
    let body = r#"{"domain":"basic","descriptors":[{"entries":[{"key":"one_per_minute","value":"a"}]}]}"#;
    let (status, ctype, text) = post(&url, "/json", body).await;
    assert_eq!((status, ctype.as_str()), (200, "application/json"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["overallCode"], json!("OK"));
    assert_eq!(v["statuses"][0]["code"], json!("OK"));
    assert_eq!(v["statuses"][0]["currentLimit"], json!({"requestsPerUnit": 1, "unit": "MINUTE"}));
    assert!(v["statuses"][0].get("limitRemaining").is_none(), "0 is left out: {text}");
    assert!(v["statuses"][0]["durationUntilReset"].as_str().unwrap().ends_with('s'));
    let (status, _, text) = post(&url, "/json", body).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["overallCode"], json!("OVER_LIMIT"));
    // Proto field names work too; an unknown domain is OK with a bare status.
    let (status, _, text) = post(
        &url,
        "/json",
        r#"{"domain":"nowhere","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hits_addend":1}"#,
    )
    .await;
    assert_eq!((status, text.as_str()), (200, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#));
    // What it cannot take: 400, text.
    for bad in [
        "",
        "{",
        r#"{"domain":"basic","unknown":1}"#,
        r#"{"domain":"","descriptors":[{"entries":[]}]}"#,
        r#"{"domain":"basic"}"#,
        // A negative or too large hitsAddend (a uint32), per request or per descriptor (a
        // UInt64Value), as protojson refuses them upstream.
        r#"{"domain":"basic","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":-1}"#,
        r#"{"domain":"basic","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":4294967296}"#,
        r#"{"domain":"basic","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":-5}]}"#,
        r#"{"domain":"basic","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"-5"}]}"#,
        r#"{"domain":"basic","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":1.5}]}"#,
    ] {
        let (status, ctype, text) = post(&url, "/json", bad).await;
        assert_eq!(
            (status, ctype.as_str(), text.as_str()),
            (400, "text/plain; charset=utf-8", "Bad Request\n"),
            "{bad:?}"
        );
    }
    // A per-request limit of unit WEEK (7, newer than envoy-types' protos), by name or number.
    for (value, unit) in [("by-name", r#""WEEK""#), ("by-number", "7")] {
        let body = format!(
            r#"{{"domain":"basic","descriptors":[{{"entries":[{{"key":"w","value":"{value}"}}],"limit":{{"requestsPerUnit":3,"unit":{unit}}}}}]}}"#
        );
        let (status, _, text) = post(&url, "/json", &body).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["statuses"][0]["currentLimit"], json!({"requestsPerUnit": 3, "unit": "WEEK"}), "{text}");
        assert_eq!(v["statuses"][0]["limitRemaining"], json!(2), "{text}");
    }
    let (status, _, text) = post(&url, "/healthcheck", "").await;
    assert_eq!((status, text.as_str()), (200, "OK"));
    let (status, ..) = post(&url, "/elsewhere", "").await;
    assert_eq!(status, 404);
    let _ = stop.send(());
}
