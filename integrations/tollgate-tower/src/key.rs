//! What a keyed limit counts a request against: the client's address (the socket's, or a
//! trusted proxy's report of it), a header, the path or one of its segments, or any function
//! of the request.

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use tollgate::IpPrefix;

use crate::forwarded::{forwarded_for, x_forwarded_for, Hop};

/// Why a request has no key for a limit. The layer answers it with
/// [`RateLimitLayer::key_error_status`](crate::RateLimitLayer::key_error_status) (400 by
/// default): a request the limit cannot place is not let through unlimited.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request carries no peer address: the server did not put the connection's
    /// `SocketAddr` in the request's extensions (see [`PeerIp`]).
    NoPeerAddress,
    /// The header the key comes from is missing.
    MissingHeader(HeaderName),
    /// The header is present but not visible ASCII, or empty.
    MalformedHeader(HeaderName),
    /// The path has no (non-empty) segment at this place ([`PathSegment`], [`PathParam`]).
    MissingPathSegment(usize),
    /// The path's segment at this place is not UTF-8 once percent-decoded, or does not parse
    /// as the key ([`PathSegment`], [`PathParam`]).
    MalformedPathSegment(usize),
    /// A key extractor of the application's refused the request, saying why.
    Refused(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NoPeerAddress => f.write_str(
                "the request has no peer address: serve with the connection's SocketAddr in the request extensions",
            ),
            KeyError::MissingHeader(h) => write!(f, "the request has no `{h}` header to limit by"),
            KeyError::MalformedHeader(h) => {
                write!(f, "the `{h}` header is empty or not visible ASCII, so it cannot be a limit's key")
            }
            KeyError::MissingPathSegment(i) => {
                write!(f, "the request's path has no segment {i} (counted from 0) to limit by")
            }
            KeyError::MalformedPathSegment(i) => {
                write!(
                    f,
                    "the request's path segment {i} is not UTF-8 once percent-decoded, or not of the limit's key type, so it cannot be its key"
                )
            }
            KeyError::Refused(why) => write!(f, "the request has no key: {why}"),
        }
    }
}

impl std::error::Error for KeyError {}

/// How a keyed limit finds a request's key. Implemented by the extractors of this module and by
/// any `Fn(&Parts) -> Result<K, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key: what the keyed limiter is keyed by.
    type Key: tollgate::Key + Send + Sync + 'static;
    /// The request's key.
    fn extract(&self, req: &Parts) -> Result<Self::Key, KeyError>;
}

impl<K, F> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<K, KeyError> + Send + Sync + 'static,
    K: tollgate::Key + Send + Sync + 'static,
{
    type Key = K;
    fn extract(&self, req: &Parts) -> Result<K, KeyError> {
        self(req)
    }
}

/// The connection's peer address, from the request's extensions: a [`SocketAddr`] or a
/// [`PeerAddr`] the server inserted for each accepted connection.
///
/// With the `axum` feature axum's `ConnectInfo` is looked up first (where axum serves, it is
/// the one there: one lookup instead of two); a server inserts one of them, so the order only
/// matters to a request carrying several, which then gets the first found.
pub(crate) fn peer_addr(req: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = req.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    if let Some(addr) = req.extensions.get::<SocketAddr>() {
        return Some(*addr);
    }
    req.extensions.get::<PeerAddr>().map(|p| p.0)
}

/// The peer address as an extension of its own, for servers that cannot insert a bare
/// [`SocketAddr`] (one extension type per crate is the convention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The socket's peer address, by network: a `/64` for IPv6 (one host holds a whole /64, so its
/// addresses are one key: it cannot spray them) and the address for IPv4, by default. Ignores
/// every forwarding header: right when clients connect directly.
///
/// The server puts the peer in the request's extensions, as a [`SocketAddr`] or a [`PeerAddr`],
/// for each connection it accepts (with the `axum` feature, axum's `ConnectInfo<SocketAddr>`
/// from `into_make_service_with_connect_info::<SocketAddr>()` is read too); without it the
/// request is refused with [`KeyError::NoPeerAddress`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp<const V6: u8 = 64, const V4: u8 = 32>;

impl<const V6: u8, const V4: u8> KeyExtractor for PeerIp<V6, V4> {
    type Key = IpPrefix<V6, V4>;
    fn extract(&self, req: &Parts) -> Result<IpPrefix<V6, V4>, KeyError> {
        let peer = peer_addr(req).ok_or(KeyError::NoPeerAddress)?;
        Ok(IpPrefix::new(peer.ip().to_canonical()))
    }
}

/// Which header the trusted proxies report the client in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de-facto header; the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The client's address behind trusted reverse proxies, by network (`/64` for IPv6 by default).
///
/// Forwarding headers are written by whoever sent the request, so they are believed only as far
/// as they were appended by a proxy you trust: if the socket's peer is not one of the trusted
/// networks, the key is the peer itself and no header is read. Otherwise the header's hops are
/// walked from the right (the most recent, appended by the nearest proxy) past every trusted
/// address, and the first untrusted one is the client. A hop that is not an address (garbage,
/// `unknown`, an obfuscated node, an address with a zone) ends the walk: the key is then the
/// nearest trusted proxy's address, never a value the client chose. With every hop trusted, the
/// left-most is the client.
///
/// Read only the header your proxies append (`X-Forwarded-For` by default): a client can send
/// the other one, and a proxy that does not know it passes it through unchanged.
#[derive(Clone, Debug, Default)]
pub struct ClientIp<const V6: u8 = 64, const V4: u8 = 32> {
    trusted: Vec<(IpAddr, u8)>,
    header: ForwardedHeader,
}

/// A trusted network that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadNetwork(pub String);

impl fmt::Display for BadNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a network: expected an address or address/prefix, such as 10.0.0.0/8 or fd00::/8",
            self.0
        )
    }
}

impl std::error::Error for BadNetwork {}

impl<const V6: u8, const V4: u8> ClientIp<V6, V4> {
    /// Trusting no proxy: the key is the socket's peer (as [`PeerIp`]) until networks are added.
    pub fn new() -> Self {
        ClientIp { trusted: Vec::new(), header: ForwardedHeader::default() }
    }

    /// Trusts the proxies in `network` (`"10.0.0.0/8"`, `"fd00::/8"`, or one address).
    pub fn trust(mut self, network: &str) -> Result<Self, BadNetwork> {
        let bad = || BadNetwork(network.to_owned());
        let (addr, bits) = match network.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (network, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let addr = addr.to_canonical();
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => width,
            Some(b) => b.trim().parse::<u8>().ok().filter(|&b| b <= width).ok_or_else(bad)?,
        };
        self.trusted.push((addr, bits));
        Ok(self)
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|&(net, bits)| in_network(ip, net, bits))
    }

    /// The client's address for `req`.
    pub fn client(&self, req: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_addr(req).ok_or(KeyError::NoPeerAddress)?.ip().to_canonical();
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => x_forwarded_for(&req.headers),
            ForwardedHeader::Forwarded => forwarded_for(req.headers.get_all(FORWARDED)),
        };
        let mut nearest = peer;
        for hop in hops.iter().rev() {
            match *hop {
                Hop::Addr(ip) if self.is_trusted(ip) => nearest = ip,
                Hop::Addr(ip) => return Ok(ip),
                Hop::Unknown => return Ok(nearest),
            }
        }
        Ok(nearest)
    }
}

impl<const V6: u8, const V4: u8> KeyExtractor for ClientIp<V6, V4> {
    type Key = IpPrefix<V6, V4>;
    fn extract(&self, req: &Parts) -> Result<IpPrefix<V6, V4>, KeyError> {
        self.client(req).map(IpPrefix::new)
    }
}

/// Whether `ip` is in `net/bits` (both canonical: IPv4-mapped IPv6 read as IPv4).
fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// A header's value as the key: an API key, a tenant id. A missing header is
/// [`KeyError::MissingHeader`] (refused, not let through), so put a limit keyed by the client's
/// address in front for anonymous requests, or use a closure to give them a shared key.
#[derive(Clone, Debug)]
pub struct HeaderKey(pub HeaderName);

impl KeyExtractor for HeaderKey {
    type Key = String;
    fn extract(&self, req: &Parts) -> Result<String, KeyError> {
        let value = req.headers.get(&self.0).ok_or_else(|| KeyError::MissingHeader(self.0.clone()))?;
        let value = value.to_str().ok().filter(|v| !v.is_empty());
        value.map(str::to_owned).ok_or_else(|| KeyError::MalformedHeader(self.0.clone()))
    }
}

/// The request's path as the key (without the query): a limit per endpoint.
#[derive(Clone, Copy, Debug, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    type Key = String;
    fn extract(&self, req: &Parts) -> Result<String, KeyError> {
        Ok(req.uri.path().to_owned())
    }
}

/// A route parameter by its place in the path, as the key, as text: `PathSegment(1)` keys
/// `/users/42/posts` by `42`. Segments are counted from 0 among the non-empty ones (so
/// `//users/42` and `/users//42` count as `/users/42`, as a server that collapses slashes
/// routes them), and the query is not part of the path. Percent-decoded, as routers decode
/// their parameters, so that `/users/%34%32` is the same client as `/users/42`. A path with
/// fewer segments is [`KeyError::MissingPathSegment`]; one whose segment is not UTF-8 once
/// decoded is [`KeyError::MalformedPathSegment`].
///
/// The key is the text: when the handler parses the parameter, equal values written
/// differently (`042`, `+42`) are different keys here. Key such a parameter by its parsed
/// value with [`PathParam`]. The index counts the segments of the path the layer sees: inside
/// `Router::nest`, after the prefix axum strips; mount the layer after any rewriting of the
/// path (dot segments are not resolved here). Around a router that also serves shorter paths,
/// apply the limit to its route only (`Limit::when`), or those paths get the key error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSegment(pub usize);

impl KeyExtractor for PathSegment {
    type Key = String;
    fn extract(&self, req: &Parts) -> Result<String, KeyError> {
        let segment = req.uri.path().split('/').filter(|s| !s.is_empty()).nth(self.0);
        let segment = segment.ok_or(KeyError::MissingPathSegment(self.0))?;
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8();
        decoded.map(std::borrow::Cow::into_owned).map_err(|_| KeyError::MalformedPathSegment(self.0))
    }
}

/// A route parameter by its place in the path, parsed as `T` (any [`tollgate::Key`] that
/// parses from a string: an integer, an address): `PathParam::<u64>::new(1)` keys
/// `/users/42`, `/users/042` and `/users/+42` alike, by the number 42, as a handler that
/// parses the parameter sees them. The segment is found and decoded as [`PathSegment`] finds
/// it; one that does not parse is [`KeyError::MalformedPathSegment`].
pub struct PathParam<T> {
    index: usize,
    key: PhantomData<fn() -> T>,
}

impl<T> PathParam<T> {
    /// The parameter at `index` (counted as [`PathSegment`] counts).
    pub const fn new(index: usize) -> PathParam<T> {
        PathParam { index, key: PhantomData }
    }
}

impl<T> Clone for PathParam<T> {
    fn clone(&self) -> PathParam<T> {
        *self
    }
}

impl<T> Copy for PathParam<T> {}

impl<T> fmt::Debug for PathParam<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PathParam").field(&self.index).field(&std::any::type_name::<T>()).finish()
    }
}

impl<T> KeyExtractor for PathParam<T>
where
    T: FromStr + tollgate::Key + Send + Sync + 'static,
{
    type Key = T;
    fn extract(&self, req: &Parts) -> Result<T, KeyError> {
        let text = PathSegment(self.index).extract(req)?;
        text.parse().map_err(|_| KeyError::MalformedPathSegment(self.index))
    }
}
