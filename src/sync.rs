//! Atomics, from `std` normally and from `loom` under `--cfg tollgate_loom`.
//!
//! Every other module imports its atomics from here, so that the loom models in `loom-tests/`
//! exercise exactly the code that ships. `.ci/test.sh` greps for `sync::atomic` outside this file.

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
