//! What a run prints: perftest's table as text, or one JSON object with the counters of every
//! QP (`-j`).

use roce::{api::RdmaDevice, cm::perftest::BwReport};
use roce_common::counters::CmStats;
use serde_json::json;

use super::{Output, PerfArgs, PerfOp, Plan, exchange::Session};

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PerfResult {
    pub(super) msgs: u64,
    pub(super) secs: f64,
    pub(super) mb_per_sec: f64,
    pub(super) mpps: f64,
    /// p50, p99, p99.9, max in µs.
    pub(super) lat: (f64, f64, f64, f64),
    pub(super) verified: bool,
    /// Work requests posted (client), each completed exactly once when the run succeeds.
    pub(super) posted: u64,
    /// Atomics whose returned value was not the one a linearizable counter gives.
    pub(super) atomic_mismatches: u64,
}

impl PerfResult {
    pub(super) fn from_report(r: &BwReport, size: u32) -> Self {
        let msgs = r.iters;
        let secs = if r.bw_avg > 0.0 {
            msgs as f64 * f64::from(size) / (r.bw_avg * 1_048_576.0)
        } else {
            0.0
        };
        Self {
            msgs,
            secs,
            mb_per_sec: r.bw_avg,
            mpps: r.msg_rate_avg,
            lat: (0.0, 0.0, 0.0, 0.0),
            verified: true,
            posted: 0,
            atomic_mismatches: 0,
        }
    }
}

/// This process's peak resident set size in KiB (`VmHWM` of /proc/self/status), for the JSON
/// report: how memory grows with `-q` (UMEM, memory regions and QP state together). Read it
/// before the report is built: the report's per-QP entries (`cc`, several KiB per QP as JSON
/// values) are output, not the QPs' memory, and would otherwise dominate the figure.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Each QP's DCQCN state and counters, and its transport counters, for the JSON report.
fn cc_json<D: RdmaDevice>(dev: &D) -> serde_json::Value {
    let counters: std::collections::HashMap<_, _> = dev.qp_counters().into_iter().collect();
    let qps: Vec<serde_json::Value> = dev
        .cc_snapshots()
        .into_iter()
        .map(|(qpn, s)| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            for (n, x) in roce::cc::CcStats::NAMES.iter().zip(s.stats.values()) {
                v[*n] = json!(x);
            }
            if let Some(c) = counters.get(&qpn) {
                for (n, x) in roce::api::QpCounters::NAMES.iter().zip(c.values()) {
                    v["transport"][*n] = json!(x);
                }
            }
            v["qpn"] = json!(qpn.value());
            v
        })
        .collect();
    json!(qps)
}

/// What a run came to, for [`emit`].
pub(super) struct Outcome {
    /// What this side measured.
    pub(super) result: PerfResult,
    /// The peer's report (the default when none was exchanged).
    pub(super) theirs: BwReport,
    /// Whether the data checked out (this side's check, or the server's after the run).
    pub(super) verified: bool,
}

/// Prints the outcome: the client's (or a SEND or latency run's) own measurement, else the
/// client's report as the server received it. Call once, after the closing exchange.
pub(super) fn emit<D: RdmaDevice>(
    out: Output,
    a: &PerfArgs,
    plan: &Plan,
    dev: &D,
    session: &Session<'_>,
    o: &Outcome,
) {
    let peak_rss = peak_rss_kib();
    let size = plan.size;
    let shown = if plan.client || a.op == PerfOp::Send || a.lat {
        o.result
    } else {
        PerfResult::from_report(&o.theirs, size)
    };
    let text = format!(
        "---------------------------------------------------------------------------------------\n \
         {:<10} {:<16} {:<18} {:<20} {:<14}\n {:<10} {:<16} {:<18.2} {:<20.2} {:<14.6}\n \
         latency usec (per WR, under load): p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}\n \
         data verified: {}\n\
         ---------------------------------------------------------------------------------------\n",
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
        size,
        shown.msgs,
        shown.mb_per_sec,
        shown.mb_per_sec,
        shown.mpps,
        shown.lat.0,
        shown.lat.1,
        shown.lat.2,
        shown.lat.3,
        if a.no_verify {
            "not checked (--no-verify)".to_owned()
        } else {
            o.verified.to_string()
        }
    );
    let v = json!({
        "op": format!("{:?}", a.op).to_lowercase(), "role": if plan.client { "client" } else { "server" },
        "size": size, "qps": a.qps, "mtu": session.mtu.bytes(), "messages": shown.msgs, "bytes": shown.msgs * u64::from(size),
        "seconds": shown.secs, "bw_mb_per_sec": shown.mb_per_sec, "gbit_per_sec": shown.mb_per_sec * 8.0 * 1.048_576 / 1000.0,
        "msg_rate_mpps": shown.mpps, "posted": o.result.posted, "atomic_mismatches": o.result.atomic_mismatches,
        "span": a.span,
        "latency_us": { "p50": shown.lat.0, "p99": shown.lat.1, "p999": shown.lat.2, "max": shown.lat.3 },
        "verified": if a.no_verify { serde_json::Value::Null } else { o.verified.into() },
        "peer_version": session.comm.remote_version, "rdma_cm": a.rdma_cm,
        "rdma_cm_reqs_resent": session.rdma_cm.as_ref().map(|c| c.reqs_resent),
        "rdma_cm_probes": session.probes(),
        "cm": CmStats::NAMES.iter().zip(session.cm.values()).map(|(n, v)| ((*n).to_owned(), v.into())).collect::<serde_json::Map<_, _>>(),
        "cc": cc_json(dev),
        "peak_rss_kib": peak_rss,
    });
    out.emit(&v, &text);
}
