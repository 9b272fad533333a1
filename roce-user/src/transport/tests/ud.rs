//! Unreliable datagram (IBA 9.8): DETH and Q_Key, GRH on receive, SQE recovery, paths per WR.

use super::*;

#[test]
fn ud_send_carries_deth_and_qkey_and_the_receiver_gets_a_grh() {
    let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
    let mut qps = Vec::new();
    for side in [Side::A, Side::B] {
        let d = p.dev(side);
        let (pd, cq, qpn, _) = ud_bring_up(d, QKey::new(0x1111_1111));
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
    let got = p.b.mrs().bytes(mb.lkey).unwrap();
    assert_eq!(&got[40..140], &[0x33; 100]);
    // The GRH area as rxe fills it for RoCE v2 over IPv4: 20 zero bytes, then the packet's
    // IPv4 header (valid checksum), from which ibv_init_ah_from_wc reads the sender.
    assert_eq!(&got[..20], &[0; 20]);
    let ip4 = crate::wire::ipv4::Packet::new_unchecked(&got[20..40]);
    assert_eq!((ip4.version(), ip4.header_len()), (4, 20));
    assert!(ip4.verify_checksum());
    assert_eq!(ip4.src_addr(), ip(Side::A));
    assert_eq!(ip4.dst_addr(), ip(Side::B));
    assert_eq!(ip4.protocol(), 17);
}

/// C10-93.1.1: a UD send longer than the MTU emits nothing and completes successfully, as
/// rxe does (rxe_req.c); the send after it goes out as usual.
#[test]
fn ud_send_longer_than_the_mtu_completes_without_a_packet() {
    let (mut d, pd, cq, qpn, _) = ud_qp_in_rts();
    let m = d.reg_mr(pd, vec![1; 4096], 0x1000, Access::all()).unwrap();
    for (wr_id, length) in [(1, 1025), (2, 1024)] {
        let mut wr = SendWr::send(
            wr_id,
            vec![Sge {
                addr: 0x1000,
                length,
                lkey: m.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            path: sim::path(Side::A),
            remote_qpn: Qpn::new(5),
            remote_qkey: QKey::new(7),
        });
        d.post_send(qpn, wr).unwrap();
    }
    let mut buf = vec![0; MAX_FRAME_LEN];
    let t = d
        .poll_transmit(Instant::ZERO, &mut buf)
        .expect("the second send");
    let f = parse_frame(&buf[..t.size]).unwrap();
    assert_eq!(f.payload.len(), 1024);
    assert!(d.poll_transmit(Instant::ZERO, &mut buf).is_none());
    for wr_id in [1, 2] {
        let wc = d.poll_cq(cq).unwrap();
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
    }
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

/// `post_send_all` (ibv_wr_complete) posts a batch all or none: a bad WR anywhere leaves the
/// send queue as it was, and a good batch goes out in order.
#[test]
fn a_batch_of_sends_is_posted_all_or_none() {
    let (mut d, pd, cq, qpn, _) = ud_qp_in_rts();
    let m = d.reg_mr(pd, vec![1; 256], 0x1000, Access::all()).unwrap();
    let wr = |wr_id: u64, nsge: usize| {
        let mut wr = SendWr::send(
            wr_id,
            vec![
                Sge {
                    addr: 0x1000,
                    length: 8,
                    lkey: m.lkey,
                };
                nsge
            ],
        );
        wr.ud = Some(UdDest {
            path: sim::path(Side::A),
            remote_qpn: Qpn::new(5),
            remote_qkey: QKey::new(7),
        });
        wr
    };
    let too_many = DeviceConfig::default().max_sge as usize + 1;
    let e = d
        .post_send_all(qpn, vec![wr(1, 1), wr(2, 1), wr(3, too_many)])
        .unwrap_err();
    assert!(matches!(e, (2, PostError::TooManySge(..))), "{e:?}");
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(d.poll_transmit(Instant::ZERO, &mut buf).is_none());
    assert!(d.poll_cq(cq).is_none());
    d.post_send_all(qpn, vec![wr(4, 1), wr(5, 2)]).unwrap();
    while d.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
    let ids: Vec<u64> = core::iter::from_fn(|| d.poll_cq(cq))
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(ids, [4, 5]);
}
