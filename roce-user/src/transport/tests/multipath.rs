//! The multipath extension in the QPs (docs/multipath.md; issue 19), step 2: the in-band
//! agreement. A QP that allows the extension towards one that does not (rxe, a NIC, a
//! roce-xdp QP with it off) puts exactly the same packets on the wire as today, but for the
//! offer bit, a BTH reserved bit receivers ignore (IBA 9.2); two QPs that both allow it agree.

use core::cell::RefCell;
use core::time::Duration;
use std::rc::Rc;

use proptest::prelude::*;

use super::*;
use crate::transport::multipath::MpState;
use crate::wire::multipath::MpBthFlags;

/// Where the BTH's `resv7` byte sits in the simulator's frames: Ethernet (14, no VLAN) +
/// IPv4 (20) + UDP (8) + BTH byte 8.
const RESV7_AT: usize = 14 + 20 + 8 + 8;

/// The frames the link saw, in order: who sent each and its bytes.
type Captured = Vec<(Side, Vec<u8>)>;
/// The completions of one side: work request id and status, in order.
type Wcs = Vec<(u64, WcStatus)>;

/// What a run did: every frame put on the link in order, the QPs' agreement states, and the
/// completions of both sides.
struct Run {
    frames: Captured,
    states: (MpState, MpState),
    wcs: (Wcs, Wcs),
}

/// Connects an RC QP on each side with the extension allowed as `allowed` says, over a link
/// with `loss` (so retries, NAKs and duplicates happen too), and runs a mixed workload both
/// ways: WRITEs, a SEND, a READ and a fetch-and-add from A, a SEND from B. Checks every byte.
fn run(seed: u64, allowed: (bool, bool), loss: f64) -> Run {
    run_hinted(seed, allowed, (false, false), loss)
}

/// [`run`] with each side's QP told out of band (`hinted`) that its peer allows the extension
/// ([`Device::set_multipath_peer`]).
fn run_hinted(seed: u64, allowed: (bool, bool), hinted: (bool, bool), loss: f64) -> Run {
    let link = Link {
        loss,
        ..Link::default()
    };
    let mut p = Pair::new(seed, DeviceConfig::default(), link);
    let frames: Rc<RefCell<Captured>> = Rc::default();
    let sink = Rc::clone(&frames);
    p.filter = Some(Box::new(move |side, f| {
        sink.borrow_mut().push((side, f.to_vec()));
        true
    }));
    let cfg = RcConfig {
        psn_a: 0x10,
        ..RcConfig::default()
    };
    let mk = |d: &mut Device, allowed: bool, hinted: bool| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(cfg.cq_depth).unwrap();
        let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
        d.set_multipath(qpn, allowed).unwrap();
        if hinted {
            d.set_multipath_peer(qpn).unwrap();
        }
        (pd, cq, qpn)
    };
    let (pda, cqa, qa) = mk(&mut p.a, allowed.0, hinted.0);
    let (pdb, cqb, qb) = mk(&mut p.b, allowed.1, hinted.1);
    let (psn_a, psn_b) = (Psn::new(cfg.psn_a), Psn::new(cfg.psn_a + 0x1000));
    bring_up(&mut p.a, qa, Side::A, qb, psn_a, psn_b, &cfg);
    bring_up(&mut p.b, qb, Side::B, qa, psn_b, psn_a, &cfg);
    assert_eq!(
        p.a.set_multipath(qa, true),
        Err(DeviceError::InvalidState(QpState::Rts)),
        "chosen before RTR only"
    );
    assert_eq!(
        p.a.set_multipath_peer(qa),
        Err(DeviceError::InvalidState(QpState::Rts)),
        "hinted before RTR only"
    );

    let src: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let ma = p.a.reg_mr(pda, src.clone(), 0x1000, Access::all()).unwrap();
    let mut b_mem = vec![0u8; 3 * 8192];
    b_mem[2 * 8192..2 * 8192 + 8].copy_from_slice(&40u64.to_ne_bytes());
    let b_src: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    b_mem[8192..8192 + 3000].copy_from_slice(&b_src);
    let mb = p.b.reg_mr(pdb, b_mem, 0x10_0000, Access::all()).unwrap();
    let sg = |addr, length, lkey| vec![Sge { addr, length, lkey }];
    // B receives one SEND from A; A receives one from B (into A's second half).
    p.b.post_recv(
        qb,
        RecvWr {
            wr_id: 900,
            sg_list: sg(0x10_0000 + 8192 + 4096, 4096, mb.lkey),
        },
    )
    .unwrap();
    p.a.post_recv(
        qa,
        RecvWr {
            wr_id: 901,
            sg_list: sg(0x1000 + 4096, 4096, ma.lkey),
        },
    )
    .unwrap();
    for i in 0..4u64 {
        let wr = SendWr::new(
            i,
            write(0x10_0000 + i * 2048, mb.rkey),
            sg(0x1000, 2048, ma.lkey),
        );
        p.a.post_send(qa, wr).unwrap();
    }
    p.a.post_send(qa, SendWr::send(4, sg(0x1000, 3000, ma.lkey)))
        .unwrap();
    // READ B's 3000 bytes into A's second half, then add 2 to B's counter.
    p.a.post_send(
        qa,
        SendWr::new(
            5,
            read(0x10_0000 + 8192, mb.rkey),
            sg(0x1000 + 4096, 3000, ma.lkey),
        ),
    )
    .unwrap();
    p.a.post_send(
        qa,
        SendWr::new(
            6,
            SendOp::FetchAdd {
                remote_addr: 0x10_0000 + 2 * 8192,
                rkey: mb.rkey,
                add: 2,
            },
            sg(0x1000 + 8184, 8, ma.lkey),
        ),
    )
    .unwrap();
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    assert!(p.drive_until(2_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(cqa)).map(|w| (w.wr_id, w.status)));
        wb.extend(core::iter::from_fn(|| p.b.poll_cq(cqb)).map(|w| (w.wr_id, w.status)));
        wa.len() == 7 && wb.len() == 1
    }));
    // Then B answers with a SEND of its own, which A's receive (after the READ) takes.
    p.b.post_send(qb, SendWr::send(10, sg(0x10_0000 + 8192, 100, mb.lkey)))
        .unwrap();
    assert!(p.drive_until(2_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(cqa)).map(|w| (w.wr_id, w.status)));
        wb.extend(core::iter::from_fn(|| p.b.poll_cq(cqb)).map(|w| (w.wr_id, w.status)));
        wa.len() == 8 && wb.len() == 2
    }));
    assert!(p.drive(1_000_000), "idle afterwards");
    let a_bytes = p.a.mrs().bytes(ma.lkey).unwrap();
    let b_bytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in 0..4 {
        assert_eq!(
            &b_bytes[i * 2048..(i + 1) * 2048],
            &src[..2048],
            "WRITE {i}"
        );
    }
    assert_eq!(
        &b_bytes[8192 + 4096..8192 + 4096 + 3000],
        &src[..3000],
        "SEND"
    );
    assert_eq!(
        &a_bytes[4096..4096 + 100],
        &b_src[..100],
        "B's SEND over the READ's start"
    );
    assert_eq!(&a_bytes[4096 + 100..4096 + 3000], &b_src[100..], "READ");
    assert_eq!(&a_bytes[8184..8192], &40u64.to_ne_bytes(), "fetched");
    assert_eq!(
        &b_bytes[2 * 8192..2 * 8192 + 8],
        &42u64.to_ne_bytes(),
        "added"
    );
    let states = (
        p.a.qp(qa).unwrap().multipath(),
        p.b.qp(qb).unwrap().multipath(),
    );
    p.filter = None;
    let frames = frames.take();
    Run {
        frames,
        states,
        wcs: (wa, wb),
    }
}

/// `frames` are `plain`'s frames but for the offer bit on the frames of each side in `offer`
/// (and the ICRC that covers it): the same count, order, length and bytes, every frame with a
/// good ICRC, and on the offering sides' frames exactly bit 0 of `resv7` set, nothing else.
fn assert_plain_but_offer(
    plain: &[(Side, Vec<u8>)],
    frames: &[(Side, Vec<u8>)],
    offer: (bool, bool),
) {
    assert_eq!(plain.len(), frames.len(), "the same number of frames");
    for (i, ((s0, f0), (s1, f1))) in plain.iter().zip(frames).enumerate() {
        assert_eq!(s0, s1, "frame {i}: same sender");
        assert_eq!(f0.len(), f1.len(), "frame {i}: same length");
        let pf = parse_frame(f1).unwrap();
        assert!(pf.icrc_ok, "frame {i}: ICRC");
        assert!(parse_frame(f0).unwrap().icrc_ok);
        let offers = match s1 {
            Side::A => offer.0,
            Side::B => offer.1,
        };
        let want_bit = if offers { MpBthFlags::OFFER.bits() } else { 0 };
        assert_eq!(
            f0[RESV7_AT] & 0x7f,
            0,
            "frame {i}: plain RoCE sends resv7 = 0"
        );
        assert_eq!(f1[RESV7_AT] ^ f0[RESV7_AT], want_bit, "frame {i}: resv7");
        assert_eq!(pf.roce.bth.resv7, want_bit, "frame {i}: parsed resv7");
        let n = f0.len() - 4;
        let differ: Vec<usize> = (0..n).filter(|&j| f0[j] != f1[j]).collect();
        let want: Vec<usize> = if offers { vec![RESV7_AT] } else { vec![] };
        assert_eq!(differ, want, "frame {i}: nothing but the offer bit changes");
        if !offers {
            assert_eq!(f0[n..], f1[n..], "frame {i}: same ICRC");
        }
    }
}

/// A QP that allows the extension, facing one that does not: the same packets as two plain
/// QPs, bit for bit, but for the offer bit on its own frames (and their ICRC); it never turns
/// the extension on, its peer never sees a trailer. Over a lossy link too, so
/// retransmissions, NAKs and duplicate requests are compared as well.
#[test]
fn offering_towards_a_plain_peer_changes_only_the_offer_bit() {
    let clean = run(1, (false, false), 0.0).frames.len();
    for (seed, loss) in [(1, 0.0), (7, 0.05), (19, 0.1)] {
        let plain = run(seed, (false, false), loss);
        assert_eq!(plain.states, (MpState::Disabled, MpState::Disabled));
        if loss > 0.0 {
            assert!(plain.frames.len() > clean, "losses made retransmissions");
        }
        for allowed in [(true, false), (false, true)] {
            let r = run(seed, allowed, loss);
            assert_eq!(r.wcs, plain.wcs, "the same completions");
            let (sa, sb) = r.states;
            let offering = |on| {
                if on {
                    MpState::Offering
                } else {
                    MpState::Disabled
                }
            };
            assert_eq!((sa, sb), (offering(allowed.0), offering(allowed.1)));
            assert_plain_but_offer(&plain.frames, &r.frames, allowed);
        }
    }
}

/// Two QPs that both allow the extension agree in band: both end on, the same completions
/// and bytes as plain RoCE (checked in `run`), and trailers on the wire once agreed; a
/// frame before the agreement is the plain run's but for the offer bit.
#[test]
fn two_offering_qps_agree() {
    for (seed, loss) in [(3, 0.0), (5, 0.05)] {
        let plain = run(seed, (false, false), loss);
        let r = run(seed, (true, true), loss);
        assert_eq!(r.states, (MpState::On, MpState::On));
        assert_eq!(r.wcs, plain.wcs);
        assert_plain_but_offer(&plain.frames[..1], &r.frames[..1], (true, true));
        let trailers = r
            .frames
            .iter()
            .filter(|(_, f)| {
                let b = parse_frame(f).unwrap().roce.bth.resv7;
                MpBthFlags::from_resv7(b).contains(MpBthFlags::TRAILER)
            })
            .count();
        assert!(trailers > 0, "trailers once agreed");
    }
}

/// A packet whose trailer does not hold up is never taken for data: an offering QP turns
/// the extension on (the peer offered) but drops and counts a SEND whose last 28 bytes are no
/// placement trailer, placing nothing and answering nothing; the next plain packet (offer bit
/// only) is handled as today. A QP that does not allow the extension ignores the bits, as
/// IBA 9.2 (and rxe) ignore reserved bits.
#[test]
fn a_trailer_is_dropped_not_placed() {
    let config = DeviceConfig {
        multipath: true,
        ..DeviceConfig::default()
    };
    let mut m = h_on(&RcConfig::default(), config);
    assert_eq!(m.d.qp(m.qpn).unwrap().multipath(), MpState::Offering);
    m.recv(1, 0, 64);
    let mut trailer = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    trailer.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
    m.rx(trailer, &[7u8; 64]);
    assert_eq!(m.d.qp(m.qpn).unwrap().multipath(), MpState::On);
    assert_eq!(m.c().rx_dropped, 1);
    assert!(m.tx().is_empty(), "no answer");
    assert!(m.wcs().is_empty(), "nothing placed");
    assert_eq!(m.mem(0, 64), vec![0u8; 64]);
    let mut plain = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    plain.bth.resv7 = MpBthFlags::OFFER.bits();
    m.rx(plain, &[9u8; 64]);
    let out = m.tx();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].0.bth.resv7,
        MpBthFlags::OFFER.bits() | MpBthFlags::HOLD.bits(),
        "the ACK offers (and says the QP holds READs and atomics)"
    );
    assert_eq!(m.wcs()[0].wr_id, 1);
    assert_eq!(m.mem(0, 64), vec![9u8; 64]);

    let mut h = h();
    h.recv(1, 0, 64);
    let mut trailer = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    trailer.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
    h.rx(trailer, &[7u8; 64]);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::Disabled);
    assert_eq!(h.c().rx_dropped, 0);
    let out = h.tx();
    assert_eq!(out[0].0.bth.resv7, 0, "a plain QP sends resv7 = 0");
    assert_eq!(h.wcs()[0].wr_id, 1);
}

// ------------------------------------------------------------ out-of-order placement

use crate::wire::multipath::{PlacementFlags, PlacementTrailer, Ssn, sack};
use roce_common::opcode::{Operation, Position};

/// A harness QP that allows the extension (it turns on with the first packet of the peer,
/// which the tests send with both bits).
fn h_mp() -> H {
    let config = DeviceConfig {
        multipath: true,
        ..DeviceConfig::default()
    };
    h_on(&RcConfig::default(), config)
}

/// Packet `i` of a message of `len` bytes starting at PSN `first` (MTU 1024), as the peer
/// sends it with the extension on: its opcode by position, its data (`data[i*1024..]`)
/// followed by the placement trailer, both multipath bits.
fn mp_pkt(
    kind: Operation,
    first: u32,
    i: u32,
    data: &[u8],
    (va, rkey, ssn): (u64, RKey, u32),
) -> (RoceRepr, Vec<u8>) {
    let len = data.len() as u32;
    let npkts = len.div_ceil(1024).max(1);
    let pos = crate::transport::qp::position_of(i, npkts);
    let op = match (kind, pos) {
        (Operation::Write, Position::First) => Opcode::RC_RDMA_WRITE_FIRST,
        (Operation::Write, Position::Middle) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (Operation::Write, Position::Last) => Opcode::RC_RDMA_WRITE_LAST,
        (Operation::Write, Position::Only) => Opcode::RC_RDMA_WRITE_ONLY,
        (_, Position::First) => Opcode::RC_SEND_FIRST,
        (_, Position::Middle) => Opcode::RC_SEND_MIDDLE,
        (_, Position::Last) => Opcode::RC_SEND_LAST,
        (_, Position::Only) => Opcode::RC_SEND_ONLY,
    };
    let mut h = hdr(op, first + i);
    if kind == Operation::Write && matches!(pos, Position::First | Position::Only) {
        h = with_reth(h, va, rkey, len);
    }
    h.bth.ack_req = matches!(pos, Position::Last | Position::Only);
    h.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
    let off = (i * 1024) as usize;
    let end = (off + 1024).min(data.len());
    let t = PlacementTrailer {
        first_psn: Psn::new(first),
        flags: if kind == Operation::Write {
            PlacementFlags::WRITE
        } else {
            PlacementFlags::SEND
        },
        offset: off as u32,
        length: len,
        va: if kind == Operation::Write { va } else { 0 },
        rkey: if kind == Operation::Write {
            rkey
        } else {
            RKey::new(0)
        },
        ssn: Ssn::new(ssn),
    };
    let mut payload = data[off..end].to_vec();
    payload.extend_from_slice(&t.to_bytes());
    (h, payload)
}

/// The ACKs the harness QP sent: (syndrome, PSN, PSNs its SACK marks).
fn sacks(h: &mut H) -> Vec<(AethSyndrome, u32, Vec<u32>)> {
    h.tx()
        .into_iter()
        .map(|(r, payload)| {
            let aeth = r.aeth.unwrap();
            let marked = if MpBthFlags::from_resv7(r.bth.resv7).contains(MpBthFlags::TRAILER) {
                let (rest, s) = sack::split(&payload).unwrap();
                assert!(rest.is_empty());
                s.bitmap.psns(r.bth.psn).map(Psn::value).collect()
            } else {
                assert!(payload.is_empty());
                Vec::new()
            };
            (aeth.syndrome, r.bth.psn.value(), marked)
        })
        .collect()
}

/// A WRITE of three packets arriving last, first, middle, then the middle again with other
/// bytes: each packet lands at its offset on arrival, the duplicate is not placed again, and
/// every ACK carries the cumulative PSN and the SACK of what arrived beyond it.
#[test]
fn write_packets_place_out_of_order_exactly_once() {
    let mut h = h_mp();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 11 + 3) as u8).collect();
    let m = (BASE + 0x100, h.mr.rkey, 0);
    let pkt = |i| mp_pkt(Operation::Write, RQ_PSN, i, &data, m);
    let (r, p) = pkt(2);
    h.rx(r, &p);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::On);
    assert_eq!(
        h.mem(0x100 + 2048, 952),
        &data[2048..],
        "the last packet, first"
    );
    assert_eq!(sacks(&mut h), [(ACK, RQ_PSN - 1, vec![RQ_PSN + 2])]);
    let (r, p) = pkt(0);
    h.rx(r, &p);
    assert_eq!(h.mem(0x100, 1024), &data[..1024]);
    assert_eq!(
        sacks(&mut h),
        [(ACK, RQ_PSN, vec![RQ_PSN + 2])],
        "expected, but packets are held: acknowledged at once"
    );
    let (r, p) = pkt(1);
    h.rx(r, &p);
    assert_eq!(h.mem(0x100, 3000), data);
    assert_eq!(
        sacks(&mut h),
        [(ACK, RQ_PSN + 2, vec![])],
        "the hole filled: cumulative"
    );
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN + 3));
    let other = vec![0xeeu8; 3000];
    let (r, p) = mp_pkt(Operation::Write, RQ_PSN, 1, &other, m);
    h.rx(r, &p);
    assert_eq!(h.mem(0x100, 3000), data, "a duplicate is never placed");
    assert_eq!(
        sacks(&mut h),
        [(ACK, RQ_PSN + 2, vec![])],
        "but acknowledged"
    );
    assert_eq!(h.c().duplicate_request, 1);
    assert_eq!(h.c().ooo_placed, 1, "the last packet, beyond the hole");
    assert_eq!(h.state(), QpState::Rts);
    assert!(h.wcs().is_empty(), "a WRITE completes no receive");
}

/// Two SENDs whose packets arrive in reverse order: each lands in the receive WQE its send
/// sequence number names, and the receives complete in order, once, with their lengths and
/// the second one's immediate data.
#[test]
fn sends_place_into_their_receive_wqes_and_complete_in_order() {
    let mut h = h_mp();
    h.recv(1, 0, 2048);
    h.recv(2, 4096, 2048);
    let a: Vec<u8> = (0..1500u32).map(|i| (i * 3) as u8).collect();
    let b: Vec<u8> = (0..600u32).map(|i| (i * 5 + 1) as u8).collect();
    let (mut rb, pb) = mp_pkt(Operation::Send, RQ_PSN + 2, 0, &b, (0, RKey::new(0), 1));
    rb.bth.opcode = Opcode::RC_SEND_ONLY_WITH_IMMEDIATE;
    rb.immdt = Some(ImmDtRepr { imm: 0x1234 });
    h.rx(rb, &pb);
    assert_eq!(h.mem(4096, 600), b, "placed at once");
    assert!(h.wcs().is_empty(), "not completed before the first SEND");
    for i in [1, 0] {
        let (r, p) = mp_pkt(Operation::Send, RQ_PSN, i, &a, (0, RKey::new(0), 0));
        h.rx(r, &p);
    }
    let wcs = h.wcs();
    let got: Vec<_> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.imm))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, 1500, 0),
            (2, WcStatus::Success, 600, 0x1234)
        ]
    );
    assert!(wcs[1].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(h.mem(0, 1500), a);
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN + 3));
    let acks = sacks(&mut h);
    assert_eq!(acks.last(), Some(&(ACK, RQ_PSN + 2, vec![])));
    assert_eq!(h.c().rdma_recvs, 2);
}

/// A SEND for a receive WQE not posted: beyond a hole it is dropped without an answer (an
/// RNR NAK would acknowledge the hole); at the expected PSN it gets the RNR NAK, as today.
#[test]
fn a_send_without_its_receive_wqe_is_dropped_beyond_a_hole_and_rnr_nakked_in_order() {
    let mut h = h_mp();
    let a = vec![5u8; 100];
    let (r, p) = mp_pkt(Operation::Send, RQ_PSN + 1, 0, &a, (0, RKey::new(0), 1));
    h.rx(r, &p);
    assert!(h.tx().is_empty());
    assert_eq!(h.c().out_of_buffer, 1);
    let (r, p) = mp_pkt(Operation::Send, RQ_PSN, 0, &a, (0, RKey::new(0), 0));
    h.rx(r, &p);
    let acks = h.acks();
    assert_eq!(acks.len(), 1);
    assert!(matches!(acks[0], (AethSyndrome::RnrNak { .. }, RQ_PSN)));
    h.recv(1, 0, 128);
    h.recv(2, 128, 128);
    for psn in [RQ_PSN + 1, RQ_PSN] {
        let (r, p) = mp_pkt(Operation::Send, psn, 0, &a, (0, RKey::new(0), psn - RQ_PSN));
        h.rx(r, &p);
    }
    let ids: Vec<u64> = h.wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2]);
}

/// A WRITE beyond a hole under a bad R_Key: a class C error, NAKed at the expected PSN (a
/// NAK acknowledges every PSN before it, and the hole did not arrive), the QP in ERR; a
/// trailer that does not parse is dropped and counted.
#[test]
fn an_access_error_out_of_order_naks_the_expected_psn() {
    let mut h = h_mp();
    let (r, p) = mp_pkt(
        Operation::Write,
        RQ_PSN,
        0,
        &[1u8; 64],
        (BASE, h.mr.rkey, 0),
    );
    h.rx(r, &p[..p.len() - 1]);
    assert_eq!(h.c().rx_dropped, 1, "a truncated trailer");
    assert!(h.tx().is_empty());
    let bad = RKey::new(h.mr.rkey.value() ^ 0x100);
    let (r, p) = mp_pkt(Operation::Write, RQ_PSN + 1, 0, &[1u8; 64], (BASE, bad, 0));
    h.rx(r, &p);
    let acks = h.acks();
    assert_eq!(acks, [(Nak(RemoteAccessError), RQ_PSN)]);
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.mem(0, 64), vec![0u8; 64]);
}

/// The requester takes an ACK with a SACK trailer as the cumulative ACK it is: the SEND it
/// covers completes.
#[test]
fn an_ack_with_a_sack_trailer_completes_what_it_covers() {
    let mut h = h_mp();
    h.post(1, SendOp::Send, 0, 100);
    let sent = h.tx();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.bth.resv7, MpBthFlags::OFFER.bits(), "offering");
    let mut ack = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1);
    ack.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
    let sack = crate::wire::multipath::SackTrailer {
        bitmap: crate::wire::multipath::SackBitmap(0),
        held: 0,
    };
    h.rx(ack, &sack.to_bytes());
    let wcs = h.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::On);
}

/// A NAK without the offer bit while selective repeat runs (a responder that answers as a
/// plain QP again: it lost its state) turns the extension off for good: the requester goes
/// back N from the NAK's PSN with plain packets (no trailer, no TRAILER bit), and plain ACKs
/// complete every WR. A sequence error NAK that still offers (a loss in the first, plain
/// window) changes nothing.
#[test]
fn a_sequence_error_nak_in_selective_repeat_falls_back_to_plain_go_back_n() {
    let mut h = h_mp();
    // A sequence error in the first, plain window: not a reason to fall back.
    h.post(1, SendOp::Send, 0, 100);
    assert_eq!(h.tx().len(), 1);
    let mut nak = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, Nak(PsnSequenceError), 0);
    nak.bth.resv7 = MpBthFlags::OFFER.bits();
    h.rx(nak, &[]);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::On);
    let resent = h.tx();
    assert_eq!(resent.len(), 1, "the plain window goes back N");
    // The peer answers with a SACK: selective repeat from the next WR on.
    let mut ack = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1);
    ack.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
    let sack = crate::wire::multipath::SackTrailer {
        bitmap: crate::wire::multipath::SackBitmap(0),
        held: 0,
    };
    h.rx(ack, &sack.to_bytes());
    assert_eq!(h.wcs().len(), 1);
    for id in 2..=4 {
        h.post(id, SendOp::Send, 0, 100);
    }
    let sent = h.tx();
    assert_eq!(sent.len(), 3);
    assert!(
        sent.iter()
            .all(|(r, _)| MpBthFlags::from_resv7(r.bth.resv7).contains(MpBthFlags::OFFER_TRAILER)),
        "selective repeat sends trailers"
    );
    // The responder lost its state: a plain sequence error NAK (resv7 0) at the second.
    let nak = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, Nak(PsnSequenceError), 2);
    h.rx(nak, &[]);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::FellBack);
    assert_eq!(
        h.wcs().len(),
        1,
        "the NAK acknowledged the WR before its PSN"
    );
    let resent = h.tx();
    let psns: Vec<u32> = resent.iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(psns, vec![SQ_PSN + 2, SQ_PSN + 3], "go back N from the NAK");
    for (r, payload) in &resent {
        assert_eq!(
            r.bth.resv7 & MpBthFlags::TRAILER.bits(),
            0,
            "no trailer after the fall-back"
        );
        assert_eq!(payload.len(), 100, "plain payload");
    }
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    let wcs = h.wcs();
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![3, 4]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    // And it stays off: new WRs go plain.
    h.post(5, SendOp::Send, 0, 100);
    let sent = h.tx();
    assert_eq!(sent[0].0.bth.resv7 & MpBthFlags::TRAILER.bits(), 0);
}

/// The in-order responder and the reassembly never share a message: in the middle of a plain
/// message, a trailer beyond the expected PSN is dropped and one at it goes through the
/// in-order responder (its trailer set aside); a plain packet while the reassembly holds
/// packets is dropped; once the reassembly is idle, a plain packet hands the receive side
/// back.
#[test]
fn plain_and_placed_packets_never_share_a_message() {
    let mut h = h_mp();
    let data: Vec<u8> = (0..3072u32).map(|i| (i * 7) as u8).collect();
    let m = (BASE, h.mr.rkey, 0);
    let plain = |i: u32| {
        let (mut r, p) = mp_pkt(Operation::Write, RQ_PSN, i, &data, m);
        r.bth.resv7 = MpBthFlags::OFFER.bits();
        let n = p.len() - crate::wire::multipath::placement::HEADER_LEN;
        (r, p[..n].to_vec())
    };
    // A plain three-packet WRITE: its first packet in order.
    let (r, p) = plain(0);
    h.rx(r, &p);
    assert_eq!(h.mem(0, 1024), &data[..1024]);
    let (r, p) = mp_pkt(Operation::Write, RQ_PSN, 2, &data, m);
    h.rx(r, &p);
    assert_eq!(h.c().rx_dropped, 1, "a trailer beyond, in a plain message");
    assert_eq!(h.mem(2048, 1024), vec![0u8; 1024]);
    let (r, p) = mp_pkt(Operation::Write, RQ_PSN, 1, &data, m);
    h.rx(r, &p);
    assert_eq!(
        h.mem(0, 2048),
        &data[..2048],
        "a trailer at the expected PSN: in order"
    );
    let (r, p) = plain(2);
    h.rx(r, &p);
    assert_eq!(h.mem(0, 3072), data, "the plain message ends in order");
    h.tx();
    let data = data[..2048].to_vec();
    // Now a placed WRITE with a hole: a plain packet meanwhile is dropped.
    let first = RQ_PSN + 3;
    let m2 = (BASE + 4096, h.mr.rkey, 0);
    let (r, p) = mp_pkt(Operation::Write, first, 1, &data, m2);
    h.rx(r, &p);
    let (mut r, p) = mp_pkt(Operation::Write, first, 0, &data, m2);
    r.bth.resv7 = MpBthFlags::OFFER.bits();
    h.rx(r, &p[..1024]);
    assert_eq!(
        h.c().rx_dropped,
        2,
        "no plain packet while packets are held"
    );
    assert_eq!(h.mem(4096, 1024), vec![0u8; 1024]);
    let (r, p) = mp_pkt(Operation::Write, first, 0, &data, m2);
    h.rx(r, &p);
    assert_eq!(h.mem(4096, 2048), data);
    h.tx();
    // Idle again: a plain SEND is handled in order.
    h.recv(9, 8192, 64);
    let mut s = hdr(Opcode::RC_SEND_ONLY, first + 2);
    s.bth.resv7 = MpBthFlags::OFFER.bits();
    s.bth.ack_req = true;
    h.rx(s, &[3u8; 64]);
    assert_eq!(h.wcs().iter().map(|w| w.wr_id).collect::<Vec<_>>(), [9]);
    assert_eq!(h.acks(), [(ACK, first + 2)]);
    assert_eq!(h.c().rx_dropped, 2);
}

// ------------------------------------------------------------ selective repeat, end to end

/// What a stream run did: A's request frames (PSN, whether it carried a trailer), frames the
/// link lost, and A's selective-repeat counters.
struct Stream {
    requests: Vec<(u32, bool)>,
    lost: u64,
    sr: Option<crate::transport::multipath::SrCounters>,
    states: (MpState, MpState),
}

impl Stream {
    /// Request packets sent more than once among the PSNs from `from` on (PSNs counted from
    /// the run's first, so runs with the same start compare the same range).
    fn resent_from(&self, from: usize) -> usize {
        let start = self.requests.first().map_or(0, |r| r.0);
        let ours: Vec<u32> = self
            .requests
            .iter()
            .map(|r| r.0.wrapping_sub(start) & 0xff_ffff)
            .filter(|&d| d as usize >= from)
            .collect();
        let mut psns = ours.clone();
        psns.sort_unstable();
        psns.dedup();
        ours.len() - psns.len()
    }

    /// Request packets sent more than once.
    fn resent(&self) -> usize {
        self.resent_from(0)
    }

    /// Where (in PSNs from the first) the first request with a trailer went.
    fn first_trailer(&self) -> Option<usize> {
        let start = self.requests.first()?.0;
        let r = self.requests.iter().find(|r| r.1)?;
        Some((r.0.wrapping_sub(start) & 0xff_ffff) as usize)
    }
}

/// `n` messages from A to B over `link`, both QPs allowing the extension as `allowed`: WRITEs
/// of 3000 bytes, every fifth a SEND into B's next receive, every seventh a WRITE with
/// immediate, and (with `reads`) every eleventh a READ of what an earlier WRITE put at B and
/// every thirteenth a fetch-and-add of 1 on a counter at B. Every WR completes once,
/// successfully and in order at both ends, every byte checked, every atomic's fetched value
/// and the counter too (each atomic executed once, in order).
fn stream(seed: u64, link: Link, allowed: (bool, bool), n: u64, reads: bool) -> Stream {
    stream_hinted(seed, link, allowed, (false, false), n, reads)
}

/// [`stream`] with each side's QP told out of band (`hinted`) that its peer allows the
/// extension ([`Device::set_multipath_peer`]).
fn stream_hinted(
    seed: u64,
    link: Link,
    allowed: (bool, bool),
    hinted: (bool, bool),
    n: u64,
    reads: bool,
) -> Stream {
    let mut p = Pair::new(seed, DeviceConfig::default(), link);
    let requests: Rc<RefCell<Vec<(u32, bool)>>> = Rc::default();
    let sink = Rc::clone(&requests);
    p.filter = Some(Box::new(move |side, f| {
        if side == Side::A
            && let Ok(pf) = parse_frame(f)
            && !pf.roce.bth.opcode.info().is_some_and(|i| i.is_response())
        {
            // In selective repeat: a SEND or WRITE with its trailer, a READ or atomic held.
            let f = MpBthFlags::from_resv7(pf.roce.bth.resv7);
            let t = f.contains(MpBthFlags::TRAILER) || f.contains(MpBthFlags::HOLD);
            sink.borrow_mut().push((pf.roce.bth.psn.value(), t));
        }
        true
    }));
    let cfg = RcConfig {
        timeout: 4,
        ..RcConfig::default()
    };
    let mk = |d: &mut Device, allowed: bool, hinted: bool| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(cfg.cq_depth).unwrap();
        let init = QpInit {
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..QpCap::default()
            },
            ..QpInit::new(QpType::Rc, pd, cq)
        };
        let qpn = d.create_qp(init).unwrap();
        d.set_multipath(qpn, allowed).unwrap();
        if hinted {
            d.set_multipath_peer(qpn).unwrap();
        }
        (pd, cq, qpn)
    };
    let (pda, cqa, qa) = mk(&mut p.a, allowed.0, hinted.0);
    let (pdb, cqb, qb) = mk(&mut p.b, allowed.1, hinted.1);
    let (psn_a, psn_b) = (
        Psn::new(cfg.psn_a),
        Psn::new(cfg.psn_a.wrapping_add(0x1000)),
    );
    bring_up(&mut p.a, qa, Side::A, qb, psn_a, psn_b, &cfg);
    bring_up(&mut p.b, qb, Side::B, qa, psn_b, psn_a, &cfg);
    const L: u64 = 3000;
    let src: Vec<u8> = (0..L as u32).map(|i| (i * 31 + 7) as u8).collect();
    let mut a_mem = vec![0; (L * (n + 1)) as usize];
    a_mem[..L as usize].copy_from_slice(&src);
    let ma = p.a.reg_mr(pda, a_mem, 0x1000, Access::all()).unwrap();
    // With `reads`, B's 8-byte counter after the messages, which every atomic adds 1 to.
    let counter = (L * n + 7) & !7;
    let mb =
        p.b.reg_mr(
            pdb,
            vec![0; (counter + 8) as usize],
            0x100_0000,
            Access::all(),
        )
        .unwrap();
    // (Not where a READ goes, nor just before one: a READ reads the slot before it.)
    let is_atomic = |i: u64| reads && i % 13 == 12 && !matches!(i % 11, 9 | 10);
    let mut atomics = 0u64;
    let sg = |addr, length, lkey| vec![Sge { addr, length, lkey }];
    let mut want_b = Vec::new();
    let mut recvs = 0u64;
    for i in 0..n {
        let at = 0x100_0000 + i * L;
        let op = if reads && i % 11 == 10 {
            read(0x100_0000 + (i - 1) * L, mb.rkey)
        } else if is_atomic(i) {
            atomics += 1;
            SendOp::FetchAdd {
                remote_addr: 0x100_0000 + counter,
                rkey: mb.rkey,
                add: 1,
            }
        } else if i % 5 == 4 {
            p.b.post_recv(
                qb,
                RecvWr {
                    wr_id: 10_000 + i,
                    sg_list: sg(at, L as u32, mb.lkey),
                },
            )
            .unwrap();
            recvs += 1;
            want_b.push(10_000 + i);
            SendOp::Send
        } else if i % 7 == 6 {
            p.b.post_recv(
                qb,
                RecvWr {
                    wr_id: 20_000 + i,
                    sg_list: vec![],
                },
            )
            .unwrap();
            recvs += 1;
            want_b.push(20_000 + i);
            SendOp::WriteWithImm {
                remote_addr: at,
                rkey: mb.rkey,
                imm: i as u32,
            }
        } else {
            write(at, mb.rkey)
        };
        let (local, len) = match op {
            SendOp::Read { .. } => (0x1000 + (i + 1) * L, L as u32),
            SendOp::FetchAdd { .. } => (0x1000 + (i + 1) * L, 8),
            _ => (0x1000, L as u32),
        };
        p.a.post_send(qa, SendWr::new(i, op, sg(local, len, ma.lkey)))
            .unwrap();
    }
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let done = p.drive_until(20_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(cqa)).map(|w| (w.wr_id, w.status)));
        wb.extend(core::iter::from_fn(|| p.b.poll_cq(cqb)).map(|w| (w.wr_id, w.status)));
        wa.len() as u64 == n && wb.len() as u64 == recvs
    });
    assert!(done, "{:?} a {} b {}", p.stats, wa.len(), wb.len());
    let want: Vec<(u64, WcStatus)> = (0..n).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(wa, want, "every WR once, in order");
    let want_b: Vec<(u64, WcStatus)> = want_b.iter().map(|&i| (i, WcStatus::Success)).collect();
    assert_eq!(wb, want_b, "every receive once, in order");
    assert!(p.drive(1_000_000), "idle afterwards");
    let bytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in 0..n as usize {
        if (reads && i % 11 == 10) || is_atomic(i as u64) {
            continue;
        }
        assert_eq!(
            &bytes[i * L as usize..(i + 1) * L as usize],
            &src[..],
            "message {i}"
        );
    }
    if reads {
        let a_bytes = p.a.mrs().bytes(ma.lkey).unwrap();
        for i in (10..n as usize).step_by(11) {
            let at = (i + 1) * L as usize;
            assert_eq!(&a_bytes[at..at + L as usize], &src[..], "READ {i}");
        }
        // Each atomic executed once, in order: the k-th fetched k, the counter holds all.
        let c = counter as usize;
        assert_eq!(&bytes[c..c + 8], &atomics.to_ne_bytes(), "the counter");
        for (k, i) in (0..n).filter(|&i| is_atomic(i)).enumerate() {
            let at = ((i + 1) * L) as usize;
            assert_eq!(
                &a_bytes[at..at + 8],
                &(k as u64).to_ne_bytes(),
                "atomic {i} fetched"
            );
        }
    }
    let states = (
        p.a.qp(qa).unwrap().multipath(),
        p.b.qp(qb).unwrap().multipath(),
    );
    let sr = p.a.qp(qa).unwrap().selective_repeat();
    if let Some(sr) = sr
        && !reads
    {
        let c = p.a.qp(qa).unwrap().counters();
        // Each resend the SR state counts went out and was counted on the QP (a resend
        // whose WR completed meanwhile is skipped by the requester, so at most). Without
        // READs the requester enters the mode once; a READ makes it leave and enter again
        // with a new SR state, whose counters start from 0 while the QP's go on.
        assert!(c.selective_retransmits <= sr.selective_retransmits);
        assert!(c.sack_received >= sr.sack_received);
    }
    p.filter = None;
    Stream {
        requests: requests.take(),
        lost: p.stats.lost,
        sr,
        states,
    }
}

/// Both ends on, a clean link: the requester sends its SENDs and WRITEs with placement
/// trailers and resends nothing; the wire carries trailers.
#[test]
fn trailers_flow_and_a_clean_link_resends_nothing() {
    let s = stream(11, Link::default(), (true, true), 60, false);
    assert_eq!(s.states, (MpState::On, MpState::On));
    assert_eq!(s.resent(), 0);
    // The first window goes plain, before the peer's answer comes back; from then on every
    // request carries its trailer.
    let first = s.requests.iter().position(|r| r.1).expect("trailers");
    assert!(s.requests[first..].iter().all(|r| r.1));
    let sr = s.sr.expect("in selective-repeat mode");
    assert_eq!(sr.selective_retransmits, 0);
}

/// 1 % random loss (the row) on the one path: go-back-N resends whole windows per
/// loss, selective repeat about one packet per loss; every byte checked in both.
#[test]
fn one_percent_loss_resends_about_one_packet_per_loss() {
    let link = Link {
        loss: 0.01,
        latency: Duration::from_micros(20),
        ..Link::default()
    };
    // Compared over the same PSNs: from the selective run's first packet with a trailer on
    // (the first window goes plain, before the peer's answer; a loss there is go-back-N's).
    let (mut gbn, mut sel, mut lost, mut all) = (0, 0, 0, 0);
    for seed in [1, 2, 3] {
        let g = stream(seed, link, (false, false), 200, false);
        let s = stream(seed, link, (true, true), 200, false);
        assert_eq!(s.states, (MpState::On, MpState::On));
        let from =
            s.first_trailer().expect("trailers") + crate::transport::qp::MAX_UNACKED_PSNS as usize;
        gbn += g.resent_from(from);
        sel += s.resent_from(from);
        all += s.resent();
        lost += s.lost;
    }
    eprintln!(
        "go-back-N resent {gbn}, selective resent {sel} ({all} in all), selective run lost {lost}"
    );
    assert!(lost > 0);
    assert!(
        sel as u64 <= 2 * lost + 3,
        "about one resend per loss: {sel} for {lost}"
    );
    assert!(gbn >= 4 * sel.max(1), "go-back-N {gbn} vs selective {sel}");
}

/// Both QPs told out of band that the peer allows the extension (`roce perf`'s and `roce
/// pingpong`'s exchanges, docs/multipath.md "Hints out of band"): the extension is on before
/// any packet, the very first request carries its placement trailer, and a clean link
/// resends nothing.
#[test]
fn a_hinted_qp_sends_trailers_from_its_first_packet() {
    let s = stream_hinted(11, Link::default(), (true, true), (true, true), 60, false);
    assert_eq!(s.states, (MpState::On, MpState::On));
    assert_eq!(s.first_trailer(), Some(0), "the first packet");
    assert!(s.requests.iter().all(|r| r.1), "every request");
    assert_eq!(s.resent(), 0);
    assert_eq!(s.sr.expect("selective repeat").selective_retransmits, 0);
    // One side hinted only (its peer's hint was lost, or the peer is an older roce-xdp that
    // sends none): that side starts on, the other turns on with its first packet.
    let s = stream_hinted(12, Link::default(), (true, true), (true, false), 60, false);
    assert_eq!(s.states, (MpState::On, MpState::On));
    assert_eq!(s.first_trailer(), Some(0));
    assert_eq!(s.resent(), 0);
}

/// A hint reaches only a QP whose peer allows the extension; a QP that does not allow it
/// ignores one: the same frames as plain RoCE v2 bit for bit (but the offering peer's offer
/// bit), the same completions, every byte checked, over a clean and a lossy link.
#[test]
fn a_hint_to_a_qp_that_does_not_allow_the_extension_changes_nothing() {
    for (seed, loss) in [(1, 0.0), (7, 0.05)] {
        let plain = run(seed, (false, false), loss);
        let r = run_hinted(seed, (false, true), (true, false), loss);
        assert_eq!(r.states, (MpState::Disabled, MpState::Offering));
        assert_eq!(r.wcs, plain.wcs);
        assert_plain_but_offer(&plain.frames, &r.frames, (false, true));
    }
}

/// Hinted QPs over the mixed workload of [`run`] (WRITEs, SENDs both ways, a READ and a
/// fetch-and-add, which go plain and in order) and 5 % loss: both on, the same completions as
/// plain RoCE, every byte checked, trailers from A's first frame.
#[test]
fn hinted_qps_complete_the_mixed_workload_as_plain_roce_does() {
    for (seed, loss) in [(3, 0.0), (5, 0.05), (9, 0.1)] {
        let plain = run(seed, (false, false), loss);
        let r = run_hinted(seed, (true, true), (true, true), loss);
        assert_eq!(r.states, (MpState::On, MpState::On));
        assert_eq!(r.wcs, plain.wcs);
        let (side, f) = &r.frames[0];
        assert_eq!(*side, Side::A);
        let b = parse_frame(f).unwrap().roce.bth.resv7;
        assert_eq!(b, MpBthFlags::OFFER_TRAILER.bits(), "A's first frame");
    }
}

/// 1 % loss from the first packet on: hinted QPs resend about one packet per loss over the
/// whole stream, the first window included, where the in-band agreement's first window goes
/// back N (docs/multipath.md: 217 resends for 26 losses over these seeds).
#[test]
fn a_hinted_first_window_resends_about_one_packet_per_loss() {
    let link = Link {
        loss: 0.01,
        latency: Duration::from_micros(20),
        ..Link::default()
    };
    let (mut hinted, mut in_band, mut lost) = (0, 0, 0);
    for seed in [1, 2, 3] {
        let s = stream_hinted(seed, link, (true, true), (true, true), 200, false);
        assert_eq!(s.states, (MpState::On, MpState::On));
        assert_eq!(s.first_trailer(), Some(0));
        hinted += s.resent();
        lost += s.lost;
        in_band += stream(seed, link, (true, true), 200, false).resent();
    }
    eprintln!("hinted resent {hinted} for {lost} lost; agreed in band resent {in_band}");
    assert!(lost > 0);
    assert!(
        hinted as u64 <= 2 * lost + 3,
        "about one resend per loss: {hinted} for {lost}"
    );
    assert!(hinted < in_band, "hinted {hinted} vs in band {in_band}");
}

/// READs and atomics in selective repeat (docs/multipath.md): towards a peer whose responses
/// carry `HOLD`, the requester never leaves the mode for them: every request of a hinted
/// stream, from the first, is in the mode (SENDs and WRITEs with their trailers, READs and
/// atomics marked to be held), over a clean and a lossy, reordering link; each atomic
/// executes once and in order (its fetched value and the counter checked in `stream`).
#[test]
fn reads_and_atomics_stay_in_selective_repeat() {
    let lossy = Link {
        loss: 0.03,
        reorder: 0.2,
        reorder_jitter: Duration::from_micros(30),
        ..Link::default()
    };
    for (seed, link) in [(31, Link::default()), (32, lossy), (33, lossy)] {
        let s = stream_hinted(seed, link, (true, true), (true, true), 80, true);
        assert_eq!(s.states, (MpState::On, MpState::On));
        assert!(s.requests.iter().all(|r| r.1), "every request in the mode");
        assert!(s.sr.is_some());
    }
}

/// Reordering and duplication on the link, and READs in the stream (which take the requester
/// out of selective repeat and back, at quiet points only): every WR and receive completes
/// once, in order, every byte checked.
#[test]
fn reordering_duplication_and_reads_complete_exactly_once() {
    let link = Link {
        loss: 0.02,
        dup: 0.05,
        reorder: 0.3,
        reorder_jitter: Duration::from_micros(40),
        ..Link::default()
    };
    for seed in [4, 5] {
        let s = stream(seed, link, (true, true), 80, true);
        assert_eq!(s.states, (MpState::On, MpState::On));
    }
}

fn arb_mp_link() -> impl Strategy<Value = Link> {
    (1u64..60, 0.0f64..0.05, 0.0f64..0.08, 0.0f64..0.4).prop_map(|(lat, loss, dup, reorder)| Link {
        latency: Duration::from_micros(lat),
        loss,
        dup,
        reorder,
        reorder_jitter: Duration::from_micros(50),
        ..Link::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Any loss, duplication and reordering: with the extension on at both ends every WR and
    /// receive completes exactly once, in order, with every byte where it belongs.
    #[test]
    fn any_impairment_completes_exactly_once(
        seed in any::<u64>(),
        link in arb_mp_link(),
        reads in any::<bool>(),
    ) {
        let s = stream(seed, link, (true, true), 40, reads);
        prop_assert_eq!(s.states, (MpState::On, MpState::On));
    }

    /// The same with both QPs hinted out of band: on from the first packet, exactly once, in
    /// order, every byte where it belongs.
    #[test]
    fn any_impairment_completes_exactly_once_hinted(
        seed in any::<u64>(),
        link in arb_mp_link(),
        reads in any::<bool>(),
    ) {
        let s = stream_hinted(seed, link, (true, true), (true, true), 40, reads);
        prop_assert_eq!(s.states, (MpState::On, MpState::On));
        prop_assert_eq!(s.first_trailer(), Some(0));
    }
}

/// SENDs in selective-repeat mode faster than the receiver posts receives, over a lossy link:
/// the responder answers the expected PSN with an RNR NAK and drops what is beyond it; the
/// requester waits and resends; once the receives are posted every SEND lands once, in
/// order, in its own receive, every byte checked.
#[test]
fn rnr_in_selective_repeat_completes_in_order() {
    for seed in [23, 24, 25, 26, 27] {
        rnr_run(seed);
    }
}

fn rnr_run(seed: u64) {
    let link = Link {
        loss: 0.02,
        ..Link::default()
    };
    let config = DeviceConfig {
        multipath: true,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(seed, config, link);
    let cfg = RcConfig {
        timeout: 4,
        min_rnr_timer: 1,
        ..RcConfig::default()
    };
    let (a, b) = connect_rc(&mut p, &cfg);
    const L: usize = 2500;
    const N: u64 = 60;
    let src: Vec<u8> = (0..L as u32).map(|i| (i * 17 + 3) as u8).collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::all())
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; L * N as usize], 0x10_0000, Access::all())
            .unwrap();
    let recv = |p: &mut Pair, i: u64| {
        p.b.post_recv(
            b.qpn,
            RecvWr {
                wr_id: 1000 + i,
                sg_list: vec![Sge {
                    addr: 0x10_0000 + i * L as u64,
                    length: L as u32,
                    lkey: mb.lkey,
                }],
            },
        )
        .unwrap();
    };
    for i in 0..20 {
        recv(&mut p, i);
    }
    for i in 0..N {
        let sg = vec![Sge {
            addr: 0x1000,
            length: L as u32,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::send(i, sg)).unwrap();
    }
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut posted = 20;
    let done = p.drive_until(5_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
        wb.extend(core::iter::from_fn(|| p.b.poll_cq(b.cq)).map(|w| (w.wr_id, w.status)));
        // Receives trickle in, five at a time once the earlier ones are used.
        if posted < N && wb.len() as u64 + 2 >= posted {
            for i in posted..(posted + 5).min(N) {
                recv(p, i);
            }
            posted = (posted + 5).min(N);
        }
        wa.len() as u64 == N && wb.len() as u64 == N
    });
    assert!(done, "{:?} a {} b {}", p.stats, wa.len(), wb.len());
    let want: Vec<_> = (0..N).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(wa, want);
    let want: Vec<_> = (0..N).map(|i| (1000 + i, WcStatus::Success)).collect();
    assert_eq!(wb, want);
    let bytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in 0..N as usize {
        assert_eq!(&bytes[i * L..(i + 1) * L], &src[..], "SEND {i}");
    }
    let qa = p.a.qp(a.qpn).unwrap();
    assert_eq!(qa.multipath(), MpState::On);
    assert!(qa.counters().rcvd_rnr_err > 0, "RNR NAKs happened");
    assert!(qa.selective_repeat().is_some());
}

// ------------------------------------------------------------ READ responses placed

/// READ response packet `i` of what the harness sent: its data and trailer, if it has one.
fn read_resp(out: &(RoceRepr, Vec<u8>)) -> (Vec<u8>, Option<PlacementTrailer>) {
    let (r, payload) = out;
    assert_eq!(
        r.bth.opcode.info().unwrap().operation,
        Operation::ReadResponse,
        "{r:?}"
    );
    if MpBthFlags::from_resv7(r.bth.resv7).contains(MpBthFlags::TRAILER) {
        let (data, t) = crate::wire::multipath::placement::split(payload).unwrap();
        (data.to_vec(), Some(t))
    } else {
        (payload.clone(), None)
    }
}

/// A responder with the extension on answers a READ its requester sent in selective repeat
/// (marked `HOLD` and `READ_PLACED`) with the placement trailer on every response packet (the READ response
/// flag, the packet's offset in the READ's data, the READ's length and remote address, no
/// R_Key), and a request for a range of it again (the requester's missing packets) with just
/// that range, trailers on. A READ sent plain is answered plain, and a range of it (not a
/// tail) is not answered, as before; so is a READ held but not asking for placed responses
/// (`READ_PLACED`: an older roce-xdp requester).
#[test]
fn a_read_in_selective_repeat_is_answered_with_placement_trailers() {
    let mut h = h_mp();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    h.set_mem(0, &data);
    let rkey = h.mr.rkey;
    let held = (MpBthFlags::OFFER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED).bits();
    let mut req = with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 3000);
    req.bth.resv7 = held;
    h.rx(req, &[]);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::On);
    let out = h.tx();
    assert_eq!(out.len(), 3);
    for (i, o) in out.iter().enumerate() {
        let (d, t) = read_resp(o);
        let t = t.expect("a trailer on every response packet");
        assert_eq!(o.0.bth.psn, Psn::new(RQ_PSN + i as u32));
        assert_eq!(d, data[i * 1024..((i + 1) * 1024).min(3000)]);
        assert_eq!(
            t,
            PlacementTrailer {
                first_psn: Psn::new(RQ_PSN),
                flags: PlacementFlags::READ_RESPONSE,
                offset: i as u32 * 1024,
                length: 3000,
                va: BASE,
                rkey: RKey::new(0),
                ssn: Ssn::new(0),
            }
        );
    }
    // The requester misses packet 1 only: it asks for that one packet again.
    let mut again = with_reth(
        hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1),
        BASE + 1024,
        rkey,
        1024,
    );
    again.bth.resv7 = held;
    h.rx(again, &[]);
    let out = h.tx();
    assert_eq!(out.len(), 1, "only the range asked for");
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(out[0].0.bth.psn, Psn::new(RQ_PSN + 1));
    let (d, t) = read_resp(&out[0]);
    assert_eq!(d, data[1024..2048]);
    assert_eq!(t.unwrap().offset, 1024);
    assert_eq!(h.c().rx_read_requests, 1, "a replay is not a new READ");

    // A READ sent plain (no HOLD) with the extension on: plain responses, in order.
    let mut plain = with_reth(
        hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 3),
        BASE,
        rkey,
        3000,
    );
    plain.bth.resv7 = MpBthFlags::OFFER.bits();
    h.rx(plain, &[]);
    let out = h.tx();
    assert_eq!(out.len(), 3);
    for (i, o) in out.iter().enumerate() {
        let (d, t) = read_resp(o);
        assert_eq!(t, None);
        assert_eq!(d, data[i * 1024..((i + 1) * 1024).min(3000)]);
        assert!(!MpBthFlags::from_resv7(o.0.bth.resv7).contains(MpBthFlags::TRAILER));
    }
    let mut range = with_reth(
        hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 4),
        BASE + 1024,
        rkey,
        1024,
    );
    range.bth.resv7 = held;
    h.rx(range, &[]);
    assert!(
        h.tx().is_empty(),
        "a range of a plain READ is not a tail: unanswered"
    );

    // A READ held but without `READ_PLACED` (an older roce-xdp requester, which takes READ
    // responses only plain and in order): plain responses.
    let mut old = with_reth(
        hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 6),
        BASE,
        rkey,
        3000,
    );
    old.bth.resv7 = (MpBthFlags::OFFER | MpBthFlags::HOLD).bits();
    h.rx(old, &[]);
    let out = h.tx();
    assert_eq!(out.len(), 3);
    for (i, o) in out.iter().enumerate() {
        let (d, t) = read_resp(o);
        assert_eq!(t, None);
        assert_eq!(d, data[i * 1024..((i + 1) * 1024).min(3000)]);
    }
}

/// A QP with the extension off never sends a READ response trailer, whatever the request's
/// reserved bits say: the responses are the READ's bytes, `resv7` 0.
#[test]
fn a_qp_with_the_extension_off_never_sends_a_read_response_trailer() {
    let mut h = h();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 3) as u8).collect();
    h.set_mem(0, &data);
    let rkey = h.mr.rkey;
    let mut req = with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 3000);
    req.bth.resv7 = (MpBthFlags::OFFER_TRAILER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED).bits();
    h.rx(req, &[]);
    let out = h.tx();
    assert_eq!(out.len(), 3);
    for (i, (r, payload)) in out.iter().enumerate() {
        assert_eq!(r.bth.resv7, 0);
        assert_eq!(payload[..], data[i * 1024..((i + 1) * 1024).min(3000)]);
    }
}

/// What a READ-heavy run did: B's READ response frames (PSN, with a trailer, the path its
/// UDP source port took), A's and B's counters, the simulated time it took.
struct ReadRun {
    responses: Vec<(u32, bool, usize)>,
    a: crate::transport::QpCounters,
    b: crate::transport::QpCounters,
    time: Instant,
    lost: u64,
}

impl ReadRun {
    /// READ response packets sent more than once.
    fn resent(&self) -> usize {
        let mut psns: Vec<u32> = self.responses.iter().map(|r| r.0).collect();
        psns.sort_unstable();
        psns.dedup();
        self.responses.len() - psns.len()
    }
}

/// A READ-heavy workload over four paths that all impair as `link` does: `n` WRs from A, READs
/// of 64 bytes to 40 KB (multi-packet, some longer than a READ request's piece) of B's memory
/// and every seventh a WRITE. With `multipath` both devices allow the extension, the QPs are
/// hinted (on from the first packet) and spray over 32 entropies; without, plain RoCE v2
/// (go-back-N on one path). Every WR completes once, in order, successfully; every byte
/// READ is B's, every byte written is A's.
fn reads_over_four_paths(seed: u64, link: Link, multipath: bool, n: u64) -> ReadRun {
    reads_over_paths(seed, vec![link; 4], multipath, n)
}

/// [`reads_over_four_paths`] over `paths`, each impaired as its own link says.
fn reads_over_paths(seed: u64, paths: Vec<Link>, multipath: bool, n: u64) -> ReadRun {
    let k = paths.len();
    let config = DeviceConfig {
        multipath,
        multipath_entropies: if multipath { 32 } else { 8 },
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(seed, config, Link::default());
    p.set_paths(paths);
    let responses: Rc<RefCell<Vec<(u32, bool, usize)>>> = Rc::default();
    let sink = Rc::clone(&responses);
    p.filter = Some(Box::new(move |side, f| {
        if side == Side::B
            && let Ok(pf) = parse_frame(f)
            && pf
                .roce
                .bth
                .opcode
                .info()
                .is_some_and(|i| i.operation == Operation::ReadResponse)
        {
            let t = MpBthFlags::from_resv7(pf.roce.bth.resv7).contains(MpBthFlags::TRAILER);
            let path = path_index(pf.udp.src_port, k);
            sink.borrow_mut().push((pf.roce.bth.psn.value(), t, path));
        }
        true
    }));
    let cfg = RcConfig {
        multipath_peer: multipath,
        timeout: 4,
        cap: QpCap {
            max_send_wr: 1024,
            ..QpCap::default()
        },
        ..RcConfig::default()
    };
    let (a, b) = connect_rc_ports(&mut p, &cfg, (0xc001, 0xd001));
    const B_LEN: usize = 1 << 16;
    let b_src: Vec<u8> = (0..B_LEN as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let a_src: Vec<u8> = (0..3000u32).map(|i| (i * 11 + 5) as u8).collect();
    let sizes = [3000u32, 17_000, 64, 40_000, 5 * 1024, 1024];
    let total: u64 = (0..n)
        .map(|i| u64::from(sizes[i as usize % sizes.len()]))
        .sum();
    let mut a_mem = vec![0; 3000 + total as usize];
    a_mem[..3000].copy_from_slice(&a_src);
    let ma = p.a.reg_mr(a.pd, a_mem, 0x1000, Access::all()).unwrap();
    let mut b_mem = b_src.clone();
    b_mem.resize(B_LEN + 3000 * n as usize, 0);
    let mb = p.b.reg_mr(b.pd, b_mem, 0x10_0000, Access::all()).unwrap();
    let mut reads = Vec::new();
    let mut local = 0x1000 + 3000u64;
    for i in 0..n {
        let (op, addr, len) = if i % 7 == 6 {
            let at = 0x10_0000 + B_LEN as u64 + i * 3000;
            (write(at, mb.rkey), 0x1000, 3000)
        } else {
            let len = sizes[i as usize % sizes.len()];
            let from = (i * 4099) % (B_LEN as u64 - u64::from(len));
            reads.push((local, from, len));
            let l = local;
            local += u64::from(len);
            (read(0x10_0000 + from, mb.rkey), l, len)
        };
        let sg = vec![Sge {
            addr,
            length: len,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::new(i, op, sg)).unwrap();
    }
    let mut wa = Vec::new();
    let done = p.drive_until(20_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
        wa.len() as u64 >= n
    });
    assert!(done, "{:?} a {}", p.stats, wa.len());
    assert!(p.drive(1_000_000), "idle afterwards");
    wa.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
    let want: Vec<(u64, WcStatus)> = (0..n).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(wa, want, "every WR once, in order");
    let a_bytes = p.a.mrs().bytes(ma.lkey).unwrap();
    for (k, &(l, from, len)) in reads.iter().enumerate() {
        let at = (l - 0x1000) as usize;
        let from = from as usize;
        assert!(
            a_bytes[at..at + len as usize] == b_src[from..from + len as usize],
            "READ {k} ({len} bytes)"
        );
    }
    let b_bytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in (6..n as usize).step_by(7) {
        let at = B_LEN + i * 3000;
        assert_eq!(&b_bytes[at..at + 3000], &a_src[..], "WRITE {i}");
    }
    let states = (
        p.a.qp(a.qpn).unwrap().multipath(),
        p.b.qp(b.qpn).unwrap().multipath(),
    );
    if multipath {
        assert_eq!(states, (MpState::On, MpState::On));
    } else {
        assert_eq!(states, (MpState::Disabled, MpState::Disabled));
    }
    p.filter = None;
    ReadRun {
        responses: responses.take(),
        a: *p.a.qp(a.qpn).unwrap().counters(),
        b: *p.b.qp(b.qpn).unwrap().counters(),
        time: p.time,
        lost: p.stats.lost,
    }
}

/// READs over four paths with loss, duplication and reordering: with the extension every READ
/// response carries its trailer and is sprayed, the requester places the packets that overtook
/// a missing one (`ooo_placed`) and asks again only for what is missing, so fewer response
/// packets go twice than with go-back-N over the same impairment (which re-requests a READ's
/// whole tail from a gap); every WR completes once, in order, every byte checked.
#[test]
fn read_responses_are_sprayed_and_placed_out_of_order() {
    let link = Link {
        latency: Duration::from_micros(10),
        loss: 0.02,
        dup: 0.03,
        reorder: 0.3,
        reorder_jitter: Duration::from_micros(40),
        ..Link::default()
    };
    let (mut mp_resent, mut plain_resent, mut placed, mut lost) = (0, 0, 0, (0, 0));
    for seed in [41, 42, 43] {
        let m = reads_over_four_paths(seed, link, true, 60);
        assert!(
            m.responses.iter().all(|r| r.1),
            "every READ response with its trailer"
        );
        let g = reads_over_four_paths(seed, link, false, 60);
        assert!(g.responses.iter().all(|r| !r.1), "plain: no trailer");
        mp_resent += m.resent();
        plain_resent += g.resent();
        placed += m.a.ooo_placed;
        lost = (lost.0 + m.lost, lost.1 + g.lost);
        eprintln!(
            "seed {seed}: placed {} resent {} of {} (lost {}, {:?}; implied {} timeouts {}; \
             response entropies retired {}) against go-back-N {} of {} (lost {}, {:?})",
            m.a.ooo_placed,
            m.resent(),
            m.responses.len(),
            m.lost,
            m.time,
            m.a.implied_nak_seq_err,
            m.a.local_ack_timeout_err,
            m.b.entropy_retired,
            g.resent(),
            g.responses.len(),
            g.lost,
            g.time
        );
    }
    assert!(placed > 0, "responses placed out of order");
    assert!(
        mp_resent < plain_resent,
        "resent responses: {mp_resent} placed against {plain_resent} go-back-N (lost {lost:?})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Any loss, duplication and reordering on four paths, READ responses sprayed and placed
    /// out of order: every WR completes exactly once, in order, every byte READ is the
    /// responder's and every byte written the requester's, and every READ response carries
    /// its trailer.
    #[test]
    fn reads_over_four_impaired_paths_complete_exactly_once(
        seed in any::<u64>(),
        link in arb_mp_link(),
    ) {
        let r = reads_over_four_paths(seed, link, true, 24);
        prop_assert!(r.responses.iter().all(|r| r.1));
    }
}

/// READ response packet `i` of a READ of `len` bytes at the harness's SQ PSN, as a responder
/// with the extension on sends it: its opcode by position, `data` then its trailer.
fn placed_resp(i: u32, len: u32, data: &[u8]) -> (RoceRepr, Vec<u8>) {
    let npkts = len.div_ceil(1024);
    let pos = crate::transport::qp::position_of(i, npkts);
    let op = match pos {
        Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    };
    let mut h = if pos == Position::Middle {
        hdr(op, SQ_PSN + i)
    } else {
        aeth_hdr(op, SQ_PSN + i, ACK, 1)
    };
    h.bth.resv7 = (MpBthFlags::OFFER_TRAILER | MpBthFlags::HOLD).bits();
    let t = PlacementTrailer {
        first_psn: Psn::new(SQ_PSN),
        flags: PlacementFlags::READ_RESPONSE,
        offset: i * 1024,
        length: len,
        va: 0x9000,
        rkey: RKey::new(0),
        ssn: Ssn::new(0),
    };
    let mut payload = data.to_vec();
    payload.extend_from_slice(&t.to_bytes());
    (h, payload)
}

/// A requester's READ in selective repeat (its peer holds READs: marked `HOLD`) takes its response packets
/// in any order: each lands at its offset on arrival, a duplicate with other bytes is not
/// placed again, a trailer that names another offset or the wrong remote address is
/// dropped, and the READ completes once, when its last missing packet arrives. A packet three
/// PSNs past a missing one asks again for the missing run, up to the next packet placed.
#[test]
fn a_requester_places_read_responses_out_of_order_exactly_once() {
    let config = DeviceConfig {
        multipath: true,
        ..DeviceConfig::default()
    };
    let mut h = h_on(&RcConfig::default(), config);
    // The peer's answer in band: it allows the extension and holds READ requests.
    let mut hello = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN - 1, ACK, 0);
    hello.bth.resv7 = (MpBthFlags::OFFER | MpBthFlags::HOLD).bits();
    h.rx(hello, &[]);
    assert_eq!(h.d.qp(h.qpn).unwrap().multipath(), MpState::On);
    let len = 5000u32;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 3) as u8).collect();
    let rkey = RKey::new(0x44);
    h.post(1, read(0x9000, rkey), 0, len);
    let out = h.tx();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(
        MpBthFlags::from_resv7(out[0].0.bth.resv7),
        MpBthFlags::OFFER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED,
        "held, its responses to be placed"
    );
    let chunk = |i: u32| &data[(i * 1024) as usize..((i + 1) * 1024).min(len) as usize];
    // Packet 4 (the last), then packet 2.
    for i in [4, 2] {
        let (r, p) = placed_resp(i, len, chunk(i));
        h.rx(r, &p);
    }
    assert_eq!(h.mem(4096, 904), chunk(4));
    assert_eq!(h.mem(2048, 1024), chunk(2));
    assert!(h.wcs().is_empty(), "not complete yet");
    // Packet 2 again with other bytes: a duplicate, not placed.
    let (r, p) = placed_resp(2, len, &[0xee; 1024]);
    h.rx(r, &p);
    assert_eq!(h.mem(2048, 1024), chunk(2));
    // A trailer naming another offset than its PSN's, and one with another remote address:
    // dropped.
    let (r, mut p) = placed_resp(3, len, chunk(3));
    let n = p.len();
    p[n - 28 + 4..n - 28 + 8].copy_from_slice(&1024u32.to_be_bytes());
    h.rx(r, &p);
    let (r, mut p) = placed_resp(3, len, chunk(3));
    p[n - 28 + 12..n - 28 + 20].copy_from_slice(&0x9400u64.to_be_bytes());
    h.rx(r, &p);
    assert_eq!(h.mem(3072, 1024), vec![0u8; 1024]);
    let dropped = h.c().rx_dropped;
    assert_eq!(dropped, 3, "the duplicate and the two bad trailers");
    // Packet 4 is three PSNs past the missing packet 0: the missing run from it is asked for
    // again, not the READ's tail.
    let again: Vec<_> = h
        .tx()
        .into_iter()
        .filter(|(r, _)| r.bth.opcode == Opcode::RC_RDMA_READ_REQUEST)
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].0.bth.psn, Psn::new(SQ_PSN));
    assert_eq!(
        again[0].0.reth.unwrap().dma_len,
        2048,
        "packets 0 and 1: up to packet 2, placed"
    );
    for i in [0, 3, 1] {
        let (r, p) = placed_resp(i, len, chunk(i));
        h.rx(r, &p);
    }
    let wcs = h.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(h.mem(0, len as usize), data);
    assert!(h.c().ooo_placed >= 3, "{:?}", h.c());
    // A late duplicate after completion: dropped, nothing changes.
    let (r, p) = placed_resp(1, len, &[0xee; 1024]);
    h.rx(r, &p);
    assert!(h.wcs().is_empty());
    assert_eq!(h.mem(0, len as usize), data);
}

/// A range asked for again while the responder is still sending its READ goes first, and the
/// READ's play resumes where it was: nothing not yet sent is skipped, nothing sent twice but
/// the range.
#[test]
fn a_range_asked_again_mid_play_goes_first_and_the_play_resumes() {
    let mut h = h_mp();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 5 + 2) as u8).collect();
    h.set_mem(0, &data);
    let rkey = h.mr.rkey;
    let held = (MpBthFlags::OFFER | MpBthFlags::HOLD | MpBthFlags::READ_PLACED).bits();
    let mut req = with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 5000);
    req.bth.resv7 = held;
    h.rx(req, &[]);
    // Two response packets leave, then packet 0 is asked for again.
    let mut buf = vec![0; MAX_FRAME_LEN];
    for _ in 0..2 {
        assert!(h.d.poll_transmit(h.now, &mut buf).is_some());
    }
    let mut again = with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 1024);
    again.bth.resv7 = held;
    h.rx(again, &[]);
    let out = h.tx();
    let psns: Vec<u32> = out.iter().map(|o| o.0.bth.psn.value() - RQ_PSN).collect();
    assert_eq!(psns, [0, 2, 3, 4], "the range, then the rest of the play");
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(out[1].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert_eq!(out[3].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_LAST);
    for (o, &i) in out.iter().zip(&psns) {
        let (d, t) = read_resp(o);
        let i = i as usize;
        assert_eq!(d, data[i * 1024..((i + 1) * 1024).min(5000)]);
        assert_eq!(t.unwrap().offset as usize, i * 1024);
    }
}

/// One of four paths loses 10 % (the others are clean): the responder sprays READ responses
/// over its entropies, the requester asks again for the lost ones, and the responder retires
/// the entropies those took, so the lossy path keeps a small share of the responses (an
/// unsprayed QP's responses all take one path); every WR once, in order, every byte checked.
#[test]
fn read_responses_move_off_a_lossy_path() {
    let lossy = Link {
        loss: 0.1,
        ..Link::default()
    };
    for seed in [7, 8, 9] {
        let paths = vec![lossy, Link::default(), Link::default(), Link::default()];
        let r = reads_over_paths(seed, paths, true, 240);
        let on_lossy = r.responses.iter().filter(|x| x.2 == 0).count();
        let share = on_lossy as f64 / r.responses.len() as f64;
        eprintln!(
            "seed {seed}: lossy path {on_lossy} of {} READ responses ({:.1} %), {} entropies \
             retired, {} resent",
            r.responses.len(),
            100.0 * share,
            r.b.entropy_retired,
            r.resent()
        );
        assert!(r.b.entropy_retired > 0, "{:?}", r.b);
        assert!(share < 0.12, "the lossy path kept {:.1} %", 100.0 * share);
    }
}

/// A QP that agreed on the extension in band (no hint) and reads without pause: 64 READs of
/// 4 KiB posted at once, so a READ is outstanding from the first request to the last. The
/// requester learns from the first responses that the peer holds READ requests (`HOLD`), and
/// then lets what is outstanding drain once so that it can enter selective repeat (it does
/// not take READs already sent over one by one): the READ requests after the first window go
/// marked to be held. Before the drain existed, such a stream never went quiet and no READ
/// request of it was ever in the mode (CI's `multipath_hint` saw none on Dec 6). Every READ
/// completes once, in order, every byte checked.
#[test]
fn a_read_stream_agreed_in_band_enters_selective_repeat() {
    let config = DeviceConfig {
        multipath: true,
        ..DeviceConfig::default()
    };
    // Responses drain at a steady rate (as from a TCG guest), so READs complete one by one
    // and the requester sends the next as each completes: it is never quiet by itself.
    let link = Link {
        latency: Duration::from_micros(20),
        bottleneck: Some(crate::transport::sim::Bottleneck {
            from: Side::B,
            frames_per_sec: 200_000,
            buffer: 4096,
        }),
        ..Link::default()
    };
    let mut p = Pair::new(61, config, link);
    let requests: Rc<RefCell<Vec<bool>>> = Rc::default();
    let sink = Rc::clone(&requests);
    p.filter = Some(Box::new(move |side, f| {
        if side == Side::A
            && let Ok(pf) = parse_frame(f)
            && pf.roce.bth.opcode == Opcode::RC_RDMA_READ_REQUEST
        {
            let held = MpBthFlags::from_resv7(pf.roce.bth.resv7).contains(MpBthFlags::HOLD);
            sink.borrow_mut().push(held);
        }
        true
    }));
    let cfg = RcConfig {
        multipath_peer: false,
        timeout: 4,
        cap: QpCap {
            max_send_wr: 1024,
            ..QpCap::default()
        },
        ..RcConfig::default()
    };
    let (a, b) = connect_rc_ports(&mut p, &cfg, (0xc001, 0xd001));
    const N: u64 = 64;
    const LEN: u32 = 4096;
    let src: Vec<u8> = (0..(LEN as usize * N as usize) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let ma =
        p.a.reg_mr(a.pd, vec![0; src.len()], 0x1000, Access::all())
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, src.clone(), 0x10_0000, Access::all())
            .unwrap();
    for i in 0..N {
        let off = i * u64::from(LEN);
        let sg = vec![Sge {
            addr: 0x1000 + off,
            length: LEN,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::new(i, read(0x10_0000 + off, mb.rkey), sg))
            .unwrap();
    }
    let mut wa = Vec::new();
    let done = p.drive_until(20_000_000, |p| {
        wa.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
        wa.len() as u64 >= N
    });
    assert!(done, "{:?} a {}", p.stats, wa.len());
    let want: Vec<(u64, WcStatus)> = (0..N).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(wa, want, "every READ once, in order");
    assert_eq!(p.a.mrs().bytes(ma.lkey).unwrap(), &src[..], "every byte");
    assert_eq!(p.a.qp(a.qpn).unwrap().multipath(), MpState::On);
    let held = requests.borrow();
    assert!(!held[0], "agreed in band: the first READ goes plain");
    let first_held = held.iter().position(|&h| h).expect("a READ request held");
    assert!(
        first_held < 32 && held[first_held..].iter().all(|&h| h),
        "held from request {first_held} on, every one after it: {held:?}"
    );
}

/// A QP on a shared receive queue in selective repeat, over a link that reorders, duplicates
/// and loses: a SEND that overtook earlier ones takes the SRQ's WQEs for the messages before
/// it, in message order, and is placed at once, so message `k` still lands in the `k`-th WQE
/// and completes in order (before, only the next WQE could be taken and every SEND beyond it
/// was dropped and resent). Every receive completes once, in order, with its own bytes; the
/// SRQ gives up exactly the WQEs used.
#[test]
fn srq_sends_that_overtook_earlier_ones_are_placed_in_their_own_wqes() {
    const N: u64 = 60;
    const L: u32 = 3000;
    let link = Link {
        loss: 0.01,
        dup: 0.02,
        reorder: 0.3,
        reorder_jitter: Duration::from_micros(40),
        ..Link::default()
    };
    for seed in [71, 72, 73] {
        let mut p = Pair::new(seed, DeviceConfig::default(), link);
        let cfg = RcConfig {
            timeout: 4,
            ..RcConfig::default()
        };
        let pda = p.a.alloc_pd().unwrap();
        let cqa = p.a.create_cq(1024).unwrap();
        let qa =
            p.a.create_qp(QpInit {
                cap: QpCap {
                    max_send_wr: 1024,
                    ..QpCap::default()
                },
                ..QpInit::new(QpType::Rc, pda, cqa)
            })
            .unwrap();
        let pdb = p.b.alloc_pd().unwrap();
        let cqb = p.b.create_cq(1024).unwrap();
        let srq =
            p.b.create_srq(
                pdb,
                SrqAttr {
                    max_wr: 256,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )
            .unwrap();
        let qb =
            p.b.create_qp_with_srq(QpInit::new(QpType::Rc, pdb, cqb), Some(srq))
                .unwrap();
        for (d, q) in [(&mut p.a, qa), (&mut p.b, qb)] {
            d.set_multipath(q, true).unwrap();
            d.set_multipath_peer(q).unwrap();
        }
        let (psn_a, psn_b) = (
            Psn::new(cfg.psn_a),
            Psn::new(cfg.psn_a.wrapping_add(0x1000)),
        );
        bring_up(&mut p.a, qa, Side::A, qb, psn_a, psn_b, &cfg);
        bring_up(&mut p.b, qb, Side::B, qa, psn_b, psn_a, &cfg);
        let src: Vec<u8> = (0..(L as usize * N as usize) as u32)
            .map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8)
            .collect();
        let ma = p.a.reg_mr(pda, src.clone(), 0x1000, Access::all()).unwrap();
        // More WQEs than messages: the SRQ must give up exactly one per message.
        let mb =
            p.b.reg_mr(
                pdb,
                vec![0; L as usize * (N as usize + 8)],
                0x100_0000,
                Access::LOCAL_WRITE,
            )
            .unwrap();
        for k in 0..N + 8 {
            let wr = RecvWr {
                wr_id: 1000 + k,
                sg_list: vec![Sge {
                    addr: 0x100_0000 + k * u64::from(L),
                    length: L,
                    lkey: mb.lkey,
                }],
            };
            p.b.post_srq_recv(srq, wr).unwrap();
        }
        for k in 0..N {
            let sg = vec![Sge {
                addr: 0x1000 + k * u64::from(L),
                length: L,
                lkey: ma.lkey,
            }];
            p.a.post_send(qa, SendWr::send(k, sg)).unwrap();
        }
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        let done = p.drive_until(20_000_000, |p| {
            wa.extend(core::iter::from_fn(|| p.a.poll_cq(cqa)).map(|w| (w.wr_id, w.status)));
            wb.extend(
                core::iter::from_fn(|| p.b.poll_cq(cqb)).map(|w| (w.wr_id, w.status, w.byte_len)),
            );
            wa.len() as u64 == N && wb.len() as u64 == N
        });
        assert!(
            done,
            "seed {seed}: {:?} a {} b {}",
            p.stats,
            wa.len(),
            wb.len()
        );
        assert!(p.drive(1_000_000), "idle afterwards");
        let want_a: Vec<(u64, WcStatus)> = (0..N).map(|k| (k, WcStatus::Success)).collect();
        assert_eq!(wa, want_a, "seed {seed}: every SEND once, in order");
        let want_b: Vec<(u64, WcStatus, u32)> =
            (0..N).map(|k| (1000 + k, WcStatus::Success, L)).collect();
        assert_eq!(
            wb, want_b,
            "seed {seed}: message k in the k-th WQE, in order"
        );
        let got = p.b.mrs().bytes(mb.lkey).unwrap();
        assert_eq!(&got[..src.len()], &src[..], "seed {seed}: every byte");
        assert!(
            got[src.len()..].iter().all(|&b| b == 0),
            "seed {seed}: the unused WQEs untouched"
        );
        let c = *p.b.qp(qb).unwrap().counters();
        assert!(c.ooo_placed > 0, "seed {seed}: nothing placed out of order");
        assert_eq!(
            c.out_of_buffer, 0,
            "seed {seed}: no SEND found its WQE missing"
        );
        let left = p.b.srq(srq).unwrap().len();
        assert_eq!(left, 8, "seed {seed}: one WQE taken per message");
    }
}
