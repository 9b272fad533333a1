//! Everything congestion control keeps for one RC QP, behind the calls the transport makes.

use super::{
    CcAlgorithm, CcStats, DcqcnConfig, Instant, LossUndo, NotificationPoint, ReactionPoint, Stage,
    cnp_frame,
};
use crate::wire::{Ecn, PathRepr, Qpn, RoceRepr};
use core::time::Duration;

/// The congestion state of one QP as `roce stats -s` and JSON show it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CcSnapshot {
    /// Current rate, bits/s (the line rate when not limited).
    pub rate_bps: u64,
    /// Target rate, bits/s.
    pub target_bps: u64,
    /// α as a fraction.
    pub alpha: f64,
    /// α in 1024ths, as mlx5 keeps it.
    pub alpha_fixed: u32,
    /// Increase stage.
    pub stage: Stage,
    /// Whether the rate is limited.
    pub limited: bool,
    /// CNPs received.
    pub cnps: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Counters.
    #[serde(skip)]
    pub stats: CcStats,
    /// The algorithm that limits the QP.
    pub algorithm: CcAlgorithm,
    /// Swift's window, packets (Swift QPs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwnd: Option<f64>,
    /// Swift's latest RTT sample, ns (Swift QPs with a sample only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt_ns: Option<u64>,
}

/// The notification point (we receive data) and reaction point (we send data) of one RC QP.
///
/// The transport keeps one per QP and calls, with its own `now`:
/// - [`Self::data_ecn`] for the ECN codepoint of every packet it sends (put it in the
///   QP's `PathRepr::ecn`);
/// - [`Self::on_data_received`] for every non-CNP packet received on the QP, and sends the CNP
///   it returns (`wire::emit_frame(&path, &roce, &[], buf)`);
/// - [`Self::on_cnp_received`] for every CNP (opcode 0x81) addressed to the QP;
/// - [`Self::next_send_time`] before it emits a request packet, [`Self::on_sent`] after;
/// - [`Self::poll_timeout`] / [`Self::handle_timeout`] along with its own timers.
#[derive(Debug, Clone)]
pub struct QpCongestion {
    config: DcqcnConfig,
    np: NotificationPoint,
    rp: ReactionPoint,
}

impl QpCongestion {
    /// Congestion control for a QP created at `now` on a link of `line_rate_bps`.
    #[must_use]
    pub fn new(config: &DcqcnConfig, line_rate_bps: u64, now: Instant) -> Self {
        Self {
            config: *config,
            np: NotificationPoint::new(config),
            rp: ReactionPoint::new(config, line_rate_bps, now),
        }
    }

    /// The ECN codepoint for packets this QP sends: ECT(0) when the reaction point is on (so
    /// switches may mark them CE instead of dropping), Not-ECT when it is off (RFC 3168: only
    /// a transport that reacts to CE may send ECT).
    #[must_use]
    pub const fn data_ecn(&self) -> Ecn {
        if self.config.rp_enabled {
            Ecn::Ect0
        } else {
            Ecn::NotEct
        }
    }

    /// A non-CNP packet arrived for this QP with `ecn`; `path_to_peer` is the QP's path to the
    /// sender and `peer_qpn` the sender's QPN. Returns the CNP to send now, if one is due.
    #[must_use]
    pub fn on_data_received(
        &mut self,
        now: Instant,
        ecn: Ecn,
        path_to_peer: &PathRepr,
        peer_qpn: Qpn,
    ) -> Option<(PathRepr, RoceRepr)> {
        self.np
            .on_packet(now, ecn)
            .then(|| cnp_frame(&self.config, path_to_peer, peer_qpn))
    }

    /// A CNP arrived for this QP.
    pub fn on_cnp_received(&mut self, now: Instant) {
        self.rp.on_cnp(now);
    }

    /// The transport detected a loss on this QP: call when the requester starts a retry (go
    /// back N after a PSN sequence error NAK or the ACK timeout) and when the responder
    /// replays a READ without a measure of what the requester took
    /// ([`Self::on_loss_delivered`] with one). See [`ReactionPoint::on_loss`].
    /// Returns what the cut changed, if it cut ([`ReactionPoint::undo_loss`]).
    pub fn on_loss(&mut self, now: Instant) -> Option<LossUndo> {
        self.rp.on_loss(now)
    }

    /// The loss `undo` records proved spurious: see [`ReactionPoint::undo_loss`].
    pub fn undo_loss(&mut self, now: Instant, undo: &LossUndo) -> bool {
        self.rp.undo_loss(now, undo)
    }

    /// The responder replayed a READ whose requester had taken the responses up to the replay
    /// in order, at `delivered_bps` over `feedback`: see [`ReactionPoint::on_loss_delivered`].
    pub fn on_loss_delivered(&mut self, now: Instant, delivered_bps: u64, feedback: Duration) {
        self.rp.on_loss_delivered(now, delivered_bps, feedback);
    }

    /// The earliest time a packet of `bytes` may be sent.
    #[must_use]
    pub fn next_send_time(&self, now: Instant, bytes: u32) -> Instant {
        self.rp.next_send_time(now, bytes)
    }

    /// A packet of `bytes` was ready but [`Self::next_send_time`] put it later than now: the
    /// rate limits the QP ([`ReactionPoint::on_paced`]).
    pub fn on_paced(&mut self, bytes: u32) {
        self.rp.on_paced(bytes);
    }

    /// A packet of `bytes` (frame length) was sent.
    pub fn on_sent(&mut self, now: Instant, bytes: u32) {
        self.rp.on_sent(now, bytes);
    }

    /// When [`Self::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.rp.poll_timeout()
    }

    /// Fires due timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.rp.handle_timeout(now);
    }

    /// NP and RP counters together.
    #[must_use]
    pub fn stats(&self) -> CcStats {
        let mut s = self.np.stats();
        s.add(&self.rp.stats());
        s
    }

    /// The state for `roce stats -s`.
    #[must_use]
    pub fn snapshot(&self) -> CcSnapshot {
        CcSnapshot {
            rate_bps: self.rp.rate_bps(),
            target_bps: self.rp.target_bps(),
            alpha: self.rp.alpha(),
            alpha_fixed: self.rp.alpha_fixed(),
            stage: self.rp.stage(),
            limited: self.rp.is_limited(),
            cnps: self.rp.cnps(),
            bytes: self.rp.bytes_sent(),
            stats: self.stats(),
            algorithm: if self.config.rp_enabled {
                CcAlgorithm::Dcqcn
            } else {
                CcAlgorithm::Off
            },
            cwnd: None,
            rtt_ns: None,
        }
    }

    /// The reaction point.
    #[must_use]
    pub const fn rp(&self) -> &ReactionPoint {
        &self.rp
    }

    /// The notification point.
    #[must_use]
    pub const fn np(&self) -> &NotificationPoint {
        &self.np
    }
}

#[cfg(test)]
mod tests {
    use core::net::Ipv4Addr;

    use super::*;
    use crate::wire::{EthernetAddress, IpPath, Opcode};

    #[test]
    fn two_qps_close_the_loop() {
        // Requester R sends to responder S; a CE mark at S makes a CNP that cuts R.
        let cfg = DcqcnConfig::default();
        let us = Instant::from_micros;
        let mut r = QpCongestion::new(&cfg, 10_000_000_000, us(0));
        let mut s = QpCongestion::new(&cfg, 10_000_000_000, us(0));
        assert_eq!(r.data_ecn(), Ecn::Ect0);
        let path = PathRepr::new(
            EthernetAddress([2, 0, 0, 0, 0, 2]),
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            IpPath::V4 {
                src: Ipv4Addr::new(10, 0, 0, 2),
                dst: Ipv4Addr::new(10, 0, 0, 1),
            },
        );
        assert!(
            s.on_data_received(us(1), Ecn::Ect0, &path, Qpn::new(0x11))
                .is_none()
        );
        let (p, cnp) = s
            .on_data_received(us(2), Ecn::Ce, &path, Qpn::new(0x11))
            .expect("a CNP");
        assert_eq!(p.dscp, 48);
        assert_eq!(cnp.bth.opcode, Opcode::CNP);
        assert_eq!(cnp.bth.dest_qp, Qpn::new(0x11));
        assert!(
            s.on_data_received(us(3), Ecn::Ce, &path, Qpn::new(0x11))
                .is_none()
        );
        r.on_cnp_received(us(5));
        let snap = r.snapshot();
        assert_eq!(snap.rate_bps, 5_004_882_813);
        assert!(snap.limited);
        assert_eq!(snap.stats.rp_cnp_handled, 1);
        assert_eq!(s.stats().np_cnp_sent, 1);
        assert_eq!(s.stats().np_ecn_marked_roce_packets, 2);
        let off = DcqcnConfig {
            rp_enabled: false,
            ..cfg
        };
        assert_eq!(QpCongestion::new(&off, 1, us(0)).data_ecn(), Ecn::NotEct);
        let json = serde_json::to_value(snap).unwrap();
        assert_eq!(json["stage"]["phase"], "fast_recovery");
        assert_eq!(json["rate_bps"], 5_004_882_813u64);
    }
}
