//! The engine every algorithm shares: decisions, the direct limiter, multi-limit admission,
//! time and errors.

pub(crate) mod admit;
pub(crate) mod config;
pub(crate) mod counters;
pub(crate) mod decision;
pub(crate) mod direct;
pub(crate) mod error;
pub(crate) mod pacer;
pub(crate) mod time;
