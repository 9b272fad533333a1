//! Flush extended transport header (FETH, IBA 1.5 9.3.9), 4 bytes, carried by RC FLUSH before
//! its RETH. Bits 5:4 are the placement type, bits 3:0 the selectivity level (rxe_hdr.h
//! `FETH_PLT_MASK`/`FETH_SEL_MASK`); roce-xdp parses it so FLUSH packets are well-formed
//! but does not execute FLUSH.

use super::{Result, be32, fixed_view, put32};

fixed_view!(
    /// A view over a FETH.
    len = 4
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The whole 32-bit field.
    #[must_use]
    pub fn raw(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
    /// Placement type (bits 5:4).
    #[must_use]
    pub fn placement_type(&self) -> u8 {
        ((self.raw() >> 4) & 0x3) as u8
    }
    /// Selectivity level (bits 3:0).
    #[must_use]
    pub fn selectivity_level(&self) -> u8 {
        (self.raw() & 0xf) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the whole 32-bit field.
    pub fn set_raw(&mut self, v: u32) {
        put32(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed FETH, kept whole so it round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FethRepr {
    /// The 32-bit field as on the wire.
    pub raw: u32,
}

impl FethRepr {
    /// Reads the header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self { raw: p.raw() })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_raw(self.raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let p = Packet::new_checked(&[0u8, 0, 0, 0x21][..]).unwrap();
        assert_eq!(p.placement_type(), 2);
        assert_eq!(p.selectivity_level(), 1);
        assert_eq!(FethRepr::parse(&p).unwrap().raw, 0x21);
    }
}
