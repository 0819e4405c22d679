//! Tiers and per-key overrides: which quota a key is decided under, changeable at runtime.
//!
//! # Tiers
//!
//! A keyed limiter has a fixed list of named tiers (tier 0 is the default quota). Every tier's
//! quota is compiled with the same time unit (`m` units per ns), so bucket stamps mean the same
//! instant in every tier and a key can move between tiers without touching its slot.
//!
//! A tier's quota can be replaced at runtime. Until the first replacement, decisions read the
//! quotas as built (plain memory, no atomics). After it, each tier is read from a
//! [`ConfigCell`] (`engine/config.rs`: a double-buffered sequence lock whose readers never wait
//! for a stalled writer). Writers are serialized by a mutex (an administrative path, never a
//! decision).
//!
//! # Overrides
//!
//! Per-key tier assignments live in a fixed-capacity open-addressing map. Readers take no lock:
//! each entry is a state word (version, kind, tier) beside the key words, read state → key →
//! state; a version change in between means a concurrent rewrite, and the reader looks again.
//! Writers are serialized by a mutex. A removed entry becomes a tombstone that later inserts
//! reuse, so a lookup probes at most the map's capacity.

use std::sync::Mutex;

use super::key::Words;
use crate::engine::config::ConfigCell;
use crate::sync::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use crate::{ConfigError, Nanos, TokenBucket, UpdateError};

/// A tier of a [`KeyedLimiter`](crate::KeyedLimiter): an index into its list of named quotas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tier(pub(crate) u8);

impl Tier {
    /// The default tier: the quota the limiter was built with.
    pub const DEFAULT: Tier = Tier(0);

    /// The tier's position in the limiter's list (0 for the default).
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The most tiers a limiter has, the default included.
pub(crate) const MAX_TIERS: usize = 255;

/// One tier's quota, changeable at runtime.
#[derive(Debug)]
struct Cell(ConfigCell);

impl Cell {
    fn new(q: &TokenBucket) -> Cell {
        Cell(ConfigCell::new(q.words()))
    }

    fn load(&self) -> TokenBucket {
        TokenBucket::from_words(self.0.load().0)
    }

    /// Writes `q` and makes it current. Callers hold the writer lock.
    fn store(&self, q: &TokenBucket) {
        self.0.store(q.words());
    }
}

/// `Tiers::changed`: a tier's quota has been replaced.
const TIER_CHANGED: u64 = 1;
/// `Tiers::changed`: some key has an override.
const OVERRIDDEN: u64 = 2;
/// `Tiers::changed`: the table's decisions are counted (set at construction, for good), so
/// that the uncounted common decision tests this with the other two, in the same load.
const COUNTED: u64 = 4;

/// `Tiers::fast_until` for the flags `changed`: open while none is set.
fn fast_until(changed: u64, open: u64) -> u64 {
    if changed == 0 {
        open
    } else {
        0
    }
}

/// The tier table.
#[derive(Debug)]
pub(crate) struct Tiers {
    names: Box<[Box<str>]>,
    /// The quotas as built, read while no tier has changed (`changed & TIER_CHANGED` is 0).
    built: Box<[TokenBucket]>,
    /// `built[0]`, the default tier's, at a fixed place: the common decision reads it without
    /// an index or a bounds check.
    default: TokenBucket,
    cells: Box<[Cell]>,
    /// `TIER_CHANGED` once any tier's quota has been replaced (for good), `OVERRIDDEN` while
    /// any key has an override, and `COUNTED` if decisions are counted: one word, so that the
    /// common decision (default tier, quota as built, not counted) tests all three with one
    /// load.
    changed: AtomicU64,
    /// `open` while `changed` is 0, else 0: the common decision's one test, of its time since
    /// the origin against this, says both that the time is in range and that nothing changed
    /// ([`uncounted_default`](Tiers::uncounted_default)). Rewritten under `writer` after
    /// every change to `changed`, so that between changes it is `changed`'s image.
    fast_until: AtomicU64,
    /// One more than the times since the origin a decision may take as they are: the
    /// lifetime, or fewer where the origin is within a lifetime of 2^64 (then every time
    /// before the origin, wrapped, is above them; see [`new`](Tiers::new)).
    open: u64,
    /// The largest fill, in units, any tier may have, fixed at construction: a stamp more
    /// than this below now is a full bucket in every tier, whatever the tiers change to.
    max_fill: u64,
    /// The smallest fill, in units, any tier has ever had: it only goes down (a refund's bound,
    /// see `KeyedLimit::refund`). Written under `writer`.
    min_fill: AtomicU64,
    m: u64,
    lifetime: u64,
    writer: Mutex<()>,
}

impl Tiers {
    /// `quotas[0]` is the default. Each is compiled at the default's units per nanosecond.
    /// Fill times may later grow up to the largest built one or `headroom`, whichever is more.
    ///
    /// `origin` is the table's clock reading at creation: times since it are taken wrapped,
    /// `now − origin mod 2^64`, so that one compare rejects times before it as well as times
    /// past the lifetime ([`open`](Tiers::open)). That holds while the origin is at most
    /// `2^64 − 1 − lifetime`; a later origin shortens the span to what is left below 2^64 (no
    /// later time exists), and a time `t` before the origin wraps to `2^64 − origin + t`, above
    /// it. `counted`: the table counts its decisions, so that
    /// [`uncounted_default`](Tiers::uncounted_default) is always `None` and every `check`
    /// takes the path that counts it.
    pub(crate) fn new(
        tiers: &[(String, TokenBucket)],
        headroom: Nanos,
        fill_limit: u64,
        lifetime_units: u64,
        origin: Nanos,
        counted: bool,
    ) -> Result<Tiers, ConfigError> {
        if tiers.len() > MAX_TIERS {
            return Err(ConfigError::TooManyTiers { tiers: tiers.len() as u64, max: MAX_TIERS as u64 });
        }
        let m = tiers[0].1.units_per_nano();
        let lifetime = lifetime_units / m;
        let built = tiers
            .iter()
            .map(|(_, q)| q.in_units(m, fill_limit, lifetime))
            .collect::<Result<Box<[TokenBucket]>, ConfigError>>()?;
        let headroom = u128::from(headroom.as_u64()) * u128::from(m);
        if headroom > u128::from(fill_limit) {
            return Err(ConfigError::TierFillTooLong {
                fill_nanos: u64::try_from(headroom / u128::from(m)).unwrap_or(u64::MAX),
                max_nanos: fill_limit / m,
            });
        }
        #[expect(clippy::cast_possible_truncation, reason = "at most fill_limit")]
        let max_fill = built.iter().map(TokenBucket::fill_units).max().unwrap_or(0).max(headroom as u64);
        let min_fill = built.iter().map(TokenBucket::fill_units).min().unwrap_or(0);
        let open = lifetime.min(u64::MAX - origin.as_u64()) + 1;
        let changed = if counted { COUNTED } else { 0 };
        Ok(Tiers {
            names: tiers.iter().map(|(n, _)| n.as_str().into()).collect(),
            cells: built.iter().map(Cell::new).collect(),
            default: built[0],
            built,
            changed: AtomicU64::new(changed),
            fast_until: AtomicU64::new(fast_until(changed, open)),
            open,
            max_fill,
            min_fill: AtomicU64::new(min_fill),
            m,
            lifetime,
            writer: Mutex::new(()),
        })
    }

    /// The tier's quota as built, while no tier has been changed (`None` after a change: use
    /// [`get`](Tiers::get)). `tier` must be in range.
    #[inline]
    pub(crate) fn built(&self, tier: usize) -> Option<&TokenBucket> {
        // Relaxed: a reader that still sees no change reads the built quota, which is a quota
        // this tier had; the cells are valid from construction on.
        if self.changed.load(Relaxed) & TIER_CHANGED == 0 {
            Some(&self.built[tier])
        } else {
            None
        }
    }

    /// One more than the largest time since the origin that is in range (see
    /// [`new`](Tiers::new)).
    #[inline]
    pub(crate) fn open(&self) -> u64 {
        self.open
    }

    /// Changes `changed` to `f` of it, and `fast_until` to match, under the writer lock.
    fn note(&self, f: impl FnOnce(u64) -> u64) {
        let _guard = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.note_locked(f);
    }

    /// [`note`](Tiers::note), with the writer lock held: every writer of the two words holds
    /// it, so that each leaves `fast_until` the image of the `changed` it leaves.
    fn note_locked(&self, f: impl FnOnce(u64) -> u64) {
        // Relaxed: the lock orders the writers; readers read either word Relaxed, as a flag
        // whose news may come late (see `built` and `note_overrides`). The cells publish
        // themselves.
        let changed = f(self.changed.load(Relaxed));
        self.changed.store(changed, Relaxed);
        self.fast_until.store(fast_until(changed, self.open), Relaxed);
    }

    /// Whether the table counts its decisions.
    pub(crate) fn counted(&self) -> bool {
        self.changed.load(Relaxed) & COUNTED != 0
    }

    /// [`built`](Tiers::built) for the default tier, and only while no key has an override
    /// either: the quota of a key known to be in the default tier.
    #[inline]
    pub(crate) fn built_default(&self) -> Option<&TokenBucket> {
        // Relaxed: as in `built`, and as `Overrides::is_empty` (whose count this bit follows).
        if self.changed.load(Relaxed) & (TIER_CHANGED | OVERRIDDEN) == 0 {
            Some(&self.default)
        } else {
            None
        }
    }

    /// [`built_default`](Tiers::built_default), and only while decisions are not counted
    /// either and `e`, a time's nanoseconds since the table's origin (wrapped, see
    /// [`new`](Tiers::new)), is at or after the origin and at most the lifetime:
    /// for a `check` that nothing else need see. One load and one test for all four.
    #[inline]
    pub(crate) fn uncounted_default(&self, e: u64) -> Option<&TokenBucket> {
        // Relaxed: as in `built_default`.
        if e < self.fast_until.load(Relaxed) {
            Some(&self.default)
        } else {
            None
        }
    }

    /// The tier's current quota.
    pub(crate) fn get(&self, tier: usize) -> TokenBucket {
        match self.built(tier) {
            Some(q) => *q,
            None => self.cells[tier].load(),
        }
    }

    /// Replaces a tier's quota. Fails if its fill exceeds the table's largest.
    pub(crate) fn set(&self, tier: usize, quota: TokenBucket) -> Result<(), ConfigError> {
        let q = quota.in_units(self.m, self.max_fill, self.lifetime)?;
        let _guard = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Relaxed: read approximately by refunds, which only need it never to have been
        // larger than a fill a decision used; it is lowered before the cell is published.
        if q.fill_units() < self.min_fill.load(Relaxed) {
            self.min_fill.store(q.fill_units(), Relaxed);
        }
        self.cells[tier].store(&q);
        self.note_locked(|changed| changed | TIER_CHANGED);
        Ok(())
    }

    /// The smallest fill any tier has had, in units.
    pub(crate) fn min_fill(&self) -> u64 {
        // Relaxed: see `set`. `min_fill` is lowered before the cell is stored, and the cell
        // synchronizes itself (its Release publication pairs with a reader's Acquire load; the
        // Relaxed load of `changed` pairs with nothing): a decision that reads the new quota
        // from the cell sees the lowered fill.
        self.min_fill.load(Relaxed)
    }

    /// Notes whether any key has an override (`Overrides::set` and `clear` call it under
    /// their lock, with the count they leave, so that notes follow the count's order).
    fn note_overrides(&self, count: u64) {
        // Relaxed: as `Overrides::count`, which a decision read before this bit existed: a
        // decision that misses a new override is one ordered before it.
        self.note(|changed| if count == 0 { changed & !OVERRIDDEN } else { changed | OVERRIDDEN });
    }

    /// The largest fill any tier may have, in units.
    #[inline]
    pub(crate) fn max_fill(&self) -> u64 {
        self.max_fill
    }

    pub(crate) fn len(&self) -> usize {
        self.built.len()
    }

    /// Units per nanosecond, common to every tier.
    #[inline]
    pub(crate) fn units_per_nano(&self) -> u64 {
        self.m
    }

    /// Nanoseconds after creation at which time stops.
    #[inline]
    pub(crate) fn lifetime(&self) -> u64 {
        self.lifetime
    }

    pub(crate) fn find(&self, name: &str) -> Option<Tier> {
        #[expect(clippy::cast_possible_truncation, reason = "at most 255 tiers")]
        self.names.iter().position(|n| **n == *name).map(|i| Tier(i as u8))
    }

    pub(crate) fn name(&self, tier: usize) -> &str {
        &self.names[tier]
    }
}

const KIND_EMPTY: u64 = 0;
const KIND_LIVE: u64 = 1;
const KIND_TOMB: u64 = 2;
const KIND_WRITING: u64 = 3;

#[inline]
fn state(version: u64, kind: u64, tier: u8) -> u64 {
    version << 16 | kind << 8 | u64::from(tier)
}

#[derive(Debug)]
struct Entry<W: Words> {
    state: AtomicU64,
    key: W::Atomic,
}

/// Per-key tier overrides.
#[derive(Debug)]
pub(crate) struct Overrides<W: Words> {
    entries: crate::keyed::pages::Pages<Entry<W>>,
    mask: usize,
    count: AtomicU64,
    writer: Mutex<()>,
}

impl<W: Words> Overrides<W> {
    /// Room for `capacity` overrides (the map is twice that, rounded to a power of two).
    pub(crate) fn new(capacity: usize) -> Result<Overrides<W>, ConfigError> {
        let len = (capacity * 2).next_power_of_two().max(2);
        let entries = crate::keyed::pages::Pages::new(len, "the per-key overrides", || Entry {
            state: AtomicU64::new(state(0, KIND_EMPTY, 0)),
            key: W::new_atomic(),
        })?;
        Ok(Overrides { entries, mask: len - 1, count: AtomicU64::new(0), writer: Mutex::new(()) })
    }

    /// Whether any override is set: the decision path skips the lookup when not.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.count.load(Relaxed) == 0
    }

    /// The key's override, if any.
    pub(crate) fn get(&self, words: W, hash: u64) -> Option<Tier> {
        let start = (hash >> 8) as usize;
        let mut probe = 0;
        while probe <= self.mask {
            let e = &self.entries[(start + probe) & self.mask];
            // Acquire: pairs with the writer's Release of a LIVE state, after the key words.
            let before = e.state.load(Acquire);
            let key = W::load(&e.key, Relaxed);
            // Acquire fence: the key load happens before the second state load, so a rewrite
            // of the key shows up as a new version (pairs with the writer's Release fence).
            fence(Acquire);
            if e.state.load(Relaxed) != before {
                crate::sync::pause();
                continue; // rewritten meanwhile: look at this entry again
            }
            match before >> 8 & 0xff {
                KIND_EMPTY => return None,
                KIND_LIVE if key == words => {
                    #[expect(clippy::cast_possible_truncation, reason = "the low byte")]
                    return Some(Tier(before as u8));
                }
                _ => {}
            }
            probe += 1;
        }
        None
    }

    /// Sets the key's override. Fails when the map is full. `tiers` is told whether any
    /// override is set ([`Tiers::built_default`]).
    pub(crate) fn set(&self, words: W, hash: u64, tier: Tier, tiers: &Tiers) -> Result<(), UpdateError> {
        let _guard = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = (hash >> 8) as usize;
        let mut free = None;
        for probe in 0..=self.mask {
            let e = &self.entries[(start + probe) & self.mask];
            let s = e.state.load(Relaxed); // only writers change states, and we are the writer
            match s >> 8 & 0xff {
                KIND_LIVE if W::load(&e.key, Relaxed) == words => {
                    // Release: as below.
                    e.state.store(state((s >> 16) + 1, KIND_LIVE, tier.0), Release);
                    return Ok(());
                }
                KIND_EMPTY => {
                    free = free.or(Some(e));
                    break;
                }
                KIND_TOMB => free = free.or(Some(e)),
                _ => {}
            }
        }
        // At most half full, so that probes for absent keys end at an EMPTY entry soon.
        let half = self.entries.len() as u64 / 2;
        let Some(e) = free.filter(|_| self.count.load(Relaxed) < half) else {
            return Err(UpdateError::OverridesFull { max: half });
        };
        let v = e.state.load(Relaxed) >> 16;
        e.state.store(state(v + 1, KIND_WRITING, 0), Relaxed);
        // Release fence: the WRITING state is visible before the new key words (pairs with
        // the reader's Acquire fence).
        fence(Release);
        W::store(&e.key, words, Relaxed);
        // Counted (and noted in `tiers`) before it goes live: a reader that sees the LIVE state
        // (Acquire) sees the note too, so that a decision after `override_of` has found the
        // override never skips the lookup.
        tiers.note_overrides(self.count.fetch_add(1, Relaxed) + 1);
        // Release: the key words, and the note, happen-before the LIVE state (pairs with the
        // reader's Acquire).
        e.state.store(state(v + 2, KIND_LIVE, tier.0), Release);
        Ok(())
    }

    /// Removes the key's override. Returns whether there was one. `tiers` as in `set`.
    pub(crate) fn clear(&self, words: W, hash: u64, tiers: &Tiers) -> bool {
        let _guard = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = (hash >> 8) as usize;
        for probe in 0..=self.mask {
            let e = &self.entries[(start + probe) & self.mask];
            let s = e.state.load(Relaxed);
            match s >> 8 & 0xff {
                KIND_EMPTY => return false,
                KIND_LIVE if W::load(&e.key, Relaxed) == words => {
                    e.state.store(state((s >> 16) + 1, KIND_TOMB, 0), Release);
                    tiers.note_overrides(self.count.fetch_sub(1, Relaxed) - 1);
                    return true;
                }
                _ => {}
            }
        }
        false
    }

    /// Bytes the map owns.
    pub(crate) fn memory(&self) -> usize {
        self.entries.bytes()
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod fast_path_tests {
    use super::*;

    /// `uncounted_default`, the common decision's one test, opens only while nothing has
    /// changed and the time is in range, and follows every writer of the flags.
    #[test]
    fn the_fast_test_follows_every_change() {
        let q = TokenBucket::per_second(10).unwrap();
        let tiers = |origin: u64, counted: bool| {
            let quotas = [("default".to_owned(), q), ("gold".to_owned(), q)];
            Tiers::new(&quotas, Nanos::ZERO, 1 << 60, 1 << 61, Nanos::new(origin), counted).unwrap()
        };
        let t = tiers(0, false);
        let last = t.lifetime();
        assert!(t.uncounted_default(0).is_some() && t.uncounted_default(last).is_some());
        assert!(t.uncounted_default(last + 1).is_none(), "past the lifetime");
        t.note_overrides(1);
        assert!(t.uncounted_default(0).is_none(), "a key has an override");
        t.note_overrides(0);
        assert!(t.uncounted_default(0).is_some(), "no override left");
        t.set(1, TokenBucket::per_second(5).unwrap()).unwrap();
        assert!(t.uncounted_default(0).is_none(), "a tier changed, for good");
        t.note_overrides(0);
        assert!(t.uncounted_default(0).is_none(), "a tier changed, for good");

        let counted = tiers(0, true);
        assert!(counted.uncounted_default(0).is_none(), "counted");
        counted.note_overrides(0);
        assert!(counted.uncounted_default(0).is_none(), "counted, for good");

        // An origin near 2^64: the span is what is left below it, and every time before the
        // origin (wrapped) is above it.
        let origin = u64::MAX - 10;
        let late = tiers(origin, false);
        assert!(late.uncounted_default(10).is_some() && late.uncounted_default(11).is_none());
        for before in [0, 1, 1 << 20, origin - 1] {
            assert!(late.uncounted_default(before.wrapping_sub(origin)).is_none(), "time {before}");
        }
    }
}
