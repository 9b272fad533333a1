//! Per-queue AF_XDP counters: user-space ring events and the kernel's `XDP_STATISTICS`.

pub use roce_common::counters::XskStats;
