//! RESP2 requests, parsed incrementally with bounded memory, and replies.
//!
//! A request is a multibulk array of bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`, what
//! every client library sends) or an inline command (`PING hi\r\n`, what a person types into
//! a raw connection). Anything else is a protocol error that names what was wrong; the parser
//! then skips to the end of the offending line (or over the announced payload of an oversized
//! bulk string, without buffering it) and the connection goes on.

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

/// What the parser found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete request: its arguments.
    Request(Vec<Vec<u8>>),
    /// A malformed or oversized request, already skipped (or being skipped): the error to reply.
    Error(String),
    /// Not enough bytes yet.
    Incomplete,
}

/// An incremental parser: feed it the connection's buffer; it consumes whole requests.
#[derive(Debug, Default)]
pub struct Parser {
    limits: Limits,
    /// Bytes still to discard from an oversized bulk string (its payload and CRLF).
    skip: usize,
    /// Discarding up to the next LF (an overlong inline line, or a malformed header's line).
    skip_line: bool,
}

/// Where a line ends: the index of its `\n`, and its content without `\r\n`.
fn line(buf: &[u8], from: usize) -> Option<(usize, &[u8])> {
    let nl = buf[from..].iter().position(|&b| b == b'\n')? + from;
    let end = if nl > from && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((nl, &buf[from..end]))
}

fn number(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

impl Parser {
    /// A parser with these limits.
    pub fn new(limits: Limits) -> Parser {
        Parser { limits, skip: 0, skip_line: false }
    }

    /// The next request at the front of `buf`, consuming it.
    pub fn next(&mut self, buf: &mut BytesMut) -> Parsed {
        if self.skip > 0 {
            let n = self.skip.min(buf.len());
            buf.advance(n);
            self.skip -= n;
            if self.skip > 0 {
                return Parsed::Incomplete;
            }
        }
        if self.skip_line {
            match buf.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    buf.advance(nl + 1);
                    self.skip_line = false;
                }
                None => {
                    buf.clear();
                    return Parsed::Incomplete;
                }
            }
        }
        match buf.first() {
            None => Parsed::Incomplete,
            Some(b'*') => self.multibulk(buf),
            Some(_) => self.inline(buf),
        }
    }

    fn inline(&mut self, buf: &mut BytesMut) -> Parsed {
        let Some((nl, text)) = line(buf, 0) else {
            if buf.len() > self.limits.max_arg_bytes {
                buf.clear();
                self.skip_line = true;
                return Parsed::Error(format!(
                    "ERR Protocol error: inline request longer than {} bytes",
                    self.limits.max_arg_bytes
                ));
            }
            return Parsed::Incomplete;
        };
        let args: Vec<Vec<u8>> =
            text.split(|b| b.is_ascii_whitespace()).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
        buf.advance(nl + 1);
        if args.len() > self.limits.max_args {
            return Parsed::Error(format!(
                "ERR Protocol error: more than {} arguments",
                self.limits.max_args
            ));
        }
        if args.is_empty() {
            // An empty line: nothing to answer, as Redis does; look for the next request.
            return self.next(buf);
        }
        Parsed::Request(args)
    }

    fn multibulk(&mut self, buf: &mut BytesMut) -> Parsed {
        let Some((nl, header)) = line(buf, 1) else {
            return self.unterminated(buf);
        };
        let count = match number(header) {
            Some(n) if n <= 0 => {
                buf.advance(nl + 1);
                return self.next(buf); // `*0` and `*-1`: nothing, as Redis does
            }
            Some(n) if n as u64 <= self.limits.max_args as u64 => n as usize,
            Some(n) => {
                buf.advance(nl + 1);
                self.skip_line = false;
                return Parsed::Error(format!(
                    "ERR Protocol error: {n} arguments, more than the {} allowed",
                    self.limits.max_args
                ));
            }
            None => {
                let shown = String::from_utf8_lossy(&header[..header.len().min(32)]).into_owned();
                buf.advance(nl + 1);
                return Parsed::Error(format!("ERR Protocol error: invalid multibulk length {shown:?}"));
            }
        };
        // Walk the whole request before consuming any of it: it is taken all at once.
        let mut at = nl + 1;
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            match buf.get(at) {
                None => return Parsed::Incomplete,
                Some(b'$') => {}
                Some(&other) => {
                    let got = char::from(other);
                    buf.advance(at);
                    self.skip_line = true;
                    return Parsed::Error(format!("ERR Protocol error: expected '$', got {got:?}"));
                }
            }
            let Some((nl, len)) = line(buf, at + 1) else {
                return self.unterminated(buf);
            };
            let len = match number(len) {
                Some(n) if n >= 0 && n as u64 <= self.limits.max_arg_bytes as u64 => n as usize,
                Some(n) if n > 0 => {
                    // Oversized: refuse it, and skip its payload as it arrives, unbuffered,
                    // with the rest of the request (whose arguments cannot be trusted).
                    buf.advance(nl + 1);
                    self.skip = (n as usize).saturating_add(2);
                    let _ = self.next_discard(buf);
                    return Parsed::Error(format!(
                        "ERR Protocol error: a bulk string of {n} bytes, more than the {} allowed",
                        self.limits.max_arg_bytes
                    ));
                }
                _ => {
                    let shown = String::from_utf8_lossy(&len[..len.len().min(32)]).into_owned();
                    buf.advance(nl + 1);
                    return Parsed::Error(format!("ERR Protocol error: invalid bulk length {shown:?}"));
                }
            };
            let start = nl + 1;
            if buf.len() < start + len + 2 {
                return Parsed::Incomplete;
            }
            if &buf[start + len..start + len + 2] != b"\r\n" {
                buf.advance(start + len);
                self.skip_line = true;
                return Parsed::Error("ERR Protocol error: a bulk string not followed by CRLF".into());
            }
            args.push(buf[start..start + len].to_vec());
            at = start + len + 2;
        }
        buf.advance(at);
        Parsed::Request(args)
    }

    /// A header line with no end yet: wait for it. (The connection bounds what it buffers for
    /// one request; see `Limits::max_request_bytes`.)
    fn unterminated(&mut self, _buf: &mut BytesMut) -> Parsed {
        Parsed::Incomplete
    }

    /// Discards what is in `buf` of a pending skip.
    fn next_discard(&mut self, buf: &mut BytesMut) -> usize {
        let n = self.skip.min(buf.len());
        buf.advance(n);
        self.skip -= n;
        n
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
    fn malformed_requests_are_errors_and_the_next_request_parses() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let got = parse_all(
            b"*x\r\nPING\r\n*9\r\nPING\r\n*1\r\n$-5\r\nPING\r\n*1\r\n:3\r\nPING\r\n*1\r\n$2\r\nabcd\r\nPING\r\n",
            limits,
        );
        let errors = got.iter().filter(|p| matches!(p, Parsed::Error(_))).count();
        let pings = got.iter().filter(|p| **p == req(&["PING"])).count();
        assert_eq!((errors, pings), (5, 5), "{got:?}");
    }

    #[test]
    fn an_oversized_bulk_string_is_skipped_without_buffering_it() {
        let limits = Limits { max_args: 4, max_arg_bytes: 8, max_request_bytes: 64 };
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$1000000\r\n"[..]);
        assert!(matches!(p.next(&mut buf), Parsed::Error(e) if e.contains("1000000 bytes")));
        // The payload arrives in pieces; none of it is kept.
        for _ in 0..100 {
            buf.extend_from_slice(&[b'x'; 10_000]);
            assert_eq!(p.next(&mut buf), Parsed::Incomplete);
            assert!(buf.is_empty());
        }
        buf.extend_from_slice(b"\r\nPING\r\n");
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
