//! `roce gen`: send RoCE-shaped UDP 4791 frames on the AF_XDP TX path, at a set rate or flat out.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use anyhow::{Context as _, bail};
use roce::engine::{GenConfig, Rate};
use roce::xsk::{XskConfig, XskStats};
use serde_json::json;

use super::Output;

/// Arguments of `roce gen`.
#[derive(Debug, clap::Args)]
pub struct GenArgs {
    /// Interface to send on.
    #[arg(short, long)]
    pub iface: String,
    /// Destination MAC address (aa:bb:cc:dd:ee:ff).
    #[arg(long, value_parser = parse_mac)]
    pub dst_mac: [u8; 6],
    /// Source MAC address (default: the interface's).
    #[arg(long, value_parser = parse_mac)]
    pub src_mac: Option<[u8; 6]>,
    /// Source IPv4 address.
    #[arg(long)]
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    #[arg(long)]
    pub dst_ip: Ipv4Addr,
    /// Frame size in bytes without FCS (at least 58; the payload is a multiple of 4).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(58..=4000))]
    pub size: u16,
    /// Packets per second, over all queues.
    #[arg(
        long,
        conflicts_with = "flat_out",
        required_unless_present = "flat_out"
    )]
    pub rate: Option<u64>,
    /// Send as fast as the TX ring takes frames.
    #[arg(long)]
    pub flat_out: bool,
    /// Stop after this many frames.
    #[arg(short = 'n', long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(short, long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Destination QP number in the BTH.
    #[arg(long, default_value_t = roce_common::maps::FIRST_QPN)]
    pub qpn: u32,
    /// First UDP source port; flow i uses port + i.
    #[arg(long, default_value_t = 0xc000)]
    pub src_port: u16,
    /// Number of flows (UDP source ports).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub flows: u16,
    /// TX queues to send from (comma separated), one AF_XDP socket and thread each.
    #[arg(short, long, value_delimiter = ',', default_value = "0")]
    pub queues: Vec<u32>,
    /// UMEM frame size.
    #[arg(long, default_value_t = 4096)]
    pub frame_size: u32,
    /// Do not compute the ICRC (leaves it zero; faster, but receivers drop the frames).
    #[arg(long)]
    pub no_icrc: bool,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?}: bad byte {p:?}"))?;
    }
    Ok(mac)
}

/// The MAC address of `iface` in the current network namespace, from `ip -j link show`.
fn iface_mac(iface: &str) -> anyhow::Result<[u8; 6]> {
    let out = roce::netns::run("ip", &["-j", "link", "show", "dev", iface])?;
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing `ip -j link show`")?;
    let s = v[0]["address"]
        .as_str()
        .with_context(|| format!("{iface} has no MAC address"))?;
    parse_mac(s).map_err(anyhow::Error::msg)
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub(crate) fn run(out: Output, a: &GenArgs) -> anyhow::Result<()> {
    if a.frame_size != 2048 && a.frame_size != 4096 {
        bail!("--frame-size must be 2048 or 4096");
    }
    if usize::from(a.size) > a.frame_size as usize {
        bail!(
            "--size {} does not fit a {}-byte frame",
            a.size,
            a.frame_size
        );
    }
    let duration = match a.duration {
        Some(d) if !(d > 0.0 && d.is_finite()) => bail!("--duration must be positive"),
        Some(d) => Some(Duration::from_secs_f64(d)),
        None => None,
    };
    let src_mac = match a.src_mac {
        Some(m) => m,
        None => iface_mac(&a.iface)?,
    };
    let cfg = GenConfig {
        ifname: a.iface.clone(),
        queues: a.queues.clone(),
        src_mac,
        dst_mac: a.dst_mac,
        src_ip: a.src_ip,
        dst_ip: a.dst_ip,
        src_port: a.src_port,
        flows: a.flows,
        dst_port: roce_common::ROCE_V2_UDP_PORT,
        dest_qp: a.qpn,
        size: usize::from(a.size),
        rate: a.rate.map_or(Rate::FlatOut, Rate::Pps),
        count: a.count,
        duration,
        icrc: !a.no_icrc,
    };
    let xcfg = XskConfig {
        frame_size: a.frame_size,
        ..XskConfig::default()
    };
    let r = roce::engine::run_gen(&cfg, &xcfg, &Arc::new(AtomicBool::new(false)))
        .with_context(|| format!("generating on {}", a.iface))?;

    let secs = r.elapsed.as_secs_f64();
    let pps = r.pps();
    let mbps = pps * r.frame_len as f64 * 8.0 / 1e6;
    let mut text = format!(
        "sent {} frames of {} bytes to {} ({}) in {secs:.3} s: {pps:.0} pps, {mbps:.1} Mbit/s\n",
        r.completed,
        r.frame_len,
        cfg.dst_ip,
        fmt_mac(&cfg.dst_mac),
    );
    let mut queues = Vec::new();
    for pq in &r.per_queue {
        let (q, s) = (pq.queue, &pq.stats);
        let _ = writeln!(text, "queue {q} ({} mode):", pq.mode);
        for (name, v) in XskStats::NAMES.iter().zip(s.values()) {
            if v != 0 {
                let _ = writeln!(text, "     {name}: {v}");
            }
        }
        let counters: serde_json::Map<String, serde_json::Value> = XskStats::NAMES
            .iter()
            .zip(s.values())
            .map(|(n, v)| ((*n).to_owned(), json!(v)))
            .collect();
        queues.push(json!({ "queue": q, "mode": pq.mode.as_str(), "counters": counters }));
    }
    let value = json!({
        "ifname": cfg.ifname,
        "sent": r.sent,
        "completed": r.completed,
        "frame_len": r.frame_len,
        "elapsed_s": secs,
        "pps": pps,
        "mbps": mbps,
        "queues": queues,
    });
    out.emit(&value, &text);
    Ok(())
}
