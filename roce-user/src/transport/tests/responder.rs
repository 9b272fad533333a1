//! Responder rules (reference §2 "Responder", rxe_resp.c): PSN check, opcode sequence and
//! validity, resources, length, R_Key, execution and acknowledgement.

use super::*;

#[test]
fn resp_psn_ahead_naks_psn_sequence_error_once_per_gap() {
    let mut h = h();
    for i in 0..4 {
        h.recv(i, 0, 64);
    }
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 2), &[1; 8]);
    assert_eq!(h.acks(), vec![(Nak(PsnSequenceError), RQ_PSN)]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 3), &[1; 8]);
    assert_eq!(
        h.acks(),
        vec![],
        "a second packet of the same gap is dropped silently"
    );
    assert_eq!(h.c().out_of_seq_request, 2);
    assert_eq!(h.c().out_of_sequence, 2);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 3), &[1; 8]);
    assert_eq!(
        h.acks(),
        vec![(Nak(PsnSequenceError), RQ_PSN + 1)],
        "a new gap gets its own NAK"
    );
    assert_eq!(h.state(), QpState::Rts, "class B: no state change");
}

#[test]
fn resp_duplicate_send_is_reacked_with_previous_psn() {
    let mut h = h();
    h.recv(1, 0, 64);
    h.recv(2, 64, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[2; 8]);
    assert_eq!(h.acks().len(), 2);
    let mut dup = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    dup.bth.ack_req = false;
    h.rx(dup, &[9; 8]);
    // C9-105: ACK again with the PSN before the expected one, even without AckReq.
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN + 1)]);
    assert_eq!(h.c().duplicate_request, 1);
    assert_eq!(h.wcs().len(), 2, "a duplicate never consumes a receive WR");
    assert_eq!(h.mem(0, 8), vec![1; 8], "nor rewrites data");
}

#[test]
fn resp_duplicate_write_is_reacked() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), BASE, rkey, 4),
        &[7; 4],
    );
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), BASE, rkey, 4),
        &[8; 4],
    );
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    assert_eq!(h.mem(0, 4), vec![7; 4]);
}

#[test]
fn resp_duplicate_read_is_replayed_from_the_requested_psn() {
    let mut h = h();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    h.set_mem(0, &data);
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 3000),
        &[],
    );
    let first = h.tx();
    assert_eq!(first.len(), 3);
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN + 3));
    // The requester lost the first response and resumes at PSN+1, mid-way.
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1),
            BASE + 1024,
            rkey,
            3000 - 1024,
        ),
        &[],
    );
    let replay = h.tx();
    assert_eq!(replay.len(), 2);
    assert_eq!(replay[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert_eq!(replay[0].0.bth.psn, Psn::new(RQ_PSN + 1));
    assert_eq!(replay[0].1, data[1024..2048]);
    assert_eq!(replay[1].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_LAST);
    assert_eq!(replay[1].1, data[2048..]);
    assert_eq!(h.c().duplicate_request, 1);
    assert_eq!(h.c().rx_read_requests, 1, "a replay is not a new READ");
}

#[test]
fn resp_duplicate_read_with_another_range_is_dropped() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 3000),
        &[],
    );
    let _ = h.tx();
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1),
            BASE,
            rkey,
            100,
        ),
        &[],
    );
    assert!(h.tx().is_empty());
    assert_eq!(h.state(), QpState::Rts);
}

#[test]
fn resp_duplicate_atomic_returns_the_saved_result_without_reexecuting() {
    let mut h = h();
    h.set_mem(0, &5u64.to_le_bytes());
    let rkey = h.mr.rkey;
    let fa = with_atomic(hdr(Opcode::RC_FETCH_ADD, RQ_PSN), BASE, rkey, 3, 0);
    h.rx(fa, &[]);
    let out = h.tx();
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(out[0].0.atomic_ack_eth, Some(AtomicAckEthRepr { orig: 5 }));
    assert_eq!(h.mem(0, 8), 8u64.to_le_bytes());
    h.rx(fa, &[]);
    let out = h.tx();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].0.atomic_ack_eth,
        Some(AtomicAckEthRepr { orig: 5 }),
        "the saved original value"
    );
    assert_eq!(h.mem(0, 8), 8u64.to_le_bytes(), "executed exactly once");
}

#[test]
fn resp_op_seq_middle_without_first_is_invalid_request() {
    let mut h = h();
    h.recv(1, 0, 4096);
    h.rx(hdr(Opcode::RC_SEND_MIDDLE, RQ_PSN), &[0; 1024]);
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
    assert_eq!(h.state(), QpState::Err, "class C: the QP goes to ERR");
    let w = h.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].status, WcStatus::WrFlushErr);
}

#[test]
fn resp_op_seq_first_inside_a_message_is_invalid_request() {
    let mut h = h();
    h.recv(1, 0, 4096);
    let mut f = hdr(Opcode::RC_SEND_FIRST, RQ_PSN);
    f.bth.ack_req = false;
    h.rx(f, &[0; 1024]);
    h.rx(hdr(Opcode::RC_SEND_FIRST, RQ_PSN + 1), &[0; 1024]);
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN + 1)]);
    assert_eq!(h.wcs()[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn resp_op_seq_write_middle_inside_a_send_is_invalid_request() {
    let mut h = h();
    h.recv(1, 0, 4096);
    let mut f = hdr(Opcode::RC_SEND_FIRST, RQ_PSN);
    f.bth.ack_req = false;
    h.rx(f, &[0; 1024]);
    h.rx(hdr(Opcode::RC_RDMA_WRITE_LAST, RQ_PSN + 1), &[0; 10]);
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN + 1)]);
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn resp_op_valid_needs_the_qp_access_flag_of_each_operation() {
    for (allowed, op) in [
        (
            Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            Opcode::RC_RDMA_READ_REQUEST,
        ),
        (
            Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            Opcode::RC_RDMA_WRITE_ONLY,
        ),
        (
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            Opcode::RC_FETCH_ADD,
        ),
    ] {
        let mut h = h_with(&RcConfig {
            access: allowed,
            ..RcConfig::default()
        });
        let rkey = h.mr.rkey;
        let p = if op == Opcode::RC_FETCH_ADD {
            with_atomic(hdr(op, RQ_PSN), BASE, rkey, 1, 0)
        } else {
            with_reth(hdr(op, RQ_PSN), BASE, rkey, 0)
        };
        h.rx(p, &[]);
        assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)], "{op:?}");
        assert_eq!(h.state(), QpState::Err);
    }
}

#[test]
fn resp_op_valid_unsupported_opcode_is_invalid_request() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_ATOMIC_WRITE, RQ_PSN), BASE, rkey, 8),
        &[0; 8],
    );
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
}

#[test]
fn resp_resource_send_without_receive_wqe_sends_rnr_nak() {
    let mut h = h_with(&RcConfig {
        min_rnr_timer: 14,
        ..RcConfig::default()
    });
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    assert_eq!(h.acks(), vec![(rnr(14), RQ_PSN)]);
    assert_eq!(h.c().send_rnr_err, 1);
    assert_eq!(h.c().out_of_buffer, 1);
    assert_eq!(h.state(), QpState::Rts, "class B");
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN));
    h.recv(1, 0, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    assert_eq!(h.wcs()[0].byte_len, 8);
}

#[test]
fn resp_resource_read_needs_max_dest_rd_atomic() {
    let mut h = h_with(&RcConfig {
        rd_atomic: 0,
        ..RcConfig::default()
    });
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 8),
        &[],
    );
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
}

#[test]
fn resp_resource_a_read_past_the_table_evicts_the_oldest() {
    // rxe's resource ring overwrites its oldest slot; a requester that respects
    // max_rd_atomic has already completed that READ when it sends a new one.
    let mut h = h_with(&RcConfig {
        rd_atomic: 1,
        ..RcConfig::default()
    });
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 8),
        &[],
    );
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1), BASE, rkey, 8),
        &[],
    );
    let out = h.tx();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(
        out[0].0.bth.psn,
        Psn::new(RQ_PSN + 1),
        "only the newer READ is answered"
    );
    assert_eq!(h.c().rd_atomic_evicted, 1);
    assert_eq!(h.state(), QpState::Rts);
    assert_eq!(h.d.qp(h.qpn).unwrap().responder_resources(), 1);
}

/// A full table gives up its oldest resource even while that one is replaying responses
/// for a stale duplicate and a newer one has finished sending: the newer READ's responses
/// may have been lost, and the requester's retry of it must still find it.
#[test]
fn resp_resource_eviction_keeps_a_finished_newer_read_over_an_older_replay() {
    let mut h = h_with(&RcConfig {
        rd_atomic: 2,
        ..RcConfig::default()
    });
    let rkey = h.mr.rkey;
    let read = |psn: u32| with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, psn), BASE, rkey, 8);
    h.rx(read(RQ_PSN), &[]);
    h.rx(read(RQ_PSN + 1), &[]);
    assert_eq!(h.tx().len(), 2, "both READs answered");
    // A stale duplicate of the first READ: its responses are replayed (still pending when
    // the next request arrives), while the second READ's responses have all left.
    h.rx(read(RQ_PSN), &[]);
    h.rx(read(RQ_PSN + 2), &[]);
    assert_eq!(
        h.c().rd_atomic_evicted,
        1,
        "the replay of the oldest gave way"
    );
    let psns: Vec<u32> = h.tx().iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(psns, vec![RQ_PSN + 2]);
    // The requester lost the second READ's response and asks again: it is still there.
    h.rx(read(RQ_PSN + 1), &[]);
    let out = h.tx();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].0.bth.opcode, out[0].0.bth.psn.value()),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, RQ_PSN + 1)
    );
    assert_eq!(h.state(), QpState::Rts);
}

#[test]
fn resp_length_checks_against_path_mtu() {
    let m = 1024usize;
    for (name, first, op, len) in [
        ("first short", None, Opcode::RC_SEND_FIRST, m - 4),
        (
            "middle short",
            Some(Opcode::RC_SEND_FIRST),
            Opcode::RC_SEND_MIDDLE,
            m - 4,
        ),
        (
            "last empty",
            Some(Opcode::RC_SEND_FIRST),
            Opcode::RC_SEND_LAST,
            0,
        ),
        (
            "last long",
            Some(Opcode::RC_SEND_FIRST),
            Opcode::RC_SEND_LAST,
            m + 4,
        ),
        ("only long", None, Opcode::RC_SEND_ONLY, m + 4),
    ] {
        let mut h = h();
        h.recv(1, 0, 8192);
        let mut psn = RQ_PSN;
        if let Some(f) = first {
            let mut p = hdr(f, psn);
            p.bth.ack_req = false;
            h.rx(p, &vec![0; m]);
            psn += 1;
        }
        h.rx(hdr(op, psn), &vec![0; len]);
        assert_eq!(h.acks(), vec![(Nak(InvalidRequest), psn)], "{name}");
        assert_eq!(h.state(), QpState::Err, "{name}");
    }
}

#[test]
fn resp_length_send_longer_than_the_receive_buffer_is_local_length_error() {
    let mut h = h();
    h.recv(1, 0, 100);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[0; 200]);
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
    let w = h.wcs();
    assert_eq!(w[0].status, WcStatus::LocLenErr);
    assert_eq!(h.c().resp_local_length_error, 1);
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn resp_length_write_payload_must_match_the_reth_length() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), BASE, rkey, 100),
        &[0; 50],
    );
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
}

#[test]
fn resp_rkey_violations_nak_remote_access_error() {
    let cases: [(&str, u64, i64, u32); 4] = [
        ("unknown rkey", BASE, 1, 16),
        ("beyond the region", BASE + (1 << 18) - 8, 0, 16),
        ("va + len overflows", u64::MAX - 4, 0, 16),
        ("below the region", BASE - 8, 0, 16),
    ];
    for (name, va, key_delta, len) in cases {
        for op in [Opcode::RC_RDMA_WRITE_ONLY, Opcode::RC_RDMA_READ_REQUEST] {
            let mut h = h();
            let rkey = RKey::new(h.mr.rkey.value().wrapping_add(key_delta as u32));
            let payload = if op == Opcode::RC_RDMA_WRITE_ONLY {
                vec![0; len as usize]
            } else {
                vec![]
            };
            h.rx(with_reth(hdr(op, RQ_PSN), va, rkey, len), &payload);
            assert_eq!(
                h.acks(),
                vec![(Nak(RemoteAccessError), RQ_PSN)],
                "{name} {op:?}"
            );
            assert_eq!(h.c().resp_remote_access_errors, 1);
            assert_eq!(h.state(), QpState::Err);
        }
    }
}

#[test]
fn resp_rkey_region_without_remote_write_right_is_remote_access_error() {
    let mut h = h();
    let ro =
        h.d.reg_mr(h.pd, vec![0; 64], 0x9000, Access::REMOTE_READ)
            .unwrap();
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), 0x9000, ro.rkey, 8),
        &[0; 8],
    );
    assert_eq!(h.acks(), vec![(Nak(RemoteAccessError), RQ_PSN)]);
}

#[test]
fn resp_rkey_zero_length_write_needs_no_rkey() {
    let mut h = h();
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN),
            0,
            RKey::new(0xdead),
            0,
        ),
        &[],
    );
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
}

#[test]
fn resp_read_responses_are_segmented_with_aeth_on_first_and_last() {
    let mut h = h();
    let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
    h.set_mem(0, &data);
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 2500),
        &[],
    );
    let out = h.tx();
    let ops: Vec<_> = out.iter().map(|(h, _)| h.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_LAST
        ]
    );
    assert!(out[1].0.aeth.is_none());
    assert_eq!(out[0].0.aeth.unwrap().msn, Msn::new(1), "C9-148");
    assert_eq!(out[2].0.aeth.unwrap().syndrome, ACK);
    let psns: Vec<_> = out.iter().map(|(h, _)| h.bth.psn.value()).collect();
    assert_eq!(psns, [RQ_PSN, RQ_PSN + 1, RQ_PSN + 2]);
    let got: Vec<u8> = out.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(got, data);
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN + 3));
}

#[test]
fn resp_zero_length_read_gets_one_empty_response_only() {
    let mut h = h();
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN),
            0,
            RKey::new(1),
            0,
        ),
        &[],
    );
    let out = h.tx();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert!(out[0].1.is_empty());
}

#[test]
fn resp_atomic_requires_8_byte_alignment() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_atomic(hdr(Opcode::RC_COMPARE_SWAP, RQ_PSN), BASE + 4, rkey, 1, 0),
        &[],
    );
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
}

#[test]
fn resp_atomic_compare_swap_swaps_only_on_equal() {
    let mut h = h();
    h.set_mem(8, &5u64.to_le_bytes());
    let rkey = h.mr.rkey;
    h.rx(
        with_atomic(hdr(Opcode::RC_COMPARE_SWAP, RQ_PSN), BASE + 8, rkey, 9, 5),
        &[],
    );
    assert_eq!(
        h.tx()[0].0.atomic_ack_eth,
        Some(AtomicAckEthRepr { orig: 5 })
    );
    h.rx(
        with_atomic(
            hdr(Opcode::RC_COMPARE_SWAP, RQ_PSN + 1),
            BASE + 8,
            rkey,
            1,
            5,
        ),
        &[],
    );
    assert_eq!(
        h.tx()[0].0.atomic_ack_eth,
        Some(AtomicAckEthRepr { orig: 9 })
    );
    assert_eq!(h.mem(8, 8), 9u64.to_le_bytes());
    assert_eq!(h.c().rx_atomic_requests, 2);
}

#[test]
fn resp_ack_is_sent_only_when_ackreq_is_set() {
    let mut h = h();
    h.recv(1, 0, 64);
    h.recv(2, 64, 64);
    let mut p = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    p.bth.ack_req = false;
    h.rx(p, &[1; 4]);
    assert!(h.tx().is_empty());
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[1; 4]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN + 1)]);
}

#[test]
fn resp_msn_counts_completed_messages() {
    let mut h = h();
    for i in 0..3 {
        h.recv(i, 0, 4096);
    }
    let mut f = hdr(Opcode::RC_SEND_FIRST, RQ_PSN);
    f.bth.ack_req = true;
    h.rx(f, &[0; 1024]);
    h.rx(hdr(Opcode::RC_SEND_LAST, RQ_PSN + 1), &[0; 10]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 2), &[0; 10]);
    let msns: Vec<u32> = h
        .tx()
        .iter()
        .map(|(h, _)| h.aeth.unwrap().msn.value())
        .collect();
    assert_eq!(msns, [0, 1, 2]);
}

#[test]
fn resp_send_with_invalidate_invalidates_the_rkey() {
    let mut h = h();
    h.recv(1, 0, 64);
    let mut p = hdr(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, RQ_PSN);
    p.ieth = Some(IethRepr { rkey: h.mr.rkey });
    h.rx(p, &[3; 4]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    let w = h.wcs();
    assert!(w[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(w[0].invalidated_rkey, h.mr.rkey);
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + 1), BASE, rkey, 4),
        &[0; 4],
    );
    assert_eq!(h.acks(), vec![(Nak(RemoteAccessError), RQ_PSN + 1)]);
}

#[test]
fn resp_send_with_invalidate_of_an_invalid_rkey_is_an_error() {
    let mut h = h();
    h.recv(1, 0, 64);
    let mut p = hdr(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, RQ_PSN);
    p.ieth = Some(IethRepr {
        rkey: RKey::new(0x1234_5678),
    });
    h.rx(p, &[3; 4]);
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
    assert_eq!(h.wcs()[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn resp_write_with_immediate_consumes_a_receive_wqe() {
    let mut h = h();
    let rkey = h.mr.rkey;
    let mut p = with_reth(
        hdr(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, RQ_PSN),
        BASE + 100,
        rkey,
        6,
    );
    p.immdt = Some(ImmDtRepr { imm: 0xabcd });
    h.rx(p, &[5; 6]);
    assert_eq!(h.acks(), vec![(rnr(1), RQ_PSN)], "no receive WQE: RNR");
    h.recv(9, 0, 0);
    h.rx(p, &[5; 6]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN)]);
    let w = h.wcs();
    assert_eq!(w[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(w[0].byte_len, 6);
    assert_eq!(w[0].imm, 0xabcd);
    assert_eq!(h.mem(100, 6), vec![5; 6]);
}

#[test]
fn resp_multi_packet_write_lands_at_consecutive_addresses() {
    let mut h = h();
    let rkey = h.mr.rkey;
    let data: Vec<u8> = (0..2100u32).map(|i| (i % 251) as u8).collect();
    let mut f = with_reth(hdr(Opcode::RC_RDMA_WRITE_FIRST, RQ_PSN), BASE, rkey, 2100);
    f.bth.ack_req = false;
    h.rx(f, &data[..1024]);
    let mut m = hdr(Opcode::RC_RDMA_WRITE_MIDDLE, RQ_PSN + 1);
    m.bth.ack_req = false;
    h.rx(m, &data[1024..2048]);
    h.rx(hdr(Opcode::RC_RDMA_WRITE_LAST, RQ_PSN + 2), &data[2048..]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN + 2)]);
    assert_eq!(h.mem(0, 2100), data);
    assert_eq!(h.c().rx_write_requests, 1);
}

#[test]
fn resp_solicited_event_fires_a_solicited_only_cq_notification() {
    let mut h = h();
    h.recv(1, 0, 64);
    h.recv(2, 64, 64);
    h.d.req_notify_cq(h.cq, true).unwrap();
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 4]);
    assert_eq!(h.d.poll_event(), None, "not solicited");
    let mut p = hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1);
    p.bth.solicited = true;
    h.rx(p, &[1; 4]);
    assert_eq!(h.d.poll_event(), Some(Event::CqNotify { cq: h.cq }));
    assert_eq!(h.wcs().len(), 2);
    h.recv(3, 0, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 2), &[1; 4]);
    assert_eq!(h.d.poll_event(), None, "one-shot: disarmed after firing");
}

#[test]
fn resp_length_reth_longer_than_2_31_is_invalid_request() {
    let mut h = h();
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN),
            BASE,
            rkey,
            (1 << 31) + 1,
        ),
        &[],
    );
    assert_eq!(h.acks(), vec![(Nak(InvalidRequest), RQ_PSN)]);
}

#[test]
fn resp_rnr_nak_stands_for_its_gap_until_the_retry() {
    let mut h = h();
    let mut f = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    f.bth.ack_req = true;
    h.rx(f, &[0; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[0; 8]);
    assert_eq!(
        h.acks(),
        vec![(rnr(1), RQ_PSN)],
        "no PSN NAK for the packet behind the RNR NAK"
    );
    h.recv(1, 0, 64);
    h.recv(2, 64, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[0; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[0; 8]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN), (ACK, RQ_PSN + 1)]);
}

#[test]
fn resp_rkey_of_another_protection_domain_is_remote_access_error() {
    let mut h = h();
    let other = h.d.alloc_pd().unwrap();
    let m =
        h.d.reg_mr(other, vec![0; 64], 0x9000, Access::all())
            .unwrap();
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), 0x9000, m.rkey, 8),
        &[0; 8],
    );
    assert_eq!(h.acks(), vec![(Nak(RemoteAccessError), RQ_PSN)]);
    assert!(matches!(
        h.d.dealloc_pd(other),
        Err(DeviceError::PdInUse(_))
    ));
    h.d.dereg_mr(m.lkey).unwrap();
    h.d.dealloc_pd(other).unwrap();
    assert!(matches!(
        h.d.reg_mr(other, vec![], 0, Access::empty()),
        Err(DeviceError::NoSuchPd(_))
    ));
}

/// `n` SEND_ONLYs asking for an ACK, from `RQ_PSN` on, each into a receive WQE posted first.
fn acked_sends(h: &mut H, n: u32) {
    for i in 0..n {
        h.recv(u64::from(i), u64::from(i) * 64, 64);
        h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + i), &[1; 8]);
    }
}

#[test]
fn resp_full_control_queue_keeps_the_rnr_nak_in_place_of_an_ack() {
    // Issue 20: a burst fills the control queue with ACKs before the device transmits; the
    // RNR NAK for the first SEND without a receive WQE must still go out, in place of the
    // newest queued ACK, which it implies (a NAK acknowledges every PSN before its own).
    let mut h = h();
    let n = qp::MAX_PENDING_ACKS as u32 + 4;
    acked_sends(&mut h, n);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + n), &[1; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + n + 1), &[1; 8]);
    let acks = h.acks();
    assert_eq!(acks.len(), qp::MAX_PENDING_ACKS, "{acks:?}");
    let want: Vec<_> = (0..qp::MAX_PENDING_ACKS as u32 - 1)
        .map(|i| (ACK, RQ_PSN + i))
        .chain([(rnr(1), RQ_PSN + n)])
        .collect();
    assert_eq!(acks, want, "the RNR NAK ends the queue; nothing after it");
    let c = h.c();
    assert_eq!(c.send_rnr_err, 1);
    assert_eq!(c.out_of_buffer, 1);
    assert_eq!(c.ack_queue_full, 0);
    assert_eq!(
        c.ack_deferred, 5,
        "4 ACKs merged, then the RNR NAK took the last place"
    );
    assert_eq!(
        c.out_of_seq_request, 1,
        "the packet behind the RNR NAK is counted and dropped without a NAK of its own"
    );
    // The retry is served once a receive is posted.
    h.recv(99, 0x2000, 64);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + n), &[2; 8]);
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN + n)]);
}

#[test]
fn resp_full_control_queue_keeps_the_psn_sequence_nak_and_drops_implied_reacks() {
    let mut h = h();
    let n = qp::MAX_PENDING_ACKS as u32 + 2;
    acked_sends(&mut h, n);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + n + 3), &[1; 8]);
    // A duplicate's re-ACK (C9-105, PSN n - 1) is implied by the queued NAK for PSN n.
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[1; 8]);
    let acks = h.acks();
    assert_eq!(acks.len(), qp::MAX_PENDING_ACKS);
    assert_eq!(acks.last(), Some(&(Nak(PsnSequenceError), RQ_PSN + n)));
    let c = h.c();
    assert_eq!(c.out_of_seq_request, 1);
    assert_eq!(c.duplicate_request, 1);
    assert_eq!(c.ack_queue_full, 0);
    // The NAK went out, so the rest of the gap is silent.
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + n + 4), &[1; 8]);
    assert_eq!(h.acks(), vec![]);
}

#[test]
fn resp_full_control_queue_keeps_a_class_c_nak() {
    let mut h = h();
    let n = qp::MAX_PENDING_ACKS as u32 + 1;
    acked_sends(&mut h, n);
    // SEND_MIDDLE without FIRST: NAK invalid request, QP to ERR.
    h.rx(hdr(Opcode::RC_SEND_MIDDLE, RQ_PSN + n), &[1; 1024]);
    let acks = h.acks();
    assert_eq!(acks.len(), qp::MAX_PENDING_ACKS);
    assert_eq!(acks.last(), Some(&(Nak(InvalidRequest), RQ_PSN + n)));
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.c().ack_queue_full, 0);
}

#[test]
fn resp_answers_leave_in_psn_order_read_responses_before_the_ack_behind_them() {
    // rxe sends a READ's responses (and an atomic's ACK) before it acknowledges the next
    // request; an ACK that overtook them would be an implied NAK for the READ at the requester.
    let mut h = h();
    let rkey = h.mr.rkey;
    h.recv(1, 0x100, 64);
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN), BASE, rkey, 2048),
        &[],
    );
    h.rx(
        with_atomic(hdr(Opcode::RC_FETCH_ADD, RQ_PSN + 2), BASE + 8, rkey, 1, 0),
        &[],
    );
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 3), &[1; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 4), &[1; 8]);
    let out: Vec<_> = h
        .tx()
        .iter()
        .map(|(h, _)| (h.bth.opcode, h.bth.psn.value()))
        .collect();
    assert_eq!(
        out,
        [
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, RQ_PSN),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, RQ_PSN + 1),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, RQ_PSN + 2),
            (Opcode::RC_ACKNOWLEDGE, RQ_PSN + 3),
            (Opcode::RC_ACKNOWLEDGE, RQ_PSN + 4),
        ]
    );
}

/// IBA 9.7.5.1 (coalesced acknowledgements): the requests of one receive batch that ask for
/// an ACK are answered by one cumulative ACK for the newest, carrying the newest MSN.
#[test]
fn resp_coalesces_the_acks_of_one_batch() {
    let mut h = h_coalescing();
    for i in 0..3 {
        h.recv(i, 64 * i, 64);
    }
    for i in 0..3 {
        h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + i as u32), &[i as u8; 8]);
    }
    let out = h.tx();
    assert_eq!(out.len(), 1, "one ACK for the batch: {out:?}");
    let aeth = out[0].0.aeth.unwrap();
    assert_eq!(
        (aeth.syndrome, out[0].0.bth.psn.value(), aeth.msn),
        (ACK, RQ_PSN + 2, Msn::new(3))
    );
    assert_eq!(h.d.device_counters().ack_coalesced, 2);
    assert_eq!(h.wcs().len(), 3, "every message delivered");
    // The next batch gets its own ACK.
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + 3), BASE, rkey, 4),
        &[7; 4],
    );
    assert_eq!(h.acks(), vec![(ACK, RQ_PSN + 3)]);
    assert_eq!(h.d.device_counters().ack_coalesced, 2);
}

/// One coalesced ACK stands for at most `ACK_COALESCE_MAX` requests, so that a lost ACK
/// holds back few messages: 20 WRITEs in one batch are answered at the 8th, 16th and 20th.
#[test]
fn resp_coalesced_ack_covers_at_most_ack_coalesce_max_requests() {
    let mut h = h_coalescing();
    let rkey = h.mr.rkey;
    let max = u32::from(crate::transport::qp::ACK_COALESCE_MAX);
    assert_eq!(max, 8);
    for i in 0..20 {
        h.rx(
            with_reth(
                hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + i),
                BASE + 8 * u64::from(i),
                rkey,
                8,
            ),
            &[i as u8; 8],
        );
    }
    assert_eq!(
        h.acks(),
        vec![(ACK, RQ_PSN + 7), (ACK, RQ_PSN + 15), (ACK, RQ_PSN + 19)]
    );
    assert_eq!(h.d.device_counters().ack_coalesced, 17);
    assert_eq!(h.c().ack_deferred, 0, "the queue never filled");
}

/// NAKs and duplicates' re-ACKs are never merged with a later request's ACK, and a request's
/// ACK is not merged into a NAK: each answer that says something of its own leaves.
#[test]
fn resp_coalescing_never_merges_naks_or_reacks() {
    let mut h = h_coalescing();
    for i in 0..4 {
        h.recv(i, 64 * i, 64);
    }
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[2; 8]);
    // A duplicate of the first: re-ACKed with the PSN before the expected one (C9-105).
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[9; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 2), &[3; 8]);
    // A gap: NAKed, and the ACK of the request that fills it is an answer of its own.
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 4), &[5; 8]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 3), &[4; 8]);
    assert_eq!(
        h.acks(),
        vec![
            (ACK, RQ_PSN + 1),
            (ACK, RQ_PSN + 1),
            (ACK, RQ_PSN + 2),
            (Nak(PsnSequenceError), RQ_PSN + 3),
            (ACK, RQ_PSN + 3),
        ]
    );
    assert_eq!(h.d.device_counters().ack_coalesced, 1);
    assert_eq!(h.wcs().len(), 4);
}

/// While a READ response is owed the ACKs of the requests behind it are not merged (answers
/// leave in PSN order; the READ's last response carries its own ACK).
#[test]
fn resp_coalescing_waits_for_a_read_response() {
    let mut h = h_coalescing();
    let rkey = h.mr.rkey;
    h.set_mem(0, &[0xAB; 16]);
    h.rx(
        with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN), BASE + 64, rkey, 4),
        &[1; 4],
    );
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN + 1),
            BASE,
            rkey,
            16,
        ),
        &[],
    );
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + 2),
            BASE + 68,
            rkey,
            4,
        ),
        &[2; 4],
    );
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + 3),
            BASE + 72,
            rkey,
            4,
        ),
        &[3; 4],
    );
    let out: Vec<_> = h
        .tx()
        .into_iter()
        .map(|(r, _)| (r.bth.opcode, r.bth.psn.value()))
        .collect();
    assert_eq!(
        out,
        vec![
            (Opcode::RC_ACKNOWLEDGE, RQ_PSN),
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, RQ_PSN + 1),
            (Opcode::RC_ACKNOWLEDGE, RQ_PSN + 2),
            (Opcode::RC_ACKNOWLEDGE, RQ_PSN + 3),
        ]
    );
    assert_eq!(h.d.device_counters().ack_coalesced, 0);
}

#[test]
fn resp_a_destroyed_qp_sends_exactly_the_acks_it_owed() {
    let mut h = h();
    for i in 0..3 {
        h.recv(i, i * 64, 64);
    }
    // Two SENDs and a duplicate of the first: two ACKs and the duplicate's re-ACK (C9-105),
    // queued, not yet sent.
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 4]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN + 1), &[1; 4]);
    h.rx(hdr(Opcode::RC_SEND_ONLY, RQ_PSN), &[1; 4]);
    let owed = h.d.qp(h.qpn).unwrap().owed_frames();
    assert_eq!(owed, 3);
    h.d.destroy_qp(h.qpn).unwrap();
    assert!(h.d.owes_transmit());
    let sent = h.acks();
    assert_eq!(sent.len() as u64, owed, "{sent:?}");
    assert!(!h.d.owes_transmit());
}
