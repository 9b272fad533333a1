//! roce-xdp user space: a RoCE v2 endpoint whose data path is the `roce_xdp` XDP program and
//! whose transport runs here, over AF_XDP.
//!
//! Layering (see ARCHITECTURE.md): `wire`, `transport`, `cc`, `ibcm` and `stats` are sans-I/O: they
//! import no tokio, aya, libc or clock, and take time as an argument, so they are deterministic
//! and testable without root. `xsk` (AF_XDP), `loader` (aya) and `netns` (iproute2) are the
//! I/O edges. The command line lives in the binary (src/cli/).

pub mod api;
pub mod cc;
pub mod cm;
pub mod engine;
pub mod ibcm;
pub use loader::impair;
pub mod loader;
pub mod netinfo;
pub mod netns;
pub mod stats;
pub mod time;
pub mod transport;
pub mod wire;
pub mod xsk;
