//! `KeyedSlidingLog`: a sliding log per key, in a table whose memory is fixed at construction.
//!
//! Layout: power-of-two shards, each a `Mutex` over an open-addressing array of slots (the key's
//! identity words and the position of its log's oldest entry) and a side arena with `N` expiries
//! per slot. A key is looked up in the 32 slots from its home; a slot whose log has wholly
//! expired is the same as an empty one and is taken over by the next new key that probes it.

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crossbeam_utils::CachePadded;

use super::SlidingLog;
use crate::keyed::{Key, KeyHasher, Words};
use crate::{Clock, ConfigError, Decision, DefaultClock, Nanos, Outcome, WhenFull};

/// Slots probed from a key's home.
const PROBE: usize = 32;
/// The most log entries a table may hold (capacity × limit): 2^34, 128 GiB.
const MAX_ENTRIES: u64 = 1 << 34;

impl<K: ?Sized> Clone for KeyedSlidingLogBuilder<K> {
    fn clone(&self) -> Self {
        KeyedSlidingLogBuilder { _key: PhantomData, ..*self }
    }
}

impl<K: ?Sized> fmt::Debug for KeyedSlidingLogBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSlidingLogBuilder")
            .field("log", &self.log)
            .field("capacity", &self.capacity)
            .field("shards", &self.shards)
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}

/// How to build a [`KeyedSlidingLog`].
pub struct KeyedSlidingLogBuilder<K: ?Sized> {
    _key: PhantomData<fn(&K)>,
    log: SlidingLog,
    capacity: usize,
    shards: Option<usize>,
    when_full: WhenFull,
    seeds: Option<[u64; 8]>,
}

impl<K: Key + ?Sized> KeyedSlidingLogBuilder<K> {
    /// The most keys tracked at once (default 2^16). The table has the next power of two at or
    /// above `capacity·8/7` slots.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The number of shards, each with its own lock: a power of two up to 64 (default: 4 per
    /// available core).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What a new key gets when its 32 probed slots all hold live logs: [`WhenFull::Deny`]
    /// (the default, [`Outcome::TableFull`]) or [`WhenFull::Allow`] ([`Outcome::Untracked`]).
    /// [`WhenFull::EvictFullest`] is refused: a sliding log cannot be summarized in a ghost.
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// Fixed hash seeds (placement, then fingerprints), for reproducible tests. By default
    /// both are random per table.
    pub fn seeds(mut self, seeds: [u64; 8]) -> Self {
        self.seeds = Some(seeds);
        self
    }

    /// Builds the table on the default clock.
    pub fn build(self) -> Result<KeyedSlidingLog<K, DefaultClock>, ConfigError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// Builds the table on `clock`. Every slot and every log entry is allocated and written
    /// here: the table's memory is all resident from the start and never grows.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<KeyedSlidingLog<K, C>, ConfigError> {
        crate::keyed::deny_or_allow(self.when_full, "sliding log")?;
        // Slots are `capacity·8/7` rounded up to a power of two (at least 32); their logs must
        // total at most 2^34 entries.
        let most_slots = 1u64 << (63 - (MAX_ENTRIES / self.log.limit).leading_zeros());
        let max_capacity = most_slots / 8 * 7;
        if self.capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        if self.capacity as u64 > max_capacity {
            return Err(ConfigError::CapacityTooLarge { capacity: self.capacity as u64, max: max_capacity });
        }
        let shards = crate::keyed::shard_count(self.shards)?;
        let slots = (self.capacity + self.capacity.div_ceil(7)).next_power_of_two().max(PROBE);
        let shards = shards.min(slots / PROBE);
        let per_shard = slots / shards;
        let entries = self.log.entries();
        let (place, fingerprint) = crate::keyed::hashers(self.seeds);
        let shards: Box<[Locked<K::Words>]> = (0..shards)
            .map(|_| {
                CachePadded::new(Mutex::new(Shard {
                    slots: huge(per_shard, Slot { key: K::Words::default(), newest: 0, head: 0 }),
                    rings: huge(per_shard * entries, 0),
                    live: 0,
                }))
            })
            .collect();
        let bases = shards
            .iter()
            .map(|m| {
                let s = m.lock().unwrap_or_else(PoisonError::into_inner);
                (s.slots.as_ptr() as usize, s.rings.as_ptr() as usize)
            })
            .collect();
        let origin = clock.now();
        Ok(KeyedSlidingLog {
            shards,
            bases,
            per_shard,
            log: self.log,
            when_full: self.when_full,
            place,
            fingerprint,
            origin,
            clock,
            _key: PhantomData,
        })
    }
}

/// `len` copies of `value`, in memory for which huge pages were requested before it was first
/// written (Linux; see `keyed::table::advise_huge_pages`): a probe into a large table then
/// costs a cache miss, not also a TLB miss.
fn huge<T: Copy>(len: usize, value: T) -> Box<[T]> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    #[cfg(all(target_os = "linux", not(tollgate_loom)))]
    crate::keyed::table::advise_huge_pages(v.as_mut_ptr().cast(), len * core::mem::size_of::<T>());
    v.resize(len, value);
    v.into_boxed_slice()
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
}

/// One shard: its slots and their logs (`N` entries per slot, in slot order).
struct Shard<W> {
    slots: Box<[Slot<W>]>,
    rings: Box<[u64]>,
    /// Slots that have held a key (some may have expired and not yet been taken over).
    live: u64,
}

/// A sliding log per key: at most `N` in any window `W` for each key, exactly, with memory
/// fixed at construction: `capacity·8/7` rounded up to a power of two slots, each with `8·N`
/// bytes of log and its key.
///
/// A decision locks the key's shard for one probe (up to 32 slots) and one log decision; it
/// never allocates. A key whose log has wholly expired is the same as a key never seen, so its
/// slot is free for the next new key: memory stays bounded under any flood of keys, and a key
/// flooding requests only fills its own log. When every probed slot holds a live log, a new key
/// is refused ([`Outcome::TableFull`], by default) or admitted untracked
/// ([`WhenFull::Allow`]); tracked keys are never displaced.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{KeyedSlidingLog, ManualClock, SlidingLog};
///
/// let log = SlidingLog::new(2, Duration::from_secs(10))?;
/// let l = KeyedSlidingLog::<str>::builder(log).capacity(1000).build_with_clock(ManualClock::new())?;
/// assert!(l.check("alice").is_allowed());
/// assert!(l.check("alice").is_allowed());
/// assert!(!l.check("alice").is_allowed());
/// assert!(l.check("bob").is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct KeyedSlidingLog<K: Key + ?Sized, C: Clock = DefaultClock> {
    shards: Box<[Locked<K::Words>]>,
    /// Where each shard's slots and logs start (the boxes never move), to prefetch a key's home
    /// before taking the lock. Addresses only: nothing is read through them.
    bases: Box<[(usize, usize)]>,
    per_shard: usize,
    log: SlidingLog,
    when_full: WhenFull,
    place: ahash::RandomState,
    fingerprint: KeyHasher,
    origin: Nanos,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

impl<K: Key + ?Sized> KeyedSlidingLog<K, DefaultClock> {
    /// A builder for a table of sliding logs per key of `K`.
    pub fn builder(log: SlidingLog) -> KeyedSlidingLogBuilder<K> {
        KeyedSlidingLogBuilder {
            _key: PhantomData,
            log,
            capacity: 1 << 16,
            shards: None,
            when_full: WhenFull::Deny,
            seeds: None,
        }
    }
}

impl<K: Key + ?Sized, C: Clock> KeyedSlidingLog<K, C> {
    fn lock(&self, i: usize) -> MutexGuard<'_, Shard<K::Words>> {
        // Nothing panics while a shard is locked; a poisoned shard is still consistent.
        self.shards[i].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One unit for `key` now.
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.decide(key, || self.clock.now(), 1, true)
    }

    /// `n` units for `key` now, all or none.
    pub fn check_n<Q>(&self, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.decide(key, || self.clock.now(), n, true)
    }

    /// `n` units for `key` at `now` on this table's clock.
    ///
    /// Times must not run behind ones already given to the table: a key whose log had wholly
    /// expired as of a later time may have lost its slot to another key, and is then judged
    /// at the earlier time with an empty log. (`check` and `check_n` read the clock under the
    /// shard's lock, so they never do this.)
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.decide(key, || now, n, true)
    }

    /// What `n` units for `key` would get at `now`, taking nothing (and inserting nothing).
    pub fn peek_n_at<Q>(&self, key: &Q, now: Nanos, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        self.decide(key, || now, n, false)
    }

    fn decide<Q>(&self, key: &Q, now: impl FnOnce() -> Nanos, n: u64, take: bool) -> Decision
    where
        K: Borrow<Q>,
        Q: Key<Words = K::Words> + ?Sized,
    {
        let words = key.words(&self.fingerprint);
        let hash = words.hash_with(&self.place);
        // Shards and slots per shard are powers of two below 2^32: the truncations keep the
        // bits the masks keep.
        #[expect(clippy::cast_possible_truncation, reason = "masked below 2^32")]
        let (shard_index, low) = ((hash >> 32) as usize & (self.shards.len() - 1), hash as usize);
        let entries = self.log.entries();
        let mask = self.per_shard - 1;
        let home = low & mask;
        // Start both cache misses (the home slot and its log) before the lock.
        let (slots_at, rings_at) = self.bases[shard_index];
        crate::keyed::prefetch_line((slots_at + home * core::mem::size_of::<Slot<K::Words>>()) as *const u8);
        crate::keyed::prefetch_line((rings_at + home * entries * 8) as *const u8);
        let mut shard = self.lock(shard_index);
        // The clock is read under the lock, so that decisions on a shard see times in the order
        // they take effect: a key whose log expired as of one decision is never judged at an
        // earlier time by the next (see `check_n_at`).
        let e = now().saturating_sub(self.origin).as_u64();
        let Shard { slots, rings, live } = &mut *shard;
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
            (None, _) if n == 0 || n > self.log.limit || !take => {
                // An unknown key has an empty log; peeks, zero costs and costs that can never
                // fit insert nothing. (A new key's first `n ≤ N` always fits, so every slot
                // taken stores an entry.)
                return self.fresh_answer(n);
            }
            (None, Some(s)) => {
                if slots[s].newest == 0 {
                    *live += 1;
                }
                // The log there has wholly expired: it answers as an empty one.
                slots[s].key = words;
                s
            }
            (None, None) => {
                let outcome = match self.when_full {
                    WhenFull::Allow => Outcome::Untracked,
                    _ => Outcome::TableFull,
                };
                return Decision::from_nanos(outcome, 0, Nanos::ZERO, Nanos::ZERO);
            }
        };
        let slot = &mut slots[index];
        let ring = &mut rings[index * entries..(index + 1) * entries];
        let mut head = slot.head as usize;
        let (decision, stored) = self.log.decide(ring, &mut head, e, n, take);
        #[expect(clippy::cast_possible_truncation, reason = "a position in a log of at most 2^16")]
        let head = head as u32;
        slot.head = head;
        if let Some(expiry) = stored {
            slot.newest = expiry;
        }
        decision
    }

    /// The answer for a key with an empty log.
    fn fresh_answer(&self, n: u64) -> Decision {
        let (outcome, remaining) = if n > self.log.limit {
            (Outcome::Insufficient, self.log.limit)
        } else {
            (Outcome::Allowed, self.log.limit - n)
        };
        #[expect(clippy::cast_possible_truncation, reason = "at most 2^16")]
        let remaining = remaining as u32;
        let reset =
            if outcome == Outcome::Allowed && n > 0 { Nanos::new(self.log.window) } else { Nanos::ZERO };
        Decision::from_nanos(outcome, remaining, Nanos::ZERO, reset)
    }

    /// Slots holding a key, some of them possibly expired and not yet taken over.
    pub fn len(&self) -> u64 {
        (0..self.shards.len()).map(|i| self.lock(i).live).sum()
    }

    /// Whether no key has been tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of slots: the most keys tracked at once.
    pub fn capacity(&self) -> u64 {
        (self.per_shard * self.shards.len()) as u64
    }

    /// Bytes the table owns, all allocated at construction: per slot, the log (`8·N`) and 24
    /// bytes (32 for two-word keys) of key, newest expiry and head.
    pub fn memory_bytes(&self) -> usize {
        let per_slot =
            self.log.log_bytes() + core::mem::size_of::<K::Words>() + core::mem::size_of::<usize>() + 1;
        self.per_shard * self.shards.len() * per_slot
            + self.shards.len() * core::mem::size_of::<Locked<K::Words>>()
    }

    /// The current time on this table's clock.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The configuration.
    pub fn log(&self) -> &SlidingLog {
        &self.log
    }
}

impl<K: Key + ?Sized, C: Clock> fmt::Debug for KeyedSlidingLog<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSlidingLog")
            .field("log", &self.log)
            .field("capacity", &self.capacity())
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}
