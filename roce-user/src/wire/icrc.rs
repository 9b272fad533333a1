//! The RoCE v2 invariant CRC (ICRC, IBA Annex A17.4.1; rxe_icrc.c).
//!
//! CRC-32 (reflected polynomial 0xEDB88320, the zlib CRC) over a pseudo packet:
//! 8 bytes of 0xff standing for the masked LRH, then the IP header with its variant fields
//! set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop
//! limit), the UDP header with the checksum set to 0xffff, the BTH with its byte 4
//! (FECN, BECN, reserved) set to 0xff, and everything after the BTH up to the ICRC. rxe starts
//! from the CRC register after the 8 LRH bytes (seed 0xdebb20e3); we start the zlib CRC from
//! the same state. The ICRC goes on the wire little-endian.
//!
//! One pass over the bytes: the masked headers are copied onto the stack (at most 60 bytes),
//! the payload is fed in place.

use roce_common::hdr::ICRC_LEN;

use super::{Result, WireError, bth, ipv4, ipv6, udp};

/// The CRC register after the 8 masked LRH bytes, as rxe seeds it (`0xdebb20e3`).
pub const RXE_SEED: u32 = 0xdebb_20e3;

/// The same state in crc32fast's (finalized) convention: `crc32([0xff; 8])`.
const LRH_STATE: u32 = !RXE_SEED;

/// Computes the ICRC.
///
/// `ip_hdr` is the 20-byte IPv4 or 40-byte IPv6 header (told apart by its version nibble),
/// `udp_hdr` the 8-byte UDP header, `roce` the UDP payload without its last four bytes (the
/// ICRC itself): BTH, extended headers, payload and pad. Call it on receive through
/// [`verify`] or [`super::parse_frame`], and on transmit through [`super::emit_frame`].
pub fn compute(ip_hdr: &[u8], udp_hdr: &[u8], roce: &[u8]) -> Result<u32> {
    // The masked IP, UDP and BTH headers side by side on the stack, fed in one update; then
    // the rest of the packet in place.
    let mut hdr = [0u8; ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN];
    let ip_len = match ip_hdr.first().map(|b| b >> 4) {
        Some(4) => {
            let ip = &mut hdr[..ipv4::HEADER_LEN];
            ip.copy_from_slice(ip_hdr.get(..ipv4::HEADER_LEN).ok_or(WireError::Truncated)?);
            let (tos, ttl, csum) = ipv4::ICRC_MASKED;
            ip[tos] = 0xff;
            ip[ttl] = 0xff;
            ip[csum] = 0xff;
            ip[csum + 1] = 0xff;
            ipv4::HEADER_LEN
        }
        Some(6) => {
            let ip = &mut hdr[..ipv6::HEADER_LEN];
            ip.copy_from_slice(ip_hdr.get(..ipv6::HEADER_LEN).ok_or(WireError::Truncated)?);
            ip[0] |= 0x0f;
            ip[1] = 0xff;
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[ipv6::HOP_LIMIT_OFFSET] = 0xff;
            ipv6::HEADER_LEN
        }
        _ => return Err(WireError::Malformed("IP version is neither 4 nor 6")),
    };
    let u = &mut hdr[ip_len..ip_len + udp::HEADER_LEN];
    u.copy_from_slice(udp_hdr.get(..udp::HEADER_LEN).ok_or(WireError::Truncated)?);
    u[udp::CHECKSUM_OFFSET] = 0xff;
    u[udp::CHECKSUM_OFFSET + 1] = 0xff;
    let b_off = ip_len + udp::HEADER_LEN;
    let b = &mut hdr[b_off..b_off + bth::HEADER_LEN];
    b.copy_from_slice(roce.get(..bth::HEADER_LEN).ok_or(WireError::Truncated)?);
    b[bth::FECN_BECN_OFFSET] = 0xff;
    let mut h = crc32fast::Hasher::new_with_initial(LRH_STATE);
    h.update(&hdr[..b_off + bth::HEADER_LEN]);
    h.update(&roce[bth::HEADER_LEN..]);
    Ok(h.finalize())
}

/// A 16-byte chunk of the headers (its offset in the datagram) and the bits the ICRC sets to
/// one in it, little-endian: byte `i` of the chunk is byte `i` of the mask. The masked bytes
/// of every chunk lie inside the shortest valid datagram (40 bytes for IPv4, 60 for IPv6).
type MaskChunk = (usize, u128);

/// A mask with `0xff` at each byte index of `bytes` and `first` ORed into byte 0.
const fn chunk_mask(first: u8, bytes: &[usize]) -> u128 {
    let mut m = first as u128;
    let mut i = 0;
    while i < bytes.len() {
        m |= 0xff << (8 * bytes[i]);
        i += 1;
    }
    m
}

/// IPv4: TOS (1), TTL (8), header checksum (10, 11); UDP checksum (26, 27); BTH byte 4 (32).
const V4_MASKS: [MaskChunk; 3] = [
    (0, chunk_mask(0, &[1, 8, 10, 11])),
    (16, chunk_mask(0, &[10, 11])),
    (32, chunk_mask(0, &[0])),
];
/// IPv6: traffic class and flow label (low nibble of 0, 1..=3), hop limit (7); UDP checksum
/// (46, 47); BTH byte 4 (52).
const V6_MASKS: [MaskChunk; 3] = [
    (0, chunk_mask(0x0f, &[1, 2, 3, 7])),
    (32, chunk_mask(0, &[14, 15])),
    (48, chunk_mask(0, &[4])),
];

// The chunk masks say the same as the field offsets of the headers.
const _: () = {
    let (tos, ttl, csum) = ipv4::ICRC_MASKED;
    assert!(tos == 1 && ttl == 8 && csum == 10);
    assert!(udp::CHECKSUM_OFFSET == 6 && bth::FECN_BECN_OFFSET == 4);
    assert!(ipv6::HOP_LIMIT_OFFSET == 7);
    // The short-datagram path masks the last chunk's one byte alone, and needs the first two
    // chunks inside the shortest datagram (40 bytes for IPv4, 60 for IPv6).
    assert!(V4_MASKS[2].1.count_ones() == 8 && V6_MASKS[2].1.count_ones() == 8);
    assert!(V4_MASKS[1].0 + 16 <= 40 && V6_MASKS[1].0 + 16 <= 60);
};

#[inline(always)]
fn load16(b: &[u8], at: usize) -> u128 {
    let mut c = [0u8; 16];
    c.copy_from_slice(&b[at..at + 16]);
    u128::from_le_bytes(c)
}

#[inline(always)]
fn store16(b: &mut [u8], at: usize, v: u128) {
    b[at..at + 16].copy_from_slice(&v.to_le_bytes());
}

/// Computes the ICRC over a contiguous datagram `l3` (IP header up to, not including, the
/// ICRC) by masking the variant fields in place, hashing the bytes in one pass, and putting
/// the fields back. Same result as [`compute`], no copy at all; use it where the buffer is
/// writable (emit, or a received frame the engine owns). On error the buffer is left
/// unchanged.
///
/// The masking is three 16-byte read-modify-writes of the header chunks that hold variant
/// fields (the last one a single byte for a datagram shorter than that chunk, such as an ACK), so
/// it costs a few instructions and the hash's own 16-byte loads of those chunks are forwarded
/// from whole stores.
pub fn compute_in_place(l3: &mut [u8]) -> Result<u32> {
    // One copy of the body per IP version, so the masks are immediates.
    match l3.first().map(|b| b >> 4) {
        Some(4) => masked_crc(l3, ipv4::HEADER_LEN, &V4_MASKS),
        Some(6) => masked_crc(l3, ipv6::HEADER_LEN, &V6_MASKS),
        _ => Err(WireError::Malformed("IP version is neither 4 nor 6")),
    }
}

#[inline(always)]
fn masked_crc(l3: &mut [u8], ip_len: usize, masks: &[MaskChunk; 3]) -> Result<u32> {
    if l3.len() < ip_len + udp::HEADER_LEN + bth::HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let [(a0, m0), (a1, m1), (a2, m2)] = *masks;
    let mut h = crc32fast::Hasher::new_with_initial(LRH_STATE);
    if l3.len() >= a2 + 16 {
        let (o0, o1, o2) = (load16(l3, a0), load16(l3, a1), load16(l3, a2));
        store16(l3, a0, o0 | m0);
        store16(l3, a1, o1 | m1);
        store16(l3, a2, o2 | m2);
        h.update(l3);
        store16(l3, a0, o0);
        store16(l3, a1, o1);
        store16(l3, a2, o2);
    } else {
        // Shorter than the last chunk (an ACK, say): its one masked byte byte by byte.
        let last = a2 + (m2.trailing_zeros() / 8) as usize;
        let (o0, o1, ol) = (load16(l3, a0), load16(l3, a1), l3[last]);
        store16(l3, a0, o0 | m0);
        store16(l3, a1, o1 | m1);
        l3[last] = 0xff;
        h.update(l3);
        store16(l3, a0, o0);
        store16(l3, a1, o1);
        l3[last] = ol;
    }
    Ok(h.finalize())
}

/// Checks the ICRC at the end of `roce_with_icrc` (the whole UDP payload). Returns `false`
/// on a mismatch or a malformed input. Under `cfg(fuzzing)` it always answers `true`, so the
/// fuzzer reaches the code behind it (smoltcp does the same for checksums).
#[must_use]
pub fn verify(ip_hdr: &[u8], udp_hdr: &[u8], roce_with_icrc: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    let Some(split) = roce_with_icrc.len().checked_sub(ICRC_LEN) else {
        return false;
    };
    let (covered, icrc) = roce_with_icrc.split_at(split);
    let Ok(want) = compute(ip_hdr, udp_hdr, covered) else {
        return false;
    };
    icrc == want.to_le_bytes()
}

/// [`verify`] over a writable datagram `l3` (IP header to the end of the ICRC), masking in
/// place ([`compute_in_place`]); the buffer is unchanged afterwards. `true` under
/// `cfg(fuzzing)`.
#[must_use]
pub fn verify_in_place(l3: &mut [u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    let Some(split) = l3.len().checked_sub(ICRC_LEN) else {
        return false;
    };
    let (covered, icrc) = l3.split_at_mut(split);
    compute_in_place(covered).is_ok_and(|want| *icrc == want.to_le_bytes())
}

#[cfg(test)]
pub(crate) const MELLANOX_CNP: [u8; 60] = [
    0x45, 0x89, 0x00, 0x3c, 0x98, 0xc6, 0x40, 0x00, 0x20, 0x11, 0x69, 0x27, 0x16, 0x16, 0x16, 0x08,
    0x16, 0x16, 0x16, 0x07, 0xdb, 0xae, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff,
    0x40, 0x00, 0x00, 0xd2, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xda, 0xfc, 0x1b, 0xef,
];

#[cfg(test)]
mod tests {
    use super::MELLANOX_CNP;
    use super::*;

    #[test]
    fn seed_matches_rxe() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), LRH_STATE);
    }

    #[test]
    fn mellanox_cnp_golden_vector() {
        let (ip, rest) = MELLANOX_CNP.split_at(20);
        let (udp, roce) = rest.split_at(8);
        assert_eq!(
            compute(ip, udp, &roce[..roce.len() - 4]).unwrap(),
            0xef1b_fcda
        );
        assert!(verify(ip, udp, roce));
        let mut bad = MELLANOX_CNP;
        bad[40] ^= 1;
        let (ip, rest) = bad.split_at(20);
        let (udp, roce) = rest.split_at(8);
        assert!(!verify(ip, udp, roce));
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let mut v = MELLANOX_CNP;
        v[1] = 0x03; // TOS: CE mark
        v[8] = 0x01; // TTL
        v[10] = 0x12; // IP checksum
        v[26] = 0x34; // UDP checksum
        v[32] = 0x80; // FECN instead of BECN
        let (ip, rest) = v.split_at(20);
        let (udp, roce) = rest.split_at(8);
        assert!(verify(ip, udp, roce));
    }

    #[test]
    fn in_place_matches_and_restores() {
        let mut v = MELLANOX_CNP;
        let end = v.len() - 4;
        assert_eq!(compute_in_place(&mut v[..end]).unwrap(), 0xef1b_fcda);
        assert_eq!(v, MELLANOX_CNP, "buffer restored");
        // IPv6: same as the copying version.
        let mut f = [0u8; 40 + 8 + 12 + 5];
        f[0] = 0x6a;
        f[1] = 0xbc;
        f[7] = 3;
        for (i, b) in f[8..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let want = compute(&f[..40], &f[40..48], &f[48..]).unwrap();
        let orig = f;
        assert_eq!(compute_in_place(&mut f).unwrap(), want);
        assert_eq!(f, orig);
        assert!(compute_in_place(&mut f[..50]).is_err());
    }

    #[test]
    fn in_place_matches_copying_at_every_length() {
        // Short packets (an IPv4 ACK is 44 bytes, the shortest IPv6 datagram 60) mask their
        // last chunk byte by byte; longer ones in 16-byte chunks.
        for (version, min) in [(0x45u8, 40usize), (0x6a, 60)] {
            for len in min..min + 100 {
                let mut f: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
                f[0] = version;
                let ip = if version == 0x45 { 20 } else { 40 };
                let want = compute(&f[..ip], &f[ip..ip + 8], &f[ip + 8..]).unwrap();
                let orig = f.clone();
                assert_eq!(
                    compute_in_place(&mut f).unwrap(),
                    want,
                    "{version:#x} {len}"
                );
                assert_eq!(f, orig, "restored");
            }
        }
    }

    #[test]
    fn rejects_short_inputs() {
        assert!(compute(&[0x45; 10], &[0; 8], &[0; 12]).is_err());
        assert!(compute(&[0x55; 40], &[0; 8], &[0; 12]).is_err());
        assert!(!verify(&MELLANOX_CNP[..20], &MELLANOX_CNP[20..28], &[0; 3]));
    }
}
