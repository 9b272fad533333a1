//! rdma-core's public C types, generated at build time by bindgen from the installed
//! `infiniband/verbs.h` (libibverbs-dev), with bindgen's layout assertions: a size or offset
//! that differs from the header fails the build.

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks
)]

include!(concat!(env!("OUT_DIR"), "/verbs_sys.rs"));
