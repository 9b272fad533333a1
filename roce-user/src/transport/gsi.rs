//! QP 1, the general services interface (GSI, IBTA 3.6.2 and 13.5), of a device that runs a
//! communication manager: it carries the CM's 256-byte MADs ([`crate::ibcm`]) as RoCE v2 UD
//! SEND_ONLY packets, with the GSI Q_Key and the default P_Key, to and from the peers' QP 1.
//!
//! Sans-I/O like the rest of the transport: [`super::Device`] hands it every frame to QP 1
//! ([`Gsi::handle_frame`]), asks it for frames to send ([`Gsi::poll_transmit`]) and runs its
//! timers; the layer above calls the CM ([`Gsi::cm_mut`]) and tells it the path to a peer it
//! connects to ([`Gsi::set_path`], resolved from the kernel's neighbour table as for a UD
//! address handle). A peer that sent us a MAD is answered on the path its frame came by
//! (MACs, IPs and VLAN tags swapped), so a REJ or REP needs no lookup.

use std::collections::BTreeMap;

use roce_common::opcode::Opcode;

use super::counters::QpCounters;
use super::timer::Instant;
use crate::ibcm::{Cm, CmConfig, Dropped, Gid, MAD_LEN, MadError};
use crate::wire::{
    BthRepr, DethRepr, Frame, PKey, PathRepr, Psn, QKey, Qpn, RoceRepr, emit_frame,
    frame::rxe_udp_src_port,
};

/// Paths to peers kept at most; a MAD from a new peer beyond it is still handled, but
/// answered only if its path is set by the consumer ([`GsiStats::paths_full`]).
pub const MAX_GSI_PATHS: usize = 4096;

/// Why QP 1 dropped a frame, or could not send a MAD; every one is also counted in the QP's
/// `rx_dropped` or `send_err`.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct GsiStats {
    /// Not a UD SEND_ONLY (rxe: a GSI QP is UD; MADs come in one packet).
    pub bad_opcode: u64,
    /// P_Key other than the default 0xFFFF (the only entry of our P_Key table; rxe
    /// `check_keys`).
    pub bad_pkey: u64,
    /// DETH Q_Key other than 0x80010000 (IBTA 13.5.3.2, rxe `check_keys` for QP 1).
    pub bad_qkey: u64,
    /// Payload other than one 256-byte MAD (IBTA 13.4.1).
    pub bad_length: u64,
    /// A MAD of another management class (no agent of ours for it).
    pub not_cm: u64,
    /// A CM MAD the CM dropped (malformed, unknown connection, wrong state; the CM's own
    /// counters say which).
    pub cm_dropped: u64,
    /// A MAD to send to a peer with no known path (it was never heard from and the consumer
    /// set none); the CM's retransmission tries again.
    pub no_path: u64,
    /// A peer's path not learned because [`MAX_GSI_PATHS`] were kept.
    pub paths_full: u64,
}

/// A path to a peer's QP 1, and whether the consumer set it (it is then not replaced by the
/// path a received frame came by).
#[derive(Clone, Copy, Debug)]
struct PeerPath {
    path: PathRepr,
    set: bool,
}

/// QP 1 of a device and its CM agent.
#[derive(Debug)]
pub struct Gsi {
    cm: Cm,
    paths: BTreeMap<Gid, PeerPath>,
    counters: QpCounters,
    stats: GsiStats,
    next_psn: Psn,
}

impl Gsi {
    /// QP 1 with a CM agent of `config` (its CA GUID: [`crate::ibcm::CaGuid::from_mac`]).
    #[must_use]
    pub fn new(config: CmConfig) -> Self {
        Self {
            cm: Cm::new(config),
            paths: BTreeMap::new(),
            counters: QpCounters::default(),
            stats: GsiStats::default(),
            next_psn: Psn::new(0),
        }
    }

    /// The CM agent.
    #[must_use]
    pub const fn cm(&self) -> &Cm {
        &self.cm
    }

    /// The CM agent, to listen, connect, accept and take its events. Its MADs go out at the
    /// device's next [`super::Device::poll_transmit`].
    pub const fn cm_mut(&mut self) -> &mut Cm {
        &mut self.cm
    }

    /// QP 1's counters, as any QP's: `rcvd_pkts` (MADs accepted), `sent_pkts`, `rx_dropped`,
    /// `send_err`.
    #[must_use]
    pub const fn counters(&self) -> &QpCounters {
        &self.counters
    }

    /// Why frames were dropped and MADs not sent.
    #[must_use]
    pub const fn stats(&self) -> GsiStats {
        self.stats
    }

    /// Sets the path to `peer`'s QP 1 (its MAC from the kernel's neighbour table). Call it
    /// before [`Cm::connect`] to a peer; a set path is kept until [`Gsi::forget_path`].
    /// The UDP source port is rxe's for QP 1.
    pub fn set_path(&mut self, peer: Gid, mut path: PathRepr) {
        path.udp_src_port = rxe_udp_src_port(Qpn::GSI);
        self.paths.insert(peer, PeerPath { path, set: true });
    }

    /// Forgets the path to `peer`.
    pub fn forget_path(&mut self, peer: Gid) {
        self.paths.remove(&peer);
    }

    /// Handles a frame to QP 1 whose ICRC is good: the GSI checks (UD SEND_ONLY, P_Key
    /// 0xFFFF, Q_Key GSI, a 256-byte MAD; rxe_recv.c `check_keys`, IBTA 13.5.3), then the CM.
    /// Every drop is counted.
    pub fn handle_frame(&mut self, now: Instant, f: &Frame<'_>) {
        let bth = &f.roce.bth;
        if bth.opcode != Opcode::UD_SEND_ONLY {
            self.stats.bad_opcode += 1;
            self.counters.rx_dropped += 1;
            return;
        }
        if bth.pkey != PKey::DEFAULT {
            self.stats.bad_pkey += 1;
            self.counters.rx_dropped += 1;
            return;
        }
        if f.roce.deth.map(|d| d.qkey) != Some(QKey::GSI) {
            self.stats.bad_qkey += 1;
            self.counters.rx_dropped += 1;
            return;
        }
        if f.payload.len() != MAD_LEN {
            self.stats.bad_length += 1;
            self.counters.rx_dropped += 1;
            return;
        }
        let from = Gid::from_ip(f.src_ip());
        match self.cm.handle_mad(now, from, f.payload) {
            Ok(()) => self.counters.rcvd_pkts += 1,
            Err(Dropped::Malformed(MadError::BadClass(_))) => {
                self.stats.not_cm += 1;
                self.counters.rx_dropped += 1;
                return;
            }
            Err(Dropped::Malformed(_)) => {
                self.stats.cm_dropped += 1;
                self.counters.rx_dropped += 1;
                return;
            }
            // The CM may have answered (a REJ to a stale or unknown connection): learn the
            // path below so that the answer goes.
            Err(_) => {
                self.stats.cm_dropped += 1;
                self.counters.rx_dropped += 1;
            }
        }
        self.learn(from, f);
    }

    /// Keeps the path back to the sender of `f`, unless the consumer set one.
    fn learn(&mut self, from: Gid, f: &Frame<'_>) {
        let mut path = f.reply_path();
        path.udp_src_port = rxe_udp_src_port(Qpn::GSI);
        path.udp_dst_port = f.udp.dst_port;
        if let Some(p) = self.paths.get_mut(&from) {
            if !p.set {
                p.path = path;
            }
        } else if self.paths.len() < MAX_GSI_PATHS {
            self.paths.insert(from, PeerPath { path, set: false });
        } else {
            self.stats.paths_full += 1;
        }
    }

    /// Whether a MAD waits to be sent.
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        self.cm.has_transmit()
    }

    /// Writes the next MAD the CM has queued into `buf` as a UD SEND_ONLY to the peer's QP 1
    /// (DETH Q_Key GSI, source QP 1, P_Key 0xFFFF; ICRC computed by [`emit_frame`]) and
    /// returns the frame's length, or `None` when nothing is queued. A MAD to a peer with no
    /// path, or that does not fit `buf`, is counted in `send_err` and skipped: the CM resends
    /// requests on its timers.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<usize> {
        while let Some(t) = self.cm.poll_transmit() {
            let Some(p) = self.paths.get(&t.dest) else {
                self.stats.no_path += 1;
                self.counters.send_err += 1;
                continue;
            };
            let psn = self.next_psn;
            let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, psn);
            bth.pkey = PKey::DEFAULT;
            let mut r = RoceRepr::new(bth);
            r.deth = Some(DethRepr {
                qkey: QKey::GSI,
                src_qp: Qpn::GSI,
            });
            match emit_frame(&p.path, &r, &t.mad[..], buf) {
                Ok(n) => {
                    self.next_psn = psn.wrapping_add(1);
                    self.counters.sent_pkts += 1;
                    return Some(n);
                }
                Err(_) => self.counters.send_err += 1,
            }
        }
        None
    }

    /// When [`Gsi::handle_timeout`] has work (the CM's retransmissions and TimeWait exits).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    /// Runs the CM's timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use core::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::ibcm::{
        AcceptParams, CaGuid, CmMad, CmMsg, CmaHdr, ConnectParams, Event, PortSpace, RejReason,
        ServiceId, State,
    };
    use crate::transport::{Device, DeviceConfig, MAX_FRAME_LEN};
    use crate::wire::{EthernetAddress, IpPath, parse_frame};

    const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn dev(mac: [u8; 6]) -> Device {
        let mut d = Device::new(DeviceConfig::default());
        assert!(d.enable_gsi(CmConfig::new(CaGuid::from_mac(mac))));
        assert!(!d.enable_gsi(CmConfig::new(CaGuid::from_mac(mac))));
        d
    }

    fn gid(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }

    fn drain(d: &mut Device) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        while let Some(t) = d.poll_transmit(Instant::from_nanos(0), &mut buf) {
            assert_eq!(t.qpn, Qpn::GSI);
            out.push(buf[..t.size].to_vec());
        }
        out
    }

    fn deliver(to: &mut Device, frames: &[Vec<u8>]) {
        for f in frames {
            to.handle_packet(Instant::from_nanos(0), f);
        }
    }

    fn cm(d: &mut Device) -> &mut Cm {
        d.gsi_mut().unwrap().cm_mut()
    }

    fn params(port: u16) -> ConnectParams {
        ConnectParams::rdma_cm(
            (IP_A, 40000).into(),
            (IP_B, port).into(),
            Qpn::new(0x11),
            Psn::new(7),
            b"hi",
        )
    }

    /// A path from A to B's QP 1, as the API resolves it.
    fn set_path_a_to_b(a: &mut Device) {
        let p = PathRepr::new(
            EthernetAddress(MAC_A),
            EthernetAddress(MAC_B),
            IpPath::V4 {
                src: IP_A,
                dst: IP_B,
            },
        );
        a.gsi_mut().unwrap().set_path(gid(IP_B), p);
    }

    #[test]
    fn mads_go_as_ud_sends_to_qp1_with_the_gsi_keys_and_a_good_icrc() {
        let mut a = dev(MAC_A);
        set_path_a_to_b(&mut a);
        let now = Instant::from_nanos(0);
        cm(&mut a).connect(now, &params(7174)).unwrap();
        let frames = drain(&mut a);
        assert_eq!(frames.len(), 1);
        let f = parse_frame(&frames[0]).unwrap();
        assert!(f.icrc_ok);
        assert_eq!(f.roce.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!(f.roce.bth.dest_qp, Qpn::GSI);
        assert_eq!(f.roce.bth.pkey, PKey::DEFAULT);
        let deth = f.roce.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qp), (QKey::GSI, Qpn::GSI));
        assert_eq!(f.payload.len(), MAD_LEN);
        assert_eq!(f.eth.dst_addr, EthernetAddress(MAC_B));
        assert_eq!(f.udp.src_port, rxe_udp_src_port(Qpn::GSI));
        let mad = CmMad::decode(f.payload).unwrap();
        assert!(matches!(mad.msg, CmMsg::Req(ref r) if r.local_ca_guid == CaGuid::from_mac(MAC_A)));
        assert_eq!(a.gsi().unwrap().counters().sent_pkts, 1);
        assert_eq!(a.device_counters().sent_pkts, 1);
    }

    #[test]
    fn two_devices_connect_through_qp1_and_a_closed_port_is_rejected() {
        let (mut a, mut b) = (dev(MAC_A), dev(MAC_B));
        set_path_a_to_b(&mut a);
        let now = Instant::from_nanos(0);
        let sid = ServiceId::rdma_cm(PortSpace::Tcp, 7174);
        cm(&mut b).listen(sid).unwrap();
        // No listener on 7175: B answers the REQ with REJ "invalid service ID" on the path
        // the REQ came by.
        let closed = cm(&mut a).connect(now, &params(7175)).unwrap();
        let req = drain(&mut a);
        deliver(&mut b, &req);
        let rej = drain(&mut b);
        assert_eq!(rej.len(), 1);
        assert_eq!(
            parse_frame(&rej[0]).unwrap().eth.dst_addr,
            EthernetAddress(MAC_A)
        );
        deliver(&mut a, &rej);
        assert!(matches!(cm(&mut a).poll_event(),
            Some(Event::Rejected { id, reason, .. }) if id == closed && reason == RejReason::INVALID_SERVICE_ID));
        assert_eq!(cm(&mut b).stats().no_listener, 1);
        // Port 7174: REQ, REP, RTU.
        let id = cm(&mut a).connect(now, &params(7174)).unwrap();
        let req = drain(&mut a);
        deliver(&mut b, &req);
        let Some(Event::ConnectRequest { id: bid, from, req }) = cm(&mut b).poll_event() else {
            panic!("no connect request");
        };
        assert_eq!(from, gid(IP_A));
        assert_eq!(req.service_id, sid);
        let h = CmaHdr::parse(&req.private_data).unwrap();
        assert_eq!((h.src, h.dst), (IpAddr::V4(IP_A), IpAddr::V4(IP_B)));
        let accept = AcceptParams {
            qpn: Qpn::new(0x22),
            starting_psn: Psn::new(9),
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            target_ack_delay: 0,
            multipath_hint: false,
            private_data: Vec::new(),
        };
        cm(&mut b).accept(now, bid, &accept).unwrap();
        let rep = drain(&mut b);
        deliver(&mut a, &rep);
        let Some(Event::Reply { id: rid, rep }) = cm(&mut a).poll_event() else {
            panic!("no reply");
        };
        assert_eq!((rid, rep.local_qpn), (id, Qpn::new(0x22)));
        cm(&mut a).ready_to_use(id, &[]).unwrap();
        assert_eq!(cm(&mut a).poll_event(), Some(Event::Established { id }));
        let rtu = drain(&mut a);
        deliver(&mut b, &rtu);
        assert_eq!(
            cm(&mut b).poll_event(),
            Some(Event::Established { id: bid })
        );
        assert_eq!(cm(&mut b).state(bid), Some(State::Established));
        // Counted like any QP: B received two REQs and an RTU, sent a REJ and a REP.
        let c = b.gsi().unwrap().counters();
        assert_eq!((c.rcvd_pkts, c.sent_pkts, c.rx_dropped), (3, 2, 0));
        assert_eq!(b.device_counters().rx_unknown_qp, 0);
    }

    /// A frame to QP 1 with `edit` applied to it, re-emitted with a good ICRC.
    fn req_frame(edit: impl FnOnce(&mut RoceRepr, &mut Vec<u8>)) -> Vec<u8> {
        let mut a = dev(MAC_A);
        set_path_a_to_b(&mut a);
        cm(&mut a)
            .connect(Instant::from_nanos(0), &params(7174))
            .unwrap();
        let good = drain(&mut a).remove(0);
        let f = parse_frame(&good).unwrap();
        let (mut r, mut payload) = (f.roce, f.payload.to_vec());
        edit(&mut r, &mut payload);
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        let mut path = PathRepr::new(
            EthernetAddress(MAC_A),
            EthernetAddress(MAC_B),
            IpPath::V4 {
                src: IP_A,
                dst: IP_B,
            },
        );
        path.udp_src_port = rxe_udp_src_port(Qpn::GSI);
        let n = emit_frame(&path, &r, &payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn bad_gsi_frames_are_counted_drops() {
        let mut b = dev(MAC_B);
        cm(&mut b)
            .listen(ServiceId::rdma_cm(PortSpace::Tcp, 7174))
            .unwrap();
        type Edit = fn(&mut RoceRepr, &mut Vec<u8>);
        type Stat = fn(&GsiStats) -> u64;
        let cases: [(Edit, Stat); 5] = [
            (
                |r, _| r.deth.as_mut().unwrap().qkey = QKey::new(0x1234),
                |s| s.bad_qkey,
            ),
            (|r, _| r.bth.pkey = PKey::new(0x7fff), |s| s.bad_pkey),
            (|_, p| p.truncate(200), |s| s.bad_length),
            (|_, p| p[1] = 0x01, |s| s.not_cm), // management class: subnet management
            (|_, p| p[0] = 9, |s| s.cm_dropped), // base version
        ];
        for (i, (edit, stat)) in cases.into_iter().enumerate() {
            let f = req_frame(edit);
            b.handle_packet(Instant::from_nanos(0), &f);
            let g = b.gsi().unwrap();
            assert_eq!(stat(&g.stats()), 1, "case {i}: {:?}", g.stats());
            assert_eq!(g.counters().rx_dropped, i as u64 + 1, "case {i}");
        }
        assert_eq!(b.gsi().unwrap().counters().rcvd_pkts, 0);
        assert!(cm(&mut b).poll_event().is_none());
        assert!(drain(&mut b).is_empty());
    }

    #[test]
    fn without_a_cm_agent_qp1_is_an_unknown_qp() {
        let mut b = Device::new(DeviceConfig::default());
        b.handle_packet(Instant::from_nanos(0), &req_frame(|_, _| {}));
        assert_eq!(b.device_counters().rx_unknown_qp, 1);
        assert!(b.gsi().is_none());
    }

    #[test]
    fn a_mad_to_a_peer_without_a_path_is_counted_and_the_req_is_resent_later() {
        let mut a = dev(MAC_A);
        let now = Instant::from_nanos(0);
        cm(&mut a).connect(now, &params(7174)).unwrap();
        assert!(drain(&mut a).is_empty());
        assert_eq!(a.gsi().unwrap().stats().no_path, 1);
        assert_eq!(a.gsi().unwrap().counters().send_err, 1);
        let t = a.poll_timeout().expect("the REQ's retransmission timer");
        set_path_a_to_b(&mut a);
        a.handle_timeout(t);
        assert_eq!(drain(&mut a).len(), 1);
    }
}
