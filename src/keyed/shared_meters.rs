//! A per-flow meter table every thread may use at once: flows spread over cores without
//! RSS pinning them, each flow a [`SharedMeter`](crate::SharedMeter)'s two words.
//!
//! # Protocol
//!
//! A slot is a flow's 64-bit tag (a keyed hash of its key; 0 is an empty slot) and its two
//! words, zero (both buckets full) from construction. A flow lives in one of the [`WINDOW`]
//! slots from its home.
//!
//! - **Find**: the window's slots in order, until the flow's tag or an empty slot.
//! - **Insert**: a thread that meets an empty slot before the flow's tag claims it with a
//!   compare-and-swap of its tag from 0; if the swap fails, it reads the tag that won and goes
//!   on from that slot (the flow's own tag: found; another's: the next slot).
//! - **Never freed while shared**: a slot's tag changes once, from 0. So the empty slots of a
//!   window are always its last ones, every inserter of a flow meets the same first empty slot,
//!   and a flow is never in two slots. A window full of other flows colours the packet red
//!   and counts it (the table fails closed). [`SharedFlowMeters::clear`] empties the table
//!   when no other thread holds it (`&mut`).
//! - **Decide**: the words are a [`SharedMeter`](crate::SharedMeter)'s (one 16-byte
//!   compare-and-swap). A claimed slot's words need no initialising, so no thread waits for
//!   another.
//!
//! Keys are told apart by their 64-bit tags: two flows whose tags collide (about 2^-64 for a
//! pair) share a meter. Every access is `Relaxed`: a tag publishes nothing but itself, and
//! the words are self-contained (`loom-tests/tests/meter.rs` models inserts and decisions).

use core::fmt;
use core::hash::Hash;

use super::prefetch_line;
use crate::policies::meter::MeterState;
use crate::sync::{AtomicPair, AtomicU64, Ordering::Relaxed};
use crate::{Color, ConfigError, Meter, Nanos};

/// Slots a flow may occupy from its home.
const WINDOW: usize = 8;

/// Packets a burst handles at once.
const BURST: usize = 32;

/// One flow: its two words and its tag, in 32 bytes that never straddle a cache line.
#[repr(C, align(32))]
struct Slot {
    words: AtomicPair,
    tag: AtomicU64,
}

/// Flows metered under one [`Meter`] profile by any number of threads at once, in memory
/// fixed at construction.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{Color, Meter, Nanos, SharedFlowMeters};
///
/// let meter: Meter = "srtcm cir=1Mbit/s cbs=3000 ebs=0".parse()?;
/// let flows = Arc::new(SharedFlowMeters::<u32>::new(meter, 1 << 16)?);
/// let cores: Vec<_> = (0..2)
///     .map(|_| {
///         let flows = Arc::clone(&flows);
///         std::thread::spawn(move || (0..4).filter(|_| flows.check(&7, Nanos::ZERO, 1_000) == Color::Green).count())
///     })
///     .collect();
/// assert_eq!(cores.into_iter().map(|c| c.join().unwrap()).sum::<usize>(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedFlowMeters<K: ?Sized> {
    meter: Meter,
    slots: super::pages::Pages<Slot>,
    mask: usize,
    hasher: ahash::RandomState,
    table_full: AtomicU64,
    _key: core::marker::PhantomData<fn(&K)>,
}

impl<K: ?Sized> fmt::Debug for SharedFlowMeters<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedFlowMeters")
            .field("meter", &self.meter)
            .field("capacity", &self.slots.len())
            .field("table_full", &self.table_full.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K: Hash + ?Sized> SharedFlowMeters<K> {
    /// The most slots a table may have: 2^32 (2^26 where `usize` has 32 bits).
    pub const MAX_CAPACITY: usize = super::flows::MAX_SLOTS;

    /// A table of at least `capacity` flows (rounded up to a power of two, at least 8) under
    /// `meter`, hashed with random seeds. Size it for every flow a run will see: slots are
    /// not reused while the table is shared.
    pub fn new(meter: Meter, capacity: usize) -> Result<SharedFlowMeters<K>, ConfigError> {
        SharedFlowMeters::build(meter, capacity, ahash::RandomState::new())
    }

    /// As [`new`](SharedFlowMeters::new), hashed with `seeds`.
    pub fn with_seeds(
        meter: Meter,
        capacity: usize,
        seeds: [u64; 4],
    ) -> Result<SharedFlowMeters<K>, ConfigError> {
        let [a, b, c, d] = seeds;
        SharedFlowMeters::build(meter, capacity, ahash::RandomState::with_seeds(a, b, c, d))
    }

    fn build(
        meter: Meter,
        capacity: usize,
        hasher: ahash::RandomState,
    ) -> Result<SharedFlowMeters<K>, ConfigError> {
        let slots =
            super::flows::slot_array(capacity, Self::MAX_CAPACITY, "a shared flow meter table", || Slot {
                words: AtomicPair::new([0; 2]),
                tag: AtomicU64::new(0),
            })?;
        let n = slots.len();
        Ok(SharedFlowMeters {
            meter,
            slots,
            mask: n - 1,
            hasher,
            table_full: AtomicU64::new(0),
            _key: core::marker::PhantomData,
        })
    }

    /// The profile every flow is metered under.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Flows held (a count of the table: as of some instant during the call).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.tag.load(Relaxed) != 0).count()
    }

    /// Whether no flow is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Packets coloured red because their new flow found its window full of other flows.
    pub fn table_full(&self) -> u64 {
        self.table_full.load(Relaxed)
    }

    /// Bytes of the table the kernel backs with huge pages now, as
    /// [`FlowMeters::huge_page_bytes`](crate::FlowMeters::huge_page_bytes).
    pub fn huge_page_bytes(&self) -> u64 {
        super::pages::huge_bytes([self.slots.mapping()])
    }

    /// Empties the table (every flow forgotten, both buckets full again).
    pub fn clear(&mut self) {
        for s in self.slots.iter_mut() {
            *s = Slot { words: AtomicPair::new([0; 2]), tag: AtomicU64::new(0) };
        }
    }

    /// Colour-blind: one packet of `bytes` of flow `key` at `elapsed` since the meter's origin.
    pub fn check(&self, key: &K, elapsed: Nanos, bytes: u64) -> Color {
        let tag = self.tag(key);
        self.decide(tag, self.meter.ticks(elapsed), bytes, None)
    }

    /// Colour-aware: as [`check`](SharedFlowMeters::check), for a packet that arrives
    /// coloured `input`.
    pub fn check_aware(&self, key: &K, elapsed: Nanos, bytes: u64, input: Color) -> Color {
        let tag = self.tag(key);
        self.decide(tag, self.meter.ticks(elapsed), bytes, Some(input))
    }

    /// A burst at one instant, as [`FlowMeters::check_burst`](crate::FlowMeters::check_burst)
    /// (keys owned or borrowed): every home fetched before any is decided. Returns how many it
    /// coloured.
    pub fn check_burst<Q: core::borrow::Borrow<K>>(
        &self,
        elapsed: Nanos,
        keys: &[Q],
        lens: &[u32],
        inputs: Option<&[Color]>,
        out: &mut [Color],
    ) -> usize {
        let n = super::flows::burst_len(keys.len(), lens, inputs, out);
        let ticks = self.meter.ticks(elapsed);
        let mut tags = [0u64; BURST];
        for (c, ((keys, lens), out)) in
            keys[..n].chunks(BURST).zip(lens.chunks(BURST)).zip(out.chunks_mut(BURST)).enumerate()
        {
            for (t, key) in tags.iter_mut().zip(keys) {
                *t = self.tag(key.borrow());
                prefetch_line(core::ptr::from_ref(&self.slots[self.home(*t)]).cast());
            }
            for (j, ((t, len), out)) in tags.iter().zip(lens).zip(out).enumerate() {
                let input = inputs.map(|c2| c2[c * BURST + j]);
                *out = self.decide(*t, ticks, u64::from(*len), input);
            }
        }
        n
    }

    /// A key's tag: its keyed 64-bit hash, never 0 (the empty slot's).
    #[inline]
    fn tag(&self, key: &K) -> u64 {
        self.hasher.hash_one(key).max(1)
    }

    #[inline]
    fn home(&self, tag: u64) -> usize {
        // The tag's high bits place it (its low bits are its identity in the slot as well).
        #[expect(clippy::cast_possible_truncation, reason = "masked to the table's size")]
        let h = (tag >> 32 ^ tag) as usize;
        h & self.mask
    }

    /// Finds or claims the flow's slot (see the module's protocol), then decides on its words.
    fn decide(&self, tag: u64, ticks: [u64; 2], bytes: u64, input: Option<Color>) -> Color {
        let home = self.home(tag);
        for j in 0..WINDOW {
            let slot = &self.slots[(home + j) & self.mask];
            // Relaxed (load, success, failure): a tag publishes nothing but itself; a slot's
            // words were made before the table was shared.
            let mut seen = slot.tag.load(Relaxed);
            if seen == 0 {
                seen = match slot.tag.compare_exchange(0, tag, Relaxed, Relaxed) {
                    Ok(_) => tag,
                    Err(winner) => winner,
                };
            }
            if seen == tag {
                return commit(&self.meter, &slot.words, ticks, bytes, input);
            }
        }
        self.table_full.fetch_add(1, Relaxed);
        Color::Red
    }
}

/// One decision on a shared pair of words: `SharedMeter`'s compare-and-swap loop.
#[inline]
pub(crate) fn commit(
    meter: &Meter,
    words: &AtomicPair,
    ticks: [u64; 2],
    bytes: u64,
    input: Option<Color>,
) -> Color {
    // Relaxed (load, success, failure): the words are the whole state and publish nothing;
    // a failed swap hands back the words the next decision is made on; they only grow, so no
    // swap succeeds on words that were replaced and came back. Checked by
    // `loom-tests/tests/meter.rs`.
    let mut current = words.load(Relaxed);
    loop {
        let mut state = MeterState::from_words(current);
        let color = state.check_at(meter, ticks, bytes, input);
        let next = state.words();
        if next == current {
            return color;
        }
        match words.compare_exchange(current, next, Relaxed, Relaxed) {
            Ok(_) => return color,
            Err(seen) => current = seen,
        }
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_flow_meters_alone_and_a_full_window_fails_closed() {
        let meter = Meter::srtcm(1_000, 1_000, 0).unwrap();
        let flows = SharedFlowMeters::<u64>::with_seeds(meter, 8, [1, 2, 3, 4]).unwrap();
        for k in 0..8u64 {
            assert_eq!(flows.check(&k, Nanos::ZERO, 1_000), Color::Green, "flow {k}");
            assert_eq!(flows.check(&k, Nanos::ZERO, 1), Color::Red, "flow {k}");
        }
        assert_eq!(flows.len(), 8);
        assert_eq!(flows.check(&99, Nanos::ZERO, 1), Color::Red);
        assert_eq!(flows.table_full(), 1);
        let mut flows = flows;
        flows.clear();
        assert!(flows.is_empty());
        assert_eq!(flows.check(&99, Nanos::ZERO, 1_000), Color::Green);
    }

    #[test]
    fn a_burst_decides_as_packets_one_by_one() {
        let meter = Meter::trtcm(10_000, 3_000, 20_000, 6_000).unwrap();
        let burst = SharedFlowMeters::<u32>::with_seeds(meter, 1 << 10, [5; 4]).unwrap();
        let single = SharedFlowMeters::<u32>::with_seeds(meter, 1 << 10, [5; 4]).unwrap();
        for step in 0..100u32 {
            let at = Nanos::new(u64::from(step) * 5_000_000);
            let keys: Vec<u32> = (0..40).map(|i| (i * 7 + step) % 23).collect();
            let lens: Vec<u32> = (0..40).map(|i| 64 + (i * 131 + step * 17) % 1_400).collect();
            let mut out = vec![Color::Red; 40];
            assert_eq!(burst.check_burst(at, &keys, &lens, None, &mut out), 40);
            for i in 0..40 {
                assert_eq!(out[i], single.check(&keys[i], at, u64::from(lens[i])), "step {step}, packet {i}");
            }
        }
    }
}
