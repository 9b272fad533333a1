//! [`RdmaDevice`]: the verbs a test tool such as `roce perf` needs from a device, implemented
//! both by the in-process [`Device`] and by a device reached through `roce engine`
//! ([`crate::api::remote::EngineDevice`], docs/multiprocess.md). A program generic over it
//! runs on either; with [`Device`] the calls are [`Device`]'s own, monomorphized, so the
//! in-process data path does not change.

use super::{
    ApiError, CqId, Device, LKey, MrInfo, Mtu, Path, PdId, Psn, QpCounters, QpInit, Qpn, RcConnect,
    RecvWr, SendWr, Wc, remote::proto::RcAttrs,
};
use crate::{
    cc::CcSnapshot,
    netinfo::Gid,
    transport::{Access, QpState},
};

/// Where and how an RC QP connects ([`RdmaDevice::connect_rc`]): the peer's GID and QP, the
/// PSNs, the path MTU and the reliability attributes of `ibv_modify_qp` for RTR and RTS.
#[derive(Clone, Copy, Debug)]
pub struct RcTarget {
    /// The local GID index the QP sends from.
    pub gid_index: usize,
    /// The peer's GID.
    pub remote_gid: [u8; 16],
    /// The peer's QP.
    pub dest_qpn: Qpn,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The first PSN the peer sends (our RQ PSN).
    pub rq_psn: Psn,
    /// Our first PSN.
    pub sq_psn: Psn,
    /// Responder resources, READ/atomic depth, timers and retries.
    pub attrs: RcAttrs,
}

/// The verbs of a device that a program driving RC QPs with its own buffers uses: exactly what
/// `roce perf` calls. Implemented by [`Device`] (in process) and
/// [`crate::api::remote::EngineDevice`] (through `roce engine`). Methods take `&self`, as
/// [`Device`]'s do, so one device serves a run's helpers at once.
pub trait RdmaDevice {
    /// Why a verb failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Transports of the device (one unless [`Device`] is sharded); the `queue` of
    /// [`RdmaDevice::alloc_pd_on`] and [`RdmaDevice::create_cq_on`] is below it.
    fn shards(&self) -> u32;
    /// The index of the first GID of the interface that is IPv4 (`v4`) or IPv6
    /// ([`crate::netinfo::IfInfo::default_gid_index`]).
    fn default_gid_index(&self, v4: bool) -> usize;
    /// GID `index` (`ibv_query_gid`).
    ///
    /// # Errors
    /// No such index.
    fn gid(&self, index: usize) -> Result<Gid, Self::Error>;
    /// Refuses a path MTU of `mtu` bytes that the link cannot carry, before any QP uses it.
    ///
    /// # Errors
    /// The MTU is too large.
    fn check_path_mtu(&self, mtu: u32, ipv6: bool) -> Result<(), Self::Error>;
    /// `ibv_alloc_pd` on transport `queue`.
    ///
    /// # Errors
    /// No such queue, or too many PDs.
    fn alloc_pd_on(&self, queue: u32) -> Result<PdId, Self::Error>;
    /// `ibv_create_cq` of `depth` entries on transport `queue`.
    ///
    /// # Errors
    /// No such queue, or the limits.
    fn create_cq_on(&self, queue: u32, depth: usize) -> Result<CqId, Self::Error>;
    /// `ibv_create_qp`.
    ///
    /// # Errors
    /// The limits, or handles of another device.
    fn create_qp(&self, init: QpInit) -> Result<Qpn, Self::Error>;
    /// RESET → INIT with `access`.
    ///
    /// # Errors
    /// An illegal transition.
    fn qp_to_init(&self, qpn: Qpn, access: Access) -> Result<(), Self::Error>;
    /// INIT → RTR → RTS of an RC QP to `t` (the address vector resolved from the GIDs).
    ///
    /// # Errors
    /// No route to the peer, attributes beyond the device's limits, an illegal transition.
    fn connect_rc(&self, qpn: Qpn, t: &RcTarget) -> Result<(), Self::Error>;
    /// [`Device::set_multipath_peer`]: the peer QP allows the multipath extension, as its
    /// side of the exchange said; call it in INIT, before [`RdmaDevice::connect_rc`]. A
    /// device that does not take the hint (the default; a device reached through `roce
    /// engine`) ignores it, and its QPs agree in band.
    ///
    /// # Errors
    /// As [`Device::set_multipath_peer`].
    fn set_multipath_peer(&self, qpn: Qpn) -> Result<(), Self::Error> {
        let _ = qpn;
        Ok(())
    }
    /// Registers `len` zeroed bytes that the device allocates and keeps until the device
    /// goes: read and write them with [`RdmaDevice::mr_read`], [`RdmaDevice::mr_write`] and
    /// [`RdmaDevice::with_mr`].
    ///
    /// # Errors
    /// The limits, or a PD of another device.
    fn reg_mr(&self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, Self::Error>;
    /// Copies `data` into region `lkey` at `offset`.
    ///
    /// # Errors
    /// No such region, or out of its bounds.
    fn mr_write(&self, lkey: LKey, offset: usize, data: &[u8]) -> Result<(), Self::Error>;
    /// Copies `out.len()` bytes of region `lkey` at `offset` into `out`.
    ///
    /// # Errors
    /// As [`RdmaDevice::mr_write`].
    fn mr_read(&self, lkey: LKey, offset: usize, out: &mut [u8]) -> Result<(), Self::Error>;
    /// Calls `f` with the bytes of region `lkey` as they are now (call it after the
    /// completion that says they arrived).
    ///
    /// # Errors
    /// No such region.
    fn with_mr<R>(&self, lkey: LKey, f: impl FnOnce(&[u8]) -> R) -> Result<R, Self::Error>;
    /// `ibv_post_send` of one WR.
    ///
    /// # Errors
    /// A full queue, a bad WR, or an operation the device does not carry.
    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), Self::Error>;
    /// `ibv_post_recv` of one WR.
    ///
    /// # Errors
    /// A full queue, or a bad WR.
    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), Self::Error>;
    /// `ibv_poll_cq` into `out`: the completions polled.
    ///
    /// # Errors
    /// The device is unreachable ([`Device`] never fails).
    fn poll_cq_into(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, Self::Error>;
    /// [`RdmaDevice::poll_cq_into`] for a caller with nothing else to do until a completion
    /// comes: a device where a poll is costly (a round trip to `roce engine`) waits there up
    /// to `timeout` when the CQ is empty, instead of answering at once. The default, which
    /// [`Device`] keeps, is a plain poll (its callers spin and yield as they always did).
    ///
    /// # Errors
    /// As [`RdmaDevice::poll_cq_into`].
    fn wait_cq_into(
        &self,
        cq: CqId,
        out: &mut [Wc],
        timeout: std::time::Duration,
    ) -> Result<usize, Self::Error> {
        let _ = timeout;
        self.poll_cq_into(cq, out)
    }
    /// Waits up to `timeout` for a completion on `cq` sleeping, as a program on a completion
    /// channel does (`roce pingpong -e`): [`Device`] sleeps on the CQ's event
    /// ([`Device::wait_cq`], one completion per call); the default, which a device in
    /// `roce engine` keeps, is [`RdmaDevice::wait_cq_into`] (the engine sleeps). 0 when none came.
    ///
    /// # Errors
    /// As [`RdmaDevice::poll_cq_into`].
    fn sleep_cq_into(
        &self,
        cq: CqId,
        out: &mut [Wc],
        timeout: std::time::Duration,
    ) -> Result<usize, Self::Error> {
        self.wait_cq_into(cq, out, timeout)
    }
    /// A QP's state (`ibv_query_qp`), for a diagnostic; `None` when it is unknown or cannot be
    /// asked.
    fn qp_state(&self, qpn: Qpn) -> Option<QpState>;
    /// Each QP's congestion-control state, where this process runs the transport; empty when
    /// another process does (its counters are that process's: `roce stats`).
    fn cc_snapshots(&self) -> Vec<(Qpn, CcSnapshot)>;
    /// Each QP's transport counters, as [`RdmaDevice::cc_snapshots`].
    fn qp_counters(&self) -> Vec<(Qpn, QpCounters)>;
}

impl RdmaDevice for Device {
    type Error = ApiError;

    fn shards(&self) -> u32 {
        Device::shards(self)
    }

    fn default_gid_index(&self, v4: bool) -> usize {
        self.info().default_gid_index(v4)
    }

    fn gid(&self, index: usize) -> Result<Gid, ApiError> {
        Device::gid(self, index)
    }

    fn check_path_mtu(&self, mtu: u32, ipv6: bool) -> Result<(), ApiError> {
        Device::check_path_mtu(self, mtu, ipv6)
    }

    fn alloc_pd_on(&self, queue: u32) -> Result<PdId, ApiError> {
        Device::alloc_pd_on(self, queue)
    }

    fn create_cq_on(&self, queue: u32, depth: usize) -> Result<CqId, ApiError> {
        Device::create_cq_on(self, queue, depth)
    }

    fn create_qp(&self, init: QpInit) -> Result<Qpn, ApiError> {
        Device::create_qp(self, init)
    }

    fn qp_to_init(&self, qpn: Qpn, access: Access) -> Result<(), ApiError> {
        Device::qp_to_init(self, qpn, access)
    }

    fn connect_rc(&self, qpn: Qpn, t: &RcTarget) -> Result<(), ApiError> {
        let path = self.path_to(t.gid_index, &t.remote_gid, qpn, t.dest_qpn)?;
        let a = t.attrs;
        let c = RcConnect {
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            ..RcConnect::new(path, t.path_mtu, t.dest_qpn, t.rq_psn, t.sq_psn)
        };
        self.qp_connect(qpn, &c)
    }

    fn set_multipath_peer(&self, qpn: Qpn) -> Result<(), ApiError> {
        Device::set_multipath_peer(self, qpn)
    }

    fn reg_mr(&self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, ApiError> {
        Device::reg_mr(self, pd, len, access)
    }

    fn mr_write(&self, lkey: LKey, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        Device::mr_write(self, lkey, offset, data)
    }

    fn mr_read(&self, lkey: LKey, offset: usize, out: &mut [u8]) -> Result<(), ApiError> {
        Device::mr_read(self, lkey, offset, out)
    }

    fn with_mr<R>(&self, lkey: LKey, f: impl FnOnce(&[u8]) -> R) -> Result<R, ApiError> {
        Device::with_mr(self, lkey, f)
    }

    fn post_send(&self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), ApiError> {
        Device::post_send(self, qpn, wr)
    }

    fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), ApiError> {
        Device::post_recv(self, qpn, wr)
    }

    fn poll_cq_into(&self, cq: CqId, out: &mut [Wc]) -> Result<usize, ApiError> {
        Ok(Device::poll_cq_into(self, cq, out))
    }

    fn sleep_cq_into(
        &self,
        cq: CqId,
        out: &mut [Wc],
        timeout: std::time::Duration,
    ) -> Result<usize, ApiError> {
        let Some(slot) = out.first_mut() else {
            return Ok(0);
        };
        Ok(Device::wait_cq(self, cq, timeout).map_or(0, |wc| {
            *slot = wc;
            1
        }))
    }

    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        Device::qp_state(self, qpn)
    }

    fn cc_snapshots(&self) -> Vec<(Qpn, CcSnapshot)> {
        Device::cc_snapshots(self)
    }

    fn qp_counters(&self) -> Vec<(Qpn, QpCounters)> {
        self.counters().1
    }
}
