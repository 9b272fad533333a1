//! The responder's side of the multipath extension (docs/multipath.md, "Placement out of
//! order, completions in order"; issue 19 step 2): once both QPs agreed, every SEND and WRITE
//! packet carries a placement trailer, and the responder places each packet on its own, at
//! its offset, through the per-QP [`Reassembly`]: each byte once, whatever the order or the
//! duplicates, completions in PSN order, and every acknowledgement carries the SACK trailer.
//!
//! Built so far: SEND (into the receive WQE its send sequence number names), WRITE and
//! WRITE with immediate. Not yet: READ requests and atomics with a trailer (they must be held
//! until the cumulative PSN reaches them) and READ responses with a trailer; such packets are
//! dropped and counted in `rx_dropped`. The requester does not send trailers yet (it keeps
//! [`super::Negotiation::tx_flags`]`(false)`), so this path runs only on packets a test
//! crafts until the requester side lands.

use std::collections::BTreeMap;

use super::responder::Fatal;
use super::*;
use crate::transport::multipath::{Arrival, Completion, Reassembly};
use crate::wire::multipath::{PlacementFlags, PlacementTrailer, SackTrailer, placement, sack};

/// The receive window of the reassembly, in PSNs: the requester's window never exceeds it
/// (rxe's [`MAX_UNACKED_PSNS`]).
pub const MP_RX_WINDOW: u32 = MAX_UNACKED_PSNS;

/// What a message needs at its completion that only its last packet carries: immediate
/// data, the R_Key to invalidate, the solicited bit.
#[derive(Clone, Copy, Debug, Default)]
struct LastPkt {
    imm: Option<u32>,
    inv: Option<RKey>,
    solicited: bool,
}

/// The responder's multipath state of one QP, made when the first packet with a placement
/// trailer arrives (the extension is on).
#[derive(Debug)]
pub(super) struct MpRx {
    reasm: Reassembly,
    /// What the last packets of messages not yet completed carried, by the message's first
    /// PSN.
    last: BTreeMap<u32, LastPkt>,
}

impl Qp {
    /// Handles a packet that carries a multipath trailer (the QP agreed to the extension,
    /// [`RxDecision::Trailer`]): a request's placement trailer, or an ACK's SACK trailer.
    /// Call it from the device in place of `handle_request`/`handle_response`, after the
    /// frame, ICRC, P_Key and address checks. A trailer that does not parse, or a packet kind
    /// not built yet, is dropped and counted in `rx_dropped`.
    pub(crate) fn handle_mp_packet(&mut self, now: Instant, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) {
        let Some(info) = pkt.repr.bth.opcode.info() else {
            self.counters.rx_dropped += 1;
            return;
        };
        if info.operation == Operation::Acknowledge {
            // The AETH is cumulative as ever; the bitmap is for selective repeat, which the
            // requester does not run yet (docs/multipath.md, step 2 status).
            let Ok((data, _sack)) = sack::split(pkt.payload) else {
                self.counters.rx_dropped += 1;
                return;
            };
            let plain = RxPkt {
                payload: data,
                ..*pkt
            };
            self.handle_response(now, &plain, ctx);
            return;
        }
        if info.is_response() {
            self.counters.rx_dropped += 1;
            return;
        }
        let Ok((data, t)) = placement::split(pkt.payload) else {
            self.counters.rx_dropped += 1;
            return;
        };
        let data_pkt = RxPkt {
            payload: data,
            ..*pkt
        };
        self.handle_mp_request(&data_pkt, &t, info, ctx);
    }

    /// Places one SEND or WRITE packet with placement trailer `t` out of order (`pkt.payload`
    /// is its data, the trailer already split off), completes what became complete, in PSN
    /// order, and queues the acknowledgement with its SACK: at once when the packet is not the
    /// expected one (a hole, a duplicate, beyond the window) or fills a hole, else when it
    /// asks for one.
    /// The checks of the in-order responder hold per packet: the QP's remote access flags,
    /// the R_Key and bounds of the packet's own range (rxe `check_rkey`), a receive WQE for
    /// the message (else RNR NAK if the packet is the expected one, a silent drop beyond a
    /// hole, since an RNR NAK would acknowledge the hole), the receive buffer's length.
    fn handle_mp_request(
        &mut self,
        pkt: &RxPkt<'_>,
        t: &PlacementTrailer,
        info: roce_common::opcode::OpcodeInfo,
        ctx: &mut Ctx<'_>,
    ) {
        if !self.state.responder_ready() || self.qp_type != QpType::Rc {
            self.counters.rx_dropped += 1;
            return;
        }
        let want = match info.operation {
            Operation::Send => PlacementFlags::SEND,
            Operation::Write => PlacementFlags::WRITE,
            // READ requests and atomics with a trailer: not built yet.
            _ => {
                self.counters.rx_dropped += 1;
                return;
            }
        };
        if t.flags != want || !self.position_matches(info.position, t, pkt.payload.len()) {
            self.counters.rx_dropped += 1;
            return;
        }
        if self.mp_rx.is_none() && self.in_msg.is_some() {
            // A plain message is half received in order: the reassembly cannot take over in
            // its middle. Dropped; the requester resends the packet.
            self.counters.rx_dropped += 1;
            return;
        }
        let psn = pkt.repr.bth.psn;
        let mtu = self.mtu().bytes();
        let epsn = self.resp_psn;
        let mp = self.mp_rx.get_or_insert_with(|| {
            Box::new(MpRx {
                reasm: Reassembly::new(epsn, MP_RX_WINDOW, mtu),
                last: BTreeMap::new(),
            })
        });
        let ahead = psn.distance(mp.reasm.epsn());
        // The receive WQE a SEND (or a WRITE with immediate's last packet) needs: the one its
        // sequence number names, counted from the receives completed.
        let ends = matches!(info.position, Position::Last | Position::Only);
        let needs_rwqe = want == PlacementFlags::SEND || (info.immediate && ends);
        let wqe_idx = t.ssn.value().wrapping_sub(self.recv_ssn) as usize;
        if ahead >= 0 && needs_rwqe && !self.mp_rwqe_ready(wqe_idx, ctx) {
            self.counters.out_of_buffer += 1;
            if ahead == 0 {
                let timer = RnrTimer::new(self.attr.min_rnr_timer);
                let sent = self.queue_ctrl(AethSyndrome::RnrNak { timer }, psn);
                self.counters.send_rnr_err += u64::from(sent);
            } else {
                self.counters.rx_dropped += 1;
            }
            return;
        }
        if self.state == QpState::Rtr && !self.comm_est {
            // IBA 11.6.3: the first valid request in RTR establishes the connection.
            self.comm_est = true;
            ctx.event(Event::CommEstablished { qpn: self.qpn });
        }
        let Some(mp) = self.mp_rx.as_deref_mut() else {
            return;
        };
        let filled_hole = mp.reasm.held() > 0;
        match mp.reasm.on_packet(psn, t, pkt.payload.len()) {
            Arrival::Place { offset, .. } => {
                if ends {
                    mp.last.insert(
                        t.first_psn.value(),
                        LastPkt {
                            imm: pkt.repr.immdt.map(|i| i.imm),
                            inv: pkt.repr.ieth.map(|i| i.rkey),
                            solicited: pkt.repr.bth.solicited,
                        },
                    );
                }
                if let Err(f) = self.mp_place(pkt, t, offset, wqe_idx, ctx) {
                    self.mp_fatal(f, ctx);
                    return;
                }
                if let Err(f) = self.mp_complete(ctx) {
                    self.mp_fatal(f, ctx);
                    return;
                }
            }
            Arrival::Duplicate => self.counters.duplicate_request += 1,
            Arrival::BeyondWindow => {
                self.counters.out_of_seq_request += 1;
                self.counters.out_of_sequence += 1;
            }
            Arrival::Invalid(_) => self.counters.rx_dropped += 1,
        }
        // At once on a hole, a duplicate or a packet beyond the window, and when a packet
        // fills a hole (the packets behind it, and their AckReq, were acknowledged only
        // selectively); else as the requester asks.
        if ahead != 0 || filled_hole || pkt.repr.bth.ack_req {
            // The PSN and the SACK are taken when the ACK leaves (`ctrl_pkt`).
            let _ = self.queue_ctrl(AethSyndrome::ACK_UNLIMITED, psn);
        }
    }

    /// Whether the opcode's position agrees with the trailer: FIRST and ONLY at offset 0,
    /// LAST and ONLY ending the message, FIRST and MIDDLE not ending it (IBA 9.2's opcode
    /// sequence, which the out-of-order responder can only check per packet).
    fn position_matches(&self, pos: Position, t: &PlacementTrailer, len: usize) -> bool {
        let starts = t.offset == 0;
        let ends = u64::from(t.offset) + len as u64 == u64::from(t.length);
        match pos {
            Position::Only => starts && ends,
            Position::First => starts && !ends,
            Position::Middle => !starts && !ends,
            Position::Last => !starts && ends,
        }
    }

    /// Whether receive WQE `idx` (0: the next to complete) is posted; with a shared receive
    /// queue only the next one can be taken (the QP holds one WQE of an SRQ at a time).
    fn mp_rwqe_ready(&mut self, idx: usize, ctx: &mut Ctx<'_>) -> bool {
        if idx == 0 {
            return self.fetch_rwqe(ctx);
        }
        idx < self.rq.len()
    }

    /// Writes the packet's data where it belongs: a WRITE's at `va + offset` under its R_Key
    /// (checked for this packet's range; a first packet's RETH must agree with the trailer),
    /// a SEND's at `offset` of receive WQE `wqe_idx`'s scatter list.
    fn mp_place(
        &mut self,
        pkt: &RxPkt<'_>,
        t: &PlacementTrailer,
        offset: u32,
        wqe_idx: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Fatal> {
        let inv = |status| Fatal {
            nak: NakCode::InvalidRequest,
            status,
        };
        if t.flags == PlacementFlags::WRITE {
            if !self.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
                return Err(inv(None));
            }
            if let Some(reth) = pkt.repr.reth
                && (reth.va != t.va || reth.rkey != t.rkey || reth.dma_len != t.length)
            {
                return Err(inv(None));
            }
            if offset == 0 {
                self.counters.rx_write_requests += 1;
            }
            if pkt.payload.is_empty() {
                return Ok(());
            }
            let va = t.va.wrapping_add(u64::from(offset));
            let r = ctx.mrs.remote_write(
                self.init.pd,
                self.qpn,
                t.rkey,
                va,
                pkt.payload,
                Access::REMOTE_WRITE,
            );
            if r.is_err() {
                self.counters.resp_remote_access_errors += 1;
                return Err(Fatal {
                    nak: NakCode::RemoteAccessError,
                    status: None,
                });
            }
            return Ok(());
        }
        let Some(rwqe) = self.rq.get(wqe_idx) else {
            return Err(Fatal {
                nak: NakCode::RemoteOperationalError,
                status: None,
            });
        };
        if u64::from(t.length) > sg_len(&rwqe.sg_list) {
            self.counters.resp_local_length_error += 1;
            return Err(inv(Some(WcStatus::LocLenErr)));
        }
        let r = sg_scatter(
            ctx.mrs,
            self.init.pd,
            &rwqe.sg_list,
            u64::from(offset),
            pkt.payload,
        );
        if r.is_err() {
            return Err(Fatal {
                nak: NakCode::RemoteOperationalError,
                status: Some(WcStatus::LocProtErr),
            });
        }
        Ok(())
    }

    /// Completes the messages the reassembly finished, in PSN order: the MSN counts each
    /// (IBA 9.7.5.1.3); a SEND completes the next receive WQE with its length, immediate
    /// data or invalidated R_Key; a WRITE with immediate completes one with its immediate.
    fn mp_complete(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Fatal> {
        loop {
            let Some(mp) = self.mp_rx.as_deref_mut() else {
                return Ok(());
            };
            let Some(c) = mp.reasm.poll_completion() else {
                self.resp_psn = mp.reasm.epsn();
                return Ok(());
            };
            let last = mp.last.remove(&c.first_psn.value()).unwrap_or_default();
            self.mp_complete_one(&c, last, ctx)?;
        }
    }

    fn mp_complete_one(
        &mut self,
        c: &Completion,
        last: LastPkt,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Fatal> {
        self.msn = self.msn.wrapping_add(1);
        let len = u64::from(c.length);
        if c.flags == PlacementFlags::SEND {
            if let Some(rkey) = last.inv
                && !ctx.mrs.invalidate_rkey(self.init.pd, rkey)
            {
                return Err(Fatal {
                    nak: NakCode::InvalidRequest,
                    status: Some(WcStatus::RemInvReqErr),
                });
            }
            self.recv_ssn = self.recv_ssn.wrapping_add(1);
            let extra = (WcOpcode::Recv, last.imm, last.inv);
            self.complete_recv_head(WcStatus::Success, len, Some(extra), last.solicited, ctx);
        } else if let Some(imm) = last.imm {
            self.recv_ssn = self.recv_ssn.wrapping_add(1);
            let extra = (WcOpcode::RecvRdmaWithImm, Some(imm), None);
            self.complete_recv_head(WcStatus::Success, len, Some(extra), last.solicited, ctx);
        }
        Ok(())
    }

    /// A class C error out of order (IBA 9.9.3.1.3): NAK, complete the receive WR in use if
    /// any, QP to ERR. The NAK names the expected PSN, not the failed packet's: a NAK
    /// acknowledges every PSN before it, and the holes before the failed packet did not
    /// arrive. So the requester reports the error on its oldest unacknowledged WR and flushes
    /// the rest; no WR whose data was lost is reported as a success.
    fn mp_fatal(&mut self, f: Fatal, ctx: &mut Ctx<'_>) {
        if let Some(status) = f.status {
            self.complete_recv_head(status, 0, None, false, ctx);
        }
        self.counters.resp_cqe_error += u64::from(f.status.is_some());
        self.counters.resp_invalid_request += u64::from(f.nak == NakCode::InvalidRequest);
        let epsn = self
            .mp_rx
            .as_deref()
            .map_or(self.resp_psn, |m| m.reasm.epsn());
        let _ = self.queue_ctrl(AethSyndrome::Nak(f.nak), epsn);
        self.enter_error(ctx);
    }

    /// Whether the in-order responder may handle a plain request (no trailer) now. Call it
    /// first for every plain RC request. Yes when the reassembly never ran, or when it is
    /// idle ([`Reassembly::is_idle`]), which hands the receive side back (the expected PSN,
    /// MSN and receive WQEs are in step, no message is open); otherwise the plain packet is
    /// dropped and counted in `rx_dropped` (the requester resends it), so the two paths never
    /// place into the same message.
    pub(super) fn mp_plain_request_ok(&mut self) -> bool {
        match self.mp_rx.as_deref() {
            None => true,
            Some(m) if m.reasm.is_idle() => {
                self.resp_psn = m.reasm.epsn();
                self.mp_rx = None;
                true
            }
            Some(_) => {
                self.counters.rx_dropped += 1;
                false
            }
        }
    }

    /// The SACK an ACK of this QP carries, if the responder runs the reassembly: the
    /// cumulative PSN to put in the AETH (newer than or equal to the queued answer's, which
    /// it stands for, IBA 9.7.5.1) and the trailer (docs/multipath.md, "SACK trailer").
    /// Call it when an ACK leaves (`ctrl_pkt`).
    pub(super) fn mp_sack(&self) -> Option<(Psn, SackTrailer)> {
        self.mp_rx.as_deref().map(|m| m.reasm.sack())
    }
}
