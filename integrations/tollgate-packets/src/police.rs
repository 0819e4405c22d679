//! Policing a capture per flow: read, key, meter in bursts of 32, act on each colour, write.

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::str::FromStr;
use std::time::Duration;

use tollgate::{Color, FlowMeters, Meter, Nanos};

use crate::capture::{CaptureError, CaptureReader, CaptureWriter, Record};
use crate::packet::{self, FlowKey, KeyBy, Unmetered};

/// Packets a burst meters at once (with the table's prefetch).
pub const BURST: usize = 32;

/// What happens to a packet of a colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Written out as it came.
    Pass,
    /// Written out with its DSCP set to this (0 to 63).
    Remark(u8),
    /// Not written out.
    Drop,
}

impl FromStr for Action {
    type Err = String;

    /// `pass`, `drop`, or `remark=N` (a DSCP, 0 to 63; or its name: `af11` ... `af43`, `cs0`
    /// ... `cs7`, `ef`, `be`).
    fn from_str(s: &str) -> Result<Action, String> {
        match s {
            "pass" => return Ok(Action::Pass),
            "drop" => return Ok(Action::Drop),
            _ => {}
        }
        let value = s
            .strip_prefix("remark=")
            .ok_or_else(|| format!("`{s}` is not an action: pass, drop or remark=DSCP"))?;
        let bad =
            || format!("`{value}` is not a DSCP: 0 to 63, or a name (be, ef, cs0 to cs7, af11 to af43)");
        let dscp = match value {
            "be" => 0,
            "ef" => 46,
            _ if value.starts_with("cs") => {
                value[2..].parse::<u8>().ok().filter(|&c| c <= 7).map(|c| c * 8).ok_or_else(bad)?
            }
            _ if value.starts_with("af") => {
                let b = value.as_bytes();
                let (class, drop) =
                    (b.get(2).map(|c| c.wrapping_sub(b'0')), b.get(3).map(|c| c.wrapping_sub(b'0')));
                match (class, drop, b.len()) {
                    (Some(c @ 1..=4), Some(d @ 1..=3), 4) => c * 8 + d * 2,
                    _ => return Err(bad()),
                }
            }
            _ => value.parse::<u8>().ok().filter(|&d| d <= 63).ok_or_else(bad)?,
        };
        Ok(Action::Remark(dscp))
    }
}

/// How to police.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Every flow's meter.
    pub meter: Meter,
    /// How packets make flows.
    pub key_by: KeyBy,
    /// What each colour does: green, yellow, red.
    pub actions: [Action; 3],
    /// What a malformed packet does (`Pass` or `Drop`; not IP always passes).
    pub malformed: Action,
    /// Flows the table holds at once (a new flow beyond it is red).
    pub capacity: usize,
    /// Whether to keep per-flow statistics ([`Report::flows`]).
    pub per_flow: bool,
}

/// A flow's packets and bytes by colour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Packets: green, yellow, red.
    pub packets: [u64; 3],
    /// Bytes (IP): green, yellow, red.
    pub bytes: [u64; 3],
}

/// What policing a capture did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Frames read.
    pub frames: u64,
    /// Frames written.
    pub written: u64,
    /// Metered packets and their bytes by colour.
    pub colors: FlowStats,
    /// Frames not metered, by reason ([`Unmetered::ALL`]'s order).
    pub unmetered: [u64; 6],
    /// Packets red because their new flow found no room in the table.
    pub table_full: u64,
    /// Per flow (when asked for).
    pub flows: HashMap<FlowKey, FlowStats>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.colors;
        writeln!(f, "frames read {}, written {}", self.frames, self.written)?;
        for (i, name) in ["green", "yellow", "red"].iter().enumerate() {
            writeln!(f, "{name:>7}: {} packets, {} bytes", c.packets[i], c.bytes[i])?;
        }
        for (reason, n) in Unmetered::ALL.iter().zip(self.unmetered) {
            if n > 0 {
                writeln!(f, "unmetered {}: {n}", reason.name())?;
            }
        }
        if self.table_full > 0 {
            writeln!(f, "red for want of room in the flow table: {}", self.table_full)?;
        }
        if !self.flows.is_empty() {
            writeln!(f, "flows: {}", self.flows.len())?;
        }
        Ok(())
    }
}

/// The per-flow statistics' columns, in the order both formats write them.
const COLUMNS: [&str; 11] = [
    "src",
    "dst",
    "proto",
    "sport",
    "dport",
    "green_packets",
    "green_bytes",
    "yellow_packets",
    "yellow_bytes",
    "red_packets",
    "red_bytes",
];

impl Report {
    /// Each flow's row ([`COLUMNS`]: addresses as text, then numbers), sorted by flow.
    fn rows(&self) -> Vec<(String, String, [u64; 9])> {
        let mut flows: Vec<_> = self.flows.iter().collect();
        flows.sort_unstable_by_key(|(k, _)| **k);
        flows
            .into_iter()
            .map(|(k, s)| {
                let numbers = [
                    u64::from(k.proto),
                    u64::from(k.sport),
                    u64::from(k.dport),
                    s.packets[0],
                    s.bytes[0],
                    s.packets[1],
                    s.bytes[1],
                    s.packets[2],
                    s.bytes[2],
                ];
                (k.source().to_string(), k.destination().to_string(), numbers)
            })
            .collect()
    }

    /// The per-flow statistics as CSV, one flow a line, sorted by flow.
    pub fn flows_csv(&self, mut out: impl Write) -> std::io::Result<()> {
        writeln!(out, "{}", COLUMNS.join(","))?;
        for (src, dst, numbers) in self.rows() {
            write!(out, "{src},{dst}")?;
            for n in numbers {
                write!(out, ",{n}")?;
            }
            writeln!(out)?;
        }
        Ok(())
    }

    /// The per-flow statistics as a JSON array of objects (one key a column), sorted by flow.
    pub fn flows_json(&self, mut out: impl Write) -> std::io::Result<()> {
        write!(out, "[")?;
        for (i, (src, dst, numbers)) in self.rows().into_iter().enumerate() {
            let sep = if i == 0 { "\n" } else { ",\n" };
            write!(out, "{sep}  {{\"src\": \"{src}\", \"dst\": \"{dst}\"")?;
            for (name, n) in COLUMNS[2..].iter().zip(numbers) {
                write!(out, ", \"{name}\": {n}")?;
            }
            write!(out, "}}")?;
        }
        writeln!(out, "\n]")
    }
}

/// A record waiting in a burst: a frame with its flow, length and DSCP (or why it is not
/// metered), or a pcapng interface (`read` is `None`), written in its place.
struct Pending {
    record: Record,
    read: Option<Result<packet::Metered, Unmetered>>,
}

/// Polices `input` per flow under `policy`, writing what passes to `output` (in the input's
/// format) when given. Frames are metered at their timestamps, from the capture's first.
pub fn police<R: Read, W: Write>(
    input: R,
    output: Option<W>,
    policy: &Policy,
) -> Result<Report, CaptureError> {
    let mut reader = CaptureReader::new(input)?;
    let mut writer = match output {
        Some(w) => Some(CaptureWriter::like(w, &reader)?),
        None => None,
    };
    let mut flows = FlowMeters::<FlowKey>::new(policy.meter, policy.capacity).map_err(|e| {
        CaptureError::Format { offset: 0, what: format!("capacity {}: {e}", policy.capacity) }
    })?;
    let mut report = Report::default();
    let mut origin: Option<Duration> = None;
    let mut pending: Vec<Pending> = Vec::with_capacity(BURST);
    let mut metered = 0;
    let (mut keys, mut lens, mut times) = (Vec::new(), Vec::new(), Vec::new());
    let mut colors = [Color::Red; BURST];
    loop {
        let record = reader.next_record().transpose()?;
        let end = record.is_none();
        if let Some(record) = record {
            let read = match &record {
                Record::Frame(f) => {
                    report.frames += 1;
                    Some(packet::read(f.link, &f.data, f.is_cut(), policy.key_by))
                }
                Record::Interface(_) => None,
            };
            metered += usize::from(matches!(read, Some(Ok(_))));
            pending.push(Pending { record, read });
        }
        if metered < BURST && !end && pending.len() < 4 * BURST {
            continue;
        }
        // A burst: key, meter, act, write, in order.
        keys.clear();
        lens.clear();
        times.clear();
        for p in &pending {
            if let (Some(Ok(m)), Record::Frame(f)) = (&p.read, &p.record) {
                let origin = *origin.get_or_insert(f.timestamp);
                let since = f.timestamp.saturating_sub(origin);
                keys.push(m.key);
                lens.push(m.len);
                times.push(Nanos::new(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)));
            }
        }
        let before_full = flows.table_full();
        flows.check_burst_at(&times, &keys, &lens, None, &mut colors[..keys.len()]);
        report.table_full += flows.table_full() - before_full;
        // The metered frames' colours, in their order.
        let mut colored = colors[..keys.len()].iter();
        for mut p in pending.drain(..) {
            let action = match &p.read {
                Some(Ok(m)) => {
                    let k = *colored.next().expect("a colour for every metered frame") as usize;
                    report.colors.packets[k] += 1;
                    report.colors.bytes[k] += u64::from(m.len);
                    if policy.per_flow {
                        let s = report.flows.entry(m.key).or_default();
                        s.packets[k] += 1;
                        s.bytes[k] += u64::from(m.len);
                    }
                    policy.actions[k]
                }
                Some(Err(reason)) => {
                    report.unmetered[Unmetered::ALL.iter().position(|r| r == reason).unwrap_or(0)] += 1;
                    if reason.is_malformed() {
                        policy.malformed
                    } else {
                        Action::Pass
                    }
                }
                None => Action::Pass,
            };
            if let (Action::Remark(dscp), Some(Ok(m)), Record::Frame(f)) = (action, &p.read, &mut p.record) {
                packet::remark(&mut f.data, m.dscp, dscp);
            }
            if action != Action::Drop {
                if let Some(w) = writer.as_mut() {
                    w.write(&p.record)?;
                    report.written += u64::from(p.read.is_some());
                }
            }
        }
        metered = 0;
        if end {
            break;
        }
    }
    Ok(report)
}
