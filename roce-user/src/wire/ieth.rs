//! Invalidate extended transport header (IETH, IBA 9.3.7), 4 bytes: the R_Key to invalidate.
//!
//! Carried by SEND_LAST_WITH_INVALIDATE and SEND_ONLY_WITH_INVALIDATE (rxe_opcode.c).

use super::{RKey, Result, be32, fixed_view, put32};

fixed_view!(
    /// A view over an IETH.
    len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key the responder invalidates.
    #[must_use]
    pub fn rkey(&self) -> RKey {
        RKey::new(be32(self.buffer.as_ref(), 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: RKey) {
        put32(self.buffer.as_mut(), 0, v.value());
    }
}

/// A parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IethRepr {
    /// The R_Key to invalidate.
    pub rkey: RKey,
}

impl IethRepr {
    /// Reads the header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self { rkey: p.rkey() })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut out = [0xa5u8; 4];
        IethRepr {
            rkey: RKey::new(0xcafe),
        }
        .emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0, 0, 0xca, 0xfe]);
        assert_eq!(
            IethRepr::parse(&Packet::new_checked(&out[..]).unwrap())
                .unwrap()
                .rkey,
            RKey::new(0xcafe)
        );
    }
}
