//! The device's scheduler (transport/sched.rs): which QPs an input reaches, the in-flight
//! budget, and sharding of QP numbers and keys.

use super::*;

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
        let wr_id = u64::from(a.qpn.value());
        let wr = signaled(wr_id, write(0x1000, mb.rkey), 0x1000, 4096, ma.lkey);
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
            let wr = signaled(i, write(0x1000, mb.rkey), 0x1000, MSG, ma.lkey);
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

/// Many QPs, each with a full queue of one-packet WRITEs, behind a budget far smaller than
/// their windows: every WRITE completes, every byte lands. (The lost wake-up that
/// `Schedule::release_one` passes on, a release spent on a stale blocked entry, stalled
/// `roce perf -q 4096 -s 64 -t 128 -n 128` end to end with 512 WRITEs of 4 QPs never sent;
/// this simulator sends everything it can before it delivers anything and answers every
/// packet with an ACK, so enough releases come and this test passes without the fix too. The
/// stall and its fix were shown by hand runs, BENCHMARKS.md "Per-QP memory"; 16,384 QPs
/// behind the budget run in tests/tests/endpoint.rs.)
#[test]
fn sched_in_flight_budget_completes_many_full_queues_behind_a_small_budget() {
    const QPS: usize = 256;
    const BUDGET: u32 = 16;
    const MSGS: u64 = 64;
    let config = DeviceConfig {
        max_inflight_pkts: BUDGET,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(7, config, Link::default());
    let cfg = RcConfig::default();
    let mut eps = Vec::new();
    for _ in 0..QPS {
        let (a, b) = connect_rc(&mut p, &cfg);
        let ma =
            p.a.reg_mr(a.pd, vec![5; 64], 0x1000, Access::LOCAL_WRITE)
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; 64], 0x1000, Access::all())
                .unwrap();
        for i in 0..MSGS {
            let wr = signaled(i, write(0x1000, mb.rkey), 0x1000, 64, ma.lkey);
            p.a.post_send(a.qpn, wr).unwrap();
        }
        eps.push((a, mb));
    }
    let mut done = 0u64;
    let finished = p.drive_until(10_000_000, |p| {
        for (a, _) in &eps {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done += 1;
            }
        }
        done == QPS as u64 * MSGS
    });
    assert!(finished, "{done} of {} WRITEs completed", QPS as u64 * MSGS);
    assert_eq!(p.a.sched.inflight(), 0);
    for (_, mb) in &eps {
        assert_eq!(p.b.mrs().bytes(mb.lkey).unwrap(), &[5; 64][..]);
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
            assert_eq!(Shard::of_qpn(COUNT, qpn), index);
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
