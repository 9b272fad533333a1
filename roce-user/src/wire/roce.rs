//! The RoCE v2 packet from the BTH onward: BTH | extended headers | payload | pad | ICRC.
//! This is the UDP payload of a RoCE v2 datagram (IBA Annex A17.4).
//!
//! Which extended headers follow the BTH, in which order, and whether a payload follows comes
//! from the opcode table ([`roce_common::opcode::Opcode::info`], after rxe_opcode.c); offsets
//! come from [`Hdrs::offset_of`].

use roce_common::{
    hdr::ICRC_LEN,
    opcode::{Hdrs, OpcodeInfo},
};

use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpRepr, DethRepr, FethRepr, IethRepr,
    ImmDtRepr, Opcode, Result, RethRepr, WireError, aeth, atomic, bth, cnp, deth, feth, ieth,
    immdt, reth,
};

/// Pad bytes that align a payload of `payload_len` bytes to 4 (`(-len) & 3`, rxe_req.c).
#[must_use]
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// Where the `payload_len` payload bytes of an `opcode` packet lie in a frame whose BTH starts
/// at `bth_off` ([`super::PathRepr::bth_offset`]): after the BTH and the extended headers the
/// opcode carries (the opcode table, IBA 9.2 and Annex A17.4). Call it to gather a payload
/// into a frame buffer before its headers are written
/// ([`super::FrameTemplate::emit_around_payload`]). `None` for an unknown opcode, or if a
/// frame of `frame_len` bytes does not hold the payload with its pad and ICRC.
#[must_use]
pub fn payload_range(
    opcode: Opcode,
    bth_off: usize,
    payload_len: usize,
    frame_len: usize,
) -> Option<core::ops::Range<usize>> {
    let at = bth_off + bth::HEADER_LEN + opcode.ext_len()?;
    let end = at + payload_len;
    (end + pad_len(payload_len) + ICRC_LEN <= frame_len).then_some(at..end)
}

/// The slot of extended header `h` in `ext` (the bytes after the BTH), for the set `hdrs`.
/// `hdrs` was validated against the repr, so `h` is in it.
fn slot(ext: &mut [u8], hdrs: Hdrs, h: Hdrs) -> &mut [u8] {
    let off = hdrs.offset_of(h).unwrap_or(0);
    &mut ext[off..off + h.len()]
}

/// A view over a RoCE packet (BTH to ICRC inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after [`Self::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds a BTH with a known opcode, that opcode's extended
    /// headers, a payload only if the opcode carries one (or an ACK's multipath SACK
    /// trailer, [`RoceRepr::is_sack_ack`]), a pad count no larger than the
    /// payload and a payload-plus-pad length that is a multiple of 4, and the ICRC. After this returns
    /// `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        let bth = bth::Packet::new_checked(b)?;
        let info = bth
            .opcode()
            .info()
            .ok_or(WireError::UnknownOpcode(bth.opcode()))?;
        let fixed = bth::HEADER_LEN + info.ext_len() + ICRC_LEN;
        if b.len() < fixed {
            return Err(WireError::Truncated);
        }
        let rest = b.len() - fixed;
        let pad = usize::from(bth.pad_count());
        // The one exception: an ACK of the multipath extension carries its SACK trailer
        // (the TRAILER bit, exactly the trailer's bytes; RoceRepr::is_sack_ack).
        let sack_ack = bth.opcode() == Opcode::RC_ACKNOWLEDGE
            && super::multipath::MpBthFlags::from_resv7(bth.resv7())
                .contains(super::multipath::MpBthFlags::TRAILER)
            && rest == super::multipath::sack::HEADER_LEN;
        if !info.payload && rest != 0 && !sack_ack {
            return Err(WireError::Malformed(
                "payload on an opcode that carries none",
            ));
        }
        if pad > rest {
            return Err(WireError::Malformed("pad count larger than the payload"));
        }
        // IBA 9.2: the pad aligns the payload to 4 bytes; packets are whole 4-byte words.
        if !rest.is_multiple_of(4) {
            return Err(WireError::Malformed(
                "payload plus pad is not a multiple of 4 bytes",
            ));
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH view.
    #[must_use]
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }

    /// The opcode.
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }

    /// The opcode's table row. After `check_len` the opcode is known; an unchecked view of an
    /// unknown opcode answers `None`.
    #[must_use]
    pub fn info(&self) -> Option<OpcodeInfo> {
        self.opcode().info()
    }

    fn hdrs(&self) -> Hdrs {
        self.info().map_or(Hdrs::NONE, |i| i.hdrs)
    }

    /// The bytes of extended header `hdr`, if the opcode carries it.
    #[must_use]
    pub fn ext(&self, hdr: Hdrs) -> Option<&[u8]> {
        let hdrs = self.hdrs();
        let off = bth::HEADER_LEN + hdrs.offset_of(hdr)?;
        self.buffer.as_ref().get(off..off + hdr.len())
    }

    /// BTH plus extended headers, in bytes.
    #[must_use]
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.hdrs().len()
    }

    /// The payload without the pad bytes.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b
            .len()
            .saturating_sub(ICRC_LEN + usize::from(self.bth().pad_count()));
        b.get(self.header_len()..end).unwrap_or(&[])
    }

    /// The pad bytes between the payload and the ICRC.
    #[must_use]
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len().saturating_sub(ICRC_LEN);
        let start = end.saturating_sub(usize::from(self.bth().pad_count()));
        b.get(start..end).unwrap_or(&[])
    }

    /// The bytes the ICRC covers from the BTH on (everything but the ICRC).
    #[must_use]
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len().saturating_sub(ICRC_LEN)]
    }

    /// The ICRC as on the wire (stored little-endian: `u32::from_le_bytes` of the last four
    /// bytes, scapy `struct.pack("!I", icrc)[::-1]`).
    #[must_use]
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let s = b.len().saturating_sub(ICRC_LEN);
        match b.get(s..) {
            Some(&[a, b2, c, d]) => u32::from_le_bytes([a, b2, c, d]),
            _ => 0,
        }
    }
}

impl<'a> RocePacket<&'a [u8]> {
    /// The payload without the pad bytes, borrowed from the underlying buffer (so it
    /// outlives the view).
    #[must_use]
    pub fn into_payload(self) -> &'a [u8] {
        let b = self.buffer;
        let end = b
            .len()
            .saturating_sub(ICRC_LEN + usize::from(self.bth().pad_count()));
        b.get(self.header_len()..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RocePacket<T> {
    /// Writes the ICRC (little-endian) into the last four bytes.
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let s = b.len().saturating_sub(ICRC_LEN);
        if let Some(t) = b.get_mut(s..).filter(|t| t.len() == ICRC_LEN) {
            t.copy_from_slice(&icrc.to_le_bytes());
        }
    }
}

/// A parsed RoCE packet: the BTH and the extended headers its opcode carries. The payload is
/// not part of the repr; it is a slice of the packet ([`RocePacket::payload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr {
    /// The BTH.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// FETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (WRITE FIRST/ONLY, READ request, ATOMIC WRITE, FLUSH).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, ATOMIC ACK, READ response FIRST/LAST/ONLY).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (*_WITH_IMMEDIATE).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND *_WITH_INVALIDATE).
    pub ieth: Option<IethRepr>,
    /// CNP reserved block.
    pub cnp: Option<CnpRepr>,
}

impl RoceRepr {
    /// A repr with only a BTH: add the extended headers the opcode needs.
    #[must_use]
    pub const fn new(bth: BthRepr) -> Self {
        Self {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            cnp: None,
        }
    }

    /// A RoCE v2 CNP to `dest_qp` as scapy and the Mellanox example build it: opcode 0x81,
    /// BECN set, P_Key 0xffff, PSN 0, 16 zero bytes.
    #[must_use]
    pub fn cnp(dest_qp: super::Qpn) -> Self {
        let mut bth = BthRepr::new(Opcode::CNP, dest_qp, super::Psn::new(0));
        bth.becn = true;
        let mut r = Self::new(bth);
        r.cnp = Some(CnpRepr::default());
        r
    }

    /// An RC ACKNOWLEDGE (ACK or NAK, by `aeth.syndrome`) to `dest_qp` for `psn`.
    #[must_use]
    pub fn ack(dest_qp: super::Qpn, psn: super::Psn, aeth: AethRepr) -> Self {
        let mut r = Self::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qp, psn));
        r.aeth = Some(aeth);
        r
    }

    /// The set of extended headers present in this repr.
    #[must_use]
    pub fn hdrs(&self) -> Hdrs {
        let mut h = Hdrs::NONE;
        let present = [
            (self.deth.is_some(), Hdrs::DETH),
            (self.feth.is_some(), Hdrs::FETH),
            (self.reth.is_some(), Hdrs::RETH),
            (self.atomic_eth.is_some(), Hdrs::ATOMIC_ETH),
            (self.aeth.is_some(), Hdrs::AETH),
            (self.atomic_ack_eth.is_some(), Hdrs::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), Hdrs::IMMDT),
            (self.ieth.is_some(), Hdrs::IETH),
            (self.cnp.is_some(), Hdrs::CNP),
        ];
        for (p, hdr) in present {
            if p {
                h = h.with(hdr);
            }
        }
        h
    }

    /// Reads the BTH and the extended headers from a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &RocePacket<T>) -> Result<Self> {
        p.check_len()?;
        let bth = BthRepr::parse(&p.bth())?;
        let mut r = Self::new(bth);
        let ext = |h: Hdrs| p.ext(h).ok_or(WireError::Truncated);
        let hdrs = p.hdrs();
        if hdrs.contains(Hdrs::DETH) {
            r.deth = Some(DethRepr::parse(&deth::Packet::new_checked(ext(
                Hdrs::DETH,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::FETH) {
            r.feth = Some(FethRepr::parse(&feth::Packet::new_checked(ext(
                Hdrs::FETH,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::RETH) {
            r.reth = Some(RethRepr::parse(&reth::Packet::new_checked(ext(
                Hdrs::RETH,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::ATOMIC_ETH) {
            r.atomic_eth = Some(AtomicEthRepr::parse(&atomic::eth::Packet::new_checked(
                ext(Hdrs::ATOMIC_ETH)?,
            )?)?);
        }
        if hdrs.contains(Hdrs::AETH) {
            r.aeth = Some(AethRepr::parse(&aeth::Packet::new_checked(ext(
                Hdrs::AETH,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::ATOMIC_ACK_ETH) {
            r.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&atomic::ack::Packet::new_checked(
                ext(Hdrs::ATOMIC_ACK_ETH)?,
            )?)?);
        }
        if hdrs.contains(Hdrs::IMMDT) {
            r.immdt = Some(ImmDtRepr::parse(&immdt::Packet::new_checked(ext(
                Hdrs::IMMDT,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::IETH) {
            r.ieth = Some(IethRepr::parse(&ieth::Packet::new_checked(ext(
                Hdrs::IETH,
            )?)?)?);
        }
        if hdrs.contains(Hdrs::CNP) {
            r.cnp = Some(CnpRepr::parse(&cnp::Packet::new_checked(ext(Hdrs::CNP)?)?)?);
        }
        Ok(r)
    }

    /// Checks the repr against the opcode table: the opcode is known, exactly its extended
    /// headers are present, and a payload only where the opcode carries one.
    pub fn validate(&self, payload_len: usize) -> Result<OpcodeInfo> {
        let info = self
            .bth
            .opcode
            .info()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode))?;
        if self.hdrs() != info.hdrs {
            return Err(WireError::InvalidRepr(
                "extended headers do not match the opcode",
            ));
        }
        if !info.payload && payload_len != 0 && !self.is_sack_ack(payload_len) {
            return Err(WireError::InvalidRepr(
                "payload on an opcode that carries none",
            ));
        }
        Ok(info)
    }

    /// Whether this is an ACKNOWLEDGE of the multipath extension whose payload is exactly its
    /// SACK trailer (docs/multipath.md, "The wire format of the extension"): the BTH's
    /// `TRAILER` bit set and `payload_len` equal to [`super::multipath::sack::HEADER_LEN`].
    /// The one payload [`Self::validate`] lets through on an opcode that carries none; every
    /// other packet keeps the opcode table's rule (IBA 9.2).
    #[must_use]
    pub fn is_sack_ack(&self, payload_len: usize) -> bool {
        self.bth.opcode == Opcode::RC_ACKNOWLEDGE
            && super::multipath::MpBthFlags::from_resv7(self.bth.resv7)
                .contains(super::multipath::MpBthFlags::TRAILER)
            && payload_len == super::multipath::sack::HEADER_LEN
    }

    /// BTH plus extended headers, in bytes.
    #[must_use]
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.hdrs().len()
    }

    /// Bytes [`Self::emit`] writes for a payload of `payload_len`: headers, payload, pad, ICRC.
    #[must_use]
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_len(payload_len) + ICRC_LEN
    }

    /// Writes headers, `payload`, zero pad and a zero ICRC placeholder into the start of
    /// `buf`, with the BTH pad count derived from the payload length. Returns the length
    /// written ([`Self::buffer_len`]). The ICRC needs the IP and UDP headers: the frame layer
    /// ([`super::emit_frame`]) or [`super::icrc`] fills it.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let info = self.validate(payload.len())?;
        let hl = bth::HEADER_LEN + info.ext_len();
        let len = hl + payload.len() + pad_len(payload.len()) + ICRC_LEN;
        let have = buf.len();
        let buf = buf
            .get_mut(..len)
            .ok_or(WireError::BufferTooSmall { needed: len, have })?;
        buf[hl..hl + payload.len()].copy_from_slice(payload);
        self.emit_headers(info.hdrs, buf, hl + payload.len());
        Ok(len)
    }

    /// Writes the BTH (pad count from the payload's length), the extended headers `hdrs`
    /// (validated against the repr) and, after the payload, which ends at `payload_end`, the
    /// zero pad and ICRC placeholder; the payload bytes are left alone. `buf` is exactly the
    /// packet's length ([`Self::buffer_len`]). Call it after [`Self::validate`], which gave
    /// `hdrs`.
    pub(super) fn emit_headers(&self, hdrs: Hdrs, buf: &mut [u8], payload_end: usize) {
        let mut bth = self.bth;
        bth.pad_count = (buf.len() - payload_end - ICRC_LEN) as u8;
        bth.emit(&mut bth::Packet::new_unchecked(&mut buf[..bth::HEADER_LEN]));
        let ext = &mut buf[bth::HEADER_LEN..];
        if let Some(h) = &self.deth {
            h.emit(&mut deth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::DETH,
            )));
        }
        if let Some(h) = &self.feth {
            h.emit(&mut feth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::FETH,
            )));
        }
        if let Some(h) = &self.reth {
            h.emit(&mut reth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::RETH,
            )));
        }
        if let Some(h) = &self.atomic_eth {
            h.emit(&mut atomic::eth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::ATOMIC_ETH,
            )));
        }
        if let Some(h) = &self.aeth {
            h.emit(&mut aeth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::AETH,
            )));
        }
        if let Some(h) = &self.atomic_ack_eth {
            h.emit(&mut atomic::ack::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::ATOMIC_ACK_ETH,
            )));
        }
        if let Some(h) = &self.immdt {
            h.emit(&mut immdt::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::IMMDT,
            )));
        }
        if let Some(h) = &self.ieth {
            h.emit(&mut ieth::Packet::new_unchecked(slot(
                ext,
                hdrs,
                Hdrs::IETH,
            )));
        }
        if let Some(h) = &self.cnp {
            h.emit(&mut cnp::Packet::new_unchecked(slot(ext, hdrs, Hdrs::CNP)));
        }
        buf[payload_end..].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AethSyndrome, Msn, NakCode, Psn, Qpn, RKey};

    #[test]
    fn write_only_imm_round_trip() {
        let mut r = RoceRepr::new(BthRepr::new(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            Qpn::new(0x11),
            Psn::new(7),
        ));
        r.reth = Some(RethRepr {
            va: 0x1000,
            rkey: RKey::new(0x55),
            dma_len: 5,
        });
        r.immdt = Some(ImmDtRepr { imm: 0xdead_beef });
        let mut buf = [0xa5u8; 64];
        let n = r.emit(&mut buf, b"hello").unwrap();
        assert_eq!(n, 12 + 16 + 4 + 5 + 3 + 4);
        assert_eq!(buf[1] & 0x30, 0x30, "pad count 3");
        let p = RocePacket::new_checked(&buf[..n]).unwrap();
        assert_eq!(p.payload(), b"hello");
        assert_eq!(p.pad(), &[0, 0, 0]);
        let mut parsed = RoceRepr::parse(&p).unwrap();
        assert_eq!(parsed.bth.pad_count, 3);
        parsed.bth.pad_count = 0;
        assert_eq!(parsed, r);
        assert_eq!(&buf[28..32], &[0xde, 0xad, 0xbe, 0xef]);
    }

    #[test]
    fn validate_against_table() {
        let mut r = RoceRepr::new(BthRepr::new(
            Opcode::RC_ACKNOWLEDGE,
            Qpn::new(1),
            Psn::new(0),
        ));
        let mut buf = [0u8; 64];
        assert!(matches!(
            r.emit(&mut buf, &[]),
            Err(WireError::InvalidRepr(_))
        ));
        r.aeth = Some(AethRepr {
            syndrome: AethSyndrome::Nak(NakCode::InvalidRequest),
            msn: Msn::new(3),
        });
        assert!(matches!(
            r.emit(&mut buf, b"x"),
            Err(WireError::InvalidRepr(_))
        ));
        assert_eq!(r.emit(&mut buf, &[]).unwrap(), 20);
        assert_eq!(
            r.emit(&mut buf[..19], &[]),
            Err(WireError::BufferTooSmall {
                needed: 20,
                have: 19
            })
        );
        let u = RoceRepr::new(BthRepr::new(Opcode(0x15), Qpn::new(1), Psn::new(0)));
        assert_eq!(
            u.emit(&mut buf, &[]),
            Err(WireError::UnknownOpcode(Opcode(0x15)))
        );
    }

    /// An ACK may carry a payload only as the multipath SACK trailer: the `TRAILER` bit set
    /// and exactly 12 bytes. Without the bit, with another length, or on another opcode
    /// without payload (a READ request), the opcode table's rule stands.
    #[test]
    fn only_a_sack_trailer_rides_on_an_ack() {
        use crate::wire::multipath::MpBthFlags;
        let mut ack = RoceRepr::ack(
            Qpn::new(1),
            Psn::new(5),
            AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: Msn::new(0),
            },
        );
        let bad = |r: &RoceRepr, n| matches!(r.validate(n), Err(WireError::InvalidRepr(_)));
        assert!(bad(&ack, 12), "no bit, no payload");
        ack.bth.resv7 = MpBthFlags::OFFER.bits();
        assert!(bad(&ack, 12), "the offer alone is not a trailer");
        ack.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
        assert!(ack.validate(12).is_ok());
        assert!(ack.validate(0).is_ok());
        assert!(bad(&ack, 11) && bad(&ack, 13) && bad(&ack, 24));
        let mut buf = [0u8; 64];
        assert_eq!(ack.emit(&mut buf, &[0xab; 12]), Ok(12 + 4 + 12 + 4));
        assert!(
            RocePacket::new_checked(&buf[..32]).is_ok(),
            "the parser agrees"
        );
        buf[8] &= !MpBthFlags::TRAILER.bits();
        assert!(
            RocePacket::new_checked(&buf[..32]).is_err(),
            "not without the bit"
        );
        let mut rd = with_reth_read();
        rd.bth.resv7 = MpBthFlags::OFFER_TRAILER.bits();
        assert!(bad(&rd, 12), "only the ACK");
    }

    fn with_reth_read() -> RoceRepr {
        let mut r = RoceRepr::new(BthRepr::new(
            Opcode::RC_RDMA_READ_REQUEST,
            Qpn::new(1),
            Psn::new(0),
        ));
        r.reth = Some(RethRepr {
            va: 0,
            rkey: RKey::new(1),
            dma_len: 8,
        });
        r
    }

    #[test]
    fn check_len_rejects() {
        let r = RoceRepr::cnp(Qpn::new(0xd2));
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, &[]).unwrap();
        assert_eq!(n, 32);
        assert!(RocePacket::new_checked(&buf[..n]).is_ok());
        assert_eq!(
            RocePacket::new_checked(&buf[..n - 1]).unwrap_err(),
            WireError::Truncated
        );
        assert!(matches!(
            RocePacket::new_checked(&buf[..n + 4]),
            Err(WireError::Malformed(_))
        ));
        buf[0] = 0x40;
        let e = RocePacket::new_checked(&buf[..n]).unwrap_err();
        assert_eq!(e, WireError::UnknownOpcode(Opcode(0x40)));
        assert_eq!(
            std::format!("{e}"),
            "unknown BTH opcode UNKNOWN_OPCODE(0x40)"
        );
        let mut s = [0u8; 16];
        s[0] = Opcode::RC_SEND_ONLY.0;
        s[1] = 0x10; // pad 1, no payload
        assert!(matches!(
            RocePacket::new_checked(&s[..]),
            Err(WireError::Malformed(_))
        ));
    }
}
