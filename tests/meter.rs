//! The meters against an exact model in the RFCs' own terms (token counts, credited one whole
//! byte at a time: RFC 2697's C first then E, RFC 2698's and RFC 4115's buckets apart), on
//! random profiles and packet streams: every colour and every bucket's level, packet for
//! packet; and the RFCs' bound on green bytes.

use proptest::prelude::*;
use tollgate::{Color, Meter, MeterState, Nanos};

#[path = "common/meter_model.rs"]
mod meter_model;

use meter_model::{exact_credit, MeterModel};

fn meter() -> impl Strategy<Value = Meter> {
    let rate = prop_oneof![1u64..100, 1_000u64..100_000_000, Just(46_000_000), Just(Meter::MAX_RATE)];
    let size = prop_oneof![1u64..100, 64u64..20_000, Just(2_048), Just(Meter::MAX_SIZE)];
    (0..3u8, rate.clone(), size.clone(), rate, size).prop_map(|(k, r1, s1, r2, s2)| match k {
        0 => Meter::srtcm(r1, s1, s2 - 1).unwrap(),
        1 => Meter::trtcm(r1, s1, r2, s2).unwrap(),
        _ => Meter::rfc4115(r1, s1, r2 - 1, if r2 == 1 { 0 } else { s2 - 1 }).unwrap(),
    })
}

fn packets() -> impl Strategy<Value = Vec<(u64, u64, Option<Color>)>> {
    let gap = prop_oneof![3 => Just(0u64), 4 => 0u64..2_000, 4 => 0u64..10_000_000, 1 => 0u64..(1 << 40)];
    let bytes = prop_oneof![64u64..=9_000, 0u64..64, Just(2_048), Just(4_096), 0u64..1 << 41];
    let input = prop_oneof![
        3 => Just(None),
        1 => Just(Some(Color::Green)),
        1 => Just(Some(Color::Yellow)),
        1 => Just(Some(Color::Red)),
    ];
    prop::collection::vec((gap, bytes, input), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn every_colour_and_level_is_the_rfcs(m in meter(), stream in packets()) {
        let mut model = MeterModel::new(&m);
        let mut flow = MeterState::new();
        let mut t = 0u64;
        let mut green = 0u128;
        for (i, (gap, bytes, input)) in stream.into_iter().enumerate() {
            t = t.saturating_add(gap);
            let at = Nanos::new(t);
            let got = match input {
                None => flow.check(&m, at, bytes),
                Some(c) => flow.check_aware(&m, at, bytes, c),
            };
            let want = model.color(exact_credit(&m, t), bytes, input);
            prop_assert_eq!(got, want, "packet {} of {} bytes at {} ns ({:?}) under {}", i, bytes, t, input, m);
            prop_assert_eq!(m.levels(&flow, at), model.levels, "after packet {} under {}", i, m);
            if got == Color::Green {
                green += u128::from(bytes);
            }
            // RFC bound: green bytes never exceed CBS plus what CIR credited.
            let (cir, cbs) = m.committed();
            prop_assert!(green <= u128::from(cbs) + u128::from(t) * u128::from(cir) / 1_000_000_000);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The one-core table colours every packet as a meter of its own per flow would (a flow
    /// whose buckets are full again may lose its slot: it comes back as a fresh flow, the same
    /// state), in bursts, while no window is full: a small table (its bursts decided without
    /// branches) and a large one (with them).
    #[test]
    fn a_flow_table_is_a_meter_per_flow(
        m in meter(),
        large in any::<bool>(),
        aware in any::<bool>(),
        bursts in prop::collection::vec((0u64..50_000_000, prop::collection::vec((0u16..40, 0u32..9_000, 0u8..3), 1..70)), 1..30),
    ) {
        let capacity = if large { 1 << 16 } else { 4_096 };
        let mut table = tollgate::FlowMeters::<u16>::with_seeds(m, capacity, [9, 8, 7, 6]).unwrap();
        let mut each = std::collections::HashMap::<u16, MeterState>::new();
        let mut t = 0u64;
        for (gap, packets) in bursts {
            t += gap;
            let at = Nanos::new(t);
            let keys: Vec<u16> = packets.iter().map(|p| p.0).collect();
            let lens: Vec<u32> = packets.iter().map(|p| p.1).collect();
            let inputs: Vec<Color> = packets.iter().map(|p| Color::from_u8(p.2).unwrap()).collect();
            let mut out = vec![Color::Red; keys.len()];
            table.check_burst(at, &keys, &lens, aware.then_some(&inputs[..]), &mut out);
            for (i, (k, len, _)) in packets.iter().enumerate() {
                let state = each.entry(*k).or_default();
                let want = if aware {
                    state.check_aware(&m, at, u64::from(*len), inputs[i])
                } else {
                    state.check(&m, at, u64::from(*len))
                };
                prop_assert_eq!(out[i], want, "flow {} packet {} at {} ns under {}", k, i, t, m);
            }
        }
        prop_assert_eq!(table.table_full(), 0);
    }
}

/// A shared meter under real threads: every bound the RFCs set holds over the whole run
/// (green bytes within CBS and what CIR credited; green and yellow within PBS and what PIR
/// credited), and at one instant the counts are exact.
#[test]
fn a_shared_meter_keeps_the_rfc_bounds_under_threads() {
    use std::sync::Arc;
    use tollgate::SharedMeter;
    let meter = Meter::trtcm(1_000_000, 30_000, 2_000_000, 60_000).unwrap();
    // At one instant: 8 threads, 1,000-byte packets: 30 green, 30 yellow, the rest red.
    let m = Arc::new(SharedMeter::new(meter));
    let counts: Vec<[u64; 3]> = (0..8)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let mut c = [0u64; 3];
                for _ in 0..50 {
                    c[m.check(Nanos::ZERO, 1_000) as usize] += 1;
                }
                c
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let total = counts.iter().fold([0; 3], |a, c| [a[0] + c[0], a[1] + c[1], a[2] + c[2]]);
    assert_eq!(total, [30, 30, 340]);
    // Over time: each thread's clock runs on its own (a shared meter sees times out of order).
    let m = Arc::new(SharedMeter::new(meter));
    let bytes: Vec<[u64; 3]> = (0..4u64)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let mut b = [0u64; 3];
                for i in 0..20_000u64 {
                    let len = 64 + (i * 7 + t) % 1_400;
                    b[m.check(Nanos::new(i * 10_000 + t * 3_000), len) as usize] += len;
                }
                b
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let total = bytes.iter().fold([0; 3], |a, c| [a[0] + c[0], a[1] + c[1], a[2] + c[2]]);
    let end_ns = 20_000 * 10_000 + 3 * 3_000;
    let (cir, cbs) = meter.committed();
    let (pir, pbs) = meter.second();
    assert!(total[0] <= cbs + end_ns * cir / 1_000_000_000, "{total:?}");
    assert!(total[0] + total[1] <= pbs + end_ns * pir / 1_000_000_000, "{total:?}");
    // And near the bounds: offered far above PIR, most of what PIR credits is used.
    assert!(total[0] + total[1] >= end_ns * pir / 1_000_000_000 / 2, "{total:?}");
}

/// The shared flow table under real threads at one instant: every flow's green packets are
/// exactly what its bucket holds, whichever cores its packets come from.
#[test]
fn a_shared_flow_table_colours_each_flow_exactly_under_threads() {
    use std::sync::Arc;
    use tollgate::SharedFlowMeters;
    let meter = Meter::srtcm(1_000, 10_000, 5_000).unwrap();
    let table = Arc::new(SharedFlowMeters::<u32>::new(meter, 4_096).unwrap());
    let counts: Vec<Vec<[u64; 3]>> = (0..4)
        .map(|t| {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let mut c = vec![[0u64; 3]; 100];
                for i in 0..2_000u32 {
                    let key = (i * 13 + t) % 100;
                    c[key as usize][table.check(&key, Nanos::ZERO, 1_000) as usize] += 1;
                }
                c
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for key in 0..100 {
        let total = counts.iter().fold([0; 3], |a, c| [a[0] + c[key][0], a[1] + c[key][1], a[2] + c[key][2]]);
        assert_eq!(total, [10, 5, 65], "flow {key}");
    }
    assert_eq!(table.len(), 100);
}
