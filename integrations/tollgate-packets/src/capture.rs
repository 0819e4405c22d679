//! Captures in and out, pcap and pcapng (the `pcap-file` crate's parsers), read in a buffer
//! that counts its offset, so that a capture that cannot be read is an error saying where.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapParser, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgParser, PcapNgWriter};
use pcap_file::{DataLink, PcapError};

/// The largest record the reader takes: 64 MiB (a length field beyond it is corrupt).
const MAX_RECORD: usize = 64 << 20;

/// Why a capture could not be read or written.
#[derive(Debug)]
pub enum CaptureError {
    /// Reading or writing failed.
    Io {
        /// The capture's byte offset where it failed.
        offset: u64,
        /// The I/O error.
        source: io::Error,
    },
    /// The bytes at `offset` are not a capture's.
    Format {
        /// The capture's byte offset of the record that does not read.
        offset: u64,
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Io { offset, source } => write!(f, "at byte {offset} of the capture: {source}"),
            CaptureError::Format { offset, what } => write!(f, "at byte {offset} of the capture: {what}"),
        }
    }
}

impl std::error::Error for CaptureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CaptureError::Io { source, .. } => Some(source),
            CaptureError::Format { .. } => None,
        }
    }
}

/// A capture's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// libpcap's.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// A captured frame.
#[derive(Clone, Debug)]
pub struct Frame {
    /// When it was captured, since the Unix epoch.
    pub timestamp: Duration,
    /// Its link type.
    pub link: DataLink,
    /// Its length on the wire (`data` may hold fewer bytes: the capture's snap length).
    pub orig_len: u32,
    /// The bytes captured.
    pub data: Vec<u8>,
    /// Its interface (pcapng; 0 in a pcap).
    pub interface: u32,
    /// Where its record starts in the capture.
    pub offset: u64,
}

impl Frame {
    /// Whether the capture kept fewer bytes than the wire carried.
    pub fn is_cut(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

/// What a capture holds, record by record.
#[derive(Clone, Debug)]
pub enum Record {
    /// A frame.
    Frame(Frame),
    /// A pcapng interface (the frames after it may name it).
    Interface(InterfaceDescriptionBlock<'static>),
}

enum Parser {
    Pcap(PcapParser),
    PcapNg(PcapNgParser),
}

/// Reads a pcap or a pcapng capture (told apart by its first bytes).
pub struct CaptureReader<R> {
    reader: R,
    buf: Vec<u8>,
    /// The unread bytes are `buf[pos..]`, starting at the capture's byte `offset`.
    pos: usize,
    offset: u64,
    eof: bool,
    parser: Parser,
    header: Option<PcapHeader>,
    /// The last frame's time (a pcapng simple packet block has none of its own).
    last_timestamp: Duration,
}

impl<R> fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureReader").field("format", &self.format()).field("offset", &self.offset).finish()
    }
}

impl<R> CaptureReader<R> {
    /// The capture's format.
    pub fn format(&self) -> Format {
        match self.parser {
            Parser::Pcap(_) => Format::Pcap,
            Parser::PcapNg(_) => Format::PcapNg,
        }
    }

    /// A pcap's header (`None` for pcapng).
    pub fn pcap_header(&self) -> Option<PcapHeader> {
        self.header
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the capture's header.
    pub fn new(reader: R) -> Result<CaptureReader<R>, CaptureError> {
        let mut r = CaptureReader {
            reader,
            buf: Vec::with_capacity(1 << 16),
            pos: 0,
            offset: 0,
            eof: false,
            parser: Parser::Pcap(PcapParser::new(&PCAP_STUB).expect("a valid stub").1),
            header: None,
            last_timestamp: Duration::ZERO,
        };
        r.fill(4)?;
        let magic = r.buf.get(..4).map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
        let pcapng = match magic {
            Some(0x0a0d_0d0a) => true,
            Some(0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1) => false,
            Some(m) => {
                return Err(CaptureError::Format {
                    offset: 0,
                    what: format!("magic number {m:#010x}: not a pcap or pcapng capture"),
                })
            }
            None => return Err(CaptureError::Format { offset: 0, what: "empty: not a capture".to_owned() }),
        };
        loop {
            let avail = &r.buf[r.pos..];
            let parsed = if pcapng {
                PcapNgParser::new(avail).map(|(rest, p)| (avail.len() - rest.len(), Parser::PcapNg(p), None))
            } else {
                PcapParser::new(avail).map(|(rest, p)| {
                    let header = p.header();
                    (avail.len() - rest.len(), Parser::Pcap(p), Some(header))
                })
            };
            match parsed {
                Ok((used, parser, header)) => {
                    r.pos += used;
                    r.offset += used as u64;
                    r.parser = parser;
                    r.header = header;
                    return Ok(r);
                }
                Err(PcapError::IncompleteBuffer) if !r.eof => r.fill(r.buf.len() - r.pos + 1)?,
                Err(e) => return Err(r.format_error(e)),
            }
        }
    }

    /// The next record: `None` at the capture's end.
    pub fn next_record(&mut self) -> Option<Result<Record, CaptureError>> {
        loop {
            if self.pos == self.buf.len() {
                if self.eof {
                    return None;
                }
                if let Err(e) = self.fill(1) {
                    return Some(Err(e));
                }
                if self.pos == self.buf.len() {
                    return None;
                }
            }
            let offset = self.offset;
            let avail = &self.buf[self.pos..];
            let last_timestamp = &mut self.last_timestamp;
            let parsed = match &mut self.parser {
                // Raw: pcap-file's own packets refuse a frame longer on the wire than the
                // snap length, which is what a capture cut by its snap length holds.
                Parser::Pcap(p) => p.next_raw_packet(avail).map(|(rest, packet)| {
                    let header = p.header();
                    let frac = match header.ts_resolution {
                        pcap_file::TsResolution::MicroSecond => u64::from(packet.ts_frac) * 1_000,
                        pcap_file::TsResolution::NanoSecond => u64::from(packet.ts_frac),
                    };
                    let frame = Frame {
                        timestamp: Duration::from_secs(u64::from(packet.ts_sec)) + Duration::from_nanos(frac),
                        link: header.datalink,
                        orig_len: packet.orig_len,
                        data: packet.data.into_owned(),
                        interface: 0,
                        offset,
                    };
                    (avail.len() - rest.len(), Some(Record::Frame(frame)))
                }),
                Parser::PcapNg(p) => p.next_block(avail).map(|(rest, block)| {
                    let used = avail.len() - rest.len();
                    let record = match block {
                        Block::EnhancedPacket(epb) => {
                            let interface = p.packet_interface(&epb);
                            let link = interface.map_or(DataLink::Unknown(u32::MAX), |i| i.linktype);
                            let timestamp = in_time(epb.timestamp, interface);
                            *last_timestamp = timestamp;
                            Some(Record::Frame(Frame {
                                timestamp,
                                link,
                                orig_len: epb.original_len,
                                data: epb.data.into_owned(),
                                interface: epb.interface_id,
                                offset,
                            }))
                        }
                        Block::SimplePacket(spb) => {
                            let link =
                                p.interfaces().first().map_or(DataLink::Unknown(u32::MAX), |i| i.linktype);
                            // A simple packet has no time of its own: the last packet's.
                            Some(Record::Frame(Frame {
                                timestamp: *last_timestamp,
                                link,
                                orig_len: spb.original_len,
                                data: spb.data.into_owned(),
                                interface: 0,
                                offset,
                            }))
                        }
                        Block::InterfaceDescription(idb) => Some(Record::Interface(idb.into_owned())),
                        _ => None,
                    };
                    (used, record)
                }),
            };
            match parsed {
                Ok((used, record)) => {
                    self.pos += used;
                    self.offset += used as u64;
                    if let Some(record) = record {
                        return Some(Ok(record));
                    }
                }
                Err(PcapError::IncompleteBuffer) => {
                    let have = self.buf.len() - self.pos;
                    if self.eof {
                        return Some(Err(CaptureError::Format {
                            offset,
                            what: format!("the capture ends inside a record ({have} bytes of it)"),
                        }));
                    }
                    if let Err(e) = self.fill(have + 1) {
                        return Some(Err(e));
                    }
                }
                Err(e) => return Some(Err(self.format_error(e))),
            }
        }
    }

    fn format_error(&self, e: PcapError) -> CaptureError {
        match e {
            PcapError::IoError(source) => CaptureError::Io { offset: self.offset, source },
            other => CaptureError::Format { offset: self.offset, what: other.to_string() },
        }
    }

    /// Reads until at least `want` unread bytes are buffered, or the capture ends.
    fn fill(&mut self, want: usize) -> Result<(), CaptureError> {
        if want > MAX_RECORD {
            return Err(CaptureError::Format {
                offset: self.offset,
                what: format!("a record of more than {MAX_RECORD} bytes: its length field is corrupt"),
            });
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        while self.buf.len() < want && !self.eof {
            let len = self.buf.len();
            let grow = (want - len).max(1 << 16);
            self.buf.resize(len + grow, 0);
            match self.reader.read(&mut self.buf[len..]) {
                Ok(0) => {
                    self.buf.truncate(len);
                    self.eof = true;
                }
                Ok(n) => self.buf.truncate(len + n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => self.buf.truncate(len),
                Err(source) => {
                    self.buf.truncate(len);
                    return Err(CaptureError::Io { offset: self.offset + len as u64, source });
                }
            }
        }
        Ok(())
    }
}

/// A pcapng packet's time: pcap-file reads its timestamp's units as nanoseconds whatever the
/// interface's `if_tsresol` says (microseconds when it says nothing), so the count is rescaled
/// here: `10^-n` s units, or `2^-n` with the option's high bit.
fn in_time(read_as_nanos: Duration, interface: Option<&InterfaceDescriptionBlock<'_>>) -> Duration {
    let units = read_as_nanos.as_nanos();
    let resolution = interface
        .and_then(|i| {
            i.options.iter().find_map(|o| match o {
                InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                _ => None,
            })
        })
        .unwrap_or(6);
    let ns = if resolution & 0x80 == 0 {
        let exp = u32::from(resolution);
        if exp <= 9 {
            units.saturating_mul(10u128.pow(9 - exp))
        } else {
            units / 10u128.checked_pow(exp - 9).unwrap_or(u128::MAX)
        }
    } else {
        let exp = u32::from(resolution & 0x7f);
        units.saturating_mul(1_000_000_000) >> exp.min(127)
    };
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// A valid pcap header, for the reader's placeholder parser before the real header is read.
const PCAP_STUB: [u8; 24] =
    [0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0];

/// Writes frames as a pcap (one link type) or a pcapng (interfaces as given).
pub enum CaptureWriter<W: Write> {
    /// libpcap's format.
    Pcap(PcapWriter<W>),
    /// pcapng.
    PcapNg(PcapNgWriter<W>),
}

impl<W: Write> fmt::Debug for CaptureWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaptureWriter::Pcap(_) => "CaptureWriter::Pcap",
            CaptureWriter::PcapNg(_) => "CaptureWriter::PcapNg",
        })
    }
}

impl<W: Write> CaptureWriter<W> {
    /// A writer in `reader`'s format (a pcap with its header).
    pub fn like<R>(writer: W, reader: &CaptureReader<R>) -> Result<CaptureWriter<W>, CaptureError> {
        let io = |e: PcapError| CaptureError::Io { offset: 0, source: io::Error::other(e.to_string()) };
        Ok(match reader.pcap_header() {
            Some(header) => CaptureWriter::Pcap(PcapWriter::with_header(writer, header).map_err(io)?),
            None => CaptureWriter::PcapNg(PcapNgWriter::new(writer).map_err(io)?),
        })
    }

    /// A pcap writer for frames of `link`, with nanosecond timestamps.
    pub fn pcap(writer: W, link: DataLink) -> Result<CaptureWriter<W>, CaptureError> {
        let header = PcapHeader {
            datalink: link,
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            snaplen: 262_144,
            ..PcapHeader::default()
        };
        PcapWriter::with_header(writer, header)
            .map(CaptureWriter::Pcap)
            .map_err(|e| CaptureError::Io { offset: 0, source: io::Error::other(e.to_string()) })
    }

    /// Writes a record (an interface only to a pcapng).
    pub fn write(&mut self, record: &Record) -> Result<(), CaptureError> {
        let io = |e: PcapError| CaptureError::Io { offset: 0, source: io::Error::other(e.to_string()) };
        match (self, record) {
            (CaptureWriter::Pcap(w), Record::Frame(f)) => {
                w.write_packet(&PcapPacket {
                    timestamp: f.timestamp,
                    orig_len: f.orig_len,
                    data: Cow::Borrowed(&f.data),
                })
                .map_err(io)?;
            }
            (CaptureWriter::Pcap(_), Record::Interface(_)) => {}
            (CaptureWriter::PcapNg(w), Record::Frame(f)) => {
                let epb = EnhancedPacketBlock {
                    interface_id: f.interface,
                    timestamp: f.timestamp,
                    original_len: f.orig_len,
                    data: Cow::Borrowed(&f.data),
                    options: Vec::new(),
                };
                w.write_block(&Block::EnhancedPacket(epb)).map_err(io)?;
            }
            (CaptureWriter::PcapNg(w), Record::Interface(idb)) => {
                // Frames are written in nanoseconds (pcap-file writes a time's nanoseconds as
                // its units): the interface says so.
                let mut idb = idb.clone();
                idb.options.retain(|o| !matches!(o, InterfaceDescriptionOption::IfTsResol(_)));
                idb.options.push(InterfaceDescriptionOption::IfTsResol(9));
                w.write_block(&Block::InterfaceDescription(idb)).map_err(io)?;
            }
        }
        Ok(())
    }
}
