//! The 16 reserved bytes that follow the BTH of a RoCE v2 congestion notification packet
//! (opcode 0x81, IBA Annex A17.9.3; scapy `CNPPadding`). Senders write zeros; receivers ignore
//! the contents.

use super::{Result, fixed_view};

fixed_view!(
    /// A view over the CNP reserved bytes.
    len = 16
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved bytes as received.
    #[must_use]
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Zeroes the reserved bytes.
    pub fn clear(&mut self) {
        self.buffer.as_mut()[..HEADER_LEN].fill(0);
    }
    /// Writes the reserved bytes: only the multipath extension's path feedback does
    /// ([`super::multipath::PathFeedback`]); plain CNPs are [`Self::clear`]ed.
    pub fn set_reserved(&mut self, v: &[u8; HEADER_LEN]) {
        self.buffer.as_mut()[..HEADER_LEN].copy_from_slice(v);
    }
}

/// A parsed CNP reserved block: its bytes, zero from any sender but a roce-xdp QP with the
/// multipath extension on, which puts its path feedback there
/// ([`super::multipath::PathFeedback`]); receivers that know nothing of it ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CnpRepr {
    /// The 16 reserved bytes (zeros by default).
    pub reserved: [u8; HEADER_LEN],
}

impl CnpRepr {
    /// Checks the length and keeps the bytes (IBA has receivers ignore them; only a QP with
    /// the multipath extension on reads them, when the BTH says they carry path feedback).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        let mut reserved = [0; HEADER_LEN];
        reserved.copy_from_slice(p.reserved());
        Ok(Self { reserved })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the 16 bytes (zeros unless path feedback was put in).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_reserved(&self.reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_zeros() {
        let mut out = [0xa5u8; 16];
        CnpRepr::default().emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0u8; 16]);
        assert!(Packet::new_checked(&out[..15]).is_err());
    }
}
