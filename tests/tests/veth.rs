//! `roce load/status/stats/unload` on a veth pair between two namespaces this test makes, with
//! real UDP 4791 traffic from the peer namespace. Needs root.

use std::{
    net::{SocketAddr, UdpSocket},
    path::Path,
    process::Command,
    time::Duration,
};

use roce::{
    loader::{Pins, pin_dir},
    netns,
};
use roce_common::{counters::XdpStats, opcode::Opcode};
use roce_tests::{Frame, Loaded, require_root, roce, roce_bin, roce_ok, veth_pair};
use serde_json::Value;

#[track_caller]
fn roce_err(args: &[&str], needle: &str) {
    let o = roce(args);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "roce {args:?} should exit 1: {all}"
    );
    assert!(
        all.contains(needle),
        "roce {args:?} should say {needle:?}: {all}"
    );
}

fn bpftool_sum(ifname: &str) -> XdpStats {
    let path = pin_dir(ifname).join("ROCE_XDP_STATS");
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&path)
        .output()
        .expect("bpftool (apt install bpftool)");
    assert!(
        out.status.success(),
        "bpftool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    // With BTF, bpftool -j adds "formatted": {"key": 0, "values": [{"cpu": N, "value": {<field>: n}}]}.
    let mut total = XdpStats::default();
    for cpu in v[0]["formatted"]["values"]
        .as_array()
        .unwrap_or_else(|| panic!("no BTF-formatted values: {v}"))
    {
        for name in XdpStats::NAMES {
            *total.get_mut(name).unwrap() += cpu["value"][name]
                .as_u64()
                .unwrap_or_else(|| panic!("bpftool shows no field {name}: {cpu}"));
        }
    }
    total
}

fn roce_stats(ifname: &str) -> XdpStats {
    let v: Value =
        serde_json::from_str(&roce_ok(&["stats", "-i", ifname, "-j"])).expect("stats JSON");
    let mut s = XdpStats::default();
    for name in XdpStats::NAMES {
        *s.get_mut(name).unwrap() = v["xdp"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("roce stats has no {name}"));
    }
    s
}

#[test]
fn load_steer_count_and_unload_on_veth() {
    require_root();
    let pair = veth_pair("rv", 71);
    let b = pair.b.clone();

    let out = roce_ok(&["--netns", &b.netns, "-j", "load", "-i", &b.ifname]);
    let _guard = Loaded::guard(&b.ifname);
    let loaded: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(loaded["mode"], "native");
    assert!(loaded["prog_id"].as_u64().unwrap() > 0);
    for pin in [
        "ROCE_XDP_STATS",
        "ROCE_XSKS",
        "ROCE_QPS",
        "ROCE_INFO",
        "link",
    ] {
        assert!(pin_dir(&b.ifname).join(pin).exists(), "pin {pin} missing");
    }

    // It stays attached after `roce load` exited, and status says so.
    let link = netns::ip_in(&b.netns, &["-d", "link", "show", "dev", &b.ifname]).unwrap();
    assert!(
        String::from_utf8_lossy(&link.stdout).contains("prog/xdp"),
        "no XDP program on {}",
        b.ifname
    );
    let status: Value = serde_json::from_str(&roce_ok(&["-j", "status"])).unwrap();
    let mine = status
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ifname"] == b.ifname.as_str())
        .expect("in status");
    assert_eq!(mine["mode"], "native");
    assert_eq!(mine["netns"], b.netns.as_str());
    assert_eq!(mine["prog_id"], loaded["prog_id"]);
    assert_eq!(mine["port"], 4791);

    // Errors: already loaded, no such interface, native refused, JSON error format.
    roce_err(
        &["--netns", &b.netns, "load", "-i", &b.ifname],
        "already loaded",
    );
    roce_err(
        &["--netns", &b.netns, "load", "-i", "nosuch0"],
        "no such interface",
    );
    roce_err(
        &["--netns", &b.netns, "load", "-i", "lo", "-m", "native"],
        "native XDP refused",
    );
    let o = roce(&["-j", "--netns", &b.netns, "load", "-i", "nosuch0"]);
    let e: Value = serde_json::from_slice(&o.stdout).expect("JSON error");
    assert!(
        e["error"].as_str().unwrap().contains("no such interface"),
        "{e}"
    );
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(roce_bin())
        .args(["load", "-i", &b.ifname])
        .output()
        .expect("setpriv");
    assert_eq!(nobody.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("must be run as root"));

    Pins::new(&b.ifname)
        .add_qp(0x11, std::process::id())
        .unwrap();
    let before = roce_stats(&b.ifname);

    // A kernel socket in B on another UDP port: non-RoCE traffic must still reach it.
    let b_ip = b.ipv4;
    let n = 200u32;
    let receiver = std::thread::spawn({
        let ns = b.netns.clone();
        move || {
            netns::enter(&ns).unwrap();
            let s = UdpSocket::bind(SocketAddr::from((b_ip, 9000))).unwrap();
            // Room for the whole burst even when this thread is slow to run (a loaded machine).
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut buf = [0u8; 2048];
            let mut got = 0;
            while got < n && s.recv(&mut buf).is_ok() {
                got += 1;
            }
            got
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let ours = Frame {
        payload: 100,
        ..Frame::default()
    }
    .roce_bytes();
    let foreign = Frame {
        dest_qp: 0x22,
        ..Frame::default()
    }
    .roce_bytes();
    let cnp = Frame {
        opcode: Opcode::CNP,
        payload: 0,
        ..Frame::default()
    }
    .roce_bytes();
    let bad = Frame {
        tver: 2,
        ..Frame::default()
    }
    .roce_bytes();
    let a_ip = pair.a.ipv4;
    netns::in_netns(&pair.a.netns, move || {
        let s = UdpSocket::bind(SocketAddr::from((a_ip, 0))).unwrap();
        for _ in 0..n {
            for p in [&ours, &foreign, &cnp, &bad] {
                s.send_to(p, SocketAddr::from((b_ip, 4791))).unwrap();
            }
            s.send_to(b"not roce", SocketAddr::from((b_ip, 9000)))
                .unwrap();
            // Paced: veth's per-queue XDP ring holds 256 frames, and a burst from a tight loop
            // overflows it when the receiving side is slow to run (a loaded machine).
            std::thread::sleep(Duration::from_micros(200));
        }
    })
    .unwrap();
    assert_eq!(
        receiver.join().unwrap(),
        n,
        "kernel socket on port 9000 must get every datagram"
    );
    std::thread::sleep(Duration::from_millis(200));

    // The kernel's own frames (IPv6 neighbour and multicast-listener traffic) can reach the
    // link at any time, so `roce stats` is read between two bpftool dumps and every counter
    // must lie between them (and equal them when nothing arrived in between).
    let tool_before = bpftool_sum(&b.ifname);
    let ours_stats = roce_stats(&b.ifname);
    let tool_after = bpftool_sum(&b.ifname);
    for name in XdpStats::NAMES {
        let (lo, got, hi) = (
            tool_before.get(name).unwrap(),
            ours_stats.get(name).unwrap(),
            tool_after.get(name).unwrap(),
        );
        assert!(
            (lo..=hi).contains(&got),
            "roce stats -j and bpftool map dump -j disagree on {name}: {got}, bpftool {lo} before and {hi} after"
        );
    }
    let d = ours_stats.saturating_sub(&before);
    let n = u64::from(n);
    assert_eq!(
        d.redirect_fallback_pass,
        2 * n,
        "our QP's SEND and CNP (no AF_XDP socket bound)"
    );
    assert_eq!(d.pass_foreign_qp, n);
    assert_eq!(d.cnp, n);
    assert_eq!(d.drop_bad_tver, n);
    assert_eq!(d.roce_packets, 3 * n);
    assert!(d.pass_not_roce >= n, "{d:?}");
    assert!(d.rx_packets >= 5 * n);

    // bpftool prints the BTF field names.
    let text = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(pin_dir(&b.ifname).join("ROCE_XDP_STATS"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    for name in ["redirect_fallback_pass", "drop_bad_tver", "ecn_ce"] {
        assert!(
            text.contains(name),
            "bpftool text dump lacks {name}:\n{text}"
        );
    }

    // Text stats and watch mode.
    let txt = roce_ok(&["stats", "-i", &b.ifname]);
    assert!(
        txt.contains(&format!("     drop_bad_tver: {}", tool_after.drop_bad_tver)),
        "{txt}"
    );
    let watch = roce_ok(&["stats", "-i", &b.ifname, "-j", "-w", "0.2", "-c", "2"]);
    assert_eq!(watch.lines().count(), 2, "{watch}");

    // Unload leaves nothing behind.
    let prog_id = loaded["prog_id"].as_u64().unwrap();
    let un: Value = serde_json::from_str(&roce_ok(&["-j", "unload", "-i", &b.ifname])).unwrap();
    assert_eq!(un["detached"], true);
    assert!(!pin_dir(&b.ifname).exists(), "pins left behind");
    let link = netns::ip_in(&b.netns, &["-d", "link", "show", "dev", &b.ifname]).unwrap();
    assert!(
        !String::from_utf8_lossy(&link.stdout).contains("prog/xdp"),
        "XDP program still attached"
    );
    let progs = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .unwrap();
    let progs: Value = serde_json::from_slice(&progs.stdout).unwrap();
    assert!(
        !progs
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"].as_u64() == Some(prog_id)),
        "program {prog_id} still loaded"
    );
    roce_err(&["unload", "-i", &b.ifname], "not loaded");
    assert!(!Path::new(&format!("/sys/fs/bpf/roce/{}", b.ifname)).exists());
}

#[test]
fn skb_mode_and_custom_port() {
    require_root();
    let pair = veth_pair("rs", 72);
    let b = pair.b.clone();
    roce_ok(&[
        "--netns",
        &b.netns,
        "load",
        "-i",
        &b.ifname,
        "-m",
        "skb",
        "--port",
        "4792",
        "--drop-foreign",
    ]);
    let _guard = Loaded::guard(&b.ifname);
    let link = netns::ip_in(&b.netns, &["-d", "link", "show", "dev", &b.ifname]).unwrap();
    assert!(
        String::from_utf8_lossy(&link.stdout).contains("xdpgeneric"),
        "not in generic mode"
    );
    let status: Value = serde_json::from_str(&roce_ok(&["-j", "status"])).unwrap();
    let mine = status
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ifname"] == b.ifname.as_str())
        .unwrap();
    assert_eq!(mine["mode"], "skb");
    assert_eq!(mine["port"], 4792);
    assert_eq!(mine["drop_foreign"], true);

    let before = roce_stats(&b.ifname);
    let foreign = Frame {
        dest_qp: 0x22,
        ..Frame::default()
    }
    .roce_bytes();
    let (a_ip, b_ip) = (pair.a.ipv4, b.ipv4);
    netns::in_netns(&pair.a.netns, move || {
        let s = UdpSocket::bind(SocketAddr::from((a_ip, 0))).unwrap();
        for _ in 0..50 {
            s.send_to(&foreign, SocketAddr::from((b_ip, 4792))).unwrap();
            s.send_to(&foreign, SocketAddr::from((b_ip, 4791))).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let d = roce_stats(&b.ifname).saturating_sub(&before);
    assert_eq!(d.drop_foreign_qp, 50, "{d:?}");
    assert!(
        d.pass_not_roce >= 50,
        "4791 is not the RoCE port here: {d:?}"
    );
    roce_ok(&["unload", "-i", &b.ifname]);
}
