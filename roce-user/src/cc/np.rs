//! The DCQCN notification point: CE-marked packets in, CNPs out.

use super::{CcStats, DcqcnConfig, Instant};
use crate::wire::{Ecn, PathRepr, Qpn, RoceRepr};

/// The notification point of one QP (the side that receives data).
///
/// DCQCN (Zhu et al. 2015 §3.1; htsim `DCQCNSink`; mlx5 `np_min_time_between_cnps`): when a
/// packet arrives with ECN CE, the NP sends a CNP to the sender's QP unless it sent one less
/// than `min_time_between_cnps` ago. CE packets inside that interval are counted but get no
/// CNP of their own (the mlx5 behaviour; htsim's deferred CNP at the end of the interval is not
/// modelled).
#[derive(Debug, Clone)]
pub struct NotificationPoint {
    enabled: bool,
    interval: core::time::Duration,
    last_cnp: Option<Instant>,
    stats: CcStats,
}

impl NotificationPoint {
    /// A notification point with `config`'s `np_enabled` and `min_time_between_cnps`.
    #[must_use]
    pub fn new(config: &DcqcnConfig) -> Self {
        Self {
            enabled: config.np_enabled,
            interval: config.cnp_interval(),
            last_cnp: None,
            stats: CcStats::default(),
        }
    }

    /// Call for every RoCE data packet received for this QP (not for CNPs), with the ECN bits of
    /// its IP header ([`crate::wire::Frame::ecn`]). Returns `true` when a CNP must be sent now:
    /// build it with [`cnp_frame`]. Counts `np_ecn_marked_roce_packets` and `np_cnp_sent` (the
    /// caller must send the CNP when told to, or the count is wrong).
    #[must_use]
    pub fn on_packet(&mut self, now: Instant, ecn: Ecn) -> bool {
        if ecn != Ecn::Ce {
            return false;
        }
        self.stats.np_ecn_marked_roce_packets += 1;
        if !self.enabled {
            return false;
        }
        let due = self
            .last_cnp
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if due {
            self.last_cnp = Some(now);
            self.stats.np_cnp_sent += 1;
        }
        due
    }

    /// Time of the last CNP decided, if any.
    #[must_use]
    pub const fn last_cnp(&self) -> Option<Instant> {
        self.last_cnp
    }

    /// NP counters (`np_*`; the `rp_*` fields stay zero).
    #[must_use]
    pub const fn stats(&self) -> CcStats {
        self.stats
    }
}

/// The CNP a notification point sends to `dest_qp` (the data sender's QPN) over `path` (the
/// path from us to the data sender, as the QP's address vector gives it): `path` with its DSCP
/// replaced by `config.cnp_dscp`, and [`RoceRepr::cnp`] (opcode 0x81, BECN set, P_Key 0xffff,
/// PSN 0, 16 reserved zero bytes; IBA Annex A17.9.3). ECN is left as `path` has it (the
/// Mellanox example CNP carries ECT(1), libconntrack-cm's ECT(0)).
///
/// Emit it with `wire::emit_frame(&path, &roce, &[], buf)`.
#[must_use]
pub fn cnp_frame(config: &DcqcnConfig, path: &PathRepr, dest_qp: Qpn) -> (PathRepr, RoceRepr) {
    let mut p = *path;
    p.dscp = config.cnp_dscp & 0x3f;
    (p, RoceRepr::cnp(dest_qp))
}

#[cfg(test)]
mod tests {
    use core::net::Ipv4Addr;

    use super::*;
    use crate::wire::{EthernetAddress, IpPath, Opcode, emit_frame, parse_frame};

    #[test]
    fn one_cnp_per_interval() {
        let cfg = DcqcnConfig {
            min_time_between_cnps: 50,
            ..DcqcnConfig::default()
        };
        let mut np = NotificationPoint::new(&cfg);
        let us = Instant::from_micros;
        assert!(!np.on_packet(us(0), Ecn::Ect0));
        assert!(np.on_packet(us(1), Ecn::Ce));
        assert!(!np.on_packet(us(2), Ecn::Ce));
        assert!(!np.on_packet(us(50), Ecn::Ce)); // 49 µs after the first CNP
        assert!(np.on_packet(us(51), Ecn::Ce)); // exactly 50 µs
        assert!(!np.on_packet(us(60), Ecn::NotEct));
        assert!(np.on_packet(us(200), Ecn::Ce));
        let s = np.stats();
        assert_eq!(s.np_ecn_marked_roce_packets, 5);
        assert_eq!(s.np_cnp_sent, 3);
        assert_eq!(s.rp_cnp_handled, 0);
        assert_eq!(np.last_cnp(), Some(us(200)));
    }

    #[test]
    fn disabled_counts_marks_but_sends_nothing() {
        let cfg = DcqcnConfig {
            np_enabled: false,
            ..DcqcnConfig::default()
        };
        let mut np = NotificationPoint::new(&cfg);
        assert!(!np.on_packet(Instant::from_nanos(0), Ecn::Ce));
        assert_eq!(np.stats().np_ecn_marked_roce_packets, 1);
        assert_eq!(np.stats().np_cnp_sent, 0);
    }

    #[test]
    fn cnp_frame_matches_the_mellanox_example_layout() {
        let cfg = DcqcnConfig::default();
        let mut path = PathRepr::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            EthernetAddress([2, 0, 0, 0, 0, 2]),
            IpPath::V4 {
                src: Ipv4Addr::new(22, 22, 22, 8),
                dst: Ipv4Addr::new(22, 22, 22, 7),
            },
        );
        path.ecn = Ecn::Ect0;
        let (p, roce) = cnp_frame(&cfg, &path, Qpn::new(0xd2));
        let mut buf = [0u8; 128];
        let n = emit_frame(&p, &roce, &[], &mut buf).unwrap();
        // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + 16 reserved + ICRC 4.
        assert_eq!(n, 74);
        assert_eq!(buf[15], (48 << 2) | 2, "TOS: DSCP 48, ECT(0)");
        let bth = &buf[42..54];
        assert_eq!(bth, &[0x81, 0, 0xff, 0xff, 0x40, 0, 0, 0xd2, 0, 0, 0, 0]);
        assert_eq!(&buf[54..70], &[0u8; 16]);
        let f = parse_frame(&buf[..n]).unwrap();
        assert!(f.icrc_ok);
        assert_eq!(f.roce.bth.opcode, Opcode::CNP);
        assert!(f.roce.bth.becn);
        assert_eq!(f.ip.dscp(), 48);
    }
}
