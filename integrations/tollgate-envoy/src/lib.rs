//! Envoy's global rate limit service on tollgate: a drop-in for envoyproxy/ratelimit that reads
//! its YAML configuration unchanged and answers its API (`ShouldRateLimit` over gRPC, `/json`).
//! `tollgate-server --envoy-config` serves it; a program of its own serves a [`Service`] with
//! [`Service::serve`] (gRPC and health) and [`Service::serve_http`].
//!
//! - [`Config`] loads upstream's files (one file, or a directory of them, one domain each)
//!   with every key upstream accepts and every check it makes, and refuses what it refuses
//!   with its messages ([`ConfigError::upstream`]), each also naming its line.
//! - [`Domain::find`] walks a request descriptor's entries down the tree: exact `key_value`,
//!   then the first matching wildcard, then the bare key; a rule applies only at the depth of
//!   the request's last entry. It names the statistics as upstream does (`detailed_metric`,
//!   `value_to_metric`, `share_threshold`).
//! - [`Limits`] decides as upstream's fixed window on tollgate's keyed tables (every hit
//!   counted, windows on the Unix epoch's grid), with upstream's statuses, errors and
//!   statistics ([`Limits::report_metrics`]); [`Limits::reloaded`] keeps the counts of rules a
//!   reload leaves unchanged.
//!
//! ```
//! use tollgate_envoy::{Config, LoadOptions, Unit};
//!
//! let yaml = "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit:
//!       unit: second
//!       requests_per_unit: 10
//! ";
//! let config = Config::from_files([("edge.yaml", yaml)], LoadOptions::default())?;
//! let found = config.domain("edge").unwrap().find(&[("remote_address", "10.0.0.1")]).unwrap();
//! let rule = found.descriptor.rate_limit.as_ref().unwrap();
//! assert_eq!((rule.requests_per_unit, rule.unit), (10, Some(Unit::Second)));
//! assert_eq!(found.stats_key, "edge.remote_address");
//! # Ok::<(), tollgate_envoy::ConfigError>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod grpc;
mod http;
mod latency;
mod matching;
mod redis;
mod service;
mod yaml;

pub use config::{
    Algorithm, Config, ConfigError, Descriptor, Domain, LoadOptions, Metadata, RateLimit, Unit,
};
pub use grpc::Service;
pub use matching::{wildcard_match, Found, Matched};
pub use redis::{OnRedisFailure, RedisBackend};
pub use service::{
    Code, CurrentLimit, HeaderNames, Limits, Request, RequestDescriptor, RequestError, Response, RuleCounts,
    Settings, Status, WallClock, DEFAULT_STATISTICS_BYTES,
};
/// The Redis client the backend is built on ([`RedisBackend::new`] takes its `RedisWindows`).
pub use tollgate_redis;
