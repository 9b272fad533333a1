//! UDP header (RFC 768). RoCE v2 uses destination port 4791; rxe writes checksum 0 over IPv4.

use super::{Result, WireError, be16, fixed_view, put16};

mod field {
    use crate::wire::Field;
    pub(super) const SRC_PORT: Field = 0..2;
    pub(super) const DST_PORT: Field = 2..4;
    pub(super) const LENGTH: Field = 4..6;
    pub(super) const CHECKSUM: Field = 6..8;
}

/// Byte offset of the checksum, which the ICRC masks with 0xffff.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

fixed_view!(
    /// A view over a UDP header.
    len = field::CHECKSUM.end
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Source port.
    #[must_use]
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT.start)
    }
    /// Destination port.
    #[must_use]
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT.start)
    }
    /// Length, header included.
    #[must_use]
    pub fn length(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }
    /// Checksum (0: none).
    #[must_use]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::SRC_PORT.start, v);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::DST_PORT.start, v);
    }
    /// Sets the length.
    pub fn set_length(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::LENGTH.start, v);
    }
    /// Sets the checksum.
    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }
}

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Length, header included.
    pub length: u16,
    /// Checksum as received (not verified here: the ICRC covers the same bytes).
    pub checksum: u16,
}

impl UdpRepr {
    /// Reads the header and checks its length against the `available` bytes of the datagram.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, available: usize) -> Result<Self> {
        p.check_len()?;
        let length = p.length();
        if usize::from(length) < HEADER_LEN {
            return Err(WireError::Malformed("UDP length below 8"));
        }
        if usize::from(length) > available {
            return Err(WireError::Truncated);
        }
        Ok(Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            length,
            checksum: p.checksum(),
        })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_length(self.length);
        p.set_checksum(self.checksum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_length_checks() {
        let r = UdpRepr {
            src_port: 0xdbae,
            dst_port: 4791,
            length: 0x28,
            checksum: 0,
        };
        let mut out = [0xa5u8; 8];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0xdb, 0xae, 0x12, 0xb7, 0x00, 0x28, 0, 0]);
        let p = Packet::new_checked(&out[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p, 0x28).unwrap(), r);
        assert_eq!(UdpRepr::parse(&p, 0x27), Err(WireError::Truncated));
        out[5] = 7;
        assert!(UdpRepr::parse(&Packet::new_checked(&out[..]).unwrap(), 40).is_err());
    }
}
