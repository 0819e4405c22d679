//! The keyed table's protocols (`src/keyed/table.rs`): the header CAS that serializes
//! membership (with helping), eviction (LIVE → LOCKED → bump → VACANT/CLAIMED), and slot reuse
//! under a stale reader. Under loom a shard is 4 slots in 2 groups of 2, and every key's window
//! is the whole shard. Each model checks that no key's tokens leak into another's and that every
//! key's tokens are conserved.

#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, model_bounded, slot_winner};
use tollgate::{KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Outcome, Rate, Tier, TokenBucket};

type Table = KeyedLimiter<u64, ManualClock>;

/// One token per `per_token` ns, `burst` tokens.
fn table(per_token: u64, burst: u64) -> Arc<Table> {
    let q = TokenBucket::new(Rate::per(1, std::time::Duration::from_nanos(per_token)), burst).unwrap();
    let l = KeyedBuilder::new(q)
        .capacity(3)
        .shards(1)
        .seeds([1, 2, 3, 4, 5, 6, 7, 8])
        .build_with_clock(ManualClock::new())
        .unwrap();
    Arc::new(l)
}

fn spawn_check(l: &Arc<Table>, key: u64, at: u64) -> thread::JoinHandle<Outcome> {
    let l = Arc::clone(l);
    thread::spawn(move || l.check_at(&key, Nanos::new(at)).outcome())
}

/// Two threads insert the same new key, with one token in its bucket: exactly one is
/// admitted. Two slots for one key would each start full and admit both. Covers helping: a
/// thread that finds the other's commit not yet live makes it live itself.
#[test]
fn same_key_inserts_share_one_bucket() {
    model(|| {
        let l = table(100, 1);
        let a = spawn_check(&l, 7, 0);
        let b = spawn_check(&l, 7, 0);
        let allowed =
            [a.join().unwrap(), b.join().unwrap()].iter().filter(|o| **o == Outcome::Allowed).count();
        assert_eq!(allowed, 1);
        assert_eq!(l.len(), 1);
        assert_eq!(l.peek_n_at(&7, Nanos::ZERO, 0).remaining(), 0);
    });
}

/// A decision races the eviction of the same key. The key is full (strictly) at 1,000 ns;
/// one thread takes a token, the other sweeps. Either the sweep wins and the decision inserts
/// the key afresh, or the decision wins and the sweep leaves the key alone: in both orders the
/// key ends with exactly burst − 1 tokens.
#[test]
fn decision_races_eviction() {
    model(|| {
        let l = table(100, 2);
        assert!(l.check_at(&7, Nanos::ZERO).is_allowed());
        l.clock().set(Nanos::new(1_000));
        let a = spawn_check(&l, 7, 1_000);
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        assert_eq!(a.join().unwrap(), Outcome::Allowed);
        let swept = sweeper.join().unwrap();
        assert!(swept <= 1);
        assert_eq!(l.peek_n_at(&7, Nanos::new(1_000), 0).remaining(), 1);
        assert_eq!(l.len(), 1);
    });
}

/// A slot is evicted and reused for another key while a stale reader is mid-decision on the
/// old key. One token per 1,000 ns, burst 2: key 4 spends a token at 0 ns, keys 1, 2, 3 at
/// 500 ns, so at 1,200 ns key 4's bucket alone is full. The table holds 4 keys, so inserting
/// key 9 at 1,200 ns must evict key 4 and reuse its slot,
/// while another thread decides on key 4. Exactly one of the two gets a bucket: the other finds
/// the table full. The winner has burst − 1 tokens, the loser's bucket is untouched, and keys
/// 1 to 3 are undisturbed: no token moved between keys.
#[test]
fn reuse_under_a_stale_reader() {
    model(|| {
        let l = table(1_000, 2);
        assert!(l.check_at(&4, Nanos::ZERO).is_allowed());
        for k in 1..=3 {
            assert!(l.check_at(&k, Nanos::new(500)).is_allowed());
        }
        assert_eq!(l.len(), 4);
        let stale = spawn_check(&l, 4, 1_200);
        let reuse = spawn_check(&l, 9, 1_200);
        let (four, nine) = (stale.join().unwrap(), reuse.join().unwrap());
        let level = |k: u64| l.peek_n_at(&k, Nanos::new(1_200), 0).remaining();
        let (winner, loser) = slot_winner((4, four), (9, nine));
        assert_eq!((level(winner), level(loser)), (1, 2));
        for k in 1..=3 {
            assert_eq!(level(k), 1, "key {k} was disturbed");
        }
        assert_eq!(l.len(), 4);
    });
}

/// A tier's quota replaced twice (so the writer flips back to the buffer it started from)
/// while another thread reads it: every read is one of the three quotas whole, never a mix of
/// two (`src/keyed/tiers.rs`, the double-buffered sequence lock). A torn read needs one
/// preemption (the reader stopped inside the buffer the writer rewrites): with the `seq`
/// re-check removed, this model fails at a bound of 2 in seconds; at 3 it took over 8 minutes.
#[test]
fn tier_quota_reads_are_never_torn() {
    model_bounded(2, || {
        let a = TokenBucket::new(Rate::per_second(1), 1).unwrap();
        let b = TokenBucket::new(Rate::per_second(2), 2).unwrap();
        let c = TokenBucket::new(Rate::per_second(4), 4).unwrap();
        let l = Arc::new(
            KeyedLimiter::<u64>::builder(a)
                .capacity(3)
                .shards(1)
                .max_fill_time(std::time::Duration::from_secs(1))
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        let writer = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                l.set_tier_quota(Tier::DEFAULT, b).unwrap();
                l.set_tier_quota(Tier::DEFAULT, c).unwrap();
            })
        };
        let read = l.tier_quota(Tier::DEFAULT);
        let (burst, tokens) = (read.burst(), read.rate().tokens());
        assert!(matches!((burst, tokens), (1, 1) | (2, 2) | (4, 4)), "torn: {burst} {tokens}");
        writer.join().unwrap();
        assert_eq!(l.tier_quota(Tier::DEFAULT).burst(), 4);
    });
}

/// An override is cleared and its entry reused for another key while a reader looks up a
/// third key made of the first key's high word and the second key's low word: a torn read of
/// the two-word key must not match it, and the first key reads as its tier or none, never the
/// second key's (`src/keyed/tiers.rs`, the versioned entry). Four second keys, so that some
/// hash to the first key's entry and reuse it (the map has two entries).
#[test]
fn override_reuse_never_leaks_a_tier() {
    for second in 2..6u128 {
        override_reuse(second);
    }
}

fn override_reuse(second: u128) {
    model(move || {
        let q = TokenBucket::per_second(1).unwrap();
        let l: Arc<KeyedLimiter<u128, ManualClock>> = Arc::new(
            KeyedBuilder::new(q)
                .tier("pro", q)
                .tier("free", q)
                .capacity(3)
                .shards(1)
                .max_overrides(1)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        let (pro, free) = (l.tier("pro").unwrap(), l.tier("free").unwrap());
        let (a, b, mix) = (1u128 << 64 | 1, second << 64 | second, 1u128 << 64 | second);
        l.set_override(&a, pro).unwrap();
        let writer = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                assert!(l.clear_override(&a));
                l.set_override(&b, free).unwrap();
            })
        };
        assert_eq!(l.override_of(&mix), None);
        let seen = l.override_of(&a);
        assert!(seen.is_none() || seen == Some(pro), "key a read as {seen:?}");
        writer.join().unwrap();
        assert_eq!((l.override_of(&a), l.override_of(&b)), (None, Some(free)));
    });
}

/// Issue 13, bug 1: two threads insert one key under a tier with a short fill, and the loser
/// of the home header's CAS, finding the winner in its scan, gives its claimed slot back. The
/// slot must go back to the mark it had before the claim, not to the loser's first stamp: a
/// stamp a fresh bucket of a *short* fill takes is an almost empty bucket of a long one, and the
/// next key placed there, in the default tier, would start with 1 token of its 100.
///
/// Default tier: one token per 100 ns, burst 100 (fill 10 µs); tier "fast": burst 1 (fill
/// 100 ns). Key 7 is in "fast"; keys 1 and 2 (default) are inserted after the race, at the same
/// instant, into the slots left (capacity 3 of 4 slots, so one of them gets the given-up slot
/// whenever there was one): each must have 99 left after its first token.
#[test]
fn a_given_up_claim_leaves_no_stamp() {
    model(|| {
        const T: u64 = 1_000_000;
        let per =
            |burst| TokenBucket::new(Rate::per(1, std::time::Duration::from_nanos(100)), burst).unwrap();
        let l: Arc<Table> = Arc::new(
            KeyedBuilder::new(per(100))
                .tier("fast", per(1))
                .capacity(3)
                .shards(1)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        l.set_override(&7, l.tier("fast").unwrap()).unwrap();
        let a = spawn_check(&l, 7, T);
        let b = spawn_check(&l, 7, T);
        let mut outcomes = [a.join().unwrap(), b.join().unwrap()];
        outcomes.sort_by_key(|o| *o != Outcome::Allowed);
        assert_eq!(outcomes, [Outcome::Allowed, Outcome::Denied]);
        for k in [1, 2] {
            let d = l.check_at(&k, Nanos::new(T));
            assert!(d.is_allowed(), "key {k}: {d:?}");
            assert_eq!(d.remaining(), 99, "key {k} started in a slot holding another tier's stamp");
        }
    });
}

/// Keys `(v, v2, k3, k4)`, where `v` and `v2` share a home group in a model's table (two groups
/// per shard under loom, chosen by the table's placement of the hash; see `table`'s seeds).
fn same_home_keys() -> (u64, u64, u64, u64) {
    let place = ahash::RandomState::with_seeds(1, 2, 3, 4);
    let home = |k: u64| tollgate::loom_home_of(place.hash_one(k));
    let v = 1;
    let v2 = (2..).find(|&k| home(k) == home(v)).unwrap();
    let mut others = (2..).filter(|&k| k != v2);
    (v, v2, others.next().unwrap(), others.next().unwrap())
}

/// Issue 13, a suspected refusal, confirmed: `force` (`WhenFull::EvictFullest`) leaves the
/// victim's ghost in its home before its LOCKED CAS. If a decision on the victim lands in
/// between, the CAS fails, and the ghost names a key still live; it cannot be taken back
/// (another forcer of the same victim may rely on the same value), and it refused every other
/// forced eviction into that home for up to the largest fill. Now the forcer evicts the victim
/// on its new word instead.
///
/// One token per 10 ms, burst 4; the table holds 4 keys, none full. `v` is the oldest bucket,
/// `v2` the next, in the same home. At 3 ms a new key forces room while `v` takes a token
/// (which makes `v2` the oldest): the new key is admitted in every interleaving, and `v` never
/// has more than its bucket allows.
#[test]
fn a_forced_eviction_racing_its_victim_still_makes_room() {
    let (v, v2, k3, k4) = same_home_keys();
    model(move || {
        const MS: u64 = 1_000_000;
        let q = TokenBucket::new(Rate::per(1, std::time::Duration::from_millis(10)), 4).unwrap();
        let l: Arc<Table> = Arc::new(
            KeyedBuilder::new(q)
                .capacity(3)
                .shards(1)
                .when_full(tollgate::WhenFull::EvictFullest)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        for (k, at) in [(v, 0), (v2, MS), (k3, 2 * MS), (k4, 2 * MS)] {
            assert!(l.check_at(&k, Nanos::new(at)).is_allowed());
        }
        assert_eq!(l.len(), 4);
        let newcomer = spawn_check(&l, 99, 3 * MS);
        let victim = spawn_check(&l, v, 3 * MS);
        let (n, b) = (newcomer.join().unwrap(), victim.join().unwrap());
        assert_eq!(n, Outcome::Allowed, "the new key was refused room");
        // `v` had 3 tokens at 3 ms (4, less the one at 0 ms); tracked again or read through its
        // ghost, it has at most that, less what the racing decision took.
        let left = l.peek_n_at(&v, Nanos::new(3 * MS), 0).remaining();
        assert!(left <= 3 - u64::from(b == Outcome::Allowed), "v has {left} after {b:?}");
    });
}

/// Issue 13: two *different* new keys that share a home group commit at once. Each claims a
/// slot and races for the home header's CAS; the loser keeps its claim (`acquire_slow`'s
/// `claim`), scans again, does not find its key, and commits the same slot under the new
/// header. Both keys are admitted, each in a slot of its own with one token taken (a second
/// decision takes its last token, a third is refused), and no slot is lost to the race: the
/// table (4 slots under loom, all usable) still takes two more keys. Checked by mutation: a
/// loser that drops its claim after a failed CAS (`claim = None`, its slot left CLAIMED) claims
/// a second slot, and the fourth key finds the table full.
#[test]
fn two_new_keys_of_one_home_commit_with_a_kept_claim() {
    let (v, v2, k3, k4) = same_home_keys();
    model(move || {
        let l = table(1_000, 2);
        let a = spawn_check(&l, v, 0);
        let b = spawn_check(&l, v2, 0);
        assert_eq!((a.join().unwrap(), b.join().unwrap()), (Outcome::Allowed, Outcome::Allowed));
        assert_eq!(l.len(), 2);
        for k in [v, v2] {
            assert_eq!(l.check_at(&k, Nanos::ZERO).outcome(), Outcome::Allowed, "key {k}");
            assert_eq!(l.check_at(&k, Nanos::ZERO).outcome(), Outcome::Denied, "key {k} inserted twice");
        }
        for k in [k3, k4] {
            assert_eq!(l.check_at(&k, Nanos::ZERO).outcome(), Outcome::Allowed, "no room for key {k}");
        }
        assert_eq!(l.len(), 4);
    });
}

/// Keys `(a, b, others)` for the helper models: `b` in `a`'s home group when `same_home`, in
/// the other one when not, and three more keys distinct from both.
fn helper_keys(same_home: bool) -> (u64, u64, [u64; 3]) {
    let place = ahash::RandomState::with_seeds(1, 2, 3, 4);
    let home = |k: u64| tollgate::loom_home_of(place.hash_one(k));
    let a = 1;
    let b = (2..).find(|&k| (home(k) == home(a)) == same_home).unwrap();
    let mut others = (2..).filter(|&k| k != b);
    (a, b, [others.next().unwrap(), others.next().unwrap(), others.next().unwrap()])
}

/// Issue 13: `help`'s header re-check, and the version bump of the *evicted* key's home. A
/// thread deciding on key `a` misses it in its probes (its commit is not live yet), reads the
/// header naming that commit, and stalls; `a` goes live, fills, and is evicted by a new key
/// `b`, whose claim takes `a`'s slot. The stalled thread then reads the slot: CLAIMED again,
/// but `b`'s uncommitted claim, not `a`'s commit. The eviction bumped `a`'s home, so the
/// helper's re-check of the header fails and it starts over; without the re-check (or with the
/// bump made on the evictor's home instead), it makes `b`'s claim live with `a`'s key words
/// still in it, `a` is admitted on that slot, and `b` then takes the slot too: one slot, two
/// keys admitted, `a`'s charge lost. Run with `b` in `a`'s home and in the other home (an
/// eviction bumping another home during an insert there).
///
/// One token per 1,000 ns, burst 1; the table holds 4 keys. Three keys took their token at
/// 9,900 ns, so at 10,000 ns only `a` (charged at 0) can be full. Exactly one of `a` (at
/// 10,000 ns) and `b` gets the slot, the other finds the table full.
#[test]
fn a_helper_with_a_stale_header_never_makes_a_claim_live() {
    for same_home in [true, false] {
        helper_with_a_stale_header(same_home);
    }
}

fn helper_with_a_stale_header(same_home: bool) {
    let (a, b, others) = helper_keys(same_home);
    // Both mutations fail at 2 preemptions, in a few seconds; a bound of 3 takes 7 minutes.
    model_bounded(2, move || {
        const T: u64 = 10_000;
        let l = table(1_000, 1);
        for k in others {
            assert!(l.check_at(&k, Nanos::new(T - 100)).is_allowed());
        }
        let inserter = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let first = l.check_at(&a, Nanos::ZERO).outcome();
                (first, l.check_at(&b, Nanos::new(T)).outcome())
            })
        };
        let later = spawn_check(&l, a, T);
        let ((first, new), again) = (inserter.join().unwrap(), later.join().unwrap());
        // `a` at 0 is its first decision, or comes after its insert at T (a bucket from the
        // future: denied), or races that insert for the last vacant slot and loses it (the
        // other claim is not committed yet, so there is nothing to find: `TableFull`).
        assert_ne!(first, Outcome::Untracked, "a at 0");
        let level = |k: u64| l.peek_n_at(&k, Nanos::new(T), 0).remaining();
        let (winner, loser) = slot_winner((a, again), (b, new));
        assert_eq!((level(winner), level(loser)), (0, 1), "a at T: {again:?}, b: {new:?}");
        for k in others {
            assert_eq!(level(k), 0, "key {k} was disturbed");
        }
    });
}

/// Issue 13: the denial re-check of `decide_on`, for two-word keys. A reader of key `x` reads
/// a slot's word, then its two key words while an eviction moves the slot to another key: the
/// key read can be torn, one word of the evicted key and one of the new one, and equal to `x`,
/// a key the table has never seen. A denial has no CAS to fail, so without the Acquire fence
/// and the second load of the word, `x` would be refused on the evicted key's empty bucket. With
/// them, the reader sees the slot moved on and finds `x` absent.
///
/// One token per 1,000 ns, burst 1; the table holds 4 keys, each of which is empty at 0 ns.
/// `k` (charged at 0) is evicted for `k2` at 10,000 ns; `x` is made of one word of each. At
/// 0 ns, `x` is new and the table full: `TableFull`, never `Denied`. Run with both mixes.
#[test]
fn a_torn_two_word_key_is_never_denied() {
    let (k, k2) = (1u128 << 64 | 1, 2u128 << 64 | 2);
    for x in [1u128 << 64 | 2, 2u128 << 64 | 1] {
        torn_key(k, k2, x);
    }
}

fn torn_key(k: u128, k2: u128, x: u128) {
    model(move || {
        const T: u64 = 10_000;
        let q = TokenBucket::new(Rate::per(1, std::time::Duration::from_nanos(1_000)), 1).unwrap();
        let l: Arc<KeyedLimiter<u128, ManualClock>> = Arc::new(
            KeyedBuilder::new(q)
                .capacity(3)
                .shards(1)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        assert!(l.check_at(&k, Nanos::ZERO).is_allowed());
        for other in 3..6u128 {
            assert!(l.check_at(&(other << 64 | other), Nanos::new(T - 100)).is_allowed());
        }
        let evictor = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_at(&k2, Nanos::new(T)).outcome())
        };
        let reader = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_at(&x, Nanos::ZERO).outcome())
        };
        assert_eq!(reader.join().unwrap(), Outcome::TableFull);
        assert_eq!(evictor.join().unwrap(), Outcome::Allowed);
    });
}

/// Issue 13: tier changes and overrides racing eviction and decisions. A key's stamp is kept
/// when its quota changes, so a stamp may only be evicted when it is full under every quota the
/// key could be decided by later: the table's `max_fill`, fixed at construction (a tier may not
/// grow past it). Default tier: one token per 100 ns, burst 1; tier "slow": burst 100. Key 7
/// took its token at `T` − 1 µs: full in the default tier, about 10 tokens in "slow". A writer moves
/// it to "slow" (an override, or the default tier's quota replaced by "slow"'s) and asks for
/// 50 tokens, while a sweep runs: the sweep never evicts the key, and the 50 are refused. An
/// eviction line taken from the default tier's current fill fails this: the sweep evicts the
/// key, and it comes back fresh with 100 tokens.
#[test]
fn tier_changes_racing_a_sweep_keep_the_stamp() {
    for by_override in [true, false] {
        tier_change_racing_a_sweep(by_override);
    }
}

fn tier_change_racing_a_sweep(by_override: bool) {
    model(move || {
        const T: u64 = 1_000_000;
        let per =
            |burst| TokenBucket::new(Rate::per(1, std::time::Duration::from_nanos(100)), burst).unwrap();
        let l: Arc<Table> = Arc::new(
            KeyedBuilder::new(per(1))
                .tier("slow", per(100))
                .capacity(3)
                .shards(1)
                .seeds([1, 2, 3, 4, 5, 6, 7, 8])
                .build_with_clock(ManualClock::new())
                .unwrap(),
        );
        assert!(l.check_at(&7, Nanos::new(T - 1_000)).is_allowed());
        l.clock().set(Nanos::new(T));
        let writer = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                if by_override {
                    l.set_override(&7, l.tier("slow").unwrap()).unwrap();
                } else {
                    l.set_tier_quota(Tier::DEFAULT, per(100)).unwrap();
                }
                l.check_n_at(&7, Nanos::new(T), 50).outcome()
            })
        };
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        assert_eq!(sweeper.join().unwrap(), 0, "a key was evicted that is not full in every tier");
        assert_eq!(writer.join().unwrap(), Outcome::Denied);
        let left = l.peek_n_at(&7, Nanos::new(T), 0).remaining();
        assert!(left <= 10, "key 7 has {left}");
    });
}
