//! The drop-in librdmacm (roce-user/verbs/src/ffi/rdmacm.rs: the same file as the drop-in
//! libibverbs, linked as librdmacm.so.1 by `roce exec`) under Debian's unmodified
//! rdmacm-utils and perftest:
//! - every `rdma_*` and rsocket symbol the Debian binaries import is defined with the version
//!   node they require, the library defines every symbol of Debian's librdmacm1 44, and the
//!   binaries load on it with every symbol bound (`ldd -r`);
//! - `rping -V` (every ping verified), `ucmatose` (several connections, sends both ways),
//!   `rdma_server`/`rdma_client` (librdmacm's synchronous mode) and
//!   `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R` (perftest connecting through RDMA
//!   CM) at both ends of a veth pair, each
//!   end on roce-xdp (rping over IPv4 and IPv6), and the interfaces left clean;
//! - `udaddy` (the UDP port space: UD QPs resolved by SIDR, then UD SENDs both ways) at both
//!   ends of a veth pair;
//! - `roce pingpong -R` (rping's protocol over RDMA CM, on the Rust CM API) as the server of
//!   Debian's `rping -c` on the library, as the client of its `rping -s`, and at both ends
//!   (IPv4 and IPv6): rping's `-v` lines hold every ping with rping's data, our summary counts
//!   every ping checked; a client without a listener is REJECTED, a ping larger than the server
//!   takes ends both sides with a message;
//! - `roce perf write|read|send -R` (RDMA CM) against `ib_write_bw -R`, `ib_read_bw -R` and
//!   `ib_send_bw -R` on the library in both roles, and against itself with every byte
//!   verified (and over IPv6 for WRITE); and with a perftest peer SIGKILLed mid-run (no DREQ
//!   comes), `roce perf -R` exits 1 in bounded time, as server with "the peer stopped
//!   answering" (its liveness probes on the control connection), while live peers answer
//!   those probes through 12 s runs.
//!
//! Against the kernel's CM and rxe in the Soft-RoCE VM: tests/tests/interop_qp1.rs and
//! tests/tests/interop_rdmacm.rs. Root.

use std::{
    collections::BTreeSet,
    process::{Command, Output},
};

use roce::netns::VethEnd;
use roce_tests::{
    Loaded,
    rdmacm::{
        self, args, check_bw_row, check_perf_report, check_ping_lines, check_pingpong_summary,
        ours, roce_perf, server_and_client, servers_client, spawned_pair,
    },
    require_root, veth_pair,
};

fn text(o: &Output) -> String {
    roce_tests::output_text(o)
}

/// The dynamic symbols of `path` in a version node starting with `node` (`RDMACM`):
/// (version, name), the undefined ones or the defined ones.
fn dynsyms(path: &str, node: &str, undefined: bool) -> BTreeSet<(String, String)> {
    let o = Command::new("objdump")
        .args(["-T", path])
        .output()
        .expect("objdump (binutils)");
    assert!(o.status.success(), "objdump -T {path}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("*UND*") == undefined && l.contains(node))
        .filter_map(|l| {
            let mut w = l.split_whitespace().rev();
            let name = w.next()?.to_owned();
            let ver = w.next()?.trim_matches(['(', ')']).to_owned();
            // The version nodes' own entries (`*ABS*` RDMACM_1.0 RDMACM_1.0).
            (ver != name).then_some((ver, name))
        })
        .collect()
}

/// The Debian binaries that link librdmacm (rdmacm-utils and perftest).
const TOOLS: &[&str] = &[
    "rping",
    "ucmatose",
    "udaddy",
    "mckey",
    "rdma_server",
    "rdma_client",
    "rdma_xserver",
    "rdma_xclient",
    "cmtime",
    "rcopy",
    "riostream",
    "rstream",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_write_lat",
];

/// Every RDMACM symbol the tools import is defined with its version node, the library
/// defines every symbol of Debian's librdmacm.so.1, librdmacm.so.1 is the same file as
/// libibverbs.so.1, and each tool loads on it with every symbol bound.
#[test]
fn the_library_defines_what_the_rdmacm_tools_import_with_their_versions() {
    require_root();
    let dir = roce_tests::drop_in_lib_dir();
    let lib = dir.join("librdmacm.so.1");
    assert_eq!(
        std::fs::canonicalize(&lib).expect("librdmacm.so.1"),
        std::fs::canonicalize(dir.join("libibverbs.so.1")).expect("libibverbs.so.1"),
        "librdmacm.so.1 must be the drop-in libibverbs (one copy of the devices and the CM)"
    );
    let defined = dynsyms(lib.to_str().unwrap(), "RDMACM", false);
    let debian = dynsyms("/usr/lib/x86_64-linux-gnu/librdmacm.so.1", "RDMACM", false);
    assert!(debian.len() > 60, "Debian's librdmacm: {debian:?}");
    let missing: Vec<_> = debian.difference(&defined).collect();
    assert!(
        missing.is_empty(),
        "Debian's librdmacm defines, ours does not: {missing:?}"
    );
    for tool in TOOLS {
        let path = format!("/usr/bin/{tool}");
        assert!(
            std::path::Path::new(&path).exists(),
            "{tool} is not installed (cargo xtask setup: rdmacm-utils, perftest)"
        );
        let path = path.as_str();
        let needed = dynsyms(path, "RDMACM", true);
        assert!(!needed.is_empty(), "{tool} imports nothing from librdmacm?");
        let missing: Vec<_> = needed.difference(&defined).collect();
        assert!(missing.is_empty(), "{tool} needs {missing:?}");
        // Loads: `ldd -r` has the loader map the tool on the library and bind every symbol
        // (data and functions, with their versions) without running it.
        let o = Command::new("ldd")
            .args(["-r", path])
            .env("LD_LIBRARY_PATH", &dir)
            .output()
            .expect("ldd");
        let out = text(&o);
        assert!(
            o.status.success()
                && out.contains(&format!("librdmacm.so.1 => {}", lib.display()))
                && !out.contains("undefined symbol")
                && !out.contains("not found"),
            "{tool} does not load on the library: {out}"
        );
    }
}

/// Debian's unmodified rping, ucmatose and ib_{write,read,send}_bw -R, both ends on roce-xdp
/// through the drop-in librdmacm: every rping payload verified at both ends (`-V`),
/// ucmatose's connections all complete their sends, perftest's run reports every iteration
/// and a bandwidth above zero at both ends; the
/// interfaces are left without roce_xdp or pins.
#[test]
fn rping_ucmatose_and_perftest_connect_through_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("cm1", 182);
    // A program killed at a timeout cannot unload what it loaded: the pins go with the test.
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let server_ip = pair.a.ipv4.to_string();

    // rping: pings of 128 bytes, each RDMA READ by the server and WRITTEN back, verified;
    // 200 over IPv4, 50 over IPv6 (the RDMA CM IP header and the GIDs then carry IPv6
    // addresses). (The server's output waits in a pipe until the client is done: 200 lines of
    // -v must fit in it.)
    let pings = |out: &str| {
        out.lines()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count()
    };
    // Then 1000 over IPv4 without -v: the client checks every payload (-V) and exits
    // non-zero on a mismatch.
    for (ip, count, port, verbose) in [
        (pair.a.ipv4.to_string(), 200, 7174, true),
        (pair.a.ipv6.to_string(), 50, 7176, true),
        (pair.a.ipv4.to_string(), 1000, 7178, false),
    ] {
        let rping = |role: &str| {
            let (count, port) = (count.to_string(), port.to_string());
            let mut a = vec![
                role, "-V", "-S", "128", "-C", &count, "-p", &port, "-a", &ip,
            ];
            if verbose {
                a.push("-v");
            }
            args(&a)
        };
        let (c, s) = server_and_client(&pair, "rping", &rping("-s"), &rping("-c"));
        assert!(!c.contains("mismatch"), "client to {ip}:\n{c}");
        if verbose {
            assert_eq!(pings(&c), count, "client to {ip}:\n{c}");
            assert_eq!(pings(&s), count, "server at {ip}:\n{s}");
        }
    }

    // ucmatose: 4 connections, 50 sends each way on each.
    let (c, s) = server_and_client(
        &pair,
        "ucmatose",
        &args(&["-b", &server_ip, "-p", "7175", "-c", "4", "-C", "50"]),
        &args(&["-s", &server_ip, "-p", "7175", "-c", "4", "-C", "50"]),
    );
    for out in [&c, &s] {
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }

    // rdma_server and rdma_client: librdmacm's synchronous mode (rdma_create_ep,
    // rdma_get_request, rdma_verbs.h's post and completion helpers), one message each way.
    let sync_args = args(&["-s", &server_ip, "-p", "7178"]);
    let (c, s) = servers_client(
        &pair,
        ("rdma_server", &sync_args),
        ("rdma_client", &sync_args),
    );
    assert!(c.contains("rdma_client: end 0"), "{c}");
    assert!(s.contains("rdma_server: end 0"), "{s}");

    // perftest connecting with RDMA CM: 500 WRITEs, READs and SENDs of 64 KiB, each tool on
    // its own port.
    let dev = |end: &VethEnd| format!("roce_{}", end.ifname);
    for (tool, port) in [
        ("ib_write_bw", "18520"),
        ("ib_read_bw", "18521"),
        ("ib_send_bw", "18522"),
    ] {
        let perftest = |end: &VethEnd, server: Option<&str>| {
            let mut a = args(&[
                "-R",
                "-d",
                &dev(end),
                "-n",
                "500",
                "-s",
                "65536",
                "-p",
                port,
            ]);
            a.extend(server.map(str::to_owned));
            a
        };
        let (c, s) = server_and_client(
            &pair,
            tool,
            &perftest(&pair.a, None),
            &perftest(&pair.b, Some(&server_ip)),
        );
        for (who, out) in [("client", &c), ("server", &s)] {
            if let Err(e) = check_bw_row(&format!("{tool} {who}"), out, 65536, 500) {
                panic!("{e}");
            }
        }
    }

    for end in [&pair.a, &pair.b] {
        assert!(
            !std::path::Path::new(&format!("/sys/fs/bpf/roce/{}", end.ifname)).exists(),
            "pins left behind on {}",
            end.ifname
        );
        let o = Command::new("ip")
            .args(["-n", &end.netns, "link", "show", &end.ifname])
            .output()
            .expect("ip link");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("xdp"),
            "roce_xdp left on {}",
            end.ifname
        );
    }
}

/// `roce perf -R` (RDMA CM) with Debian's unmodified `ib_write_bw -R`, `ib_read_bw -R` and
/// `ib_send_bw -R` on the drop-in library, in both roles, and with itself: 500 messages of
/// 64 KiB each time; perftest's results table is checked at perftest's end, our JSON report
/// (connected through RDMA CM, every message counted) at ours, and between two `roce perf -R`
/// every byte of the data (`verified`).
#[test]
fn roce_perf_r_connects_through_rdma_cm_with_perftest_and_itself() {
    require_root();
    let pair = veth_pair("pr", 184);
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let server_ip = pair.a.ipv4.to_string();
    let (size, n) = (65536u32, 500u64);
    let perf = |end: &VethEnd, op: &str, port: u16, host: Option<&str>, verify: bool| {
        let mut a = args(&[
            op,
            "-R",
            "-d",
            &end.ifname,
            "-s",
            &size.to_string(),
            "-n",
            &n.to_string(),
            "-p",
            &port.to_string(),
        ]);
        if !verify {
            a.push("--no-verify".into());
        }
        a.extend(host.map(str::to_owned));
        a
    };
    let perftest = |end: &VethEnd, port: u16, host: Option<&str>| {
        let mut a = args(&[
            "-R",
            "-d",
            &format!("roce_{}", end.ifname),
            "-n",
            &n.to_string(),
            "-s",
            &size.to_string(),
            "-p",
            &port.to_string(),
        ]);
        a.extend(host.map(str::to_owned));
        a
    };
    for (i, (op, tool)) in rdmacm::PERF_R_TOOLS.into_iter().enumerate() {
        let port = 18530 + i as u16;
        // roce perf -R serves, perftest -R connects.
        let t = std::time::Instant::now();
        let (c, s) = spawned_pair(
            (
                "roce perf",
                roce_perf(&pair.a, &perf(&pair.a, op, port, None, false)),
            ),
            (tool, &|| {
                ours(&pair.b, tool, &perftest(&pair.b, port, Some(&server_ip)))
            }),
        );
        check_bw_row(&format!("{tool} client"), &c, size, n as u32)
            .unwrap_or_else(|e| panic!("{e}"));
        check_perf_report(&format!("roce perf {op} server"), &s, (size, n), false)
            .unwrap_or_else(|e| panic!("{e}"));
        // --no-verify: perftest's random bytes are not compared, nor reported as wrong.
        assert!(
            !s.contains("does not hold its data"),
            "roce perf {op} server with --no-verify:\n{s}"
        );
        eprintln!(
            "roce perf -R {op} server, {tool} -R client: {:.1} s",
            t.elapsed().as_secs_f64()
        );

        // perftest -R serves, roce perf -R connects.
        let port = 18533 + i as u16;
        let t = std::time::Instant::now();
        let (c, s) = spawned_pair(
            (tool, ours(&pair.a, tool, &perftest(&pair.a, port, None))),
            ("roce perf", &|| {
                roce_perf(&pair.b, &perf(&pair.b, op, port, Some(&server_ip), false))
            }),
        );
        check_bw_row(&format!("{tool} server"), &s, size, n as u32)
            .unwrap_or_else(|e| panic!("{e}"));
        check_perf_report(&format!("roce perf {op} client"), &c, (size, n), false)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{tool} -R server, roce perf -R {op} client: {:.1} s",
            t.elapsed().as_secs_f64()
        );

        // roce perf -R at both ends, every byte checked.
        let port = 18536 + i as u16;
        let t = std::time::Instant::now();
        let (c, s) = spawned_pair(
            (
                "roce perf",
                roce_perf(&pair.a, &perf(&pair.a, op, port, None, true)),
            ),
            ("roce perf", &|| {
                roce_perf(&pair.b, &perf(&pair.b, op, port, Some(&server_ip), true))
            }),
        );
        check_perf_report(&format!("roce perf {op} client"), &c, (size, n), true)
            .unwrap_or_else(|e| panic!("{e}"));
        check_perf_report(&format!("roce perf {op} server"), &s, (size, n), true)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "roce perf -R {op} at both ends: {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    // Between two roce perf -R, IPv6 too (perftest's -R resolves IPv4 only).
    let t = std::time::Instant::now();
    let server_ip6 = pair.a.ipv6.to_string();
    let (c, s) = spawned_pair(
        (
            "roce perf",
            roce_perf(&pair.a, &perf(&pair.a, "write", 18539, None, true)),
        ),
        ("roce perf", &|| {
            roce_perf(
                &pair.b,
                &perf(&pair.b, "write", 18539, Some(&server_ip6), true),
            )
        }),
    );
    check_perf_report("roce perf write client (IPv6)", &c, (size, n), true)
        .unwrap_or_else(|e| panic!("{e}"));
    check_perf_report("roce perf write server (IPv6)", &s, (size, n), true)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "roce perf -R write at both ends over IPv6: {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// Starts a client with `start` until `watch` (the output of the client's or of its server's
/// program) shows `needle`, the connection made: again while the server does not listen yet
/// (the client exits first), at most 20 times. `watch` is `None` for the client's own output.
fn started(
    who: &str,
    needle: &str,
    mut watch: Option<&mut rdmacm::Lines>,
    start: &dyn Fn() -> roce_tests::child::Reaper,
) -> roce_tests::child::Reaper {
    let limit = std::time::Duration::from_secs(30);
    let mut tries = 0;
    loop {
        tries += 1;
        std::thread::sleep(std::time::Duration::from_millis(500));
        let mut c = start();
        let mut own;
        let lines = match watch.as_deref_mut() {
            Some(w) => w,
            None => {
                own = rdmacm::Lines::of(&mut c, who);
                &mut own
            }
        };
        match lines.wait_for(needle, limit, &mut || c.exited()) {
            Ok(()) => return c,
            Err(e) if tries < 20 && c.exited() => eprintln!("{who} again: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Waits for `roce -j perf` (`r`) to fail after its peer was killed at `killed`: it exits 1
/// with a JSON error within `bound`. Returns the error and how long it took.
fn fails_within(
    r: roce_tests::child::Reaper,
    who: &str,
    killed: std::time::Instant,
    bound: std::time::Duration,
) -> (String, f64) {
    let o = roce_tests::child::finish_within(r, std::time::Duration::from_secs(90), who);
    let secs = killed.elapsed().as_secs_f64();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{who} ({}):\n{out}", o.status);
    let err = rdmacm::json_error(&out).unwrap_or_else(|| panic!("{who}: no JSON error:\n{out}"));
    assert!(
        secs < bound.as_secs_f64(),
        "{who} took {secs:.1} s to fail, more than {bound:?}: {err}"
    );
    (err, secs)
}

/// A perftest peer on the drop-in library that is SIGKILLed mid-run sends no DREQ (its CM
/// died with it), and `roce perf -R` must not wait for it forever: as the server of
/// `ib_send_bw -R` and of `ib_write_bw -R` (each killed a second after its run began), it
/// probes the peer on the control connection and exits 1 within 20 s of the kill (the probes'
/// design bound: ~1 s + ~8.5 s), with "the peer stopped answering" as its JSON error. As the
/// client of `ib_send_bw -R`, killed the same way, it exits 1 within 25 s (its SENDs go
/// unanswered: the run's 10 s stall check). The runs with live peers are
/// `roce_perf_r_connects_through_rdma_cm_with_perftest_and_itself`.
#[test]
fn roce_perf_r_fails_in_bounded_time_when_its_perftest_peer_is_killed() {
    require_root();
    let pair = veth_pair("pk", 208);
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let server_ip = pair.a.ipv4.to_string();
    // Long enough that the kill comes mid-run: 64 GB.
    let (size, n) = ("65536", "1000000");
    let bound = std::time::Duration::from_secs(20);
    for (i, (op, tool)) in [("send", "ib_send_bw"), ("write", "ib_write_bw")]
        .into_iter()
        .enumerate()
    {
        let port = (18550 + i).to_string();
        let server = roce_perf(
            &pair.a,
            &args(&[
                op,
                "-R",
                "-d",
                &pair.a.ifname,
                "-s",
                size,
                "-n",
                n,
                "-p",
                &port,
                "--no-verify",
            ]),
        );
        let perftest = args(&[
            "-R",
            "-d",
            &format!("roce_{}", pair.b.ifname),
            "-s",
            size,
            "-n",
            n,
            "-p",
            &port,
            &server_ip,
        ]);
        // perftest prints its results header as its run begins.
        let mut client = started(&format!("{tool} client"), "#bytes", None, &|| {
            ours(&pair.b, tool, &perftest)
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        client.kill().expect("SIGKILL perftest");
        let killed = std::time::Instant::now();
        let (err, secs) = fails_within(server, &format!("roce perf {op} server"), killed, bound);
        assert!(
            err.contains("the peer stopped answering"),
            "roce perf {op} server failed otherwise: {err}"
        );
        eprintln!(
            "roce perf -R {op} server, {tool} -R client killed: failed after {secs:.1} s: {err}"
        );
    }

    // The reverse: perftest's server killed under our client.
    let port = "18552";
    let mut server = ours(
        &pair.a,
        "ib_send_bw",
        &args(&[
            "-R",
            "-d",
            &format!("roce_{}", pair.a.ifname),
            "-s",
            size,
            "-n",
            n,
            "-p",
            port,
        ]),
    );
    let mut lines = rdmacm::Lines::of(&mut server, "ib_send_bw server");
    let client = started("roce perf send client", "#bytes", Some(&mut lines), &|| {
        roce_perf(
            &pair.b,
            &args(&[
                "send",
                "-R",
                "-d",
                &pair.b.ifname,
                "-s",
                size,
                "-n",
                n,
                "-p",
                port,
                "--no-verify",
                &server_ip,
            ]),
        )
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    server.kill().expect("SIGKILL perftest");
    let killed = std::time::Instant::now();
    let (err, secs) = fails_within(
        client,
        "roce perf send client",
        killed,
        std::time::Duration::from_secs(25),
    );
    eprintln!(
        "ib_send_bw -R server killed, roce perf -R send client: failed after {secs:.1} s: {err}"
    );
}

/// `roce perf -R`'s liveness probes on the control connection (a zero-length RDMA WRITE after
/// each second without news) do not disturb a run with a live peer that lasts longer than a
/// dead peer takes to fail (~9.5 s): 12 s (`-D 12`) of `roce perf write -R` serving Debian's
/// `ib_write_bw -R` on the drop-in library, and of `roce perf send -R` at both ends with every
/// byte checked. Our server's report counts the probes the peer acknowledged.
#[test]
fn roce_perf_r_probes_keep_a_long_run_with_a_live_peer_going() {
    require_root();
    let pair = veth_pair("pl", 209);
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let server_ip = pair.a.ipv4.to_string();
    let secs = 12.0;
    let perf = |end: &VethEnd, op: &str, port: &str, host: Option<&str>| {
        let mut a = args(&[op, "-R", "-d", &end.ifname, "-s", "65536", "-p", port]);
        if let Some(h) = host {
            a.extend(args(&["-D", &secs.to_string(), h]));
        }
        a
    };
    // The probes a report counts, after checking it shows a run (its data checked with
    // `verify`). Its seconds are not the run's: perftest's -D report leaves out a warm-up
    // and a cool-down.
    let probes = |who: &str, out: &str, verify: bool| {
        let v = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v.get("bw_mb_per_sec").is_some())
            .unwrap_or_else(|| panic!("{who}: no JSON report:\n{out}"));
        assert!(
            v["messages"].as_u64().unwrap_or(0) > 0 && (!verify || v["verified"] == true),
            "{who}: no checked run: {v}"
        );
        v["rdma_cm_probes"].as_u64().unwrap_or(0)
    };

    let t = std::time::Instant::now();
    let (c, s) = spawned_pair(
        (
            "roce perf",
            roce_perf(&pair.a, &{
                let mut a = perf(&pair.a, "write", "18553", None);
                a.push("--no-verify".into());
                a
            }),
        ),
        ("ib_write_bw", &|| {
            ours(
                &pair.b,
                "ib_write_bw",
                &args(&[
                    "-R",
                    "-d",
                    &format!("roce_{}", pair.b.ifname),
                    "-s",
                    "65536",
                    "-D",
                    &secs.to_string(),
                    "-p",
                    "18553",
                    &server_ip,
                ]),
            )
        }),
    );
    assert!(
        c.contains("Data ex. method : rdma_cm"),
        "ib_write_bw did not run over rdma_cm:\n{c}"
    );
    let took = t.elapsed().as_secs_f64();
    assert!(took >= secs, "a -D {secs} run over in {took:.1} s");
    let n = probes("roce perf write server", &s, false);
    assert!(
        n >= 5,
        "roce perf write server: {n} probes acknowledged in a {secs} s run:\n{s}"
    );
    eprintln!(
        "roce perf -R write server, ib_write_bw -R -D {secs} client: {n} probes acknowledged, {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let t = std::time::Instant::now();
    let (c, s) = spawned_pair(
        (
            "roce perf",
            roce_perf(&pair.a, &perf(&pair.a, "send", "18554", None)),
        ),
        ("roce perf", &|| {
            roce_perf(&pair.b, &perf(&pair.b, "send", "18554", Some(&server_ip)))
        }),
    );
    let took = t.elapsed().as_secs_f64();
    assert!(took >= secs, "a -D {secs} run over in {took:.1} s");
    probes("roce perf send client", &c, true);
    let n = probes("roce perf send server", &s, true);
    assert!(
        n >= 5,
        "roce perf send server: {n} probes acknowledged in a {secs} s run:\n{s}"
    );
    eprintln!(
        "roce perf -R send at both ends, -D {secs}: {n} probes acknowledged, {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// Debian's unmodified udaddy, both ends on roce-xdp through the drop-in librdmacm: each of
/// the client's SIDR requests is answered with the server's UD QP and RDMA CM's Q_Key, and
/// the messages go both ways over the UD QPs (udaddy waits for every one of them before it
/// prints "data transfers complete").
#[test]
fn udaddy_resolves_and_sends_through_the_library_at_both_ends() {
    require_root();
    let pair = veth_pair("cm2", 183);
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let server_ip = pair.a.ipv4.to_string();
    let (c, s) = server_and_client(
        &pair,
        "udaddy",
        &args(&["-b", &server_ip, "-c", "2", "-C", "20", "-S", "512"]),
        &args(&["-s", &server_ip, "-c", "2", "-C", "20", "-S", "512"]),
    );
    for out in [&c, &s] {
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }
    assert!(c.contains("initiating data transfers"), "client:\n{c}");
    assert!(s.contains("sending replies"), "server:\n{s}");
}

/// `roce pingpong -R` (rping's protocol over RDMA CM) against Debian's unmodified rping on the
/// drop-in library, both ways, and against itself: rping's `-v` lines are every ping, each
/// rping's data; our summary counts every ping, each checked (`-c`: the client compares what
/// came back, the server what it READ). Then the errors: a client whose server is not there
/// is REJECTED, and a ping larger than the server takes ends both sides with a message.
#[test]
fn roce_pingpong_r_speaks_rpings_protocol() {
    require_root();
    let pair = veth_pair("pq", 185);
    let _unpin = (Loaded::guard(&pair.a.ifname), Loaded::guard(&pair.b.ifname));
    let ip = pair.a.ipv4.to_string();
    let roce = |end: &VethEnd, rest: &[&str]| {
        let mut a = args(&["pingpong", "-R", "-c", "-d", &end.ifname]);
        a.extend(args(rest));
        a
    };

    // Our server (taking any rping size by default), rping's client: 200 pings of 128 bytes.
    let rping_c = args(&[
        "-c", "-v", "-V", "-S", "128", "-C", "200", "-a", &ip, "-p", "18540",
    ]);
    let mut t = std::time::Instant::now();
    let mut lap = |what: &str| {
        eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
        t = std::time::Instant::now();
    };
    let (c, s) = servers_client(
        &pair,
        ("roce", &roce(&pair.a, &["-p", "18540"])),
        ("rping", &rping_c),
    );
    lap("our server, rping -c");
    let checks = [
        check_ping_lines("rping -c", &c, 200, 128),
        check_pingpong_summary("our server", &s, "server", 200, 128),
    ];
    // rping's server, our client.
    let rping_s = args(&["-s", "-v", "-V", "-S", "128", "-a", &ip, "-p", "18541"]);
    let (c, s) = servers_client(
        &pair,
        ("rping", &rping_s),
        (
            "roce",
            &roce(&pair.b, &["-s", "128", "-n", "200", "-p", "18541", &ip]),
        ),
    );
    lap("rping -s, our client");
    let checks2 = [
        check_ping_lines("rping -s", &s, 200, 128),
        check_pingpong_summary("our client", &c, "client", 200, 128),
    ];
    // Ours at both ends: 1000 pings of rping's default 64 bytes over IPv4, 100 of 4000 bytes
    // over IPv6.
    let mut checks3 = Vec::new();
    for (at, n, size, port) in [
        (ip.clone(), "1000", "64", "18542"),
        (pair.a.ipv6.to_string(), "100", "4000", "18543"),
    ] {
        let (c, s) = server_and_client(
            &pair,
            "roce",
            &roce(&pair.a, &["-s", size, "-p", port]),
            &roce(&pair.b, &["-s", size, "-n", n, "-p", port, &at]),
        );
        lap(&format!("ours at both ends, {n} pings of {size} bytes"));
        let (n, size) = (n.parse().unwrap_or(0), size.parse().unwrap_or(0));
        checks3.push(check_pingpong_summary("our client", &c, "client", n, size));
        checks3.push(check_pingpong_summary("our server", &s, "server", n, size));
    }
    for r in checks.into_iter().chain(checks2).chain(checks3) {
        if let Err(e) = r {
            panic!("{e}");
        }
    }

    // Nobody listens on 18544 (a server of ours on 18546 runs the CM there): REJECTED
    // (invalid service ID) once our 5 s of retries are over.
    let other = roce_tests::child::spawn(&pair.a.netns, &roce(&pair.a, &["-p", "18546"]));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let t0 = std::time::Instant::now();
    let c = roce_tests::child::finish_within(
        roce_tests::child::spawn(&pair.b.netns, &roce(&pair.b, &["-p", "18544", &ip])),
        std::time::Duration::from_secs(30),
        "our client without a server",
    );
    let out = text(&c);
    assert!(
        !c.status.success() && out.contains("REJECTED") && out.contains("INVALID_SERVICE_ID"),
        "{out}"
    );
    assert!(t0.elapsed().as_secs() < 20, "{:?}: {out}", t0.elapsed());
    drop(other);
    lap("no listener: REJECTED");

    // A ping of 1000 bytes to a server that takes 500: the server says so and leaves, and the
    // client hears of it (the server's DREQ), both with status 1, neither killed.
    let s = roce_tests::child::spawn(&pair.a.netns, &roce(&pair.a, &["-s", "500", "-p", "18545"]));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let c = roce_tests::child::finish_within(
        roce_tests::child::spawn(
            &pair.b.netns,
            &roce(&pair.b, &["-s", "1000", "-n", "5", "-p", "18545", &ip]),
        ),
        std::time::Duration::from_secs(30),
        "our client with a too large ping",
    );
    let s = roce_tests::child::finish_within(
        s,
        std::time::Duration::from_secs(30),
        "our server given a too large ping",
    );
    let (ct, st) = (text(&c), text(&s));
    assert_eq!(c.status.code(), Some(1), "client:\n{ct}\nserver:\n{st}");
    assert_eq!(s.status.code(), Some(1), "client:\n{ct}\nserver:\n{st}");
    assert!(
        st.contains("is 1000 bytes; this server takes 1 to 500"),
        "{st}"
    );
    assert!(ct.contains("the server disconnected"), "{ct}");
    lap("a ping larger than the server takes");
}
