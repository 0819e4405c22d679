//! Real Redis servers for the tests: started on free ports of 127.0.0.1, stopped on drop.

#![allow(dead_code, unreachable_pub)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on its own port and directory.
pub struct Server {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A port `p` below 55536 with `p` and `p + 10000` (a cluster node's bus) both free now.
fn free_cluster_port() -> u16 {
    let mut seed = u64::from(std::process::id()) ^ Instant::now().elapsed().as_nanos() as u64;
    loop {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let p = 20_000 + (seed >> 33) as u16 % 30_000;
        if TcpListener::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        {
            return p;
        }
    }
}

impl Server {
    /// A standalone server, with `extra` arguments (`--requirepass x`, …).
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with(free_port, extra)
    }

    /// A server on a port from `port`; another one if that port was taken in the meantime
    /// (another test's server can bind it between our probe and the server's start).
    fn start_with(port: impl Fn() -> u16, extra: &[&str]) -> Server {
        for _ in 0..4 {
            if let Some(s) = Server::try_start_on(port(), extra) {
                return s;
            }
        }
        panic!("redis-server did not come up on four free ports in a row");
    }

    fn try_start_on(port: u16, extra: &[&str]) -> Option<Server> {
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "yes",
            "--dir",
            dir.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Server { port, child: None, dir, args };
        s.spawn().then_some(s)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the process again, on its port, and waits until it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.spawn(), "redis-server did not come back on port {}", self.port);
    }

    /// Starts the process and waits until it accepts connections; false if it exited (its
    /// port was taken) or did not answer within 10 s.
    fn spawn(&mut self) -> bool {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: install it (apt-get install redis-server redis-tools)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).map(|o| o.trim() == "PONG").unwrap_or(false) {
                return true;
            }
            if self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_)))) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    /// Kills the process (SIGKILL: no goodbye to the clients) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Until the port is free again.
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs `redis-cli` against this server; its stdout, or `None` if it failed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(i) = self.args.iter().position(|a| a == "--requirepass") {
            cmd.args(["--no-auth-warning", "-a", &self.args[i + 1]]);
        }
        let out = cmd.args(args).stderr(Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters, created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Three masters, each started with `extra` arguments too (`--loadmodule path`, …).
    pub fn start_with(extra: &[&str]) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                // A node also listens on its port + 10000 (the cluster bus).
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend_from_slice(extra);
                Server::start_with(free_cluster_port, &args)
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli not found: install it (apt-get install redis-tools)");
        assert!(out.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).is_some_and(|i| i.contains("cluster_state:ok")));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "the cluster did not reach cluster_state:ok within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }
}
