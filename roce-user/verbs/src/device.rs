//! Which devices the library shows, and what it says about them: safe Rust, no FFI.
//!
//! A device is a Linux interface roce-xdp serves. The list comes from, in this order:
//! 1. `ROCE_DEVICES`, a comma-separated list of interface names (`roce exec -d IFACE` sets it):
//!    an explicit choice wins, and an interface named there that does not exist is left out
//!    with a warning on stderr (a program then sees "no devices", as with no RDMA NIC);
//! 2. otherwise every interface where `roce load` attached roce_xdp (a directory under
//!    `/sys/fs/bpf/roce/` with a pinned link, whose interface exists in this network
//!    namespace): the interfaces an administrator prepared. (A program that opens a device
//!    loads roce_xdp for itself and holds its link instead of pinning it; such interfaces are
//!    not listed to others.) A program started with `ip netns exec` has a /sys of its own
//!    without the BPF filesystem; the pins are then read through the view of a process in
//!    another mount namespace (`roce::loader::bpffs`).
//!
//! A device is named `roce_<ifname>` (rxe names its devices `rxe<N>`; ours carry the interface
//! so `-d` in perftest reads naturally), and its node GUID is the interface MAC as a modified
//! EUI-64, as rxe derives it (`rxe_init_device_param`: `addrconf_addr_eui48`).

use std::{net::IpAddr, path::Path};

use nix::net::if_::InterfaceFlags;
use roce::{
    loader::{PIN_LINK, ifindex, pin_root},
    netinfo::IfInfo,
};

/// The environment variable that names the interfaces to serve.
pub use roce::api::env::DEVICES_ENV;

/// The prefix of every device name.
pub const NAME_PREFIX: &str = "roce_";

/// The interfaces to show as devices, by the rules of the module doc.
#[must_use]
pub fn interfaces() -> Vec<String> {
    interfaces_from(
        std::env::var(DEVICES_ENV).ok().as_deref(),
        &pin_root(),
        |i| ifindex(i).is_ok(),
    )
}

/// [`interfaces`] with its inputs given: the value of [`DEVICES_ENV`], the pin root and
/// whether an interface exists in this network namespace (by index: /sys/class/net shows the
/// namespace that mounted /sys, not necessarily ours).
fn interfaces_from(env: Option<&str>, pins: &Path, is_if: impl Fn(&str) -> bool) -> Vec<String> {
    let exists = |i: &str| !i.is_empty() && !i.contains('/') && is_if(i);
    if let Some(list) = env {
        return list
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .filter(|i| {
                let ok = exists(i);
                if !ok {
                    eprintln!(
                        "libibverbs (roce-xdp): {DEVICES_ENV} names {i:?}, which is not an interface in this network namespace"
                    );
                }
                ok
            })
            .map(str::to_owned)
            .collect();
    }
    let mut found: Vec<String> = std::fs::read_dir(pins)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(PIN_LINK).exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|i| exists(i))
        .collect();
    found.sort();
    found
}

/// The device name of interface `ifname`.
#[must_use]
pub fn device_name(ifname: &str) -> String {
    format!("{NAME_PREFIX}{ifname}")
}

/// The node GUID of a port with MAC `mac`, as 8 bytes in network order: the modified EUI-64
/// (the MAC's universal/local bit flipped, `ff:fe` in the middle), as rxe derives it, and as
/// the CM agent on QP 1 sends it ([`roce::ibcm::CaGuid::from_mac`]).
#[must_use]
pub fn node_guid(mac: [u8; 6]) -> [u8; 8] {
    // One derivation for both: the CM sends the same GUID as its LocalCAGUID.
    roce::ibcm::CaGuid::from_mac(mac).0.to_be_bytes()
}

/// The IEEE OUI-less vendor id rxe reports (`RXE_VENDOR_ID`, 0xffffff): not Mellanox's 0x02c9,
/// so perftest keeps to the plain verbs (reference: verbs-cm-multipath.md 1.5).
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// What a device says about itself, read once when it is opened: the interface facts.
#[derive(Clone, Debug)]
pub struct Port {
    /// The interface.
    pub info: IfInfo,
}

impl Port {
    /// The GID table as RoCE v2 entries (IPv6 link-local first, then the interface's other
    /// addresses, IPv4 as IPv4-mapped), as `roce perf` numbers them.
    #[must_use]
    pub fn gids(&self) -> Vec<[u8; 16]> {
        self.info.gids.iter().map(|g| g.raw).collect()
    }

    /// The active path MTU (an `ibv_mtu` code, 1 = 256 ... 5 = 4096): the largest that fits the
    /// link for IPv4 frames, as `roce perf` chooses it.
    #[must_use]
    pub fn active_mtu_code(&self) -> u32 {
        mtu_code(self.info.max_path_mtu(false))
    }

    /// Whether the interface is up and running (the port is ACTIVE), read from this network
    /// namespace's interface flags.
    #[must_use]
    pub fn is_up(&self) -> bool {
        nix::ifaddrs::getifaddrs().is_ok_and(|mut all| {
            all.any(|a| {
                a.interface_name == self.info.ifname
                    && a.flags
                        .contains(InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING)
            })
        })
    }

    /// Whether `ip` is one of the port's addresses.
    #[must_use]
    pub fn has_ip(&self, ip: IpAddr) -> bool {
        self.info.gids.iter().any(|g| g.ip == ip)
    }
}

/// The `enum ibv_mtu` code of a path MTU in bytes (256 → 1 ... 4096 → 5; below 256 → 1).
#[must_use]
pub fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_the_modified_eui64_of_the_mac() {
        assert_eq!(
            node_guid([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]),
            [0x00, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]
        );
    }

    #[test]
    fn the_environment_wins_and_unknown_interfaces_are_left_out() {
        let dir = std::env::temp_dir().join(format!("roce-verbs-test-{}", std::process::id()));
        let (pins, net) = (dir.join("pins"), dir.join("net"));
        for d in [
            pins.join("eth1"),
            pins.join("eth2"),
            pins.join("gone"),
            net.join("eth1"),
            net.join("eth2"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        // eth1 and gone were prepared by `roce load` (a pinned link); eth2's pins are held by a
        // process for itself, or left by one that was killed.
        for d in ["eth1", "gone"] {
            std::fs::write(pins.join(d).join(PIN_LINK), b"").unwrap();
        }
        let is_if = |i: &str| net.join(i).exists();
        assert_eq!(interfaces_from(None, &pins, is_if), ["eth1"]);
        assert_eq!(
            interfaces_from(Some("eth2, nosuch,,../x"), &pins, is_if),
            ["eth2"]
        );
        assert!(interfaces_from(Some(""), &pins, is_if).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mtu_codes_follow_ibv_mtu() {
        assert_eq!(
            [256, 512, 1024, 1500, 2048, 4096, 9000].map(mtu_code),
            [1, 2, 3, 3, 4, 5, 5]
        );
    }
}
