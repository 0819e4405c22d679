//! A shared meter's compare-and-swap of both buckets (`SharedMeter`, `src/policies/meter.rs`;
//! every access `Relaxed`; the 16-byte atomic modelled by `src/sync.rs`'s `AtomicPair`): racing
//! packets get the colours, and leave the levels, of some order of the same packets on one
//! meter, whatever the interleaving.

#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use tollgate::{Color, Meter, MeterState, Nanos, SharedMeter};

/// Thread A's two packets and thread B's two, each `(time ns, bytes)`.
type Packets = [[(u64, u64); 2]; 2];

/// The six orders of A's two packets and B's two, each keeping its thread's order.
const ORDERS: [[(usize, usize); 4]; 6] = [
    [(0, 0), (0, 1), (1, 0), (1, 1)],
    [(0, 0), (1, 0), (0, 1), (1, 1)],
    [(0, 0), (1, 0), (1, 1), (0, 1)],
    [(1, 0), (0, 0), (0, 1), (1, 1)],
    [(1, 0), (0, 0), (1, 1), (0, 1)],
    [(1, 0), (1, 1), (0, 0), (0, 1)],
];

/// The colours each order gives, and the levels it leaves at `at`.
fn sequential(
    meter: &Meter,
    packets: &Packets,
    order: &[(usize, usize); 4],
    at: u64,
) -> ([[Color; 2]; 2], (u64, u64)) {
    let mut state = MeterState::new();
    let mut colors = [[Color::Red; 2]; 2];
    for &(t, i) in order {
        let (time, bytes) = packets[t][i];
        colors[t][i] = state.check(meter, Nanos::new(time), bytes);
    }
    (colors, meter.levels(&state, Nanos::new(at)))
}

fn race(meter: Meter, packets: Packets) {
    model(move || {
        let m = Arc::new(SharedMeter::new(meter));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let m = Arc::clone(&m);
                thread::spawn(move || packets[t].map(|(time, bytes)| m.check(Nanos::new(time), bytes)))
            })
            .collect();
        let colors: Vec<[Color; 2]> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let colors = [colors[0], colors[1]];
        let at = 10_000_000;
        let seen = (colors, m.levels(Nanos::new(at)));
        assert!(
            ORDERS.iter().any(|order| sequential(&meter, &packets, order, at) == seen),
            "{seen:?} is no order's"
        );
    });
}

/// trTCM at one instant: the packets compete for C and P.
#[test]
fn trtcm_racing_packets_are_coloured_as_in_some_order() {
    race(Meter::trtcm(1_000, 1_500, 2_000, 2_500).unwrap(), [[(0, 1_000), (0, 600)], [(0, 900), (0, 700)]]);
}

/// srTCM, the threads' clocks a millisecond apart: E's overflow and the refill interleave.
#[test]
fn srtcm_racing_packets_at_two_times() {
    race(
        Meter::srtcm(100_000, 1_000, 500).unwrap(),
        [[(0, 800), (1_000_000, 400)], [(1_000_000, 300), (1_000_000, 200)]],
    );
}

/// The shared flow table's insert (`src/keyed/shared_meters.rs`): two threads meet a new flow
/// at once, and a third flow races them for the same window (a table of one window). The flow
/// gets one slot, never two: its packets' colours are those of some order on one meter.
#[test]
fn shared_flow_table_inserts_a_flow_once() {
    use tollgate::SharedFlowMeters;
    model(|| {
        let meter = Meter::srtcm(1_000, 1_500, 0).unwrap();
        let table = Arc::new(SharedFlowMeters::<u64>::with_seeds(meter, 8, [1, 2, 3, 4]).unwrap());
        let threads: Vec<_> = [(7u64, 1_000u64), (7, 1_000), (9, 1_500)]
            .into_iter()
            .map(|(key, bytes)| {
                let t = Arc::clone(&table);
                thread::spawn(move || t.check(&key, Nanos::ZERO, bytes))
            })
            .collect();
        let colors: Vec<Color> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        // Flow 7 had 1,500 bytes: one of its two 1,000-byte packets is green, the other red
        // (two slots would make both green); flow 9's 1,500 fit.
        let mut seven = [colors[0], colors[1]];
        seven.sort();
        assert_eq!(seven, [Color::Green, Color::Red]);
        assert_eq!(colors[2], Color::Green);
        assert_eq!(table.len(), 2);
    });
}
