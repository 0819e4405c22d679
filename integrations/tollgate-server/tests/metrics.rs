//! GET /metrics scraped over loopback from the binary, and read with a real Prometheus text
//! parser (`prometheus-parse`): the server's counts and the decisions of each declared quota,
//! exact, and one `undeclared` series for the quotas clients make up.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Running {
    child: Child,
    port: u16,
    metrics: String,
}

impl Running {
    fn start() -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
            .args(["--port", "0", "--capacity", "1000", "--quota", "15:30:60", "--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut first, mut second) = (String::new(), String::new());
        out.read_line(&mut first).unwrap();
        out.read_line(&mut second).unwrap();
        let port = first.trim().rsplit(':').next().unwrap().parse().unwrap();
        let metrics = second.trim().rsplit(' ').next().unwrap().trim_start_matches("http://").to_owned();
        let metrics = metrics.trim_end_matches("/metrics").to_owned();
        assert!(second.starts_with("tollgate-server metrics on http://127.0.0.1:"), "{second}");
        Running { child, port, metrics }
    }

    fn send(&self, commands: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("{commands}QUIT\r\n").as_bytes()).unwrap();
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        got
    }

    /// `GET path` over HTTP/1.1: the status code and the body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.metrics).as_bytes(),
        )
        .unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        let (head, body) = got.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        if path == "/metrics" {
            assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
        }
        (status, body.to_owned())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every sample of a scrape, by name and sorted labels.
fn samples(text: &str) -> HashMap<String, f64> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the page parses as Prometheus text");
    scrape
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            };
            (format!("{}{{{}}}", s.metric, labels.join(",")), value)
        })
        .collect()
}

#[test]
fn a_scrape_reads_the_server_s_counts_exactly() {
    let server = Running::start();
    // 17 calls on the declared quota (16 admitted, then limited), 2 on a made-up one (burst 1).
    let mut commands = "CL.THROTTLE user 15 30 60\r\n".repeat(17);
    commands.push_str(&"CL.THROTTLE user 0 1 60\r\n".repeat(2));
    commands.push_str("NOPE\r\n");
    server.send(&commands);
    let (status, page) = server.get("/metrics");
    assert_eq!(status, 200);
    let s = samples(&page);
    let at = |k: &str| *s.get(k).unwrap_or_else(|| panic!("no {k} in\n{page}"));
    assert_eq!(at("tollgate_server_decisions_total{outcome=allowed,quota=15:30:60}"), 16.0);
    assert_eq!(at("tollgate_server_decisions_total{outcome=denied,quota=15:30:60}"), 1.0);
    assert_eq!(at("tollgate_server_decisions_total{outcome=allowed,quota=undeclared}"), 1.0);
    assert_eq!(at("tollgate_server_decisions_total{outcome=denied,quota=undeclared}"), 1.0);
    assert_eq!(at("tollgate_server_throttle_calls_total{}"), 19.0);
    assert_eq!(at("tollgate_server_throttle_limited_total{}"), 2.0);
    assert_eq!(at("tollgate_server_unknown_commands_total{}"), 1.0);
    assert_eq!(at("tollgate_server_quotas{kind=declared}"), 1.0);
    assert_eq!(at("tollgate_server_quotas{kind=undeclared}"), 1.0);
    assert_eq!(at("tollgate_server_keys{kind=declared}"), 1.0);
    assert!(at("tollgate_server_keys_capacity{kind=declared}") >= 1000.0);
    // No series per key: the label values are quotas and kinds, never "user".
    assert!(!page.contains("user"), "{page}");
    // Counters only grow: a second scrape after more calls.
    server.send("CL.THROTTLE other 15 30 60\r\n");
    let s2 = samples(&server.get("/metrics").1);
    assert_eq!(s2["tollgate_server_decisions_total{outcome=allowed,quota=15:30:60}"], 17.0);
    assert_eq!(server.get("/other").0, 404);
}
