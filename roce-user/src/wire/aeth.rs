//! ACK extended transport header (AETH, IBA 9.3.5 / 9.7.5.1): syndrome(8) | MSN(24).
//!
//! Carried by ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE and READ_RESPONSE FIRST/LAST/ONLY. The syndrome
//! byte is bit 7 reserved, bits 6:5 the type (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK) and bits
//! 4:0 a value: the credit code of an ACK, the RNR timer code of an RNR NAK, the NAK code of a
//! NAK (`AETH_TYPE_MASK` 0xe0 in rxe_hdr.h).

use core::fmt;

use super::{Msn, Result, be24, fixed_view, put24};

mod field {
    use crate::wire::Field;
    pub(super) const SYNDROME: usize = 0;
    pub(super) const MSN: Field = 1..4;
}

fixed_view!(
    /// A view over an AETH.
    len = field::MSN.end
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    #[must_use]
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// The decoded syndrome.
    #[must_use]
    pub fn syndrome(&self) -> AethSyndrome {
        AethSyndrome::from_byte(self.syndrome_byte())
    }
    /// The responder's message sequence number.
    #[must_use]
    pub fn msn(&self) -> Msn {
        Msn::new(be24(self.buffer.as_ref(), field::MSN.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome byte.
    pub fn set_syndrome(&mut self, v: AethSyndrome) {
        self.buffer.as_mut()[field::SYNDROME] = v.to_byte();
    }
    /// Sets the MSN.
    pub fn set_msn(&mut self, v: Msn) {
        put24(self.buffer.as_mut(), field::MSN.start, v.value());
    }
}

/// Credits for each ACK credit code 0..=30 (IBA table 45; rdmavt `credit_table` in rc.c).
pub const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// RNR NAK timer for each code 0..=31 in microseconds (IBA table 46; `enum ib_rnr_timeout` in
/// ib_verbs.h). Code 0 is the longest, 655.36 ms. rxe_comp.c's `rnrnak_usec` has 61410 for
/// code 25; the spec value 61.44 ms is used here.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// A 5-bit ACK credit code. Code 0x1f means "invalid": no end-to-end flow control (rxe always
/// sends it, `AETH_ACK_UNLIMITED`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CreditCode(u8);

impl CreditCode {
    /// The "invalid / unlimited" credit code that rxe sends.
    pub const UNLIMITED: Self = Self(0x1f);

    /// A credit code from the low 5 bits of `code`.
    #[must_use]
    pub const fn new(code: u8) -> Self {
        Self(code & 0x1f)
    }

    /// The 5-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The number of credits, or `None` for [`Self::UNLIMITED`].
    #[must_use]
    pub const fn credits(self) -> Option<u32> {
        if self.0 as usize >= CREDIT_TABLE.len() {
            None
        } else {
            Some(CREDIT_TABLE[self.0 as usize])
        }
    }

    /// The largest code whose credit count is at most `credits` (rdmavt `rvt_compute_aeth`).
    #[must_use]
    pub fn from_credits(credits: u32) -> Self {
        let idx = CREDIT_TABLE.partition_point(|&c| c <= credits);
        Self(idx.saturating_sub(1) as u8)
    }
}

impl fmt::Debug for CreditCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.credits() {
            Some(n) => write!(f, "CreditCode({:#04x}={n})", self.0),
            None => write!(f, "CreditCode(UNLIMITED)"),
        }
    }
}

/// A 5-bit RNR NAK timer code (IBA 9.7.5.2.8).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RnrTimer(u8);

impl RnrTimer {
    /// A timer code from the low 5 bits of `code`.
    #[must_use]
    pub const fn new(code: u8) -> Self {
        Self(code & 0x1f)
    }

    /// The 5-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        self.0
    }

    /// How long the requester waits before retrying, in microseconds.
    #[must_use]
    pub const fn micros(self) -> u32 {
        RNR_TIMER_US[(self.0 & 0x1f) as usize]
    }
}

impl fmt::Debug for RnrTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RnrTimer({}={}us)", self.0, self.micros())
    }
}

/// NAK codes (syndrome type 11, IBA table 44; `AETH_NAK_*` in rxe_hdr.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (class B, retry from the NAK's PSN).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request (RD only).
    InvalidRdRequest,
    /// Any other (reserved) 5-bit value.
    Unknown(u8),
}

impl NakCode {
    /// The 5-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Unknown(c) => c & 0x1f,
        }
    }

    /// The code from the low 5 bits of `code`.
    #[must_use]
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1f {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            c => Self::Unknown(c),
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with a credit count.
    Ack {
        /// End-to-end flow-control credits.
        credits: CreditCode,
    },
    /// Receiver not ready: retry after the timer.
    RnrNak {
        /// How long to wait before retrying.
        timer: RnrTimer,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Reserved type (10) or reserved bit 7 set: the whole byte.
    Reserved(u8),
}

impl AethSyndrome {
    /// The ACK syndrome rxe sends: unlimited credits (0x1f).
    pub const ACK_UNLIMITED: Self = Self::Ack {
        credits: CreditCode::UNLIMITED,
    };

    /// Decodes a syndrome byte.
    #[must_use]
    pub const fn from_byte(b: u8) -> Self {
        match b >> 5 {
            0 => Self::Ack {
                credits: CreditCode::new(b),
            },
            1 => Self::RnrNak {
                timer: RnrTimer::new(b),
            },
            3 => Self::Nak(NakCode::from_code(b)),
            _ => Self::Reserved(b),
        }
    }

    /// Encodes the syndrome byte.
    #[must_use]
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Ack { credits } => credits.code(),
            Self::RnrNak { timer } => 0x20 | timer.code(),
            Self::Nak(code) => 0x60 | code.code(),
            Self::Reserved(b) => b,
        }
    }

    /// Whether this is a positive ACK.
    #[must_use]
    pub const fn is_ack(self) -> bool {
        matches!(self, Self::Ack { .. })
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// The syndrome.
    pub syndrome: AethSyndrome,
    /// The responder's MSN.
    pub msn: Msn,
}

impl AethRepr {
    /// Reads the header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            syndrome: p.syndrome(),
            msn: p.msn(),
        })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_bytes_match_rxe() {
        assert_eq!(AethSyndrome::ACK_UNLIMITED.to_byte(), 0x1f);
        assert_eq!(AethSyndrome::Nak(NakCode::PsnSequenceError).to_byte(), 0x60);
        assert_eq!(AethSyndrome::Nak(NakCode::InvalidRequest).to_byte(), 0x61);
        assert_eq!(
            AethSyndrome::Nak(NakCode::RemoteAccessError).to_byte(),
            0x62
        );
        assert_eq!(
            AethSyndrome::Nak(NakCode::RemoteOperationalError).to_byte(),
            0x63
        );
        assert_eq!(AethSyndrome::Nak(NakCode::InvalidRdRequest).to_byte(), 0x64);
        assert_eq!(
            AethSyndrome::RnrNak {
                timer: RnrTimer::new(12)
            }
            .to_byte(),
            0x2c
        );
        assert_eq!(AethSyndrome::from_byte(0x45), AethSyndrome::Reserved(0x45));
        assert_eq!(AethSyndrome::from_byte(0x9f), AethSyndrome::Reserved(0x9f));
        assert_eq!(
            AethSyndrome::from_byte(0x6a),
            AethSyndrome::Nak(NakCode::Unknown(0x0a))
        );
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn tables() {
        assert_eq!(CreditCode::new(0).credits(), Some(0));
        assert_eq!(CreditCode::new(0x1e).credits(), Some(32768));
        assert_eq!(CreditCode::UNLIMITED.credits(), None);
        assert_eq!(CreditCode::from_credits(5), CreditCode::new(4));
        assert_eq!(CreditCode::from_credits(6), CreditCode::new(5));
        assert_eq!(CreditCode::from_credits(1_000_000), CreditCode::new(30));
        assert_eq!(RnrTimer::new(0).micros(), 655_360);
        assert_eq!(RnrTimer::new(1).micros(), 10);
        assert_eq!(RnrTimer::new(12).micros(), 640);
        assert_eq!(RnrTimer::new(25).micros(), 61_440);
        assert_eq!(RnrTimer::new(31).micros(), 491_520);
    }

    #[test]
    fn round_trip() {
        let r = AethRepr {
            syndrome: AethSyndrome::ACK_UNLIMITED,
            msn: Msn::new(0x01_0203),
        };
        let mut out = [0xa5u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x1f, 1, 2, 3]);
        assert_eq!(
            AethRepr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
    }
}
