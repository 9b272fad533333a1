//! QP state machine and modify (IBA 10.3, reference §2 "QP state"): the state table, error
//! flush, reset, SQD, CQ overflow, and memory deregistration under traffic.

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
