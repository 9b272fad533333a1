//! Swift (cc/swift.rs) in the transport, on the seeded simulator: RTT samples from ACK timing
//! and a drop-tail bottleneck that marks nothing.

use super::*;
use crate::cc::{CcAlgorithm, CcStats};

/// What one run of [`bottleneck`] measured.
#[derive(Clone, Debug)]
struct Run {
    /// Simulated seconds until every WR completed (or the limit).
    #[allow(dead_code, reason = "printed with the run")]
    secs: f64,
    /// WRs completed, all flows.
    completed: u64,
    /// Frames the bottleneck queue dropped.
    dropped: u64,
    /// Payload bytes each flow's responder had received when the first flow finished.
    at_first_finish: Vec<u64>,
    /// Payload bytes delivered per second of the whole run.
    goodput_bps: f64,
    /// Swift's counters over all flows.
    stats: CcStats,
}

const LEN: u32 = 1 << 20;

/// `flows` RC QPs from A to B, each posting `wrs` 1 MiB WRITEs at once, through a drop-tail
/// FIFO of `buffer` frames on A's egress drained at `frames_per_sec` (no ECN marking), with
/// congestion control `cc`. Checks the data and that every QP stays in RTS.
fn bottleneck(seed: u64, cc: CcConfig, flows: usize, wrs: u64, fps: u64, buffer: u64) -> Run {
    let link = Link {
        bottleneck: Some(Bottleneck {
            from: Side::A,
            frames_per_sec: fps,
            buffer,
        }),
        ..Link::default()
    };
    let config = DeviceConfig {
        cc,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(seed, config, link);
    p.bottleneck_fifo = true;
    let cfg = RcConfig {
        timeout: 14,
        ..RcConfig::default()
    };
    let mut eps = Vec::new();
    for q in 0..flows {
        let (a, b) = connect_rc(&mut p, &cfg);
        let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ q as u8).collect();
        let src = p.a.reg_mr(a.pd, data, 0x10_0000, Access::empty()).unwrap();
        let dst =
            p.b.reg_mr(
                b.pd,
                vec![0; LEN as usize],
                0x10_0000,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
        for i in 0..wrs {
            let wr = signaled(i, write(0x10_0000, dst.rkey), 0x10_0000, LEN, src.lkey);
            p.a.post_send(a.qpn, wr).unwrap();
        }
        eps.push((a, b, dst));
    }
    let mut done = vec![0u64; flows];
    let mut at_first_finish = Vec::new();
    let limit = Instant::from_nanos(30_000_000_000);
    let finished = p.drive_until(40_000_000, |p| {
        for (i, (a, ..)) in eps.iter().enumerate() {
            while let Some(wc) = p.a.poll_cq(a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "qp {i}: {wc:?}");
                done[i] += 1;
            }
        }
        if at_first_finish.is_empty() && done.contains(&wrs) {
            at_first_finish = eps
                .iter()
                .map(|(_, b, _)| p.b.qp(b.qpn).unwrap().counters().rx_payload_bytes)
                .collect();
        }
        done.iter().all(|&d| d == wrs) || p.time > limit
    });
    let secs = p.time.as_nanos() as f64 / 1e9;
    let completed: u64 = done.iter().sum();
    if finished && completed == flows as u64 * wrs {
        for (q, (a, _, dst)) in eps.iter().enumerate() {
            let got = p.b.mrs().bytes(dst.lkey).unwrap();
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &x)| x == (i % 251) as u8 ^ q as u8),
                "qp {q} moved wrong data"
            );
            assert_eq!(p.a.qp(a.qpn).unwrap().state(), QpState::Rts);
        }
    }
    let mut stats = CcStats::default();
    for (a, ..) in &eps {
        stats.add(&p.a.qp(a.qpn).unwrap().congestion().unwrap().stats());
    }
    Run {
        secs,
        completed,
        dropped: p.stats.queue_full,
        at_first_finish,
        goodput_bps: (completed * u64::from(LEN)) as f64 * 8.0 / secs,
        stats,
    }
}

/// The criteria for a delay-based CC on a drop-tail bottleneck that marks nothing
/// (a 64-frame FIFO at 25,000 frames/s, 205 Mb/s of 1024 B payloads; and 32 frames at
/// 50,000 frames/s): Swift drops at
/// most a tenth of what CC off drops (per WR completed), its goodput is within 20 % of the
/// bottleneck, and two flows get within 30 % of their fair share.
#[test]
fn swift_keeps_a_drop_tail_queue_short_fast_and_fair() {
    // (frames/s, queue): the 200 Mb/s path, and a faster one with a shorter queue.
    for (seed, fps, buffer) in [(1, 25_000, 64), (2, 50_000, 32)] {
        let path_bps = (fps * 1024 * 8) as f64;
        let off = bottleneck(seed, CcConfig::off(), 2, 8, fps, buffer);
        let swift = bottleneck(seed, CcConfig::swift(), 2, 8, fps, buffer);
        eprintln!("{fps} frames/s, {buffer} frames: off {off:?}\n  swift {swift:?}");
        assert_eq!(swift.completed, 16, "{swift:?}");
        assert!(off.dropped > 0, "{off:?}");
        // Drops per WR completed: at most a tenth of CC off's.
        assert!(
            swift.dropped * 10 * off.completed.max(1) <= off.dropped * swift.completed,
            "swift {swift:?} against off {off:?}"
        );
        // Goodput within 20 % of the bottleneck.
        assert!(
            swift.goodput_bps >= 0.8 * path_bps,
            "{:.1} Mb/s of {:.1}: {swift:?}",
            swift.goodput_bps / 1e6,
            path_bps / 1e6
        );
        // Two flows within 30 % of fair while both run.
        let (x, y) = (swift.at_first_finish[0], swift.at_first_finish[1]);
        let fair = (x + y) as f64 / 2.0;
        for got in [x, y] {
            assert!(
                (got as f64 - fair).abs() <= 0.3 * fair,
                "{x} and {y} bytes when the first flow finished: {swift:?}"
            );
        }
        assert!(swift.stats.swift_rtt_samples > 100, "{swift:?}");
        assert!(swift.stats.swift_delay_decreases > 0, "{swift:?}");
        assert_eq!(swift.stats.rp_cnp_handled, 0);
    }
}

/// RTT samples come from ACK timing: on an idle path (5 µs each way, no bottleneck) the
/// window grows by additive increase only, every sample is under the target, and the
/// data leaves Not-ECT (Swift needs no marks).
#[test]
fn swift_samples_rtt_from_acks_and_grows_on_an_idle_path() {
    let mut p = Pair::new(
        3,
        DeviceConfig {
            cc: CcConfig::swift(),
            ..DeviceConfig::default()
        },
        Link::default(),
    );
    let (a, b) = connect_rc(&mut p, &RcConfig::default());
    let src =
        p.a.reg_mr(a.pd, vec![7; 1 << 16], 0x1000, Access::empty())
            .unwrap();
    let dst =
        p.b.reg_mr(
            b.pd,
            vec![0; 1 << 16],
            0x1000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let ecn = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let seen = ecn.clone();
    // The ACKs B sends: one per AckReq, or fewer where B coalesces a batch's (IBA 9.7.5.1).
    let acks = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let acked = acks.clone();
    p.filter = Some(Box::new(move |side, frame| {
        if let Ok(f) = parse_frame(frame) {
            if side == Side::A && f.ecn() != crate::wire::Ecn::NotEct {
                seen.set(seen.get() + 1);
            }
            if side == Side::B && f.roce.aeth.is_some_and(|a| a.syndrome.is_ack()) {
                acked.set(acked.get() + 1);
            }
        }
        true
    }));
    for i in 0..4 {
        p.a.post_send(
            a.qpn,
            signaled(i, write(0x1000, dst.rkey), 0x1000, 1 << 16, src.lkey),
        )
        .unwrap();
    }
    let mut n = 0;
    assert!(p.drive_until(1_000_000, |p| {
        while let Some(wc) = p.a.poll_cq(a.cq) {
            assert_eq!(wc.status, WcStatus::Success);
            n += 1;
        }
        n == 4
    }));
    let cc = p.a.qp(a.qpn).unwrap().congestion().unwrap();
    let s = cc.stats();
    assert_eq!(ecn.get(), 0, "Swift data must leave Not-ECT");
    // Every ACK from B gives a sample (nothing was retransmitted, so Karn's rule skips
    // none), and each of the 4 messages was acknowledged at least once.
    assert_eq!(s.swift_rtt_samples, acks.get(), "{s:?}");
    assert_eq!(s.swift_rtt_skipped, 0, "{s:?}");
    assert!(s.swift_rtt_samples >= 4, "{s:?}");
    assert_eq!(
        (s.swift_delay_decreases, s.swift_loss_decreases),
        (0, 0),
        "{s:?}"
    );
    let w = cc.swift().unwrap();
    assert!(w.cwnd() > 16.0, "{}", w.cwnd());
    let rtt = w.rtt().unwrap();
    assert!(rtt >= core::time::Duration::from_micros(10), "{rtt:?}");
    assert!(rtt < w.target_delay(), "{rtt:?}");
    let snap = cc.snapshot();
    assert_eq!(snap.algorithm, CcAlgorithm::Swift);
    assert_eq!(snap.rtt_ns, Some(rtt.as_nanos() as u64));
}

/// `--cc` per QP: one QP switched to Swift at run time keeps its counters and gets a window;
/// switching back to DCQCN drops it.
#[test]
fn swift_is_selectable_per_qp() {
    let mut p = Pair::new(4, DeviceConfig::default(), Link::default());
    let (a, _) = connect_rc(&mut p, &RcConfig::default());
    let (c, _) = connect_rc(&mut p, &RcConfig::default());
    p.a.set_cc_algorithm(a.qpn, CcAlgorithm::Swift).unwrap();
    assert!(
        p.a.qp(a.qpn)
            .unwrap()
            .congestion()
            .unwrap()
            .swift()
            .is_some()
    );
    assert!(
        p.a.qp(c.qpn)
            .unwrap()
            .congestion()
            .unwrap()
            .swift()
            .is_none()
    );
    p.a.set_cc_param(a.qpn, "swift_init_cwnd", 4).unwrap();
    let w =
        p.a.qp(a.qpn)
            .unwrap()
            .congestion()
            .unwrap()
            .swift()
            .unwrap()
            .cwnd();
    assert!((w - 4.0).abs() < 1e-12);
    let e = p.a.set_cc_param(a.qpn, "swift_beta", 1001).unwrap_err();
    assert!(e.to_string().contains("Swift parameter swift_beta"), "{e}");
    p.a.set_cc_algorithm(a.qpn, CcAlgorithm::Dcqcn).unwrap();
    assert!(
        p.a.qp(a.qpn)
            .unwrap()
            .congestion()
            .unwrap()
            .swift()
            .is_none()
    );
    assert!(
        p.a.set_cc_algorithm(Qpn::new(0xdead), CcAlgorithm::Swift)
            .is_err()
    );
}
