//! A verbs-like application API: a [`Device`] is a Linux interface turned into a RoCE v2 device.
//!
//! [`Device::open`] loads `roce_xdp` (unless `roce load` already did), opens one AF_XDP socket per
//! RX queue, and starts one engine thread per queue that drives the sans-I/O transport. The
//! methods are the verbs a user of `libibverbs` knows — `reg_mr`, `create_cq`, `create_qp`,
//! `modify_qp`, `post_send`, `post_recv`, `poll_cq` — with Rust types instead of C structs.
//! Completion queues can be polled, waited on (blocking), or awaited ([`Device::cq_ready`]).
//!
//! QP numbers are claimed in the pinned `ROCE_QPS` map under a lock file
//! (`/run/roce/<ifname>.lock`), so several processes on one interface never take each other's
//! QPNs; a QPN whose owner process has died can be reclaimed.
//!
//! Limits of this transport over AF_XDP: a UMEM frame holds 4096 bytes, of which the kernel
//! keeps 256 for headroom on receive, so a frame of path MTU 4096 (up to 4194 bytes) does not
//! fit one. When the link's MTU lets such frames through, [`Device::open`] binds its sockets for
//! AF_XDP multi-buffer packets ([`XskConfig::multi_buffer`], Linux 6.6+), which carry them in
//! two descriptors; on a link of MTU 1500 the largest path MTU is 1024 either way.

use std::{
    fs::{self, File},
    future::Future,
    io::Read as _,
    net::IpAddr,
    os::fd::{AsFd as _, AsRawFd as _},
    pin::Pin,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::{Duration, Instant as StdInstant},
};

use nix::sys::eventfd::{EfdFlags, EventFd};
use roce_common::maps::{
    BIND_COPY, BIND_ZEROCOPY, MAX_QPS, QpEntry, QpStatsRecord, XskQueueRecord,
};

pub use crate::transport::{
    Access, AttrMask, CqId, DeviceConfig, DeviceCounters, LKey, MrInfo, Mtu, Path, PdId, PostError,
    Psn, QpAttr, QpCap, QpCounters, QpInit, QpState, QpType, Qpn, RKey, RecvWr, SendFlags, SendOp,
    SendWr, Sge, Wc, WcFlags, WcOpcode, WcStatus,
};
use crate::{
    engine::{
        Clock, Engine, EngineConfig, EngineThread, Handler, Nanos, RxVerdict, TxSink, spawn_engines,
    },
    loader::{self, AttachMode, LoadError, LoadOptions, Pins},
    netinfo::{self, Gid, IfInfo, NetInfoError},
    transport::{self, Instant},
    wire::{EthernetAddress, IpPath, PathRepr, frame::udp_src_port},
    xsk::{BindMode, XskConfig, XskError, XskQueue, XskStats},
};

/// Why a device call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Loading, pinning or a map operation failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An AF_XDP socket could not be opened.
    #[error("AF_XDP: {0}")]
    Xsk(#[from] XskError),
    /// Interface facts could not be read.
    #[error(transparent)]
    NetInfo(#[from] NetInfoError),
    /// The transport refused.
    #[error(transparent)]
    Device(#[from] transport::DeviceError),
    /// A post was refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A memory region call failed.
    #[error(transparent)]
    Mr(#[from] transport::MrError),
    /// No QPN below the XDP map's capacity is free.
    #[error("no free QP number below {MAX_QPS} on {0}")]
    NoQpn(String),
    /// The path MTU does not fit the frames.
    #[error(
        "path MTU {asked} does not fit this device: at most {max} (AF_XDP frames of {frame} bytes, link MTU {link})"
    )]
    Mtu {
        /// Asked for.
        asked: u32,
        /// Largest possible.
        max: u32,
        /// UMEM frame size.
        frame: u32,
        /// Link MTU.
        link: u32,
    },
    /// A memory region access out of bounds.
    #[error("memory region {lkey:?}: bytes {offset}..{end} are outside its {len} bytes")]
    OutOfBounds {
        /// Region.
        lkey: LKey,
        /// Start.
        offset: usize,
        /// End.
        end: usize,
        /// Region length.
        len: usize,
    },
    /// Something else the OS refused.
    #[error("{what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// An engine thread failed.
    #[error("engine thread: {0}")]
    Engine(String),
    /// A sharded device was asked for more queues than QP numbers and keys can be split into.
    #[error("{queues} RX queues: a sharded device splits into at most {max}")]
    TooManyQueues {
        /// RX queues of the interface.
        queues: u32,
        /// [`transport::Shard::MAX_COUNT`].
        max: u32,
    },
    /// A queue number beyond the device's shards ([`Device::alloc_pd_on`]).
    #[error("queue {queue}: this device has {shards} transport(s) (sharded: one per RX queue)")]
    NoSuchQueue {
        /// Asked for.
        queue: u32,
        /// [`Device::shards`].
        shards: u32,
    },
    /// A QP's PD and CQs were made on different queues of a sharded device.
    #[error(
        "the QP's protection domain is on queue {pd} but its {which} CQ on queue {cq}: a sharded device keeps a QP's PD, CQs and regions on one queue"
    )]
    OtherQueue {
        /// The PD's queue.
        pd: u32,
        /// `send` or `recv`.
        which: &'static str,
        /// The CQ's queue.
        cq: u32,
    },
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> ApiError {
    move |source| ApiError::Os { what, source }
}

/// How an RC QP is connected: what `ibv_modify_qp` gets for RTR and RTS. [`RcConnect::new`]
/// takes ibv_rc_pingpong's values (`pp_connect_ctx`), which perftest also uses.
#[derive(Clone, Copy, Debug)]
pub struct RcConnect {
    /// The address vector to the peer.
    pub path: Path,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The peer's QP.
    pub dest_qpn: Qpn,
    /// The first PSN the peer sends (its SQ PSN): our RQ PSN.
    pub rq_psn: Psn,
    /// Our first PSN.
    pub sq_psn: Psn,
    /// READ/atomic responder resources.
    pub max_dest_rd_atomic: u8,
    /// Outstanding READ/atomics we may issue.
    pub max_rd_atomic: u8,
    /// RNR NAK timer code we advertise.
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries (7: forever).
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
}

impl RcConnect {
    /// ibv_rc_pingpong's connection: max_dest_rd_atomic 1, min_rnr_timer 12, timeout 14,
    /// retry_cnt 7, rnr_retry 7, max_rd_atomic 1.
    #[must_use]
    pub const fn new(path: Path, path_mtu: Mtu, dest_qpn: Qpn, rq_psn: Psn, sq_psn: Psn) -> Self {
        Self {
            path,
            path_mtu,
            dest_qpn,
            rq_psn,
            sq_psn,
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// Options of [`Device::open`].
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// XDP attach mode, if the device loads roce_xdp itself.
    pub mode: AttachMode,
    /// AF_XDP sizes.
    pub xsk: XskConfig,
    /// Transport limits.
    pub transport: DeviceConfig,
    /// Engine tuning.
    pub engine: EngineConfig,
    /// Network namespace name, recorded in the load info.
    pub netns: Option<String>,
    /// Run to completion: no engine thread per queue; the threads that post and poll drive
    /// the queues themselves ([`Device::post_send`], [`Device::poll_cq`] and
    /// [`Device::wait_cq`] run an engine turn), so a message crosses no thread hand-off on
    /// either side. For latency-bound applications that keep calling `poll_cq` or `wait_cq`
    /// (`roce pingpong` without `-e`, `roce perf --inline`). A helper thread runs a turn when
    /// no application thread did for [`INLINE_IDLE_TURN`], so ACKs and retransmissions go on
    /// while the application does other things, only later.
    pub inline: bool,
    /// One transport per RX queue, QPs sharded by queue: each queue's engine thread owns its
    /// own transport and lock, so queues never wait for each other. Protection domains and
    /// CQs are made on a chosen queue ([`Device::alloc_pd_on`], [`Device::create_cq_on`]); a
    /// QP lives on its PD's queue and uses that queue's CQs and memory regions. QP numbers
    /// and memory keys name their queue ([`transport::Shard`]), so calls find their
    /// transport without a table. A frame that arrives on another queue than its QP's (the
    /// peer's hash put it there) is handed to the owner and counted in `rx_other_queue`.
    /// Without it (the default) every queue's engine serves one shared transport.
    pub sharded: bool,
}

/// How often the helper thread of an inline device ([`DeviceOptions::inline`]) drives the
/// queues when no application thread has.
pub const INLINE_IDLE_TURN: Duration = Duration::from_millis(1);

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            mode: AttachMode::Native,
            xsk: XskConfig::default(),
            transport: DeviceConfig::default(),
            engine: EngineConfig::default(),
            netns: None,
            inline: false,
            sharded: false,
        }
    }
}

/// What the engines and the application threads share.
#[derive(Debug)]
struct Shared {
    dev: Mutex<transport::Device>,
    /// Signalled by the engines after input that may have completed work.
    progress: Condvar,
    /// Async waiters, woken with `progress`.
    wakers: Mutex<Vec<Waker>>,
    /// Makes the engines' poll(2) return, after a post.
    wake: EventFd,
    /// The latest AF_XDP counters of each queue, as the engines report them.
    xsk: Mutex<std::collections::BTreeMap<u32, XskStats>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, transport::Device> {
        // A panic while holding the lock leaves the transport in an unknown state; the poison
        // is reported by the next call that sees it, here treated as fatal for the device.
        self.dev
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        self.progress.notify_all();
        let wakers = std::mem::take(
            &mut *self
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for w in wakers {
            w.wake();
        }
    }

    fn kick(&self) {
        let _ = self.wake.write(1);
    }
}

/// The engines of an inline device and when one last ran.
struct Inline {
    engines: Mutex<Vec<Engine<TransportHandler>>>,
    clock: Clock,
    /// [`Clock`] time of the last turn.
    last_turn: AtomicU64,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline").finish_non_exhaustive()
    }
}

impl Inline {
    /// One turn of every queue's engine, unless another thread is running them right now
    /// (then that thread's turn serves this caller too). Returns whether it ran.
    fn turn(&self) -> bool {
        let Ok(mut engines) = self.engines.try_lock() else {
            return false;
        };
        let now = self.clock.now();
        for e in engines.iter_mut() {
            e.turn_and_report(now);
        }
        self.last_turn.store(now.0, Ordering::Relaxed);
        true
    }

    /// Waits up to `timeout` for a frame on any queue (or transmit room); called with no
    /// engine running so that the caller's next turn handles it.
    fn wait(&self, timeout: Duration, wake: &EventFd) {
        let Ok(engines) = self.engines.lock() else {
            return;
        };
        let queues: Vec<&XskQueue> = engines.iter().map(Engine::queue).collect();
        let _ = XskQueue::wait_any(&queues, Some(timeout), Some(wake.as_fd()));
        // Cleared after the wait, as Handler::on_woken does: the caller's next turn sees what
        // was posted before the signal.
        let _ = wake.read();
    }
}

/// The engine handler that drives the transport: frames in, frames out, timers.
struct TransportHandler {
    /// This queue's transport.
    shared: Arc<Shared>,
    /// This queue's place in `all`.
    index: usize,
    /// Every transport of the device (one unless sharded), for frames of other queues' QPs.
    all: Arc<[Arc<Shared>]>,
    activity: bool,
}

impl TransportHandler {
    /// The transport that owns `frame`'s QP: this queue's, unless the device is sharded and
    /// the DestQP names another one ([`transport::Shard::of_qpn`]).
    fn owner(&self, frame: &[u8]) -> usize {
        let count = self.all.len();
        if count == 1 {
            return self.index;
        }
        crate::wire::peek::dest_qpn(frame).map_or(self.index, |qpn| {
            transport::Shard::of_qpn(count as u32, transport::Qpn::new(qpn)) as usize
        })
    }
}

const fn at(now: Nanos) -> Instant {
    Instant::from_nanos(now.0)
}

impl Handler for TransportHandler {
    fn on_rx(&mut self, now: Nanos, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        let owner = self.owner(frame);
        if owner == self.index {
            self.shared.lock().handle_packet_mut(at(now), frame);
            self.activity = true;
        } else {
            // Another queue's QP: its transport handles the frame, and its engine sends what
            // that produced (ACKs, responses) on its own queue.
            let other = &self.all[owner];
            {
                let mut dev = other.lock();
                dev.count_rx_other_queue();
                dev.handle_packet_mut(at(now), frame);
            }
            other.kick();
            other.notify();
        }
        RxVerdict::Recycle
    }

    fn poll_transmit(&mut self, now: Nanos, tx: &mut TxSink<'_>) {
        let mut dev = self.shared.lock();
        while tx.room() > 0 {
            let mut sent = false;
            let _ = tx.send(|buf| match dev.poll_transmit(at(now), buf) {
                Some(t) => {
                    sent = true;
                    t.size
                }
                None => 0,
            });
            if !sent {
                break;
            }
            self.activity = true;
        }
        drop(dev);
        if std::mem::take(&mut self.activity) {
            self.shared.notify();
        }
    }

    fn next_timeout(&self) -> Option<Nanos> {
        self.shared
            .lock()
            .poll_timeout()
            .map(|t| Nanos(t.as_nanos()))
    }

    fn on_timeout(&mut self, now: Nanos) {
        self.shared.lock().handle_timeout(at(now));
        self.activity = true;
    }

    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.shared.wake.as_fd())
    }

    fn on_woken(&mut self) {
        // Everything posted before the signal is visible to the next turn, under the lock.
        let _ = self.shared.wake.read();
    }

    fn on_queue_stats(&mut self, queue_id: u32, stats: &XskStats) {
        self.shared
            .xsk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(queue_id, *stats);
    }
}

/// Writes the device's counters into the pinned stats maps, where `roce stats` and bpftool
/// read them. Runs every [`PUBLISH_EVERY`] on its own thread, and once more at close.
#[derive(Clone)]
struct Publisher {
    shards: Arc<[Arc<Shared>]>,
    pins: Pins,
    bind_modes: Vec<(u32, BindMode)>,
}

/// How often the counters are published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);

const fn state_code(s: QpState) -> u32 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

impl Publisher {
    fn publish(&self) -> Result<(), ApiError> {
        let pid = std::process::id();
        let mut devc = DeviceCounters::default();
        let mut qps = Vec::new();
        for shard in self.shards.iter() {
            let dev = shard.lock();
            qps.extend(dev.qps().map(|q| {
                let cc = q.congestion().map(transport::QpCc::snapshot);
                (q.qpn(), q.state(), *q.counters(), cc)
            }));
            devc.add(dev.device_counters());
        }
        let mut qmap = self.pins.qp_stats()?;
        for (qpn, state, counters, cc) in qps {
            let rec = QpStatsRecord {
                owner: pid,
                state: state_code(state),
                counters,
                rate_bps: cc.map_or(0, |c| c.rate_bps),
                target_bps: cc.map_or(0, |c| c.target_bps),
                alpha_1024: cc.map_or(0, |c| u64::from(c.alpha_fixed)),
                cc: cc.map(|c| c.stats).unwrap_or_default(),
            };
            qmap.insert(qpn.value(), rec, 0).map_err(LoadError::from)?;
        }
        self.pins
            .dev_stats()?
            .insert(pid, devc, 0)
            .map_err(LoadError::from)?;
        let mut xsk = std::collections::BTreeMap::new();
        for shard in self.shards.iter() {
            xsk.extend(
                shard
                    .xsk
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .map(|(q, st)| (*q, *st)),
            );
        }
        let mut xmap = self.pins.xsk_stats()?;
        for (q, stats) in xsk {
            let bind = self
                .bind_modes
                .iter()
                .find(|(n, _)| *n == q)
                .map_or(BIND_COPY, |(_, m)| match m {
                    BindMode::ZeroCopy => BIND_ZEROCOPY,
                    BindMode::Copy => BIND_COPY,
                });
            xmap.insert(
                q,
                XskQueueRecord {
                    owner: pid,
                    bind_mode: bind,
                    stats,
                },
                0,
            )
            .map_err(LoadError::from)?;
        }
        Ok(())
    }

    /// Folds the records of `owner` (or, with `None`, of every process that no longer exists)
    /// into the retired records (QPN 0 and PID 0), so per-interface totals stay cumulative like
    /// a NIC's while the maps stay bounded. Call with the QPN lock held.
    fn retire(&self, owner: Option<u32>) {
        let gone = |o: u32| o != 0 && owner.map_or(!process_alive(o), |me| o == me);
        if let Ok(mut m) = self.pins.qp_stats() {
            let mut retired = m.get(&0, 0).unwrap_or_default();
            let old: Vec<(u32, QpStatsRecord)> = m
                .iter()
                .filter_map(Result::ok)
                .filter(|(k, r)| *k != 0 && gone(r.owner))
                .collect();
            if !old.is_empty() {
                for (k, r) in &old {
                    retired.counters.add(&r.counters);
                    retired.cc.add(&r.cc);
                    let _ = m.remove(k);
                }
                retired.owner = 0;
                retired.state = 0;
                retired.rate_bps = 0;
                retired.target_bps = 0;
                retired.alpha_1024 = 0;
                let _ = m.insert(0, retired, 0);
            }
        }
        if let Ok(mut m) = self.pins.dev_stats() {
            let mut retired = m.get(&0, 0).unwrap_or_default();
            let old: Vec<(u32, DeviceCounters)> = m
                .iter()
                .filter_map(Result::ok)
                .filter(|(pid, _)| gone(*pid))
                .collect();
            if !old.is_empty() {
                for (pid, d) in &old {
                    retired.add(d);
                    let _ = m.remove(pid);
                }
                let _ = m.insert(0, retired, 0);
            }
        }
    }
}

/// A RoCE v2 device on a Linux interface. Dropping it stops the engines, releases its QPNs and,
/// if it loaded roce_xdp, unloads it.
pub struct Device {
    publisher: Publisher,
    stats_thread: Option<std::thread::JoinHandle<()>>,
    /// The transports: one, or one per RX queue ([`DeviceOptions::sharded`]), in queue order.
    shards: Arc<[Arc<Shared>]>,
    info: IfInfo,
    pins: Pins,
    stop: Arc<AtomicBool>,
    engines: Vec<EngineThread<TransportHandler>>,
    /// The queues' engines of an inline device ([`DeviceOptions::inline`]), driven by the
    /// application's threads and the helper thread.
    inline: Option<Arc<Inline>>,
    inline_thread: Option<std::thread::JoinHandle<()>>,
    loaded_here: bool,
    bind_modes: Vec<(u32, BindMode)>,
    qpns: Arc<Mutex<Vec<u32>>>,
    live_id: u64,
    frame_size: u32,
    /// The sockets are bound for multi-buffer packets ([`XskConfig::multi_buffer`]).
    multi_buffer: bool,
    next_iova: Mutex<u64>,
    /// Next-hop MACs that [`Device::path_to`] resolved lately.
    hops: Mutex<HopCache>,
}

/// Bytes the kernel keeps in front of a received packet in its UMEM frame in copy mode
/// (`XDP_PACKET_HEADROOM`).
const XDP_PACKET_HEADROOM: u32 = 256;

/// Whether a link of IP MTU `mtu` carries frames (Ethernet, two VLAN tags) longer than a
/// received UMEM frame of `frame_size` bytes holds, so that its sockets need multi-buffer
/// packets to see them.
#[must_use]
pub const fn needs_multi_buffer(mtu: u32, frame_size: u32) -> bool {
    mtu + 14 + 8 > frame_size.saturating_sub(XDP_PACKET_HEADROOM)
}

/// How long [`Device::path_to`] reuses a destination's next-hop MAC before asking the routing
/// and neighbour tables again. Connecting many QPs to one peer (`roce perf -q 1024`) then
/// costs one `ip route get` and one neighbour lookup instead of one per QP; a QP keeps the
/// path it was connected with either way.
pub const PATH_CACHE_TTL: Duration = Duration::from_secs(10);

/// Destination IP → (next-hop MAC, when it was resolved), for [`PATH_CACHE_TTL`].
#[derive(Debug, Default)]
struct HopCache(std::collections::HashMap<IpAddr, ([u8; 6], StdInstant)>);

impl HopCache {
    /// The MAC resolved for `dst` less than [`PATH_CACHE_TTL`] before `now`.
    fn get(&self, dst: IpAddr, now: StdInstant) -> Option<[u8; 6]> {
        self.0
            .get(&dst)
            .filter(|(_, at)| now.saturating_duration_since(*at) < PATH_CACHE_TTL)
            .map(|(mac, _)| *mac)
    }

    /// Records `mac` for `dst`, resolved at `now`; forgets entries past their time, so the
    /// cache holds only the destinations of the last [`PATH_CACHE_TTL`].
    fn insert(&mut self, dst: IpAddr, mac: [u8; 6], now: StdInstant) {
        self.0
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < PATH_CACHE_TTL);
        self.0.insert(dst, (mac, now));
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ifname", &self.info.ifname)
            .field("queues", &self.bind_modes)
            .finish()
    }
}

fn random_seed() -> Result<[u8; 32], ApiError> {
    let mut seed = [0u8; 32];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(os("reading /dev/urandom"))?;
    Ok(seed)
}

/// What must be undone for a device if the process has to exit without running destructors.
#[derive(Debug)]
struct LiveDevice {
    id: u64,
    ifname: String,
    loaded_here: bool,
    queues: Vec<u32>,
    qpns: Arc<Mutex<Vec<u32>>>,
}

static LIVE: Mutex<Vec<LiveDevice>> = Mutex::new(Vec::new());
static NEXT_LIVE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn register_live(mut d: LiveDevice) -> u64 {
    d.id = NEXT_LIVE_ID.fetch_add(1, Ordering::Relaxed);
    let id = d.id;
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(d);
    id
}

fn unregister_live(id: u64) {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|d| d.id != id);
}

/// Undoes what every open [`Device`] of this process set up in the kernel — its QPNs in the XDP
/// QP map, its sockets in the XSK map, and roce_xdp itself where the device loaded it — without
/// stopping its threads. Call it only right before the process exits on a signal, when the
/// devices' destructors will not run (for example while blocked in an out-of-band `accept`).
pub fn release_all_for_exit() {
    let live = std::mem::take(
        &mut *LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for d in live {
        let pins = Pins::new(&d.ifname);
        if let Ok(mut xsks) = pins.xsks() {
            for q in &d.queues {
                let _ = xsks.unset(*q);
            }
        }
        for n in d
            .qpns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            let _ = pins.remove_qp(n);
        }
        if d.loaded_here {
            let _ = loader::unload(&d.ifname);
        }
    }
}

/// Takes the per-interface lock (`/run/roce/<ifname>.lock`) that serialises QPN claims and the
/// folding of counters between processes.
fn lock_file(ifname: &str) -> Result<nix::fcntl::Flock<File>, ApiError> {
    fs::create_dir_all("/run/roce").map_err(os("creating /run/roce"))?;
    let path = format!("/run/roce/{ifname}.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(os("opening the QPN lock file"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| ApiError::Os {
        what: "locking the QPN lock file",
        source: e.into(),
    })
}

fn process_alive(pid: u32) -> bool {
    pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl Device {
    /// Opens `ifname` (in the calling thread's network namespace) as a RoCE device. Needs root.
    ///
    /// # Errors
    /// Not root, no such interface, the XDP program or an AF_XDP socket cannot be set up.
    pub fn open(ifname: &str, opts: &DeviceOptions) -> Result<Self, ApiError> {
        loader::require_root()?;
        let info = IfInfo::query(ifname)?;
        let pins = Pins::new(ifname);
        let loaded_here = if pins.load_info().is_ok() {
            false
        } else {
            let lo = LoadOptions {
                mode: opts.mode,
                netns: opts.netns.clone(),
                ..LoadOptions::default()
            };
            loader::load(ifname, &lo)?;
            true
        };
        let result = Self::start(info, pins.clone(), opts, loaded_here);
        if result.is_err() && loaded_here {
            let _ = loader::unload(ifname);
        }
        result
    }

    fn start(
        info: IfInfo,
        pins: Pins,
        opts: &DeviceOptions,
        loaded_here: bool,
    ) -> Result<Self, ApiError> {
        let mut config = opts.transport.clone();
        config
            .cc
            .dcqcn
            .validate()
            .map_err(transport::DeviceError::from)?;
        config.first_qpn = roce_common::maps::FIRST_QPN;
        let count = if opts.sharded {
            info.rx_queues.max(1)
        } else {
            1
        };
        let mut shards = Vec::new();
        for index in 0..count {
            let mut config = config.clone();
            config.key_seed = random_seed()?;
            config.shard = transport::Shard::new(index, count).ok_or(ApiError::TooManyQueues {
                queues: count,
                max: transport::Shard::MAX_COUNT,
            })?;
            let wake =
                EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                    .map_err(|e| ApiError::Os {
                        what: "eventfd",
                        source: e.into(),
                    })?;
            shards.push(Arc::new(Shared {
                dev: Mutex::new(transport::Device::new(config)),
                progress: Condvar::new(),
                wakers: Mutex::new(Vec::new()),
                wake,
                xsk: Mutex::new(std::collections::BTreeMap::new()),
            }));
        }
        let shards: Arc<[Arc<Shared>]> = shards.into();
        let mut queues = Vec::new();
        let mut bind_modes = Vec::new();
        let mut xsks = pins.xsks()?;
        let mut xsk_cfg = opts.xsk;
        let auto_multi = !xsk_cfg.multi_buffer && needs_multi_buffer(info.mtu, xsk_cfg.frame_size);
        xsk_cfg.multi_buffer |= auto_multi;
        for q in 0..info.rx_queues.max(1) {
            let queue = match XskQueue::open(&info.ifname, q, &xsk_cfg) {
                // A kernel without AF_XDP multi-buffer (before 6.6) refuses XDP_USE_SG: serve
                // the frames that fit, and let check_path_mtu refuse the larger path MTUs.
                Err(e) if auto_multi && q == 0 => {
                    log::warn!(
                        "{}: binding for multi-buffer packets failed ({e}); path MTUs whose frames exceed {} bytes will be refused",
                        info.ifname,
                        xsk_cfg.frame_size - XDP_PACKET_HEADROOM
                    );
                    xsk_cfg.multi_buffer = false;
                    XskQueue::open(&info.ifname, q, &xsk_cfg)?
                }
                r => r?,
            };
            xsks.set(q, queue.as_raw_fd(), 0).map_err(LoadError::from)?;
            bind_modes.push((q, queue.bind_mode()));
            queues.push(queue);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let all = Arc::clone(&shards);
        let handler = move |queue: u32| {
            let index = if all.len() == 1 { 0 } else { queue as usize };
            TransportHandler {
                shared: Arc::clone(&all[index]),
                index,
                all: Arc::clone(&all),
                activity: false,
            }
        };
        let (engines, inline, inline_thread) = if opts.inline {
            let inline = Arc::new(Inline {
                engines: Mutex::new(
                    queues
                        .into_iter()
                        .map(|q| {
                            let h = handler(q.queue_id());
                            Engine::new(q, h, opts.engine)
                        })
                        .collect(),
                ),
                clock: Clock::new(),
                last_turn: AtomicU64::new(0),
            });
            let (i, st) = (Arc::clone(&inline), Arc::clone(&stop));
            let t = std::thread::Builder::new()
                .name("roce-inline".into())
                .spawn(move || {
                    let idle = u64::try_from(INLINE_IDLE_TURN.as_nanos()).unwrap_or(u64::MAX);
                    while !st.load(Ordering::Relaxed) {
                        std::thread::sleep(INLINE_IDLE_TURN);
                        let last = i.last_turn.load(Ordering::Relaxed);
                        if i.clock.now().0.saturating_sub(last) >= idle {
                            i.turn();
                        }
                    }
                })
                .map_err(os("starting the inline helper thread"))?;
            (Vec::new(), Some(inline), Some(t))
        } else {
            let engines = spawn_engines(queues, handler, opts.engine, &stop)
                .map_err(os("starting engine threads"))?;
            (engines, None, None)
        };
        let qpns = Arc::new(Mutex::new(Vec::new()));
        let live_id = register_live(LiveDevice {
            id: 0,
            ifname: info.ifname.clone(),
            loaded_here,
            queues: bind_modes.iter().map(|(q, _)| *q).collect(),
            qpns: Arc::clone(&qpns),
        });
        let publisher = Publisher {
            shards: Arc::clone(&shards),
            pins: pins.clone(),
            bind_modes: bind_modes.clone(),
        };
        if let Ok(_lock) = lock_file(&info.ifname) {
            publisher.retire(None);
        }
        let (p, st) = (publisher.clone(), Arc::clone(&stop));
        let stats_thread = std::thread::Builder::new()
            .name("roce-stats".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    if let Err(e) = p.publish() {
                        log::warn!("publishing counters: {e}");
                    }
                    std::thread::sleep(PUBLISH_EVERY);
                }
            })
            .map_err(os("starting the stats thread"))?;
        Ok(Self {
            publisher,
            stats_thread: Some(stats_thread),
            shards,
            pins,
            stop,
            engines,
            inline,
            inline_thread,
            loaded_here,
            bind_modes,
            qpns,
            live_id,
            frame_size: opts.xsk.frame_size,
            multi_buffer: xsk_cfg.multi_buffer,
            next_iova: Mutex::new(0x1000_0000),
            hops: Mutex::new(HopCache::default()),
            info,
        })
    }

    /// The interface facts (MAC, MTU, GID table).
    #[must_use]
    pub const fn info(&self) -> &IfInfo {
        &self.info
    }

    /// How each RX queue's socket is bound (zero-copy or copy).
    #[must_use]
    pub fn bind_modes(&self) -> &[(u32, BindMode)] {
        &self.bind_modes
    }

    /// GID `index` of the GID table.
    ///
    /// # Errors
    /// No such index.
    pub fn gid(&self, index: usize) -> Result<Gid, ApiError> {
        Ok(self.info.gid(index)?)
    }

    /// Whether the sockets are bound for multi-buffer packets, so that frames larger than a
    /// UMEM frame pass ([`XskConfig::multi_buffer`]; chosen by [`Device::open`] when the link's
    /// MTU lets such frames through).
    #[must_use]
    pub const fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// The largest path MTU this device can carry, for IPv4 or IPv6 paths: what the link's MTU
    /// allows, and, unless the sockets take multi-buffer packets, what one UMEM frame holds.
    #[must_use]
    pub fn max_path_mtu(&self, ipv6: bool) -> u32 {
        let by_link = self.info.max_path_mtu(ipv6);
        if self.multi_buffer {
            return by_link;
        }
        // A received frame starts 256 bytes (XDP_PACKET_HEADROOM) into its UMEM frame.
        let room = self
            .frame_size
            .saturating_sub(XDP_PACKET_HEADROOM + 14 + 8 + 40 + 8 + 12 + 28 + 4);
        let by_frame = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| *m <= room)
            .unwrap_or(256);
        by_link.min(by_frame)
    }

    /// Fails unless a path MTU of `mtu` bytes fits this device (see [`Device::max_path_mtu`]).
    /// Tools call it before their connection setup, so a bad `-m` is reported at once.
    ///
    /// # Errors
    /// [`ApiError::Mtu`], saying what the limit is and why.
    pub fn check_path_mtu(&self, mtu: u32, ipv6: bool) -> Result<(), ApiError> {
        let max = self.max_path_mtu(ipv6);
        if mtu > max {
            return Err(ApiError::Mtu {
                asked: mtu,
                max,
                frame: self.frame_size,
                link: self.info.mtu,
            });
        }
        Ok(())
    }

    /// The address vector from local GID `gid_index` to `remote_gid`: MACs (the next hop's from the
    /// neighbour table, resolved if needed: the peer's on-link, the gateway's when routed), IPs, and the RoCE v2 UDP source port of the QP pair.
    ///
    /// # Errors
    /// Bad GID index, mixed address families, or the peer's MAC does not resolve.
    pub fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        local_qpn: Qpn,
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        let local = self.gid(gid_index)?;
        let remote_ip = crate::cm::gid_to_ip(remote_gid);
        let now = StdInstant::now();
        let cached = self
            .hops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(remote_ip, now);
        let dst_mac = match cached {
            Some(mac) => mac,
            None => {
                let hop = netinfo::next_hop(&self.info.ifname, remote_ip)?;
                let mac = netinfo::resolve_mac(&self.info.ifname, hop, Duration::from_secs(3))?;
                self.hops
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(remote_ip, mac, now);
                mac
            }
        };
        let ip = match (local.ip, remote_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpPath::V4 { src, dst },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpPath::V6 {
                src,
                dst,
                flow_label: 0,
            },
            _ => {
                return Err(ApiError::NetInfo(NetInfoError::Ip {
                    args: "path".into(),
                    msg: format!(
                        "local GID {} and remote GID {remote_ip} are of different families",
                        local.ip
                    ),
                }));
            }
        };
        let mut p = PathRepr::new(EthernetAddress(self.info.mac), EthernetAddress(dst_mac), ip);
        p.udp_src_port = udp_src_port(local_qpn, remote_qpn);
        Ok(p)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`): QPs reach only the regions of their own.
    ///
    /// # Errors
    /// Too many protection domains.
    pub fn alloc_pd(&self) -> Result<PdId, ApiError> {
        self.alloc_pd_on(0)
    }

    /// How many transports the device runs: 1, or one per RX queue when it was opened
    /// [`DeviceOptions::sharded`]. Queues `0..shards()` are valid for [`Device::alloc_pd_on`]
    /// and [`Device::create_cq_on`].
    #[must_use]
    pub fn shards(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Allocates a protection domain on `queue`'s transport: the QPs made in it live on that
    /// queue ([`DeviceOptions::sharded`]). Without sharding, queue 0 is the one transport.
    ///
    /// # Errors
    /// No such queue, or too many protection domains.
    pub fn alloc_pd_on(&self, queue: u32) -> Result<PdId, ApiError> {
        let sh = self.shard(queue)?;
        let raw = sh.lock().alloc_pd()?;
        Ok(PdId(raw.0 * self.shards() + queue))
    }

    fn shard(&self, queue: u32) -> Result<&Shared, ApiError> {
        self.shards
            .get(queue as usize)
            .map(AsRef::as_ref)
            .ok_or(ApiError::NoSuchQueue {
                queue,
                shards: self.shards(),
            })
    }

    /// The transport of QP `qpn` ([`transport::Shard::of_qpn`]).
    fn by_qpn(&self, qpn: Qpn) -> &Shared {
        &self.shards[transport::Shard::of_qpn(self.shards(), qpn) as usize]
    }

    /// The transport of memory key `key` ([`transport::Shard::of_key`]).
    fn by_key(&self, key: u32) -> &Shared {
        &self.shards[transport::Shard::of_key(self.shards(), key) as usize]
    }

    /// A PD's queue and its number in that queue's transport. The API numbers PDs and CQs
    /// `raw * shards + queue`, so with one transport they are the transport's own.
    fn split_pd(&self, pd: PdId) -> (u32, PdId) {
        let n = self.shards.len() as u32;
        (pd.0 % n, PdId(pd.0 / n))
    }

    /// A CQ's queue and its number in that queue's transport (see [`Device::split_pd`]).
    fn split_cq(&self, cq: CqId) -> (u32, CqId) {
        let n = self.shards.len() as u32;
        (cq.0 % n, CqId(cq.0 / n))
    }

    /// Registers a zeroed region of `len` bytes in `pd` (`ibv_reg_mr`).
    ///
    /// # Errors
    /// Too many regions, an unknown PD, or bad access flags.
    pub fn reg_mr(&self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, ApiError> {
        let mut next = self
            .next_iova
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let iova = *next;
        *next = next.saturating_add((len as u64).div_ceil(4096).max(1) * 4096 + 4096);
        drop(next);
        let (queue, raw) = self.split_pd(pd);
        let mut info =
            self.shards[queue as usize]
                .lock()
                .reg_mr(raw, vec![0; len], iova, access)?;
        info.pd = pd;
        Ok(info)
    }

    /// Deregisters a region; in-flight operations on it fail with access errors, never touch freed memory.
    ///
    /// # Errors
    /// Unknown key.
    pub fn dereg_mr(&self, lkey: LKey) -> Result<(), ApiError> {
        self.by_key(lkey.value()).lock().dereg_mr(lkey)?;
        Ok(())
    }

    /// Copies `data` into region `lkey` at `offset`.
    ///
    /// # Errors
    /// Unknown key or out of bounds.
    pub fn mr_write(&self, lkey: LKey, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        let mut dev = self.by_key(lkey.value()).lock();
        let buf = dev
            .mrs_mut()
            .bytes_mut(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        let end = offset
            .checked_add(data.len())
            .filter(|e| *e <= buf.len())
            .ok_or(ApiError::OutOfBounds {
                lkey,
                offset,
                end: offset.saturating_add(data.len()),
                len: buf.len(),
            })?;
        buf[offset..end].copy_from_slice(data);
        Ok(())
    }

    /// Copies `out.len()` bytes of region `lkey` at `offset` into `out`.
    ///
    /// # Errors
    /// Unknown key or out of bounds.
    pub fn mr_read(&self, lkey: LKey, offset: usize, out: &mut [u8]) -> Result<(), ApiError> {
        let dev = self.by_key(lkey.value()).lock();
        let buf = dev
            .mrs()
            .bytes(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        let end = offset
            .checked_add(out.len())
            .filter(|e| *e <= buf.len())
            .ok_or(ApiError::OutOfBounds {
                lkey,
                offset,
                end: offset.saturating_add(out.len()),
                len: buf.len(),
            })?;
        out.copy_from_slice(&buf[offset..end]);
        Ok(())
    }

    /// Runs `f` over region `lkey`'s bytes (for checksums without a copy).
    ///
    /// # Errors
    /// Unknown key.
    pub fn with_mr<R>(&self, lkey: LKey, f: impl FnOnce(&[u8]) -> R) -> Result<R, ApiError> {
        let dev = self.by_key(lkey.value()).lock();
        let buf = dev
            .mrs()
            .bytes(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        Ok(f(buf))
    }

    /// The regions whose canary bytes changed ([`transport::MR_GUARD_LEN`] bytes kept before
    /// and after every region): empty unless something wrote outside a registered region.
    /// Check it after hostile traffic, as `tests/tests/hostile.rs` does.
    #[must_use]
    pub fn mr_guard_violations(&self) -> Vec<LKey> {
        self.shards
            .iter()
            .flat_map(|sh| sh.lock().mrs().guard_violations())
            .collect()
    }

    /// Creates a CQ of `depth` entries.
    ///
    /// # Errors
    /// Too many CQs or too deep.
    pub fn create_cq(&self, depth: usize) -> Result<CqId, ApiError> {
        self.create_cq_on(0, depth)
    }

    /// Creates a CQ of `depth` entries on `queue`'s transport, for the QPs of that queue's
    /// PDs ([`DeviceOptions::sharded`]).
    ///
    /// # Errors
    /// No such queue, too many CQs or too deep.
    pub fn create_cq_on(&self, queue: u32, depth: usize) -> Result<CqId, ApiError> {
        let raw = self.shard(queue)?.lock().create_cq(depth)?;
        Ok(CqId(raw.0 * self.shards() + queue))
    }

    /// Creates a QP in RESET (`ibv_create_qp`) and claims its QPN in the XDP QP map, so that
    /// roce_xdp steers its packets here.
    ///
    /// # Errors
    /// Limits, or no free QPN.
    pub fn create_qp(&self, init: QpInit) -> Result<Qpn, ApiError> {
        let (queue, pd) = self.split_pd(init.pd);
        let (sq, send_cq) = self.split_cq(init.send_cq);
        let (rq, recv_cq) = self.split_cq(init.recv_cq);
        for (which, cq) in [("send", sq), ("recv", rq)] {
            if cq != queue {
                return Err(ApiError::OtherQueue {
                    pd: queue,
                    which,
                    cq,
                });
            }
        }
        let init = QpInit {
            pd,
            send_cq,
            recv_cq,
            ..init
        };
        let sh = &self.shards[queue as usize];
        let _lock = lock_file(&self.info.ifname)?;
        let qps = self.pins.qps()?;
        let me = std::process::id();
        for _ in 0..MAX_QPS {
            let qpn = sh.lock().create_qp(init)?;
            let n = qpn.value();
            if n >= MAX_QPS {
                sh.lock().destroy_qp(qpn)?;
                return Err(ApiError::NoQpn(self.info.ifname.clone()));
            }
            let owner = qps.get(&n, 0).map_or(0, |e| e.owner);
            if owner == 0 || owner == me || !process_alive(owner) {
                drop(qps);
                self.pins.add_qp(n, me)?;
                self.qpns
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(n);
                return Ok(qpn);
            }
            sh.lock().destroy_qp(qpn)?;
        }
        Err(ApiError::NoQpn(self.info.ifname.clone()))
    }

    /// Destroys a QP and releases its QPN.
    ///
    /// # Errors
    /// No such QP.
    pub fn destroy_qp(&self, qpn: Qpn) -> Result<(), ApiError> {
        self.by_qpn(qpn).lock().destroy_qp(qpn)?;
        let _ = self
            .pins
            .qps()
            .and_then(|mut m| Ok(m.set(qpn.value(), QpEntry::default(), 0)?));
        self.qpns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|n| *n != qpn.value());
        Ok(())
    }

    /// Modifies a QP (`ibv_modify_qp`); refuses a path MTU the frames cannot carry.
    ///
    /// # Errors
    /// Illegal transition, wrong mask, or MTU too large.
    pub fn modify_qp(&self, qpn: Qpn, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError> {
        if mask.contains(AttrMask::PATH_MTU) {
            let ipv6 = matches!(attr.ah_attr.map(|p| p.ip), Some(IpPath::V6 { .. }));
            let max = self.max_path_mtu(ipv6);
            if attr.path_mtu.bytes() > max {
                return Err(ApiError::Mtu {
                    asked: attr.path_mtu.bytes(),
                    max,
                    frame: self.frame_size,
                    link: self.info.mtu,
                });
            }
        }
        let sh = self.by_qpn(qpn);
        sh.lock().modify_qp(qpn, attr, mask)?;
        sh.kick();
        Ok(())
    }

    /// RESET → INIT, allowing the peer `access` (`IBV_QP_STATE | PKEY_INDEX | PORT |
    /// ACCESS_FLAGS`, P_Key index 0, port 1).
    ///
    /// # Errors
    /// As [`Device::modify_qp`].
    pub fn qp_to_init(&self, qpn: Qpn, access: Access) -> Result<(), ApiError> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        self.modify_qp(qpn, &attr, mask)
    }

    /// INIT → RTR → RTS with the required attributes of each transition (the verbs state table).
    ///
    /// # Errors
    /// As [`Device::modify_qp`]; a path MTU too large for this device among them.
    pub fn qp_connect(&self, qpn: Qpn, c: &RcConnect) -> Result<(), ApiError> {
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: c.path_mtu,
            dest_qp_num: c.dest_qpn,
            rq_psn: c.rq_psn,
            max_dest_rd_atomic: c.max_dest_rd_atomic,
            min_rnr_timer: c.min_rnr_timer,
            ah_attr: Some(c.path),
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        self.modify_qp(qpn, &rtr, mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            sq_psn: c.sq_psn,
            max_rd_atomic: c.max_rd_atomic,
            ..rtr
        };
        let mask = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        self.modify_qp(qpn, &rts, mask)
    }

    /// The state of a QP.
    #[must_use]
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.by_qpn(qpn).lock().qp(qpn).map(transport::Qp::state)
    }

    /// Posts a send WR (`ibv_post_send`).
    ///
    /// # Errors
    /// As the transport's `post_send`.
    pub fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError> {
        let sh = self.by_qpn(qpn);
        sh.lock().post_send(qpn, wr)?;
        sh.kick();
        self.drive();
        Ok(())
    }

    /// Posts a receive WR (`ibv_post_recv`).
    ///
    /// # Errors
    /// As the transport's `post_recv`.
    pub fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError> {
        let sh = self.by_qpn(qpn);
        sh.lock().post_recv(qpn, wr)?;
        sh.kick();
        self.drive();
        Ok(())
    }

    /// Takes up to `max` completions without waiting (`ibv_poll_cq`).
    #[must_use]
    pub fn poll_cq(&self, cq: CqId, max: usize) -> Vec<Wc> {
        self.drive();
        let (queue, cq) = self.split_cq(cq);
        let mut dev = self.shards[queue as usize].lock();
        let mut out = Vec::new();
        while out.len() < max {
            match dev.poll_cq(cq) {
                Some(wc) => out.push(wc),
                None => break,
            }
        }
        out
    }

    /// Waits up to `timeout` for a completion on `cq` (the blocking form of `ibv_get_cq_event`
    /// plus `ibv_poll_cq`).
    #[must_use]
    pub fn wait_cq(&self, cq: CqId, timeout: Duration) -> Option<Wc> {
        let deadline = StdInstant::now() + timeout;
        let (queue, cq) = self.split_cq(cq);
        let sh = &self.shards[queue as usize];
        if let Some(inline) = &self.inline {
            return Self::wait_cq_inline(sh, inline, cq, deadline);
        }
        let mut dev = sh.lock();
        loop {
            if let Some(wc) = dev.poll_cq(cq) {
                return Some(wc);
            }
            let left = deadline.checked_duration_since(StdInstant::now())?;
            dev = sh
                .progress
                .wait_timeout(dev, left.min(Duration::from_millis(50)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// [`Device::wait_cq`] of an inline device: turns, and waits on the sockets in between.
    fn wait_cq_inline(sh: &Shared, inline: &Inline, cq: CqId, deadline: StdInstant) -> Option<Wc> {
        loop {
            inline.turn();
            let next = {
                let mut dev = sh.lock();
                if let Some(wc) = dev.poll_cq(cq) {
                    return Some(wc);
                }
                dev.poll_timeout()
            };
            let left = deadline.checked_duration_since(StdInstant::now())?;
            // Until a frame arrives, another thread posts (the eventfd), the next transport
            // timer, or 1 ms (completions another thread's turn produced).
            let mut wait = left.min(INLINE_IDLE_TURN);
            if let Some(t) = next {
                let now = inline.clock.now().0;
                wait = wait.min(Duration::from_nanos(t.as_nanos().saturating_sub(now)));
            }
            if !wait.is_zero() {
                inline.wait(wait, &sh.wake);
            }
        }
    }

    /// Runs an engine turn on an inline device ([`DeviceOptions::inline`]); nothing otherwise.
    fn drive(&self) {
        if let Some(inline) = &self.inline {
            inline.turn();
        }
    }

    /// A future that resolves with the next completion of `cq` (async wait).
    #[must_use]
    pub fn cq_ready(&self, cq: CqId) -> CqReady<'_> {
        CqReady { dev: self, cq }
    }

    /// Transport counters: the device's own, and each QP's.
    #[must_use]
    pub fn counters(&self) -> (DeviceCounters, Vec<(Qpn, QpCounters)>) {
        let mut devc = DeviceCounters::default();
        let mut qps = Vec::new();
        for sh in self.shards.iter() {
            let dev = sh.lock();
            qps.extend(dev.qps().map(|q| (q.qpn(), *q.counters())));
            devc.add(dev.device_counters());
        }
        (devc, qps)
    }

    /// Changes one congestion-control parameter of an RC QP: a DCQCN parameter under its mlx5
    /// name (`rpg_ai_rate`, `min_time_between_cnps`, ... see [`crate::cc::DcqcnConfig`]), or
    /// `rp_enabled` / `np_enabled` / `enabled` (0 or 1). The QP's rate state starts afresh.
    /// Load-time settings for every QP are [`DeviceOptions::transport`]`.cc`.
    ///
    /// # Errors
    /// No such QP, a UD QP, an unknown name or a value out of range.
    pub fn set_cc_param(&self, qpn: Qpn, name: &str, value: u64) -> Result<(), ApiError> {
        self.by_qpn(qpn).lock().set_cc_param(qpn, name, value)?;
        Ok(())
    }

    /// The DCQCN state of every RC QP of this device (rate, target, α, stage, counters).
    #[must_use]
    pub fn cc_snapshots(&self) -> Vec<(Qpn, crate::cc::CcSnapshot)> {
        self.shards
            .iter()
            .flat_map(|sh| sh.lock().cc_snapshots())
            .collect()
    }

    /// Stops the engines and releases everything (also done on drop).
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.engines.is_empty()
            && self.inline.is_none()
            && self.qpns.lock().map_or(true, |q| q.is_empty())
            && !self.loaded_here
        {
            return;
        }
        self.stop.store(true, Ordering::SeqCst);
        for sh in self.shards.iter() {
            sh.kick();
        }
        for e in self.engines.drain(..) {
            let _ = e.join();
        }
        if let Some(t) = self.inline_thread.take() {
            let _ = t.join();
        }
        if let Some(inline) = self.inline.take()
            && let Ok(mut engines) = inline.engines.lock()
        {
            for e in engines.iter_mut() {
                let _ = e.finish();
            }
        }
        if let Some(t) = self.stats_thread.take() {
            let _ = t.join();
        }
        // The last counters go into the interface's cumulative totals (QPN 0 / PID 0).
        let _ = self.publisher.publish();
        if let Ok(_lock) = lock_file(&self.info.ifname) {
            self.publisher.retire(Some(std::process::id()));
        }
        if let Ok(mut xsks) = self.pins.xsks() {
            for (q, _) in &self.bind_modes {
                let _ = xsks.unset(*q);
            }
        }
        let qpns = std::mem::take(
            &mut *self
                .qpns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for n in qpns {
            let _ = self.pins.remove_qp(n);
        }
        if std::mem::take(&mut self.loaded_here) {
            let _ = loader::unload(&self.info.ifname);
        }
        unregister_live(self.live_id);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The future of [`Device::cq_ready`].
#[derive(Debug)]
pub struct CqReady<'a> {
    dev: &'a Device,
    cq: CqId,
}

impl Future for CqReady<'_> {
    type Output = Wc;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Wc> {
        let (queue, cq) = self.dev.split_cq(self.cq);
        let sh = &self.dev.shards[queue as usize];
        let mut dev = sh.lock();
        if let Some(wc) = dev.poll_cq(cq) {
            return Poll::Ready(wc);
        }
        // Register before releasing the device lock: engines notify only while not holding it
        // after their own updates, so a completion cannot slip between the check and this.
        sh.wakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(cx.waker().clone());
        drop(dev);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_buffer_only_where_the_link_carries_frames_longer_than_a_receive_frame() {
        // A received frame holds 4096 - 256 = 3840 bytes; a link frame is MTU + 14 + 8 (two
        // VLAN tags) at most.
        assert!(!needs_multi_buffer(1500, 4096));
        assert!(!needs_multi_buffer(3000, 4096));
        assert!(!needs_multi_buffer(3818, 4096));
        assert!(needs_multi_buffer(3819, 4096));
        assert!(needs_multi_buffer(9000, 4096));
        assert!(needs_multi_buffer(1792 - 22 + 1, 2048));
        assert!(!needs_multi_buffer(1500, 2048));
    }

    #[test]
    fn hop_cache_reuses_a_mac_for_its_ttl_and_then_forgets_it() {
        let t0 = StdInstant::now();
        let (a, b) = (
            IpAddr::from([10, 0, 0, 1]),
            IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 2]),
        );
        let mut c = HopCache::default();
        assert_eq!(c.get(a, t0), None);
        c.insert(a, [2, 0, 0, 0, 0, 1], t0);
        let later = t0 + PATH_CACHE_TTL - Duration::from_millis(1);
        assert_eq!(c.get(a, later), Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(c.get(b, later), None);
        let expired = t0 + PATH_CACHE_TTL;
        assert_eq!(c.get(a, expired), None);
        // Inserting another destination drops the expired entry: the cache stays bounded.
        c.insert(b, [2, 0, 0, 0, 0, 2], expired);
        assert_eq!(c.0.len(), 1);
        assert_eq!(c.get(b, expired), Some([2, 0, 0, 0, 0, 2]));
    }
}
