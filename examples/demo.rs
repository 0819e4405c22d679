//! Runs a direct limiter on the real clock and prints its decisions.
//!
//! ```sh
//! cargo run --release --example demo
//! ```

use std::time::{Duration, Instant};

use tollgate::{Limiter, Outcome, Rate, TokenBucket};

fn main() -> Result<(), tollgate::ConfigError> {
    // 5 requests per second, bursts of up to 3.
    let quota = TokenBucket::new(Rate::per_second(5), 3)?;
    let limiter = Limiter::new(quota);
    println!(
        "quota: 5/s, burst 3 (units: 1/{} ns, {} units per token)",
        quota.units_per_nano(),
        quota.units_per_token()
    );
    println!(
        "{:>8}  {:<12} {:>9} {:>13} {:>13}",
        "t (ms)", "outcome", "remaining", "retry_after", "reset_after"
    );

    let start = Instant::now();
    let mut allowed = 0;
    while start.elapsed() < Duration::from_millis(1_500) {
        let d = limiter.check();
        let retry = d.retry_after().map_or("never".to_string(), |r| format!("{r:.1?}"));
        println!(
            "{:>8.1}  {:<12} {:>9} {:>13} {:>13}",
            start.elapsed().as_secs_f64() * 1e3,
            format!("{:?}", d.outcome()),
            d.remaining(),
            retry,
            format!("{:.1?}", d.reset_after()),
        );
        if d.outcome() == Outcome::Allowed {
            allowed += 1;
            std::thread::sleep(Duration::from_millis(20));
        } else {
            // Back off exactly as long as the limiter says.
            std::thread::sleep(d.retry_after().unwrap_or(Duration::from_millis(100)));
        }
    }
    println!("allowed {allowed} in {:.2?}: burst 3 + 5/s × 1.5 s = at most 10", start.elapsed());

    let too_big = limiter.check_n(4);
    println!(
        "a request for 4 tokens (above the burst of 3): {:?}, retry_after {:?}",
        too_big.outcome(),
        too_big.retry_after()
    );
    Ok(())
}
