//! Property tests of the requester: the PSN window and segmentation by path MTU.
//!
//! One device plays the requester; the test plays the responder by parsing the frames it
//! sends and feeding back ACKs through `Device::handle_decoded`.

use std::net::IpAddr;

use proptest::prelude::*;
use roce::{
    transport::{
        Access, CqId, Device, DeviceConfig, Instant, MAX_FRAME_LEN, Mtu, Psn, QpCap, QpInit,
        QpType, Qpn, RKey, RxPkt, SendOp, SendWr, Sge, WcStatus,
        qp::{MAX_PKT_PER_ACK, MAX_UNACKED_PSNS, packets_for},
        sim::{RcConfig, Side, bring_up, ip},
    },
    wire::{AethRepr, AethSyndrome, Msn, RoceRepr, parse_frame},
};

struct Req {
    d: Device,
    qpn: Qpn,
    cq: CqId,
    lkey: roce::transport::LKey,
}

fn req(mtu: Mtu, sq_psn: u32) -> Req {
    let mut d = Device::new(DeviceConfig::default());
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(1 << 14).unwrap();
    let qpn = d
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 1024,
                ..QpCap::default()
            },
            sq_sig_all: true,
        })
        .unwrap();
    let cfg = RcConfig {
        mtu,
        ..RcConfig::default()
    };
    bring_up(
        &mut d,
        qpn,
        Side::A,
        Qpn::new(0x99),
        Psn::new(sq_psn),
        Psn::new(0),
        &cfg,
    );
    let data: Vec<u8> = (0..(1 << 20) as u32).map(|i| (i % 253) as u8).collect();
    let m = d.reg_mr(pd, data, 0, Access::all()).unwrap();
    Req {
        d,
        qpn,
        cq,
        lkey: m.lkey,
    }
}

fn drain(r: &mut Req) -> Vec<(RoceRepr, Vec<u8>)> {
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut out = Vec::new();
    while let Some(t) = r.d.poll_transmit(Instant::ZERO, &mut buf) {
        let f = parse_frame(&buf[..t.size]).unwrap();
        out.push((f.roce, f.payload.to_vec()));
    }
    out
}

fn ack(r: &mut Req, psn: Psn) {
    let pkt = RxPkt {
        repr: RoceRepr::ack(
            r.qpn,
            psn,
            AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: Msn::new(0),
            },
        ),
        payload: &[],
        ce: false,
        ip: None,
        udp_src_port: 0,
    };
    let addrs = Some((IpAddr::V4(ip(Side::B)), IpAddr::V4(ip(Side::A))));
    r.d.handle_decoded(Instant::ZERO, &pkt, addrs);
}

fn mtu_strategy() -> impl Strategy<Value = Mtu> {
    prop_oneof![
        Just(Mtu::Mtu256),
        Just(Mtu::Mtu512),
        Just(Mtu::Mtu1024),
        Just(Mtu::Mtu2048),
        Just(Mtu::Mtu4096),
    ]
}

fn psn_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..0x100, 0xff_ff00u32..=0xff_ffff, 0u32..=0xff_ffff]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A message of `len` bytes is cut into ceil(len/mtu) packets (at least one) with
    /// consecutive PSNs across the 2^24 wrap, FIRST/MIDDLE/LAST or ONLY opcodes, full-MTU
    /// payloads except the last, the RETH only on the first WRITE packet, and the bytes intact.
    #[test]
    fn segmentation_by_path_mtu(mtu in mtu_strategy(), len in 0u32..40_000, start in psn_strategy(), write in any::<bool>()) {
        let mut r = req(mtu, start);
        let sg = vec![Sge { addr: 7, length: len, lkey: r.lkey }];
        let op = if write {
            SendOp::Write { remote_addr: 0x1000, rkey: RKey::new(5) }
        } else {
            SendOp::Send
        };
        r.d.post_send(r.qpn, SendWr::new(1, op, sg)).unwrap();
        let mut pkts = Vec::new();
        loop {
            let out = drain(&mut r);
            if out.is_empty() {
                break;
            }
            let last = out.last().unwrap().0.bth.psn;
            pkts.extend(out);
            ack(&mut r, last);
        }
        let n = packets_for(u64::from(len), mtu) as usize;
        prop_assert_eq!(pkts.len(), n);
        let m = mtu.bytes() as usize;
        let mut bytes = Vec::new();
        for (i, (h, p)) in pkts.iter().enumerate() {
            prop_assert_eq!(h.bth.psn, Psn::new(start).wrapping_add(i as u32));
            let info = h.bth.opcode.info().unwrap();
            let pos = info.position;
            use roce_common::opcode::Position::*;
            let want = if n == 1 { Only } else if i == 0 { First } else if i + 1 == n { Last } else { Middle };
            prop_assert_eq!(pos, want);
            if i + 1 < n {
                prop_assert_eq!(p.len(), m);
            } else {
                prop_assert!(p.len() <= m && (n == 1 || !p.is_empty()));
            }
            prop_assert_eq!(h.reth.is_some(), write && i == 0);
            if let Some(reth) = h.reth {
                prop_assert_eq!(reth.dma_len, len);
            }
            prop_assert_eq!(h.bth.ack_req, i + 1 == n || (i + 1) % MAX_PKT_PER_ACK as usize == 0);
            bytes.extend_from_slice(p);
        }
        let want: Vec<u8> = (7..7 + len).map(|i| (i % 253) as u8).collect();
        prop_assert_eq!(bytes, want);
        let wc = r.d.poll_cq(r.cq).unwrap();
        prop_assert_eq!(wc.status, WcStatus::Success);
    }

    /// Whatever the message sizes and the cumulative ACK pattern, the requester never has more
    /// than MAX_UNACKED_PSNS PSNs outstanding, never sends a PSN twice without a retry, a READ
    /// consumes one PSN per response packet, and an ACK completes exactly the WRs it covers,
    /// in order.
    #[test]
    fn psn_window_is_bounded_and_acks_complete_in_order(
        mtu in mtu_strategy(),
        start in psn_strategy(),
        msgs in proptest::collection::vec((0u32..20_000, any::<bool>()), 1..40),
        ack_picks in proptest::collection::vec(0.0f64..1.0, 1..200),
    ) {
        let mut r = req(mtu, start);
        let mut last_psn = Vec::new();
        let mut psn = Psn::new(start);
        for (i, (len, read)) in msgs.iter().enumerate() {
            let sg = vec![Sge { addr: 0, length: *len, lkey: r.lkey }];
            let op = if *read {
                SendOp::Read { remote_addr: 0, rkey: RKey::new(5) }
            } else {
                SendOp::Send
            };
            r.d.post_send(r.qpn, SendWr::new(i as u64, op, sg)).unwrap();
            psn = psn.wrapping_add(packets_for(u64::from(*len), mtu));
            last_psn.push(psn.wrapping_sub(1));
        }
        // Only SENDs are acknowledged by ACKs here: stop at the first READ.
        let sends = msgs.iter().take_while(|(_, read)| !read).count();
        let mut sent: Vec<Psn> = Vec::new();
        let mut acked: Option<Psn> = None;
        let mut completed = 0usize;
        for pick in ack_picks {
            for (h, _) in drain(&mut r) {
                if let Some(prev) = sent.last() {
                    prop_assert!(h.bth.psn.distance(*prev) > 0, "PSNs only increase without retries");
                }
                sent.push(h.bth.psn);
                let base = acked.map_or(Psn::new(start), |a| a.next());
                prop_assert!(h.bth.psn.distance(base) < MAX_UNACKED_PSNS as i32);
            }
            if sent.is_empty() || sends == 0 {
                break;
            }
            // A cumulative ACK of a random sent PSN, but never into the first READ.
            let limit = last_psn[sends - 1];
            let cand: Vec<Psn> = sent.iter().copied().filter(|p| p.distance(limit) <= 0).collect();
            if cand.is_empty() {
                break;
            }
            let p = cand[((cand.len() - 1) as f64 * pick) as usize];
            if acked.is_none_or(|a| p.distance(a) > 0) {
                acked = Some(p);
            }
            ack(&mut r, p);
            while let Some(wc) = r.d.poll_cq(r.cq) {
                prop_assert_eq!(wc.wr_id, completed as u64, "in order");
                prop_assert_eq!(wc.status, WcStatus::Success);
                completed += 1;
            }
            let covered = last_psn[..sends]
                .iter()
                .filter(|l| acked.is_some_and(|a| l.distance(a) <= 0))
                .count();
            prop_assert_eq!(completed, covered, "an ACK completes exactly what it covers");
        }
        // A READ may take many PSNs at once, so the bound is on where a request may start
        // (checked above for every packet), as in rxe's `RXE_MAX_UNACKED_PSNS` test.
        let q = r.d.qp(r.qpn).unwrap();
        let reach = q.next_send_psn().distance(q.oldest_unacked_psn());
        prop_assert!(reach < MAX_UNACKED_PSNS as i32 + (1 << 20) / mtu.bytes() as i32);
    }
}
