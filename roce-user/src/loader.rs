//! Loads `roce_xdp` onto an interface, pins its maps and link, and finds them again.

/// The eBPF object built by build.rs (empty when built with `AYA_BUILD_SKIP=1`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce-ebpf"));
