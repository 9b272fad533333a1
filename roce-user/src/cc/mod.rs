//! Sans-I/O congestion control for RoCE v2: ECN notification point (CNP generation), DCQCN
//! reaction point (rate control per QP) and pacing.
//!
//! Deterministic, in the quinn-proto style: nothing here reads a clock, does I/O or draws a
//! random number. Time is a [`Nanos`] timestamp passed in by the caller; every input is an
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
pub mod trace;

use core::{fmt, ops::Add, time::Duration};

pub use config::{ConfigError, DcqcnConfig};
pub use np::{NotificationPoint, cnp_frame};
pub use pacing::Pacer;
pub use qp::{CcSnapshot, QpCongestion};
pub use rp::{Phase, ReactionPoint, Stage};
pub use trace::{Trace, TraceError, TraceRow};

/// A point in time, in nanoseconds since an arbitrary epoch chosen by the caller (the engine uses
/// a monotonic clock; tests and the simulator start at zero).
///
/// It is the only notion of time in `cc`: the caller converts its clock to `Nanos` at the edge
/// (`Nanos(instant.duration_since(epoch).as_nanos() as u64)`), which keeps this module
/// deterministic. Durations are [`core::time::Duration`]. If the transport grows its own
/// `Instant` type, a `From` conversion in either direction is all that is needed.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// Time zero.
    pub const ZERO: Self = Self(0);

    /// `us` microseconds after the epoch.
    #[must_use]
    pub const fn from_micros(us: u64) -> Self {
        Self(us.saturating_mul(1000))
    }

    /// The time elapsed from `earlier` to `self`, zero if `earlier` is later.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
}

impl Add<Duration> for Nanos {
    type Output = Self;
    /// Saturating: a time past `u64::MAX` ns (584 years) stays at the end of time.
    fn add(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// Congestion-control counters (defined in `roce_common` so the published per-QP record can
/// carry them).
pub use roce_common::counters::CcStats;
