//! Run-time switch of the eBPF programs' log records (aya-log), shared by both sides.
//!
//! `roce_xdp` and `roce_impair` each have an array map [`MAP_LOG_LEVEL`] with one `u32`: the
//! most verbose [`LogLevel`] whose records the program writes, or [`LogLevel::Off`] (0, the
//! value a fresh map holds). The programs read it only on their rare paths (a drop, a redirect
//! that fell back to the stack, an impairment), never on the path of a frame they redirect or
//! pass, so logging costs nothing when it is off. `roce log` and `roce load --log-level` write it;
//! no reload is needed. The records go to aya-log's ring buffer `AYA_LOGS`.
//!
//! Each record is one line `event=CODE src=IP dst=IP ...`: [`CODE`](describe) says what happened
//! and names the counter the frame was counted under (`XdpStats` / `ImpairStats` field names,
//! never spelled a second time: [`describe`] maps the code to them); then the frame's addresses
//! (IPv4 as IPv4-mapped IPv6) and, when the frame holds a BTH, `qpn=`, `opcode=` and `psn=`.
//! The programs write a number rather than the names because every byte string of a different
//! length multiplies the states the verifier walks through aya-log's copy loops (roce_xdp went
//! past the verifier's million instructions with the names); user space (`roce log`) prints the
//! names.

/// Array map (one `u32`) in both programs: the current [`LogLevel`] code.
pub const MAP_LOG_LEVEL: &str = "ROCE_LOG_LEVEL";

/// aya-log's ring buffer of records in both programs (the name aya-log-ebpf gives it).
pub const MAP_LOGS: &str = "AYA_LOGS";

use crate::{
    counters::{DropReason, XdpStats},
    impair::{ImpairStats, PROG_ROCE_IMPAIR},
    maps::PROG_ROCE_XDP,
};

/// aya-log's target of every record (the program is told by the record's code).
pub const LOG_TARGET: &str = "roce";

/// Event word of a record about a dropped frame.
pub const EVENT_DROP: &str = "drop";
/// Event word of a record about a frame for one of our QPs that no AF_XDP socket took, passed
/// to the kernel instead.
pub const EVENT_FALLBACK: &str = "fallback";
/// Event word of a record about what `roce_impair` did to a frame.
pub const EVENT_IMPAIR: &str = "impair";

/// Record code of a frame of a foreign QP that roce_xdp dropped (`--drop-foreign`). Codes
/// `1..=255` are the [`DropReason`] codes of malformed frames.
pub const CODE_FOREIGN_QP: u32 = 0x100;
/// Record code of a frame for one of our QPs passed to the kernel because no AF_XDP socket
/// serves its queue.
pub const CODE_FALLBACK: u32 = 0x101;
/// Record code of roce_impair's action `i` of [`IMPAIR_ACTIONS`] is `CODE_IMPAIR + i`.
pub const CODE_IMPAIR: u32 = 0x200;

/// What roce_impair can do to a frame, by the counter that counts it; the index is the record
/// code's offset from [`CODE_IMPAIR`].
pub const IMPAIR_ACTIONS: [&str; 9] = [
    ImpairStats::bottleneck_dropped,
    ImpairStats::bottleneck_early_dropped,
    ImpairStats::bottleneck_marked,
    ImpairStats::dropped,
    ImpairStats::corrupted,
    ImpairStats::ce_marked,
    ImpairStats::duplicated,
    ImpairStats::reordered,
    ImpairStats::reorder_released,
];

/// The event word and the counter name of record code `code`; `None` for a code no program writes.
#[must_use]
pub const fn describe(code: u32) -> Option<(&'static str, &'static str)> {
    match code {
        CODE_FOREIGN_QP => Some((EVENT_DROP, XdpStats::drop_foreign_qp)),
        CODE_FALLBACK => Some((EVENT_FALLBACK, XdpStats::redirect_fallback_pass)),
        0..=0xff => match DropReason::from_code(code as u8) {
            Some(r) => Some((EVENT_DROP, r.counter_name())),
            None => None,
        },
        _ => {
            let i = code.wrapping_sub(CODE_IMPAIR) as usize;
            if i < IMPAIR_ACTIONS.len() {
                Some((EVENT_IMPAIR, IMPAIR_ACTIONS[i]))
            } else {
                None
            }
        }
    }
}

/// The program that writes records with code `code`.
#[must_use]
pub const fn program_of(code: u32) -> &'static str {
    if code >= CODE_IMPAIR {
        PROG_ROCE_IMPAIR
    } else {
        PROG_ROCE_XDP
    }
}

/// The level of the record with code `code`: malformed drops and fallbacks are warnings,
/// foreign-QP drops and roce_impair's actions info, its CE marks (frequent, harmless) debug.
#[inline(always)]
#[must_use]
pub const fn level_of(code: u32) -> LogLevel {
    match code {
        CODE_FOREIGN_QP => LogLevel::Info,
        CODE_FALLBACK | 0..=0xff => LogLevel::Warn,
        // bottleneck_marked and ce_marked.
        c if c == CODE_IMPAIR + 2 || c == CODE_IMPAIR + 5 => LogLevel::Debug,
        _ => LogLevel::Info,
    }
}

/// How much the eBPF programs log. The codes are aya-log's `Level` values (`Error` = 1 ...
/// `Debug` = 4), with 0 for off, so that a record is written when its level's code is at most
/// the map's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum LogLevel {
    /// Nothing is written (the default).
    Off = 0,
    /// Malformed frames dropped, and redirects that fell back to the kernel.
    Warn = 2,
    /// Also frames of foreign QPs dropped (`--drop-foreign`), and what `roce_impair` dropped,
    /// corrupted, duplicated or reordered.
    Info = 3,
    /// Also `roce_impair`'s CE marks (random and by its virtual bottleneck).
    Debug = 4,
}

impl LogLevel {
    /// Every level, from off to the most verbose.
    pub const ALL: [Self; 4] = [Self::Off, Self::Warn, Self::Info, Self::Debug];

    /// The value stored in [`MAP_LOG_LEVEL`].
    #[must_use]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The level stored as `code`; an unknown code reads as the most verbose level below it.
    #[must_use]
    pub const fn from_code(code: u32) -> Self {
        match code {
            0 | 1 => Self::Off,
            2 => Self::Warn,
            3 => Self::Info,
            _ => Self::Debug,
        }
    }

    /// The name used on the command line and in JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
        }
    }

    /// Whether a record of `self`'s level is written when the map holds `current`. Call on the
    /// rare path, after reading the map.
    #[inline(always)]
    #[must_use]
    pub const fn enabled_at(self, current: u32) -> bool {
        current != 0 && self as u32 <= current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_round_trip_and_order() {
        for l in LogLevel::ALL {
            assert_eq!(LogLevel::from_code(l.code()), l);
        }
        assert!(!LogLevel::Warn.enabled_at(LogLevel::Off.code()));
        assert!(LogLevel::Warn.enabled_at(LogLevel::Warn.code()));
        assert!(!LogLevel::Info.enabled_at(LogLevel::Warn.code()));
        assert!(LogLevel::Info.enabled_at(LogLevel::Debug.code()));
    }

    #[test]
    fn codes_name_their_counters() {
        for r in DropReason::ALL {
            assert_eq!(describe(*r as u32), Some((EVENT_DROP, r.counter_name())));
            assert_eq!(level_of(*r as u32), LogLevel::Warn);
        }
        assert_eq!(describe(CODE_FOREIGN_QP), Some(("drop", "drop_foreign_qp")));
        assert_eq!(describe(CODE_FALLBACK).unwrap().1, "redirect_fallback_pass");
        for (i, name) in IMPAIR_ACTIONS.iter().enumerate() {
            let code = CODE_IMPAIR + i as u32;
            assert_eq!(describe(code), Some((EVENT_IMPAIR, *name)));
            assert!(ImpairStats::NAMES.contains(name));
            let debug = *name == "ce_marked" || *name == "bottleneck_marked";
            assert_eq!(level_of(code) == LogLevel::Debug, debug, "{name}");
        }
        assert_eq!(describe(0), None);
        assert_eq!(describe(CODE_IMPAIR + 9), None);
    }
}
