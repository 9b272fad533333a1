//! Handle types: [`Pd`], [`Mr`], [`Cq`], [`Qp`] and [`Ah`], the verbs objects as values that
//! release what they hold when dropped, in the manner of the `ibverbs` crate.
//!
//! A handle borrows what it was made from, so the borrow checker enforces the verbs' order of
//! destruction: an [`Mr`] borrows its [`Pd`], a [`Qp`] its [`Pd`] and its two [`Cq`]s, and a
//! `Pd` or `Cq` borrows the [`Device`]. A PD therefore cannot be dropped while one of its
//! regions or QPs lives, nor a CQ while a QP completes on it, nor the device before any of them
//! — the cases where `ibv_dealloc_pd` and `ibv_destroy_cq` return `EBUSY`.
//!
//! Each handle has an explicit release that reports its error — [`Pd::dealloc`],
//! [`Mr::dereg`], [`Cq::destroy`], [`Qp::destroy`] — and releases on drop otherwise. Drop
//! cannot return an error: a failure there (only possible when the same object was already
//! released, or made busy, through the id-based calls of [`Device`]) is logged at `warn` level
//! through the `log` crate and otherwise ignored. Call the explicit form to see it. After a
//! failed explicit release the object stays in the device until [`Device::close`].
//!
//! The id-based methods of [`Device`] (`alloc_pd`, `reg_mr`, `create_cq`, ...) stay: they are
//! what a C layer over this API calls. Every handle gives its id ([`Pd::id`], [`Cq::id`],
//! [`Qp::qpn`], [`Mr::lkey`]) to mix the two.

use std::time::Duration;

use super::{
    Access, ApiError, AttrMask, BindMw, CqId, CqReady, Device, LKey, MemBuf, Memory, MrInfo,
    MwType, Path, PdId, QKey, QpAttr, QpCap, QpInit, QpState, QpType, Qpn, RKey, RcConnect, RecvWr,
    SendFlags, SendOp, SendWr, Sge, UdDest, Wc,
};

/// Logs a release that failed in `drop`, where it cannot be returned.
fn dropped(what: &str, r: Result<(), ApiError>) {
    if let Err(e) = r {
        log::warn!("releasing {what} on drop failed: {e}");
    }
}

impl Device {
    /// Allocates a protection domain as a handle that frees it when dropped (`ibv_alloc_pd`;
    /// the id form is [`Device::alloc_pd`]). Call it first: regions and QPs are made in a PD.
    ///
    /// # Errors
    /// Too many protection domains.
    pub fn pd(&self) -> Result<Pd<'_>, ApiError> {
        self.pd_on(0)
    }

    /// [`Device::pd`] on `queue`'s transport of a sharded device ([`Device::alloc_pd_on`]):
    /// the QPs made in it live on that queue and need CQs of the same queue ([`Device::cq_on`]).
    ///
    /// # Errors
    /// No such queue, or too many protection domains.
    pub fn pd_on(&self, queue: u32) -> Result<Pd<'_>, ApiError> {
        Ok(Pd {
            dev: self,
            id: self.alloc_pd_on(queue)?,
        })
    }

    /// Creates a completion queue of `depth` entries as a handle that destroys it when dropped
    /// (`ibv_create_cq`; the id form is [`Device::create_cq`]). Call it before the QPs that
    /// complete on it.
    ///
    /// # Errors
    /// Too many CQs, or `depth` is 0 or too deep.
    pub fn cq(&self, depth: usize) -> Result<Cq<'_>, ApiError> {
        self.cq_on(0, depth)
    }

    /// [`Device::cq`] on `queue`'s transport of a sharded device ([`Device::create_cq_on`]).
    ///
    /// # Errors
    /// No such queue, too many CQs, or `depth` is 0 or too deep.
    pub fn cq_on(&self, queue: u32, depth: usize) -> Result<Cq<'_>, ApiError> {
        Ok(Cq {
            dev: self,
            id: self.create_cq_on(queue, depth)?,
        })
    }
}

/// A protection domain (`struct ibv_pd`), made by [`Device::pd`]; dropping it frees it
/// (`ibv_dealloc_pd`). Its regions ([`Pd::reg_mr`]) and QPs ([`Pd::create_qp`]) borrow it, so
/// they are gone before it is.
#[derive(Debug)]
pub struct Pd<'d> {
    dev: &'d Device,
    id: PdId,
}

impl<'d> Pd<'d> {
    /// The PD's id, for the id-based calls of [`Device`].
    #[must_use]
    pub const fn id(&self) -> PdId {
        self.id
    }

    /// The device the PD belongs to.
    #[must_use]
    pub const fn device(&self) -> &'d Device {
        self.dev
    }

    /// Registers a zeroed region of `len` bytes with the rights `access` (`ibv_reg_mr`; the
    /// id form is [`Device::reg_mr`]). Dropping the handle deregisters it. Call it before
    /// posting work requests that name it, and give its [`Mr::rkey`] and address to the peer
    /// for RDMA.
    ///
    /// # Errors
    /// Too many regions, or bad access flags (remote write or atomic without local write).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<Mr<'_>, ApiError> {
        Ok(Mr {
            pd: self,
            info: self.dev.reg_mr(self.id, len, access)?,
        })
    }

    /// Registers a buffer the application filled (`ibv_reg_mr` over the caller's memory; the
    /// id form is [`Device::reg_mr_mem`]). The device holds the buffer while it is registered
    /// and the transport reads and writes it in place; [`Mr::dereg`] hands it back.
    ///
    /// # Errors
    /// Too many regions, or bad access flags.
    pub fn reg_buf(&self, buf: MemBuf, access: Access) -> Result<Mr<'_>, ApiError> {
        Ok(Mr {
            pd: self,
            info: self.dev.reg_mr_mem(self.id, buf, access)?,
        })
    }

    /// Creates a QP in RESET whose sends complete on `send_cq` and receives on `recv_cq`
    /// (`ibv_create_qp`; the id form is [`Device::create_qp`]). Only sends flagged
    /// [`SendFlags::SIGNALED`](super::SendFlags::SIGNALED) (the default of [`SendWr::new`])
    /// complete; `sq_sig_all` is off. Dropping the handle destroys the QP. Next, move it to
    /// INIT ([`Qp::to_init`]) and connect it ([`Qp::connect`]).
    ///
    /// # Errors
    /// [`ApiError::ForeignHandle`] if a CQ belongs to another device; otherwise as
    /// [`Device::create_qp`] (limits, no free QPN, the CQs on another queue than the PD).
    pub fn create_qp<'a>(
        &'a self,
        send_cq: &'a Cq<'d>,
        recv_cq: &'a Cq<'d>,
        qp_type: QpType,
        cap: QpCap,
    ) -> Result<Qp<'a>, ApiError> {
        self.new_qp(send_cq, recv_cq, None, qp_type, cap)
    }

    /// [`Pd::create_qp`] for a QP that receives through `srq` (`init_attr.srq`): its
    /// receives are the SRQ's WQEs, so `cap.max_recv_wr` is ignored and [`Qp::post_recv`] is
    /// refused; post to the SRQ ([`super::Srq::post_recv`]). The QP borrows the SRQ.
    ///
    /// # Errors
    /// As [`Pd::create_qp`]; [`ApiError::ForeignHandle`] for an SRQ of another device.
    pub fn create_qp_with_srq<'a>(
        &'a self,
        send_cq: &'a Cq<'d>,
        recv_cq: &'a Cq<'d>,
        srq: &'a super::Srq<'_>,
        qp_type: QpType,
        cap: QpCap,
    ) -> Result<Qp<'a>, ApiError> {
        self.new_qp(send_cq, recv_cq, Some(srq.id()), qp_type, cap)
    }

    fn new_qp<'a>(
        &'a self,
        send_cq: &'a Cq<'d>,
        recv_cq: &'a Cq<'d>,
        srq: Option<super::SrqId>,
        qp_type: QpType,
        cap: QpCap,
    ) -> Result<Qp<'a>, ApiError> {
        for cq in [send_cq, recv_cq] {
            if !std::ptr::eq(cq.dev, self.dev) {
                return Err(ApiError::ForeignHandle("completion queue"));
            }
        }
        let init = QpInit {
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            cap,
            ..QpInit::new(qp_type, self.id, send_cq.id)
        };
        let qpn = self.dev.create_qp_with_srq(init, srq)?;
        Ok(Qp {
            pd: self,
            send_cq,
            recv_cq,
            qpn,
        })
    }

    /// An address handle for UD sends from local GID `gid_index` to `remote_gid`
    /// (`ibv_create_ah`): the path resolved once (the next hop's MAC, IPs, UDP source port),
    /// for [`Ah::ud`]. Call it once per destination, not per send.
    ///
    /// # Errors
    /// Bad GID index, mixed address families, or the next hop's MAC does not resolve.
    pub fn create_ah(&self, gid_index: usize, remote_gid: &[u8; 16]) -> Result<Ah<'_>, ApiError> {
        // The UDP source port of the pair (0, 0): an address handle is not tied to a QP.
        let path = self
            .dev
            .path_to(gid_index, remote_gid, Qpn::new(0), Qpn::new(0))?;
        Ok(Ah { _pd: self, path })
    }

    /// Frees the PD now, reporting the error that drop would only log (`ibv_dealloc_pd`).
    ///
    /// # Errors
    /// [`ApiError::PdBusy`] if a region or QP was made in it through the id-based calls and
    /// still lives; the PD then stays until the device closes.
    pub fn dealloc(self) -> Result<(), ApiError> {
        let r = self.dev.dealloc_pd(self.id);
        std::mem::forget(self);
        r
    }
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        dropped("a protection domain", self.dev.dealloc_pd(self.id));
    }
}

/// A registered memory region (`struct ibv_mr`), made by [`Pd::reg_mr`]; dropping it
/// deregisters it (`ibv_dereg_mr`). The device owns the bytes: read and write them with
/// [`Mr::read`] and [`Mr::write`]. Operations still in flight on a dropped region fail with
/// access errors and never touch freed memory.
#[derive(Debug)]
pub struct Mr<'pd> {
    pd: &'pd Pd<'pd>,
    info: MrInfo,
}

impl Mr<'_> {
    /// Everything the registration returned: keys, address, length, rights, PD.
    #[must_use]
    pub const fn info(&self) -> &MrInfo {
        &self.info
    }

    /// The local key, for scatter/gather entries of this side's work requests.
    #[must_use]
    pub const fn lkey(&self) -> LKey {
        self.info.lkey
    }

    /// The remote key the peer puts in its RDMA and atomic requests (valid only with a remote
    /// right).
    #[must_use]
    pub const fn rkey(&self) -> RKey {
        self.info.rkey
    }

    /// The region's first I/O virtual address: what the peer's requests address.
    #[must_use]
    pub const fn addr(&self) -> u64 {
        self.info.iova
    }

    /// The region's length in bytes.
    #[must_use]
    pub const fn len(&self) -> u64 {
        self.info.len
    }

    /// Whether the region has no bytes.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// A scatter/gather entry (`struct ibv_sge`) for `len` bytes at `offset` in the region. The
    /// range is checked when the work request runs: one outside the region completes with
    /// `LocProtErr`.
    #[must_use]
    pub const fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.info.iova.wrapping_add(offset),
            length: len,
            lkey: self.info.lkey,
        }
    }

    /// Copies `data` into the region at `offset` ([`Device::mr_write`]): the bytes to send or
    /// to expose, before posting.
    ///
    /// # Errors
    /// Out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        self.pd.dev.mr_write(self.info.lkey, offset, data)
    }

    /// Copies `out.len()` bytes of the region at `offset` into `out` ([`Device::mr_read`]):
    /// what a receive or the peer's WRITE left there, after its completion.
    ///
    /// # Errors
    /// Out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ApiError> {
        self.pd.dev.mr_read(self.info.lkey, offset, out)
    }

    /// Deregisters the region now, reporting the error that drop would only log
    /// (`ibv_dereg_mr`), and returns its memory: the buffer of [`Pd::reg_buf`] (or of
    /// [`Pd::reg_mr`]) with what the peer and the completions left in it.
    ///
    /// # Errors
    /// The region was already deregistered through [`Device::dereg_mr`].
    pub fn dereg(self) -> Result<Memory, ApiError> {
        let r = self.pd.dev.dereg_mr(self.info.lkey);
        std::mem::forget(self);
        r
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        dropped(
            "a memory region",
            self.pd.dev.dereg_mr(self.info.lkey).map(drop),
        );
    }
}

impl Pd<'_> {
    /// Allocates a memory window of type `ty` (`ibv_alloc_mw`; the id form is
    /// [`Device::alloc_mw`]). Dropping the handle frees it, bound or not.
    ///
    /// # Errors
    /// The window table is full.
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw<'_>, ApiError> {
        Ok(Mw {
            pd: self,
            rkey: self.dev.alloc_mw(self.id, ty)?,
            ty,
        })
    }
}

/// A memory window (`struct ibv_mw`), made by [`Pd::alloc_mw`]; dropping it frees it
/// (`ibv_dealloc_mw`). Bound, it is an R_Key the peer uses for RDMA over a range of one region
/// of the same PD, with rights of its own.
#[derive(Debug)]
pub struct Mw<'pd> {
    pd: &'pd Pd<'pd>,
    rkey: RKey,
    ty: MwType,
}

impl Mw<'_> {
    /// The window's R_Key: give it to the peer after the bind completes.
    #[must_use]
    pub const fn rkey(&self) -> RKey {
        self.rkey
    }

    /// The window's type.
    #[must_use]
    pub const fn mw_type(&self) -> MwType {
        self.ty
    }

    /// Binds a type 1 window to `len` bytes at `offset` of `mr` with the remote rights
    /// `access`, through `qp` (`ibv_bind_mw`; [`Device::bind_mw`]). The bind completes on the
    /// QP's send CQ as [`WcOpcode::BindMw`](super::WcOpcode::BindMw) (or `MwBindErr`, after
    /// which the old key stands again: call [`Mw::set_rkey`]); the window's key is the new one
    /// from now on.
    ///
    /// # Errors
    /// The post's errors.
    pub fn bind(
        &mut self,
        qp: &Qp<'_>,
        wr_id: u64,
        mr: &Mr<'_>,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<RKey, ApiError> {
        let b = self.bind_info(mr, offset, len, access);
        self.rkey = self
            .pd
            .dev
            .bind_mw(qp.qpn(), wr_id, SendFlags::SIGNALED, b)?;
        Ok(self.rkey)
    }

    /// The `IBV_WR_BIND_MW` work request that binds a type 2 window to `len` bytes at `offset`
    /// of `mr` with the remote rights `access`, and the key the window gets: post it with
    /// [`Qp::post_send`] on the QP the window is to be bound to, then [`Mw::set_rkey`] once
    /// it completes.
    #[must_use]
    pub fn bind_wr(
        &self,
        wr_id: u64,
        mr: &Mr<'_>,
        offset: u64,
        len: u64,
        access: Access,
    ) -> (SendWr<Path>, RKey) {
        let b = self.bind_info(mr, offset, len, access);
        let key = RKey::new((self.rkey.value() & !0xff) | u32::from(b.new_key));
        (SendWr::new(wr_id, SendOp::BindMw(b), Vec::new()), key)
    }

    /// Sets the key the window has now (after a bind completed, or failed).
    pub const fn set_rkey(&mut self, rkey: RKey) {
        self.rkey = rkey;
    }

    fn bind_info(&self, mr: &Mr<'_>, offset: u64, len: u64, access: Access) -> BindMw {
        BindMw {
            mw_rkey: self.rkey,
            new_key: (self.rkey.value() as u8).wrapping_add(1),
            mr_lkey: mr.lkey(),
            addr: mr.addr().wrapping_add(offset),
            length: len,
            access,
            zero_based: false,
        }
    }
}

impl Drop for Mw<'_> {
    fn drop(&mut self) {
        dropped(
            "a memory window",
            self.pd.dev.dealloc_mw(self.pd.id, self.rkey),
        );
    }
}

/// A completion queue (`struct ibv_cq`), made by [`Device::cq`]; dropping it destroys it
/// (`ibv_destroy_cq`). The QPs that complete on it borrow it.
#[derive(Debug)]
pub struct Cq<'d> {
    dev: &'d Device,
    id: CqId,
}

impl<'d> Cq<'d> {
    /// The CQ's id, for the id-based calls of [`Device`].
    #[must_use]
    pub const fn id(&self) -> CqId {
        self.id
    }

    /// Moves up to `out.len()` completions into `out` without waiting and returns how many
    /// (`ibv_poll_cq`; [`Device::poll_cq_into`]). Allocates nothing: poll in a loop with a
    /// buffer made once.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.dev.poll_cq_into(self.id, out)
    }

    /// Waits up to `timeout` for one completion ([`Device::wait_cq`]: `ibv_get_cq_event` and
    /// `ibv_poll_cq`), for a thread that has nothing else to do.
    #[must_use]
    pub fn wait(&self, timeout: Duration) -> Option<Wc> {
        self.dev.wait_cq(self.id, timeout)
    }

    /// A future that resolves with the next completion ([`Device::cq_ready`]).
    #[must_use]
    pub fn ready(&self) -> CqReady<'d> {
        self.dev.cq_ready(self.id)
    }

    /// Destroys the CQ now, reporting the error that drop would only log (`ibv_destroy_cq`).
    ///
    /// # Errors
    /// [`ApiError::CqBusy`] if a QP made through the id-based calls still completes on it;
    /// the CQ then stays until the device closes.
    pub fn destroy(self) -> Result<(), ApiError> {
        let r = self.dev.destroy_cq(self.id);
        std::mem::forget(self);
        r
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        dropped("a completion queue", self.dev.destroy_cq(self.id));
    }
}

/// A queue pair (`struct ibv_qp`), made by [`Pd::create_qp`]; dropping it destroys it and
/// releases its QPN (`ibv_destroy_qp`): its outstanding work requests go without completions.
/// It borrows its PD and its CQs.
#[derive(Debug)]
pub struct Qp<'a> {
    pd: &'a Pd<'a>,
    send_cq: &'a Cq<'a>,
    recv_cq: &'a Cq<'a>,
    qpn: Qpn,
}

impl<'a> Qp<'a> {
    /// The QP number: what the peer sends to, and the id for the calls of [`Device`].
    #[must_use]
    pub const fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The protection domain the QP was made in.
    #[must_use]
    pub const fn pd(&self) -> &'a Pd<'a> {
        self.pd
    }

    /// The CQ of its send completions.
    #[must_use]
    pub const fn send_cq(&self) -> &'a Cq<'a> {
        self.send_cq
    }

    /// The CQ of its receive completions.
    #[must_use]
    pub const fn recv_cq(&self) -> &'a Cq<'a> {
        self.recv_cq
    }

    /// The QP's current state (`ibv_query_qp`'s `qp_state`).
    #[must_use]
    pub fn state(&self) -> Option<QpState> {
        self.pd.dev.qp_state(self.qpn)
    }

    /// Changes the QP's state and attributes (`ibv_modify_qp`; [`Device::modify_qp`]). For
    /// the usual RC bring-up use [`Qp::to_init`] and [`Qp::connect`].
    ///
    /// # Errors
    /// An illegal transition, the wrong mask, or a path MTU too large for the device.
    pub fn modify(&self, attr: &QpAttr<Path>, mask: AttrMask) -> Result<(), ApiError> {
        self.pd.dev.modify_qp(self.qpn, attr, mask)
    }

    /// RESET → INIT, granting the peer `access` to this side's regions
    /// ([`Device::qp_to_init`]). Call it right after creating the QP; receives may be posted
    /// from INIT on.
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn to_init(&self, access: Access) -> Result<(), ApiError> {
        self.pd.dev.qp_to_init(self.qpn, access)
    }

    /// The address vector to the peer's QP `remote_qpn` at `remote_gid`, from local GID
    /// `gid_index` ([`Device::path_to`]), for [`RcConnect`]. Call it once the peer's QP
    /// number and GID are known.
    ///
    /// # Errors
    /// Bad GID index, mixed address families, or the next hop's MAC does not resolve.
    pub fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        self.pd
            .dev
            .path_to(gid_index, remote_gid, self.qpn, remote_qpn)
    }

    /// INIT → RTR → RTS with the peer's QP number and PSN in `c` ([`Device::qp_connect`]).
    /// Call it after exchanging QP numbers, PSNs and GIDs with the peer; sends may be posted
    /// once it returns.
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn connect(&self, c: &RcConnect) -> Result<(), ApiError> {
        self.pd.dev.qp_connect(self.qpn, c)
    }

    /// Posts a send work request (`ibv_post_send`): a SEND, RDMA WRITE, READ or atomic whose
    /// completion arrives on [`Qp::send_cq`] if signalled.
    ///
    /// # Errors
    /// The QP's state, a full send queue, too many SGEs, or a bad request.
    pub fn post_send(&self, wr: SendWr<Path>) -> Result<(), ApiError> {
        self.pd.dev.post_send(self.qpn, wr)
    }

    /// Posts a receive work request (`ibv_post_recv`) for the peer's next SEND; its completion
    /// arrives on [`Qp::recv_cq`]. Post receives before the peer sends (RC: or it waits out an
    /// RNR NAK).
    ///
    /// # Errors
    /// The QP's state, a full receive queue, or too many SGEs.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), ApiError> {
        self.pd.dev.post_recv(self.qpn, wr)
    }

    /// Destroys the QP now, reporting the error that drop would only log (`ibv_destroy_qp`).
    ///
    /// # Errors
    /// The QP was already destroyed through [`Device::destroy_qp`].
    pub fn destroy(self) -> Result<(), ApiError> {
        let r = self.pd.dev.destroy_qp(self.qpn);
        std::mem::forget(self);
        r
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        dropped("a queue pair", self.pd.dev.destroy_qp(self.qpn));
    }
}

/// An address handle (`struct ibv_ah`) for UD sends, made by [`Pd::create_ah`]: a resolved
/// path to one destination. It holds nothing in the device (the path is a value), so dropping
/// it releases nothing; it borrows its PD as `ibv_ah` belongs to one.
#[derive(Debug)]
pub struct Ah<'pd> {
    _pd: &'pd Pd<'pd>,
    path: Path,
}

impl Ah<'_> {
    /// The resolved path: MACs, IPs, UDP ports.
    #[must_use]
    pub const fn path(&self) -> &Path {
        &self.path
    }

    /// The UD destination of a send to QP `remote_qpn` with Q_Key `remote_qkey` at this
    /// address (`wr.ud` of `ibv_send_wr`): put it in [`SendWr::ud`] of a UD QP's send.
    #[must_use]
    pub const fn ud(&self, remote_qpn: Qpn, remote_qkey: QKey) -> UdDest<Path> {
        UdDest {
            path: self.path,
            remote_qpn,
            remote_qkey,
        }
    }
}
