//! End to end over the simulated link (transport/sim.rs): two devices, every operation, ECN
//! marks and corrupted frames.

use super::*;

#[test]
fn pair_send_write_read_atomic_end_to_end() {
    let mut p = Pair::new(1, DeviceConfig::default(), Link::default());
    let (a, b) = connect_rc(&mut p, &RcConfig::default());
    let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::LOCAL_WRITE)
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; 8192], 0x1000, Access::all())
            .unwrap();
    p.b.post_recv(
        b.qpn,
        RecvWr {
            wr_id: 7,
            sg_list: vec![Sge {
                addr: 0x1000,
                length: 8192,
                lkey: mb.lkey,
            }],
        },
    )
    .unwrap();
    let sg = |off: u64, len: u32| {
        vec![Sge {
            addr: 0x1000 + off,
            length: len,
            lkey: ma.lkey,
        }]
    };
    p.a.post_send(a.qpn, SendWr::send(1, sg(0, 5000))).unwrap();
    let write_wr = SendWr::new(2, write(0x1000 + 6000, mb.rkey), sg(0, 2000));
    p.a.post_send(a.qpn, write_wr).unwrap();
    let read_wr = SendWr::new(3, read(0x1000 + 6000, mb.rkey), sg(3000, 2000));
    p.a.post_send(a.qpn, read_wr).unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(
            4,
            SendOp::CompareSwap {
                remote_addr: 0x1000 + 8,
                rkey: mb.rkey,
                compare: u64::from_le_bytes(src[8..16].try_into().unwrap()),
                swap: 77,
            },
            sg(4992, 8),
        ),
    )
    .unwrap();
    assert!(p.drive(10_000));
    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    let got: Vec<(u64, WcStatus)> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    let mbytes = p.b.mrs().bytes(mb.lkey).unwrap();
    assert_eq!(&mbytes[8..16], &77u64.to_le_bytes());
    assert_eq!(&mbytes[6000..8000], &src[..2000]);
    let abytes = p.a.mrs().bytes(ma.lkey).unwrap();
    assert_eq!(&abytes[3000..4992], &src[..1992]);
    assert_eq!(
        &abytes[4992..5000],
        &src[8..16],
        "CAS returned the original"
    );
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].byte_len, 5000);
    // Payload bytes per QP: A sent the SEND's 5000 and the WRITE's 2000 (a READ request and an
    // atomic carry headers only), B the READ response's 2000; nothing was lost or repeated.
    let (ca, cb) = (
        p.a.qp(a.qpn).unwrap().counters(),
        p.b.qp(b.qpn).unwrap().counters(),
    );
    assert_eq!((ca.tx_payload_bytes, ca.rx_payload_bytes), (7000, 2000));
    assert_eq!((cb.tx_payload_bytes, cb.rx_payload_bytes), (2000, 7000));
}

#[test]
fn sim_ce_marks_are_counted_by_the_receiving_qp() {
    let link = Link {
        ce: 1.0,
        ..Link::default()
    };
    let mut p = Pair::new(9, DeviceConfig::default(), link);
    let (a, b) = connect_rc(&mut p, &RcConfig::default());
    let ma =
        p.a.reg_mr(a.pd, vec![1; 4096], 0x1000, Access::empty())
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; 4096], 0x1000, Access::all())
            .unwrap();
    p.b.post_recv(
        b.qpn,
        RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: 0x1000,
                length: 4096,
                lkey: mb.lkey,
            }],
        },
    )
    .unwrap();
    let sg = vec![Sge {
        addr: 0x1000,
        length: 3000,
        lkey: ma.lkey,
    }];
    p.a.post_send(a.qpn, SendWr::send(1, sg)).unwrap();
    assert!(p.drive(1000));
    let cb = *p.b.qp(b.qpn).unwrap().counters();
    let ca = *p.a.qp(a.qpn).unwrap().counters();
    assert_eq!(
        cb.np_ecn_marked_roce_packets, 3,
        "three SEND packets, all marked"
    );
    assert_eq!(
        ca.np_ecn_marked_roce_packets, 1,
        "one ACK back (ECT(0) too), marked"
    );
    // The CNPs the marks caused are Not-ECT, so the link (like a switch) leaves them alone.
    let cnps: u64 = [(&p.a, a.qpn), (&p.b, b.qpn)]
        .iter()
        .map(|(d, q)| d.qp(*q).unwrap().congestion().unwrap().stats().np_cnp_sent)
        .sum();
    assert!(cnps > 0);
    assert_eq!(p.stats.ce_marked, 4);
    assert_eq!(p.a.poll_cq(a.cq).unwrap().status, WcStatus::Success);
}

#[test]
fn sim_corrupted_frames_fail_the_icrc_and_are_recovered_by_retransmission() {
    let link = Link {
        corrupt: 0.3,
        ..Link::default()
    };
    let mut p = Pair::new(5, DeviceConfig::default(), link);
    let (a, b) = connect_rc(&mut p, &RcConfig::default());
    let src: Vec<u8> = (0..8192u32).map(|i| (i % 241) as u8).collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::empty())
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; 8192], 0x1000, Access::all())
            .unwrap();
    let sg = vec![Sge {
        addr: 0x1000,
        length: 8192,
        lkey: ma.lkey,
    }];
    p.a.post_send(a.qpn, SendWr::new(1, write(0x1000, mb.rkey), sg))
        .unwrap();
    assert!(p.drive(100_000));
    assert_eq!(p.a.poll_cq(a.cq).unwrap().status, WcStatus::Success);
    assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &src[..]);
    let malformed = p.a.device_counters().rx_malformed + p.b.device_counters().rx_malformed;
    assert!(p.stats.corrupted > 0 && malformed > 0);
    let _ = b;
}

#[test]
fn sim_send_burst_past_the_posted_receives_gets_the_rnr_nak_and_loses_nothing() {
    send_burst_past_the_posted_receives(false);
}

/// The same burst with the default device, which coalesces the ACKs of one receive batch
/// (`DeviceConfig::coalesce_acks`): the RNR NAK is still sent, and nothing is lost.
#[test]
fn sim_send_burst_with_coalesced_acks_gets_the_rnr_nak_and_loses_nothing() {
    send_burst_past_the_posted_receives(true);
}

fn send_burst_past_the_posted_receives(coalesce_acks: bool) {
    // Issue 20: a burst of SENDs larger than the receives posted arrives before the responder
    // transmits anything, so its control queue fills with ACKs. The first SEND without a
    // receive WQE must still be answered with an RNR NAK (IBA: RNR NAK, class B), the
    // requester must wait the RNR timer and retry against rnr_retry (never its ACK timeout
    // and retry_cnt), and every message must arrive once, in order, when receives are posted.
    const N: u64 = 100;
    const POSTED: u64 = 40;
    const LEN: u32 = 64;
    let mut p = Pair::new(
        11,
        DeviceConfig {
            coalesce_acks,
            ..DeviceConfig::default()
        },
        Link::default(),
    );
    let cfg = RcConfig {
        // One transport retry would not be enough if the RNR NAK were lost: it would fail
        // after the ACK timeouts; RNR retries are unlimited.
        retry_cnt: 1,
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..RcConfig::default()
    };
    let (a, b) = connect_rc(&mut p, &cfg);
    let src: Vec<u8> = (0..N * u64::from(LEN))
        .map(|i| (i / 64) as u8 ^ (i as u8))
        .collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::empty())
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; src.len()], 0x1000, Access::LOCAL_WRITE)
            .unwrap();
    let post_recvs = |p: &mut Pair, ids: core::ops::Range<u64>| {
        for i in ids {
            let sg_list = vec![Sge {
                addr: 0x1000 + i * u64::from(LEN),
                length: LEN,
                lkey: mb.lkey,
            }];
            p.b.post_recv(b.qpn, RecvWr { wr_id: i, sg_list }).unwrap();
        }
    };
    post_recvs(&mut p, 0..POSTED);
    // Every NAK B sends (RNR or other), with its PSN, as the link sees them.
    let naks = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = naks.clone();
    p.filter = Some(Box::new(move |from, frame| {
        if from == Side::B
            && let Ok(f) = parse_frame(frame)
            && let Some(AethRepr { syndrome, .. }) = f.roce.aeth
            && !syndrome.is_ack()
        {
            seen.borrow_mut().push((syndrome, f.roce.bth.psn));
        }
        true
    }));
    let rnr_naks = || -> Vec<Psn> {
        let all = naks.borrow();
        assert!(
            all.iter()
                .all(|(s, _)| matches!(s, AethSyndrome::RnrNak { .. })),
            "only RNR NAKs: the RNR NAK stands for its gap: {all:?}"
        );
        all.iter().map(|(_, psn)| *psn).collect()
    };
    for i in 0..N {
        let sg = vec![Sge {
            addr: 0x1000 + i * u64::from(LEN),
            length: LEN,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::send(i, sg)).unwrap();
    }
    assert!(
        p.drive_until(10_000, |p| p.a.qp(a.qpn).unwrap().counters().rcvd_rnr_err
            >= 1),
        "the requester heard an RNR NAK"
    );
    let first_rnr = Psn::new(cfg.psn_a).wrapping_add(POSTED as u32);
    assert_eq!(rnr_naks().first(), Some(&first_rnr));
    let cb = *p.b.qp(b.qpn).unwrap().counters();
    if coalesce_acks {
        // The burst's ACKs were merged, at most ACK_COALESCE_MAX requests to one.
        let coalesced = p.b.device_counters().ack_coalesced;
        assert!(coalesced > 0, "the burst's ACKs were coalesced: {cb:?}");
    } else {
        assert!(
            cb.ack_deferred > 0,
            "the burst filled the control queue: {cb:?}"
        );
    }
    assert_eq!(cb.ack_queue_full, 0, "{cb:?}");
    // The application catches up; the requester's RNR retries then deliver the rest.
    post_recvs(&mut p, POSTED..N);
    assert!(p.drive(100_000), "the pair goes idle");

    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    assert_eq!(wa.len() as u64, N);
    for (i, w) in wa.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success));
    }
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    assert_eq!(wb.len() as u64, N, "each message delivered once");
    for (i, w) in wb.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (i as u64, WcStatus::Success, LEN)
        );
    }
    assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &src[..], "no data lost");

    let ca = *p.a.qp(a.qpn).unwrap().counters();
    let cb = *p.b.qp(b.qpn).unwrap().counters();
    assert!(ca.rcvd_rnr_err >= 1);
    assert_eq!(cb.send_rnr_err, rnr_naks().len() as u64);
    assert_eq!(
        ca.rcvd_rnr_err, cb.send_rnr_err,
        "every RNR NAK sent was heard"
    );
    assert_eq!(
        ca.local_ack_timeout_err, 0,
        "never waited for the ACK timeout: {ca:?}"
    );
    assert_eq!(
        ca.completer_retry_err, 0,
        "no transport retry (retry_cnt): {ca:?}"
    );
    assert_eq!(ca.retry_exceeded_err, 0);
    assert_eq!(cb.ack_queue_full, 0);
    assert_eq!(
        ca.rcvd_seq_err, 0,
        "no PSN sequence NAK: the RNR NAK stood for its gap"
    );
    assert_eq!(p.stats.lost, 0);
}

#[test]
fn sim_a_send_behind_a_read_costs_no_retry() {
    // The ACK of the SEND must not overtake the READ's response: the requester would take it
    // as an implied NAK and retry the READ against retry_cnt (here 0: the READ would fail).
    let mut p = Pair::new(2, DeviceConfig::default(), Link::default());
    let cfg = RcConfig {
        retry_cnt: 0,
        ..RcConfig::default()
    };
    let (a, b) = connect_rc(&mut p, &cfg);
    let ma =
        p.a.reg_mr(a.pd, vec![1; 8192], 0x1000, Access::LOCAL_WRITE)
            .unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 3) as u8).collect();
    let mb =
        p.b.reg_mr(b.pd, data.clone(), 0x1000, Access::all())
            .unwrap();
    let sg = |off: u64, len: u32| {
        vec![Sge {
            addr: 0x1000 + off,
            length: len,
            lkey: ma.lkey,
        }]
    };
    p.b.post_recv(
        b.qpn,
        RecvWr {
            wr_id: 7,
            sg_list: vec![Sge {
                addr: 0x1000,
                length: 64,
                lkey: mb.lkey,
            }],
        },
    )
    .unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(1, read(0x1000 + 64, mb.rkey), sg(0, 3000)),
    )
    .unwrap();
    p.a.post_send(a.qpn, SendWr::send(2, sg(4096, 64))).unwrap();
    assert!(p.drive(10_000));
    let got: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq))
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(&p.a.mrs().bytes(ma.lkey).unwrap()[..3000], &data[64..3064]);
    let ca = *p.a.qp(a.qpn).unwrap().counters();
    assert_eq!(
        (ca.implied_nak_seq_err, ca.completer_retry_err),
        (0, 0),
        "{ca:?}"
    );
    assert_eq!(p.b.qp(b.qpn).unwrap().counters().duplicate_request, 0);
}
