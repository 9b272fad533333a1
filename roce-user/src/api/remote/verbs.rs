//! The drop-in libibverbs' verbs through `roce engine` (docs/multiprocess.md, step 2): each is
//! a [`VerbCall`] in the body of a [`Request::Verb`](super::proto::Request::Verb) frame,
//! answered by a [`VerbOk`] or an errno, and [`SharedDevice`] is the [`VerbsDevice`] that
//! speaks them.
//!
//! The calls carry the transport's own types (work requests, QP attributes, completions) in
//! postcard's encoding: a body that does not decode into a [`VerbCall`], or leaves bytes over,
//! is refused with `EPROTO`; values inside are then checked by the engine's device exactly as
//! a program's arguments are in process (24-bit quantities are masked as they are read).
//! Registered memory is named by its address in the program, which the engine reaches through
//! the program's `/proc/PID/mem` ([`super::memory`]).
//!
//! Events (completion events of armed CQs, asynchronous events) are queued by the engine, for
//! each program that subscribed ([`VerbCall::Subscribe`]), and rung on a doorbell: a second
//! connection of the program, opened with [`VerbCall::Doorbell`] and the token the subscription
//! returned, on which the engine writes a byte whenever events were queued. The program waits
//! for the socket to become readable and takes its events with [`VerbCall::TakeEvents`] on its
//! verb connection, which hands over only events of its own objects.

use std::{
    collections::VecDeque,
    io::Read as _,
    os::{fd::AsFd as _, unix::net::UnixStream},
    path::PathBuf,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde::{Deserialize, Serialize};

use super::{EngineClient, RUN_DIR, RemoteError, proto::ProtoError};
use core::net::IpAddr;

use crate::{
    api::{
        Access, ApiError, AttrMask, BindMw, CmAccept, CmConnect, CmDevice, CmEvent, CmState,
        CommId, CqId, Event, LKey, MrInfo, MwType, Path, PdId, QpAttr, QpInit, QpState, QpType,
        Qpn, RKey, RawMem, RecvWr, SendFlags, SendWr, SrqAttr, SrqAttrMask, SrqId, VerbsDevice, Wc,
    },
    ibcm::{ServiceId, SidrStatus},
    transport::QKey,
};

/// The most completions one [`VerbCall::PollCq`] returns.
pub const MAX_POLL: u32 = 64;
/// The most events one [`VerbCall::TakeEvents`] returns.
pub const MAX_EVENTS: u32 = 64;

/// A verb of the drop-in libibverbs, as a program asks the engine for it. Objects are named
/// by the engine's ids; each must be the asking connection's own (`EINVAL` otherwise).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum VerbCall {
    /// [`VerbsDevice::max_path_mtu`].
    MaxPathMtu {
        /// Towards an IPv6 peer.
        ipv6: bool,
    },
    /// [`VerbsDevice::path_to`].
    PathTo {
        /// The local GID.
        gid_index: u32,
        /// The peer's GID.
        remote_gid: [u8; 16],
        /// The QP that will use it.
        local_qpn: Qpn,
        /// The peer's QP.
        remote_qpn: Qpn,
    },
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd(PdId),
    /// `ibv_reg_mr_iova2` over `len` bytes at `addr` in the program.
    RegMr {
        /// The PD.
        pd: PdId,
        /// The region's address in the program.
        addr: u64,
        /// Its length.
        len: u64,
        /// The address peers and SGEs name its first byte by.
        iova: u64,
        /// Access flags.
        access: Access,
    },
    /// `ibv_dereg_mr`.
    DeregMr(LKey),
    /// `ibv_alloc_mw`.
    AllocMw {
        /// The PD.
        pd: PdId,
        /// Type 1 or 2.
        ty: MwType,
    },
    /// `ibv_dealloc_mw`.
    DeallocMw {
        /// The PD.
        pd: PdId,
        /// The window.
        rkey: RKey,
    },
    /// `ibv_bind_mw`.
    BindMw {
        /// Through this QP.
        qpn: Qpn,
        /// The completion's id.
        wr_id: u64,
        /// Send flags.
        flags: SendFlags,
        /// What to bind.
        bind: BindMw,
    },
    /// `ibv_create_cq`.
    CreateCq {
        /// Entries.
        depth: u32,
    },
    /// `ibv_destroy_cq`.
    DestroyCq(CqId),
    /// `ibv_req_notify_cq`.
    ReqNotifyCq {
        /// The CQ.
        cq: CqId,
        /// Solicited completions only.
        solicited_only: bool,
    },
    /// `ibv_poll_cq` of at most `max` (at most [`MAX_POLL`]) completions.
    PollCq {
        /// The CQ.
        cq: CqId,
        /// How many at most.
        max: u32,
    },
    /// `ibv_create_qp`.
    CreateQp {
        /// PD, CQs, type and capabilities.
        init: QpInit,
        /// The SRQ its receives come from.
        srq: Option<SrqId>,
    },
    /// `ibv_destroy_qp`.
    DestroyQp(Qpn),
    /// `ibv_modify_qp`.
    ModifyQp {
        /// The QP.
        qpn: Qpn,
        /// The attributes.
        attr: Box<QpAttr<Path>>,
        /// Which of them.
        mask: AttrMask,
    },
    /// `ibv_query_qp`.
    QueryQp(Qpn),
    /// `ibv_create_srq`.
    CreateSrq {
        /// The PD.
        pd: PdId,
        /// Its attributes.
        attr: SrqAttr,
    },
    /// `ibv_destroy_srq`.
    DestroySrq(SrqId),
    /// `ibv_modify_srq`.
    ModifySrq {
        /// The SRQ.
        srq: SrqId,
        /// The attributes.
        attr: SrqAttr,
        /// Which of them.
        mask: SrqAttrMask,
    },
    /// `ibv_query_srq`.
    QuerySrq(SrqId),
    /// `ibv_post_srq_recv`.
    PostSrqRecv {
        /// The SRQ.
        srq: SrqId,
        /// The WR.
        wr: RecvWr,
    },
    /// `ibv_post_send`: one WR, or (`all`) a list posted all or none.
    PostSend {
        /// The QP.
        qpn: Qpn,
        /// The WRs.
        wrs: Vec<SendWr<Path>>,
        /// All or none ([`VerbsDevice::post_send_all`]).
        all: bool,
    },
    /// `ibv_post_recv`.
    PostRecv {
        /// The QP.
        qpn: Qpn,
        /// The WR.
        wr: RecvWr,
    },
    /// Asks for this connection's events; returns the token of [`VerbCall::Doorbell`].
    Subscribe,
    /// Turns a new connection into the doorbell of the connection whose subscription returned
    /// `token`: the first and only request on it. The reply is [`VerbOk::Done`], then one byte
    /// whenever that connection has events queued (`cm`: CM events, else the others).
    Doorbell {
        /// From [`VerbOk::Token`].
        token: u64,
        /// Ring for CM events ([`VerbCall::TakeCmEvents`]) instead of the device's.
        cm: bool,
    },
    /// [`CmDevice::cm_enable`].
    CmEnable,
    /// [`CmDevice::cm_listen`]: REQs (or SIDR REQs, `ud`) for the port come to this
    /// connection.
    CmListen {
        /// The port.
        port: u16,
        /// UDP port space (SIDR) rather than TCP.
        ud: bool,
    },
    /// [`CmDevice::cm_unlisten`].
    CmUnlisten {
        /// The port.
        port: u16,
        /// UDP port space.
        ud: bool,
    },
    /// [`CmDevice::cm_connect`] (its QP must be this connection's).
    CmConnect(Box<CmConnect>),
    /// [`CmDevice::cm_accept`] (its QP must be this connection's).
    CmAccept {
        /// The connection.
        id: CommId,
        /// How.
        accept: Box<CmAccept>,
    },
    /// [`CmDevice::cm_reject`].
    CmReject {
        /// The connection.
        id: CommId,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// [`CmDevice::cm_ready`].
    CmReady {
        /// The connection.
        id: CommId,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// [`CmDevice::cm_disconnect`].
    CmDisconnect {
        /// The connection.
        id: CommId,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// [`CmDevice::cm_destroy`].
    CmDestroy(CommId),
    /// [`CmDevice::cm_state`].
    CmState(CommId),
    /// [`CmDevice::cm_sidr_request`].
    CmSidrRequest {
        /// The peer.
        dest: IpAddr,
        /// Its port.
        port: u16,
        /// Our port.
        src_port: u16,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// [`CmDevice::cm_sidr_reply`] (its QP must be this connection's).
    CmSidrReply {
        /// The request.
        id: CommId,
        /// The answer.
        status: SidrStatus,
        /// The UD QP.
        qpn: Qpn,
        /// Its Q_Key.
        qkey: QKey,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// Takes up to `max` (at most [`MAX_EVENTS`]) queued CM events of this connection's
    /// listens and connections.
    TakeCmEvents {
        /// How many at most.
        max: u32,
    },
    /// Takes up to `max` (at most [`MAX_EVENTS`]) queued events of this connection's objects.
    TakeEvents {
        /// How many at most.
        max: u32,
    },
}

impl VerbCall {
    /// The verb's name, for error messages.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::MaxPathMtu { .. } => "max_path_mtu",
            Self::PathTo { .. } => "path_to",
            Self::AllocPd => "alloc_pd",
            Self::DeallocPd(_) => "dealloc_pd",
            Self::RegMr { .. } => "reg_mr",
            Self::DeregMr(_) => "dereg_mr",
            Self::AllocMw { .. } => "alloc_mw",
            Self::DeallocMw { .. } => "dealloc_mw",
            Self::BindMw { .. } => "bind_mw",
            Self::CreateCq { .. } => "create_cq",
            Self::DestroyCq(_) => "destroy_cq",
            Self::ReqNotifyCq { .. } => "req_notify_cq",
            Self::PollCq { .. } => "poll_cq",
            Self::CreateQp { .. } => "create_qp",
            Self::DestroyQp(_) => "destroy_qp",
            Self::ModifyQp { .. } => "modify_qp",
            Self::QueryQp(_) => "query_qp",
            Self::CreateSrq { .. } => "create_srq",
            Self::DestroySrq(_) => "destroy_srq",
            Self::ModifySrq { .. } => "modify_srq",
            Self::QuerySrq(_) => "query_srq",
            Self::PostSrqRecv { .. } => "post_srq_recv",
            Self::PostSend { .. } => "post_send",
            Self::PostRecv { .. } => "post_recv",
            Self::Subscribe => "subscribe",
            Self::Doorbell { .. } => "doorbell",
            Self::CmEnable => "cm_enable",
            Self::CmListen { .. } => "cm_listen",
            Self::CmUnlisten { .. } => "cm_unlisten",
            Self::CmConnect(_) => "cm_connect",
            Self::CmAccept { .. } => "cm_accept",
            Self::CmReject { .. } => "cm_reject",
            Self::CmReady { .. } => "cm_ready",
            Self::CmDisconnect { .. } => "cm_disconnect",
            Self::CmDestroy(_) => "cm_destroy",
            Self::CmState(_) => "cm_state",
            Self::CmSidrRequest { .. } => "cm_sidr_request",
            Self::CmSidrReply { .. } => "cm_sidr_reply",
            Self::TakeCmEvents { .. } => "take_cm_events",
            Self::TakeEvents { .. } => "take_events",
        }
    }
}

/// What a [`VerbCall`] that succeeded returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum VerbOk {
    /// Nothing to return.
    Done,
    /// A path MTU in bytes.
    Mtu(u32),
    /// An address vector.
    Path(Box<Path>),
    /// A new PD.
    Pd(PdId),
    /// A new region's keys.
    Mr(MrInfo),
    /// A window's key.
    RKey(RKey),
    /// A new CQ.
    Cq(CqId),
    /// Completions.
    Wcs(Vec<Wc>),
    /// A new QP.
    Qp(Qpn),
    /// A QP's type, state and attributes (`None`: no such QP).
    QpQuery(Option<Box<(QpType, QpState, QpAttr<Path>)>>),
    /// A new SRQ.
    Srq(SrqId),
    /// An SRQ's attributes.
    SrqAttr(SrqAttr),
    /// Events.
    Events(Vec<Event>),
    /// The token of a subscription.
    Token(u64),
    /// A CM connection.
    Comm(CommId),
    /// A listen's service ID.
    Service(ServiceId),
    /// A yes or no.
    Bool(bool),
    /// A CM connection's state (`None`: no such connection).
    CmState(Option<CmState>),
    /// CM events.
    CmEvents(Vec<CmEvent>),
}

/// The postcard bytes of `v`.
///
/// # Errors
/// `EMSGSIZE` when they would not fit in a frame.
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, ProtoError> {
    let bytes = postcard::to_allocvec(v).map_err(|_| ProtoError::Encoding)?;
    if bytes.len() > super::proto::MAX_VERB_BODY {
        return Err(ProtoError::TooLong(
            u32::try_from(bytes.len()).unwrap_or(u32::MAX),
        ));
    }
    Ok(bytes)
}

/// Decodes a whole body as a `T`: refused when it does not decode or leaves bytes over.
///
/// # Errors
/// [`ProtoError::Encoding`].
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtoError> {
    match postcard::take_from_bytes(body) {
        Ok((v, [])) => Ok(v),
        _ => Err(ProtoError::Encoding),
    }
}

/// A device reached through the interface's `roce engine` ([`VerbsDevice`] over
/// [`VerbCall`]s): one connection, one verb at a time, and the event fd of
/// [`VerbCall::Subscribe`]. Every object made through it is released by the engine when the
/// device is dropped or the process dies.
#[derive(Debug)]
pub struct SharedDevice {
    client: Mutex<EngineClient>,
    /// The doorbell connection: readable when the engine has queued events for this device.
    doorbell: UnixStream,
    /// The doorbell of CM events.
    cm_doorbell: UnixStream,
    /// CM events taken from the engine and not handed out yet.
    cm_pending: Mutex<VecDeque<CmEvent>>,
    /// Events taken from the engine and not handed out yet.
    pending: Mutex<VecDeque<Event>>,
    ifname: String,
}

impl SharedDevice {
    /// Connects to the engine of `ifname` in this network namespace and subscribes to its
    /// events. Call it where a program would open the device in process.
    ///
    /// # Errors
    /// No engine serves `ifname` here (`ENOENT`/`ECONNREFUSED`), it refused this process, or
    /// speaks another version.
    pub fn connect(ifname: &str) -> Result<Self, RemoteError> {
        let mut client = EngineClient::connect(ifname)?;
        let token = match client.verb(&VerbCall::Subscribe)? {
            VerbOk::Token(t) => t,
            _ => {
                return Err(RemoteError::Local(
                    "engine answered subscribe without a token".into(),
                ));
            }
        };
        let bell = |cm: bool| -> Result<UnixStream, RemoteError> {
            let mut bell = EngineClient::connect(ifname)?;
            match bell.verb(&VerbCall::Doorbell { token, cm })? {
                VerbOk::Done => {}
                _ => return Err(RemoteError::Local("engine refused the doorbell".into())),
            }
            let stream = bell.into_stream();
            stream
                .set_nonblocking(true)
                .map_err(|source| RemoteError::Io {
                    path: PathBuf::from(RUN_DIR),
                    source,
                })?;
            Ok(stream)
        };
        Ok(Self {
            client: Mutex::new(client),
            doorbell: bell(false)?,
            cm_doorbell: bell(true)?,
            cm_pending: Mutex::new(VecDeque::new()),
            pending: Mutex::new(VecDeque::new()),
            ifname: ifname.to_owned(),
        })
    }

    /// The interface this device serves.
    #[must_use]
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn call(&self, call: &VerbCall) -> Result<VerbOk, ApiError> {
        let mut c = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(c.verb(call)?)
    }

    fn done(&self, call: &VerbCall) -> Result<(), ApiError> {
        match self.call(call)? {
            VerbOk::Done => Ok(()),
            _ => Err(unexpected(call)),
        }
    }
}

/// A reply that does not fit its call.
fn unexpected(call: &VerbCall) -> ApiError {
    ApiError::Remote(RemoteError::Local(format!(
        "engine answered {} with a value of another verb",
        call.name()
    )))
}

macro_rules! expect {
    ($self:ident, $call:expr, $pat:pat => $v:expr) => {{
        let call = $call;
        match $self.call(&call) {
            Ok($pat) => Ok($v),
            Ok(_) => Err(unexpected(&call)),
            Err(e) => Err(e),
        }
    }};
}

impl VerbsDevice for SharedDevice {
    fn max_path_mtu(&self, ipv6: bool) -> u32 {
        // The smallest MTU code's bytes when the engine cannot be asked: the QP's modify then
        // fails in the engine with the reason.
        expect!(self, VerbCall::MaxPathMtu { ipv6 }, VerbOk::Mtu(m) => m).unwrap_or(256)
    }

    fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        local_qpn: Qpn,
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        let gid_index = u32::try_from(gid_index)
            .map_err(|_| ApiError::Remote(RemoteError::Local("GID index out of range".into())))?;
        expect!(self, VerbCall::PathTo { gid_index, remote_gid: *remote_gid, local_qpn, remote_qpn },
            VerbOk::Path(p) => *p)
    }

    fn alloc_pd(&self) -> Result<PdId, ApiError> {
        expect!(self, VerbCall::AllocPd, VerbOk::Pd(p) => p)
    }

    fn dealloc_pd(&self, pd: PdId) -> Result<(), ApiError> {
        self.done(&VerbCall::DeallocPd(pd))
    }

    fn reg_mr(&self, pd: PdId, mem: RawMem, iova: u64, access: Access) -> Result<MrInfo, ApiError> {
        expect!(self, VerbCall::RegMr { pd, addr: mem.addr(), len: mem.len() as u64, iova, access },
            VerbOk::Mr(m) => m)
    }

    fn dereg_mr(&self, lkey: LKey) -> Result<(), ApiError> {
        self.done(&VerbCall::DeregMr(lkey))
    }

    fn alloc_mw(&self, pd: PdId, ty: MwType) -> Result<RKey, ApiError> {
        expect!(self, VerbCall::AllocMw { pd, ty }, VerbOk::RKey(k) => k)
    }

    fn dealloc_mw(&self, pd: PdId, rkey: RKey) -> Result<(), ApiError> {
        self.done(&VerbCall::DeallocMw { pd, rkey })
    }

    fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        bind: BindMw,
    ) -> Result<RKey, ApiError> {
        expect!(self, VerbCall::BindMw { qpn, wr_id, flags, bind }, VerbOk::RKey(k) => k)
    }

    fn create_cq(&self, depth: usize) -> Result<CqId, ApiError> {
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        expect!(self, VerbCall::CreateCq { depth }, VerbOk::Cq(c) => c)
    }

    fn destroy_cq(&self, cq: CqId) -> Result<(), ApiError> {
        self.done(&VerbCall::DestroyCq(cq))
    }

    fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<(), ApiError> {
        self.done(&VerbCall::ReqNotifyCq { cq, solicited_only })
    }

    fn poll_cq(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, ApiError> {
        let max = u32::try_from(out.len()).unwrap_or(u32::MAX).min(MAX_POLL);
        if max == 0 {
            return Ok(0);
        }
        let wcs = expect!(self, VerbCall::PollCq { cq, max }, VerbOk::Wcs(w) => w)?;
        if wcs.len() > out.len() {
            return Err(unexpected(&VerbCall::PollCq { cq, max }));
        }
        out[..wcs.len()].copy_from_slice(&wcs);
        Ok(wcs.len())
    }

    fn create_qp(&self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, ApiError> {
        expect!(self, VerbCall::CreateQp { init, srq }, VerbOk::Qp(q) => q)
    }

    fn destroy_qp(&self, qpn: Qpn) -> Result<(), ApiError> {
        self.done(&VerbCall::DestroyQp(qpn))
    }

    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError> {
        self.done(&VerbCall::ModifyQp {
            qpn,
            attr: Box::new(attr.clone()),
            mask,
        })
    }

    fn query_qp(&self, qpn: Qpn) -> Result<Option<(QpType, QpState, QpAttr<Path>)>, ApiError> {
        expect!(self, VerbCall::QueryQp(qpn), VerbOk::QpQuery(q) => q.map(|b| *b))
    }

    fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<SrqId, ApiError> {
        expect!(self, VerbCall::CreateSrq { pd, attr }, VerbOk::Srq(s) => s)
    }

    fn destroy_srq(&self, srq: SrqId) -> Result<(), ApiError> {
        self.done(&VerbCall::DestroySrq(srq))
    }

    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), ApiError> {
        self.done(&VerbCall::ModifySrq {
            srq,
            attr: *attr,
            mask,
        })
    }

    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, ApiError> {
        expect!(self, VerbCall::QuerySrq(srq), VerbOk::SrqAttr(a) => a)
    }

    fn post_srq_recv(&self, srq: SrqId, wr: RecvWr) -> Result<(), ApiError> {
        self.done(&VerbCall::PostSrqRecv { srq, wr })
    }

    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError> {
        self.done(&VerbCall::PostSend {
            qpn,
            wrs: vec![wr],
            all: false,
        })
    }

    fn post_send_all(&self, qpn: Qpn, wrs: Vec<SendWr<Path>>) -> Result<(), ApiError> {
        self.done(&VerbCall::PostSend {
            qpn,
            wrs,
            all: true,
        })
    }

    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError> {
        self.done(&VerbCall::PostRecv { qpn, wr })
    }

    fn wait_event(&self, timeout: Duration) -> Option<Event> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.is_empty()
            && wait_ring(&self.doorbell, timeout)
            && let Ok(events) = expect!(self, VerbCall::TakeEvents { max: MAX_EVENTS },
                VerbOk::Events(e) => e)
        {
            pending.extend(events);
        }
        pending.pop_front()
    }
}

/// Waits up to `timeout` for `bell` to ring; drains what rang. Then take what is queued: an
/// event queued after the take rings again.
fn wait_ring(bell: &UnixStream, timeout: Duration) -> bool {
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(bell.as_fd(), PollFlags::POLLIN)];
    if !matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0) {
        return false;
    }
    let mut ring = [0u8; 64];
    while matches!((&*bell).read(&mut ring), Ok(n) if n > 0) {}
    true
}

impl CmDevice for SharedDevice {
    fn cm_enable(&self) -> Result<(), ApiError> {
        self.done(&VerbCall::CmEnable)
    }

    fn cm_listen(&self, port: u16, ud: bool) -> Result<ServiceId, ApiError> {
        expect!(self, VerbCall::CmListen { port, ud }, VerbOk::Service(s) => s)
    }

    fn cm_unlisten(&self, port: u16, ud: bool) -> Result<bool, ApiError> {
        expect!(self, VerbCall::CmUnlisten { port, ud }, VerbOk::Bool(b) => b)
    }

    fn cm_connect(&self, c: &CmConnect) -> Result<CommId, ApiError> {
        expect!(self, VerbCall::CmConnect(Box::new(c.clone())), VerbOk::Comm(id) => id)
    }

    fn cm_accept(&self, id: CommId, a: &CmAccept) -> Result<(), ApiError> {
        self.done(&VerbCall::CmAccept {
            id,
            accept: Box::new(a.clone()),
        })
    }

    fn cm_reject(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        self.done(&VerbCall::CmReject {
            id,
            private_data: private_data.to_vec(),
        })
    }

    fn cm_ready(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        self.done(&VerbCall::CmReady {
            id,
            private_data: private_data.to_vec(),
        })
    }

    fn cm_disconnect(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        self.done(&VerbCall::CmDisconnect {
            id,
            private_data: private_data.to_vec(),
        })
    }

    fn cm_destroy(&self, id: CommId) -> Result<(), ApiError> {
        self.done(&VerbCall::CmDestroy(id))
    }

    fn cm_state(&self, id: CommId) -> Option<CmState> {
        expect!(self, VerbCall::CmState(id), VerbOk::CmState(s) => s)
            .ok()
            .flatten()
    }

    fn cm_sidr_request(
        &self,
        dest: IpAddr,
        port: u16,
        src_port: u16,
        private_data: &[u8],
    ) -> Result<CommId, ApiError> {
        expect!(self, VerbCall::CmSidrRequest { dest, port, src_port, private_data: private_data.to_vec() },
            VerbOk::Comm(id) => id)
    }

    fn cm_sidr_reply(
        &self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), ApiError> {
        self.done(&VerbCall::CmSidrReply {
            id,
            status,
            qpn,
            qkey,
            private_data: private_data.to_vec(),
        })
    }

    fn wait_cm_event(&self, timeout: Duration) -> Option<CmEvent> {
        let mut pending = self
            .cm_pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if pending.is_empty()
            && wait_ring(&self.cm_doorbell, timeout)
            && let Ok(events) = expect!(self, VerbCall::TakeCmEvents { max: MAX_EVENTS },
                VerbOk::CmEvents(e) => e)
        {
            pending.extend(events);
        }
        pending.pop_front()
    }
}

impl EngineClient {
    /// Sends `call` and returns its result.
    ///
    /// # Errors
    /// The engine refused it (its errno), or the connection broke.
    pub fn verb(&mut self, call: &VerbCall) -> Result<VerbOk, RemoteError> {
        let body = encode(call)?;
        match self.call(call.name(), &super::proto::Request::Verb(body))? {
            super::proto::Value::Verb(bytes) => Ok(decode(&bytes)?),
            _ => Err(self.unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::api::{QpCap, Sge};

    fn calls() -> Vec<VerbCall> {
        let wr = SendWr::<Path>::send(
            7,
            vec![Sge {
                addr: 0x1000,
                length: 64,
                lkey: LKey::new(0x0102_0304),
            }],
        );
        vec![
            VerbCall::AllocPd,
            VerbCall::RegMr {
                pd: PdId(3),
                addr: 0x7fff_0000,
                len: 4096,
                iova: 0,
                access: Access::LOCAL_WRITE | Access::REMOTE_READ,
            },
            VerbCall::CreateQp {
                init: QpInit {
                    pd: PdId(1),
                    qp_type: QpType::Rc,
                    send_cq: CqId(2),
                    recv_cq: CqId(3),
                    cap: QpCap {
                        max_send_wr: 16,
                        max_recv_wr: 16,
                        max_sge: 2,
                        max_inline_data: 64,
                    },
                    sq_sig_all: true,
                },
                srq: Some(SrqId(4)),
            },
            VerbCall::PostSend {
                qpn: Qpn::new(0x11),
                wrs: vec![wr.clone(), wr],
                all: true,
            },
            VerbCall::PollCq {
                cq: CqId(9),
                max: 16,
            },
            VerbCall::Doorbell {
                token: u64::MAX,
                cm: true,
            },
        ]
    }

    /// Every call comes back as it was sent (compared by its debug form: the transport's types
    /// have no equality of their own).
    #[test]
    fn calls_round_trip() {
        for c in calls() {
            let bytes = encode(&c).expect("encodes");
            let back: VerbCall = decode(&bytes).expect("decodes");
            assert_eq!(format!("{c:?}"), format!("{back:?}"));
        }
    }

    /// A body with a byte more than its call, a truncated one, or an unknown verb is refused
    /// with `EPROTO`.
    #[test]
    fn extra_missing_or_unknown_bytes_are_refused() {
        let mut bytes = encode(&VerbCall::AllocPd).expect("encodes");
        bytes.push(0);
        assert_eq!(
            decode::<VerbCall>(&bytes).unwrap_err().errno(),
            libc::EPROTO
        );
        let full = encode(&calls()[2]).expect("encodes");
        assert!(decode::<VerbCall>(&full[..full.len() - 1]).is_err());
        assert!(decode::<VerbCall>(&[200]).is_err());
        assert!(decode::<VerbCall>(&[]).is_err());
    }

    /// A QPN or PSN read from a peer's bytes is masked to 24 bits, as built in process.
    #[test]
    fn quantities_are_masked_when_read() {
        let bytes = encode(&u32::MAX).expect("encodes");
        assert_eq!(decode::<Qpn>(&bytes).expect("decodes").value(), 0x00ff_ffff);
        assert_eq!(
            decode::<crate::api::Psn>(&bytes).expect("decodes").value(),
            0x00ff_ffff
        );
    }

    proptest! {
        /// Arbitrary bytes decode to a call that encodes again, or fail: never a panic.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(c) = decode::<VerbCall>(&body) {
                let again = encode(&c).expect("encodes");
                let back: VerbCall = decode(&again).expect("decodes");
                prop_assert_eq!(format!("{c:?}"), format!("{back:?}"));
            }
        }
    }
}
