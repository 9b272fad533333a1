//! IPv6 fixed header (RFC 8200). rxe sends no extension headers; a packet with one is
//! reported as unsupported.

use core::net::Ipv6Addr;

use roce_common::hdr::Ipv6Hdr;

use super::{Result, WireError, be16, be32, fixed_view, put16, put32};

mod field {
    use crate::wire::Field;
    pub(super) const VTC_FLOW: Field = 0..4;
    pub(super) const PAYLOAD_LEN: Field = 4..6;
    pub(super) const NEXT_HDR: usize = 6;
    pub(super) const HOP_LIMIT: usize = 7;
    pub(super) const SRC: Field = 8..24;
    pub(super) const DST: Field = 24..40;
}

/// Offset of the hop limit, which the ICRC masks with 0xff.
pub const HOP_LIMIT_OFFSET: usize = field::HOP_LIMIT;

fixed_view!(
    /// A view over the 40-byte IPv6 header.
    len = field::DST.end
);

const _: () = assert!(HEADER_LEN == Ipv6Hdr::LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// IP version (6 for a valid header).
    #[must_use]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Traffic class: DSCP << 2 | ECN.
    #[must_use]
    pub fn traffic_class(&self) -> u8 {
        ((be32(self.buffer.as_ref(), field::VTC_FLOW.start) >> 20) & 0xff) as u8
    }
    /// Flow label (20 bits).
    #[must_use]
    pub fn flow_label(&self) -> u32 {
        be32(self.buffer.as_ref(), field::VTC_FLOW.start) & 0x000f_ffff
    }
    /// Payload length.
    #[must_use]
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN.start)
    }
    /// Next header.
    #[must_use]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HDR]
    }
    /// Hop limit.
    #[must_use]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Source address.
    #[must_use]
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    #[must_use]
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        Ipv6Addr::from(a)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label.
    pub fn set_vtc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let v = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000f_ffff);
        put32(self.buffer.as_mut(), field::VTC_FLOW.start, v);
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::PAYLOAD_LEN.start, v);
    }
    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NEXT_HDR] = v;
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }
}

/// A parsed IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Traffic class: DSCP << 2 | ECN.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: u16,
}

impl Ipv6Repr {
    /// Reads the header from the start of `buf` and checks the payload length against it.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let p = Packet::new_checked(buf)?;
        if p.version() != 6 {
            return Err(WireError::Malformed("IPv6 version is not 6"));
        }
        if usize::from(p.payload_len()) + HEADER_LEN > buf.len() {
            return Err(WireError::Truncated);
        }
        Ok(Self {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_vtc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(self.payload_len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = Ipv6Repr {
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "fe80::2".parse().unwrap(),
            traffic_class: 0x8a,
            flow_label: 0x1_2345,
            next_header: 17,
            hop_limit: 64,
            payload_len: 20,
        };
        let mut buf = [0xa5u8; 60];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..4], &[0x68, 0xa1, 0x23, 0x45]);
        assert_eq!(Ipv6Repr::parse(&buf).unwrap(), r);
        assert_eq!(Ipv6Repr::parse(&buf[..59]), Err(WireError::Truncated));
    }
}
