//! Debian's unmodified perftest (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw` and
//! the four `_lat` tools) with both ends on the drop-in libibverbs, each end in its own network
//! namespace on one side of a veth pair, started through `roce --netns NS exec` as a user
//! would. perftest links libmlx5.so.1 and libefa.so.1 with BIND_NOW, so these also prove the
//! stand-ins (roce-user/verbs/mlx5, roce-user/verbs/efa) and every symbol perftest and
//! librdmacm import. Each run must exit 0 at both ends and report a nonzero bandwidth or
//! latency on every result line, and the interfaces must be clean afterwards. Root.
//!
//! By default (CI): the eight tools over RC with one QP at their default size, and
//! `ib_write_bw`, `ib_read_bw`, `ib_send_bw` with four QPs (about a minute). With
//! `ROCE_PERFTEST_FULL=1` also every size (`-a`), `ib_atomic_bw` with four QPs, and the UC
//! (`-c UC`: write and send) and UD (`-c UD`: send) rows perftest offers.

use std::{process::Output, time::Duration};

use roce::netns::{VethEnd, VethPair};
use roce_tests::{ipv4_gid_index, require_root, roce_bin, veth_pair};

/// Whether the full matrix was asked for.
fn full() -> bool {
    std::env::var("ROCE_PERFTEST_FULL").is_ok_and(|v| v == "1")
}

/// The longest one perftest run may take (debug builds on a loaded 2-core machine; `-a`
/// reaches 8 MiB messages).
const RUN_LIMIT: Duration = Duration::from_secs(180);

fn text(o: &Output) -> String {
    roce_tests::output_text(o)
}

/// Checks that the library and both stand-ins are built next to the `roce` under test (what
/// `roce exec` links into roce-verbs/).
fn require_libraries() {
    let bin = roce_bin();
    let dir = bin.parent().expect("roce's folder");
    for lib in ["libibverbs.so", "libmlx5.so", "libefa.so"] {
        assert!(
            dir.join(lib).exists(),
            "{lib} is not built next to {} (cargo build -p roce-verbs -p roce-verbs-mlx5 \
             -p roce-verbs-efa)",
            bin.display()
        );
    }
}

/// One result row of perftest: the message size, the figure reported (average MB/s for a
/// bandwidth test, typical µs for a latency test) and the one checked nonzero (the message
/// rate in Mpps, printed with 6 decimals where MB/s has 2, so small messages on a slow debug
/// build do not round to zero; for a latency test the typical µs again).
#[derive(Debug)]
struct Row {
    bytes: u64,
    iters: u64,
    figure: f64,
    checked: f64,
}

/// The result rows of perftest's output: the lines of numbers after its `#bytes` header. In a
/// bandwidth table the figure is `BW average[MB/sec]` (the 4th column) and the rate
/// `MsgRate[Mpps]` (the 5th), in a latency table both are `t_typical[usec]` (the 5th).
fn rows(out: &str) -> Vec<Row> {
    let mut col = None;
    let mut found = Vec::new();
    for line in out.lines() {
        let l = line.trim();
        if l.starts_with("#bytes") {
            col = Some(if l.contains("t_typical") {
                (4, 4)
            } else {
                (3, 4)
            });
            continue;
        }
        let Some((fig, chk)) = col else { continue };
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok());
        match (num(0), num(1), num(fig), num(chk)) {
            (Some(b), Some(n), Some(v), Some(c)) if f[0].bytes().all(|c| c.is_ascii_digit()) => {
                found.push(Row {
                    bytes: b as u64,
                    iters: n as u64,
                    figure: v,
                    checked: c,
                });
            }
            _ if l.starts_with("---") => {}
            _ => col = None,
        }
    }
    found
}

/// A perftest run: the tool and its arguments (both ends), and the sizes it must report.
struct Case {
    tool: &'static str,
    args: Vec<String>,
    /// Options of `roce exec` for both ends (before `--`).
    exec: Vec<String>,
    /// The message sizes the client must report (one row each), in order.
    sizes: Vec<u64>,
}

impl Case {
    fn new(tool: &'static str, args: &[&str], sizes: &[u64]) -> Self {
        Self {
            tool,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            exec: Vec::new(),
            sizes: sizes.to_vec(),
        }
    }

    /// This case with `opts` given to `roce exec` at both ends.
    fn exec(mut self, opts: &[&str]) -> Self {
        self.exec = opts.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    fn name(&self) -> String {
        let exec = self.exec.join(" ");
        format!(
            "{exec}{}{} {}",
            if exec.is_empty() { "" } else { " " },
            self.tool,
            self.args.join(" ")
        )
    }
}

/// perftest's `-a` sizes: 2 B to 8 MiB by powers of two.
fn all_sizes() -> Vec<u64> {
    (1..=23).map(|s| 1u64 << s).collect()
}

/// Runs `case` with the server on `pair.a` and the client on `pair.b`, both through
/// `roce --netns NS exec -d IFACE`, on TCP port `port`; returns the client's rows after
/// checking both ends exited 0 and every row (both ends) has a nonzero figure.
fn run(pair: &VethPair, case: &Case, port: u16) -> Vec<Row> {
    let start = |end: &VethEnd, server: Option<&VethEnd>| {
        let mut args: Vec<String> = vec!["exec".to_owned()];
        args.extend(case.exec.iter().cloned());
        args.extend(["-d", &end.ifname, "--", case.tool, "-d"].map(str::to_owned));
        args.push(format!("roce_{}", end.ifname));
        args.extend([
            "-x".to_owned(),
            ipv4_gid_index(end),
            "-p".to_owned(),
            port.to_string(),
        ]);
        args.extend(case.args.iter().cloned());
        args.extend(server.map(|s| s.ipv4.to_string()));
        roce_tests::child::spawn(&end.netns, &args)
    };
    let server = start(&pair.a, None);
    // perftest's client gives up at once if nobody listens: wait for the server's socket.
    roce_tests::rxe::wait_host_listen(&pair.a.netns, port, Duration::from_secs(30));
    let client = start(&pair.b, Some(&pair.a));
    let name = case.name();
    let c = roce_tests::child::finish_within(client, RUN_LIMIT, &format!("{name} client"));
    let s = roce_tests::child::finish_within(server, RUN_LIMIT, &format!("{name} server"));
    let (ct, st) = (text(&c), text(&s));
    assert!(
        c.status.success() && s.status.success(),
        "{name}: client {:?}, server {:?}\nclient:\n{ct}\nserver:\n{st}",
        c.status,
        s.status
    );
    let got = rows(&ct);
    let sizes: Vec<u64> = got.iter().map(|r| r.bytes).collect();
    assert_eq!(sizes, case.sizes, "{name}: the sizes reported\n{ct}");
    for r in got.iter().chain(&rows(&st)) {
        assert!(
            r.iters > 0 && r.checked > 0.0 && r.checked.is_finite() && r.figure >= 0.0,
            "{name}: a zero result {r:?}\nclient:\n{ct}\nserver:\n{st}"
        );
    }
    eprintln!("{name}: {got:?}");
    got
}

/// The interfaces of `pair` are as before the programs ran: no XDP program, no pins.
fn assert_clean(pair: &VethPair) {
    for end in [&pair.a, &pair.b] {
        let link = std::process::Command::new("ip")
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
            "pins left behind on {}",
            end.ifname
        );
    }
}

/// Runs every case on one veth pair, ports from `base`, then checks the interfaces.
fn run_all(pair: &VethPair, cases: &[Case], base: u16) {
    for (i, case) in cases.iter().enumerate() {
        let _ = run(pair, case, base + u16::try_from(i).expect("few cases"));
    }
    assert_clean(pair);
}

/// The bandwidth tools over RC: each with one QP at its default size (64 KiB; 8 B for
/// atomics), and WRITE, READ and SEND with four QPs (perftest posts on all four; the rows
/// count every QP's iterations).
#[test]
fn perftest_bw_over_rc_with_both_ends_on_the_library() {
    require_root();
    require_libraries();
    let pair = veth_pair("pv1", 180);
    let n = ["-n", "200"];
    let mut cases = vec![
        Case::new("ib_write_bw", &n, &[65536]),
        Case::new("ib_read_bw", &n, &[65536]),
        Case::new("ib_send_bw", &n, &[65536]),
        Case::new("ib_atomic_bw", &n, &[8]),
        Case::new("ib_write_bw", &["-n", "200", "-q", "4"], &[65536]),
        Case::new("ib_read_bw", &["-n", "200", "-q", "4"], &[65536]),
        Case::new("ib_send_bw", &["-n", "200", "-q", "4"], &[65536]),
    ];
    if full() {
        cases.extend([
            Case::new("ib_atomic_bw", &["-n", "200", "-q", "4"], &[8]),
            Case::new("ib_write_bw", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_read_bw", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_send_bw", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_write_bw", &["-a", "-n", "20", "-q", "4"], &all_sizes()),
            // UC (WRITE and SEND) and UD (SEND, at most the path MTU), last: they need the
            // UC and UD QPs of the library.
            Case::new("ib_write_bw", &["-c", "UC", "-n", "200"], &[65536]),
            Case::new("ib_send_bw", &["-c", "UC", "-n", "200"], &[65536]),
            Case::new(
                "ib_send_bw",
                &["-c", "UD", "-n", "200", "-s", "1024"],
                &[1024],
            ),
        ]);
    }
    run_all(&pair, &cases, 19100);
}

/// `roce exec --no-ack-coalescing` (ROCE_ACK_COALESCING=0) reaches the library: ib_write_bw's
/// 64-byte WRITEs, 128 in flight, reach the server in batches, whose AckReq requests its
/// responder answers with coalesced ACKs by default (device counter `ack_coalesced`, read
/// with `roce stats` on the interface, loaded beforehand so the counters outlive the
/// programs) and with an ACK each with the switch. A wrong `ROCE_ACK_COALESCING` value is
/// refused with a message naming it (the library's unit test `switches_come_from_the_environment`).
#[test]
fn ack_coalescing_is_switched_off_through_roce_exec() {
    require_root();
    require_libraries();
    let pair = veth_pair("pv3", 187);
    let _l = roce_tests::Loaded::on(&[&pair.a, &pair.b]);
    let coalesced = || {
        let o = roce_tests::roce(&[
            "--netns",
            &pair.a.netns,
            "stats",
            "-j",
            "-i",
            &pair.a.ifname,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roce stats -j");
        v["device"]["ack_coalesced"]
            .as_u64()
            .expect("device.ack_coalesced in roce stats")
    };
    let args = ["-s", "64", "-n", "20000"];
    let mut merged = Vec::new();
    for (i, case) in [
        Case::new("ib_write_bw", &args, &[64]),
        Case::new("ib_write_bw", &args, &[64]).exec(&["--no-ack-coalescing"]),
    ]
    .iter()
    .enumerate()
    {
        let before = coalesced();
        let _ = run(&pair, case, 19170 + u16::try_from(i).expect("two cases"));
        merged.push(coalesced() - before);
        eprintln!("{}: {} ACKs coalesced", case.name(), merged[i]);
    }
    assert!(merged[0] > 0, "the default coalesced no ACK: {merged:?}");
    assert_eq!(
        merged[1], 0,
        "--no-ack-coalescing coalesced ACKs: {merged:?}"
    );
}

/// The latency tools over RC with one QP (perftest offers no more in a latency test) at their
/// default size (2 B; 8 B for atomics).
#[test]
fn perftest_lat_over_rc_with_both_ends_on_the_library() {
    require_root();
    require_libraries();
    let pair = veth_pair("pv2", 181);
    let n = ["-n", "200"];
    let mut cases = vec![
        Case::new("ib_write_lat", &n, &[2]),
        Case::new("ib_read_lat", &n, &[2]),
        Case::new("ib_send_lat", &n, &[2]),
        Case::new("ib_atomic_lat", &n, &[8]),
    ];
    if full() {
        cases.extend([
            Case::new("ib_write_lat", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_read_lat", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_send_lat", &["-a", "-n", "20"], &all_sizes()),
            Case::new("ib_write_lat", &["-c", "UC", "-n", "200"], &[2]),
            Case::new("ib_send_lat", &["-c", "UC", "-n", "200"], &[2]),
            Case::new(
                "ib_send_lat",
                &["-c", "UD", "-n", "200", "-s", "1024"],
                &[1024],
            ),
        ]);
    }
    run_all(&pair, &cases, 19200);
}

#[test]
fn perftest_rows_are_parsed_from_both_tables() {
    let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      200              39.05              15.74  \t\t   0.000252\n---------\n";
    let r = rows(bw);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].bytes, r[0].iters), (65536, 200));
    assert!((r[0].figure - 15.74).abs() < 1e-9);
    assert!((r[0].checked - 0.000252).abs() < 1e-12);
    let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       200          72.51          52564.34      1974.82  \t       2383.95     \t3796.36\t\t41071.77 \t\t52564.34\n";
    let r = rows(lat);
    assert_eq!(r.len(), 1);
    assert!((r[0].figure - 1974.82).abs() < 1e-9);
    assert!(rows("no table here\n 1 2 3 4\n").is_empty());
}
