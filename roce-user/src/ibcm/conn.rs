//! The communication manager's state machine for one port (IBTA vol 1, 12.9 "Communication
//! establishment state diagrams", 12.9.7 active, 12.9.8 passive; the kernel's
//! drivers/infiniband/core/cm.c), sans-I/O in the style of quinn-proto.
//!
//! The caller owns the I/O: it passes every CM MAD received on QP1 to [`Cm::handle_mad`],
//! sends every [`Transmit`] that [`Cm::poll_transmit`] returns as a UD SEND to the peer's QP1
//! (GSI Q_Key, default P_Key), hands the [`Event`]s of [`Cm::poll_event`] to the consumer,
//! and calls [`Cm::handle_timeout`] when the time [`Cm::poll_timeout`] names has come. Time is
//! an argument everywhere ([`Instant`]); the CM reads no clock.
//!
//! Connections are named by our local communication ID ([`CommId`]). States follow the
//! kernel's `enum ib_cm_state`; IDLE is the absence of an entry.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use super::mad::{
    CaGuid, CmMad, CmMsg, CommId, Drep, Dreq, Gid, IbaTime, MAD_LEN, MadError, Mra, MsgMraed,
    MsgRejected, PathMtu, Rej, RejReason, Rep, Req, ReqPath, Rtu, ServiceId, SidrRep, SidrReq,
    SidrStatus, Tid, TransportType,
};
use crate::time::Instant;
use crate::wire::{PKey, Psn, QKey, Qpn};

/// Settings of one CM agent. The defaults are RDMA CM's (cma.c).
#[derive(Clone, Copy, Debug)]
pub struct CmConfig {
    /// Our CA (node) GUID, sent as LocalCAGUID; must be stable and non-zero (IBTA 12.4.1).
    pub ca_guid: CaGuid,
    /// How long we take to answer, announced in our REQs (`CMA_CM_RESPONSE_TIMEOUT` 20,
    /// 4.3 s); also what we assume of a peer in our REQ's retransmit time.
    pub cm_response_timeout: IbaTime,
    /// Retransmissions of a REQ, REP, DREQ or SIDR_REQ (`CMA_MAX_CM_RETRIES` 15, IBTA
    /// 12.7.27).
    pub max_cm_retries: u8,
    /// Packet lifetime of the path (`CMA_IBOE_PACKET_LIFETIME` 18 on RoCE).
    pub packet_life_time: IbaTime,
    /// Service timeout we announce in an MRA (`CMA_CM_MRA_SETTING` 24, 68.7 s).
    pub mra_service_timeout: IbaTime,
    /// The first local communication ID handed out (the kernel randomises its ids;
    /// the caller seeds this so that restarts do not reuse IDs).
    pub comm_id_seed: u32,
    /// The upper 32 bits of our transaction IDs (the kernel puts its MAD agent's hi_tid there).
    pub tid_hi: u32,
    /// Connections (in any state, TimeWait included) we hold at most; a REQ beyond it is
    /// rejected with NO_RESOURCES.
    pub max_connections: usize,
}

impl CmConfig {
    /// RDMA CM's settings for a CA GUID.
    #[must_use]
    pub const fn new(ca_guid: CaGuid) -> Self {
        Self {
            ca_guid,
            cm_response_timeout: IbaTime::new(20),
            max_cm_retries: 15,
            packet_life_time: IbaTime::new(18),
            mra_service_timeout: IbaTime::new(24),
            comm_id_seed: 1,
            tid_hi: 0,
            max_connections: 65_536,
        }
    }

    /// Time a sender waits for the answer to a message whose receiver announced `response`
    /// (IBTA 12.7.13 and 12.7.27: the response timeout plus a round trip of packet lifetimes;
    /// cm.c `cm_send_req`: `2 * packet_life_time + remote_cm_response_timeout`).
    fn retransmit_after(&self, response: IbaTime) -> Duration {
        self.packet_life_time.duration() * 2 + response.duration()
    }

    /// How long a connection stays in TimeWait (IBTA 12.9.6 "TimeWait": long enough for
    /// packets in flight to die; cm.c `cm_enter_timewait` waits the local ACK timeout,
    /// one more than the packet lifetime).
    fn timewait(&self) -> Duration {
        IbaTime::new(self.packet_life_time.value().saturating_add(1).min(31)).duration()
    }
}

/// A CM MAD to send to `dest`'s QP1 as a UD SEND (GSI Q_Key 0x80010000, P_Key 0xFFFF).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Transmit {
    /// The peer's GID (its IP on RoCE v2).
    pub dest: Gid,
    /// The 256-byte MAD.
    pub mad: Box<[u8; MAD_LEN]>,
}

/// What happened, for the consumer.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// Passive: a REQ for a service we listen on (IBTA 12.9.8.1). Answer with
    /// [`Cm::accept`], [`Cm::reject`] or, to gain time, [`Cm::delay`].
    ConnectRequest {
        /// Our handle for the connection.
        id: CommId,
        /// Where it came from.
        from: Gid,
        /// The REQ.
        req: Box<Req>,
    },
    /// Active: the REP arrived (IBTA 12.9.7.2). Move the QP to RTR and RTS with its QPN,
    /// PSN and resources, then call [`Cm::ready_to_use`] (which sends the RTU). The REP's
    /// `multipath_hint` is set only if our REQ hinted too: then tell the QP, before RTR, that
    /// its peer allows the multipath extension (`roce::api::Device` does it as it hands out
    /// the event).
    Reply {
        /// The connection.
        id: CommId,
        /// The REP.
        rep: Box<Rep>,
    },
    /// The connection is established (active: RTU sent; passive: RTU received or
    /// [`Cm::notify_established`]).
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer rejected (REJ received); the connection is gone (or in TimeWait for a
    /// stale connection).
    Rejected {
        /// The connection.
        id: CommId,
        /// Why.
        reason: RejReason,
        /// Additional reject information.
        ari: Vec<u8>,
        /// The peer's private data (a consumer reject's reason).
        private_data: Vec<u8>,
    },
    /// A REQ or REP was retransmitted `max_cm_retries` times without an answer
    /// (IBTA 12.7.27); the connection is gone and a REJ with reason TIMEOUT was sent.
    TimedOut {
        /// The connection.
        id: CommId,
    },
    /// The connection is disconnected (DREQ received, DREP received, or our DREQ went
    /// unanswered); it is in TimeWait and its QP must go to the error state.
    Disconnected {
        /// The connection.
        id: CommId,
        /// The peer's DREQ or DREP private data (empty if none arrived).
        private_data: Vec<u8>,
    },
    /// TimeWait is over (IBTA 12.9.6): the QP may be reused.
    TimeWaitExit {
        /// The connection, now forgotten.
        id: CommId,
    },
    /// Passive: a SIDR_REQ for a service we listen on (IBTA 12.11). Answer with
    /// [`Cm::sidr_reply`].
    SidrRequest {
        /// Our handle for the request.
        id: CommId,
        /// Where it came from.
        from: Gid,
        /// The request.
        req: SidrReq,
    },
    /// Active: the SIDR_REP for our request.
    SidrReply {
        /// The request.
        id: CommId,
        /// The reply.
        rep: SidrRep,
    },
    /// Active: our SIDR_REQ went unanswered after `max_cm_retries` retransmissions.
    SidrTimedOut {
        /// The request.
        id: CommId,
    },
}

/// A connection's state (cm.c `enum ib_cm_state`; IDLE is the absence of a connection).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: REQ sent, the peer sent MRA: waiting longer.
    MraReqRcvd,
    /// Passive: REQ received, the consumer decides.
    ReqRcvd,
    /// Passive: REQ received, we sent MRA.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: REP sent, the peer sent MRA.
    MraRepRcvd,
    /// Active: REP received, the consumer readies the QP.
    RepRcvd,
    /// Active: REP received, we sent MRA.
    MraRepSent,
    /// Established.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// TimeWait.
    TimeWait,
}

/// Why a consumer's call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection with that ID.
    #[error("no CM connection {0}")]
    UnknownId(CommId),
    /// The call does not fit the connection's state.
    #[error("CM connection {id} is in state {state:?}, which does not allow {call}")]
    WrongState {
        /// The connection.
        id: CommId,
        /// Its state.
        state: State,
        /// The refused call.
        call: &'static str,
    },
    /// Someone already listens on the service ID.
    #[error("service ID {0} already has a listener")]
    AlreadyListening(ServiceId),
    /// The connection table is full.
    #[error("CM connection table is full ({0} connections)")]
    TooManyConnections(usize),
    /// A message could not be built (private data too long).
    #[error(transparent)]
    Mad(#[from] MadError),
}

/// Why a received MAD was dropped. Every drop is counted in [`CmStats`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// Not a CM MAD we accept.
    #[error(transparent)]
    Malformed(#[from] MadError),
    /// A message for no connection of ours (after the answer the spec asks for, if any).
    #[error("{0} for an unknown communication ID")]
    UnknownId(&'static str),
    /// A message that does not fit the connection's state (a late duplicate).
    #[error("{msg} in state {state:?}")]
    WrongState {
        /// The message.
        msg: &'static str,
        /// The connection's state.
        state: State,
    },
}

/// Counters of one CM agent (the kernel's `cm_counter_groups` in spirit).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CmStats {
    /// MADs sent (retransmissions included).
    pub sent: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// MADs received and accepted.
    pub received: u64,
    /// Duplicate REQ, REP, DREQ or SIDR_REQ received and answered (or dropped).
    pub duplicates: u64,
    /// MADs dropped as malformed.
    pub malformed: u64,
    /// MADs dropped for naming no connection or not fitting its state.
    pub unexpected: u64,
    /// REJs sent because nobody listened (INVALID_SERVICE_ID).
    pub no_listener: u64,
    /// REJs sent for a stale connection.
    pub stale: u64,
}

/// The parameters of an active connection request (`struct ib_cm_req_param`).
#[derive(Clone, Debug)]
pub struct ConnectParams {
    /// The peer's GID (its IP).
    pub remote: Gid,
    /// Our GID on the path (the source IP).
    pub local: Gid,
    /// The service asked for ([`ServiceId::rdma_cm`]).
    pub service_id: ServiceId,
    /// Our QPN.
    pub qpn: Qpn,
    /// Our starting PSN.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests we accept at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we send at once.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Partition key.
    pub pkey: PKey,
    /// Whether our QP uses an SRQ.
    pub srq: bool,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// Hop limit of the path (the route's; cma.c takes it from the route's hop limit).
    pub hop_limit: u8,
    /// Flow label of the path.
    pub flow_label: u32,
    /// Private data (RDMA CM: [`super::ip::CmaHdr`] then the consumer's; up to 92 bytes).
    pub private_data: Vec<u8>,
    /// This connection's CM response timeout (`ib_cm_req_param`'s remote and local
    /// `cm_response_timeout`): what we allow the peer to answer our REQ in, and announce for
    /// our RTU, so both the REQ's and the peer's REP resends come every `2 × packet lifetime
    /// + this` (IBTA 12.7.13, 12.7.27). `None`: [`CmConfig::cm_response_timeout`].
    pub cm_response_timeout: Option<IbaTime>,
    /// This connection's REQ resends before [`Event::TimedOut`], also announced in the REQ for
    /// the peer's REP resends (`ib_cm_req_param.max_cm_retries`, 4 bits, IBTA 12.7.27).
    /// `None`: [`CmConfig::max_cm_retries`].
    pub max_cm_retries: Option<u8>,
    /// Hint in the REQ that our QP allows the multipath extension
    /// ([`super::mad::MULTIPATH_HINT_AT`]; docs/multipath.md, "Hints out of band"). Set it only
    /// for a QP that allows it: a peer that hints back sends trailers from its first packet.
    pub multipath_hint: bool,
}

impl ConnectParams {
    /// A connection request as `rdma_connect` makes one with librdmacm's and rping's usual
    /// `rdma_conn_param` (1 responder resource, initiator depth 1, retry and RNR retry 7) in
    /// the TCP port space: from `local`:`src_port` to `remote`:`port` for QP `qpn` starting
    /// at `starting_psn`, with RDMA CM's IP header then `user_data` as private data (cma.c
    /// `cma_format_hdr`); path MTU 1024, the default P_Key, no SRQ, traffic class 0, hop limit
    /// 64, flow label 0. Change any field after.
    #[must_use]
    pub fn rdma_cm(
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        qpn: Qpn,
        starting_psn: Psn,
        user_data: &[u8],
    ) -> Self {
        Self {
            remote: Gid::from_ip(remote.ip()),
            local: Gid::from_ip(local.ip()),
            service_id: ServiceId::rdma_cm(super::ip::PortSpace::Tcp, remote.port()),
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: PathMtu::MTU_1024,
            pkey: PKey::DEFAULT,
            srq: false,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            private_data: super::ip::CmaHdr {
                src_port: local.port(),
                src: local.ip(),
                dst: remote.ip(),
            }
            .with_user_data(user_data),
            cm_response_timeout: None,
            max_cm_retries: None,
            multipath_hint: false,
        }
    }
}

/// The parameters of a passive accept (`struct ib_cm_rep_param`).
#[derive(Clone, Debug)]
pub struct AcceptParams {
    /// Our QPN.
    pub qpn: Qpn,
    /// Our starting PSN.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests we accept at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we send at once (at most the REQ's responder resources).
    pub initiator_depth: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Whether our QP uses an SRQ.
    pub srq: bool,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Our QP allows the multipath extension: the REP hints it back if the REQ hinted
    /// ([`super::mad::MULTIPATH_HINT_AT`]), and only then.
    pub multipath_hint: bool,
    /// Private data (up to 196 bytes).
    pub private_data: Vec<u8>,
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: Gid,
    tid: Tid,
    /// The peer's communication ID, once known (REQ received or REP received).
    remote_id: Option<CommId>,
    remote_ca_guid: Option<CaGuid>,
    remote_qpn: Option<Qpn>,
    local_qpn: Qpn,
    /// Time the peer has to answer our outstanding message: active, the REQ's remote CM
    /// response timeout; passive, the local one the peer announced in its REQ.
    peer_response: IbaTime,
    max_retries: u8,
    /// The message awaiting an answer, resent on timeout.
    outstanding: Option<Box<[u8; MAD_LEN]>>,
    retries_left: u8,
    deadline: Option<Instant>,
    /// The last response sent (REP, MRA, RTU, DREP), resent on a duplicate.
    last_response: Option<Box<[u8; MAD_LEN]>>,
    service_id: ServiceId,
    /// The REQ hinted the multipath extension (active: ours; passive: the peer's).
    req_multipath_hint: bool,
}

#[derive(Debug)]
struct Sidr {
    peer: Gid,
    tid: Tid,
    /// Active: the SIDR_REQ to resend. Passive: `None` (we wait for the consumer).
    outstanding: Option<Box<[u8; MAD_LEN]>>,
    retries_left: u8,
    deadline: Option<Instant>,
    /// Passive: the peer's request ID.
    remote_id: Option<CommId>,
    service_id: ServiceId,
}

/// Whose timer an entry of `Cm::timers` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    Conn(CommId),
    Sidr(CommId),
}

/// Sets a connection's or SIDR request's `deadline` (`slot`) to `at`, keeping the timer index
/// in step. Every change of a deadline goes through here.
fn retime(
    timers: &mut BTreeSet<(Instant, TimerKey)>,
    key: TimerKey,
    slot: &mut Option<Instant>,
    at: Option<Instant>,
) {
    if let Some(old) = slot.take() {
        timers.remove(&(old, key));
    }
    if let Some(t) = at {
        timers.insert((t, key));
    }
    *slot = at;
}

/// The CM agent of one port: listeners, connections and SIDR requests.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    listeners: BTreeSet<ServiceId>,
    conns: BTreeMap<CommId, Conn>,
    /// (remote CA GUID, remote comm ID) → ours: duplicate REQ detection (cm.c
    /// `cm_insert_remote_id`).
    by_remote_id: BTreeMap<(CaGuid, CommId), CommId>,
    /// (remote CA GUID, remote QPN) → ours: stale connection detection (cm.c
    /// `cm_insert_remote_qpn`, IBTA 12.4.1).
    by_remote_qpn: BTreeMap<(CaGuid, Qpn), CommId>,
    sidr: BTreeMap<CommId, Sidr>,
    /// Every armed timer by its deadline, so that the next one is found without scanning
    /// every connection (a CM may hold tens of thousands): the `deadline` of each connection
    /// and SIDR request, indexed. Change a deadline only through [`retime`].
    timers: BTreeSet<(Instant, TimerKey)>,
    /// (peer, peer's request ID) of pending passive SIDR requests.
    sidr_remote: BTreeMap<(Gid, CommId), CommId>,
    next_id: u32,
    next_tid: u32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: CmStats,
}

impl Cm {
    /// A CM agent with no listener and no connection.
    #[must_use]
    pub const fn new(config: CmConfig) -> Self {
        Self {
            config,
            listeners: BTreeSet::new(),
            conns: BTreeMap::new(),
            by_remote_id: BTreeMap::new(),
            by_remote_qpn: BTreeMap::new(),
            sidr: BTreeMap::new(),
            timers: BTreeSet::new(),
            sidr_remote: BTreeMap::new(),
            next_id: config.comm_id_seed,
            next_tid: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats {
                sent: 0,
                retransmits: 0,
                received: 0,
                duplicates: 0,
                malformed: 0,
                unexpected: 0,
                no_listener: 0,
                stale: 0,
            },
        }
    }

    /// The counters.
    #[must_use]
    pub const fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection (`None`: IDLE, unknown or forgotten).
    #[must_use]
    pub fn state(&self, id: CommId) -> Option<State> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// The service ID a connection was requested for.
    #[must_use]
    pub fn service_id(&self, id: CommId) -> Option<ServiceId> {
        self.conns.get(&id).map(|c| c.service_id)
    }

    /// Whether the REQ of a connection hinted the multipath extension (active: ours;
    /// passive: the peer's); false for an unknown connection.
    #[must_use]
    pub fn req_multipath_hint(&self, id: CommId) -> bool {
        self.conns.get(&id).is_some_and(|c| c.req_multipath_hint)
    }

    /// Our QPN of a connection (active: the REQ's; passive: the accept's, 0 before it).
    #[must_use]
    pub fn local_qpn(&self, id: CommId) -> Option<Qpn> {
        self.conns.get(&id).map(|c| c.local_qpn)
    }

    /// The peer of a connection (where its MADs go).
    #[must_use]
    pub fn peer(&self, id: CommId) -> Option<Gid> {
        self.conns.get(&id).map(|c| c.peer)
    }

    /// Number of connections held (TimeWait included).
    #[must_use]
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The next MAD to send, if any. Call it until `None` after every call into the CM.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Whether a MAD waits for [`Self::poll_transmit`] (the caller's transmit path checks it
    /// before it builds a frame).
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.transmits.is_empty()
    }

    /// The next event for the consumer, if any. Call it until `None` after every call.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest time [`Self::handle_timeout`] has work to do (a retransmission, a
    /// give-up, a TimeWait exit), or `None`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// The keys of the timers due at `now`, connections then SIDR requests, each in ID order.
    fn due(&self, now: Instant) -> (Vec<CommId>, Vec<CommId>) {
        let (mut conns, mut sidr) = (Vec::new(), Vec::new());
        for &(_, key) in self.timers.iter().take_while(|(t, _)| *t <= now) {
            match key {
                TimerKey::Conn(id) => conns.push(id),
                TimerKey::Sidr(id) => sidr.push(id),
            }
        }
        conns.sort_unstable();
        sidr.sort_unstable();
        (conns, sidr)
    }

    /// Starts listening for REQs and SIDR_REQs on `service_id` (`ib_cm_listen`).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`].
    pub fn listen(&mut self, service_id: ServiceId) -> Result<(), CmError> {
        if self.listeners.insert(service_id) {
            Ok(())
        } else {
            Err(CmError::AlreadyListening(service_id))
        }
    }

    /// Stops listening on `service_id`; later REQs for it are rejected with
    /// INVALID_SERVICE_ID. Returns whether there was a listener.
    pub fn unlisten(&mut self, service_id: ServiceId) -> bool {
        self.listeners.remove(&service_id)
    }

    fn alloc_id(&mut self) -> Result<CommId, CmError> {
        if self.conns.len() + self.sidr.len() >= self.config.max_connections {
            return Err(CmError::TooManyConnections(self.config.max_connections));
        }
        loop {
            let id = CommId(self.next_id);
            self.next_id = self.next_id.wrapping_add(1);
            if id.0 != 0 && !self.conns.contains_key(&id) && !self.sidr.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    fn alloc_tid(&mut self) -> Tid {
        self.next_tid = self.next_tid.wrapping_add(1);
        Tid((u64::from(self.config.tid_hi) << 32) | u64::from(self.next_tid))
    }

    fn send(&mut self, dest: Gid, mad: &CmMad) -> Result<Box<[u8; MAD_LEN]>, MadError> {
        let bytes = Box::new(mad.encode()?);
        self.transmits.push_back(Transmit {
            dest,
            mad: bytes.clone(),
        });
        self.stats.sent += 1;
        Ok(bytes)
    }

    fn resend(&mut self, dest: Gid, mad: &[u8; MAD_LEN]) {
        self.transmits.push_back(Transmit {
            dest,
            mad: Box::new(*mad),
        });
        self.stats.sent += 1;
    }

    /// Active: sends a REQ (IBTA 12.9.7.1, `ib_send_cm_req`) and returns the connection's ID.
    /// The REQ is resent every `2 × packet lifetime + CM response timeout` until a REP, REJ
    /// or MRA arrives, at most `max_cm_retries` times.
    ///
    /// # Errors
    /// Private data longer than 92 bytes, or a full connection table.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CommId, CmError> {
        let response = p
            .cm_response_timeout
            .unwrap_or(self.config.cm_response_timeout);
        let retries = p.max_cm_retries.unwrap_or(self.config.max_cm_retries) & 0xf;
        let id = self.alloc_id()?;
        let tid = self.alloc_tid();
        let path = ReqPath {
            // RoCE: permissive LIDs (cm.c `cm_format_req` when the hop limit is above 1).
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: p.local,
            remote_gid: p.remote,
            flow_label: p.flow_label & 0xf_ffff,
            packet_rate: 0,
            traffic_class: p.traffic_class,
            hop_limit: p.hop_limit,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: IbaTime::new(self.config.packet_life_time.value() + 1),
        };
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.config.ca_guid,
            local_qkey: QKey::new(0),
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: response,
            transport: TransportType::Rc,
            e2e_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: response,
            retry_count: p.retry_count & 7,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            max_cm_retries: retries,
            srq: p.srq,
            primary: path,
            alternate: ReqPath::default(),
            sap_supported: false,
            multipath_hint: p.multipath_hint,
            private_data: p.private_data.clone(),
        };
        let mad = self.send(p.remote, &CmMad::new(tid, CmMsg::Req(Box::new(req))))?;
        let wait = self.config.retransmit_after(response);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                peer: p.remote,
                tid,
                remote_id: None,
                remote_ca_guid: None,
                remote_qpn: None,
                local_qpn: p.qpn,
                peer_response: response,
                max_retries: retries,
                outstanding: Some(mad),
                retries_left: retries,
                deadline: None,
                last_response: None,
                service_id: p.service_id,
                req_multipath_hint: p.multipath_hint,
            },
        );
        self.set_conn_deadline(id, Some(now + wait));
        Ok(id)
    }

    /// Sets connection `id`'s timer (see [`retime`]); nothing if it is gone.
    fn set_conn_deadline(&mut self, id: CommId, at: Option<Instant>) {
        if let Some(c) = self.conns.get_mut(&id) {
            retime(&mut self.timers, TimerKey::Conn(id), &mut c.deadline, at);
        }
    }

    /// Sets SIDR request `id`'s timer (see [`retime`]); nothing if it is gone.
    fn set_sidr_deadline(&mut self, id: CommId, at: Option<Instant>) {
        if let Some(s) = self.sidr.get_mut(&id) {
            retime(&mut self.timers, TimerKey::Sidr(id), &mut s.deadline, at);
        }
    }

    /// Removes SIDR request `id` and its timer.
    fn remove_sidr(&mut self, id: CommId) -> Option<Sidr> {
        self.set_sidr_deadline(id, None);
        self.sidr.remove(&id)
    }

    fn conn_mut(&mut self, id: CommId) -> Result<&mut Conn, CmError> {
        self.conns.get_mut(&id).ok_or(CmError::UnknownId(id))
    }

    fn wrong(id: CommId, state: State, call: &'static str) -> CmError {
        CmError::WrongState { id, state, call }
    }

    /// Passive: accepts a connection request with a REP (IBTA 12.9.8.2, `ib_send_cm_rep`),
    /// from ReqRcvd or MraReqSent. The REP is resent after the peer's announced CM response
    /// time until the RTU (or the first packet, [`Self::notify_established`]) arrives.
    ///
    /// # Errors
    /// Unknown ID, wrong state, private data longer than 196 bytes.
    pub fn accept(&mut self, now: Instant, id: CommId, p: &AcceptParams) -> Result<(), CmError> {
        let ca_guid = self.config.ca_guid;
        let life2 = self.config.packet_life_time.duration() * 2;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(Self::wrong(id, c.state, "accept"));
        }
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_id.unwrap_or_default(),
            local_qkey: QKey::new(0),
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay & 0x1f,
            // As cma.c `cma_accept_ib` (no alternate path is offered anyway).
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            srq: p.srq,
            local_ca_guid: ca_guid,
            multipath_hint: p.multipath_hint && c.req_multipath_hint,
            private_data: p.private_data.clone(),
        };
        let (peer, tid) = (c.peer, c.tid);
        let wait = life2 + c.peer_response.duration();
        let mad = self.send(peer, &CmMad::new(tid, CmMsg::Rep(rep)))?;
        let c = self.conn_mut(id)?;
        c.local_qpn = p.qpn;
        c.state = State::RepSent;
        c.outstanding = Some(mad.clone());
        c.last_response = Some(mad);
        c.retries_left = c.max_retries;
        self.set_conn_deadline(id, Some(now + wait));
        Ok(())
    }

    /// Passive or active: rejects with reason CONSUMER_DEFINED and `private_data` (up to 148
    /// bytes) (IBTA 12.9.8.3, `ib_send_cm_rej`), from ReqRcvd/MraReqSent (a REQ) or
    /// RepRcvd/MraRepSent (a REP). The connection is forgotten.
    ///
    /// # Errors
    /// Unknown ID, wrong state, private data too long.
    pub fn reject(&mut self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        let message = match c.state {
            State::ReqRcvd | State::MraReqSent => MsgRejected::Req,
            State::RepRcvd | State::MraRepSent => MsgRejected::Rep,
            s => return Err(Self::wrong(id, s, "reject")),
        };
        let rej = Rej {
            local_comm_id: id,
            remote_comm_id: c.remote_id.unwrap_or_default(),
            message,
            reason: RejReason::CONSUMER_DEFINED,
            ari: Vec::new(),
            private_data: private_data.to_vec(),
        };
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, &CmMad::new(tid, CmMsg::Rej(rej)))?;
        self.forget(id);
        Ok(())
    }

    /// Sends an MRA for the REQ (ReqRcvd) or REP (RepRcvd) the consumer needs time to answer
    /// (IBTA 12.6.6, `ib_send_cm_mra`): the peer then waits our service timeout. A duplicate
    /// of the message is answered with the MRA again.
    ///
    /// # Errors
    /// Unknown ID, wrong state.
    pub fn delay(&mut self, id: CommId) -> Result<(), CmError> {
        let service_timeout = self.config.mra_service_timeout;
        let c = self.conn_mut(id)?;
        let (message, next) = match c.state {
            State::ReqRcvd => (MsgMraed::Req, State::MraReqSent),
            State::RepRcvd => (MsgMraed::Rep, State::MraRepSent),
            s => return Err(Self::wrong(id, s, "delay")),
        };
        let mra = Mra {
            local_comm_id: id,
            remote_comm_id: c.remote_id.unwrap_or_default(),
            message,
            service_timeout,
            private_data: Vec::new(),
        };
        let (peer, tid) = (c.peer, c.tid);
        let mad = self.send(peer, &CmMad::new(tid, CmMsg::Mra(mra)))?;
        let c = self.conn_mut(id)?;
        c.state = next;
        c.last_response = Some(mad);
        Ok(())
    }

    /// Active: sends the RTU after the QP is in RTS (IBTA 12.9.7.3, `ib_send_cm_rtu`), from
    /// RepRcvd or MraRepSent; the connection is established. A duplicate REP later is
    /// answered with this RTU again.
    ///
    /// # Errors
    /// Unknown ID, wrong state, private data longer than 224 bytes.
    pub fn ready_to_use(&mut self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(Self::wrong(id, c.state, "ready_to_use"));
        }
        let rtu = Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_id.unwrap_or_default(),
            private_data: private_data.to_vec(),
        };
        let (peer, tid) = (c.peer, c.tid);
        let mad = self.send(peer, &CmMad::new(tid, CmMsg::Rtu(rtu)))?;
        let c = self.conn_mut(id)?;
        c.state = State::Established;
        c.last_response = Some(mad);
        self.events.push_back(Event::Established { id });
        Ok(())
    }

    /// Passive: the QP received its first packet before the RTU (the QP's communication
    /// established event, IBTA 12.9.8.4 and 11.6.3 "COMM_EST"; cm.c `ib_cm_notify`). Moves
    /// RepSent/MraRepRcvd to Established and stops resending the REP; any other state is
    /// left alone.
    ///
    /// # Errors
    /// Unknown ID.
    pub fn notify_established(&mut self, id: CommId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        if matches!(c.state, State::RepSent | State::MraRepRcvd) {
            c.state = State::Established;
            c.outstanding = None;
            self.set_conn_deadline(id, None);
            self.events.push_back(Event::Established { id });
        }
        Ok(())
    }

    /// Disconnects an established connection with a DREQ (IBTA 12.9.6, `ib_send_cm_dreq`),
    /// resent until the DREP arrives; then TimeWait. Without an answer after
    /// `max_cm_retries` resends the connection enters TimeWait anyway.
    ///
    /// # Errors
    /// Unknown ID, wrong state, private data longer than 220 bytes.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let tid = self.alloc_tid();
        let life2 = self.config.packet_life_time.duration() * 2;
        let c = self.conn_mut(id)?;
        if c.state != State::Established {
            return Err(Self::wrong(id, c.state, "disconnect"));
        }
        let dreq = Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id.unwrap_or_default(),
            remote_qpn: c.remote_qpn.unwrap_or_default(),
            private_data: private_data.to_vec(),
        };
        let peer = c.peer;
        let wait = life2 + c.peer_response.duration();
        let mad = self.send(peer, &CmMad::new(tid, CmMsg::Dreq(dreq)))?;
        let c = self.conn_mut(id)?;
        c.tid = tid;
        c.state = State::DreqSent;
        c.outstanding = Some(mad);
        c.retries_left = c.max_retries;
        self.set_conn_deadline(id, Some(now + wait));
        Ok(())
    }

    /// The consumer is done with connection `id` (`ib_destroy_cm_id`; librdmacm's
    /// `rdma_destroy_id`, and every ID of a process that exits): the peer is told as the
    /// kernel's CM tells it (cm.c `cm_destroy_id`). REQ sent, no REP yet: REJ TIMEOUT with our
    /// CA GUID. A REQ or REP received and not answered, or our REP not yet acknowledged: REJ
    /// CONSUMER_DEFINED. Established: one DREQ, not resent, and TimeWait. DREQ sent: TimeWait
    /// without waiting for the DREP. The connection is forgotten, except in TimeWait, which
    /// still guards its QPN against stale REQs until it ends (its `TimeWaitExit` event then
    /// names an ID the consumer no longer holds). No event is raised for the destroy itself.
    ///
    /// # Errors
    /// Unknown ID.
    pub fn destroy(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_id.unwrap_or_default());
        let rej = |message, reason, ari| {
            CmMsg::Rej(Rej {
                local_comm_id: id,
                remote_comm_id: remote,
                message,
                reason,
                ari,
                private_data: Vec::new(),
            })
        };
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                let ari = self.config.ca_guid.0.to_be_bytes().to_vec();
                let _ = self.send(
                    peer,
                    &CmMad::new(tid, rej(MsgRejected::Other, RejReason::TIMEOUT, ari)),
                );
                self.forget(id);
            }
            State::ReqRcvd | State::MraReqSent | State::RepRcvd | State::MraRepSent => {
                self.reject(id, &[])?;
            }
            State::RepSent | State::MraRepRcvd => {
                let m = rej(MsgRejected::Other, RejReason::CONSUMER_DEFINED, Vec::new());
                let _ = self.send(peer, &CmMad::new(tid, m));
                self.forget(id);
            }
            State::Established => {
                self.disconnect(now, id, &[])?;
                self.enter_timewait(now, id);
            }
            State::DreqSent => self.enter_timewait(now, id),
            State::TimeWait => {}
        }
        Ok(())
    }

    /// [`Self::destroy`] for every connection, for a device that closes: call it before the
    /// last MADs are sent, so that every peer hears of it.
    pub fn destroy_all(&mut self, now: Instant) {
        let ids: Vec<CommId> = self.conns.keys().copied().collect();
        for id in ids {
            let _ = self.destroy(now, id);
        }
    }

    /// Active SIDR: asks `remote` which UD QP serves `service_id` (IBTA 12.11,
    /// `ib_send_cm_sidr_req`); resent until the SIDR_REP, at most `max_cm_retries` times.
    ///
    /// # Errors
    /// Private data longer than 216 bytes, or a full table.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        remote: Gid,
        service_id: ServiceId,
        pkey: PKey,
        private_data: &[u8],
    ) -> Result<CommId, CmError> {
        let id = self.alloc_id()?;
        let tid = self.alloc_tid();
        let req = SidrReq {
            request_id: id,
            pkey,
            service_id,
            private_data: private_data.to_vec(),
        };
        let mad = self.send(remote, &CmMad::new(tid, CmMsg::SidrReq(req)))?;
        let wait = self
            .config
            .retransmit_after(self.config.cm_response_timeout);
        self.sidr.insert(
            id,
            Sidr {
                peer: remote,
                tid,
                outstanding: Some(mad),
                retries_left: self.config.max_cm_retries,
                deadline: None,
                remote_id: None,
                service_id,
            },
        );
        self.set_sidr_deadline(id, Some(now + wait));
        Ok(id)
    }

    /// Passive SIDR: answers the SIDR_REQ `id` (IBTA 12.11, `ib_send_cm_sidr_rep`) with a
    /// status, and with SUCCESS the UD QP and its Q_Key.
    ///
    /// # Errors
    /// Unknown ID, private data longer than 136 bytes.
    pub fn sidr_reply(
        &mut self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let s = self.sidr.get(&id).ok_or(CmError::UnknownId(id))?;
        let Some(remote_id) = s.remote_id else {
            return Err(CmError::UnknownId(id));
        };
        let rep = SidrRep {
            request_id: remote_id,
            status,
            qpn,
            service_id: s.service_id,
            qkey,
            add_info: Vec::new(),
            private_data: private_data.to_vec(),
        };
        let (peer, tid) = (s.peer, s.tid);
        self.send(peer, &CmMad::new(tid, CmMsg::SidrRep(rep)))?;
        self.remove_sidr(id);
        self.sidr_remote.remove(&(peer, remote_id));
        Ok(())
    }

    /// Forgets a connection and its index entries (back to IDLE).
    fn forget(&mut self, id: CommId) {
        self.set_conn_deadline(id, None);
        if let Some(c) = self.conns.remove(&id) {
            if let (Some(g), Some(r)) = (c.remote_ca_guid, c.remote_id)
                && self.by_remote_id.get(&(g, r)) == Some(&id)
            {
                self.by_remote_id.remove(&(g, r));
            }
            if let (Some(g), Some(q)) = (c.remote_ca_guid, c.remote_qpn)
                && self.by_remote_qpn.get(&(g, q)) == Some(&id)
            {
                self.by_remote_qpn.remove(&(g, q));
            }
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        let tw = self.config.timewait();
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.outstanding = None;
            retime(
                &mut self.timers,
                TimerKey::Conn(id),
                &mut c.deadline,
                Some(now + tw),
            );
        }
    }

    /// Sends a REJ that answers a message with no connection behind it (cm.c `cm_issue_rej`).
    fn issue_rej(
        &mut self,
        dest: Gid,
        tid: Tid,
        remote_comm_id: CommId,
        message: MsgRejected,
        reason: RejReason,
        ari: Vec<u8>,
    ) {
        let rej = Rej {
            local_comm_id: CommId(0),
            remote_comm_id,
            message,
            reason,
            ari,
            private_data: Vec::new(),
        };
        // Cannot fail: no private data, an ARI of at most 8 bytes.
        let _ = self.send(dest, &CmMad::new(tid, CmMsg::Rej(rej)));
    }

    /// Handles one MAD received on QP1 from `from` (the GID of the sender; its source QP is
    /// 1). Answers the spec requires go to the transmit queue, news to the event queue.
    ///
    /// # Errors
    /// A [`Dropped`] when the MAD was dropped (it is also counted in [`CmStats`]).
    pub fn handle_mad(&mut self, now: Instant, from: Gid, buf: &[u8]) -> Result<(), Dropped> {
        let mad = match CmMad::decode(buf) {
            Ok(m) => m,
            Err(e) => {
                self.stats.malformed += 1;
                return Err(e.into());
            }
        };
        let name = mad.msg.name();
        let r = match mad.msg {
            CmMsg::Req(req) => self.on_req(now, from, mad.tid, *req),
            CmMsg::Mra(m) => self.on_mra(now, &m),
            CmMsg::Rej(m) => self.on_rej(now, m),
            CmMsg::Rep(m) => self.on_rep(now, from, mad.tid, m),
            CmMsg::Rtu(m) => self.on_rtu(&m),
            CmMsg::Dreq(m) => self.on_dreq(now, from, mad.tid, m),
            CmMsg::Drep(m) => self.on_drep(now, m),
            CmMsg::SidrReq(m) => self.on_sidr_req(from, mad.tid, m),
            CmMsg::SidrRep(m) => self.on_sidr_rep(m),
        };
        match r {
            Ok(()) => {
                self.stats.received += 1;
                Ok(())
            }
            Err(e) => {
                self.stats.unexpected += 1;
                log_drop(name, &e);
                Err(e)
            }
        }
    }

    /// REQ received (IBTA 12.9.8.1; cm.c `cm_req_handler`/`cm_match_req`): a duplicate is
    /// answered with the last response (MRA or REP; REJ STALE_CONN in TimeWait), a REQ whose
    /// CA GUID and QPN are still in use is rejected as stale (and the old connection is
    /// disconnected), a REQ for no listener is rejected with INVALID_SERVICE_ID.
    fn on_req(&mut self, now: Instant, from: Gid, tid: Tid, req: Req) -> Result<(), Dropped> {
        let key = (req.local_ca_guid, req.local_comm_id);
        if let Some(&id) = self.by_remote_id.get(&key) {
            self.stats.duplicates += 1;
            let c = &self.conns[&id];
            match c.state {
                State::MraReqSent | State::RepSent | State::MraRepRcvd => {
                    if let Some(m) = c.last_response.clone() {
                        self.resend(c.peer, &m);
                    }
                }
                State::TimeWait => {
                    self.stats.stale += 1;
                    self.issue_rej(
                        from,
                        tid,
                        req.local_comm_id,
                        MsgRejected::Req,
                        RejReason::STALE_CONN,
                        Vec::new(),
                    );
                }
                _ => {}
            }
            return Ok(());
        }
        if let Some(&old) = self.by_remote_qpn.get(&(req.local_ca_guid, req.local_qpn)) {
            // IBTA 12.4.1: a REQ from a QP we believe connected is a stale connection.
            self.stats.stale += 1;
            self.issue_rej(
                from,
                tid,
                req.local_comm_id,
                MsgRejected::Req,
                RejReason::STALE_CONN,
                Vec::new(),
            );
            if self.conns.get(&old).map(|c| c.state) == Some(State::Established) {
                let _ = self.disconnect(now, old, &[]);
            }
            return Ok(());
        }
        if !self.listeners.contains(&req.service_id) {
            self.stats.no_listener += 1;
            self.issue_rej(
                from,
                tid,
                req.local_comm_id,
                MsgRejected::Req,
                RejReason::INVALID_SERVICE_ID,
                Vec::new(),
            );
            return Ok(());
        }
        if req.transport != TransportType::Rc && req.transport != TransportType::Uc {
            self.issue_rej(
                from,
                tid,
                req.local_comm_id,
                MsgRejected::Req,
                RejReason::INVALID_TRANSPORT_TYPE,
                Vec::new(),
            );
            return Ok(());
        }
        let Ok(id) = self.alloc_id() else {
            self.issue_rej(
                from,
                tid,
                req.local_comm_id,
                MsgRejected::Req,
                RejReason::NO_RESOURCES,
                Vec::new(),
            );
            return Ok(());
        };
        self.by_remote_id.insert(key, id);
        self.by_remote_qpn
            .insert((req.local_ca_guid, req.local_qpn), id);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: from,
                tid,
                remote_id: Some(req.local_comm_id),
                remote_ca_guid: Some(req.local_ca_guid),
                remote_qpn: Some(req.local_qpn),
                local_qpn: Qpn::new(0),
                peer_response: req.local_cm_response_timeout,
                max_retries: req.max_cm_retries,
                outstanding: None,
                retries_left: 0,
                deadline: None,
                last_response: None,
                service_id: req.service_id,
                req_multipath_hint: req.multipath_hint,
            },
        );
        self.events.push_back(Event::ConnectRequest {
            id,
            from,
            req: Box::new(req),
        });
        Ok(())
    }

    /// Looks a connection up by the receiver's (our) comm ID, checking the sender's ID
    /// when we know it (cm.c `cm_acquire_id(local_id, remote_id)`).
    fn lookup(&self, ours: CommId, theirs: CommId, msg: &'static str) -> Result<CommId, Dropped> {
        match self.conns.get(&ours) {
            Some(c) if c.remote_id.is_none_or(|r| r == theirs) => Ok(ours),
            _ => Err(Dropped::UnknownId(msg)),
        }
    }

    /// MRA received (IBTA 12.6.6, cm.c `cm_mra_handler`): the peer needs its service
    /// timeout; our outstanding REQ or REP waits that long (plus a packet lifetime) before
    /// the next resend.
    fn on_mra(&mut self, now: Instant, m: &Mra) -> Result<(), Dropped> {
        let id = self.lookup(m.remote_comm_id, m.local_comm_id, "MRA")?;
        let life = self.config.packet_life_time.duration();
        let c = self.conns.get_mut(&id).ok_or(Dropped::UnknownId("MRA"))?;
        let next = match (c.state, m.message) {
            (State::ReqSent | State::MraReqRcvd, MsgMraed::Req) => State::MraReqRcvd,
            (State::RepSent | State::MraRepRcvd, MsgMraed::Rep) => State::MraRepRcvd,
            (s, _) => {
                return Err(Dropped::WrongState {
                    msg: "MRA",
                    state: s,
                });
            }
        };
        c.state = next;
        if c.remote_id.is_none() {
            c.remote_id = Some(m.local_comm_id);
        }
        let at = now + m.service_timeout.duration() + life;
        retime(
            &mut self.timers,
            TimerKey::Conn(id),
            &mut c.deadline,
            Some(at),
        );
        Ok(())
    }

    /// REJ received (IBTA 12.9.7, 12.9.8; cm.c `cm_rej_handler`): the connection is gone,
    /// or in TimeWait for STALE_CONN or an established one.
    ///
    /// A REJ of a REQ is matched by its remote comm ID alone: the rejecter may have had no
    /// ID of its own (0, cm.c `cm_issue_rej`), as cm.c `cm_acquire_rejected_id` does.
    fn on_rej(&mut self, now: Instant, m: Rej) -> Result<(), Dropped> {
        let id = if m.reason == RejReason::TIMEOUT {
            // A REJ TIMEOUT names its sender by the CA GUID in its ARI and its own comm ID
            // (cm.c `cm_acquire_rejected_id`): the sender may never have learnt ours.
            let guid = m
                .ari
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(|b| CaGuid(u64::from_be_bytes(b)));
            guid.and_then(|g| self.by_remote_id.get(&(g, m.local_comm_id)).copied())
                .or_else(|| {
                    // A REQ's time-out from a peer that knows our ID is also matched by it.
                    (m.message == MsgRejected::Req && self.conns.contains_key(&m.remote_comm_id))
                        .then_some(m.remote_comm_id)
                })
                .ok_or(Dropped::UnknownId("REJ"))?
        } else if m.message == MsgRejected::Req {
            let id = m.remote_comm_id;
            if !self.conns.contains_key(&id) {
                return Err(Dropped::UnknownId("REJ"));
            }
            id
        } else {
            self.lookup(m.remote_comm_id, m.local_comm_id, "REJ")?
        };
        // cm.c `cm_rej_handler`: before an established connection the REJ ends it (TimeWait
        // for STALE_CONN); after our REP was received, or a DREQ sent, TimeWait.
        let state = self.conns[&id].state;
        let timewait = match state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepSent
            | State::MraRepRcvd
            | State::ReqRcvd
            | State::MraReqSent => m.reason == RejReason::STALE_CONN,
            State::RepRcvd | State::MraRepSent | State::DreqSent | State::Established => true,
            s @ State::TimeWait => {
                return Err(Dropped::WrongState {
                    msg: "REJ",
                    state: s,
                });
            }
        };
        if timewait {
            self.enter_timewait(now, id);
        } else {
            self.forget(id);
        }
        self.events.push_back(Event::Rejected {
            id,
            reason: m.reason,
            ari: m.ari,
            private_data: m.private_data,
        });
        Ok(())
    }

    /// REP received (IBTA 12.9.7.2; cm.c `cm_rep_handler`/`cm_dup_rep_handler`): in ReqSent
    /// or MraReqRcvd the consumer is told; a duplicate is answered with the RTU (Established)
    /// or MRA (MraRepSent); a REP for no connection gets REJ INVALID_COMM_ID; a REP whose CA
    /// GUID and QPN are in use by another connection gets REJ STALE_CONN.
    fn on_rep(&mut self, now: Instant, from: Gid, tid: Tid, mut m: Rep) -> Result<(), Dropped> {
        let Some(c) = self.conns.get(&m.remote_comm_id) else {
            self.issue_rej(
                from,
                tid,
                m.local_comm_id,
                MsgRejected::Rep,
                RejReason::INVALID_COMM_ID,
                Vec::new(),
            );
            return Err(Dropped::UnknownId("REP"));
        };
        let id = m.remote_comm_id;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::Established | State::MraRepSent | State::RepRcvd => {
                self.stats.duplicates += 1;
                if c.remote_id == Some(m.local_comm_id)
                    && let Some(r) = c.last_response.clone()
                {
                    self.resend(c.peer, &r);
                }
                return Ok(());
            }
            s => {
                return Err(Dropped::WrongState {
                    msg: "REP",
                    state: s,
                });
            }
        }
        let qkey = (m.local_ca_guid, m.local_qpn);
        if self.by_remote_qpn.get(&qkey).is_some_and(|&o| o != id) {
            // IBTA 12.4.1 / cm.c: stale; reject the REP and leave for TimeWait.
            self.stats.stale += 1;
            let rej = Rej {
                local_comm_id: id,
                remote_comm_id: m.local_comm_id,
                message: MsgRejected::Rep,
                reason: RejReason::STALE_CONN,
                ari: Vec::new(),
                private_data: Vec::new(),
            };
            let (peer, ctid) = (c.peer, c.tid);
            let _ = self.send(peer, &CmMad::new(ctid, CmMsg::Rej(rej)));
            self.enter_timewait(now, id);
            self.events.push_back(Event::Rejected {
                id,
                reason: RejReason::STALE_CONN,
                ari: Vec::new(),
                private_data: Vec::new(),
            });
            return Ok(());
        }
        self.by_remote_id
            .insert((m.local_ca_guid, m.local_comm_id), id);
        self.by_remote_qpn.insert(qkey, id);
        let c = self.conns.get_mut(&id).ok_or(Dropped::UnknownId("REP"))?;
        c.state = State::RepRcvd;
        c.remote_id = Some(m.local_comm_id);
        c.remote_ca_guid = Some(m.local_ca_guid);
        c.remote_qpn = Some(m.local_qpn);
        c.outstanding = None;
        // A hint back to a REQ that hinted nothing says nothing about our QP: ignored.
        m.multipath_hint &= c.req_multipath_hint;
        retime(&mut self.timers, TimerKey::Conn(id), &mut c.deadline, None);
        self.events.push_back(Event::Reply {
            id,
            rep: Box::new(m),
        });
        Ok(())
    }

    /// RTU received (IBTA 12.9.8.4; cm.c `cm_rtu_handler`): RepSent/MraRepRcvd become
    /// Established; a late RTU (already established by the first packet) is ignored.
    fn on_rtu(&mut self, m: &Rtu) -> Result<(), Dropped> {
        let id = self.lookup(m.remote_comm_id, m.local_comm_id, "RTU")?;
        let c = self.conns.get_mut(&id).ok_or(Dropped::UnknownId("RTU"))?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.outstanding = None;
                retime(&mut self.timers, TimerKey::Conn(id), &mut c.deadline, None);
                self.events.push_back(Event::Established { id });
                Ok(())
            }
            s => Err(Dropped::WrongState {
                msg: "RTU",
                state: s,
            }),
        }
    }

    /// DREQ received (IBTA 12.9.6; cm.c `cm_dreq_handler`): answered with a DREP, the
    /// connection enters TimeWait and the consumer is told; in TimeWait a duplicate gets the
    /// DREP again; for no connection a DREP is still sent (cm.c `cm_issue_drep`) so the peer
    /// stops resending.
    fn on_dreq(&mut self, now: Instant, from: Gid, tid: Tid, m: Dreq) -> Result<(), Dropped> {
        let Ok(id) = self.lookup(m.remote_comm_id, m.local_comm_id, "DREQ") else {
            let drep = Drep {
                local_comm_id: m.remote_comm_id,
                remote_comm_id: m.local_comm_id,
                private_data: Vec::new(),
            };
            let _ = self.send(from, &CmMad::new(tid, CmMsg::Drep(drep)));
            return Err(Dropped::UnknownId("DREQ"));
        };
        let c = &self.conns[&id];
        if c.local_qpn != m.remote_qpn {
            return Err(Dropped::WrongState {
                msg: "DREQ (wrong QPN)",
                state: c.state,
            });
        }
        match c.state {
            State::TimeWait => {
                // cm.c `cm_dreq_handler`: a DREQ in TimeWait gets a DREP formatted anew with
                // the DREQ's TID. Never `last_response`: a connection that entered TimeWait
                // by our own DREQ (a destroy, or its DREP) still holds its REP or RTU there,
                // and the peer would take that for a duplicate.
                self.stats.duplicates += 1;
                let drep = Drep {
                    local_comm_id: id,
                    remote_comm_id: m.local_comm_id,
                    private_data: Vec::new(),
                };
                let peer = c.peer;
                self.send(peer, &CmMad::new(tid, CmMsg::Drep(drep)))
                    .map_err(Dropped::Malformed)?;
                return Ok(());
            }
            State::Established | State::DreqSent | State::RepSent | State::MraRepRcvd => {}
            s => {
                return Err(Dropped::WrongState {
                    msg: "DREQ",
                    state: s,
                });
            }
        }
        let drep = Drep {
            local_comm_id: id,
            remote_comm_id: m.local_comm_id,
            private_data: Vec::new(),
        };
        let peer = c.peer;
        let mad = self
            .send(peer, &CmMad::new(tid, CmMsg::Drep(drep)))
            .map_err(Dropped::Malformed)?;
        self.enter_timewait(now, id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.tid = tid;
            c.last_response = Some(mad);
        }
        self.events.push_back(Event::Disconnected {
            id,
            private_data: m.private_data,
        });
        Ok(())
    }

    /// DREP received (IBTA 12.9.6; cm.c `cm_drep_handler`): DreqSent enters TimeWait.
    fn on_drep(&mut self, now: Instant, m: Drep) -> Result<(), Dropped> {
        let id = self.lookup(m.remote_comm_id, m.local_comm_id, "DREP")?;
        let state = self.conns[&id].state;
        if state != State::DreqSent {
            return Err(Dropped::WrongState { msg: "DREP", state });
        }
        self.enter_timewait(now, id);
        self.events.push_back(Event::Disconnected {
            id,
            private_data: m.private_data,
        });
        Ok(())
    }

    /// SIDR_REQ received (IBTA 12.11; cm.c `cm_sidr_req_handler`): for a listener the
    /// consumer is asked; for none a SIDR_REP with status UNSUPPORTED answers; a duplicate
    /// of a pending request is dropped.
    fn on_sidr_req(&mut self, from: Gid, tid: Tid, m: SidrReq) -> Result<(), Dropped> {
        if self.sidr_remote.contains_key(&(from, m.request_id)) {
            self.stats.duplicates += 1;
            return Ok(());
        }
        let status = if self.listeners.contains(&m.service_id) {
            match self.alloc_id() {
                Ok(id) => {
                    self.sidr_remote.insert((from, m.request_id), id);
                    self.sidr.insert(
                        id,
                        Sidr {
                            peer: from,
                            tid,
                            outstanding: None,
                            retries_left: 0,
                            deadline: None,
                            remote_id: Some(m.request_id),
                            service_id: m.service_id,
                        },
                    );
                    self.events
                        .push_back(Event::SidrRequest { id, from, req: m });
                    return Ok(());
                }
                Err(_) => SidrStatus::NO_QP,
            }
        } else {
            self.stats.no_listener += 1;
            SidrStatus::UNSUPPORTED
        };
        let rep = SidrRep {
            request_id: m.request_id,
            status,
            qpn: Qpn::new(0),
            service_id: m.service_id,
            qkey: QKey::new(0),
            add_info: Vec::new(),
            private_data: Vec::new(),
        };
        let _ = self.send(from, &CmMad::new(tid, CmMsg::SidrRep(rep)));
        Ok(())
    }

    /// SIDR_REP received (IBTA 12.11; cm.c `cm_sidr_rep_handler`).
    fn on_sidr_rep(&mut self, m: SidrRep) -> Result<(), Dropped> {
        match self.sidr.get(&m.request_id) {
            Some(s) if s.outstanding.is_some() => {}
            _ => return Err(Dropped::UnknownId("SIDR_REP")),
        }
        let id = m.request_id;
        self.remove_sidr(id);
        self.events.push_back(Event::SidrReply { id, rep: m });
        Ok(())
    }

    /// Does what is due at `now`: resends outstanding REQ/REP/DREQ/SIDR_REQ whose answer is
    /// late (IBTA 12.7.27), gives up after `max_cm_retries` (REQ, REP: REJ TIMEOUT and
    /// [`Event::TimedOut`]; DREQ: TimeWait and [`Event::Disconnected`]), and ends TimeWaits.
    /// Call it when [`Self::poll_timeout`]'s time has come (earlier calls do nothing).
    pub fn handle_timeout(&mut self, now: Instant) {
        let (due, due_sidr) = self.due(now);
        let life2 = self.config.packet_life_time.duration() * 2;
        let our_guid = self.config.ca_guid;
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == State::TimeWait {
                self.forget(id);
                self.events.push_back(Event::TimeWaitExit { id });
                continue;
            }
            // Our own REQ: the peer answers within the time our REQ allowed it (its remote CM
            // response timeout); our REP: the peer sends the RTU within the time its REQ
            // announced (local CM response timeout). Both are `peer_response`.
            let wait = life2 + c.peer_response.duration();
            if c.retries_left > 0
                && let Some(m) = c.outstanding.clone()
            {
                c.retries_left -= 1;
                retime(
                    &mut self.timers,
                    TimerKey::Conn(id),
                    &mut c.deadline,
                    Some(now + wait),
                );
                let peer = c.peer;
                self.resend(peer, &m);
                self.stats.retransmits += 1;
                continue;
            }
            match c.state {
                State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                    let message = if matches!(c.state, State::RepSent | State::MraRepRcvd) {
                        MsgRejected::Rep
                    } else {
                        MsgRejected::Req
                    };
                    let (peer, tid, remote) = (c.peer, c.tid, c.remote_id.unwrap_or_default());
                    let rej = Rej {
                        local_comm_id: id,
                        remote_comm_id: remote,
                        message,
                        reason: RejReason::TIMEOUT,
                        ari: our_guid.0.to_be_bytes().to_vec(),
                        private_data: Vec::new(),
                    };
                    let _ = self.send(peer, &CmMad::new(tid, CmMsg::Rej(rej)));
                    self.forget(id);
                    self.events.push_back(Event::TimedOut { id });
                }
                State::DreqSent => {
                    self.enter_timewait(now, id);
                    self.events.push_back(Event::Disconnected {
                        id,
                        private_data: Vec::new(),
                    });
                }
                _ => retime(&mut self.timers, TimerKey::Conn(id), &mut c.deadline, None),
            }
        }
        let due = due_sidr;
        let wait = self
            .config
            .retransmit_after(self.config.cm_response_timeout);
        for id in due {
            let Some(s) = self.sidr.get_mut(&id) else {
                continue;
            };
            match s.outstanding.clone() {
                Some(m) if s.retries_left > 0 => {
                    s.retries_left -= 1;
                    retime(
                        &mut self.timers,
                        TimerKey::Sidr(id),
                        &mut s.deadline,
                        Some(now + wait),
                    );
                    let peer = s.peer;
                    self.resend(peer, &m);
                    self.stats.retransmits += 1;
                }
                _ => {
                    self.remove_sidr(id);
                    self.events.push_back(Event::SidrTimedOut { id });
                }
            }
        }
    }
}

#[cfg(test)]
impl Cm {
    /// Test check: the entries of every table (connections, the two remote-ID indexes,
    /// SIDR requests, pending passive SIDR requests, armed timers, queued MADs and events).
    pub(crate) fn table_sizes(&self) -> [usize; 8] {
        [
            self.conns.len(),
            self.by_remote_id.len(),
            self.by_remote_qpn.len(),
            self.sidr.len(),
            self.sidr_remote.len(),
            self.timers.len(),
            self.transmits.len(),
            self.events.len(),
        ]
    }

    /// Test check: every index entry names a live connection that has those remote
    /// identifiers, and every pending passive SIDR request is in the table.
    pub(crate) fn check_invariants(&self) {
        for (&(g, r), id) in &self.by_remote_id {
            let c = &self.conns[id];
            assert_eq!((c.remote_ca_guid, c.remote_id), (Some(g), Some(r)));
        }
        for (&(g, q), id) in &self.by_remote_qpn {
            let c = &self.conns[id];
            assert_eq!((c.remote_ca_guid, c.remote_qpn), (Some(g), Some(q)));
        }
        for id in self.sidr_remote.values() {
            assert!(self.sidr.contains_key(id));
        }
        for c in self.conns.values() {
            if c.outstanding.is_some() {
                assert!(c.deadline.is_some(), "a message to resend without a timer");
            }
        }
        // The timer index holds exactly the armed deadlines.
        let armed: BTreeSet<(Instant, TimerKey)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| Some((c.deadline?, TimerKey::Conn(id))))
            .chain(
                self.sidr
                    .iter()
                    .filter_map(|(&id, s)| Some((s.deadline?, TimerKey::Sidr(id)))),
            )
            .collect();
        assert_eq!(armed, self.timers, "timer index out of step");
    }
}

fn log_drop(msg: &str, e: &Dropped) {
    log::debug!("CM: dropped {msg}: {e}");
}
