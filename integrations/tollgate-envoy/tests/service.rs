//! `ShouldRateLimit`'s decisions: the scenarios of envoyproxy/ratelimit's integration test
//! (`basic`, `another`, `share_threshold`, `reload`) and of its Docker scripts (replaces,
//! shadow mode, unlimited, detailed statistics), with upstream's statuses and counters, each
//! asked three ways: in process, over real gRPC (tonic's client against the service on
//! 127.0.0.1, as Envoy asks), and on a real `redis-server` (the Redis backend, Redis's clock).
//! The rest in process, on a wall clock the test moves.

#[path = "../../tollgate-redis/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_envoy::{
    Code, Config, CurrentLimit, HeaderNames, Limits, LoadOptions, OnRedisFailure, RedisBackend, Request,
    RequestDescriptor, RequestError, Response, RuleCounts, Service, Settings, Status, Unit,
};

/// A wall clock at `start` seconds since the epoch, moved by the test.
fn clock(start_s: u64) -> (Arc<AtomicU64>, tollgate_envoy::WallClock) {
    let now = Arc::new(AtomicU64::new(start_s * 1_000_000_000));
    let read = Arc::clone(&now);
    (now, Arc::new(move || read.load(Ordering::Relaxed)))
}

fn limits(files: &[&str], start_s: u64) -> (Arc<AtomicU64>, Limits) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let files: Vec<(String, String)> =
        files.iter().map(|f| ((*f).to_owned(), std::fs::read_to_string(dir.join(f)).unwrap())).collect();
    let config = Config::from_files(files, LoadOptions::default()).unwrap();
    let (now, wall) = clock(start_s);
    (now, Limits::with_clock(config, 1_000, wall).unwrap())
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> Request {
    Request {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RequestDescriptor {
                entries: entries.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                ..RequestDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// (code, requests per unit, unit, remaining) of a status with a limit.
fn limited(s: &Status) -> (Code, u32, Unit, u32) {
    let l = s.current_limit.as_ref().expect("a limit");
    (s.code, l.requests_per_unit, l.unit, s.limit_remaining)
}

/// Where a scenario's requests go.
#[derive(Clone, Copy, Debug)]
enum Via {
    Process,
    Grpc,
    Redis,
}

const VIAS: [Via; 3] = [Via::Process, Via::Grpc, Via::Redis];

/// A service on `files`, asked `via` one way.
struct Asker {
    limits: Arc<Limits>,
    rt: tokio::runtime::Runtime,
    grpc: Option<std::cell::RefCell<RateLimitServiceClient<tonic::transport::Channel>>>,
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
    _redis: Option<common::Server>,
    via: Via,
}

impl Asker {
    /// `via` a service on `files` whose wall clock starts at `start_s` (on Redis, windows are
    /// Redis's: the asker starts early enough in Redis's minute that no minute ends during a
    /// scenario).
    fn new(via: Via, files: &[&str], start_s: u64) -> Asker {
        let limits = limits_of(files, start_s);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (mut grpc, mut stop, mut redis) = (None, None, None);
        let limits = match via {
            Via::Process => Arc::new(limits),
            Via::Grpc => {
                let service = Service::new(limits);
                let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
                let url = format!("http://{}", listener.local_addr().unwrap());
                let (stopper, stopped) = tokio::sync::oneshot::channel::<()>();
                let serving = service.clone();
                rt.spawn(async move {
                    serving
                        .serve(listener, async {
                            let _ = stopped.await;
                        })
                        .await
                        .unwrap();
                });
                grpc =
                    Some(std::cell::RefCell::new(rt.block_on(RateLimitServiceClient::connect(url)).unwrap()));
                stop = Some(stopper);
                service.limits()
            }
            Via::Redis => {
                let server = common::Server::start(&[]);
                let windows = rt
                    .block_on(
                        tollgate_redis::RedisWindows::builder()
                            .url(server.url())
                            .prefix("scenario:")
                            .connect(),
                    )
                    .unwrap();
                while {
                    let time = server.cli(&["TIME"]).unwrap();
                    time.lines().next().unwrap().trim().parse::<u64>().unwrap() % 60 >= 45
                } {
                    std::thread::sleep(Duration::from_millis(200));
                }
                redis = Some(server);
                Arc::new(limits.with_redis(RedisBackend::new(windows, OnRedisFailure::Error)))
            }
        };
        Asker { limits, rt, grpc, _stop: stop, _redis: redis, via }
    }

    fn ask(&self, request: &Request) -> Response {
        match self.via {
            Via::Process => self.limits.should_rate_limit(request).unwrap(),
            Via::Redis => self.rt.block_on(self.limits.should_rate_limit_async(request)).unwrap(),
            Via::Grpc => {
                let mut client = self.grpc.as_ref().unwrap().borrow_mut();
                let r = self.rt.block_on(client.should_rate_limit(to_pb(request))).unwrap().into_inner();
                from_pb(&r)
            }
        }
    }

    fn counts(&self, key: &str) -> RuleCounts {
        self.limits.counts(key)
    }
}

impl Drop for Asker {
    /// On Redis, the scenario's windows were Redis's: its script was called.
    fn drop(&mut self) {
        if let (Via::Redis, false) = (self.via, std::thread::panicking()) {
            assert!(self.limits.redis().unwrap().stats().redis > 0, "no request reached Redis");
        }
    }
}

fn limits_of(files: &[&str], start_s: u64) -> Limits {
    limits(files, start_s).1
}

fn to_pb(r: &Request) -> RateLimitRequest {
    RateLimitRequest {
        domain: r.domain.clone(),
        descriptors: r
            .descriptors
            .iter()
            .map(|d| {
                assert!(d.limit.is_none() && d.hits_addend.is_none(), "the scenarios send neither");
                RateLimitDescriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(k, v)| Entry { key: k.clone(), value: v.clone() })
                        .collect(),
                    ..RateLimitDescriptor::default()
                }
            })
            .collect(),
        hits_addend: r.hits_addend,
    }
}

/// The answer as Envoy reads it: codes, limits, remaining and reset.
fn from_pb(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Response {
    let code = |c: i32| match c {
        1 => Code::Ok,
        2 => Code::OverLimit,
        c => panic!("code {c}"),
    };
    let unit = |u: i32| match PbUnit::try_from(u).unwrap() {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => panic!("unit UNKNOWN"),
    };
    Response {
        overall_code: code(r.overall_code),
        statuses: r
            .statuses
            .iter()
            .map(|s| Status {
                code: code(s.code),
                current_limit: s.current_limit.as_ref().map(|l| CurrentLimit {
                    requests_per_unit: l.requests_per_unit,
                    unit: unit(l.unit),
                    name: l.name.clone(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|d| {
                    Duration::new(u64::try_from(d.seconds).unwrap(), u32::try_from(d.nanos).unwrap())
                }),
            })
            .collect(),
        headers: Vec::new(),
        dynamic_metadata: None,
    }
}

#[test]
fn upstreams_basic_and_another_scenarios() {
    for via in VIAS {
        // 600 s into an hour: the minute and hour windows are mid-way, none ends during the
        // test (on Redis, the asker starts early in Redis's minute).
        basic_and_another(&Asker::new(
            via,
            &["basic.yaml", "another.yaml"],
            1_700_000_000 / 3600 * 3600 + 600,
        ));
    }
}

fn basic_and_another(l: &Asker) {
    // An unknown domain is no error: OK, no limit.
    let r = l.ask(&request("foo", &[&[("hello", "world")]]));
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(
        r.statuses,
        [Status { code: Code::Ok, current_limit: None, limit_remaining: 0, duration_until_reset: None }]
    );

    let r = l.ask(&request("basic", &[&[("key1", "foo")]]));
    assert_eq!((r.overall_code, limited(&r.statuses[0])), (Code::Ok, (Code::Ok, 50, Unit::Second, 49)));
    assert_eq!(l.counts("basic.key1").total_hits, 1);

    for i in 0..25u32 {
        let r = l.ask(&request("another", &[&[("key2", "r1")]]));
        if i < 20 {
            assert_eq!(
                (r.overall_code, limited(&r.statuses[0])),
                (Code::Ok, (Code::Ok, 20, Unit::Minute, 19 - i))
            );
        } else {
            assert_eq!(
                (r.overall_code, limited(&r.statuses[0])),
                (Code::OverLimit, (Code::OverLimit, 20, Unit::Minute, 0))
            );
        }
        let c = l.counts("another.key2");
        assert_eq!((c.total_hits, c.over_limit), (u64::from(i) + 1, u64::from(i.saturating_sub(19))));
    }

    for i in 0..15u32 {
        let r = l.ask(&request("another", &[&[("key2", "r2")], &[("key3", "r2")]]));
        assert_eq!(limited(&r.statuses[0]), (Code::Ok, 20, Unit::Minute, 19 - i));
        let expected =
            if i < 10 { (Code::Ok, 10, Unit::Hour, 9 - i) } else { (Code::OverLimit, 10, Unit::Hour, 0) };
        assert_eq!(limited(&r.statuses[1]), expected, "i = {i}");
        assert_eq!(r.overall_code, r.statuses[1].code);
        let (k2, k3) = (l.counts("another.key2"), l.counts("another.key3"));
        assert_eq!((k2.total_hits, k2.over_limit), (u64::from(i) + 26, 5));
        assert_eq!((k3.total_hits, k3.over_limit), (u64::from(i) + 1, u64::from(i.saturating_sub(9))));
    }
}

#[test]
fn duration_until_reset_counts_down_to_the_windows_end_on_the_epochs_grid() {
    let (now, l) = limits(&["another.yaml"], 86_400 * 20_000 + 100);
    let r = l.should_rate_limit(&request("another", &[&[("key4", "durTest")]])).unwrap();
    assert_eq!(r.statuses[0].duration_until_reset, Some(Duration::from_secs(86_400 - 100)));
    now.fetch_add(2_000_000_000, Ordering::Relaxed);
    let r = l.should_rate_limit(&request("another", &[&[("key4", "durTest")]])).unwrap();
    assert_eq!(r.statuses[0].duration_until_reset, Some(Duration::from_secs(86_400 - 102)));
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 20, Unit::Day, 18));
    // The next day is a new window.
    now.fetch_add((86_400 - 102) * 1_000_000_000, Ordering::Relaxed);
    let r = l.should_rate_limit(&request("another", &[&[("key4", "durTest")]])).unwrap();
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 20, Unit::Day, 19));
    assert_eq!(r.statuses[0].duration_until_reset, Some(Duration::from_secs(86_400)));
}

#[test]
fn a_shared_threshold_is_one_counter_for_every_matching_value() {
    for via in VIAS {
        shared_threshold(&Asker::new(via, &["share_threshold.yaml"], 3_600 * 500_000));
    }
}

fn shared_threshold(l: &Asker) {
    for _ in 0..10 {
        l.ask(&request("share-threshold-test", &[&[("files", "files/a.pdf")]]));
    }
    let r = l.ask(&request("share-threshold-test", &[&[("files", "files/b.csv")]]));
    assert_eq!(
        (r.overall_code, limited(&r.statuses[0])),
        (Code::OverLimit, (Code::OverLimit, 10, Unit::Hour, 0))
    );
    for i in 0..10 {
        let value = format!("files_no_share/{i}");
        let r = l.ask(&request("share-threshold-test", &[&[("files_no_share", &value)]]));
        assert_eq!(limited(&r.statuses[0]), (Code::Ok, 10, Unit::Hour, 9));
    }
}

#[test]
fn a_zero_limit_blocks_every_request() {
    for via in VIAS {
        zero_limit(&Asker::new(via, &["reload.yaml"], 1_000_000));
    }
}

fn zero_limit(l: &Asker) {
    let r = l.ask(&request("reload", &[&[("block", "foo")]]));
    assert_eq!(
        (r.overall_code, limited(&r.statuses[0])),
        (Code::OverLimit, (Code::OverLimit, 0, Unit::Second, 0))
    );
    let r = l.ask(&request("reload", &[&[("key1", "foo")]]));
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 50, Unit::Second, 49));
}

#[test]
fn the_docker_scripts_replaces_shadow_mode_and_unlimited() {
    for via in VIAS {
        docker_scripts(&Asker::new(via, &["example.yaml"], 60 * 30_000_000));
    }
}

fn docker_scripts(l: &Asker) {
    let ask = |descriptors: &[&[(&str, &str)]]| l.ask(&request("rl", descriptors)).overall_code;
    // simple-get: a shadow rule over its limit still answers OK.
    for _ in 0..5 {
        assert_eq!(ask(&[&[("foo", "pelle"), ("baz", "shady")]]), Code::Ok);
    }
    assert!(l.counts("rl.foo.baz_shady").shadow_mode >= 2);
    // trigger-ratelimit: 3 per minute.
    for _ in 0..3 {
        assert_eq!(ask(&[&[("foo", "pelle"), ("baz", "not-so-shady")]]), Code::Ok);
    }
    assert_eq!(ask(&[&[("foo", "pelle"), ("baz", "not-so-shady")]]), Code::OverLimit);
    // replaces (1): banned is 0 per minute; the override rule replaces it.
    assert_eq!(ask(&[&[("foo", "bkthomps"), ("bar", "banned")]]), Code::OverLimit);
    let four = |dest: &str| -> Code {
        ask(&[
            &[("foo", "bkthomps"), ("bar", "banned")],
            &[("source_cluster", "proxy"), ("destination_cluster", dest)],
        ])
    };
    assert_eq!(four("mock"), Code::OverLimit);
    assert_eq!(four("override"), Code::Ok);
    assert_eq!(four("override"), Code::Ok);
    assert_eq!(four("override"), Code::OverLimit);
    // replaces (2): bkthomps (1/min) is replaced while proxy/bkthomps (2/min) applies, and is
    // not counted meanwhile.
    let two = |dest: &str| -> Code {
        ask(&[
            &[("foo", "my_foo"), ("bar", "bkthomps")],
            &[("source_cluster", "proxy"), ("destination_cluster", dest)],
        ])
    };
    assert_eq!(two("bkthomps"), Code::Ok);
    assert_eq!(two("bkthomps"), Code::Ok);
    assert_eq!(two("bkthomps"), Code::OverLimit);
    assert_eq!(two("not_bkthomps"), Code::Ok, "the bkthomps rule was never incremented while replaced");
    assert_eq!(two("not_bkthomps"), Code::OverLimit);
    // Unlimited: OK with u32::MAX remaining and no limit.
    let r = l.ask(&request("rl", &[&[("qux", "x")], &[("foo", "f"), ("bay", "y")]]));
    assert_eq!(
        r.statuses[0],
        Status { code: Code::Ok, current_limit: None, limit_remaining: u32::MAX, duration_until_reset: None }
    );
    assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
    // value-included-in-stats-key: 2 per minute, counted under the request's value.
    assert_eq!(ask(&[&[("unspec", "unspecified_value")]]), Code::Ok);
    assert_eq!(ask(&[&[("unspec", "unspecified_value")]]), Code::Ok);
    assert_eq!(ask(&[&[("unspec", "unspecified_value")]]), Code::OverLimit);
    assert_eq!(l.counts("rl.unspec_unspecified_value").over_limit, 1);
}

#[test]
fn near_and_over_limit_counts_follow_upstreams_arithmetic() {
    let config = Config::from_files(
        [("n.yaml", "domain: n\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 20}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 8}\n")],
        LoadOptions::default(),
    )
    .unwrap();
    let (_now, wall) = clock(3_600 * 1_000);
    let l = Limits::with_clock(config, 100, wall).unwrap();
    let hit = |key: &str, value: &str, hits: u64| {
        let mut r = request("n", &[&[(key, value)]]);
        r.descriptors[0].hits_addend = Some(hits);
        l.should_rate_limit(&r).unwrap().statuses[0].clone()
    };
    // limit 8, near 6: after 7 with 2 hits is OK, 1 near, 2 within.
    hit("b", "x", 5);
    let s = hit("b", "x", 2);
    assert_eq!(limited(&s), (Code::Ok, 8, Unit::Hour, 1));
    assert_eq!(
        l.counts("n.b"),
        RuleCounts { total_hits: 7, near_limit: 1, within_limit: 7, ..RuleCounts::default() }
    );
    // limit 20, near 16: 3 hits to 19 (near 3), then 3 to 22 (over 2, near 1).
    hit("a", "y", 16);
    let s = hit("a", "y", 3);
    assert_eq!(limited(&s), (Code::Ok, 20, Unit::Hour, 1));
    let s = hit("a", "y", 3);
    assert_eq!(limited(&s), (Code::OverLimit, 20, Unit::Hour, 0));
    assert_eq!(
        l.counts("n.a"),
        RuleCounts { total_hits: 22, over_limit: 2, near_limit: 3 + 1, within_limit: 19, shadow_mode: 0 }
    );
    // A descriptor's hits_addend of 0 checks without charging: over only once past the limit.
    let s = hit("a", "z", 20);
    assert_eq!(limited(&s), (Code::Ok, 20, Unit::Hour, 0));
    assert_eq!(hit("a", "z", 0).code, Code::Ok, "20 of 20 is not over");
    hit("a", "z", 1);
    assert_eq!(hit("a", "z", 0).code, Code::OverLimit);
}

#[test]
fn bad_requests_get_upstreams_errors_and_overrides_apply_without_a_rule() {
    let (_now, l) = limits(&["basic.yaml"], 1_000_000);
    assert_eq!(l.should_rate_limit(&request("", &[&[("a", "b")]])), Err(RequestError::EmptyDomain));
    assert_eq!(l.should_rate_limit(&request("basic", &[])), Err(RequestError::NoDescriptors));
    assert_eq!(RequestError::EmptyDomain.to_string(), "rate limit domain must not be empty");
    assert_eq!(RequestError::NoDescriptors.to_string(), "rate limit descriptor list must not be empty");
    // A per-request limit applies whenever the domain exists, matched or not.
    let mut r = request("basic", &[&[("nothing", "here")]]);
    r.descriptors[0].limit = Some((2, Some(Unit::Hour)));
    for remaining in [1, 0] {
        let s = &l.should_rate_limit(&r).unwrap().statuses[0];
        assert_eq!(
            (s.code, s.current_limit.clone(), s.limit_remaining),
            (
                Code::Ok,
                Some(CurrentLimit { requests_per_unit: 2, unit: Unit::Hour, name: String::new() }),
                remaining
            )
        );
    }
    assert_eq!(l.should_rate_limit(&r).unwrap().overall_code, Code::OverLimit);
    assert_eq!(l.counts("basic.nothing_here").total_hits, 3);
    r.descriptors[0].limit = Some((2, None));
    assert!(matches!(l.should_rate_limit(&r), Err(RequestError::OverrideUnit { descriptor: 0 })));
    // No rule, no limit.
    let r = l.should_rate_limit(&request("basic", &[&[("nothing", "here")]])).unwrap();
    assert_eq!(r.statuses[0].current_limit, None);
}

/// Upstream's `requests_per_unit` is a uint32: a day of 100,000,000 counts to it exactly,
/// counted (upstream's) or not (tollgate's), and so does a per-request limit, up to the
/// largest uint32.
#[test]
fn limits_up_to_a_uint32_count_exactly() {
    let yaml = "domain: big\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 100000000}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 100000000, count_rejected_hits: false}\n";
    let config = Config::from_files([("big.yaml", yaml)], LoadOptions::default()).unwrap();
    let (_now, wall) = clock(86_400 * 20_000 + 100);
    let l = Limits::with_clock(config, 10, wall).unwrap();
    let ask = |key: &str, hits: u64, limit: Option<(u32, Option<Unit>)>| {
        let mut r = request("big", &[&[(key, "v")]]);
        r.descriptors[0].hits_addend = Some(hits);
        r.descriptors[0].limit = limit;
        let s = l.should_rate_limit(&r).unwrap().statuses[0].clone();
        (s.code, s.limit_remaining)
    };
    for key in ["a", "b"] {
        assert_eq!(ask(key, 99_999_999, None), (Code::Ok, 1), "{key}");
        assert_eq!(ask(key, 1, None), (Code::Ok, 0), "{key}");
        assert_eq!(ask(key, 1, None), (Code::OverLimit, 0), "{key}");
    }
    // Counted, the refused hit stays; tollgate's window took nothing for it.
    assert_eq!(l.counts("big.a").over_limit, 1);
    // A per-request limit above 2^24 (once a count that never passed it: every request OK).
    let limit = Some((50_000_000, Some(Unit::Day)));
    assert_eq!(ask("c", 49_999_999, limit), (Code::Ok, 1));
    assert_eq!(ask("c", 2, limit), (Code::OverLimit, 0));
    // The largest uint32 too: its count reaches it, and the next hit is past it.
    let config = Config::from_files(
        [("max.yaml", "domain: max\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 4294967295}\n")],
        LoadOptions::default(),
    )
    .unwrap();
    let (_now, wall) = clock(86_400 * 20_000 + 100);
    let l = Limits::with_clock(config, 10, wall).unwrap();
    for (hits, expected) in [(4_294_967_294, (Code::Ok, 1)), (1, (Code::Ok, 0)), (1, (Code::OverLimit, 0))] {
        let mut r = request("max", &[&[("a", "v")]]);
        r.descriptors[0].hits_addend = Some(hits);
        let s = l.should_rate_limit(&r).unwrap().statuses[0].clone();
        assert_eq!((s.code, s.limit_remaining), expected, "{hits} hits");
    }
    // With NEAR_LIMIT_RATIO 1 the near line is the limit itself, which an f32 would round
    // past (2^32): the statistics stay whole (no count goes negative).
    let max =
        "domain: max\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 4294967295}\n";
    let near = inline(max, 86_400 * 20_000 + 100, Settings { near_limit_ratio: 1.0, ..Settings::default() });
    for hits in [4_294_967_294, 3] {
        let mut r = request("max", &[&[("a", "v")]]);
        r.descriptors[0].hits_addend = Some(hits);
        near.should_rate_limit(&r).unwrap();
    }
    let c = near.counts("max.a");
    assert_eq!(
        (c.total_hits, c.within_limit, c.over_limit, c.near_limit),
        (4_294_967_297, 4_294_967_294, 2, 0)
    );
    // And a per-request limit of it.
    let mut r = request("max", &[&[("b", "v")]]);
    r.descriptors[0].limit = Some((u32::MAX, Some(Unit::Day)));
    r.descriptors[0].hits_addend = Some(u64::from(u32::MAX) + 1);
    assert_eq!(l.should_rate_limit(&r).unwrap().statuses[0].code, Code::OverLimit);
}

const QUOTAS: &str = "domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
";

fn inline(yaml: &str, start_s: u64, settings: Settings) -> Limits {
    let config = Config::from_files([("inline.yaml", yaml)], LoadOptions::default()).unwrap();
    let (_now, wall) = clock(start_s);
    Limits::with_clock(config, 100, wall).unwrap().with_settings(settings)
}

#[test]
fn quota_mode_is_over_only_when_every_quota_is() {
    // Upstream's quota script: two quota rules on one request.
    let l = inline(QUOTAS, 60 * 1_000_000, Settings::default());
    let both = request("rl", &[&[("service", "service_1")], &[("service", "service_2")]]);
    assert_eq!(l.should_rate_limit(&both).unwrap().overall_code, Code::Ok);
    let r = l.should_rate_limit(&both).unwrap();
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (Code::OverLimit, Code::Ok));
    assert_eq!(r.overall_code, Code::Ok, "service_2 still has quota");
    assert_eq!(l.should_rate_limit(&both).unwrap().overall_code, Code::OverLimit, "both spent");
    // Token quota: a check with hits 0 is over only once the count passes the limit.
    let mut check = request("rl", &[&[("service", "service_2")]]);
    check.descriptors[0].hits_addend = Some(0);
    assert_eq!(l.should_rate_limit(&check).unwrap().overall_code, Code::OverLimit, "3 of 2");
    // QUOTA_MODE makes every rule a quota: one rule over of two is not over overall.
    let l = inline(QUOTAS, 60 * 1_000_000, Settings { quota_mode: true, ..Settings::default() });
    let mixed = request("rl", &[&[("service", "service_1")], &[("plain", "x")]]);
    l.should_rate_limit(&mixed).unwrap();
    let r = l.should_rate_limit(&mixed).unwrap();
    assert_eq!((r.statuses[0].code, r.overall_code), (Code::OverLimit, Code::Ok));
}

#[test]
fn global_shadow_mode_answers_ok_and_keeps_the_statuses() {
    let l = inline(QUOTAS, 60 * 1_000_000, Settings { shadow_mode: true, ..Settings::default() });
    let one = request("rl", &[&[("service", "service_1")], &[("plain", "x")]]);
    l.should_rate_limit(&one).unwrap();
    let r = l.should_rate_limit(&one).unwrap();
    assert_eq!((r.overall_code, r.statuses[0].code), (Code::Ok, Code::OverLimit));
    assert_eq!(l.global_shadow_mode(), 1);
}

#[test]
fn response_headers_describe_the_most_constraining_status() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    // Upstream's vector: 10 per minute, over, at 2222 s: reset in 58 s.
    let l = inline(
        yaml,
        2222,
        Settings { response_headers: Some(HeaderNames::default()), ..Settings::default() },
    );
    let mut over = request("d", &[&[("a", "x")]]);
    over.descriptors[0].hits_addend = Some(11);
    let r = l.should_rate_limit(&over).unwrap();
    let expected = [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "0"), ("RateLimit-Reset", "58")];
    assert_eq!(r.headers, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    // The least remaining wins; custom names.
    let names = HeaderNames {
        limit: "A-Ratelimit-Limit".into(),
        remaining: "A-Ratelimit-Remaining".into(),
        reset: "A-Ratelimit-Reset".into(),
    };
    let l = inline(yaml, 3600 * 10 + 100, Settings { response_headers: Some(names), ..Settings::default() });
    let r = l.should_rate_limit(&request("d", &[&[("a", "x")], &[("b", "y")]])).unwrap();
    let expected =
        [("A-Ratelimit-Limit", "5"), ("A-Ratelimit-Remaining", "4"), ("A-Ratelimit-Reset", "3500")];
    assert_eq!(r.headers, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    // No limit applied, no headers.
    assert!(l.should_rate_limit(&request("d", &[&[("c", "z")]])).unwrap().headers.is_empty());
}

#[test]
fn a_rules_table_holds_its_values_in_at_most_64_bytes_each() {
    let config = Config::from_files(
        [(
            "m.yaml",
            "domain: m\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        )],
        LoadOptions::default(),
    )
    .unwrap();
    let (_now, wall) = clock(1_000_000);
    let keys = 1 << 16;
    let l = Limits::with_clock(config, keys, wall).unwrap();
    assert_eq!(l.memory(), (0, 0), "no table before the rule is used");
    for i in 0..1_000 {
        l.should_rate_limit(&request("m", &[&[("ip", &format!("10.0.{}.{}", i / 256, i % 256))]])).unwrap();
    }
    let (bytes, tables) = l.memory();
    assert_eq!(tables, 1);
    let per_value = bytes as f64 / keys as f64;
    println!("{bytes} bytes for {keys} values: {per_value:.1} B a value");
    assert!(per_value <= 64.0, "{per_value} B a value");
}

/// Upstream's `TestMetadataReturnedForPassedDescriptors`, `...ForAllPassedDescriptors` and
/// `TestOverlappingMetadataReturnsTheFirstValue`, under QUOTA_MODE and
/// RESPONSE_DYNAMIC_METADATA.
#[test]
fn dynamic_metadata_carries_the_request_and_the_passed_rules_metadata() {
    use tollgate_envoy::Metadata;
    let yaml = |second: &str| {
        format!(
            "domain: quota-domain
descriptors:
  - key: regular
    value: limit
    rate_limit: {{unit: minute, requests_per_unit: 10}}
    metadata: {{name: service_1, nested: {{a: 1}}}}
  - key: quota
    value: limit
    rate_limit: {{unit: minute, requests_per_unit: 5}}
    metadata: {{{second}: service_2, nested: {{a: 2, b: 3}}}}
"
        )
    };
    let settings = Settings { quota_mode: true, dynamic_metadata: true, ..Settings::default() };
    let ask = |l: &Limits, quota_hits: u64| {
        let mut r = request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]]);
        r.descriptors[1].hits_addend = Some(quota_hits);
        l.should_rate_limit(&r).unwrap()
    };
    let field = |m: &Metadata, name: &str| match m {
        Metadata::Struct(fields) => fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        _ => None,
    };
    let text = |s: &str| Some(Metadata::String(s.into()));

    // The quota descriptor fails: only the first one's metadata.
    let l = inline(&yaml("some_other_name"), 1_700_000_040, settings.clone());
    let r = ask(&l, 6);
    assert_eq!(r.overall_code, Code::Ok);
    let m = r.dynamic_metadata.unwrap();
    assert_eq!(field(&m, "domain"), text("quota-domain"));
    let Some(Metadata::List(descriptors)) = field(&m, "descriptors") else { panic!("{m:?}") };
    assert_eq!(
        field(&descriptors[0], "entries"),
        Some(Metadata::List(vec![Metadata::String("regular=limit".into())]))
    );
    assert_eq!(field(&descriptors[1], "hitsAddend"), Some(Metadata::Number(6.0)));
    assert_eq!(field(&m, "hitsAddend"), Some(Metadata::Number(1.0)));
    let passed = field(&m, "metadata").unwrap();
    assert_eq!(field(&passed, "name"), text("service_1"));
    assert_eq!(field(&passed, "some_other_name"), None);

    // Both pass: both rules' keys, nested structs merged, the first value kept.
    let l = inline(&yaml("some_other_name"), 1_700_000_040, settings.clone());
    let passed = field(&ask(&l, 1).dynamic_metadata.unwrap(), "metadata").unwrap();
    assert_eq!(
        (field(&passed, "name"), field(&passed, "some_other_name")),
        (text("service_1"), text("service_2"))
    );
    let nested = field(&passed, "nested").unwrap();
    assert_eq!(
        (field(&nested, "a"), field(&nested, "b")),
        (Some(Metadata::Number(1.0)), Some(Metadata::Number(3.0)))
    );

    // Overlapping keys: the first value.
    let l = inline(&yaml("name"), 1_700_000_040, settings.clone());
    let passed = field(&ask(&l, 1).dynamic_metadata.unwrap(), "metadata").unwrap();
    assert_eq!(field(&passed, "name"), text("service_1"));

    // Off by default, as upstream's.
    let l = inline(&yaml("name"), 1_700_000_040, Settings::default());
    assert_eq!(ask(&l, 1).dynamic_metadata, None);
}

/// A rule's table is sized for `keys_per_rule` values: past what it holds, a new value is
/// answered over the limit (never admitted uncounted) until a window ends and frees room;
/// values already held keep their counts meanwhile.
#[test]
fn a_full_table_refuses_new_values_until_a_window_ends() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let config = Config::from_files(
        [("another.yaml", std::fs::read_to_string(dir.join("another.yaml")).unwrap())],
        LoadOptions::default(),
    )
    .unwrap();
    let start = 86_400 * 20_000 + 100;
    let (now, wall) = clock(start);
    let l = Limits::with_clock(config, 64, wall).unwrap();
    let ask = |value: &str| {
        l.should_rate_limit(&request("another", &[&[("key4", value)]])).unwrap().statuses[0].clone()
    };
    // 640 new values: the table holds at least the 64 it was sized for, at most its capacity.
    let refused: Vec<usize> = (0..640).filter(|i| ask(&format!("v{i}")).code == Code::OverLimit).collect();
    let held = 640 - refused.len();
    assert!((64..=4 * 64).contains(&held), "{held} values held, 64 asked for");
    // Full: a refused value stays over the limit; a held one keeps its count (20 a day).
    let first_refused = format!("v{}", refused[0]);
    assert_eq!(limited(&ask(&first_refused)), (Code::OverLimit, 20, Unit::Day, 0));
    let first_held = format!("v{}", (0..640).find(|i| !refused.contains(i)).unwrap());
    assert_eq!(limited(&ask(&first_held)), (Code::Ok, 20, Unit::Day, 18));
    // The day ends: its counts are gone, and there is room again.
    now.fetch_add(86_400 * 1_000_000_000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(limited(&ask(&first_refused)), (Code::Ok, 20, Unit::Day, 19));
}
