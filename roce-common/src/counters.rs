//! Counter structs and drop reasons: the one source of truth for their names.
//!
//! [`counter_struct!`] turns a list of documented field names into a `#[repr(C)]` struct of `u64`s,
//! its `NAMES` and `HELP` tables, and element-wise addition (to sum per-CPU copies). The same
//! struct is the value of a BTF map, so `bpftool map dump` prints these very field names.

/// Defines a `#[repr(C)]` struct of `u64` counters with name and help tables.
///
/// Each field is written `/// help text` then `name`. The generated struct implements
/// `Default`, `Clone`, `Copy`, `Debug`, and has:
/// - `NAMES: [&str; N]` and `HELP: [&str; N]` in field order;
/// - `values(&self) -> [u64; N]` in field order;
/// - `get(&self, name) -> Option<u64>` and `get_mut`;
/// - `add(&mut self, &Self)` and `saturating_sub(&self, &Self) -> Self` for sums and deltas.
#[macro_export]
macro_rules! counter_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( #[doc = $help:literal] $field:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( #[doc = $help] pub $field: u64, )*
        }

        impl $name {
            /// Number of counters.
            pub const COUNT: usize = [$(stringify!($field)),*].len();
            /// Counter names, in field order.
            pub const NAMES: [&'static str; Self::COUNT] = [$(stringify!($field)),*];
            /// One-line help per counter, in field order.
            pub const HELP: [&'static str; Self::COUNT] = [$($help.trim_ascii()),*];

            /// Counter values, in field order.
            #[must_use]
            pub const fn values(&self) -> [u64; Self::COUNT] {
                [$(self.$field),*]
            }

            /// The value of the counter called `name`.
            #[must_use]
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $( stringify!($field) => Some(self.$field), )*
                    _ => None,
                }
            }

            /// The counter called `name`, for writing.
            pub fn get_mut(&mut self, name: &str) -> Option<&mut u64> {
                match name {
                    $( stringify!($field) => Some(&mut self.$field), )*
                    _ => None,
                }
            }

            /// Adds `other` field by field (wrapping), to sum per-CPU copies.
            pub fn add(&mut self, other: &Self) {
                $( self.$field = self.$field.wrapping_add(other.$field); )*
            }

            /// `self - earlier`, field by field, saturating at zero.
            #[must_use]
            pub const fn saturating_sub(&self, earlier: &Self) -> Self {
                Self { $( $field: self.$field.saturating_sub(earlier.$field), )* }
            }
        }
    };
}

/// Defines the drop reasons and the per-CPU XDP counter struct together, so that each reason has
/// exactly one stable code and one counter field.
macro_rules! xdp_counters {
    (
        counters { $( #[doc = $chelp:literal] $cfield:ident, )* }
        drops { $( #[doc = $dhelp:literal] $reason:ident = $code:literal => $dfield:ident, )* }
    ) => {
        counter_struct! {
            /// Per-CPU counters kept by `roce_xdp`, the value type of the `ROCE_XDP_STATS` map.
            ///
            /// Every frame is counted in `rx_packets` and exactly once in one of the verdict
            /// counters: `redirected`, `redirect_fallback_pass`, `pass_not_roce`, `pass_fragment`,
            /// `pass_foreign_qp`, `drop_foreign_qp` or one `drop_*` reason.
            pub struct XdpStats {
                $( #[doc = $chelp] $cfield, )*
                $( #[doc = $dhelp] $dfield, )*
            }
        }

        /// Why `roce_xdp` dropped a packet. Codes are stable: never renumber or reuse one.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason {
            $( #[doc = $dhelp] $reason = $code, )*
        }

        impl DropReason {
            /// Every reason, in code order.
            pub const ALL: &'static [Self] = &[$(Self::$reason),*];

            /// The reason with this stable code.
            #[must_use]
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $( $code => Some(Self::$reason), )*
                    _ => None,
                }
            }

            /// The name of this reason's counter in [`XdpStats`].
            #[must_use]
            pub const fn counter_name(self) -> &'static str {
                match self {
                    $( Self::$reason => stringify!($dfield), )*
                }
            }
        }

        impl XdpStats {
            /// Counts one packet dropped for `reason`.
            #[inline(always)]
            pub fn count_drop(&mut self, reason: DropReason) {
                match reason {
                    $( DropReason::$reason => self.$dfield += 1, )*
                }
            }
        }
    };
}

xdp_counters! {
    counters {
        /// Frames seen by roce_xdp.
        rx_packets,
        /// Bytes of the frames seen by roce_xdp.
        rx_bytes,
        /// Well-formed RoCE v2 packets (UDP to the RoCE port with a valid BTH).
        roce_packets,
        /// Bytes of the well-formed RoCE v2 packets.
        roce_bytes,
        /// RoCE packets for our QPs redirected to the AF_XDP socket of their RX queue.
        redirected,
        /// RoCE packets for our QPs passed to the kernel because no AF_XDP socket serves their queue.
        redirect_fallback_pass,
        /// Frames that are not RoCE (not IP, not UDP, another port), passed to the kernel.
        pass_not_roce,
        /// IP fragments, which are never RoCE, passed to the kernel.
        pass_fragment,
        /// RoCE packets for QPs that are not ours, passed to the kernel.
        pass_foreign_qp,
        /// RoCE packets for QPs that are not ours, dropped because the program was loaded with --drop-foreign.
        drop_foreign_qp,
        /// RoCE packets that arrived with ECN Congestion Experienced.
        ecn_ce,
        /// RoCE v2 congestion notification packets (opcode 0x81).
        cnp,
    }
    drops {
        /// RoCE port, but the UDP length is shorter than a UDP header or longer than the frame.
        UdpLength = 1 => drop_udp_length,
        /// RoCE port, but the UDP payload is too short to hold a BTH and an ICRC.
        BthTruncated = 2 => drop_bth_truncated,
        /// The BTH transport version is not 0.
        BadTver = 3 => drop_bad_tver,
        /// The opcode is not one of RC, UC, UD or CNP known to roce-xdp.
        UnknownOpcode = 4 => drop_unknown_opcode,
        /// The UDP payload is too short for the opcode's headers, pad and ICRC.
        HdrTruncated = 5 => drop_hdr_truncated,
        /// Destination QP 0, which RoCE never uses.
        ReservedQpn = 6 => drop_reserved_qpn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_are_consistent() {
        assert_eq!(XdpStats::NAMES.len(), XdpStats::HELP.len());
        for r in DropReason::ALL {
            assert_eq!(DropReason::from_code(*r as u8), Some(*r));
            assert!(XdpStats::NAMES.contains(&r.counter_name()));
            let mut s = XdpStats::default();
            s.count_drop(*r);
            assert_eq!(s.get(r.counter_name()), Some(1));
            assert_eq!(s.values().iter().sum::<u64>(), 1);
        }
        assert_eq!(DropReason::from_code(0), None);
    }

    #[test]
    fn add_and_delta() {
        let mut a = XdpStats {
            rx_packets: 3,
            ..Default::default()
        };
        let b = XdpStats {
            rx_packets: 4,
            cnp: 1,
            ..Default::default()
        };
        a.add(&b);
        assert_eq!(a.rx_packets, 7);
        assert_eq!(a.saturating_sub(&b).rx_packets, 3);
        assert_eq!(a.saturating_sub(&b).cnp, 0);
        assert_eq!(core::mem::size_of::<XdpStats>(), 8 * XdpStats::COUNT);
    }
}
