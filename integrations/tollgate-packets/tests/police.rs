//! The pipeline end to end on synthetic captures (and a real one taken on the loopback): what
//! it reads, keys, meters, re-marks, drops and writes, checked against a meter per flow kept
//! apart, and the captures it cannot read.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Cursor;
use std::time::Duration;

use etherparse::Ipv4HeaderSlice;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::{Block, PcapNgWriter};
use pcap_file::DataLink;
use tollgate::{Color, Meter, MeterState, Nanos};
use tollgate_packets::capture::{CaptureError, CaptureReader, Record};
use tollgate_packets::generate::{generate, Synthetic};
use tollgate_packets::packet::{self, FlowKey, KeyBy, Unmetered};
use tollgate_packets::police::{police, Action, FlowStats, Policy};

fn synthetic(s: &Synthetic) -> (Vec<u8>, tollgate_packets::generate::Generated) {
    let mut capture = Vec::new();
    let made = generate(&mut capture, s).unwrap();
    (capture, made)
}

fn policy(meter: &str, key_by: KeyBy) -> Policy {
    Policy {
        meter: meter.parse().unwrap(),
        key_by,
        actions: [Action::Pass, Action::Remark(12), Action::Drop],
        malformed: Action::Drop,
        capacity: 1 << 16,
        per_flow: true,
    }
}

/// Every frame of `capture`, in order.
fn frames(capture: &[u8]) -> Vec<tollgate_packets::capture::Frame> {
    let mut r = CaptureReader::new(capture).unwrap();
    let mut out = Vec::new();
    while let Some(record) = r.next_record() {
        if let Record::Frame(f) = record.unwrap() {
            out.push(f);
        }
    }
    out
}

/// The colours a meter per flow, kept apart from the pipeline, gives the capture's packets.
fn expected(capture: &[u8], p: &Policy) -> HashMap<FlowKey, FlowStats> {
    let mut each: HashMap<FlowKey, (MeterState, FlowStats)> = HashMap::new();
    let all = frames(capture);
    let origin = all[0].timestamp;
    for f in &all {
        let Ok(m) = packet::read(f.link, &f.data, f.is_cut(), p.key_by) else { continue };
        let at = Nanos::new((f.timestamp - origin).as_nanos() as u64);
        let (state, stats) = each.entry(m.key).or_default();
        let c = state.check(&p.meter, at, u64::from(m.len)) as usize;
        stats.packets[c] += 1;
        stats.bytes[c] += u64::from(m.len);
    }
    each.into_iter().map(|(k, (_, s))| (k, s)).collect()
}

#[test]
fn a_synthetic_capture_is_policed_per_flow_as_each_flow_alone() {
    let s = Synthetic { flows: 500, packets: 60_000, malformed_ppm: 5_000, ..Synthetic::default() };
    let (capture, made) = synthetic(&s);
    for (meter, key_by) in [
        ("srtcm cir=5Mbit/s cbs=16KiB ebs=32KiB", KeyBy::FiveTuple),
        ("trtcm cir=2Mbit/s cbs=8KiB pir=4Mbit/s pbs=16KiB", KeyBy::FiveTuple),
        ("rfc4115 cir=20Mbit/s cbs=64KiB eir=10Mbit/s ebs=32KiB", KeyBy::SourcePrefix { v4: 16, v6: 48 }),
    ] {
        let p = policy(meter, key_by);
        let mut out = Vec::new();
        let report = police(Cursor::new(&capture), Some(&mut out), &p).unwrap();
        assert_eq!(report.frames, made.frames);
        assert_eq!(report.unmetered, made.unmetered, "{meter}");
        assert_eq!(report.colors.packets.iter().sum::<u64>(), made.ip, "{meter}");
        assert_eq!(report.table_full, 0);
        let want = expected(&capture, &p);
        assert_eq!(report.flows.len(), want.len(), "{meter}");
        for (k, stats) in &want {
            assert_eq!(report.flows.get(k), Some(stats), "{meter}: flow {k:?}");
        }
        assert!(
            report.colors.packets.iter().all(|&n| n > 0),
            "{meter}: every colour seen: {:?}",
            report.colors
        );
        // Written: green and yellow, and what is not IP; not red, not malformed.
        let written = frames(&out);
        let not_ip = made.unmetered[0];
        assert_eq!(written.len() as u64, report.colors.packets[0] + report.colors.packets[1] + not_ip);
        assert_eq!(report.written, written.len() as u64);
        // Yellow packets carry DSCP 12, and a valid IPv4 checksum.
        let mut remarked = 0;
        for f in &written {
            let Ok(m) = packet::read(f.link, &f.data, false, KeyBy::FiveTuple) else { continue };
            if let packet::Dscp::V4(o) = m.dscp {
                let h = Ipv4HeaderSlice::from_slice(&f.data[o..]).unwrap();
                assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum(), "{meter}");
                remarked += u64::from(h.dcp().value() == 12);
            } else if let packet::Dscp::V6(o) = m.dscp {
                let tc = (f.data[o] << 4) | (f.data[o + 1] >> 4);
                remarked += u64::from(tc >> 2 == 12);
            }
        }
        assert_eq!(remarked, report.colors.packets[1], "{meter}: every yellow packet re-marked");
    }
}

/// A pcapng of `capture`'s frames: timestamps in nanoseconds (`if_tsresol` 9), or in the
/// format's default microseconds (no option; pcap-file writes a time's nanoseconds as its
/// units, so microsecond units are handed to it as nanoseconds).
fn pcapng_of(capture: &[u8], nanos: bool) -> Vec<u8> {
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
    let mut ng = Vec::new();
    let mut w = PcapNgWriter::new(&mut ng).unwrap();
    let options = if nanos { vec![InterfaceDescriptionOption::IfTsResol(9)] } else { vec![] };
    let idb = InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options };
    w.write_block(&Block::InterfaceDescription(idb)).unwrap();
    for f in frames(capture) {
        let units = if nanos { f.timestamp } else { Duration::from_nanos(f.timestamp.as_micros() as u64) };
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: units,
            original_len: f.orig_len,
            data: Cow::Owned(f.data),
            options: vec![],
        };
        w.write_block(&Block::EnhancedPacket(epb)).unwrap();
    }
    drop(w);
    ng
}

#[test]
fn pcapng_in_pcapng_out() {
    let (capture, made) = synthetic(&Synthetic { flows: 50, packets: 5_000, ..Synthetic::default() });
    let p = policy("srtcm cir=1Mbit/s cbs=4KiB ebs=8KiB", KeyBy::FiveTuple);
    let from_pcap = police(Cursor::new(&capture), None::<Vec<u8>>, &p).unwrap();
    assert_eq!(from_pcap.frames, made.frames);
    for nanos in [true, false] {
        let ng = pcapng_of(&capture, nanos);
        let mut out = Vec::new();
        let from_ng = police(Cursor::new(&ng), Some(&mut out), &p).unwrap();
        // In microseconds the times lose their nanoseconds: colours may differ at the edges.
        if nanos {
            assert_eq!(
                (from_ng.frames, from_ng.colors, from_ng.unmetered),
                (from_pcap.frames, from_pcap.colors, from_pcap.unmetered)
            );
        } else {
            let (a, b) = (from_ng.colors.packets, from_pcap.colors.packets);
            assert!((0..3).all(|i| a[i].abs_diff(b[i]) * 100 <= b[i].max(100)), "µs {a:?} vs ns {b:?}");
        }
        let r = CaptureReader::new(&out[..]).unwrap();
        assert_eq!(r.format(), tollgate_packets::capture::Format::PcapNg);
        let written = frames(&out);
        assert_eq!(written.len() as u64, from_ng.written);
        // Written in nanoseconds, and said so: the times read back are the times read in.
        let read_in: Vec<Duration> = frames(&ng).iter().map(|f| f.timestamp).collect();
        assert!(written.iter().all(|f| read_in.contains(&f.timestamp)));
        assert!(
            read_in.windows(2).all(|w| w[0] <= w[1]) && read_in[0] > Duration::from_secs(1_700_000_000),
            "{:?}",
            read_in[0]
        );
    }
}

/// A capture cut by its snap length (`tcpdump -s 96`): each packet metered at its IP header's
/// length, as the uncut capture's.
#[test]
fn a_capture_cut_by_its_snap_length_meters_each_packet_whole() {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    let (capture, _) =
        synthetic(&Synthetic { flows: 20, packets: 2_000, malformed_ppm: 0, ..Synthetic::default() });
    let mut cut = Vec::new();
    {
        let header = PcapHeader {
            snaplen: 96,
            datalink: DataLink::ETHERNET,
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(&mut cut, header).unwrap();
        for f in frames(&capture) {
            let data = &f.data[..f.data.len().min(96)];
            w.write_packet(&PcapPacket::new(f.timestamp, f.orig_len, data)).unwrap();
        }
    }
    let p = policy("trtcm cir=2Mbit/s cbs=8KiB pir=4Mbit/s pbs=16KiB", KeyBy::FiveTuple);
    let whole = police(Cursor::new(&capture), None::<Vec<u8>>, &p).unwrap();
    let short = police(Cursor::new(&cut), None::<Vec<u8>>, &p).unwrap();
    assert_eq!((short.frames, short.colors, short.unmetered), (whole.frames, whole.colors, whole.unmetered));
    assert_eq!(short.flows, whole.flows);
}

#[test]
fn captures_that_do_not_read_say_where() {
    let (capture, _) =
        synthetic(&Synthetic { flows: 5, packets: 100, malformed_ppm: 0, ..Synthetic::default() });
    let p = policy("srtcm cir=1Mbit/s cbs=4KiB ebs=8KiB", KeyBy::FiveTuple);
    let err = |bytes: &[u8]| police(Cursor::new(bytes), None::<Vec<u8>>, &p).unwrap_err();
    assert!(matches!(err(b""), CaptureError::Format { offset: 0, .. }));
    let e = err(b"GIF89a not a capture").to_string();
    assert!(e.contains("at byte 0") && e.contains("not a pcap or pcapng"), "{e}");
    // Cut inside its 11th record: the error names that record's offset.
    let records = frames(&capture);
    let eleventh = records[10].offset as usize;
    let e = err(&capture[..eleventh + 20]);
    assert!(matches!(e, CaptureError::Format { offset, .. } if offset == eleventh as u64), "{e}");
    // A record whose length field claims 4 GiB.
    let mut corrupt = capture.clone();
    corrupt[eleventh + 8..eleventh + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = err(&corrupt);
    assert!(matches!(e, CaptureError::Format { offset, .. } if offset == eleventh as u64), "{e}");
    // A header cut short.
    assert!(matches!(err(&capture[..10]), CaptureError::Format { offset: 0, .. }));
}

/// Frames of every link type and every malformed kind, read one by one.
#[test]
fn every_link_and_every_malformation() {
    let v4 = |proto: u8, len: u16| -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        ip[2..4].copy_from_slice(&len.to_be_bytes());
        ip.extend_from_slice(&[0x30, 0x39, 0x00, 0x50]); // ports 12345 -> 80
        ip.resize(usize::from(len), 0);
        if proto == 17 {
            ip[24..26].copy_from_slice(&(len - 20).to_be_bytes());
        } else if proto == 6 {
            ip[32] = 0x50; // TCP data offset: 5 words
        }
        ip
    };
    let eth = |ether_type: u16, body: &[u8]| -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        f.extend_from_slice(&ether_type.to_be_bytes());
        f.extend_from_slice(body);
        f
    };
    let k5 = KeyBy::FiveTuple;
    let udp = v4(17, 100);
    // Ethernet, VLAN, raw, SLL, NULL: one flow, 100 bytes each.
    let mut vlan = vec![0, 5];
    vlan.extend_from_slice(&0x0800u16.to_be_bytes());
    vlan.extend_from_slice(&udp);
    let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0];
    sll.extend_from_slice(&0x0800u16.to_be_bytes());
    sll.extend_from_slice(&udp);
    let mut null = 2u32.to_le_bytes().to_vec();
    null.extend_from_slice(&udp);
    let forms = [
        (DataLink::ETHERNET, eth(0x0800, &udp)),
        (DataLink::ETHERNET, eth(0x8100, &vlan)),
        (DataLink::RAW, udp.clone()),
        (DataLink::LINUX_SLL, sll),
        (DataLink::NULL, null),
    ];
    let mut keys = Vec::new();
    for (link, frame) in &forms {
        let m = packet::read(*link, frame, false, k5).unwrap_or_else(|e| panic!("{link:?}: {e:?}"));
        assert_eq!((m.len, m.key.proto, m.key.sport, m.key.dport), (100, 17, 12345, 80), "{link:?}");
        keys.push(m.key);
    }
    assert!(keys.windows(2).all(|w| w[0] == w[1]));
    // A capture that kept 60 of a 1,500-byte packet meters 1,500 bytes.
    let big = eth(0x0800, &v4(6, 1_500));
    assert_eq!(packet::read(DataLink::ETHERNET, &big[..60], true, k5).unwrap().len, 1_500);
    // The same cut where the capture did not cut: its length lies.
    assert_eq!(packet::read(DataLink::ETHERNET, &big[..60], false, k5), Err(Unmetered::BadLength));
    // IPv6 behind a hop-by-hop header, keyed by its TCP ports; by source /48.
    let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 0, 64];
    v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9]);
    v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    v6.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]); // hop-by-hop: next TCP, PadN
    let mut tcp = vec![0x01, 0xbb, 0xc3, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0];
    tcp.extend_from_slice(&[0; 12]);
    v6.extend_from_slice(&tcp);
    let payload = (v6.len() - 40) as u16;
    v6[4..6].copy_from_slice(&payload.to_be_bytes());
    v6[6] = 0; // next header: hop-by-hop
    let m = packet::read(DataLink::ETHERNET, &eth(0x86dd, &v6), false, k5).unwrap();
    assert_eq!((m.len, m.key.proto, m.key.sport, m.key.dport), (v6.len() as u32, 6, 443, 50_000));
    let m =
        packet::read(DataLink::ETHERNET, &eth(0x86dd, &v6), false, KeyBy::SourcePrefix { v4: 24, v6: 48 })
            .unwrap();
    assert_eq!(m.key.source().to_string(), "2001:db8:1::");
    // Malformed, each kind.
    let mut bad_ihl = udp.clone();
    bad_ihl[0] = 0x43;
    let mut short_total = udp.clone();
    short_total[2..4].copy_from_slice(&10u16.to_be_bytes());
    let mut v5 = udp.clone();
    v5[0] = 0x55;
    for (frame, want) in [
        (eth(0x0800, &udp[..12]), Unmetered::Truncated),
        (eth(0x0800, &bad_ihl), Unmetered::BadIhl),
        (eth(0x0800, &short_total), Unmetered::BadLength),
        (eth(0x0806, &[0; 28]), Unmetered::NotIp),
        (vec![1, 2, 3], Unmetered::Truncated),
        (eth(0x0800, &v5), Unmetered::NotIp),
    ] {
        assert_eq!(
            packet::read(DataLink::ETHERNET, &frame, false, k5).map(|m| m.len),
            Err(want),
            "{frame:?}"
        );
    }
    assert_eq!(
        packet::read(DataLink::IEEE802_11, &udp, false, k5).map(|m| m.len),
        Err(Unmetered::UnknownLink)
    );
    // A jumbo frame meters whole.
    assert_eq!(packet::read(DataLink::ETHERNET, &eth(0x0800, &v4(17, 9_000)), false, k5).unwrap().len, 9_000);
}

#[test]
fn actions_read_as_written() {
    assert_eq!("pass".parse::<Action>(), Ok(Action::Pass));
    assert_eq!("drop".parse::<Action>(), Ok(Action::Drop));
    assert_eq!("remark=46".parse::<Action>(), Ok(Action::Remark(46)));
    assert_eq!("remark=ef".parse::<Action>(), Ok(Action::Remark(46)));
    assert_eq!("remark=af21".parse::<Action>(), Ok(Action::Remark(18)));
    assert_eq!("remark=cs3".parse::<Action>(), Ok(Action::Remark(24)));
    for bad in ["remark=64", "remark=af51", "remark=cs8", "remark=x", "keep", "remark=af1"] {
        let e = bad.parse::<Action>().unwrap_err();
        assert!(e.contains(bad.trim_start_matches("remark=")), "{bad}: {e}");
    }
    let _ = Meter::srtcm(1, 1, 1).unwrap();
    let _ = Color::Green;
    let _ = Duration::ZERO;
}

/// A real capture: tcpdump on the loopback while this test sends UDP datagrams of IMIX sizes
/// to itself (root, and tcpdump, which the test suite installs). One flow, every packet
/// metered, colours as a meter of its own gives them at the capture's timestamps.
#[test]
fn a_capture_taken_with_tcpdump_on_the_loopback() {
    use std::io::{BufRead, BufReader};
    use std::net::UdpSocket;
    use std::process::{Command, Stdio};

    let Ok(found) = Command::new("tcpdump").arg("--version").output() else {
        assert!(std::env::var_os("CI").is_none(), "tcpdump is missing: apt-get install tcpdump");
        eprintln!("skipped: no tcpdump here (CI installs it)");
        return;
    };
    assert!(found.status.success());
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port();
    let path = std::env::temp_dir().join(format!("tollgate-loopback-{}-{port}.pcap", std::process::id()));
    let mut tcpdump = Command::new("tcpdump")
        .args(["-i", "lo", "-U", "-n", "-w"])
        .arg(&path)
        .args(["udp", "and", "dst", "port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // tcpdump says "listening on lo" once it captures.
    let mut stderr = BufReader::new(tcpdump.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "tcpdump stopped: {line}");
    }
    let source = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sizes = [12usize, 548, 1_472];
    let mut sent = 0;
    for i in 0..3_000 {
        let payload = vec![0u8; sizes[[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2][i % 12]]];
        source.send_to(&payload, ("127.0.0.1", port)).unwrap();
        sent += 1;
        if i % 20 == 19 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // SIGINT: tcpdump finishes its file and says how many packets it captured.
    let pid = tcpdump.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    tcpdump.wait().unwrap();
    let captured: u64 = said
        .lines()
        .find_map(|l| l.strip_suffix(" packets captured").or_else(|| l.strip_suffix(" packet captured")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("tcpdump said: {said}"));
    assert!(captured * 10 >= sent * 9, "tcpdump captured {captured} of {sent}: {said}");
    let capture = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let p = policy("srtcm cir=8Mbit/s cbs=32KiB ebs=64KiB", KeyBy::FiveTuple);
    let report = police(Cursor::new(&capture), None::<Vec<u8>>, &p).unwrap();
    assert_eq!(report.frames, captured, "{report}");
    assert_eq!(report.unmetered, [0; 6], "{report}");
    assert_eq!(report.flows.len(), 1, "{report}");
    assert_eq!(report.flows, expected(&capture, &p));
    let (_, stats) = report.flows.iter().next().unwrap();
    // IP lengths: a payload's plus 28 bytes of IPv4 and UDP headers, each a size sent.
    let metered: u64 = stats.packets.iter().sum();
    assert_eq!(metered, captured);
    let bytes: u64 = stats.bytes.iter().sum();
    assert!(bytes >= captured * 40 && bytes <= captured * 1_500, "{bytes} bytes in {captured} packets");
    eprintln!("loopback capture: {report}");
}
