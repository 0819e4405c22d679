//! The configuration file: TOML, read into the server's [`Config`] and the service's
//! [`Service`] settings, every error naming the file, the line and the key.
//!
//! ```toml
//! [server]
//! max_connections = 1024      # connections served at once (a restart changes it)
//! idle_timeout_secs = 300     # 0: never
//! threads = 2                 # worker threads (default: one per core; a restart changes it)
//! shutdown_timeout_secs = 10  # on SIGTERM, how long connections in flight may finish
//!
//! [[listener]]                # one or more; a restart changes them
//! bind = "127.0.0.1:6380"
//!
//! [requests]                  # what one request may hold
//! max_args = 1024
//! max_arg_bytes = 65536
//! max_request_bytes = 1048576
//!
//! [quotas]                    # the undeclared ones
//! capacity = 1048576          # keys per table (and of a declared quota without its own)
//! max_undeclared = 8          # 0: the declared quotas only
//! max_fill_time_secs = 3600
//!
//! [[quota]]                   # declared: built at start (or reload), never dropped
//! max_burst = 15
//! count = 30
//! period = 60
//! capacity = 100000           # optional
//!
//! [metrics]                   # GET /metrics, Prometheus text (a restart changes it)
//! bind = "127.0.0.1:9187"
//!
//! [[user]]                    # any user: every connection must AUTH
//! name = "default"
//! password_env = "TOLLGATE_REQUIREPASS"   # or password = "..."
//!
//! [envoy]                     # Envoy's rate limit service, as the --envoy-* flags
//! config = "ratelimit"        # envoyproxy/ratelimit's YAML: a file or a directory, relative
//!                             # to this file; its rules reload on SIGHUP or when they change
//! grpc = "127.0.0.1:8081"
//! http = "127.0.0.1:8080"     # optional: /json and /healthcheck
//! keys_per_rule = 65536
//! merge_domains = false
//! ignore_dotfiles = false     # skip names starting with '.' (a Kubernetes ConfigMap's ..data)
//! shadow_mode = false
//! quota_mode = false
//! response_headers = false    # limit_header, remaining_header, reset_header name them
//! near_limit_ratio = 0.8
//! response_dynamic_metadata = false
//!
//! [envoy.redis]               # optional: the rules' windows in Redis, shared by a fleet
//! urls = ["redis://127.0.0.1:6379"]
//! cluster = false
//! prefix = "tollgate:envoy:"
//! timeout_ms = 100
//! on_failure = "error"        # error, allow, deny or local
//! lease_ttl_ms = 50           # how long a leased rule's lease lives at most
//! ```
//!
//! Every key is optional but `listener.bind`, `quota.*` (`capacity` aside) and `user.name`
//! with one of `password` and `password_env`. Unknown keys, values out of range, a quota or a
//! user given twice, and an environment variable that is not set are errors.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::resp::Limits;
use crate::{Config, Quota, User};

/// What the service runs with besides the server's [`Config`]: what only a restart changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    /// The addresses to listen on.
    pub listeners: Vec<SocketAddr>,
    /// Worker threads (`None`: one per core).
    pub threads: Option<usize>,
    /// On SIGTERM, how long connections in flight may take to finish.
    pub shutdown_timeout: Duration,
    /// Where `GET /metrics` is served (Prometheus text), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Envoy's rate limit service, if served.
    pub envoy: Option<Envoy>,
}

impl Default for Service {
    fn default() -> Service {
        Service {
            listeners: vec![SocketAddr::from(([127, 0, 0, 1], 6380))],
            threads: None,
            shutdown_timeout: Duration::from_secs(10),
            metrics: None,
            envoy: None,
        }
    }
}

/// Envoy's rate limit service: the `[envoy]` section, or the `--envoy-*` flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Envoy {
    /// envoyproxy/ratelimit's YAML: one file, or a directory of them.
    pub config: PathBuf,
    /// Where `ShouldRateLimit` is served over gRPC (upstream's GRPC_PORT: 8081).
    pub grpc: SocketAddr,
    /// Where `/json` and `/healthcheck` are served, if anywhere.
    pub http: Option<SocketAddr>,
    /// Distinct values each rule's embedded table holds.
    pub keys_per_rule: usize,
    /// Upstream's MERGE_DOMAIN_CONFIG.
    pub merge_domains: bool,
    /// Upstream's RUNTIME_IGNOREDOTFILES.
    pub ignore_dotfiles: bool,
    /// Upstream's SHADOW_MODE.
    pub shadow_mode: bool,
    /// Upstream's QUOTA_MODE.
    pub quota_mode: bool,
    /// Upstream's LIMIT_RESPONSE_HEADERS_ENABLED, with the three headers' names.
    pub response_headers: Option<[String; 3]>,
    /// Upstream's NEAR_LIMIT_RATIO.
    pub near_limit_ratio: f32,
    /// Upstream's RESPONSE_DYNAMIC_METADATA.
    pub dynamic_metadata: bool,
    /// The Redis backend, if the windows live there.
    pub redis: Option<EnvoyRedis>,
}

impl Default for Envoy {
    fn default() -> Envoy {
        Envoy {
            config: PathBuf::new(),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http: None,
            keys_per_rule: 65_536,
            merge_domains: false,
            ignore_dotfiles: false,
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            near_limit_ratio: 0.8,
            dynamic_metadata: false,
            redis: None,
        }
    }
}

/// The Envoy rules' Redis backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyRedis {
    /// `redis://` URLs, or upstream's `host:port`; a Cluster's nodes when `cluster`.
    pub urls: Vec<String>,
    pub cluster: bool,
    pub prefix: String,
    pub timeout: Duration,
    /// `error`, `allow`, `deny` or `local`.
    pub on_failure: String,
    /// How long a lease of a rule with `lease: true` lives at most (never past its window).
    pub lease_ttl: Duration,
}

/// The failure policies `on_failure` may name.
pub const ON_FAILURE: [&str; 4] = ["error", "allow", "deny", "local"];

/// A configuration file that cannot be used: where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// The line (from 1), where one is to blame.
    pub line: Option<usize>,
    /// The key (`quota[2].count`), where one is to blame.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for FileError {}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    server: ServerSection,
    #[serde(default)]
    listener: Vec<Spanned<ListenerSection>>,
    #[serde(default)]
    requests: RequestsSection,
    #[serde(default)]
    quotas: QuotasSection,
    #[serde(default)]
    quota: Vec<Spanned<QuotaSection>>,
    #[serde(default)]
    user: Vec<Spanned<UserSection>>,
    metrics: Option<MetricsSection>,
    envoy: Option<Spanned<EnvoySection>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvoySection {
    config: Spanned<String>,
    grpc: Option<Spanned<String>>,
    http: Option<Spanned<String>>,
    keys_per_rule: Option<Spanned<u64>>,
    merge_domains: Option<bool>,
    ignore_dotfiles: Option<bool>,
    shadow_mode: Option<bool>,
    quota_mode: Option<bool>,
    response_headers: Option<bool>,
    limit_header: Option<String>,
    remaining_header: Option<String>,
    reset_header: Option<String>,
    near_limit_ratio: Option<Spanned<f64>>,
    response_dynamic_metadata: Option<bool>,
    redis: Option<Spanned<EnvoyRedisSection>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvoyRedisSection {
    urls: Spanned<Vec<String>>,
    cluster: Option<bool>,
    prefix: Option<String>,
    timeout_ms: Option<Spanned<u64>>,
    on_failure: Option<Spanned<String>>,
    lease_ttl_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    bind: Spanned<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    max_connections: Option<Spanned<u64>>,
    idle_timeout_secs: Option<u64>,
    threads: Option<Spanned<u64>>,
    shutdown_timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerSection {
    bind: Spanned<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RequestsSection {
    max_args: Option<Spanned<u64>>,
    max_arg_bytes: Option<Spanned<u64>>,
    max_request_bytes: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct QuotasSection {
    capacity: Option<Spanned<u64>>,
    max_undeclared: Option<u64>,
    max_fill_time_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaSection {
    max_burst: u64,
    count: u64,
    period: u64,
    capacity: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserSection {
    name: String,
    password: Option<String>,
    password_env: Option<String>,
}

/// Reads `path`: the server's configuration and the service's settings.
pub fn load(path: &Path) -> Result<(Config, Service), FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_owned(),
        line: None,
        key: None,
        message: format!("cannot be read: {e}"),
    })?;
    parse(path, &text)
}

/// Reads the text of a configuration file (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<(Config, Service), FileError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let error = |span: Option<std::ops::Range<usize>>, key: Option<String>, message: String| FileError {
        path: path.to_owned(),
        line: span.map(|s| line_of(s.start)),
        key,
        message,
    };
    let file: File = toml::from_str(text).map_err(|e| error(e.span(), None, e.message().to_owned()))?;
    let mut config = Config::default();
    let mut service = Service::default();

    // A number within `range`, or an error naming its key and line.
    let within =
        |value: &Spanned<u64>, key: &str, range: std::ops::RangeInclusive<u64>| -> Result<usize, FileError> {
            let v = *value.get_ref();
            if !range.contains(&v) {
                return Err(error(
                    Some(value.span()),
                    Some(key.to_owned()),
                    format!("{v} is out of range: {} to {}", range.start(), range.end()),
                ));
            }
            usize::try_from(v)
                .map_err(|_| error(Some(value.span()), Some(key.to_owned()), format!("{v} is too large")))
        };

    let s = &file.server;
    if let Some(v) = &s.max_connections {
        config.max_connections = within(v, "server.max_connections", 1..=1 << 20)?;
    }
    if let Some(secs) = s.idle_timeout_secs {
        config.idle_timeout = (secs > 0).then(|| Duration::from_secs(secs));
    }
    if let Some(v) = &s.threads {
        service.threads = Some(within(v, "server.threads", 1..=1024)?);
    }
    if let Some(secs) = s.shutdown_timeout_secs {
        service.shutdown_timeout = Duration::from_secs(secs);
    }

    if !file.listener.is_empty() {
        service.listeners.clear();
    }
    for (i, l) in file.listener.iter().enumerate() {
        let bind = &l.get_ref().bind;
        let addr: SocketAddr = bind.get_ref().parse().map_err(|e| {
            error(
                Some(bind.span()),
                Some(format!("listener[{i}].bind")),
                format!("{:?} is not an address:port: {e}", bind.get_ref()),
            )
        })?;
        if service.listeners.contains(&addr) {
            return Err(error(
                Some(bind.span()),
                Some(format!("listener[{i}].bind")),
                format!("{addr} is given twice"),
            ));
        }
        service.listeners.push(addr);
    }

    if let Some(m) = &file.metrics {
        let addr: SocketAddr = m.bind.get_ref().parse().map_err(|e| {
            error(
                Some(m.bind.span()),
                Some("metrics.bind".into()),
                format!("{:?} is not an address:port: {e}", m.bind.get_ref()),
            )
        })?;
        if service.listeners.contains(&addr) && addr.port() != 0 {
            return Err(error(
                Some(m.bind.span()),
                Some("metrics.bind".into()),
                format!("{addr} is a RESP listener's too"),
            ));
        }
        service.metrics = Some(addr);
    }

    let r = &file.requests;
    if let Some(v) = &r.max_args {
        config.limits.max_args = within(v, "requests.max_args", 1..=1 << 20)?;
    }
    if let Some(v) = &r.max_arg_bytes {
        config.limits.max_arg_bytes = within(v, "requests.max_arg_bytes", 16..=512 << 20)?;
    }
    if let Some(v) = &r.max_request_bytes {
        config.limits.max_request_bytes = within(v, "requests.max_request_bytes", 16..=1 << 30)?;
    }
    let Limits { max_arg_bytes, max_request_bytes, .. } = config.limits;
    if max_arg_bytes > max_request_bytes {
        return Err(error(
            r.max_arg_bytes.as_ref().map(Spanned::span),
            Some("requests.max_arg_bytes".into()),
            format!("{max_arg_bytes} is more than requests.max_request_bytes ({max_request_bytes})"),
        ));
    }

    let q = &file.quotas;
    if let Some(v) = &q.capacity {
        config.capacity = within(v, "quotas.capacity", 1..=1 << 31)?;
    }
    if let Some(n) = q.max_undeclared {
        config.max_quotas = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(secs) = q.max_fill_time_secs {
        config.max_fill_time = Duration::from_secs(secs);
    }

    for (i, spanned) in file.quota.iter().enumerate() {
        let section = spanned.get_ref();
        let quota = Quota {
            max_burst: section.max_burst,
            count: section.count,
            period: section.period,
            capacity: section.capacity.map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
        };
        let key = Some(format!("quota[{i}]"));
        if let Err(why) = crate::quota_of((quota.max_burst, quota.count, quota.period)) {
            return Err(error(Some(spanned.span()), key, format!("{quota}: {why}")));
        }
        if quota.capacity == Some(0) {
            return Err(error(
                Some(spanned.span()),
                Some(format!("quota[{i}].capacity")),
                "0 keys: at least 1".into(),
            ));
        }
        let same = |other: &Quota| {
            (other.max_burst, other.count, other.period) == (quota.max_burst, quota.count, quota.period)
        };
        if config.quotas.iter().any(same) {
            return Err(error(Some(spanned.span()), key, format!("{quota} is declared twice")));
        }
        config.quotas.push(quota);
    }

    for (i, spanned) in file.user.iter().enumerate() {
        let section = spanned.get_ref();
        let key = Some(format!("user[{i}]"));
        let password = match (&section.password, &section.password_env) {
            (Some(p), None) => p.clone(),
            (None, Some(var)) => std::env::var(var).map_err(|e| {
                error(Some(spanned.span()), Some(format!("user[{i}].password_env")), format!("{var}: {e}"))
            })?,
            _ => {
                return Err(error(Some(spanned.span()), key, "give one of password and password_env".into()));
            }
        };
        if section.name.is_empty() || password.is_empty() {
            return Err(error(
                Some(spanned.span()),
                key,
                "the name and the password must not be empty".into(),
            ));
        }
        if config.users.iter().any(|u| u.name == section.name) {
            return Err(error(Some(spanned.span()), key, format!("user {:?} is given twice", section.name)));
        }
        config.users.push(User { name: section.name.clone(), password });
    }

    if let Some(spanned) = &file.envoy {
        let e = spanned.get_ref();
        let address = |value: &Spanned<String>, key: &str| -> Result<SocketAddr, FileError> {
            value.get_ref().parse().map_err(|err| {
                error(
                    Some(value.span()),
                    Some(key.to_owned()),
                    format!("{:?} is not an address:port: {err}", value.get_ref()),
                )
            })
        };
        let defaults = Envoy::default();
        // The rules' path is relative to this file.
        let rules = Path::new(e.config.get_ref());
        let mut envoy = Envoy {
            config: path.parent().map_or_else(|| rules.to_owned(), |dir| dir.join(rules)),
            grpc: e.grpc.as_ref().map(|g| address(g, "envoy.grpc")).transpose()?.unwrap_or(defaults.grpc),
            http: e.http.as_ref().map(|h| address(h, "envoy.http")).transpose()?,
            keys_per_rule: match &e.keys_per_rule {
                Some(v) => within(v, "envoy.keys_per_rule", 1..=1 << 28)?,
                None => defaults.keys_per_rule,
            },
            merge_domains: e.merge_domains.unwrap_or_default(),
            ignore_dotfiles: e.ignore_dotfiles.unwrap_or_default(),
            shadow_mode: e.shadow_mode.unwrap_or_default(),
            quota_mode: e.quota_mode.unwrap_or_default(),
            response_headers: e.response_headers.unwrap_or_default().then(|| {
                [
                    e.limit_header.clone().unwrap_or_else(|| "RateLimit-Limit".into()),
                    e.remaining_header.clone().unwrap_or_else(|| "RateLimit-Remaining".into()),
                    e.reset_header.clone().unwrap_or_else(|| "RateLimit-Reset".into()),
                ]
            }),
            near_limit_ratio: defaults.near_limit_ratio,
            dynamic_metadata: e.response_dynamic_metadata.unwrap_or_default(),
            redis: None,
        };
        if e.config.get_ref().is_empty() {
            return Err(error(Some(e.config.span()), Some("envoy.config".into()), "an empty path".into()));
        }
        if let Some(r) = &e.near_limit_ratio {
            envoy.near_limit_ratio = near_limit_ratio(*r.get_ref())
                .map_err(|why| error(Some(r.span()), Some("envoy.near_limit_ratio".into()), why))?;
        }
        if let Some(spanned) = &e.redis {
            let r = spanned.get_ref();
            if r.urls.get_ref().is_empty() {
                return Err(error(
                    Some(r.urls.span()),
                    Some("envoy.redis.urls".into()),
                    "no URL: at least one".into(),
                ));
            }
            let timeout = match &r.timeout_ms {
                Some(v) => Duration::from_millis(within(v, "envoy.redis.timeout_ms", 1..=60_000)? as u64),
                None => Duration::from_millis(100),
            };
            let on_failure = match &r.on_failure {
                Some(p) if !ON_FAILURE.contains(&p.get_ref().as_str()) => {
                    return Err(error(
                        Some(p.span()),
                        Some("envoy.redis.on_failure".into()),
                        format!("{:?} is not one of {}", p.get_ref(), ON_FAILURE.join(", ")),
                    ))
                }
                Some(p) => p.get_ref().clone(),
                None => "error".into(),
            };
            let lease_ttl = match &r.lease_ttl_ms {
                Some(v) => {
                    Duration::from_millis(within(v, "envoy.redis.lease_ttl_ms", 1..=3_600_000)? as u64)
                }
                None => Duration::from_millis(50),
            };
            envoy.redis = Some(EnvoyRedis {
                urls: r.urls.get_ref().clone(),
                cluster: r.cluster.unwrap_or_default(),
                prefix: r.prefix.clone().unwrap_or_else(|| "tollgate:envoy:".into()),
                timeout,
                on_failure,
                lease_ttl,
            });
        }
        service.envoy = Some(envoy);
    }
    Ok((config, service))
}

/// Upstream's `NEAR_LIMIT_RATIO`, checked as the file's `near_limit_ratio` and the
/// `--envoy-near-limit-ratio` flag both take it: above 0, at most 1.
pub fn near_limit_ratio(v: f64) -> Result<f32, String> {
    if v > 0.0 && v <= 1.0 {
        #[expect(clippy::cast_possible_truncation, reason = "a ratio in (0, 1]: an f32 holds it")]
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range: above 0, at most 1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("tollgate.toml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_full_file_reads_into_the_configuration() {
        let (config, service) = parse(
            Path::new("t.toml"),
            r#"
[server]
max_connections = 10
idle_timeout_secs = 0
threads = 2
shutdown_timeout_secs = 3

[[listener]]
bind = "127.0.0.1:7000"
[[listener]]
bind = "[::1]:7001"

[requests]
max_args = 16
max_arg_bytes = 1024
max_request_bytes = 4096

[quotas]
capacity = 1000
max_undeclared = 0
max_fill_time_secs = 60

[[quota]]
max_burst = 15
count = 30
period = 60

[[quota]]
max_burst = 1
count = 2
period = 3
capacity = 10

[[user]]
name = "default"
password = "s3cret"

[metrics]
bind = "127.0.0.1:9187"
"#,
        )
        .unwrap();
        assert_eq!(config.max_connections, 10);
        assert_eq!(config.idle_timeout, None);
        assert_eq!(
            (config.limits.max_args, config.limits.max_arg_bytes, config.limits.max_request_bytes),
            (16, 1024, 4096)
        );
        assert_eq!(
            (config.capacity, config.max_quotas, config.max_fill_time),
            (1000, 0, Duration::from_secs(60))
        );
        assert_eq!(config.quotas.len(), 2);
        assert_eq!(config.quotas[1], Quota { max_burst: 1, count: 2, period: 3, capacity: Some(10) });
        assert_eq!(config.users, vec![User { name: "default".into(), password: "s3cret".into() }]);
        assert_eq!(service.listeners, vec!["127.0.0.1:7000".parse().unwrap(), "[::1]:7001".parse().unwrap()]);
        assert_eq!((service.threads, service.shutdown_timeout), (Some(2), Duration::from_secs(3)));
        assert_eq!(service.metrics, Some("127.0.0.1:9187".parse().unwrap()));
        // An empty file is the defaults.
        let (config, service) = parse(Path::new("t.toml"), "").unwrap();
        assert_eq!(service, Service::default());
        assert_eq!(config.capacity, Config::default().capacity);
    }

    /// Every bad file is an error naming the file, the line and the key.
    #[test]
    fn bad_files_name_the_file_the_line_and_the_key() {
        let e = err("[server]\nmax_connections = \n");
        assert!(e.starts_with("tollgate.toml:2: "), "{e}");
        let e = err("[server]\nmax_conections = 5\n");
        assert!(e.starts_with("tollgate.toml:2: ") && e.contains("unknown field `max_conections`"), "{e}");
        let e = err("[server]\n\nmax_connections = 0\n");
        assert_eq!(e, "tollgate.toml:3: server.max_connections: 0 is out of range: 1 to 1048576");
        let e = err("[[quota]]\nmax_burst = 1\ncount = 2\nperiod = 3\n\n[[quota]]\nmax_burst = 1\ncount = 2\nperiod = 3\n");
        assert!(e.starts_with("tollgate.toml:6: quota[1]: 1:2:3 is declared twice"), "{e}");
        let e = err("[[quota]]\nmax_burst = 1\ncount = 0\nperiod = 3\n");
        assert!(e.starts_with("tollgate.toml:1: quota[0]: 1:0:3: Zero rates"), "{e}");
        let e = err("[[quota]]\nmax_burst = 1\nperiod = 3\n");
        assert!(e.starts_with("tollgate.toml:1: ") && e.contains("missing field `count`"), "{e}");
        let e = err("[[listener]]\nbind = \"localhost\"\n");
        assert!(
            e.starts_with("tollgate.toml:2: listener[0].bind: \"localhost\" is not an address:port"),
            "{e}"
        );
        let e = err("[[user]]\nname = \"a\"\n");
        assert!(e.starts_with("tollgate.toml:1: user[0]: give one of password and password_env"), "{e}");
        let e = err("[[user]]\nname = \"a\"\npassword_env = \"TOLLGATE_TEST_UNSET_VARIABLE\"\n");
        assert!(e.contains("user[0].password_env: TOLLGATE_TEST_UNSET_VARIABLE"), "{e}");
        let e = err("[requests]\nmax_arg_bytes = 5000\nmax_request_bytes = 4096\n");
        assert_eq!(
            e,
            "tollgate.toml:2: requests.max_arg_bytes: 5000 is more than requests.max_request_bytes (4096)"
        );
        let e = err("[quotas]\ncapacity = \"many\"\n");
        assert!(e.starts_with("tollgate.toml:2: ") && e.contains("invalid type"), "{e}");
        let e = load(Path::new("/nonexistent/tollgate.toml")).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/tollgate.toml: cannot be read"), "{e}");
    }

    #[test]
    fn the_envoy_section_reads_as_the_flags_and_refuses_bad_values() {
        let (_, service) = parse(
            Path::new("/etc/tollgate/tollgate.toml"),
            r#"
[envoy]
config = "ratelimit"
grpc = "127.0.0.1:9081"
http = "127.0.0.1:9080"
keys_per_rule = 1000
ignore_dotfiles = true
shadow_mode = true
response_dynamic_metadata = true
response_headers = true
reset_header = "X-Reset"
near_limit_ratio = 0.5

[envoy.redis]
urls = ["10.0.0.5:6379"]
timeout_ms = 50
on_failure = "local"
lease_ttl_ms = 200
"#,
        )
        .unwrap();
        let e = service.envoy.unwrap();
        assert_eq!(e.config, Path::new("/etc/tollgate/ratelimit"));
        assert_eq!((e.grpc.port(), e.http.map(|h| h.port()), e.keys_per_rule), (9081, Some(9080), 1000));
        assert!(
            e.shadow_mode && e.dynamic_metadata && e.ignore_dotfiles && !e.quota_mode && !e.merge_domains
        );
        assert_eq!(e.response_headers.unwrap()[2], "X-Reset");
        assert_eq!(e.near_limit_ratio, 0.5);
        let r = e.redis.unwrap();
        assert_eq!(
            (r.urls, r.cluster, r.prefix.as_str()),
            (vec!["10.0.0.5:6379".to_owned()], false, "tollgate:envoy:")
        );
        assert_eq!((r.timeout, r.on_failure.as_str()), (Duration::from_millis(50), "local"));
        assert_eq!(r.lease_ttl, Duration::from_millis(200));

        let e = err("[envoy]\nconfig = \"r\"\nredis_url = \"x\"\n");
        assert!(e.starts_with("tollgate.toml:3: ") && e.contains("unknown field `redis_url`"), "{e}");
        let e = err("[envoy]\nconfig = \"r\"\nnear_limit_ratio = 1.5\n");
        assert_eq!(e, "tollgate.toml:3: envoy.near_limit_ratio: 1.5 is out of range: above 0, at most 1");
        let e = err("[envoy]\nconfig = \"r\"\ngrpc = \"8081\"\n");
        assert!(e.starts_with("tollgate.toml:3: envoy.grpc: \"8081\" is not an address:port"), "{e}");
        let e = err("[envoy]\nconfig = \"r\"\n[envoy.redis]\nurls = [\"a:1\"]\non_failure = \"maybe\"\n");
        assert_eq!(
            e,
            "tollgate.toml:5: envoy.redis.on_failure: \"maybe\" is not one of error, allow, deny, local"
        );
        let e = err("[envoy]\nconfig = \"r\"\n[envoy.redis]\nurls = []\n");
        assert_eq!(e, "tollgate.toml:4: envoy.redis.urls: no URL: at least one");
        let e = err("[envoy]\nconfig = \"r\"\n[envoy.redis]\nurls = [\"a:1\"]\nlease_ttl_ms = 0\n");
        assert!(e.starts_with("tollgate.toml:5: envoy.redis.lease_ttl_ms: 0"), "{e}");
        let e = err("[envoy]\ngrpc = \"127.0.0.1:1\"\n");
        assert!(e.contains("missing field `config`"), "{e}");
    }
}
