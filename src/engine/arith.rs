//! The fixed-point arithmetic the decisions share: exact division by a constant, and the
//! ranges a bucket's packed word can count. Below every algorithm, so that the engine (which
//! reads decisions and reports errors) and each policy (which builds them) depend on it, and
//! not on each other.

/// The largest burst: `2^32 − 1` tokens (a decision keeps the whole tokens left in 32 bits).
pub(crate) const MAX_BURST: u64 = u32::MAX as u64;
/// The finest time unit is `1/MAX_UNITS_PER_NANO` ns.
pub(crate) const MAX_UNITS_PER_NANO: u64 = 64;
/// The largest `burst × units_per_token`: the fill time, in units.
pub(crate) const MAX_FILL_UNITS: u64 = 1 << 62;

/// Exact division by a constant for numerators below 2^63: one multiply and one shift, no
/// fix-up (Granlund and Montgomery, "Division by invariant integers using multiplication",
/// PLDI 1994, theorem 4.2 with N = 63: with `ℓ = ceil(log2 d)` and
/// `magic = floor(2^(63+ℓ)/d) + 1`, a 64-bit number, `floor(x/d) = (x·magic) >> (63+ℓ)`).
///
/// The shift is taken as `((2x·magic) >> 64) >> ℓ` (`2x` fits: `x < 2^63`): the high word of
/// one multiplication and one 64-bit shift, where a 128-bit shift by a variable amount costs
/// a double shift, a test and a conditional move on x86_64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    magic: u64,
    /// `ℓ`.
    shift: u32,
}

impl Divisor {
    /// For `1 ≤ d ≤ 2^62`.
    pub(crate) const fn new(d: u64) -> Divisor {
        debug_assert!(d >= 1 && d <= 1 << 62);
        let l = 64 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d = 1
        #[expect(clippy::cast_possible_truncation, reason = "magic < 2^64 for d ≤ 2^62 (the theorem)")]
        let magic = ((1u128 << (63 + l)) / d as u128 + 1) as u64;
        Divisor { magic, shift: l }
    }

    /// The divisor as two words, `[magic, shift]`, for a configuration stored in atomics or
    /// a decision that keeps the multiplier.
    pub(crate) const fn to_words(self) -> [u64; 2] {
        [self.magic, self.shift as u64]
    }

    /// A divisor from [`to_words`](Divisor::to_words).
    pub(crate) const fn from_words([magic, shift]: [u64; 2]) -> Divisor {
        #[expect(clippy::cast_possible_truncation, reason = "a shift below 64, as stored")]
        let shift = shift as u32;
        Divisor { magic, shift }
    }

    /// `floor(x / d)` for `x < 2^63`.
    #[inline]
    pub(crate) const fn div(self, x: u64) -> u64 {
        debug_assert!(x < 1 << 63);
        let high = ((((x << 1) as u128) * self.magic as u128) >> 64) as u64;
        high >> self.shift
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::Divisor;

    proptest::proptest! {
        #[test]
        fn divisor_is_exact(d in 1u64..=1 << 62, x in 0u64..1 << 63) {
            proptest::prop_assert_eq!(Divisor::new(d).div(x), x / d);
        }

        /// Its words give back the same divisor.
        #[test]
        fn divisor_words_round_trip(d in 1u64..=1 << 62) {
            let div = Divisor::new(d);
            proptest::prop_assert_eq!(Divisor::from_words(div.to_words()), div);
        }
    }

    #[test]
    fn divisor_is_exact_at_the_edges() {
        let ds = [1u64, 2, 3, 7, 63, 64, 65, 1000, (1 << 31) + 11, (1 << 61) + 1, (1 << 62) - 1, 1 << 62];
        for d in ds {
            let div = Divisor::new(d);
            for x in [0u64, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, (1 << 62) + 12345, (1 << 63) - 1] {
                if x < 1 << 63 {
                    assert_eq!(div.div(x), x / d, "{x} / {d}");
                }
            }
            // Every multiple of d and its neighbours, near the top of the range.
            let top = ((1u64 << 63) - 1) / d * d;
            for x in [top - 1, top, top.saturating_add(d - 1).min((1 << 63) - 1)] {
                assert_eq!(div.div(x), x / d, "{x} / {d}");
            }
        }
    }
}
