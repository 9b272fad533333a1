//! Ethernet II header with up to two VLAN tags (802.1ad outer, 802.1Q inner), as the XDP
//! program looks through them (`roce_common::hdr::MAX_VLAN_TAGS`).

use core::fmt;

use roce_common::hdr::{ETH_P_8021AD, ETH_P_8021Q, MAX_VLAN_TAGS};

use super::{Result, WireError, be16, fixed_view, put16};

/// A MAC address.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);

    /// Whether the group bit is set.
    #[must_use]
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

mod field {
    use crate::wire::Field;
    pub(super) const DST: Field = 0..6;
    pub(super) const SRC: Field = 6..12;
    pub(super) const ETHERTYPE: Field = 12..14;
}

fixed_view!(
    /// A view over the 14-byte Ethernet II header (the EtherType is the first tag's TPID when
    /// the frame is tagged).
    len = field::ETHERTYPE.end
);

/// Length of one VLAN tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;

impl<T: AsRef<[u8]>> Packet<T> {
    /// Destination MAC.
    #[must_use]
    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        EthernetAddress(a)
    }
    /// Source MAC.
    #[must_use]
    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        EthernetAddress(a)
    }
    /// EtherType or first TPID.
    #[must_use]
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ETHERTYPE.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the destination MAC.
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.0);
    }
    /// Sets the source MAC.
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.0);
    }
    /// Sets the EtherType or first TPID.
    pub fn set_ethertype(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::ETHERTYPE.start, v);
    }
}

/// One VLAN tag: its TPID (0x8100 or 0x88a8) and TCI (PCP 3 bits, DEI 1, VID 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct VlanTag {
    /// Tag protocol identifier.
    pub tpid: u16,
    /// Tag control information.
    pub tci: u16,
}

impl VlanTag {
    /// An 802.1Q tag with `pcp` (priority, 0..=7) and `vid` (0..=4095).
    #[must_use]
    pub const fn dot1q(pcp: u8, vid: u16) -> Self {
        Self {
            tpid: ETH_P_8021Q,
            tci: ((pcp as u16 & 7) << 13) | (vid & 0x0fff),
        }
    }
    /// Priority code point.
    #[must_use]
    pub const fn pcp(&self) -> u8 {
        (self.tci >> 13) as u8
    }
    /// Drop eligible indicator.
    #[must_use]
    pub const fn dei(&self) -> bool {
        self.tci & 0x1000 != 0
    }
    /// VLAN identifier.
    #[must_use]
    pub const fn vid(&self) -> u16 {
        self.tci & 0x0fff
    }
}

const fn is_vlan_tpid(t: u16) -> bool {
    t == ETH_P_8021Q || t == ETH_P_8021AD
}

/// An Ethernet header with its VLAN tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst_addr: EthernetAddress,
    /// Source MAC.
    pub src_addr: EthernetAddress,
    /// VLAN tags, outermost first; `[None, Some(_)]` is invalid.
    pub vlan: [Option<VlanTag>; MAX_VLAN_TAGS],
    /// The EtherType after the tags.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header and its tags from the start of a frame. Returns the repr and the
    /// header length (14 + 4 per tag). More than two tags is [`WireError::Unsupported`].
    pub fn parse(frame: &[u8]) -> Result<(Self, usize)> {
        let p = Packet::new_checked(frame)?;
        let mut off = HEADER_LEN;
        let mut ethertype = p.ethertype();
        let mut vlan = [None; MAX_VLAN_TAGS];
        let mut n = 0;
        while is_vlan_tpid(ethertype) {
            if n == MAX_VLAN_TAGS {
                return Err(WireError::Unsupported("more than two VLAN tags"));
            }
            let tag = frame
                .get(off..off + VLAN_TAG_LEN)
                .ok_or(WireError::Truncated)?;
            vlan[n] = Some(VlanTag {
                tpid: ethertype,
                tci: be16(tag, 0),
            });
            ethertype = be16(tag, 2);
            off += VLAN_TAG_LEN;
            n += 1;
        }
        Ok((
            Self {
                dst_addr: p.dst_addr(),
                src_addr: p.src_addr(),
                vlan,
                ethertype,
            },
            off,
        ))
    }

    /// Header length with tags.
    #[must_use]
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + VLAN_TAG_LEN * self.vlan.iter().flatten().count()
    }

    /// Writes the header and tags into `buf` and returns the length written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if self.vlan[0].is_none() && self.vlan[1].is_some() {
            return Err(WireError::InvalidRepr(
                "inner VLAN tag without an outer one",
            ));
        }
        let len = self.buffer_len();
        let have = buf.len();
        let buf = buf
            .get_mut(..len)
            .ok_or(WireError::BufferTooSmall { needed: len, have })?;
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_dst_addr(self.dst_addr);
        p.set_src_addr(self.src_addr);
        let mut type_off = field::ETHERTYPE.start;
        let mut off = HEADER_LEN;
        for tag in self.vlan.iter().flatten() {
            put16(buf, type_off, tag.tpid);
            put16(buf, off, tag.tci);
            type_off = off + 2;
            off += VLAN_TAG_LEN;
        }
        put16(buf, type_off, self.ethertype);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tags_round_trip() {
        let r = EthernetRepr {
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: [
                Some(VlanTag {
                    tpid: ETH_P_8021AD,
                    tci: 0x0064,
                }),
                Some(VlanTag::dot1q(3, 10)),
            ],
            ethertype: 0x0800,
        };
        let mut buf = [0xa5u8; 22];
        assert_eq!(r.emit(&mut buf).unwrap(), 22);
        assert_eq!(
            &buf[12..22],
            &[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x60, 0x0a, 0x08, 0x00]
        );
        assert_eq!(EthernetRepr::parse(&buf).unwrap(), (r, 22));
        assert_eq!(r.vlan[1].unwrap().pcp(), 3);
        assert_eq!(r.vlan[1].unwrap().vid(), 10);
    }

    #[test]
    fn rejects_three_tags_and_truncation() {
        let mut buf = [0u8; 30];
        for off in [12, 16, 20] {
            buf[off..off + 2].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
        }
        assert!(matches!(
            EthernetRepr::parse(&buf),
            Err(WireError::Unsupported(_))
        ));
        assert_eq!(EthernetRepr::parse(&buf[..15]), Err(WireError::Truncated));
        assert_eq!(EthernetRepr::parse(&buf[..13]), Err(WireError::Truncated));
    }
}
