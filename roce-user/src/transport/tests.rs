//! One test per responder, completer and requester rule of reference/roce-v2.md §2.
//!
//! Responder and completer rules are tested on one device whose peer is played by the test:
//! crafted packets go in through [`Device::handle_decoded`], and what comes out of
//! [`Device::poll_transmit`] is parsed back with the wire module.

use core::net::IpAddr;

use super::sim::{Bottleneck, Link, Pair, RcConfig, Side, bring_up, connect_rc, ip};
use super::timer::local_ack_timeout;
use super::*;
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr,
    ImmDtRepr,
    NakCode::{
        InvalidRequest, PsnSequenceError, RemoteAccessError, RemoteOperationalError, Unknown,
    },
    RethRepr, RnrTimer, RoceRepr, parse_frame,
};
use AethSyndrome::Nak;

const PEER: u32 = 0x77;
const RQ_PSN: u32 = 100;
const SQ_PSN: u32 = 500;
const BASE: u64 = 0x1000;

struct H {
    d: Device,
    pd: PdId,
    qpn: Qpn,
    cq: CqId,
    now: Instant,
    mr: MrInfo,
    mtu: u32,
}

fn h_with(cfg: &RcConfig) -> H {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(cfg.cq_depth).unwrap();
    let qpn = d
        .create_qp(QpInit {
            cap: cfg.cap,
            ..QpInit::new(QpType::Rc, pd, cq)
        })
        .unwrap();
    bring_up(
        &mut d,
        qpn,
        Side::B,
        Qpn::new(PEER),
        Psn::new(SQ_PSN),
        Psn::new(RQ_PSN),
        cfg,
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

fn h() -> H {
    h_with(&RcConfig::default())
}

fn hdr(op: Opcode, psn: u32) -> RoceRepr {
    let mut bth = BthRepr::new(op, Qpn::new(0), Psn::new(psn));
    bth.ack_req = op.info().unwrap().ends_message();
    RoceRepr::new(bth)
}

fn with_reth(mut h: RoceRepr, va: u64, rkey: RKey, dma_len: u32) -> RoceRepr {
    h.reth = Some(RethRepr { va, rkey, dma_len });
    h
}

fn with_atomic(mut h: RoceRepr, va: u64, rkey: RKey, swap_add: u64, compare: u64) -> RoceRepr {
    h.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add,
        compare,
    });
    h
}

fn aeth_hdr(op: Opcode, psn: u32, syndrome: AethSyndrome, msn: u32) -> RoceRepr {
    let mut h = RoceRepr::new(BthRepr::new(op, Qpn::new(0), Psn::new(psn)));
    h.aeth = Some(AethRepr {
        syndrome,
        msn: Msn::new(msn),
    });
    h
}

/// An RNR NAK syndrome with timer `code`.
fn rnr(code: u8) -> AethSyndrome {
    AethSyndrome::RnrNak {
        timer: RnrTimer::new(code),
    }
}

impl H {
    fn rx(&mut self, mut repr: RoceRepr, payload: &[u8]) {
        repr.bth.dest_qp = self.qpn;
        let pkt = RxPkt {
            repr,
            payload,
            ce: false,
        };
        let addrs = Some((IpAddr::V4(ip(Side::A)), IpAddr::V4(ip(Side::B))));
        self.d.handle_decoded(self.now, &pkt, addrs);
    }

    fn tx(&mut self) -> Vec<(RoceRepr, Vec<u8>)> {
        let mut buf = vec![0; MAX_FRAME_LEN];
        let mut out = Vec::new();
        while let Some(t) = self.d.poll_transmit(self.now, &mut buf) {
            let f = parse_frame(&buf[..t.size]).expect("own frames parse");
            assert!(f.icrc_ok);
            assert_eq!(f.roce.bth.dest_qp, Qpn::new(PEER));
            out.push((f.roce, f.payload.to_vec()));
        }
        out
    }

    fn acks(&mut self) -> Vec<(AethSyndrome, u32)> {
        self.tx()
            .into_iter()
            .map(|(h, _)| (h.aeth.unwrap().syndrome, h.bth.psn.value()))
            .collect()
    }

    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sg = vec![Sge {
            addr: BASE + off,
            length: len,
            lkey: self.mr.lkey,
        }];
        self.d
            .post_recv(self.qpn, RecvWr { wr_id, sg_list: sg })
            .unwrap();
    }

    fn sg(&self, off: u64, len: u32) -> Vec<Sge> {
        vec![Sge {
            addr: BASE + off,
            length: len,
            lkey: self.mr.lkey,
        }]
    }

    fn wcs(&mut self) -> Vec<Wc> {
        core::iter::from_fn(|| self.d.poll_cq(self.cq)).collect()
    }

    fn state(&self) -> QpState {
        self.d.qp(self.qpn).unwrap().state()
    }

    fn c(&self) -> QpCounters {
        *self.d.qp(self.qpn).unwrap().counters()
    }

    fn mem(&self, off: usize, len: usize) -> Vec<u8> {
        self.d.mrs().bytes(self.mr.lkey).unwrap()[off..off + len].to_vec()
    }

    fn set_mem(&mut self, off: usize, data: &[u8]) {
        self.d.mrs_mut().bytes_mut(self.mr.lkey).unwrap()[off..off + data.len()]
            .copy_from_slice(data);
    }

    fn advance_to_timeout(&mut self) {
        self.now = self.d.poll_timeout().expect("a timer is armed");
        self.d.handle_timeout(self.now);
    }
}

const ACK: AethSyndrome = AethSyndrome::ACK_UNLIMITED;

// ------------------------------------------------------------------ responder: check_psn

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

// ------------------------------------------------------------------ responder: op sequence

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

// ------------------------------------------------------------------ responder: op valid

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

// ------------------------------------------------------------------ responder: resources

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

// ------------------------------------------------------------------ responder: length

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

// ------------------------------------------------------------------ responder: rkey

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

// ------------------------------------------------------------------ responder: execute

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
    assert_eq!(w[0].invalidated_rkey, h.mr.rkey.value());
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

// ------------------------------------------------------------------ receive checks

#[test]
fn recv_wrong_pkey_or_foreign_source_is_dropped() {
    let mut h = h();
    h.recv(1, 0, 64);
    let mut p = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    p.bth.pkey = PKey::new(0x1234);
    h.rx(p, &[0; 4]);
    assert_eq!(h.d.device_counters().bad_pkey_cntr, 1);
    let mut p = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    p.bth.dest_qp = h.qpn;
    let pkt = RxPkt {
        repr: p,
        payload: &[0; 4],
        ce: false,
    };
    let stranger = IpAddr::V4(core::net::Ipv4Addr::new(10, 9, 9, 9));
    h.d.handle_decoded(h.now, &pkt, Some((stranger, IpAddr::V4(ip(Side::B)))));
    assert!(h.tx().is_empty());
    assert_eq!(h.c().rx_dropped, 1);
}

#[test]
fn recv_requests_before_rtr_are_dropped() {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
    let mut p = hdr(Opcode::RC_SEND_ONLY, 0);
    p.bth.dest_qp = qpn;
    d.handle_decoded(
        Instant::ZERO,
        &RxPkt {
            repr: p,
            payload: &[],
            ce: false,
        },
        None,
    );
    assert_eq!(d.qp(qpn).unwrap().counters().rx_dropped, 1);
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(d.poll_transmit(Instant::ZERO, &mut buf).is_none());
}

#[test]
fn recv_unknown_qp_and_garbage_frames_are_counted() {
    let mut h = h();
    h.d.handle_packet(h.now, &[0u8; 60]);
    assert_eq!(h.d.device_counters().rx_malformed, 1);
    let mut p = hdr(Opcode::RC_SEND_ONLY, RQ_PSN);
    p.bth.dest_qp = Qpn::new(0x4242);
    h.d.handle_decoded(
        h.now,
        &RxPkt {
            repr: p,
            payload: &[],
            ce: false,
        },
        None,
    );
    assert_eq!(h.d.device_counters().rx_unknown_qp, 1);
}

// ------------------------------------------------------------------ requester

fn sends(h: &mut H, n: u64, len: u32) {
    for i in 0..n {
        let sg = h.sg(i * 64, len);
        h.d.post_send(h.qpn, SendWr::send(i + 1, sg)).unwrap();
    }
}

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
    let sg = h.sg(0, 100 * 1024);
    let rkey = RKey::new(1);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: 0,
                rkey,
            },
            sg,
        ),
    )
    .unwrap();
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
    let sg = h.sg(0, 200 * 1024);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: 0,
                rkey: RKey::new(1),
            },
            sg,
        ),
    )
    .unwrap();
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
        let sg = h.sg(i * 64, 8);
        h.d.post_send(
            h.qpn,
            SendWr::new(
                i,
                SendOp::Read {
                    remote_addr: 0,
                    rkey: RKey::new(1),
                },
                sg,
            ),
        )
        .unwrap();
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

// ------------------------------------------------------------------ completer

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
    let sg = h.sg(0, 8);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Read {
                remote_addr: 0,
                rkey: RKey::new(1),
            },
            sg,
        ),
    )
    .unwrap();
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
    let sg = h.sg(0, 3000);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Read {
                remote_addr: 0x5000,
                rkey: RKey::new(9),
            },
            sg,
        ),
    )
    .unwrap();
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
    let sg = h.sg(0, 8);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Read {
                remote_addr: 0,
                rkey: RKey::new(1),
            },
            sg,
        ),
    )
    .unwrap();
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
    let sg = h.sg(0, 8);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote_addr: 0x8,
                rkey: RKey::new(1),
                add: 2,
            },
            sg,
        ),
    )
    .unwrap();
    let out = h.tx();
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_FETCH_ADD);
    let mut ack = aeth_hdr(Opcode::RC_ATOMIC_ACKNOWLEDGE, SQ_PSN, ACK, 1);
    ack.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 42 });
    h.rx(ack, &[]);
    let w = h.wcs();
    assert_eq!(w[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(h.mem(0, 8), 42u64.to_le_bytes());
}

// ------------------------------------------------------------------ QP state and modify

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

// ------------------------------------------------------------------ UD

#[test]
fn ud_send_carries_deth_and_qkey_and_the_receiver_gets_a_grh() {
    let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
    let mut qps = Vec::new();
    for side in [Side::A, Side::B] {
        let d = p.dev(side);
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
        let mut a: QpAttr<Path> = QpAttr {
            qp_state: QpState::Init,
            qkey: QKey::new(0x1111_1111),
            ..QpAttr::default()
        };
        d.modify_qp(
            qpn,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )
        .unwrap();
        a.qp_state = QpState::Rtr;
        d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
            .unwrap();
        let m = d
            .reg_mr(pd, vec![0x33; 256], 0x1000, Access::all())
            .unwrap();
        qps.push((qpn, cq, m));
    }
    let (qa, ca, ma) = qps[0];
    let (qb, cb, mb) = qps[1];
    for (i, qkey) in [(1u64, 0x1111_1111u32), (2, 0x2222_2222)] {
        p.b.post_recv(
            qb,
            RecvWr {
                wr_id: i,
                sg_list: vec![Sge {
                    addr: 0x1000,
                    length: 200,
                    lkey: mb.lkey,
                }],
            },
        )
        .unwrap();
        let mut wr = SendWr::send(
            i,
            vec![Sge {
                addr: 0x1000,
                length: 100,
                lkey: ma.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            path: sim::path(Side::A),
            remote_qpn: qb,
            remote_qkey: QKey::new(qkey),
        });
        p.a.post_send(qa, wr).unwrap();
        assert!(p.drive(100));
    }
    let wa: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(ca)).collect();
    assert_eq!(wa.len(), 2);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success));
    let wb: Vec<_> = core::iter::from_fn(|| p.b.poll_cq(cb)).collect();
    assert_eq!(wb.len(), 1, "the wrong Q_Key is dropped");
    assert_eq!(wb[0].byte_len, 140);
    assert_eq!(wb[0].src_qp, qa);
    assert!(wb[0].wc_flags.contains(WcFlags::GRH));
    assert_eq!(p.b.device_counters().qkey_viol_cntr, 1);
    assert_eq!(&p.b.mrs().bytes(mb.lkey).unwrap()[40..140], &[0x33; 100]);
}

// ------------------------------------------------------------------ end to end

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
    p.a.post_send(
        a.qpn,
        SendWr::new(
            2,
            SendOp::Write {
                remote_addr: 0x1000 + 6000,
                rkey: mb.rkey,
            },
            sg(0, 2000),
        ),
    )
    .unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(
            3,
            SendOp::Read {
                remote_addr: 0x1000 + 6000,
                rkey: mb.rkey,
            },
            sg(3000, 2000),
        ),
    )
    .unwrap();
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
    p.a.post_send(
        a.qpn,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: 0x1000,
                rkey: mb.rkey,
            },
            sg,
        ),
    )
    .unwrap();
    assert!(p.drive(100_000));
    assert_eq!(p.a.poll_cq(a.cq).unwrap().status, WcStatus::Success);
    assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &src[..]);
    let malformed = p.a.device_counters().rx_malformed + p.b.device_counters().rx_malformed;
    assert!(p.stats.corrupted > 0 && malformed > 0);
    let _ = b;
}

/// A device with one signalled UD QP (Q_Key 7) brought to RTS, and the attributes used.
fn ud_qp_in_rts() -> (Device, PdId, CqId, Qpn, QpAttr<Path>) {
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
    let mut a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        qkey: QKey::new(7),
        ..QpAttr::default()
    };
    d.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
        .unwrap();
    (d, pd, cq, qpn, a)
}

#[test]
fn ud_local_error_moves_the_qp_to_sqe_and_rts_recovers_it() {
    let (mut d, _, cq, qpn, mut a) = ud_qp_in_rts();
    let mut wr = SendWr::send(
        1,
        vec![Sge {
            addr: 0,
            length: 8,
            lkey: LKey::new(0xdead_beef),
        }],
    );
    wr.ud = Some(UdDest {
        path: sim::path(Side::A),
        remote_qpn: Qpn::new(5),
        remote_qkey: QKey::new(7),
    });
    d.post_send(qpn, wr).unwrap();
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(d.poll_transmit(Instant::ZERO, &mut buf).is_none());
    assert_eq!(d.poll_cq(cq).unwrap().status, WcStatus::LocProtErr);
    assert_eq!(d.qp(qpn).unwrap().state(), QpState::Sqe);
    a.qp_state = QpState::Rts;
    d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
    assert_eq!(d.qp(qpn).unwrap().state(), QpState::Rts);
}

/// A UD QP's WRs each carry a path; when one's headers are longer or shorter than the
/// previous frame's, the payload gathered into the frame is moved to its place. Every frame
/// is still the one `emit_frame` writes, whatever the buffer held before.
#[test]
fn ud_frames_on_changing_paths_are_emit_frames_bytes() {
    let (mut d, pd, cq, qpn, _) = ud_qp_in_rts();
    let bytes: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let m = d.reg_mr(pd, bytes.clone(), 0x1000, Access::all()).unwrap();
    let v4 = sim::path(Side::A);
    let mut v4_vlan = v4;
    v4_vlan.vlan[0] = Some(crate::wire::VlanTag::dot1q(3, 100));
    let mut v6_qinq = Path::new(
        v4.src_mac,
        v4.dst_mac,
        IpPath::V6 {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            flow_label: 0x12345,
        },
    );
    v6_qinq.vlan = [
        Some(crate::wire::VlanTag::dot1q(1, 10)),
        Some(crate::wire::VlanTag::dot1q(2, 20)),
    ];
    let mut v6 = v6_qinq;
    v6.vlan = [None; 2];
    v6.ecn = Ecn::Ect0;
    let paths = [v4, v6_qinq, v4_vlan, v4, v6, v6, v4_vlan];
    let mut buf = vec![0xee; MAX_FRAME_LEN];
    for (i, path) in paths.into_iter().enumerate() {
        let (off, len) = (i as u64 * 61, 100 + i as u32 * 37);
        let mut wr = SendWr::send(
            i as u64,
            vec![Sge {
                addr: 0x1000 + off,
                length: len,
                lkey: m.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            path,
            remote_qpn: Qpn::new(5),
            remote_qkey: QKey::new(7),
        });
        d.post_send(qpn, wr).unwrap();
        buf.fill(0xee ^ i as u8);
        let t = d.poll_transmit(Instant::ZERO, &mut buf).unwrap();
        let f = parse_frame(&buf[..t.size]).unwrap();
        assert!(f.icrc_ok);
        let off = usize::try_from(off).unwrap();
        assert_eq!(f.payload, &bytes[off..off + len as usize]);
        let mut want = vec![0; MAX_FRAME_LEN];
        let n = crate::wire::emit_frame(&path, &f.roce, f.payload, &mut want).unwrap();
        assert_eq!(&buf[..t.size], &want[..n], "frame {i}");
        assert_eq!(d.poll_cq(cq).unwrap().status, WcStatus::Success);
    }
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

#[test]
fn comp_retry_resends_a_partially_acked_write_from_the_first_unacked_packet() {
    let mut h = h();
    let sg = h.sg(0, 5 * 1024);
    h.d.post_send(
        h.qpn,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: 0x9000,
                rkey: RKey::new(3),
            },
            sg,
        ),
    )
    .unwrap();
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
fn recv_opcode_of_another_transport_is_dropped() {
    let mut h = h();
    h.recv(1, 0, 64);
    let mut p = hdr(Opcode::UD_SEND_ONLY, RQ_PSN);
    p.deth = Some(DethRepr {
        qkey: QKey::new(0),
        src_qp: Qpn::new(0),
    });
    h.rx(p, &[0; 4]);
    let mut p = hdr(Opcode::UC_SEND_ONLY, RQ_PSN);
    p.bth.ack_req = false;
    h.rx(p, &[0; 4]);
    assert!(h.tx().is_empty());
    assert_eq!(h.c().rx_dropped, 2);
    assert_eq!(h.d.qp(h.qpn).unwrap().expected_psn(), Psn::new(RQ_PSN));
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

/// `ib_read_bw -q 4 -s 1M` against rxe in a TCG guest, without the VM: B answers every READ
/// at once (rxe's responder streams a whole READ response without pause) into a slow drop-tail
/// transmit queue (the guest's qdisc, which drops silently), and A reads 8 × 1 MiB on each of
/// 4 QPs with perftest's local ACK timeout (14: 67 ms), shorter than B takes to stream one
/// round of 4 MiB. Returns (simulated seconds, READ response packets B sent, frames the queue
/// dropped, A's retries).
fn slow_bursty_read_responder(seed: u64) -> (f64, u64, u64, u64) {
    const QPS: usize = 4;
    const READS: u64 = 8;
    const LEN: u32 = 1 << 20;
    let link = Link {
        bottleneck: Some(Bottleneck {
            from: Side::B,
            frames_per_sec: 25_000,
            buffer: 3000,
        }),
        ..Link::default()
    };
    let config = DeviceConfig {
        cc: CcConfig::off(),
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
        let src: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ q as u8).collect();
        let mb =
            p.b.reg_mr(b.pd, src, 0x10_0000, Access::REMOTE_READ)
                .unwrap();
        let ma =
            p.a.reg_mr(a.pd, vec![0; LEN as usize], 0x10_0000, Access::LOCAL_WRITE)
                .unwrap();
        for i in 0..READS {
            let mut wr = SendWr::new(
                i,
                SendOp::Read {
                    remote_addr: 0x10_0000,
                    rkey: mb.rkey,
                },
                vec![Sge {
                    addr: 0x10_0000,
                    length: LEN,
                    lkey: ma.lkey,
                }],
            );
            wr.flags = SendFlags::SIGNALED;
            p.a.post_send(a.qpn, wr).unwrap();
        }
        eps.push((a, b, ma));
    }
    let mut done = vec![0u64; QPS];
    let limit = Instant::from_nanos(30_000_000_000);
    let finished = p.drive_until(20_000_000, |p| {
        for (i, (a, ..)) in eps.iter().enumerate() {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "qp {i}: {wc:?}");
                done[i] += 1;
            }
        }
        done.iter().all(|&d| d == READS) || p.time > limit
    });
    let secs = p.time.as_nanos() as f64 / 1e9;
    assert!(
        finished && done.iter().all(|&d| d == READS),
        "READs done per QP {done:?} after {secs:.2} simulated s; link {:?}",
        p.stats
    );
    for (q, (a, _, ma)) in eps.iter().enumerate() {
        let got = p.a.mrs().bytes(ma.lkey).unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &x)| x == (i % 251) as u8 ^ q as u8),
            "qp {q} read wrong data"
        );
        assert_eq!(p.a.qp(a.qpn).unwrap().state(), QpState::Rts);
    }
    let sent: u64 = eps
        .iter()
        .map(|(_, b, _)| p.b.qp(b.qpn).unwrap().counters().sent_pkts)
        .sum();
    let retries: u64 = eps
        .iter()
        .map(|(a, ..)| p.a.qp(a.qpn).unwrap().counters().completer_retry_err)
        .sum();
    (secs, sent, p.stats.queue_full, retries)
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

/// The ready queue and timer set (transport/sched.rs): with many connected QPs, an input
/// queues only the QP it reached, every QP's messages are served in turn, and once the
/// traffic is acknowledged no QP is left queued or with an armed timer.
#[test]
fn sched_serves_only_the_qps_an_input_reached_and_forgets_idle_ones() {
    const QPS: usize = 64;
    let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
    let cfg = RcConfig::default();
    let mut eps = Vec::new();
    for _ in 0..QPS {
        let (a, b) = connect_rc(&mut p, &cfg);
        let ma =
            p.a.reg_mr(a.pd, vec![7; 4096], 0x1000, Access::LOCAL_WRITE)
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; 4096], 0x1000, Access::all())
                .unwrap();
        eps.push((a, b, ma, mb));
    }
    // Bringing the QPs up touched them all; none has anything to send.
    let mut buf = vec![0; 4096];
    assert!(p.a.poll_transmit(Instant::ZERO, &mut buf).is_none());
    assert_eq!(
        p.a.sched.ready_len(),
        0,
        "a QP with nothing to send left the queue"
    );
    assert_eq!(
        p.a.sched.timer_len(),
        0,
        "no timer is armed before any traffic"
    );
    // One WRITE on every second QP: only those are queued, and each gets its frames in turn.
    for (a, _, ma, mb) in eps.iter().step_by(2) {
        let mut wr = SendWr::new(
            u64::from(a.qpn.value()),
            SendOp::Write {
                remote_addr: 0x1000,
                rkey: mb.rkey,
            },
            vec![Sge {
                addr: 0x1000,
                length: 4096,
                lkey: ma.lkey,
            }],
        );
        wr.flags = SendFlags::SIGNALED;
        p.a.post_send(a.qpn, wr).unwrap();
    }
    assert_eq!(p.a.sched.ready_len(), QPS / 2);
    let mut order = Vec::new();
    while let Some(t) = p.a.poll_transmit(Instant::ZERO, &mut buf) {
        order.push(t.qpn);
    }
    // 4 KiB at MTU 1024 is 4 packets per QP, served round-robin: the first 32 frames are
    // one per QP.
    assert_eq!(order.len(), 4 * QPS / 2);
    let first: std::collections::BTreeSet<_> = order[..QPS / 2].iter().collect();
    assert_eq!(first.len(), QPS / 2, "round-robin over the ready QPs");
    assert_eq!(
        p.a.sched.timer_len(),
        QPS / 2,
        "a retransmission timer per sending QP"
    );
    // Those frames were taken off the device, not put on the link: the QPs recover them with
    // their retransmission timers, which the timer set must fire.
    let mut done = 0;
    let finished = p.drive_until(1_000_000, |p| {
        for (a, ..) in &eps {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                if wc.opcode == WcOpcode::RdmaWrite {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    done += 1;
                }
            }
        }
        done == QPS / 2
    });
    assert!(finished, "{done} of {} WRITEs completed", QPS / 2);
    for (.., mb) in eps.iter().step_by(2) {
        assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &[7; 4096][..]);
    }
    for (.., mb) in eps.iter().skip(1).step_by(2) {
        assert_eq!(
            p.b.mrs().bytes(mb.lkey).unwrap(),
            &[0; 4096][..],
            "untouched QP"
        );
    }
    assert!(p.a.poll_transmit(p.time, &mut buf).is_none());
    assert_eq!(p.a.sched.ready_len(), 0);
    // Every timer stopped once all was acknowledged; poll_timeout drops the entries they left.
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.a.sched.timer_len(), 0);
}

/// The device's in-flight budget (`DeviceConfig::max_inflight_pkts`): with many QPs sending
/// at once the PSNs in flight stay within the budget plus one message, every message
/// completes, and nothing is retransmitted (a started message is never held back, so its
/// AckReq goes out).
#[test]
fn sched_in_flight_budget_bounds_all_qps_together_without_retransmissions() {
    const QPS: usize = 32;
    const BUDGET: u32 = 64;
    const MSG: u32 = 8 * 1024; // 8 packets at MTU 1024
    const MSGS: u64 = 4;
    let config = DeviceConfig {
        max_inflight_pkts: BUDGET,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(5, config, Link::default());
    let cfg = RcConfig::default();
    let mut eps = Vec::new();
    for _ in 0..QPS {
        let (a, b) = connect_rc(&mut p, &cfg);
        let ma =
            p.a.reg_mr(a.pd, vec![3; MSG as usize], 0x1000, Access::LOCAL_WRITE)
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; MSG as usize], 0x1000, Access::all())
                .unwrap();
        for i in 0..MSGS {
            let mut wr = SendWr::new(
                i,
                SendOp::Write {
                    remote_addr: 0x1000,
                    rkey: mb.rkey,
                },
                vec![Sge {
                    addr: 0x1000,
                    length: MSG,
                    lkey: ma.lkey,
                }],
            );
            wr.flags = SendFlags::SIGNALED;
            p.a.post_send(a.qpn, wr).unwrap();
        }
        eps.push((a, mb));
    }
    let mut done = 0u64;
    let mut most = 0u64;
    let finished = p.drive_until(1_000_000, |p| {
        most = most.max(p.a.sched.inflight());
        for (a, _) in &eps {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done += 1;
            }
        }
        done == QPS as u64 * MSGS
    });
    assert!(finished, "{done} of {} WRITEs completed", QPS as u64 * MSGS);
    assert!(
        most <= u64::from(BUDGET + MSG / 1024),
        "{most} PSNs in flight with a budget of {BUDGET}"
    );
    assert!(
        most >= u64::from(BUDGET) / 2,
        "the budget was used ({most})"
    );
    let c = p.a.qp_counters();
    assert_eq!(c.completer_retry_err, 0, "{c:?}");
    assert_eq!(c.local_ack_timeout_err, 0, "{c:?}");
    assert_eq!(p.a.sched.inflight(), 0);
    for (_, mb) in &eps {
        assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &[3; MSG as usize][..]);
    }
}

/// Shards of one interface hand out disjoint QP numbers and memory keys, and a number or key
/// names its shard (`Shard::of_qpn`, `Shard::of_key`), also after an R_Key is re-validated.
#[test]
fn shards_hand_out_disjoint_qpns_and_keys_that_name_their_shard() {
    const COUNT: u32 = 3; // not a power of two: the key mapping must not overflow 16 bits
    let mut qpns = BTreeSet::new();
    for index in 0..COUNT {
        let shard = Shard::new(index, COUNT).unwrap();
        let mut d = Device::new(DeviceConfig {
            shard,
            key_seed: [index as u8; 32],
            ..DeviceConfig::default()
        });
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(16).unwrap();
        for _ in 0..50 {
            let qpn = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
            assert_eq!(Shard::of_qpn(COUNT, qpn.value()), index);
            assert!(d.qp(qpn).is_some());
            assert!(qpns.insert(qpn.value()), "QPN {qpn:?} handed out twice");
        }
        for _ in 0..200 {
            let mr = d.reg_mr(pd, vec![0; 64], 0x1000, Access::all()).unwrap();
            let again = d.mrs_mut().revalidate_rkey(mr.lkey).unwrap();
            for k in [mr.lkey.value(), mr.rkey.value(), again.value()] {
                assert_eq!(Shard::of_key(COUNT, k), index, "key {k:#x}");
            }
            d.dereg_mr(mr.lkey).unwrap();
        }
    }
    // The bit mapping stays in range for every input and keeps the high bits when it can.
    for count in [1, 2, 3, 7, 16, 255, 256] {
        for index in [0, count - 1] {
            let s = Shard::new(index, count).unwrap();
            for b in [0u16, 1, 0x7fff, 0xfffe, 0xffff] {
                let k = s.key_bits(b);
                assert_eq!(u32::from(k) % count, index, "{b:#x} in {s:?}");
                assert!(u32::from(k).abs_diff(u32::from(b)) < count);
            }
        }
    }
    assert_eq!(Shard::new(3, 3), None);
    assert_eq!(Shard::new(0, 0), None);
    assert_eq!(Shard::new(0, Shard::MAX_COUNT + 1), None);
}
