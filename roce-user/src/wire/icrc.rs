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
    let mut h = crc32fast::Hasher::new_with_initial(LRH_STATE);
    match ip_hdr.first().map(|b| b >> 4) {
        Some(4) => {
            let mut ip = [0u8; ipv4::HEADER_LEN];
            ip.copy_from_slice(ip_hdr.get(..ipv4::HEADER_LEN).ok_or(WireError::Truncated)?);
            let (tos, ttl, csum) = ipv4::ICRC_MASKED;
            ip[tos] = 0xff;
            ip[ttl] = 0xff;
            ip[csum] = 0xff;
            ip[csum + 1] = 0xff;
            h.update(&ip);
        }
        Some(6) => {
            let mut ip = [0u8; ipv6::HEADER_LEN];
            ip.copy_from_slice(ip_hdr.get(..ipv6::HEADER_LEN).ok_or(WireError::Truncated)?);
            ip[0] |= 0x0f;
            ip[1] = 0xff;
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[ipv6::HOP_LIMIT_OFFSET] = 0xff;
            h.update(&ip);
        }
        _ => return Err(WireError::Malformed("IP version is neither 4 nor 6")),
    }
    let mut u = [0u8; udp::HEADER_LEN];
    u.copy_from_slice(udp_hdr.get(..udp::HEADER_LEN).ok_or(WireError::Truncated)?);
    u[udp::CHECKSUM_OFFSET] = 0xff;
    u[udp::CHECKSUM_OFFSET + 1] = 0xff;
    h.update(&u);
    let mut b = [0u8; bth::HEADER_LEN];
    b.copy_from_slice(roce.get(..bth::HEADER_LEN).ok_or(WireError::Truncated)?);
    b[bth::FECN_BECN_OFFSET] = 0xff;
    h.update(&b);
    h.update(&roce[bth::HEADER_LEN..]);
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

/// The Mellanox RoCE v2 CNP example, IP header to ICRC (reference §1; libconntrack-cm
/// tests/test_cnp.cpp citing the Mellanox community article "RoCEv2 CNP packet format example").
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
    fn rejects_short_inputs() {
        assert!(compute(&[0x45; 10], &[0; 8], &[0; 12]).is_err());
        assert!(compute(&[0x55; 40], &[0; 8], &[0; 12]).is_err());
        assert!(!verify(&MELLANOX_CNP[..20], &MELLANOX_CNP[20..28], &[0; 3]));
    }
}
