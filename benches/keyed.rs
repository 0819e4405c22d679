//! The keyed limiter against its floor and against governor's keyed limiter, in one run, on the
//! same pre-generated key streams and the same quotas (`benches/workloads/mod.rs`).
//!
//! * `floor`: one TSC read, one ahash, one load + CAS on a table of as many 16-byte slots as
//!   tollgate's, with no key check (issue 3's floor).
//! * `tollgate`: TSC clock per decision; `tollgate-coarse`: the coarse clock;
//!   `tollgate-batch`: `check_batch` of 64 with one clock read (time per decision).
//! * `governor`: `RateLimiter::keyed` (DashMap + SipHash); `governor-ahash`: DashMap + ahash.
//! * `allow-heavy`: a quota that never runs out; `deny-heavy`: one per hour, spent.
//! * `first-touch`: every decision on a new key, the table at capacity, evicting as it goes.
//! * `2-threads/...`: every core on its own keys, time per decision per thread.
//!
//! ```sh
//! cargo bench --bench keyed
//! python3 scripts/bench_repeat.py --runs 5 --bench keyed
//! ```

#![allow(missing_docs)] // criterion_group! generates undocumented items
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    reason = "64-bit benchmark hosts; ratios"
)]

mod workloads;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use tollgate::{Clock, CoarseClock, KeyedBuilder, KeyedLimiter, Rate, TokenBucket, TscClock};
use workloads::{key, on_all_cores, stream, Dist, Floor};

const STREAM: usize = 1 << 22;
const BATCH: usize = 64;

type GovKeyed = governor::DefaultKeyedRateLimiter<u64>;
type GovAhash = governor::RateLimiter<
    u64,
    governor::state::keyed::DefaultKeyedStateStore<u64, ahash::RandomState>,
    governor::clock::DefaultClock,
>;

#[derive(Clone, Copy)]
enum Load {
    Allow,
    Deny,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Allow => "allow-heavy",
            Load::Deny => "deny-heavy",
        }
    }

    fn quota(self) -> TokenBucket {
        match self {
            Load::Allow => {
                TokenBucket::new(Rate::per_second(10_000_000_000), TokenBucket::MAX_BURST).unwrap()
            }
            Load::Deny => TokenBucket::per_hour(1).unwrap(),
        }
    }

    fn governor(self) -> governor::Quota {
        match self {
            Load::Allow => governor::Quota::per_second(NonZeroU32::MAX),
            Load::Deny => governor::Quota::per_hour(NonZeroU32::MIN),
        }
    }
}

fn tollgate<C: Clock>(load: Load, keys: u64, clock: C) -> KeyedLimiter<u64, C> {
    KeyedBuilder::new(load.quota()).capacity(keys as usize).build_with_clock(clock).unwrap()
}

/// Touches every key of the stream once, so that the measured decisions find their keys.
fn warm(keys: &[u64], mut f: impl FnMut(u64)) {
    for &k in keys {
        f(k);
    }
}

/// Times `iters` decisions through `step`, cycling through the stream.
fn cycle(keys: &[u64], iters: u64, mut step: impl FnMut(u64)) -> Duration {
    let mask = keys.len() - 1;
    let start = Instant::now();
    for i in 0..iters as usize {
        step(keys[i & mask]);
    }
    start.elapsed()
}

fn batch_cycle<C: Clock>(l: &KeyedLimiter<u64, C>, items: &[(u64, u64)], iters: u64) -> Duration {
    let mut out = [l.peek(&0); BATCH];
    let chunks = items.len() / BATCH;
    let batches = iters.div_ceil(BATCH as u64);
    let start = Instant::now();
    for b in 0..batches as usize {
        let i = (b % chunks) * BATCH;
        l.check_batch(&items[i..i + BATCH], &mut out);
        let _ = black_box(&out);
    }
    start.elapsed().mul_f64(iters as f64 / (batches * BATCH as u64) as f64)
}

fn one_thread_workload(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, dist: Dist, name: &str) {
    let keys = stream(dist, STREAM, 7);
    let slots = KeyedLimiter::<u64>::builder(Load::Allow.quota())
        .capacity(dist.keys() as usize)
        .build()
        .unwrap()
        .stats()
        .slots as usize;
    let floor = Floor::new(slots, TscClock::new());
    g.bench_function(format!("{name}/floor"), |b| b.iter_custom(|n| cycle(&keys, n, |k| floor.step(k))));
    g.bench_function(format!("{name}/floor-prefetch"), |b| {
        b.iter_custom(|n| cycle(&keys, n, |k| floor.step_prefetched(k)))
    });
    for load in [Load::Allow, Load::Deny] {
        if matches!(load, Load::Deny) && matches!(dist, Dist::One | Dist::Zipf(_)) {
            continue;
        }
        let l = tollgate(load, dist.keys(), TscClock::new());
        warm(&keys, |k| {
            let _ = l.check(&k);
        });
        g.bench_function(format!("{name}/tollgate/{}", load.name()), |b| {
            b.iter_custom(|n| {
                cycle(&keys, n, |k| {
                    let _ = black_box(l.check(&k));
                })
            })
        });
        g.bench_function(format!("{name}/tollgate-bool/{}", load.name()), |b| {
            b.iter_custom(|n| {
                cycle(&keys, n, |k| {
                    let _ = black_box(l.allow(&k));
                })
            })
        });
        drop(l);
        if !matches!(dist, Dist::One) {
            let l = tollgate(load, dist.keys(), CoarseClock::new().unwrap());
            warm(&keys, |k| {
                let _ = l.check(&k);
            });
            g.bench_function(format!("{name}/tollgate-coarse/{}", load.name()), |b| {
                b.iter_custom(|n| {
                    cycle(&keys, n, |k| {
                        let _ = black_box(l.check(&k));
                    })
                })
            });
            drop(l);
            let l = tollgate(load, dist.keys(), TscClock::new());
            let items: Vec<(u64, u64)> = keys.iter().map(|&k| (k, 1)).collect();
            warm(&keys, |k| {
                let _ = l.check(&k);
            });
            g.bench_function(format!("{name}/tollgate-batch/{}", load.name()), |b| {
                b.iter_custom(|n| batch_cycle(&l, &items, n))
            });
        }
        let gov = GovKeyed::keyed(load.governor());
        warm(&keys, |k| {
            let _ = gov.check_key(&k);
        });
        g.bench_function(format!("{name}/governor/{}", load.name()), |b| {
            b.iter_custom(|n| {
                cycle(&keys, n, |k| {
                    let _ = black_box(gov.check_key(&k));
                })
            })
        });
        drop(gov);
        let gov = GovAhash::dashmap_with_hasher(load.governor(), ahash::RandomState::new());
        warm(&keys, |k| {
            let _ = gov.check_key(&k);
        });
        g.bench_function(format!("{name}/governor-ahash/{}", load.name()), |b| {
            b.iter_custom(|n| {
                cycle(&keys, n, |k| {
                    let _ = black_box(gov.check_key(&k));
                })
            })
        });
    }
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed/1-thread");
    g.throughput(Throughput::Elements(1));
    one_thread_workload(&mut g, Dist::One, "1-key");
    one_thread_workload(&mut g, Dist::Uniform(1_000), "1K-keys");
    one_thread_workload(&mut g, Dist::Uniform(1 << 20), "1M-keys");
    one_thread_workload(&mut g, Dist::Zipf(1 << 20), "1M-zipf");
    g.finish();
}

/// Every decision on a key never seen before, with the table at capacity: each insert evicts a
/// bucket that has refilled (burst 1 at 1e10/s: full a nanosecond after its decision).
fn first_touch(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed/first-touch");
    g.throughput(Throughput::Elements(1));
    let q = TokenBucket::new(Rate::per_second(10_000_000_000), 1).unwrap();
    let l = KeyedLimiter::<u64>::builder(q).capacity(1 << 16).build().unwrap();
    let mut next = 0u64;
    for _ in 0..l.capacity() {
        let _ = l.check(&key(next));
        next += 1;
    }
    g.bench_function("tollgate", |b| {
        b.iter(|| {
            next += 1;
            black_box(l.check(&key(next)))
        })
    });
    let gq = governor::Quota::per_second(NonZeroU32::MAX);
    let gov = GovAhash::dashmap_with_hasher(gq, ahash::RandomState::new());
    let mut next = 0u64;
    g.bench_function("governor-ahash", |b| {
        b.iter(|| {
            next += 1;
            let _ = black_box(gov.check_key(&key(next)));
            // governor grows without bound; keep its map at the same size as tollgate's.
            if next % (1 << 16) == 0 {
                gov.retain_recent();
            }
        })
    });
    g.finish();
}

/// 2 threads (all cores), each on its own keys: 1M keys uniform, split by thread.
fn all_cores(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed/all-cores");
    g.throughput(Throughput::Elements(1));
    let threads = workloads::cores() as u64;
    let streams: Vec<Vec<u64>> = (0..threads)
        .map(|t| stream(Dist::Uniform((1 << 20) / threads), STREAM, 11 + t).iter().map(|k| k ^ t).collect())
        .collect();
    let mask = STREAM - 1;
    let load = Load::Allow;
    let floor = Floor::new(1 << 21, TscClock::new());
    g.bench_function("1M-keys/floor", |b| {
        b.iter_custom(|n| on_all_cores(n, &|t, i| floor.step(streams[t][i as usize & mask])))
    });
    let l = tollgate(load, 1 << 20, TscClock::new());
    streams.iter().for_each(|s| {
        warm(s, |k| {
            let _ = l.check(&k);
        })
    });
    g.bench_function("1M-keys/tollgate/allow-heavy", |b| {
        b.iter_custom(|n| {
            on_all_cores(n, &|t, i| {
                let _ = black_box(l.check(&streams[t][i as usize & mask]));
            })
        })
    });
    drop(l);
    let l = tollgate(load, 1 << 20, CoarseClock::new().unwrap());
    streams.iter().for_each(|s| {
        warm(s, |k| {
            let _ = l.check(&k);
        })
    });
    g.bench_function("1M-keys/tollgate-coarse/allow-heavy", |b| {
        b.iter_custom(|n| {
            on_all_cores(n, &|t, i| {
                let _ = black_box(l.check(&streams[t][i as usize & mask]));
            })
        })
    });
    drop(l);
    let gov = GovKeyed::keyed(load.governor());
    streams.iter().for_each(|s| {
        warm(s, |k| {
            let _ = gov.check_key(&k);
        })
    });
    g.bench_function("1M-keys/governor/allow-heavy", |b| {
        b.iter_custom(|n| {
            on_all_cores(n, &|t, i| {
                let _ = black_box(gov.check_key(&streams[t][i as usize & mask]));
            })
        })
    });
    g.finish();
}

fn memory(_: &mut Criterion) {
    // Not a timing: the table's bytes per key at its maximum load, printed for the README.
    let l = KeyedLimiter::<u64>::builder(Load::Allow.quota()).capacity(1 << 20).build().unwrap();
    let per_key = l.memory_bytes() as f64 / l.capacity() as f64;
    eprintln!(
        "keyed/memory: {} bytes for {} keys at 7/8 load: {per_key:.1} B per u64 key",
        l.memory_bytes(),
        l.capacity()
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = memory, one_thread, first_touch, all_cores
}
criterion_main!(benches);
