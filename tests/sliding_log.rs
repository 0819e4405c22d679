//! The sliding log, direct and keyed, against its definition unit by unit (`common/log_model.rs`);
//! the keyed table's bounds under a flood of keys.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::log_model::{LogAnswer, LogModel};
use proptest::prelude::*;
use tollgate::{
    ConfigError, Decision, KeyedSlidingLog, ManualClock, Nanos, Outcome, SlidingLog, SlidingLogLimiter,
    WhenFull,
};

fn answer(d: &Decision) -> LogAnswer {
    let retry = if d.outcome() == Outcome::Denied { d.retry_after_nanos().unwrap().as_u64() } else { 0 };
    (d.outcome(), d.remaining(), retry, d.reset_after_nanos().as_u64())
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    // (gap in ns, cost, take): gaps from 0 to a few windows; costs around the limit.
    prop::collection::vec(
        (prop_oneof![Just(0u64), 0u64..5_000, 0u64..40_000], 0u64..6, prop::bool::weighted(0.9)),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Every answer (outcome, remaining, exact retry and reset) equals the definition's.
    #[test]
    fn direct_matches_the_definition(limit in 1u64..6, window in 1u64..20_000, ops in arrivals()) {
        let log = SlidingLog::new(limit, Duration::from_nanos(window)).unwrap();
        let l = SlidingLogLimiter::with_clock(log, ManualClock::new());
        let mut m = LogModel::new(limit, window);
        let mut now = 0u64;
        for (gap, n, take) in ops {
            now += gap;
            let d = if take { l.check_n_at(Nanos::new(now), n) } else { l.peek_n_at(Nanos::new(now), n) };
            prop_assert_eq!(answer(&d), m.check_n(now, n, take), "at {} ns, n = {}", now, n);
        }
    }

    /// Clocks that step back: the engine follows the model's rule (stored as of the newest
    /// admission), and never admits more than `limit` units whose stored instants lie in any
    /// window.
    #[test]
    fn backwards_clocks_stay_within_the_limit(limit in 1u64..6, window in 1u64..20_000,
        ops in prop::collection::vec((0u64..60_000, 0u64..4), 1..100)) {
        let log = SlidingLog::new(limit, Duration::from_nanos(window)).unwrap();
        let l = SlidingLogLimiter::with_clock(log, ManualClock::new());
        let mut m = LogModel::new(limit, window);
        let mut admitted: Vec<u64> = vec![];
        let mut newest = 0;
        for (at, n) in ops {
            let d = l.check_n_at(Nanos::new(at), n);
            prop_assert_eq!(answer(&d), m.check_n(at, n, true));
            if d.is_allowed() && n > 0 {
                newest = newest.max(at);
                admitted.extend(std::iter::repeat(newest).take(usize::try_from(n).unwrap()));
            }
        }
        for &t in &admitted {
            let inside = admitted.iter().filter(|&&u| u >= t && u < t + window).count() as u64;
            prop_assert!(inside <= limit);
        }
    }

    /// Keyed: each key is the definition's, as long as the table has room.
    #[test]
    fn keyed_matches_a_map_of_definitions(limit in 1u64..5, window in 1u64..20_000,
        ops in prop::collection::vec((0u64..8, 0u64..5_000, 0u64..4, prop::bool::weighted(0.9)), 1..200)) {
        let log = SlidingLog::new(limit, Duration::from_nanos(window)).unwrap();
        let l = KeyedSlidingLog::<u64>::builder(log).capacity(64).seeds([1, 2, 3, 4, 5, 6, 7, 8])
            .build_with_clock(ManualClock::new()).unwrap();
        let mut models: HashMap<u64, LogModel> = HashMap::new();
        let mut now = 0;
        for (key, gap, n, take) in ops {
            now += gap;
            let m = models.entry(key).or_insert_with(|| LogModel::new(limit, window));
            let d = if take { l.check_n_at(&key, Nanos::new(now), n) } else { l.peek_n_at(&key, Nanos::new(now), n) };
            prop_assert_eq!(answer(&d), m.check_n(now, n, take), "key {} at {} ns", key, now);
        }
    }
}

/// One shard of 32 slots, all probed: 32 keys fill it; the 33rd is refused until a log expires,
/// then takes that slot over, and the expired key comes back with an empty log.
#[test]
fn a_full_table_refuses_new_keys_until_logs_expire() {
    let log = SlidingLog::new(2, Duration::from_secs(1)).unwrap();
    let clock = ManualClock::new();
    let l =
        KeyedSlidingLog::<u64>::builder(log).capacity(28).shards(1).build_with_clock(clock.clone()).unwrap();
    assert_eq!(l.capacity(), 32);
    for k in 0..32u64 {
        assert!(l.check(&k).is_allowed());
    }
    assert_eq!(l.check(&100).outcome(), Outcome::TableFull);
    assert_eq!(l.len(), 32);
    // Tracked keys are never displaced: key 0 still holds its unit.
    assert_eq!(l.check_n(&0, 2).outcome(), Outcome::Denied);
    clock.advance(Duration::from_millis(999));
    assert_eq!(l.check(&100).outcome(), Outcome::TableFull);
    clock.advance(Duration::from_millis(1));
    // Every log but key 0's has expired (key 0's second check was refused, storing nothing).
    assert!(l.check_n(&100, 2).is_allowed());
    assert!(l.check_n(&7, 2).is_allowed());
    assert_eq!(l.len(), 32);

    let open = KeyedSlidingLog::<u64>::builder(log)
        .capacity(28)
        .shards(1)
        .when_full(WhenFull::Allow)
        .build_with_clock(ManualClock::new())
        .unwrap();
    for k in 0..32u64 {
        let _ = open.check(&k);
    }
    assert_eq!(open.check(&100).outcome(), Outcome::Untracked);
    assert!(open.check(&100).is_allowed());
}

/// A flood of 100 × capacity distinct keys, each sending more than its limit: the table's memory
/// is what construction allocated, no key holds more than `limit` entries, and the well-behaved
/// keys, tracked before the flood, keep their exact limits throughout.
#[test]
fn a_key_flood_keeps_memory_bounded_and_good_keys_limited() {
    let log = SlidingLog::new(5, Duration::from_secs(60)).unwrap();
    let clock = ManualClock::new();
    let l = KeyedSlidingLog::<u64>::builder(log)
        .capacity(1024)
        .seeds([9; 8])
        .build_with_clock(clock.clone())
        .unwrap();
    let memory = l.memory_bytes();
    let mut good: HashMap<u64, LogModel> =
        (0..50u64).map(|k| (k, LogModel::new(5, 60_000_000_000))).collect();
    for (k, m) in &mut good {
        assert_eq!(answer(&l.check(k)), m.check_n(0, 1, true));
    }
    let mut now = 0;
    let mut refused = 0;
    for i in 0..102_400u64 {
        now += 10_000; // 10 µs per flood key: the whole flood lasts about a second, inside the window
        clock.set(Nanos::new(now));
        let spam = 1_000_000 + i;
        for _ in 0..7 {
            if l.check(&spam).outcome() == Outcome::TableFull {
                refused += 1;
            }
        }
        if i % 97 == 0 {
            let k = i % 50;
            let d = l.check(&k);
            let want = good.get_mut(&k).unwrap().check_n(now, 1, true);
            assert_eq!(answer(&d), want, "good key {k} at {now} ns");
        }
    }
    assert_eq!(l.memory_bytes(), memory);
    assert!(l.len() <= l.capacity());
    assert!(refused > 0, "the flood filled the table");
    println!("memory {memory} B for {} keys; {refused} flood decisions refused", l.capacity());
}

#[test]
fn configuration_errors_are_typed() {
    assert_eq!(
        SlidingLog::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroLimit { algorithm: "sliding log" })
    );
    assert!(matches!(
        SlidingLog::new(SlidingLog::MAX_LIMIT + 1, Duration::from_secs(1)),
        Err(ConfigError::LimitTooLarge { algorithm: "sliding log", .. })
    ));
    assert_eq!(SlidingLog::new(1, Duration::ZERO), Err(ConfigError::ZeroWindow { algorithm: "sliding log" }));
    let log = SlidingLog::new(SlidingLog::MAX_LIMIT, Duration::from_secs(1)).unwrap();
    assert!(matches!(
        KeyedSlidingLog::<u64>::builder(log).capacity(1 << 20).build(),
        Err(ConfigError::CapacityTooLarge { capacity: 1_048_576, .. })
    ));
    assert!(matches!(
        KeyedSlidingLog::<u64>::builder(log).capacity(0).build(),
        Err(ConfigError::ZeroCapacity)
    ));
    assert!(KeyedSlidingLog::<u64>::builder(log)
        .when_full(WhenFull::EvictFullest)
        .capacity(8)
        .build()
        .is_err_and(|e| e == ConfigError::EvictionUnsupported { algorithm: "sliding log" }));
    assert!(matches!(
        KeyedSlidingLog::<u64>::builder(log).shards(3).capacity(8).build(),
        Err(ConfigError::InvalidShards { shards: 3 })
    ));
}
