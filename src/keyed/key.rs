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

/// A key type a keyed limiter can track.
///
/// Implemented for the integer types, `char`, `bool`, the IP address types, `u128`/`i128`,
/// byte arrays up to 16 bytes (all stored inline), [`IpPrefix`] (an address cut to its
/// network), `str`, `String`, `[u8]`, `Vec<u8>`, tuples of up to four keys and [`Hashed<K>`]
/// (fingerprinted). Any `K: Hash + Eq` works as `Hashed<K>`.
///
/// A type of your own implements it through the key it wraps; no hashing crate is needed:
///
/// ```
/// use tollgate::{Key, KeyHasher, KeyedLimiter, TokenBucket};
///
/// #[derive(Clone, Copy)]
/// struct TenantId(u64);
///
/// impl Key for TenantId {
///     type Words = <u64 as Key>::Words;
///     fn words(&self, hasher: &KeyHasher) -> Self::Words {
///         self.0.words(hasher)
///     }
/// }
///
/// let per_tenant = KeyedLimiter::<TenantId>::new(TokenBucket::per_second(10)?, 1_000)?;
/// assert!(per_tenant.check(&TenantId(7)).is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// A key looked up by a borrowed form (`check("a")` on a table of `String`) must give the
/// same words as the owned key: true of every implementation here (`str` and `String`,
/// `[u8]` and `Vec<u8>`, `str` and `Box<str>` fingerprint alike).
pub trait Key {
    /// The identity stored in a slot: one or two `u64`s.
    type Words: Words;
    /// This key's identity. `fingerprint` is the limiter's keyed hasher for keys that are not
    /// stored whole.
    fn words(&self, fingerprint: &KeyHasher) -> Self::Words;
}

/// The keyed hash a limiter fingerprints keys with (a secret seed per limiter). Opaque: a
/// [`Key`] implementation hands it to the key it wraps, or to [`KeyHasher::fingerprint`].
#[derive(Clone)]
pub struct KeyHasher(pub(crate) ahash::RandomState);

impl KeyHasher {
    /// The 64-bit fingerprint of any hashable value (see the module docs for what a collision
    /// means: two keys share one limit, which under-admits).
    #[inline]
    pub fn fingerprint<T: Hash + ?Sized>(&self, value: &T) -> u64 {
        self.0.hash_one(value)
    }
}

impl Debug for KeyHasher {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("KeyHasher { .. }")
    }
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
            fn words(&self, _: &KeyHasher) -> [u64; 1] {
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
            fn words(&self, _: &KeyHasher) -> [u64; 1] {
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
    fn words(&self, _: &KeyHasher) -> [u64; 1] {
        [*self as u64] // usize is at most 64 bits on every supported target
    }
}

impl Key for isize {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, _: &KeyHasher) -> [u64; 1] {
        [*self as i64 as u64] // a bijection for 32- and 64-bit isize
    }
}

impl Key for u128 {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, _: &KeyHasher) -> [u64; 2] {
        #[expect(clippy::cast_possible_truncation, reason = "splitting into halves")]
        let low = *self as u64;
        [(*self >> 64) as u64, low]
    }
}

impl Key for i128 {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &KeyHasher) -> [u64; 2] {
        u128::from_ne_bytes(self.to_ne_bytes()).words(fp)
    }
}

impl Key for Ipv4Addr {
    type Words = [u64; 1];
    #[inline]
    fn words(&self, _: &KeyHasher) -> [u64; 1] {
        [u64::from(u32::from(*self))]
    }
}

impl Key for Ipv6Addr {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &KeyHasher) -> [u64; 2] {
        u128::from(*self).words(fp)
    }
}

/// An IPv4 address is stored as its IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), so
/// `IpAddr::V4(a)` and `IpAddr::V6(a.to_ipv6_mapped())` are one key: the same host, as a
/// dual-stack socket reports it either way. Use [`Hashed<IpAddr>`] to keep them apart.
impl Key for IpAddr {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &KeyHasher) -> [u64; 2] {
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
            fn words(&self, _: &KeyHasher) -> [u64; 1] {
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
            fn words(&self, _: &KeyHasher) -> [u64; 2] {
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
    fn words(&self, fp: &KeyHasher) -> [u64; 1] {
        [fp.fingerprint(&self.0)]
    }
}

macro_rules! fingerprinted {
    ($($t:ty),*) => {$(
        impl Key for $t {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, fp: &KeyHasher) -> [u64; 1] {
                [fp.fingerprint(self)]
            }
        }
    )*};
}
fingerprinted!(str, String, [u8], Vec<u8>, Box<str>);

impl<K: Key + ?Sized> Key for &K {
    type Words = K::Words;
    #[inline]
    fn words(&self, fp: &KeyHasher) -> K::Words {
        (**self).words(fp)
    }
}

/// Tuples of keys: `(IpAddr, u16)`, `(TenantId, &str)`. Fingerprinted: the parts' words,
/// hashed together under the limiter's secret seed.
macro_rules! tuples {
    ($(($($t:ident $i:tt),+)),*) => {$(
        impl<$($t: Key),+> Key for ($($t,)+) {
            type Words = [u64; 1];
            #[inline]
            fn words(&self, fp: &KeyHasher) -> [u64; 1] {
                [fp.fingerprint(&($(self.$i.words(fp),)+))]
            }
        }
    )*};
}
tuples!((A 0, B 1), (A 0, B 1, C 2), (A 0, B 1, C 2, D 3));

/// An IP address as a key, cut to its network: IPv6 to its first `V6` bits (a `/64` by
/// default, the block one host is usually given, so that a host cannot spray addresses to
/// get many limits), IPv4 to its first `V4` bits (the whole address by default).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::{IpPrefix, KeyedLimiter, TokenBucket};
///
/// let per_host = KeyedLimiter::<IpPrefix>::new(TokenBucket::per_second(1)?, 1_000)?;
/// let a: IpAddr = "2001:db8:0:1::1".parse().unwrap();
/// let b: IpAddr = "2001:db8:0:1::2".parse().unwrap(); // the same /64
/// assert!(per_host.check(&IpPrefix::new(a)).is_allowed());
/// assert!(!per_host.check(&IpPrefix::new(b)).is_allowed());
///
/// // A /48 per site, IPv4 by /24.
/// let per_site = KeyedLimiter::<IpPrefix<48, 24>>::new(TokenBucket::per_second(100)?, 1_000)?;
/// assert!(per_site.check(&IpPrefix::new(a)).is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// A prefix longer than the address (`V6 > 128`, `V4 > 32`) is the whole address. IPv4
/// addresses and their IPv4-mapped IPv6 forms are one key, as for [`IpAddr`].
///
/// Equality, hashing and order are those of the network the key stands for (its
/// [`network`](IpPrefix::network)), not of the address given: two addresses of one `/64` are
/// one key, in a `HashMap` as in a limiter.
///
/// ```
/// # use std::net::IpAddr;
/// # use tollgate::IpPrefix;
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
/// assert_eq!(IpPrefix::<64>::new(ip("2001:db8::1")), IpPrefix::new(ip("2001:db8::2")));
/// assert_eq!(IpPrefix::<64>::new(ip("::ffff:192.0.2.1")), IpPrefix::new(ip("192.0.2.1")));
/// assert_ne!(IpPrefix::<64>::new(ip("2001:db8::1")), IpPrefix::new(ip("2001:db8:0:1::1")));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct IpPrefix<const V6: u8 = 64, const V4: u8 = 32>(IpAddr);

impl<const V6: u8, const V4: u8> IpPrefix<V6, V4> {
    /// `addr`, to be limited by its network.
    #[inline]
    pub const fn new(addr: IpAddr) -> IpPrefix<V6, V4> {
        IpPrefix(addr)
    }

    /// The address as given.
    pub const fn addr(&self) -> IpAddr {
        self.0
    }

    /// The network the key stands for: the address with its host bits cleared (an
    /// IPv4-mapped IPv6 address is cut as the IPv4 address it maps, and given as one).
    pub fn network(&self) -> IpAddr {
        let keep = |bits: u8, width: u32| -> u128 {
            let bits = u32::from(bits).min(width);
            if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            }
        };
        // A mapped IPv6 address is the IPv4 host it maps, and is cut as one.
        let addr = match self.0 {
            IpAddr::V6(a) => a.to_ipv4_mapped().map_or(self.0, IpAddr::V4),
            v4 => v4,
        };
        match addr {
            IpAddr::V4(a) => {
                let mask = keep(V4, 32) >> 96;
                let mask = mask as u32;
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & keep(V6, 128))),
        }
    }
}

impl<const V6: u8, const V4: u8> PartialEq for IpPrefix<V6, V4> {
    fn eq(&self, other: &Self) -> bool {
        self.network() == other.network()
    }
}

impl<const V6: u8, const V4: u8> Eq for IpPrefix<V6, V4> {}

impl<const V6: u8, const V4: u8> std::hash::Hash for IpPrefix<V6, V4> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.network().hash(state);
    }
}

impl<const V6: u8, const V4: u8> PartialOrd for IpPrefix<V6, V4> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<const V6: u8, const V4: u8> Ord for IpPrefix<V6, V4> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.network().cmp(&other.network())
    }
}

impl<const V6: u8, const V4: u8> From<IpAddr> for IpPrefix<V6, V4> {
    fn from(addr: IpAddr) -> Self {
        IpPrefix(addr)
    }
}

impl<const V6: u8, const V4: u8> Key for IpPrefix<V6, V4> {
    type Words = [u64; 2];
    #[inline]
    fn words(&self, fp: &KeyHasher) -> [u64; 2] {
        self.network().words(fp)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn inline_keys_are_injective_where_it_matters() {
        let fp = KeyHasher(ahash::RandomState::with_seeds(1, 2, 3, 4));
        assert_ne!((-1i64).words(&fp), 1i64.words(&fp));
        assert_eq!(u128::MAX.words(&fp), [u64::MAX, u64::MAX]);
        let v4 = Ipv4Addr::new(192, 0, 2, 1);
        assert_eq!(IpAddr::V4(v4).words(&fp), IpAddr::V6(v4.to_ipv6_mapped()).words(&fp));
        assert_ne!(IpAddr::V4(v4).words(&fp), IpAddr::V6(Ipv6Addr::LOCALHOST).words(&fp));
        // A fingerprinted str and String agree, so either can be used to look up the other.
        assert_eq!("tenant-7".words(&fp), String::from("tenant-7").words(&fp));
    }

    /// Issue 34: equality and hashing were the whole address's, though the limiter keyed the
    /// network: `2001:db8::1 != 2001:db8::2` as `IpPrefix<64>`, `::ffff:1.2.3.4 != 1.2.3.4`.
    #[test]
    fn prefixes_compare_and_hash_as_their_network() {
        use std::collections::HashSet;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = |s| IpPrefix::<64>::new(ip(s));
        assert_eq!(p("2001:db8::1"), p("2001:db8::2"));
        assert_eq!(p("::ffff:1.2.3.4"), p("1.2.3.4"));
        assert_ne!(p("1.2.3.4"), p("1.2.3.5"));
        assert_ne!(p("2001:db8::1"), p("2001:db8:0:1::1"));
        let set: HashSet<_> =
            ["2001:db8::1", "2001:db8::2", "2001:db8::ffff:0:1", "1.2.3.4", "::ffff:1.2.3.4"]
                .into_iter()
                .map(p)
                .collect();
        assert_eq!(set.len(), 2, "{set:?}");
        assert!(p("2001:db8::1") < p("2001:db8:0:1::1"));
        assert_eq!(p("2001:db8::1").cmp(&p("2001:db8::9")), std::cmp::Ordering::Equal);
        // The address given is kept.
        assert_eq!(p("2001:db8::2").addr(), ip("2001:db8::2"));
    }

    #[test]
    fn prefixes_cut_addresses_to_their_network() {
        let fp = KeyHasher(ahash::RandomState::with_seeds(1, 2, 3, 4));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p64 = |s| IpPrefix::<64>::new(ip(s)).words(&fp);
        assert_eq!(p64("2001:db8::1"), p64("2001:db8::ffff:1"));
        assert_ne!(p64("2001:db8::1"), p64("2001:db8:0:1::1"));
        assert_eq!(p64("192.0.2.1"), ip("192.0.2.1").words(&fp)); // IPv4 whole by default
        assert_eq!(p64("::ffff:192.0.2.1"), p64("192.0.2.1"));
        let p0 = |s| IpPrefix::<0, 0>::new(ip(s)).words(&fp);
        assert_eq!(p0("2001:db8::1"), p0("fe80::1"));
        let all = |s| IpPrefix::<200, 200>::new(ip(s)).words(&fp);
        assert_ne!(all("2001:db8::1"), all("2001:db8::2"));
        assert_eq!(IpPrefix::<48, 24>::new(ip("198.51.100.7")).network(), ip("198.51.100.0"));
        assert_eq!(IpPrefix::<64, 24>::new(ip("::ffff:198.51.100.7")).network(), ip("198.51.100.0"));
        // Tuples: parts in order.
        assert_ne!((1u8, 2u8).words(&fp), (2u8, 1u8).words(&fp));
        assert_eq!((ip("192.0.2.1"), 443u16).words(&fp), (ip("192.0.2.1"), 443u16).words(&fp));
    }
}
