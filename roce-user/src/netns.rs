//! Network namespaces and veth pairs for `roce demo` and the privileged tests, through iproute2.
//!
//! Everything made here is owned by a guard that removes it on drop, even when a test panics.
//! Entering a namespace ([`enter`]) changes only the calling thread's network namespace, never its
//! mount namespace, so pins under /sys/fs/bpf stay visible (unlike `ip netns exec`, which
//! remounts /sys).

use std::{
    fs::File,
    io,
    net::IpAddr,
    process::{Command, Output},
};

/// Why a namespace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command could not be run.
    #[error("failed to run {cmd}: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A command ran and failed.
    #[error("`{cmd}` failed: {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The namespace does not exist.
    #[error("no such network namespace: {name} ({source})")]
    NoSuchNetns {
        /// Its name.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// setns(2) failed.
    #[error("failed to enter network namespace {name}: {source}")]
    Setns {
        /// Its name.
        name: String,
        /// The error.
        #[source]
        source: nix::Error,
    },
}

/// Runs a command, failing with its stderr if it exits non-zero.
///
/// # Errors
/// [`NetnsError::Spawn`] or [`NetnsError::Failed`].
pub fn run(program: &str, args: &[&str]) -> Result<Output, NetnsError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NetnsError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out)
}

/// Runs `ip -n NETNS args...`.
///
/// # Errors
/// As [`run`].
pub fn ip_in(netns: &str, args: &[&str]) -> Result<Output, NetnsError> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// The name of the network namespace the calling thread is in, found as `ip netns identify`
/// finds it: the entry of `/var/run/netns` that is the same namespace (same device and inode).
/// Call it to record where a program was started with `ip netns exec NAME`; `None` in an
/// unnamed namespace.
#[must_use]
pub fn identify() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/thread-self/ns/net").ok()?;
    std::fs::read_dir("/var/run/netns")
        .ok()?
        .filter_map(Result::ok)
        .find(|e| {
            e.metadata()
                .is_ok_and(|m| m.dev() == own.dev() && m.ino() == own.ino())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// Moves the calling thread into network namespace `name` (as made by `ip netns add`).
/// Call it on a thread of its own, or first thing in `main` before any other thread starts.
///
/// # Errors
/// [`NetnsError::NoSuchNetns`] or [`NetnsError::Setns`].
pub fn enter(name: &str) -> Result<(), NetnsError> {
    let path = format!("/var/run/netns/{name}");
    let f = File::open(&path).map_err(|source| NetnsError::NoSuchNetns {
        name: name.to_owned(),
        source,
    })?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns {
        name: name.to_owned(),
        source,
    })
}

/// Runs `f` on a new thread inside network namespace `name` and returns its result.
///
/// # Errors
/// Entering the namespace failed; `f`'s own errors come back in the `Ok`.
///
/// # Panics
/// If `f` panics, the panic is propagated.
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NetnsError> {
    let name = name.to_owned();
    std::thread::spawn(move || -> Result<T, NetnsError> {
        enter(&name)?;
        Ok(f())
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// A network namespace that is deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates namespace `name` with `lo` up.
    ///
    /// # Errors
    /// If `ip netns add` fails (for example, the name is taken).
    pub fn new(name: &str) -> Result<Self, NetnsError> {
        run("ip", &["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
        };
        ip_in(name, &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <self> args...`.
    ///
    /// # Errors
    /// As [`run`].
    pub fn ip(&self, args: &[&str]) -> Result<Output, NetnsError> {
        ip_in(&self.name, args)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace also deletes the interfaces in it (a veth takes its peer along).
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// One end of a [`VethPair`].
#[derive(Clone, Debug)]
pub struct VethEnd {
    /// Interface name.
    pub ifname: String,
    /// Namespace it lives in.
    pub netns: String,
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ipv4: std::net::Ipv4Addr,
    /// IPv6 address.
    pub ipv6: std::net::Ipv6Addr,
}

/// Two namespaces joined by a veth pair, addressed `10.<n>.0.1/24` and `.2` and `fd00:<n>::1/64` and `::2`,
/// with static neighbour entries both ways (no ARP or ND during tests). Dropping it deletes both
/// namespaces, and with them the veth.
#[derive(Debug)]
pub struct VethPair {
    /// End A.
    pub a: VethEnd,
    /// End B.
    pub b: VethEnd,
    // Declared last so the ends are described until the namespaces go.
    _ns_b: NetNs,
    _ns_a: NetNs,
}

/// Options of [`VethPair::new`].
#[derive(Clone, Debug)]
pub struct VethOptions {
    /// MTU of both ends.
    pub mtu: u32,
    /// RX and TX queues per end.
    pub queues: u32,
    /// Second octet of the IPv4 subnet and the IPv6 subnet id, to keep concurrent pairs apart.
    pub subnet: u8,
}

impl Default for VethOptions {
    fn default() -> Self {
        Self {
            mtu: 1500,
            queues: 1,
            subnet: 77,
        }
    }
}

fn mac_of(netns: &str, ifname: &str) -> Result<[u8; 6], NetnsError> {
    let out = ip_in(netns, &["-j", "link", "show", "dev", ifname])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let s = v[0]["address"].as_str().unwrap_or_default().to_owned();
    let mut mac = [0u8; 6];
    let parts: Vec<u8> = s
        .split(':')
        .filter_map(|p| u8::from_str_radix(p, 16).ok())
        .collect();
    if parts.len() != 6 {
        return Err(NetnsError::Failed {
            cmd: format!("ip link show {ifname}"),
            stderr: s,
        });
    }
    mac.copy_from_slice(&parts);
    Ok(mac)
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl VethPair {
    /// Creates namespaces `<prefix>-a` and `<prefix>-b` joined by veth `<prefix>a`/`<prefix>b`.
    /// `prefix` must be at most 14 characters.
    ///
    /// # Errors
    /// If any `ip` command fails; what was made so far is removed.
    pub fn new(prefix: &str, opts: &VethOptions) -> Result<Self, NetnsError> {
        let ns_a = NetNs::new(&format!("{prefix}-a"))?;
        let ns_b = NetNs::new(&format!("{prefix}-b"))?;
        let (if_a, if_b) = (format!("{prefix}a"), format!("{prefix}b"));
        let q = opts.queues.to_string();
        let mtu = opts.mtu.to_string();
        ns_a.ip(&[
            "link",
            "add",
            &if_a,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &if_b,
            "netns",
            ns_b.name(),
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
        ])?;
        let n = opts.subnet;
        let addrs = [
            (&ns_a, &if_a, format!("10.{n}.0.1"), format!("fd00:{n}::1")),
            (&ns_b, &if_b, format!("10.{n}.0.2"), format!("fd00:{n}::2")),
        ];
        for (ns, ifname, v4, v6) in &addrs {
            // No DAD, so the IPv6 address is usable at once.
            let _ = run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns.name(),
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{ifname}.accept_dad=0"),
                ],
            );
            ns.ip(&["link", "set", "dev", ifname, "mtu", &mtu])?;
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", ifname])?;
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                ifname,
                "nodad",
            ])?;
            ns.ip(&["link", "set", "dev", ifname, "up"])?;
        }
        let mac_a = mac_of(ns_a.name(), &if_a)?;
        let mac_b = mac_of(ns_b.name(), &if_b)?;
        let end = |ns: &NetNs, ifname: &str, mac, v4: &str, v6: &str| VethEnd {
            ifname: ifname.to_owned(),
            netns: ns.name().to_owned(),
            mac,
            ipv4: v4.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            ipv6: v6.parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED),
        };
        let a = end(&ns_a, &if_a, mac_a, &addrs[0].2, &addrs[0].3);
        let b = end(&ns_b, &if_b, mac_b, &addrs[1].2, &addrs[1].3);
        for (from, to) in [(&a, &b), (&b, &a)] {
            for ip in [IpAddr::V4(to.ipv4), IpAddr::V6(to.ipv6)] {
                ip_in(
                    &from.netns,
                    &[
                        "neigh",
                        "replace",
                        &ip.to_string(),
                        "lladdr",
                        &fmt_mac(&to.mac),
                        "dev",
                        &from.ifname,
                        "nud",
                        "permanent",
                    ],
                )?;
            }
        }
        Ok(Self {
            a,
            b,
            _ns_b: ns_b,
            _ns_a: ns_a,
        })
    }
}

/// Hosts on one L2 segment: a switch namespace `<prefix>-s` holding a bridge, and one namespace
/// `<prefix>-h<i>` per host with interface `<prefix>h<i>` (addressed `10.<subnet>.0.<i+1>/24`),
/// joined to the bridge by a veth, with static neighbour entries between all hosts. Dropping it
/// deletes every namespace. `prefix` must be at most 11 characters.
#[derive(Debug)]
pub struct Lan {
    /// The hosts.
    pub hosts: Vec<VethEnd>,
    _hosts_ns: Vec<NetNs>,
    _switch: NetNs,
}

impl Lan {
    /// Creates `n` hosts on one bridge.
    ///
    /// # Errors
    /// If any `ip` command fails; what was made so far is removed.
    pub fn new(prefix: &str, n: usize, opts: &VethOptions) -> Result<Self, NetnsError> {
        let switch = NetNs::new(&format!("{prefix}-s"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let mtu = opts.mtu.to_string();
        let sub = opts.subnet;
        let mut hosts = Vec::new();
        let mut nss = Vec::new();
        for i in 0..n {
            let ns = NetNs::new(&format!("{prefix}-h{i}"))?;
            let (host_if, port_if) = (format!("{prefix}h{i}"), format!("{prefix}p{i}"));
            ns.ip(&[
                "link",
                "add",
                &host_if,
                "type",
                "veth",
                "peer",
                "name",
                &port_if,
                "netns",
                switch.name(),
            ])?;
            switch.ip(&["link", "set", &port_if, "mtu", &mtu, "master", "br0", "up"])?;
            let v4 = format!("10.{sub}.0.{}", i + 1);
            let v6 = format!("fd00:{sub}::{}", i + 1);
            ns.ip(&["link", "set", "dev", &host_if, "mtu", &mtu])?;
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", &host_if])?;
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                &host_if,
                "nodad",
            ])?;
            ns.ip(&["link", "set", "dev", &host_if, "up"])?;
            let mac = mac_of(ns.name(), &host_if)?;
            hosts.push(VethEnd {
                ifname: host_if,
                netns: ns.name().to_owned(),
                mac,
                ipv4: v4.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                ipv6: v6.parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED),
            });
            nss.push(ns);
        }
        for from in &hosts {
            for to in hosts.iter().filter(|h| h.ifname != from.ifname) {
                for ip in [IpAddr::V4(to.ipv4), IpAddr::V6(to.ipv6)] {
                    ip_in(
                        &from.netns,
                        &[
                            "neigh",
                            "replace",
                            &ip.to_string(),
                            "lladdr",
                            &fmt_mac(&to.mac),
                            "dev",
                            &from.ifname,
                            "nud",
                            "permanent",
                        ],
                    )?;
                }
            }
        }
        Ok(Self {
            hosts,
            _hosts_ns: nss,
            _switch: switch,
        })
    }
}

/// A routed topology for congestion and fault tests: `n` sender hosts and one receiver, each in
/// its own namespace and joined by its own veth to a router namespace `<prefix>-r` that forwards
/// between them. Sender `i` is `<prefix>h<i>` at `10.<subnet>.<i+1>.1/24` (router side
/// `<prefix>l<i>`, .254); the receiver is `<prefix>d` at `10.<subnet>.100.1/24` (router side
/// [`Routed::bottleneck_if`], .254), with matching `fd00:<subnet>:<net>::/64` IPv6 addresses. Every
/// host routes through the router, and all neighbour entries are static.
///
/// All traffic to the receiver leaves the router through one interface, so a `roce impair` on
/// that interface's egress is a shared switch queue for every flow. (AF_XDP transmit skips the
/// sender's own tc egress, which is why impairment needs a router in between.) Dropping it deletes
/// every namespace. `prefix` must be at most 11 characters.
#[derive(Debug)]
pub struct Routed {
    /// The senders.
    pub senders: Vec<VethEnd>,
    /// The receiver.
    pub receiver: VethEnd,
    /// The router's namespace.
    pub router_netns: String,
    /// The router's interface towards the receiver: where the bottleneck goes.
    pub bottleneck_if: String,
    /// The router's interfaces towards the senders, in sender order.
    pub sender_side_ifs: Vec<String>,
    _hosts_ns: Vec<NetNs>,
    _router: NetNs,
}

impl Routed {
    /// Creates `n` senders (at most 99) and one receiver around one router.
    ///
    /// # Errors
    /// If any `ip` or `sysctl` command fails; what was made so far is removed.
    pub fn new(prefix: &str, n: usize, opts: &VethOptions) -> Result<Self, NetnsError> {
        let router = NetNs::new(&format!("{prefix}-r"))?;
        for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            run(
                "ip",
                &["netns", "exec", router.name(), "sysctl", "-qw", key],
            )?;
        }
        let sub = opts.subnet;
        let mtu = opts.mtu.to_string();
        let q = opts.queues.to_string();
        let mut nss = Vec::new();
        let mut hosts = Vec::new();
        let mut router_ends = Vec::new();
        let nets: Vec<(String, String, u32)> = (0..n)
            .map(|i| {
                (
                    format!("{prefix}h{i}"),
                    format!("{prefix}l{i}"),
                    i as u32 + 1,
                )
            })
            .chain(std::iter::once((
                format!("{prefix}d"),
                format!("{prefix}rd"),
                100,
            )))
            .collect();
        for (host_if, router_if, net) in &nets {
            let ns = NetNs::new(&format!("{prefix}-{}", &host_if[prefix.len()..]))?;
            ns.ip(&[
                "link",
                "add",
                host_if,
                "numrxqueues",
                &q,
                "numtxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                router_if,
                "netns",
                router.name(),
                "numrxqueues",
                &q,
                "numtxqueues",
                &q,
            ])?;
            let host_v4 = format!("10.{sub}.{net}.1");
            let host_v6 = format!("fd00:{sub}:{net}::1");
            let gw_v4 = format!("10.{sub}.{net}.254");
            let gw_v6 = format!("fd00:{sub}:{net}::fe");
            for (nsn, ifname, v4, v6) in [
                (ns.name(), host_if, &host_v4, &host_v6),
                (router.name(), router_if, &gw_v4, &gw_v6),
            ] {
                let _ = run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        nsn,
                        "sysctl",
                        "-qw",
                        &format!("net.ipv6.conf.{ifname}.accept_dad=0"),
                    ],
                );
                ip_in(nsn, &["link", "set", "dev", ifname, "mtu", &mtu])?;
                ip_in(nsn, &["addr", "add", &format!("{v4}/24"), "dev", ifname])?;
                ip_in(
                    nsn,
                    &[
                        "-6",
                        "addr",
                        "add",
                        &format!("{v6}/64"),
                        "dev",
                        ifname,
                        "nodad",
                    ],
                )?;
                ip_in(nsn, &["link", "set", "dev", ifname, "up"])?;
            }
            ns.ip(&["route", "add", "default", "via", &gw_v4, "dev", host_if])?;
            ns.ip(&[
                "-6", "route", "add", "default", "via", &gw_v6, "dev", host_if,
            ])?;
            let host_mac = mac_of(ns.name(), host_if)?;
            let router_mac = mac_of(router.name(), router_if)?;
            for (nsn, ifname, ips, mac) in [
                (ns.name(), host_if, [&gw_v4, &gw_v6], router_mac),
                (router.name(), router_if, [&host_v4, &host_v6], host_mac),
            ] {
                for ip in ips {
                    ip_in(
                        nsn,
                        &[
                            "neigh",
                            "replace",
                            ip,
                            "lladdr",
                            &fmt_mac(&mac),
                            "dev",
                            ifname,
                            "nud",
                            "permanent",
                        ],
                    )?;
                }
            }
            hosts.push(VethEnd {
                ifname: host_if.clone(),
                netns: ns.name().to_owned(),
                mac: host_mac,
                ipv4: host_v4.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                ipv6: host_v6.parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED),
            });
            router_ends.push(router_if.clone());
            nss.push(ns);
        }
        let receiver = hosts.pop().ok_or_else(|| NetnsError::Failed {
            cmd: "Routed::new".into(),
            stderr: "no hosts".into(),
        })?;
        let bottleneck_if = router_ends.pop().unwrap_or_default();
        Ok(Self {
            senders: hosts,
            receiver,
            router_netns: router.name().to_owned(),
            bottleneck_if,
            sender_side_ifs: router_ends,
            _hosts_ns: nss,
            _router: router,
        })
    }
}
