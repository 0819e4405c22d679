//! Facts about the machine and how noisy it was: CPU, cores, load, steal time, and the resident
//! memory readings the memory probes take.

use std::process::Command;

/// What the report says about where it ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub rustc: String,
    /// tollgate's commit, with `-dirty` when the work tree had changes.
    pub commit: String,
    /// The 1, 5 and 15 minute load averages when the run started.
    pub load_start: [f64; 3],
    /// The same when it ended.
    pub load_end: [f64; 3],
    /// The share of CPU time the hypervisor took from this machine during the run, in percent.
    pub steal_percent: Option<f64>,
    /// What a thread spinning on the clock saw at the start.
    pub noise: Noise,
}

/// Interruptions seen by a thread that does nothing but read the TSC: every gap between two
/// reads above 1 µs is time the thread did not run (an interrupt, a hypervisor exit, a
/// preemption). They set the floor of every tail latency this machine can measure.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Noise {
    /// Gaps above 1 µs per second.
    pub gaps_per_sec: f64,
    /// Gaps above 10 µs per second.
    pub long_gaps_per_sec: f64,
    /// The share of the time lost in gaps, percent.
    pub lost_percent: f64,
    /// The longest gap, µs.
    pub longest_us: f64,
}

impl Noise {
    /// Spins for `secs` seconds on the calling thread.
    pub fn measure(secs: f64) -> Noise {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        let (mut last, mut gaps, mut long, mut lost, mut longest) = (start, 0u64, 0u64, 0u64, 0u64);
        let limit = (secs * 1e9) as u64;
        loop {
            let now = clock.raw();
            let gap = clock.delta_as_nanos(last, now);
            if gap > 1_000 {
                gaps += 1;
                lost += gap;
                longest = longest.max(gap);
                if gap > 10_000 {
                    long += 1;
                }
            }
            last = now;
            let spent = clock.delta_as_nanos(start, now);
            if spent >= limit {
                let s = spent as f64 / 1e9;
                return Noise {
                    gaps_per_sec: gaps as f64 / s,
                    long_gaps_per_sec: long as f64 / s,
                    lost_percent: 100.0 * lost as f64 / spent as f64,
                    longest_us: longest as f64 / 1e3,
                };
            }
        }
    }
}

impl std::fmt::Display for Noise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a spinning thread lost {:.1}% of its time: {:.0} gaps/s over 1 µs, {:.0}/s over 10 µs, the longest {:.0} µs",
            self.lost_percent, self.gaps_per_sec, self.long_gaps_per_sec, self.longest_us
        )
    }
}

/// CPU time counters from `/proc/stat`: (steal, total), in ticks.
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    steal: u64,
    total: u64,
}

pub fn cpu_times() -> Option<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal guest guest_nice: guests are inside user.
    let total = fields.iter().take(8).sum();
    Some(CpuTimes { steal: *fields.get(7)?, total })
}

pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text.split_whitespace().filter_map(|f| f.parse().ok());
    [it.next().unwrap_or(f64::NAN), it.next().unwrap_or(f64::NAN), it.next().unwrap_or(f64::NAN)]
}

fn first_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_owned())
}

impl Machine {
    /// Reads the machine at the start of a run.
    pub fn start() -> (Machine, Option<CpuTimes>) {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_owned())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("{} {}", std::env::consts::OS, s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_owned());
        let dir = env!("CARGO_MANIFEST_DIR");
        let commit = first_line("git", &["-C", dir, "rev-parse", "--short=12", "HEAD"]).map_or_else(
            || "unknown".to_owned(),
            |c| {
                let dirty = first_line("git", &["-C", dir, "status", "--porcelain", "--untracked-files=no"])
                    .is_some_and(|s| !s.is_empty());
                if dirty {
                    format!("{c}-dirty")
                } else {
                    c
                }
            },
        );
        let machine = Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            rustc: first_line("rustc", &["--version"]).unwrap_or_else(|| "unknown".to_owned()),
            commit,
            load_start: load_average(),
            load_end: [f64::NAN; 3],
            steal_percent: None,
            noise: Noise::measure(0.5),
        };
        (machine, cpu_times())
    }

    /// Records the end of the run.
    pub fn finish(&mut self, start: Option<CpuTimes>) {
        self.load_end = load_average();
        if let (Some(a), Some(b)) = (start, cpu_times()) {
            let total = b.total.saturating_sub(a.total);
            if total > 0 {
                self.steal_percent = Some(100.0 * b.steal.saturating_sub(a.steal) as f64 / total as f64);
            }
        }
    }
}

/// This process's resident memory in bytes (Linux), from `/proc/self/statm`.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

#[cfg(not(target_os = "linux"))]
fn page_size() -> u64 {
    4096
}
