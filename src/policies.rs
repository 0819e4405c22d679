//! The algorithms: their configurations, their pure decisions on one word (or, for the sliding
//! log, a ring of words), and how each commits on [`Direct`](crate::Direct).

pub(crate) mod bucket;
pub(crate) mod compat;
pub(crate) mod limiter;
pub(crate) mod log;
pub(crate) mod meter;
pub(crate) mod nginx;
pub(crate) mod parse;
pub(crate) mod policy;
pub(crate) mod queued;
pub(crate) mod reserve;
pub(crate) mod sliding;
pub(crate) mod token_bucket;
pub(crate) mod window;
