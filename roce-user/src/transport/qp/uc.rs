//! The Unreliable Connected service (IBA 9.7.5.1 and 9.8.3; rxe: `next_opcode_uc` in
//! rxe_opcode.c, the UC cases of rxe_resp.c `check_psn`, `check_op_seq`, `check_op_valid` and
//! `do_class_d1e_error`, and rxe_net.c `rxe_xmit_packet`, which completes a UC WQE once its
//! last packet is sent). Reference: reference/roce-v2.md §2.
//!
//! A UC QP is connected like RC (one peer, PSNs, SEND and RDMA WRITE segmented by the path
//! MTU) but nothing is acknowledged or retransmitted:
//! - the requester sends every packet once, without AckReq, and completes a WR as soon as its
//!   last packet is sent; READ and atomics do not exist on UC and are refused at post time
//!   ([`super::PostError::Invalid`], EINVAL);
//! - the responder executes packets in PSN order. On a PSN gap, a packet out of its message's
//!   opcode sequence, no receive WQE, or a length or R_Key error it drops the rest of the
//!   message in progress silently (no NAK, the QP stays in RTS; counted once per message in
//!   `uc_msg_dropped`) and resynchronizes at the next FIRST or ONLY packet, whatever its PSN.
//!   A receive WQE is consumed only by a message that completes: one left partly filled by a
//!   dropped message is rewound and filled again by the next SEND (rxe `do_class_d1e_error`,
//!   class D1).
//!
//! One deliberate difference from rxe: when a message lost its LAST packet and the next
//! message's FIRST or ONLY packet arrives, rxe drops that packet too (its `check_op_seq` sees a
//! FIRST after a FIRST/MIDDLE, and the class D1 path ends in CLEANUP), so a loss costs two
//! messages there. IBA 9.7.5.1.1 says a FIRST or ONLY packet starts a new message; here it
//! does, and only the message that lost a packet is dropped.
//!
//! UC QPs have no congestion control (transport/cc.rs is RC's) and take no share of the
//! device's in-flight budget: they hold nothing in flight.

use super::responder::Fatal;
use super::*;

/// The UC opcode of the packet at `pos` of a SEND or RDMA WRITE message, with ImmDt on its
/// last packet when `imm` (IBA 9.2 table 38, the UC rows; rxe `next_opcode_uc`). UC has no
/// SEND with invalidate, READ or atomic opcodes: post_send refuses those WRs before this is
/// reached, so any other `kind` is a bug and maps to `UC_SEND_ONLY`.
pub(super) const fn uc_opcode_for(kind: Operation, pos: Position, imm: bool) -> Opcode {
    use Position::*;
    match (kind, pos, imm) {
        (Operation::Send, First, _) => Opcode::UC_SEND_FIRST,
        (Operation::Send, Middle, _) => Opcode::UC_SEND_MIDDLE,
        (Operation::Send, Last, true) => Opcode::UC_SEND_LAST_WITH_IMMEDIATE,
        (Operation::Send, Last, false) => Opcode::UC_SEND_LAST,
        (Operation::Send, Only, true) => Opcode::UC_SEND_ONLY_WITH_IMMEDIATE,
        (Operation::Write, First, _) => Opcode::UC_RDMA_WRITE_FIRST,
        (Operation::Write, Middle, _) => Opcode::UC_RDMA_WRITE_MIDDLE,
        (Operation::Write, Last, true) => Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (Operation::Write, Last, false) => Opcode::UC_RDMA_WRITE_LAST,
        (Operation::Write, Only, true) => Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (Operation::Write, Only, false) => Opcode::UC_RDMA_WRITE_ONLY,
        _ => Opcode::UC_SEND_ONLY,
    }
}

impl Qp {
    /// Checks a send WR posted on a UC QP (rxe's UC column of `rxe_wr_opcode_info`): SEND,
    /// SEND with immediate, RDMA WRITE and RDMA WRITE with immediate only, no UD destination,
    /// at most 2^31 bytes.
    pub(super) fn check_uc_send(wr: &SendWr<Path>, len: u64) -> Result<(), PostError> {
        if wr.ud.is_some() {
            return Err(PostError::Invalid("UC send with a UD destination"));
        }
        if !matches!(
            wr.op,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::Write { .. }
                | SendOp::WriteWithImm { .. }
        ) {
            return Err(PostError::Invalid(
                "UC supports SEND and RDMA WRITE only (no READ, atomics or SEND with invalidate)",
            ));
        }
        if len > MAX_MSG_SIZE {
            return Err(PostError::Invalid("message longer than 2^31 bytes"));
        }
        Ok(())
    }

    /// The next UC request packet: packet `req_pkt` of the WR at the head of the send queue
    /// (UC never has more than that one WR started, so `req_idx` stays 0). The WR completes
    /// when its last packet is returned here (rxe `rxe_xmit_packet`: a non-RC WQE is done once
    /// its END packet is sent). A bad local SGE fails the WR with LOC_PROT_ERR and moves the
    /// QP to ERR, as on RC (rxe `rxe_requester` error path).
    pub(super) fn next_uc_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<OutPkt> {
        let wqe = self.sq.front()?;
        if wqe.first_psn.is_none() && self.state == QpState::Sqd {
            // SQD starts no new WQE.
            self.check_drained(ctx);
            return None;
        }
        let op = wqe.wr.op;
        let psn = self.next_psn;
        let req = self.send_write_request(psn, op, ctx, tx)?;
        if let Some(wqe) = self.sq.front_mut()
            && wqe.first_psn.is_none()
        {
            wqe.first_psn = Some(psn);
        }
        let mut repr = req.repr;
        // No ACKs on UC: AckReq stays clear (rxe init_req_packet sets it for RC only).
        repr.bth.ack_req = false;
        // Nothing is ever outstanding: the oldest unacknowledged PSN is the next one.
        self.next_psn = psn.next();
        self.sent_psn = self.next_psn;
        self.comp_psn = self.next_psn;
        self.counters.sent_pkts += 1;
        if req.last {
            self.complete_head(WcStatus::Success, ctx);
            // In SQD the queue is drained once the WQE in progress has gone out.
            self.check_drained(ctx);
        } else {
            self.req_pkt += 1;
        }
        Some(OutPkt {
            repr,
            payload: req.payload,
            ud_path: None,
        })
    }

    /// Handles a UC request packet (an opcode in 0x20..=0x2b) for this UC QP in RTR, RTS or
    /// SQD, in rxe's order of checks: PSN, opcode sequence, opcode validity (REMOTE_WRITE for
    /// a WRITE), receive WQE, length, then execution (R_Key and the copy). No packet is ever
    /// answered; what fails drops the message (see the module documentation).
    pub(super) fn handle_uc_request(
        &mut self,
        pkt: &RxPkt<'_>,
        info: roce_common::opcode::OpcodeInfo,
        ctx: &mut Ctx<'_>,
    ) {
        let kind = match info.operation {
            Operation::Send => MsgKind::Send,
            Operation::Write => MsgKind::Write,
            _ => {
                // UC defines no other request opcodes (the opcode table has none).
                self.counters.rx_dropped += 1;
                return;
            }
        };
        let psn = pkt.repr.bth.psn;
        let pos = info.position;
        // check_psn (rxe, UC): a packet off the expected PSN, or any packet while a message
        // is being dropped, is dropped unless it starts a message, which resynchronizes.
        if psn != self.resp_psn || self.uc_dropping {
            if psn != self.resp_psn && !self.uc_dropping {
                self.counters.out_of_sequence += 1;
            }
            if !info.starts_message() {
                self.uc_drop_msg();
                return;
            }
            self.uc_dropping = false;
        }
        // check_op_seq (rxe, UC).
        match (self.in_msg, pos) {
            (Some(cur), Position::Middle | Position::Last) if cur == kind => {}
            (None, Position::First | Position::Only) => {}
            (Some(_), Position::First | Position::Only) => {
                // The message in progress never got its LAST (class D1): it is dropped and
                // its receive WQE rewound, and this packet starts the next message.
                self.uc_drop_msg();
                self.uc_dropping = false;
            }
            // A MIDDLE or LAST without its FIRST, or of another kind than the message in
            // progress (class D1/E): drop the message.
            _ => {
                self.uc_drop_msg();
                return;
            }
        }
        // check_op_valid (rxe, UC): a WRITE needs REMOTE_WRITE, else the message is dropped.
        if kind == MsgKind::Write && !self.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            self.uc_drop_msg();
            return;
        }
        // check_resource: SEND (on its first packet) and WRITE with immediate consume a
        // receive WQE; without one the message is dropped (rxe RESPST_ERR_RNR, UC: class D).
        let needs_rwqe = (kind == MsgKind::Send && info.starts_message())
            || (kind == MsgKind::Write && info.immediate);
        if needs_rwqe && self.rq.is_empty() {
            self.counters.out_of_buffer += 1;
            self.uc_drop_msg();
            return;
        }
        // check_length (rxe, the same rules as RC): ONLY <= MTU, FIRST/MIDDLE == MTU,
        // LAST 1..=MTU; a RETH length <= 2^31. Class D on UC: drop the message.
        let mtu = u64::from(self.mtu().bytes());
        let plen = pkt.payload.len() as u64;
        let len_ok = match pos {
            Position::Only => plen <= mtu,
            Position::First | Position::Middle => plen == mtu,
            Position::Last => (1..=mtu).contains(&plen),
        };
        if !len_ok
            || pkt
                .repr
                .reth
                .is_some_and(|r| u64::from(r.dma_len) > MAX_MSG_SIZE)
        {
            self.uc_drop_msg();
            return;
        }
        let done = match kind {
            MsgKind::Send => self.exec_send(pkt, pos, ctx),
            MsgKind::Write => self.exec_write(pkt, pos, ctx),
        };
        match done {
            Ok(()) => self.resp_psn = psn.next(),
            Err(Fatal {
                status: Some(WcStatus::LocProtErr),
                ..
            }) => {
                // A receive WQE whose SGEs do not reach registered memory: class A for every
                // QP type (rxe RESPST_ERR_MALFORMED_WQE), the WQE completes in error and the QP
                // moves to ERR; UC sends no NAK.
                self.counters.resp_cqe_error += 1;
                self.complete_recv_head(WcStatus::LocProtErr, 0, None, false, ctx);
                self.enter_error(ctx);
            }
            // A SEND longer than its receive WQE, an R_Key or range violation, a WRITE whose
            // payload does not match its RETH: class D/E on a UC QP without SRQ, the message
            // is dropped silently (rxe RESPST_ERR_LENGTH and RESPST_ERR_RKEY_VIOLATION).
            Err(_) => self.uc_drop_msg(),
        }
    }

    /// Drops the rest of the UC message in progress: later packets are discarded until a FIRST
    /// or ONLY packet arrives, and a receive WQE partly filled by it is rewound (it stays at the
    /// head of the receive queue, the next SEND fills it from its start). Counted once per
    /// message in `uc_msg_dropped`.
    fn uc_drop_msg(&mut self) {
        if !self.uc_dropping {
            self.counters.uc_msg_dropped += 1;
        }
        self.uc_dropping = true;
        self.in_msg = None;
        self.send_off = 0;
    }
}
