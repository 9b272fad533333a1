//! Loads `roce_impair` at an interface's egress, changes its settings live, reads its counters
//! and takes it away: what `roce impair` does.
//!
//! The program is attached with TCX (kernel >= 6.6), the bpf_link form of a clsact
//! direct-action filter, so the attachment is a link that can be pinned like roce_xdp's: it
//! stays after `roce impair` exits and goes when the pin is removed. Pins live in
//! `/sys/fs/bpf/roce-impair/<ifname>/` (a sibling of roce_xdp's `/sys/fs/bpf/roce/<ifname>/`,
//! not a subdirectory: `roce unload` clears that directory file by file, and `roce status`
//! lists it): `link`, `ROCE_IMPAIR_CONFIG`, `ROCE_IMPAIR_STATS`, `ROCE_IMPAIR_BOTTLENECK`,
//! `ROCE_IMPAIR_HELD`, `ROCE_IMPAIR_LIMIT`, `ROCE_LOG_LEVEL` (its log switch, see `super::log`). `bpftool map dump pinned .../ROCE_IMPAIR_STATS` shows the counters by name.
//!
//! This is an I/O edge: it talks to the kernel through aya.

use std::path::{Path, PathBuf};

use aya::{
    EbpfLoader,
    maps::{Array, MapData, PerCpuArray},
    programs::{SchedClassifier, TcAttachType, links::FdLink},
};
use roce_common::{
    ROCE_V2_UDP_PORT,
    impair::{
        BottleneckState, ImpairConfig, ImpairStats, LimitState, MAP_IMPAIR_BOTTLENECK,
        MAP_IMPAIR_CONFIG, MAP_IMPAIR_HELD, MAP_IMPAIR_LIMIT, MAP_IMPAIR_STATS, PROG_ROCE_IMPAIR,
        prob_from_fixed, prob_to_fixed,
    },
    log::MAP_LOG_LEVEL,
};

use super::{
    IMPAIR_OBJECT, LoadError,
    pins::{self, PIN_LINK},
    xdp as loader,
};

/// Where all roce_impair pins live.
pub const IMPAIR_PIN_ROOT: &str = "/sys/fs/bpf/roce-impair";

/// Where roce_impair's pins are seen from this process ([`pins::reachable`]).
#[must_use]
pub fn pin_root() -> PathBuf {
    pins::reachable(IMPAIR_PIN_ROOT)
}

/// The pin directory of an interface: `/sys/fs/bpf/roce-impair/<ifname>`, below [`pin_root`].
#[must_use]
pub fn pin_dir(ifname: &str) -> PathBuf {
    pin_root().join(ifname)
}

/// Why an impair operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImpairError {
    /// Root, interface, bpffs, object, map or pin trouble, as for roce_xdp.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// roce_impair is not attached to the interface.
    #[error("roce_impair is not attached to {0} (no pins in {IMPAIR_PIN_ROOT}/{0})")]
    NotAttached(String),
    /// A setting out of range.
    #[error("invalid impairment: {0}")]
    Invalid(String),
    /// The kernel has no TCX (it attached through netlink, which cannot be pinned).
    #[error("the kernel attached roce_impair to {0} without a TCX link (kernel older than 6.6?)")]
    NoTcx(String),
}

impl From<aya::maps::MapError> for ImpairError {
    fn from(e: aya::maps::MapError) -> Self {
        Self::Load(e.into())
    }
}
impl From<aya::programs::ProgramError> for ImpairError {
    fn from(e: aya::programs::ProgramError) -> Self {
        Self::Load(e.into())
    }
}
impl From<aya::pin::PinError> for ImpairError {
    fn from(e: aya::pin::PinError) -> Self {
        Self::Load(e.into())
    }
}
impl From<aya::EbpfError> for ImpairError {
    fn from(e: aya::EbpfError) -> Self {
        Self::Load(e.into())
    }
}
impl From<aya::programs::links::LinkError> for ImpairError {
    fn from(e: aya::programs::links::LinkError) -> Self {
        Self::Load(e.into())
    }
}

/// A RED-marking bottleneck (see `roce_common::impair::ImpairConfig`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Bottleneck {
    /// Drain rate, bits/s.
    pub rate_bps: u64,
    /// No marks at or below this backlog, bytes.
    pub kmin_bytes: u64,
    /// Every packet marked above this backlog, bytes.
    pub kmax_bytes: u64,
    /// Marking probability at Kmax.
    pub pmax: f64,
    /// Drop past this backlog, bytes.
    pub max_backlog_bytes: u64,
}

impl Bottleneck {
    /// A bottleneck at `rate_bps` with the DCQCN paper's switch settings (Kmin 10 KB, Kmax
    /// 100 KB, Pmax 1 %; sc20anonymous/DCQCN-validation) and a 1 MB buffer.
    #[must_use]
    pub const fn at(rate_bps: u64) -> Self {
        Self {
            rate_bps,
            kmin_bytes: 10_000,
            kmax_bytes: 100_000,
            pmax: 0.01,
            max_backlog_bytes: 1_000_000,
        }
    }
}

/// What roce_impair does to RoCE packets; probabilities in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ImpairSettings {
    /// UDP destination port taken to be RoCE v2.
    pub port: u16,
    /// Drop probability.
    pub drop: f64,
    /// Duplication probability.
    pub dup: f64,
    /// Reorder (hold until the next packet) probability.
    pub reorder: f64,
    /// Bit-flip probability.
    pub corrupt: f64,
    /// CE-marking probability.
    pub ce: f64,
    /// A bottleneck.
    pub bottleneck: Option<Bottleneck>,
    /// Only CM MADs with this attribute ID are impaired (`roce_common::mad::CmAttr`); `None`:
    /// every RoCE packet.
    pub mad_attr: Option<u16>,
    /// At most this many packets are impaired (then everything passes); 0: no limit. The
    /// count starts again whenever the settings are written.
    pub limit: u64,
}

impl Default for ImpairSettings {
    fn default() -> Self {
        Self {
            port: ROCE_V2_UDP_PORT,
            drop: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            ce: 0.0,
            bottleneck: None,
            mad_attr: None,
            limit: 0,
        }
    }
}

impl ImpairSettings {
    /// Checks ranges and builds the map value.
    ///
    /// # Errors
    /// [`ImpairError::Invalid`] naming the setting.
    pub fn to_config(&self) -> Result<ImpairConfig, ImpairError> {
        let prob = |name: &str, p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(prob_to_fixed(p))
            } else {
                Err(ImpairError::Invalid(format!(
                    "--{name} {p}: a probability is between 0 and 1"
                )))
            }
        };
        if self.port == 0 {
            return Err(ImpairError::Invalid("--port 0".into()));
        }
        if self.mad_attr == Some(0) {
            return Err(ImpairError::Invalid(
                "--mad 0: a CM attribute ID is above 0".into(),
            ));
        }
        let mut c = ImpairConfig {
            port: u32::from(self.port),
            drop: prob("drop", self.drop)?,
            dup: prob("dup", self.dup)?,
            reorder: prob("reorder", self.reorder)?,
            corrupt: prob("corrupt", self.corrupt)?,
            ce: prob("ce", self.ce)?,
            mad_attr: u32::from(self.mad_attr.unwrap_or(0)),
            limit: self.limit,
            ..ImpairConfig::default()
        };
        if let Some(b) = self.bottleneck {
            if b.rate_bps == 0 {
                return Err(ImpairError::Invalid(
                    "--bottleneck 0: a rate above 0".into(),
                ));
            }
            if b.kmin_bytes > b.kmax_bytes {
                return Err(ImpairError::Invalid(format!(
                    "--kmin {} is above --kmax {}",
                    b.kmin_bytes, b.kmax_bytes
                )));
            }
            // The program multiplies pmax (< 2^32) by a backlog below Kmax: keep it in u64.
            if b.kmax_bytes > 1 << 30 || b.max_backlog_bytes > 1 << 30 {
                return Err(ImpairError::Invalid(
                    "--kmax and --max-backlog are at most 1 GiB".into(),
                ));
            }
            c.pmax = prob("pmax", b.pmax)?;
            c.rate_bps = b.rate_bps;
            c.ps_per_byte = ImpairConfig::ps_per_byte_at(b.rate_bps);
            c.kmin_bytes = b.kmin_bytes;
            c.kmax_bytes = b.kmax_bytes;
            c.max_backlog_bytes = b.max_backlog_bytes;
        }
        Ok(c)
    }

    /// The settings a map value holds.
    #[must_use]
    pub fn from_config(c: &ImpairConfig) -> Self {
        Self {
            port: u16::try_from(c.port)
                .ok()
                .filter(|p| *p != 0)
                .unwrap_or(ROCE_V2_UDP_PORT),
            drop: prob_from_fixed(c.drop),
            dup: prob_from_fixed(c.dup),
            reorder: prob_from_fixed(c.reorder),
            corrupt: prob_from_fixed(c.corrupt),
            ce: prob_from_fixed(c.ce),
            bottleneck: (c.rate_bps != 0).then(|| Bottleneck {
                rate_bps: c.rate_bps,
                kmin_bytes: c.kmin_bytes,
                kmax_bytes: c.kmax_bytes,
                pmax: prob_from_fixed(c.pmax),
                max_backlog_bytes: c.max_backlog_bytes,
            }),
            mad_attr: u16::try_from(c.mad_attr).ok().filter(|a| *a != 0),
            limit: c.limit,
        }
    }
}

/// What [`apply`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ApplyReport {
    /// Interface.
    pub ifname: String,
    /// Whether the program was attached now (else it was already, and only the settings changed).
    pub attached: bool,
    /// Kernel program id.
    pub prog_id: Option<u32>,
    /// Kernel link id.
    pub link_id: Option<u32>,
    /// Settings now in force.
    pub settings: ImpairSettings,
    /// Pin directory.
    pub pin_dir: String,
}

fn open_map(dir: &Path, ifname: &str, name: &str) -> Result<aya::maps::Map, ImpairError> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(ImpairError::NotAttached(ifname.to_owned()));
    }
    let data = MapData::from_pin(&path).map_err(LoadError::from)?;
    Ok(aya::maps::Map::from_map_data(data).map_err(LoadError::from)?)
}

/// Attaches roce_impair to `ifname`'s egress with `settings`, or, when it is attached already,
/// changes its settings in place (packets in flight see the new ones at once; counters go on,
/// the count under `settings.limit` starts again). On a failed attach nothing is left behind.
///
/// # Errors
/// Not root, no such interface, bad settings, no eBPF object, verifier or pin failures.
pub fn apply(ifname: &str, settings: &ImpairSettings) -> Result<ApplyReport, ImpairError> {
    loader::require_root()?;
    loader::ifindex(ifname)?;
    let config = settings.to_config()?;
    let dir = pin_dir(ifname);
    if dir.join(PIN_LINK).exists() {
        let mut used: Array<_, LimitState> =
            Array::try_from(open_map(&dir, ifname, MAP_IMPAIR_LIMIT)?)?;
        used.set(0, LimitState::default(), 0)?;
        let mut arr: Array<_, ImpairConfig> =
            Array::try_from(open_map(&dir, ifname, MAP_IMPAIR_CONFIG)?)?;
        arr.set(0, config, 0)?;
        let (prog_id, link_id) = pins::link_ids(&dir);
        return Ok(ApplyReport {
            ifname: ifname.to_owned(),
            attached: false,
            prog_id,
            link_id,
            settings: *settings,
            pin_dir: dir.display().to_string(),
        });
    }
    if IMPAIR_OBJECT.is_empty() {
        return Err(LoadError::StubObject.into());
    }
    loader::ensure_bpffs()?;
    let (prog_id, link_id) =
        pins::populate_fresh(&dir, &pin_root(), |dir| attach(ifname, config, dir))?;
    Ok(ApplyReport {
        ifname: ifname.to_owned(),
        attached: true,
        prog_id: Some(prog_id),
        link_id: Some(link_id),
        settings: *settings,
        pin_dir: dir.display().to_string(),
    })
}

fn attach(ifname: &str, config: ImpairConfig, dir: &Path) -> Result<(u32, u32), ImpairError> {
    let mut ebpf = EbpfLoader::new().load(IMPAIR_OBJECT)?;
    {
        let map = ebpf
            .map_mut(MAP_IMPAIR_CONFIG)
            .ok_or(LoadError::Missing(MAP_IMPAIR_CONFIG))?;
        let mut arr: Array<_, ImpairConfig> = Array::try_from(map)?;
        arr.set(0, config, 0)?;
    }
    for name in [
        MAP_IMPAIR_CONFIG,
        MAP_IMPAIR_STATS,
        MAP_IMPAIR_BOTTLENECK,
        MAP_IMPAIR_HELD,
        MAP_IMPAIR_LIMIT,
        MAP_LOG_LEVEL,
    ] {
        let map = ebpf.map(name).ok_or(LoadError::Missing(name))?;
        map.pin(dir.join(name))?;
    }
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_ROCE_IMPAIR)
        .ok_or(LoadError::Missing("roce_impair program"))?
        .try_into()?;
    prog.load()?;
    let prog_id = prog.info()?.id();
    let link_id = prog.attach(ifname, TcAttachType::Egress)?;
    let link = prog.take_link(link_id)?;
    let fd_link: FdLink = link
        .try_into()
        .map_err(|_| ImpairError::NoTcx(ifname.to_owned()))?;
    let kernel_link_id = pins::pin_link(fd_link, dir)?;
    Ok((prog_id, kernel_link_id))
}

/// What [`off`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OffReport {
    /// Interface.
    pub ifname: String,
    /// Whether a link was found and detached.
    pub detached: bool,
    /// Pins removed.
    pub removed: Vec<String>,
}

/// Detaches roce_impair from `ifname` and removes its pins (a packet held back for reordering
/// is discarded with them).
///
/// # Errors
/// Not root, not attached, or a pin that cannot be removed.
pub fn off(ifname: &str) -> Result<OffReport, ImpairError> {
    loader::require_root()?;
    loader::check_ifname(ifname)?;
    let dir = pin_dir(ifname);
    if !dir.is_dir() {
        return Err(ImpairError::NotAttached(ifname.to_owned()));
    }
    let pins::Detached { detached, removed } = pins::detach(&dir, &pin_root())?;
    Ok(OffReport {
        ifname: ifname.to_owned(),
        detached,
        removed,
    })
}

/// What [`show`] reads.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImpairShow {
    /// Interface.
    pub ifname: String,
    /// Kernel program id, if the link is alive.
    pub prog_id: Option<u32>,
    /// Kernel link id, if the link is alive.
    pub link_id: Option<u32>,
    /// Settings in force.
    pub settings: ImpairSettings,
    /// Virtual backlog of the bottleneck now, bytes (0 without one).
    pub backlog_bytes: u64,
    /// Packets impaired under `settings.limit` since the settings were written.
    pub limit_used: u64,
    /// Counters summed over CPUs.
    #[serde(skip)]
    pub stats: ImpairStats,
}

/// Reads the settings and counters of roce_impair on `ifname`.
///
/// # Errors
/// Not root, not attached, or unreadable maps.
pub fn show(ifname: &str) -> Result<ImpairShow, ImpairError> {
    loader::require_root()?;
    loader::check_ifname(ifname)?;
    let dir = pin_dir(ifname);
    let cfg: Array<_, ImpairConfig> = Array::try_from(open_map(&dir, ifname, MAP_IMPAIR_CONFIG)?)?;
    let cfg = cfg.get(&0, 0)?;
    let stats: PerCpuArray<_, ImpairStats> =
        PerCpuArray::try_from(open_map(&dir, ifname, MAP_IMPAIR_STATS)?)?;
    let mut total = ImpairStats::default();
    for s in stats.get(&0, 0)?.iter() {
        total.add(s);
    }
    let bn: Array<_, BottleneckState> =
        Array::try_from(open_map(&dir, ifname, MAP_IMPAIR_BOTTLENECK)?)?;
    let empty_at = bn.get(&0, 0)?.empty_at_ns;
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    let backlog_bytes = if cfg.ps_per_byte != 0 && empty_at > now {
        (empty_at - now) * 1000 / cfg.ps_per_byte
    } else {
        0
    };
    let used: Array<_, LimitState> = Array::try_from(open_map(&dir, ifname, MAP_IMPAIR_LIMIT)?)?;
    let limit_used = used.get(&0, 0)?.used;
    let (prog_id, link_id) = pins::link_ids(&dir);
    Ok(ImpairShow {
        ifname: ifname.to_owned(),
        prog_id,
        link_id,
        settings: ImpairSettings::from_config(&cfg),
        backlog_bytes,
        limit_used,
        stats: total,
    })
}

#[cfg(test)]
mod tests {
    use roce_common::impair::PROB_ONE;

    use super::*;

    #[test]
    fn settings_round_trip_and_are_checked() {
        let s = ImpairSettings {
            drop: 0.5,
            ce: 1.0,
            bottleneck: Some(Bottleneck::at(1_000_000_000)),
            mad_attr: Some(roce_common::mad::CmAttr::Rtu.id()),
            limit: 3,
            ..ImpairSettings::default()
        };
        let c = s.to_config().unwrap();
        assert_eq!((c.mad_attr, c.limit), (0x14, 3));
        assert_eq!(c.drop, 1 << 31);
        assert_eq!(c.ce, PROB_ONE);
        assert_eq!(c.port, 4791);
        assert_eq!(c.ps_per_byte, 8000);
        assert_eq!(c.pmax, prob_to_fixed(0.01));
        assert_eq!(ImpairSettings::from_config(&c), {
            let mut t = s;
            t.bottleneck.as_mut().unwrap().pmax = prob_from_fixed(prob_to_fixed(0.01));
            t
        });
        let bad = ImpairSettings {
            dup: 1.5,
            ..ImpairSettings::default()
        };
        assert!(
            bad.to_config()
                .unwrap_err()
                .to_string()
                .contains("--dup 1.5")
        );
        let mut b = Bottleneck::at(1);
        b.kmin_bytes = b.kmax_bytes + 1;
        let bad = ImpairSettings {
            bottleneck: Some(b),
            ..ImpairSettings::default()
        };
        assert!(bad.to_config().is_err());
        let bad = ImpairSettings {
            mad_attr: Some(0),
            ..ImpairSettings::default()
        };
        assert!(bad.to_config().unwrap_err().to_string().contains("--mad 0"));
        assert_eq!(ImpairConfig::ps_per_byte_at(100_000_000_000_000), 1);
    }
}
