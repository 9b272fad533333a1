//! The placement trailer (docs/multipath.md, "The wire format of the extension"): 28 bytes at
//! the end of the payload of every request packet and READ response packet of a QP with the
//! extension on, so the receiver can place the packet without having seen the message's
//! first packet.
//!
//! Layout (big-endian, like every IBA header):
//!
//! | bytes  | field                                                                    |
//! |--------|--------------------------------------------------------------------------|
//! | 0..3   | first PSN of the message (24 bits)                                       |
//! | 3      | flags: 0x01 SEND (data goes to a receive WQE), 0x02 READ response; others 0 |
//! | 4..8   | byte offset of this packet's data in the message                         |
//! | 8..12  | length of the whole message                                              |
//! | 12..20 | virtual address of the message (RETH VA; a READ response: its READ request's; 0 for SEND) |
//! | 20..24 | R_Key of the message (0 for SEND and READ responses)                     |
//! | 24..28 | send sequence number: how many SENDs of this QP came before the message  |
//!
//! (The design's first draft said 24 bytes; its fields add up to 28, a multiple of 4, so the
//! trailer does not change the pad.)

use crate::wire::{
    Psn, RKey, Result, WireError, be24, be32, be64, fixed_view, put24, put32, put64,
};

mod field {
    use crate::wire::Field;
    pub(super) const FIRST_PSN: Field = 0..3;
    pub(super) const FLAGS: usize = 3;
    pub(super) const OFFSET: Field = 4..8;
    pub(super) const LENGTH: Field = 8..12;
    pub(super) const VA: Field = 12..20;
    pub(super) const RKEY: Field = 20..24;
    pub(super) const SSN: Field = 24..28;
}

fixed_view!(
    /// A view over a placement trailer.
    len = field::SSN.end
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The message's first PSN.
    #[must_use]
    pub fn first_psn(&self) -> Psn {
        Psn::new(be24(self.buffer.as_ref(), field::FIRST_PSN.start))
    }
    /// The raw flags byte.
    #[must_use]
    pub fn flags_byte(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// The packet's byte offset in its message.
    #[must_use]
    pub fn offset(&self) -> u32 {
        be32(self.buffer.as_ref(), field::OFFSET.start)
    }
    /// The message's length.
    #[must_use]
    pub fn length(&self) -> u32 {
        be32(self.buffer.as_ref(), field::LENGTH.start)
    }
    /// The message's virtual address.
    #[must_use]
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), field::VA.start)
    }
    /// The message's R_Key.
    #[must_use]
    pub fn rkey(&self) -> RKey {
        RKey::new(be32(self.buffer.as_ref(), field::RKEY.start))
    }
    /// The message's send sequence number.
    #[must_use]
    pub fn ssn(&self) -> Ssn {
        Ssn(be32(self.buffer.as_ref(), field::SSN.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the first PSN.
    pub fn set_first_psn(&mut self, v: Psn) {
        put24(self.buffer.as_mut(), field::FIRST_PSN.start, v.value());
    }
    /// Sets the flags byte.
    pub fn set_flags(&mut self, v: PlacementFlags) {
        self.buffer.as_mut()[field::FLAGS] = v.0;
    }
    /// Sets the offset.
    pub fn set_offset(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::OFFSET.start, v);
    }
    /// Sets the length.
    pub fn set_length(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::LENGTH.start, v);
    }
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::VA.start, v);
    }
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: RKey) {
        put32(self.buffer.as_mut(), field::RKEY.start, v.value());
    }
    /// Sets the send sequence number.
    pub fn set_ssn(&mut self, v: Ssn) {
        put32(self.buffer.as_mut(), field::SSN.start, v.0);
    }
}

/// The flags of a placement trailer: what kind of message the packet belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct PlacementFlags(u8);

impl PlacementFlags {
    /// A WRITE request: data goes to `va + offset` under `rkey`.
    pub const WRITE: Self = Self(0);
    /// A SEND request: data goes to the receive WQE named by the SSN, at `offset`.
    pub const SEND: Self = Self(0x01);
    /// A READ response: data goes to the requester's buffer for the READ, at the offset of
    /// its PSN (`va` is the READ request's remote address, checked by the requester).
    pub const READ_RESPONSE: Self = Self(0x02);

    /// The flags from a byte: `None` if a reserved bit is set or both kinds are.
    #[must_use]
    pub const fn from_byte(b: u8) -> Option<Self> {
        match b {
            0..=2 => Some(Self(b)),
            _ => None,
        }
    }

    /// The byte.
    #[must_use]
    pub const fn byte(self) -> u8 {
        self.0
    }
}

/// A send sequence number: how many SENDs the QP sent before this message (so the receiver
/// knows which receive WQE a SEND packet belongs to: WQE = SSN − SENDs completed). Wraps
/// modulo 2^32.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, PartialOrd, Ord)]
pub struct Ssn(u32);

impl Ssn {
    /// An SSN.
    #[must_use]
    pub const fn new(v: u32) -> Self {
        Self(v)
    }
    /// The value.
    #[must_use]
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^32.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n))
    }
}

/// A parsed placement trailer. Built by the requester for each packet of a message it sends
/// (or by the responder for each READ response packet); parsed by the receiver before it
/// places the packet's data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PlacementTrailer {
    /// The message's first PSN.
    pub first_psn: Psn,
    /// The kind of message.
    pub flags: PlacementFlags,
    /// This packet's byte offset in the message.
    pub offset: u32,
    /// The whole message's length.
    pub length: u32,
    /// The message's virtual address (0 for SEND).
    pub va: u64,
    /// The message's R_Key (0 for SEND and READ responses).
    pub rkey: RKey,
    /// The message's send sequence number.
    pub ssn: Ssn,
}

impl PlacementTrailer {
    /// Reads a trailer and checks what can be checked without the packet: flags known, VA
    /// and R_Key zero on a SEND, R_Key zero on a READ response, offset inside the message (a
    /// zero-length message has one packet, at offset 0).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if shorter than [`HEADER_LEN`], [`WireError::Malformed`] for
    /// a field the format forbids.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        let flags = PlacementFlags::from_byte(p.flags_byte()).ok_or(WireError::Malformed(
            "placement trailer: reserved flag bits set",
        ))?;
        let t = Self {
            first_psn: p.first_psn(),
            flags,
            offset: p.offset(),
            length: p.length(),
            va: p.va(),
            rkey: p.rkey(),
            ssn: p.ssn(),
        };
        if flags == PlacementFlags::SEND && (t.va != 0 || t.rkey.value() != 0) {
            return Err(WireError::Malformed(
                "placement trailer: SEND with a virtual address or R_Key",
            ));
        }
        if flags == PlacementFlags::READ_RESPONSE && t.rkey.value() != 0 {
            return Err(WireError::Malformed(
                "placement trailer: READ response with an R_Key",
            ));
        }
        if t.offset >= t.length && !(t.offset == 0 && t.length == 0) {
            return Err(WireError::Malformed(
                "placement trailer: offset beyond the message",
            ));
        }
        Ok(t)
    }

    /// Checks the trailer against the packet that carries it, before placing: the packet's
    /// PSN is `first_psn + offset / pmtu` (every packet but the last carries exactly `pmtu`
    /// bytes, IBA 9.7.1 / rxe `check_length`), its data ends inside the message, and only the
    /// message's last packet is short. Call it on every packet with a trailer, after
    /// [`Self::parse`]; a packet that fails is dropped and counted, never placed.
    ///
    /// # Errors
    /// [`WireError::Malformed`] naming the inconsistency.
    pub fn check_packet(&self, psn: Psn, data_len: usize, pmtu: u32) -> Result<()> {
        let pmtu = pmtu.max(1);
        if !self.offset.is_multiple_of(pmtu) {
            return Err(WireError::Malformed(
                "placement trailer: offset not a multiple of the path MTU",
            ));
        }
        let index = psn.distance(self.first_psn);
        if index < 0 || index as u32 != self.offset / pmtu {
            return Err(WireError::Malformed(
                "placement trailer: PSN does not match the offset",
            ));
        }
        let end = u64::from(self.offset) + data_len as u64;
        let last = end == u64::from(self.length);
        if end > u64::from(self.length) || data_len as u64 > u64::from(pmtu) {
            return Err(WireError::Malformed(
                "placement trailer: data beyond the message or the path MTU",
            ));
        }
        if !last && data_len as u64 != u64::from(pmtu) {
            return Err(WireError::Malformed(
                "placement trailer: a short packet that is not the message's last",
            ));
        }
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the trailer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_first_psn(self.first_psn);
        p.set_flags(self.flags);
        p.set_offset(self.offset);
        p.set_length(self.length);
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_ssn(self.ssn);
    }

    /// The trailer's bytes, to append to a packet's data before `emit_frame`.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut Packet::new_unchecked(&mut b[..]));
        b
    }
}

/// Splits a received payload (as [`crate::wire::parse_frame`] returns it, pad removed) into
/// the data and the placement trailer at its end. Call it when the BTH carries
/// [`super::MpBthFlags::TRAILER`] on a request or READ response packet.
///
/// # Errors
/// [`WireError::Truncated`] if the payload is shorter than a trailer; any error of
/// [`PlacementTrailer::parse`].
pub fn split(payload: &[u8]) -> Result<(&[u8], PlacementTrailer)> {
    let at = payload
        .len()
        .checked_sub(HEADER_LEN)
        .ok_or(WireError::Truncated)?;
    let (data, trailer) = payload.split_at(at);
    Ok((
        data,
        PlacementTrailer::parse(&Packet::new_checked(trailer)?)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> PlacementTrailer {
        PlacementTrailer {
            first_psn: Psn::new(0xff_fffe),
            flags: PlacementFlags::WRITE,
            offset: 2048,
            length: 5000,
            va: 0x1122_3344_5566_7788,
            rkey: RKey::new(0xaabb_ccdd),
            ssn: Ssn::new(9),
        }
    }

    #[test]
    fn layout_is_big_endian_and_fixed() {
        let b = sample().to_bytes();
        assert_eq!(
            b,
            [
                0xff, 0xff, 0xfe, 0, 0, 0, 8, 0, 0, 0, 0x13, 0x88, 0x11, 0x22, 0x33, 0x44, 0x55,
                0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 9
            ]
        );
        assert_eq!(HEADER_LEN % 4, 0, "the trailer keeps the pad unchanged");
    }

    #[test]
    fn malformed_trailers_are_errors() {
        let mut b = sample().to_bytes();
        assert_eq!(split(&b[..27]), Err(WireError::Truncated));
        assert_eq!(split(&[]), Err(WireError::Truncated));
        b[3] = 0x04;
        assert!(matches!(split(&b), Err(WireError::Malformed(_))));
        b[3] = 0x03;
        assert!(matches!(split(&b), Err(WireError::Malformed(_))));
        // SEND with a VA.
        b[3] = 0x01;
        assert!(matches!(split(&b), Err(WireError::Malformed(_))));
        // READ response with an R_Key.
        b[3] = 0x02;
        assert!(matches!(split(&b), Err(WireError::Malformed(_))));
        // Offset at or beyond the length.
        let mut t = sample();
        t.offset = 5000;
        assert!(matches!(split(&t.to_bytes()), Err(WireError::Malformed(_))));
        t.offset = 0;
        t.length = 0;
        assert!(split(&t.to_bytes()).is_ok(), "a zero-length message");
    }

    #[test]
    fn check_packet_matches_psn_offset_and_length() {
        let t = sample(); // offset 2048 of 5000, first PSN 0xfffffe, pmtu 1024: PSN 0x000000
        assert_eq!(t.check_packet(Psn::new(0), 1024, 1024), Ok(()));
        assert!(
            t.check_packet(Psn::new(1), 1024, 1024).is_err(),
            "wrong PSN"
        );
        assert!(
            t.check_packet(Psn::new(0), 1000, 1024).is_err(),
            "short, not last"
        );
        assert!(
            t.check_packet(Psn::new(0), 2048, 1024).is_err(),
            "above the MTU"
        );
        let mut last = t;
        last.offset = 4096;
        assert_eq!(last.check_packet(Psn::new(2), 904, 1024), Ok(()));
        assert!(
            last.check_packet(Psn::new(2), 905, 1024).is_err(),
            "past the end"
        );
        let mut odd = t;
        odd.offset = 100;
        assert!(odd.check_packet(Psn::new(0), 1024, 1024).is_err());
        // A PSN before the first PSN.
        let mut first = t;
        first.offset = 0;
        assert!(first.check_packet(Psn::new(0xff_fffd), 1024, 1024).is_err());
    }

    fn arb_trailer() -> impl Strategy<Value = PlacementTrailer> {
        (
            any::<u32>(),
            0u8..3,
            1u32..,
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(|(psn, flags, length, off, va, rkey, ssn)| {
                let flags = PlacementFlags::from_byte(flags).unwrap();
                let send = flags == PlacementFlags::SEND;
                PlacementTrailer {
                    first_psn: Psn::new(psn),
                    flags,
                    offset: off % length,
                    length,
                    va: if send { 0 } else { va },
                    rkey: RKey::new(if flags == PlacementFlags::WRITE {
                        rkey
                    } else {
                        0
                    }),
                    ssn: Ssn::new(ssn),
                }
            })
    }

    proptest! {
        /// Every valid trailer survives emit then split, with the data in front intact.
        #[test]
        fn round_trip(t in arb_trailer(), data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut payload = data.clone();
            payload.extend_from_slice(&t.to_bytes());
            let (d, got) = split(&payload).unwrap();
            prop_assert_eq!(d, &data[..]);
            prop_assert_eq!(got, t);
        }

        /// Arbitrary bytes never panic the parser, and what parses re-emits to the same bytes.
        #[test]
        fn arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok((d, t)) = split(&b) {
                prop_assert_eq!(&t.to_bytes()[..], &b[d.len()..]);
                let _ = t.check_packet(Psn::new(3), d.len(), 1024);
            }
        }
    }
}
