//! The serving side of `roce engine` (docs/multiprocess.md): a [`Device`] opened in this
//! process, offered over a Unix socket to programs that speak [`super::proto`].
//!
//! Each connection is served by a thread of its own and owns what it created: a handle of
//! another connection is refused with `EINVAL` (uverbs' answer to a handle it does not know),
//! and when the connection closes (the program exited, or was killed) its QPs, CQs and PDs are
//! destroyed in that order, as the kernel releases a dead process's verbs objects. Peers are
//! checked with `SO_PEERCRED`: only root's processes may use the engine (opening the device
//! needs root, so the engine grants nothing a program could not take itself); the socket file
//! is 0600 as well. At most [`ServeOptions::max_clients`] programs are served at once (a thread
//! each); beyond, a new connection is answered with a [`REJECT`] of [`FULL_ERRNO`]. A program's
//! doorbell connection is not a client, and a program admitted at the limit is never refused
//! its doorbell: while a subscription waits for its doorbell, connections beyond the limit are
//! let in on probation and refused at their first request unless it is a doorbell
//! (docs/multiprocess.md, "A bound on the engine's connections"). The engine stops
//! [`ServeOptions::linger`] after its last client left (or after it started, if none came), or
//! when `stop` says so.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    io::{ErrorKind, Read as _, Write as _},
    os::unix::{
        fs::PermissionsExt as _,
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::socket::{
        getsockopt,
        sockopt::{PeerCredentials, PeerPidfd},
    },
};

use super::{
    memory::{AddressSpace, ProcessMem},
    proto::{self, QpSpec, REJECT, Reply, Request, Value, WireOp, WireSge, WireWc},
    verbs::{self, VerbCall, VerbOk},
};
use crate::{
    api::{Device, RcConnect},
    transport::{
        CqId, LKey, Memory, PdId, Psn, QpCap, QpInit, Qpn, RKey, RecvWr, SendFlags, SendOp, SendWr,
        Sge, SrqId,
    },
};

/// The transport's SG list of a wire one: the lkeys and ranges are checked by the transport
/// when it uses them, as for any program's WR.
fn sges(list: &[WireSge]) -> Vec<Sge> {
    list.iter()
        .map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: LKey::new(g.lkey),
        })
        .collect()
}

/// How the engine serves.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// How long the engine waits for a client after the last one left (or after it started),
    /// before it exits and releases the interface.
    pub linger: Duration,
    /// How often the accept loop looks at `stop` and the idle time.
    pub tick: Duration,
    /// The most programs served at once (connections, doorbells aside); one more is refused
    /// with [`FULL_ERRNO`]. Each has a thread of its own in the engine.
    pub max_clients: u32,
}

/// The default of [`ServeOptions::max_clients`]: far more programs than share an interface in
/// practice, each a thread of the engine (about 8 MiB of virtual stack each, touched only as
/// used), well inside the default `ulimit -u` and `threads-max`. Only root connects, so the
/// bound stops runaway scripts, not attackers.
pub const DEFAULT_MAX_CLIENTS: u32 = 1024;

/// The errno of the [`REJECT`] a program gets when the engine already serves
/// [`ServeOptions::max_clients`] programs: `EAGAIN`, since the place frees up when a program
/// leaves (`EMFILE` would point at the program's own descriptor limit).
pub const FULL_ERRNO: i32 = libc::EAGAIN;

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            linger: Duration::from_secs(5),
            tick: Duration::from_millis(50),
            max_clients: DEFAULT_MAX_CLIENTS,
        }
    }
}

/// How long a reply may wait for room in a program's socket before the engine gives up on
/// that program's connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// What an engine did, when it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// Connections accepted (refused ones included).
    pub connections: u32,
    /// Connections refused by `SO_PEERCRED`.
    pub refused: u32,
    /// Connections refused because [`ServeOptions::max_clients`] programs were served.
    pub full: u32,
}

/// Shared by the accept loop and the connections.
struct Engine {
    dev: Device,
    /// Connections being served, doorbells and connections on probation aside (a connection
    /// let in below the limit counts from its accept until it turns out to be a doorbell).
    clients: AtomicU32,
    /// Connections let in beyond the limit while a doorbell was awaited, not yet told apart
    /// (at most `max_clients`).
    probation: AtomicU32,
    /// [`ServeOptions::max_clients`].
    max_clients: u32,
    /// Connections let in on probation and then refused as the engine was full.
    late_full: AtomicU32,
    stop: AtomicBool,
    /// The event queues of the connections that subscribed ([`VerbCall::Subscribe`]), by token.
    subs: Mutex<HashMap<u64, Arc<EventQueue>>>,
    /// Which subscription each CM listen and connection belongs to.
    cm: Mutex<CmOwners>,
}

/// The owners of the device's CM objects, by subscription token: where the CM event thread
/// sends each event.
#[derive(Default)]
struct CmOwners {
    /// Listens, by service ID: a REQ or SIDR REQ for it goes to its listener, and the new
    /// connection becomes the listener's.
    listens: HashMap<u64, u64>,
    /// Connections, by local communication ID.
    comms: HashMap<u32, u64>,
}

/// The most events queued for one connection; beyond it the oldest are dropped (with a log):
/// a program that takes no events must not grow the engine without bound.
const MAX_QUEUED_EVENTS: usize = 4096;

/// One subscribed connection's events, rung on its doorbell connection.
#[derive(Default)]
struct EventQueue {
    state: Mutex<EventState>,
    rung: Condvar,
}

#[derive(Default)]
struct EventState {
    events: VecDeque<crate::api::Event>,
    /// Events queued since the subscription: the doorbell rings when it moves.
    pushed: u64,
    /// CM events of the connection's listens and connections.
    cm_events: VecDeque<crate::api::CmEvent>,
    /// CM events queued since the subscription: the CM doorbell rings when it moves.
    cm_pushed: u64,
    /// The connection is gone: its doorbell stops.
    closed: bool,
    /// A doorbell connection serves this queue's device events (one at most).
    belled: bool,
    /// A doorbell connection serves this queue's CM events (one at most).
    cm_belled: bool,
}

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, e: crate::api::Event) {
        self.push_with(|st| (&mut st.events, &mut st.pushed), e, "events");
    }

    fn push_cm(&self, e: crate::api::CmEvent) {
        self.push_with(|st| (&mut st.cm_events, &mut st.cm_pushed), e, "CM events");
    }

    /// Queues `e` on the queue and generation `which` picks (dropping the oldest beyond
    /// [`MAX_QUEUED_EVENTS`]) and rings.
    fn push_with<T>(
        &self,
        which: impl FnOnce(&mut EventState) -> (&mut VecDeque<T>, &mut u64),
        e: T,
        what: &str,
    ) {
        let mut st = self.lock();
        let (queue, pushed) = which(&mut st);
        if queue.len() >= MAX_QUEUED_EVENTS {
            queue.pop_front();
            log::warn!("engine: a program takes no {what}; dropped its oldest");
        }
        queue.push_back(e);
        *pushed += 1;
        drop(st);
        self.rung.notify_all();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.rung.notify_all();
    }
}

/// Hands every event of the engine's device to every subscribed connection (each takes only
/// those of its own objects, [`VerbCall::TakeEvents`]), until the engine stops. Runs on a
/// thread of its own for the engine's life.
fn dispatch_events(engine: &Engine, tick: Duration) {
    while !engine.stop.load(Ordering::SeqCst) {
        let Some(e) = engine.dev.wait_event(tick) else {
            continue;
        };
        let subs: Vec<_> = engine
            .subs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for q in subs {
            q.push(e);
        }
    }
}

/// Hands each CM event of the engine's device to the program it belongs to: a REQ or SIDR REQ
/// to the listener of its service ID (the new connection becomes that program's), any other
/// event to the program that owns its connection. A REQ nobody listens for any more (its
/// listener left between the REQ's arrival and here) is rejected; other events of no owner are
/// dropped. Runs on a thread of its own for the engine's life.
fn dispatch_cm_events(engine: &Engine, tick: Duration) {
    use crate::api::CmEvent as E;
    while !engine.stop.load(Ordering::SeqCst) {
        let Some(e) = engine.dev.wait_cm_event(tick) else {
            continue;
        };
        let owner = {
            let mut cm = engine.cm.lock().unwrap_or_else(PoisonError::into_inner);
            match &e {
                E::ConnectRequest { id, req, .. } => {
                    let o = cm.listens.get(&req.service_id.0).copied();
                    if let Some(t) = o {
                        cm.comms.insert(id.0, t);
                    }
                    o
                }
                E::SidrRequest { id, req, .. } => {
                    let o = cm.listens.get(&req.service_id.0).copied();
                    if let Some(t) = o {
                        cm.comms.insert(id.0, t);
                    }
                    o
                }
                E::Reply { id, .. }
                | E::Established { id }
                | E::Rejected { id, .. }
                | E::TimedOut { id }
                | E::Disconnected { id, .. }
                | E::TimeWaitExit { id }
                | E::SidrReply { id, .. }
                | E::SidrTimedOut { id } => cm.comms.get(&id.0).copied(),
            }
        };
        let q = owner.and_then(|t| {
            engine
                .subs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&t)
                .cloned()
        });
        match (q, &e) {
            (Some(q), _) => q.push_cm(e),
            (None, E::ConnectRequest { id, .. }) => {
                let _ = engine.dev.cm_reject(*id, &[]);
            }
            (None, _) => {}
        }
    }
}

impl Engine {
    /// Whether a subscription waits for its doorbell: then [`serve`] lets connections in
    /// beyond `max_clients` on probation, so that a program admitted at the limit gets its
    /// doorbell.
    fn awaits_doorbell(&self) -> bool {
        let subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
        subs.values().any(|q| {
            let st = q.lock();
            !(st.belled && st.cm_belled)
        })
    }

    /// Takes a place for a program if one is free.
    fn take_place(&self) -> bool {
        self.clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                (c < self.max_clients).then_some(c + 1)
            })
            .is_ok()
    }
}

/// Binds the engine socket at `path`: makes its directory (0755), takes over a stale socket
/// that no engine answers on, refuses when another engine serves there, and sets the file to
/// 0600.
///
/// # Errors
/// Another engine listens at `path` (`EADDRINUSE`), or the file system refused.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(std::io::Error::new(
                    ErrorKind::AddrInUse,
                    format!("an engine already serves {}", path.display()),
                ));
            }
            // A socket left by an engine that died: nobody listens on it.
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Removes the socket file when the engine stops, however it stops, and its namespace's
/// folder when no other engine's socket is left in it.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            // Fails, as it should, while another interface's engine has its socket there.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Serves `dev` on `listener` (bound at `path` by [`bind`]) until the engine has had no client
/// for [`ServeOptions::linger`], or `stop` returns true; then waits for the connections'
/// threads, removes the socket file, and drops the device (which unloads roce_xdp if the
/// device loaded it). Call it from the engine's main thread.
///
/// # Errors
/// Accepting failed in a way other than a signal or a client that left at once.
pub fn serve(
    dev: Device,
    listener: UnixListener,
    path: &Path,
    opts: &ServeOptions,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<ServeReport> {
    let _unlink = Unlink(path.to_owned());
    listener.set_nonblocking(true)?;
    let engine = Arc::new(Engine {
        dev,
        clients: AtomicU32::new(0),
        probation: AtomicU32::new(0),
        max_clients: opts.max_clients,
        late_full: AtomicU32::new(0),
        stop: AtomicBool::new(false),
        subs: Mutex::new(HashMap::new()),
        cm: Mutex::new(CmOwners::default()),
    });
    let events = {
        let e = Arc::clone(&engine);
        let tick = opts.tick;
        std::thread::Builder::new()
            .name("roce-engine-events".into())
            .spawn(move || dispatch_events(&e, tick))?
    };
    let cm_events = {
        let e = Arc::clone(&engine);
        let tick = opts.tick;
        std::thread::Builder::new()
            .name("roce-engine-cm".into())
            .spawn(move || dispatch_cm_events(&e, tick))?
    };
    let mut report = ServeReport::default();
    let mut threads = Vec::new();
    let mut idle_since = Instant::now();
    let result = loop {
        if stop() {
            break Ok(());
        }
        if engine.clients.load(Ordering::SeqCst) > 0 {
            idle_since = Instant::now();
        } else if idle_since.elapsed() >= opts.linger {
            log::info!("engine: no client for {:?}, stopping", opts.linger);
            break Ok(());
        }
        match listener.accept() {
            Ok((stream, _)) => {
                report.connections += 1;
                let allowed = match getsockopt(&stream, PeerCredentials) {
                    Ok(c) if c.uid() == 0 => Some(c.pid()),
                    Ok(c) => {
                        log::warn!("engine: refused pid {} (uid {})", c.pid(), c.uid());
                        None
                    }
                    Err(e) => {
                        log::warn!("engine: SO_PEERCRED: {e}");
                        None
                    }
                };
                let Some(pid) = allowed else {
                    report.refused += 1;
                    refuse(stream, libc::EACCES);
                    continue;
                };
                // At the limit, a connection is let in only while a subscription waits for
                // its doorbell, and only on probation: unless it turns out to be a doorbell,
                // its first request after Hello is refused if the engine is still full.
                let probation = if engine.take_place() {
                    false
                } else if engine.awaits_doorbell()
                    && engine.probation.load(Ordering::SeqCst) < opts.max_clients
                {
                    engine.probation.fetch_add(1, Ordering::SeqCst);
                    true
                } else {
                    log::warn!(
                        "engine: refused pid {pid}: {} programs served, the most \
                         --max-clients allows",
                        opts.max_clients
                    );
                    report.full += 1;
                    refuse(stream, FULL_ERRNO);
                    continue;
                };
                let e = Arc::clone(&engine);
                let tick = opts.tick;
                match std::thread::Builder::new()
                    .name(format!("roce-engine-{pid}"))
                    .spawn(move || {
                        let _ = stream.set_read_timeout(Some(tick));
                        // A program that sends and never reads its replies loses its
                        // connection instead of holding this thread (and the engine's exit).
                        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                        let space = peer_space(&stream, pid);
                        let mut c = Connection::new(&e, pid, space);
                        c.probation = probation;
                        c.counted = !probation;
                        c.run(stream);
                    }) {
                    Ok(t) => threads.push(t),
                    Err(err) => {
                        let n = if probation {
                            &engine.probation
                        } else {
                            &engine.clients
                        };
                        n.fetch_sub(1, Ordering::SeqCst);
                        log::warn!("engine: no thread for pid {pid}: {err}");
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(opts.tick),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => break Err(e),
        }
        threads.retain(|t| !t.is_finished());
    };
    engine.stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let _ = events.join();
    let _ = cm_events.join();
    report.full += engine.late_full.load(Ordering::SeqCst);
    drop(listener);
    // Every connection has released its objects; dropping the last reference closes the
    // device (and unloads what it loaded).
    drop(engine);
    result.map(|()| report)
}

/// The memory of the process that connected `stream` (`pid`, from its `SO_PEERCRED`): its
/// `/proc/PID/mem`, kept only if that process still runs once the file is open, as the pidfd
/// of `SO_PEERPIDFD` tells: a program that died before the engine accepted it may have left
/// its pid to another process, whose memory must not become the program's. Kernels without
/// `SO_PEERPIDFD` (before 6.5) get the pid alone. `None` (the connection's registrations are
/// refused) when the process is gone or its file cannot be opened. Call it when the
/// connection is accepted, before serving any request.
fn peer_space(stream: &UnixStream, pid: i32) -> Option<AddressSpace> {
    let pidfd = match getsockopt(stream, PeerPidfd) {
        Ok(fd) => Some(fd),
        Err(Errno::ENOPROTOOPT) => None,
        Err(e) => {
            log::warn!("engine: pid {pid}: SO_PEERPIDFD: {e}; the program is gone");
            return None;
        }
    };
    let space = AddressSpace::open(pid)
        .inspect_err(|e| log::warn!("engine: pid {pid}: /proc/{pid}/mem: {e}"))
        .ok()?;
    if let Some(fd) = pidfd {
        // A pidfd polls readable once its process has exited.
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&fd),
            PollFlags::POLLIN,
        )];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => {}
            Ok(_) => {
                log::warn!("engine: pid {pid} exited before it was served");
                return None;
            }
            Err(e) => {
                log::warn!("engine: pid {pid}: polling its pidfd: {e}");
                return None;
            }
        }
    }
    Some(space)
}

/// Answers a connection with a [`REJECT`] of `errno` and closes it, after a short wait for
/// its first request (a program whose Hello meets a closed socket sees `EPIPE`, not the
/// refusal).
fn refuse(mut stream: UnixStream, errno: i32) {
    let mut out = Vec::new();
    proto::encode_reply(&mut out, 0, REJECT, &Reply::Err(errno));
    let _ = stream.set_nonblocking(false);
    let _ = stream.write_all(&out);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = stream.read(&mut [0u8; proto::HEADER]);
}

/// One program's connection and the objects it made.
struct Connection<'a> {
    engine: &'a Engine,
    pid: i32,
    /// The program's memory, opened when the connection started (`None` when that failed:
    /// its registrations are refused).
    space: Option<AddressSpace>,
    pds: BTreeSet<u32>,
    cqs: BTreeSet<u32>,
    qps: BTreeSet<u32>,
    /// Memory regions by lkey.
    mrs: BTreeSet<u32>,
    srqs: BTreeSet<u32>,
    /// Memory windows by index (the R_Key's upper 16 bits, which a bind keeps), with the PD
    /// and key they were made with.
    mws: BTreeMap<u32, (PdId, RKey)>,
    /// The token and queue of this connection's events, once it subscribed.
    sub: Option<(u64, Arc<EventQueue>)>,
    /// Let in beyond `max_clients` while a doorbell was awaited, not told apart yet: refused
    /// at its first request other than Hello unless it is a doorbell or a place has freed up.
    probation: bool,
    /// Holds one of the `max_clients` places (in [`Engine::clients`]).
    counted: bool,
}

impl<'a> Connection<'a> {
    fn new(engine: &'a Engine, pid: i32, space: Option<AddressSpace>) -> Self {
        Self {
            engine,
            pid,
            space,
            pds: BTreeSet::new(),
            cqs: BTreeSet::new(),
            qps: BTreeSet::new(),
            mrs: BTreeSet::new(),
            srqs: BTreeSet::new(),
            mws: BTreeMap::new(),
            sub: None,
            probation: false,
            counted: false,
        }
    }

    /// Reads requests and answers them until the peer closes, sends garbage, or the engine
    /// stops; then releases what the connection made.
    fn run(mut self, mut stream: UnixStream) {
        let _ = stream.set_nonblocking(false);
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        let mut out = Vec::new();
        'conn: while !self.engine.stop.load(Ordering::SeqCst) {
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            loop {
                out.clear();
                match proto::decode_request(&buf) {
                    Ok(None) => break,
                    Ok(Some((f, used))) => {
                        buf.drain(..used);
                        if let Request::Verb(body) = &f.msg
                            && let Ok(VerbCall::Doorbell { token, cm }) = verbs::decode(body)
                        {
                            // A doorbell is part of its program's connection, not a client.
                            self.settle();
                            self.doorbell(stream, f.seq, f.kind, token, cm);
                            break 'conn;
                        }
                        if self.probation && !matches!(f.msg, Request::Hello) {
                            self.settle();
                            if !self.engine.take_place() {
                                log::warn!(
                                    "engine: refused pid {}: {} programs served, the most \
                                     --max-clients allows",
                                    self.pid,
                                    self.engine.max_clients
                                );
                                proto::encode_reply(
                                    &mut out,
                                    f.seq,
                                    REJECT,
                                    &Reply::Err(FULL_ERRNO),
                                );
                                let _ = stream.write_all(&out);
                                self.engine.late_full.fetch_add(1, Ordering::SeqCst);
                                break 'conn;
                            }
                            self.counted = true;
                        }
                        let reply = self.handle(f.msg);
                        proto::encode_reply(&mut out, f.seq, f.kind, &reply);
                        if stream.write_all(&out).is_err() {
                            break 'conn;
                        }
                    }
                    Err(e) => {
                        log::warn!("engine: pid {}: {e}; closing its connection", self.pid);
                        proto::encode_reply(
                            &mut out,
                            proto::peek_seq(&buf),
                            REJECT,
                            &Reply::Err(e.errno()),
                        );
                        let _ = stream.write_all(&out);
                        break 'conn;
                    }
                }
            }
        }
        self.settle();
        self.release();
    }

    /// Gives back what this connection holds of the engine's counts: its probation and its
    /// place. Call it when the connection turns out to be a doorbell, when it leaves
    /// probation, and when it ends.
    fn settle(&mut self) {
        if std::mem::take(&mut self.probation) {
            self.engine.probation.fetch_sub(1, Ordering::SeqCst);
        }
        if std::mem::take(&mut self.counted) {
            self.engine.clients.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Destroys what this connection made: QPs first (their WRs flush), then memory regions
    /// (no engine access reaches the program's memory afterwards), CQs, PDs: the order in which
    /// the kernel releases a dying process's verbs objects.
    fn release(&mut self) {
        let dev = &self.engine.dev;
        if let Some((token, q)) = self.sub.take() {
            // Its CM connections end as rdma_destroy_id ends them (a DREQ to a connected
            // peer), and its listens stop, before its QPs go.
            let (comms, listens) = {
                let mut cm = self
                    .engine
                    .cm
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let comms: Vec<u32> = cm
                    .comms
                    .iter()
                    .filter(|&(_, &t)| t == token)
                    .map(|(&id, _)| id)
                    .collect();
                let listens: Vec<u64> = cm
                    .listens
                    .iter()
                    .filter(|&(_, &t)| t == token)
                    .map(|(&sid, _)| sid)
                    .collect();
                cm.comms.retain(|_, t| *t != token);
                cm.listens.retain(|_, t| *t != token);
                (comms, listens)
            };
            for id in comms {
                let _ = dev.cm_destroy(crate::api::CommId(id));
            }
            for sid in listens {
                let sid = crate::ibcm::ServiceId(sid);
                let (port, ud) = (
                    sid.port(),
                    sid.port_space() == Some(crate::ibcm::PortSpace::Udp),
                );
                let _ = if ud {
                    dev.cm_unlisten_ud(port)
                } else {
                    dev.cm_unlisten(port)
                };
            }
            self.engine
                .subs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&token);
            q.close();
        }
        for qpn in std::mem::take(&mut self.qps) {
            if let Err(e) = dev.destroy_qp(Qpn::new(qpn)) {
                log::warn!("engine: pid {}: destroying QP {qpn:#x}: {e}", self.pid);
            }
        }
        for srq in std::mem::take(&mut self.srqs) {
            if let Err(e) = dev.destroy_srq(SrqId(srq)) {
                log::warn!("engine: pid {}: destroying SRQ {srq}: {e}", self.pid);
            }
        }
        for (_, (pd, rkey)) in std::mem::take(&mut self.mws) {
            if let Err(e) = dev.dealloc_mw(pd, rkey) {
                log::warn!("engine: pid {}: freeing window {rkey}: {e}", self.pid);
            }
        }
        for lkey in std::mem::take(&mut self.mrs) {
            if let Err(e) = dev.dereg_mr(LKey::new(lkey)) {
                log::warn!("engine: pid {}: deregistering MR {lkey:#x}: {e}", self.pid);
            }
        }
        for cq in std::mem::take(&mut self.cqs) {
            if let Err(e) = dev.destroy_cq(CqId(cq)) {
                log::warn!("engine: pid {}: destroying CQ {cq}: {e}", self.pid);
            }
        }
        for pd in std::mem::take(&mut self.pds) {
            if let Err(e) = dev.dealloc_pd(PdId(pd)) {
                log::warn!("engine: pid {}: freeing PD {pd}: {e}", self.pid);
            }
        }
    }

    /// `EINVAL` unless `h` is in `set`: a handle of another connection is unknown here.
    fn own(set: &BTreeSet<u32>, h: u32) -> Result<(), i32> {
        if set.contains(&h) {
            Ok(())
        } else {
            Err(libc::EINVAL)
        }
    }

    fn handle(&mut self, req: Request) -> Reply {
        match self.verb(req) {
            Ok(v) => Reply::Ok(v),
            Err(e) => Reply::Err(e),
        }
    }

    fn verb(&mut self, req: Request) -> Result<Value, i32> {
        if let Request::Verb(body) = &req {
            let call = verbs::decode(body).map_err(|e| e.errno())?;
            let ok = self.lib_verb(call)?;
            return Ok(Value::Verb(verbs::encode(&ok).map_err(|e| e.errno())?));
        }
        let dev = &self.engine.dev;
        let errno = |e: crate::api::ApiError| e.errno();
        let wait = match &req {
            Request::WaitCq { timeout_us, .. } => Some(Duration::from_micros((*timeout_us).into())),
            _ => None,
        };
        Ok(match req {
            Request::Hello => Value::Hello {
                version: proto::VERSION,
                pid: std::process::id(),
            },
            Request::Status => {
                let r = dev.resources();
                let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
                Value::Status(super::EngineStatus {
                    clients: self.engine.clients.load(Ordering::SeqCst),
                    qps: n(r.qps),
                    pds: n(r.pds),
                    cqs: n(r.cqs),
                    mrs: n(r.mrs),
                })
            }
            Request::QueryGid { index } => {
                let i = usize::try_from(index).map_err(|_| libc::EINVAL)?;
                Value::Gid(dev.gid(i).map_err(|_| libc::EINVAL)?.raw)
            }
            Request::AllocPd => Value::Created(self.alloc_pd()?.0),
            Request::DeallocPd { pd } => {
                self.dealloc_pd(PdId(pd))?;
                Value::Done
            }
            Request::CreateCq { depth } => Value::Created(self.create_cq(depth)?.0),
            Request::DestroyCq { cq } => {
                self.destroy_cq(CqId(cq))?;
                Value::Done
            }
            Request::CreateQp(s) => {
                let QpSpec {
                    pd,
                    qp_type,
                    send_cq,
                    recv_cq,
                    max_send_wr,
                    max_recv_wr,
                    max_sge,
                    max_inline_data,
                    sq_sig_all,
                } = s;
                let init = QpInit {
                    pd: PdId(pd),
                    qp_type,
                    send_cq: CqId(send_cq),
                    recv_cq: CqId(recv_cq),
                    cap: QpCap {
                        max_send_wr,
                        max_recv_wr,
                        max_sge,
                        max_inline_data,
                    },
                    sq_sig_all,
                };
                Value::Created(self.create_qp(init, None)?.value())
            }
            Request::DestroyQp { qpn } => {
                self.destroy_qp(Qpn::new(qpn))?;
                Value::Done
            }
            Request::QpToInit { qpn, access } => {
                Self::own(&self.qps, qpn)?;
                dev.qp_to_init(Qpn::new(qpn), access).map_err(errno)?;
                Value::Done
            }
            Request::RegMr {
                pd,
                addr,
                len,
                access,
            } => {
                // Its iova is the program's address.
                let info = self.reg_mr(PdId(pd), addr, len, addr, access)?;
                Value::Mr {
                    lkey: info.lkey.value(),
                    rkey: info.rkey.value(),
                }
            }
            Request::DeregMr { lkey } => {
                self.dereg_mr(LKey::new(lkey))?;
                Value::Done
            }
            Request::QpConnect {
                qpn,
                gid_index,
                dgid,
                dest_qpn,
                rq_psn,
                sq_psn,
                mtu,
                attrs,
            } => {
                Self::own(&self.qps, qpn)?;
                let q = Qpn::new(qpn);
                let gi = usize::try_from(gid_index).map_err(|_| libc::EINVAL)?;
                let path = dev
                    .path_to(gi, &dgid, q, Qpn::new(dest_qpn))
                    .map_err(errno)?;
                let c = RcConnect {
                    max_dest_rd_atomic: attrs.max_dest_rd_atomic,
                    max_rd_atomic: attrs.max_rd_atomic,
                    min_rnr_timer: attrs.min_rnr_timer,
                    timeout: attrs.timeout,
                    retry_cnt: attrs.retry_cnt,
                    rnr_retry: attrs.rnr_retry,
                    ..RcConnect::new(
                        path,
                        mtu,
                        Qpn::new(dest_qpn),
                        Psn::new(rq_psn),
                        Psn::new(sq_psn),
                    )
                };
                // The transport checks the depths against the device's limits (EINVAL).
                dev.qp_connect(q, &c).map_err(errno)?;
                Value::Done
            }
            Request::PostSend { qpn, wr } => {
                Self::own(&self.qps, qpn)?;
                let op = match wr.op {
                    WireOp::Send => SendOp::Send,
                    WireOp::Write { remote_addr, rkey } => SendOp::Write {
                        remote_addr,
                        rkey: RKey::new(rkey),
                    },
                    WireOp::Read { remote_addr, rkey } => SendOp::Read {
                        remote_addr,
                        rkey: RKey::new(rkey),
                    },
                    WireOp::CompareSwap {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => SendOp::CompareSwap {
                        remote_addr,
                        rkey: RKey::new(rkey),
                        compare,
                        swap,
                    },
                    WireOp::FetchAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => SendOp::FetchAdd {
                        remote_addr,
                        rkey: RKey::new(rkey),
                        add,
                    },
                };
                let swr = SendWr {
                    wr_id: wr.wr_id,
                    op,
                    sg_list: sges(&wr.sges),
                    flags: if wr.signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    },
                    ud: None,
                    inline_data: None,
                };
                dev.post_send(Qpn::new(qpn), swr).map_err(errno)?;
                Value::Done
            }
            Request::PostRecv {
                qpn,
                wr_id,
                sges: list,
            } => {
                Self::own(&self.qps, qpn)?;
                dev.post_recv(
                    Qpn::new(qpn),
                    RecvWr {
                        wr_id,
                        sg_list: sges(&list),
                    },
                )
                .map_err(errno)?;
                Value::Done
            }
            Request::PollCq { cq, max } | Request::WaitCq { cq, max, .. } => {
                Self::own(&self.cqs, cq)?;
                let max = usize::try_from(max)
                    .map_err(|_| libc::EINVAL)?
                    .min(proto::MAX_POLL);
                let mut wcs = dev.poll_cq(CqId(cq), max);
                if let Some(timeout) = wait
                    && wcs.is_empty()
                    && let Some(w) = dev.wait_cq(CqId(cq), timeout)
                {
                    // The first completion woke us; take what came with it.
                    wcs.push(w);
                    wcs.extend(dev.poll_cq(CqId(cq), max - 1));
                }
                Value::Wcs(
                    wcs.iter()
                        .map(|w| WireWc {
                            wr_id: w.wr_id,
                            status: w.status,
                            opcode: w.opcode,
                            byte_len: w.byte_len,
                            qp_num: w.qp_num.value(),
                        })
                        .collect(),
                )
            }
            Request::QueryQp { qpn } => {
                Self::own(&self.qps, qpn)?;
                let (qp_type, state, _) = dev.qp_query(Qpn::new(qpn)).ok_or(libc::EINVAL)?;
                Value::QpInfo { qp_type, state }
            }
            // Answered above.
            Request::Verb(_) => return Err(libc::EPROTO),
        })
    }

    /// Serves one verb of the drop-in libibverbs ([`VerbCall`]). Every object it names must be
    /// this connection's (`EINVAL` otherwise); destinations (a peer's QPN, rkeys in WRs, the
    /// lkeys of SG lists) meet the device's checks, which are per PD, as for any program.
    fn lib_verb(&mut self, call: VerbCall) -> Result<VerbOk, i32> {
        let dev = &self.engine.dev;
        let errno = |e: crate::api::ApiError| e.errno();
        Ok(match call {
            VerbCall::MaxPathMtu { ipv6 } => VerbOk::Mtu(dev.max_path_mtu(ipv6)),
            VerbCall::PathTo {
                gid_index,
                remote_gid,
                local_qpn,
                remote_qpn,
            } => {
                // Reads no QP: the QPNs only choose the UDP source port (`ibv_create_ah`
                // passes none).
                let i = usize::try_from(gid_index).map_err(|_| libc::EINVAL)?;
                VerbOk::Path(Box::new(
                    dev.path_to(i, &remote_gid, local_qpn, remote_qpn)
                        .map_err(errno)?,
                ))
            }
            VerbCall::AllocPd => VerbOk::Pd(self.alloc_pd()?),
            VerbCall::DeallocPd(pd) => {
                self.dealloc_pd(pd)?;
                VerbOk::Done
            }
            VerbCall::RegMr {
                pd,
                addr,
                len,
                iova,
                access,
            } => VerbOk::Mr(self.reg_mr(pd, addr, len, iova, access)?),
            VerbCall::DeregMr(lkey) => {
                self.dereg_mr(lkey)?;
                VerbOk::Done
            }
            VerbCall::AllocMw { pd, ty } => {
                Self::own(&self.pds, pd.0)?;
                let rkey = dev.alloc_mw(pd, ty).map_err(errno)?;
                self.mws.insert(rkey.value() >> 16, (pd, rkey));
                VerbOk::RKey(rkey)
            }
            VerbCall::DeallocMw { pd, rkey } => {
                let index = rkey.value() >> 16;
                match self.mws.get(&index) {
                    Some(&(p, _)) if p == pd => {}
                    _ => return Err(libc::EINVAL),
                }
                dev.dealloc_mw(pd, rkey).map_err(errno)?;
                self.mws.remove(&index);
                VerbOk::Done
            }
            VerbCall::BindMw {
                qpn,
                wr_id,
                flags,
                bind,
            } => {
                Self::own(&self.qps, qpn.value())?;
                if !self.mws.contains_key(&(bind.mw_rkey.value() >> 16)) {
                    return Err(libc::EINVAL);
                }
                VerbOk::RKey(dev.bind_mw(qpn, wr_id, flags, bind).map_err(errno)?)
            }
            VerbCall::CreateCq { depth } => VerbOk::Cq(self.create_cq(depth)?),
            VerbCall::DestroyCq(cq) => {
                self.destroy_cq(cq)?;
                VerbOk::Done
            }
            VerbCall::ReqNotifyCq { cq, solicited_only } => {
                Self::own(&self.cqs, cq.0)?;
                dev.req_notify_cq(cq, solicited_only).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::PollCq { cq, max } => {
                Self::own(&self.cqs, cq.0)?;
                let n = max.min(verbs::MAX_POLL) as usize;
                let mut wcs = vec![crate::api::Wc::default(); n];
                let got = dev.poll_cq_into(cq, &mut wcs);
                wcs.truncate(got);
                VerbOk::Wcs(wcs)
            }
            VerbCall::CreateQp { init, srq } => VerbOk::Qp(self.create_qp(init, srq)?),
            VerbCall::DestroyQp(qpn) => {
                self.destroy_qp(qpn)?;
                VerbOk::Done
            }
            VerbCall::ModifyQp { qpn, attr, mask } => {
                Self::own(&self.qps, qpn.value())?;
                dev.modify_qp(qpn, &attr, mask).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::QueryQp(qpn) => {
                Self::own(&self.qps, qpn.value())?;
                VerbOk::QpQuery(dev.qp_query(qpn).map(Box::new))
            }
            VerbCall::CreateSrq { pd, attr } => {
                Self::own(&self.pds, pd.0)?;
                let srq = dev.create_srq(pd, attr).map_err(errno)?;
                self.srqs.insert(srq.0);
                VerbOk::Srq(srq)
            }
            VerbCall::DestroySrq(srq) => {
                Self::own(&self.srqs, srq.0)?;
                dev.destroy_srq(srq).map_err(errno)?;
                self.srqs.remove(&srq.0);
                VerbOk::Done
            }
            VerbCall::ModifySrq { srq, attr, mask } => {
                Self::own(&self.srqs, srq.0)?;
                dev.modify_srq(srq, &attr, mask).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::QuerySrq(srq) => {
                Self::own(&self.srqs, srq.0)?;
                VerbOk::SrqAttr(dev.query_srq(srq).map_err(errno)?)
            }
            VerbCall::PostSrqRecv { srq, wr } => {
                Self::own(&self.srqs, srq.0)?;
                dev.post_srq_recv(srq, wr).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::PostSend { qpn, mut wrs, all } => {
                Self::own(&self.qps, qpn.value())?;
                if all {
                    dev.post_send_all(qpn, wrs).map_err(errno)?;
                } else {
                    let wr = wrs.pop().filter(|_| wrs.is_empty()).ok_or(libc::EINVAL)?;
                    dev.post_send(qpn, wr).map_err(errno)?;
                }
                VerbOk::Done
            }
            VerbCall::PostRecv { qpn, wr } => {
                Self::own(&self.qps, qpn.value())?;
                dev.post_recv(qpn, wr).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::Subscribe => {
                let (token, _) = self.subscription();
                VerbOk::Token(token)
            }
            VerbCall::TakeEvents { max } => {
                let Some((_, q)) = &self.sub else {
                    return Err(libc::EINVAL);
                };
                let mut st = q.lock();
                let mut out = Vec::new();
                while out.len() < max.min(verbs::MAX_EVENTS) as usize {
                    let Some(e) = st.events.pop_front() else {
                        break;
                    };
                    // Every subscriber sees every event of the device: keep only ours.
                    if self.owns_event(&e) {
                        out.push(e);
                    }
                }
                VerbOk::Events(out)
            }
            // Served by `run` as the first request of a connection of its own.
            VerbCall::Doorbell { .. } => return Err(libc::EINVAL),
            VerbCall::CmEnable => {
                dev.cm_enable().map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::CmListen { port, ud } => {
                let (token, _) = self.subscription();
                let sid = if ud {
                    dev.cm_listen_ud(port)
                } else {
                    dev.cm_listen(port)
                }
                .map_err(errno)?;
                self.cm().listens.insert(sid.0, token);
                VerbOk::Service(sid)
            }
            VerbCall::CmUnlisten { port, ud } => {
                let sid = crate::ibcm::ServiceId::rdma_cm(
                    if ud {
                        crate::ibcm::PortSpace::Udp
                    } else {
                        crate::ibcm::PortSpace::Tcp
                    },
                    port,
                );
                let token = self.subscription().0;
                if self.cm().listens.get(&sid.0) != Some(&token) {
                    // Another program's listen, or none: unknown here.
                    return Ok(VerbOk::Bool(false));
                }
                let was = if ud {
                    dev.cm_unlisten_ud(port)
                } else {
                    dev.cm_unlisten(port)
                }
                .map_err(errno)?;
                self.cm().listens.remove(&sid.0);
                VerbOk::Bool(was)
            }
            VerbCall::CmConnect(c) => {
                Self::own(&self.qps, c.qpn.value())?;
                let (token, _) = self.subscription();
                // The owner is recorded before any event of the connection can be routed: the
                // CM event thread waits for this lock.
                let mut cm = self
                    .engine
                    .cm
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let id = dev.cm_connect(&c).map_err(errno)?;
                cm.comms.insert(id.0, token);
                VerbOk::Comm(id)
            }
            VerbCall::CmAccept { id, accept } => {
                self.own_comm(id)?;
                Self::own(&self.qps, accept.qpn.value())?;
                dev.cm_accept(id, &accept).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::CmReject { id, private_data } => {
                self.own_comm(id)?;
                dev.cm_reject(id, &private_data).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::CmReady { id, private_data } => {
                self.own_comm(id)?;
                dev.cm_ready(id, &private_data).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::CmDisconnect { id, private_data } => {
                self.own_comm(id)?;
                dev.cm_disconnect(id, &private_data).map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::CmDestroy(id) => {
                self.own_comm(id)?;
                dev.cm_destroy(id).map_err(errno)?;
                self.cm().comms.remove(&id.0);
                VerbOk::Done
            }
            VerbCall::CmState(id) => {
                self.own_comm(id)?;
                VerbOk::CmState(dev.cm_state(id))
            }
            VerbCall::CmSidrRequest {
                dest,
                port,
                src_port,
                private_data,
            } => {
                let (token, _) = self.subscription();
                let mut cm = self
                    .engine
                    .cm
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let id = dev
                    .cm_sidr_request(dest, port, src_port, &private_data)
                    .map_err(errno)?;
                cm.comms.insert(id.0, token);
                VerbOk::Comm(id)
            }
            VerbCall::CmSidrReply {
                id,
                status,
                qpn,
                qkey,
                private_data,
            } => {
                self.own_comm(id)?;
                Self::own(&self.qps, qpn.value())?;
                dev.cm_sidr_reply(id, status, qpn, qkey, &private_data)
                    .map_err(errno)?;
                VerbOk::Done
            }
            VerbCall::TakeCmEvents { max } => {
                let Some((_, q)) = &self.sub else {
                    return Err(libc::EINVAL);
                };
                let mut st = q.lock();
                let n = st.cm_events.len().min(max.min(verbs::MAX_EVENTS) as usize);
                VerbOk::CmEvents(st.cm_events.drain(..n).collect())
            }
        })
    }

    /// `ibv_alloc_pd` for this connection: the PD becomes its own. The object verbs below
    /// serve both the step-1 requests and the library's [`VerbCall`]s.
    fn alloc_pd(&mut self) -> Result<PdId, i32> {
        let pd = self.engine.dev.alloc_pd().map_err(|e| e.errno())?;
        self.pds.insert(pd.0);
        Ok(pd)
    }

    /// `ibv_dealloc_pd` of one of this connection's PDs.
    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), i32> {
        Self::own(&self.pds, pd.0)?;
        self.engine.dev.dealloc_pd(pd).map_err(|e| e.errno())?;
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// `ibv_create_cq` of `depth` (at least 1) entries.
    fn create_cq(&mut self, depth: u32) -> Result<CqId, i32> {
        if depth == 0 {
            return Err(libc::EINVAL);
        }
        let d = usize::try_from(depth).map_err(|_| libc::EINVAL)?;
        let cq = self.engine.dev.create_cq(d).map_err(|e| e.errno())?;
        self.cqs.insert(cq.0);
        Ok(cq)
    }

    /// `ibv_destroy_cq` of one of this connection's CQs.
    fn destroy_cq(&mut self, cq: CqId) -> Result<(), i32> {
        Self::own(&self.cqs, cq.0)?;
        self.engine.dev.destroy_cq(cq).map_err(|e| e.errno())?;
        self.cqs.remove(&cq.0);
        Ok(())
    }

    /// `ibv_create_qp` on this connection's PD, CQs and SRQ.
    fn create_qp(&mut self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, i32> {
        Self::own(&self.pds, init.pd.0)?;
        Self::own(&self.cqs, init.send_cq.0)?;
        Self::own(&self.cqs, init.recv_cq.0)?;
        if let Some(s) = srq {
            Self::own(&self.srqs, s.0)?;
        }
        let qpn = self
            .engine
            .dev
            .create_qp_with_srq(init, srq)
            .map_err(|e| e.errno())?;
        self.qps.insert(qpn.value());
        Ok(qpn)
    }

    /// `ibv_destroy_qp` of one of this connection's QPs.
    fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), i32> {
        Self::own(&self.qps, qpn.value())?;
        self.engine.dev.destroy_qp(qpn).map_err(|e| e.errno())?;
        self.qps.remove(&qpn.value());
        Ok(())
    }

    /// `ibv_reg_mr_iova2` of `len` bytes at `addr` in the program, reached through its
    /// `/proc/PID/mem` (`EACCES` without one, `EFAULT` over a hole, as `ibv_reg_mr`).
    fn reg_mr(
        &mut self,
        pd: PdId,
        addr: u64,
        len: u64,
        iova: u64,
        access: crate::transport::Access,
    ) -> Result<crate::transport::MrInfo, i32> {
        Self::own(&self.pds, pd.0)?;
        let space = self.space.clone().ok_or(libc::EACCES)?;
        let mem = ProcessMem::new(space, addr, len).ok_or(libc::EINVAL)?;
        if !mem.reachable() {
            return Err(libc::EFAULT);
        }
        let info = self
            .engine
            .dev
            .reg_mr_iova(pd, Memory::External(Box::new(mem)), iova, access)
            .map_err(|e| e.errno())?;
        self.mrs.insert(info.lkey.value());
        Ok(info)
    }

    /// `ibv_dereg_mr` of one of this connection's regions.
    fn dereg_mr(&mut self, lkey: LKey) -> Result<(), i32> {
        Self::own(&self.mrs, lkey.value())?;
        self.engine.dev.dereg_mr(lkey).map_err(|e| e.errno())?;
        self.mrs.remove(&lkey.value());
        Ok(())
    }

    /// The engine's CM owners, locked.
    fn cm(&self) -> std::sync::MutexGuard<'_, CmOwners> {
        self.engine
            .cm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `EINVAL` unless CM connection `id` is this connection's.
    fn own_comm(&self, id: crate::api::CommId) -> Result<(), i32> {
        let mine = self.sub.as_ref().map(|(t, _)| *t);
        match (mine, self.cm().comms.get(&id.0)) {
            (Some(t), Some(&o)) if t == o => Ok(()),
            _ => Err(libc::EINVAL),
        }
    }

    /// This connection's subscription, made on first use: its token and event queue.
    fn subscription(&mut self) -> (u64, Arc<EventQueue>) {
        if let Some((t, q)) = &self.sub {
            return (*t, Arc::clone(q));
        }
        let q = Arc::new(EventQueue::default());
        let mut subs = self
            .engine
            .subs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let token = loop {
            // RandomState's keys come from the OS's randomness, fresh for each state.
            let t = std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                subs.len(),
            );
            if t != 0 && !subs.contains_key(&t) {
                break t;
            }
        };
        subs.insert(token, Arc::clone(&q));
        drop(subs);
        self.sub = Some((token, Arc::clone(&q)));
        (token, q)
    }

    /// Whether event `e` is about an object of this connection.
    fn owns_event(&self, e: &crate::api::Event) -> bool {
        use crate::api::Event as E;
        match *e {
            E::CqNotify { cq } | E::CqOverflow { cq } => self.cqs.contains(&cq.0),
            E::SrqLimitReached { srq } => self.srqs.contains(&srq.0),
            E::QpFatal { qpn, .. }
            | E::SqDrained { qpn }
            | E::QpLastWqeReached { qpn }
            | E::CommEstablished { qpn } => self.qps.contains(&qpn.value()),
        }
    }

    /// Serves a doorbell connection ([`VerbCall::Doorbell`]): answers the request of `seq`,
    /// then writes one byte to `stream` whenever the subscription of `token` has new events
    /// (CM events with `cm`),
    /// until that subscription's connection closes, this one breaks, or the engine stops.
    /// A token nobody holds is answered `EINVAL`.
    fn doorbell(&self, mut stream: UnixStream, seq: u32, kind: u8, token: u64, cm: bool) {
        let q = self
            .engine
            .subs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&token)
            .cloned();
        let mut out = Vec::new();
        let Some(q) = q else {
            proto::encode_reply(&mut out, seq, kind, &Reply::Err(libc::EINVAL));
            let _ = stream.write_all(&out);
            return;
        };
        // One doorbell of each kind per subscription: the places kept for doorbells at the
        // limit count on it.
        let taken = {
            let mut st = q.lock();
            let flag = if cm {
                &mut st.cm_belled
            } else {
                &mut st.belled
            };
            std::mem::replace(flag, true)
        };
        if taken {
            proto::encode_reply(&mut out, seq, kind, &Reply::Err(libc::EBUSY));
            let _ = stream.write_all(&out);
            return;
        }
        let Ok(done) = verbs::encode(&VerbOk::Done) else {
            return;
        };
        proto::encode_reply(&mut out, seq, kind, &Reply::Ok(Value::Verb(done)));
        if stream.write_all(&out).is_err() {
            return;
        }
        let _ = stream.set_nonblocking(true);
        let mut rung = 0;
        let mut st = q.lock();
        loop {
            if st.closed || self.engine.stop.load(Ordering::SeqCst) {
                break;
            }
            let pushed = if cm { st.cm_pushed } else { st.pushed };
            if pushed != rung {
                rung = pushed;
                drop(st);
                // A full socket already holds a ring the program has not read.
                match stream.write(&[1]) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => {
                        st = q.lock();
                        break;
                    }
                }
                st = q.lock();
                continue;
            }
            st = q
                .rung
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that runs gets its own memory; one that connected and exited before the engine
    /// looked gets none. (What the pidfd adds, a pid reused by another process between the
    /// peer's exit and the open, cannot be staged here: an exited peer's own file no longer
    /// opens, zombie or reaped.)
    #[test]
    fn a_peer_gone_before_it_is_served_gets_no_memory() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(peer_space(&a, me).is_some(), "this process runs");

        let path =
            std::env::temp_dir().join(format!("roce-peer-space-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).expect("bind");
        // perl (Debian's perl-base, always there) connects and exits at once; it stays a
        // zombie, its pid taken, until it is reaped below.
        let mut child = std::process::Command::new("perl")
            .args([
                "-MIO::Socket::UNIX",
                "-e",
                "IO::Socket::UNIX->new(Peer => $ARGV[0]) or die \"connect: $!\"",
            ])
            .arg(&path)
            .spawn()
            .expect("perl");
        let (s, _) = l.accept().expect("accept");
        let _ = std::fs::remove_file(&path);
        let pid = getsockopt(&s, PeerCredentials).expect("SO_PEERCRED").pid();
        assert_eq!(u32::try_from(pid).ok(), Some(child.id()));
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        }) {
            assert!(t0.elapsed().as_secs() < 10, "the peer never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            peer_space(&s, pid).is_none(),
            "an exited peer gets no memory"
        );
        assert!(child.wait().expect("reap").success(), "the peer connected");
    }
}
