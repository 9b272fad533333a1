//! Completer rules (reference §2 "Completer", rxe_comp.c): ACKs, NAKs, RNR NAKs, READ and
//! atomic responses, retries and the local ACK timer.

use super::sim::frame_opcode_psn;
use super::*;
use crate::cc::{CcAlgorithm, CcSnapshot, DcqcnConfig};
use core::time::Duration;

#[test]
fn comp_ack_completes_every_covered_wr_in_order() {
    let mut h = h();
    sends(&mut h, 3, 8);
    assert_eq!(h.tx().len(), 3);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, ACK, 3), &[]);
    let ids: Vec<u64> = h.wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(
        h.d.poll_timeout(),
        None,
        "nothing outstanding: timer stopped"
    );
}

#[test]
fn comp_ack_covering_an_unanswered_read_is_an_implied_nak() {
    let mut h = h();
    h.post(1, read(0, RKey::new(1)), 0, 8);
    sends(&mut h, 1, 8);
    assert_eq!(h.tx().len(), 2);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 1, ACK, 2), &[]);
    assert!(h.wcs().is_empty());
    assert_eq!(h.c().implied_nak_seq_err, 1);
    let out = h.tx();
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(out[0].0.bth.psn, Psn::new(SQ_PSN));
}

#[test]
fn comp_rnr_nak_waits_the_rnr_timer_then_retries() {
    let mut h = h();
    sends(&mut h, 1, 8);
    let _ = h.tx();
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, rnr(14), 0), &[]);
    assert!(h.tx().is_empty(), "stalled during the RNR timer");
    assert_eq!(
        h.d.poll_timeout(),
        Some(h.now + core::time::Duration::from_micros(1280))
    );
    h.advance_to_timeout();
    let out = h.tx();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.psn, Psn::new(SQ_PSN));
    assert_eq!(h.c().rcvd_rnr_err, 1);
}

#[test]
fn comp_rnr_retry_exhausted_completes_with_rnr_retry_exceeded() {
    let mut h = h_with(&RcConfig {
        rnr_retry: 1,
        ..RcConfig::default()
    });
    sends(&mut h, 2, 8);
    let _ = h.tx();
    for _ in 0..2 {
        h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, rnr(1), 0), &[]);
        if h.state() == QpState::Rts {
            h.advance_to_timeout();
            let _ = h.tx();
        }
    }
    let w = h.wcs();
    assert_eq!(w[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(w[1].status, WcStatus::WrFlushErr);
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.c().retry_rnr_exceeded_err, 1);
    assert_eq!(h.c().rnr_nak_retry_err, 1);
}

#[test]
fn comp_rnr_retry_7_retries_forever() {
    let mut h = h_with(&RcConfig {
        rnr_retry: 7,
        ..RcConfig::default()
    });
    sends(&mut h, 1, 8);
    let _ = h.tx();
    for _ in 0..50 {
        h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, rnr(1), 0), &[]);
        h.advance_to_timeout();
        assert_eq!(h.tx().len(), 1);
    }
    assert_eq!(h.state(), QpState::Rts);
    assert_eq!(h.c().rcvd_rnr_err, 50);
}

#[test]
fn comp_nak_psn_sequence_error_goes_back_n_from_the_nak_psn() {
    let mut h = h();
    sends(&mut h, 4, 8);
    assert_eq!(h.tx().len(), 4);
    h.rx(
        aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, Nak(PsnSequenceError), 2),
        &[],
    );
    let ids: Vec<u64> = h.wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2], "the NAK implicitly acks the earlier PSNs");
    let psns: Vec<u32> = h.tx().iter().map(|(h, _)| h.bth.psn.value()).collect();
    assert_eq!(psns, [SQ_PSN + 2, SQ_PSN + 3]);
    assert_eq!(h.c().rcvd_seq_err, 1);
    assert_eq!(h.c().packet_seq_err, 1);
}

#[test]
fn comp_nak_codes_map_to_work_completion_statuses() {
    for (code, status) in [
        (Nak(InvalidRequest), WcStatus::RemInvReqErr),
        (Nak(RemoteAccessError), WcStatus::RemAccessErr),
        (Nak(RemoteOperationalError), WcStatus::RemOpErr),
        (Nak(Unknown(0x0f)), WcStatus::RemOpErr),
    ] {
        let mut h = h();
        sends(&mut h, 2, 8);
        let _ = h.tx();
        h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, code, 0), &[]);
        let w = h.wcs();
        assert_eq!(w[0].status, status, "{code:?}");
        assert_eq!(w[1].status, WcStatus::WrFlushErr);
        assert_eq!(h.state(), QpState::Err);
        assert_eq!(
            h.d.poll_event(),
            Some(Event::QpFatal {
                qpn: h.qpn,
                from: QpState::Rts
            })
        );
    }
}

#[test]
fn comp_local_ack_timeout_retries_then_fails_with_retry_exceeded() {
    let mut h = h_with(&RcConfig {
        retry_cnt: 2,
        timeout: 10,
        ..RcConfig::default()
    });
    sends(&mut h, 1, 8);
    let _ = h.tx();
    assert_eq!(
        h.d.poll_timeout(),
        Some(h.now + local_ack_timeout(10).unwrap())
    );
    assert_eq!(local_ack_timeout(10).unwrap().as_nanos(), 4096 << 10);
    for n in 1..=2 {
        h.advance_to_timeout();
        assert_eq!(h.tx().len(), 1, "retry {n}");
    }
    h.advance_to_timeout();
    assert_eq!(h.wcs()[0].status, WcStatus::RetryExcErr);
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.c().local_ack_timeout_err, 3);
    assert_eq!(h.c().retry_exceeded_err, 1);
    assert_eq!(h.c().req_transport_retries_exceeded, 1);
}

#[test]
fn comp_read_resumes_mid_way_after_a_lost_response() {
    let mut h = h();
    h.post(1, read(0x5000, RKey::new(9)), 0, 3000);
    let _ = h.tx();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 3) as u8).collect();
    h.rx(
        aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_FIRST, SQ_PSN, ACK, 1),
        &data[..1024],
    );
    // PSN+1 is lost; LAST arrives.
    h.rx(
        aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_LAST, SQ_PSN + 2, ACK, 1),
        &data[2048..],
    );
    assert_eq!(h.c().implied_nak_seq_err, 1);
    let out = h.tx();
    assert_eq!(out.len(), 1);
    let r = out[0].0.reth.unwrap();
    assert_eq!(out[0].0.bth.psn, Psn::new(SQ_PSN + 1));
    assert_eq!((r.va, r.dma_len), (0x5000 + 1024, 3000 - 1024));
    h.rx(
        aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_FIRST, SQ_PSN + 1, ACK, 1),
        &data[1024..2048],
    );
    h.rx(
        aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_LAST, SQ_PSN + 2, ACK, 1),
        &data[2048..],
    );
    let w = h.wcs();
    assert_eq!(w[0].status, WcStatus::Success);
    assert_eq!(w[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(h.mem(0, 3000), data);
}

#[test]
fn comp_response_for_an_unsent_psn_is_a_dropped_ghost() {
    let mut h = h();
    sends(&mut h, 1, 8);
    let _ = h.tx();
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 5, ACK, 0), &[]);
    assert!(h.wcs().is_empty());
    assert_eq!(h.c().rx_dropped, 1);
}

#[test]
fn comp_duplicate_read_response_is_dropped() {
    let mut h = h();
    h.post(1, read(0, RKey::new(1)), 0, 8);
    let _ = h.tx();
    let resp = aeth_hdr(Opcode::RC_RDMA_READ_RESPONSE_ONLY, SQ_PSN, ACK, 1);
    h.rx(resp, &[4; 8]);
    h.rx(resp, &[5; 8]);
    assert_eq!(h.wcs().len(), 1);
    assert_eq!(h.mem(0, 8), vec![4; 8]);
}

#[test]
fn comp_atomic_ack_delivers_the_original_value() {
    let mut h = h();
    let fetch_add = SendOp::FetchAdd {
        remote_addr: 0x8,
        rkey: RKey::new(1),
        add: 2,
    };
    h.post(1, fetch_add, 0, 8);
    let out = h.tx();
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_FETCH_ADD);
    let mut ack = aeth_hdr(Opcode::RC_ATOMIC_ACKNOWLEDGE, SQ_PSN, ACK, 1);
    ack.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 42 });
    h.rx(ack, &[]);
    let w = h.wcs();
    assert_eq!(w[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(h.mem(0, 8), 42u64.to_le_bytes());
}

#[test]
fn comp_retry_resends_a_partially_acked_write_from_the_first_unacked_packet() {
    let mut h = h();
    h.post(1, write(0x9000, RKey::new(3)), 0, 5 * 1024);
    assert_eq!(h.tx().len(), 5);
    // The responder got PSN..PSN+1 and NAKs PSN+2 (rxe req_retry skips the acked packets).
    h.rx(
        aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, Nak(PsnSequenceError), 0),
        &[],
    );
    let out = h.tx();
    let got: Vec<(Opcode, u32)> = out
        .iter()
        .map(|(h, _)| (h.bth.opcode, h.bth.psn.value()))
        .collect();
    assert_eq!(
        got,
        [
            (Opcode::RC_RDMA_WRITE_MIDDLE, SQ_PSN + 2),
            (Opcode::RC_RDMA_WRITE_MIDDLE, SQ_PSN + 3),
            (Opcode::RC_RDMA_WRITE_LAST, SQ_PSN + 4)
        ]
    );
    assert_eq!(
        out[0].1,
        h.mem(2048, 1024),
        "the payload of the third packet"
    );
}

#[test]
fn comp_only_one_retry_sequence_at_a_time() {
    let mut h = h_with(&RcConfig {
        retry_cnt: 1,
        ..RcConfig::default()
    });
    sends(&mut h, 3, 8);
    let _ = h.tx();
    let nak = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 1, Nak(PsnSequenceError), 1);
    h.rx(nak, &[]);
    assert_eq!(h.tx().len(), 2, "go back to PSN+1");
    // A second NAK for the same gap (a duplicate) starts no second retry and costs none.
    h.rx(nak, &[]);
    assert!(h.tx().is_empty());
    assert_eq!(h.state(), QpState::Rts);
    assert_eq!(h.c().completer_retry_err, 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, ACK, 3), &[]);
    assert_eq!(h.wcs().len(), 3);
}

/// A QP with congestion control `cc` and a 4 ms local ACK timeout (`timeout` 10), on a device
/// that answers every AckReq ([`h_with`]).
fn h_cc(cc: CcConfig) -> H {
    h_on(
        &RcConfig {
            timeout: 10,
            ..RcConfig::default()
        },
        DeviceConfig {
            coalesce_acks: false,
            cc,
            ..DeviceConfig::default()
        },
    )
}

/// A QP with the software DCQCN profile (`loss_backoff` on) and a 4 ms local ACK timeout
/// (`timeout` 10) that has sent four SENDs, `SQ_PSN..SQ_PSN + 3`, and whose timer fired: the
/// replay is due, the rate halved for the loss.
fn timed_out(swift: bool) -> H {
    let mut cc = CcConfig {
        dcqcn: DcqcnConfig::software(),
        ..CcConfig::default()
    };
    if swift {
        cc.set_algorithm(CcAlgorithm::Swift);
    }
    let mut h = h_cc(cc);
    sends(&mut h, 4, 8);
    assert_eq!(h.tx().len(), 4);
    h.advance_to_timeout();
    assert_eq!(h.c().local_ack_timeout_err, 1);
    h
}

fn cc_of(h: &H) -> CcSnapshot {
    h.d.qp(h.qpn).unwrap().congestion().unwrap().snapshot()
}

/// Issue 20: Swift's RTT sample ends at the response's arrival stamp, not when this process
/// got to it. A SEND that left at 1 ms, whose ACK arrived at 1.1 ms but was handled in a batch
/// at 5 ms, gives a 100 µs sample; the same ACK without a stamp (its handling time is its
/// arrival) gives 4 ms, the process's wait read as queueing.
#[test]
fn comp_swift_rtt_sample_ends_at_the_acks_arrival() {
    for (stamped, want_us) in [(true, 100u64), (false, 4_000)] {
        let mut cc = CcConfig::default();
        cc.set_algorithm(CcAlgorithm::Swift);
        let mut h = h_cc(cc);
        h.now = Instant::from_micros(1_000);
        sends(&mut h, 1, 8);
        assert_eq!(h.tx().len(), 1);
        let handled = Instant::from_micros(5_000);
        let arrival = if stamped {
            Instant::from_micros(1_100)
        } else {
            handled
        };
        let repr = aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1);
        h.rx_arrived(handled, arrival, repr, &[], false);
        h.now = handled;
        assert_eq!(h.wcs().len(), 1, "stamped: {stamped}");
        let cc = cc_of(&h);
        assert_eq!(cc.rtt_ns, Some(want_us * 1_000), "stamped: {stamped}");
        assert_eq!(cc.stats.swift_rtt_samples, 1, "stamped: {stamped}");
    }
}

#[test]
fn comp_timeout_replays_its_first_packet_until_the_peer_answers() {
    let mut h = timed_out(false);
    let probe = h.tx();
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].0.bth.psn.value(), SQ_PSN);
    assert!(probe[0].0.bth.ack_req, "it asks for an answer");
    assert!(h.tx().is_empty(), "nothing more before an answer");
    // The doubled timer fires again with no answer: the first packet again, alone.
    while h.c().local_ack_timeout_err < 2 {
        h.advance_to_timeout();
    }
    let again: Vec<u32> = h.tx().iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(again, [SQ_PSN]);
    // The peer had lost it: its ACK lets the rest of the replay go.
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1), &[]);
    let rest: Vec<u32> = h.tx().iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(rest, [SQ_PSN + 1, SQ_PSN + 2, SQ_PSN + 3]);
    assert_eq!(h.c().spurious_timeouts, 0);
}

#[test]
fn comp_timeout_proved_spurious_by_a_duplicate_report_undoes_its_rate_cut() {
    let mut h = timed_out(false);
    let line = CcConfig::default().line_rate_bps;
    let cut = cc_of(&h);
    assert_eq!((cut.rate_bps, cut.stats.rp_loss_handled), (line / 2, 1));
    assert_eq!(h.tx().len(), 1);
    // The peer had paused. Its ACK of the first two originals comes after the replay's first
    // packet left; the replay goes on with the two after them.
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 1, ACK, 2), &[]);
    let rest: Vec<u32> = h.tx().iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(rest, [SQ_PSN + 2, SQ_PSN + 3]);
    // Its ACK of the last original proves nothing by itself now: it could be for the replay.
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.wcs().len(), 4);
    assert_eq!(h.c().spurious_timeouts, 0);
    assert_eq!(cc_of(&h).rate_bps, line / 2);
    // Then the replayed packets reach it as duplicates, each re-acknowledged with the last
    // PSN it took (C9-105): it had the original of SQ_PSN + 3.
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 1);
    let undone = cc_of(&h);
    assert_eq!(
        (undone.rate_bps, undone.limited, undone.stats.rp_loss_undone),
        (line, false, 1),
        "back to where the QP was before the timeout"
    );
    // The other duplicates' reports change nothing more.
    for _ in 0..3 {
        h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    }
    assert_eq!(h.c().spurious_timeouts, 1);
    assert_eq!(cc_of(&h).stats.rp_loss_undone, 1);
    assert_eq!(h.c().local_ack_timeout_err, 1);
}

#[test]
fn comp_timeout_proved_spurious_before_the_replay_left_skips_the_replay() {
    for probe_sent in [false, true] {
        let mut h = timed_out(false);
        if probe_sent {
            assert_eq!(h.tx().len(), 1);
        }
        // The ACK of the last original comes before the replay could send it again.
        h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
        assert_eq!(h.c().spurious_timeouts, 1);
        assert_eq!(cc_of(&h).rate_bps, CcConfig::default().line_rate_bps);
        assert_eq!(h.wcs().len(), 4);
        assert!(h.tx().is_empty(), "nothing is left to replay");
    }
}

#[test]
fn comp_timeout_that_repaired_a_loss_keeps_its_rate_cut() {
    let line = CcConfig::default().line_rate_bps;
    // The tail was lost: the peer took SQ_PSN..SQ_PSN + 2 (their ACK lost), not SQ_PSN + 3.
    // The replay's first packet is a duplicate to it (re-acknowledged with SQ_PSN + 2); the
    // replay goes on with the fourth, new to it.
    let mut h = timed_out(false);
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 2, ACK, 3), &[]);
    let rest: Vec<u32> = h.tx().iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(rest, [SQ_PSN + 3]);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.wcs().len(), 4);
    // The head was lost: every replayed packet is new to the peer, each acknowledged once.
    let mut g = timed_out(false);
    assert_eq!(g.tx().len(), 1);
    g.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1), &[]);
    assert_eq!(g.tx().len(), 3);
    for i in 1..4 {
        g.rx(
            aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + i, ACK, i + 1),
            &[],
        );
    }
    assert_eq!(g.wcs().len(), 4);
    for h in [&h, &g] {
        assert_eq!(h.c().spurious_timeouts, 0);
        let cc = cc_of(h);
        assert_eq!((cc.rate_bps, cc.stats.rp_loss_undone), (line / 2, 0));
    }
    // New SENDs and their ACK end the wait: a later repeat of the old ACK proves nothing.
    sends(&mut h, 1, 8);
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 4, ACK, 5), &[]);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 0);
}

#[test]
fn comp_spurious_stall_of_two_timeouts_undoes_both_cuts() {
    let mut h = timed_out(false);
    let line = CcConfig::default().line_rate_bps;
    assert_eq!(h.tx().len(), 1);
    // The peer is still stalled: the doubled timer fires too, and cuts again.
    while h.c().local_ack_timeout_err < 2 {
        h.advance_to_timeout();
    }
    assert_eq!(h.tx().len(), 1);
    assert_eq!(cc_of(&h).stats.rp_loss_handled, 2);
    assert!(cc_of(&h).rate_bps < line / 2);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 1);
    let cc = cc_of(&h);
    assert_eq!(
        (cc.rate_bps, cc.limited, cc.stats.rp_loss_undone),
        (line, false, 1),
        "back to where the QP was before the stall"
    );
}

#[test]
fn comp_spurious_timeout_never_undoes_an_earlier_timeouts_cut() {
    // A rate_reduce_monitor_period longer than the test, so that the second timeout cuts
    // nothing of its own.
    let mut dcqcn = DcqcnConfig::software();
    dcqcn.rate_reduce_monitor_period = 131_071;
    let mut h = h_cc(CcConfig {
        dcqcn,
        ..CcConfig::default()
    });
    let line = CcConfig::default().line_rate_bps;
    // A real loss: the first timeout's replay repairs it, each replayed SEND acknowledged once.
    sends(&mut h, 2, 8);
    assert_eq!(h.tx().len(), 2);
    h.advance_to_timeout();
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN, ACK, 1), &[]);
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 1, ACK, 2), &[]);
    assert_eq!(h.wcs().len(), 2);
    // Later, a spurious timeout that cut nothing (within the monitor period).
    sends(&mut h, 2, 8);
    assert_eq!(h.tx().len(), 2);
    // DCQCN's increase timer runs too (the rate grows back from the first cut meanwhile).
    while h.c().local_ack_timeout_err < 2 {
        h.advance_to_timeout();
    }
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 1);
    let cc = cc_of(&h);
    assert_eq!((cc.stats.rp_loss_handled, cc.stats.rp_loss_ignored), (1, 1));
    assert_eq!(cc.stats.rp_loss_undone, 0);
    assert!(
        cc.rate_bps < line,
        "the first timeout's cut was for a real loss: {}",
        cc.rate_bps
    );
}

#[test]
fn comp_spurious_timeout_after_a_cnp_keeps_the_cnps_cut() {
    let mut h = timed_out(false);
    assert_eq!(h.tx().len(), 1);
    // A CNP after the timeout's cut (past rate_reduce_monitor_period): a real signal.
    h.now = h.now + Duration::from_millis(1);
    h.rx(RoceRepr::cnp(Qpn::new(0)), &[]);
    let after_cnp = cc_of(&h);
    assert_eq!(after_cnp.stats.rp_cnp_handled, 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 1, "still counted");
    let cc = cc_of(&h);
    assert_eq!(cc.stats.rp_loss_undone, 0);
    assert_eq!(cc.rate_bps, after_cnp.rate_bps);
}

#[test]
fn comp_spurious_timeout_undoes_swifts_window_cut() {
    let mut h = timed_out(true);
    let window = |h: &H| cc_of(h).cwnd.unwrap();
    let cut = window(&h);
    assert_eq!(cc_of(&h).stats.swift_loss_decreases, 1);
    assert_eq!(h.tx().len(), 1);
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, SQ_PSN + 3, ACK, 4), &[]);
    assert_eq!(h.c().spurious_timeouts, 1);
    assert_eq!(cc_of(&h).stats.swift_loss_undone, 1);
    assert!(window(&h) > cut, "{} restored over {cut}", window(&h));
}

#[test]
fn comp_local_ack_timeout_0_disables_the_timer() {
    let mut h = h_with(&RcConfig {
        timeout: 0,
        ..RcConfig::default()
    });
    sends(&mut h, 1, 8);
    let _ = h.tx();
    assert_eq!(h.d.poll_timeout(), None);
}

#[test]
fn comp_retry_cnt_7_retries_forever_as_rxe() {
    let mut h = h_with(&RcConfig {
        retry_cnt: 7,
        timeout: 1,
        ..RcConfig::default()
    });
    sends(&mut h, 1, 8);
    let _ = h.tx();
    for _ in 0..40 {
        h.advance_to_timeout();
        assert_eq!(h.tx().len(), 1);
    }
    assert_eq!(h.state(), QpState::Rts);
    assert_eq!(h.c().local_ack_timeout_err, 40);
}

/// Which side streams data into the slow queue of [`slow_path`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Burst {
    /// A READs from B: B's READ responses go through the queue on B's egress.
    Read,
    /// A WRITEs to B: A's WRITE packets go through the queue on A's egress.
    Write,
}

/// What [`slow_path`] measured.
#[derive(Clone, Copy, Debug)]
struct SlowPath {
    /// Simulated seconds until every WR completed, or the 30 s limit.
    secs: f64,
    /// WRs completed, of 32.
    completed: u64,
    /// Data packets the streaming side sent (READ responses or WRITE packets), replays included.
    sent: u64,
    /// Frames the queue dropped.
    dropped: u64,
    /// A's retries.
    retries: u64,
    /// Rate cuts for losses on the streaming side (`rp_loss_handled`).
    loss_cuts: u64,
}

/// `ib_read_bw -q 4 -s 1M` (or `ib_write_bw`) against rxe in a TCG guest, without the VM: the
/// streaming side sends into a slow drop-tail transmit queue that marks nothing (the guest's
/// qdisc or its tap, which drop silently; rxe's responder streams a whole READ response
/// without pause), and A moves 8 × 1 MiB on each of 4 QPs with perftest's local ACK timeout
/// (14: 67 ms), shorter than B takes to stream one round of 4 MiB of READ responses.
fn slow_path(seed: u64, burst: Burst, cc: CcConfig, frames_per_sec: u64, buffer: u64) -> SlowPath {
    const QPS: usize = 4;
    const WRS: u64 = 8;
    const LEN: u32 = 1 << 20;
    let link = Link {
        bottleneck: Some(Bottleneck {
            from: match burst {
                Burst::Read => Side::B,
                Burst::Write => Side::A,
            },
            frames_per_sec,
            buffer,
        }),
        ..Link::default()
    };
    let config = DeviceConfig {
        cc,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(seed, config, link);
    let cfg = RcConfig {
        timeout: 14,
        rd_atomic: 16,
        ..RcConfig::default()
    };
    let mut eps = Vec::new();
    for q in 0..QPS {
        let (a, b) = connect_rc(&mut p, &cfg);
        let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ q as u8).collect();
        let (src, dst) = match burst {
            Burst::Read => (
                p.b.reg_mr(b.pd, data, 0x10_0000, Access::REMOTE_READ)
                    .unwrap(),
                p.a.reg_mr(a.pd, vec![0; LEN as usize], 0x10_0000, Access::LOCAL_WRITE)
                    .unwrap(),
            ),
            Burst::Write => (
                p.a.reg_mr(a.pd, data, 0x10_0000, Access::empty()).unwrap(),
                p.b.reg_mr(
                    b.pd,
                    vec![0; LEN as usize],
                    0x10_0000,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
                .unwrap(),
            ),
        };
        for i in 0..WRS {
            let wr = match burst {
                Burst::Read => signaled(i, read(0x10_0000, src.rkey), 0x10_0000, LEN, dst.lkey),
                Burst::Write => signaled(i, write(0x10_0000, dst.rkey), 0x10_0000, LEN, src.lkey),
            };
            p.a.post_send(a.qpn, wr).unwrap();
        }
        eps.push((a, b, dst));
    }
    let mut done = [0u64; QPS];
    let limit = Instant::from_nanos(30_000_000_000);
    let finished = p.drive_until(20_000_000, |p| {
        for (i, (a, ..)) in eps.iter().enumerate() {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "qp {i}: {wc:?}");
                done[i] += 1;
            }
        }
        done.iter().all(|&d| d == WRS) || p.time > limit
    });
    let secs = p.time.as_nanos() as f64 / 1e9;
    let completed = done.iter().sum();
    let all = finished && completed == QPS as u64 * WRS;
    for (q, (a, _, dst)) in eps.iter().enumerate().filter(|_| all) {
        let got = match burst {
            Burst::Read => p.a.mrs().bytes(dst.lkey).unwrap(),
            Burst::Write => p.b.mrs().bytes(dst.lkey).unwrap(),
        };
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &x)| x == (i % 251) as u8 ^ q as u8),
            "qp {q} moved wrong data"
        );
        assert_eq!(p.a.qp(a.qpn).unwrap().state(), QpState::Rts);
    }
    let streamer = |a: Qpn, b: Qpn| match burst {
        Burst::Read => p.b.qp(b).unwrap(),
        Burst::Write => p.a.qp(a).unwrap(),
    };
    let sent = eps
        .iter()
        .map(|(a, b, _)| streamer(a.qpn, b.qpn).counters().sent_pkts)
        .sum();
    let loss_cuts = eps
        .iter()
        .map(|(a, b, _)| {
            streamer(a.qpn, b.qpn)
                .congestion()
                .map_or(0, |c| c.stats().rp_loss_handled)
        })
        .sum();
    let retries = eps
        .iter()
        .map(|(a, ..)| p.a.qp(a.qpn).unwrap().counters().completer_retry_err)
        .sum();
    SlowPath {
        secs,
        completed,
        sent,
        dropped: p.stats.queue_full,
        retries,
        loss_cuts,
    }
}

/// [`slow_path`] READs with congestion control off, as the retry-storm test always ran them.
fn slow_bursty_read_responder(seed: u64) -> (f64, u64, u64, u64) {
    let r = slow_path(seed, Burst::Read, CcConfig::off(), 25_000, 3000);
    assert_eq!(
        r.completed, 32,
        "READs left undone after 30 simulated s: {r:?}"
    );
    (r.secs, r.sent, r.dropped, r.retries)
}

/// A slow path that marks nothing (a 64-frame drop-tail queue at 25,000 frames/s, about
/// 200 Mb/s at MTU 1024) behind a QP that starts at 10 Gb/s: without back-off on loss
/// (congestion control off, or DCQCN without `loss_backoff`, which sees no CNP), every round
/// of go-back-N sends the window again at line rate into the full queue, and the ACK timer's
/// exponential back-off stretches the rounds: 2 of the 32 WRs complete in 30 simulated
/// seconds, and READs take 22 s. With `loss_backoff` each retry or replayed READ halves the rate and the QP
/// settles near the path's speed. Both directions: WRITE (the requester's retries cut its
/// rate) and READ (the responder's replayed READs cut its rate).
#[test]
fn loss_backoff_settles_a_burst_to_a_slow_path_that_marks_nothing() {
    let mut backoff = CcConfig::default();
    backoff.set("loss_backoff", 1).unwrap();
    for burst in [Burst::Write, Burst::Read] {
        let off = slow_path(2, burst, CcConfig::off(), 25_000, 64);
        let dcqcn_only = slow_path(2, burst, CcConfig::default(), 25_000, 64);
        let on = slow_path(2, burst, backoff, 25_000, 64);
        eprintln!(
            "{burst:?}: off {off:?}\n  dcqcn without loss_backoff {dcqcn_only:?}\n  on {on:?}"
        );
        assert_eq!((off.loss_cuts, dcqcn_only.loss_cuts), (0, 0));
        assert!(on.loss_cuts > 0, "{on:?}");
        assert_eq!(on.completed, 32, "{burst:?}: {on:?}");
        for without in [off, dcqcn_only] {
            // Frames dropped per completed WR: at most a fifth; at least four times faster.
            assert!(
                on.dropped * 5 / 32 <= without.dropped / without.completed.max(1),
                "{burst:?}: {on:?} against {without:?}"
            );
            assert!(
                on.secs * 4.0 < without.secs,
                "{burst:?}: {on:?} against {without:?}"
            );
        }
        // 32 MiB = 32,768 data packets; at 25,000 frames/s the path needs 1.31 s at best.
        let needed = 4 * 8 * 1024;
        assert!(
            on.sent < needed * 2,
            "{burst:?}: {} data packets for {needed}: {on:?}",
            on.sent
        );
        assert!(
            on.secs < 1.31 * 2.5,
            "{burst:?}: {:.2} simulated s for 1.31 s of data: {on:?}",
            on.secs
        );
    }
}

#[test]
fn reads_complete_against_a_slow_bursty_responder_without_a_retry_storm() {
    // 32 MiB = 32,768 response packets; at 25,000 frames/s B needs 1.31 s at best.
    let (secs, sent, dropped, retries) = slow_bursty_read_responder(1);
    eprintln!(
        "{secs:.2} simulated s, {sent} response packets, {dropped} dropped, {retries} retries"
    );
    let needed = 4 * 8 * 1024;
    assert!(
        sent < needed * 2,
        "the responder sent {sent} READ response packets for {needed} ({dropped} dropped by the \
         queue, {retries} retries, {secs:.2} s)"
    );
    assert!(
        secs < 1.31 * 2.0,
        "{secs:.2} simulated s for 1.31 s of data ({sent} sent, {dropped} dropped, {retries} retries)"
    );
}

/// Sixteen 1 KiB SENDs from A to B over the simulator, with the software DCQCN profile and a
/// 4 ms local ACK timeout (`timeout` 10), `setup` shaping the pair first. Returns A's QP
/// counters and congestion state once every SEND has completed successfully on both sides.
fn sends_over_the_sim(setup: impl FnOnce(&mut Pair)) -> (QpCounters, CcSnapshot) {
    let cc = CcConfig {
        dcqcn: DcqcnConfig::software(),
        ..CcConfig::default()
    };
    let config = DeviceConfig {
        cc,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(7, config, Link::default());
    let (a, b) = connect_rc(
        &mut p,
        &RcConfig {
            timeout: 10,
            ..RcConfig::default()
        },
    );
    let ma =
        p.a.reg_mr(a.pd, vec![7; 1 << 14], 0x1000, Access::LOCAL_WRITE);
    let mb = p.b.reg_mr(b.pd, vec![0; 1 << 14], 0x1000, Access::all());
    let (ma, mb) = (ma.unwrap(), mb.unwrap());
    for i in 0..16u64 {
        let sge = |lkey| {
            vec![Sge {
                addr: 0x1000 + i * 1024,
                length: 1024,
                lkey,
            }]
        };
        let wr = RecvWr {
            wr_id: i,
            sg_list: sge(mb.lkey),
        };
        p.b.post_recv(b.qpn, wr).unwrap();
        p.a.post_send(a.qpn, SendWr::send(i, sge(ma.lkey))).unwrap();
    }
    setup(&mut p);
    assert!(p.drive(100_000), "the pair went idle");
    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(b.cq)).collect();
    for w in wa.iter().chain(&wb) {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    assert_eq!((wa.len(), wb.len()), (16, 16));
    let qp = p.a.qp(a.qpn).unwrap();
    (*qp.counters(), qp.congestion().unwrap().snapshot())
}

/// A receiver that stalls for longer than the sender's local ACK timeout (rxe in a TCG guest
/// whose one vCPU is busy elsewhere: BENCHMARKS.md's capture saw it pause its ACKs 81 ms
/// against perftest's 67 ms timeout): the sender's timer fires and it replays; the receiver,
/// waking, takes the originals, then reports every replayed packet as a duplicate. The
/// timeout proves spurious and its rate cut is undone: the QP ends at the line rate.
#[test]
fn sim_receiver_pausing_longer_than_the_timeout_costs_no_rate() {
    let line = CcConfig::default().line_rate_bps;
    let (c, cc) = sends_over_the_sim(|p| p.pause(Side::B, Instant::from_nanos(10_000_000)));
    assert_eq!(c.local_ack_timeout_err, 1);
    assert_eq!(c.spurious_timeouts, 1);
    assert_eq!((cc.stats.rp_loss_handled, cc.stats.rp_loss_undone), (1, 1));
    assert_eq!((cc.rate_bps, cc.limited), (line, false));
}

/// The same SENDs with the last packet's first transmission lost instead (a tail loss: no
/// later packet makes B send a NAK): the timeout is real, the replay repairs it, and the rate
/// cut stays.
#[test]
fn sim_tail_loss_timeout_keeps_its_rate_cut() {
    let line = CcConfig::default().line_rate_bps;
    let (c, cc) = sends_over_the_sim(|p| {
        let mut dropped = false;
        p.filter = Some(Box::new(move |from, frame| {
            let last = frame_opcode_psn(frame)
                .is_some_and(|(_, psn)| psn == Psn::new(RcConfig::default().psn_a + 15));
            if from == Side::A && last && !dropped {
                dropped = true;
                return false;
            }
            true
        }));
    });
    assert_eq!(c.local_ack_timeout_err, 1);
    assert_eq!(c.spurious_timeouts, 0);
    assert_eq!((cc.stats.rp_loss_handled, cc.stats.rp_loss_undone), (1, 0));
    assert!(cc.rate_bps < line, "{} stays cut", cc.rate_bps);
}
