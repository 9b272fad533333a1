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

/// A parsed CNP reserved block: it has no fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CnpRepr;

impl CnpRepr {
    /// Checks the length; the contents are ignored (reserved).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self)
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes 16 zero bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_zeros() {
        let mut out = [0xa5u8; 16];
        CnpRepr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0u8; 16]);
        assert!(Packet::new_checked(&out[..15]).is_err());
    }
}
