//! Configurations replaced at runtime (`Direct::set_policy`, `Keyed::set_policy`) against the
//! exact models, which keep their state across the change as the documentation says: the
//! bucket's empty instant, nginx's node, the windows' counts, the log's expiries. Every field of
//! every decision is compared, before and after each change; a refused change changes nothing.

mod common;

use std::time::Duration;

use common::log_model::LogModel;
use common::model::{Answer, Model};
use common::nginx_model::NginxModel;
use common::window_model::{answer, FixedWindowModel, SlidingWindowModel};
use proptest::prelude::*;
use tollgate::{
    Admit, ConfigError, FixedWindow, Keyed, Limiter, ManualClock, Nanos, Nginx, NginxLimiter, Outcome, Rate,
    SlidingLog, SlidingLogLimiter, SlidingWindow, TokenBucket, UpdateError,
};

const MS: u64 = 1_000_000;

#[derive(Clone, Debug)]
enum Op<C> {
    Advance(u64),
    Check(u64),
    Peek(u64),
    Set(C),
}

fn ops<C: Clone + std::fmt::Debug>(
    config: impl Strategy<Value = C> + 'static,
    advance: impl Strategy<Value = u64> + 'static,
) -> impl Strategy<Value = Vec<Op<C>>> {
    prop::collection::vec(
        prop_oneof![
            3 => advance.prop_map(Op::Advance),
            6 => (0u64..4).prop_map(Op::Check),
            1 => (0u64..4).prop_map(Op::Peek),
            1 => config.prop_map(Op::Set),
        ],
        1..80,
    )
}

fn bucket() -> impl Strategy<Value = (u64, u64, u64)> {
    // (tokens, period in ms, burst): rates from 1 per 2 s to 1000/s.
    (1u64..=20, prop_oneof![Just(1_000u64), 1u64..=2_000], 1u64..=8)
}

fn quota((tokens, period_ms, burst): (u64, u64, u64)) -> TokenBucket {
    TokenBucket::new(Rate::per(tokens, Duration::from_millis(period_ms)), burst).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The token bucket keeps its empty instant: the model is re-quoted with the quota as the
    /// limiter compiled it, and agrees on every decision. A quota beyond the limiter's largest
    /// fill time is refused and changes nothing.
    #[test]
    fn a_direct_bucket_keeps_its_empty_instant(
        first in bucket(),
        headroom_ms in prop_oneof![Just(0u64), 0u64..20_000],
        ops in ops(bucket(), prop_oneof![0u64..5 * MS, 0u64..3_000 * MS]),
    ) {
        let clock = ManualClock::new();
        let q = quota(first).with_max_fill_time(Duration::from_millis(headroom_ms)).unwrap();
        let l = Limiter::with_clock(q, clock.clone());
        let mut model = Model::new(&l.policy());
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Advance(by) => now += by,
                Op::Check(n) => {
                    let got = Answer::of(&l.check_n_at(Nanos::new(now), n));
                    prop_assert_eq!(got, model.decide(now, n, true), "check {} at {}", n, now);
                }
                Op::Peek(n) => {
                    let got = Answer::of(&l.peek_n_at(Nanos::new(now), n));
                    prop_assert_eq!(got, model.decide(now, n, false), "peek {} at {}", n, now);
                }
                Op::Set(c) => match l.set_policy(quota(c)) {
                    Ok(()) => {
                        let compiled = l.policy();
                        prop_assert_eq!(compiled.burst(), c.2);
                        prop_assert_eq!(compiled.units_per_nano(), q.units_per_nano());
                        model.requote(&compiled);
                    }
                    Err(UpdateError::Config(ConfigError::FillAboveMaxFillTime { fill_nanos, max_nanos })) => {
                        prop_assert!(fill_nanos > max_nanos);
                        prop_assert!(l.policy().fill_time().as_u64() <= q.max_fill_time().as_u64());
                    }
                    Err(e) => prop_assert!(false, "unexpected {}", e),
                },
            }
        }
    }

    /// nginx keeps its node and leaks it at the new rate, as a reload does.
    #[test]
    fn a_direct_nginx_keeps_its_node(
        first in (1u64..=50, 0u64..=6, prop::option::of(0u64..=4)),
        ops in ops((1u64..=50, 0u64..=6, prop::option::of(0u64..=4)), prop_oneof![0u64..3 * MS, 0u64..2_000 * MS]),
    ) {
        let build = |(rate, burst, delay): (u64, u64, Option<u64>)| {
            let q = Nginx::per_second(rate).unwrap().burst(burst).unwrap();
            match delay { Some(d) => q.delay(d), None => q.nodelay() }
        };
        let l = NginxLimiter::with_clock(build(first), ManualClock::new());
        let mut model = NginxModel::new(first.0, 1, first.1, first.2);
        let mut now = 0u64;
        let nginx_answer = |d: &tollgate::Decision| {
            let wait = match d.outcome() { Outcome::Denied => d.retry_after().unwrap(), _ => d.delay() };
            (d.outcome(), d.remaining(), u64::try_from(wait.as_millis()).unwrap(), u64::try_from(d.reset_after().as_millis()).unwrap())
        };
        for op in ops {
            match op {
                Op::Advance(by) => now += by,
                Op::Check(n) => {
                    let d = l.check_n_at(Nanos::new(now), n);
                    prop_assert_eq!(nginx_answer(&d), model.check_n(now, n), "n = {} at {}", n, now);
                }
                Op::Peek(_) => {}
                Op::Set(c) => {
                    l.set_policy(build(c)).unwrap();
                    prop_assert_eq!(l.policy(), build(c));
                    model.reconfigure(c.0, 1, c.1, c.2);
                }
            }
        }
    }

    /// The windows keep their counts; a new limit counts them (a count above it refuses until
    /// the window ends); a new window length is refused.
    #[test]
    fn direct_windows_keep_their_counts(
        first in 1u64..=6,
        sliding in any::<bool>(),
        ops in ops(1u64..=7, prop_oneof![0u64..300 * MS, 0u64..3_000 * MS]),
    ) {
        let w = Duration::from_secs(1);
        let clock = ManualClock::new();
        let mut now = 0u64;
        if sliding {
            let l = tollgate::SlidingWindowLimiter::with_clock(SlidingWindow::new(first, w).unwrap(), clock);
            let mut model = SlidingWindowModel::new(first, 1_000 * MS);
            let width = (first + 1).next_power_of_two() - 1;
            for op in ops {
                match op {
                    Op::Advance(by) => now += by,
                    Op::Check(n) => prop_assert_eq!(answer(&l.check_n_at(Nanos::new(now), n)), model.check_n(now, n)),
                    Op::Peek(_) => {}
                    Op::Set(limit) => match l.set_policy(SlidingWindow::new(limit, w).unwrap()) {
                        Ok(()) => { prop_assert!(limit <= width); model.set_limit(limit) }
                        Err(UpdateError::Incompatible { .. }) => prop_assert!(limit > width),
                        Err(e) => prop_assert!(false, "unexpected {}", e),
                    },
                }
            }
            prop_assert!(l.set_policy(SlidingWindow::new(1, 2 * w).unwrap()).is_err());
        } else {
            let l = tollgate::FixedWindowLimiter::with_clock(FixedWindow::new(first, w).unwrap(), clock);
            let mut model = FixedWindowModel::new(first, 1_000 * MS);
            for op in ops {
                match op {
                    Op::Advance(by) => now += by,
                    Op::Check(n) => prop_assert_eq!(answer(&l.check_n_at(Nanos::new(now), n)), model.check_n(now, n)),
                    Op::Peek(_) => {}
                    Op::Set(limit) => {
                        l.set_policy(FixedWindow::new(limit, w).unwrap()).unwrap();
                        model.set_limit(limit);
                    }
                }
            }
            let refused = matches!(l.set_policy(FixedWindow::new(1, 2 * w).unwrap()), Err(UpdateError::Incompatible { .. }));
            prop_assert!(refused);
        }
    }

    /// The sliding log keeps its newest entries, each expiring when it was going to; direct, it
    /// resizes to the new limit; per key, it counts the newest `limit` of the entries it has
    /// room for. Both against the definition.
    #[test]
    fn logs_keep_their_expiries(
        first in 1u64..=6,
        ops in ops((1u64..=6, prop_oneof![Just(1_000u64), 1u64..=3_000]), prop_oneof![0u64..300 * MS, 0u64..3_000 * MS]),
    ) {
        let clock = ManualClock::new();
        let log = |limit: u64, ms: u64| SlidingLog::new(limit, Duration::from_millis(ms)).unwrap();
        let direct = SlidingLogLimiter::with_clock(log(first, 1_000), clock.clone());
        let keyed = Keyed::<SlidingLog, u8>::builder(log(first, 1_000)).capacity(8).build_with_clock(clock.clone()).unwrap();
        let (mut d_model, mut k_model) = (LogModel::new(first, 1_000 * MS), LogModel::new(first, 1_000 * MS));
        let ans = |d: &tollgate::Decision| {
            let retry = if d.outcome() == Outcome::Denied { d.retry_after_nanos().unwrap().as_u64() } else { 0 };
            (d.outcome(), d.remaining(), retry, d.reset_after_nanos().as_u64())
        };
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Advance(by) => now += by,
                Op::Check(n) => {
                    prop_assert_eq!(ans(&direct.check_n_at(Nanos::new(now), n)), d_model.check_n(now, n, true), "direct");
                    prop_assert_eq!(ans(&keyed.check_n_at(&1, Nanos::new(now), n)), k_model.check_n(now, n, true), "keyed");
                }
                Op::Peek(n) => {
                    prop_assert_eq!(ans(&direct.peek_n_at(Nanos::new(now), n)), d_model.check_n(now, n, false));
                    prop_assert_eq!(ans(&keyed.peek_n_at(&1, Nanos::new(now), n)), k_model.check_n(now, n, false));
                }
                Op::Set((limit, ms)) => {
                    direct.set_policy(log(limit, ms)).unwrap();
                    d_model.reconfigure(limit, ms * MS);
                    match keyed.set_policy(log(limit, ms)) {
                        Ok(()) => k_model.reconfigure_keyed(limit, ms * MS),
                        Err(UpdateError::Incompatible { .. }) => prop_assert!(limit > first),
                        Err(e) => prop_assert!(false, "unexpected {}", e),
                    }
                }
            }
        }
    }

    /// Keyed windows and nginx: the decisions after a change are the model's, key by key, and
    /// the table keeps reclaiming states by the lines it was built with (a sweep changes no
    /// decision).
    #[test]
    fn keyed_policies_change_what_they_may(
        first in 1u64..=6,
        ops in prop::collection::vec(
            prop_oneof![
                3 => prop_oneof![0u64..300 * MS, 0u64..3_000 * MS].prop_map(|t| (0u8, t)),
                6 => (0u64..8).prop_map(|k| (1u8, k)),
                1 => (1u64..=7).prop_map(|l| (2u8, l)),
                1 => Just((3u8, 0)),
            ],
            1..80,
        ),
    ) {
        let w = Duration::from_secs(1);
        let clock = ManualClock::new();
        let t = Keyed::<FixedWindow, u64>::builder(FixedWindow::new(first, w).unwrap())
            .capacity(64)
            .build_with_clock(clock.clone())
            .unwrap();
        let mut models: Vec<FixedWindowModel> = (0..4).map(|_| FixedWindowModel::new(first, 1_000 * MS)).collect();
        let mut now = 0u64;
        for (kind, x) in ops {
            match kind {
                0 => now += x,
                1 => {
                    let key = x % 4;
                    let got = answer(&t.check_n_at(&key, Nanos::new(now), x / 4 + 1));
                    prop_assert_eq!(got, models[usize::try_from(key).unwrap()].check_n(now, x / 4 + 1), "key {}", key);
                }
                2 => {
                    t.set_policy(FixedWindow::new(x, w).unwrap()).unwrap();
                    models.iter_mut().for_each(|m| m.set_limit(x));
                }
                _ => {
                    clock.set(Nanos::new(now));
                    let _ = t.sweep();
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// nginx per key with its burst and delay changed at runtime, sweeps in between: every
    /// decision is the model's (a node reclaimed by the lines of the burst the table was built
    /// with decides as a new node under every smaller burst).
    #[test]
    fn keyed_nginx_keeps_its_nodes(
        rate in 1u64..=50,
        first in 0u64..=6,
        ops in prop::collection::vec(
            prop_oneof![
                3 => prop_oneof![0u64..3 * MS, 0u64..2_000 * MS].prop_map(|t| (0u8, t, None)),
                6 => (0u64..12).prop_map(|k| (1u8, k, None)),
                1 => (0u64..=6, prop::option::of(0u64..=4)).prop_map(|(b, d)| (2u8, b, d)),
                1 => Just((3u8, 0, None)),
            ],
            1..100,
        ),
    ) {
        let build = |burst: u64, delay: Option<u64>| {
            let q = Nginx::per_second(rate).unwrap().burst(burst).unwrap();
            match delay { Some(d) => q.delay(d), None => q.nodelay() }
        };
        let clock = ManualClock::new();
        let t = Keyed::<Nginx, u64>::builder(build(first, None)).capacity(64).build_with_clock(clock.clone()).unwrap();
        let mut models: Vec<NginxModel> = (0..4).map(|_| NginxModel::new(rate, 1, first, None)).collect();
        let nginx_answer = |d: &tollgate::Decision| {
            let wait = match d.outcome() { Outcome::Denied => d.retry_after().unwrap(), _ => d.delay() };
            (d.outcome(), d.remaining(), u64::try_from(wait.as_millis()).unwrap(), u64::try_from(d.reset_after().as_millis()).unwrap())
        };
        let mut now = 0u64;
        for (kind, x, delay) in ops {
            match kind {
                0 => now += x,
                1 => {
                    let (key, n) = (x % 4, x / 4);
                    let got = nginx_answer(&t.check_n_at(&key, Nanos::new(now), n));
                    prop_assert_eq!(got, models[usize::try_from(key).unwrap()].check_n(now, n), "key {} n {} at {}", key, n, now);
                }
                2 => match t.set_policy(build(x, delay)) {
                    Ok(()) => models.iter_mut().for_each(|m| m.reconfigure(rate, 1, x, delay)),
                    Err(UpdateError::Incompatible { .. }) => prop_assert!(x > first),
                    Err(e) => prop_assert!(false, "unexpected {}", e),
                },
                _ => {
                    clock.set(Nanos::new(now));
                    let _ = t.sweep();
                }
            }
        }
    }
}

/// nginx per key: the rate is fixed (it sets when a key's state is a fresh key's), the burst
/// may shrink and grow back up to the one built with, the delay may change.
#[test]
fn keyed_nginx_changes_what_its_lines_allow() {
    let q = |rate: u64, burst: u64| Nginx::per_second(rate).unwrap().burst(burst).unwrap();
    let t = Keyed::<Nginx, u64>::new(q(10, 5).nodelay(), 100).unwrap();
    assert!(t.set_policy(q(10, 2)).is_ok());
    assert!(t.set_policy(q(10, 5).delay(1)).is_ok());
    assert!(matches!(t.set_policy(q(10, 6)), Err(UpdateError::Incompatible { .. })));
    assert!(matches!(t.set_policy(q(20, 5)), Err(UpdateError::Incompatible { .. })));
    assert_eq!(t.policy(), q(10, 5).delay(1));
}

/// The token bucket per key changes its default tier's quota; the sliding window keeps its
/// counts' width; a refused change leaves the policy as it was.
#[test]
fn keyed_changes_are_refused_whole() {
    let table = Keyed::<TokenBucket, u64>::new(TokenBucket::per_second(10).unwrap(), 100).unwrap();
    table.set_policy(TokenBucket::per_second(5).unwrap()).unwrap();
    assert_eq!(table.policy().burst(), 5);
    let slow = TokenBucket::new(Rate::per_second(1), 100).unwrap();
    assert!(matches!(table.set_policy(slow), Err(UpdateError::Config(ConfigError::TierFillTooLong { .. }))));
    assert_eq!(table.policy().burst(), 5);
    let sliding =
        Keyed::<SlidingWindow, u64>::new(SlidingWindow::new(5, Duration::from_secs(1)).unwrap(), 100)
            .unwrap();
    assert!(sliding.set_policy(SlidingWindow::new(7, Duration::from_secs(1)).unwrap()).is_ok());
    assert!(sliding.set_policy(SlidingWindow::new(8, Duration::from_secs(1)).unwrap()).is_err());
    assert_eq!(sliding.policy().limit(), 7);
}

/// A multi-limit charge made under one configuration is not refunded under another: a change
/// between the charge and the refund leaves the units spent (errs toward refusal).
#[test]
fn refunds_do_not_cross_a_change() {
    let clock = ManualClock::new();
    let q = TokenBucket::per_second(2).unwrap().with_max_fill_time(Duration::from_secs(10)).unwrap();
    let l = Limiter::with_clock(q, clock.clone());
    let (d, receipt) = l.charge(1);
    assert!(d.is_allowed());
    l.set_policy(TokenBucket::per_second(2).unwrap()).unwrap();
    l.refund(receipt.unwrap());
    assert_eq!(l.peek_n(0).remaining(), 1, "the charge stays");
    // Without a change, the same refund gives the token back.
    let (_, receipt) = l.charge(1);
    l.refund(receipt.unwrap());
    assert_eq!(l.peek_n(0).remaining(), 1);
}

/// A policy of the caller's own has no words to change through: refused, typed.
#[test]
fn a_policy_of_your_own_cannot_change_at_runtime() {
    #[derive(Clone, Debug)]
    struct Always;
    impl tollgate::Policy for Always {
        fn decide(&self, _: u64, _: Nanos, _: u64) -> (Option<u64>, tollgate::Decision) {
            (None, tollgate::Decision::allowed(1, Duration::ZERO))
        }
    }
    let l = tollgate::Direct::new(Always);
    assert!(l.check().is_allowed());
    assert_eq!(l.set_policy(Always).unwrap_err(), UpdateError::Unsupported);
    assert!(UpdateError::Unsupported.to_string().contains("cannot change"));
}
