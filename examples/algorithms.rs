//! The five algorithms on one timeline: the same burst of requests, and what each admits.
//!
//! ```sh
//! cargo run --example algorithms
//! ```

use std::time::Duration;

use tollgate::{
    Algorithm, Direct, FixedWindow, ManualClock, Nanos, Nginx, SlidingLog, SlidingWindow, TokenBucket,
};

/// Ten requests 100 ms apart, starting 900 ms into the limiter's life; how many pass.
fn run<A: Algorithm>(name: &str, config: A) -> usize {
    let clock = ManualClock::new();
    let limiter = Direct::with_clock(config, clock.clone());
    let admitted = (0..10)
        .filter(|i| {
            limiter
                .check_at(Nanos::from_duration_saturating(Duration::from_millis(900 + 100 * i)))
                .is_allowed_now()
        })
        .count();
    println!("{name:>15}: {admitted} of 10 served at once");
    admitted
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // All "5 per second", read from the same kind of string.
    let bucket = run("token bucket", "5/s".parse::<TokenBucket>()?);
    let nginx = run("nginx nodelay", "5r/s burst=2 nodelay".parse::<Nginx>()?);
    let fixed = run("fixed window", "5/s".parse::<FixedWindow>()?);
    let sliding = run("sliding window", "5/s".parse::<SlidingWindow>()?);
    let log = run("sliding log", "5/s".parse::<SlidingLog>()?);
    // The fixed window admits a burst on each side of the boundary at 1 s; the log never
    // more than 5 in any second.
    assert!(fixed >= log && log <= 5 + 1 && bucket >= 5);
    assert!(nginx > 0 && sliding > 0);
    Ok(())
}
