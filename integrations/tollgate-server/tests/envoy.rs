//! tollgate-server as Envoy's rate limit service: the binary started on a directory of
//! envoyproxy/ratelimit's YAML, asked over gRPC by tonic's client (as Envoy asks) and over
//! `/json`, reloaded by SIGHUP (a bad file refused, the counts of unchanged rules kept), and
//! stopped by SIGTERM; and a fleet of three of them sharing their rules through one real
//! `redis-server`, killed and restarted mid-run.

#[path = "../../tollgate-redis/tests/common/mod.rs"]
mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const RULES: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

struct Running {
    child: Child,
    grpc: String,
    http: String,
    metrics: String,
    log: PathBuf,
}

impl Running {
    fn signal(&self, name: &str) {
        assert!(Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    }

    fn wait_log(&self, what: &str) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if std::fs::read_to_string(&self.log).unwrap().contains(what) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{what}: {}", std::fs::read_to_string(&self.log).unwrap());
    }

    /// POST /json with `body`: the status line and the body.
    fn json(&self, body: &str) -> (String, String) {
        let addr = self.http.trim_start_matches("http://").trim_end_matches("/json");
        let request = format!(
            "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        exchange(addr, &request)
    }

    /// GET /metrics: the page.
    fn scrape(&self) -> String {
        let addr = self.metrics.trim_start_matches("http://").trim_end_matches("/metrics");
        exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").1
    }
}

/// One HTTP/1.1 exchange on a new connection: the status line and the body.
fn exchange(addr: &str, request: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    let status = got.lines().next().unwrap().to_owned();
    let body = got.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_with(dir: &std::path::Path, log: PathBuf, extra: &[&str]) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .args([
            "--port",
            "0",
            "--metrics",
            "127.0.0.1:0",
            "--envoy-grpc",
            "127.0.0.1:0",
            "--envoy-http",
            "127.0.0.1:0",
        ])
        .arg("--envoy-config")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = |prefix: &str| {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("{l:?}")).to_owned()
    };
    let _resp = line("tollgate-server listening on ");
    let metrics = line("tollgate-server metrics on ");
    let grpc = format!("http://{}", line("tollgate-server envoy grpc on "));
    let http = line("tollgate-server envoy http on ");
    Running { child, grpc, http, metrics, log }
}

/// Statistics as upstream's Prometheus mapping labels them: nested levels, detailed values
/// (an IPv4 address sanitized), a rule in shadow mode.
const STATS: &str = "domain: stats
descriptors:
  - key: tenant
    descriptors:
      - key: path
        descriptors:
          - key: method
            rate_limit: {unit: hour, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    request_in("edge", entries)
}

fn request_in(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

#[test]
fn the_server_answers_envoy_and_reloads_its_rules() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-server-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/edge.yaml"), RULES).unwrap();
    std::fs::write(dir.join("config/stats.yaml"), STATS).unwrap();
    // A dotfile holding the same domain (an editor's swap file, a ConfigMap's `..data`):
    // skipped, as upstream's RUNTIME_IGNOREDOTFILES skips it; read, it would be refused.
    std::fs::write(dir.join("config/.edge.yaml.swp"), RULES).unwrap();
    let log = dir.with_extension("log");
    let running = start_with(&dir, log.clone(), &["--envoy-ignore-dotfiles"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut client = rt.block_on(RateLimitServiceClient::connect(running.grpc.clone())).unwrap();
    let mut ask = |entries: &[(&str, &str)]| {
        let r = rt.block_on(client.should_rate_limit(request(entries))).unwrap().into_inner();
        (r.overall_code, r.statuses[0].limit_remaining)
    };
    let (ok, over) = (1, 2);
    assert_eq!(ask(&[("remote_address", "10.0.0.1")]), (ok, 2));
    assert_eq!(ask(&[("remote_address", "10.0.0.1")]), (ok, 1));
    assert_eq!(ask(&[("path", "/login")]), (ok, 0));
    assert_eq!(ask(&[("path", "/login")]), (over, 0));
    // The same service over /json.
    let (status, body) = running.json(
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#,
    );
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains(r#""overallCode":"OK""#), "{body}");
    let mut stats_client = rt.block_on(RateLimitServiceClient::connect(running.grpc.clone())).unwrap();
    let mut codes = Vec::new();
    for entries in [
        &[("tenant", "acme"), ("path", "/a"), ("method", "GET")][..],
        &[("tenant", "acme"), ("path", "/a"), ("method", "GET")],
        &[("client", "10.0.0.1")],
        &[("shadow", "s")],
        &[("shadow", "s")],
    ] {
        let r =
            rt.block_on(stats_client.should_rate_limit(request_in("stats", entries))).unwrap().into_inner();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [ok, over, ok, ok, ok], "the shadow rule answers OK over its limit");
    // Upstream's statistics, under its Prometheus names, on the server's /metrics.
    let page = running.scrape();
    for series in [
        // Levels past the second add up into key2; a detailed value is its own key1, its
        // IPv4 address's dots sanitized; a shadow rule counts what it let through.
        r#"ratelimit_service_rate_limit_total_hits{domain="stats",key1="tenant",key2="path"} 2"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="stats",key1="tenant",key2="path"} 1"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="stats",key1="client_10_0_0_1"} 1"#,
        r#"ratelimit_service_rate_limit_shadow_mode{domain="stats",key1="shadow"} 1"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="stats",key1="shadow"} 1"#,
        "ratelimit_service_global_shadow_mode 0",
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="path_/login"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address"} 3"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="edge",key1="remote_address"} 3"#,
    ] {
        assert!(page.lines().any(|l| l == series), "{series} in\n{page}");
    }
    // Every decision's time, gRPC's and /json's.
    assert!(page.lines().any(|l| l == "ratelimit_service_decision_seconds_count 10"), "{page}");
    assert!(page.contains("# TYPE ratelimit_service_decision_seconds histogram"), "{page}");
    assert!(page.contains("ratelimit_service_decision_seconds_bucket{le=\"+Inf\"} 10"), "{page}");
    // A bad file is refused on SIGHUP, with its file and line; the rules keep answering.
    std::fs::write(
        dir.join("config/edge.yaml"),
        RULES
            .replace("unit: hour\n      requests_per_unit: 3", "unit: fortnight\n      requests_per_unit: 3"),
    )
    .unwrap();
    running.signal("HUP");
    running.wait_log("Envoy reload refused");
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("config.edge.yaml:5: invalid rate limit unit 'fortnight'"));
    assert_eq!(ask(&[("remote_address", "10.0.0.1")]), (over, 0), "4 of 3: the running rules and counts");
    // A good one applies; the unchanged rule keeps its count, the raised limit applies to it.
    std::fs::write(
        dir.join("config/edge.yaml"),
        RULES.replace("requests_per_unit: 3", "requests_per_unit: 6"),
    )
    .unwrap();
    running.signal("HUP");
    running.wait_log("Envoy configuration reloaded");
    assert_eq!(ask(&[("remote_address", "10.0.0.1")]), (ok, 1), "5 of 6");
    // A changed file reloads without a signal.
    let reloads = || std::fs::read_to_string(&log).unwrap().matches("Envoy configuration reloaded").count();
    let before = reloads();
    std::fs::write(
        dir.join("config/edge.yaml"),
        RULES.replace("requests_per_unit: 3", "requests_per_unit: 9"),
    )
    .unwrap();
    let start = Instant::now();
    while reloads() == before {
        assert!(start.elapsed() < Duration::from_secs(10), "no reload 10 s after the file changed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ask(&[("remote_address", "10.0.0.1")]), (ok, 3), "6 of 9");
    // Envoy closes its connection when the server says it is going away; this client, whose
    // runtime no longer runs, cannot: it is dropped first, with its runtime (which closes its
    // socket).
    let _ = ask;
    drop(client);
    drop(rt);
    running.signal("TERM");
    let start = Instant::now();
    let mut running = running;
    loop {
        if let Some(status) = running.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn a_fleet_of_three_servers_shares_its_limits_through_redis_and_survives_its_loss() {
    let mut redis = common::Server::start(&[]);
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("edge.yaml"),
        RULES.replace("unit: hour\n      requests_per_unit: 3", "unit: day\n      requests_per_unit: 40"),
    )
    .unwrap();
    // upstream's form of the address: host:port.
    let address = format!("127.0.0.1:{}", redis.port);
    let fleet: Vec<Running> = (0..3)
        .map(|i| {
            start_with(
                &dir.join("edge.yaml"),
                dir.join(format!("{i}.log")),
                &[
                    "--envoy-redis",
                    &address,
                    "--envoy-redis-timeout-ms",
                    "200",
                    "--envoy-redis-on-failure",
                    "deny",
                ],
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let day =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400;
    let first_day = day();
    let admitted: u32 = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..30 {
            let url = fleet[i % 3].grpc.clone();
            tasks.push(tokio::spawn(async move {
                let mut client = RateLimitServiceClient::connect(url).await.unwrap();
                let mut ok = 0;
                for _ in 0..4 {
                    let r =
                        client.should_rate_limit(request(&[("remote_address", "10.9.9.9")])).await.unwrap();
                    ok += u32::from(r.into_inner().overall_code == 1);
                }
                ok
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        admitted
    });
    if day() == first_day {
        assert_eq!(admitted, 40, "120 asks of one limit of 40 across three servers");
    } else {
        assert!(admitted <= 80, "{admitted} over two windows of 40");
    }
    // Redis gone: every server answers within its timeout, by its policy (deny).
    redis.kill();
    rt.block_on(async {
        for running in &fleet {
            let mut client = RateLimitServiceClient::connect(running.grpc.clone()).await.unwrap();
            let started = Instant::now();
            let r = client.should_rate_limit(request(&[("remote_address", "10.1.1.1")])).await.unwrap();
            assert_eq!(r.into_inner().overall_code, 2, "denied while Redis is away");
            assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        }
    });
    // Back: decisions return to Redis (the restarted server kept nothing: a fresh count).
    redis.restart();
    rt.block_on(async {
        let mut client = RateLimitServiceClient::connect(fleet[0].grpc.clone()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = client.should_rate_limit(request(&[("remote_address", "10.2.2.2")])).await.unwrap();
            if r.into_inner().overall_code == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "still denied 10 s after Redis came back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
