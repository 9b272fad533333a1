//! The ABI of `roce_impair`, the tc egress fault and congestion injector: its configuration (a
//! one-entry array map user space rewrites live), its per-CPU counters, map and program names.
//!
//! Probabilities are fixed point: `p` is stored as `round(p · 2^32)` in a `u32`, saturated at
//! [`PROB_ONE`] (= `u32::MAX`), which the program treats as "always". A packet is hit when
//! `prob == PROB_ONE || bpf_get_prandom_u32() < prob`, so 0 is never and every other value is
//! exact to 2^-32.

use crate::counter_struct;

/// The tc classifier program.
pub const PROG_ROCE_IMPAIR: &str = "roce_impair";
/// Array with one [`ImpairConfig`].
pub const MAP_IMPAIR_CONFIG: &str = "ROCE_IMPAIR_CONFIG";
/// Per-CPU array with one [`ImpairStats`].
pub const MAP_IMPAIR_STATS: &str = "ROCE_IMPAIR_STATS";
/// Array with one [`BottleneckState`] (shared by all CPUs, updated atomically).
pub const MAP_IMPAIR_BOTTLENECK: &str = "ROCE_IMPAIR_BOTTLENECK";
/// Per-CPU array with one [`HeldPacket`]: the packet held back for reordering.
pub const MAP_IMPAIR_HELD: &str = "ROCE_IMPAIR_HELD";
/// Array with one [`LimitState`] (shared by all CPUs, updated atomically): how much of
/// [`ImpairConfig::limit`] is used.
pub const MAP_IMPAIR_LIMIT: &str = "ROCE_IMPAIR_LIMIT";

/// Probability 1.
pub const PROB_ONE: u32 = u32::MAX;

/// `skb->mark` of the copies `roce_impair` transmits itself (duplicates, released packets): when
/// such a copy passes the hook again it goes out untouched, and its mark is cleared to 0.
pub const IMPAIR_MARK: u32 = 0x524f_4345; // "ROCE"

/// Largest frame the reorder slot holds; longer RoCE frames are never held back. A power of
/// two, so the program can bound lengths for the verifier with a mask.
pub const HELD_MAX: usize = 8192;

/// Converts a probability in [0, 1] to fixed point (NaN and negatives are 0, above 1 is 1).
#[must_use]
pub fn prob_to_fixed(p: f64) -> u32 {
    if p.is_nan() || p <= 0.0 {
        0
    } else if p >= 1.0 {
        PROB_ONE
    } else {
        // p < 1, so the product is below 2^32; rounding can reach 2^32 only for p within
        // 2^-33 of 1, which saturates to PROB_ONE.
        // `as u64` truncates, so adding 0.5 rounds half up (f64::round is not in core).
        let v = (p * 4_294_967_296.0 + 0.5) as u64;
        if v >= u64::from(PROB_ONE) {
            PROB_ONE
        } else {
            v as u32
        }
    }
}

/// Converts fixed point back to a probability.
#[must_use]
pub fn prob_from_fixed(v: u32) -> f64 {
    if v == PROB_ONE {
        1.0
    } else {
        f64::from(v) / 4_294_967_296.0
    }
}

/// Value of [`MAP_IMPAIR_CONFIG`]. All zero: nothing is impaired (every RoCE packet is only
/// counted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImpairConfig {
    /// UDP destination port taken to be RoCE v2 (0: 4791).
    pub port: u32,
    /// Probability of dropping a packet.
    pub drop: u32,
    /// Probability of sending a packet twice.
    pub dup: u32,
    /// Probability of holding a packet back until the next RoCE packet has gone out.
    pub reorder: u32,
    /// Probability of flipping one bit after the BTH (the ICRC is left as it was).
    pub corrupt: u32,
    /// Probability of setting ECN to CE (11).
    pub ce: u32,
    /// Bottleneck: marking probability at Kmax.
    pub pmax: u32,
    /// Selector: 0 impairs every RoCE packet; otherwise only CM MADs with this attribute ID
    /// (a `crate::mad::CmAttr`) are impaired: UD SEND_ONLY to QP 1 ([`crate::mad::GSI_QPN`])
    /// whose MAD has management class CM and this `AttributeID`. Every other RoCE packet goes
    /// on untouched (`unselected`).
    pub mad_attr: u32,
    /// Bottleneck drain rate in bits/s; 0: no bottleneck.
    pub rate_bps: u64,
    /// Bottleneck: no CE marks at or below this virtual backlog (bytes).
    pub kmin_bytes: u64,
    /// Bottleneck: every packet is marked above this virtual backlog (bytes); between Kmin and
    /// Kmax the probability rises linearly from 0 to `pmax`.
    pub kmax_bytes: u64,
    /// Bottleneck: packets that would take the virtual backlog past this are dropped (bytes).
    pub max_backlog_bytes: u64,
    /// Bottleneck: picoseconds per byte at `rate_bps` (`8e12 / rate_bps`, at least 1), what the
    /// program computes with (it has no 128-bit arithmetic). Written by user space.
    pub ps_per_byte: u64,
    /// Impair at most this many packets (0: no limit), counted in [`LimitState`] across CPUs:
    /// a selected packet that drew an impairment once the limit is used up goes on untouched
    /// (`over_limit`). User space zeroes the count whenever it writes the settings.
    pub limit: u64,
}

impl ImpairConfig {
    /// Picoseconds per byte at `rate_bps` (0 for no bottleneck; at least 1 otherwise).
    #[must_use]
    pub const fn ps_per_byte_at(rate_bps: u64) -> u64 {
        match 8_000_000_000_000u64.checked_div(rate_bps) {
            None => 0,
            Some(0) => 1,
            Some(v) => v,
        }
    }
}

/// Value of [`MAP_IMPAIR_BOTTLENECK`]: the virtual queue, kept as the time it will have drained.
/// The backlog at time `now` is `(empty_at_ns - now) · rate / 8e9` bytes when positive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BottleneckState {
    /// `bpf_ktime_get_ns` time at which the virtual queue is empty.
    pub empty_at_ns: u64,
}

/// Value of [`MAP_IMPAIR_LIMIT`]: how many packets were impaired under [`ImpairConfig::limit`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitState {
    /// Packets impaired since user space last wrote the settings; never above the limit (the
    /// program takes a unit by compare-and-swap before it impairs).
    pub used: u64,
}

/// Value of [`MAP_IMPAIR_HELD`]: one frame held back for reordering (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HeldPacket {
    /// Bytes in `data`; 0: the slot is empty.
    pub len: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// When it was held (`bpf_ktime_get_ns`).
    pub held_at_ns: u64,
    /// The frame from its Ethernet header on.
    pub data: [u8; HELD_MAX],
}

counter_struct! {
    /// Per-CPU counters of `roce_impair`, the value type of `ROCE_IMPAIR_STATS`.
    ///
    /// Every packet is counted once in `not_roce`, `own_copies` or `seen`; every RoCE packet
    /// seen ends in exactly one of `passed`, `dropped`, `bottleneck_dropped`,
    /// `bottleneck_early_dropped` or `reordered`
    /// (held back). `duplicated`, `corrupted`, `ce_marked`, `bottleneck_marked` and
    /// `reorder_released` count actions on packets that go on; `unselected` and `over_limit`
    /// count packets that go on untouched (also in `passed`); `errors` counts helper failures.
    pub struct ImpairStats {
        /// Packets that are not RoCE v2 (not IP, not UDP to the RoCE port, too short): untouched.
        not_roce,
        /// RoCE v2 packets seen.
        seen,
        /// Bytes of the RoCE v2 packets seen.
        seen_bytes,
        /// RoCE packets sent on (possibly marked, corrupted or duplicated).
        passed,
        /// RoCE packets dropped at random (--drop).
        dropped,
        /// RoCE packets sent twice (--dup): the copy goes out first.
        duplicated,
        /// RoCE packets held back (--reorder) to go out after the next RoCE packet.
        reordered,
        /// Held packets sent, right after the packet that overtook them.
        reorder_released,
        /// RoCE packets with one bit flipped after the BTH (--corrupt); their ICRC is now wrong.
        corrupted,
        /// RoCE packets whose ECN field was set to CE at random (--ce).
        ce_marked,
        /// ECN-capable RoCE packets CE-marked by the bottleneck's RED curve.
        bottleneck_marked,
        /// RoCE packets dropped because the bottleneck's virtual backlog was full.
        bottleneck_dropped,
        /// Not-ECT RoCE packets the RED curve chose, dropped instead of marked (RFC 3168 §5).
        bottleneck_early_dropped,
        /// Copies made by roce_impair itself seen again on the hook, sent on untouched.
        own_copies,
        /// Helper failures (clone, load, store): that action was not taken.
        errors,
        /// RoCE packets the --mad selector did not choose: sent on untouched.
        unselected,
        /// Chosen packets that drew an impairment after --limit was used up: sent on untouched.
        over_limit,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, u32s then u64s at offset 32: no padding.
    unsafe impl aya::Pod for super::ImpairConfig {}
    // SAFETY: #[repr(C)], Copy, made of u64s.
    unsafe impl aya::Pod for super::ImpairStats {}
    // SAFETY: #[repr(C)], Copy, one u64.
    unsafe impl aya::Pod for super::BottleneckState {}
    // SAFETY: #[repr(C)], Copy, one u64.
    unsafe impl aya::Pod for super::LimitState {}
}

const _: () = assert!(core::mem::size_of::<ImpairConfig>() == 80);
const _: () = assert!(core::mem::size_of::<HeldPacket>() == 16 + HELD_MAX);
const _: () = assert!(HELD_MAX.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_round_trip() {
        assert_eq!(prob_to_fixed(0.0), 0);
        assert_eq!(prob_to_fixed(-1.0), 0);
        assert_eq!(prob_to_fixed(f64::NAN), 0);
        assert_eq!(prob_to_fixed(1.0), PROB_ONE);
        assert_eq!(prob_to_fixed(2.0), PROB_ONE);
        assert_eq!(prob_to_fixed(0.5), 1 << 31);
        assert_eq!(prob_to_fixed(0.25), 1 << 30);
        assert_eq!(prob_from_fixed(1 << 31), 0.5);
        assert_eq!(prob_from_fixed(PROB_ONE), 1.0);
        assert_eq!(prob_to_fixed(1.0 - 1e-12), PROB_ONE);
        assert_eq!(ImpairStats::NAMES[0], "not_roce");
    }
}
