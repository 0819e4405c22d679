//! The bucket values `tollgate_redis` reads back from Redis (`BucketValue::decode`), on any
//! bytes: a key some other program wrote, or a damaged one. Checks: nothing panics; every value
//! that decodes is exactly the encoding of what it decodes to (no two byte strings read as one
//! bucket) and has `m` in 1 to 64; every refusal says why; and a value built from the input's
//! bytes (its `m` brought into 1 to 64) encodes to 36 bytes that decode to it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_redis::BucketValue;

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_be_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    match BucketValue::decode(data) {
        Ok(v) => {
            assert_eq!(&v.encode()[..], data, "{v:?} decoded from other bytes than its own");
            assert!((1..=64).contains(&v.units_per_nano), "{v:?}");
        }
        Err(e) => assert!(!e.is_empty()),
    }

    let v = BucketValue {
        origin_micros: u64_at(data, 0),
        units_per_nano: 1 + u32::from(data.get(8).copied().unwrap_or(0) % 64),
        offset: u64_at(data, 9),
        stamp: u64_at(data, 17),
    };
    let bytes = v.encode();
    assert_eq!(BucketValue::decode(&bytes), Ok(v));
    // Any one bit flipped after the tag is refused (the check word sees it), chosen by the input.
    if let Some(&b) = data.get(25) {
        let bit = usize::from(b) % (8 * 32);
        let mut bad = bytes;
        bad[4 + bit / 8] ^= 1 << (bit % 8);
        assert!(BucketValue::decode(&bad).is_err(), "{v:?} with bit {bit} flipped still decodes");
    }
});
