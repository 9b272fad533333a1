//! The multipath extension in the QPs (docs/multipath.md; issue 19), step 2: the in-band
//! agreement. A QP that allows the extension towards one that does not (rxe, a NIC, a
//! roce-xdp QP with it off) puts exactly the same packets on the wire as today, but for the
//! offer bit, a BTH reserved bit receivers ignore (IBA 9.2); two QPs that both allow it agree.

use core::cell::RefCell;
use std::rc::Rc;

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
    let mk = |d: &mut Device, allowed: bool| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(cfg.cq_depth).unwrap();
        let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
        d.set_multipath(qpn, allowed).unwrap();
        (pd, cq, qpn)
    };
    let (pda, cqa, qa) = mk(&mut p.a, allowed.0);
    let (pdb, cqb, qb) = mk(&mut p.b, allowed.1);
    let (psn_a, psn_b) = (Psn::new(cfg.psn_a), Psn::new(cfg.psn_a + 0x1000));
    bring_up(&mut p.a, qa, Side::A, qb, psn_a, psn_b, &cfg);
    bring_up(&mut p.b, qb, Side::B, qa, psn_b, psn_a, &cfg);
    assert_eq!(
        p.a.set_multipath(qa, true),
        Err(DeviceError::InvalidState(QpState::Rts)),
        "chosen before RTR only"
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
fn assert_plain_but_offer(plain: &Captured, frames: &Captured, offer: (bool, bool)) {
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

/// Two QPs that both allow the extension agree in band: both end on. Until the trailers are
/// built (step 2 of docs/multipath.md, under way) nothing else changes on the wire.
#[test]
fn two_offering_qps_agree() {
    for (seed, loss) in [(3, 0.0), (5, 0.05)] {
        let plain = run(seed, (false, false), loss);
        let r = run(seed, (true, true), loss);
        assert_eq!(r.states, (MpState::On, MpState::On));
        assert_eq!(r.wcs, plain.wcs);
        assert_plain_but_offer(&plain.frames, &r.frames, (true, true));
    }
}

/// A packet that claims a trailer is never taken for data by a QP that cannot read it yet:
/// an offering QP turns the extension on (the peer offered) but drops and counts the packet,
/// placing nothing and answering nothing; the next plain packet (offer bit only) is handled
/// as today. A QP that does not allow the extension ignores the bits, as IBA 9.2 (and rxe)
/// ignore reserved bits.
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
        MpBthFlags::OFFER.bits(),
        "the ACK offers"
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
