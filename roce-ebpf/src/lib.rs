//! The eBPF programs live in the `roce-ebpf` binary (src/main.rs); this library target exists so
//! that roce-user can declare a build dependency on the crate and be rebuilt when it changes.
#![no_std]
