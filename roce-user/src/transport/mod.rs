//! The RC (and UD) transport, sans-I/O.
//!
//! A [`Device`] owns memory regions, completion queues and queue pairs. It reads no clock and
//! opens no socket: time is an argument and packets are whole Ethernet frames in caller-owned
//! buffers, parsed and emitted by [`crate::wire`]. The API is quinn-proto's triad:
//!
//! - inputs: [`Device::handle_packet`] (a received frame), [`Device::post_send`],
//!   [`Device::post_recv`], [`Device::modify_qp`], [`Device::handle_timeout`];
//! - outputs: [`Device::poll_transmit`] (writes the next frame into the caller's buffer),
//!   [`Device::poll_timeout`] (when to call `handle_timeout` next), [`Device::poll_cq`] and
//!   [`Device::poll_event`].
//!
//! The engine loop is: feed received frames, drain `poll_transmit` until `None`, sleep until
//! `poll_timeout` or the next frame, call `handle_timeout`, repeat.
//!
//! The RC rules are those of Linux rxe (reference/roce-v2.md §2): responder PSN checks with one
//! NAK per gap, duplicate handling (re-ACK, READ replay, saved atomic results), opcode-sequence,
//! access, length and R_Key checks with rxe's NAK codes; requester segmentation by path MTU,
//! AckReq on the last packet and every [`qp::MAX_PKT_PER_ACK`] packets, a window of
//! [`qp::MAX_UNACKED_PSNS`] PSNs, `max_rd_atomic`, go-back-N retransmission on NAK and timeout,
//! implied NAKs for READ/ATOMIC and mid-message READ resumption.
//!
//! # Memory bound
//! Everything is bounded by configuration, never by what a peer sends: at most
//! [`DeviceConfig::max_qp`] QPs (see [`Qp`] for the per-QP bound, ~76 KiB with defaults),
//! [`DeviceConfig::max_mr`] regions and as many memory windows, [`DeviceConfig::max_cq`] CQs of at most
//! [`DeviceConfig::max_cqe`] entries (48 B each) and [`DeviceConfig::max_events`] async
//! events (and a completion notification per CQ at most). Payloads are gathered straight into the caller's frame buffer, with no buffer of
//! the device's own.
//!
//! Measured (`hotpath qp_memory`, heap bytes counted by a global allocator, x86_64): a
//! connected RC QP holds about 3 KiB of heap while its queues are empty (the QP, its BTreeMap
//! slot, its DCQCN state), 20 KiB with perftest's 128 send WRs of one SGE queued and 36 KiB
//! with its 512 receive WRs queued too; 45 KiB with the default caps' 256 send and 256 receive
//! WRs of one SGE queued. Memory regions are the application's buffers plus a table slot.

//! # Deviations from rxe, on purpose
//! - An RNR NAK also suppresses PSN NAKs for the packets behind it until the retried request
//!   arrives (rxe would also send a PSN sequence NAK for the next packet of the same gap), and
//!   it restarts the transport retry count (the RNR retry count goes on).
//! - A NAK for the gap a retry already covers starts no second retry (rxe's `started_retry`
//!   applied to NAKs as well as implied NAKs).
//!
//! # Testing
//! - `transport::tests` (unit): one test per responder, completer and requester rule of
//!   reference/roce-v2.md §2, named after the rule (`resp_*`, `comp_*`, `req_*`, `recv_*`).
//! - [`sim`]: the deterministic two-endpoint simulator (quinn-proto's `Pair`), public so that
//!   `roce-user/tests/` can use it.
//! - `roce-user/tests/transport_sim.rs`: seeded random schedules; replay a seed with
//!   `ROCE_SIM_SEED=<seed>`, set the count with `ROCE_SIM_MESSAGES=<n>`; the full 10,000-message
//!   run is `cargo test --release -p roce-user --test transport_sim -- --ignored`.
//! - `roce-user/tests/transport_props.rs`: property tests of the PSN window and segmentation.
//! - `roce-user/fuzz/fuzz_targets/responder.rs`:
//!   `cargo +nightly fuzz run --fuzz-dir roce-user/fuzz responder -- -max_total_time=20`.

pub mod cc;
pub mod counters;
pub mod cq;
pub mod gsi;
pub mod ids;
mod mem;
pub mod mr;
pub mod multipath;
pub mod qp;
mod sched;
pub mod sim;
pub mod srq;
pub mod state;
#[cfg(test)]
mod tests;
pub mod timer;
pub mod wr;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use roce_common::opcode::{Opcode, Operation, Transport};

pub use self::cc::{CcConfig, CcSetError, QpCc};
pub use self::counters::{DeviceCounters, QpCounters};
pub use self::cq::{Cq, CqId, CqOverflow, Wc, WcFlags, WcOpcode, WcStatus};
pub use self::ids::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};
pub use self::mr::{
    Access, AccessError, BindMw, ExternalMem, MR_GUARD_BYTE, MR_GUARD_LEN, MemBuf, Memory, MrError,
    MrInfo, MrTable, MwError, MwType, OutOfRegion, PdId, RawMem, Sge,
};
use self::qp::TxBuf;
pub use self::qp::{PostError, Qp, QpCap, QpInit};
use self::srq::SrqTable;
pub use self::srq::{Srq, SrqAttr, SrqAttrError, SrqAttrMask, SrqId};
pub use self::state::{AttrMask, ModifyError, Mtu, QpAttr, QpState, QpType};
pub use self::timer::{Instant, Timer};
pub use self::wr::{RecvWr, SendFlags, SendOp, SendWr, UdDest};
use crate::wire::{Ecn, FrameTemplate, IpPath, RoceRepr, frame::MAX_BTH_OFFSET, parse_frame};

/// A received packet as the QP logic sees it: the parsed headers, the payload and the ECN mark.
#[derive(Clone, Copy, Debug)]
pub struct RxPkt<'a> {
    /// The BTH and the extended headers.
    pub repr: RoceRepr,
    /// Payload, pad and ICRC removed.
    pub payload: &'a [u8],
    /// Whether the IP header carried ECN Congestion Experienced.
    pub ce: bool,
    /// The frame's IP header, which a UD receive copies into its buffer's GRH area
    /// ([`crate::wire::IpRepr::network_header`]); `None` for a packet decoded without one
    /// (unit tests, the fuzz target), whose GRH area is then zero.
    pub ip: Option<crate::wire::IpRepr>,
    /// The frame's UDP source port (its entropy, for the multipath extension's path
    /// feedback); 0 for a packet decoded without its frame.
    pub udp_src_port: u16,
}

/// The path a QP's frames take (its address vector): MACs, IPs, UDP ports, DSCP/ECN, TTL.
pub type Path = crate::wire::PathRepr;

/// The largest frame a QP with path MTU `mtu` sends: Ethernet + 2 VLAN tags + IPv6 + UDP + BTH
/// + the largest extended headers + `mtu` payload bytes + ICRC.
#[must_use]
pub const fn max_frame_len(mtu: Mtu) -> usize {
    14 + 8 + 40 + 8 + 12 + 28 + mtu.bytes() as usize + 4
}

/// A buffer of this many bytes holds any frame the transport sends ([`max_frame_len`] at
/// MTU 4096).
pub const MAX_FRAME_LEN: usize = max_frame_len(Mtu::Mtu4096);

/// Limits of a device (`struct ibv_device_attr`, the part roce-xdp enforces).
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Protection domains (default 1024); more are refused ([`DeviceError::TooManyPds`]).
    pub max_pd: usize,
    /// QPs (default [`roce_common::maps::DEFAULT_MAX_QP`], 16,384; `roce perf --max-qp`); more
    /// are refused ([`DeviceError::TooManyQps`]).
    pub max_qp: usize,
    /// Memory regions (default 4096, at most 65535; `roce perf --max-mr`); more are refused
    /// ([`MrError::TableFull`]).
    pub max_mr: usize,
    /// CQs (default twice the default `max_qp`: every QP may complete on a send and a receive
    /// CQ of its own, as `ucmatose` makes them; with 1024, its 1,000 connections at once ran
    /// out of CQs at the 513th). An idle CQ costs a few hundred bytes.
    pub max_cq: usize,
    /// Entries per CQ (default 2^22, mlx5's limit: 16,384 QPs of perftest's tx depth 128
    /// completing on one CQ need 2^21). A CQ's storage grows with the completions it holds,
    /// not with its depth.
    pub max_cqe: usize,
    /// Send or receive WRs per QP (default 16384, rxe's `RXE_MAX_QP_WR`): the bound on a QP's
    /// send and receive queue depth (`QpCap`); a post beyond the QP's own cap is refused.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per WR (default 32).
    pub max_sge: u32,
    /// Inline data per send WR, the most a QP's `max_inline_data` may be (default 400,
    /// rxe's `RXE_MAX_INLINE_DATA`); more is refused at `create_qp` (rxe `rxe_qp_chk_cap`).
    pub max_inline_data: u32,
    /// `max_rd_atomic` / `max_dest_rd_atomic` per QP (default 16; rxe: 128): the responder
    /// resources a peer's READs and atomics can hold. One more while all are still answering
    /// takes the oldest one's place, as rxe's ring does (counted in `rd_atomic_evicted`).
    pub max_qp_rd_atom: u8,
    /// Async events queued before new ones are counted as lost (default 256). Completion
    /// notifications ([`Event::CqNotify`]) are never lost: at most one per CQ is queued.
    pub max_events: usize,
    /// Shared receive queues (default 1024); more are refused ([`DeviceError::TooManySrqs`]).
    pub max_srq: usize,
    /// WQEs per SRQ (default 16384, rxe's `RXE_MAX_SRQ_WR`).
    pub max_srq_wr: u32,
    /// Scatter/gather entries per SRQ WQE (default 32, as `max_sge`).
    pub max_srq_sge: u32,
    /// Seed of the CSPRNG that draws the key bits of memory regions. Inject real entropy in
    /// production; tests inject a constant to be reproducible.
    pub key_seed: [u8; 32],
    /// The first QP number handed out (rxe: `RXE_MIN_QP_INDEX` 16).
    pub first_qpn: u32,
    /// QP numbers are handed out below this one (default 2^24, every 24-bit QPN): after the
    /// last, numbering starts again at [`DeviceConfig::first_qpn`], skipping the QPNs still in
    /// use, as rxe's cyclic QP index pool does. The api device sets it to the size of roce_xdp's
    /// QP map, which holds no higher QPN.
    pub qpn_limit: u32,
    /// Unacknowledged packets (PSNs sent and not yet acknowledged, READ responses included)
    /// over all QPs together (default 1024; 0: no limit; `roce perf --max-inflight`). When the
    /// sum reaches it, QPs send no new packets until ACKs come back; retransmissions, ACKs and
    /// responses still go. Each QP's own window is [`qp::MAX_UNACKED_PSNS`] (128, rxe's), so
    /// one QP never meets this limit, but 1024 QPs would put 131,072 packets in flight: far
    /// more than the peer's receive ring (4096 frames) holds, so they were lost and
    /// retransmitted (BENCHMARKS.md, Scaling).
    pub max_inflight_pkts: u32,
    /// The part of the QPN and memory-key space this device draws from (default
    /// [`Shard::ONE`], all of it). A sharded api device runs one transport per RX queue
    /// (`DeviceOptions::sharded`), each with its own [`Shard`].
    pub shard: Shard,
    /// Congestion control (ECN, CNPs, DCQCN) of every RC QP created; see [`cc`]. Validate
    /// `cc.dcqcn` before use ([`crate::cc::DcqcnConfig::validate`]): values out of range are
    /// clamped.
    pub cc: CcConfig,
    /// Whether RC QPs created on this device allow the multipath extension (docs/multipath.md;
    /// issue 19): default false, so every packet is plain RoCE v2 and nothing changes towards
    /// rxe or an RDMA NIC. A QP that allows it sets the BTH offer bit (a reserved bit, which
    /// IBA 9.2 has receivers ignore) and turns the extension on only when its peer QP offers
    /// too ([`multipath::Negotiation`]). [`Device::set_multipath`] changes it per QP.
    pub multipath: bool,
    /// Entropies (UDP source ports) a QP with the extension on sprays its SEND and WRITE
    /// packets over in selective-repeat mode ([`multipath::Entropies`]; docs/multipath.md,
    /// "Spraying"): default 8; 1 keeps every packet on the QP's own source port (one path).
    pub multipath_entropies: u8,
    /// Whether an RC responder answers the AckReq requests of one QP that arrive in one
    /// receive batch with one cumulative ACK for the newest, at most
    /// [`qp::ACK_COALESCE_MAX`] of them per ACK (IBA Vol. 1 §9.7.5.1, coalesced
    /// acknowledgements; counted in `ack_coalesced`). Default true. False answers every
    /// AckReq with an ACK of its own, as rxe does.
    pub coalesce_acks: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            max_pd: 1024,
            max_qp: roce_common::maps::DEFAULT_MAX_QP as usize,
            max_mr: 4096,
            max_cq: 2 * roce_common::maps::DEFAULT_MAX_QP as usize,
            max_cqe: 1 << 22,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_inline_data: 400,
            max_qp_rd_atom: 16,
            max_events: 256,
            max_srq: 1024,
            max_srq_wr: 0x4000,
            max_srq_sge: 32,
            key_seed: [0; 32],
            first_qpn: 16,
            qpn_limit: 1 << 24,
            max_inflight_pkts: 1024,
            shard: Shard::ONE,
            cc: CcConfig::default(),
            multipath: false,
            multipath_entropies: 8,
            coalesce_acks: true,
        }
    }
}

/// One of `count` transports that share an interface, one per RX queue: it hands out only the
/// QP numbers `n` with `n % count == index` and memory keys whose low 16 bits are `index`
/// modulo `count`. The numbers stay unique over all of them without coordination, and a QP
/// number or key names its transport (`Shard::of_qpn`, `Shard::of_key`) without a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This transport's place, below `count`.
    pub index: u32,
    /// How many transports share the interface: 1 to [`Shard::MAX_COUNT`].
    pub count: u32,
}

impl Shard {
    /// The whole space: one transport for the interface.
    pub const ONE: Self = Self { index: 0, count: 1 };

    /// The most transports one interface is split into: keeps 8 of the 16 low key bits
    /// random (rxe draws 8 key bits).
    pub const MAX_COUNT: u32 = 256;

    /// Shard `index` of `count`, if `index < count <= MAX_COUNT`.
    #[must_use]
    pub const fn new(index: u32, count: u32) -> Option<Self> {
        if count == 0 || count > Self::MAX_COUNT || index >= count {
            None
        } else {
            Some(Self { index, count })
        }
    }

    /// The index of the shard that owns QP number `qpn` among `count`.
    #[must_use]
    pub const fn of_qpn(count: u32, qpn: Qpn) -> u32 {
        qpn.value() % count
    }

    /// The index of the shard that owns memory key (L_Key or R_Key) `key` among `count`.
    #[must_use]
    pub const fn of_key(count: u32, key: u32) -> u32 {
        (key & 0xffff) % count
    }

    /// Whether this shard hands out `qpn`.
    #[must_use]
    pub const fn owns_qpn(self, qpn: Qpn) -> bool {
        Self::of_qpn(self.count, qpn) == self.index
    }

    /// `bits` moved to the nearest value this shard owns (same high bits, low bits ≡ index).
    #[must_use]
    pub const fn key_bits(self, bits: u16) -> u16 {
        let (b, c) = (bits as u32, self.count);
        let v = b - b % c + self.index;
        (if v > 0xffff { v - c } else { v }) as u16
    }
}

/// An asynchronous event (`struct ibv_async_event`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// `IBV_EVENT_QP_FATAL`: the QP moved to ERR on its own (from `from`).
    QpFatal {
        /// The QP.
        qpn: Qpn,
        /// Its state before.
        from: QpState,
    },
    /// `IBV_EVENT_SQ_DRAINED`: in SQD, every started send WR has completed.
    SqDrained {
        /// The QP.
        qpn: Qpn,
    },
    /// A completion event on an armed CQ (what `ibv_get_cq_event` returns).
    CqNotify {
        /// The CQ.
        cq: CqId,
    },
    /// `IBV_EVENT_CQ_ERR`: a completion did not fit in the CQ.
    CqOverflow {
        /// The CQ.
        cq: CqId,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: a QP took a WQE and fewer than the armed `srq_limit`
    /// are left; the limit is disarmed (rxe `get_srq_wqe`).
    SrqLimitReached {
        /// The SRQ.
        srq: SrqId,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR and will take no
    /// more WQEs from it (IBA 11.6.3; rxe `flush_recv_queue`).
    QpLastWqeReached {
        /// The QP.
        qpn: Qpn,
    },
    /// `IBV_EVENT_COMM_EST`: the first request arrived while the RC QP was in RTR (IBA 11.6.3;
    /// rdmavt `rvt_comm_est`; rxe raises none), once per connection.
    CommEstablished {
        /// The QP.
        qpn: Qpn,
    },
}

impl Event {
    /// Whether this is an asynchronous event (`ibv_get_async_event`) rather than a completion
    /// notification ([`Event::CqNotify`], for `ibv_get_cq_event`).
    #[must_use]
    pub const fn is_async(&self) -> bool {
        !matches!(self, Self::CqNotify { .. })
    }
}

/// Why a device call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `max_qp` QPs exist.
    #[error("too many queue pairs (max {0})")]
    TooManyQps(usize),
    /// `max_cq` CQs exist.
    #[error("too many completion queues (max {0})")]
    TooManyCqs(usize),
    /// No such QP.
    #[error("no queue pair {0:?}")]
    NoSuchQp(Qpn),
    /// No such protection domain.
    #[error("no protection domain {0:?}")]
    NoSuchPd(PdId),
    /// `max_pd` PDs exist.
    #[error("too many protection domains (max {0})")]
    TooManyPds(usize),
    /// The PD still has memory regions or QPs (`ibv_dealloc_pd` fails with `EBUSY`).
    #[error("protection domain {0:?} is in use")]
    PdInUse(PdId),
    /// A QP still sends or receives through the CQ (`ibv_destroy_cq` fails with `EBUSY`).
    #[error("completion queue {0:?} is in use by a queue pair")]
    CqInUse(CqId),
    /// No such CQ.
    #[error("no completion queue {0:?}")]
    NoSuchCq(CqId),
    /// `max_srq` SRQs exist.
    #[error("too many shared receive queues (max {0})")]
    TooManySrqs(usize),
    /// No such SRQ.
    #[error("no shared receive queue {0:?}")]
    NoSuchSrq(SrqId),
    /// A QP still receives through the SRQ (`ibv_destroy_srq` fails with `EBUSY`).
    #[error("shared receive queue {0:?} is in use by a queue pair")]
    SrqInUse(SrqId),
    /// An SRQ attribute was refused (`EINVAL`).
    #[error("shared receive queue: {0}")]
    SrqAttr(#[from] SrqAttrError),
    /// A queue size beyond the device limits.
    #[error("requested size {0} exceeds the device limit {1}")]
    TooLarge(u64, u64),
    /// `modify_qp` refused.
    #[error("failed to modify QP: {0}")]
    Modify(#[from] ModifyError),
    /// A memory region call failed.
    #[error("memory region: {0}")]
    Mr(#[from] MrError),
    /// A congestion-control parameter was refused.
    #[error(transparent)]
    Cc(#[from] crate::cc::ConfigError),
    /// The QP has no congestion control (UD).
    #[error("queue pair {0:?} has no congestion control (only RC QPs do)")]
    NoCongestionControl(Qpn),
    /// The multipath extension is chosen before RTR ([`Device::set_multipath`]).
    #[error("the multipath extension is chosen in RESET or INIT, the QP is in {0}")]
    InvalidState(QpState),
}

/// The counter that counted a received frame as dropped ([`Device::handle_packet_traced`]),
/// by its index in the counter struct's `NAMES`: the one source of the drop's name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DropCounter {
    /// `DeviceCounters::NAMES[i]`.
    Device(usize),
    /// `QpCounters::NAMES[i]` of the frame's DestQP.
    Qp(usize),
}

impl DropCounter {
    /// The device counters that do not mean a drop: totals and hand-overs.
    const NOT_DROPS: [&'static str; 5] = [
        "rcvd_pkts",
        "sent_pkts",
        "rx_other_queue",
        "events_lost",
        "ack_coalesced",
    ];

    /// The first drop counter that moved from `before` to `after`.
    #[must_use]
    pub fn device_delta(before: &DeviceCounters, after: &DeviceCounters) -> Option<Self> {
        let (b, a) = (before.values(), after.values());
        (0..DeviceCounters::COUNT)
            .find(|&i| a[i] > b[i] && !Self::NOT_DROPS.contains(&DeviceCounters::NAMES[i]))
            .map(Self::Device)
    }

    /// The counter's name, as `roce stats` prints it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Device(i) => DeviceCounters::NAMES.get(i).copied().unwrap_or("?"),
            Self::Qp(i) => QpCounters::NAMES.get(i).copied().unwrap_or("?"),
        }
    }
}

/// What [`Device::poll_transmit`] wrote.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Transmit {
    /// Bytes of the frame at the start of the buffer.
    pub size: usize,
    /// The QP that sent it.
    pub qpn: Qpn,
}

/// The CQs of a device: a slot per [`CqId`]; a destroyed CQ's slot is empty until a new CQ
/// takes it, so the table never grows beyond the most CQs that lived at once.
#[derive(Debug, Default)]
pub(crate) struct CqTable {
    cqs: Vec<Option<Cq>>,
}

impl CqTable {
    fn get(&self, cq: CqId) -> Option<&Cq> {
        self.cqs.get(cq.0 as usize)?.as_ref()
    }

    fn get_mut(&mut self, cq: CqId) -> Option<&mut Cq> {
        self.cqs.get_mut(cq.0 as usize)?.as_mut()
    }

    /// CQs that exist.
    fn live(&self) -> usize {
        self.cqs.iter().filter(|c| c.is_some()).count()
    }

    /// Puts `cq` in the lowest free slot.
    fn insert(&mut self, cq: Cq) -> CqId {
        if let Some(i) = self.cqs.iter().position(Option::is_none) {
            self.cqs[i] = Some(cq);
            return CqId(i as u32);
        }
        self.cqs.push(Some(cq));
        CqId((self.cqs.len() - 1) as u32)
    }

    /// Empties `cq`'s slot; trailing empty slots are dropped.
    fn remove(&mut self, cq: CqId) -> Option<Cq> {
        let out = self.cqs.get_mut(cq.0 as usize)?.take();
        while self.cqs.last().is_some_and(Option::is_none) {
            self.cqs.pop();
        }
        out
    }
}

/// What a QP may touch while it runs: the device's regions, CQs, events and counters.
pub(crate) struct Ctx<'a> {
    pub mrs: &'a mut MrTable,
    pub cqs: &'a mut CqTable,
    pub srqs: &'a mut SrqTable,
    pub events: &'a mut VecDeque<Event>,
    pub max_events: usize,
    pub counters: &'a mut DeviceCounters,
    /// [`DeviceConfig::coalesce_acks`].
    pub coalesce_acks: bool,
}

impl Ctx<'_> {
    /// Queues an event. An asynchronous one beyond [`DeviceConfig::max_events`] is counted
    /// lost; a completion notification never is: each arm of a CQ yields one at most, so they
    /// add at most `max_cq` to the queue, and a lost one left its waiter in `ibv_get_cq_event`
    /// asleep for good (`rping -s -P` with 1,000 connections disconnected at once, their QPs
    /// flushing together faster than the event thread took the notifications, kept hundreds
    /// of connection threads waiting for ever).
    pub(crate) fn event(&mut self, e: Event) {
        if e.is_async() && self.events.len() >= self.max_events {
            self.counters.events_lost += 1;
        } else {
            self.events.push_back(e);
        }
    }

    /// Queues a completion; on overflow raises [`Event::CqOverflow`] once and returns false.
    /// `solicited` says the completed receive carried BTH.SE.
    pub(crate) fn push_wc(&mut self, cq: CqId, wc: Wc, solicited: bool) -> bool {
        let Some(c) = self.cqs.get_mut(cq) else {
            return false;
        };
        let was = c.overflowed();
        match c.push(wc) {
            Ok(()) => {
                if c.take_notify(solicited, wc.status != WcStatus::Success) {
                    self.event(Event::CqNotify { cq });
                }
                true
            }
            Err(CqOverflow) => {
                if !was {
                    self.event(Event::CqOverflow { cq });
                }
                false
            }
        }
    }
}

/// Counts of a device's objects ([`Device::resources`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Completion queues.
    pub cqs: usize,
    /// QPs (QP 1 not counted).
    pub qps: usize,
}

impl Resources {
    /// The sum of two devices' counts (the shards of one interface).
    #[must_use]
    pub const fn add(self, o: Self) -> Self {
        Self {
            pds: self.pds + o.pds,
            mrs: self.mrs + o.mrs,
            cqs: self.cqs + o.cqs,
            qps: self.qps + o.qps,
        }
    }
}

/// A RoCE device: memory regions, CQs and QPs, driven sans-I/O.
#[derive(Debug)]
pub struct Device {
    config: DeviceConfig,
    pds: BTreeSet<u32>,
    next_pd: u32,
    mrs: MrTable,
    cqs: CqTable,
    srqs: SrqTable,
    qps: BTreeMap<u32, Qp>,
    /// Destroyed QPs that still owe the peer ACKs or NAKs ([`Device::destroy_qp`]), sent
    /// before anything else by [`Device::poll_transmit`] and then dropped.
    closing: Vec<Qp>,
    next_qpn: u32,
    events: VecDeque<Event>,
    counters: DeviceCounters,
    /// Ready queue and timer set (transport/sched.rs).
    sched: sched::Schedule,
    /// QP 1 and its CM agent, once [`Device::enable_gsi`] made this device run one.
    gsi: Option<Box<gsi::Gsi>>,
}

impl Device {
    /// A device with the limits of `config`.
    #[must_use]
    pub fn new(config: DeviceConfig) -> Self {
        Self {
            pds: BTreeSet::new(),
            next_pd: 1,
            mrs: MrTable::for_shard(config.max_mr, config.key_seed, config.shard),
            cqs: CqTable::default(),
            srqs: SrqTable::default(),
            qps: BTreeMap::new(),
            closing: Vec::new(),
            next_qpn: config.first_qpn.max(2),
            events: VecDeque::new(),
            counters: DeviceCounters::default(),
            sched: sched::Schedule::new(config.max_inflight_pkts),
            gsi: None,
            config,
        }
    }

    // -------------------------------------------------------------- resources

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`DeviceError::TooManyPds`].
    pub fn alloc_pd(&mut self) -> Result<PdId, DeviceError> {
        if self.pds.len() >= self.config.max_pd {
            return Err(DeviceError::TooManyPds(self.config.max_pd));
        }
        while self.pds.contains(&self.next_pd) || self.next_pd == 0 {
            self.next_pd = self.next_pd.wrapping_add(1);
        }
        let pd = self.next_pd;
        self.pds.insert(pd);
        self.next_pd = self.next_pd.wrapping_add(1);
        Ok(PdId(pd))
    }

    /// Frees a protection domain that no region or QP uses (`ibv_dealloc_pd`).
    ///
    /// # Errors
    /// [`DeviceError::NoSuchPd`] or [`DeviceError::PdInUse`].
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), DeviceError> {
        if !self.pds.contains(&pd.0) {
            return Err(DeviceError::NoSuchPd(pd));
        }
        if self.mrs.uses_pd(pd)
            || self.srqs.uses_pd(pd)
            || self.qps.values().any(|q| q.init.pd == pd)
        {
            return Err(DeviceError::PdInUse(pd));
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// Registers `buf` at iova `iova` in `pd` (`ibv_reg_mr`). The device owns the memory
    /// until [`Device::dereg_mr`] gives it back.
    ///
    /// # Errors
    /// [`DeviceError`] if the PD does not exist, the table is full, or the range or rights
    /// are invalid.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        mem: impl Into<Memory>,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, DeviceError> {
        if !self.pds.contains(&pd.0) {
            return Err(DeviceError::NoSuchPd(pd));
        }
        Ok(self.mrs.register(pd, mem, iova, access)?)
    }

    /// Deregisters a region (`ibv_dereg_mr`); safe while operations using it are in flight.
    ///
    /// # Errors
    /// [`MrError::UnknownKey`].
    pub fn dereg_mr(&mut self, lkey: LKey) -> Result<Memory, MrError> {
        self.mrs.deregister(lkey)
    }

    /// Allocates a memory window of type `ty` in `pd` (`ibv_alloc_mw`) and returns its R_Key.
    /// Bind it with a [`SendOp::BindMw`] work request (both types; `ibv_bind_mw` posts one for
    /// type 1).
    ///
    /// # Errors
    /// [`DeviceError::NoSuchPd`], or [`MrError::WindowTableFull`].
    pub fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> Result<RKey, DeviceError> {
        if !self.pds.contains(&pd.0) {
            return Err(DeviceError::NoSuchPd(pd));
        }
        Ok(self.mrs.alloc_mw(pd, ty)?)
    }

    /// Frees the memory window with `rkey`'s index (`ibv_dealloc_mw`), bound or not.
    ///
    /// # Errors
    /// [`MrError::UnknownWindow`].
    pub fn dealloc_mw(&mut self, rkey: RKey) -> Result<(), MrError> {
        self.mrs.dealloc_mw(rkey)
    }

    /// The memory regions.
    #[must_use]
    pub const fn mrs(&self) -> &MrTable {
        &self.mrs
    }

    /// The memory regions, to write application data into them.
    pub const fn mrs_mut(&mut self) -> &mut MrTable {
        &mut self.mrs
    }

    /// Creates a CQ of `depth` entries (`ibv_create_cq`).
    ///
    /// # Errors
    /// [`DeviceError`] if too many CQs exist or `depth` exceeds `max_cqe`.
    pub fn create_cq(&mut self, depth: usize) -> Result<CqId, DeviceError> {
        if self.cqs.live() >= self.config.max_cq {
            return Err(DeviceError::TooManyCqs(self.config.max_cq));
        }
        if depth > self.config.max_cqe || depth == 0 {
            return Err(DeviceError::TooLarge(
                depth as u64,
                self.config.max_cqe as u64,
            ));
        }
        Ok(self.cqs.insert(Cq::new(depth)))
    }

    /// Destroys a CQ that no QP uses (`ibv_destroy_cq`); the completions still queued in it
    /// are dropped with it, as libibverbs does. Its [`CqId`] may be handed out again by a
    /// later [`Device::create_cq`]. Call it after destroying the QPs that complete on it.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchCq`], or [`DeviceError::CqInUse`] while a QP's send or receive
    /// queue completes on it (rxe and libibverbs: `EBUSY`).
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), DeviceError> {
        if self.cqs.get(cq).is_none() {
            return Err(DeviceError::NoSuchCq(cq));
        }
        if self
            .qps
            .values()
            .any(|q| q.init.send_cq == cq || q.init.recv_cq == cq)
        {
            return Err(DeviceError::CqInUse(cq));
        }
        self.cqs.remove(cq);
        Ok(())
    }

    /// The oldest completion of `cq` (`ibv_poll_cq` with one entry).
    pub fn poll_cq(&mut self, cq: CqId) -> Option<Wc> {
        self.cqs.get_mut(cq)?.pop()
    }

    /// Moves the oldest completions of `cq` into `out`, as many as are queued and fit
    /// (`ibv_poll_cq`), and returns how many. Allocates nothing; an unknown CQ yields 0.
    pub fn poll_cq_into(&mut self, cq: CqId, out: &mut [Wc]) -> usize {
        let Some(c) = self.cqs.get_mut(cq) else {
            return 0;
        };
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(wc) = c.pop() else { break };
            *slot = wc;
            n += 1;
        }
        n
    }

    /// Arms `cq` for one [`Event::CqNotify`] (`ibv_req_notify_cq`).
    ///
    /// # Errors
    /// [`DeviceError::NoSuchCq`].
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), DeviceError> {
        self.cqs
            .get_mut(cq)
            .ok_or(DeviceError::NoSuchCq(cq))?
            .req_notify(solicited_only);
        Ok(())
    }

    /// A CQ, to inspect its length or overflow state.
    #[must_use]
    pub fn cq(&self, cq: CqId) -> Option<&Cq> {
        self.cqs.get(cq)
    }

    /// Creates a QP in RESET (`ibv_create_qp`).
    ///
    /// # Errors
    /// [`DeviceError`] if too many QPs exist, a CQ does not exist or a size is too large.
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, DeviceError> {
        self.create_qp_with_srq(init, None)
    }

    /// Creates a QP in RESET (`ibv_create_qp`) that receives through `srq` when given
    /// (`init_attr.srq`): its own receive queue is unused, so `cap.max_recv_wr` is ignored, and
    /// [`Device::post_recv`] on it is refused (rxe: `EINVAL`).
    ///
    /// # Errors
    /// As [`Device::create_qp`], and [`DeviceError::NoSuchSrq`].
    pub fn create_qp_with_srq(
        &mut self,
        mut init: QpInit,
        srq: Option<SrqId>,
    ) -> Result<Qpn, DeviceError> {
        if let Some(id) = srq {
            if self.srqs.get(id).is_none() {
                return Err(DeviceError::NoSuchSrq(id));
            }
            init.cap.max_recv_wr = 0;
        }
        if self.qps.len() >= self.config.max_qp {
            return Err(DeviceError::TooManyQps(self.config.max_qp));
        }
        if !self.pds.contains(&init.pd.0) {
            return Err(DeviceError::NoSuchPd(init.pd));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if self.cq(cq).is_none() {
                return Err(DeviceError::NoSuchCq(cq));
            }
        }
        let c = init.cap;
        let most = c.max_send_wr.max(c.max_recv_wr);
        if most > self.config.max_qp_wr {
            return Err(DeviceError::TooLarge(
                u64::from(most),
                u64::from(self.config.max_qp_wr),
            ));
        }
        if c.max_sge > self.config.max_sge {
            return Err(DeviceError::TooLarge(
                u64::from(c.max_sge),
                u64::from(self.config.max_sge),
            ));
        }
        if c.max_inline_data > self.config.max_inline_data {
            return Err(DeviceError::TooLarge(
                u64::from(c.max_inline_data),
                u64::from(self.config.max_inline_data),
            ));
        }
        let n = self.next_free_qpn()?;
        self.next_qpn = n + 1;
        let qpn = Qpn::new(n);
        let mut qp = Qp::new(qpn, init);
        qp.srq = srq;
        qp.cc = cc::for_qp(&self.config.cc, init.qp_type);
        qp.set_multipath(self.config.multipath);
        qp.mp_entropies = multipath::EntropyConfig {
            count: self.config.multipath_entropies.max(1),
            ..multipath::EntropyConfig::default()
        };
        self.qps.insert(n, qp);
        Ok(qpn)
    }

    /// Allows (or forbids) the multipath extension on RC QP `qpn`, overriding
    /// [`DeviceConfig::multipath`] (docs/multipath.md, "Agreeing on the extension"). Call it
    /// in RESET or INIT, before the QP exchanges a packet: the agreement starts from this
    /// choice when the QP reaches RTR and is kept through a reset. UC and UD QPs never use
    /// the extension; for them this does nothing.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`]; [`DeviceError::InvalidState`] once the QP is in RTR or
    /// later (its peer may already have seen its answer).
    pub fn set_multipath(&mut self, qpn: Qpn, allowed: bool) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        if !matches!(qp.state, QpState::Reset | QpState::Init) {
            return Err(DeviceError::InvalidState(qp.state));
        }
        qp.set_multipath(allowed);
        Ok(())
    }

    /// Tells RC QP `qpn` that its peer QP allows the multipath extension too, as an
    /// out-of-band exchange said (docs/multipath.md, "Hints out of band"): if the QP allows
    /// it, the extension is on from the QP's first packet (trailers, selective repeat and
    /// spraying from the first window on) instead of from the peer's first answer. It still
    /// falls back to plain RoCE v2 if the peer's packets come without the offer bit. Call it
    /// in RESET or INIT, after [`Device::set_multipath`], and only when the peer said so
    /// itself: a trailer sent to a QP that does not allow the extension would be taken for
    /// data. A reset forgets it; for a QP that does not allow the extension, and for UC and
    /// UD QPs, it does nothing.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`]; [`DeviceError::InvalidState`] once the QP is in RTR or
    /// later.
    pub fn set_multipath_peer(&mut self, qpn: Qpn) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        if !matches!(qp.state, QpState::Reset | QpState::Init) {
            return Err(DeviceError::InvalidState(qp.state));
        }
        qp.set_multipath_peer();
        Ok(())
    }

    /// The first QPN from `next_qpn` on that is free and ours (our shard's), wrapping from
    /// [`DeviceConfig::qpn_limit`] to [`DeviceConfig::first_qpn`] (rxe's cyclic index pool).
    /// Without the wrap, a process that creates and destroys QPs all its life (a server taking
    /// one connection after another) ran past the QPNs roce_xdp's QP map holds after 65,520
    /// QPs and could create none from then on.
    fn next_free_qpn(&self) -> Result<u32, DeviceError> {
        let first = self.config.first_qpn.max(2);
        let limit = self.config.qpn_limit.clamp(first + 1, 1 << 24);
        let mut n = self.next_qpn;
        for _ in first..limit {
            if n < first || n >= limit {
                n = first;
            }
            if !self.qps.contains_key(&n) && self.config.shard.owns_qpn(Qpn::new(n)) {
                return Ok(n);
            }
            n += 1;
        }
        Err(DeviceError::TooManyQps(self.qps.len()))
    }

    /// Destroys a QP (`ibv_destroy_qp`): its WRs disappear without completions.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`].
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .remove(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        self.sched.forget(&qp);
        self.mrs.qp_destroyed(qpn);
        if let Some(owing) = qp.into_closing() {
            self.closing.push(owing);
        }
        Ok(())
    }

    /// Sets the MTU of UD QP `qpn`: the largest datagram it sends or accepts. A UD QP has no
    /// path MTU attribute (ibv_modify_qp(3) takes none for UD); rxe gives it the port's active
    /// MTU (rxe_qp.c `rxe_qp_init_req` for UD/GSI), and so should the caller, right after
    /// [`Device::create_qp`]. Until then it is the default path MTU (1024). Other QP types are
    /// left as they are.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`].
    pub fn set_ud_mtu(&mut self, qpn: Qpn, mtu: Mtu) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        if qp.qp_type == QpType::Ud {
            qp.attr.path_mtu = mtu;
        }
        Ok(())
    }

    /// Whether destroyed QPs still owe the peer ACKs or NAKs: the engine must run
    /// [`Device::poll_transmit`] once more (after a `destroy_qp`, and before it stops).
    #[must_use]
    pub fn owes_transmit(&self) -> bool {
        !self.closing.is_empty()
    }

    /// A QP, to query its state, attributes and counters.
    #[must_use]
    pub fn qp(&self, qpn: Qpn) -> Option<&Qp> {
        self.qps.get(&qpn.value())
    }

    /// The QP table, the context its QPs act on, and the schedule, borrowed apart.
    fn split(&mut self) -> (&mut BTreeMap<u32, Qp>, Ctx<'_>, &mut sched::Schedule) {
        let Self {
            qps,
            mrs,
            cqs,
            srqs,
            events,
            counters,
            config,
            sched,
            ..
        } = self;
        (
            qps,
            Ctx {
                mrs,
                cqs,
                srqs,
                events,
                max_events: config.max_events,
                counters,
                coalesce_acks: config.coalesce_acks,
            },
            sched,
        )
    }

    /// Changes a QP's state and attributes (`ibv_modify_qp`), following the verbs state table
    /// ([`state::transition_masks`]). Moving to ERR flushes every outstanding WR; RESET drops them.
    ///
    /// # Errors
    /// [`DeviceError::Modify`] naming the illegal transition or the wrong mask bits.
    pub fn modify_qp(
        &mut self,
        qpn: Qpn,
        attr: &QpAttr<Path>,
        mask: AttrMask,
    ) -> Result<(), DeviceError> {
        let max = self.config.max_qp_rd_atom;
        let (qps, mut ctx, sched) = self.split();
        let qp = qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        let to = state::check_modify(qp.qp_type, qp.state, attr, mask, max)?;
        qp.apply_modify(to, attr, mask, &mut ctx);
        sched.touch(qp);
        Ok(())
    }

    /// Posts a send WR (`ibv_post_send`). In ERR it completes at once with a flush error.
    ///
    /// # Errors
    /// [`PostError`] if the QP state, queue depth, SG list or request is wrong.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr<Path>) -> Result<(), PostError> {
        let max_sge = self.config.max_sge as usize;
        let (qps, mut ctx, sched) = self.split();
        let qp = qps.get_mut(&qpn.value()).ok_or(PostError::NoSuchQp(qpn))?;
        let max_sge = max_sge.min(qp.init.cap.max_sge as usize);
        let r = qp.post_send(wr, max_sge, &mut ctx);
        sched.touch(qp);
        r
    }

    /// Posts send WRs all or none (`ibv_wr_complete`), in order. In ERR they complete at once
    /// with flush errors.
    ///
    /// # Errors
    /// The index of the first WR refused and why, as [`Device::post_send`]; none is posted then.
    pub fn post_send_all(
        &mut self,
        qpn: Qpn,
        wrs: Vec<SendWr<Path>>,
    ) -> Result<(), (usize, PostError)> {
        let max_sge = self.config.max_sge as usize;
        let (qps, mut ctx, sched) = self.split();
        let qp = qps
            .get_mut(&qpn.value())
            .ok_or((0, PostError::NoSuchQp(qpn)))?;
        let max_sge = max_sge.min(qp.init.cap.max_sge as usize);
        let r = qp.post_send_all(wrs, max_sge, &mut ctx);
        sched.touch(qp);
        r
    }

    /// Posts a receive WR (`ibv_post_recv`). In ERR it completes at once with a flush error.
    ///
    /// # Errors
    /// [`PostError`] if the QP state, queue depth or SG list is wrong.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), PostError> {
        let max_sge = self.config.max_sge as usize;
        let (qps, mut ctx, sched) = self.split();
        let qp = qps.get_mut(&qpn.value()).ok_or(PostError::NoSuchQp(qpn))?;
        let max_sge = max_sge.min(qp.init.cap.max_sge as usize);
        let r = qp.post_recv(wr, max_sge, &mut ctx);
        sched.touch(qp);
        r
    }

    // -------------------------------------------------------------- packets

    /// Handles one received Ethernet frame. Call for every frame the engine receives for this
    /// device; bad frames (truncated, bad ICRC, not RoCE, unknown QP, wrong P_Key) are counted
    /// in [`DeviceCounters`] and dropped, never a panic.
    pub fn handle_packet(&mut self, now: Instant, frame: &[u8]) {
        self.counters.rcvd_pkts += 1;
        let parsed = parse_frame(frame);
        self.handle_parsed(now, now, parsed);
    }

    /// The rest of [`Device::handle_packet`] and [`Device::handle_packet_mut`] once the frame
    /// is parsed: frames that did not parse or whose ICRC is wrong are counted and dropped.
    fn handle_parsed(
        &mut self,
        now: Instant,
        arrival: Instant,
        parsed: crate::wire::Result<crate::wire::Frame<'_>>,
    ) {
        let f = match parsed {
            Ok(f) if f.icrc_ok => f,
            _ => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        // QP 1 (the GSI) is not a QP of the table: its MADs go to the CM agent, if one runs.
        if f.roce.bth.dest_qp == Qpn::GSI
            && let Some(gsi) = self.gsi.as_deref_mut()
        {
            gsi.handle_frame(now, &f);
            return;
        }
        let (src, dst) = (f.src_ip(), f.dst_ip());
        let pkt = RxPkt {
            repr: f.roce,
            payload: f.payload,
            ce: f.ecn() == Ecn::Ce,
            ip: Some(f.ip),
            udp_src_port: f.udp.src_port,
        };
        self.handle_decoded_at(now, arrival, &pkt, Some((src, dst)));
    }

    /// [`Device::handle_packet`] for a frame the caller owns and may have written: the ICRC is
    /// checked by masking its variant fields in place ([`crate::wire::parse_frame_in_place`],
    /// no copy of the headers), and the frame is unchanged afterwards. Call it from an engine
    /// whose received frames are writable (UMEM frames about to be recycled).
    pub fn handle_packet_mut(&mut self, now: Instant, frame: &mut [u8]) {
        self.handle_packet_at(now, now, frame);
    }

    /// [`Device::handle_packet_mut`] for a frame that arrived at `arrival`, earlier than `now`
    /// (the arrival stamp `roce_xdp` put in front of it; the engine hands frames over in
    /// batches, possibly long after they arrived on a busy host). The notification point
    /// decides CNPs by `arrival` (DCQCN: at most one CNP per `min_time_between_cnps` of
    /// *arrivals*, as a NIC's NP sees them), so a batch handled late still yields one CNP per
    /// marked packet as the interval allows. The reaction point takes CNPs at `arrival` too
    /// (`rate_reduce_monitor_period` between arrivals), and Swift's RTT sample of a response
    /// ends at its `arrival` (`Qp::handle_response`). Everything else runs at `now`, which
    /// never goes backwards. These three are the frames `roce_xdp` reads the clock for
    /// (`roce_common::opcode::XDP_TIMED` and the CE mark; a response only for a QP whose
    /// entry asks for it, [`Qp::samples_rtt`]); any other frame comes with `arrival == now`.
    pub fn handle_packet_at(&mut self, now: Instant, arrival: Instant, frame: &mut [u8]) {
        self.counters.rcvd_pkts += 1;
        let parsed = crate::wire::parse_frame_in_place(frame);
        self.handle_parsed(now, arrival.min(now), parsed);
    }

    /// [`Device::handle_packet_mut`] that also says which counter counted the frame as
    /// dropped, if one did: the first [`DeviceCounters`] drop counter that moved
    /// (`rx_malformed`, `rx_unknown_qp`, `bad_pkey_cntr`, `qkey_viol_cntr`, ...), else the
    /// DestQP's `rx_dropped`. Call it instead of `handle_packet_mut` while a capture runs
    /// (`roce dump`): it costs a copy of the device counters per frame.
    pub fn handle_packet_traced(&mut self, now: Instant, frame: &mut [u8]) -> Option<DropCounter> {
        self.handle_packet_traced_at(now, now, frame)
    }

    /// [`Device::handle_packet_traced`] for a frame that arrived at `arrival` (see
    /// [`Device::handle_packet_at`]).
    pub fn handle_packet_traced_at(
        &mut self,
        now: Instant,
        arrival: Instant,
        frame: &mut [u8],
    ) -> Option<DropCounter> {
        let before = self.counters;
        let qpn = crate::wire::peek::dest_qpn(frame);
        let qp_dropped = |d: &Self| {
            qpn.and_then(|n| d.qps.get(&n))
                .map_or(0, |q| q.counters.rx_dropped)
        };
        let qp_before = qp_dropped(self);
        self.handle_packet_at(now, arrival, frame);
        DropCounter::device_delta(&before, &self.counters).or_else(|| {
            (qp_dropped(self) > qp_before).then(|| {
                DropCounter::Qp(
                    QpCounters::NAMES
                        .iter()
                        .position(|n| *n == "rx_dropped")
                        .unwrap_or(usize::MAX),
                )
            })
        })
    }

    /// Handles one received packet that is already decoded (the frame path calls this after
    /// [`crate::wire::parse_frame`]; the fuzz target and unit tests call it directly).
    /// `addrs` are the frame's (source, destination) IPs, checked against an RC QP's path.
    pub fn handle_decoded(
        &mut self,
        now: Instant,
        pkt: &RxPkt<'_>,
        addrs: Option<(core::net::IpAddr, core::net::IpAddr)>,
    ) {
        self.handle_decoded_at(now, now, pkt, addrs);
    }

    /// [`Device::handle_decoded`] for a packet that arrived at `arrival` (at or before `now`;
    /// see [`Device::handle_packet_at`]).
    pub fn handle_decoded_at(
        &mut self,
        now: Instant,
        arrival: Instant,
        pkt: &RxPkt<'_>,
        addrs: Option<(core::net::IpAddr, core::net::IpAddr)>,
    ) {
        let hdr = &pkt.repr.bth;
        if hdr.opcode == Opcode::CNP {
            // Congestion notifications go to the QP's reaction point (transport/cc.rs), at
            // their arrival time: CNPs handled in one late batch are as far apart as they
            // came, and `rate_reduce_monitor_period` measures that.
            self.cc_on_cnp(arrival, pkt, addrs);
            return;
        }
        // The extended headers present must be exactly the opcode's, and a payload only where
        // the opcode carries one (IBA 9.2, the opcode table).
        let Ok(info) = pkt.repr.validate(pkt.payload.len()) else {
            self.counters.rx_malformed += 1;
            return;
        };
        // P_Key: match the low 15 bits against our one-entry table (rxe pkey_match).
        if hdr.pkey.value() & 0x7fff != state::PKEY_TABLE[0].value() & 0x7fff {
            self.counters.bad_pkey_cntr += 1;
            return;
        }
        let (qps, mut ctx, sched) = self.split();
        let Some(qp) = qps.get_mut(&hdr.dest_qp.value()) else {
            ctx.counters.rx_unknown_qp += 1;
            return;
        };
        // RC and UC: the frame must come from the QP's peer (rxe_recv.c check_addr).
        if matches!(
            (qp.qp_type, hdr.opcode.transport()),
            (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc)
        ) && let (Some((src, dst)), Some(av)) = (addrs, qp.attr.ah_attr.as_ref())
        {
            let (want_src, want_dst) = match av.ip {
                IpPath::V4 { src, dst } => (core::net::IpAddr::V4(dst), core::net::IpAddr::V4(src)),
                IpPath::V6 { src, dst, .. } => {
                    (core::net::IpAddr::V6(dst), core::net::IpAddr::V6(src))
                }
            };
            if src != want_src || dst != want_dst {
                qp.counters.rx_dropped += 1;
                return;
            }
        }
        // The multipath bits (docs/multipath.md): the offer of a peer that runs the
        // extension, or nothing from any other peer.
        let mp = if hdr.opcode.transport() == Transport::Rc {
            qp.mp_on_receive(
                hdr.resv7,
                hdr.opcode.info().is_some_and(|i| i.is_response()),
            )
        } else {
            multipath::RxDecision::Plain
        };
        if mp == multipath::RxDecision::Drop {
            return;
        }
        qp.counters.rcvd_pkts += 1;
        qp.counters.rx_payload_bytes += pkt.payload.len() as u64;
        if pkt.ce {
            qp.counters.np_ecn_marked_roce_packets += 1;
        }
        qp.cc_on_packet(arrival, pkt.ce, pkt.udp_src_port);
        if mp == multipath::RxDecision::Trailer {
            qp.handle_mp_packet(now, arrival, pkt, &mut ctx);
        } else if info.is_response() {
            qp.handle_response(now, arrival, pkt, &mut ctx);
        } else {
            qp.handle_request(now, pkt, &mut ctx);
        }
        sched.touch(qp);
    }

    /// Writes the next frame to send into `buf` and says how long it is, or `None` when
    /// nothing is ready. Call after every input until it returns `None`. Only QPs whose
    /// largest frame ([`max_frame_len`] of their path MTU) fits in `buf` are served, so a
    /// 4 KiB UMEM frame serves every QP with a path MTU up to 2048. The QPs an input reached
    /// are served round-robin, one frame each in turn (transport/sched.rs), so a call costs
    /// what the ready QPs cost, not what every QP costs; on each, responses (ACK/NAK, READ
    /// responses, atomic ACKs) go before new requests.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        // QP 1's MADs first: few, and a connection waits on each.
        if let Some(gsi) = self.gsi.as_deref_mut()
            && gsi.has_transmit()
            && let Some(size) = gsi.poll_transmit(buf)
        {
            self.counters.sent_pkts += 1;
            return Some(Transmit {
                size,
                qpn: Qpn::GSI,
            });
        }
        let out = self.transmit_next(now, buf);
        self.sched.end_transmit();
        out
    }

    /// The body of [`Device::poll_transmit`], which then returns the QPs deferred here to the
    /// ready queue.
    fn transmit_next(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let Self {
            qps,
            closing,
            mrs,
            cqs,
            srqs,
            events,
            counters,
            config,
            sched,
            ..
        } = self;
        let mut ctx = Ctx {
            mrs,
            cqs,
            srqs,
            events,
            max_events: config.max_events,
            counters,
            coalesce_acks: config.coalesce_acks,
        };
        // What destroyed QPs owe goes first; a QP that has sent it is dropped.
        while let Some(qp) = closing.last_mut() {
            if max_frame_len(qp.attr.path_mtu) <= buf.len()
                && let Some(size) = Self::transmit_qp(qp, now, &mut ctx, buf, false)
            {
                return Some(Transmit { size, qpn: qp.qpn });
            }
            closing.pop();
        }
        while let Some(k) = sched.pop_ready() {
            let Some(qp) = qps.get_mut(&k) else {
                sched.release_one(); // destroyed since it was queued
                continue;
            };
            if !qp.sched.queued && !qp.sched.blocked {
                // A second entry of a QP already served to exhaustion, or a stale release.
                sched.release_one();
                continue;
            }
            qp.sched.queued = true;
            qp.sched.blocked = false;
            let max_frame = max_frame_len(qp.attr.path_mtu);
            if max_frame > buf.len() {
                sched.defer(k);
                continue;
            }
            let fresh_ok = sched.fresh_ok();
            if let Some(size) = Self::transmit_qp(qp, now, &mut ctx, buf, fresh_ok) {
                sched.refresh(qp);
                sched.requeue(k);
                return Some(Transmit {
                    size,
                    qpn: Qpn::new(k),
                });
            }
            qp.sched.queued = false;
            if !fresh_ok && qp.has_unsent_requests() {
                // Waits for the device's in-flight budget (DeviceConfig::max_inflight_pkts).
                sched.block(qp);
            }
            sched.refresh(qp);
        }
        None
    }

    /// One frame of `qp` into `buf`, if it has one to send now: a due CNP first
    /// (transport/cc.rs), then its responses and requests as the pacer allows, new request
    /// packets only if `fresh_ok` (the device's in-flight budget has room). The QP gathers the
    /// payload straight into `buf`, where it goes after the headers of the path its previous
    /// frame took; the headers are then written around it from the QP's template.
    fn transmit_qp(
        qp: &mut Qp,
        now: Instant,
        ctx: &mut Ctx<'_>,
        buf: &mut [u8],
        fresh_ok: bool,
    ) -> Option<usize> {
        let max_frame = max_frame_len(qp.attr.path_mtu);
        while let Some(r) = qp.cc_emit_cnp(buf) {
            if let Ok(size) = r {
                ctx.counters.sent_pkts += 1;
                return Some(size);
            }
            qp.counters.send_err += 1;
        }
        // Where the BTH goes: after the headers of the last frame's path (a guess for a first
        // frame; a wrong guess costs one move of the payload).
        let bth_off = qp.tx_template.as_ref().map_or_else(
            || {
                qp.attr
                    .ah_attr
                    .as_ref()
                    .map_or(MAX_BTH_OFFSET, Path::bth_offset)
            },
            FrameTemplate::bth_offset,
        );
        let mut tx = TxBuf::new(buf, bth_off);
        loop {
            // The DCQCN pacer holds data back; ACKs and NAKs go, unless a held READ response
            // or atomic ACK for an earlier PSN must go before them (Qp::poll_transmit).
            let data_ok = qp.cc_data_ok(now, max_frame);
            let out = qp.poll_transmit(now, ctx, &mut tx, data_ok, fresh_ok)?;
            let Some(mut path) = out.ud_path.or(qp.attr.ah_attr) else {
                qp.counters.send_err += 1;
                continue;
            };
            if out.ud_path.is_none() {
                qp.cc_apply(&mut path);
            }
            let mut repr = out.repr;
            // The multipath offer bit on an RC QP that allows the extension; 0 otherwise.
            if repr.bth.opcode.transport() == Transport::Rc {
                let response = repr.bth.opcode.info().is_some_and(|i| i.is_response());
                repr.bth.resv7 = qp.mp_tx_bits(repr.bth.resv7, response);
                // A request with its placement trailer takes the next entropy (spraying).
                if out.ud_path.is_none()
                    && repr.bth.resv7 & roce_common::multipath::RESV7_TRAILER != 0
                    && repr.bth.opcode.info().is_some_and(|i| i.is_request())
                    && let Some(port) = qp.mp_spray(now, repr.bth.psn)
                {
                    path.udp_src_port = port;
                }
                // So does a READ response with its trailer (sprayed as requests are).
                if out.ud_path.is_none()
                    && repr.bth.resv7 & roce_common::multipath::RESV7_TRAILER != 0
                    && repr
                        .bth
                        .opcode
                        .info()
                        .is_some_and(|i| i.operation == Operation::ReadResponse)
                    && let Some(port) = qp.mp_spray_response(now, repr.bth.psn)
                {
                    path.udp_src_port = port;
                }
            }
            let payload_len = out.payload.len() as u64;
            // The path's headers as built for the previous frame, unless the path changed.
            let sent = FrameTemplate::for_path(&mut qp.tx_template, &path)
                .and_then(|t| t.emit_around_payload(&repr, out.payload, tx.frame()));
            match sent {
                Ok(size) => {
                    qp.cc_on_sent(now, size);
                    qp.counters.tx_payload_bytes += payload_len;
                    ctx.counters.sent_pkts += 1;
                    return Some(size);
                }
                Err(_) => qp.counters.send_err += 1,
            }
        }
    }

    /// The next time [`Device::handle_timeout`] must be called, if any timer is armed. May
    /// change after any input. Takes `&mut self` because it brings the timer set's first
    /// entries up to date (they are moved lazily, transport/sched.rs), so the answer is exact.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let qps = self.poll_qp_timeout();
        let gsi = self.gsi.as_deref().and_then(gsi::Gsi::poll_timeout);
        match (qps, gsi) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The QPs' part of [`Device::poll_timeout`].
    fn poll_qp_timeout(&mut self) -> Option<Instant> {
        loop {
            let (t, k) = self.sched.first_timer()?;
            let real = self.qps.get(&k).and_then(Qp::next_deadline);
            if real == Some(t) {
                return Some(t);
            }
            // Stale: its QP's timer moved later, stopped, or the QP is gone. Each entry is
            // fixed once, so this loop ends.
            self.sched.rekey(t, k, self.qps.get_mut(&k), real);
        }
    }

    /// Runs the timers due at `now` (retransmission, RNR back-off, DCQCN). Spurious calls are
    /// no-ops.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(gsi) = self.gsi.as_deref_mut() {
            gsi.handle_timeout(now);
        }
        let (qps, mut ctx, sched) = self.split();
        // Only the QPs whose earliest deadline is due (transport/sched.rs).
        let due = sched.take_due(now);
        for k in &due {
            let Some(qp) = qps.get_mut(k) else { continue };
            qp.sched.deadline = None; // its entry left the set in take_due
            if qp.timers.next_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now, &mut ctx);
            }
            qp.cc_handle_timeout(now);
            sched.touch(qp);
        }
        sched.put_due(due);
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether an event waits for [`Device::poll_event`]; an engine checks it after each turn
    /// to wake the threads waiting for events only when there is one.
    #[must_use]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Counts a frame that another shard's RX queue received and handed to this device
    /// (`rx_other_queue`); call it before [`Device::handle_packet_mut`] for such a frame.
    pub const fn count_rx_other_queue(&mut self) {
        self.counters.rx_other_queue += 1;
    }

    /// Counts a frame for another shard's QP that this device's RX queue received but could not
    /// hand over, because the owner's hand-over ring was full (`rx_other_queue_dropped`).
    pub const fn count_rx_other_queue_dropped(&mut self) {
        self.counters.rx_other_queue_dropped += 1;
    }

    /// The device's own counters.
    #[must_use]
    pub const fn device_counters(&self) -> &DeviceCounters {
        &self.counters
    }

    /// Makes this device run QP 1 with a CM agent of `config` (IBTA 13.5: the GSI; 12: the
    /// CM): from now on frames to QP 1 go to it instead of being counted as for an unknown
    /// QP. Call it once, on the transport that owns QPN 1 ([`Shard::of_qpn`]), after claiming
    /// QPN 1 in the XDP program's QP map. Returns false, changing nothing, if it already runs.
    pub fn enable_gsi(&mut self, config: crate::ibcm::CmConfig) -> bool {
        if self.gsi.is_some() {
            return false;
        }
        self.gsi = Some(Box::new(gsi::Gsi::new(config)));
        true
    }

    /// QP 1 and its CM agent, if [`Device::enable_gsi`] was called.
    #[must_use]
    pub fn gsi(&self) -> Option<&gsi::Gsi> {
        self.gsi.as_deref()
    }

    /// QP 1 and its CM agent, to drive the CM; its MADs go out at the next
    /// [`Device::poll_transmit`].
    pub fn gsi_mut(&mut self) -> Option<&mut gsi::Gsi> {
        self.gsi.as_deref_mut()
    }

    /// How many PDs, memory regions, CQs and QPs exist now (QP 1 not counted): what a
    /// resource count such as `roce engine --status` reports, and what shows that a closed
    /// program's objects are gone.
    #[must_use]
    pub fn resources(&self) -> Resources {
        Resources {
            pds: self.pds.len(),
            mrs: self.mrs.in_use(),
            cqs: self.cqs.live(),
            qps: self.qps.len(),
        }
    }

    /// Every QP, in QPN order.
    pub fn qps(&self) -> impl Iterator<Item = &Qp> {
        self.qps.values()
    }

    /// The sum of every QP's counters.
    #[must_use]
    pub fn qp_counters(&self) -> QpCounters {
        let mut sum = QpCounters::default();
        for q in self.qps.values() {
            sum.add(&q.counters);
        }
        sum
    }
}
