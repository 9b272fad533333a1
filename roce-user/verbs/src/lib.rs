//! A drop-in `libibverbs.so.1` over roce-xdp: unmodified RDMA programs (ibv_devices,
//! ibv_devinfo, and, as the library grows, the pingpongs and perftest) run on a Linux interface
//! with no RDMA NIC and no rdma_rxe module.
//!
//! Layout: [`device`] decides which devices exist and what they report, in safe Rust; `ffi`
//! is the C ABI (the only module with `unsafe`), and `sys` the structs bindgen generates
//! from rdma-core's installed headers. The library is linked with Debian 12's version nodes
//! (libibverbs.map) and each symbol is bound to its node where it is defined (`export!` in
//! ffi.rs), so programs linked against Debian's libibverbs1, and `dlvsym` users, bind to it.
//!
//! Run a program on it with `roce exec -d IFACE -- PROGRAM ARGS...`, or by hand with
//! `LD_LIBRARY_PATH=<dir holding libibverbs.so.1> ROCE_DEVICES=IFACE PROGRAM ARGS...`.
//!
//! Model: opening a device reads the interface (MAC, MTU, addresses) and nothing else, so
//! `ibv_devinfo` works beside a program that uses the device; the engine is started when the
//! first resource that needs it is made.

pub mod ah;
pub mod device;
pub mod events;
mod ffi;
mod sys;
pub mod verbs;
