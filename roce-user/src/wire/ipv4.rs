//! IPv4 header (RFC 791) without options, as rxe sends it (rxe_net.c `prepare_ipv4_hdr`:
//! DF set, TOS from the traffic class, TTL from the hop limit).

use core::net::Ipv4Addr;

use roce_common::hdr::{IPPROTO_UDP, Ipv4Hdr};

use super::{Result, WireError, be16, fixed_view, put16};

mod field {
    use crate::wire::Field;
    pub(super) const VER_IHL: usize = 0;
    pub(super) const TOS: usize = 1;
    pub(super) const TOT_LEN: Field = 2..4;
    pub(super) const IDENT: Field = 4..6;
    pub(super) const FLAGS_FRAG: Field = 6..8;
    pub(super) const TTL: usize = 8;
    pub(super) const PROTOCOL: usize = 9;
    pub(super) const CHECKSUM: Field = 10..12;
    pub(super) const SRC: Field = 12..16;
    pub(super) const DST: Field = 16..20;
}

/// Offsets of the fields the ICRC masks: TOS (0xff), TTL (0xff), header checksum (0xffff).
pub const ICRC_MASKED: (usize, usize, usize) = (field::TOS, field::TTL, field::CHECKSUM.start);

fixed_view!(
    /// A view over the 20-byte IPv4 header.
    len = field::DST.end
);

const _: () = assert!(HEADER_LEN == Ipv4Hdr::LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// IP version (4 for a valid header).
    #[must_use]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }
    /// Header length in bytes.
    #[must_use]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }
    /// Type of service: DSCP (6 bits) and ECN (2 bits).
    #[must_use]
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }
    /// Total length.
    #[must_use]
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::TOT_LEN.start)
    }
    /// Identification.
    #[must_use]
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT.start)
    }
    /// Flags and fragment offset.
    #[must_use]
    pub fn flags_frag(&self) -> u16 {
        be16(self.buffer.as_ref(), field::FLAGS_FRAG.start)
    }
    /// Time to live.
    #[must_use]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    /// Protocol.
    #[must_use]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }
    /// Header checksum.
    #[must_use]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
    /// Source address.
    #[must_use]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
    /// Destination address.
    #[must_use]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
    /// Whether the header checksum of the 20-byte header is right.
    #[must_use]
    pub fn verify_checksum(&self) -> bool {
        if cfg!(fuzzing) {
            return true;
        }
        checksum(&self.buffer.as_ref()[..HEADER_LEN]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and a 20-byte header length.
    pub fn set_version_ihl(&mut self) {
        self.buffer.as_mut()[field::VER_IHL] = 0x45;
    }
    /// Sets the TOS byte.
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[field::TOS] = v;
    }
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::TOT_LEN.start, v);
    }
    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::IDENT.start, v);
    }
    /// Sets flags and fragment offset.
    pub fn set_flags_frag(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::FLAGS_FRAG.start, v);
    }
    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }
    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = v;
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }
    /// Sets the header checksum (see [`Self::fill_checksum`] to compute it).
    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }
    /// Computes and writes the header checksum over the 20-byte header.
    pub fn fill_checksum(&mut self) {
        put16(self.buffer.as_mut(), field::CHECKSUM.start, 0);
        let c = checksum(&self.buffer.as_ref()[..HEADER_LEN]);
        put16(self.buffer.as_mut(), field::CHECKSUM.start, c);
    }
}

/// The Internet checksum (RFC 1071) of `data`: the complement of the one's-complement sum.
#[must_use]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// Adds `data` as big-endian 16-bit words to a 32-bit accumulator (odd tail padded with 0).
#[must_use]
pub(crate) fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a one's-complement accumulator to 16 bits.
#[must_use]
pub(crate) fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// A parsed IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// TOS byte: DSCP << 2 | ECN.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Payload protocol.
    pub protocol: u8,
    /// Payload length (total length minus 20).
    pub payload_len: u16,
}

impl Ipv4Repr {
    /// Reads a header from the start of `buf` (the rest of the frame, Ethernet padding
    /// included). Checks version, a 20-byte header, the checksum, the total length against
    /// `buf`, and rejects fragments. Returns the repr; the IP payload is
    /// `buf[20..20 + payload_len]`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let p = Packet::new_checked(buf)?;
        if p.version() != 4 {
            return Err(WireError::Malformed("IPv4 version is not 4"));
        }
        if p.header_len() < HEADER_LEN {
            return Err(WireError::Malformed("IPv4 header length below 20"));
        }
        if p.header_len() != HEADER_LEN {
            return Err(WireError::Unsupported("IPv4 options"));
        }
        let total = usize::from(p.total_len());
        if total < HEADER_LEN {
            return Err(WireError::Malformed(
                "IPv4 total length below header length",
            ));
        }
        if total > buf.len() {
            return Err(WireError::Truncated);
        }
        if !p.verify_checksum() {
            return Err(WireError::Malformed("IPv4 header checksum"));
        }
        let ff = p.flags_frag();
        if ff & (Ipv4Hdr::MF | Ipv4Hdr::OFFSET_MASK) != 0 {
            return Err(WireError::Unsupported("IPv4 fragment"));
        }
        Ok(Self {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: ff & Ipv4Hdr::DF != 0,
            ttl: p.ttl(),
            protocol: p.protocol(),
            payload_len: (total - HEADER_LEN) as u16,
        })
    }

    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header with its checksum.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let total = usize::from(self.payload_len) + HEADER_LEN;
        let total = u16::try_from(total)
            .map_err(|_| WireError::InvalidRepr("IPv4 packet over 65535 bytes"))?;
        p.set_version_ihl();
        p.set_tos(self.tos);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_flags_frag(if self.dont_frag { Ipv4Hdr::DF } else { 0 });
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

/// The protocol number RoCE v2 needs.
pub const PROTOCOL_UDP: u8 = IPPROTO_UDP;

#[cfg(test)]
mod tests {
    use super::*;

    // The IPv4 header of the Mellanox CNP example.
    static HDR: [u8; 20] = [
        0x45, 0x89, 0x00, 0x3c, 0x98, 0xc6, 0x40, 0x00, 0x20, 0x11, 0x69, 0x27, 0x16, 0x16, 0x16,
        0x08, 0x16, 0x16, 0x16, 0x07,
    ];

    #[test]
    fn parse_and_emit_golden() {
        let mut buf = [0u8; 60];
        buf[..20].copy_from_slice(&HDR);
        let r = Ipv4Repr::parse(&buf).unwrap();
        assert_eq!(r.src_addr, Ipv4Addr::new(22, 22, 22, 8));
        assert_eq!(r.tos, 0x89);
        assert_eq!(r.payload_len, 40);
        assert!(r.dont_frag);
        let mut out = [0xa5u8; 20];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, HDR);
    }

    #[test]
    fn rejects_bad_headers() {
        let mut buf = [0u8; 60];
        buf[..20].copy_from_slice(&HDR);
        assert_eq!(Ipv4Repr::parse(&buf[..59]), Err(WireError::Truncated));
        let mut b = buf;
        b[11] ^= 1;
        assert!(matches!(Ipv4Repr::parse(&b), Err(WireError::Malformed(_))));
        let mut b = buf;
        b[0] = 0x46;
        assert!(matches!(
            Ipv4Repr::parse(&b),
            Err(WireError::Unsupported(_))
        ));
    }
}
