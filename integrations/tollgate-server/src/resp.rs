//! RESP2 requests, parsed incrementally with bounded memory, and replies.
//!
//! A request is a multibulk array of bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`, what
//! every client library sends) or an inline command (`PING hi\r\n`, what a person types into
//! a raw connection). The parser consumes each element as soon as it is complete (a request
//! that arrives a byte at a time is never walked twice) and never recurses.
//!
//! Errors, and what follows them:
//! - **recoverable**, the connection goes on: an inline line or an argument over the limit, a
//!   request with more arguments than allowed. The rest of the offending request is skipped as
//!   it arrives (its bulk strings' payloads without being buffered), so that nothing in it is
//!   ever run as a command and every request gets exactly one reply.
//! - **fatal**, the connection is closed after the error: a frame whose lengths cannot be read
//!   (`*x`, `$abc`, an element that is not a bulk string, a bulk string not followed by CRLF, a
//!   length line that does not end). There is then no way to find where the next request
//!   starts; Redis closes the connection too.

use bytes::{Buf, BytesMut};

/// Limits on what one request may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most arguments in one request.
    pub max_args: usize,
    /// The most bytes in one argument (and in an inline line). A longer bulk string is
    /// refused and skipped as it arrives; the connection goes on.
    pub max_arg_bytes: usize,
    /// The most bytes buffered for one request that is not complete yet. Beyond it the
    /// request is refused and the connection closed (as Redis does for a request too big).
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_args: 1024, max_arg_bytes: 64 * 1024, max_request_bytes: 1024 * 1024 }
    }
}

/// The longest `*<count>` or `$<len>` line: a sign, 19 digits, CRLF, and some slack.
const MAX_LENGTH_LINE: usize = 32;

/// What the parser found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete request: its arguments.
    Request(Vec<Vec<u8>>),
    /// A refused request, skipped (or being skipped): the error to reply; the connection goes on.
    Error(String),
    /// A frame that cannot be read: the error to reply before closing the connection.
    Fatal(String),
    /// Not enough bytes yet.
    Incomplete,
}

/// Where the parser is between calls.
#[derive(Debug, Default)]
enum State {
    /// At the start of a request.
    #[default]
    Start,
    /// Inside a multibulk request: the arguments so far, their bytes, and how many are still
    /// to come.
    Args { args: Vec<Vec<u8>>, size: usize, remaining: usize },
    /// Skipping the rest of a refused multibulk request: `bytes` of the current bulk string
    /// (payload and CRLF), then `elements` more bulk strings.
    Skip { bytes: usize, elements: usize },
    /// Discarding up to the next LF (the rest of an overlong inline line).
    SkipLine,
}

/// An incremental parser: feed it the connection's buffer; it consumes requests.
#[derive(Debug, Default)]
pub struct Parser {
    limits: Limits,
    state: State,
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
fn bulk_header(buf: &[u8]) -> Result<Option<(usize, i64)>, String> {
    match buf.first() {
        None => return Ok(None),
        Some(b'$') => {}
        Some(&other) => {
            return Err(format!("ERR Protocol error: expected '$', got {:?}", char::from(other)));
        }
    }
    let Some((nl, text)) = line(&buf[1..]) else {
        return if buf.len() > MAX_LENGTH_LINE {
            Err("ERR Protocol error: a bulk length line that does not end".into())
        } else {
            Ok(None)
        };
    };
    match number(text) {
        Some(len) if len >= 0 => Ok(Some((nl + 2, len))),
        _ => Err(format!("ERR Protocol error: invalid bulk length {:?}", shown(text))),
    }
}

impl Parser {
    /// A parser with these limits.
    pub fn new(limits: Limits) -> Parser {
        Parser { limits, state: State::Start }
    }

    /// The next request at the front of `buf`, consuming what it reads. After `Fatal` the
    /// parser must not be used again.
    pub fn next(&mut self, buf: &mut BytesMut) -> Parsed {
        loop {
            match std::mem::take(&mut self.state) {
                State::Start => match buf.first() {
                    None => return Parsed::Incomplete,
                    Some(b'*') => match self.header(buf) {
                        Some(done) => return done,
                        None => continue,
                    },
                    Some(_) => match self.inline(buf) {
                        Some(done) => return done,
                        None => continue,
                    },
                },
                State::SkipLine => match buf.iter().position(|&b| b == b'\n') {
                    Some(nl) => buf.advance(nl + 1),
                    None => {
                        buf.clear();
                        self.state = State::SkipLine;
                        return Parsed::Incomplete;
                    }
                },
                State::Skip { bytes, elements } => {
                    let n = bytes.min(buf.len());
                    buf.advance(n);
                    if n < bytes {
                        self.state = State::Skip { bytes: bytes - n, elements };
                        return Parsed::Incomplete;
                    }
                    if elements > 0 {
                        match bulk_header(buf) {
                            Ok(None) => {
                                self.state = State::Skip { bytes: 0, elements };
                                return Parsed::Incomplete;
                            }
                            Ok(Some((header, len))) => {
                                buf.advance(header);
                                let bytes = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(2);
                                self.state = State::Skip { bytes, elements: elements - 1 };
                            }
                            Err(e) => return Parsed::Fatal(e),
                        }
                    }
                }
                State::Args { mut args, size, remaining } => {
                    let (header, len) = match bulk_header(buf) {
                        Ok(Some(h)) => h,
                        Ok(None) => {
                            self.state = State::Args { args, size, remaining };
                            return Parsed::Incomplete;
                        }
                        Err(e) => return Parsed::Fatal(e),
                    };
                    let len = usize::try_from(len).unwrap_or(usize::MAX);
                    if len > self.limits.max_arg_bytes {
                        // Refused: skip this payload and the elements after it, unbuffered.
                        buf.advance(header);
                        self.state = State::Skip { bytes: len.saturating_add(2), elements: remaining - 1 };
                        return Parsed::Error(format!(
                            "ERR Protocol error: a bulk string of {len} bytes, more than the {} allowed",
                            self.limits.max_arg_bytes
                        ));
                    }
                    let size = size.saturating_add(len);
                    if size > self.limits.max_request_bytes {
                        return Parsed::Fatal(format!(
                            "ERR Protocol error: a request over {} bytes",
                            self.limits.max_request_bytes
                        ));
                    }
                    if buf.len() < header + len + 2 {
                        self.state = State::Args { args, size: size - len, remaining };
                        return Parsed::Incomplete;
                    }
                    if &buf[header + len..header + len + 2] != b"\r\n" {
                        return Parsed::Fatal(
                            "ERR Protocol error: a bulk string not followed by CRLF".into(),
                        );
                    }
                    args.push(buf[header..header + len].to_vec());
                    buf.advance(header + len + 2);
                    if remaining == 1 {
                        return Parsed::Request(args);
                    }
                    self.state = State::Args { args, size, remaining: remaining - 1 };
                }
            }
        }
    }

    /// A `*<count>` line: the state it leads to, or what to return.
    fn header(&mut self, buf: &mut BytesMut) -> Option<Parsed> {
        let Some((nl, text)) = line(&buf[1..]) else {
            if buf.len() > MAX_LENGTH_LINE {
                return Some(Parsed::Fatal(
                    "ERR Protocol error: a multibulk length line that does not end".into(),
                ));
            }
            return Some(Parsed::Incomplete);
        };
        let count = number(text);
        let text = shown(text);
        buf.advance(nl + 2);
        match count {
            // `*0` and `*-1`: no request, and no reply, as Redis does.
            Some(n) if n <= 0 => None,
            Some(n) if n as u64 <= self.limits.max_args as u64 => {
                #[allow(clippy::cast_possible_truncation, reason = "at most max_args")]
                let remaining = n as usize;
                self.state = State::Args { args: Vec::with_capacity(remaining.min(16)), size: 0, remaining };
                None
            }
            Some(n) => {
                self.state = State::Skip { bytes: 0, elements: usize::try_from(n).unwrap_or(usize::MAX) };
                Some(Parsed::Error(format!(
                    "ERR Protocol error: {n} arguments, more than the {} allowed",
                    self.limits.max_args
                )))
            }
            None => Some(Parsed::Fatal(format!("ERR Protocol error: invalid multibulk length {text:?}"))),
        }
    }

    /// An inline line: the request, an error, or `None` for an empty line (no reply).
    fn inline(&mut self, buf: &mut BytesMut) -> Option<Parsed> {
        let too_long =
            || format!("ERR Protocol error: inline request longer than {} bytes", self.limits.max_arg_bytes);
        let Some((nl, text)) = line(buf) else {
            if buf.len() > self.limits.max_arg_bytes {
                buf.clear();
                self.state = State::SkipLine;
                return Some(Parsed::Error(too_long()));
            }
            return Some(Parsed::Incomplete);
        };
        if text.len() > self.limits.max_arg_bytes {
            buf.advance(nl + 1);
            return Some(Parsed::Error(too_long()));
        }
        let args: Vec<Vec<u8>> =
            text.split(u8::is_ascii_whitespace).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
        buf.advance(nl + 1);
        if args.len() > self.limits.max_args {
            return Some(Parsed::Error(format!(
                "ERR Protocol error: more than {} arguments",
                self.limits.max_args
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

    #[test]
    fn refused_requests_are_skipped_whole_and_the_next_request_parses() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        // Too many arguments (each skipped, QUIT included: never run); an oversized argument
        // followed by more of the same request; an overlong inline line.
        let got = parse_all(
            b"*5\r\n$4\r\nQUIT\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\nPING\r\n\
              *3\r\n$4\r\nECHO\r\n$20\r\n01234567890123456789\r\n$4\r\nQUIT\r\nPING\r\n\
              ECHO 0123456789abcdef\r\nPING\r\n",
            limits,
        );
        assert_eq!(got.len(), 6, "{got:?}");
        assert!(matches!(&got[0], Parsed::Error(e) if e.contains("5 arguments")));
        assert!(matches!(&got[2], Parsed::Error(e) if e.contains("20 bytes")));
        assert!(matches!(&got[4], Parsed::Error(e) if e.contains("inline")));
        for i in [1, 3, 5] {
            assert_eq!(got[i], req(&["PING"]));
        }
    }

    #[test]
    fn unreadable_frames_are_fatal() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        for input in [
            &b"*x\r\n"[..],
            b"*1\r\n:3\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$2\r\nabcd\r\n",
            b"*1\r\n$111111111111111111111111111111111111",
            b"*11111111111111111111111111111111111111",
        ] {
            let got = parse_all(input, limits);
            assert!(matches!(got.last(), Some(Parsed::Fatal(_))), "{input:?}: {got:?}");
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
    fn an_oversized_bulk_string_is_skipped_without_buffering_it() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(&b"*3\r\n$3\r\nSET\r\n$1000000\r\n"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Error(e) if e.contains("1000000 bytes")));
        // The payload arrives in pieces; none of it is kept.
        for _ in 0..100 {
            buf.extend_from_slice(&[b'x'; 10_000]);
            assert_eq!(p.next(&mut buf), Parsed::Incomplete);
            assert!(buf.is_empty());
        }
        // The request's third element is skipped too, then the next request parses.
        buf.extend_from_slice(b"\r\n$4\r\nQUIT\r\nPING\r\n");
        assert_eq!(p.next(&mut buf), req(&["PING"]));
    }

    #[test]
    fn an_endless_inline_line_is_refused() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(&b"AAAAAAAAAAAAAAAA"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Error(_)));
        buf.extend_from_slice(b"AAAA\r\nPING\r\n");
        assert_eq!(p.next(&mut buf), req(&["PING"]));
    }
}
