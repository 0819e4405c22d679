//! Per-packet policing with tollgate's meters: RFC 2697's, RFC 2698's and RFC 4115's
//! three-colour markers ([`tollgate::Meter`]), per flow on one core
//! ([`tollgate::FlowMeters`]).
//!
//! With the `dpdk` feature, [`dpdk`] runs DPDK's own `rte_meter` in the same process (through a
//! C shim), for the differential test against tollgate's meters and for the benchmark.

pub mod capture;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod generate;
pub mod packet;
pub mod police;
