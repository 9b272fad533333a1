//! `roce perf write|read|send|atomic`: bandwidth tests between two endpoints, set up with
//! perftest's out-of-band exchange (see `roce::cm::perftest`), so that either side can be
//! ib_write_bw, ib_read_bw, ib_send_bw or ib_atomic_bw.
//!
//! The client (given a host) is the active side; the server exposes its buffers (WRITE, READ,
//! atomics) or receives (SEND). Both sides verify the data: each QP's buffer holds a pattern
//! derived from the QP index and the size. The server checks what was written or sent into it,
//! the client checks what it read back, and atomics are checked against the exact sum.
//!
//! The run goes in steps, one file each: check the arguments ([`Plan`]), set up the device and
//! the QPs (`setup.rs`), perftest's exchange that connects them (`exchange.rs`), the test
//! itself (`bw.rs` for bandwidth, `lat.rs` for `--lat`, sampled by `trace.rs`), the data
//! checks (`verify.rs`) and the report (`report.rs`).

mod bw;
mod exchange;
mod lat;
mod rdmacm;
mod report;
mod setup;
mod trace;
mod verify;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use roce::{
    api::{Mtu, RdmaDevice},
    cm::perftest,
    transport::DeviceConfig,
};

use self::{
    exchange::Session,
    report::{Outcome, PerfResult},
    setup::Local,
    trace::Tracer,
};
use super::{Output, interrupted, progress::Progress};

/// The operation to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfOp {
    /// RDMA WRITE (ib_write_bw).
    Write,
    /// RDMA READ (ib_read_bw).
    Read,
    /// SEND/RECV (ib_send_bw).
    Send,
    /// Atomics (ib_atomic_bw): fetch-and-add, or compare-and-swap with `--cmp-swap`.
    Atomic,
}

/// perftest-like flags.
#[derive(Debug, Args)]
pub struct PerfArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub op: PerfOp,
    /// Server to connect to; without it, wait for a client.
    pub host: Option<String>,
    /// Interface to use (perftest: IB device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: String,
    /// If this run loads roce_xdp itself, start it with its log records on at this level
    /// (read them with `roce log -i DEV`).
    #[arg(long, value_enum, default_value_t = crate::cli::log::LoadLevel::Off)]
    pub log_level: crate::cli::log::LoadLevel,
    /// TCP port of the out-of-band exchange (with -R: the RDMA CM port).
    #[arg(short, long, default_value_t = perftest::DEFAULT_PORT)]
    pub port: u16,
    /// Connect through RDMA CM, as perftest's `-R`: no TCP socket; perftest's exchange runs
    /// over a control connection that RDMA CM sets up on --port (its key messages then binary),
    /// and each data QP is connected through RDMA CM on the same port (REQ, REP, RTU), then
    /// disconnected at the end. Talks to `ib_write_bw -R`, `ib_read_bw -R`, `ib_send_bw -R`
    /// (either side) and to `roce perf -R`. perftest's -R takes IPv4 addresses only; between
    /// two `roce perf -R` IPv6 works too. As client, a data REQ rejected because the server
    /// does not listen yet (perftest 4.5's server listens only after its last sync) is sent
    /// again, up to 40 times within about 8 s. A peer that goes away mid-exchange or mid-run
    /// fails the run: one that closed the connection at once, one that stopped answering
    /// (killed on a user-space CM, which sends no DREQ) within about 10 s, through a
    /// zero-length RDMA WRITE on the control connection after each quiet second. Uses the
    /// interface's QP 1 (one RDMA CM user per interface); not with --engine or --lat.
    #[arg(short = 'R', long = "rdma-cm")]
    pub rdma_cm: bool,
    /// Message size in bytes (atomics: 8).
    #[arg(short, long, default_value_t = 65536)]
    pub size: u32,
    /// Messages per QP (ignored with -D).
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u64,
    /// Run for SECS seconds instead of a number of messages.
    #[arg(short = 'D', long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096, at most what the link's MTU carries (1024 on a
    /// 1500-byte link). 4096 needs a jumbo link, where the AF_XDP sockets take multi-buffer
    /// packets (Linux 6.6+); a path MTU the device cannot carry is refused up front.
    #[arg(short, long, default_value_t = 1024)]
    pub mtu: u32,
    /// Outstanding work requests per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Receive queue depth per QP (perftest's `-r`), and each QP's `max_recv_wr` (at most
    /// `DeviceConfig::max_qp_wr`, 16384). A SEND server posts this many receives on every QP
    /// before it answers the client, and reposts one for each receive that completes before it
    /// polls again, as ib_send_bw does. Send bandwidth: at least the tx depth (the sender never
    /// has more SENDs in flight than the receiver posted; both sides take the same `-t` and
    /// `-r`), default 512 (perftest's `DEF_RX_SEND`), at most the slots `--span` holds.
    /// Otherwise the default is the tx depth.
    #[arg(short = 'r', long = "rx-depth", value_name = "N")]
    pub rx_depth: Option<u32>,
    /// Local GID index.
    #[arg(short = 'g', long = "gid-index")]
    pub gid_idx: Option<usize>,
    /// Atomics: compare-and-swap instead of fetch-and-add.
    #[arg(long)]
    pub cmp_swap: bool,
    /// Run to completion on the client: this thread drives the AF_XDP queues each time it
    /// posts or polls, instead of handing work to an engine thread per queue. The server
    /// always keeps its engine threads (it waits on the out-of-band socket while the client
    /// sends, and someone must answer). roce-xdp's own flag, not perftest's.
    #[arg(long)]
    pub inline: bool,
    /// Use the device of `roce engine -i DEV`, started beforehand in this namespace, instead
    /// of opening the interface in this process: the server and the client of one test (or
    /// any number of programs) then share the interface (docs/multiprocess.md). Every verb is
    /// a round trip on the engine's socket and every payload byte a read or write of its `/proc/PID/mem`
    /// of the engine, far slower than the in-process default. The device options (--cc*,
    /// --line-rate, --max-*, --sharded, --inline, --trace, --log-level) are the engine's and
    /// are refused here. roce-xdp's own flag.
    #[arg(long)]
    pub engine: bool,
    /// Don't check the data: for a peer that is the real perftest, whose buffers hold random
    /// bytes (perftest never checks data either).
    #[arg(long)]
    pub no_verify: bool,
    /// Latency instead of bandwidth, as ib_write_lat / ib_send_lat: one message at a time,
    /// each side answering the other's (WRITE: the last byte of the message carries the
    /// iteration number, polled in memory; SEND: one receive completion per message). 1 QP.
    #[arg(long)]
    pub lat: bool,
    /// Transport retries before a WR fails with retry exceeded (perftest's 7 means "forever"
    /// to rxe and to us, as to rxe's completer).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub retry_cnt: u8,
    /// Local ACK timeout exponent, as perftest's: 4.096 µs × 2^TIMEOUT (14: 67 ms).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Congestion control of every QP: dcqcn (ECN-marked data, CNPs, DCQCN pacing; needs a
    /// path that marks ECN), swift (delay-based, from the RTT of ACKs: for peers and paths that
    /// mark nothing, as Soft-RoCE, a VM's tap or a software switch), or off.
    #[arg(long, value_enum, default_value_t = CcMode::On)]
    pub cc: CcMode,
    /// A congestion-control parameter under its mlx5 name, e.g. `--cc-set rpg_ai_rate=10`,
    /// `--cc-set min_time_between_cnps=50` (repeatable; also rp_enabled / np_enabled = 0|1, and
    /// loss_backoff=1: cut the rate on each loss, for peers and paths that mark nothing (a retry
    /// halves it, a replayed READ takes it to the rate the requester took responses at), and
    /// clock READ responses by the peer's answers to ACK-eliciting probes (counted in
    /// rp_probe_sent / rp_probe_answered / rp_probe_lost), on in the software profile;
    /// hold_when_idle=0|1: no rate increase for periods in which the QP sent less than half
    /// its rate while the pacer held nothing back, on in the software profile).
    /// With --cc swift: swift_base_target (µs), swift_fs_range (µs), swift_fs_min_cwnd
    /// (/1000 packets), swift_fs_max_cwnd (packets), swift_ai (/1000 packets per RTT),
    /// swift_beta (/1000), swift_max_mdf (/1000), swift_min_cwnd (/1000 packets),
    /// swift_max_cwnd, swift_init_cwnd (packets), swift_retx_reset (timeouts), swift_persist
    /// (µs a delay must stay over the target before it cuts), swift_base_rtt_window (ms over
    /// which the smallest RTT is the base the target counts from; 0: none).
    #[arg(long = "cc-set", value_name = "NAME=VALUE")]
    pub cc_set: Vec<String>,
    /// The DCQCN and Swift defaults that `--cc-set` changes: `mlx5` (a ConnectX-5's firmware
    /// values, and the paper's Swift) or `software` (for endpoints on a busy host: DCQCN timers
    /// longer than a scheduler time slice, hold_when_idle and loss_backoff: the profile for
    /// Soft-RoCE peers and VM taps; Swift's swift_persist 500 µs and swift_base_rtt_window
    /// 10 s; docs/cc-software.md lists what differs).
    #[arg(long = "cc-profile", value_name = "PROFILE", default_value = "mlx5",
          value_parser = clap::builder::PossibleValuesParser::new(roce::cc::DcqcnConfig::PROFILES))]
    pub cc_profile: String,
    /// The line rate DCQCN starts from and recovers to (e.g. 10gbit, 1gbit, bits/s).
    #[arg(long, value_name = "RATE", default_value = "10gbit", value_parser = parse_rate)]
    pub line_rate: u64,
    /// Record each QP's DCQCN state over the run (rate, target rate, α, CNPs received, bytes
    /// sent) as CSV, for `roce plot FILE.csv -o rate.svg`. The sending side's trace shows the
    /// sawtooth (the client for write/send/atomic, the server for read, whose responses carry
    /// the data).
    #[arg(long, value_name = "FILE.csv")]
    pub trace: Option<String>,
    /// Milliseconds between two trace samples.
    #[arg(long, value_name = "MS", default_value_t = 1.0, requires = "trace")]
    pub trace_interval: f64,
    /// WRITE/READ/SEND: give message k its own place, offset (k × size) mod SPAN, in SPAN-byte
    /// buffers holding the QP's pattern at every offset, so every byte of every message is
    /// checked at the far end (a lost or stale packet shows), not only the last message. Both
    /// sides need the same SPAN; it is a multiple of the size and at least size × tx-depth.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub span: u64,
    /// Progress on stderr: the client's work requests posted and completed per QP (with -j
    /// `{"progress": {"secs": .., "qpn": [..], "posted": [..], "done": [..]}}`, for watching a
    /// long run for stuck QPs), the server's messages received.
    #[command(flatten)]
    pub progress: super::progress::ProgressArgs,
    /// Most packets in flight (sent, not yet acknowledged) over all QPs together
    /// (`DeviceConfig::max_inflight_pkts`; 0: no limit). Each QP's own window is 128 PSNs, so
    /// this matters with many QPs: 1024 QPs without it overrun the peer's receive ring.
    #[arg(long, value_name = "PKTS", default_value_t = roce::transport::DeviceConfig::default().max_inflight_pkts)]
    pub max_inflight: u32,
    /// Answer every request that asks for an ACK (BTH AckReq) with an ACK of its own, as
    /// Soft-RoCE does, instead of one cumulative ACK per QP for the requests of one receive
    /// batch, at most 8 each (IBA 9.7.5.1; `DeviceConfig::coalesce_acks`, counted in the
    /// device counter `ack_coalesced`).
    #[arg(long)]
    pub no_ack_coalescing: bool,
    /// Receive moderation, like a NIC's `ethtool -C IFACE rx-usecs N`: an idle engine thread
    /// woken by a frame waits N microseconds more before it takes the frames, so that frames
    /// arriving tens of microseconds apart cost one wake-up and their ACKs leave together
    /// (`EngineConfig::rx_usecs`). Adds up to N µs to each answer at low rates; a busy engine
    /// never waits. For a peer that shares this host's cores, such as a Soft-RoCE VM on the
    /// same machine (BENCHMARKS.md, "Receive moderation"). 0 (the default): every frame at
    /// once, at most 10,000 (the RX ring must hold what arrives meanwhile). Not with
    /// `--inline` on the client, which runs no engine thread. roce-xdp's own flag.
    #[arg(long, value_name = "USECS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub rx_usecs: u32,
    /// One transport per RX queue of the interface, each driven by its own queue's engine
    /// thread (`DeviceOptions::sharded`): QP k lives on queue k mod queues, with a PD and CQ
    /// per queue. The --max-inflight budget applies per queue. For interfaces with several
    /// RX queues (`ip link add ... numrxqueues N`); with one queue it changes nothing.
    #[arg(long)]
    pub sharded: bool,
    /// Offer the multipath extension on every QP (docs/multipath.md): towards a roce-xdp peer
    /// that offers it too, SEND and WRITE packets are placed out of order and lost packets
    /// are resent selectively (SACK ACKs); towards any other peer (Soft-RoCE, a NIC) every
    /// packet stays plain RoCE v2 but for one reserved BTH bit. roce-xdp's own flag.
    #[arg(long)]
    pub multipath: bool,
    /// With --multipath: the entropies (UDP source ports) each QP sprays its packets over
    /// once the extension is on; 1 keeps every packet on one path.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub entropies: u8,
    /// All QPs share one exposed and one local memory region of `max(size, 4096)` bytes (per
    /// transport of a sharded device), holding the same bytes: every QP sends QP 0's pattern,
    /// and the data checks read the shared buffers. Without it each QP registers two regions
    /// of its own (perftest's `--mr_per_qp` likewise gives each QP its own buffers, and its
    /// default one region still has a slice per QP), so the application's memory grows by
    /// twice the message size per QP; with it, what grows with `-q` is the QPs' own state.
    /// Write, read and send bandwidth runs without --span.
    #[arg(long)]
    pub shared_mr: bool,
    /// Most QPs this endpoint creates (`DeviceConfig::max_qp`); `-q` beyond it is refused.
    #[arg(long, value_name = "N", default_value_t = roce::transport::DeviceConfig::default().max_qp)]
    pub max_qp: usize,
    /// Most memory regions this endpoint registers (`DeviceConfig::max_mr`, at most 65535).
    #[arg(long, value_name = "N", default_value_t = roce::transport::DeviceConfig::default().max_mr)]
    pub max_mr: usize,
    /// READs and atomics the peer may have outstanding per QP, the responder resources
    /// (`max_dest_rd_atomic`, rxe's limit 128): one more while all are still answering takes
    /// the oldest one's place, as in rxe's ring, counted in `rd_atomic_evicted`.
    #[arg(long, value_name = "N", default_value_t = OUT_READS,
          value_parser = clap::value_parser!(u8).range(1..=128))]
    pub max_rd_atomic: u8,
}

/// `--cc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CcMode {
    /// DCQCN (default; `on` is the same).
    #[value(name = "dcqcn", alias = "on")]
    On,
    /// Swift: delay-based, needs no ECN marks.
    Swift,
    /// No ECT on data, no CNPs, no rate limit.
    Off,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    let l = s.trim().to_ascii_lowercase();
    let body = ["bit/s", "bps", "bit"]
        .iter()
        .find_map(|t| l.strip_suffix(t))
        .unwrap_or(&l);
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1e3),
        Some('m') => (&body[..body.len() - 1], 1e6),
        Some('g') => (&body[..body.len() - 1], 1e9),
        _ => (body, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate such as 10gbit or 200mbit"))?;
    let v = v * mult;
    if !(1.0..1e13).contains(&v) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

/// The outstanding RDMA READs and atomics we accept as responder (`max_dest_rd_atomic`) unless
/// `--max-rd-atomic` says otherwise: 128, rxe's limit and the most the transport takes.
/// perftest announces its device's limit and the peer's requester keeps that many in flight;
/// with 16 (mlx5's) an `ib_read_bw -q 4 -s 4096` from rxe ran at 0.54-0.95x of rxe ↔ rxe,
/// with 128 at 0.82-1.91x (docs/interop.md). A resource is ~48 bytes and held only while
/// in use, so the larger table costs nothing until a peer fills it.
const OUT_READS: u8 = 128;

fn mtu_enum(bytes: u32) -> Option<u8> {
    Some(match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => return None,
    })
}

/// The receive queue depth a send bandwidth run uses without `--rx-depth`: perftest's
/// `DEF_RX_SEND`. Four times the default tx depth, so the receiver may fall 384 messages behind
/// in reposting before the sender, which keeps at most 128 in flight, can find its receive queue
/// empty (IBA 9.7.5.2.8: the responder then answers with an RNR NAK and the requester waits).
const DEF_RX_SEND: u32 = 512;

/// `--rx-depth`, or its default: for send bandwidth [`DEF_RX_SEND`], but no more receives than
/// `--span` has slots for (each receive has a slot of its own there) and never fewer than the
/// tx depth `depth`; otherwise `depth`.
fn rx_depth(a: &PerfArgs, size: u32, depth: u32) -> u32 {
    if let Some(r) = a.rx_depth {
        return r.max(1);
    }
    if a.op != PerfOp::Send || a.lat {
        return depth;
    }
    let slots = if a.span == 0 {
        u64::from(DEF_RX_SEND)
    } else {
        a.span / u64::from(size.max(1))
    };
    u32::try_from(slots.min(u64::from(DEF_RX_SEND)))
        .unwrap_or(DEF_RX_SEND)
        .max(depth)
}

/// The arguments checked, and what follows from them. Built first, before anything is opened.
struct Plan {
    /// We connect (`host` given) rather than wait for a client.
    client: bool,
    /// Bytes per message (8 for atomics).
    size: u32,
    /// The MTU asked for (the agreed one is the session's).
    mtu: Mtu,
    /// `mtu` as perftest's exchange codes it (1 for 256 .. 5 for 4096).
    mtu_code: u8,
    /// `--span` in bytes (0 without).
    span: usize,
    /// Send queue depth.
    depth: u32,
    /// Receive queue depth.
    rx_depth: u32,
}

impl Plan {
    /// Checks the combination of arguments clap cannot.
    fn new(a: &PerfArgs) -> anyhow::Result<Self> {
        let client = a.host.is_some();
        let size = if a.op == PerfOp::Atomic { 8 } else { a.size };
        if size == 0 || a.qps == 0 || a.tx_depth == 0 {
            bail!("--size, --qp and --tx-depth must be positive");
        }
        let mtu = Mtu::from_bytes(a.mtu).with_context(|| format!("invalid MTU {}", a.mtu))?;
        let mtu_code = mtu_enum(a.mtu).with_context(|| format!("invalid MTU {}", a.mtu))?;
        if let Some(d) = a.duration
            && !(d.is_finite() && d > 0.0)
        {
            bail!("-D takes a positive number of seconds");
        }
        if a.rdma_cm && a.lat {
            bail!("-R (RDMA CM) is for the bandwidth tests, not --lat");
        }
        if a.rx_usecs != 0 && a.inline && client {
            bail!(
                "--rx-usecs moderates the engine threads, and --inline runs none on the client: \
                 drop one of them"
            );
        }
        if a.lat
            && (a.qps != 1 || !matches!(a.op, PerfOp::Write | PerfOp::Send) || a.duration.is_some())
        {
            bail!("--lat measures write or send, on 1 QP, for -n iterations");
        }
        if a.span != 0
            && (a.lat
                || a.op == PerfOp::Atomic
                || !a.span.is_multiple_of(u64::from(size))
                || a.span < u64::from(size) * u64::from(a.tx_depth.max(a.rx_depth.unwrap_or(0)))
                || a.span > 1 << 32)
        {
            bail!(
                "--span is for write, read and send bandwidth runs: a multiple of --size, at least \
                 size x the deeper of tx-depth and rx-depth ({}), at most 4 GiB",
                u64::from(size) * u64::from(a.tx_depth.max(a.rx_depth.unwrap_or(0)))
            );
        }
        if a.shared_mr && (a.lat || a.op == PerfOp::Atomic || a.span != 0) {
            bail!(
                "--shared-mr is for write, read and send bandwidth runs without --span: atomics \
                 count per QP, --lat polls each QP's buffer and --span gives each message of a QP \
                 its own place"
            );
        }
        let span = a.span as usize;
        let depth = a.tx_depth.max(1);
        let rx_depth = rx_depth(a, size, depth);
        if a.op == PerfOp::Send && !a.lat && rx_depth < depth {
            bail!(
                "--rx-depth ({rx_depth}) must be at least --tx-depth ({depth}) for send: the \
                 receiver keeps --rx-depth receives posted and the sender at most --tx-depth \
                 SENDs in flight, so that no SEND finds the receive queue empty (an RNR NAK)"
            );
        }
        Ok(Self {
            client,
            size,
            mtu,
            mtu_code,
            span,
            depth,
            rx_depth,
        })
    }
}

/// With `--engine`, the arguments that set up a device of this process, which the engine's
/// device does not take from a program: refused, rather than silently ignored.
fn check_engine_args(a: &PerfArgs) -> anyhow::Result<()> {
    let d = DeviceConfig::default();
    crate::cli::engine::refuse_own_device_options(&[
        (a.inline, "--inline"),
        (a.sharded, "--sharded"),
        (a.trace.is_some(), "--trace"),
        (
            a.log_level != crate::cli::log::LoadLevel::Off,
            "--log-level",
        ),
        (a.cc != CcMode::On, "--cc"),
        (a.multipath, "--multipath"),
        (a.entropies != d.multipath_entropies, "--entropies"),
        (!a.cc_set.is_empty(), "--cc-set"),
        (a.cc_profile != "mlx5", "--cc-profile"),
        (a.line_rate != 10_000_000_000, "--line-rate"),
        (a.max_inflight != d.max_inflight_pkts, "--max-inflight"),
        (a.no_ack_coalescing, "--no-ack-coalescing"),
        (a.rx_usecs != 0, "--rx-usecs"),
        (a.max_qp != d.max_qp, "--max-qp"),
        (a.max_mr != d.max_mr, "--max-mr"),
    ])
}

/// `roce perf`: checks the arguments, opens the device (in this process, or the engine's
/// with `--engine`), sets up, connects, runs the test, exchanges the reports, verifies and
/// prints. Fails (exit 1) when the data do not check out.
pub(crate) fn run(out: Output, a: &PerfArgs, netns: Option<String>) -> anyhow::Result<()> {
    let plan = Plan::new(a)?;
    if a.engine {
        if a.rdma_cm {
            bail!(crate::cli::engine::NO_CM_THROUGH_ENGINE);
        }
        check_engine_args(a)?;
        let dev = crate::cli::engine::connect_device(&a.dev)?;
        return run_on(out, a, &plan, &dev, None);
    }
    let dev = setup::open_device(a, &plan, netns)?;
    let r = run_on(out, a, &plan, &dev, Some(&dev));
    dev.close();
    r
}

/// The run on an open device (`cm_dev`: the same, when it is this process's, for `-R`): set
/// up, connect, measure, exchange the reports, verify, print.
fn run_on<D: RdmaDevice>(
    out: Output,
    a: &PerfArgs,
    plan: &Plan,
    dev: &D,
    cm_dev: Option<&roce::api::Device>,
) -> anyhow::Result<()> {
    let mut local = Local::new(dev, a, plan)?;
    let mut session = Session::connect(dev, cm_dev, a, plan, &mut local)?;
    let result = measure(out, dev, a, plan, &local, &mut session)?;
    let theirs = session.finish(a, plan, &local.qps, &result)?;
    session.close(cm_dev, plan.client);
    // The passive side verifies what landed in its buffers, now that the client is finished.
    let mut verified = result.verified;
    if !plan.client && !a.no_verify && !a.lat {
        verified = verify::verify_server(dev, a, &local.qps, plan.size, theirs.iters)?;
    }
    let outcome = Outcome {
        result,
        theirs,
        verified,
    };
    report::emit(out, a, plan, dev, &session, &outcome);
    if !verified && !a.no_verify {
        bail!("data verification failed");
    }
    Ok(())
}

/// Runs the test the arguments ask for (latency, or bandwidth as client or server), sampling
/// `--trace` as it goes and writing it at the end.
fn measure<D: RdmaDevice>(
    out: Output,
    dev: &D,
    a: &PerfArgs,
    plan: &Plan,
    local: &Local,
    session: &mut Session<'_>,
) -> anyhow::Result<PerfResult> {
    let (cqs, qps, size) = (&local.cqs, &local.qps, plan.size);
    let mut tracer = Tracer::new(a)?;
    let mut progress = Progress::new(&a.progress, out)?;
    let result = if a.lat {
        lat::run_lat(dev, a, cqs, &qps[0], size, plan.client, &mut progress)?
    } else if plan.client {
        bw::run_client(dev, a, cqs, qps, size, &mut tracer, &mut progress)?
    } else {
        bw::run_server(
            dev,
            a,
            cqs,
            qps,
            (size, plan.rx_depth),
            &mut session.comm,
            (&mut tracer, &mut progress),
        )?
    };
    // Erase a redrawn progress line before the report.
    drop(progress);
    Tracer::poll(&mut tracer, dev);
    if let (Some(t), Some(path)) = (&tracer, &a.trace) {
        std::fs::write(path, t.trace.to_csv())
            .with_context(|| format!("writing the trace {path}"))?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn plan(args: &str) -> anyhow::Result<Plan> {
        let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.split_whitespace()))?;
        Plan::new(&cli.perf)
    }

    fn engine_args(args: &str) -> anyhow::Result<()> {
        let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.split_whitespace()))?;
        check_engine_args(&cli.perf)
    }

    #[test]
    fn engine_refuses_the_options_of_a_device_of_this_process() {
        // perf's defaults, and the test's own options, go through the engine.
        engine_args("write -d x --engine -s 4096 -n 10 -t 16 --span 65536 -q 2 -m 1024").unwrap();
        engine_args("read -d x --engine --max-rd-atomic 128 --no-verify").unwrap();
        for (args, named) in [
            ("write -d x --engine --sharded", "--sharded"),
            ("write -d x --engine --inline", "--inline"),
            ("write -d x --engine --cc off", "--cc"),
            ("write -d x --engine --cc-set rpg_ai_rate=10", "--cc-set"),
            ("write -d x --engine --line-rate 1gbit", "--line-rate"),
            ("write -d x --engine --max-qp 4", "--max-qp"),
            ("write -d x --engine --trace t.csv", "--trace"),
            ("write -d x --engine --rx-usecs 100", "--rx-usecs"),
        ] {
            let e = engine_args(args).expect_err(args).to_string();
            assert!(e.contains(named) && e.contains("engine's"), "{args}: {e}");
        }
    }

    #[test]
    fn rx_moderation_needs_an_engine_thread() {
        plan("write -d x --rx-usecs 400").unwrap();
        plan("write -d x --rx-usecs 400 --inline").unwrap();
        plan("write -d x --rx-usecs 400 10.0.0.1").unwrap();
        let Err(e) = plan("write -d x --rx-usecs 400 --inline 10.0.0.1") else {
            panic!("--rx-usecs with --inline on the client was accepted");
        };
        assert!(e.to_string().contains("--inline"), "{e}");
        assert!(plan("write -d x --rx-usecs 10001").is_err());
    }

    #[test]
    fn rdma_cm_is_for_bandwidth_runs_on_this_process_device() {
        plan("write -d x -R").unwrap();
        plan("send -d x --rdma-cm -q 2 10.0.0.1").unwrap();
        let Err(e) = plan("write -d x -R --lat") else {
            panic!("-R --lat was accepted");
        };
        assert!(e.to_string().contains("-R"), "{e}");
    }

    #[test]
    fn send_posts_perftests_receive_depth_and_never_fewer_than_the_tx_depth() {
        // ib_send_bw's default: 512 receives per QP against 128 SENDs in flight.
        let p = plan("send -d x").unwrap();
        assert_eq!((p.depth, p.rx_depth), (128, 512));
        // A deeper send queue takes the receive queue with it.
        assert_eq!(plan("send -d x -t 1000").unwrap().rx_depth, 1000);
        // --span has a slot per receive: 1 MiB of 16 KiB messages holds 64, and never fewer
        // than the tx depth (the span check refuses a span too small for that).
        let p = plan("send -d x -s 16384 --span 1048576 -t 8").unwrap();
        assert_eq!(p.rx_depth, 64);
        let p = plan("send -d x -s 65536 --span 33554432").unwrap();
        assert_eq!(p.rx_depth, 512);
        assert_eq!(plan("send -d x -r 300").unwrap().rx_depth, 300);
        // Fewer receives than SENDs in flight is refused: the sender could outrun them.
        let Err(e) = plan("send -d x -t 64 -r 32") else {
            panic!("-r 32 below -t 64 was accepted");
        };
        assert!(e.to_string().contains("must be at least --tx-depth"), "{e}");
        // Other operations and the latency test keep the tx depth.
        assert_eq!(plan("write -d x").unwrap().rx_depth, 128);
        assert_eq!(plan("send -d x --lat -t 1").unwrap().rx_depth, 1);
    }
}
