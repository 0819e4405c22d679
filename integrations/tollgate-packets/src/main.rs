//! `tollgate-police`: polices a capture per flow with tollgate's meters, or writes a synthetic
//! capture to police.
//!
//! ```text
//! tollgate-police police --meter "srtcm cir=10Mbit/s cbs=16KiB ebs=32KiB" in.pcap out.pcap
//! tollgate-police police --meter "trtcm cir=1Mbit/s cbs=8KiB pir=2Mbit/s pbs=16KiB" \
//!     --key src/24,64 --yellow remark=af21 --red drop --stats flows.csv in.pcapng
//! tollgate-police generate --flows 10000 --packets 1000000 synthetic.pcap
//! ```

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tollgate::Meter;
use tollgate_packets::generate::{generate, Synthetic};
use tollgate_packets::packet::KeyBy;
use tollgate_packets::police::{police, Action, Policy};

#[derive(Parser)]
#[command(
    name = "tollgate-police",
    version,
    about = "Police a capture per flow with RFC 2697/2698/4115 meters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Meter every packet of a capture (pcap or pcapng) per flow, act on its colour, and write
    /// what passes.
    Police {
        /// The meter every flow gets: "srtcm cir=... cbs=... ebs=...", "trtcm cir=... cbs=...
        /// pir=... pbs=...", "rfc4115 cir=... cbs=... eir=... ebs=...".
        #[arg(long)]
        meter: Meter,
        /// What makes a flow: 5tuple, or src/V4BITS,V6BITS (src/24,64).
        #[arg(long, default_value = "5tuple", value_parser = parse_key)]
        key: KeyBy,
        /// What green packets get: pass, drop, remark=DSCP.
        #[arg(long, default_value = "pass")]
        green: Action,
        /// What yellow packets get.
        #[arg(long, default_value = "remark=af12")]
        yellow: Action,
        /// What red packets get.
        #[arg(long, default_value = "drop")]
        red: Action,
        /// What malformed packets get: drop or pass (packets that are not IP always pass).
        #[arg(long, default_value = "drop", value_parser = parse_malformed)]
        malformed: Action,
        /// Flows the table holds at once (a new flow beyond its room is red).
        #[arg(long, default_value_t = 1 << 20)]
        capacity: usize,
        /// Per-flow statistics, as CSV (a .csv file) or JSON (any other name).
        #[arg(long)]
        stats: Option<PathBuf>,
        /// The capture to police.
        input: PathBuf,
        /// Where to write what passes (in the input's format).
        output: Option<PathBuf>,
    },
    /// Write a synthetic capture: Zipf flows, IMIX sizes, some malformed frames.
    Generate {
        #[arg(long, default_value_t = 1_000)]
        flows: usize,
        #[arg(long, default_value_t = 100_000)]
        packets: usize,
        /// The Zipf exponent of the flows' packet counts.
        #[arg(long, default_value_t = 1.0)]
        zipf: f64,
        /// The aggregate rate, in bits per second.
        #[arg(long, default_value_t = 1_000_000_000)]
        rate: u64,
        /// Malformed and non-IP frames, per million.
        #[arg(long, default_value_t = 1_000)]
        malformed_ppm: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The capture to write (pcap).
        output: PathBuf,
    },
}

fn parse_key(s: &str) -> Result<KeyBy, String> {
    if s == "5tuple" {
        return Ok(KeyBy::FiveTuple);
    }
    let bad = || format!("`{s}` is not a key: 5tuple, or src/V4BITS,V6BITS such as src/24,64");
    let bits = s.strip_prefix("src/").ok_or_else(bad)?;
    let (v4, v6) = bits.split_once(',').ok_or_else(bad)?;
    let v4: u8 = v4.parse().ok().filter(|&b| b <= 32).ok_or_else(bad)?;
    let v6: u8 = v6.parse().ok().filter(|&b| b <= 128).ok_or_else(bad)?;
    Ok(KeyBy::SourcePrefix { v4, v6 })
}

fn parse_malformed(s: &str) -> Result<Action, String> {
    match s {
        "pass" => Ok(Action::Pass),
        "drop" => Ok(Action::Drop),
        _ => Err(format!("`{s}`: malformed packets are dropped or passed (drop, pass)")),
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Police { meter, key, green, yellow, red, malformed, capacity, stats, input, output } => {
            let file = File::open(&input).map_err(|e| format!("{}: {e}", input.display()))?;
            let out = match &output {
                Some(path) => {
                    Some(BufWriter::new(File::create(path).map_err(|e| format!("{}: {e}", path.display()))?))
                }
                None => None,
            };
            let policy = Policy {
                meter,
                key_by: key,
                actions: [green, yellow, red],
                malformed,
                capacity,
                per_flow: stats.is_some(),
            };
            let report = police(BufReader::new(file), out, &policy)
                .map_err(|e| format!("{}: {e}", input.display()))?;
            print!("{report}");
            if let Some(path) = stats {
                let mut f =
                    BufWriter::new(File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?);
                let written = if path.extension().is_some_and(|e| e == "csv") {
                    report.flows_csv(&mut f)
                } else {
                    report.flows_json(&mut f)
                };
                written.and_then(|()| f.flush()).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Ok(())
        }
        Command::Generate { flows, packets, zipf, rate, malformed_ppm, seed, output } => {
            let mut f =
                BufWriter::new(File::create(&output).map_err(|e| format!("{}: {e}", output.display()))?);
            let s = Synthetic {
                flows,
                packets,
                zipf,
                rate_bps: rate,
                malformed_ppm,
                seed,
                ..Synthetic::default()
            };
            let made = generate(&mut f, &s).map_err(|e| format!("{}: {e}", output.display()))?;
            f.flush().map_err(|e| format!("{}: {e}", output.display()))?;
            println!(
                "{} frames: {} IP ({} jumbo), {} made not to be metered",
                made.frames,
                made.ip,
                made.jumbo,
                made.unmetered.iter().sum::<u64>()
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-police: {e}");
            ExitCode::FAILURE
        }
    }
}
