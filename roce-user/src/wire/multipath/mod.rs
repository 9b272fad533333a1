//! The wire format of the multipath extension between two roce-xdp QPs (docs/multipath.md,
//! "The wire format of the extension"; issue 19). Nothing here is plain RoCE v2: a QP only
//! reads or writes these bytes once both ends agreed in band (the BTH `resv7` bits,
//! [`MpBthFlags`]), so towards rxe or an RDMA NIC nothing changes.
//!
//! - [`MpBthFlags`]: the two `resv7` bits of the BTH (byte 8, below AckReq): `OFFER` (the
//!   sender allows the extension) and `TRAILER` (this packet carries a trailer).
//! - [`placement`]: the 28-byte placement trailer on request and READ response packets, which
//!   lets the responder place a packet on its own, out of order.
//! - [`sack`]: the 12-byte SACK trailer on ACKs: a 64-bit bitmap beyond the AETH's cumulative
//!   PSN (as UET's PDS) and the count of out-of-order packets held.
//! - [`path_feedback`]: the UDP source port (entropy) of the CE-marked packet, in a CNP's 16
//!   reserved bytes.
//!
//! Where the trailers sit: a trailer is the last bytes of the payload, before the pad and the
//! ICRC (`data | trailer | pad | ICRC`; the BTH pad count pads data and trailer together, and
//! the ICRC covers the trailer). So [`crate::wire::parse_frame`]'s `payload` is data followed
//! by the trailer, tshark dissects the packet as RoCE v2 with a longer payload, and
//! [`placement::split`] / [`sack::split`] cut the trailer off the end. The emitting side
//! appends the trailer's bytes ([`placement::PlacementTrailer::to_bytes`]) to the data it hands
//! to [`crate::wire::emit_frame`].
//!
//! Like the rest of `wire`: parsing goes through `new_checked`, every malformed field is a
//! [`crate::wire::WireError`], nothing panics on bad input.

pub mod path_feedback;
pub mod placement;
pub mod sack;

pub use path_feedback::{Entropy, PathFeedback};
pub use placement::{PlacementFlags, PlacementTrailer, Ssn};
pub use sack::{SackBitmap, SackTrailer};

use super::bth;

/// The multipath bits of the BTH's `resv7` field (byte 8, bits 6:0, below AckReq).
///
/// IBA 9.2 transmits reserved fields as 0 and has receivers ignore them; rxe never reads them
/// (`rxe_hdr.h` has no accessor). Bit 0 ([`Self::OFFER`]) is set by a QP that allows the
/// extension, on every packet until the QP knows its peer's answer (docs/multipath.md,
/// "Agreeing on the extension"); bit 1 ([`Self::TRAILER`]) says the packet ends in a trailer
/// (placement on requests and READ responses, SACK on ACKs, path feedback in CNPs); bit 2
/// ([`Self::HOLD`]), with the extension on, says the sender's responder holds READ requests
/// and atomics until the cumulative PSN reaches them; bit 3 ([`Self::READ_PLACED`]), on a
/// held READ request, asks for the responses with placement trailers. The other three bits
/// stay 0 and are ignored on receive, as IBA wants of reserved bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct MpBthFlags(u8);

impl MpBthFlags {
    /// No multipath bits: plain RoCE v2.
    pub const NONE: Self = Self(0);
    /// The sender allows the extension.
    pub const OFFER: Self = Self(roce_common::multipath::RESV7_OFFER);
    /// The packet carries a multipath trailer.
    pub const TRAILER: Self = Self(roce_common::multipath::RESV7_TRAILER);
    /// Both: a packet with a trailer from a QP with the extension on.
    pub const OFFER_TRAILER: Self = Self(Self::OFFER.0 | Self::TRAILER.0);
    /// The sender's responder holds READ requests and atomics beyond a hole until the
    /// cumulative PSN reaches them (set with the extension on).
    pub const HOLD: Self = Self(roce_common::multipath::RESV7_HOLD);
    /// On a READ request marked [`Self::HOLD`]: the requester places the responses out of
    /// order, so they may carry placement trailers and be sprayed.
    pub const READ_PLACED: Self = Self(roce_common::multipath::RESV7_READ_PLACED);
    const KNOWN: u8 = 0x0f;

    /// The known bits of a `resv7` value; the others are reserved and ignored.
    #[must_use]
    pub const fn from_resv7(resv7: u8) -> Self {
        Self(resv7 & Self::KNOWN)
    }

    /// Reads the flags of a received BTH. Call it on every packet of a QP that allows the
    /// extension: `OFFER` from the peer QP turns the extension on; `TRAILER` says to split
    /// the trailer off the payload before placing it.
    #[must_use]
    pub fn parse<T: AsRef<[u8]>>(p: &bth::Packet<T>) -> Self {
        Self::from_resv7(p.resv7())
    }

    /// Writes the flags into a BTH being emitted (after `BthRepr::emit`, which writes the
    /// repr's `resv7`). A [`crate::wire::BthRepr`] carries them in its `resv7` field
    /// ([`Self::bits`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(self, p: &mut bth::Packet<T>) {
        p.set_resv7(self.0);
    }

    /// The raw bits.
    #[must_use]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every bit of `other` is set.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for MpBthFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BthRepr, Opcode, Psn, Qpn};

    #[test]
    fn bth_flags_live_below_ack_req_and_survive_bth_parse() {
        let mut b = [0u8; 12];
        let mut repr = BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(7));
        repr.ack_req = true;
        repr.emit(&mut bth::Packet::new_unchecked(&mut b[..]));
        (MpBthFlags::OFFER | MpBthFlags::TRAILER).emit(&mut bth::Packet::new_unchecked(&mut b[..]));
        assert_eq!(b[8], 0x83, "AckReq kept, bits 0 and 1 set");
        let p = bth::Packet::new_checked(&b[..]).unwrap();
        let f = MpBthFlags::parse(&p);
        assert!(f.contains(MpBthFlags::OFFER) && f.contains(MpBthFlags::TRAILER));
        // A plain RoCE parser sees the same BTH; only the reserved bits differ.
        let parsed = BthRepr::parse(&p).unwrap();
        assert_eq!(parsed.resv7, 0x03);
        assert_eq!(BthRepr { resv7: 0, ..parsed }, repr);
        // Reserved bits other than ours are ignored; HOLD is bit 2, READ_PLACED bit 3.
        assert_eq!(MpBthFlags::from_resv7(0x70), MpBthFlags::NONE);
        assert_eq!(MpBthFlags::from_resv7(0x74), MpBthFlags::HOLD);
        assert_eq!(
            MpBthFlags::from_resv7(0x7c),
            MpBthFlags::HOLD | MpBthFlags::READ_PLACED
        );
    }
}
