//! What upstream cannot: per rule, tollgate's algorithms (`algorithm`), windows of several units
//! (`unit_multiplier`) and rejected hits that take nothing (`count_rejected_hits: false`), each
//! against hand vectors and, over random traffic, against an exact model of its bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_envoy::{Code, Config, Limits, LoadOptions, Request, RequestDescriptor, Status};

const SECOND: u64 = 1_000_000_000;
/// A minute boundary, far from any window's end in the tests below.
const T0: u64 = 1_700_000_040 * SECOND;

struct Rule {
    now: Arc<AtomicU64>,
    limits: Limits,
}

impl Rule {
    /// A domain `d` with one descriptor `k` whose `rate_limit` is `rate_limit` (YAML flow map
    /// body), at `T0`.
    fn new(rate_limit: &str) -> Rule {
        Rule::try_new(rate_limit).unwrap()
    }

    fn try_new(rate_limit: &str) -> Result<Rule, tollgate_envoy::ConfigError> {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{rate_limit}}}\n");
        let config = Config::from_files([("rule.yaml", yaml.as_str())], LoadOptions::default())?;
        let now = Arc::new(AtomicU64::new(T0));
        let read = Arc::clone(&now);
        let limits = Limits::with_clock(config, 64, Arc::new(move || read.load(Ordering::Relaxed)))?;
        Ok(Rule { now, limits })
    }

    fn at(&self, ns: u64) -> &Rule {
        self.now.store(ns, Ordering::Relaxed);
        self
    }

    /// `hits` of value `v`.
    fn hit(&self, v: &str, hits: u64) -> Status {
        let request = Request {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("k".into(), v.into())],
                limit: None,
                hits_addend: Some(hits),
            }],
            hits_addend: 1,
        };
        self.limits.should_rate_limit(&request).unwrap().statuses.remove(0)
    }

    fn ok(&self, hits: u64) -> bool {
        self.hit("v", hits).code == Code::Ok
    }
}

fn codes(rule: &Rule, n: usize) -> String {
    (0..n).map(|_| if rule.ok(1) { '+' } else { '-' }).collect()
}

#[test]
fn token_bucket_admits_a_burst_then_the_rate_and_refusals_take_nothing() {
    let r = Rule::new("unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 5");
    assert_eq!(codes(&r, 7), "+++++--");
    // One token every 6 s: the refused hits took none of it.
    assert_eq!(codes(r.at(T0 + 6 * SECOND - 1), 1), "-");
    assert_eq!(codes(r.at(T0 + 6 * SECOND), 2), "+-");
    // Remaining is what the bucket holds; the reset is the whole seconds until it is full.
    let s = r.at(T0 + 60 * SECOND).hit("v", 1);
    assert_eq!((s.code, s.limit_remaining), (Code::Ok, 4));
    assert_eq!(s.duration_until_reset, Some(Duration::from_secs(6)));
    let l = s.current_limit.unwrap();
    assert_eq!((l.requests_per_unit, l.unit), (10, tollgate_envoy::Unit::Minute));
    // Without a burst the bucket holds a unit's worth; `gcra` is the same bucket.
    let r = Rule::new("unit: second, requests_per_unit: 3, algorithm: gcra");
    assert_eq!(codes(&r, 4), "+++-");
    // Other values have buckets of their own.
    assert_eq!(r.hit("w", 3).code, Code::Ok);
}

#[test]
fn a_window_of_several_units_is_aligned_on_its_own_multiples_of_the_epoch() {
    // 10 s windows: T0 is a multiple of 10 s; a window ends at T0 + 10 s.
    let r = Rule::new("unit: second, requests_per_unit: 3, unit_multiplier: 10");
    let s = r.at(T0 + 4 * SECOND).hit("v", 1);
    assert_eq!(s.duration_until_reset, Some(Duration::from_secs(6)));
    assert_eq!(codes(&r, 3), "++-");
    assert_eq!(codes(r.at(T0 + 10 * SECOND - 1), 1), "-");
    assert_eq!(codes(r.at(T0 + 10 * SECOND), 4), "+++-");
    // A token bucket's period is the window too: 3 per 10 s is one every 3⅓ s.
    let r = Rule::new(
        "unit: second, requests_per_unit: 3, unit_multiplier: 10, algorithm: token_bucket, burst: 1",
    );
    assert_eq!(codes(&r, 2), "+-");
    assert_eq!(codes(r.at(T0 + 3_333_333_333), 1), "-");
    assert_eq!(codes(r.at(T0 + 3_333_333_334), 1), "+");
}

#[test]
fn rejected_hits_count_as_upstreams_unless_the_rule_says_not() {
    // Upstream's: 2 then 2 more (refused, but counted), then 1: the window holds 4 > 3.
    let counted = Rule::new("unit: minute, requests_per_unit: 3");
    let uncounted = Rule::new("unit: minute, requests_per_unit: 3, count_rejected_hits: false");
    for (rule, last) in [(&counted, Code::OverLimit), (&uncounted, Code::Ok)] {
        assert_eq!(rule.hit("v", 2).code, Code::Ok);
        assert_eq!(rule.hit("v", 2).code, Code::OverLimit);
        let s = rule.hit("v", 1);
        assert_eq!(s.code, last);
        assert_eq!(s.duration_until_reset, Some(Duration::from_secs(60)));
    }
    // Stated the default way, it is upstream's.
    let r = Rule::new("unit: minute, requests_per_unit: 3, count_rejected_hits: true");
    assert_eq!(codes(&r, 4), "+++-");
    // Both count refusals in the statistics as upstream does.
    assert_eq!(uncounted.limits.counts("d.k").over_limit, 2);
    assert_eq!(uncounted.limits.counts("d.k").total_hits, 5);
}

#[test]
fn a_sliding_window_weighs_the_previous_window() {
    let r = Rule::new("unit: minute, requests_per_unit: 10, algorithm: sliding_window");
    assert_eq!(r.hit("v", 10).code, Code::Ok);
    assert_eq!(codes(&r, 1), "-");
    // A fixed window would admit 10 here; the previous window still weighs fully.
    assert_eq!(codes(r.at(T0 + 60 * SECOND), 1), "-");
    // Half-way, half of it: 5 more.
    assert_eq!(codes(r.at(T0 + 90 * SECOND), 6), "+++++-");
}

#[test]
fn nginx_passes_its_burst_at_once_and_refuses_the_rest() {
    let r = Rule::new("unit: second, requests_per_unit: 2, algorithm: nginx, burst: 3");
    assert_eq!(codes(&r, 5), "++++-");
    // One request every 500 ms.
    assert_eq!(codes(r.at(T0 + 500_000_000), 2), "+-");
    let r = Rule::new("unit: minute, requests_per_unit: 60, algorithm: nginx");
    assert_eq!(codes(&r, 2), "+-");
    assert_eq!(codes(r.at(T0 + SECOND), 1), "+");
}

#[test]
fn bad_options_are_refused_with_what_and_where() {
    let refused = |body: &str| Rule::try_new(body).err().expect("refused");
    for (body, message) in [
        ("unit: second, requests_per_unit: 1, algorithm: leaky", "invalid rate limit algorithm 'leaky'"),
        (
            "unit: second, requests_per_unit: 1, burst: 2",
            "burst applies to token_bucket, gcra and nginx, not fixed_window",
        ),
        ("unit: second, requests_per_unit: 1, unit_multiplier: 0", "unit_multiplier must be at least 1"),
        (
            "unit: second, requests_per_unit: 1, algorithm: sliding_window, count_rejected_hits: true",
            "count_rejected_hits applies to fixed_window only, not sliding_window",
        ),
        ("unit: hour, requests_per_unit: 1, algorithm: nginx", "nginx's rate is per second or per minute"),
        ("unlimited: true, algorithm: token_bucket", "should not specify algorithm when unlimited"),
        ("unlimited: true, lease: true", "should not specify lease when unlimited"),
        (
            "unit: second, requests_per_unit: 9, algorithm: token_bucket, lease: true",
            "lease applies to fixed_window only, not token_bucket",
        ),
        (
            "unit: second, requests_per_unit: 9, lease: true, count_rejected_hits: true",
            "a leased window cannot count rejected hits",
        ),
        ("unit: second, requests_per_unit: 9, lease: 3", "cannot unmarshal"),
        (
            "unit: second, requests_per_unit: 1, unit_multiplier: -1",
            "cannot unmarshal !!int `-1` into uint32",
        ),
        (
            "unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 0",
            "requests_per_unit 5 of 'd.k' (token_bucket) cannot be decided",
        ),
        (
            "unit: second, requests_per_unit: 2000000, algorithm: sliding_window",
            "requests_per_unit 2000000 of 'd.k' (sliding_window) cannot be decided",
        ),
    ] {
        let e = refused(body);
        assert!(e.message.contains(message), "{body}: {e}");
        assert_eq!(e.file, "rule.yaml");
        assert!(e.line.is_some(), "{body}: {e}");
    }
    // tollgate's keys belong under rate_limit.
    let e = Config::from_files(
        [("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    burst: 3\n")],
        LoadOptions::default(),
    )
    .unwrap_err();
    assert_eq!((e.line, e.message.as_str()), (Some(4), "config error, key 'burst' belongs under rate_limit"));
}

#[test]
fn a_reload_keeps_an_unchanged_rules_state_and_restarts_a_changed_one() {
    let r = Rule::new("unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 2");
    assert_eq!(codes(&r, 3), "++-");
    let reload = |body: &str| {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{body}}}\n");
        let config = Config::from_files([("rule.yaml", yaml.as_str())], LoadOptions::default()).unwrap();
        Rule { now: Arc::clone(&r.now), limits: r.limits.reloaded(config).unwrap() }
    };
    let same = reload("unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 2");
    assert_eq!(codes(&same, 1), "-");
    let changed = reload("unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 3");
    assert_eq!(codes(&changed, 4), "+++-");
}

/// The traffic of a property test: (ns to wait, hits) per request.
fn traffic() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..3 * SECOND, 1u64..4), 1..200)
}

proptest! {
    /// A token bucket of `r` per `w` s and burst `b` admits, over every span from its first
    /// request, at most `b + r·span/w` hits, and a request refused while that exact bound had
    /// room is one the engine's rounding (toward denial, by less than one hit) explains.
    #[test]
    fn the_bucket_never_admits_more_than_burst_plus_rate_times_time(
        r in 1u64..20, w in 1u64..5, b in 1u64..10, traffic in traffic(),
    ) {
        let rule = Rule::new(&format!(
            "unit: second, requests_per_unit: {r}, unit_multiplier: {w}, algorithm: token_bucket, burst: {b}"
        ));
        // The exact model: tokens scaled by w·1e9 (so that refill is r per ns), from full.
        let scale = u128::from(w * SECOND);
        let cap = u128::from(b) * scale;
        let (mut tokens, mut t) = (cap, T0);
        for (wait, hits) in traffic {
            let now = t + wait;
            tokens = (tokens + u128::from(now - t) * u128::from(r)).min(cap);
            t = now;
            let need = u128::from(hits) * scale;
            let admitted = rule.at(now).ok(hits);
            if admitted {
                prop_assert!(tokens >= need, "over-admitted {hits} at {now} with {tokens} of {need}");
                tokens -= need;
            } else {
                // Refused with room: only by the engine's rounding, under one token.
                prop_assert!(tokens < need + scale, "refused {hits} with {tokens} of {need}");
            }
        }
    }

    /// A fixed window, counting rejected hits or not, admits at most `r` hits per aligned window
    /// of `w` s; refusing none that fit when rejected hits do not count.
    #[test]
    fn a_fixed_window_admits_at_most_its_limit_per_aligned_window(
        r in 1u64..20, w in 1u64..5, counted in any::<bool>(), traffic in traffic(),
    ) {
        let rule = Rule::new(&format!(
            "unit: second, requests_per_unit: {r}, unit_multiplier: {w}, count_rejected_hits: {counted}"
        ));
        let window = w * SECOND;
        let (mut current, mut used, mut counted_hits, mut t) = (u64::MAX, 0, 0, T0);
        for (wait, hits) in traffic {
            t += wait;
            if t / window != current {
                (current, used, counted_hits) = (t / window, 0, 0);
            }
            // Upstream's verdict: over when the count after the hits passes the limit.
            let expected = if counted { counted_hits + hits <= r } else { used + hits <= r };
            prop_assert_eq!(rule.at(t).ok(hits), expected);
            counted_hits += hits;
            if expected {
                used += hits;
            }
            prop_assert!(used <= r);
        }
    }
}
