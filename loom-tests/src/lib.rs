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
