//! The aya-log records of roce_xdp and roce_impair, under BPF_PROG_TEST_RUN: each kind of dropped
//! frame with logging on gives exactly one record with its reason (the counter's name), its
//! addresses and the BTH's QPN, opcode and PSN; with logging off (the default) nothing comes out;
//! levels filter (a foreign-QP drop is info, a CE mark debug). The records are read with aya-log's
//! own reader, as `roce log` reads them, and split by `roce::loader::ebpf_log::LogRecord`.
//! Needs root.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
};
use aya_log::EbpfLogger;
use roce::loader::{EBPF_OBJECT, IMPAIR_OBJECT, ebpf_log::LogRecord};
use roce_common::{
    counters::{DropReason, XdpStats},
    impair::{ImpairConfig, ImpairStats, MAP_IMPAIR_CONFIG, PROB_ONE, PROG_ROCE_IMPAIR},
    log::{LOG_TARGET, LogLevel, MAP_LOG_LEVEL},
    maps::{GLOBAL_FLAGS, MAP_QPS, PROG_ROCE_XDP, QpEntry},
    opcode::Opcode,
};
use roce_tests::{Frame, Ip, require_root};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const OURS: u32 = 0x11;
const FOREIGN: u32 = 0x22;
const PSN: u32 = 0x00ab_cdef;

/// Collects the records aya-log hands over: (target, level, message).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(String, log::Level, String)>>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((r.target().to_owned(), r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

/// A loaded program with its level map and aya-log's reader of its records.
struct Logged {
    ebpf: Ebpf,
    reader: EbpfLogger<Capture>,
    records: Capture,
    prog: &'static str,
}

impl Logged {
    fn new(mut ebpf: Ebpf, prog: &'static str) -> Self {
        let records = Capture::default();
        let reader = EbpfLogger::init_with_logger(&mut ebpf, records.clone())
            .expect("the program has aya-log's ring buffer");
        Self {
            ebpf,
            reader,
            records,
            prog,
        }
    }

    fn set_level(&mut self, level: LogLevel) {
        let mut m: Array<_, u32> =
            Array::try_from(self.ebpf.map_mut(MAP_LOG_LEVEL).expect("ROCE_LOG_LEVEL")).unwrap();
        m.set(0, level.code(), 0).unwrap();
    }

    /// Runs the program on `frame`: its verdict and the records it wrote, split.
    fn run(&mut self, frame: &[u8]) -> (u32, Vec<LogRecord>) {
        let mut out = vec![0u8; frame.len() + 8192];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        let program = self.ebpf.program(self.prog).unwrap();
        let r = if self.prog == PROG_ROCE_XDP {
            let p: &Xdp = program.try_into().unwrap();
            p.test_run(opts)
        } else {
            let p: &SchedClassifier = program.try_into().unwrap();
            p.test_run(opts)
        }
        .expect("BPF_PROG_TEST_RUN");
        self.reader.flush();
        let raw = std::mem::take(&mut *self.records.0.lock().unwrap());
        let records = raw
            .iter()
            .map(|(target, level, msg)| {
                assert_eq!(target, LOG_TARGET, "{msg}");
                LogRecord::parse(*level, msg)
                    .unwrap_or_else(|| panic!("record not in roce's form: {msg:?}"))
            })
            .collect();
        (r.return_value, records)
    }
}

fn roce_xdp() -> Logged {
    require_root();
    assert!(
        !EBPF_OBJECT.is_empty(),
        "roce-user was built with AYA_BUILD_SKIP=1: no eBPF object to test"
    );
    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_FLAGS, &roce::loader::xdp_flags(true), true)
        .load(EBPF_OBJECT)
        .expect("load roce_xdp");
    let prog: &mut Xdp = ebpf.program_mut(PROG_ROCE_XDP).unwrap().try_into().unwrap();
    prog.load()
        .expect("verifier accepts roce_xdp with its log records");
    let mut qps: Array<_, QpEntry> = Array::try_from(ebpf.map_mut(MAP_QPS).unwrap()).unwrap();
    qps.set(OURS, QpEntry { owner: 1, flags: 0 }, 0).unwrap();
    Logged::new(ebpf, PROG_ROCE_XDP)
}

/// One frame roce_xdp drops or falls back on, and the record it must give.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    action: u32,
    level: LogLevel,
    event: &'static str,
    reason: &'static str,
    v6: bool,
    /// (QPN, opcode, PSN) when the frame holds a whole BTH.
    bth: Option<(u32, Opcode, u32)>,
}

fn drop_case(name: &'static str, f: &Frame, reason: DropReason) -> Case {
    Case {
        name,
        frame: f.build(),
        action: XDP_DROP,
        level: LogLevel::Warn,
        event: "drop",
        reason: reason.counter_name(),
        v6: matches!(f.ip, Ip::V6 { .. }),
        bth: Some((f.dest_qp, f.opcode, f.psn)),
    }
}

fn cases() -> Vec<Case> {
    let d = Frame {
        psn: PSN,
        ..Frame::default()
    };
    // A frame cut in the middle of its BTH, its UDP length saying so: no BTH fields to log.
    let cut = {
        let mut f = Frame {
            udp_len: Some(8 + 6),
            ..d.clone()
        }
        .build();
        f.truncate(d.udp_offset() + 8 + 6);
        let ip_len = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&ip_len.to_be_bytes());
        f
    };
    vec![
        drop_case(
            "UDP length past the frame",
            &Frame {
                udp_len: Some(1000),
                ..d.clone()
            },
            DropReason::UdpLength,
        ),
        drop_case(
            "UDP payload too short for a BTH and ICRC",
            &Frame {
                udp_len: Some(8 + 12),
                ..d.clone()
            },
            DropReason::BthTruncated,
        ),
        Case {
            name: "frame cut inside the BTH",
            frame: cut,
            bth: None,
            ..drop_case("", &d, DropReason::BthTruncated)
        },
        drop_case(
            "BTH TVer 1",
            &Frame {
                tver: 1,
                ..d.clone()
            },
            DropReason::BadTver,
        ),
        drop_case(
            "BTH TVer 1 over IPv6",
            &Frame {
                tver: 1,
                ip: Ip::V6 {
                    tc: 0,
                    ext: vec![],
                    frag: 0,
                },
                ..d.clone()
            },
            DropReason::BadTver,
        ),
        drop_case(
            "reserved opcode 0x15",
            &Frame {
                opcode: Opcode(0x15),
                ..d.clone()
            },
            DropReason::UnknownOpcode,
        ),
        drop_case(
            "pad count beyond the payload",
            &Frame {
                payload: 0,
                pad: Some(3),
                opcode: Opcode::RC_RDMA_READ_REQUEST,
                udp_len: Some(8 + 12 + 16 + 4),
                ..d.clone()
            },
            DropReason::HdrTruncated,
        ),
        drop_case(
            "destination QP 0",
            &Frame {
                dest_qp: 0,
                ..d.clone()
            },
            DropReason::ReservedQpn,
        ),
        drop_case(
            "UDP payload not whole words",
            &Frame {
                payload: 30,
                pad: Some(0),
                ..d.clone()
            },
            DropReason::BadLength,
        ),
        drop_case(
            "an ACK with bytes after its AETH",
            &Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                payload: 4,
                ..d.clone()
            },
            DropReason::UnexpectedPayload,
        ),
        Case {
            name: "RDMA WRITE for a foreign QP (--drop-foreign)",
            level: LogLevel::Info,
            reason: XdpStats::drop_foreign_qp,
            ..drop_case(
                "",
                &Frame {
                    dest_qp: FOREIGN,
                    opcode: Opcode::RC_RDMA_WRITE_ONLY,
                    ..d.clone()
                },
                DropReason::BadTver,
            )
        },
        Case {
            name: "SEND for our QP on a queue no AF_XDP socket serves",
            action: XDP_PASS,
            event: "fallback",
            reason: XdpStats::redirect_fallback_pass,
            ..drop_case("", &d, DropReason::BadTver)
        },
    ]
}

fn check_record(c: &Case, r: &LogRecord) {
    let (src, dst): (IpAddr, IpAddr) = if c.v6 {
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
    } else {
        ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
    };
    let want = LogRecord {
        program: PROG_ROCE_XDP.to_owned(),
        level: c.level.as_str().to_owned(),
        event: c.event.to_owned(),
        reason: c.reason.to_owned(),
        src: Some(src),
        dst: Some(dst),
        sport: Some(0xc000),
        qpn: c.bth.map(|b| b.0),
        opcode: c.bth.map(|b| b.1.0),
        psn: c.bth.map(|b| b.2),
    };
    assert_eq!(r, &want, "{}", c.name);
}

#[test]
fn every_drop_logs_its_reason_qpn_opcode_and_psn() {
    let mut prog = roce_xdp();
    prog.set_level(LogLevel::Info);
    let cases = cases();
    let covered: BTreeSet<_> = cases.iter().map(|c| c.reason).collect();
    for r in DropReason::ALL {
        assert!(
            covered.contains(r.counter_name()),
            "no case for {r:?}: every drop reason must be tested"
        );
    }
    for c in &cases {
        let (action, records) = prog.run(&c.frame);
        assert_eq!(action, c.action, "{}", c.name);
        assert_eq!(records.len(), 1, "{}: {records:?}", c.name);
        check_record(c, &records[0]);
    }
    // Frames that are redirected or passed are never logged.
    for f in [
        Frame {
            dport: 53,
            ..Frame::default()
        },
        Frame {
            dest_qp: FOREIGN,
            dport: 4792,
            ..Frame::default()
        },
    ] {
        let (action, records) = prog.run(&f.build());
        assert_eq!(action, XDP_PASS);
        assert!(records.is_empty(), "{records:?}");
    }
}

#[test]
fn nothing_is_logged_when_off_and_levels_filter() {
    let mut prog = roce_xdp();
    // Off is the default: a fresh map holds 0.
    for c in &cases() {
        let (action, records) = prog.run(&c.frame);
        assert_eq!(action, c.action, "{}", c.name);
        assert!(
            records.is_empty(),
            "{} logged while off: {records:?}",
            c.name
        );
    }
    // Warn: the malformed drops and the fallback, not the foreign-QP drop (info).
    prog.set_level(LogLevel::Warn);
    for c in &cases() {
        let (_, records) = prog.run(&c.frame);
        let want = usize::from(c.level <= LogLevel::Warn);
        assert_eq!(records.len(), want, "{} at warn: {records:?}", c.name);
    }
    // And off again: switched at run time, no reload.
    prog.set_level(LogLevel::Off);
    for c in &cases() {
        let (_, records) = prog.run(&c.frame);
        assert!(
            records.is_empty(),
            "{} logged after off: {records:?}",
            c.name
        );
    }
}

fn roce_impair() -> Logged {
    require_root();
    assert!(!IMPAIR_OBJECT.is_empty(), "no roce_impair object to test");
    let mut ebpf = EbpfLoader::new()
        .load(IMPAIR_OBJECT)
        .expect("load roce_impair");
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_ROCE_IMPAIR)
        .unwrap()
        .try_into()
        .unwrap();
    prog.load()
        .expect("verifier accepts roce_impair with its log records");
    Logged::new(ebpf, PROG_ROCE_IMPAIR)
}

#[test]
fn roce_impair_logs_what_it_did_to_a_frame() {
    let mut prog = roce_impair();
    let f = Frame {
        psn: PSN,
        opcode: Opcode::RC_RDMA_WRITE_FIRST,
        ..Frame::default()
    };
    let frame = f.build();
    let set = |prog: &mut Logged, cfg: ImpairConfig| {
        let mut arr: Array<_, ImpairConfig> =
            Array::try_from(prog.ebpf.map_mut(MAP_IMPAIR_CONFIG).unwrap()).unwrap();
        arr.set(0, cfg, 0).unwrap();
    };
    let want = |level: LogLevel, reason: &str| LogRecord {
        program: PROG_ROCE_IMPAIR.to_owned(),
        level: level.as_str().to_owned(),
        event: "impair".to_owned(),
        reason: reason.to_owned(),
        src: Some("10.0.0.1".parse().unwrap()),
        dst: Some("10.0.0.2".parse().unwrap()),
        sport: Some(0xc000),
        qpn: Some(f.dest_qp),
        opcode: Some(f.opcode.0),
        psn: Some(PSN),
    };

    set(
        &mut prog,
        ImpairConfig {
            drop: PROB_ONE,
            ..ImpairConfig::default()
        },
    );
    let (action, records) = prog.run(&frame);
    assert_eq!(action, TC_ACT_SHOT);
    assert!(records.is_empty(), "logged while off: {records:?}");
    prog.set_level(LogLevel::Info);
    let (action, records) = prog.run(&frame);
    assert_eq!(action, TC_ACT_SHOT);
    assert_eq!(records, [want(LogLevel::Info, ImpairStats::dropped)]);

    // CE marks are debug: not at info, one record at debug.
    set(
        &mut prog,
        ImpairConfig {
            ce: PROB_ONE,
            ..ImpairConfig::default()
        },
    );
    let (action, records) = prog.run(&frame);
    assert_eq!(action, TC_ACT_OK);
    assert!(records.is_empty(), "CE mark logged at info: {records:?}");
    prog.set_level(LogLevel::Debug);
    let (_, records) = prog.run(&frame);
    assert_eq!(records, [want(LogLevel::Debug, ImpairStats::ce_marked)]);

    // Several actions on one frame: one record each, in the order they were done.
    set(
        &mut prog,
        ImpairConfig {
            corrupt: PROB_ONE,
            ce: PROB_ONE,
            ..ImpairConfig::default()
        },
    );
    let (_, records) = prog.run(&frame);
    assert_eq!(
        records,
        [
            want(LogLevel::Info, ImpairStats::corrupted),
            want(LogLevel::Debug, ImpairStats::ce_marked)
        ]
    );
    // A frame that is not RoCE is never logged.
    let (_, records) = prog.run(
        &Frame {
            dport: 53,
            ..f.clone()
        }
        .build(),
    );
    assert!(records.is_empty(), "{records:?}");
}
