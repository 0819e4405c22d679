//! The keyed table: shards of open-addressing slots, each slot a bucket word beside the key's
//! identity words. Every atomic access to a table lives in this file.
//!
//! # Layout
//!
//! A table is a power-of-two number of shards, each an equal range of one array of slots (so
//! a key's slots are one pointer away), with its own cache-padded counters. Slots come in
//! *groups* of 4 (64 bytes, one cache line, for `u64` keys), with one 64-bit *header* and one
//! *ghost* word per group in arrays beside them. A hash's placement bits (`Table::place`: the
//! bits above a group's size) pick a group of the whole array, the key's *home*: the lowest
//! ones a group of its shard, the next ones the shard. The key lives in one of the 64 slots of
//! its *window*: the home group and the 15 after it (wrapping in the shard). A new key takes
//! the first vacant slot of its window in *claim order*: its home group's slots from the last
//! down, then the window's other slots in order (see [`Shard::probe_group`] for why).
//!
//! ```text
//!  slot word   63 62 61                                                   0
//!             +-----+-----------------------------------------------------+
//!             |  00 | stamp: the key's bucket (see bucket.rs)              |  LIVE
//!             |  01 | stamp of a full bucket being evicted                 |  LOCKED
//!             |  10 | high-water mark: the floor for the next stamp         |  VACANT
//!             |  11 | the first stamp of a claimed, not yet live key        |  CLAIMED
//!             +-----+-----------------------------------------------------+
//!  header      63                             14 13        7 6          0
//!             +---------------------------------+-----------+------------+
//!             | version (+1 per change)         | reach     | last       |
//!             +---------------------------------+-----------+------------+
//! ```
//!
//! # Why it is safe to reuse a slot: stamps only grow
//!
//! Over a slot's whole life, across keys, the value in its word only grows: a decision moves a
//! stamp forward; eviction (allowed only when the bucket is full) leaves `w + 1`; the next key
//! starts at or above that. So a value a thread read is never seen again once the slot moved
//! on, and a CAS that expects it fails: there is no ABA, with no epoch to track. That is this
//! table's reclamation protocol: a thread acting on an evicted key's stale word can never
//! commit, and a thread that read the word checks the key *after* reading it (the word is
//! loaded with `Acquire`, pairing with the `Release` that made it live after the key was
//! written), so it can never take a new key's word for its own.
//!
//! # Membership: the header serializes it, per home group
//!
//! A key is *inserted* by claiming a slot privately (VACANT → CLAIMED, key words written) and
//! *committing* it with a CAS on its home group's header that names the slot (`last`) and bumps
//! the version. Every change to the set of keys of a home — a commit or an eviction — is a
//! header CAS, and each inserter scans the home's slots (up to `reach`) between reading the
//! header and its CAS, so two inserters of one key cannot both commit: the second sees the
//! first, or its CAS fails. A committed slot becomes LIVE right after; until then any thread
//! that reads the header *helps*: it makes `last` LIVE before doing anything else, so a
//! stalled inserter blocks nobody (lock-free), and every committed slot but the latest is
//! LIVE, which is what scans look for.
//!
//! Eviction is LIVE → LOCKED (the CAS fails if anyone decided meanwhile), a version bump of the
//! evicted key's home (so that helping can tell an old commit from a new claim in the same
//! slot, and concurrent inserts of that home re-scan), then LOCKED → VACANT or CLAIMED at
//! `w + 1`. These loops are lock-free: each retry means another thread's CAS succeeded.

use core::fmt;

use crossbeam_utils::CachePadded;

use super::key::Words;
use super::pages::Pages;
use super::tiers::Tiers;
use super::WhenFull;
use crate::engine::decision::Decision;
use crate::policies::bucket::{BucketWord, Verdict};
use crate::policies::token_bucket::At;
use crate::sync::{
    fence, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use crate::{ConfigError, Nanos, Outcome, TokenBucket};

/// Slots per group.
#[cfg(not(tollgate_loom))]
pub(crate) const GROUP: usize = 4;
/// Groups per window.
#[cfg(not(tollgate_loom))]
const WINDOW_GROUPS: usize = 16;
// Small enough for loom to explore every interleaving.
#[cfg(tollgate_loom)]
pub(crate) const GROUP: usize = 2;
#[cfg(tollgate_loom)]
const WINDOW_GROUPS: usize = 2;
/// Slots a key may live in: its window.
pub(crate) const WINDOW: usize = GROUP * WINDOW_GROUPS;

const STATE: u64 = 0b11 << 62;
const LIVE: u64 = 0;
const LOCKED: u64 = 0b01 << 62;
const VACANT: u64 = 0b10 << 62;
const CLAIMED: u64 = 0b11 << 62;
const VALUE: u64 = !STATE;
/// Bucket instants in a table stay at or below this, so that `stamp + 1` is still a value.
pub(crate) const MAX_UNITS: u64 = VALUE - 1;

const POS_MASK: u64 = 0x7f;
const NONE: u64 = POS_MASK;
const REACH_SHIFT: u32 = 7;
const VERSION_ONE: u64 = 1 << 14;

#[inline]
fn h_last(h: u64) -> Option<usize> {
    let last = h & POS_MASK;
    (last != NONE).then_some(last as usize)
}

#[inline]
fn h_reach(h: u64) -> usize {
    ((h >> REACH_SHIFT) & POS_MASK) as usize
}

/// The header after one more change: version + 1, the given `last` and `reach`.
#[inline]
fn h_next(h: u64, last: u64, reach: usize) -> u64 {
    (h & !(VERSION_ONE - 1)).wrapping_add(VERSION_ONE) | ((reach as u64) << REACH_SHIFT) | last
}

/// Ghost words: a 22-bit tag of the evicted key's hash and its stamp in units of 2^20, rounded
/// up. A key whose tag matches starts no fuller than the ghost (see [`Shard::force`]).
const GHOST_SHIFT: u32 = 20;
const GHOST_TAG_SHIFT: u32 = 42;
const GHOST_STAMP: u64 = (1 << GHOST_TAG_SHIFT) - 1;

#[inline]
fn ghost_tag(hash: u64) -> u64 {
    (hash >> GHOST_TAG_SHIFT) | 1 // never 0, so that an empty ghost matches nobody
}

/// Stamps strictly below this, at the bucket instant `now`, are full in every tier.
#[inline]
pub(crate) fn evictable(p: &Params, now: u64) -> u64 {
    now - p.tiers.max_fill()
}

/// A table's parameters, as the decision path needs them.
#[derive(Debug)]
pub(crate) struct Params {
    /// The quotas keys are decided under.
    pub(crate) tiers: Tiers,
    /// What to do when a new key finds no room.
    pub(crate) when_full: WhenFull,
    /// The placement hasher (to find an evicted key's home).
    pub(crate) hasher: ahash::RandomState,
}

/// What the table needs from the rule its keys are decided by: a token bucket under a tier's
/// quota ([`Now`]), or a [`KeyedPolicy`](crate::KeyedPolicy) at one instant
/// ([`super::policy::PolicyNow`]). One value describes one decision's instant.
///
/// The reclamation argument (module docs) asks three things of a rule:
/// - a word a decision stores is strictly greater than the word it replaces (values only grow);
/// - every word below [`evictable`](Rule::evictable) decides, now and at every later
///   instant, exactly as [`fresh`](Rule::fresh) does, so evicting it changes no decision;
/// - `evictable() ≤ fresh()`, so that a slot's high-water mark (an evicted word + 1) is never
///   above a later fresh key's first word under a consistent clock;
///
/// and every word stays at or below [`MAX_UNITS`].
pub(crate) trait Rule {
    /// What an admission carries from its CAS to its decision.
    type Taken;
    /// Whether forced evictions leave ghosts ([`WhenFull::EvictFullest`]); rules without them
    /// never evict a word above `evictable`.
    const GHOSTS: bool;
    /// Whether [`decide`](Rule::decide) refuses every word whose state bits are not `LIVE`
    /// (every word at or above 2^62): then a decision tests a word's state only before it
    /// refuses, not before it decides (`attempt`), since no such word can be taken.
    const REFUSES_NOT_LIVE: bool = false;
    /// Whether a decision's first attempt is written out ahead of its retry loop
    /// (`decide_on`): for a short rule, whose common decision then skips the loop head's
    /// alignment no-op; a long one's copy costs more than that (a keyed nginx rule: 26.5 →
    /// 28.9 ns a decision on one key, peeled).
    const PEEL: bool = false;

    /// A new key's first word.
    fn fresh(&self) -> u64;

    /// Words strictly below this are the same as a fresh key's.
    fn evictable(&self) -> u64;

    /// A new key's first word in a slot whose high-water mark is `hwm`: `first` (from
    /// [`fresh`](Rule::fresh)) or, when the mark is above it, the least word at or above the
    /// mark that is a state the rule can hold. A mark is an evicted word + 1, so it can be above
    /// a fresh word read from an earlier clock (a decision racing a sweep) and need not be a
    /// state itself (a window's count one above its limit).
    #[inline]
    fn start(&self, first: u64, hwm: u64) -> u64 {
        first.max(hwm)
    }

    /// Decides `n` on the live word `w`: the word to store (greater than `w`) and what makes
    /// the decision once stored, or the final decision with nothing to store.
    fn decide(&self, w: u64, n: u64) -> Result<(u64, Self::Taken), Decision>;

    /// [`decide`](Rule::decide) for a new key's first decision, on its `start` word (from
    /// [`start`](Rule::start); `first` is what [`fresh`](Rule::fresh) gave).
    #[inline]
    fn decide_first(&self, first: u64, start: u64, n: u64) -> Result<(u64, Self::Taken), Decision> {
        let _ = first;
        self.decide(start, n)
    }

    /// The decision of an admission whose word was stored.
    fn taken(&self, t: Self::Taken) -> Decision;

    fn hasher(&self) -> &ahash::RandomState;

    fn when_full(&self) -> WhenFull;
}

/// What a bucket decision needs to know about time and the quota.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now<'a> {
    pub(crate) p: &'a Params,
    /// The key's quota.
    pub(crate) q: &'a TokenBucket,
    pub(crate) at: At,
}

impl Rule for Now<'_> {
    type Taken = BucketWord;
    const GHOSTS: bool = true;
    /// A take needs `w ≤ now − cost`, and `now` is at most `MAX_UNITS`, below 2^62 (the
    /// tiers' lifetime ends there: `Tiers::new`).
    const REFUSES_NOT_LIVE: bool = true;
    const PEEL: bool = true;

    /// A new key's first stamp: its quota's initial level at `at`.
    #[inline]
    fn fresh(&self) -> u64 {
        self.at.now - self.q.cost_units(self.q.initial())
    }

    /// Stamps strictly below this are full buckets in every tier, with room to spare: evicting
    /// one leaves a high-water mark (`w + 1`) at or below it, so the slot's next key still
    /// starts full.
    #[inline]
    fn evictable(&self) -> u64 {
        evictable(self.p, self.at.now)
    }

    #[inline(always)]
    fn decide(&self, w: u64, n: u64) -> Result<(u64, BucketWord), Decision> {
        debug_assert!(self.at.now <= MAX_UNITS, "`REFUSES_NOT_LIVE` rests on it");
        match BucketWord::from_raw(w).decide(self.q, self.at, n) {
            Verdict::Take { next } => Ok((next.raw(), next)),
            Verdict::Final(d) => Err(d),
        }
    }

    #[inline(always)]
    fn taken(&self, t: BucketWord) -> Decision {
        t.taken(self.q, self.at)
    }

    #[inline]
    fn hasher(&self) -> &ahash::RandomState {
        &self.p.hasher
    }

    #[inline]
    fn when_full(&self) -> WhenFull {
        self.p.when_full
    }
}

/// One slot: the bucket word and the key's identity words.
struct Slot<W: Words> {
    word: AtomicU64,
    key: W::Atomic,
}

impl<W: Words> Slot<W> {
    fn new() -> Slot<W> {
        Slot { word: AtomicU64::new(VACANT), key: W::new_atomic() }
    }

    /// The slot's word, if it is live and the slot still holds `words` after the word was read.
    /// The state is tested first: then each test is one compare and branch to the caller's
    /// fallback (tested after the key, the state was computed into a flag ahead of the key's
    /// branch and tested again after it: two instructions more on every keyed decision).
    #[inline]
    fn load_live(&self, words: W) -> Option<u64> {
        self.load_for::<true>(words)
    }

    /// [`load_live`](Slot::load_live), testing the state only if `STATE`: a caller whose rule
    /// refuses every word that is not live ([`Rule::REFUSES_NOT_LIVE`]) tests it only before
    /// a refusal (`attempt`), and an admission skips the test.
    #[inline(always)]
    fn load_for<const STATE_TEST: bool>(&self, words: W) -> Option<u64> {
        // Acquire: pairs with the Release that made the word live (after the key was written,
        // `Shard::acquire_slow` and `Shard::help`), so the key read below is at least that key.
        let w = self.word.load(Acquire);
        if STATE_TEST && w & STATE != LIVE {
            rare();
            return None;
        }
        if W::load(&self.key, Relaxed) != words {
            rare();
            return None;
        }
        Some(w)
    }
}

/// A group of slots, aligned to a cache line (one line for `u64` keys).
#[repr(C, align(64))]
pub(crate) struct Group<W: Words> {
    slots: [Slot<W>; GROUP],
}

/// Counters of one shard. All `Relaxed`: statistics, read approximately.
#[derive(Debug, Default)]
struct Counters {
    /// 1 while a refund runs on this shard (see `Shard::refund`). Not a counter.
    refunding: AtomicU64,
    /// Live keys, as a wrapping count (an eviction may be counted before its insert).
    live: AtomicU64,
    inserts: AtomicU64,
    evicted: AtomicU64,
    forced: AtomicU64,
    full: AtomicU64,
}

/// One shard, as a view into the table's arrays: groups `base .. base + per` and their headers
/// and ghosts. The table keeps every shard's groups in one array, so that the decision path
/// reaches a key's group through a single pointer.
#[derive(Clone, Copy)]
pub(crate) struct Shard<'a, W: Words> {
    t: &'a Table<W>,
    /// The shard's first group (its index is `base >> shard_shift`).
    base: usize,
    /// Its groups, less one.
    mask: usize,
}

/// The result of looking for room for a new key.
enum Room {
    /// A slot claimed for us: its window position, its high-water mark, and whether it was
    /// taken from an evicted key (whose place in the live count passes to us).
    Claimed(usize, u64, bool),
    /// No room.
    Full,
}

impl<'a, W: Words> Shard<'a, W> {
    /// The shard's `g`-th group (wrapping).
    #[inline]
    fn group(&self, g: usize) -> &'a Group<W> {
        let i = self.base + (g & self.group_mask());
        debug_assert!(i < self.t.groups.len());
        // SAFETY: in bounds without a check on the decision path. The array holds
        // `shards · (group_mask + 1)` groups (`Table::new`: `slots / GROUP`, with `slots` and
        // `shards` powers of two), a shard's `base` is `index · (group_mask + 1)` with
        // `index ≤ shard_mask = shards − 1` (`Table::shards` passes `0..=shard_mask` to
        // `shard_at`, and `Table::shard` masks the hash with `shard_bits`, which is that
        // product's largest value), and `g & group_mask ≤ group_mask`.
        unsafe { self.t.groups.get_unchecked(i) }
    }

    #[inline]
    fn group_mask(&self) -> usize {
        self.mask
    }

    #[inline]
    fn header(&self, home: usize) -> &'a AtomicU64 {
        &self.t.headers[self.base + home]
    }

    #[inline]
    fn ghost(&self, home: usize) -> &'a AtomicU64 {
        &self.t.ghosts[self.base + home]
    }

    #[inline]
    fn c(&self) -> &'a Counters {
        &self.t.counters[self.base >> self.t.shard_shift]
    }

    fn groups(&self) -> &'a [Group<W>] {
        &self.t.groups[self.base..self.base + self.group_mask() + 1]
    }

    #[inline]
    fn slot(&self, home: usize, pos: usize) -> &'a Slot<W> {
        &self.group(home + pos / GROUP).slots[pos % GROUP]
    }

    #[inline]
    pub(crate) fn home_of(&self, hash: u64) -> usize {
        Table::<W>::place(hash) & self.group_mask()
    }

    /// Keys this shard tracks.
    pub(crate) fn len(&self) -> u64 {
        self.live()
    }

    /// Keys this shard holds at most.
    pub(crate) fn capacity(&self) -> u64 {
        self.t.max_live
    }

    /// The first stamp of a new key with this hash: `fresh`, or its ghost's if later.
    pub(crate) fn first_stamp(&self, home: usize, hash: u64, fresh: u64) -> u64 {
        fresh.max(self.ghost_for(home, hash))
    }

    fn live(&self) -> u64 {
        let live = self.c().live.load(Relaxed);
        if live > 1 << 63 {
            0 // transiently negative
        } else {
            live
        }
    }

    /// Takes `n` tokens (`1 ≤ n ≤ burst`) from the key's bucket, inserting the key if it is not
    /// tracked; the rule's [`WhenFull`] answer when the key is new and there is no room for it.
    ///
    /// A `Decision`, not an `Option`: the home group's decision is built in registers and
    /// returned as it is, and only the out-of-line path writes one through memory. (With one
    /// `Option` for both, the inline decision went to the slot the call writes, and was read
    /// back with wider loads than its stores: a failed store forward on every decision.)
    #[inline(always)]
    pub(crate) fn acquire<R: Rule>(&self, words: W, hash: u64, home: usize, now: &R, n: u64) -> Decision {
        // The home group first, without the header: a live slot holding the key is the key's
        // only live slot (the header protocol), so deciding on it is always right.
        if let Some(d) = self.probe(home, words, now, n) {
            return d;
        }
        self.acquire_next(words, hash, home, now, n)
    }

    /// Decides on the key's live slot in group `g` (of its window), if it is the group's last
    /// slot holding the key's words. That slot is picked without branching (a select per
    /// slot), so that where the key sits costs no misprediction (and cache misses of
    /// consecutive decisions overlap): the last of slots 1–3 whose key matches, or slot 0,
    /// whose key is not compared here (one compare and its select fewer). Then its word is
    /// read (Acquire) and its key compared again (`Slot::load_for`): only a key read after the
    /// word vouches for it, and slot 0 chosen by default is rejected there when it is not the
    /// key's. Its state is tested there too, or, for a rule that refuses every word not live,
    /// only before a refusal (`attempt`). The compare only picks the slot; a key it misses (one
    /// going live meanwhile) is found by the fallback, as a key beyond the home is.
    ///
    /// A group can hold a key's words in more than one slot: a slot keeps an evicted key's
    /// words until it is claimed again, and the key may come back in another slot of the
    /// group. New keys fill their home group from its last slot down ([`room`](Shard::room)),
    /// so a key's live slot is above the copies of its words that were there when it was
    /// claimed: the last match is the live one. When it is not (a copy left after the claim,
    /// by a claim given back in a race, or a key claimed by eviction below a vacant copy), the
    /// caller's fallback, [`acquire_next`](Shard::acquire_next), walks them all. (Walking a
    /// mask of every match here cost six instructions more on every decision, and a call for
    /// the walk that takes `now` by reference stored it to the stack on every decision;
    /// reading all four words first, to have the word at hand, kept them on the stack: nine
    /// more.)
    #[inline(always)]
    pub(crate) fn probe<R: Rule>(&self, g: usize, words: W, now: &R, n: u64) -> Option<Decision> {
        Self::probe_group(self.group(g), words, now, n).map(Decided::decision)
    }

    /// [`probe`](Shard::probe) in a group found already (a key's home, [`Table::home_group`]).
    #[inline(always)]
    pub(crate) fn probe_group<R: Rule>(group: &Group<W>, words: W, now: &R, n: u64) -> Option<Decided> {
        let mut slot = &group.slots[0];
        for pos in 1..GROUP {
            let hit = W::load(&group.slots[pos].key, Relaxed) == words;
            slot = if hit { &group.slots[pos] } else { slot };
        }
        let w = if R::REFUSES_NOT_LIVE { slot.load_for::<false>(words)? } else { slot.load_live(words)? };
        decide_on(slot, w, words, now, n)
    }

    /// Decides on the key's live slot among the first `slots` of its window, if it is there:
    /// every slot holding the key's words, in order.
    #[inline]
    fn probe_all<R: Rule>(&self, home: usize, slots: usize, words: W, now: &R, n: u64) -> Option<Decision> {
        (0..slots).find_map(|pos| {
            let slot = self.slot(home, pos);
            if W::load(&slot.key, Relaxed) != words {
                return None;
            }
            decide_on(slot, slot.load_live(words)?, words, now, n).map(Decided::decision)
        })
    }

    /// Where a key goes when [`probe`](Shard::probe) did not decide it: its home group again,
    /// every match (the one the probe picked may have been an evicted copy), then the group
    /// after the home, still without the header: where most keys that overflow their home
    /// sit. Then the slow path, and the refusal of a full table.
    #[inline(never)]
    pub(crate) fn acquire_next<R: Rule>(
        &self,
        words: W,
        hash: u64,
        home: usize,
        now: &R,
        n: u64,
    ) -> Decision {
        if let Some(d) = self.probe_all(home, 2 * GROUP, words, now, n) {
            return d;
        }
        self.acquire_slow(words, hash, home, now, n).unwrap_or_else(|| refusal(now.when_full()))
    }

    #[inline(never)]
    fn acquire_slow<R: Rule>(&self, words: W, hash: u64, home: usize, now: &R, n: u64) -> Option<Decision> {
        let header = self.header(home);
        // A slot we claimed and wrote our key into, kept across failed commits: (position, the
        // CLAIMED value it holds, its high-water mark before our claim, whether it is already
        // counted live).
        let mut claim: Option<(usize, u64, u64, bool)> = None;
        loop {
            // Acquire: pairs with the AcqRel header CASes below and in `bump`, so that the
            // scan sees every slot committed up to this version, key words included.
            let h = header.load(Acquire);
            if !self.help(home, h) {
                continue;
            }
            if let Some((slot, w)) = self.scan(home, h_reach(h), words) {
                if let Some((pos, _, hwm, counted)) = claim.take() {
                    // Back to the mark the slot had before our claim, not to our first stamp:
                    // that stamp is a fresh bucket of *our* rule (our tier's fill, our ghost),
                    // and the slot's next key, of another tier or without a ghost, would start
                    // from it nearly empty (issue 13, bug 1). The word returns to exactly its
                    // value before the claim, and between the two it only held CLAIMED values,
                    // which only we and header-guarded helpers CAS (no header names an
                    // uncommitted claim): to every other thread the claim never happened, and
                    // a claimer that read `VACANT | hwm` before it finds the state it read.
                    // Release: the next claimer's Acquire CAS sees our key words as old news.
                    self.slot(home, pos).word.store(VACANT | hwm, Release);
                    if counted {
                        self.c().live.fetch_sub(1, Relaxed);
                    }
                }
                if let Some(d) = decide_on(slot, w, words, now, n) {
                    return Some(d.decision());
                }
                continue;
            }
            // The key is absent as of `h`: claim room, or reuse our claim.
            // A new key's first word as of this decision: fresh, or its ghost's if later.
            let fresh = if R::GHOSTS { now.fresh().max(self.ghost_for(home, hash)) } else { now.fresh() };
            let (pos, claimed, hwm, counted) = match claim {
                Some(c) => c,
                None => {
                    let (pos, hwm, counted) = match self.room(home, now) {
                        Room::Claimed(pos, hwm, counted) => (pos, hwm, counted),
                        Room::Full => {
                            self.c().full.fetch_add(1, Relaxed);
                            return None;
                        }
                    };
                    // Release: a helper or scanner that reads these words synchronizes through
                    // the header CAS; Release here also orders them for `force`'s Acquire read.
                    W::store(&self.slot(home, pos).key, words, Release);
                    (pos, CLAIMED | hwm, hwm, counted)
                }
            };
            let slot = self.slot(home, pos);
            // The first word: never below the slot's high-water mark (values only grow).
            let want = CLAIMED | now.start(fresh, claimed & VALUE);
            if want != claimed {
                // Still private (published by the header CAS below), but Release all the same: a
                // helper holding a stale header may read this value, and must then see the version
                // bump that came before the slot was freed (`help`).
                slot.word.store(want, Release);
            }
            let next = h_next(h, pos as u64, h_reach(h).max(pos + 1));
            // AcqRel: Release publishes the key words and the CLAIMED value to every thread
            // that reads this header (Acquire, above and in `help`); Acquire on failure, as the
            // header load above.
            match header.compare_exchange(h, next, AcqRel, Acquire) {
                Ok(_) => {
                    if !counted {
                        self.c().live.fetch_add(1, Relaxed);
                    }
                    self.c().inserts.fetch_add(1, Relaxed);
                    // Make the slot live with this decision already applied: one CAS for both.
                    let first = want & VALUE;
                    let (live, decision) = match now.decide_first(fresh, first, n) {
                        Ok((next, taken)) => (next, now.taken(taken)),
                        Err(denied) => (first, denied),
                    };
                    // Release: pairs with `Slot::load_live`'s Acquire, publishing the key words.
                    // Fails if a helper made the slot live first; then decide as on any key.
                    if slot.word.compare_exchange(want, live, Release, Relaxed).is_ok() {
                        return Some(decision);
                    }
                    if let Some(w) = slot.load_live(words) {
                        if let Some(d) = decide_on(slot, w, words, now, n).map(Decided::decision) {
                            return Some(d);
                        }
                    }
                    // Evicted already (it was full): decide again from the top.
                    claim = None;
                }
                Err(_) => claim = Some((pos, want, hwm, counted)),
            }
        }
    }

    /// The key's live slot and its word, scanning the home's window up to `reach`.
    #[inline]
    fn scan(&self, home: usize, reach: usize, words: W) -> Option<(&'a Slot<W>, u64)> {
        (0..reach).find_map(|pos| {
            let slot = self.slot(home, pos);
            if W::load(&slot.key, Relaxed) != words {
                return None;
            }
            Some((slot, slot.load_live(words)?))
        })
    }

    /// Makes the home's latest commit live if it is still CLAIMED. `false` if the header moved
    /// on meanwhile: the caller starts over.
    fn help(&self, home: usize, h: u64) -> bool {
        let Some(pos) = h_last(h) else { return true };
        let slot = self.slot(home, pos);
        // Acquire: if this is a newer claim than the commit `h` names, its value was written
        // after a version bump of this home, by the claim CAS (an RMW continuing the evictor's
        // Release) or by the claimer's Release store, so the header load below sees the bump.
        let w = slot.word.load(Acquire);
        if w & STATE != CLAIMED {
            return true;
        }
        if self.header(home).load(Acquire) != h {
            return false;
        }
        // The header did not move, so the home's keys were not evicted: `w` is the committed
        // claim. Release: pairs with `Slot::load_live`, as in `acquire_slow`.
        let _ = slot.word.compare_exchange(w, w & VALUE, Release, Relaxed);
        true
    }

    /// Bumps the home's version (after helping its latest commit), so that no thread can
    /// mistake a later claim of an evicted slot for the home's commit.
    fn bump(&self, home: usize) {
        let header = self.header(home);
        loop {
            let h = header.load(Acquire);
            if !self.help(home, h) {
                continue;
            }
            // AcqRel: as the commit CAS in `acquire_slow`.
            if header.compare_exchange(h, h_next(h, NONE, h_reach(h)), AcqRel, Acquire).is_ok() {
                return;
            }
        }
    }

    /// Finds room for a new key in its window, in claim order (`claim_order`): the first vacant
    /// slot (below capacity), the first full bucket (evicted), or, with
    /// [`WhenFull::EvictFullest`], the stalest bucket.
    fn room<R: Rule>(&self, home: usize, now: &R) -> Room {
        // Vacant slots first, while below capacity: evicting a full bucket costs a header CAS,
        // and under a quota that refills within nanoseconds every bucket is full, so evicting
        // first would make keys evict each other for nothing.
        if self.live() < self.t.max_live {
            for pos in (0..WINDOW).map(claim_order) {
                let slot = self.slot(home, pos);
                let w = slot.word.load(Relaxed);
                // Acquire: our key-word stores must not move above the claim.
                if w & STATE == VACANT
                    && slot.word.compare_exchange(w, CLAIMED | (w & VALUE), Acquire, Relaxed).is_ok()
                {
                    return Room::Claimed(pos, w & VALUE, false);
                }
            }
        }
        for pos in (0..WINDOW).map(claim_order) {
            let slot = self.slot(home, pos);
            let w = slot.word.load(Relaxed);
            if w & STATE == LIVE && w < now.evictable() {
                if let Some(hwm) = self.evict(slot, w, CLAIMED, now.hasher()) {
                    return Room::Claimed(pos, hwm, true);
                }
            }
        }
        match now.when_full() {
            WhenFull::EvictFullest if R::GHOSTS => self.force(home, now),
            _ => Room::Full,
        }
    }

    /// Evicts the full bucket `w` from `slot`, leaving it `to` (VACANT or CLAIMED for the
    /// caller) with high-water mark `w + 1`. `None` if the slot changed first.
    fn evict(&self, slot: &Slot<W>, w: u64, to: u64, hasher: &ahash::RandomState) -> Option<u64> {
        // Acquire: the key words read below are the evicted key's (they cannot change while
        // the slot is LOCKED). Fails if anyone decided on `w` meanwhile.
        slot.word.compare_exchange(w, LOCKED | w, Acquire, Relaxed).ok()?;
        let words = W::load(&slot.key, Relaxed);
        self.bump(self.home_of(words.hash_with(hasher)));
        // Release: pairs with `help`'s Acquire load (the bump happens-before this value).
        slot.word.store(to | (w + 1), Release);
        if to == VACANT {
            self.c().live.fetch_sub(1, Relaxed);
        }
        self.c().evicted.fetch_add(1, Relaxed);
        Some(w + 1)
    }

    /// The table-full fallback: evicts the live bucket with the oldest stamp (the one nearest
    /// to full) in the window, after leaving a *ghost* of it in its home: a returning key whose
    /// tag matches starts from the ghost's stamp (rounded toward empty), not from a fresh full
    /// bucket. A ghost is only overwritten once its stamp is full in every quota, so no ghost is
    /// lost while it matters; if the victim's home has an unexpired ghost of another key,
    /// nothing is evicted and the new key is refused.
    fn force<R: Rule>(&self, home: usize, now: &R) -> Room {
        for _ in 0..4 {
            let Some((pos, _)) = (0..WINDOW)
                .map(|pos| (pos, self.slot(home, pos).word.load(Relaxed)))
                .filter(|&(_, w)| w & STATE == LIVE)
                .min_by_key(|&(_, w)| w)
            else {
                return Room::Full;
            };
            let slot = self.slot(home, pos);
            // Read the victim's key between two reads of its word. Acquire on all three: a key
            // word written for a later claim was stored with Release after the word left `w`,
            // so reading it makes the second word read see the change.
            let w = slot.word.load(Acquire);
            let words = W::load(&slot.key, Acquire);
            if w & STATE != LIVE || slot.word.load(Acquire) != w {
                continue;
            }
            let hash = words.hash_with(now.hasher());
            let victim_home = self.home_of(hash);
            let mut w = w;
            loop {
                if !self.leave_ghost(victim_home, ghost_tag(hash), w, now.evictable()) {
                    return Room::Full;
                }
                // AcqRel: Release so that a thread that sees LOCKED sees the ghost. Acquire on
                // failure: the key words are read again below, after the new value.
                match slot.word.compare_exchange(w, LOCKED | w, AcqRel, Acquire) {
                    Ok(_) => {
                        self.bump(victim_home);
                        slot.word.store(CLAIMED | (w + 1), Release);
                        self.c().forced.fetch_add(1, Relaxed);
                        return Room::Claimed(pos, w + 1, true);
                    }
                    // A decision (or refund) on the victim came first. The ghost we left names
                    // a key still live, and cannot be taken back: another forcer of the same
                    // victim may have left the very same value and rely on it. Left there, it
                    // would refuse every other forced eviction into the victim's home for up
                    // to the largest fill (issue 13). So finish what it announces: evict the
                    // victim on its new word, its ghost raised to match (a stamp only rises).
                    // Each retry means another thread's CAS succeeded.
                    Err(seen)
                        if seen & STATE == LIVE
                            && W::load(&slot.key, Acquire) == words
                            && slot.word.load(Acquire) == seen =>
                    {
                        w = seen;
                    }
                    // The victim left the slot (evicted by another thread, which relies on the
                    // ghost, or full and swept): the next victim.
                    Err(_) => break,
                }
            }
        }
        Room::Full
    }

    fn leave_ghost(&self, home: usize, tag: u64, stamp: u64, evictable: u64) -> bool {
        let ghost = self.ghost(home);
        let coarse = stamp.div_ceil(1 << GHOST_SHIFT);
        let mut cur = ghost.load(Acquire);
        loop {
            let (cur_tag, cur_stamp) = (cur >> GHOST_TAG_SHIFT, (cur & GHOST_STAMP) << GHOST_SHIFT);
            let next = if cur_tag == tag {
                tag << GHOST_TAG_SHIFT | coarse.max(cur & GHOST_STAMP)
            } else if cur == 0 || cur_stamp <= evictable {
                tag << GHOST_TAG_SHIFT | coarse
            } else {
                return false;
            };
            // AcqRel: the ghost happens-before the victim's LOCKED (see `force`).
            match ghost.compare_exchange(cur, next, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The stamp a new key with this hash must start at or above, from its home's ghost.
    #[inline]
    fn ghost_for(&self, home: usize, hash: u64) -> u64 {
        // Acquire: pairs with `leave_ghost`.
        let g = self.ghost(home).load(Acquire);
        if g != 0 && g >> GHOST_TAG_SHIFT == ghost_tag(hash) {
            (g & GHOST_STAMP) << GHOST_SHIFT
        } else {
            0
        }
    }

    /// The key's word, if it is tracked, without changing anything but helping.
    pub(crate) fn find(&self, words: W, home: usize) -> Option<u64> {
        loop {
            let h = self.header(home).load(Acquire);
            if !self.help(home, h) {
                continue;
            }
            let reach = h_reach(h).max(GROUP);
            return self.scan(home, reach, words).map(|(_, w)| w);
        }
    }

    /// Moves the key's word back to `step(w)` (a refund; `step` reads the clock if it needs one
    /// and is called after each load of the word; `None` or a value not below `w` leaves it).
    /// Nothing if the key is no longer tracked: it was evicted as fresh, which means the charge
    /// was absorbed.
    ///
    /// The word moves back, which the reclamation argument (values only grow) allows: a refund
    /// never leaves the key's state more permissive than a twin that never saw the charge (see
    /// `AtomicBucket::refund` and each policy's `refund`), and the twin's word is at or above
    /// the key's first word in this slot, which is above every value the slot held for an
    /// earlier key. So a stale reader of another key still fails its CAS, and a reader of this
    /// key that sees an old value again decides on the state that value stands for. `step`
    /// clamps its result at the rule's evictable line, at or above the slot's high-water mark
    /// under a consistent clock.
    pub(crate) fn refund(&self, words: W, home: usize, step: impl Fn(u64) -> Option<u64>) {
        // One refund per shard at a time, as in `AtomicBucket::refund` (a refund that lowers a
        // word while another refund of the same slot is between its clock read and its CAS
        // would let that CAS succeed on a value a later decision rebuilt). Busy: nothing.
        // Acquire/Release: the next refund starts after this one's CAS.
        let flag = &self.c().refunding;
        if flag.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            return;
        }
        let _clear = crate::sync::ClearOnDrop(flag);
        self.refund_one(words, home, step);
    }

    /// [`refund`](Shard::refund) for a cancel: waits for another refund or cancel of this
    /// shard in progress (a few instructions each) rather than give nothing back, as a direct
    /// bucket's cancel does. Decisions never wait on it. Whether it gave anything back.
    pub(crate) fn cancel(&self, words: W, home: usize, step: impl Fn(u64) -> Option<u64>) -> bool {
        // Acquire/Release: as in `refund`.
        let flag = &self.c().refunding;
        while flag.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            crate::sync::pause();
        }
        let _clear = crate::sync::ClearOnDrop(flag);
        self.refund_one(words, home, step)
    }

    /// Gives back `step`'s amount on `words`' live word, if it is still live: whether it did.
    fn refund_one(&self, words: W, home: usize, step: impl Fn(u64) -> Option<u64>) -> bool {
        let found = loop {
            // Acquire: as in `find`.
            let h = self.header(home).load(Acquire);
            if self.help(home, h) {
                break self.scan(home, h_reach(h).max(GROUP), words);
            }
        };
        let Some((slot, mut w)) = found else { return false };
        loop {
            if w & STATE != LIVE {
                return false;
            }
            let Some(next) = step(w).filter(|&next| next < w) else { return false };
            // Success Relaxed: the refund publishes nothing (its RMW continues the release
            // sequence of the decision it replaces, and refunds of a shard are serialized by
            // the flag). Failure Acquire, as in `decide_on`: the key is checked again after a
            // failure, which may show a new key's word. Checked by loom-tests/tests/admit.rs.
            match slot.word.compare_exchange_weak(w, next, Relaxed, Acquire) {
                Ok(_) => return true,
                Err(seen) => {
                    if W::load(&slot.key, Relaxed) != words {
                        return false;
                    }
                    w = seen;
                }
            }
        }
    }

    /// Evicts every full bucket. Returns how many.
    pub(crate) fn sweep(&self, evictable: u64, hasher: &ahash::RandomState) -> usize {
        let mut evicted = 0;
        for group in self.groups() {
            for slot in &group.slots {
                let w = slot.word.load(Relaxed);
                if w & STATE == LIVE && w < evictable && self.evict(slot, w, VACANT, hasher).is_some() {
                    evicted += 1;
                }
            }
        }
        evicted
    }

    /// This shard's inserts, clean evictions and forced evictions so far.
    pub(crate) fn counts(&self) -> [u64; 3] {
        // Relaxed: statistics (see `Counters`).
        [self.c().inserts.load(Relaxed), self.c().evicted.load(Relaxed), self.c().forced.load(Relaxed)]
    }

    /// Adds this shard's figures to `stats`.
    pub(crate) fn add_stats(&self, stats: &mut TableStats, hasher: &ahash::RandomState) {
        stats.capacity += self.t.max_live;
        stats.slots += (self.groups().len() * GROUP) as u64;
        stats.inserts += self.c().inserts.load(Relaxed);
        stats.evictions += self.c().evicted.load(Relaxed);
        stats.forced_evictions += self.c().forced.load(Relaxed);
        stats.refused += self.c().full.load(Relaxed);
        let slots = self.groups().len() * GROUP;
        for (index, slot) in self.groups().iter().flat_map(|g| g.slots.iter()).enumerate() {
            let w = slot.word.load(Acquire);
            if w & STATE != LIVE {
                continue;
            }
            let home = self.home_of(W::load(&slot.key, Relaxed).hash_with(hasher));
            let distance = (index + slots - home * GROUP) % slots;
            stats.live += 1;
            if stats.probe_histogram.len() <= WINDOW {
                stats.probe_histogram.resize(WINDOW + 1, 0);
            }
            stats.probe_histogram[distance.min(WINDOW)] += 1;
            stats.max_probe = stats.max_probe.max(distance as u64);
            stats.total_probe += distance as u64;
        }
    }
}

/// A new key's decision when the table has no room for it: [`Outcome::Untracked`] when the
/// table fails open, [`Outcome::TableFull`] otherwise.
#[cold]
pub(crate) fn refusal(when_full: WhenFull) -> Decision {
    let outcome = match when_full {
        WhenFull::Allow => Outcome::Untracked,
        WhenFull::Deny | WhenFull::EvictFullest => Outcome::TableFull,
    };
    Decision::from_nanos(outcome, 0, Nanos::ZERO, Nanos::ZERO)
}

/// A decision on a key's live slot, and whether it stored a word.
pub(crate) enum Decided {
    /// The rule's word was stored: an admission ([`Rule::taken`]).
    Took(Decision),
    /// Decided on the word as read, nothing stored: a refusal.
    Final(Decision),
}

impl Decided {
    #[inline(always)]
    pub(crate) fn decision(self) -> Decision {
        match self {
            Decided::Took(d) | Decided::Final(d) => d,
        }
    }
}

/// Decides on the key's live word `w` (read with Acquire, the key checked after), retrying the
/// CAS while the slot still holds the key. `None` if the key left the slot. Whether the
/// decision stored a word is kept apart, so that a caller's test of refusals (a stale clock
/// reading, `TokenBucket::stale`) is not made on admissions.
///
/// For a rule that asks ([`Rule::PEEL`]), the first attempt is written out ahead of the retry
/// loop: the loop's head is aligned with a no-op that the common decision, which never
/// retries, then does not run.
#[inline(always)]
fn decide_on<W: Words, R: Rule>(slot: &Slot<W>, w: u64, words: W, now: &R, n: u64) -> Option<Decided> {
    let mut w = w;
    if R::PEEL {
        w = match attempt(slot, w, words, now, n) {
            Ok(decided) => return decided,
            Err(seen) => seen,
        };
    }
    loop {
        w = match attempt(slot, w, words, now, n) {
            Ok(decided) => return decided,
            Err(seen) => seen,
        };
    }
}

/// One attempt of [`decide_on`] on the word `w`: its answer, or the word to try again on.
#[inline(always)]
fn attempt<W: Words, R: Rule>(
    slot: &Slot<W>,
    w: u64,
    words: W,
    now: &R,
    n: u64,
) -> Result<Option<Decided>, u64> {
    // A word that is not live: the key left the slot. Tested here, or, for a rule that
    // refuses every such word, only on a refusal below (a take proves the word live).
    if !R::REFUSES_NOT_LIVE && w & STATE != LIVE {
        rare();
        return Ok(None);
    }
    let (next, taken) = match now.decide(w, n) {
        Ok(step) => step,
        Err(_) if R::REFUSES_NOT_LIVE && w & STATE != LIVE => {
            rare();
            return Ok(None);
        }
        Err(d) => {
            // A denial has no CAS to fail if the slot moved on between the word read and
            // the key check (the key read may even be torn across a new claimant's words),
            // so confirm the word. The Acquire fence pairs with the Release stores of a
            // claimant's key words (`acquire_slow`): if the key read saw any of them, the
            // load below sees the claim.
            fence(Acquire);
            let cur = slot.word.load(Acquire);
            if cur == w {
                return Ok(Some(Decided::Final(d)));
            }
            if W::load(&slot.key, Relaxed) != words {
                return Ok(None);
            }
            return Err(cur);
        }
    };
    debug_assert!(!R::REFUSES_NOT_LIVE || w & STATE == LIVE, "a rule that refuses words not live took one");
    // Success Release: the key words stay published by the release sequence this RMW
    // continues, and a refund that loads this value (Acquire) reads a clock no earlier than
    // this decision's (`Shard::refund`; free on x86). Failure Acquire: the new value may be
    // a new key's, so the key is checked again after it. Fails whenever the slot changed:
    // stamps only grow (module docs).
    match slot.word.compare_exchange_weak(w, next, Release, Acquire) {
        Ok(_) => Ok(Some(Decided::Took(now.taken(taken)))),
        Err(seen) => {
            if W::load(&slot.key, Relaxed) != words {
                return Ok(None);
            }
            Err(seen)
        }
    }
}

/// The window position a new key tries `i`-th: its home group's slots from the last down, then
/// the rest of the window in order, so that a key's live slot in its home group is above the
/// copies of its words left there before ([`Shard::probe_group`] picks the last match).
#[inline]
fn claim_order(i: usize) -> usize {
    if i < GROUP {
        GROUP - 1 - i
    } else {
        i
    }
}

/// Marks the branch that calls it as rarely taken (`core::hint::cold_path`, which is newer
/// than this crate's minimum Rust). On the decision path it keeps two tests that lead to the
/// same fallback as two predicted branches, instead of merged into flags (four instructions
/// more).
#[cold]
#[inline]
fn rare() {}

/// Figures of a whole table.
#[derive(Clone, Debug, Default)]
pub(crate) struct TableStats {
    pub(crate) live: u64,
    pub(crate) capacity: u64,
    pub(crate) slots: u64,
    pub(crate) inserts: u64,
    pub(crate) evictions: u64,
    pub(crate) forced_evictions: u64,
    pub(crate) refused: u64,
    pub(crate) max_probe: u64,
    pub(crate) total_probe: u64,
    pub(crate) probe_histogram: Vec<u64>,
}

/// The group array: a table of a million keys spans tens of megabytes, in huge pages where
/// the system has them (see `pages.rs`).
fn alloc_groups<W: Words>(groups: usize) -> Result<Pages<Group<W>>, ConfigError> {
    Pages::new(groups, "the table's slots", || Group { slots: core::array::from_fn(|_| Slot::new()) })
}

/// The shards, as one array of groups (and one of headers, one of ghosts) cut into equal
/// power-of-two ranges.
pub(crate) struct Table<W: Words> {
    groups: Pages<Group<W>>,
    headers: Pages<AtomicU64>,
    ghosts: Pages<AtomicU64>,
    counters: Box<[CachePadded<Counters>]>,
    /// log2 of the groups per shard.
    shard_shift: u32,
    /// The bits of a hash that pick its shard's first group: `shard_mask << shard_shift`.
    shard_bits: usize,
    /// Groups per shard, less one.
    group_mask: usize,
    /// Groups in all, less one: `shard_bits | group_mask`.
    home_mask: usize,
    /// `home_mask << PLACE`: the bits of a hash that are its home group's byte offset in the
    /// array, when a group's size is a power of two ([`home_group`](Table::home_group)).
    home_bytes: usize,
    shard_mask: usize,
    max_live: u64,
}

impl<W: Words> Table<W> {
    /// A group's size in bytes.
    const GROUP_BYTES: usize = size_of::<Group<W>>();

    /// The hash bits below a hash's placement ([`place`](Table::place)): log2 of a group's
    /// size when that is a power of two (one-word keys: 64 bytes), so that the placement's
    /// group bits, unshifted, are the group's byte offset in the array; 0 otherwise.
    const PLACE: u32 =
        if Self::GROUP_BYTES.is_power_of_two() { Self::GROUP_BYTES.trailing_zeros() } else { 0 };

    /// The bits of a hash that place its key: its home group (`Shard::home_of`) and shard
    /// ([`shard`](Table::shard)) are their low bits. (The ghosts' tags are the hash's top 22
    /// bits, above any table's placement bits: 2^36 groups would be terabytes.)
    #[inline]
    pub(crate) fn place(hash: u64) -> usize {
        #[expect(clippy::cast_possible_truncation, reason = "only the low bits are used")]
        let place = (hash >> Self::PLACE) as usize;
        place
    }

    /// `slots` and `shards` are powers of two, `slots ≥ shards · WINDOW`.
    pub(crate) fn new(slots: usize, shards: usize) -> Result<Table<W>, ConfigError> {
        let per_shard = slots / shards;
        // Checked in release builds too: `Shard::group`'s and `Table::home_group`'s unchecked
        // indices rest on it.
        assert!(
            per_shard >= WINDOW
                && per_shard.is_power_of_two()
                && shards.is_power_of_two()
                && slots.is_power_of_two()
        );
        let groups = slots / GROUP;
        Ok(Table {
            groups: alloc_groups(groups)?,
            headers: Pages::new(groups, "the table's group headers", || AtomicU64::new(NONE))?,
            // Written only by forced evictions: left as zero pages until then.
            ghosts: Pages::zeroed(groups, "the table's ghosts")?,
            counters: (0..shards).map(|_| CachePadded::new(Counters::default())).collect(),
            shard_shift: (per_shard / GROUP).trailing_zeros(),
            shard_bits: (shards - 1) << (per_shard / GROUP).trailing_zeros(),
            group_mask: per_shard / GROUP - 1,
            home_mask: groups - 1,
            home_bytes: (groups - 1) << Self::PLACE,
            shard_mask: shards - 1,
            max_live: (per_shard - per_shard / 8) as u64,
        })
    }

    #[inline]
    fn shard_at(&self, index: usize) -> Shard<'_, W> {
        Shard { t: self, base: index << self.shard_shift, mask: self.group_mask }
    }

    /// The shard of a hash: the placement bits above its home's (`Shard::home_of`), so that a
    /// hash's group in the whole array is `place(hash) & (groups − 1)`
    /// ([`home_group`](Table::home_group): one mask on the decision path, where a shard index
    /// of its own took a shift, a mask and a shift more).
    #[inline]
    pub(crate) fn shard(&self, hash: u64) -> Shard<'_, W> {
        let base = Self::place(hash) & self.shard_bits;
        Shard { t: self, base, mask: self.group_mask }
    }

    /// A hash's home group, the one its shard's `group(home_of(hash))` names: the shard's
    /// bits of a hash lie above its home's, so the two masks and the add that sum them are one
    /// mask (three instructions less on every decision). Where a group's size is a power of
    /// two, that mask of the unshifted hash is the group's byte offset (two fewer: no shift
    /// to an index, no scaling back).
    #[inline]
    pub(crate) fn home_group(&self, hash: u64) -> &Group<W> {
        let i = Self::place(hash) & self.home_mask;
        debug_assert!(core::ptr::eq(
            self.groups.get(i).unwrap(),
            self.shard(hash).group(self.shard(hash).home_of(hash))
        ));
        if Self::PLACE != 0 {
            #[expect(clippy::cast_possible_truncation, reason = "masked to the array's bytes")]
            let offset = hash as usize & self.home_bytes;
            debug_assert_eq!(offset, i * Self::GROUP_BYTES);
            // SAFETY: `offset` is `i · GROUP_BYTES` (`home_bytes` is `home_mask << PLACE` and a
            // group is `1 << PLACE` bytes), the start of group `i`, which is in bounds: see
            // below.
            return unsafe { &*self.groups.as_ptr().cast::<u8>().add(offset).cast::<Group<W>>() };
        }
        // SAFETY: `home_mask` is the array's length less one (`new`: `groups`, a power of two,
        // since `slots` and `GROUP` are), so `i` is in bounds.
        unsafe { self.groups.get_unchecked(i) }
    }

    pub(crate) fn shards(&self) -> impl Iterator<Item = Shard<'_, W>> {
        (0..=self.shard_mask).map(|i| self.shard_at(i))
    }

    /// Bytes the table owns (its large arrays in whole pages).
    pub(crate) fn memory(&self) -> usize {
        core::mem::size_of::<Table<W>>()
            + self.groups.bytes()
            + self.headers.bytes()
            + self.ghosts.bytes()
            + self.counters.len() * core::mem::size_of::<CachePadded<Counters>>()
    }

    /// Bytes of the table's memory on huge pages now (see `pages.rs`).
    pub(crate) fn huge_page_bytes(&self) -> u64 {
        super::pages::huge_bytes([self.groups.mapping(), self.headers.mapping(), self.ghosts.mapping()])
    }
}

impl<W: Words> fmt::Debug for Table<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table").field("shards", &(self.shard_mask + 1)).finish_non_exhaustive()
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;
    use crate::keyed::tiers::Tiers;
    use crate::WhenFull;

    /// A key whose live slot sits below a copy of its words in the same group (a slot keeps a
    /// key's words until it is claimed again): the probe picks the copy (the last match, or
    /// slot 0 without a compare), whatever state the copy's word is in, and the fallback must
    /// decide on the live slot, once, inserting nothing. Under the bucket rule, whose probe
    /// tests the state only before a refusal, and under a rule that tests it first.
    #[test]
    fn a_stale_copy_above_the_live_slot_is_passed_over() {
        const KEY: [u64; 1] = [0xfeed];
        let q = TokenBucket::per_second(10).unwrap();
        let tiers = Tiers::new(
            &[("default".to_owned(), q)],
            Nanos::ZERO,
            1 << 60,
            MAX_UNITS - (1 << 60),
            Nanos::ZERO,
            false,
        )
        .unwrap();
        let p =
            Params { tiers, when_full: WhenFull::Deny, hasher: ahash::RandomState::with_seeds(1, 2, 3, 4) };
        let q = p.tiers.get(0);
        let now = (1 << 60) + 5 * q.fill_units();
        let rule = Now { p: &p, q: &q, at: At { now, floor: now - q.fill_units() } };
        let stamp = now - q.fill_units(); // a full bucket: the take succeeds
        let reserve = crate::keyed::bucket::reserve_rule(&rule, q.fill_units());
        for (live, copy) in [(0, 2), (0, 3), (1, 3), (2, 3)] {
            for copy_word in [VACANT | 7, LOCKED | (stamp - 1), CLAIMED | (stamp + 1)] {
                for reserving in [false, true] {
                    let table = Table::<[u64; 1]>::new(WINDOW, 1).unwrap();
                    let shard = table.shard(0);
                    let slots = &shard.group(0).slots;
                    for (pos, word) in [(copy, copy_word), (live, LIVE | stamp)] {
                        <[u64; 1]>::store(&slots[pos].key, KEY, Relaxed);
                        slots[pos].word.store(word, Relaxed);
                    }
                    let case = format!("live {live}, copy {copy} {copy_word:#x}, reserving {reserving}");
                    let d = if reserving {
                        shard.acquire(KEY, 0, 0, &reserve, 1)
                    } else {
                        shard.acquire(KEY, 0, 0, &rule, 1)
                    };
                    assert_eq!(d.outcome(), Outcome::Allowed, "{case}: {d:?}");
                    assert_eq!(slots[copy].word.load(Relaxed), copy_word, "{case}: the copy is left alone");
                    let taken = slots[live].word.load(Relaxed);
                    assert_eq!(taken, stamp + q.cost_units(1), "{case}: one take, on the live slot");
                    // Nothing was claimed or inserted: every other slot of the window is as built.
                    for pos in (0..WINDOW).filter(|&p| p != live && p != copy) {
                        assert_eq!(shard.slot(0, pos).word.load(Relaxed), VACANT, "{case}: slot {pos}");
                    }
                    assert_eq!(shard.c().inserts.load(Relaxed), 0, "{case}");
                }
            }
        }
    }

    /// New keys fill their home group from its last slot down, then the window after it.
    #[test]
    fn new_keys_fill_the_home_group_from_the_top() {
        let order: Vec<usize> = (0..WINDOW).map(claim_order).collect();
        let mut expected: Vec<usize> = (0..GROUP).rev().collect();
        expected.extend(GROUP..WINDOW);
        assert_eq!(order, expected);
    }
}
