//! Immediate data extended transport header (ImmDt, IBA 9.3.5), 4 bytes.
//!
//! Carried by SEND_LAST/ONLY_WITH_IMMEDIATE and RDMA_WRITE_LAST/ONLY_WITH_IMMEDIATE, after the
//! RETH if there is one (rxe_opcode.c).

use super::{Result, be32, fixed_view, put32};

fixed_view!(
    /// A view over an ImmDt header.
    len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate value, read big-endian (verbs hand it to the application as `__be32`).
    #[must_use]
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        put32(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmDtRepr {
    /// The immediate value (big-endian on the wire).
    pub imm: u32,
}

impl ImmDtRepr {
    /// Reads the header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self { imm: p.imm() })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_imm(self.imm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut out = [0xa5u8; 4];
        ImmDtRepr { imm: 0x0102_0304 }.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(
            ImmDtRepr::parse(&Packet::new_checked(&out[..]).unwrap())
                .unwrap()
                .imm,
            0x0102_0304
        );
        assert!(Packet::new_checked(&out[..3]).is_err());
    }
}
