//! The sliding log's keyed table ([`KeyedSlidingLog`](crate::KeyedSlidingLog)): a sliding log
//! per key, in a table whose memory is fixed at construction.
//!
//! Layout: power-of-two shards, each a `Mutex` over an open-addressing array of slots (the key's
//! identity words and the position of its log's oldest entry) and a side arena with `N` expiries
//! per slot. A key is looked up in the 32 slots from its home; a slot whose log has wholly
//! expired is the same as an empty one and is taken over by the next new key that probes it.

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crossbeam_utils::CachePadded;

use super::{SlidingLog, MAX_ELAPSED};
use crate::engine::admit::Receipt;
use crate::keyed::pages::Pages;
use crate::keyed::{Key, KeyHasher, KeyedBuilder, KeyedStats, Words};
use crate::{Clock, ConfigError, Counters, Decision, Nanos, Outcome, UpdateError, WhenFull};

/// Slots probed from a key's home.
const PROBE: usize = 32;
/// The most log entries a table may hold (capacity × limit): 2^34, 128 GiB.
const MAX_ENTRIES: u64 = 1 << 34;

/// Builds the sliding log's table. Every slot and every log entry is allocated and written here:
/// the table's memory is all resident from the start and never grows.
pub(crate) fn build<K: Key + ?Sized, C: Clock>(
    b: KeyedBuilder<SlidingLog, K>,
    clock: C,
) -> Result<LogTable<K, C>, ConfigError> {
    crate::keyed::deny_or_allow(b.when_full, "sliding log")?;
    // Slots are `capacity·8/7` rounded up to a power of two (at least 32); their logs must
    // total at most 2^34 entries.
    let most_slots = 1u64 << (63 - (MAX_ENTRIES / b.config.limit).leading_zeros());
    let max_capacity = most_slots / 8 * 7;
    if b.capacity == 0 {
        return Err(ConfigError::ZeroCapacity);
    }
    if b.capacity as u64 > max_capacity {
        return Err(ConfigError::CapacityTooLarge { capacity: b.capacity as u64, max: max_capacity });
    }
    let shards = crate::keyed::shard_count(b.shards)?;
    let slots = (b.capacity + b.capacity.div_ceil(7)).next_power_of_two().max(PROBE);
    let shards = shards.min(slots / PROBE);
    let per_shard = slots / shards;
    let entries = b.config.entries();
    let (place, fingerprint) = crate::keyed::hashers(b.seeds);
    let shards: Box<[Locked<K::Words>]> = (0..shards)
        .map(|_| {
            let slot = Slot { key: K::Words::default(), newest: 0, head: 0, admitted: 0 };
            Ok(CachePadded::new(Mutex::new(Shard {
                slots: Pages::new(per_shard, "the log table's slots", || slot)?,
                rings: Pages::new(per_shard * entries, "the log table's logs", || 0)?,
                live: 0,
                inserts: 0,
                reclaimed: 0,
                refused: 0,
                config: b.config,
            })))
        })
        .collect::<Result<_, ConfigError>>()?;
    let bases = shards
        .iter()
        .map(|m| {
            let s = m.lock().unwrap_or_else(PoisonError::into_inner);
            (s.slots.as_ptr() as usize, s.rings.as_ptr() as usize)
        })
        .collect();
    let origin = clock.now();
    Ok(LogTable {
        shards,
        bases,
        per_shard,
        log: b.config,
        when_full: b.when_full,
        place,
        fingerprint,
        origin,
        clock,
        id: crate::sync::next_id(),
        writer: Mutex::new(()),
        _key: PhantomData,
    })
}

/// A shard behind its lock, on a cache line of its own.
type Locked<W> = CachePadded<Mutex<Shard<W>>>;

/// One slot: what a probe reads, together (its log lives in the shard's arena).
#[derive(Clone, Copy)]
struct Slot<W> {
    key: W,
    /// The expiry of the log's newest entry: 0 for a slot never used; at or before now for a
    /// log that has wholly expired (the slot is free).
    newest: u64,
    /// The position of the log's oldest entry.
    head: u32,
    /// Units admitted on this slot, wrapping: a refund gives units back only if none were
    /// admitted since its charge (in the padding after `head`: no memory of its own).
    admitted: u32,
}

/// One shard: its slots and their logs (`N` entries per slot, in slot order).
struct Shard<W> {
    slots: Pages<Slot<W>>,
    rings: Pages<u64>,
    /// Slots that have held a key (some may have expired and not yet been taken over).
    live: u64,
    /// Keys placed in a slot.
    inserts: u64,
    /// Keys placed in a slot whose log had wholly expired (the table's evictions).
    reclaimed: u64,
    /// New keys refused or admitted untracked because every probed slot held a live log.
    refused: u64,
    /// The configuration decisions on this shard use (the table's, until changed at runtime;
    /// each shard's is changed under its lock).
    config: SlidingLog,
}

#[doc(hidden)]
pub struct LogTable<K: Key + ?Sized, C: Clock> {
    shards: Box<[Locked<K::Words>]>,
    /// Where each shard's slots and logs start (the boxes never move), to prefetch a key's home
    /// before taking the lock. Addresses only: nothing is read through them.
    bases: Box<[(usize, usize)]>,
    per_shard: usize,
    log: SlidingLog,
    when_full: WhenFull,
    place: ahash::RandomState,
    pub(crate) fingerprint: KeyHasher,
    origin: Nanos,
    clock: C,
    /// The identity its receipts carry.
    id: u64,
    /// Serializes configuration changes.
    writer: Mutex<()>,
    _key: PhantomData<fn(&K)>,
}

impl<K: Key + ?Sized, C: Clock> LogTable<K, C> {
    fn lock(&self, i: usize) -> MutexGuard<'_, Shard<K::Words>> {
        // Nothing panics while a shard is locked; a poisoned shard is still consistent.
        self.shards[i].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard and home slot of a key's hash. Shards and slots per shard are powers of two
    /// below 2^32: the truncations keep the bits the masks keep.
    #[inline]
    fn place(&self, hash: u64) -> (usize, usize) {
        #[expect(clippy::cast_possible_truncation, reason = "masked below 2^32")]
        let (shard, low) = ((hash >> 32) as usize & (self.shards.len() - 1), hash as usize);
        (shard, low & (self.per_shard - 1))
    }

    /// `n` units for the key now: the clock is read under the shard's lock.
    pub(crate) fn check_n_words(
        &self,
        words: K::Words,
        n: u64,
        counters: &Option<Arc<Counters>>,
    ) -> Decision {
        crate::keyed::tally(self.decide(words, || self.clock.now(), n, true).0, counters)
    }

    /// `n` units for the key at `now`.
    ///
    /// Times must not run behind ones already given to the table: a key whose log had wholly
    /// expired as of a later time may have lost its slot to another key, and is then judged
    /// at the earlier time with an empty log. (`check` and `check_n` read the clock under the
    /// shard's lock, so they never do this.)
    pub(crate) fn check_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        self.decide(words, || now, n, true).0
    }

    /// What `n` units would get at `now`, taking nothing and inserting nothing.
    pub(crate) fn peek_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        self.decide(words, || now, n, false).0
    }

    /// `n` units now, with the receipt of what was stored.
    pub(crate) fn charge_words(&self, words: K::Words, n: u64) -> (Decision, Option<Receipt>) {
        let (d, taken) = self.decide(words, || self.clock.now(), n, true);
        let hash = words.hash_with(&self.place);
        (d, taken.map(|t| Receipt::new(self.id, hash, t, n)))
    }

    /// Gives back a charge exactly when nothing was admitted on the key's log since it and its
    /// units still count (see `SlidingLog::refund`); otherwise nothing, which errs toward
    /// refusal.
    pub(crate) fn refund_words(&self, words: K::Words, r: Receipt) {
        let hash = words.hash_with(&self.place);
        let Some(([at, expiry, admitted], n)) = r.take(self.id, hash) else { return };
        let (shard_index, home) = self.place(hash);
        let entries = self.log.entries();
        let mask = self.per_shard - 1;
        let mut shard = self.lock(shard_index);
        let e = self.clock.now().saturating_sub(self.origin).as_u64();
        let Shard { slots, rings, .. } = &mut *shard;
        for i in 0..PROBE.min(self.per_shard) {
            let s = (home + i) & mask;
            let slot = &mut slots[s];
            if slot.newest == 0 || slot.key != words {
                continue;
            }
            // Units that no longer count (or a slot taken over since) are not given back.
            if expiry <= e || u64::from(slot.admitted) != admitted {
                return;
            }
            let ring = &mut rings[s * entries..(s + 1) * entries];
            let head = slot.head as usize;
            if SlidingLog::refund(ring, head, at, expiry, n) {
                #[expect(clippy::cast_possible_truncation, reason = "n ≤ the limit ≤ 2^16")]
                let units = n as u32;
                slot.admitted = slot.admitted.wrapping_sub(units);
                // The newest entry may have left; 1 (never 0, a slot never used) if it was the
                // only one and was charged at the origin.
                slot.newest = ring[(head + entries - 1) % entries].max(1);
            }
            return;
        }
    }

    /// A batch with one clock read, in order.
    pub(crate) fn check_batch_at<Q: Borrow<K>>(
        &self,
        now: Nanos,
        items: &[(Q, u64)],
        out: &mut [Decision],
    ) -> usize {
        let count = items.len().min(out.len());
        for ((key, n), d) in items.iter().zip(out.iter_mut()) {
            *d = self.check_n_at_words(key.borrow().words(&self.fingerprint), now, *n);
        }
        count
    }

    /// Starts fetching the key's home slot and its log ([`Keyed::prefetch`](crate::Keyed::prefetch)).
    #[inline(always)]
    pub(crate) fn prefetch_words(&self, words: K::Words) {
        self.prefetch_home(words);
    }

    /// Hashes the key, starts fetching its home slot and that slot's log, and returns its shard
    /// and home slot.
    #[inline(always)]
    fn prefetch_home(&self, words: K::Words) -> (usize, usize) {
        let (shard_index, home) = self.place(words.hash_with(&self.place));
        let (slots_at, rings_at) = self.bases[shard_index];
        crate::keyed::prefetch_line((slots_at + home * core::mem::size_of::<Slot<K::Words>>()) as *const u8);
        crate::keyed::prefetch_line((rings_at + home * self.log.entries() * 8) as *const u8);
        (shard_index, home)
    }

    /// Decides `n` units for the key `words` at the time `now` gives (read under the shard's
    /// lock), storing them when `take`; when units were stored, also what a refund needs: the
    /// instant, the expiry written and the slot's count of units admitted after them.
    #[inline(always)]
    fn decide(
        &self,
        words: K::Words,
        now: impl FnOnce() -> Nanos,
        n: u64,
        take: bool,
    ) -> (Decision, Option<[u64; 3]>) {
        // Start both cache misses (the home slot and its log) before the lock.
        let (shard_index, home) = self.prefetch_home(words);
        let entries = self.log.entries();
        let mask = self.per_shard - 1;
        let mut shard = self.lock(shard_index);
        // The clock is read under the lock, so that decisions on a shard see times in the order
        // they take effect: a key whose log expired as of one decision is never judged at an
        // earlier time by the next (see `check_n_at`).
        let e = now().saturating_sub(self.origin).as_u64();
        let Shard { slots, rings, live, inserts, reclaimed, refused, config } = &mut *shard;
        let config = *config;
        let mut free = None;
        let mut found = None;
        for i in 0..PROBE.min(self.per_shard) {
            let s = (home + i) & mask;
            let slot = &slots[s];
            if slot.newest != 0 && slot.key == words {
                found = Some(s);
                break;
            }
            if free.is_none() && slot.newest <= e {
                free = Some(s);
            }
        }
        let index = match (found, free) {
            (Some(s), _) => s,
            (None, _) if n == 0 || n > config.limit || !take => {
                // An unknown key has an empty log; peeks, zero costs and costs that can never
                // fit insert nothing. (A new key's first `n ≤ N` always fits, so every slot
                // taken stores an entry.)
                return (fresh_answer(&config, n), None);
            }
            (None, Some(s)) => {
                if slots[s].newest == 0 {
                    *live += 1;
                } else {
                    *reclaimed += 1;
                }
                *inserts += 1;
                // The log there has wholly expired: it answers as an empty one.
                slots[s].key = words;
                s
            }
            (None, None) => {
                *refused += 1;
                let outcome = match self.when_full {
                    WhenFull::Allow => Outcome::Untracked,
                    _ => Outcome::TableFull,
                };
                return (Decision::from_nanos(outcome, 0, Nanos::ZERO, Nanos::ZERO), None);
            }
        };
        let slot = &mut slots[index];
        let ring = &mut rings[index * entries..(index + 1) * entries];
        let mut head = slot.head as usize;
        let (decision, stored) = config.decide(ring, &mut head, e, n, take);
        #[expect(clippy::cast_possible_truncation, reason = "a position in a log of at most 2^16")]
        let head = head as u32;
        slot.head = head;
        let Some(expiry) = stored else { return (decision, None) };
        slot.newest = expiry;
        #[expect(clippy::cast_possible_truncation, reason = "n ≤ the limit ≤ 2^16")]
        let units = n as u32;
        slot.admitted = slot.admitted.wrapping_add(units);
        (decision, Some([e.min(MAX_ELAPSED), expiry, u64::from(slot.admitted)]))
    }

    /// Frees every slot whose log has wholly expired (no decision changes: such a log answers
    /// as an empty one) and returns how many.
    pub(crate) fn sweep(&self) -> usize {
        let mut freed = 0;
        for i in 0..self.shards.len() {
            let mut shard = self.lock(i);
            let e = self.clock.now().saturating_sub(self.origin).as_u64();
            let Shard { slots, live, .. } = &mut *shard;
            for slot in slots.iter_mut().filter(|s| s.newest != 0 && s.newest <= e) {
                slot.newest = 0;
                *live -= 1;
                freed += 1;
            }
        }
        freed
    }

    /// Slots holding a key, some of them possibly expired and not yet taken over.
    pub(crate) fn len(&self) -> u64 {
        (0..self.shards.len()).map(|i| self.lock(i).live).sum()
    }

    /// The number of slots: the most keys tracked at once.
    pub(crate) fn capacity(&self) -> u64 {
        (self.per_shard * self.shards.len()) as u64
    }

    /// Bytes the table owns, all allocated at construction: per slot, the log (`8·N`) and its
    /// slot (key, newest expiry, head and count: 24 bytes for one-word keys, 32 for two), in
    /// whole huge pages where an array is mapped (see `keyed/pages.rs`).
    pub(crate) fn memory_bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|i| {
                let s = self.lock(i);
                s.slots.bytes() + s.rings.bytes() + core::mem::size_of::<Locked<K::Words>>()
            })
            .sum()
    }

    /// Bytes of the slots and logs on huge pages now (see `keyed/pages.rs`): the ranges are
    /// taken under each shard's lock, `/proc/self/smaps` read once after.
    fn huge_page_bytes(&self) -> u64 {
        let ranges: Vec<_> = (0..self.shards.len())
            .flat_map(|i| {
                let s = self.lock(i);
                [s.slots.mapping(), s.rings.mapping()]
            })
            .collect();
        crate::keyed::pages::huge_bytes(ranges)
    }

    /// The table's figures: walks every slot, one shard lock at a time.
    pub(crate) fn stats(&self) -> KeyedStats {
        let mut stats = KeyedStats {
            capacity: self.capacity(),
            slots: self.capacity(),
            memory_bytes: self.memory_bytes() as u64,
            huge_page_bytes: self.huge_page_bytes(),
            probe_histogram: vec![0; PROBE.min(self.per_shard)],
            ..KeyedStats::default()
        };
        let mask = self.per_shard - 1;
        let mut total_probe = 0u64;
        for i in 0..self.shards.len() {
            let shard = self.lock(i);
            stats.inserts += shard.inserts;
            stats.evictions += shard.reclaimed;
            stats.refused += shard.refused;
            for (s, slot) in shard.slots.iter().enumerate().filter(|(_, s)| s.newest != 0) {
                let (_, home) = self.place(slot.key.hash_with(&self.place));
                let distance = (s.wrapping_sub(home) & mask) as u64;
                stats.live += 1;
                total_probe += distance;
                stats.max_probe = stats.max_probe.max(distance);
                if let Some(h) = stats.probe_histogram.get_mut(s.wrapping_sub(home) & mask) {
                    *h += 1;
                }
            }
        }
        #[expect(clippy::cast_precision_loss, reason = "an average")]
        let mean = if stats.live == 0 { 0.0 } else { total_probe as f64 / stats.live as f64 };
        stats.mean_probe = mean;
        stats
    }

    /// Inserts, reclaimed slots (clean evictions) and forced evictions (none).
    pub(crate) fn table_counts(&self) -> [u64; 3] {
        (0..self.shards.len())
            .map(|i| {
                let s = self.lock(i);
                [s.inserts, s.reclaimed, 0]
            })
            .fold([0; 3], |[a, b, c], [x, y, z]| [a + x, b + y, c + z])
    }

    /// How long the table's clock runs: 2^63 − 1 ns (292 years).
    pub(crate) fn lifetime(&self) -> Nanos {
        Nanos::new(MAX_ELAPSED)
    }

    /// The current configuration.
    pub(crate) fn log(&self) -> SlidingLog {
        self.lock(0).config
    }

    /// Replaces the configuration, one shard at a time under its lock: a new window applies to
    /// requests admitted from then on (each entry keeps its expiry), and the limit may be at
    /// most the one the table was built with (each key's log has that many entries; a lower
    /// limit counts the newest of them).
    pub(crate) fn set_config(&self, new: SlidingLog) -> Result<(), UpdateError> {
        if new.limit > self.log.limit {
            return Err(UpdateError::Incompatible {
                reason: "a keyed sliding log's limit cannot grow past the one it was built with: \
                         each key's log has that many entries",
            });
        }
        // Writers one at a time, so that the last change wins on every shard.
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        for i in 0..self.shards.len() {
            self.lock(i).config = new;
        }
        Ok(())
    }

    pub(crate) fn when_full(&self) -> WhenFull {
        self.when_full
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K: Key + ?Sized, C: Clock> fmt::Debug for LogTable<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogTable")
            .field("log", &self.log)
            .field("capacity", &self.capacity())
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}

/// The answer for a key with an empty log under `config`.
fn fresh_answer(config: &SlidingLog, n: u64) -> Decision {
    let (outcome, remaining) = if n > config.limit {
        (Outcome::Insufficient, config.limit)
    } else {
        (Outcome::Allowed, config.limit - n)
    };
    #[expect(clippy::cast_possible_truncation, reason = "at most 2^16")]
    let remaining = remaining as u32;
    let reset = if outcome == Outcome::Allowed && n > 0 { Nanos::new(config.window) } else { Nanos::ZERO };
    Decision::from_nanos(outcome, remaining, Nanos::ZERO, reset)
}
