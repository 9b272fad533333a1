//! `roce load`, `roce unload`, `roce status` and `roce stats`.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use roce::{
    loader::{self, AttachMode, LoadOptions, Pins},
    stats::{Section, Snapshot},
};
use roce_common::counters::XdpStats;
use serde_json::json;

use super::Output;

pub(crate) fn load(
    out: Output,
    iface: &str,
    mode: AttachMode,
    port: u16,
    drop_foreign: bool,
    netns: Option<String>,
) -> anyhow::Result<()> {
    let opts = LoadOptions {
        mode,
        port,
        drop_foreign,
        netns,
    };
    let r = loader::load(iface, &opts)?;
    let text = format!(
        "roce_xdp attached to {} ({} mode, prog id {}, link id {}), RoCE port {}{}\npinned in {}\n",
        r.ifname,
        r.mode.as_str(),
        r.prog_id,
        r.link_id,
        r.port,
        if r.drop_foreign {
            ", dropping foreign QPs"
        } else {
            ""
        },
        r.pin_dir
    );
    out.emit(&serde_json::to_value(&r)?, &text);
    Ok(())
}

pub(crate) fn unload(out: Output, iface: &str) -> anyhow::Result<()> {
    let r = loader::unload(iface)?;
    let text = format!(
        "roce_xdp {} {}; removed pins: {}\n",
        if r.detached {
            "detached from"
        } else {
            "was not attached to"
        },
        r.ifname,
        r.removed.join(" ")
    );
    out.emit(&serde_json::to_value(&r)?, &text);
    Ok(())
}

pub(crate) fn status(out: Output) -> anyhow::Result<()> {
    let all = loader::status()?;
    let mut text = String::new();
    if all.is_empty() {
        text.push_str("roce_xdp is not attached anywhere\n");
    } else {
        let _ = writeln!(
            text,
            "{:<16} {:<16} {:<7} {:>8} {:>8} {:>6} {:>5}  PINS",
            "INTERFACE", "NETNS", "MODE", "PROG_ID", "LINK_ID", "PORT", "QPS"
        );
        for s in &all {
            let opt = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let _ = writeln!(
                text,
                "{:<16} {:<16} {:<7} {:>8} {:>8} {:>6} {:>5}  {}",
                s.ifname,
                s.netns.as_deref().unwrap_or("-"),
                s.mode.map_or("?", AttachMode::as_str),
                opt(s.prog_id),
                opt(s.link_id),
                s.port,
                s.qps,
                s.pin_dir
            );
        }
    }
    out.emit(&serde_json::to_value(&all)?, &text);
    Ok(())
}

fn snapshot(pins: &Pins, iface: &str, per_cpu: bool) -> anyhow::Result<Snapshot> {
    let cpus = pins.xdp_stats_per_cpu()?;
    let total = loader::sum_per_cpu(&cpus);
    let mut sections = vec![Section::from_names(
        "xdp",
        &XdpStats::NAMES,
        &total.values(),
    )];
    if per_cpu {
        for (i, c) in cpus.iter().enumerate() {
            sections.push(
                Section::from_names(&format!("xdp_cpu{i}"), &XdpStats::NAMES, &c.values())
                    .label("cpu", &i.to_string()),
            );
        }
    }
    Ok(Snapshot {
        ifname: iface.to_owned(),
        sections,
    })
}

pub(crate) fn stats(
    out: Output,
    iface: &str,
    watch: Option<f64>,
    count: Option<u64>,
    nonzero: bool,
    prometheus: bool,
    per_cpu: bool,
) -> anyhow::Result<()> {
    loader::require_root()?;
    loader::check_ifname(iface)?;
    let pins = Pins::new(iface);
    let first = snapshot(&pins, iface, per_cpu)?;
    let Some(secs) = watch else {
        if prometheus {
            print!("{}", first.to_prometheus());
        } else {
            out.emit(&first.to_json(), &first.to_text(nonzero));
        }
        return Ok(());
    };
    if !(secs.is_finite() && secs > 0.0) {
        bail!("--watch takes a positive number of seconds, not {secs}");
    }
    let mut prev = first;
    let mut prev_t = Instant::now();
    let mut n = 0u64;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(Duration::from_secs_f64(secs));
        let now = snapshot(&pins, iface, per_cpu).context("reading counters")?;
        let dt = prev_t.elapsed().as_secs_f64();
        if prometheus {
            print!("{}", now.to_prometheus());
        } else {
            let v = json!({ "interval_s": dt, "total": now.to_json(), "delta": now.delta(&prev).to_json() });
            out.emit(&v, &now.to_rate_text(&prev, dt));
        }
        prev = now;
        prev_t = Instant::now();
        n += 1;
    }
    Ok(())
}
