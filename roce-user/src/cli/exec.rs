//! `roce exec`: runs an unmodified RDMA program on roce-xdp, through the drop-in
//! `libibverbs.so.1` that `cargo build -p roce-verbs` builds (roce-user/verbs).

use std::{
    ffi::OsString,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use roce::{
    api::env::{
        ACK_COALESCING_ENV, CC_ALGORITHM_ENV, CC_ENV, CC_PROFILE_ENV, DEVICES_ENV, ENGINE_ENV,
        MULTIPATH_ENV,
    },
    cc::CcAlgorithm,
};

/// How the library runs the engine in the program (`ROCE_ENGINE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Engine {
    /// The program's threads drive the transport inside ibv_poll_cq and the posting verbs;
    /// a helper thread turns when none did for 1 ms (best for busy-polling programs).
    Inline,
    /// One engine thread per queue, as `roce perf` runs by default.
    Threads,
    /// Through the interface's `roce engine` process, shared with every other program on
    /// the interface (start it first: `roce engine -i IFACE`); fails if none runs.
    Shared,
}

impl Engine {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Threads => "threads",
            Self::Shared => "shared",
        }
    }
}

/// The folder of its own, next to this binary, where the library is found as
/// `libibverbs.so.1`.
const LIB_SUBDIR: &str = "roce-verbs";

/// Arguments of `roce exec`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "How it works: the program is started with LD_LIBRARY_PATH naming a \
folder that holds roce-xdp's libibverbs.so.1, so it loads that library instead of rdma-core's, \
and ROCE_DEVICES naming the interfaces it shows as RDMA devices (roce_<ifname>). The first verb \
that needs the engine starts it: it attaches roce_xdp unless `roce load` did, binds an AF_XDP \
socket per queue, and runs the transport on the program's own threads inside ibv_poll_cq and \
the posting verbs (ROCE_ENGINE=inline) or on engine threads (threads). Several programs on one \
interface (a server and a client on one host): start `roce engine -i IFACE` first; while it runs, \
every program reaches the interface through it (ROCE_ENGINE unset, or shared to insist). The same \
by hand:\n  LD_LIBRARY_PATH=target/debug/roce-verbs ROCE_DEVICES=eth0 ibv_devinfo\n\n\
Examples:\n  roce exec -d eth0 -- ibv_devices\n  roce exec -d veth1 -- ibv_devinfo -v\n  \
roce --netns ns1 exec -d veth1 -- ibv_devinfo     inside a network namespace\n  \
roce engine -i veth1 & roce exec -d veth1 -- ib_write_bw -d roce_veth1 & \
roce exec -d veth1 -- ib_write_bw -d roce_veth1 127.0.0.1\n  \
ip netns exec ns1 roce exec -d veth1 -- ibv_devices"
)]
pub struct ExecArgs {
    /// Interface to show as an RDMA device (repeat, or separate with commas). Default: every
    /// interface where `roce load` attached roce_xdp.
    #[arg(
        short = 'd',
        long = "device",
        value_name = "IFACE",
        value_delimiter = ','
    )]
    devices: Vec<String>,
    /// The folder holding libibverbs.so.1. Default: `roce-verbs/` next to this binary (made
    /// from the libibverbs.so cargo builds there).
    #[arg(long, value_name = "DIR", env = "ROCE_VERBS_DIR")]
    lib_dir: Option<PathBuf>,
    /// How the engine runs for the program (sets ROCE_ENGINE). Default: through the
    /// interface's `roce engine` if one runs, else inline in the program.
    #[arg(long, value_enum)]
    engine: Option<Engine>,
    /// Congestion control of every QP of the program, as `roce perf --cc` takes it: dcqcn
    /// (the default), swift (delay-based, for peers and paths that mark no ECN) or off (sets
    /// ROCE_CC).
    #[arg(long, value_name = "ALGORITHM",
          value_parser = clap::builder::PossibleValuesParser::new(CcAlgorithm::ALL.map(CcAlgorithm::as_str)))]
    cc: Option<String>,
    /// The DCQCN and Swift defaults that --cc-set changes, as `roce perf --cc-profile` takes them: mlx5
    /// (the default) or software (sets ROCE_CC_PROFILE).
    #[arg(long = "cc-profile", value_name = "PROFILE",
          value_parser = clap::builder::PossibleValuesParser::new(roce::cc::DcqcnConfig::PROFILES))]
    cc_profile: Option<String>,
    /// A congestion-control parameter for every QP of the program, as `roce perf --cc-set`
    /// takes it (repeatable; sets ROCE_CC_SET), e.g. `--cc-set loss_backoff=1`.
    #[arg(long = "cc-set", value_name = "NAME=VALUE")]
    cc_set: Vec<String>,
    /// Every RC QP of the program offers the multipath extension, as `roce perf --multipath`
    /// does (sets ROCE_MULTIPATH=1).
    #[arg(long)]
    multipath: bool,
    /// Answer every AckReq with an ACK of its own, as rxe does, instead of one cumulative ACK
    /// for the requests of a QP that arrive together (sets ROCE_ACK_COALESCING=0). For a
    /// program on its own engine (`--engine inline|threads`); a shared `roce engine` takes
    /// its own `--no-ack-coalescing`.
    #[arg(long)]
    no_ack_coalescing: bool,
    /// The program and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    program: Vec<OsString>,
}

/// The libraries of the folder: the name programs load (a link in the folder) and the file
/// cargo builds next to this binary. The first is the drop-in libibverbs; the others are the
/// stand-ins for rdma-core's vendor libraries that programs such as Debian's perftest link
/// against (roce-user/verbs/mlx5 and roce-user/verbs/efa say why they exist). The drop-in
/// librdmacm is the same file as the drop-in libibverbs (roce-verbs' ffi/rdmacm.rs says why):
/// the loader maps it once for both names.
const LIBS: &[(&str, &str)] = &[
    ("libibverbs.so.1", "libibverbs.so"),
    ("librdmacm.so.1", "libibverbs.so"),
    ("libmlx5.so.1", "libmlx5.so"),
    ("libefa.so.1", "libefa.so"),
];

/// The folder with the library: `dir` if given, else `roce-verbs/` next to the running binary,
/// with a link there to each of [`LIBS`] that cargo built beside the binary, made if needed.
fn lib_dir(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(d) = dir {
        if !d.join("libibverbs.so.1").exists() {
            bail!("{} holds no libibverbs.so.1", d.display());
        }
        return Ok(d.to_owned());
    }
    let exe = std::env::current_exe().context("where this binary is")?;
    let bin_dir = exe.parent().context("the binary's folder")?;
    let sub = bin_dir.join(LIB_SUBDIR);
    let mut missing = Vec::new();
    for &(soname, file) in LIBS {
        let lib = sub.join(soname);
        if lib.exists() {
            continue;
        }
        let built = bin_dir.join(file);
        if !built.exists() {
            missing.push((soname, built));
            continue;
        }
        std::fs::create_dir_all(&sub).with_context(|| format!("create {}", sub.display()))?;
        // Two processes may race here: whoever loses finds the link made.
        if let Err(e) = std::os::unix::fs::symlink(format!("../{file}"), &lib)
            && !lib.exists()
        {
            return Err(e).with_context(|| format!("link {}", lib.display()));
        }
    }
    if let Some((_, built)) = missing.iter().find(|(s, _)| *s == LIBS[0].0) {
        bail!(
            "the drop-in libibverbs is not built: no {} (build it with `cargo build -p roce-verbs \
             -p roce-verbs-mlx5 -p roce-verbs-efa`, or name its folder with --lib-dir)",
            built.display()
        );
    }
    for (soname, built) in &missing {
        eprintln!(
            "roce exec: note: no {} (cargo build -p roce-verbs-mlx5 -p roce-verbs-efa builds the \
             stand-ins): a program that needs {soname}, like perftest, loads rdma-core's, which \
             cannot run on the drop-in libibverbs",
            built.display()
        );
    }
    Ok(sub)
}

/// Replaces this process with the program (same PID, so signals and exit codes are the
/// program's own).
///
/// # Errors
/// An interface that does not exist here, no library, or a program that cannot be started.
pub fn run(args: &ExecArgs) -> anyhow::Result<()> {
    for d in &args.devices {
        if roce::loader::ifindex(d).is_err() {
            bail!(
                "no interface {d:?} in this network namespace (`ip link` lists them; use \
                 `roce --netns NAME exec ...` or `ip netns exec NAME roce exec ...` for another)"
            );
        }
    }
    let dir = lib_dir(args.lib_dir.as_deref())?;
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let (prog, rest) = args.program.split_first().context("no program to run")?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(rest).env("LD_LIBRARY_PATH", path);
    if !args.devices.is_empty() {
        cmd.env(DEVICES_ENV, args.devices.join(","));
    }
    if let Some(e) = args.engine {
        cmd.env(ENGINE_ENV, e.as_str());
    }
    // Checked here, so a typo stops before the program starts rather than at its first verb
    // that needs the engine.
    let algorithm = args
        .cc
        .as_deref()
        .and_then(CcAlgorithm::from_name)
        .unwrap_or_default();
    roce::transport::CcConfig::choose(
        algorithm,
        args.cc_profile.as_deref().unwrap_or("mlx5"),
        args.cc_set.iter().map(String::as_str),
    )
    .context("--cc-set")?;
    if let Some(cc) = &args.cc {
        cmd.env(CC_ALGORITHM_ENV, cc);
    }
    if let Some(p) = &args.cc_profile {
        cmd.env(CC_PROFILE_ENV, p);
    }
    if !args.cc_set.is_empty() {
        cmd.env(CC_ENV, args.cc_set.join(","));
    }
    if args.multipath {
        cmd.env(MULTIPATH_ENV, "1");
    }
    if args.no_ack_coalescing {
        cmd.env(ACK_COALESCING_ENV, "0");
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("cannot run {}", prog.to_string_lossy()))
}
