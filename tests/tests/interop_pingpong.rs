//! `roce pingpong` against the real ibv_rc_pingpong (rdma-core 44) on Linux Soft-RoCE in a VM,
//! both directions, with a capture, a tshark dissection, an ICRC check of every frame, and the
//! two sides' counters compared, per scenario. Root; boots the rxe-peer VM (building its image on
//! first use, failing loudly if it cannot).
//!
//! CI runs the whole ibv_rc_pingpong matrix: sizes 1, 1024, 4096 and 65536 B, 1000 iterations
//! each, at path MTU 1024 (on a 1500-byte link) and at path MTU 4096 (on a 9000-byte link), in
//! both directions; and 4096 and 65536 B at path MTU 2048 on the 9000-byte link. A frame of path
//! MTU 4096 does not fit one AF_XDP frame (4096 bytes, 256 of them headroom): on the 9000-byte
//! link our sockets are bound for multi-buffer packets, and every such frame crosses as two
//! descriptors (the test checks that they did). After the scenarios a second VM boots beside the
//! first and the two run the same sizes and MTUs against each other: the rxe ↔ rxe reference of
//! the same run. `ROCE_INTEROP_ITERS=N` changes the iteration count. At path MTU 1024 the
//! suite also runs Debian's unmodified ibv_rc_pingpong, ibv_uc_pingpong and ibv_srq_pingpong
//! on our side, on the drop-in libibverbs (`roce exec`), against the same program on rxe, at
//! 1, 4096 and 65536 B (ibv_srq_pingpong's 64 KiB runs, 16 QPs at once into the guest, only
//! with `ROCE_INTEROP_FULL=1`), both directions, and Debian's ibv_ud_pingpong the same way at
//! 1 B and the port MTU (1024 B); then ibv_rc_pingpong with `-e` and with `-N` at 4 KiB and
//! ibv_ud_pingpong with `-e` at 1024 B, both directions.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use roce_tests::{
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roles, SceneReport},
    tag,
};

fn iters() -> u32 {
    std::env::var("ROCE_INTEROP_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// One scenario in each direction for (size, mtu); returns the two reports.
fn both_ways(h: &Harness<'_>, size: u32, mtu: u32, port: &mut u16) -> Vec<SceneReport> {
    both_ways_with(h, (size, mtu), &[], port)
}

/// [`both_ways`] with `extra` arguments to `roce pingpong` (`--multipath`), named after them.
fn both_ways_with(
    h: &Harness<'_>,
    (size, mtu): (u32, u32),
    extra: &[&str],
    port: &mut u16,
) -> Vec<SceneReport> {
    let p = h.peer;
    let suffix: String = extra
        .iter()
        .map(|e| format!("-{}", e.trim_start_matches('-')))
        .collect();
    let n = iters();
    let mut out = Vec::new();
    *port += 1;
    out.push(
        h.run(
            &format!("ibv_rc_pingpong-server_rxe-s{size}-m{mtu}{suffix}"),
            &Roles::GuestServer {
                guest: rxe::pingpong_cmd(*port, size, n, mtu),
                ours: [
                    "pingpong",
                    "-d",
                    &p.ifname,
                    "-p",
                    &port.to_string(),
                    "-s",
                    &size.to_string(),
                    "-n",
                    &n.to_string(),
                    "-m",
                    &mtu.to_string(),
                    &p.guest_ip.to_string(),
                ]
                .iter()
                .chain(extra)
                .map(|a| (*a).to_owned())
                .collect(),
            },
            *port,
        ),
    );
    *port += 1;
    out.push(
        h.run(
            &format!("ibv_rc_pingpong-server_roce-s{size}-m{mtu}{suffix}"),
            &Roles::OurServer {
                ours: [
                    "pingpong",
                    "-d",
                    &p.ifname,
                    "-p",
                    &port.to_string(),
                    "-s",
                    &size.to_string(),
                    "-n",
                    &n.to_string(),
                    "-m",
                    &mtu.to_string(),
                ]
                .iter()
                .chain(extra)
                .map(|a| (*a).to_owned())
                .collect(),
                guest: format!("{} {}", rxe::pingpong_cmd(*port, size, n, mtu), p.host_ip),
            },
            *port,
        ),
    );
    out
}

/// Debian's unmodified `prog` (ibv_rc_pingpong, ibv_srq_pingpong, or ibv_ud_pingpong, which
/// has no `-m`: UD uses the port's MTU) on our side too, through the drop-in libibverbs
/// (`roce exec`), against the same tool on rxe with the same `flags` (`-e`, `-N`), one
/// scenario in each direction for (size, mtu).
fn drop_in_both_ways(
    h: &Harness<'_>,
    (prog, flags): (&str, &[&str]),
    size: u32,
    mtu: Option<u32>,
    port: &mut u16,
) -> Vec<SceneReport> {
    let p = h.peer;
    let n = iters();
    let gid = roce_tests::gid_index(&p.netns, &p.ifname, p.host_ip.into());
    let ours = |port: u16, server: Option<String>| {
        let mut v: Vec<String> = ["exec", "-d", &p.ifname, "--", prog, "-d"]
            .map(String::from)
            .to_vec();
        v.push(format!("roce_{}", p.ifname));
        for (flag, val) in [
            ("-g", gid.clone()),
            ("-p", port.to_string()),
            ("-s", size.to_string()),
            ("-n", n.to_string()),
        ] {
            v.extend([flag.to_owned(), val]);
        }
        if let Some(m) = mtu {
            v.extend(["-m".to_owned(), m.to_string()]);
        }
        v.extend(flags.iter().map(|f| (*f).to_owned()));
        v.extend(server);
        v
    };
    let m = mtu.map(|m| format!(" -m {m}")).unwrap_or_default();
    let f: String = flags.iter().map(|f| format!(" {f}")).collect();
    let guest =
        |port: u16| format!("{prog} -d rxe0 -g $RXE_GID_INDEX -p {port} -s {size} -n {n}{m}{f}");
    let tag = format!(
        "s{size}{}{}",
        mtu.map(|m| format!("-m{m}")).unwrap_or_default(),
        flags.concat()
    );
    let mut out = Vec::new();
    *port += 1;
    out.push(h.run(
        &format!("dropin-{prog}-server_rxe-{tag}"),
        &Roles::GuestServer {
            guest: guest(*port),
            ours: ours(*port, Some(p.guest_ip.to_string())),
        },
        *port,
    ));
    *port += 1;
    out.push(h.run(
        &format!("dropin-{prog}-server_roce-{tag}"),
        &Roles::OurServer {
            ours: ours(*port, None),
            guest: format!("{} {}", guest(*port), p.host_ip),
        },
        *port,
    ));
    out
}

/// Debian's `ibv_devinfo -v` on the drop-in library beside rxe's in the VM, field by field:
/// every field equal or explained (`roce_tests::devinfo::EXPLAINED`), and every GID of both
/// sides a RoCE v2 GID. Returns the comparison's report.
fn devinfo_against_rxe(peer: &Peer) -> String {
    let theirs = peer.exec("ibv_devinfo -v", Duration::from_secs(30));
    assert_eq!(theirs.rc, 0, "rxe's ibv_devinfo -v: {}", theirs.out);
    let o = roce_tests::roce(&[
        "--netns",
        &peer.netns,
        "exec",
        "-d",
        &peer.ifname,
        "--",
        "ibv_devinfo",
        "-v",
    ]);
    let ours = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "our ibv_devinfo -v: {ours}");
    for out in [&theirs.out, &ours] {
        let gids = roce_tests::devinfo::parse(out)
            .remove("port.GID")
            .unwrap_or_else(|| panic!("no GIDs in:\n{out}"));
        assert!(
            gids.split("; ").all(|g| g.ends_with("RoCE v2")),
            "not all RoCE v2: {gids}"
        );
    }
    let c = roce_tests::devinfo::compare(&theirs.out, &ours);
    assert!(
        c.unexplained.is_empty() && c.equal.len() > 40,
        "ibv_devinfo -v differs from rxe's:\n{}",
        c.text()
    );
    c.text()
}

/// Checks what each side says it did, on top of the harness's checks.
fn check_outputs(r: &mut SceneReport, size: u32) {
    let n = u64::from(iters());
    match rxe::pingpong_summary(&r.guest.out) {
        Some((it, _)) if it == n => {}
        other => r
            .failures
            .push(format!("pingpong summary {other:?}, want {n} iters")),
    }
    if let Ok(v) = &r.ours {
        if let Some(text) = v["exec_stdout"].as_str() {
            // ibv_rc_pingpong on the drop-in library: its own summary, and its byte count.
            let bytes = format!("{} bytes in", n * u64::from(size) * 2);
            if rxe::pingpong_summary(text).map(|x| x.0) != Some(n) || !text.contains(&bytes) {
                r.failures
                    .push(format!("the pingpong on roce-xdp said {text}"));
            }
        } else if v["iters"].as_u64() != Some(n)
            || v["bytes"].as_u64() != Some(n * u64::from(size) * 2)
        {
            r.failures.push(format!("roce pingpong said {v}"));
        }
    }
}

/// The rxe ↔ rxe reference for (size, mtu): the same ibv_rc_pingpong between `server` and
/// `client` (two rxe VMs on one bridge), in µs per iteration as the client reports it.
fn rxe_reference(
    server: &Peer,
    client: &Peer,
    size: u32,
    mtu: u32,
    port: &mut u16,
) -> Result<f64, String> {
    rxe::twice(|| {
        *port += 1;
        let n = iters();
        let cmd = rxe::pingpong_cmd(*port, size, n, mtu);
        let out = rxe::rxe_pair(server, client, &cmd, *port, Duration::from_secs(300))?;
        match rxe::pingpong_summary(&out.out) {
            Some((it, us)) if it == u64::from(n) => Ok(us),
            other => Err(format!(
                "rxe ↔ rxe ibv_rc_pingpong -s {size} -m {mtu}: summary {other:?}: {}",
                out.out
            )),
        }
    })
}

/// Boots a second VM beside `peer` and measures the rxe ↔ rxe reference of every (size, mtu)
/// the reports cover, after the scenarios, so that the idle VM does not load them.
fn references(
    peer: &Peer,
    opts: &PeerOptions,
    reports: &[SceneReport],
    port: &mut u16,
) -> References {
    let second = Peer::boot_beside(peer, opts);
    let mut refs = References::new();
    for r in reports {
        if r.name.contains("ibv_ud_pingpong") {
            // The references are ibv_rc_pingpong's; UD runs have none.
            continue;
        }
        let key = size_mtu(&r.name);
        refs.entry(key)
            .or_insert_with(|| rxe_reference(peer, &second, key.0, key.1, port));
    }
    refs
}

/// ibv_rc_pingpong µs per iteration between two rxe VMs, by (size, path MTU).
type References = BTreeMap<(u32, u32), Result<f64, String>>;

/// (size, mtu) from a scenario name `...-s{size}-m{mtu}`.
fn size_mtu(name: &str) -> (u32, u32) {
    let num = |tag: &str| {
        name.rsplit_once(tag)
            .and_then(|(_, rest)| rest.split('-').next()?.parse().ok())
            .unwrap_or(0)
    };
    (num("-s"), num("-m"))
}

fn summarize(reports: &[SceneReport], refs: &References) -> String {
    let mut s = String::new();
    for r in reports {
        let ours_us = r
            .ours
            .as_ref()
            .ok()
            .and_then(|v| {
                v["usec_per_iter"].as_f64().or_else(|| {
                    v["exec_stdout"]
                        .as_str()
                        .and_then(rxe::pingpong_summary)
                        .map(|x| x.1)
                })
            })
            .unwrap_or(f64::NAN);
        let guest_us = rxe::pingpong_summary(&r.guest.out).map_or(f64::NAN, |x| x.1);
        let ref_us = refs
            .get(&size_mtu(&r.name))
            .and_then(|x| x.as_ref().ok())
            .copied()
            .unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "{:<48} {:<4} ours {:>9.1} us/iter  rxe {:>9.1} us/iter  rxe<->rxe {:>9.1} us/iter  pcap {:>6}/{:<6} retx rxe {} ours {}  {:>5.1}s {}",
            r.name,
            if r.ok() { "ok" } else { "FAIL" },
            ours_us,
            guest_us,
            ref_us,
            r.icrc.good,
            r.rxe.get("sent_pkts").copied().unwrap_or(0)
                + r.ours_ctr.get("sent_pkts").copied().unwrap_or(0),
            r.ours_ctr.get("duplicate_request").copied().unwrap_or(0),
            r.rxe.get("duplicate_request").copied().unwrap_or(0),
            r.secs,
            r.failures.join(" | ")
        );
        if !r.ok() {
            let _ = writeln!(s, "    rxe {:?}\n    ours {:?}", r.rxe, r.ours_ctr);
        }
    }
    for ((size, mtu), v) in refs {
        if let Err(e) = v {
            let _ = writeln!(s, "rxe<->rxe s{size} m{mtu} FAILED: {e}");
        }
    }
    s
}

fn write_results(file: &str, text: &str) {
    let dir = rxe::out_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(file), text);
}

#[test]
fn ibv_rc_pingpong_both_directions_mtu_1024() {
    require_root();
    let peer = Peer::boot(&tag("pp"), 61, &PeerOptions::default());
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let devinfo = devinfo_against_rxe(&peer);
    println!("{devinfo}");
    write_results("devinfo.txt", &devinfo);
    let mut port = 19100;
    let mut reports = Vec::new();
    for size in [1u32, 1024, 4096, 65536] {
        for mut r in both_ways(&h, size, 1024, &mut port) {
            check_outputs(&mut r, size);
            reports.push(r);
        }
    }
    // The same tool on both sides: Debian's ibv_rc_pingpong, ibv_uc_pingpong (UC QPs: no
    // ACKs, so a frame lost on the way would lose its message and stall the ping-pong; the
    // scenario then fails on its timeout) and ibv_srq_pingpong (16 QPs on one SRQ) on the
    // drop-in libibverbs here.
    for prog in ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_srq_pingpong"] {
        for size in [1u32, 4096, 65536] {
            if prog == "ibv_srq_pingpong" && size == 65536 && !rxe::full() {
                continue;
            }
            for mut r in drop_in_both_ways(&h, (prog, &[]), size, Some(1024), &mut port) {
                check_outputs(&mut r, size);
                reports.push(r);
            }
        }
    }
    // ibv_ud_pingpong both ways: address handles, UD sends and GRH receives against rxe's, up
    // to the port MTU (1024 on the 1500-byte link).
    for size in [1u32, 1024] {
        for mut r in drop_in_both_ways(&h, ("ibv_ud_pingpong", &[]), size, None, &mut port) {
            check_outputs(&mut r, size);
            reports.push(r);
        }
    }
    // Completion channels (-e) on both sides, and ibv_rc_pingpong's new post-send API (-N).
    for (prog, flags, size, mtu) in [
        ("ibv_rc_pingpong", &["-e"][..], 4096, Some(1024)),
        ("ibv_rc_pingpong", &["-N"][..], 4096, Some(1024)),
        ("ibv_ud_pingpong", &["-e"][..], 1024, None),
    ] {
        for mut r in drop_in_both_ways(&h, (prog, flags), size, mtu, &mut port) {
            check_outputs(&mut r, size);
            reports.push(r);
        }
    }
    let refs = references(&peer, &PeerOptions::default(), &reports, &mut port);
    let text = summarize(&reports, &refs);
    println!("boot {:.1}s\n{text}", peer.boot_secs);
    write_results("pingpong-mtu1024.txt", &text);
    assert!(
        reports.iter().all(SceneReport::ok),
        "ibv_rc_pingpong interop failures:\n{text}"
    );
    rxe::assert_references(&refs, |(_, mtu)| format!("MTU {mtu}"));
}

/// `roce pingpong --multipath` against ibv_rc_pingpong on rxe, both directions: our address
/// message carries the multipath hint (its hex digits in upper case, docs/multipath.md "Hints
/// out of band"), which ibv_rc_pingpong reads as the same address (`sscanf` `%x`); rxe sends
/// no hint and never offers, so every packet stays plain RoCE v2 but for our offer bit
/// (dissected, ICRCs and counters checked per scenario by the harness).
#[test]
fn ibv_rc_pingpong_against_roce_pingpong_with_the_multipath_hint() {
    require_root();
    let peer = Peer::boot(&tag("ppm"), 203, &PeerOptions::default());
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let mut port = 19180;
    let mut reports = Vec::new();
    for size in [4096u32, 65536] {
        for mut r in both_ways_with(&h, (size, 1024), &["--multipath"], &mut port) {
            check_outputs(&mut r, size);
            reports.push(r);
        }
    }
    let failures: Vec<String> = reports
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{}: {:?}", r.name, r.failures))
        .collect();
    assert_eq!(reports.len(), 4);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A 9000-byte link, where rxe runs path MTU 4096: ibv_rc_pingpong at path MTU 4096 (every
/// size) and 2048 (4096 and 65536 B) both ways, with roce_xdp in generic (skb) mode (native XDP
/// on a veth refuses an MTU above ~3500). Our sockets take multi-buffer packets there; the
/// frames of MTU 4096 that carry a full payload must have crossed as two descriptors each way.
#[test]
fn ibv_rc_pingpong_jumbo_link_mtu_4096_and_2048() {
    require_root();
    let opts = PeerOptions {
        mtu: 9000,
        ..PeerOptions::default()
    };
    let peer = Peer::boot(&tag("pj"), 62, &opts);
    let o = peer.exec(
        "ibv_devinfo -d rxe0 | grep active_mtu",
        Duration::from_secs(20),
    );
    assert!(o.out.contains("4096"), "rxe active MTU: {}", o.out);
    // Native XDP on a veth refuses a 9000-byte MTU; generic XDP takes it.
    let h = Harness::with_mode(
        &peer,
        &rxe::out_dir().join("pcap"),
        roce::loader::AttachMode::Skb,
    );
    let mut port = 19200;
    let mut reports = Vec::new();
    for (mtu, sizes) in [
        (4096u32, &[1u32, 1024, 4096, 65536][..]),
        (2048, &[4096, 65536]),
    ] {
        for &size in sizes {
            for mut r in both_ways(&h, size, mtu, &mut port) {
                check_outputs(&mut r, size);
                if mtu == 4096 && size >= 4096 {
                    check_multi_buffer(&mut r, size);
                }
                reports.push(r);
            }
        }
    }
    let refs = references(&peer, &opts, &reports, &mut port);
    let text = summarize(&reports, &refs);
    println!("boot {:.1}s\n{text}", peer.boot_secs);
    write_results("pingpong-jumbo.txt", &text);
    assert!(
        reports.iter().all(SceneReport::ok),
        "ibv_rc_pingpong interop failures on the 9000-byte link:\n{text}"
    );
    rxe::assert_references(&refs, |(_, mtu)| format!("MTU {mtu}"));
}

/// At path MTU 4096 every full-payload frame is longer than an AF_XDP frame holds, so each one
/// must have been joined from two RX descriptors and split over two TX descriptors: at least
/// one of each per full packet of each message, every iteration.
fn check_multi_buffer(r: &mut SceneReport, size: u32) {
    let full = u64::from(iters()) * u64::from(size / 4096);
    for name in ["rx_multi_buffer", "tx_multi_buffer"] {
        let got: i64 = r
            .other
            .iter()
            .filter(|(k, _)| k.starts_with("xsk_q") && k.ends_with(&format!(".{name}")))
            .map(|(_, v)| *v)
            .sum();
        if got < i64::try_from(full).unwrap_or(i64::MAX) {
            r.failures.push(format!(
                "{name} {got}, want at least {full} (one per 4 KiB packet)"
            ));
        }
    }
}
