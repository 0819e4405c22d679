//! The Redis backend on a real `redis-server`: a fleet of three services sharing one limit
//! admits no more than it, one script call per request whatever the number of descriptors,
//! upstream's verdicts unchanged, and each failure policy honoured, within the timeout, while
//! Redis is killed and restarted; leased rules within their limit; a fleet on a Redis Cluster.

#[path = "../../tollgate-redis/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Server;
use tollgate_envoy::{
    Code, Config, Limits, LoadOptions, OnRedisFailure, RedisBackend, Request, RequestDescriptor, RequestError,
};
use tollgate_redis::RedisWindows;

const RULES: &str = "domain: fleet
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 30}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: method
    rate_limit: {unit: day, requests_per_unit: 1000000, count_rejected_hits: false}
  - key: login
    rate_limit: {unit: second, requests_per_unit: 2, unit_multiplier: 3600, count_rejected_hits: false}
";

fn config(yaml: &str) -> Config {
    Config::from_files([("fleet.yaml", yaml)], LoadOptions::default()).unwrap()
}

async fn service(server: &Server, on_failure: OnRedisFailure, timeout: Duration) -> Limits {
    let windows = RedisWindows::builder()
        .url(server.url())
        .prefix("envoy-test:")
        .timeout(timeout)
        .breaker(2, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    Limits::new(config(RULES), 1_000).unwrap().with_redis(RedisBackend::new(windows, on_failure))
}

/// `size` services on `rules`, sharing Redis at `urls` (a Cluster's nodes when `cluster`)
/// under `prefix`, their leases living at most `lease_ttl`.
async fn fleet(
    size: usize,
    urls: Vec<String>,
    cluster: bool,
    prefix: &str,
    rules: &str,
    lease_ttl: Duration,
) -> Vec<Arc<Limits>> {
    let mut fleet = Vec::new();
    for _ in 0..size {
        let builder = RedisWindows::builder().prefix(prefix).timeout(Duration::from_secs(2));
        let builder = if cluster { builder.cluster(urls.clone()) } else { builder.url(urls[0].clone()) };
        let leases =
            tollgate_redis::LeasedWindows::new(builder.connect().await.unwrap()).lease_ttl(lease_ttl);
        let backend = RedisBackend::with_leases(leases, OnRedisFailure::Error);
        fleet.push(Arc::new(Limits::new(config(rules), 1_000).unwrap().with_redis(backend)));
    }
    fleet
}

fn request(entries: &[(&str, &str)]) -> Request {
    Request {
        domain: "fleet".into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| RequestDescriptor {
                entries: vec![((*k).into(), (*v).into())],
                ..RequestDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// Days since the epoch now: the test's day windows are this one, unless the run straddles
/// midnight.
fn day() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400
}

#[test]
fn a_fleet_of_three_shares_one_limit_in_one_call_per_request() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let fleet: Vec<Arc<Limits>> = vec![
            Arc::new(service(&server, OnRedisFailure::Error, Duration::from_secs(2)).await),
            Arc::new(service(&server, OnRedisFailure::Error, Duration::from_secs(2)).await),
            Arc::new(service(&server, OnRedisFailure::Error, Duration::from_secs(2)).await),
        ];
        let first_day = day();
        // 3 instances × 20 callers × 5 requests of three descriptors each, on one client.
        let mut tasks = Vec::new();
        for i in 0..60 {
            let limits = Arc::clone(&fleet[i % 3]);
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..5 {
                    let r = request(&[("client", "c1"), ("path", "/a"), ("method", "GET")]);
                    let response = limits.should_rate_limit_async(&r).await.unwrap();
                    assert_eq!(response.statuses.len(), 3);
                    if response.overall_code == Code::Ok {
                        ok += 1;
                    }
                }
                ok
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        let windows = if day() == first_day { 1 } else { 2 };
        assert!(admitted <= 30 * windows, "admitted {admitted} over {windows} window(s) of 30");
        if windows == 1 {
            assert_eq!(admitted, 30, "a refusal that should not happen");
        }
        // One script call per request, whatever its three descriptors.
        let calls: u64 = fleet.iter().map(|l| l.redis().unwrap().stats().redis).sum();
        assert_eq!(calls, 300);
        let stats = server.cli(&["INFO", "commandstats"]).unwrap();
        // Calls that ran: a first EVALSHA of the script answered NOSCRIPT (once per caller
        // that raced to it) is followed by its EVAL, and counted as failed.
        let field = |line: &str, name: &str| -> u64 {
            line.split([':', ',']).find_map(|f| f.strip_prefix(name)).map_or(0, |v| v.parse().unwrap())
        };
        let evals: u64 = stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .map(|l| field(l, "calls=") - field(l, "failed_calls=") - field(l, "rejected_calls="))
            .sum();
        assert_eq!(evals, 300, "{stats}");
        // Upstream's counting: the refused hits counted too, on every instance's view.
        assert_eq!(
            fleet[0].counts("fleet.client").total_hits
                + fleet[1].counts("fleet.client").total_hits
                + fleet[2].counts("fleet.client").total_hits,
            300
        );
    });
}

#[test]
fn a_request_naming_one_counter_twice_counts_it_twice() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let l = service(&server, OnRedisFailure::Error, Duration::from_secs(2)).await;
        let r = l
            .should_rate_limit_async(&request(&[("login", "u"), ("login", "u"), ("login", "u")]))
            .await
            .unwrap();
        let codes: Vec<Code> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
        assert_eq!(r.statuses[1].limit_remaining, 0);
    });
}

/// nginx's limit_req on Redis: two services on one `rate=1r/s burst=4 nodelay` pass the
/// burst and the one that leaks (5), and at most the run's leak beside them.
#[test]
fn nginx_on_redis_passes_its_burst_across_a_fleet() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let yaml = "domain: fleet\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: nginx, burst: 4}\n";
        let fleet = fleet(2, vec![server.url()], false, "nginx-test:", yaml, Duration::from_millis(50)).await;
        let started = Instant::now();
        let mut admitted = 0;
        for i in 0..20 {
            let r = fleet[i % 2].should_rate_limit_async(&request(&[("a", "x")])).await.unwrap();
            admitted += u64::from(r.overall_code == Code::Ok);
        }
        let seconds = started.elapsed().as_secs();
        assert!((5..=5 + seconds).contains(&admitted), "admitted {admitted} in {seconds} s");
        assert_eq!(fleet.iter().map(|l| l.redis().unwrap().stats().redis).sum::<u64>(), 20);
    });
}

#[test]
fn each_failure_policy_answers_within_the_timeout_while_redis_is_away() {
    let mut server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let timeout = Duration::from_millis(200);
        let error = service(&server, OnRedisFailure::Error, timeout).await;
        let allow = service(&server, OnRedisFailure::Allow, timeout).await;
        let deny = service(&server, OnRedisFailure::Deny, timeout).await;
        let local = service(&server, OnRedisFailure::Local, timeout).await;
        let login = request(&[("login", "away")]);
        // Two of the two an hour go to Redis before it dies.
        for l in [&error, &local] {
            assert_eq!(l.should_rate_limit_async(&login).await.unwrap().overall_code, Code::Ok);
        }
        server.kill();
        for round in 0..4 {
            let started = Instant::now();
            let e = error.should_rate_limit_async(&login).await.unwrap_err();
            assert!(matches!(e, RequestError::Unavailable(_)), "{e}");
            let a = allow.should_rate_limit_async(&login).await.unwrap();
            assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (Code::Ok, 2));
            let d = deny.should_rate_limit_async(&login).await.unwrap();
            assert_eq!(d.overall_code, Code::OverLimit);
            // The embedded table decides alone: two an hour, from its own count.
            let l = local.should_rate_limit_async(&login).await.unwrap();
            assert_eq!(l.overall_code, if round < 2 { Code::Ok } else { Code::OverLimit }, "round {round}");
            // Four calls, each bounded by the timeout (or the open breaker's fast failure).
            assert!(started.elapsed() < 4 * timeout + Duration::from_millis(200), "{:?}", started.elapsed());
        }
        server.restart();
        // Back to Redis once a probe succeeds: the count there is the one left before the kill
        // (the restarted server kept nothing: it had no persistence), so two more pass.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match error.should_rate_limit_async(&login).await {
                Ok(r) => {
                    assert_eq!(r.overall_code, Code::Ok);
                    break;
                }
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("Redis did not come back: {e}"),
            }
        }
        assert!(error.redis().unwrap().stats().breaker_trips >= 1);
    });
}

const LEASED: &str = "domain: fleet
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 600, lease: true}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1000000, lease: true}
";

/// Leased rules: three services, 20 callers each, on one hot value of a 600-a-day rule and a
/// 1,000,000-a-day one: together they admit at most the 600 (fewer only by the units left in
/// other instances' leases), and the hot values take far fewer script calls than upstream's
/// two commands a descriptor.
#[test]
fn leased_rules_stay_within_the_limit_with_few_round_trips() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let fleet = fleet(3, vec![server.url()], false, "leased:", LEASED, Duration::from_secs(3600)).await;
        let first_day = day();
        let mut tasks = Vec::new();
        for i in 0..60 {
            let limits = Arc::clone(&fleet[i % 3]);
            tasks.push(tokio::spawn(async move {
                let (mut tenant_ok, mut path_ok) = (0u32, 0u32);
                for _ in 0..20 {
                    let r = request(&[("tenant", "t1"), ("path", "/a")]);
                    let response = limits.should_rate_limit_async(&r).await.unwrap();
                    tenant_ok += u32::from(response.statuses[0].code == Code::Ok);
                    path_ok += u32::from(response.statuses[1].code == Code::Ok);
                }
                (tenant_ok, path_ok)
            }));
        }
        let (mut tenant, mut path) = (0, 0);
        for t in tasks {
            let (a, b) = t.await.unwrap();
            tenant += a;
            path += b;
        }
        if day() != first_day {
            return; // The run straddled midnight: two windows, nothing exact to say.
        }
        assert_eq!(path, 1200);
        // Never more than the limit; fewer only by what sits in another instance's lease when
        // an instance finds the window empty: at most one lease (60) per instance.
        assert!(tenant <= 600, "admitted {tenant} of 600");
        assert!(tenant >= 600 - 3 * 60, "admitted {tenant} of 600");
        let calls: u64 = fleet.iter().map(|l| l.redis().unwrap().stats().redis).sum();
        // Upstream's pattern: 2 commands per descriptor, 2 descriptors, 1,200 requests. The
        // 600 refusals of the tenant rule each find its window empty in Redis.
        assert!(calls <= 600 + 4800 / 10, "{calls} script calls for 1200 requests");
    });
}

/// On a 3-master Redis Cluster: two services share one limit across the masters (a request's
/// three descriptors fall on different slots, one script call per slot, sent at once), the
/// leased rules too, and every master holds some of the windows.
#[test]
fn a_fleet_on_a_redis_cluster_shares_one_limit() {
    let cluster = common::Cluster::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let rules = format!(
            "{RULES}  - key: tenant\n    rate_limit: {{unit: day, requests_per_unit: 600, lease: true}}\n"
        );
        let fleet = fleet(2, cluster.urls(), true, "envoy-cluster:", &rules, Duration::from_millis(50)).await;
        let first_day = day();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let limits = Arc::clone(&fleet[i % 2]);
            tasks.push(tokio::spawn(async move {
                let (mut client_ok, mut tenant_ok) = (0u32, 0u32);
                for j in 0..10 {
                    let r = request(&[("client", "c1"), ("path", &format!("/{j}")), ("tenant", "t1")]);
                    let response = limits.should_rate_limit_async(&r).await.unwrap();
                    client_ok += u32::from(response.statuses[0].code == Code::Ok);
                    assert_eq!(response.statuses[1].code, Code::Ok);
                    tenant_ok += u32::from(response.statuses[2].code == Code::Ok);
                }
                (client_ok, tenant_ok)
            }));
        }
        let (mut client, mut tenant) = (0, 0);
        for t in tasks {
            let (a, b) = t.await.unwrap();
            client += a;
            tenant += b;
        }
        if day() == first_day {
            assert_eq!(client, 30, "upstream's window of 30 a day, shared on the cluster");
        } else {
            assert!(client <= 60);
        }
        assert_eq!(tenant, 200, "the leased rule's 600 a day are far off");
        let calls: u64 = fleet.iter().map(|l| l.redis().unwrap().stats().redis).sum();
        assert!((200..=600).contains(&calls), "{calls} script calls for 200 requests of 3 descriptors");
        let masters_used = cluster
            .nodes
            .iter()
            .filter(|n| n.cli(&["DBSIZE"]).is_some_and(|s| s.trim().parse::<u64>().unwrap_or(0) > 0))
            .count();
        assert!(masters_used >= 2, "the windows all fell on one master");
    });
}

/// Token buckets and sliding windows on Redis: three services on one bucket of burst 20
/// (refilling one token a second) admit the burst and at most the refill of the run's seconds
/// beside it, on one sliding window of 10 a minute its 10, and a request with a fixed window,
/// a bucket and a sliding window is one script call.
#[test]
fn token_buckets_on_redis_share_one_bucket_in_the_same_call() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let rules = "domain: fleet
descriptors:
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 20}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
";
        let fleet =
            fleet(3, vec![server.url()], false, "bucket-test:", rules, Duration::from_millis(50)).await;
        let started = Instant::now();
        let minute =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60;
        let first_minute = minute();
        let mut tasks = Vec::new();
        for i in 0..30 {
            let limits = Arc::clone(&fleet[i % 3]);
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut user_ok) = (0u64, 0u64);
                for _ in 0..4 {
                    let r = request(&[("api", "k"), ("path", "/"), ("user", "u")]);
                    let response = limits.should_rate_limit_async(&r).await.unwrap();
                    assert_eq!(response.statuses[1].code, Code::Ok);
                    ok += u64::from(response.statuses[0].code == Code::Ok);
                    user_ok += u64::from(response.statuses[2].code == Code::Ok);
                }
                (ok, user_ok)
            }));
        }
        let (mut admitted, mut users) = (0, 0);
        for t in tasks {
            let (a, b) = t.await.unwrap();
            admitted += a;
            users += b;
        }
        if minute() == first_minute {
            assert_eq!(users, 10, "the sliding window's 10 a minute");
        } else {
            assert!(users <= 20, "{users} over two minutes' windows of 10");
        }
        let seconds = started.elapsed().as_secs();
        assert!(admitted >= 20, "a refusal that should not happen: {admitted}");
        assert!(admitted <= 20 + seconds + 1, "admitted {admitted} in {seconds} s of a 20 + 1/s bucket");
        let calls: u64 = fleet.iter().map(|l| l.redis().unwrap().stats().redis).sum();
        assert_eq!(calls, 120, "one script call per request of a window, a bucket and a sliding window");
        // A refusal reports the time until the bucket is full again: at most 20 s.
        let r = fleet[0].should_rate_limit_async(&request(&[("api", "k")])).await.unwrap();
        if r.statuses[0].code == Code::OverLimit {
            assert!(r.statuses[0].duration_until_reset.unwrap() <= Duration::from_secs(20));
        }
    });
}

/// On Redis, a window's `duration_until_reset` is counted on the clock that decided it,
/// Redis's: an instance whose own clock is half an hour off still tells a client when Redis's
/// window ends (embedded, its own clock decides, and its reset follows it).
#[test]
fn the_reset_is_counted_on_the_clock_that_decided() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        const SKEW: u64 = 1_800;
        let skewed: tollgate_envoy::WallClock = Arc::new(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            u64::try_from(now.as_nanos()).unwrap() + SKEW * 1_000_000_000
        });
        let rules =
            "domain: fleet\ndescriptors:\n  - key: h\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
        let windows = RedisWindows::builder().url(server.url()).prefix("reset:").connect().await.unwrap();
        let on_redis = Limits::with_clock(config(rules), 1_000, Arc::clone(&skewed))
            .unwrap()
            .with_redis(RedisBackend::new(windows, OnRedisFailure::Error));
        let embedded = Limits::with_clock(config(rules), 1_000, skewed).unwrap();
        let redis_secs =
            || -> u64 { server.cli(&["TIME"]).unwrap().lines().next().unwrap().trim().parse().unwrap() };
        // Seconds to the end of the hour, upstream's formula, and the distance of two resets
        // on the hour's circle.
        let to_end = |secs: u64| 3_600 - secs % 3_600;
        let apart = |a: u64, b: u64| a.abs_diff(b).min(3_600 - a.abs_diff(b));
        for _ in 0..3 {
            let before = redis_secs();
            let r = on_redis.should_rate_limit_async(&request(&[("h", "x")])).await.unwrap();
            let reset = r.statuses[0].duration_until_reset.unwrap().as_secs();
            assert!(
                apart(reset, to_end(before)) <= 2,
                "reset {reset}, Redis's hour ends in {}",
                to_end(before)
            );
            let local = embedded.should_rate_limit(&request(&[("h", "x")])).unwrap();
            let local = local.statuses[0].duration_until_reset.unwrap().as_secs();
            assert!(apart(local, to_end(before + SKEW)) <= 2, "embedded reset {local}");
            assert!(apart(local, reset) >= SKEW - 4, "the two clocks' resets {local} and {reset}");
        }
    });
}

/// Odd requests on the Redis backend: a descriptor of 10,000 entries (no rule that deep: no
/// call), a 1 MiB value (a 1 MiB key in Redis, decided and counted like any other), and the
/// largest hits: answers, and the service keeps serving.
#[test]
fn odd_requests_on_redis_are_answered() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let l = service(&server, OnRedisFailure::Error, Duration::from_secs(2)).await;
        let long: Vec<(String, String)> = (0..10_000).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let mut r = request(&[]);
        r.descriptors.push(RequestDescriptor { entries: long, ..RequestDescriptor::default() });
        let answer = l.should_rate_limit_async(&r).await.unwrap();
        assert_eq!((answer.overall_code, answer.statuses[0].current_limit.as_ref()), (Code::Ok, None));
        assert_eq!(l.redis().unwrap().stats().redis, 0);
        let big = "x".repeat(1 << 20);
        for remaining in [29, 28] {
            let answer = l.should_rate_limit_async(&request(&[("client", &big)])).await.unwrap();
            assert_eq!((answer.overall_code, answer.statuses[0].limit_remaining), (Code::Ok, remaining));
        }
        let mut huge = request(&[("client", "huge")]);
        huge.descriptors[0].hits_addend = Some(u64::MAX);
        let answer = l.should_rate_limit_async(&huge).await.unwrap();
        assert_eq!(answer.overall_code, Code::OverLimit);
        let answer = l.should_rate_limit_async(&request(&[("client", "after")])).await.unwrap();
        assert_eq!((answer.overall_code, answer.statuses[0].limit_remaining), (Code::Ok, 29));
        assert_eq!(server.cli(&["PING"]).unwrap().trim(), "PONG");
    });
}

/// On Redis too, a rule counts to its uint32 `requests_per_unit` exactly (the window's count as
/// wide as the limit), counted or not.
#[test]
fn limits_above_2_24_count_exactly_on_redis() {
    let server = Server::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let rules = "domain: fleet\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 100000000}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 100000000, count_rejected_hits: false}\n";
        let windows = RedisWindows::builder().url(server.url()).prefix("wide:").connect().await.unwrap();
        let l = Limits::new(config(rules), 10).unwrap().with_redis(RedisBackend::new(windows, OnRedisFailure::Error));
        let first_day = day();
        let mut answers = Vec::new();
        for (key, hits) in [("a", 99_999_999), ("a", 1), ("a", 1), ("b", 99_999_999), ("b", 1), ("b", 1)] {
            let mut r = request(&[(key, "v")]);
            r.descriptors[0].hits_addend = Some(hits);
            let s = l.should_rate_limit_async(&r).await.unwrap().statuses[0].clone();
            answers.push((s.code, s.limit_remaining));
        }
        if day() == first_day {
            let expected = [(Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)];
            assert_eq!(answers, [expected, expected].concat());
        }
        assert_eq!(l.redis().unwrap().stats().redis, 6);
    });
}
