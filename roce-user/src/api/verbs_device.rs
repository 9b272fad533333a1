//! [`VerbsDevice`]: every verb the drop-in libibverbs calls on a device, implemented by the
//! in-process [`Device`] and by [`crate::api::remote::SharedDevice`], a device reached
//! through the interface's `roce engine` process (docs/multiprocess.md). The library holds a
//! `dyn VerbsDevice`, so a program runs alone on the interface (in process, the data path it
//! always had) or beside other programs through the engine, without knowing which.
//!
//! [`crate::api::RdmaDevice`] is the narrower set `roce perf` uses; this one is libibverbs'
//! (UD and UC, SRQs, memory windows, `ibv_modify_qp` with any attribute mask, completion and
//! asynchronous events).

use core::net::IpAddr;
use std::time::Duration;

use super::{
    Access, ApiError, AttrMask, BindMw, CqId, Device, Event, LKey, MrInfo, MwType, Path, PdId,
    QpAttr, QpInit, QpState, QpType, Qpn, RKey, RawMem, RecvWr, SendFlags, SendWr, SrqAttr,
    SrqAttrMask, SrqId, Wc,
    cm::{CmAccept, CmConnect, CmEvent, CmState, CommId, ServiceId, SidrStatus},
};
use crate::transport::QKey;

/// The verbs of a device as libibverbs uses them. Each method is the [`Device`] method of the
/// same name (see its documentation for the rules and errnos); the differences are that
/// memory is registered as [`RawMem`] of the calling process, and that polling can fail (a
/// device behind an engine that went away).
pub trait VerbsDevice: Send + Sync + std::fmt::Debug {
    /// The largest path MTU in bytes a QP of this device can use towards an IPv4 or IPv6
    /// peer ([`Device::max_path_mtu`]).
    fn max_path_mtu(&self, ipv6: bool) -> u32;

    /// The address vector from GID `gid_index` to `remote_gid` for a QP `local_qpn` that
    /// talks to `remote_qpn` ([`Device::path_to`]): for `ibv_create_ah` and RTR.
    ///
    /// # Errors
    /// No such GID, no route, no neighbour.
    fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        local_qpn: Qpn,
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError>;

    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    /// Too many PDs.
    fn alloc_pd(&self) -> Result<PdId, ApiError>;
    /// `ibv_dealloc_pd`.
    ///
    /// # Errors
    /// Unknown or busy.
    fn dealloc_pd(&self, pd: PdId) -> Result<(), ApiError>;

    /// `ibv_reg_mr_iova2`: registers `mem`, memory of the calling process, with its first byte
    /// at `iova`.
    ///
    /// # Errors
    /// Unknown PD, bad access flags, the table is full, a hole in the range (through an
    /// engine).
    fn reg_mr(&self, pd: PdId, mem: RawMem, iova: u64, access: Access) -> Result<MrInfo, ApiError>;
    /// `ibv_dereg_mr`. No engine access reaches the region once it returns.
    ///
    /// # Errors
    /// Unknown key, or windows still bound to it.
    fn dereg_mr(&self, lkey: LKey) -> Result<(), ApiError>;

    /// `ibv_alloc_mw`.
    ///
    /// # Errors
    /// Unknown PD, the table is full.
    fn alloc_mw(&self, pd: PdId, ty: MwType) -> Result<RKey, ApiError>;
    /// `ibv_dealloc_mw`.
    ///
    /// # Errors
    /// Unknown window.
    fn dealloc_mw(&self, pd: PdId, rkey: RKey) -> Result<(), ApiError>;
    /// `ibv_bind_mw` of a type 1 window through `qpn`; returns the window's new key.
    ///
    /// # Errors
    /// As [`Device::bind_mw`].
    fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        bind: BindMw,
    ) -> Result<RKey, ApiError>;

    /// `ibv_create_cq` of `depth` entries.
    ///
    /// # Errors
    /// Too many or too deep.
    fn create_cq(&self, depth: usize) -> Result<CqId, ApiError>;
    /// `ibv_destroy_cq`.
    ///
    /// # Errors
    /// Unknown, or a QP still completes on it.
    fn destroy_cq(&self, cq: CqId) -> Result<(), ApiError>;
    /// `ibv_req_notify_cq`: the next completion queues an [`Event::CqNotify`].
    ///
    /// # Errors
    /// Unknown CQ.
    fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<(), ApiError>;
    /// `ibv_poll_cq`: fills the front of `out`, returns how many.
    ///
    /// # Errors
    /// The engine behind the device is gone (never in process: an unknown CQ polls empty).
    fn poll_cq(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, ApiError>;

    /// `ibv_create_qp` (with an SRQ or not).
    ///
    /// # Errors
    /// The limits, unknown handles.
    fn create_qp(&self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, ApiError>;
    /// `ibv_destroy_qp`: its WRs flush.
    ///
    /// # Errors
    /// Unknown QP.
    fn destroy_qp(&self, qpn: Qpn) -> Result<(), ApiError>;
    /// `ibv_modify_qp` with `mask`.
    ///
    /// # Errors
    /// An illegal transition or attribute.
    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError>;
    /// `ibv_query_qp`: type, state and attributes, `None` for an unknown QP.
    ///
    /// # Errors
    /// The engine behind the device is gone.
    fn query_qp(&self, qpn: Qpn) -> Result<Option<(QpType, QpState, QpAttr<Path>)>, ApiError>;

    /// The state of QP `qpn` (`None`: no such QP, or the engine is gone), as `ibv_modify_qp`
    /// records it in `struct ibv_qp` after a change.
    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.query_qp(qpn).ok().flatten().map(|(_, s, _)| s)
    }

    /// `ibv_create_srq`.
    ///
    /// # Errors
    /// The limits, unknown PD.
    fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<SrqId, ApiError>;
    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    /// Unknown, or a QP still uses it.
    fn destroy_srq(&self, srq: SrqId) -> Result<(), ApiError>;
    /// `ibv_modify_srq`.
    ///
    /// # Errors
    /// Unknown SRQ or a bad attribute.
    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), ApiError>;
    /// `ibv_query_srq`.
    ///
    /// # Errors
    /// Unknown SRQ.
    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, ApiError>;
    /// `ibv_post_srq_recv` of one WR.
    ///
    /// # Errors
    /// As [`Device::post_srq_recv`].
    fn post_srq_recv(&self, srq: SrqId, wr: RecvWr) -> Result<(), ApiError>;

    /// `ibv_post_send` of one WR.
    ///
    /// # Errors
    /// As [`Device::post_send`].
    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError>;
    /// Posts `wrs` all or none, in order (`ibv_wr_complete`).
    ///
    /// # Errors
    /// As [`Device::post_send_all`].
    fn post_send_all(&self, qpn: Qpn, wrs: Vec<SendWr<Path>>) -> Result<(), ApiError>;
    /// `ibv_post_recv` of one WR.
    ///
    /// # Errors
    /// As [`Device::post_recv`].
    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError>;

    /// Waits up to `timeout` for the next event of this program's objects (completion events
    /// of armed CQs, asynchronous events): what libibverbs' event thread calls in a loop.
    fn wait_event(&self, timeout: Duration) -> Option<Event>;
}

impl VerbsDevice for Device {
    fn max_path_mtu(&self, ipv6: bool) -> u32 {
        Self::max_path_mtu(self, ipv6)
    }

    fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        local_qpn: Qpn,
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        Self::path_to(self, gid_index, remote_gid, local_qpn, remote_qpn)
    }

    fn alloc_pd(&self) -> Result<PdId, ApiError> {
        Self::alloc_pd(self)
    }

    fn dealloc_pd(&self, pd: PdId) -> Result<(), ApiError> {
        Self::dealloc_pd(self, pd)
    }

    fn reg_mr(&self, pd: PdId, mem: RawMem, iova: u64, access: Access) -> Result<MrInfo, ApiError> {
        self.reg_mr_iova(pd, mem, iova, access)
    }

    fn dereg_mr(&self, lkey: LKey) -> Result<(), ApiError> {
        // The region is the program's own memory: nothing to hand back.
        Self::dereg_mr(self, lkey).map(drop)
    }

    fn alloc_mw(&self, pd: PdId, ty: MwType) -> Result<RKey, ApiError> {
        Self::alloc_mw(self, pd, ty)
    }

    fn dealloc_mw(&self, pd: PdId, rkey: RKey) -> Result<(), ApiError> {
        Self::dealloc_mw(self, pd, rkey)
    }

    fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        bind: BindMw,
    ) -> Result<RKey, ApiError> {
        Self::bind_mw(self, qpn, wr_id, flags, bind)
    }

    fn create_cq(&self, depth: usize) -> Result<CqId, ApiError> {
        Self::create_cq(self, depth)
    }

    fn destroy_cq(&self, cq: CqId) -> Result<(), ApiError> {
        Self::destroy_cq(self, cq)
    }

    fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<(), ApiError> {
        Self::req_notify_cq(self, cq, solicited_only)
    }

    fn poll_cq(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, ApiError> {
        Ok(self.poll_cq_into(cq, out))
    }

    fn create_qp(&self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, ApiError> {
        self.create_qp_with_srq(init, srq)
    }

    fn destroy_qp(&self, qpn: Qpn) -> Result<(), ApiError> {
        Self::destroy_qp(self, qpn)
    }

    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError> {
        Self::modify_qp(self, qpn, attr, mask)
    }

    fn query_qp(&self, qpn: Qpn) -> Result<Option<(QpType, QpState, QpAttr<Path>)>, ApiError> {
        Ok(self.qp_query(qpn))
    }

    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        Self::qp_state(self, qpn)
    }

    fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<SrqId, ApiError> {
        Self::create_srq(self, pd, attr)
    }

    fn destroy_srq(&self, srq: SrqId) -> Result<(), ApiError> {
        Self::destroy_srq(self, srq)
    }

    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), ApiError> {
        Self::modify_srq(self, srq, attr, mask)
    }

    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, ApiError> {
        Self::query_srq(self, srq)
    }

    fn post_srq_recv(&self, srq: SrqId, wr: RecvWr) -> Result<(), ApiError> {
        Self::post_srq_recv(self, srq, wr)
    }

    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError> {
        Self::post_send(self, qpn, wr)
    }

    fn post_send_all(&self, qpn: Qpn, wrs: Vec<SendWr<Path>>) -> Result<(), ApiError> {
        Self::post_send_all(self, qpn, wrs)
    }

    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError> {
        Self::post_recv(self, qpn, wr)
    }

    fn wait_event(&self, timeout: Duration) -> Option<Event> {
        Self::wait_event(self, timeout)
    }
}

/// The communication manager of a device as the drop-in librdmacm uses it: each method is the
/// [`Device`] method of the same name (see `api::cm`), offered in process and through
/// `roce engine` ([`crate::api::remote::SharedDevice`], which routes each CM event to the
/// program that listens on its port or made its connection).
pub trait CmDevice: VerbsDevice {
    /// [`Device::cm_enable`].
    ///
    /// # Errors
    /// QP 1 cannot be claimed.
    fn cm_enable(&self) -> Result<(), ApiError>;
    /// [`Device::cm_listen`] (`ud`: [`Device::cm_listen_ud`]).
    ///
    /// # Errors
    /// The port is taken.
    fn cm_listen(&self, port: u16, ud: bool) -> Result<ServiceId, ApiError>;
    /// [`Device::cm_unlisten`] (`ud`: [`Device::cm_unlisten_ud`]); whether it listened.
    ///
    /// # Errors
    /// The CM is not running.
    fn cm_unlisten(&self, port: u16, ud: bool) -> Result<bool, ApiError>;
    /// [`Device::cm_connect`].
    ///
    /// # Errors
    /// No route, too many connections.
    fn cm_connect(&self, c: &CmConnect) -> Result<CommId, ApiError>;
    /// [`Device::cm_accept`].
    ///
    /// # Errors
    /// No such connection, or not in a state to accept.
    fn cm_accept(&self, id: CommId, a: &CmAccept) -> Result<(), ApiError>;
    /// [`Device::set_multipath_peer`]: call it on the passive side, for a connection request
    /// whose REQ hinted the multipath extension, before the QP goes to RTR. Through `roce
    /// engine` it does nothing: the hint does not cross the engine protocol.
    ///
    /// # Errors
    /// No such QP, or the QP is in RTR or later.
    fn cm_multipath_peer(&self, qpn: Qpn) -> Result<(), ApiError> {
        let _ = qpn;
        Ok(())
    }
    /// [`Device::cm_reject`].
    ///
    /// # Errors
    /// No such connection.
    fn cm_reject(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError>;
    /// [`Device::cm_ready`].
    ///
    /// # Errors
    /// No such connection.
    fn cm_ready(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError>;
    /// [`Device::cm_disconnect`].
    ///
    /// # Errors
    /// No such connection.
    fn cm_disconnect(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError>;
    /// [`Device::cm_destroy`].
    ///
    /// # Errors
    /// The CM is not running.
    fn cm_destroy(&self, id: CommId) -> Result<(), ApiError>;
    /// [`Device::cm_state`].
    fn cm_state(&self, id: CommId) -> Option<CmState>;
    /// [`Device::cm_sidr_request`].
    ///
    /// # Errors
    /// No route.
    fn cm_sidr_request(
        &self,
        dest: IpAddr,
        port: u16,
        src_port: u16,
        private_data: &[u8],
    ) -> Result<CommId, ApiError>;
    /// [`Device::cm_sidr_reply`].
    ///
    /// # Errors
    /// No such request.
    fn cm_sidr_reply(
        &self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), ApiError>;
    /// [`Device::wait_cm_event`]: the next CM event of this program's listens and
    /// connections, waiting up to `timeout`.
    fn wait_cm_event(&self, timeout: Duration) -> Option<CmEvent>;
}

impl CmDevice for Device {
    fn cm_enable(&self) -> Result<(), ApiError> {
        Self::cm_enable(self)
    }

    fn cm_listen(&self, port: u16, ud: bool) -> Result<ServiceId, ApiError> {
        if ud {
            self.cm_listen_ud(port)
        } else {
            Self::cm_listen(self, port)
        }
    }

    fn cm_unlisten(&self, port: u16, ud: bool) -> Result<bool, ApiError> {
        if ud {
            self.cm_unlisten_ud(port)
        } else {
            Self::cm_unlisten(self, port)
        }
    }

    fn cm_connect(&self, c: &CmConnect) -> Result<CommId, ApiError> {
        Self::cm_connect(self, c)
    }

    fn cm_accept(&self, id: CommId, a: &CmAccept) -> Result<(), ApiError> {
        Self::cm_accept(self, id, a)
    }

    fn cm_multipath_peer(&self, qpn: Qpn) -> Result<(), ApiError> {
        Self::set_multipath_peer(self, qpn)
    }

    fn cm_reject(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        Self::cm_reject(self, id, private_data)
    }

    fn cm_ready(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        Self::cm_ready(self, id, private_data)
    }

    fn cm_disconnect(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        Self::cm_disconnect(self, id, private_data)
    }

    fn cm_destroy(&self, id: CommId) -> Result<(), ApiError> {
        Self::cm_destroy(self, id)
    }

    fn cm_state(&self, id: CommId) -> Option<CmState> {
        Self::cm_state(self, id)
    }

    fn cm_sidr_request(
        &self,
        dest: IpAddr,
        port: u16,
        src_port: u16,
        private_data: &[u8],
    ) -> Result<CommId, ApiError> {
        Self::cm_sidr_request(self, dest, port, src_port, private_data)
    }

    fn cm_sidr_reply(
        &self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), ApiError> {
        Self::cm_sidr_reply(self, id, status, qpn, qkey, private_data)
    }

    fn wait_cm_event(&self, timeout: Duration) -> Option<CmEvent> {
        Self::wait_cm_event(self, timeout)
    }
}
