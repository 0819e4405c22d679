//! The hops of `X-Forwarded-For` and RFC 7239 `Forwarded`, in order, left to right. Headers are
//! hostile input: nothing here panics, allocates more than the hops it returns, or turns a value
//! that is not an address into one.

use std::net::{IpAddr, SocketAddr};

use http::header::{GetAll, HeaderValue};
use http::HeaderMap;

/// One hop of a forwarding chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// An address (IPv4-mapped IPv6 read as IPv4).
    Addr(IpAddr),
    /// Anything else: `unknown`, an obfuscated node (`_hidden`), garbage, an address with a zone.
    Unknown,
}

/// Most hops read from one request: a longer chain is cut at its left (the hops furthest from
/// us, which a client could have padded). Nobody runs 64 proxies.
const MAX_HOPS: usize = 64;

/// A node as written in either header: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`. Bytes that are not UTF-8 (obs-text) are no address.
fn node(s: &[u8]) -> Hop {
    let Ok(s) = std::str::from_utf8(s) else { return Hop::Unknown };
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Hop::Addr(ip.to_canonical());
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Hop::Addr(sa.ip().to_canonical());
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if let Ok(ip) = inner.parse::<std::net::Ipv6Addr>() {
            return Hop::Addr(IpAddr::V6(ip).to_canonical());
        }
    }
    Hop::Unknown
}

/// `X-Forwarded-For`'s hops, over every line of the header in order. A line is read as bytes:
/// a hop that is not visible ASCII (obs-text) is one unknown hop, and the hops beside it keep
/// their addresses (a comma is ASCII, never part of a multi-byte character).
pub(crate) fn x_forwarded_for(headers: &HeaderMap) -> Vec<Hop> {
    let mut hops = Vec::new();
    for line in headers.get_all("x-forwarded-for") {
        for part in line.as_bytes().split(|&b| b == b',') {
            hops.push(node(part));
        }
    }
    keep_right(hops)
}

/// `Forwarded`'s `for=` hops, over every line in order. An element without `for=` is an unknown
/// hop (it still stands for a proxy that did not say who it heard from).
pub(crate) fn forwarded_for(lines: GetAll<'_, HeaderValue>) -> Vec<Hop> {
    let mut hops = Vec::new();
    for line in lines {
        // Bytes, as for `X-Forwarded-For`: obs-text in one element leaves the others readable.
        for element in split_outside_quotes(line.as_bytes(), b',') {
            let mut hop = Hop::Unknown;
            for pair in split_outside_quotes(element, b';') {
                let Some(eq) = pair.iter().position(|&b| b == b'=') else { continue };
                let (name, value) = (&pair[..eq], &pair[eq + 1..]);
                if name.trim_ascii().eq_ignore_ascii_case(b"for") {
                    hop = match unquote(value.trim_ascii()) {
                        Some(v) => node(v),
                        None => Hop::Unknown,
                    };
                }
            }
            hops.push(hop);
        }
    }
    keep_right(hops)
}

fn keep_right(mut hops: Vec<Hop>) -> Vec<Hop> {
    if hops.len() > MAX_HOPS {
        hops.drain(..hops.len() - MAX_HOPS);
    }
    hops
}

/// `s` split at `sep` where it is not inside a quoted-string (with `\` escapes).
fn split_outside_quotes(s: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &c) in s.iter().enumerate() {
        match c {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// A token, or a quoted-string's content (no escapes: an address never needs one); `None` for a
/// quoted-string that does not close, or has an escape.
fn unquote(v: &[u8]) -> Option<&[u8]> {
    match v.strip_prefix(b"\"") {
        None => Some(v),
        Some(rest) => {
            rest.strip_suffix(b"\"").filter(|inner| !inner.iter().any(|&b| b == b'"' || b == b'\\'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hops(xff: &[&str]) -> Vec<Hop> {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        x_forwarded_for(&h)
    }

    fn fwd(lines: &[&str]) -> Vec<Hop> {
        let mut h = HeaderMap::new();
        for v in lines {
            h.append("forwarded", HeaderValue::from_str(v).unwrap());
        }
        forwarded_for(h.get_all("forwarded"))
    }

    fn a(s: &str) -> Hop {
        Hop::Addr(s.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn x_forwarded_for_reads_every_line_in_order() {
        assert_eq!(hops(&["1.2.3.4, 10.0.0.1", "10.0.0.2"]), [a("1.2.3.4"), a("10.0.0.1"), a("10.0.0.2")]);
        assert_eq!(
            hops(&["1.2.3.4:5678, [2001:db8::1]:443, 2001:db8::2"]),
            [a("1.2.3.4"), a("2001:db8::1"), a("2001:db8::2")]
        );
        // IPv4-mapped IPv6 is the IPv4 address; zones, garbage and empty hops are unknown.
        assert_eq!(hops(&["::ffff:1.2.3.4"]), [a("1.2.3.4")]);
        assert_eq!(hops(&["fe80::1%eth0, , nonsense, 999.1.1.1"]), [Hop::Unknown; 4]);
    }

    #[test]
    fn forwarded_reads_for_with_quotes_brackets_and_obfuscation() {
        assert_eq!(
            fwd(&[r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711""#]),
            [a("192.0.2.60"), a("2001:db8:cafe::17")]
        );
        assert_eq!(fwd(&["for=unknown, for=_hidden, for=\"_SEVKISEK\""]), [Hop::Unknown; 3]);
        // A comma inside quotes does not split an element; a broken quote is unknown.
        assert_eq!(fwd(&[r#"for="1.2.3.4, 5.6.7.8""#]), [Hop::Unknown]);
        assert_eq!(fwd(&[r#"for="1.2.3.4"#]), [Hop::Unknown]);
        assert_eq!(fwd(&["proto=https"]), [Hop::Unknown]);
    }

    /// Issue 34: a line with obs-text was one unknown hop, hiding the trusted hops after it.
    #[test]
    fn a_hop_that_is_not_ascii_is_one_unknown_hop_and_the_others_are_read() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_bytes(b"1.2.3.4, \xff\xfe, 10.0.0.1").unwrap());
        assert_eq!(x_forwarded_for(&h), [a("1.2.3.4"), Hop::Unknown, a("10.0.0.1")]);
        let mut h = HeaderMap::new();
        h.append("forwarded", HeaderValue::from_bytes(b"for=\"\xe9t\xe9\", for=192.0.2.60;by=\xff").unwrap());
        assert_eq!(forwarded_for(h.get_all("forwarded")), [Hop::Unknown, a("192.0.2.60")]);
    }

    #[test]
    fn long_chains_keep_their_right_end() {
        let long = vec!["9.9.9.9"; 1000].join(",") + ",1.1.1.1";
        let h = hops(&[&long]);
        assert_eq!(h.len(), MAX_HOPS);
        assert_eq!(h.last(), Some(&a("1.1.1.1")));
    }
}
