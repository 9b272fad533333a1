//! The log records of `roce_xdp` and `roce_impair` (aya-log): switching them on by level and
//! reading them from a program that is already attached, as `roce log` does.
//!
//! Both programs have a `ROCE_LOG_LEVEL` map (see [`roce_common::log`]), pinned with their other
//! maps; a fresh map holds 0, so nothing is logged until someone writes a level. The records go
//! to the program's aya-log ring buffer (`AYA_LOGS`), which is found from the program's id: the
//! program is the one loaded under that name that uses the pinned level map.
//!
//! This is an I/O edge: it talks to the kernel through aya and aya-log.

use std::net::IpAddr;

use aya::{
    maps::{Array, MapData},
    programs::loaded_programs,
};
use aya_log::EbpfLogger;
pub use roce_common::log::LogLevel;
use roce_common::{
    impair::PROG_ROCE_IMPAIR,
    log::{MAP_LOG_LEVEL, describe, program_of},
    maps::PROG_ROCE_XDP,
};

use super::{LoadError, impair, pin_dir};

/// Which of the two programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Program {
    /// `roce_xdp`, the receive classifier (`roce load`).
    RoceXdp,
    /// `roce_impair`, the egress fault injector (`roce impair`).
    RoceImpair,
}

impl Program {
    /// Both programs.
    pub const ALL: [Self; 2] = [Self::RoceXdp, Self::RoceImpair];

    /// The program's name in the object and in the kernel.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::RoceXdp => PROG_ROCE_XDP,
            Self::RoceImpair => PROG_ROCE_IMPAIR,
        }
    }
}

/// Why the log of a program cannot be switched or read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Root, bpffs, pins or map trouble.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The program is not attached to the interface.
    #[error("{program} is not attached to {ifname}")]
    NotAttached {
        /// The program.
        program: &'static str,
        /// Interface.
        ifname: String,
    },
    /// The pins predate the log switch.
    #[error(
        "{program} on {ifname} was loaded by an older roce without a log switch ({MAP_LOG_LEVEL}); reload it"
    )]
    NoLevelMap {
        /// The program.
        program: &'static str,
        /// Interface.
        ifname: String,
    },
    /// No loaded program uses the pinned level map (the pins outlived the program).
    #[error("no loaded {0} program uses the pinned {MAP_LOG_LEVEL} map (stale pins?)")]
    ProgramGone(&'static str),
    /// aya-log could not open the program's ring buffer.
    #[error("cannot read the log records of {program}: {source}")]
    Logger {
        /// The program.
        program: &'static str,
        /// aya-log's answer.
        #[source]
        source: aya_log::Error,
    },
}

/// The log switch of one program on one interface, opened through its pin.
pub struct LevelMap {
    program: Program,
    map: Array<MapData, u32>,
    map_id: u32,
}

impl LevelMap {
    /// Opens the level map of `program` on `ifname`. Call before [`LevelMap::set`] or
    /// [`LevelMap::logger`].
    ///
    /// # Errors
    /// The program is not attached there, its pins predate the switch, or the map cannot be opened.
    pub fn open(program: Program, ifname: &str) -> Result<Self, LogError> {
        let dir = match program {
            Program::RoceXdp => pin_dir(ifname),
            Program::RoceImpair => impair::pin_dir(ifname),
        };
        let attached = match program {
            // Pinned by `roce load`, or held by a process that loaded it for itself.
            Program::RoceXdp => super::Pins::new(ifname).is_attached(),
            Program::RoceImpair => dir.join(super::PIN_LINK).exists(),
        };
        if !attached {
            return Err(LogError::NotAttached {
                program: program.name(),
                ifname: ifname.to_owned(),
            });
        }
        let path = dir.join(MAP_LOG_LEVEL);
        if !path.exists() {
            return Err(LogError::NoLevelMap {
                program: program.name(),
                ifname: ifname.to_owned(),
            });
        }
        let data = MapData::from_pin(&path).map_err(LoadError::from)?;
        let map_id = data.info().map_err(LoadError::from)?.id();
        let map = aya::maps::Map::from_map_data(data).map_err(LoadError::from)?;
        let map = Array::try_from(map).map_err(LoadError::from)?;
        Ok(Self {
            program,
            map,
            map_id,
        })
    }

    /// The program.
    #[must_use]
    pub const fn program(&self) -> Program {
        self.program
    }

    /// The level the program logs at now.
    ///
    /// # Errors
    /// The map cannot be read.
    pub fn get(&self) -> Result<LogLevel, LogError> {
        let code = self.map.get(&0, 0).map_err(LoadError::from)?;
        Ok(LogLevel::from_code(code))
    }

    /// Switches the program's records to `level` (effective for the next frame; no reload).
    ///
    /// # Errors
    /// The map cannot be written.
    pub fn set(&mut self, level: LogLevel) -> Result<(), LogError> {
        self.map.set(0, level.code(), 0).map_err(LoadError::from)?;
        Ok(())
    }

    /// The kernel id of the program that uses this map.
    ///
    /// # Errors
    /// No loaded program of that name uses the map.
    pub fn program_id(&self) -> Result<u32, LogError> {
        let name = self.program.name();
        loaded_programs()
            .filter_map(Result::ok)
            .find(|info| {
                info.name_as_str() == Some(name)
                    && info
                        .map_ids()
                        .ok()
                        .flatten()
                        .is_some_and(|ids| ids.contains(&self.map_id))
            })
            .map(|info| info.id())
            .ok_or(LogError::ProgramGone(name))
    }

    /// aya-log's reader of the program's records, which hands each record to `logger`. Drive it
    /// with [`EbpfLogger::flush`] when its file descriptor is readable (tokio's `AsyncFd`).
    ///
    /// # Errors
    /// The program is gone, or its ring buffer cannot be opened.
    pub fn logger<T: log::Log>(&self, logger: T) -> Result<EbpfLogger<T>, LogError> {
        let id = self.program_id()?;
        EbpfLogger::init_from_id_with_logger(id, logger).map_err(|source| LogError::Logger {
            program: self.program.name(),
            source,
        })
    }
}

/// One log record of either program, split into its fields (see [`roce_common::log`] for the
/// record's form). Fields the record does not carry are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogRecord {
    /// The program that wrote it (`roce_xdp`, `roce_impair`).
    pub program: String,
    /// `warn`, `info` or `debug`.
    pub level: String,
    /// `drop`, `fallback` or `impair`.
    pub event: String,
    /// The counter the frame was counted under (`drop_bad_tver`, `corrupted`, ...).
    pub reason: String,
    /// IP source address.
    pub src: Option<IpAddr>,
    /// IP destination address.
    pub dst: Option<IpAddr>,
    /// UDP source port.
    pub sport: Option<u16>,
    /// BTH destination QP.
    pub qpn: Option<u32>,
    /// BTH opcode.
    pub opcode: Option<u8>,
    /// BTH PSN.
    pub psn: Option<u32>,
}

impl LogRecord {
    /// Splits the message of a record written at `level`, and names its program, event and
    /// reason from its code ([`roce_common::log::describe`]). `None` when the message is not
    /// one of ours (aya-log's own errors, say).
    #[must_use]
    pub fn parse(level: log::Level, message: &str) -> Option<Self> {
        let mut r = Self {
            level: level.as_str().to_ascii_lowercase(),
            ..Self::default()
        };
        for word in message.split_ascii_whitespace() {
            let (key, value) = word.split_once('=')?;
            match key {
                "event" => {
                    let code = value.parse().ok()?;
                    let (event, reason) = describe(code)?;
                    program_of(code).clone_into(&mut r.program);
                    event.clone_into(&mut r.event);
                    reason.clone_into(&mut r.reason);
                }
                "src" => r.src = Some(value.parse::<IpAddr>().ok()?.to_canonical()),
                "dst" => r.dst = Some(value.parse::<IpAddr>().ok()?.to_canonical()),
                "sport" => r.sport = Some(value.parse().ok()?),
                "qpn" => r.qpn = Some(value.parse().ok()?),
                "opcode" => {
                    r.opcode = Some(u8::from_str_radix(value.trim_start_matches("0x"), 16).ok()?);
                }
                "psn" => r.psn = Some(value.parse().ok()?),
                _ => {}
            }
        }
        (!r.event.is_empty()).then_some(r)
    }
}

impl std::fmt::Display for LogRecord {
    /// `EVENT reason=NAME src=.. dst=.. [sport=..] [qpn=.. opcode=0x.. psn=..]`: the record as
    /// `roce log` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} reason={}", self.event, self.reason)?;
        if let (Some(src), Some(dst)) = (self.src, self.dst) {
            write!(f, " src={src} dst={dst}")?;
        }
        if let Some(p) = self.sport {
            write!(f, " sport={p}")?;
        }
        if let (Some(q), Some(o), Some(p)) = (self.qpn, self.opcode, self.psn) {
            write!(f, " qpn={q} opcode=0x{o:02x} psn={p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_into_fields() {
        let r = LogRecord::parse(
            log::Level::Warn,
            "event=3 src=::ffff:10.0.0.1 dst=fd00::2 sport=49152 qpn=17 opcode=0x4 psn=7",
        )
        .unwrap();
        assert_eq!(r.event, "drop");
        assert_eq!(r.level, "warn");
        assert_eq!(r.reason, "drop_bad_tver");
        assert_eq!(r.src, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.dst, Some("fd00::2".parse().unwrap()));
        assert_eq!(
            (r.sport, r.qpn, r.opcode, r.psn),
            (Some(49152), Some(17), Some(4), Some(7))
        );
        assert_eq!(
            r.to_string(),
            "drop reason=drop_bad_tver src=10.0.0.1 dst=fd00::2 sport=49152 qpn=17 opcode=0x04 psn=7"
        );
        let short = LogRecord::parse(
            log::Level::Warn,
            "event=1 src=::ffff:10.0.0.1 dst=::ffff:10.0.0.2 sport=1",
        )
        .unwrap();
        assert_eq!(short.reason, "drop_udp_length");
        assert_eq!((short.qpn, short.opcode, short.psn), (None, None, None));
        let imp = LogRecord::parse(log::Level::Info, "event=515 qpn=1").unwrap();
        assert_eq!(
            (
                imp.program.as_str(),
                imp.event.as_str(),
                imp.reason.as_str()
            ),
            ("roce_impair", "impair", "dropped")
        );
        assert_eq!(r.program, "roce_xdp");
        assert!(LogRecord::parse(log::Level::Error, "invalid utf8").is_none());
        assert!(LogRecord::parse(log::Level::Warn, "event=3 qpn=zz").is_none());
        assert!(LogRecord::parse(log::Level::Warn, "event=999").is_none());
    }
}
