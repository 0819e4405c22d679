//! The engine every algorithm shares: decisions, the direct limiter, multi-limit admission,
//! time, rates, waiting and errors.
//!
//! It depends on no algorithm: nothing here names a policy (`tests/layers.rs` checks it).
//! The arithmetic the token bucket's decisions and their errors share lives here
//! (`arith.rs`), and each algorithm's own methods on [`Direct`](crate::Direct) live with the
//! algorithm (the token bucket's reservations in `policies/reserve.rs`).

pub(crate) mod admit;
pub(crate) mod arith;
pub(crate) mod config;
pub(crate) mod counters;
pub(crate) mod decision;
pub(crate) mod direct;
pub(crate) mod error;
pub(crate) mod pacer;
pub(crate) mod rate;
pub(crate) mod time;
pub(crate) mod wait;
