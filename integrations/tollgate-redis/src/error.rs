//! What can go wrong between a limiter and Redis, as a type.

use core::fmt;
use core::time::Duration;

use tollgate::ConfigError;

/// Why a Redis limiter could not decide through Redis.
///
/// Under a [`OnFailure`](crate::OnFailure) policy other than `Error`, the
/// [transient](Error::is_transient) ones become decisions and are only counted; the others
/// (a value that is not a bucket, a key of another type) are returned whatever the policy,
/// since no amount of waiting fixes them.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The quota cannot be kept in Redis (a bucket that starts below its burst: an expired
    /// key comes back full).
    Config(ConfigError),
    /// The connection string is not a Redis URL this client can use.
    Url {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No answer within the limiter's timeout.
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The breaker is open after repeated failures: the call was not sent.
    BreakerOpen {
        /// Until the next call is let through to probe the server.
        retry_in: Duration,
    },
    /// The client or the server failed: connection refused or lost, authentication, a
    /// server error reply (`WRONGTYPE`, `CLUSTERDOWN`, `LOADING`, …).
    Redis(redis::RedisError),
    /// A replayed instant beyond 2^53 µs (285 years after 1970), more than the script's
    /// arithmetic holds exactly.
    TimeOutOfRange {
        /// The instant given, in microseconds since the Unix epoch.
        micros: u64,
    },
    /// A batch of windows the script cannot decide as given (a key named twice, a window
    /// length it cannot carry); nothing was sent.
    Batch {
        /// What was wrong with the batch.
        reason: String,
    },
    /// The key holds something that is not a tollgate bucket, or the script's reply is not
    /// what this version sends.
    Corrupt {
        /// The Redis key (prefix included), lossily as UTF-8.
        key: String,
        /// What was wrong.
        reason: String,
    },
}

impl Error {
    /// Whether the failure is about reaching Redis (timeouts, the breaker, I/O, a server that
    /// is loading, busy, down, failing over, read-only or out of memory) rather than about the
    /// data or the configuration.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::BreakerOpen { .. } => true,
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_cluster_error()
                    || matches!(
                        e.code(),
                        Some("LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
                    )
            }
            Error::Config(_)
            | Error::Url { .. }
            | Error::Corrupt { .. }
            | Error::Batch { .. }
            | Error::TimeOutOfRange { .. } => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => write!(f, "the quota cannot be kept in Redis: {e}"),
            Error::Url { url, reason } => write!(f, "invalid Redis URL {url:?}: {reason}"),
            Error::Timeout { after } => write!(f, "Redis did not answer within {after:?}"),
            Error::BreakerOpen { retry_in } => {
                write!(f, "Redis failed repeatedly; the breaker lets the next call through in {retry_in:?}")
            }
            Error::Redis(e) => write!(f, "Redis failed: {e}"),
            Error::Corrupt { key, reason } => write!(f, "Redis key {key:?}: {reason}"),
            Error::Batch { reason } => write!(f, "a batch of windows that cannot be decided: {reason}"),
            Error::TimeOutOfRange { micros } => {
                write!(f, "the instant {micros} µs after 1970 is beyond 2^53 µs, the most a decision in Redis can be dated")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(e) => Some(e),
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Redis(e)
    }
}

/// `url` with the password of its userinfo (`redis://user:password@host`) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!("{}{}:***{}", &url[..scheme_end], &rest[..colon], &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_an_error_message() {
        assert_eq!(redact("redis://:hunter2@127.0.0.1:6379/0"), "redis://:***@127.0.0.1:6379/0");
        assert_eq!(redact("rediss://me:p@ss@host"), "rediss://me:***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
