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

use roce::{netns::VethEnd, transport::DeviceConfig};
use roce_tests::{require_root, roce, roce_bin, roce_ok, veth_pair};

/// The folder holding the library as libibverbs.so.1, as `roce exec` makes it next to the
/// `roce` binary under test (`cargo build -p roce-verbs` writes libibverbs.so there).
fn lib_dir() -> PathBuf {
    let bin = roce_bin();
    let dir = bin.parent().expect("roce's folder");
    assert!(
        dir.join("libibverbs.so").exists(),
        "the drop-in libibverbs is not built next to {} (cargo build -p roce-verbs)",
        bin.display()
    );
    // `roce exec` makes roce-verbs/libibverbs.so.1 on first use; any run does.
    let o = roce(&["exec", "--", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir.join("roce-verbs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `prog args` in `end`'s namespace with `ip netns exec` and the library on
/// LD_LIBRARY_PATH, ROCE_DEVICES set to `devices` when given.
fn ip_netns_exec(end: &VethEnd, devices: Option<&str>, prog: &[&str]) -> Output {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &end.netns, "env"]);
    c.arg(format!("LD_LIBRARY_PATH={}", lib_dir().display()));
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
    let lib = lib_dir().join("libibverbs.so.1");
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
    for tool in ["/usr/bin/ibv_devices", "/usr/bin/ibv_devinfo"] {
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
    let ours = names(lib_dir().join("libibverbs.so.1").to_str().unwrap());
    let theirs = names("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert_eq!(ours, theirs);
}

/// The IPv4 GID index of `end`'s interface (`roce gids`), what `-g` takes.
fn ipv4_gid_index(end: &VethEnd) -> String {
    let gids: Vec<serde_json::Value> = serde_json::from_str(&roce_ok(&[
        "--netns",
        &end.netns,
        "-j",
        "gids",
        "-i",
        &end.ifname,
    ]))
    .expect("gids JSON");
    gids.iter()
        .find(|g| g["ip"].as_str() == Some(&end.ipv4.to_string()))
        .map(|g| g["index"].to_string())
        .expect("an IPv4 GID")
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
    let start = |end: &VethEnd, server: Option<&VethEnd>| {
        let mut args: Vec<String> = ["exec", "-d", &end.ifname, "--", prog, "-d"]
            .map(str::to_owned)
            .to_vec();
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
    std::thread::sleep(std::time::Duration::from_millis(500));
    let client = start(&pair.b, Some(&pair.a));
    let limit = std::time::Duration::from_secs(60);
    let c = roce_tests::child::finish_within(client, limit, &format!("{prog} client"));
    let s = roce_tests::child::finish_within(server, limit, &format!("{prog} server"));
    let (c, s) = (
        (c.status.success(), text(&c)),
        (s.status.success(), text(&s)),
    );
    assert!(c.0 && s.0, "client:\n{}\nserver:\n{}", c.1, s.1);
    (c.1, s.1)
}

/// Debian's unmodified `ibv_rc_pingpong` at both ends, each on roce-xdp through the library:
/// 1 byte, a page and 64 KiB messages (many packets each) complete every iteration, polling
/// and with `-e` (completion channels), and when the programs exit, the interfaces are as they
/// were (no XDP program, no pins).
#[test]
fn ibv_rc_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vb3", 172);
    let runs = [
        ("1", false),
        ("4096", false),
        ("65536", false),
        // -e: completion channels, ibv_req_notify_cq and ibv_get_cq_event on the eventfd.
        ("4096", true),
        ("65536", true),
    ];
    for (i, (size, events)) in runs.into_iter().enumerate() {
        let mut args = vec!["-s", size, "-n", "200"];
        if events {
            args.push("-e");
        }
        let (c, s) = rc_pingpong(&pair, 18600 + i as u16, &args);
        for out in [&c, &s] {
            assert!(
                out.contains(&format!(
                    "{} bytes in",
                    2 * 200 * size.parse::<u64>().unwrap()
                )),
                "{out}"
            );
            assert!(out.contains("200 iters in"), "{out}");
        }
    }
    for end in [&pair.a, &pair.b] {
        let link = Command::new("ip")
            .args(["-n", &end.netns, "link", "show", &end.ifname])
            .output()
            .expect("ip link");
        assert!(
            !String::from_utf8_lossy(&link.stdout).contains("xdp"),
            "roce_xdp left attached: {}",
            String::from_utf8_lossy(&link.stdout)
        );
        assert!(
            !std::path::Path::new(&format!("/sys/fs/bpf/roce/{}", end.ifname)).exists(),
            "pins left behind"
        );
    }
}

/// Debian's unmodified `ibv_uc_pingpong` at both ends, each on roce-xdp through the library:
/// UC QPs (IBV_QPT_UC, UC's modify masks, SENDs completed without ACKs) carry 1 byte, a page
/// and 64 KiB messages (64 packets each at the default 1024 MTU) for every iteration, polling
/// and with `-e`. A lost packet would lose its message and hang the ping-pong: the veth loses
/// none, so every iteration must complete.
#[test]
fn ibv_uc_pingpong_runs_on_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("vb4", 173);
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
            assert!(
                out.contains(&format!(
                    "{} bytes in",
                    2 * 200 * size.parse::<u64>().unwrap()
                )),
                "{out}"
            );
            assert!(out.contains("200 iters in"), "{out}");
        }
    }
    uc_verbs_calls_behave_as_rdma_core(&pair);
}

/// tests/c/uc_verbs.c, compiled against the installed rdma-core headers and run on the library
/// in `pair.a`'s namespace: a UC QP walked to RTS with UC's masks, RC-only attributes refused
/// with EINVAL, `ibv_query_qp` reporting what was set, and RDMA READ and atomics refused by
/// `ibv_post_send` with EINVAL and `*bad_wr` set.
fn uc_verbs_calls_behave_as_rdma_core(pair: &roce::netns::VethPair) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c/uc_verbs.c");
    let bin = std::env::temp_dir().join(roce_tests::tag("roce-uc_verbs-"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("run cc");
    if !cc.status.success() {
        let _ = std::fs::remove_file(&bin);
        panic!("cc uc_verbs.c: {}", text(&cc));
    }
    let end = &pair.a;
    let gid = ipv4_gid_index(end);
    let o = roce(&[
        "--netns",
        &end.netns,
        "exec",
        "-d",
        &end.ifname,
        "--",
        bin.to_str().expect("UTF-8 path"),
        &format!("roce_{}", end.ifname),
        &gid,
        &pair.b.ipv4.to_string(),
    ]);
    let _ = std::fs::remove_file(&bin);
    assert!(
        o.status.success() && text(&o).contains("uc_verbs: ok"),
        "{}",
        text(&o)
    );
}
