//! The table of [`Keyed<P, K>`](crate::Keyed) for any single-word [`KeyedPolicy`] per key (nginx's `limit_req`, the fixed
//! window, the sliding-window counter), in the same lock-free table as the token bucket.
//!
//! The table reuses a slot only when no thread can still commit on the old key, because a
//! slot's values only grow (see `table.rs`). A policy makes that hold by three promises (the
//! [`Rule`] contract): every word it stores is greater than the one it replaces; every word
//! below its *evictable* line decides exactly as a fresh key would, now and later; and that
//! line is never above a fresh key's first word. Each policy meets them as follows.
//!
//! - **Fixed window** (`index + 1 | count`): the index never moves back and counts only grow
//!   within a window. A word of an earlier window is a fresh key's; a fresh key's word is the
//!   current window with a count of 0.
//! - **Sliding-window counter** (`index + 1 | curr | prev`): as the fixed window. A word two
//!   windows old, or one window old with nothing counted in it, weighs nothing.
//! - **nginx** (`last | excess + 1000`): a field of 0 is a new node at `last` and at every
//!   later instant (its next arrival leaks to nothing, as a new node's first request passes
//!   with excess 0). A fresh key's word is a new node now; a word is evictable once its last
//!   request is more than `⌈(burst + 1000)·1000 / rate⌉` ms old (it has leaked its whole field).
//!   A time before a word's `last` counts as `last` (nginx's rule for a clock running back by
//!   more than 60 s would move `last` back, which the table cannot allow); keyed times must not
//!   run back anyway. When a slot's mark is above a new key's fresh word, the key starts on a
//!   *start word*, a new node a millisecond after the mark's `last`, which every thread decides
//!   as a new node's first request (at that millisecond if its clock is earlier).
//!
//! Two bits of every word are the table's, so a keyed limiter's clock stops at
//! [`Keyed::lifetime`], a quarter of the direct limiter's: 8.7 years for nginx; `2^(62 − b) − 4`
//! windows for the fixed window, where `b` is its count's width (2^38 − 4 for a limit up to
//! 2^24 − 1; at least 2^30 − 4 windows of a second, 34 years, above); `2^(62 − 2c) − 4` windows for the sliding window, where `c`
//! is the bits of its limit (at least 25 years, as construction of the direct one demands 100).
//! Past it, no window ends and nothing leaks: the limiter only denies, with `retry_after` and
//! `reset_after` at their largest (as the direct limiters past theirs).

use core::borrow::Borrow;
use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;

use super::key::{Key, KeyHasher, Words};
use super::table::{Rule, Shard, Table};
use super::{
    deny_or_allow, hashers, prefetch, shard_count, stats_of, table_slots, KeyedBuilder, KeyedStats, Target,
    WhenFull,
};
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::admit::Receipt;
use crate::engine::config::{ConfigCell, WORDS};
use crate::sync::{
    AtomicU64,
    Ordering::{Relaxed, Release},
};
use crate::{Clock, ConfigError, Counters, Decision, Nanos, Outcome, Policy, UpdateError};

pub(crate) mod sealed {
    use crate::{Decision, Nanos, Policy};

    /// What a policy must provide to live in a keyed table (see the module docs). Sealed: the
    /// table's safety rests on these answers.
    /// The algorithms a keyed table can hold.
    pub trait Algorithm {}

    pub trait KeyedWords: Policy + Clone {
        /// The algorithm's name, for error messages.
        const NAME: &'static str;
        /// `new`, as it takes over a table built with `self`: the table keeps reclaiming words
        /// by `self`'s lines (`fresh`, `evictable`, `above`), so `new` must decide every word
        /// below them as a fresh key's too, and read every stored word as the same state.
        fn keyed_update(&self, new: Self) -> Result<Self, crate::UpdateError>;
        /// Elapsed time is clamped here, so that every word stays below 2^62 − 1.
        fn keyed_lifetime(&self) -> Nanos;
        /// The most units one decision can admit or count (a larger `n` is refused as a peek,
        /// without reaching the word).
        fn most_at_once(&self) -> u64;
        /// The first word of a key never seen, at `elapsed`.
        fn fresh(&self, elapsed: Nanos) -> u64;
        /// Words strictly below this decide as `fresh(elapsed)` does, at `elapsed` and later.
        fn evictable(&self, elapsed: Nanos) -> u64;
        /// The least word at or above `mark` (an evicted word + 1, at most one above a word the
        /// policy stored) that is a state with nothing counted: a slot's next key starts there
        /// when the mark is above its fresh word. Stays below 2^62 − 1.
        fn above(&self, mark: u64) -> u64;
        /// [`Policy::decide`] on a keyed word: every stored word is greater than `word`. The
        /// policy's own decision unless its keyed clock differs (nginx's). On a start word
        /// `above` gave, a new key's first decision, whichever thread makes it (a helper may
        /// have made the slot live with the start word before its inserter decided).
        #[inline(always)]
        fn decide_keyed(&self, word: u64, elapsed: Nanos, n: u64) -> (Option<u64>, Decision) {
            self.decide(word, elapsed, n)
        }
    }
}

/// A [`Policy`] that a keyed table can hold: [`Nginx`](crate::Nginx),
/// [`FixedWindow`](crate::FixedWindow) and [`SlidingWindow`](crate::SlidingWindow). See
/// [`Keyed`](crate::Keyed).
pub trait KeyedPolicy: Policy + sealed::KeyedWords {}

impl<P: Policy + sealed::KeyedWords> KeyedPolicy for P {}

/// One decision's instant, for the table: `policy` decides, `lines` (the policy the table was
/// built with) says which words are a fresh key's. They differ once the policy has been
/// replaced at runtime ([`Keyed::set_policy`](crate::Keyed::set_policy)).
pub(crate) struct PolicyNow<'a, P> {
    policy: &'a P,
    lines: &'a P,
    elapsed: Nanos,
    hasher: &'a ahash::RandomState,
    when_full: WhenFull,
}

impl<P: KeyedPolicy> Rule for PolicyNow<'_, P> {
    type Taken = Decision;
    const GHOSTS: bool = false;

    #[inline]
    fn fresh(&self) -> u64 {
        self.lines.fresh(self.elapsed)
    }

    #[inline]
    fn evictable(&self) -> u64 {
        self.lines.evictable(self.elapsed)
    }

    #[inline]
    fn start(&self, first: u64, hwm: u64) -> u64 {
        if hwm <= first {
            first
        } else {
            self.lines.above(hwm)
        }
    }

    #[inline(always)]
    fn decide(&self, w: u64, n: u64) -> Result<(u64, Decision), Decision> {
        stored(w, self.policy.decide_keyed(w, self.elapsed, n))
    }

    #[inline(always)]
    fn taken(&self, d: Decision) -> Decision {
        d
    }

    #[inline]
    fn hasher(&self) -> &ahash::RandomState {
        self.hasher
    }

    #[inline]
    fn when_full(&self) -> WhenFull {
        self.when_full
    }
}

/// [`PolicyNow`] for a charge: also keeps the words its admission stored (the value it
/// replaced and its own), for the receipt. The table calls `taken` for the admission it
/// returns, last (after its CAS, or, for a new key's first decision, just before the CAS that
/// makes the slot live; if that CAS fails the key is decided again and `taken` called again,
/// or the decision is a refusal, which gets no receipt).
struct ChargeNow<'a, P> {
    rule: PolicyNow<'a, P>,
    stored: Cell<Option<(u64, u64)>>,
}

impl<P: KeyedPolicy> Rule for ChargeNow<'_, P> {
    type Taken = (Decision, u64, u64);
    const GHOSTS: bool = false;

    #[inline]
    fn fresh(&self) -> u64 {
        self.rule.fresh()
    }

    #[inline]
    fn evictable(&self) -> u64 {
        self.rule.evictable()
    }

    #[inline]
    fn start(&self, first: u64, hwm: u64) -> u64 {
        self.rule.start(first, hwm)
    }

    #[inline]
    fn decide(&self, w: u64, n: u64) -> Result<(u64, (Decision, u64, u64)), Decision> {
        self.rule.decide(w, n).map(|(next, d)| (next, (d, w, next)))
    }

    #[inline]
    fn decide_first(&self, first: u64, start: u64, n: u64) -> Result<(u64, (Decision, u64, u64)), Decision> {
        self.rule.decide_first(first, start, n).map(|(next, d)| (next, (d, start, next)))
    }

    #[inline]
    fn taken(&self, (d, prior, stored): (Decision, u64, u64)) -> Decision {
        self.stored.set(Some((prior, stored)));
        d
    }

    fn hasher(&self) -> &ahash::RandomState {
        self.rule.hasher
    }

    fn when_full(&self) -> WhenFull {
        self.rule.when_full
    }
}

impl<P: KeyedPolicy, K: Key + ?Sized, C: Clock> PolicyTable<P, K, C> {
    pub(crate) fn charge_words(&self, words: K::Words, n: u64) -> (Decision, Option<Receipt>) {
        let l = self;
        let t = l.target(words);
        prefetch(t.group);
        let elapsed = l.elapsed(l.clock.now());
        let current = l.current();
        let rule = ChargeNow { rule: l.rule_under(&current, elapsed), stored: Cell::new(None) };
        let d = l.decide_with(&current, &t, elapsed, n, &rule);
        // Receipts for counted admissions only: an `Untracked` admission charged nothing
        // (issue 13, bug 3: a commit whose slot was evicted before the retry found the table
        // full could otherwise hand back the words of a charge that no longer stands).
        let receipt = match rule.stored.get() {
            Some((prior, stored)) if matches!(d.outcome(), Outcome::Allowed | Outcome::Delayed) => {
                Some(Receipt::new(l.id, t.hash, [prior, stored, 0], n))
            }
            _ => None,
        };
        (d, receipt)
    }

    /// Through the policy's [`Policy::refund`], as the direct limiter's (windows exactly while
    /// the window still counts; nginx exactly if nothing changed the key since), on the key's
    /// slot, one refund per shard at a time, never below the evictable line. Nothing if the key
    /// was evicted meanwhile (its state had become a fresh key's: the charge was absorbed).
    pub(crate) fn refund_words(&self, words: K::Words, r: Receipt) {
        let l = self;
        let t = l.target(words);
        let Some(([prior, stored, _], n)) = r.take(l.id, t.hash) else { return };
        let step = |w: u64| {
            // After the word's Acquire load (in `Shard::refund`), as the bucket's refunds: the
            // clamp below is then no earlier than the decisions the word reflects.
            crate::sync::clock_after_loads();
            let elapsed = l.elapsed(l.clock.now());
            let next = l.current().refund(w, prior, stored, elapsed, n)?;
            Some(next.max(l.policy.evictable(elapsed)))
        };
        t.shard.refund(t.words, t.home, step);
    }
}

/// A policy's answer on `w` in the table's terms: the word to store, or the final decision.
#[inline(always)]
fn stored(w: u64, answer: (Option<u64>, Decision)) -> Result<(u64, Decision), Decision> {
    match answer {
        (Some(next), d) => {
            debug_assert!(next > w && next <= super::table::MAX_UNITS, "{w} → {next}");
            Ok((next, d))
        }
        (None, d) => Err(d),
    }
}

#[doc(hidden)]
pub struct PolicyTable<P: KeyedPolicy, K: Key + ?Sized, C: Clock> {
    table: Table<K::Words>,
    /// The policy the table was built with: its lines say which words are a fresh key's, and
    /// it decides until the first change.
    policy: P,
    /// Nonzero once the policy has been replaced: decisions then read `config`.
    changed: AtomicU64,
    config: ConfigCell,
    writer: Mutex<()>,
    lifetime: Nanos,
    when_full: WhenFull,
    hasher: ahash::RandomState,
    pub(crate) fingerprint: KeyHasher,
    origin: Nanos,
    clock: C,
    /// The identity its receipts carry.
    id: u64,
    _key: PhantomData<fn(&K)>,
}

impl<P: KeyedPolicy, K: Key + ?Sized, C: Clock> PolicyTable<P, K, C> {
    /// Time since creation, stopped at the lifetime.
    #[inline]
    fn elapsed(&self, now: Nanos) -> Nanos {
        now.saturating_sub(self.origin).min(self.lifetime)
    }

    #[inline]
    fn rule(&self, elapsed: Nanos) -> PolicyNow<'_, P> {
        self.rule_under(&self.policy, elapsed)
    }

    /// The rule of a decision under `policy`, with the table's own lines.
    #[inline]
    fn rule_under<'a>(&'a self, policy: &'a P, elapsed: Nanos) -> PolicyNow<'a, P> {
        PolicyNow { policy, lines: &self.policy, elapsed, hasher: &self.hasher, when_full: self.when_full }
    }

    /// The current policy: as built, or as last set by [`set_config`](PolicyTable::set_config).
    fn current(&self) -> P {
        // Relaxed: a reader that still sees 0 uses the policy as built, which the table had;
        // the cell is valid from construction on and its loads are Acquire.
        if self.changed.load(Relaxed) == 0 {
            return self.policy.clone();
        }
        P::from_config_words(self.config.load().0).unwrap_or_else(|| self.policy.clone())
    }

    /// Replaces the policy (see [`Keyed::set_policy`](crate::Keyed::set_policy)).
    pub(crate) fn set_config(&self, new: P) -> Result<(), UpdateError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let published = self.policy.keyed_update(new)?;
        let words = published.config_words().ok_or(UpdateError::Unsupported)?;
        self.config.store(words);
        // Release, belt and braces: the readers' load of `changed` is Relaxed, so nothing
        // pairs with it. None needs to: the cell synchronizes itself, and both its buffers
        // hold the built policy from construction on, so a reader that sees the flag before
        // the new buffer decides under the old policy, whole (as `Direct::set_policy`).
        self.changed.store(1, Release);
        Ok(())
    }

    /// A decision once the policy has been replaced: under the current policy, with the
    /// table's lines. Out of line, so that the common path stays one straight function.
    #[cold]
    #[inline(never)]
    fn decide_changed(&self, words: K::Words, hash: u64, elapsed: Nanos, n: u64) -> Decision {
        let current = self.current();
        let t = self.locate(words, hash);
        if n.wrapping_sub(1) >= current.most_at_once() {
            return self.peek_target(&t, elapsed, n);
        }
        let d = t.shard.acquire(t.words, t.hash, t.home, &self.rule_under(&current, elapsed), n);
        self.past_lifetime(d, elapsed)
    }

    /// Starts fetching the key's home group ([`Keyed::prefetch`](crate::Keyed::prefetch)).
    #[inline(always)]
    pub(crate) fn prefetch_words(&self, words: K::Words) {
        let t = self.target(words);
        prefetch(t.group);
    }

    #[inline]
    fn target(&self, words: K::Words) -> Target<'_, K::Words> {
        self.locate(words, words.hash_with(&self.hasher))
    }

    #[inline]
    fn locate(&self, words: K::Words, hash: u64) -> Target<'_, K::Words> {
        Target::new(&self.table, words, hash)
    }

    /// `n` units for `key` now, all or none, with the policy's answer for `n = 0` and for
    /// more than it can ever admit (neither inserts the key).
    #[inline(always)]
    pub(crate) fn check_n_words(
        &self,
        words: K::Words,
        n: u64,
        counters: &Option<Arc<Counters>>,
    ) -> Decision {
        // Hash and start fetching the key's group before reading the clock, as the bucket does.
        let t = self.target(words);
        prefetch(t.group);
        super::tally(self.decide(&t, self.elapsed(self.clock.now()), n), counters)
    }

    /// [`check_n`](Keyed::check_n) at a caller-supplied `now`. Times must not run back: a key
    /// is evicted once its state is a fresh key's as of the latest time the table was given,
    /// and a decision at an earlier time may then find it gone (a new key's state as of that
    /// later time: never more permissive, as a stored window never moves back, but not what the
    /// earlier time alone would give).
    #[inline(always)]
    pub(crate) fn check_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        let t = self.target(words);
        self.decide(&t, self.elapsed(now), n)
    }

    /// A decision under the policy's own rule: what [`decide_with`](Keyed::decide_with) does
    /// for a charge, with the common case (the key live in its home group) inline and the rest
    /// out of line. The out-of-line paths take the key's words and hash, not the target or the
    /// rule by reference, which would make every decision store them to memory (as
    /// `KeyedLimiter::decide_in`).
    #[inline(always)]
    fn decide(&self, t: &Target<'_, K::Words>, elapsed: Nanos, n: u64) -> Decision {
        // Relaxed: as in `current`.
        if self.changed.load(Relaxed) != 0 {
            return self.decide_changed(t.words, t.hash, elapsed, n);
        }
        if self.beyond_reach(n) {
            return self.peek_located(t.words, t.hash, elapsed, n);
        }
        let d = match Shard::probe_group(t.group, t.words, &self.rule(elapsed), n) {
            Some(d) => d.decision(),
            None => self.decide_beyond_home(t.words, t.hash, elapsed, n),
        };
        self.past_lifetime(d, elapsed)
    }

    /// `n = 0` reports and an `n` the policy can never admit is refused: neither inserts the
    /// key (both are peeks).
    #[inline(always)]
    fn beyond_reach(&self, n: u64) -> bool {
        n.wrapping_sub(1) >= self.policy.most_at_once()
    }

    #[inline(never)]
    fn decide_beyond_home(&self, words: K::Words, hash: u64, elapsed: Nanos, n: u64) -> Decision {
        let t = self.locate(words, hash);
        t.shard.acquire_next(words, hash, t.home, &self.rule(elapsed), n)
    }

    #[cold]
    fn peek_located(&self, words: K::Words, hash: u64, elapsed: Nanos, n: u64) -> Decision {
        self.peek_target(&self.locate(words, hash), elapsed, n)
    }

    /// A decision through `rule` ([`ChargeNow`]: a charge, which records what it stored),
    /// decided under `policy`.
    #[inline(always)]
    fn decide_with<R: Rule>(
        &self,
        policy: &P,
        t: &Target<'_, K::Words>,
        elapsed: Nanos,
        n: u64,
        rule: &R,
    ) -> Decision {
        if n.wrapping_sub(1) >= policy.most_at_once() {
            return self.peek_target(t, elapsed, n);
        }
        self.past_lifetime(t.shard.acquire(t.words, t.hash, t.home, rule, n), elapsed)
    }

    /// `d`, or, for a denial once the clock has stopped at the lifetime, the same denial with
    /// no wait that helps.
    #[inline(always)]
    fn past_lifetime(&self, d: Decision, elapsed: Nanos) -> Decision {
        if d.outcome() == Outcome::Denied && elapsed == self.lifetime {
            Self::stopped(&d)
        } else {
            d
        }
    }

    /// A denial once the clock has stopped at the lifetime: no window ends and nothing leaks
    /// any more, so no wait helps (the policy's own answer would be the wait to a window end
    /// that never comes).
    #[cold]
    fn stopped(d: &Decision) -> Decision {
        Decision::from_nanos(
            Outcome::Denied,
            u32::try_from(d.remaining()).unwrap_or(u32::MAX),
            Nanos::MAX,
            Nanos::MAX,
        )
    }

    /// What [`check_n`](Keyed::check_n) would answer at `now`, without counting anything.
    pub(crate) fn peek_n_at_words(&self, words: K::Words, now: Nanos, n: u64) -> Decision {
        let t = self.target(words);
        self.peek_target(&t, self.elapsed(now), n)
    }

    fn peek_target(&self, t: &Target<'_, K::Words>, elapsed: Nanos, n: u64) -> Decision {
        let word = t.shard.find(t.words, t.home).unwrap_or_else(|| self.policy.fresh(elapsed));
        self.past_lifetime(self.current().decide_keyed(word, elapsed, n).1, elapsed)
    }

    /// [`check_batch`](Keyed::check_batch) at a caller-supplied `now`.
    #[inline(always)]
    pub(crate) fn check_batch_at<Q: Borrow<K>>(
        &self,
        now: Nanos,
        items: &[(Q, u64)],
        out: &mut [Decision],
    ) -> usize {
        let elapsed = self.elapsed(now);
        super::batch(
            &self.table,
            items,
            out,
            |key: &K| {
                let words = key.words(&self.fingerprint);
                (words, words.hash_with(&self.hasher))
            },
            |t, n| self.decide(t, elapsed, n),
        )
    }

    /// Evicts every key whose state is a fresh key's, and returns how many.
    pub(crate) fn sweep(&self) -> usize {
        let below = self.policy.evictable(self.elapsed(self.clock.now()));
        self.table.shards().map(|s| s.sweep(below, &self.hasher)).sum()
    }

    /// Keys tracked now, approximately under concurrent inserts.
    pub(crate) fn len(&self) -> u64 {
        self.table.shards().map(|s| s.len()).sum()
    }

    /// The most keys the table holds (7/8 of its slots).
    pub(crate) fn capacity(&self) -> u64 {
        self.table.shards().map(|s| s.capacity()).sum()
    }

    /// Bytes the table owns.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.table.memory()
    }

    /// A snapshot of the table's figures (`forced_evictions` is always 0). Walks every slot.
    pub(crate) fn stats(&self) -> KeyedStats {
        stats_of(&self.table, &self.hasher, self.memory_bytes())
    }

    /// Inserts, clean evictions and forced evictions, from the shards' counters.
    pub(crate) fn table_counts(&self) -> [u64; 3] {
        self.table.shards().map(|s| s.counts()).fold([0; 3], |[a, b, c], [x, y, z]| [a + x, b + y, c + z])
    }

    /// How long after its creation this limiter's clock runs (see the module docs).
    pub(crate) fn lifetime(&self) -> Nanos {
        self.lifetime
    }

    /// The policy every key is decided by.
    pub(crate) fn policy(&self) -> P {
        self.current()
    }

    /// The clock.
    pub(crate) fn when_full(&self) -> WhenFull {
        self.when_full
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}

impl<P: KeyedPolicy + fmt::Debug, K: Key + ?Sized, C: Clock> fmt::Debug for PolicyTable<P, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyTable")
            .field("policy", &self.policy)
            .field("capacity", &self.capacity())
            .field("when_full", &self.when_full)
            .finish_non_exhaustive()
    }
}

/// Builds a policy's table.
pub(crate) fn build<P: KeyedPolicy, K: Key + ?Sized, C: Clock>(
    b: KeyedBuilder<P, K>,
    clock: C,
) -> Result<PolicyTable<P, K, C>, ConfigError> {
    deny_or_allow(b.when_full, P::NAME)?;
    let (slots, shards) = table_slots(b.capacity, shard_count(b.shards)?)?;
    let (place, fingerprint) = hashers(b.seeds);
    let origin = clock.now();
    let config = ConfigCell::new(b.config.config_words().unwrap_or([0; WORDS]));
    Ok(PolicyTable {
        changed: AtomicU64::new(0),
        config,
        writer: Mutex::new(()),
        table: Table::new(slots, shards)?,
        lifetime: b.config.keyed_lifetime(),
        policy: b.config,
        when_full: b.when_full,
        hasher: place,
        fingerprint,
        origin,
        clock,
        id: crate::sync::next_id(),
        _key: PhantomData,
    })
}
