//! The ABI shared by the `roce_xdp` eBPF program and the user-space endpoint.
//!
//! Everything here is `no_std`, allocation-free and `const`-friendly, so the eBPF program and
//! user space read the very same definitions: header sizes, the opcode table, counter fields and
//! drop reasons, and the names of maps and load-time globals. Changing a value here changes the
//! ABI between the two sides; drop-reason codes are never renumbered or reused.
#![no_std]

pub mod counters;
pub mod hdr;
pub mod impair;
pub mod log;
pub mod mad;
pub mod maps;
pub mod multipath;
pub mod opcode;
pub mod stamp;

/// The IANA-assigned UDP destination port of RoCE v2 (IBA Annex A17.2.1).
pub const ROCE_V2_UDP_PORT: u16 = 4791;
