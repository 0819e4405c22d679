//! The RESP request parser (`tollgate_server::resp`) on any bytes, as a connection hands them
//! in: under two sets of small limits (the unit tests' `4/8/20`, and `16/64/256` before
//! authentication), the input is fed in chunks cut at points derived from its own bytes, and
//! requests are taken until the parser says `Incomplete` or `Fatal`. Checks: nothing panics;
//! the buffer is always the unconsumed tail of what was fed (the parser only consumes, never
//! adds or rewrites); every request, re-encoded as a multibulk array, parses back in one piece
//! to exactly the same arguments under the same limits; and the chunked parse gives exactly
//! the results of the parse of the whole input at once.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tollgate_server::resp::{Limits, Parsed, Parser};

/// The unit tests' limits, and roomier ones read before authentication (10 arguments).
const CONFIGS: [(Limits, bool); 2] = [
    (Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 20 }, true),
    (Limits { max_args: 16, max_arg_bytes: 64, max_request_bytes: 256 }, false),
];

fn parser(limits: Limits, authenticated: bool) -> Parser {
    let mut p = Parser::new(limits);
    p.set_authenticated(authenticated);
    p
}

/// Takes requests from `buf` until `Incomplete` (not recorded) or `Fatal` (recorded; returns
/// `true`), checking after each step that `buf` is the tail of the `fed` bytes of `data`.
fn drain(p: &mut Parser, buf: &mut BytesMut, data: &[u8], fed: usize, out: &mut Vec<Parsed>) -> bool {
    loop {
        let got = p.next(buf);
        assert!(buf.len() <= fed, "the buffer grew: {} bytes of {fed} fed", buf.len());
        assert_eq!(&buf[..], &data[fed - buf.len()..fed], "the buffer is not the unconsumed input");
        match got {
            Parsed::Incomplete => return false,
            Parsed::Fatal(e) => {
                assert!(!e.is_empty());
                out.push(Parsed::Fatal(e));
                return true;
            }
            Parsed::Request(args) => {
                assert!(!args.is_empty(), "a request without arguments");
                out.push(Parsed::Request(args));
            }
        }
    }
}

fn multibulk(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fuzz_target!(|data: &[u8]| {
    for (limits, authenticated) in CONFIGS {
        // In chunks: each cut 1 to 8 bytes on, by the byte at the cut.
        let mut chunked = Vec::new();
        let mut p = parser(limits, authenticated);
        let mut buf = BytesMut::new();
        let mut fed = 0;
        while fed < data.len() {
            let step = 1 + usize::from(data[fed] % 8);
            let end = (fed + step).min(data.len());
            buf.extend_from_slice(&data[fed..end]);
            fed = end;
            if drain(&mut p, &mut buf, data, fed, &mut chunked) {
                break;
            }
        }

        // All at once.
        let mut whole = Vec::new();
        let mut p = parser(limits, authenticated);
        let mut buf = BytesMut::from(data);
        drain(&mut p, &mut buf, data, data.len(), &mut whole);

        // However the input is cut, the same requests and the same end (this found lines
        // refused in pieces but read whole, mended in `resp.rs`).
        assert_eq!(chunked, whole, "chunked and whole disagree");

        // Every request round-trips through its multibulk encoding.
        for got in &chunked {
            let Parsed::Request(args) = got else { continue };
            let mut p = parser(limits, authenticated);
            let mut buf = BytesMut::from(&multibulk(args)[..]);
            assert_eq!(p.next(&mut buf), Parsed::Request(args.clone()), "re-encoded {args:?}");
            assert!(buf.is_empty());
            assert_eq!(p.next(&mut buf), Parsed::Incomplete);
        }
    }
});
