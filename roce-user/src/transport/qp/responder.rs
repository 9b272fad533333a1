//! The responder: checks and executes incoming requests and queues the answers (rxe_resp.c;
//! reference §2). The checks run in rxe's order: PSN, opcode sequence, opcode validity,
//! resources, length, R_Key, then execution and acknowledgement.

use super::*;
use crate::wire::multipath::{PlacementFlags, PlacementTrailer, Ssn};

/// An error class C outcome (IBA 9.9.3.1.3): NAK, complete the receive WR in use with
/// `status` if there is one, and move the QP to ERR.
pub(super) struct Fatal {
    pub(super) nak: NakCode,
    pub(super) status: Option<WcStatus>,
}

impl Qp {
    /// Handles a request packet (SEND, WRITE, READ request, atomic) for this QP, received at
    /// `now`.
    pub(crate) fn handle_request(&mut self, now: Instant, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) {
        if !self.state.responder_ready() {
            self.counters.rx_dropped += 1;
            return;
        }
        let Some(info) = pkt.repr.bth.opcode.info() else {
            self.counters.rx_dropped += 1;
            return;
        };
        match (self.qp_type, pkt.repr.bth.opcode.transport()) {
            (QpType::Ud, Transport::Ud) => return self.handle_ud_request(pkt, ctx),
            (QpType::Rc, Transport::Rc) => {}
            (QpType::Uc, Transport::Uc) => return self.handle_uc_request(pkt, info, ctx),
            // rxe_recv.c: the opcode's transport must match the QP type.
            _ => {
                self.counters.rx_dropped += 1;
                return;
            }
        }
        if self.mp_hold_request(now, pkt, info.operation, ctx) {
            return;
        }
        if !self.mp_plain_request_ok() {
            return;
        }
        self.request_in_order(now, pkt, info, ctx);
    }

    /// The in-order responder (rxe_resp.c): the PSN check, then the request executed, or a
    /// duplicate answered, or one NAK per gap. Call it for an RC request once the QP's type
    /// and the multipath extension's paths have had their say ([`Self::handle_request`]).
    pub(super) fn request_in_order(
        &mut self,
        now: Instant,
        pkt: &RxPkt<'_>,
        info: roce_common::opcode::OpcodeInfo,
        ctx: &mut Ctx<'_>,
    ) {
        let psn = pkt.repr.bth.psn;
        // check_psn (rxe): ahead -> one NAK per gap; behind -> duplicate.
        let d = psn.distance(self.resp_psn);
        if d > 0 {
            self.counters.out_of_seq_request += 1;
            self.counters.out_of_sequence += 1;
            if !self.sent_psn_nak {
                // Recorded only if the NAK will go out (see `queue_ctrl`).
                self.sent_psn_nak =
                    self.queue_ctrl(AethSyndrome::Nak(NakCode::PsnSequenceError), self.resp_psn);
            }
            return;
        }
        if d < 0 {
            self.counters.duplicate_request += 1;
            self.duplicate_request(now, pkt, info.operation);
            return;
        }
        self.sent_psn_nak = false;
        if self.state == QpState::Rtr && !self.comm_est {
            // IBA 11.6.3: the first valid request in RTR establishes the connection.
            self.comm_est = true;
            ctx.event(Event::CommEstablished { qpn: self.qpn });
        }
        match self.execute(pkt, ctx) {
            Ok(()) => {}
            Err(Fatal { nak, status }) => {
                if let Some(status) = status {
                    self.complete_recv_head(status, 0, None, false, ctx);
                }
                self.counters.resp_cqe_error += u64::from(status.is_some());
                self.counters.resp_invalid_request += u64::from(nak == NakCode::InvalidRequest);
                // Class C: the QP goes to ERR whether or not the NAK could be queued (it always
                // can: its PSN is the expected one, at or after every queued answer). Without
                // it the requester learns of the error by its retries running out.
                let _ = self.queue_ctrl(AethSyndrome::Nak(nak), psn);
                self.enter_error(ctx);
            }
        }
    }

    pub(super) fn complete_recv_head(
        &mut self,
        status: WcStatus,
        byte_len: u64,
        extra: Option<(WcOpcode, Option<u32>, Option<RKey>)>,
        solicited: bool,
        ctx: &mut Ctx<'_>,
    ) {
        let Some(r) = self.rq.pop_front() else {
            return;
        };
        if status == WcStatus::Success {
            // rxe counts each successful receive completion (rxe_resp.c do_complete).
            self.counters.rdma_recvs += 1;
        }
        let (opcode, imm, inv) = extra.unwrap_or((WcOpcode::Recv, None, None));
        let mut flags = WcFlags::default();
        if imm.is_some() {
            flags |= WcFlags::WITH_IMM;
        }
        if inv.is_some() {
            flags |= WcFlags::WITH_INV;
        }
        let wc = Wc {
            wr_id: r.wr_id,
            status,
            opcode,
            byte_len: u32::try_from(byte_len).unwrap_or(u32::MAX),
            imm: imm.unwrap_or(0),
            invalidated_rkey: inv.unwrap_or_default(),
            qp_num: self.qpn,
            src_qp: self.attr.dest_qp_num,
            wc_flags: flags,
        };
        if !self.push_wc(self.init.recv_cq, wc, solicited, ctx) {
            self.enter_error(ctx);
        }
    }

    fn execute(&mut self, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) -> Result<(), Fatal> {
        let bth = &pkt.repr.bth;
        let info = bth.opcode.info().ok_or(Fatal {
            nak: NakCode::InvalidRequest,
            status: None,
        })?;
        let inv = |status| Fatal {
            nak: NakCode::InvalidRequest,
            status,
        };
        let psn = bth.psn;
        let mtu = u64::from(self.mtu().bytes());
        let plen = pkt.payload.len() as u64;

        // check_op_seq: after FIRST/MIDDLE only MIDDLE/LAST of the same kind.
        let kind = match info.operation {
            Operation::Send => Some(MsgKind::Send),
            Operation::Write => Some(MsgKind::Write),
            _ => None,
        };
        match (self.in_msg, info.position) {
            (Some(cur), Position::Middle | Position::Last) if Some(cur) == kind => {}
            (None, Position::First | Position::Only) => {}
            _ => {
                let st = (self.in_msg == Some(MsgKind::Send)).then_some(WcStatus::RemInvReqErr);
                return Err(inv(st));
            }
        }

        // check_op_valid: the QP's remote access flags, and opcodes roce-xdp executes.
        let acc = self.attr.qp_access_flags;
        match info.operation {
            Operation::Send => {}
            Operation::Write if acc.contains(Access::REMOTE_WRITE) => {}
            Operation::ReadRequest if acc.contains(Access::REMOTE_READ) => {}
            Operation::CompareSwap | Operation::FetchAdd if acc.contains(Access::REMOTE_ATOMIC) => {
            }
            _ => return Err(inv(None)),
        }

        // check_resource: READ/ATOMIC need responder resources; SEND and WRITE with immediate
        // need a receive WQE, else RNR NAK (class B: no state change).
        let needs_rwqe = matches!(
            (info.operation, info.position),
            (Operation::Send, Position::First | Position::Only)
        ) || (info.operation == Operation::Write && info.immediate);
        if needs_rwqe && !self.fetch_rwqe(ctx) {
            // `out_of_buffer` counts the event (mlx5: receive queue empty), `send_rnr_err` the
            // RNR NAKs that go out (rxe RXE_CNT_SND_RNR).
            self.counters.out_of_buffer += 1;
            // The RNR NAK stands for the gap it opens: the packets behind it are dropped
            // without a PSN NAK until the retried request arrives (one NAK per gap). That is
            // recorded only if the NAK will go out: if it could not be queued, the next packet
            // of the gap NAKs the PSN again (as a PSN sequence error, which also makes the
            // requester go back to it).
            self.sent_psn_nak = self.queue_ctrl(
                AethSyndrome::RnrNak {
                    timer: RnrTimer::new(self.attr.min_rnr_timer),
                },
                psn,
            );
            self.counters.send_rnr_err += u64::from(self.sent_psn_nak);
            return Ok(());
        }
        let rd_atomic = matches!(
            info.operation,
            Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd
        );
        if rd_atomic && self.attr.max_dest_rd_atomic == 0 {
            return Err(inv(None));
        }

        // check_length: ONLY <= mtu, FIRST/MIDDLE == mtu, LAST 1..=mtu; no payload where the
        // opcode has none; RETH length <= 2^31.
        let len_ok = match (info.payload, info.position) {
            (false, _) => plen == 0,
            (true, Position::Only) => plen <= mtu,
            (true, Position::First | Position::Middle) => plen == mtu,
            (true, Position::Last) => (1..=mtu).contains(&plen),
        };
        if !len_ok
            || pkt
                .repr
                .reth
                .is_some_and(|r| u64::from(r.dma_len) > MAX_MSG_SIZE)
        {
            let st = (kind == Some(MsgKind::Send)).then_some(WcStatus::RemInvReqErr);
            return Err(inv(st));
        }

        match info.operation {
            Operation::Send => self.exec_send(pkt, info.position, ctx)?,
            Operation::Write => self.exec_write(pkt, info.position, ctx)?,
            Operation::ReadRequest => return self.exec_read(pkt, ctx),
            _ => return self.exec_atomic(pkt, ctx),
        }
        self.resp_psn = psn.next();
        if bth.ack_req {
            self.queue_request_ack(psn, ctx);
        }
        Ok(())
    }

    pub(super) fn exec_send(
        &mut self,
        pkt: &RxPkt<'_>,
        pos: Position,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Fatal> {
        let Some(rwqe) = self.rq.front() else {
            return Err(Fatal {
                nak: NakCode::RemoteOperationalError,
                status: None,
            });
        };
        if matches!(pos, Position::First | Position::Only) {
            self.send_off = 0;
        }
        let plen = pkt.payload.len() as u64;
        let end = self.send_off + plen;
        if end > sg_len(&rwqe.sg_list) {
            // The message is longer than the receive buffer (rxe RESPST_ERR_LENGTH).
            self.counters.resp_local_length_error += 1;
            return Err(Fatal {
                nak: NakCode::InvalidRequest,
                status: Some(WcStatus::LocLenErr),
            });
        }
        if sg_scatter(
            ctx.mrs,
            self.init.pd,
            &rwqe.sg_list,
            self.send_off,
            pkt.payload,
        )
        .is_err()
        {
            // A malformed receive WQE (bad local key/range): class A, remote operational error.
            return Err(Fatal {
                nak: NakCode::RemoteOperationalError,
                status: Some(WcStatus::LocProtErr),
            });
        }
        self.send_off = end;
        if matches!(pos, Position::First) {
            self.in_msg = Some(MsgKind::Send);
        }
        if matches!(pos, Position::Last | Position::Only) {
            self.in_msg = None;
            if let Some(IethRepr { rkey }) = pkt.repr.ieth
                && !ctx.mrs.invalidate_rkey(self.init.pd, rkey)
            {
                // rxe class J: the R_Key to invalidate is not valid.
                return Err(Fatal {
                    nak: NakCode::InvalidRequest,
                    status: Some(WcStatus::RemInvReqErr),
                });
            }
            self.msn = self.msn.wrapping_add(1);
            self.recv_ssn = self.recv_ssn.wrapping_add(1);
            self.complete_recv_head(
                WcStatus::Success,
                end,
                Some((
                    WcOpcode::Recv,
                    pkt.repr.immdt.map(|i| i.imm),
                    pkt.repr.ieth.map(|i| i.rkey),
                )),
                pkt.repr.bth.solicited,
                ctx,
            );
        }
        Ok(())
    }

    pub(super) fn exec_write(
        &mut self,
        pkt: &RxPkt<'_>,
        pos: Position,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Fatal> {
        let mtu = u64::from(self.mtu().bytes());
        let access = |nak| Fatal { nak, status: None };
        if matches!(pos, Position::First | Position::Only) {
            let Some(reth) = pkt.repr.reth else {
                return Err(access(NakCode::InvalidRequest));
            };
            let len = u64::from(reth.dma_len);
            // check_rkey: a zero-length WRITE needs no R_Key.
            if len > 0
                && ctx
                    .mrs
                    .check_remote(
                        self.init.pd,
                        self.qpn,
                        reth.rkey,
                        reth.va,
                        len,
                        Access::REMOTE_WRITE,
                    )
                    .is_err()
            {
                self.counters.resp_remote_access_errors += 1;
                return Err(access(NakCode::RemoteAccessError));
            }
            self.write_va = reth.va;
            self.write_rkey = reth.rkey;
            self.write_resid = len;
            self.write_len = reth.dma_len;
            self.counters.rx_write_requests += 1;
        }
        // The payload must fill the MTU while more than an MTU remains, else be exactly the
        // rest (rxe check_rkey "resid > mtu" rule).
        let plen = pkt.payload.len() as u64;
        let ends = matches!(pos, Position::Last | Position::Only);
        let ok = if self.write_resid > mtu {
            plen == mtu && !ends
        } else {
            plen == self.write_resid && ends
        };
        if !ok {
            return Err(access(NakCode::InvalidRequest));
        }
        if plen > 0 {
            match ctx.mrs.remote_write(
                self.init.pd,
                self.qpn,
                self.write_rkey,
                self.write_va,
                pkt.payload,
                Access::REMOTE_WRITE,
            ) {
                Ok(()) => {}
                Err(_) => {
                    self.counters.resp_remote_access_errors += 1;
                    return Err(access(NakCode::RemoteAccessError));
                }
            }
        }
        self.write_va = self.write_va.wrapping_add(plen);
        self.write_resid -= plen;
        self.in_msg = if ends { None } else { Some(MsgKind::Write) };
        if ends {
            self.msn = self.msn.wrapping_add(1);
            if let Some(ImmDtRepr { imm }) = pkt.repr.immdt {
                self.recv_ssn = self.recv_ssn.wrapping_add(1);
                self.complete_recv_head(
                    WcStatus::Success,
                    u64::from(self.write_len),
                    Some((WcOpcode::RecvRdmaWithImm, Some(imm), None)),
                    pkt.repr.bth.solicited,
                    ctx,
                );
            }
        }
        Ok(())
    }

    /// Makes room for one more READ/atomic responder resource (IBA 9.4.4: at most
    /// `max_dest_rd_atomic` are kept). A full table gives up its oldest resource, as rxe's
    /// resource ring overwrites its oldest slot (rxe_resp.c `free_rd_atomic_resource` on
    /// `res_head`). That is safe: a requester keeps at most `max_rd_atomic <=
    /// max_dest_rd_atomic` READs/atomics outstanding and completes them in order, so when a
    /// new one arrives the oldest is already complete at the requester even if its responses
    /// are still being sent here (paced, or replayed for a stale duplicate request); a
    /// requester that breaks the limit only loses responses it was not owed. One whose
    /// responses were still being sent is counted in `rd_atomic_evicted`.
    ///
    /// The resources are in PSN order (new ones are appended; a duplicate restarts one in
    /// place), so the oldest is the first. Giving up a finished resource before an older one
    /// still sending is wrong: "finished" means its responses left, not that they arrived,
    /// and a stale duplicate of an older READ could then cost the requester the only copy of
    /// a newer READ's lost responses, after which every retry of that READ found no resource
    /// and was dropped (the release simulator's seed 101 stalled that way).
    fn take_resource_slot(&mut self) {
        if self.resources.len() < usize::from(self.attr.max_dest_rd_atomic) {
            return;
        }
        if self.resources.pop_front().is_some_and(|r| r.pending()) {
            self.counters.rd_atomic_evicted += 1;
        }
    }

    fn exec_read(&mut self, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) -> Result<(), Fatal> {
        let Some(reth) = pkt.repr.reth else {
            return Err(Fatal {
                nak: NakCode::InvalidRequest,
                status: None,
            });
        };
        let len = u64::from(reth.dma_len);
        if len > 0
            && ctx
                .mrs
                .check_remote(
                    self.init.pd,
                    self.qpn,
                    reth.rkey,
                    reth.va,
                    len,
                    Access::REMOTE_READ,
                )
                .is_err()
        {
            self.counters.resp_remote_access_errors += 1;
            return Err(Fatal {
                nak: NakCode::RemoteAccessError,
                status: None,
            });
        }
        self.take_resource_slot();
        let psn = pkt.repr.bth.psn;
        let npkts = packets_for(len, self.mtu());
        let last_psn = psn.wrapping_add(npkts - 1);
        self.resources.push_back(Resource::Read {
            first_psn: psn,
            last_psn,
            va: reth.va,
            rkey: reth.rkey,
            len,
            cur_psn: psn,
            pending: true,
            restart: false,
            stop_psn: last_psn,
            resume: None,
            placed: self.mp_placed_read(pkt),
        });
        // C9-148: the MSN counts the READ when the request is accepted.
        self.msn = self.msn.wrapping_add(1);
        self.resp_psn = psn.wrapping_add(npkts);
        self.counters.rx_read_requests += 1;
        Ok(())
    }

    fn exec_atomic(&mut self, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) -> Result<(), Fatal> {
        let Some(a) = pkt.repr.atomic_eth else {
            return Err(Fatal {
                nak: NakCode::InvalidRequest,
                status: None,
            });
        };
        if ctx
            .mrs
            .check_remote(
                self.init.pd,
                self.qpn,
                a.rkey,
                a.va,
                8,
                Access::REMOTE_ATOMIC,
            )
            .is_err()
        {
            self.counters.resp_remote_access_errors += 1;
            return Err(Fatal {
                nak: NakCode::RemoteAccessError,
                status: None,
            });
        }
        // Atomics need an 8-byte aligned address (rxe RESPST_ERR_MISALIGNED_ATOMIC).
        if a.va & 7 != 0 {
            return Err(Fatal {
                nak: NakCode::InvalidRequest,
                status: None,
            });
        }
        self.take_resource_slot();
        let cas = pkt.repr.bth.opcode == Opcode::RC_COMPARE_SWAP;
        let op = |v: u64| {
            if !cas {
                v.wrapping_add(a.swap_add)
            } else if v == a.compare {
                a.swap_add
            } else {
                v
            }
        };
        let orig = match ctx
            .mrs
            .remote_atomic(self.init.pd, self.qpn, a.rkey, a.va, op)
        {
            Ok(v) => v,
            Err(_) => {
                return Err(Fatal {
                    nak: NakCode::RemoteAccessError,
                    status: None,
                });
            }
        };
        let psn = pkt.repr.bth.psn;
        self.resources.push_back(Resource::Atomic {
            psn,
            orig,
            pending: true,
        });
        self.msn = self.msn.wrapping_add(1);
        self.resp_psn = psn.next();
        self.counters.rx_atomic_requests += 1;
        Ok(())
    }

    /// A request with a PSN before the expected one (rxe `duplicate_request`). A replayed READ
    /// request means READ responses were lost on the way to the requester: the reaction point
    /// backs off ([`Qp::cc_on_loss`]), towards a peer or path that marks nothing too.
    fn duplicate_request(&mut self, now: Instant, pkt: &RxPkt<'_>, op: Operation) {
        let psn = pkt.repr.bth.psn;
        match op {
            Operation::Send | Operation::Write => {
                // C9-105: ACK again with the PSN before the expected one. A full queue merges
                // it (`queue_ctrl`); if it were ever lost, the requester's next retry of the
                // duplicate asks again.
                let _ = self.queue_ctrl(AethSyndrome::ACK_UNLIMITED, self.resp_psn.wrapping_sub(1));
            }
            Operation::ReadRequest => {
                let Some(reth) = pkt.repr.reth else { return };
                let mtu = u64::from(self.mtu().bytes());
                for r in &mut self.resources {
                    if let Resource::Read {
                        first_psn,
                        last_psn,
                        va,
                        rkey,
                        len,
                        cur_psn,
                        pending,
                        restart,
                        stop_psn,
                        resume,
                        placed,
                    } = r
                    {
                        if psn.distance(*first_psn) < 0 || psn.distance(*last_psn) > 0 {
                            continue;
                        }
                        // The replayed request must name a tail of the original one; with
                        // placed responses (multipath), any whole-packet range of it: the
                        // requester asks again only for what it is missing.
                        let off = psn.distance(*first_psn) as u64 * mtu;
                        let tail = *len - off.min(*len);
                        let dma = u64::from(reth.dma_len);
                        let same_start = reth.rkey == *rkey && Some(reth.va) == va.checked_add(off);
                        let stop = if same_start && dma == tail {
                            Some(*last_psn)
                        } else if same_start && *placed && dma > 0 && dma < tail && dma % mtu == 0 {
                            Some(psn.wrapping_add(u32::try_from(dma / mtu).unwrap_or(1) - 1))
                        } else {
                            None
                        };
                        if let Some(mut stop) = stop {
                            // The packets asked for again were lost (or overtaken by that
                            // much): with placed responses their entropies are retired.
                            let lost = placed.then_some((psn, stop));
                            let mut from = psn;
                            // A play still going on is not cut short: a range before where it
                            // is goes first and the play resumes after it (placed responses);
                            // a range while a range replays joins it; else the replay runs on
                            // to the play's end. Nothing not yet sent is skipped.
                            if *pending && resume.is_some() {
                                if cur_psn.distance(from) < 0 {
                                    from = *cur_psn;
                                }
                                if stop_psn.distance(stop) > 0 {
                                    stop = *stop_psn;
                                }
                            } else if *pending && stop_psn.distance(stop) > 0 {
                                if *placed && cur_psn.distance(stop) > 0 {
                                    *resume = Some((*cur_psn, *stop_psn));
                                } else {
                                    stop = *stop_psn;
                                }
                            }
                            *cur_psn = from;
                            *pending = true;
                            *restart = true;
                            *stop_psn = stop;
                            if lost.is_some() {
                                // Placed responses (multipath): the requester asks only for
                                // what it misses, each range a loss of its own, and took
                                // the others out of order: no measure of a rate in order.
                                self.cc_on_loss(now);
                            } else {
                                self.cc_on_replay(now, psn, from);
                            }
                            if let Some((from, to)) = lost {
                                self.mp_responses_lost(from, to, now);
                            }
                        }
                        return;
                    }
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                for r in &mut self.resources {
                    if let Resource::Atomic {
                        psn: p, pending, ..
                    } = r
                        && *p == psn
                    {
                        // Replay the saved result; never execute twice.
                        *pending = true;
                        return;
                    }
                }
            }
            _ => {}
        }
    }

    fn handle_ud_request(&mut self, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) {
        let Some(deth) = pkt.repr.deth else {
            self.counters.rx_dropped += 1;
            return;
        };
        if deth.qkey != self.attr.qkey {
            ctx.counters.qkey_viol_cntr += 1;
            return;
        }
        let plen = pkt.payload.len() as u64;
        if plen > u64::from(self.mtu().bytes()) {
            self.counters.rx_dropped += 1;
            return;
        }
        if !self.fetch_rwqe(ctx) {
            // UD has no RNR: the datagram is dropped.
            self.counters.out_of_buffer += 1;
            return;
        }
        let Some(rwqe) = self.rq.front() else { return };
        let sges = &rwqe.sg_list;
        // The GRH area holds the packet's IP header as rxe writes it (rxe_resp.c
        // build_rdma_network_hdr), so that ibv_init_ah_from_wc finds the sender.
        let grh = pkt
            .ip
            .map_or([0u8; GRH_LEN as usize], |ip| ip.network_header());
        let mut status = WcStatus::Success;
        if sg_len(sges) < GRH_LEN + plen {
            self.counters.resp_local_length_error += 1;
            status = WcStatus::LocLenErr;
        } else if sg_scatter(ctx.mrs, self.init.pd, sges, 0, &grh).is_err()
            || sg_scatter(ctx.mrs, self.init.pd, sges, GRH_LEN, pkt.payload).is_err()
        {
            status = WcStatus::LocProtErr;
        }
        let Some(r) = self.rq.pop_front() else { return };
        let mut flags = WcFlags::GRH;
        if pkt.repr.immdt.is_some() {
            flags |= WcFlags::WITH_IMM;
        }
        if status == WcStatus::Success {
            self.counters.rdma_recvs += 1;
        } else {
            self.counters.resp_cqe_error += 1;
        }
        let wc = Wc {
            wr_id: r.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: u32::try_from(GRH_LEN + plen).unwrap_or(u32::MAX),
            imm: pkt.repr.immdt.map_or(0, |i| i.imm),
            invalidated_rkey: RKey::new(0),
            qp_num: self.qpn,
            src_qp: deth.src_qp,
            wc_flags: flags,
        };
        self.push_wc(self.init.recv_cq, wc, pkt.repr.bth.solicited, ctx);
    }
}

impl Qp {
    /// Whether a receive WQE is ready at the head of `rq`: the QP's own, or, for a QP
    /// attached to an SRQ, the SRQ's oldest, moved to `rq` for the message it starts (rxe
    /// `get_srq_wqe`), raising [`Event::SrqLimitReached`] when that crossed the armed limit.
    /// Call it where a request needs a WQE (the first packet of a SEND, a WRITE with
    /// immediate, a UD datagram).
    pub(super) fn fetch_rwqe(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if !self.rq.is_empty() {
            return true;
        }
        self.take_srq_wqe(ctx)
    }

    /// Takes the next WQE of the QP's shared receive queue into its own queue, behind those it
    /// holds, raising the SRQ's limit event when the take reached it. False when the QP has no
    /// SRQ or the SRQ is empty.
    pub(super) fn take_srq_wqe(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let Some(id) = self.srq else { return false };
        let Some((wr, reached)) = ctx.srqs.take(id) else {
            return false;
        };
        self.rq.push_back(wr.into());
        if reached {
            ctx.event(Event::SrqLimitReached { srq: id });
        }
        true
    }

    pub(crate) fn post_recv(
        &mut self,
        wr: RecvWr,
        max_sge: usize,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), PostError> {
        if self.srq.is_some() {
            // rxe_post_recv: a QP attached to an SRQ has no receive queue of its own.
            return Err(PostError::Invalid(
                "the QP receives through a shared receive queue: post to the SRQ",
            ));
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if wr.sg_list.len() > max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len(), max_sge));
        }
        if self.rq.len() >= self.init.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull(self.rq.len()));
        }
        self.rq.push_back(wr.into());
        if self.state == QpState::Err {
            self.flush(ctx);
        }
        Ok(())
    }

    /// The ACK or NAK `c` as a packet. On a QP whose responder runs the multipath reassembly
    /// an ACK carries the SACK trailer (written into `tx`, the BTH marked
    /// [`MpBthFlags::TRAILER`]) and the newest cumulative PSN and MSN, which stand for the
    /// queued ones (IBA 9.7.5.1, coalesced acknowledgements).
    pub(super) fn ctrl_pkt(&mut self, c: Ctrl, tx: &mut TxBuf<'_>) -> OutPkt {
        let (mut psn, mut msn, mut payload, mut resv7) = (c.psn, c.msn, 0..0, 0);
        if matches!(c.syndrome, AethSyndrome::Ack { .. })
            && let Some((cum, sack)) = self.mp_sack()
            && let Some((range, dst)) = tx.payload(Opcode::RC_ACKNOWLEDGE, sack.buffer_len())
        {
            dst.copy_from_slice(&sack.to_bytes());
            (psn, msn, payload, resv7) = (cum, self.msn, range, MpBthFlags::TRAILER.bits());
        }
        let mut repr = RoceRepr::ack(
            self.attr.dest_qp_num,
            psn,
            AethRepr {
                syndrome: c.syndrome,
                msn,
            },
        );
        repr.bth.resv7 = resv7;
        self.counters.sent_pkts += 1;
        OutPkt {
            repr,
            payload,
            ud_path: None,
        }
    }

    /// Queues an ACK or NAK for `psn` carrying the current MSN; call it wherever the responder
    /// answers a request (rxe `send_ack`). Returns whether the answer will reach the wire: it
    /// was queued, or it merged with a queued one that says as much. A caller that records
    /// having sent a NAK (`sent_psn_nak`) records it only on `true`, so that the next packet
    /// of the gap, or the requester's retry, triggers it again.
    ///
    /// rxe has no such queue: `send_ack` builds and transmits the packet at once. Here the
    /// responder runs while the device receives a batch, and the answers wait in a bounded
    /// queue of [`MAX_PENDING_ACKS`] until the device transmits, so a burst of requests that
    /// ask for an ACK can fill it. A full queue never swallows a NAK; it merges the new answer
    /// with the newest queued one instead, which keeps the bound without losing information:
    ///
    /// - IBA Vol. 1 §9.7.5.1 (coalesced acknowledgements): an ACK acknowledges every request
    ///   up to its PSN, so a newer ACK stands for the older ones.
    /// - A NAK acknowledges every request before its PSN (§9.7.5.1/§9.7.5.2; rxe_comp.c
    ///   completes the WQEs that end before a NAK's PSN, as our completer's `ack_through`
    ///   does), so a NAK (RNR NAK, PSN sequence error, or a class C NAK) takes the place of
    ///   the queued ACK before it. A responder has at most one NAK outstanding at a time
    ///   (§9.7.5.2: one NAK per PSN gap; an RNR NAK is answered by a retry of its PSN), so a
    ///   NAK also replaces an older queued NAK, whose condition ended when the responder moved
    ///   on to this PSN.
    /// - An ACK newer than a queued NAK replaces it for the same reason; an ACK older than the
    ///   newest queued answer (a duplicate's re-ACK, C9-105, behind a NAK for the expected
    ///   PSN) is already implied by it and is not queued.
    ///
    /// Answers are queued in PSN order (the responder executes in order and every answer is
    /// for a PSN at or before the expected one), so the newest queued answer is the one to
    /// merge with. Each merge is counted in `ack_deferred`. The one case that cannot merge, a
    /// NAK for a PSN before the newest queued answer, is counted in `ack_queue_full` and
    /// returns false; the responder never produces it (a READ response that fails sends its
    /// NAK directly, see [`Self::next_response`]).
    ///
    /// The responder's other answers have no queue that could drop them: READ responses and
    /// atomic ACKs are built from the responder resources when the device transmits (a ring of
    /// `max_dest_rd_atomic`; a duplicate request replays from it, and a new one
    /// past the ring evicts the oldest as rxe does, counted in `rd_atomic_evicted`); a CNP is a
    /// count of CNPs due on one template (transport/cc.rs), never a queued packet; and the
    /// engine asks the device for a frame only when the AF_XDP transmit ring has room for it
    /// (xsk/socket.rs `TxSink::send` runs the writer only then), so a built answer is not
    /// lost for want of a slot.
    pub(super) fn queue_ctrl(&mut self, syndrome: AethSyndrome, psn: Psn) -> bool {
        self.queue_ctrl_covering(syndrome, psn, 0)
    }

    /// Acknowledges the request at `psn` that asked for it (BTH.AckReq) and was executed in
    /// order; call it after the request moved the expected PSN on. With
    /// [`super::super::DeviceConfig::coalesce_acks`] the ACK takes the place of a queued ACK
    /// of the same kind, one that has not left yet because the device is still receiving
    /// the batch both came in (IBA Vol. 1 §9.7.5.1: a responder may coalesce ACKs; an ACK
    /// acknowledges every request up to its PSN, and carries the newest MSN). It merges only
    /// with the newest queued answer when that is such an ACK for an earlier PSN standing for
    /// fewer than [`super::ACK_COALESCE_MAX`] requests, and never while a READ response or
    /// atomic ACK is owed (answers leave in PSN order, see [`Qp::poll_transmit`]). NAKs and
    /// duplicates' re-ACKs (C9-105, one per duplicate: the READ clock matches its probes'
    /// answers one by one) go through [`Self::queue_ctrl`] and never merge. Each merge is
    /// counted in the device's `ack_coalesced`.
    pub(super) fn queue_request_ack(&mut self, psn: Psn, ctx: &mut Ctx<'_>) {
        let msn = self.msn;
        let owed = self.resources.iter().any(Resource::pending);
        if ctx.coalesce_acks
            && !owed
            && let Some(last) = self.ctrl.back_mut()
            && (1..super::ACK_COALESCE_MAX).contains(&last.covers)
            && last.syndrome.is_ack()
            && psn.distance(last.psn) > 0
        {
            *last = Ctrl {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                psn,
                msn,
                covers: last.covers + 1,
            };
            ctx.counters.ack_coalesced += 1;
            return;
        }
        // Merged into the newest queued answer if the queue is full (`queue_ctrl`).
        let _ = self.queue_ctrl_covering(AethSyndrome::ACK_UNLIMITED, psn, 1);
    }

    /// [`Self::queue_ctrl`] for an answer that stands for `covers` coalescible requests.
    fn queue_ctrl_covering(&mut self, syndrome: AethSyndrome, psn: Psn, covers: u8) -> bool {
        let c = Ctrl {
            syndrome,
            psn,
            msn: self.msn,
            covers,
        };
        if self.ctrl.len() < MAX_PENDING_ACKS {
            self.ctrl.push_back(c);
            return true;
        }
        let Some(last) = self.ctrl.back_mut() else {
            // MAX_PENDING_ACKS is not 0, so a full queue has a newest entry.
            self.counters.ack_queue_full += 1;
            return false;
        };
        if last.psn.distance(psn) <= 0 {
            // The new answer is for the same PSN or a later one: it implies the queued one.
            *last = c;
            self.counters.ack_deferred += 1;
            return true;
        }
        if syndrome.is_ack() {
            // An ACK for an earlier PSN than a queued ACK or NAK: already implied.
            self.counters.ack_deferred += 1;
            return true;
        }
        self.counters.ack_queue_full += 1;
        false
    }

    pub(super) fn next_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: &mut TxBuf<'_>,
    ) -> Option<OutPkt> {
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
                stop_psn,
                resume: _,
                placed,
            } => {
                let idx = cur_psn.distance(*first_psn) as u64;
                let off = idx * mtu;
                let n = (*len - off.min(*len)).min(mtu);
                let is_last = *cur_psn == *last_psn;
                let stops = *cur_psn == *stop_psn || is_last;
                let psn = *cur_psn;
                let (rkey, rva, va) = (*rkey, *va, va.wrapping_add(off));
                let nn = usize::try_from(n).ok()?;
                // In multipath mode the packet ends in its placement trailer (READ response
                // flag, its offset in the READ's data), when the frame has room for it (tried
                // with the longest READ response headers).
                let trailer = match (u32::try_from(off), u32::try_from(*len)) {
                    (Ok(offset), Ok(length)) if *placed && self.mp.is_on() => {
                        Some(PlacementTrailer {
                            first_psn: *first_psn,
                            flags: PlacementFlags::READ_RESPONSE,
                            offset,
                            length,
                            va: rva,
                            rkey: RKey::new(0),
                            ssn: Ssn::new(0),
                        })
                    }
                    _ => None,
                }
                .filter(|t| {
                    tx.payload(Opcode::RC_RDMA_READ_RESPONSE_ONLY, nn + t.buffer_len())
                        .is_some()
                });
                // The first packet of a (re)played response is FIRST/ONLY (a replay answers a
                // new READ request from that PSN), the others MIDDLE/LAST; a replay of a range
                // (placed responses only) ends LAST at the range's end when it has its trailer
                // (without, where a plain requester expects its READ's last packet).
                let ends = if trailer.is_some() { stops } else { is_last };
                let pos = match (idx == 0 || *restart, ends) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, true) => Position::Last,
                    (false, false) => Position::Middle,
                };
                let opcode = opcode_for(Operation::ReadResponse, pos, false, false);
                let tlen = trailer.map_or(0, |t| t.buffer_len());
                let (payload, dst) = tx.payload(opcode, nn + tlen)?;
                let (dst, tail) = dst.split_at_mut(nn);
                if let Some(t) = trailer {
                    tail.copy_from_slice(&t.to_bytes());
                }
                // A zero-length READ touches no memory and needs no R_Key.
                let read = if n == 0 {
                    Ok(())
                } else {
                    ctx.mrs
                        .remote_read(self.init.pd, self.qpn, rkey, va, dst, Access::REMOTE_READ)
                };
                match read {
                    Ok(()) => {}
                    Err(_) => {
                        // The region went away mid-response: NAK remote access, class C. The
                        // NAK is returned as this call's packet, not queued, so no full
                        // queue can hold it back (its PSN is a response PSN, before the
                        // answers queued for later requests).
                        self.counters.resp_remote_access_errors += 1;
                        self.resources.clear();
                        let c = Ctrl {
                            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                            psn,
                            msn: self.msn,
                            covers: 0,
                        };
                        self.enter_error(ctx);
                        return Some(self.ctrl_pkt(c, tx));
                    }
                }
                if let Resource::Read {
                    cur_psn,
                    pending,
                    restart,
                    stop_psn,
                    resume,
                    ..
                } = &mut self.resources[i]
                {
                    *restart = false;
                    if let (true, Some((at, stop))) = (stops, resume.take()) {
                        // The range replayed: the interrupted play goes on (a new FIRST).
                        (*cur_psn, *stop_psn, *restart) = (at, stop, true);
                    } else if stops {
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
                if trailer.is_some() {
                    repr.bth.resv7 = MpBthFlags::TRAILER.bits();
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
