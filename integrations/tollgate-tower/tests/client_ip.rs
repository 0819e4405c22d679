//! The client-IP extractors against spoofing: forged `X-Forwarded-For` chains, `Forwarded` with
//! quoted and obfuscated nodes, IPv6 with zones and brackets, IPv4-mapped IPv6, garbage, huge
//! headers. A hostile header never panics, and never yields a key the client chose unless the
//! hop that carries it was appended by a trusted proxy.

use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::{HeaderValue, Request};
use proptest::prelude::*;
use tollgate::IpPrefix;
use tollgate_tower::{ClientIp, ForwardedHeader, KeyError, KeyExtractor, PeerAddr, PeerIp};

fn parts(peer: &str, headers: &[(&str, &[u8])]) -> Parts {
    let mut req = Request::get("/").body(()).unwrap();
    if !peer.is_empty() {
        let peer: SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(peer);
    }
    for (k, v) in headers {
        req.headers_mut()
            .append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_bytes(v).unwrap());
    }
    req.into_parts().0
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn behind_proxies() -> ClientIp<128> {
    ClientIp::new().trust("10.0.0.0/8").unwrap().trust("fd00::/8").unwrap()
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_says() {
    let c = behind_proxies();
    let p = parts("203.0.113.9:5000", &[("x-forwarded-for", b"1.2.3.4"), ("forwarded", b"for=5.6.7.8")]);
    assert_eq!(c.client(&p).unwrap(), ip("203.0.113.9"));
    // With no proxy trusted at all, the same.
    let p = parts("10.0.0.1:80", &[("x-forwarded-for", b"1.2.3.4")]);
    assert_eq!(ClientIp::<128>::new().client(&p).unwrap(), ip("10.0.0.1"));
}

#[test]
fn the_right_most_untrusted_hop_is_the_client() {
    let c = behind_proxies();
    // The client forged "6.6.6.6"; our proxies appended the rest.
    let p = parts("10.0.0.1:80", &[("x-forwarded-for", b"6.6.6.6, 1.2.3.4, 10.0.0.2")]);
    assert_eq!(c.client(&p).unwrap(), ip("1.2.3.4"));
    // Split across lines, in order.
    let p =
        parts("10.0.0.1:80", &[("x-forwarded-for", b"6.6.6.6"), ("x-forwarded-for", b"1.2.3.4, 10.0.0.2")]);
    assert_eq!(c.client(&p).unwrap(), ip("1.2.3.4"));
    // Every hop trusted: the left-most is the client.
    let p = parts("10.0.0.1:80", &[("x-forwarded-for", b"10.9.9.9, 10.0.0.2")]);
    assert_eq!(c.client(&p).unwrap(), ip("10.9.9.9"));
    // No header: the proxy itself.
    assert_eq!(c.client(&parts("10.0.0.1:80", &[])).unwrap(), ip("10.0.0.1"));
}

#[test]
fn a_hop_that_is_not_an_address_stops_the_walk_at_the_nearest_trusted_proxy() {
    let c = behind_proxies();
    for garbage in [
        &b"1.2.3.4, nonsense"[..],
        b"1.2.3.4, fe80::1%eth0",
        b"1.2.3.4, 999.1.1.1",
        b"1.2.3.4, ",
        b"1.2.3.4, unknown, 10.0.0.2",
        b"1.2.3.4,\xff\xfe",
    ] {
        let p = parts("10.0.0.1:80", &[("x-forwarded-for", garbage)]);
        let got = c.client(&p).unwrap();
        assert!(
            got == ip("10.0.0.1") || got == ip("10.0.0.2"),
            "{:?} gave {got}",
            String::from_utf8_lossy(garbage)
        );
    }
}

#[test]
fn forwarded_nodes_quoted_bracketed_and_obfuscated() {
    let c = behind_proxies().header(ForwardedHeader::Forwarded);
    let p =
        parts("10.0.0.1:80", &[("forwarded", br#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https"#)]);
    assert_eq!(c.client(&p).unwrap(), ip("2001:db8:cafe::17"));
    let p = parts("10.0.0.1:80", &[("forwarded", b"for=6.6.6.6, for=_hidden")]);
    assert_eq!(c.client(&p).unwrap(), ip("10.0.0.1"));
    let p = parts("10.0.0.1:80", &[("forwarded", br#"for="[fd00::5]", FOR=192.0.2.60"#)]);
    assert_eq!(c.client(&p).unwrap(), ip("192.0.2.60"));
    // The header the proxies do not write is never read: a client's own Forwarded is ignored
    // by an X-Forwarded-For reader, and the other way round.
    let p = parts("10.0.0.1:80", &[("forwarded", b"for=6.6.6.6"), ("x-forwarded-for", b"1.2.3.4")]);
    assert_eq!(behind_proxies().client(&p).unwrap(), ip("1.2.3.4"));
    assert_eq!(c.client(&parts("10.0.0.1:80", &[("x-forwarded-for", b"6.6.6.6")])).unwrap(), ip("10.0.0.1"));
}

#[test]
fn ipv4_mapped_ipv6_and_prefixes() {
    let c = behind_proxies();
    // A dual-stack socket reports the IPv4 proxy as ::ffff:10.0.0.1: still trusted.
    let p = parts("[::ffff:10.0.0.1]:80", &[("x-forwarded-for", b"::ffff:1.2.3.4")]);
    assert_eq!(c.client(&p).unwrap(), ip("1.2.3.4"));
    // By /64: one host's addresses are one key.
    let by64 = ClientIp::<64>::new();
    let a = by64.extract(&parts("[2001:db8::1]:1", &[])).unwrap();
    let b = by64.extract(&parts("[2001:db8::ffff:1]:1", &[])).unwrap();
    assert_eq!(a.network(), b.network());
    assert_eq!(PeerIp::<64>.extract(&parts("[2001:db8::2]:1", &[])).unwrap().network(), a.network());
    // The peer as its own extension type.
    let mut req = Request::get("/").body(()).unwrap();
    req.extensions_mut().insert(PeerAddr("192.0.2.1:9".parse().unwrap()));
    let (p, _) = req.into_parts();
    assert_eq!(PeerIp::<64>.extract(&p).unwrap(), IpPrefix::new(ip("192.0.2.1")));
}

#[test]
fn configuration_and_missing_peers_are_typed_errors() {
    for bad in ["10.0.0.0/33", "nonsense", "::/129", "10.0.0.0/", "/8", "10.0.0.0/-1"] {
        let e = ClientIp::<64>::new().trust(bad).unwrap_err();
        assert!(e.to_string().contains(bad), "{e}");
    }
    assert_eq!(ClientIp::<64>::new().extract(&parts("", &[])).unwrap_err(), KeyError::NoPeerAddress);
    assert_eq!(PeerIp::<64>.extract(&parts("", &[])).unwrap_err(), KeyError::NoPeerAddress);
}

proptest! {
    /// Any header bytes: no panic, and the client is the peer, an address that appears in the
    /// header, or a trusted proxy; from an untrusted peer, always the peer.
    #[test]
    fn hostile_headers_never_choose_the_key(
        xff in prop::collection::vec(any::<u8>(), 0..200),
        fwd in prop::collection::vec(any::<u8>(), 0..200),
        trusted_peer in any::<bool>(),
    ) {
        let peer = if trusted_peer { "10.0.0.1:80" } else { "203.0.113.9:80" };
        let mut headers: Vec<(&str, &[u8])> = Vec::new();
        if HeaderValue::from_bytes(&xff).is_ok() {
            headers.push(("x-forwarded-for", &xff));
        }
        if HeaderValue::from_bytes(&fwd).is_ok() {
            headers.push(("forwarded", &fwd));
        }
        let p = parts(peer, &headers);
        for c in [behind_proxies(), behind_proxies().header(ForwardedHeader::Forwarded)] {
            let got = c.client(&p).unwrap();
            if !trusted_peer {
                prop_assert_eq!(got, ip("203.0.113.9"));
            }
        }
    }

    /// Chains of real addresses: the answer is exactly the right-most untrusted one.
    #[test]
    fn chains_of_addresses(chain in prop::collection::vec((any::<bool>(), any::<u8>()), 0..10)) {
        let hops: Vec<String> =
            chain.iter().map(|&(trusted, b)| if trusted { format!("10.0.0.{b}") } else { format!("198.51.100.{b}") }).collect();
        let header = hops.join(", ");
        let p = parts("10.0.0.1:80", &[("x-forwarded-for", header.as_bytes())]);
        let want = hops.iter().rev().find(|h| h.starts_with("198.")).or(hops.first()).map_or(ip("10.0.0.1"), |h| ip(h));
        prop_assert_eq!(behind_proxies().client(&p).unwrap(), want);
    }
}

/// Issue 34: a line with a byte that is not visible ASCII (obs-text) was one unknown hop as a
/// whole, so the key fell back to the socket peer even where trusted hops followed the client.
/// Read as bytes, the client is found; the garbage hop is an unknown hop where it stands.
#[test]
fn a_line_with_obs_text_is_read_hop_by_hop() {
    let c = behind_proxies();
    let p = parts("10.0.0.1:80", &[("x-forwarded-for", b"\xfe\xff, 1.2.3.4, 10.0.0.2")]);
    assert_eq!(c.client(&p).unwrap(), ip("1.2.3.4"));
    let fwd = behind_proxies().header(ForwardedHeader::Forwarded);
    let p = parts("10.0.0.1:80", &[("forwarded", b"for=\"\xe9\", for=1.2.3.4;by=\xff, for=10.0.0.2")]);
    assert_eq!(fwd.client(&p).unwrap(), ip("1.2.3.4"));
    // The garbage as the right-most untrusted hop is read as the hop `unknown` is.
    let p = parts("10.0.0.1:80", &[("x-forwarded-for", b"1.2.3.4, \xfe\xff, 10.0.0.2")]);
    let unknown = parts("10.0.0.1:80", &[("x-forwarded-for", b"1.2.3.4, unknown, 10.0.0.2")]);
    assert_eq!(c.client(&p).ok(), c.client(&unknown).ok());
}
