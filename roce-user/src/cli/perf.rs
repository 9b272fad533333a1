//! `roce perf write|read|send|atomic`: bandwidth tests between two endpoints, set up with
//! perftest's out-of-band exchange (see `roce::cm::perftest`), so that either side can be
//! ib_write_bw, ib_read_bw, ib_send_bw or ib_atomic_bw.
//!
//! The client (given a host) is the active side; the server exposes its buffers (WRITE, READ,
//! atomics) or receives (SEND). Both sides verify the data: each QP's buffer holds a pattern
//! derived from the QP index and the size. The server checks what was written or sent into it,
//! the client checks what it read back, and atomics are checked against the exact sum.

use std::{
    collections::{HashMap, VecDeque},
    net::TcpListener,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use roce::{
    api::{
        Access, CqId, Device, DeviceOptions, MrInfo, Mtu, QpCap, QpInit, QpType, Qpn, RcConnect,
        RecvWr, SendOp, SendWr, Sge, WcStatus,
    },
    cc::{Trace, TraceRow},
    cm::perftest::{self, BwReport, Comm, KeyMsg, pattern},
    wire::types::{Psn, RKey},
};
use roce_common::counters::CmStats;
use serde_json::json;

use super::{Output, interrupted};

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
    /// TCP port of the out-of-band exchange.
    #[arg(short, long, default_value_t = perftest::DEFAULT_PORT)]
    pub port: u16,
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
    /// Receive queue depth per QP (perftest's `-r`): the receive WRs a SEND receiver keeps
    /// posted, and each QP's `max_recv_wr` (at most `DeviceConfig::max_qp_wr`, 16384).
    /// Default: the tx depth.
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
    /// Congestion control (ECN-marked data, CNPs, DCQCN pacing): on or off.
    #[arg(long, value_enum, default_value_t = CcMode::On)]
    pub cc: CcMode,
    /// A congestion-control parameter under its mlx5 name, e.g. `--cc-set rpg_ai_rate=10`,
    /// `--cc-set min_time_between_cnps=50` (repeatable; also rp_enabled / np_enabled = 0|1).
    #[arg(long = "cc-set", value_name = "NAME=VALUE")]
    pub cc_set: Vec<String>,
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
    /// Client: every SECS seconds, print a JSON line on stderr with each QP's work requests
    /// posted and completed so far (`{"progress": {"secs": .., "qpn": [..], "posted": [..],
    /// "done": [..]}}`), for watching a long run for stuck QPs.
    #[arg(long, value_name = "SECS")]
    pub progress: Option<f64>,
    /// Most packets in flight (sent, not yet acknowledged) over all QPs together
    /// (`DeviceConfig::max_inflight_pkts`; 0: no limit). Each QP's own window is 128 PSNs, so
    /// this matters with many QPs: 1024 QPs without it overrun the peer's receive ring.
    #[arg(long, value_name = "PKTS", default_value_t = roce::transport::DeviceConfig::default().max_inflight_pkts)]
    pub max_inflight: u32,
    /// One transport per RX queue of the interface, each driven by its own queue's engine
    /// thread (`DeviceOptions::sharded`): QP k lives on queue k mod queues, with a PD and CQ
    /// per queue. The --max-inflight budget applies per queue. For interfaces with several
    /// RX queues (`ip link add ... numrxqueues N`); with one queue it changes nothing.
    #[arg(long)]
    pub sharded: bool,
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

/// Samples every QP's congestion state into a [`Trace`] while a test runs.
struct Tracer {
    start: Instant,
    every: Duration,
    next: Instant,
    trace: Trace,
}

impl Tracer {
    fn new(a: &PerfArgs) -> anyhow::Result<Option<Self>> {
        if a.trace.is_none() {
            return Ok(None);
        }
        if !(a.trace_interval.is_finite() && (0.01..=10_000.0).contains(&a.trace_interval)) {
            bail!("--trace-interval takes 0.01 to 10000 milliseconds");
        }
        let now = Instant::now();
        Ok(Some(Self {
            start: now,
            every: Duration::from_secs_f64(a.trace_interval / 1000.0),
            next: now,
            trace: Trace::new(),
        }))
    }

    /// Call often from the test loop: takes a sample of every QP when one is due.
    fn poll(this: &mut Option<Self>, dev: &Device) {
        let Some(t) = this else { return };
        let now = Instant::now();
        if now < t.next {
            return;
        }
        t.next = (t.next + t.every).max(now);
        let at = roce::time::Instant::from_nanos(
            u64::try_from(now.duration_since(t.start).as_nanos()).unwrap_or(u64::MAX),
        );
        for (qpn, s) in dev.cc_snapshots() {
            t.trace.rows.push(TraceRow {
                time: at,
                qpn,
                rate_bps: s.rate_bps,
                target_bps: s.target_bps,
                alpha: s.alpha,
                cnps: s.cnps,
                bytes: s.bytes,
            });
        }
    }
}

/// `--cc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CcMode {
    /// DCQCN on (default).
    On,
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

/// The device's congestion-control settings from `--cc`, `--cc-set` and `--line-rate`.
fn cc_config(a: &PerfArgs) -> anyhow::Result<roce::transport::CcConfig> {
    let mut c = match a.cc {
        CcMode::On => roce::transport::CcConfig::default(),
        CcMode::Off => roce::transport::CcConfig::off(),
    };
    c.line_rate_bps = a.line_rate;
    for kv in &a.cc_set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--cc-set takes NAME=VALUE, not {kv:?}"))?;
        let v: u64 = v
            .trim()
            .parse()
            .with_context(|| format!("--cc-set {kv}: the value is not a number"))?;
        c.set(k.trim(), v)
            .with_context(|| format!("--cc-set {kv}"))?;
    }
    Ok(c)
}

/// perftest's cycle buffer (the page size it announces in the system data). A perftest client
/// advances the remote address by the message size (rounded up to a cache line) within one
/// cycle buffer when the size is at most half of it (`increase_rem_addr`), so the buffer we
/// expose must cover `max(size, CYCLE_BUFFER)` bytes, as perftest's own does (`BUFF_SIZE`).
const CYCLE_BUFFER: u32 = 4096;

/// How long a connecting client may take over each step of perftest's setup exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for a client whose setup exchange (versions, system data, MTU) succeeds, and returns
/// it with the MTU agreed. Call it once, as the server, before the key exchange. Connections
/// whose exchange fails (garbage, an old version, closed early, silent for
/// [`SETUP_TIMEOUT`]) are refused: dropped, counted in `cm_refused`, and the server listens
/// on, so a flood of bad connection attempts costs one connection's memory at a time.
fn accept_client(l: &TcpListener, mtu_code: u8, cm: &mut CmStats) -> anyhow::Result<(Comm, u8)> {
    loop {
        let (stream, _) = l.accept().context("accepting the client")?;
        cm.cm_accepted += 1;
        stream.set_read_timeout(Some(SETUP_TIMEOUT))?;
        stream.set_write_timeout(Some(SETUP_TIMEOUT))?;
        let mut comm = Comm::new(stream, false);
        match comm.setup(4096, 64, mtu_code) {
            Ok(used) => {
                // The run itself may pause between syncs for as long as the client runs.
                comm.stream().set_read_timeout(None)?;
                comm.stream().set_write_timeout(None)?;
                return Ok((comm, used));
            }
            Err(e) => {
                cm.cm_refused += 1;
                log::info!("refused a connection: {e}");
            }
        }
    }
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

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    u32::from_le_bytes(b)
}

/// Bytes `off..off + len` of QP `q`'s pattern.
fn pattern_at(q: u32, off: usize, len: usize) -> Vec<u8> {
    (off..off + len)
        .map(|i| roce::cm::perftest::pattern_byte(q, i))
        .collect()
}

/// Where message `k` of `size` bytes goes in the local and remote buffers: offset
/// (k × size) mod span with `--span`, else 0 (every message on the same bytes, as perftest).
fn msg_offset(span: u64, k: u64, size: u32) -> u64 {
    if span == 0 {
        0
    } else {
        k.wrapping_mul(u64::from(size)) % span
    }
}

/// The bytes of a QP's buffer that must hold its pattern once `msgs` messages of `size` went
/// through: the first message's with no `--span`, else all of the span they covered.
fn verify_len(span: u64, msgs: u64, size: u32) -> usize {
    if span == 0 {
        size as usize
    } else {
        usize::try_from(span.min(msgs.saturating_mul(u64::from(size)))).unwrap_or(usize::MAX)
    }
}

struct QpCtx {
    qpn: Qpn,
    mr: MrInfo,
    /// Local buffer for READ results and atomic return values (the MR is the exposed one).
    local: MrInfo,
    psn: Psn,
    remote: Option<KeyMsg>,
}

/// Latencies in µs as counts in logarithmic buckets 1 % wide (1 µs to about 20 minutes),
/// so memory stays fixed however long a run lasts; percentiles are within 1 %.
struct LatHist {
    counts: Vec<u64>,
    total: u64,
    max: f64,
}

impl LatHist {
    /// Bucket i holds [1.01^i, 1.01^(i+1)) µs; the last one everything longer.
    const BUCKETS: usize = 2100;

    fn new() -> Self {
        Self {
            counts: vec![0; Self::BUCKETS],
            total: 0,
            max: 0.0,
        }
    }

    fn record(&mut self, us: f64) {
        let i = if us <= 1.0 {
            0
        } else {
            ((us.ln() / 1.01f64.ln()) as usize).min(Self::BUCKETS - 1)
        };
        self.counts[i] += 1;
        self.total += 1;
        self.max = self.max.max(us);
    }

    /// The `p` quantile (0..=1): the middle of the bucket holding it, at most the maximum.
    fn percentile(&self, p: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((self.total - 1) as f64 * p).round() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return (1.01f64.powi(i as i32) * 1.005).min(self.max);
            }
        }
        self.max
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[allow(
    clippy::too_many_lines,
    reason = "one linear test procedure, as perftest's main"
)]
pub(crate) fn run(out: Output, a: &PerfArgs, netns: Option<String>) -> anyhow::Result<()> {
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
    let span = a.span as usize;
    let mut opts = DeviceOptions {
        netns,
        inline: a.inline && client,
        sharded: a.sharded,
        ..DeviceOptions::default()
    };
    opts.transport.cc = cc_config(a)?;
    opts.transport.max_qp = a.max_qp;
    opts.transport.max_inflight_pkts = a.max_inflight;
    opts.transport.max_mr = a.max_mr;
    opts.transport.max_qp_rd_atom = opts.transport.max_qp_rd_atom.max(a.max_rd_atomic);
    let dev = Device::open(&a.dev, &opts)?;
    let shards = dev.shards();
    let pds = (0..shards)
        .map(|q| dev.alloc_pd_on(q))
        .collect::<Result<Vec<_>, _>>()?;
    let gid_idx = a
        .gid_idx
        .unwrap_or_else(|| dev.info().default_gid_index(true));
    let gid = dev.gid(gid_idx)?;
    dev.check_path_mtu(a.mtu, gid.ip.is_ipv6())?;
    let depth = a.tx_depth.max(1);
    let rx_depth = a.rx_depth.unwrap_or(depth).max(1);
    // One CQ per transport, deep enough for the QPs it holds (QP k on queue k mod shards).
    let per_shard = a.qps.div_ceil(shards) as usize;
    let cqs = (0..shards)
        .map(|q| dev.create_cq_on(q, (depth as usize + rx_depth as usize + 16) * per_shard))
        .collect::<Result<Vec<_>, _>>()?;
    let remote_access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut qps = Vec::new();
    for q in 0..a.qps {
        let (pd, cq) = (pds[(q % shards) as usize], cqs[(q % shards) as usize]);
        let qpn = dev.create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: depth,
                max_recv_wr: rx_depth,
                max_sge: 1,
            },
            sq_sig_all: true,
        })?;
        let mr = dev.reg_mr(
            pd,
            (size.max(CYCLE_BUFFER) as usize).max(span),
            remote_access,
        )?;
        // Atomics return each WR's original value into a slot of its own (`run_client`).
        let local_len = if a.op == PerfOp::Atomic {
            8 * depth as usize
        } else {
            (size as usize).max(span)
        };
        let local = dev.reg_mr(pd, local_len, Access::LOCAL_WRITE)?;
        let full = (size as usize).max(span);
        // The exposed buffer starts with the pattern (READ sources it, WRITE/SEND overwrite it
        // with the same pattern from the client's local buffer).
        if client || a.op == PerfOp::Read {
            dev.mr_write(mr.lkey, 0, &pattern(q, size as usize))?;
        }
        if a.op == PerfOp::Atomic {
            dev.mr_write(mr.lkey, 0, &0u64.to_le_bytes())?;
        }
        if a.lat {
            // ib_write_lat zeroes its buffers: the polled last byte starts at 0.
            dev.mr_write(mr.lkey, 0, &vec![0u8; size as usize])?;
            dev.mr_write(local.lkey, 0, &pattern(q, size as usize))?;
        } else if client {
            if a.op != PerfOp::Atomic {
                dev.mr_write(local.lkey, 0, &pattern(q, full))?;
            }
        } else {
            dev.mr_write(mr.lkey, 0, &vec![0u8; full])?;
            if a.op == PerfOp::Read {
                dev.mr_write(mr.lkey, 0, &pattern(q, full))?;
            }
        }
        dev.qp_to_init(qpn, remote_access)?;
        qps.push(QpCtx {
            qpn,
            mr,
            local,
            psn: Psn::new(random_u32()),
            remote: None,
        });
    }
    if a.op == PerfOp::Send && (!client || a.lat) {
        for qp in &qps {
            for slot in 0..rx_depth {
                // With --span each receive has a slot of its own (wr_id = slot), checked and
                // reposted by run_server; without it they all share the first `size` bytes.
                let off = if span == 0 {
                    0
                } else {
                    u64::from(slot) * u64::from(size)
                };
                dev.post_recv(
                    qp.qpn,
                    RecvWr {
                        wr_id: u64::from(slot),
                        sg_list: vec![Sge {
                            addr: qp.mr.iova + off,
                            length: size,
                            lkey: qp.mr.lkey,
                        }],
                    },
                )?;
            }
        }
    }

    // perftest's setup: versions, system data, MTU, then one key message per QP.
    let mut cm = CmStats::default();
    let (mut comm, used_mtu) = match &a.host {
        Some(h) => {
            let mut comm = Comm::new(
                roce::cm::connect_tcp(h, a.port, Duration::from_secs(5))?,
                client,
            );
            let used = comm.setup(4096, 64, mtu_code)?;
            (comm, used)
        }
        None => {
            let l = TcpListener::bind(("::", a.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", a.port)))
                .with_context(|| format!("couldn't listen on port {}", a.port))?;
            accept_client(&l, mtu_code, &mut cm)?
        }
    };
    let mtu = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .get(usize::from(used_mtu.saturating_sub(1)))
    .copied()
    .unwrap_or(mtu);
    let key = |qp: &QpCtx| KeyMsg {
        lid: 0,
        // perftest announces its device's limit for READ and atomics, 1 otherwise; its requester
        // uses the peer's value as max_rd_atomic.
        out_reads: if matches!(a.op, PerfOp::Read | PerfOp::Atomic) {
            u16::from(a.max_rd_atomic)
        } else {
            1
        },
        qpn: qp.qpn,
        psn: qp.psn,
        rkey: qp.mr.rkey,
        vaddr: qp.mr.iova,
        gid: gid.raw,
        srqn: 0,
    };
    // write_lat.c exchanges keys once more before the per-QP exchange.
    if a.lat && a.op == PerfOp::Write {
        comm.hand_shake(&key(&qps[0]))?;
    }
    for qp in &mut qps {
        qp.remote = Some(comm.hand_shake(&key(qp))?);
    }
    for qp in &qps {
        let r = qp.remote.context("missing remote key")?;
        let path = dev.path_to(gid_idx, &r.gid, qp.qpn, r.qpn)?;
        let mut c = RcConnect::new(path, mtu, r.qpn, r.psn, qp.psn);
        c.max_dest_rd_atomic = a.max_rd_atomic;
        // Never more READs/atomics in flight than the responder accepts.
        c.max_rd_atomic =
            u8::try_from(r.out_reads.clamp(1, u16::from(a.max_rd_atomic))).unwrap_or(1);
        c.retry_cnt = a.retry_cnt;
        c.timeout = a.qp_timeout;
        dev.qp_connect(qp.qpn, &c)?;
    }
    // ib_send_bw (send_bw.c) syncs once right after connecting, then exchanges the keys again;
    // write_bw.c, read_bw.c and atomic_bw.c go straight to the second key exchange.
    if a.op == PerfOp::Send {
        comm.hand_shake(&key(&qps[0]))?;
    }
    for qp in &qps {
        comm.hand_shake(&key(qp))?;
    }
    // "An additional handshake is required after moving qp to RTR."
    comm.hand_shake(&key(&qps[0]))?;

    let mut tracer = Tracer::new(a)?;
    let result = if a.lat {
        run_lat(&dev, a, &cqs, &qps[0], size, client)?
    } else if client {
        run_client(&dev, a, &cqs, &qps, size, &mut tracer)?
    } else {
        run_server(&dev, a, &cqs, &qps, size, &comm, &mut tracer)?
    };
    Tracer::poll(&mut tracer, &dev);
    if let (Some(t), Some(path)) = (&tracer, &a.trace) {
        std::fs::write(path, t.trace.to_csv())
            .with_context(|| format!("writing the trace {path}"))?;
    }

    // After the test, for WRITE, READ and atomics: a sync and the reports (the half-duplex
    // branch of write_bw.c, read_bw.c, atomic_bw.c). ib_send_bw exchanges no report unless
    // bidirectional: each side reports what it measured itself. Then ctx_close_connection: the
    // closing sync and "done" (perftest 6.06).
    let mut theirs = BwReport::default();
    if a.op != PerfOp::Send && !a.lat {
        comm.hand_shake(&key(&qps[0]))?;
        // perftest's report carries the iterations of all QPs (`print_report_bw`:
        // `num_of_calculated_iters *= num_of_qps`).
        let mine = BwReport {
            size: u64::from(size),
            iters: result.msgs,
            bw_peak: result.mb_per_sec,
            bw_avg: result.mb_per_sec,
            msg_rate_avg: result.mpps,
        };
        theirs = comm.xchg_bw_reports(&mine)?;
    }
    // write_lat.c ends right after its loop, without ctx_close_connection.
    if !(a.lat && a.op == PerfOp::Write) {
        comm.hand_shake(&key(&qps[0]))?;
        let _ = comm.stream().set_read_timeout(Some(Duration::from_secs(1)));
        let mut done = [0u8; 5];
        let _ = comm.xchg(b"done\0", &mut done);
    }

    // The passive side verifies what landed in its buffers, now that the client is finished.
    let mut verified = result.verified;
    if !client && !a.no_verify && !a.lat {
        verified = verify_server(&dev, a, &qps, size, theirs.iters)?;
    }
    let shown = if client || a.op == PerfOp::Send || a.lat {
        result
    } else {
        PerfResult::from_report(&theirs, size)
    };
    let text = format!(
        "---------------------------------------------------------------------------------------\n \
         {:<10} {:<16} {:<18} {:<20} {:<14}\n {:<10} {:<16} {:<18.2} {:<20.2} {:<14.6}\n \
         latency usec (per WR, under load): p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}\n \
         data verified: {}\n\
         ---------------------------------------------------------------------------------------\n",
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
        size,
        shown.msgs,
        shown.mb_per_sec,
        shown.mb_per_sec,
        shown.mpps,
        shown.lat.0,
        shown.lat.1,
        shown.lat.2,
        shown.lat.3,
        if a.no_verify {
            "not checked (--no-verify)".to_owned()
        } else {
            verified.to_string()
        }
    );
    let v = json!({
        "op": format!("{:?}", a.op).to_lowercase(), "role": if client { "client" } else { "server" },
        "size": size, "qps": a.qps, "mtu": mtu.bytes(), "messages": shown.msgs, "bytes": shown.msgs * u64::from(size),
        "seconds": shown.secs, "bw_mb_per_sec": shown.mb_per_sec, "gbit_per_sec": shown.mb_per_sec * 8.0 * 1.048_576 / 1000.0,
        "msg_rate_mpps": shown.mpps, "posted": result.posted, "atomic_mismatches": result.atomic_mismatches,
        "span": a.span,
        "latency_us": { "p50": shown.lat.0, "p99": shown.lat.1, "p999": shown.lat.2, "max": shown.lat.3 },
        "verified": if a.no_verify { serde_json::Value::Null } else { verified.into() },
        "peer_version": comm.remote_version,
        "cm": CmStats::NAMES.iter().zip(cm.values()).map(|(n, v)| ((*n).to_owned(), v.into())).collect::<serde_json::Map<_, _>>(),
        "cc": cc_json(&dev),
        "peak_rss_kib": peak_rss_kib(),
    });
    out.emit(&v, &text);
    if !verified && !a.no_verify {
        bail!("data verification failed");
    }
    dev.close();
    Ok(())
}

/// Up to `max` completions from each of `cqs` (one per transport of a sharded device).
fn poll_cqs(dev: &Device, cqs: &[CqId], max: usize) -> Vec<roce::api::Wc> {
    match cqs {
        [cq] => dev.poll_cq(*cq, max),
        _ => cqs.iter().flat_map(|cq| dev.poll_cq(*cq, max)).collect(),
    }
}

/// This process's peak resident set size in KiB (`VmHWM` of /proc/self/status), for the JSON
/// report: how memory grows with `-q` (UMEM, memory regions and QP state together).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Each QP's DCQCN state and counters, and its transport counters, for the JSON report.
fn cc_json(dev: &Device) -> serde_json::Value {
    let (_, counters) = dev.counters();
    let qps: Vec<serde_json::Value> = dev
        .cc_snapshots()
        .into_iter()
        .map(|(qpn, s)| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            for (n, x) in roce::cc::CcStats::NAMES.iter().zip(s.stats.values()) {
                v[*n] = json!(x);
            }
            if let Some((_, c)) = counters.iter().find(|(q, _)| *q == qpn) {
                for (n, x) in roce::api::QpCounters::NAMES.iter().zip(c.values()) {
                    v["transport"][*n] = json!(x);
                }
            }
            v["qpn"] = json!(qpn.value());
            v
        })
        .collect();
    json!(qps)
}

#[derive(Clone, Copy, Debug, Default)]
struct PerfResult {
    msgs: u64,
    secs: f64,
    mb_per_sec: f64,
    mpps: f64,
    /// p50, p99, p99.9, max in µs.
    lat: (f64, f64, f64, f64),
    verified: bool,
    /// Work requests posted (client), each completed exactly once when the run succeeds.
    posted: u64,
    /// Atomics whose returned value was not the one a linearizable counter gives.
    atomic_mismatches: u64,
}

impl PerfResult {
    fn from_report(r: &BwReport, size: u32) -> Self {
        let msgs = r.iters;
        let secs = if r.bw_avg > 0.0 {
            msgs as f64 * f64::from(size) / (r.bw_avg * 1_048_576.0)
        } else {
            0.0
        };
        Self {
            msgs,
            secs,
            mb_per_sec: r.bw_avg,
            mpps: r.msg_rate_avg,
            lat: (0.0, 0.0, 0.0, 0.0),
            verified: true,
            posted: 0,
            atomic_mismatches: 0,
        }
    }
}

/// Each QP's position in `qps`, to find a completion's QP in constant time (a run may have
/// 1024 QPs and a completion per message).
fn qp_index(qps: &[QpCtx]) -> HashMap<Qpn, usize> {
    qps.iter().enumerate().map(|(i, q)| (q.qpn, i)).collect()
}

fn run_client(
    dev: &Device,
    a: &PerfArgs,
    cqs: &[CqId],
    qps: &[QpCtx],
    size: u32,
    tracer: &mut Option<Tracer>,
) -> anyhow::Result<PerfResult> {
    let depth = a.tx_depth as usize;
    let deadline = a
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let target = a.iters;
    let index = qp_index(qps);
    let mut posted = vec![0u64; qps.len()];
    let mut done = vec![0u64; qps.len()];
    let mut inflight: Vec<VecDeque<Instant>> = vec![VecDeque::new(); qps.len()];
    // A histogram, not a Vec of every WR's latency: a -D run of hours must not grow.
    let mut lats = LatHist::new();
    let mut fetched_ok = true;
    let mut atomic_mismatches = 0u64;
    let start = Instant::now();
    let mut last_progress = start;
    let every = a
        .progress
        .filter(|p| p.is_finite() && *p > 0.0)
        .map(Duration::from_secs_f64);
    let mut next_report = every.map(|e| start + e);
    // The QPs to top up this turn: all at first, then those that just completed something,
    // so a turn costs what completed, not what exists (1024 QPs).
    let mut refill: Vec<usize> = (0..qps.len()).collect();
    let mut outstanding = 0usize;
    loop {
        if let (Some(e), Some(at)) = (every, next_report)
            && Instant::now() >= at
        {
            next_report = Some(at + e);
            eprintln!(
                "{}",
                json!({ "progress": {
                    "secs": start.elapsed().as_secs_f64(),
                    "qpn": qps.iter().map(|q| q.qpn.value()).collect::<Vec<_>>(),
                    "posted": posted, "done": done,
                }})
            );
        }
        let stop_posting = deadline.is_some_and(|d| Instant::now() >= d);
        for i in refill.drain(..) {
            let qp = &qps[i];
            let r = qp.remote.expect("remote keys exchanged");
            while inflight[i].len() < depth
                && !stop_posting
                && (deadline.is_some() || posted[i] < target)
            {
                let off = if a.op == PerfOp::Atomic {
                    (posted[i] % depth as u64) * 8
                } else {
                    msg_offset(a.span, posted[i], size)
                };
                let sge = Sge {
                    addr: qp.local.iova + off,
                    length: size,
                    lkey: qp.local.lkey,
                };
                let remote_addr = r.vaddr + if a.op == PerfOp::Atomic { 0 } else { off };
                let op = match a.op {
                    PerfOp::Write => SendOp::Write {
                        remote_addr,
                        rkey: r.rkey,
                    },
                    PerfOp::Read => SendOp::Read {
                        remote_addr,
                        rkey: r.rkey,
                    },
                    PerfOp::Send => SendOp::Send,
                    PerfOp::Atomic if a.cmp_swap => SendOp::CompareSwap {
                        remote_addr: r.vaddr,
                        rkey: RKey::new(r.rkey.value()),
                        compare: posted[i],
                        swap: posted[i] + 1,
                    },
                    PerfOp::Atomic => SendOp::FetchAdd {
                        remote_addr: r.vaddr,
                        rkey: RKey::new(r.rkey.value()),
                        add: 1,
                    },
                };
                dev.post_send(qp.qpn, SendWr::new(posted[i], op, vec![sge]))?;
                posted[i] += 1;
                inflight[i].push_back(Instant::now());
                outstanding += 1;
            }
        }
        if outstanding == 0
            && (stop_posting || posted.iter().all(|p| *p >= target) && deadline.is_none())
        {
            break;
        }
        if interrupted() {
            bail!("interrupted");
        }
        Tracer::poll(tracer, dev);
        let wcs = poll_cqs(dev, cqs, 64);
        if wcs.is_empty() {
            if last_progress.elapsed() > Duration::from_secs(10) {
                bail!(
                    "no completion for 10 s ({} of {} done)",
                    done.iter().sum::<u64>(),
                    posted.iter().sum::<u64>()
                );
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for wc in wcs {
            if wc.status != WcStatus::Success {
                bail!(
                    "work request {} on QP {:?} failed: {:?}",
                    wc.wr_id,
                    wc.qp_num,
                    wc.status
                );
            }
            let Some(&i) = index.get(&wc.qp_num) else {
                bail!("a completion for QP {:?}, which is not ours", wc.qp_num);
            };
            // RC completes a QP's send WRs once each, in the order they were posted (IBA
            // 10.8.3.1): any other wr_id is a lost, duplicated or reordered completion.
            if wc.wr_id != done[i] || inflight[i].is_empty() {
                bail!(
                    "QP {:?} completed work request {} where {} was next ({} posted)",
                    wc.qp_num,
                    wc.wr_id,
                    done[i],
                    posted[i]
                );
            }
            if let Some(t) = inflight[i].pop_front() {
                lats.record(t.elapsed().as_secs_f64() * 1e6);
                outstanding -= 1;
            }
            done[i] += 1;
            if inflight[i].len() + 1 == depth {
                refill.push(i); // it was full: top it up next turn
            }
            if a.op == PerfOp::Read && done[i] == 1 {
                let ok = dev.with_mr(qps[i].local.lkey, |b| {
                    b.get(..size as usize) == Some(pattern(i as u32, size as usize).as_slice())
                })?;
                fetched_ok &= ok;
            }
            if a.op == PerfOp::Atomic {
                // Linearizable atomics on one counter that starts at 0: the k-th fetch-and-add
                // (or compare-and-swap of k for k + 1) of this QP returns exactly k (IBA 9.4.5:
                // a responder executes each atomic once, in PSN order, and answers a duplicate
                // from its saved result).
                let mut b = [0u8; 8];
                dev.mr_read(
                    qps[i].local.lkey,
                    (wc.wr_id % depth as u64) as usize * 8,
                    &mut b,
                )?;
                let got = u64::from_le_bytes(b);
                if got != wc.wr_id {
                    atomic_mismatches += 1;
                    if atomic_mismatches == 1 {
                        eprintln!(
                            "atomic {} on QP {:?} returned {got}, not {}",
                            wc.wr_id, wc.qp_num, wc.wr_id
                        );
                    }
                }
            }
        }
    }
    // Nothing may complete after the last expected completion: a late one is a duplicate.
    std::thread::sleep(Duration::from_millis(20));
    if let Some(wc) = poll_cqs(dev, cqs, 1).first() {
        bail!(
            "QP {:?} completed work request {} after all its work requests had completed",
            wc.qp_num,
            wc.wr_id
        );
    }
    let secs = start.elapsed().as_secs_f64();
    let msgs: u64 = done.iter().sum();
    let bytes = msgs as f64 * f64::from(size);
    let mut verified = fetched_ok && atomic_mismatches == 0;
    if a.op == PerfOp::Read {
        for (i, qp) in qps.iter().enumerate() {
            let n = verify_len(a.span, done[i], size);
            verified &= dev.with_mr(qp.local.lkey, |b| {
                b.get(..n) == Some(pattern(i as u32, n).as_slice())
            })?;
        }
    }
    Ok(PerfResult {
        msgs,
        secs,
        mb_per_sec: bytes / secs.max(1e-9) / 1_048_576.0,
        mpps: msgs as f64 / secs.max(1e-9) / 1e6,
        lat: (
            lats.percentile(0.5),
            lats.percentile(0.99),
            lats.percentile(0.999),
            lats.max,
        ),
        verified,
        posted: posted.iter().sum(),
        atomic_mismatches,
    })
}

/// The latency ping-pong of ib_write_lat (`run_iter_lat_write`) and ib_send_lat
/// (`run_iter_lat_send`), message for message: for WRITE the server sends first and each side
/// waits for the last byte of its buffer to read the iteration number (mod 256) before writing
/// the next; for SEND the client sends first and each side waits for a receive completion.
/// Latency is half the time between two of our posts, as perftest reports it.
fn run_lat(
    dev: &Device,
    a: &PerfArgs,
    cqs: &[CqId],
    qp: &QpCtx,
    size: u32,
    client: bool,
) -> anyhow::Result<PerfResult> {
    let r = qp.remote.expect("remote keys exchanged");
    let n = a.iters;
    let last = size as usize - 1;
    let first = match a.op {
        PerfOp::Write => !client,
        _ => client,
    };
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let (mut sends_done, mut recvs_done) = (0u64, 0u64);
    let mut posts = Vec::with_capacity(n as usize);
    let start = Instant::now();
    // Polls the CQ once: counts send and receive completions, reposts receives.
    let pump = |sends_done: &mut u64, recvs_done: &mut u64| -> anyhow::Result<()> {
        for wc in poll_cqs(dev, cqs, 16) {
            if wc.status != WcStatus::Success {
                bail!("work request {} failed: {:?}", wc.wr_id, wc.status);
            }
            if wc.opcode == roce::api::WcOpcode::Recv {
                *recvs_done += 1;
                dev.post_recv(
                    qp.qpn,
                    RecvWr {
                        wr_id: 0,
                        sg_list: vec![Sge {
                            addr: qp.mr.iova,
                            length: size,
                            lkey: qp.mr.lkey,
                        }],
                    },
                )?;
            } else {
                *sends_done += 1;
            }
        }
        Ok(())
    };
    let wait = |what: &str,
                done: &mut dyn FnMut(u64, u64) -> anyhow::Result<bool>,
                sends_done: &mut u64,
                recvs_done: &mut u64|
     -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            pump(sends_done, recvs_done)?;
            if done(*sends_done, *recvs_done)? {
                return Ok(());
            }
            if interrupted() {
                bail!("interrupted");
            }
            if Instant::now() > deadline {
                bail!(
                    "no {what} for 10 s ({} sends and {} receives completed)",
                    *sends_done,
                    *recvs_done
                );
            }
            std::thread::yield_now();
        }
    };
    while scnt < n || rcnt < n || sends_done < n {
        if rcnt < n && !(scnt < 1 && first) {
            rcnt += 1;
            let want = rcnt;
            match a.op {
                PerfOp::Write => wait(
                    "write from the peer",
                    &mut |_, _| Ok(dev.with_mr(qp.mr.lkey, |b| b[last])? == want as u8),
                    &mut sends_done,
                    &mut recvs_done,
                )?,
                _ => wait(
                    "message from the peer",
                    &mut |_, r| Ok(r >= want),
                    &mut sends_done,
                    &mut recvs_done,
                )?,
            }
        }
        if scnt < n {
            scnt += 1;
            let sge = Sge {
                addr: qp.local.iova,
                length: size,
                lkey: qp.local.lkey,
            };
            let op = if a.op == PerfOp::Write {
                dev.mr_write(qp.local.lkey, last, &[scnt as u8])?;
                SendOp::Write {
                    remote_addr: r.vaddr,
                    rkey: r.rkey,
                }
            } else {
                SendOp::Send
            };
            posts.push(Instant::now());
            dev.post_send(qp.qpn, SendWr::new(scnt, op, vec![sge]))?;
            let want = scnt;
            wait(
                "send completion",
                &mut |s, _| Ok(s >= want),
                &mut sends_done,
                &mut recvs_done,
            )?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut lats: Vec<f64> = posts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    lats.sort_by(f64::total_cmp);
    let bytes = (scnt + rcnt) as f64 * f64::from(size);
    Ok(PerfResult {
        msgs: scnt,
        secs,
        mb_per_sec: bytes / secs.max(1e-9) / 1_048_576.0,
        mpps: scnt as f64 / secs.max(1e-9) / 1e6,
        lat: (
            percentile(&lats, 0.5),
            percentile(&lats, 0.99),
            percentile(&lats, 0.999),
            lats.last().copied().unwrap_or(0.0),
        ),
        verified: true,
        posted: scnt,
        atomic_mismatches: 0,
    })
}

fn run_server(
    dev: &Device,
    a: &PerfArgs,
    cqs: &[CqId],
    qps: &[QpCtx],
    size: u32,
    comm: &Comm,
    tracer: &mut Option<Tracer>,
) -> anyhow::Result<PerfResult> {
    // The server does nothing for WRITE/READ/atomics but wait for the client's next sync. For
    // SEND it receives, reposts and checks every message.
    let start = Instant::now();
    let mut msgs = 0u64;
    let mut good = true;
    // With --span: receives completed per QP, which tells where in the pattern each one's
    // message came from (RC delivers a QP's messages once each, in order).
    let mut recvd = vec![0u64; qps.len()];
    let index = qp_index(qps);
    let mut peek = [0u8; 1];
    comm.stream().set_nonblocking(true)?;
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut closing = false;
    loop {
        if interrupted() {
            bail!("interrupted");
        }
        Tracer::poll(tracer, dev);
        if a.op == PerfOp::Send {
            for wc in poll_cqs(dev, cqs, 64) {
                if wc.status != WcStatus::Success {
                    bail!("receive on QP {:?} failed: {:?}", wc.qp_num, wc.status);
                }
                let Some(&i) = index.get(&wc.qp_num) else {
                    continue;
                };
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                msgs += 1;
                let slot = if a.span == 0 {
                    0
                } else {
                    wc.wr_id * u64::from(size)
                };
                let want = if a.span == 0 {
                    pattern(i as u32, size as usize)
                } else {
                    let off = msg_offset(a.span, recvd[i], size) as usize;
                    pattern_at(i as u32, off, size as usize)
                };
                recvd[i] += 1;
                let ok = wc.byte_len == size
                    && dev.with_mr(qps[i].mr.lkey, |b| {
                        b.get(slot as usize..slot as usize + size as usize) == Some(want.as_slice())
                    })?;
                if !ok && good {
                    eprintln!(
                        "SEND {} on QP {:?} ({} bytes) does not hold its data",
                        recvd[i] - 1,
                        wc.qp_num,
                        wc.byte_len
                    );
                }
                good &= ok;
                dev.post_recv(
                    qps[i].qpn,
                    RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![Sge {
                            addr: qps[i].mr.iova + slot,
                            length: size,
                            lkey: qps[i].mr.lkey,
                        }],
                    },
                )?;
            }
        }
        if closing {
            break;
        }
        match comm.stream().peek(&mut peek) {
            Ok(0) => bail!("the client closed the connection"),
            // One more pass over the CQ: receives completed just before the client's sync.
            Ok(_) => closing = true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(if a.op == PerfOp::Send {
                    20
                } else if tracer.is_some() {
                    100
                } else {
                    2000
                }));
            }
            Err(e) => return Err(e.into()),
        }
    }
    comm.stream().set_nonblocking(false)?;
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let bytes = msgs as f64 * f64::from(size);
    Ok(PerfResult {
        msgs,
        secs,
        mb_per_sec: if secs > 0.0 {
            bytes / secs / 1_048_576.0
        } else {
            0.0
        },
        mpps: if secs > 0.0 {
            msgs as f64 / secs / 1e6
        } else {
            0.0
        },
        lat: (0.0, 0.0, 0.0, 0.0),
        verified: good,
        posted: 0,
        atomic_mismatches: 0,
    })
}

fn verify_server(
    dev: &Device,
    a: &PerfArgs,
    qps: &[QpCtx],
    size: u32,
    client_msgs: u64,
) -> anyhow::Result<bool> {
    let mut ok = true;
    // With --span and -D the server knows only the total: it checks the span the average QP
    // covered (the test sizes -D runs so that every QP covers the whole span).
    let per_qp = client_msgs / u64::from(a.qps.max(1));
    for (i, qp) in qps.iter().enumerate() {
        let n = verify_len(a.span, per_qp, size);
        ok &= match a.op {
            PerfOp::Write | PerfOp::Read => dev.with_mr(qp.mr.lkey, |b| {
                b.get(..n) == Some(pattern(i as u32, n).as_slice())
            })?,
            // With --span every receive was checked as it completed (run_server).
            PerfOp::Send if a.span != 0 => true,
            PerfOp::Send => dev.with_mr(qp.mr.lkey, |b| {
                b.get(..size as usize) == Some(pattern(i as u32, size as usize).as_slice())
            })?,
            PerfOp::Atomic => true,
        };
    }
    if a.op == PerfOp::Atomic {
        // Each atomic adds one (or swaps k for k+1): the counters sum to the client's count.
        let mut total = 0u64;
        for qp in qps {
            let mut b = [0u8; 8];
            dev.mr_read(qp.mr.lkey, 0, &mut b)?;
            total += u64::from_le_bytes(b);
        }
        ok &= total == client_msgs;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_histogram_percentiles_are_within_one_percent() {
        let mut h = LatHist::new();
        for us in 1..=10_000 {
            h.record(f64::from(us));
        }
        for (p, exact) in [(0.5, 5000.0), (0.99, 9900.0), (0.999, 9990.0)] {
            let got = h.percentile(p);
            assert!(
                (got - exact).abs() <= exact * 0.01 + 1.0,
                "p{p}: {got}, exactly {exact}"
            );
        }
        assert!((h.max - 10_000.0).abs() < f64::EPSILON);
        assert!(h.percentile(1.0) <= h.max);
        // Fixed memory: a million more samples add no bucket.
        for _ in 0..1_000_000 {
            h.record(42.0);
        }
        assert_eq!(h.counts.len(), LatHist::BUCKETS);
        assert_eq!(h.total, 1_010_000);
        assert_eq!(LatHist::new().percentile(0.5), 0.0);
    }

    #[test]
    fn span_gives_each_message_its_own_place() {
        // 4 messages of 1 KiB in a 4 KiB span: offsets 0, 1024, 2048, 3072, then around.
        let offs: Vec<u64> = (0..6).map(|k| msg_offset(4096, k, 1024)).collect();
        assert_eq!(offs, [0, 1024, 2048, 3072, 0, 1024]);
        assert_eq!(msg_offset(0, 5, 1024), 0);
        assert_eq!(verify_len(0, 100, 1024), 1024);
        assert_eq!(verify_len(4096, 2, 1024), 2048);
        assert_eq!(verify_len(4096, 100, 1024), 4096);
        // The pattern at an offset is the same bytes as the whole pattern there.
        assert_eq!(pattern_at(3, 1000, 24), pattern(3, 1024)[1000..]);
    }
}
