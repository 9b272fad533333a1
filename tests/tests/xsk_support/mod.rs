//! Shared scaffolding of the AF_XDP suites: two network namespaces joined by a veth pair,
//! `roce_xdp` loaded on both ends, and a windowed sender that verifies echoes byte for byte.
//!
//! Everything here fails loudly (panics) when it cannot run: these suites run as root in CI.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::{
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use roce::{
    engine::{
        EchoHandler, Engine, EngineConfig, EngineReport, GenConfig, Handler, Instant, RoceTemplate,
        RxVerdict, TxSink, swap_addresses,
    },
    loader::{self, AttachMode, LoadOptions, Pins},
    netns::{self, VethEnd, VethOptions, VethPair},
    xsk::{BindMode, FrameAccounting, XskConfig, XskQueue},
};
use roce_common::counters::XdpStats;

/// The QP both ends register in `ROCE_QPS` (roce-xdp's first QPN).
pub const QPN: u32 = roce_common::maps::FIRST_QPN;

/// Fails (never skips) when not root.
#[track_caller]
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the AF_XDP suites need root (netns, XDP, AF_XDP); run them through `cargo xtask test`"
    );
}

/// Two namespaces, A (the engine under test) and B (the traffic source), joined by a veth pair
/// with `queues` RX and TX queues per end. Dropping it deletes both namespaces (also when the
/// test panics).
pub struct Pair {
    pub veth: VethPair,
}

impl Pair {
    #[track_caller]
    pub fn new(queues: u32) -> Self {
        Self::with_mtu(queues, VethOptions::default().mtu)
    }

    /// [`Pair::new`] with links of IP MTU `mtu` (above ~3500 native XDP is refused on veth:
    /// use [`XdpProg::attach_mode`] with [`AttachMode::Skb`]).
    #[track_caller]
    pub fn with_mtu(queues: u32, mtu: u32) -> Self {
        require_root();
        static N: AtomicU32 = AtomicU32::new(0);
        // Unique per process and pair, at most 14 characters (interface names add one).
        let prefix = format!(
            "xk{}n{}",
            std::process::id() % 1_000_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        let veth = VethPair::new(
            &prefix,
            &VethOptions {
                queues,
                mtu,
                ..VethOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("veth pair {prefix}: {e}"));
        Self { veth }
    }

    pub fn a(&self) -> &VethEnd {
        &self.veth.a
    }

    pub fn b(&self) -> &VethEnd {
        &self.veth.b
    }

    /// Spawns a thread that runs `f` inside A's namespace.
    pub fn in_a<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        spawn_in(&self.veth.a.netns, f)
    }

    /// Spawns a thread that runs `f` inside B's namespace.
    pub fn in_b<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        spawn_in(&self.veth.b.netns, f)
    }

    /// A [`GenConfig`] for frames from B to A, on B's interface.
    pub fn b_to_a(&self, size: usize) -> GenConfig {
        let (a, b) = (self.a(), self.b());
        let mut g = GenConfig::new(&b.ifname);
        g.src_mac = b.mac;
        g.dst_mac = a.mac;
        g.src_ip = b.ipv4;
        g.dst_ip = a.ipv4;
        g.dest_qp = QPN;
        g.size = size;
        g
    }
}

fn spawn_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap_or_else(|e| panic!("enter {ns}: {e}"));
        f()
    })
}

/// `roce_xdp` loaded by `roce::loader` (native mode) on one interface, with the given QPs
/// registered; unloaded on drop. Create it in a thread inside the interface's namespace.
pub struct XdpProg {
    ifname: String,
    pins: Pins,
}

impl XdpProg {
    #[track_caller]
    pub fn attach(ifname: &str, qpns: &[u32]) -> Self {
        Self::attach_with(ifname, qpns, false)
    }

    /// Like [`XdpProg::attach`]; `drop_foreign` drops RoCE for QPs that are not registered.
    #[track_caller]
    pub fn attach_with(ifname: &str, qpns: &[u32], drop_foreign: bool) -> Self {
        Self::load(ifname, qpns, drop_foreign, AttachMode::Native)
    }

    /// Like [`XdpProg::attach`] in attach mode `mode`.
    #[track_caller]
    pub fn attach_mode(ifname: &str, qpns: &[u32], mode: AttachMode) -> Self {
        Self::load(ifname, qpns, false, mode)
    }

    #[track_caller]
    fn load(ifname: &str, qpns: &[u32], drop_foreign: bool, mode: AttachMode) -> Self {
        let opts = LoadOptions {
            mode,
            drop_foreign,
            ..LoadOptions::default()
        };
        loader::load(ifname, &opts).unwrap_or_else(|e| panic!("load roce_xdp on {ifname}: {e}"));
        let prog = Self {
            ifname: ifname.to_owned(),
            pins: Pins::new(ifname),
        };
        for &q in qpns {
            prog.pins
                .add_qp(q, std::process::id())
                .unwrap_or_else(|e| panic!("register QP {q}: {e}"));
        }
        prog
    }

    /// Points `ROCE_XSKS[queue]` at the socket.
    #[track_caller]
    pub fn set_xsk(&mut self, q: &XskQueue) {
        let mut xsks = self.pins.xsks().expect("ROCE_XSKS");
        xsks.set(q.queue_id(), q.as_raw_fd(), 0)
            .expect("set XSKS entry");
    }

    /// Sets the `ROCE_QPS` entry flags of `qpn` (`roce_common::maps::QP_FLAG_*`).
    #[track_caller]
    pub fn set_qp_flags(&self, qpn: u32, flags: u32) {
        self.pins
            .add_qp_flags(qpn, std::process::id(), flags)
            .unwrap_or_else(|e| panic!("flags of QP {qpn}: {e}"));
    }

    /// `ROCE_XDP_STATS` summed over CPUs.
    pub fn stats(&self) -> XdpStats {
        self.pins.xdp_stats().expect("ROCE_XDP_STATS")
    }
}

impl Drop for XdpProg {
    fn drop(&mut self) {
        if let Err(e) = loader::unload(&self.ifname) {
            eprintln!("unload roce_xdp from {}: {e}", self.ifname);
        }
    }
}

/// What a [`WindowSender`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderTally {
    pub sent: u64,
    /// Echoes byte-identical to the frame sent with its MAC and IP addresses swapped.
    pub ok: u64,
    pub corrupt: u64,
    pub duplicate: u64,
    /// Frames whose sequence number is not one this sender sent.
    pub foreign: u64,
    pub stalled: bool,
}

/// Sends `total` template frames with sequence numbers `base..base + total`, at most `window`
/// unacknowledged (None: flat out), and checks each echo against the expected bytes.
pub struct WindowSender {
    tmpl: RoceTemplate,
    scratch: Vec<u8>,
    base: u64,
    total: u64,
    window: Option<u64>,
    seen: Vec<u64>,
    pub tally: SenderTally,
    last_progress: Option<Instant>,
    /// With a window: give up after this long without progress. Without: stop after this
    /// long without an echo once everything is sent.
    pub quiet: Duration,
}

impl WindowSender {
    pub fn new(tmpl: RoceTemplate, base: u64, total: u64, window: Option<u64>) -> Self {
        Self {
            scratch: vec![0; tmpl.len()],
            tmpl,
            base,
            total,
            window,
            seen: vec![0; total.div_ceil(64) as usize],
            tally: SenderTally::default(),
            last_progress: None,
            quiet: Duration::from_secs(3),
        }
    }
}

impl Handler for WindowSender {
    fn on_rx(&mut self, now: Instant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        self.last_progress = Some(now);
        let Some(seq) = RoceTemplate::seq_of(frame) else {
            self.tally.foreign += 1;
            return RxVerdict::Recycle;
        };
        let Some(i) = seq.checked_sub(self.base).filter(|i| *i < self.tally.sent) else {
            self.tally.foreign += 1;
            return RxVerdict::Recycle;
        };
        let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        if self.seen[w] & bit != 0 {
            self.tally.duplicate += 1;
            return RxVerdict::Recycle;
        }
        let len = self.tmpl.write(&mut self.scratch, seq);
        swap_addresses(&mut self.scratch[..len]);
        if frame == &self.scratch[..len] {
            self.seen[w] |= bit;
            self.tally.ok += 1;
        } else {
            self.tally.corrupt += 1;
        }
        RxVerdict::Recycle
    }

    fn poll_transmit(&mut self, now: Instant, tx: &mut TxSink<'_>) {
        self.last_progress.get_or_insert(now);
        let mut n = self.total - self.tally.sent;
        if let Some(w) = self.window {
            n = n.min((self.tally.ok + w).saturating_sub(self.tally.sent));
        }
        n = n.min(tx.room() as u64);
        for _ in 0..n {
            let seq = self.base + self.tally.sent;
            if tx.send(|buf| self.tmpl.write(buf, seq)).is_err() {
                break;
            }
            self.tally.sent += 1;
            self.last_progress = Some(now);
        }
    }

    fn next_timeout(&self) -> Option<Instant> {
        self.last_progress.map(|t| t.saturating_add(self.quiet))
    }

    fn on_timeout(&mut self, _now: Instant) {
        self.tally.stalled = true;
    }

    fn is_done(&self, _now: Instant) -> bool {
        self.tally.ok == self.total || self.tally.stalled
    }
}

/// What A's echo engine did, and where its frames were before and after.
pub struct EchoSide {
    pub report: EngineReport,
    pub start: FrameAccounting,
    pub end: FrameAccounting,
    pub echo: EchoHandler,
    pub xdp: XdpStats,
    /// How A's socket was bound.
    pub bind: BindMode,
}

/// Starts A: roce_xdp attached in `mode` and an echo engine on a socket opened with `cfg`,
/// until the returned flag is set. Returns once the socket is registered.
#[track_caller]
pub fn echo_in_a(
    pair: &Pair,
    cfg: XskConfig,
    mode: AttachMode,
) -> (JoinHandle<EchoSide>, Arc<AtomicBool>) {
    let a_if = pair.a().ifname.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let a_stop = Arc::clone(&stop);
    let a = pair.in_a(move || {
        let mut prog = XdpProg::attach_mode(&a_if, &[QPN], mode);
        let q = XskQueue::open(&a_if, 0, &cfg).expect("open A queue 0");
        assert_eq!(q.multi_buffer(), cfg.multi_buffer);
        let start = q.accounting();
        let bind = q.bind_mode();
        prog.set_xsk(&q);
        ready_tx.send(()).expect("ready");
        let mut e = Engine::new(q, EchoHandler::default(), EngineConfig::default());
        let report = e.run(&a_stop).expect("engine A");
        let (mut q, echo) = e.into_parts();
        q.refill();
        EchoSide {
            report,
            start,
            end: q.accounting(),
            echo,
            xdp: prog.stats(),
            bind,
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("engine A did not come up");
    (a, stop)
}
