//! The soak (issue 13's fault campaign): two threads on every algorithm, direct and keyed, for
//! `SOAK_SECONDS` in all (default 600, split evenly), on a simulated clock the threads move as
//! they go. Keyed tables hold 1/64 of the keys, so keys are evicted and come back all the
//! time. At the end, every key's admissions are checked against the most its algorithm allows
//! over the run. Ignored by `cargo test`: `scripts/soak.sh` runs it for minutes, and the test
//! suite for a few seconds (`SOAK_SECONDS=5 cargo test --test soak -- --ignored`).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::bounds::{Algo, Subject};
use common::rng::xorshift;
use tollgate::{ManualClock, Nanos, WhenFull};

/// Keys of the keyed runs, and the most their table holds: keys come back after their state
/// is full again, so most returns find their key evicted.
const KEYS: u64 = 1 << 20;
const CAPACITY: usize = 16_384;

/// Runs two threads on `l` for `run`, keys drawn from `0..keys`: decisions made, and the
/// admissions of each key, and the last reading.
fn hammer(l: &dyn Subject, keys: u64, run: Duration) -> (u64, Vec<u64>, u64) {
    let time = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let decisions: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (time, stop, admitted) = (&time, &stop, &admitted);
                s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    let mut made = 0u64;
                    while !stop.load(Relaxed) {
                        for _ in 0..1_024 {
                            let r = xorshift(&mut rng);
                            // Up to 4 µs per decision: a key at 20/s sees many windows.
                            let now = time.fetch_add(r >> 62 << 10, Relaxed);
                            // Half the traffic on 1/16 of the keys.
                            let k = if r & 1 == 0 { (r >> 1) % keys.div_ceil(16) } else { (r >> 1) % keys };
                            if l.check_at(k, Nanos::new(now)).is_allowed() {
                                admitted[usize::try_from(k).unwrap()].fetch_add(1, Relaxed);
                            }
                        }
                        made += 1_024;
                    }
                    made
                })
            })
            .collect();
        std::thread::sleep(run);
        stop.store(true, Relaxed);
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    (decisions, admitted.into_iter().map(AtomicU64::into_inner).collect(), time.into_inner())
}

#[test]
#[ignore = "minutes long: scripts/soak.sh"]
fn soak_every_algorithm_direct_and_keyed() {
    let seconds: u64 =
        std::env::var("SOAK_SECONDS").map_or(600, |s| s.parse().expect("SOAK_SECONDS: whole seconds"));
    let algos = Algo::all(Duration::from_secs(1));
    let each = Duration::from_secs(seconds) / u32::try_from(2 * algos.len()).unwrap();
    let started = Instant::now();
    let (mut total, mut evictions) = (0u64, 0u64);
    for algo in &algos {
        for keyed in [false, true] {
            let clock = ManualClock::new();
            let (l, keys) = if keyed {
                (algo.keyed(&clock, CAPACITY, WhenFull::Deny), KEYS)
            } else {
                (algo.direct(&clock), 1)
            };
            let (decisions, admitted, end) = hammer(&*l, keys, each);
            let bound = algo.bound(end);
            for (k, &a) in admitted.iter().enumerate() {
                assert!(
                    u128::from(a) <= bound,
                    "{} keyed={keyed}: key {k} admitted {a} > {bound} over {end} ns",
                    algo.name
                );
            }
            let most = admitted.iter().max().copied().unwrap_or(0);
            println!(
                "{:>14} {:>6}: {decisions:>11} decisions over {:>7.1} s simulated, {:>9} evictions, busiest key {most} of at most {bound}",
                algo.name,
                if keyed { "keyed" } else { "direct" },
                end as f64 / 1e9,
                l.evictions(),
            );
            total += decisions;
            evictions += l.evictions();
        }
    }
    println!(
        "soak: {total} decisions checked, {evictions} evictions, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
