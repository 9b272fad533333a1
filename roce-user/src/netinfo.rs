//! What the endpoint needs to know about its interface, asked of the kernel through iproute2's
//! JSON output in the current network namespace: MAC, MTU, addresses (the GID table), and the
//! MAC of a peer (the neighbour table, with resolution triggered when an entry is missing: ARP
//! and ND stay with the kernel).
//!
//! # The GID table
//! RoCE v2 GIDs derive from the interface's IP addresses (IBA A17.8): an IPv4 address `a.b.c.d`
//! gives `::ffff:a.b.c.d`, an IPv6 address gives itself. Index order follows the kernel's
//! (`ip addr` order) with IPv6 link-local first, as rxe lists its RoCE v2 entries: so `-g 0` is
//! the link-local GID and the first IPv4 GID comes after it.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

/// Why a lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum NetInfoError {
    /// iproute2 could not be run or failed.
    #[error("`ip {args}` failed: {msg}")]
    Ip {
        /// The arguments.
        args: String,
        /// What went wrong.
        msg: String,
    },
    /// The interface does not exist here.
    #[error("no such interface: {0}")]
    NoSuchInterface(String),
    /// No GID at that index.
    #[error("{ifname} has no GID index {index} (it has {count}; see `roce gids -i {ifname}`)")]
    NoGid {
        /// Interface.
        ifname: String,
        /// Index asked for.
        index: usize,
        /// GIDs it has.
        count: usize,
    },
    /// The neighbour did not resolve in time.
    #[error(
        "no MAC address for {ip} on {ifname} after {waited:?} (is the peer up and on this link?)"
    )]
    Unresolved {
        /// Peer.
        ip: IpAddr,
        /// Interface.
        ifname: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The kernel has no route to the address through the interface.
    #[error("no route to {dst} through {ifname}: {msg}")]
    NoRoute {
        /// Destination.
        dst: IpAddr,
        /// Interface.
        ifname: String,
        /// What `ip route get` said.
        msg: String,
    },
}

fn ip_json(args: &[&str]) -> Result<Value, NetInfoError> {
    let shown = args.join(" ");
    let out = Command::new("ip")
        .arg("-j")
        .args(args)
        .output()
        .map_err(|e| NetInfoError::Ip {
            args: shown.clone(),
            msg: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(NetInfoError::Ip {
            args: shown,
            msg: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Array(Vec::new()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| NetInfoError::Ip {
        args: shown,
        msg: e.to_string(),
    })
}

/// The IP whose MAC a packet to `dst` leaving `ifname` is addressed to: the route's gateway when
/// `dst` is reached through a router, else `dst` itself (on-link). Call it before
/// [`resolve_mac`] when building an address vector, so that routed paths (a peer behind a router,
/// as with `roce impair` on a router namespace) resolve the router's MAC, as the kernel's rxe does
/// through its route lookup (`rxe_find_route`).
///
/// # Errors
/// [`NetInfoError::NoRoute`] when there is no route to `dst` through `ifname`;
/// [`NetInfoError::Ip`] when `ip` cannot be run or says something unreadable.
pub fn next_hop(ifname: &str, dst: IpAddr) -> Result<IpAddr, NetInfoError> {
    let args = ["route", "get", &dst.to_string(), "oif", ifname];
    let unreadable = |msg: String| NetInfoError::Ip {
        args: args.join(" "),
        msg,
    };
    let out = Command::new("ip")
        .arg("-j")
        .args(args)
        .output()
        .map_err(|e| unreadable(e.to_string()))?;
    if !out.status.success() {
        return Err(NetInfoError::NoRoute {
            dst,
            ifname: ifname.to_owned(),
            msg: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| unreadable(e.to_string()))?;
    Ok(gateway_of(&v).unwrap_or(dst))
}

/// The `gateway` of the first route in `ip -j route get` output, if any.
fn gateway_of(v: &Value) -> Option<IpAddr> {
    v.as_array()?.first()?["gateway"].as_str()?.parse().ok()
}

/// Parses `aa:bb:cc:dd:ee:ff`.
#[must_use]
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .filter_map(|p| u8::from_str_radix(p, 16).ok())
        .collect();
    (parts.len() == 6 && s.len() == 17).then(|| {
        let mut m = [0u8; 6];
        m.copy_from_slice(&parts);
        m
    })
}

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Gid {
    /// The 16 bytes.
    #[serde(skip)]
    pub raw: [u8; 16],
    /// The IP address it stands for.
    pub ip: IpAddr,
}

impl Gid {
    /// The GID of an IP address.
    #[must_use]
    pub fn of(ip: IpAddr) -> Self {
        let raw = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        Self { raw, ip }
    }
}

/// The interface facts the endpoint uses.
#[derive(Clone, Debug, serde::Serialize)]
pub struct IfInfo {
    /// Name.
    pub ifname: String,
    /// Index.
    pub ifindex: u32,
    /// MAC address.
    #[serde(serialize_with = "ser_mac")]
    pub mac: [u8; 6],
    /// IP MTU.
    pub mtu: u32,
    /// RX queues.
    pub rx_queues: u32,
    /// The GID table, index order.
    pub gids: Vec<Gid>,
}

fn ser_mac<S: serde::Serializer>(m: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_mac(m))
}

/// `aa:bb:cc:dd:ee:ff`.
#[must_use]
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The RX queues in use (`ethtool -l`: current RX plus combined channels). `ip` reports the
/// allocated maximum, which a socket cannot bind beyond the active count.
fn active_rx_queues(ifname: &str) -> Option<u32> {
    let out = Command::new("ethtool").args(["-l", ifname]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_channels(&String::from_utf8_lossy(&out.stdout))
}

/// Parses `ethtool -l` text: the "Current hardware settings" RX and Combined counts, summed.
#[must_use]
pub fn parse_channels(text: &str) -> Option<u32> {
    let current = text.split("Current hardware settings:").nth(1)?;
    let field = |name: &str| {
        current
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    let n = field("RX:") + field("Combined:");
    (n > 0).then_some(n)
}

/// The GID table from `ip -j addr show` output (one interface object).
#[must_use]
pub fn gids_from_addr_info(link: &Value) -> Vec<Gid> {
    let mut link_local = Vec::new();
    let mut rest = Vec::new();
    for a in link["addr_info"].as_array().into_iter().flatten() {
        let Some(ip) = a["local"].as_str().and_then(|s| s.parse::<IpAddr>().ok()) else {
            continue;
        };
        match ip {
            IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => link_local.push(Gid::of(ip)),
            _ => rest.push(Gid::of(ip)),
        }
    }
    link_local.extend(rest);
    link_local
}

impl IfInfo {
    /// Reads the facts of `ifname` in the current network namespace.
    ///
    /// # Errors
    /// [`NetInfoError`] if the interface does not exist or iproute2 fails.
    pub fn query(ifname: &str) -> Result<Self, NetInfoError> {
        let v = ip_json(&["-d", "addr", "show", "dev", ifname])
            .map_err(|_| NetInfoError::NoSuchInterface(ifname.to_owned()))?;
        let link = v
            .get(0)
            .ok_or_else(|| NetInfoError::NoSuchInterface(ifname.to_owned()))?;
        Ok(Self {
            ifname: ifname.to_owned(),
            ifindex: link["ifindex"].as_u64().unwrap_or(0) as u32,
            mac: link["address"]
                .as_str()
                .and_then(parse_mac)
                .unwrap_or([0; 6]),
            mtu: link["mtu"].as_u64().unwrap_or(1500) as u32,
            rx_queues: active_rx_queues(ifname).unwrap_or(1),
            gids: gids_from_addr_info(link),
        })
    }

    /// GID `index`.
    ///
    /// # Errors
    /// [`NetInfoError::NoGid`].
    pub fn gid(&self, index: usize) -> Result<Gid, NetInfoError> {
        self.gids
            .get(index)
            .copied()
            .ok_or_else(|| NetInfoError::NoGid {
                ifname: self.ifname.clone(),
                index,
                count: self.gids.len(),
            })
    }

    /// The index of the first GID of the given family (IPv4-mapped when `v4`), else 0.
    #[must_use]
    pub fn default_gid_index(&self, v4: bool) -> usize {
        self.gids
            .iter()
            .position(|g| g.ip.is_ipv4() == v4)
            .unwrap_or(0)
    }

    /// The largest RoCE path MTU (256..4096) that fits this interface: IP MTU minus the IPv4 or
    /// IPv6, UDP, BTH, largest extended header and ICRC bytes, rounded down to a power of two.
    #[must_use]
    pub fn max_path_mtu(&self, ipv6: bool) -> u32 {
        let overhead = if ipv6 { 40 } else { 20 } + 8 + 12 + 28 + 4;
        let room = self.mtu.saturating_sub(overhead);
        [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| *m <= room)
            .unwrap_or(256)
    }
}

/// The MAC address of `ip` on `ifname`, from the neighbour table; if there is no usable entry,
/// has the kernel resolve it (sends one UDP datagram to the discard port, which makes the kernel
/// ARP or ND) and waits up to `wait`.
///
/// # Errors
/// [`NetInfoError::Unresolved`] when no entry appears in time.
pub fn resolve_mac(ifname: &str, ip: IpAddr, wait: Duration) -> Result<[u8; 6], NetInfoError> {
    let lookup = || -> Option<[u8; 6]> {
        let v = ip_json(&["neigh", "show", "to", &ip.to_string(), "dev", ifname]).ok()?;
        v.as_array()?.iter().find_map(|n| {
            let state = n["state"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_str).collect::<Vec<_>>());
            let failed =
                state.is_some_and(|s| s.iter().any(|x| *x == "FAILED" || *x == "INCOMPLETE"));
            if failed {
                None
            } else {
                n["lladdr"].as_str().and_then(parse_mac)
            }
        })
    };
    if let Some(m) = lookup() {
        return Ok(m);
    }
    let start = Instant::now();
    let bind: SocketAddr = match ip {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let mut next_probe = start;
    while start.elapsed() < wait {
        if Instant::now() >= next_probe {
            if let Ok(s) = UdpSocket::bind(bind) {
                let _ = s.send_to(&[], SocketAddr::new(ip, 9));
            }
            next_probe = Instant::now() + Duration::from_millis(300);
        }
        std::thread::sleep(Duration::from_millis(20));
        if let Some(m) = lookup() {
            return Ok(m);
        }
    }
    Err(NetInfoError::Unresolved {
        ip,
        ifname: ifname.to_owned(),
        waited: wait,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hop_is_the_gateway_when_routed() {
        let routed: Value = serde_json::from_str(
            r#"[{"dst":"10.78.0.2","gateway":"10.77.0.1","dev":"r0","prefsrc":"10.77.0.2","flags":[],"uid":0,"cache":[]}]"#,
        )
        .unwrap();
        assert_eq!(gateway_of(&routed), Some("10.77.0.1".parse().unwrap()));
        let on_link: Value = serde_json::from_str(
            r#"[{"dst":"10.77.0.3","dev":"r0","prefsrc":"10.77.0.2","flags":[],"uid":0,"cache":[]}]"#,
        )
        .unwrap();
        assert_eq!(gateway_of(&on_link), None);
        assert_eq!(gateway_of(&Value::Array(vec![])), None);
    }

    #[test]
    fn gid_table_puts_link_local_first() {
        let link: Value = serde_json::from_str(
            r#"{"ifindex":5,"address":"02:00:00:00:00:01","mtu":1500,"addr_info":[
                {"family":"inet","local":"10.77.0.2","prefixlen":24},
                {"family":"inet6","local":"fd00:77::2","prefixlen":64},
                {"family":"inet6","local":"fe80::1","prefixlen":64}]}"#,
        )
        .unwrap();
        let g = gids_from_addr_info(&link);
        let ips: Vec<String> = g.iter().map(|g| g.ip.to_string()).collect();
        assert_eq!(ips, ["fe80::1", "10.77.0.2", "fd00:77::2"]);
        assert_eq!(
            g[1].raw,
            "::ffff:10.77.0.2".parse::<Ipv6Addr>().unwrap().octets()
        );
    }

    #[test]
    fn path_mtu_fits_the_link() {
        let mut i = IfInfo {
            ifname: "x".into(),
            ifindex: 1,
            mac: [0; 6],
            mtu: 1500,
            rx_queues: 1,
            gids: vec![],
        };
        assert_eq!(i.max_path_mtu(false), 1024);
        i.mtu = 9000;
        assert_eq!(i.max_path_mtu(true), 4096);
        i.mtu = 4200;
        assert_eq!(i.max_path_mtu(false), 4096);
        i.mtu = 4100;
        assert_eq!(i.max_path_mtu(false), 2048);
    }

    #[test]
    fn channels_parse() {
        let veth = "Channel parameters for ppa:\nPre-set maximums:\nRX:\t\t2\nTX:\t\t2\nOther:\t\tn/a\nCombined:\tn/a\nCurrent hardware settings:\nRX:\t\t1\nTX:\t\t1\nOther:\t\tn/a\nCombined:\tn/a\n";
        assert_eq!(parse_channels(veth), Some(1));
        let nic = "Pre-set maximums:\nRX:\t\tn/a\nCombined:\t63\nCurrent hardware settings:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\t1\nCombined:\t8\n";
        assert_eq!(parse_channels(nic), Some(8));
        assert_eq!(parse_channels("garbage"), None);
    }

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("52:54:0a:4d:00:03"),
            Some([0x52, 0x54, 0x0a, 0x4d, 0, 3])
        );
        assert_eq!(parse_mac("52:54:0a:4d:00"), None);
        assert_eq!(parse_mac("zz:54:0a:4d:00:03"), None);
        assert_eq!(
            format_mac(&[0x52, 0x54, 0x0a, 0x4d, 0, 3]),
            "52:54:0a:4d:00:03"
        );
    }
}
