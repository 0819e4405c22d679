//! The tests' pseudo-random numbers: Marsaglia's xorshift64, seeded per thread.

#![allow(dead_code, unreachable_pub)]

/// The next value of a xorshift64 sequence (`state` must not be 0).
#[inline]
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
