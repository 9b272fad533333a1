//! The communication manager on QP 1 of a [`Device`]: the InfiniBand CM ([`crate::ibcm`]) as
//! RDMA CM speaks it on RoCE, its MADs carried as UD SENDs on the device's QP 1 (GSI) over the
//! AF_XDP data path ([`crate::transport::gsi`]), its timers run by the device's engines. The
//! drop-in librdmacm sits on these calls.
//!
//! Enable it once per interface ([`Device::cm_enable`], or implicitly with the first
//! [`Device::cm_listen`] or [`Device::cm_connect`]): that claims QPN 1 in roce_xdp's QP map,
//! so the XDP program steers the frames to QP 1 into our sockets instead of passing them to the
//! kernel. Then listen or connect, take [`CmEvent`]s with [`Device::poll_cm_event`] or
//! [`Device::wait_cm_event`], and answer them: a [`CmEvent::ConnectRequest`] with
//! [`Device::cm_accept`] or [`Device::cm_reject`]; a [`CmEvent::Reply`] (active side) with
//! [`Device::cm_ready`] once the QP is in RTS. The mapping to RDMA CM events is in
//! [`crate::ibcm`]'s module documentation. Bringing the QP through INIT, RTR and RTS from the
//! events' QPNs and PSNs is the caller's (librdmacm's `rdma_accept`/`rdma_connect` do it).

use core::net::IpAddr;
use std::time::Duration;

use roce_common::maps::QpEntry;

pub use crate::ibcm::{
    CaGuid, CmStats, CommId, Event as CmEvent, IbaTime, PathMtu, PortSpace, RejReason, ServiceId,
    SidrStatus, State as CmState,
};
use crate::{
    api::{ApiError, Device, claims::lock_file},
    engine::driver::Shared,
    ibcm::{AcceptParams, CmConfig, CmaHdr, ConnectParams, Gid},
    loader,
    transport::{PKey, Psn, QKey, Qpn, gsi::GsiStats, multipath::MpState},
};

/// An active connection request ([`Device::cm_connect`]): what `rdma_connect` puts in the REQ.
/// [`CmConnect::new`] takes RDMA CM's defaults.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CmConnect {
    /// The peer's IP address.
    pub dest: IpAddr,
    /// The peer's port (RDMA CM TCP port space).
    pub port: u16,
    /// Our source port in the RDMA CM IP header (`rdma_bind_addr`'s, or an ephemeral one).
    pub src_port: u16,
    /// Our QP.
    pub qpn: Qpn,
    /// The REQ's starting PSN: the first PSN our QP's receive queue expects (its RTR
    /// `rq_psn`); the peer's QP sends from it (cm.c: the passive side's `sq_psn` is the
    /// REQ's, and the REP's PSN is what we send from).
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests we accept at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we send at once.
    pub initiator_depth: u8,
    /// Transport retries (`rdma_conn_param.retry_count`, 3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7: forever).
    pub rnr_retry_count: u8,
    /// Whether our QP receives through an SRQ.
    pub srq: bool,
    /// The consumer's private data, after the RDMA CM IP header (at most 56 bytes).
    pub private_data: Vec<u8>,
    /// The CM response timeout of this connection (`ib_cm_req_param`'s): our REQ is resent,
    /// and the peer resends its REP, every `2 × packet lifetime (1.07 s on RoCE) + this`.
    /// `None`: RDMA CM's `CMA_CM_RESPONSE_TIMEOUT` (20, 4.3 s).
    pub cm_response_timeout: Option<IbaTime>,
    /// How many times the REQ (and the peer's REP) is resent before [`CmEvent::TimedOut`]
    /// (4 bits). `None`: RDMA CM's `CMA_MAX_CM_RETRIES` (15).
    pub max_cm_retries: Option<u8>,
}

impl CmConnect {
    /// A request to `dest`:`port` for our QP `qpn` receiving from `starting_psn`, with source port
    /// `src_port`, one READ each way, 7 retries of each kind, no private data.
    #[must_use]
    pub const fn new(dest: IpAddr, port: u16, src_port: u16, qpn: Qpn, starting_psn: Psn) -> Self {
        Self {
            dest,
            port,
            src_port,
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
            cm_response_timeout: None,
            max_cm_retries: None,
        }
    }
}

/// An accept ([`Device::cm_accept`]): what `rdma_accept` puts in the REP.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CmAccept {
    /// Our QP.
    pub qpn: Qpn,
    /// The REP's starting PSN: the first PSN our QP's receive queue expects (its RTR
    /// `rq_psn`); the active side sends from it, and our QP sends from the REQ's.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests we accept at once (at most the REQ's initiator depth).
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we send at once (at most the REQ's responder resources).
    pub initiator_depth: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// Whether our QP receives through an SRQ.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

impl CmAccept {
    /// An accept for our QP `qpn` receiving from `starting_psn`: one READ each way, RNR retries
    /// forever, no private data.
    #[must_use]
    pub const fn new(qpn: Qpn, starting_psn: Psn) -> Self {
        Self {
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

impl Device {
    /// The node GUID of this device: the interface MAC as a modified EUI-64, as rxe derives
    /// its own; the CM sends it as LocalCAGUID (and the drop-in libibverbs reports it as
    /// `node_guid`).
    #[must_use]
    pub const fn node_guid(&self) -> CaGuid {
        CaGuid::from_mac(self.info.mac)
    }

    /// The transport that owns QP 1.
    fn gsi_shard(&self) -> &Shared {
        self.by_qpn(Qpn::GSI)
    }

    /// Starts the CM agent on QP 1: claims QPN 1 in roce_xdp's QP map (so UD SENDs to QP 1
    /// come to this process instead of the kernel) and runs the agent in the transport that
    /// owns QPN 1. Idempotent. Call it before the first CM call, or let that call do it.
    ///
    /// # Errors
    /// [`ApiError::CmTaken`] when another live process runs the CM on the interface; the
    /// map or lock file cannot be used.
    pub fn cm_enable(&self) -> Result<(), ApiError> {
        if self.gsi_shard().lock().gsi().is_some() {
            return Ok(());
        }
        let _lock = lock_file(&self.info.ifname)?;
        let qps = self.pins.qps()?;
        let me = std::process::id();
        let owner = qps
            .get(&Qpn::GSI.value(), 0)
            .map_or(0, |e: QpEntry| e.owner);
        drop(qps);
        if owner != 0 && owner != me && loader::process_alive(owner) {
            return Err(ApiError::CmTaken {
                ifname: self.info.ifname.clone(),
                owner,
            });
        }
        let seed = super::random_seed()?;
        let mut config = CmConfig::new(self.node_guid());
        // Random first communication ID, as the kernel's (cm.c `cm_alloc_id_priv` takes
        // them from an xarray with a random start): a restarted agent does not reuse IDs a
        // peer may still hold. Never 0 (0 means "unknown" in a REJ).
        config.comm_id_seed = u32::from_ne_bytes([seed[0], seed[1], seed[2], seed[3]]).max(1);
        config.tid_hi = me;
        // The claim first: if it fails, no agent runs that roce_xdp would not feed.
        self.pins.add_qp(Qpn::GSI.value(), me)?;
        self.gsi_shard().lock().enable_gsi(config);
        let mut qpns = self
            .qpns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !qpns.contains(&Qpn::GSI.value()) {
            qpns.push(Qpn::GSI.value());
        }
        Ok(())
    }

    /// Runs `f` on the CM agent (enabling it first), then sends what it queued.
    fn with_cm<R>(
        &self,
        f: impl FnOnce(&mut crate::transport::gsi::Gsi) -> Result<R, ApiError>,
    ) -> Result<R, ApiError> {
        self.cm_enable()?;
        let sh = self.gsi_shard();
        let r = {
            let mut dev = sh.lock();
            let gsi = dev.gsi_mut().ok_or_else(|| {
                ApiError::Engine("the CM agent vanished from QP 1's transport".into())
            })?;
            f(gsi)
        };
        self.drive_or_kick(sh);
        r
    }

    /// Listens for connection requests to `port` of RDMA CM's TCP port space
    /// (`rdma_listen`; service ID `0x0000_0000_0106_<port>`). REQs to a port nobody listens
    /// on are answered with REJ "invalid service ID" (IBTA 12.6.7.2).
    ///
    /// # Errors
    /// [`ApiError::Cm`] if the port is listened on already (`EADDRINUSE`); see
    /// [`Device::cm_enable`].
    pub fn cm_listen(&self, port: u16) -> Result<ServiceId, ApiError> {
        let sid = ServiceId::rdma_cm(PortSpace::Tcp, port);
        self.with_cm(|g| Ok(g.cm_mut().listen(sid)?))?;
        Ok(sid)
    }

    /// Stops listening on `port`; returns whether it was listened on.
    ///
    /// # Errors
    /// See [`Device::cm_enable`].
    pub fn cm_unlisten(&self, port: u16) -> Result<bool, ApiError> {
        let sid = ServiceId::rdma_cm(PortSpace::Tcp, port);
        self.with_cm(|g| Ok(g.cm_mut().unlisten(sid)))
    }

    /// Sends a connection request (`rdma_connect`): resolves the path to `c.dest` from the
    /// kernel's routing and neighbour tables (as [`Device::path_to`] does for a UD address
    /// handle), then sends a REQ for RDMA CM service `c.port` with the RDMA CM IP header and
    /// `c.private_data`. The answer comes as [`CmEvent::Reply`], [`CmEvent::Rejected`] or
    /// [`CmEvent::TimedOut`].
    ///
    /// # Errors
    /// No local GID of `c.dest`'s family, no route or no neighbour, private data too long,
    /// a full connection table; see [`Device::cm_enable`].
    pub fn cm_connect(&self, c: &CmConnect) -> Result<CommId, ApiError> {
        self.cm_enable()?;
        let (local, path) = self.gsi_path(c.dest)?;
        let remote = Gid::from_ip(c.dest);
        let ipv6 = c.dest.is_ipv6();
        // The REQ's path MTU (IBTA 12.7.24: the enum of 9.7.6.1.3, 256 → 1 ... 4096 → 5).
        let code = match self.max_path_mtu(ipv6) {
            4096.. => 5,
            2048.. => 4,
            1024.. => 3,
            512.. => 2,
            _ => 1,
        };
        let mtu = PathMtu::from_code(code).unwrap_or(PathMtu::MTU_1024);
        let params = ConnectParams {
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            path_mtu: mtu,
            srq: c.srq,
            cm_response_timeout: c.cm_response_timeout,
            max_cm_retries: c.max_cm_retries,
            multipath_hint: self.qp_allows_multipath(c.qpn),
            ..ConnectParams::rdma_cm(
                (local, c.src_port).into(),
                (c.dest, c.port).into(),
                c.qpn,
                c.starting_psn,
                &c.private_data,
            )
        };
        let now = self.now();
        self.with_cm(|g| {
            g.set_path(remote, path);
            Ok(g.cm_mut().connect(now, &params)?)
        })
    }

    /// Our source IP for `dest` and the path to `dest`'s QP 1, from the kernel's routing and
    /// neighbour tables (as [`Device::path_to`] for a UD address handle).
    fn gsi_path(&self, dest: IpAddr) -> Result<(IpAddr, crate::transport::Path), ApiError> {
        // Our GID of the peer's family and scope: an IPv6 link-local source only for a
        // link-local peer (the GID table lists link-local addresses first).
        let link_local = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
        let gid_index = self
            .info
            .gids
            .iter()
            .position(|g| g.ip.is_ipv4() == dest.is_ipv4() && link_local(g.ip) == link_local(dest))
            .unwrap_or_else(|| self.info.default_gid_index(dest.is_ipv4()));
        let local = self.gid(gid_index)?.ip;
        let path = self.path_to(gid_index, &Gid::from_ip(dest).0, Qpn::GSI, Qpn::GSI)?;
        Ok((local, path))
    }

    /// Listens for SIDR requests to `port` of RDMA CM's UDP port space (`rdma_listen` on a
    /// `RDMA_PS_UDP` id; service ID `0x0000_0000_0111_<port>`): each comes as a
    /// [`CmEvent::SidrRequest`], answered with [`Device::cm_sidr_reply`]. A SIDR_REQ to a port
    /// nobody listens on is answered with status "unsupported" (IBTA 12.11.2).
    ///
    /// # Errors
    /// As [`Device::cm_listen`].
    pub fn cm_listen_ud(&self, port: u16) -> Result<ServiceId, ApiError> {
        let sid = ServiceId::rdma_cm(PortSpace::Udp, port);
        self.with_cm(|g| Ok(g.cm_mut().listen(sid)?))?;
        Ok(sid)
    }

    /// Stops listening for SIDR requests to UDP-port-space `port`; returns whether it was
    /// listened on. Call it when the `RDMA_PS_UDP` id that listens is destroyed.
    ///
    /// # Errors
    /// See [`Device::cm_enable`].
    pub fn cm_unlisten_ud(&self, port: u16) -> Result<bool, ApiError> {
        let sid = ServiceId::rdma_cm(PortSpace::Udp, port);
        self.with_cm(|g| Ok(g.cm_mut().unlisten(sid)))
    }

    /// Asks `dest` for the UD QP that serves its UDP-port-space `port` (`rdma_connect` on a
    /// `RDMA_PS_UDP` id, cma.c `cma_resolve_ib_udp`): sends a SIDR_REQ with the RDMA CM IP
    /// header (source port `src_port`) and `private_data`. The answer is a
    /// [`CmEvent::SidrReply`] (its QPN and Q_Key on success) or [`CmEvent::SidrTimedOut`].
    ///
    /// # Errors
    /// As [`Device::cm_connect`].
    pub fn cm_sidr_request(
        &self,
        dest: IpAddr,
        port: u16,
        src_port: u16,
        private_data: &[u8],
    ) -> Result<CommId, ApiError> {
        self.cm_enable()?;
        let (local, path) = self.gsi_path(dest)?;
        let remote = Gid::from_ip(dest);
        let pd = CmaHdr {
            src_port,
            src: local,
            dst: dest,
        }
        .with_user_data(private_data);
        let sid = ServiceId::rdma_cm(PortSpace::Udp, port);
        let now = self.now();
        self.with_cm(|g| {
            g.set_path(remote, path);
            Ok(g.cm_mut()
                .sidr_request(now, remote, sid, PKey::DEFAULT, &pd)?)
        })
    }

    /// Answers a [`CmEvent::SidrRequest`] (`rdma_accept` on a UDP id, or `rdma_reject`):
    /// `status` [`SidrStatus::SUCCESS`] with our UD QP and its Q_Key, or a refusal.
    ///
    /// # Errors
    /// No such request, private data longer than 136 bytes.
    pub fn cm_sidr_reply(
        &self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), ApiError> {
        self.with_cm(|g| Ok(g.cm_mut().sidr_reply(id, status, qpn, qkey, private_data)?))
    }

    /// Accepts a [`CmEvent::ConnectRequest`] (`rdma_accept`): sends the REP. The connection
    /// is established when the peer's RTU arrives ([`CmEvent::Established`]).
    ///
    /// # Errors
    /// No such connection, or not waiting for an answer.
    pub fn cm_accept(&self, id: CommId, a: &CmAccept) -> Result<(), ApiError> {
        let allows = self.qp_allows_multipath(a.qpn);
        let p = AcceptParams {
            qpn: a.qpn,
            starting_psn: a.starting_psn,
            responder_resources: a.responder_resources,
            initiator_depth: a.initiator_depth,
            rnr_retry_count: a.rnr_retry_count,
            srq: a.srq,
            target_ack_delay: 0,
            multipath_hint: allows,
            private_data: a.private_data.clone(),
        };
        let now = self.now();
        let hinted = self.with_cm(|g| {
            let hinted = g.cm().req_multipath_hint(id);
            g.cm_mut().accept(now, id, &p)?;
            Ok(hinted)
        })?;
        if allows && hinted {
            self.take_multipath_hint(a.qpn);
        }
        Ok(())
    }

    /// Whether QP `qpn` allows the multipath extension (an RC QP of a device with
    /// `transport.multipath`, or one [`crate::transport::Device::set_multipath`] allowed):
    /// only then do its REQ or REP hint it (docs/multipath.md, "Hints out of band").
    fn qp_allows_multipath(&self, qpn: Qpn) -> bool {
        self.by_qpn(qpn)
            .lock()
            .qp(qpn)
            .is_some_and(|q| matches!(q.multipath(), MpState::Offering | MpState::On))
    }

    /// The CM exchange said that the peer QP of our QP `qpn` allows the multipath extension:
    /// [`Device::set_multipath_peer`] if the QP is still in RESET or INIT. A passive side that
    /// moves its QP to RTR before [`Device::cm_accept`] (as `rdma_accept` does) calls
    /// [`Device::set_multipath_peer`] itself on a REQ with `multipath_hint`, before RTR.
    fn take_multipath_hint(&self, qpn: Qpn) {
        match self.set_multipath_peer(qpn) {
            Ok(()) => log::debug!("QP {qpn}: the CM exchange hinted the multipath extension"),
            Err(e) => log::debug!("QP {qpn}: multipath hint of the CM exchange not taken: {e}"),
        }
    }

    /// A [`CmEvent::Reply`] whose REP hinted the multipath extension back (the CM keeps the
    /// hint only if our REQ hinted too): our QP, before RTR, starts with the extension on.
    /// Call it on every event handed out, with the connection's QPN read before.
    fn on_event_out(&self, e: &CmEvent, qpn: Option<Qpn>) {
        if let (CmEvent::Reply { rep, .. }, Some(qpn)) = (e, qpn)
            && rep.multipath_hint
        {
            self.take_multipath_hint(qpn);
        }
    }

    /// Rejects a [`CmEvent::ConnectRequest`] or a [`CmEvent::Reply`] (`rdma_reject`): sends a
    /// REJ with reason "consumer reject" and `private_data`.
    ///
    /// # Errors
    /// No such connection, or not waiting for an answer.
    pub fn cm_reject(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        self.with_cm(|g| Ok(g.cm_mut().reject(id, private_data)?))
    }

    /// Active side, after a [`CmEvent::Reply`] and with the QP in RTS: sends the RTU
    /// (`rdma_connect`'s completion in librdmacm, cma.c `cma_rep_recv`); the connection is
    /// then [`CmEvent::Established`].
    ///
    /// # Errors
    /// No such connection, or no REP received.
    pub fn cm_ready(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        self.with_cm(|g| Ok(g.cm_mut().ready_to_use(id, private_data)?))
    }

    /// Disconnects an established connection (`rdma_disconnect`): sends a DREQ; the peer's
    /// DREP (or the DREQ's timeout) gives [`CmEvent::Disconnected`], and the connection's
    /// TimeWait ends with [`CmEvent::TimeWaitExit`].
    ///
    /// # Errors
    /// No such connection, or not established.
    pub fn cm_disconnect(&self, id: CommId, private_data: &[u8]) -> Result<(), ApiError> {
        let now = self.now();
        self.with_cm(|g| Ok(g.cm_mut().disconnect(now, id, private_data)?))
    }

    /// The application is done with a connection (`rdma_destroy_id`, `ib_destroy_cm_id`): the
    /// peer is told as the kernel's CM tells it (a REJ before establishment, one DREQ after,
    /// see [`crate::ibcm::Cm::destroy`]), and the ID is forgotten. Closing the device does this
    /// for every connection still held.
    ///
    /// # Errors
    /// No such connection.
    pub fn cm_destroy(&self, id: CommId) -> Result<(), ApiError> {
        let now = self.now();
        self.with_cm(|g| Ok(g.cm_mut().destroy(now, id)?))
    }

    /// [`Device::cm_destroy`] for every connection, if the CM runs: called when the device
    /// closes, before its engines send their last frames, so that every peer hears of it as
    /// it hears of a process whose IDs the kernel destroys at exit.
    pub(super) fn cm_destroy_all(&self) {
        let now = self.now();
        if let Some(g) = self.gsi_shard().lock().gsi_mut() {
            g.cm_mut().destroy_all(now);
        }
    }

    /// A connection's state, `None` once it is forgotten (or the CM does not run).
    #[must_use]
    pub fn cm_state(&self, id: CommId) -> Option<CmState> {
        self.gsi_shard().lock().gsi().and_then(|g| g.cm().state(id))
    }

    /// The next CM event, without waiting (`rdma_get_cm_event` on a non-blocking channel).
    #[must_use]
    pub fn poll_cm_event(&self) -> Option<CmEvent> {
        self.drive();
        let (e, qpn) = {
            let mut dev = self.gsi_shard().lock();
            let g = dev.gsi_mut()?;
            let e = g.cm_mut().poll_event()?;
            let qpn = event_qpn(g.cm(), &e);
            (e, qpn)
        };
        self.on_event_out(&e, qpn);
        Some(e)
    }

    /// The next CM event, waiting up to `timeout` for one (`rdma_get_cm_event`). The engines
    /// signal after every turn that received frames or ran timers; the wait is rechecked
    /// every 10 ms at most.
    #[must_use]
    pub fn wait_cm_event(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.drive_before_wait();
            let sh = self.gsi_shard();
            let mut dev = sh.lock();
            if let Some(g) = dev.gsi_mut()
                && let Some(e) = g.cm_mut().poll_event()
            {
                let qpn = event_qpn(g.cm(), &e);
                drop(dev);
                self.on_event_out(&e, qpn);
                return Some(e);
            }
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            let step = left.min(Duration::from_millis(10));
            self.app_blocks(sh);
            drop(sh.wait_progress(dev, step));
        }
    }

    /// The CM agent's counters and QP 1's drop reasons, if the CM runs.
    #[must_use]
    pub fn cm_stats(&self) -> Option<(CmStats, GsiStats)> {
        self.gsi_shard()
            .lock()
            .gsi()
            .map(|g| (g.cm().stats(), g.stats()))
    }

    /// The engines' clock now, for the CM's timers.
    fn now(&self) -> crate::time::Instant {
        self.clock.now()
    }
}

/// Our QPN of a [`CmEvent::Reply`]'s connection (the one the multipath hint is for).
fn event_qpn(cm: &crate::ibcm::Cm, e: &CmEvent) -> Option<Qpn> {
    match e {
        CmEvent::Reply { id, .. } => cm.local_qpn(*id),
        _ => None,
    }
}
