//! The baselines of `cargo xtask bench xdp`, which reports roce_xdp's cost per packet as a ratio
//! to each (names in `roce_common::maps`):
//! - `xdp_pass` returns XDP_PASS and does nothing else;
//! - `xdp_redirect_bare` is the smallest program that does roce_xdp's redirect: it parses
//!   nothing and redirects every frame into the AF_XDP socket of its RX queue
//!   (`bpf_redirect_map` on `BARE_XSKS`, XDP_PASS when the slot is empty), as the default
//!   program of xdp-tools' libxdp does for an AF_XDP socket.
//!
//! It also holds `xdp_meta_probe`, never attached: the loader loads it to learn whether the
//! kernel lets XDP programs call `bpf_xdp_adjust_meta` (`roce_common::maps::FLAG_NO_STAMP`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(
    not(target_arch = "bpf"),
    allow(dead_code, reason = "only built for BPF")
)]

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::XskMap,
    helpers::generated::bpf_xdp_adjust_meta,
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use roce_common::maps::MAX_QUEUES;

/// The AF_XDP socket of each RX queue, for `xdp_redirect_bare`.
#[btf_map]
static BARE_XSKS: XskMap<{ MAX_QUEUES as usize }> = XskMap::new();

/// The pass baseline.
#[xdp]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The redirect baseline.
#[xdp]
pub fn xdp_redirect_bare(ctx: XdpContext) -> u32 {
    BARE_XSKS
        .redirect(ctx.rx_queue_index(), u64::from(xdp_action::XDP_PASS))
        .unwrap_or(xdp_action::XDP_PASS)
}

/// The metadata probe: reserves 8 bytes of metadata and passes the frame.
#[xdp]
pub fn xdp_meta_probe(ctx: XdpContext) -> u32 {
    // SAFETY: `ctx.ctx` is the program's own context pointer; the helper only moves
    // `data_meta` within the frame's headroom, or fails.
    let _ = unsafe { bpf_xdp_adjust_meta(ctx.ctx, -8) };
    xdp_action::XDP_PASS
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
