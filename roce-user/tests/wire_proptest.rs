//! Property tests of the wire module: emit then parse is the identity, and no input makes
//! the parser or any accessor of a checked view panic.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use roce::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpRepr, DethRepr, Ecn,
    EthernetAddress, EthernetRepr, FethRepr, FrameTemplate, IethRepr, ImmDtRepr, IpPath, IpRepr,
    Msn, Opcode, PKey, PathRepr, Psn, QKey, Qpn, RKey, RethRepr, RocePacket, RoceRepr, VlanTag,
    aeth, atomic, bth, cnp, deth, emit_frame, ethernet, feth, frame_len, ieth, immdt, ipv4, ipv6,
    parse_frame, reth, udp,
};
use roce_common::opcode::Hdrs;

#[derive(Debug, Clone)]
struct Raw {
    op: usize,
    qpn: u32,
    psn: u32,
    flags: u8,
    pkey: u16,
    a: u64,
    b: u64,
    c: u64,
    d: u32,
    e: u32,
    syn: u8,
    payload: Vec<u8>,
}

fn raw() -> impl Strategy<Value = Raw> {
    (
        (
            0..Opcode::ALL.len(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u16>(),
        ),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
        ),
        prop::collection::vec(any::<u8>(), 0..1100),
    )
        .prop_map(
            |((op, qpn, psn, flags, pkey), (a, b, c, d, e, syn), payload)| Raw {
                op,
                qpn,
                psn,
                flags,
                pkey,
                a,
                b,
                c,
                d,
                e,
                syn,
                payload,
            },
        )
}

/// A valid repr and payload for an opcode of the table, with arbitrary field values.
fn roce(r: &Raw) -> (RoceRepr, Vec<u8>) {
    let op = Opcode::ALL[r.op];
    let info = op.info().unwrap();
    let mut bth = BthRepr::new(op, Qpn::new(r.qpn), Psn::new(r.psn));
    bth.solicited = r.flags & 1 != 0;
    bth.mig_req = r.flags & 2 != 0;
    bth.fecn = r.flags & 4 != 0;
    bth.becn = r.flags & 8 != 0;
    bth.ack_req = r.flags & 16 != 0;
    bth.pkey = PKey::new(r.pkey);
    let payload = if info.payload {
        r.payload.clone()
    } else {
        Vec::new()
    };
    bth.pad_count = (payload.len().wrapping_neg() & 3) as u8;
    let mut x = RoceRepr::new(bth);
    let h = info.hdrs;
    if h.contains(Hdrs::DETH) {
        x.deth = Some(DethRepr {
            qkey: QKey::new(r.d),
            src_qp: Qpn::new(r.e),
        });
    }
    if h.contains(Hdrs::FETH) {
        x.feth = Some(FethRepr { raw: r.e });
    }
    if h.contains(Hdrs::RETH) {
        x.reth = Some(RethRepr {
            va: r.a,
            rkey: RKey::new(r.d),
            dma_len: r.e,
        });
    }
    if h.contains(Hdrs::ATOMIC_ETH) {
        x.atomic_eth = Some(AtomicEthRepr {
            va: r.a,
            rkey: RKey::new(r.d),
            swap_add: r.b,
            compare: r.c,
        });
    }
    if h.contains(Hdrs::AETH) {
        x.aeth = Some(AethRepr {
            syndrome: AethSyndrome::from_byte(r.syn),
            msn: Msn::new(r.e),
        });
    }
    if h.contains(Hdrs::ATOMIC_ACK_ETH) {
        x.atomic_ack_eth = Some(AtomicAckEthRepr { orig: r.c });
    }
    if h.contains(Hdrs::IMMDT) {
        x.immdt = Some(ImmDtRepr { imm: r.d ^ r.e });
    }
    if h.contains(Hdrs::IETH) {
        x.ieth = Some(IethRepr {
            rkey: RKey::new(r.e),
        });
    }
    if h.contains(Hdrs::CNP) {
        x.cnp = Some(CnpRepr::default());
    }
    (x, payload)
}

fn path() -> impl Strategy<Value = PathRepr> {
    (
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            0..3usize,
            any::<u16>(),
            any::<u16>(),
        ),
        (
            any::<bool>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u32>(),
        ),
        (
            0..64u8,
            0..4u8,
            any::<u8>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
        ),
    )
        .prop_map(
            |((s, d, nvlan, t1, t2), (v6, a, b, fl), (dscp, ecn, ttl, id, sp, dp))| {
                let ip = if v6 {
                    IpPath::V6 {
                        src: Ipv6Addr::from(a),
                        dst: Ipv6Addr::from(b),
                        flow_label: fl & 0xf_ffff,
                    }
                } else {
                    IpPath::V4 {
                        src: Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                        dst: Ipv4Addr::new(b[0], b[1], b[2], b[3]),
                    }
                };
                let mut p = PathRepr::new(EthernetAddress(s), EthernetAddress(d), ip);
                if nvlan >= 1 {
                    p.vlan[0] = Some(VlanTag {
                        tpid: 0x88a8,
                        tci: t1,
                    });
                }
                if nvlan == 2 {
                    p.vlan[1] = Some(VlanTag {
                        tpid: 0x8100,
                        tci: t2,
                    });
                }
                p.dscp = dscp;
                p.ecn = Ecn::from_tos(ecn);
                p.ttl = ttl;
                p.ipv4_ident = id;
                p.udp_src_port = sp;
                p.udp_dst_port = dp;
                p
            },
        )
}

/// Calls every accessor of every view over `b`, for each view whose `new_checked` accepts it.
fn touch_all_views(b: &[u8]) -> u64 {
    let mut acc = 0u64;
    if let Ok(p) = ethernet::Packet::new_checked(b) {
        acc ^=
            u64::from(p.ethertype()) ^ u64::from(p.src_addr().0[0]) ^ u64::from(p.dst_addr().0[5]);
    }
    if let Ok((r, n)) = EthernetRepr::parse(b) {
        acc ^= n as u64 ^ u64::from(r.ethertype);
    }
    if let Ok(p) = ipv4::Packet::new_checked(b) {
        acc ^= u64::from(p.version())
            ^ p.header_len() as u64
            ^ u64::from(p.tos())
            ^ u64::from(p.total_len());
        acc ^= u64::from(p.ident())
            ^ u64::from(p.flags_frag())
            ^ u64::from(p.ttl())
            ^ u64::from(p.protocol());
        acc ^= u64::from(p.checksum()) ^ u64::from(p.verify_checksum());
        acc ^= u64::from(u32::from(p.src_addr())) ^ u64::from(u32::from(p.dst_addr()));
    }
    let _ = roce::wire::Ipv4Repr::parse(b);
    if let Ok(p) = ipv6::Packet::new_checked(b) {
        acc ^= u64::from(p.version()) ^ u64::from(p.traffic_class()) ^ u64::from(p.flow_label());
        acc ^= u64::from(p.payload_len()) ^ u64::from(p.next_header()) ^ u64::from(p.hop_limit());
        acc ^= u64::from(p.src_addr().octets()[0]) ^ u64::from(p.dst_addr().octets()[15]);
    }
    let _ = roce::wire::Ipv6Repr::parse(b);
    if let Ok(p) = udp::Packet::new_checked(b) {
        acc ^= u64::from(p.src_port())
            ^ u64::from(p.dst_port())
            ^ u64::from(p.length())
            ^ u64::from(p.checksum());
        let _ = roce::wire::UdpRepr::parse(&p, b.len());
    }
    if let Ok(p) = bth::Packet::new_checked(b) {
        acc ^= u64::from(p.opcode().0)
            ^ u64::from(p.solicited())
            ^ u64::from(p.mig_req())
            ^ u64::from(p.pad_count());
        acc ^= u64::from(p.tver())
            ^ u64::from(p.pkey().value())
            ^ u64::from(p.fecn())
            ^ u64::from(p.becn());
        acc ^= u64::from(p.dest_qp().value()) ^ u64::from(p.ack_req()) ^ u64::from(p.psn().value());
        let _ = format!("{:?}", p.opcode());
        let _ = BthRepr::parse(&p);
    }
    if let Ok(p) = reth::Packet::new_checked(b) {
        acc ^= p.va() ^ u64::from(p.rkey().value()) ^ u64::from(p.dma_len());
    }
    if let Ok(p) = aeth::Packet::new_checked(b) {
        acc ^= u64::from(p.syndrome().to_byte()) ^ u64::from(p.msn().value());
        if let AethSyndrome::Ack { credits } = p.syndrome() {
            acc ^= u64::from(credits.credits().unwrap_or(7));
        }
        if let AethSyndrome::RnrNak { timer } = p.syndrome() {
            acc ^= u64::from(timer.micros());
        }
    }
    if let Ok(p) = atomic::eth::Packet::new_checked(b) {
        acc ^= p.va() ^ u64::from(p.rkey().value()) ^ p.swap_add() ^ p.compare();
    }
    if let Ok(p) = atomic::ack::Packet::new_checked(b) {
        acc ^= p.orig();
    }
    if let Ok(p) = immdt::Packet::new_checked(b) {
        acc ^= u64::from(p.imm());
    }
    if let Ok(p) = ieth::Packet::new_checked(b) {
        acc ^= u64::from(p.rkey().value());
    }
    if let Ok(p) = deth::Packet::new_checked(b) {
        acc ^= u64::from(p.qkey().value()) ^ u64::from(p.src_qp().value());
    }
    if let Ok(p) = feth::Packet::new_checked(b) {
        acc ^=
            u64::from(p.raw()) ^ u64::from(p.placement_type()) ^ u64::from(p.selectivity_level());
    }
    if let Ok(p) = cnp::Packet::new_checked(b) {
        acc ^= p.reserved().len() as u64;
    }
    if let Ok(p) = RocePacket::new_checked(b) {
        acc ^= u64::from(p.opcode().0)
            ^ p.header_len() as u64
            ^ p.payload().len() as u64
            ^ p.pad().len() as u64;
        acc ^= u64::from(p.icrc()) ^ p.icrc_covered().len() as u64 ^ u64::from(p.info().is_some());
        for (h, _) in Hdrs::ORDER {
            acc ^= p.ext(h).map_or(0, <[u8]>::len) as u64;
        }
        let _ = RoceRepr::parse(&p);
        acc ^= p.into_payload().len() as u64;
    }
    acc
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn frame_emit_then_parse_is_identity(r in raw(), p in path()) {
        let (roce, payload) = roce(&r);
        let mut buf = vec![0xa5u8; 1600];
        let n = emit_frame(&p, &roce, &payload, &mut buf).unwrap();
        prop_assert_eq!(n, frame_len(&p, &roce, payload.len()));
        let f = parse_frame_with_dport(&buf[..n], p.udp_dst_port);
        prop_assert!(f.icrc_ok);
        prop_assert_eq!(f.len, n);
        prop_assert_eq!(f.roce, roce);
        prop_assert_eq!(f.payload, &payload[..]);
        prop_assert_eq!(f.eth.src_addr, p.src_mac);
        prop_assert_eq!(f.eth.dst_addr, p.dst_mac);
        prop_assert_eq!(f.eth.vlan, p.vlan);
        prop_assert_eq!(f.ip.tos(), p.tos());
        prop_assert_eq!(f.ecn(), p.ecn);
        prop_assert_eq!(f.ip.ttl(), p.ttl);
        prop_assert_eq!(f.udp.src_port, p.udp_src_port);
        match (f.ip, p.ip) {
            (IpRepr::V4(a), IpPath::V4 { src, dst }) => {
                prop_assert_eq!((a.src_addr, a.dst_addr, a.ident, a.dont_frag), (src, dst, p.ipv4_ident, true));
            }
            (IpRepr::V6(a), IpPath::V6 { src, dst, flow_label }) => {
                prop_assert_eq!((a.src_addr, a.dst_addr, a.flow_label), (src, dst, flow_label));
            }
            _ => prop_assert!(false, "IP version changed"),
        }
    }

    #[test]
    fn roce_emit_then_parse_is_identity(r in raw()) {
        let (repr, payload) = roce(&r);
        let mut buf = vec![0x5au8; 1300];
        let n = repr.emit(&mut buf, &payload).unwrap();
        prop_assert_eq!(n, repr.buffer_len(payload.len()));
        let p = RocePacket::new_checked(&buf[..n]).unwrap();
        prop_assert_eq!(RoceRepr::parse(&p).unwrap(), repr);
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert!(p.pad().iter().all(|&b| b == 0));
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_frame(&b);
        let _ = touch_all_views(&b);
        let _ = roce::wire::icrc::verify(&b, &b, &b);
    }

    #[test]
    fn mutated_frames_never_panic(
        r in raw(),
        p in path(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let (roce, payload) = roce(&r);
        let mut buf = vec![0u8; 1600];
        let n = emit_frame(&p, &roce, &payload, &mut buf).unwrap();
        let mut f = buf[..n].to_vec();
        for (i, v) in flips {
            let i = i.index(f.len());
            f[i] = v;
        }
        let f = &f[..cut.index(f.len() + 1)];
        let _ = parse_frame(f);
        let _ = roce::wire::frame::parse_frame_with_port(f, p.udp_dst_port);
        for off in [0, 14, 18, 22, 34, 42, 54, 62, 82] {
            if off <= f.len() {
                let _ = touch_all_views(&f[off..]);
            }
        }
    }

    #[test]
    fn psn_distance_is_antisymmetric(a in any::<u32>(), b in any::<u32>()) {
        let (a, b) = (Psn::new(a), Psn::new(b));
        let d = a.distance(b);
        prop_assert!((-(1 << 23)..(1 << 23)).contains(&d));
        if d != -(1 << 23) {
            prop_assert_eq!(b.distance(a), -d);
        }
        prop_assert_eq!(b.wrapping_add(d as u32), a);
    }

    /// A QP's kept header template writes the bytes a template built for the one frame writes
    /// (`emit_frame`), into buffers holding anything, with the payload copied by it or already
    /// in place anywhere, for frames of other lengths than the first, and after a change of
    /// path (congestion control setting other ECN/DSCP bits, spraying another UDP source port,
    /// or another address vector). The
    /// bytes themselves are pinned by the golden frames, the scapy tests and the Soft-RoCE
    /// captures.
    #[test]
    fn template_frames_equal_emit_frame(
        r in raw(),
        r2 in raw(),
        p in path(),
        q in path(),
        fill in any::<u8>(),
        short in 0..64usize,
        shift in 1..40usize,
    ) {
        let (roce, payload) = roce(&r);
        let (roce2, payload2) = self::roce(&r2);
        let mut want = vec![0xa5u8; 1600];
        let n = emit_frame(&p, &roce, &payload, &mut want).unwrap();
        let mut slot = None;
        let t = FrameTemplate::for_path(&mut slot, &p).unwrap();
        prop_assert_eq!(t.bth_offset(), p.bth_offset());
        let mut got = vec![fill; 1600];
        prop_assert_eq!(t.emit(&roce, &payload, &mut got), Ok(n));
        prop_assert_eq!(&got[..n], &want[..n]);
        // The payload gathered into the frame first, where it goes or anywhere else.
        let at = p.bth_offset() + roce.header_len();
        for from in [at, at.saturating_sub(shift), at + shift] {
            let mut got = vec![fill; 1700];
            got[from..from + payload.len()].copy_from_slice(&payload);
            let range = from..from + payload.len();
            prop_assert_eq!(t.emit_around_payload(&roce, range, &mut got), Ok(n));
            prop_assert_eq!(&got[..n], &want[..n]);
        }
        // Too short a buffer: the same error.
        let mut a = vec![0u8; n.saturating_sub(short)];
        let mut b = a.clone();
        prop_assert_eq!(t.emit(&roce, &payload, &mut a), emit_frame(&p, &roce, &payload, &mut b));
        // Another path, then the first one with the second one's ECN and DSCP, then with its
        // UDP source port (a sprayed QP's next entropy: the port patched into the template),
        // then back.
        let mut p2 = p;
        p2.ecn = q.ecn;
        p2.dscp = q.dscp;
        let mut p3 = p2;
        p3.udp_src_port = q.udp_src_port;
        for path in [q, p2, p3, p2, p] {
            let t = FrameTemplate::for_path(&mut slot, &path).unwrap();
            prop_assert_eq!(t.path(), &path);
            for (roce, payload) in [(&roce, &payload), (&roce2, &payload2)] {
                let n = emit_frame(&path, roce, payload, &mut want).unwrap();
                prop_assert_eq!(t.emit(roce, payload, &mut got), Ok(n));
                prop_assert_eq!(&got[..n], &want[..n]);
            }
        }
    }

    #[test]
    fn short_output_buffers_are_errors(r in raw(), p in path(), short in 1..64usize) {
        let (roce, payload) = roce(&r);
        let need = frame_len(&p, &roce, payload.len());
        let mut buf = vec![0u8; need.saturating_sub(short)];
        prop_assert!(emit_frame(&p, &roce, &payload, &mut buf).is_err());
    }
}

fn parse_frame_with_dport(b: &[u8], port: u16) -> roce::wire::Frame<'_> {
    roce::wire::frame::parse_frame_with_port(b, port).unwrap()
}
