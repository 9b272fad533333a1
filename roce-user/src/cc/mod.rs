//! Sans-I/O congestion control for RoCE v2: ECN notification point (CNP generation), DCQCN
//! reaction point (rate control per QP) and pacing.
//!
//! Deterministic, in the quinn-proto style: nothing here reads a clock, does I/O or draws a
//! random number. Time is a [`Instant`] timestamp passed in by the caller; every input is an
//! `on_*` callback taking `now`, timers are polled with `poll_timeout` and fired with
//! `handle_timeout(now)`. The same code therefore runs in the engine, in unit tests with
//! synthetic time, and in the bottleneck simulator ([`sim`]).
//!
//! The pieces, as DCQCN names them (Zhu et al., SIGCOMM 2015; see
//! `../shared/reference/roce-v2.md` §4):
//! - [`NotificationPoint`] (NP, the receiver of data): on a CE-marked RoCE packet of a QP, decides
//!   whether to send a CNP (at most one per QP per `min_time_between_cnps`); [`cnp_frame`]
//!   builds the CNP for the wire module.
//! - [`ReactionPoint`] (RP, the sender of data): DCQCN per QP: cut on CNP, α estimate, fast
//!   recovery, additive and hyper increase, driven by a timer and a byte counter. It also paces
//!   the QP's transmissions with a token bucket filled at the current rate.
//! - [`DcqcnConfig`]: the knobs under their mlx5 names, with units, defaults and validation.
//! - [`Swift`] (Kumar et al., SIGCOMM 2020): delay-based window control from RTT samples
//!   ([`RttSampler`], ACK timing), for peers and paths that mark nothing; [`SwiftConfig`] its
//!   knobs, [`CcAlgorithm`] the per-device and per-QP choice (`--cc dcqcn|swift|off`).
//! - [`trace`]: rows of (time, qpn, rate, target, α, CNPs, bytes) written as CSV for `roce plot`.
//!
//! How the transport uses this: one [`QpCongestion`] (a `NotificationPoint` and a
//! `ReactionPoint`) per RC QP:
//! - receive path: `if let Some((path, cnp)) = cc.on_data_received(now, frame.ecn(), &path,
//!   peer_qpn) { emit_frame(&path, &cnp, &[], buf) }` for each non-CNP packet;
//!   `cc.on_cnp_received(now)` for each CNP addressed to the QP;
//! - send path: before emitting a packet of `n` bytes, wait until `cc.next_send_time(now, n)`;
//!   after emitting it, `cc.on_sent(now, n)`; send with `path.ecn = cc.data_ecn()` (ECT(0))
//!   so switches can mark instead of dropping;
//! - timers: include `cc.poll_timeout()` in the QP's next wake-up and call
//!   `cc.handle_timeout(now)` when it passes (spurious calls are harmless);
//! - `roce stats -s`: [`QpCongestion::snapshot`] (rate, target, α, stage) and
//!   [`QpCongestion::stats`] ([`CcStats`], mlx5 counter names).

mod config;
mod np;
mod pacing;
mod qp;
mod rp;
pub mod sim;
mod swift;
pub mod trace;

pub use config::{ConfigError, DcqcnConfig};
pub use np::{NotificationPoint, cnp_frame};
pub use pacing::Pacer;
pub use qp::{CcSnapshot, QpCongestion};
pub use rp::{LossUndo, Phase, ReactionPoint, Stage};
pub use swift::{
    CcAlgorithm, RTT_SAMPLER_CAPACITY, RttSampler, Swift, SwiftConfig, SwiftUndo,
    flow_scaling_coefficients,
};
pub use trace::{Trace, TraceError, TraceRow};

/// Time in `cc` is the core's one clock, [`crate::time::Instant`]; durations are
/// [`core::time::Duration`].
pub use crate::time::Instant;

/// Congestion-control counters (defined in `roce_common` so the published per-QP record can
/// carry them).
pub use roce_common::counters::CcStats;
