//! IPv6 GIDs against Linux Soft-RoCE in a VM (`--ipv6`): rxe adds a RoCE v2 GID for the
//! guest's global address fd79:67::2; ours uses the GID of fd79:67::1. ibv_rc_pingpong and
//! ib_write_bw / ib_read_bw, both directions, each captured and checked. Root.
//!
//! The out-of-band TCP connection goes over IPv4: ibv_rc_pingpong and perftest servers listen
//! on 0.0.0.0 only, and perftest's client refuses an IPv6 host ("Address family for hostname
//! not supported"). The GIDs alone decide that RoCE runs over IPv6. rxe sends its IPv6 RoCE
//! frames with UDP checksum 0 (illegal for IPv6, tshark flags it); ours carry the checksum.

use std::{net::Ipv6Addr, time::Duration};

use roce_tests::{
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roles, SceneReport},
    tag,
};

#[test]
fn ipv6_gids_pingpong_and_perftest_both_directions() {
    require_root();
    let peer = Peer::boot(
        &tag("v6"),
        67,
        &PeerOptions {
            ipv6: true,
            ..PeerOptions::default()
        },
    );
    let guest6: Ipv6Addr = "fd79:67::2".parse().unwrap();
    let host6: Ipv6Addr = "fd79:67::1".parse().unwrap();
    let rxe_gid = peer.gid_index_of(guest6, Duration::from_secs(20));
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let our_gid = peer.our_gid_index(host6.into()).to_string();
    let mut reports: Vec<SceneReport> = Vec::new();
    let mut port = 19800;
    for guest_server in [true, false] {
        port += 1;
        let p = port.to_string();
        let tool = format!("ibv_rc_pingpong -d rxe0 -g {rxe_gid} -p {port} -s 4096 -n 500 -m 1024");
        let mut ours: Vec<String> = [
            "pingpong",
            "-d",
            &peer.ifname,
            "-g",
            &our_gid,
            "-p",
            &p,
            "-s",
            "4096",
            "-n",
            "500",
            "-m",
            "1024",
        ]
        .map(String::from)
        .to_vec();
        let side = if guest_server { "rxe" } else { "roce" };
        let roles = if guest_server {
            ours.push(peer.guest_ip.to_string());
            Roles::GuestServer { guest: tool, ours }
        } else {
            Roles::OurServer {
                ours,
                guest: format!("{tool} {}", peer.host_ip),
            }
        };
        let mut r = h.run(&format!("ipv6-ibv_rc_pingpong-server_{side}"), &roles, port);
        if !r.pcap.ipv6_zero_udp_csum.contains_key(&guest6.to_string()) {
            r.failures
                .push("no RoCE over IPv6 from rxe in the capture".into());
        }
        if rxe::pingpong_summary(&r.guest.out).map(|x| x.0) != Some(500) {
            r.failures.push(format!("ibv_rc_pingpong: {}", r.guest.out));
        }
        reports.push(r);
    }
    for op in ["write", "read"] {
        for guest_server in [true, false] {
            port += 1;
            let p = port.to_string();
            let tool =
                format!("ib_{op}_bw -d rxe0 -x {rxe_gid} -F -p {port} -s 65536 -n 100 -m 1024");
            let mut ours: Vec<String> = [
                "perf",
                op,
                "-d",
                &peer.ifname,
                "-g",
                &our_gid,
                "-p",
                &p,
                "-s",
                "65536",
                "-n",
                "100",
                "-m",
                "1024",
                "--no-verify",
            ]
            .map(String::from)
            .to_vec();
            let side = if guest_server { "rxe" } else { "roce" };
            let roles = if guest_server {
                ours.push(peer.guest_ip.to_string());
                Roles::GuestServer { guest: tool, ours }
            } else {
                Roles::OurServer {
                    ours,
                    guest: format!("{tool} {}", peer.host_ip),
                }
            };
            let mut r = h.run(&format!("ipv6-ib_{op}_bw-server_{side}"), &roles, port);
            if rxe::perftest_bw_line(&r.guest.out).map(|x| x.1) != Some(100) {
                r.failures.push(format!(
                    "perftest: {}",
                    r.guest.out.lines().last().unwrap_or("")
                ));
            }
            reports.push(r);
        }
    }
    let mut text = String::new();
    for r in &reports {
        text.push_str(&format!(
            "{:<40} {:<4} pcap {} {}\n",
            r.name,
            if r.ok() { "ok" } else { "FAIL" },
            r.icrc.good,
            r.failures.join(" | ")
        ));
    }
    println!("rxe GID index {rxe_gid}, ours {our_gid}\n{text}");
    let _ = std::fs::create_dir_all(rxe::out_dir());
    let _ = std::fs::write(rxe::out_dir().join("ipv6.txt"), &text);
    assert!(
        reports.iter().all(SceneReport::ok),
        "IPv6 interop failures:\n{text}"
    );
}
