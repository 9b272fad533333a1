//! Names of the maps, programs and load-time globals of `roce_xdp`, and the types stored in its maps.
//!
//! User space looks everything up by these constants, so a rename is a compile error on both sides.

/// The XDP program.
pub const PROG_ROCE_XDP: &str = "roce_xdp";

/// The baselines of `cargo xtask bench xdp` (object `xdp-pass`): a program that returns
/// XDP_PASS and nothing else, and the smallest program that does roce_xdp's redirect (parse
/// nothing, `bpf_redirect_map` into an XSKMAP by RX queue, as xdp-tools' default AF_XDP program).
pub const PROG_XDP_PASS: &str = "xdp_pass";
/// See [`PROG_XDP_PASS`].
pub const PROG_XDP_REDIRECT_BARE: &str = "xdp_redirect_bare";
/// In the object of [`PROG_XDP_PASS`]: a program that only calls `bpf_xdp_adjust_meta`, which
/// the loader loads (never attaches) to learn whether the kernel lets XDP programs write
/// metadata before it loads `roce_xdp` (see [`FLAG_STAMP_IN_PLACE`]).
pub const PROG_XDP_META_PROBE: &str = "xdp_meta_probe";
/// The XSKMAP of [`PROG_XDP_REDIRECT_BARE`], indexed by RX queue like [`MAP_XSKS`].
pub const MAP_BARE_XSKS: &str = "BARE_XSKS";

/// Per-CPU array with one [`crate::counters::XdpStats`] entry.
pub const MAP_XDP_STATS: &str = "ROCE_XDP_STATS";
/// XSKMAP indexed by RX queue: the AF_XDP socket that serves each queue.
pub const MAP_XSKS: &str = "ROCE_XSKS";
/// Array indexed by destination QPN of [`QpEntry`]: the QPs that are ours (`owner != 0`).
/// roce-xdp allocates its QPNs in `[FIRST_QPN, MAX_QPS)`, so the lookup needs no hashing.
/// QPN 1 (the GSI, which carries the CM's MADs) is in it too while a process runs a CM agent on
/// the interface (`roce::api::Device::cm_enable`); otherwise its packets go to the kernel like
/// any foreign QP's. QPN 0 is never ours (the program drops it as reserved: no QP 0 on RoCE).
pub const MAP_QPS: &str = "ROCE_QPS";

/// Array with one [`LoadInfo`]: how and where the program was loaded, written by `roce load`.
pub const MAP_INFO: &str = "ROCE_INFO";

/// Hash map from QPN to [`QpStatsRecord`]: transport counters of every QP, written by the
/// endpoint that owns it (never read by the XDP program).
pub const MAP_QP_STATS: &str = "ROCE_QP_STATS";
/// Hash map from PID to [`crate::counters::DeviceCounters`]: device counters per endpoint process.
pub const MAP_DEV_STATS: &str = "ROCE_DEV_STATS";
/// Hash map from RX queue to [`XskQueueRecord`]: AF_XDP counters and bind mode per queue.
pub const MAP_XSK_STATS: &str = "ROCE_XSK_STATS";

/// The QPs one endpoint device holds unless told otherwise: the default of the transport's
/// `DeviceConfig::max_qp`, which `ibv_query_device` reports as `max_qp` (issue 20: 16,384 QPs
/// on one device). Below [`MAX_QPS`], whose slots the QPNs index.
pub const DEFAULT_MAX_QP: u32 = 16384;
/// Capacity of [`MAP_QP_STATS`]: two devices' worth of QPs at their default limit
/// ([`DEFAULT_MAX_QP`]), the GSI QPs and the retired record (QPN 0), so an endpoint with all
/// its QPs publishes every one's counters while another process's records wait to be retired.
pub const MAX_STAT_QPS: u32 = 2 * DEFAULT_MAX_QP + MAX_STAT_PROCS + 1;
/// Capacity of [`MAP_DEV_STATS`].
pub const MAX_STAT_PROCS: u32 = 64;

/// Global (u32): the UDP destination port taken to be RoCE v2, 4791 by default.
pub const GLOBAL_UDP_PORT: &str = "ROCE_UDP_PORT";
/// Global (u32): a bit set of `FLAG_*` values.
pub const GLOBAL_FLAGS: &str = "ROCE_FLAGS";

/// Flag: drop RoCE packets for QPs that are not in [`MAP_QPS`] instead of passing them.
pub const FLAG_DROP_FOREIGN: u32 = 1 << 0;
/// Flag, in [`LoadInfo`] only: a process loaded roce_xdp for itself (a device opened through
/// the API or the drop-in libibverbs) and holds its XDP link instead of pinning it, so the
/// kernel detaches the program when that process ends, even on SIGKILL.
pub const FLAG_PROCESS_HELD: u32 = 1 << 1;
/// Flag: stamp no arrival time; user space then takes the time it got a frame as its arrival
/// (`rx_no_stamp` counts those frames). The loader never sets it since [`FLAG_STAMP_IN_PLACE`]
/// needs no helper; `cargo xtask bench xdp` loads a copy of `roce_xdp` with it to measure
/// what the stamp costs.
pub const FLAG_NO_STAMP: u32 = 1 << 2;
/// Flag: write the arrival stamp over the frame's Ethernet destination address
/// ([`crate::stamp::in_place`]) instead of into XDP metadata. Set by the loader where the
/// kernel refuses XDP programs the `bpf_xdp_adjust_meta` helper (seen on a hardened 6.18
/// build: "program of this type cannot use helper bpf_xdp_adjust_meta#54"). An AF_XDP socket
/// of an interface loaded so reads the stamp and writes the interface's address back before
/// anything reads the frame (a frame redirected to it was sent to that address, as a RoCE NIC
/// takes only frames for its own), and a frame the program does not redirect after all gets
/// its address back before the kernel sees it. No helper call: this costs one load and one
/// store of six bytes, where moving the frame to make room in front of it
/// ([`FLAG_STAMP_PUSHED`]) cost about 15 ns per frame.
pub const FLAG_STAMP_IN_PLACE: u32 = 1 << 4;
/// Flag of a `roce_xdp` built before 2026-12-07, which pushed the arrival stamp in front of
/// the frame with `bpf_xdp_adjust_head` where the kernel refused metadata. No build since sets
/// it. Such a program can stay pinned across an upgrade; an AF_XDP socket refuses to open on
/// its interface (its frames would start 8 bytes early) and says to load the program again.
pub const FLAG_STAMP_PUSHED: u32 = 1 << 3;

/// Capacity of [`MAP_XSKS`]: RX queues served.
pub const MAX_QUEUES: u32 = 64;
/// Capacity of [`MAP_QPS`]: QPNs at or above this are never ours.
pub const MAX_QPS: u32 = 65536;
const _: () = assert!(DEFAULT_MAX_QP < MAX_QPS - FIRST_QPN);
/// The lowest QPN roce-xdp allocates (below are QP0/QP1 and the range rxe also skips).
pub const FIRST_QPN: u32 = 17;

/// Value of [`MAP_QPS`]: who owns the QP. `owner` is the PID of the process that registered it
/// (0: the slot is free), so that several processes on one interface can tell their QPs apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpEntry {
    /// PID of the owning process.
    pub owner: u32,
    /// `QP_FLAG_*` bits; other bits are reserved, zero.
    pub flags: u32,
}

/// [`QpEntry::flags`]: `roce_xdp` reads the clock for this QP's responses (ACKs, NAKs, READ
/// responses, atomic ACKs) and stamps them with their arrival time, because its congestion
/// control takes RTT samples from them (Swift). Without it a response carries
/// `stamp::UNTIMED`: DCQCN and no CC use no response's arrival, and the clock costs as much
/// as the rest of the program (`roce_common::stamp`). CE-marked packets and CNPs are timed
/// for every QP.
pub const QP_FLAG_TIME_RESPONSES: u32 = 1 << 0;

/// [`LoadInfo::mode`]: native (driver) XDP.
pub const MODE_NATIVE: u32 = 1;
/// [`LoadInfo::mode`]: generic (skb) XDP.
pub const MODE_SKB: u32 = 2;

/// Value of [`MAP_INFO`]: a record of the load, so that `roce status` and bpftool can tell how
/// the program was attached without asking netlink.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    /// Interface index the program is attached to (in its network namespace).
    pub ifindex: u32,
    /// [`MODE_NATIVE`] or [`MODE_SKB`].
    pub mode: u32,
    /// UDP port taken to be RoCE v2.
    pub port: u32,
    /// `FLAG_*` bits the program was loaded with.
    pub flags: u32,
    /// PID of the `roce load` that attached it.
    pub loader_pid: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Load time, seconds since the Unix epoch.
    pub loaded_at: u64,
    /// Interface name, NUL-padded.
    pub ifname: [u8; 16],
    /// Network namespace name given to `roce load --netns`, NUL-padded; empty for the current one.
    pub netns: [u8; 32],
}

/// Value of [`MAP_QP_STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStatsRecord {
    /// PID of the process that owns the QP.
    pub owner: u32,
    /// QP state: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 4 SQD, 5 SQE, 6 ERR (`enum ibv_qp_state`).
    pub state: u32,
    /// The counters.
    pub counters: crate::counters::QpCounters,
    /// DCQCN current rate of the QP, bits/s (the line rate while not limited; 0 when the QP
    /// has no congestion control, e.g. UD, or for the retired record).
    pub rate_bps: u64,
    /// DCQCN target rate, bits/s.
    pub target_bps: u64,
    /// DCQCN α in 1024ths (mlx5 fixed point).
    pub alpha_1024: u64,
    /// Congestion-control counters.
    pub cc: crate::counters::CcStats,
}

/// [`XskQueueRecord::bind_mode`]: copy mode.
pub const BIND_COPY: u32 = 1;
/// [`XskQueueRecord::bind_mode`]: zero-copy mode.
pub const BIND_ZEROCOPY: u32 = 2;

/// Value of [`MAP_XSK_STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskQueueRecord {
    /// PID of the process whose socket serves the queue.
    pub owner: u32,
    /// [`BIND_COPY`] or [`BIND_ZEROCOPY`].
    pub bind_mode: u32,
    /// The counters.
    pub stats: crate::counters::XskStats,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: QpEntry is #[repr(C)], Copy, and made of u32s with no padding.
    unsafe impl aya::Pod for super::QpEntry {}
    // SAFETY: XdpStats is #[repr(C)], Copy, and made of u64s with no padding.
    unsafe impl aya::Pod for crate::counters::XdpStats {}
    // SAFETY: LoadInfo is #[repr(C)], Copy, u32s then a u64 at offset 24 and byte arrays: no padding.
    unsafe impl aya::Pod for super::LoadInfo {}
    // SAFETY: #[repr(C)], two u32s then u64 counters and u64 fields: no padding.
    unsafe impl aya::Pod for super::QpStatsRecord {}
    // SAFETY: #[repr(C)], two u32s then u64 counters: no padding.
    unsafe impl aya::Pod for super::XskQueueRecord {}
    // SAFETY: #[repr(C)] u64 counters.
    unsafe impl aya::Pod for crate::counters::DeviceCounters {}
}

const _: () = assert!(core::mem::size_of::<LoadInfo>() == 80);
