//! The public surface as a newcomer meets it: each friction point of the old surface, now a
//! line that compiles (the ones that must not compile are doc tests on `Decision` and `Key`).

use std::net::IpAddr;
use std::time::Duration;

use tollgate::{
    check_all, Admit, Algorithm, ConfigError, Decision, Direct, FixedWindow, IpPrefix, Keyed, KeyedAlgorithm,
    KeyedLimiter, KeyedNginx, KeyedSlidingLog, Limiter, ManualClock, Nanos, Nginx, Outcome, ParseError,
    SlidingLog, SlidingWindow, TokenBucket, UpdateError, WhenFull,
};

#[test]
fn builders_are_called_on_the_typed_limiter() {
    let q = TokenBucket::per_second(10).unwrap();
    let by_ip = KeyedLimiter::<IpAddr>::builder(q).capacity(100).build().unwrap();
    assert!(by_ip.check(&"192.0.2.1".parse::<IpAddr>().unwrap()).is_allowed());
    let nginx = KeyedNginx::<u64>::builder("1r/s burst=1".parse().unwrap()).capacity(100).build().unwrap();
    assert!(nginx.check(&1).is_allowed());
    let log = KeyedSlidingLog::<str>::builder("2/s".parse().unwrap()).capacity(100).build().unwrap();
    assert!(log.check("a").is_allowed());
    // The binding's type names the key too.
    let windows: Keyed<SlidingWindow, u32> = Keyed::builder("5/min".parse().unwrap()).build().unwrap();
    assert!(windows.check(&3).is_allowed());
}

/// A table whose type names its clock is built from that type too: `builder_for_clock` on
/// any clock's type, `builder` on the default clock's (whose `build_with_clock` takes any
/// clock, so that `Keyed::builder(q)` needs no clock named).
#[test]
fn builders_are_called_on_a_type_that_names_its_clock() {
    type Table = KeyedLimiter<u64, ManualClock>;
    let q = TokenBucket::per_second(1).unwrap();
    let clock = ManualClock::new();
    let t = Table::builder_for_clock(q).capacity(10).build_with_clock(clock.clone()).unwrap();
    assert!(t.check(&1).is_allowed() && !t.check(&1).is_allowed());
    clock.advance(std::time::Duration::from_secs(1));
    assert!(t.check(&1).is_allowed(), "on the clock it was given");
    let nginx = KeyedNginx::<u32, ManualClock>::builder_for_clock("1r/s burst=1".parse().unwrap())
        .capacity(10)
        .build_with_clock(clock.clone())
        .unwrap();
    assert!(nginx.check(&1).is_allowed());
    // The forms that name no clock keep building on the clock given.
    let _: Table = KeyedLimiter::<u64>::builder(q).capacity(10).build_with_clock(clock.clone()).unwrap();
    let _: Table = Keyed::builder(q).capacity(10).build_with_clock(clock.clone()).unwrap();
    let _: Table = KeyedLimiter::<u64, _>::builder(q).build_with_clock(clock).unwrap();
}

#[test]
fn string_keys_take_borrowed_lookups() {
    let l = KeyedLimiter::<String>::new(TokenBucket::per_minute(1).unwrap(), 100).unwrap();
    assert!(l.check("alice").is_allowed());
    assert!(!l.check(&String::from("alice")).is_allowed(), "one key, however it is spelled");
    assert!(l.peek("bob").is_allowed());
    let per_tenant = Keyed::<FixedWindow, Vec<u8>>::new("1/min".parse().unwrap(), 100).unwrap();
    assert!(per_tenant.check(b"t1".as_slice()).is_allowed());
    assert!(!per_tenant.check(&b"t1".to_vec()).is_allowed());
    let global = tollgate::Limiter::new(TokenBucket::per_second(100).unwrap());
    assert!(check_all(&[&l.limit("carol") as &dyn Admit, &global], 1).is_allowed());
}

#[test]
fn tuple_and_prefix_keys() {
    let per_port = KeyedLimiter::<(IpAddr, u16)>::new(TokenBucket::per_minute(1).unwrap(), 100).unwrap();
    let ip: IpAddr = "2001:db8::7".parse().unwrap();
    assert!(per_port.check(&(ip, 443)).is_allowed());
    assert!(!per_port.check(&(ip, 443)).is_allowed());
    assert!(per_port.check(&(ip, 80)).is_allowed());
    // One /64: a host that sprays addresses across its block gets one limit.
    let per_host = KeyedLimiter::<IpPrefix>::new(TokenBucket::per_minute(3).unwrap(), 100).unwrap();
    let admitted = (1..=10u16)
        .filter(|i| {
            let addr: IpAddr = format!("2001:db8:0:7::{i:x}").parse().unwrap();
            per_host.check(&IpPrefix::new(addr)).is_allowed()
        })
        .count();
    assert_eq!(admitted, 3);
}

#[test]
fn decisions_say_what_to_do_now() {
    let clock = ManualClock::new();
    let q: Nginx = "1r/s burst=1".parse().unwrap();
    let l = tollgate::NginxLimiter::with_clock(q, clock.clone());
    let first = l.check();
    assert!(first.is_allowed() && first.is_allowed_now());
    let second = l.check();
    assert_eq!(second.outcome(), Outcome::Delayed);
    assert!(second.is_allowed() && !second.is_allowed_now(), "admitted, but only after its delay");
    assert!(second.delay() > Duration::ZERO);
    let debug = format!("{second:?}");
    assert!(debug.contains("delay: 1s") && debug.contains("reset_after: "), "{debug}");
    assert!(!debug.contains("units") && !debug.contains("missing"), "{debug}");

    // Constructors for middleware and tests.
    let d = Decision::denied(0, Duration::from_millis(250), Duration::from_secs(1));
    assert_eq!((d.outcome(), d.retry_after()), (Outcome::Denied, Some(Duration::from_millis(250))));
    assert_eq!(d.reset_after(), Duration::from_secs(1));
    assert!(Decision::allowed(4, Duration::ZERO).is_allowed_now());
    assert!(!Decision::delayed(0, Duration::from_secs(1), Duration::ZERO).is_allowed_now());
    assert_eq!(Decision::insufficient(0, Duration::ZERO).retry_after(), None);
    assert_eq!(Decision::table_full().retry_after(), None);
    assert!(Decision::untracked().is_allowed_now());
    assert_eq!(Decision::denied(1, Duration::MAX, Duration::MAX).retry_after_nanos(), Some(Nanos::MAX));
}

#[test]
fn errors_name_what_was_wrong() {
    let messages = [
        Keyed::<FixedWindow, u64>::builder("1/s".parse().unwrap()).capacity(0).build().unwrap_err(),
        Keyed::<FixedWindow, u64>::builder("1/s".parse().unwrap()).shards(3).build().unwrap_err(),
        FixedWindow::new(0, Duration::from_secs(1)).unwrap_err(),
        Keyed::<FixedWindow, u64>::builder("1/s".parse().unwrap())
            .when_full(WhenFull::EvictFullest)
            .build()
            .unwrap_err(),
    ]
    .map(|e: ConfigError| e.to_string());
    assert!(messages[0].contains("capacity must be at least 1"), "{}", messages[0]);
    assert!(messages[1].contains("3 shards") && messages[1].contains("power of two"), "{}", messages[1]);
    assert!(
        messages[2].contains("fixed window limit of 0") && !messages[2].contains("burst"),
        "{}",
        messages[2]
    );
    assert!(messages[3].contains("EvictFullest"), "{}", messages[3]);
    // Runtime changes fail with their own type.
    let l =
        KeyedLimiter::<u64>::builder(TokenBucket::per_second(1).unwrap()).max_overrides(1).build().unwrap();
    let default = tollgate::Tier::DEFAULT;
    l.set_override(&1, default).unwrap();
    assert!(matches!(l.set_override(&2, default), Err(UpdateError::OverridesFull { .. })));
    let e: ParseError = "10r/fortnight".parse::<Nginx>().unwrap_err();
    assert!(e.to_string().contains("fortnight"), "{e}");
}

#[test]
fn configurations_parse_from_strings() {
    assert_eq!("100/min".parse::<TokenBucket>().unwrap(), TokenBucket::per_minute(100).unwrap());
    assert_eq!(
        "10r/s burst=20 nodelay".parse::<Nginx>().unwrap(),
        Nginx::per_second(10).unwrap().burst(20).unwrap().nodelay()
    );
    assert_eq!("7/h".parse::<SlidingLog>().unwrap(), SlidingLog::new(7, Duration::from_secs(3600)).unwrap());
}

#[cfg(feature = "serde")]
#[test]
fn configurations_deserialize_from_their_strings() {
    #[derive(serde::Deserialize)]
    struct Config {
        per_client: TokenBucket,
        per_ip: Nginx,
        per_tenant: SlidingWindow,
        upstream: tollgate::Queued,
    }
    let c: Config = serde_json::from_str(
        r#"{"per_client": "100/min", "per_ip": "10r/s burst=20 nodelay", "per_tenant": "1000/h",
            "upstream": "50/s burst=1 queue=20"}"#,
    )
    .unwrap();
    assert_eq!(
        c.upstream,
        tollgate::Queued::with_max_queued(TokenBucket::new(tollgate::Rate::per_second(50), 1).unwrap(), 20)
            .unwrap()
    );
    assert_eq!(c.per_client, TokenBucket::per_minute(100).unwrap());
    assert_eq!(c.per_ip, Nginx::per_second(10).unwrap().burst(20).unwrap().nodelay());
    assert_eq!(c.per_tenant, SlidingWindow::new(1000, Duration::from_secs(3600)).unwrap());
    let e = serde_json::from_str::<TokenBucket>(r#""100/fortnight""#).unwrap_err().to_string();
    assert!(e.contains("fortnight"), "{e}");
    assert!(serde_json::from_str::<TokenBucket>("100").is_err());
    let m: tollgate::Meter =
        serde_json::from_str(r#""trtcm cir=1Gbit/s cbs=64KiB pir=2Gbit/s pbs=128KiB""#).unwrap();
    assert_eq!(m, tollgate::Meter::trtcm(125_000_000, 65_536, 250_000_000, 131_072).unwrap());
    let e =
        serde_json::from_str::<tollgate::Meter>(r#""srtcm cir=1Gbit/s cbs=64KiB""#).unwrap_err().to_string();
    assert!(e.contains("ebs="), "{e}");
}

/// Every keyed algorithm through one generic function: one type, one set of methods.
fn exercise<A: KeyedAlgorithm>(name: &str, config: A) {
    let clock = ManualClock::new();
    let table: Keyed<A, u64, ManualClock> =
        Keyed::builder(config).capacity(64).seeds([7; 8]).build_with_clock(clock.clone()).unwrap();
    let t0 = table.now();
    // A prefetch is a hint: it decides, counts and inserts nothing.
    table.prefetch(&1);
    assert!(table.is_empty(), "{name}: a prefetch inserted a key");
    assert!(table.peek(&1).is_allowed(), "{name}: a fresh key");
    assert!(table.peek_at(&1, t0).is_allowed() && table.peek_n(&1, 1).is_allowed());
    assert!(table.check(&1).is_allowed() && table.check_at(&2, t0).is_allowed());
    assert!(table.allow(&3) && table.allow_n(&4, 1));
    assert!(table.check_n_at(&5, t0, 0).is_allowed(), "{name}: n = 0 is a report");
    let mut out = [Decision::table_full(); 3];
    assert_eq!(table.check_batch(&[(6u64, 1), (7, 1), (8, 1)], &mut out), 3);
    assert!(out.iter().all(Decision::is_allowed), "{name}: {out:?}");
    let global = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
    assert!(check_all(&[&table.limit(&9) as &dyn Admit, &global], 1).is_allowed());
    // The global limit is spent: key 9's charge is refunded, exactly.
    let before = table.peek(&9);
    assert!(!check_all(&[&table.limit(&9) as &dyn Admit, &global], 1).is_allowed());
    assert_eq!(table.peek(&9), before, "{name}: a refused request is charged to neither");
    let stats = table.stats();
    assert_eq!((stats.live, table.len()), (8, 8), "{name}: {stats:?}");
    assert!(stats.inserts >= 8 && stats.capacity == table.capacity() && table.memory_bytes() > 0);
    assert!(table.lifetime() > Nanos::new(1 << 50) && table.when_full() == WhenFull::Deny);
    let _: A = table.policy();
    // An hour later every key decides as a fresh one, and a sweep reclaims them all.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(table.sweep(), 8, "{name}");
    assert!(table.is_empty());
}

#[test]
fn every_keyed_algorithm_has_the_same_surface() {
    exercise("token bucket", "10/s".parse::<TokenBucket>().unwrap());
    exercise("nginx", "10r/s burst=10 nodelay".parse::<Nginx>().unwrap());
    exercise("fixed window", "10/s".parse::<FixedWindow>().unwrap());
    exercise("sliding window", "10/s".parse::<SlidingWindow>().unwrap());
    exercise("sliding log", "10/s".parse::<SlidingLog>().unwrap());
}

#[test]
fn every_direct_algorithm_has_the_same_surface() {
    fn exercise<A: Algorithm + Clone>(name: &str, config: A) {
        let clock = ManualClock::new();
        let l = Direct::with_clock(config, clock.clone());
        let t0 = l.now();
        assert!(l.peek().is_allowed() && l.peek_n(1).is_allowed() && l.peek_at(t0).is_allowed(), "{name}");
        assert!(l.check().is_allowed() && l.check_at(t0).is_allowed() && l.check_n(1).is_allowed());
        assert!(l.allow() && l.allow_n(1) && l.allow_n_at(t0, 1));
        assert!(l.check_n_at(t0, 0).is_allowed());
        let _: A = l.policy();
        let other = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
        assert!(check_all(&[&l as &dyn Admit, &other], 1).is_allowed());
    }
    exercise("token bucket", "10/s".parse::<TokenBucket>().unwrap());
    exercise("nginx", "10r/s burst=10 nodelay".parse::<Nginx>().unwrap());
    exercise("fixed window", "10/s".parse::<FixedWindow>().unwrap());
    exercise("sliding window", "10/s".parse::<SlidingWindow>().unwrap());
    exercise("sliding log", "10/s".parse::<SlidingLog>().unwrap());
}

#[test]
fn counters_count_every_outcome_without_walking_the_table() {
    let clock = ManualClock::new();
    let plain = Limiter::with_clock(TokenBucket::per_second(1).unwrap(), clock.clone());
    assert_eq!(plain.counters(), None, "off unless asked for");
    let l =
        tollgate::NginxLimiter::with_clock("1r/s burst=1".parse().unwrap(), clock.clone()).with_counters();
    let handle = l.counters_handle().unwrap();
    let outcomes: Vec<Outcome> = (0..4).map(|_| l.check().outcome()).collect();
    assert_eq!(outcomes, [Outcome::Allowed, Outcome::Delayed, Outcome::Denied, Outcome::Denied]);
    let _ = l.check_n(10); // more than burst + 1: insufficient
    let _ = l.peek(); // peeks are not decisions
    let c = l.counters().unwrap();
    assert_eq!((c.allowed, c.delayed, c.denied, c.insufficient, c.decisions()), (1, 1, 2, 1, 5));
    // An exporter polls from another thread, apart from the limiter.
    let polled = std::thread::spawn(move || handle.snapshot()).join().unwrap();
    assert_eq!(polled, c);

    let table = KeyedLimiter::<u64>::builder(TokenBucket::per_minute(1).unwrap())
        .capacity(8)
        .shards(1)
        .when_full(WhenFull::Allow)
        .counters(true)
        .build_with_clock(clock.clone())
        .unwrap();
    let keys = table.capacity() + 5;
    for k in 0..keys {
        let _ = table.check(&k);
    }
    let _ = table.check(&0);
    let c = table.counters().unwrap();
    assert_eq!(c.allowed + c.untracked, keys, "{c:?}");
    assert!(c.untracked > 0 && c.denied == 1 && c.inserts == table.capacity(), "{c:?}");
    assert_eq!(c.evicted_clean + c.evicted_forced, 0);
    // Past a minute every bucket is full again: new keys evict them, cleanly.
    clock.advance(Duration::from_secs(61));
    for k in 100..104u64 {
        let _ = table.check(&k);
    }
    let c = table.counters().unwrap();
    assert_eq!((c.evicted_clean, c.inserts), (4, table.capacity() + 4), "{c:?}");
    // Batches and check_all's own decisions count too.
    let mut out = [Decision::table_full(); 2];
    let _ = table.check_batch(&[(100u64, 1), (101, 1)], &mut out);
    assert!(check_all(&[&table.limit(&7u64) as &dyn Admit], 1).is_allowed());
    assert_eq!(table.counters().unwrap().decisions(), c.decisions() + 3);

    // The token bucket table tests for counters with its tier flags: every check is counted
    // once, under the default tier as built, with a key overridden, and after a tier changed.
    let tiered = KeyedLimiter::<u64>::builder(TokenBucket::per_minute(2).unwrap())
        .tier("gold", TokenBucket::per_minute(1).unwrap())
        .counters(true)
        .build_with_clock(clock.clone())
        .unwrap();
    let gold = tiered.tier("gold").unwrap();
    let outcomes = |t: &KeyedLimiter<u64, ManualClock>, key: u64| -> Vec<Outcome> {
        (0..3).map(|_| t.check(&key).outcome()).collect()
    };
    assert_eq!(outcomes(&tiered, 1), [Outcome::Allowed, Outcome::Allowed, Outcome::Denied]);
    tiered.set_override(&2u64, gold).unwrap();
    assert_eq!(outcomes(&tiered, 2), [Outcome::Allowed, Outcome::Denied, Outcome::Denied]);
    tiered.set_tier_quota(gold, TokenBucket::per_minute(3).unwrap()).unwrap();
    assert_eq!(outcomes(&tiered, 3), [Outcome::Allowed, Outcome::Allowed, Outcome::Denied]);
    let c = tiered.counters().unwrap();
    assert_eq!((c.allowed, c.denied, c.decisions()), (5, 4, 9), "{c:?}");
    let uncounted = KeyedLimiter::<u64>::new(TokenBucket::per_minute(1).unwrap(), 8).unwrap();
    let _ = uncounted.check(&1);
    assert!(uncounted.counters().is_none());
}
