//! `tollgate-server`: the RESP server (see the library's docs).
//!
//! ```sh
//! cargo run --release -p tollgate-server -- --port 6380
//! redis-cli -p 6380 CL.THROTTLE user123 15 30 60
//! ```

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use clap::Parser;
use tollgate_server::{resp::Limits, Config, Server};

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
    /// Keys per quota (each distinct max_burst, count, period): the table's capacity.
    #[arg(long, default_value_t = 1 << 20)]
    capacity: usize,
    /// Distinct quotas the server holds, each a table of --capacity keys allocated when first
    /// used (about 48 bytes a slot, so the defaults bound the tables to about 0.4 GB, and one
    /// table more while a new one is built: one at a time). At the
    /// limit, a table unused for its quota's fill time (every key full again) makes room for a
    /// new quota; otherwise the new quota is refused.
    #[arg(long, default_value_t = 8)]
    max_quotas: usize,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// The largest argument, in bytes (a larger one is refused and skipped unbuffered).
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
    let config = Config {
        capacity: args.capacity,
        max_quotas: args.max_quotas,
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
            () = Server::new(config).serve(listener) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
}

fn fail(msg: &str) -> ! {
    eprintln!("tollgate-server: {msg}");
    std::process::exit(1);
}
