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
