//! Packets per second per core, and cycles per packet, at 1K, 64K and 1M flows, in one
//! process, in bursts of 32 (one clock reading a burst):
//!
//! - **floor**: a hash and one CAS a packet, on a table of 16-byte slots as large as the
//!   meters' table, with the same prefetch, on huge pages as the meters' tables are;
//! - **lookup floor**: a hash, the flow's key found in a table laid out as `FlowMeters`' (32-byte
//!   slots, linear probing), and one CAS a packet: the floor of any table that must find its
//!   flow, between which and the floor lies the cost of finding it;
//! - **tollgate**: `FlowMeters` (trTCM, colour-blind), the one-core table (no atomic); and
//!   `SharedFlowMeters`, the table every core may use (a 16-byte compare-and-swap a packet),
//!   uncontended here (one thread);
//! - **DPDK** (with `--features dpdk`, as root): `rte_meter_trtcm_color_blind_check`, Debian's
//!   DPDK, on runtimes held in the same kind of open-addressing table with the same hash and
//!   prefetch (flow -> its runtime, in the slot), the burst metered in C: the meters compared
//!   alone;
//! - **pipeline**: parse, key (5-tuple), meter, on frames of a synthetic capture in memory,
//!   against its floor: parse, key, hash and one CAS.
//!
//! Packets pick flows uniformly at random (every packet a likely cache miss at 1M flows);
//! sizes follow IMIX. Each cell runs for about 0.3 s, once a round, in five rounds; a time is
//! the median of its rounds, a ratio the median of its rounds' ratios (both cells of a ratio
//! measured in the same round, a second apart).
//!
//! ```text
//! cargo run --release -p tollgate-packets --features dpdk --example meter_bench
//! cargo run --release -p tollgate-packets --example meter_bench     # without DPDK's rows
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use tollgate::{Clock, Color, DefaultClock, FlowMeters, Meter, Nanos, SharedFlowMeters};
use tollgate_packets::capture::{CaptureReader, Frame, Record};
use tollgate_packets::generate::{generate, SplitMix, Synthetic};
use tollgate_packets::packet::{self, FlowKey, KeyBy};

const BURST: usize = 32;
const PACKETS: usize = 1 << 21;
/// Rounds of every cell (each about 0.3 s).
const ROUNDS: usize = 5;

fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
}

fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the time-stamp counter.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// `ns` and cycles per packet of `run` (which meters `packets` packets a call), over about
/// 0.3 s.
fn measure(packets: usize, mut run: impl FnMut()) -> (f64, f64) {
    run(); // warm: the tables' pages touched, the flows inserted
    let (start, c0) = (Instant::now(), cycles());
    let mut n = 0;
    while start.elapsed().as_secs_f64() < 0.3 {
        run();
        n += packets;
    }
    let (ns, c) = (start.elapsed().as_nanos() as f64, (cycles() - c0) as f64);
    (ns / n as f64, c / n as f64)
}

/// `n` values on memory of their own, asked for huge pages before it is touched, 2 MiB-aligned
/// (as FlowMeters maps its slots): every table of the benchmark on the same kind of memory.
struct Huge<T> {
    ptr: *mut T,
    n: usize,
    /// The whole mapping (one huge page more than the values, for the alignment).
    map: (*mut libc::c_void, usize),
}

impl<T> Huge<T> {
    fn new(n: usize, mut value: impl FnMut() -> T) -> Huge<T> {
        const HUGE: usize = 2 << 20;
        let bytes = (n * size_of::<T>()).next_multiple_of(HUGE) + HUGE;
        // SAFETY: a new private anonymous mapping; MAP_FAILED is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap of {bytes} bytes");
        let start = (base as usize).next_multiple_of(HUGE);
        let ptr = start as *mut T;
        // SAFETY: inside the mapping (it has a huge page to spare for the alignment); each value
        // written once, aligned (2 MiB-aligned start, `T`'s size a multiple of its alignment).
        unsafe {
            libc::madvise(start as *mut _, bytes - (start - base as usize), libc::MADV_HUGEPAGE);
            for i in 0..n {
                ptr.add(i).write(value());
            }
        }
        Huge { ptr, n, map: (base, bytes) }
    }
}

impl<T> std::ops::Deref for Huge<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `n` values written in `new`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.n) }
    }
}

impl<T> std::ops::DerefMut for Huge<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.n) }
    }
}

impl<T> Drop for Huge<T> {
    fn drop(&mut self) {
        // The values hold nothing to drop (plain words and pointers).
        // SAFETY: our own mapping, which nothing refers to any more.
        unsafe { libc::munmap(self.map.0, self.map.1) };
    }
}

/// An open-addressing table of every flow, its value in its slot, hashed, prefetched and
/// probed as `FlowMeters` does (twice the flows, linear probing from the home): the table
/// DPDK's runtimes are held in, and the lookup floor's.
struct Slots<V> {
    slots: Huge<(u64, V)>,
    mask: usize,
    hasher: ahash::RandomState,
}

impl<V> Slots<V> {
    /// Every flow of `keys` (non-zero), with `value()`.
    fn new(keys: &[u64], value: impl Fn() -> V) -> Slots<V> {
        let n = (keys.len() * 2).next_power_of_two();
        let mut t = Slots {
            slots: Huge::new(n, || (0, value())),
            mask: n - 1,
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
        };
        for &k in keys {
            let mut i = t.hasher.hash_one(k) as usize & t.mask;
            while t.slots[i].0 != 0 {
                i = (i + 1) & t.mask;
            }
            t.slots[i].0 = k;
        }
        t
    }

    /// Each key's slot, into `found`: every home hashed and prefetched first, then probed.
    fn find_burst(&self, keys: &[u64], found: &mut [usize; BURST]) {
        for (f, key) in found.iter_mut().zip(keys) {
            *f = self.hasher.hash_one(key) as usize & self.mask;
            prefetch(&self.slots[*f]);
        }
        for (f, key) in found.iter_mut().zip(keys) {
            while self.slots[*f].0 != *key {
                *f = (*f + 1) & self.mask;
            }
        }
    }
}

/// A key the burst arrays start with (every slot is overwritten before it is read).
const NO_KEY: FlowKey = FlowKey { src: 0, dst: 0, proto: 0, sport: 0, dport: 0 };

/// Parses and keys a burst of frames (the pipeline's and its floor's first step).
fn parse_burst(frames: &[Frame], keys: &mut [FlowKey; BURST], lens: &mut [u32; BURST]) {
    for ((f, k), l) in frames.iter().zip(keys.iter_mut()).zip(lens.iter_mut()) {
        let m = packet::read(f.link, &f.data, false, KeyBy::FiveTuple).unwrap();
        (*k, *l) = (m.key, m.len);
    }
}

/// The floor of any table that must find its flow: a hash, the flow's key found in a table
/// laid out as FlowMeters' (its key and 24 bytes beside it: a 32-byte slot, as a word key's
/// in FlowMeters), and one CAS a packet. What it costs beyond the floor is finding a flow;
/// what FlowMeters costs beyond it is the meter.
fn lookup_floor_burst(table: &Slots<[AtomicU64; 3]>, keys: &[u64], lens: &[u32]) {
    let mut found = [0usize; BURST];
    table.find_burst(keys, &mut found);
    for (&i, &len) in found.iter().zip(lens) {
        let c = &table.slots[i].1[0];
        let v = c.load(Relaxed);
        let _ = c.compare_exchange(v, v + u64::from(len), Relaxed, Relaxed);
    }
}

/// The floor: a hash and one CAS a packet, bursts prefetched as the meters' table does.
struct Floor {
    slots: Huge<[AtomicU64; 2]>,
    mask: usize,
    hasher: ahash::RandomState,
}

impl Floor {
    fn new(flows: usize) -> Floor {
        let n = (flows * 2).next_power_of_two();
        Floor {
            slots: Huge::new(n, || [AtomicU64::new(0), AtomicU64::new(0)]),
            mask: n - 1,
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
        }
    }

    fn burst<K: std::hash::Hash>(&self, keys: &[K], lens: &[u32]) {
        let mut homes = [0usize; BURST];
        for (i, k) in keys.iter().enumerate() {
            homes[i] = self.hasher.hash_one(k) as usize & self.mask;
            prefetch(&self.slots[homes[i]]);
        }
        for (i, &h) in homes[..keys.len()].iter().enumerate() {
            let s = &self.slots[h][1];
            let v = s.load(Relaxed);
            let _ = s.compare_exchange(v, v + u64::from(lens[i]), Relaxed, Relaxed);
        }
    }
}

fn main() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    println!("CPU: {cpu}; bursts of {BURST}; {PACKETS} packets a pass, uniform over the flows; median of {ROUNDS} rounds of ~0.3 s a cell, ratios paired within a round");
    #[cfg(feature = "dpdk")]
    let hz = tollgate_packets::dpdk::start_eal().unwrap_or_else(|e| panic!("{e}"));
    let meter: Meter = "trtcm cir=10Mbit/s cbs=16KiB pir=20Mbit/s pbs=32KiB".parse().unwrap();
    println!();
    println!("| flows | floor (hash + CAS) | lookup floor (hash + find + CAS) | ×floor | tollgate FlowMeters | ×floor | ×lookup floor | DPDK rte_meter | tollgate ÷ DPDK (speed) | SharedFlowMeters (lock-free, 1 thread) | ×floor | pipeline floor (parse + hash + CAS) | pipeline (parse, key, meter) | ×floor |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let imix = [40u32, 40, 40, 40, 40, 40, 40, 576, 576, 576, 576, 1_500];
    let mut huge = Vec::new();
    for flows in [1usize << 10, 1 << 16, 1 << 20] {
        let mut rng = SplitMix(flows as u64);
        let flow_keys: Vec<u64> = (0..flows).map(|_| rng.next()).collect();
        let keys: Vec<u64> = (0..PACKETS).map(|_| flow_keys[(rng.next() % flows as u64) as usize]).collect();
        let lens: Vec<u32> = (0..PACKETS).map(|i| imix[i % imix.len()]).collect();
        let clock = DefaultClock::default();
        let origin = clock.now();

        let floor = Floor::new(flows);
        let run_floor = || {
            for (k, l) in keys.chunks(BURST).zip(lens.chunks(BURST)) {
                floor.burst(k, l);
            }
        };
        let lookup = Slots::new(&flow_keys, || [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        let run_lookup = || {
            for (k, l) in keys.chunks(BURST).zip(lens.chunks(BURST)) {
                lookup_floor_burst(&lookup, k, l);
            }
        };

        let mut table = FlowMeters::<u64>::with_seeds(meter, flows * 2, [1, 2, 3, 4]).unwrap();
        let mut colors = [Color::Red; BURST];
        let mut run_tollgate = || {
            for (k, l) in keys.chunks(BURST).zip(lens.chunks(BURST)) {
                let now = Nanos::new(clock.now().as_u64() - origin.as_u64());
                table.check_burst(now, k, l, None, &mut colors);
                black_box(&colors);
            }
        };

        // The shared table (every core may meet every flow): a 16-byte compare-and-swap a
        // packet, and a tag's load (its flows inserted on the first pass, the warm-up).
        let shared = SharedFlowMeters::<u64>::with_seeds(meter, flows * 2, [1, 2, 3, 4]).unwrap();
        let run_shared = || {
            let mut out = [Color::Red; BURST];
            for (k, l) in keys.chunks(BURST).zip(lens.chunks(BURST)) {
                let now = Nanos::new(clock.now().as_u64() - origin.as_u64());
                shared.check_burst(now, k, l, None, &mut out);
                black_box(&out);
            }
        };

        #[cfg(feature = "dpdk")]
        let (keys_d, lens_d) = (&keys, &lens);
        #[cfg(feature = "dpdk")]
        let mut run_dpdk = {
            use tollgate_packets::dpdk::{tsc, DpdkFlows, TrTcmRuntime};
            let ((cir, cbs), (pir, pbs)) = (meter.committed(), meter.second());
            let now = tsc();
            let mut table = Slots::new(&flow_keys, || TrTcmRuntime::full(cbs, pbs, now));
            let profile = DpdkFlows::new(cir, cbs, pir, pbs, 1).expect("DPDK takes the profile");
            let mut runtimes = [std::ptr::null_mut::<TrTcmRuntime>(); BURST];
            let (mut out, mut found) = ([0u8; BURST], [0usize; BURST]);
            let _ = hz;
            move || {
                for (k, l) in keys_d.chunks(BURST).zip(lens_d.chunks(BURST)) {
                    table.find_burst(k, &mut found);
                    for (r, &j) in runtimes.iter_mut().zip(&found[..k.len()]) {
                        *r = &mut table.slots[j].1;
                    }
                    // SAFETY: every pointer is a slot of `table`, alive and not otherwise used
                    // during the call.
                    unsafe { profile.burst_on(&runtimes[..k.len()], l, tsc(), &mut out) };
                    black_box(&out);
                }
            }
        };

        // The pipeline: a synthetic capture with `flows` flows, its frames in memory.
        let mut capture = Vec::new();
        let s = Synthetic {
            flows,
            packets: 1 << 19,
            malformed_ppm: 0,
            ipv6_ppm: 200_000,
            zipf: 0.0,
            seed: 9,
            ..Synthetic::default()
        };
        generate(&mut capture, &s).unwrap();
        let mut reader = CaptureReader::new(&capture[..]).unwrap();
        let mut frames: Vec<Frame> = Vec::new();
        while let Some(Ok(Record::Frame(f))) = reader.next_record() {
            frames.push(f);
        }
        let pfloor = Floor::new(flows);
        let run_pipeline_floor = || {
            let (mut ks, mut ls) = ([NO_KEY; BURST], [0u32; BURST]);
            for chunk in frames.chunks(BURST) {
                parse_burst(chunk, &mut ks, &mut ls);
                pfloor.burst(&ks[..chunk.len()], &ls[..chunk.len()]);
            }
        };
        let mut ptable = FlowMeters::<FlowKey>::with_seeds(meter, flows * 2, [1, 2, 3, 4]).unwrap();
        let mut pcolors = [Color::Red; BURST];
        let mut run_pipeline = || {
            let (mut ks, mut ls) = ([NO_KEY; BURST], [0u32; BURST]);
            for chunk in frames.chunks(BURST) {
                parse_burst(chunk, &mut ks, &mut ls);
                let now = Nanos::new(clock.now().as_u64() - origin.as_u64());
                ptable.check_burst(now, &ks[..chunk.len()], &ls[..chunk.len()], None, &mut pcolors);
                black_box(&pcolors);
            }
        };

        // Each round measures every cell once, one after another: a ratio is taken within a
        // round (its two cells a second apart on a shared host), and the median of a cell's
        // ratios over the rounds is reported beside the median of its times.
        let mut cells: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 7];
        for _ in 0..ROUNDS {
            cells[0].push(measure(PACKETS, run_floor));
            cells[6].push(measure(PACKETS, run_lookup));
            cells[1].push(measure(PACKETS, &mut run_tollgate));
            cells[5].push(measure(PACKETS, &run_shared));
            #[cfg(feature = "dpdk")]
            cells[2].push(measure(PACKETS, &mut run_dpdk));
            cells[3].push(measure(frames.len(), run_pipeline_floor));
            cells[4].push(measure(frames.len(), &mut run_pipeline));
        }
        huge.push(format!(
            "{flows} flows: FlowMeters {} MiB of {} MiB on huge pages",
            table.huge_page_bytes() >> 20,
            (table.capacity() * 32) >> 20
        ));
        let median = |mut v: Vec<f64>| -> Option<f64> {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let show = |c: usize| {
            let ns = median(cells[c].iter().map(|x| x.0).collect());
            let cyc = median(cells[c].iter().map(|x| x.1).collect());
            match (ns, cyc) {
                (Some(ns), Some(cyc)) => format!("{ns:.1} ns, {cyc:.0} cycles, {:.1} Mpps", 1e3 / ns),
                _ => "—".to_owned(),
            }
        };
        let ratio = |a: usize, b: usize| {
            let r: Vec<f64> = cells[a].iter().zip(&cells[b]).map(|(a, b)| a.0 / b.0).collect();
            median(r).map_or("—".to_owned(), |r| format!("{r:.2}×"))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            if flows >= 1 << 20 { "1M".to_owned() } else { format!("{}K", flows >> 10) },
            show(0),
            show(6),
            ratio(6, 0),
            show(1),
            ratio(1, 0),
            ratio(1, 6),
            show(2),
            ratio(2, 1),
            show(5),
            ratio(5, 0),
            show(3),
            show(4),
            ratio(4, 3),
        );
    }
    println!();
    for line in huge {
        println!("{line}");
    }
}
