//! Keys: how a key becomes the identity words stored in a slot.
//!
//! Small keys are stored whole ("inline"): integers, `char`, IPv4 and IPv6 addresses, `u128`, and
//! byte arrays of up to 16 bytes. Everything else (strings, byte slices, and any `Hash + Eq` type
//! wrapped in [`Hashed`]) is identified by a 64-bit *fingerprint*: a keyed hash with a random
//! seed per limiter, independent of the seed that places keys in the table.
//!
//! # Fingerprints
//!
//! Two distinct fingerprinted keys collide when their fingerprints are equal: probability 2^-64
//! per pair for an ideal keyed hash, so about `n²/2^65` that any collision exists among `n` live
//! keys (3 × 10^-8 for a million keys). The seed is secret and drawn per limiter, so an attacker
//! cannot aim keys at a collision. A collision makes the two keys share one bucket: both are
//! limited together, so the pair is *under*-admitted, never over-admitted.

use core::fmt::Debug;
use core::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::sync::{AtomicU64, Ordering};

/// A key type a [`KeyedLimiter`](crate::KeyedLimiter) can track.
///
/// Implemented for the integer types, `char`, `bool`, the IP address types, `u128`/`i128`,
/// byte arrays up to 16 bytes (all stored inline), and `str`, `String`, `[u8]`, `Vec<u8>` and
/// [`Hashed<K>`] (fingerprinted). Any `K: Hash + Eq` works as `Hashed<K>`.
pub trait Key {
    /// The identity stored in a slot: one or two `u64`s.
    type Words: Words;
    /// This key's identity. `fingerprint` is the limiter's keyed hasher for keys that are not
    /// stored whole.
    fn words(&self, fingerprint: &ahash::RandomState) -> Self::Words;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for [u64; 1] {}
    impl Sealed for [u64; 2] {}
}

/// The identity words of a key: `[u64; 1]` or `[u64; 2]`. Sealed.
pub trait Words: sealed::Sealed + Copy + Default + Eq + Hash + Debug + Send + Sync + 'static {
    /// The slot's atomic storage for these words.
    #[doc(hidden)]
    type Atomic: Send + Sync + Debug;
    #[doc(hidden)]
    fn new_atomic() -> Self::Atomic;
    #[doc(hidden)]
    fn load(a: &Self::Atomic, order: Ordering) -> Self;
    #[doc(hidden)]
    fn store(a: &Self::Atomic, words: Self, order: Ordering);
    /// The placement hash of these words under `state`.
    #[doc(hidden)]
    fn hash_with(&self, state: &ahash::RandomState) -> u64;
}

impl Words for [u64; 1] {
    type Atomic = AtomicU64;
    fn new_atomic() -> AtomicU64 {
        AtomicU64::new(0)
    }
    #[inline]
    fn load(a: &AtomicU64, order: Ordering) -> [u64; 1] {
        [a.load(order)]
    }
    #[inline]
    fn store(a: &AtomicU64, words: [u64; 1], order: Ordering) {
        a.store(words[0], order);
    }
    #[inline]
    fn hash_with(&self, state: &ahash::RandomState) -> u64 {
        state.hash_one(self[0])
    }
}

impl Words for [u64; 2] {
    type Atomic = [AtomicU64; 2];
    fn new_atomic() -> [AtomicU64; 2] {
        [AtomicU64::new(0), AtomicU64::new(0)]
    }
    #[inline]
    fn load(a: &[AtomicU64; 2], order: Ordering) -> [u64; 2] {
        [a[0].load(order), a[1].load(order)]
    }
    #[inline]
    fn store(a: &[AtomicU64; 2], words: [u64; 2], order: Ordering) {
        a[0].store(words[0], order);
        a[1].store(words[1], order);
    }
    #[inline]
    fn hash_with(&self, state: &ahash::RandomState) -> u64 {
        state.hash_one((self[0], self[1]))
    }
}

macro_rules! inline_unsigned {
    ($($t:ty),*) => {$(
        impl Key for $t {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
                [u64::from(*self)]
            }
        }
    )*};
}
inline_unsigned!(u8, u16, u32, u64, bool, char);

macro_rules! inline_signed {
    ($($t:ty => $u:ty),*) => {$(
        impl Key for $t {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
                [u64::from(self.cast_unsigned_bits())]
            }
        }
        impl CastUnsigned for $t {
            type U = $u;
            #[inline]
            fn cast_unsigned_bits(self) -> $u {
                <$u>::from_ne_bytes(self.to_ne_bytes())
            }
        }
    )*};
}
trait CastUnsigned {
    type U;
    fn cast_unsigned_bits(self) -> Self::U;
}
inline_signed!(i8 => u8, i16 => u16, i32 => u32, i64 => u64);

impl Key for usize {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
        [*self as u64] // usize is at most 64 bits on every supported target
    }
}

impl Key for isize {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
        [*self as i64 as u64] // a bijection for 32- and 64-bit isize
    }
}

impl Key for u128 {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, _: &ahash::RandomState) -> [u64; 2] {
        #[expect(clippy::cast_possible_truncation, reason = "splitting into halves")]
        let low = *self as u64;
        [(*self >> 64) as u64, low]
    }
}

impl Key for i128 {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &ahash::RandomState) -> [u64; 2] {
        u128::from_ne_bytes(self.to_ne_bytes()).words(fp)
    }
}

impl Key for Ipv4Addr {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
        [u64::from(u32::from(*self))]
    }
}

impl Key for Ipv6Addr {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &ahash::RandomState) -> [u64; 2] {
        u128::from(*self).words(fp)
    }
}

/// An IPv4 address is stored as its IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), so
/// `IpAddr::V4(a)` and `IpAddr::V6(a.to_ipv6_mapped())` are one key: the same host, as a
/// dual-stack socket reports it either way. Use [`Hashed<IpAddr>`] to keep them apart.
impl Key for IpAddr {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &ahash::RandomState) -> [u64; 2] {
        match self {
            IpAddr::V4(a) => a.to_ipv6_mapped().words(fp),
            IpAddr::V6(a) => a.words(fp),
        }
    }
}

macro_rules! inline_bytes_1 {
    ($($n:literal),*) => {$(
        impl Key for [u8; $n] {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, _: &ahash::RandomState) -> [u64; 1] {
                let mut b = [0u8; 8];
                b[..$n].copy_from_slice(self);
                [u64::from_le_bytes(b)]
            }
        }
    )*};
}
inline_bytes_1!(1, 2, 3, 4, 5, 6, 7, 8);

macro_rules! inline_bytes_2 {
    ($($n:literal),*) => {$(
        impl Key for [u8; $n] {
            type Words = [u64; 2];
            #[inline]
            fn words(&self, _: &ahash::RandomState) -> [u64; 2] {
                let mut b = [0u8; 16];
                b[..$n].copy_from_slice(self);
                [
                    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
                    u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
                ]
            }
        }
    )*};
}
inline_bytes_2!(9, 10, 11, 12, 13, 14, 15, 16);

/// Any `Hash + Eq` key, identified by its 64-bit fingerprint (see the module docs for the
/// collision probability and what a collision means).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hashed<K>(pub K);

impl<K: Hash + Eq> Key for Hashed<K> {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, fp: &ahash::RandomState) -> [u64; 1] {
        [fp.hash_one(&self.0)]
    }
}

macro_rules! fingerprinted {
    ($($t:ty),*) => {$(
        impl Key for $t {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, fp: &ahash::RandomState) -> [u64; 1] {
                [fp.hash_one(self)]
            }
        }
    )*};
}
fingerprinted!(str, String, [u8], Vec<u8>, Box<str>);

impl<K: Key + ?Sized> Key for &K {
    type Words = K::Words;
    #[inline]
    fn words(&self, fp: &ahash::RandomState) -> K::Words {
        (**self).words(fp)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn inline_keys_are_injective_where_it_matters() {
        let fp = ahash::RandomState::with_seeds(1, 2, 3, 4);
        assert_ne!((-1i64).words(&fp), 1i64.words(&fp));
        assert_eq!(u128::MAX.words(&fp), [u64::MAX, u64::MAX]);
        let v4 = Ipv4Addr::new(192, 0, 2, 1);
        assert_eq!(IpAddr::V4(v4).words(&fp), IpAddr::V6(v4.to_ipv6_mapped()).words(&fp));
        assert_ne!(IpAddr::V4(v4).words(&fp), IpAddr::V6(Ipv6Addr::LOCALHOST).words(&fp));
        // A fingerprinted str and String agree, so either can be used to look up the other.
        assert_eq!("tenant-7".words(&fp), String::from("tenant-7").words(&fp));
    }
}
