//! What RDMA CM adds to the IB CM for IP addressing: service IDs built from a port space and a
//! port, and the IP header at the start of a REQ's (and SIDR_REQ's) private data
//! (drivers/infiniband/core/cma.c `struct cma_hdr`, `rdma_get_service_id`,
//! `cma_format_hdr`; IBTA vol 1 Annex A11 "RDMA IP CM Service" describes the same header).
//!
//! Call [`ServiceId::rdma_cm`] to make the service ID of `rdma_connect`/`rdma_listen` on a
//! port, [`CmaHdr::emit`] to put the addresses at the start of the REQ's private data, and
//! [`CmaHdr::parse`] on a received REQ's private data to learn the peer's address and port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::mad::ServiceId;
use crate::transport::QKey;

/// The Q_Key of every UD QP in RDMA CM's UDP and IPoIB port spaces (`RDMA_UDP_QKEY` of
/// include/rdma/rdma_cm.h): `rdma_init_qp_attr` gives it to the QP, `rdma_accept` puts it in
/// the SIDR_REP, and the active side refuses a SIDR_REP naming another (cma.c `cma_set_qkey`).
pub const RDMA_UDP_QKEY: QKey = QKey::new(0x0123_4567);

/// An RDMA CM port space (`enum rdma_ucm_port_space` in include/uapi/rdma/rdma_user_cm.h).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP` (0x0106): connected QPs (RC), what rping and perftest `-R` use.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD QPs resolved by SIDR (udaddy).
    Udp,
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
    /// `RDMA_PS_IB` (0x013F): either QP type; carries no IP header (`cma_user_data_offset`).
    Ib,
}

impl PortSpace {
    /// The port space's number.
    #[must_use]
    pub const fn value(self) -> u16 {
        match self {
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
            Self::Ipoib => 0x0002,
            Self::Ib => 0x013f,
        }
    }

    /// The port space of a number, if it is one.
    #[must_use]
    pub const fn from_value(v: u16) -> Option<Self> {
        match v {
            0x0106 => Some(Self::Tcp),
            0x0111 => Some(Self::Udp),
            0x0002 => Some(Self::Ipoib),
            0x013f => Some(Self::Ib),
            _ => None,
        }
    }

    /// Whether a REQ or SIDR_REQ in this port space starts its private data with a
    /// [`CmaHdr`] (every space but `RDMA_PS_IB`, cma.c `cma_user_data_offset`).
    #[must_use]
    pub const fn has_ip_header(self) -> bool {
        !matches!(self, Self::Ib)
    }
}

impl ServiceId {
    /// The service ID RDMA CM uses for an IP port: `(port space << 16) + port`
    /// (cma.c `rdma_get_service_id`; the prefix 0x0000_0000_01 is IBTA Annex A11.2.1's IP
    /// service range).
    #[must_use]
    pub const fn rdma_cm(ps: PortSpace, port: u16) -> Self {
        Self(((ps.value() as u64) << 16) | port as u64)
    }

    /// The port space of an RDMA CM service ID (bits 31:16), if the upper 32 bits are zero
    /// and the space is one RDMA CM knows.
    #[must_use]
    pub const fn port_space(self) -> Option<PortSpace> {
        if self.0 >> 32 != 0 {
            return None;
        }
        PortSpace::from_value((self.0 >> 16) as u16)
    }

    /// The port of an RDMA CM service ID (bits 15:0; cma.c `cma_get_service_id` reverse).
    #[must_use]
    pub const fn port(self) -> u16 {
        (self.0 & 0xffff) as u16
    }
}

/// Length of the RDMA CM IP header.
pub const CMA_HDR_LEN: usize = 36;
/// `CMA_VERSION`, the header's version byte.
pub const CMA_VERSION: u8 = 0x00;

/// Why a REQ's private data holds no valid RDMA CM IP header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmaHdrError {
    /// Shorter than the 36-byte header.
    #[error("RDMA CM IP header truncated: {0} bytes, it is 36")]
    Truncated(usize),
    /// `cma_version` is not 0.
    #[error("RDMA CM header version {0:#04x}, expected 0x00")]
    BadVersion(u8),
    /// The IP version nibble is neither 4 nor 6.
    #[error("RDMA CM header IP version {0}, expected 4 or 6")]
    BadIpVersion(u8),
}

/// The RDMA CM IP header (`struct cma_hdr`): version, IP version in bits 7:4 of byte 1, the
/// sender's port, then the source and destination addresses, 16 bytes each, an IPv4 address
/// in the last 4 (`union cma_ip_addr`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmaHdr {
    /// The sender's port (`hdr->port`, the source port of the active side).
    pub src_port: u16,
    /// The sender's address.
    pub src: IpAddr,
    /// The address connected to.
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Reads the header at the start of `private_data` (a REQ's or SIDR_REQ's), as
    /// cma.c `cma_save_ip_info` does. Mixed families cannot be expressed: the IP version
    /// nibble decides how both addresses are read.
    ///
    /// # Errors
    /// [`CmaHdrError`] if the data is short or the versions are wrong.
    pub fn parse(private_data: &[u8]) -> Result<Self, CmaHdrError> {
        let h = private_data
            .get(..CMA_HDR_LEN)
            .ok_or(CmaHdrError::Truncated(private_data.len()))?;
        if h[0] != CMA_VERSION {
            return Err(CmaHdrError::BadVersion(h[0]));
        }
        let addr = |at: usize, v6: bool| -> IpAddr {
            let mut b = [0u8; 16];
            b.copy_from_slice(&h[at..at + 16]);
            if v6 {
                IpAddr::V6(Ipv6Addr::from(b))
            } else {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            }
        };
        let v6 = match h[1] >> 4 {
            4 => false,
            6 => true,
            v => return Err(CmaHdrError::BadIpVersion(v)),
        };
        Ok(Self {
            src_port: u16::from_be_bytes([h[2], h[3]]),
            src: addr(4, v6),
            dst: addr(20, v6),
        })
    }

    /// The 36 header bytes (cma.c `cma_format_hdr`). Call it when building a REQ or SIDR_REQ
    /// in an IP port space; the consumer's private data follows. If the families differ, the
    /// source's family decides (RDMA CM never mixes them).
    #[must_use]
    pub fn emit(&self) -> [u8; CMA_HDR_LEN] {
        let mut h = [0u8; CMA_HDR_LEN];
        h[0] = CMA_VERSION;
        let put = |h: &mut [u8; CMA_HDR_LEN], at: usize, ip: IpAddr| match ip {
            IpAddr::V4(a) => h[at + 12..at + 16].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => h[at..at + 16].copy_from_slice(&a.octets()),
        };
        h[1] = if self.src.is_ipv4() { 4 << 4 } else { 6 << 4 };
        h[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        put(&mut h, 4, self.src);
        put(&mut h, 20, self.dst);
        h
    }

    /// The header followed by `user` data: the private data of a REQ from `rdma_connect`.
    #[must_use]
    pub fn with_user_data(&self, user: &[u8]) -> Vec<u8> {
        let mut v = self.emit().to_vec();
        v.extend_from_slice(user);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_are_port_space_shifted_plus_port() {
        // rping's default port 7174 in the TCP port space: RDMA_IB_IP_PS_TCP | 7174.
        let sid = ServiceId::rdma_cm(PortSpace::Tcp, 7174);
        assert_eq!(sid.0, 0x0000_0000_0106_1c06);
        assert_eq!(sid.port_space(), Some(PortSpace::Tcp));
        assert_eq!(sid.port(), 7174);
        assert_eq!(
            ServiceId::rdma_cm(PortSpace::Udp, 18515).0,
            0x0111_0000 + 18515
        );
        assert_eq!(ServiceId::rdma_cm(PortSpace::Ib, 1).0, 0x013f_0001);
        assert_eq!(ServiceId(0x1_0106_0001).port_space(), None);
        assert_eq!(ServiceId(0x0999_0001).port_space(), None);
    }

    #[test]
    fn ipv4_header_bytes() {
        let h = CmaHdr {
            src_port: 0x1234,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        };
        let b = h.emit();
        assert_eq!(b[0], 0);
        assert_eq!(b[1], 0x40);
        assert_eq!(&b[2..4], &[0x12, 0x34]);
        assert_eq!(&b[4..16], &[0u8; 12]);
        assert_eq!(&b[16..20], &[10, 0, 0, 1]);
        assert_eq!(&b[20..32], &[0u8; 12]);
        assert_eq!(&b[32..36], &[10, 0, 0, 2]);
        assert_eq!(CmaHdr::parse(&h.with_user_data(b"hi")), Ok(h));
    }

    #[test]
    fn ipv6_header_round_trips_and_bad_headers_are_errors() {
        let h = CmaHdr {
            src_port: 7174,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let b = h.emit();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHdr::parse(&b), Ok(h));
        assert_eq!(CmaHdr::parse(&b[..35]), Err(CmaHdrError::Truncated(35)));
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(CmaHdr::parse(&bad), Err(CmaHdrError::BadVersion(1)));
        let mut bad = b;
        bad[1] = 0x50;
        assert_eq!(CmaHdr::parse(&bad), Err(CmaHdrError::BadIpVersion(5)));
    }
}
