//! `roce gen`: a packet generator on the AF_XDP TX path. It sends RoCE-shaped frames
//! (Ethernet / IPv4 / UDP to 4791 / BTH RC_SEND_ONLY / payload / ICRC) at a set rate or flat out.
//!
//! The template frame is emitted once by [`crate::wire::emit_frame`]; each frame is a copy with
//! its PSN, UDP source port and sequence number stamped in and its ICRC recomputed by
//! [`crate::wire::icrc::compute`] (rxe recipe), so no per-frame header building is needed.

use std::{
    net::Ipv4Addr,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use roce_common::{
    ROCE_V2_UDP_PORT,
    hdr::{Bth, EthHdr, ICRC_LEN, Ipv4Hdr, UdpHdr},
};

use crate::xsk::{BindMode, XskConfig, XskError, XskQueue, XskStats};
use crate::{
    engine::{Engine, EngineConfig, Handler, Instant, RxVerdict, TxSink},
    wire::{
        BthRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, Qpn, RoceRepr, emit_frame, icrc,
    },
};

/// Offsets into the IPv4 template.
const IP_OFF: usize = EthHdr::LEN;
const UDP_OFF: usize = IP_OFF + Ipv4Hdr::LEN;
const BTH_OFF: usize = UDP_OFF + UdpHdr::LEN;
const PAYLOAD_OFF: usize = BTH_OFF + Bth::LEN;
/// The shortest frame: headers, an empty payload and the ICRC.
pub const MIN_FRAME: usize = PAYLOAD_OFF + ICRC_LEN;

/// Most frames a rate-limited generator queues per engine turn.
pub const RATE_BURST: u64 = 64;

/// How fast to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// Packets per second (over all queues).
    Pps(u64),
    /// As fast as the TX ring takes them.
    FlatOut,
}

/// What `roce gen` sends. The CLI maps its flags onto this one to one.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Interface to send on.
    pub ifname: String,
    /// Queues to send from, one socket and engine thread each (veth maps the sender's TX queue
    /// to the receiver's RX queue).
    pub queues: Vec<u32>,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// First UDP source port; flow `i` uses `src_port + i`.
    pub src_port: u16,
    /// Number of flows (distinct source ports), at least 1.
    pub flows: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// Frame size in bytes without FCS; rounded down to a whole number of 4-byte payload words.
    pub size: usize,
    /// Rate.
    pub rate: Rate,
    /// Stop after this many frames (over all queues).
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Compute the ICRC (costs a CRC over each frame).
    pub icrc: bool,
}

impl GenConfig {
    /// A config for `ifname` queue 0 with documentation addresses and RC QP 0x11, 64-byte frames,
    /// flat out, until stopped.
    #[must_use]
    pub fn new(ifname: &str) -> Self {
        Self {
            ifname: ifname.to_owned(),
            queues: vec![0],
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(192, 0, 2, 1),
            dst_ip: Ipv4Addr::new(192, 0, 2, 2),
            src_port: 0xc000,
            flows: 1,
            dst_port: ROCE_V2_UDP_PORT,
            dest_qp: 0x11,
            size: 64,
            rate: Rate::FlatOut,
            count: None,
            duration: None,
            icrc: true,
        }
    }
}

/// A pre-built RoCE v2 frame; [`RoceTemplate::write`] stamps a sequence number into a copy.
#[derive(Clone, Debug)]
pub struct RoceTemplate {
    bytes: Vec<u8>,
    src_port: u16,
    flows: u16,
    icrc: bool,
}

impl RoceTemplate {
    /// Builds the template for `cfg` (frame length: `cfg.size` rounded down so that the payload
    /// is a multiple of 4, at least [`MIN_FRAME`]): an RC SEND_ONLY to `cfg.dest_qp`, PSN 0,
    /// IPv4 with DF and TTL 64, UDP checksum 0 as rxe sends it.
    #[must_use]
    pub fn new(cfg: &GenConfig) -> Self {
        let payload_len = cfg.size.max(MIN_FRAME).saturating_sub(MIN_FRAME) & !3;
        let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
        let mut path = PathRepr::new(
            EthernetAddress(cfg.src_mac),
            EthernetAddress(cfg.dst_mac),
            IpPath::V4 {
                src: cfg.src_ip,
                dst: cfg.dst_ip,
            },
        );
        path.udp_src_port = cfg.src_port;
        path.udp_dst_port = cfg.dst_port;
        let roce = RoceRepr::new(BthRepr::new(
            Opcode::RC_SEND_ONLY,
            Qpn::new(cfg.dest_qp & 0x00ff_ffff),
            Psn::new(0),
        ));
        let mut bytes = vec![0u8; MIN_FRAME + payload_len];
        let len = emit_frame(&path, &roce, &payload, &mut bytes).unwrap_or(0);
        debug_assert_eq!(
            len,
            bytes.len(),
            "an SEND_ONLY of a small payload always fits"
        );
        bytes.truncate(len);
        Self {
            bytes,
            src_port: cfg.src_port,
            flows: cfg.flows.max(1),
            icrc: cfg.icrc,
        }
    }

    /// Frame length.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true: a template has at least its headers.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The template bytes (sequence 0 fields, no ICRC).
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Writes frame number `seq` into `buf`: PSN = seq mod 2^24, the UDP source port of flow
    /// `seq mod flows`, the sequence number in the first 8 payload bytes (when they fit), and
    /// the ICRC. Returns the frame length, or 0 if `buf` is too small.
    pub fn write(&self, buf: &mut [u8], seq: u64) -> usize {
        let len = self.bytes.len();
        let Some(out) = buf.get_mut(..len) else {
            return 0;
        };
        out.copy_from_slice(&self.bytes);
        let port = self
            .src_port
            .wrapping_add((seq % u64::from(self.flows)) as u16);
        out[UDP_OFF..UDP_OFF + 2].copy_from_slice(&port.to_be_bytes());
        out[BTH_OFF + 9..BTH_OFF + 12].copy_from_slice(&(seq as u32).to_be_bytes()[1..]);
        if len - ICRC_LEN - PAYLOAD_OFF >= 8 {
            out[PAYLOAD_OFF..PAYLOAD_OFF + 8].copy_from_slice(&seq.to_be_bytes());
        }
        if self.icrc {
            let crc = icrc::compute(
                &out[IP_OFF..UDP_OFF],
                &out[UDP_OFF..BTH_OFF],
                &out[BTH_OFF..len - ICRC_LEN],
            )
            .unwrap_or(0);
            out[len - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        } else {
            out[len - ICRC_LEN..].fill(0);
        }
        len
    }

    /// The sequence number stamped by [`RoceTemplate::write`], if the payload holds it.
    #[must_use]
    pub fn seq_of(frame: &[u8]) -> Option<u64> {
        let b = frame.get(PAYLOAD_OFF..PAYLOAD_OFF + 8)?;
        Some(u64::from_be_bytes(b.try_into().ok()?))
    }
}

/// The generator as an engine [`Handler`]: sends template frames with increasing sequence
/// numbers; received frames are recycled.
#[derive(Debug)]
pub struct GenHandler {
    template: RoceTemplate,
    /// Per-queue rate in packets per second; `None` is flat out.
    pps: Option<u64>,
    count: Option<u64>,
    stop_at: Option<Instant>,
    start: Option<Instant>,
    next_seq: u64,
    seq_step: u64,
    /// Frames queued for transmit.
    pub sent: u64,
    /// Frames received (and recycled).
    pub received: u64,
}

impl GenHandler {
    /// A generator sending sequence numbers `first, first + step, ...`, `count` frames at most,
    /// at `pps` (None: flat out) for at most `duration`.
    #[must_use]
    pub fn new(
        template: RoceTemplate,
        pps: Option<u64>,
        count: Option<u64>,
        duration: Option<Duration>,
        first: u64,
        step: u64,
    ) -> Self {
        Self {
            template,
            pps,
            count,
            stop_at: duration
                .map(|d| Instant::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))),
            start: None,
            next_seq: first,
            seq_step: step.max(1),
            sent: 0,
            received: 0,
        }
    }

    /// Frames to queue now. With a rate, at most [`RATE_BURST`] per turn, so that a thread
    /// that was descheduled catches up in ring-sized steps instead of one burst that would
    /// overflow the receiver's queue (veth's XDP ring holds 256 frames).
    fn budget(&self, now: Instant) -> u64 {
        let left = self.count.map_or(u64::MAX, |c| c.saturating_sub(self.sent));
        match (self.pps, self.start) {
            (Some(pps), Some(start)) => {
                let due = (u128::from(now.saturating_duration_since(start).as_nanos() as u64)
                    * u128::from(pps)
                    / 1_000_000_000) as u64;
                due.saturating_sub(self.sent).min(left).min(RATE_BURST)
            }
            _ => left,
        }
    }
}

impl Handler for GenHandler {
    fn on_rx(&mut self, _now: Instant, _frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        self.received += 1;
        RxVerdict::Recycle
    }

    fn poll_transmit(&mut self, now: Instant, tx: &mut TxSink<'_>) {
        let start = *self.start.get_or_insert(now);
        if let Some(d) = self.stop_at
            && now.as_nanos().saturating_sub(start.as_nanos()) >= d.as_nanos()
        {
            return;
        }
        let budget = self.budget(now).min(tx.room() as u64);
        for _ in 0..budget {
            let seq = self.next_seq;
            if tx.send(|buf| self.template.write(buf, seq)).is_err() {
                break;
            }
            self.next_seq += self.seq_step;
            self.sent += 1;
        }
    }

    fn next_timeout(&self) -> Option<Instant> {
        let (pps, start) = (self.pps?, self.start?);
        // When the next frame is due.
        let next = (u128::from(self.sent + 1) * 1_000_000_000 / u128::from(pps.max(1))) as u64;
        Some(Instant::from_nanos(start.as_nanos().saturating_add(next)))
    }

    fn is_done(&self, now: Instant) -> bool {
        let by_count = self.count.is_some_and(|c| self.sent >= c);
        let by_time = match (self.stop_at, self.start) {
            (Some(d), Some(s)) => now.as_nanos().saturating_sub(s.as_nanos()) >= d.as_nanos(),
            _ => false,
        };
        by_count || by_time
    }
}

/// What a generator run did.
#[derive(Clone, Debug)]
pub struct GenReport {
    /// Frames queued for transmit, all queues.
    pub sent: u64,
    /// Frames the kernel completed, all queues.
    pub completed: u64,
    /// Frame length on the wire (without FCS).
    pub frame_len: usize,
    /// Longest engine run.
    pub elapsed: Duration,
    /// Per-queue bind mode and counters.
    pub per_queue: Vec<GenQueueReport>,
}

/// One queue of a [`GenReport`].
#[derive(Clone, Debug)]
pub struct GenQueueReport {
    /// Queue id.
    pub queue: u32,
    /// How its socket was bound.
    pub mode: BindMode,
    /// Its counters at the end.
    pub stats: XskStats,
}

impl GenReport {
    /// Completed frames per second.
    #[must_use]
    pub fn pps(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs the generator: one socket and engine thread per queue in `cfg.queues`, the rate and
/// count split evenly between them. Returns when the count or duration is reached or `stop` is
/// set. Call from the namespace that holds the interface; no XDP program is needed to send.
pub fn run_gen(
    cfg: &GenConfig,
    xsk: &XskConfig,
    stop: &Arc<AtomicBool>,
) -> Result<GenReport, XskError> {
    if cfg.queues.is_empty() {
        return Err(XskError::Config("no queue to send from"));
    }
    let n = cfg.queues.len() as u64;
    let template = RoceTemplate::new(cfg);
    let frame_len = template.len();
    let mut queues = Vec::with_capacity(cfg.queues.len());
    for &q in &cfg.queues {
        queues.push(XskQueue::open(&cfg.ifname, q, xsk)?);
    }
    let mut threads = Vec::new();
    for (i, q) in queues.into_iter().enumerate() {
        let i = i as u64;
        let count = cfg.count.map(|c| c / n + u64::from(i < c % n));
        let pps = match cfg.rate {
            Rate::Pps(p) => Some((p / n).max(1)),
            Rate::FlatOut => None,
        };
        let h = GenHandler::new(template.clone(), pps, count, cfg.duration, i, n);
        let stop = Arc::clone(stop);
        let t = std::thread::Builder::new()
            .name(format!("roce-gen-q{}", q.queue_id()))
            .spawn(move || {
                let mode = q.bind_mode();
                let mut e = Engine::new(q, h, EngineConfig::default());
                let r = e.run(&stop)?;
                Ok::<_, XskError>((r, e.handler().sent, mode))
            })
            .map_err(|e| XskError::Setup {
                step: "spawn the generator thread",
                ifname: cfg.ifname.clone(),
                queue: 0,
                source: e,
            })?;
        threads.push(t);
    }
    let mut report = GenReport {
        sent: 0,
        completed: 0,
        frame_len,
        elapsed: Duration::ZERO,
        per_queue: Vec::new(),
    };
    for t in threads {
        let (r, sent, mode) = t
            .join()
            .map_err(|_| XskError::Config("generator thread panicked"))??;
        report.sent += sent;
        report.completed += r.stats.tx_completed;
        report.elapsed = report.elapsed.max(r.elapsed);
        report.per_queue.push(GenQueueReport {
            queue: r.queue_id,
            mode,
            stats: r.stats,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse_frame;

    #[test]
    fn frames_parse_as_roce_with_a_good_icrc() {
        let mut cfg = GenConfig::new("x");
        cfg.size = 200;
        cfg.dest_qp = 0x1234;
        let t = RoceTemplate::new(&cfg);
        let mut buf = [0u8; 256];
        for seq in [0u64, 1, 0xff_ffff, 0x100_0005] {
            let n = t.write(&mut buf, seq);
            let f = parse_frame(&buf[..n]).expect("the generator emits RoCE v2");
            assert!(f.icrc_ok, "bad ICRC for seq {seq}");
            assert_eq!(f.roce.bth.opcode, Opcode::RC_SEND_ONLY);
            assert_eq!(f.roce.bth.dest_qp.value(), 0x1234);
            assert_eq!(f.roce.bth.psn.value(), (seq & 0xff_ffff) as u32);
            assert_eq!(
                u64::from_be_bytes(f.payload[..8].try_into().expect("8")),
                seq
            );
            assert_eq!(f.len, n);
        }
    }

    #[test]
    fn template_fields() {
        let mut cfg = GenConfig::new("x");
        cfg.size = 101; // rounded down to 58 + 40
        cfg.flows = 4;
        let t = RoceTemplate::new(&cfg);
        assert_eq!(t.len(), 98);
        let mut buf = [0u8; 256];
        assert_eq!(t.write(&mut buf, 0x0102_0304_0506), 98);
        let f = &buf[..98];
        assert_eq!(RoceTemplate::seq_of(f), Some(0x0102_0304_0506));
        assert_eq!(&f[BTH_OFF + 9..BTH_OFF + 12], &[0x04, 0x05, 0x06]);
        assert_eq!(u16::from_be_bytes([f[UDP_OFF], f[UDP_OFF + 1]]), 0xc000 + 2);
        assert_eq!(
            u16::from_be_bytes([f[UDP_OFF + 4], f[UDP_OFF + 5]]),
            98 - 34
        );
        // Also a valid RoCE frame with the flow's port (parse_frame checks the IPv4 checksum).
        let p = parse_frame(f).expect("RoCE");
        assert!(p.icrc_ok);
        assert_eq!(p.udp.src_port, 0xc000 + 2);
        assert_eq!(t.write(&mut buf[..50], 1), 0);
    }

    #[test]
    fn rate_budget() {
        let mut cfg = GenConfig::new("x");
        cfg.size = 64;
        let mut h = GenHandler::new(RoceTemplate::new(&cfg), Some(1000), Some(10), None, 0, 1);
        h.start = Some(Instant::from_nanos(0));
        assert_eq!(h.budget(Instant::from_nanos(5_000_000)), 5);
        h.sent = 5;
        assert_eq!(h.budget(Instant::from_nanos(5_000_000)), 0);
        assert_eq!(h.next_timeout(), Some(Instant::from_nanos(6_000_000)));
        assert_eq!(h.budget(Instant::from_nanos(1_000_000_000)), 5);
        h.count = None;
        assert_eq!(h.budget(Instant::from_nanos(1_000_000_000)), RATE_BURST);
    }
}
