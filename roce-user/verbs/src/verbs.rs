//! The verbs of an open device in safe Rust: the engine behind a context, and the
//! translations between rdma-core's C structs (bindgen's `sys`) and the `roce` API's types.
//! The FFI layer reads the C arguments (pointers, unions) and calls these.

use core::ffi::c_int;
use std::{
    collections::{HashMap, VecDeque},
    os::fd::{AsFd as _, AsRawFd as _, RawFd},
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use nix::sys::eventfd::{EfdFlags, EventFd};
use roce::{
    api::{
        Access, ApiError, AttrMask, CmDevice, CqId, Device, DeviceOptions, Event, Mtu, Path, Psn,
        QKey, QpAttr, QpState, Qpn, SrqId, VerbsDevice, Wc, WcFlags, remote::SharedDevice,
    },
    loader::{AttachMode, LoadError},
};

use crate::{
    device::Port,
    events::{AsyncEvent, AsyncEvents, Element},
    sys,
};

/// The environment variable that picks how the engine runs: `inline` (the default) or
/// `threads`.
///
/// - `inline`: the program's own threads drive the transport inside `ibv_poll_cq`,
///   `ibv_post_send` and `ibv_post_recv` (`DeviceOptions::inline`, as `roce perf --inline`),
///   so a busy-polling program (perftest's default, the pingpongs without `-e`) crosses no
///   thread hand-off and does not fight an engine thread for a core; one helper thread
///   sleeps on the sockets and turns when a frame arrives that no program thread is polling
///   for (and every 1 ms for the timers), so ACKs, READ responses and retransmissions go on
///   while the program computes or waits for completion events (`-e`).
/// - `threads`: one engine thread per queue serves the device, as `roce perf` does by default.
pub use roce::api::env::ENGINE_ENV;

/// Where a context's device runs, as [`ENGINE_ENV`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Unset: the interface's `roce engine` if one serves it in this namespace (so programs
    /// started beside each other share the interface), else in this process, inline.
    Auto,
    /// In this process, driven by the program's threads.
    Inline,
    /// In this process, with engine threads.
    Threads,
    /// Through the interface's `roce engine` process, which must be running.
    Shared,
}

/// The [`Mode`] [`ENGINE_ENV`]'s value asks for (unset or empty: [`Mode::Auto`]; a value that is
/// none of `inline`, `threads` and `shared` gets a warning and [`Mode::Auto`]).
fn engine_mode(value: Option<&str>) -> Mode {
    match value.map(str::trim) {
        None | Some("") => Mode::Auto,
        Some("inline") => Mode::Inline,
        Some("threads") => Mode::Threads,
        Some("shared") => Mode::Shared,
        Some(other) => {
            eprintln!(
                "libibverbs (roce-xdp): {ENGINE_ENV}={other:?} is none of \"inline\", \"threads\" and \"shared\"; choosing as if unset"
            );
            Mode::Auto
        }
    }
}

/// The device behind a context: opened in this process, or reached through `roce engine`.
#[derive(Clone, Debug)]
enum Backend {
    Local(Arc<Device>),
    Shared(Arc<SharedDevice>),
}

impl Backend {
    fn verbs(&self) -> &dyn VerbsDevice {
        match self {
            Self::Local(d) => &**d,
            Self::Shared(d) => &**d,
        }
    }

    fn arc(&self) -> Arc<dyn VerbsDevice> {
        match self {
            Self::Local(d) => Arc::clone(d) as Arc<dyn VerbsDevice>,
            Self::Shared(d) => Arc::clone(d) as Arc<dyn VerbsDevice>,
        }
    }
}

/// The environment variables that choose the congestion control of every QP of the program
/// (`ROCE_CC=swift`, `ROCE_CC_PROFILE=software`, `ROCE_CC_SET=loss_backoff=1`; see their
/// definitions).
pub use roce::api::env::{CC_ALGORITHM_ENV, CC_ENV, CC_PROFILE_ENV};

/// The transport's congestion-control settings from the values of [`CC_ALGORITHM_ENV`],
/// [`CC_PROFILE_ENV`] and [`CC_ENV`] (each unset or empty: its default), by
/// [`roce::transport::CcConfig::choose`]. Call when the engine starts.
///
/// # Errors
/// A message naming the variable and the value that is unknown, malformed or out of range.
fn cc_from_env(
    algorithm: Option<&str>,
    profile: Option<&str>,
    pairs: Option<&str>,
) -> Result<roce::transport::CcConfig, String> {
    let algorithm = match algorithm.map(str::trim).filter(|a| !a.is_empty()) {
        None => roce::cc::CcAlgorithm::default(),
        Some(a) => roce::cc::CcAlgorithm::from_name(a)
            .ok_or_else(|| format!("{CC_ALGORITHM_ENV}: {a:?} is not dcqcn, swift or off"))?,
    };
    let profile = profile
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .unwrap_or("mlx5");
    let pairs = pairs
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|kv| !kv.is_empty());
    roce::transport::CcConfig::choose(algorithm, profile, pairs).map_err(|e| match e {
        roce::transport::CcSetError::Profile(_) => format!("{CC_PROFILE_ENV}: {e}"),
        _ => format!("{CC_ENV}: {e}"),
    })
}

/// The environment variable that makes every RC QP of the program offer the multipath
/// extension (`ROCE_MULTIPATH=1`).
pub use roce::api::env::MULTIPATH_ENV;

/// The environment variable that turns the responder's ACK coalescing off
/// (`ROCE_ACK_COALESCING=0`).
pub use roce::api::env::ACK_COALESCING_ENV;

/// A switch from the environment variable `name`: `1` on, `0` off, unset or empty `default`.
/// Call when the engine starts.
///
/// # Errors
/// A message naming the variable for any other value.
fn flag_from_env(name: &str, value: Option<&str>, default: bool) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{name}: {other:?} is neither 0 nor 1")),
    }
}

/// What a context holds besides its C struct: the interface, and the engine, started when the
/// first object that needs it is made (so that `ibv_devinfo` beside a running program does
/// not try to take its queues).
#[derive(Debug)]
pub struct Verbs {
    /// The interface's facts, read at open.
    pub port: Port,
    dev: OnceLock<Backend>,
    opening: Mutex<()>,
    /// Which channel each CQ with a completion channel reports to, and the CQ's C handle.
    routes: Routes,
    /// The C structs of the QPs, CQs and SRQs, for the elements of asynchronous events.
    handles: Arc<Mutex<Handles>>,
    /// The asynchronous events and the fd behind `ibv_context.async_fd`.
    pub events: Arc<AsyncEvents>,
    /// The thread that hands the engine's events on: completion events to channels,
    /// asynchronous ones to `events`; it also watches the link for the port events.
    pump: Mutex<Option<Pump>>,
}

/// The address of each object's C struct, by the engine's id, so that an event names the
/// object the program knows.
#[derive(Debug, Default)]
struct Handles {
    qps: HashMap<u32, usize>,
    cqs: HashMap<u32, usize>,
    srqs: HashMap<u32, usize>,
}

/// How often the event thread reads the link state for `IBV_EVENT_PORT_ACTIVE` / `_ERR`.
const LINK_POLL: Duration = Duration::from_millis(250);

/// CQ → (its channel, the address of its `struct ibv_cq`, kept as a number).
type Routes = Arc<Mutex<HashMap<u32, (Arc<Channel>, usize)>>>;

#[derive(Debug)]
struct Pump {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// A completion channel (`struct ibv_comp_channel`): an eventfd in semaphore mode that
/// counts the events not yet taken, and the CQs they came from, in order. The fd is what
/// programs poll or epoll; `ibv_get_cq_event` reads it (blocking unless the program made it
/// non-blocking) and takes the next CQ.
#[derive(Debug)]
pub struct Channel {
    fd: EventFd,
    ready: Mutex<VecDeque<usize>>,
}

impl Channel {
    /// A channel with no events.
    ///
    /// # Errors
    /// The errno of `eventfd(2)`.
    pub fn new() -> Result<Arc<Self>, c_int> {
        let fd = EventFd::from_flags(EfdFlags::EFD_SEMAPHORE | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| e as c_int)?;
        Ok(Arc::new(Self {
            fd,
            ready: Mutex::new(VecDeque::new()),
        }))
    }

    /// The file descriptor programs wait on.
    #[must_use]
    pub fn fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }

    /// Queues an event of the CQ at `cq` and makes the fd readable.
    fn push(&self, cq: usize) {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(cq);
        let _ = self.fd.write(1);
    }

    /// Takes the next event (`ibv_get_cq_event`): waits for one unless the fd is
    /// non-blocking, and returns the address of its CQ.
    ///
    /// # Errors
    /// EAGAIN on a non-blocking fd with no event, or another errno of `read(2)`.
    pub fn next(&self) -> Result<usize, c_int> {
        self.fd.read().map_err(|e| e as c_int)?;
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .ok_or(libc::EAGAIN)
    }
}

impl Verbs {
    /// A context for `port`; nothing runs yet.
    ///
    /// # Errors
    /// The errno of `eventfd(2)` for the context's `async_fd`.
    pub fn new(port: Port) -> Result<Self, c_int> {
        Ok(Self {
            port,
            dev: OnceLock::new(),
            opening: Mutex::new(()),
            routes: Arc::default(),
            handles: Arc::default(),
            events: Arc::new(AsyncEvents::new()?),
            pump: Mutex::new(None),
        })
    }

    /// Names the C struct of QP `qpn` in its events; call when it is made.
    pub fn add_qp(&self, qpn: Qpn, handle: usize) {
        self.handles().qps.insert(qpn.value(), handle);
    }

    /// Forgets QP `qpn`, whose struct is at `handle`, and withdraws its pending events; call
    /// before freeing its struct. An entry another thread made meanwhile for a new QP that got
    /// the same number is left alone (see `take_if_same`).
    pub fn remove_qp(&self, qpn: Qpn, handle: usize) {
        if let Some(h) = take_if_same(&mut self.handles().qps, qpn.value(), handle) {
            self.events.forget(Element::Qp(h));
        }
    }

    /// Names the C struct of CQ `cq` in its events (`IBV_EVENT_CQ_ERR`).
    pub fn add_cq(&self, cq: CqId, handle: usize) {
        self.handles().cqs.insert(cq.0, handle);
    }

    /// Forgets CQ `cq`, whose struct is at `handle`, and withdraws its pending events (an
    /// entry for a new CQ that got the same id meanwhile stays, see `take_if_same`).
    pub fn remove_cq(&self, cq: CqId, handle: usize) {
        if let Some(h) = take_if_same(&mut self.handles().cqs, cq.0, handle) {
            self.events.forget(Element::Cq(h));
        }
    }

    /// Names the C struct of SRQ `srq` in its events (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn add_srq(&self, srq: SrqId, handle: usize) {
        self.handles().srqs.insert(srq.0, handle);
    }

    /// Forgets SRQ `srq`, whose struct is at `handle`, and withdraws its pending events (an
    /// entry for a new SRQ that got the same id meanwhile stays, see `take_if_same`).
    pub fn remove_srq(&self, srq: SrqId, handle: usize) {
        if let Some(h) = take_if_same(&mut self.handles().srqs, srq.0, handle) {
            self.events.forget(Element::Srq(h));
        }
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, Handles> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine of this context, opened on first use: through the interface's `roce
    /// engine` ([`SharedDevice`]) when [`ENGINE_ENV`] says `shared`, or is unset and an engine
    /// serves the interface; otherwise in this process ([`Device::open`]: attaches roce_xdp
    /// unless `roce load` did, binds an AF_XDP socket per queue, starts the engine threads).
    ///
    /// # Errors
    /// The errno of the failure (EIO for a load or socket failure, EBUSY, ENOENT for no engine
    /// with `shared`, ...), after saying why on stderr: a C program has no other way to learn
    /// it.
    pub fn device(&self) -> Result<&dyn VerbsDevice, c_int> {
        if let Some(d) = self.dev.get() {
            return Ok(d.verbs());
        }
        let _one = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = self.dev.get() {
            return Ok(d.verbs());
        }
        let ifname = &self.port.info.ifname;
        let mode = engine_mode(std::env::var(ENGINE_ENV).ok().as_deref());
        if matches!(mode, Mode::Auto | Mode::Shared) {
            match SharedDevice::connect(ifname) {
                Ok(d) => {
                    let d = self.dev.get_or_init(|| Backend::Shared(Arc::new(d)));
                    self.start_pump(d.arc())?;
                    return Ok(d.verbs());
                }
                Err(e) if mode == Mode::Shared => {
                    eprintln!(
                        "libibverbs (roce-xdp): {ENGINE_ENV}=shared, but no roce engine serves \
                         {ifname} in this network namespace ({e}); start one with `roce engine \
                         -i {ifname}`"
                    );
                    return Err(e.errno());
                }
                // No engine here: open the device in this process.
                Err(_) => {}
            }
        }
        let mut opts = DeviceOptions {
            inline: mode != Mode::Threads,
            ..DeviceOptions::default()
        };
        let var = |name: &str| std::env::var(name).ok();
        let refuse = |e: String| {
            eprintln!("libibverbs (roce-xdp): cannot start the engine on {ifname}: {e}");
            libc::EINVAL
        };
        opts.transport.cc = cc_from_env(
            var(CC_ALGORITHM_ENV).as_deref(),
            var(CC_PROFILE_ENV).as_deref(),
            var(CC_ENV).as_deref(),
        )
        .map_err(refuse)?;
        opts.transport.multipath =
            flag_from_env(MULTIPATH_ENV, var(MULTIPATH_ENV).as_deref(), false).map_err(refuse)?;
        opts.transport.coalesce_acks =
            flag_from_env(ACK_COALESCING_ENV, var(ACK_COALESCING_ENV).as_deref(), true)
                .map_err(refuse)?;
        let opened = Device::open(ifname, &opts).or_else(|e| match e {
            // A driver that refuses native XDP (veth above about 3.5 KB of MTU, some NICs):
            // a program cannot be given `roce load -m skb`'s flag, so fall back to generic
            // XDP, as `roce load -m skb` would attach it, and say so.
            ApiError::Load(LoadError::NativeRefused { .. }) => {
                eprintln!(
                    "libibverbs (roce-xdp): {ifname}: the driver refused native XDP; using \
                     generic XDP (slower; `roce load -i {ifname} -m skb` beforehand says it \
                     explicitly)"
                );
                Device::open(
                    ifname,
                    &DeviceOptions {
                        mode: AttachMode::Skb,
                        ..opts
                    },
                )
            }
            e => Err(e),
        });
        match opened {
            Ok(d) => {
                let d = self.dev.get_or_init(|| Backend::Local(Arc::new(d)));
                self.start_pump(d.arc())?;
                Ok(d.verbs())
            }
            Err(e) => {
                eprintln!("libibverbs (roce-xdp): cannot start the engine on {ifname}: {e:#}");
                if matches!(e, ApiError::QueueTaken { .. }) {
                    eprintln!(
                        "libibverbs (roce-xdp): to run several programs on {ifname}, start \
                         `roce engine -i {ifname}` first: every program then reaches the \
                         interface through it"
                    );
                }
                Err(e.errno())
            }
        }
    }

    /// The engine of this context as a shared handle, started if needed (as
    /// [`Verbs::device`]), for a thread that outlives the call: the drop-in librdmacm's
    /// event thread.
    ///
    /// # Errors
    /// As [`Verbs::device`].
    pub fn device_arc(&self) -> Result<Arc<dyn CmDevice>, c_int> {
        self.device()?;
        match self.dev.get() {
            Some(Backend::Local(d)) => Ok(Arc::clone(d) as Arc<dyn CmDevice>),
            Some(Backend::Shared(d)) => Ok(Arc::clone(d) as Arc<dyn CmDevice>),
            None => Err(libc::EIO),
        }
    }

    /// The engine if it was started.
    #[must_use]
    pub fn started(&self) -> Option<&dyn VerbsDevice> {
        self.dev.get().map(Backend::verbs)
    }

    /// Sends the completion events of `cq` to `channel`, naming the CQ by `handle` (the
    /// address of its `struct ibv_cq`). Starts the event thread on first use.
    ///
    /// # Errors
    /// The engine cannot start, or the thread cannot be made.
    pub fn route(&self, cq: CqId, channel: Arc<Channel>, handle: usize) -> Result<(), c_int> {
        self.dev.get().ok_or(libc::EINVAL)?;
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cq.0, (channel, handle));
        Ok(())
    }

    /// Starts the event thread of the engine `dev` (once, when the engine starts): it waits
    /// in [`Device::wait_event`], which wakes only when an engine turn left an event, sends
    /// completion events to the channel of their CQ and asynchronous events to
    /// [`Verbs::events`] with the C struct of their object, and reads the link state every
    /// [`LINK_POLL`] for `IBV_EVENT_PORT_ACTIVE` / `IBV_EVENT_PORT_ERR` on a change.
    fn start_pump(&self, dev: Arc<dyn VerbsDevice>) -> Result<(), c_int> {
        let mut pump = self.pump.lock().unwrap_or_else(PoisonError::into_inner);
        if pump.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, routes, handles, events) = (
            Arc::clone(&stop),
            Arc::clone(&self.routes),
            Arc::clone(&self.handles),
            Arc::clone(&self.events),
        );
        let port = self.port.clone();
        let thread = std::thread::Builder::new()
            .name("roce-verbs-events".into())
            .spawn(move || {
                let mut up = port.is_up();
                let mut checked = std::time::Instant::now();
                while !flag.load(Ordering::Relaxed) {
                    if let Some(e) = dev.wait_event(Duration::from_millis(50)) {
                        dispatch(e, &routes, &handles, &events);
                    }
                    if checked.elapsed() >= LINK_POLL {
                        checked = std::time::Instant::now();
                        let now = port.is_up();
                        if now != up {
                            up = now;
                            events.push(AsyncEvent {
                                kind: if now {
                                    sys::IBV_EVENT_PORT_ACTIVE
                                } else {
                                    sys::IBV_EVENT_PORT_ERR
                                },
                                element: Element::Port(1),
                            });
                        }
                    }
                }
            })
            .map_err(|_| libc::EAGAIN)?;
        *pump = Some(Pump { stop, thread });
        Ok(())
    }

    /// Stops sending the events of CQ `cq`, whose struct is at `handle`, anywhere (it was
    /// destroyed). The route of a new CQ that got the same id meanwhile stays (see
    /// `take_if_same`).
    pub fn unroute(&self, cq: CqId, handle: usize) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if routes.get(&cq.0).is_some_and(|(_, h)| *h == handle) {
            routes.remove(&cq.0);
        }
    }
}

/// Removes `map[id]` if it is still `handle` (the address of the C struct it was made for)
/// and returns it. A CQ's or SRQ's id (and, after the QPNs came round, a QP's number) is free
/// for another thread's create as soon as the transport destroyed the object, before its
/// destroy call gets here to forget it: removing by id alone then forgot the new object's entry
/// instead, and for a CQ its completion channel stopped getting events. `rping -s -P` tearing
/// one connection down while the next was set up lost a connection's events about once in
/// a few thousand connections, its threads waiting for them forever.
fn take_if_same(map: &mut HashMap<u32, usize>, id: u32, handle: usize) -> Option<usize> {
    if map.get(&id) == Some(&handle) {
        map.remove(&id)
    } else {
        None
    }
}

/// Hands one engine event on: a completion event to its CQ's channel, an asynchronous one to
/// the context's queue with its `enum ibv_event_type` code, if its object is still known (an
/// event of an object destroyed meanwhile is dropped).
fn dispatch(e: Event, routes: &Routes, handles: &Mutex<Handles>, events: &AsyncEvents) {
    if let Event::CqNotify { cq } = e {
        let to = routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&cq.0)
            .cloned();
        if let Some((ch, handle)) = to {
            ch.push(handle);
        }
        return;
    }
    let h = handles.lock().unwrap_or_else(PoisonError::into_inner);
    let qp = |qpn: Qpn| h.qps.get(&qpn.value()).copied().map(Element::Qp);
    let out = match e {
        Event::QpFatal { qpn, .. } => qp(qpn).map(|el| (sys::IBV_EVENT_QP_FATAL, el)),
        Event::SqDrained { qpn } => qp(qpn).map(|el| (sys::IBV_EVENT_SQ_DRAINED, el)),
        Event::QpLastWqeReached { qpn } => {
            qp(qpn).map(|el| (sys::IBV_EVENT_QP_LAST_WQE_REACHED, el))
        }
        Event::CommEstablished { qpn } => qp(qpn).map(|el| (sys::IBV_EVENT_COMM_EST, el)),
        Event::CqOverflow { cq } => h
            .cqs
            .get(&cq.0)
            .map(|&c| (sys::IBV_EVENT_CQ_ERR, Element::Cq(c))),
        Event::SrqLimitReached { srq } => h
            .srqs
            .get(&srq.0)
            .map(|&s| (sys::IBV_EVENT_SRQ_LIMIT_REACHED, Element::Srq(s))),
        Event::CqNotify { .. } => None,
    };
    drop(h);
    if let Some((kind, element)) = out {
        events.push(AsyncEvent { kind, element });
    }
}

impl Drop for Verbs {
    /// Stops the event thread before the engine goes (the thread holds a reference to it).
    fn drop(&mut self) {
        if let Some(p) = self
            .pump
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            p.stop.store(true, Ordering::Relaxed);
            let _ = p.thread.join();
        }
    }
}

/// The rights of `ibv_access_flags`: the four the transport enforces and MW_BIND (memory
/// windows may be bound to the region), the optional-range bits
/// (IBV_ACCESS_OPTIONAL_RANGE, which a provider may ignore) and hints dropped.
///
/// # Errors
/// `EOPNOTSUPP` for on-demand paging and zero-based regions, which roce-xdp does not offer.
pub fn access_from_ibv(flags: u32) -> Result<Access, c_int> {
    const ZERO_BASED: u32 = sys::IBV_ACCESS_ZERO_BASED;
    const ON_DEMAND: u32 = sys::IBV_ACCESS_ON_DEMAND;
    if flags & (ZERO_BASED | ON_DEMAND) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(Access::from_bits_truncate(flags & 0x1f))
}

/// The `ibv_access_flags` of `a`.
#[must_use]
pub fn access_to_ibv(a: Access) -> u32 {
    a.bits()
}

/// `ibv_modify_qp`'s attributes and mask as the API's, the address vector resolved by
/// `resolve` (the GRH's destination GID and source GID index; RoCE has no LIDs).
///
/// # Errors
/// `EINVAL` for an unknown mask bit, state or MTU code, or an AV without a GRH; what
/// `resolve` returns.
pub fn qp_attr_from_ibv(
    a: &sys::ibv_qp_attr,
    mask: c_int,
    resolve: impl FnOnce(&sys::ibv_ah_attr) -> Result<Path, c_int>,
) -> Result<(QpAttr<Path>, AttrMask), c_int> {
    let mask = u32::try_from(mask)
        .ok()
        .and_then(AttrMask::from_bits)
        .ok_or(libc::EINVAL)?;
    let state = |code: u32| QpState::from_code(code).ok_or(libc::EINVAL);
    let mut out = QpAttr::<Path>::default();
    if mask.contains(AttrMask::STATE) {
        out.qp_state = state(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        out.cur_qp_state = state(a.cur_qp_state)?;
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) {
        out.qp_access_flags = access_from_ibv(a.qp_access_flags)?;
    }
    out.pkey_index = a.pkey_index;
    out.port_num = a.port_num;
    out.qkey = QKey::new(a.qkey);
    if mask.contains(AttrMask::AV) {
        if a.ah_attr.is_global == 0 {
            // RoCE addresses by GID only (IBA A16.4.2: the GRH is required).
            return Err(libc::EINVAL);
        }
        out.ah_attr = Some(resolve(&a.ah_attr)?);
    }
    if mask.contains(AttrMask::PATH_MTU) {
        out.path_mtu = mtu_from_ibv(a.path_mtu).ok_or(libc::EINVAL)?;
    }
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    out.rq_psn = Psn::new(a.rq_psn & 0xff_ffff);
    out.sq_psn = Psn::new(a.sq_psn & 0xff_ffff);
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.dest_qp_num = Qpn::new(a.dest_qp_num & 0xff_ffff);
    Ok((out, mask))
}

/// The MTU of an `enum ibv_mtu` code (1 = 256 ... 5 = 4096).
#[must_use]
pub fn mtu_from_ibv(code: u32) -> Option<Mtu> {
    1u32.checked_shl(code.checked_add(7)?)
        .and_then(Mtu::from_bytes)
        .filter(|_| (1..=5).contains(&code))
}

/// A work completion as `struct ibv_wc` (host-order immediate data goes back to network
/// order, as verbs deliver it).
#[must_use]
pub fn wc_to_ibv(wc: &Wc) -> sys::ibv_wc {
    let mut out = sys::ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status as u32,
        opcode: wc.opcode as u32,
        byte_len: wc.byte_len,
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.value(),
        wc_flags: wc.wc_flags.bits(),
        ..Default::default()
    };
    if wc.wc_flags.contains(WcFlags::WITH_IMM) {
        out.__bindgen_anon_1.imm_data = wc.imm.to_be();
    } else if wc.wc_flags.contains(WcFlags::WITH_INV) {
        out.__bindgen_anon_1.invalidated_rkey = wc.invalidated_rkey.value();
    }
    out
}

#[cfg(test)]
mod tests {
    use roce::api::{RKey, WcOpcode, WcStatus};

    use super::*;

    /// A destroy that gets to its bookkeeping after another thread made a new object with the
    /// same id leaves the new object's entry alone, and forgets its own otherwise.
    #[test]
    fn a_destroyed_objects_entry_goes_but_not_its_successors() {
        let mut m = HashMap::new();
        m.insert(7, 0x1000);
        // Destroyed in the transport; meanwhile id 7 went to a new CQ at 0x2000.
        m.insert(7, 0x2000);
        assert_eq!(take_if_same(&mut m, 7, 0x1000), None);
        assert_eq!(m.get(&7), Some(&0x2000));
        assert_eq!(take_if_same(&mut m, 7, 0x2000), Some(0x2000));
        assert!(m.is_empty());
        assert_eq!(take_if_same(&mut m, 7, 0x2000), None);
    }

    #[test]
    fn the_engine_mode_follows_the_environment() {
        assert_eq!(engine_mode(None), Mode::Auto);
        assert_eq!(engine_mode(Some(" ")), Mode::Auto);
        assert_eq!(engine_mode(Some("inline")), Mode::Inline);
        assert_eq!(engine_mode(Some("threads")), Mode::Threads);
        assert_eq!(engine_mode(Some("shared")), Mode::Shared);
        assert_eq!(engine_mode(Some("bogus")), Mode::Auto);
    }

    #[test]
    fn cc_parameters_come_from_the_environment_or_say_what_is_wrong() {
        let base = roce::transport::CcConfig::default();
        assert_eq!(cc_from_env(None, None, None), Ok(base));
        assert_eq!(cc_from_env(Some(""), Some(" "), Some("")), Ok(base));
        let c = cc_from_env(None, None, Some("loss_backoff=1, rpg_ai_rate=7,")).unwrap();
        assert!(c.dcqcn.loss_backoff);
        assert_eq!(c.dcqcn.rpg_ai_rate, 7);
        let off = cc_from_env(None, None, Some("enabled=0")).unwrap();
        assert!(!off.dcqcn.rp_enabled && !off.dcqcn.np_enabled);
        // The algorithm and the profile by name, then the pairs on top.
        let swift = cc_from_env(Some("swift"), Some("software"), Some("swift_ai=2000")).unwrap();
        assert_eq!(swift.algorithm, roce::cc::CcAlgorithm::Swift);
        assert!(!swift.dcqcn.rp_enabled && swift.dcqcn.np_enabled);
        assert_eq!(swift.swift.swift_ai, 2000);
        assert_eq!(
            swift.dcqcn.rpg_time_reset,
            roce::cc::DcqcnConfig::software().rpg_time_reset
        );
        let none = cc_from_env(Some("off"), None, None).unwrap();
        assert_eq!(none, roce::transport::CcConfig::off());
        for bad in [
            "loss_backoff",
            "rpg_ai_rate=x",
            "no_such=1",
            "loss_backoff=2",
        ] {
            let e = cc_from_env(None, None, Some(bad)).unwrap_err();
            assert!(e.starts_with(CC_ENV) && e.contains(bad), "{bad}: {e}");
        }
        let e = cc_from_env(Some("timely"), None, None).unwrap_err();
        assert!(
            e.starts_with(CC_ALGORITHM_ENV) && e.contains("timely"),
            "{e}"
        );
        let e = cc_from_env(None, Some("cx7"), None).unwrap_err();
        assert!(e.starts_with(CC_PROFILE_ENV) && e.contains("cx7"), "{e}");
    }

    #[test]
    fn switches_come_from_the_environment() {
        let mp = |v| flag_from_env(MULTIPATH_ENV, v, false);
        assert_eq!(mp(None), Ok(false));
        assert_eq!(mp(Some("")), Ok(false));
        assert_eq!(mp(Some("0")), Ok(false));
        assert_eq!(mp(Some(" 1")), Ok(true));
        let e = mp(Some("yes")).unwrap_err();
        assert!(e.starts_with(MULTIPATH_ENV) && e.contains("yes"), "{e}");
        // Coalescing is on unless told otherwise.
        let co = |v| flag_from_env(ACK_COALESCING_ENV, v, true);
        assert_eq!(co(None), Ok(true));
        assert_eq!(co(Some(" ")), Ok(true));
        assert_eq!(co(Some("0")), Ok(false));
        assert_eq!(co(Some("1")), Ok(true));
        let e = co(Some("off")).unwrap_err();
        assert!(
            e.starts_with(ACK_COALESCING_ENV) && e.contains("off"),
            "{e}"
        );
    }

    #[test]
    fn mtu_codes_map_both_ways() {
        assert_eq!(mtu_from_ibv(1), Some(Mtu::Mtu256));
        assert_eq!(mtu_from_ibv(5).map(Mtu::bytes), Some(4096));
        assert_eq!(mtu_from_ibv(0), None);
        assert_eq!(mtu_from_ibv(6), None);
        assert_eq!(mtu_from_ibv(u32::MAX), None);
    }

    #[test]
    fn access_flags_keep_the_four_rights_and_refuse_what_is_not_offered() {
        let all = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_ATOMIC
            | sys::IBV_ACCESS_MW_BIND;
        assert_eq!(access_from_ibv(all), Ok(Access::all()));
        assert_eq!(
            access_from_ibv(sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_RELAXED_ORDERING),
            Ok(Access::LOCAL_WRITE)
        );
        assert_eq!(
            access_from_ibv(sys::IBV_ACCESS_ON_DEMAND),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(access_to_ibv(Access::all()), all);
    }

    #[test]
    fn modify_attributes_follow_the_mask() {
        let a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: sys::IBV_MTU_1024,
            dest_qp_num: 0x12,
            rq_psn: 0x1ff_ffff,
            ..Default::default()
        };
        let mask =
            (sys::IBV_QP_STATE | sys::IBV_QP_PATH_MTU | sys::IBV_QP_DEST_QPN | sys::IBV_QP_RQ_PSN)
                as c_int;
        let (attr, m) = qp_attr_from_ibv(&a, mask, |_| unreachable!("no AV")).unwrap();
        assert_eq!(attr.qp_state, QpState::Rtr);
        assert_eq!(attr.path_mtu, Mtu::Mtu1024);
        assert_eq!(attr.dest_qp_num, Qpn::new(0x12));
        assert_eq!(attr.rq_psn, Psn::new(0xff_ffff), "a PSN is 24 bits");
        assert_eq!(m.bits(), mask as u32);
        // An AV without a GRH, an unknown bit, a bad state.
        let av = sys::IBV_QP_AV as c_int;
        assert_eq!(
            qp_attr_from_ibv(&a, av, |_| unreachable!()).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            qp_attr_from_ibv(&a, 1 << 30, |_| unreachable!()).err(),
            Some(libc::EINVAL)
        );
        let bad = sys::ibv_qp_attr {
            qp_state: 99,
            ..Default::default()
        };
        assert_eq!(
            qp_attr_from_ibv(&bad, sys::IBV_QP_STATE as c_int, |_| unreachable!()).err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn completions_carry_network_order_immediates() {
        let wc = Wc {
            wr_id: 7,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 12,
            imm: 0x0102_0304,
            wc_flags: WcFlags::WITH_IMM,
            qp_num: Qpn::new(0x11),
            ..Wc::default()
        };
        let c = wc_to_ibv(&wc);
        assert_eq!((c.wr_id, c.status, c.opcode, c.byte_len), (7, 0, 128, 12));
        assert_eq!(c.qp_num, 0x11);
        assert_eq!(c.wc_flags, sys::IBV_WC_WITH_IMM);
        let inv = Wc {
            wc_flags: WcFlags::WITH_INV,
            invalidated_rkey: RKey::new(0xabcd),
            ..Wc::default()
        };
        assert_eq!(wc_to_ibv(&inv).wc_flags, sys::IBV_WC_WITH_INV);
    }
}
