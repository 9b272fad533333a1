//! The drop-in libibverbs (roce-user/verbs) under Debian's unmodified `ibv_devices` and
//! `ibv_devinfo` (ibverbs-utils): the device is listed, its attributes and GID table are what
//! the engine uses, and the library's symbols carry the version nodes those binaries require.
//! Programs are started the ways users start them: `roce exec`, `roce --netns NS exec`, and
//! `ip netns exec NS` with `LD_LIBRARY_PATH`. Root.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::{Command, Output},
};

use nix::errno::Errno;
use roce::{netns::VethEnd, transport::DeviceConfig};
use roce_tests::{ipv4_gid_index, require_root, roce, roce_bin, roce_ok, veth_pair};

fn text(o: &Output) -> String {
    roce_tests::output_text(o)
}

/// Runs `prog args` in `end`'s namespace with `ip netns exec` and the library on
/// LD_LIBRARY_PATH, ROCE_DEVICES set to `devices` when given.
fn ip_netns_exec(end: &VethEnd, devices: Option<&str>, prog: &[&str]) -> Output {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &end.netns, "env"]);
    c.arg(format!(
        "LD_LIBRARY_PATH={}",
        roce_tests::drop_in_lib_dir().display()
    ));
    if let Some(d) = devices {
        c.arg(format!("ROCE_DEVICES={d}"));
    }
    c.args(prog).output().expect("ip netns exec")
}

/// The node GUID rxe would give a port with this MAC, as ibv_devices prints it.
fn guid_hex(mac: [u8; 6]) -> String {
    let g = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    g.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value after `key:` on the first line of ibv_devinfo's output that has it.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
        .trim()
}

#[test]
fn ibv_devices_and_ibv_devinfo_show_the_device_as_the_engine_sees_it() {
    require_root();
    let pair = veth_pair("vb1", 170);
    let a = &pair.a;
    let name = format!("roce_{}", a.ifname);

    // ibv_devices through `ip netns exec ... roce exec`, as a user runs it.
    let roce_path = roce_bin();
    let o = Command::new("ip")
        .args(["netns", "exec", &a.netns])
        .arg(&roce_path)
        .args(["exec", "-d", &a.ifname, "--", "ibv_devices"])
        .output()
        .expect("ibv_devices");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let row = out
        .lines()
        .find(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("{name} not listed:\n{out}"));
    assert!(row.contains(&guid_hex(a.mac)), "GUID from the MAC: {row}");

    // ibv_devinfo -v through `roce --netns NS exec` (no remount of /sys).
    let out = roce_ok(&[
        "--netns",
        &a.netns,
        "exec",
        "-d",
        &a.ifname,
        "--",
        "ibv_devinfo",
        "-v",
    ]);
    let cfg = DeviceConfig::default();
    assert_eq!(field(&out, "hca_id"), name);
    assert_eq!(field(&out, "transport"), "InfiniBand (0)");
    assert_eq!(field(&out, "vendor_id"), "0xffffff", "never a Mellanox id");
    assert_eq!(field(&out, "phys_port_cnt"), "1");
    assert_eq!(field(&out, "max_qp"), cfg.max_qp.to_string());
    assert_eq!(field(&out, "max_qp_wr"), cfg.max_qp_wr.to_string());
    assert_eq!(field(&out, "max_mr"), cfg.max_mr.to_string());
    assert_eq!(field(&out, "max_cqe"), cfg.max_cqe.to_string());
    assert_eq!(field(&out, "max_srq"), cfg.max_srq.to_string());
    assert_eq!(field(&out, "max_srq_wr"), cfg.max_srq_wr.to_string());
    assert_eq!(field(&out, "max_srq_sge"), cfg.max_srq_sge.to_string());
    assert_eq!(
        field(&out, "max_qp_rd_atom"),
        cfg.max_qp_rd_atom.to_string()
    );
    let guid = guid_hex(a.mac);
    let colons: Vec<&str> = (0..4).map(|i| &guid[i * 4..i * 4 + 4]).collect();
    assert_eq!(field(&out, "node_guid"), colons.join(":"));
    assert_eq!(field(&out, "state"), "PORT_ACTIVE (4)");
    assert_eq!(field(&out, "phys_state"), "LINK_UP (5)");
    assert_eq!(field(&out, "link_layer"), "Ethernet");
    // A link of MTU 1500 carries RoCE path MTU 1024, as `roce perf` chooses it.
    assert_eq!(field(&out, "active_mtu"), "1024 (3)");

    // The GID table is `roce gids`' table, index for index, every entry RoCE v2.
    let gids: Vec<serde_json::Value> = serde_json::from_str(&roce_ok(&[
        "--netns", &a.netns, "-j", "gids", "-i", &a.ifname,
    ]))
    .expect("gids JSON");
    let shown: Vec<(usize, String)> = out
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("GID[")?;
            let (i, rest) = l.split_once("]:")?;
            Some((i.trim().parse().ok()?, rest.trim().to_owned()))
        })
        .collect();
    let want: Vec<(usize, String)> = gids
        .iter()
        .map(|g| {
            (
                g["index"].as_u64().unwrap() as usize,
                format!("{}, RoCE v2", g["gid"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(shown, want, "{out}");
    assert!(
        want.iter()
            .any(|(_, g)| g.starts_with(&format!("::ffff:{}", a.ipv4))),
        "the IPv4 address is a GID: {want:?}"
    );
    assert_eq!(field(&out, "gid_tbl_len"), gids.len().max(1).to_string());

    // A link that goes down is a port that goes down.
    Command::new("ip")
        .args(["-n", &a.netns, "link", "set", &a.ifname, "down"])
        .status()
        .expect("ip link set down");
    let out = roce_ok(&[
        "--netns",
        &a.netns,
        "exec",
        "-d",
        &a.ifname,
        "--",
        "ibv_devinfo",
    ]);
    assert_eq!(field(&out, "state"), "PORT_DOWN (1)");
}

#[test]
fn the_device_list_follows_roce_devices_and_roce_load() {
    require_root();
    let pair = veth_pair("vb2", 171);
    let b = &pair.b;
    let name = format!("roce_{}", b.ifname);

    // Nothing loaded, nothing named: no device, as on a machine without an RDMA NIC.
    let o = ip_netns_exec(b, None, &["ibv_devinfo"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("No IB devices found"), "{}", text(&o));

    // An interface that is not there is refused by `roce exec` with the reason...
    let o = roce(&["--netns", &b.netns, "exec", "-d", "nosuch0", "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("no interface \"nosuch0\""),
        "{}",
        text(&o)
    );
    // ...and left out by the library with a warning when named in ROCE_DEVICES.
    let o = ip_netns_exec(b, Some(&format!("nosuch0,{}", b.ifname)), &["ibv_devices"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("names \"nosuch0\""), "{out}");
    assert!(out.contains(&name), "{out}");

    // After `roce load`, a program started with `ip netns exec` (which hides /sys/fs/bpf)
    // finds the interface by its pins, read through the initial mount namespace.
    roce_ok(&["--netns", &b.netns, "load", "-i", &b.ifname, "-m", "skb"]);
    let o = ip_netns_exec(b, None, &["ibv_devices"]);
    let listed = text(&o).contains(&name);
    roce_ok(&["--netns", &b.netns, "unload", "-i", &b.ifname]);
    assert!(o.status.success() && listed, "{}", text(&o));
    let o = ip_netns_exec(b, None, &["ibv_devices"]);
    assert!(!text(&o).contains(&name), "unloaded: {}", text(&o));
}

/// Every symbol Debian's ibv_devices and ibv_devinfo import is defined by the library with the
/// version node they require (they are linked with BIND_NOW: one missing symbol or node and
/// they would not start).
#[test]
fn the_library_defines_what_the_tools_import_with_their_versions() {
    require_root();
    let lib = roce_tests::drop_in_lib_dir().join("libibverbs.so.1");
    let dynsyms = |path: &str, undefined: bool| -> BTreeSet<(String, String)> {
        let o = Command::new("objdump")
            .args(["-T", path])
            .output()
            .expect("objdump (binutils)");
        assert!(o.status.success(), "objdump -T {path}");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("*UND*") == undefined && l.contains("IBVERBS"))
            .filter_map(|l| {
                let mut w = l.split_whitespace().rev();
                let name = w.next()?.to_owned();
                let ver = w.next()?.trim_matches(['(', ')']).to_owned();
                Some((ver, name))
            })
            .collect()
    };
    let defined = dynsyms(lib.to_str().unwrap(), false);
    for tool in [
        "/usr/bin/ibv_devices",
        "/usr/bin/ibv_devinfo",
        "/usr/bin/ibv_srq_pingpong",
    ] {
        let needed = dynsyms(tool, true);
        assert!(
            !needed.is_empty(),
            "{tool} imports nothing from libibverbs?"
        );
        let missing: Vec<_> = needed.difference(&defined).collect();
        assert!(missing.is_empty(), "{tool} needs {missing:?}");
    }
    let o = Command::new("readelf")
        .args(["-d", lib.to_str().unwrap()])
        .output()
        .expect("readelf");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Library soname: [libibverbs.so.1]"),
        "SONAME"
    );
}

/// The names of codes (`ibv_wc_status_str`, `ibv_node_type_str`, `ibv_port_state_str`) are
/// rdma-core's, code for code: Debian's library and ours, each loaded by Python's ctypes.
#[test]
fn code_names_are_rdma_cores() {
    require_root();
    let script = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
for fn, codes in [("ibv_wc_status_str", range(0, 30)), ("ibv_node_type_str", range(-1, 10)),
                  ("ibv_port_state_str", range(0, 8))]:
    f = getattr(lib, fn)
    f.restype = ctypes.c_char_p
    f.argtypes = [ctypes.c_int]
    print(fn, [f(i).decode() for i in codes])
"#;
    let names = |lib: &str| {
        let o = Command::new("python3")
            .args(["-c", script, lib])
            .output()
            .expect("python3");
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let ours = names(
        roce_tests::drop_in_lib_dir()
            .join("libibverbs.so.1")
            .to_str()
            .unwrap(),
    );
    let theirs = names("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert_eq!(ours, theirs);
}

/// Runs `ibv_rc_pingpong` server and client, both unmodified, both on the library, one on
/// each end of a veth pair; returns both outputs after checking both succeeded.
fn rc_pingpong(pair: &roce::netns::VethPair, port: u16, extra: &[&str]) -> (String, String) {
    pingpong("ibv_rc_pingpong", pair, port, extra)
}

/// Runs `prog` (an ibverbs-utils pingpong: `ibv_rc_pingpong`, `ibv_uc_pingpong`, ...) as
/// server and client, both unmodified, both on the library, one on each end of a veth pair;
/// returns both outputs after checking both succeeded.
fn pingpong(
    prog: &str,
    pair: &roce::netns::VethPair,
    port: u16,
    extra: &[&str],
) -> (String, String) {
    pingpong_on(prog, "inline", pair, port, extra)
}

/// [`pingpong`] with the library's engine run as `engine` (`roce exec --engine`).
fn pingpong_on(
    prog: &str,
    engine: &str,
    pair: &roce::netns::VethPair,
    port: u16,
    extra: &[&str],
) -> (String, String) {
    pingpong_exec(prog, &["--engine", engine], pair, port, extra)
}

/// [`pingpong`] with `exec_opts` given to `roce exec` at both ends.
fn pingpong_exec(
    prog: &str,
    exec_opts: &[&str],
    pair: &roce::netns::VethPair,
    port: u16,
    extra: &[&str],
) -> (String, String) {
    let start = |end: &VethEnd, server: Option<&VethEnd>| {
        let mut args: Vec<String> = vec!["exec".to_owned()];
        args.extend(exec_opts.iter().map(|a| (*a).to_owned()));
        args.extend(["-d", &end.ifname, "--", prog, "-d"].map(str::to_owned));
        args.push(format!("roce_{}", end.ifname));
        args.extend([
            "-g".to_owned(),
            ipv4_gid_index(end),
            "-p".to_owned(),
            port.to_string(),
        ]);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.extend(server.map(|s| s.ipv4.to_string()));
        roce_tests::child::spawn(&end.netns, &args)
    };
    let server = start(&pair.a, None);
    // The client gives up at once if nobody listens yet (a loaded machine can take seconds
    // to start the server): wait for the server's socket, never a probe connection.
    roce_tests::rxe::wait_host_listen(&pair.a.netns, port, std::time::Duration::from_secs(30));
    let client = start(&pair.b, Some(&pair.a));
    let limit = std::time::Duration::from_secs(60);
    let c = roce_tests::child::finish_within(client, limit, &format!("{prog} client"));
    let s = roce_tests::child::finish_within(
        server,
        limit,
        &format!(
            "{prog} server (its client exited with {}, printing:\n{})",
            c.status,
            text(&c)
        ),
    );
    let (c, s) = (
        (c.status.success(), text(&c)),
        (s.status.success(), text(&s)),
    );
    assert!(c.0 && s.0, "client:\n{}\nserver:\n{}", c.1, s.1);
    (c.1, s.1)
}

/// Debian's unmodified `ibv_rc_pingpong` at both ends, each on roce-xdp through the library:
/// 1 byte, a page and 64 KiB messages (many packets each) complete every iteration, polling
/// and with `-e` (completion channels), with the engine on the program's threads (the
/// default) and on threads of its own, and when the programs exit, the interfaces are as they
/// were (no XDP program, no pins).
#[test]
fn ibv_rc_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vb3", 172);
    let runs = [
        ("1", false, "inline"),
        ("4096", false, "inline"),
        ("65536", false, "inline"),
        // -e: completion channels, ibv_req_notify_cq and ibv_get_cq_event on the eventfd.
        ("4096", true, "inline"),
        ("65536", true, "inline"),
        // The engine on threads of its own instead of the program's (ROCE_ENGINE=threads).
        ("4096", false, "threads"),
        ("65536", true, "threads"),
    ];
    for (i, (size, events, engine)) in runs.into_iter().enumerate() {
        let mut args = vec!["-s", size, "-n", "200"];
        if events {
            args.push("-e");
        }
        let (c, s) = pingpong_on("ibv_rc_pingpong", engine, &pair, 18600 + i as u16, &args);
        for out in [&c, &s] {
            assert_iters(out, size, 200);
        }
    }
    assert_interfaces_clean(&pair);
}

/// Checks that `out` (a pingpong's output) reports `iters` round trips of `size` bytes.
fn assert_iters(out: &str, size: &str, iters: u64) {
    let bytes = 2 * iters * size.parse::<u64>().unwrap();
    assert!(out.contains(&format!("{bytes} bytes in")), "{out}");
    assert!(out.contains(&format!("{iters} iters in")), "{out}");
}

/// Checks that neither end of `pair` keeps roce_xdp or its pins after the programs exit.
fn assert_interfaces_clean(pair: &roce::netns::VethPair) {
    assert_clean(&[&pair.a, &pair.b]);
}

/// The path MTU of a veth of MTU 1500 (the port's active_mtu, asserted by the ibv_devinfo
/// test): the largest UD message, and the largest `-s` ibv_ud_pingpong accepts (it refuses
/// sizes above the port's active MTU; its buffers are 40 bytes longer, for the GRH).
const UD_MAX: &str = "1024";

/// Debian's unmodified `ibv_ud_pingpong` at both ends on the library: address handles from
/// the exchanged GIDs, UD sends through them, receives whose buffers start with the 40-byte
/// GRH area; 1 byte, 512 bytes and the path MTU, polling and with `-e`; and 4 KiB on a jumbo
/// link.
#[test]
fn ibv_ud_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vb4", 173);
    let mut runs = Vec::new();
    for events in [false, true] {
        for size in ["1", "512", UD_MAX] {
            runs.push((size, events));
        }
    }
    for (i, (size, events)) in runs.into_iter().enumerate() {
        let mut args = vec!["-s", size, "-n", "200"];
        if events {
            args.push("-e");
        }
        let (c, s) = pingpong("ibv_ud_pingpong", &pair, 18700 + i as u16, &args);
        assert_iters(&c, size, 200);
        assert_iters(&s, size, 200);
    }
    assert_interfaces_clean(&pair);
    // On a jumbo link a UD QP takes the port's active MTU (4096), as rxe's do: datagrams of
    // 4 KiB go through. veth refuses native XDP at MTU 9000, so the library also falls back
    // to generic XDP there, and says so.
    let jumbo = roce::netns::VethPair::new(
        &roce_tests::tag("vbj"),
        &roce::netns::VethOptions {
            mtu: 9000,
            subnet: 200,
            ..roce::netns::VethOptions::default()
        },
    )
    .expect("jumbo veth pair");
    let (c, s) = pingpong(
        "ibv_ud_pingpong",
        &jumbo,
        18710,
        &["-s", "4096", "-n", "200"],
    );
    assert_iters(&c, "4096", 200);
    assert_iters(&s, "4096", 200);
    assert!(s.contains("using generic XDP"), "{s}");
    assert_interfaces_clean(&jumbo);
}

/// `ibv_rc_pingpong -N`: the new post-send API (ibv_create_qp_ex with send ops,
/// ibv_qp_to_qp_ex, ibv_wr_start/ibv_wr_send/ibv_wr_set_sge/ibv_wr_complete) at both ends.
#[test]
fn ibv_rc_pingpong_new_send_api_runs_on_the_library() {
    require_root();
    let pair = veth_pair("vb5", 174);
    for (i, size) in ["1", "4096", "65536"].into_iter().enumerate() {
        let (c, s) = rc_pingpong(&pair, 18720 + i as u16, &["-N", "-s", size, "-n", "200"]);
        assert_iters(&c, size, 200);
        assert_iters(&s, size, 200);
    }
    assert_interfaces_clean(&pair);
}

/// A C program of tests/c/, built with gcc against Debian's libibverbs-dev into a
/// temporary folder removed on drop; it runs on the drop-in library through `roce exec` or
/// `LD_LIBRARY_PATH`, as any program linked with libibverbs.
struct CProgram(PathBuf);

impl CProgram {
    fn build(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("roce-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let bin = dir.join(name);
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("c/{name}.c"));
        let o = Command::new("gcc")
            .args(["-Wall", "-Werror", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .expect("gcc (the C toolchain and libibverbs-dev: cargo xtask setup)");
        assert!(o.status.success(), "gcc {name}.c: {}", text(&o));
        Self(bin)
    }

    /// The program's path as a string, for argument lists.
    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for CProgram {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The IPv4-mapped GID of `ip`, as ud_check takes it.
fn gid4(ip: std::net::Ipv4Addr) -> String {
    ip.to_ipv6_mapped().to_string()
}

/// The `roce` arguments that run C program `check` with `args` in `end`'s namespace on the
/// library (`roce --netns NS exec -d IFACE -- PROGRAM ARGS`).
fn exec_args(check: &CProgram, end: &VethEnd, args: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--netns", &end.netns, "exec", "-d", &end.ifname, "--"]
        .map(str::to_owned)
        .to_vec();
    a.push(check.path());
    a.extend(args.iter().map(|s| (*s).to_owned()));
    a
}

/// Address handles and UD bad use get what rxe gives (`ud_check misuse`): ibv_create_ah
/// fails with EINVAL without a GRH (RoCE), EOPNOTSUPP for multicast (no groups here),
/// ETIMEDOUT for a GID whose address nobody answers ARP for, on the subnet or off it (no
/// route: taken as on-link), as the kernel's address resolution answers them; a UD SEND longer than the port MTU
/// is accepted and completes successfully without a packet (C10-93.1.1, rxe_req.c); a UD RDMA
/// WRITE or a NULL AH is EINVAL at post time; a QP from ibv_create_qp has no ibv_qp_ex. Then
/// `echo`/`ask`: an answer addressed through ibv_create_ah_from_wc reaches the asker, and
/// ibv_init_ah_from_wc reads each sender's GID from the GRH area.
#[test]
fn ud_address_handles_and_bad_use_get_rxes_answers() {
    require_root();
    let pair = veth_pair("vb6", 175);
    let check = CProgram::build("ud_check");
    let (a, b) = (&pair.a, &pair.b);
    let dev_a = format!("roce_{}", a.ifname);
    let gidx_a = ipv4_gid_index(a);
    let mut stranger = b.ipv4.octets();
    stranger[3] = 99;
    let args = exec_args(
        &check,
        a,
        &[
            "misuse",
            &dev_a,
            &gidx_a,
            &gid4(b.ipv4),
            &gid4(stranger.into()),
            &gid4([203, 0, 113, 7].into()),
        ],
    );
    let o = roce(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let kv = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in:\n{out}"))
            .to_owned()
    };
    assert_eq!(kv("no_grh"), (Errno::EINVAL as i32).to_string());
    assert_eq!(kv("multicast"), (Errno::EOPNOTSUPP as i32).to_string());
    assert_eq!(kv("unreachable"), (Errno::ETIMEDOUT as i32).to_string());
    // With the interface given (rxe binds the lookup to its netdev, as `ip route get ... oif`
    // does), the kernel takes an address without a route as on-link (route.c
    // ip_route_output_key_hash_rcu), so it too ends in a neighbour timeout.
    assert_eq!(kv("no_route"), (Errno::ETIMEDOUT as i32).to_string());
    assert_eq!(kv("mtu"), UD_MAX);
    assert_eq!(kv("oversized_post"), "0");
    assert_eq!(kv("oversized_status"), "success");
    assert_eq!(kv("write_post"), (Errno::EINVAL as i32).to_string());
    assert_eq!(kv("null_ah_post"), (Errno::EINVAL as i32).to_string());
    assert_eq!(kv("qp_ex"), "null");
    assert_eq!(kv("destroy_ah"), "0");

    // echo on a, ask from b: the QPN goes through a file both can read.
    let qpn_file = check.0.with_file_name("echo.qpn");
    let qpn_path = qpn_file.display().to_string();
    let echo = roce_tests::child::spawn(
        "",
        &exec_args(&check, a, &["echo", &dev_a, &gidx_a, &qpn_path]),
    );
    let dev_b = format!("roce_{}", b.ifname);
    let gidx_b = ipv4_gid_index(b);
    let ask = roce_tests::child::spawn(
        "",
        &exec_args(
            &check,
            b,
            &["ask", &dev_b, &gidx_b, &gid4(a.ipv4), &qpn_path],
        ),
    );
    let limit = std::time::Duration::from_secs(60);
    let asked = roce_tests::child::finish_within(ask, limit, "ud_check ask");
    let echoed = roce_tests::child::finish_within(echo, limit, "ud_check echo");
    let (asked, echoed) = (text(&asked), text(&echoed));
    assert!(
        asked.contains(&format!(
            "reply=pong src_qp_ok=1 from={} sgid_index={gidx_b} grh=1 byte_len=44",
            gid4(a.ipv4)
        )),
        "ask:\n{asked}\necho:\n{echoed}"
    );
    assert!(
        echoed.contains(&format!(
            "from={} sgid_index={gidx_a} hop_limit=64 byte_len=44 grh=1",
            gid4(b.ipv4)
        )),
        "echo:\n{echoed}\nask:\n{asked}"
    );
    assert_interfaces_clean(&pair);
}

/// `ip netns exec NS PROGRAM` with the library on LD_LIBRARY_PATH and ROCE_DEVICES naming
/// `end`'s interface, as a child killed on drop.
fn ip_netns_exec_spawn(end: &VethEnd, prog: &[&str]) -> roce_tests::child::Reaper {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &end.netns, "env"]);
    c.arg(format!(
        "LD_LIBRARY_PATH={}",
        roce_tests::drop_in_lib_dir().display()
    ));
    c.arg(format!("ROCE_DEVICES={}", end.ifname));
    c.args(prog);
    roce_tests::child::spawn_command(c)
}

/// Whether an XDP program is attached to `end`'s interface (`ip link` says `xdp`).
fn xdp_attached(end: &VethEnd) -> bool {
    let o = Command::new("ip")
        .args(["-n", &end.netns, "link", "show", &end.ifname])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&o.stdout).contains("xdp")
}

/// Polls `cond` every 50 ms for at most `secs` seconds.
fn wait_until(what: &str, secs: u64, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An `ibv_rc_pingpong` server of `iters` exchanges on `end`, started with `ip netns exec`.
fn ip_netns_server(end: &VethEnd, port: u16, iters: u32) -> roce_tests::child::Reaper {
    let (dev, gid) = (format!("roce_{}", end.ifname), ipv4_gid_index(end));
    let (port, iters) = (port.to_string(), iters.to_string());
    ip_netns_exec_spawn(
        end,
        &[
            "ibv_rc_pingpong",
            "-d",
            &dev,
            "-g",
            &gid,
            "-p",
            &port,
            "-n",
            &iters,
        ],
    )
}

/// Runs an `ibv_rc_pingpong` client on `end` against `server`'s (started with
/// [`ip_netns_server`]) and checks that both completed `iters` exchanges.
fn ip_netns_client_against(
    end: &VethEnd,
    server_end: &VethEnd,
    server: roce_tests::child::Reaper,
    port: u16,
    iters: u32,
) {
    let (dev, gid) = (format!("roce_{}", end.ifname), ipv4_gid_index(end));
    let (ip, port, n) = (
        server_end.ipv4.to_string(),
        port.to_string(),
        iters.to_string(),
    );
    let client = ip_netns_exec_spawn(
        end,
        &[
            "ibv_rc_pingpong",
            "-d",
            &dev,
            "-g",
            &gid,
            "-p",
            &port,
            "-n",
            &n,
            &ip,
        ],
    );
    let limit = std::time::Duration::from_secs(60);
    let c = roce_tests::child::finish_within(client, limit, "client");
    let s = roce_tests::child::finish_within(server, limit, "server");
    for o in [&c, &s] {
        assert!(o.status.success(), "{}", text(o));
        assert!(
            text(o).contains(&format!("{iters} iters in")),
            "{}",
            text(o)
        );
    }
}

/// Checks that neither end has roce_xdp attached or pins left.
fn assert_clean(ends: &[&VethEnd]) {
    for end in ends {
        assert!(!xdp_attached(end), "roce_xdp left on {}", end.ifname);
        assert!(
            !std::path::Path::new(&format!("/sys/fs/bpf/roce/{}", end.ifname)).exists(),
            "pins left behind on {}",
            end.ifname
        );
    }
}

/// Programs started the way people start RDMA programs in namespaces, `ip netns exec NS`
/// (a mount namespace of their own where /sys/fs/bpf is hidden), with nothing loaded
/// beforehand: both ends attach roce_xdp through the host's bpffs, ping-pong, and leave the
/// interfaces as they were. `roce` itself loads under `ip netns exec` too, pinning in the
/// host's /sys/fs/bpf and recording the namespace's name.
#[test]
fn programs_started_with_ip_netns_exec_attach_and_release() {
    require_root();
    let pair = veth_pair("vb4", 173);
    let (a, b) = (&pair.a, &pair.b);
    let server = ip_netns_server(a, 18650, 100);
    roce_tests::rxe::wait_host_listen(&a.netns, 18650, std::time::Duration::from_secs(30));
    ip_netns_client_against(b, a, server, 18650, 100);
    assert_clean(&[a, b]);

    // `roce load` under `ip netns exec`: the pins are the host's.
    let roce_in = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &a.netns])
            .arg(roce_bin())
            .args(args)
            .output()
            .expect("ip netns exec roce")
    };
    let o = roce_in(&["load", "-i", &a.ifname, "-m", "skb"]);
    assert!(o.status.success(), "{}", text(&o));
    let linked = std::path::Path::new(&format!("/sys/fs/bpf/roce/{}/link", a.ifname)).exists();
    let status: serde_json::Value =
        serde_json::from_str(&roce_ok(&["-j", "status"])).expect("status JSON");
    let o = roce_in(&["unload", "-i", &a.ifname]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(linked, "the link is not pinned in the host's bpffs");
    let row = status
        .as_array()
        .and_then(|r| r.iter().find(|s| s["ifname"] == a.ifname.as_str()))
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(row["netns"], a.netns.as_str(), "{status}");
    assert_eq!(row["held"], "pin", "{status}");
    assert!(!xdp_attached(a));
}

/// A program killed with SIGKILL while it holds a device leaves no XDP program behind (the
/// library holds roce_xdp's link instead of pinning it, so the kernel detaches it with the
/// process); `roce status` shows its leftover map pins as stale, and the next program on the
/// interface loads afresh over them and runs.
#[test]
fn a_killed_program_leaves_no_xdp_program_behind() {
    require_root();
    let pair = veth_pair("vb5", 174);
    let (a, b) = (&pair.a, &pair.b);
    let ga = ipv4_gid_index(a);
    let da = format!("roce_{}", a.ifname);
    let mut server =
        ip_netns_exec_spawn(a, &["ibv_rc_pingpong", "-d", &da, "-g", &ga, "-p", "18651"]);
    wait_until("the server to attach roce_xdp", 20, || xdp_attached(a));
    server.kill().expect("SIGKILL the server");
    wait_until("the kernel to detach roce_xdp", 10, || !xdp_attached(a));
    let status: serde_json::Value =
        serde_json::from_str(&roce_ok(&["-j", "status"])).expect("status JSON");
    let row = status
        .as_array()
        .and_then(|r| r.iter().find(|s| s["ifname"] == a.ifname.as_str()))
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(row["held"], "stale", "{status}");
    let (c, s) = rc_pingpong(&pair, 18652, &["-n", "50"]);
    for out in [&c, &s] {
        assert!(out.contains("50 iters in"), "{out}");
    }
    assert_clean(&[a, b]);
}

/// A second program on an interface whose queue a first program serves gets a clear error
/// that says why and what to do (EBUSY from the bind, named with the first program's PID),
/// and the first program is not disturbed: it still serves its client afterwards.
#[test]
fn a_second_program_on_a_taken_queue_is_told_why_and_the_first_goes_on() {
    require_root();
    let pair = veth_pair("vb6", 175);
    let (a, b) = (&pair.a, &pair.b);
    let server = ip_netns_server(a, 18653, 50);
    let first = server.pid();
    // The server has bound its socket once it holds a QPN (it creates its QP before it
    // listens).
    wait_until("the server to create its QP", 20, || {
        serde_json::from_str::<serde_json::Value>(&roce_ok(&["-j", "status"]))
            .ok()
            .and_then(|v| {
                v.as_array()?
                    .iter()
                    .find(|s| s["ifname"] == a.ifname.as_str())
                    .and_then(|s| s["qps"].as_u64())
            })
            .is_some_and(|n| n >= 1)
    });
    let (da, ga) = (format!("roce_{}", a.ifname), ipv4_gid_index(a));
    let second = ip_netns_exec(
        a,
        Some(&a.ifname),
        &["ibv_rc_pingpong", "-d", &da, "-g", &ga, "-p", "18654"],
    );
    let out = text(&second);
    assert!(!second.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "queue 0 of {} is already served by another program's AF_XDP socket (roce-xdp process {first})",
            a.ifname
        )) && out.contains("one program per interface queue"),
        "{out}"
    );
    roce_tests::rxe::wait_host_listen(&a.netns, 18653, std::time::Duration::from_secs(30));
    ip_netns_client_against(b, a, server, 18653, 50);
    assert_clean(&[a, b]);
}

/// Runs a case-reporting C program of tests/c/ (built with [`CProgram`]) as server on
/// `pair.a` and client on `pair.b` through `ip netns exec`, and checks that every case named in
/// `client_cases` and `server_cases` printed `CASE <name> ok`, that none failed, and that both
/// interfaces are clean after.
fn run_cases(
    pair: &roce::netns::VethPair,
    name: &str,
    port: u16,
    client_cases: &[&str],
    server_cases: &[&str],
) {
    let (a, b) = (&pair.a, &pair.b);
    let prog = CProgram::build(name);
    let exe = prog.path();
    let (ga, gb) = (ipv4_gid_index(a), ipv4_gid_index(b));
    let (da, db) = (format!("roce_{}", a.ifname), format!("roce_{}", b.ifname));
    let (port, ip) = (port.to_string(), a.ipv4.to_string());
    let server = ip_netns_exec_spawn(a, &[&exe, &da, &ga, &port]);
    roce_tests::rxe::wait_host_listen(
        &a.netns,
        port.parse().unwrap(),
        std::time::Duration::from_secs(30),
    );
    let client = ip_netns_exec_spawn(b, &[&exe, &db, &gb, &port, &ip]);
    let limit = std::time::Duration::from_secs(60);
    let c = roce_tests::child::finish_within(client, limit, "client");
    let s = roce_tests::child::finish_within(server, limit, "server");
    let (c, s) = (text(&c), text(&s));
    for (cases, out) in [(client_cases, &c), (server_cases, &s)] {
        for case in cases {
            assert!(
                out.contains(&format!("CASE {case} ok")),
                "{case}:\n{c}\n{s}"
            );
        }
    }
    assert!(!c.contains("FAIL") && !s.contains("FAIL"), "{c}\n{s}");
    assert_clean(&[a, b]);
}

/// Bad use of the verbs from a C program (tests/c/verbs_misuse.c, built here with gcc against
/// Debian's libibverbs-dev and run on the drop-in library), each case answered as rdma-core
/// and rxe answer it: EINVAL for a bad access right, a CQ or QP beyond the device's limits,
/// a RESET→RTS jump and a send in RESET; ENOMEM for receives beyond the queue's depth; EBUSY
/// for a PD or CQ in use; local protection errors for an unknown lkey (then a flush) and a
/// gather entry past its region; remote access errors for a WRITE without the remote-write
/// right and one past the remote region, whose bytes and the guard page after them stay
/// untouched.
#[test]
fn bad_use_gets_rdma_cores_errno_or_error_completion() {
    require_root();
    let pair = veth_pair("vb7", 176);
    run_cases(
        &pair,
        "verbs_misuse",
        18655,
        &[
            "reg_mr_remote_write_without_local_write_is_einval",
            "create_cq_beyond_max_cqe_is_einval",
            "create_qp_beyond_max_qp_wr_is_einval",
            "modify_qp_reset_to_rts_is_einval",
            "post_send_in_reset_is_einval",
            "post_recv_beyond_max_recv_wr_is_enomem",
            "dealloc_pd_in_use_is_ebusy",
            "destroy_cq_in_use_is_ebusy",
            "query_qp_returns_what_modify_qp_set",
            "unknown_lkey_completes_with_loc_prot_err_then_flush",
            "sge_past_its_region_completes_with_loc_prot_err",
            "write_without_remote_write_right_is_rem_access_err",
            "write_past_the_remote_region_is_rem_access_err",
        ],
        &["no_byte_written_by_refused_requests"],
    );
}

/// Debian's unmodified `ibv_srq_pingpong` at both ends on the library: its 16 QPs (and 4 with
/// `-q 4`) receive through one SRQ, each message taking one SRQ WQE whichever QP it came on,
/// at 1 byte, a page and 64 KiB, polling and with `-e` (completion channels).
#[test]
fn ibv_srq_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vsq", 196);
    let runs: [&[&str]; 6] = [
        &["-s", "1"],
        &["-s", "4096"],
        &["-s", "65536"],
        &["-s", "4096", "-e"],
        &["-s", "65536", "-e"],
        &["-s", "4096", "-q", "4"],
    ];
    for (i, extra) in runs.into_iter().enumerate() {
        let size: u64 = extra[1].parse().unwrap();
        let mut args = vec!["-n", "200"];
        args.extend_from_slice(extra);
        let (c, s) = pingpong("ibv_srq_pingpong", &pair, 18700 + i as u16, &args);
        for out in [&c, &s] {
            assert!(
                out.contains(&format!("{} bytes in", 2 * 200 * size)),
                "{extra:?}: {out}"
            );
            assert!(out.contains("200 iters in"), "{extra:?}: {out}");
        }
        let qps = if extra.contains(&"-q") { 4 } else { 16 };
        assert_eq!(s.matches("remote address:").count(), qps, "{extra:?}: {s}");
    }
}

/// The extended CQ (tests/c/cq_ex.c): `ibv_create_cq_ex` with the standard `wc_flags`, and
/// what rxe refuses (a completion timestamp or `IGNORE_OVERRUN`: EOPNOTSUPP; an unknown
/// `comp_mask` bit: EINVAL); `ibv_start_poll` on an empty CQ is ENOENT; receives and sends
/// read field by field through `ibv_start_poll`/`ibv_next_poll` and `ibv_wc_read_*` (opcode,
/// byte_len, wc_flags, immediate data, QP number), and the same CQ polled with `ibv_poll_cq`.
#[test]
fn extended_cqs_poll_field_by_field_as_rxe() {
    require_root();
    let pair = veth_pair("vcx", 199);
    run_cases(
        &pair,
        "cq_ex",
        18657,
        &[
            "create_cq_ex_with_the_standard_flags",
            "two_sends_posted",
            "first_send_completion",
            "second_send_completion",
            "third_send_completion",
        ],
        &[
            "completion_timestamp_flag_is_eopnotsupp",
            "unknown_comp_mask_is_einval",
            "ignore_overrun_is_eopnotsupp",
            "single_threaded_is_accepted",
            "start_poll_on_an_empty_cq_is_enoent",
            "destroy_cq_ex",
            "create_cq_ex_with_the_standard_flags",
            "first_receive_polled",
            "first_receive_status_and_wr_id",
            "first_receive_opcode",
            "first_receive_byte_len",
            "first_receive_has_imm",
            "first_receive_imm_data",
            "first_receive_qp_num",
            "first_receive_bytes",
            "second_receive_polled",
            "second_receive_byte_len_and_no_imm",
            "ibv_poll_cq_on_the_same_cq",
        ],
    );
}

/// Loopback through the library (tests/c/loopback.c): one program connects two RC QPs of its
/// device to each other through the device's own GID, as RDMA libraries' test suites do, and
/// a SEND and an 8 KiB RDMA WRITE from one to the other complete with their bytes in place.
/// The frames loop back inside the engine, as on rxe.
#[test]
fn two_qps_of_one_device_connect_to_each_other_through_the_library() {
    require_root();
    let prog = CProgram::build("loopback");
    let pair = veth_pair("vlb", 201);
    let a = &pair.a;
    let dev = format!("roce_{}", a.ifname);
    let args = exec_args(&prog, a, &[&dev, &ipv4_gid_index(a)]);
    let o = roce(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for case in [
        "connect_both_qps_to_the_own_gid",
        "send_completes",
        "receive_completes_with_the_bytes",
        "write_completes",
        "write_lands_in_the_other_qps_region",
    ] {
        assert!(out.contains(&format!("CASE {case} ok")), "{case}:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
    assert_interfaces_clean(&pair);
}

/// `pthread_cancel` of a thread blocked in `ibv_get_cq_event` (tests/c/cq_cancel.c), as
/// `rping` cancels its CQ thread when a connection fails: the thread ends and the program
/// goes on to destroy the CQ and its channel (the wait used to abort the whole program:
/// "panic in a function that cannot unwind").
#[test]
fn cancelling_a_thread_waiting_for_a_cq_event_ends_only_that_thread() {
    require_root();
    let prog = CProgram::build("cq_cancel");
    let pair = veth_pair("vcc", 152);
    let a = &pair.a;
    let dev = format!("roce_{}", a.ifname);
    let args = exec_args(&prog, a, &[&dev]);
    let o = roce(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = text(&o);
    assert!(o.status.success(), "{}: {out}", o.status);
    for case in [
        "make_a_cq_on_a_channel",
        "the_waiter_still_waits",
        "cancel_ends_the_waiting_thread",
        "destroy_the_cq_and_channel_after",
    ] {
        assert!(out.contains(&format!("CASE {case} ok")), "{case}:\n{out}");
    }
    assert!(out.contains("cq_cancel done"), "{out}");
    assert_interfaces_clean(&pair);
}

/// Asynchronous events through the ABI: tests/c/async_events.c, compiled with gcc against
/// libibverbs-dev's headers (linked by SONAME, so it loads the drop-in library under `roce
/// exec`). The server arms an SRQ limit, receives, and gets exactly one
/// IBV_EVENT_SRQ_LIMIT_REACHED for its SRQ from ibv_get_async_event after poll(2) on
/// `async_fd` says it is readable; the client, once the server's QP is gone, gets a
/// retry-exceeded completion and IBV_EVENT_QP_FATAL for its QP.
#[test]
fn async_events_srq_limit_and_qp_fatal_through_the_abi() {
    require_root();
    let prog = CProgram::build("async_events");
    let pair = veth_pair("vae", 197);
    let start = |end: &VethEnd, server: Option<&VethEnd>| {
        let mut args: Vec<String> = vec![
            "exec".into(),
            "-d".into(),
            end.ifname.clone(),
            "--".into(),
            prog.path(),
            ipv4_gid_index(end),
            "18800".into(),
        ];
        args.extend(server.map(|s| s.ipv4.to_string()));
        roce_tests::child::spawn(&end.netns, &args)
    };
    let server = start(&pair.a, None);
    roce_tests::rxe::wait_host_listen(&pair.a.netns, 18800, std::time::Duration::from_secs(30));
    let client = start(&pair.b, Some(&pair.a));
    let limit = std::time::Duration::from_secs(60);
    let c = roce_tests::child::finish_within(client, limit, "async_events client");
    let s = roce_tests::child::finish_within(server, limit, "async_events server");
    let (c_ok, c) = (c.status.success(), text(&c));
    let (s_ok, s) = (s.status.success(), text(&s));
    assert!(c_ok && s_ok, "client:\n{c}\nserver:\n{s}");
    assert!(s.contains("OK SRQ limit reached"), "{s}");
    assert!(s.contains("OK one limit event, limit disarmed"), "{s}");
    assert!(c.contains("OK transport retry counter exceeded"), "{c}");
    assert!(c.contains("OK local work queue catastrophic error"), "{c}");
}

/// Debian's unmodified `ibv_uc_pingpong` at both ends, each on roce-xdp through the library:
/// UC QPs (IBV_QPT_UC, UC's modify masks, SENDs completed without ACKs) carry 1 byte, a page
/// and 64 KiB messages (64 packets each at the default 1024 MTU) for every iteration, polling
/// and with `-e`. A lost packet would lose its message and hang the ping-pong: the veth loses
/// none, so every iteration must complete.
#[test]
fn ibv_uc_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vuc", 198);
    let runs = [
        ("1", false),
        ("4096", false),
        ("65536", false),
        ("1", true),
        ("4096", true),
        ("65536", true),
    ];
    for (i, (size, events)) in runs.into_iter().enumerate() {
        let mut args = vec!["-s", size, "-n", "200"];
        if events {
            args.push("-e");
        }
        let (c, s) = pingpong("ibv_uc_pingpong", &pair, 18700 + i as u16, &args);
        for out in [&c, &s] {
            assert_iters(out, size, 200);
        }
    }
    uc_verbs_calls_behave_as_rdma_core(&pair);
    assert_interfaces_clean(&pair);
}

/// tests/c/uc_verbs.c, compiled against the installed rdma-core headers and run on the library
/// in `pair.a`'s namespace: a UC QP walked to RTS with UC's masks, RC-only attributes refused
/// with EINVAL, `ibv_query_qp` reporting what was set, and RDMA READ and atomics refused by
/// `ibv_post_send` with EINVAL and `*bad_wr` set.
fn uc_verbs_calls_behave_as_rdma_core(pair: &roce::netns::VethPair) {
    let prog = CProgram::build("uc_verbs");
    let end = &pair.a;
    let gid = ipv4_gid_index(end);
    let o = roce(&[
        "--netns",
        &end.netns,
        "exec",
        "-d",
        &end.ifname,
        "--",
        &prog.path(),
        &format!("roce_{}", end.ifname),
        &gid,
        &pair.b.ipv4.to_string(),
    ]);
    assert!(
        o.status.success() && text(&o).contains("uc_verbs: ok"),
        "{}",
        text(&o)
    );
}

/// Memory windows through the drop-in library (tests/c/verbs_mw.c, built with gcc): a type 1
/// window bound with `ibv_bind_mw` and type 2 windows bound with `IBV_WR_BIND_MW`; the peer's
/// WRITE and READ inside a window succeed with the data verified, a WRITE across its end, one
/// through a type 2 window from another QP, one after `IBV_WR_LOCAL_INV` and one after a SEND
/// with invalidate complete with `IBV_WC_REM_ACCESS_ERR` and change no byte; binds to a
/// region without MW_BIND or past its end complete with `IBV_WC_MW_BIND_ERR`, a zero-based
/// type 1 bind and the deregistration of a region with bound windows return EINVAL (rxe).
#[test]
fn memory_windows_bind_invalidate_and_refuse_as_rxe() {
    require_root();
    let pair = veth_pair("vmw", 189);
    run_cases(
        &pair,
        "verbs_mw",
        18656,
        &[
            "type_1_window_write_and_read_inside",
            "type_1_window_write_across_its_end_is_rem_access_err",
            "type_2_window_write_and_read_inside",
            "send_with_inv_of_type_2_window_succeeds",
            "write_after_send_with_inv_is_rem_access_err",
            "type_2_window_through_another_qp_is_rem_access_err",
            "type_2_window_through_its_qp_succeeds",
            "write_after_local_inv_is_rem_access_err",
        ],
        &[
            "query_device_claims_memory_windows",
            "alloc_mw_type_1_and_2",
            "bind_mw_type_1_completes_as_bind_mw",
            "wr_bind_mw_type_2_completes_as_bind_mw",
            "send_with_inv_completes_with_the_invalidated_rkey",
            "local_inv_of_type_2_window_completes_as_local_inv",
            "writes_land_inside_windows_and_nowhere_else",
            "zero_based_type_1_bind_is_einval",
            "dereg_mr_with_bound_windows_is_einval",
            "bind_to_region_without_mw_bind_is_mw_bind_err",
            "bind_past_the_region_is_mw_bind_err",
            "dealloc_of_bound_windows_then_dereg_succeed",
        ],
    );
}

/// Congestion-control parameters reach a program's engine through `roce exec --cc-set` or
/// ROCE_CC_SET, and a wrong one stops with a reason: `roce exec` refuses it before the program
/// starts; the library refuses it when the engine starts (the program's first QP fails, with
/// the library's message on stderr), and leaves nothing attached.
#[test]
fn cc_parameters_reach_the_library_and_a_wrong_one_is_refused_with_its_reason() {
    require_root();
    let pair = veth_pair("vcc", 179);
    let a = &pair.a;
    // roce exec passes what it checked on to the program.
    let o = roce_tests::roce(&[
        "--netns",
        &a.netns,
        "exec",
        "-d",
        &a.ifname,
        "--cc-set",
        "loss_backoff=1",
        "--cc-set",
        "rpg_ai_rate=7",
        "--",
        "env",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ROCE_CC_SET=loss_backoff=1,rpg_ai_rate=7"),
        "{}",
        text(&o)
    );
    for bad in ["no_such_parameter=1", "loss_backoff=2", "rpg_ai_rate"] {
        let o = roce_tests::roce(&[
            "--netns", &a.netns, "exec", "-d", &a.ifname, "--cc-set", bad, "--", "true",
        ]);
        assert!(!o.status.success(), "roce exec took --cc-set {bad}");
        assert!(text(&o).contains(bad), "{bad}: {}", text(&o));
    }
    // The library, given a wrong one directly: the engine does not start.
    let o = ip_netns_exec(
        a,
        Some(&a.ifname),
        &[
            "env",
            "ROCE_CC_SET=rpg_ai_rate=7,no_such_parameter=1",
            "ibv_rc_pingpong",
            "-d",
            &format!("roce_{}", a.ifname),
            "-g",
            &ipv4_gid_index(a),
        ],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ROCE_CC_SET: \"no_such_parameter=1\""),
        "{}",
        text(&o)
    );
    assert_interfaces_clean(&pair);
}

/// The cc counters of `end`'s interface (`roce stats -j`: every QP's, the exited programs'
/// folded in).
fn cc_counters(end: &VethEnd) -> serde_json::Value {
    let o = roce_tests::roce(&["--netns", &end.netns, "stats", "-j", "-i", &end.ifname]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roce stats -j");
    v["cc"].clone()
}

/// `roce exec --cc swift` (ROCE_CC) puts every QP of an unmodified program on Swift, with
/// `--cc-profile software` (ROCE_CC_PROFILE) accepted beside it (what each profile sets is
/// the library's unit test `cc_parameters_come_from_the_environment_or_say_what_is_wrong`):
/// Swift's RTT samples count at both ends of an ibv_rc_pingpong run, where the same run on
/// the default (DCQCN) takes none.
#[test]
fn the_cc_algorithm_and_profile_reach_the_library() {
    require_root();
    let pair = veth_pair("vca", 178);
    // Loaded beforehand, so the counters outlive the programs (the library unloads what it
    // loaded itself).
    let _l = roce_tests::Loaded::on(&[&pair.a, &pair.b]);
    let samples = |end: &VethEnd| cc_counters(end)["swift_rtt_samples"].as_u64().unwrap_or(0);
    let args = ["-s", "4096", "-n", "200"];
    pingpong("ibv_rc_pingpong", &pair, 18700, &args);
    let (a0, b0) = (samples(&pair.a), samples(&pair.b));
    assert_eq!((a0, b0), (0, 0), "DCQCN took RTT samples");
    let opts = ["--cc", "swift", "--cc-profile", "software"];
    pingpong_exec("ibv_rc_pingpong", &opts, &pair, 18701, &args);
    let (a1, b1) = (samples(&pair.a), samples(&pair.b));
    // Each of the 200 round trips acknowledges at least one request of each side.
    assert!(a1 >= 100 && b1 >= 100, "Swift RTT samples: {a1} and {b1}");
    // A wrong name is refused before the program starts.
    let o = roce_tests::roce(&[
        "--netns",
        &pair.a.netns,
        "exec",
        "-d",
        &pair.a.ifname,
        "--cc",
        "timely",
        "--",
        "true",
    ]);
    assert!(
        !o.status.success() && text(&o).contains("timely"),
        "{}",
        text(&o)
    );
}
