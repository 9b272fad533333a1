//! `roce perf` against the real perftest (Debian's 4.5+0.17, which announces itself as 6.06)
//! on Linux Soft-RoCE in a VM: ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw, both
//! directions, 1 and 4 QPs, at 2 B, 4 KiB, 64 KiB and 1 MiB (atomics: 8 B), path MTU 1024. Every
//! scenario is captured and checked (tshark, ICRC of every frame, counters of both sides), and
//! the bandwidth is put next to rxe ↔ rxe measured in the same run: after the matrix a second VM
//! boots on the same bridge and takes roce-xdp's place in every row, the first guest keeping its
//! role (`perftest_matrix::rxe_reference`).
//!
//! perftest 6.06 does no binary parameter negotiation (that came with 6.28): `roce perf`
//! announces 6.06 too, so a newer perftest skips it towards us as it does towards any older
//! perftest. Data is not verified against perftest (its buffers hold random bytes:
//! `--no-verify`).
//!
//! Iterations per QP (CI): 1000 at 2 B and 4 KiB, 200 at 64 KiB, 8 at 1 MiB, 500 atomics. With
//! 200 at 4 KiB (0.1-0.3 s of traffic) the comparison with rxe ↔ rxe swung from 0.5x to 2x
//! between runs; `ib_send_bw -s 4096` from us to rxe, 0.52x and 0.78x at 200, gave 1.21x and
//! 1.03x at 1000.
//! `ROCE_INTEROP_FULL=1` runs 1000 iterations of every size.
//!
//! In the same boot, Debian's unmodified perftest runs on our side too, on the drop-in
//! libibverbs (`roce exec -d IF -- ib_write_bw ...`), against rxe's perftest, both directions
//! (`dropin-*` rows, ports 19401 and up): in CI ib_write_bw, ib_read_bw, ib_send_bw and
//! ib_atomic_bw with 1 QP and ib_write_bw with 4 QPs at 64 KiB (atomics 8 B) with the matrix's
//! iterations, and ib_write_lat and ib_send_lat at 2 B, 200 iterations; with
//! `ROCE_INTEROP_FULL=1` all eight tools, 4 QPs for every bandwidth tool, every matrix size
//! (latency 2 B and 4 KiB), and UC (`-c UC`: write, send) and UD (`-c UD`: send at 1024 B).
//! perftest's own result (BW average MB/s, or t_typical µs) of each row is recorded next to
//! the `roce perf` figure of the same tool, size, QP count and direction in the same run: the
//! matrix row for a bandwidth tool, and for ib_write_lat and ib_send_lat over RC a
//! `roce perf write|send --lat` scenario run beside it (`roce perf` has no read or atomic
//! latency test, nor UC or UD).

use std::{fmt::Write as _, path::Path, time::Instant};

use roce_tests::{
    perftest_matrix::{self, Op, References, Row, iters, rxe_reference, scenario, scenario_with},
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roles, SceneReport},
    tag,
};

fn table(rows: &[Row], reference: &References) -> String {
    let mut s = String::from(
        "| tool | server | client | QPs | size | result | roce MB/s | perftest MB/s | rxe↔rxe MB/s | vs rxe↔rxe | retransmitted (rxe/ours) | packets |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let ours = r
            .report
            .ours
            .as_ref()
            .ok()
            .and_then(|v| v["bw_mb_per_sec"].as_f64());
        let line = rxe::perftest_bw_line(&r.report.guest.out);
        let theirs = line.map(|x| x.3);
        let refs = reference.get(&r.reference_key());
        let (refbw, ratio) = match (refs, line) {
            // Message rates: at one size their ratio is the bandwidths', with more digits.
            (Some(Ok((bw, rate))), Some(l)) => (format!("{bw:.2}"), format!("{:.2}", l.4 / rate)),
            (Some(Ok((bw, _))), None) => (format!("{bw:.2}"), "-".into()),
            (Some(Err(_)), _) => ("failed".into(), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "| ib_{}_bw{} | {} | {} | {} | {} | {} | {} | {} | {} | {ratio} | {}/{} | {} |",
            r.op.name(),
            if r.report.name.ends_with("-multipath") {
                " (roce --multipath)"
            } else if r.report.name.ends_with("-software") {
                " (roce --cc-profile software)"
            } else {
                ""
            },
            r.server,
            if r.server == "rxe" { "roce" } else { "rxe" },
            r.qps,
            r.size,
            if r.report.ok() {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", r.report.failures.join("; ").replace('|', "/"))
            },
            ours.map_or("-".into(), |b| format!("{b:.2}")),
            theirs.map_or("-".into(), |b| format!("{b:.2}")),
            refbw,
            r.report
                .ours_ctr
                .get("duplicate_request")
                .copied()
                .unwrap_or(0),
            perftest_matrix::rxe_dups_less_probes(&r.report),
            r.report.icrc.good,
        );
    }
    s
}

/// Our side's sum over its QPs of the congestion-control counter `name` (0 without a report).
fn cc_sum(report: &SceneReport, name: &str) -> u64 {
    report
        .ours
        .as_ref()
        .map_or(0, |v| perftest_matrix::cc_sum(v, name))
}

/// The ACK-eliciting probes our side sent (`loss_backoff`'s READ clock).
fn probes_sent(report: &SceneReport) -> u64 {
    cc_sum(report, "rp_probe_sent")
}

/// The READ responses of `row` (roce-xdp the responder, `loss_backoff` on) went by the
/// clock of the guest's answers to probes (transport/cc.rs `ReadClock`): probes sent and
/// (nearly) all answered, and at most 1 % of the responses dropped at the guest's tap.
fn check_read_clock(peer: &Peer, row: &mut Row) {
    let (sent, answered, lost) = (
        probes_sent(&row.report),
        cc_sum(&row.report, "rp_probe_answered"),
        cc_sum(&row.report, "rp_probe_lost"),
    );
    let dropped = row
        .report
        .other
        .get(&format!("link.{}.tx_dropped", peer.tap))
        .copied()
        .unwrap_or(0);
    // 4 QPs × 8 READs × 1024 responses of 1 KiB (path MTU 1024).
    let responses = 4 * 8 * 1024;
    println!(
        "{}: probes sent {sent}, answered {answered}, lost {lost}; tap drops {dropped} of {responses} responses",
        row.report.name
    );
    if sent == 0 || answered * 10 < sent * 9 {
        row.report.failures.push(format!(
            "probes sent {sent}, answered {answered}, lost {lost}: the guest did not answer them"
        ));
    }
    if dropped * 100 > responses {
        row.report.failures.push(format!(
            "{dropped} frames dropped at the guest's tap (of {responses} responses): the clock did not hold them"
        ));
    }
}

/// One result row of perftest, either table: (bytes, iterations, figure, checked), the figure
/// being `BW average[MB/sec]` (bandwidth) or `t_typical[usec]` (latency), and `checked` the one
/// that must be nonzero: the message rate in Mpps for bandwidth (2-byte messages round to 0.00
/// MB/s on a TCG guest), t_typical again for latency.
fn perftest_result(out: &str) -> Option<(u64, u64, f64, f64)> {
    let mut lines = out.lines();
    let header = lines.find(|l| l.contains("#bytes"))?;
    let (fig, chk) = if header.contains("t_typical") {
        (4, 4)
    } else {
        (3, 4)
    };
    let f: Vec<&str> = lines.next()?.split_whitespace().collect();
    Some((
        f.first()?.parse().ok()?,
        f.get(1)?.parse().ok()?,
        f.get(fig)?.parse().ok()?,
        f.get(chk)?.parse().ok()?,
    ))
}

/// A perftest run with our side on the drop-in library.
#[derive(Clone, Debug)]
struct DropCase {
    /// `ib_write_bw`, ..., `ib_atomic_lat`.
    tool: &'static str,
    /// The operation, for the `roce perf` figure of the same tool.
    op: Op,
    lat: bool,
    /// `RC`, `UC` or `UD`.
    conn: &'static str,
    size: u32,
    qps: u32,
    iters: u32,
}

impl DropCase {
    fn new(tool: &'static str, conn: &'static str, size: u32, qps: u32) -> Self {
        let lat = tool.ends_with("_lat");
        let op = match tool.strip_prefix("ib_").and_then(|t| t.split('_').next()) {
            Some("write") => Op::Write,
            Some("read") => Op::Read,
            Some("send") => Op::Send,
            Some("atomic") => Op::Atomic,
            _ => panic!("not a perftest tool: {tool}"),
        };
        // Bandwidth rows run the matrix row's iterations, so that perftest's figure and
        // `roce perf`'s of the same size compare; latency rows 200 (1000 when full).
        let iters = if lat {
            if rxe::full() { 1000 } else { 200 }
        } else {
            iters(op, size)
        };
        Self {
            tool,
            op,
            lat,
            conn,
            size: if matches!(op, Op::Atomic) { 8 } else { size },
            qps,
            iters,
        }
    }

    /// perftest's arguments but the device, GID, port, path MTU and server address (both
    /// sides).
    fn args(&self) -> String {
        let mut a = format!("-n {}", self.iters);
        if !matches!(self.op, Op::Atomic) {
            let _ = write!(a, " -s {}", self.size);
        }
        if self.qps > 1 {
            let _ = write!(a, " -q {}", self.qps);
        }
        if self.conn != "RC" {
            let _ = write!(a, " -c {}", self.conn);
        }
        // perftest's client of READ and atomics sets `max_rd_atomic` to the server's announced
        // outstanding reads (`ctx_modify_qp_to_rts`), and each side announces its device's
        // `max_qp_rd_atom` unless told: rxe's 128 is more than the library's device takes (the
        // engine's limit, `DeviceConfig::max_qp_rd_atom`), and the modify to RTS is refused
        // with EINVAL, as rxe refuses a value above its own (`rxe_qp_chk_attr`). Both sides
        // announce the library's limit (`-o`), which rxe takes.
        if matches!(self.op, Op::Read | Op::Atomic) {
            let _ = write!(
                a,
                " -o {}",
                roce::transport::DeviceConfig::default().max_qp_rd_atom
            );
        }
        a
    }

    fn name(&self, guest_server: bool) -> String {
        format!(
            "dropin-{}-{}server_{}-s{}-q{}",
            self.tool,
            if self.conn == "RC" {
                String::new()
            } else {
                format!("{}-", self.conn)
            },
            if guest_server { "rxe" } else { "roce" },
            self.size,
            self.qps
        )
    }

    /// The iterations perftest's client reports: bandwidth rows count every QP's.
    fn want(&self) -> u64 {
        u64::from(self.iters) * if self.lat { 1 } else { u64::from(self.qps) }
    }
}

/// The drop-in rows: CI's subset, or every tool, QP count, size and transport perftest offers
/// (`ROCE_INTEROP_FULL=1`).
fn drop_cases() -> Vec<DropCase> {
    let mut v = vec![
        DropCase::new("ib_write_bw", "RC", 65536, 1),
        DropCase::new("ib_read_bw", "RC", 65536, 1),
        DropCase::new("ib_send_bw", "RC", 65536, 1),
        DropCase::new("ib_atomic_bw", "RC", 8, 1),
        DropCase::new("ib_write_bw", "RC", 65536, 4),
        DropCase::new("ib_write_lat", "RC", 2, 1),
        DropCase::new("ib_send_lat", "RC", 2, 1),
    ];
    if rxe::full() {
        for tool in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
            for size in [2, 4096, 1 << 20] {
                v.push(DropCase::new(tool, "RC", size, 1));
            }
            if tool != "ib_write_bw" {
                v.push(DropCase::new(tool, "RC", 65536, 4));
            }
        }
        v.push(DropCase::new("ib_atomic_bw", "RC", 8, 4));
        v.push(DropCase::new("ib_write_lat", "RC", 4096, 1));
        v.push(DropCase::new("ib_send_lat", "RC", 4096, 1));
        for tool in ["ib_read_lat", "ib_atomic_lat"] {
            v.push(DropCase::new(tool, "RC", 2, 1));
        }
        v.push(DropCase::new("ib_read_lat", "RC", 4096, 1));
        v.push(DropCase::new("ib_write_bw", "UC", 65536, 1));
        v.push(DropCase::new("ib_send_bw", "UC", 65536, 1));
        v.push(DropCase::new("ib_write_lat", "UC", 2, 1));
        v.push(DropCase::new("ib_send_lat", "UC", 2, 1));
        // UD messages fit in one packet of the path MTU.
        v.push(DropCase::new("ib_send_bw", "UD", 1024, 1));
        v.push(DropCase::new("ib_send_lat", "UD", 1024, 1));
    }
    v
}

/// A drop-in row's outcome, with the `roce perf` figure it is shown beside.
struct DropRow {
    case: DropCase,
    server: &'static str,
    report: SceneReport,
    /// `roce perf --lat` against the same guest tool, size and direction (write and send
    /// latency over RC only); its p50 µs is the figure shown.
    roce_lat: Option<SceneReport>,
}

/// Checks a perftest output of a drop-in row: the client's result line must parse with the
/// iterations asked for and a nonzero figure; the server's, where it prints one (the latency
/// servers of READ and atomics print none), a nonzero one.
fn check_perftest(case: &DropCase, who: &str, out: &str, client: bool, failures: &mut Vec<String>) {
    match perftest_result(out) {
        Some((_, it, fig, chk)) if chk > 0.0 && fig >= 0.0 && (!client || it == case.want()) => {}
        None if !client => {}
        other => failures.push(format!(
            "{who} perftest ({}) result {other:?}, want {} iterations and a nonzero figure: {}",
            if client { "client" } else { "server" },
            case.want(),
            out.lines().rev().take(6).collect::<Vec<_>>().join(" / ")
        )),
    }
}

/// Runs Debian's perftest `case` on our side through `roce exec` against rxe's in the guest,
/// in one direction, on `port` (and, for ib_write_lat / ib_send_lat over RC, `roce perf --lat`
/// on the next port); checks both sides' results on top of the harness's checks.
fn drop_in(
    h: &Harness<'_>,
    case: &DropCase,
    gid: &str,
    guest_server: bool,
    port: &mut u16,
) -> DropRow {
    let p = h.peer;
    *port += 1;
    let args = case.args();
    let mut ours: Vec<String> = ["exec", "-d", &p.ifname, "--", case.tool, "-d"]
        .map(String::from)
        .to_vec();
    ours.push(format!("roce_{}", p.ifname));
    // The guest's command line (`rxe::perftest_cmd`) sets path MTU 1024 and -F too.
    ours.extend(["-x", gid, "-F", "-m", "1024", "-p", &port.to_string()].map(String::from));
    ours.extend(args.split_whitespace().map(String::from));
    let guest = rxe::perftest_cmd(case.tool, *port, &args);
    let roles = if guest_server {
        ours.push(p.guest_ip.to_string());
        Roles::GuestServer { guest, ours }
    } else {
        Roles::OurServer {
            ours,
            guest: format!("{guest} {}", p.host_ip),
        }
    };
    let mut report = h.run(&case.name(guest_server), &roles, *port);
    let text = report
        .ours
        .as_ref()
        .ok()
        .and_then(|v| v["exec_stdout"].as_str().map(str::to_owned));
    let mut failures = Vec::new();
    if let Some(text) = &text {
        check_perftest(case, "our", text, guest_server, &mut failures);
    }
    check_perftest(
        case,
        "rxe's",
        &report.guest.out,
        !guest_server,
        &mut failures,
    );
    report.failures.extend(failures);
    let roce_lat =
        (case.lat && case.conn == "RC" && matches!(case.op, Op::Write | Op::Send)).then(|| {
            *port += 1;
            let n = case.iters.to_string();
            let size = case.size.to_string();
            let mut ours: Vec<String> = [
                "perf",
                case.op.name(),
                "--lat",
                "-d",
                &p.ifname,
                "-p",
                &port.to_string(),
                "-s",
                &size,
                "-n",
                &n,
                "-m",
                "1024",
                "--no-verify",
            ]
            .map(String::from)
            .to_vec();
            let guest = rxe::perftest_cmd(case.tool, *port, &format!("-s {size} -n {n}"));
            let roles = if guest_server {
                ours.push(p.guest_ip.to_string());
                Roles::GuestServer { guest, ours }
            } else {
                Roles::OurServer {
                    ours,
                    guest: format!("{guest} {}", p.host_ip),
                }
            };
            let mut r = h.run(
                &format!(
                    "perf-lat-{}-server_{}-s{size}",
                    case.tool,
                    if guest_server { "rxe" } else { "roce" }
                ),
                &roles,
                *port,
            );
            if let Ok(v) = &r.ours
                && (v["messages"].as_u64() != Some(u64::from(case.iters))
                    || !v["latency_us"]["p50"].as_f64().is_some_and(|x| x > 0.0))
            {
                r.failures.push(format!("roce perf --lat said {v}"));
            }
            r
        });
    DropRow {
        case: case.clone(),
        server: if guest_server { "rxe" } else { "roce" },
        report,
        roce_lat,
    }
}

/// The drop-in rows: perftest's figure on each side, next to `roce perf`'s of the same tool,
/// size, QPs and direction in this run (the matrix row, or the `--lat` scenario).
fn drop_table(drops: &[DropRow], rows: &[Row]) -> String {
    let mut s = String::from(
        "| perftest on the drop-in library | conn | server | client | QPs | size | iters | result | perftest ours | perftest rxe | roce perf | unit | packets | secs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let fmt = |x: Option<f64>| x.map_or("-".into(), |b| format!("{b:.2}"));
    for d in drops {
        let c = &d.case;
        let ours = d
            .report
            .ours
            .as_ref()
            .ok()
            .and_then(|v| v["exec_stdout"].as_str())
            .and_then(perftest_result)
            .map(|x| x.2);
        let theirs = perftest_result(&d.report.guest.out).map(|x| x.2);
        let roce = if c.lat {
            d.roce_lat.as_ref().and_then(|r| {
                r.ours
                    .as_ref()
                    .ok()
                    .and_then(|v| v["latency_us"]["p50"].as_f64())
            })
        } else if c.conn == "RC" {
            rows.iter()
                .find(|r| {
                    r.op.name() == c.op.name()
                        && r.size == c.size
                        && r.qps == c.qps
                        && r.server == d.server
                })
                .and_then(|r| r.report.ours.as_ref().ok())
                .and_then(|v| v["bw_mb_per_sec"].as_f64())
        } else {
            None
        };
        let mut fails = d.report.failures.clone();
        if let Some(r) = &d.roce_lat {
            fails.extend(r.failures.iter().map(|f| format!("roce perf --lat: {f}")));
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
            c.tool,
            c.conn,
            d.server,
            if d.server == "rxe" { "roce" } else { "rxe" },
            c.qps,
            c.size,
            c.iters,
            if fails.is_empty() {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", fails.join("; ").replace('|', "/"))
            },
            fmt(ours),
            fmt(theirs),
            fmt(roce),
            if c.lat {
                "t_typical µs (roce perf: p50)"
            } else {
                "MB/s"
            },
            d.report.icrc.good,
            d.report.secs + d.roce_lat.as_ref().map_or(0.0, |r| r.secs),
        );
    }
    s
}

fn write(path: &Path, text: &str) {
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let _ = std::fs::write(path, text);
}

// The whole matrix in one VM boot. `ROCE_INTEROP_ONLY=a,b` runs only the scenarios whose name
// contains a or b, e.g. `ROCE_INTEROP_ONLY=ib_read_bw-server_rxe-s1048576-q4` for the one that
// used to stall (fixed, docs/interop.md). Part of CI: the 2-byte scenarios' tshark failure was tshark's
// EtherType guess on random perftest data (docs/interop.md), which the checker now recognises.
#[test]
fn perftest_bandwidth_both_directions() {
    require_root();
    let started = Instant::now();
    let peer = Peer::boot(&tag("pf"), 63, &PeerOptions::default());
    let mut h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    h.timeout *= perftest_matrix::scale();
    let mut rows = Vec::new();
    let mut port = 19300;
    // ROCE_INTEROP_ONLY=a,b runs only the scenarios whose name contains a or b (debugging).
    let only = perftest_matrix::only("ROCE_INTEROP_ONLY");
    for (op, size, qps, guest_server) in perftest_matrix::rows() {
        port += 1;
        if !perftest_matrix::chosen(
            &only,
            &perftest_matrix::row_name(op, size, qps, guest_server),
        ) {
            continue;
        }
        rows.push(scenario(&h, op, size, qps, guest_server, port));
    }
    // Our side offering the multipath extension (issue 19): rxe ignores the reserved BTH bit,
    // so the same tools run as plain RoCE v2 (these rows share the references above).
    for (op, size, guest_server) in [
        (Op::Write, 65536, true),
        (Op::Write, 65536, false),
        (Op::Read, 65536, true),
        (Op::Send, 65536, false),
        (Op::Atomic, 8, true),
    ] {
        port += 1;
        let name = format!("-multipath {}", op.name());
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        rows.push(scenario_with(&h, (op, size, 1), guest_server, port, true));
    }
    // READ responses clocked by probes (issue 20, `loss_backoff`, on in `--cc-profile
    // software`, the profile for peers like this one): roce-xdp the responder of perftest's
    // 4 × 8 READs of 1 MiB, all posted at once, which with the default CC overran the guest's
    // tap queue (21,779-33,380 of about 32,800 frames dropped per run on Dec 6,
    // BENCHMARKS.md).
    if perftest_matrix::chosen(&only, "software") {
        port += 1;
        let extra = ["--cc-profile".to_owned(), "software".to_owned()];
        let mut row =
            perftest_matrix::scenario_args(&h, (Op::Read, 1 << 20, 4), false, port, false, &extra);
        check_read_clock(&peer, &mut row);
        rows.push(row);
    }
    let matrix_secs = started.elapsed().as_secs_f64();
    // Debian's perftest on our side, on the drop-in library, against rxe's: both directions.
    let t = Instant::now();
    let gids: Vec<serde_json::Value> = serde_json::from_str(&roce_tests::roce_ok(&[
        "--netns",
        &peer.netns,
        "-j",
        "gids",
        "-i",
        &peer.ifname,
    ]))
    .expect("gids JSON");
    let gid = gids
        .iter()
        .find(|g| g["ip"].as_str() == Some(&peer.host_ip.to_string()))
        .map(|g| g["index"].to_string())
        .expect("an IPv4 GID on our side");
    let mut drops = Vec::new();
    let mut port = 19400;
    for case in drop_cases() {
        for guest_server in [true, false] {
            let name = case.name(guest_server);
            if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
                continue;
            }
            drops.push(drop_in(&h, &case, &gid, guest_server, &mut port));
        }
    }
    let drop_secs = t.elapsed().as_secs_f64();
    // rxe ↔ rxe, every row's tool, size, QP count and direction, in the same run: a second VM
    // beside the first in our place (ours is idle by now, its XDP program still on the
    // bridge's other port).
    let t = Instant::now();
    let mut reference = References::new();
    // (Only drop-in rows, when ROCE_INTEROP_ONLY chose them: nothing to compare with rxe ↔ rxe.)
    if !rows.is_empty() {
        let second = Peer::boot_beside(&peer, &PeerOptions::default());
        let mut port = 19500;
        for r in &rows {
            reference.entry(r.reference_key()).or_insert_with(|| {
                rxe_reference(
                    &peer,
                    &second,
                    (r.op, r.size, r.qps),
                    r.guest_server(),
                    &mut port,
                )
            });
        }
    }
    drop(h);
    drop(peer);
    let mut text = table(&rows, &reference);
    text.push('\n');
    text.push_str(&drop_table(&drops, &rows));
    let _ = writeln!(
        text,
        "\nmatrix {matrix_secs:.0} s ({} scenarios, one VM boot), perftest on the drop-in library {drop_secs:.0} s ({} scenarios, same boot), rxe↔rxe references {:.0} s ({} runs, a second VM)",
        rows.len(),
        drops.len(),
        t.elapsed().as_secs_f64(),
        reference.len(),
    );
    for (k, v) in &reference {
        if let Err(e) = v {
            let _ = writeln!(
                text,
                "\nrxe↔rxe {k:?} failed twice: {}",
                e.replace('\n', " / ")
            );
        }
    }
    println!("{text}");
    write(&rxe::out_dir().join("perftest-matrix.md"), &text);
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.report.ok()).collect();
    let mut detail = String::new();
    for r in &failed {
        let _ = writeln!(
            detail,
            "{}: {:?}\n  rxe {:?}\n  ours {:?}\n  path {:?}\n  guest: {}",
            r.report.name,
            r.report.failures,
            r.report.rxe,
            r.report.ours_ctr,
            r.report.other,
            r.report
                .guest
                .out
                .lines()
                .rev()
                .take(6)
                .collect::<Vec<_>>()
                .join(" / ")
        );
    }
    for d in &drops {
        for r in std::iter::once(&d.report).chain(&d.roce_lat) {
            if !r.ok() {
                let _ = writeln!(
                    detail,
                    "{}: {:?}\n  rxe {:?}\n  ours {:?}\n  path {:?}\n  ours said: {}\n  guest: {}",
                    r.name,
                    r.failures,
                    r.rxe,
                    r.ours_ctr,
                    r.other,
                    r.ours.as_ref().map_or_else(Clone::clone, |v| v.to_string()),
                    r.guest
                        .out
                        .lines()
                        .rev()
                        .take(6)
                        .collect::<Vec<_>>()
                        .join(" / ")
                );
            }
        }
    }
    let drops_ok = drops
        .iter()
        .all(|d| d.report.ok() && d.roce_lat.as_ref().is_none_or(SceneReport::ok));
    assert!(
        failed.is_empty() && drops_ok,
        "perftest interop failures:\n{text}\n{detail}"
    );
    rxe::assert_references(&reference, |k| k.0.to_owned());
}

#[test]
fn drop_in_cases_and_perftest_results_parse() {
    let c = DropCase::new("ib_write_bw", "RC", 65536, 4);
    assert!(matches!(c.op, Op::Write) && !c.lat && c.size == 65536);
    assert_eq!(c.name(true), "dropin-ib_write_bw-server_rxe-s65536-q4");
    assert!(c.args().contains("-s 65536") && c.args().contains("-q 4"));
    let c = DropCase::new("ib_atomic_lat", "RC", 2, 1);
    assert!(matches!(c.op, Op::Atomic) && c.lat && c.size == 8 && !c.args().contains("-s"));
    let c = DropCase::new("ib_send_bw", "UD", 1024, 1);
    assert!(matches!(c.op, Op::Send) && c.args().ends_with("-c UD"));
    assert_eq!(c.name(false), "dropin-ib_send_bw-UD-server_roce-s1024-q1");
    let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      200              39.05              15.74  \t\t   0.000252\n";
    assert_eq!(perftest_result(bw), Some((65536, 200, 15.74, 0.000252)));
    let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 2       200          72.51          52564.34      1974.82  \t       2383.95\n";
    assert_eq!(perftest_result(lat), Some((2, 200, 1974.82, 1974.82)));
    assert_eq!(perftest_result("no table\n"), None);
}
