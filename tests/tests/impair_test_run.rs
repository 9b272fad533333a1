//! roce_impair under BPF_PROG_TEST_RUN (SchedClassifier with skb data): every action, with the
//! verdict, the bytes that come out and the exact counter deltas. Needs root.
//!
//! Frames with a valid ICRC and IPv4 header checksum come from `roce::wire::emit_frame` (the
//! ICRC is what corruption must break and CE marking must keep); the checks on the output are
//! done independently here (checksum sum, bit counting, byte comparison).

use std::{net::Ipv4Addr, thread, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, PerCpuArray},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use roce::{
    loader::IMPAIR_OBJECT,
    wire::{
        BthRepr, DethRepr, Ecn, EthernetAddress, IpPath, Opcode, PathRepr, Psn, QKey, Qpn,
        RoceRepr, emit_frame, parse_frame,
    },
};
use roce_common::{
    impair::{
        IMPAIR_MARK, ImpairConfig, ImpairStats, LimitState, MAP_IMPAIR_CONFIG, MAP_IMPAIR_LIMIT,
        MAP_IMPAIR_STATS, PROB_ONE, PROG_ROCE_IMPAIR,
    },
    mad::{CmAttr, MGMT_CLASS_CM},
};
use roce_tests::{Frame, require_root};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

struct Prog {
    ebpf: Ebpf,
}

impl Prog {
    fn new() -> Self {
        require_root();
        assert!(
            !IMPAIR_OBJECT.is_empty(),
            "roce-user was built with AYA_BUILD_SKIP=1: no roce_impair object to test"
        );
        let mut ebpf = EbpfLoader::new()
            .load(IMPAIR_OBJECT)
            .expect("load roce_impair");
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROG_ROCE_IMPAIR)
            .unwrap()
            .try_into()
            .unwrap();
        prog.load().expect("verifier accepts roce_impair");
        Self { ebpf }
    }

    fn set(&mut self, cfg: ImpairConfig) {
        let mut arr: Array<_, ImpairConfig> =
            Array::try_from(self.ebpf.map_mut(MAP_IMPAIR_CONFIG).unwrap()).unwrap();
        arr.set(0, cfg, 0).unwrap();
    }

    /// Zeroes the count under `ImpairConfig::limit`, as `roce impair` does with new settings.
    fn reset_limit(&mut self) {
        let mut arr: Array<_, LimitState> =
            Array::try_from(self.ebpf.map_mut(MAP_IMPAIR_LIMIT).unwrap()).unwrap();
        arr.set(0, LimitState::default(), 0).unwrap();
    }

    fn stats(&self) -> ImpairStats {
        let arr: PerCpuArray<_, ImpairStats> =
            PerCpuArray::try_from(self.ebpf.map(MAP_IMPAIR_STATS).unwrap()).unwrap();
        let mut t = ImpairStats::default();
        for s in arr.get(&0, 0).unwrap().iter() {
            t.add(s);
        }
        t
    }

    /// Runs the program on `frame`: verdict, the frame as it left, counter deltas.
    fn run(&self, frame: &[u8]) -> (u32, Vec<u8>, ImpairStats) {
        let before = self.stats();
        let prog: &SchedClassifier = self
            .ebpf
            .program(PROG_ROCE_IMPAIR)
            .unwrap()
            .try_into()
            .unwrap();
        let mut out = vec![0u8; 8192];
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out, self.stats().saturating_sub(&before))
    }
}

fn stats(names: &[(&str, u64)]) -> ImpairStats {
    let mut s = ImpairStats::default();
    for (n, v) in names {
        *s.get_mut(n).unwrap_or_else(|| panic!("no counter {n}")) += v;
    }
    s
}

/// The counters a RoCE packet of `len` bytes moves besides `more`.
fn roce(len: usize, more: &[(&str, u64)]) -> ImpairStats {
    let mut s = stats(more);
    s.seen += 1;
    s.seen_bytes += len as u64;
    s
}

fn path_v4(ecn: Ecn) -> PathRepr {
    let mut p = PathRepr::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
        IpPath::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        },
    );
    p.dscp = 26;
    p.ecn = ecn;
    p.ipv4_ident = 0x1234;
    p
}

/// A SEND ONLY with `payload` bytes and a valid ICRC and IPv4 checksum.
fn send(path: &PathRepr, psn: u32, payload: usize) -> Vec<u8> {
    let roce = RoceRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11),
        Psn::new(psn),
    ));
    let data: Vec<u8> = (0..payload).map(|i| (i * 7 + psn as usize) as u8).collect();
    let mut buf = vec![0u8; 9000];
    let n = emit_frame(path, &roce, &data, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// RFC 1071: the ones' complement sum of a valid IPv4 header is 0xffff.
fn ipv4_checksum_ok(hdr: &[u8]) -> bool {
    let mut sum = 0u32;
    for w in hdr.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

fn differing_bits(a: &[u8], b: &[u8]) -> Vec<(usize, u8)> {
    a.iter()
        .zip(b)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, x ^ y))
        .collect()
}

const ETH: usize = 14;
const BTH_END: usize = 14 + 20 + 8 + 12;

#[test]
fn non_roce_is_untouched_whatever_the_settings() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        drop: PROB_ONE,
        dup: PROB_ONE,
        reorder: PROB_ONE,
        corrupt: PROB_ONE,
        ce: PROB_ONE,
        ..ImpairConfig::default()
    });
    let d = Frame::default();
    let cases = [
        (
            "ARP",
            Frame {
                ether_type: Some(0x0806),
                ..d.clone()
            }
            .build(),
        ),
        (
            "UDP to port 53",
            Frame {
                dport: 53,
                ..d.clone()
            }
            .build(),
        ),
        (
            "TCP",
            Frame {
                proto: 6,
                ..d.clone()
            }
            .build(),
        ),
        (
            "IPv4 fragment",
            roce_tests::Frame {
                ip: roce_tests::Ip::V4 {
                    options: 0,
                    tos: 0,
                    frag: 0x2000,
                    ihl: None,
                },
                ..d.clone()
            }
            .build(),
        ),
        (
            "UDP 4791 too short for a BTH",
            Frame {
                udp_len: Some(8 + 12),
                ..d.clone()
            }
            .build(),
        ),
        (
            "IPv6 with a hop-by-hop header",
            Frame {
                ip: roce_tests::Ip::V6 {
                    tc: 0,
                    ext: vec![0],
                    frag: 0,
                },
                ..d
            }
            .build(),
        ),
    ];
    for (name, f) in cases {
        let (v, out, delta) = p.run(&f);
        assert_eq!(v, TC_ACT_OK, "{name}");
        assert_eq!(out, f, "{name}: bytes changed");
        assert_eq!(delta, stats(&[("not_roce", 1)]), "{name}");
    }
}

#[test]
fn probability_zero_passes_and_custom_port() {
    let mut p = Prog::new();
    p.set(ImpairConfig::default());
    let f = send(&path_v4(Ecn::Ect0), 1, 64);
    let (v, out, delta) = p.run(&f);
    assert_eq!((v, &out), (TC_ACT_OK, &f));
    assert_eq!(delta, roce(f.len(), &[("passed", 1)]));
    // Probability 0 for each action, 1000 times: nothing happens.
    for _ in 0..1000 {
        let (v, out, _) = p.run(&f);
        assert_eq!((v, &out), (TC_ACT_OK, &f));
    }
    // On another port, 4791 is not RoCE.
    p.set(ImpairConfig {
        port: 4792,
        drop: PROB_ONE,
        ..ImpairConfig::default()
    });
    let (v, _, delta) = p.run(&f);
    assert_eq!(v, TC_ACT_OK);
    assert_eq!(delta, stats(&[("not_roce", 1)]));
}

#[test]
fn drop_one_drops_and_half_drops_about_half() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        drop: PROB_ONE,
        ..ImpairConfig::default()
    });
    let f = send(&path_v4(Ecn::Ect0), 2, 100);
    let (v, _, delta) = p.run(&f);
    assert_eq!(v, TC_ACT_SHOT);
    assert_eq!(delta, roce(f.len(), &[("dropped", 1)]));
    p.set(ImpairConfig {
        drop: 1 << 31,
        ..ImpairConfig::default()
    });
    let before = p.stats();
    let n = 4000;
    let shot = (0..n).filter(|_| p.run(&f).0 == TC_ACT_SHOT).count();
    let d = p.stats().saturating_sub(&before);
    assert_eq!(d.dropped as usize, shot);
    assert_eq!(d.passed as usize, n - shot);
    // Binomial(4000, 0.5): sd 31.6; 6 sd either way.
    assert!((1810..=2190).contains(&shot), "{shot} of {n} dropped");
}

#[test]
fn ce_marks_ipv4_with_a_valid_checksum_and_icrc() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        ce: PROB_ONE,
        ..ImpairConfig::default()
    });
    for ecn in [Ecn::NotEct, Ecn::Ect0, Ecn::Ect1] {
        let f = send(&path_v4(ecn), 3, 200);
        assert!(ipv4_checksum_ok(&f[ETH..ETH + 20]));
        let (v, out, delta) = p.run(&f);
        assert_eq!(v, TC_ACT_OK);
        assert_eq!(delta, roce(f.len(), &[("ce_marked", 1), ("passed", 1)]));
        assert_eq!(out[ETH + 1], (26 << 2) | 3, "DSCP kept, ECN 11");
        assert!(
            ipv4_checksum_ok(&out[ETH..ETH + 20]),
            "bad IPv4 checksum after marking {ecn:?}"
        );
        // Only the TOS byte and the checksum changed.
        let diff: Vec<usize> = differing_bits(&f, &out).iter().map(|d| d.0).collect();
        assert!(
            diff.iter()
                .all(|&i| i == ETH + 1 || i == ETH + 10 || i == ETH + 11),
            "{diff:?}"
        );
        let parsed = parse_frame(&out).unwrap();
        assert_eq!(parsed.ecn(), Ecn::Ce);
        assert!(parsed.icrc_ok, "the ICRC masks the TOS byte");
    }
    // Already CE: bytes unchanged (still counted as marked).
    let f = send(&path_v4(Ecn::Ce), 3, 200);
    let (_, out, _) = p.run(&f);
    assert_eq!(out, f);
}

#[test]
fn ce_marks_ipv6_traffic_class() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        ce: PROB_ONE,
        ..ImpairConfig::default()
    });
    let mut path = path_v4(Ecn::Ect0);
    path.ip = IpPath::V6 {
        src: "fd00::1".parse().unwrap(),
        dst: "fd00::2".parse().unwrap(),
        flow_label: 0x12345,
    };
    let f = send(&path, 4, 64);
    let (v, out, delta) = p.run(&f);
    assert_eq!(v, TC_ACT_OK);
    assert_eq!(delta, roce(f.len(), &[("ce_marked", 1), ("passed", 1)]));
    let parsed = parse_frame(&out).unwrap();
    assert_eq!(parsed.ecn(), Ecn::Ce);
    assert_eq!(parsed.ip.dscp(), 26);
    assert!(parsed.icrc_ok);
    // ECT(0) is 10 in bits 5:4 of byte 1: only bit 4 changes.
    assert_eq!(differing_bits(&f, &out), vec![(ETH + 1, 0x10)]);
}

#[test]
fn corruption_flips_exactly_one_bit_after_the_bth() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        corrupt: PROB_ONE,
        ..ImpairConfig::default()
    });
    let f = send(&path_v4(Ecn::Ect0), 5, 256);
    let icrc = f.len() - 4;
    let mut offsets = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let (v, out, delta) = p.run(&f);
        assert_eq!(v, TC_ACT_OK);
        assert_eq!(delta, roce(f.len(), &[("corrupted", 1), ("passed", 1)]));
        let diff = differing_bits(&f, &out);
        assert_eq!(diff.len(), 1, "{diff:?}");
        let (off, x) = diff[0];
        assert_eq!(x.count_ones(), 1);
        assert!((BTH_END..icrc).contains(&off), "flipped byte {off}");
        offsets.insert(off);
        let parsed = parse_frame(&out).unwrap();
        assert!(!parsed.icrc_ok, "the ICRC must catch the flipped bit");
    }
    assert!(offsets.len() > 50, "bits are spread: {}", offsets.len());
    // A CNP has no payload but 16 reserved bytes: the flip lands there.
    let mut cnp = vec![0u8; 128];
    let n = emit_frame(
        &path_v4(Ecn::Ect0),
        &RoceRepr::cnp(Qpn::new(0x11)),
        &[],
        &mut cnp,
    )
    .unwrap();
    cnp.truncate(n);
    let (_, out, _) = p.run(&cnp);
    let diff = differing_bits(&cnp, &out);
    assert_eq!(diff.len(), 1);
    assert!((BTH_END..BTH_END + 16).contains(&diff[0].0));
}

#[test]
fn duplicate_sends_a_copy_and_the_original() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        dup: PROB_ONE,
        ..ImpairConfig::default()
    });
    let f = send(&path_v4(Ecn::Ect0), 6, 64);
    let (v, out, delta) = p.run(&f);
    assert_eq!((v, &out), (TC_ACT_OK, &f));
    // The copy went to the test skb's device (lo), where roce_impair is not attached.
    assert_eq!(delta, roce(f.len(), &[("duplicated", 1), ("passed", 1)]));
}

#[test]
fn copies_marked_by_impair_pass_untouched() {
    // BPF_PROG_TEST_RUN takes a `struct __sk_buff` as ctx_in, whose `mark` (offset 8) may be set.
    let mut p = Prog::new();
    p.set(ImpairConfig {
        drop: PROB_ONE,
        ce: PROB_ONE,
        ..ImpairConfig::default()
    });
    let f = send(&path_v4(Ecn::Ect0), 7, 64);
    let mut ctx = [0u8; 192];
    ctx[8..12].copy_from_slice(&IMPAIR_MARK.to_ne_bytes());
    let mut ctx_out = [0u8; 192];
    let mut out = vec![0u8; 4096];
    let before = p.stats();
    let prog: &SchedClassifier = p
        .ebpf
        .program(PROG_ROCE_IMPAIR)
        .unwrap()
        .try_into()
        .unwrap();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(&f),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN with a context");
    out.truncate(r.data_size_out as usize);
    assert_eq!(r.return_value, TC_ACT_OK, "a copy is never dropped");
    assert_eq!(out, f, "a copy is never changed");
    assert_eq!(
        p.stats().saturating_sub(&before),
        stats(&[("own_copies", 1)])
    );
    assert_eq!(&ctx_out[8..12], &[0; 4], "the mark is cleared");
}

fn pin_to_cpu0() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

#[test]
fn reorder_swaps_a_packet_with_the_next_one() {
    // The hold slot is per CPU: keep every run on one CPU.
    thread::spawn(|| {
        pin_to_cpu0();
        let mut p = Prog::new();
        p.set(ImpairConfig {
            reorder: PROB_ONE,
            ..ImpairConfig::default()
        });
        let path = path_v4(Ecn::Ect0);
        let (a, b, c) = (
            send(&path, 10, 64),
            send(&path, 11, 300),
            send(&path, 12, 16),
        );
        // A is held back.
        let (v, _, delta) = p.run(&a);
        assert_eq!(v, TC_ACT_SHOT);
        assert_eq!(delta, roce(a.len(), &[("reordered", 1)]));
        // B goes out first (as a copy, to lo), then the skb leaves as A, resized.
        let (v, out, delta) = p.run(&b);
        assert_eq!(v, TC_ACT_OK);
        assert_eq!(out, a, "the skb left as the held packet");
        assert_eq!(
            delta,
            roce(b.len(), &[("passed", 1), ("reorder_released", 1)])
        );
        // The slot is free again: C is held; with reordering off, B releases it.
        assert_eq!(p.run(&c).0, TC_ACT_SHOT);
        p.set(ImpairConfig::default());
        let (v, out, delta) = p.run(&b);
        assert_eq!(v, TC_ACT_OK);
        assert_eq!(out, c);
        assert_eq!(delta.reorder_released, 1);
        // Nothing held: plain pass.
        let (_, out, delta) = p.run(&b);
        assert_eq!(out, b);
        assert_eq!(delta, roce(b.len(), &[("passed", 1)]));
    })
    .join()
    .unwrap();
}

#[test]
fn bottleneck_drops_not_ect_packets_it_would_mark() {
    let mut p = Prog::new();
    let f = send(&path_v4(Ecn::NotEct), 21, 900);
    let len = f.len() as u64;
    let rate = 8_000_000;
    p.set(ImpairConfig {
        rate_bps: rate,
        ps_per_byte: ImpairConfig::ps_per_byte_at(rate),
        kmin_bytes: len / 2,
        kmax_bytes: len / 2 + 1,
        pmax: 0,
        max_backlog_bytes: 100 * len,
        ..ImpairConfig::default()
    });
    // The first packet finds an empty queue and passes; each later one finds ~L bytes (above
    // Kmax: RED picks it) and, being Not-ECT, is dropped rather than marked (RFC 3168 §5),
    // taking no room: the backlog stays at one packet.
    let (v, out, delta) = p.run(&f);
    assert_eq!((v, out[ETH + 1] & 3), (TC_ACT_OK, 0));
    assert_eq!(delta, roce(f.len(), &[("passed", 1)]));
    for i in 0..4 {
        let (v, _, delta) = p.run(&f);
        assert_eq!(v, TC_ACT_SHOT, "packet {i}");
        assert_eq!(delta, roce(f.len(), &[("bottleneck_early_dropped", 1)]));
    }
}

#[test]
fn bottleneck_marks_above_kmin_and_drops_past_the_buffer() {
    let mut p = Prog::new();
    let f = send(&path_v4(Ecn::Ect0), 20, 900);
    let len = f.len() as u64;
    // 32 kb/s: one byte per 250 µs, so the backlog drains by only a few bytes between runs,
    // and by less than half a packet even when a loaded machine stalls the test for 100 ms.
    let rate = 32_000;
    p.set(ImpairConfig {
        rate_bps: rate,
        ps_per_byte: ImpairConfig::ps_per_byte_at(rate),
        kmin_bytes: len,
        kmax_bytes: 2 * len,
        pmax: 0,
        max_backlog_bytes: 4 * len + len / 2,
        ..ImpairConfig::default()
    });
    // Backlog before each packet: 0, ~L, ~2L (at or below Kmax with Pmax 0: no mark), ~3L
    // (above Kmax: marked), ~4L (+L past the buffer: dropped), again dropped.
    let want = [
        (TC_ACT_OK, false),
        (TC_ACT_OK, false),
        (TC_ACT_OK, false),
        (TC_ACT_OK, true),
        (TC_ACT_SHOT, false),
        (TC_ACT_SHOT, false),
    ];
    for (i, (verdict, marked)) in want.into_iter().enumerate() {
        let (v, out, delta) = p.run(&f);
        assert_eq!(v, verdict, "packet {i}");
        if v == TC_ACT_OK {
            assert_eq!(out[ETH + 1] & 3 == 3, marked, "packet {i}");
            assert!(ipv4_checksum_ok(&out[ETH..ETH + 20]));
            let more: &[(&str, u64)] = if marked {
                &[("bottleneck_marked", 1), ("passed", 1)]
            } else {
                &[("passed", 1)]
            };
            assert_eq!(delta, roce(f.len(), more), "packet {i}");
        } else {
            assert_eq!(delta, roce(f.len(), &[("bottleneck_dropped", 1)]));
        }
    }
    // After the queue has drained (4 L bytes at 1 byte per 250 µs), a packet passes unmarked.
    thread::sleep(Duration::from_micros(250 * (4 * len) + 2000));
    let (v, out, _) = p.run(&f);
    assert_eq!((v, out[ETH + 1] & 3), (TC_ACT_OK, 2));
}

/// What the bytes that left must look like, given the bytes that came in.
type OutCheck = fn(&[u8], &[u8]) -> Result<(), String>;

struct Case {
    name: String,
    cfg: ImpairConfig,
    frame: Vec<u8>,
    verdict: u32,
    counters: Vec<(&'static str, u64)>,
    check: OutCheck,
}

fn unchanged(i: &[u8], o: &[u8]) -> Result<(), String> {
    if i == o {
        Ok(())
    } else {
        Err(format!("changed: {:?}", differing_bits(i, o)))
    }
}

fn ce_and_icrc_ok(_: &[u8], o: &[u8]) -> Result<(), String> {
    let f = parse_frame(o).map_err(|e| e.to_string())?;
    if f.ecn() != Ecn::Ce || !f.icrc_ok {
        return Err(format!("ecn {:?}, icrc_ok {}", f.ecn(), f.icrc_ok));
    }
    if let roce::wire::IpRepr::V4(_) = f.ip
        && !ipv4_checksum_ok(&o[ETH..ETH + 20])
    {
        return Err("bad IPv4 header checksum".into());
    }
    Ok(())
}

fn one_bit_and_bad_icrc(i: &[u8], o: &[u8]) -> Result<(), String> {
    let d = differing_bits(i, o);
    let f = parse_frame(o).map_err(|e| e.to_string())?;
    if d.len() != 1 || d[0].1.count_ones() != 1 || f.icrc_ok {
        return Err(format!("diff {d:?}, icrc_ok {}", f.icrc_ok));
    }
    Ok(())
}

#[test]
fn one_packet_per_action_table() {
    let mut p = Prog::new();
    let v6 = {
        let mut path = path_v4(Ecn::Ect0);
        path.ip = IpPath::V6 {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            flow_label: 7,
        };
        path
    };
    let one = |f: fn(&mut ImpairConfig)| {
        let mut c = ImpairConfig::default();
        f(&mut c);
        c
    };
    let mut cases = Vec::new();
    for (ip, path) in [("IPv4", path_v4(Ecn::Ect0)), ("IPv6", v6)] {
        let frame = send(&path, 40, 96);
        let mk = |name: &str, cfg, verdict, counters: &[(&'static str, u64)], check| Case {
            name: format!("{name} over {ip}"),
            cfg,
            frame: frame.clone(),
            verdict,
            counters: counters.to_vec(),
            check,
        };
        cases.extend([
            mk(
                "nothing",
                ImpairConfig::default(),
                TC_ACT_OK,
                &[("passed", 1)],
                unchanged as OutCheck,
            ),
            mk(
                "drop 1",
                one(|c| c.drop = PROB_ONE),
                TC_ACT_SHOT,
                &[("dropped", 1)],
                |_, _| Ok(()),
            ),
            mk(
                "ce 1",
                one(|c| c.ce = PROB_ONE),
                TC_ACT_OK,
                &[("ce_marked", 1), ("passed", 1)],
                ce_and_icrc_ok,
            ),
            mk(
                "corrupt 1",
                one(|c| c.corrupt = PROB_ONE),
                TC_ACT_OK,
                &[("corrupted", 1), ("passed", 1)],
                one_bit_and_bad_icrc,
            ),
            mk(
                "dup 1",
                one(|c| c.dup = PROB_ONE),
                TC_ACT_OK,
                &[("duplicated", 1), ("passed", 1)],
                unchanged,
            ),
            mk(
                "drop wins over everything after it",
                one(|c| {
                    c.drop = PROB_ONE;
                    c.ce = PROB_ONE;
                    c.dup = PROB_ONE;
                    c.corrupt = PROB_ONE;
                }),
                TC_ACT_SHOT,
                &[("dropped", 1)],
                |_, _| Ok(()),
            ),
            mk(
                "ce, corrupt and dup together",
                one(|c| {
                    c.ce = PROB_ONE;
                    c.dup = PROB_ONE;
                    c.corrupt = PROB_ONE;
                }),
                TC_ACT_OK,
                &[
                    ("ce_marked", 1),
                    ("corrupted", 1),
                    ("duplicated", 1),
                    ("passed", 1),
                ],
                |_, o| {
                    let f = parse_frame(o).map_err(|e| e.to_string())?;
                    (f.ecn() == Ecn::Ce && !f.icrc_ok)
                        .then_some(())
                        .ok_or_else(|| "want CE and a bad ICRC".to_owned())
                },
            ),
        ]);
    }
    let mut failures = Vec::new();
    for c in &cases {
        p.set(c.cfg);
        let (v, out, delta) = p.run(&c.frame);
        let want = roce(c.frame.len(), &c.counters);
        if v != c.verdict || delta != want {
            failures.push(format!(
                "{}: verdict {v} (want {}), delta {delta:?} (want {want:?})",
                c.name, c.verdict
            ));
        } else if v == TC_ACT_OK
            && let Err(e) = (c.check)(&c.frame, &out)
        {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A MAD as the CM sends one: base version 1, management class `class`, class version 2,
/// method SEND, attribute `attr`; `len` bytes (256 for a whole one).
fn mad(class: u8, attr: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[..4].copy_from_slice(&[1, class, 2, 3]);
    m[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m
}

/// A UD SEND_ONLY to `qpn` (QP 1: the GSI) carrying `payload`, as the CM sends MADs.
fn ud_send(opcode: Opcode, qpn: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = RoceRepr::new(BthRepr::new(opcode, Qpn::new(qpn), Psn::new(0)));
    if opcode == Opcode::UD_SEND_ONLY {
        r.deth = Some(DethRepr {
            qkey: QKey::GSI,
            src_qp: Qpn::GSI,
        });
    }
    let mut buf = vec![0u8; 2048];
    let n = emit_frame(&path_v4(Ecn::NotEct), &r, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// `--mad req --drop 1`: exactly the CM REQs are dropped; other CM messages, MADs of other
/// classes, truncated MADs, MADs to other QPs and non-MAD RoCE packets go on untouched and
/// are counted `unselected`.
#[test]
fn mad_selector_impairs_only_the_chosen_cm_message() {
    let mut p = Prog::new();
    p.set(ImpairConfig {
        drop: PROB_ONE,
        mad_attr: u32::from(CmAttr::Req.id()),
        ..ImpairConfig::default()
    });
    let req = ud_send(
        Opcode::UD_SEND_ONLY,
        1,
        &mad(MGMT_CLASS_CM, CmAttr::Req.id(), 256),
    );
    let (v, _, delta) = p.run(&req);
    assert_eq!(v, TC_ACT_SHOT, "the REQ is dropped");
    assert_eq!(delta, roce(req.len(), &[("dropped", 1)]));
    let others = [
        (
            "a REP",
            ud_send(
                Opcode::UD_SEND_ONLY,
                1,
                &mad(MGMT_CLASS_CM, CmAttr::Rep.id(), 256),
            ),
        ),
        (
            "every other CM message",
            ud_send(
                Opcode::UD_SEND_ONLY,
                1,
                &mad(MGMT_CLASS_CM, CmAttr::Rtu.id(), 256),
            ),
        ),
        (
            "a subnet management MAD with the REQ's attribute ID",
            ud_send(Opcode::UD_SEND_ONLY, 1, &mad(0x01, CmAttr::Req.id(), 256)),
        ),
        (
            "a truncated REQ",
            ud_send(
                Opcode::UD_SEND_ONLY,
                1,
                &mad(MGMT_CLASS_CM, CmAttr::Req.id(), 200),
            ),
        ),
        (
            "a REQ to QP 2",
            ud_send(
                Opcode::UD_SEND_ONLY,
                2,
                &mad(MGMT_CLASS_CM, CmAttr::Req.id(), 256),
            ),
        ),
        (
            "a REQ in an RC SEND to QP 1",
            ud_send(
                Opcode::RC_SEND_ONLY,
                1,
                &mad(MGMT_CLASS_CM, CmAttr::Req.id(), 256),
            ),
        ),
        ("an RC SEND", send(&path_v4(Ecn::Ect0), 9, 300)),
    ];
    for (name, f) in &others {
        let (v, out, delta) = p.run(f);
        assert_eq!((v, &out), (TC_ACT_OK, f), "{name}");
        assert_eq!(
            delta,
            roce(f.len(), &[("unselected", 1), ("passed", 1)]),
            "{name}"
        );
    }
    // Every CM message can be chosen by its attribute ID, from the shared table.
    for a in CmAttr::ALL {
        p.set(ImpairConfig {
            drop: PROB_ONE,
            mad_attr: u32::from(a.id()),
            ..ImpairConfig::default()
        });
        let f = ud_send(Opcode::UD_SEND_ONLY, 1, &mad(MGMT_CLASS_CM, a.id(), 256));
        assert_eq!(p.run(&f).0, TC_ACT_SHOT, "{}", a.name());
    }
}

/// `--limit 2`: the first two packets that draw an impairment get it, every later one goes on
/// untouched and is counted `over_limit`; new settings (the count zeroed) start it again. With
/// a selector only chosen packets use the limit up.
#[test]
fn limit_impairs_at_most_n_packets() {
    let mut p = Prog::new();
    p.reset_limit();
    p.set(ImpairConfig {
        drop: PROB_ONE,
        ce: PROB_ONE,
        limit: 2,
        ..ImpairConfig::default()
    });
    let f = send(&path_v4(Ecn::Ect0), 11, 64);
    for i in 0..2 {
        let (v, _, delta) = p.run(&f);
        assert_eq!(v, TC_ACT_SHOT, "packet {i}");
        assert_eq!(delta, roce(f.len(), &[("dropped", 1)]), "packet {i}");
    }
    for i in 2..5 {
        let (v, out, delta) = p.run(&f);
        assert_eq!(
            (v, &out),
            (TC_ACT_OK, &f),
            "packet {i} is untouched, not even CE"
        );
        assert_eq!(
            delta,
            roce(f.len(), &[("over_limit", 1), ("passed", 1)]),
            "packet {i}"
        );
    }
    // The limit with a selector: a REP between the REQs uses none of it.
    p.reset_limit();
    p.set(ImpairConfig {
        dup: PROB_ONE,
        mad_attr: u32::from(CmAttr::Req.id()),
        limit: 1,
        ..ImpairConfig::default()
    });
    let req = ud_send(
        Opcode::UD_SEND_ONLY,
        1,
        &mad(MGMT_CLASS_CM, CmAttr::Req.id(), 256),
    );
    let rep = ud_send(
        Opcode::UD_SEND_ONLY,
        1,
        &mad(MGMT_CLASS_CM, CmAttr::Rep.id(), 256),
    );
    let (_, _, d) = p.run(&rep);
    assert_eq!(d, roce(rep.len(), &[("unselected", 1), ("passed", 1)]));
    let (_, _, d) = p.run(&req);
    assert_eq!(d, roce(req.len(), &[("duplicated", 1), ("passed", 1)]));
    let (_, _, d) = p.run(&req);
    assert_eq!(d, roce(req.len(), &[("over_limit", 1), ("passed", 1)]));
}
