//! The multipath extension's wire format against Wireshark (docs/multipath.md, "The wire
//! format of the extension"; issue 19): a SEND and a READ response carrying a placement
//! trailer, an ACK carrying a SACK trailer and a CNP carrying path feedback, each with the
//! extension's BTH `resv7` bits set and a correct ICRC, are dissected by tshark as plain RoCE
//! v2, with no malformed packet and no expert warning: tshark sees the trailers as payload.
//! No root needed: the frames are built in memory and written to a pcap file.

use std::{fs::File, net::Ipv4Addr, time::Duration};

use pcap_file::pcap::{PcapPacket, PcapWriter};
use roce::wire::{
    self, AethRepr, AethSyndrome, BthRepr, EthernetAddress, IpPath, Msn, Opcode, PathRepr, Psn,
    Qpn, RKey, RethRepr, RoceRepr, bth, cnp, icrc, ipv4,
    multipath::{
        Entropy, MpBthFlags, PathFeedback, PlacementFlags, PlacementTrailer, SackBitmap,
        SackTrailer, Ssn, placement, sack,
    },
};

const ETH: usize = 14;
const BTH_AT: usize = ETH + 20 + 8;

fn path() -> PathRepr {
    let ip = IpPath::V4 {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
    };
    let mut p = PathRepr::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
        ip,
    );
    p.udp_src_port = 0xc123;
    p
}

/// Sets the multipath bits of the frame's BTH and refreshes the ICRC (the bits are covered).
fn set_flags_and_icrc(frame: &mut [u8], flags: MpBthFlags) {
    flags.emit(&mut bth::Packet::new_unchecked(
        &mut frame[BTH_AT..BTH_AT + 12],
    ));
    refresh_icrc(frame);
}

fn refresh_icrc(frame: &mut [u8]) {
    let n = frame.len();
    let crc = icrc::compute_in_place(&mut frame[ETH..n - 4]).expect("icrc");
    frame[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// An ACK has no payload in plain RoCE, so `emit_frame` refuses one: the SACK trailer is
/// spliced in before the ICRC here, with the IPv4 and UDP lengths fixed.
fn ack_with_sack(t: &SackTrailer) -> Vec<u8> {
    let mut r = RoceRepr::new(BthRepr::new(
        Opcode::RC_ACKNOWLEDGE,
        Qpn::new(0x11),
        Psn::new(0xff_ffff),
    ));
    r.aeth = Some(AethRepr {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: Msn::new(3),
    });
    let mut buf = vec![0u8; 256];
    let n = wire::emit_frame(&path(), &r, &[], &mut buf).expect("emit ACK");
    buf.truncate(n);
    let at = n - 4;
    buf.splice(at..at, t.to_bytes());
    let add = sack::HEADER_LEN as u16;
    let mut ip = ipv4::Packet::new_unchecked(&mut buf[ETH..ETH + 20]);
    let tl = ip.total_len();
    ip.set_total_len(tl + add);
    ip.fill_checksum();
    let udp_len = u16::from_be_bytes([buf[ETH + 24], buf[ETH + 25]]);
    buf[ETH + 24..ETH + 26].copy_from_slice(&(udp_len + add).to_be_bytes());
    // As a QP with the extension on sends it: its responder holds READs and atomics (HOLD).
    set_flags_and_icrc(
        &mut buf,
        MpBthFlags::OFFER | MpBthFlags::TRAILER | MpBthFlags::HOLD,
    );
    buf
}

fn frames() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // A SEND of 30 bytes (so a pad) with its placement trailer.
    let data: Vec<u8> = (0..30u8).collect();
    let t = PlacementTrailer {
        first_psn: Psn::new(7),
        flags: PlacementFlags::SEND,
        offset: 0,
        length: 30,
        va: 0,
        rkey: RKey::new(0),
        ssn: Ssn::new(4),
    };
    let mut payload = data.clone();
    payload.extend_from_slice(&t.to_bytes());
    let send = RoceRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x12),
        Psn::new(7),
    ));
    let mut buf = vec![0u8; 256];
    let n = wire::emit_frame(&path(), &send, &payload, &mut buf).expect("emit SEND");
    buf.truncate(n);
    set_flags_and_icrc(&mut buf, MpBthFlags::OFFER | MpBthFlags::TRAILER);
    out.push(buf);
    // A READ response with its trailer.
    let mut rr = RoceRepr::new(BthRepr::new(
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Qpn::new(0x11),
        Psn::new(8),
    ));
    rr.aeth = Some(AethRepr {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: Msn::new(4),
    });
    let t = PlacementTrailer {
        first_psn: Psn::new(8),
        flags: PlacementFlags::READ_RESPONSE,
        offset: 0,
        length: 64,
        va: 0x7f00_0000_1000,
        rkey: RKey::new(0),
        ssn: Ssn::new(0),
    };
    let mut payload = vec![0xab; 64];
    payload.extend_from_slice(&t.to_bytes());
    let mut buf = vec![0u8; 256];
    let n = wire::emit_frame(&path(), &rr, &payload, &mut buf).expect("emit READ response");
    buf.truncate(n);
    // As a responder with the extension on sends it (its responses say it holds, HOLD).
    set_flags_and_icrc(
        &mut buf,
        MpBthFlags::OFFER | MpBthFlags::TRAILER | MpBthFlags::HOLD,
    );
    out.push(buf);
    // An ACK with a SACK trailer.
    out.push(ack_with_sack(&SackTrailer {
        bitmap: SackBitmap(0b1011_0110),
        held: 5,
    }));
    // A CNP with path feedback.
    let mut buf = vec![0u8; 256];
    let n =
        wire::emit_frame(&path(), &RoceRepr::cnp(Qpn::new(0x12)), &[], &mut buf).expect("emit CNP");
    buf.truncate(n);
    let f = PathFeedback {
        entropy: Entropy::new(0xd00d).expect("entropy"),
    };
    f.emit(&mut cnp::Packet::new_unchecked(
        &mut buf[BTH_AT + 12..BTH_AT + 28],
    ));
    set_flags_and_icrc(&mut buf, MpBthFlags::TRAILER);
    out.push(buf);
    // A READ request sent in selective repeat: no trailer, marked to be held and to have its
    // responses placed (sent with their trailers).
    let mut rd = RoceRepr::new(BthRepr::new(
        Opcode::RC_RDMA_READ_REQUEST,
        Qpn::new(0x12),
        Psn::new(9),
    ));
    rd.reth = Some(RethRepr {
        va: 0x7f00_0000_2000,
        rkey: RKey::new(0x77),
        dma_len: 4096,
    });
    let mut buf = vec![0u8; 256];
    let n = wire::emit_frame(&path(), &rd, &[], &mut buf).expect("emit READ request");
    buf.truncate(n);
    set_flags_and_icrc(
        &mut buf,
        MpBthFlags::OFFER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED,
    );
    out.push(buf);
    out
}

#[test]
fn tshark_dissects_packets_with_multipath_trailers_as_plain_roce() {
    let frames = frames();
    // roce-xdp's own parser: the ICRC holds, the BTH is unchanged, the trailers split off.
    let send = wire::parse_frame(&frames[0]).expect("SEND parses");
    assert!(send.icrc_ok);
    let (data, t) = placement::split(send.payload).expect("placement trailer");
    assert_eq!(data, (0..30u8).collect::<Vec<_>>());
    assert_eq!(t.ssn, Ssn::new(4));
    let rr = wire::parse_frame(&frames[1]).expect("READ response parses");
    assert_eq!(
        placement::split(rr.payload).expect("trailer").1.va,
        0x7f00_0000_1000
    );
    // An ACK whose payload is exactly the SACK trailer, with the TRAILER bit, parses (step 2);
    // the same ACK without the bit is refused ("payload on an opcode that carries none").
    let parsed = wire::parse_frame(&frames[2]).expect("a SACK ACK parses");
    assert!(parsed.icrc_ok);
    let (rest, _) = sack::split(parsed.payload).expect("SACK trailer");
    assert!(rest.is_empty());
    let mut no_bit = frames[2].clone();
    no_bit[BTH_AT + 8] &= !MpBthFlags::TRAILER.bits();
    assert!(wire::parse_frame(&no_bit).is_err());
    let ack = &frames[2];
    assert!(icrc::verify(
        &ack[ETH..ETH + 20],
        &ack[ETH + 20..BTH_AT],
        &ack[BTH_AT..]
    ));
    let bitmap_at = BTH_AT + 12 + 4;
    assert_eq!(
        sack::split(&ack[bitmap_at..ack.len() - 4])
            .expect("SACK trailer")
            .1
            .held,
        5
    );
    let cnp = wire::parse_frame(&frames[3]).expect("CNP parses");
    assert!(cnp.icrc_ok);
    let rd = wire::parse_frame(&frames[4]).expect("a held READ request parses");
    assert!(rd.icrc_ok && rd.payload.is_empty());
    assert_eq!(
        MpBthFlags::from_resv7(rd.roce.bth.resv7),
        MpBthFlags::OFFER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED
    );

    let file = std::env::temp_dir().join(format!("roce-multipath-{}.pcap", std::process::id()));
    {
        let mut w =
            PcapWriter::new(File::create(&file).expect("create pcap")).expect("pcap header");
        for (i, f) in frames.iter().enumerate() {
            let len = u32::try_from(f.len()).expect("frame length");
            w.write_packet(&PcapPacket::new(Duration::from_micros(i as u64), len, f))
                .expect("write frame");
        }
    }
    let d = roce_tests::rxe::dissect(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(d.roce, 5, "{d:?}");
    assert!(
        d.problems.is_empty(),
        "tshark found problems: {:?}",
        d.problems
    );
    assert_eq!(d.payload_guesses, 0, "{d:?}");
}
