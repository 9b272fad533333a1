//! Address handles in safe Rust: what `ibv_create_ah` accepts, and the address vector
//! `ibv_init_ah_from_wc` reads back from the GRH area of a UD receive buffer. The FFI layer
//! (`ffi/ah.rs`) reads the C structs and calls these.

use core::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce::{
    api::Path,
    wire::{Ecn, ipv4::Packet as Ipv4Packet, ipv6::Packet as Ipv6Packet},
};

/// `IPPROTO_UDP`: the next header of a RoCE v2 GRH.
const NEXT_HDR_UDP: u8 = 17;
/// The next header of a RoCE v1 GRH (IBA: 0x1b, the BTH follows).
const NEXT_HDR_IB: u8 = 0x1b;

/// Whether `dgid` is a multicast GID (IBA 4.1.1: first byte 0xff; an IPv4-mapped GID of a
/// class D address). roce-xdp has no multicast groups (`ibv_attach_mcast`).
#[must_use]
pub fn is_multicast(dgid: &[u8; 16]) -> bool {
    match roce::cm::gid_to_ip(dgid) {
        IpAddr::V4(v4) => v4.is_multicast(),
        IpAddr::V6(v6) => v6.is_multicast(),
    }
}

/// Applies an AH's GRH traffic class to `path` (rxe puts it in the IPv4 TOS or the IPv6
/// traffic class, rxe_net.c `prepare_ipv4_hdr`/`prepare_ipv6_hdr`). The hop limit stays the
/// route's, as the kernel's `ib_resolve_eth_dmac` sets it for RoCE.
pub fn apply_traffic_class(path: &mut Path, traffic_class: u8) {
    path.dscp = traffic_class >> 2;
    path.ecn = Ecn::from_tos(traffic_class);
}

/// The address vector back to the sender of a UD message, from the 40 bytes at the start of
/// its receive buffer (`ibv_init_ah_from_wc`, rdma-core verbs.c): the fields of
/// `struct ibv_global_route` a reply needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrhRoute {
    /// The sender's GID.
    pub dgid: [u8; 16],
    /// The index of our GID the message was sent to.
    pub sgid_index: u8,
    /// The IPv4 TTL or IPv6 hop limit received.
    pub hop_limit: u8,
    /// The IPv4 TOS or IPv6 traffic class received.
    pub traffic_class: u8,
    /// The IPv6 flow label (0 for IPv4), from the GRH's first word as rdma-core reads it.
    pub flow_label: u32,
}

/// Reads the GRH area `grh` of a UD receive: RoCE v2 over IPv4 (the IPv4 header in its last
/// 20 bytes, told apart by version 4, a 20-byte header and a valid checksum, as rdma-core's
/// `get_grh_header_version`) or over IPv6 (the whole IPv6 header). `gids` is the port's GID
/// table, where the destination address is looked up (every entry is RoCE v2).
///
/// # Errors
/// `EPROTONOSUPPORT` when it is neither, or a RoCE v1 header; `EINVAL` for a multicast
/// destination; `ENOENT` when the destination is not one of our GIDs (rdma-core fails there
/// too, from `ibv_find_gid_index`).
pub fn route_from_grh(grh: &[u8; 40], gids: &[[u8; 16]]) -> Result<GrhRoute, c_int> {
    let word0 = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
    let flow_label = word0 & 0xf_ffff;
    let v4 = Ipv4Packet::new_unchecked(&grh[20..40]);
    let is_v4 = if word0 >> 28 == 6 {
        v4.version() == 4 && v4.header_len() == 20 && v4.verify_checksum()
    } else if v4.version() == 4 {
        true
    } else {
        return Err(libc::EPROTONOSUPPORT);
    };
    let find = |gid: [u8; 16]| -> Result<u8, c_int> {
        gids.iter()
            .position(|g| *g == gid)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or(libc::ENOENT)
    };
    if is_v4 {
        let dst: Ipv4Addr = v4.dst_addr();
        if dst.is_multicast() {
            return Err(libc::EINVAL);
        }
        return Ok(GrhRoute {
            dgid: v4.src_addr().to_ipv6_mapped().octets(),
            sgid_index: find(dst.to_ipv6_mapped().octets())?,
            hop_limit: v4.ttl(),
            traffic_class: v4.tos(),
            flow_label,
        });
    }
    let v6 = Ipv6Packet::new_unchecked(&grh[..]);
    let dst: Ipv6Addr = v6.dst_addr();
    if dst.is_multicast() {
        return Err(libc::EINVAL);
    }
    match v6.next_header() {
        NEXT_HDR_UDP => {}
        // RoCE v1: our table holds RoCE v2 GIDs only, so no index matches.
        NEXT_HDR_IB => return Err(libc::ENOENT),
        _ => return Err(libc::EPROTONOSUPPORT),
    }
    Ok(GrhRoute {
        dgid: v6.src_addr().octets(),
        sgid_index: find(dst.octets())?,
        hop_limit: v6.hop_limit(),
        traffic_class: v6.traffic_class(),
        flow_label,
    })
}

#[cfg(test)]
mod tests {
    use roce::wire::{IpRepr, Ipv4Repr, Ipv6Repr};

    use super::*;

    fn gids() -> Vec<[u8; 16]> {
        vec![
            "fe80::1".parse::<Ipv6Addr>().unwrap().octets(),
            Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped().octets(),
            "fd00::2".parse::<Ipv6Addr>().unwrap().octets(),
        ]
    }

    #[test]
    fn an_ipv4_grh_gives_the_sender_and_our_gid_index() {
        let grh = IpRepr::V4(Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            tos: 0x68,
            ident: 7,
            dont_frag: true,
            ttl: 61,
            protocol: 17,
            payload_len: 100,
        })
        .network_header();
        let r = route_from_grh(&grh, &gids()).unwrap();
        assert_eq!(r.dgid, Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets());
        assert_eq!((r.sgid_index, r.hop_limit, r.traffic_class), (1, 61, 0x68));
        // Sent to an address that is not ours.
        assert_eq!(route_from_grh(&grh, &gids()[..1]), Err(libc::ENOENT));
    }

    #[test]
    fn an_ipv6_grh_gives_the_sender_and_our_gid_index() {
        let hdr = Ipv6Repr {
            src_addr: "fd00::1".parse().unwrap(),
            dst_addr: "fd00::2".parse().unwrap(),
            traffic_class: 0x20,
            flow_label: 0x1_2345,
            next_header: 17,
            hop_limit: 9,
            payload_len: 100,
        };
        let r = route_from_grh(&IpRepr::V6(hdr).network_header(), &gids()).unwrap();
        assert_eq!(r.dgid, "fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!((r.sgid_index, r.hop_limit, r.traffic_class), (2, 9, 0x20));
        assert_eq!(r.flow_label, 0x1_2345);
        let mut v1 = hdr;
        v1.next_header = 0x1b;
        assert_eq!(
            route_from_grh(&IpRepr::V6(v1).network_header(), &gids()),
            Err(libc::ENOENT)
        );
        let mut multi = hdr;
        multi.dst_addr = "ff02::1".parse().unwrap();
        assert_eq!(
            route_from_grh(&IpRepr::V6(multi).network_header(), &gids()),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn a_zero_grh_area_is_not_a_roce_v2_header() {
        assert_eq!(
            route_from_grh(&[0; 40], &gids()),
            Err(libc::EPROTONOSUPPORT)
        );
    }

    #[test]
    fn multicast_gids_are_recognised_in_both_families() {
        assert!(is_multicast(
            &"ff0e::1".parse::<Ipv6Addr>().unwrap().octets()
        ));
        assert!(is_multicast(
            &Ipv4Addr::new(239, 1, 1, 1).to_ipv6_mapped().octets()
        ));
        assert!(!is_multicast(&gids()[1]));
    }
}
