//! Synthetic captures for tests and benchmarks: many flows with Zipf-distributed packet
//! counts, IMIX sizes (IP packets of 40, 576 and 1,500 bytes, 7:4:1, and a few 9,000-byte
//! jumbo frames), IPv4 and IPv6, TCP and UDP, at an aggregate rate, with some malformed
//! frames of every kind the reader counts.

use std::io::Write;
use std::time::Duration;

use etherparse::PacketBuilder;
use pcap_file::DataLink;

use crate::capture::{CaptureError, CaptureWriter, Frame, Record};
use crate::packet::Unmetered;

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct Synthetic {
    /// Distinct flows.
    pub flows: usize,
    /// Frames in all.
    pub packets: usize,
    /// The Zipf exponent of the flows' packet counts (1.0: the k-th flow gets 1/k of the first's).
    pub zipf: f64,
    /// The aggregate rate the frames arrive at, in bits per second.
    pub rate_bps: u64,
    /// Malformed and non-IP frames, per million.
    pub malformed_ppm: u32,
    /// The share of flows on IPv6, per million.
    pub ipv6_ppm: u32,
    /// The generator's seed.
    pub seed: u64,
}

impl Default for Synthetic {
    fn default() -> Synthetic {
        Synthetic {
            flows: 1_000,
            packets: 100_000,
            zipf: 1.0,
            rate_bps: 1_000_000_000,
            malformed_ppm: 1_000,
            ipv6_ppm: 200_000,
            seed: 1,
        }
    }
}

/// What was generated: frames by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generated {
    /// Frames written.
    pub frames: u64,
    /// Well-formed IP packets (the jumbo ones included).
    pub ip: u64,
    /// Jumbo (9,000-byte) IP packets.
    pub jumbo: u64,
    /// Frames made not to be metered, by the reason the reader gives ([`Unmetered::ALL`]'s
    /// order).
    pub unmetered: [u64; 6],
}

/// A small, fast generator (splitmix64): reproducible from its seed (the generator's, and the
/// benchmark's).
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Flow {
    v6: bool,
    tcp: bool,
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
}

/// The Ethernet frame of one IP packet of `ip_len` bytes (at least its headers) of `flow`.
fn frame(flow: &Flow, ip_len: usize) -> Vec<u8> {
    let (mac_a, mac_b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let eth = PacketBuilder::ethernet2(mac_a, mac_b);
    let mut out = Vec::with_capacity(ip_len + 14);
    let v4 = |a: &[u8; 16]| [a[12], a[13], a[14], a[15]];
    macro_rules! finish {
        ($ip:expr) => {{
            if flow.tcp {
                let b = $ip.tcp(flow.sport, flow.dport, 1, 65_535);
                let payload = vec![0u8; (ip_len + 14).saturating_sub(b.size(0))];
                b.write(&mut out, &payload).expect("a Vec takes every write");
            } else {
                let b = $ip.udp(flow.sport, flow.dport);
                let payload = vec![0u8; (ip_len + 14).saturating_sub(b.size(0))];
                b.write(&mut out, &payload).expect("a Vec takes every write");
            }
        }};
    }
    if flow.v6 {
        finish!(eth.ipv6(flow.src, flow.dst, 64));
    } else {
        finish!(eth.ipv4(v4(&flow.src), v4(&flow.dst), 64));
    }
    out
}

/// Writes a synthetic capture (pcap, Ethernet, nanosecond timestamps) to `out`.
pub fn generate<W: Write>(out: W, s: &Synthetic) -> Result<Generated, CaptureError> {
    let mut rng = SplitMix(s.seed);
    let flows: Vec<Flow> = (0..s.flows.max(1))
        .map(|i| {
            let v6 = rng.below(1_000_000) < u64::from(s.ipv6_ppm);
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            let (a, b) = (rng.next().to_be_bytes(), rng.next().to_be_bytes());
            if v6 {
                src[..2].copy_from_slice(&[0x20, 0x01]);
                src[2..10].copy_from_slice(&a);
                src[10..16].copy_from_slice(&(i as u64).to_be_bytes()[2..]);
                dst[..2].copy_from_slice(&[0x20, 0x01]);
                dst[2..10].copy_from_slice(&b);
            } else {
                src[12..].copy_from_slice(&[10, a[0], a[1], a[2]]);
                dst[12..].copy_from_slice(&[192, 168, b[0], b[1]]);
            }
            Flow {
                v6,
                tcp: rng.next() & 1 == 0,
                src,
                dst,
                sport: 1024 + rng.below(60_000) as u16,
                dport: [80, 443, 53, 8080][rng.below(4) as usize],
            }
        })
        .collect();
    // The flows' Zipf weights, as a cumulative distribution.
    let mut cdf = Vec::with_capacity(flows.len());
    let mut total = 0.0;
    for k in 1..=flows.len() {
        total += 1.0 / (k as f64).powf(s.zipf);
        cdf.push(total);
    }
    let mut writer = CaptureWriter::pcap(out, DataLink::ETHERNET)?;
    let mut made = Generated::default();
    let start = Duration::from_secs(1_780_000_000);
    let mut elapsed_bits: u128 = 0;
    for i in 0..s.packets {
        let pick = rng.unit() * total;
        let flow = &flows[cdf.partition_point(|&c| c < pick).min(flows.len() - 1)];
        let ip_len = match rng.below(1_000) {
            0 => {
                made.jumbo += 1;
                9_000
            }
            r if r < 583 => 40,
            r if r < 916 => 576,
            _ => 1_500,
        };
        let mut data = frame(flow, ip_len);
        let mut orig_len = data.len() as u32;
        if rng.below(1_000_000) < u64::from(s.malformed_ppm) {
            if ip_len == 9_000 {
                made.jumbo -= 1;
            }
            let kind = match i % 4 {
                0 => {
                    data.truncate(14 + 10);
                    orig_len = data.len() as u32;
                    Unmetered::Truncated
                }
                1 if !flow.v6 => {
                    data[14] = 0x43; // version 4, IHL 3 words
                    Unmetered::BadIhl
                }
                2 if !flow.v6 => {
                    let claimed = u16::from_be_bytes([data[16], data[17]]).saturating_add(100);
                    data[16..18].copy_from_slice(&claimed.to_be_bytes());
                    Unmetered::BadLength
                }
                _ => {
                    // An ARP request: not IP.
                    data.truncate(14);
                    data[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
                    data.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
                    data.extend_from_slice(&[0; 20]);
                    orig_len = data.len() as u32;
                    Unmetered::NotIp
                }
            };
            made.unmetered[Unmetered::ALL.iter().position(|r| *r == kind).unwrap_or(0)] += 1;
        } else {
            made.ip += 1;
        }
        let ts = start
            + Duration::from_nanos(
                u64::try_from(elapsed_bits * 1_000_000_000 / u128::from(s.rate_bps.max(1)))
                    .unwrap_or(u64::MAX),
            );
        // Preamble, frame check sequence and gap: 24 bytes more on the wire than in the frame.
        elapsed_bits += (u128::from(orig_len) + 24) * 8;
        writer.write(&Record::Frame(Frame {
            timestamp: ts,
            link: DataLink::ETHERNET,
            orig_len,
            data,
            interface: 0,
            offset: 0,
        }))?;
        made.frames += 1;
    }
    Ok(made)
}
