//! The RoCE v2 wire format: zero-copy packet views and high-level representations.
//!
//! Sans-I/O and allocation-free. The design follows smoltcp's `wire` module:
//!
//! - The `Packet` family (`bth::Packet<T>`, `ipv4::Packet<T>`, ...) are views over a byte buffer
//!   (`T: AsRef<[u8]>`, plus `AsMut<[u8]>` for setters) that read and write fields in place.
//! - The `Repr` family (`BthRepr`, `RethRepr`, ...) are plain values that are parsed from a
//!   checked view and emitted into a mutable one.
//!
//! The contract: once `Packet::new_checked` (or `check_len`) has returned `Ok`, no accessor or
//! setter of that view can panic. When parsing untrusted input, always go through
//! `new_checked`. When emitting, size the buffer with `Repr::buffer_len` and use
//! `new_unchecked`: `new_checked` would look at fields that have not been written yet.
//!
//! The layers, bottom up: [`ethernet`] (with up to two VLAN tags), [`ipv4`], [`ipv6`], [`udp`],
//! the InfiniBand transport headers ([`bth`], [`reth`], [`aeth`], [`atomic`], [`immdt`],
//! [`ieth`], [`deth`], [`feth`], [`cnp`]), the RoCE packet from the BTH onward ([`roce`]), the
//! invariant CRC ([`icrc`]), the whole-frame layer the transport uses ([`frame`]:
//! [`parse_frame`], [`parse_frame_in_place`], [`emit_frame`], the UDP source-port rule) and
//! the drop counters for refused frames ([`drops`]).
//!
//! Typical use by the engine and transport:
//!
//! ```
//! use roce::wire::{self, BthRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, Qpn, RoceRepr};
//! use std::net::Ipv4Addr;
//!
//! let ip = IpPath::V4 { src: Ipv4Addr::new(10, 0, 0, 1), dst: Ipv4Addr::new(10, 0, 0, 2) };
//! let mut path = PathRepr::new(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2]), ip);
//! path.udp_src_port = wire::frame::udp_src_port(Qpn::new(0x11), Qpn::new(0x12));
//! let send = RoceRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(7)));
//! let mut buf = [0u8; 128];
//! let n = wire::emit_frame(&path, &send, b"hello", &mut buf).unwrap();
//!
//! let mut drops = wire::WireDrops::default();
//! let frame = drops.accept(wire::parse_frame(&buf[..n])).expect("valid frame");
//! assert_eq!(frame.roce.bth.psn, Psn::new(7));
//! assert_eq!(frame.payload, b"hello");
//! ```
//!
//! Which headers follow the BTH comes from the opcode table in [`roce_common::opcode`]; lengths
//! come from [`roce_common::hdr`]. Nothing here retypes them.

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cnp;
pub mod deth;
pub mod drops;
pub mod ethernet;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod multipath;
pub mod peek;
pub mod reth;
pub mod roce;
pub mod types;
pub mod udp;

pub use aeth::{AethRepr, AethSyndrome, CreditCode, NakCode, RnrTimer};
pub use atomic::{AtomicAckEthRepr, AtomicEthRepr};
pub use bth::BthRepr;
pub use cnp::CnpRepr;
pub use deth::DethRepr;
pub use drops::WireDrops;
pub use ethernet::{EthernetAddress, EthernetRepr, VlanTag};
pub use feth::FethRepr;
pub use frame::{
    Ecn, Frame, FrameTemplate, IpPath, IpRepr, PathRepr, emit_frame, frame_len, parse_frame,
    parse_frame_in_place,
};
pub use ieth::IethRepr;
pub use immdt::ImmDtRepr;
pub use ipv4::Ipv4Repr;
pub use ipv6::Ipv6Repr;
pub use reth::RethRepr;
pub use roce::{RocePacket, RoceRepr};
pub use roce_common::opcode::Opcode;
pub use types::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};
pub use udp::UdpRepr;

/// Why a buffer could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the headers or lengths it announces.
    #[error("packet truncated")]
    Truncated,
    /// A field holds a value the format forbids.
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// The BTH opcode is not in the opcode table (reserved, RD or vendor-specific).
    #[error("unknown BTH opcode {0:?}")]
    UnknownOpcode(Opcode),
    /// A valid packet that roce-xdp does not handle (IP fragments, IPv4 options, ...).
    #[error("unsupported packet: {0}")]
    Unsupported(&'static str),
    /// Not RoCE v2: another EtherType, IP protocol or UDP port.
    #[error("not a RoCE v2 packet: {0}")]
    NotRoce(&'static str),
    /// The output buffer cannot hold what is to be emitted.
    #[error("output buffer too small: {needed} bytes needed, {have} available")]
    BufferTooSmall {
        /// Bytes the emitted packet needs.
        needed: usize,
        /// Bytes the buffer has.
        have: usize,
    },
    /// The representation is inconsistent with its opcode (a missing or extra extended header,
    /// a payload on an opcode that carries none, ...).
    #[error("invalid representation: {0}")]
    InvalidRepr(&'static str),
}

/// The result type of this module.
pub type Result<T> = core::result::Result<T, WireError>;

/// A byte range of a header.
pub(crate) type Field = core::ops::Range<usize>;

/// Reads a big-endian `u16` at `off`. Callers have checked the length.
#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Reads a big-endian `u32` at `off`. Callers have checked the length.
#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads a big-endian 24-bit value at `off`. Callers have checked the length.
#[inline]
pub(crate) fn be24(b: &[u8], off: usize) -> u32 {
    (u32::from(b[off]) << 16) | (u32::from(b[off + 1]) << 8) | u32::from(b[off + 2])
}

/// Reads a big-endian `u64` at `off`. Callers have checked the length.
#[inline]
pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

#[inline]
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put24(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

/// Defines the common part of a fixed-length header view: the struct, `new_unchecked`,
/// `new_checked`, `check_len`, `into_inner` and `HEADER_LEN`.
macro_rules! fixed_view {
    ($(#[$m:meta])* len = $len:expr) => {
        /// Length of the header in bytes.
        pub const HEADER_LEN: usize = $len;

        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length: accessors may panic on a short
            /// buffer. Use this when emitting into a buffer sized with `buffer_len`.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after [`Self::check_len`]: no accessor can panic afterwards.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks that the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err($crate::wire::WireError::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use fixed_view;
