//! The arrival stamp `roce_xdp` writes into the XDP metadata of every frame it redirects to an
//! AF_XDP socket, and that user space reads in front of the received frame (or, where the
//! kernel allows no metadata, over the frame's destination address).
//!
//! Layout: [`STAMP_LEN`] bytes directly before the packet's first byte (the Ethernet header),
//! one native-endian `u64`: [`STAMP_MAGIC`] in the top 16 bits, the low 48 bits of
//! `bpf_ktime_get_ns()` (CLOCK_MONOTONIC, nanoseconds) below. 48 bits of nanoseconds wrap
//! every 78 hours; [`decode`] puts the stamp back next to the reader's own clock reading, which
//! is always later than the arrival and, for a frame in a ring, by far less than that.
//!
//! How the metadata reaches user space: `bpf_xdp_adjust_meta` reserves the bytes in the
//! `xdp_buff` headroom; AF_XDP copy mode (veth, generic XDP, drivers without zero-copy)
//! copies `data_meta..data_end` into the UMEM frame so that the metadata ends where the RX
//! descriptor's address begins (net/xdp/xsk.c `__xsk_rcv`, `xsk_copy_xdp_start`), and
//! zero-copy drivers leave it in place in front of the same address. A driver whose
//! `xdp_buff` does not support metadata makes `bpf_xdp_adjust_meta` fail: the program then
//! writes nothing, and the bytes in front of the frame are whatever the frame held before. The
//! magic tells the two apart, and the reader clears it after reading (see [`CLEARED`]) so a
//! stale stamp of an earlier packet in the same UMEM frame is never read twice.
//!
//! Where the kernel refuses XDP programs `bpf_xdp_adjust_meta` (`maps::FLAG_STAMP_IN_PLACE`), the
//! program writes the low [`STAMP_BITS`] bits of the same word over the frame's Ethernet
//! destination address instead ([`STAMP_IN_PLACE_LEN`] bytes, [`in_place`]), and the socket
//! writes its interface's address back after reading them: every frame `roce_xdp` redirects
//! was sent to that address (a RoCE NIC takes only frames for its own), so nothing is lost, and
//! no helper is called to make room. Every frame redirected so carries a stamp; there is no
//! "missing" to tell apart and no magic in the frame.
//!
//! The clock is read only for the frames whose arrival time the transport uses: CE-marked
//! packets (the notification point), CNPs (the reaction point) and the responses of QPs whose
//! congestion control samples RTTs from them (Swift; `maps::QP_FLAG_TIME_RESPONSES` in the
//! QP's entry); see `opcode::XDP_TIMED`. Any other frame gets [`UNTIMED`] in the same place,
//! which costs a store and no helper call: `bpf_ktime_get_ns` took 35-55 ns per frame on the
//! wire on Dec 7's VM (the kernel's `ktime_get_mono_fast_ns`, its clocksource read through a
//! retpoline, and every return through the SRSO safe-RET thunk), as much as all of
//! `roce_xdp`'s parsing.

/// Bytes of metadata in front of the frame.
pub const STAMP_LEN: usize = 8;
/// Bytes of the frame a stamp written in place takes (`FLAG_STAMP_IN_PLACE`): the Ethernet
/// destination address, which holds the low [`STAMP_BITS`] bits of the word; see [`in_place`].
pub const STAMP_IN_PLACE_LEN: usize = 6;
/// The top 16 bits of a stamp ("RX").
pub const STAMP_MAGIC: u16 = 0x5258;
/// Bits of the nanosecond clock a stamp keeps.
pub const STAMP_BITS: u32 = 48;
const MASK: u64 = (1 << STAMP_BITS) - 1;
/// What the reader writes over a stamp it has read: no magic.
pub const CLEARED: u64 = 0;
/// A stamp older than this against the reader's clock is taken to be garbage that happened to
/// carry the magic, not an arrival time (1 s: far longer than a frame waits in a ring).
pub const MAX_AGE_NS: u64 = 1_000_000_000;

/// The stamp of a frame that arrived at `ktime_ns` (CLOCK_MONOTONIC).
#[inline(always)]
#[must_use]
pub const fn encode(ktime_ns: u64) -> u64 {
    ((STAMP_MAGIC as u64) << STAMP_BITS) | (ktime_ns & MASK)
}

/// The word in front of a frame whose arrival time the transport does not use (a request
/// without a CE mark, `opcode::XDP_TIMED`): the magic with every time bit set, written without
/// reading the clock. (A clock reading whose low 48 bits are all ones, once in 78 hours for a
/// nanosecond, reads as untimed: the frame then takes its handling time, as without a stamp.)
pub const UNTIMED: u64 = encode(MASK);

/// The stamp word of a frame whose stamp `roce_xdp` wrote in place (`FLAG_STAMP_IN_PLACE`): its
/// first [`STAMP_IN_PLACE_LEN`] bytes, the Ethernet destination address's place, hold the low
/// [`STAMP_BITS`] bits of the clock's reading (or of [`UNTIMED`]) in native byte order, as a
/// four-byte and a two-byte store left them. Give the result to [`classify`].
#[must_use]
pub const fn in_place(bytes: [u8; STAMP_IN_PLACE_LEN]) -> u64 {
    let lo = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let hi = u16::from_ne_bytes([bytes[4], bytes[5]]);
    encode((hi as u64) << 32 | lo as u64)
}

/// What the [`STAMP_LEN`] bytes in front of a received frame say about its arrival
/// ([`classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Arrived at this CLOCK_MONOTONIC time in nanoseconds.
    At(u64),
    /// `roce_xdp` took the frame but did not read the clock for it ([`UNTIMED`]).
    Untimed,
    /// No stamp: no metadata (the driver or kernel allowed none), another program, or garbage.
    Missing,
}

impl Arrival {
    /// The arrival time, if the frame carried one.
    #[must_use]
    pub const fn time(self) -> Option<u64> {
        match self {
            Self::At(t) => Some(t),
            Self::Untimed | Self::Missing => None,
        }
    }
}

/// [`decode`], telling an [`UNTIMED`] word apart from no stamp at all. Call it on the word in
/// front of each received packet, with one clock reading taken after the packet arrived.
#[must_use]
pub const fn classify(word: u64, now_ns: u64) -> Arrival {
    if word == UNTIMED {
        return Arrival::Untimed;
    }
    match decode(word, now_ns) {
        Some(t) => Arrival::At(t),
        None => Arrival::Missing,
    }
}

/// The arrival time (CLOCK_MONOTONIC ns) of the stamp `word`, read at `now_ns` on the same
/// clock; `None` when `word` carries no magic or says the frame arrived after `now_ns` or more
/// than [`MAX_AGE_NS`] before it (not a stamp `roce_xdp` wrote for this frame).
#[must_use]
pub const fn decode(word: u64, now_ns: u64) -> Option<u64> {
    if word >> STAMP_BITS != STAMP_MAGIC as u64 || word == UNTIMED {
        return None;
    }
    let age = (now_ns & MASK).wrapping_sub(word & MASK) & MASK;
    if age > MAX_AGE_NS || age > now_ns {
        return None;
    }
    Some(now_ns - age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wrap() {
        let t = 5_000_000_123;
        assert_eq!(decode(encode(t), t + 1_000), Some(t));
        assert_eq!(decode(encode(t), t), Some(t));
        // Across a wrap of the 48-bit field.
        let w = (1u64 << 48) - 10;
        assert_eq!(decode(encode(w), w + 30), Some(w));
        // Too old, from the future, no magic.
        assert_eq!(decode(encode(t), t + MAX_AGE_NS + 1), None);
        assert_eq!(decode(encode(t + 5), t), None);
        assert_eq!(decode(CLEARED, t), None);
        assert_eq!(decode(t, t), None);
    }

    #[test]
    fn untimed_is_neither_a_time_nor_missing() {
        // At any reading of the clock, also one whose low bits make UNTIMED's time look
        // recent (the all-ones field, just before a wrap).
        for now in [5_000_000_123, MASK, MASK + 1_000, 3 * MASK] {
            assert_eq!(decode(UNTIMED, now), None, "{now}");
            assert_eq!(classify(UNTIMED, now), Arrival::Untimed, "{now}");
            assert_eq!(classify(UNTIMED, now).time(), None);
        }
        let t = 5_000_000_123;
        assert_eq!(classify(encode(t), t + 10), Arrival::At(t));
        assert_eq!(classify(encode(t), t + 10).time(), Some(t));
        assert_eq!(classify(CLEARED, t), Arrival::Missing);
        assert_eq!(classify(encode(t), t + MAX_AGE_NS + 1), Arrival::Missing);
    }
}
