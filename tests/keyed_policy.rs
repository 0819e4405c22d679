//! `Keyed<P, K>` (nginx, fixed window, sliding window per key) against a `HashMap` of the exact
//! reference models (`common/`), under random inserts, decisions, clock advances, sweeps and a
//! full table; plus a multi-thread conservation check, a key flood, the batch API, typed errors
//! and the lifetime.

mod common;

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use common::keyed_models::{self, Op, RefModel};
use common::nginx_model::NginxModel;
use common::window_model::{FixedWindowModel, SlidingWindowModel};
use proptest::prelude::*;
use tollgate::{
    Clock, ConfigError, FixedWindow, Keyed, KeyedFixedWindow, KeyedNginx, KeyedPolicy, KeyedSlidingWindow,
    ManualClock, Nanos, Nginx, Outcome, SlidingWindow, WhenFull,
};

const SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
const MS: u64 = 1_000_000;

/// Ops over `keys` keys with costs up to `most` (and 0 and `most + 1`), and clock steps of up to
/// about `span` ns.
fn ops(most: u64, keys: u64, span: u64) -> impl Strategy<Value = Vec<Op>> {
    let cost = prop_oneof![6 => 1..=most, 1 => Just(0u64), 1 => Just(most + 1)];
    let step = prop_oneof![4 => 0u64..span / 100 + 1, 2 => 0u64..span, 1 => 0u64..span * 20];
    let op = prop_oneof![
        1 => step.prop_map(Op::Advance),
        8 => (0..keys, cost.clone()).prop_map(|(k, n)| Op::Check(k, n)),
        1 => (0..keys, cost).prop_map(|(k, n)| Op::Peek(k, n)),
        1 => Just(Op::Sweep),
    ];
    prop::collection::vec(op, 1..600)
}

/// The comparison's 56-key table (`common/keyed_models.rs`).
fn small<P: KeyedPolicy>(p: P, when_full: WhenFull, clock: &ManualClock) -> Keyed<P, u64, ManualClock> {
    keyed_models::small(p, when_full, SEEDS, clock)
}

/// `keyed_models::compare`, for proptest.
fn matches_models<P: KeyedPolicy, M: RefModel>(
    p: P,
    fresh: impl Fn() -> M,
    most: u64,
    ops: Vec<Op>,
    fail_open: bool,
) -> Result<(), TestCaseError> {
    keyed_models::compare(p, fresh, most, ops, fail_open, SEEDS).map_err(TestCaseError::fail)
}

fn nginx_quota(rate: u64, per_minute: bool, burst: u64, delay: Option<u64>) -> (Nginx, NginxModel) {
    let base = if per_minute { Nginx::per_minute(rate) } else { Nginx::per_second(rate) };
    let q = base.unwrap().burst(burst).unwrap();
    let q = match delay {
        Some(d) => q.delay(d),
        None => q.nodelay(),
    };
    (q, NginxModel::new(rate, if per_minute { 60 } else { 1 }, burst, delay))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn nginx_matches_a_hashmap_of_models(
        rate in prop_oneof![1u64..=20, 1u64..=5_000],
        per_minute in any::<bool>(),
        burst in 0u64..=6,
        delay in prop_oneof![Just(None), (0u64..=4).prop_map(Some)],
        ops in ops(7, 80, 3_000 * MS),
        fail_open in any::<bool>(),
    ) {
        let (q, model) = nginx_quota(rate, per_minute, burst, delay);
        matches_models(q, || model.clone(), burst + 1, ops, fail_open)?;
    }

    #[test]
    fn fixed_window_matches_a_hashmap_of_models(
        limit in 1u64..=6,
        // At least 1 µs: the keyed lifetime (2^38 − 4 windows) outlasts the ops.
        window in prop_oneof![1_000u64..=5_000, 1_000_000u64..=2_000_000_000],
        ops in ops(6, 80, 2_000_000_000),
        fail_open in any::<bool>(),
        charging in any::<bool>(),
    ) {
        let p = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
        if charging {
            // Every refused request up to the largest count is counted, so it reaches the word.
            let model = || FixedWindowModel::charging(limit, window);
            matches_models(p.charging_refusals(), model, FixedWindow::MAX_LIMIT, ops, fail_open)?;
        } else {
            matches_models(p, || FixedWindowModel::new(limit, window), limit, ops, fail_open)?;
        }
    }

    /// A limit above 2^24 − 1 (a wider count, a shorter index), costs in units of a third of it.
    #[test]
    fn a_wide_fixed_window_matches_a_hashmap_of_models(
        limit in prop_oneof![
            (FixedWindow::MAX_LIMIT + 1)..=(FixedWindow::MAX_LIMIT + 6),
            (FixedWindow::MAX_LIMIT + 1)..=FixedWindow::MAX_LONG_LIMIT,
        ],
        window in 1_000_000_000u64..=100_000_000_000,
        ops in ops(4, 80, 200_000_000_000),
        fail_open in any::<bool>(),
        charging in any::<bool>(),
    ) {
        let unit = limit / 3;
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|op| match op {
                Op::Check(k, n) => Op::Check(k, n * unit),
                Op::Peek(k, n) => Op::Peek(k, n * unit),
                other => other,
            })
            .collect();
        let p = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
        let most = (1u64 << (64 - limit.leading_zeros())) - 1;
        if charging {
            let model = || FixedWindowModel::charging(limit, window);
            matches_models(p.charging_refusals(), model, most, ops, fail_open)?;
        } else {
            matches_models(p, || FixedWindowModel::new(limit, window), limit, ops, fail_open)?;
        }
    }

    #[test]
    fn sliding_window_matches_a_hashmap_of_models(
        limit in 1u64..=6,
        window in prop_oneof![1_000_000u64..=2_000_000, 1_000_000u64..=2_000_000_000],
        ops in ops(6, 80, 2_000_000_000),
        fail_open in any::<bool>(),
    ) {
        let p = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
        matches_models(p, || SlidingWindowModel::new(limit, window), limit, ops, fail_open)?;
    }
}

/// nginx's `limit_req` tables from REFERENCE.md, per key: `rate=1r/s burst=5` delays the
/// second to sixth requests by 1..5 s and rejects the seventh; another key is untouched.
#[test]
fn nginx_vectors_per_key() {
    let (q, _) = nginx_quota(1, false, 5, Some(0));
    let l: KeyedNginx<str, ManualClock> =
        Keyed::builder(q).capacity(100).build_with_clock(ManualClock::new()).unwrap();
    let got: Vec<(Outcome, u64)> = (0..7)
        .map(|_| {
            let d = l.check_at("alice", Nanos::ZERO);
            (d.outcome(), d.delay().as_secs())
        })
        .collect();
    let want = [
        (Outcome::Allowed, 0),
        (Outcome::Delayed, 1),
        (Outcome::Delayed, 2),
        (Outcome::Delayed, 3),
        (Outcome::Delayed, 4),
        (Outcome::Delayed, 5),
        (Outcome::Denied, 0),
    ];
    assert_eq!(got, want);
    assert_eq!(l.check_at("bob", Nanos::ZERO).outcome(), Outcome::Allowed);
    // One request leaks per second: at 1 s, one more fits, delayed by 5 s again.
    let d = l.check_at("alice", Nanos::new(1_000 * MS));
    assert_eq!((d.outcome(), d.delay().as_secs()), (Outcome::Delayed, 5));
}

/// A key idle long enough is evicted, and comes back as a new node (whose first request is
/// free, as nginx's): `sweep` reclaims exactly the drained keys.
#[test]
fn sweep_reclaims_exactly_the_fresh_states() {
    let clock = ManualClock::new();
    let (q, _) = nginx_quota(10, false, 2, None);
    let l = small(q, WhenFull::Deny, &clock);
    for k in 0..10 {
        assert!(l.check(&k).is_allowed());
    }
    clock.advance(Duration::from_millis(50));
    assert!(l.check(&3).is_allowed());
    // (burst + 1)·1000 milli-requests drain in 300 ms at 10 r/s; strictly past it, evictable.
    clock.advance(Duration::from_millis(251));
    assert_eq!(l.sweep(), 9);
    assert_eq!(l.len(), 1);
    clock.advance(Duration::from_millis(50));
    assert_eq!(l.sweep(), 1);
    assert!(l.is_empty());
    let s = l.stats();
    assert_eq!((s.inserts, s.evictions), (10, 10));

    let w = small(FixedWindow::new(3, Duration::from_secs(1)).unwrap(), WhenFull::Deny, &clock);
    let s = small(SlidingWindow::new(3, Duration::from_secs(1)).unwrap(), WhenFull::Deny, &clock);
    for k in 0..5 {
        assert!(w.check(&k).is_allowed() && s.check(&k).is_allowed());
    }
    clock.advance(Duration::from_secs(1));
    // The fixed window's words are of the last window: all fresh. The sliding window's still
    // weigh in this one.
    assert_eq!((w.sweep(), s.sweep()), (5, 0));
    clock.advance(Duration::from_secs(1));
    assert_eq!(s.sweep(), 5);
}

/// A full table: Deny refuses new keys with `TableFull`, Allow admits them untracked; tracked
/// keys keep their limits either way; `n = 0` and impossible costs never insert.
#[test]
fn table_full_policies_and_costs_that_never_insert() {
    for (policy, outcome) in [(WhenFull::Deny, Outcome::TableFull), (WhenFull::Allow, Outcome::Untracked)] {
        let clock = ManualClock::new();
        let l = small(FixedWindow::new(2, Duration::from_secs(1)).unwrap(), policy, &clock);
        for k in 0..56 {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(l.check(&1_000).outcome(), outcome);
        assert!(l.check(&5).is_allowed());
        assert_eq!(l.check(&5).outcome(), Outcome::Denied);
        assert_eq!(l.stats().refused, 1);
        clock.advance(Duration::from_secs(1));
        assert!(l.check(&1_000).is_allowed(), "an old window's key gives way");
        assert_eq!(l.check_n(&2_000, 0).outcome(), Outcome::Allowed);
        assert_eq!(l.check_n(&2_001, 3).outcome(), Outcome::Insufficient);
        assert_eq!(l.len(), 56);
    }
}

/// EvictFullest is refused (its ghosts summarize a bucket), and capacity and shards are
/// checked as for the bucket table.
#[test]
fn configuration_errors_are_typed() {
    let p = FixedWindow::new(1, Duration::from_secs(1)).unwrap();
    let e = Keyed::<_, u64>::builder(p).when_full(WhenFull::EvictFullest).build().unwrap_err();
    assert_eq!(e, ConfigError::EvictionUnsupported { algorithm: "fixed window" });
    assert!(e.to_string().contains("WhenFull::Deny"), "{e}");
    assert!(matches!(Keyed::<_, u64>::builder(p).capacity(0).build(), Err(ConfigError::ZeroCapacity)));
    assert!(matches!(
        Keyed::<_, u64>::builder(p).shards(3).build(),
        Err(ConfigError::InvalidShards { shards: 3 })
    ));
    assert!(Keyed::<_, u64>::builder(p).shards(64).capacity(1).build().is_ok());
}

/// The batch API decides as single calls do.
#[test]
fn batch_matches_single_decisions() {
    let clock = ManualClock::new();
    let p = SlidingWindow::new(3, Duration::from_secs(1)).unwrap();
    let build = || -> KeyedSlidingWindow<u64, ManualClock> {
        Keyed::builder(p).capacity(1_000).seeds(SEEDS).build_with_clock(clock.clone()).unwrap()
    };
    let (single, batched) = (build(), build());
    let items: Vec<(u64, u64)> = (0..500u64).map(|i| (i * 7 % 97, 1 + i % 3)).collect();
    let mut out = vec![single.peek(&0); items.len()];
    assert_eq!(batched.check_batch(&items, &mut out), items.len());
    for ((k, n), got) in items.iter().zip(&out) {
        assert_eq!(*got, single.check_n(k, *n));
    }
}

/// Threads deciding on shared keys within one window: each key admits exactly its limit, no
/// more, whatever the interleaving (the CAS loop on the table's words), for all three policies.
#[test]
fn concurrent_decisions_conserve_every_keys_limit() {
    fn run<P: KeyedPolicy + Send + Sync + 'static>(p: P, limit: u64) {
        let l: Arc<Keyed<P, u64, ManualClock>> = Arc::new(
            Keyed::builder(p).capacity(4_096).shards(4).build_with_clock(ManualClock::new()).unwrap(),
        );
        const KEYS: usize = 2_000;
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    let mut admitted = vec![0u64; KEYS];
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..200_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = x % KEYS as u64;
                        if l.check_at(&k, Nanos::ZERO).outcome() != Outcome::Denied {
                            admitted[usize::try_from(k).unwrap()] += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut total = vec![0u64; KEYS];
        for t in threads {
            for (sum, a) in total.iter_mut().zip(t.join().unwrap()) {
                *sum += a;
            }
        }
        assert!(total.iter().all(|&a| a == limit), "{:?}", &total[..8]);
        assert_eq!(l.len(), KEYS as u64);
    }
    run(FixedWindow::new(7, Duration::from_secs(1)).unwrap(), 7);
    run(SlidingWindow::new(7, Duration::from_secs(1)).unwrap(), 7);
    run(Nginx::per_second(1).unwrap().burst(6).unwrap().nodelay(), 7);
    run(Nginx::per_second(1).unwrap().burst(6).unwrap(), 7); // the delayed ones count too
}

/// An IPv6 spray of 100× the capacity in distinct keys: memory is what was allocated at
/// construction, and a well-behaved key tracked before the flood keeps its limit.
#[test]
fn key_flood_keeps_memory_flat_and_limits_intact() {
    let clock = ManualClock::new();
    let p = FixedWindow::new(5, Duration::from_secs(60)).unwrap();
    let l: KeyedFixedWindow<Ipv6Addr, ManualClock> =
        Keyed::builder(p).capacity(1_000).build_with_clock(clock.clone()).unwrap();
    let good = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    for _ in 0..3 {
        assert!(l.check(&good).is_allowed());
    }
    let memory = l.memory_bytes();
    let mut refused = 0u64;
    for i in 0..100_000u64 {
        let k = Ipv6Addr::from((0x2001_0db8_0001u128 << 80) | u128::from(i));
        if l.check(&k).outcome() == Outcome::TableFull {
            refused += 1;
        }
    }
    assert_eq!(l.memory_bytes(), memory);
    assert!(l.len() <= l.capacity());
    assert!(refused >= 100_000 - l.capacity());
    assert!(l.check(&good).is_allowed() && l.check(&good).is_allowed());
    assert_eq!(l.check(&good).outcome(), Outcome::Denied, "the good key kept its count");
}

/// The clock stops at the lifetime: past it no window ends, and the limiter only denies once
/// a key has spent its limit; every word stays within the table's 62 bits.
#[test]
fn lifetime_saturation() {
    let clock = ManualClock::new();
    let p = FixedWindow::new(1, Duration::from_nanos(1)).unwrap();
    let l: KeyedFixedWindow<u64, ManualClock> =
        Keyed::builder(p).capacity(10).build_with_clock(clock.clone()).unwrap();
    assert_eq!(l.lifetime(), Nanos::new((1 << 38) - 5));
    let end = Nanos::new(u64::MAX);
    assert!(l.check_at(&1, end).is_allowed());
    let d = l.check_at(&1, end);
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.retry_after_nanos(), Some(Nanos::MAX), "no wait helps once the clock has stopped");
    assert_eq!(l.peek_n_at(&1, end, 1).retry_after_nanos(), Some(Nanos::MAX));

    let (q, _) = nginx_quota(1, false, 0, None);
    let n: KeyedNginx<u64, ManualClock> =
        Keyed::builder(q).capacity(10).build_with_clock(clock.clone()).unwrap();
    assert!(n.lifetime().as_u64() / (365 * 86_400 * 1_000_000_000) >= 8);
    assert!(n.check_at(&1, end).is_allowed());
    assert_eq!(n.check_at(&1, end).outcome(), Outcome::Denied);

    let s = SlidingWindow::new(1, Duration::from_secs(1)).unwrap();
    let s: KeyedSlidingWindow<u64, ManualClock> =
        Keyed::builder(s).capacity(10).build_with_clock(clock).unwrap();
    assert!(s.check_at(&1, end).is_allowed());
    assert_eq!(s.check_at(&1, end).outcome(), Outcome::Denied);
}

/// nginx's eviction line, at the millisecond: a node filled to its burst is kept until its
/// excess and one request more can have leaked, `⌈(burst + 1000)·1000 / rate⌉` ms, and its
/// decisions match the model's on both sides of the line.
#[test]
fn nginx_eviction_line_is_exact() {
    for (rate, per_minute, burst) in
        [(1, false, 0), (1, false, 5), (3, false, 2), (7, true, 4), (1000, false, 9), (17, false, 0)]
    {
        let (q, mut model) = nginx_quota(rate, per_minute, burst, None);
        let milli = if per_minute { rate * 1000 / 60 } else { rate * 1000 };
        let line = ((burst * 1000 + 1000) * 1000).div_ceil(milli);
        let clock = ManualClock::new();
        let l = small(q, WhenFull::Deny, &clock);
        clock.advance(Duration::from_millis(5));
        let at = clock.now().as_u64();
        assert!(l.check_n(&1, burst + 1).is_allowed());
        model.check_n(at, burst + 1);
        clock.advance(Duration::from_millis(line - 1));
        assert_eq!(l.sweep(), 0, "rate {rate} burst {burst}: evicted at {} ms", line - 1);
        assert!(!model.evictable(clock.now().as_u64()));
        clock.advance(Duration::from_millis(1));
        assert!(model.evictable(clock.now().as_u64()));
        assert_eq!(l.sweep(), 1, "rate {rate} burst {burst}: kept at {line} ms");
        let now = clock.now().as_u64();
        assert_eq!(NginxModel::answer(&l.check_n(&1, burst + 1)), model.check_n(now, burst + 1));
    }
}

/// A decision whose clock is behind a sweep's takes the swept slot (the review's trace, in one
/// thread): the slot's high-water mark, the evicted word + 1, is then above the fresh word of
/// the decision's window, and is a count one above the limit (fixed window) or an excess above
/// the burst (nginx), not a state. The new key starts from the next fresh state above it
/// instead: nothing counted, no panic, its limit whole (an nginx key's first request passes, as
/// a new node's, decided at the instant its start word is fresh).
#[test]
fn a_stale_decision_after_a_sweep_starts_from_a_state() {
    let clock = ManualClock::new();
    let l = small(FixedWindow::new(3, Duration::from_nanos(1_000)).unwrap(), WhenFull::Deny, &clock);
    for k in 0..56 {
        assert!(l.check_n_at(&k, Nanos::new(500), 3).is_allowed());
    }
    clock.set(Nanos::new(1_500));
    assert_eq!(l.sweep(), 56);
    // A thread that read 500 ns before the sweep decides now, on a new key, in a swept slot.
    for k in 100..110 {
        let d = l.check_at(&k, Nanos::new(500));
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), 2);
    }

    let (q, _) = nginx_quota(1, false, 0, None);
    let n = small(q, WhenFull::Deny, &clock);
    clock.set(Nanos::ZERO);
    for k in 0..56 {
        assert!(n.check_at(&k, Nanos::ZERO).is_allowed());
    }
    clock.set(Nanos::new(1_002 * MS));
    assert_eq!(n.sweep(), 56);
    for k in 100..110 {
        // A new node's first request passes, whatever key left the slot's mark.
        let d = n.check_at(&k, Nanos::ZERO);
        assert_eq!((d.outcome(), d.remaining()), (Outcome::Allowed, 0), "{d:?}");
        let _ = n.peek_n_at(&k, Nanos::ZERO, 0);
    }
}
