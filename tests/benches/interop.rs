//! `cargo xtask bench interop`: roce-xdp against Linux Soft-RoCE in a VM, each figure next to
//! rxe ↔ rxe measured in the same run (a second Soft-RoCE VM booted beside the first on the same
//! bridge, `Peer::boot_beside`, at the start, and idle while roce-xdp runs, so that both kinds
//! of run see the same host). Needs root, the rxe-peer image (`$RXE_PEER_DIR/rootfs.img`, see
//! docs/interop.md) and the release `roce` binary (xtask builds it; or set ROCE_BIN). xtask
//! runs it only when the peer is available.
//!
//! Two parts, chosen with `ROCE_BENCH_INTEROP=write|matrix|all` (default `all`):
//! - `write` (about 3 minutes): ib_write_bw from the VM to roce-xdp, 64 KiB messages, 1 QP,
//!   500 iterations, the median of three runs against the median of three rxe ↔ rxe runs.
//! - `matrix` (issue 20; about 25 minutes on this project's 2-core VM): every row of
//!   `interop_perftest.rs`'s perftest matrix (ib_write_bw, ib_read_bw, ib_send_bw,
//!   ib_atomic_bw; 2 B, 4 KiB, 64 KiB, 1 MiB; 1 and 4 QPs; both directions: 52 rows, the CI
//!   test's iterations), each run three times (the three passes over the matrix taking turns,
//!   so a change in the machine's load hits every row alike), against three rxe ↔ rxe runs of
//!   the same tool, size and QP count with the second VM in roce-xdp's place and the guest in
//!   its role (the guest's own result in both, `perftest_matrix::rxe_reference`), each right
//!   after the row's roce-xdp run: a TCG guest's pace drifts between runs minutes apart (the
//!   same row's references moved from 6.8 to 11.3 MB/s between two bench runs). The ratio
//!   is the median message rate's (perftest's own figure on the perftest side; 2-byte
//!   messages round to 0.00 MB/s), the target ≥ 1.0x. Each row also shows the drops counted on the guest's tap on its way into the guest
//!   (`tx_dropped`: what a receiver that cannot keep up costs), the retransmissions each side
//!   saw, and the congestion control `roce perf` ran: its default (DCQCN, `mlx5` profile), or
//!   the arguments in `ROCE_BENCH_INTEROP_CC` (e.g. `--cc swift --cc-profile software`).
//!   `ROCE_BENCH_INTEROP_ONLY=a,b` keeps the rows whose name contains a or b,
//!   `ROCE_INTEROP_SCALE=N` runs N times the iterations on both sides (longer runs, steadier
//!   medians; `perftest_matrix::scale`), and `ROCE_BENCH_CAPTURE=1` captures each run
//!   (`target/interop/bench-pcap/`, the last pass's).
//!
//! All figures are perftest's own (the perftest side's `BW average` and message rate), path MTU
//! 1024. Under TCG the guest's CPU bounds both, so a ratio says whether roce-xdp is the
//! bottleneck, not how the two would compare on hardware.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration, time::Instant};

use roce_tests::{
    perftest_matrix::{self, Op},
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roce, StepOut, wait_host_listen},
};
use serde_json::json;

const REPS: usize = 3;
const SIZE: u32 = 65536;
const ITERS: u32 = 500;

/// (median, min, max) of `v`; NaN for an empty `v`.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn median_i(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The guest's ib_write_bw of the `write` part (a client adds the server's address).
fn write_tool(port: u16) -> String {
    rxe::perftest_cmd("ib_write_bw", port, &format!("-s {SIZE} -n {ITERS}"))
}

/// The `write` part's roce-xdp runs: the VM's ib_write_bw to `roce perf write`, MB/s.
fn write_ours(peer: &Peer) -> Vec<f64> {
    let mut ours = Vec::new();
    for rep in 0..REPS {
        let port = 19600 + rep as u16;
        let server = Roce::spawn(
            &peer.netns,
            &[
                "perf",
                "write",
                "-d",
                &peer.ifname,
                "-p",
                &port.to_string(),
                "-s",
                &SIZE.to_string(),
                "-n",
                &ITERS.to_string(),
                "-m",
                "1024",
                "--no-verify",
            ]
            .map(String::from),
        );
        wait_host_listen(&peer.netns, port, Duration::from_secs(30));
        let g = peer
            .spawn(&format!("{} {}", write_tool(port), peer.host_ip))
            .wait_timeout(Duration::from_secs(120))
            .unwrap_or(StepOut {
                rc: -1,
                out: "(timeout)".into(),
            });
        let s = server.wait(Duration::from_secs(30));
        let bw = rxe::perftest_bw_line(&g.out).map(|x| x.3);
        assert!(
            g.rc == 0 && s.is_ok() && bw.is_some(),
            "ib_write_bw rxe -> roce failed (rc {}): {}\nroce: {s:?}",
            g.rc,
            g.out
        );
        ours.extend(bw);
    }
    ours
}

/// The `write` part's row, against rxe ↔ rxe runs between `second` and `peer`.
fn write_row(peer: &Peer, second: &Peer, ours: Vec<f64>, text: &mut String) -> serde_json::Value {
    let mut theirs = Vec::new();
    for rep in 0..REPS {
        let port = 19650 + rep as u16;
        let out = rxe::rxe_pair(
            second,
            peer,
            &write_tool(port),
            port,
            Duration::from_secs(120),
        )
        .unwrap_or_else(|e| panic!("rxe ↔ rxe reference: {e}"));
        let bw = rxe::perftest_bw_line(&out.out).map(|x| x.3);
        theirs.push(bw.unwrap_or_else(|| panic!("rxe ↔ rxe: no result line: {}", out.out)));
    }
    let ((om, omin, omax), (tm, tmin, tmax)) = (stats(ours), stats(theirs));
    let ratio = om / tm.max(1e-9);
    let _ = writeln!(
        text,
        "| ib_write_bw {SIZE} B, rxe VM -> roce-xdp vs rxe VM -> rxe VM, MB/s | {om:.2} ({omin:.2}..{omax:.2}) | {tm:.2} ({tmin:.2}..{tmax:.2}) | {ratio:.2}x | ≥ 1.0x{} |",
        if ratio >= 1.0 { " (met)" } else { " (NOT met)" }
    );
    let _ = writeln!(
        text,
        "(median of {REPS}; path MTU 1024, 1 QP, {ITERS} iterations, perftest's BW average)\n"
    );
    json!({
        "name": format!("ib_write_bw {SIZE} B rxe VM -> roce-xdp (baseline: rxe VM -> rxe VM)"),
        "value": om, "unit": "MB/s", "baseline": tm, "ratio": ratio, "target": "≥ 1.0x",
        "min": omin, "max": omax, "baseline_min": tmin, "baseline_max": tmax,
    })
}

/// One matrix row's runs against roce-xdp.
struct MatrixRow {
    op: Op,
    size: u32,
    qps: u32,
    guest_server: bool,
    /// perftest's BW average, MB/s, of each run whose result line counted every iteration.
    bw: Vec<f64>,
    /// perftest's message rate, Mpps, of the same runs.
    rate: Vec<f64>,
    /// Drops on the guest's tap, into the guest, per run.
    tap_drops: Vec<i64>,
    /// Requests the guest's rxe saw twice (roce-xdp resent them), per run: its
    /// `duplicate_request` less the READ clock's probes, duplicates by design.
    rxe_dup: Vec<i64>,
    /// Requests roce-xdp saw twice (rxe resent them), per run.
    ours_dup: Vec<i64>,
    /// The CC's rate cuts for losses, those of them undone because their timeout proved
    /// spurious, and the cuts for CNPs (`rp_loss_handled`, `rp_loss_undone`,
    /// `rp_cnp_handled` summed over roce-xdp's QPs), per run.
    cuts: Vec<(u64, u64, u64)>,
    /// Why runs failed, if any did.
    failures: Vec<String>,
}

impl MatrixRow {
    fn name(&self) -> String {
        perftest_matrix::row_name(self.op, self.size, self.qps, self.guest_server)
    }

    /// The key of this row's rxe ↔ rxe runs: the second VM in our place, the guest in its role.
    fn key(&self) -> perftest_matrix::RowKey {
        perftest_matrix::reference_key(self.op, self.size, self.qps, self.guest_server)
    }
}

/// rxe ↔ rxe runs of one row's tool, size, QP count and direction: BW averages (MB/s),
/// message rates (Mpps), and why the runs that failed twice failed.
type Refs = (Vec<f64>, Vec<f64>, Vec<String>);

/// What the `matrix` part measured: each row's roce-xdp runs, its rxe ↔ rxe references, and
/// the seconds the two kinds of runs took.
struct Matrix {
    rows: Vec<MatrixRow>,
    refs: BTreeMap<perftest_matrix::RowKey, Refs>,
    ours_secs: f64,
    refs_secs: f64,
}

/// The `matrix` part's runs: [`REPS`] passes over the chosen rows, `extra` added to every
/// `roce perf` command line. Each row's roce-xdp run is followed at once by its rxe ↔ rxe run
/// between `peer` and `second` (the second VM in our place, the guest in its role), so that a
/// change in the guest's or the host's pace hits a row and its reference alike. `second` stays
/// up, idle, while roce-xdp runs: the host is the same for both kinds of run.
fn matrix_runs(peer: &Peer, second: &Peer, only: &[String], extra: &[String]) -> Matrix {
    let mut h = Harness::new(peer, &rxe::out_dir().join("bench-pcap"));
    h.capture = std::env::var_os("ROCE_BENCH_CAPTURE").is_some();
    h.timeout *= perftest_matrix::scale();
    let mut rows: Vec<MatrixRow> = perftest_matrix::rows()
        .into_iter()
        .filter(|&(op, size, qps, gs)| {
            perftest_matrix::chosen(only, &perftest_matrix::row_name(op, size, qps, gs))
        })
        .map(|(op, size, qps, guest_server)| MatrixRow {
            op,
            size,
            qps,
            guest_server,
            bw: Vec::new(),
            rate: Vec::new(),
            tap_drops: Vec::new(),
            rxe_dup: Vec::new(),
            ours_dup: Vec::new(),
            cuts: Vec::new(),
            failures: Vec::new(),
        })
        .collect();
    let mut refs: BTreeMap<perftest_matrix::RowKey, Refs> = BTreeMap::new();
    let (mut ours_secs, mut refs_secs) = (0.0, 0.0);
    let tap_key = format!("link.{}.tx_dropped", peer.tap);
    let (mut port, mut ref_port) = (19700, 19900);
    for pass in 0..REPS {
        for r in &mut rows {
            port += 1;
            let t = Instant::now();
            let row = perftest_matrix::scenario_args(
                &h,
                (r.op, r.size, r.qps),
                r.guest_server,
                port,
                false,
                extra,
            );
            ours_secs += t.elapsed().as_secs_f64();
            let rep = &row.report;
            eprintln!(
                "interop matrix pass {} {}: {}",
                pass + 1,
                r.name(),
                if rep.ok() { "ok" } else { "FAILED" }
            );
            let want = u64::from(perftest_matrix::iters(r.op, r.size)) * u64::from(r.qps);
            match rxe::perftest_bw_line(&rep.guest.out) {
                Some((_, it, _, bw, rate)) if it == want => {
                    r.bw.push(bw);
                    r.rate.push(rate);
                }
                _ => {}
            }
            r.tap_drops
                .push(rep.other.get(&tap_key).copied().unwrap_or(0));
            r.rxe_dup.push(perftest_matrix::rxe_dups_less_probes(rep));
            r.ours_dup
                .push(rep.ours_ctr.get("duplicate_request").copied().unwrap_or(0));
            r.cuts.push(rep.ours.as_ref().map_or((0, 0, 0), |v| {
                (
                    perftest_matrix::cc_sum(v, "rp_loss_handled"),
                    perftest_matrix::cc_sum(v, "rp_loss_undone"),
                    perftest_matrix::cc_sum(v, "rp_cnp_handled"),
                )
            }));
            if !rep.ok() {
                r.failures
                    .push(format!("pass {}: {}", pass + 1, rep.failures.join("; ")));
            }
            // The reference of the same row, right after it.
            let t = Instant::now();
            let e = refs.entry(r.key()).or_default();
            match perftest_matrix::rxe_reference(
                peer,
                second,
                (r.op, r.size, r.qps),
                r.guest_server,
                &mut ref_port,
            ) {
                Ok((bw, rate)) => {
                    e.0.push(bw);
                    e.1.push(rate);
                }
                Err(err) => e.2.push(err),
            }
            refs_secs += t.elapsed().as_secs_f64();
        }
    }
    Matrix {
        rows,
        refs,
        ours_secs,
        refs_secs,
    }
}

/// The `matrix` part's table and rows: each row against its rxe ↔ rxe references.
fn matrix_table(m: Matrix, cc: &str, text: &mut String) -> Vec<serde_json::Value> {
    let Matrix {
        rows,
        refs,
        ours_secs,
        refs_secs,
    } = m;
    let _ = writeln!(
        text,
        "| row | CC | perftest MB/s, roce-xdp side (min..max) | rxe↔rxe MB/s (min..max) | ratio (message rate) | target | tap drops into the guest | CC cuts for loss, undone, for CNP | resent by roce / by rxe | runs failed |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut json_rows = Vec::new();
    let (mut met, mut measured) = (0, 0);
    for r in rows {
        let name = r.name();
        let (rb, rate_ref, errs) = refs.get(&r.key()).cloned().unwrap_or_default();
        let ((om, omin, omax), (orate, _, _)) = (stats(r.bw.clone()), stats(r.rate.clone()));
        let ((tm, tmin, tmax), (trate, _, _)) = (stats(rb), stats(rate_ref));
        let ratio = orate / trate;
        let verdict = if ratio.is_nan() {
            " (not measured)"
        } else if ratio >= 1.0 {
            met += 1;
            measured += 1;
            " (met)"
        } else {
            measured += 1;
            " (NOT met)"
        };
        let _ = writeln!(
            text,
            "| {name} | {cc} | {om:.2} ({omin:.2}..{omax:.2}) | {tm:.2} ({tmin:.2}..{tmax:.2}) | {ratio:.2}x | ≥ 1.0x{verdict} | {:?} | {:?} | {}/{} | {}{} |",
            r.tap_drops,
            r.cuts,
            median_i(r.rxe_dup.clone()),
            median_i(r.ours_dup.clone()),
            r.failures.len(),
            if errs.is_empty() {
                String::new()
            } else {
                format!(" (rxe↔rxe failed {}x)", errs.len())
            },
        );
        for f in &r.failures {
            eprintln!("interop matrix {name}: {f}");
        }
        for e in &errs {
            eprintln!("interop matrix rxe↔rxe {name}: {}", e.replace('\n', " / "));
        }
        json_rows.push(json!({
            "name": format!("perftest {name}, roce-xdp (baseline: rxe VM <-> rxe VM), message rate"),
            "value": orate, "unit": "Mpps", "baseline": trate, "ratio": ratio,
            "target": "≥ 1.0x", "bw_mb_per_sec": om, "min": omin, "max": omax,
            "baseline_bw_mb_per_sec": tm, "cc": cc, "tap_tx_dropped": r.tap_drops,
            "cc_cuts_loss_undone_cnp": r.cuts, "resent_by_roce": r.rxe_dup, "resent_by_rxe": r.ours_dup,
            "failed_runs": r.failures.len(),
        }));
    }
    let _ = writeln!(
        text,
        "({met} of {measured} rows at or above rxe↔rxe; median of {REPS} runs per row and of {REPS} rxe↔rxe runs per row, each right after its row's run, the second VM in our place and idle during ours; path MTU 1024; iterations {}x the CI matrix's, {}; roce-xdp runs {ours_secs:.0} s, rxe↔rxe runs {refs_secs:.0} s)",
        perftest_matrix::scale(),
        perftest_matrix::SCALE_ENV
    );
    json_rows
}

fn main() {
    require_root();
    // The endpoint under test: xtask points ROCE_BIN at the release build.
    let _ = roce_tests::roce_bin();
    let mode = std::env::var("ROCE_BENCH_INTEROP").unwrap_or_else(|_| "all".into());
    let (write, matrix) = match mode.as_str() {
        "write" => (true, false),
        "matrix" => (false, true),
        "all" => (true, true),
        other => panic!("ROCE_BENCH_INTEROP={other}: want write, matrix or all"),
    };
    let only = perftest_matrix::only("ROCE_BENCH_INTEROP_ONLY");
    let cc_args: Vec<String> = std::env::var("ROCE_BENCH_INTEROP_CC")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let cc = if cc_args.is_empty() {
        "dcqcn (mlx5 profile; roce perf's default)".to_owned()
    } else {
        cc_args.join(" ")
    };
    let started = Instant::now();
    let peer = Peer::boot(&roce_tests::tag("bi"), 66, &PeerOptions::default());
    let second = Peer::boot_beside(&peer, &PeerOptions::default());
    let mut text = String::new();
    let mut rows = Vec::new();
    if write {
        let ours = write_ours(&peer);
        rows.push(write_row(&peer, &second, ours, &mut text));
    }
    if matrix {
        let m = matrix_runs(&peer, &second, &only, &cc_args);
        rows.extend(matrix_table(m, &cc, &mut text));
    }
    drop(second);
    drop(peer);
    let _ = writeln!(
        text,
        "(everything {:.0} s, the two VM boots included)",
        started.elapsed().as_secs_f64()
    );
    print!("{text}");
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        std::fs::write(
            std::path::Path::new(&dir).join("interop.json"),
            serde_json::to_string_pretty(&rows).unwrap(),
        )
        .unwrap();
    }
}
