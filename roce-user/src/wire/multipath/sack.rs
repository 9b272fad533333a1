//! The SACK trailer (docs/multipath.md, "The wire format of the extension"): 12 bytes at the
//! end of an ACKNOWLEDGE packet of a QP with the extension on. The AETH keeps its meaning
//! (everything up to its PSN, the BTH PSN of the ACK, arrived); the trailer adds which of the
//! 64 PSNs after it arrived too, as UET's packet delivery sublayer acknowledges.
//!
//! Layout: bitmap (64 bits, big-endian; bit i set = PSN `cumulative + 1 + i` arrived) |
//! out-of-order packets the receiver holds (32 bits; at least the bitmap's population, more
//! when its window is wider than 64).

use crate::wire::{Psn, Result, WireError, be32, be64, fixed_view, put32, put64};

mod field {
    use crate::wire::Field;
    pub(super) const BITMAP: Field = 0..8;
    pub(super) const HELD: Field = 8..12;
}

fixed_view!(
    /// A view over a SACK trailer.
    len = roce_common::multipath::SACK_TRAILER_LEN
);

const _: () = assert!(HEADER_LEN == field::HELD.end);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw bitmap.
    #[must_use]
    pub fn bitmap(&self) -> SackBitmap {
        SackBitmap(be64(self.buffer.as_ref(), field::BITMAP.start))
    }
    /// Out-of-order packets held.
    #[must_use]
    pub fn held(&self) -> u32 {
        be32(self.buffer.as_ref(), field::HELD.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the bitmap.
    pub fn set_bitmap(&mut self, v: SackBitmap) {
        put64(self.buffer.as_mut(), field::BITMAP.start, v.0);
    }
    /// Sets the held count.
    pub fn set_held(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::HELD.start, v);
    }
}

/// Which of the 64 PSNs after the cumulative PSN arrived: bit i is PSN `cumulative + 1 + i`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct SackBitmap(pub u64);

impl SackBitmap {
    /// PSNs one bitmap covers.
    pub const SPAN: u32 = 64;

    /// Whether `psn` is marked as arrived, relative to the AETH's cumulative PSN `cum`. PSNs
    /// at or before `cum` are covered by the cumulative part (true); PSNs past the bitmap's
    /// span are unknown (false). Wrap-aware (IBA 9.7.1 PSN arithmetic).
    #[must_use]
    pub fn covers(self, cum: Psn, psn: Psn) -> bool {
        let d = psn.distance(cum);
        if d <= 0 {
            return true;
        }
        d <= Self::SPAN as i32 && self.0 & (1u64 << (d - 1)) != 0
    }

    /// Marks `psn` (`cum + 1 ..= cum + 64`); other PSNs are ignored.
    pub fn set(&mut self, cum: Psn, psn: Psn) {
        let d = psn.distance(cum);
        if (1..=Self::SPAN as i32).contains(&d) {
            self.0 |= 1u64 << (d - 1);
        }
    }

    /// The PSNs the bitmap marks, in order.
    pub fn psns(self, cum: Psn) -> impl Iterator<Item = Psn> {
        (0..Self::SPAN)
            .filter(move |i| self.0 & (1u64 << i) != 0)
            .map(move |i| cum.wrapping_add(i + 1))
    }

    /// The highest PSN the bitmap marks, if any.
    #[must_use]
    pub fn highest(self, cum: Psn) -> Option<Psn> {
        (self.0 != 0).then(|| cum.wrapping_add(64 - self.0.leading_zeros()))
    }
}

/// A parsed SACK trailer. The responder builds one for every ACK it sends while the extension
/// is on ([`crate::transport::multipath::Reassembly::sack`]); the requester parses it with the
/// AETH and hands it to [`crate::transport::multipath::SelectiveRepeat::on_ack`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SackTrailer {
    /// PSNs after the cumulative PSN that arrived.
    pub bitmap: SackBitmap,
    /// Out-of-order packets the receiver holds (at least the bitmap's population).
    pub held: u32,
}

impl SackTrailer {
    /// Reads a trailer.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if short; [`WireError::Malformed`] if it claims fewer held
    /// packets than its bitmap marks.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        let t = Self {
            bitmap: p.bitmap(),
            held: p.held(),
        };
        if t.held < t.bitmap.0.count_ones() {
            return Err(WireError::Malformed(
                "SACK trailer: fewer packets held than the bitmap marks",
            ));
        }
        Ok(t)
    }

    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the trailer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_bitmap(self.bitmap);
        p.set_held(self.held);
    }

    /// The trailer's bytes, the payload of an ACK with the extension on.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut Packet::new_unchecked(&mut b[..]));
        b
    }
}

/// Splits the SACK trailer off the end of an ACK's payload (an ACK has no other payload, so
/// the data part is normally empty). Call it when an ACKNOWLEDGE carries
/// [`super::MpBthFlags::TRAILER`].
///
/// # Errors
/// [`WireError::Truncated`] if shorter than a trailer; any error of [`SackTrailer::parse`].
pub fn split(payload: &[u8]) -> Result<(&[u8], SackTrailer)> {
    let at = payload
        .len()
        .checked_sub(HEADER_LEN)
        .ok_or(WireError::Truncated)?;
    let (data, trailer) = payload.split_at(at);
    Ok((data, SackTrailer::parse(&Packet::new_checked(trailer)?)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bitmap_is_relative_to_the_cumulative_psn_across_wrap() {
        let cum = Psn::new(0xff_fffe);
        let mut b = SackBitmap::default();
        b.set(cum, Psn::new(0xff_ffff)); // bit 0
        b.set(cum, Psn::new(1)); // bit 2
        b.set(cum, cum.wrapping_add(64)); // bit 63
        b.set(cum, cum.wrapping_add(65)); // outside: ignored
        b.set(cum, cum); // cumulative: ignored
        assert_eq!(b.0, 1 | 4 | (1 << 63));
        assert!(b.covers(cum, Psn::new(0xff_fff0)));
        assert!(b.covers(cum, Psn::new(1)));
        assert!(!b.covers(cum, Psn::new(0)));
        assert!(!b.covers(cum, cum.wrapping_add(65)));
        let got: Vec<Psn> = b.psns(cum).collect();
        assert_eq!(
            got,
            [Psn::new(0xff_ffff), Psn::new(1), cum.wrapping_add(64)]
        );
        assert_eq!(b.highest(cum), Some(cum.wrapping_add(64)));
        assert_eq!(SackBitmap::default().highest(cum), None);
    }

    #[test]
    fn layout_and_malformed() {
        let t = SackTrailer {
            bitmap: SackBitmap(0x8000_0000_0000_0005),
            held: 3,
        };
        assert_eq!(t.to_bytes(), [0x80, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 3]);
        let b = t.to_bytes();
        assert_eq!(split(&b), Ok((&[][..], t)));
        assert_eq!(split(&b[1..]), Err(WireError::Truncated));
        let lying = SackTrailer { held: 2, ..t };
        assert!(matches!(
            split(&lying.to_bytes()),
            Err(WireError::Malformed(_))
        ));
    }

    proptest! {
        /// Every consistent trailer round-trips; arbitrary bytes never panic.
        #[test]
        fn round_trip(bitmap in any::<u64>(), extra in 0u32..1000, junk in proptest::collection::vec(any::<u8>(), 0..20)) {
            let t = SackTrailer { bitmap: SackBitmap(bitmap), held: bitmap.count_ones() + extra };
            let b = t.to_bytes();
            prop_assert_eq!(split(&b), Ok((&[][..], t)));
            if let Ok((d, t)) = split(&junk) {
                prop_assert_eq!(&t.to_bytes()[..], &junk[d.len()..]);
            }
        }
    }
}
