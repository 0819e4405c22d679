//! An exact, lock-free rate-limiter engine for hot paths: token bucket (GCRA), nginx's
//! `limit_req`, fixed and sliding windows and a sliding log, one limit or one per key, each
//! decision a CAS on one word, never admitting more than the quota allows.
//!
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

/// The guides of `docs/guide/`, here so that their examples are compiled and run as tests.
pub mod guide {
    #[doc = include_str!("../docs/guide/algorithms.md")]
    pub mod algorithms {}
    #[doc = include_str!("../docs/guide/keyed.md")]
    pub mod keyed {}
    #[doc = include_str!("../docs/guide/several-limits.md")]
    pub mod several_limits {}
    #[doc = include_str!("../docs/guide/counters.md")]
    pub mod counters {}
    #[doc = include_str!("../docs/guide/waiting.md")]
    pub mod waiting {}
    #[doc = include_str!("../docs/guide/clocks.md")]
    pub mod clocks {}
    #[doc = include_str!("../docs/guide/guarantees-and-testing.md")]
    pub mod guarantees_and_testing {}
    #[doc = include_str!("../docs/guide/performance.md")]
    pub mod performance {}
    #[doc = include_str!("../docs/guide/meters.md")]
    pub mod meters {}
}

// The tree reads engine → policies → keyed table → clocks.
pub mod clock;
mod engine;
mod keyed;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod policies;
mod sync;

pub use clock::{Clock, DefaultClock, ManualClock, StdClock};
#[cfg(feature = "quanta")]
#[cfg_attr(docsrs, doc(cfg(feature = "quanta")))]
pub use clock::{CoarseClock, TscClock};
pub use engine::admit::{check_all, Admit, Receipt};
#[cfg(tollgate_loom)]
#[doc(hidden)]
pub use engine::counters::SlotRegistry;
pub use engine::counters::{CounterSnapshot, Counters};
pub use engine::decision::{Decision, Outcome};
pub use engine::direct::{Algorithm, Direct};
pub use engine::error::{ConfigError, UpdateError};
pub use engine::pacer::{Arrivals, Pacer};
pub use engine::rate::Rate;
pub use engine::time::Nanos;
#[cfg(tollgate_loom)]
#[doc(hidden)]
pub use keyed::loom_home_of;
pub use keyed::{
    FlowMeters, Hashed, IpPrefix, Key, KeyHasher, Keyed, KeyedAlgorithm, KeyedBuilder, KeyedFixedWindow,
    KeyedLimit, KeyedLimiter, KeyedNginx, KeyedPolicy, KeyedSlidingLog, KeyedSlidingWindow, KeyedStats,
    SharedFlowMeters, Tier, WhenFull, Words,
};
pub use policies::compat::ClThrottle;
pub use policies::limiter::Limiter;
pub use policies::log::{SlidingLog, SlidingLogLimiter};
pub use policies::meter::{Color, Meter, MeterKind, MeterState, SharedMeter};
pub use policies::nginx::{Nginx, NginxLimiter};
pub use policies::parse::ParseError;
pub use policies::policy::Policy;
pub use policies::queued::{Queued, QueuedLimiter};
pub use policies::reserve::{Cancelled, Reservation, ReserveError};
pub use policies::sliding::{SlidingWindow, SlidingWindowLimiter};
pub use policies::token_bucket::TokenBucket;
pub use policies::window::{FixedWindow, FixedWindowLimiter};
