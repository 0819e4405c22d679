//! An open-loop load generator: `--threads` threads share one `Pacer` at `--rate` requests per
//! second against a TCP echo server this example starts on 127.0.0.1, for `--seconds`. Each
//! request's latency is recorded twice, in HdrHistograms: from its *intended* send time (the
//! pacer's slot: what a user waiting on the system would see) and from when it was actually
//! sent (what a closed-loop generator reports, hiding every stall behind the requests it never
//! sent: coordinated omission). Both are printed side by side.
//!
//! ```sh
//! cargo run --release --example loadgen -- --rate 20000 --threads 2 --seconds 2
//! cargo run --release --example loadgen -- --arrivals poisson
//! ```

#![allow(clippy::cast_precision_loss, reason = "counts and nanoseconds printed as decimals")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tollgate::{Arrivals, Clock, Pacer, Rate, TscClock};

struct Args {
    rate: u64,
    threads: usize,
    seconds: f64,
    arrivals: Arrivals,
}

fn args() -> Result<Args, String> {
    let mut a = Args { rate: 20_000, threads: 2, seconds: 2.0, arrivals: Arrivals::Even };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rate" => a.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--arrivals" => {
                a.arrivals = match value()?.as_str() {
                    "even" => Arrivals::Even,
                    "uniform" => Arrivals::Uniform,
                    "poisson" => Arrivals::Poisson,
                    other => {
                        return Err(format!("--arrivals: expected even, uniform or poisson, got {other:?}"))
                    }
                }
            }
            other => {
                return Err(format!("unknown argument {other:?} (--rate, --threads, --seconds, --arrivals)"))
            }
        }
    }
    if a.threads == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        return Err("--threads and --seconds must be positive".into());
    }
    Ok(a)
}

/// An echo server: every connection gets its own thread, which sends back what it reads.
fn echo_server() -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let _ = stream.set_nodelay(true);
                let mut buf = [0u8; 8];
                while stream.read_exact(&mut buf).is_ok() && stream.write_all(&buf).is_ok() {}
            });
        }
    });
    Ok(addr)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let addr = echo_server()?;
    let clock = TscClock::new();
    let pacer =
        Arc::new(Pacer::with_clock(Rate::per_second(a.rate), clock.clone())?.with_arrivals(a.arrivals));
    let run = u64::try_from(Duration::try_from_secs_f64(a.seconds)?.as_nanos())?;
    let end = clock.now().as_u64() + run;
    let workers: Vec<_> = (0..a.threads)
        .map(|_| {
            let (pacer, clock) = (Arc::clone(&pacer), clock.clone());
            std::thread::spawn(move || -> std::io::Result<(Histogram<u64>, Histogram<u64>, u64)> {
                let mut stream = TcpStream::connect(addr)?;
                stream.set_nodelay(true)?;
                // Nanoseconds, 3 significant digits, up to 60 s.
                let new = || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
                let (mut corrected, mut uncorrected, mut sent) = (new(), new(), 0u64);
                let mut buf = [0u8; 8];
                loop {
                    let intended = pacer.next();
                    if intended.as_u64() >= end {
                        return Ok((corrected, uncorrected, sent));
                    }
                    let start = clock.now();
                    stream.write_all(&sent.to_le_bytes())?;
                    stream.read_exact(&mut buf)?;
                    let done = clock.now().as_u64();
                    corrected.saturating_record(done - intended.as_u64());
                    uncorrected.saturating_record(done - start.as_u64());
                    sent += 1;
                }
            })
        })
        .collect();
    let (mut corrected, mut uncorrected, mut sent) =
        (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?, 0u64);
    for w in workers {
        let (c, u, n) = w.join().map_err(|_| "a worker panicked")??;
        corrected.add(c)?;
        uncorrected.add(u)?;
        sent += n;
    }
    let achieved = sent as f64 / a.seconds;
    println!(
        "{} threads, target {} req/s ({:?} arrivals), {:.1} s: {} requests, {:.0} req/s ({:+.3}% of target)",
        a.threads,
        a.rate,
        a.arrivals,
        a.seconds,
        sent,
        achieved,
        (achieved / a.rate as f64 - 1.0) * 100.0
    );
    println!("{:>8} {:>22} {:>22}", "", "from intended (µs)", "from sent (µs)");
    for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
        let label = if q == 1.0 { "max".to_string() } else { format!("p{}", q * 100.0) };
        println!(
            "{label:>8} {:>22.1} {:>22.1}",
            corrected.value_at_quantile(q) as f64 / 1e3,
            uncorrected.value_at_quantile(q) as f64 / 1e3
        );
    }
    Ok(())
}
