//! A deterministic two-endpoint simulator, modelled on quinn-proto's test `Pair`: two
//! [`Device`]s joined by a simulated link with latency, loss, duplication, reordering,
//! corruption and ECN CE marks, all drawn from one seeded RNG, in simulated time. Sans-I/O:
//! frames are byte vectors moved between the devices' `poll_transmit` and `handle_packet`.
//!
//! Several paths (docs/multipath.md, "Test bed and proof"; issue 19): [`Pair::set_paths`]
//! replaces the one link's random behaviour by several [`Link`]s, and each frame takes the
//! path its UDP source port (its entropy) hashes to ([`path_index`]), as an ECMP fabric with
//! an L4 hash (`fib_multipath_hash_policy=1`) would: each path has its own latency, loss,
//! duplication, reordering, corruption and CE marking, and its own [`LinkStats`]
//! ([`Pair::path_stats`]). A QP's frames all take one path today (one source port per QP);
//! spraying (step 3 of the design) will spread them.
//!
//! Always built (it is small and pure) so unit tests, `roce-user/tests/` and benches share it.

use core::time::Duration;
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    net::Ipv4Addr,
};

use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::{
    Access, AttrMask, CqId, Device, DeviceConfig, Instant, MAX_FRAME_LEN, Mtu, Path, PdId, Psn,
    QpAttr, QpCap, QpInit, QpState, QpType, Qpn,
};
use crate::wire::{EthernetAddress, IpPath, Opcode, PathRepr, ipv4, parse_frame};

/// Which endpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    /// Endpoint A.
    A,
    /// Endpoint B.
    B,
}

/// The simulated link, the same in both directions. Probabilities are per frame.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// One-way latency.
    pub latency: Duration,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub dup: f64,
    /// Probability a frame is delayed by up to `reorder_jitter` more (and so overtaken).
    pub reorder: f64,
    /// The extra delay of reordered frames.
    pub reorder_jitter: Duration,
    /// Probability one byte after the Ethernet header is flipped (the ICRC catches it).
    pub corrupt: f64,
    /// Probability an ECN-capable IPv4 frame is marked CE (the IPv4 checksum is refreshed).
    pub ce: f64,
    /// A slow transmit queue on one side's egress (a TCG guest's NIC, say), or none.
    pub bottleneck: Option<Bottleneck>,
}

/// A slow sender on the egress of `from`, like rxe in a TCG guest: it sends `frames_per_sec`
/// and serves one destination QP at a time, the oldest first, until that QP's frames are all
/// sent (rxe's responder streams a whole READ response before it turns to the next QP's); a
/// frame that finds `buffer` frames waiting is lost (a full qdisc, which rxe never learns of).
#[derive(Clone, Copy, Debug)]
pub struct Bottleneck {
    /// The side whose frames go through the queue.
    pub from: Side,
    /// Drain rate.
    pub frames_per_sec: u64,
    /// Queue capacity in frames.
    pub buffer: u64,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(5),
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            reorder_jitter: Duration::from_micros(20),
            corrupt: 0.0,
            ce: 0.0,
            bottleneck: None,
        }
    }
}

/// What the link did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the link.
    pub sent: u64,
    /// Frames delivered (duplicates included).
    pub delivered: u64,
    /// Frames lost (random or by the filter).
    pub lost: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames delayed for reordering.
    pub reordered: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// Frames marked CE.
    pub ce_marked: u64,
    /// Frames lost because the bottleneck queue was full (also counted in `lost`).
    pub queue_full: u64,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: u8,
    /// The path of [`Pair::set_paths`] it took, if any.
    path: Option<usize>,
    frame: Vec<u8>,
}

/// A test hook that sees every frame entering the link and returns false to drop it.
pub type Filter = Box<dyn FnMut(Side, &[u8]) -> bool>;

/// Two devices and the link between them.
pub struct Pair {
    /// Endpoint A.
    pub a: Device,
    /// Endpoint B.
    pub b: Device,
    /// Simulated now.
    pub time: Instant,
    /// The link.
    pub link: Link,
    /// Optional per-frame drop hook (the `Side` is the sender).
    pub filter: Option<Filter>,
    /// What the link did.
    pub stats: LinkStats,
    /// The bottleneck is one drop-tail FIFO for every frame (a switch port or a qdisc), not
    /// one queue per destination QP served until empty (rxe's transmit, [`Bottleneck`]).
    /// Default false.
    pub bottleneck_fifo: bool,
    rng: StdRng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    buf: Vec<u8>,
    /// When the bottleneck may send its next frame.
    bottleneck_free: Instant,
    /// The bottleneck's frames, one queue per destination QP in order of arrival.
    bottleneck_q: VecDeque<(u32, VecDeque<Vec<u8>>)>,
    /// Several paths chosen by UDP source port, or none (then `link` is the only path).
    paths: Vec<Link>,
    /// What each path did.
    path_stats: Vec<LinkStats>,
    /// Per side (A, B), when it takes in frames again ([`Self::pause`]).
    paused: [Instant; 2],
}

impl core::fmt::Debug for Pair {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pair")
            .field("time", &self.time)
            .field("link", &self.link)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// MAC of endpoint A or B.
#[must_use]
pub const fn mac(side: Side) -> EthernetAddress {
    match side {
        Side::A => EthernetAddress([2, 0, 0, 0, 0, 1]),
        Side::B => EthernetAddress([2, 0, 0, 0, 0, 2]),
    }
}

/// IPv4 address of endpoint A or B.
#[must_use]
pub const fn ip(side: Side) -> Ipv4Addr {
    match side {
        Side::A => Ipv4Addr::new(10, 0, 0, 1),
        Side::B => Ipv4Addr::new(10, 0, 0, 2),
    }
}

/// The path from `from` to the other endpoint.
#[must_use]
pub const fn path(from: Side) -> Path {
    let to = match from {
        Side::A => Side::B,
        Side::B => Side::A,
    };
    PathRepr::new(
        mac(from),
        mac(to),
        IpPath::V4 {
            src: ip(from),
            dst: ip(to),
        },
    )
}

/// The opcode and PSN of a frame, for filters.
#[must_use]
pub fn frame_opcode_psn(frame: &[u8]) -> Option<(Opcode, Psn)> {
    parse_frame(frame)
        .ok()
        .map(|f| (f.roce.bth.opcode, f.roce.bth.psn))
}

/// The path of `n` a frame with UDP source port `src_port` takes: a fixed multiplicative
/// hash of the port (Fibonacci hashing), standing in for an ECMP switch's L4 hash, so the
/// same entropy always takes the same path and consecutive entropies spread over all paths.
/// `n` of 0 is treated as 1.
#[must_use]
pub const fn path_index(src_port: u16, n: usize) -> usize {
    let h = (src_port as u32).wrapping_mul(0x9e37_79b1) >> 16;
    h as usize % if n == 0 { 1 } else { n }
}

/// The path from `from` to the other endpoint with UDP source port `port` (a QP's entropy).
#[must_use]
pub const fn path_with_port(from: Side, port: u16) -> Path {
    let mut p = path(from);
    p.udp_src_port = port;
    p
}

impl Pair {
    /// Two devices with `config`, a link, and a seed for every random choice of the link.
    #[must_use]
    pub fn new(seed: u64, config: DeviceConfig, link: Link) -> Self {
        let mut cb = config.clone();
        cb.key_seed[0] ^= 0xb;
        Self {
            a: Device::new(config),
            b: Device::new(cb),
            time: Instant::ZERO,
            link,
            filter: None,
            bottleneck_fifo: false,
            stats: LinkStats::default(),
            rng: StdRng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            buf: vec![0; MAX_FRAME_LEN],
            bottleneck_free: Instant::ZERO,
            bottleneck_q: VecDeque::new(),
            paths: Vec::new(),
            path_stats: Vec::new(),
            paused: [Instant::ZERO; 2],
        }
    }

    /// Stalls `side` until `until`, as a guest whose vCPU is not scheduled (or a process
    /// descheduled): every frame that reaches it before then, those already on their way
    /// included, is handled at `until`, in the order it arrived; it answers them only then.
    pub fn pause(&mut self, side: Side, until: Instant) {
        let to = u8::from(side == Side::B);
        self.paused[usize::from(to)] = until;
        let held: Vec<_> = core::mem::take(&mut self.queue)
            .into_iter()
            .map(|Reverse(mut p)| {
                if p.to == to && p.at < until {
                    p.at = until;
                }
                Reverse(p)
            })
            .collect();
        self.queue = held.into();
    }

    /// Gives the pair several paths: from now on every frame takes
    /// `paths[path_index(its UDP source port, paths.len())]` for its latency, loss,
    /// duplication, reordering, corruption and CE marking (the same in both directions, as
    /// an ECMP fabric hashing the source port). `link` keeps its bottleneck and its filter
    /// runs first; its random knobs no longer apply. An empty `paths` goes back to the one
    /// link. Call it before or between [`Self::step`]s; frames in flight keep their path.
    pub fn set_paths(&mut self, paths: Vec<Link>) {
        self.path_stats = vec![LinkStats::default(); paths.len()];
        self.paths = paths;
    }

    /// What each path of [`Self::set_paths`] did (the totals are in `stats`).
    #[must_use]
    pub fn path_stats(&self) -> &[LinkStats] {
        &self.path_stats
    }

    /// The link a frame takes: its path's, by UDP source port, or the one link.
    fn link_of(&self, frame: &[u8]) -> (Link, Option<usize>) {
        if self.paths.is_empty() {
            return (self.link, None);
        }
        let port = parse_frame(frame).map_or(0, |f| f.udp.src_port);
        let i = path_index(port, self.paths.len());
        (self.paths[i], Some(i))
    }

    /// Counts an event in the totals and in the frame's path.
    fn count(&mut self, path: Option<usize>, f: impl Fn(&mut LinkStats)) {
        f(&mut self.stats);
        if let Some(s) = path.and_then(|i| self.path_stats.get_mut(i)) {
            f(s);
        }
    }

    /// The device of `side`.
    pub fn dev(&mut self, side: Side) -> &mut Device {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    fn enqueue(&mut self, from: Side, frame: Vec<u8>) {
        self.stats.sent += 1;
        if let Some(f) = self.filter.as_mut()
            && !f(from, &frame)
        {
            self.stats.lost += 1;
            return;
        }
        let l = self.link;
        if let Some(b) = l.bottleneck.filter(|b| b.from == from) {
            let queued: usize = self.bottleneck_q.iter().map(|(_, q)| q.len()).sum();
            if queued as u64 >= b.buffer {
                self.stats.lost += 1;
                self.stats.queue_full += 1;
                return;
            }
            // One queue per destination QP, served oldest first until empty (see Bottleneck).
            // A FIFO keeps every frame in the one queue of key 0.
            let qpn = if self.bottleneck_fifo {
                0
            } else {
                parse_frame(&frame).map_or(0, |f| f.roce.bth.dest_qp.value())
            };
            if let Some((_, q)) = self.bottleneck_q.iter_mut().find(|(f, _)| *f == qpn) {
                q.push_back(frame);
            } else {
                self.bottleneck_q.push_back((qpn, VecDeque::from([frame])));
            }
            if self.bottleneck_free < self.time {
                self.bottleneck_free = self.time;
            }
            return;
        }
        self.deliver(from, frame);
    }

    /// Sends the bottleneck's frames whose turn has come (at most one per frame time).
    fn drain_bottleneck(&mut self) {
        let Some(b) = self.link.bottleneck else {
            return;
        };
        let per_frame = Duration::from_nanos(1_000_000_000 / b.frames_per_sec.max(1));
        while self.bottleneck_free <= self.time {
            let Some((_, q)) = self.bottleneck_q.front_mut() else {
                break;
            };
            let Some(frame) = q.pop_front() else {
                self.bottleneck_q.pop_front();
                continue;
            };
            if q.is_empty() {
                self.bottleneck_q.pop_front();
            }
            self.bottleneck_free = self.bottleneck_free + per_frame;
            self.deliver(b.from, frame);
        }
    }

    /// When the bottleneck sends its next frame, if it holds any.
    fn next_bottleneck(&self) -> Option<Instant> {
        self.bottleneck_q
            .iter()
            .any(|(_, q)| !q.is_empty())
            .then_some(self.bottleneck_free)
    }

    fn deliver(&mut self, from: Side, mut frame: Vec<u8>) {
        let (l, path) = self.link_of(&frame);
        // `stats.sent` counted the frame in `enqueue` already.
        if let Some(s) = path.and_then(|i| self.path_stats.get_mut(i)) {
            s.sent += 1;
        }
        if self.rng.random_bool(l.loss) {
            self.count(path, |s| s.lost += 1);
            return;
        }
        if frame.len() > 34 && self.rng.random_bool(l.corrupt) {
            let i = self.rng.random_range(14..frame.len());
            frame[i] ^= 1 << self.rng.random_range(0..8u32);
            self.count(path, |s| s.corrupted += 1);
        }
        // Like a switch (RFC 3168), only ECN-capable packets are marked.
        if frame.len() > 34
            && frame[12..14] == [0x08, 0x00]
            && frame[15] & 3 != 0
            && self.rng.random_bool(l.ce)
        {
            let mut p = ipv4::Packet::new_unchecked(&mut frame[14..34]);
            let tos = p.tos();
            p.set_tos(tos | 3);
            p.fill_checksum();
            self.count(path, |s| s.ce_marked += 1);
        }
        let copies = if self.rng.random_bool(l.dup) {
            self.count(path, |s| s.duplicated += 1);
            2
        } else {
            1
        };
        let to = u8::from(from == Side::A);
        for _ in 0..copies {
            let mut at = self.time + l.latency;
            if self.rng.random_bool(l.reorder) {
                let j = self
                    .rng
                    .random_range(0..=l.reorder_jitter.as_nanos() as u64);
                at = at + Duration::from_nanos(j);
                self.count(path, |s| s.reordered += 1);
            }
            at = at.max(self.paused[usize::from(to)]);
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at,
                seq: self.seq,
                to,
                path,
                frame: frame.clone(),
            }));
        }
    }

    fn transmit_all(&mut self) {
        for side in [Side::A, Side::B] {
            loop {
                let now = self.time;
                let mut buf = core::mem::take(&mut self.buf);
                let t = self.dev(side).poll_transmit(now, &mut buf);
                let frame = t.map(|t| buf[..t.size].to_vec());
                self.buf = buf;
                match frame {
                    Some(f) => self.enqueue(side, f),
                    None => break,
                }
            }
        }
    }

    /// One step: send everything ready, then advance time to the next arrival or timer and
    /// handle it. Returns false when nothing is in flight and no timer is armed.
    pub fn step(&mut self) -> bool {
        self.transmit_all();
        self.drain_bottleneck();
        let next_pkt = self.queue.peek().map(|r| r.0.at);
        let next = [
            next_pkt,
            self.next_bottleneck(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else {
            return false;
        };
        if next > self.time {
            self.time = next;
        }
        while self.queue.peek().is_some_and(|r| r.0.at <= self.time) {
            let Some(Reverse(p)) = self.queue.pop() else {
                break;
            };
            self.count(p.path, |s| s.delivered += 1);
            let now = self.time;
            let dev = if p.to == 1 { &mut self.b } else { &mut self.a };
            dev.handle_packet(now, &p.frame);
        }
        let now = self.time;
        for d in [&mut self.a, &mut self.b] {
            if d.poll_timeout().is_some_and(|t| t <= now) {
                d.handle_timeout(now);
            }
        }
        true
    }

    /// Steps until idle or `max_steps`; returns true if it went idle.
    pub fn drive(&mut self, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Steps until `done(self)` holds, the pair is idle, or `max_steps`; returns `done`.
    pub fn drive_until(
        &mut self,
        max_steps: usize,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Frames in flight.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

/// Knobs of an RC connection made by [`connect_rc`].
#[derive(Clone, Copy, Debug)]
pub struct RcConfig {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// RNR timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// READ/ATOMIC depth, both directions.
    pub rd_atomic: u8,
    /// Remote access the responders allow.
    pub access: Access,
    /// Queue sizes.
    pub cap: QpCap,
    /// CQ depth.
    pub cq_depth: usize,
    /// First PSN of A's send queue (B's is `psn_a + 0x1000`); near 2^24 to test wrap.
    pub psn_a: u32,
    /// Whether [`connect_rc`] tells each QP, as an out-of-band exchange would, that its peer
    /// allows the multipath extension ([`Device::set_multipath_peer`]): with the extension
    /// allowed on both devices, both QPs start with it on.
    pub multipath_peer: bool,
}

impl Default for RcConfig {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 4,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            cap: QpCap::default(),
            cq_depth: 4096,
            psn_a: 0xff_fff0,
            multipath_peer: false,
        }
    }
}

/// One end of a connection: its QP and CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The QP.
    pub qpn: Qpn,
    /// Its protection domain (register the memory it uses here).
    pub pd: PdId,
    /// Its (send and receive) CQ.
    pub cq: CqId,
}

/// Creates an RC QP on each device and brings both to RTS, connected to each other, with the
/// verbs sequence RESET -> INIT -> RTR -> RTS and the exact required masks.
///
/// # Panics
/// If a device refuses (a bug in the transport or in `cfg`).
pub fn connect_rc(pair: &mut Pair, cfg: &RcConfig) -> (Endpoint, Endpoint) {
    connect(pair, cfg, QpType::Rc, (path(Side::A), path(Side::B)))
}

/// [`connect_rc`] with the UDP source ports (entropies) of A's and B's QP, so a test picks
/// the paths of [`Pair::set_paths`] their frames take ([`path_index`]).
///
/// # Panics
/// If a device refuses (a bug in the transport or in `cfg`).
pub fn connect_rc_ports(
    pair: &mut Pair,
    cfg: &RcConfig,
    ports: (u16, u16),
) -> (Endpoint, Endpoint) {
    let paths = (
        path_with_port(Side::A, ports.0),
        path_with_port(Side::B, ports.1),
    );
    connect(pair, cfg, QpType::Rc, paths)
}

/// Creates a UC QP on each device and brings both to RTS, connected to each other, with UC's
/// exact required masks (ibv_modify_qp(3): INIT needs P_Key index, port and access flags; RTR
/// the address vector, path MTU, destination QP and RQ PSN; RTS the SQ PSN). Only `cfg`'s
/// `mtu`, `access`, `cap`, `cq_depth` and `psn_a` apply: UC has no timeouts, retries or
/// READ/atomic depths.
///
/// # Panics
/// If a device refuses (a bug in the transport or in `cfg`).
pub fn connect_uc(pair: &mut Pair, cfg: &RcConfig) -> (Endpoint, Endpoint) {
    connect(pair, cfg, QpType::Uc, (path(Side::A), path(Side::B)))
}

/// [`connect_rc`] or [`connect_uc`], by `qp_type`.
fn connect(
    pair: &mut Pair,
    cfg: &RcConfig,
    qp_type: QpType,
    (path_a, path_b): (Path, Path),
) -> (Endpoint, Endpoint) {
    let mk = |d: &mut Device| {
        let pd = d.alloc_pd().expect("alloc pd");
        let cq = d.create_cq(cfg.cq_depth).expect("create cq");
        let qpn = d
            .create_qp(QpInit {
                cap: cfg.cap,
                ..QpInit::new(qp_type, pd, cq)
            })
            .expect("create qp");
        if cfg.multipath_peer {
            d.set_multipath_peer(qpn).expect("a new QP takes the hint");
        }
        Endpoint { qpn, cq, pd }
    };
    let ea = mk(&mut pair.a);
    let eb = mk(&mut pair.b);
    let psn_a = Psn::new(cfg.psn_a);
    let psn_b = psn_a.wrapping_add(0x1000);
    let up = |d: &mut Device, qpn, av, peer, sq, rq| {
        bring_up_typed(d, qp_type, qpn, av, peer, (sq, rq), cfg);
    };
    up(&mut pair.a, ea.qpn, path_a, eb.qpn, psn_a, psn_b);
    up(&mut pair.b, eb.qpn, path_b, ea.qpn, psn_b, psn_a);
    (ea, eb)
}

/// Moves RC QP `qpn` of `d` (on endpoint `side`) from RESET to RTS, connected to `peer`, with
/// the exact required masks of each transition.
///
/// # Panics
/// If the device refuses a transition.
pub fn bring_up(
    d: &mut Device,
    qpn: Qpn,
    side: Side,
    peer: Qpn,
    sq_psn: Psn,
    rq_psn: Psn,
    cfg: &RcConfig,
) {
    bring_up_typed(d, QpType::Rc, qpn, path(side), peer, (sq_psn, rq_psn), cfg);
}

/// Moves UC QP `qpn` of `d` (on endpoint `side`) from RESET to RTS, connected to `peer`, with
/// UC's exact required masks (see [`connect_uc`]).
///
/// # Panics
/// If the device refuses a transition.
pub fn bring_up_uc(
    d: &mut Device,
    qpn: Qpn,
    side: Side,
    peer: Qpn,
    sq_psn: Psn,
    rq_psn: Psn,
    cfg: &RcConfig,
) {
    bring_up_typed(d, QpType::Uc, qpn, path(side), peer, (sq_psn, rq_psn), cfg);
}

/// [`bring_up`] or [`bring_up_uc`], by `qp_type` (`(sq_psn, rq_psn)`): each transition with
/// exactly the attributes the transport's state table requires of that type
/// ([`super::state::transition_masks`]).
fn bring_up_typed(
    d: &mut Device,
    qp_type: QpType,
    qpn: Qpn,
    av: Path,
    peer: Qpn,
    (sq_psn, rq_psn): (Psn, Psn),
    cfg: &RcConfig,
) {
    let step = |d: &mut Device, attr: &QpAttr<Path>, from, what| {
        let (required, _) =
            super::state::transition_masks(qp_type, from, attr.qp_state).expect("a transition");
        d.modify_qp(qpn, attr, AttrMask::STATE | required)
            .expect(what);
    };
    let mut attr: QpAttr<Path> = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: cfg.access,
        ah_attr: Some(av),
        path_mtu: cfg.mtu,
        dest_qp_num: peer,
        rq_psn,
        max_dest_rd_atomic: cfg.rd_atomic,
        min_rnr_timer: cfg.min_rnr_timer,
        sq_psn,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        max_rd_atomic: cfg.rd_atomic,
        ..QpAttr::default()
    };
    step(d, &attr, QpState::Reset, "INIT");
    attr.qp_state = QpState::Rtr;
    step(d, &attr, QpState::Init, "RTR");
    attr.qp_state = QpState::Rts;
    step(d, &attr, QpState::Rtr, "RTS");
}
