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

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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
    assert_eq!(server.cli(&["CL.THROTTLE", "user123", "15", "30", "60"]), "0\n16\n14\n-1\n4\n");
    assert_eq!(server.cli(&["CL.THROTTLE", "user123", "15", "30", "60", "20"]), "1\n16\n14\n-1\n4\n");
    assert!(server.cli(&["CL.THROTTLE", "k", "15", "0", "60"]).contains("Zero rates are not supported"));
    assert!(server.cli(&["FLUSHALL"]).contains("unknown command 'FLUSHALL'"));
    let info = server.cli(&["INFO"]);
    assert!(
        info.contains("throttle_calls:4") && info.contains("quotas:1") && info.contains("keys:1"),
        "{info}"
    );
}

#[test]
fn the_redis_crate_pipelines_and_many_connections_share_the_tables() {
    let server = Running::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
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

        // 40 connections, 25 requests each, on one shared key of 500 per hour: exactly 500.
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
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
    let server = Running::start(&["--max-arg-bytes", "1024"]);
    let mut s = server.raw();
    // Malformed headers, a wrong type marker, a bulk without CRLF, an unknown command, binary
    // noise: each an error, then PING still answers.
    s.write_all(b"*x\r\n*1\r\n:3\r\n*1\r\n$2\r\nabcd\r\nNOPE\r\n\xff\xfe\x00\r\nPING\r\n").unwrap();
    let got = read_until(&mut s, "+PONG\r\n");
    assert_eq!(got.matches("-ERR").count(), 5, "{got:?}");

    // An oversized bulk string: refused at once, its payload skipped as it arrives.
    let mut s = server.raw();
    s.write_all(b"*2\r\n$4\r\nECHO\r\n$5000000\r\n").unwrap();
    let got = read_until(&mut s, "\r\n");
    assert!(got.starts_with("-ERR Protocol error: a bulk string of 5000000 bytes"), "{got:?}");
    let chunk = vec![b'x'; 100_000];
    for _ in 0..50 {
        s.write_all(&chunk).unwrap();
    }
    s.write_all(b"\r\nPING\r\n").unwrap();
    assert!(read_until(&mut s, "+PONG\r\n").ends_with("+PONG\r\n"));

    // A request that never ends (a length line that goes on and on), beyond the request limit
    // (4 × the argument limit, at least 1 MiB): refused, and the connection closed.
    let mut s = server.raw();
    s.write_all(b"*1\r\n$").unwrap();
    let digits = vec![b'1'; 64 * 1024];
    for _ in 0..40 {
        if s.write_all(&digits).is_err() {
            break; // closed by the server while we were still writing
        }
    }
    let got = read_n(&mut s, 200);
    assert!(
        got.is_empty() || got.starts_with("-ERR Protocol error: a request over 1048576 bytes"),
        "{got:?}"
    );
    assert_eq!(read_n(&mut s, 1), "", "closed");
    let info = server.cli(&["INFO"]);
    assert!(info.contains("protocol_errors:"), "{info}");
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
    for _ in 0..100 {
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
