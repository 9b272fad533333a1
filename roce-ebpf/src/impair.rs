//! `roce_impair`: a tc egress fault and congestion injector for RoCE v2 (UDP to the RoCE port).
//!
//! Attached at the TCX egress hook (the bpf_link successor of a clsact direct-action filter:
//! same hook, same `TC_ACT_*` verdicts). Everything that is not RoCE v2 goes on untouched. Each
//! RoCE packet, in this order, may be:
//! 1. run through a virtual bottleneck: a queue drained at `rate_bps`, kept as the time it will
//!    be empty (one u64 updated by compare-and-swap, shared by all CPUs); past
//!    `max_backlog_bytes` the packet is dropped, otherwise it is CE-marked RED-style (never at or
//!    below Kmin, probability rising linearly to Pmax at Kmax, always above Kmax). Packets are
//!    not delayed: the queue is virtual, it only decides marks and drops as a switch would;
//! 2. dropped at random;
//! 3. corrupted: one bit flipped after the BTH (the ICRC is not fixed, so receivers must drop it);
//! 4. CE-marked at random (ECN field 11; the IPv4 header checksum is updated; the ICRC masks
//!    the TOS byte, so it stays valid);
//! 5. duplicated: `bpf_clone_redirect` to the same interface's egress sends a copy first;
//! 6. held back for reordering: the frame is copied into a per-CPU slot and dropped; the next
//!    RoCE packet on that CPU is sent first (as a clone) and then the original skb is rewritten
//!    into the held frame and sent, so the two swap places on the wire. A packet that arrives
//!    while the slot is full is never held itself. (There is no netem, fq or ETF qdisc on the
//!    target kernel, so there is no qdisc to delay packets with; this needs none.)
//!
//! With a selector (`mad_attr`, `roce impair --mad`), only the CM MADs with that attribute ID
//! (UD SEND_ONLY to QP 1, management class CM) go through the steps above; every other RoCE
//! packet goes on untouched. With a limit (`limit`, `--limit`), at most that many packets are
//! impaired by steps 2 to 6 (counted across CPUs in `ROCE_IMPAIR_LIMIT`); a packet that draws an impairment
//! once the limit is used up goes on untouched. Together they make deterministic faults:
//! `--mad req --drop 1 --limit 1` drops exactly the first REQ.
//!
//! Copies the program makes carry `skb->mark = IMPAIR_MARK` and pass the hook untouched.
//! Probabilities come from `ROCE_IMPAIR_CONFIG` on every packet, so they can be changed live.
//!
//! What it does to a frame is also logged with aya-log when `ROCE_LOG_LEVEL` asks for it (see
//! `roce_common::log`): the map is read only when the program does something to a frame, and
//! the record is written by a BPF subprogram (`roce_ebpf::log::write`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// bpfel-unknown-none says `atomic-cas: false`, so core offers no compare_exchange there; the
// intrinsic still lowers to the BPF_CMPXCHG instruction (BPF ISA v3, kernel >= 5.12).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(internal_features, reason = "atomic_cxchg on BPF")
)]
#![cfg_attr(
    not(target_arch = "bpf"),
    allow(dead_code, unused_imports, reason = "only built for BPF")
)]

use core::sync::atomic::AtomicU64;
#[cfg(not(target_arch = "bpf"))]
use core::sync::atomic::Ordering;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    btf_maps::{Array, PerCpuArray},
    helpers::{
        bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_skb_change_tail, bpf_skb_load_bytes,
        bpf_skb_store_bytes,
    },
    macros::{btf_map, classifier},
    programs::TcContext,
};
use roce_common::{
    ROCE_V2_UDP_PORT,
    hdr::{
        Bth, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, EthHdr, ICRC_LEN, IPPROTO_UDP,
        Ipv4Hdr, Ipv6Hdr, MAX_VLAN_TAGS, UdpHdr, VlanHdr,
    },
    impair::{
        BottleneckState, HELD_MAX, HeldPacket, IMPAIR_MARK, ImpairConfig, ImpairStats, LimitState,
        PROB_ONE,
    },
    log::{CODE_IMPAIR, level_of},
    mad::{GSI_QPN, MAD_ATTR_ID_OFFSET, MAD_LEN, MAD_MGMT_CLASS_OFFSET, MGMT_CLASS_CM},
    opcode::Opcode,
};
use roce_ebpf::log::FrameRecord;

#[btf_map]
static ROCE_IMPAIR_CONFIG: Array<ImpairConfig, 1> = Array::new();

#[btf_map]
static ROCE_IMPAIR_STATS: PerCpuArray<ImpairStats, 1> = PerCpuArray::new();

#[btf_map]
static ROCE_IMPAIR_BOTTLENECK: Array<BottleneckState, 1> = Array::new();

#[btf_map]
static ROCE_IMPAIR_HELD: PerCpuArray<HeldPacket, 1> = PerCpuArray::new();

#[btf_map]
static ROCE_IMPAIR_LIMIT: Array<LimitState, 1> = Array::new();

/// The `roce_common::log::LogLevel` code of the records to write (0, the default: none).
#[btf_map]
static ROCE_LOG_LEVEL: Array<u32, 1> = Array::new();

/// What the program did to a frame: the index of its counter in
/// `roce_common::log::IMPAIR_ACTIONS`, whose record code is `CODE_IMPAIR` plus it.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Did {
    BottleneckDropped,
    BottleneckEarlyDropped,
    BottleneckMarked,
    Dropped,
    Corrupted,
    CeMarked,
    Duplicated,
    Reordered,
    ReorderReleased,
}

/// Logs what the program did to the frame `r` in `ctx` if `ROCE_LOG_LEVEL` asks for it: its
/// addresses, destination QPN, opcode and PSN. Call on the path of the impairment only: it
/// reads the map.
#[inline(always)]
fn log_did(ctx: &TcContext, did: Did, r: &Roce) {
    let code = CODE_IMPAIR + did as u32;
    if !ROCE_LOG_LEVEL
        .get(0)
        .is_some_and(|&current| level_of(code).enabled_at(current))
    {
        return;
    }
    let mut rec = FrameRecord::new(code);
    if r.v4 {
        if let Ok(src) = ctx.load::<[u8; 4]>(r.ip + 12)
            && let Ok(dst) = ctx.load::<[u8; 4]>(r.ip + 16)
        {
            rec.set_v4(src, dst);
        }
    } else if let Ok(src) = ctx.load::<[u8; 16]>(r.ip + 8)
        && let Ok(dst) = ctx.load::<[u8; 16]>(r.ip + 24)
    {
        rec.src = src;
        rec.dst = dst;
    }
    if let Ok(sport) = ctx.load::<[u8; 2]>(r.bth - UdpHdr::LEN) {
        rec.sport = u16::from_be_bytes(sport);
    }
    if let Ok(b) = ctx.load::<Bth>(r.bth) {
        rec.has_bth = 1;
        rec.qpn = b.dest_qp();
        rec.opcode = b.opcode;
        rec.psn = b.psn();
    }
    roce_ebpf::log::write(&rec);
}

/// Where the headers of a RoCE v2 packet are.
struct Roce {
    /// Offset of the IP header.
    ip: usize,
    /// IPv4 (else IPv6).
    v4: bool,
    /// Offset of the BTH.
    bth: usize,
    /// Offset just past the UDP datagram (the end of the ICRC).
    end: usize,
    /// The packet's ECN codepoint as it arrived (0 = Not-ECT).
    ecn: u8,
}

#[inline(always)]
fn hit(prob: u32) -> bool {
    if prob == 0 {
        return false;
    }
    // SAFETY: a helper without arguments or side effects on memory.
    prob == PROB_ONE || unsafe { bpf_get_prandom_u32() } < prob
}

#[inline(always)]
fn parse(ctx: &TcContext, port: u16) -> Option<Roce> {
    let len = ctx.len() as usize;
    let eth: EthHdr = ctx.load(0).ok()?;
    let mut off = EthHdr::LEN;
    let mut ether_type = eth.ether_type();
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let vlan: VlanHdr = ctx.load(off).ok()?;
        ether_type = vlan.ether_type();
        off += VlanHdr::LEN;
    }
    let ip = off;
    let v4;
    let ecn;
    if ether_type == ETH_P_IPV4 {
        let h: Ipv4Hdr = ctx.load(off).ok()?;
        let ihl = h.header_len();
        if h.version() != 4
            || ihl < Ipv4Hdr::LEN
            || h.frag_off() & (Ipv4Hdr::MF | Ipv4Hdr::OFFSET_MASK) != 0
            || h.proto != IPPROTO_UDP
        {
            return None;
        }
        off += ihl;
        v4 = true;
        ecn = h.tos & 3;
    } else if ether_type == ETH_P_IPV6 {
        // IPv6 extension headers: not RoCE as far as the injector is concerned.
        let h: Ipv6Hdr = ctx.load(off).ok()?;
        if h.version() != 6 || h.next_hdr != IPPROTO_UDP {
            return None;
        }
        off += Ipv6Hdr::LEN;
        v4 = false;
        ecn = h.traffic_class() & 3;
    } else {
        return None;
    }
    let udp: UdpHdr = ctx.load(off).ok()?;
    if udp.dst_port() != port {
        return None;
    }
    let udp_len = udp.length() as usize;
    if udp_len < UdpHdr::LEN + Bth::LEN + ICRC_LEN || off + udp_len > len {
        return None;
    }
    Some(Roce {
        ip,
        v4,
        bth: off + UdpHdr::LEN,
        end: off + udp_len,
        ecn,
    })
}

/// Sets the ECN field to CE. Returns whether it worked.
#[inline(always)]
fn mark_ce(ctx: &mut TcContext, r: &Roce) -> bool {
    if r.v4 {
        let Ok(word) = ctx.load::<[u8; 2]>(r.ip) else {
            return false;
        };
        let new = [word[0], word[1] | 3];
        if new == word {
            return true;
        }
        // Store the TOS byte, then fix the header checksum (RFC 1624 incremental update of the
        // 16-bit word holding version/IHL and TOS, as raw memory: the helper's convention).
        ctx.store(r.ip + 1, &new[1], 0).is_ok()
            && ctx
                .l3_csum_replace(
                    r.ip + 10,
                    u64::from(u16::from_ne_bytes(word)),
                    u64::from(u16::from_ne_bytes(new)),
                    2,
                )
                .is_ok()
    } else {
        // Traffic class straddles bytes 0 and 1; its ECN bits are bits 5:4 of byte 1.
        let Ok(b) = ctx.load::<u8>(r.ip + 1) else {
            return false;
        };
        ctx.store(r.ip + 1, &(b | 0x30), 0).is_ok()
    }
}

/// Flips one random bit after the BTH (in the extended headers, payload or pad; in the ICRC
/// only when there is nothing else).
#[inline(always)]
fn corrupt(ctx: &mut TcContext, r: &Roce) -> bool {
    let start = r.bth + Bth::LEN;
    let icrc = r.end - ICRC_LEN;
    let (from, span) = if icrc > start {
        (start, icrc - start)
    } else {
        (icrc, ICRC_LEN)
    };
    // SAFETY: a helper without arguments.
    let rnd = unsafe { bpf_get_prandom_u32() } as usize;
    let off = from + (rnd >> 3) % span;
    let bit = 1u8 << (rnd & 7);
    let Ok(b) = ctx.load::<u8>(off) else {
        return false;
    };
    ctx.store(off, &(b ^ bit), 0).is_ok()
}

/// Sends a copy of the packet out of the same interface now (it comes back through this hook
/// with [`IMPAIR_MARK`] and goes on untouched).
#[inline(always)]
fn send_copy(ctx: &mut TcContext) -> bool {
    let skb = ctx.skb.skb;
    // SAFETY: `skb` is the context pointer the kernel gave this program run; `mark` and
    // `ifindex` are fields a tc program may read, and `mark` one it may write.
    let (mark, ifindex) = unsafe { ((*skb).mark, (*skb).ifindex) };
    ctx.set_mark(IMPAIR_MARK);
    let ok = ctx.clone_redirect(ifindex, 0).is_ok();
    ctx.set_mark(mark);
    ok
}

/// Compare-and-swap of `*a` from `old` to `new`; whether it happened.
#[cfg(target_arch = "bpf")]
#[inline(always)]
fn cas(a: &AtomicU64, old: u64, new: u64) -> bool {
    use core::intrinsics::{AtomicOrdering, atomic_cxchg};
    // SAFETY: `a.as_ptr()` is valid and aligned for as long as `a` is borrowed, and every
    // access to it is atomic.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(
            a.as_ptr(),
            old,
            new,
        )
        .1
    }
}

#[cfg(not(target_arch = "bpf"))]
fn cas(a: &AtomicU64, old: u64, new: u64) -> bool {
    a.compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// The virtual bottleneck: `Some(marked)` if the packet may go on, `None` to drop it.
#[inline(always)]
fn bottleneck(cfg: &ImpairConfig, len: u64, ect: bool, stats: &mut ImpairStats) -> Queue {
    let Some(state) = ROCE_IMPAIR_BOTTLENECK.get_ptr_mut(0) else {
        return Queue::Pass;
    };
    // SAFETY: `state` points to the map value, which lives as long as the map; it is only ever
    // accessed through atomics (here and in other CPUs' runs), and u64 map values are 8-aligned.
    let empty_at = unsafe { AtomicU64::from_ptr(&raw mut (*state).empty_at_ns) };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let cost_ns = len * cfg.ps_per_byte / 1000;
    let (mut decided, mut m) = (false, false);
    for _ in 0..8 {
        // An aligned 64-bit load is single-copy atomic on BPF; LLVM's BPF backend cannot select
        // an `AtomicLoad` node before ISA v4, so read it as a volatile load.
        // SAFETY: the pointer is valid and aligned (see above).
        let old = unsafe { core::ptr::read_volatile(empty_at.as_ptr()) };
        let start = if old > now { old } else { now };
        let backlog = (start - now) * 1000 / cfg.ps_per_byte;
        if backlog + len > cfg.max_backlog_bytes {
            return Queue::Overflow;
        }
        // The RED decision is made once, on the backlog this packet first found.
        if !decided {
            let p = if backlog <= cfg.kmin_bytes {
                0
            } else if backlog > cfg.kmax_bytes {
                PROB_ONE
            } else {
                let span = cfg.kmax_bytes - cfg.kmin_bytes;
                (u64::from(cfg.pmax) * (backlog - cfg.kmin_bytes) / span) as u32
            };
            m = hit(p);
            decided = true;
        }
        // RFC 3168 §5: a packet RED would mark but that is not ECN-capable is dropped, and a
        // dropped packet takes no room in the queue.
        if m && !ect {
            return Queue::EarlyDrop;
        }
        if cas(empty_at, old, start + cost_ns) {
            return if m { Queue::Mark } else { Queue::Pass };
        }
    }
    stats.errors += 1;
    Queue::Pass
}

/// What the bottleneck does with a packet.
#[derive(Clone, Copy)]
enum Queue {
    /// Queued, unmarked.
    Pass,
    /// Queued and to be CE-marked.
    Mark,
    /// Not ECN-capable and RED chose it: dropped.
    EarlyDrop,
    /// The virtual backlog would exceed its buffer: dropped.
    Overflow,
}

/// `len` (which the caller checked is in `1..=HELD_MAX`) in a form the verifier can bound:
/// `((len - 1) & (HELD_MAX - 1)) + 1` is `len` and provably in `1..=HELD_MAX`.
#[inline(always)]
fn bounded(len: usize) -> u32 {
    ((len.wrapping_sub(1) & (HELD_MAX - 1)) + 1) as u32
}

/// Holds the packet back, or releases a held one behind it. Returns the verdict.
#[inline(always)]
fn reorder(
    ctx: &mut TcContext,
    cfg: &ImpairConfig,
    stats: &mut ImpairStats,
    r: &Roce,
    budget: &mut Budget,
) -> i32 {
    let Some(held) = ROCE_IMPAIR_HELD.get_ptr_mut(0) else {
        stats.passed += 1;
        return TC_ACT_OK;
    };
    // SAFETY: this CPU's slot of a per-CPU map; tc programs run with bottom halves off, so no
    // other run on this CPU touches it while we hold it (our own clone's run does not: it
    // returns at the IMPAIR_MARK check before looking at this map).
    let held = unsafe { &mut *held };
    let held_len = held.len as usize;
    if held_len != 0 {
        // Release: this packet goes out first as a copy, then the skb becomes the held frame.
        if !send_copy(ctx) {
            stats.errors += 1;
            stats.passed += 1;
            return TC_ACT_OK;
        }
        stats.passed += 1;
        held.len = 0;
        log_did(ctx, Did::ReorderReleased, r);
        if held_len > HELD_MAX {
            stats.errors += 1;
            return TC_ACT_SHOT;
        }
        let skb = ctx.skb.skb;
        let n = bounded(held_len);
        // SAFETY: helpers on our own context; `held.data` is valid for `n` (<= HELD_MAX) bytes.
        let ok = unsafe {
            bpf_skb_change_tail(skb, n, 0) == 0
                && bpf_skb_store_bytes(skb, 0, held.data.as_ptr().cast(), n, 0) == 0
        };
        if ok {
            stats.reorder_released += 1;
            TC_ACT_OK
        } else {
            stats.errors += 1;
            TC_ACT_SHOT
        }
    } else if (1..=HELD_MAX).contains(&(ctx.len() as usize)) && budget.draw(cfg.reorder, cfg, stats)
    {
        let n = bounded(ctx.len() as usize);
        // SAFETY: a helper on our own context; `held.data` has room for `n` (<= HELD_MAX) bytes.
        let loaded =
            unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), 0, held.data.as_mut_ptr().cast(), n) };
        match loaded {
            0 => {
                held.len = n;
                // SAFETY: a helper without arguments.
                held.held_at_ns = unsafe { bpf_ktime_get_ns() };
                stats.reordered += 1;
                log_did(ctx, Did::Reordered, r);
                TC_ACT_SHOT
            }
            _ => {
                stats.errors += 1;
                stats.passed += 1;
                TC_ACT_OK
            }
        }
    } else {
        stats.passed += 1;
        TC_ACT_OK
    }
}

/// Offset of the MAD from the BTH of a UD SEND_ONLY: the BTH, then the DETH.
const MAD_FROM_BTH: usize = Bth::LEN
    + match Opcode::UD_SEND_ONLY.ext_len() {
        Some(n) => n,
        None => 0,
    };

/// Whether the RoCE packet `r` is a CM MAD with attribute ID `attr`: a UD SEND_ONLY to QP 1
/// (IBTA 13.5.1) carrying a whole MAD (IBTA 13.4.1) of management class CM (13.4.4) whose
/// `AttributeID` (13.4.2) is `attr` (12.11.2 Table 123).
#[inline(always)]
fn selected(ctx: &TcContext, r: &Roce, attr: u32) -> bool {
    let Ok(b) = ctx.load::<Bth>(r.bth) else {
        return false;
    };
    if b.opcode != Opcode::UD_SEND_ONLY.0 || b.dest_qp() != GSI_QPN {
        return false;
    }
    let mad = r.bth + MAD_FROM_BTH;
    if mad + MAD_LEN + ICRC_LEN > r.end {
        return false;
    }
    let (Ok(class), Ok(id)) = (
        ctx.load::<u8>(mad + MAD_MGMT_CLASS_OFFSET),
        ctx.load::<[u8; 2]>(mad + MAD_ATTR_ID_OFFSET),
    ) else {
        return false;
    };
    class == MGMT_CLASS_CM && u32::from(u16::from_be_bytes(id)) == attr
}

/// Whether one packet may still be impaired under `ImpairConfig::limit`, asked once per
/// packet, when its first impairment is drawn.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// Not asked yet for this packet.
    Unasked,
    /// Granted: this packet took one unit of the limit (or there is none).
    Granted,
    /// Refused: the limit is used up; the packet goes on untouched.
    Refused,
}

impl Budget {
    /// `hit(prob)`, and if so whether this packet may be impaired: the first hit of a packet
    /// takes one unit of the limit (compare-and-swap on the shared count), later hits of the
    /// same packet share it.
    #[inline(always)]
    fn draw(&mut self, prob: u32, cfg: &ImpairConfig, stats: &mut ImpairStats) -> bool {
        if !hit(prob) {
            return false;
        }
        if *self == Self::Unasked {
            *self = if take(cfg.limit, stats) {
                Self::Granted
            } else {
                stats.over_limit += 1;
                Self::Refused
            };
        }
        *self == Self::Granted
    }
}

/// Takes one unit of `limit` (0: none) from the shared count; false once it is used up.
#[inline(always)]
fn take(limit: u64, stats: &mut ImpairStats) -> bool {
    if limit == 0 {
        return true;
    }
    let Some(state) = ROCE_IMPAIR_LIMIT.get_ptr_mut(0) else {
        stats.errors += 1;
        return false;
    };
    // SAFETY: `state` points to the map value, which lives as long as the map; the program
    // only accesses it through atomics (user space writes it between settings), and u64 map
    // values are 8-aligned.
    let used = unsafe { AtomicU64::from_ptr(&raw mut (*state).used) };
    for _ in 0..8 {
        // SAFETY: as in `bottleneck`: an aligned, valid pointer; a single-copy atomic load.
        let old = unsafe { core::ptr::read_volatile(used.as_ptr()) };
        if old >= limit {
            return false;
        }
        if cas(used, old, old + 1) {
            return true;
        }
    }
    stats.errors += 1;
    false
}

#[inline(always)]
fn impair(ctx: &mut TcContext, cfg: &ImpairConfig, stats: &mut ImpairStats) -> i32 {
    let port = if cfg.port == 0 {
        ROCE_V2_UDP_PORT
    } else {
        cfg.port as u16
    };
    let Some(r) = parse(ctx, port) else {
        stats.not_roce += 1;
        return TC_ACT_OK;
    };
    let len = u64::from(ctx.len());
    stats.seen += 1;
    stats.seen_bytes += len;
    if cfg.mad_attr != 0 && !selected(ctx, &r, cfg.mad_attr) {
        stats.unselected += 1;
        stats.passed += 1;
        return TC_ACT_OK;
    }
    let mut budget = Budget::Unasked;

    if cfg.rate_bps != 0 && cfg.ps_per_byte != 0 {
        match bottleneck(cfg, len, r.ecn != 0, stats) {
            Queue::Overflow => {
                stats.bottleneck_dropped += 1;
                log_did(ctx, Did::BottleneckDropped, &r);
                return TC_ACT_SHOT;
            }
            Queue::EarlyDrop => {
                stats.bottleneck_early_dropped += 1;
                log_did(ctx, Did::BottleneckEarlyDropped, &r);
                return TC_ACT_SHOT;
            }
            Queue::Mark => {
                if mark_ce(ctx, &r) {
                    stats.bottleneck_marked += 1;
                    log_did(ctx, Did::BottleneckMarked, &r);
                } else {
                    stats.errors += 1;
                }
            }
            Queue::Pass => {}
        }
    }
    if budget.draw(cfg.drop, cfg, stats) {
        stats.dropped += 1;
        log_did(ctx, Did::Dropped, &r);
        return TC_ACT_SHOT;
    }
    if budget.draw(cfg.corrupt, cfg, stats) {
        if corrupt(ctx, &r) {
            stats.corrupted += 1;
            log_did(ctx, Did::Corrupted, &r);
        } else {
            stats.errors += 1;
        }
    }
    if budget.draw(cfg.ce, cfg, stats) {
        if mark_ce(ctx, &r) {
            stats.ce_marked += 1;
            log_did(ctx, Did::CeMarked, &r);
        } else {
            stats.errors += 1;
        }
    }
    if budget.draw(cfg.dup, cfg, stats) {
        if send_copy(ctx) {
            stats.duplicated += 1;
            log_did(ctx, Did::Duplicated, &r);
        } else {
            stats.errors += 1;
        }
    }
    reorder(ctx, cfg, stats, &r, &mut budget)
}

/// The tc entry point.
#[classifier]
pub fn roce_impair(mut ctx: TcContext) -> i32 {
    let Some(stats) = ROCE_IMPAIR_STATS.get_ptr_mut(0) else {
        return TC_ACT_OK;
    };
    // SAFETY: this CPU's slot of a per-CPU array; tc runs with bottom halves off, so the only
    // other run on this CPU is the nested one of our own clone (inside `bpf_clone_redirect`),
    // which touches nothing but `own_copies`, a field this run only writes when it returns
    // at once; every other field is written by this run alone.
    let stats = unsafe { &mut *stats };
    // SAFETY: `skb` is this run's context; `mark` is readable and writable from tc.
    if unsafe { (*ctx.skb.skb).mark } == IMPAIR_MARK {
        ctx.set_mark(0);
        stats.own_copies += 1;
        return TC_ACT_OK;
    }
    let Some(cfg) = ROCE_IMPAIR_CONFIG.get(0) else {
        return TC_ACT_OK;
    };
    let cfg = *cfg;
    impair(&mut ctx, &cfg, stats)
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
