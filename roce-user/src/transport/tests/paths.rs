//! The simulator's several paths (docs/multipath.md "Test bed and proof"; issue 19): frames
//! take the path their UDP source port hashes to, each path with its own delay, loss and
//! marking. The transport does not spray yet, so one QP's frames all take one path: over a
//! lossy, slow path it retransmits and takes longer; over a clean one it does neither, and in
//! both cases every byte arrives.

use core::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::transport::multipath::MpState;

/// The first entropy (UDP source port) from `from` that takes path `i` of `n`.
fn port_on(i: usize, n: usize, from: u16) -> u16 {
    (from..=0xffff)
        .find(|&p| path_index(p, n) == i)
        .expect("an entropy on every path")
}

#[test]
fn path_index_spreads_entropies_over_every_path() {
    let mut per = [0u32; 4];
    for p in 0xc000u16..0xc000 + 256 {
        per[path_index(p, 4)] += 1;
    }
    assert!(per.iter().all(|&n| (32..=96).contains(&n)), "{per:?}");
    assert_eq!(path_index(0xc123, 1), 0);
    assert_eq!(path_index(0xc123, 0), 0);
}

/// What one run of 40 WRITEs of 3000 bytes over `paths`, with both QPs on `path`, did: the
/// simulated time it took, the requester's retries and the per-path stats.
fn run(paths: Vec<Link>, path: usize) -> (Instant, u64, Vec<sim::LinkStats>) {
    let n = paths.len();
    let mut p = Pair::new(19, DeviceConfig::default(), Link::default());
    p.set_paths(paths);
    let ports = (port_on(path, n, 0xc000), port_on(path, n, 0xd000));
    let (a, b) = connect_rc_ports(&mut p, &RcConfig::default(), ports);
    let src: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::LOCAL_WRITE)
            .unwrap();
    let mb =
        p.b.reg_mr(b.pd, vec![0; 40 * 3000], 0x10_0000, Access::all())
            .unwrap();
    for i in 0..40u64 {
        let sg = vec![Sge {
            addr: 0x1000,
            length: 3000,
            lkey: ma.lkey,
        }];
        let wr = SendWr::new(i, write(0x10_0000 + i * 3000, mb.rkey), sg);
        p.a.post_send(a.qpn, wr).unwrap();
    }
    let mut done = Vec::new();
    assert!(p.drive_until(2_000_000, |p| {
        done.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)));
        done.len() == 40
    }));
    assert!(
        done.iter().all(|w| w.status == WcStatus::Success),
        "{done:?}"
    );
    let got: Vec<u64> = done.iter().map(|w| w.wr_id).collect();
    assert_eq!(got, (0..40).collect::<Vec<_>>(), "in order");
    let mbytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in 0..40 {
        assert_eq!(&mbytes[i * 3000..(i + 1) * 3000], &src[..], "WRITE {i}");
    }
    let retries = p.a.qp_counters().completer_retry_err;
    (p.time, retries, p.path_stats().to_vec())
}

#[test]
fn one_qp_over_a_lossy_path_retransmits_over_a_clean_path_does_not() {
    let clean = Link {
        latency: Duration::from_micros(5),
        ..Link::default()
    };
    let lossy = Link {
        latency: Duration::from_micros(50),
        loss: 0.1,
        ..Link::default()
    };
    // The QP's frames on the lossy path 0 of [lossy, clean].
    let (t_lossy, retries, st) = run(vec![lossy, clean], 0);
    assert!(st[0].sent > 0 && st[0].lost > 0, "{st:?}");
    assert_eq!(st[1].sent, 0, "nothing on the other path: {st:?}");
    assert!(retries > 0, "losses cost go-back-N retries");
    assert_eq!(st[0].delivered + st[0].lost, st[0].sent);
    // The same QP on the clean path 1 of the same two paths.
    let (t_clean, retries, st) = run(vec![lossy, clean], 1);
    assert_eq!(st[0].sent, 0, "{st:?}");
    assert!(st[1].sent > 0 && st[1].lost == 0, "{st:?}");
    assert_eq!(retries, 0);
    assert!(
        t_clean + Duration::from_micros(200) < t_lossy,
        "clean {t_clean:?} vs lossy {t_lossy:?}"
    );
}

#[test]
fn a_marking_path_marks_only_its_own_frames() {
    let marking = Link {
        ce: 1.0,
        ..Link::default()
    };
    for (path, marked) in [(0, true), (1, false)] {
        let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
        p.set_paths(vec![marking, Link::default()]);
        let ports = (port_on(path, 2, 0xc000), port_on(path, 2, 0xd000));
        let (a, b) = connect_rc_ports(&mut p, &RcConfig::default(), ports);
        let ma =
            p.a.reg_mr(a.pd, vec![1; 4096], 0x1000, Access::LOCAL_WRITE)
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; 4096], 0x1000, Access::all())
                .unwrap();
        let sg = vec![Sge {
            addr: 0x1000,
            length: 4096,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::new(1, write(0x1000, mb.rkey), sg))
            .unwrap();
        assert!(p.drive(100_000));
        assert_eq!(p.a.poll_cq(a.cq).map(|w| w.status), Some(WcStatus::Success));
        let st = p.path_stats();
        assert_eq!(st[path].ce_marked > 0, marked, "path {path}: {st:?}");
        assert_eq!(st[1 - path].sent, 0);
        assert_eq!(
            p.stats.ce_marked, st[path].ce_marked,
            "totals match the path"
        );
    }
}

/// Four paths with their own delay, loss, duplication, reordering and CE marking, one QP on
/// each (the transport does not spray yet): whatever the schedule, every WRITE and SEND of
/// every QP completes once, successfully and in order, with every byte where it belongs.
fn four_qps_over_four_paths(seed: u64, paths: Vec<Link>) {
    four_qps_over_four_paths_with(seed, paths, DeviceConfig::default(), false);
}

/// [`four_qps_over_four_paths`] on devices made with `config` (the multipath extension on,
/// say), the QPs told out of band that their peers allow it if `hinted`.
fn four_qps_over_four_paths_with(seed: u64, paths: Vec<Link>, config: DeviceConfig, hinted: bool) {
    let multipath = config.multipath;
    let mut p = Pair::new(seed, config, Link::default());
    p.set_paths(paths);
    let mut qps = Vec::new();
    for path in 0..4 {
        let ports = (port_on(path, 4, 0xc000), port_on(path, 4, 0xd000));
        let cfg = RcConfig {
            multipath_peer: hinted,
            ..RcConfig::default()
        };
        let (a, b) = connect_rc_ports(&mut p, &cfg, ports);
        let src: Vec<u8> = (0..2000u32)
            .map(|i| (i as u8) ^ (path as u8 * 31))
            .collect();
        let ma =
            p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::LOCAL_WRITE)
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; 12 * 2000], 0x10_0000, Access::all())
                .unwrap();
        p.b.post_recv(
            b.qpn,
            RecvWr {
                wr_id: 99,
                sg_list: vec![Sge {
                    addr: 0x10_0000 + 10 * 2000,
                    length: 2000,
                    lkey: mb.lkey,
                }],
            },
        )
        .unwrap();
        for i in 0..10u64 {
            let sg = vec![Sge {
                addr: 0x1000,
                length: 2000,
                lkey: ma.lkey,
            }];
            let wr = SendWr::new(i, write(0x10_0000 + i * 2000, mb.rkey), sg);
            p.a.post_send(a.qpn, wr).unwrap();
        }
        let sg = vec![Sge {
            addr: 0x1000,
            length: 2000,
            lkey: ma.lkey,
        }];
        p.a.post_send(a.qpn, SendWr::send(10, sg)).unwrap();
        qps.push((a, b, mb, src));
    }
    let mut done: Vec<Vec<(u64, WcStatus)>> = vec![Vec::new(); 4];
    let mut recvd: Vec<Vec<(u64, WcStatus)>> = vec![Vec::new(); 4];
    let finished = p.drive_until(5_000_000, |p| {
        for (k, (a, b, ..)) in qps.iter().enumerate() {
            done[k].extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
            recvd[k].extend(core::iter::from_fn(|| p.b.poll_cq(b.cq)).map(|w| (w.wr_id, w.status)));
        }
        done.iter().all(|d| d.len() >= 11) && recvd.iter().all(|r| !r.is_empty())
    });
    assert!(finished, "{:?} {done:?}", p.stats);
    assert!(p.drive(1_000_000), "idle afterwards");
    for (k, (a, b, mb, src)) in qps.iter().enumerate() {
        done[k].extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)).map(|w| (w.wr_id, w.status)));
        recvd[k].extend(core::iter::from_fn(|| p.b.poll_cq(b.cq)).map(|w| (w.wr_id, w.status)));
        let want: Vec<(u64, WcStatus)> = (0..11).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(done[k], want, "QP {k}: once each, in order");
        assert_eq!(recvd[k], [(99, WcStatus::Success)], "QP {k}: one receive");
        let bytes = p.b.mrs().bytes(mb.lkey).unwrap();
        for i in 0..11 {
            assert_eq!(
                &bytes[i * 2000..(i + 1) * 2000],
                &src[..],
                "QP {k} message {i}"
            );
        }
    }
    for (i, s) in p.path_stats().iter().enumerate() {
        assert!(s.sent > 0, "path {i} carried its QP: {s:?}");
    }
    if multipath {
        for (a, b, ..) in &qps {
            assert_eq!(p.a.qp(a.qpn).unwrap().multipath(), MpState::On);
            // Every packet went before the answer came back (the simulator does not pace),
            // so selective repeat took over the packets in flight: what was lost after that
            // was resent with trailers, placed out of order.
            assert!(p.a.qp(a.qpn).unwrap().selective_repeat().is_some());
            assert_eq!(p.b.qp(b.qpn).unwrap().multipath(), MpState::On);
        }
    }
}

fn arb_link() -> impl Strategy<Value = Link> {
    (
        1u64..100,
        0.0f64..0.03,
        0.0f64..0.05,
        0.0f64..0.2,
        0.0f64..0.5,
    )
        .prop_map(|(lat, loss, dup, reorder, ce)| Link {
            latency: Duration::from_micros(lat),
            loss,
            dup,
            reorder,
            ce,
            ..Link::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn four_impaired_paths_complete_exactly_once(
        seed in any::<u64>(),
        paths in proptest::collection::vec(arb_link(), 4..=4),
    ) {
        four_qps_over_four_paths(seed, paths);
    }

    /// The same with the multipath extension on at both ends (out-of-order placement, SACKs,
    /// selective repeat; one entropy per QP until spraying): exactly once, in order, every
    /// byte where it belongs.
    #[test]
    fn four_impaired_paths_complete_exactly_once_with_the_extension(
        seed in any::<u64>(),
        paths in proptest::collection::vec(arb_link(), 4..=4),
    ) {
        let config = DeviceConfig {
            multipath: true,
            ..DeviceConfig::default()
        };
        four_qps_over_four_paths_with(seed, paths, config, false);
    }

    /// The same with the QPs hinted out of band: on from their first packets.
    #[test]
    fn four_impaired_paths_complete_exactly_once_hinted(
        seed in any::<u64>(),
        paths in proptest::collection::vec(arb_link(), 4..=4),
    ) {
        let config = DeviceConfig {
            multipath: true,
            ..DeviceConfig::default()
        };
        four_qps_over_four_paths_with(seed, paths, config, true);
    }
}

// ------------------------------------------------------------ spraying (issue 19, step 3)

/// What one sprayed run did: the per-path stats, the requester's counters and its time.
struct Sprayed {
    stats: Vec<sim::LinkStats>,
    counters: crate::transport::QpCounters,
    time: Instant,
}

/// One RC QP with the multipath extension at both ends (spraying over `entropies`) writes
/// `n` messages of 3000 bytes over `paths`; A's own port takes path `a_path` (what an
/// unsprayed QP would use), B's (its ACKs) path `b_path`. Checks that every WR completes
/// once, in order, and every byte arrived.
fn sprayed(paths: Vec<Link>, (a_path, b_path): (usize, usize), entropies: u8, n: u64) -> Sprayed {
    let k = paths.len();
    let config = DeviceConfig {
        multipath: true,
        multipath_entropies: entropies,
        ..DeviceConfig::default()
    };
    let mut p = Pair::new(29, config, Link::default());
    p.set_paths(paths);
    let ports = (port_on(a_path, k, 0xc000), port_on(b_path, k, 0xd000));
    let (a, b) = connect_rc_ports(&mut p, &RcConfig::default(), ports);
    let src: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    let ma =
        p.a.reg_mr(a.pd, src.clone(), 0x1000, Access::LOCAL_WRITE)
            .unwrap();
    let len = usize::try_from(n).unwrap() * 3000;
    let mb =
        p.b.reg_mr(b.pd, vec![0; len], 0x10_0000, Access::all())
            .unwrap();
    let post = |p: &mut Pair, i: u64| {
        let sg = vec![Sge {
            addr: 0x1000,
            length: 3000,
            lkey: ma.lkey,
        }];
        let wr = SendWr::new(i, write(0x10_0000 + i * 3000, mb.rkey), sg);
        p.a.post_send(a.qpn, wr).unwrap();
    };
    // The first WRITE alone: its answer turns the extension on (in band), so the rest is
    // sprayed from its first packet (the simulator does not pace: posted together, they
    // would all leave plain before the answer came back).
    post(&mut p, 0);
    let mut done = Vec::new();
    assert!(p.drive_until(1_000_000, |p| {
        done.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)));
        !done.is_empty()
    }));
    for i in 1..n {
        post(&mut p, i);
    }
    assert!(
        p.drive_until(20_000_000, |p| {
            done.extend(core::iter::from_fn(|| p.a.poll_cq(a.cq)));
            done.len() as u64 == n
        }),
        "{} of {n} done: {:?}",
        done.len(),
        p.path_stats()
    );
    let got: Vec<(u64, WcStatus)> = done.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<(u64, WcStatus)> = (0..n).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(got, want, "once each, in order");
    let bytes = p.b.mrs().bytes(mb.lkey).unwrap();
    for i in 0..usize::try_from(n).unwrap() {
        assert_eq!(&bytes[i * 3000..(i + 1) * 3000], &src[..], "WRITE {i}");
    }
    assert_eq!(p.a.qp(a.qpn).unwrap().multipath(), MpState::On);
    Sprayed {
        stats: p.path_stats().to_vec(),
        counters: *p.a.qp(a.qpn).unwrap().counters(),
        time: p.time,
    }
}

/// One QP's requests spread over four equal paths: each carries a share, none most of it.
/// (Entropies are random, and the sender cannot know the fabric's hash: 8 of them leave one
/// of four paths unused about 40 % of the time, 32 of them almost never; this run takes 32.)
/// With one entropy the same QP keeps to its own path.
#[test]
fn spraying_spreads_one_qp_over_four_paths() {
    let clean = Link {
        latency: Duration::from_micros(10),
        ..Link::default()
    };
    let s = sprayed(vec![clean; 4], (0, 1), 32, 240);
    // Path 1 also carries B's ACKs: count A's request frames by what the other paths took.
    let total: u64 = s.stats.iter().map(|x| x.sent).sum();
    for (i, x) in s.stats.iter().enumerate() {
        assert!(
            x.sent * 10 >= total,
            "path {i} carried {} of {total}: {:?}",
            x.sent,
            s.stats
        );
        assert!(x.sent * 2 <= total, "path {i} carried most: {:?}", s.stats);
    }
    assert_eq!(
        s.counters.entropy_retired, 0,
        "nothing lost, nothing retired"
    );
    let one = sprayed(vec![clean; 4], (0, 1), 1, 240);
    assert_eq!(one.stats[2].sent + one.stats[3].sent, 0, "{:?}", one.stats);
}

/// One of four paths loses 10 %: the entropies that land on it are retired as their packets
/// are lost, so the QP's traffic moves to the three clean paths. Against the same QP kept on
/// the lossy path by one entropy, far fewer packets are lost and resent, and it finishes
/// sooner; every byte arrives either way.
#[test]
fn spraying_moves_off_a_lossy_path() {
    let clean = Link {
        latency: Duration::from_micros(10),
        ..Link::default()
    };
    let lossy = Link { loss: 0.1, ..clean };
    let paths = vec![lossy, clean, clean, clean];
    let s = sprayed(paths.clone(), (0, 1), 8, 240);
    let one = sprayed(paths, (0, 1), 1, 240);
    let total: u64 = s.stats.iter().map(|x| x.sent).sum();
    let share = s.stats[0].sent as f64 / total as f64;
    eprintln!(
        "sprayed: lossy path {:.1} % of frames, {} lost, {} resent, {} entropies retired, {:?}; \
         one entropy: {} lost, {} resent, {:?}",
        100.0 * share,
        s.stats[0].lost,
        s.counters.selective_retransmits,
        s.counters.entropy_retired,
        s.time,
        one.stats[0].lost,
        one.counters.selective_retransmits,
        one.time
    );
    assert!(
        share < 0.15,
        "the lossy path kept {:.1} %: {:?}",
        100.0 * share,
        s.stats
    );
    assert!(s.counters.entropy_retired > 0);
    assert!(
        s.counters.selective_retransmits * 3 < one.counters.selective_retransmits,
        "sprayed resent {}, one entropy {}",
        s.counters.selective_retransmits,
        one.counters.selective_retransmits
    );
    assert!(s.time < one.time, "{:?} vs {:?}", s.time, one.time);
}

/// One of four paths CE-marks every packet (a congested path that drops nothing): the
/// receiver's CNPs name the marked packets' entropies (path feedback), the sender retires
/// them, and the QP's traffic moves to the three unmarked paths while DCQCN cuts its rate.
#[test]
fn path_feedback_moves_a_sprayed_qp_off_a_marking_path() {
    let clean = Link {
        latency: Duration::from_micros(10),
        ..Link::default()
    };
    let marking = Link { ce: 1.0, ..clean };
    let s = sprayed(vec![marking, clean, clean, clean], (1, 2), 8, 240);
    let total: u64 = s.stats.iter().map(|x| x.sent).sum();
    let share = s.stats[0].sent as f64 / total as f64;
    eprintln!(
        "marking path {:.1} % of frames ({} marked), {} entropies retired, {:?}",
        100.0 * share,
        s.stats[0].ce_marked,
        s.counters.entropy_retired,
        s.stats
    );
    assert!(s.counters.entropy_retired > 0, "no feedback taken");
    assert!(share < 0.1, "the marking path kept {:.1} %", 100.0 * share);
}
