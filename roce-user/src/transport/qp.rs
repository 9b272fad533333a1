//! One queue pair: requester (builds request packets from the send queue, qp/requester.rs),
//! completer (processes ACKs, NAKs and responses, completes send WRs, retries on timeouts and
//! NAKs, qp/completer.rs) and responder (checks and executes requests, answers them,
//! qp/responder.rs). This file holds the QP's state, accessors, modify, completions and flush.
//! The split and the order of checks follow rxe (`rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`);
//! each rule cites its source in reference §2.

use core::ops::Range;
use std::collections::VecDeque;

use roce_common::opcode::{Opcode, Operation, Position, Transport};

use super::RxPkt;
use super::counters::QpCounters;
use super::cq::{CqId, Wc, WcFlags, WcOpcode, WcStatus};
use super::ids::{Msn, Psn, Qpn, RKey};
use super::mr::{Access, PdId, Sge, sg_gather, sg_len, sg_scatter};
use super::multipath::{MpState, Negotiation, RxDecision};
use super::state::{AttrMask, Mtu, QpAttr, QpState, QpType};
use super::timer::{Instant, Timer, TimerTable, local_ack_timeout, rnr_timer};
use super::wr::{QueuedRecvWr, QueuedSendWr, RecvWr, SendFlags, SendOp, SendWr};
use super::{Ctx, Event, Path};
use crate::wire::multipath::MpBthFlags;
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FrameTemplate,
    IethRepr, ImmDtRepr, NakCode, RethRepr, RnrTimer, RoceRepr, roce::payload_range,
};

mod completer;
mod multipath;
mod requester;
mod responder;
mod uc;

use requester::opcode_for;
pub use requester::{packets_for, position_of};

/// rxe `RXE_MAX_UNACKED_PSNS`: the requester stalls when this many PSNs are unacknowledged.
pub const MAX_UNACKED_PSNS: u32 = 128;
/// rxe `RXE_MAX_PKT_PER_ACK`: AckReq is set at least every this many packets.
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Control responses (ACK/NAK) a responder queues until the device transmits them. A full
/// queue merges a new answer with the newest queued one (a newer ACK or a NAK implies the
/// ACKs before it), so it never drops a NAK (see `Qp::queue_ctrl` in qp/responder.rs).
pub const MAX_PENDING_ACKS: usize = 16;
/// The most AckReq requests one coalesced ACK stands for ([`super::DeviceConfig::coalesce_acks`]).
///
/// One ACK for a whole receive batch is one packet to lose: when it is lost with the
/// requester's window full ([`MAX_UNACKED_PSNS`]), nothing moves until the ACK timeout, and
/// the go-back-N that follows brings a window of duplicates. With a bound, a lost ACK holds
/// back at most this many messages and the next one covers them (TCP acknowledges at least
/// every second full segment for a like reason, RFC 9293 §3.8.6.3), and a requester that
/// takes RTT samples from ACKs (Swift) still gets several per window.
pub const ACK_COALESCE_MAX: u8 = 8;
/// The most the local ACK timeout is doubled after consecutive timeouts (×16).
///
/// `timeout` is the minimum a requester waits (ibv_modify_qp(3): "the minimum timeout that a
/// QP waits for ACK/NACK"); a responder that takes longer to answer than that, as rxe streaming
/// 4 × 1 MiB of READ responses through a slow guest NIC does, would otherwise be sent a
/// duplicate request on every expiry, each of which makes it replay the whole response again.
pub const MAX_TIMEOUT_BACKOFF: u8 = 4;
/// The most packets one RDMA READ request asks for: a READ WR longer than this is requested
/// in pieces of this many packets (fixed boundaries from the WR's start), each a READ request
/// of its own, and a piece is requested only when the unacknowledged-PSN window
/// ([`MAX_UNACKED_PSNS`]) and the initiator depth (`max_rd_atomic`) allow it.
///
/// A responder answers a READ request in one burst and has no flow control (rxe streams the
/// whole response into its qdisc). One 1 MiB request per QP overflows a slow transmit queue,
/// and every loss then costs a re-request of everything after it (the requester resumes at the
/// first missing PSN, rxe `req_retry`; the responder replays to the end of the request, rxe
/// `duplicate_request`). Pieces bound both the burst and the replay; they are clocked by the
/// responses, so they also pace the responder. A re-request stays inside its piece, because a
/// responder accepts a duplicate READ only within the message it remembers (rxe: same R_Key,
/// range inside the original).
pub const READ_CHUNK_PKTS: u32 = MAX_UNACKED_PSNS / 2;
/// The largest RDMA message (RETH DMA length, IBA: at most 2^31).
pub const MAX_MSG_SIZE: u64 = 1 << 31;
/// Bytes of GRH space at the start of every UD receive buffer (IBA 11.4.1.1).
pub const GRH_LEN: u64 = 40;

/// Why a post was refused (the WR was not queued).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No QP with this number.
    #[error("no queue pair {0:?}")]
    NoSuchQp(Qpn),
    /// The QP state does not accept this post (send before RTS, anything in RESET).
    #[error("cannot post in state {0}")]
    InvalidState(QpState),
    /// The queue already holds its `max_*_wr` requests.
    #[error("work queue full ({0} requests)")]
    QueueFull(usize),
    /// More scatter/gather entries than `max_sge`.
    #[error("{0} scatter/gather entries, the QP allows {1}")]
    TooManySge(usize, usize),
    /// The request does not fit the QP type or its limits.
    #[error("invalid work request: {0}")]
    Invalid(&'static str),
    /// No SRQ with this id.
    #[error("no shared receive queue {0:?}")]
    NoSuchSrq(super::SrqId),
}

/// Sizes of a QP's queues (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// Bytes of inline data a send WR may carry (`IBV_SEND_INLINE`); at most the device's
    /// [`DeviceConfig::max_inline_data`](super::DeviceConfig::max_inline_data).
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 4,
            max_inline_data: 0,
        }
    }
}

/// What `create_qp` needs (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct QpInit {
    /// The protection domain: the QP reaches only this PD's memory regions.
    pub pd: PdId,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Queue sizes.
    pub cap: QpCap,
    /// Whether every send WR completes with a CQE (`sq_sig_all`).
    pub sq_sig_all: bool,
}

impl QpInit {
    /// A QP of `qp_type` in `pd` whose sends and receives complete on `cq`, with default
    /// queue sizes ([`QpCap::default`]) and only signalled sends completing; change fields
    /// with struct update syntax.
    #[must_use]
    pub fn new(qp_type: QpType, pd: PdId, cq: CqId) -> Self {
        Self {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MsgKind {
    Send,
    Write,
}

#[derive(Debug)]
struct SendWqe {
    wr: QueuedSendWr<Path>,
    len: u64,
    /// Set when the first packet is sent.
    first_psn: Option<Psn>,
    npkts: u32,
    /// READ: response packets received in order; atomics: 1 when the ACK arrived.
    rcvd_pkts: u32,
    done: Option<WcStatus>,
}

/// Bytes of one send queue entry, without its SG list (documented in [`Qp`]).
pub const SEND_WQE_SIZE: usize = core::mem::size_of::<SendWqe>();

impl SendWqe {
    fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|f| f.wrapping_add(self.npkts - 1))
    }
}

#[derive(Debug)]
enum Resource {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        rkey: RKey,
        len: u64,
        /// Next response PSN to send, and whether responses remain to send.
        cur_psn: Psn,
        pending: bool,
        /// The next packet starts a replay (sent as FIRST/ONLY).
        restart: bool,
        /// The last PSN of the current (re)play: `last_psn`, or for a replay of a range the
        /// requester asked for again in multipath mode, the range's last.
        stop_psn: Psn,
        /// A play interrupted by the replay of a range (multipath): where it goes on, and
        /// its last PSN, once the range is sent.
        resume: Option<(Psn, Psn)>,
        /// Responses carry the placement trailer and are sprayed (docs/multipath.md): the
        /// request came marked `HOLD` and `READ_PLACED` from a requester in selective
        /// repeat, and the extension is on.
        placed: bool,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        pending: bool,
    },
}

impl Resource {
    fn pending(&self) -> bool {
        match self {
            Self::Read { pending, .. } | Self::Atomic { pending, .. } => *pending,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ctrl {
    syndrome: AethSyndrome,
    psn: Psn,
    msn: Msn,
    /// The AckReq requests this ACK answers when it may take in more of the same receive
    /// batch (`Qp::queue_request_ack`); 0 for every other answer (NAKs, duplicates'
    /// re-ACKs), which is never merged with a later request's ACK.
    covers: u8,
}

/// Bytes of one responder resource (documented in [`Qp`]).
pub const RESOURCE_SIZE: usize = core::mem::size_of::<Resource>();
/// Bytes of one queued control response (documented in [`Qp`]).
pub const CTRL_SIZE: usize = core::mem::size_of::<Ctrl>();

// The memory bound documented on [`Qp`], checked at compile time (64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(core::mem::size_of::<Qp>() <= 1040);
    assert!(SEND_WQE_SIZE <= 136);
    assert!(core::mem::size_of::<RecvWr>() <= 32);
    assert!(core::mem::size_of::<QueuedRecvWr>() <= 32);
    assert!(core::mem::size_of::<Sge>() == 16);
    assert!(RESOURCE_SIZE <= 64);
    assert!(CTRL_SIZE <= 12);
};

/// A packet the QP wants sent: its headers, where in the frame buffer it wrote the payload
/// ([`TxBuf::payload`]), and the path (UD WRs carry their own).
#[derive(Debug)]
pub(crate) struct OutPkt {
    pub repr: RoceRepr,
    pub payload: Range<usize>,
    pub ud_path: Option<Path>,
}

/// The frame buffer a packet is built in, as the QP sees it: the QP gathers the payload
/// straight into its place after the headers ([`Self::payload`]), and the device writes the
/// headers around it (`FrameTemplate::emit_around_payload`), so the payload is copied once,
/// memory region to frame.
pub(crate) struct TxBuf<'a> {
    frame: &'a mut [u8],
    /// Where the BTH is expected to start: the `bth_offset` of the path the QP's previous
    /// frame took. A packet on a path with longer or shorter headers (a new address vector, a
    /// UD WR's own path) has its payload moved once more.
    bth_off: usize,
}

impl<'a> TxBuf<'a> {
    /// A view of `frame` whose packets' BTH starts at `bth_off`.
    pub(crate) const fn new(frame: &'a mut [u8], bth_off: usize) -> Self {
        Self { frame, bth_off }
    }

    /// The whole frame buffer, for writing the headers once the QP has gathered the payload.
    pub(crate) fn frame(&mut self) -> &mut [u8] {
        self.frame
    }

    /// Where the `len` payload bytes of an `opcode` packet go (after the BTH and the extended
    /// headers the opcode carries), and those bytes to gather them into. Call it once the
    /// packet's opcode is chosen, before reading the payload from memory. `None` if the frame
    /// has no room for them plus pad and ICRC, or the opcode is unknown.
    /// The frame buffer's length.
    fn len(&self) -> usize {
        self.frame.len()
    }

    fn payload(&mut self, opcode: Opcode, len: usize) -> Option<(Range<usize>, &mut [u8])> {
        let range = payload_range(opcode, self.bth_off, len, self.frame.len())?;
        let dst = self.frame.get_mut(range.clone())?;
        Some((range, dst))
    }
}

/// One queue pair. Created by [`super::Device::create_qp`]; all methods are called through the
/// device, which owns the memory regions and CQs the QP uses.
///
/// # Memory bound
/// Measured on x86_64 (a `const` assertion below checks these limits at compile time):
/// the fixed state is 1040 B (152 B of it the transmit header template); a send WQE is 136 B
/// with one SGE or none (held in place, `wr::SgList`), plus 16 B per SGE beyond one or its
/// inline bytes (at most `max_inline_data`); a receive WQE 32 B with one SGE, plus 16 B per
/// SGE beyond one; a responder resource at most 64 B; a queued control response 12 B. The
/// queues are bounded: at most `max_send_wr` send WQEs and `max_recv_wr` receive WQEs (both
/// posted by the local application, never by a peer), at most `max_dest_rd_atomic` responder
/// resources (a ring: one more evicts the oldest, as in rxe) and at most
/// [`MAX_PENDING_ACKS`] control responses (beyond that a newer ACK or a NAK takes the place
/// of the newest queued answer it implies, counted in `ack_deferred`). With the defaults (256 +
/// 256 WRs of 4 SGEs, 16 resources) a QP holds at most 256 × 200 + 256 × 96 + 16 × 64 + 16 ×
/// 12 + 1040 ≈ 76 KiB; with perftest's (128 send and 512 receive WRs of one SGE) 128 × 136 +
/// 512 × 32 + 16 × 64 + 16 × 12 + 1040 ≈ 35 KiB, of which `ib_write_bw` uses the send queue
/// only (`hotpath qp_memory`: 20 KiB of heap per QP with it full, 3 KiB idle); nothing a peer
/// sends can grow it.
#[derive(Debug)]
pub struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr<Path>,
    pub(crate) init: QpInit,
    sq: VecDeque<SendWqe>,
    rq: VecDeque<QueuedRecvWr>,
    // requester
    req_idx: usize,
    req_pkt: u32,
    next_psn: Psn,
    /// One past the highest PSN ever sent: a go-back rewinds `next_psn`, not this.
    sent_psn: Psn,
    noack_pkts: u32,
    // completer
    comp_psn: Psn,
    retry_left: u8,
    rnr_left: u8,
    rnr_wait: bool,
    retry_guard: Option<Psn>,
    /// One past the last PSN sent before the last retransmission timeout, whose replay (go
    /// back N from `comp_psn` up to here) may prove needed or spurious
    /// (`Qp::check_replayed`), until it is known which.
    replayed: Option<Psn>,
    /// A retransmission timeout's replay sends its first packet only, asking for an ACK, until
    /// the peer answers (`Qp::retry`), as TCP resends one segment when its retransmission
    /// timer expires (RFC 6298 §5.4, with the window of one segment of RFC 5681 §3.1).
    replay_probe: bool,
    /// Doublings of the local ACK timeout since the QP was last idle (see
    /// [`MAX_TIMEOUT_BACKOFF`]).
    backoff: u8,
    drained_reported: bool,
    // responder
    resp_psn: Psn,
    msn: Msn,
    sent_psn_nak: bool,
    /// UC: the rest of the message in progress is being dropped, until a FIRST or ONLY packet
    /// (qp/uc.rs).
    uc_dropping: bool,
    in_msg: Option<MsgKind>,
    send_off: u64,
    write_va: u64,
    write_rkey: RKey,
    write_resid: u64,
    write_len: u32,
    resources: VecDeque<Resource>,
    ctrl: VecDeque<Ctrl>,
    pub(crate) timers: TimerTable,
    pub(crate) counters: QpCounters,
    /// Congestion control (RC QPs; see transport/cc.rs).
    pub(crate) cc: Option<Box<super::cc::QpCc>>,
    /// Its place in the device's ready queue and timer set (transport/sched.rs).
    pub(crate) sched: super::sched::QpSched,
    /// The Ethernet/IP/UDP headers of the path its last frame took, rebuilt when the path
    /// changes (see [`super::Device::poll_transmit`]).
    pub(crate) tx_template: Option<FrameTemplate>,
    /// The shared receive queue its responder takes WQEs from (transport/srq.rs); `rq` then
    /// holds at most the one WQE of the message being received.
    pub(crate) srq: Option<super::SrqId>,
    /// [`Event::CommEstablished`] was raised since the QP last left RESET.
    comm_est: bool,
    /// Whether the multipath extension is allowed on this QP ([`Self::set_multipath`]); kept
    /// through a reset.
    mp_allowed: bool,
    /// Where the QP stands with the multipath extension (docs/multipath.md, "Agreeing on the
    /// extension"): which BTH bits its packets carry, and what a received packet's bits mean.
    pub(crate) mp: Negotiation,
    /// The responder's reassembly once packets with placement trailers arrive (qp/multipath.rs).
    mp_rx: Option<Box<multipath::MpRx>>,
    /// Messages that consumed a receive WQE (SENDs, WRITEs with immediate) completed since
    /// the QP left RESET: the send sequence number of a placement trailer, less this, is the
    /// index of the receive WQE the message goes into (docs/multipath.md).
    recv_ssn: u32,
    /// The requester's selective repeat while it sends placement trailers (qp/multipath.rs).
    mp_tx: Option<Box<super::multipath::SelectiveRepeat>>,
    /// How the requester sprays (from `DeviceConfig::multipath_entropies`).
    pub(crate) mp_entropies: super::multipath::EntropyConfig,
    /// The entropies its sprayed packets (requests and READ responses) take, made when it
    /// first sprays, and the READ response packets its requester placed out of order
    /// (qp/multipath.rs).
    mp_side: Option<Box<multipath::MpSide>>,
    /// WRs that consume a receive WQE at the responder (SENDs, WRITEs with immediate)
    /// completed since the QP left RESET: the base of the send sequence numbers.
    send_ssn: u32,
}

impl Qp {
    pub(crate) fn new(qpn: Qpn, init: QpInit) -> Self {
        Self {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            attr: QpAttr::default(),
            init,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req_idx: 0,
            req_pkt: 0,
            next_psn: Psn::new(0),
            sent_psn: Psn::new(0),
            noack_pkts: 0,
            comp_psn: Psn::new(0),
            retry_left: 0,
            rnr_left: 0,
            rnr_wait: false,
            retry_guard: None,
            replayed: None,
            replay_probe: false,
            backoff: 0,
            drained_reported: false,
            resp_psn: Psn::new(0),
            msn: Msn::new(0),
            sent_psn_nak: false,
            uc_dropping: false,
            in_msg: None,
            send_off: 0,
            write_va: 0,
            write_rkey: RKey::new(0),
            write_resid: 0,
            write_len: 0,
            resources: VecDeque::new(),
            ctrl: VecDeque::new(),
            timers: TimerTable::default(),
            counters: QpCounters::default(),
            cc: None,
            sched: super::sched::QpSched::default(),
            tx_template: None,
            srq: None,
            comm_est: false,
            mp_allowed: false,
            mp: Negotiation::new(false),
            mp_rx: None,
            recv_ssn: 0,
            mp_tx: None,
            mp_entropies: super::multipath::EntropyConfig::default(),
            mp_side: None,
            send_ssn: 0,
        }
    }

    /// The QP number.
    #[must_use]
    pub const fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The current state.
    #[must_use]
    pub const fn state(&self) -> QpState {
        self.state
    }

    /// The current attributes.
    #[must_use]
    pub const fn attr(&self) -> &QpAttr<Path> {
        &self.attr
    }

    /// The counters.
    #[must_use]
    pub const fn counters(&self) -> &QpCounters {
        &self.counters
    }

    /// Send WRs posted and not yet completed.
    #[must_use]
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// Receive WRs posted and not yet consumed.
    #[must_use]
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }

    /// The PSN the responder expects next.
    #[must_use]
    pub const fn expected_psn(&self) -> Psn {
        self.resp_psn
    }

    /// The PSN the requester sends next.
    #[must_use]
    pub const fn next_send_psn(&self) -> Psn {
        self.next_psn
    }

    /// The oldest unacknowledged PSN.
    #[must_use]
    pub const fn oldest_unacked_psn(&self) -> Psn {
        self.comp_psn
    }

    /// Responder resources held (at most `max_dest_rd_atomic`).
    #[must_use]
    pub fn responder_resources(&self) -> usize {
        self.resources.len()
    }

    /// Control responses waiting to be sent (at most [`MAX_PENDING_ACKS`]).
    #[must_use]
    pub fn pending_acks(&self) -> usize {
        self.ctrl.len()
    }

    /// The PSN of the next response packet the responder owes (the oldest pending READ or
    /// atomic resource), if any: what [`Self::next_response`] would send.
    fn first_pending_response(&self) -> Option<Psn> {
        self.resources
            .iter()
            .find(|r| r.pending())
            .map(|r| match r {
                Resource::Read { cur_psn, .. } => *cur_psn,
                Resource::Atomic { psn, .. } => *psn,
            })
    }

    fn mtu(&self) -> Mtu {
        self.attr.path_mtu
    }

    // ---------------------------------------------------------------- modify

    /// Applies an already validated modify (see [`super::state::check_modify`]).
    pub(crate) fn apply_modify(
        &mut self,
        to: QpState,
        attr: &QpAttr<Path>,
        mask: AttrMask,
        ctx: &mut Ctx<'_>,
    ) {
        let a = &mut self.attr;
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(AttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(AttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(AttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(AttrMask::AV) {
            a.ah_attr.clone_from(&attr.ah_attr);
        }
        if mask.contains(AttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(AttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.rnr_left = attr.rnr_retry;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            self.resp_psn = attr.rq_psn;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            self.next_psn = attr.sq_psn;
            self.sent_psn = attr.sq_psn;
            self.comp_psn = attr.sq_psn;
            self.replayed = None;
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            while self.resources.len() > usize::from(a.max_dest_rd_atomic) {
                self.resources.pop_front();
            }
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(AttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        match to {
            QpState::Reset => self.reset(),
            QpState::Err => {
                if self.state != QpState::Err {
                    // An explicit modify to ERR flushes but raises no QP_FATAL event.
                    self.move_to_error(ctx, false);
                }
            }
            QpState::Sqd => {
                self.state = to;
                self.drained_reported = false;
                self.check_drained(ctx);
            }
            _ => self.state = to,
        }
    }

    fn reset(&mut self) {
        let (qpn, init) = (self.qpn, self.init);
        let (counters, srq, mp_allowed) = (self.counters, self.srq, self.mp_allowed);
        *self = Self::new(qpn, init);
        self.counters = counters;
        self.srq = srq;
        self.set_multipath(mp_allowed);
    }

    /// Allows or forbids the multipath extension on this QP and starts its agreement over:
    /// [`MpState::Offering`] for an allowed RC QP, else [`MpState::Disabled`] (UC and UD QPs
    /// never use it). Call it at creation and in RESET or INIT
    /// ([`super::Device::set_multipath`]).
    pub(crate) fn set_multipath(&mut self, allowed: bool) {
        self.mp_allowed = allowed;
        self.mp = Negotiation::new(allowed && self.qp_type == QpType::Rc);
    }

    /// The peer QP is known, out of band, to allow the multipath extension: an allowed QP
    /// starts with it on ([`Negotiation::on_hint`]). Call it in RESET or INIT, after
    /// [`Self::set_multipath`] ([`super::Device::set_multipath_peer`]); a reset forgets it.
    pub(crate) const fn set_multipath_peer(&mut self) {
        self.mp.on_hint();
    }

    /// Where the QP stands with the multipath extension (docs/multipath.md).
    #[must_use]
    pub const fn multipath(&self) -> MpState {
        self.mp.state()
    }

    /// The multipath bits for the BTH of a packet this QP sends now (plain RoCE v2, 0, unless
    /// the extension is allowed). Call it for every RC packet, ACKs and responses included,
    /// just before the frame is written (`Device::transmit_qp`), with the `resv7` the QP put
    /// in the packet it built: [`MpBthFlags::TRAILER`] there says the packet ends in a
    /// trailer (a SEND or WRITE packet in selective-repeat mode, an ACK with its SACK).
    ///
    /// With the extension on, a response or acknowledgement (`response`) also carries
    /// [`MpBthFlags::HOLD`] (this QP's responder holds READ requests and atomics so marked),
    /// and a request keeps the `HOLD` its builder put on a READ or atomic sent in selective
    /// repeat (hold it until the cumulative PSN reaches it) and the `READ_PLACED` it put on
    /// such a READ (send its responses with placement trailers).
    pub(crate) const fn mp_tx_bits(&self, built: u8, response: bool) -> u8 {
        let trailer = MpBthFlags::from_resv7(built).contains(MpBthFlags::TRAILER);
        let bits = self.mp.tx_flags(trailer).bits();
        if !self.mp.is_on() {
            return bits;
        }
        let hold = MpBthFlags::HOLD.bits();
        let placed = MpBthFlags::READ_PLACED.bits();
        bits | if response {
            hold
        } else {
            built & (hold | placed)
        }
    }

    /// Takes in the multipath bits of a packet received from the peer QP (after the frame,
    /// ICRC, P_Key and address checks, before the transport's own checks) and says how to
    /// handle it: [`RxDecision::Plain`] as today, [`RxDecision::Trailer`] through
    /// `handle_mp_packet` (qp/multipath.rs), [`RxDecision::Drop`] (counted in `rx_dropped`
    /// here): a trailer reaching a QP that fell back is never taken for data.
    pub(crate) fn mp_on_receive(&mut self, resv7: u8, response: bool) -> RxDecision {
        if self.qp_type != QpType::Rc {
            return RxDecision::Plain;
        }
        let d = self.mp.on_receive(MpBthFlags::from_resv7(resv7));
        if response {
            self.mp.on_response(MpBthFlags::from_resv7(resv7));
        }
        if d == RxDecision::Drop {
            self.counters.rx_dropped += 1;
        }
        // The peer stopped offering (it lost its state, or answers as a plain QP now):
        // selective repeat ends at once and everything not yet acknowledged goes again from
        // the oldest, plain (docs/multipath.md, "Falling back"), so that no trailer reaches a
        // peer that would take it for data.
        if !self.mp.is_on() && self.mp_tx.is_some() {
            self.mp_tx = None;
            // Not a timeout's replay: nothing to prove spurious, no first packet to hold on.
            self.replayed = None;
            self.replay_probe = false;
            self.go_back(self.comp_psn);
        }
        d
    }

    // ---------------------------------------------------------------- completions

    fn push_wc(&mut self, cq: CqId, wc: Wc, solicited: bool, ctx: &mut Ctx<'_>) -> bool {
        if ctx.push_wc(cq, wc, solicited) {
            true
        } else {
            self.counters.cq_overflow += 1;
            false
        }
    }

    fn send_wc(&self, wqe: &SendWqe, status: WcStatus) -> Wc {
        let opcode = match wqe.wr.op {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        };
        Wc {
            wr_id: wqe.wr.wr_id,
            status,
            opcode,
            byte_len: u32::try_from(wqe.len).unwrap_or(u32::MAX),
            imm: 0,
            invalidated_rkey: RKey::new(0),
            qp_num: self.qpn,
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::default(),
        }
    }

    /// Completes the head of the send queue with `status` (WRs complete in order).
    fn complete_head(&mut self, status: WcStatus, ctx: &mut Ctx<'_>) {
        let Some(wqe) = self.sq.pop_front() else {
            return;
        };
        if let (Some(m), Some(f)) = (self.mp_side.as_deref_mut(), wqe.first_psn) {
            m.rd.remove(&f.value());
        }
        if wqe.first_psn.is_some() && multipath::consumes_rwqe(&wqe.wr.op) {
            self.send_ssn = self.send_ssn.wrapping_add(1);
        }
        if self.req_idx > 0 {
            self.req_idx -= 1;
        } else {
            self.req_pkt = 0;
        }
        match status {
            WcStatus::Success => {}
            WcStatus::WrFlushErr => self.counters.req_cqe_flush_error += 1,
            _ => self.counters.req_cqe_error += 1,
        }
        // rxe counts each SEND-family WQE its completer completes, not the flushed ones
        // (rxe_comp.c do_complete).
        if status != WcStatus::WrFlushErr
            && matches!(
                wqe.wr.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
            )
        {
            self.counters.rdma_sends += 1;
        }
        let signaled = self.init.sq_sig_all
            || wqe.wr.flags.contains(super::wr::SendFlags::SIGNALED)
            || status != WcStatus::Success;
        if signaled {
            let wc = self.send_wc(&wqe, status);
            if !self.push_wc(self.init.send_cq, wc, false, ctx) && self.state != QpState::Err {
                self.enter_error(ctx);
            }
        }
    }

    /// Moves the QP to ERR and flushes every outstanding WR (rxe `rxe_qp_error`).
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state != QpState::Err {
            self.move_to_error(ctx, true);
        }
    }

    fn move_to_error(&mut self, ctx: &mut Ctx<'_>, fatal: bool) {
        let from = self.state;
        self.state = QpState::Err;
        self.timers.stop_all();
        self.resources.clear();
        self.rnr_wait = false;
        self.in_msg = None;
        if fatal {
            ctx.event(Event::QpFatal {
                qpn: self.qpn,
                from,
            });
        }
        self.flush(ctx);
        if self.srq.is_some() {
            // The WQE in use (if any) is flushed above, so no more will be taken (IBA 11.6.3,
            // rxe flush_recv_queue).
            ctx.event(Event::QpLastWqeReached { qpn: self.qpn });
        }
    }

    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        while !self.sq.is_empty() {
            self.complete_head(WcStatus::WrFlushErr, ctx);
        }
        while let Some(r) = self.rq.pop_front() {
            self.counters.resp_cqe_flush_error += 1;
            let wc = Wc {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: 0,
                invalidated_rkey: RKey::new(0),
                qp_num: self.qpn,
                src_qp: Qpn::new(0),
                wc_flags: WcFlags::default(),
            };
            self.push_wc(self.init.recv_cq, wc, false, ctx);
        }
        self.req_idx = 0;
        self.req_pkt = 0;
    }

    fn check_drained(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Sqd
            && !self.drained_reported
            && self.sq.iter().all(|w| w.first_psn.is_none())
        {
            self.drained_reported = true;
            ctx.event(Event::SqDrained { qpn: self.qpn });
        }
    }

    /// The ACKs and NAKs queued to go, one frame each: what the QP still sends if it is
    /// destroyed now ([`Self::into_closing`]).
    #[must_use]
    pub(crate) fn owed_frames(&self) -> u64 {
        self.ctrl.len() as u64
    }

    /// A QP being destroyed, kept only to send the ACKs and NAKs its responder still owes the
    /// peer (`Some`), or `None` when it owes nothing. Call from `Device::destroy_qp`.
    ///
    /// rxe sends the acknowledgement of a request in the same pass that completes it
    /// (rxe_resp.c `send_ack` from the responder task), so a consumer that destroys its QP
    /// right after the last receive completion has already acknowledged it; here the ACK
    /// waits in `ctrl` for the next transmit, and a QP destroyed before that must still send
    /// it. Otherwise the peer's last SEND is never acknowledged: it retries, and with
    /// retry_cnt 7 (retry forever, as in rxe) it never completes.
    pub(crate) fn into_closing(mut self) -> Option<Self> {
        if self.ctrl.is_empty() {
            return None;
        }
        // Error state: poll_transmit then gives the queued ACKs and NAKs and nothing else.
        self.state = QpState::Err;
        Some(self)
    }

    // ---------------------------------------------------------------- output

    /// Whether this QP may send an ACK-eliciting probe now (`transport/cc.rs`, `ReadClock`):
    /// it can send requests (RTS), its peer has acknowledged every PSN it sent (the probe
    /// duplicates the last one, and its answer is told apart from the ACKs of requests only
    /// by order) and the multipath extension is off (placed responses are asked for again out
    /// of order).
    fn can_probe(&self) -> bool {
        self.state == QpState::Rts
            && self.comp_psn == self.sent_psn
            && self.next_psn == self.sent_psn
            && !self.mp.is_on()
            && self.attr.ah_attr.is_some()
    }

    /// Hook of [`Self::poll_transmit`], before each READ response: the ACK-eliciting probe
    /// due after every 32 of them (`transport/cc.rs`, `ReadClock`), a zero-length RDMA WRITE
    /// ONLY with AckReq at the PSN before `comp_psn`, which the peer has acknowledged. IBA Vol. 1
    /// C9-105: a responder answers a duplicate SEND or WRITE with an ACK and does not execute
    /// it (rxe `duplicate_request`, and `Qp::duplicate_request` here); with a DMA length of
    /// zero there is nothing to execute or check (C9-88).
    fn probe(&mut self, now: Instant, tx: &mut TxBuf<'_>) -> Option<OutPkt> {
        if !self.cc_probe_due() || !self.can_probe() {
            return None;
        }
        let opcode = Opcode::RC_RDMA_WRITE_ONLY;
        let psn = self.comp_psn.wrapping_sub(1);
        let mut repr = RoceRepr::new(BthRepr::new(opcode, self.attr.dest_qp_num, psn));
        repr.reth = Some(RethRepr {
            va: 0,
            rkey: RKey::new(0),
            dma_len: 0,
        });
        repr.bth.ack_req = true;
        let (payload, _) = tx.payload(opcode, 0)?;
        self.cc_on_probe_sent(now);
        // The probe's answer re-acknowledges `comp_psn - 1` as a duplicate's would: it must
        // not be taken for proof that a timeout was spurious (`Qp::check_replayed`).
        self.replayed = None;
        self.counters.sent_pkts += 1;
        Some(OutPkt {
            repr,
            payload,
            ud_path: None,
        })
    }

    /// [`Self::next_response`], telling congestion control when a READ response leaves
    /// ([`Self::cc_on_read_response`]).
    fn next_response_at(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<OutPkt> {
        let p = self.next_response(ctx, tx)?;
        let is_read = p
            .repr
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.operation == Operation::ReadResponse);
        if is_read {
            self.cc_on_read_response(now, p.repr.bth.psn);
        }
        Some(p)
    }

    /// The next packet to send. With `data_ok` false (the congestion-control pacer holds the
    /// QP back) only control packets (ACK/NAK) are returned, and not one for a PSN after a
    /// READ response or atomic ACK still owed (answers leave in PSN order); with `fresh_ok` false (the
    /// device's in-flight budget is used up) no first packet of a new message, though started
    /// messages, retransmissions and responses still go.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
        data_ok: bool,
        fresh_ok: bool,
    ) -> Option<OutPkt> {
        if let Some(c) = self.ctrl.front().copied() {
            // Answers leave in PSN order, as rxe's responder sends a READ's responses (and an
            // atomic's ACK) before it acknowledges the requests behind it. An ACK that overtook
            // them would make the requester take the READ as unanswered (an implied NAK,
            // rxe_comp.c) and retry it against retry_cnt. So a pending response for an earlier
            // PSN goes first, and the answer waits with it while the pacer holds data.
            if self.state.responder_ready()
                && self
                    .first_pending_response()
                    .is_some_and(|r| r.distance(c.psn) < 0)
            {
                if !data_ok {
                    return None;
                }
                if let Some(p) = self.probe(now, tx) {
                    return Some(p);
                }
                if !self.cc_responses_ok(now, self.can_probe()) {
                    return None;
                }
                if let Some(p) = self.next_response_at(now, ctx, tx) {
                    return Some(p);
                }
            }
            self.ctrl.pop_front();
            return Some(self.ctrl_pkt(c, tx));
        }
        if !data_ok {
            return None;
        }
        if self.state == QpState::Err || self.state == QpState::Reset {
            return None;
        }
        if self.state.responder_ready() {
            if let Some(p) = self.probe(now, tx) {
                return Some(p);
            }
            if self.cc_responses_ok(now, self.can_probe())
                && let Some(p) = self.next_response_at(now, ctx, tx)
            {
                return Some(p);
            }
        }
        if !self.state.requester_ready() && self.state != QpState::Sqe {
            return None;
        }
        if self.state == QpState::Sqe {
            return None;
        }
        match self.qp_type {
            QpType::Ud => self.next_ud_request(ctx, tx),
            QpType::Rc => self.next_rc_request(now, ctx, tx, fresh_ok),
            QpType::Uc => self.next_uc_request(ctx, tx),
        }
    }
}
