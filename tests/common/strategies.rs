//! Quota strategies shared by the reservation and queued-bucket property tests.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Rate, TokenBucket};

/// Quotas across the supported ranges: small and huge counts, periods from a nanosecond to a
/// minute and beyond, bursts small and large.
pub fn quota() -> impl Strategy<Value = TokenBucket> {
    let tokens = prop_oneof![1u64..=100, 1u64..=1 << 30];
    let period = prop_oneof![Just(1_000_000_000u64), Just(60_000_000_000), 1u64..=1 << 20, 1u64..=1 << 40];
    let burst = prop_oneof![1u64..=4, 1u64..=1000];
    (tokens, period, burst).prop_filter_map("outside the supported ranges", |(t, p, b)| {
        TokenBucket::new(Rate::per(t, Duration::from_nanos(p)), b).ok()
    })
}

/// Quotas whose rate is exact in units (a whole number of ns per token), where the bound at
/// the configured rate is the engine's own.
pub fn exact_quota() -> impl Strategy<Value = TokenBucket> {
    let per_token = prop_oneof![1u64..=1_000, 1u64..=10_000_000_000];
    (1u64..=100, per_token, 1u64..=8).prop_filter_map("outside the supported ranges", |(t, p, b)| {
        TokenBucket::new(Rate::per(t, Duration::from_nanos(t * p)), b).ok()
    })
}
