//! The pinned maps as `bpftool` dumps them: the independent reading the counter tests compare
//! `roce stats` and the Prometheus exporter with.

use std::process::Command;

use roce::loader::pin_dir;
use roce_common::counters::QpCounters;
use serde_json::Value;

/// `bpftool -j map dump pinned /sys/fs/bpf/roce/IFNAME/MAP`.
///
/// # Panics
/// When bpftool fails or prints something that is not JSON.
#[must_use]
pub fn dump(ifname: &str, map: &str) -> Value {
    let o = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(pin_dir(ifname).join(map))
        .output()
        .expect("bpftool");
    assert!(
        o.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("bpftool's JSON")
}

/// XDP counter `name` summed over every CPU, from a dump of `ROCE_XDP_STATS`.
///
/// # Panics
/// When the dump lacks the counter.
#[must_use]
pub fn xdp_total(xdp_stats: &Value, name: &str) -> u64 {
    xdp_stats[0]["formatted"]["values"]
        .as_array()
        .expect("per-CPU values")
        .iter()
        .map(|c| c["value"][name].as_u64().expect("an XDP counter"))
        .sum()
}

/// The transport counters summed over every QP (and the cumulative record of ended
/// processes), from a dump of `ROCE_QP_STATS`: what `roce stats` shows as `transport`.
///
/// # Panics
/// When an entry lacks a counter.
#[must_use]
pub fn qp_totals(qp_stats: &Value) -> QpCounters {
    let mut s = QpCounters::default();
    for e in qp_stats.as_array().expect("QP entries") {
        for name in QpCounters::NAMES {
            *s.get_mut(name).expect("a QP counter") += e["formatted"]["value"]["counters"][name]
                .as_u64()
                .unwrap_or_else(|| panic!("bpftool lacks {name}: {e}"));
        }
    }
    s
}
