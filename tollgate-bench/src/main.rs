//! `tollgate-bench`: the macro benchmark suite. Every workload runs tollgate, its floor and its
//! peers side by side, in the same process and on the same pre-generated keys, repeated and
//! interleaved so that the machine's drift touches every subject alike.
//!
//! ```sh
//! cargo run --release -p tollgate-bench                              # everything, about a minute
//! cargo run --release -p tollgate-bench -- --filter 1M-keys --threads 2
//! cargo run --release -p tollgate-bench -- --markdown BENCHMARKS.md  # the report and its charts
//! cargo run --release -p tollgate-bench -- --quick                   # a smoke run of a few seconds
//! ```
//!
//! See BENCHMARKS.md for the method and how to read the output.

mod charts;
mod driver;
mod envoy;
mod machine;
mod pacing;
mod redis;
mod report;
mod subjects;
#[path = "../../benches/workloads/mod.rs"]
mod workloads;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use driver::{measure, Keys, Sample, Subject, Timing};
use machine::Machine;
use report::{Cell, Memory, Paired, Report};
use subjects::{direct_subjects, keyed_subject, Load, Maker, Setup};
use workloads::{key, ranks, Dist};

#[derive(Parser, Debug)]
#[command(name = "tollgate-bench", version, about = "tollgate against its floors and peers, side by side")]
struct Args {
    /// Timed milliseconds per cell and repetition (each after a quarter as much warm-up, and
    /// followed by half as much timing single calls).
    #[arg(long, default_value_t = 20, value_name = "MS")]
    duration: u64,
    /// Repetitions of every cell; figures are medians over them.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Thread counts, comma-separated [default: 1 to the number of cores].
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Run only the cells whose `workload/load/subject` contains one of these, comma-separated.
    #[arg(long, value_delimiter = ',')]
    filter: Vec<String>,
    /// A smoke run: one short repetition, smaller key spaces. Proves the suite works; measures
    /// nothing worth quoting.
    #[arg(long)]
    quick: bool,
    /// Print the results as JSON instead of the table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print the results as CSV instead of the table.
    #[arg(long)]
    csv: bool,
    /// Write a Markdown report to FILE (between its results markers, if it has them) and the
    /// charts beside it.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Where the SVG charts go [default: `docs/charts/` beside the Markdown report].
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// How long a timed batch of decisions lasts, in µs: the p50..max columns are of the time
    /// per decision averaged over one batch; the `call` columns time single calls (see
    /// BENCHMARKS.md).
    #[arg(long, default_value_t = driver::BATCH_NANOS / 1e3, value_name = "US")]
    batch_us: f64,
    /// Leave thread placement to the scheduler instead of pinning thread i to CPU i.
    #[arg(long)]
    no_pin: bool,
    /// Skip the memory probes.
    #[arg(long)]
    no_memory: bool,
    /// List the workloads and their subjects, and exit.
    #[arg(long)]
    list: bool,
    /// Internal: measure one subject's resident memory in this process.
    #[arg(long, hide = true, value_name = "WORKLOAD/SUBJECT")]
    memory_probe: Option<String>,
}

/// How a workload's keys are drawn.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// One state shared by all threads.
    Direct,
    /// Pre-generated streams: every thread draws from its own share of the key space (with
    /// [`Dist::One`], all threads share the one key).
    Stream(Dist),
    /// Every decision on a new key, the table kept at capacity (prefilled before timing).
    Fresh,
}

#[derive(Debug)]
struct Workload {
    name: &'static str,
    what: &'static str,
    kind: Kind,
    loads: &'static [Load],
    subjects: Vec<&'static str>,
    /// The table's capacity (keys).
    capacity: usize,
}

/// tollgate's algorithms besides the token bucket, each in every workload the bucket runs.
const ALGORITHMS: &[&str] =
    &["tollgate-nginx", "tollgate-fixed-window", "tollgate-sliding-window", "tollgate-sliding-log"];
/// The keyed peers.
const KEYED_PEERS: &[&str] = &["governor", "governor-ahash", "mutex"];
const BOTH: &[Load] = &[Load::Allow, Load::Deny];

fn workloads(quick: bool) -> Vec<Workload> {
    let big = if quick { 1 << 16 } else { 1 << 20 };
    let churn = if quick { 1 << 12 } else { 1 << 16 };
    let keyed = [
        &[
            "floor",
            "floor-coarse",
            "floor-coarse-select",
            "tollgate",
            "tollgate-metrics",
            "tollgate-coarse",
            "tollgate-prefetch",
            "tollgate-batch",
        ],
        ALGORITHMS,
        KEYED_PEERS,
    ]
    .concat();
    vec![
        Workload {
            name: "direct",
            what: "one bucket (direct limiters); with several threads, all on that one bucket",
            kind: Kind::Direct,
            loads: BOTH,
            subjects: [
                &[
                    "floor",
                    "floor-coarse",
                    "tollgate",
                    "tollgate-reserve",
                    "tollgate-metrics",
                    "tollgate-coarse",
                ],
                ALGORITHMS,
                &["governor", "mutex"],
            ]
            .concat(),
            capacity: 1,
        },
        Workload {
            name: "1-key",
            what: "a keyed limiter, one key shared by all threads (contention)",
            kind: Kind::Stream(Dist::One),
            loads: BOTH,
            subjects: keyed.clone(),
            capacity: 1024,
        },
        Workload {
            name: "1K-keys",
            what: "1,000 keys, uniform; each thread on its own share",
            kind: Kind::Stream(Dist::Uniform(1000)),
            loads: BOTH,
            subjects: keyed.clone(),
            capacity: 1000,
        },
        Workload {
            name: "1M-keys",
            what: "2^20 keys, uniform; each thread on its own share",
            kind: Kind::Stream(Dist::Uniform(big)),
            loads: BOTH,
            subjects: keyed.clone(),
            capacity: big as usize,
        },
        Workload {
            name: "1M-zipf",
            what: "2^20 keys, Zipf(1.0); each thread on its own share",
            kind: Kind::Stream(Dist::Zipf(big)),
            loads: &[Load::Allow],
            subjects: keyed.clone(),
            capacity: big as usize,
        },
        Workload {
            name: "first-touch",
            what:
                "every decision on a new key; tollgate's table at capacity (2^16), evicting refilled buckets",
            kind: Kind::Fresh,
            loads: &[Load::Refill],
            subjects: [&["tollgate"], ALGORITHMS, KEYED_PEERS].concat(),
            capacity: churn,
        },
        Workload {
            name: "key-flood",
            what: "every decision on a new key that never refills (a spray); tollgate's table full (2^16)",
            kind: Kind::Fresh,
            loads: &[Load::Deny],
            subjects: [&["tollgate", "tollgate-evict"], ALGORITHMS, KEYED_PEERS].concat(),
            capacity: churn,
        },
    ]
}

fn maker(w: &Workload, name: &str) -> Maker {
    match w.kind {
        Kind::Direct => {
            direct_subjects().into_iter().find(|(n, _)| *n == name).map(|(_, m)| m).expect("a direct subject")
        }
        Kind::Stream(_) | Kind::Fresh => keyed_subject(name).expect("a keyed subject"),
    }
}

/// Stream length per thread.
fn stream_len(dist: Dist, quick: bool) -> usize {
    match dist {
        Dist::One => 1 << 10,
        _ if quick => 1 << 14,
        Dist::Uniform(n) | Dist::Zipf(n) if n <= 4096 => 1 << 16,
        _ => 1 << 20,
    }
}

/// Each thread's keys for `threads` threads: thread `t` draws ranks over its share of the key
/// space and takes every `threads`-th key from `t`, so threads never share a key (except the
/// one key of [`Dist::One`]).
fn streams(dist: Dist, threads: usize, quick: bool) -> Vec<Vec<u64>> {
    let len = stream_len(dist, quick);
    let t64 = threads as u64;
    (0..t64)
        .map(|t| match dist {
            Dist::One => vec![key(0); len],
            Dist::Uniform(n) => {
                ranks(Dist::Uniform(n / t64), len, 7 + t).into_iter().map(|r| key(r * t64 + t)).collect()
            }
            Dist::Zipf(n) => {
                ranks(Dist::Zipf(n / t64), len, 7 + t).into_iter().map(|r| key(r * t64 + t)).collect()
            }
        })
        .collect()
}

fn selected(filter: &[String], id: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| id.contains(f.as_str()))
}

fn main() {
    let args = Args::parse();
    if let Some(probe) = &args.memory_probe {
        memory_probe(probe, args.quick);
        return;
    }
    let all = workloads(args.quick);
    if args.list {
        for w in &all {
            let loads: Vec<_> = w.loads.iter().map(|l| l.name()).collect();
            println!(
                "{:<12} {}\n{:<12} loads: {}; subjects: {}",
                w.name,
                w.what,
                "",
                loads.join(", "),
                w.subjects.join(", ")
            );
        }
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> =
        if args.threads.is_empty() { (1..=cores).collect() } else { args.threads.clone() };
    if threads.contains(&0) {
        eprintln!("error: a thread count must be at least 1");
        std::process::exit(2);
    }
    let (reps, duration) = if args.quick {
        (1, Duration::from_millis(5))
    } else {
        (args.reps.max(1), Duration::from_millis(args.duration.max(1)))
    };
    let timing = Timing {
        warmup: duration / 4,
        duration,
        pin: !args.no_pin,
        batch_nanos: args.batch_us.max(0.01) * 1e3,
        latency: duration / 2,
    };

    // The plan: (workload, load, subject) cells that pass the filter.
    let filter = &args.filter;
    let plan: Vec<(&Workload, Load, Vec<&'static str>)> = all
        .iter()
        .flat_map(|w| {
            w.loads.iter().map(move |&load| {
                let subjects = w
                    .subjects
                    .iter()
                    .copied()
                    .filter(|s| selected(filter, &format!("{}/{}/{}", w.name, load.name(), s)))
                    .collect();
                (w, load, subjects)
            })
        })
        .filter(|(_, _, s): &(_, _, Vec<_>)| !s.is_empty())
        .collect();
    let pacing_selected = args.filter.is_empty() || args.filter.iter().any(|f| "pacing".contains(f.as_str()));
    let redis_wanted = args.filter.iter().any(|f| "redis".contains(f.as_str()));
    let envoy_selected = args.filter.is_empty() || args.filter.iter().any(|f| "envoy".contains(f.as_str()));
    if plan.is_empty() && !pacing_selected && !redis_wanted && !envoy_selected {
        eprintln!("error: no cell matches the filter; see --list");
        std::process::exit(2);
    }
    let runs: usize = plan.iter().map(|(_, _, s)| s.len()).sum::<usize>() * threads.len() * reps;
    let bar = progress(runs as u64);

    let (mut machine, cpu_start) = Machine::start();
    let started = Instant::now();
    let fresh = AtomicU64::new(1 << 50);
    let mut cells = Vec::new();
    let mut paired_rows = Vec::new();
    for (w, load, names) in &plan {
        bar.set_message(format!("{} {}: setting up", w.name, load.name()));
        let setup = Setup { load: *load, capacity: w.capacity };
        let subjects: Vec<(&str, Box<dyn Subject>)> =
            names.iter().map(|&n| (n, maker(w, n)(setup))).collect();
        let keys: Vec<Keys> = threads
            .iter()
            .map(|&t| match w.kind {
                Kind::Direct => Keys::Streams(vec![vec![0; 1024]]),
                Kind::Stream(dist) => Keys::Streams(streams(dist, t, args.quick)),
                Kind::Fresh => Keys::Fresh,
            })
            .collect();
        // Warm: every key of every stream decided once; a fresh workload's table filled.
        for (_, s) in &subjects {
            match w.kind {
                Kind::Direct => {}
                Kind::Stream(_) => {
                    for k in &keys {
                        if let Keys::Streams(streams) = k {
                            streams.iter().for_each(|st| st.chunks(driver::BATCH).for_each(|c| s.run(c)));
                        }
                    }
                }
                Kind::Fresh => {
                    let base = fresh.fetch_add(1 << 40, std::sync::atomic::Ordering::Relaxed);
                    let fill: Vec<u64> = (0..w.capacity as u64).map(|i| key(base + i)).collect();
                    fill.chunks(driver::BATCH).for_each(|c| s.run(c));
                }
            }
        }
        let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); threads.len()]; subjects.len()];
        for rep in 0..reps {
            for (ti, &t) in threads.iter().enumerate() {
                for (si, (name, s)) in subjects.iter().enumerate() {
                    bar.set_message(format!(
                        "{}/{}/{} ×{t} rep {}/{reps}",
                        w.name,
                        load.name(),
                        name,
                        rep + 1
                    ));
                    if matches!(w.kind, Kind::Fresh) {
                        s.reset();
                    }
                    samples[si][ti].push(measure(s.as_ref(), &keys[ti], t, timing, &fresh));
                    bar.inc(1);
                }
            }
        }
        for (si, (name, _)) in subjects.iter().enumerate() {
            for (ti, &t) in threads.iter().enumerate() {
                cells.push(Cell::new(w.name, *load, name, t, &samples[si][ti]));
            }
        }
        // The cost of the `metrics` feature is a few per cent, below what cells timed minutes
        // apart on a shared host can resolve: the pair is timed again in alternation, so that
        // drift lands on both sides of every ratio.
        let find = |n: &str| subjects.iter().find(|(name, _)| *name == n).map(|(_, s)| s.as_ref());
        let one = threads.iter().position(|&t| t == 1);
        if let (Some(base), Some(with), Some(one)) = (find("tollgate"), find("tollgate-metrics"), one) {
            bar.set_message(format!(
                "{}/{}: tollgate and tollgate-metrics in alternation",
                w.name,
                load.name()
            ));
            let rounds = if args.quick { 2 } else { PAIRED_ROUNDS };
            let ratios = paired(base, with, &keys[one], timing, rounds, &fresh);
            paired_rows.push(Paired::new(w.name, *load, "tollgate", "tollgate-metrics", ratios));
        }
    }
    bar.finish_and_clear();
    let mut memory = Vec::new();
    if !args.no_memory {
        let probes: Vec<(&str, &str)> = [
            ("1M-keys", "tollgate"),
            ("1M-keys", "tollgate-nginx"),
            ("1M-keys", "tollgate-sliding-log"),
            ("1M-keys", "governor"),
            ("1M-keys", "governor-ahash"),
            ("1M-keys", "mutex"),
            ("key-flood", "tollgate"),
            ("key-flood", "governor"),
            ("key-flood", "governor-ahash"),
            ("key-flood", "mutex"),
        ]
        .into_iter()
        .filter(|(w, name)| {
            selected(&args.filter, &format!("{w}/{name}"))
                || selected(&args.filter, &format!("{w}/deny-heavy/{name}"))
        })
        .collect();
        // One child process per probe, as many at once as there are cores: each measures only
        // its own resident set, and nothing is timed any more.
        for chunk in probes.chunks(cores) {
            let found: Vec<Option<Memory>> = std::thread::scope(|s| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|&(w, name)| {
                        eprintln!("memory: {w}/{name}");
                        s.spawn(move || run_probe(w, name, args.quick))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().ok().flatten()).collect()
            });
            memory.extend(found.into_iter().flatten());
        }
    }
    machine.finish(cpu_start);
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let pacing_rows = if pacing_selected {
        eprintln!("pacing: 4 ways of waiting, 2 threads");
        pacing::run(args.quick)
    } else {
        Vec::new()
    };
    let redis_selected = args.filter.is_empty() || args.filter.iter().any(|f| "redis".contains(f.as_str()));
    let (redis_rows, redis_skipped) = if redis_selected {
        eprintln!("redis: round trip, leased and the classic Lua script on a local redis-server");
        match redis::run(args.quick) {
            Ok(rows) => (rows, None),
            Err(why) => {
                eprintln!("redis: skipped: {why}");
                (Vec::new(), Some(why))
            }
        }
    } else {
        (Vec::new(), None)
    };
    let (envoy_rows, envoy_skipped) = if envoy_selected {
        eprintln!(
            "envoy: ShouldRateLimit over gRPC, embedded and on Redis, its floor and upstream's pattern"
        );
        match envoy::run(args.quick) {
            Ok(rows) => (rows, None),
            Err(why) => {
                eprintln!("envoy: skipped: {why}");
                (Vec::new(), Some(why))
            }
        }
    } else {
        (Vec::new(), None)
    };
    let mut report = Report::new(machine, cells, memory, reps, duration, threads, started.elapsed(), command);
    report.envoy = envoy_rows;
    report.envoy_skipped = envoy_skipped;
    report.pacing = pacing_rows;
    report.paired = paired_rows;
    report.redis = redis_rows;
    report.redis_skipped = redis_skipped;
    report.fill_ratios();
    let workloads: Vec<(&str, &str)> = all.iter().map(|w| (w.name, w.what)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("serializable"));
    } else if args.csv {
        report.write_csv(std::io::stdout()).expect("stdout");
    } else {
        print!("{}", report.text(&workloads));
    }
    if let Some(path) = &args.markdown {
        let charts = args.charts.clone().unwrap_or_else(|| {
            path.parent().unwrap_or(std::path::Path::new(".")).join("docs").join("charts")
        });
        if let Err(e) = report.write_markdown(path, &charts, &workloads) {
            eprintln!("error: writing {}: {e}", path.display());
            std::process::exit(1);
        }
        eprintln!("wrote {} and the charts in {}", path.display(), charts.display());
    }
}

/// Rounds of [`paired`]: each times both subjects for 10 ms.
const PAIRED_ROUNDS: usize = 40;

/// Times `base` and `with` on one thread in alternation (`base` first in even rounds, `with`
/// first in odd ones), `rounds` times, and returns each round's ratio of `with`'s time per
/// decision to `base`'s.
fn paired(
    base: &dyn Subject,
    with: &dyn Subject,
    keys: &Keys,
    timing: Timing,
    rounds: usize,
    fresh: &AtomicU64,
) -> Vec<f64> {
    let timing = Timing {
        warmup: Duration::from_millis(2),
        duration: Duration::from_millis(10),
        latency: Duration::ZERO,
        ..timing
    };
    (0..rounds)
        .map(|round| {
            let time = |s: &dyn Subject| measure(s, keys, 1, timing, fresh).ns_per_op;
            if round % 2 == 0 {
                let b = time(base);
                time(with) / b
            } else {
                let w = time(with);
                w / time(base)
            }
        })
        .collect()
}

fn progress(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Runs the memory probe for `subject` in `workload` in a child process, so that no other
/// subject's pages (or the allocator's free lists) count.
fn run_probe(workload: &str, subject: &str, quick: bool) -> Option<Memory> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--memory-probe").arg(format!("{workload}/{subject}"));
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().ok()?;
    if !out.status.success() {
        eprintln!("memory probe {workload}/{subject} failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// In the child: builds the subject, decides each key once, and prints the growth of resident
/// memory as JSON.
fn memory_probe(probe: &str, quick: bool) {
    let (workload, subject) = probe.split_once('/').expect("WORKLOAD/SUBJECT");
    let all = workloads(quick);
    let w = all.iter().find(|w| w.name == workload).expect("a known workload");
    let (load, keys) = match w.kind {
        // As many keys as tollgate's table holds at its maximum load, for every subject.
        Kind::Stream(_) => (Load::Allow, subjects::max_load_for(w.capacity)),
        // A spray of 100 times the capacity, none refilling.
        _ => (Load::Deny, 100 * w.capacity as u64),
    };
    let before = machine::rss_bytes().unwrap_or(0);
    let s = maker(w, subject)(Setup { load, capacity: w.capacity });
    let mut batch = Vec::with_capacity(driver::BATCH);
    for i in 0..keys {
        batch.push(key(i));
        if batch.len() == driver::BATCH {
            s.run(&batch);
            batch.clear();
        }
    }
    s.run(&batch);
    let after = machine::rss_bytes().unwrap_or(0);
    let m = Memory {
        workload: workload.to_owned(),
        subject: subject.to_owned(),
        keys,
        rss_growth: after.saturating_sub(before),
    };
    println!("{}", serde_json::to_string(&m).expect("serializable"));
    drop(s);
}
