//! The requester: turns send WRs into request packets (rxe_req.c; reference §2 "Requester"):
//! posting, segmentation by path MTU, opcode choice, the PSN window and initiator depth.

use super::*;
use crate::transport::wr::QueuedSendWr;
use crate::transport::{AccessError, MrTable};

/// The RC opcode of the packet at `pos` of a `kind` message (SEND, WRITE or READ response),
/// with ImmDt (`imm`) or IETH (`inv`) on its last packet (IBA 9.2, table 38; rxe
/// `next_opcode_rc`).
pub(super) fn opcode_for(kind: Operation, pos: Position, imm: bool, inv: bool) -> Opcode {
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

/// Copies the payload of `wr` from byte `off` into `dst` (all of it): the inline bytes the WR
/// carries, else its SG list gathered through the MR table (rxe `copy_data`, or the memcpy
/// from `wqe->dma.inline_data` for `IB_SEND_INLINE`). Called for each packet sent, so a
/// retransmission copies the same bytes again.
///
/// # Errors
/// A bad local key, right or range of the SG list ([`AccessError`]); for inline data a range
/// beyond its end, which the requester never asks for.
fn gather(
    mrs: &mut MrTable,
    pd: PdId,
    wr: &QueuedSendWr<Path>,
    off: u64,
    dst: &mut [u8],
) -> Result<(), AccessError> {
    let Some(data) = &wr.inline_data else {
        return sg_gather(mrs, pd, &wr.sg_list, off, dst);
    };
    let src = usize::try_from(off)
        .ok()
        .and_then(|o| data.get(o..o.checked_add(dst.len())?))
        .ok_or(AccessError::OutOfBounds)?;
    dst.copy_from_slice(src);
    Ok(())
}

/// One RC (or UC, qp/uc.rs) request packet as built, before the requester moves past it
/// ([`Qp::commit_rc_request`]).
pub(super) struct RcRequest {
    pub(super) repr: RoceRepr,
    /// Where its payload lies in the frame buffer ([`TxBuf::payload`]).
    pub(super) payload: Range<usize>,
    /// Whether it is the WR's last request.
    pub(super) last: bool,
    /// PSNs it takes: one, or one per response packet of a READ piece.
    psns: u32,
}

impl Qp {
    pub(crate) fn post_send(
        &mut self,
        wr: SendWr<Path>,
        max_sge: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PostError> {
        let len = self.check_send(&wr, max_sge, 0)?;
        self.push_send(wr, len, ctx);
        Ok(())
    }

    /// Posts `wrs` in order, all or none: the first refused (with its index) leaves the send
    /// queue as it was. What `ibv_wr_complete` does with the batch since `ibv_wr_start`
    /// (rdma-core's rxe provider rolls back its producer index when a builder failed).
    pub(crate) fn post_send_all(
        &mut self,
        wrs: Vec<SendWr<Path>>,
        max_sge: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), (usize, PostError)> {
        let lens = wrs
            .iter()
            .enumerate()
            .map(|(i, wr)| self.check_send(wr, max_sge, i).map_err(|e| (i, e)))
            .collect::<Result<Vec<_>, _>>()?;
        for (wr, len) in wrs.into_iter().zip(lens) {
            self.push_send(wr, len, ctx);
        }
        Ok(())
    }

    /// The checks of `ibv_post_send` for `wr` posted after `ahead` more WRs of its batch;
    /// returns its length.
    fn check_send(
        &self,
        wr: &SendWr<Path>,
        max_sge: usize,
        ahead: usize,
    ) -> Result<u64, PostError> {
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(PostError::InvalidState(self.state));
            }
            _ => {}
        }
        if wr.sg_list.len() > max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len(), max_sge));
        }
        if let Some(data) = &wr.inline_data {
            // rxe `validate_send_wr`: inline only for the opcodes that carry data out, and at
            // most the QP's max_inline_data (EINVAL otherwise).
            if !wr.op.takes_inline() {
                return Err(PostError::Invalid(
                    "inline data is for SEND and RDMA WRITE only",
                ));
            }
            if !wr.sg_list.is_empty() {
                return Err(PostError::Invalid(
                    "an inline WR carries its bytes, not an SG list",
                ));
            }
            if data.len() > self.init.cap.max_inline_data as usize {
                return Err(PostError::Invalid(
                    "inline data longer than the QP's max_inline_data",
                ));
            }
        }
        if self.sq.len() + ahead >= self.init.cap.max_send_wr as usize {
            return Err(PostError::QueueFull(self.sq.len() + ahead));
        }
        let len = wr.msg_len();
        match self.qp_type {
            QpType::Ud => {
                if wr.ud.is_none() {
                    return Err(PostError::Invalid("UD send needs a destination"));
                }
                if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
                    return Err(PostError::Invalid("UD supports SEND only"));
                }
            }
            QpType::Uc => {
                if wr.op.is_local() {
                    return Err(PostError::Invalid(
                        "memory-window binds and local invalidation are for RC QPs",
                    ));
                }
                Self::check_uc_send(wr, len)?;
            }
            QpType::Rc => {
                if wr.ud.is_some() {
                    return Err(PostError::Invalid("RC send with a UD destination"));
                }
                if len > MAX_MSG_SIZE {
                    return Err(PostError::Invalid("message longer than 2^31 bytes"));
                }
                if wr.op.is_local() && !wr.sg_list.is_empty() {
                    return Err(PostError::Invalid("bind/local invalidate take no SG list"));
                }
                if wr.op.is_atomic() && len != 8 {
                    return Err(PostError::Invalid("atomics need one 8-byte result buffer"));
                }
            }
        }
        Ok(len)
    }

    /// Queues a checked `wr` of `len` bytes; in ERR it completes at once with a flush error.
    fn push_send(&mut self, wr: SendWr<Path>, len: u64, ctx: &mut Ctx<'_>) {
        // Atomics take one PSN; local operations none (they send nothing); everything else
        // one per path-MTU segment (at least one).
        let npkts = if wr.op.is_local() {
            0
        } else if wr.op.is_atomic() {
            1
        } else {
            packets_for(len, self.mtu())
        };
        let wqe = SendWqe {
            wr: wr.into(),
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
    }

    /// READ and atomic request messages sent and not yet fully answered: what the responder
    /// holds resources for, at most `max_rd_atomic` (IBA 9.5: the initiator depth). A READ WR
    /// counts one per piece sent and not answered ([`READ_CHUNK_PKTS`]).
    pub(super) fn rd_msgs_outstanding(&self) -> u32 {
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

    /// PSNs sent and not yet acknowledged (READ responses still due included), plus the rest
    /// of the message being sent (at most a window): this QP's share of the device's in-flight
    /// budget. Zero outside RTS/SQD/SQE and for UC and UD (nothing of theirs is outstanding).
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

    pub(super) fn next_ud_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<OutPkt> {
        if self.state == QpState::Sqd {
            self.check_drained(ctx);
            return None;
        }
        // C10-93.1.1: a UD message longer than the MTU emits no packet and no error; rxe
        // (rxe_req.c rxe_requester) completes it successfully, its PSN consumed.
        while self
            .sq
            .front()
            .is_some_and(|w| w.len > u64::from(self.mtu().bytes()))
        {
            self.next_psn = self.next_psn.next();
            self.comp_psn = self.next_psn;
            self.sent_psn = self.next_psn;
            self.complete_head(WcStatus::Success, ctx);
        }
        let wqe = self.sq.front()?;
        let ud = wqe.wr.ud.as_deref()?.clone();
        let len = usize::try_from(wqe.len).ok()?;
        let (op, imm) = match wqe.wr.op {
            SendOp::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, Some(imm)),
            _ => (Opcode::UD_SEND_ONLY, None),
        };
        let se = wqe.wr.flags.contains(SendFlags::SOLICITED);
        let gathered = tx.payload(op, len).and_then(|(range, dst)| {
            gather(ctx.mrs, self.init.pd, &wqe.wr, 0, dst)
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

    /// The next RC request packet, if the window, the initiator depth and the device's
    /// in-flight budget allow one (rxe_req.c `rxe_requester`): the packet at `req_pkt` of the
    /// WR at `req_idx`, after which the requester's PSNs and position move past it.
    pub(super) fn next_rc_request(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
        fresh_ok: bool,
    ) -> Option<OutPkt> {
        self.run_local_ops(ctx)?;
        self.mp_tx_update(now, tx.len());
        if self.mp_selective() {
            // Selective repeat (qp/multipath.rs): what is missing goes before new packets.
            if let Some(p) = self.mp_resend(now, ctx, tx) {
                return Some(p);
            }
        }
        if self.mp_drain_to_enter(tx.len()) {
            return None;
        }
        let psn = self.next_rc_psn(ctx, fresh_ok)?;
        if !self.mp_window_open(psn) {
            return None;
        }
        let op = self.sq.get(self.req_idx)?.wr.op;
        let req = self.request_for(psn, op, ctx, tx)?;
        Some(self.commit_rc_request(now, psn, op, req))
    }

    /// The request packet `psn` of the WR at `req_idx` doing `op`, at packet `req_pkt`: a READ
    /// request (from `req_pkt` to the end of its piece), an atomic, or a SEND or WRITE packet.
    /// Call it while building a new packet or a resend.
    pub(super) fn request_for(
        &mut self,
        psn: Psn,
        op: SendOp,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<RcRequest> {
        let mut req = match op {
            SendOp::Read { remote_addr, rkey } => self.read_request(psn, remote_addr, rkey)?,
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                let eth = AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                };
                self.atomic_request(psn, Opcode::RC_COMPARE_SWAP, eth)
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                let eth = AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                };
                self.atomic_request(psn, Opcode::RC_FETCH_ADD, eth)
            }
            _ => return self.send_write_request(psn, op, ctx, tx),
        };
        if self.mp_selective() {
            // In selective repeat (towards a peer that holds them): hold it until the
            // cumulative PSN reaches it (docs/multipath.md).
            req.repr.bth.resv7 |= crate::wire::multipath::MpBthFlags::HOLD.bits();
            if matches!(op, SendOp::Read { .. }) {
                // And its responses placed out of order as they come (qp/multipath.rs).
                req.repr.bth.resv7 |= crate::wire::multipath::MpBthFlags::READ_PLACED.bits();
            }
        }
        Some(req)
    }

    /// Executes the local operations (bind, local invalidate) at the requester's position
    /// once every WR before them has completed, and completes them (rxe `rxe_do_local_ops`:
    /// a failed bind completes with `IBV_WC_MW_BIND_ERR`, a failed invalidation with
    /// `IBV_WC_LOC_QP_OP_ERR`, and the QP then enters the error state). Waiting for the WRs
    /// before them orders them as if fenced: a window is never bound or invalidated under a
    /// request still in flight. Returns `None` while one waits or the QP failed.
    fn run_local_ops(&mut self, ctx: &mut Ctx<'_>) -> Option<()> {
        while let Some(w) = self.sq.get(self.req_idx)
            && w.wr.op.is_local()
        {
            if self.req_idx != 0 || self.state != QpState::Rts {
                return None;
            }
            let status = match w.wr.op {
                SendOp::BindMw(b) => match ctx.mrs.bind_mw(self.init.pd, self.qpn, &b) {
                    Ok(_) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                },
                SendOp::LocalInv { invalidate_key } => {
                    match ctx.mrs.local_invalidate(self.init.pd, invalidate_key) {
                        Ok(()) => WcStatus::Success,
                        Err(_) => WcStatus::LocQpOpErr,
                    }
                }
                _ => WcStatus::Success,
            };
            self.complete_head(status, ctx);
            if status != WcStatus::Success {
                self.enter_error(ctx);
                return None;
            }
        }
        Some(())
    }

    /// The PSN of the next RC request, or `None` if none may go now: during the RNR wait, with
    /// [`MAX_UNACKED_PSNS`] unacknowledged, on a WR already failed, before a new WR in SQD or
    /// without `fresh_ok`, and for a new READ/atomic without an initiator-depth slot.
    fn next_rc_psn(&mut self, ctx: &mut Ctx<'_>, fresh_ok: bool) -> Option<Psn> {
        if self.rnr_wait {
            return None;
        }
        if self.next_psn.distance(self.comp_psn) >= MAX_UNACKED_PSNS as i32 {
            return None;
        }
        // A timeout's replay waits for the peer's answer to its first packet (`replay_probe`).
        if self.replay_probe && self.next_psn != self.comp_psn {
            return None;
        }
        // Swift's window (transport/cc.rs): no more PSNs unacknowledged than it allows.
        if self
            .cc_window()
            .is_some_and(|w| self.next_psn.distance(self.comp_psn) >= w as i32)
        {
            return None;
        }
        let wqe = self.sq.get(self.req_idx)?;
        if wqe.done.is_some() {
            return None;
        }
        if self.mp_selective() && wqe.wr.op.is_read_or_atomic() && !self.mp.peer_holds() {
            // Towards a peer that does not hold them, selective repeat is left only when
            // nothing is outstanding (mp_tx_update).
            return None;
        }
        if wqe.first_psn.is_none() && self.state == QpState::Sqd {
            // SQD starts no new WQE.
            self.check_drained(ctx);
            return None;
        }
        if !fresh_ok && wqe.first_psn.is_none() {
            // A message not started yet, and the device's in-flight budget is used up. A
            // started message goes on: its remaining packets are already counted in
            // `unacked_psns`, and holding it back would hold back the AckReq of its last
            // packet, leaving its PSNs unacknowledged until the retransmission timer fired.
            return None;
        }
        let psn = wqe
            .first_psn
            .map_or(self.next_psn, |f| f.wrapping_add(self.req_pkt));
        if psn.distance(self.sent_psn) >= 0 && !self.mp_past_request_ok() {
            // Nothing new past a held READ or atomic before it is acknowledged.
            return None;
        }
        // A READ or atomic request never sent before (not a re-request) needs an
        // initiator-depth slot (rxe `check_init_depth`).
        if wqe.wr.op.is_read_or_atomic()
            && psn.distance(self.sent_psn) >= 0
            && self.rd_msgs_outstanding() >= u32::from(self.attr.max_rd_atomic)
        {
            return None;
        }
        Some(psn)
    }

    /// The READ request for the piece of the head-of-line READ WR that `req_pkt` is in: one
    /// request per [`READ_CHUNK_PKTS`] response packets, from `req_pkt` to the end of its
    /// piece, so a retry resumes mid-piece (rxe `req_retry`).
    fn read_request(&self, psn: Psn, remote_addr: u64, rkey: RKey) -> Option<RcRequest> {
        let wqe = self.sq.get(self.req_idx)?;
        let (pkt_idx, npkts) = (self.req_pkt, wqe.npkts);
        let m = u64::from(self.mtu().bytes());
        let start = u64::from(pkt_idx) * m;
        let piece_end = ((pkt_idx / READ_CHUNK_PKTS + 1) * READ_CHUNK_PKTS).min(npkts);
        // In multipath mode, only up to the next response packet already placed.
        let piece_end = self.mp_read_request_end(self.req_idx, pkt_idx, piece_end);
        let end = (u64::from(piece_end) * m).min(wqe.len);
        let bth = BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, self.attr.dest_qp_num, psn);
        let mut repr = RoceRepr::new(bth);
        repr.reth = Some(RethRepr {
            va: remote_addr.wrapping_add(start),
            rkey,
            dma_len: u32::try_from(end.saturating_sub(start)).unwrap_or(u32::MAX),
        });
        Some(RcRequest {
            repr,
            payload: 0..0,
            last: piece_end >= npkts,
            psns: piece_end.saturating_sub(pkt_idx).max(1),
        })
    }

    /// The request of an atomic WR: one `opcode` packet carrying `eth` (IBA 9.4.5).
    fn atomic_request(&self, psn: Psn, opcode: Opcode, eth: AtomicEthRepr) -> RcRequest {
        let mut repr = RoceRepr::new(BthRepr::new(opcode, self.attr.dest_qp_num, psn));
        repr.atomic_eth = Some(eth);
        RcRequest {
            repr,
            payload: 0..0,
            last: true,
            psns: 1,
        }
    }

    /// Packet `req_pkt` of a SEND or WRITE WR `op`: its opcode by position (IBA 9.2; the UC
    /// opcodes on a UC QP), the RETH on a WRITE's first packet, ImmDt/IETH on the last, and
    /// the payload gathered into `tx`. A bad local SGE fails the WR with LOC_PROT_ERR (rxe);
    /// `None` then.
    pub(super) fn send_write_request(
        &mut self,
        psn: Psn,
        op: SendOp,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<RcRequest> {
        let idx = self.req_idx;
        let m = u64::from(self.mtu().bytes());
        let off = u64::from(self.req_pkt) * m;
        // In selective-repeat mode the packet ends in its placement trailer.
        let trailer = self.mp_trailer(idx, psn, op, off);
        let wqe = self.sq.get(idx)?;
        let pos = position_of(self.req_pkt, wqe.npkts);
        let (kind, imm, inv) = match op {
            SendOp::SendWithImm { imm } => (Operation::Send, Some(imm), None),
            SendOp::SendWithInv { invalidate_rkey } => {
                (Operation::Send, None, Some(invalidate_rkey))
            }
            SendOp::Write { .. } => (Operation::Write, None, None),
            SendOp::WriteWithImm { imm, .. } => (Operation::Write, Some(imm), None),
            _ => (Operation::Send, None, None),
        };
        let ends = matches!(pos, Position::Last | Position::Only);
        let opcode = if self.qp_type == QpType::Uc {
            super::uc::uc_opcode_for(kind, pos, imm.is_some())
        } else {
            opcode_for(kind, pos, imm.is_some(), inv.is_some())
        };
        let mut repr = RoceRepr::new(BthRepr::new(opcode, self.attr.dest_qp_num, psn));
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
                dma_len: u32::try_from(wqe.len).unwrap_or(u32::MAX),
            });
        }
        let solicited = wqe.wr.flags.contains(SendFlags::SOLICITED);
        repr.bth.solicited = ends && solicited && !matches!(op, SendOp::Write { .. });
        let len = usize::try_from((wqe.len - off.min(wqe.len)).min(m)).unwrap_or(0);
        let tlen = trailer.map_or(0, |t| t.buffer_len());
        let gathered = tx.payload(opcode, len + tlen).and_then(|(range, dst)| {
            let (data, tail) = dst.split_at_mut(len);
            gather(ctx.mrs, self.init.pd, &wqe.wr, off, data).ok()?;
            if let Some(t) = trailer {
                tail.copy_from_slice(&t.to_bytes());
            }
            Some(range)
        });
        if trailer.is_some() {
            repr.bth.resv7 = crate::wire::multipath::MpBthFlags::TRAILER.bits();
        }
        let Some(payload) = gathered else {
            // rxe: a bad local SGE completes the WR with a local protection error. Earlier
            // WRs may still be in flight: the failure is reported in order, when the
            // completer reaches this WR (see `complete_acked`).
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
        Some(RcRequest {
            repr,
            payload,
            last: ends,
            psns: 1,
        })
    }

    /// Moves the requester past `req`, sent at `psn` for a WR `op`: the WR's first PSN, the
    /// AckReq bit (on a message's last packet, a READ request, and at least every
    /// [`MAX_PKT_PER_ACK`] packets), `next_psn`/`sent_psn`, the position in the send queue,
    /// and the local ACK timer.
    fn commit_rc_request(&mut self, now: Instant, psn: Psn, op: SendOp, req: RcRequest) -> OutPkt {
        let RcRequest {
            mut repr,
            payload,
            last,
            psns,
        } = req;
        if let Some(wqe) = self.sq.get_mut(self.req_idx)
            && wqe.first_psn.is_none()
        {
            wqe.first_psn = Some(self.next_psn);
        }
        let is_read = matches!(op, SendOp::Read { .. });
        self.noack_pkts += 1;
        // Under Swift's window (transport/cc.rs) an ACK is asked for at least every half window
        // and on the packet that fills it: the window opens only as ACKs come back, and each
        // ACK is an RTT sample.
        let (per_ack, fills) = match self.cc_window() {
            Some(w) => (
                (w / 2).clamp(1, MAX_PKT_PER_ACK),
                psn.wrapping_add(psns).distance(self.comp_psn) >= w as i32,
            ),
            None => (MAX_PKT_PER_ACK, false),
        };
        repr.bth.ack_req =
            last || is_read || fills || self.replay_probe || self.noack_pkts >= per_ack;
        if repr.bth.ack_req {
            self.noack_pkts = 0;
        }
        self.cc_on_request_sent(now, psn, psns);
        self.mp_on_sent(now, psn, psns, op);
        let next = psn.wrapping_add(psns);
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
            self.req_pkt += psns;
        }
        self.counters.sent_pkts += 1;
        self.arm_retransmit(now, false);
        OutPkt {
            repr,
            payload,
            ud_path: None,
        }
    }
}
