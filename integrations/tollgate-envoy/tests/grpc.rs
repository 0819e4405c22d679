//! `ShouldRateLimit` over real gRPC on 127.0.0.1: tonic's client against the service, as
//! Envoy calls it; the health service; a reload that keeps the counters of unchanged rules;
//! and requests upstream would choke on.

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit as PbUnit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tokio::net::TcpListener;
use tollgate_envoy::{Config, Limits, LoadOptions, Service};

fn config(files: &[&str]) -> Config {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let files: Vec<(String, String)> =
        files.iter().map(|f| ((*f).to_owned(), std::fs::read_to_string(dir.join(f)).unwrap())).collect();
    Config::from_files(files, LoadOptions::default()).unwrap()
}

/// A service on a free port, its client, and the way to stop it.
async fn start(
    limits: Limits,
) -> (Service, RateLimitServiceClient<tonic::transport::Channel>, String, tokio::sync::oneshot::Sender<()>) {
    let service = Service::new(limits);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = service.clone();
    tokio::spawn(async move {
        serving
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    let client = RateLimitServiceClient::connect(url.clone()).await.unwrap();
    (service, client, url, stop)
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry { key: (*k).to_owned(), value: (*v).to_owned() })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// (overall, [(code, requests per unit, unit, remaining)]).
fn summary(r: &RateLimitResponse) -> (i32, Vec<(i32, u32, i32, u32)>) {
    (
        r.overall_code,
        r.statuses
            .iter()
            .map(|s| {
                let l = s.current_limit.clone().unwrap_or_default();
                (s.code, l.requests_per_unit, l.unit, s.limit_remaining)
            })
            .collect(),
    )
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_call_is_answered_field_for_field() {
    let (_service, mut client, _url, stop) =
        start(Limits::new(config(&["basic.yaml", "another.yaml"]), 1_000).unwrap()).await;
    let r = client.should_rate_limit(request("basic", &[&[("key1", "foo")]])).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 50, PbUnit::Second as i32, 49)]));
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!((1..=1).contains(&reset.seconds) && reset.nanos == 0, "{reset:?}");
    // Unknown domains and descriptors are no error: OK, no limit.
    let r = client.should_rate_limit(request("foo", &[&[("hello", "world")]])).await.unwrap().into_inner();
    assert_eq!((r.overall_code, r.statuses.len(), r.statuses[0].current_limit.clone()), (OK, 1, None));
    // 20 per minute, then over (the test must not straddle a minute: start early in one).
    let key = format!("{:?}", std::time::SystemTime::now());
    let mut codes = Vec::new();
    for _ in 0..22 {
        let r =
            client.should_rate_limit(request("another", &[&[("key2", &key)]])).await.unwrap().into_inner();
        codes.push(r.statuses[0].code);
    }
    let admitted = codes.iter().filter(|&&c| c == OK).count();
    assert!(admitted >= 20, "{codes:?}");
    // Upstream's errors: UNKNOWN with its message.
    let e = client.should_rate_limit(request("", &[&[("a", "b")]])).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unknown, "rate limit domain must not be empty"));
    let e = client.should_rate_limit(request("basic", &[])).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unknown, "rate limit descriptor list must not be empty")
    );
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_says_ratelimit_is_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let (_service, _client, url, stop) = start(Limits::new(config(&["basic.yaml"]), 10).unwrap()).await;
    let channel = tonic::transport::Channel::from_shared(url).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    for name in ["ratelimit", ""] {
        let r = health.check(HealthCheckRequest { service: name.to_owned() }).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{name:?}");
    }
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_counts_of_rules_that_did_not_change() {
    let (service, mut client, _url, stop) =
        start(Limits::new(config(&["another.yaml"]), 1_000).unwrap()).await;
    let key = format!("{:?}", std::time::SystemTime::now());
    let hit = |client: &mut RateLimitServiceClient<_>, k: &'static str| {
        let r = request("another", &[&[(k, key.as_str())]]);
        let mut client = client.clone();
        async move { summary(&client.should_rate_limit(r).await.unwrap().into_inner()).1[0] }
    };
    for _ in 0..3 {
        hit(&mut client, "key3").await;
        hit(&mut client, "key4").await;
    }
    // key3 keeps its hour and its limit; key4 moves from a day to an hour; reload.yaml's
    // domain arrives.
    let changed = config(&["another.yaml"]);
    let mut yaml =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/another.yaml"))
            .unwrap();
    yaml = yaml.replace(
        "  - key: key4\n    rate_limit:\n      unit: day",
        "  - key: key4\n    rate_limit:\n      unit: hour",
    );
    let reload =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/reload.yaml"))
            .unwrap();
    let next = Config::from_files(
        [("another.yaml", yaml.as_str()), ("reload.yaml", reload.as_str())],
        LoadOptions::default(),
    )
    .unwrap();
    drop(changed);
    service.replace(service.limits().reloaded(next).unwrap());
    assert_eq!(hit(&mut client, "key3").await, (OK, 10, PbUnit::Hour as i32, 6), "key3's count carried over");
    assert_eq!(
        hit(&mut client, "key4").await,
        (OK, 20, PbUnit::Hour as i32, 19),
        "key4's unit changed: counted afresh"
    );
    let r = client.should_rate_limit(request("reload", &[&[("key1", "foo")]])).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 50, PbUnit::Second as i32, 49)]));
    assert_eq!(service.limits().counts("another.key3").total_hits, 4);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_are_answered_and_the_service_keeps_serving() {
    let (_service, mut client, _url, stop) =
        start(Limits::new(config(&["basic.yaml", "another.yaml"]), 100).unwrap()).await;
    // A descriptor of 10,000 entries, and a 1 MiB value.
    let long: Vec<(String, String)> = (0..10_000).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let entries: Vec<(&str, &str)> = long.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = client.should_rate_limit(request("basic", &[&entries])).await.unwrap().into_inner();
    assert_eq!(r.overall_code, OK);
    let big = "x".repeat(1 << 20);
    let r = client.should_rate_limit(request("basic", &[&[("key1", &big)]])).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 50, PbUnit::Second as i32, 49)]));
    // The largest hits: over the limit, counted, no overflow.
    let mut huge = request("another", &[&[("key3", "huge")]]);
    huge.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
    let r = client.should_rate_limit(huge).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OVER, vec![(OVER, 10, PbUnit::Hour as i32, 0)]));
    let mut huge = request("another", &[&[("key3", "huge2")]]);
    huge.hits_addend = u32::MAX;
    assert_eq!(client.should_rate_limit(huge).await.unwrap().into_inner().overall_code, OVER);
    // A per-request limit of unit UNKNOWN crashes upstream; here it is a clear error.
    let mut bad = request("basic", &[&[("key1", "foo")]]);
    bad.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 5, unit: 0 });
    let e = client.should_rate_limit(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert!(e.message().contains("no unit"), "{}", e.message());
    // WEEK (7), newer than envoy-types' protos, as upstream takes it.
    let mut week = request("basic", &[&[("key1", "week")]]);
    week.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 5, unit: 7 });
    let r = client.should_rate_limit(week).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 5, PbUnit::Week as i32, 4)]));
    // Still serving.
    let r = client.should_rate_limit(request("basic", &[&[("key1", "after")]])).await.unwrap().into_inner();
    assert_eq!(r.overall_code, OK);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_ever_new_values_cannot_grow_the_statistics_past_their_budget() {
    // Names made from requests' values: `detailed_metric` (rl.unspec_<value>) and per-request
    // limits (basic.key1_<value>), each value 16 KiB and new: 256 requests, 4 MiB of names
    // offered to a budget of 256 KiB.
    let budget = 256 << 10;
    let limits =
        Limits::new(config(&["basic.yaml", "example.yaml"]), 1000).unwrap().with_statistics_budget(budget);
    let (base_bytes, base_names) = limits.statistics_memory();
    let (service, mut client, _url, stop) = start(limits).await;
    for i in 0..128 {
        let value = format!("{i:05}{}", "v".repeat(16 << 10));
        let r = client.should_rate_limit(request("rl", &[&[("unspec", &value)]])).await.unwrap().into_inner();
        assert_eq!(r.overall_code, OK);
        let mut over = request("basic", &[&[("key1", &value)]]);
        over.descriptors[0].limit =
            Some(RateLimitOverride { requests_per_unit: 5, unit: PbUnit::Minute as i32 });
        let r = client.should_rate_limit(over).await.unwrap().into_inner();
        assert_eq!(summary(&r), (OK, vec![(OK, 5, PbUnit::Minute as i32, 4)]));
    }
    let limits = service.limits();
    let (bytes, names) = limits.statistics_memory();
    assert!(bytes <= budget + 1_000, "{bytes} bytes of statistics, budget {budget}");
    assert!(names < base_names + 6, "{names} names, {base_names} at the start ({base_bytes} B)");
    // No hit is lost: those past the budget count under the rule's name, or the domain's overflow.
    let detailed: u64 = (0..128)
        .map(|i| limits.counts(&format!("rl.unspec_{i:05}{}", "v".repeat(16 << 10))).total_hits)
        .sum();
    assert!(detailed > 0 && detailed < 128, "{detailed} of 128 under their own names");
    assert_eq!(detailed + limits.counts("rl.unspec").total_hits, 128);
    let overridden: u64 = (0..128)
        .map(|i| limits.counts(&format!("basic.key1_{i:05}{}", "v".repeat(16 << 10))).total_hits)
        .sum();
    assert_eq!(overridden + limits.counts("basic.statistics_overflow").total_hits, 128);
    assert!(limits.counts("basic.statistics_overflow").total_hits > 0);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_reach_envoy_in_the_response() {
    let settings = tollgate_envoy::Settings {
        response_headers: Some(tollgate_envoy::HeaderNames::default()),
        ..tollgate_envoy::Settings::default()
    };
    let limits = Limits::new(config(&["another.yaml"]), 100).unwrap().with_settings(settings);
    let (_service, mut client, _url, stop) = start(limits).await;
    let r = client.should_rate_limit(request("another", &[&[("key3", "h")]])).await.unwrap().into_inner();
    let headers: Vec<(String, String)> =
        r.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
    assert_eq!(headers.len(), 3, "{headers:?}");
    assert_eq!(headers[0], ("RateLimit-Limit".to_owned(), "10".to_owned()));
    assert_eq!(headers[1], ("RateLimit-Remaining".to_owned(), "9".to_owned()));
    assert_eq!(headers[2].0, "RateLimit-Reset");
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!((1..=3_600).contains(&reset), "{headers:?}");
    let _ = stop.send(());
}

/// A codec that sends its bytes as they are: a client that can send what no protobuf encoder
/// would.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_and_empty_fields_get_a_status_and_the_service_keeps_serving() {
    let (_service, mut client, url, stop) =
        start(Limits::new(config(&["basic.yaml", "another.yaml"]), 100).unwrap()).await;
    let channel = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    let path =
        http::uri::PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    for (bytes, what) in [
        (vec![0x0a, 0xff, 0xff], "a length past the message's end"),
        (vec![0xff; 16], "a field of wire type 7"),
        (vec![0x12, 0x02, 0x0a], "a descriptor cut short"),
    ] {
        raw.ready().await.unwrap();
        let e = raw.unary(tonic::Request::new(bytes), path.clone(), Raw).await.unwrap_err();
        // grpc-go (upstream) answers an undecodable request INTERNAL too.
        assert_eq!(e.code(), tonic::Code::Internal, "{what}: {e:?}");
        assert!(e.message().contains("decode"), "{what}: {}", e.message());
    }
    // Upstream's errors, with upstream's messages.
    let e = client.should_rate_limit(request("", &[&[("key1", "foo")]])).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unknown, "rate limit domain must not be empty"));
    let e = client.should_rate_limit(request("basic", &[])).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unknown, "rate limit descriptor list must not be empty")
    );
    // An unknown domain is no error upstream: OK, without a limit.
    let r = client.should_rate_limit(request("nowhere", &[&[("key1", "foo")]])).await.unwrap().into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 0, 0, 0)]));
    let r = client.should_rate_limit(request("basic", &[&[("key1", "after")]])).await.unwrap().into_inner();
    assert_eq!(r.overall_code, OK);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_arrives_as_a_protobuf_struct() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let settings = tollgate_envoy::Settings { dynamic_metadata: true, ..tollgate_envoy::Settings::default() };
    let limits = Limits::new(config(&["basic.yaml"]), 100).unwrap().with_settings(settings);
    let (_service, mut client, _url, stop) = start(limits).await;
    let r = client.should_rate_limit(request("basic", &[&[("key1", "foo")]])).await.unwrap().into_inner();
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(m.fields["domain"].kind, Some(Kind::StringValue("basic".into())));
    let Some(Kind::ListValue(descriptors)) = &m.fields["descriptors"].kind else { panic!("{m:?}") };
    let Some(Kind::StructValue(d)) = &descriptors.values[0].kind else { panic!("{m:?}") };
    let Some(Kind::ListValue(entries)) = &d.fields["entries"].kind else { panic!("{m:?}") };
    assert_eq!(entries.values[0].kind, Some(Kind::StringValue("key1=foo".into())));
    let _ = stop.send(());
}
