//! `roce_xdp`: the XDP ingress classifier of roce-xdp.
//!
//! It parses Ethernet (up to two VLAN tags), IPv4 (options allowed, fragments never RoCE) or IPv6
//! (a bounded chain of extension headers), UDP to the RoCE v2 port and the BTH. RoCE packets for
//! the QPs in `ROCE_QPS` go to the AF_XDP socket of their RX queue; malformed RoCE is dropped and
//! counted under a stable reason; everything else goes on to the kernel untouched. A frame it
//! redirects carries its arrival time in XDP metadata in front of it, or over its destination
//! address where the kernel refuses the metadata helper (`roce_common::stamp`),
//! so that user space can act on when a packet arrived rather than when it got to it; the
//! clock is read only for the frames whose arrival the transport uses (CE-marked packets,
//! CNPs, and the responses of QPs whose congestion control samples RTTs,
//! `QP_FLAG_TIME_RESPONSES`), the others carry `stamp::UNTIMED`.
//!
//! Every frame is counted once in `rx_packets` and once under exactly one verdict counter of
//! `ROCE_XDP_STATS` (see `roce_common::counters::XdpStats`).
//!
//! The rare verdicts (a drop, a redirect that fell back to the kernel) are also logged with
//! aya-log when `ROCE_LOG_LEVEL` asks for it (see `roce_common::log`): the map is read on those
//! paths only, and the record is written by a BPF subprogram (`roce_ebpf::log::write`), so the
//! paths of the frames that are redirected or passed read no map and call no helper more than
//! without logging (they only carry the two header offsets a record would need).
// The object is built for bpfel-unknown-none; on the host (clippy --workspace) it is an empty
// program so that the same sources are linted everywhere.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The arrival stamp is one 8-byte store in inline assembly (see `stamp_arrival`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
#![cfg_attr(
    not(target_arch = "bpf"),
    allow(dead_code, reason = "only built for BPF")
)]

use aya_ebpf::{
    Global,
    bindings::xdp_action,
    btf_maps::{Array, HashMap, PerCpuArray, XskMap},
    helpers::generated::{bpf_ktime_get_ns, bpf_xdp_adjust_meta},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use roce_common::{
    ROCE_V2_UDP_PORT,
    counters::DeviceCounters,
    counters::{DropReason, XdpStats},
    hdr::{
        Bth, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, EthHdr, ICRC_LEN, IPPROTO_UDP,
        Ipv4Hdr, Ipv6ExtHdr, Ipv6FragHdr, Ipv6Hdr, MAX_IPV6_EXT_HDRS, MAX_VLAN_TAGS, UdpHdr,
        VlanHdr,
    },
    log::{CODE_FALLBACK, CODE_FOREIGN_QP, level_of},
    maps::{
        FLAG_DROP_FOREIGN, FLAG_NO_STAMP, FLAG_STAMP_IN_PLACE, LoadInfo, MAX_QPS, MAX_QUEUES,
        MAX_STAT_PROCS, MAX_STAT_QPS, QP_FLAG_TIME_RESPONSES, QpEntry, QpStatsRecord,
        XskQueueRecord,
    },
    multipath::{RESV7_TRAILER, SACK_TRAILER_LEN},
    opcode::{EXT_LEN_UNKNOWN, Opcode, XDP_NO_PAYLOAD, XDP_OPCODE_TABLE, XDP_TIMED},
    stamp,
};
use roce_ebpf::log::FrameRecord;

#[btf_map]
static ROCE_XDP_STATS: PerCpuArray<XdpStats, 1> = PerCpuArray::new();

#[btf_map]
static ROCE_XSKS: XskMap<{ MAX_QUEUES as usize }> = XskMap::new();

/// Indexed by destination QPN: roce-xdp allocates its QPNs below `MAX_QPS`, so one array slot
/// per QPN makes the lookup a bounds check and a load, with no hashing. `owner == 0`: not ours.
#[btf_map]
static ROCE_QPS: Array<QpEntry, { MAX_QPS as usize }> = Array::new();

/// Written by user space at load time; never read here. It makes the load visible to bpftool.
#[btf_map]
static ROCE_INFO: Array<LoadInfo, 1> = Array::new();

/// Transport counters per QP, written by the endpoint; here for their BTF (bpftool field names).
#[btf_map]
static ROCE_QP_STATS: HashMap<u32, QpStatsRecord, { MAX_STAT_QPS as usize }> = HashMap::new();

/// Device counters per endpoint process, written by the endpoint.
#[btf_map]
static ROCE_DEV_STATS: HashMap<u32, DeviceCounters, { MAX_STAT_PROCS as usize }> = HashMap::new();

/// AF_XDP counters and bind mode per RX queue, written by the endpoint.
#[btf_map]
static ROCE_XSK_STATS: HashMap<u32, XskQueueRecord, { MAX_QUEUES as usize }> = HashMap::new();

/// The `roce_common::log::LogLevel` code of the records to write (0, the default: none).
#[btf_map]
static ROCE_LOG_LEVEL: Array<u32, 1> = Array::new();

/// UDP destination port taken to be RoCE v2; set at load time (`roce load --port`).
#[unsafe(no_mangle)]
static ROCE_UDP_PORT: Global<u32> = Global::new(ROCE_V2_UDP_PORT as u32);

/// `roce_common::maps::FLAG_*` bits; set at load time.
#[unsafe(no_mangle)]
static ROCE_FLAGS: Global<u32> = Global::new(0);

/// What the parser made of a frame.
enum Class {
    /// Not RoCE: not IP, not UDP, another port, or past the IPv6 extension-header bound.
    NotRoce,
    /// An IP fragment: never RoCE.
    Fragment,
    /// UDP to the RoCE port, but malformed.
    Malformed(DropReason, At),
    /// A well-formed RoCE v2 packet.
    Roce {
        dest_qp: u32,
        ce: bool,
        cnp: bool,
        /// Whether the transport uses its arrival time on every QP (CE-marked, or a CNP),
        /// so its stamp reads the clock.
        timed: bool,
        /// A response (`XDP_TIMED`, not a CNP): timed only for a QP whose congestion control
        /// samples RTTs (`QP_FLAG_TIME_RESPONSES`).
        response: bool,
        at: At,
    },
}

/// Where the IP and UDP headers of a frame to the RoCE port are: what the log records of its
/// rare verdicts read again (offsets into the frame).
#[derive(Clone, Copy)]
struct At {
    ip: u32,
    udp: u32,
}

/// The frame's bounds, read from the context once per packet.
#[derive(Clone, Copy)]
struct Bounds {
    start: usize,
    end: usize,
}

/// A bounds-checked pointer to a `T` at `off` bytes into the frame.
#[inline(always)]
fn ptr_at<T>(b: Bounds, off: usize) -> Option<*const T> {
    if b.start + off + core::mem::size_of::<T>() > b.end {
        return None;
    }
    Some((b.start + off) as *const T)
}

/// A reference to the header `T` at `off`, for reading only the fields we need (copying whole
/// headers costs a byte load per byte). `T` is one of the `roce_common::hdr` structs.
#[inline(always)]
fn hdr_at<'a, T>(b: Bounds, off: usize) -> Option<&'a T> {
    let p = ptr_at::<T>(b, off)?;
    // SAFETY: `ptr_at` checked that `size_of::<T>()` bytes at `p` lie inside the frame, which
    // outlives this program run; `T` has alignment 1 (byte-array fields) and no invalid bit
    // patterns, and nothing writes the frame while we read it.
    Some(unsafe { &*p })
}

#[inline(always)]
fn classify(ctx: Bounds) -> Class {
    let frame_len = ctx.end - ctx.start;

    // Ethernet and up to MAX_VLAN_TAGS tags.
    let Some(eth) = hdr_at::<EthHdr>(ctx, 0) else {
        return Class::NotRoce;
    };
    let mut off = EthHdr::LEN;
    let mut ether_type = eth.ether_type();
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let Some(vlan) = hdr_at::<VlanHdr>(ctx, off) else {
            return Class::NotRoce;
        };
        ether_type = vlan.ether_type();
        off += VlanHdr::LEN;
    }

    // IP.
    let ip_off = off;
    let ce;
    if ether_type == ETH_P_IPV4 {
        let Some(ip) = hdr_at::<Ipv4Hdr>(ctx, off) else {
            return Class::NotRoce;
        };
        let ihl = ip.header_len();
        if ip.version() != 4 || ihl < Ipv4Hdr::LEN {
            return Class::NotRoce;
        }
        let frag = ip.frag_off();
        if frag & (Ipv4Hdr::MF | Ipv4Hdr::OFFSET_MASK) != 0 {
            return Class::Fragment;
        }
        if ip.proto != IPPROTO_UDP {
            return Class::NotRoce;
        }
        ce = ip.tos & 0x3 == 0x3;
        off += ihl;
    } else if ether_type == ETH_P_IPV6 {
        let Some(ip) = hdr_at::<Ipv6Hdr>(ctx, off) else {
            return Class::NotRoce;
        };
        if ip.version() != 6 {
            return Class::NotRoce;
        }
        ce = ip.traffic_class() & 0x3 == 0x3;
        off += Ipv6Hdr::LEN;
        let mut next = ip.next_hdr;
        let mut found_udp = next == IPPROTO_UDP;
        for _ in 0..MAX_IPV6_EXT_HDRS {
            if found_udp {
                break;
            }
            let Some(ext) = hdr_at::<Ipv6ExtHdr>(ctx, off) else {
                return Class::NotRoce;
            };
            let len = match next {
                Ipv6ExtHdr::HOP_BY_HOP | Ipv6ExtHdr::ROUTING | Ipv6ExtHdr::DEST_OPTS => {
                    (ext.hdr_len as usize + 1) * 8
                }
                Ipv6ExtHdr::AUTH => (ext.hdr_len as usize + 2) * 4,
                Ipv6ExtHdr::FRAGMENT => {
                    let Some(frag) = hdr_at::<Ipv6FragHdr>(ctx, off) else {
                        return Class::NotRoce;
                    };
                    // Offset (13 bits) and the M flag; an atomic fragment (both zero) is whole.
                    if u16::from_be_bytes(frag.frag_off) & 0xfff9 != 0 {
                        return Class::Fragment;
                    }
                    8
                }
                _ => return Class::NotRoce,
            };
            next = ext.next_hdr;
            found_udp = next == IPPROTO_UDP;
            off += len;
        }
        if !found_udp {
            return Class::NotRoce;
        }
    } else {
        return Class::NotRoce;
    }

    // UDP.
    let Some(udp) = hdr_at::<UdpHdr>(ctx, off) else {
        return Class::NotRoce;
    };
    if udp.dst_port() as u32 != ROCE_UDP_PORT.load() {
        return Class::NotRoce;
    }
    let at = At {
        ip: ip_off as u32,
        udp: off as u32,
    };
    let udp_len = udp.length() as usize;
    if udp_len < UdpHdr::LEN || off + udp_len > frame_len {
        return Class::Malformed(DropReason::UdpLength, at);
    }
    let payload_len = udp_len - UdpHdr::LEN;
    off += UdpHdr::LEN;

    // BTH.
    if payload_len < Bth::LEN + ICRC_LEN {
        return Class::Malformed(DropReason::BthTruncated, at);
    }
    let Some(bth) = hdr_at::<Bth>(ctx, off) else {
        return Class::Malformed(DropReason::BthTruncated, at);
    };
    if bth.tver() != 0 {
        return Class::Malformed(DropReason::BadTver, at);
    }
    let entry = XDP_OPCODE_TABLE[bth.opcode as usize];
    if entry == EXT_LEN_UNKNOWN {
        return Class::Malformed(DropReason::UnknownOpcode, at);
    }
    let headers = Bth::LEN + (entry & 0x3f) as usize + ICRC_LEN;
    if payload_len < headers + bth.pad_count() as usize {
        return Class::Malformed(DropReason::HdrTruncated, at);
    }
    // An opcode without payload carries none, but for an ACK of a QP with the multipath
    // extension on, which carries exactly its SACK trailer and says so (docs/multipath.md).
    if entry & XDP_NO_PAYLOAD != 0
        && payload_len != headers
        && !(bth.opcode == Opcode::RC_ACKNOWLEDGE.0
            && bth.resv7() & RESV7_TRAILER != 0
            && payload_len == headers + SACK_TRAILER_LEN)
    {
        return Class::Malformed(DropReason::UnexpectedPayload, at);
    }
    if payload_len & 3 != 0 {
        return Class::Malformed(DropReason::BadLength, at);
    }
    let dest_qp = bth.dest_qp();
    // QP 0 (the SMI) does not exist on RoCE. QP 1 (the GSI, the CM's MADs) is looked up in
    // ROCE_QPS like any QPN: ours while a CM agent claims it, the kernel's otherwise.
    if dest_qp == 0 {
        return Class::Malformed(DropReason::ReservedQpn, at);
    }
    Class::Roce {
        dest_qp,
        ce,
        cnp: bth.opcode == Opcode::CNP.0,
        timed: ce || bth.opcode == Opcode::CNP.0,
        response: entry & XDP_TIMED != 0 && bth.opcode != Opcode::CNP.0,
        at,
    }
}

/// Whether the record with code `code` is to be written now. Call on a rare path only: it
/// reads the `ROCE_LOG_LEVEL` map.
#[inline(always)]
fn log_enabled(code: u32) -> bool {
    ROCE_LOG_LEVEL
        .get(0)
        .is_some_and(|&current| level_of(code).enabled_at(current))
}

/// Writes the log record with code `code` (see `roce_common::log`: a `DropReason` code,
/// `CODE_FOREIGN_QP` or `CODE_FALLBACK`) for the frame in `ctx`, whose IP and UDP headers are at
/// `at`, if `ROCE_LOG_LEVEL` asks for it: the IP addresses, the UDP source port, and the BTH's
/// destination QPN, opcode and PSN when the frame holds a whole BTH. Call on a rare path only.
#[inline(always)]
fn log_rare(ctx: &XdpContext, code: u32, at: At) {
    if !log_enabled(code) {
        return;
    }
    let b = Bounds {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let mut rec = FrameRecord::new(code);
    let (ip, udp) = (at.ip as usize, at.udp as usize);
    if let Some(v4) = hdr_at::<Ipv4Hdr>(b, ip)
        && v4.version() == 4
    {
        rec.set_v4(v4.src, v4.dst);
    } else if let Some(v6) = hdr_at::<Ipv6Hdr>(b, ip) {
        rec.src = v6.src;
        rec.dst = v6.dst;
    }
    if let Some(u) = hdr_at::<UdpHdr>(b, udp) {
        rec.sport = u.src_port();
    }
    if let Some(bth) = hdr_at::<Bth>(b, udp + UdpHdr::LEN) {
        rec.has_bth = 1;
        rec.qpn = bth.dest_qp();
        rec.opcode = bth.opcode;
        rec.psn = bth.psn();
    }
    roce_ebpf::log::write(&rec);
}

/// Writes the arrival stamp (`roce_common::stamp`: the magic and `bpf_ktime_get_ns`, or
/// `stamp::UNTIMED` where `timed` is false) into [`stamp::STAMP_LEN`] bytes of XDP metadata in
/// front of the frame. Call for a frame about to be redirected to an AF_XDP socket, which finds
/// the stamp in front of the packet; one helper call, the clock's if timed, and one store.
/// Where the driver supports no metadata, `bpf_xdp_adjust_meta` fails and nothing is written
/// (user space then counts the frame in `rx_no_stamp`).
#[inline(always)]
fn stamp_arrival(ctx: &XdpContext, timed: bool) {
    // SAFETY: `ctx.ctx` is the program's own context pointer; the helper only moves
    // `data_meta` within the frame's headroom, or fails.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -(stamp::STAMP_LEN as i32)) } != 0 {
        return;
    }
    let (meta, data) = (ctx.metadata(), ctx.data());
    if meta + stamp::STAMP_LEN > data {
        return;
    }
    // SAFETY: `meta..meta + STAMP_LEN` was checked to lie before `data`, inside the metadata
    // area the helper just reserved in the frame's headroom, which nothing else reads or
    // writes during this program run.
    unsafe { store_stamp(meta, timed) };
}

/// Writes the arrival stamp word at `at`, for [`stamp_arrival`] once it
/// has bounds-checked the spot: the clock's reading (`roce_common::stamp::encode`) where
/// `timed`, else `stamp::UNTIMED` with no helper call (the clock costs as much as the parsing;
/// see `roce_common::stamp`).
///
/// One 8-byte store, written as the instruction itself: Rust's `write_unaligned` becomes
/// eight byte stores and their shifts on BPF (LLVM assumes no unaligned access there), while
/// the verifier allows a packet store at any alignment where the CPU does
/// (`check_pkt_ptr_alignment`: strict only without efficient unaligned access), and the
/// verifier's pointer arithmetic rules forbid testing the pointer's alignment first.
///
/// # Safety
/// `at..at + STAMP_LEN` must lie inside the frame or its metadata, checked against
/// `data_end` (or `data`) on this path so the verifier sees the check, and be bytes no one
/// else reads or writes during this program run.
#[inline(always)]
unsafe fn store_stamp(at: usize, timed: bool) {
    let word = if timed {
        // SAFETY: the helper takes no arguments and only reads the clock.
        stamp::encode(unsafe { bpf_ktime_get_ns() })
    } else {
        stamp::UNTIMED
    };
    #[cfg(target_arch = "bpf")]
    // SAFETY: the caller checked `at..at + STAMP_LEN` (this function's contract); the asm
    // stores 8 bytes there and touches nothing else.
    unsafe {
        core::arch::asm!(
            "*(u64 *)({p} + 0) = {v}",
            p = in(reg) at,
            v = in(reg) word,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(target_arch = "bpf"))]
    let _ = (at, word);
}

/// Writes the arrival stamp over the frame's Ethernet destination address (`FLAG_STAMP_IN_PLACE`:
/// the kernel refuses `bpf_xdp_adjust_meta`): the low [`stamp::STAMP_BITS`] bits of the
/// clock, or of `stamp::UNTIMED` where `timed` is false, in the address's six bytes, native
/// byte order (`roce_common::stamp::in_place`). User space reads them and writes its
/// interface's address back before anything parses the frame; a frame redirected here was
/// sent to that address, as a RoCE NIC takes only frames for its own (or a group's, and
/// roce-xdp joins none). No helper call: moving the frame with `bpf_xdp_adjust_head` to make
/// room in front of it cost about 15 ns per frame on Dec 7's VM. Returns the address it
/// overwrote, for [`restore_dst_mac`] if the frame then goes anywhere but an AF_XDP socket of
/// this interface; `None`, with nothing written, where the frame is shorter than the address.
#[inline(always)]
fn stamp_dst_mac(ctx: &XdpContext, timed: bool) -> Option<(u32, u16)> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + stamp::STAMP_IN_PLACE_LEN > end {
        return None;
    }
    let word = if timed {
        // SAFETY: the helper takes no arguments and only reads the clock.
        stamp::encode(unsafe { bpf_ktime_get_ns() })
    } else {
        stamp::UNTIMED
    };
    // SAFETY: `data..data + 6` was checked against `data_end` above, on this path, and the
    // frame's bytes are this program's to read and write during the run.
    Some(unsafe { swap_dst_mac(data, word as u32, (word >> 32) as u16) })
}

/// Puts back the destination address [`stamp_dst_mac`] overwrote.
#[inline(always)]
fn restore_dst_mac(ctx: &XdpContext, (lo, hi): (u32, u16)) {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + stamp::STAMP_IN_PLACE_LEN > end {
        return;
    }
    // SAFETY: as in `stamp_dst_mac`.
    let _ = unsafe { swap_dst_mac(data, lo, hi) };
}

/// Reads the six bytes at `at` and writes `lo` (four bytes) and `hi` (two) there; returns
/// what was there. One load and one store of each width, written as the instructions
/// themselves for the reason [`store_stamp`] gives.
///
/// # Safety
/// `at..at + 6` must lie inside the frame, checked against `data_end` on this path so the
/// verifier sees the check, and be bytes no one else reads or writes during this run.
#[inline(always)]
unsafe fn swap_dst_mac(at: usize, lo: u32, hi: u16) -> (u32, u16) {
    #[cfg(target_arch = "bpf")]
    {
        let (old_lo, old_hi): (u32, u16);
        // SAFETY: the caller checked `at..at + 6` (this function's contract); the asm loads
        // and stores those six bytes and touches nothing else.
        unsafe {
            core::arch::asm!(
                "{ol} = *(u32 *)({p} + 0)",
                "{oh} = *(u16 *)({p} + 4)",
                "*(u32 *)({p} + 0) = {lo}",
                "*(u16 *)({p} + 4) = {hi}",
                p = in(reg) at,
                lo = in(reg) lo,
                hi = in(reg) hi,
                ol = out(reg) old_lo,
                oh = out(reg) old_hi,
                options(nostack, preserves_flags),
            );
        }
        (old_lo, old_hi)
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        let _ = at;
        (lo, hi)
    }
}

/// The XDP entry point: classify, count once, act.
#[xdp]
pub fn roce_xdp(ctx: XdpContext) -> u32 {
    let Some(stats) = ROCE_XDP_STATS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the pointer is this CPU's slot of a per-CPU array; XDP programs are not preempted
    // on their CPU, so nothing else writes this slot while we hold the reference.
    let stats = unsafe { &mut *stats };
    let bounds = Bounds {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let len = (bounds.end - bounds.start) as u64;
    stats.rx_packets += 1;
    stats.rx_bytes += len;

    match classify(bounds) {
        Class::NotRoce => {
            stats.pass_not_roce += 1;
            xdp_action::XDP_PASS
        }
        Class::Fragment => {
            stats.pass_fragment += 1;
            xdp_action::XDP_PASS
        }
        Class::Malformed(reason, at) => {
            stats.count_drop(reason);
            log_rare(&ctx, reason as u32, at);
            xdp_action::XDP_DROP
        }
        Class::Roce {
            dest_qp,
            ce,
            cnp,
            timed,
            response,
            at,
        } => {
            stats.roce_packets += 1;
            stats.roce_bytes += len;
            if ce {
                stats.ecn_ce += 1;
            }
            if cnp {
                stats.cnp += 1;
            }
            let qp = if dest_qp < MAX_QPS {
                ROCE_QPS.get(dest_qp).filter(|e| e.owner != 0)
            } else {
                None
            };
            if let Some(qp) = qp {
                let timed = timed || (response && qp.flags & QP_FLAG_TIME_RESPONSES != 0);
                // Constants the verifier sees (read-only data): the metadata helper a kernel
                // refuses (FLAG_STAMP_IN_PLACE) sits on a path it never explores.
                let flags = ROCE_FLAGS.load();
                let in_place = flags & (FLAG_NO_STAMP | FLAG_STAMP_IN_PLACE) == FLAG_STAMP_IN_PLACE;
                let mut dst_mac = None;
                if in_place {
                    dst_mac = stamp_dst_mac(&ctx, timed);
                    if dst_mac.is_none() {
                        // A socket of an interface stamped in place takes the first bytes
                        // for the stamp: a frame without one must not reach it.
                        stats.redirect_fallback_pass += 1;
                        log_rare(&ctx, CODE_FALLBACK, at);
                        return xdp_action::XDP_PASS;
                    }
                } else if flags & FLAG_NO_STAMP == 0 {
                    stamp_arrival(&ctx, timed);
                }
                let queue = ctx.rx_queue_index();
                match ROCE_XSKS.redirect(queue, u64::from(xdp_action::XDP_PASS)) {
                    Ok(action) if action == xdp_action::XDP_REDIRECT => {
                        stats.redirected += 1;
                        action
                    }
                    _ => {
                        if let Some(mac) = dst_mac {
                            restore_dst_mac(&ctx, mac);
                        }
                        stats.redirect_fallback_pass += 1;
                        log_rare(&ctx, CODE_FALLBACK, at);
                        xdp_action::XDP_PASS
                    }
                }
            } else if ROCE_FLAGS.load() & FLAG_DROP_FOREIGN != 0 {
                stats.drop_foreign_qp += 1;
                log_rare(&ctx, CODE_FOREIGN_QP, at);
                xdp_action::XDP_DROP
            } else {
                stats.pass_foreign_qp += 1;
                xdp_action::XDP_PASS
            }
        }
    }
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
