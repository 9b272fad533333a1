//! `--trace`: every QP's congestion state sampled into a CSV while a test runs.

use std::time::{Duration, Instant};

use anyhow::bail;
use roce::{
    api::RdmaDevice,
    cc::{Trace, TraceRow},
};

use super::PerfArgs;

/// Samples every QP's congestion state into a [`Trace`] while a test runs.
pub(super) struct Tracer {
    pub(super) start: Instant,
    pub(super) every: Duration,
    pub(super) next: Instant,
    pub(super) trace: Trace,
}

impl Tracer {
    pub(super) fn new(a: &PerfArgs) -> anyhow::Result<Option<Self>> {
        if a.trace.is_none() {
            return Ok(None);
        }
        if !(a.trace_interval.is_finite() && (0.01..=10_000.0).contains(&a.trace_interval)) {
            bail!("--trace-interval takes 0.01 to 10000 milliseconds");
        }
        let now = Instant::now();
        Ok(Some(Self {
            start: now,
            every: Duration::from_secs_f64(a.trace_interval / 1000.0),
            next: now,
            trace: Trace::new(),
        }))
    }

    /// Call often from the test loop: takes a sample of every QP when one is due.
    pub(super) fn poll<D: RdmaDevice>(this: &mut Option<Self>, dev: &D) {
        let Some(t) = this else { return };
        let now = Instant::now();
        if now < t.next {
            return;
        }
        t.next = (t.next + t.every).max(now);
        let at = roce::time::Instant::from_nanos(
            u64::try_from(now.duration_since(t.start).as_nanos()).unwrap_or(u64::MAX),
        );
        for (qpn, s) in dev.cc_snapshots() {
            t.trace.rows.push(TraceRow {
                time: at,
                qpn,
                rate_bps: s.rate_bps,
                target_bps: s.target_bps,
                alpha: s.alpha,
                cnps: s.cnps,
                bytes: s.bytes,
            });
        }
    }
}
