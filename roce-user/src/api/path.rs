//! Paths to peers: next-hop resolution with a short cache, and the path MTU checks.

use std::{
    net::IpAddr,
    time::{Duration, Instant as StdInstant},
};

use super::{ApiError, Device, Path, Qpn};
use crate::{
    netinfo::{self, NetInfoError},
    wire::{EthernetAddress, IpPath, PathRepr, frame::udp_src_port},
};

/// Bytes the kernel keeps in front of a received packet in its UMEM frame in copy mode
/// (`XDP_PACKET_HEADROOM`).
pub(crate) const XDP_PACKET_HEADROOM: u32 = 256;

/// Whether a link of IP MTU `mtu` carries frames (Ethernet, two VLAN tags) longer than a
/// received UMEM frame of `frame_size` bytes holds, so that its sockets need multi-buffer
/// packets to see them.
#[must_use]
pub const fn needs_multi_buffer(mtu: u32, frame_size: u32) -> bool {
    mtu + 14 + 8 > frame_size.saturating_sub(XDP_PACKET_HEADROOM)
}

/// How long [`Device::path_to`] reuses a destination's next-hop MAC before asking the routing
/// and neighbour tables again. Connecting many QPs to one peer (`roce perf -q 1024`) then
/// costs one `ip route get` and one neighbour lookup instead of one per QP; a QP keeps the
/// path it was connected with either way.
pub const PATH_CACHE_TTL: Duration = Duration::from_secs(10);

/// Destination IP → (next-hop MAC, when it was resolved), for [`PATH_CACHE_TTL`].
#[derive(Debug, Default)]
pub(crate) struct HopCache(std::collections::HashMap<IpAddr, ([u8; 6], StdInstant)>);

impl HopCache {
    /// The MAC resolved for `dst` less than [`PATH_CACHE_TTL`] before `now`.
    pub(crate) fn get(&self, dst: IpAddr, now: StdInstant) -> Option<[u8; 6]> {
        self.0
            .get(&dst)
            .filter(|(_, at)| now.saturating_duration_since(*at) < PATH_CACHE_TTL)
            .map(|(mac, _)| *mac)
    }

    /// Records `mac` for `dst`, resolved at `now`; forgets entries past their time, so the
    /// cache holds only the destinations of the last [`PATH_CACHE_TTL`].
    pub(crate) fn insert(&mut self, dst: IpAddr, mac: [u8; 6], now: StdInstant) {
        self.0
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < PATH_CACHE_TTL);
        self.0.insert(dst, (mac, now));
    }
}

impl Device {
    /// The largest path MTU this device can carry, for IPv4 or IPv6 paths: what the link's MTU
    /// allows, and, unless the sockets take multi-buffer packets, what one UMEM frame holds.
    #[must_use]
    pub fn max_path_mtu(&self, ipv6: bool) -> u32 {
        let by_link = self.info.max_path_mtu(ipv6);
        if self.multi_buffer {
            return by_link;
        }
        // A received frame starts 256 bytes (XDP_PACKET_HEADROOM) into its UMEM frame.
        let room = self
            .frame_size
            .saturating_sub(XDP_PACKET_HEADROOM + 14 + 8 + 40 + 8 + 12 + 28 + 4);
        let by_frame = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| *m <= room)
            .unwrap_or(256);
        by_link.min(by_frame)
    }

    /// Fails unless a path MTU of `mtu` bytes fits this device (see [`Device::max_path_mtu`]).
    /// Tools call it before their connection setup, so a bad `-m` is reported at once.
    ///
    /// # Errors
    /// [`ApiError::Mtu`], saying what the limit is and why.
    pub fn check_path_mtu(&self, mtu: u32, ipv6: bool) -> Result<(), ApiError> {
        let max = self.max_path_mtu(ipv6);
        if mtu > max {
            return Err(ApiError::Mtu {
                asked: mtu,
                max,
                frame: self.frame_size,
                link: self.info.mtu,
            });
        }
        Ok(())
    }

    /// The address vector from local GID `gid_index` to `remote_gid`: MACs (the next hop's from the
    /// neighbour table, resolved if needed: the peer's on-link, the gateway's when routed), IPs, and the RoCE v2 UDP source port of the QP pair.
    ///
    /// # Errors
    /// Bad GID index, mixed address families, or the peer's MAC does not resolve.
    pub fn path_to(
        &self,
        gid_index: usize,
        remote_gid: &[u8; 16],
        local_qpn: Qpn,
        remote_qpn: Qpn,
    ) -> Result<Path, ApiError> {
        let local = self.gid(gid_index)?;
        let remote_ip = crate::cm::gid_to_ip(remote_gid);
        let now = StdInstant::now();
        let cached = self
            .hops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(remote_ip, now);
        let own = self.info.gids.iter().any(|g| g.ip == remote_ip);
        let dst_mac = match cached {
            // One of this interface's own addresses: loopback, addressed to our own MAC,
            // which the engine hands back to the receive path (engine/driver.rs).
            _ if own => self.info.mac,
            Some(mac) => mac,
            None => {
                let hop = netinfo::next_hop(&self.info.ifname, remote_ip)?;
                let mac = netinfo::resolve_mac(&self.info.ifname, hop, Duration::from_secs(3))?;
                self.hops
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(remote_ip, mac, now);
                mac
            }
        };
        let ip = match (local.ip, remote_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpPath::V4 { src, dst },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpPath::V6 {
                src,
                dst,
                flow_label: 0,
            },
            _ => {
                return Err(ApiError::NetInfo(NetInfoError::Ip {
                    args: "path".into(),
                    msg: format!(
                        "local GID {} and remote GID {remote_ip} are of different families",
                        local.ip
                    ),
                }));
            }
        };
        let mut p = PathRepr::new(EthernetAddress(self.info.mac), EthernetAddress(dst_mac), ip);
        p.udp_src_port = udp_src_port(local_qpn, remote_qpn);
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_buffer_only_where_the_link_carries_frames_longer_than_a_receive_frame() {
        // A received frame holds 4096 - 256 = 3840 bytes; a link frame is MTU + 14 + 8 (two
        // VLAN tags) at most.
        assert!(!needs_multi_buffer(1500, 4096));
        assert!(!needs_multi_buffer(3000, 4096));
        assert!(!needs_multi_buffer(3818, 4096));
        assert!(needs_multi_buffer(3819, 4096));
        assert!(needs_multi_buffer(9000, 4096));
        assert!(needs_multi_buffer(1792 - 22 + 1, 2048));
        assert!(!needs_multi_buffer(1500, 2048));
    }

    #[test]
    fn hop_cache_reuses_a_mac_for_its_ttl_and_then_forgets_it() {
        let t0 = StdInstant::now();
        let (a, b) = (
            IpAddr::from([10, 0, 0, 1]),
            IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 2]),
        );
        let mut c = HopCache::default();
        assert_eq!(c.get(a, t0), None);
        c.insert(a, [2, 0, 0, 0, 0, 1], t0);
        let later = t0 + PATH_CACHE_TTL - Duration::from_millis(1);
        assert_eq!(c.get(a, later), Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(c.get(b, later), None);
        let expired = t0 + PATH_CACHE_TTL;
        assert_eq!(c.get(a, expired), None);
        // Inserting another destination drops the expired entry: the cache stays bounded.
        c.insert(b, [2, 0, 0, 0, 0, 2], expired);
        assert_eq!(c.0.len(), 1);
        assert_eq!(c.get(b, expired), Some([2, 0, 0, 0, 0, 2]));
    }
}
