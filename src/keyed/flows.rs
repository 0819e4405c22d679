//! A per-flow meter table owned by one thread: for packet pipelines whose flows are pinned to
//! cores (RSS), where each core meters its own flows with no atomic on its path.
//!
//! Open addressing: a flow lives in one of the [`WINDOW`] slots from its home (its hash's
//! low bits), found by scanning them. A flow whose buckets are both full is a fresh flow's
//! state, now and later, so its slot is taken by a new flow at no cost to anyone; a new flow
//! that finds its window full of flows still metering is coloured red and counted
//! ([`FlowMeters::table_full`]): the table fails closed, never handing out fresh buckets.
//! Bursts ([`FlowMeters::check_burst`]) read the clock once (the caller's), hash every packet,
//! start fetching every home before deciding any, and compute each rate's byte-tick once.
//!
//! A time earlier than the latest the table has read is read as that latest (the table's
//! clock stands still): a flow whose slot was reused or swept, coming back at an earlier
//! time, must not find fresh buckets it would not have had at the time it left.

use core::fmt;
use core::hash::Hash;
use core::mem::MaybeUninit;

use super::pages::Pages;
use super::prefetch_line;
use crate::policies::meter::{RFC4115, SRTCM, TRTCM};
use crate::{Color, ConfigError, Meter, MeterKind, MeterState, Nanos};

/// Slots a flow may occupy from its home.
const WINDOW: usize = 8;

/// Packets a burst handles at once: hashes and prefetches for these, then decides them.
const BURST: usize = 32;

/// The largest table (bytes of slots) whose bursts decide without branches. A table in a
/// core's cache is bound by mispredicted colours (branch-free: 27-28 cycles a packet against
/// 30-33 at 1,000 flows, AMD EPYC, at 86339a2); one in memory by its misses, which a core
/// overlaps further when it runs ahead on predicted colours (branch-free: 29 against 25 at
/// 65,536 flows).
const FLAT_MAX: usize = 1 << 20;

/// An empty slot's first word. No flow's committed bucket is ever full at this tick: a full
/// tick is at most `MAX_TICK + MAX_SIZE` (2^63 + 2^40), and a decision never moves it past that.
const EMPTY: u64 = u64::MAX;

/// One slot: a flow's state and key, or no flow (its first word [`EMPTY`], its key
/// uninitialised). Without an `Option`'s tag, a 5-tuple (48 bytes) and its state fill one
/// cache line, and a word key's slot is half of one; aligned to 32 bytes, a slot of 32 never
/// straddles two lines.
#[repr(C, align(32))]
struct Slot<K> {
    state: MeterState,
    key: MaybeUninit<K>,
}

impl<K> Slot<K> {
    const fn empty() -> Slot<K> {
        Slot { state: MeterState::from_words([EMPTY, 0]), key: MaybeUninit::uninit() }
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.state.words()[0] == EMPTY
    }

    /// The flow's key, if the slot holds one.
    #[inline(always)]
    fn key(&self) -> Option<&K> {
        if self.is_empty() {
            None
        } else {
            // SAFETY: a slot's first word leaves EMPTY only in `fill`, which writes the key
            // first, and returns to it only in `vacate`, which drops it: the key is
            // initialised whenever the word is not EMPTY.
            Some(unsafe { self.key.assume_init_ref() })
        }
    }

    /// Holds `key`'s flow from now, both buckets full (a flow it held before is forgotten).
    fn fill(&mut self, key: K) {
        self.vacate();
        self.key.write(key);
        self.state = MeterState::new();
    }

    /// Forgets the slot's flow, if any.
    fn vacate(&mut self) {
        if !self.is_empty() {
            self.state = MeterState::from_words([EMPTY, 0]);
            // SAFETY: the key is initialised (see `key`) and, the word now EMPTY, is read or
            // dropped by nothing else.
            unsafe { self.key.assume_init_drop() };
        }
    }
}

impl<K> Drop for Slot<K> {
    fn drop(&mut self) {
        self.vacate();
    }
}

/// Flows metered under one [`Meter`] profile, in memory fixed at construction, owned by one
/// thread (`&mut self`: no atomics, no locks).
///
/// ```
/// use tollgate::{Color, FlowMeters, Meter, Nanos};
///
/// let meter: Meter = "trtcm cir=1Mbit/s cbs=3000 pir=2Mbit/s pbs=6000".parse()?;
/// let mut flows = FlowMeters::<u32>::new(meter, 1 << 16)?;
/// let keys = [7, 7, 7, 9];
/// let lens = [1_500, 1_500, 1_500, 64];
/// let mut colors = [Color::Red; 4];
/// flows.check_burst(Nanos::ZERO, &keys, &lens, None, &mut colors);
/// assert_eq!(colors, [Color::Green, Color::Green, Color::Yellow, Color::Green]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FlowMeters<K> {
    meter: Meter,
    slots: Pages<Slot<K>>,
    mask: usize,
    hasher: ahash::RandomState,
    flows: usize,
    table_full: u64,
    /// The latest time a decision or a sweep has read: an earlier one is read as this.
    latest: Nanos,
}

impl<K> fmt::Debug for FlowMeters<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowMeters")
            .field("meter", &self.meter)
            .field("capacity", &self.slots.len())
            .field("flows", &self.flows)
            .field("table_full", &self.table_full)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone> FlowMeters<K> {
    /// The most slots a table may have: 2^32 (2^26 where `usize` has 32 bits).
    pub const MAX_CAPACITY: usize = MAX_SLOTS;

    /// A table of at least `capacity` flows (rounded up to a power of two, at least 8) under
    /// `meter`, hashed with random seeds.
    pub fn new(meter: Meter, capacity: usize) -> Result<FlowMeters<K>, ConfigError> {
        FlowMeters::build(meter, capacity, ahash::RandomState::new())
    }

    /// As [`new`](FlowMeters::new), hashed with `seeds` (reproducible placement, for tests and
    /// for tables that several processes must lay out alike).
    pub fn with_seeds(meter: Meter, capacity: usize, seeds: [u64; 4]) -> Result<FlowMeters<K>, ConfigError> {
        let [a, b, c, d] = seeds;
        FlowMeters::build(meter, capacity, ahash::RandomState::with_seeds(a, b, c, d))
    }

    fn build(
        meter: Meter,
        capacity: usize,
        hasher: ahash::RandomState,
    ) -> Result<FlowMeters<K>, ConfigError> {
        let v = slot_array(capacity, Self::MAX_CAPACITY, "a flow meter table", Slot::empty)?;
        let slots = v.len();
        Ok(FlowMeters {
            meter,
            slots: v,
            mask: slots - 1,
            hasher,
            flows: 0,
            table_full: 0,
            latest: Nanos::ZERO,
        })
    }

    /// The profile every flow is metered under.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Flows held (some may be full again, and reclaimable).
    pub fn len(&self) -> usize {
        self.flows
    }

    /// Whether no flow is held.
    pub fn is_empty(&self) -> bool {
        self.flows == 0
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Packets coloured red because their new flow found no room (its window full of flows
    /// still metering).
    pub fn table_full(&self) -> u64 {
        self.table_full
    }

    /// Bytes of the table the kernel backs with huge pages now: a table of 2 MiB or more maps
    /// its slots itself and asks for them (Linux with transparent huge pages in `madvise` or
    /// `always` mode); 0 for a smaller table or elsewhere. Reads `/proc/self/smaps`: not for
    /// a hot path.
    pub fn huge_page_bytes(&self) -> u64 {
        super::pages::huge_bytes([self.slots.mapping()])
    }

    /// Colour-blind: one packet of `bytes` of flow `key` at `elapsed` since the meter's origin.
    pub fn check(&mut self, key: &K, elapsed: Nanos, bytes: u64) -> Color {
        let ticks = self.ticks_at(elapsed);
        let home = self.home(key);
        self.decide(home, key, ticks, bytes, None)
    }

    /// Colour-aware: as [`check`](FlowMeters::check) for a packet that arrives coloured
    /// `input`.
    pub fn check_aware(&mut self, key: &K, elapsed: Nanos, bytes: u64, input: Color) -> Color {
        let ticks = self.ticks_at(elapsed);
        let home = self.home(key);
        self.decide(home, key, ticks, bytes, Some(input))
    }

    /// A burst at one instant, in DPDK's shape: packet `i` of flow `keys[i]` and `lens[i]`
    /// bytes (arriving coloured `inputs[i]` when given: colour-aware) is coloured `out[i]`.
    /// Handles the shortest of the slices; returns how many it coloured.
    pub fn check_burst(
        &mut self,
        elapsed: Nanos,
        keys: &[K],
        lens: &[u32],
        inputs: Option<&[Color]>,
        out: &mut [Color],
    ) -> usize {
        let ticks = self.ticks_at(elapsed);
        self.burst(|_| ticks, keys, lens, inputs, out)
    }

    /// A burst whose packets keep their own times (a capture's timestamps): packet `i` at
    /// `times[i]` since the meter's origin, as [`check_burst`](FlowMeters::check_burst)
    /// otherwise. Each time costs a division per rate that one instant shares.
    pub fn check_burst_at(
        &mut self,
        times: &[Nanos],
        keys: &[K],
        lens: &[u32],
        inputs: Option<&[Color]>,
        out: &mut [Color],
    ) -> usize {
        let n = burst_len(keys.len().min(times.len()), lens, inputs, out);
        let meter = self.meter;
        // Packets are decided in order: each at its time or the latest before it. The table's
        // latest moves to the burst's before any is decided, so that even a burst cut short
        // (a key's `Hash` or `Eq` panicking) leaves no state decided later than it.
        let latest = core::cell::Cell::new(self.latest);
        self.latest = times[..n].iter().fold(self.latest, |a, &t| a.max(t));
        self.burst(
            |i| {
                let t = times[i].max(latest.get());
                latest.set(t);
                meter.ticks(t)
            },
            &keys[..n],
            &lens[..n],
            inputs,
            &mut out[..n],
        )
    }

    /// The byte-ticks at `elapsed`, or at the latest time the table has seen if that is later
    /// (which `elapsed` becomes).
    #[inline]
    fn ticks_at(&mut self, elapsed: Nanos) -> [u64; 2] {
        self.latest = self.latest.max(elapsed);
        self.meter.ticks(self.latest)
    }

    /// The bursts' loop, specialized to the meter's kind and to colour-blind or -aware.
    #[inline]
    fn burst(
        &mut self,
        ticks: impl Fn(usize) -> [u64; 2],
        keys: &[K],
        lens: &[u32],
        inputs: Option<&[Color]>,
        out: &mut [Color],
    ) -> usize {
        let n = burst_len(keys.len(), lens, inputs, out);
        let (keys, lens, out) = (&keys[..n], &lens[..n], &mut out[..n]);
        if self.slots.len() * size_of::<Slot<K>>() <= FLAT_MAX {
            self.burst_of::<true>(ticks, keys, lens, inputs, out);
        } else {
            self.burst_of::<false>(ticks, keys, lens, inputs, out);
        }
        n
    }

    /// [`burst`](FlowMeters::burst) deciding without branches (`FLAT`) or with them.
    #[inline(always)]
    fn burst_of<const FLAT: bool>(
        &mut self,
        ticks: impl Fn(usize) -> [u64; 2],
        keys: &[K],
        lens: &[u32],
        inputs: Option<&[Color]>,
        out: &mut [Color],
    ) {
        match (self.meter.kind(), inputs) {
            (MeterKind::SrTcm, None) => self.burst_as::<SRTCM, FLAT>(ticks, keys, lens, |_| None, out),
            (MeterKind::TrTcm, None) => self.burst_as::<TRTCM, FLAT>(ticks, keys, lens, |_| None, out),
            (MeterKind::Rfc4115, None) => self.burst_as::<RFC4115, FLAT>(ticks, keys, lens, |_| None, out),
            (MeterKind::SrTcm, Some(c)) => {
                self.burst_as::<SRTCM, FLAT>(ticks, keys, lens, |i| Some(c[i]), out)
            }
            (MeterKind::TrTcm, Some(c)) => {
                self.burst_as::<TRTCM, FLAT>(ticks, keys, lens, |i| Some(c[i]), out)
            }
            (MeterKind::Rfc4115, Some(c)) => {
                self.burst_as::<RFC4115, FLAT>(ticks, keys, lens, |i| Some(c[i]), out);
            }
        }
    }

    /// Hashes and prefetches up to [`BURST`] homes, then decides them, packet `i` at the
    /// byte-ticks `ticks(i)`, arriving coloured `input(i)`.
    #[inline(always)]
    fn burst_as<const KIND: u8, const FLAT: bool>(
        &mut self,
        ticks: impl Fn(usize) -> [u64; 2],
        keys: &[K],
        lens: &[u32],
        input: impl Fn(usize) -> Option<Color>,
        out: &mut [Color],
    ) {
        let mut homes = [0usize; BURST];
        let mask = self.mask;
        // Whether every slot lies in one cache line (a fetch of its first byte brings it whole).
        let size = size_of::<Slot<K>>();
        let one_line = 64 % size == 0 && self.slots.as_ptr() as usize % size == 0;
        let chunks = keys.chunks(BURST).zip(lens.chunks(BURST)).zip(out.chunks_mut(BURST));
        for (c, ((keys, lens), out)) in chunks.enumerate() {
            // `..=mask` is every slot: an index masked by `mask` needs no bounds check in it.
            let slots = &self.slots[..=mask];
            for (home, key) in homes.iter_mut().zip(keys) {
                *home = self.home(key);
                // The slot's first byte, and its last when slots may straddle two lines.
                let p: *const u8 = core::ptr::from_ref(&slots[*home & mask]).cast();
                prefetch_line(p);
                if !one_line {
                    prefetch_line(p.wrapping_add(size_of::<Slot<K>>() - 1));
                }
            }
            for (j, (((&home, key), len), out)) in homes.iter().zip(keys).zip(lens).zip(out).enumerate() {
                let i = c * BURST + j;
                *out = if FLAT {
                    let slots = &mut self.slots[..=mask];
                    match find(slots, mask, home, key) {
                        Some(s) => {
                            // `& mask`: no bounds check.
                            let state = &mut slots[s & mask].state;
                            let (next, color) =
                                self.meter.decide_flat::<KIND>(state.words(), ticks(i), *len, input(i));
                            *state = MeterState::from_words(next);
                            color
                        }
                        None => self.insert(home, key, ticks(i), u64::from(*len), input(i)),
                    }
                } else {
                    self.decide_as::<KIND>(home, key, ticks(i), u64::from(*len), input(i))
                };
            }
        }
    }

    /// Removes every flow whose buckets are full at `elapsed` (its state is a fresh flow's):
    /// how many. Not needed for correctness (a new flow takes such a slot anyway); it makes
    /// [`len`](FlowMeters::len) count the flows still metering.
    pub fn sweep(&mut self, elapsed: Nanos) -> usize {
        let ticks = self.ticks_at(elapsed);
        let mut removed = 0;
        for slot in self.slots.iter_mut() {
            if !slot.is_empty() && self.meter.is_full(&slot.state, ticks) {
                slot.vacate();
                removed += 1;
            }
        }
        self.flows -= removed;
        removed
    }

    #[inline]
    fn home(&self, key: &K) -> usize {
        // The low bits of a 64-bit hash: the table has at most 2^32 slots.
        #[expect(clippy::cast_possible_truncation, reason = "masked to the table's size")]
        let h = self.hasher.hash_one(key) as usize;
        h & self.mask
    }

    /// The decision for `key` from its home: its slot's state, or a slot taken for it (empty,
    /// or a flow full again), or red when there is none.
    #[inline]
    fn decide(&mut self, home: usize, key: &K, ticks: [u64; 2], bytes: u64, input: Option<Color>) -> Color {
        match self.meter.kind() {
            MeterKind::SrTcm => self.decide_as::<SRTCM>(home, key, ticks, bytes, input),
            MeterKind::TrTcm => self.decide_as::<TRTCM>(home, key, ticks, bytes, input),
            MeterKind::Rfc4115 => self.decide_as::<RFC4115>(home, key, ticks, bytes, input),
        }
    }

    /// [`decide`](FlowMeters::decide) for a meter of kind `KIND`: the key found in its window
    /// (its home first), else a new flow's slot taken out of line.
    #[inline(always)]
    fn decide_as<const KIND: u8>(
        &mut self,
        home: usize,
        key: &K,
        ticks: [u64; 2],
        bytes: u64,
        input: Option<Color>,
    ) -> Color {
        match find(&self.slots, self.mask, home, key) {
            Some(i) => self.slots[i].state.check_as::<KIND>(&self.meter, ticks, bytes, input),
            None => self.insert(home, key, ticks, bytes, input),
        }
    }

    /// A flow not in its window: the first empty slot of the window, else the first whose
    /// flow is full again, becomes its; red (counted) when there is none.
    #[cold]
    #[inline(never)]
    fn insert(&mut self, home: usize, key: &K, ticks: [u64; 2], bytes: u64, input: Option<Color>) -> Color {
        let window = (0..WINDOW).map(|j| (home + j) & self.mask);
        let free = window
            .clone()
            .find(|&i| self.slots[i].is_empty())
            .or_else(|| window.clone().find(|&i| self.meter.is_full(&self.slots[i].state, ticks)));
        let Some(i) = free else {
            self.table_full += 1;
            return Color::Red;
        };
        let key = key.clone();
        let slot = &mut self.slots[i];
        if slot.is_empty() {
            self.flows += 1;
        }
        slot.fill(key);
        slot.state.check_at(&self.meter, ticks, bytes, input)
    }
}

/// The packets a burst of `keys` keys handles: as many as every slice given has.
#[inline]
pub(super) fn burst_len(keys: usize, lens: &[u32], inputs: Option<&[Color]>, out: &[Color]) -> usize {
    let n = keys.min(lens.len()).min(out.len());
    inputs.map_or(n, |inputs| n.min(inputs.len()))
}

/// The slot of `key`'s flow, if it is in the window from `home`, among `slots` of which
/// `mask` indexes `mask + 1`. Slots sliced to `..=mask` are read without bounds checks (the
/// bursts of a table in cache); the whole table's are checked, which a table in memory runs
/// faster with, as measured (25 against 34 cycles a packet at 65,536 flows, AMD EPYC).
#[inline(always)]
fn find<K: Eq>(slots: &[Slot<K>], mask: usize, home: usize, key: &K) -> Option<usize> {
    (0..WINDOW).map(|j| (home + j) & mask).find(|&i| slots[i].key() == Some(key))
}

/// The most slots a flow table may have: 2^32 (2^26 where `usize` has 32 bits, so that its
/// bytes stay countable there).
#[cfg(target_pointer_width = "64")]
pub(super) const MAX_SLOTS: usize = 1 << 32;
#[cfg(not(target_pointer_width = "64"))]
pub(super) const MAX_SLOTS: usize = 1 << 26;

/// The slots of a flow table asked to hold `capacity` flows (a power of two, at least one
/// window, at most `max`), each made by `slot`, on huge pages where the table is large (see
/// `pages.rs`); or the error that says why not (`what`: the table, for an allocation that
/// fails).
pub(super) fn slot_array<T>(
    capacity: usize,
    max: usize,
    what: &'static str,
    slot: impl FnMut() -> T,
) -> Result<Pages<T>, ConfigError> {
    if capacity == 0 {
        return Err(ConfigError::ZeroCapacity);
    }
    let n = capacity.max(WINDOW).checked_next_power_of_two().filter(|&n| n <= max);
    let Some(n) = n else {
        return Err(ConfigError::CapacityTooLarge { capacity: capacity as u64, max: max as u64 });
    };
    Pages::new(n, what, slot)
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_flow_is_its_own_meter_and_a_full_window_fails_closed() {
        let meter = Meter::srtcm(1_000, 1_000, 1_000).unwrap();
        let mut flows = FlowMeters::<u64>::with_seeds(meter, 8, [1, 2, 3, 4]).unwrap();
        assert_eq!(flows.capacity(), 8);
        let t0 = Nanos::ZERO;
        // Eight flows fill the table; each meters alone.
        for k in 0..8u64 {
            assert_eq!(flows.check(&k, t0, 1_000), Color::Green, "flow {k}");
            assert_eq!(flows.check(&k, t0, 600), Color::Yellow, "flow {k}");
        }
        assert_eq!(flows.len(), 8);
        // A ninth finds no room while the others meter: red, counted.
        assert_eq!(flows.check(&99, t0, 1), Color::Red);
        assert_eq!(flows.table_full(), 1);
        // Once their buckets are full again (C in 1 s, then E's 600 in 0.6 s), it takes a slot.
        let later = Nanos::new(1_600_000_000);
        assert_eq!(flows.check(&99, later, 1_000), Color::Green);
        assert_eq!(flows.check(&0, later, 1_000), Color::Green);
        assert_eq!(flows.sweep(later), 6);
        assert_eq!(flows.len(), 2);
    }

    #[test]
    fn a_burst_decides_as_packets_one_by_one() {
        let meter = Meter::rfc4115(10_000, 3_000, 5_000, 4_000).unwrap();
        let mut burst = FlowMeters::<u32>::with_seeds(meter, 1 << 10, [5; 4]).unwrap();
        let mut single = FlowMeters::<u32>::with_seeds(meter, 1 << 10, [5; 4]).unwrap();
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200u64 {
            let at = Nanos::new(step * 7_000_000);
            let keys: Vec<u32> = (0..45).map(|_| (next() % 50) as u32).collect();
            let lens: Vec<u32> = (0..45).map(|_| 64 + (next() % 1_500) as u32).collect();
            let inputs: Vec<Color> = (0..45).map(|_| Color::from_u8((next() % 3) as u8).unwrap()).collect();
            let mut out = vec![Color::Red; 45];
            let aware = step % 2 == 0;
            let n = burst.check_burst(at, &keys, &lens, aware.then_some(&inputs[..]), &mut out);
            assert_eq!(n, 45);
            for i in 0..45 {
                let want = if aware {
                    single.check_aware(&keys[i], at, u64::from(lens[i]), inputs[i])
                } else {
                    single.check(&keys[i], at, u64::from(lens[i]))
                };
                assert_eq!(out[i], want, "step {step}, packet {i}");
            }
        }
        // Per-packet times: as one by one at each packet's time.
        let times: Vec<Nanos> = (0..45u64).map(|i| Nanos::new(2_000_000_000 + i * 1_000_000)).collect();
        let keys: Vec<u32> = (0..45).map(|i| i % 3).collect();
        let lens = vec![700u32; 45];
        let mut out = vec![Color::Red; 45];
        assert_eq!(burst.check_burst_at(&times, &keys, &lens, None, &mut out), 45);
        for i in 0..45 {
            assert_eq!(out[i], single.check(&keys[i], times[i], 700), "packet {i} at its own time");
        }
        // The shortest slice bounds a burst.
        assert_eq!(burst.check_burst(Nanos::ZERO, &[1, 2, 3], &[64, 64], None, &mut [Color::Red; 3]), 2);
    }

    #[test]
    fn a_swept_flow_coming_back_earlier_is_no_fresher() {
        let meter = Meter::trtcm(1_000, 1_000, 2_000, 2_000).unwrap();
        let mut flows = FlowMeters::<u8>::with_seeds(meter, 8, [1; 4]).unwrap();
        assert_eq!(flows.check(&1, Nanos::ZERO, 1_000), Color::Green);
        assert_eq!(flows.sweep(Nanos::new(1_000_000_000)), 1);
        // At 0.5 s it would have C 500: read at 1 s (the table's latest), C is full again.
        assert_eq!(flows.check(&1, Nanos::new(500_000_000), 1_000), Color::Green);
        assert_eq!(flows.check(&1, Nanos::new(500_000_000), 1), Color::Yellow);
        let mut out = [Color::Red; 2];
        let times = [Nanos::new(3_000_000_000), Nanos::new(2_000_000_000)];
        flows.check_burst_at(&times, &[1, 1], &[1_000, 1_000], None, &mut out);
        // The second packet, stamped earlier, is read at the first's time: C empty then.
        assert_eq!(out, [Color::Green, Color::Yellow]);
    }

    /// Keys are owned by their slots: each dropped once, when swept, replaced or with the
    /// table (the slots hold no `Option`, so this is the table's own bookkeeping).
    #[test]
    fn keys_are_dropped_once() {
        use std::rc::Rc;
        let meter = Meter::srtcm(1_000, 1_000, 0).unwrap();
        let keys: Vec<Rc<u32>> = (0..40).map(Rc::new).collect();
        let mut flows = FlowMeters::<Rc<u32>>::with_seeds(meter, 64, [7; 4]).unwrap();
        for k in &keys {
            assert_eq!(flows.check(k, Nanos::ZERO, 1_000), Color::Green);
        }
        assert_eq!(flows.len(), 40);
        assert!(keys.iter().all(|k| Rc::strong_count(k) == 2), "one clone a slot");
        // Full again at 1 s: swept, every key dropped.
        assert_eq!(flows.sweep(Nanos::new(1_000_000_000)), 40);
        assert!(keys.iter().all(|k| Rc::strong_count(k) == 1));
        // Reused: a full flow's slot taken by a new one drops the old key.
        for k in &keys[..20] {
            flows.check(k, Nanos::new(1_000_000_000), 1_000);
        }
        let later = Nanos::new(3_000_000_000);
        let others: Vec<Rc<u32>> = (100..140).map(Rc::new).collect();
        for k in &others {
            flows.check(k, later, 1);
        }
        let held = keys[..20].iter().map(|k| Rc::strong_count(k) - 1).sum::<usize>()
            + others.iter().map(|k| Rc::strong_count(k) - 1).sum::<usize>();
        assert_eq!(held, flows.len(), "every slot holds one key, no key held twice");
        drop(flows);
        assert!(keys.iter().chain(&others).all(|k| Rc::strong_count(k) == 1));
    }

    #[test]
    fn capacities_are_checked() {
        let meter = Meter::srtcm(1, 1, 0).unwrap();
        assert_eq!(FlowMeters::<u8>::new(meter, 0).unwrap_err(), ConfigError::ZeroCapacity);
        assert_eq!(FlowMeters::<u8>::new(meter, 3).unwrap().capacity(), 8);
        assert!(matches!(
            FlowMeters::<u8>::new(meter, usize::MAX),
            Err(ConfigError::CapacityTooLarge { .. })
        ));
    }
}
