//! Atomic extended transport header (AtomicETH, IBA 9.3.4) and atomic acknowledge header
//! (AtomicAckETH, IBA 9.3.6).
//!
//! AtomicETH (28 bytes, packed): VA(64) R_Key(32) swap-or-add(64) compare(64), carried by
//! CMP_SWAP and FETCH_ADD. AtomicAckETH (8 bytes): the original remote value, carried by
//! ATOMIC_ACKNOWLEDGE after its AETH (rxe_hdr.h).

use super::{RKey, Result, be32, be64, put32, put64};

/// The AtomicETH view and repr.
pub mod eth {
    use super::*;
    use crate::wire::fixed_view;

    mod field {
        use crate::wire::Field;
        pub(super) const VA: Field = 0..8;
        pub(super) const RKEY: Field = 8..12;
        pub(super) const SWAP_ADD: Field = 12..20;
        pub(super) const COMPARE: Field = 20..28;
    }

    fixed_view!(
        /// A view over an AtomicETH.
        len = field::COMPARE.end
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Remote virtual address (must be 8-byte aligned for the responder to accept it).
        #[must_use]
        pub fn va(&self) -> u64 {
            be64(self.buffer.as_ref(), field::VA.start)
        }
        /// Remote key.
        #[must_use]
        pub fn rkey(&self) -> RKey {
            RKey::new(be32(self.buffer.as_ref(), field::RKEY.start))
        }
        /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
        #[must_use]
        pub fn swap_add(&self) -> u64 {
            be64(self.buffer.as_ref(), field::SWAP_ADD.start)
        }
        /// Compare value (CMP_SWAP only; FETCH_ADD ignores it).
        #[must_use]
        pub fn compare(&self) -> u64 {
            be64(self.buffer.as_ref(), field::COMPARE.start)
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
        /// Sets the swap value or addend.
        pub fn set_swap_add(&mut self, v: u64) {
            put64(self.buffer.as_mut(), field::SWAP_ADD.start, v);
        }
        /// Sets the compare value.
        pub fn set_compare(&mut self, v: u64) {
            put64(self.buffer.as_mut(), field::COMPARE.start, v);
        }
    }
}

/// The AtomicAckETH view.
pub mod ack {
    use super::*;
    use crate::wire::fixed_view;

    mod field {
        use crate::wire::Field;
        pub(super) const ORIG: Field = 0..8;
    }

    fixed_view!(
        /// A view over an AtomicAckETH.
        len = field::ORIG.end
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// The remote value before the atomic operation.
        #[must_use]
        pub fn orig(&self) -> u64 {
            be64(self.buffer.as_ref(), field::ORIG.start)
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the original value.
        pub fn set_orig(&mut self, v: u64) {
            put64(self.buffer.as_mut(), field::ORIG.start, v);
        }
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &eth::Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        eth::HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut eth::Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    /// The remote value before the atomic operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(p: &ack::Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self { orig: p.orig() })
    }
    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        ack::HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ack::Packet<T>) {
        p.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_round_trip() {
        let r = AtomicEthRepr {
            va: 0x1000_0000_0008,
            rkey: RKey::new(0xdead_beef),
            swap_add: 0x0102_0304_0506_0708,
            compare: 0x1112_1314_1516_1718,
        };
        let mut out = [0xa5u8; 28];
        r.emit(&mut eth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(&out[8..12], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&out[12..14], &[0x01, 0x02]);
        assert_eq!(&out[27], &0x18);
        assert_eq!(
            AtomicEthRepr::parse(&eth::Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
        assert!(eth::Packet::new_checked(&out[..27]).is_err());
    }

    #[test]
    fn atomic_ack_round_trip() {
        let r = AtomicAckEthRepr { orig: 42 };
        let mut out = [0xa5u8; 8];
        r.emit(&mut ack::Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 42]);
        assert_eq!(
            AtomicAckEthRepr::parse(&ack::Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
    }
}
