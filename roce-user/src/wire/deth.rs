//! Datagram extended transport header (DETH, IBA 9.3.2), 8 bytes: Q_Key(32) | reserved(8) |
//! SrcQP(24). Carried by UD SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE (rxe_hdr.h).

use super::{QKey, Qpn, Result, be24, be32, fixed_view, put24, put32};

mod field {
    use crate::wire::Field;
    pub(super) const QKEY: Field = 0..4;
    pub(super) const RESERVED: usize = 4;
    pub(super) const SRC_QP: Field = 5..8;
}

fixed_view!(
    /// A view over a DETH.
    len = field::SRC_QP.end
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The queue key the receiver checks.
    #[must_use]
    pub fn qkey(&self) -> QKey {
        QKey::new(be32(self.buffer.as_ref(), field::QKEY.start))
    }
    /// The sender's QP number.
    #[must_use]
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(be24(self.buffer.as_ref(), field::SRC_QP.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the queue key.
    pub fn set_qkey(&mut self, v: QKey) {
        put32(self.buffer.as_mut(), field::QKEY.start, v.value());
    }
    /// Sets the source QP and clears the reserved byte.
    pub fn set_src_qp(&mut self, v: Qpn) {
        self.buffer.as_mut()[field::RESERVED] = 0;
        put24(self.buffer.as_mut(), field::SRC_QP.start, v.value());
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: QKey,
    /// Source QP number.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Reads the header; the reserved byte is ignored.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = DethRepr {
            qkey: QKey::GSI,
            src_qp: Qpn::new(0x12_3456),
        };
        let mut out = [0xa5u8; 8];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x80, 0x01, 0, 0, 0, 0x12, 0x34, 0x56]);
        assert_eq!(
            DethRepr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
    }
}
