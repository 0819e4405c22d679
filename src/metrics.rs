//! Limiters' counts on the [`metrics`] facade (feature `metrics`), for whatever exporter the
//! application installs (Prometheus, StatsD, OpenTelemetry, ...).
//!
//! Nothing is done per decision beyond the limiters' own [counters](crate::Counters) (a plain
//! load and store in a slot of the deciding thread's): a [`Reporter`] reads them when asked
//! ([`Reporter::report`], before each scrape or on a timer) and writes them as absolute values.
//! Without the feature, nothing of this exists. The names and labels, one series per limiter
//! and outcome, never per key:
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `tollgate_decisions_total` | counter | `limiter`, `outcome` (`allowed`, `denied`, `delayed`, `insufficient`, `table_full`, `untracked`) | decisions by outcome |
//! | `tollgate_tier_decisions_total` | counter | `limiter`, `tier` (its name; `default`), `outcome` | a keyed table's decisions by tier, when it has [tiers](crate::KeyedBuilder::tier) |
//! | `tollgate_wait_nanoseconds_total` | counter | `limiter` | the waits delayed admissions were told (reservations, `acquire`, `until_ready`, nginx's delays), summed: with `outcome="delayed"`, the mean wait |
//! | `tollgate_keys` | gauge | `limiter` | keys a keyed table holds |
//! | `tollgate_keys_capacity` | gauge | `limiter` | keys it can hold |
//! | `tollgate_key_inserts_total` | counter | `limiter` | keys placed in the table |
//! | `tollgate_key_evictions_total` | counter | `limiter`, `kind` (`refilled`: the state was a fresh key's; `forced`: [`WhenFull::EvictFullest`](crate::WhenFull::EvictFullest)) | keys reclaimed |
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::{metrics::Reporter, KeyedLimiter, Limiter, TokenBucket};
//!
//! let global = Limiter::new("1000/s".parse::<TokenBucket>()?).with_counters();
//! let per_client =
//!     Arc::new(KeyedLimiter::<str>::builder("10/s".parse()?).capacity(1_000).counters(true).build()?);
//! let reporter = Reporter::new();
//! reporter.limiter("global", &global)?;
//! reporter.table("per-client", &per_client)?;
//! let _ = per_client.check("alice");
//! reporter.report(); // e.g. from the handler of GET /metrics, before rendering
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use metrics::{counter, gauge, SharedString};

use crate::{Algorithm, Clock, CounterSnapshot, Counters, Direct, Key, Keyed, KeyedAlgorithm};

/// A limiter given to a [`Reporter`] without counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoCounters {
    /// The name it was given.
    pub limiter: String,
}

impl fmt::Display for NoCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the limiter {:?} counts no decisions: build it with counters (Direct::with_counters, KeyedBuilder::counters(true))",
            self.limiter
        )
    }
}

impl std::error::Error for NoCounters {}

/// What one registered limiter gives a report.
enum Source {
    /// A direct limiter's decision counters.
    Direct(Arc<Counters>),
    /// A keyed table's counts and fill, while the table lives, and its decision counters.
    Table(Box<dyn Fn() -> Option<(CounterSnapshot, u64, u64)> + Send + Sync>, Arc<Counters>),
}

/// Writes registered limiters' counts to the [`metrics`] facade on each
/// [`report`](Reporter::report) (see the [module docs](self) for the series).
#[derive(Default)]
pub struct Reporter {
    limiters: Mutex<Vec<(SharedString, Source)>>,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limiters = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Reporter")
            .field("limiters", &limiters.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .finish()
    }
}

impl Reporter {
    /// A reporter of no limiter yet.
    pub fn new() -> Reporter {
        Reporter::default()
    }

    /// Reports `limiter`'s decisions as `limiter="name"` (it must count them: built
    /// [`with_counters`](Direct::with_counters)). The reporter holds the counters, not the
    /// limiter.
    pub fn limiter<A: Algorithm, C: Clock>(
        &self,
        name: impl Into<SharedString>,
        limiter: &Direct<A, C>,
    ) -> Result<(), NoCounters> {
        let name = name.into();
        let counters = limiter.counters_handle().ok_or_else(|| NoCounters { limiter: name.to_string() })?;
        self.push(name, Source::Direct(counters));
        Ok(())
    }

    /// Reports `table`'s decisions, keys and evictions as `limiter="name"` (it must count its
    /// decisions: built with [`counters(true)`](crate::KeyedBuilder::counters)). The reporter
    /// holds the table weakly: once the application drops it, its series stop being updated.
    pub fn table<A, K, C>(
        &self,
        name: impl Into<SharedString>,
        table: &Arc<Keyed<A, K, C>>,
    ) -> Result<(), NoCounters>
    where
        A: KeyedAlgorithm + 'static,
        K: Key + ?Sized + 'static,
        C: Clock + 'static,
        Keyed<A, K, C>: Send + Sync,
    {
        let name = name.into();
        let Some(counters) = table.counters_handle() else {
            return Err(NoCounters { limiter: name.to_string() });
        };
        let weak: Weak<Keyed<A, K, C>> = Arc::downgrade(table);
        let read = move || {
            let t = weak.upgrade()?;
            Some((t.counters()?, t.len(), t.capacity()))
        };
        self.push(name, Source::Table(Box::new(read), counters));
        Ok(())
    }

    fn push(&self, name: SharedString, source: Source) {
        self.limiters.lock().unwrap_or_else(PoisonError::into_inner).push((name, source));
    }

    /// Writes every registered limiter's counts now, as absolute values.
    pub fn report(&self) {
        let limiters = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, source) in limiters.iter() {
            match source {
                Source::Direct(counters) => decisions(name, &counters.snapshot()),
                Source::Table(read, counters) => {
                    let Some((s, keys, capacity)) = read() else { continue };
                    decisions(name, &s);
                    tiers(name, counters);
                    let limiter = ("limiter", name.clone());
                    #[expect(
                        clippy::cast_precision_loss,
                        reason = "a gauge is a float; key counts are far below 2^53"
                    )]
                    {
                        gauge!("tollgate_keys", std::slice::from_ref(&limiter)).set(keys as f64);
                        gauge!("tollgate_keys_capacity", std::slice::from_ref(&limiter)).set(capacity as f64);
                    }
                    counter!("tollgate_key_inserts_total", std::slice::from_ref(&limiter))
                        .absolute(s.inserts);
                    let evicted =
                        |kind: &'static str| [limiter.clone(), ("kind", SharedString::const_str(kind))];
                    counter!("tollgate_key_evictions_total", &evicted("refilled")).absolute(s.evicted_clean);
                    counter!("tollgate_key_evictions_total", &evicted("forced")).absolute(s.evicted_forced);
                }
            }
        }
    }
}

/// `tollgate_decisions_total` of one limiter, by outcome, and the time its waits were told.
fn decisions(name: &SharedString, s: &CounterSnapshot) {
    for (outcome, count) in by_outcome(s) {
        let labels = [("limiter", name.clone()), ("outcome", SharedString::const_str(outcome))];
        counter!("tollgate_decisions_total", &labels).absolute(count);
    }
    counter!("tollgate_wait_nanoseconds_total", "limiter" => name.clone()).absolute(s.waited_nanos);
}

/// `tollgate_tier_decisions_total` of a table with tiers (nothing for one without).
fn tiers(name: &SharedString, counters: &Counters) {
    if counters.tiers() < 2 {
        return;
    }
    for tier in 0..counters.tiers() {
        let (Some(s), Some(tier_name)) = (counters.tier_snapshot(tier), counters.tier_name(tier)) else {
            continue;
        };
        for (outcome, count) in by_outcome(&s) {
            let labels = [
                ("limiter", name.clone()),
                ("tier", SharedString::from(tier_name.to_owned())),
                ("outcome", SharedString::const_str(outcome)),
            ];
            counter!("tollgate_tier_decisions_total", &labels).absolute(count);
        }
    }
}

/// A snapshot's decisions, by the `outcome` label's values.
fn by_outcome(s: &CounterSnapshot) -> [(&'static str, u64); 6] {
    [
        ("allowed", s.allowed),
        ("denied", s.denied),
        ("delayed", s.delayed),
        ("insufficient", s.insufficient),
        ("table_full", s.table_full),
        ("untracked", s.untracked),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyedLimiter, Limiter, ManualClock, TokenBucket, WhenFull};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::{CompositeKey, MetricKind};

    fn value(
        snapshot: &[(CompositeKey, Option<metrics::Unit>, Option<SharedString>, DebugValue)],
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<f64> {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let k = key.key();
            let matches = k.name() == name
                && labels
                    .iter()
                    .all(|(l, v)| k.labels().any(|label| label.key() == *l && label.value() == *v));
            if !matches {
                return None;
            }
            #[expect(clippy::cast_precision_loss, reason = "small test counts")]
            match value {
                DebugValue::Counter(c) => Some(*c as f64),
                DebugValue::Gauge(g) => Some(g.into_inner()),
                DebugValue::Histogram(_) => None,
            }
        })
    }

    #[test]
    fn a_report_writes_every_count_once_per_limiter_and_outcome() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = ManualClock::new();
        let global = Limiter::with_clock(TokenBucket::per_second(2).unwrap(), clock.clone()).with_counters();
        let table = Arc::new(
            KeyedLimiter::<u64, ManualClock>::builder_for_clock(TokenBucket::per_second(1).unwrap())
                .capacity(16)
                .when_full(WhenFull::Deny)
                .counters(true)
                .build_with_clock(clock.clone())
                .unwrap(),
        );
        let reporter = Reporter::new();
        reporter.limiter("global", &global).unwrap();
        reporter.table("per-key", &table).unwrap();
        let bare = Limiter::new(TokenBucket::per_second(1).unwrap());
        let refused = reporter.limiter("bare", &bare).unwrap_err().to_string();
        assert!(refused.contains("\"bare\" counts no decisions"), "{refused}");
        for _ in 0..3 {
            let _ = global.check();
        }
        let _ = table.check(&1);
        let _ = table.check(&1);
        let _ = table.check(&2);
        metrics::with_local_recorder(&recorder, || reporter.report());
        let s: Vec<_> = snapshotter.snapshot().into_vec();
        let d = |limiter, outcome| {
            value(&s, "tollgate_decisions_total", &[("limiter", limiter), ("outcome", outcome)])
        };
        assert_eq!((d("global", "allowed"), d("global", "denied")), (Some(2.0), Some(1.0)));
        assert_eq!((d("per-key", "allowed"), d("per-key", "denied")), (Some(2.0), Some(1.0)));
        assert_eq!(value(&s, "tollgate_keys", &[("limiter", "per-key")]), Some(2.0));
        assert_eq!(value(&s, "tollgate_key_inserts_total", &[("limiter", "per-key")]), Some(2.0));
        assert!(value(&s, "tollgate_keys_capacity", &[("limiter", "per-key")]).unwrap() >= 16.0);
        assert_eq!(
            value(&s, "tollgate_key_evictions_total", &[("limiter", "per-key"), ("kind", "forced")]),
            Some(0.0)
        );
        // Bounded label sets: six outcomes per limiter, no series per key.
        let series = s
            .iter()
            .filter(|(k, ..)| k.kind() == MetricKind::Counter && k.key().name() == "tollgate_decisions_total")
            .count();
        assert_eq!(series, 12);
        // A dropped table stops being reported; the others go on.
        drop(table);
        let _ = global.check();
        clock.advance(std::time::Duration::from_secs(1));
        let _ = global.check();
        metrics::with_local_recorder(&recorder, || reporter.report());
        let s: Vec<_> = snapshotter.snapshot().into_vec();
        let d = |limiter, outcome| {
            value(&s, "tollgate_decisions_total", &[("limiter", limiter), ("outcome", outcome)])
        };
        assert_eq!((d("global", "allowed"), d("global", "denied")), (Some(3.0), Some(2.0)));
    }

    #[test]
    fn tiers_and_waits_are_reported() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = ManualClock::new();
        let paced =
            Limiter::with_clock(TokenBucket::per_second(10).unwrap().with_burst(1).unwrap(), clock.clone())
                .with_counters();
        let table = Arc::new(
            KeyedLimiter::<u64, ManualClock>::builder_for_clock(TokenBucket::per_second(1).unwrap())
                .tier("premium", TokenBucket::per_second(2).unwrap().with_burst(2).unwrap())
                .capacity(16)
                .counters(true)
                .build_with_clock(clock.clone())
                .unwrap(),
        );
        let premium = table.tier("premium").unwrap();
        table.set_override(&7, premium).unwrap();
        let reporter = Reporter::new();
        reporter.limiter("paced", &paced).unwrap();
        reporter.table("per-key", &table).unwrap();
        // Two reservations in a row: due now and in 100 ms; one refused past a 50 ms wait.
        let waits: Vec<_> = (0..2).map(|_| paced.reserve().unwrap().delay()).collect();
        assert_eq!(waits[1], std::time::Duration::from_millis(100));
        assert!(paced.reserve_n_within(1, std::time::Duration::from_millis(50)).is_err());
        for _ in 0..3 {
            let _ = table.check(&7); // premium: 2 allowed, 1 denied
        }
        let _ = table.check(&1); // default: allowed
        let _ = table.reserve(&1).unwrap(); // default: due in 1 s
        metrics::with_local_recorder(&recorder, || reporter.report());
        let s: Vec<_> = snapshotter.snapshot().into_vec();
        let d = |limiter, outcome| {
            value(&s, "tollgate_decisions_total", &[("limiter", limiter), ("outcome", outcome)])
        };
        assert_eq!(
            (d("paced", "allowed"), d("paced", "delayed"), d("paced", "denied")),
            (Some(1.0), Some(1.0), Some(1.0))
        );
        assert_eq!(value(&s, "tollgate_wait_nanoseconds_total", &[("limiter", "paced")]), Some(100e6));
        let t = |tier, outcome| {
            value(
                &s,
                "tollgate_tier_decisions_total",
                &[("limiter", "per-key"), ("tier", tier), ("outcome", outcome)],
            )
        };
        assert_eq!((t("premium", "allowed"), t("premium", "denied")), (Some(2.0), Some(1.0)));
        assert_eq!((t("default", "allowed"), t("default", "delayed")), (Some(1.0), Some(1.0)));
        assert_eq!((d("per-key", "allowed"), d("per-key", "delayed")), (Some(3.0), Some(1.0)));
        assert_eq!(value(&s, "tollgate_wait_nanoseconds_total", &[("limiter", "per-key")]), Some(1e9));
        assert_eq!(table.tier_counters(premium).map(|c| c.denied), Some(1));
        // A table without tiers writes no tier series; a direct limiter has one tier.
        assert_eq!(paced.counters_handle().unwrap().tiers(), 1);
        assert!(paced.counters_handle().unwrap().tier_snapshot(1).is_none());
    }
}
