//! One tollgate limit shared by many processes, on Redis (standalone or Cluster).
//!
//! A [`RedisLimiter`] keeps a token bucket per key in Redis and decides each request with one
//! Lua script call (`EVALSHA`, reloaded on `NOSCRIPT`) on the **server's clock** (`TIME`):
//! clients whose clocks disagree still share one exact limit. The key holds the engine's own
//! state, the bucket's 64-bit empty instant in `1/m` ns units (see
//! [`TokenBucket::decide_stored`](tollgate::TokenBucket::decide_stored)), so a decision equals,
//! field for field, what a local [`Limiter`](tollgate::Limiter) answers at the same instant:
//! the HTTP layer's headers work unchanged. Every key expires once its bucket would be full
//! again (under every quota that shares it), so idle keys vanish. Run Redis with
//! `maxmemory-policy noeviction`: an evicted bucket comes back full.
//!
//! [`LeasedLimiter`] takes tokens from the shared bucket in batches and spends them locally,
//! at the cost of stranded tokens; see the "many machines" guide (`docs/guide/many-machines.md`)
//! for which mode to pick and what each guarantees.
//!
//! When Redis is slow or gone, a per-call timeout and a circuit breaker bound the wait, and the
//! [`OnFailure`] policy answers: an error, fail closed, fail open, or a local limiter at a share
//! of the rate. Every path is counted ([`Stats`]).
//!
//! ```no_run
//! use tollgate::TokenBucket;
//! use tollgate_redis::{OnFailure, RedisLimiter};
//!
//! # async fn run() -> Result<(), tollgate_redis::Error> {
//! let quota = TokenBucket::per_second(100)?;
//! let limiter = RedisLimiter::builder(quota)
//!     .url("redis://127.0.0.1:6379")
//!     .prefix("api:")
//!     .on_failure(OnFailure::Local(tollgate_redis::share(&quota, 4)?))
//!     .connect()
//!     .await?;
//! let decision = limiter.check("client-42").await?;
//! if !decision.is_allowed_now() {
//!     println!("retry after {:?}", decision.retry_after());
//! }
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
mod error;
mod failure;
mod lease_table;
mod lease_word;
mod leased;
mod leased_windows;
mod limiter;
pub mod value;
mod windows;

pub use error::Error;
pub use failure::{share, OnFailure, Stats};
pub use leased::{LeaseStats, LeasedLimiter};
pub use leased_windows::LeasedWindows;
pub use limiter::{Builder, RedisLimiter};
/// The client this crate is built on, for matching on [`Error::Redis`]'s kinds and codes.
pub use redis;
pub use value::BucketValue;
pub use windows::{
    BucketCheck, Check, NginxCheck, RedisWindows, SlidingCheck, Taken, WindowCheck, WindowsBuilder,
};
