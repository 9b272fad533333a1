//! Shared scaffolding of the AF_XDP suites: two network namespaces joined by a veth pair,
//! `roce_xdp` loaded on both ends, and a windowed sender that verifies echoes byte for byte.
//!
//! Everything here fails loudly (panics) when it cannot run: these suites run as root in CI.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    thread::JoinHandle,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, PerCpuArray, XskMap},
    programs::{Xdp, XdpMode},
};
use nix::sched::{CloneFlags, setns};
use roce::{
    engine::{Handler, Nanos, RxVerdict, TxSink, swap_addresses},
    xsk::{GenConfig, RoceTemplate, XskQueue},
};
use roce_common::{
    counters::XdpStats,
    maps::{GLOBAL_FLAGS, MAP_QPS, MAP_XDP_STATS, MAP_XSKS, PROG_ROCE_XDP, QpEntry},
};

/// The QP both ends register in `ROCE_QPS`.
pub const QPN: u32 = 0x11;
pub const A_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0a];
pub const B_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0b];
pub const A_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// veth end in namespace A (the engine under test) and in B (the traffic source).
pub const A_IF: &str = "xa";
pub const B_IF: &str = "xb";

/// Runs a command and panics with its output if it fails.
#[track_caller]
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace created for this test, deleted on drop (also when the test panics).
pub struct Netns {
    pub name: String,
}

impl Netns {
    #[track_caller]
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "roce-xsk-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        Self { name }
    }

    /// Runs `cmd` inside the namespace.
    #[track_caller]
    pub fn run(&self, cmd: &[&str]) -> String {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(cmd);
        sh(&v)
    }

    /// Moves the calling thread into the namespace.
    pub fn enter(name: &str) {
        let f = File::open(format!("/run/netns/{name}"))
            .unwrap_or_else(|e| panic!("open netns {name}: {e}"));
        setns(&f, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {name}: {e}"));
    }

    /// Spawns a thread that runs `f` inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let name = self.name.clone();
        std::thread::spawn(move || {
            Self::enter(&name);
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two namespaces, A and B, joined by a veth pair with `queues` RX and TX queues per end.
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
}

impl Pair {
    #[track_caller]
    pub fn new(queues: u32) -> Self {
        let a = Netns::new("a");
        let b = Netns::new("b");
        let q = queues.to_string();
        a.run(&[
            "ip",
            "link",
            "add",
            A_IF,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            B_IF,
            "netns",
            &b.name,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
        ]);
        for (ns, ifname, mac, ip, peer_ip, peer_mac) in [
            (&a, A_IF, A_MAC, A_IP, B_IP, B_MAC),
            (&b, B_IF, B_MAC, B_IP, A_IP, A_MAC),
        ] {
            let mac = fmt_mac(mac);
            let peer_mac = fmt_mac(peer_mac);
            ns.run(&["ip", "link", "set", ifname, "address", &mac]);
            ns.run(&["ip", "addr", "add", &format!("{ip}/24"), "dev", ifname]);
            ns.run(&["ip", "link", "set", ifname, "up"]);
            ns.run(&["ip", "link", "set", "lo", "up"]);
            ns.run(&[
                "ip",
                "neigh",
                "replace",
                &peer_ip.to_string(),
                "lladdr",
                &peer_mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ]);
        }
        Self { a, b }
    }
}

pub fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `roce_xdp` loaded and attached (native mode) on one interface, with [`QPN`] registered.
/// Create and drop it in a thread inside the interface's namespace.
pub struct XdpProg {
    ebpf: Ebpf,
}

impl XdpProg {
    #[track_caller]
    pub fn attach(ifname: &str, qpns: &[u32]) -> Self {
        Self::attach_with_flags(ifname, qpns, 0)
    }

    /// Like [`XdpProg::attach`], with `ROCE_FLAGS` set (e.g. `FLAG_DROP_FOREIGN`).
    #[track_caller]
    pub fn attach_with_flags(ifname: &str, qpns: &[u32], flags: u32) -> Self {
        assert!(
            !roce::loader::EBPF_OBJECT.is_empty(),
            "roce-user was built with AYA_BUILD_SKIP=1: the eBPF object is a stub; \
             build without it to run the AF_XDP suites"
        );
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_FLAGS, &flags, true)
            .load(roce::loader::EBPF_OBJECT)
            .expect("load roce_xdp");
        let prog: &mut Xdp = ebpf
            .program_mut(PROG_ROCE_XDP)
            .expect("program roce_xdp")
            .try_into()
            .expect("an XDP program");
        prog.load().expect("verifier accepts roce_xdp");
        prog.attach(ifname, XdpMode::Driver)
            .unwrap_or_else(|e| panic!("attach roce_xdp to {ifname}: {e}"));
        let mut qps: HashMap<_, u32, QpEntry> =
            HashMap::try_from(ebpf.map_mut(MAP_QPS).expect("ROCE_QPS")).expect("hash map");
        for &q in qpns {
            qps.insert(
                q,
                QpEntry {
                    owner: std::process::id(),
                    flags: 0,
                },
                0,
            )
            .expect("insert QP");
        }
        Self { ebpf }
    }

    /// Points `ROCE_XSKS[queue]` at the socket.
    #[track_caller]
    pub fn set_xsk(&mut self, q: &XskQueue) {
        let mut xsks =
            XskMap::try_from(self.ebpf.map_mut(MAP_XSKS).expect("ROCE_XSKS")).expect("xskmap");
        xsks.set(q.queue_id(), q.as_raw_fd(), 0)
            .expect("set XSKS entry");
    }

    /// Removes the QPs so that RoCE traffic to them goes to the kernel.
    pub fn remove_qp(&mut self, qpn: u32) {
        let mut qps: HashMap<_, u32, QpEntry> =
            HashMap::try_from(self.ebpf.map_mut(MAP_QPS).expect("ROCE_QPS")).expect("hash map");
        let _ = qps.remove(&qpn);
    }

    /// `ROCE_XDP_STATS` summed over CPUs.
    pub fn stats(&self) -> XdpStats {
        let m: PerCpuArray<_, XdpStats> =
            PerCpuArray::try_from(self.ebpf.map(MAP_XDP_STATS).expect("stats map"))
                .expect("per-cpu array");
        let mut sum = XdpStats::default();
        for v in m.get(&0, 0).expect("stats entry").iter() {
            sum.add(v);
        }
        sum
    }
}

/// A [`GenConfig`] for frames from B to A.
pub fn b_to_a(size: usize) -> GenConfig {
    let mut g = GenConfig::new(B_IF);
    g.src_mac = B_MAC;
    g.dst_mac = A_MAC;
    g.src_ip = B_IP;
    g.dst_ip = A_IP;
    g.dest_qp = QPN;
    g.size = size;
    g
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
    last_progress: Option<Nanos>,
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
    fn on_rx(&mut self, now: Nanos, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
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

    fn poll_transmit(&mut self, now: Nanos, tx: &mut TxSink<'_>) {
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

    fn next_timeout(&self) -> Option<Nanos> {
        self.last_progress.map(|t| t.saturating_add(self.quiet))
    }

    fn on_timeout(&mut self, _now: Nanos) {
        self.tally.stalled = true;
    }

    fn is_done(&self, _now: Nanos) -> bool {
        self.tally.ok == self.total || self.tally.stalled
    }
}
