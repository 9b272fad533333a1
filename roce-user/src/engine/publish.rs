//! The counter publisher: writes a device's transport, QP and AF_XDP counters into the pinned
//! stats maps, where `roce stats` and bpftool read them.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

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
    /// Held while a publication gathers and writes its records, and while a destroyed QP's
    /// record is retired ([`Publisher::retire_qp`]), so that a publication that saw the QP
    /// alive cannot write its record back after it was retired.
    pub(crate) writing: Arc<Mutex<()>>,
}

/// How often the counters are published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);

impl Publisher {
    pub(crate) fn publish(&self) -> Result<(), LoadError> {
        let _writing = self.hold();
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

    /// Holds off publications (see [`Publisher::writing`]). Take it before a shard's lock.
    pub(crate) fn hold(&self) -> MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The record `qp` would be published with now: take it just before the QP is destroyed
    /// and give it to [`Publisher::retire_qp`].
    pub(crate) fn last_record(qp: &transport::Qp) -> QpStatsRecord {
        let cc = qp.congestion().map(transport::QpCc::snapshot);
        let mut counters = *qp.counters();
        // The ACKs and NAKs it still owes leave after it is destroyed
        // (`Device::owes_transmit`), one frame each, counted by a QP no record shows any
        // more: count them here, so that the interface's totals hold every frame that left
        // (a capture of a drop-in `ibv_srq_pingpong`, whose 16 QPs owed re-ACKs of duplicates
        // when destroyed, held one RoCE frame more than the two sides' counters).
        counters.sent_pkts += qp.owed_frames();
        record(std::process::id(), qp.state(), counters, cc)
    }

    /// Folds the last counters of destroyed QP `qpn` (`last`, from [`Publisher::last_record`])
    /// into the interface's retired record (QPN 0, PID 0) and removes its own record, so that
    /// what it did still counts in the interface's totals while the map holds records of live
    /// QPs only. Kept until the process retired instead, a server that takes one connection
    /// after another (`rping -s -P`) filled the map's [`roce_common::maps::MAX_STAT_QPS`]
    /// records after 4,096 connections, and from then on no process on the interface could
    /// publish its counters. Call it with [`Publisher::hold`] and the QPN lock held.
    ///
    /// # Errors
    /// The stats map cannot be written.
    pub(crate) fn retire_qp(
        &self,
        qpn: transport::Qpn,
        last: &QpStatsRecord,
    ) -> Result<(), LoadError> {
        let mut m = self.pins.qp_stats()?;
        let mut retired = m.get(&0, 0).unwrap_or_default();
        fold_retired(&mut retired, last);
        m.insert(0, retired, 0).map_err(LoadError::from)?;
        match m.remove(&qpn.value()) {
            // A QP destroyed before its first publication has no record: aya reports the
            // kernel's ENOENT for a delete as a syscall error, not as `KeyNotFound`.
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
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
                    fold_retired(&mut retired, r);
                    let _ = m.remove(k);
                }
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

/// Adds the counters of `r` (a QP that is gone) to `retired`, the interface's cumulative
/// record (QPN 0), which belongs to no process, has no state and no rate.
fn fold_retired(retired: &mut QpStatsRecord, r: &QpStatsRecord) {
    retired.counters.add(&r.counters);
    retired.cc.add(&r.cc);
    retired.owner = 0;
    retired.state = 0;
    retired.rate_bps = 0;
    retired.target_bps = 0;
    retired.alpha_1024 = 0;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A destroyed QP's counters land in the interface's retired record, which stays
    /// nobody's: no owner, state or rate of the QP leaks into it, and folding adds up.
    #[test]
    fn a_destroyed_qps_counters_fold_into_the_retired_record() {
        let counters = transport::QpCounters {
            sent_pkts: 5,
            rcvd_pkts: 7,
            ..Default::default()
        };
        let qp = QpStatsRecord {
            owner: 4242,
            state: transport::QpState::Rts.code(),
            counters,
            rate_bps: 1_000,
            target_bps: 2_000,
            alpha_1024: 3,
            cc: roce_common::counters::CcStats::default(),
        };
        let mut retired = QpStatsRecord::default();
        fold_retired(&mut retired, &qp);
        fold_retired(&mut retired, &qp);
        assert_eq!(
            (
                retired.owner,
                retired.state,
                retired.rate_bps,
                retired.target_bps
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(retired.alpha_1024, 0);
        assert_eq!(
            (retired.counters.sent_pkts, retired.counters.rcvd_pkts),
            (10, 14)
        );
    }
}
