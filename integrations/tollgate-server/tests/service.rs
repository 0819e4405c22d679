//! The server as a service, with real files and real signals: a TOML file read at start and
//! again on SIGHUP (a bad one refused with its line, the running configuration kept),
//! `--check-config`, and SIGTERM with a connection in flight (every request it sent answered,
//! no new connection accepted, the process gone within its shutdown timeout).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tollgate-service-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        // Written aside and renamed, as an operator's tools do, so that a reload never reads
        // half a file.
        let aside = self.0.join(format!("{name}.new"));
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The binary on a configuration file, its log (standard error) in `log`; killed on drop.
struct Running {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Running {
    fn start(config: &Path, log: PathBuf) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
            .arg("--config")
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let port = first.trim().rsplit(':').next().unwrap().parse().unwrap_or_else(|_| panic!("{first:?}"));
        Running { child, port, log }
    }

    fn signal(&self, name: &str) {
        let status =
            Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// One command on a new connection, after `AUTH` when `password` is given: the reply.
    fn ask(&self, password: Option<&str>, command: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut expect = 0;
        if let Some(p) = password {
            s.write_all(format!("AUTH {p}\r\n").as_bytes()).unwrap();
            expect = 5; // +OK\r\n
        }
        s.write_all(format!("{command}\r\nQUIT\r\n").as_bytes()).unwrap();
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        assert!(got.len() >= expect, "{got:?}");
        got[expect..].trim_end_matches("+OK\r\n").to_owned()
    }

    /// Waits until `ok` holds of the log, or fails with it.
    fn wait_log(&self, what: &str, ok: impl Fn(&str) -> bool) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if ok(&self.log()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{what}: {}", self.log());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ONE_QUOTA: &str = r#"
[[listener]]
bind = "127.0.0.1:0"

[quotas]
capacity = 1000

[[quota]]
max_burst = 15
count = 30
period = 60
"#;

#[test]
fn sighup_reloads_the_file_and_a_bad_file_keeps_the_running_configuration() {
    let dir = Scratch::new("reload");
    let path = dir.write("tollgate.toml", ONE_QUOTA);
    let server = Running::start(&path, dir.0.join("log"));
    let info = server.ask(None, "INFO");
    assert!(info.contains("quotas_declared:1\r\n"), "{info}");
    assert!(server.ask(None, "CL.THROTTLE k 15 30 60").starts_with("*5\r\n:0\r\n:16\r\n:15\r\n"));

    // A second quota and a password, applied live: strangers are now refused, the first
    // quota's key keeps its state (15 left, then 14).
    let two = format!("{ONE_QUOTA}\n[[quota]]\nmax_burst = 1\ncount = 2\nperiod = 3\n\n[[user]]\nname = \"default\"\npassword = \"s3cret\"\n");
    dir.write("tollgate.toml", &two);
    server.signal("HUP");
    server.wait_log("the reload", |log| log.contains("reloaded"));
    assert_eq!(server.ask(None, "PING"), "-NOAUTH Authentication required.\r\n");
    let info = server.ask(Some("s3cret"), "INFO");
    assert!(info.contains("quotas_declared:2\r\n"), "{info}");
    let again = server.ask(Some("s3cret"), "CL.THROTTLE k 15 30 60");
    assert!(again.starts_with("*5\r\n:0\r\n:16\r\n:14\r\n"), "state kept across the reload: {again:?}");

    // A bad file: refused with its line and key, and the running configuration kept.
    dir.write("tollgate.toml", &format!("{two}\n[quotas]\nmax_undeclared = -1\n"));
    server.signal("HUP");
    server.wait_log("the refusal", |log| log.contains("reload refused"));
    let log = server.log();
    assert!(log.contains("tollgate.toml:"), "the file and line: {log}");
    assert_eq!(server.ask(None, "PING"), "-NOAUTH Authentication required.\r\n");
    assert!(server.ask(Some("s3cret"), "INFO").contains("quotas_declared:2\r\n"));
}

#[test]
fn sigterm_answers_what_was_sent_then_stops() {
    let dir = Scratch::new("stop");
    let path = dir.write("tollgate.toml", &format!("{ONE_QUOTA}\n[server]\nshutdown_timeout_secs = 5\n"));
    let mut server = Running::start(&path, dir.0.join("log"));
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // Warm the connection up (so that the server has accepted it), then send a pipelined
    // batch and SIGTERM at once.
    s.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    s.read_exact(&mut pong).unwrap();
    let batch = "CL.THROTTLE k 15 30 60\r\n".repeat(1000);
    s.write_all(batch.as_bytes()).unwrap();
    let stopped_at = Instant::now();
    server.signal("TERM");
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap(); // to the server's close
    assert_eq!(got.matches("*5\r\n").count(), 1000, "every request sent was answered");
    assert_eq!(got.matches(":0\r\n:16\r\n").count(), 16, "as one bucket answers them");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(stopped_at.elapsed() < Duration::from_secs(5), "within the shutdown timeout");
    assert!(TcpStream::connect(("127.0.0.1", server.port)).is_err(), "no longer accepting");
    let log = server.log();
    assert!(log.contains("shutting down") && log.contains("stopped"), "{log}");
}

#[test]
fn check_config_says_whether_a_file_can_be_served() {
    let dir = Scratch::new("check");
    let good = dir.write("good.toml", ONE_QUOTA);
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .arg("--config")
        .arg(&good)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("good.toml: OK (1 listener(s), 1 declared quota(s), 0 user(s))"), "{said}");

    let bad = dir.write("bad.toml", "[[quota]]\nmax_burst = 1\ncount = 2\nperiod = 3\n\n[[quota]]\nmax_burst = 1\ncount = 2\nperiod = 3\n");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .arg("--config")
        .arg(&bad)
        .arg("--check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("bad.toml:6: quota[1]: 1:2:3 is declared twice"), "{said}");

    // A flag beside --config is refused: the file says everything.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .arg("--config")
        .arg(&good)
        .args(["--port", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

/// The example configuration shipped beside the systemd unit is one the server takes.
#[test]
fn the_shipped_example_configuration_is_valid() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/tollgate.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
        .arg("--config")
        .arg(&example)
        .arg("--check-config")
        .env("TOLLGATE_REQUIREPASS", "example")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said} {}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("OK (1 listener(s), 2 declared quota(s), 1 user(s))"), "{said}");
}
