//! The drop-in `librdmacm.so.1`: rdma-core's RDMA connection manager API (`rdma_*`, version
//! nodes RDMACM_1.0 to 1.3 of Debian 12's librdmacm1 44) over the communication manager on
//! QP 1 of our devices (`roce::api::Device::cm_*`, the InfiniBand CM of `roce::ibcm`).
//!
//! # Why the same file as libibverbs
//! rdma-core's librdmacm reaches the kernel's CM through `/dev/infiniband/rdma_cm` (ucma) and
//! modifies its QPs through libibverbs. Ours has no kernel part: the CM runs in the process,
//! inside the device that libibverbs opened, so librdmacm needs that device's Rust object.
//! Two Rust cdylibs cannot share it (each has its own copy of every static), so the library
//! would need a private C ABI just to pass it across. Instead this library also defines the
//! `rdma_*` symbols, and `librdmacm.so.1` is a link to the same file (`roce exec` makes it):
//! glibc's loader recognises the file it already mapped (by device and inode) and binds both
//! names, with their version nodes, to the one copy. QPs are still made and moved through the
//! public `ibv_*` calls, as rdma-core's librdmacm does (`rdma_create_qp`, the INIT/RTR/RTS
//! transitions of `rdma_accept` and of the connect response).
//!
//! # Model
//! - An event channel is an eventfd in semaphore mode, readable while events wait (programs
//!   poll it), with the queue of events behind it.
//! - Each device with a listener or a connection has one thread that takes its CM events
//!   ([`roce::api::Device::wait_cm_event`]), acts on them as the kernel's `cma.c` does
//!   (QP to RTR/RTS and RTU on a REP, QP to ERR on a disconnect), and queues the RDMA CM
//!   event on the channel of the `rdma_cm_id` it belongs to.
//! - Address and route resolution come from the kernel's routing and neighbour tables, as
//!   rxe's do (no subnet administrator on RoCE): the source address is the one the kernel
//!   would use for the destination, the device is the one with that address in its GID table,
//!   and the route is the path to the peer (`Device::path_to`).
//! - RC over the TCP port space (`RDMA_PS_TCP`), with the QP made by `rdma_create_qp` or by
//!   the program (then `rdma_init_qp_attr` and `rdma_establish`, as `rping -q` does).
//! - UD over the UDP port space (`RDMA_PS_UDP`, udaddy): `rdma_create_qp` brings the UD QP
//!   to RTS with RDMA CM's Q_Key, `rdma_connect` sends a SIDR_REQ and its SIDR_REP becomes
//!   ESTABLISHED with the peer's address handle attributes, QPN and Q_Key in `param.ud`; a
//!   listener's SIDR_REQ becomes a CONNECT_REQUEST, answered by `rdma_accept` (SIDR_REP with
//!   our QPN) or `rdma_reject`.
//!
//! - librdmacm's synchronous mode: an id made without an event channel gets one of its own, and
//!   its calls wait for their event as `ucma_complete` does; `rdma_create_ep`,
//!   `rdma_get_request`, `rdma_destroy_ep` (Debian's `rdma_server`/`rdma_client`).
//!
//! Not provided (the call fails with ENOSYS and says so on stderr): the IB port space,
//! multicast, SRQs made through librdmacm (`rdma_create_srq*`), the ECE calls, and rsockets
//! except `rpoll` and `rselect` on ordinary file descriptors (what they are while no
//! rsocket exists; programs such as rping import them only for that).

use core::{
    ffi::{c_char, c_int, c_void},
    mem::size_of,
    ptr,
};
use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc, LazyLock, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU16, Ordering},
    },
    time::Duration,
};

use roce::{
    api::{CmAccept, CmConnect, CmDevice, CmEvent, CmState, CommId},
    ibcm::{CmaHdr, Gid},
    transport::{Psn, Qpn},
};

use super::{device::ctx_of, guard, set_errno};
use crate::sys;

/// Says on stderr why a call failed, as a C program has no other way to learn it.
fn say(what: &str) {
    eprintln!("librdmacm (roce-xdp): {what}");
}

/// The local ACK timeout librdmacm gives RC QPs on RoCE (cma.c: the packet lifetime of
/// `CMA_IBOE_PACKET_LIFETIME` doubled, plus the CA's ACK delay), as the IBTA 9.7.6.1.3 code.
const LOCAL_ACK_TIMEOUT: u8 = 18;
/// The RNR NAK timer code of the receive side (IBTA 9.7.5.2.8: 12 is 0.64 ms, rxe's default).
const MIN_RNR_TIMER: u8 = 12;
/// The length of the RDMA CM IP header at the start of a REQ's private data (cma.c
/// `struct cma_hdr`): the private data the program sees starts after it.
const CMA_HDR_LEN: usize = 36;

// ---------------------------------------------------------------------------------------
// Event channels and events
// ---------------------------------------------------------------------------------------

/// An event channel: `struct rdma_event_channel` first (its `fd` is the eventfd), then the
/// events waiting behind it. It lives in an `Arc` whose pointer is the program's
/// `struct rdma_event_channel *`: the channel table ([`LIVE_CHANNELS`]) holds one count, and
/// each `rdma_get_cm_event` under way holds another, so a channel destroyed while another
/// thread waits on it (rping's main thread destroys its id and channel while its CM thread
/// waits) stays in memory, its eventfd open, until that wait returns.
#[repr(C)]
struct ChanObj {
    ibv: sys::rdma_event_channel,
    efd: OwnedFd,
    queue: Mutex<VecDeque<usize>>,
}

/// An event: `struct rdma_cm_event` first, then the private data its `param` points into.
#[repr(C)]
struct EvObj {
    ibv: sys::rdma_cm_event,
    data: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection parameters an event reports (`event->param.conn`), or for a UD id's
/// event the peer's address, QP and Q_Key (`event->param.ud`).
#[derive(Clone, Copy, Default)]
struct ConnInfo {
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
    ud: Option<UdInfo>,
}

/// What `event->param.ud` reports (librdmacm's `ucma_copy_ud_event`): the address handle
/// attributes of the path to the peer, its QPN and Q_Key.
#[derive(Clone, Copy)]
struct UdInfo {
    ah_attr: sys::ibv_ah_attr,
    qp_num: u32,
    qkey: u32,
}

/// Queues an event for `id` on its channel and makes the channel's fd readable.
///
/// # Safety
/// `id` must be a live id of ours (the registry's lock held by the caller keeps it so).
unsafe fn post_event(
    id: *mut sys::rdma_cm_id,
    listen_id: *mut sys::rdma_cm_id,
    event: sys::rdma_cm_event_type,
    status: c_int,
    info: ConnInfo,
    data: Vec<u8>,
) {
    // SAFETY: the caller's contract.
    let chan = unsafe { (*id).channel };
    if chan.is_null() {
        return;
    }
    let mut ev = Box::new(EvObj {
        ibv: sys::rdma_cm_event {
            id,
            listen_id,
            event,
            status,
            ..Default::default()
        },
        data,
    });
    let len = u8::try_from(ev.data.len()).unwrap_or(u8::MAX);
    let pd = if ev.data.is_empty() {
        ptr::null()
    } else {
        ev.data.as_ptr().cast::<c_void>()
    };
    ev.ibv.param.conn = sys::rdma_conn_param {
        private_data: pd,
        private_data_len: len,
        responder_resources: info.responder_resources,
        initiator_depth: info.initiator_depth,
        flow_control: info.flow_control,
        retry_count: info.retry_count,
        rnr_retry_count: info.rnr_retry_count,
        srq: info.srq,
        qp_num: info.qp_num,
    };
    if let Some(u) = info.ud {
        ev.ibv.param.ud = sys::rdma_ud_param {
            private_data: pd,
            private_data_len: len,
            ah_attr: u.ah_attr,
            qp_num: u.qp_num,
            qkey: u.qkey,
        };
    }
    // SAFETY: an id's channel is a live `ChanObj` of ours while ids use it (the rdma_cm
    // contract: a channel is destroyed after its ids).
    let chan = unsafe { &*chan.cast::<ChanObj>() };
    lock(&chan.queue).push_back(Box::into_raw(ev) as usize);
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a local buffer to our eventfd.
    let _ = unsafe { libc::write(chan.efd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

export!(
    "RDMACM_1.0",
    /// `rdma_create_event_channel`: an eventfd-backed channel (see the module doc).
    fn rdma_create_event_channel() -> *mut sys::rdma_event_channel {
        guard(ptr::null_mut(), make_channel)
    }
);

/// A new event channel (an eventfd and a queue), or NULL with errno from `eventfd`.
fn make_channel() -> *mut sys::rdma_event_channel {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return ptr::null_mut();
    }
    // SAFETY: `fd` was just made and is owned by nothing else.
    let efd = unsafe { OwnedFd::from_raw_fd(fd) };
    let c = std::sync::Arc::new(ChanObj {
        ibv: sys::rdma_event_channel { fd },
        efd,
        queue: Mutex::new(VecDeque::new()),
    });
    // The table's count; `rdma_destroy_event_channel` gives it up.
    let c: *mut sys::rdma_event_channel = std::sync::Arc::into_raw(c).cast_mut().cast();
    lock(&LIVE_CHANNELS).insert(c as usize);
    c
}

/// The event channels this library made and has not destroyed: a call on anything else (a
/// channel destroyed already, as perftest 4.5-0.17's RDMA CM retry passes) fails with EINVAL
/// and a line on stderr instead of reading freed memory (a double `rdma_destroy_event_channel`
/// in rdma-core's librdmacm is a double free).
static LIVE_CHANNELS: LazyLock<Mutex<std::collections::HashSet<usize>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

/// Whether `c` is a live channel of ours; says so on stderr when it is not.
fn live_channel(c: *mut sys::rdma_event_channel, call: &str) -> bool {
    let live = !c.is_null() && lock(&LIVE_CHANNELS).contains(&(c as usize));
    if !live && !c.is_null() {
        say(&format!(
            "{call}: {c:p} is not an event channel of this process (destroyed already?)"
        ));
    }
    live
}

export!(
    "RDMACM_1.0",
    /// `rdma_destroy_event_channel`: frees the channel and the events nobody took.
    fn rdma_destroy_event_channel(channel: *mut sys::rdma_event_channel) -> () {
        guard((), || {
            if !lock(&LIVE_CHANNELS).remove(&(channel as usize)) {
                let _ = live_channel(channel, "rdma_destroy_event_channel");
                return;
            }
            // SAFETY: made by `rdma_create_event_channel` (`Arc::into_raw`); the table's
            // count, given up once: the channel was in the table and is out of it now. A
            // `rdma_get_cm_event` still waiting holds its own count.
            let c = unsafe { std::sync::Arc::from_raw(channel.cast::<ChanObj>().cast_const()) };
            for e in lock(&c.queue).drain(..) {
                // SAFETY: queued by `post_event` with `Box::into_raw`.
                drop(unsafe { Box::from_raw(e as *mut EvObj) });
            }
        });
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_get_cm_event`: the next event, waiting for one unless the channel's fd was made
    /// non-blocking (then -1 with errno EAGAIN when none waits). Ack it with
    /// `rdma_ack_cm_event`.
    fn rdma_get_cm_event(
        channel: *mut sys::rdma_event_channel,
        event: *mut *mut sys::rdma_cm_event,
    ) -> c_int {
        guard(-1, || {
            let held = {
                let live = lock(&LIVE_CHANNELS);
                if event.is_null() || channel.is_null() || !live.contains(&(channel as usize)) {
                    None
                } else {
                    let p = channel.cast::<ChanObj>().cast_const();
                    // SAFETY: a channel in the table is an `Arc::into_raw` pointer whose
                    // table count is still held (destroy takes it out under this lock first),
                    // so the count can be raised; the `Arc` made below gives it back.
                    unsafe { std::sync::Arc::increment_strong_count(p) };
                    // SAFETY: the count just raised is this call's own.
                    Some(unsafe { std::sync::Arc::from_raw(p) })
                }
            };
            let Some(c) = held else {
                // Says on stderr why, for a channel that is not (or no longer) ours.
                if !event.is_null() {
                    let _ = live_channel(channel, "rdma_get_cm_event");
                }
                set_errno(libc::EINVAL);
                return -1;
            };
            // A wake-up whose event was withdrawn (its id destroyed) reads again; if the
            // channel was destroyed meanwhile, that read waits for good, as a read on a
            // channel's fd closed under it does with rdma-core (its fd stays open while this
            // call holds the channel).
            loop {
                let mut buf = [0u8; 8];
                // SAFETY: reads 8 bytes into a local buffer from our eventfd.
                let n = unsafe { libc::read(c.efd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    // errno is read's (EAGAIN on a non-blocking fd, EINTR).
                    return -1;
                }
                // An event of a destroyed id was withdrawn: its count stays; take the next.
                if let Some(e) = lock(&c.queue).pop_front() {
                    // SAFETY: `event` is the caller's out pointer.
                    unsafe { event.write(e as *mut sys::rdma_cm_event) };
                    return 0;
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_ack_cm_event`: frees an event from `rdma_get_cm_event`.
    fn rdma_ack_cm_event(event: *mut sys::rdma_cm_event) -> c_int {
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: an event handed out by `rdma_get_cm_event` (`Box::into_raw` of an `EvObj`),
        // acked once.
        drop(unsafe { Box::from_raw(event.cast::<EvObj>()) });
        0
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_event_str`: the event's name, as librdmacm spells it.
    fn rdma_event_str(event: sys::rdma_cm_event_type) -> *const c_char {
        let s: &'static [u8] = match event {
            sys::RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
            sys::RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
            sys::RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
            sys::RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
            sys::RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
            sys::RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
            sys::RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
            sys::RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
            sys::RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
            sys::RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
            sys::RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
            sys::RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
            sys::RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
            sys::RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
            sys::RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
            sys::RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
            _ => b"UNKNOWN EVENT\0",
        };
        s.as_ptr().cast()
    }
);

// ---------------------------------------------------------------------------------------
// Ids and the registry
// ---------------------------------------------------------------------------------------

/// What we know of an id besides its C struct.
#[derive(Default)]
struct IdState {
    /// Made without an event channel (librdmacm's synchronous mode): the id has a channel of
    /// its own, and the calls that start an event wait for it ([`sync_complete`]).
    sync: bool,
    /// `rdma_create_ep`'s PD and QP attributes on a passive id: `rdma_get_request` gives
    /// each connection request's id a QP made with them.
    ep_qp: Option<(usize, sys::ibv_qp_init_attr)>,
    /// `rdma_create_qp` made the QP's CQs and completion channels (none were given).
    own_cqs: bool,
    /// Bound (or resolved) local address.
    src: Option<SocketAddr>,
    /// Resolved peer address.
    dst: Option<SocketAddr>,
    /// The connection on the device's CM.
    comm: Option<CommId>,
    /// The side that sent the REQ.
    active: bool,
    /// The peer's QPN, and the PSN its REQ or REP carried: the PSN our QP sends from.
    remote_qpn: u32,
    remote_psn: u32,
    /// The PSN our REQ or REP carried: the PSN our QP's receive queue expects first.
    our_psn: u32,
    /// RDMA READs we take at once and send at once.
    responder_resources: u8,
    initiator_depth: u8,
    /// Transport and RNR retries of our QP's send side.
    retry_count: u8,
    rnr_retry_count: u8,
    /// The path MTU (ibv_mtu code).
    path_mtu: u32,
    /// Active: a REP arrived for a program-made QP; `rdma_establish` sends the RTU.
    rep_pending: bool,
    /// The private data to report with ESTABLISHED (the REP's, on the active side).
    est_data: Vec<u8>,
    /// Contexts this id listens on.
    listening: Vec<usize>,
    /// UDP port space: `comm` is a SIDR request (ours on the active side, the peer's on the
    /// passive side) rather than a connection.
    sidr: bool,
    /// Passive: the REQ hinted the multipath extension (docs/multipath.md, "Hints out of
    /// band"); `rdma_accept` tells the QP before RTR.
    multipath_hint: bool,
}

/// An id: `struct rdma_cm_id` first.
#[repr(C)]
struct IdObj {
    ibv: sys::rdma_cm_id,
    st: Mutex<IdState>,
}

/// The state of an id.
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn state<'a>(id: *mut sys::rdma_cm_id) -> MutexGuard<'a, IdState> {
    // SAFETY: the caller's contract.
    lock(unsafe { &(*id.cast::<IdObj>()).st })
}

/// Who gets a device's CM events.
#[derive(Default)]
struct Registry {
    /// (context, TCP port) → listening id.
    listeners: HashMap<(usize, u16), usize>,
    /// (context, UDP port) → listening id (SIDR requests).
    ud_listeners: HashMap<(usize, u16), usize>,
    /// (context, our communication ID) → id.
    conns: HashMap<(usize, CommId), usize>,
    /// (context, SIDR request handle) → id: our requests waiting for their SIDR_REP, and the
    /// peers' waiting for `rdma_accept` or `rdma_reject`.
    sidrs: HashMap<(usize, CommId), usize>,
    /// Contexts whose event thread runs.
    pumps: Vec<usize>,
    /// The contexts librdmacm opened (rdma-core opens every device once and keeps it).
    contexts: Vec<usize>,
    /// The PD `rdma_create_qp` uses when given none, per context.
    pds: HashMap<usize, usize>,
}

static REG: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

fn reg() -> MutexGuard<'static, Registry> {
    lock(&REG)
}

/// Opens every device once (as rdma-core's `ucma_init`); returns the contexts.
fn contexts(r: &mut Registry) -> Vec<usize> {
    if r.contexts.is_empty() {
        let mut n: c_int = 0;
        // SAFETY: our own verb; `n` is a local out parameter.
        let list = unsafe { super::device::ibv_get_device_list(&raw mut n) };
        if !list.is_null() {
            for i in 0..usize::try_from(n).unwrap_or(0) {
                // SAFETY: `list` holds `n` device pointers.
                let dev = unsafe { *list.add(i) };
                // SAFETY: a device of the list.
                let ctx = unsafe { super::device::ibv_open_device(dev) };
                if !ctx.is_null() {
                    r.contexts.push(ctx as usize);
                }
            }
            // SAFETY: the list from `ibv_get_device_list`, freed once.
            unsafe { super::device::ibv_free_device_list(list) };
        }
    }
    r.contexts.clone()
}

/// The GID index of `ip` on context `ctx`.
fn gid_index(ctx: usize, ip: IpAddr) -> Option<usize> {
    // SAFETY: contexts in the registry are never closed.
    let c = unsafe { ctx_of(ctx as *mut sys::ibv_context) }?;
    let want = Gid::from_ip(ip).0;
    c.verbs.port.gids().iter().position(|g| *g == want)
}

/// The context whose GID table holds `ip`.
fn ctx_with(r: &mut Registry, ip: IpAddr) -> Option<usize> {
    contexts(r)
        .into_iter()
        .find(|&c| gid_index(c, ip).is_some())
}

/// The engine of a context, started if needed.
fn device_arc(ctx: usize) -> Result<Arc<dyn CmDevice>, c_int> {
    // SAFETY: contexts in the registry are never closed.
    let c = unsafe { ctx_of(ctx as *mut sys::ibv_context) }.ok_or(libc::EINVAL)?;
    c.verbs.device_arc()
}

/// Starts the event thread of `ctx` once, and returns its engine.
fn pump(r: &mut Registry, ctx: usize) -> Result<Arc<dyn CmDevice>, c_int> {
    let dev = device_arc(ctx)?;
    dev.cm_enable().map_err(|e| {
        say(&format!("cannot run the CM on QP 1: {e:#}"));
        e.errno()
    })?;
    if !r.pumps.contains(&ctx) {
        let d = Arc::clone(&dev);
        std::thread::Builder::new()
            .name("rdmacm-events".into())
            .spawn(move || {
                loop {
                    if let Some(ev) = d.wait_cm_event(Duration::from_millis(500)) {
                        let mut r = reg();
                        guard((), || dispatch(&mut r, ctx, &*d, ev));
                    }
                }
            })
            .map_err(|_| libc::EAGAIN)?;
        r.pumps.push(ctx);
    }
    Ok(dev)
}

/// A random 24-bit PSN.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    (h.finish() & 0xff_ffff) as u32
}

/// An ephemeral source port for an id bound without one (the kernel's range).
fn ephemeral_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        32768 + (random_psn() % 28000) as u16,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let p = NEXT.fetch_add(1, Ordering::Relaxed);
    if p < 32768 { 32768 } else { p }
}

// ---------------------------------------------------------------------------------------
// Socket addresses
// ---------------------------------------------------------------------------------------

/// The address a `struct sockaddr *` holds (IPv4 or IPv6).
///
/// # Safety
/// `sa` must be NULL or point at a socket address of the size its family says.
unsafe fn sockaddr_in(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family is the first field of every sockaddr.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a `sockaddr_in`.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `a` as a `sockaddr_storage`, and its length.
fn to_storage(a: SocketAddr) -> (libc::sockaddr_storage, u32) {
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut st: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a `sockaddr_in` fits in a `sockaddr_storage`.
            unsafe { ptr::from_mut(&mut st).cast::<libc::sockaddr_in>().write(s) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a `sockaddr_in6` fits in a `sockaddr_storage`.
            unsafe { ptr::from_mut(&mut st).cast::<libc::sockaddr_in6>().write(s) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as u32)
}

/// Writes the id's source (`dst == false`) or destination address into its route.
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn set_route_addr(id: *mut sys::rdma_cm_id, a: SocketAddr, dst: bool) {
    let (st, _) = to_storage(a);
    // SAFETY: `route.addr` starts with the source union and then the destination union,
    // each a `sockaddr_storage` (rdma_cma.h `struct rdma_addr`).
    unsafe {
        let base = (&raw mut (*id).route.addr).cast::<libc::sockaddr_storage>();
        base.add(usize::from(dst)).write(st);
    }
}

/// The source address the kernel's routing table picks for `dst` (as rdma_resolve_addr does
/// through the kernel's `rdma_translate_ip`/`addr_resolve`).
fn route_source(dst: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(bind).ok()?;
    let mut to = dst;
    to.set_port(4791);
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip())
}

// ---------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------

/// librdmacm's `ucma_complete`: for an id in synchronous mode, waits for the event of the
/// call that just succeeded (ADDR_RESOLVED, ROUTE_RESOLVED, ESTABLISHED, DISCONNECTED) on the
/// id's own channel and keeps it on the id (`id->event`, acked by the next such call or the
/// id's destruction); returns 0, or -1 with errno ECONNREFUSED for a reject and the event's
/// status otherwise. Returns 0 at once for an id with a channel of the program's. Call with
/// the registry unlocked (the event thread needs it to deliver the event).
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn sync_complete(id: *mut sys::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    if !unsafe { state(id) }.sync {
        return 0;
    }
    // SAFETY: as above; an event of ours kept by the previous call.
    unsafe {
        let kept = (*id).event;
        if !kept.is_null() {
            (*id).event = ptr::null_mut();
            rdma_ack_cm_event(kept);
        }
    }
    let mut ev = ptr::null_mut();
    // SAFETY: the id's own live channel and a local out pointer.
    if unsafe { rdma_get_cm_event((*id).channel, &raw mut ev) } != 0 {
        return -1;
    }
    // SAFETY: as above; `ev` was just handed out.
    let (kind, status) = unsafe {
        (*id).event = ev;
        ((*ev).event, (*ev).status)
    };
    if status == 0 {
        return 0;
    }
    set_errno(if kind == sys::RDMA_CM_EVENT_REJECTED {
        libc::ECONNREFUSED
    } else {
        status.abs()
    });
    -1
}

/// Makes an id on `channel` for `ctx` (0: not bound to a device yet).
fn new_id(
    channel: *mut sys::rdma_event_channel,
    context: *mut c_void,
    ps: sys::rdma_port_space,
    qp_type: sys::ibv_qp_type,
) -> *mut sys::rdma_cm_id {
    let obj = Box::new(IdObj {
        ibv: sys::rdma_cm_id {
            channel,
            context,
            ps,
            qp_type,
            ..Default::default()
        },
        st: Mutex::new(IdState::default()),
    });
    let id: *mut sys::rdma_cm_id = Box::into_raw(obj).cast();
    lock(&LIVE).insert(id as usize);
    id
}

/// The ids this library made and has not destroyed: a call on anything else (a stale or
/// wild pointer) fails with EINVAL instead of reading through it.
static LIVE: LazyLock<Mutex<std::collections::HashSet<usize>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

/// Whether `id` is a live id of ours.
fn live(id: *mut sys::rdma_cm_id) -> bool {
    !id.is_null() && lock(&LIVE).contains(&(id as usize))
}

export!(
    "RDMACM_1.0",
    /// `rdma_create_id`: an id on `channel` for port space `ps` (TCP: RC; UDP: UD). A NULL
    /// channel asks for librdmacm's synchronous mode: the id gets a channel of its own, and
    /// `rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`, `rdma_accept` and
    /// `rdma_disconnect` return once their event came ([`sync_complete`]).
    fn rdma_create_id(
        channel: *mut sys::rdma_event_channel,
        id: *mut *mut sys::rdma_cm_id,
        context: *mut c_void,
        ps: sys::rdma_port_space,
    ) -> c_int {
        guard(-1, || {
            if id.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            if !channel.is_null() && !live_channel(channel, "rdma_create_id") {
                set_errno(libc::EINVAL);
                return -1;
            }
            let qp_type = match ps {
                sys::RDMA_PS_TCP | sys::RDMA_PS_IPOIB => sys::IBV_QPT_RC,
                sys::RDMA_PS_UDP => sys::IBV_QPT_UD,
                _ => {
                    set_errno(libc::EINVAL);
                    return -1;
                }
            };
            // Synchronous mode (librdmacm's `rdma_create_id` with a NULL channel): the id gets
            // a channel of its own, read by the calls that wait for their event.
            let sync = channel.is_null();
            let channel = if sync { make_channel() } else { channel };
            if channel.is_null() {
                return -1;
            }
            let made = new_id(channel, context, ps, qp_type);
            // SAFETY: just made, live.
            unsafe { state(made).sync = sync };
            // SAFETY: `id` is the caller's out pointer.
            unsafe { id.write(made) };
            0
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_destroy_id`: stops listening, disconnects an established connection (a DREQ, as
    /// the kernel's `rdma_destroy_id`), withdraws the id's waiting events and frees it. The
    /// QP must have been destroyed first (the rdma_cm rule).
    fn rdma_destroy_id(id: *mut sys::rdma_cm_id) -> c_int {
        guard(-1, || {
            if !live(id) {
                set_errno(libc::EINVAL);
                return -1;
            }
            let mut r = reg();
            // SAFETY: a live id of ours (the rdma_cm contract).
            let st = unsafe { state(id) };
            let port = st.src.map_or(0, |s| s.port());
            // SAFETY: as above.
            let udp = unsafe { (*id).ps } == sys::RDMA_PS_UDP;
            for &ctx in &st.listening {
                if udp {
                    if r.ud_listeners.remove(&(ctx, port)).is_some()
                        && let Ok(d) = device_arc(ctx)
                    {
                        let _ = d.cm_unlisten(port, true);
                    }
                } else if r.listeners.remove(&(ctx, port)).is_some()
                    && let Ok(d) = device_arc(ctx)
                {
                    let _ = d.cm_unlisten(port, false);
                }
            }
            // SAFETY: as above.
            let ctx = unsafe { (*id).verbs } as usize;
            if let (Some(comm), true) = (st.comm, st.sidr) {
                // A peer's SIDR request nobody answered: refuse it, as the kernel's
                // `ib_destroy_cm_id` does (cm.c, IB_CM_SIDR_REQ_RCVD: status REJECT).
                if r.sidrs.remove(&(ctx, comm)).is_some()
                    && !st.active
                    && let Ok(d) = device_arc(ctx)
                {
                    let _ = d.cm_sidr_reply(
                        comm,
                        roce::api::SidrStatus::REJECT,
                        Qpn::new(0),
                        roce::transport::QKey::new(0),
                        &[],
                    );
                }
            } else if let Some(comm) = st.comm {
                r.conns.remove(&(ctx, comm));
                // As the kernel's rdma_destroy_id: the peer hears a REJ before the connection
                // is established, one DREQ after (cm.c `cm_destroy_id`).
                if let Ok(d) = device_arc(ctx)
                    && d.cm_state(comm).is_some()
                {
                    let _ = d.cm_destroy(comm);
                }
            }
            let sync = st.sync;
            drop(st);
            // SAFETY: as above: the event a synchronous call kept on the id is acked with it.
            unsafe {
                let kept = (*id).event;
                if !kept.is_null() {
                    (*id).event = ptr::null_mut();
                    rdma_ack_cm_event(kept);
                }
            }
            // SAFETY: as above.
            let chan = unsafe { (*id).channel };
            if !chan.is_null() {
                // SAFETY: the id's channel outlives it.
                let c = unsafe { &*chan.cast::<ChanObj>() };
                lock(&c.queue).retain(|&e| {
                    // SAFETY: queued events are live `EvObj`s.
                    let mine = unsafe { (*(e as *mut EvObj)).ibv.id } == id;
                    if mine {
                        // SAFETY: withdrawn from the queue, never handed out.
                        drop(unsafe { Box::from_raw(e as *mut EvObj) });
                    }
                    !mine
                });
            }
            lock(&LIVE).remove(&(id as usize));
            drop(r);
            if sync && !chan.is_null() {
                // SAFETY: the id's own channel (synchronous mode), used by nothing else.
                unsafe { rdma_destroy_event_channel(chan) };
            }
            // SAFETY: as above: its path record, if any, is ours (`set_path_rec`).
            unsafe { free_path_rec(id) };
            // SAFETY: `rdma_create_id` or the event thread made it with `Box::into_raw`;
            // the caller gives it up.
            drop(unsafe { Box::from_raw(id.cast::<IdObj>()) });
            0
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_migrate_id`: moves the id's future events to another channel.
    fn rdma_migrate_id(id: *mut sys::rdma_cm_id, channel: *mut sys::rdma_event_channel) -> c_int {
        if !live(id) || !live_channel(channel, "rdma_migrate_id") {
            set_errno(libc::EINVAL);
            return -1;
        }
        let _r = reg();
        // SAFETY: a live id of ours; the registry lock keeps the event thread off it.
        unsafe { (*id).channel = channel };
        0
    }
);

/// Binds `id` to the local address `a`: to the device that has it (none for a wildcard).
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn bind(r: &mut Registry, id: *mut sys::rdma_cm_id, mut a: SocketAddr) -> Result<(), c_int> {
    if !a.ip().is_unspecified() {
        let ctx = ctx_with(r, a.ip()).ok_or_else(|| {
            say(&format!("no roce-xdp device has the address {}", a.ip()));
            libc::ENODEV
        })?;
        // SAFETY: the caller's contract.
        unsafe {
            (*id).verbs = ctx as *mut sys::ibv_context;
            (*id).port_num = 1;
        }
    }
    if a.port() == 0 {
        a.set_port(ephemeral_port());
    }
    // SAFETY: the caller's contract.
    unsafe {
        set_route_addr(id, a, false);
        state(id).src = Some(a);
    }
    Ok(())
}

export!(
    "RDMACM_1.0",
    /// `rdma_bind_addr`: binds to a local address (wildcard or one of a device's), and to its
    /// device; port 0 takes an ephemeral port.
    fn rdma_bind_addr(id: *mut sys::rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
        guard(-1, || {
            // SAFETY: the caller passes a socket address.
            let Some(a) = (unsafe { sockaddr_in(addr) }) else {
                set_errno(libc::EAFNOSUPPORT);
                return -1;
            };
            if !live(id) {
                set_errno(libc::EINVAL);
                return -1;
            }
            let mut r = reg();
            // SAFETY: a live id of ours.
            match unsafe { bind(&mut r, id, a) } {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_resolve_addr`: the source address is `src_addr`, the bound one, or what the
    /// kernel's routing table picks for `dst_addr`; the id is bound to the device with that
    /// address. ADDR_RESOLVED is queued at once (the neighbour is resolved by the route
    /// step), or the call fails with ENODEV when no device of ours has the source address.
    fn rdma_resolve_addr(
        id: *mut sys::rdma_cm_id,
        src_addr: *mut libc::sockaddr,
        dst_addr: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int {
        let _ = timeout_ms;
        guard(-1, || {
            let rc = (|| {
                // SAFETY: the caller passes socket addresses (or NULL for the source).
                let (src, dst) = unsafe { (sockaddr_in(src_addr), sockaddr_in(dst_addr)) };
                let Some(dst) = dst else {
                    set_errno(libc::EINVAL);
                    return -1;
                };
                if !live(id) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let mut r = reg();
                // SAFETY: a live id of ours.
                let bound = unsafe { state(id).src };
                let src = match src.or(bound) {
                    Some(s) if !s.ip().is_unspecified() => s,
                    other => {
                        let Some(ip) = route_source(dst) else {
                            set_errno(libc::ENETUNREACH);
                            return -1;
                        };
                        SocketAddr::new(ip, other.map_or(0, |s| s.port()))
                    }
                };
                // SAFETY: a live id of ours.
                if let Err(e) = unsafe { bind(&mut r, id, src) } {
                    set_errno(e);
                    return -1;
                }
                // SAFETY: as above; the registry lock is held.
                unsafe {
                    set_route_addr(id, dst, true);
                    state(id).dst = Some(dst);
                    post_event(
                        id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_ADDR_RESOLVED,
                        0,
                        ConnInfo::default(),
                        Vec::new(),
                    );
                }
                0
            })();
            if rc == 0 && live(id) {
                // SAFETY: a live id of ours (checked again: the call may have destroyed it).
                unsafe { sync_complete(id) }
            } else {
                rc
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_resolve_route`: the path to the peer from the kernel's routing and neighbour
    /// tables (as rxe resolves an address vector); ROUTE_RESOLVED, or ROUTE_ERROR with
    /// -EHOSTUNREACH when there is none.
    fn rdma_resolve_route(id: *mut sys::rdma_cm_id, timeout_ms: c_int) -> c_int {
        let _ = timeout_ms;
        guard(-1, || {
            let rc = (|| {
                if !live(id) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let r = reg();
                // SAFETY: a live id of ours.
                let ctx = unsafe { (*id).verbs } as usize;
                let (src, dst) = {
                    // SAFETY: a live id of ours.
                    let st = unsafe { state(id) };
                    (st.src, st.dst)
                };
                let (Some(src), Some(dst), true) = (src, dst, ctx != 0) else {
                    set_errno(libc::EINVAL);
                    return -1;
                };
                let found = (|| {
                    let gi = gid_index(ctx, src.ip()).ok_or(libc::ENODEV)?;
                    let dev = device_arc(ctx)?;
                    dev.path_to(gi, &Gid::from_ip(dst.ip()).0, Qpn::GSI, Qpn::GSI)
                        .map_err(|e| {
                            say(&format!("no route to {}: {e:#}", dst.ip()));
                            libc::EHOSTUNREACH
                        })?;
                    let ipv6 = dst.is_ipv6();
                    // SAFETY: contexts in the registry are never closed.
                    let c = unsafe { ctx_of(ctx as *mut sys::ibv_context) }.ok_or(libc::EINVAL)?;
                    let mtu = mtu_code(
                        c.verbs
                            .port
                            .info
                            .max_path_mtu(ipv6)
                            .min(dev.max_path_mtu(ipv6)),
                    );
                    Ok::<_, c_int>((gi, mtu))
                })();
                match found {
                    Ok((_, mtu)) => {
                        // SAFETY: a live id of ours.
                        unsafe {
                            state(id).path_mtu = mtu;
                            set_path_rec(id, src.ip(), dst.ip(), mtu);
                            post_event(
                                id,
                                ptr::null_mut(),
                                sys::RDMA_CM_EVENT_ROUTE_RESOLVED,
                                0,
                                ConnInfo::default(),
                                Vec::new(),
                            );
                        }
                    }
                    Err(e) => {
                        // SAFETY: a live id of ours.
                        unsafe {
                            post_event(
                                id,
                                ptr::null_mut(),
                                sys::RDMA_CM_EVENT_ROUTE_ERROR,
                                -e,
                                ConnInfo::default(),
                                Vec::new(),
                            );
                        }
                    }
                }
                drop(r);
                0
            })();
            if rc == 0 && live(id) {
                // SAFETY: a live id of ours (checked again: the call may have destroyed it).
                unsafe { sync_complete(id) }
            } else {
                rc
            }
        })
    }
);

/// The `ibv_mtu` code of a byte count.
fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => sys::IBV_MTU_4096,
        2048.. => sys::IBV_MTU_2048,
        1024.. => sys::IBV_MTU_1024,
        512.. => sys::IBV_MTU_512,
        _ => sys::IBV_MTU_256,
    }
}

/// Fills `id->route.path_rec` with the one path RoCE has (GIDs, P_Key, MTU), as the kernel
/// reports a RoCE route.
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn set_path_rec(id: *mut sys::rdma_cm_id, src: IpAddr, dst: IpAddr, mtu: u32) {
    let mut p = sys::ibv_sa_path_rec {
        pkey: 0xffff_u16.to_be(),
        hop_limit: 64,
        mtu: mtu as u8,
        mtu_selector: 2,
        numb_path: 1,
        reversible: 1,
        ..Default::default()
    };
    p.sgid.raw = Gid::from_ip(src).0;
    p.dgid.raw = Gid::from_ip(dst).0;
    // SAFETY: the caller's contract.
    unsafe {
        free_path_rec(id);
        (*id).route.path_rec = Box::into_raw(Box::new(p));
        (*id).route.num_paths = 1;
    }
}

/// Frees `id->route.path_rec` (made by [`set_path_rec`]) and clears it: when the path is
/// set again, and when the id is destroyed. Without the latter every connection's path
/// record (64 bytes) stayed behind: `rping -s -P` grew by that much per connection
/// (heaptrack over tests/tests/cm_scale.rs: 7,000 connections, 7,000 records left).
///
/// # Safety
/// `id` is a live id of ours whose path record is NULL or one of ours (`Box::into_raw`).
unsafe fn free_path_rec(id: *mut sys::rdma_cm_id) {
    // SAFETY: the caller's contract.
    unsafe {
        let old = (*id).route.path_rec;
        if !old.is_null() {
            (*id).route.path_rec = ptr::null_mut();
            (*id).route.num_paths = 0;
            drop(Box::from_raw(old));
        }
    }
}

export!(
    "RDMACM_1.0",
    /// `rdma_listen`: listens on the bound port, on the bound device or, for a wildcard
    /// address, on every device: for connection requests (TCP port space) or SIDR requests
    /// (UDP port space); ENOSYS for the others.
    fn rdma_listen(id: *mut sys::rdma_cm_id, backlog: c_int) -> c_int {
        let _ = backlog;
        guard(-1, || {
            if !live(id) {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: a live id of ours.
            let udp = match unsafe { (*id).ps } {
                sys::RDMA_PS_TCP => false,
                sys::RDMA_PS_UDP => true,
                _ => {
                    say("rdma_listen: only the TCP and UDP port spaces are supported");
                    set_errno(libc::ENOSYS);
                    return -1;
                }
            };
            let mut r = reg();
            // SAFETY: a live id of ours.
            let Some(src) = (unsafe { state(id).src }) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            // SAFETY: as above.
            let ctx = unsafe { (*id).verbs } as usize;
            let ctxs = if ctx == 0 {
                contexts(&mut r)
            } else {
                vec![ctx]
            };
            let port = src.port();
            let mut done = Vec::new();
            for c in ctxs {
                let res = pump(&mut r, c).and_then(|d| {
                    if udp {
                        d.cm_listen(port, true)
                    } else {
                        d.cm_listen(port, false)
                    }
                    .map_err(|e| {
                        say(&format!("rdma_listen on port {port}: {e:#}"));
                        e.errno()
                    })
                });
                if let Err(e) = res {
                    for &c in &done {
                        if udp {
                            r.ud_listeners.remove(&(c, port));
                        } else {
                            r.listeners.remove(&(c, port));
                        }
                        if let Ok(d) = device_arc(c) {
                            let _ = if udp {
                                d.cm_unlisten(port, true)
                            } else {
                                d.cm_unlisten(port, false)
                            };
                        }
                    }
                    set_errno(e);
                    return -1;
                }
                if udp {
                    r.ud_listeners.insert((c, port), id as usize);
                } else {
                    r.listeners.insert((c, port), id as usize);
                }
                done.push(c);
            }
            // SAFETY: a live id of ours.
            unsafe { state(id).listening = done };
            0
        })
    }
);

// ---------------------------------------------------------------------------------------
// QPs
// ---------------------------------------------------------------------------------------

/// The attributes that bring the id's QP to `target` (INIT, RTR or RTS), and their mask, as
/// the kernel's `rdma_init_qp_attr` gives them (cma.c `cma_ib_init_qp_attr`, cm.c
/// `ib_cm_init_qp_attr`).
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn qp_attr(
    id: *mut sys::rdma_cm_id,
    target: sys::ibv_qp_state,
) -> Result<(sys::ibv_qp_attr, c_int), c_int> {
    // SAFETY: the caller's contract.
    let ud = unsafe { (*id).qp_type } == sys::IBV_QPT_UD;
    // SAFETY: the caller's contract.
    let st = unsafe { state(id) };
    let mut a = sys::ibv_qp_attr {
        qp_state: target,
        ..Default::default()
    };
    if ud {
        // A UD QP of the UDP port space (cma.c `cma_ib_init_qp_attr` for INIT, with the port
        // space's Q_Key; librdmacm's `ucma_init_ud_qp` moves on to RTR with the state alone
        // and to RTS with send PSN 0).
        let mask = match target {
            sys::IBV_QPS_INIT => {
                a.pkey_index = 0;
                a.port_num = 1;
                a.qkey = roce::ibcm::RDMA_UDP_QKEY.value();
                sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_QKEY
            }
            sys::IBV_QPS_RTR => sys::IBV_QP_STATE,
            sys::IBV_QPS_RTS => {
                a.sq_psn = 0;
                sys::IBV_QP_STATE | sys::IBV_QP_SQ_PSN
            }
            _ => return Err(libc::EINVAL),
        };
        return Ok((a, mask as c_int));
    }
    let mask = match target {
        sys::IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            a.qp_access_flags = sys::IBV_ACCESS_LOCAL_WRITE
                | sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_REMOTE_READ
                | sys::IBV_ACCESS_REMOTE_ATOMIC;
            sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS
        }
        sys::IBV_QPS_RTR => {
            let (Some(src), Some(dst), Some(_)) = (st.src, st.dst, st.comm) else {
                return Err(libc::EINVAL);
            };
            // SAFETY: the caller's contract.
            let ctx = unsafe { (*id).verbs } as usize;
            let gi = gid_index(ctx, src.ip()).ok_or(libc::EINVAL)?;
            a.path_mtu = st.path_mtu.max(sys::IBV_MTU_256);
            a.dest_qp_num = st.remote_qpn;
            // Each side's CM message carries the PSN its own receive queue expects (the
            // kernel's cm.c: the passive side sends from the REQ's starting PSN and receives
            // from the REP's; the active side the other way round).
            a.rq_psn = st.our_psn;
            a.max_dest_rd_atomic = st.responder_resources;
            a.min_rnr_timer = MIN_RNR_TIMER;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid.raw = Gid::from_ip(dst.ip()).0;
            a.ah_attr.grh.sgid_index = u8::try_from(gi).map_err(|_| libc::EINVAL)?;
            a.ah_attr.grh.hop_limit = 64;
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER
        }
        sys::IBV_QPS_RTS => {
            if st.comm.is_none() {
                return Err(libc::EINVAL);
            }
            a.sq_psn = st.remote_psn;
            a.timeout = LOCAL_ACK_TIMEOUT;
            a.retry_cnt = st.retry_count;
            a.rnr_retry = st.rnr_retry_count;
            a.max_rd_atomic = st.initiator_depth;
            sys::IBV_QP_STATE
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask as c_int))
}

/// Moves the id's QP (if it has one) to `target` with [`qp_attr`]'s attributes.
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn modify(id: *mut sys::rdma_cm_id, target: sys::ibv_qp_state) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return Ok(());
    }
    // SAFETY: as above.
    let (mut a, mask) = unsafe { qp_attr(id, target) }?;
    // SAFETY: `qp` is the id's live QP; `a` a local attribute struct.
    match unsafe { super::objects::ibv_modify_qp(qp, &raw mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP to the error state (a disconnect: its work requests are flushed).
///
/// # Safety
/// `id` must be a live id of ours.
unsafe fn qp_to_error(id: *mut sys::rdma_cm_id) {
    // SAFETY: the caller's contract.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return;
    }
    let mut a = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the id's live QP; a local attribute struct.
    let _ = unsafe { super::objects::ibv_modify_qp(qp, &raw mut a, sys::IBV_QP_STATE as c_int) };
}

export!(
    "RDMACM_1.2",
    /// `rdma_init_qp_attr`: the attributes for `qp_attr->qp_state` (INIT, RTR or RTS) of a
    /// QP the program made itself, from the connection's parameters.
    fn rdma_init_qp_attr(
        id: *mut sys::rdma_cm_id,
        qp_attr_out: *mut sys::ibv_qp_attr,
        qp_attr_mask: *mut c_int,
    ) -> c_int {
        guard(-1, || {
            if !live(id) || qp_attr_out.is_null() || qp_attr_mask.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: the caller's struct.
            let target = unsafe { (*qp_attr_out).qp_state };
            // SAFETY: a live id of ours.
            match unsafe { qp_attr(id, target) } {
                Ok((a, m)) => {
                    // SAFETY: the caller's out structs.
                    unsafe {
                        qp_attr_out.write(a);
                        qp_attr_mask.write(m);
                    }
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

/// `rdma_create_qp` for an `ibv_qp_init_attr`.
///
/// # Safety
/// `id` a live id of ours, `pd` NULL or a PD of its context, `attr` the caller's struct.
unsafe fn create_qp(
    id: *mut sys::rdma_cm_id,
    mut pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let ctx = unsafe { (*id).verbs };
    if ctx.is_null() || attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: as above.
    let mut a = unsafe { *attr };
    // librdmacm's `ucma_create_cqs`: without CQs the QP gets its own, each with a completion
    // channel (`id->send_cq_channel`, `id->recv_cq_channel`, the id as the CQs' context), as
    // the helpers of rdma_verbs.h (`rdma_get_send_comp`, `rdma_get_recv_comp`) expect.
    let own_cqs = a.send_cq.is_null() && a.recv_cq.is_null();
    if own_cqs {
        // SAFETY: a live context of ours and the id it is for.
        unsafe { make_cqs(id, ctx, &mut a)? };
    } else if a.send_cq.is_null() || a.recv_cq.is_null() {
        say("rdma_create_qp: give the QP both of its CQs, or neither");
        return Err(libc::EINVAL);
    }
    if pd.is_null() {
        let mut r = reg();
        let p = match r.pds.get(&(ctx as usize)) {
            Some(&p) => p,
            None => {
                // SAFETY: a live context of ours.
                let p = unsafe { super::objects::ibv_alloc_pd(ctx) };
                if p.is_null() {
                    return Err(libc::ENOMEM);
                }
                r.pds.insert(ctx as usize, p as usize);
                p as usize
            }
        };
        pd = p as *mut sys::ibv_pd;
    }
    // SAFETY: a PD of ours and the attributes (the caller's, with our CQs).
    let qp = unsafe { super::objects::ibv_create_qp(pd, &raw mut a) };
    if qp.is_null() {
        // SAFETY: errno as ibv_create_qp left it.
        let e = unsafe { *libc::__errno_location() };
        if own_cqs {
            // SAFETY: the CQs just made for this id.
            unsafe { free_cqs(id) };
        }
        return Err(e);
    }
    // SAFETY: the caller's attributes get the capacities, as from ibv_create_qp.
    unsafe { (*attr).cap = a.cap };
    // SAFETY: a live id of ours.
    unsafe { state(id).own_cqs = own_cqs };
    // SAFETY: the caller's contract.
    unsafe {
        (*id).qp = qp;
        (*id).pd = pd;
        (*id).send_cq = a.send_cq;
        (*id).recv_cq = a.recv_cq;
        (*id).srq = a.srq;
        (*id).qp_type = a.qp_type;
    }
    // librdmacm's `ucma_init_conn_qp`: the QP goes to INIT at once so receives can be posted;
    // a UD QP (`ucma_init_ud_qp`) on to RTS, ready to send once the peer is resolved.
    let targets: &[sys::ibv_qp_state] = if a.qp_type == sys::IBV_QPT_UD {
        &[sys::IBV_QPS_INIT, sys::IBV_QPS_RTR, sys::IBV_QPS_RTS]
    } else {
        &[sys::IBV_QPS_INIT]
    };
    // SAFETY: the caller's contract.
    if let Err(e) = targets.iter().try_for_each(|&t| unsafe { modify(id, t) }) {
        // SAFETY: the QP (and CQs) we just made.
        unsafe {
            super::objects::ibv_destroy_qp(qp);
            (*id).qp = ptr::null_mut();
            free_cqs(id);
        }
        return Err(e);
    }
    Ok(())
}

/// Makes the send and receive CQs of the id's QP, each with its completion channel, sized
/// for `a`'s work requests, and puts them in `a` and the id.
///
/// # Safety
/// `id` must be a live id of ours on context `ctx`.
unsafe fn make_cqs(
    id: *mut sys::rdma_cm_id,
    ctx: *mut sys::ibv_context,
    a: &mut sys::ibv_qp_init_attr,
) -> Result<(), c_int> {
    for (wrs, send) in [(a.cap.max_recv_wr, false), (a.cap.max_send_wr, true)] {
        // SAFETY: a live context of ours.
        let ch = unsafe { super::objects::ibv_create_comp_channel(ctx) };
        let cq = if ch.is_null() {
            ptr::null_mut()
        } else {
            let cqe = c_int::try_from(wrs.max(1)).unwrap_or(c_int::MAX);
            // SAFETY: as above; the id is the CQ's context, as librdmacm makes it.
            unsafe { super::objects::ibv_create_cq(ctx, cqe, id.cast(), ch, 0) }
        };
        // SAFETY: the caller's contract; the fields take what was made (or NULL).
        unsafe {
            if send {
                (*id).send_cq_channel = ch;
                (*id).send_cq = cq;
            } else {
                (*id).recv_cq_channel = ch;
                (*id).recv_cq = cq;
            }
        }
        if cq.is_null() {
            // SAFETY: errno as the failed call left it; then what was made is freed.
            let e = unsafe { *libc::__errno_location() };
            // SAFETY: as above.
            unsafe { free_cqs(id) };
            return Err(if e == 0 { libc::ENOMEM } else { e });
        }
        if send {
            a.send_cq = cq;
        } else {
            a.recv_cq = cq;
        }
    }
    Ok(())
}

/// Destroys the CQs and completion channels [`make_cqs`] made for the id (those still set).
///
/// # Safety
/// `id` must be a live id of ours whose QP is gone.
unsafe fn free_cqs(id: *mut sys::rdma_cm_id) {
    // SAFETY: the caller's contract: these are ours, made by `make_cqs`.
    unsafe {
        for cq in [&raw mut (*id).send_cq, &raw mut (*id).recv_cq] {
            if !(*cq).is_null() {
                super::objects::ibv_destroy_cq(*cq);
                *cq = ptr::null_mut();
            }
        }
        for ch in [
            &raw mut (*id).send_cq_channel,
            &raw mut (*id).recv_cq_channel,
        ] {
            if !(*ch).is_null() {
                super::objects::ibv_destroy_comp_channel(*ch);
                *ch = ptr::null_mut();
            }
        }
    }
}

export!(
    "RDMACM_1.0",
    /// `rdma_create_qp`: an RC QP on the id's device (on a PD of the library's when `pd` is
    /// NULL), brought to INIT so that receives can be posted. Without CQs in the attributes it
    /// gets its own, with completion channels, as librdmacm's `ucma_create_cqs` makes them.
    fn rdma_create_qp(
        id: *mut sys::rdma_cm_id,
        pd: *mut sys::ibv_pd,
        qp_init_attr: *mut sys::ibv_qp_init_attr,
    ) -> c_int {
        guard(-1, || {
            if !live(id) {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: a live id, NULL or a PD of ours, the caller's attributes.
            match unsafe { create_qp(id, pd, qp_init_attr) } {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_create_qp_ex`: `rdma_create_qp` from an `ibv_qp_init_attr_ex` (its PD, CQs,
    /// capacities and type; the extended fields beyond them are EOPNOTSUPP).
    fn rdma_create_qp_ex(id: *mut sys::rdma_cm_id, attr: *mut sys::ibv_qp_init_attr_ex) -> c_int {
        guard(-1, || {
            if !live(id) || attr.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: the caller's struct.
            let x = unsafe { &mut *attr };
            if x.comp_mask & !sys::IBV_QP_INIT_ATTR_PD != 0 {
                say("rdma_create_qp_ex: only the PD of the extended attributes is supported");
                set_errno(libc::EOPNOTSUPP);
                return -1;
            }
            let pd = if x.comp_mask & sys::IBV_QP_INIT_ATTR_PD != 0 {
                x.pd
            } else {
                ptr::null_mut()
            };
            let mut a = sys::ibv_qp_init_attr {
                qp_context: x.qp_context,
                send_cq: x.send_cq,
                recv_cq: x.recv_cq,
                srq: x.srq,
                cap: x.cap,
                qp_type: x.qp_type,
                sq_sig_all: x.sq_sig_all,
            };
            // SAFETY: a live id, the caller's PD or NULL, a local attribute struct.
            match unsafe { create_qp(id, pd, &raw mut a) } {
                Ok(()) => {
                    x.cap = a.cap;
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_destroy_qp`: destroys the QP `rdma_create_qp` made.
    fn rdma_destroy_qp(id: *mut sys::rdma_cm_id) -> () {
        guard((), || {
            if !live(id) {
                return;
            }
            // SAFETY: a live id of ours; its QP is ours, and so are its CQs when
            // `rdma_create_qp` made them.
            unsafe {
                let qp = (*id).qp;
                if !qp.is_null() {
                    super::objects::ibv_destroy_qp(qp);
                    (*id).qp = ptr::null_mut();
                }
                if std::mem::take(&mut state(id).own_cqs) {
                    free_cqs(id);
                }
            }
        });
    }
);

// ---------------------------------------------------------------------------------------
// Connecting
// ---------------------------------------------------------------------------------------

/// The conn_param values a program passes (`RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` and
/// larger are clamped to what our QPs take, as librdmacm clamps them to the device's).
///
/// # Safety
/// `p` must be NULL or the caller's `rdma_conn_param`.
unsafe fn conn_param<'a>(p: *const sys::rdma_conn_param) -> Option<&'a sys::rdma_conn_param> {
    // SAFETY: the caller's contract.
    unsafe { p.as_ref() }
}

/// RDMA READs and atomics in flight each way that a QP of ours takes: the device's
/// `max_qp_rd_atom` (and `max_qp_init_rd_atom`), as `ibv_query_device` reports it for the
/// devices the library opens.
fn max_rd_atomic() -> u8 {
    roce::transport::DeviceConfig::default().max_qp_rd_atom
}

/// The private data a `rdma_conn_param` carries.
///
/// # Safety
/// As for [`conn_param`].
unsafe fn private_data(p: Option<&sys::rdma_conn_param>) -> Vec<u8> {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the caller's buffer of `private_data_len` bytes.
            unsafe {
                core::slice::from_raw_parts(
                    p.private_data.cast::<u8>(),
                    usize::from(p.private_data_len),
                )
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

export!(
    "RDMACM_1.0",
    /// `rdma_connect`: sends the REQ (RDMA CM IP header, the program's private data) for the
    /// id's QP, or `conn_param->qp_num` without one. The REP moves the QP to RTR and RTS and
    /// sends the RTU (ESTABLISHED); without a QP the program gets CONNECT_RESPONSE and calls
    /// `rdma_establish`.
    fn rdma_connect(id: *mut sys::rdma_cm_id, conn_param_in: *mut sys::rdma_conn_param) -> c_int {
        guard(-1, || {
            let rc = (|| {
                if !live(id) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                // SAFETY: NULL or the caller's struct.
                let p = unsafe { conn_param(conn_param_in) };
                let mut r = reg();
                // SAFETY: a live id of ours.
                let (ctx, qp) = unsafe { ((*id).verbs as usize, (*id).qp) };
                // SAFETY: as above.
                let mut st = unsafe { state(id) };
                let (Some(src), Some(dst), true) = (st.src, st.dst, ctx != 0) else {
                    set_errno(libc::EINVAL);
                    return -1;
                };
                let qpn = if qp.is_null() {
                    p.map_or(0, |p| p.qp_num)
                } else {
                    // SAFETY: the id's live QP.
                    unsafe { (*qp).qp_num }
                };
                let dev = match pump(&mut r, ctx) {
                    Ok(d) => d,
                    Err(e) => {
                        set_errno(e);
                        return -1;
                    }
                };
                // SAFETY: a live id of ours.
                if unsafe { (*id).ps } == sys::RDMA_PS_UDP {
                    // SIDR (cma.c `cma_resolve_ib_udp`): ESTABLISHED with the peer's UD QP and
                    // Q_Key follows its SIDR_REP.
                    // SAFETY: as for `conn_param`.
                    let data = unsafe { private_data(p) };
                    return match dev.cm_sidr_request(dst.ip(), dst.port(), src.port(), &data) {
                        Ok(comm) => {
                            st.comm = Some(comm);
                            st.active = true;
                            st.sidr = true;
                            r.sidrs.insert((ctx, comm), id as usize);
                            0
                        }
                        Err(e) => {
                            say(&format!("rdma_connect (SIDR) to {dst}: {e:#}"));
                            set_errno(e.errno());
                            -1
                        }
                    };
                }
                let psn = random_psn();
                let mut c = CmConnect::new(
                    dst.ip(),
                    dst.port(),
                    src.port(),
                    Qpn::new(qpn),
                    Psn::new(psn),
                );
                if let Some(p) = p {
                    c.responder_resources = p.responder_resources.min(max_rd_atomic());
                    c.initiator_depth = p.initiator_depth.min(max_rd_atomic());
                    c.retry_count = p.retry_count.min(7);
                    c.rnr_retry_count = p.rnr_retry_count.min(7);
                    c.srq = p.srq != 0;
                }
                // SAFETY: as for `conn_param`.
                c.private_data = unsafe { private_data(p) };
                match dev.cm_connect(&c) {
                    Ok(comm) => {
                        st.comm = Some(comm);
                        st.active = true;
                        st.our_psn = psn;
                        st.responder_resources = c.responder_resources;
                        st.initiator_depth = c.initiator_depth;
                        st.retry_count = c.retry_count;
                        r.conns.insert((ctx, comm), id as usize);
                        0
                    }
                    Err(e) => {
                        say(&format!("rdma_connect to {dst}: {e:#}"));
                        set_errno(e.errno());
                        -1
                    }
                }
            })();
            if rc == 0 && live(id) {
                // SAFETY: a live id of ours (checked again: the call may have destroyed it).
                unsafe { sync_complete(id) }
            } else {
                rc
            }
        })
    }
);

export!(
    "RDMACM_1.2",
    /// `rdma_establish`: after CONNECT_RESPONSE on an id without a librdmacm QP (the program
    /// moved its own QP to RTS with `rdma_init_qp_attr`), sends the RTU.
    fn rdma_establish(id: *mut sys::rdma_cm_id) -> c_int {
        guard(-1, || {
            if !live(id) {
                set_errno(libc::EINVAL);
                return -1;
            }
            let _r = reg();
            // SAFETY: a live id of ours.
            let ctx = unsafe { (*id).verbs } as usize;
            // SAFETY: as above.
            let mut st = unsafe { state(id) };
            let (Some(comm), true) = (st.comm, st.rep_pending) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            let res = device_arc(ctx).and_then(|d| d.cm_ready(comm, &[]).map_err(|e| e.errno()));
            match res {
                Ok(()) => {
                    st.rep_pending = false;
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_accept`: on a CONNECT_REQUEST's id, moves its QP to RTR and RTS from the REQ
    /// and sends the REP; ESTABLISHED follows the peer's RTU.
    fn rdma_accept(id: *mut sys::rdma_cm_id, conn_param_in: *mut sys::rdma_conn_param) -> c_int {
        guard(-1, || {
            let rc = (|| {
                if !live(id) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                // SAFETY: NULL or the caller's struct.
                let p = unsafe { conn_param(conn_param_in) };
                let mut r = reg();
                // SAFETY: a live id of ours.
                let (ctx, qp) = unsafe { ((*id).verbs as usize, (*id).qp) };
                // SAFETY: as above.
                if let (Some(comm), true, false) = unsafe {
                    let st = state(id);
                    (st.comm, st.sidr, st.active)
                } {
                    // A SIDR request (cma.c `cma_send_sidr_rep`): our UD QP and the port space's
                    // Q_Key.
                    let qpn = if qp.is_null() {
                        p.map_or(0, |p| p.qp_num)
                    } else {
                        // SAFETY: the id's live QP.
                        unsafe { (*qp).qp_num }
                    };
                    // SAFETY: as for `conn_param`.
                    let data = unsafe { private_data(p) };
                    r.sidrs.remove(&(ctx, comm));
                    return match device_arc(ctx).and_then(|d| {
                        d.cm_sidr_reply(
                            comm,
                            roce::api::SidrStatus::SUCCESS,
                            Qpn::new(qpn),
                            roce::ibcm::RDMA_UDP_QKEY,
                            &data,
                        )
                        .map_err(|e| {
                            say(&format!("rdma_accept (SIDR): {e:#}"));
                            e.errno()
                        })
                    }) {
                        Ok(()) => 0,
                        Err(e) => {
                            set_errno(e);
                            -1
                        }
                    };
                }
                let comm = {
                    // SAFETY: as above.
                    let mut st = unsafe { state(id) };
                    let (Some(comm), false) = (st.comm, st.active) else {
                        set_errno(libc::EINVAL);
                        return -1;
                    };
                    if let Some(p) = p {
                        // The REQ's offer bounds what we take (IBTA 12.7.29).
                        if p.responder_resources != u8::MAX {
                            st.responder_resources =
                                st.responder_resources.min(p.responder_resources);
                        }
                        if p.initiator_depth != u8::MAX {
                            st.initiator_depth = st.initiator_depth.min(p.initiator_depth);
                        }
                    }
                    st.our_psn = random_psn();
                    if st.multipath_hint && !qp.is_null() {
                        // The peer's QP allows the multipath extension: ours (if it does, with
                        // ROCE_MULTIPATH) starts with it on; the REP hints back.
                        // SAFETY: the id's live QP.
                        let qpn = Qpn::new(unsafe { (*qp).qp_num });
                        if let Err(e) = device_arc(ctx)
                            .and_then(|d| d.cm_multipath_peer(qpn).map_err(|e| e.errno()))
                        {
                            say(&format!(
                                "rdma_accept: multipath hint not taken (errno {e})"
                            ));
                        }
                    }
                    comm
                };
                // SAFETY: a live id of ours.
                if let Err(e) = unsafe { modify(id, sys::IBV_QPS_RTR) }
                    // SAFETY: as above.
                    .and_then(|()| unsafe { modify(id, sys::IBV_QPS_RTS) })
                {
                    say("rdma_accept: the QP did not take the connection's attributes");
                    set_errno(e);
                    return -1;
                }
                let qpn = if qp.is_null() {
                    p.map_or(0, |p| p.qp_num)
                } else {
                    // SAFETY: the id's live QP.
                    unsafe { (*qp).qp_num }
                };
                // SAFETY: a live id of ours.
                let st = unsafe { state(id) };
                let mut a = CmAccept::new(Qpn::new(qpn), Psn::new(st.our_psn));
                a.responder_resources = st.responder_resources;
                a.initiator_depth = st.initiator_depth;
                if let Some(p) = p {
                    a.rnr_retry_count = p.rnr_retry_count.min(7);
                    a.srq = p.srq != 0;
                }
                // SAFETY: as for `conn_param`.
                a.private_data = unsafe { private_data(p) };
                drop(st);
                drop(r);
                match device_arc(ctx).and_then(|d| d.cm_accept(comm, &a).map_err(|e| e.errno())) {
                    Ok(()) => 0,
                    Err(e) => {
                        set_errno(e);
                        -1
                    }
                }
            })();
            if rc == 0 && live(id) {
                // SAFETY: a live id of ours (checked again: the call may have destroyed it).
                unsafe { sync_complete(id) }
            } else {
                rc
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_reject`: answers a CONNECT_REQUEST (or a CONNECT_RESPONSE) with a REJ
    /// "consumer reject" carrying the private data.
    fn rdma_reject(id: *mut sys::rdma_cm_id, data: *const c_void, len: u8) -> c_int {
        guard(-1, || {
            if !live(id) || (data.is_null() && len > 0) {
                set_errno(libc::EINVAL);
                return -1;
            }
            let pd = if len == 0 {
                Vec::new()
            } else {
                // SAFETY: the caller's buffer of `len` bytes.
                unsafe { core::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
            };
            let mut r = reg();
            // SAFETY: a live id of ours.
            let ctx = unsafe { (*id).verbs } as usize;
            // SAFETY: as above.
            let Some(comm) = (unsafe { state(id).comm }) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            // SAFETY: as above.
            if unsafe { state(id).sidr } {
                // A SIDR request: a SIDR_REP with status "rejected" (cma.c `rdma_reject`).
                if r.sidrs.remove(&(ctx, comm)).is_none() {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                return match device_arc(ctx).and_then(|d| {
                    d.cm_sidr_reply(
                        comm,
                        roce::api::SidrStatus::REJECT,
                        Qpn::new(0),
                        roce::transport::QKey::new(0),
                        &pd,
                    )
                    .map_err(|e| e.errno())
                }) {
                    Ok(()) => 0,
                    Err(e) => {
                        set_errno(e);
                        -1
                    }
                };
            }
            r.conns.remove(&(ctx, comm));
            match device_arc(ctx).and_then(|d| d.cm_reject(comm, &pd).map_err(|e| e.errno())) {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_disconnect`: moves the QP to the error state and sends a DREQ; DISCONNECTED
    /// follows the DREP (or the DREQ's timeout). On a connection the peer disconnected
    /// already it only moves the QP, as the kernel answers with the DREP it sent.
    fn rdma_disconnect(id: *mut sys::rdma_cm_id) -> c_int {
        guard(-1, || {
            let rc = (|| {
                if !live(id) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let _r = reg();
                // SAFETY: a live id of ours.
                unsafe { qp_to_error(id) };
                // SAFETY: as above.
                let ctx = unsafe { (*id).verbs } as usize;
                // SAFETY: as above.
                let Some(comm) = (unsafe { state(id).comm }) else {
                    set_errno(libc::EINVAL);
                    return -1;
                };
                let Ok(d) = device_arc(ctx) else {
                    set_errno(libc::EINVAL);
                    return -1;
                };
                if d.cm_state(comm) == Some(CmState::Established)
                    && let Err(e) = d.cm_disconnect(comm, &[])
                {
                    set_errno(e.errno());
                    return -1;
                }
                0
            })();
            if rc == 0 && live(id) {
                // SAFETY: a live id of ours (checked again: the call may have destroyed it).
                unsafe { sync_complete(id) }
            } else {
                rc
            }
        })
    }
);

// ---------------------------------------------------------------------------------------
// The event thread
// ---------------------------------------------------------------------------------------

/// Acts on one CM event of context `ctx` as cma.c's `cma_ib_handler` and librdmacm's
/// `ucma_process_conn_resp` do, and queues the RDMA CM event for its id. Runs with the
/// registry locked, so no id it finds is destroyed under it. The QP is touched only on a REP
/// (RTR and RTS before the RTU, while the connect is pending and the QP must exist): after a
/// disconnect or a reject the program may have destroyed it with `ibv_destroy_qp` behind
/// `id->qp` (rping does), so, as in librdmacm, only `rdma_disconnect` moves it to ERR.
fn dispatch(r: &mut Registry, ctx: usize, dev: &dyn CmDevice, ev: CmEvent) {
    let conn = |r: &Registry, c: CommId| r.conns.get(&(ctx, c)).map(|&i| i as *mut sys::rdma_cm_id);
    match ev {
        CmEvent::ConnectRequest {
            id: comm,
            from,
            req,
        } => {
            let port = req.service_id.port();
            let Some(&listener) = r.listeners.get(&(ctx, port)) else {
                let _ = dev.cm_reject(comm, &[]);
                return;
            };
            let listener = listener as *mut sys::rdma_cm_id;
            let Ok(h) = CmaHdr::parse(&req.private_data) else {
                let _ = dev.cm_reject(comm, &[]);
                return;
            };
            let _ = from;
            // SAFETY: a listening id in the registry is live.
            let (channel, context) = unsafe { ((*listener).channel, (*listener).context) };
            let child = new_id(channel, context, sys::RDMA_PS_TCP, sys::IBV_QPT_RC);
            let src = SocketAddr::new(h.dst, port);
            let dst = SocketAddr::new(h.src, h.src_port);
            // SAFETY: `c` is the port's active MTU limit; contexts are never closed.
            let local_mtu =
                unsafe { ctx_of(ctx as *mut sys::ibv_context) }.map_or(sys::IBV_MTU_1024, |c| {
                    mtu_code(
                        c.verbs
                            .port
                            .info
                            .max_path_mtu(h.dst.is_ipv6())
                            .min(dev.max_path_mtu(h.dst.is_ipv6())),
                    )
                });
            // SAFETY: the id we just made.
            unsafe {
                (*child).verbs = ctx as *mut sys::ibv_context;
                (*child).port_num = 1;
                set_route_addr(child, src, false);
                set_route_addr(child, dst, true);
                set_path_rec(child, h.dst, h.src, local_mtu);
                let mut st = state(child);
                st.src = Some(src);
                st.dst = Some(dst);
                st.comm = Some(comm);
                st.remote_qpn = req.local_qpn.value();
                st.remote_psn = req.starting_psn.value();
                // The CM's parameters from our side (cm.c `cm_format_req_event`), within what
                // the device takes, as librdmacm bounds them by the device's limits for an
                // `rdma_accept` without parameters (`ucma_process_conn_req`): a kernel peer
                // offers up to its own device's (rxe: 128).
                st.responder_resources = req.initiator_depth.min(max_rd_atomic());
                st.initiator_depth = req.responder_resources.min(max_rd_atomic());
                st.retry_count = req.retry_count;
                st.rnr_retry_count = req.rnr_retry_count;
                st.path_mtu = u32::from(req.path_mtu.code()).min(local_mtu);
                st.multipath_hint = req.multipath_hint;
            }
            r.conns.insert((ctx, comm), child as usize);
            let info = ConnInfo {
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: u8::from(req.e2e_flow_control),
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: u8::from(req.srq),
                qp_num: req.local_qpn.value(),
                ud: None,
            };
            let data = req
                .private_data
                .get(CMA_HDR_LEN..)
                .unwrap_or_default()
                .to_vec();
            // SAFETY: the new id, live.
            unsafe {
                post_event(
                    child,
                    listener,
                    sys::RDMA_CM_EVENT_CONNECT_REQUEST,
                    0,
                    info,
                    data,
                );
            }
        }
        CmEvent::Reply { id: comm, rep } => {
            let Some(id) = conn(r, comm) else {
                let _ = dev.cm_reject(comm, &[]);
                return;
            };
            // SAFETY: ids in the registry are live.
            let qp = unsafe { (*id).qp };
            {
                // SAFETY: as above.
                let mut st = unsafe { state(id) };
                st.remote_qpn = rep.local_qpn.value();
                st.remote_psn = rep.starting_psn.value();
                // The peer's answer bounds ours (IBTA 12.7.29).
                st.responder_resources = st.responder_resources.min(rep.initiator_depth);
                st.initiator_depth = st.initiator_depth.min(rep.responder_resources);
                st.rnr_retry_count = rep.rnr_retry_count;
                st.est_data = rep.private_data.clone();
            }
            let info = ConnInfo {
                responder_resources: rep.initiator_depth,
                initiator_depth: rep.responder_resources,
                flow_control: u8::from(rep.e2e_flow_control),
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                srq: u8::from(rep.srq),
                qp_num: rep.local_qpn.value(),
                ud: None,
            };
            if qp.is_null() {
                // SAFETY: as above.
                unsafe {
                    state(id).rep_pending = true;
                    post_event(
                        id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_CONNECT_RESPONSE,
                        0,
                        info,
                        rep.private_data.clone(),
                    );
                }
                return;
            }
            // SAFETY: as above.
            let moved = unsafe { modify(id, sys::IBV_QPS_RTR) }
                // SAFETY: as above.
                .and_then(|()| unsafe { modify(id, sys::IBV_QPS_RTS) });
            match moved.and_then(|()| dev.cm_ready(comm, &[]).map_err(|e| e.errno())) {
                Ok(()) => {}
                Err(e) => {
                    say("the QP did not take the connection's attributes; rejecting the REP");
                    let _ = dev.cm_reject(comm, &[]);
                    r.conns.remove(&(ctx, comm));
                    // SAFETY: as above.
                    unsafe {
                        post_event(
                            id,
                            ptr::null_mut(),
                            sys::RDMA_CM_EVENT_CONNECT_ERROR,
                            -e,
                            ConnInfo::default(),
                            Vec::new(),
                        );
                    }
                }
            }
        }
        CmEvent::Established { id: comm } => {
            if let Some(id) = conn(r, comm) {
                // SAFETY: ids in the registry are live.
                unsafe {
                    let data = core::mem::take(&mut state(id).est_data);
                    post_event(
                        id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_ESTABLISHED,
                        0,
                        ConnInfo::default(),
                        data,
                    );
                }
            }
        }
        CmEvent::Rejected {
            id: comm,
            reason,
            private_data,
            ..
        } => {
            if let Some(id) = r.conns.remove(&(ctx, comm)) {
                let id = id as *mut sys::rdma_cm_id;
                // SAFETY: ids in the registry are live.
                unsafe {
                    post_event(
                        id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_REJECTED,
                        c_int::from(reason.0),
                        ConnInfo::default(),
                        private_data,
                    );
                }
            }
        }
        CmEvent::TimedOut { id: comm } => {
            if let Some(id) = r.conns.remove(&(ctx, comm)) {
                let id = id as *mut sys::rdma_cm_id;
                // SAFETY: ids in the registry are live.
                unsafe {
                    let kind = if state(id).active {
                        sys::RDMA_CM_EVENT_UNREACHABLE
                    } else {
                        sys::RDMA_CM_EVENT_CONNECT_ERROR
                    };
                    post_event(
                        id,
                        ptr::null_mut(),
                        kind,
                        -libc::ETIMEDOUT,
                        ConnInfo::default(),
                        Vec::new(),
                    );
                }
            }
        }
        CmEvent::Disconnected {
            id: comm,
            private_data,
        } => {
            if let Some(id) = conn(r, comm) {
                // SAFETY: ids in the registry are live.
                unsafe {
                    post_event(
                        id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_DISCONNECTED,
                        0,
                        ConnInfo::default(),
                        private_data,
                    );
                }
            }
        }
        CmEvent::TimeWaitExit { id: comm } => {
            if let Some(id) = r.conns.remove(&(ctx, comm)) {
                // SAFETY: ids in the registry are live.
                unsafe {
                    post_event(
                        id as *mut sys::rdma_cm_id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_TIMEWAIT_EXIT,
                        0,
                        ConnInfo::default(),
                        Vec::new(),
                    );
                }
            }
        }
        CmEvent::SidrRequest { id: comm, req, .. } => sidr_request(r, ctx, dev, comm, &req),
        CmEvent::SidrReply { id: comm, rep } => {
            let Some(id) = r.sidrs.remove(&(ctx, comm)) else {
                return;
            };
            let id = id as *mut sys::rdma_cm_id;
            // SAFETY: ids in the registry are live.
            let (src, dst) = unsafe {
                let st = state(id);
                (st.src, st.dst)
            };
            // As cma.c `cma_sidr_rep_handler`: a refusal is UNREACHABLE with the SIDR status,
            // a Q_Key other than the port space's is ADDR_ERROR (`cma_set_qkey`), else
            // ESTABLISHED with the address handle of the path, the QPN and the Q_Key.
            let (kind, status, ud) = if rep.status != roce::api::SidrStatus::SUCCESS {
                (
                    sys::RDMA_CM_EVENT_UNREACHABLE,
                    c_int::from(rep.status.0),
                    None,
                )
            } else if rep.qkey != roce::ibcm::RDMA_UDP_QKEY {
                say(&format!(
                    "SIDR_REP with Q_Key {:#x}, not RDMA CM's {:#x}",
                    rep.qkey.value(),
                    roce::ibcm::RDMA_UDP_QKEY.value()
                ));
                (sys::RDMA_CM_EVENT_ADDR_ERROR, -libc::EINVAL, None)
            } else {
                match src
                    .zip(dst)
                    .and_then(|(s, d)| ud_ah_attr(ctx, s.ip(), d.ip()))
                {
                    Some(ah_attr) => (
                        sys::RDMA_CM_EVENT_ESTABLISHED,
                        0,
                        Some(UdInfo {
                            ah_attr,
                            qp_num: rep.qpn.value(),
                            qkey: rep.qkey.value(),
                        }),
                    ),
                    None => (sys::RDMA_CM_EVENT_ADDR_ERROR, -libc::EINVAL, None),
                }
            };
            // SAFETY: as above.
            unsafe {
                post_event(
                    id,
                    ptr::null_mut(),
                    kind,
                    status,
                    ConnInfo {
                        ud,
                        ..ConnInfo::default()
                    },
                    rep.private_data,
                );
            }
        }
        CmEvent::SidrTimedOut { id: comm } => {
            if let Some(id) = r.sidrs.remove(&(ctx, comm)) {
                // SAFETY: ids in the registry are live.
                unsafe {
                    post_event(
                        id as *mut sys::rdma_cm_id,
                        ptr::null_mut(),
                        sys::RDMA_CM_EVENT_UNREACHABLE,
                        -libc::ETIMEDOUT,
                        ConnInfo::default(),
                        Vec::new(),
                    );
                }
            }
        }
    }
}

/// The address handle attributes of the path from our `src` (its GID index on `ctx`) to
/// `dst` on RoCE: global, the peer's GID, hop limit 64 (what the kernel's
/// `ib_init_ah_attr_from_path` gives for a RoCE path record).
fn ud_ah_attr(ctx: usize, src: IpAddr, dst: IpAddr) -> Option<sys::ibv_ah_attr> {
    let gi = u8::try_from(gid_index(ctx, src)?).ok()?;
    let mut a = sys::ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid.raw = Gid::from_ip(dst).0;
    a.grh.sgid_index = gi;
    a.grh.hop_limit = 64;
    Some(a)
}

/// A peer's SIDR_REQ (cma.c `cma_ib_req_handler` for a UD id): a new UDP id under the
/// listener of its port with a CONNECT_REQUEST whose `param.ud` holds the path back to the
/// requester; `rdma_accept` or `rdma_reject` answers it. A port nobody listens on through
/// this library, or a request without the RDMA CM IP header, is refused ("unsupported").
fn sidr_request(
    r: &mut Registry,
    ctx: usize,
    dev: &dyn CmDevice,
    comm: CommId,
    req: &roce::ibcm::mad::SidrReq,
) {
    let port = req.service_id.port();
    let refuse = || {
        let _ = dev.cm_sidr_reply(
            comm,
            roce::api::SidrStatus::UNSUPPORTED,
            Qpn::new(0),
            roce::transport::QKey::new(0),
            &[],
        );
    };
    let (Some(&listener), Ok(h)) = (
        r.ud_listeners.get(&(ctx, port)),
        CmaHdr::parse(&req.private_data),
    ) else {
        refuse();
        return;
    };
    let listener = listener as *mut sys::rdma_cm_id;
    let Some(ah_attr) = ud_ah_attr(ctx, h.dst, h.src) else {
        refuse();
        return;
    };
    // SAFETY: a listening id in the registry is live.
    let (channel, context) = unsafe { ((*listener).channel, (*listener).context) };
    let child = new_id(channel, context, sys::RDMA_PS_UDP, sys::IBV_QPT_UD);
    let src = SocketAddr::new(h.dst, port);
    let dst = SocketAddr::new(h.src, h.src_port);
    // SAFETY: the id we just made.
    unsafe {
        (*child).verbs = ctx as *mut sys::ibv_context;
        (*child).port_num = 1;
        set_route_addr(child, src, false);
        set_route_addr(child, dst, true);
        set_path_rec(child, h.dst, h.src, sys::IBV_MTU_1024);
        let mut st = state(child);
        st.src = Some(src);
        st.dst = Some(dst);
        st.comm = Some(comm);
        st.sidr = true;
    }
    r.sidrs.insert((ctx, comm), child as usize);
    let data = req
        .private_data
        .get(CMA_HDR_LEN..)
        .unwrap_or_default()
        .to_vec();
    let info = ConnInfo {
        ud: Some(UdInfo {
            ah_attr,
            qp_num: 0,
            qkey: 0,
        }),
        ..ConnInfo::default()
    };
    // SAFETY: the new id, live.
    unsafe {
        post_event(
            child,
            listener,
            sys::RDMA_CM_EVENT_CONNECT_REQUEST,
            0,
            info,
            data,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Addresses, options, devices
export!(
    "RDMACM_1.0",
    /// `rdma_create_ep`: an id in synchronous mode for `res` (librdmacm's convenience call,
    /// as rdma_server and rdma_client use it). Passive (`RAI_PASSIVE`): bound to the source
    /// address, with `pd` and `qp_init_attr` kept for the ids [`rdma_get_request`] hands out.
    /// Active: the address and route resolved (waiting for each), and a QP made when
    /// `qp_init_attr` is given. On failure nothing is left and errno says why.
    fn rdma_create_ep(
        id: *mut *mut sys::rdma_cm_id,
        res: *mut sys::rdma_addrinfo,
        pd: *mut sys::ibv_pd,
        qp_init_attr: *mut sys::ibv_qp_init_attr,
    ) -> c_int {
        guard(-1, || {
            if id.is_null() || res.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: the caller's rdma_addrinfo.
            let r = unsafe { &*res };
            let ps = match u32::try_from(r.ai_port_space) {
                Ok(0) | Err(_) => sys::RDMA_PS_TCP,
                Ok(p) => p,
            };
            let mut made = ptr::null_mut();
            // SAFETY: a local out pointer; NULL channel: synchronous mode.
            if unsafe { rdma_create_id(ptr::null_mut(), &raw mut made, ptr::null_mut(), ps) } != 0 {
                return -1;
            }
            let fail = |made: *mut sys::rdma_cm_id| {
                // SAFETY: errno of the failed step survives the cleanup.
                let e = unsafe { *libc::__errno_location() };
                // SAFETY: the id made above, with whatever QP it got.
                unsafe {
                    rdma_destroy_qp(made);
                    rdma_destroy_id(made);
                }
                set_errno(e);
                -1
            };
            if !qp_init_attr.is_null() {
                // As librdmacm's `rdma_create_ep`: the QP's type is the id's (its port space's).
                // SAFETY: the caller's attributes and the id just made.
                unsafe { (*qp_init_attr).qp_type = (*made).qp_type };
            }
            let passive = r.ai_flags & sys::RAI_PASSIVE as c_int != 0;
            let ok = if passive {
                // SAFETY: the id just made; the caller's source address (or NULL).
                let bound = r.ai_src_addr.is_null()
                    || unsafe { rdma_bind_addr(made, r.ai_src_addr.cast()) } == 0;
                if bound && !qp_init_attr.is_null() {
                    // SAFETY: as above; the caller's attributes, copied.
                    unsafe { state(made).ep_qp = Some((pd as usize, *qp_init_attr)) };
                }
                bound
            } else {
                // SAFETY: the id just made; the caller's addresses; 2 s as librdmacm waits.
                unsafe {
                    rdma_resolve_addr(made, r.ai_src_addr.cast(), r.ai_dst_addr.cast(), 2000) == 0
                        && rdma_resolve_route(made, 2000) == 0
                        && (qp_init_attr.is_null() || rdma_create_qp(made, pd, qp_init_attr) == 0)
                }
            };
            if !ok {
                return fail(made);
            }
            // SAFETY: the caller's out pointer.
            unsafe { id.write(made) };
            0
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_get_request`: waits on a listening id in synchronous mode for the next
    /// connection request and hands out its id, in synchronous mode too, with a QP made from
    /// `rdma_create_ep`'s attributes when the listener has them; the request's event stays on
    /// the new id (`id->event`: the peer's private data and parameters). EINVAL for an id
    /// with a channel of the program's (use `rdma_get_cm_event` there).
    fn rdma_get_request(listen: *mut sys::rdma_cm_id, id: *mut *mut sys::rdma_cm_id) -> c_int {
        guard(-1, || {
            // SAFETY: checked live first.
            if id.is_null() || !live(listen) || !unsafe { state(listen) }.sync {
                set_errno(libc::EINVAL);
                return -1;
            }
            let mut ev = ptr::null_mut();
            // SAFETY: the listener's own channel and a local out pointer.
            if unsafe { rdma_get_cm_event((*listen).channel, &raw mut ev) } != 0 {
                return -1;
            }
            // SAFETY: `ev` was just handed out.
            let (kind, status, new) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
            let refuse = |e: c_int| {
                // SAFETY: the event taken above, acked once.
                unsafe { rdma_ack_cm_event(ev) };
                set_errno(e);
                -1
            };
            if status != 0 {
                return refuse(status.abs());
            }
            if kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST || !live(new) {
                return refuse(libc::EINVAL);
            }
            // The new id leaves the listener's channel for one of its own (librdmacm's
            // `ucma_process_conn_req` migrates it for a synchronous listener).
            let chan = make_channel();
            if chan.is_null() {
                return refuse(libc::ENOMEM);
            }
            // SAFETY: a live id of ours, just handed over by the event.
            unsafe {
                (*new).channel = chan;
                state(new).sync = true;
            }
            // SAFETY: a live listener.
            let ep = unsafe { state(listen) }.ep_qp;
            if let Some((pd, mut attr)) = ep
                // SAFETY: the new id; the listener's PD (or NULL) and a copy of its attributes.
                && unsafe { rdma_create_qp(new, pd as *mut sys::ibv_pd, &raw mut attr) } != 0
            {
                // SAFETY: as above.
                let e = unsafe { *libc::__errno_location() };
                // SAFETY: the request's id, refused and destroyed (the peer hears a REJ).
                unsafe {
                    rdma_ack_cm_event(ev);
                    rdma_reject(new, ptr::null(), 0);
                    rdma_destroy_id(new);
                }
                set_errno(e);
                return -1;
            }
            // SAFETY: the new id keeps its request event; the caller's out pointer.
            unsafe {
                (*new).event = ev;
                id.write(new);
            }
            0
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_destroy_ep`: destroys the id's QP (and the CQs `rdma_create_qp` made for it),
    /// then the id, as librdmacm does.
    fn rdma_destroy_ep(id: *mut sys::rdma_cm_id) -> () {
        guard((), || {
            if !live(id) {
                return;
            }
            // SAFETY: a live id of ours.
            unsafe {
                rdma_destroy_qp(id);
                rdma_destroy_id(id);
            }
        });
    }
);

// ---------------------------------------------------------------------------------------

export!(
    "RDMACM_1.0",
    /// `rdma_getaddrinfo`: the first address `getaddrinfo` finds for `node`/`service`, as the
    /// source (RAI_PASSIVE) or the destination, with the hints' QP type and port space (RC
    /// over TCP by default). Returns `getaddrinfo`'s error code on failure.
    fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const sys::rdma_addrinfo,
        res: *mut *mut sys::rdma_addrinfo,
    ) -> c_int {
        guard(libc::EAI_FAIL, || {
            if res.is_null() || (node.is_null() && service.is_null()) {
                return libc::EAI_NONAME;
            }
            // SAFETY: NULL or the caller's hints.
            let h = unsafe { hints.as_ref() };
            let flags = h.map_or(0, |h| h.ai_flags);
            let passive = flags & sys::RAI_PASSIVE as c_int != 0;
            // SAFETY: all-zero is a valid `addrinfo`.
            let mut ah: libc::addrinfo = unsafe { core::mem::zeroed() };
            ah.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
            ah.ai_socktype = libc::SOCK_STREAM;
            if passive {
                ah.ai_flags |= libc::AI_PASSIVE;
            }
            if flags & sys::RAI_NUMERICHOST as c_int != 0 {
                ah.ai_flags |= libc::AI_NUMERICHOST;
            }
            let mut found: *mut libc::addrinfo = ptr::null_mut();
            // SAFETY: C strings or NULL from the caller, local hints, an out pointer.
            let rc = unsafe { libc::getaddrinfo(node, service, &raw const ah, &raw mut found) };
            if rc != 0 {
                return rc;
            }
            // SAFETY: getaddrinfo succeeded: `found` is a list of at least one entry.
            let a = unsafe { sockaddr_in((*found).ai_addr) };
            // SAFETY: the list getaddrinfo gave, freed once.
            unsafe { libc::freeaddrinfo(found) };
            let Some(a) = a else {
                return libc::EAI_FAMILY;
            };
            let (st, len) = to_storage(a);
            // SAFETY: calloc of plain C structs; NULL results are checked.
            let (rai, sa) = unsafe {
                (
                    libc::calloc(1, size_of::<sys::rdma_addrinfo>()).cast::<sys::rdma_addrinfo>(),
                    libc::calloc(1, size_of::<libc::sockaddr_storage>())
                        .cast::<libc::sockaddr_storage>(),
                )
            };
            if rai.is_null() || sa.is_null() {
                // SAFETY: free of calloc's results (NULL is fine).
                unsafe {
                    libc::free(rai.cast());
                    libc::free(sa.cast());
                }
                return libc::EAI_MEMORY;
            }
            // SAFETY: `sa` and `rai` were just allocated with room for these.
            unsafe {
                sa.write(st);
                let r = &mut *rai;
                r.ai_flags = flags;
                r.ai_family = c_int::from(st.ss_family);
                r.ai_qp_type = h
                    .map(|h| h.ai_qp_type)
                    .filter(|&t| t != 0)
                    .unwrap_or(sys::IBV_QPT_RC as c_int);
                r.ai_port_space = h
                    .map(|h| h.ai_port_space)
                    .filter(|&p| p != 0)
                    .unwrap_or(sys::RDMA_PS_TCP as c_int);
                if passive {
                    r.ai_src_addr = sa.cast();
                    r.ai_src_len = len;
                } else {
                    r.ai_dst_addr = sa.cast();
                    r.ai_dst_len = len;
                }
                res.write(rai);
            }
            0
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_freeaddrinfo`: frees a list from `rdma_getaddrinfo`.
    fn rdma_freeaddrinfo(res: *mut sys::rdma_addrinfo) -> () {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list from `rdma_getaddrinfo`: calloc'd entries and addresses.
            unsafe {
                let next = (*p).ai_next;
                libc::free((*p).ai_src_addr.cast());
                libc::free((*p).ai_dst_addr.cast());
                libc::free((*p).ai_src_canonname.cast());
                libc::free((*p).ai_dst_canonname.cast());
                libc::free((*p).ai_route);
                libc::free((*p).ai_connect);
                libc::free(p.cast());
                p = next;
            }
        }
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_set_option`: RDMA_OPTION_ID_TOS, _REUSEADDR, _AFONLY and _ACK_TIMEOUT are taken
    /// (the kernel's checks on their sizes); they change nothing here (one traffic class, no
    /// port reuse restriction, listeners per family). Other options: ENOSYS.
    fn rdma_set_option(
        id: *mut sys::rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int {
        if !live(id) || optval.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let want = match (level as u32, optname as u32) {
            (sys::RDMA_OPTION_ID, sys::RDMA_OPTION_ID_TOS | sys::RDMA_OPTION_ID_ACK_TIMEOUT) => 1,
            (sys::RDMA_OPTION_ID, sys::RDMA_OPTION_ID_REUSEADDR | sys::RDMA_OPTION_ID_AFONLY) => {
                size_of::<c_int>()
            }
            _ => {
                say(&format!(
                    "rdma_set_option: level {level} option {optname} is not supported"
                ));
                set_errno(libc::ENOSYS);
                return -1;
            }
        };
        if optlen != want {
            set_errno(libc::EINVAL);
            return -1;
        }
        0
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_get_src_port`: the id's local port, network order.
    fn rdma_get_src_port(id: *mut sys::rdma_cm_id) -> u16 {
        if !live(id) {
            return 0;
        }
        // SAFETY: a live id of ours.
        unsafe { state(id).src }.map_or(0, |a| a.port().to_be())
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_get_dst_port`: the id's peer port, network order.
    fn rdma_get_dst_port(id: *mut sys::rdma_cm_id) -> u16 {
        if !live(id) {
            return 0;
        }
        // SAFETY: a live id of ours.
        unsafe { state(id).dst }.map_or(0, |a| a.port().to_be())
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_get_devices`: the contexts librdmacm opened (kept open while it is loaded),
    /// NULL-terminated; free the array with `rdma_free_devices`.
    fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut sys::ibv_context {
        guard(ptr::null_mut(), || {
            let ctxs = contexts(&mut reg());
            // SAFETY: calloc of n+1 pointers, checked.
            let list = unsafe { libc::calloc(ctxs.len() + 1, size_of::<usize>()) }.cast::<usize>();
            if list.is_null() {
                set_errno(libc::ENOMEM);
                return ptr::null_mut();
            }
            for (i, c) in ctxs.iter().enumerate() {
                // SAFETY: `list` has room for `len + 1` entries.
                unsafe { list.add(i).write(*c) };
            }
            if !num_devices.is_null() {
                // SAFETY: the caller's int.
                unsafe { num_devices.write(c_int::try_from(ctxs.len()).unwrap_or(0)) };
            }
            list.cast()
        })
    }
);

export!(
    "RDMACM_1.0",
    /// `rdma_free_devices`: frees the array of `rdma_get_devices` (the contexts stay open).
    fn rdma_free_devices(list: *mut *mut sys::ibv_context) -> () {
        // SAFETY: the calloc'd array of `rdma_get_devices`.
        unsafe { libc::free(list.cast()) };
    }
);

export!(
    "RDMACM_1.0",
    /// `rpoll`: `poll(2)`. rsockets are not provided, so every descriptor is an ordinary one,
    /// for which rsocket's `rpoll` is `poll`.
    fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
        // SAFETY: the caller's array of `nfds` entries.
        unsafe { libc::poll(fds, nfds, timeout) }
    }
);

export!(
    "RDMACM_1.0",
    /// `rselect`: `select(2)`, for the reason `rpoll` is `poll`.
    fn rselect(
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int {
        // SAFETY: the caller's sets and timeout.
        unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
    }
);

/// Exports librdmacm calls this library does not provide: each says so on stderr and fails
/// with ENOSYS (an `int` call returns -1, a pointer call NULL), so programs that import them
/// load and fail cleanly if they call them.
macro_rules! unsupported {
    ($node:literal, $ret:ty, $fail:expr, $($name:ident),+ $(,)?) => {$(
        export!(
            $node,
            /// Not provided by roce-xdp's librdmacm: ENOSYS (see the module doc).
            fn $name() -> $ret {
                say(concat!(stringify!($name), " is not supported"));
                set_errno(libc::ENOSYS);
                $fail
            }
        );
    )+};
}

unsupported!(
    "RDMACM_1.0",
    c_int,
    -1,
    rdma_create_srq,
    rdma_create_srq_ex,
    rdma_join_multicast,
    rdma_leave_multicast,
    rdma_notify,
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    rgetpeername,
    rgetsockname,
    riounmap,
);
unsupported!("RDMACM_1.1", c_int, -1, rdma_join_multicast_ex);
unsupported!(
    "RDMACM_1.3",
    c_int,
    -1,
    rdma_reject_ece,
    rdma_set_local_ece,
    rdma_get_remote_ece,
);
unsupported!(
    "RDMACM_1.0",
    isize,
    -1,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rsend,
    rsendto,
    rsendmsg,
    rread,
    rreadv,
    rwrite,
    rwritev,
    riowrite,
);
unsupported!("RDMACM_1.0", libc::off_t, -1, riomap);
unsupported!("RDMACM_1.0", (), (), rdma_destroy_srq);

#[cfg(test)]
mod tests {
    use super::*;

    /// An id's path record is replaced without a leak and freed with the id.
    #[test]
    fn an_ids_path_record_goes_with_it() {
        // SAFETY: no arguments.
        let ch = unsafe { rdma_create_event_channel() };
        assert!(!ch.is_null());
        let mut id = ptr::null_mut();
        // SAFETY: a live channel of ours and a place for the id.
        let r = unsafe { rdma_create_id(ch, &raw mut id, ptr::null_mut(), sys::RDMA_PS_TCP) };
        assert_eq!(r, 0);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // SAFETY: a live id of ours, with no path record yet, then with ours.
        unsafe {
            set_path_rec(id, a, b, sys::IBV_MTU_1024);
            set_path_rec(id, b, a, sys::IBV_MTU_1024);
            assert_eq!((*id).route.num_paths, 1);
            assert_eq!((*(*id).route.path_rec).sgid.raw, Gid::from_ip(b).0);
            free_path_rec(id);
            assert!((*id).route.path_rec.is_null());
            assert_eq!((*id).route.num_paths, 0);
            set_path_rec(id, a, b, sys::IBV_MTU_1024);
            assert_eq!(rdma_destroy_id(id), 0);
            rdma_destroy_event_channel(ch);
        }
    }
}
