//! The `roce` command line, following ip, bpftool, xdp-loader and ethtool conventions:
//! `-j/--json` and `-p/--pretty` for scripts, ethtool -S style text for people, errors as
//! `{"error": "..."}` in JSON mode, and exit codes scripts can trust (0 success, 1 failure,
//! 2 usage error).

mod demo;
mod impair;
mod plot;
mod xdp;

use clap::{Parser, Subcommand};

use roce::loader::AttachMode;

/// roce-xdp: a RoCE v2 endpoint on XDP and AF_XDP, with counters anyone can read.
#[derive(Debug, Parser)]
#[command(
    name = "roce",
    version,
    about,
    long_about = "roce-xdp turns a Linux interface into a RoCE v2 device: the roce_xdp XDP program \
parses UDP 4791 at the driver hook, counts it, and steers the RoCE packets of our queue pairs into \
AF_XDP sockets; everything else goes on to the kernel untouched.\n\n\
Maps and the XDP link are pinned under /sys/fs/bpf/roce/<ifname>/, so `bpftool map dump pinned \
/sys/fs/bpf/roce/<ifname>/ROCE_XDP_STATS` shows the same counters as `roce stats`.",
    after_help = "Examples:\n  roce load -i eth0              attach roce_xdp in native mode\n  \
roce load -i veth0 -m skb      attach in generic (skb) mode\n  roce stats -i eth0 -w 1        \
counters and rates every second\n  roce -j status                 what is attached where, as JSON\n  \
roce unload -i eth0            detach and remove the pins\n  roce demo                      \
two namespaces, a veth pair, traffic, counters"
)]
pub struct Cli {
    /// Print JSON (errors too, as {"error": "..."}).
    #[arg(short, long, global = true)]
    pub json: bool,
    /// Print pretty JSON (implies --json).
    #[arg(short, long, global = true)]
    pub pretty: bool,
    /// Run in the network namespace NAME (from `ip netns add`) without leaving the mount
    /// namespace, so pins stay under the host's /sys/fs/bpf. Use this instead of `ip netns exec`.
    #[arg(long, global = true, value_name = "NAME")]
    pub netns: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach roce_xdp to an interface; it stays attached after this command exits.
    Load {
        /// Interface.
        #[arg(short, long)]
        iface: String,
        /// XDP attach mode: native (driver) or skb (generic).
        #[arg(short, long, value_enum, default_value_t = AttachMode::Native)]
        mode: AttachMode,
        /// UDP destination port taken to be RoCE v2.
        #[arg(long, default_value_t = roce_common::ROCE_V2_UDP_PORT,
              value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Drop RoCE packets for QPs that are not ours instead of passing them to the kernel.
        #[arg(long)]
        drop_foreign: bool,
    },
    /// Detach roce_xdp from an interface and remove its pins.
    Unload {
        /// Interface.
        #[arg(short, long)]
        iface: String,
    },
    /// Show where roce_xdp is attached: mode, program and link ids, port, QPs, pins.
    Status,
    /// Show counters, summed over all possible CPUs (ethtool -S style, or JSON).
    Stats {
        /// Interface.
        #[arg(short, long)]
        iface: String,
        /// Repeat every SECS seconds, printing the change and the rate since the last report.
        #[arg(short, long, value_name = "SECS")]
        watch: Option<f64>,
        /// With --watch, stop after COUNT reports (default: until interrupted).
        #[arg(short, long, requires = "watch")]
        count: Option<u64>,
        /// Show only counters that are not zero.
        #[arg(short = 'z', long)]
        nonzero: bool,
        /// Print Prometheus exposition text.
        #[arg(long, conflicts_with_all = ["json", "pretty"])]
        prometheus: bool,
        /// Also show per-CPU XDP counters.
        #[arg(short = 'e', long)]
        per_cpu: bool,
    },
    /// Run the demo: two namespaces joined by a veth pair, roce_xdp on one end, RoCE and other
    /// traffic from the other, counters printed, everything cleaned up.
    Demo {
        /// Packets of each kind to send.
        #[arg(short = 'n', long, default_value_t = 100)]
        count: u32,
        /// XDP attach mode for the demo.
        #[arg(short, long, value_enum, default_value_t = AttachMode::Native)]
        mode: AttachMode,
    },
    /// Inject faults and congestion into RoCE traffic leaving an interface (tc egress):
    /// drop, duplicate, reorder, corrupt, CE-mark, or a RED-marking bottleneck.
    Impair(impair::ImpairArgs),
    /// Draw a congestion-control trace (CSV) as an SVG: rate, target, CNPs and alpha over time.
    Plot(plot::PlotArgs),
}

/// How results are printed.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// JSON instead of text.
    pub json: bool,
    /// Pretty JSON.
    pub pretty: bool,
}

impl Output {
    /// Prints `value` as JSON, or `text` when not in JSON mode.
    pub fn emit(self, value: &serde_json::Value, text: &str) {
        if self.json {
            println!("{}", self.render(value));
        } else {
            print!("{text}");
        }
    }

    /// Renders `value` as compact or pretty JSON.
    #[must_use]
    pub fn render(self, value: &serde_json::Value) -> String {
        if self.pretty {
            serde_json::to_string_pretty(value).unwrap_or_default()
        } else {
            value.to_string()
        }
    }
}

/// Runs a parsed command line.
///
/// # Errors
/// Whatever the command failed with; main prints it and exits 1.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output {
        json: cli.json || cli.pretty,
        pretty: cli.pretty,
    };
    if let Some(ns) = &cli.netns {
        roce::netns::enter(ns)?;
    }
    match cli.command {
        Command::Load {
            iface,
            mode,
            port,
            drop_foreign,
        } => xdp::load(out, &iface, mode, port, drop_foreign, cli.netns),
        Command::Unload { iface } => xdp::unload(out, &iface),
        Command::Status => xdp::status(out),
        Command::Stats {
            iface,
            watch,
            count,
            nonzero,
            prometheus,
            per_cpu,
        } => xdp::stats(out, &iface, watch, count, nonzero, prometheus, per_cpu),
        Command::Demo { count, mode } => demo::run(out, count, mode),
        Command::Impair(args) => impair::run(out, &args),
        Command::Plot(args) => plot::run(out, &args),
    }
}
