//! Workloads shared by the criterion benches and the `tollgate-bench` binary (which includes
//! this file): pre-generated key streams (uniform and Zipf), the direct and keyed floors, and
//! the all-cores driver. Deterministic: every run and every peer sees the same keys in the same
//! order.

#![allow(dead_code, unreachable_pub)] // each user takes a subset
#![allow(clippy::cast_possible_truncation, reason = "64-bit benchmark hosts")]

use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use tollgate::Clock;

/// A xorshift64* generator: fast, deterministic, good enough to draw keys.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Key `i` of a key space: spread over `u64` (a bijection), so keys are not small integers.
pub fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995
}

/// How the keys of a stream are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Dist {
    /// Every decision on the same key.
    One,
    /// Uniform over `n` keys.
    Uniform(u64),
    /// Zipf with exponent 1.0 over `n` keys: rank `r` drawn with weight `1/r`.
    Zipf(u64),
}

impl Dist {
    pub fn keys(self) -> u64 {
        match self {
            Dist::One => 1,
            Dist::Uniform(n) | Dist::Zipf(n) => n,
        }
    }
}

/// A stream of `len` (a power of two) keys drawn from `dist` with `seed`.
pub fn stream(dist: Dist, len: usize, seed: u64) -> Vec<u64> {
    ranks(dist, len, seed).into_iter().map(key).collect()
}

/// A stream of `len` (a power of two) key ranks (indices into the key space) drawn from `dist`
/// with `seed`: `key(rank)` is the key.
pub fn ranks(dist: Dist, len: usize, seed: u64) -> Vec<u64> {
    assert!(len.is_power_of_two());
    let mut rng = Rng::new(seed);
    match dist {
        Dist::One => vec![0; len],
        Dist::Uniform(n) => (0..len).map(|_| rng.next() % n).collect(),
        Dist::Zipf(n) => {
            // Inverse CDF over the harmonic weights, by binary search.
            let mut cdf = Vec::with_capacity(n as usize);
            let mut sum = 0.0;
            for r in 1..=n {
                sum += 1.0 / r as f64;
                cdf.push(sum);
            }
            (0..len)
                .map(|_| {
                    let u = rng.unit() * sum;
                    let rank = cdf.partition_point(|&c| c < u) as u64;
                    rank.min(n - 1)
                })
                .collect()
        }
    }
}

/// The direct floor: one clock read and one load + CAS on `word`, retried until it lands (it
/// never fails on one thread): the least any clocked lock-free limiter can cost.
#[inline]
pub fn floor_step(clock: &impl Clock, word: &AtomicU64) {
    let now = clock.now().as_u64();
    let mut cur = word.load(Relaxed);
    while let Err(seen) = word.compare_exchange_weak(cur, cur.wrapping_add(now | 1), Relaxed, Relaxed) {
        cur = seen;
    }
}

/// Slots to a group in [`Floor::step_select`]: a 64-byte line of 16-byte slots.
const GROUP_SLOTS: usize = 4;

/// The keyed floor: one clock read, one ahash of the key, and one load + CAS on a slot of a
/// preallocated table with as many 16-byte slots as tollgate's, with no key check. The slots
/// are on huge pages where tollgate's are ([`HugeSlots`]), so that the floor pays no page walks
/// tollgate does not.
pub struct Floor<C: Clock> {
    slots: HugeSlots,
    mask: usize,
    hasher: ahash::RandomState,
    clock: C,
}

impl<C: Clock> Floor<C> {
    pub fn new(slots: usize, clock: C) -> Floor<C> {
        let slots = slots.next_power_of_two();
        Floor {
            slots: HugeSlots::new(slots),
            mask: slots - 1,
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            clock,
        }
    }

    #[inline]
    pub fn step(&self, key: u64) {
        let now = self.clock.now().as_u64();
        let word = &self.slots[self.hasher.hash_one(key) as usize & self.mask][1];
        self.cas(word, now);
    }

    /// The same work, but the slot is fetched before the clock is read (as tollgate does), so
    /// that the cache miss overlaps the clock read: a prefetch, which no later instruction
    /// waits for (a load, on the Xeon guest of session 14, held back the TSC read after it).
    #[inline]
    pub fn step_prefetched(&self, key: u64) {
        let word = &self.slots[self.hasher.hash_one(key) as usize & self.mask][1];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (word as *const AtomicU64).cast(),
            );
        }
        let now = self.clock.now().as_u64();
        self.cas(word, now);
    }

    /// [`step_prefetched`](Floor::step_prefetched) in a table that checks keys, with four
    /// 16-byte slots (a word and a key) to a 64-byte group, tollgate's shape for `u64` keys:
    /// the slot is the last of slots 1–3 whose key matches, or slot 0, picked without
    /// branching (where a key sits in its group cannot be predicted); then its word is read,
    /// its key read again after the word (what vouches for a word read without a lock), and
    /// the word CASed. A key of 0 marks a free slot, and is no stream's key: [`key`] gives it
    /// only to the rank 0x292f_e2fd_68f5_9781. A key not found there takes [`select_slow`](Floor::select_slow), as
    /// tollgate's do. No bucket arithmetic, no answer: the least a table that checks keys
    /// among four slots of a line pays, beside which tollgate's own work can be read.
    #[inline]
    pub fn step_select(&self, key: u64) {
        debug_assert_ne!(key, 0, "0 marks a free slot");
        let first = self.hasher.hash_one(key) as usize & self.mask & !(GROUP_SLOTS - 1);
        let group = &self.slots[first..first + GROUP_SLOTS];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(group.as_ptr().cast());
        }
        let now = self.clock.now().as_u64();
        let mut slot = &group[0];
        for candidate in &group[1..] {
            slot = if candidate[1].load(Relaxed) == key { candidate } else { slot };
        }
        let cur = slot[0].load(Acquire);
        if slot[1].load(Relaxed) == key {
            self.cas_from(&slot[0], cur, now);
        } else {
            self.select_slow(first, key, now);
        }
    }

    /// A key not in the slot its home group's select picked: its slot, or a free one it
    /// claims, from the home group's last slot down, then in the groups after it. Keys are
    /// never removed (the floor's tables are sized for their streams, as tollgate's are).
    #[cold]
    #[inline(never)]
    fn select_slow(&self, first: usize, key: u64, now: u64) {
        for group in 0..=self.mask / GROUP_SLOTS {
            for pos in (0..GROUP_SLOTS).rev() {
                let slot = &self.slots[(first + group * GROUP_SLOTS + pos) & self.mask];
                // Acquire (the load and a failed claim): pairs with a claim's AcqRel.
                let mut held = slot[1].load(Acquire);
                if held == 0 {
                    held = match slot[1].compare_exchange(0, key, AcqRel, Acquire) {
                        Ok(_) => key,
                        Err(held) => held,
                    };
                }
                if held == key {
                    self.cas_from(&slot[0], slot[0].load(Relaxed), now);
                    return;
                }
            }
        }
        panic!("the select floor's table is full: it is sized for fewer keys than its stream has");
    }

    #[inline]
    fn cas(&self, word: &AtomicU64, now: u64) {
        self.cas_from(word, word.load(Relaxed), now);
    }

    /// The word and key of every slot [`step_select`](Floor::step_select) has given a key.
    pub fn held(&self) -> Vec<(u64, u64)> {
        self.slots
            .iter()
            .map(|s| (s[0].load(Relaxed), s[1].load(Relaxed)))
            .filter(|&(_, key)| key != 0)
            .collect()
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.mask + 1
    }

    #[inline]
    fn cas_from(&self, word: &AtomicU64, cur: u64, now: u64) {
        let mut cur = cur;
        while let Err(seen) = word.compare_exchange_weak(cur, cur.wrapping_add(now | 1), Relaxed, Relaxed) {
            cur = seen;
        }
    }
}

/// Zeroed 16-byte slots in an anonymous mapping of their own, advised onto transparent huge
/// pages before the first touch (as tollgate's table is): from the heap, a large array can
/// come back as memory already faulted in 4 KiB pages, where the advice does nothing.
pub struct HugeSlots {
    map: *mut libc::c_void,
    map_len: usize,
    slots: *const [AtomicU64; 2],
    len: usize,
}

// SAFETY: the slots are atomics, shared as `&[[AtomicU64; 2]]`; the mapping is owned.
unsafe impl Send for HugeSlots {}
// SAFETY: as above.
unsafe impl Sync for HugeSlots {}

impl HugeSlots {
    const HUGE: usize = 2 << 20;

    pub fn new(len: usize) -> HugeSlots {
        let bytes = (len * 16).next_multiple_of(Self::HUGE).max(Self::HUGE);
        let map_len = bytes + Self::HUGE;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(map != libc::MAP_FAILED, "mapping {map_len} bytes for the floor's slots failed");
        let start = (map as usize).next_multiple_of(Self::HUGE);
        // SAFETY: `[start, start + bytes)` lies in the mapping (`start − map < HUGE`), not yet
        // touched. A failed advice (THP off) leaves ordinary pages.
        unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
        HugeSlots { map, map_len, slots: start as *const [AtomicU64; 2], len }
    }
}

impl std::ops::Deref for HugeSlots {
    type Target = [[AtomicU64; 2]];

    fn deref(&self) -> &[[AtomicU64; 2]] {
        // SAFETY: `len` slots of zero bytes (a valid `AtomicU64`), aligned (2 MiB), inside
        // the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.slots, self.len) }
    }
}

impl Drop for HugeSlots {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`; no slice of it outlives `self`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The number of threads for all-cores runs.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Runs `op(thread, i)` for `i` in `0..iters` on every core at once, after a barrier; returns
/// the mean of the threads' own spans: time per decision per thread.
pub fn on_all_cores(iters: u64, op: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    let threads = cores();
    let barrier = Barrier::new(threads);
    let total: Duration = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        op(t, i);
                    }
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total / u32::try_from(threads).expect("a thread count fits u32")
}
