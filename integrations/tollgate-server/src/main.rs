//! `tollgate-server`: the RESP server (see the library's docs).
//!
//! ```sh
//! cargo run --release -p tollgate-server -- --port 6380
//! redis-cli -p 6380 CL.THROTTLE user123 15 30 60
//! ```

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use clap::Parser;
use tollgate_server::{resp::Limits, Config, Quota, Server, User};

/// A RESP server compatible with redis-cell's CL.THROTTLE, on tollgate's keyed token bucket.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
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
    /// process list.
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
}

fn main() {
    let args = Args::parse();
    let mut users = args.users;
    if let Some(password) = args.requirepass.filter(|p| !p.is_empty()) {
        users.push(User { name: "default".to_owned(), password });
    }
    let config = Config {
        capacity: args.capacity,
        max_quotas: args.max_quotas,
        max_fill_time: std::time::Duration::from_secs(args.max_fill_time),
        quotas: args.quotas,
        users,
        max_connections: args.max_connections.max(1),
        idle_timeout: (args.idle_timeout > 0).then(|| std::time::Duration::from_secs(args.idle_timeout)),
        limits: Limits {
            max_arg_bytes: args.max_arg_bytes,
            max_request_bytes: args.max_request_bytes,
            ..Limits::default()
        },
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = args.threads {
        runtime.worker_threads(t.max(1));
    }
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    };
    let server = match Server::new(config) {
        Ok(s) => s,
        Err(e) => fail(&format!("invalid configuration: {e}")),
    };
    runtime.block_on(async {
        let addr = SocketAddr::new(args.bind, args.port);
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => fail(&format!("cannot listen on {addr}: {e}")),
        };
        let local = listener.local_addr().map_or(addr, |a| a);
        println!("tollgate-server listening on {local}");
        let _ = std::io::stdout().flush();
        tokio::select! {
            () = server.serve(listener) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
}

fn fail(msg: &str) -> ! {
    eprintln!("tollgate-server: {msg}");
    std::process::exit(1);
}
