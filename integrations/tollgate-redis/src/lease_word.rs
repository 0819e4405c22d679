//! One key's lease: its generation, tokens and expiries, and the lock-free spend.
//!
//! Each grant is a new *generation*. `word` holds the generation and the tokens left; each
//! generation's expiry sits in `expiries[generation % 4]`. A spender loads the word, then reads
//! the clock, then that generation's expiry, and takes the tokens with a CAS on the word: the
//! CAS succeeds only if the word is unchanged, so the tokens it takes belong to the generation
//! whose expiry it checked, at an instant after that generation was granted. (A slot is
//! rewritten four grants later; by then the word has changed and the CAS fails.) Grants are
//! serialized by the caller (one refill at a time per key).
//!
//! Self-contained so that `loom-tests` compiles this very file against loom's atomics
//! (`loom-tests/tests/lease.rs`).

#[cfg(tollgate_loom)]
use loom::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
#[cfg(not(tollgate_loom))]
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

const TOKEN_BITS: u32 = 40;
const TOKENS: u64 = (1 << TOKEN_BITS) - 1;

/// A lease's word and its generations' expiries (see the module docs).
#[derive(Debug)]
pub(crate) struct LeaseWord {
    /// The generation (bits 40–63, wrapping) and the tokens left (bits 0–39).
    word: AtomicU64,
    /// The instant (the caller's clock) at which each generation's tokens lapse.
    expiries: [AtomicU64; 4],
}

/// A generation ended by [`LeaseWord::end`], for the grant that follows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended {
    /// The next generation's word, with no tokens (already stored).
    next: u64,
    /// The tokens the ended generation still held.
    pub(crate) left: u64,
    /// Whether the ended generation had lapsed.
    pub(crate) lapsed: bool,
}

impl LeaseWord {
    /// Generation 0, empty and lapsed.
    pub(crate) fn new() -> LeaseWord {
        LeaseWord {
            word: AtomicU64::new(0),
            expiries: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn expiry(&self, word: u64) -> &AtomicU64 {
        &self.expiries[usize::try_from((word >> TOKEN_BITS) % 4).unwrap_or(0)]
    }

    /// The current generation's tokens, and whether it has lapsed at `now`.
    pub(crate) fn current(&self, now: u64) -> (u64, bool) {
        // Acquire: pairs with the Release store of a grant's word, after its expiry.
        let word = self.word.load(Acquire);
        (word & TOKENS, self.expiry(word).load(Relaxed) <= now)
    }

    /// Takes `n ≥ 1` tokens from the current generation if it holds them and has not lapsed.
    /// `clock` is read after the word: the decision's instant, returned with the tokens left.
    pub(crate) fn spend(&self, n: u64, clock: impl Fn() -> u64) -> Option<(u64, u64)> {
        // Acquire (here and on a failed CAS): pairs with the Release store of a grant's word,
        // so that generation's expiry, stored before it, is visible.
        let mut word = self.word.load(Acquire);
        loop {
            let now = clock();
            if self.expiry(word).load(Relaxed) <= now || word & TOKENS < n {
                return None;
            }
            // Relaxed on success: the tokens are a count; what guards them (the expiry) was
            // read above, for this very word.
            match self.word.compare_exchange_weak(word, word - n, Relaxed, Acquire) {
                Ok(_) => return Some(((word & TOKENS) - n, now)),
                Err(w) => word = w,
            }
        }
    }

    /// Ends the current generation (a spender's CAS on it fails from now on): the next one
    /// starts with no tokens. Callers serialize `end` and `grant`.
    pub(crate) fn end(&self, now: u64) -> Ended {
        let old = self.word.load(Relaxed);
        let lapsed = self.expiry(old).load(Relaxed) <= now;
        let next = (old >> TOKEN_BITS).wrapping_add(1) << TOKEN_BITS;
        // Relaxed: the caller orders ends and grants; spenders only need the CAS to fail.
        let left = self.word.swap(next, Relaxed) & TOKENS;
        Ended { next, left, lapsed }
    }

    /// Gives the generation `ended` started `tokens` (below 2^40) that lapse at `expires`.
    pub(crate) fn grant(&self, ended: Ended, tokens: u64, expires: u64) {
        self.expiry(ended.next).store(expires, Relaxed);
        // Release: a spender that reads this word (Acquire) reads the expiry stored above.
        self.word.store(ended.next | (tokens & TOKENS), Release);
    }
}
