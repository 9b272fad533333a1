//! Hostile packets against a running endpoint (issue #9): the verbs API runs in this process on
//! end B of a veth pair, with XDP and AF_XDP engines like any application; end A holds a raw
//! socket that sends crafted frames (built with the wire emitter, so the ICRC is right and the
//! frames reach the transport) and captures what B answers. A `roce perf write` server on A is
//! the peer of a legitimate QP of B that WRITEs and READs back verified data throughout.
//!
//! Each case gets the answer `/work/shared/reference/roce-v2.md` (rxe's responder) prescribes,
//! a specific NAK code or a counted silent drop, and every registered region keeps its canary
//! bytes ([`roce::api::Device::mr_guard_violations`]) and its contents outside what valid
//! requests wrote. Root.

use std::{
    net::{IpAddr, TcpStream},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use roce::{
    api::{
        Access, Device, DeviceOptions, Mtu, QpCap, QpInit, QpState, QpType, Qpn, RKey, RcConnect,
        RecvWr, SendOp, SendWr, Sge, WcStatus,
    },
    cm::perftest::{BwReport, Comm, KeyMsg, pattern},
    loader::Pins,
    netinfo::Gid,
    netns::{self, VethOptions, VethPair},
    transport::{
        PKey, PktHdr,
        pkt::{Aeth, AtomicEth, Reth},
    },
    wire::{EthernetAddress, IpPath, Opcode, PathRepr, emit_frame, parse_frame, types::Psn},
};
use roce_common::counters::{QpCounters, XdpStats};
use roce_tests::{RawPort, require_root, roce_bin, tag};

/// The first PSN the attacker (posing as each victim QP's peer) sends.
const RQ_PSN: u32 = 0x10_0000;
/// Each victim QP's first PSN.
const SQ_PSN: u32 = 0x20_0000;
const MR_LEN: usize = 4096;
const NAK_PSN: u8 = 0x60;
const NAK_INV: u8 = 0x61;
const NAK_ACC: u8 = 0x62;

/// Kills a child process on drop, so a failing test leaves no endpoint running.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Builds one attack packet for a victim QP.
type MakePkt = Box<dyn Fn(Qpn) -> (PktHdr, Vec<u8>)>;

/// Removes what a test left attached (pins of a killed or panicked endpoint) on drop.
struct Unpin(Vec<String>);

impl Drop for Unpin {
    fn drop(&mut self) {
        for i in &self.0 {
            let _ = roce::loader::unload(i);
        }
    }
}

/// What B answered to one attack.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Silent,
    Ack(u32),
    Nak(u8, u32),
    ReadResp { psn: u32, len: usize },
    Other(String),
}

struct Attacker {
    port: RawPort,
    /// How many times the last [`Attacker::exchange`] sent its frames.
    tries: u64,
    /// Path of frames from A to B.
    path: PathRepr,
}

impl Attacker {
    fn frame(&self, path: &PathRepr, h: &PktHdr, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; 9000];
        let n = emit_frame(path, &h.to_repr(), payload, &mut buf).expect("emit");
        buf.truncate(n);
        buf
    }

    /// Sends `frames` and returns what B sent to `peer`, as [`Attacker::exchange_once`]; when
    /// nothing came back, sends them again, up to 3 times in all ([`Attacker::tries`] says how
    /// many), so that a frame lost on the way (a busy AF_XDP fill ring drops frames, as any
    /// NIC may) is not taken for a silent drop. Counters of silent cases move once per try.
    fn exchange(&mut self, frames: &[Vec<u8>], peer: Qpn) -> Vec<Answer> {
        for t in 1..=3 {
            self.tries = t;
            let got = self.exchange_once(frames, peer);
            if !got.is_empty() || t == 3 {
                return got;
            }
        }
        unreachable!()
    }

    fn exchange_once(&mut self, frames: &[Vec<u8>], peer: Qpn) -> Vec<Answer> {
        for f in frames {
            self.port.send(f).expect("raw send");
        }
        let start = Instant::now();
        let mut first: Option<Instant> = None;
        let mut out = Vec::new();
        loop {
            let got = self
                .port
                .recv(Duration::from_millis(100))
                .expect("raw recv");
            let before = out.len();
            out.extend(got.iter().filter_map(|g| answer(g, peer)));
            if out.len() > before && first.is_none() {
                first = Some(Instant::now());
            }
            match first {
                Some(t) if t.elapsed() >= Duration::from_millis(200) => return out,
                None if start.elapsed() >= Duration::from_millis(800) => return out,
                _ => {}
            }
        }
    }
}

/// What frame `g` says, if it is a RoCE frame B sent to `peer`.
fn answer(g: &[u8], peer: Qpn) -> Option<Answer> {
    let f = parse_frame(g).ok()?;
    let h = PktHdr::from_repr(&f.roce);
    if h.dest_qp != peer {
        return None;
    }
    let len = f.payload.len();
    let syn = h.aeth.map_or(0, |a| a.syndrome);
    Some(match h.opcode {
        Opcode::RC_ACKNOWLEDGE if syn & 0xe0 == 0 => Answer::Ack(h.psn.value()),
        Opcode::RC_ACKNOWLEDGE if syn & 0xe0 == 0x60 => Answer::Nak(syn, h.psn.value()),
        Opcode::RC_RDMA_READ_RESPONSE_ONLY => Answer::ReadResp {
            psn: h.psn.value(),
            len,
        },
        _ => Answer::Other(format!(
            "{:?} psn {:#x} syndrome {syn:#x}",
            h.opcode,
            h.psn.value()
        )),
    })
}

fn answers_or_silent(a: Vec<Answer>) -> Vec<Answer> {
    if a.is_empty() {
        vec![Answer::Silent]
    } else {
        a
    }
}

/// The regions of B the attacks aim at, in one PD.
#[derive(Clone, Copy)]
struct Regions {
    /// Every right; valid WRITEs land in its first 256 bytes only.
    target: roce::api::MrInfo,
    /// Remote read only.
    ro: roce::api::MrInfo,
    /// Local only.
    lo: roce::api::MrInfo,
    /// Receive buffers.
    rx: roce::api::MrInfo,
}

const FILL_TARGET: u8 = 0x11;
const FILL_RO: u8 = 0x22;
const FILL_LO: u8 = 0x33;

#[test]
fn hostile_frames_get_the_prescribed_answer_and_touch_nothing() {
    require_root();
    let t = tag("ho");
    let pair = VethPair::new(
        &t,
        &VethOptions {
            subnet: 91,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let _unpin = Unpin(vec![a.ifname.clone(), b.ifname.clone()]);
    // The legitimate peer: a perftest-style WRITE server on A (roce_xdp on A; frames for QPs
    // that are not its own pass to the kernel, where the raw socket sees them).
    let server = Reaper(Some(
        Command::new(roce_bin())
            .args([
                "-j", "--netns", &a.netns, "perf", "write", "-s", "4096", "-p", "18720", "-d",
                &a.ifname,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn roce perf server"),
    ));
    thread::sleep(Duration::from_millis(700));
    let port = RawPort::open(&a.netns, &a.ifname).expect("raw port on A");
    let mut atk = Attacker {
        port,
        tries: 0,
        path: PathRepr::new(
            EthernetAddress(a.mac),
            EthernetAddress(b.mac),
            IpPath::V4 {
                src: a.ipv4,
                dst: b.ipv4,
            },
        ),
    };
    let b_if = b.ifname.clone();
    let a_ip = a.ipv4;
    let report =
        netns::in_netns(&b.netns, move || run(&b_if, a_ip, &mut atk)).expect("enter namespace B");
    let server_out = server_finish(server);
    let (failures, log) = report;
    eprintln!("{log}");
    assert!(server_out.0, "perf server on A failed: {}", server_out.1);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn server_finish(mut r: Reaper) -> (bool, String) {
    let c = r.0.take().expect("server");
    let o = c.wait_with_output().expect("wait server");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The whole attack, inside namespace B. Returns (failures, log).
#[allow(clippy::too_many_lines)]
fn run(b_if: &str, a_ip: std::net::Ipv4Addr, atk: &mut Attacker) -> (Vec<String>, String) {
    let mut fails = Vec::new();
    let mut log = String::new();
    let dev = Arc::new(Device::open(b_if, &DeviceOptions::default()).expect("open B"));
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(4096).expect("cq");
    let gidx = dev.info().default_gid_index(true);
    let a_gid = Gid::of(IpAddr::V4(a_ip)).raw;
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let regions = Regions {
        target: dev.reg_mr(pd, MR_LEN, all).expect("mr"),
        ro: dev.reg_mr(pd, MR_LEN, Access::REMOTE_READ).expect("mr"),
        lo: dev.reg_mr(pd, MR_LEN, Access::LOCAL_WRITE).expect("mr"),
        rx: dev.reg_mr(pd, MR_LEN, Access::LOCAL_WRITE).expect("mr"),
    };
    for (m, v) in [
        (regions.target, FILL_TARGET),
        (regions.ro, FILL_RO),
        (regions.lo, FILL_LO),
        (regions.rx, 0),
    ] {
        dev.mr_write(m.lkey, 0, &vec![v; MR_LEN]).expect("fill");
    }

    // The legitimate flow: WRITE a pattern to the server, READ it back, compare, until told to
    // stop. It pauses when asked, so attacks accounted in XDP counters see no other traffic.
    let legit = legit_connect(&dev, pd, cq, gidx);
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let legit_thread = {
        let (dev, stop, pause, paused, rounds) = (
            dev.clone(),
            stop.clone(),
            pause.clone(),
            paused.clone(),
            rounds.clone(),
        );
        thread::spawn(move || legit_loop(&dev, cq, legit, &stop, &pause, &paused, &rounds))
    };
    let quiet = |on: bool| {
        pause.store(on, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while on && !paused.load(Ordering::SeqCst) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if on {
            thread::sleep(Duration::from_millis(50));
        }
    };

    let mut next_peer = 0x00_7000u32;
    let mut victim = |dev: &Device| -> (Qpn, Qpn) {
        next_peer += 1;
        let peer = Qpn::new(next_peer);
        (
            victim_qp(dev, pd, cq, gidx, &a_gid, peer, &regions.rx),
            peer,
        )
    };
    let qc = |dev: &Device, qpn: Qpn| -> QpCounters {
        dev.counters()
            .1
            .into_iter()
            .find(|(q, _)| *q == qpn)
            .map(|(_, c)| c)
            .unwrap_or_default()
    };
    let tgt = regions.target;
    let write = |qpn: Qpn, psn: u32, va: u64, rkey: RKey, len: u32, payload: usize| {
        let mut h = PktHdr::new(Opcode::RC_RDMA_WRITE_ONLY, qpn, Psn::new(psn));
        h.ack_req = true;
        h.reth = Some(Reth { va, rkey, len });
        (h, vec![0xee; payload])
    };
    let read = |qpn: Qpn, psn: u32, va: u64, rkey: RKey, len: u32| {
        let mut h = PktHdr::new(Opcode::RC_RDMA_READ_REQUEST, qpn, Psn::new(psn));
        h.ack_req = true;
        h.reth = Some(Reth { va, rkey, len });
        (h, Vec::new())
    };
    let check = |what: &str,
                 got: Vec<Answer>,
                 want: &[Answer],
                 fails: &mut Vec<String>,
                 log: &mut String| {
        let got = answers_or_silent(got);
        log.push_str(&format!("{what}: {got:?}\n"));
        if got != want {
            fails.push(format!("{what}: got {got:?}, want {want:?}"));
        }
    };
    // A silent case's frames are sent up to 3 times (`Attacker::exchange`), so its counter
    // moves once per try that reached the endpoint: between 1 and `atk.tries`.
    let expect_counter = |what: &str,
                          name: &str,
                          delta: u64,
                          want: std::ops::RangeInclusive<u64>,
                          fails: &mut Vec<String>| {
        if !want.contains(&delta) {
            fails.push(format!(
                "{what}: counter {name} moved by {delta}, want {want:?}"
            ));
        }
    };
    let state_is = |dev: &Device, qpn: Qpn, want: QpState, what: &str, fails: &mut Vec<String>| {
        let s = dev.qp_state(qpn);
        if s != Some(want) {
            fails.push(format!("{what}: QP state {s:?}, want {want:?}"));
        }
    };
    let pkt = |atk: &Attacker, (h, p): (PktHdr, Vec<u8>)| atk.frame(&atk.path, &h, &p);

    // 1. A valid WRITE works (the baseline), then a wrong P_Key is dropped and counted.
    let (q, peer) = victim(&dev);
    let got = atk.exchange(
        &[pkt(atk, write(q, RQ_PSN, tgt.iova, tgt.rkey, 64, 64))],
        peer,
    );
    check(
        "valid WRITE",
        got,
        &[Answer::Ack(RQ_PSN)],
        &mut fails,
        &mut log,
    );
    let d0 = dev.counters().0;
    let (mut h, p) = write(q, RQ_PSN + 1, tgt.iova + 64, tgt.rkey, 64, 64);
    h.pkey = PKey::new(0x7123);
    let got = atk.exchange(&[atk.frame(&atk.path, &h, &p)], peer);
    check("wrong P_Key", got, &[Answer::Silent], &mut fails, &mut log);
    let d1 = dev.counters().0;
    expect_counter(
        "wrong P_Key",
        "bad_pkey_cntr",
        d1.bad_pkey_cntr - d0.bad_pkey_cntr,
        1..=atk.tries,
        &mut fails,
    );

    // 2. A connected QP addressed from the wrong source address: dropped, counted.
    let c0 = qc(&dev, q);
    let mut spoof = atk.path;
    spoof.ip = IpPath::V4 {
        src: std::net::Ipv4Addr::new(a_ip.octets()[0], a_ip.octets()[1], a_ip.octets()[2], 99),
        dst: match atk.path.ip {
            IpPath::V4 { dst, .. } => dst,
            IpPath::V6 { .. } => unreachable!(),
        },
    };
    let (h, p) = write(q, RQ_PSN + 1, tgt.iova + 64, tgt.rkey, 64, 64);
    let got = atk.exchange(&[atk.frame(&spoof, &h, &p)], peer);
    check(
        "wrong source address",
        got,
        &[Answer::Silent],
        &mut fails,
        &mut log,
    );
    let c1 = qc(&dev, q);
    expect_counter(
        "wrong source address",
        "rx_dropped",
        c1.rx_dropped - c0.rx_dropped,
        1..=atk.tries,
        &mut fails,
    );
    // An RC QP addressed as if from another QP: a UD SEND whose DETH names some source QP.
    // The opcode's transport is not the QP's (rxe_recv.c), so it is dropped and counted.
    let c0 = qc(&dev, q);
    let mut h = PktHdr::new(Opcode::UD_SEND_ONLY, q, Psn::new(RQ_PSN + 1));
    h.deth = Some(roce::transport::pkt::Deth {
        qkey: roce::wire::QKey::new(0x8001_0000),
        src_qp: Qpn::new(0x1234),
    });
    let got = atk.exchange(&[atk.frame(&atk.path, &h, &[0xee; 64])], peer);
    check(
        "UD SEND from another QP to an RC QP",
        got,
        &[Answer::Silent],
        &mut fails,
        &mut log,
    );
    let c1 = qc(&dev, q);
    expect_counter(
        "UD SEND from another QP to an RC QP",
        "rx_dropped",
        c1.rx_dropped - c0.rx_dropped,
        1..=atk.tries,
        &mut fails,
    );

    // 3. PSNs far ahead: one NAK sequence error carrying the expected PSN, then silence; far
    // behind: a duplicate, re-ACKed with the last PSN done (C9-105), nothing written.
    let c0 = qc(&dev, q);
    let far = [
        pkt(
            atk,
            write(q, RQ_PSN + 1 + 0x40_0000, tgt.iova + 512, tgt.rkey, 64, 64),
        ),
        pkt(
            atk,
            write(q, RQ_PSN + 1 + 0x40_0001, tgt.iova + 512, tgt.rkey, 64, 64),
        ),
    ];
    let got = atk.exchange(&far, peer);
    check(
        "PSN far ahead (twice)",
        got,
        &[Answer::Nak(NAK_PSN, RQ_PSN + 1)],
        &mut fails,
        &mut log,
    );
    let got = atk.exchange(
        &[pkt(
            atk,
            write(
                q,
                (RQ_PSN + 0x100_0000 - 0x40_0000) & 0xff_ffff,
                tgt.iova + 512,
                tgt.rkey,
                64,
                64,
            ),
        )],
        peer,
    );
    check(
        "PSN far behind",
        got,
        &[Answer::Ack(RQ_PSN)],
        &mut fails,
        &mut log,
    );
    let c1 = qc(&dev, q);
    // Counted per packet (mlx5 out_of_sequence semantics; rxe counts only the NAKed one),
    // NAKed once per gap.
    expect_counter(
        "PSN far ahead",
        "out_of_sequence",
        c1.out_of_sequence - c0.out_of_sequence,
        2..=2,
        &mut fails,
    );
    expect_counter(
        "PSN far behind",
        "duplicate_request",
        c1.duplicate_request - c0.duplicate_request,
        1..=1,
        &mut fails,
    );
    // The QP still serves its peer in sequence.
    let got = atk.exchange(
        &[pkt(
            atk,
            write(q, RQ_PSN + 1, tgt.iova + 64, tgt.rkey, 64, 64),
        )],
        peer,
    );
    check(
        "in-sequence WRITE after the attacks",
        got,
        &[Answer::Ack(RQ_PSN + 1)],
        &mut fails,
        &mut log,
    );

    // 4. Zero-length operations: a WRITE of 0 bytes needs no valid R_Key (rxe check_rkey), a
    // READ of 0 bytes is answered by an empty READ response.
    let got = atk.exchange(
        &[pkt(atk, write(q, RQ_PSN + 2, 0, RKey::new(0x1234), 0, 0))],
        peer,
    );
    check(
        "zero-length WRITE",
        got,
        &[Answer::Ack(RQ_PSN + 2)],
        &mut fails,
        &mut log,
    );
    let got = atk.exchange(
        &[pkt(atk, read(q, RQ_PSN + 3, tgt.iova, tgt.rkey, 0))],
        peer,
    );
    check(
        "zero-length READ",
        got,
        &[Answer::ReadResp {
            psn: RQ_PSN + 3,
            len: 0,
        }],
        &mut fails,
        &mut log,
    );

    // 5. ACKs for PSNs this QP never sent: dropped, counted, the QP stays up.
    let c0 = qc(&dev, q);
    let mut h = PktHdr::new(Opcode::RC_ACKNOWLEDGE, q, Psn::new(SQ_PSN + 50));
    h.aeth = Some(Aeth {
        syndrome: 0x1f,
        msn: roce::wire::Msn::new(9),
    });
    let got = atk.exchange(&[atk.frame(&atk.path, &h, &[])], peer);
    check(
        "ACK for a PSN never sent",
        got,
        &[Answer::Silent],
        &mut fails,
        &mut log,
    );
    let c1 = qc(&dev, q);
    expect_counter(
        "ACK for a PSN never sent",
        "rx_dropped",
        c1.rx_dropped - c0.rx_dropped,
        1..=atk.tries,
        &mut fails,
    );
    state_is(
        &dev,
        q,
        QpState::Rts,
        "ACK for a PSN never sent",
        &mut fails,
    );

    // 6. A flood of CNPs: counted by XDP and by the reaction point, never answered.
    quiet(true);
    let x0 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    let cc0: u64 = dev
        .cc_snapshots()
        .iter()
        .filter(|(qq, _)| *qq == q)
        .map(|(_, s)| s.stats.rp_cnp_handled + s.stats.rp_cnp_ignored)
        .sum();
    let cnp_frame = {
        let mut buf = vec![0; 200];
        let n = emit_frame(&atk.path, &roce::wire::RoceRepr::cnp(q), &[], &mut buf).expect("cnp");
        buf.truncate(n);
        buf
    };
    const CNPS: u64 = 500;
    let flood: Vec<Vec<u8>> = (0..CNPS).map(|_| cnp_frame.clone()).collect();
    let got = atk.exchange(&flood, peer);
    check("CNP flood", got, &[Answer::Silent], &mut fails, &mut log);
    let x1 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    let cc1: u64 = dev
        .cc_snapshots()
        .iter()
        .filter(|(qq, _)| *qq == q)
        .map(|(_, s)| s.stats.rp_cnp_handled + s.stats.rp_cnp_ignored)
        .sum();
    expect_counter(
        "CNP flood",
        "xdp cnp",
        x1.cnp - x0.cnp,
        CNPS * atk.tries..=CNPS * atk.tries,
        &mut fails,
    );
    expect_counter(
        "CNP flood",
        "rp_cnp_handled + rp_cnp_ignored",
        cc1 - cc0,
        CNPS * atk.tries * 9 / 10..=CNPS * atk.tries,
        &mut fails,
    );
    state_is(&dev, q, QpState::Rts, "CNP flood", &mut fails);

    // 7. An unknown QPN: not ours, so roce_xdp passes it to the kernel (counted), no answer.
    let x0 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    let got = atk.exchange(
        &[pkt(
            atk,
            write(Qpn::new(0x00ff_fff0), RQ_PSN, tgt.iova, tgt.rkey, 64, 64),
        )],
        Qpn::new(0x00ff_fff0),
    );
    check("unknown QPN", got, &[Answer::Silent], &mut fails, &mut log);
    let x1 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    expect_counter(
        "unknown QPN",
        "xdp pass_foreign_qp",
        x1.pass_foreign_qp - x0.pass_foreign_qp,
        1..=atk.tries,
        &mut fails,
    );

    // 8. Headers truncated at every byte boundary of a valid WRITE: never reach a QP.
    let whole = pkt(atk, write(q, RQ_PSN + 4, tgt.iova + 128, tgt.rkey, 64, 64));
    let cuts: Vec<Vec<u8>> = (14..whole.len()).map(|n| whole[..n].to_vec()).collect();
    let x0 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    let d0 = dev.counters().0;
    let got = atk.exchange(&cuts, peer);
    check(
        "truncated frames",
        got,
        &[Answer::Silent],
        &mut fails,
        &mut log,
    );
    let x1 = Pins::new(b_if).xdp_stats().expect("xdp stats");
    let d1 = dev.counters().0;
    let dx = x1.saturating_sub(&x0);
    let not_delivered: u64 = XdpStats::NAMES
        .iter()
        .filter(|n| n.starts_with("drop_") || n.starts_with("pass_"))
        .map(|n| dx.get(n).unwrap_or(0))
        .sum();
    let delivered_malformed = d1.rx_malformed - d0.rx_malformed;
    log.push_str(&format!(
        "truncated: {} frames; xdp dropped/passed {not_delivered}, redirected {} (engine counted {delivered_malformed} malformed)\n",
        cuts.len(),
        dx.redirected
    ));
    if not_delivered + delivered_malformed < cuts.len() as u64 * atk.tries
        || dx.redirected != delivered_malformed
    {
        fails.push(format!(
            "truncated: {} frames, xdp dropped/passed {not_delivered}, redirected {}, engine malformed {delivered_malformed}: {dx:?}",
            cuts.len(),
            dx.redirected
        ));
    }
    quiet(false);
    // The same WRITE, whole, still works after all of that.
    let got = atk.exchange(&[whole], peer);
    check(
        "whole WRITE after truncations",
        got,
        &[Answer::Ack(RQ_PSN + 4)],
        &mut fails,
        &mut log,
    );

    // 9. Fatal responder errors (class C: NAK, then the QP goes to ERR), each on a fresh QP.
    let ro = regions.ro;
    let lo = regions.lo;
    let fatal: Vec<(&str, MakePkt, u8, &str)> = vec![
        (
            "READ with a bad R_Key",
            Box::new(move |q| {
                read(
                    q,
                    RQ_PSN,
                    tgt.iova,
                    RKey::new(tgt.rkey.value() ^ 0x5a5a),
                    16,
                )
            }),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "READ with the local-only region's key",
            Box::new(move |q| read(q, RQ_PSN, lo.iova, lo.rkey, 16)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "READ with VA past the region",
            Box::new(move |q| read(q, RQ_PSN, tgt.iova + MR_LEN as u64, tgt.rkey, 16)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "READ with VA + length wrapping",
            Box::new(move |q| read(q, RQ_PSN, u64::MAX - 15, tgt.rkey, 64)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "WRITE with VA + length wrapping",
            Box::new(move |q| write(q, RQ_PSN, u64::MAX - 15, tgt.rkey, 64, 64)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "WRITE past the region's end",
            Box::new(move |q| write(q, RQ_PSN, tgt.iova + MR_LEN as u64 - 32, tgt.rkey, 64, 64)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "WRITE into a region without remote write",
            Box::new(move |q| write(q, RQ_PSN, ro.iova, ro.rkey, 64, 64)),
            NAK_ACC,
            "resp_remote_access_errors",
        ),
        (
            "misaligned atomic",
            Box::new(move |q| {
                let mut h = PktHdr::new(Opcode::RC_FETCH_ADD, q, Psn::new(RQ_PSN));
                h.atomic = Some(AtomicEth {
                    va: tgt.iova + 4,
                    rkey: tgt.rkey,
                    swap_add: 1,
                    compare: 0,
                });
                (h, Vec::new())
            }),
            NAK_INV,
            "resp_invalid_request",
        ),
        (
            "payload larger than the path MTU",
            Box::new(move |q| write(q, RQ_PSN, tgt.iova, tgt.rkey, 1028, 1028)),
            NAK_INV,
            "resp_invalid_request",
        ),
        (
            "WRITE MIDDLE without a FIRST",
            Box::new(move |q| {
                let mut h = PktHdr::new(Opcode::RC_RDMA_WRITE_MIDDLE, q, Psn::new(RQ_PSN));
                h.ack_req = true;
                (h, vec![0xee; 1024])
            }),
            NAK_INV,
            "resp_invalid_request",
        ),
        (
            "SEND LAST without a FIRST",
            Box::new(move |q| {
                let mut h = PktHdr::new(Opcode::RC_SEND_LAST, q, Psn::new(RQ_PSN));
                h.ack_req = true;
                (h, vec![0xee; 64])
            }),
            NAK_INV,
            "resp_invalid_request",
        ),
    ];
    for (what, make, code, counter) in &fatal {
        let (q, peer) = victim(&dev);
        let c0 = qc(&dev, q);
        let got = atk.exchange(&[pkt(atk, make(q))], peer);
        check(
            what,
            got,
            &[Answer::Nak(*code, RQ_PSN)],
            &mut fails,
            &mut log,
        );
        let c1 = qc(&dev, q);
        let d = c1.get(counter).unwrap_or(0) - c0.get(counter).unwrap_or(0);
        if d == 0 {
            fails.push(format!("{what}: counter {counter} did not move ({c1:?})"));
        }
        state_is(&dev, q, QpState::Err, what, &mut fails);
    }

    // 10. The legitimate flow kept going and verified every byte.
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (legit, legit_result) = legit_thread.join().expect("legit thread");
    let n = rounds.load(Ordering::SeqCst);
    log.push_str(&format!(
        "legitimate flow: {n} verified WRITE+READ rounds\n"
    ));
    match legit_result {
        Ok(()) if n >= 5 => {}
        Ok(()) => fails.push(format!("legitimate flow: only {n} rounds")),
        Err(e) => fails.push(format!("legitimate flow: {e}")),
    }

    // 11. Nothing outside what valid requests wrote changed, and every canary is intact.
    let guards = dev.mr_guard_violations();
    if !guards.is_empty() {
        fails.push(format!("canary bytes changed next to regions {guards:?}"));
    }
    let mut t = vec![0; MR_LEN];
    dev.mr_read(tgt.lkey, 0, &mut t).expect("read target");
    // Valid WRITEs: [0, 128) (cases 1 and 3) and [128, 192) (case 8).
    for (i, &v) in t.iter().enumerate() {
        let want = if i < 192 { 0xee } else { FILL_TARGET };
        if v != want {
            fails.push(format!("target byte {i} is {v:#x}, want {want:#x}"));
            break;
        }
    }
    for (m, v, name) in [
        (regions.ro, FILL_RO, "read-only"),
        (regions.lo, FILL_LO, "local-only"),
    ] {
        let mut buf = vec![0; MR_LEN];
        dev.mr_read(m.lkey, 0, &mut buf).expect("read");
        if buf.iter().any(|&x| x != v) {
            fails.push(format!("{name} region changed"));
        }
    }
    let mut rx = vec![0; MR_LEN];
    dev.mr_read(regions.rx.lkey, 0, &mut rx).expect("read rx");
    if rx.iter().any(|&x| x != 0) {
        fails.push("receive buffers written by a SEND LAST without FIRST".into());
    }
    legit_finish(legit);
    match Arc::try_unwrap(dev) {
        Ok(d) => d.close(),
        Err(_) => fails.push("device still shared at the end".into()),
    }
    (fails, log)
}

/// The legitimate QP: a perftest client of the WRITE server on A.
struct Legit {
    qpn: Qpn,
    local: roce::api::MrInfo,
    back: roce::api::MrInfo,
    remote: KeyMsg,
    comm: Comm,
    mine: KeyMsg,
}

fn legit_connect(dev: &Device, pd: roce::api::PdId, cq: roce::api::CqId, gidx: usize) -> Legit {
    let server_ip = {
        // The server is A: the peer of B's only address on the /24.
        let g = dev.gid(gidx).expect("gid");
        match g.ip {
            IpAddr::V4(v) => {
                let o = v.octets();
                std::net::Ipv4Addr::new(o[0], o[1], o[2], 1)
            }
            IpAddr::V6(_) => unreachable!("IPv4 GID index"),
        }
    };
    let qpn = dev
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 4,
                max_sge: 1,
            },
            sq_sig_all: true,
        })
        .expect("legit qp");
    let local = dev.reg_mr(pd, 4096, Access::LOCAL_WRITE).expect("mr");
    let back = dev.reg_mr(pd, 4096, Access::LOCAL_WRITE).expect("mr");
    dev.qp_to_init(qpn, Access::empty()).expect("init");
    let mut comm = Comm::new(
        TcpStream::connect((server_ip, 18720)).expect("connect to the perf server"),
        true,
    );
    comm.setup(4096, 64, 3).expect("perftest setup");
    let local_gid = dev.gid(gidx).expect("gid");
    let mine = KeyMsg {
        lid: 0,
        out_reads: 1,
        qpn,
        psn: Psn::new(0x4321),
        rkey: local.rkey,
        vaddr: local.iova,
        gid: local_gid.raw,
        srqn: 0,
    };
    let remote = comm.hand_shake(&mine).expect("hand shake");
    let path = dev
        .path_to(gidx, &remote.gid, qpn, remote.qpn)
        .expect("path");
    let c = RcConnect::new(path, Mtu::Mtu1024, remote.qpn, remote.psn, mine.psn);
    dev.qp_connect(qpn, &c).expect("connect");
    comm.hand_shake(&mine).expect("sync");
    comm.hand_shake(&mine).expect("sync");
    Legit {
        qpn,
        local,
        back,
        remote,
        comm,
        mine,
    }
}

fn legit_loop(
    dev: &Device,
    cq: roce::api::CqId,
    l: Legit,
    stop: &AtomicBool,
    pause: &AtomicBool,
    paused: &AtomicBool,
    rounds: &AtomicU64,
) -> (Legit, Result<(), String>) {
    let r = legit_rounds(dev, cq, &l, stop, pause, paused, rounds);
    (l, r)
}

fn legit_rounds(
    dev: &Device,
    cq: roce::api::CqId,
    l: &Legit,
    stop: &AtomicBool,
    pause: &AtomicBool,
    paused: &AtomicBool,
    rounds: &AtomicU64,
) -> Result<(), String> {
    let mut round = 0u32;
    let wait = |id: u64| -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Only this thread's QP completes on purpose; victim QPs flush receive WRs into
            // the same CQ when they fail, and those are not ours.
            if let Some(wc) = dev.wait_cq(cq, Duration::from_millis(50)) {
                if wc.qp_num != l.qpn {
                    continue;
                }
                if wc.wr_id != id || wc.status != WcStatus::Success {
                    return Err(format!("legit WR {id}: {wc:?}"));
                }
                return Ok(());
            }
        }
        Err(format!("legit WR {id}: no completion in 10 s"))
    };
    // The last round writes what the server checks at the end (pattern 0 for its QP 0), so
    // the far end verifies the data independently too.
    let mut last = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            if last {
                break;
            }
            last = true;
        } else if pause.load(Ordering::SeqCst) {
            paused.store(true, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        paused.store(false, Ordering::SeqCst);
        let data = pattern(if last { 0 } else { round + 1 }, 4096);
        dev.mr_write(l.local.lkey, 0, &data)
            .map_err(|e| e.to_string())?;
        let sge = |m: &roce::api::MrInfo| {
            vec![Sge {
                addr: m.iova,
                length: 4096,
                lkey: m.lkey,
            }]
        };
        let id = u64::from(round) * 2;
        dev.post_send(
            l.qpn,
            SendWr::new(
                id,
                SendOp::Write {
                    remote_addr: l.remote.vaddr,
                    rkey: l.remote.rkey,
                },
                sge(&l.local),
            ),
        )
        .map_err(|e| e.to_string())?;
        wait(id)?;
        dev.post_send(
            l.qpn,
            SendWr::new(
                id + 1,
                SendOp::Read {
                    remote_addr: l.remote.vaddr,
                    rkey: l.remote.rkey,
                },
                sge(&l.back),
            ),
        )
        .map_err(|e| e.to_string())?;
        wait(id + 1)?;
        let mut got = vec![0; 4096];
        dev.mr_read(l.back.lkey, 0, &mut got)
            .map_err(|e| e.to_string())?;
        if got != data {
            return Err(format!("round {round}: data read back differs"));
        }
        round += 1;
        rounds.store(u64::from(round), Ordering::SeqCst);
    }
    Ok(())
}

/// Ends the perftest exchange as a client does: sync, reports, sync, "done".
fn legit_finish(mut l: Legit) {
    let _ = l.comm.hand_shake(&l.mine);
    let _ = l.comm.xchg_bw_reports(&BwReport {
        size: 4096,
        iters: 1,
        ..BwReport::default()
    });
    let _ = l.comm.hand_shake(&l.mine);
    let mut done = [0u8; 5];
    let _ = l
        .comm
        .stream()
        .set_read_timeout(Some(Duration::from_secs(2)));
    let _ = l.comm.xchg(b"done\0", &mut done);
}

/// A victim RC QP of B connected to `peer` on A (which the raw socket impersonates): every
/// remote right, 4 responder resources, path MTU 1024, 4 receive WRs of 256 bytes in `rx`.
fn victim_qp(
    dev: &Device,
    pd: roce::api::PdId,
    cq: roce::api::CqId,
    gidx: usize,
    a_gid: &[u8; 16],
    peer: Qpn,
    rx: &roce::api::MrInfo,
) -> Qpn {
    let qpn = dev
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_sge: 1,
            },
            sq_sig_all: true,
        })
        .expect("victim qp");
    dev.qp_to_init(
        qpn,
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )
    .expect("init");
    let path = dev.path_to(gidx, a_gid, qpn, peer).expect("path");
    let mut c = RcConnect::new(path, Mtu::Mtu1024, peer, Psn::new(RQ_PSN), Psn::new(SQ_PSN));
    c.max_dest_rd_atomic = 4;
    dev.qp_connect(qpn, &c).expect("connect victim");
    for i in 0..4u64 {
        dev.post_recv(
            qpn,
            RecvWr {
                wr_id: 0xdead_0000 + i,
                sg_list: vec![Sge {
                    addr: rx.iova + 256 * i,
                    length: 256,
                    lkey: rx.lkey,
                }],
            },
        )
        .expect("post recv");
    }
    qpn
}

/// VmRSS of this process, in KiB (/proc/self/status).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A flood of READ requests (in sequence, 1 KiB each, far more than the 4 responder
/// resources) at a running endpoint: every request is executed and accounted exactly once
/// (`rx_read_requests`); when all 4 resources are still answering, the oldest is given up for
/// the new one as rxe's ring does (`rd_atomic_evicted`), so the table never grows and the QP
/// stays in RTS; responder memory stays bounded (VmRSS of the endpoint, this process, grows by
/// less than 32 MiB) and the canaries hold.
#[test]
fn read_flood_is_bounded_and_accounted() {
    require_root();
    let t = tag("hf");
    let pair = VethPair::new(
        &t,
        &VethOptions {
            subnet: 92,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let _unpin = Unpin(vec![b.ifname.clone()]);
    let port = RawPort::open(&a.netns, &a.ifname).expect("raw port on A");
    let mut atk = Attacker {
        port,
        tries: 0,
        path: PathRepr::new(
            EthernetAddress(a.mac),
            EthernetAddress(b.mac),
            IpPath::V4 {
                src: a.ipv4,
                dst: b.ipv4,
            },
        ),
    };
    let b_if = b.ifname.clone();
    let a_ip = a.ipv4;
    let out = netns::in_netns(&b.netns, move || {
        let dev = Device::open(&b_if, &DeviceOptions::default()).expect("open B");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(1024).expect("cq");
        let gidx = dev.info().default_gid_index(true);
        let a_gid = Gid::of(IpAddr::V4(a_ip)).raw;
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = dev.reg_mr(pd, 1 << 20, all).expect("mr");
        let rx = dev.reg_mr(pd, 4096, Access::LOCAL_WRITE).expect("mr");
        let peer = Qpn::new(0x7f00);
        let q = victim_qp(&dev, pd, cq, gidx, &a_gid, peer, &rx);
        const N: u32 = 3000;
        let frames: Vec<Vec<u8>> = (0..N)
            .map(|i| {
                let mut h = PktHdr::new(Opcode::RC_RDMA_READ_REQUEST, q, Psn::new(RQ_PSN + i));
                h.reth = Some(Reth {
                    va: mr.iova + u64::from(i % 1000) * 1024,
                    rkey: mr.rkey,
                    len: 1024,
                });
                atk.frame(&atk.path, &h, &[])
            })
            .collect();
        let counters = |dev: &Device| {
            dev.counters()
                .1
                .into_iter()
                .find(|(x, _)| *x == q)
                .map(|(_, c)| c)
                .unwrap_or_default()
        };
        let rss0 = rss_kib();
        let c0 = counters(&dev);
        for f in &frames {
            atk.port.send(f).expect("send");
        }
        // Let the endpoint finish answering.
        let _ = atk.port.recv(Duration::from_secs(2)).expect("recv");
        let c1 = counters(&dev);
        let rss1 = rss_kib();
        let d = c1.saturating_sub(&c0);
        let state = dev.qp_state(q);
        let guards = dev.mr_guard_violations();
        dev.close();
        (d, rss0, rss1, state, guards)
    })
    .expect("enter namespace B");
    let (d, rss0, rss1, state, guards) = out;
    eprintln!(
        "READ flood: executed {}, evicted while answering {}, refused {}, dropped {}, state \
         {state:?}, VmRSS {rss0} -> {rss1} KiB",
        d.rx_read_requests, d.rd_atomic_evicted, d.resp_invalid_request, d.rx_dropped
    );
    assert_eq!(
        d.rx_read_requests,
        u64::from(3000u32),
        "every READ executed once: {d:?}"
    );
    assert_eq!((d.resp_invalid_request, d.rx_dropped), (0, 0), "{d:?}");
    assert!(d.rd_atomic_evicted < d.rx_read_requests, "{d:?}");
    assert_eq!(state, Some(QpState::Rts));
    assert!(
        rss1 < rss0 + 32 * 1024,
        "VmRSS grew from {rss0} to {rss1} KiB under the flood"
    );
    assert!(guards.is_empty(), "canaries changed: {guards:?}");
}

/// The CLI's limits are enforced: `roce perf -q 4 --max-qp 2` and a receive queue deeper
/// than `max_qp_wr` are refused with the reason, and `--max-rd-atomic` outside 1..=128 is a
/// usage error.
#[test]
fn perf_refuses_more_qps_than_max_qp() {
    require_root();
    let pair = VethPair::new(
        &tag("hl"),
        &VethOptions {
            subnet: 93,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let _unpin = Unpin(vec![pair.a.ifname.clone()]);
    let o = Command::new(roce_bin())
        .args([
            "-j",
            "--netns",
            &pair.a.netns,
            "perf",
            "write",
            "-q",
            "4",
            "--max-qp",
            "2",
        ])
        .args(["-d", &pair.a.ifname, &pair.b.ipv4.to_string()])
        .output()
        .expect("run roce");
    let err = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("too many queue pairs (max 2)"), "{err}");
    let o = Command::new(roce_bin())
        .args([
            "-j",
            "--netns",
            &pair.a.netns,
            "perf",
            "send",
            "--rx-depth",
            "20000",
        ])
        .args(["-d", &pair.a.ifname, &pair.b.ipv4.to_string()])
        .output()
        .expect("run roce");
    let err = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("requested size 20000 exceeds the device limit 16384"),
        "{err}"
    );
    let o = Command::new(roce_bin())
        .args(["perf", "read", "--max-rd-atomic", "0", "-d", &pair.a.ifname])
        .output()
        .expect("run roce");
    assert_eq!(o.status.code(), Some(2));
}

/// VmRSS of process `pid`, in KiB.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc/PID/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A flood of bad connection attempts at a listening `roce perf` server (garbage instead of
/// perftest's version string, or closed at once): each is refused and counted (`cm_refused`),
/// the server's VmRSS stays within 8 MiB of what it was, and the real client that comes next
/// is served with its data verified.
#[test]
fn connection_flood_is_refused_and_counted() {
    require_root();
    let pair = VethPair::new(
        &tag("hc"),
        &VethOptions {
            subnet: 94,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let _unpin = Unpin(vec![pair.a.ifname.clone(), pair.b.ifname.clone()]);
    let server = Reaper(Some(
        Command::new(roce_bin())
            .args([
                "-j",
                "--netns",
                &pair.b.netns,
                "perf",
                "write",
                "-s",
                "4096",
            ])
            .args(["-n", "20", "-p", "18730", "-d", &pair.b.ifname])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn server"),
    ));
    let pid = server.0.as_ref().map(Child::id).expect("pid");
    thread::sleep(Duration::from_millis(1000));
    let rss0 = rss_of(pid);
    const GARBAGE: u32 = 200;
    const CLOSED: u32 = 50;
    let b_ip = pair.b.ipv4;
    let sent = netns::in_netns(&pair.a.netns, move || -> Result<u32, String> {
        use std::io::Write;
        let mut n = 0;
        for i in 0..GARBAGE + CLOSED {
            let mut s =
                TcpStream::connect((b_ip, 18730)).map_err(|e| format!("connect {i}: {e}"))?;
            if i < GARBAGE {
                let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n\0\0\0\0\0\0\0\0\0\0");
            }
            drop(s);
            n += 1;
        }
        Ok(n)
    })
    .expect("enter namespace A")
    .expect("flood");
    assert_eq!(sent, GARBAGE + CLOSED);
    thread::sleep(Duration::from_millis(500));
    let rss1 = rss_of(pid);
    let client = Command::new(roce_bin())
        .args([
            "-j",
            "--netns",
            &pair.a.netns,
            "perf",
            "write",
            "-s",
            "4096",
            "-n",
            "20",
        ])
        .args([
            "-p",
            "18730",
            "-d",
            &pair.a.ifname,
            &pair.b.ipv4.to_string(),
        ])
        .output()
        .expect("client");
    assert!(
        client.status.success(),
        "client: {}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    let (ok, out) = server_finish(server);
    assert!(ok, "server: {out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("server JSON ({e}): {out}"));
    eprintln!(
        "connection flood: cm {}, server VmRSS {rss0} -> {rss1} KiB",
        v["cm"]
    );
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["cm"]["cm_refused"], u64::from(GARBAGE + CLOSED), "{v}");
    assert_eq!(
        v["cm"]["cm_accepted"],
        u64::from(GARBAGE + CLOSED + 1),
        "{v}"
    );
    assert!(
        rss1 < rss0 + 8 * 1024,
        "server VmRSS grew from {rss0} to {rss1} KiB under the flood"
    );
}
