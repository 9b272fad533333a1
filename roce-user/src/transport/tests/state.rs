//! QP state machine and modify (IBA 10.3, reference §2 "QP state"): the state table, error
//! flush, reset, SQD, CQ overflow, and memory deregistration under traffic; the lifetime rules
//! of CQs and PDs (`ibv_destroy_cq` and `ibv_dealloc_pd` refuse an object in use) and polling
//! into a slice.

use super::*;

#[test]
fn modify_enforces_the_state_table_and_masks() {
    let mut h = h();
    let qpn = h.d.create_qp(QpInit::new(QpType::Rc, h.pd, h.cq));
    let qpn = qpn.unwrap();
    let mut a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    let e = h.d.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT,
    );
    assert!(matches!(
        e,
        Err(DeviceError::Modify(ModifyError::MissingAttributes { missing, .. })) if missing == AttrMask::ACCESS_FLAGS
    ));
    let all = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    let e = h.d.modify_qp(qpn, &a, all | AttrMask::TIMEOUT);
    assert!(matches!(
        e,
        Err(DeviceError::Modify(ModifyError::UnexpectedAttributes { extra, .. })) if extra == AttrMask::TIMEOUT
    ));
    a.qp_state = QpState::Rts;
    assert!(matches!(
        h.d.modify_qp(qpn, &a, AttrMask::STATE),
        Err(DeviceError::Modify(ModifyError::IllegalTransition { .. }))
    ));
    a.qp_state = QpState::Sqe;
    assert!(matches!(
        h.d.modify_qp(qpn, &a, AttrMask::STATE),
        Err(DeviceError::Modify(ModifyError::IllegalTransition { .. }))
    ));
    a.qp_state = QpState::Init;
    a.port_num = 2;
    assert!(matches!(
        h.d.modify_qp(qpn, &a, all),
        Err(DeviceError::Modify(ModifyError::InvalidValue { .. }))
    ));
    a.port_num = 1;
    h.d.modify_qp(qpn, &a, all).unwrap();
    a.qp_state = QpState::Rtr;
    assert!(matches!(
        h.d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::PATH_MTU),
        Err(DeviceError::Modify(ModifyError::MissingAttributes { .. }))
    ));
    a.qp_state = QpState::Rts;
    a.cur_qp_state = QpState::Rts;
    assert!(
        matches!(
            h.d.modify_qp(h.qpn, &a, AttrMask::STATE | AttrMask::CUR_STATE),
            Ok(())
        ),
        "RTS->RTS with CUR_STATE"
    );
    a.qp_state = QpState::Rts;
    a.cur_qp_state = QpState::Rtr;
    assert!(matches!(
        h.d.modify_qp(h.qpn, &a, AttrMask::STATE | AttrMask::CUR_STATE),
        Err(DeviceError::Modify(
            ModifyError::CurrentStateMismatch { .. }
        ))
    ));
    assert!(matches!(
        h.d.modify_qp(h.qpn, &a, AttrMask::STATE | AttrMask::TIMEOUT),
        Err(DeviceError::Modify(
            ModifyError::UnexpectedAttributes { .. }
        ))
    ));
    let _ = h.mtu;
}

#[test]
fn modify_ud_reset_to_init_requires_qkey() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let qpn = d
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            sq_sig_all: true,
        })
        .unwrap();
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    let e = d.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT,
    );
    assert!(matches!(
        e,
        Err(DeviceError::Modify(ModifyError::MissingAttributes { missing, .. })) if missing == AttrMask::QKEY
    ));
}

#[test]
fn err_flushes_every_outstanding_wr_in_order() {
    let mut h = h();
    sends(&mut h, 3, 8);
    h.recv(10, 0, 8);
    h.recv(11, 8, 8);
    let _ = h.tx();
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    h.d.modify_qp(h.qpn, &a, AttrMask::STATE).unwrap();
    let w = h.wcs();
    let got: Vec<(u64, WcStatus)> = w.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr)
        ]
    );
    sends(&mut h, 1, 8);
    assert_eq!(
        h.wcs()[0].status,
        WcStatus::WrFlushErr,
        "posting in ERR flushes"
    );
    assert!(h.tx().is_empty());
    assert_eq!(h.c().req_cqe_flush_error, 4);
    assert_eq!(h.c().resp_cqe_flush_error, 2);
}

#[test]
fn reset_discards_queues_and_restarts() {
    let mut h = h();
    sends(&mut h, 2, 8);
    let a: QpAttr<Path> = QpAttr::default();
    h.d.modify_qp(h.qpn, &a, AttrMask::STATE).unwrap();
    assert_eq!(h.state(), QpState::Reset);
    assert!(h.wcs().is_empty());
    assert_eq!(h.d.qp(h.qpn).unwrap().send_queue_len(), 0);
    assert!(matches!(
        h.d.post_send(h.qpn, SendWr::send(1, vec![])),
        Err(PostError::InvalidState(QpState::Reset))
    ));
}

#[test]
fn sqd_finishes_started_wrs_and_reports_drained() {
    let mut h = h();
    sends(&mut h, 1, 8);
    let _ = h.tx();
    sends(&mut h, 1, 8);
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    h.d.modify_qp(h.qpn, &a, AttrMask::STATE).unwrap();
    assert!(h.tx().is_empty(), "SQD starts no new WR");
    assert_eq!(h.d.poll_event(), None);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1), &[]);
    assert_eq!(h.d.poll_event(), Some(Event::SqDrained { qpn: h.qpn }));
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    h.d.modify_qp(h.qpn, &a, AttrMask::STATE).unwrap();
    assert_eq!(h.tx().len(), 1);
}

#[test]
fn cq_overflow_is_reported_and_moves_the_qp_to_err() {
    let mut h = h_with(&RcConfig {
        cq_depth: 2,
        ..RcConfig::default()
    });
    sends(&mut h, 3, 8);
    let _ = h.tx();
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, ACK, 3), &[]);
    assert_eq!(h.d.poll_event(), Some(Event::CqOverflow { cq: h.cq }));
    assert!(h.d.cq(h.cq).unwrap().overflowed());
    assert_eq!(h.state(), QpState::Err);
    assert!(h.c().cq_overflow >= 1);
}

#[test]
fn dereg_mr_while_a_send_is_in_flight_fails_cleanly() {
    let mut h = h();
    let sg = h.sg(0, 3000);
    h.d.post_send(h.qpn, SendWr::send(1, sg)).unwrap();
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(h.d.poll_transmit(h.now, &mut buf).is_some());
    let lkey = h.mr.lkey;
    let mem = h.d.dereg_mr(lkey).unwrap();
    assert_eq!(mem.len(), 1 << 18);
    assert!(h.tx().is_empty());
    let w = h.wcs();
    assert_eq!(w[0].status, WcStatus::LocProtErr);
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn dereg_mr_during_a_remote_write_naks_remote_access() {
    let mut h = h();
    let rkey = h.mr.rkey;
    let mut f = with_reth(hdr(Opcode::RC_RDMA_WRITE_FIRST, RQ_PSN), BASE, rkey, 2048);
    f.bth.ack_req = false;
    h.rx(f, &[1; 1024]);
    let lkey = h.mr.lkey;
    h.d.dereg_mr(lkey).unwrap();
    h.rx(hdr(Opcode::RC_RDMA_WRITE_LAST, RQ_PSN + 1), &[1; 1024]);
    assert_eq!(h.acks(), vec![(Nak(RemoteAccessError), RQ_PSN + 1)]);
}

#[test]
fn explicit_modify_to_err_raises_no_fatal_event() {
    let mut h = h();
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    h.d.modify_qp(h.qpn, &a, AttrMask::STATE).unwrap();
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.d.poll_event(), None);
}

#[test]
fn destroy_cq_is_refused_while_a_qp_completes_on_it() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let send = d.create_cq(4).unwrap();
    let recv = d.create_cq(4).unwrap();
    let qpn = d
        .create_qp(QpInit {
            send_cq: send,
            recv_cq: recv,
            ..QpInit::new(QpType::Rc, pd, send)
        })
        .unwrap();
    // Both the send and the receive side hold their CQ (ibv_destroy_cq: EBUSY).
    assert_eq!(d.destroy_cq(send), Err(DeviceError::CqInUse(send)));
    assert_eq!(d.destroy_cq(recv), Err(DeviceError::CqInUse(recv)));
    assert!(d.cq(send).is_some() && d.cq(recv).is_some());
    d.destroy_qp(qpn).unwrap();
    d.destroy_cq(send).unwrap();
    d.destroy_cq(recv).unwrap();
    assert!(d.cq(send).is_none());
    assert_eq!(d.destroy_cq(send), Err(DeviceError::NoSuchCq(send)));
    assert_eq!(d.poll_cq(recv), None);
}

#[test]
fn destroyed_cq_slots_are_reused_and_count_against_max_cq_only_while_alive() {
    let mut d = Device::new(DeviceConfig {
        max_cq: 2,
        ..DeviceConfig::default()
    });
    let a = d.create_cq(4).unwrap();
    let b = d.create_cq(4).unwrap();
    assert_eq!(d.create_cq(4), Err(DeviceError::TooManyCqs(2)));
    d.destroy_cq(a).unwrap();
    // The freed slot is taken again, and the table stays at two.
    let c = d.create_cq(8).unwrap();
    assert_eq!(c, a);
    assert_ne!(c, b);
    assert_eq!(d.create_cq(4), Err(DeviceError::TooManyCqs(2)));
    // A QP on the reused slot completes there, not on a ghost of the old CQ.
    let pd = d.alloc_pd().unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, c)).unwrap();
    let a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
    d.post_recv(
        qpn,
        RecvWr {
            wr_id: 7,
            sg_list: vec![],
        },
    )
    .unwrap();
    let wc = d.poll_cq(c).unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushErr));
    assert_eq!(d.poll_cq(b), None);
}

#[test]
fn poll_cq_into_fills_the_slice_in_order_and_says_how_many() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(8).unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
    let err: QpAttr<Path> = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    d.modify_qp(qpn, &err, AttrMask::STATE).unwrap();
    for wr_id in 1..=3 {
        let wr = RecvWr {
            wr_id,
            sg_list: vec![],
        };
        d.post_recv(qpn, wr).unwrap();
    }
    let mut out = [Wc::default(); 2];
    assert_eq!(d.poll_cq_into(cq, &mut out), 2);
    assert_eq!(out.map(|w| w.wr_id), [1, 2]);
    assert!(out.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(d.poll_cq_into(cq, &mut out), 1);
    assert_eq!(out[0].wr_id, 3);
    assert_eq!(d.poll_cq_into(cq, &mut out), 0);
    assert_eq!(d.poll_cq_into(CqId(99), &mut out), 0);
}

#[test]
fn dealloc_pd_is_refused_while_a_qp_or_a_region_uses_it() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(4).unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
    let mr = d
        .reg_mr(pd, vec![0; 64], 0x2000, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(d.dealloc_pd(pd), Err(DeviceError::PdInUse(pd)));
    d.destroy_qp(qpn).unwrap();
    // The region alone still holds it.
    assert_eq!(d.dealloc_pd(pd), Err(DeviceError::PdInUse(pd)));
    d.dereg_mr(mr.lkey).unwrap();
    d.dealloc_pd(pd).unwrap();
    assert_eq!(d.dealloc_pd(pd), Err(DeviceError::NoSuchPd(pd)));
    assert_eq!(
        d.create_qp(QpInit::new(QpType::Rc, pd, cq)),
        Err(DeviceError::NoSuchPd(pd))
    );
    // And the QP alone holds it too.
    let pd = d.alloc_pd().unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
    assert_eq!(d.dealloc_pd(pd), Err(DeviceError::PdInUse(pd)));
    d.destroy_qp(qpn).unwrap();
    d.dealloc_pd(pd).unwrap();
}

/// A QP destroyed right after the completion of the last SEND it received, before the engine
/// transmitted again, still acknowledges that SEND (rxe acknowledges in the pass that
/// completes, so its consumers never see the completion first): otherwise the peer retries its
/// last message forever at retry_cnt 7 (ibv_srq_pingpong's server hung so). What a destroyed
/// QP owes goes out once; after that the device sends nothing more for it.
#[test]
fn a_destroyed_qp_still_sends_the_ack_it_owes() {
    let mut h = h();
    h.recv(1, 0, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    assert_eq!(h.wcs().len(), 1, "the receive completed");
    h.d.destroy_qp(h.qpn).unwrap();
    assert!(h.d.owes_transmit());
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    assert!(!h.d.owes_transmit());
    assert_eq!(h.tx(), vec![], "nothing more once it is paid");
    // A QP that owes nothing is gone at once.
    let mut h2 = self::h();
    h2.d.destroy_qp(h2.qpn).unwrap();
    assert!(!h2.d.owes_transmit());
}
