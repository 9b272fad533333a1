//! Requester rules (reference §2 "Requester", rxe_req.c): segmentation, AckReq, the PSN
//! window, initiator depth, solicited events, and the device's transmit budget.

use super::*;

#[test]
fn req_segments_messages_by_path_mtu() {
    for mtu in [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ] {
        let mut h = h_with(&RcConfig {
            mtu,
            ..RcConfig::default()
        });
        let m = mtu.bytes();
        let sg = h.sg(0, m * 2 + m / 2);
        h.d.post_send(h.qpn, SendWr::send(1, sg)).unwrap();
        h.d.post_send(h.qpn, SendWr::send(2, vec![])).unwrap();
        let out = h.tx();
        let got: Vec<_> = out
            .iter()
            .map(|(h, p)| (h.bth.opcode, p.len() as u32, h.bth.psn.value()))
            .collect();
        assert_eq!(
            got,
            [
                (Opcode::RC_SEND_FIRST, m, SQ_PSN),
                (Opcode::RC_SEND_MIDDLE, m, SQ_PSN + 1),
                (Opcode::RC_SEND_LAST, m / 2, SQ_PSN + 2),
                (Opcode::RC_SEND_ONLY, 0, SQ_PSN + 3),
            ],
            "{mtu:?}"
        );
    }
}

#[test]
fn req_ackreq_on_the_last_packet_and_every_64_packets() {
    let mut h = h();
    h.post(1, write(0, RKey::new(1)), 0, 100 * 1024);
    let out = h.tx();
    assert_eq!(out.len(), 100);
    let with: Vec<usize> = out
        .iter()
        .enumerate()
        .filter(|(_, (h, _))| h.bth.ack_req)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(with, [63, 99]);
    assert!(out[0].0.reth.is_some() && out[1].0.reth.is_none());
}

#[test]
fn req_window_stalls_at_128_unacked_psns() {
    let mut h = h();
    h.post(1, write(0, RKey::new(1)), 0, 200 * 1024);
    assert_eq!(h.tx().len(), 128);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 63, ACK, 0), &[]);
    assert_eq!(h.tx().len(), 64);
    assert!(h.wcs().is_empty(), "the WRITE is not complete yet");
}

#[test]
fn req_max_rd_atomic_limits_outstanding_reads() {
    let mut h = h_with(&RcConfig {
        rd_atomic: 2,
        ..RcConfig::default()
    });
    for i in 0..3 {
        h.post(i, read(0, RKey::new(1)), i * 64, 8);
    }
    assert_eq!(h.tx().len(), 2);
    h.rx(
        aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_ONLY, SQ_PSN, ACK, 1),
        &[1; 8],
    );
    let out = h.tx();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.psn, Psn::new(SQ_PSN + 2));
    assert_eq!(h.wcs().len(), 1);
}

#[test]
fn req_solicited_event_only_on_the_last_packet() {
    let mut h = h();
    let sg = h.sg(0, 2000);
    let mut wr = SendWr::send(1, sg);
    wr.op = SendOp::SendWithImm { imm: 0x55 };
    wr.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    h.d.post_send(h.qpn, wr).unwrap();
    let out = h.tx();
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_SEND_FIRST);
    assert!(!out[0].0.bth.solicited && out[0].0.immdt.is_none());
    assert_eq!(out[1].0.bth.opcode, Opcode::RC_SEND_LAST_WITH_IMMEDIATE);
    assert!(out[1].0.bth.solicited);
    assert_eq!(out[1].0.immdt, Some(ImmDtRepr { imm: 0x55 }));
}

#[test]
fn poll_transmit_serves_a_qp_only_if_its_largest_frame_fits() {
    let mut h = h();
    sends(&mut h, 1, 8);
    let mut small = vec![0; max_frame_len(Mtu::Mtu512)];
    assert!(
        h.d.poll_transmit(h.now, &mut small).is_none(),
        "MTU 1024 needs more"
    );
    let mut umem_frame = vec![0; 4096];
    assert!(h.d.poll_transmit(h.now, &mut umem_frame).is_some());
}

/// A harness whose QP takes up to 400 bytes of inline data, at path MTU `mtu`.
fn h_inline(mtu: Mtu) -> H {
    h_with(&RcConfig {
        mtu,
        cap: QpCap {
            max_inline_data: 400,
            ..QpCap::default()
        },
        ..RcConfig::default()
    })
}

/// A signalled inline WR `wr_id` doing `op` with `data`.
fn inline(wr_id: u64, op: SendOp, data: &[u8]) -> SendWr<Path> {
    let mut wr = SendWr::new(wr_id, op, vec![]);
    wr.inline_data = Some(data.into());
    wr
}

#[test]
fn req_inline_data_is_sent_from_the_wr_and_resent_unchanged() {
    // IBV_SEND_INLINE (IBA 11.4.1.1; rxe copies the bytes into the WQE at post time): the
    // payload comes from the WR, not from a memory region, and a retransmission after the
    // local ACK timeout sends the same bytes again. Path MTU 256 splits 400 bytes in two.
    let mut h = h_inline(Mtu::Mtu256);
    let data: Vec<u8> = (0..400u32).map(|i| (i * 7 + 3) as u8).collect();
    h.d.post_send(h.qpn, inline(1, write(0x9000, RKey::new(5)), &data))
        .unwrap();
    h.d.post_send(h.qpn, inline(2, SendOp::Send, &data[..10]))
        .unwrap();
    let first = h.tx();
    let got: Vec<_> = first
        .iter()
        .map(|(r, p)| (r.bth.opcode, r.bth.psn.value(), p.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (Opcode::RC_RDMA_WRITE_FIRST, SQ_PSN, data[..256].to_vec()),
            (Opcode::RC_RDMA_WRITE_LAST, SQ_PSN + 1, data[256..].to_vec()),
            (Opcode::RC_SEND_ONLY, SQ_PSN + 2, data[..10].to_vec()),
        ]
    );
    let reth = first[0].0.reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x9000, RKey::new(5), 400)
    );
    // The MR the harness registered is untouched by an inline WR: scribbling over it changes
    // nothing that is sent.
    h.set_mem(0, &[0xee; 512]);
    h.advance_to_timeout();
    // The replay's first packet alone, until the peer answers; it lost it and acknowledges
    // it now, and the rest follows.
    let mut again = h.tx();
    assert_eq!(again.len(), 1, "the first PSN goes again");
    assert!(again[0].0.bth.ack_req);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 0), &[]);
    again.extend(h.tx());
    assert_eq!(again.len(), 3, "all three PSNs go again");
    for ((r0, p0), (r1, p1)) in first.iter().zip(&again) {
        assert_eq!((r0.bth.opcode, r0.bth.psn), (r1.bth.opcode, r1.bth.psn));
        assert_eq!(
            p0, p1,
            "a retransmission sends the bytes given at post time"
        );
    }
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, ACK, 2), &[]);
    let wcs = h.wcs();
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(h.c().send_err, 0);
}

#[test]
fn req_inline_data_is_refused_where_verbs_refuse_it() {
    // rxe `validate_send_wr` / `rxe_qp_chk_cap`: EINVAL beyond max_inline_data, for READ and
    // atomics, and (ours) with an SG list beside the bytes; a QP cannot ask for more inline
    // data than the device offers.
    let mut h = h_inline(Mtu::Mtu1024);
    let too_long = inline(1, SendOp::Send, &[0; 401]);
    assert!(matches!(
        h.d.post_send(h.qpn, too_long),
        Err(PostError::Invalid(_))
    ));
    for op in [
        read(0, RKey::new(1)),
        SendOp::FetchAdd {
            remote_addr: 0,
            rkey: RKey::new(1),
            add: 1,
        },
    ] {
        assert!(matches!(
            h.d.post_send(h.qpn, inline(2, op, &[0; 8])),
            Err(PostError::Invalid(_))
        ));
    }
    let mut both = inline(3, SendOp::Send, &[1; 8]);
    both.sg_list = h.sg(0, 8);
    assert!(matches!(
        h.d.post_send(h.qpn, both),
        Err(PostError::Invalid(_))
    ));
    // A QP created without inline room refuses any inline byte, an empty inline WR is a
    // zero-length message.
    let mut plain = super::h();
    assert!(matches!(
        plain
            .d
            .post_send(plain.qpn, inline(4, SendOp::Send, &[0; 1])),
        Err(PostError::Invalid(_))
    ));
    plain
        .d
        .post_send(plain.qpn, inline(5, SendOp::Send, &[]))
        .unwrap();
    let out = plain.tx();
    assert_eq!(out.len(), 1);
    assert!(out[0].1.is_empty());
    assert!(h.tx().is_empty(), "nothing refused was queued");
    // The device limit (400, rxe's RXE_MAX_INLINE_DATA).
    let pd = h.pd;
    let init = QpInit {
        cap: QpCap {
            max_inline_data: 401,
            ..QpCap::default()
        },
        ..QpInit::new(QpType::Rc, pd, h.cq)
    };
    assert!(matches!(
        h.d.create_qp(init),
        Err(DeviceError::TooLarge(401, 400))
    ));
}
