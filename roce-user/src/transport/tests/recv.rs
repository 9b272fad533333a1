//! Receive checks before a packet reaches a QP (rxe_recv.c): P_Key, source address, QP
//! state, transport of the opcode, unknown QPs and garbage frames.

use super::*;

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
        ip: None,
        udp_src_port: 0,
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
            ip: None,
            udp_src_port: 0,
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
            ip: None,
            udp_src_port: 0,
        },
        None,
    );
    assert_eq!(h.d.device_counters().rx_unknown_qp, 1);
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

/// `handle_packet_traced` (what `roce dump` calls while capturing) names the counter that
/// counted a dropped frame, by the counter structs' own names, and nothing for a frame that
/// was taken.
#[test]
fn traced_receive_names_the_drop_counter() {
    let mut h = h();
    sends(&mut h, 1, 64);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let t =
        h.d.poll_transmit(h.now, &mut buf)
            .expect("the SEND goes out");
    let frame = buf[..t.size].to_vec();
    // Our own SEND is for the peer's QP, which this device does not have.
    let d = h.d.handle_packet_traced(h.now, &mut frame.clone());
    assert_eq!(d.map(DropCounter::name), Some("rx_unknown_qp"));
    // A bit flipped in the payload: the ICRC no longer matches.
    let mut bad = frame.clone();
    let last = bad.len() - 8;
    bad[last] ^= 1;
    let d = h.d.handle_packet_traced(h.now, &mut bad);
    assert_eq!(d.map(DropCounter::name), Some("rx_malformed"));
    assert_eq!(h.c().rx_dropped, 0);
    // rcvd_pkts moves for every frame and is not a drop.
    let before = *h.d.device_counters();
    let mut after = before;
    after.rcvd_pkts += 1;
    assert_eq!(DropCounter::device_delta(&before, &after), None);
}

/// Issue 20, DCQCN under CPU contention: the notification point counts arrivals, not handling.
/// Eight CE-marked WRITEs that arrived 10 µs apart (their arrival stamps) but are handled in
/// one batch 4 ms later yield one CNP per `min_time_between_cnps` (20 µs) of their arrivals:
/// at 0, 20, 40 and 60 µs, four. The same eight handled with one time for all (no stamps: the
/// handling time is their arrival) yield one, as before the stamps.
#[test]
fn np_decides_cnps_by_arrival_time_not_by_handling_time() {
    for (stamped, want) in [(true, 4u64), (false, 1)] {
        let mut h = h();
        h.d.set_cc_param(h.qpn, "min_time_between_cnps", 20)
            .unwrap();
        let rkey = h.mr.rkey;
        let handled = Instant::from_micros(5_000);
        for i in 0..8u32 {
            let repr = with_reth(hdr(Opcode::RC_RDMA_WRITE_ONLY, RQ_PSN + i), BASE, rkey, 4);
            let arrival = if stamped {
                Instant::from_micros(1_000 + 10 * u64::from(i))
            } else {
                handled
            };
            h.rx_arrived(handled, arrival, repr, &[1; 4], true);
        }
        h.now = handled;
        let cnps = h
            .tx()
            .iter()
            .filter(|(r, _)| r.bth.opcode == Opcode::CNP)
            .count() as u64;
        let stats = h.d.qp(h.qpn).unwrap().congestion().unwrap().stats();
        assert_eq!(
            (cnps, stats.np_cnp_sent),
            (want, want),
            "stamped: {stamped}"
        );
        assert_eq!(stats.np_ecn_marked_roce_packets, 8);
        assert_eq!(h.mem(0, 4), vec![1; 4], "the writes were executed");
    }
}

/// The reaction point's side of the same: five CNPs that arrived 50 µs apart but are handled
/// in one late batch each cut the rate (`rate_reduce_monitor_period`, 4 µs, counts arrivals);
/// handled with one time for all, only the first cuts and four are ignored.
#[test]
fn rp_takes_cnps_at_their_arrival_time() {
    for (stamped, handled_want) in [(true, 5u64), (false, 1)] {
        let mut h = h();
        let handled = Instant::from_micros(5_000);
        let rate_before = h.d.qp(h.qpn).unwrap().congestion().unwrap().snapshot();
        for i in 0..5u64 {
            let arrival = if stamped {
                Instant::from_micros(1_000 + 50 * i)
            } else {
                handled
            };
            h.rx_arrived(handled, arrival, RoceRepr::cnp(h.qpn), &[0; 16], false);
        }
        let cc = h.d.qp(h.qpn).unwrap().congestion().unwrap();
        let s = cc.stats();
        assert_eq!(
            (s.rp_cnp_handled, s.rp_cnp_ignored),
            (handled_want, 5 - handled_want),
            "stamped: {stamped}"
        );
        assert!(cc.snapshot().rate_bps < rate_before.rate_bps);
    }
}
