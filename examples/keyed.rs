//! Per-client limits in one lock-free table: a tier for paying clients, an IPv6 /64 per host,
//! and a batch of requests decided with one clock read.
//!
//! ```sh
//! cargo run --example keyed
//! ```

use std::net::IpAddr;

use tollgate::{IpPrefix, KeyedLimiter, ManualClock, TokenBucket, WhenFull};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let per_host = KeyedLimiter::<IpPrefix>::builder("5/s burst=5".parse()?)
        .capacity(10_000)
        .when_full(WhenFull::Deny)
        .tier("pro", "50/s burst=50".parse::<TokenBucket>()?)
        .build_with_clock(clock.clone())?;

    // Two addresses of one /64 share a limit: 5 requests between them.
    let a: IpAddr = "2001:db8:0:7::1".parse()?;
    let b: IpAddr = "2001:db8:0:7::2".parse()?;
    let admitted = (0..10)
        .filter(|i| per_host.check(&IpPrefix::new(if i % 2 == 0 { a } else { b })).is_allowed())
        .count();
    println!("one /64, 10 requests: {admitted} admitted");
    assert_eq!(admitted, 5);

    // A paying host gets the pro tier.
    let c: IpAddr = "2001:db8:0:8::1".parse()?;
    per_host.set_override(&IpPrefix::new(c), per_host.tier("pro").expect("built with it"))?;
    let admitted = (0..60).filter(|_| per_host.check(&IpPrefix::new(c)).is_allowed()).count();
    println!("a pro host, 60 requests: {admitted} admitted");
    assert_eq!(admitted, 50);

    // A second later, a batch: one clock read for all of them.
    clock.advance(std::time::Duration::from_secs(1));
    let items: Vec<(IpPrefix, u64)> =
        (1..=4u8).map(|i| (IpPrefix::new(IpAddr::from([10, 0, 0, i])), 1)).collect();
    let mut out = vec![tollgate::Decision::table_full(); items.len()];
    let n = per_host.check_batch(&items, &mut out);
    println!(
        "a batch of {n}: {} admitted; {} hosts tracked",
        out.iter().filter(|d| d.is_allowed()).count(),
        per_host.len()
    );
    assert!(out.iter().all(|d| d.is_allowed_now()));
    Ok(())
}
