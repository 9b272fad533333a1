//! The perftest matrix against Linux Soft-RoCE, shared by `tests/tests/interop_perftest.rs`
//! (one run per row, every frame checked) and `cargo xtask bench interop` (the median of three
//! runs per row against the median of three rxe ↔ rxe references): the operations, sizes,
//! QP counts and iterations of each row, the `roce perf` and perftest command lines, one run of
//! a row through [`Harness::run`], and the rxe ↔ rxe reference of a row.

use std::{collections::BTreeMap, time::Duration};

use crate::rxe::{self, Harness, Peer, Roles, SceneReport};

/// The operation of a row: its perftest tool is `ib_<name>_bw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND.
    Send,
    /// Fetch-and-add / compare-and-swap (8 bytes).
    Atomic,
}

impl Op {
    /// `write`, `read`, `send` or `atomic`: `roce perf`'s subcommand and perftest's tool infix.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
            Self::Send => "send",
            Self::Atomic => "atomic",
        }
    }
}

/// Iterations per QP of a row (see the module docs of `interop_perftest.rs`; 1000 with
/// `ROCE_INTEROP_FULL=1`), times [`scale`].
#[must_use]
pub fn iters(op: Op, size: u32) -> u32 {
    let base = if rxe::full() {
        1000
    } else {
        match (op, size) {
            (Op::Atomic, _) => 500,
            (_, 0..=4096) => 1000,
            (_, 4097..=65536) => 200,
            _ => 8,
        }
    };
    base * scale()
}

/// The variable that multiplies every row's iterations ([`scale`]).
pub const SCALE_ENV: &str = "ROCE_INTEROP_SCALE";

/// `ROCE_INTEROP_SCALE=N` (1 to 100, default 1): every row runs N times its iterations, on
/// both sides and in the rxe ↔ rxe references alike. Longer runs average out the pauses of
/// a TCG guest (10-25 ms at a time) that move a row of a second or two by tens of percent.
///
/// # Panics
/// On any other value, naming the variable.
#[must_use]
pub fn scale() -> u32 {
    parse_scale(std::env::var(SCALE_ENV).ok().as_deref()).unwrap_or_else(|e| panic!("{e}"))
}

/// [`scale`]'s reading of the variable's value (`None` when unset).
///
/// # Errors
/// Anything but empty or a whole number from 1 to 100, naming [`SCALE_ENV`].
pub fn parse_scale(value: Option<&str>) -> Result<u32, String> {
    match value {
        None | Some("") => Ok(1),
        Some(v) => match v.parse::<u32>() {
            Ok(n @ 1..=100) => Ok(n),
            _ => Err(format!(
                "{SCALE_ENV}={v}: want a whole number from 1 to 100"
            )),
        },
    }
}

/// One run of a row.
pub struct Row {
    /// The operation.
    pub op: Op,
    /// Message size (8 for atomics).
    pub size: u32,
    /// QPs.
    pub qps: u32,
    /// `rxe` or `roce`: which side was the server.
    pub server: &'static str,
    /// What the run showed.
    pub report: SceneReport,
}

impl Row {
    /// Whether the guest was the server (the key of its rxe ↔ rxe [`References`]).
    #[must_use]
    pub fn guest_server(&self) -> bool {
        self.server == "rxe"
    }

    /// This row's key in [`References`].
    #[must_use]
    pub fn reference_key(&self) -> RowKey {
        reference_key(self.op, self.size, self.qps, self.guest_server())
    }
}

/// The key of a row's rxe ↔ rxe references: (operation, size, QPs, whether the guest is the
/// server). The direction is part of it because the reference keeps the guest in its role
/// ([`rxe_reference`]).
pub type RowKey = (&'static str, u32, u32, bool);

/// A row's [`RowKey`]: build every key with this, so that the test and the bench agree.
#[must_use]
pub fn reference_key(op: Op, size: u32, qps: u32, guest_server: bool) -> RowKey {
    (op.name(), size, qps, guest_server)
}

/// The perftest command line of a row, without the server's address (the client adds it).
#[must_use]
pub fn tool(op: Op, size: u32, qps: u32, port: u16) -> String {
    let n = iters(op, size);
    let size_arg = match op {
        Op::Atomic => String::new(),
        _ => format!("-s {size}"),
    };
    rxe::perftest_cmd(
        &format!("ib_{}_bw", op.name()),
        port,
        &format!("{size_arg} -n {n} -q {qps}"),
    )
}

/// One run of a row, our side plain (see [`scenario_with`]).
pub fn scenario(
    h: &Harness<'_>,
    op: Op,
    size: u32,
    qps: u32,
    guest_server: bool,
    port: u16,
) -> Row {
    scenario_with(h, (op, size, qps), guest_server, port, false)
}

/// [`scenario`], with our side offering the multipath extension (`roce perf --multipath`)
/// when `multipath`: rxe never offers it back, so every packet must still be plain RoCE v2
/// (the capture's checks) but for the offer bit, and no SACK, selective resend or
/// out-of-order placement may happen (our counters).
pub fn scenario_with(
    h: &Harness<'_>,
    (op, size, qps): (Op, u32, u32),
    guest_server: bool,
    port: u16,
    multipath: bool,
) -> Row {
    scenario_args(h, (op, size, qps), guest_server, port, multipath, &[])
}

/// [`scenario_with`], with `extra` arguments for `roce perf` (a bench's `--cc ...`).
pub fn scenario_args(
    h: &Harness<'_>,
    (op, size, qps): (Op, u32, u32),
    guest_server: bool,
    port: u16,
    multipath: bool,
    extra: &[String],
) -> Row {
    let p = h.peer;
    let n = iters(op, size);
    let tool = tool(op, size, qps, port);
    let mut ours: Vec<String> = [
        "perf",
        op.name(),
        "-d",
        &p.ifname,
        "-p",
        &port.to_string(),
        "-n",
        &n.to_string(),
        "-q",
        &qps.to_string(),
        "-m",
        "1024",
        "--no-verify",
    ]
    .map(String::from)
    .to_vec();
    if !matches!(op, Op::Atomic) {
        ours.extend(["-s".into(), size.to_string()]);
    }
    if multipath {
        ours.push("--multipath".into());
    }
    ours.extend(extra.iter().cloned());
    // Extra arguments name the run apart (its capture is not the plain row's): the
    // `--cc-set` values, `NAME=VALUE` as `NAME-VALUE`.
    let suffix: String = extra
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| format!("-{}", a.replace(['=', ' ', '/'], "-")))
        .collect();
    let name = format!(
        "ib_{}_bw-server_{}-s{size}-q{qps}{}{suffix}",
        op.name(),
        if guest_server { "rxe" } else { "roce" },
        if multipath { "-multipath" } else { "" }
    );
    let roles = if guest_server {
        ours.push(p.guest_ip.to_string());
        Roles::GuestServer { guest: tool, ours }
    } else {
        Roles::OurServer {
            ours,
            guest: format!("{tool} {}", p.host_ip),
        }
    };
    let mut report = h.run(&name, &roles, port);
    // What each side says it did.
    let want = u64::from(n) * u64::from(qps);
    if let Ok(v) = &report.ours {
        // As server of WRITE/READ/atomics we show the client's report (perftest's numbers).
        if v["messages"].as_u64() != Some(want) {
            report.failures.push(format!(
                "roce perf reports {} messages, want {want}",
                v["messages"]
            ));
        }
    }
    if multipath {
        for c in ["sack_received", "selective_retransmits", "ooo_placed"] {
            let n = report.ours_ctr.get(c).copied().unwrap_or(0);
            if n != 0 {
                report
                    .failures
                    .push(format!("{c} {n}: the extension turned on towards rxe"));
            }
        }
    }
    match rxe::perftest_bw_line(&report.guest.out) {
        // perftest reports the iterations of all QPs.
        Some((_, it, ..)) if it == want => {}
        other => report.failures.push(format!(
            "perftest result line {other:?}, want {want} iterations"
        )),
    }
    Row {
        op,
        size: if matches!(op, Op::Atomic) { 8 } else { size },
        qps,
        server: if guest_server { "rxe" } else { "roce" },
        report,
    }
}

/// The rxe ↔ rxe reference of one row: the same tool, size, QP count and iterations, with the
/// second VM (`second`, [`Peer::boot_beside`]) in roce-xdp's place and `guest` in the role it
/// has in the row: the server when `guest_server`, the client otherwise. Returns the result
/// `guest` printed, as the row reads the guest's: perftest's (`BW average` MB/s, message rate
/// Mpps). The message rate says more for 2-byte messages, whose bandwidth rounds to 0.00.
///
/// The roles matter: a Soft-RoCE guest under TCG sends and receives at different speeds, and
/// a guest that has run a whole matrix is not the fresh second VM, so the reference keeps the
/// guest on the same side as in the row rather than always making it the server.
///
/// # Errors
/// Both tries failed (see [`rxe::twice`]).
pub fn rxe_reference(
    guest: &Peer,
    second: &Peer,
    (op, size, qps): (Op, u32, u32),
    guest_server: bool,
    port: &mut u16,
) -> Result<(f64, f64), String> {
    let (server, client) = if guest_server {
        (guest, second)
    } else {
        (second, guest)
    };
    rxe::twice(|| {
        *port += 1;
        let t = tool(op, size, qps, *port);
        let timeout = Duration::from_secs(120) * scale();
        let (s, c) = rxe::rxe_pair_both(server, client, &t, *port, timeout)?;
        let out = if guest_server { s } else { c };
        let want = u64::from(iters(op, size)) * u64::from(qps);
        match rxe::perftest_bw_line(&out.out) {
            Some((_, it, _, bw, rate)) if it == want && rate > 0.0 => Ok((bw, rate)),
            other => Err(format!(
                "rxe ↔ rxe ib_{}_bw -s {size} -q {qps}, the guest the {}: result line {other:?}, want {want} iterations: {}",
                op.name(),
                if guest_server { "server" } else { "client" },
                out.out
            )),
        }
    })
}

/// References keyed by [`RowKey`].
pub type References = BTreeMap<RowKey, Result<(f64, f64), String>>;

/// Every row of the matrix, in the order the test runs them: (operation, size, QPs, whether
/// the guest is the server). Sizes 2 B, 4 KiB, 64 KiB and 1 MiB (atomics 8 B), 1 and 4 QPs,
/// both directions: 52 rows.
#[must_use]
pub fn rows() -> Vec<(Op, u32, u32, bool)> {
    let mut v = Vec::new();
    for op in [Op::Write, Op::Read, Op::Send, Op::Atomic] {
        let sizes: &[u32] = if matches!(op, Op::Atomic) {
            &[8]
        } else {
            &[2, 4096, 65536, 1 << 20]
        };
        for &size in sizes {
            for qps in [1, 4] {
                for guest_server in [true, false] {
                    v.push((op, size, qps, guest_server));
                }
            }
        }
    }
    v
}

/// A row's name, as `ROCE_INTEROP_ONLY` and `ROCE_BENCH_INTEROP_ONLY` match it:
/// `ib_write_bw-server_rxe-s65536-q4`.
#[must_use]
pub fn row_name(op: Op, size: u32, qps: u32, guest_server: bool) -> String {
    format!(
        "ib_{}_bw-server_{}-s{size}-q{qps}",
        op.name(),
        if guest_server { "rxe" } else { "roce" }
    )
}

/// Counter `name` summed over the QPs of a `roce perf --json` report's `cc` array (0 where
/// the report has none).
#[must_use]
pub fn cc_sum(report: &serde_json::Value, name: &str) -> u64 {
    report["cc"]
        .as_array()
        .map_or(0, |qps| qps.iter().filter_map(|q| q[name].as_u64()).sum())
}

/// The requests rxe counted as duplicates (`duplicate_request`) less the probes of our READ
/// clock (`rp_probe_sent`, duplicates by design, transport/cc.rs `ReadClock`): what rxe saw
/// resent by our side. Call it on a scenario's report wherever a table shows retransmissions.
#[must_use]
pub fn rxe_dups_less_probes(report: &SceneReport) -> i64 {
    let probes = report
        .ours
        .as_ref()
        .map_or(0, |v| cc_sum(v, "rp_probe_sent"));
    report.rxe.get("duplicate_request").copied().unwrap_or(0)
        - i64::try_from(probes).unwrap_or(i64::MAX)
}

/// The words of a comma-separated filter variable (`ROCE_INTEROP_ONLY=a,b`); empty when unset.
#[must_use]
pub fn only(var: &str) -> Vec<String> {
    std::env::var(var)
        .map(|v| {
            v.split(',')
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `name` passes the filter `only` (empty: everything).
#[must_use]
pub fn chosen(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|o| name.contains(o.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cc_sum_adds_a_counter_over_the_qps() {
        let v = serde_json::json!({"cc": [{"rp_probe_sent": 3}, {"rp_probe_sent": 4}, {}]});
        assert_eq!(cc_sum(&v, "rp_probe_sent"), 7);
        assert_eq!(cc_sum(&v, "rp_probe_lost"), 0);
        assert_eq!(cc_sum(&serde_json::json!({}), "rp_probe_sent"), 0);
    }

    /// A scenario's report with rxe's `duplicate_request` delta (if any) and our JSON.
    fn report(dups: Option<i64>, ours: Result<serde_json::Value, String>) -> SceneReport {
        SceneReport {
            name: "t".into(),
            ours,
            guest: rxe::StepOut {
                rc: 0,
                out: String::new(),
            },
            pcap: rxe::Dissection::default(),
            icrc: rxe::IcrcCheck::default(),
            rxe: dups
                .map(|d| BTreeMap::from([("duplicate_request".to_owned(), d)]))
                .unwrap_or_default(),
            ours_ctr: BTreeMap::new(),
            other: BTreeMap::new(),
            counted_drops: 0,
            failures: Vec::new(),
            secs: 0.0,
        }
    }

    #[test]
    fn rxe_duplicates_leave_out_our_read_clock_probes() {
        let cc = serde_json::json!({"cc": [{"rp_probe_sent": 3}, {"rp_probe_sent": 4}, {}]});
        assert_eq!(rxe_dups_less_probes(&report(Some(10), Ok(cc.clone()))), 3);
        // Our side failed (no JSON): nothing to take away.
        assert_eq!(
            rxe_dups_less_probes(&report(Some(10), Err("failed".into()))),
            10
        );
        // rxe counted none: the probes show as a negative figure rather than vanish.
        assert_eq!(rxe_dups_less_probes(&report(None, Ok(cc))), -7);
    }

    #[test]
    fn scale_is_one_unless_set_to_a_whole_number_up_to_100() {
        assert_eq!(parse_scale(None), Ok(1));
        assert_eq!(parse_scale(Some("")), Ok(1));
        assert_eq!(parse_scale(Some("4")), Ok(4));
        assert_eq!(parse_scale(Some("100")), Ok(100));
        for bad in ["0", "101", "-1", "2.5", "x"] {
            let e = parse_scale(Some(bad)).unwrap_err();
            assert!(e.starts_with(&format!("{SCALE_ENV}={bad}:")), "{e}");
        }
    }

    #[test]
    fn the_matrix_has_52_rows_named_as_before() {
        let r = rows();
        assert_eq!(r.len(), 52);
        assert_eq!(
            row_name(r[0].0, r[0].1, r[0].2, r[0].3),
            "ib_write_bw-server_rxe-s2-q1"
        );
        let last = r[r.len() - 1];
        assert_eq!(
            row_name(last.0, last.1, last.2, last.3),
            "ib_atomic_bw-server_roce-s8-q4"
        );
        assert!(chosen(&[], "x"));
        assert!(chosen(&["read".into()], "ib_read_bw-server_rxe-s2-q1"));
        assert!(!chosen(&["read".into()], "ib_write_bw-server_rxe-s2-q1"));
    }
}
