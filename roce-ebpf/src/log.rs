//! The aya-log record of a frame, shared by roce_xdp and roce_impair (see `roce_common::log` for
//! its form and the switch that guards it).
//!
//! The program that saw the frame reads its headers into a [`FrameRecord`] on its stack, on its
//! rare path only, and calls [`write()`], a BPF subprogram that takes only that pointer: it never
//! touches the packet (a context or packet pointer handed to a subprogram is easily mangled by
//! LLVM beyond what the verifier accepts), and aya-log's instructions and stack stay out of the
//! callers' other paths.

use core::net::Ipv6Addr;

use aya_log_ebpf::macro_support::Level;
use roce_common::log::{LOG_TARGET, LogLevel, level_of};

/// What a record says about a frame. Addresses are IPv6, IPv4 as IPv4-mapped (one length for
/// both versions keeps the verifier's walk through aya-log's copies short).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FrameRecord {
    /// The record code (`roce_common::log::describe`).
    pub code: u32,
    /// BTH destination QP (valid when `has_bth != 0`).
    pub qpn: u32,
    /// BTH PSN (valid when `has_bth != 0`).
    pub psn: u32,
    /// UDP source port (0 when not read).
    pub sport: u16,
    /// BTH opcode (valid when `has_bth != 0`).
    pub opcode: u8,
    /// Whether the frame held a whole BTH.
    pub has_bth: u8,
    /// IP source.
    pub src: [u8; 16],
    /// IP destination.
    pub dst: [u8; 16],
}

impl FrameRecord {
    /// An empty record with code `code`.
    #[inline(always)]
    #[must_use]
    pub const fn new(code: u32) -> Self {
        Self {
            code,
            qpn: 0,
            psn: 0,
            sport: 0,
            opcode: 0,
            has_bth: 0,
            src: [0; 16],
            dst: [0; 16],
        }
    }

    /// Sets the addresses from an IPv4 header's.
    #[inline(always)]
    pub fn set_v4(&mut self, src: [u8; 4], dst: [u8; 4]) {
        self.src = mapped(src);
        self.dst = mapped(dst);
    }
}

#[inline(always)]
const fn mapped(a: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

/// Writes `rec` to aya-log's ring buffer at the level of its code. Call only when the level map
/// asked for that level (`LogLevel::enabled_at`); a full ring buffer loses the record.
#[inline(never)]
pub fn write(rec: &FrameRecord) {
    // aya-log's `Level` codes are the `LogLevel` codes.
    let level = match level_of(rec.code) {
        LogLevel::Debug => Level::Debug,
        LogLevel::Info => Level::Info,
        _ => Level::Warn,
    };
    let src = Ipv6Addr::from(rec.src);
    let dst = Ipv6Addr::from(rec.dst);
    if rec.has_bth != 0 {
        aya_log_ebpf::log!(
            rec,
            target: LOG_TARGET,
            level,
            "event={} src={:i} dst={:i} sport={} qpn={} opcode=0x{:x} psn={}",
            rec.code,
            src,
            dst,
            rec.sport,
            rec.qpn,
            rec.opcode,
            rec.psn
        );
    } else {
        aya_log_ebpf::log!(
            rec,
            target: LOG_TARGET,
            level,
            "event={} src={:i} dst={:i} sport={}",
            rec.code,
            src,
            dst,
            rec.sport
        );
    }
}
