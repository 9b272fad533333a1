//! Where a communication-manager MAD sits in a RoCE v2 frame and how its message is named:
//! the one table of CM attribute IDs (IBTA vol 1 12.11.2 Table 123; `CM_*_ATTR_ID` in the
//! kernel's cm_msgs.h) that the CM codec in user space (`roce::ibcm::mad`) and the eBPF
//! programs (`roce_impair`'s `--mad` selector) both read.
//!
//! A CM MAD travels as the payload of a UD SEND_ONLY to QP 1, the GSI (IBTA 13.5.1): BTH,
//! DETH, then the 256-byte MAD, whose common header (IBTA 13.4.2) names the management class
//! at byte 1 and the attribute ID at bytes 16..18 (big-endian).

/// QPN of the general services interface, which carries CM MADs (IBTA 13.5.1).
pub const GSI_QPN: u32 = 1;
/// Length of a MAD (IBTA 13.4.1: every MAD is 256 bytes).
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header (IBTA 13.4.2, `struct ib_mad_hdr`).
pub const MAD_HDR_LEN: usize = 24;
/// Offset of `MgmtClass` in the MAD header.
pub const MAD_MGMT_CLASS_OFFSET: usize = 1;
/// Offset of `AttributeID` (big-endian u16) in the MAD header.
pub const MAD_ATTR_ID_OFFSET: usize = 16;
/// `MgmtClass` of the communication manager (IBTA 13.4.4, `IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS_CM: u8 = 0x07;

/// The CM messages and their attribute IDs (IBTA 12.11.2 Table 123; `CM_*_ATTR_ID` in
/// cm_msgs.h). LAP (0x19), APR (0x1A) and ClassPortInfo (0x01) are CM attributes too, which
/// roce-xdp does not implement (no alternate path migration).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u16)]
pub enum CmAttr {
    /// Connection request (12.6.5).
    Req = 0x0010,
    /// Message receipt acknowledgement (12.6.6).
    Mra = 0x0011,
    /// Reject (12.6.7).
    Rej = 0x0012,
    /// Reply to a REQ (12.6.8).
    Rep = 0x0013,
    /// Ready to use (12.6.9).
    Rtu = 0x0014,
    /// Disconnection request (12.6.10).
    Dreq = 0x0015,
    /// Disconnection reply (12.6.11).
    Drep = 0x0016,
    /// Service ID resolution request (12.11, Table 119).
    SidrReq = 0x0017,
    /// Service ID resolution reply (12.11, Table 120).
    SidrRep = 0x0018,
}

/// Attribute IDs that are CM attributes roce-xdp does not implement: ClassPortInfo, LAP, APR.
pub const CM_ATTRS_UNSUPPORTED: [u16; 3] = [0x01, 0x19, 0x1a];

impl CmAttr {
    /// Every CM message, in attribute ID order.
    pub const ALL: [Self; 9] = [
        Self::Req,
        Self::Mra,
        Self::Rej,
        Self::Rep,
        Self::Rtu,
        Self::Dreq,
        Self::Drep,
        Self::SidrReq,
        Self::SidrRep,
    ];

    /// The message for an attribute ID, if it is one of [`Self::ALL`].
    #[must_use]
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x10 => Self::Req,
            0x11 => Self::Mra,
            0x12 => Self::Rej,
            0x13 => Self::Rep,
            0x14 => Self::Rtu,
            0x15 => Self::Dreq,
            0x16 => Self::Drep,
            0x17 => Self::SidrReq,
            0x18 => Self::SidrRep,
            _ => return None,
        })
    }

    /// The attribute ID.
    #[must_use]
    pub const fn id(self) -> u16 {
        self as u16
    }

    /// The message's name as the kernel's CM counters and IBTA spell it (`REQ`, `SIDR_REQ`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Req => "REQ",
            Self::Mra => "MRA",
            Self::Rej => "REJ",
            Self::Rep => "REP",
            Self::Rtu => "RTU",
            Self::Dreq => "DREQ",
            Self::Drep => "DREP",
            Self::SidrReq => "SIDR_REQ",
            Self::SidrRep => "SIDR_REP",
        }
    }

    /// The message named `s`, in any case, with `-` or `_` in the SIDR names (`req`,
    /// `sidr-req`).
    #[must_use]
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| {
            let (n, b) = (a.name().as_bytes(), s.as_bytes());
            n.len() == b.len()
                && n.iter().zip(b).all(|(x, y)| {
                    let y = if *y == b'-' { b'_' } else { *y };
                    x.eq_ignore_ascii_case(&y)
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for a in CmAttr::ALL {
            assert_eq!(CmAttr::from_u16(a.id()), Some(a));
            assert_eq!(CmAttr::from_name(a.name()), Some(a));
        }
        assert_eq!(CmAttr::from_name("rtu"), Some(CmAttr::Rtu));
        assert_eq!(CmAttr::from_name("sidr-rep"), Some(CmAttr::SidrRep));
        assert_eq!(CmAttr::from_name("lap"), None);
        assert_eq!(CmAttr::from_u16(0x19), None);
        assert_eq!(CmAttr::Drep.id(), 0x16);
    }
}
