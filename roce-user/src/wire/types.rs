//! Newtypes for the quantities of the InfiniBand transport: PSN, QPN, keys, MSN.
//!
//! Every 24-bit quantity (PSN, QPN, MSN) is masked to 24 bits when built, so a value held in one
//! of these types is always valid on the wire.

use core::{cmp::Ordering, fmt};

/// Mask of a 24-bit field (PSN, QPN, MSN).
pub const MASK_24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number (IBA 9.7.1).
///
/// PSNs wrap modulo 2^24. Comparison is wrap-aware (serial number arithmetic, as rxe's
/// `psn_compare` in `rxe_hdr.h`): `a` is after `b` when `(a - b) mod 2^24` is in `1..2^23`.
/// This is not a total order, so `Psn` deliberately does not implement `Ord`; use
/// [`Psn::cmp_wrapping`] or [`Psn::distance`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN, 2^24 - 1.
    pub const MAX: Self = Self(MASK_24);

    /// A PSN from the low 24 bits of `value`.
    #[must_use]
    pub const fn new(value: u32) -> Self {
        Self(value & MASK_24)
    }

    /// The PSN as a number in `0..2^24`.
    #[must_use]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & MASK_24)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & MASK_24)
    }

    /// The next PSN (`self + 1` modulo 2^24).
    #[must_use]
    pub const fn next(self) -> Self {
        self.wrapping_add(1)
    }

    /// Signed distance `self - other` in `-2^23..2^23`, wrap-aware.
    ///
    /// Positive when `self` is after `other`. This is rxe's `psn_compare`
    /// (`(int)((a - b) << 8)`), scaled back to PSN units.
    #[must_use]
    pub const fn distance(self, other: Self) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Wrap-aware comparison: `Greater` when `self` is after `other`.
    #[must_use]
    pub fn cmp_wrapping(self, other: Self) -> Ordering {
        self.distance(other).cmp(&0)
    }

    /// Whether `self` comes strictly before `other` (wrap-aware).
    #[must_use]
    pub const fn is_before(self, other: Self) -> bool {
        self.distance(other) < 0
    }

    /// Whether `self` comes strictly after `other` (wrap-aware).
    #[must_use]
    pub const fn is_after(self, other: Self) -> bool {
        self.distance(other) > 0
    }
}

/// As the raw value; a value read back is masked to the field's width, as [`Self::new`] does,
/// so a peer's bytes never make an out-of-range value (the engine protocol, docs/multiprocess.md).
impl serde::Serialize for Psn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Psn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u32::deserialize(d).map(Self::new)
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

macro_rules! id_newtype {
    ($(#[$m:meta])* $name:ident($ty:ty), mask $mask:expr, width $w:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name($ty);

        impl $name {
            /// The value, masked to the field width.
            #[must_use]
            pub const fn new(value: $ty) -> Self {
                Self(value & $mask)
            }

            /// The raw value.
            #[must_use]
            pub const fn value(self) -> $ty {
                self.0
            }
        }

        impl From<$name> for $ty {
            fn from(v: $name) -> $ty {
                v.0
            }
        }

        /// As the raw value; a value read back is masked to the field's width, as `new` does,
        /// so a peer's bytes never make an out-of-range value (the engine protocol, docs/multiprocess.md).
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$ty>::deserialize(d).map(Self::new)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#0", $w, "x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!("{:#0", $w, "x}"), self.0)
            }
        }
    };
}

id_newtype!(
    /// A 24-bit queue pair number (BTH DestQP, DETH SrcQP).
    Qpn(u32), mask MASK_24, width 8
);
id_newtype!(
    /// A remote key (RETH, AtomicETH, IETH).
    RKey(u32), mask u32::MAX, width 10
);
id_newtype!(
    /// A local key (used in scatter/gather entries, never on the wire).
    LKey(u32), mask u32::MAX, width 10
);
id_newtype!(
    /// A 24-bit message sequence number (AETH, IBA 9.7.5.1.6).
    Msn(u32), mask MASK_24, width 8
);
id_newtype!(
    /// A 16-bit partition key (BTH). rxe sends `0xffff` (`IB_DEFAULT_PKEY_FULL`).
    PKey(u16), mask u16::MAX, width 6
);
id_newtype!(
    /// A 32-bit queue key (DETH, UD only). GSI uses `0x80010000`.
    QKey(u32), mask u32::MAX, width 10
);

impl Qpn {
    /// QP 1, the general services interface (MADs, RDMA CM).
    pub const GSI: Self = Self(1);
}

impl Msn {
    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & MASK_24)
    }
}

impl PKey {
    /// The default full-membership partition key that rxe sends (`IB_DEFAULT_PKEY_FULL`).
    pub const DEFAULT: Self = Self(0xffff);
}

impl QKey {
    /// The Q_Key of the GSI QP (`GSI_QKEY` in rxe_hdr.h).
    pub const GSI: Self = Self(0x8001_0000);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_masks_and_wraps() {
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0).wrapping_sub(1), Psn::MAX);
        assert_eq!(Psn::new(0xff_fffe).wrapping_add(5), Psn::new(3));
    }

    #[test]
    fn psn_distance_across_wrap() {
        assert_eq!(Psn::new(0).distance(Psn::MAX), 1);
        assert_eq!(Psn::MAX.distance(Psn::new(0)), -1);
        assert_eq!(Psn::new(5).distance(Psn::new(5)), 0);
        assert_eq!(Psn::new(0x80_0000).distance(Psn::new(0)), -0x80_0000);
        assert_eq!(Psn::new(0x7f_ffff).distance(Psn::new(0)), 0x7f_ffff);
        assert!(Psn::new(2).is_after(Psn::MAX));
        assert!(Psn::MAX.is_before(Psn::new(2)));
        assert_eq!(Psn::new(1).cmp_wrapping(Psn::new(2)), Ordering::Less);
    }

    #[test]
    fn ids_format_in_hex() {
        extern crate std;
        assert_eq!(std::format!("{:?}", Qpn::new(0x11)), "Qpn(0x000011)");
        assert_eq!(std::format!("{}", RKey::new(0xabc)), "0x00000abc");
        assert_eq!(Qpn::new(0xff12_3456).value(), 0x12_3456);
        assert_eq!(PKey::DEFAULT.value(), 0xffff);
    }
}
