//! Shared receive queues over the simulated link (transport/srq.rs): several QPs of one device
//! share an SRQ, each message takes one WQE in arrival order, the armed limit fires once, an
//! empty SRQ answers with RNR NAKs, and the async events of SRQ-attached QPs.

use super::*;

/// Bytes of each receive buffer in these tests.
const BUF: u32 = 4096;

/// `n` RC connections A→B whose B ends all receive through one SRQ of `srq_wr` WQEs. Returns
/// the A endpoints, the B QPs, B's PD, CQ and SRQ, and a region of B with `2 * n` buffers.
struct Shared {
    p: Pair,
    a: Vec<sim::Endpoint>,
    b: Vec<Qpn>,
    cq: CqId,
    srq: SrqId,
    mr_b: MrInfo,
}

fn shared(n: usize, srq_wr: u32) -> Shared {
    let mut p = Pair::new(7, DeviceConfig::default(), Link::default());
    let cfg = RcConfig::default();
    let pd = p.b.alloc_pd().unwrap();
    let cq = p.b.create_cq(4096).unwrap();
    let srq =
        p.b.create_srq(
            pd,
            SrqAttr {
                max_wr: srq_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mr_b =
        p.b.reg_mr(pd, vec![0; BUF as usize * 32], BASE, Access::LOCAL_WRITE)
            .unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..n {
        let pda = p.a.alloc_pd().unwrap();
        let cqa = p.a.create_cq(4096).unwrap();
        let qa = p.a.create_qp(QpInit::new(QpType::Rc, pda, cqa)).unwrap();
        let qb =
            p.b.create_qp_with_srq(QpInit::new(QpType::Rc, pd, cq), Some(srq))
                .unwrap();
        let psn_a = Psn::new(0x10 + 0x1000 * i as u32);
        let psn_b = psn_a.wrapping_add(0x800);
        bring_up(&mut p.a, qa, Side::A, qb, psn_a, psn_b, &cfg);
        bring_up(&mut p.b, qb, Side::B, qa, psn_b, psn_a, &cfg);
        a.push(sim::Endpoint {
            qpn: qa,
            pd: pda,
            cq: cqa,
        });
        b.push(qb);
    }
    Shared {
        p,
        a,
        b,
        cq,
        srq,
        mr_b,
    }
}

impl Shared {
    /// Posts SRQ WQE `wr_id` over buffer `slot` of B's region.
    fn post(&mut self, wr_id: u64, slot: u64) {
        let wr = RecvWr {
            wr_id,
            sg_list: vec![Sge {
                addr: BASE + slot * u64::from(BUF),
                length: BUF,
                lkey: self.mr_b.lkey,
            }],
        };
        self.p.b.post_srq_recv(self.srq, wr).unwrap();
    }

    /// Sends `len` bytes of `fill` from A's connection `i`.
    fn send(&mut self, i: usize, wr_id: u64, fill: u8, len: usize) {
        let e = self.a[i];
        let mr = self
            .p
            .a
            .reg_mr(e.pd, vec![fill; len], BASE, Access::LOCAL_WRITE)
            .unwrap();
        let sg = vec![Sge {
            addr: BASE,
            length: len as u32,
            lkey: mr.lkey,
        }];
        self.p.a.post_send(e.qpn, SendWr::send(wr_id, sg)).unwrap();
    }

    fn recvs(&mut self) -> Vec<Wc> {
        core::iter::from_fn(|| self.p.b.poll_cq(self.cq)).collect()
    }

    /// B's events other than communication established.
    fn events(&mut self) -> Vec<Event> {
        core::iter::from_fn(|| self.p.b.poll_event())
            .filter(|e| !matches!(e, Event::CommEstablished { .. }))
            .collect()
    }
}

#[test]
fn srq_qps_take_one_wqe_per_message_in_arrival_order() {
    let mut s = shared(3, 16);
    for k in 0..6 {
        s.post(100 + k, k);
    }
    // Messages arrive from the QPs in the order 2, 0, 1, 1, 2, 0; each is 1.5 MTUs (two
    // packets), so a WQE stays with its QP across packets.
    let order = [2usize, 0, 1, 1, 2, 0];
    for (k, &i) in order.iter().enumerate() {
        s.send(i, k as u64, 0xa0 + k as u8, 1536);
        assert!(s.p.drive(10_000));
    }
    let wcs = s.recvs();
    assert_eq!(wcs.len(), 6);
    for (k, (wc, &i)) in wcs.iter().zip(&order).enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.wr_id, 100 + k as u64, "WQEs in arrival order");
        assert_eq!(wc.qp_num, s.b[i], "completed on the QP that received");
        assert_eq!(wc.byte_len, 1536);
        let mut got = vec![0u8; 1536];
        s.p.b
            .mrs()
            .memory(s.mr_b.lkey)
            .unwrap()
            .read(k * BUF as usize, &mut got)
            .unwrap();
        assert!(got.iter().all(|&b| b == 0xa0 + k as u8), "message {k}");
    }
    assert_eq!(s.p.b.srq(s.srq).unwrap().len(), 0);
    assert!(s.events().is_empty());
}

#[test]
fn srq_limit_event_fires_once_when_armed_and_not_before() {
    let mut s = shared(2, 8);
    for k in 0..8 {
        s.post(k, k);
    }
    // Not armed: taking WQEs raises nothing.
    s.send(0, 0, 1, 64);
    assert!(s.p.drive(10_000));
    assert!(s.events().is_empty());
    let arm = SrqAttr {
        srq_limit: 4,
        ..SrqAttr::default()
    };
    s.p.b
        .modify_srq(s.srq, &arm, SrqAttrMask::LIMIT.bits())
        .unwrap();
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 4);
    // 7 left; the message that leaves 3 (< 4) raises the event, exactly once.
    for k in 1..4 {
        s.send(k % 2, k as u64, 1, 64);
        assert!(s.p.drive(10_000));
        assert!(s.events().is_empty(), "{} WQEs left", 7 - k);
    }
    s.send(0, 4, 1, 64);
    assert!(s.p.drive(10_000));
    assert_eq!(s.events(), [Event::SrqLimitReached { srq: s.srq }]);
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 0, "disarmed");
    for k in 5..8 {
        s.send(k % 2, k as u64, 1, 64);
        assert!(s.p.drive(10_000));
    }
    assert!(s.events().is_empty(), "fires once per arming");
    assert_eq!(s.recvs().len(), 8);
    // Armed again on an empty SRQ: the next WQE taken fires it again.
    s.p.b
        .modify_srq(
            s.srq,
            &SrqAttr {
                srq_limit: 2,
                ..arm
            },
            SrqAttrMask::LIMIT.bits(),
        )
        .unwrap();
    s.post(50, 0);
    s.send(1, 9, 1, 64);
    assert!(s.p.drive(10_000));
    assert_eq!(s.events(), [Event::SrqLimitReached { srq: s.srq }]);
}

#[test]
fn empty_srq_answers_rnr_nak_until_a_wqe_is_posted() {
    let mut s = shared(2, 4);
    s.send(1, 1, 0x5a, 100);
    // Not long enough for the RNR retries (rnr_retry 7: forever) to give up.
    s.p.drive(200);
    let c = s.p.b.qp(s.b[1]).unwrap().counters();
    assert!(c.send_rnr_err > 0, "RNR NAKed: {c:?}");
    assert!(s.recvs().is_empty());
    s.post(77, 3);
    assert!(s.p.drive(100_000));
    let wcs = s.recvs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (77, WcStatus::Success));
    assert_eq!(wcs[0].qp_num, s.b[1]);
    let wa = s.p.a.poll_cq(s.a[1].cq).unwrap();
    assert_eq!((wa.wr_id, wa.status), (1, WcStatus::Success));
}

#[test]
fn srq_verbs_refuse_what_rxe_refuses() {
    let mut s = shared(1, 2);
    let qb = s.b[0];
    let wr = RecvWr {
        wr_id: 1,
        sg_list: Vec::new(),
    };
    // post_recv on an SRQ-attached QP: EINVAL in rxe.
    assert!(matches!(
        s.p.b.post_recv(qb, wr.clone()),
        Err(PostError::Invalid(_))
    ));
    // Full at max_wr (ENOMEM); more SGEs than max_sge (EINVAL).
    s.p.b.post_srq_recv(s.srq, wr.clone()).unwrap();
    s.p.b.post_srq_recv(s.srq, wr.clone()).unwrap();
    assert_eq!(
        s.p.b.post_srq_recv(s.srq, wr.clone()),
        Err(PostError::QueueFull(2))
    );
    let two = RecvWr {
        wr_id: 2,
        sg_list: vec![
            Sge {
                addr: BASE,
                length: 1,
                lkey: s.mr_b.lkey,
            };
            2
        ],
    };
    assert_eq!(
        s.p.b.post_srq_recv(s.srq, two),
        Err(PostError::TooManySge(2, 1))
    );
    // Sizes: 0 and beyond the device's limits.
    let pd = s.p.b.qp(qb).unwrap().init.pd;
    let attr = |max_wr, max_sge| SrqAttr {
        max_wr,
        max_sge,
        srq_limit: 0,
    };
    assert!(s.p.b.create_srq(pd, attr(0, 1)).is_err());
    assert!(s.p.b.create_srq(pd, attr(0x4001, 1)).is_err());
    assert!(s.p.b.create_srq(pd, attr(1, 33)).is_err());
    // A resize that would drop queued WQEs, a limit above the size.
    let m = |a: SrqAttrMask| a.bits();
    assert!(
        s.p.b
            .modify_srq(s.srq, &attr(1, 0), m(SrqAttrMask::MAX_WR))
            .is_err()
    );
    s.p.b
        .modify_srq(s.srq, &attr(4, 0), m(SrqAttrMask::MAX_WR))
        .unwrap();
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().max_wr, 4);
    let lim = SrqAttr {
        srq_limit: 5,
        ..attr(0, 0)
    };
    assert!(
        s.p.b
            .modify_srq(s.srq, &lim, m(SrqAttrMask::LIMIT))
            .is_err()
    );
    // Busy while a QP uses it, and its PD too.
    assert_eq!(s.p.b.destroy_srq(s.srq), Err(DeviceError::SrqInUse(s.srq)));
    s.p.b.destroy_qp(qb).unwrap();
    assert_eq!(s.p.b.dealloc_pd(pd), Err(DeviceError::PdInUse(pd)));
    s.p.b.destroy_srq(s.srq).unwrap();
    assert_eq!(s.p.b.destroy_srq(s.srq), Err(DeviceError::NoSuchSrq(s.srq)));
    assert!(
        s.p.b
            .create_qp_with_srq(QpInit::new(QpType::Rc, pd, s.cq), Some(s.srq))
            .is_err()
    );
}

#[test]
fn last_wqe_reached_when_an_srq_qp_enters_error() {
    let mut s = shared(2, 4);
    let qb = s.b[0];
    s.post(1, 0);
    s.post(2, 1);
    s.send(0, 1, 9, 10);
    assert!(s.p.drive(10_000));
    assert_eq!(s.recvs().len(), 1);
    // B's QPs were in RTS before the first request arrived: no COMM_EST.
    assert!(
        !core::iter::from_fn(|| s.p.b.poll_event())
            .any(|e| matches!(e, Event::CommEstablished { .. }))
    );
    // An explicit move to ERR: no QP_FATAL, but LAST_WQE_REACHED for the SRQ-attached QP.
    let err = QpAttr::<Path> {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    s.p.b.modify_qp(qb, &err, AttrMask::STATE).unwrap();
    assert_eq!(s.events(), [Event::QpLastWqeReached { qpn: qb }]);
    // The WQE left in the SRQ stays there for the other QP, which still receives.
    assert_eq!(s.p.b.srq(s.srq).unwrap().len(), 1);
    s.send(1, 2, 3, 10);
    assert!(s.p.drive(10_000));
    let wcs = s.recvs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (2, s.b[1]));
}

#[test]
fn comm_established_on_first_request_in_rtr() {
    let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
    let cfg = RcConfig::default();
    let (a, b) = connect_rc(&mut p, &cfg);
    // A second QP on B, brought only to RTR, connected to A's QP.
    let qb2 = p.b.create_qp(QpInit::new(QpType::Rc, b.pd, b.cq)).unwrap();
    let mut attr: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: cfg.access,
        ..QpAttr::default()
    };
    p.b.modify_qp(
        qb2,
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let psn = p.a.qp(a.qpn).unwrap().next_send_psn();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = Some(sim::path(Side::B));
    attr.path_mtu = cfg.mtu;
    attr.dest_qp_num = a.qpn;
    attr.rq_psn = psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 1;
    p.b.modify_qp(
        qb2,
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    let mr =
        p.b.reg_mr(b.pd, vec![0; 64], BASE, Access::LOCAL_WRITE)
            .unwrap();
    for id in 0..2 {
        let wr = RecvWr {
            wr_id: id,
            sg_list: vec![Sge {
                addr: BASE,
                length: 64,
                lkey: mr.lkey,
            }],
        };
        p.b.post_recv(qb2, wr).unwrap();
    }
    // Deliver two SENDs addressed to qb2 straight into B (A's QP targets the old QP).
    for k in 0..2u32 {
        let mut repr = hdr(
            Opcode::RC_SEND_ONLY,
            psn.value().wrapping_add(k) & 0xff_ffff,
        );
        repr.bth.dest_qp = qb2;
        let pkt = RxPkt {
            repr,
            payload: b"hi",
            ce: false,
            ip: None,
            udp_src_port: 0,
        };
        p.b.handle_decoded(Instant::ZERO, &pkt, None);
    }
    let evs: Vec<Event> = core::iter::from_fn(|| p.b.poll_event()).collect();
    assert_eq!(evs, [Event::CommEstablished { qpn: qb2 }], "once");
    assert_eq!(p.b.poll_cq(b.cq).map(|w| w.status), Some(WcStatus::Success));
}
