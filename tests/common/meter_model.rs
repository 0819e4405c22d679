//! RFC 2697, 2698 and 4115 as written: token counters, credited whole bytes by a function of
//! the time that the caller picks (the exact rates, or DPDK's truncated periods). Shared by
//! `tests/meter.rs`, the packets crate's DPDK differential test and the `meter_model` fuzz
//! target.

#![allow(dead_code)]

use tollgate::{Color, Meter, MeterKind};

/// The counters `Tc` and `T2` (E or P), and the bytes each rate had credited by the last
/// packet.
#[derive(Clone, Debug)]
pub(crate) struct MeterModel {
    kind: MeterKind,
    sizes: (u64, u64),
    /// `Tc`, `T2`.
    pub(crate) levels: (u64, u64),
    credited: (u64, u64),
}

/// The whole bytes `meter`'s rates credit in `t_ns` nanoseconds: byte `k` at `k / rate`
/// seconds (srTCM's second rate is its CIR).
pub(crate) fn exact_credit(meter: &Meter, t_ns: u64) -> (u64, u64) {
    let ticks = |rate: u64| u64::try_from(u128::from(t_ns) * u128::from(rate) / 1_000_000_000).unwrap();
    let second = if meter.kind() == MeterKind::SrTcm { meter.committed().0 } else { meter.second().0 };
    (ticks(meter.committed().0), ticks(second))
}

impl MeterModel {
    /// Both buckets full.
    pub(crate) fn new(m: &Meter) -> MeterModel {
        let sizes = (m.committed().1, m.second().1);
        MeterModel { kind: m.kind(), sizes, levels: sizes, credited: (0, 0) }
    }

    /// A packet of `b` bytes arriving coloured `input` (`None`: colour-blind), the buckets'
    /// rates having credited `credited` bytes in all by now (never less than before).
    pub(crate) fn color(&mut self, credited: (u64, u64), b: u64, input: Option<Color>) -> Color {
        let new_c = credited.0 - self.credited.0;
        let new_2 = credited.1 - self.credited.1;
        self.credited = credited;
        let (cbs, s2) = self.sizes;
        let (tc, t2) = &mut self.levels;
        match self.kind {
            MeterKind::SrTcm => {
                // Each byte to C while C is short, else to E while E is short.
                let to_c = new_c.min(cbs - *tc);
                *tc += to_c;
                *t2 = t2.saturating_add(new_c - to_c).min(s2);
            }
            MeterKind::TrTcm | MeterKind::Rfc4115 => {
                *tc = tc.saturating_add(new_c).min(cbs);
                *t2 = t2.saturating_add(new_2).min(s2);
            }
        }
        let green_in = matches!(input, None | Some(Color::Green));
        let not_red = input != Some(Color::Red);
        match self.kind {
            MeterKind::SrTcm | MeterKind::Rfc4115 => {
                if green_in && *tc >= b {
                    *tc -= b;
                    Color::Green
                } else if not_red && *t2 >= b {
                    *t2 -= b;
                    Color::Yellow
                } else {
                    Color::Red
                }
            }
            MeterKind::TrTcm => {
                if !not_red || *t2 < b {
                    Color::Red
                } else if !green_in || *tc < b {
                    *t2 -= b;
                    Color::Yellow
                } else {
                    *t2 -= b;
                    *tc -= b;
                    Color::Green
                }
            }
        }
    }
}
