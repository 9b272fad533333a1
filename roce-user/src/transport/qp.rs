//! One queue pair: requester (builds request packets from the send queue), completer
//! (processes ACKs, NAKs and responses, completes send WRs, retries) and responder (checks and
//! executes requests, answers them). The split and the order of checks follow rxe
//! (`rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`); each rule cites its source in reference §2.

use core::ops::Range;
use std::collections::VecDeque;

use roce_common::opcode::{Opcode, Operation, Position, Transport};

use super::RxPkt;
use super::counters::QpCounters;
use super::cq::{CqId, Wc, WcFlags, WcOpcode, WcStatus};
use super::ids::{Msn, Psn, Qpn, RKey};
use super::mr::{Access, PdId, Sge, sg_gather, sg_len, sg_scatter};
use super::state::{AttrMask, Mtu, QpAttr, QpState, QpType};
use super::timer::{Instant, Timer, TimerTable, local_ack_timeout, rnr_timer};
use super::wr::{RecvWr, SendOp, SendWr};
use super::{Ctx, Event, Path};
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FrameTemplate,
    IethRepr, ImmDtRepr, NakCode, RethRepr, RnrTimer, RoceRepr, roce::payload_range,
};

mod completer;
mod responder;

/// rxe `RXE_MAX_UNACKED_PSNS`: the requester stalls when this many PSNs are unacknowledged.
pub const MAX_UNACKED_PSNS: u32 = 128;
/// rxe `RXE_MAX_PKT_PER_ACK`: AckReq is set at least every this many packets.
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Control responses (ACK/NAK) a responder queues before coalescing or dropping.
pub const MAX_PENDING_ACKS: usize = 16;
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
}

/// Sizes of a QP's queues (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 4,
        }
    }
}

/// What `create_qp` needs (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    /// The protection domain: the QP reaches only this PD's memory regions.
    pub pd: PdId,
    /// RC or UD.
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
    wr: SendWr<Path>,
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
}

/// Bytes of one responder resource (documented in [`Qp`]).
pub const RESOURCE_SIZE: usize = core::mem::size_of::<Resource>();
/// Bytes of one queued control response (documented in [`Qp`]).
pub const CTRL_SIZE: usize = core::mem::size_of::<Ctrl>();

// The memory bound documented on [`Qp`], checked at compile time (64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(core::mem::size_of::<Qp>() <= 1024);
    assert!(SEND_WQE_SIZE <= 184);
    assert!(core::mem::size_of::<RecvWr>() <= 32);
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
/// the fixed state is 888 B (152 B of it the transmit header template); a send WQE is 184 B
/// plus 16 B per SGE; a receive WQE 32 B plus 16 B per SGE; a responder resource at most
/// 64 B; a queued control response 12 B. The
/// queues are bounded: at most `max_send_wr` send WQEs and `max_recv_wr` receive WQEs (both
/// posted by the local application, never by a peer), at most `max_dest_rd_atomic` responder
/// resources (a ring: one more evicts the oldest, as in rxe) and at most
/// [`MAX_PENDING_ACKS`] control responses (newer ACKs replace older ones, NAKs beyond are
/// counted in `ack_queue_full`). With the defaults (256 + 256 WRs of 4 SGEs, 16 resources) a
/// QP holds at most 256 × 248 + 256 × 96 + 16 × 64 + 16 × 12 + 888 ≈ 88 KiB; nothing a peer
/// sends can grow it.
#[derive(Debug)]
pub struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr<Path>,
    pub(crate) init: QpInit,
    sq: VecDeque<SendWqe>,
    rq: VecDeque<RecvWr>,
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
    /// Doublings of the local ACK timeout since the QP was last idle (see
    /// [`MAX_TIMEOUT_BACKOFF`]).
    backoff: u8,
    drained_reported: bool,
    // responder
    resp_psn: Psn,
    msn: Msn,
    sent_psn_nak: bool,
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
}

fn opcode_for(kind: Operation, pos: Position, imm: bool, inv: bool) -> Opcode {
    use Position::*;
    match (kind, pos, imm, inv) {
        (Operation::Send, First, ..) => Opcode::RC_SEND_FIRST,
        (Operation::Send, Middle, ..) => Opcode::RC_SEND_MIDDLE,
        (Operation::Send, Last, true, _) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        (Operation::Send, Last, _, true) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
        (Operation::Send, Last, ..) => Opcode::RC_SEND_LAST,
        (Operation::Send, Only, true, _) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        (Operation::Send, Only, _, true) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
        (Operation::Send, Only, ..) => Opcode::RC_SEND_ONLY,
        (Operation::Write, First, ..) => Opcode::RC_RDMA_WRITE_FIRST,
        (Operation::Write, Middle, ..) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (Operation::Write, Last, true, _) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (Operation::Write, Last, ..) => Opcode::RC_RDMA_WRITE_LAST,
        (Operation::Write, Only, true, _) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (Operation::Write, Only, ..) => Opcode::RC_RDMA_WRITE_ONLY,
        (Operation::ReadResponse, First, ..) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        (Operation::ReadResponse, Middle, ..) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        (Operation::ReadResponse, Last, ..) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        (Operation::ReadResponse, Only, ..) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        _ => Opcode::RC_SEND_ONLY,
    }
}

/// The number of packets a message of `len` bytes takes at `mtu` (at least one).
#[must_use]
pub fn packets_for(len: u64, mtu: Mtu) -> u32 {
    let m = u64::from(mtu.bytes());
    u32::try_from(len.div_ceil(m).max(1)).unwrap_or(u32::MAX)
}

/// The position of packet `idx` (0-based) of a message of `npkts` packets.
#[must_use]
pub const fn position_of(idx: u32, npkts: u32) -> Position {
    if npkts <= 1 {
        Position::Only
    } else if idx == 0 {
        Position::First
    } else if idx + 1 == npkts {
        Position::Last
    } else {
        Position::Middle
    }
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
            backoff: 0,
            drained_reported: false,
            resp_psn: Psn::new(0),
            msn: Msn::new(0),
            sent_psn_nak: false,
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
        let counters = self.counters;
        *self = Self::new(qpn, init);
        self.counters = counters;
    }

    // ---------------------------------------------------------------- posting

    pub(crate) fn post_send(
        &mut self,
        wr: SendWr<Path>,
        max_sge: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(PostError::InvalidState(self.state));
            }
            _ => {}
        }
        if wr.sg_list.len() > max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len(), max_sge));
        }
        if self.sq.len() >= self.init.cap.max_send_wr as usize {
            return Err(PostError::QueueFull(self.sq.len()));
        }
        let len = sg_len(&wr.sg_list);
        match self.qp_type {
            QpType::Ud => {
                if wr.ud.is_none() {
                    return Err(PostError::Invalid("UD send needs a destination"));
                }
                if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
                    return Err(PostError::Invalid("UD supports SEND only"));
                }
                if len > u64::from(self.mtu().bytes()) {
                    return Err(PostError::Invalid("UD message longer than the path MTU"));
                }
            }
            QpType::Rc => {
                if wr.ud.is_some() {
                    return Err(PostError::Invalid("RC send with a UD destination"));
                }
                if len > MAX_MSG_SIZE {
                    return Err(PostError::Invalid("message longer than 2^31 bytes"));
                }
                if wr.op.is_atomic() && len != 8 {
                    return Err(PostError::Invalid("atomics need one 8-byte result buffer"));
                }
            }
        }
        // Atomics take one PSN; everything else one per path-MTU segment (at least one).
        let npkts = if wr.op.is_atomic() {
            1
        } else {
            packets_for(len, self.mtu())
        };
        let wqe = SendWqe {
            wr,
            len,
            first_psn: None,
            npkts,
            rcvd_pkts: 0,
            done: None,
        };
        self.sq.push_back(wqe);
        if self.state == QpState::Err {
            self.flush(ctx);
        }
        Ok(())
    }

    pub(crate) fn post_recv(
        &mut self,
        wr: RecvWr,
        max_sge: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if wr.sg_list.len() > max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len(), max_sge));
        }
        if self.rq.len() >= self.init.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull(self.rq.len()));
        }
        self.rq.push_back(wr);
        if self.state == QpState::Err {
            self.flush(ctx);
        }
        Ok(())
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
        };
        Wc {
            wr_id: wqe.wr.wr_id,
            status,
            opcode,
            byte_len: u32::try_from(wqe.len).unwrap_or(u32::MAX),
            imm: 0,
            invalidated_rkey: 0,
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
                invalidated_rkey: 0,
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

    // ---------------------------------------------------------------- timers

    /// Arms the local ACK timer (IBA 9.7.6.1.3) when requests are outstanding, or stops it when
    /// none are; `restart` pushes an armed timer forward (progress, or proof the responder is
    /// still working on our requests). The period is the QP's `timeout`, doubled per
    /// consecutive expiry up to [`MAX_TIMEOUT_BACKOFF`] times; the doubling is forgotten once
    /// everything sent has been acknowledged.
    fn arm_retransmit(&mut self, now: Instant, restart: bool) {
        if self.comp_psn == self.sent_psn {
            self.timers.stop(Timer::Retransmit);
            self.backoff = 0;
            return;
        }
        if (restart || self.timers.get(Timer::Retransmit).is_none())
            && let Some(d) = local_ack_timeout(self.attr.timeout)
        {
            self.timers
                .set(Timer::Retransmit, now + d * (1u32 << self.backoff));
        }
    }

    /// The earliest of its armed timers: retransmission or RNR back-off, and DCQCN's timers
    /// and pacer release. The device keeps this in its timer set (transport/sched.rs).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match (self.timers.next_timeout(), self.cc_poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        for t in Timer::VALUES {
            if !self.timers.is_expired(t, now) {
                continue;
            }
            self.timers.stop(t);
            match t {
                Timer::Retransmit => {
                    if self.comp_psn == self.sent_psn || !self.state.requester_ready() {
                        continue;
                    }
                    self.counters.local_ack_timeout_err += 1;
                    self.retry_guard = None;
                    self.backoff = (self.backoff + 1).min(MAX_TIMEOUT_BACKOFF);
                    self.retry(now, ctx, false);
                }
                Timer::RnrRetry => {
                    if self.rnr_wait {
                        self.rnr_wait = false;
                        self.go_back(self.comp_psn);
                        self.arm_retransmit(now, true);
                    }
                }
            }
        }
    }

    /// Starts a retry from `comp_psn` if retries remain, else fails the head WR with
    /// RETRY_EXC_ERR (rxe_comp.c `COMPST_ERROR_RETRY`; retry_cnt 7 retries forever as in rxe).
    /// An `implied` retry (a NAK or a response past a gap) starts only once per `comp_psn`
    /// (rxe `started_retry`). Returns whether a retry sequence started.
    fn retry(&mut self, now: Instant, ctx: &mut Ctx<'_>, implied: bool) -> bool {
        if self.comp_psn == self.sent_psn {
            return false;
        }
        if implied {
            if self.retry_guard == Some(self.comp_psn) {
                return false;
            }
            self.retry_guard = Some(self.comp_psn);
        } else {
            self.retry_guard = None;
        }
        if self.retry_left == 0 {
            self.counters.retry_exceeded_err += 1;
            self.counters.req_transport_retries_exceeded += 1;
            self.complete_head(WcStatus::RetryExcErr, ctx);
            self.enter_error(ctx);
            return false;
        }
        if self.retry_left != 7 {
            self.retry_left -= 1;
        }
        self.counters.completer_retry_err += 1;
        self.go_back(self.comp_psn);
        self.arm_retransmit(now, true);
        true
    }

    /// Rewinds the requester to resend from `psn` (go back N; rxe `req_retry`).
    fn go_back(&mut self, psn: Psn) {
        for (i, w) in self.sq.iter().enumerate() {
            let (Some(f), Some(l)) = (w.first_psn, w.last_psn()) else {
                break;
            };
            if psn.distance(f) >= 0 && psn.distance(l) <= 0 {
                self.req_idx = i;
                self.req_pkt = psn.distance(f) as u32;
                self.next_psn = psn;
                self.noack_pkts = 0;
                return;
            }
        }
        // `psn` is past every started WQE: continue with the first one not started.
        self.req_idx = self
            .sq
            .iter()
            .position(|w| w.first_psn.is_none())
            .unwrap_or(self.sq.len());
        self.req_pkt = 0;
        self.next_psn = psn;
        self.noack_pkts = 0;
    }

    /// After an acknowledgement moved `comp_psn` past the requester (it had gone back and
    /// the peer already had those packets), skip what is acknowledged instead of resending it.
    fn skip_acked(&mut self) {
        if self.comp_psn.distance(self.next_psn) > 0 {
            self.go_back(self.comp_psn);
        }
    }

    /// READ and atomic request messages sent and not yet fully answered: what the responder
    /// holds resources for, at most `max_rd_atomic` (IBA 9.5: the initiator depth). A READ WR
    /// counts one per piece sent and not answered ([`READ_CHUNK_PKTS`]).
    fn rd_msgs_outstanding(&self) -> u32 {
        let mut n = 0;
        for w in &self.sq {
            let Some(f) = w.first_psn else { break };
            if w.done.is_some() {
                continue;
            }
            match w.wr.op {
                SendOp::Read { .. } => {
                    let sent = u32::try_from(self.sent_psn.distance(f).max(0))
                        .unwrap_or(0)
                        .min(w.npkts);
                    let pieces = |pkts: u32| pkts.div_ceil(READ_CHUNK_PKTS);
                    n += pieces(sent).saturating_sub(w.rcvd_pkts / READ_CHUNK_PKTS);
                }
                op if op.is_atomic() => n += 1,
                _ => {}
            }
        }
        n
    }

    // ---------------------------------------------------------------- requester output

    /// The next packet to send. With `data_ok` false (the congestion-control pacer holds the
    /// QP back) only control packets (ACK/NAK) are returned; with `fresh_ok` false (the
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
        if let Some(c) = self.ctrl.pop_front() {
            return Some(self.ctrl_pkt(c));
        }
        if !data_ok {
            return None;
        }
        if self.state == QpState::Err || self.state == QpState::Reset {
            return None;
        }
        if self.state.responder_ready()
            && let Some(p) = self.next_response(ctx, tx)
        {
            return Some(p);
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
        }
    }

    /// PSNs sent and not yet acknowledged (READ responses still due included), plus the rest
    /// of the message being sent (at most a window): this QP's share of the device's in-flight
    /// budget. Zero outside RTS/SQD/SQE and for UD.
    pub(crate) fn unacked_psns(&self) -> u32 {
        if self.qp_type != QpType::Rc
            || !matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        {
            return 0;
        }
        let sent = u32::try_from(self.sent_psn.distance(self.comp_psn)).unwrap_or(0);
        let rest = self
            .sq
            .get(self.req_idx)
            .filter(|w| w.first_psn.is_some())
            .map_or(0, |w| {
                w.npkts.saturating_sub(self.req_pkt).min(MAX_UNACKED_PSNS)
            });
        sent.saturating_add(rest)
    }

    /// Whether a send WR still has packets to send for the first time or again.
    pub(crate) fn has_unsent_requests(&self) -> bool {
        self.req_idx < self.sq.len()
    }

    fn ctrl_pkt(&mut self, c: Ctrl) -> OutPkt {
        let repr = RoceRepr::ack(
            self.attr.dest_qp_num,
            c.psn,
            AethRepr {
                syndrome: c.syndrome,
                msn: c.msn,
            },
        );
        self.counters.sent_pkts += 1;
        OutPkt {
            repr,
            payload: 0..0,
            ud_path: None,
        }
    }

    fn queue_ctrl(&mut self, syndrome: AethSyndrome, psn: Psn) {
        let c = Ctrl {
            syndrome,
            psn,
            msn: self.msn,
        };
        if self.ctrl.len() >= MAX_PENDING_ACKS {
            // ACKs are cumulative: a newer ACK replaces an older one at the tail.
            if let Some(last) = self.ctrl.back_mut()
                && last.syndrome.is_ack()
                && syndrome.is_ack()
            {
                *last = c;
                self.counters.ack_deferred += 1;
                return;
            }
            self.counters.ack_queue_full += 1;
            return;
        }
        self.ctrl.push_back(c);
    }

    fn next_ud_request(&mut self, ctx: &mut Ctx<'_>, tx: &mut TxBuf<'_>) -> Option<OutPkt> {
        if self.state == QpState::Sqd {
            self.check_drained(ctx);
            return None;
        }
        let wqe = self.sq.front()?;
        let ud = wqe.wr.ud.clone()?;
        let len = usize::try_from(wqe.len).ok()?;
        let (op, imm) = match wqe.wr.op {
            SendOp::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, Some(imm)),
            _ => (Opcode::UD_SEND_ONLY, None),
        };
        let se = wqe.wr.flags.contains(super::wr::SendFlags::SOLICITED);
        let gathered = tx.payload(op, len).and_then(|(range, dst)| {
            sg_gather(ctx.mrs, self.init.pd, &wqe.wr.sg_list, 0, dst)
                .ok()
                .map(|()| range)
        });
        let Some(payload) = gathered else {
            self.counters.send_err += 1;
            self.complete_head(WcStatus::LocProtErr, ctx);
            self.state = QpState::Sqe;
            return None;
        };
        // A Q_Key with the high bit set means "use the QP's own Q_Key" (IBA 10.2.5).
        let qkey = if ud.remote_qkey.value() & 0x8000_0000 != 0 {
            self.attr.qkey
        } else {
            ud.remote_qkey
        };
        let mut bth = BthRepr::new(op, ud.remote_qpn, self.next_psn);
        bth.solicited = se;
        let mut repr = RoceRepr::new(bth);
        repr.immdt = imm.map(|imm| ImmDtRepr { imm });
        repr.deth = Some(DethRepr {
            qkey,
            src_qp: self.qpn,
        });
        self.next_psn = self.next_psn.next();
        self.comp_psn = self.next_psn;
        self.sent_psn = self.next_psn;
        self.counters.sent_pkts += 1;
        self.complete_head(WcStatus::Success, ctx);
        Some(OutPkt {
            repr,
            payload,
            ud_path: Some(ud.path),
        })
    }

    fn next_rc_request(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
        fresh_ok: bool,
    ) -> Option<OutPkt> {
        if self.rnr_wait {
            return None;
        }
        if self.next_psn.distance(self.comp_psn) >= MAX_UNACKED_PSNS as i32 {
            return None;
        }
        let mtu = self.mtu();
        let max_rd = u32::from(self.attr.max_rd_atomic);
        let idx = self.req_idx;
        let wqe = self.sq.get(idx)?;
        if wqe.done.is_some() {
            return None;
        }
        if wqe.first_psn.is_none() {
            // A new WQE: SQD starts none; READ/ATOMIC need an initiator-depth slot.
            if self.state == QpState::Sqd {
                self.check_drained(ctx);
                return None;
            }
        }
        let pkt_idx = self.req_pkt;
        let npkts = wqe.npkts;
        let psn = wqe
            .first_psn
            .map_or(self.next_psn, |f| f.wrapping_add(pkt_idx));
        if !fresh_ok && wqe.first_psn.is_none() {
            // A message not started yet, and the device's in-flight budget is used up. A
            // started message goes on: its remaining packets are already counted in
            // `unacked_psns`, and holding it back would hold back the AckReq of its last
            // packet, leaving its PSNs unacknowledged until the retransmission timer fired.
            return None;
        }
        // A READ or atomic request never sent before (not a re-request) needs an
        // initiator-depth slot (rxe `check_init_depth`).
        if wqe.wr.op.is_read_or_atomic()
            && psn.distance(self.sent_psn) >= 0
            && self.rd_msgs_outstanding() >= max_rd
        {
            return None;
        }
        let m = u64::from(mtu.bytes());
        let off = u64::from(pkt_idx) * m;
        let dest = self.attr.dest_qp_num;
        let solicited = wqe.wr.flags.contains(super::wr::SendFlags::SOLICITED);
        let op = wqe.wr.op;
        let wqe_len = wqe.len;
        let mut repr;
        let mut payload = 0..0;
        let last;
        // PSNs this request takes (a READ piece: one per response packet).
        let mut read_pkts = 1;
        match op {
            SendOp::Read { remote_addr, rkey } => {
                // One request per piece of READ_CHUNK_PKTS packets, from `pkt_idx` to the end of
                // its piece; a retry resumes mid-piece (rxe req_retry).
                let start = u64::from(pkt_idx) * m;
                let piece_end = ((pkt_idx / READ_CHUNK_PKTS + 1) * READ_CHUNK_PKTS).min(npkts);
                let end = (u64::from(piece_end) * m).min(wqe_len);
                repr = RoceRepr::new(BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, dest, psn));
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(start),
                    rkey,
                    dma_len: u32::try_from(end.saturating_sub(start)).unwrap_or(u32::MAX),
                });
                read_pkts = piece_end.saturating_sub(pkt_idx).max(1);
                last = piece_end >= npkts;
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                repr = RoceRepr::new(BthRepr::new(Opcode::RC_COMPARE_SWAP, dest, psn));
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                last = true;
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                repr = RoceRepr::new(BthRepr::new(Opcode::RC_FETCH_ADD, dest, psn));
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                last = true;
            }
            _ => {
                let pos = position_of(pkt_idx, npkts);
                let (kind, imm, inv) = match op {
                    SendOp::Send => (Operation::Send, None, None),
                    SendOp::SendWithImm { imm } => (Operation::Send, Some(imm), None),
                    SendOp::SendWithInv { invalidate_rkey } => {
                        (Operation::Send, None, Some(invalidate_rkey))
                    }
                    SendOp::Write { .. } => (Operation::Write, None, None),
                    SendOp::WriteWithImm { imm, .. } => (Operation::Write, Some(imm), None),
                    _ => (Operation::Send, None, None),
                };
                let ends = matches!(pos, Position::Last | Position::Only);
                let opcode = opcode_for(kind, pos, imm.is_some(), inv.is_some());
                repr = RoceRepr::new(BthRepr::new(opcode, dest, psn));
                if ends {
                    repr.immdt = imm.map(|imm| ImmDtRepr { imm });
                    repr.ieth = inv.map(|rkey| IethRepr { rkey });
                }
                if let SendOp::Write { remote_addr, rkey }
                | SendOp::WriteWithImm {
                    remote_addr, rkey, ..
                } = op
                    && matches!(pos, Position::First | Position::Only)
                {
                    repr.reth = Some(RethRepr {
                        va: remote_addr,
                        rkey,
                        dma_len: u32::try_from(wqe_len).unwrap_or(u32::MAX),
                    });
                }
                let len = usize::try_from((wqe_len - off.min(wqe_len)).min(m)).unwrap_or(0);
                let gathered = tx.payload(opcode, len).and_then(|(range, dst)| {
                    sg_gather(ctx.mrs, self.init.pd, &self.sq[idx].wr.sg_list, off, dst)
                        .ok()
                        .map(|()| range)
                });
                let Some(range) = gathered else {
                    // rxe: a bad local SGE completes the WR with a local protection error.
                    // Earlier WRs may still be in flight: the failure is reported in order, when
                    // the completer reaches this WR (see `complete_acked`).
                    self.counters.send_err += 1;
                    if let Some(w) = self.sq.get_mut(idx) {
                        w.done = Some(WcStatus::LocProtErr);
                    }
                    if idx == 0 {
                        self.complete_head(WcStatus::LocProtErr, ctx);
                        self.enter_error(ctx);
                    }
                    return None;
                };
                payload = range;
                repr.bth.solicited = ends && solicited && !matches!(op, SendOp::Write { .. });
                last = ends;
            }
        }
        // Commit.
        let wqe = self.sq.get_mut(idx)?;
        if wqe.first_psn.is_none() {
            wqe.first_psn = Some(self.next_psn);
            if !matches!(
                op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
            ) {
                self.counters.rdma_sends += 1;
            }
        }
        let is_read = matches!(op, SendOp::Read { .. });
        let consumed = read_pkts;
        self.noack_pkts += 1;
        repr.bth.ack_req = last || is_read || self.noack_pkts >= MAX_PKT_PER_ACK;
        if repr.bth.ack_req {
            self.noack_pkts = 0;
        }
        let next = psn.wrapping_add(consumed);
        if next.distance(self.next_psn) > 0 {
            self.next_psn = next;
        }
        if next.distance(self.sent_psn) > 0 {
            self.sent_psn = next;
        }
        if last {
            self.req_idx += 1;
            self.req_pkt = 0;
        } else {
            self.req_pkt += consumed;
        }
        self.counters.sent_pkts += 1;
        self.arm_retransmit(now, false);
        Some(OutPkt {
            repr,
            payload,
            ud_path: None,
        })
    }

    // ---------------------------------------------------------------- responder output

    fn next_response(&mut self, ctx: &mut Ctx<'_>, tx: &mut TxBuf<'_>) -> Option<OutPkt> {
        let mtu = u64::from(self.mtu().bytes());
        let dest = self.attr.dest_qp_num;
        let msn = self.msn;
        let i = self.resources.iter().position(Resource::pending)?;
        match &mut self.resources[i] {
            Resource::Atomic { psn, orig, pending } => {
                *pending = false;
                let mut repr =
                    RoceRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest, *psn));
                repr.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn,
                });
                repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig: *orig });
                self.counters.sent_pkts += 1;
                Some(OutPkt {
                    repr,
                    payload: 0..0,
                    ud_path: None,
                })
            }
            Resource::Read {
                first_psn,
                last_psn,
                va,
                rkey,
                len,
                cur_psn,
                pending: _,
                restart,
            } => {
                let idx = cur_psn.distance(*first_psn) as u64;
                let off = idx * mtu;
                let n = (*len - off.min(*len)).min(mtu);
                let is_last = *cur_psn == *last_psn;
                let psn = *cur_psn;
                // The first packet of a (re)played response is FIRST/ONLY (a replay answers a
                // new READ request from that PSN), the others MIDDLE/LAST.
                let pos = match (idx == 0 || *restart, is_last) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, true) => Position::Last,
                    (false, false) => Position::Middle,
                };
                let (rkey, va) = (*rkey, va.wrapping_add(off));
                let nn = usize::try_from(n).ok()?;
                let opcode = opcode_for(Operation::ReadResponse, pos, false, false);
                let (payload, dst) = tx.payload(opcode, nn)?;
                // A zero-length READ touches no memory and needs no R_Key.
                let read = if n == 0 {
                    Ok(())
                } else {
                    ctx.mrs
                        .remote_mut(self.init.pd, rkey, va, n, Access::REMOTE_READ)
                        .map(|src| dst.copy_from_slice(src))
                };
                match read {
                    Ok(()) => {}
                    Err(_) => {
                        // The region went away mid-response: NAK remote access, class C.
                        self.counters.resp_remote_access_errors += 1;
                        self.resources.clear();
                        self.queue_ctrl(AethSyndrome::Nak(NakCode::RemoteAccessError), psn);
                        self.enter_error(ctx);
                        let c = self.ctrl.pop_front()?;
                        return Some(self.ctrl_pkt(c));
                    }
                }
                if let Resource::Read {
                    cur_psn,
                    pending,
                    restart,
                    ..
                } = &mut self.resources[i]
                {
                    *restart = false;
                    if is_last {
                        *pending = false;
                    } else {
                        *cur_psn = cur_psn.next();
                    }
                }
                let mut repr = RoceRepr::new(BthRepr::new(opcode, dest, psn));
                if pos != Position::Middle {
                    repr.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::ACK_UNLIMITED,
                        msn,
                    });
                }
                self.counters.sent_pkts += 1;
                Some(OutPkt {
                    repr,
                    payload,
                    ud_path: None,
                })
            }
        }
    }
}
