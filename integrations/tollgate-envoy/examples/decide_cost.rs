//! The cost of one `ShouldRateLimit` decision in the service alone (no gRPC): requests of 1 or
//! 3 descriptors over 1,000 or more distinct values, decided in a loop; prints nanoseconds per
//! request. Run it under `valgrind --tool=callgrind` for instructions per request, which hold
//! still on a noisy host where time does not.
//!
//! ```sh
//! cargo run --release -p tollgate-envoy --example decide_cost -- 3 1000 1000000
//! ```
//!
//! Arguments: descriptors per request (default 3), distinct values (default 1,000), requests
//! (default 1,000,000).

use tollgate_envoy::{Config, Limits, LoadOptions, Request, RequestDescriptor};
const RULES: &str = "domain: bench
descriptors:
  - key: k1
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k2
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k3
    rate_limit: {unit: second, requests_per_unit: 1000000}
";
fn main() {
    let d: usize = std::env::args().nth(1).map_or(3, |s| s.parse().unwrap());
    let values: u64 = std::env::args().nth(2).map_or(1000, |s| s.parse().unwrap());
    let iters: u64 = std::env::args().nth(3).map_or(1_000_000, |s| s.parse().unwrap());
    let config = Config::from_files([("b.yaml", RULES)], LoadOptions::default()).unwrap();
    let limits = Limits::new(config, values as usize * 2).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut reqs = Vec::new();
    for _ in 0..4096 {
        reqs.push(Request {
            domain: "bench".into(),
            descriptors: (1..=d)
                .map(|k| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D) % values;
                    RequestDescriptor {
                        entries: vec![(format!("k{k}"), format!("v{v}"))],
                        limit: None,
                        hits_addend: None,
                    }
                })
                .collect(),
            hits_addend: 1,
        });
    }
    let t = std::time::Instant::now();
    let mut ok = 0u64;
    for i in 0..iters {
        let r = limits.should_rate_limit(&reqs[(i % 4096) as usize]).unwrap();
        ok += r.statuses.len() as u64;
    }
    let el = t.elapsed();
    println!("{} ns/request ({ok})", el.as_nanos() as f64 / iters as f64);
}
