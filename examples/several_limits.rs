//! nginx's two zones in one location (`limit_req zone=per_ip` beside `zone=per_server`), as
//! one all-or-nothing decision: a refused request is charged to neither.
//!
//! ```sh
//! cargo run --example several_limits
//! ```

use tollgate::{check_all, Admit, KeyedNginx, ManualClock, Nginx, NginxLimiter, Outcome};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let per_ip =
        KeyedNginx::<u32>::builder("1r/s burst=2 nodelay".parse()?).build_with_clock(clock.clone())?;
    let per_server = NginxLimiter::with_clock("3r/s burst=3".parse::<Nginx>()?, clock.clone());

    let mut outcomes = Vec::new();
    for ip in [1u32, 1, 1, 1, 2, 2] {
        let d = check_all(&[&per_ip.limit(&ip) as &dyn Admit, &per_server], 1);
        println!("ip {ip}: {:?}, delay {:?}", d.outcome(), d.delay());
        outcomes.push(d.outcome());
    }
    // ip 1: three pass per_ip (burst 2, nodelay), the fourth is refused there and charged to
    // neither; per_server queues past its rate (Delayed) up to its burst.
    assert_eq!(outcomes[3], Outcome::Denied);
    assert!(outcomes[..3].iter().all(|o| matches!(o, Outcome::Allowed | Outcome::Delayed)));
    Ok(())
}
