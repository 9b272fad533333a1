//! roce_xdp under BPF_PROG_TEST_RUN: a table of frames, each with the action it must get and the
//! exact counter deltas it must cause (every other counter must stay still). Needs root.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, PerCpuArray},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use roce::loader::EBPF_OBJECT;
use roce_common::{
    counters::XdpStats,
    maps::{
        FLAG_DROP_FOREIGN, GLOBAL_FLAGS, GLOBAL_UDP_PORT, MAP_QPS, MAP_XDP_STATS, PROG_ROCE_XDP,
        QP_FLAG_TIME_RESPONSES, QpEntry,
    },
    opcode::Opcode,
    stamp,
};
use roce_tests::{Frame, Ip, require_root};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const OURS: u32 = 0x11;
const FOREIGN: u32 = 0x22;

struct Prog {
    ebpf: Ebpf,
}

impl Prog {
    fn new(port: u32, flags: u32) -> Self {
        require_root();
        assert!(
            !EBPF_OBJECT.is_empty(),
            "roce-user was built with AYA_BUILD_SKIP=1: no eBPF object to test"
        );
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_UDP_PORT, &port, true)
            .override_global(
                GLOBAL_FLAGS,
                &(flags | roce::loader::xdp_flags(false)),
                true,
            )
            .load(EBPF_OBJECT)
            .expect("load roce_xdp");
        let prog: &mut Xdp = ebpf.program_mut(PROG_ROCE_XDP).unwrap().try_into().unwrap();
        prog.load().expect("verifier accepts roce_xdp");
        let mut qps: Array<_, QpEntry> = Array::try_from(ebpf.map_mut(MAP_QPS).unwrap()).unwrap();
        qps.set(OURS, QpEntry { owner: 1, flags: 0 }, 0).unwrap();
        Self { ebpf }
    }

    /// Sets the `ROCE_QPS` entry flags of our QP (`QP_FLAG_*`).
    fn set_qp_flags(&mut self, flags: u32) {
        let mut qps: Array<_, QpEntry> =
            Array::try_from(self.ebpf.map_mut(MAP_QPS).unwrap()).unwrap();
        qps.set(OURS, QpEntry { owner: 1, flags }, 0).unwrap();
    }

    fn stats(&self) -> XdpStats {
        let arr: PerCpuArray<_, XdpStats> =
            PerCpuArray::try_from(self.ebpf.map(MAP_XDP_STATS).unwrap()).unwrap();
        roce::loader::sum_per_cpu(&arr.get(&0, 0).unwrap())
    }

    fn run(&self, frame: &[u8]) -> (u32, XdpStats) {
        let before = self.stats();
        let prog: &Xdp = self
            .ebpf
            .program(PROG_ROCE_XDP)
            .unwrap()
            .try_into()
            .unwrap();
        let mut out = vec![0u8; frame.len() + 512];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        let r = prog.test_run(opts).expect("BPF_PROG_TEST_RUN");
        (r.return_value, self.stats().saturating_sub(&before))
    }

    /// Runs the program on `frame` and returns its action and the output the kernel gives
    /// back: from `data_meta` to `data_end`, so any metadata the program wrote comes first.
    fn run_out(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        let prog: &Xdp = self
            .ebpf
            .program(PROG_ROCE_XDP)
            .unwrap()
            .try_into()
            .unwrap();
        let mut out = vec![0u8; frame.len() + 512];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        let r = prog.test_run(opts).expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }
}

/// The counters a frame must move: rx_packets and rx_bytes always, `roce` for roce_packets
/// and roce_bytes, and each named counter by one.
fn expect(names: &[&str], frame_len: usize) -> XdpStats {
    let len = frame_len as u64;
    let mut s = XdpStats {
        rx_packets: 1,
        rx_bytes: len,
        ..XdpStats::default()
    };
    for n in names {
        if *n == "roce" {
            s.roce_packets += 1;
            s.roce_bytes += len;
        } else {
            *s.get_mut(n).unwrap_or_else(|| panic!("no counter {n}")) += 1;
        }
    }
    s
}

struct Case {
    name: String,
    frame: Vec<u8>,
    action: u32,
    counters: Vec<&'static str>,
}

fn case(name: &str, f: &Frame, action: u32, counters: &[&'static str]) -> Case {
    Case {
        name: name.to_owned(),
        frame: f.build(),
        action,
        counters: counters.to_vec(),
    }
}

fn check(prog: &Prog, cases: &[Case]) {
    let mut failures = Vec::new();
    for c in cases {
        let (action, delta) = prog.run(&c.frame);
        let want = expect(&c.counters, c.frame.len());
        if action != c.action || delta != want {
            failures.push(format!(
                "{}: action {action} (want {}), delta {:?} (want {:?})",
                c.name,
                c.action,
                nonzero(&delta),
                nonzero(&want)
            ));
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

fn nonzero(s: &XdpStats) -> Vec<(&'static str, u64)> {
    XdpStats::NAMES
        .iter()
        .copied()
        .zip(s.values())
        .filter(|(_, v)| *v != 0)
        .collect()
}

const OUR_ROCE: &[&str] = &["roce", "redirect_fallback_pass"];

fn v6(ext: &[u8]) -> Ip {
    Ip::V6 {
        tc: 0,
        ext: ext.to_vec(),
        frag: 0,
    }
}

fn v4_opts(options: usize) -> Ip {
    Ip::V4 {
        options,
        tos: 0,
        frag: 0x4000,
        ihl: None,
    }
}

#[test]
fn every_opcode_of_the_table_is_roce() {
    let prog = Prog::new(4791, 0);
    let mut cases = Vec::new();
    for &op in Opcode::ALL {
        let payload = if op.info().unwrap().payload { 64 } else { 0 };
        let f = Frame {
            opcode: op,
            payload,
            ..Frame::default()
        };
        let mut counters = OUR_ROCE.to_vec();
        if op == Opcode::CNP {
            counters.push("cnp");
        }
        cases.push(case(&format!("{op:?} over IPv4"), &f, XDP_PASS, &counters));
        let f6 = Frame { ip: v6(&[]), ..f };
        cases.push(case(&format!("{op:?} over IPv6"), &f6, XDP_PASS, &counters));
    }
    assert!(cases.len() >= 80);
    check(&prog, &cases);
}

#[test]
fn classification_table() {
    let prog = Prog::new(4791, 0);
    let d = Frame::default();
    let arp = Frame {
        ether_type: Some(0x0806),
        ..d.clone()
    };
    let cases = vec![
        case("non-IP (ARP)", &arp, XDP_PASS, &["pass_not_roce"]),
        case(
            "UDP to another port",
            &Frame {
                dport: 53,
                ..d.clone()
            },
            XDP_PASS,
            &["pass_not_roce"],
        ),
        case(
            "TCP to port 4791",
            &Frame {
                proto: 6,
                ..d.clone()
            },
            XDP_PASS,
            &["pass_not_roce"],
        ),
        case("RC SEND_ONLY for our QP", &d, XDP_PASS, OUR_ROCE),
        case(
            "one 802.1Q tag",
            &Frame {
                vlans: vec![0x8100],
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "802.1ad + 802.1Q tags",
            &Frame {
                vlans: vec![0x88a8, 0x8100],
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "three tags: past the bound",
            &Frame {
                vlans: vec![0x88a8, 0x8100, 0x8100],
                ..d.clone()
            },
            XDP_PASS,
            &["pass_not_roce"],
        ),
        case(
            "IPv4 with 4 bytes of options",
            &Frame {
                ip: v4_opts(4),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv4 with 40 bytes of options",
            &Frame {
                ip: v4_opts(40),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv4 IHL 4 (invalid)",
            &Frame {
                ip: Ip::V4 {
                    options: 0,
                    tos: 0,
                    frag: 0,
                    ihl: Some(4),
                },
                ..d.clone()
            },
            XDP_PASS,
            &["pass_not_roce"],
        ),
        case(
            "IPv4 first fragment (MF)",
            &Frame {
                ip: Ip::V4 {
                    options: 0,
                    tos: 0,
                    frag: 0x2000,
                    ihl: None,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["pass_fragment"],
        ),
        case(
            "IPv4 later fragment",
            &Frame {
                ip: Ip::V4 {
                    options: 0,
                    tos: 0,
                    frag: 0x0010,
                    ihl: None,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["pass_fragment"],
        ),
        case(
            "IPv4 CE mark",
            &Frame {
                ip: Ip::V4 {
                    options: 0,
                    tos: 0x03,
                    frag: 0x4000,
                    ihl: None,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["roce", "redirect_fallback_pass", "ecn_ce"],
        ),
        case(
            "IPv4 ECT(0) is not CE",
            &Frame {
                ip: Ip::V4 {
                    options: 0,
                    tos: 0x02,
                    frag: 0x4000,
                    ihl: None,
                },
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6",
            &Frame {
                ip: v6(&[]),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6 CE mark",
            &Frame {
                ip: Ip::V6 {
                    tc: 0x03,
                    ext: vec![],
                    frag: 0,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["roce", "redirect_fallback_pass", "ecn_ce"],
        ),
        case(
            "IPv6 hop-by-hop + destination options",
            &Frame {
                ip: v6(&[0, 60]),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6 routing + AH",
            &Frame {
                ip: v6(&[43, 51]),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6 four extension headers",
            &Frame {
                ip: v6(&[0, 43, 60, 60]),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6 five extension headers: past the bound",
            &Frame {
                ip: v6(&[0, 43, 60, 60, 60]),
                ..d.clone()
            },
            XDP_PASS,
            &["pass_not_roce"],
        ),
        case(
            "IPv6 atomic fragment",
            &Frame {
                ip: v6(&[44]),
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "IPv6 first fragment (M)",
            &Frame {
                ip: Ip::V6 {
                    tc: 0,
                    ext: vec![44],
                    frag: 1,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["pass_fragment"],
        ),
        case(
            "IPv6 later fragment",
            &Frame {
                ip: Ip::V6 {
                    tc: 0,
                    ext: vec![44],
                    frag: 0x100,
                },
                ..d.clone()
            },
            XDP_PASS,
            &["pass_fragment"],
        ),
        case(
            "foreign QP",
            &Frame {
                dest_qp: FOREIGN,
                ..d.clone()
            },
            XDP_PASS,
            &["roce", "pass_foreign_qp"],
        ),
        case(
            "CNP for our QP",
            &Frame {
                opcode: Opcode::CNP,
                payload: 0,
                ..d.clone()
            },
            XDP_PASS,
            &["roce", "redirect_fallback_pass", "cnp"],
        ),
        case(
            "CNP for a foreign QP",
            &Frame {
                opcode: Opcode::CNP,
                payload: 0,
                dest_qp: FOREIGN,
                ..d.clone()
            },
            XDP_PASS,
            &["roce", "pass_foreign_qp", "cnp"],
        ),
        case(
            "BTH TVer 1",
            &Frame {
                tver: 1,
                ..d.clone()
            },
            XDP_DROP,
            &["drop_bad_tver"],
        ),
        case(
            "reserved opcode 0x15",
            &Frame {
                opcode: Opcode(0x15),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_unknown_opcode"],
        ),
        case(
            "RD opcode 0x40",
            &Frame {
                opcode: Opcode(0x40),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_unknown_opcode"],
        ),
        case(
            "destination QP 0",
            &Frame {
                dest_qp: 0,
                ..d.clone()
            },
            XDP_DROP,
            &["drop_reserved_qpn"],
        ),
        case(
            "UDP length 7",
            &Frame {
                udp_len: Some(7),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_udp_length"],
        ),
        case(
            "UDP length past the frame",
            &Frame {
                udp_len: Some(1000),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_udp_length"],
        ),
        case(
            "an ACK with bytes after its AETH",
            &Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                payload: 4,
                ..d.clone()
            },
            XDP_DROP,
            &["drop_unexpected_payload"],
        ),
        // The multipath extension (docs/multipath.md): an ACK may carry exactly its SACK
        // trailer when it says so; not without the mark, not a trailer of another length.
        case(
            "an ACK with a multipath SACK trailer",
            &Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                resv7: roce_common::multipath::RESV7_OFFER | roce_common::multipath::RESV7_TRAILER,
                payload: roce_common::multipath::SACK_TRAILER_LEN,
                ..d.clone()
            },
            XDP_PASS,
            OUR_ROCE,
        ),
        case(
            "an ACK with 12 payload bytes but no trailer mark",
            &Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                resv7: roce_common::multipath::RESV7_OFFER,
                payload: roce_common::multipath::SACK_TRAILER_LEN,
                ..d.clone()
            },
            XDP_DROP,
            &["drop_unexpected_payload"],
        ),
        case(
            "an ACK marked with a trailer of the wrong length",
            &Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                resv7: roce_common::multipath::RESV7_TRAILER,
                payload: 16,
                ..d.clone()
            },
            XDP_DROP,
            &["drop_unexpected_payload"],
        ),
        case(
            "UDP payload not whole words",
            &Frame {
                payload: 30,
                pad: Some(0),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_bad_length"],
        ),
        case(
            "pad count beyond the payload",
            &Frame {
                payload: 0,
                pad: Some(3),
                opcode: Opcode::RC_RDMA_READ_REQUEST,
                udp_len: Some(8 + 12 + 16 + 4),
                ..d.clone()
            },
            XDP_DROP,
            &["drop_hdr_truncated"],
        ),
    ];
    assert!(cases.len() >= 25);
    check(&prog, &cases);
}

/// Cuts a frame at every byte from the Ethernet header to the end of the extended headers, both
/// as a short frame (the UDP length then claims more than there is) and with lengths rewritten
/// to match (a short but consistent datagram).
#[test]
fn truncation_at_every_header_boundary() {
    let prog = Prog::new(4791, 0);
    for base in [
        Frame {
            opcode: Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            payload: 0,
            ..Frame::default()
        },
        Frame {
            opcode: Opcode::RC_ATOMIC_ACKNOWLEDGE,
            payload: 0,
            vlans: vec![0x8100],
            ip: v6(&[0]),
            ..Frame::default()
        },
    ] {
        let full = base.build();
        let udp = base.udp_offset();
        let ext = base.opcode.ext_len().unwrap();
        let mut cases = Vec::new();
        for cut in 14..full.len() {
            let frame = full[..cut].to_vec();
            let counters: &[&str] = if cut < udp + 8 {
                &["pass_not_roce"]
            } else {
                &["drop_udp_length"]
            };
            let action = if cut < udp + 8 { XDP_PASS } else { XDP_DROP };
            cases.push(Case {
                name: format!("{:?} cut at {cut}", base.opcode),
                frame,
                action,
                counters: counters.to_vec(),
            });
        }
        // Consistent lengths: the datagram itself is short.
        for roce_len in 0..(12 + ext + 4) {
            let f = Frame {
                udp_len: Some((8 + roce_len) as u16),
                ..base.clone()
            };
            let mut frame = f.build();
            frame.truncate(udp + 8 + roce_len);
            let counters: &[&str] = if roce_len < 16 {
                &["drop_bth_truncated"]
            } else {
                &["drop_hdr_truncated"]
            };
            cases.push(Case {
                name: format!("{:?} UDP payload {roce_len}", base.opcode),
                frame,
                action: XDP_DROP,
                counters: counters.to_vec(),
            });
        }
        check(&prog, &cases);
    }
}

#[test]
fn foreign_qps_dropped_when_configured() {
    let prog = Prog::new(4791, FLAG_DROP_FOREIGN);
    let d = Frame::default();
    check(
        &prog,
        &[
            case(
                "foreign QP, --drop-foreign",
                &Frame {
                    dest_qp: FOREIGN,
                    ..d.clone()
                },
                XDP_DROP,
                &["roce", "drop_foreign_qp"],
            ),
            case("our QP, --drop-foreign", &d, XDP_PASS, OUR_ROCE),
            case(
                "not RoCE, --drop-foreign",
                &Frame { dport: 53, ..d },
                XDP_PASS,
                &["pass_not_roce"],
            ),
        ],
    );
}

#[test]
fn udp_port_is_a_load_time_global() {
    let prog = Prog::new(4792, 0);
    let d = Frame::default();
    check(
        &prog,
        &[
            case(
                "4791 when the port is 4792",
                &d,
                XDP_PASS,
                &["pass_not_roce"],
            ),
            case(
                "4792 when the port is 4792",
                &Frame { dport: 4792, ..d },
                XDP_PASS,
                OUR_ROCE,
            ),
        ],
    );
}

/// Issue 20: a frame roce_xdp redirects carries its arrival time (`bpf_ktime_get_ns`,
/// CLOCK_MONOTONIC) in `STAMP_LEN` bytes of XDP metadata right in front of it
/// (`roce_common::stamp`). BPF_PROG_TEST_RUN's output starts at `data_meta`, so for our QP it
/// is the stamp followed by the unchanged frame; the redirect itself falls back to the kernel
/// here (no socket in ROCE_XSKS), after the stamp was written. The clock is read for the
/// frames whose arrival the transport uses (a CE-marked request; a response to a QP whose
/// congestion control samples RTTs, `QP_FLAG_TIME_RESPONSES`); an unmarked request, or a
/// response to another QP, gets `stamp::UNTIMED`. Frames the program passes or drops get no
/// metadata.
///
/// Where the kernel refuses XDP programs `bpf_xdp_adjust_meta` (a hardened 6.18 build), the
/// test checks the fallback instead: the object stamping into metadata is refused for that
/// helper, and the program as the loader loads it there (the stamp written over the frame's
/// destination address, `FLAG_STAMP_IN_PLACE`) hands a frame whose redirect fell back to the
/// kernel exactly as it came, with no metadata and its own destination address back, timed
/// or not. (The stamp on its way to a socket is
/// `xsk_guards::received_frames_carry_their_arrival_stamp`.)
#[test]
fn redirected_frames_carry_an_arrival_stamp_in_metadata() {
    let mut prog = Prog::new(4791, FLAG_DROP_FOREIGN);
    let frame = Frame::default().build();
    let ack = Frame {
        opcode: Opcode::RC_ACKNOWLEDGE,
        payload: 0,
        ..Frame::default()
    }
    .build();
    let ce = Frame {
        ip: Ip::V4 {
            options: 0,
            tos: 0x3,
            frag: 0x4000,
            ihl: None,
        },
        ..Frame::default()
    }
    .build();
    let mode = roce::loader::stamp_mode();
    if mode != roce::loader::StampMode::Metadata {
        eprintln!("this kernel refuses bpf_xdp_adjust_meta: checking roce_xdp's {mode:?} mode");
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_FLAGS, &FLAG_DROP_FOREIGN, true)
            .load(EBPF_OBJECT)
            .expect("object");
        let stamping: &mut Xdp = ebpf.program_mut(PROG_ROCE_XDP).unwrap().try_into().unwrap();
        let refused = stamping
            .load()
            .expect_err("the kernel refuses the stamp as it refused the probe");
        assert!(
            format!("{refused:?}").contains("bpf_xdp_adjust_meta"),
            "{refused:?}"
        );
        // The ACK timed (a Swift QP), so that the clock's path restores the address too.
        prog.set_qp_flags(QP_FLAG_TIME_RESPONSES);
        for (name, f) in [
            ("an ACK", &ack),
            ("a CE-marked SEND", &ce),
            ("an unmarked SEND", &frame),
        ] {
            let (action, out) = prog.run_out(f);
            assert_eq!(
                action, XDP_PASS,
                "{name}: redirect without a socket falls back"
            );
            assert_eq!(&out, f, "{name}: no metadata, its own destination address");
        }
        assert_eq!(prog.stats().redirect_fallback_pass, 3);
        return;
    }
    // A response is timed only for a QP whose congestion control samples RTTs (Swift); a
    // CE-marked packet for every QP.
    for (name, f, qp_flags, timed) in [
        ("an ACK to a DCQCN QP", &ack, 0, false),
        ("an ACK to a Swift QP", &ack, QP_FLAG_TIME_RESPONSES, true),
        ("a CE-marked SEND", &ce, 0, true),
        (
            "an unmarked SEND to a Swift QP",
            &frame,
            QP_FLAG_TIME_RESPONSES,
            false,
        ),
    ] {
        prog.set_qp_flags(qp_flags);
        for _ in 0..3 {
            let before = roce::xsk::monotonic_ns();
            let (action, out) = prog.run_out(f);
            let after = roce::xsk::monotonic_ns();
            assert_eq!(
                action, XDP_PASS,
                "{name}: redirect without a socket falls back"
            );
            assert_eq!(
                out.len(),
                f.len() + stamp::STAMP_LEN,
                "{name}: metadata in front"
            );
            assert_eq!(
                &out[stamp::STAMP_LEN..],
                &f[..],
                "{name}: the frame is unchanged"
            );
            let word = u64::from_ne_bytes(out[..stamp::STAMP_LEN].try_into().unwrap());
            assert_eq!(word >> stamp::STAMP_BITS, u64::from(stamp::STAMP_MAGIC));
            if !timed {
                assert_eq!(word, stamp::UNTIMED, "{name}: no clock read");
                continue;
            }
            let at = stamp::decode(word, after).expect("a valid stamp");
            assert!(
                before <= at && at <= after,
                "{name}: stamp {at} outside the run [{before}, {after}]"
            );
        }
    }
    let foreign = Frame {
        dest_qp: FOREIGN,
        ..Frame::default()
    }
    .build();
    let not_roce = Frame {
        dport: 53,
        ..Frame::default()
    }
    .build();
    for (name, f, action) in [
        ("foreign QP, dropped", &foreign, XDP_DROP),
        ("not RoCE, passed", &not_roce, XDP_PASS),
    ] {
        let (a, out) = prog.run_out(f);
        assert_eq!(a, action, "{name}");
        assert_eq!(&out, f, "{name}: no metadata");
    }
}
