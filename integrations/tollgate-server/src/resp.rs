//! RESP2 requests, parsed incrementally with bounded memory, and replies.
//!
//! A request is a multibulk array of bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`, what
//! every client library sends) or an inline command (`PING hi\r\n`, what a person types into
//! a raw connection). The parser consumes each element as soon as it is complete (a request
//! that arrives a byte at a time is never walked twice) and never recurses.
//!
//! # As Redis reads requests
//!
//! Checked against a real `redis-server` (`tests/server.rs`, `frames_are_answered_as_redis_answers_them`):
//! - `*0` and `*-1` are no request: no reply, and the connection goes on. An empty inline line
//!   is none either.
//! - an inline line is split at whitespace, whatever its first byte: `$-1` typed as a line is
//!   a command named `$-1` (unknown), as in Redis.
//! - a frame whose lengths cannot be read (`*x`, `$abc`, `$-1` inside an array, an element
//!   that is not a bulk string, a bulk string not followed by CRLF, a length line that does
//!   not end) is **fatal**: the error is replied and the connection closed, since there is no
//!   way to find where the next request starts.
//! - a request over a limit is fatal too, as in Redis (whose limits are 512 MB a bulk string
//!   and 1,048,576 arguments, and, before a client authenticates, 16 KiB and 10 arguments):
//!   an argument over [`Limits::max_arg_bytes`] (refused at its `$` line, before any of it is
//!   buffered), more arguments than [`Limits::max_args`], an inline line over
//!   `max_arg_bytes`, a request over [`Limits::max_request_bytes`]. The connection is not
//!   kept waiting for the rest of a payload it will never use.
//! - until the connection authenticates (where the server requires it), the limits are
//!   Redis's for unauthenticated clients: 10 arguments and 16 KiB an argument
//!   ([`Parser::set_authenticated`]).

use bytes::{Buf, BytesMut};

/// Limits on what one request may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most arguments in one request.
    pub max_args: usize,
    /// The most bytes in one argument (and in an inline line).
    pub max_arg_bytes: usize,
    /// The most bytes buffered for one request that is not complete yet.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_args: 1024, max_arg_bytes: 64 * 1024, max_request_bytes: 1024 * 1024 }
    }
}

/// What a client may send before it authenticates: Redis's limits for unauthenticated
/// clients (10 arguments, 16 KiB an argument), or the configured ones where lower.
const UNAUTHENTICATED: Limits =
    Limits { max_args: 10, max_arg_bytes: 16 * 1024, max_request_bytes: 10 * 16 * 1024 };

/// The longest `*<count>` or `$<len>` line: a sign, 19 digits, CRLF, and some slack.
const MAX_LENGTH_LINE: usize = 32;

/// What the parser found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete request: its arguments.
    Request(Vec<Vec<u8>>),
    /// A frame that cannot be read, or a request over a limit: the error to reply before
    /// closing the connection.
    Fatal(String),
    /// Not enough bytes yet.
    Incomplete,
}

/// Inside a multibulk request: the arguments so far, their bytes, and how many are still to
/// come.
#[derive(Debug)]
struct Partial {
    args: Vec<Vec<u8>>,
    size: usize,
    remaining: usize,
}

/// An incremental parser: feed it the connection's buffer; it consumes requests.
#[derive(Debug)]
pub struct Parser {
    /// The limits configured.
    configured: Limits,
    /// The limits in force: the configured ones, or lower ones before authentication.
    limits: Limits,
    partial: Option<Partial>,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser::new(Limits::default())
    }
}

/// Where a line ends: the index of its `\n`, and its content without `\r\n`.
fn line(buf: &[u8]) -> Option<(usize, &[u8])> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let end = if nl > 0 && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((nl, &buf[..end]))
}

fn number(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(32)]).into_owned()
}

/// A bulk string's header (`$<len>`) at the front of `buf`: `Ok(Some((header bytes, len)))`,
/// `Ok(None)` while incomplete, `Err` when it cannot be read.
fn bulk_header(buf: &[u8]) -> Result<Option<(usize, usize)>, String> {
    match buf.first() {
        None => return Ok(None),
        Some(b'$') => {}
        Some(&other) => {
            return Err(format!("ERR Protocol error: expected '$', got {:?}", char::from(other)));
        }
    }
    let Some((nl, text)) = line(&buf[1..]) else {
        return if buf.len() > MAX_LENGTH_LINE {
            Err(format!(
                "ERR Protocol error: a bulk length line that does not end within {MAX_LENGTH_LINE} bytes"
            ))
        } else {
            Ok(None)
        };
    };
    // As long a line is refused whole as it is in pieces (above), however it arrives.
    if nl + 1 > MAX_LENGTH_LINE {
        return Err(format!(
            "ERR Protocol error: a bulk length line that does not end within {MAX_LENGTH_LINE} bytes"
        ));
    }
    match number(text).map(usize::try_from) {
        Some(Ok(len)) => Ok(Some((nl + 2, len))),
        _ => Err(format!("ERR Protocol error: invalid bulk length {:?}", shown(text))),
    }
}

impl Parser {
    /// A parser with these limits, for a client that needs no authentication.
    pub fn new(limits: Limits) -> Parser {
        Parser { configured: limits, limits, partial: None }
    }

    /// Whether the client has authenticated: until it has, the limits in force are the lower
    /// of the configured ones and Redis's for unauthenticated clients (10 arguments, 16 KiB an
    /// argument). A parser starts authenticated; the server sets it to `false` on a
    /// connection that must authenticate, and back once it has.
    pub fn set_authenticated(&mut self, yes: bool) {
        let c = self.configured;
        self.limits = if yes {
            c
        } else {
            Limits {
                max_args: c.max_args.min(UNAUTHENTICATED.max_args),
                max_arg_bytes: c.max_arg_bytes.min(UNAUTHENTICATED.max_arg_bytes),
                max_request_bytes: c.max_request_bytes.min(UNAUTHENTICATED.max_request_bytes),
            }
        };
    }

    /// The next request at the front of `buf`, consuming what it reads. After `Fatal` the
    /// parser must not be used again.
    pub fn next(&mut self, buf: &mut BytesMut) -> Parsed {
        loop {
            let Some(mut partial) = self.partial.take() else {
                match buf.first() {
                    None => return Parsed::Incomplete,
                    Some(b'*') => match self.header(buf) {
                        Some(done) => return done,
                        None => continue,
                    },
                    Some(_) => match self.inline(buf) {
                        Some(done) => return done,
                        None => continue,
                    },
                }
            };
            let (header, len) = match bulk_header(buf) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    self.partial = Some(partial);
                    return Parsed::Incomplete;
                }
                Err(e) => return Parsed::Fatal(e),
            };
            if len > self.limits.max_arg_bytes {
                return Parsed::Fatal(format!(
                    "ERR Protocol error: invalid bulk length: {len} bytes, more than the {} allowed{}",
                    self.limits.max_arg_bytes,
                    self.before_auth()
                ));
            }
            let size = partial.size.saturating_add(len);
            if size > self.limits.max_request_bytes {
                return Parsed::Fatal(format!(
                    "ERR Protocol error: a request over {} bytes{}",
                    self.limits.max_request_bytes,
                    self.before_auth()
                ));
            }
            if buf.len() < header + len + 2 {
                self.partial = Some(partial);
                return Parsed::Incomplete;
            }
            if &buf[header + len..header + len + 2] != b"\r\n" {
                return Parsed::Fatal("ERR Protocol error: a bulk string not followed by CRLF".into());
            }
            partial.args.push(buf[header..header + len].to_vec());
            partial.size = size;
            buf.advance(header + len + 2);
            partial.remaining -= 1;
            if partial.remaining == 0 {
                return Parsed::Request(partial.args);
            }
            self.partial = Some(partial);
        }
    }

    /// Said after a limit's error while the lower limits of an unauthenticated client apply.
    fn before_auth(&self) -> &'static str {
        if self.limits.max_args < self.configured.max_args
            || self.limits.max_arg_bytes < self.configured.max_arg_bytes
        {
            " before authentication"
        } else {
            ""
        }
    }

    /// A `*<count>` line: `None` once it is consumed (and a request begun, or none for `*0`
    /// and `*-1`), or what to return.
    fn header(&mut self, buf: &mut BytesMut) -> Option<Parsed> {
        let too_long = || {
            Some(Parsed::Fatal(format!(
                "ERR Protocol error: a multibulk length line that does not end within {MAX_LENGTH_LINE} bytes"
            )))
        };
        let Some((nl, text)) = line(&buf[1..]) else {
            return if buf.len() > MAX_LENGTH_LINE { too_long() } else { Some(Parsed::Incomplete) };
        };
        // As long a line is refused whole as it is in pieces (above), however it arrives.
        if nl + 1 > MAX_LENGTH_LINE {
            return too_long();
        }
        let count = number(text);
        let text = shown(text);
        buf.advance(nl + 2);
        match count {
            // `*0` and `*-1`: no request, and no reply, as Redis does.
            Some(n) if n <= 0 => None,
            Some(n) if n as u64 <= self.limits.max_args as u64 => {
                #[allow(clippy::cast_possible_truncation, reason = "at most max_args")]
                let remaining = n as usize;
                self.partial =
                    Some(Partial { args: Vec::with_capacity(remaining.min(16)), size: 0, remaining });
                None
            }
            Some(n) => Some(Parsed::Fatal(format!(
                "ERR Protocol error: invalid multibulk length: {n} arguments, more than the {} allowed{}",
                self.limits.max_args,
                self.before_auth()
            ))),
            None => Some(Parsed::Fatal(format!("ERR Protocol error: invalid multibulk length {text:?}"))),
        }
    }

    /// An inline line: the request, an error, or `None` for an empty line (no reply).
    fn inline(&mut self, buf: &mut BytesMut) -> Option<Parsed> {
        let too_long = || {
            Parsed::Fatal(format!(
                "ERR Protocol error: too big inline request: more than {} bytes{}",
                self.limits.max_arg_bytes,
                self.before_auth()
            ))
        };
        let Some((nl, text)) = line(buf) else {
            // Room for the line's CR: a line of `max_arg_bytes` must not be refused while its
            // LF is still on the way.
            return Some(if buf.len() > self.limits.max_arg_bytes + 1 {
                too_long()
            } else {
                Parsed::Incomplete
            });
        };
        if text.len() > self.limits.max_arg_bytes {
            return Some(too_long());
        }
        let args: Vec<Vec<u8>> =
            text.split(u8::is_ascii_whitespace).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
        buf.advance(nl + 1);
        if args.len() > self.limits.max_args {
            return Some(Parsed::Fatal(format!(
                "ERR Protocol error: an inline request of {} arguments, more than the {} allowed{}",
                args.len(),
                self.limits.max_args,
                self.before_auth()
            )));
        }
        (!args.is_empty()).then_some(Parsed::Request(args))
    }
}

/// Appends RESP2 replies to an output buffer.
pub mod reply {
    use bytes::{BufMut, BytesMut};

    pub fn simple(out: &mut BytesMut, s: &str) {
        out.put_u8(b'+');
        out.put_slice(s.as_bytes());
        out.put_slice(b"\r\n");
    }

    /// An error; `-` and CRLF are added, and CR/LF in `msg` become spaces.
    pub fn error(out: &mut BytesMut, msg: &str) {
        out.put_u8(b'-');
        for b in msg.bytes() {
            out.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        out.put_slice(b"\r\n");
    }

    pub fn integer(out: &mut BytesMut, n: i64) {
        out.put_u8(b':');
        out.put_slice(itoa::Buffer::new().format(n).as_bytes());
        out.put_slice(b"\r\n");
    }

    pub fn bulk(out: &mut BytesMut, data: &[u8]) {
        out.put_u8(b'$');
        out.put_slice(itoa::Buffer::new().format(data.len()).as_bytes());
        out.put_slice(b"\r\n");
        out.put_slice(data);
        out.put_slice(b"\r\n");
    }

    pub fn array(out: &mut BytesMut, len: usize) {
        out.put_u8(b'*');
        out.put_slice(itoa::Buffer::new().format(len).as_bytes());
        out.put_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8], limits: Limits) -> Vec<Parsed> {
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match p.next(&mut buf) {
                Parsed::Incomplete => return out,
                x @ Parsed::Fatal(_) => {
                    out.push(x);
                    return out;
                }
                x => out.push(x),
            }
        }
    }

    fn req(args: &[&str]) -> Parsed {
        Parsed::Request(args.iter().map(|a| a.as_bytes().to_vec()).collect())
    }

    fn fatal(got: &[Parsed], says: &str) -> bool {
        matches!(got.last(), Some(Parsed::Fatal(e)) if e.contains(says))
    }

    #[test]
    fn requests_in_both_forms_and_pipelined() {
        let got = parse_all(
            b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\nPING  there\r\n\r\n*1\r\n$4\r\nQUIT\r\n",
            Limits::default(),
        );
        assert_eq!(got, vec![req(&["PING", "hi"]), req(&["PING", "there"]), req(&["QUIT"])]);
    }

    #[test]
    fn a_request_split_anywhere_parses_the_same() {
        let input = b"*3\r\n$11\r\nCL.THROTTLE\r\n$3\r\nk\0y\r\n$2\r\n15\r\n";
        for cut in 0..input.len() {
            let mut p = Parser::default();
            let mut buf = BytesMut::from(&input[..cut]);
            assert_eq!(p.next(&mut buf), Parsed::Incomplete, "cut at {cut}");
            buf.extend_from_slice(&input[cut..]);
            assert_eq!(p.next(&mut buf), req(&["CL.THROTTLE", "k\0y", "15"]));
            assert!(buf.is_empty());
        }
    }

    /// Issue 34: a request over a limit was refused and skipped, the connection kept waiting
    /// for the rest of it (up to 999,999,999 bytes); Redis closes the connection.
    #[test]
    fn requests_over_a_limit_are_fatal() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 20 };
        let got = parse_all(b"PING\r\n*5\r\n$4\r\nQUIT\r\n", limits);
        assert_eq!(got[0], req(&["PING"]));
        assert!(fatal(&got, "invalid multibulk length: 5 arguments, more than the 4 allowed"), "{got:?}");
        let got = parse_all(b"*2\r\n$4\r\nECHO\r\n$999999999\r\n", limits);
        assert!(fatal(&got, "invalid bulk length: 999999999 bytes, more than the 8 allowed"), "{got:?}");
        let got = parse_all(b"ECHO 0123456789abcdef\r\n", limits);
        assert!(fatal(&got, "too big inline request"), "{got:?}");
        let got = parse_all(b"A B C D E\r\n", Limits { max_arg_bytes: 16, ..limits });
        assert!(fatal(&got, "inline request of 5 arguments"), "{got:?}");
        let got = parse_all(b"*3\r\n$8\r\n01234567\r\n$8\r\n01234567\r\n$8\r\n0123", limits);
        assert!(fatal(&got, "a request over 20 bytes"), "{got:?}");
    }

    #[test]
    fn an_oversized_bulk_string_is_refused_before_any_of_it_arrives() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(&b"*3\r\n$3\r\nSET\r\n$1000000\r\n"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Fatal(e) if e.contains("1000000 bytes")));
    }

    #[test]
    fn an_endless_inline_line_is_refused() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(&b"AAAAAAAAAAAAAAAA"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Fatal(e) if e.contains("inline")));
    }

    #[test]
    fn unreadable_frames_are_fatal() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        for input in [
            &b"*x\r\n"[..],
            b"*1\r\n:3\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$2\r\nabcd\r\n",
            b"*1\r\n$111111111111111111111111111111111111",
            b"*11111111111111111111111111111111111111",
        ] {
            let got = parse_all(input, limits);
            assert!(matches!(got.last(), Some(Parsed::Fatal(_))), "{input:?}: {got:?}");
        }
    }

    /// `*0`, `*-1` and empty lines are no request and get no reply; `$-1` typed as a line is a
    /// command of that name: as Redis reads them (`tests/server.rs` compares with Redis).
    #[test]
    fn empty_arrays_and_lines_are_no_request_and_a_dollar_line_is_a_command() {
        let got = parse_all(b"*0\r\n*-1\r\n\r\n$-1\r\nPING\r\n", Limits::default());
        assert_eq!(got, vec![req(&["$-1"]), req(&["PING"])]);
    }

    /// Found by the `resp_frames` fuzz target: a line refused in pieces (still open past its
    /// bound) was accepted whole. Both ways now agree, wherever the input is cut.
    #[test]
    fn a_request_is_read_alike_whole_and_in_pieces() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let long_count = format!("*{}1\r\n$4\r\nPING\r\n", "0".repeat(40));
        let long_len = format!("*1\r\n${}4\r\nPING\r\n", "0".repeat(40));
        for input in
            [&b"xxxxxxxx\r\nPING\r\n"[..], b"xxxxxxxxx\r\n", long_count.as_bytes(), long_len.as_bytes()]
        {
            let whole = parse_all(input, limits);
            for cut in 0..input.len() {
                let mut p = Parser::new(limits);
                let mut buf = BytesMut::from(&input[..cut]);
                let mut got = Vec::new();
                let mut fed = false;
                loop {
                    match p.next(&mut buf) {
                        Parsed::Incomplete if !fed => {
                            buf.extend_from_slice(&input[cut..]);
                            fed = true;
                        }
                        Parsed::Incomplete => break,
                        x @ Parsed::Fatal(_) => {
                            got.push(x);
                            break;
                        }
                        x => got.push(x),
                    }
                }
                assert_eq!(got, whole, "{:?} cut at {cut}", String::from_utf8_lossy(input));
            }
        }
    }

    #[test]
    fn a_million_empty_lines_and_empty_arrays_neither_recurse_nor_reply() {
        let mut input = b"\n".repeat(1_000_000);
        input.extend_from_slice(&b"*0\r\n".repeat(200_000));
        input.extend_from_slice(b"PING\r\n");
        assert_eq!(parse_all(&input, Limits::default()), vec![req(&["PING"])]);
    }

    #[test]
    fn before_authentication_the_limits_are_redis_s_for_unauthenticated_clients() {
        let mut p = Parser::default();
        p.set_authenticated(false);
        let mut buf = BytesMut::from(&b"*11\r\n"[..]);
        assert!(
            matches!(p.next(&mut buf), Parsed::Fatal(e) if e.contains("11 arguments, more than the 10 allowed before authentication"))
        );
        let mut p = Parser::default();
        p.set_authenticated(false);
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nAUTH\r\n$16385\r\n"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Fatal(e) if e.contains("16385 bytes")));
        // Authenticated, the configured limits apply again.
        let mut p = Parser::default();
        p.set_authenticated(false);
        p.set_authenticated(true);
        let mut buf = BytesMut::from(&b"*11\r\n"[..]);
        assert_eq!(p.next(&mut buf), Parsed::Incomplete);
    }
}
