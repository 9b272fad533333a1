//! A verbs-like application API: a [`Device`] is a Linux interface turned into a RoCE v2 device.
//!
//! [`Device::open`] loads `roce_xdp` (unless `roce load` already did), opens one AF_XDP socket per
//! RX queue, and starts one engine thread per queue that drives the sans-I/O transport. The
//! methods are the verbs a user of `libibverbs` knows — `reg_mr`, `create_cq`, `create_qp`,
//! `modify_qp`, `post_send`, `post_recv`, `poll_cq` — with Rust types instead of C structs.
//! Completion queues can be polled into a caller's slice ([`Device::poll_cq_into`]), waited on
//! (blocking), or awaited ([`Device::cq_ready`]; per work request, with owned buffers, in
//! [`asynch`]).
//!
//! Two forms of the same verbs: handles — [`Pd`], [`Mr`], [`Cq`], [`Qp`], [`Ah`], made by
//! [`Device::pd`] and [`Device::cq`] — that borrow what they were made from and release it when
//! dropped, for Rust applications; and ids ([`PdId`], [`CqId`], [`Qpn`], [`LKey`]) with
//! explicit creation and destruction ([`Device::alloc_pd`] / [`Device::dealloc_pd`],
//! [`Device::create_cq`] / [`Device::destroy_cq`], ...), for a C layer. Both follow the verbs'
//! rules: a PD with regions or QPs and a CQ with QPs cannot be freed ([`ApiError::PdBusy`],
//! [`ApiError::CqBusy`], `EBUSY`).
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
//!
//! # Example
//!
//! An RDMA WRITE and a SEND over one RC connection, the peers exchanging QP numbers over TCP as
//! `ibv_rc_pingpong` does: `roce-user/examples/rc_write.rs`, run by the privileged test
//! `tests/tests/handles.rs` (`cargo run -p roce-user --example rc_write -- IFNAME [SERVER_IP]`
//! as root). An async server that serves many RC QPs at once, on [`asynch`] and tokio:
//! `roce-user/examples/async_echo.rs`, run by `tests/tests/async_api.rs`.
//!
#![doc = concat!("```no_run\n", include_str!("../../examples/rc_write.rs"), "```")]

pub mod asynch;
mod claims;
mod cm;
mod cq;
pub mod env;
mod error;
mod handles;
mod path;
mod rdma_device;
pub mod remote;
mod srq;
mod verbs_device;

use std::{
    fs::File,
    io::Read as _,
    os::fd::AsRawFd as _,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use nix::sys::eventfd::{EfdFlags, EventFd};
use roce_common::maps::{MAX_QPS, QP_FLAG_TIME_RESPONSES, QpEntry};

pub use self::verbs_device::{CmDevice, VerbsDevice};
pub use crate::transport::Event;
pub use crate::transport::{
    Access, AttrMask, BindMw, CqId, DeviceConfig, DeviceCounters, ExternalMem, LKey, MemBuf,
    Memory, MrInfo, Mtu, MwType, Path, PdId, PostError, Psn, QKey, QpAttr, QpCap, QpCounters,
    QpInit, QpState, QpType, Qpn, RKey, RawMem, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr,
    SrqAttrMask, SrqId, UdDest, Wc, WcFlags, WcOpcode, WcStatus,
};
use crate::{
    engine::{Clock, Engine, EngineConfig, EngineThread, spawn_engines},
    loader::{self, AttachMode, LoadError, LoadOptions, Pins},
    netinfo::{Gid, IfInfo},
    transport::{self},
    wire::IpPath,
    xsk::{BindMode, XskConfig, XskQueue},
};

use self::claims::lock_file;
pub use self::{
    cm::{
        CaGuid, CmAccept, CmConnect, CmEvent, CmState, CmStats, CommId, IbaTime, PathMtu,
        PortSpace, RejReason, ServiceId, SidrStatus,
    },
    cq::CqReady,
    error::ApiError,
    handles::{Ah, Cq, Mr, Mw, Pd, Qp},
    path::{PATH_CACHE_TTL, needs_multi_buffer},
    rdma_device::{RcTarget, RdmaDevice},
    srq::Srq,
};
use self::{
    error::os,
    path::{HopCache, XDP_PACKET_HEADROOM},
};
use crate::engine::{
    capture::Capture,
    driver::{INBOX_SLOTS, Inbox, Inline, Shared, TransportHandler},
    exit::{LastWords, LiveDevice, register_live, unregister_live},
    publish::Publisher,
};
pub use crate::engine::{exit::release_all_for_exit, publish::PUBLISH_EVERY};

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
    /// (`roce pingpong` without `-e`, `roce perf --inline`). A helper thread runs a turn when a
    /// frame arrives that no application thread is polling for, and every
    /// [`INLINE_IDLE_TURN`] for the timers, so ACKs, READ responses and retransmissions go on
    /// while the application does other things.
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
    /// The level of roce_xdp's log records (`roce log` reads them) when the device loads
    /// roce_xdp itself; a program already attached keeps its level. Off by default.
    pub log_level: roce_common::log::LogLevel,
}

/// How often the helper thread of an inline device ([`DeviceOptions::inline`]) drives the
/// queues (for the transport's timers) when no frame arrived and no application thread has.
pub const INLINE_IDLE_TURN: Duration = Duration::from_millis(1);

/// An application thread that turned an inline device's engines this recently is taken to be
/// polling (a busy `ibv_poll_cq` loop turns every microsecond or so): the helper thread leaves
/// a frame that just arrived to it.
const INLINE_APP_POLLING: Duration = Duration::from_micros(10);

/// While an application thread polls (turned this recently, and has not said it blocks:
/// [`Inline::app_blocks`]), the helper thread of an inline device sleeps on the kicks only,
/// so that arriving frames wake nobody, and looks again this often: the longest a frame
/// waits when every application thread stops polling without blocking in a verb.
const INLINE_APP_WATCH: Duration = Duration::from_micros(100);

/// The helper thread of an inline device, until `stop`: the only thread that sleeps on the
/// queues' sockets, and only while no application thread polls (none turned in the last
/// [`INLINE_APP_WATCH`], or the last one blocked: [`Inline::app_blocks`]; else it sleeps on
/// the kicks and looks again after [`INLINE_APP_WATCH`]). It turns the engines when a frame
/// arrives that no application thread is about to handle (none turned in the last
/// [`INLINE_APP_POLLING`]), when a verb call could
/// not turn because another thread was (its kick, on a shard's eventfd), and every
/// [`INLINE_IDLE_TURN`] for the timers. So the passive side of a WRITE or READ, whose program
/// calls no verb while the data comes in (or spins on its buffer, as `ib_write_lat` does),
/// acknowledges and answers at once; and threads blocked in `wait_cq`/`wait_event` wait on
/// the condition variables its turns notify.
fn inline_helper(
    inline: &Inline,
    shards: &[Arc<Shared>],
    waiters: &[crate::xsk::RxWaiter],
    stop: &AtomicBool,
) {
    use std::os::fd::AsFd as _;
    let as_nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (idle, polling) = (as_nanos(INLINE_IDLE_TURN), as_nanos(INLINE_APP_POLLING));
    let watch = as_nanos(INLINE_APP_WATCH);
    let wakes: Vec<_> = shards.iter().map(|s| s.wake.as_fd()).collect();
    while !stop.load(Ordering::Relaxed) {
        // Watch (sleep on the kicks only) while an application thread polls: it takes the
        // frames as they come, and a frame that wakes this thread costs the sender's kick a
        // wake-up and this core a context switch. SeqCst against `Inline::app_blocks`.
        inline.watching.store(true, Ordering::SeqCst);
        let app_polling = inline
            .clock
            .now()
            .as_nanos()
            .saturating_sub(inline.last_app_turn.load(Ordering::SeqCst))
            < watch;
        if !app_polling {
            inline.watching.store(false, Ordering::Relaxed);
        }
        let (socks, timeout) = if app_polling {
            (&[][..], INLINE_APP_WATCH)
        } else {
            (waiters, INLINE_IDLE_TURN)
        };
        let waited = crate::xsk::RxWaiter::wait_any(socks, &wakes, timeout);
        inline.watching.store(false, Ordering::Relaxed);
        let (arrived, kicked) = match waited {
            Ok(w) => w,
            Err(e) => {
                log::debug!("inline helper: {e}");
                std::thread::sleep(INLINE_IDLE_TURN);
                (false, false)
            }
        };
        if kicked {
            for sh in shards {
                // Cleared before the turn, which then sees everything posted before the kick.
                let _ = sh.wake.read();
            }
            // A verb call found the engines busy: make sure a turn follows its post.
            while !inline.helper_turn() && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(10));
            }
            continue;
        }
        let now = inline.clock.now().as_nanos();
        let since = |t: &AtomicU64| now.saturating_sub(t.load(Ordering::Relaxed));
        if inline.kick_owed.load(Ordering::SeqCst) && since(&inline.last_app_turn) >= polling {
            // An application thread's turn left frames unkicked and it has not turned since.
            inline.helper_turn();
        }
        if arrived {
            let app = since(&inline.last_app_turn);
            if app < polling {
                // An application thread is polling; give it the time to take the frame.
                std::thread::sleep(Duration::from_nanos(polling - app));
            } else if !inline.helper_turn() {
                // An application thread is turning right now.
                std::thread::sleep(Duration::from_micros(10));
            }
        } else if since(&inline.last_turn) >= idle {
            inline.helper_turn();
        }
    }
}

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
            log_level: roce_common::log::LogLevel::Off,
        }
    }
}

/// A RoCE v2 device on a Linux interface. Dropping it stops the engines, releases its QPNs and,
/// if it loaded roce_xdp, unloads it.
pub struct Device {
    publisher: Publisher,
    /// Whether `roce dump` captures this interface, and this device's capture ring.
    capture: Arc<Capture>,
    stats_thread: Option<std::thread::JoinHandle<()>>,
    /// The transports: one, or one per RX queue ([`DeviceOptions::sharded`]), in queue order.
    shards: Arc<[Arc<Shared>]>,
    info: IfInfo,
    pins: Pins,
    stop: Arc<AtomicBool>,
    /// The engine threads (none for an inline device); shared with the device's last words
    /// at process exit, which wait for them to drain.
    engines: Arc<Mutex<Vec<EngineThread<TransportHandler>>>>,
    /// The queues' engines of an inline device ([`DeviceOptions::inline`]), driven by the
    /// application's threads and the helper thread.
    inline: Option<Arc<Inline>>,
    inline_thread: Option<std::thread::JoinHandle<()>>,
    loaded_here: bool,
    /// The XDP link of a roce_xdp this device loaded: dropping it detaches the program.
    held: Option<loader::HeldLink>,
    bind_modes: Vec<(u32, BindMode)>,
    qpns: Arc<Mutex<Vec<u32>>>,
    live_id: u64,
    frame_size: u32,
    /// The sockets are bound for multi-buffer packets ([`XskConfig::multi_buffer`]).
    multi_buffer: bool,
    next_iova: Mutex<u64>,
    /// Next-hop MACs that [`Device::path_to`] resolved lately.
    hops: Mutex<HopCache>,
    /// Time for the calls that start CM timers, started before the engines' own clocks so
    /// that a deadline it sets is never early by their measure.
    clock: Clock,
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

impl Device {
    /// Opens `ifname` (in the calling thread's network namespace) as a RoCE device. Needs root.
    ///
    /// # Errors
    /// Not root, no such interface, the XDP program or an AF_XDP socket cannot be set up.
    pub fn open(ifname: &str, opts: &DeviceOptions) -> Result<Self, ApiError> {
        loader::require_root()?;
        let info = IfInfo::query(ifname)?;
        let pins = Pins::new(ifname);
        // roce_xdp loaded for this device alone is held, not pinned: the kernel detaches it
        // when the process ends, however it ends.
        let held = if pins.is_attached() {
            None
        } else {
            let lo = LoadOptions {
                mode: opts.mode,
                netns: opts.netns.clone().or_else(crate::netns::identify),
                log_level: opts.log_level,
                ..LoadOptions::default()
            };
            Some(loader::load_held(ifname, &lo)?.1)
        };
        let loaded_here = held.is_some();
        let result = Self::start(info, pins.clone(), opts, held).map_err(|e| queue_taken(e, &pins));
        if result.is_err() && loaded_here {
            let _ = loader::unload(ifname);
        }
        result
    }

    fn start(
        info: IfInfo,
        pins: Pins,
        opts: &DeviceOptions,
        held: Option<loader::HeldLink>,
    ) -> Result<Self, ApiError> {
        let loaded_here = held.is_some();
        let clock = Clock::new();
        let mut config = opts.transport.clone();
        config
            .cc
            .dcqcn
            .validate()
            .map_err(transport::DeviceError::from)?;
        config.first_qpn = roce_common::maps::FIRST_QPN;
        config.qpn_limit = MAX_QPS;
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
                progress_sleepers: AtomicUsize::new(0),
                events: Condvar::new(),
                wakers: Mutex::new(Vec::new()),
                wake,
                xsk: Mutex::new(std::collections::BTreeMap::new()),
                inbox: Inbox::new(
                    if opts.sharded { INBOX_SLOTS } else { 0 },
                    // The longest frame a queue delivers: the link MTU, Ethernet and two VLAN
                    // tags.
                    info.mtu as usize + 14 + 8,
                ),
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
            let queue = match open_queue(&info.ifname, q, &xsk_cfg, &pins) {
                // A kernel without AF_XDP multi-buffer (before 6.6) refuses XDP_USE_SG: serve
                // the frames that fit, and let check_path_mtu refuse the larger path MTUs.
                Err(e) if auto_multi && q == 0 => {
                    log::warn!(
                        "{}: binding for multi-buffer packets failed ({e}); path MTUs whose frames exceed {} bytes will be refused",
                        info.ifname,
                        xsk_cfg.frame_size - XDP_PACKET_HEADROOM
                    );
                    xsk_cfg.multi_buffer = false;
                    open_queue(&info.ifname, q, &xsk_cfg, &pins)?
                }
                r => r?,
            };
            xsks.set(q, queue.as_raw_fd(), 0).map_err(LoadError::from)?;
            bind_modes.push((q, queue.bind_mode()));
            queues.push(queue);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let all = Arc::clone(&shards);
        let mac = info.mac;
        // `roce dump`: look for a capture before the first frame moves.
        let capture = Arc::new(Capture::new(&info.ifname));
        capture.refresh();
        let cap = Arc::clone(&capture);
        let handler = move |queue: u32| {
            let index = if all.len() == 1 { 0 } else { queue as usize };
            TransportHandler {
                shared: Arc::clone(&all[index]),
                index,
                all: Arc::clone(&all),
                activity: false,
                mac,
                queue,
                capture: Arc::clone(&cap),
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
                last_app_turn: AtomicU64::new(0),
                watching: AtomicBool::new(false),
                kick_owed: AtomicBool::new(false),
            });
            let waiters = {
                let engines = inline
                    .engines
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                engines
                    .iter()
                    .map(|e| e.queue().rx_waiter())
                    .collect::<Result<Vec<_>, _>>()?
            };
            let (i, st, sh) = (Arc::clone(&inline), Arc::clone(&stop), Arc::clone(&shards));
            let t = std::thread::Builder::new()
                .name("roce-inline".into())
                .spawn(move || inline_helper(&i, &sh, &waiters, &st))
                .map_err(os("starting the inline helper thread"))?;
            (Vec::new(), Some(inline), Some(t))
        } else {
            let engines = spawn_engines(queues, handler, opts.engine, &stop)
                .map_err(os("starting engine threads"))?;
            (engines, None, None)
        };
        let engines = Arc::new(Mutex::new(engines));
        let publisher = Publisher {
            shards: Arc::clone(&shards),
            pins: pins.clone(),
            bind_modes: bind_modes.clone(),
            writing: Arc::new(Mutex::new(())),
        };
        let qpns = Arc::new(Mutex::new(Vec::new()));
        let live_id = register_live(LiveDevice {
            id: 0,
            ifname: info.ifname.clone(),
            loaded_here,
            queues: bind_modes.iter().map(|(q, _)| *q).collect(),
            qpns: Arc::clone(&qpns),
            last_words: Some(last_words(
                &shards,
                inline.as_ref(),
                &engines,
                &stop,
                clock,
                opts.engine.drain_timeout,
                (publisher.clone(), info.ifname.clone()),
            )),
        });
        if let Ok(_lock) = lock_file(&info.ifname) {
            publisher.retire(None);
        }
        let (p, st, cap) = (publisher.clone(), Arc::clone(&stop), Arc::clone(&capture));
        let stats_thread = std::thread::Builder::new()
            .name("roce-stats".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    if let Err(e) = p.publish() {
                        log::warn!("publishing counters: {e}");
                    }
                    cap.refresh();
                    std::thread::sleep(PUBLISH_EVERY);
                }
            })
            .map_err(os("starting the stats thread"))?;
        Ok(Self {
            publisher,
            capture,
            stats_thread: Some(stats_thread),
            shards,
            pins,
            stop,
            engines,
            inline,
            inline_thread,
            loaded_here,
            held,
            bind_modes,
            qpns,
            live_id,
            frame_size: opts.xsk.frame_size,
            multi_buffer: xsk_cfg.multi_buffer,
            next_iova: Mutex::new(0x1000_0000),
            hops: Mutex::new(HopCache::default()),
            clock,
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

    /// Frees a protection domain (`ibv_dealloc_pd`). Call it after deregistering its memory
    /// regions and destroying its QPs; [`Pd`] does it when dropped.
    ///
    /// # Errors
    /// [`ApiError::PdBusy`] while a region or a QP uses it (`EBUSY`), or no such PD.
    pub fn dealloc_pd(&self, pd: PdId) -> Result<(), ApiError> {
        let (queue, raw) = self.split_pd(pd);
        match self.shards[queue as usize].lock().dealloc_pd(raw) {
            Ok(()) => Ok(()),
            Err(transport::DeviceError::PdInUse(_)) => Err(ApiError::PdBusy(pd)),
            Err(transport::DeviceError::NoSuchPd(_)) => {
                Err(transport::DeviceError::NoSuchPd(pd).into())
            }
            Err(e) => Err(e.into()),
        }
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

    /// Registers a zeroed region of `len` bytes in `pd` (`ibv_reg_mr`), owned by the device
    /// until [`Device::dereg_mr`]; reach its bytes with [`Device::mr_write`],
    /// [`Device::mr_read`] and [`Device::with_mr`].
    ///
    /// # Errors
    /// Too many regions, an unknown PD, or bad access flags.
    pub fn reg_mr(&self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, ApiError> {
        self.reg_mr_mem(pd, MemBuf::zeroed(len), access)
    }

    /// Registers `mem` in `pd` (`ibv_reg_mr`): a [`MemBuf`] the application filled (the device
    /// owns it until [`Device::dereg_mr`] hands it back), or a [`RawMem`], memory the
    /// application keeps, described by address and length. The transport copies between the
    /// wire and this memory directly. A buffer gets an I/O virtual address chosen here; raw
    /// memory keeps its own address as its iova, as `ibv_reg_mr` does (use
    /// [`Device::reg_mr_iova`] to choose another).
    ///
    /// # Errors
    /// Too many regions, an unknown PD, or bad access flags.
    pub fn reg_mr_mem(
        &self,
        pd: PdId,
        mem: impl Into<Memory>,
        access: Access,
    ) -> Result<MrInfo, ApiError> {
        let mem = mem.into();
        let iova = match &mem {
            Memory::Raw(raw) => raw.addr(),
            Memory::External(e) => e.addr(),
            Memory::Owned(buf) => {
                let mut next = self
                    .next_iova
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let iova = *next;
                *next = next.saturating_add((buf.len() as u64).div_ceil(4096).max(1) * 4096 + 4096);
                iova
            }
        };
        self.reg_mr_iova(pd, mem, iova, access)
    }

    /// Registers `mem` in `pd` at I/O virtual address `iova` (`ibv_reg_mr_iova`): work
    /// requests and peers name its bytes `iova..iova + len`.
    ///
    /// # Errors
    /// Too many regions, an unknown PD, a range that overflows, or bad access flags.
    pub fn reg_mr_iova(
        &self,
        pd: PdId,
        mem: impl Into<Memory>,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, ApiError> {
        let (queue, raw) = self.split_pd(pd);
        let mut info = self.shards[queue as usize]
            .lock()
            .reg_mr(raw, mem, iova, access)?;
        info.pd = pd;
        Ok(info)
    }

    /// Deregisters a region (`ibv_dereg_mr`) and returns its memory: the buffer of a
    /// [`MemBuf`] registration, or the [`RawMem`] description. In-flight operations on it fail
    /// with access errors; when this returns, no operation touches the memory any more, so
    /// raw memory may be freed at once.
    ///
    /// # Errors
    /// Unknown key.
    pub fn dereg_mr(&self, lkey: LKey) -> Result<Memory, ApiError> {
        Ok(self.by_key(lkey.value()).lock().dereg_mr(lkey)?)
    }

    /// Allocates a memory window of type `ty` in `pd` (`ibv_alloc_mw`) and returns its R_Key.
    /// Bind a type 1 window with [`Device::bind_mw`], a type 2 window with a
    /// [`transport::SendOp::BindMw`] work request on a QP of the same PD.
    ///
    /// # Errors
    /// Unknown PD, or the window table is full (`ENOMEM`).
    pub fn alloc_mw(&self, pd: PdId, ty: transport::MwType) -> Result<RKey, ApiError> {
        let (queue, raw) = self.split_pd(pd);
        match self.shards[queue as usize].lock().alloc_mw(raw, ty) {
            Err(transport::DeviceError::NoSuchPd(_)) => {
                Err(transport::DeviceError::NoSuchPd(pd).into())
            }
            r => Ok(r?),
        }
    }

    /// Frees the memory window `rkey` of `pd` (`ibv_dealloc_mw`), bound or not; its key stops
    /// working at once. Any key the window had since its allocation names it.
    ///
    /// # Errors
    /// Unknown window.
    pub fn dealloc_mw(&self, pd: PdId, rkey: RKey) -> Result<(), ApiError> {
        let (queue, _) = self.split_pd(pd);
        Ok(self.shards[queue as usize].lock().dealloc_mw(rkey)?)
    }

    /// Binds the type 1 window `bind.mw_rkey` through QP `qpn` (`ibv_bind_mw`, as rdma-core's
    /// rxe provider does it: an `IBV_WR_BIND_MW` work request whose new key is the window's
    /// key with its low 8 bits incremented, `ibv_inc_rkey`). Returns that new key, which the
    /// window has once the bind completes (`IBV_WC_BIND_MW`; a failed bind completes with
    /// `IBV_WC_MW_BIND_ERR` and leaves the old key). `bind.new_key` is ignored.
    ///
    /// # Errors
    /// A zero-based type 1 bind (`EINVAL`, rxe o10-36.2.2), or the post's errors.
    pub fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: transport::SendFlags,
        mut bind: transport::BindMw,
    ) -> Result<RKey, ApiError> {
        if bind.zero_based {
            return Err(PostError::Invalid("type 1 memory windows cannot be zero based").into());
        }
        let k = bind.mw_rkey.value();
        bind.new_key = (k as u8).wrapping_add(1);
        let mut wr = SendWr::new(wr_id, transport::SendOp::BindMw(bind), Vec::new());
        wr.flags = flags;
        self.post_send(qpn, wr)?;
        Ok(RKey::new((k & !0xff) | u32::from(bind.new_key)))
    }

    /// Copies `data` into region `lkey` at `offset` (offset 0 is the region's first byte).
    ///
    /// # Errors
    /// Unknown key or out of bounds.
    pub fn mr_write(&self, lkey: LKey, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        let mut dev = self.by_key(lkey.value()).lock();
        let mem = dev
            .mrs_mut()
            .memory_mut(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        mem.write(offset, data).map_err(|e| out_of_bounds(lkey, e))
    }

    /// Copies `out.len()` bytes of region `lkey` at `offset` into `out`.
    ///
    /// # Errors
    /// Unknown key or out of bounds.
    pub fn mr_read(&self, lkey: LKey, offset: usize, out: &mut [u8]) -> Result<(), ApiError> {
        let dev = self.by_key(lkey.value()).lock();
        let mem = dev
            .mrs()
            .memory(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        mem.read(offset, out).map_err(|e| out_of_bounds(lkey, e))
    }

    /// Runs `f` over the bytes of a region the device owns (for checksums without a copy),
    /// under the transport's lock: keep `f` short.
    ///
    /// # Errors
    /// Unknown key, or [`ApiError::NotOwned`] for memory registered by address.
    pub fn with_mr<R>(&self, lkey: LKey, f: impl FnOnce(&[u8]) -> R) -> Result<R, ApiError> {
        let dev = self.by_key(lkey.value()).lock();
        let mem = dev
            .mrs()
            .memory(lkey)
            .ok_or(transport::MrError::UnknownKey(lkey))?;
        Ok(f(mem.as_slice().ok_or(ApiError::NotOwned(lkey))?))
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

    /// Destroys a CQ (`ibv_destroy_cq`); completions still queued in it are dropped. Call it
    /// after destroying the QPs that complete on it; [`Cq`] does it when dropped. Its id may
    /// name a new CQ afterwards.
    ///
    /// # Errors
    /// [`ApiError::CqBusy`] while a QP's send or receive queue completes on it (`EBUSY`), or
    /// no such CQ.
    pub fn destroy_cq(&self, cq: CqId) -> Result<(), ApiError> {
        let (queue, raw) = self.split_cq(cq);
        match self.shards[queue as usize].lock().destroy_cq(raw) {
            Ok(()) => Ok(()),
            Err(transport::DeviceError::CqInUse(_)) => Err(ApiError::CqBusy(cq)),
            Err(transport::DeviceError::NoSuchCq(_)) => {
                Err(transport::DeviceError::NoSuchCq(cq).into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a QP in RESET (`ibv_create_qp`) and claims its QPN in the XDP QP map, so that
    /// roce_xdp steers its packets here.
    ///
    /// # Errors
    /// Limits, or no free QPN.
    pub fn create_qp(&self, init: QpInit) -> Result<Qpn, ApiError> {
        self.create_qp_with_srq(init, None)
    }

    /// [`Device::create_qp`] for a QP that receives through `srq` when given
    /// (`init_attr.srq`; [`Device::create_srq`]): the SRQ must be on the PD's queue.
    ///
    /// # Errors
    /// As [`Device::create_qp`]; no such SRQ, or [`ApiError::SrqOtherQueue`].
    pub fn create_qp_with_srq(&self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, ApiError> {
        let (queue, pd) = self.split_pd(init.pd);
        let srq = match srq {
            Some(id) => {
                let (sq, raw) = self.split_srq(id);
                if sq != queue {
                    return Err(ApiError::SrqOtherQueue { pd: queue, srq: sq });
                }
                Some(raw)
            }
            None => None,
        };
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
            let qpn = sh.lock().create_qp_with_srq(init, srq)?;
            let n = qpn.value();
            if n >= MAX_QPS {
                sh.lock().destroy_qp(qpn)?;
                return Err(ApiError::NoQpn(self.info.ifname.clone()));
            }
            let owner = qps.get(&n, 0).map_or(0, |e| e.owner);
            if owner == 0 || owner == me || !loader::process_alive(owner) {
                drop(qps);
                if init.qp_type == QpType::Ud {
                    // The port's active MTU, as rxe gives its UD QPs (what ibv_query_port
                    // reports: the largest path MTU of IPv4 frames on this device).
                    let mtu = transport::Mtu::from_bytes(self.max_path_mtu(false))
                        .unwrap_or(transport::Mtu::Mtu1024);
                    sh.lock().set_ud_mtu(qpn, mtu)?;
                }
                let flags = qp_flags(sh.lock().qp(qpn));
                self.pins.add_qp_flags(n, me, flags)?;
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
        let publishing = self.publisher.hold();
        let last = {
            let mut dev = self.by_qpn(qpn).lock();
            // Its last counters first, so the interface's totals keep what it did.
            let last = dev.qp(qpn).map(Publisher::last_record);
            dev.destroy_qp(qpn)?;
            if dev.owes_transmit() && self.inline.is_none() {
                // The ACKs it owes go at once.
                self.by_qpn(qpn).kick();
            }
            last
        };
        if let (Some(last), Ok(_lock)) = (last, lock_file(&self.info.ifname))
            && let Err(e) = self.publisher.retire_qp(qpn, &last)
        {
            log::warn!("retiring the counters of QP {qpn}: {e}");
        }
        drop(publishing);
        if self.inline.is_some() {
            self.drive_or_kick(self.by_qpn(qpn));
        }
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
        // A move to ERR flushes the QP's WRs into its CQs here, not in an engine turn: wake
        // the waiters (blocked in `wait_cq`, or async) now.
        sh.notify();
        Ok(())
    }

    /// Tells RC QP `qpn` that its peer QP allows the multipath extension, as the peer said
    /// in an out-of-band exchange (docs/multipath.md, "Hints out of band"): if the QP allows
    /// it ([`DeviceOptions`]' `transport.multipath`), it starts with the extension on instead
    /// of waiting for the peer's first answer ([`transport::Device::set_multipath_peer`]).
    /// Call it in RESET or INIT, and only on the peer's own word.
    ///
    /// # Errors
    /// No such QP, or the QP is in RTR or later.
    pub fn set_multipath_peer(&self, qpn: Qpn) -> Result<(), ApiError> {
        self.by_qpn(qpn).lock().set_multipath_peer(qpn)?;
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

    /// INIT → RTR → RTS with the required attributes of each transition for the QP's type,
    /// as the transport's state table names them ([`transport::state::transition_masks`]):
    /// a UC QP gets only UC's (address vector, path MTU, destination QP and RQ PSN for RTR,
    /// SQ PSN for RTS, as ibv_uc_pingpong sets them), and `c`'s reliability fields (timeout,
    /// retries, RNR timer, READ/atomic depths) go to RC QPs only.
    ///
    /// # Errors
    /// As [`Device::modify_qp`]; a path MTU too large for this device among them.
    pub fn qp_connect(&self, qpn: Qpn, c: &RcConnect) -> Result<(), ApiError> {
        let qp_type = self
            .by_qpn(qpn)
            .lock()
            .qp(qpn)
            .map_or(QpType::Rc, |q| q.qp_type);
        let required = |from, to| {
            transport::state::transition_masks(qp_type, from, to).map_or(AttrMask::empty(), |m| m.0)
        };
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
        let mask = AttrMask::STATE | required(QpState::Init, QpState::Rtr);
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
        let mask = AttrMask::STATE | required(QpState::Rtr, QpState::Rts);
        self.modify_qp(qpn, &rts, mask)
    }

    /// The state of a QP.
    #[must_use]
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.by_qpn(qpn).lock().qp(qpn).map(transport::Qp::state)
    }

    /// A QP's type, state and attributes, for `ibv_query_qp`: the attributes as the last
    /// modify set them, except `rq_psn` and `sq_psn`, which are the PSN the responder expects
    /// next and the one the requester sends next (rxe `rxe_qp_to_attr`).
    #[must_use]
    pub fn qp_query(&self, qpn: Qpn) -> Option<(QpType, QpState, QpAttr<Path>)> {
        self.by_qpn(qpn).lock().qp(qpn).map(|q| {
            let mut a = q.attr().clone();
            a.rq_psn = q.expected_psn();
            a.sq_psn = q.next_send_psn();
            (q.qp_type, q.state(), a)
        })
    }

    /// Posts a send WR (`ibv_post_send`).
    ///
    /// # Errors
    /// As the transport's `post_send`.
    pub fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError> {
        let sh = self.by_qpn(qpn);
        sh.lock().post_send(qpn, wr)?;
        self.drive_or_kick(sh);
        Ok(())
    }

    /// Posts send WRs all or none, in order: what `ibv_wr_complete` does with the WRs built
    /// since `ibv_wr_start`.
    ///
    /// # Errors
    /// Why the first WR refused was refused (as [`Device::post_send`]); none is posted then.
    pub fn post_send_all(&self, qpn: Qpn, wrs: Vec<SendWr<Path>>) -> Result<(), ApiError> {
        let sh = self.by_qpn(qpn);
        sh.lock().post_send_all(qpn, wrs).map_err(|(_, e)| e)?;
        self.drive_or_kick(sh);
        Ok(())
    }

    /// Posts a receive WR (`ibv_post_recv`).
    ///
    /// # Errors
    /// As the transport's `post_recv`.
    pub fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError> {
        let sh = self.by_qpn(qpn);
        sh.lock().post_recv(qpn, wr)?;
        self.drive_or_kick(sh);
        Ok(())
    }

    /// Moves up to `out.len()` completions of `cq` into `out` without waiting and returns how
    /// many (`ibv_poll_cq(cq, num_entries, wc)`); `out[..n]` are the oldest, in order, and the
    /// rest of `out` is left as it was. Allocates nothing: call it in a loop with a buffer
    /// allocated once (`[Wc::default(); 16]`). On an inline device it first runs an engine
    /// turn. An unknown CQ yields 0.
    pub fn poll_cq_into(&self, cq: CqId, out: &mut [Wc]) -> usize {
        self.drive();
        let (queue, cq) = self.split_cq(cq);
        self.shards[queue as usize].lock().poll_cq_into(cq, out)
    }

    /// Arms `cq` for one completion event (`ibv_req_notify_cq`): the next completion (with
    /// `solicited_only`, the next solicited or failed one) queues an [`Event::CqNotify`],
    /// which [`Device::wait_event`] returns. Arm again after each event.
    ///
    /// # Errors
    /// No such CQ.
    pub fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<(), ApiError> {
        let (queue, raw) = self.split_cq(cq);
        let sh = self.shard(queue)?;
        sh.lock().req_notify_cq(raw, solicited_only)?;
        // The caller is about to sleep until the event.
        self.app_blocks(sh);
        Ok(())
    }

    /// The next asynchronous or completion event ([`Event`]), waiting up to `timeout` for one
    /// (`ibv_get_async_event` and the event half of `ibv_get_cq_event`). CQs and SRQs in the
    /// events are the API's ids. On an inline device ([`DeviceOptions::inline`]) the wait also
    /// drives the queues.
    ///
    /// One queue holds both kinds, in the order they happened: completion notifications
    /// ([`Event::CqNotify`], after [`Device::req_notify_cq`]) and asynchronous events (QP
    /// fatal, communication established, last WQE reached, SQ drained, CQ overflow, SRQ limit;
    /// [`Event::is_async`]). A program that waits for both from one thread needs nothing
    /// else; one that waits for them in different threads runs one thread here and hands the
    /// events on (the drop-in libibverbs does: completion channels and `async_fd`). Events
    /// are kept until taken, at most [`DeviceConfig::max_events`] asynchronous ones per queue
    /// (more are counted in `events_lost`; completion notifications are never dropped, one
    /// per CQ at most). The waiting thread sleeps until an engine turn leaves an event, or
    /// 10 ms at most.
    #[must_use]
    pub fn wait_event(&self, timeout: Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + timeout;
        let n = self.shards();
        let api = |queue: u32, e: Event| match e {
            Event::CqNotify { cq } => Event::CqNotify {
                cq: CqId(cq.0 * n + queue),
            },
            Event::CqOverflow { cq } => Event::CqOverflow {
                cq: CqId(cq.0 * n + queue),
            },
            Event::SrqLimitReached { srq } => Event::SrqLimitReached {
                srq: SrqId(srq.0 * n + queue),
            },
            other => other,
        };
        loop {
            self.drive_before_wait();
            for (q, sh) in self.shards.iter().enumerate().skip(1) {
                if let Some(e) = sh.lock().poll_event() {
                    return Some(api(q as u32, e));
                }
            }
            // Queue 0 is checked and waited on under one hold of its lock, so an event its
            // engine queues in between is not missed (engines notify after they unlock).
            let sh = &self.shards[0];
            let mut dev = sh.lock();
            if let Some(e) = dev.poll_event() {
                return Some(api(0, e));
            }
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            let step = left.min(Duration::from_millis(10));
            // On an inline device the helper thread's turns (and other threads' verb
            // calls) notify; the wait is capped at its idle turn so timers' events come too.
            let step = if self.inline.is_some() {
                step.min(INLINE_IDLE_TURN)
            } else {
                step
            };
            self.app_blocks(sh);
            let _ = sh
                .events
                .wait_timeout(dev, step)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Takes up to `max` completions without waiting (`ibv_poll_cq`), in a new `Vec`. A loop
    /// that polls often uses [`Device::poll_cq_into`], which does not allocate.
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

    /// Runs an engine turn on an inline device ([`DeviceOptions::inline`]); nothing otherwise.
    /// Returns whether it ran one.
    fn drive(&self) -> bool {
        self.inline.as_ref().is_some_and(|i| i.turn())
    }

    /// [`Device::drive`] from a thread that sleeps next if the turn brings it nothing
    /// ([`Inline::turn_before_wait`]).
    pub(crate) fn drive_before_wait(&self) -> bool {
        self.inline.as_ref().is_some_and(|i| i.turn_before_wait())
    }

    /// On an inline device, [`Inline::app_blocks`]: the calling thread is about to sleep
    /// until the engines' turns bring it something.
    pub(crate) fn app_blocks(&self, sh: &Shared) {
        if let Some(i) = &self.inline {
            i.app_blocks(sh);
        }
    }

    /// After a post to `sh`'s transport: sends it now with an engine turn on an inline device,
    /// else wakes the thread that will (the queue's engine thread, or an inline device's
    /// helper when another thread is turning and may have passed its transmit already).
    fn drive_or_kick(&self, sh: &Shared) {
        if !self.inline.as_ref().is_some_and(|i| i.turn_to_send()) {
            sh.kick();
        }
    }

    /// How many PDs, memory regions, CQs and QPs the device holds now, over all its
    /// shards (`roce engine --status` reports them, to show a closed program's objects gone).
    #[must_use]
    pub fn resources(&self) -> crate::transport::Resources {
        self.shards
            .iter()
            .fold(crate::transport::Resources::default(), |acc, sh| {
                acc.add(sh.lock().resources())
            })
    }

    /// Transport counters: the device's own, and each QP's.
    #[must_use]
    pub fn counters(&self) -> (DeviceCounters, Vec<(Qpn, QpCounters)>) {
        let mut devc = DeviceCounters::default();
        let mut qps = Vec::new();
        for sh in self.shards.iter() {
            let dev = sh.lock();
            qps.extend(dev.gsi().map(|g| (Qpn::GSI, *g.counters())));
            qps.extend(dev.qps().map(|q| (q.qpn(), *q.counters())));
            devc.add(dev.device_counters());
        }
        (devc, qps)
    }

    /// Changes one congestion-control parameter of an RC QP: a DCQCN parameter under its mlx5
    /// name (`rpg_ai_rate`, `min_time_between_cnps`, ... see [`crate::cc::DcqcnConfig`]), or
    /// `rp_enabled` / `np_enabled` / `loss_backoff` / `hold_when_idle` / `enabled` (0 or 1), or
    /// a Swift parameter (`swift_base_target`, ... see [`crate::cc::SwiftConfig`]). The QP's
    /// rate state starts afresh.
    /// Load-time settings for every QP are [`DeviceOptions::transport`]`.cc`.
    ///
    /// # Errors
    /// No such QP, a UD QP, an unknown name or a value out of range.
    pub fn set_cc_param(&self, qpn: Qpn, name: &str, value: u64) -> Result<(), ApiError> {
        self.by_qpn(qpn).lock().set_cc_param(qpn, name, value)?;
        Ok(())
    }

    /// Switches one RC QP to congestion control `algorithm` (DCQCN, Swift or none); its
    /// state starts afresh. Load-time choice for every QP: [`DeviceOptions::transport`]`.cc`
    /// ([`crate::transport::CcConfig::set_algorithm`]).
    ///
    /// # Errors
    /// No such QP or a UD QP.
    pub fn set_cc_algorithm(
        &self,
        qpn: Qpn,
        algorithm: crate::cc::CcAlgorithm,
    ) -> Result<(), ApiError> {
        let flags = {
            let mut dev = self.by_qpn(qpn).lock();
            dev.set_cc_algorithm(qpn, algorithm)?;
            qp_flags(dev.qp(qpn))
        };
        // Swift samples RTTs from the QP's responses: roce_xdp stamps them with their arrival
        // time only when asked (`QP_FLAG_TIME_RESPONSES`).
        self.pins
            .add_qp_flags(qpn.value(), std::process::id(), flags)?;
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
        let mut engines = std::mem::take(
            &mut *self
                .engines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if engines.is_empty()
            && self.inline.is_none()
            && self.qpns.lock().map_or(true, |q| q.is_empty())
            && !self.loaded_here
        {
            return;
        }
        // Every CM connection still held is ended towards its peer (REJ or DREQ); the engines'
        // drain sends those MADs with the last frames.
        self.cm_destroy_all();
        // The sockets leave ROCE_XSKS first: from here on a frame for one of our QPs falls back
        // to the stack and roce_xdp counts it (`redirect_fallback_pass`), and the engines'
        // drain hands what the kernel had already put into the RX rings to the transport, so
        // that no frame is lost uncounted between the last turn and the socket's close.
        if let Ok(mut xsks) = self.pins.xsks() {
            for (q, _) in &self.bind_modes {
                let _ = xsks.unset(*q);
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        for sh in self.shards.iter() {
            sh.kick();
        }
        for e in engines.drain(..) {
            match e.join() {
                Ok(Ok((r, _))) => log::debug!(
                    "engine for queue {} ({:?}) ended after {:?}: {} turns, {} waits, {} lengthened by rx-usecs",
                    r.queue_id,
                    r.mode,
                    r.elapsed,
                    r.turns,
                    r.waits,
                    r.moderated
                ),
                Ok(Err(err)) => log::warn!("engine ended with an error: {err}"),
                Err(_) => log::warn!("engine thread panicked"),
            }
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
        self.capture.close();
        // The last counters go into the interface's cumulative totals (QPN 0 / PID 0).
        let _ = self.publisher.publish();
        if let Ok(_lock) = lock_file(&self.info.ifname) {
            self.publisher.retire(Some(std::process::id()));
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
        drop(self.held.take());
        unregister_live(self.live_id);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The device's last words at process exit ([`release_all_for_exit`]), for a program that
/// exits without closing it: its CM connections are ended towards their peers, as the
/// kernel's CM ends them when a process exits (ucma's close, cm.c `cm_destroy_id`), and the
/// engines drain what the transports owe the wire (for instance the DREP answering a DREQ
/// whose DISCONNECTED event made the program exit before the engine's turn had flushed it).
/// An inline device's engines are drained here, engine threads are stopped and waited for,
/// each within `drain_timeout`; then the counters are published and retired as a closing
/// device does, so that the pins count every frame that left.
fn last_words(
    shards: &Arc<[Arc<Shared>]>,
    inline: Option<&Arc<Inline>>,
    engines: &Arc<Mutex<Vec<EngineThread<TransportHandler>>>>,
    stop: &Arc<AtomicBool>,
    clock: Clock,
    drain_timeout: Duration,
    (publisher, ifname): (Publisher, String),
) -> LastWords {
    let shards = Arc::downgrade(shards);
    let inline = inline.map(Arc::downgrade);
    let (engines, stop) = (Arc::downgrade(engines), Arc::downgrade(stop));
    LastWords(Box::new(move || {
        let Some(shards) = shards.upgrade() else {
            return;
        };
        let now = clock.now();
        for sh in shards.iter() {
            if let Some(g) = sh.lock().gsi_mut() {
                g.cm_mut().destroy_all(now);
            }
        }
        if let Some(inline) = inline.as_ref().and_then(std::sync::Weak::upgrade) {
            let mut engines = inline
                .engines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for e in engines.iter_mut() {
                let _ = e.finish();
            }
        } else if let (Some(engines), Some(stop)) = (engines.upgrade(), stop.upgrade()) {
            stop.store(true, Ordering::SeqCst);
            for sh in shards.iter() {
                sh.kick();
            }
            let deadline = std::time::Instant::now() + drain_timeout;
            while std::time::Instant::now() < deadline
                && !engines
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .all(std::thread::JoinHandle::is_finished)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // The counters of what was just sent, as a closing device publishes them: readers
        // of the pins (`roce stats`, bpftool) account for every frame that left.
        let _ = publisher.publish();
        if let Ok(_lock) = lock_file(&ifname) {
            publisher.retire(Some(std::process::id()));
        }
    }))
}

/// The longest [`open_queue`] waits for the kernel to let go of the AF_XDP socket of a
/// process that has exited.
const DEAD_SOCKET_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds an AF_XDP socket to queue `q` of `ifname`. A bind that finds the queue taken
/// (`EBUSY`) while no other live process owns a QP on the interface ([`qp_owners`]) is tried
/// again for up to [`DEAD_SOCKET_WAIT`]: the kernel releases an exited process's socket from
/// its queue in a deferred work item that needs the RTNL lock (`xp_put_pool` schedules
/// `xp_release_deferred`, which calls `xp_clear_dev`), so a server started right after the
/// last one exited can find the queue still taken, the longer while the RTNL lock is busy
/// (namespaces being torn down). A queue taken while another process owns QPs there fails at
/// once. (CI runs on Dec 6 had `roce perf` servers refused this way right after the previous
/// server exited: the wait then also required that the process that had loaded roce_xdp be
/// gone, and the test that had loaded it was alive. The kernel here has no `xdp_diag`
/// (`CONFIG_XDP_SOCKETS_DIAG` off), so which process holds a queue's socket cannot be asked.)
/// Call it for every queue the device binds.
fn open_queue(
    ifname: &str,
    q: u32,
    cfg: &crate::xsk::XskConfig,
    pins: &Pins,
) -> Result<XskQueue, ApiError> {
    let deadline = std::time::Instant::now() + DEAD_SOCKET_WAIT;
    let mut waited = false;
    loop {
        match XskQueue::open(ifname, q, cfg) {
            Err(crate::xsk::XskError::Setup { ref source, .. })
                if source.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline
                    && qp_owners(pins).is_empty() =>
            {
                if !waited {
                    log::info!(
                        "{ifname}: queue {q} is taken while no other process owns a QP here: waiting for the kernel to release an exited process's socket"
                    );
                    waited = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.map_err(ApiError::from),
        }
    }
}

/// The live processes other than this one that own QPNs on the interface of `pins`.
fn qp_owners(pins: &Pins) -> Vec<u32> {
    let me = std::process::id();
    let mut owners: Vec<u32> = pins
        .our_qps()
        .unwrap_or_default()
        .into_iter()
        .map(|(_, owner)| owner)
        .filter(|&p| p != me && loader::process_alive(p))
        .collect();
    owners.sort_unstable();
    owners.dedup();
    owners
}

/// The live roce-xdp processes on the interface of `pins` other than this one: the holder of
/// its roce_xdp and the owners of its QPNs.
fn live_holders(pins: &Pins) -> Vec<u32> {
    let me = std::process::id();
    let mut holders = qp_owners(pins);
    holders.extend(
        pins.load_info()
            .ok()
            .map(|i| i.loader_pid)
            .filter(|&p| p != me && loader::process_alive(p)),
    );
    holders.sort_unstable();
    holders.dedup();
    holders
}

/// [`ApiError::QueueTaken`] for a socket bind that found its queue taken (`EBUSY`), naming the
/// live roce-xdp processes on the interface (the holder of its roce_xdp and the owners of its
/// QPNs); any other error as it is.
fn queue_taken(e: ApiError, pins: &Pins) -> ApiError {
    let ApiError::Xsk(crate::xsk::XskError::Setup {
        ifname,
        queue,
        source,
        ..
    }) = &e
    else {
        return e;
    };
    if source.raw_os_error() != Some(libc::EBUSY) {
        return e;
    }
    ApiError::QueueTaken {
        ifname: ifname.clone(),
        queue: *queue,
        holders: live_holders(pins),
    }
}

/// The API's error for a region access outside the region.
fn out_of_bounds(lkey: LKey, e: transport::OutOfRegion) -> ApiError {
    ApiError::OutOfBounds {
        lkey,
        offset: e.offset,
        end: e.offset.saturating_add(e.len),
        len: e.region,
    }
}

/// The `roce_xdp` entry flags of `qp` (`roce_common::maps::QP_FLAG_*`): whether its
/// responses are to be timed ([`transport::Qp::samples_rtt`]).
fn qp_flags(qp: Option<&transport::Qp>) -> u32 {
    if qp.is_some_and(transport::Qp::samples_rtt) {
        QP_FLAG_TIME_RESPONSES
    } else {
        0
    }
}
