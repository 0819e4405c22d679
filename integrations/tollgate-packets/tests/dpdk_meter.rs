//! tollgate's meters against DPDK's `rte_meter`, in one process, packet for packet.
//!
//! DPDK credits `bytes_per_period` bytes every `period` TSC cycles, its period computed as
//! `hz / rate` in floating point and truncated (`rte_meter_get_tb_params`), so its rate sits at
//! or above the configured one. tollgate credits byte `k` at exactly `k / rate` seconds.
//!
//! - **Where the two agree exactly**: a rate that divides DPDK's TSC frequency `hz` (its period
//!   is a whole number of cycles, at least DPDK's minimum of 100, one byte a period), and times
//!   on the grid where cycles and nanoseconds both are whole (`hz / gcd(hz, 10^9)` cycles).
//!   Every colour must match, and every bucket's level after every packet, colour-blind and
//!   colour-aware, for all three meters.
//! - **Anywhere else** (any rate, any time): DPDK must equal a model of the RFCs crediting by
//!   DPDK's truncated periods, packet for packet: so every colour it gives that tollgate does
//!   not comes from that rounding alone, which the test quantifies (the packets coloured
//!   otherwise, the rates' excess) and bounds (DPDK's credit is never below the exact one by
//!   more than one period's bytes, nor above it by more than its rate's excess over the
//!   elapsed time plus those bytes; the excess is below 1% of the rate, 1 / the period).

#![cfg(feature = "dpdk")]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::{Color, Meter, MeterState, Nanos};
use tollgate_packets::dpdk::{start_eal, DpdkMeter};

fn hz() -> u64 {
    start_eal().unwrap_or_else(|e| panic!("{e}"))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The divisors of `n` in `lo..=hi`.
fn divisors(n: u64, lo: u64, hi: u64) -> Vec<u64> {
    (lo..=hi.min(n)).filter(|d| n % d == 0).collect()
}

#[path = "../../../tests/common/meter_model.rs"]
mod meter_model;

use meter_model::{exact_credit, MeterModel};

fn build(kind: u8, cir: u64, cbs: u64, r2: u64, s2: u64) -> Meter {
    match kind {
        0 => Meter::srtcm(cir, cbs, s2).unwrap(),
        1 => Meter::trtcm(cir, cbs, r2, s2).unwrap(),
        _ => Meter::rfc4115(cir, cbs, r2, s2).unwrap(),
    }
}

fn input() -> impl Strategy<Value = Option<Color>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(Color::Green)),
        1 => Just(Some(Color::Yellow)),
        1 => Just(Some(Color::Red)),
    ]
}

/// Rates dividing `hz`, times on the common grid: the same colour and levels, packet for packet.
#[test]
fn where_dpdks_period_is_exact_every_colour_matches() {
    let hz = hz();
    let grid_cycles = hz / gcd(hz, 1_000_000_000);
    let grid_ns = 1_000_000_000 / gcd(hz, 1_000_000_000);
    // Periods of 100 cycles (DPDK's least) to 10^7: rates from hz/100 down to hz/10^7.
    let periods = divisors(hz, 100, 10_000_000);
    assert!(periods.len() >= 4, "hz {hz} has too few divisors in 100..=10^7: {periods:?}");
    eprintln!("hz {hz}: grid {grid_cycles} cycles = {grid_ns} ns; {} exact periods", periods.len());
    let case = (
        0..3u8,
        prop::sample::select(periods.clone()),
        prop::sample::select(periods),
        prop_oneof![64u64..20_000, Just(2_048), Just(9_000)],
        prop_oneof![64u64..20_000, Just(4_096)],
        prop::collection::vec(
            (
                prop_oneof![2 => Just(0u64), 3 => 0u64..50, 2 => 0u64..5_000, 1 => 0u64..1_000_000],
                64u32..=9_000,
                input(),
            ),
            1..300,
        ),
    );
    let mut runner = TestRunner::new(Config { cases: 400, failure_persistence: None, ..Config::default() });
    let packets = std::cell::Cell::new(0u64);
    runner
        .run(&case, |(kind, p1, p2, cbs, s2, stream)| {
            // trTCM needs PIR at or above CIR (DPDK refuses less): the shorter period for P.
            let (p1, p2) = if kind == 1 { (p1.max(p2), p1.min(p2)) } else { (p1, p2) };
            let (cir, r2) = (hz / p1, hz / p2);
            let meter = build(kind, cir, cbs, r2, s2);
            let mut dpdk = DpdkMeter::new(&meter)
                .map_err(|e| TestCaseError::fail(format!("DPDK refused {meter}: {e}")))?;
            let second_period = if kind == 0 { p1 } else { p2 };
            prop_assert_eq!(dpdk.periods(), [p1, 1, second_period, 1], "DPDK's periods for {}", meter);
            let mut flow = MeterState::new();
            let mut steps = 0u64;
            for (i, (gap, len, input)) in stream.into_iter().enumerate() {
                steps += gap;
                let (cycles, ns) = (steps * grid_cycles, steps * grid_ns);
                let want = dpdk.check(cycles, len, input);
                let got = match input {
                    None => flow.check(&meter, Nanos::new(ns), u64::from(len)),
                    Some(c) => flow.check_aware(&meter, Nanos::new(ns), u64::from(len), c),
                };
                prop_assert_eq!(
                    got,
                    want,
                    "packet {} of {} bytes ({:?}) at {} cycles under {}",
                    i,
                    len,
                    input,
                    cycles,
                    meter
                );
                let (c, second) = meter.levels(&flow, Nanos::new(ns));
                prop_assert_eq!([c, second], dpdk.levels(), "levels after packet {} under {}", i, meter);
                packets.set(packets.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    eprintln!("{} packets, every colour and level DPDK's", packets.get());
}

/// Any rate and time: DPDK is the RFCs credited by its truncated periods, packet for packet;
/// where tollgate colours otherwise, the truncation is the whole cause, quantified and bounded.
#[test]
fn elsewhere_every_difference_is_dpdks_period_rounding() {
    let hz = hz();
    let rate = prop_oneof![
        1_000u64..100_000_000,
        100_000_000u64..20_000_000_000,
        Just(46_000_000),
        Just(69_000_000)
    ];
    let case = (
        0..3u8,
        rate.clone(),
        rate,
        prop_oneof![64u64..20_000, Just(2_048)],
        prop_oneof![64u64..20_000, Just(4_096)],
        prop::collection::vec((0u64..200_000, 64u32..=9_000, input()), 1..400),
    );
    let mut runner = TestRunner::new(Config { cases: 400, failure_persistence: None, ..Config::default() });
    let (packets, differ, worst_excess) =
        (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64), std::cell::Cell::new(0f64));
    runner
        .run(&case, |(kind, r1, r2, cbs, s2, stream)| {
            let (r1, r2) = if kind == 1 { (r1.min(r2), r1.max(r2)) } else { (r1, r2) };
            let meter = build(kind, r1, cbs, r2, s2);
            let Ok(mut dpdk) = DpdkMeter::new(&meter) else {
                // DPDK refuses rates its periods cannot express (above hz/100 per byte it
                // credits several bytes a period; below, it never refuses): none here.
                return Err(TestCaseError::fail(format!("DPDK refused {meter}")));
            };
            let [p1, b1, p2, b2] = dpdk.periods();
            let second_rate = if kind == 0 { r1 } else { r2 };
            for (period, bytes, rate) in [(p1, b1, r1), (p2, b2, second_rate)] {
                // The effective rate: at or above the configured one, by less than 1%.
                let effective = bytes as f64 * hz as f64 / period as f64;
                let excess = effective / rate as f64 - 1.0;
                prop_assert!(
                    (-1e-12..0.01).contains(&excess),
                    "rate {rate}: DPDK's {effective} ({period} cycles, {bytes} bytes)"
                );
                worst_excess.set(worst_excess.get().max(excess));
            }
            let mut dpdk_model = MeterModel::new(&meter);
            let mut exact_model = MeterModel::new(&meter);
            let mut flow = MeterState::new();
            let mut cycles = 0u64;
            for (i, (gap, len, input)) in stream.into_iter().enumerate() {
                cycles += gap;
                let want = dpdk.check(cycles, len, input);
                let dpdk_credit = (cycles / p1 * b1, cycles / p2 * b2);
                prop_assert_eq!(
                    dpdk_model.color(dpdk_credit, u64::from(len), input),
                    want,
                    "DPDK's model, packet {} under {}",
                    i,
                    meter
                );
                // tollgate at the same instant: whole nanoseconds (rounded down: earlier).
                let ns = u64::try_from(u128::from(cycles) * 1_000_000_000 / u128::from(hz)).unwrap();
                let got = match input {
                    None => flow.check(&meter, Nanos::new(ns), u64::from(len)),
                    Some(c) => flow.check_aware(&meter, Nanos::new(ns), u64::from(len), c),
                };
                let exact_credit = exact_credit(&meter, ns);
                prop_assert_eq!(
                    exact_model.color(exact_credit, u64::from(len), input),
                    got,
                    "the exact model, packet {} under {}",
                    i,
                    meter
                );
                // The bound on the cause: DPDK's credit against the exact one at this instant.
                for ((d, e), (period, bytes, rate)) in
                    [(dpdk_credit.0, exact_credit.0), (dpdk_credit.1, exact_credit.1)]
                        .into_iter()
                        .zip([(p1, b1, r1), (p2, b2, second_rate)])
                {
                    let effective = u128::from(bytes) * u128::from(hz) / u128::from(period);
                    let above =
                        u128::from(cycles) * effective.saturating_sub(u128::from(rate)) / u128::from(hz);
                    // One period's bytes either way, and what a nanosecond credits (tollgate's
                    // instant is the cycle count rounded down to whole nanoseconds).
                    let slack = u128::from(bytes) + u128::from(rate / 1_000_000_000) + 2;
                    prop_assert!(u128::from(d) + slack >= u128::from(e), "DPDK credited {} < exact {}", d, e);
                    prop_assert!(
                        u128::from(d) <= u128::from(e) + above + slack,
                        "DPDK credited {} > exact {} + {}",
                        d,
                        e,
                        above
                    );
                }
                packets.set(packets.get() + 1);
                differ.set(differ.get() + u64::from(got != want));
            }
            Ok(())
        })
        .unwrap();
    let (packets, differ) = (packets.get(), differ.get());
    eprintln!(
        "{packets} packets: {differ} coloured otherwise by DPDK ({:.3}%), all from its period's rounding; its rates at most {:.4}% fast",
        differ as f64 * 100.0 / packets.max(1) as f64,
        worst_excess.get() * 100.0
    );
}
