//! `X-Forwarded-For` and `Forwarded` as a client writes them, read by `tollgate_tower`'s
//! `ClientIp` through its public API only. The first byte picks the socket's peer (`'0'` to
//! `'4'`: a trusted IPv4 proxy, an untrusted IPv4 client, an IPv6 peer, an IPv4-mapped proxy,
//! a global IPv6 client); every other line is one line of both headers (lines that are not a
//! valid header value are skipped). Four extractors read them: trusting everything
//! (`0.0.0.0/0`, `::/0`) and trusting only `10.0.0.0/8`, each on either header. Checks: nothing
//! panics; the key is the client address; the client is the peer or an address written in a
//! header line (every maximal run of `[0-9A-Fa-f.:]` read as an address or `v4:port`, so a
//! value the headers do not hold can never come out); an untrusted peer is the client whatever
//! the headers say.

#![no_main]

use std::net::{IpAddr, SocketAddr};

use http::{HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tollgate_tower::{ClientIp, ForwardedHeader, KeyExtractor};

const PEERS: [&str; 5] =
    ["10.0.0.1:80", "203.0.113.9:5000", "[fd00::1]:443", "[::ffff:10.0.0.1]:80", "[2001:db8::1]:1"];

/// Every address written in `line`, loosely: maximal runs of address characters that parse as
/// an address, or as an IPv4 socket address (`1.2.3.4:80`), canonical.
fn written(line: &[u8], out: &mut Vec<IpAddr>) {
    let address_byte = |b: &u8| b.is_ascii_hexdigit() || *b == b'.' || *b == b':';
    for run in line.split(|b| !address_byte(b)).filter(|r| !r.is_empty()) {
        let run = std::str::from_utf8(run).expect("ASCII");
        if let Ok(ip) = run.parse::<IpAddr>() {
            out.push(ip.to_canonical());
        } else if let Ok(sa) = run.parse::<SocketAddr>() {
            out.push(sa.ip().to_canonical());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let peer: SocketAddr = PEERS[usize::from(pick.wrapping_sub(b'0')) % PEERS.len()].parse().unwrap();
    let mut req = Request::get("/").body(()).unwrap();
    req.extensions_mut().insert(peer);
    let mut candidates = vec![peer.ip().to_canonical()];
    for line in rest.split(|&b| b == b'\n') {
        let Ok(value) = HeaderValue::from_bytes(line) else { continue };
        req.headers_mut().append("x-forwarded-for", value.clone());
        req.headers_mut().append("forwarded", value);
        written(line, &mut candidates);
    }
    let (parts, ()) = req.into_parts();

    let everyone = || ClientIp::<64>::new().trust("0.0.0.0/0").unwrap().trust("::/0").unwrap();
    let proxies = || ClientIp::<64>::new().trust("10.0.0.0/8").unwrap();
    let peer_trusted = matches!(peer.ip().to_canonical(), IpAddr::V4(v4) if v4.octets()[0] == 10);
    for (c, trusts_peer) in [
        (everyone(), true),
        (everyone().header(ForwardedHeader::Forwarded), true),
        (proxies(), peer_trusted),
        (proxies().header(ForwardedHeader::Forwarded), peer_trusted),
    ] {
        let client = c.client(&parts).expect("the peer is there");
        let key = c.extract(&parts).expect("the peer is there");
        assert_eq!(key.addr(), client);
        assert!(candidates.contains(&client), "{client} is neither the peer nor written in {candidates:?}");
        if !trusts_peer {
            assert_eq!(client, peer.ip().to_canonical(), "an untrusted peer's headers were read");
        }
    }
});
