//! `roce impair` on the sending end of a veth pair between two namespaces this test makes, with
//! real UDP 4791 traffic; what arrives is checked with roce_xdp's counters on the far end
//! (`roce load` + `roce stats -j`) or a UDP socket there, against the impair counters
//! (`roce impair --show -j`). Needs root.

use std::{
    net::{SocketAddr, UdpSocket},
    process::Command,
    thread,
    time::Duration,
};

use roce::{
    impair::pin_dir as impair_dir,
    loader::pin_dir,
    netns::{self, VethPair},
};
use roce_common::{counters::XdpStats, impair::ImpairStats};
use roce_tests::{Frame, require_root, roce, roce_bin, roce_ok, tag, veth_pair};
use serde_json::Value;

#[track_caller]
fn roce_json(args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    serde_json::from_str(&roce_ok(&all)).expect("JSON")
}

/// Removes roce_impair and roce_xdp from the pair's interfaces on drop, even when a test fails.
struct Cleanup {
    impaired: String,
    loaded: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if impair_dir(&self.impaired).exists() {
            let _ = roce(&["impair", "-i", &self.impaired, "--off"]);
        }
        if let Some(l) = &self.loaded
            && pin_dir(l).exists()
        {
            let _ = roce(&["unload", "-i", l]);
        }
    }
}

struct Setup {
    pair: VethPair,
    _cleanup: Cleanup,
}

/// A veth pair; roce_xdp on B when `load_b`.
fn setup(name: &str, subnet: u8, load_b: bool) -> Setup {
    require_root();
    let pair = veth_pair(name, subnet);
    let cleanup = Cleanup {
        impaired: pair.a.ifname.clone(),
        loaded: load_b.then(|| pair.b.ifname.clone()),
    };
    if load_b {
        roce_ok(&["--netns", &pair.b.netns, "load", "-i", &pair.b.ifname]);
    }
    Setup {
        pair,
        _cleanup: cleanup,
    }
}

fn impair_stats(ifname: &str) -> (ImpairStats, Value) {
    let v = roce_json(&["impair", "-i", ifname, "--show"]);
    let mut s = ImpairStats::default();
    for name in ImpairStats::NAMES {
        *s.get_mut(name).unwrap() = v["impair"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("impair --show has no {name}: {v}"));
    }
    (s, v)
}

fn xdp_stats(ifname: &str) -> XdpStats {
    let v = roce_json(&["stats", "-i", ifname]);
    let mut s = XdpStats::default();
    for name in XdpStats::NAMES {
        *s.get_mut(name).unwrap() = v["xdp"][name].as_u64().unwrap();
    }
    s
}

/// `bpftool link show id ID` as JSON, `None` when there is no such link.
fn bpftool_link(id: &str) -> Option<Value> {
    let o = Command::new("bpftool")
        .args(["-j", "link", "show", "id", id])
        .output()
        .expect("bpftool");
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).expect("bpftool JSON"))
}

fn pin_to_cpu0() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// Sends `packets` from A to B's `port`, one after the other, from one CPU, marked ECT(0) as
/// RoCE v2 senders with congestion control mark them.
fn send_from_a(pair: &VethPair, packets: Vec<Vec<u8>>, port: u16) {
    send_from_a_tos(pair, packets, port, 2);
}

/// [`send_from_a`] with IP TOS byte `tos` (its low two bits are the ECN field).
fn send_from_a_tos(pair: &VethPair, packets: Vec<Vec<u8>>, port: u16, tos: u8) {
    let (a_ip, b_ip) = (pair.a.ipv4, pair.b.ipv4);
    netns::in_netns(&pair.a.netns, move || {
        pin_to_cpu0();
        let s = UdpSocket::bind(SocketAddr::from((a_ip, 0))).unwrap();
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv4Tos, &i32::from(tos))
            .unwrap();
        for (i, p) in packets.iter().enumerate() {
            s.send_to(p, SocketAddr::from((b_ip, port))).unwrap();
            // Paced: with an XDP program on B, the veth hands frames over through a 256-frame
            // ring that a loaded machine may not drain in time, and a burst would lose frames
            // there (as TX drops of A) that no test here means to lose.
            if i % 32 == 31 {
                thread::sleep(Duration::from_millis(1));
            }
        }
    })
    .unwrap();
    thread::sleep(Duration::from_millis(200));
}

/// A UDP socket in B on `port` that collects datagrams until `n` arrive or 2 s pass quietly.
fn receiver_in_b(pair: &VethPair, port: u16, n: usize) -> thread::JoinHandle<Vec<Vec<u8>>> {
    let ns = pair.b.netns.clone();
    let ip = pair.b.ipv4;
    let (tx, rx) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        netns::enter(&ns).unwrap();
        let s = UdpSocket::bind(SocketAddr::from((ip, port))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < n {
            match s.recv(&mut buf) {
                Ok(len) => got.push(buf[..len].to_vec()),
                Err(_) => break,
            }
        }
        got
    });
    rx.recv().unwrap();
    h
}

fn roce_packet(psn: u32, payload: usize) -> Vec<u8> {
    Frame {
        psn,
        payload,
        ..Frame::default()
    }
    .roce_bytes()
}

fn psn_of(udp_payload: &[u8]) -> u32 {
    u32::from_be_bytes([0, udp_payload[9], udp_payload[10], udp_payload[11]])
}

#[test]
fn drop_half_then_change_live_then_off() {
    let st = setup("id", 81, true);
    let (a, b) = (&st.pair.a, &st.pair.b);
    let r = roce_json(&[
        "--netns", &a.netns, "impair", "-i", &a.ifname, "--drop", "0.5",
    ]);
    assert_eq!(r["attached"], true, "{r}");
    for pin in [
        "link",
        "ROCE_IMPAIR_CONFIG",
        "ROCE_IMPAIR_STATS",
        "ROCE_IMPAIR_BOTTLENECK",
        "ROCE_IMPAIR_HELD",
        "ROCE_IMPAIR_LIMIT",
    ] {
        assert!(
            impair_dir(&a.ifname).join(pin).exists(),
            "pin {pin} missing"
        );
    }
    let prog_id = r["prog_id"].as_u64().unwrap();
    let link_id = r["link_id"].as_u64().unwrap().to_string();
    // The TCX link (bpftool 7.1 calls its type 11) runs our program.
    let link = bpftool_link(&link_id).expect("the TCX link exists");
    assert_eq!(link["prog_id"].as_u64(), Some(prog_id), "{link}");

    // Non-RoCE traffic to port 9000 must all arrive while RoCE is being dropped.
    let n = 2000usize;
    let plain = receiver_in_b(&st.pair, 9000, 200);
    let before = xdp_stats(&b.ifname);
    let packets: Vec<Vec<u8>> = (0..n as u32).map(|i| roce_packet(i, 64)).collect();
    send_from_a(&st.pair, packets, 4791);
    send_from_a(&st.pair, vec![b"not roce".to_vec(); 200], 9000);
    assert_eq!(
        plain.join().unwrap().len(),
        200,
        "non-RoCE traffic untouched"
    );

    let (s, v) = impair_stats(&a.ifname);
    assert_eq!(v["settings"]["drop"], 0.5);
    assert_eq!(s.seen, n as u64, "{s:?}");
    assert_eq!(s.dropped + s.passed, n as u64, "{s:?}");
    assert!(s.not_roce >= 200, "{s:?}");
    // Binomial(2000, 0.5): sd 22; 6 sd.
    assert!((868..=1132).contains(&s.dropped), "{} dropped", s.dropped);
    let d = xdp_stats(&b.ifname).saturating_sub(&before);
    assert_eq!(
        d.roce_packets, s.passed,
        "roce_xdp on B saw every RoCE packet impair passed, and no other"
    );

    // bpftool shows the counters by name.
    let dump = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(impair_dir(&a.ifname).join("ROCE_IMPAIR_STATS"))
        .output()
        .expect("bpftool");
    let dump = String::from_utf8_lossy(&dump.stdout);
    for name in ["dropped", "bottleneck_marked", "reorder_released"] {
        assert!(dump.contains(name), "bpftool dump lacks {name}:\n{dump}");
    }

    // Change it live: duplicate and CE-mark everything, drop nothing.
    let r = roce_json(&[
        "--netns", &a.netns, "impair", "-i", &a.ifname, "--dup", "1", "--ce", "1",
    ]);
    assert_eq!(r["attached"], false, "updated in place: {r}");
    assert_eq!(r["prog_id"].as_u64(), Some(prog_id));
    let (s0, _) = impair_stats(&a.ifname);
    let before = xdp_stats(&b.ifname);
    let m = 300u64;
    send_from_a(
        &st.pair,
        (0..m as u32).map(|i| roce_packet(i, 32)).collect(),
        4791,
    );
    let (s1, _) = impair_stats(&a.ifname);
    let ds = s1.saturating_sub(&s0);
    assert_eq!((ds.seen, ds.dropped), (m, 0), "{ds:?}");
    assert_eq!(
        (ds.duplicated, ds.ce_marked, ds.own_copies),
        (m, m, m),
        "{ds:?}"
    );
    let d = xdp_stats(&b.ifname).saturating_sub(&before);
    assert_eq!(d.roce_packets, 2 * m, "{d:?}");
    assert_eq!(d.ecn_ce, 2 * m, "the copy is made after marking: {d:?}");

    // Text output.
    let text = roce_ok(&["impair", "-i", &a.ifname, "--show", "-z"]);
    assert!(text.contains("dup 1, ce 1"), "{text}");
    assert!(
        text.contains(&format!("     duplicated: {}", s1.duplicated)),
        "{text}"
    );

    // Off: link, filter and pins gone; the program unloaded.
    let r = roce_json(&["impair", "-i", &a.ifname, "--off"]);
    assert_eq!(r["detached"], true);
    assert!(!impair_dir(&a.ifname).exists(), "pins left behind");
    let progs: Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["-j", "prog", "show"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        !progs
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"].as_u64() == Some(prog_id)),
        "program {prog_id} still loaded"
    );
    assert!(
        bpftool_link(&link_id).is_none(),
        "TCX link {link_id} still there"
    );
    for args in [["--show"], ["--off"]] {
        let o = roce(&["impair", "-i", &a.ifname, args[0]]);
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stderr).contains("not attached"));
    }
    // Not root: a clear error, exit 1.
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(roce_bin())
        .args(["impair", "-i", &a.ifname, "--drop", "0.1"])
        .output()
        .expect("setpriv");
    assert_eq!(nobody.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("must be run as root"));
    // Usage errors exit 2.
    let o = roce(&["impair", "-i", &a.ifname, "--drop", "1.5"]);
    assert_eq!(o.status.code(), Some(2));
    let o = roce(&[
        "impair",
        "-i",
        &a.ifname,
        "--ce",
        "0.1",
        "--bottleneck",
        "1gbit",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--ce and --bottleneck exclude each other"
    );
    // Traffic flows unimpaired again.
    let before = xdp_stats(&b.ifname);
    send_from_a(
        &st.pair,
        (0..100).map(|i| roce_packet(i, 32)).collect(),
        4791,
    );
    assert_eq!(
        xdp_stats(&b.ifname).saturating_sub(&before).roce_packets,
        100
    );
}

#[test]
fn reorder_swaps_neighbours_on_the_wire() {
    let st = setup("ir", 82, false);
    let a = &st.pair.a;
    roce_ok(&[
        "--netns",
        &a.netns,
        "impair",
        "-i",
        &a.ifname,
        "--reorder",
        "1",
    ]);
    let n = 200usize;
    let rx = receiver_in_b(&st.pair, 4791, n);
    // Different sizes, so a rewritten skb must also change length.
    let sent: Vec<Vec<u8>> = (0..n as u32)
        .map(|i| roce_packet(i, 16 + 8 * (i as usize % 5)))
        .collect();
    send_from_a(&st.pair, sent.clone(), 4791);
    let got = rx.join().unwrap();
    let order: Vec<u32> = got.iter().map(|p| psn_of(p)).collect();
    // Every even packet is held and goes out right after the odd one behind it.
    let want: Vec<u32> = (0..n as u32 / 2).flat_map(|k| [2 * k + 1, 2 * k]).collect();
    assert_eq!(order, want);
    for p in &got {
        assert_eq!(p, &sent[psn_of(p) as usize], "bytes intact");
    }
    let (s, _) = impair_stats(&a.ifname);
    assert_eq!(
        (s.reordered, s.reorder_released),
        (n as u64 / 2, n as u64 / 2)
    );
    assert_eq!(s.passed, n as u64 / 2);
    roce_ok(&["impair", "-i", &a.ifname, "--off"]);
}

#[test]
fn corrupt_flips_one_bit_and_bottleneck_marks_and_drops() {
    let st = setup("ic", 83, true);
    let (a, b) = (&st.pair.a, &st.pair.b);
    roce_ok(&[
        "--netns",
        &a.netns,
        "impair",
        "-i",
        &a.ifname,
        "--corrupt",
        "1",
    ]);
    let n = 100usize;
    let rx = receiver_in_b(&st.pair, 4791, n);
    let sent: Vec<Vec<u8>> = (0..n as u32).map(|i| roce_packet(i, 64)).collect();
    send_from_a(&st.pair, sent.clone(), 4791);
    let got = rx.join().unwrap();
    assert_eq!(got.len(), n);
    for (s, g) in sent.iter().zip(&got) {
        let diff: Vec<(usize, u8)> = s
            .iter()
            .zip(g)
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(i, (x, y))| (i, x ^ y))
            .collect();
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert_eq!(diff[0].1.count_ones(), 1);
        assert!(diff[0].0 >= 12, "the BTH is never touched: {diff:?}");
    }

    // A 8 Mb/s bottleneck with a 20 KB buffer, blasted with ~2 MB: it marks and drops.
    roce_ok(&[
        "--netns",
        &a.netns,
        "impair",
        "-i",
        &a.ifname,
        "--bottleneck",
        "8mbit",
        "--kmin",
        "2k",
        "--kmax",
        "6k",
        "--pmax",
        "0.5",
        "--max-backlog",
        "20k",
    ]);
    let (s0, v) = impair_stats(&a.ifname);
    assert_eq!(v["settings"]["bottleneck"]["rate_bps"], 8_000_000);
    let before = xdp_stats(&b.ifname);
    send_from_a(
        &st.pair,
        (0..2000u32).map(|i| roce_packet(i, 1000)).collect(),
        4791,
    );
    let (s1, v) = impair_stats(&a.ifname);
    let ds = s1.saturating_sub(&s0);
    assert_eq!(ds.seen, 2000);
    assert_eq!(ds.passed + ds.bottleneck_dropped, 2000, "{ds:?}");
    assert!(ds.bottleneck_dropped > 1000, "{ds:?}");
    assert!(ds.bottleneck_marked > 5, "{ds:?}");
    assert!(v["backlog_bytes"].as_u64().is_some());
    let d = xdp_stats(&b.ifname).saturating_sub(&before);
    assert_eq!(d.roce_packets, ds.passed);
    assert_eq!(d.ecn_ce, ds.bottleneck_marked);
    assert_eq!(ds.bottleneck_early_dropped, 0, "all ECT(0): {ds:?}");

    // Not-ECT packets the curve picks are dropped instead of marked (RFC 3168 §5).
    thread::sleep(Duration::from_millis(100));
    let (s0, _) = impair_stats(&a.ifname);
    let before = xdp_stats(&b.ifname);
    send_from_a_tos(
        &st.pair,
        (0..2000u32).map(|i| roce_packet(i, 1000)).collect(),
        4791,
        0,
    );
    let (s1, _) = impair_stats(&a.ifname);
    let ds = s1.saturating_sub(&s0);
    assert_eq!(
        ds.passed + ds.bottleneck_dropped + ds.bottleneck_early_dropped,
        2000,
        "{ds:?}"
    );
    assert_eq!(ds.bottleneck_marked, 0, "{ds:?}");
    assert!(ds.bottleneck_early_dropped > 5, "{ds:?}");
    let d = xdp_stats(&b.ifname).saturating_sub(&before);
    assert_eq!((d.roce_packets, d.ecn_ce), (ds.passed, 0));
    roce_ok(&["impair", "-i", &a.ifname, "--off"]);
    assert!(!impair_dir(&a.ifname).exists());
}

/// The topology for impairing traffic that AF_XDP sends: an AF_XDP socket transmits with
/// `__dev_direct_xmit` (net/xdp/xsk.c), which skips the qdisc layer and with it the tc egress
/// hook, so roce_impair on the sender's own interface never sees those frames. A router
/// namespace in between forwards them through the normal stack, and roce_impair on the
/// router's egress toward the receiver sees them all.
#[test]
fn impair_on_a_router_between_two_hosts() {
    require_root();
    let t = tag("rt");
    let (na, nr, nb) = (
        netns::NetNs::new(&format!("{t}-a")).unwrap(),
        netns::NetNs::new(&format!("{t}-r")).unwrap(),
        netns::NetNs::new(&format!("{t}-b")).unwrap(),
    );
    let (a0, r0, r1, b0) = (
        format!("{t}a0"),
        format!("{t}r0"),
        format!("{t}r1"),
        format!("{t}b0"),
    );
    na.ip(&[
        "link",
        "add",
        &a0,
        "type",
        "veth",
        "peer",
        "name",
        &r0,
        "netns",
        nr.name(),
    ])
    .unwrap();
    nr.ip(&[
        "link",
        "add",
        &r1,
        "type",
        "veth",
        "peer",
        "name",
        &b0,
        "netns",
        nb.name(),
    ])
    .unwrap();
    for (ns, ifname, addr) in [
        (&na, &a0, "10.93.1.1/24"),
        (&nr, &r0, "10.93.1.2/24"),
        (&nr, &r1, "10.93.2.1/24"),
        (&nb, &b0, "10.93.2.2/24"),
    ] {
        ns.ip(&["addr", "add", addr, "dev", ifname]).unwrap();
        ns.ip(&["link", "set", "dev", ifname, "up"]).unwrap();
    }
    na.ip(&["route", "add", "default", "via", "10.93.1.2"])
        .unwrap();
    nb.ip(&["route", "add", "default", "via", "10.93.2.1"])
        .unwrap();
    netns::run(
        "ip",
        &[
            "netns",
            "exec",
            nr.name(),
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    )
    .unwrap();
    let _cleanup = Cleanup {
        impaired: r1.clone(),
        loaded: Some(b0.clone()),
    };
    roce_ok(&["--netns", nb.name(), "load", "-i", &b0]);
    roce_ok(&[
        "--netns",
        nr.name(),
        "impair",
        "-i",
        &r1,
        "--ce",
        "1",
        "--drop",
        "0.25",
    ]);
    let before = xdp_stats(&b0);
    let n = 1000u32;
    netns::in_netns(na.name(), move || {
        pin_to_cpu0();
        let s = UdpSocket::bind("10.93.1.1:0").unwrap();
        // Let ARP settle on both hops first.
        let _ = s.send_to(b"hello", "10.93.2.2:9");
        thread::sleep(Duration::from_millis(300));
        for i in 0..n {
            s.send_to(&roce_packet(i, 64), "10.93.2.2:4791").unwrap();
        }
    })
    .unwrap();
    thread::sleep(Duration::from_millis(300));
    let (s, _) = impair_stats(&r1);
    assert_eq!(
        s.seen,
        u64::from(n),
        "every forwarded RoCE packet passed the hook: {s:?}"
    );
    assert_eq!(s.dropped + s.passed, u64::from(n));
    assert!((150..=350).contains(&s.dropped), "{s:?}");
    let d = xdp_stats(&b0).saturating_sub(&before);
    assert_eq!(d.roce_packets, s.passed, "{d:?}");
    assert_eq!(d.ecn_ce, s.passed, "all marked: {d:?}");
}
