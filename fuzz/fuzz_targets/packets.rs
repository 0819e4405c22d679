//! The packet reader and the policing pipeline on any bytes: a frame of each link type read,
//! re-marked and read again (same flow, same length, a valid IPv4 checksum); and the bytes as
//! a whole capture, policed (counts that add up, or an error with its offset). Nothing panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pcap_file::DataLink;
use tollgate_packets::packet::{self, Dscp, KeyBy};
use tollgate_packets::police::{police, Action, Policy};

const LINKS: [DataLink; 6] =
    [DataLink::ETHERNET, DataLink::RAW, DataLink::LINUX_SLL, DataLink::NULL, DataLink::IPV6, DataLink::PPP];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else { return };
    let link = LINKS[usize::from(mode) % LINKS.len()];
    let cut = mode & 0x80 != 0;
    let by = if mode & 0x40 != 0 { KeyBy::SourcePrefix { v4: 24, v6: 64 } } else { KeyBy::FiveTuple };
    if let Ok(m) = packet::read(link, frame, cut, by) {
        let mut copy = frame.to_vec();
        packet::remark(&mut copy, m.dscp, mode & 0x3f);
        let again = packet::read(link, &copy, cut, by).expect("a re-marked packet still reads");
        assert_eq!((again.key, again.len), (m.key, m.len));
        if let Dscp::V4(o) = m.dscp {
            // The header's words, checksum included, add up to all ones (RFC 1071), whatever
            // its bits (etherparse's own header drops the reserved flag, so it is not the judge).
            let header = &copy[o..o + usize::from(copy[o] & 0x0f) * 4];
            let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "{header:02x?}");
            assert_eq!(copy[o + 1] >> 2, mode & 0x3f);
        }
    }
    let policy = Policy {
        meter: "trtcm cir=1000B/s cbs=1500 pir=2000B/s pbs=3000".parse().unwrap(),
        key_by: by,
        actions: [Action::Pass, Action::Remark(10), Action::Drop],
        malformed: Action::Drop,
        capacity: 16,
        per_flow: true,
    };
    let mut out = Vec::new();
    if let Ok(report) = police(data, Some(&mut out), &policy) {
        let metered: u64 = report.colors.packets.iter().sum();
        assert_eq!(report.frames, metered + report.unmetered.iter().sum::<u64>());
        assert!(report.written <= report.frames);
    }
});
