//! The `roce` command line, following ip, bpftool, xdp-loader and ethtool conventions:
//! `-j/--json` and `-p/--pretty` for scripts, ethtool -S style text for people, errors as
//! `{"error": "..."}` in JSON mode, and exit codes scripts can trust (0 success, 1 failure,
//! 2 usage error).

mod demo;
mod dump;
mod engine;
mod exec;
mod exporter;
mod r#gen;
mod impair;
mod log;
mod perf;
mod pingpong;
mod plot;
mod progress;
mod top;
mod xdp;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use clap::{Parser, Subcommand};

use roce::loader::{AttachMode, LoadOptions};

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
counters and rates every second\n  roce top                       \
live rates per interface and QP\n  roce -j status                 what is attached where, as JSON\n  \
roce log -i eth0               drops and fallbacks of roce_xdp as they happen\n  \
roce unload -i eth0            detach and remove the pins\n  roce demo                      \
two namespaces, a veth pair, traffic, counters"
)]
pub struct Cli {
    /// Print JSON (errors too, as {"error": "..."}).
    #[arg(short, long, global = true)]
    pub json: bool,
    /// Print pretty JSON (implies --json). No short form: `-p` is the port of pingpong and perf,
    /// as in ibv_rc_pingpong and perftest.
    #[arg(long, global = true)]
    pub pretty: bool,
    /// Run in the network namespace NAME (from `ip netns add`), as `ip netns exec NAME roce ...`
    /// does (which also works: pins then go to the host's /sys/fs/bpf through another mount
    /// namespace's view).
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
        /// Start with the program's log records on at this level (read them with `roce log`,
        /// which switches the level itself while it runs).
        #[arg(long, value_enum, default_value_t = log::LoadLevel::Off)]
        log_level: log::LoadLevel,
    },
    /// Stream the log records of the programs attached to an interface (drops with their reason,
    /// QPN, opcode and PSN; redirect fallbacks; roce_impair's actions), as text or JSON lines.
    #[command(long_about = log::LONG_ABOUT, after_help = log::EXAMPLES)]
    Log(log::LogArgs),
    /// Detach roce_xdp from an interface and remove its pins; or, with --stale, remove the pins
    /// that nothing holds any more (`roce status` shows them as `stale`).
    #[command(
        after_help = "Examples:\n  roce unload -i veth0    detach from veth0 and remove its pins\n  \
roce unload --stale     remove the pins of killed programs and deleted interfaces"
    )]
    Unload {
        /// Interface.
        #[arg(
            short,
            long,
            required_unless_present = "stale",
            conflicts_with = "stale"
        )]
        iface: Option<String>,
        /// Remove the pins of every interface whose program is no longer attached: its loading
        /// process ended without unloading, or the interface was deleted under a pinned link.
        #[arg(long)]
        stale: bool,
    },
    /// Show where roce_xdp is attached: mode, program and link ids, port, QPs, pins.
    Status,
    /// Show counters: XDP (summed over all possible CPUs), transport, device and AF_XDP
    /// (ethtool -S style, JSON, or Prometheus).
    Stats(xdp::StatsArgs),
    /// A live view, as top: per interface and per QP the packet rates (and the interface's
    /// byte rates), retransmissions, NAKs, RNR NAKs, CNPs, the DCQCN rate and alpha, and the
    /// XDP drop reasons.
    Top(top::TopArgs),
    /// Send RoCE-shaped UDP 4791 frames on the AF_XDP TX path, at a set rate or flat out.
    Gen(r#gen::GenArgs),
    /// ibv_rc_pingpong's test: SEND/RECV ping-pong over an RC QP (server without a host,
    /// client with one); either side can be the real ibv_rc_pingpong.
    Pingpong(pingpong::PingpongArgs),
    /// Bandwidth of WRITE, READ, SEND or atomics over one or more RC QPs, set up with
    /// perftest's exchange (either side can be ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw).
    Perf(perf::PerfArgs),
    /// List an interface's RoCE v2 GID table (the index is `-g` of pingpong and perf).
    Gids {
        /// Interface.
        #[arg(short, long)]
        iface: String,
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
    /// Run an unmodified RDMA program (ibv_devinfo, ...) on roce-xdp through the drop-in
    /// libibverbs.so.1: `roce exec -d eth0 -- ibv_devinfo`.
    Exec(exec::ExecArgs),
    /// Capture the frames the endpoints on an interface receive, send and loop back, as
    /// pcapng for Wireshark or tshark (tcpdump cannot see them: XDP and AF_XDP skip its taps).
    Dump(dump::DumpArgs),
    /// Serve an interface's RoCE device to several programs at once over a Unix socket:
    /// `roce engine -i eth0` (docs/multiprocess.md).
    #[command(long_about = engine::LONG_ABOUT, after_help = engine::EXAMPLES)]
    Engine(engine::EngineArgs),
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

static INTERRUPTED: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Whether SIGINT or SIGTERM arrived: long-running commands check this, stop, and clean up
/// (flush their QPs, detach what they attached, remove their pins) on the way out.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

type Cleanup = Box<dyn FnOnce() + Send>;
static CLEANUPS: std::sync::Mutex<Vec<Cleanup>> = std::sync::Mutex::new(Vec::new());

/// Registers something to undo if the process must exit on a signal before its own destructors
/// run (the demo's namespaces, say). Undo steps must be idempotent: the normal path runs too.
pub(crate) fn on_signal_exit(f: impl FnOnce() + Send + 'static) {
    CLEANUPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Box::new(f));
}

/// How long a command may take to wind down on its own after SIGINT or SIGTERM.
const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// SIGINT and SIGTERM set the flag that long-running loops check; they stop and clean up on
/// the way out. A command blocked elsewhere (waiting for a peer to connect) is ended after
/// [`SIGNAL_GRACE`] or a second signal: the devices' kernel state and the registered cleanups
/// are undone, and the process exits with 130.
fn install_signal_handling() {
    let flag = Arc::clone(INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false))));
    let Ok(mut signals) = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("roce-signals".into())
        .spawn(move || {
            if signals.forever().next().is_none() {
                return;
            }
            flag.store(true, Ordering::SeqCst);
            let handle = signals.handle();
            let second = std::thread::spawn(move || signals.forever().next().is_some());
            let deadline = std::time::Instant::now() + SIGNAL_GRACE;
            while std::time::Instant::now() < deadline && !second.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            handle.close();
            roce::api::release_all_for_exit();
            let cleanups = std::mem::take(
                &mut *CLEANUPS
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            for c in cleanups.into_iter().rev() {
                c();
            }
            eprintln!("roce: interrupted");
            std::process::exit(130);
        });
}

fn gids(out: Output, iface: &str) -> anyhow::Result<()> {
    let info = roce::netinfo::IfInfo::query(iface)?;
    let mut text = format!("{:<5} {:<40} ADDRESS\n", "INDEX", "GID");
    for (i, g) in info.gids.iter().enumerate() {
        let gid = std::net::Ipv6Addr::from(g.raw);
        text.push_str(&format!("{i:<5} {:<40} {}\n", gid.to_string(), g.ip));
    }
    let v: Vec<_> = info
        .gids
        .iter()
        .enumerate()
        .map(|(i, g)| serde_json::json!({"index": i, "gid": std::net::Ipv6Addr::from(g.raw), "ip": g.ip}))
        .collect();
    out.emit(&serde_json::Value::Array(v), &text);
    Ok(())
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
    // Under `ip netns exec NAME`, record NAME as `--netns NAME` would.
    let netns = cli.netns.clone().or_else(roce::netns::identify);
    install_signal_handling();
    match cli.command {
        Command::Load {
            iface,
            mode,
            port,
            drop_foreign,
            log_level,
        } => xdp::load(
            out,
            &iface,
            LoadOptions {
                mode,
                port,
                drop_foreign,
                netns,
                log_level: log_level.into(),
            },
        ),
        Command::Log(args) => log::run(out, &args),
        Command::Unload { iface, stale } => match iface {
            Some(iface) if !stale => xdp::unload(out, &iface),
            _ => xdp::unload_stale(out),
        },
        Command::Status => xdp::status(out),
        Command::Stats(args) => xdp::stats(out, &args),
        Command::Top(args) => top::run(out, &args),
        Command::Demo { count, mode } => demo::run(out, count, mode),
        Command::Gen(args) => r#gen::run(out, &args),
        Command::Pingpong(args) => pingpong::run(out, &args, netns),
        Command::Perf(args) => perf::run(out, &args, netns),
        Command::Gids { iface } => gids(out, &iface),
        Command::Impair(args) => impair::run(out, &args),
        Command::Plot(args) => plot::run(out, &args),
        Command::Exec(args) => exec::run(&args),
        Command::Dump(args) => dump::run(out, &args),
        Command::Engine(args) => engine::run(out, &args, netns),
    }
}
