//! What a bucket key holds in Redis: the bytes the script writes, and their check.
//!
//! A value is 36 bytes, nine big-endian 32-bit words: the tag `tgb1` (the format and its
//! version), the bucket clock's start in server microseconds (2 words), its `m` (units per
//! nanosecond), its offset (2), the bucket's stamp (2), and a check word computed from the
//! seven words before it. The script refuses anything else (another length, another tag, a
//! check that does not match, an `m` outside 1–64) with the error code `TOLLGATE_CORRUPT`,
//! which the limiter returns as [`Error::Corrupt`](crate::Error::Corrupt) naming the key: a
//! string some other program wrote there is never read as a bucket.
//!
//! The check is a polynomial over the seven words modulo the prime 4,294,967,291, with the
//! multiplier 31: every step stays below 2^37, exact in the doubles of Redis's Lua, so the
//! script and this module compute it alike. It tells garbage from a bucket (a random value
//! passes the tag and the check with odds of about one in 2^64); it is no defence against
//! someone who writes the keys on purpose, who can write any bucket they like.

/// The first four bytes of every bucket value: the format, version 1.
pub const TAG: [u8; 4] = *b"tgb1";

/// The length of a bucket value, in bytes.
pub const LEN: usize = 36;

/// The modulus of the check word: the largest prime below 2^32.
const CHECK_PRIME: u64 = 4_294_967_291;

/// One bucket as Redis holds it: the clock it is counted on, and its stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketValue {
    /// The instant the bucket's clock started, in the server's microseconds since the Unix
    /// epoch (below 2^53).
    pub origin_micros: u64,
    /// The clock's units per nanosecond (the quota's `m`, 1 to 64).
    pub units_per_nano: u32,
    /// The clock's reading at its start (at least the quota's fill).
    pub offset: u64,
    /// The instant, on the bucket's clock, at which the bucket was (or will be) empty.
    pub stamp: u64,
}

/// The check word of the seven 32-bit words of a value's fields.
fn check(words: &[u32; 7]) -> u32 {
    let c = words.iter().fold(0u64, |c, &w| (c * 31 + u64::from(w)) % CHECK_PRIME);
    u32::try_from(c).unwrap_or(u32::MAX) // below the prime, so below 2^32
}

impl BucketValue {
    /// The fields' seven words, as stored after the tag.
    fn words(&self) -> [u32; 7] {
        let hi = |x: u64| u32::try_from(x >> 32).unwrap_or(u32::MAX);
        let lo = |x: u64| (x & 0xffff_ffff) as u32;
        [
            hi(self.origin_micros),
            lo(self.origin_micros),
            self.units_per_nano,
            hi(self.offset),
            lo(self.offset),
            hi(self.stamp),
            lo(self.stamp),
        ]
    }

    /// The 36 bytes the script stores for this bucket.
    pub fn encode(&self) -> [u8; LEN] {
        let words = self.words();
        let mut out = [0u8; LEN];
        out[..4].copy_from_slice(&TAG);
        for (chunk, w) in out[4..].chunks_exact_mut(4).zip(words.iter().copied().chain([check(&words)])) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// Reads a stored value, or says why it is not a tollgate bucket.
    pub fn decode(bytes: &[u8]) -> Result<BucketValue, String> {
        let Ok(bytes) = <&[u8; LEN]>::try_from(bytes) else {
            return Err(format!("the value is {} bytes, not a tollgate bucket of {LEN}", bytes.len()));
        };
        if bytes[..4] != TAG {
            return Err(format!(
                "the value begins {:?}, not with the tag {:?} of a tollgate bucket",
                String::from_utf8_lossy(&bytes[..4]),
                "tgb1"
            ));
        }
        let word = |i: usize| {
            let at = 4 + 4 * i;
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let words: [u32; 7] = core::array::from_fn(word);
        let (stored, computed) = (word(7), check(&words));
        if stored != computed {
            return Err(format!(
                "the value's check word is {stored}, not the {computed} its fields give: not a tollgate bucket, or damaged"
            ));
        }
        let pair = |hi: u32, lo: u32| u64::from(hi) << 32 | u64::from(lo);
        let value = BucketValue {
            origin_micros: pair(words[0], words[1]),
            units_per_nano: words[2],
            offset: pair(words[3], words[4]),
            stamp: pair(words[5], words[6]),
        };
        if !(1..=64).contains(&value.units_per_nano) {
            return Err(format!(
                "the value's clock counts {} units per ns, not 1 to 64",
                value.units_per_nano
            ));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_round_trips_and_garbage_is_refused() {
        let v = BucketValue {
            origin_micros: 1_733_000_000_123_456,
            units_per_nano: 3,
            offset: 1 << 40,
            stamp: 12345,
        };
        let bytes = v.encode();
        assert_eq!(BucketValue::decode(&bytes), Ok(v));
        assert!(BucketValue::decode(b"not a bucket").unwrap_err().contains("12 bytes"));
        assert!(BucketValue::decode(&[7u8; 28]).unwrap_err().contains("28 bytes"));
        assert!(BucketValue::decode(&[0u8; LEN]).unwrap_err().contains("tag"));
        // One bit flipped anywhere after the tag fails the check.
        for i in 4..LEN {
            let mut bad = bytes;
            bad[i] ^= 0x10;
            assert!(BucketValue::decode(&bad).unwrap_err().contains("check word"), "byte {i}");
        }
        // A value whose check matches but whose m is out of range.
        let zero_m = BucketValue { units_per_nano: 0, ..v }.encode();
        assert!(BucketValue::decode(&zero_m).unwrap_err().contains("units per ns"));
    }

    /// The check word for fixed fields, as the script computes it (the script's own test in
    /// `tests/roundtrip.rs` reads the bytes Redis stores back through `decode`).
    #[test]
    fn the_check_word_is_the_polynomial() {
        let w = [1, 2, 3, 4, 5, 6, 7];
        let mut c = 0u64;
        for x in w {
            c = (c * 31 + x) % CHECK_PRIME;
        }
        assert_eq!(u64::from(check(&[1, 2, 3, 4, 5, 6, 7])), c);
        assert_eq!(check(&[u32::MAX; 7]), {
            let mut c = 0u64;
            for _ in 0..7 {
                c = (c * 31 + u64::from(u32::MAX)) % CHECK_PRIME;
            }
            c as u32
        });
    }
}
