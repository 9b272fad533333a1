//! RDMA extended transport header (RETH, IBA 9.3.3): virtual address, R_Key, DMA length.
//!
//! Carried by RDMA WRITE FIRST/ONLY, READ REQUEST, ATOMIC WRITE and FLUSH (rxe_opcode.c).

use super::{RKey, Result, be32, be64, fixed_view, put32, put64};

mod field {
    use crate::wire::Field;
    pub(super) const VA: Field = 0..8;
    pub(super) const RKEY: Field = 8..12;
    pub(super) const DMA_LEN: Field = 12..16;
}

fixed_view!(
    /// A view over a RETH.
    len = field::DMA_LEN.end
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address.
    #[must_use]
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), field::VA.start)
    }
    /// Remote key of the memory region.
    #[must_use]
    pub fn rkey(&self) -> RKey {
        RKey::new(be32(self.buffer.as_ref(), field::RKEY.start))
    }
    /// Length of the whole RDMA operation in bytes.
    #[must_use]
    pub fn dma_len(&self) -> u32 {
        be32(self.buffer.as_ref(), field::DMA_LEN.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::VA.start, v);
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: RKey) {
        put32(self.buffer.as_mut(), field::RKEY.start, v.value());
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::DMA_LEN.start, v);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH from a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header into a view of at least [`Self::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x10,
        0x00,
    ];

    #[test]
    fn parse_and_emit() {
        let r = RethRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            RethRepr {
                va: 0x7f12_3456_789a,
                rkey: RKey::new(0x1234),
                dma_len: 4096
            }
        );
        let mut out = [0xa5u8; 16];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert_eq!(
            Packet::new_checked(&BYTES[..15]).unwrap_err(),
            crate::wire::WireError::Truncated
        );
    }
}
