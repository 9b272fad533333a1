//! Transport counters, per QP and per device, under the names operators know: rxe's
//! (`rxe_hw_counters.c`) and mlx5's (`mlx5/counters.c`), see reference/roce-v2.md §5.
//!
//! Some events have a name in both drivers (rxe `out_of_seq_request`, mlx5 `out_of_sequence`);
//! both are kept so dashboards written for either keep working. The device struct holds the
//! per-device events ([`crate::transport::Device::device_counters`]); the sum of every QP's
//! counters is [`crate::transport::Device::qp_counters`].

pub use roce_common::counters::{DeviceCounters, QpCounters};
