//! One captured frame read down to what policing needs: its flow's key, the IP packet's length
//! (what the RFCs meter: the IP header and payload, not the link header), and where its DSCP
//! lives (to re-mark it); or why it cannot be metered.
//!
//! Link types: Ethernet (with one or two VLAN tags), raw IPv4/IPv6, Linux cooked (SLL, a
//! `tcpdump -i any` capture) and BSD loopback (NULL). IPv6 extension headers are walked to the
//! transport header. The length is the IP header's own (`total_len`, or 40 + `payload_length`),
//! so a capture cut short by its snap length still meters each packet whole.
//!
//! Policy for what cannot be metered (the caller applies it, [`Unmetered`]):
//! - **not IP** (ARP, LLDP, ...): passed, unmetered, counted;
//! - **malformed** (a truncated header, a bad IHL, a length field below the header or beyond a
//!   frame the capture did not cut, an IPv6 payload length of 0 (a jumbogram's, not metered),
//!   a bad extension header): counted by reason, and dropped
//!   or passed as configured (dropped by default: it has no flow to be metered as);
//! - **an unknown link type**: as not IP.
//!
//! Non-first IPv4 fragments and IPv6 fragments carry no ports: they are keyed with ports 0
//! (by source prefix, keys do not depend on ports at all).

use std::net::IpAddr;

use etherparse::{err::Layer, EtherType, LaxNetSlice, LaxSlicedPacket, TransportSlice};
use pcap_file::DataLink;

/// How packets are grouped into flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBy {
    /// Source and destination address, protocol, source and destination port.
    FiveTuple,
    /// The source address's network: its first `v4` bits for IPv4 (`/24`), its first `v6` bits
    /// for IPv6 (`/64`).
    SourcePrefix {
        /// Bits of an IPv4 source (0 to 32).
        v4: u8,
        /// Bits of an IPv6 source (0 to 128).
        v6: u8,
    },
}

/// A flow: what [`KeyBy`] keeps of a packet. IPv4 addresses are held as IPv4-mapped IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// The source address (or its network).
    pub src: u128,
    /// The destination address (0 when keyed by source prefix).
    pub dst: u128,
    /// The IP protocol (0 when keyed by source prefix).
    pub proto: u8,
    /// The source port (0 without one, or by source prefix).
    pub sport: u16,
    /// The destination port (0 without one, or by source prefix).
    pub dport: u16,
}

impl FlowKey {
    /// The source as an address.
    pub fn source(&self) -> IpAddr {
        IpAddr::from(self.src.to_be_bytes()).to_canonical()
    }

    /// The destination as an address.
    pub fn destination(&self) -> IpAddr {
        IpAddr::from(self.dst.to_be_bytes()).to_canonical()
    }
}

/// Where the DSCP bits are: the IPv4 TOS byte (its header checksum follows the change), or
/// the IPv6 traffic class across the header's first two bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dscp {
    /// The IPv4 header starts at this offset of the frame.
    V4(usize),
    /// The IPv6 header starts at this offset of the frame.
    V6(usize),
}

/// Why a frame is not metered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unmetered {
    /// Not an IP packet (or an IP version other than 4 and 6).
    NotIp,
    /// The capture's link type is not one this reader knows.
    UnknownLink,
    /// A header cut short.
    Truncated,
    /// An IPv4 header length (IHL) below 5 words, or beyond the packet.
    BadIhl,
    /// A length field below its header, or beyond a frame the capture did not cut short.
    BadLength,
    /// Another header that does not read (a version, an extension header, a TCP header).
    BadHeader,
}

impl Unmetered {
    /// Every reason, in order.
    pub const ALL: [Unmetered; 6] = [
        Unmetered::NotIp,
        Unmetered::UnknownLink,
        Unmetered::Truncated,
        Unmetered::BadIhl,
        Unmetered::BadLength,
        Unmetered::BadHeader,
    ];

    /// The reason's name: `not_ip`, `unknown_link`, `truncated`, `bad_ihl`, `bad_length`,
    /// `bad_header`.
    pub fn name(self) -> &'static str {
        match self {
            Unmetered::NotIp => "not_ip",
            Unmetered::UnknownLink => "unknown_link",
            Unmetered::Truncated => "truncated",
            Unmetered::BadIhl => "bad_ihl",
            Unmetered::BadLength => "bad_length",
            Unmetered::BadHeader => "bad_header",
        }
    }

    /// Whether the frame is malformed (as opposed to not IP, or of an unknown link).
    pub fn is_malformed(self) -> bool {
        !matches!(self, Unmetered::NotIp | Unmetered::UnknownLink)
    }
}

/// A frame that can be metered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metered {
    /// Its flow.
    pub key: FlowKey,
    /// The IP packet's length in bytes, as its header gives it.
    pub len: u32,
    /// Where its DSCP is.
    pub dscp: Dscp,
}

/// Reads `frame` (captured on a link of type `link`; `cut` when the capture kept fewer bytes
/// than the wire carried) down to its flow and length, keyed `by`.
///
/// The common frame (Ethernet, at most one VLAN tag, IPv4 or IPv6 without extension headers,
/// TCP or UDP, whole) is read by etherparse's header slices alone; anything else, and
/// anything unusual about it, by etherparse's lax slicing of the whole packet. Debug builds
/// (the test suite, the fuzz targets) check that both give the same answer.
#[inline]
pub fn read(link: DataLink, frame: &[u8], cut: bool, by: KeyBy) -> Result<Metered, Unmetered> {
    match read_common(link, frame, by) {
        Some(m) => {
            debug_assert_eq!(Ok(m), read_lax(link, frame, cut, by), "{frame:02x?}");
            Ok(m)
        }
        None => read_lax(link, frame, cut, by),
    }
}

/// The common frame's flow and length, or `None` for anything else (or anything odd).
#[inline]
fn read_common(link: DataLink, frame: &[u8], by: KeyBy) -> Option<Metered> {
    use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, TcpHeaderSlice, UdpHeaderSlice};
    if link != DataLink::ETHERNET || frame.len() < 14 {
        return None;
    }
    let (mut ether_type, mut at) = (u16::from_be_bytes([frame[12], frame[13]]), 14);
    if ether_type == 0x8100 {
        ether_type = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        at = 18;
    }
    let ip = &frame[at..];
    let (src, dst, len, proto, header_len, dscp) = match ether_type {
        0x0800 => {
            let h = Ipv4HeaderSlice::from_slice(ip).ok()?;
            let (total, header) = (usize::from(h.total_len()), h.slice().len());
            if total < header || total > ip.len() || h.is_fragmenting_payload() {
                return None;
            }
            let mapped = |a: std::net::Ipv4Addr| u128::from(a.to_ipv6_mapped());
            (
                mapped(h.source_addr()),
                mapped(h.destination_addr()),
                total,
                h.protocol().0,
                header,
                Dscp::V4(at),
            )
        }
        0x86dd => {
            let h = Ipv6HeaderSlice::from_slice(ip).ok()?;
            let total = 40 + usize::from(h.payload_length());
            if total == 40 || total > ip.len() {
                return None;
            }
            (
                u128::from(h.source_addr()),
                u128::from(h.destination_addr()),
                total,
                h.next_header().0,
                40,
                Dscp::V6(at),
            )
        }
        _ => return None,
    };
    let transport = &ip[header_len..len];
    let (sport, dport) = match proto {
        6 => {
            let t = TcpHeaderSlice::from_slice(transport).ok()?;
            (t.source_port(), t.destination_port())
        }
        17 => {
            let u = UdpHeaderSlice::from_slice(transport).ok()?;
            if usize::from(u.length()) != transport.len() {
                return None;
            }
            (u.source_port(), u.destination_port())
        }
        _ => return None,
    };
    let key = match by {
        KeyBy::FiveTuple => FlowKey { src, dst, proto, sport, dport },
        KeyBy::SourcePrefix { .. } => prefix_key(src, ether_type == 0x0800, by),
    };
    Some(Metered { key, len: u32::try_from(len).ok()?, dscp })
}

/// The key of a source `src` (IPv4-mapped when `v4`) by its prefix.
fn prefix_key(src: u128, v4: bool, by: KeyBy) -> FlowKey {
    let KeyBy::SourcePrefix { v4: bits4, v6: bits6 } = by else {
        unreachable!("a prefix key is asked for by prefix")
    };
    // An IPv4 address sits in the mapped address's last 32 bits.
    let bits = if v4 { 96 + u32::from(bits4.min(32)) } else { u32::from(bits6.min(128)) };
    let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
    FlowKey { src: src & mask, dst: 0, proto: 0, sport: 0, dport: 0 }
}

/// [`read`] for any frame, by etherparse's lax slicing.
fn read_lax(link: DataLink, frame: &[u8], cut: bool, by: KeyBy) -> Result<Metered, Unmetered> {
    let sliced = match link {
        DataLink::ETHERNET => LaxSlicedPacket::from_ethernet(frame).map_err(|_| Unmetered::Truncated)?,
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => from_ip(frame)?,
        DataLink::LINUX_SLL => {
            // 16 bytes: packet type, ARPHRD, address length and address (8), protocol.
            let header = frame.get(..16).ok_or(Unmetered::Truncated)?;
            let ether_type = EtherType(u16::from_be_bytes([header[14], header[15]]));
            LaxSlicedPacket::from_ether_type(ether_type, &frame[16..])
        }
        DataLink::NULL | DataLink::LOOP => {
            // 4 bytes of address family (the capturing host's order; LOOP: network order).
            let body = frame.get(4..).ok_or(Unmetered::Truncated)?;
            from_ip(body)?
        }
        _ => return Err(Unmetered::UnknownLink),
    };
    if let Some((err, layer)) = &sliced.stop_err {
        let reason = match layer {
            Layer::Ethernet2Header | Layer::VlanHeader | Layer::LinuxSllHeader => Unmetered::Truncated,
            Layer::IpHeader | Layer::Ipv4Header | Layer::Ipv6Header => ip_reason(err),
            Layer::Ipv4Packet | Layer::Ipv6Packet => Unmetered::BadLength,
            // A transport header the capture cut: keyed without ports below.
            Layer::TcpHeader | Layer::UdpHeader | Layer::Icmpv4 | Layer::Icmpv6 if cut => Unmetered::NotIp,
            _ => Unmetered::BadHeader,
        };
        if reason != Unmetered::NotIp {
            return Err(reason);
        }
    }
    let net = sliced.net.as_ref().ok_or(Unmetered::NotIp)?;
    let (src, dst, len, proto, incomplete, dscp) = match net {
        LaxNetSlice::Ipv4(ip) => {
            let h = ip.header();
            let offset = offset_of(frame, h.slice());
            let total = h.total_len();
            if usize::from(total) < h.slice().len() {
                return Err(Unmetered::BadLength);
            }
            let mapped = |a: std::net::Ipv4Addr| u128::from(a.to_ipv6_mapped());
            let p = ip.payload();
            (
                mapped(h.source_addr()),
                mapped(h.destination_addr()),
                u32::from(total),
                p.ip_number.0,
                p.incomplete,
                Dscp::V4(offset),
            )
        }
        LaxNetSlice::Ipv6(ip) => {
            let h = ip.header();
            if h.payload_length() == 0 {
                // A jumbogram's (its length in a hop-by-hop option), or a lie: not metered as
                // 40 bytes.
                return Err(Unmetered::BadLength);
            }
            let offset = offset_of(frame, h.slice());
            let p = ip.payload();
            let len = 40 + u32::from(h.payload_length());
            (
                u128::from(h.source_addr()),
                u128::from(h.destination_addr()),
                len,
                p.ip_number.0,
                p.incomplete,
                Dscp::V6(offset),
            )
        }
    };
    // A packet longer than its frame, in a frame the capture kept whole: its length lies.
    if incomplete && !cut {
        return Err(Unmetered::BadLength);
    }
    let (sport, dport) = match &sliced.transport {
        Some(TransportSlice::Tcp(t)) => (t.source_port(), t.destination_port()),
        Some(TransportSlice::Udp(u)) => (u.source_port(), u.destination_port()),
        _ => (0, 0),
    };
    let key = match by {
        KeyBy::FiveTuple => FlowKey { src, dst, proto, sport, dport },
        KeyBy::SourcePrefix { .. } => prefix_key(src, matches!(net, LaxNetSlice::Ipv4(_)), by),
    };
    Ok(Metered { key, len, dscp })
}

/// An IP packet from its first byte: its version picks the header.
fn from_ip(data: &[u8]) -> Result<LaxSlicedPacket<'_>, Unmetered> {
    LaxSlicedPacket::from_ip(data).map_err(|e| {
        use etherparse::err::ip::LaxHeaderSliceError as E;
        match e {
            E::Len(_) => Unmetered::Truncated,
            E::Content(c) => ip_content_reason(&c),
        }
    })
}

fn ip_reason(err: &etherparse::err::packet::SliceError) -> Unmetered {
    use etherparse::err::packet::SliceError as S;
    match err {
        S::Len(_) => Unmetered::Truncated,
        S::Ip(e) => ip_content_reason(e),
        S::Ipv4(e) => ipv4_reason(e),
        S::Ipv6(_) => Unmetered::NotIp,
        _ => Unmetered::BadHeader,
    }
}

fn ip_content_reason(e: &etherparse::err::ip::HeaderError) -> Unmetered {
    use etherparse::err::ip::HeaderError as H;
    match e {
        H::UnsupportedIpVersion { .. } => Unmetered::NotIp,
        H::Ipv4HeaderLengthSmallerThanHeader { .. } => Unmetered::BadIhl,
    }
}

fn ipv4_reason(e: &etherparse::err::ipv4::HeaderError) -> Unmetered {
    use etherparse::err::ipv4::HeaderError as H;
    match e {
        H::UnexpectedVersion { .. } => Unmetered::NotIp,
        H::HeaderLengthSmallerThanHeader { .. } => Unmetered::BadIhl,
    }
}

/// Where `part` (a subslice of `frame`) starts in it.
fn offset_of(frame: &[u8], part: &[u8]) -> usize {
    (part.as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize).min(frame.len())
}

/// Sets the packet's DSCP (0 to 63) in `frame`, where [`read`] found it: the IPv4 TOS byte and
/// its header checksum, or the IPv6 traffic class. Its ECN bits are kept.
pub fn remark(frame: &mut [u8], at: Dscp, dscp: u8) {
    let dscp = dscp & 0x3f;
    match at {
        Dscp::V4(o) => {
            let Some(header) = frame.get_mut(o..) else { return };
            if header.len() < 20 {
                return;
            }
            let ihl = usize::from(header[0] & 0x0f) * 4;
            if header.len() < ihl || ihl < 20 {
                return;
            }
            header[1] = (dscp << 2) | (header[1] & 0x03);
            header[10] = 0;
            header[11] = 0;
            let mut sum: u32 =
                header[..ihl].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            let check = !(sum as u16);
            header[10..12].copy_from_slice(&check.to_be_bytes());
        }
        Dscp::V6(o) => {
            let Some(header) = frame.get_mut(o..o + 2) else { return };
            // Version (4 bits), traffic class (8: DSCP 6, ECN 2), flow label (20).
            let ecn = (header[1] >> 4) & 0x03;
            let tc = (dscp << 2) | ecn;
            header[0] = (header[0] & 0xf0) | (tc >> 4);
            header[1] = (header[1] & 0x0f) | (tc << 4);
        }
    }
}
