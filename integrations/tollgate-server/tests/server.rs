//! The server binary on 127.0.0.1, driven by real clients: `redis-cli`, the `redis` crate
//! (pipelined, many connections), and raw sockets sending garbage.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server binary, started on a free port with `extra` flags; killed on drop.
struct Running {
    child: Child,
    port: u16,
}

impl Running {
    fn start(extra: &[&str]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-server"))
            .args(["--port", "0", "--capacity", "1000"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let addr = first.trim().rsplit(' ').next().unwrap();
        assert!(addr.starts_with("127.0.0.1:"), "binds 127.0.0.1 by default: {first}");
        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
        Running { child, port }
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli not found: install it (apt-get install redis-tools)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// A `redis` crate client of the server, and a connection configuration without a
    /// response timeout (the crate's default is 500 ms): a loaded machine is slow, not wrong.
    fn redis_client(&self) -> (redis::Client, redis::AsyncConnectionConfig) {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).unwrap();
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(Duration::from_secs(30)));
        (client, config)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads from `s` until `want` bytes arrived (or the server closed).
fn read_n(s: &mut TcpStream, want: usize) -> String {
    let mut got = vec![0; want];
    let mut at = 0;
    while at < want {
        match s.read(&mut got[at..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => at += n,
        }
    }
    String::from_utf8_lossy(&got[..at]).into_owned()
}

/// Reads from `s` until what arrived ends with `suffix`; panics if the server closes first.
fn read_until(s: &mut TcpStream, suffix: &str) -> String {
    let mut got = String::new();
    while !got.ends_with(suffix) {
        let more = read_n(s, 1);
        assert!(!more.is_empty(), "the connection closed after {got:?}");
        got.push_str(&more);
    }
    got
}

#[test]
fn redis_cli_speaks_to_it() {
    let server = Running::start(&[]);
    assert_eq!(server.cli(&["PING"]).trim(), "PONG");
    // redis-cell's README vector, then the same key again.
    assert_eq!(server.cli(&["CL.THROTTLE", "user123", "15", "30", "60"]), "0\n16\n15\n-1\n2\n");
    // A slow quota (a token per 2 minutes), so that nothing refills between the calls.
    assert_eq!(server.cli(&["CL.THROTTLE", "slow", "15", "30", "3600"]), "0\n16\n15\n-1\n120\n");
    assert_eq!(server.cli(&["CL.THROTTLE", "slow", "15", "30", "3600"]), "0\n16\n14\n-1\n240\n");
    assert_eq!(server.cli(&["CL.THROTTLE", "slow", "15", "30", "3600", "20"]), "1\n16\n14\n-1\n240\n");
    assert!(server.cli(&["CL.THROTTLE", "k", "15", "0", "60"]).contains("Zero rates are not supported"));
    assert!(server.cli(&["FLUSHALL"]).contains("unknown command 'FLUSHALL'"));
    let info = server.cli(&["INFO"]);
    assert!(
        info.contains("throttle_calls:5") && info.contains("\nquotas:2") && info.contains("\nkeys:2"),
        "{info}"
    );
}

#[test]
fn the_redis_crate_pipelines_and_many_connections_share_the_tables() {
    let server = Running::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (client, config) = server.redis_client();
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
        // One pipeline of 30 on one key of 10 per minute: 10 allowed, then limited, in order.
        let mut pipe = redis::pipe();
        for _ in 0..30 {
            pipe.cmd("CL.THROTTLE").arg("pipelined").arg(9).arg(10).arg(60);
        }
        let replies: Vec<Vec<i64>> = pipe.query_async(&mut conn).await.unwrap();
        let limited: Vec<i64> = replies.iter().map(|r| r[0]).collect();
        assert_eq!(limited, [vec![0; 10], vec![1; 20]].concat());
        assert_eq!(replies[9][2], 0);
        assert!(replies[10][3] >= 5 && replies[10][3] <= 6, "retry after one token (6 s): {:?}", replies[10]);

        // 40 connections, 25 requests each, on one shared key of 500 per 10 hours: exactly 500.
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let (client, config) = (client.clone(), config.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
                let mut allowed = 0;
                for _ in 0..25 {
                    let r: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg("shared")
                        .arg(499)
                        .arg(500)
                        .arg(3600)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    allowed += i64::from(r[0] == 0);
                }
                allowed
            }));
        }
        let mut allowed = 0;
        for t in tasks {
            allowed += t.await.unwrap();
        }
        assert_eq!(allowed, 500);
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn garbage_gets_errors_and_the_connection_survives() {
    let server = Running::start(&["--max-arg-bytes", "1024", "--max-request-bytes", "100000"]);
    let mut s = server.raw();
    // Unknown commands and binary noise: each an error, then PING still answers.
    s.write_all(b"NOPE\r\n\xff\xfe\x00\r\nPING\r\n").unwrap();
    let got = read_until(&mut s, "+PONG\r\n");
    assert_eq!(got.matches("-ERR").count(), 2, "{got:?}");

    // Frames whose lengths cannot be read: an error, then the connection is closed (there is
    // no way to find the next request).
    for garbage in
        [&b"*x\r\n"[..], b"*1\r\n:3\r\n", b"*1\r\n$2\r\nabcd\r\n", b"*1\r\n$-5\r\n", b"*1\r\n$-1\r\n"]
    {
        let mut s = server.raw();
        s.write_all(garbage).unwrap();
        let got = read_until(&mut s, "\r\n");
        assert!(got.starts_with("-ERR Protocol error"), "{garbage:?}: {got:?}");
        assert_eq!(read_n(&mut s, 1), "", "{garbage:?}: closed");
    }

    // Issue 34: an oversized bulk string was refused and then waited for (up to 999,999,999
    // bytes, until the idle timeout). Refused at its length line, and the connection closed
    // at once, as Redis does; so are too many arguments.
    for (frame, says) in [
        (
            &b"*3\r\n$4\r\nECHO\r\n$999999999\r\n"[..],
            "invalid bulk length: 999999999 bytes, more than the 1024 allowed",
        ),
        (b"*2000\r\n$4\r\nQUIT\r\n", "invalid multibulk length: 2000 arguments, more than the 1024 allowed"),
    ] {
        let mut s = server.raw();
        s.write_all(frame).unwrap();
        let started = std::time::Instant::now();
        let got = read_until(&mut s, "\r\n");
        assert!(got.starts_with(&format!("-ERR Protocol error: {says}")), "{got:?}");
        assert_eq!(read_n(&mut s, 1), "", "closed");
        assert!(started.elapsed() < Duration::from_secs(5), "closed without waiting for the payload");
    }

    // A request over the request limit (100,000 bytes here): refused, and the connection closed.
    let mut s = server.raw();
    s.write_all(b"*1024\r\n").unwrap();
    let arg = format!("$1000\r\n{}\r\n", "y".repeat(1000));
    for _ in 0..1024 {
        if s.write_all(arg.as_bytes()).is_err() {
            break; // closed by the server while we were still writing
        }
    }
    let got = read_n(&mut s, 200);
    assert!(got.is_empty() || got.starts_with("-ERR Protocol error: a request over 100000 bytes"), "{got:?}");
    let info = server.cli(&["INFO"]);
    assert!(info.contains("protocol_errors:"), "{info}");
}

/// A real `redis-server` on a free port, with no persistence; killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server not found: install it (apt-get install redis-server)");
        // Held from here, so that it is killed and waited for on every path.
        let redis = Redis { child, port };
        for _ in 0..500 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return redis;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not start on port {port}");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a server answers to `frame` on a new connection: the type byte of each reply (`+`,
/// `-`, `:`, `$`, `*`) with the error code of each error, and whether it then closed. An
/// `ECHO` sent with the frame marks the end of its replies on a connection left open, so
/// that a slow machine is waited for, not misread.
fn answer(port: u16, frame: &[u8]) -> (Vec<String>, bool) {
    const SENTINEL: &str = "$17\r\ntollgate-sentinel\r\n";
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // One write, so that a server closing on the frame has read the sentinel too (a close with
    // unread input would be a reset, which could destroy its last reply before it is read).
    s.write_all(&[frame, b"ECHO tollgate-sentinel\r\n"].concat()).unwrap();
    let mut got = Vec::new();
    let mut closed = false;
    let mut buf = [0u8; 4096];
    while !got.ends_with(SENTINEL.as_bytes()) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    if !closed {
        got.truncate(got.len() - SENTINEL.len());
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let kinds = text
        .split("\r\n")
        .filter(|line| !line.is_empty())
        .map(|line| match line.as_bytes()[0] {
            b'-' => line.split(' ').next().unwrap_or("-").to_owned(),
            b'+' => line.to_owned(),
            _ => line[..1].to_owned(),
        })
        .collect();
    (kinds, closed)
}

/// Issue 34: `*-1`, `*0`, `$-1` and the other edges of the protocol answered as Redis answers
/// them, checked against a real `redis-server`: the same replies (their types and error codes)
/// and the same closes.
#[test]
fn frames_are_answered_as_redis_answers_them() {
    let redis = Redis::start();
    let server = Running::start(&[]);
    let frames: [&[u8]; 14] = [
        b"*0\r\nPING\r\n",
        b"*-1\r\nPING\r\n",
        b"$-1\r\nPING\r\n",
        b"*1\r\n$-1\r\nPING\r\n",
        b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$999999999999\r\n",
        b"*x\r\nPING\r\n",
        b"*2\r\n$4\r\nECHO\r\n+5\r\nPING\r\n",
        b"\r\n\r\nPING\r\n",
        b"*1\r\n$4\r\nPING\r\n*1\r\n$3\r\nFOO\r\nPING\r\n",
        b"*2\r\n$5\r\nHELLO\r\n$1\r\n4\r\nPING\r\n",
        b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n",
        b"*3\r\n$4\r\nECHO\r\n$1\r\na\r\n$1\r\nb\r\nPING\r\n",
        b"PING a b\r\nPING\r\n",
        b"*1\r\n$4\r\nQUIT\r\nPING\r\n",
    ];
    for frame in frames {
        let want = answer(redis.port, frame);
        let got = answer(server.port, frame);
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(frame));
    }
}

/// Issue 34: with a password, a stranger can do nothing but authenticate, and cannot create a
/// single table; `redis-cli -a` and the `redis` crate's URL password authenticate as with Redis.
#[test]
fn a_password_keeps_strangers_out_and_real_clients_in() {
    let server = Running::start(&["--requirepass", "s3cret", "--user", "ops:hunter2", "--quota", "15:30:60"]);
    let mut s = server.raw();
    s.write_all(b"CL.THROTTLE a 10 1 31536000\r\nPING\r\nAUTH nope\r\n").unwrap();
    let got = read_until(&mut s, "user is disabled.\r\n");
    assert_eq!(got.matches("-NOAUTH Authentication required.").count(), 2, "{got:?}");
    // Before authenticating, a request may hold 10 arguments.
    s.write_all(b"*11\r\n").unwrap();
    let got = read_until(&mut s, "\r\n");
    assert!(got.contains("more than the 10 allowed before authentication"), "{got:?}");
    assert_eq!(read_n(&mut s, 1), "", "closed");

    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string(), "--no-auth-warning", "-a", "s3cret"])
        .args(["CL.THROTTLE", "user123", "15", "30", "60"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n16\n15\n-1\n2\n");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = redis::Client::open(format!("redis://ops:hunter2@127.0.0.1:{}", server.port)).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let r: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg("user123")
            .arg(15)
            .arg(30)
            .arg(60)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(r[..3], [0, 16, 14]);
        let bad = redis::Client::open(format!("redis://ops:wrong@127.0.0.1:{}", server.port)).unwrap();
        let err = bad.get_multiplexed_async_connection().await.unwrap_err();
        assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed, "{err}");
    });
    let info = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "--no-auth-warning",
            "-a",
            "s3cret",
            "INFO",
        ])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("quotas:1\r\nquotas_declared:1\r\n"), "no table was made by the stranger: {info}");
}

/// Issue 34, the attack over the network: a client sending shapes with a fill time of a year
/// and a flood of distinct shapes cannot take the room of a declared quota, and the undeclared
/// tables stay bounded in number and memory.
#[test]
fn a_flood_of_shapes_over_the_network_cannot_lock_the_server_out() {
    let server = Running::start(&["--quota", "15:30:60", "--max-quotas", "2", "--max-fill-time", "600"]);
    let mut s = server.raw();
    let mut flood = Vec::new();
    for burst in 0..100 {
        flood.extend_from_slice(
            format!("CL.THROTTLE a {burst} 1 31536000\r\nCL.THROTTLE a {burst} 1 2\r\n").as_bytes(),
        );
    }
    flood.extend_from_slice(b"PING\r\n");
    s.write_all(&flood).unwrap();
    let got = read_until(&mut s, "+PONG\r\n");
    assert_eq!(got.matches("longer than the 600 s allowed").count(), 100, "year-long shapes refused");
    assert_eq!(got.matches("2 undeclared").count(), 98, "at most two undeclared tables");
    assert_eq!(server.cli(&["CL.THROTTLE", "user123", "15", "30", "60"]), "0\n16\n15\n-1\n2\n");
    let info = server.cli(&["INFO"]);
    assert!(info.contains("quotas:3\r\n"), "{info}");
}

#[test]
fn connections_are_bounded() {
    let server = Running::start(&["--max-connections", "2"]);
    let mut a = server.raw();
    let mut b = server.raw();
    a.write_all(b"PING\r\n").unwrap();
    b.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut a, 7), "+PONG\r\n");
    assert_eq!(read_n(&mut b, 7), "+PONG\r\n");
    let mut c = server.raw();
    let got = read_n(&mut c, 100);
    assert_eq!(got, "-ERR max number of clients reached\r\n");
    drop(a);
    // The slot frees when a connection closes.
    let mut ok = false;
    for _ in 0..500 {
        let mut d = server.raw();
        d.write_all(b"PING\r\n").unwrap();
        if read_n(&mut d, 7) == "+PONG\r\n" {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ok);
}

/// Connections that each bring a new quota at once: every one is answered as its first use
/// (the tables are built one at a time, each off the worker thread of the connection that
/// asked), and the quotas then count apart.
#[test]
fn new_quotas_from_many_connections_at_once_are_all_built() {
    let server = Running::start(&["--max-quotas", "16", "--max-fill-time", "86400"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (client, config) = server.redis_client();
        let mut tasks = Vec::new();
        for quota in 1..=12u64 {
            let (client, config) = (client.clone(), config.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
                let mut replies = Vec::new();
                // A burst of `quota` (max_burst quota − 1) per hour: `quota` allowed, then limited.
                for _ in 0..=quota {
                    let r: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg("k")
                        .arg(quota - 1)
                        .arg(1)
                        .arg(3600)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    replies.push(r[0]);
                }
                (quota, replies)
            }));
        }
        for t in tasks {
            let (quota, replies) = t.await.unwrap();
            let want: Vec<i64> = (0..=quota).map(|i| i64::from(i == quota)).collect();
            assert_eq!(replies, want, "quota {quota}");
        }
    });
    let info = server.cli(&["INFO"]);
    assert!(info.contains("quotas:12"), "{info}");
}
