//! `roce engine -i IFACE`: one process that owns an interface's RoCE device and serves it to
//! any number of programs over a Unix socket (docs/multiprocess.md, step 1).

use std::time::Duration;

use anyhow::Context as _;
use roce::{
    api::{
        Device, DeviceOptions,
        remote::{self, EngineClient, server},
    },
    loader::AttachMode,
};

use super::Output;

/// Why `-R` is refused with `--engine`, in `roce perf` and `roce pingpong`.
pub(crate) const NO_CM_THROUGH_ENGINE: &str = "-R runs RDMA CM on this process's device; with \
--engine the device is the engine's, and -R does not reach the engine's CM yet (programs on \
the drop-in librdmacm do: roce exec --engine shared -- rping ...)";

/// With `--engine`, refuses the options of `own` that are set (`(set, name)`): they set up a
/// device of this process, and the engine's device takes none of them from a program. Call it
/// before connecting, so that a run never silently ignores an option.
///
/// # Errors
/// One of them is set; the message names them all.
pub(crate) fn refuse_own_device_options(own: &[(bool, &str)]) -> anyhow::Result<()> {
    let set: Vec<&str> = own.iter().filter(|(s, _)| *s).map(|(_, n)| *n).collect();
    if !set.is_empty() {
        anyhow::bail!(
            "{} set(s) up a device of this process; with --engine the device is the engine's",
            set.join(", ")
        );
    }
    Ok(())
}

/// The device of the engine of `dev`, for a tool's `--engine`.
///
/// # Errors
/// No engine serves `dev` in this namespace (the message says how to start one), or it
/// refused this program (not root, or it serves as many as its `--max-clients`).
pub(crate) fn connect_device(dev: &str) -> anyhow::Result<remote::EngineDevice> {
    remote::EngineDevice::connect(dev).map_err(|e| {
        let hint = if matches!(e, remote::RemoteError::Io { .. }) {
            format!(" (start it with `roce engine -i {dev}`)")
        } else {
            String::new()
        };
        anyhow::Error::new(e).context(format!("reaching the engine of {dev}{hint}"))
    })
}

/// The long help of `roce engine`.
pub const LONG_ABOUT: &str = "Own an interface's RoCE device in this process and serve it to \
other programs, so that several RDMA programs share one interface (an AF_XDP socket serves one \
process per queue, and the engine is that process).\n\n\
The engine opens IFACE as `roce perf` does (it loads roce_xdp unless it is already attached) \
and listens on /run/roce/<netns>/<IFACE>.sock, where <netns> is the name `ip netns add` gave the \
namespace, or net-<inode> for an unnamed one. The socket is 0600 and every peer's credentials \
are checked (SO_PEERCRED): only root's processes are served; others get EACCES. Each program's \
PDs, MRs, CQs and QPs are its own (a handle of another program is EINVAL) and are destroyed when its \
connection closes, however the program ended. The engine exits --linger seconds after its last \
client left (or after it started, if none came), and unloads roce_xdp if it loaded it.\n\n\
Step 1 of docs/multiprocess.md: PD, MR, CQ and RC QP verbs, SEND/WRITE/READ posts and polls \
work through the engine (roce::api::remote::EngineClient; roce-user/examples/engine_peer.rs), \
which reaches a program's registered memory through its /proc/PID/mem; posts and polls \
still cross the socket. `roce perf --engine` and `roce pingpong --engine` run on it, and the \
drop-in libibverbs uses it when it runs (`roce exec --engine shared`).";

/// Examples of `roce engine`.
pub const EXAMPLES: &str = "Examples:\n  \
roce engine -i eth0                 serve eth0 until 5 s after the last program left\n  \
roce engine -i veth0 -m skb --linger 60\n  \
roce engine -i eth0 --max-clients 64 at most 64 programs at once\n  \
roce engine -i eth0 --status        is an engine serving eth0? how many programs, QPs";

/// Arguments of `roce engine`.
#[derive(Debug, clap::Args)]
pub struct EngineArgs {
    /// Interface to serve.
    #[arg(short, long)]
    iface: String,
    /// XDP attach mode, if the engine loads roce_xdp itself.
    #[arg(short, long, value_enum, default_value_t = AttachMode::Native)]
    mode: AttachMode,
    /// Seconds to wait for a program after the last one left before exiting.
    #[arg(long, default_value_t = 5.0, value_parser = parse_linger)]
    linger: f64,
    /// The most programs served at once; one more is refused (EAGAIN: "Resource temporarily
    /// unavailable") until one leaves. Each program has a thread of the engine; a program's
    /// doorbell connection (the drop-in library's events) does not count, and one admitted
    /// at the limit always gets its doorbell. The default, 1024, is far more programs than
    /// share an interface and far below the system's thread limits: only root connects, so
    /// the bound stops a runaway script, not an attacker.
    #[arg(long, default_value_t = server::DEFAULT_MAX_CLIENTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_clients: u32,
    /// Do not serve: ask the engine of IFACE how many programs and QPs it has, and its pid.
    #[arg(long)]
    status: bool,
    /// Answer every AckReq with an ACK of its own, as rxe does, instead of one cumulative ACK
    /// for the requests of a QP that arrive together (every program's QPs).
    #[arg(long)]
    no_ack_coalescing: bool,
    /// Receive moderation in microseconds, as `roce perf --rx-usecs` (like `ethtool -C IFACE
    /// rx-usecs N`): a frame that wakes an idle engine thread waits this long for the ones
    /// that follow. 0 (the default): every frame at once.
    #[arg(long, value_name = "USECS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    rx_usecs: u32,
}

fn parse_linger(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=86_400.0).contains(&v) {
        Ok(v)
    } else {
        Err("between 0 and 86400 seconds".into())
    }
}

/// Runs `roce engine`.
///
/// # Errors
/// No such interface, not root, another engine serves it, or the device cannot be opened.
pub fn run(out: Output, args: &EngineArgs, netns: Option<String>) -> anyhow::Result<()> {
    let path = remote::socket_path(&args.iface).context("naming the engine socket")?;
    if args.status {
        let mut c = EngineClient::connect_at(&path)?;
        let st = c.status()?;
        out.emit(
            &serde_json::json!({
                "iface": args.iface, "socket": path, "pid": c.engine_pid(),
                "clients": st.clients, "qps": st.qps, "pds": st.pds, "cqs": st.cqs,
                "mrs": st.mrs,
            }),
            &format!(
                "engine of {} (pid {}) at {}: {} client(s) including this one, {} QP(s), \
                 {} PD(s), {} CQ(s), {} MR(s)\n",
                args.iface,
                c.engine_pid(),
                path.display(),
                st.clients,
                st.qps,
                st.pds,
                st.cqs,
                st.mrs
            ),
        );
        return Ok(());
    }
    let listener = server::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let mut opts = DeviceOptions {
        mode: args.mode,
        netns,
        ..DeviceOptions::default()
    };
    // The engine serves whatever its programs ask for, up to rxe's limit of READ/atomic
    // responder resources per QP (128, what `roce perf` asks by default); a resource is held
    // only while a READ or atomic is being answered.
    opts.transport.max_qp_rd_atom = 128;
    opts.transport.coalesce_acks = !args.no_ack_coalescing;
    opts.engine.rx_usecs = std::time::Duration::from_micros(u64::from(args.rx_usecs));
    let dev = match Device::open(&args.iface, &opts) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(e).with_context(|| format!("opening {}", args.iface));
        }
    };
    if !out.json {
        eprintln!(
            "roce engine: serving {} at {} (pid {})",
            args.iface,
            path.display(),
            std::process::id()
        );
    }
    let opts = server::ServeOptions {
        linger: Duration::from_secs_f64(args.linger),
        max_clients: args.max_clients,
        ..server::ServeOptions::default()
    };
    let report = server::serve(dev, listener, &path, &opts, &super::interrupted)?;
    out.emit(
        &serde_json::json!({
            "iface": args.iface, "connections": report.connections, "refused": report.refused,
            "full": report.full,
        }),
        &format!(
            "roce engine: {} stopped after {} connection(s), {} refused (not root), {} refused \
             (--max-clients reached)\n",
            args.iface, report.connections, report.refused, report.full
        ),
    );
    Ok(())
}
