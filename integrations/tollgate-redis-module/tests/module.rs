//! The module inside real `redis-server` processes on free local ports: redis-cell's replies,
//! tollgate's commands, bad input answered with errors (the server keeps answering), the state
//! kept by RDB and AOF restarts, carried to a replica as the state itself, and shared by
//! clients on one key within the bound.

#[path = "../../tollgate-redis/tests/common/mod.rs"]
mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Server;
use redis::{Connection, Value};

/// The module the tests load: the one cargo built for this test run, beside this test binary
/// (`target/<profile>/deps/`; the copy one level up is refreshed only by `cargo build`).
fn module_path() -> String {
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().join("libtollgate_redis_module.so");
    assert!(
        so.exists(),
        "{} is missing: build the module first (cargo build -p tollgate-redis-module)",
        so.display()
    );
    so.to_string_lossy().into_owned()
}

fn server(extra: &[&str]) -> Server {
    let module = module_path();
    let mut args = vec!["--loadmodule", module.as_str()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn conn(s: &Server) -> Connection {
    redis::Client::open(s.url()).unwrap().get_connection().unwrap()
}

fn throttle(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("CL.THROTTLE").arg(args).query(c)
}

/// A `TG.*` reply (a map under RESP3, field-value pairs under RESP2) as (field, value) pairs.
fn fields(v: Value) -> Vec<(String, i64)> {
    let items: Vec<Value> = match v {
        Value::Array(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => panic!("not a map: {other:?}"),
    };
    items
        .chunks(2)
        .map(|kv| {
            (redis::from_redis_value(kv[0].clone()).unwrap(), redis::from_redis_value(kv[1].clone()).unwrap())
        })
        .collect()
}

fn field(v: &[(String, i64)], name: &str) -> i64 {
    v.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no {name} in {v:?}")).1
}

fn error_of<T: std::fmt::Debug>(r: redis::RedisResult<T>) -> String {
    let e = r.unwrap_err();
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
}

#[test]
fn redis_cells_replies_one_for_one() {
    let s = server(&[]);
    let mut c = conn(&s);
    // redis-cell's README: a fresh key.
    assert_eq!(throttle(&mut c, &["user123", "15", "30", "60"]).unwrap(), [0, 16, 15, -1, 2]);
    // The burst: 16 in all at once (the first above), then limited, the retry about one
    // emission interval (2 s) away and the bucket full again in about 32 s.
    for i in 1..16 {
        let r = throttle(&mut c, &["user123", "15", "30", "60"]).unwrap();
        assert_eq!(&r[..3], [0, 16, 15 - i], "call {i}");
    }
    let r = throttle(&mut c, &["user123", "15", "30", "60"]).unwrap();
    assert_eq!(&r[..3], [1, 16, 0]);
    assert!((1..=2).contains(&r[3]) && (31..=32).contains(&r[4]), "{r:?}");
    // A quantity above the limit never fits: limited, retry -1, as redis-cell.
    let r = throttle(&mut c, &["big", "5", "10", "60", "7"]).unwrap();
    assert_eq!((r[0], r[1], r[3]), (1, 6, -1));
    // The key is the module's, and lives until the bucket is full again: its TAT in whole ms
    // rounded up, plus 1 ms for Redis's millisecond clock (so PTTL may read 32,002).
    let kind: String = redis::cmd("TYPE").arg("user123").query(&mut c).unwrap();
    assert_eq!(kind, "tollgates");
    let pttl: i64 = redis::cmd("PTTL").arg("user123").query(&mut c).unwrap();
    assert!((30_000..=32_002).contains(&pttl), "{pttl}");
}

#[test]
fn tollgates_commands_check_peek_and_reset() {
    let s = server(&[]);
    let mut c = conn(&s);
    let check = |c: &mut Connection, cmd: &str, n: &str| -> Vec<(String, i64)> {
        fields(redis::cmd(cmd).arg("k").arg("10/s burst=20").arg(n).query(c).unwrap())
    };
    let d = check(&mut c, "TG.CHECK", "15");
    assert_eq!((field(&d, "allowed"), field(&d, "limit"), field(&d, "remaining")), (1, 20, 5));
    assert_eq!(field(&d, "retry_after_ms"), -1);
    assert!((1_400..=1_500).contains(&field(&d, "reset_after_ms")), "{d:?}");
    // A peek takes nothing: 5 would be allowed, and 5 are still there.
    let d = check(&mut c, "TG.PEEK", "5");
    assert_eq!((field(&d, "allowed"), field(&d, "remaining")), (1, 5));
    let d = check(&mut c, "TG.CHECK", "10");
    assert_eq!((field(&d, "allowed"), field(&d, "remaining")), (0, 5));
    assert!((400..=500).contains(&field(&d, "retry_after_ms")), "{d:?}");
    let reset: i64 = redis::cmd("TG.RESET").arg("k").query(&mut c).unwrap();
    assert_eq!(reset, 1);
    let d = check(&mut c, "TG.CHECK", "20");
    assert_eq!(field(&d, "allowed"), 1, "full again after TG.RESET");
    let reset: i64 = redis::cmd("TG.RESET").arg("missing").query(&mut c).unwrap();
    assert_eq!(reset, 0);
}

#[test]
fn bad_input_is_an_error_reply_and_the_server_keeps_answering() {
    let s = server(&[]);
    let mut c = conn(&s);
    let _: () = redis::cmd("SET").arg("text").arg("abc").query(&mut c).unwrap();
    let _: () = redis::cmd("RPUSH").arg("list").arg("a").query(&mut c).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("f").arg("v").query(&mut c).unwrap();
    let huge = "k".repeat(1 << 20);
    for (args, want) in [
        (vec!["k", "x", "10", "60"], "max_burst must be a non-negative integer"),
        (vec!["k", "-1", "10", "60"], "got '-1'"),
        (vec!["k", "5", "0", "60"], "Zero rates are not supported"),
        (vec!["k", "5", "10", "0"], "Zero rates are not supported"),
        (vec!["k", "5", "10", "60", "+1"], "quantity must be a non-negative integer"),
        (vec!["k", "18446744073709551615", "1", "1"], "max_burst 18446744073709551615"),
        (vec!["k", "5", "99999999999", "1"], "count 99999999999"),
        (vec!["k", "5", "10", "99999999999999999999"], "period must be"),
        (vec!["", "5", "10", "60"], "the key must not be empty"),
        (vec![huge.as_str(), "5", "10", "60"], "more than the 65536"),
        (
            vec!["text", "5", "10", "60"],
            "WRONGTYPE text holds a string of 3 bytes that is not a tollgate state",
        ),
        (vec!["list", "5", "10", "60"], "WRONGTYPE list holds a list"),
        (vec!["hash", "5", "10", "60"], "WRONGTYPE hash holds a hash"),
    ] {
        let e = match throttle(&mut c, &args) {
            Ok(r) => panic!(
                "{:?}: answered {r:?}",
                &args[..args.len().min(5)].iter().map(|a| &a[..a.len().min(20)]).collect::<Vec<_>>()
            ),
            e => error_of(e),
        };
        assert!(e.contains(want), "{:?}: {e}", &args[1..]);
    }
    let e = error_of(redis::cmd("CL.THROTTLE").arg("k").arg("1").query::<Value>(&mut c));
    assert!(e.contains("wrong number of arguments"), "{e}");
    let e = error_of(redis::cmd("TG.CHECK").arg("k").arg("often").query::<Value>(&mut c));
    assert!(e.contains("the limit 'often' is not a token bucket"), "{e}");
    let e = error_of(redis::cmd("TG.CHECK").arg("k").arg("10/s").arg("0x1").query::<Value>(&mut c));
    assert!(e.contains("n must be a non-negative integer"), "{e}");
    let e = error_of(redis::cmd("TG.RESTORE").arg("k").arg("1").arg("2").query::<Value>(&mut c));
    assert!(e.contains("not a tollgate state"), "{e}");
    // Nothing was written by a refused call; the server answers.
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(exists, 0);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

/// A key redis-cell wrote (its TAT, decimal ns) carries over: read as the same bucket.
#[test]
fn a_redis_cell_key_carries_over() {
    let s = server(&[]);
    let mut c = conn(&s);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    // 10 s ahead: with T = 2 s, five cells used of 16.
    let tat = now + 10_000_000_000;
    let _: () = redis::cmd("SET").arg("old").arg(tat.to_string()).query(&mut c).unwrap();
    let r = throttle(&mut c, &["old", "15", "30", "60"]).unwrap();
    assert_eq!(&r[..3], [0, 16, 10], "{r:?}");
    let kind: String = redis::cmd("TYPE").arg("old").query(&mut c).unwrap();
    assert_eq!(kind, "tollgates");
}

/// The state survives an RDB restart and an AOF restart, with its expiry.
#[test]
fn rdb_and_aof_keep_every_bucket() {
    for persistence in [&["--appendonly", "no"][..], &["--appendonly", "yes", "--appendfsync", "always"][..]]
    {
        let mut s = server(persistence);
        let mut c = conn(&s);
        for _ in 0..6 {
            throttle(&mut c, &["a", "9", "1", "3600"]).unwrap();
        }
        let _: Value = redis::cmd("TG.CHECK").arg("w").arg("sliding 1000000/200s").query(&mut c).unwrap();
        let _: Value =
            redis::cmd("TG.CHECK").arg("n").arg("nginx 1r/m burst=5 nodelay").query(&mut c).unwrap();
        let dumps = |c: &mut Connection| -> Vec<Vec<u8>> {
            ["a", "w", "n"].iter().map(|k| redis::cmd("DUMP").arg(*k).query(c).unwrap()).collect()
        };
        let before = dumps(&mut c);
        if persistence[1] == "no" {
            let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
        } else {
            // A rewritten AOF holds the state as TG.RESTORE (and its expiry).
            let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !s.cli(&["INFO", "persistence"]).unwrap_or_default().contains("aof_rewrite_in_progress:0")
                || s.cli(&["INFO", "persistence"]).unwrap_or_default().contains("aof_rewrite_scheduled:1")
            {
                assert!(std::time::Instant::now() < deadline, "the AOF rewrite did not finish");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        drop(c);
        s.kill();
        s.restart();
        let mut c = conn(&s);
        assert_eq!(before, dumps(&mut c), "{persistence:?}");
        let pttl: i64 = redis::cmd("PTTL").arg("a").query(&mut c).unwrap();
        assert!(pttl > 6 * 3_600_000 - 60_000, "{persistence:?}: {pttl}");
        // The bucket continues: 4 of 10 left.
        let r = throttle(&mut c, &["a", "9", "1", "3600"]).unwrap();
        assert_eq!(&r[..3], [0, 10, 3], "{persistence:?}");
    }
}

/// A replica holds what the primary holds, byte for byte, after a run of decisions; promoted,
/// it continues the bucket, never fuller than it was.
#[test]
fn a_replica_holds_the_primarys_buckets_and_continues_them() {
    let primary = server(&[]);
    let port = primary.port.to_string();
    let replica = server(&["--replicaof", "127.0.0.1", port.as_str()]);
    let mut p = conn(&primary);
    let mut r = conn(&replica);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replica.cli(&["INFO", "replication"]).unwrap_or_default().contains("master_link_status:up") {
        assert!(std::time::Instant::now() < deadline, "the replica did not connect");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A redis-cell key, replaced by the module's type on the primary: replaced on the replica.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let _: () = redis::cmd("SET").arg("cell").arg((now + 4_000_000_000).to_string()).query(&mut p).unwrap();
    throttle(&mut p, &["cell", "15", "30", "60"]).unwrap();
    for i in 0..40 {
        let key = format!("k{}", i % 4);
        throttle(&mut p, &[key.as_str(), "19", "1", "60"]).unwrap();
        let _: Value =
            redis::cmd("TG.CHECK").arg(format!("t{}", i % 3)).arg("5/s burst=10").query(&mut p).unwrap();
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut p).unwrap();
    assert_eq!(acked, 1);
    for key in ["cell", "k0", "k1", "k2", "k3", "t0", "t1", "t2"] {
        let a: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut p).unwrap();
        let b: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut r).unwrap();
        assert_eq!(a, b, "{key}");
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut r).unwrap();
        assert!(ttl > 0, "{key}: {ttl}");
    }
    // Promoted, the replica continues: k0 had 10 of 20 taken.
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    let after = throttle(&mut r, &["k0", "19", "1", "60"]).unwrap();
    assert_eq!(&after[..3], [0, 20, 9], "{after:?}");
}

/// An `INFO` field's integer.
fn info_field(s: &Server, section: &str, name: &str) -> i64 {
    let info = s.cli(&["INFO", section]).unwrap_or_default();
    let line =
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).unwrap_or_else(|| panic!("no {name}"));
    line.trim().parse().unwrap()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server without replicas or AOF replicates nothing (after its first second), yet counts
/// each write toward its save points; a replica attached later (a diskless sync with a delay,
/// decisions running throughout) holds every bucket as the primary does; after `FAILOVER` the
/// former replica continues each bucket, never fuller than it was; AOF turned on at runtime
/// holds every bucket across a reload.
#[test]
fn replication_follows_its_consumers_as_they_come() {
    let primary = server(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "1",
        "--enable-debug-command",
        "yes",
    ]);
    let replica = server(&[]);
    let mut p = conn(&primary);
    // Past the module's first check: nothing consumes replication here.
    std::thread::sleep(Duration::from_millis(1_500));
    let dirty = info_field(&primary, "persistence", "rdb_changes_since_last_save");
    for i in 0..50 {
        throttle(&mut p, &[&format!("k{}", i % 5), "999999", "1", "3600"]).unwrap();
    }
    assert!(
        info_field(&primary, "persistence", "rdb_changes_since_last_save") >= dirty + 50,
        "writes count toward save points"
    );
    // A replica attaches while decisions run: before, during and after its sync.
    let port = primary.port.to_string();
    let _: () =
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(port.as_str()).query(&mut conn(&replica)).unwrap();
    let mut i = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !replica.cli(&["INFO", "replication"]).unwrap_or_default().contains("master_link_status:up") {
        assert!(std::time::Instant::now() < deadline, "the replica did not connect");
        throttle(&mut p, &[&format!("k{}", i % 5), "999999", "1", "3600"]).unwrap();
        let _: Value =
            redis::cmd("TG.CHECK").arg(format!("w{}", i % 3)).arg("window 1000/h").query(&mut p).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    for j in 0..30 {
        throttle(&mut p, &[&format!("k{}", j % 5), "999999", "1", "3600"]).unwrap();
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut p).unwrap();
    assert_eq!(acked, 1);
    let mut r = conn(&replica);
    let keys = ["k0", "k1", "k2", "k3", "k4", "w0", "w1", "w2"];
    for key in keys {
        let a: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut p).unwrap();
        let b: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut r).unwrap();
        assert_eq!(a, b, "{key} after {i} decisions during the sync");
    }
    // FAILOVER: the replica becomes the primary and continues each bucket.
    // (A burst no number of decisions during the sync exhausts: k0 has room left.)
    let before = throttle(&mut p, &["k0", "999999", "1", "3600"]).unwrap();
    assert_eq!(before[0], 0, "{before:?}");
    let _: () = redis::cmd("FAILOVER").query(&mut p).unwrap();
    wait_for("the failover", || replica.cli(&["ROLE"]).unwrap_or_default().starts_with("master"));
    let after = throttle(&mut r, &["k0", "999999", "1", "3600"]).unwrap();
    assert_eq!((after[0], after[2]), (0, before[2] - 1), "{before:?} then {after:?}");
    // The former primary, now a replica, follows: the same bucket there.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut r).unwrap();
    assert_eq!(acked, 1);
    let a: Vec<u8> = redis::cmd("DUMP").arg("k0").query(&mut r).unwrap();
    let b: Vec<u8> = redis::cmd("DUMP").arg("k0").query(&mut conn(&primary)).unwrap();
    assert_eq!(a, b);

    // AOF turned on at runtime, on a server that replicated nothing until then.
    let solo = server(&["--enable-debug-command", "yes"]);
    let mut c = conn(&solo);
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 0..20 {
        throttle(&mut c, &[&format!("a{}", i % 4), "49", "1", "3600"]).unwrap();
    }
    let _: () = redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes").query(&mut c).unwrap();
    for i in 0..20 {
        throttle(&mut c, &[&format!("a{}", i % 4), "49", "1", "3600"]).unwrap();
        let _: Value = redis::cmd("TG.CHECK").arg("b").arg("sliding 100/h").query(&mut c).unwrap();
    }
    wait_for("the AOF rewrite", || {
        info_field(&solo, "persistence", "aof_rewrite_in_progress") == 0
            && info_field(&solo, "persistence", "aof_rewrite_scheduled") == 0
    });
    for i in 0..20 {
        throttle(&mut c, &[&format!("a{}", i % 4), "49", "1", "3600"]).unwrap();
    }
    let dumps = |c: &mut Connection| -> Vec<Vec<u8>> {
        ["a0", "a1", "a2", "a3", "b"].iter().map(|k| redis::cmd("DUMP").arg(*k).query(c).unwrap()).collect()
    };
    let held = dumps(&mut c);
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut c).unwrap();
    assert_eq!(dumps(&mut c), held, "the AOF holds every bucket");
}

/// `MULTI`/`EXEC` and Lua's `redis.call` run the commands as clients do.
#[test]
fn transactions_and_scripts_call_the_commands() {
    let s = server(&[]);
    let mut c = conn(&s);
    let (a, b): (Vec<i64>, Vec<i64>) = redis::pipe()
        .atomic()
        .cmd("CL.THROTTLE")
        .arg(&["m", "1", "1", "60"])
        .cmd("CL.THROTTLE")
        .arg(&["m", "1", "1", "60"])
        .query(&mut c)
        .unwrap();
    assert_eq!((a[0], a[2], b[0], b[2]), (0, 1, 0, 0));
    let r: Vec<i64> = redis::cmd("EVAL")
        .arg("return redis.call('CL.THROTTLE', KEYS[1], 1, 1, 60)")
        .arg(1)
        .arg("m")
        .query(&mut c)
        .unwrap();
    assert_eq!(&r[..3], [1, 2, 0]);
}

/// Four client processes (threads, each its own connection) on one key admit at most the
/// bound: a burst of 100 refilling one an hour.
#[test]
fn clients_on_one_key_admit_at_most_the_bound() {
    let s = server(&[]);
    let url = s.url();
    let admitted: i64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                scope.spawn(move || {
                    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
                    (0..60)
                        .map(|_| i64::from(throttle(&mut c, &["shared", "99", "1", "3600"]).unwrap()[0] == 0))
                        .sum::<i64>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 100);
}

/// The state is a key like any other: `COPY`, `DUMP`/`RESTORE`, keyspace notifications, and
/// a map under RESP3.
#[test]
fn a_state_is_a_key_like_any_other() {
    let s = server(&[]);
    let mut c = conn(&s);
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg("Kd").query(&mut c).unwrap();
    let mut sub = redis::Client::open(s.url()).unwrap().get_connection().unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    throttle(&mut c, &["orig", "4", "1", "60"]).unwrap();
    let msg = pubsub.get_message().unwrap();
    assert_eq!(
        (msg.get_channel_name(), msg.get_payload::<String>().unwrap().as_str()),
        ("__keyspace@0__:orig", "tg.take")
    );
    let copied: i64 = redis::cmd("COPY").arg("orig").arg("copy").query(&mut c).unwrap();
    assert_eq!(copied, 1);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("orig").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE").arg("restored").arg(60_000).arg(dump).query(&mut c).unwrap();
    for key in ["copy", "restored"] {
        let kind: String = redis::cmd("TYPE").arg(key).query(&mut c).unwrap();
        assert_eq!(kind, "tollgates", "{key}");
        let r = throttle(&mut c, &[key, "4", "1", "60"]).unwrap();
        assert_eq!(&r[..3], [0, 5, 3], "{key} continues orig's bucket");
    }
    let mut resp3 =
        redis::Client::open(format!("{}?protocol=resp3", s.url())).unwrap().get_connection().unwrap();
    let v: Value = redis::cmd("TG.PEEK").arg("t").arg("10/s").query(&mut resp3).unwrap();
    assert!(matches!(v, Value::Map(_)), "{v:?}");
    assert_eq!(field(&fields(v), "remaining"), 10);
}

/// The windows and nginx's forms: each decides as its algorithm (a window of 3 a minute admits
/// 3; nginx's `burst=2 nodelay` passes 3 at once), lives until its state is as good as
/// missing, and a key counted one way is not read another.
#[test]
fn windows_and_nginx_forms() {
    let s = server(&[]);
    let mut c = conn(&s);
    for (spec, admits, limit) in [
        ("window 3/min", 3, 3),
        ("fixed_window 3/min", 3, 3),
        ("sliding 3/min", 3, 3),
        ("nginx 1r/s burst=2 nodelay", 3, 3),
    ] {
        let key = format!("w:{spec}");
        let minute = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() / 60;
        let first = minute();
        let allowed: Vec<i64> = (0..5)
            .map(|_| {
                let d = fields(redis::cmd("TG.CHECK").arg(&key).arg(spec).query(&mut c).unwrap());
                assert_eq!(field(&d, "limit"), limit, "{spec}");
                field(&d, "allowed")
            })
            .collect();
        // (Windows sit on the wall clock's minutes: a run across one's edge proves nothing.)
        if minute() == first {
            assert_eq!(allowed.iter().sum::<i64>(), admits, "{spec}: {allowed:?}");
            assert_eq!(allowed[..admits as usize], vec![1; admits as usize][..], "{spec}");
        }
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap();
        assert_eq!(kind, "tollgates");
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap();
        assert!(pttl > 0, "{spec}: {pttl}");
    }
    // A window's key asked as a bucket, or as a window of another length: an error.
    let e = error_of(redis::cmd("TG.CHECK").arg("w:window 3/min").arg("3/min").query::<Value>(&mut c));
    assert!(e.contains("WRONGTYPE w:window 3/min holds a fixed window, not what this limit counts"), "{e}");
    let e = error_of(redis::cmd("TG.CHECK").arg("w:window 3/min").arg("window 3/s").query::<Value>(&mut c));
    assert!(e.contains("holds a fixed window of another length or width"), "{e}");
    // Above 2^24 − 1 a window's count is wider: a key of one width is never read as the other.
    let _: Value = redis::cmd("TG.CHECK").arg("w:wide").arg("window 20000000/s").query(&mut c).unwrap();
    let e = error_of(redis::cmd("TG.CHECK").arg("w:wide").arg("window 3/s").query::<Value>(&mut c));
    assert!(e.contains("holds a fixed window of another length or width"), "{e}");
    let e = error_of(
        redis::cmd("TG.CHECK").arg("w:window 3/min").arg("window 20000000/min").query::<Value>(&mut c),
    );
    assert!(e.contains("holds a fixed window of another length or width"), "{e}");
    let e = error_of(throttle(&mut c, &["w:sliding 3/min", "5", "10", "60"]));
    assert!(e.contains("holds a sliding window"), "{e}");
    let e = error_of(redis::cmd("TG.CHECK").arg("k").arg("sliding 100/fortnight").query::<Value>(&mut c));
    assert!(e.contains("is not a sliding window"), "{e}");
}

/// On a 3-master Cluster with the module on each: keys on every master, and a slot migrated
/// mid-run (`MIGRATE` carries the state, as `DUMP`/`RESTORE` do): the bucket continues on its
/// new master, never fuller than it was.
#[test]
fn a_cluster_keeps_each_bucket_across_a_slot_migration() {
    let module = module_path();
    let cluster = common::Cluster::start_with(&["--loadmodule", module.as_str()]);
    // Every command through redis-cli's cluster mode, which follows MOVED and ASK.
    let call = |args: &[&str]| -> Vec<i64> {
        let out = std::process::Command::new("redis-cli")
            .args(["-c", "-p", &cluster.nodes[0].port.to_string()])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{args:?}: {text}"))).collect()
    };
    let keys: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    for key in &keys {
        for left in [4, 3] {
            assert_eq!(call(&["CL.THROTTLE", key, "4", "1", "3600"])[2], left, "{key}");
        }
    }
    let used = cluster.nodes.iter().filter(|n| n.cli(&["DBSIZE"]).unwrap().trim() != "0").count();
    assert_eq!(used, 3, "keys on every master");
    let key = keys[0].as_str();
    let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]).unwrap().trim().to_owned();
    let ids: Vec<String> =
        cluster.nodes.iter().map(|n| n.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_owned()).collect();
    let src = cluster
        .nodes
        .iter()
        .position(|n| n.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).unwrap().trim() != "0")
        .unwrap();
    let dst = (src + 1) % 3;
    let (s_node, d_node) = (&cluster.nodes[src], &cluster.nodes[dst]);
    assert_eq!(d_node.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &ids[src]]).unwrap().trim(), "OK");
    assert_eq!(s_node.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &ids[dst]]).unwrap().trim(), "OK");
    assert_eq!(call(&["CL.THROTTLE", key, "4", "1", "3600"])[2], 2, "on the source while migrating");
    let port = d_node.port.to_string();
    assert_eq!(
        s_node.cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key]).unwrap().trim(),
        "OK"
    );
    for node in &cluster.nodes {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &ids[dst]]).unwrap();
    }
    assert_eq!(d_node.cli(&["TYPE", key]).unwrap().trim(), "tollgates");
    assert_eq!(call(&["CL.THROTTLE", key, "4", "1", "3600"])[2], 1, "continued on the destination");
    assert_eq!(call(&["CL.THROTTLE", key, "4", "1", "3600"])[2], 0);
    assert_eq!(call(&["CL.THROTTLE", key, "4", "1", "3600"])[0], 1, "limited, never fuller than it was");
}

/// Keys and arguments are clients' bytes: any of them in an error reply is escaped, never a
/// crash (the module API aborts the server on a reply holding a NUL). A peek or a refusal does
/// not touch the key for `WATCH`. An expiry past range is refused before anything is written.
/// nginx's queue (without `nodelay`) reports its delay.
#[test]
fn clients_bytes_in_errors_watch_and_delays() {
    let s = server(&[]);
    let mut c = conn(&s);
    let e = error_of(throttle(&mut c, &["k", "\u{100}", "1", "1"]));
    assert!(e.contains("got '\\u{100}'"), "{e}");
    let e = error_of(redis::cmd("TG.CHECK").arg("k").arg("\u{1F600}").query::<Value>(&mut c));
    assert!(e.contains("\\u{1f600}"), "{e}");
    let _: () = redis::cmd("RPUSH").arg("\u{100}\u{2500}").arg("x").query(&mut c).unwrap();
    let e = error_of(redis::cmd("TG.CHECK").arg("\u{100}\u{2500}").arg("10/s").query::<Value>(&mut c));
    assert!(e.contains("WRONGTYPE \\u{100}\\u{2500} holds a list"), "{e}");
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");

    // WATCH survives a peek and a refusal on the watched key.
    throttle(&mut c, &["watched", "0", "1", "3600"]).unwrap();
    let _: () = redis::cmd("WATCH").arg("watched").query(&mut c).unwrap();
    let mut other = conn(&s);
    let _: Value = redis::cmd("TG.PEEK").arg("watched").arg("1/h").query(&mut other).unwrap();
    assert_eq!(throttle(&mut other, &["watched", "0", "1", "3600"]).unwrap()[0], 1);
    let done: Option<Vec<Value>> = redis::pipe().atomic().cmd("SET").arg("x").arg(1).query(&mut c).unwrap();
    assert!(done.is_some(), "the transaction was aborted by a peek or a refusal");

    let e = error_of(
        redis::cmd("TG.RESTORE")
            .arg("r")
            .arg(1)
            .arg(72339069014638592u64)
            .arg("PXAT")
            .arg(u64::MAX)
            .query::<Value>(&mut c),
    );
    assert!(e.contains("is beyond"), "{e}");
    let exists: i64 = redis::cmd("EXISTS").arg("r").query(&mut c).unwrap();
    assert_eq!(exists, 0);

    let delays: Vec<i64> = (0..3)
        .map(|_| {
            field(
                &fields(redis::cmd("TG.CHECK").arg("q").arg("nginx 1r/s burst=2").query(&mut c).unwrap()),
                "delay_ms",
            )
        })
        .collect();
    assert_eq!(delays[0], 0);
    assert!((900..=1000).contains(&delays[1]) && (1900..=2000).contains(&delays[2]), "{delays:?}");
}
