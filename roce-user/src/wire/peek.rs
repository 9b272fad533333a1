//! The destination QP number of a frame, read without parsing or checking the rest.
//!
//! A sharded device (one transport per RX queue) must know which transport owns a frame
//! before it takes that transport's lock; [`dest_qpn`] reads only the header bytes on the way
//! to the BTH. The owner then parses and checks the frame in full ([`super::parse_frame`]).

use roce_common::hdr::{ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_UDP};

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The BTH DestQP field (IBA 9.2, low 24 bits of BTH bytes 4..8) of a RoCE v2 Ethernet frame
/// with up to two VLAN tags, over IPv4 (options allowed) or IPv6 without extension headers.
/// `None` when the frame is too short or is not IP/UDP; then hand the frame to any transport,
/// whose parser counts it. Reads no UDP port: roce_xdp steered the frame to the socket, so
/// it was sent to the RoCE port.
#[must_use]
pub fn dest_qpn(frame: &[u8]) -> Option<u32> {
    let mut off = 12;
    let mut ethertype = be16(frame, off)?;
    for _ in 0..2 {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        off += 4;
        ethertype = be16(frame, off)?;
    }
    let l3 = off + 2;
    let udp = match ethertype {
        ETH_P_IPV4 => {
            let ihl = usize::from(frame.get(l3)? & 0x0f) * 4;
            (ihl >= 20 && *frame.get(l3 + 9)? == IPPROTO_UDP).then_some(l3 + ihl)?
        }
        ETH_P_IPV6 => (*frame.get(l3 + 6)? == IPPROTO_UDP).then_some(l3 + 40)?,
        _ => return None,
    };
    let bth = udp + 8;
    let b = frame.get(bth + 5..bth + 8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

#[cfg(test)]
mod tests {
    use core::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::wire::{
        BthRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, Qpn, RoceRepr, VlanTag,
        emit_frame, parse_frame,
    };

    #[test]
    fn reads_the_dest_qp_of_every_address_family_and_tagging() {
        let ips = [
            IpPath::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
            },
            IpPath::V6 {
                src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
                flow_label: 0x12345,
            },
        ];
        let tags = [
            [None, None],
            [Some(VlanTag::dot1q(3, 7)), None],
            [
                Some(VlanTag {
                    tpid: ETH_P_8021AD,
                    tci: 5,
                }),
                Some(VlanTag::dot1q(0, 9)),
            ],
        ];
        for ip in ips {
            for vlan in tags {
                let mut path = PathRepr::new(
                    EthernetAddress([2, 0, 0, 0, 0, 1]),
                    EthernetAddress([2, 0, 0, 0, 0, 2]),
                    ip,
                );
                path.vlan = vlan;
                for qpn in [0u32, 0x11, 0x00ab_cdef, 0x00ff_ffff] {
                    let roce = RoceRepr::new(BthRepr::new(
                        Opcode::RC_SEND_ONLY,
                        Qpn::new(qpn),
                        Psn::new(3),
                    ));
                    let mut buf = [0u8; 256];
                    let n = emit_frame(&path, &roce, &[1, 2, 3, 4], &mut buf).unwrap();
                    let f = &buf[..n];
                    assert_eq!(parse_frame(f).unwrap().roce.bth.dest_qp.value(), qpn);
                    assert_eq!(dest_qpn(f), Some(qpn), "{path:?}");
                    // Every truncation before the end of DestQP is refused, never misread.
                    // DestQP ends 8 bytes into the BTH: before the 4-byte payload and the ICRC.
                    let end = n - 4 - 4 - 12 + 8;
                    for cut in 0..end {
                        assert_eq!(dest_qpn(&f[..cut]), None, "cut at {cut}");
                    }
                    assert_eq!(dest_qpn(&f[..end]), Some(qpn));
                }
            }
        }
        assert_eq!(dest_qpn(&[0u8; 100]), None, "EtherType 0 is not IP");
    }
}
