//! The sender's selective-repeat state (docs/multipath.md, "Selective acknowledgement and
//! selective repeat"; IRN, Mittal et al. SIGCOMM 2018; RACK, RFC 8985).
//!
//! The requester records every PSN it sends ([`SelectiveRepeat::on_send`]), feeds every ACK's
//! cumulative PSN and SACK trailer in ([`SelectiveRepeat::on_ack`]), and resends exactly what
//! [`SelectiveRepeat::poll_retransmit`] names. A packet is declared lost when a packet
//! transmitted at least `reorder_threshold` transmissions after it has been acknowledged
//! (RACK's rule, RFC 8985 §6.2, counted in transmissions rather than time so that it needs no
//! RTT estimate: "three packets sent after it" in the design), or when it has gone
//! unacknowledged for the retransmission timeout. A PSN the cumulative PSN or the bitmap
//! covers is never resent. The window (PSNs from the oldest unacknowledged to the next new
//! one) is bounded by [`SrConfig::window`], the bandwidth-delay product in packets
//! ([`bdp_window`]), not by go-back-N.

use core::time::Duration;
use std::collections::VecDeque;

use crate::{
    time::Instant,
    wire::{
        Psn,
        multipath::{Entropy, SackTrailer},
    },
};

/// The knobs of selective repeat.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SrConfig {
    /// The window in packets: at most this many PSNs from the oldest unacknowledged one to the
    /// next new one ([`bdp_window`]); at most the receiver's reassembly window.
    pub window: u32,
    /// Transmissions after a packet whose acknowledgement declares it lost (default 3).
    pub reorder_threshold: u64,
    /// How long an unacknowledged packet waits before it is resent anyway (the QP's local
    /// ACK timeout, IBA 9.7.6.1.3).
    pub rto: Duration,
}

impl Default for SrConfig {
    fn default() -> Self {
        Self {
            window: 64,
            reorder_threshold: 3,
            rto: Duration::from_millis(1),
        }
    }
}

/// The window in packets for a rate of `bytes_per_sec` over a smoothed RTT `srtt` with
/// packets of `mtu` bytes: the bandwidth-delay product rounded up, at least `min_pkts`, at
/// most `max_pkts` (the receiver's reassembly window). Call it whenever the CC's rate or the
/// RTT estimate changes and put the result into [`SelectiveRepeat::set_window`].
#[must_use]
pub fn bdp_window(
    bytes_per_sec: u64,
    srtt: Duration,
    mtu: u32,
    min_pkts: u32,
    max_pkts: u32,
) -> u32 {
    let bytes = u128::from(bytes_per_sec) * srtt.as_nanos() / 1_000_000_000;
    let pkts = bytes.div_ceil(u128::from(mtu.max(1)));
    let pkts = u32::try_from(pkts).unwrap_or(u32::MAX);
    pkts.clamp(min_pkts.min(max_pkts), max_pkts)
}

/// What selective repeat counted (docs/multipath.md "Counters").
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SrCounters {
    /// ACKs with a SACK trailer taken in (`sack_received`).
    pub sack_received: u64,
    /// ACKs ignored: their cumulative PSN is after anything sent.
    pub ack_invalid: u64,
    /// Packets resent (`selective_retransmits`).
    pub selective_retransmits: u64,
    /// Of those, resent because the timeout expired.
    pub timeouts: u64,
    /// Packets first acknowledged by a SACK bitmap, not by the cumulative PSN.
    pub sacked: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pkt {
    sent_at: Instant,
    /// Transmission number of the latest transmission.
    stamp: u64,
    acked: bool,
    /// Declared lost and queued in `lost`, not yet resent.
    lost: bool,
    /// The entropy its latest transmission took, when sprayed ([`SelectiveRepeat::set_entropy`]).
    entropy: Option<Entropy>,
    /// A PSN of a READ request's span after its first ([`SelectiveRepeat::on_send_span`]):
    /// never sent on its own, so never declared lost; the request's first PSN stands for it.
    companion: bool,
}

/// The per-QP selective-repeat state of the sender.
#[derive(Clone, Debug)]
pub struct SelectiveRepeat {
    cfg: SrConfig,
    /// The oldest unacknowledged PSN (everything before it is acknowledged).
    base: Psn,
    /// `pkts[i]` is PSN `base + i`; its length is the PSNs in flight.
    pkts: VecDeque<Pkt>,
    /// Next transmission number.
    next_stamp: u64,
    /// The highest transmission number acknowledged.
    rack_stamp: u64,
    /// PSNs declared lost and not yet resent, in the order found.
    lost: VecDeque<Psn>,
    /// Entropies of sprayed packets declared lost, not yet taken by [`Self::lost_entropies`].
    lost_entropies: Vec<Entropy>,
    /// The last request sent that the receiver holds until the cumulative PSN reaches it (a
    /// READ request or an atomic, [`Self::set_held_request`]).
    held_request: Option<Psn>,
    /// A request to send again at once, whatever its acknowledgement ([`Self::request_again`]).
    again: Option<Psn>,
    counters: SrCounters,
}

impl SelectiveRepeat {
    /// The state of a QP whose next PSN to send is `psn` (the RTS transition's `sq_psn`).
    /// Call it when the extension turns on for the QP.
    #[must_use]
    pub fn new(psn: Psn, cfg: SrConfig) -> Self {
        Self {
            cfg: SrConfig {
                window: cfg.window.max(1),
                reorder_threshold: cfg.reorder_threshold.max(1),
                ..cfg
            },
            base: psn,
            pkts: VecDeque::new(),
            next_stamp: 1,
            rack_stamp: 0,
            lost: VecDeque::new(),
            lost_entropies: Vec::new(),
            held_request: None,
            again: None,
            counters: SrCounters::default(),
        }
    }

    /// Changes the window (from [`bdp_window`]). A smaller window than what is in flight
    /// stops new packets until enough are acknowledged; nothing in flight is dropped.
    pub fn set_window(&mut self, window: u32) {
        self.cfg.window = window.max(1);
    }

    /// The counters.
    #[must_use]
    pub const fn counters(&self) -> &SrCounters {
        &self.counters
    }

    /// The oldest unacknowledged PSN.
    #[must_use]
    pub const fn base(&self) -> Psn {
        self.base
    }

    /// The PSN the next new packet takes.
    #[must_use]
    pub fn next_psn(&self) -> Psn {
        self.base.wrapping_add(self.pkts.len() as u32)
    }

    /// PSNs in the window (oldest unacknowledged to next new).
    #[must_use]
    pub fn in_flight(&self) -> u32 {
        self.pkts.len() as u32
    }

    /// Whether a new packet fits in the window. Call it before building a new packet.
    #[must_use]
    pub fn can_send(&self) -> bool {
        self.in_flight() < self.cfg.window
    }

    /// Records the transmission of the next new PSN at `now` and returns it. Call it for
    /// every new packet, after [`Self::can_send`]; `None` when the window is full.
    pub fn on_send(&mut self, now: Instant) -> Option<Psn> {
        if !self.can_send() {
            return None;
        }
        let psn = self.next_psn();
        let stamp = self.stamp();
        self.pkts.push_back(Pkt {
            sent_at: now,
            stamp,
            acked: false,
            lost: false,
            entropy: None,
            companion: false,
        });
        Some(psn)
    }

    /// Records the transmission of one request packet that takes the next `psns` PSNs (a READ
    /// request: its response packets' PSNs; IBA 9.7.2) and returns its PSN. Only that first
    /// PSN can be declared lost and resent; the others are acknowledged with it (the
    /// receiver's SACK covers the whole span, `Reassembly::on_held`) or cumulatively. Call it
    /// in place of [`Self::on_send`] for such a request; `None` when the window is full.
    pub fn on_send_span(&mut self, now: Instant, psns: u32) -> Option<Psn> {
        let psn = self.on_send(now)?;
        // The companions share the request's transmission number: RACK never counts one of
        // them as a later transmission acknowledged.
        let stamp = self.pkts.back().map_or(0, |p| p.stamp);
        for _ in 1..psns {
            self.pkts.push_back(Pkt {
                sent_at: now,
                stamp,
                acked: false,
                lost: false,
                entropy: None,
                companion: true,
            });
        }
        Some(psn)
    }

    /// Records that `psn`, just sent, is a request the receiver holds until the cumulative
    /// PSN reaches it (a READ request or an atomic, `Reassembly::on_held`): no new PSN may go
    /// past it before it is acknowledged ([`Self::past_held_ok`]).
    pub fn set_held_request(&mut self, psn: Psn) {
        self.held_request = Some(psn);
    }

    /// Whether a new PSN may go: the last held request ([`Self::set_held_request`]) is
    /// acknowledged, or there is none. Call it before sending a new packet.
    #[must_use]
    pub fn past_held_ok(&self) -> bool {
        self.held_request.is_none_or(|r| self.is_acked(r))
    }

    /// Asks for request `psn` to be sent again, acknowledged or not (a READ whose responses
    /// went missing: the receiver acknowledged the request when it held it). It comes out of
    /// [`Self::poll_retransmit`] before the lost PSNs.
    pub fn request_again(&mut self, psn: Psn) {
        self.again = Some(psn);
    }

    /// Whether `psn` (sent) is acknowledged, cumulatively or by a SACK.
    #[must_use]
    pub fn is_acked(&self, psn: Psn) -> bool {
        psn.distance(self.base) < 0 || self.is_sacked(psn)
    }

    fn stamp(&mut self) -> u64 {
        let s = self.next_stamp;
        self.next_stamp += 1;
        s
    }

    /// Takes in an ACK: everything up to and including `cum` (the AETH's PSN) arrived, and the
    /// PSNs the `sack` bitmap marks. Call it for every ACK of a QP with the extension on
    /// (docs/multipath.md). Returns the PSNs newly acknowledged (the caller retires their
    /// WQEs when the oldest completes, and recycles their entropies). An ACK whose `cum` is
    /// after the last PSN sent is ignored and counted (rxe's completer ignores such ACKs
    /// too, `check_psn` in rxe_comp.c).
    pub fn on_ack(&mut self, cum: Psn, sack: Option<&SackTrailer>) -> u32 {
        let d = cum.distance(self.base) + 1;
        if d > self.pkts.len() as i32 {
            self.counters.ack_invalid += 1;
            return 0;
        }
        if sack.is_some() {
            self.counters.sack_received += 1;
        }
        let mut newly = 0;
        let mut mark = |p: &mut Pkt, rack: &mut u64| {
            if !p.acked {
                p.acked = true;
                newly += 1;
                *rack = (*rack).max(p.stamp);
            }
        };
        if d > 0 {
            for p in self.pkts.iter_mut().take(d as usize) {
                mark(p, &mut self.rack_stamp);
            }
        }
        if let Some(s) = sack {
            for psn in s.bitmap.psns(cum) {
                let i = psn.distance(self.base);
                if i >= 0
                    && let Some(p) = self.pkts.get_mut(i as usize)
                    && !p.acked
                {
                    mark(p, &mut self.rack_stamp);
                    self.counters.sacked += 1;
                }
            }
        }
        while self.pkts.front().is_some_and(|p| p.acked) {
            self.pkts.pop_front();
            self.base = self.base.next();
        }
        self.detect_losses();
        newly
    }

    /// RACK by transmission count: every unacknowledged packet with a later transmission
    /// `reorder_threshold` or more after it acknowledged is lost.
    fn detect_losses(&mut self) {
        let limit = self.rack_stamp.saturating_sub(self.cfg.reorder_threshold);
        for (i, p) in self.pkts.iter_mut().enumerate() {
            if !p.acked && !p.lost && !p.companion && p.stamp <= limit {
                p.lost = true;
                self.lost.push_back(self.base.wrapping_add(i as u32));
                if let Some(e) = p.entropy {
                    self.lost_entropies.push(e);
                }
            }
        }
    }

    /// When [`Self::handle_timeout`] must be called: the earliest send time plus the
    /// timeout of an unacknowledged packet not already declared lost.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pkts
            .iter()
            .filter(|p| !p.acked && !p.lost && !p.companion)
            .map(|p| p.sent_at + self.cfg.rto)
            .min()
    }

    /// Declares lost every unacknowledged packet sent `rto` or more before `now`. Call it
    /// when the time [`Self::poll_timeout`] returned has come.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (i, p) in self.pkts.iter_mut().enumerate() {
            if !p.acked && !p.lost && !p.companion && p.sent_at + self.cfg.rto <= now {
                p.lost = true;
                self.counters.timeouts += 1;
                self.lost.push_back(self.base.wrapping_add(i as u32));
                if let Some(e) = p.entropy {
                    self.lost_entropies.push(e);
                }
            }
        }
    }

    /// Declares lost every packet in the window not acknowledged and not already declared
    /// lost, whatever its age. Call it when the QP's local ACK timeout expires (IBA
    /// 9.7.6.1.3): what the bitmap covers stays acknowledged, the rest is resent by
    /// [`Self::poll_retransmit`] (selective repeat's answer to a timeout, where go-back-N
    /// resends the whole window).
    pub fn declare_all_lost(&mut self) {
        for (i, p) in self.pkts.iter_mut().enumerate() {
            if !p.acked && !p.lost && !p.companion {
                p.lost = true;
                self.counters.timeouts += 1;
                self.lost.push_back(self.base.wrapping_add(i as u32));
                if let Some(e) = p.entropy {
                    self.lost_entropies.push(e);
                }
            }
        }
    }

    /// The next PSN to resend, recorded as resent at `now`: the caller must send it now
    /// (rebuilt from its WQE, on an entropy other than the one that lost it). Only PSNs
    /// declared lost and still unacknowledged come out. Call it before sending new packets,
    /// until it returns `None`.
    pub fn poll_retransmit(&mut self, now: Instant) -> Option<Psn> {
        if let Some(psn) = self.again.take() {
            self.counters.selective_retransmits += 1;
            return Some(psn);
        }
        while let Some(psn) = self.lost.pop_front() {
            let i = psn.distance(self.base);
            if i < 0 {
                continue; // acknowledged since
            }
            let stamp = self.next_stamp;
            let Some(p) = self.pkts.get_mut(i as usize) else {
                continue;
            };
            if p.acked || !p.lost {
                continue;
            }
            p.lost = false;
            p.sent_at = now;
            p.stamp = stamp;
            self.next_stamp += 1;
            self.counters.selective_retransmits += 1;
            return Some(psn);
        }
        None
    }

    /// Records that the latest transmission of `psn` took entropy `e`. Call it for every
    /// sprayed packet, new or resent, once [`Self::on_send`] or [`Self::poll_retransmit`]
    /// named it; if it is lost, the entropy comes out of [`Self::lost_entropies`].
    pub fn set_entropy(&mut self, psn: Psn, e: Entropy) {
        let i = psn.distance(self.base);
        if i >= 0
            && let Some(p) = self.pkts.get_mut(i as usize)
        {
            p.entropy = Some(e);
        }
    }

    /// Whether `psn` is in the window (sent, not yet acknowledged cumulatively).
    #[must_use]
    pub fn in_window(&self, psn: Psn) -> bool {
        let i = psn.distance(self.base);
        i >= 0 && (i as usize) < self.pkts.len()
    }

    /// The entropy the latest transmission of `psn` took, if it was sprayed and is in the
    /// window.
    #[must_use]
    pub fn entropy_of(&self, psn: Psn) -> Option<Entropy> {
        let i = psn.distance(self.base);
        if i < 0 {
            return None;
        }
        self.pkts.get(i as usize)?.entropy
    }

    /// The entropies of the sprayed packets declared lost since the last call, oldest first.
    /// Call it before spraying the next packet and retire them
    /// ([`super::Entropies::on_bad`]).
    pub fn lost_entropies(&mut self) -> std::vec::Drain<'_, Entropy> {
        self.lost_entropies.drain(..)
    }

    /// Whether `psn` is in the window and acknowledged (by the cumulative PSN it would have
    /// left the window, so this is the SACKed ones).
    #[must_use]
    pub fn is_sacked(&self, psn: Psn) -> bool {
        let i = psn.distance(self.base);
        i >= 0 && self.pkts.get(i as usize).is_some_and(|p| p.acked)
    }
}
