//! Loom models of tollgate's atomic protocols. Built only with `--cfg tollgate_loom`:
//!
//! ```sh
//! RUSTFLAGS="--cfg tollgate_loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
//!     cargo test -p loom-tests --release
//! ```
//!
//! A loom pass is evidence, not proof: loom models `SeqCst` as `AcqRel` and does not explore
//! load buffering. Each model's doc comment says which ordering comment in `src/` it backs.

/// Runs `f` under loom with a preemption bound (default 3, or `LOOM_MAX_PREEMPTIONS`).
#[cfg(tollgate_loom)]
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// [`model`] with a preemption bound of at most `bound`, for a model whose failures need no
/// more preemptions than that and which would take several minutes at the default bound (its
/// doc comment says which mutations it was checked against, at this bound).
#[cfg(tollgate_loom)]
pub fn model_bounded<F>(bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.map_or(bound, |b| b.min(bound)));
    builder.check(f);
}

/// The end of a race for one slot: `old` decided on a key whose slot `new`'s insert needed.
/// Exactly one of them got the slot and the other found the table full: returns (winner,
/// loser), and panics on anything else.
#[cfg(tollgate_loom)]
pub fn slot_winner(old: (u64, tollgate::Outcome), new: (u64, tollgate::Outcome)) -> (u64, u64) {
    use tollgate::Outcome::{Allowed, TableFull};
    match (old.1, new.1) {
        (Allowed, TableFull) => (old.0, new.0),
        (TableFull, Allowed) => (new.0, old.0),
        other => panic!("unexpected {other:?}"),
    }
}
