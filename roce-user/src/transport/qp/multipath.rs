//! The multipath extension in the QP (docs/multipath.md; issue 19 step 2), once both QPs
//! agreed in band.
//!
//! Responder ("Placement out of order, completions in order"): every SEND and WRITE packet
//! carries a placement trailer, and the responder places each packet on its own, at its
//! offset, through the per-QP [`Reassembly`]: each byte once, whatever the order or the
//! duplicates, completions in PSN order, and every acknowledgement carries the SACK trailer.
//! Built: SEND (into the receive WQE its send sequence number names), WRITE and WRITE with
//! immediate. READ requests and atomics marked `HOLD` (sent in selective repeat) are held
//! until the cumulative PSN reaches them ([`Reassembly::on_held`]) and then executed by the
//! in-order responder, once; data after one is refused until it has executed. Every
//! response and acknowledgement of a QP with the extension on carries `HOLD` to say so.
//! A READ the requester sent marked `HOLD` and `READ_PLACED` is answered with a placement
//! trailer on every response packet (the READ response flag), sprayed over the QP's
//! entropies, and a range of it asked for again is sent alone; a packet with
//! a trailer of another kind is dropped and counted in `rx_dropped`.
//!
//! Requester ("Selective acknowledgement and selective repeat"): in selective-repeat mode
//! its SEND and WRITE packets carry the trailer, every SACK feeds [`SelectiveRepeat`], only
//! what it declares lost is resent (RACK by transmission count, or every unacknowledged PSN
//! on the local ACK timeout), never what a SACK covered. Towards a peer whose responses
//! carry `HOLD`, READs and atomics stay in the mode, marked `HOLD` (a READ request's PSNs
//! are one entry, `SelectiveRepeat::on_send_span`), nothing new goes past one before it is
//! acknowledged, their READ responses are placed out of order (a bitmap per READ WR), and
//! only a READ's missing responses are requested again; towards any other
//! peer the requester leaves the mode before one, when nothing is outstanding, and enters
//! again after.

use std::collections::{BTreeMap, VecDeque};

use super::responder::Fatal;
use super::*;
use crate::transport::multipath::{
    Arrival, Completion, Entropies, Reassembly, SelectiveRepeat, SrConfig, SrCounters,
};
use crate::wire::multipath::{
    Entropy, MpBthFlags, PlacementFlags, PlacementTrailer, SackTrailer, placement, sack,
};

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
    /// READ requests and atomics held until the expected PSN reaches them
    /// ([`Reassembly::on_held`]), by PSN.
    held: BTreeMap<u32, HeldReq>,
}

/// A READ request or an atomic held by the responder: what it needs to execute it later.
#[derive(Clone, Copy, Debug)]
struct HeldReq {
    repr: RoceRepr,
    ce: bool,
    ip: Option<crate::wire::IpRepr>,
    udp_src_port: u16,
}

impl Qp {
    /// Handles a packet that carries a multipath trailer (the QP agreed to the extension,
    /// [`RxDecision::Trailer`]): a request's placement trailer, or an ACK's SACK trailer.
    /// Call it from the device in place of `handle_request`/`handle_response`, after the
    /// frame, ICRC, P_Key and address checks. A trailer that does not parse, or a packet kind
    /// not built yet, is dropped and counted in `rx_dropped`. `arrival` is the packet's
    /// arrival stamp, for Swift's RTT sample (see `handle_response`).
    pub(crate) fn handle_mp_packet(
        &mut self,
        now: Instant,
        arrival: Instant,
        pkt: &RxPkt<'_>,
        ctx: &mut Ctx<'_>,
    ) {
        let Some(info) = pkt.repr.bth.opcode.info() else {
            self.counters.rx_dropped += 1;
            return;
        };
        if info.operation == Operation::Acknowledge {
            // The bitmap goes to selective repeat; the AETH is cumulative as ever.
            let Ok((data, sack)) = sack::split(pkt.payload) else {
                self.counters.rx_dropped += 1;
                return;
            };
            if matches!(
                pkt.repr.aeth.map(|a| a.syndrome),
                Some(AethSyndrome::Ack { .. })
            ) && self.mp_on_sack(pkt.repr.bth.psn, &sack) > 0
            {
                // Progress beyond a hole: the local ACK timer waits again, so it does not
                // resend what RACK is already resending.
                self.arm_retransmit(now, true);
            }
            let plain = RxPkt {
                payload: data,
                ..*pkt
            };
            self.handle_response(now, arrival, &plain, ctx);
            return;
        }
        if info.is_response() {
            // A READ response with its placement trailer: placed at its offset on its own.
            let Ok((data, t)) = placement::split(pkt.payload) else {
                self.counters.rx_dropped += 1;
                return;
            };
            if info.operation != Operation::ReadResponse {
                self.counters.rx_dropped += 1;
                return;
            }
            let data_pkt = RxPkt {
                payload: data,
                ..*pkt
            };
            self.handle_placed_read_response(now, arrival, &data_pkt, &t, ctx);
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
        self.handle_mp_request(now, &data_pkt, &t, info, ctx);
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
        now: Instant,
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
            // its middle. Its next packet (resent with a trailer by selective repeat) goes
            // through the in-order responder, its trailer set aside; any other is dropped
            // and resent.
            if pkt.repr.bth.psn == self.resp_psn {
                self.handle_request(now, pkt, ctx);
            } else {
                self.counters.rx_dropped += 1;
            }
            return;
        }
        let psn = pkt.repr.bth.psn;
        let mtu = self.mtu().bytes();
        let epsn = self.resp_psn;
        let mp = self.mp_rx.get_or_insert_with(|| {
            Box::new(MpRx {
                reasm: Reassembly::new(epsn, MP_RX_WINDOW, mtu),
                last: BTreeMap::new(),
                held: BTreeMap::new(),
            })
        });
        let ahead = psn.distance(mp.reasm.epsn());
        // The receive WQE a SEND (or a WRITE with immediate's last packet) needs: the one its
        // sequence number names, counted from the receives completed.
        let ends = matches!(info.position, Position::Last | Position::Only);
        let needs_rwqe = want == PlacementFlags::SEND || (info.immediate && ends);
        let wqe_idx = t.ssn.value().wrapping_sub(self.recv_ssn) as usize;
        if ahead >= 0
            && needs_rwqe
            && !self.mp_rwqe_ready(wqe_idx, ahead.unsigned_abs() as usize, ctx)
        {
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
                if ahead > 0 {
                    self.counters.ooo_placed += 1;
                }
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
                if let Err(f) = self.mp_complete(now, ctx) {
                    self.mp_fatal(f, ctx);
                    return;
                }
            }
            Arrival::Duplicate => self.counters.duplicate_request += 1,
            Arrival::BeyondWindow => self.counters.ooo_dropped_window += 1,
            // Behind a held READ request or atomic: resent once it has executed. (`Held`
            // comes only from `on_held`.)
            Arrival::Invalid(_) | Arrival::Held | Arrival::BehindHeld => {
                self.counters.rx_dropped += 1;
            }
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

    /// Whether receive WQE `idx` (0: the next to complete) is there for a packet `ahead`
    /// PSNs beyond the expected one. A QP with its own receive queue has it if it is posted.
    /// A QP on a shared receive queue takes WQEs from the SRQ for its messages in message
    /// order, as far as `idx`, so a SEND that overtook earlier ones is placed too: message `k`
    /// always gets the `k`-th WQE the QP took, as it would in order (rxe takes one when a
    /// message's first packet arrives; here the earlier messages' WQEs are taken with it).
    /// Each message has at least one packet, so a trailer naming a message further ahead
    /// than its packet's PSN is refused, and a peer cannot take more of the SRQ than its
    /// reassembly window holds; WQEs a QP took and never completed are flushed with it, as
    /// rxe flushes the one it holds.
    fn mp_rwqe_ready(&mut self, idx: usize, ahead: usize, ctx: &mut Ctx<'_>) -> bool {
        if idx == 0 {
            return self.fetch_rwqe(ctx);
        }
        if self.srq.is_none() {
            return idx < self.rq.len();
        }
        if idx > ahead {
            return false;
        }
        while self.rq.len() <= idx {
            if !self.take_srq_wqe(ctx) {
                return false;
            }
        }
        true
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
    /// data or invalidated R_Key; a WRITE with immediate completes one with its immediate; a
    /// held READ request or atomic executes now, through the in-order responder at its PSN.
    fn mp_complete(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Fatal> {
        loop {
            let Some(mp) = self.mp_rx.as_deref_mut() else {
                return Ok(());
            };
            let Some(c) = mp.reasm.poll_completion() else {
                self.resp_psn = mp.reasm.epsn();
                return Ok(());
            };
            if c.held {
                let Some(h) = mp.held.remove(&c.first_psn.value()) else {
                    continue;
                };
                let pkt = RxPkt {
                    repr: h.repr,
                    payload: &[],
                    ce: h.ce,
                    ip: h.ip,
                    udp_src_port: h.udp_src_port,
                };
                let Some(info) = h.repr.bth.opcode.info() else {
                    continue;
                };
                // The in-order responder executes it as the expected request: its responses
                // (or a NAK, and the QP's error) go as for any READ or atomic.
                self.resp_psn = c.first_psn;
                self.request_in_order(now, &pkt, info, ctx);
                if self.state == QpState::Err {
                    return Ok(());
                }
                continue;
            }
            let last = mp.last.remove(&c.first_psn.value()).unwrap_or_default();
            self.mp_complete_one(&c, last, ctx)?;
        }
    }

    /// A plain READ request or atomic (`op`) while the reassembly runs, or beyond the
    /// expected PSN with the extension on: held until the expected PSN reaches it, then
    /// executed in order ([`Reassembly::on_held`]; docs/multipath.md). One before the
    /// expected PSN is a duplicate, answered by the in-order responder from its READ/atomic
    /// resources. Returns false, leaving the packet to the in-order responder, for any other
    /// packet, or when nothing is in progress and the packet is the expected one. Call it
    /// first for every plain RC request.
    pub(super) fn mp_hold_request(
        &mut self,
        now: Instant,
        pkt: &RxPkt<'_>,
        op: Operation,
        ctx: &mut Ctx<'_>,
    ) -> bool {
        if !matches!(
            op,
            Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd
        ) || !self.mp.is_on()
            || !MpBthFlags::from_resv7(pkt.repr.bth.resv7).contains(MpBthFlags::HOLD)
        {
            // Only a request its requester sent in selective repeat asks to be held; any
            // other goes in order (a go-back-N requester resends what follows it).
            return false;
        }
        let psn = pkt.repr.bth.psn;
        let Some(info) = pkt.repr.bth.opcode.info() else {
            return false;
        };
        let ahead = match self.mp_rx.as_deref() {
            Some(m) if !m.reasm.is_idle() || psn.distance(m.reasm.epsn()) > 0 => {
                psn.distance(m.reasm.epsn())
            }
            // Nothing in progress: the expected request, a duplicate or a gap are the
            // in-order responder's.
            Some(_) => return false,
            None => {
                let d = psn.distance(self.resp_psn);
                if d <= 0 || self.in_msg.is_some() {
                    return false;
                }
                d
            }
        };
        if ahead < 0 {
            // A duplicate: answered from the resources, in order.
            self.request_in_order(now, pkt, info, ctx);
            return true;
        }
        if !self.state.responder_ready() {
            self.counters.rx_dropped += 1;
            return true;
        }
        let mtu = self.mtu().bytes();
        let epsn = self.resp_psn;
        let psns = match (op, pkt.repr.reth) {
            (Operation::ReadRequest, Some(reth)) => reth.dma_len.div_ceil(mtu).max(1),
            (Operation::ReadRequest, None) => {
                self.counters.rx_dropped += 1;
                return true;
            }
            _ => 1,
        };
        let mp = self.mp_rx.get_or_insert_with(|| {
            Box::new(MpRx {
                reasm: Reassembly::new(epsn, MP_RX_WINDOW, mtu),
                last: BTreeMap::new(),
                held: BTreeMap::new(),
            })
        });
        match mp.reasm.on_held(psn, psns) {
            Arrival::Held => {
                mp.held.insert(
                    psn.value(),
                    HeldReq {
                        repr: pkt.repr,
                        ce: pkt.ce,
                        ip: pkt.ip,
                        udp_src_port: pkt.udp_src_port,
                    },
                );
                if ahead > 0 {
                    self.counters.ooo_placed += 1;
                }
                if let Err(f) = self.mp_complete(now, ctx) {
                    self.mp_fatal(f, ctx);
                    return true;
                }
            }
            Arrival::Duplicate => self.counters.duplicate_request += 1,
            Arrival::BeyondWindow => self.counters.ooo_dropped_window += 1,
            _ => self.counters.rx_dropped += 1,
        }
        if ahead != 0 && self.state != QpState::Err {
            // The SACK shows it held (its PSNs arrived), at once.
            let _ = self.queue_ctrl(AethSyndrome::ACK_UNLIMITED, psn);
        }
        true
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

    /// Whether the responses to READ request `pkt` (about to execute) carry placement
    /// trailers and are sprayed: the extension is on and the requester sent the request in
    /// selective repeat asking for it (marked `HOLD` and `READ_PLACED`), so it places each
    /// response on its own. A READ sent plain, or by an older roce-xdp that marks it `HOLD`
    /// only, is answered plain, in order. Call it when a READ executes.
    pub(super) fn mp_placed_read(&self, pkt: &RxPkt<'_>) -> bool {
        self.qp_type == QpType::Rc
            && self.mp.is_on()
            && MpBthFlags::from_resv7(pkt.repr.bth.resv7)
                .contains(MpBthFlags::HOLD | MpBthFlags::READ_PLACED)
    }

    /// The SACK an ACK of this QP carries, if the responder runs the reassembly: the
    /// cumulative PSN to put in the AETH (newer than or equal to the queued answer's, which
    /// it stands for, IBA 9.7.5.1) and the trailer (docs/multipath.md, "SACK trailer").
    /// Call it when an ACK leaves (`ctrl_pkt`).
    pub(super) fn mp_sack(&self) -> Option<(Psn, SackTrailer)> {
        self.mp_rx.as_deref().map(|m| m.reasm.sack())
    }
}

/// A QP's sending side of the extension, made when it first sprays or places a READ response.
#[derive(Debug, Default)]
pub(super) struct MpSide {
    /// The entropies its sprayed packets take (requests and READ responses).
    paths: Option<Entropies>,
    /// The requester's READ response packets placed out of order: per READ WR, by its first
    /// PSN, a bitmap of its response packets placed (bit i: packet i of the WR). Dropped
    /// when the WR completes (`complete_head`).
    pub(super) rd: BTreeMap<u32, Box<[u64]>>,
    /// The entropies the responder's last [`RESP_ENTROPY_MEMORY`] sprayed READ response
    /// packets took, by PSN, oldest first: a range asked for again names the lost ones.
    resp_sent: VecDeque<(Psn, Entropy)>,
}

/// READ response packets whose entropies the responder remembers (a few windows' worth).
const RESP_ENTROPY_MEMORY: usize = 1024;

/// Response packets of a READ that must arrive after a missing one before the requester asks
/// for the missing one again (RACK's reordering threshold, in PSNs; as selective repeat's 3).
const READ_REORDER_PSNS: i32 = 3;

fn bit(b: &[u64], i: u32) -> bool {
    b.get(i as usize / 64)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

impl Qp {
    /// A READ response packet with placement trailer `t` (`pkt.payload` is its data, the
    /// trailer split off; docs/multipath.md, "Placement out of order"): placed at its offset
    /// in the READ WR its PSN falls in, on its own, once (a bitmap per WR; a packet placed
    /// before is a duplicate, dropped and counted in `rx_dropped`). The trailer must describe
    /// that very packet (its piece's first PSN inside the WR, the offset its PSN gives, the
    /// remote address of its piece, the packet's share of the WR's bytes), else the packet is
    /// dropped: nothing lands outside the WR's SGEs or where another packet's bytes go. The
    /// READ completes once all its packets are placed, in order with the WRs before it; the
    /// response still acknowledges everything before the READ (the responder executed it),
    /// but not past an earlier READ or atomic still waiting for its answer. A response
    /// [`READ_REORDER_PSNS`] past the first missing one of the oldest READ asks for the
    /// missing packets again (`mp_read_loss_check`; the range up to the next packet placed,
    /// `read_request`). Call it from `handle_mp_packet`, with the packet's arrival stamp.
    pub(super) fn handle_placed_read_response(
        &mut self,
        now: Instant,
        arrival: Instant,
        pkt: &RxPkt<'_>,
        t: &PlacementTrailer,
        ctx: &mut Ctx<'_>,
    ) {
        if !self.state.requester_ready() || self.qp_type != QpType::Rc {
            self.counters.rx_dropped += 1;
            return;
        }
        let psn = pkt.repr.bth.psn;
        let mtu = self.mtu().bytes();
        // A response for a PSN never sent is a ghost (rxe check_psn), and a trailer must
        // describe its own packet.
        if psn.distance(self.sent_psn) >= 0
            || t.flags != PlacementFlags::READ_RESPONSE
            || t.check_packet(psn, pkt.payload.len(), mtu).is_err()
        {
            self.counters.rx_dropped += 1;
            return;
        }
        let Some(idx) = self.read_wr_of(psn) else {
            // Its READ completed (or the PSN is no READ's): a late duplicate. The responder is
            // still answering, so the local ACK timer waits again.
            self.counters.rx_dropped += 1;
            self.arm_retransmit(now, true);
            return;
        };
        if !self.read_trailer_ok(idx, psn, t, pkt.payload.len()) {
            self.counters.rx_dropped += 1;
            return;
        }
        let (f, npkts, in_order) = match self.sq.get(idx) {
            Some(w) => (w.first_psn.unwrap_or(psn), w.npkts, w.rcvd_pkts),
            None => return,
        };
        let i = psn.distance(f) as u32;
        // Placed already: in order (before `rcvd_pkts`) or out of order (its bit).
        if i < in_order
            || self
                .mp_side
                .as_deref()
                .and_then(|m| m.rd.get(&f.value()))
                .is_some_and(|b| bit(b, i))
        {
            self.counters.rx_dropped += 1;
            self.arm_retransmit(now, true);
            return;
        }
        self.cc_on_ack(arrival, psn);
        // The responder executed the READ, so everything up to it arrived.
        self.mp_on_cum_ack(psn);
        // Acknowledged: the WRs before the READ, but not past an earlier READ or atomic still
        // waiting (its responses may still be on another path).
        let stop = self
            .sq
            .iter()
            .take(idx)
            .find(|w| w.wr.op.is_read_or_atomic())
            .and_then(|w| w.first_psn)
            .unwrap_or(f);
        if !self.ack_through(now, stop.wrapping_sub(1), ctx) {
            return;
        }
        // The WRs before it may have completed: find it again.
        let Some(idx) = self.read_wr_of(psn) else {
            return;
        };
        let Some(w) = self.sq.get(idx) else {
            return;
        };
        let off = u64::from(i) * u64::from(mtu);
        if sg_scatter(ctx.mrs, self.init.pd, &w.wr.sg_list, off, pkt.payload).is_err() {
            if idx == 0 {
                self.complete_head(WcStatus::LocProtErr, ctx);
                self.enter_error(ctx);
            } else if let Some(w) = self.sq.get_mut(idx) {
                // Reported in order, when the WRs before it completed (`ack_through`).
                w.done = Some(WcStatus::LocProtErr);
            }
            return;
        }
        if i != w.rcvd_pkts {
            self.counters.ooo_placed += 1;
        }
        let words = npkts.div_ceil(64) as usize;
        let b = self
            .mp_side
            .get_or_insert_with(Box::default)
            .rd
            .entry(f.value())
            .or_insert_with(|| vec![0u64; words].into_boxed_slice());
        if let Some(word) = b.get_mut(i as usize / 64) {
            *word |= 1 << (i % 64);
        }
        // Packets in order from the first not yet counted.
        if let Some(w) = self.sq.get_mut(idx) {
            while w.rcvd_pkts < w.npkts && bit(b, w.rcvd_pkts) {
                w.rcvd_pkts += 1;
            }
        }
        self.mp_read_advance(now, ctx);
        self.mp_read_loss_check(now, psn);
    }

    /// Moves the head READ's count of packets received in order over those already placed
    /// out of order after it, and returns how many it moved over (0 when none was placed out
    /// of order, as on any QP without the extension). Call it after a READ response packet
    /// was placed in order (`on_read_response`), so that a packet placed already is never
    /// placed again.
    pub(super) fn mp_read_skip_placed(&mut self) -> u32 {
        let Some(w) = self.sq.front_mut() else {
            return 0;
        };
        let Some(b) = w
            .first_psn
            .and_then(|f| self.mp_side.as_deref()?.rd.get(&f.value()))
        else {
            return 0;
        };
        let from = w.rcvd_pkts;
        while w.rcvd_pkts < w.npkts && bit(b, w.rcvd_pkts) {
            w.rcvd_pkts += 1;
        }
        w.rcvd_pkts - from
    }

    /// The index in the send queue of the READ WR whose responses include `psn`.
    fn read_wr_of(&self, psn: Psn) -> Option<usize> {
        self.sq.iter().position(|w| {
            matches!(w.wr.op, SendOp::Read { .. })
                && w.first_psn
                    .zip(w.last_psn())
                    .is_some_and(|(f, l)| psn.distance(f) >= 0 && psn.distance(l) <= 0)
        })
    }

    /// Whether READ response trailer `t` of packet `psn` (`len` data bytes) describes packet
    /// `psn` of the READ WR at `idx`: its piece starts inside the WR at a packet boundary no
    /// later than the packet, the trailer's offset is the packet's in that piece, the virtual
    /// address is the piece's remote address, the piece ends inside the WR and the data is the
    /// packet's share of the WR's bytes (so a packet lands only where it belongs, inside the
    /// WR's SGEs).
    fn read_trailer_ok(&self, idx: usize, psn: Psn, t: &PlacementTrailer, len: usize) -> bool {
        let Some(w) = self.sq.get(idx) else {
            return false;
        };
        let (SendOp::Read { remote_addr, .. }, Some(f)) = (w.wr.op, w.first_psn) else {
            return false;
        };
        let m = u64::from(self.mtu().bytes());
        let (Ok(piece), Ok(i)) = (
            u32::try_from(t.first_psn.distance(f)),
            u32::try_from(psn.distance(f)),
        ) else {
            return false;
        };
        let start = u64::from(piece) * m;
        let off = u64::from(i) * m;
        let share = (w.len - off.min(w.len)).min(m);
        piece <= i
            && start + u64::from(t.offset) == off
            && t.va == remote_addr.wrapping_add(start)
            && start + u64::from(t.length) <= w.len
            && len as u64 == share
    }

    /// Moves the completer's PSN over the packets of the head READ placed in order, and
    /// completes the READ WRs at the head of the send queue whose response packets are all
    /// placed, in order (`ack_through`). Call it after a READ response packet was placed.
    fn mp_read_advance(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        let Some(w) = self.sq.front() else {
            return;
        };
        let (SendOp::Read { .. }, Some(f), None) = (w.wr.op, w.first_psn, w.done) else {
            return;
        };
        let done = w.rcvd_pkts >= w.npkts;
        let next = f.wrapping_add(w.rcvd_pkts);
        if next.distance(self.comp_psn) <= 0 {
            return;
        }
        self.comp_psn = next;
        if !done {
            self.on_progress(now, ctx);
            return;
        }
        if self.ack_through(now, next.wrapping_sub(1), ctx) {
            self.mp_ack_past_response(now, ctx);
        }
    }

    /// After READ response `psn` was placed: if it is [`READ_REORDER_PSNS`] or more past the
    /// first response missing of the oldest READ, that one is taken as lost and the missing
    /// run from it asked for again (`mp_request_again`; once per PSN, as `retry`'s guard;
    /// counted in `implied_nak_seq_err`). Responses leave the responder in PSN order, so the
    /// later ones overtook it on another path by that much.
    fn mp_read_loss_check(&mut self, now: Instant, psn: Psn) {
        let Some(w) = self.sq.front() else {
            return;
        };
        let (SendOp::Read { .. }, Some(f)) = (w.wr.op, w.first_psn) else {
            return;
        };
        if w.rcvd_pkts >= w.npkts {
            return;
        }
        let missing = f.wrapping_add(w.rcvd_pkts);
        if psn.distance(missing) < READ_REORDER_PSNS || self.retry_guard == Some(missing) {
            return;
        }
        // Only the missing response packets go again: not every PSN selective repeat has
        // unacknowledged (`retry` would resend them all, and each READ request among them
        // would have its whole READ answered again).
        self.retry_guard = Some(missing);
        self.counters.implied_nak_seq_err += 1;
        self.cc_on_retry(now, false, false);
        self.mp_request_again();
    }

    /// The packet of the READ WR at `idx` before which a re-request from packet `from` may
    /// stop: the first one placed after `from` (the requester asks again only for what is
    /// missing), or `end`. Only in selective repeat, where the responder answers a range.
    pub(super) fn mp_read_request_end(&self, idx: usize, from: u32, end: u32) -> u32 {
        if !self.mp_selective() {
            return end;
        }
        let Some(b) = self
            .sq
            .get(idx)
            .and_then(|w| w.first_psn)
            .and_then(|f| self.mp_side.as_deref()?.rd.get(&f.value()))
        else {
            return end;
        };
        (from + 1..end).find(|&i| bit(b, i)).unwrap_or(end)
    }
}

/// Bytes of the placement trailer a request packet carries in selective-repeat mode.
const TRAILER_LEN: usize = placement::HEADER_LEN;

/// Whether a WR of `op` consumes a receive WQE at the responder (SEND, WRITE with
/// immediate): what the send sequence number of a placement trailer counts.
pub(super) const fn consumes_rwqe(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::WriteWithImm { .. }
    )
}

impl Qp {
    /// Enters or leaves the requester's selective-repeat mode (docs/multipath.md,
    /// "Selective acknowledgement and selective repeat"). It enters once the extension is
    /// on, no READ or atomic is outstanding or next, the requester is not replaying after a
    /// go-back or waiting out an RNR NAK, and a frame of `frame_len` bytes holds a full
    /// packet with its trailer: the PSNs already in flight (sent plain) are taken over as
    /// sent `now`, so anything of theirs that is lost is resent with a trailer. It leaves
    /// when the QP fell back, or when nothing is outstanding and the next WR is a READ or an
    /// atomic and the peer does not hold them (no `HOLD` on its responses). Call it before
    /// choosing the next request packet.
    pub(super) fn mp_tx_update(&mut self, now: Instant, frame_len: usize) {
        let next = self
            .sq
            .get(self.req_idx)
            .filter(|w| w.first_psn.is_none())
            .map(|w| w.wr.op);
        let quiet = self.comp_psn == self.sent_psn && self.next_psn == self.sent_psn;
        // A peer that holds READ requests and atomics (`MpBthFlags::HOLD`) takes them in
        // selective repeat; towards one that does not, the requester leaves the mode for them.
        let holds = self.mp.peer_holds();
        if self.mp_tx.is_some() {
            if quiet
                && (!self.mp.is_on() || (!holds && next.is_some_and(|op| op.is_read_or_atomic())))
            {
                self.mp_tx = None;
            }
            return;
        }
        // Not while a READ or atomic sent before is outstanding, either way: its PSNs would be
        // taken over one by one, not as the one request they are.
        let rd_out = self
            .sq
            .iter()
            .take_while(|w| w.first_psn.is_some())
            .any(|w| w.wr.op.is_read_or_atomic());
        let room = crate::transport::max_frame_len(self.mtu()) + TRAILER_LEN <= frame_len;
        if !self.mp.is_on()
            || !room
            || rd_out
            || self.rnr_wait
            || self.next_psn != self.sent_psn
            || (!holds && next.is_some_and(|op| op.is_read_or_atomic()))
        {
            return;
        }
        let rto =
            local_ack_timeout(self.attr.timeout).unwrap_or(core::time::Duration::from_secs(1));
        let cfg = SrConfig {
            window: MP_RX_WINDOW.min(MAX_UNACKED_PSNS),
            reorder_threshold: 3,
            rto,
        };
        let mut sr = SelectiveRepeat::new(self.comp_psn, cfg);
        while sr.next_psn() != self.next_psn && sr.on_send(now).is_some() {}
        self.mp_tx = Some(Box::new(sr));
    }

    /// Whether the requester holds its next new WR back so that the READs and atomics it sent
    /// plain drain and it can enter selective repeat ([`Self::mp_tx_update`] does not take
    /// them over one by one): the extension is on, the peer holds READ requests and atomics
    /// (`HOLD` on its responses, learnt in band), the QP is not in the mode yet and could
    /// enter it (a frame of `frame_len` bytes has room for a trailer, no go-back replay or RNR
    /// wait under way), and a READ or atomic sent plain is outstanding. Without this a QP that
    /// reads without pause is never quiet and never enters the mode. It costs one drain, once
    /// per QP (the mode is left only on a fallback). Call it before starting a new WR.
    pub(super) fn mp_drain_to_enter(&self, frame_len: usize) -> bool {
        if self.mp_tx.is_some()
            || !self.mp.peer_holds()
            || self.rnr_wait
            || self.next_psn != self.sent_psn
            || crate::transport::max_frame_len(self.mtu()) + TRAILER_LEN > frame_len
        {
            return false;
        }
        let fresh = self
            .sq
            .get(self.req_idx)
            .is_some_and(|w| w.first_psn.is_none());
        fresh
            && self
                .sq
                .iter()
                .take_while(|w| w.first_psn.is_some())
                .any(|w| w.wr.op.is_read_or_atomic())
    }

    /// The UDP source port for request packet `psn`, about to leave at `now` with its
    /// placement trailer: the QP's next entropy in turn (another one than the packet's last,
    /// for a resend), or `None` when the QP does not spray (one entropy configured, not in
    /// selective repeat, or `psn` not in its window). The entropies of packets lost since are
    /// retired and replaced first (docs/multipath.md, "Spraying"). Call it for every request
    /// packet with a trailer, just before its frame is written.
    pub(crate) fn mp_spray(&mut self, now: Instant, psn: Psn) -> Option<u16> {
        if self.mp_entropies.count <= 1 || !self.mp_tx.as_deref()?.in_window(psn) {
            return None;
        }
        let seed = (u64::from(self.qpn.value()) << 24) | u64::from(psn.value());
        let (cfg, sr) = (self.mp_entropies, self.mp_tx.as_deref_mut()?);
        let paths = self
            .mp_side
            .get_or_insert_with(Box::default)
            .paths
            .get_or_insert_with(|| Entropies::new(seed, cfg, now));
        let retired = paths.counters().retired;
        for e in sr.lost_entropies() {
            paths.on_bad(e, now);
        }
        self.counters.entropy_retired += paths.counters().retired - retired;
        let e = paths.next(now, sr.entropy_of(psn));
        sr.set_entropy(psn, e);
        Some(e.port())
    }

    /// The UDP source port for READ response packet `psn` with its placement trailer, about
    /// to leave at `now`: the QP's next entropy in turn, or `None` with one entropy
    /// configured. The entropy is remembered for the PSN: the responder learns of a lost
    /// response only when its requester asks for it again ([`Self::mp_responses_lost`]), or
    /// from CNP path feedback ([`Self::mp_on_marked`]). Call it for every READ response
    /// packet with a trailer, just before its frame is written.
    pub(crate) fn mp_spray_response(&mut self, now: Instant, psn: Psn) -> Option<u16> {
        if self.mp_entropies.count <= 1 {
            return None;
        }
        let seed = (u64::from(self.qpn.value()) << 24) | u64::from(psn.value());
        let cfg = self.mp_entropies;
        let side = self.mp_side.get_or_insert_with(Box::default);
        let e = side
            .paths
            .get_or_insert_with(|| Entropies::new(seed, cfg, now))
            .next(now, None);
        if side.resp_sent.len() >= RESP_ENTROPY_MEMORY {
            side.resp_sent.pop_front();
        }
        side.resp_sent.push_back((psn, e));
        Some(e.port())
    }

    /// The requester asked again for READ response packets `from..=to` (placed responses):
    /// they were lost, or overtaken by that much, so the entropies they took are retired and
    /// replaced (as a lost request's are, docs/multipath.md "Spraying"), counted in
    /// `entropy_retired`. Call it when such a range is accepted, before it is sent again.
    pub(super) fn mp_responses_lost(&mut self, from: Psn, to: Psn, now: Instant) {
        let Some(side) = self.mp_side.as_deref_mut() else {
            return;
        };
        let Some(paths) = side.paths.as_mut() else {
            return;
        };
        let retired = paths.counters().retired;
        for &(psn, e) in &side.resp_sent {
            if psn.distance(from) >= 0 && psn.distance(to) <= 0 {
                paths.on_bad(e, now);
            }
        }
        self.counters.entropy_retired += paths.counters().retired - retired;
    }

    /// A CNP of the peer named entropy `e` as the one its marked packet came on: `e` is
    /// retired and replaced, as after a loss, so the QP's traffic moves off the marked path
    /// while DCQCN cuts its rate. Call it for every CNP with path feedback.
    pub(crate) fn mp_on_marked(&mut self, e: Entropy, now: Instant) {
        if let Some(paths) = self.mp_side.as_deref_mut().and_then(|m| m.paths.as_mut()) {
            let retired = paths.counters().retired;
            paths.on_bad(e, now);
            self.counters.entropy_retired += paths.counters().retired - retired;
        }
    }

    /// Whether the requester is in selective-repeat mode: its request packets carry
    /// placement trailers and only what is missing is resent.
    pub(super) fn mp_selective(&self) -> bool {
        self.mp_tx.is_some()
    }

    /// Whether selective repeat lets a new PSN `psn` go now: its window has room (a PSN
    /// before its next one is a resend after an RNR wait, which may go).
    pub(super) fn mp_window_open(&self, psn: Psn) -> bool {
        self.mp_tx
            .as_deref()
            .is_none_or(|sr| psn != sr.next_psn() || sr.can_send())
    }

    /// Records the first transmission of `psn` at `now` in selective repeat, a request that
    /// takes `psns` PSNs (a READ request's responses) as one. Call it when a request packet is
    /// committed; `op` is its WR's.
    pub(super) fn mp_on_sent(&mut self, now: Instant, psn: Psn, psns: u32, op: SendOp) {
        if let Some(sr) = self.mp_tx.as_deref_mut()
            && psn == sr.next_psn()
        {
            let _ = sr.on_send_span(now, psns);
            if op.is_read_or_atomic() {
                sr.set_held_request(psn);
            }
        }
    }

    /// Whether a new PSN may go in selective repeat: not while the last READ request or
    /// atomic sent is unacknowledged (the responder holds it and refuses data after it until
    /// it executes; data after it that arrived before it would be seen by it,
    /// `Reassembly::on_held`). Call it before a new request packet.
    pub(super) fn mp_past_request_ok(&self) -> bool {
        self.mp_tx
            .as_deref()
            .is_none_or(SelectiveRepeat::past_held_ok)
    }

    /// In selective repeat, on an implied NAK or the local ACK timeout: if the oldest WR is a
    /// READ or an atomic whose responses are missing, it is requested again from the first
    /// missing response (selective repeat resends only what no ACK covered, and the
    /// responder acknowledged the request itself when it held it). The responder answers a
    /// request it executed from its resources, as a duplicate. Call it from `retry`.
    pub(super) fn mp_request_again(&mut self) {
        if let Some(w) = self.sq.front()
            && w.wr.op.is_read_or_atomic()
            && let Some(f) = w.first_psn
            && let Some(sr) = self.mp_tx.as_deref_mut()
        {
            sr.request_again(f.wrapping_add(w.rcvd_pkts));
        }
    }

    /// The send sequence number of the WR at `idx` of the send queue: the WRs that consume
    /// a receive WQE completed before it plus those ahead of it in the queue.
    fn ssn_of(&self, idx: usize) -> u32 {
        let ahead = self
            .sq
            .iter()
            .take(idx)
            .filter(|w| consumes_rwqe(&w.wr.op))
            .count() as u32;
        self.send_ssn.wrapping_add(ahead)
    }

    /// The placement trailer of packet `psn`, at byte `off` of the WR at `idx` doing `op`, in
    /// selective-repeat mode (else `None`). Call it while building a SEND or WRITE packet.
    pub(super) fn mp_trailer(
        &self,
        idx: usize,
        psn: Psn,
        op: SendOp,
        off: u64,
    ) -> Option<PlacementTrailer> {
        self.mp_tx.as_ref()?;
        let w = self.sq.get(idx)?;
        let (flags, va, rkey) = match op {
            SendOp::Write { remote_addr, rkey }
            | SendOp::WriteWithImm {
                remote_addr, rkey, ..
            } => (PlacementFlags::WRITE, remote_addr, rkey),
            _ => (PlacementFlags::SEND, 0, RKey::new(0)),
        };
        Some(PlacementTrailer {
            first_psn: w.first_psn.unwrap_or(psn),
            flags,
            offset: u32::try_from(off).ok()?,
            length: u32::try_from(w.len).ok()?,
            va,
            rkey,
            ssn: crate::wire::multipath::Ssn::new(self.ssn_of(idx)),
        })
    }

    /// The next packet selective repeat resends, rebuilt from its WR with its trailer and
    /// AckReq set, or `None`. Call it before building new request packets. The requester's
    /// position, `next_psn` and `sent_psn` do not move.
    pub(super) fn mp_resend(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<OutPkt> {
        loop {
            let psn = self.mp_tx.as_deref_mut()?.poll_retransmit(now)?;
            let Some((idx, pkt)) = self.sq.iter().enumerate().find_map(|(i, w)| {
                let (f, l) = (w.first_psn?, w.last_psn()?);
                (psn.distance(f) >= 0 && psn.distance(l) <= 0).then(|| (i, psn.distance(f) as u32))
            }) else {
                continue; // completed since
            };
            let op = self.sq.get(idx)?.wr.op;
            let saved = (self.req_idx, self.req_pkt);
            (self.req_idx, self.req_pkt) = (idx, pkt);
            let req = self.request_for(psn, op, ctx, tx);
            if self.state != QpState::Err {
                (self.req_idx, self.req_pkt) = saved;
            }
            let mut req = req?;
            req.repr.bth.ack_req = true;
            self.counters.sent_pkts += 1;
            self.counters.selective_retransmits += 1;
            self.arm_retransmit(now, false);
            return Some(OutPkt {
                repr: req.repr,
                payload: req.payload,
                ud_path: None,
            });
        }
    }

    /// Takes in the SACK of an ACK for `cum` in selective-repeat mode. Call it for every ACK
    /// with a SACK trailer, before the cumulative part is applied.
    /// Returns the PSNs newly acknowledged.
    fn mp_on_sack(&mut self, cum: Psn, sack: &SackTrailer) -> u32 {
        self.counters.sack_received += 1;
        self.mp_tx
            .as_deref_mut()
            .map_or(0, |sr| sr.on_ack(cum, Some(sack)))
    }

    /// Takes in the cumulative part of any ACK or NAK (everything up to and including
    /// `cum` arrived) in selective-repeat mode, so the window moves on plain answers too
    /// (those of a responder still finishing a plain message in order). Call it for every
    /// acknowledgement the completer accepts.
    pub(super) fn mp_on_cum_ack(&mut self, cum: Psn) {
        if let Some(sr) = self.mp_tx.as_deref_mut() {
            let _ = sr.on_ack(cum, None);
        }
    }

    /// The last PSN selective repeat holds acknowledged cumulatively, in selective-repeat
    /// mode: everything before its oldest unacknowledged PSN.
    pub(super) fn mp_acked_through(&self) -> Option<Psn> {
        self.mp_tx.as_deref().map(|sr| sr.base().wrapping_sub(1))
    }

    /// On the local ACK timeout in selective-repeat mode: every unacknowledged PSN is resent,
    /// none the SACKs covered (where go-back-N resends the window). Returns false outside
    /// the mode, where the caller goes back N.
    pub(super) fn mp_on_timeout(&mut self) -> bool {
        let Some(sr) = self.mp_tx.as_deref_mut() else {
            return false;
        };
        sr.declare_all_lost();
        true
    }

    /// What selective repeat counted, in selective-repeat mode.
    #[must_use]
    pub fn selective_repeat(&self) -> Option<SrCounters> {
        self.mp_tx.as_deref().map(|sr| *sr.counters())
    }
}
