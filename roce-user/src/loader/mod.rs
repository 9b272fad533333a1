//! Loading the eBPF programs and finding them again through their pins.
//!
//! - `xdp.rs` (its items are re-exported here): [`load`] puts `roce_xdp` on an interface's
//!   receive path and [`unload`] takes it away; [`Pins`] opens its maps for the engine,
//!   `roce status` and `roce stat`.
//! - [`impair`] (also at `crate::impair`): `roce_impair` at an interface's egress.
//! - [`ebpf_log`]: the programs' aya-log records, switched by level and read by `roce log`.
//! - `pins.rs`: the pin directory handling both share (fresh directory, pinned link, detach,
//!   removal).
//!
//! This is an I/O edge: it talks to the kernel through aya and nix.

pub mod ebpf_log;
pub mod impair;
mod pins;
mod xdp;

pub use pins::{BPFFS, PIN_LINK, bpffs, reachable};
pub use xdp::*;

/// The eBPF object built by build.rs (empty when built with `AYA_BUILD_SKIP=1`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce-ebpf"));

/// The `roce_impair` tc program (empty with `AYA_BUILD_SKIP=1`), loaded by [`impair`].
pub static IMPAIR_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce-impair"));

/// A trivial XDP_PASS program (empty with `AYA_BUILD_SKIP=1`): the baseline that
/// `cargo xtask bench xdp` measures roce_xdp against.
pub static XDP_PASS_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-pass"));
