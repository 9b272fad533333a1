//! The eBPF programs live in the binaries of this crate (src/main.rs, src/impair.rs, src/pass.rs);
//! this library holds what two of them share (the writing of log records), and lets roce-user
//! declare a build dependency on the crate so that it is rebuilt when it changes.
#![no_std]

pub mod log;
