//! The completer: ACKs, NAKs, READ responses and atomic ACKs coming back to the requester
//! (rxe_comp.c; reference §2 "Completer").

use super::*;

impl Qp {
    /// Handles a response packet (ACK/NAK, READ response, atomic ACK) for this QP, handled at
    /// `now`, that arrived at `arrival` (its arrival stamp, at or before `now`): Swift's RTT
    /// sample ends at the arrival, so the time the packet waited in the RX ring for this
    /// process to get to it is not read as queueing in the network.
    pub(crate) fn handle_response(
        &mut self,
        now: Instant,
        arrival: Instant,
        pkt: &RxPkt<'_>,
        ctx: &mut Ctx<'_>,
    ) {
        if !self.state.requester_ready() || self.qp_type != QpType::Rc {
            self.counters.rx_dropped += 1;
            return;
        }
        let Some(info) = pkt.repr.bth.opcode.info() else {
            self.counters.rx_dropped += 1;
            return;
        };
        let psn = pkt.repr.bth.psn;
        if info.operation == Operation::Acknowledge
            && pkt
                .repr
                .aeth
                .is_some_and(|a| matches!(a.syndrome, AethSyndrome::Ack { .. }))
            && self.comp_psn == self.sent_psn
            && self.cc_on_peer_ack()
        {
            // The answer to a READ responder's probe (transport/cc.rs `ReadClock`): with
            // nothing unacknowledged it acknowledges nothing new. Its PSN is the last the
            // peer acknowledged, or, from rxe before it acknowledged any (its `ack_psn`
            // starts at 0, rxe_resp.c `duplicate_request`), 0xffffff.
            return;
        }
        // A response for a PSN never sent is a ghost: drop it (rxe check_psn).
        if psn.distance(self.sent_psn) >= 0 {
            self.counters.rx_dropped += 1;
            return;
        }
        // The peer answers: a timeout's replay goes on past its first packet.
        self.replay_probe = false;
        let d_comp = psn.distance(self.comp_psn);
        match info.operation {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.repr.aeth else {
                    self.counters.rx_dropped += 1;
                    return;
                };
                match aeth.syndrome {
                    AethSyndrome::Ack { .. } => {
                        self.check_replayed(now, psn);
                        if d_comp < -1 {
                            // An old ACK (already covered): harmless, ignore.
                            return;
                        }
                        // With requests unacknowledged it may also answer a READ
                        // responder's probe (transport/cc.rs `ReadClock`).
                        self.cc_on_peer_ack();
                        self.cc_on_ack(arrival, psn);
                        self.mp_on_cum_ack(psn);
                        self.ack_through(now, psn, ctx);
                    }
                    AethSyndrome::RnrNak { timer } => {
                        if d_comp < 0 {
                            return;
                        }
                        self.mp_on_cum_ack(psn.wrapping_sub(1));
                        self.cc_on_ack(arrival, psn.wrapping_sub(1));
                        if !self.ack_through(now, psn.wrapping_sub(1), ctx) {
                            return;
                        }
                        self.on_rnr_nak(now, timer, ctx);
                    }
                    AethSyndrome::Nak(code) => {
                        if d_comp < 0 {
                            return;
                        }
                        self.mp_on_cum_ack(psn.wrapping_sub(1));
                        self.cc_on_ack(arrival, psn.wrapping_sub(1));
                        if !self.ack_through(now, psn.wrapping_sub(1), ctx) {
                            return;
                        }
                        self.on_nak(now, code, ctx);
                    }
                    AethSyndrome::Reserved(_) => self.counters.rx_dropped += 1,
                }
            }
            Operation::ReadResponse => {
                if d_comp < 0 {
                    // A duplicate response (a replay for an earlier re-request): drop it. The
                    // responder answers requests in order and is still busy with ours, so the
                    // local ACK timer is pushed forward.
                    self.counters.rx_dropped += 1;
                    self.arm_retransmit(now, true);
                    return;
                }
                self.cc_on_ack(arrival, psn);
                // The responder executed the READ, so everything up to it arrived.
                self.mp_on_cum_ack(psn);
                if !self.ack_through(now, psn.wrapping_sub(1), ctx) {
                    return;
                }
                self.on_read_response(now, pkt, info.position, ctx);
            }
            Operation::AtomicAcknowledge => {
                if d_comp < 0 {
                    self.counters.rx_dropped += 1;
                    return;
                }
                self.cc_on_ack(arrival, psn);
                self.mp_on_cum_ack(psn);
                if !self.ack_through(now, psn.wrapping_sub(1), ctx) {
                    return;
                }
                self.on_atomic_ack(now, pkt, ctx);
            }
            _ => self.counters.rx_dropped += 1,
        }
    }

    /// Applies an acknowledgement of every PSN up to and including `psn`: completes the SEND
    /// and WRITE WRs it covers, in order (rxe: implicit completion of earlier WQEs). A covered
    /// READ or atomic that has not got its response is an implied NAK: the requester goes back
    /// to it. Returns false if that happened or the QP failed.
    pub(super) fn ack_through(&mut self, now: Instant, psn: Psn, ctx: &mut Ctx<'_>) -> bool {
        let mut progress = false;
        let ok = loop {
            let Some(w) = self.sq.front() else {
                break true;
            };
            if let Some(st) = w.done {
                self.complete_head(st, ctx);
                self.enter_error(ctx);
                break false;
            }
            let (Some(f), Some(l)) = (w.first_psn, w.last_psn()) else {
                break true;
            };
            if matches!(w.wr.op, SendOp::Read { .. }) && w.npkts > 0 && w.rcvd_pkts >= w.npkts {
                // A READ whose responses were all placed out of order (multipath; the
                // in-order path completes a READ at its last response): done, in order.
                if l.next().distance(self.comp_psn) > 0 {
                    self.comp_psn = l.next();
                }
                progress = true;
                self.complete_head(WcStatus::Success, ctx);
                if self.state == QpState::Err {
                    break false;
                }
                continue;
            }
            if psn.distance(l) >= 0 {
                if w.wr.op.is_read_or_atomic() {
                    // Implied NAK (rxe: READ/ATOMIC earlier than the ACK -> ERROR_RETRY).
                    let resume = f.wrapping_add(w.rcvd_pkts);
                    if resume.distance(self.comp_psn) > 0 {
                        self.comp_psn = resume;
                        progress = true;
                    }
                    if self.retry(now, ctx, true) {
                        self.counters.implied_nak_seq_err += 1;
                    }
                    break false;
                }
                self.comp_psn = l.next();
                progress = true;
                self.complete_head(WcStatus::Success, ctx);
                if self.state == QpState::Err {
                    break false;
                }
            } else {
                if psn.distance(f) >= 0 && !w.wr.op.is_read_or_atomic() {
                    let n = psn.next();
                    if n.distance(self.comp_psn) > 0 {
                        self.comp_psn = n;
                        progress = true;
                    }
                }
                break true;
            }
        };
        if progress {
            self.on_progress(now, ctx);
        }
        ok && self.state != QpState::Err
    }

    pub(super) fn on_progress(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        self.skip_acked();
        self.retry_left = self.attr.retry_cnt;
        self.rnr_left = self.attr.rnr_retry;
        self.retry_guard = None;
        self.arm_retransmit(now, true);
        // A WR that failed locally behind completed ones is reported now, in order.
        if let Some(st) = self.sq.front().and_then(|w| w.done) {
            self.complete_head(st, ctx);
            self.enter_error(ctx);
            return;
        }
        self.check_drained(ctx);
    }

    fn on_rnr_nak(&mut self, now: Instant, timer: RnrTimer, ctx: &mut Ctx<'_>) {
        self.counters.rcvd_rnr_err += 1;
        // An RNR NAK is a valid answer, not a transport error: the transport retry count
        // starts over, the RNR retry count goes on.
        self.retry_left = self.attr.retry_cnt;
        if self.rnr_left == 0 {
            self.counters.retry_rnr_exceeded_err += 1;
            self.counters.rnr_nak_retry_err += 1;
            self.counters.req_rnr_retries_exceeded += 1;
            self.complete_head(WcStatus::RnrRetryExcErr, ctx);
            self.enter_error(ctx);
            return;
        }
        // rnr_retry 7 means retry forever (IBA 9.7.5.2.8; rxe does not decrement it).
        if self.rnr_left != 7 {
            self.rnr_left -= 1;
        }
        self.rnr_wait = true;
        self.timers.stop(Timer::Retransmit);
        self.timers.set(Timer::RnrRetry, now + rnr_timer(timer));
    }

    fn on_nak(&mut self, now: Instant, code: NakCode, ctx: &mut Ctx<'_>) {
        let status = match code {
            NakCode::PsnSequenceError => {
                // Go back N from the NAK's PSN (it implicitly acked everything before).
                self.counters.rcvd_seq_err += 1;
                self.counters.packet_seq_err += 1;
                // Only one retry sequence at a time (rxe `started_retry`): a NAK for the gap a
                // retry already covers, or one that arrives during the RNR wait, starts none.
                if !self.rnr_wait {
                    let _ = self.retry(now, ctx, true);
                }
                return;
            }
            NakCode::InvalidRequest => {
                self.counters.req_remote_invalid_request += 1;
                WcStatus::RemInvReqErr
            }
            NakCode::RemoteAccessError => {
                self.counters.req_remote_access_errors += 1;
                WcStatus::RemAccessErr
            }
            // Remote operational error, and unknown codes (rxe: REM_OP_ERR).
            _ => WcStatus::RemOpErr,
        };
        self.complete_head(status, ctx);
        self.enter_error(ctx);
    }

    fn on_read_response(
        &mut self,
        now: Instant,
        pkt: &RxPkt<'_>,
        pos: Position,
        ctx: &mut Ctx<'_>,
    ) {
        let psn = pkt.repr.bth.psn;
        let m = u64::from(self.mtu().bytes());
        let Some(w) = self.sq.front() else {
            self.counters.rx_dropped += 1;
            return;
        };
        let (SendOp::Read { .. }, Some(f)) = (w.wr.op, w.first_psn) else {
            self.counters.rx_dropped += 1;
            return;
        };
        let expected = f.wrapping_add(w.rcvd_pkts);
        if psn != expected {
            // Earlier responses are missing: implied NAK, resume the READ mid-way, once per
            // gap. The rest of this stream is dropped, but it shows the responder is still
            // answering our requests (in order: the re-request is served after it), so it
            // pushes the local ACK timer forward instead of letting it add a duplicate.
            if self.retry(now, ctx, true) {
                self.counters.implied_nak_seq_err += 1;
            } else {
                self.arm_retransmit(now, true);
            }
            return;
        }
        let off = u64::from(w.rcvd_pkts) * m;
        let n = (w.len - off.min(w.len)).min(m);
        let is_last = w.rcvd_pkts + 1 >= w.npkts;
        // Each piece of a long READ is a request of its own, answered FIRST .. LAST (or ONLY).
        let ends_piece = is_last || (w.rcvd_pkts + 1) % READ_CHUNK_PKTS == 0;
        let pos_ok = match pos {
            Position::Last | Position::Only => ends_piece,
            Position::First | Position::Middle => !ends_piece,
        };
        if !pos_ok || pkt.payload.len() as u64 != n {
            self.counters.rx_dropped += 1;
            return;
        }
        if sg_scatter(ctx.mrs, self.init.pd, &w.wr.sg_list, off, pkt.payload).is_err() {
            self.complete_head(WcStatus::LocProtErr, ctx);
            self.enter_error(ctx);
            return;
        }
        if let Some(w) = self.sq.front_mut() {
            w.rcvd_pkts += 1;
        }
        // Packets after it placed out of order already (multipath; none otherwise).
        let skipped = self.mp_read_skip_placed();
        self.comp_psn = psn.next().wrapping_add(skipped);
        let is_last =
            is_last || (skipped > 0 && self.sq.front().is_some_and(|w| w.rcvd_pkts >= w.npkts));
        if is_last {
            self.complete_head(WcStatus::Success, ctx);
        }
        self.on_progress(now, ctx);
        if is_last {
            self.mp_ack_past_response(now, ctx);
        }
    }

    /// In selective repeat, once a READ or atomic completed: the ACKs that came while its
    /// responses were missing (an implied NAK stopped at it) acknowledged the WRs after it,
    /// and selective repeat will not resend what they covered, so no other ACK of them may
    /// come; they complete now, up to what selective repeat holds acknowledged.
    pub(super) fn mp_ack_past_response(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        if let Some(cum) = self.mp_acked_through()
            && cum.distance(self.comp_psn) >= 0
            && self.state != QpState::Err
        {
            let _ = self.ack_through(now, cum, ctx);
        }
    }

    fn on_atomic_ack(&mut self, now: Instant, pkt: &RxPkt<'_>, ctx: &mut Ctx<'_>) {
        let psn = pkt.repr.bth.psn;
        let Some(w) = self.sq.front() else {
            self.counters.rx_dropped += 1;
            return;
        };
        if !w.wr.op.is_atomic() || w.first_psn != Some(psn) {
            self.counters.rx_dropped += 1;
            return;
        }
        let Some(AtomicAckEthRepr { orig }) = pkt.repr.atomic_ack_eth else {
            self.counters.rx_dropped += 1;
            return;
        };
        // The original value lands in host order, as rxe copies its u64 (a C uint64_t).
        if sg_scatter(ctx.mrs, self.init.pd, &w.wr.sg_list, 0, &orig.to_ne_bytes()).is_err() {
            self.complete_head(WcStatus::LocProtErr, ctx);
            self.enter_error(ctx);
            return;
        }
        if let Some(w) = self.sq.front_mut() {
            w.rcvd_pkts = 1;
        }
        self.comp_psn = psn.next();
        self.complete_head(WcStatus::Success, ctx);
        self.on_progress(now, ctx);
        self.mp_ack_past_response(now, ctx);
    }
}

impl Qp {
    /// Arms the local ACK timer (IBA 9.7.6.1.3) when requests are outstanding, or stops it when
    /// none are; `restart` pushes an armed timer forward (progress, or proof the responder is
    /// still working on our requests). The period is the QP's `timeout`, doubled per
    /// consecutive expiry up to [`MAX_TIMEOUT_BACKOFF`] times; the doubling is forgotten once
    /// everything sent has been acknowledged.
    pub(super) fn arm_retransmit(&mut self, now: Instant, restart: bool) {
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
                        self.replayed = None;
                        self.go_back(self.comp_psn);
                        self.arm_retransmit(now, true);
                    }
                }
            }
        }
    }

    /// Called for every ACK (AETH syndrome ACK) of `psn` before it is applied, while a
    /// retransmission timeout's replay (`Qp::replayed`) is pending: decides whether the timeout
    /// was spurious, the peer only late to acknowledge (a guest that paused longer than the
    /// QP's `timeout`), so that its rate and window cuts are undone
    /// ([`Qp::cc_undo_timeout`]; counted in `spurious_timeouts`).
    ///
    /// The proof is an ACK of `end - 1`, the last PSN sent before the timeout, that the
    /// replayed packets cannot have caused: either it acknowledges nothing new (the peer
    /// re-acknowledges every duplicate request with the last PSN it took, C9-105, and a
    /// replayed packet reached it after it already had `end - 1`), or the replay has not sent
    /// `end - 1` again yet. Either way the peer took the original of `end - 1`, and since a
    /// go-back-N responder takes packets only in order, the originals of the whole range
    /// (the duplicate reports of RFC 3708, which TCP uses to detect a spurious timeout as the
    /// Eifel algorithm does with timestamps, RFC 3522). A replay that repaired a real loss
    /// ends with the peer taking `end - 1` from it, after which no replayed packet follows:
    /// no such ACK. An ACK past the range, another retry or an RNR retry ends the wait.
    fn check_replayed(&mut self, now: Instant, psn: Psn) {
        let Some(end) = self.replayed else {
            return;
        };
        let last = end.wrapping_sub(1);
        if psn.distance(last) > 0 {
            self.replayed = None;
            return;
        }
        let duplicate = psn.distance(self.comp_psn) < 0;
        let not_resent = psn.distance(self.next_psn) >= 0;
        if psn == last && (duplicate || not_resent) {
            self.replayed = None;
            self.counters.spurious_timeouts += 1;
            self.cc_undo_timeout(now);
        }
    }

    /// Starts a retry from `comp_psn` if retries remain, else fails the head WR with
    /// RETRY_EXC_ERR (rxe_comp.c `COMPST_ERROR_RETRY`; retry_cnt 7 retries forever as in rxe).
    /// An `implied` retry (a NAK or a response past a gap) starts only once per `comp_psn`
    /// (rxe `started_retry`). Returns whether a retry sequence started.
    pub(super) fn retry(&mut self, now: Instant, ctx: &mut Ctx<'_>, implied: bool) -> bool {
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
        // A retry means packets (or their ACKs) were lost: back off as after a CNP, so that a
        // peer or path that marks nothing still slows the QP down (issue: loss back-off).
        // The timer fired again before the last timeout's range was acknowledged: one stall.
        let again = self
            .replayed
            .is_some_and(|end| self.comp_psn.distance(end) < 0);
        self.cc_on_retry(now, !implied, !implied && again);
        // A new retry ends the wait for the last timeout's proof (`check_replayed`).
        self.replayed = None;
        self.replay_probe = false;
        // Selective repeat resends only what no SACK covered (qp/multipath.rs), and a READ
        // or atomic whose responses are missing is requested again.
        if self.mp_on_timeout() {
            self.mp_request_again();
        } else {
            self.go_back(self.comp_psn);
            if !implied {
                // Only the first packet goes until the peer answers (`replay_probe`): a peer
                // that only stalled (a guest descheduled past the QP's `timeout`) has every
                // original and would take the rest of the replay as duplicates, each one to
                // handle and acknowledge; one that lost it acknowledges it and the rest
                // follows, an RTT later.
                self.replayed = Some(self.sent_psn);
                self.replay_probe = true;
            }
        }
        self.arm_retransmit(now, true);
        true
    }

    /// Rewinds the requester to resend from `psn` (go back N; rxe `req_retry`).
    pub(super) fn go_back(&mut self, psn: Psn) {
        self.cc_on_go_back(psn, self.sent_psn);
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
    pub(super) fn skip_acked(&mut self) {
        if self.comp_psn.distance(self.next_psn) > 0 {
            self.go_back(self.comp_psn);
        }
    }
}
