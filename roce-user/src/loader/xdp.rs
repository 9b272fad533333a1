//! Loads `roce_xdp` onto an interface, pins its maps and link under `/sys/fs/bpf/roce/<ifname>/`,
//! finds them again, and takes them away.
//!
//! The program stays attached after `roce load` exits because its XDP link is pinned
//! (`.../link`); `roce unload` unpins the link (which detaches the program) and removes the
//! map pins. Everything else (stats, the engine, the QP and XSK maps) works from the pins.
//!
//! This is an I/O edge: it talks to the kernel through aya and nix.

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use aya::{
    EbpfLoader,
    maps::{Array, MapData, PerCpuArray, XskMap},
    programs::{Xdp, XdpMode, links::FdLink},
};
use roce_common::{
    ROCE_V2_UDP_PORT,
    counters::XdpStats,
    log::{LogLevel, MAP_LOG_LEVEL},
    maps::{
        FLAG_DROP_FOREIGN, FLAG_NO_STAMP, FLAG_PROCESS_HELD, FLAG_STAMP_IN_PLACE, GLOBAL_FLAGS,
        GLOBAL_UDP_PORT, LoadInfo, MAP_DEV_STATS, MAP_INFO, MAP_QP_STATS, MAP_QPS, MAP_XDP_STATS,
        MAP_XSK_STATS, MAP_XSKS, MODE_NATIVE, MODE_SKB, PROG_ROCE_XDP, PROG_XDP_META_PROBE,
        QpEntry, QpStatsRecord, XskQueueRecord,
    },
};

use super::{
    EBPF_OBJECT, XDP_PASS_OBJECT,
    pins::{self, PIN_LINK, io_err, is_bpffs},
};

/// Where all roce-xdp pins live.
pub const PIN_ROOT: &str = "/sys/fs/bpf/roce";

/// Where roce_xdp's pins are seen from this process: [`PIN_ROOT`], reached through another
/// mount namespace under `ip netns exec` ([`pins::bpffs`]).
#[must_use]
pub fn pin_root() -> PathBuf {
    pins::reachable(PIN_ROOT)
}
/// How to attach the XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Driver (native) XDP: runs in the driver's receive path.
    #[default]
    Native,
    /// Generic XDP: runs after the kernel has built an skb; works on every interface.
    Skb,
}

impl AttachMode {
    const fn xdp_mode(self) -> XdpMode {
        match self {
            Self::Native => XdpMode::Driver,
            Self::Skb => XdpMode::Skb,
        }
    }

    const fn code(self) -> u32 {
        match self {
            Self::Native => MODE_NATIVE,
            Self::Skb => MODE_SKB,
        }
    }

    /// The mode recorded under `code` in [`LoadInfo::mode`].
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            MODE_NATIVE => Some(Self::Native),
            MODE_SKB => Some(Self::Skb),
            _ => None,
        }
    }

    /// The name used on the command line and in JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Skb => "skb",
        }
    }
}

/// Options of [`load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Attach mode.
    pub mode: AttachMode,
    /// UDP destination port taken to be RoCE v2.
    pub port: u16,
    /// Drop RoCE packets for QPs that are not ours instead of passing them to the kernel.
    pub drop_foreign: bool,
    /// Name of the network namespace the caller entered, recorded for `roce status`.
    pub netns: Option<String>,
    /// Which log records the program writes from the start (`roce log` reads them).
    pub log_level: LogLevel,
}

/// The XDP link of a roce_xdp that a process loaded for itself ([`load_held`]): the program
/// stays attached while this lives, and the kernel detaches it when it is dropped or the
/// process ends, however it ends.
#[derive(Debug)]
pub struct HeldLink(#[allow(dead_code)] FdLink);

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            mode: AttachMode::Native,
            port: ROCE_V2_UDP_PORT,
            drop_foreign: false,
            netns: None,
            log_level: LogLevel::Off,
        }
    }
}

/// Why loading, unloading or reading the program failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Loading BPF programs needs CAP_BPF and CAP_NET_ADMIN.
    #[error("must be run as root (loading XDP programs needs CAP_BPF and CAP_NET_ADMIN)")]
    NotRoot,
    /// The interface does not exist in this network namespace.
    #[error("no such interface: {0} (is it in another network namespace? see --netns)")]
    NoSuchInterface(String),
    /// The interface name cannot be an interface name.
    #[error("invalid interface name {0:?} (1 to 15 characters, no '/' or whitespace)")]
    BadInterfaceName(String),
    /// roce_xdp is already loaded on the interface.
    #[error(
        "roce_xdp is already loaded on {ifname} (pins in {dir}); run `roce unload -i {ifname}` first"
    )]
    AlreadyLoaded {
        /// Interface.
        ifname: String,
        /// Pin directory.
        dir: String,
    },
    /// roce_xdp is not loaded on the interface.
    #[error("roce_xdp is not loaded on {0} (no pins in {PIN_ROOT}/{0})")]
    NotLoaded(String),
    /// The binary was built without the eBPF object.
    #[error(
        "this roce binary was built with AYA_BUILD_SKIP=1 and holds no eBPF object; rebuild it \
         without AYA_BUILD_SKIP (after `cargo xtask setup`)"
    )]
    StubObject,
    /// The driver refused native XDP.
    #[error("native XDP refused on {ifname}: {source}; try `-m skb` (generic XDP)")]
    NativeRefused {
        /// Interface.
        ifname: String,
        /// The kernel's answer.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Attaching failed for another reason.
    #[error("failed to attach roce_xdp to {ifname} in {mode} mode: {source}")]
    Attach {
        /// Interface.
        ifname: String,
        /// Mode tried.
        mode: &'static str,
        /// The kernel's answer.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The kernel attached without a BPF link, which cannot be pinned.
    #[error(
        "the kernel attached roce_xdp to {0} without a BPF link (kernel older than 5.9?), which cannot be pinned"
    )]
    NoLink(String),
    /// bpffs is not mounted where the pins go.
    #[error(
        "no BPF filesystem at /sys/fs/bpf, here or in the mount namespace of a parent process \
         (mount one on the host with `mount -t bpf bpf /sys/fs/bpf`)"
    )]
    NoBpfFs,
    /// The eBPF object could not be loaded (verifier, maps, BTF).
    #[error("failed to load the eBPF object: {0}")]
    Ebpf(#[from] aya::EbpfError),
    /// A program operation failed.
    #[error("program operation failed: {0}")]
    Program(#[from] aya::programs::ProgramError),
    /// A map operation failed.
    #[error("map operation failed: {0}")]
    Map(#[from] aya::maps::MapError),
    /// Pinning failed.
    #[error("failed to pin: {0}")]
    Pin(#[from] aya::pin::PinError),
    /// A pinned link could not be opened.
    #[error("failed to open the pinned link: {0}")]
    Link(#[from] aya::programs::links::LinkError),
    /// A file system operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// On which path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A required map or program is missing from the object.
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
}

/// The pin directory of an interface: `/sys/fs/bpf/roce/<ifname>`, below [`pin_root`].
#[must_use]
pub fn pin_dir(ifname: &str) -> PathBuf {
    pin_root().join(ifname)
}

/// Checks that `name` can be an interface name (and a safe path component).
///
/// # Errors
/// [`LoadError::BadInterfaceName`] otherwise.
pub fn check_ifname(name: &str) -> Result<(), LoadError> {
    let ok = !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b.is_ascii_whitespace() || b == 0);
    if ok {
        Ok(())
    } else {
        Err(LoadError::BadInterfaceName(name.to_owned()))
    }
}

/// Fails with [`LoadError::NotRoot`] unless the effective user is root.
///
/// # Errors
/// [`LoadError::NotRoot`].
pub fn require_root() -> Result<(), LoadError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(LoadError::NotRoot)
    }
}

/// The interface index of `ifname` in the current network namespace.
///
/// # Errors
/// [`LoadError::NoSuchInterface`].
pub fn ifindex(ifname: &str) -> Result<u32, LoadError> {
    check_ifname(ifname)?;
    nix::net::if_::if_nametoindex(ifname).map_err(|_| LoadError::NoSuchInterface(ifname.to_owned()))
}

/// Makes sure a BPF filesystem is reachable ([`pins::bpffs`]): the host's, directly or through
/// another mount namespace under `ip netns exec`. Mounts one at /sys/fs/bpf only in the initial
/// mount namespace (as systemd does at boot); in a private one a bpffs mounted there would
/// vanish with the process, and its pins with it.
pub(crate) fn ensure_bpffs() -> Result<(), LoadError> {
    if pins::bpffs().is_some() {
        return Ok(());
    }
    let same_mnt_ns =
        fs::read_link("/proc/self/ns/mnt").ok() == fs::read_link("/proc/1/ns/mnt").ok();
    if !same_mnt_ns || !Path::new("/sys/fs/bpf").is_dir() {
        return Err(LoadError::NoBpfFs);
    }
    nix::mount::mount(
        Some("bpf"),
        "/sys/fs/bpf",
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .map_err(|e| LoadError::Io {
        what: "mount bpffs at",
        path: "/sys/fs/bpf".into(),
        source: e.into(),
    })?;
    if is_bpffs("/sys/fs/bpf") {
        Ok(())
    } else {
        Err(LoadError::NoBpfFs)
    }
}

fn name_bytes<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = s.len().min(N - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Reads a NUL-padded name back from a [`LoadInfo`] field.
#[must_use]
pub fn name_from_bytes(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// What [`load`] did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadReport {
    /// Interface.
    pub ifname: String,
    /// Interface index.
    pub ifindex: u32,
    /// Mode attached in.
    pub mode: AttachMode,
    /// Kernel program id.
    pub prog_id: u32,
    /// Kernel link id.
    pub link_id: u32,
    /// UDP port.
    pub port: u16,
    /// Whether foreign QPs are dropped.
    pub drop_foreign: bool,
    /// Where redirected frames carry their arrival time ([`stamp_mode`]).
    pub arrival_stamp: StampMode,
    /// Pin directory.
    pub pin_dir: String,
}

/// Loads and attaches `roce_xdp` to `ifname` in the current network namespace, and pins its
/// maps and link under [`pin_dir`]. Call once per interface; the program stays attached until
/// [`unload`]. On any failure nothing is left behind.
///
/// # Errors
/// Not root, no such interface, already loaded, native mode refused, verifier or pin failures.
pub fn load(ifname: &str, opts: &LoadOptions) -> Result<LoadReport, LoadError> {
    load_with(ifname, opts, false).map(|(report, _)| report)
}

/// As [`load`], for a process that uses the interface itself: the maps are pinned (so `roce
/// stats` and bpftool see the counters) but the link is not, and the returned [`HeldLink`]
/// keeps the program attached. When the process ends without unloading, even on SIGKILL, the
/// kernel detaches the program, and the next load clears the pins left behind.
///
/// # Errors
/// As [`load`].
pub fn load_held(ifname: &str, opts: &LoadOptions) -> Result<(LoadReport, HeldLink), LoadError> {
    let (report, link) = load_with(ifname, opts, true)?;
    let link = link.ok_or_else(|| LoadError::NoLink(ifname.to_owned()))?;
    Ok((report, HeldLink(link)))
}

fn load_with(
    ifname: &str,
    opts: &LoadOptions,
    held: bool,
) -> Result<(LoadReport, Option<FdLink>), LoadError> {
    require_root()?;
    let ifindex = ifindex(ifname)?;
    if EBPF_OBJECT.is_empty() {
        return Err(LoadError::StubObject);
    }
    ensure_bpffs()?;
    let dir = pin_dir(ifname);
    if Pins::new(ifname).is_attached() {
        return Err(LoadError::AlreadyLoaded {
            ifname: ifname.to_owned(),
            dir: dir.display().to_string(),
        });
    }
    pins::populate_fresh(&dir, &pin_root(), |dir| {
        load_into(ifname, ifindex, opts, dir, held)
    })
}

/// Where `roce_xdp` puts the arrival stamp of a frame it redirects, as the kernel allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StampMode {
    /// In XDP metadata in front of the frame (`bpf_xdp_adjust_meta`): the default.
    Metadata,
    /// Over the frame's Ethernet destination address, which the socket puts back
    /// ([`FLAG_STAMP_IN_PLACE`]): where the kernel refuses the metadata helper.
    InPlace,
    /// None ([`FLAG_NO_STAMP`]): a program loaded without stamps (the loader does not do
    /// this; `cargo xtask bench xdp` does, to measure what the stamp costs).
    None,
}

impl StampMode {
    /// The mode of a program loaded with `flags` (from [`LoadInfo::flags`]).
    #[must_use]
    pub const fn of_flags(flags: u32) -> Self {
        if flags & FLAG_NO_STAMP != 0 {
            Self::None
        } else if flags & FLAG_STAMP_IN_PLACE != 0 {
            Self::InPlace
        } else {
            Self::Metadata
        }
    }

    /// The `GLOBAL_FLAGS` bit that makes `roce_xdp` stamp this way (none for the default,
    /// metadata); [`Self::of_flags`] reads it back.
    #[must_use]
    pub const fn flag(self) -> u32 {
        match self {
            Self::Metadata => 0,
            Self::InPlace => FLAG_STAMP_IN_PLACE,
            Self::None => FLAG_NO_STAMP,
        }
    }
}

/// Where this kernel lets `roce_xdp` stamp each redirected frame with its arrival time. Asked
/// once per process by loading (never attaching) the probe `xdp_meta_probe` of the object
/// `xdp-pass` (`bpf_xdp_adjust_meta`): allowed, in metadata; refused (a hardened 6.18 build:
/// "program of this type cannot use helper bpf_xdp_adjust_meta#54"), over the destination
/// address ([`StampMode::InPlace`], which needs no helper). Any other failure of the probe (not
/// root, no BPF) counts as allowed and leaves the real load to report it.
pub fn stamp_mode() -> StampMode {
    static MODE: std::sync::OnceLock<StampMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        if probe_refused(PROG_XDP_META_PROBE, "bpf_xdp_adjust_meta") {
            log::info!(
                "this kernel refuses XDP programs bpf_xdp_adjust_meta: roce_xdp writes each \
                 frame's arrival stamp over its destination address instead, and the socket \
                 puts the interface's address back"
            );
            StampMode::InPlace
        } else {
            StampMode::Metadata
        }
    })
}

/// Whether loading `prog` of the object `xdp-pass` fails in the verifier for naming `helper`.
fn probe_refused(prog: &str, helper: &str) -> bool {
    let Ok(mut ebpf) = EbpfLoader::new().load(XDP_PASS_OBJECT) else {
        return false;
    };
    let Some(p) = ebpf.program_mut(prog) else {
        return false;
    };
    let Ok(p): Result<&mut Xdp, _> = p.try_into() else {
        return false;
    };
    matches!(p.load(), Err(aya::programs::ProgramError::LoadError { verifier_log, .. })
        if verifier_log.to_string().contains(helper))
}

/// The `FLAG_*` bits `roce_xdp` is loaded with: [`FLAG_DROP_FOREIGN`] as asked, and the
/// stamp's carrier as [`stamp_mode`] finds it. Also for tests and benches that load the
/// object themselves.
#[must_use]
pub fn xdp_flags(drop_foreign: bool) -> u32 {
    let mut flags = 0;
    if drop_foreign {
        flags |= FLAG_DROP_FOREIGN;
    }
    flags | stamp_mode().flag()
}

fn load_into(
    ifname: &str,
    ifindex: u32,
    opts: &LoadOptions,
    dir: &Path,
    held: bool,
) -> Result<(LoadReport, Option<FdLink>), LoadError> {
    let port = u32::from(opts.port);
    let flags = xdp_flags(opts.drop_foreign);
    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_UDP_PORT, &port, true)
        .override_global(GLOBAL_FLAGS, &flags, true)
        .load(EBPF_OBJECT)?;

    for name in [
        MAP_XDP_STATS,
        MAP_XSKS,
        MAP_QPS,
        MAP_INFO,
        MAP_QP_STATS,
        MAP_DEV_STATS,
        MAP_XSK_STATS,
        MAP_LOG_LEVEL,
    ] {
        let map = ebpf.map(name).ok_or(LoadError::Missing(name))?;
        map.pin(dir.join(name))?;
    }
    if opts.log_level != LogLevel::Off {
        let map = ebpf
            .map_mut(MAP_LOG_LEVEL)
            .ok_or(LoadError::Missing(MAP_LOG_LEVEL))?;
        let mut level: Array<_, u32> = Array::try_from(map)?;
        level.set(0, opts.log_level.code(), 0)?;
    }
    {
        let map = ebpf.map_mut(MAP_INFO).ok_or(LoadError::Missing(MAP_INFO))?;
        let mut info: Array<_, LoadInfo> = Array::try_from(map)?;
        let loaded_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        info.set(
            0,
            LoadInfo {
                ifindex,
                mode: opts.mode.code(),
                port,
                flags: if held {
                    flags | FLAG_PROCESS_HELD
                } else {
                    flags
                },
                loader_pid: std::process::id(),
                reserved: 0,
                loaded_at,
                ifname: name_bytes(ifname),
                netns: name_bytes(opts.netns.as_deref().unwrap_or("")),
            },
            0,
        )?;
    }

    let prog: &mut Xdp = ebpf
        .program_mut(PROG_ROCE_XDP)
        .ok_or(LoadError::Missing("roce_xdp program"))?
        .try_into()?;
    prog.load()?;
    let prog_id = prog.info()?.id();
    let link_id = prog
        .attach_to_if_index(ifindex, opts.mode.xdp_mode())
        .map_err(|source| {
            if opts.mode == AttachMode::Native {
                LoadError::NativeRefused {
                    ifname: ifname.to_owned(),
                    source,
                }
            } else {
                LoadError::Attach {
                    ifname: ifname.to_owned(),
                    mode: opts.mode.as_str(),
                    source,
                }
            }
        })?;
    let link = prog.take_link(link_id)?;
    let fd_link: FdLink = link
        .try_into()
        .map_err(|_| LoadError::NoLink(ifname.to_owned()))?;
    let (kernel_link_id, held_link) = if held {
        (fd_link.info()?.id(), Some(fd_link))
    } else {
        (pins::pin_link(fd_link, dir)?, None)
    };
    let report = LoadReport {
        ifname: ifname.to_owned(),
        ifindex,
        mode: opts.mode,
        prog_id,
        link_id: kernel_link_id,
        port: opts.port,
        drop_foreign: opts.drop_foreign,
        arrival_stamp: StampMode::of_flags(flags),
        pin_dir: dir.display().to_string(),
    };
    Ok((report, held_link))
}

/// What [`unload`] did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UnloadReport {
    /// Interface.
    pub ifname: String,
    /// Whether an attached link was found and detached.
    pub detached: bool,
    /// Pins removed.
    pub removed: Vec<String>,
}

/// Detaches `roce_xdp` from `ifname` and removes its pins. Works from the pins alone, so it also
/// recovers an interface whose loader was killed.
///
/// # Errors
/// Not root, not loaded, or a pin that cannot be removed.
pub fn unload(ifname: &str) -> Result<UnloadReport, LoadError> {
    require_root()?;
    check_ifname(ifname)?;
    let dir = pin_dir(ifname);
    if !dir.is_dir() {
        return Err(LoadError::NotLoaded(ifname.to_owned()));
    }
    let pins::Detached { detached, removed } = pins::detach(&dir, &pin_root())?;
    Ok(UnloadReport {
        ifname: ifname.to_owned(),
        detached,
        removed,
    })
}

/// Removes the pins of every interface whose roce_xdp nothing holds any more ([`Holder::Stale`]:
/// its loading process ended without unloading, or its interface was deleted under a pinned
/// link), as `roce unload --stale` does. A directory whose load is still under way (no link
/// pin yet, its loader alive) or whose load record cannot be read is left alone. Returns what
/// was removed, one report per interface.
///
/// # Errors
/// Not root, or a pin that cannot be read or removed.
pub fn unload_stale() -> Result<Vec<UnloadReport>, LoadError> {
    let mut out = Vec::new();
    for (ifname, dir) in pin_dirs()? {
        let Ok(info) = Pins::new(&ifname).load_info() else {
            continue;
        };
        let loading = !dir.join(PIN_LINK).exists() && process_alive(info.loader_pid);
        if loading || holder(&dir, &info) != Holder::Stale {
            continue;
        }
        let pins::Detached { detached, removed } = pins::detach(&dir, &pin_root())?;
        out.push(UnloadReport {
            ifname,
            detached,
            removed,
        });
    }
    Ok(out)
}

/// One interface with roce_xdp pins, as `roce status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Status {
    /// Interface.
    pub ifname: String,
    /// Interface index (in its network namespace).
    pub ifindex: u32,
    /// Network namespace given at load time, if any.
    pub netns: Option<String>,
    /// Attach mode.
    pub mode: Option<AttachMode>,
    /// Kernel program id, if the link is alive.
    pub prog_id: Option<u32>,
    /// Kernel link id, if the link is alive.
    pub link_id: Option<u32>,
    /// UDP port.
    pub port: u32,
    /// Whether foreign QPs are dropped.
    pub drop_foreign: bool,
    /// Where redirected frames carry their arrival time.
    pub arrival_stamp: StampMode,
    /// PID of the loader.
    pub loader_pid: u32,
    /// How the program stays attached.
    pub held: Holder,
    /// Load time, Unix seconds.
    pub loaded_at: u64,
    /// Number of QPs registered in the QP map.
    pub qps: usize,
    /// Pin directory.
    pub pin_dir: String,
    /// Pins present.
    pub pins: Vec<String>,
}

/// What keeps roce_xdp attached to an interface, as `roce status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Holder {
    /// The pinned link (`roce load`): attached until `roce unload`.
    Pin,
    /// The process that loaded it for itself ([`load_held`]), which is alive.
    Process,
    /// Nothing: the process that held it ended without unloading, or the interface of a pinned
    /// link is gone, so the kernel detached the program; these pins wait for the next load of
    /// that interface, or `roce unload --stale`, to clear them.
    Stale,
}

impl Holder {
    /// The word `roce status` prints.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pin => "pin",
            Self::Process => "process",
            Self::Stale => "stale",
        }
    }
}

/// Whether process `pid` is alive (a claim or a load it made still stands).
#[must_use]
pub fn process_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// An interface with roce_xdp pins, as [`attached`] lists it: what the exporter and `roce top`
/// need to pick the interfaces of their namespace, without [`status`]'s count of QPs (a walk
/// over the whole QP array, seconds on a debug build).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// Interface name (the pin directory's).
    pub ifname: String,
    /// Interface index recorded at load time.
    pub ifindex: u32,
    /// What keeps the program attached.
    pub held: Holder,
}

/// What keeps the roce_xdp of the pin directory `dir`, whose load record is `info`, attached.
fn holder(dir: &Path, info: &LoadInfo) -> Holder {
    if dir.join(PIN_LINK).exists() {
        // A pinned link outlives its interface, attached to nothing.
        if pins::link_ifindex(dir) == Some(0) {
            Holder::Stale
        } else {
            Holder::Pin
        }
    } else if info.flags & FLAG_PROCESS_HELD != 0 && process_alive(info.loader_pid) {
        Holder::Process
    } else {
        Holder::Stale
    }
}

/// The pin directories under the pin root, sorted by interface name.
fn pin_dirs() -> Result<Vec<(String, PathBuf)>, LoadError> {
    require_root()?;
    let root = pin_root();
    let root = root.as_path();
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err("read", root))? {
        let entry = entry.map_err(io_err("read", root))?;
        let dir = entry.path();
        if dir.is_dir() {
            out.push((entry.file_name().to_string_lossy().into_owned(), dir));
        }
    }
    out.sort();
    Ok(out)
}

/// Lists every interface with roce_xdp pins, cheaply: name, index and holder only (see
/// [`status`] for everything). Call it to find the interfaces to read counters from.
///
/// # Errors
/// Not root, or an unreadable pin root.
pub fn attached() -> Result<Vec<Attached>, LoadError> {
    Ok(pin_dirs()?
        .into_iter()
        .map(|(ifname, dir)| {
            let info = Pins::new(&ifname).load_info().unwrap_or_default();
            Attached {
                held: holder(&dir, &info),
                ifindex: info.ifindex,
                ifname,
            }
        })
        .collect())
}

/// Lists every interface with roce_xdp pins.
///
/// # Errors
/// Not root, or unreadable pins.
pub fn status() -> Result<Vec<Status>, LoadError> {
    let mut out = Vec::new();
    for (ifname, dir) in pin_dirs()? {
        let mut pins: Vec<String> = match fs::read_dir(&dir) {
            Ok(d) => d
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect(),
            // Unloaded since the root was listed (another program's exit, a parallel test).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read", &dir)(e)),
        };
        pins.sort();
        let info = Pins::new(&ifname).load_info().unwrap_or_default();
        let (prog_id, link_id) = pins::link_ids(&dir);
        let qps = Pins::new(&ifname).our_qps().map_or(0, |q| q.len());
        let netns = name_from_bytes(&info.netns);
        out.push(Status {
            ifname,
            ifindex: info.ifindex,
            netns: (!netns.is_empty()).then_some(netns),
            mode: AttachMode::from_code(info.mode),
            prog_id,
            link_id,
            port: info.port,
            drop_foreign: info.flags & FLAG_DROP_FOREIGN != 0,
            arrival_stamp: StampMode::of_flags(info.flags),
            loader_pid: info.loader_pid,
            held: holder(&dir, &info),
            loaded_at: info.loaded_at,
            qps,
            pin_dir: dir.display().to_string(),
            pins,
        });
    }
    Ok(out)
}

/// Access to the pinned maps of one interface.
#[derive(Clone, Debug)]
pub struct Pins {
    dir: PathBuf,
    ifname: String,
}

impl Pins {
    /// The pins of `ifname` (nothing is opened yet).
    #[must_use]
    pub fn new(ifname: &str) -> Self {
        Self {
            dir: pin_dir(ifname),
            ifname: ifname.to_owned(),
        }
    }

    fn open(&self, name: &str) -> Result<MapData, LoadError> {
        let path = self.dir.join(name);
        if !path.exists() {
            return Err(LoadError::NotLoaded(self.ifname.clone()));
        }
        Ok(MapData::from_pin(&path)?)
    }

    /// The load record.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be read.
    pub fn load_info(&self) -> Result<LoadInfo, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_INFO)?)?;
        let arr: Array<MapData, LoadInfo> = Array::try_from(map)?;
        Ok(arr.get(&0, 0)?)
    }

    /// Whether roce_xdp is attached through these pins: by its pinned link (`roce load`), or
    /// held by a live process that loaded it for itself ([`load_held`]). Pins without either
    /// are what a killed process leaves; the next load clears them.
    #[must_use]
    pub fn is_attached(&self) -> bool {
        self.dir.join(PIN_LINK).exists()
            || self
                .load_info()
                .is_ok_and(|i| i.flags & FLAG_PROCESS_HELD != 0 && process_alive(i.loader_pid))
    }

    /// The XDP counters summed over all possible CPUs.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be read.
    pub fn xdp_stats(&self) -> Result<XdpStats, LoadError> {
        Ok(sum_per_cpu(&self.xdp_stats_per_cpu()?))
    }

    /// The XDP counters of each possible CPU.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be read.
    pub fn xdp_stats_per_cpu(&self) -> Result<Vec<XdpStats>, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_XDP_STATS)?)?;
        let arr: PerCpuArray<MapData, XdpStats> = PerCpuArray::try_from(map)?;
        Ok(arr.get(&0, 0)?.iter().copied().collect())
    }

    /// The QP map: which destination QPNs are ours (`owner != 0`), indexed by QPN.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be opened.
    pub fn qps(&self) -> Result<Array<MapData, QpEntry>, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_QPS)?)?;
        Ok(Array::try_from(map)?)
    }

    /// Marks `qpn` as ours, owned by process `owner` (a PID, not 0).
    ///
    /// # Errors
    /// Not loaded, a QPN outside the map, or the map update failed.
    pub fn add_qp(&self, qpn: u32, owner: u32) -> Result<(), LoadError> {
        self.add_qp_flags(qpn, owner, 0)
    }

    /// [`Self::add_qp`] with `flags` (`roce_common::maps::QP_FLAG_*`); call it again to change
    /// them for a QP already marked.
    ///
    /// # Errors
    /// As [`Self::add_qp`].
    pub fn add_qp_flags(&self, qpn: u32, owner: u32, flags: u32) -> Result<(), LoadError> {
        Ok(self.qps()?.set(qpn, QpEntry { owner, flags }, 0)?)
    }

    /// Marks `qpn` as not ours.
    ///
    /// # Errors
    /// Not loaded, a QPN outside the map, or the map update failed.
    pub fn remove_qp(&self, qpn: u32) -> Result<(), LoadError> {
        Ok(self.qps()?.set(qpn, QpEntry::default(), 0)?)
    }

    /// The QPNs marked ours, with their owners.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be read.
    pub fn our_qps(&self) -> Result<Vec<(u32, u32)>, LoadError> {
        let qps = self.qps()?;
        let mut out = Vec::new();
        for (qpn, e) in (0u32..).zip(qps.iter()) {
            let e = e?;
            if e.owner != 0 {
                out.push((qpn, e.owner));
            }
        }
        Ok(out)
    }

    /// The XSK map: which AF_XDP socket serves each RX queue.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be opened.
    pub fn xsks(&self) -> Result<XskMap<MapData>, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_XSKS)?)?;
        Ok(XskMap::try_from(map)?)
    }
}

impl Pins {
    /// Per-QP transport counters written by endpoints.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be opened.
    pub fn qp_stats(&self) -> Result<aya::maps::HashMap<MapData, u32, QpStatsRecord>, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_QP_STATS)?)?;
        Ok(aya::maps::HashMap::try_from(map)?)
    }

    /// Device counters per endpoint process.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be opened.
    pub fn dev_stats(
        &self,
    ) -> Result<aya::maps::HashMap<MapData, u32, roce_common::counters::DeviceCounters>, LoadError>
    {
        let map = aya::maps::Map::from_map_data(self.open(MAP_DEV_STATS)?)?;
        Ok(aya::maps::HashMap::try_from(map)?)
    }

    /// AF_XDP counters and bind mode per RX queue.
    ///
    /// # Errors
    /// Not loaded, or the map cannot be opened.
    pub fn xsk_stats(&self) -> Result<aya::maps::HashMap<MapData, u32, XskQueueRecord>, LoadError> {
        let map = aya::maps::Map::from_map_data(self.open(MAP_XSK_STATS)?)?;
        Ok(aya::maps::HashMap::try_from(map)?)
    }
}

/// Sums per-CPU copies of the XDP counters.
#[must_use]
pub fn sum_per_cpu(per_cpu: &[XdpStats]) -> XdpStats {
    let mut total = XdpStats::default();
    for s in per_cpu {
        total.add(s);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        assert!(check_ifname("veth0").is_ok());
        assert!(check_ifname("a234567890abcde").is_ok());
        for bad in ["", "a234567890abcdef", "..", "a/b", "a b"] {
            assert!(
                matches!(check_ifname(bad), Err(LoadError::BadInterfaceName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn names_round_trip_through_load_info() {
        let b: [u8; 16] = name_bytes("veth0");
        assert_eq!(name_from_bytes(&b), "veth0");
        let long: [u8; 16] = name_bytes("0123456789abcdefXYZ");
        assert_eq!(name_from_bytes(&long), "0123456789abcde");
    }

    #[test]
    fn modes_round_trip() {
        for m in [AttachMode::Native, AttachMode::Skb] {
            assert_eq!(AttachMode::from_code(m.code()), Some(m));
        }
        assert_eq!(AttachMode::from_code(0), None);
    }
}
