//! One test per responder, completer and requester rule of reference/roce-v2.md §2.
//!
//! Responder and completer rules are tested on one device whose peer is played by the test:
//! crafted packets go in through [`Device::handle_decoded`], and what comes out of
//! [`Device::poll_transmit`] is parsed back with the wire module.
//!
//! This file is the harness (`H`, one RC QP in RTS whose peer the test plays, and the packet
//! builders); the rules are in one file per family.

use core::net::IpAddr;

use super::sim::{
    Bottleneck, Link, Pair, RcConfig, Side, bring_up, connect_rc, connect_rc_ports, ip, path_index,
};
use super::timer::local_ack_timeout;
use super::*;
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr,
    ImmDtRepr,
    NakCode::{
        InvalidRequest, PsnSequenceError, RemoteAccessError, RemoteOperationalError, Unknown,
    },
    RethRepr, RnrTimer, RoceRepr, parse_frame,
};
use AethSyndrome::Nak;

mod completer;
mod multipath;
mod mw;
mod pair;
mod paths;
mod read_clock;
mod recv;
mod requester;
mod responder;
mod sched;
mod srq;
mod state;
mod swift;
mod uc;
mod ud;

const PEER: u32 = 0x77;
const RQ_PSN: u32 = 100;
const SQ_PSN: u32 = 500;
const BASE: u64 = 0x1000;

struct H {
    d: Device,
    pd: PdId,
    qpn: Qpn,
    cq: CqId,
    now: Instant,
    mr: MrInfo,
    mtu: u32,
}

/// A QP brought up with `cfg` on a device that answers every AckReq with an ACK of its own,
/// as rxe does, so that a rule test sees one answer per request however many it feeds before
/// it looks ([`h_coalescing`] for the default device, which merges the ACKs of one batch).
fn h_with(cfg: &RcConfig) -> H {
    h_on(
        cfg,
        DeviceConfig {
            coalesce_acks: false,
            ..DeviceConfig::default()
        },
    )
}

/// [`h`] on the default device: the ACKs of the requests fed between two looks at the
/// transmit side (one receive batch) are coalesced ([`DeviceConfig::coalesce_acks`]).
fn h_coalescing() -> H {
    h_on(&RcConfig::default(), DeviceConfig::default())
}

/// [`h_with`] on a device made with `config`.
fn h_on(cfg: &RcConfig, config: DeviceConfig) -> H {
    let mut d = Device::new(config);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(cfg.cq_depth).unwrap();
    let qpn = d
        .create_qp(QpInit {
            cap: cfg.cap,
            ..QpInit::new(QpType::Rc, pd, cq)
        })
        .unwrap();
    bring_up(
        &mut d,
        qpn,
        Side::B,
        Qpn::new(PEER),
        Psn::new(SQ_PSN),
        Psn::new(RQ_PSN),
        cfg,
    );
    let mr = d.reg_mr(pd, vec![0; 1 << 18], BASE, Access::all()).unwrap();
    H {
        d,
        pd,
        qpn,
        cq,
        now: Instant::ZERO,
        mr,
        mtu: cfg.mtu.bytes(),
    }
}

fn h() -> H {
    h_with(&RcConfig::default())
}

fn hdr(op: Opcode, psn: u32) -> RoceRepr {
    let mut bth = BthRepr::new(op, Qpn::new(0), Psn::new(psn));
    bth.ack_req = op.info().unwrap().ends_message();
    RoceRepr::new(bth)
}

fn with_reth(mut h: RoceRepr, va: u64, rkey: RKey, dma_len: u32) -> RoceRepr {
    h.reth = Some(RethRepr { va, rkey, dma_len });
    h
}

fn with_atomic(mut h: RoceRepr, va: u64, rkey: RKey, swap_add: u64, compare: u64) -> RoceRepr {
    h.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add,
        compare,
    });
    h
}

fn aeth_hdr(op: Opcode, psn: u32, syndrome: AethSyndrome, msn: u32) -> RoceRepr {
    let mut h = RoceRepr::new(BthRepr::new(op, Qpn::new(0), Psn::new(psn)));
    h.aeth = Some(AethRepr {
        syndrome,
        msn: Msn::new(msn),
    });
    h
}

/// An RNR NAK syndrome with timer `code`.
fn rnr(code: u8) -> AethSyndrome {
    AethSyndrome::RnrNak {
        timer: RnrTimer::new(code),
    }
}

impl H {
    fn rx(&mut self, repr: RoceRepr, payload: &[u8]) {
        self.rx_arrived(self.now, self.now, repr, payload, false);
    }

    /// [`H::rx`] for a packet handled at `handled` that arrived at `arrival` (its arrival
    /// stamp; an unstamped packet arrives when it is handled) and carries a CE mark if `ce`.
    fn rx_arrived(
        &mut self,
        handled: Instant,
        arrival: Instant,
        mut repr: RoceRepr,
        payload: &[u8],
        ce: bool,
    ) {
        repr.bth.dest_qp = self.qpn;
        let pkt = RxPkt {
            repr,
            payload,
            ce,
            ip: None,
            udp_src_port: 0,
        };
        let addrs = Some((IpAddr::V4(ip(Side::A)), IpAddr::V4(ip(Side::B))));
        self.d.handle_decoded_at(handled, arrival, &pkt, addrs);
    }

    fn tx(&mut self) -> Vec<(RoceRepr, Vec<u8>)> {
        let mut buf = vec![0; MAX_FRAME_LEN];
        let mut out = Vec::new();
        while let Some(t) = self.d.poll_transmit(self.now, &mut buf) {
            let f = parse_frame(&buf[..t.size]).expect("own frames parse");
            assert!(f.icrc_ok);
            assert_eq!(f.roce.bth.dest_qp, Qpn::new(PEER));
            out.push((f.roce, f.payload.to_vec()));
        }
        out
    }

    fn acks(&mut self) -> Vec<(AethSyndrome, u32)> {
        self.tx()
            .into_iter()
            .map(|(h, _)| (h.aeth.unwrap().syndrome, h.bth.psn.value()))
            .collect()
    }

    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sg = vec![Sge {
            addr: BASE + off,
            length: len,
            lkey: self.mr.lkey,
        }];
        self.d
            .post_recv(self.qpn, RecvWr { wr_id, sg_list: sg })
            .unwrap();
    }

    /// Posts send WR `wr_id` doing `op` with one SGE of `len` bytes at offset `off` of the MR.
    fn post(&mut self, wr_id: u64, op: SendOp, off: u64, len: u32) {
        let sg = self.sg(off, len);
        self.d
            .post_send(self.qpn, SendWr::new(wr_id, op, sg))
            .unwrap();
    }

    fn sg(&self, off: u64, len: u32) -> Vec<Sge> {
        vec![Sge {
            addr: BASE + off,
            length: len,
            lkey: self.mr.lkey,
        }]
    }

    fn wcs(&mut self) -> Vec<Wc> {
        core::iter::from_fn(|| self.d.poll_cq(self.cq)).collect()
    }

    fn state(&self) -> QpState {
        self.d.qp(self.qpn).unwrap().state()
    }

    fn c(&self) -> QpCounters {
        *self.d.qp(self.qpn).unwrap().counters()
    }

    fn mem(&self, off: usize, len: usize) -> Vec<u8> {
        self.d.mrs().bytes(self.mr.lkey).unwrap()[off..off + len].to_vec()
    }

    fn set_mem(&mut self, off: usize, data: &[u8]) {
        self.d
            .mrs_mut()
            .memory_mut(self.mr.lkey)
            .unwrap()
            .write(off, data)
            .unwrap();
    }

    fn advance_to_timeout(&mut self) {
        self.now = self.d.poll_timeout().expect("a timer is armed");
        self.d.handle_timeout(self.now);
    }
}

const ACK: AethSyndrome = AethSyndrome::ACK_UNLIMITED;

fn sends(h: &mut H, n: u64, len: u32) {
    for i in 0..n {
        let sg = h.sg(i * 64, len);
        h.d.post_send(h.qpn, SendWr::send(i + 1, sg)).unwrap();
    }
}

/// An RDMA READ of the peer's memory at `remote_addr` under `rkey`.
fn read(remote_addr: u64, rkey: RKey) -> SendOp {
    SendOp::Read { remote_addr, rkey }
}

/// An RDMA WRITE to the peer's memory at `remote_addr` under `rkey`.
fn write(remote_addr: u64, rkey: RKey) -> SendOp {
    SendOp::Write { remote_addr, rkey }
}

/// A signalled send WR `wr_id` doing `op` with one SGE: `length` bytes at `addr` of `lkey`.
fn signaled(wr_id: u64, op: SendOp, addr: u64, length: u32, lkey: LKey) -> SendWr<Path> {
    let mut wr = SendWr::new(wr_id, op, vec![Sge { addr, length, lkey }]);
    wr.flags = SendFlags::SIGNALED;
    wr
}

/// A signalled UD QP with Q_Key `qkey` (own PD and CQ of 16) created on `d` and brought to
/// RTS (ibv_modify_qp(3): INIT needs P_Key index, port and Q_Key; RTR and RTS nothing more).
/// Returns the PD, the CQ, the QP and the attributes used.
fn ud_bring_up(d: &mut Device, qkey: QKey) -> (PdId, CqId, Qpn, QpAttr<Path>) {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let qpn = d
        .create_qp(QpInit {
            sq_sig_all: true,
            ..QpInit::new(QpType::Ud, pd, cq)
        })
        .unwrap();
    let mut a: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..QpAttr::default()
    };
    d.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
        .unwrap();
    (pd, cq, qpn, a)
}

/// A device with one signalled UD QP (Q_Key 7) brought to RTS, and the attributes used.
fn ud_qp_in_rts() -> (Device, PdId, CqId, Qpn, QpAttr<Path>) {
    let mut d = Device::new(DeviceConfig::default());
    let (pd, cq, qpn, a) = ud_bring_up(&mut d, QKey::new(7));
    (d, pd, cq, qpn, a)
}

/// QP numbers wrap from `qpn_limit` back to `first_qpn` (rxe's cyclic QP index pool), skip
/// the ones in use, and run out only when every one below the limit is taken: a server that
/// creates and destroys a QP per connection keeps getting QPNs after many times the range.
#[test]
fn qpns_wrap_below_the_limit_and_skip_those_in_use() {
    let mut d = Device::new(DeviceConfig {
        first_qpn: 16,
        qpn_limit: 24,
        ..DeviceConfig::default()
    });
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let kept = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
    assert_eq!(kept, Qpn::new(16));
    let mut seen = Vec::new();
    for _ in 0..100 {
        let q = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
        seen.push(q.value());
        d.destroy_qp(q).unwrap();
    }
    assert!(seen.iter().all(|&q| (17..24).contains(&q)), "{seen:?}");
    assert_eq!(&seen[..9], &[17, 18, 19, 20, 21, 22, 23, 17, 18]);
    // Fill the range: 16 is kept, 17..24 taken, and then there is none.
    let live: Vec<Qpn> = (17..24)
        .map(|_| d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap())
        .collect();
    assert_eq!(live.len(), 7);
    assert!(matches!(
        d.create_qp(QpInit::new(QpType::Rc, pd, cq)),
        Err(DeviceError::TooManyQps(8))
    ));
    d.destroy_qp(live[3]).unwrap();
    assert_eq!(
        d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap(),
        live[3]
    );
}

/// The default limits let every one of `max_qp` QPs complete on a send and a receive CQ of
/// its own, as `ucmatose` makes them, and refuse the CQ after that.
#[test]
fn the_default_limits_take_a_send_and_a_receive_cq_for_every_qp() {
    let c = DeviceConfig::default();
    let mut d = Device::new(c.clone());
    let pd = d.alloc_pd().unwrap();
    for _ in 0..c.max_qp {
        let (s, r) = (d.create_cq(4).unwrap(), d.create_cq(4).unwrap());
        d.create_qp(QpInit {
            recv_cq: r,
            ..QpInit::new(QpType::Rc, pd, s)
        })
        .unwrap();
    }
    assert_eq!(d.create_cq(4), Err(DeviceError::TooManyCqs(c.max_cq)));
}

/// Completion notifications are never lost to the bound on queued events: more armed CQs
/// completing at once than `max_events` (QPs flushed together, as a server's connections
/// disconnected at once) each queue their notification, in order, and none is counted lost.
#[test]
fn completion_notifications_are_never_dropped_for_the_event_bound() {
    let mut d = Device::new(DeviceConfig {
        max_events: 2,
        ..DeviceConfig::default()
    });
    let pd = d.alloc_pd().unwrap();
    let cqs: Vec<CqId> = (0..5).map(|_| d.create_cq(4).unwrap()).collect();
    for &cq in &cqs {
        let q = d.create_qp(QpInit::new(QpType::Rc, pd, cq)).unwrap();
        let init: QpAttr<Path> = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        d.modify_qp(q, &init, mask).unwrap();
        d.post_recv(
            q,
            RecvWr {
                wr_id: 1,
                sg_list: Vec::new(),
            },
        )
        .unwrap();
        d.req_notify_cq(cq, false).unwrap();
        let err: QpAttr<Path> = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        d.modify_qp(q, &err, AttrMask::STATE).unwrap();
    }
    let got: Vec<Event> = std::iter::from_fn(|| d.poll_event()).collect();
    let want: Vec<Event> = cqs.iter().map(|&cq| Event::CqNotify { cq }).collect();
    assert_eq!(got, want);
    assert_eq!(d.device_counters().events_lost, 0);
}
