#![doc = include_str!("../README.md")]

mod admit;
mod bucket;
pub mod clock;
mod compat;
mod decision;
mod error;
mod keyed;
mod limiter;
mod log;
mod nginx;
mod policy;
mod quota;
mod sliding;
mod sync;
mod time;
mod window;

pub use admit::{check_all, Admit, Receipt};
pub use clock::{Clock, DefaultClock, ManualClock, StdClock};
#[cfg(feature = "quanta")]
pub use clock::{CoarseClock, TscClock};
pub use compat::ClThrottle;
pub use decision::{Decision, Outcome};
pub use error::ConfigError;
pub use keyed::{
    Hashed, Key, Keyed, KeyedBuilder, KeyedFixedWindow, KeyedLimit, KeyedLimiter, KeyedNginx, KeyedPolicy,
    KeyedPolicyBuilder, KeyedPolicyLimit, KeyedSlidingWindow, KeyedStats, Tier, WhenFull, Words,
};
pub use limiter::Limiter;
pub use log::{KeyedSlidingLog, KeyedSlidingLogBuilder, SlidingLog, SlidingLogLimiter};
pub use nginx::{NginxLimiter, NginxQuota};
pub use policy::{Direct, Policy};
pub use quota::{Quota, Rate};
pub use sliding::{SlidingWindow, SlidingWindowLimiter};
pub use time::Nanos;
pub use window::{FixedWindow, FixedWindowLimiter};
