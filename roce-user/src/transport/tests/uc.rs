//! Unreliable Connected (IBA 9.7.5.1, qp/uc.rs): SEND, WRITE and WRITE with immediate end to
//! end, no ACK ever sent, a lost packet drops its message only, READ and atomics refused,
//! UC's attribute masks, and the responder's silent drops.

use std::{cell::RefCell, rc::Rc};

use super::sim::{Endpoint, bring_up_uc, connect_uc, frame_opcode_psn};
use super::*;

/// Whether `op` is one of UC's twelve opcodes (0x20..=0x2b).
fn is_uc(op: Opcode) -> bool {
    (0x20..=0x2b).contains(&op.0)
}

/// A pair with a UC connection, MTU 1024, a 64 KiB source region on A (bytes `i as u8`) and
/// a zeroed 64 KiB region on B that allows remote writes.
fn uc_pair(seed: u64) -> (Pair, Endpoint, Endpoint, MrInfo, MrInfo) {
    let mut p = Pair::new(seed, DeviceConfig::default(), Link::default());
    let (a, b) = connect_uc(&mut p, &RcConfig::default());
    let src: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    let ma = p.a.reg_mr(a.pd, src, 0x1000, Access::LOCAL_WRITE).unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; 65536], 0x1000, Access::all())
            .unwrap();
    (p, a, b, ma, mb)
}

fn sge(mr: &MrInfo, off: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr: 0x1000 + off,
        length: len,
        lkey: mr.lkey,
    }]
}

fn post_recv(p: &mut Pair, b: Endpoint, mb: &MrInfo, wr_id: u64, off: u64, len: u32) {
    p.b.post_recv(
        b.qpn,
        RecvWr {
            wr_id,
            sg_list: sge(mb, off, len),
        },
    )
    .unwrap();
}

/// Records every frame's opcode and AckReq bit, per sender, and lets all through.
fn record(p: &mut Pair) -> Rc<RefCell<Vec<(Side, Opcode, bool)>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = Rc::clone(&seen);
    p.filter = Some(Box::new(move |side, frame| {
        let f = parse_frame(frame).expect("own frames parse");
        s.borrow_mut()
            .push((side, f.roce.bth.opcode, f.roce.bth.ack_req));
        true
    }));
    seen
}

#[test]
fn uc_send_write_and_write_with_imm_round_trip_without_acks() {
    let (mut p, a, b, ma, mb) = uc_pair(1);
    let seen = record(&mut p);
    post_recv(&mut p, b, &mb, 10, 0, 8192);
    post_recv(&mut p, b, &mb, 11, 8192, 16);
    // A 3-packet SEND, a 5-packet WRITE, and a 1-packet WRITE with immediate.
    p.a.post_send(a.qpn, SendWr::send(1, sge(&ma, 0, 3000)))
        .unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(2, write(0x1000 + 16384, mb.rkey), sge(&ma, 100, 5000)),
    )
    .unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(
            3,
            SendOp::WriteWithImm {
                remote_addr: 0x1000 + 32768,
                rkey: mb.rkey,
                imm: 0xfeed_f00d,
            },
            sge(&ma, 200, 100),
        ),
    )
    .unwrap();
    assert!(p.drive(10_000));

    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    let got: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
        ]
    );
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    assert_eq!(wb.len(), 2, "{wb:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
        (10, WcStatus::Success, WcOpcode::Recv, 3000)
    );
    assert_eq!(wb[0].src_qp, a.qpn);
    assert_eq!(
        (wb[1].wr_id, wb[1].opcode, wb[1].byte_len, wb[1].imm),
        (11, WcOpcode::RecvRdmaWithImm, 100, 0xfeed_f00d)
    );
    assert!(wb[1].wc_flags.contains(WcFlags::WITH_IMM));
    let src: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    let mem = p.b.mrs().bytes(mb.lkey).unwrap();
    assert_eq!(&mem[..3000], &src[..3000]);
    assert_eq!(&mem[16384..16384 + 5000], &src[100..5100]);
    assert_eq!(&mem[32768..32768 + 100], &src[200..300]);

    // 3 + 5 + 1 packets from A, all UC, none asking for an ACK; nothing at all from B.
    let seen = seen.borrow();
    let ops: Vec<_> = seen.iter().map(|(_, op, _)| op.0).collect();
    assert_eq!(
        ops,
        [0x20, 0x21, 0x22, 0x26, 0x27, 0x27, 0x27, 0x28, 0x2b],
        "SEND FIRST/MIDDLE/LAST, WRITE FIRST/MIDDLE×3/LAST, WRITE ONLY with immediate"
    );
    assert!(
        seen.iter()
            .all(|(side, op, ack_req)| *side == Side::A && is_uc(*op) && !ack_req)
    );
    for d in [&p.a, &p.b] {
        let q = d.qps().next().unwrap();
        assert_eq!(q.state(), QpState::Rts);
        assert_eq!(q.counters().uc_msg_dropped, 0);
    }
}

#[test]
fn uc_requester_completes_when_sent_even_if_everything_is_lost() {
    let (mut p, a, b, ma, mb) = uc_pair(2);
    p.filter = Some(Box::new(|_, _| false));
    post_recv(&mut p, b, &mb, 10, 0, 8192);
    p.a.post_send(a.qpn, SendWr::send(1, sge(&ma, 0, 3000)))
        .unwrap();
    // No ACK timer: the pair goes idle at once, no retransmission.
    assert!(p.drive(1000));
    assert_eq!(p.stats.sent, 3);
    let wa = p.a.poll_cq(a.cq).unwrap();
    assert_eq!((wa.wr_id, wa.status), (1, WcStatus::Success));
    assert!(p.b.poll_cq(b.cq).is_none());
    assert_eq!(p.b.qp(b.qpn).unwrap().recv_queue_len(), 1);
    assert_eq!(p.a.qp(a.qpn).unwrap().send_queue_len(), 0);
    assert!(p.a.poll_timeout().is_none());
}

/// Two 3-packet SENDs with the packet `lose` (an opcode) of the first dropped on the link.
/// Returns B's receive completions and the pair.
fn two_sends_losing(lose: Opcode) -> (Vec<Wc>, Pair, Endpoint, MrInfo) {
    let (mut p, a, b, ma, mb) = uc_pair(3);
    let mut lost = false;
    p.filter = Some(Box::new(move |_, frame| {
        let (op, _) = frame_opcode_psn(frame).unwrap();
        if !lost && op == lose {
            lost = true;
            return false;
        }
        true
    }));
    post_recv(&mut p, b, &mb, 10, 0, 4096);
    post_recv(&mut p, b, &mb, 11, 4096, 4096);
    p.a.post_send(a.qpn, SendWr::send(1, sge(&ma, 0, 3000)))
        .unwrap();
    p.a.post_send(a.qpn, SendWr::send(2, sge(&ma, 5000, 2500)))
        .unwrap();
    assert!(p.drive(10_000));
    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    assert_eq!(wa.len(), 2);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success));
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    (wb, p, b, mb)
}

#[test]
fn uc_lost_middle_packet_drops_that_message_only() {
    let (wb, p, b, mb) = two_sends_losing(Opcode::UC_SEND_MIDDLE);
    // The first message is dropped; its receive WQE (10) was rewound, not consumed, and
    // takes the second message.
    assert_eq!(wb.len(), 1, "{wb:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (10, WcStatus::Success, 2500)
    );
    let src: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    assert_eq!(&p.b.mrs().bytes(mb.lkey).unwrap()[..2500], &src[5000..7500]);
    let q = p.b.qp(b.qpn).unwrap();
    assert_eq!(q.recv_queue_len(), 1);
    assert_eq!(q.state(), QpState::Rts);
    assert_eq!(q.counters().uc_msg_dropped, 1);
    assert_eq!(q.counters().out_of_sequence, 1);
}

#[test]
fn uc_lost_last_packet_drops_that_message_and_the_next_first_starts_the_next() {
    // rxe would drop the next message's FIRST too (qp/uc.rs); IBA 9.7.5.1 starts a new
    // message there.
    let (wb, p, b, _) = two_sends_losing(Opcode::UC_SEND_LAST);
    assert_eq!(wb.len(), 1, "{wb:?}");
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (10, 2500));
    assert_eq!(p.b.qp(b.qpn).unwrap().counters().uc_msg_dropped, 1);
}

#[test]
fn uc_lost_first_packet_drops_that_message() {
    let (wb, p, b, _) = two_sends_losing(Opcode::UC_SEND_FIRST);
    assert_eq!(wb.len(), 1, "{wb:?}");
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (10, 2500));
    assert_eq!(p.b.qp(b.qpn).unwrap().counters().uc_msg_dropped, 1);
}

#[test]
fn uc_lost_write_packet_leaves_the_next_write_intact() {
    let (mut p, a, b, ma, mb) = uc_pair(4);
    let mut lost = false;
    p.filter = Some(Box::new(move |_, frame| {
        let (op, _) = frame_opcode_psn(frame).unwrap();
        if !lost && op == Opcode::UC_RDMA_WRITE_MIDDLE {
            lost = true;
            return false;
        }
        true
    }));
    post_recv(&mut p, b, &mb, 10, 0, 16);
    let wimm = |wr_id, off: u64| {
        SendWr::new(
            wr_id,
            SendOp::WriteWithImm {
                remote_addr: 0x1000 + off,
                rkey: mb.rkey,
                imm: wr_id as u32,
            },
            sge(&ma, 0, 3000),
        )
    };
    p.a.post_send(a.qpn, wimm(1, 4096)).unwrap();
    p.a.post_send(a.qpn, wimm(2, 8192)).unwrap();
    assert!(p.drive(10_000));
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    assert_eq!(wb.len(), 1, "{wb:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].opcode, wb[0].imm, wb[0].byte_len),
        (10, WcOpcode::RecvRdmaWithImm, 2, 3000)
    );
    let src: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    assert_eq!(
        &p.b.mrs().bytes(mb.lkey).unwrap()[8192..8192 + 3000],
        &src[..]
    );
    assert_eq!(p.b.qp(b.qpn).unwrap().counters().uc_msg_dropped, 1);
}

#[test]
fn uc_refuses_read_atomics_and_send_with_invalidate_at_post() {
    let (mut p, a, _, ma, mb) = uc_pair(5);
    let ops = [
        read(0x1000, mb.rkey),
        SendOp::CompareSwap {
            remote_addr: 0x1000,
            rkey: mb.rkey,
            compare: 0,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: 0x1000,
            rkey: mb.rkey,
            add: 1,
        },
        SendOp::SendWithInv {
            invalidate_rkey: mb.rkey,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 64 };
        let r =
            p.a.post_send(a.qpn, SendWr::new(i as u64, op, sge(&ma, 0, len)));
        assert!(matches!(r, Err(PostError::Invalid(_))), "{op:?}: {r:?}");
    }
    assert_eq!(p.a.qp(a.qpn).unwrap().send_queue_len(), 0);
    assert_eq!(p.a.qp(a.qpn).unwrap().state(), QpState::Rts);
    assert!(p.drive(100));
    assert_eq!(p.stats.sent, 0);
}

#[test]
fn uc_modify_takes_ucs_masks_not_rcs() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Uc, pd, cq)).unwrap();
    let mut attr: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    // UC's INIT needs the access flags (a Q_Key is UD's).
    assert!(matches!(
        d.modify_qp(qpn, &attr, init | AttrMask::QKEY),
        Err(DeviceError::Modify(ModifyError::MissingAttributes { .. }))
    ));
    d.modify_qp(qpn, &attr, init | AttrMask::ACCESS_FLAGS)
        .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = Some(sim::path(Side::A));
    attr.dest_qp_num = Qpn::new(9);
    let rtr = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN;
    assert!(matches!(
        d.modify_qp(qpn, &attr, rtr),
        Err(DeviceError::Modify(ModifyError::MissingAttributes { missing, .. }))
            if missing == AttrMask::RQ_PSN
    ));
    for rc_only in [AttrMask::MAX_DEST_RD_ATOMIC, AttrMask::MIN_RNR_TIMER] {
        assert!(matches!(
            d.modify_qp(qpn, &attr, rtr | AttrMask::RQ_PSN | rc_only),
            Err(DeviceError::Modify(ModifyError::UnexpectedAttributes { extra, .. }))
                if extra == rc_only
        ));
    }
    d.modify_qp(qpn, &attr, rtr | AttrMask::RQ_PSN).unwrap();
    attr.qp_state = QpState::Rts;
    for rc_only in [
        AttrMask::TIMEOUT,
        AttrMask::RETRY_CNT,
        AttrMask::RNR_RETRY,
        AttrMask::MAX_QP_RD_ATOMIC,
    ] {
        assert!(matches!(
            d.modify_qp(qpn, &attr, AttrMask::STATE | AttrMask::SQ_PSN | rc_only),
            Err(DeviceError::Modify(
                ModifyError::UnexpectedAttributes { .. }
            ))
        ));
    }
    assert!(matches!(
        d.modify_qp(qpn, &attr, AttrMask::STATE),
        Err(DeviceError::Modify(ModifyError::MissingAttributes { .. }))
    ));
    d.modify_qp(qpn, &attr, AttrMask::STATE | AttrMask::SQ_PSN)
        .unwrap();
    assert_eq!(d.qp(qpn).unwrap().state(), QpState::Rts);
    // RTS -> SQD -> RTS, and SQE -> RTS exists for UC (not for RC).
    assert!(
        crate::transport::state::transition_masks(QpType::Uc, QpState::Sqe, QpState::Rts).is_some()
    );
    assert!(
        crate::transport::state::transition_masks(QpType::Rc, QpState::Sqe, QpState::Rts).is_none()
    );
}

/// A device with one UC QP in RTS whose peer (`PEER`) the test plays, as [`h`] for RC.
fn uc_h(access: Access) -> H {
    let cfg = RcConfig {
        access,
        ..RcConfig::default()
    };
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(cfg.cq_depth).unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Uc, pd, cq)).unwrap();
    bring_up_uc(
        &mut d,
        qpn,
        Side::B,
        Qpn::new(PEER),
        Psn::new(SQ_PSN),
        Psn::new(RQ_PSN),
        &cfg,
    );
    let mr = d.reg_mr(pd, vec![0; 1 << 18], BASE, Access::all()).unwrap();
    H {
        d,
        pd,
        qpn,
        cq,
        now: Instant::ZERO,
        mr,
        mtu: cfg.mtu.bytes(),
    }
}

/// A UC request header (no AckReq, as a UC requester sends).
fn uc_hdr(op: Opcode, psn: u32) -> RoceRepr {
    RoceRepr::new(BthRepr::new(op, Qpn::new(0), Psn::new(psn)))
}

#[test]
fn uc_responder_drops_silently_and_resynchronizes() {
    let mut h = uc_h(Access::REMOTE_WRITE);
    let m = h.mtu as usize;
    let full = vec![0xab; m];
    // A MIDDLE with no message in progress: dropped.
    h.rx(uc_hdr(Opcode::UC_SEND_MIDDLE, RQ_PSN), &full);
    assert_eq!(h.c().uc_msg_dropped, 1);
    // No receive WQE for a SEND ONLY: dropped (no RNR NAK on UC), counted in out_of_buffer.
    h.rx(uc_hdr(Opcode::UC_SEND_ONLY, RQ_PSN), &[1; 8]);
    assert_eq!((h.c().uc_msg_dropped, h.c().out_of_buffer), (2, 1));
    h.recv(1, 0, 64);
    // A SEND longer than the receive WQE: dropped, the WQE stays.
    h.rx(uc_hdr(Opcode::UC_SEND_ONLY, RQ_PSN), &[2; 100]);
    assert_eq!(h.c().uc_msg_dropped, 3);
    assert_eq!(h.d.qp(h.qpn).unwrap().recv_queue_len(), 1);
    // A WRITE outside the region's bounds: dropped.
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(uc_hdr(Opcode::UC_RDMA_WRITE_ONLY, RQ_PSN), 0x10, rkey, 8),
        &[3; 8],
    );
    assert_eq!(h.c().uc_msg_dropped, 4);
    // An RC opcode on a UC QP: dropped before any check.
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[4; 8]);
    assert_eq!(h.c().rx_dropped, 1);
    // A good SEND at any PSN (a FIRST or ONLY resynchronizes) is delivered.
    h.rx(uc_hdr(Opcode::UC_SEND_ONLY, RQ_PSN + 7), &[5; 8]);
    let wcs = h.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].byte_len), (1, 8));
    assert_eq!(h.mem(0, 8), [5; 8]);
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN + 8));
    // Nothing was ever answered, and the QP is still in RTS.
    assert!(h.tx().is_empty());
    assert_eq!(h.state(), QpState::Rts);
}

#[test]
fn uc_responder_refuses_writes_without_remote_write_access() {
    let mut h = uc_h(Access::empty());
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(uc_hdr(Opcode::UC_RDMA_WRITE_ONLY, RQ_PSN), BASE, rkey, 8),
        &[7; 8],
    );
    assert_eq!(h.c().uc_msg_dropped, 1);
    assert_eq!(h.mem(0, 8), [0; 8]);
    assert!(h.tx().is_empty());
    assert_eq!(h.state(), QpState::Rts);
}

#[test]
fn uc_malformed_receive_wqe_moves_the_qp_to_error_without_a_nak() {
    let mut h = uc_h(Access::REMOTE_WRITE);
    let bad = RecvWr {
        wr_id: 9,
        sg_list: vec![Sge {
            addr: 0,
            length: 64,
            lkey: LKey::new(0xdead_beef),
        }],
    };
    h.d.post_recv(h.qpn, bad).unwrap();
    h.rx(uc_hdr(Opcode::UC_SEND_ONLY, RQ_PSN), &[1; 8]);
    let wcs = h.wcs();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::LocProtErr));
    assert_eq!(h.state(), QpState::Err);
    assert!(h.tx().is_empty());
}

#[test]
fn uc_requester_local_protection_error_fails_the_wr_and_the_qp() {
    let mut h = uc_h(Access::REMOTE_WRITE);
    let wr = SendWr::send(
        4,
        vec![Sge {
            addr: 0,
            length: 8,
            lkey: LKey::new(0xdead_beef),
        }],
    );
    h.d.post_send(h.qpn, wr).unwrap();
    assert!(h.tx().is_empty());
    let wcs = h.wcs();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (4, WcStatus::LocProtErr));
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn uc_sqd_finishes_the_message_in_progress_then_reports_drained() {
    let mut h = uc_h(Access::REMOTE_WRITE);
    h.post(1, SendOp::Send, 0, 3000);
    h.post(2, SendOp::Send, 0, 8);
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(
        h.d.poll_transmit(h.now, &mut buf).is_some(),
        "the FIRST packet"
    );
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    h.d.modify_qp(h.qpn, &sqd, AttrMask::STATE).unwrap();
    assert!(h.d.poll_event().is_none(), "a message is still in progress");
    let rest = h.tx();
    let ops: Vec<_> = rest.iter().map(|(r, _)| r.bth.opcode).collect();
    assert_eq!(ops, [Opcode::UC_SEND_MIDDLE, Opcode::UC_SEND_LAST]);
    assert_eq!(
        h.d.poll_event(),
        Some(Event::SqDrained { qpn: h.qpn }),
        "drained once the message in progress went out; WR 2 waits for RTS"
    );
    let wcs = h.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id, 1);
    assert_eq!(h.d.qp(h.qpn).unwrap().send_queue_len(), 1);
}
