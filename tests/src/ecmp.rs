//! Issue 19's test bed: a client and a server joined through two routers by `k` equal-cost
//! paths. The first router reaches the server's subnet by a Linux multipath route over its `k`
//! links to the second router, hashing on the UDP ports (`net.ipv4.fib_multipath_hash_policy=1`,
//! L4), so each UDP source port (entropy) of a RoCE v2 flow takes one of the paths; the way
//! back is one path. `roce impair` on a path's egress at the first router impairs that path
//! only.
//!
//! ```text
//!  client ──── r1 ═══ k links ═══ r2 ──── server
//!  10.S.1.2   .1   10.S.(10+i).1/.2   .1   10.S.100.2
//! ```

use std::{net::Ipv4Addr, time::Duration};

use roce::netns::{NetNs, VethEnd, ip_in, run};

/// The topology; dropping it deletes every namespace (and with them every link).
#[derive(Debug)]
pub struct Ecmp {
    /// The client's end.
    pub client: VethEnd,
    /// The server's end.
    pub server: VethEnd,
    /// The first router's namespace.
    pub r1: String,
    /// The first router's interfaces of the `k` paths, path `i` at index `i`.
    pub paths: Vec<String>,
    _ns: Vec<NetNs>,
}

fn mac(netns: &str, ifname: &str) -> String {
    let o = ip_in(netns, &["-j", "link", "show", "dev", ifname]).expect("ip link show");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ip -j link");
    v[0]["address"].as_str().expect("a MAC").to_owned()
}

fn parse_mac(s: &str) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (b, x) in m.iter_mut().zip(s.split(':')) {
        *b = u8::from_str_radix(x, 16).expect("hex");
    }
    m
}

fn sysctl(netns: &str, key: &str) {
    run("ip", &["netns", "exec", netns, "sysctl", "-qw", key]).expect("sysctl");
}

/// One `roce` server and client pair for [`Ecmp::roce_pair`].
#[derive(Clone, Copy, Debug)]
pub struct PairRun<'a> {
    /// The server's command line, without `-d` (added).
    pub server_line: &'a str,
    /// The client's command line, without `-d` and the server's address (added).
    pub client_line: &'a str,
    /// Serve on the client's end (behind the second router) and connect from the server's:
    /// the client's packets then take the second router's route and the server's the first's.
    pub reversed: bool,
    /// How long to wait after starting the server before starting the client (zero: the
    /// client's own connect retries are enough).
    pub settle: Duration,
    /// The longest the client may run.
    pub limit: Duration,
}

impl<'a> PairRun<'a> {
    /// `server_line` and `client_line` the usual way round, no settling, 60 s for the client.
    #[must_use]
    pub const fn new(server_line: &'a str, client_line: &'a str) -> Self {
        Self {
            server_line,
            client_line,
            reversed: false,
            settle: Duration::ZERO,
            limit: Duration::from_secs(60),
        }
    }
}

impl Ecmp {
    /// Builds the topology with namespaces and interfaces named from `prefix` (at most 9
    /// characters), addresses in `10.<subnet>.0.0/16`, `k` paths (at most 8), links of `mtu`
    /// bytes. Neighbours are static (no ARP during the tests).
    ///
    /// # Panics
    /// When an `ip` or `sysctl` command fails.
    #[must_use]
    pub fn new(prefix: &str, subnet: u8, k: usize, mtu: u32) -> Self {
        assert!((1..=8).contains(&k));
        let m = mtu.to_string();
        let c = NetNs::new(&format!("{prefix}-c")).expect("netns");
        let r1 = NetNs::new(&format!("{prefix}-r1")).expect("netns");
        let r2 = NetNs::new(&format!("{prefix}-r2")).expect("netns");
        let d = NetNs::new(&format!("{prefix}-d")).expect("netns");
        for r in [&r1, &r2] {
            sysctl(r.name(), "net.ipv4.ip_forward=1");
        }
        // L4 hash: the UDP source port picks the path.
        sysctl(r1.name(), "net.ipv4.fib_multipath_hash_policy=1");
        // One link: (ns a, if a, addr a, ns b, if b, addr b), /24 each.
        let link = |(na, ia, aa): (&NetNs, &str, &str), (nb, ib, ab): (&NetNs, &str, &str)| {
            na.ip(&[
                "link",
                "add",
                ia,
                "type",
                "veth",
                "peer",
                "name",
                ib,
                "netns",
                nb.name(),
            ])
            .expect("veth");
            for (ns, ifname, addr) in [(na, ia, aa), (nb, ib, ab)] {
                ns.ip(&["link", "set", "dev", ifname, "mtu", &m])
                    .expect("mtu");
                ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", ifname])
                    .expect("addr");
                ns.ip(&["link", "set", "dev", ifname, "up"]).expect("up");
            }
            for (ns, ifname, peer, peer_if, peer_ns) in [(na, ia, ab, ib, nb), (nb, ib, aa, ia, na)]
            {
                let lladdr = mac(peer_ns.name(), peer_if);
                ns.ip(&[
                    "neigh",
                    "replace",
                    peer,
                    "lladdr",
                    &lladdr,
                    "dev",
                    ifname,
                    "nud",
                    "permanent",
                ])
                .expect("neigh");
            }
        };
        let s = subnet;
        let (c_if, r1c) = (format!("{prefix}c"), format!("{prefix}r1c"));
        let (d_if, r2d) = (format!("{prefix}d"), format!("{prefix}r2d"));
        let (c_ip, r1_ip) = (format!("10.{s}.1.2"), format!("10.{s}.1.1"));
        let (d_ip, r2_ip) = (format!("10.{s}.100.2"), format!("10.{s}.100.1"));
        link((&c, &c_if, &c_ip), (&r1, &r1c, &r1_ip));
        link((&d, &d_if, &d_ip), (&r2, &r2d, &r2_ip));
        let mut paths = Vec::new();
        let mut hops = Vec::new();
        for i in 0..k {
            let (a, b) = (format!("{prefix}p{i}"), format!("{prefix}q{i}"));
            let (aa, ab) = (
                format!("10.{s}.{}.1", 10 + i),
                format!("10.{s}.{}.2", 10 + i),
            );
            link((&r1, &a, &aa), (&r2, &b, &ab));
            hops.push((ab, a.clone()));
            paths.push(a);
        }
        // r1 → server subnet: every path, equal weights.
        let mut args: Vec<String> = ["route", "add", &format!("10.{s}.100.0/24")]
            .map(String::from)
            .to_vec();
        for (via, dev) in &hops {
            args.extend(["nexthop", "via", via, "dev", dev].map(String::from));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        r1.ip(&args).expect("multipath route");
        // r2 → client subnet: path 0 only.
        r2.ip(&[
            "route",
            "add",
            &format!("10.{s}.1.0/24"),
            "via",
            &format!("10.{s}.10.1"),
            "dev",
            &format!("{prefix}q0"),
        ])
        .expect("route back");
        c.ip(&["route", "add", "default", "via", &r1_ip, "dev", &c_if])
            .expect("default");
        d.ip(&["route", "add", "default", "via", &r2_ip, "dev", &d_if])
            .expect("default");
        let end = |ns: &NetNs, ifname: &str, ip: &str| VethEnd {
            ifname: ifname.to_owned(),
            netns: ns.name().to_owned(),
            mac: parse_mac(&mac(ns.name(), ifname)),
            ipv4: ip.parse::<Ipv4Addr>().expect("IPv4"),
            ipv6: std::net::Ipv6Addr::UNSPECIFIED,
        };
        Self {
            client: end(&c, &c_if, &c_ip),
            server: end(&d, &d_if, &d_ip),
            r1: r1.name().to_owned(),
            paths,
            _ns: vec![c, d, r1, r2],
        }
    }

    /// Packets each path has carried from the first router (its interfaces' TX counters).
    ///
    /// # Panics
    /// When `ip -s` fails.
    #[must_use]
    pub fn tx_packets(&self) -> Vec<u64> {
        self.tx("packets")
    }

    /// Bytes (whole frames) each path has carried from the first router, as
    /// [`Ecmp::tx_packets`] counts packets.
    ///
    /// # Panics
    /// When `ip -s` fails.
    #[must_use]
    pub fn tx_bytes(&self) -> Vec<u64> {
        self.tx("bytes")
    }

    fn tx(&self, key: &str) -> Vec<u64> {
        self.paths
            .iter()
            .map(|p| {
                let o = ip_in(&self.r1, &["-s", "-j", "link", "show", "dev", p]).expect("ip -s");
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ip -j -s");
                v[0]["stats64"]["tx"][key].as_u64().unwrap_or(0)
            })
            .collect()
    }

    /// Runs `run`'s server and client (`roce` command lines, `-j` output), waits for the
    /// client at most `run.limit` and for the server 20 s more, and returns their JSON reports
    /// (client, server).
    ///
    /// # Panics
    /// When either end fails, prints no JSON or outlives its time.
    #[must_use]
    pub fn roce_pair(&self, run: &PairRun<'_>) -> (serde_json::Value, serde_json::Value) {
        use crate::child::{args, finish_within, json_ok, spawn};
        let (serve, connect) = if run.reversed {
            (&self.client, &self.server)
        } else {
            (&self.server, &self.client)
        };
        let server = spawn(
            &serve.netns,
            &args(&format!("{} -d {}", run.server_line, serve.ifname)),
        );
        if !run.settle.is_zero() {
            std::thread::sleep(run.settle);
        }
        let client = finish_within(
            spawn(
                &connect.netns,
                &args(&format!(
                    "{} -d {} {}",
                    run.client_line, connect.ifname, serve.ipv4
                )),
            ),
            run.limit,
            &format!("client {}", run.client_line),
        );
        let server = finish_within(
            server,
            Duration::from_secs(20),
            &format!("server {}", run.server_line),
        );
        (
            json_ok(&client, &format!("client {}", run.client_line)),
            json_ok(&server, &format!("server {}", run.server_line)),
        )
    }

    /// Runs `roce perf LINE` (a `perf write ... --span N` line) with its server on the
    /// server's end and its client on the client's, waits for the client at most `limit`,
    /// checks that both ends verified every byte, and returns the client's JSON report.
    ///
    /// # Panics
    /// When either end fails, does not verify, or outlives its time.
    #[must_use]
    pub fn verified_perf(&self, line: &str, limit: Duration) -> serde_json::Value {
        let (c, s) = self.roce_pair(&PairRun {
            limit,
            ..PairRun::new(line, line)
        });
        assert_eq!(s["verified"], true, "server {line}: {s}");
        assert_eq!(c["verified"], true, "client {line}: {c}");
        c
    }

    /// Attaches `roce impair SETTINGS` (e.g. `--drop 0.02`) to path `path`'s egress at the
    /// first router; the returned guard takes it off again when dropped, failed test or not.
    ///
    /// # Panics
    /// When `roce impair` fails.
    #[must_use]
    pub fn impair(&self, path: usize, settings: &str) -> PathImpairment<'_> {
        let o = std::process::Command::new(crate::roce_bin())
            .args(["--netns", &self.r1, "-j", "impair", "-i", &self.paths[path]])
            .args(settings.split_whitespace())
            .output()
            .expect("roce impair");
        assert!(
            o.status.success(),
            "roce impair {settings}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        PathImpairment { net: self, path }
    }
}

/// `roce impair` on one path of the first router ([`Ecmp::impair`]), taken off on drop.
#[derive(Debug)]
pub struct PathImpairment<'a> {
    net: &'a Ecmp,
    path: usize,
}

impl Drop for PathImpairment<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new(crate::roce_bin())
            .args([
                "--netns",
                &self.net.r1,
                "impair",
                "-i",
                &self.net.paths[self.path],
            ])
            .arg("--off")
            .output();
    }
}
