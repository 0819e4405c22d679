//! The meters against the RFCs' counters (`tests/common/meter_model.rs`) on any profile and any
//! stream: every colour and both levels, packet for packet, colour-blind and colour-aware; and
//! the one-core flow table against a meter per flow.

#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::{Color, FlowMeters, Meter, MeterState, Nanos};

#[path = "../../tests/common/meter_model.rs"]
mod meter_model;

use meter_model::{exact_credit, MeterModel};

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    rates: (u64, u64),
    sizes: (u64, u64),
    packets: Vec<(u32, u16, u8, u8)>,
}

fuzz_target!(|input: Input| {
    let r1 = input.rates.0 % Meter::MAX_RATE + 1;
    let r2 = input.rates.1 % Meter::MAX_RATE + 1;
    let s1 = input.sizes.0 % 100_000 + 1;
    let s2 = input.sizes.1 % 100_000 + 1;
    let meter = match input.kind % 3 {
        0 => Meter::srtcm(r1, s1, s2),
        1 => Meter::trtcm(r1, s1, r2, s2),
        _ => Meter::rfc4115(r1, s1, r2, s2),
    }
    .expect("in range");
    let mut model = MeterModel::new(&meter);
    let mut flow = MeterState::new();
    let mut table = FlowMeters::<u8>::with_seeds(meter, 64, [1, 2, 3, 4]).unwrap();
    let mut each: HashMap<u8, MeterState> = HashMap::new();
    let mut t = 0u64;
    for &(gap, bytes, color, key) in &input.packets {
        t += u64::from(gap);
        let at = Nanos::new(t);
        let bytes = u64::from(bytes);
        let input_color = match color % 4 {
            3 => None,
            c => Color::from_u8(c),
        };
        let got = match input_color {
            None => flow.check(&meter, at, bytes),
            Some(c) => flow.check_aware(&meter, at, bytes, c),
        };
        assert_eq!(got, model.color(exact_credit(&meter, t), bytes, input_color), "{meter} at {t}");
        assert_eq!(meter.levels(&flow, at), model.levels, "{meter} at {t}");
        let key = key % 8;
        let mut out = [Color::Red];
        table.check_burst(at, &[key], &[bytes as u32], None, &mut out);
        assert_eq!(out[0], each.entry(key).or_default().check(&meter, at, bytes), "flow {key} at {t}");
    }
});
