//! `tollgate-server`: the RESP server (see the library's docs).
//!
//! ```sh
//! cargo run --release -p tollgate-server -- --port 6380
//! redis-cli -p 6380 CL.THROTTLE user123 15 30 60
//! cargo run --release -p tollgate-server -- --config tollgate.toml   # a file, reloaded on SIGHUP
//! ```

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use tollgate_server::file::{self, Service};
use tollgate_server::{resp::Limits, Config, Quota, Server, User};

/// A RESP server compatible with redis-cell's CL.THROTTLE, on tollgate's keyed token bucket.
///
/// Configured by flags, or by a TOML file (--config; the crate's `file` module documents every
/// key), which SIGHUP reloads: a file that cannot be used is refused with its line and key, and
/// the running configuration kept. SIGTERM (or Ctrl-C) stops accepting, answers what the
/// connections have sent, and exits within the shutdown timeout. Logs go to standard error,
/// as text or JSON lines; the first line of standard output names each address listened on.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A TOML configuration file, instead of the flags that set the same things (every flag
    /// below but --log-format, --log-level and --check-config). Reloaded on SIGHUP.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "bind", "port", "quotas", "capacity", "max_quotas", "max_fill_time", "users", "max_connections", "max_arg_bytes", "max_request_bytes", "idle_timeout",
        "threads", "shutdown_timeout", "metrics",
    ])]
    config: Option<PathBuf>,
    /// Reads the configuration (the file, or the flags), says whether it can be served, and
    /// exits: 0 if it can, 1 with the reason if not. Nothing is listened on or allocated.
    #[arg(long)]
    check_config: bool,
    /// How logs are written to standard error: `text` or `json` (one object a line).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// The least severe log level written: error, warn, info, debug or trace.
    #[arg(long, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,
    /// Serves GET /metrics (Prometheus text: connections, commands, refusals, quotas, keys,
    /// decisions by declared quota) on this address, e.g. 127.0.0.1:9187; its address is
    /// printed after the RESP listeners'.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Seconds that connections in flight may take to finish on SIGTERM.
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    /// The address to listen on (127.0.0.1 by default: expose it deliberately).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    bind: IpAddr,
    /// The port (0: any free one, printed on the first line of output).
    #[arg(long, default_value_t = 6380)]
    port: u16,
    /// A declared quota, `max_burst:count:period[:capacity]` (`15:30:60`), built at start and
    /// never dropped; repeat for more. Declare every quota your clients rely on: no client can
    /// take a declared quota's room.
    #[arg(long = "quota", value_name = "MAX_BURST:COUNT:PERIOD[:CAPACITY]")]
    quotas: Vec<Quota>,
    /// Keys per table of a quota (a declared one without its own capacity, and every
    /// undeclared one): about 37 bytes a key.
    #[arg(long, default_value_t = 1 << 20)]
    capacity: usize,
    /// Undeclared quotas (a (max_burst, count, period) no --quota names) held at once, each a
    /// table of --capacity keys allocated when first used (one at a time). At the limit, one
    /// unused for its quota's fill time (every key full again) makes room for a new one;
    /// otherwise the new quota is refused. 0: serve the declared quotas only.
    #[arg(long, default_value_t = 8)]
    max_quotas: usize,
    /// The longest fill time, in seconds, of an undeclared quota ((max_burst + 1) × period /
    /// count): a longer one must be declared. Bounds how long a client can hold an undeclared
    /// table.
    #[arg(long, default_value_t = 3600)]
    max_fill_time: u64,
    /// The password of Redis's `default` user: connections must `AUTH <password>` first.
    /// Prefer the environment variable, which other users of the machine cannot read in the
    /// process list. With --config, the file's users apply instead (a user's `password_env`
    /// may name this variable).
    #[arg(long, env = "TOLLGATE_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// A user, `name:password`, for `AUTH name password`; repeat for more. With any user,
    /// connections must authenticate.
    #[arg(long = "user", value_name = "NAME:PASSWORD")]
    users: Vec<User>,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// The largest argument, in bytes (a larger one is refused and the connection closed,
    /// before any of it is buffered).
    #[arg(long, default_value_t = 64 * 1024)]
    max_arg_bytes: usize,
    /// The largest request, in bytes (a larger one is refused and the connection closed).
    #[arg(long, default_value_t = 1 << 20)]
    max_request_bytes: usize,
    /// Seconds a connection may stay silent before it is closed (0: never).
    #[arg(long, default_value_t = 300)]
    idle_timeout: u64,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Serves Envoy's global rate limit service (envoyproxy/ratelimit's API) from its YAML
    /// configuration: one file, or a directory of them read whole (one domain a file).
    /// Reloaded on SIGHUP and when its files change, keeping the counts of rules that did not
    /// change. Or the file's [envoy] section.
    #[arg(long, value_name = "PATH")]
    envoy_config: Option<PathBuf>,
    /// Where `ShouldRateLimit` is served over gRPC (with grpc.health.v1), with
    /// --envoy-config (default 127.0.0.1:8081, upstream's GRPC_PORT).
    #[arg(long, value_name = "ADDR", requires = "envoy_config")]
    envoy_grpc: Option<SocketAddr>,
    /// Where upstream's HTTP endpoints are served (/json, /healthcheck), with --envoy-config
    /// (none by default; upstream's PORT is 8080).
    #[arg(long, value_name = "ADDR", requires = "envoy_config")]
    envoy_http: Option<SocketAddr>,
    /// Distinct values each Envoy rule counts at once (a table per rule, allocated when the
    /// rule is first used: 40 bytes a value).
    #[arg(long, default_value_t = 65_536, requires = "envoy_config")]
    envoy_keys_per_rule: usize,
    /// Files of one domain add up instead of being refused (upstream's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "MERGE_DOMAIN_CONFIG")]
    envoy_merge_domains: bool,
    /// Files and directories of the Envoy configuration whose name starts with `.` are skipped
    /// (upstream's RUNTIME_IGNOREDOTFILES): set it for a Kubernetes ConfigMap, whose mount
    /// holds each file twice (`..data/` and a link beside it).
    #[arg(long, env = "RUNTIME_IGNOREDOTFILES")]
    envoy_ignore_dotfiles: bool,
    /// A request over a limit is answered OK overall (its statuses keep OVER_LIMIT) and
    /// counted (upstream's SHADOW_MODE).
    #[arg(long, env = "SHADOW_MODE")]
    envoy_shadow_mode: bool,
    /// Every Envoy rule in quota mode (upstream's QUOTA_MODE).
    #[arg(long, env = "QUOTA_MODE")]
    envoy_quota_mode: bool,
    /// Answers carry the most constraining limit as three headers for the client (upstream's
    /// LIMIT_RESPONSE_HEADERS_ENABLED; names from LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
    /// LIMIT_RESET_HEADER, default RateLimit-Limit, -Remaining, -Reset).
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED")]
    envoy_response_headers: bool,
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit", hide = true)]
    envoy_limit_header: String,
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining", hide = true)]
    envoy_remaining_header: String,
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset", hide = true)]
    envoy_reset_header: String,
    /// Hits above this share of a limit count as near it (upstream's NEAR_LIMIT_RATIO).
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = near_limit_ratio)]
    envoy_near_limit_ratio: f32,
    /// Answers carry Envoy dynamic metadata: the request and the metadata of the rules it
    /// passed (upstream's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA")]
    envoy_response_dynamic_metadata: bool,
    /// Keeps the Envoy rules' windows in Redis, shared by every instance pointed at it (one
    /// script call per request): `redis://host:port[/db]` or upstream's `host:port`;
    /// several, comma-separated, with --envoy-redis-cluster (upstream's REDIS_URL, as a flag).
    #[arg(long, value_name = "URL", requires = "envoy_config", value_delimiter = ',')]
    envoy_redis: Vec<String>,
    /// --envoy-redis names nodes of a Redis Cluster.
    #[arg(long, requires = "envoy_redis")]
    envoy_redis_cluster: bool,
    /// Prepended to every Redis key of the Envoy rules.
    #[arg(long, default_value = "tollgate:envoy:", requires = "envoy_redis")]
    envoy_redis_prefix: String,
    /// Milliseconds a request waits for Redis before the failure policy answers.
    #[arg(long, default_value_t = 100, requires = "envoy_redis")]
    envoy_redis_timeout_ms: u64,
    /// What a request gets when Redis cannot answer in time: error (gRPC UNAVAILABLE, so that
    /// Envoy's failure_mode_deny decides), allow, deny, or local (this instance's own tables).
    #[arg(long, default_value = "error", value_parser = tollgate_server::file::ON_FAILURE, requires = "envoy_redis")]
    envoy_redis_on_failure: String,
    /// Milliseconds a lease of a rule with `lease: true` lives at most (never past its window).
    #[arg(long, default_value_t = 50, requires = "envoy_redis")]
    envoy_redis_lease_ttl_ms: u64,
}

/// Envoy's rate limit service, as the file or the flags set it, and its Redis backend once
/// connected (made once, kept across reloads).
#[derive(Clone, Debug)]
struct Envoy {
    settings: tollgate_server::file::Envoy,
    backend: Option<tollgate_envoy::RedisBackend>,
}

/// `--envoy-near-limit-ratio`: a number, checked as the file's `near_limit_ratio` is.
fn near_limit_ratio(text: &str) -> Result<f32, String> {
    let v: f64 = text.parse().map_err(|e| format!("{text:?} is not a number: {e}"))?;
    tollgate_server::file::near_limit_ratio(v)
}

/// The `--envoy-*` flags as the file's `[envoy]` section.
fn envoy_from_flags(args: &Args) -> Option<tollgate_server::file::Envoy> {
    let defaults = tollgate_server::file::Envoy::default();
    Some(tollgate_server::file::Envoy {
        config: args.envoy_config.clone()?,
        grpc: args.envoy_grpc.unwrap_or(defaults.grpc),
        http: args.envoy_http,
        keys_per_rule: args.envoy_keys_per_rule,
        merge_domains: args.envoy_merge_domains,
        ignore_dotfiles: args.envoy_ignore_dotfiles,
        shadow_mode: args.envoy_shadow_mode,
        quota_mode: args.envoy_quota_mode,
        response_headers: args.envoy_response_headers.then(|| {
            [
                args.envoy_limit_header.clone(),
                args.envoy_remaining_header.clone(),
                args.envoy_reset_header.clone(),
            ]
        }),
        near_limit_ratio: args.envoy_near_limit_ratio,
        dynamic_metadata: args.envoy_response_dynamic_metadata,
        redis: (!args.envoy_redis.is_empty()).then(|| tollgate_server::file::EnvoyRedis {
            urls: args.envoy_redis.clone(),
            cluster: args.envoy_redis_cluster,
            prefix: args.envoy_redis_prefix.clone(),
            timeout: Duration::from_millis(args.envoy_redis_timeout_ms.max(1)),
            on_failure: args.envoy_redis_on_failure.clone(),
            lease_ttl: Duration::from_millis(args.envoy_redis_lease_ttl_ms.max(1)),
        }),
    })
}

/// Connects the Envoy rules' Redis backend.
async fn connect_redis(
    r: &tollgate_server::file::EnvoyRedis,
) -> Result<tollgate_envoy::RedisBackend, String> {
    // Upstream's REDIS_URL is `host:port`.
    let urls: Vec<String> =
        r.urls.iter().map(|u| if u.contains("://") { u.clone() } else { format!("redis://{u}") }).collect();
    let builder = tollgate_envoy::tollgate_redis::RedisWindows::builder()
        .prefix(r.prefix.as_bytes())
        .timeout(r.timeout);
    let builder = if r.cluster { builder.cluster(urls) } else { builder.url(urls[0].clone()) };
    let windows =
        builder.connect().await.map_err(|e| format!("cannot reach Redis for the Envoy rules: {e}"))?;
    let on_failure = tollgate_envoy::OnRedisFailure::parse(&r.on_failure)
        .ok_or_else(|| format!("{:?} is not a failure policy", r.on_failure))?;
    let leases = tollgate_envoy::tollgate_redis::LeasedWindows::new(windows).lease_ttl(r.lease_ttl);
    Ok(tollgate_envoy::RedisBackend::with_leases(leases, on_failure))
}

impl Envoy {
    fn new(settings: tollgate_server::file::Envoy) -> Envoy {
        Envoy { settings, backend: None }
    }

    fn options(&self) -> tollgate_envoy::LoadOptions {
        tollgate_envoy::LoadOptions {
            merge_domains: self.settings.merge_domains,
            ignore_dotfiles: self.settings.ignore_dotfiles,
        }
    }

    fn service_settings(&self) -> tollgate_envoy::Settings {
        let s = &self.settings;
        tollgate_envoy::Settings {
            shadow_mode: s.shadow_mode,
            quota_mode: s.quota_mode,
            response_headers: s
                .response_headers
                .clone()
                .map(|[limit, remaining, reset]| tollgate_envoy::HeaderNames { limit, remaining, reset }),
            near_limit_ratio: s.near_limit_ratio,
            dynamic_metadata: s.dynamic_metadata,
        }
    }

    /// The configuration at `path` (a file or a directory).
    fn config(&self) -> Result<tollgate_envoy::Config, String> {
        let loaded = if self.settings.config.is_dir() {
            tollgate_envoy::Config::from_dir(&self.settings.config, self.options())
        } else {
            tollgate_envoy::Config::from_file(&self.settings.config, self.options())
        };
        loaded.map_err(|e| self.named(&e))
    }

    fn limits(&self) -> Result<tollgate_envoy::Limits, String> {
        let mut limits = tollgate_envoy::Limits::new(self.config()?, self.settings.keys_per_rule)
            .map_err(|e| self.named(&e))?;
        if let Some(backend) = &self.backend {
            limits = limits.with_redis(backend.clone());
        }
        Ok(limits.with_settings(self.service_settings()))
    }

    /// An error of the configuration, under the directory's path when it came from one (a
    /// file's error already names it).
    fn named(&self, e: &tollgate_envoy::ConfigError) -> String {
        if self.settings.config.is_dir() {
            format!("{}: {e}", self.settings.config.display())
        } else {
            e.to_string()
        }
    }
}

fn main() {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // TOLLGATE_REQUIREPASS in the environment is for the file's `password_env` too; only the
    // flag itself conflicts with a file.
    if args.config.is_some() && matches.value_source("requirepass") == Some(ValueSource::CommandLine) {
        fail("--requirepass cannot be used with --config: give the password in the file (password or password_env)");
    }
    logging(&args.log_format, &args.log_level);
    let (config, service) = match &args.config {
        Some(path) => file::load(path).unwrap_or_else(|e| fail(&e.to_string())),
        None => from_flags(&args),
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = service.threads {
        runtime.worker_threads(t.max(1));
    }
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    };
    let envoy_settings = match (service.envoy.clone(), envoy_from_flags(&args)) {
        (Some(_), Some(_)) => {
            fail("Envoy's service is set both in the file ([envoy]) and by --envoy-config: give one")
        }
        (file, flags) => file.or(flags),
    };
    let mut envoy = envoy_settings.map(Envoy::new);
    if let Some(e) = &mut envoy {
        if let Some(redis) = &e.settings.redis {
            e.backend = Some(runtime.block_on(connect_redis(redis)).unwrap_or_else(|err| fail(&err)));
        }
    }
    if args.check_config {
        if let Some(e) = &envoy {
            match e.limits() {
                Ok(l) => {
                    println!(
                        "{}: OK ({} Envoy domain(s))",
                        e.settings.config.display(),
                        l.config().domains().count()
                    )
                }
                Err(e) => fail(&format!("invalid Envoy configuration: {e}")),
            }
        }
        check(&config, &service, args.config.as_deref());
    }
    let envoy = envoy.map(|e| match e.limits() {
        Ok(limits) => (e, tollgate_envoy::Service::new(limits)),
        Err(err) => fail(&format!("invalid Envoy configuration: {err}")),
    });
    let server = match Server::new(config) {
        Ok(s) => s,
        Err(e) => fail(&format!("invalid configuration: {e}")),
    };
    let clean = runtime.block_on(run(server, service, args.config, envoy));
    // Connections still open past the shutdown timeout are dropped with the runtime.
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(if clean { 0 } else { 2 });
}

/// Serves every listener until SIGTERM or Ctrl-C, reloading `path` on SIGHUP; whether every
/// connection closed within the shutdown timeout.
async fn run(
    server: Arc<Server>,
    service: Service,
    path: Option<PathBuf>,
    envoy: Option<(Envoy, tollgate_envoy::Service)>,
) -> bool {
    // The signals are handled before any address is printed: a SIGTERM sent as soon as the
    // process says where it listens must drain, not kill it with its connections unanswered.
    let signal = |kind| {
        tokio::signal::unix::signal(kind).unwrap_or_else(|e| fail(&format!("cannot handle signals: {e}")))
    };
    let (mut hangup, mut terminate) = (
        signal(tokio::signal::unix::SignalKind::hangup()),
        signal(tokio::signal::unix::SignalKind::terminate()),
    );
    let mut listening = Vec::new();
    // Envoy's listeners finish their calls in flight at shutdown, within the shutdown timeout.
    let mut envoy_tasks = Vec::new();
    for addr in &service.listeners {
        let listener = bind(*addr, "", "tollgate-server listening on ", "", "listening").await;
        listening.push(tokio::spawn(Arc::clone(&server).serve(listener)));
    }
    if let Some(addr) = service.metrics {
        let listener =
            bind(addr, " for metrics", "tollgate-server metrics on http://", "/metrics", "serving /metrics")
                .await;
        listening.push(tokio::spawn(Arc::clone(&server).serve_metrics(listener)));
    }
    let (stop_envoy, envoy_stopped) = tokio::sync::watch::channel(false);
    if let Some((settings, rls)) = &envoy {
        // Upstream's statistics on the same /metrics.
        let reported = rls.clone();
        server.add_report(move || reported.limits().report_metrics());
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let grpc = "serving Envoy's rate limit service (gRPC)";
        let listener =
            bind(settings.settings.grpc, " for Envoy's gRPC", "tollgate-server envoy grpc on ", "", grpc)
                .await;
        let (rls_grpc, until) = (rls.clone(), stopped(envoy_stopped.clone()));
        envoy_tasks.push(tokio::spawn(async move {
            if let Err(e) = rls_grpc.serve(listener, until).await {
                tracing::error!(error = %e, "Envoy's gRPC listener failed");
            }
        }));
        if let Some(addr) = settings.settings.http {
            let http = "serving Envoy's rate limit service (/json, /healthcheck)";
            let listener =
                bind(addr, " for Envoy's HTTP", "tollgate-server envoy http on http://", "/json", http).await;
            let (rls_http, until) = (rls.clone(), stopped(envoy_stopped.clone()));
            envoy_tasks.push(tokio::spawn(async move { rls_http.serve_http(listener, until).await }));
        }
    }
    let _ = std::io::stdout().flush();
    // Envoy's rules also reload when their files change (upstream watches its runtime
    // directory): their names, sizes and times, looked at once a second.
    let mut watch = tokio::time::interval(Duration::from_secs(1));
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seen = envoy.as_ref().map(|(e, _)| fingerprint(&e.settings.config));
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                reload(&server, path.as_deref());
                if let Some((settings, rls)) = &envoy {
                    seen = Some(fingerprint(&settings.settings.config));
                    reload_envoy(settings, rls);
                }
            }
            _ = watch.tick(), if envoy.is_some() => {
                if let Some((settings, rls)) = &envoy {
                    let now = fingerprint(&settings.settings.config);
                    if seen.as_ref() != Some(&now) {
                        seen = Some(now);
                        tracing::info!(path = %settings.settings.config.display(), "Envoy configuration changed");
                        reload_envoy(settings, rls);
                    }
                }
            }
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    tracing::info!(connections = server.connections(), "shutting down: no new connections");
    server.shutdown();
    let _ = stop_envoy.send(true);
    for l in listening {
        let _ = l.await;
    }
    let deadline = tokio::time::Instant::now() + service.shutdown_timeout;
    let mut envoy_clean = true;
    for task in envoy_tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout_at(deadline, task).await.is_err() {
            abort.abort();
            envoy_clean = false;
        }
    }
    let clean =
        server.drained(deadline.saturating_duration_since(tokio::time::Instant::now())).await && envoy_clean;
    if clean {
        tracing::info!("stopped");
    } else {
        tracing::warn!(
            connections = server.connections(),
            timeout_secs = service.shutdown_timeout.as_secs_f64(),
            "stopped with connections still open at the shutdown timeout"
        );
    }
    clean
}

/// SIGHUP: the file read again and applied, or refused with the reason and the running
/// configuration kept.
fn reload(server: &Server, path: Option<&Path>) {
    let Some(path) = path else {
        tracing::warn!("SIGHUP: nothing to reload (started with flags, not --config)");
        return;
    };
    let loaded = file::load(path).map_err(|e| e.to_string());
    match loaded.and_then(|(config, _)| server.reload(config).map_err(|e| format!("{}: {e}", path.display())))
    {
        Ok(done) => {
            let show = |qs: &[Quota]| qs.iter().map(Quota::to_string).collect::<Vec<_>>().join(" ");
            tracing::info!(
                file = %path.display(),
                declared = show(&done.declared),
                undeclared = show(&done.undeclared),
                "reloaded"
            );
            if !done.needs_restart.is_empty() {
                tracing::warn!(
                    settings = done.needs_restart.join(" "),
                    "reloaded, but these settings change only at a restart (and the listeners, threads and shutdown timeout)"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "reload refused: the running configuration is kept"),
    }
}

/// A listener on `addr` (or the process ends, saying what it was `for`), announced on standard
/// output as `{printed}{local address}{path}` and in the log as `logged`.
async fn bind(
    addr: SocketAddr,
    what_for: &str,
    printed: &str,
    path: &str,
    logged: &'static str,
) -> tokio::net::TcpListener {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => fail(&format!("cannot listen on {addr}{what_for}: {e}")),
    };
    let local = listener.local_addr().map_or(addr, |a| a);
    println!("{printed}{local}{path}");
    tracing::info!(%local, "{logged}");
    listener
}

/// SIGHUP for Envoy's configuration: read again and applied (the counts of unchanged rules
/// kept), or refused with the reason and the running configuration kept.
/// What a change of the Envoy rules changes: every file's path, length and modification time
/// under `path` (a file, or a directory read recursively), in order.
fn fingerprint(path: &Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    let mut pending = vec![path.to_owned()];
    while let Some(p) = pending.pop() {
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => {
                if let Ok(entries) = std::fs::read_dir(&p) {
                    pending.extend(entries.flatten().map(|e| e.path()));
                }
            }
            Ok(m) => out.push((p, m.len(), m.modified().ok())),
            Err(_) => out.push((p, 0, None)),
        }
    }
    out.sort();
    out
}

fn reload_envoy(settings: &Envoy, rls: &tollgate_envoy::Service) {
    let next = settings.config().and_then(|c| rls.limits().reloaded(c).map_err(|e| settings.named(&e)));
    match next {
        Ok(limits) => {
            let domains = limits.config().domains().count();
            rls.replace(limits);
            tracing::info!(path = %settings.settings.config.display(), domains, "Envoy configuration reloaded");
        }
        Err(e) => tracing::error!(error = %e, "Envoy reload refused: the running configuration is kept"),
    }
}

/// --check-config: whether the configuration can be served, without serving it.
fn check(config: &Config, service: &Service, path: Option<&Path>) -> ! {
    match tollgate_server::check(config) {
        Ok(()) => {
            let from = path.map_or_else(|| "the flags".to_owned(), |p| p.display().to_string());
            println!(
                "{from}: OK ({} listener(s), {} declared quota(s), {} user(s))",
                service.listeners.len(),
                config.quotas.len(),
                config.users.len()
            );
            std::process::exit(0);
        }
        Err(e) => fail(&format!("invalid configuration: {e}")),
    }
}

fn from_flags(args: &Args) -> (Config, Service) {
    let mut users = args.users.clone();
    if let Some(password) = args.requirepass.clone().filter(|p| !p.is_empty()) {
        users.push(User { name: "default".to_owned(), password });
    }
    let config = Config {
        capacity: args.capacity,
        max_quotas: args.max_quotas,
        max_fill_time: Duration::from_secs(args.max_fill_time),
        quotas: args.quotas.clone(),
        users,
        max_connections: args.max_connections.max(1),
        idle_timeout: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
        limits: Limits {
            max_arg_bytes: args.max_arg_bytes,
            max_request_bytes: args.max_request_bytes,
            ..Limits::default()
        },
    };
    let service = Service {
        envoy: None,
        listeners: vec![SocketAddr::new(args.bind, args.port)],
        threads: args.threads,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        metrics: args.metrics,
    };
    (config, service)
}

/// Logs to standard error, as text or JSON lines, from `level` up.
fn logging(format: &str, level: &str) {
    let level: tracing::Level = level.parse().unwrap_or(tracing::Level::INFO);
    let builder =
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level).with_target(false);
    if format == "json" {
        builder.json().init();
    } else {
        builder.with_ansi(false).init();
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("tollgate-server: {msg}");
    std::process::exit(1);
}
