//! Hostile packets against a running endpoint (issue #9): the verbs API runs in this process on
//! end B of a veth pair, with XDP and AF_XDP engines like any application; end A holds a raw
//! socket that sends crafted frames (built from `roce::wire`'s public header reprs with the wire
//! emitter, so the ICRC is right and the frames reach the transport) and captures what B
//! answers. A `roce perf write` server on A is the peer of a legitimate QP of B that WRITEs and
//! READs back verified data throughout.
//!
//! The attacks are a table of [`Case`]s: the frames, the answer the responder rules of IBA
//! vol. 1 ch. 9 prescribe as Linux rxe implements them (`rxe_resp.c`, `rxe_recv.c`) — a
//! specific NAK code or a silent drop — and the counters that must account for it. Every
//! registered region keeps its canary bytes ([`roce::api::Device::mr_guard_violations`]) and its
//! contents outside what valid requests wrote. Root.

use std::{
    net::{IpAddr, Ipv4Addr, TcpStream},
    ops::RangeInclusive,
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
    netns::{self, VethEnd, VethOptions, VethPair},
    wire::{
        AethRepr, AethSyndrome, AtomicEthRepr, BthRepr, DethRepr, EthernetAddress, IpPath, Msn,
        NakCode, Opcode, PKey, PathRepr, QKey, RethRepr, RoceRepr, emit_frame, parse_frame,
        types::Psn,
    },
};
use roce_common::counters::{QpCounters, XdpStats};
use roce_tests::{RawPort, require_root, roce_bin, tag};

/// The first PSN the attacker (posing as each victim QP's peer) sends.
const RQ_PSN: u32 = 0x10_0000;
/// Each victim QP's first PSN.
const SQ_PSN: u32 = 0x20_0000;
const MR_LEN: usize = 4096;

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

/// Removes what a test left attached (pins of a killed or panicked endpoint) on drop.
struct Unpin(Vec<String>);

impl Drop for Unpin {
    fn drop(&mut self) {
        for i in &self.0 {
            let _ = roce::loader::unload(i);
        }
    }
}

/// One crafted packet: the BTH and extended headers, and the payload after them.
struct Pkt {
    roce: RoceRepr,
    payload: Vec<u8>,
}

impl Pkt {
    /// A packet of `opcode` to `qpn` at `psn` with only a BTH (P_Key 0xffff, no flags) and
    /// `payload_len` bytes of 0xee: add the extended headers the opcode needs.
    fn bare(opcode: Opcode, qpn: Qpn, psn: u32, payload_len: usize) -> Self {
        Self {
            roce: RoceRepr::new(BthRepr::new(opcode, qpn, Psn::new(psn))),
            payload: vec![0xee; payload_len],
        }
    }

    /// Sets the BTH's AckReq: the responder must acknowledge this packet.
    fn ack_req(mut self) -> Self {
        self.roce.bth.ack_req = true;
        self
    }

    /// An RDMA WRITE ONLY with AckReq whose RETH names `len` bytes at `va` under `rkey`,
    /// carrying `payload_len` bytes of 0xee.
    fn write(qpn: Qpn, psn: u32, va: u64, rkey: RKey, len: u32, payload_len: usize) -> Self {
        let mut p = Self::bare(Opcode::RC_RDMA_WRITE_ONLY, qpn, psn, payload_len).ack_req();
        p.roce.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        });
        p
    }

    /// An RDMA READ request with AckReq for `len` bytes at `va` under `rkey`.
    fn read(qpn: Qpn, psn: u32, va: u64, rkey: RKey, len: u32) -> Self {
        let mut p = Self::bare(Opcode::RC_RDMA_READ_REQUEST, qpn, psn, 0).ack_req();
        p.roce.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        });
        p
    }
}

/// What B answered to one attack.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Silent,
    Ack(u32),
    Nak(NakCode, u32),
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
    /// An attacker on `port` (a raw socket on A) that sends IPv4 frames from `a` to `b`.
    fn new(port: RawPort, a: &VethEnd, b: &VethEnd) -> Self {
        Self {
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
        }
    }

    /// `p` as a frame on `path` (use [`Attacker::frame`] for the attacker's own path).
    fn frame_on(path: &PathRepr, p: &Pkt) -> Vec<u8> {
        let mut buf = vec![0; 9000];
        let n = emit_frame(path, &p.roce, &p.payload, &mut buf).expect("emit");
        buf.truncate(n);
        buf
    }

    /// `p` as a frame from A to B.
    fn frame(&self, p: &Pkt) -> Vec<u8> {
        Self::frame_on(&self.path, p)
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
    let bth = f.roce.bth;
    if bth.dest_qp != peer {
        return None;
    }
    let psn = bth.psn.value();
    let syndrome = f.roce.aeth.map(|a| a.syndrome);
    Some(match (bth.opcode, syndrome) {
        (Opcode::RC_ACKNOWLEDGE, Some(AethSyndrome::Ack { .. })) => Answer::Ack(psn),
        (Opcode::RC_ACKNOWLEDGE, Some(AethSyndrome::Nak(code))) => Answer::Nak(code, psn),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, _) => Answer::ReadResp {
            psn,
            len: f.payload.len(),
        },
        (opcode, _) => Answer::Other(format!("{opcode:?} psn {psn:#x} syndrome {syndrome:?}")),
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
    let mut atk = Attacker::new(port, &a, &b);
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

/// Where a counter that a case must move lives.
#[derive(Clone, Copy, Debug)]
enum Counter {
    /// A field of the victim QP's [`roce_common::counters::QpCounters`].
    Qp(&'static str),
    /// A field of the device's counters.
    Dev(&'static str),
    /// A field of roce_xdp's [`XdpStats`] on B.
    Xdp(&'static str),
    /// CNPs the victim QP's reaction point saw: `rp_cnp_handled + rp_cnp_ignored`.
    RpCnp,
}

impl Counter {
    /// The counter's value now, for victim QP `q` on interface `b_if`.
    fn read(self, dev: &Device, b_if: &str, q: Qpn) -> u64 {
        match self {
            Self::Qp(n) => dev
                .counters()
                .1
                .into_iter()
                .find(|(x, _)| *x == q)
                .map(|(_, c)| c)
                .unwrap_or_default()
                .get(n)
                .unwrap_or_else(|| panic!("no QP counter {n}")),
            Self::Dev(n) => dev
                .counters()
                .0
                .get(n)
                .unwrap_or_else(|| panic!("no device counter {n}")),
            Self::Xdp(n) => Pins::new(b_if)
                .xdp_stats()
                .expect("xdp stats")
                .get(n)
                .unwrap_or_else(|| panic!("no XDP counter {n}")),
            Self::RpCnp => dev
                .cc_snapshots()
                .iter()
                .filter(|(x, _)| *x == q)
                .map(|(_, s)| s.stats.rp_cnp_handled + s.stats.rp_cnp_ignored)
                .sum(),
        }
    }
}

/// How far a counter must move, given how many times the frames were sent
/// ([`Attacker::tries`]): a silent case's counter moves once per try that reached the endpoint.
type Moves = fn(u64) -> RangeInclusive<u64>;

/// Once per try: between 1 and the number of tries.
const PER_TRY: Moves = |tries| 1..=tries;
/// Not at all.
const NEVER: Moves = |_| 0..=0;

/// Which QP a case attacks.
#[derive(Clone, Copy)]
enum Victim {
    /// The QP the sequential cases share (each case's PSNs follow the previous ones).
    Shared,
    /// A QP of its own, connected for this case (fatal errors leave it in ERR).
    Fresh,
    /// A QPN nobody on B owns; the frames pose as coming from a peer of the same number.
    Foreign(Qpn),
}

/// Builds a case's frames for the victim QP's number.
type MakeFrames = Box<dyn Fn(&Attacker, Qpn) -> Vec<Vec<u8>>>;

/// Builds one attack packet for a victim QP's number.
type MakePkt = Box<dyn Fn(Qpn) -> Pkt>;

/// One attack and everything it must cause.
struct Case {
    /// The rule under test.
    name: &'static str,
    victim: Victim,
    /// The frames, for the victim QP's number.
    frames: MakeFrames,
    /// What B answers, in order ([`Answer::Silent`] alone for nothing).
    expect: Vec<Answer>,
    /// The counters the attack moves, and by how much.
    counters: Vec<(Counter, Moves)>,
    /// The victim QP's state afterwards, when the case says.
    state: Option<QpState>,
}

impl Case {
    fn new(
        name: &'static str,
        victim: Victim,
        frames: impl Fn(&Attacker, Qpn) -> Vec<Vec<u8>> + 'static,
        expect: Vec<Answer>,
    ) -> Self {
        Self {
            name,
            victim,
            frames: Box::new(frames),
            expect,
            counters: Vec::new(),
            state: None,
        }
    }

    /// A case of one packet, built by `pkt` for the victim QP's number.
    fn one(
        name: &'static str,
        victim: Victim,
        pkt: impl Fn(Qpn) -> Pkt + 'static,
        expect: Vec<Answer>,
    ) -> Self {
        Self::new(name, victim, move |a, q| vec![a.frame(&pkt(q))], expect)
    }

    fn counter(mut self, c: Counter, moves: Moves) -> Self {
        self.counters.push((c, moves));
        self
    }

    fn state(mut self, s: QpState) -> Self {
        self.state = Some(s);
        self
    }
}

/// Runs cases and collects what went wrong, inside namespace B.
struct Bench<'a> {
    dev: &'a Device,
    b_if: &'a str,
    atk: &'a mut Attacker,
    fails: Vec<String>,
    log: String,
}

impl Bench<'_> {
    /// Sends `c`'s frames to QP `q` (posing as `peer`), then checks the answer, the counters
    /// and the QP state it prescribes.
    fn run(&mut self, c: &Case, q: Qpn, peer: Qpn) {
        let before: Vec<u64> = c
            .counters
            .iter()
            .map(|(n, _)| n.read(self.dev, self.b_if, q))
            .collect();
        let frames = (c.frames)(self.atk, q);
        let got = self.atk.exchange(&frames, peer);
        self.answer(c.name, got, &c.expect);
        for ((counter, moves), b) in c.counters.iter().zip(before) {
            let delta = counter.read(self.dev, self.b_if, q) - b;
            let want = moves(self.atk.tries);
            if !want.contains(&delta) {
                self.fails.push(format!(
                    "{}: counter {counter:?} moved by {delta}, want {want:?}",
                    c.name
                ));
            }
        }
        if let Some(want) = c.state {
            let s = self.dev.qp_state(q);
            if s != Some(want) {
                self.fails
                    .push(format!("{}: QP state {s:?}, want {want:?}", c.name));
            }
        }
    }

    fn answer(&mut self, what: &str, got: Vec<Answer>, want: &[Answer]) {
        let got = answers_or_silent(got);
        self.log.push_str(&format!("{what}: {got:?}\n"));
        if got != want {
            self.fails
                .push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }

    /// Headers truncated at every byte boundary of `whole`: none reaches a QP. Every cut is
    /// dropped or passed by roce_xdp, or redirected and counted malformed by the engine.
    fn truncations(&mut self, whole: &[u8], peer: Qpn) {
        let cuts: Vec<Vec<u8>> = (14..whole.len()).map(|n| whole[..n].to_vec()).collect();
        let x0 = Pins::new(self.b_if).xdp_stats().expect("xdp stats");
        let d0 = self.dev.counters().0;
        let got = self.atk.exchange(&cuts, peer);
        self.answer("truncated frames", got, &[Answer::Silent]);
        let x1 = Pins::new(self.b_if).xdp_stats().expect("xdp stats");
        let d1 = self.dev.counters().0;
        let dx = x1.saturating_sub(&x0);
        let not_delivered: u64 = XdpStats::NAMES
            .iter()
            .filter(|n| n.starts_with("drop_") || n.starts_with("pass_"))
            .map(|n| dx.get(n).unwrap_or(0))
            .sum();
        let delivered_malformed = d1.rx_malformed - d0.rx_malformed;
        self.log.push_str(&format!(
            "truncated: {} frames; xdp dropped/passed {not_delivered}, redirected {} (engine counted {delivered_malformed} malformed)\n",
            cuts.len(),
            dx.redirected
        ));
        if not_delivered + delivered_malformed < cuts.len() as u64 * self.atk.tries
            || dx.redirected != delivered_malformed
        {
            self.fails.push(format!(
                "truncated: {} frames, xdp dropped/passed {not_delivered}, redirected {}, engine malformed {delivered_malformed}: {dx:?}",
                cuts.len(),
                dx.redirected
            ));
        }
    }
}

/// The attacks on the shared QP, in order: each case's PSNs follow what the ones before did.
/// `spoof` is A's path with another source address.
fn shared_cases(tgt: roce::api::MrInfo, spoof: PathRepr) -> Vec<Case> {
    use Victim::Shared;
    let write = move |q, psn, off: u64| Pkt::write(q, psn, tgt.iova + off, tgt.rkey, 64, 64);
    vec![
        Case::one(
            "valid WRITE is ACKed",
            Shared,
            move |q| write(q, RQ_PSN, 0),
            vec![Answer::Ack(RQ_PSN)],
        ),
        Case::one(
            "wrong P_Key is dropped and counted",
            Shared,
            move |q| {
                let mut p = write(q, RQ_PSN + 1, 64);
                p.roce.bth.pkey = PKey::new(0x7123);
                p
            },
            vec![Answer::Silent],
        )
        .counter(Counter::Dev("bad_pkey_cntr"), PER_TRY),
        Case::new(
            "wrong source address of a connected QP is dropped and counted",
            Shared,
            move |_, q| vec![Attacker::frame_on(&spoof, &write(q, RQ_PSN + 1, 64))],
            vec![Answer::Silent],
        )
        .counter(Counter::Qp("rx_dropped"), PER_TRY),
        // An RC QP addressed as if from another QP: a UD SEND whose DETH names some source QP.
        // The opcode's transport is not the QP's (rxe_recv.c), so it is dropped and counted.
        Case::one(
            "UD SEND from another QP to an RC QP is dropped and counted",
            Shared,
            |q| {
                let mut p = Pkt::bare(Opcode::UD_SEND_ONLY, q, RQ_PSN + 1, 64);
                p.roce.deth = Some(DethRepr {
                    qkey: QKey::new(0x8001_0000),
                    src_qp: Qpn::new(0x1234),
                });
                p
            },
            vec![Answer::Silent],
        )
        .counter(Counter::Qp("rx_dropped"), PER_TRY),
        // Counted per packet (mlx5 out_of_sequence semantics; rxe counts only the NAKed one),
        // NAKed once per gap with the expected PSN, then silence.
        Case::new(
            "PSN far ahead (twice) is NAKed once as a sequence error",
            Shared,
            move |a, q| {
                [0x40_0000, 0x40_0001]
                    .map(|ahead| a.frame(&write(q, RQ_PSN + 1 + ahead, 512)))
                    .to_vec()
            },
            vec![Answer::Nak(NakCode::PsnSequenceError, RQ_PSN + 1)],
        )
        .counter(Counter::Qp("out_of_sequence"), |_| 2..=2)
        .counter(Counter::Qp("duplicate_request"), NEVER),
        // A duplicate is re-ACKed with the last PSN done (C9-105), nothing written.
        Case::one(
            "PSN far behind is a duplicate, re-ACKed",
            Shared,
            move |q| write(q, (RQ_PSN + 0x100_0000 - 0x40_0000) & 0xff_ffff, 512),
            vec![Answer::Ack(RQ_PSN)],
        )
        .counter(Counter::Qp("duplicate_request"), |_| 1..=1)
        .counter(Counter::Qp("out_of_sequence"), NEVER),
        Case::one(
            "in-sequence WRITE after the attacks is ACKed",
            Shared,
            move |q| write(q, RQ_PSN + 1, 64),
            vec![Answer::Ack(RQ_PSN + 1)],
        ),
        // A WRITE of 0 bytes needs no valid R_Key (rxe check_rkey).
        Case::one(
            "zero-length WRITE with any R_Key is ACKed",
            Shared,
            |q| Pkt::write(q, RQ_PSN + 2, 0, RKey::new(0x1234), 0, 0),
            vec![Answer::Ack(RQ_PSN + 2)],
        ),
        Case::one(
            "zero-length READ gets an empty READ response",
            Shared,
            move |q| Pkt::read(q, RQ_PSN + 3, tgt.iova, tgt.rkey, 0),
            vec![Answer::ReadResp {
                psn: RQ_PSN + 3,
                len: 0,
            }],
        ),
        Case::one(
            "ACK for a PSN never sent is dropped and counted, the QP stays up",
            Shared,
            |q| {
                let mut p = Pkt::bare(Opcode::RC_ACKNOWLEDGE, q, SQ_PSN + 50, 0);
                p.roce.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn: Msn::new(9),
                });
                p
            },
            vec![Answer::Silent],
        )
        .counter(Counter::Qp("rx_dropped"), PER_TRY)
        .state(QpState::Rts),
    ]
}

/// CNPs sent in the CNP flood, per try.
const CNPS: u64 = 500;

/// The attacks accounted in XDP counters, run while the legitimate flow pauses.
fn quiet_cases(tgt: roce::api::MrInfo) -> Vec<Case> {
    let foreign = Qpn::new(0x00ff_fff0);
    vec![
        Case::new(
            "CNP flood is counted by XDP and the reaction point, never answered",
            Victim::Shared,
            |a, q| {
                let cnp = a.frame(&Pkt {
                    roce: RoceRepr::cnp(q),
                    payload: Vec::new(),
                });
                (0..CNPS).map(|_| cnp.clone()).collect()
            },
            vec![Answer::Silent],
        )
        .counter(Counter::Xdp("cnp"), |t| CNPS * t..=CNPS * t)
        .counter(Counter::RpCnp, |t| CNPS * t * 9 / 10..=CNPS * t)
        .state(QpState::Rts),
        // Not ours, so roce_xdp passes it to the kernel (counted).
        Case::one(
            "unknown QPN is passed to the kernel, no answer",
            Victim::Foreign(foreign),
            move |q| Pkt::write(q, RQ_PSN, tgt.iova, tgt.rkey, 64, 64),
            vec![Answer::Silent],
        )
        .counter(Counter::Xdp("pass_foreign_qp"), PER_TRY),
    ]
}

/// Fatal responder errors (class C): NAK with the code, the counter moves, and
/// the QP goes to ERR. Each runs on a QP of its own.
fn fatal_cases(regions: &Regions) -> Vec<Case> {
    let (tgt, ro, lo) = (regions.target, regions.ro, regions.lo);
    let fatal = |name, pkt: MakePkt, code, counter| {
        Case::one(name, Victim::Fresh, pkt, vec![Answer::Nak(code, RQ_PSN)])
            .counter(Counter::Qp(counter), |_| 1..=u64::MAX)
            .state(QpState::Err)
    };
    let access = |name, pkt: MakePkt| {
        fatal(
            name,
            pkt,
            NakCode::RemoteAccessError,
            "resp_remote_access_errors",
        )
    };
    let invalid =
        |name, pkt: MakePkt| fatal(name, pkt, NakCode::InvalidRequest, "resp_invalid_request");
    let end = tgt.iova + MR_LEN as u64;
    vec![
        access(
            "READ with a bad R_Key",
            Box::new(move |q| {
                let bad = RKey::new(tgt.rkey.value() ^ 0x5a5a);
                Pkt::read(q, RQ_PSN, tgt.iova, bad, 16)
            }),
        ),
        access(
            "READ with the local-only region's key",
            Box::new(move |q| Pkt::read(q, RQ_PSN, lo.iova, lo.rkey, 16)),
        ),
        access(
            "READ with VA past the region",
            Box::new(move |q| Pkt::read(q, RQ_PSN, end, tgt.rkey, 16)),
        ),
        access(
            "READ with VA + length wrapping",
            Box::new(move |q| Pkt::read(q, RQ_PSN, u64::MAX - 15, tgt.rkey, 64)),
        ),
        access(
            "WRITE with VA + length wrapping",
            Box::new(move |q| Pkt::write(q, RQ_PSN, u64::MAX - 15, tgt.rkey, 64, 64)),
        ),
        access(
            "WRITE past the region's end",
            Box::new(move |q| Pkt::write(q, RQ_PSN, end - 32, tgt.rkey, 64, 64)),
        ),
        access(
            "WRITE into a region without remote write",
            Box::new(move |q| Pkt::write(q, RQ_PSN, ro.iova, ro.rkey, 64, 64)),
        ),
        invalid(
            "misaligned atomic",
            Box::new(move |q| {
                let mut p = Pkt::bare(Opcode::RC_FETCH_ADD, q, RQ_PSN, 0);
                p.roce.atomic_eth = Some(AtomicEthRepr {
                    va: tgt.iova + 4,
                    rkey: tgt.rkey,
                    swap_add: 1,
                    compare: 0,
                });
                p
            }),
        ),
        invalid(
            "payload larger than the path MTU",
            Box::new(move |q| Pkt::write(q, RQ_PSN, tgt.iova, tgt.rkey, 1028, 1028)),
        ),
        invalid(
            "WRITE MIDDLE without a FIRST",
            Box::new(|q| Pkt::bare(Opcode::RC_RDMA_WRITE_MIDDLE, q, RQ_PSN, 1024).ack_req()),
        ),
        invalid(
            "SEND LAST without a FIRST",
            Box::new(|q| Pkt::bare(Opcode::RC_SEND_LAST, q, RQ_PSN, 64).ack_req()),
        ),
    ]
}

/// The whole attack, inside namespace B. Returns (failures, log).
fn run(b_if: &str, a_ip: Ipv4Addr, atk: &mut Attacker) -> (Vec<String>, String) {
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
    let tgt = regions.target;
    let mut spoof = atk.path;
    spoof.ip = IpPath::V4 {
        src: Ipv4Addr::new(a_ip.octets()[0], a_ip.octets()[1], a_ip.octets()[2], 99),
        dst: match atk.path.ip {
            IpPath::V4 { dst, .. } => dst,
            IpPath::V6 { .. } => unreachable!(),
        },
    };
    let mut bench = Bench {
        dev: &dev,
        b_if,
        atk,
        fails: Vec::new(),
        log: String::new(),
    };
    let (q, peer) = victim(&dev);
    let mut run_all = |bench: &mut Bench, cases: &[Case]| {
        for c in cases {
            let (q, peer) = match c.victim {
                Victim::Shared => (q, peer),
                Victim::Fresh => victim(&dev),
                Victim::Foreign(x) => (x, x),
            };
            bench.run(c, q, peer);
        }
    };

    run_all(&mut bench, &shared_cases(tgt, spoof));
    quiet(true);
    run_all(&mut bench, &quiet_cases(tgt));
    // A valid WRITE cut at every byte boundary reaches no QP; whole, it still works after that.
    let whole = move |q| Pkt::write(q, RQ_PSN + 4, tgt.iova + 128, tgt.rkey, 64, 64);
    let cut = bench.atk.frame(&whole(q));
    bench.truncations(&cut, peer);
    quiet(false);
    let after = Case::one(
        "whole WRITE after truncations is ACKed",
        Victim::Shared,
        whole,
        vec![Answer::Ack(RQ_PSN + 4)],
    );
    run_all(&mut bench, &[after]);
    run_all(&mut bench, &fatal_cases(&regions));
    let Bench {
        mut fails, mut log, ..
    } = bench;

    // The legitimate flow kept going and verified every byte.
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

    fails.extend(untouched(&dev, &regions));
    legit_finish(legit);
    match Arc::try_unwrap(dev) {
        Ok(d) => d.close(),
        Err(_) => fails.push("device still shared at the end".into()),
    }
    (fails, log)
}

/// What changed in `regions` beyond what the valid requests wrote: every canary next to a
/// region is intact, the target holds 0xee in [0, 128) (the valid WRITEs at RQ_PSN and
/// RQ_PSN + 1) and [128, 192) (the whole WRITE after the truncations) and its fill elsewhere,
/// and the read-only, local-only and receive regions hold their fill.
fn untouched(dev: &Device, regions: &Regions) -> Vec<String> {
    let mut fails = Vec::new();
    let guards = dev.mr_guard_violations();
    if !guards.is_empty() {
        fails.push(format!("canary bytes changed next to regions {guards:?}"));
    }
    let mut t = vec![0; MR_LEN];
    dev.mr_read(regions.target.lkey, 0, &mut t)
        .expect("read target");
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
    fails
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
                max_inline_data: 0,
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

/// An RC QP of B (16 send WRs, `max_recv_wr` receive WRs of one SGE, every WR signalled,
/// rights `access`, 4 responder resources, path MTU 1024) connected to `peer` on A, whose GID
/// is `a_gid` (reached through B's GID `gidx`), with the PSNs the raw requester uses.
fn rc_qp_to_a(
    dev: &Device,
    pd: roce::api::PdId,
    cq: roce::api::CqId,
    (gidx, a_gid): (usize, &[u8; 16]),
    peer: Qpn,
    max_recv_wr: u32,
    access: Access,
) -> Qpn {
    let qpn = dev
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr,
                max_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .expect("qp");
    dev.qp_to_init(qpn, access).expect("init");
    let path = dev.path_to(gidx, a_gid, qpn, peer).expect("path");
    let mut c = RcConnect::new(path, Mtu::Mtu1024, peer, Psn::new(RQ_PSN), Psn::new(SQ_PSN));
    c.max_dest_rd_atomic = 4;
    dev.qp_connect(qpn, &c).expect("connect");
    qpn
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
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let qpn = rc_qp_to_a(dev, pd, cq, (gidx, a_gid), peer, 16, remote);
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

/// B's end of [`on_endpoint`]: the device opened on B, and where A is from it.
struct Endpoint {
    dev: Device,
    /// B's GID index for IPv4.
    gidx: usize,
    /// A's GID (the raw socket's address).
    a_gid: [u8; 16],
}

/// Makes a veth pair (tag `t`, subnet `subnet`), opens a [`Device`] on B, an [`Attacker`] on
/// A's raw socket, and runs `f` with both inside B's namespace; unloads roce_xdp from B and
/// removes the pair afterwards, also when `f` panics.
fn on_endpoint<T: Send + 'static>(
    t: &str,
    subnet: u8,
    f: impl FnOnce(Endpoint, &mut Attacker) -> T + Send + 'static,
) -> T {
    on_endpoint_with(t, subnet, DeviceOptions::default(), f)
}

/// [`on_endpoint`] with B's device opened with `opts`.
fn on_endpoint_with<T: Send + 'static>(
    t: &str,
    subnet: u8,
    opts: DeviceOptions,
    f: impl FnOnce(Endpoint, &mut Attacker) -> T + Send + 'static,
) -> T {
    let pair = VethPair::new(
        t,
        &VethOptions {
            subnet,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let _unpin = Unpin(vec![b.ifname.clone()]);
    let port = RawPort::open(&a.netns, &a.ifname).expect("raw port on A");
    let mut atk = Attacker::new(port, &a, &b);
    netns::in_netns(&b.netns, move || {
        let dev = Device::open(&b.ifname, &opts).expect("open B");
        let e = Endpoint {
            gidx: dev.info().default_gid_index(true),
            a_gid: Gid::of(IpAddr::V4(a.ipv4)).raw,
            dev,
        };
        f(e, &mut atk)
    })
    .expect("enter namespace B")
}

/// The counters of QP `q` of `dev` (zero if it has none).
fn qp_counters(dev: &Device, q: Qpn) -> QpCounters {
    dev.counters()
        .1
        .into_iter()
        .find(|(x, _)| *x == q)
        .map(|(_, c)| c)
        .unwrap_or_default()
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
    let out = on_endpoint(&tag("hf"), 92, |e, atk| {
        let Endpoint { dev, gidx, a_gid } = e;
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(1024).expect("cq");
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
                // Without AckReq: the responder answers every READ anyway.
                let mut p = Pkt::bare(Opcode::RC_RDMA_READ_REQUEST, q, RQ_PSN + i, 0);
                p.roce.reth = Some(RethRepr {
                    va: mr.iova + u64::from(i % 1000) * 1024,
                    rkey: mr.rkey,
                    dma_len: 1024,
                });
                atk.frame(&p)
            })
            .collect();
        let counters = |dev: &Device| qp_counters(dev, q);
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
    });
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

/// Issue 20, "an RNR NAK lost under a burst": 600 SEND_ONLYs (AckReq on each) sent back to back
/// at a running endpoint's RC QP that has 500 receives posted. The endpoint receives them in
/// batches and queues an ACK for each, so its control queue fills before it transmits; the
/// first SEND without a receive WQE must still get its RNR NAK (IBA vol. 1 9.7.5.2.8, rxe
/// `RESPST_ERR_RNR`), which takes the place of the queued ACKs it implies. The raw socket
/// plays the requester: after the RNR NAK the application posts the missing receives and the
/// requester resends from the NAK's PSN (as after its RNR timer), going back N after a PSN
/// sequence NAK or a silence (a frame lost on the way). Every message must then be received
/// exactly once, in order, with its payload; the endpoint's counters show the RNR NAK sent
/// (`send_rnr_err`, `out_of_buffer`), and no control answer dropped (`ack_queue_full` 0).
/// The endpoint answers every AckReq with an ACK of its own here, as rxe and the issue's
/// endpoint did, so that the control queue fills.
#[test]
fn send_burst_past_the_posted_receives_gets_the_rnr_nak() {
    send_burst_past_the_posted_receives(false);
}

/// The same burst at an endpoint with the default device, which coalesces the ACKs of one
/// receive batch (IBA 9.7.5.1; `DeviceConfig::coalesce_acks`): the RNR NAK still goes out
/// and every message arrives once.
#[test]
fn send_burst_with_coalesced_acks_gets_the_rnr_nak() {
    send_burst_past_the_posted_receives(true);
}

fn send_burst_past_the_posted_receives(coalesce_acks: bool) {
    require_root();
    const N: u32 = 600;
    const POSTED: u32 = 500;
    const LEN: u32 = 64;
    let mut opts = DeviceOptions::default();
    opts.transport.coalesce_acks = coalesce_acks;
    let (t, subnet) = if coalesce_acks {
        ("hc", 104)
    } else {
        ("hr", 97)
    };
    let out = on_endpoint_with(&tag(t), subnet, opts, move |e, atk| {
        let Endpoint { dev, gidx, a_gid } = e;
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(2 * N as usize).expect("cq");
        let rx = dev
            .reg_mr(pd, (N * LEN) as usize, Access::LOCAL_WRITE)
            .expect("mr");
        let peer = Qpn::new(0x7e00);
        let q = rc_qp_to_a(&dev, pd, cq, (gidx, &a_gid), peer, N, Access::empty());
        let post = |range: core::ops::Range<u32>| {
            for i in range {
                dev.post_recv(
                    q,
                    RecvWr {
                        wr_id: u64::from(i),
                        sg_list: vec![Sge {
                            addr: rx.iova + u64::from(i * LEN),
                            length: LEN,
                            lkey: rx.lkey,
                        }],
                    },
                )
                .expect("post recv");
            }
        };
        post(0..POSTED);
        let payload = |i: u32| -> Vec<u8> { (0..LEN).map(|j| (i * 7 + j) as u8).collect() };
        let frames: Vec<Vec<u8>> = (0..N)
            .map(|i| {
                let mut p = Pkt::bare(Opcode::RC_SEND_ONLY, q, RQ_PSN + i, 0).ack_req();
                p.payload = payload(i);
                atk.frame(&p)
            })
            .collect();
        let counters = |dev: &Device| qp_counters(dev, q);
        let c0 = counters(&dev);
        let coalesced0 = dev.counters().0.ack_coalesced;
        let mut log = Vec::new();
        let mut fails = Vec::new();
        // The requester: `next` is the first PSN (offset) not acknowledged.
        let mut next = 0u32;
        let mut rnr_seen = 0u64;
        let mut receives_missing = true;
        for round in 0..30 {
            if next == N {
                break;
            }
            atk.port
                .send_burst(&frames[next as usize..])
                .expect("burst");
            let mut got = Vec::new();
            let mut quiet = 0;
            while quiet < 3 {
                let g = atk.port.recv(Duration::from_millis(100)).expect("recv");
                quiet = if g.is_empty() { quiet + 1 } else { 0 };
                got.extend(g);
            }
            // What B answered, in order: ACK (PSN), RNR NAK (PSN), NAK (code, PSN).
            let mut acked: Option<u32> = None;
            let mut rnr: Option<u32> = None;
            let mut nak: Option<u32> = None;
            let mut seen = Vec::new();
            for g in &got {
                let Ok(f) = parse_frame(g) else { continue };
                if f.roce.bth.dest_qp != peer {
                    continue;
                }
                let off = f.roce.bth.psn.value().wrapping_sub(RQ_PSN);
                match f.roce.aeth.map(|x| x.syndrome) {
                    Some(AethSyndrome::Ack { .. }) => {
                        acked = Some(acked.map_or(off, |x| x.max(off)));
                        seen.push(format!("ACK {off}"));
                    }
                    Some(AethSyndrome::RnrNak { .. }) => {
                        rnr_seen += 1;
                        rnr = Some(off);
                        seen.push(format!("RNR {off}"));
                    }
                    Some(AethSyndrome::Nak(code)) => {
                        nak = Some(off);
                        seen.push(format!("NAK {code:?} {off}"));
                    }
                    other => seen.push(format!("other {other:?} {off}")),
                }
            }
            let shown = if seen.len() > 12 {
                format!(
                    "{} .. {}",
                    seen[..4].join(", "),
                    seen[seen.len() - 8..].join(", ")
                )
            } else {
                seen.join(", ")
            };
            log.push(format!(
                "round {round}: sent {next}..{N}, {} answers: {shown}",
                seen.len()
            ));
            // The rule under test: an answer that acknowledged every message up to the last
            // posted receive must come with the RNR NAK for the next one.
            if receives_missing && acked == Some(POSTED - 1) && rnr != Some(POSTED) {
                fails.push(format!(
                    "round {round}: ACKs through {} but no RNR NAK for {POSTED}",
                    POSTED - 1
                ));
            }
            // Resume as a requester does: from an RNR NAK's or a NAK's PSN (each
            // acknowledges everything before it), else after the newest ACK.
            let resume = rnr.into_iter().chain(nak).chain(acked.map(|x| x + 1)).max();
            if let Some(r) = resume.filter(|r| *r > next && *r <= N) {
                next = r;
            }
            if receives_missing && rnr.is_some() {
                post(POSTED..N);
                receives_missing = false;
            }
        }
        let d = counters(&dev).saturating_sub(&c0);
        let coalesced = dev.counters().0.ack_coalesced - coalesced0;
        let wcs = dev.poll_cq(cq, 2 * N as usize);
        let mut data = vec![0; (N * LEN) as usize];
        dev.mr_read(rx.lkey, 0, &mut data).expect("read rx");
        let state = dev.qp_state(q);
        dev.close();
        (next, rnr_seen, fails, log, d, wcs, data, state, coalesced)
    });
    let (next, rnr_seen, fails, log, d, wcs, data, state, coalesced) = out;
    eprintln!("{}", log.join("\n"));
    eprintln!("responder counters: {d:?}, ack_coalesced {coalesced}");
    assert!(fails.is_empty(), "{}", fails.join("\n"));
    assert_eq!(next, N, "every message acknowledged");
    assert!(rnr_seen >= 1, "the RNR NAK went out");
    assert_eq!(
        d.send_rnr_err, rnr_seen,
        "send_rnr_err counts the RNR NAKs sent: {d:?}"
    );
    assert!(d.out_of_buffer >= 1, "{d:?}");
    assert_eq!(d.ack_queue_full, 0, "no control answer dropped: {d:?}");
    if coalesce_acks {
        // The burst's ACKs were merged per batch, at most 8 requests to one.
        assert!(coalesced > 0, "no ACK was coalesced: {d:?}");
    } else {
        // The condition of the issue: answers were merged because the control queue was
        // full (hundreds in every run so far). Without it the test would prove nothing.
        assert!(
            d.ack_deferred > 0,
            "the burst never filled the control queue, so the test did not reproduce issue 20: {d:?}"
        );
        assert_eq!(coalesced, 0);
    }
    assert_eq!(state, Some(QpState::Rts));
    let got: Vec<(u64, WcStatus, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    let want: Vec<(u64, WcStatus, u32)> = (0..N)
        .map(|i| (u64::from(i), WcStatus::Success, LEN))
        .collect();
    assert_eq!(got, want, "each message received once, in order");
    for i in 0..N {
        let at = (i * LEN) as usize;
        let want: Vec<u8> = (0..LEN).map(|j| (i * 7 + j) as u8).collect();
        assert_eq!(
            &data[at..at + LEN as usize],
            &want[..],
            "payload of message {i}"
        );
    }
}

/// Programs of one `roce engine` against each other (issue 22, isolation). The engine names
/// objects by number (PD and CQ ids, QPNs, lkeys), so a program can guess another's; every
/// request must be scoped to the asking connection's own objects.
mod engine_isolation {
    use std::{
        path::{Path, PathBuf},
        process::Command,
        thread,
        time::{Duration, Instant},
    };

    use roce::api::{
        Access, CqId, LKey, Mtu, PdId, Psn, QpInit, QpState, QpType, Qpn, RcTarget, WcStatus,
        remote::{
            EngineClient, RemoteError,
            memory::{AddressSpace, ProcessMem},
            proto::{RcAttrs, WireOp, WireSendWr, WireSge, WireWc},
        },
    };
    use roce_tests::{
        child::{finish_within, spawn_command},
        engine::start_engine,
        require_root, roce, veth_pair,
    };
    use serde_json::Value;

    #[track_caller]
    fn einval<T: std::fmt::Debug>(what: &str, r: Result<T, RemoteError>) {
        let e = r.expect_err(what);
        assert_eq!(e.errno(), nix::errno::Errno::EINVAL as i32, "{what}: {e}");
    }

    /// A program's registered buffer, read back through this process's own memory file (the
    /// engine writes it behind the compiler's back).
    struct Buf {
        _mem: Vec<u8>,
        view: ProcessMem,
        addr: u64,
        len: usize,
    }

    impl Buf {
        fn new(fill: u8, len: usize) -> Self {
            let mem = vec![fill; len];
            let addr = mem.as_ptr() as u64;
            let view = ProcessMem::new(
                AddressSpace::own().expect("/proc/self/mem"),
                addr,
                len as u64,
            )
            .expect("region");
            Self {
                _mem: mem,
                view,
                addr,
                len,
            }
        }

        fn bytes(&self) -> Vec<u8> {
            use roce::api::ExternalMem as _;
            let mut out = vec![0; self.len];
            assert!(self.view.read(0, &mut out), "reading our own buffer");
            out
        }

        fn set(&self, data: &[u8]) {
            use roce::api::ExternalMem as _;
            assert!(self.view.write(0, data), "writing our own buffer");
        }
    }

    /// A program of the engine with one PD, CQ, QP and registered buffer.
    struct Prog {
        c: EngineClient,
        pd: PdId,
        cq: CqId,
        qp: Qpn,
        lkey: LKey,
        rkey: u32,
        buf: Buf,
    }

    const ACCESS: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);

    impl Prog {
        fn new(path: &Path, fill: u8) -> Self {
            let mut c = EngineClient::connect_at(path).expect("connect");
            let pd = c.alloc_pd().expect("pd");
            let buf = Buf::new(fill, 4096);
            let (lkey, rkey) = c
                .reg_mr(pd, buf.addr, buf.len as u64, ACCESS)
                .expect("reg_mr");
            let cq = c.create_cq(16).expect("cq");
            let qp = c.create_qp(&QpInit::new(QpType::Rc, pd, cq)).expect("qp");
            c.qp_to_init(qp, ACCESS).expect("init");
            Self {
                c,
                pd,
                cq,
                qp,
                lkey,
                rkey: rkey.value(),
                buf,
            }
        }

        /// Another QP of this program on its CQ, in INIT.
        fn qp(&mut self) -> Qpn {
            let q = self
                .c
                .create_qp(&QpInit::new(QpType::Rc, self.pd, self.cq))
                .expect("qp");
            self.c.qp_to_init(q, ACCESS).expect("init");
            q
        }

        /// Connects `qp` to `dest` with the given PSNs; few, short retries.
        fn connect(&mut self, qp: Qpn, gid: [u8; 16], dest: Qpn, rq_psn: u32, sq_psn: u32) {
            let t = RcTarget {
                gid_index: 1,
                remote_gid: gid,
                dest_qpn: dest,
                path_mtu: Mtu::Mtu1024,
                rq_psn: Psn::new(rq_psn),
                sq_psn: Psn::new(sq_psn),
                attrs: RcAttrs {
                    timeout: 10,
                    retry_cnt: 2,
                    ..RcAttrs::PINGPONG
                },
            };
            self.c.qp_connect_to(qp, &t).expect("connect");
        }

        fn post(&mut self, qp: Qpn, op: WireOp, sge: WireSge) {
            self.c
                .post_send(
                    qp,
                    WireSendWr {
                        wr_id: 1,
                        op,
                        signaled: true,
                        sges: vec![sge],
                    },
                )
                .expect("post_send");
        }

        /// The next completion, waiting at most 20 s.
        fn wc(&mut self) -> WireWc {
            let t0 = Instant::now();
            loop {
                let w = self
                    .c
                    .wait_cq(self.cq, 1, Duration::from_millis(100))
                    .expect("wait_cq");
                if let Some(w) = w.first() {
                    return *w;
                }
                assert!(t0.elapsed() < Duration::from_secs(20), "no completion");
            }
        }

        fn state(&mut self, qp: Qpn) -> QpState {
            self.c.query_qp(qp).expect("query_qp").1
        }
    }

    /// A counter of QP `qpn` in the counters the engine publishes (`roce stats --qps`).
    fn qp_counter(ns: &str, ifname: &str, qpn: Qpn, name: &str) -> u64 {
        let o = roce(&["-j", "--netns", ns, "stats", "--qps", "-i", ifname]);
        assert!(o.status.success(), "roce stats");
        let v: Value = serde_json::from_slice(&o.stdout).expect("stats JSON");
        v[format!("qp_0x{:06x}", qpn.value())][name]
            .as_u64()
            .unwrap_or(0)
    }

    /// Waits (at most 10 s, the engine publishes every 250 ms) until QP `qpn`'s `name` is at
    /// least 1, and returns it.
    fn counted(ns: &str, ifname: &str, qpn: Qpn, name: &str) -> u64 {
        let t0 = Instant::now();
        loop {
            let n = qp_counter(ns, ifname, qpn, name);
            if n > 0 {
                return n;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "QP {qpn:?} never counted {name}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// An intruder that knows (guesses) another program's QPN, PD, CQ and key numbers gets
    /// `EINVAL` for every verb that names them, as uverbs answers a handle it does not know,
    /// and the owner (a separate process, `engine_peer target`) receives its 64 KiB WRITE
    /// intact afterwards. Then, between programs of the engine, the RDMA attacks a remote
    /// attacker can make: another's lkey in a WR's SG list (local protection error, nothing
    /// read or written), a WRITE to another's QP at a PSN it does not expect (counted, dropped,
    /// its memory and state untouched, its real peer still served), and a WRITE with a wrong
    /// rkey at the expected PSN (the remote access error NAK, counted, the victim QP in ERR as
    /// for a remote attacker's frame, its memory untouched).
    #[test]
    fn engine_programs_reach_only_their_own_objects() {
        require_root();
        let pair = veth_pair("hoste", 111);
        let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
        let (engine, path, _guard) = start_engine(&ns, &ifname, "1", Duration::from_secs(30));
        // The intruder, with objects of its own so that guessed numbers are valid somewhere;
        // connected at once (an engine without a client leaves after its linger).
        let mut x = Prog::new(&path, 0x11);

        // The owner: a separate process whose QP waits for its writer.
        let dir = std::env::temp_dir().join(format!("roce-hoste-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("exchange folder");
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = Rm(dir.clone());
        let peer = roce_tests::example_bin("engine_peer");
        let run = |role: &str| {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/var/run/netns/{ns}"))
                .arg("--")
                .arg(&peer)
                .arg(&path)
                .arg(&dir)
                .arg(role);
            spawn_command(cmd)
        };
        let target = run("target");
        let t0 = Instant::now();
        let line = loop {
            if let Ok(s) = std::fs::read_to_string(dir.join("target"))
                && s.ends_with('\n')
            {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no target file");
            thread::sleep(Duration::from_millis(10));
        };
        let f: Vec<u64> = line
            .split_whitespace()
            .take(3)
            .map(|w| w.parse().expect("number"))
            .collect();
        let (tqpn, trkey, taddr) = (Qpn::new(f[0] as u32), f[1] as u32, f[2]);

        let gid = x.c.query_gid(1).expect("GID 1");
        einval("query another's QP", x.c.query_qp(tqpn));
        einval("modify another's QP", x.c.qp_to_init(tqpn, ACCESS));
        einval(
            "connect another's QP",
            x.c.qp_connect(tqpn, 1, gid, x.qp, 1, 1, Mtu::Mtu1024),
        );
        let sge = WireSge {
            addr: x.buf.addr,
            length: 64,
            lkey: x.lkey.value(),
        };
        einval(
            "post to another's send queue",
            x.c.post_send(
                tqpn,
                WireSendWr {
                    wr_id: 9,
                    op: WireOp::Write {
                        remote_addr: taddr,
                        rkey: trkey,
                    },
                    signaled: true,
                    sges: vec![sge],
                },
            ),
        );
        einval(
            "post to another's receive queue",
            x.c.post_recv(tqpn, 9, vec![sge]),
        );
        einval("destroy another's QP", x.c.destroy_qp(tqpn));
        // Every small PD, CQ and key number that is not the intruder's own.
        for h in 0..64u32 {
            if h != x.pd.0 {
                einval("free a guessed PD", x.c.dealloc_pd(PdId(h)));
                einval(
                    "register into a guessed PD",
                    x.c.reg_mr(PdId(h), x.buf.addr, 64, ACCESS),
                );
                einval(
                    "create a QP in a guessed PD",
                    x.c.create_qp(&QpInit::new(QpType::Rc, PdId(h), x.cq)),
                );
            }
            if h != x.cq.0 {
                einval("poll a guessed CQ", x.c.poll_cq(CqId(h), 1));
                einval(
                    "wait on a guessed CQ",
                    x.c.wait_cq(CqId(h), 1, Duration::from_millis(1)),
                );
                einval("destroy a guessed CQ", x.c.destroy_cq(CqId(h)));
                einval(
                    "create a QP on a guessed CQ",
                    x.c.create_qp(&QpInit::new(QpType::Rc, x.pd, CqId(h))),
                );
            }
        }
        for key in [
            trkey,
            trkey ^ 1,
            trkey.wrapping_sub(1),
            trkey.wrapping_add(1),
        ] {
            if key != x.lkey.value() {
                einval("deregister a guessed key", x.c.dereg_mr(LKey::new(key)));
            }
        }

        // The owner's transfer runs as if nothing happened.
        let writer = run("writer");
        let w = finish_within(writer, Duration::from_secs(30), "writer");
        let t = finish_within(target, Duration::from_secs(30), "target");
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        assert!(w.status.success(), "writer: {}", text(&w));
        assert!(
            t.status.success() && text(&t).contains("all right"),
            "target: {}",
            text(&t)
        );

        // RDMA between programs. The victim V and its legitimate peer P, connected; V
        // expects PSN 100 first.
        let mut v = Prog::new(&path, 0x55);
        let mut p = Prog::new(&path, 0x77);
        let (vq, pq) = (v.qp, p.qp);
        v.connect(vq, gid, pq, 100, 500);
        p.connect(pq, gid, vq, 500, 100);
        let legit = |p: &mut Prog, v: &Prog, off: u64, fill: u8| {
            p.buf.set(&vec![fill; 4096]);
            let sge = WireSge {
                addr: p.buf.addr,
                length: 64,
                lkey: p.lkey.value(),
            };
            let op = WireOp::Write {
                remote_addr: v.buf.addr + off,
                rkey: v.rkey,
            };
            p.post(pq, op, sge);
            let w = p.wc();
            assert_eq!(w.status, WcStatus::Success, "P's WRITE: {w:?}");
        };
        legit(&mut p, &v, 0, 0xa1);
        let mut want = vec![0x55u8; 4096];
        want[..64].fill(0xa1);
        assert_eq!(v.buf.bytes(), want, "P's WRITE landed in V");

        // 1. V's lkey in the intruder's own WRs, between two QPs of its own: a WRITE that
        // would read V's memory and a READ that would write into it both fail with a local
        // protection error; nothing moves.
        let (x1, x2) = (x.qp, x.qp());
        x.connect(x1, gid, x2, 1000, 2000);
        x.connect(x2, gid, x1, 2000, 1000);
        let x_before = x.buf.bytes();
        let vsge = WireSge {
            addr: v.buf.addr,
            length: 64,
            lkey: v.lkey.value(),
        };
        let own = |off: u64| WireOp::Write {
            remote_addr: x.buf.addr + off,
            rkey: x.rkey,
        };
        x.post(x1, own(1024), vsge);
        let w = x.wc();
        assert_eq!(w.status, WcStatus::LocProtErr, "WRITE from V's lkey: {w:?}");
        let read = WireOp::Read {
            remote_addr: x.buf.addr,
            rkey: x.rkey,
        };
        let x3 = x.qp();
        let x4 = x.qp();
        x.connect(x3, gid, x4, 3000, 4000);
        x.connect(x4, gid, x3, 4000, 3000);
        x.post(x3, read, vsge);
        let w = x.wc();
        assert_eq!(w.status, WcStatus::LocProtErr, "READ into V's lkey: {w:?}");
        assert_eq!(x.buf.bytes(), x_before, "nothing of V reached the intruder");
        assert_eq!(v.buf.bytes(), want, "V's memory untouched");

        // 2. A WRITE to V's QPN, with V's real rkey, at a PSN V does not expect: V counts
        // it and drops it (its PSN-sequence NAK goes to its real peer, P); the intruder hears
        // nothing and its WR fails once its retries run out.
        let x5 = x.qp();
        x.connect(x5, gid, vq, 7000, 100 + (1 << 22));
        let steal = WireOp::Write {
            remote_addr: v.buf.addr,
            rkey: v.rkey,
        };
        let xsge = WireSge {
            addr: x.buf.addr,
            length: 64,
            lkey: x.lkey.value(),
        };
        x.post(x5, steal, xsge);
        let w = x.wc();
        assert_eq!(
            w.status,
            WcStatus::RetryExcErr,
            "out-of-sequence WRITE: {w:?}"
        );
        assert!(counted(&ns, &ifname, vq, "out_of_seq_request") >= 1);
        assert_eq!(v.buf.bytes(), want, "V's memory untouched");
        assert_eq!(v.state(vq), QpState::Rts, "V's QP goes on");
        legit(&mut p, &v, 64, 0xa2);
        want[64..128].fill(0xa2);
        assert_eq!(v.buf.bytes(), want, "P's second WRITE landed in V");

        // 3. A WRITE at the PSN V expects (102: P sent 100 and 101), with a wrong rkey: V
        // NAKs it with a remote access error (to P, its peer), counts it, and goes to ERR, as
        // for a remote attacker's frame (the crafted-frame cases above); its memory stays.
        let x6 = x.qp();
        x.connect(x6, gid, vq, 8000, 102);
        let bad = WireOp::Write {
            remote_addr: v.buf.addr,
            rkey: v.rkey ^ 0x5a5a,
        };
        x.post(x6, bad, xsge);
        let w = x.wc();
        assert_eq!(w.status, WcStatus::RetryExcErr, "wrong-rkey WRITE: {w:?}");
        assert!(counted(&ns, &ifname, vq, "resp_remote_access_errors") >= 1);
        assert_eq!(v.buf.bytes(), want, "V's memory untouched");
        assert_eq!(
            v.state(vq),
            QpState::Err,
            "a remote access error ends V's QP"
        );

        drop((x, v, p));
        let out = finish_within(engine, Duration::from_secs(30), "engine");
        assert!(out.status.success(), "engine: {}", text(&out));
    }
}
