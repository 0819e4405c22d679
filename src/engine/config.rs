//! A configuration that changes at runtime under concurrent decisions: a double-buffered
//! sequence lock over the configuration's words, and the hidden trait that turns each
//! algorithm's configuration into words and back.
//!
//! A writer fills the inactive buffer under that buffer's sequence lock, then flips the
//! `active` index. A reader retries only if the buffer it is reading is being rewritten, which
//! takes two flips by a writer that is making progress: readers never wait for a stalled
//! writer. Writers are serialized by their owner (a mutex on an administrative path, never a
//! decision). Each stored configuration carries a generation (how many times it has been
//! replaced), read together with it.

use crate::sync::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Words of a configuration: the token bucket's nine, and a queued bucket's bound.
pub(crate) const WORDS: usize = 10;

/// A configuration as words, plus its generation.
#[derive(Debug)]
struct Buf {
    seq: AtomicU64,
    words: [AtomicU64; WORDS + 1],
}

/// One configuration, changeable at runtime (see the module docs).
#[derive(Debug)]
pub(crate) struct ConfigCell {
    active: AtomicU64,
    bufs: [Buf; 2],
}

impl ConfigCell {
    /// A cell holding `words` at generation 0.
    pub(crate) fn new(words: [u64; WORDS]) -> ConfigCell {
        let buf = || Buf {
            seq: AtomicU64::new(0),
            words: core::array::from_fn(|i| AtomicU64::new(words.get(i).copied().unwrap_or(0))),
        };
        ConfigCell { active: AtomicU64::new(0), bufs: [buf(), buf()] }
    }

    /// The current configuration and its generation.
    pub(crate) fn load(&self) -> ([u64; WORDS], u64) {
        loop {
            // Acquire: pairs with the writer's Release store of `active`, after the buffer's
            // last Release of `seq`.
            let i = self.active.load(Acquire);
            let buf = &self.bufs[(i & 1) as usize];
            let before = buf.seq.load(Acquire);
            if before & 1 == 0 {
                let all: [u64; WORDS + 1] = core::array::from_fn(|k| buf.words[k].load(Relaxed));
                // Acquire fence: the word loads above happen before the `seq` load below, so a
                // rewrite that any of them saw shows up as a changed `seq` (pairs with the
                // writer's Release fence after its odd `seq`).
                fence(Acquire);
                if buf.seq.load(Relaxed) == before {
                    let words = core::array::from_fn(|k| all[k]);
                    return (words, all[WORDS]);
                }
            }
            crate::sync::pause();
        }
    }

    /// Stores `words` as the next generation and makes it current; returns that generation.
    /// Callers serialize writers.
    pub(crate) fn store(&self, words: [u64; WORDS]) -> u64 {
        let generation = self.load().1 + 1;
        let next = self.active.load(Relaxed) ^ 1;
        let buf = &self.bufs[(next & 1) as usize];
        let seq = buf.seq.load(Relaxed);
        buf.seq.store(seq + 1, Relaxed);
        // Release fence: the odd `seq` is visible before any of the new words (pairs with the
        // reader's Acquire fence).
        fence(Release);
        for (a, w) in buf.words.iter().zip(words.iter().chain([&generation])) {
            a.store(*w, Relaxed);
        }
        // Release: the words happen-before the even `seq` and the flip.
        buf.seq.store(seq + 2, Release);
        self.active.store(next, Release);
        generation
    }
}
