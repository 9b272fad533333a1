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
use roce_common::{
    counters::{CcStats, DeviceCounters, QpCounters, XdpStats, XskStats},
    maps::{BIND_ZEROCOPY, QpStatsRecord, XskQueueRecord},
};
use serde_json::json;

use super::Output;

pub(crate) fn load(out: Output, iface: &str, opts: LoadOptions) -> anyhow::Result<()> {
    let r = loader::load(iface, &opts)?;
    let text = format!(
        "roce_xdp attached to {} ({} mode, prog id {}, link id {}), RoCE port {}{}{}\npinned in {}\n",
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
        match r.arrival_stamp {
            loader::StampMode::Metadata => "",
            loader::StampMode::InPlace => {
                ", arrival stamps over each frame's destination address (the kernel refuses \
                 bpf_xdp_adjust_meta)"
            }
            loader::StampMode::None => ", no arrival stamps",
        },
        r.pin_dir
    );
    out.emit(&serde_json::to_value(&r)?, &text);
    if opts.log_level != roce_common::log::LogLevel::Off && !out.json {
        eprintln!(
            "roce: roce_xdp logs at {}; read the records with `roce log -i {iface}`",
            opts.log_level.as_str()
        );
    }
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

/// `roce unload --stale`: removes the pins nothing holds, one line per interface.
pub(crate) fn unload_stale(out: Output) -> anyhow::Result<()> {
    let all = loader::unload_stale()?;
    let mut text = String::new();
    if all.is_empty() {
        text.push_str("no stale roce_xdp pins\n");
    }
    for r in &all {
        let _ = writeln!(
            text,
            "{}: removed stale pins: {}",
            r.ifname,
            r.removed.join(" ")
        );
    }
    out.emit(&serde_json::to_value(&all)?, &text);
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
            "{:<16} {:<16} {:<7} {:<7} {:>8} {:>8} {:>6} {:>5}  PINS",
            "INTERFACE", "NETNS", "MODE", "HELD_BY", "PROG_ID", "LINK_ID", "PORT", "QPS"
        );
        for s in &all {
            let opt = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let _ = writeln!(
                text,
                "{:<16} {:<16} {:<7} {:<7} {:>8} {:>8} {:>6} {:>5}  {}",
                s.ifname,
                s.netns.as_deref().unwrap_or("-"),
                s.mode.map_or("?", AttachMode::as_str),
                s.held.as_str(),
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

/// The DCQCN state of a QP (`QpStatsRecord`'s gauges), in the order `snapshot` reads them.
const QP_GAUGES: [(&str, &str); 3] = [
    (
        "rate_bps",
        "DCQCN current rate of the QP, bits/s (the line rate while not limited; 0 without congestion control).",
    ),
    ("target_bps", "DCQCN target rate of the QP, bits/s."),
    (
        "alpha_1024",
        "DCQCN alpha of the QP, in 1024ths (mlx5 fixed point).",
    ),
];

/// Help of `roce_qp_info`, whose labels are what may change while a QP's counters go on.
const QP_INFO_HELP: &str =
    "A QP's state (RESET..ERR) and the PID of the process that owns it, as labels; always 1.";

/// The counters of one interface: XDP (summed over CPUs), transport (summed over QPs), device
/// (summed over endpoint processes), AF_XDP per queue, and with `per_qp` each QP.
pub(crate) fn snapshot(
    pins: &Pins,
    iface: &str,
    per_cpu: bool,
    per_qp: bool,
) -> anyhow::Result<Snapshot> {
    let cpus = pins.xdp_stats_per_cpu()?;
    let total = loader::sum_per_cpu(&cpus);
    let mut sections =
        vec![Section::new("xdp").with("xdp", &XdpStats::NAMES, &XdpStats::HELP, &total.values())];
    if per_cpu {
        for (i, c) in cpus.iter().enumerate() {
            sections.push(
                Section::new(&format!("xdp_cpu{i}"))
                    .with("xdp_cpu", &XdpStats::NAMES, &XdpStats::HELP, &c.values())
                    .label("cpu", &i.to_string()),
            );
        }
    }
    let mut qps: Vec<(u32, QpStatsRecord)> =
        pins.qp_stats()?.iter().filter_map(Result::ok).collect();
    qps.sort_by_key(|(q, _)| *q);
    let mut transport = QpCounters::default();
    for (_, r) in &qps {
        transport.add(&r.counters);
    }
    sections.push(Section::new("transport").with(
        "transport",
        &QpCounters::NAMES,
        &QpCounters::HELP,
        &transport.values(),
    ));
    let mut cc = CcStats::default();
    for (_, r) in &qps {
        cc.add(&r.cc);
    }
    sections.push(Section::new("cc").with("cc", &CcStats::NAMES, &CcStats::HELP, &cc.values()));
    let mut device = DeviceCounters::default();
    for (_, d) in pins.dev_stats()?.iter().filter_map(Result::ok) {
        device.add(&d);
    }
    sections.push(Section::new("device").with(
        "device",
        &DeviceCounters::NAMES,
        &DeviceCounters::HELP,
        &device.values(),
    ));
    let mut queues: Vec<(u32, XskQueueRecord)> =
        pins.xsk_stats()?.iter().filter_map(Result::ok).collect();
    queues.sort_by_key(|(q, _)| *q);
    for (q, r) in &queues {
        let mode = if r.bind_mode == BIND_ZEROCOPY {
            "zerocopy"
        } else {
            "copy"
        };
        sections.push(
            Section::new(&format!("xsk_q{q}"))
                .with("xsk", &XskStats::NAMES, &XskStats::HELP, &r.stats.values())
                .label("queue", &q.to_string())
                .label("mode", mode),
        );
    }
    if per_qp {
        for (q, r) in qps.iter().filter(|(q, _)| *q != 0) {
            let state = roce::transport::QpState::from_code(r.state)
                .map_or_else(|| "?".to_owned(), |s| s.to_string());
            // DCQCN state (rate and target in bits/s, α in 1024ths as mlx5 keeps it), then
            // the congestion counters, then the transport counters. In Prometheus the state is
            // made of gauges, and the congestion counters are a family of their own
            // (`roce_qp_cc_*`): np_ecn_marked_roce_packets is in both structs.
            sections.push(
                Section::new(&format!("qp_0x{q:06x}"))
                    .with_gauges(
                        "qp",
                        &QP_GAUGES.map(|(n, _)| n),
                        &QP_GAUGES.map(|(_, h)| h),
                        &[r.rate_bps, r.target_bps, r.alpha_1024],
                    )
                    .with("qp_cc", &CcStats::NAMES, &CcStats::HELP, &r.cc.values())
                    .with(
                        "qp",
                        &QpCounters::NAMES,
                        &QpCounters::HELP,
                        &r.counters.values(),
                    )
                    .label("qpn", &q.to_string())
                    .info("qp", QP_INFO_HELP, "state", &state)
                    .info("qp", QP_INFO_HELP, "owner", &r.owner.to_string()),
            );
        }
    }
    Ok(Snapshot {
        ifname: iface.to_owned(),
        sections,
    })
}

/// The interfaces roce_xdp is attached to (by its pinned link or a live process) whose
/// interface exists in this network namespace with the index recorded at load time; with
/// `only`, that one alone. The pins are in the host's bpffs, shared by every namespace; the
/// index check keeps the exporter and `roce top` to their own namespace.
pub(crate) fn attached_here(only: Option<&str>) -> anyhow::Result<Vec<String>> {
    Ok(loader::attached()?
        .into_iter()
        .filter(|s| s.held != loader::Holder::Stale)
        .filter(|s| only.is_none_or(|o| o == s.ifname))
        .filter(|s| nix::net::if_::if_nametoindex(s.ifname.as_str()).is_ok_and(|i| i == s.ifindex))
        .map(|s| s.ifname)
        .collect())
}

/// Flags of `roce stats`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  roce stats -i eth0              every counter once\n  \
roce stats -i eth0 -z -w 1 -c 5  what changed, every second, five times\n  \
roce stats -i eth0 --prometheus  one Prometheus exposition page on stdout\n  \
roce stats --listen 127.0.0.1:9435\n                                  serve /metrics over HTTP\n\n\
--listen turns `roce stats` into a Prometheus exporter: it serves GET /metrics, built at each scrape \
from the pinned maps of every interface roce_xdp is attached to in this network namespace (as \
`roce status` lists them, and only those whose interface is here; with -i only that one; run it \
under `ip netns exec NAME` or with --netns NAME for another namespace), per AF_XDP queue and per \
QP, with the names, HELP texts and TYPEs of --prometheus: counters are roce_<family>_<name>_total, \
labelled ifname, queue, qpn. `/` answers a pointer to /metrics, any other path 404. It prints the \
address it listens on (port 0 picks a free one) and runs until SIGINT or SIGTERM. Scrape config: \
`static_configs: [{targets: ['HOST:9435']}]`."
)]
pub struct StatsArgs {
    /// Interface (with --listen: serve only this one).
    #[arg(short, long, required_unless_present = "listen")]
    pub iface: Option<String>,
    /// Repeat every SECS seconds, printing the change and the rate since the last report.
    #[arg(short, long, value_name = "SECS")]
    pub watch: Option<f64>,
    /// With --watch, stop after COUNT reports (default: until interrupted).
    #[arg(short, long, requires = "watch")]
    pub count: Option<u64>,
    /// Show only counters that are not zero.
    #[arg(short = 'z', long)]
    pub nonzero: bool,
    /// Print Prometheus exposition text.
    #[arg(long, conflicts_with_all = ["json", "pretty"])]
    pub prometheus: bool,
    /// Serve the Prometheus exposition over HTTP at http://ADDR:PORT/metrics until interrupted,
    /// for every interface with roce_xdp in this namespace (or -i IFACE), per queue and per QP.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with_all = ["watch", "nonzero", "prometheus"])]
    pub listen: Option<std::net::SocketAddr>,
    /// Also show per-CPU XDP counters.
    #[arg(short = 'e', long)]
    pub per_cpu: bool,
    /// Also show each QP's counters and state.
    #[arg(short = 's', long = "qps")]
    pub per_qp: bool,
}

pub(crate) fn stats(out: Output, a: &StatsArgs) -> anyhow::Result<()> {
    if let Some(addr) = a.listen {
        return super::exporter::run(out, addr, a.iface.as_deref(), a.per_cpu);
    }
    let StatsArgs {
        iface,
        watch,
        count,
        nonzero,
        prometheus,
        listen: _,
        per_cpu,
        per_qp,
    } = a;
    let Some(iface) = iface.as_deref() else {
        bail!("roce stats needs -i IFACE (or --listen ADDR:PORT)");
    };
    let (watch, count, nonzero, prometheus, per_cpu, per_qp) =
        (*watch, *count, *nonzero, *prometheus, *per_cpu, *per_qp);
    loader::require_root()?;
    loader::check_ifname(iface)?;
    let pins = Pins::new(iface);
    let first = snapshot(&pins, iface, per_cpu, per_qp)?;
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
        let now = snapshot(&pins, iface, per_cpu, per_qp).context("reading counters")?;
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
