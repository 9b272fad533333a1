//! The counter publisher: writes a device's transport, QP and AF_XDP counters into the pinned
//! stats maps, where `roce stats` and bpftool read them.

use std::{sync::Arc, time::Duration};

use roce_common::maps::{BIND_COPY, BIND_ZEROCOPY, QpStatsRecord, XskQueueRecord};

use super::driver::Shared;
use crate::loader::process_alive;
use crate::{
    loader::{LoadError, Pins},
    transport::{self, DeviceCounters},
    xsk::BindMode,
};

/// Writes the device's counters into the pinned stats maps, where `roce stats` and bpftool
/// read them. Runs every [`PUBLISH_EVERY`] on its own thread, and once more at close.
#[derive(Clone)]
pub(crate) struct Publisher {
    pub(crate) shards: Arc<[Arc<Shared>]>,
    pub(crate) pins: Pins,
    pub(crate) bind_modes: Vec<(u32, BindMode)>,
}

/// How often the counters are published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);

impl Publisher {
    pub(crate) fn publish(&self) -> Result<(), LoadError> {
        let pid = std::process::id();
        let mut devc = DeviceCounters::default();
        let mut qps = Vec::new();
        for shard in self.shards.iter() {
            let dev = shard.lock();
            // QP 1 (the CM's), always ready to send, as a GSI QP is once the port is up.
            qps.extend(dev.gsi().map(|g| {
                (
                    transport::Qpn::GSI,
                    transport::QpState::Rts,
                    *g.counters(),
                    None,
                )
            }));
            qps.extend(dev.qps().map(|q| {
                let cc = q.congestion().map(transport::QpCc::snapshot);
                (q.qpn(), q.state(), *q.counters(), cc)
            }));
            devc.add(dev.device_counters());
        }
        let mut qmap = self.pins.qp_stats()?;
        for (qpn, state, counters, cc) in qps {
            let rec = record(pid, state, counters, cc);
            qmap.insert(qpn.value(), rec, 0).map_err(LoadError::from)?;
        }
        self.pins
            .dev_stats()?
            .insert(pid, devc, 0)
            .map_err(LoadError::from)?;
        let mut xsk = std::collections::BTreeMap::new();
        for shard in self.shards.iter() {
            xsk.extend(
                shard
                    .xsk
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .map(|(q, st)| (*q, *st)),
            );
        }
        let mut xmap = self.pins.xsk_stats()?;
        for (q, stats) in xsk {
            let bind = self
                .bind_modes
                .iter()
                .find(|(n, _)| *n == q)
                .map_or(BIND_COPY, |(_, m)| match m {
                    BindMode::ZeroCopy => BIND_ZEROCOPY,
                    BindMode::Copy => BIND_COPY,
                });
            xmap.insert(
                q,
                XskQueueRecord {
                    owner: pid,
                    bind_mode: bind,
                    stats,
                },
                0,
            )
            .map_err(LoadError::from)?;
        }
        Ok(())
    }

    /// Writes `qp`'s counters as they are now: call it just before the QP is destroyed, so
    /// that what it did since the last [`Publisher::publish`] still counts (its record stays
    /// until the process retires, like a NIC's per-device totals).
    ///
    /// # Errors
    /// The stats map cannot be written.
    pub(crate) fn publish_qp(&self, qp: &transport::Qp) -> Result<(), LoadError> {
        let cc = qp.congestion().map(transport::QpCc::snapshot);
        let rec = record(std::process::id(), qp.state(), *qp.counters(), cc);
        self.pins
            .qp_stats()?
            .insert(qp.qpn().value(), rec, 0)
            .map_err(LoadError::from)
    }

    /// Folds the records of `owner` (or, with `None`, of every process that no longer exists)
    /// into the retired records (QPN 0 and PID 0), so per-interface totals stay cumulative like
    /// a NIC's while the maps stay bounded. Call with the QPN lock held.
    pub(crate) fn retire(&self, owner: Option<u32>) {
        let gone = |o: u32| o != 0 && owner.map_or(!process_alive(o), |me| o == me);
        if let Ok(mut m) = self.pins.qp_stats() {
            let mut retired = m.get(&0, 0).unwrap_or_default();
            let old: Vec<(u32, QpStatsRecord)> = m
                .iter()
                .filter_map(Result::ok)
                .filter(|(k, r)| *k != 0 && gone(r.owner))
                .collect();
            if !old.is_empty() {
                for (k, r) in &old {
                    retired.counters.add(&r.counters);
                    retired.cc.add(&r.cc);
                    let _ = m.remove(k);
                }
                retired.owner = 0;
                retired.state = 0;
                retired.rate_bps = 0;
                retired.target_bps = 0;
                retired.alpha_1024 = 0;
                let _ = m.insert(0, retired, 0);
            }
        }
        if let Ok(mut m) = self.pins.dev_stats() {
            let mut retired = m.get(&0, 0).unwrap_or_default();
            let old: Vec<(u32, DeviceCounters)> = m
                .iter()
                .filter_map(Result::ok)
                .filter(|(pid, _)| gone(*pid))
                .collect();
            if !old.is_empty() {
                for (pid, d) in &old {
                    retired.add(d);
                    let _ = m.remove(pid);
                }
                let _ = m.insert(0, retired, 0);
            }
        }
    }
}

/// The pinned record of one QP.
fn record(
    pid: u32,
    state: transport::QpState,
    counters: transport::QpCounters,
    cc: Option<crate::cc::CcSnapshot>,
) -> QpStatsRecord {
    QpStatsRecord {
        owner: pid,
        state: state.code(),
        counters,
        rate_bps: cc.map_or(0, |c| c.rate_bps),
        target_bps: cc.map_or(0, |c| c.target_bps),
        alpha_1024: cc.map_or(0, |c| u64::from(c.alpha_fixed)),
        cc: cc.map(|c| c.stats).unwrap_or_default(),
    }
}
