//! Path feedback in a CNP (docs/multipath.md, "The wire format of the extension" and
//! "Congestion control across paths"): the notification point writes the UDP source port
//! (the entropy) of the CE-marked packet that caused the CNP into the first two of the CNP's
//! 16 reserved bytes (IBA Annex A17.9.3, [`crate::wire::cnp`]), big-endian, the other 14 stay
//! 0. The CNP's BTH carries [`super::MpBthFlags::TRAILER`] so the reaction point knows the
//! bytes mean something; to anyone else it is a valid CNP whose reserved bytes they ignore.

use crate::wire::{Result, WireError, be16, cnp, put16};

/// A UDP source port in RoCE v2's entropy range 0xC000..=0xFFFF (IBA Annex A17.4.2.1 has
/// the source port carry flow entropy; Linux's `rdma_get_udp_sport` picks from this range).
/// Each sprayed packet takes one; an ECMP fabric hashes it to a path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Entropy(u16);

impl Entropy {
    /// The lowest entropy.
    pub const MIN: u16 = 0xc000;

    /// An entropy, or `None` for a port outside 0xC000..=0xFFFF.
    #[must_use]
    pub const fn new(port: u16) -> Option<Self> {
        if port >= Self::MIN {
            Some(Self(port))
        } else {
            None
        }
    }

    /// The UDP source port.
    #[must_use]
    pub const fn port(self) -> u16 {
        self.0
    }
}

/// The path feedback a CNP carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PathFeedback {
    /// The entropy of the packet that was marked.
    pub entropy: Entropy,
}

impl PathFeedback {
    /// Reads the feedback from a CNP's reserved bytes. Call it for a CNP whose BTH carries
    /// `TRAILER` from a peer QP with the extension on; a plain CNP is not parsed.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if short; [`WireError::Malformed`] if the port is outside
    /// the entropy range or the other 14 bytes are not 0.
    pub fn parse<T: AsRef<[u8]>>(p: &cnp::Packet<T>) -> Result<Self> {
        p.check_len()?;
        let b = p.reserved();
        if b[2..].iter().any(|&x| x != 0) {
            return Err(WireError::Malformed(
                "CNP path feedback: non-zero bytes after the entropy",
            ));
        }
        let entropy = Entropy::new(be16(b, 0)).ok_or(WireError::Malformed(
            "CNP path feedback: UDP source port outside 0xC000..=0xFFFF",
        ))?;
        Ok(Self { entropy })
    }

    /// The CNP reserved block carrying this feedback ([`crate::wire::CnpRepr::reserved`]).
    #[must_use]
    pub fn reserved(&self) -> [u8; cnp::HEADER_LEN] {
        let mut b = [0u8; cnp::HEADER_LEN];
        self.emit(&mut cnp::Packet::new_unchecked(&mut b[..]));
        b
    }

    /// Reads the feedback from a parsed CNP's reserved block; see [`Self::parse`].
    ///
    /// # Errors
    /// As [`Self::parse`].
    pub fn from_reserved(b: &[u8; cnp::HEADER_LEN]) -> Result<Self> {
        Self::parse(&cnp::Packet::new_checked(&b[..])?)
    }

    /// Bytes [`Self::emit`] writes (the whole CNP reserved block).
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        cnp::HEADER_LEN
    }

    /// Writes the feedback into a CNP's reserved bytes (instead of `CnpRepr::emit`'s zeros).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut cnp::Packet<T>) {
        p.clear();
        let mut b = [0u8; cnp::HEADER_LEN];
        put16(&mut b, 0, self.entropy.0);
        p.set_reserved(&b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CnpRepr;
    use proptest::prelude::*;

    #[test]
    fn layout_and_malformed() {
        let f = PathFeedback {
            entropy: Entropy::new(0xc123).unwrap(),
        };
        let mut b = [0xa5u8; 16];
        f.emit(&mut cnp::Packet::new_unchecked(&mut b[..]));
        assert_eq!(b[..2], [0xc1, 0x23]);
        assert_eq!(b[2..], [0u8; 14]);
        let p = cnp::Packet::new_checked(&b[..]).unwrap();
        assert_eq!(PathFeedback::parse(&p), Ok(f));
        // Still a CNP to anyone, its bytes kept as received.
        assert_eq!(CnpRepr::parse(&p), Ok(CnpRepr { reserved: b }));
        assert_eq!(f.reserved(), b);
        assert_eq!(
            cnp::Packet::new_checked(&b[..15]).map(|_| ()),
            Err(WireError::Truncated)
        );
        // A plain CNP (zeros) has no feedback.
        let z = [0u8; 16];
        assert!(PathFeedback::parse(&cnp::Packet::new_checked(&z[..]).unwrap()).is_err());
        let mut trailing = b;
        trailing[15] = 1;
        assert!(PathFeedback::parse(&cnp::Packet::new_checked(&trailing[..]).unwrap()).is_err());
        assert_eq!(Entropy::new(0xbfff), None);
    }

    proptest! {
        /// Every entropy round-trips; arbitrary reserved bytes never panic the parser.
        #[test]
        fn round_trip(port in 0xc000u16..=0xffff, junk in any::<[u8; 16]>()) {
            let f = PathFeedback { entropy: Entropy::new(port).unwrap() };
            let mut b = [0u8; 16];
            f.emit(&mut cnp::Packet::new_unchecked(&mut b[..]));
            prop_assert_eq!(PathFeedback::parse(&cnp::Packet::new_checked(&b[..]).unwrap()), Ok(f));
            if let Ok(g) = PathFeedback::parse(&cnp::Packet::new_checked(&junk[..]).unwrap()) {
                prop_assert_eq!(g.entropy.port(), u16::from_be_bytes([junk[0], junk[1]]));
            }
        }
    }
}
