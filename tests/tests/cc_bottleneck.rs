//! DCQCN against a congested switch queue on veth: `roce impair --bottleneck` on a router
//! between sender(s) and receiver (AF_XDP transmit skips the sender's own tc egress, so the
//! bottleneck sits on the router's egress towards the receiver), with `roce perf write` flows
//! across it. Shows that a flow converges near the bottleneck rate, that CNPs flow and are
//! accounted for on both sides, that without congestion control the same bottleneck drops and
//! the transport retransmits, and that two flows share it fairly. The same routed pair with a
//! drop-tail `tbf` queue that marks nothing shows Swift, the delay-based CC, keeping that queue
//! from dropping. Needs root.

use std::{fs, path::PathBuf};

use roce::{
    cc::Trace,
    netns::{Routed, VethOptions},
};
use roce_common::impair::ImpairStats;
use roce_tests::{
    child::{args, finish, json_ok, spawn},
    require_root, roce_bin, tag,
};
use serde_json::Value;

/// The DCQCN profile of the quiet tests. With the mlx5 profile they failed on the faster
/// machine of Dec 5 (8 of 9 runs of `without_cc...` dropped 63-78 % with CC on, 3 of 3 runs of
/// `write_converges...` missed the rate): a tail drop leaves go-back-N waiting out its ACK
/// timeout with nothing to send, and mlx5's increase timer (300 µs, hyper increase after the
/// first) takes the rate from 200 Mb/s to 3-5 Gb/s over the wait (a trace: 125 ms with nothing
/// sent while the rate went to 3.2 Gb/s), so the QP overflows the queue again when it resumes.
/// The software profile's `hold_when_idle` keeps increases to periods the QP used; with it the
/// same test dropped 1.1-8.7 % in six runs. (Turning `hold_when_idle` on in the default profile
/// too is the next step; nine of the transport simulator's tests change with it.)
const SOFTWARE: &str = "--cc-profile software";

/// The bottleneck rate, bits/s, and its `roce impair` spelling.
const BOTTLENECK_BPS: f64 = 200e6;
const BOTTLENECK: &str = "200mbit";

/// The drop-tail queue's rate (the Swift tests), bits/s, and its `tc` spelling. Lower than
/// [`BOTTLENECK`]: the rule compares Swift with CC off, which must overrun the queue, and on
/// Dec 6's machine a debug-build sender without CC moved only 150-175 Mb/s, so a 200 Mb/s queue
/// dropped 0.3-7 % and a run could fail the premise (CI saw 0.31 %). At 100 Mb/s the sender
/// outruns it by half again or more.
const DROP_TAIL_BPS: f64 = 100e6;
const DROP_TAIL: &str = "100mbit";

/// Removes `roce impair` from the router and the test's temporary directory on drop, even when
/// the test fails (the namespaces go with [`Routed`]'s own drop, which runs after this one).
struct Guard {
    router_ns: String,
    ifname: String,
    dir: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = std::process::Command::new(roce_bin())
            .args([
                "--netns",
                &self.router_ns,
                "impair",
                "-i",
                &self.ifname,
                "--off",
            ])
            .output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

struct Setup {
    // Field order: the guard detaches impair before the namespaces go.
    guard: Guard,
    net: Routed,
}

fn setup(name: &str, subnet: u8, senders: usize) -> Setup {
    require_root();
    let net = Routed::new(
        &tag(name),
        senders,
        &VethOptions {
            subnet,
            ..VethOptions::default()
        },
    )
    .expect("routed topology");
    let dir = std::env::temp_dir().join(tag(&format!("roce-{name}-")));
    fs::create_dir_all(&dir).unwrap();
    let guard = Guard {
        router_ns: net.router_netns.clone(),
        ifname: net.bottleneck_if.clone(),
        dir,
    };
    Setup { guard, net }
}

fn roce_json(ns: &str, line: &str) -> Value {
    json_ok(&finish(spawn(ns, &args(line))), line)
}

fn bottleneck_on(s: &Setup) {
    roce_json(
        &s.net.router_netns,
        &format!(
            "impair -i {} --bottleneck {BOTTLENECK}",
            s.net.bottleneck_if
        ),
    );
}

fn impair_stats(s: &Setup) -> ImpairStats {
    let v = roce_json(
        &s.net.router_netns,
        &format!("impair -i {} --show", s.net.bottleneck_if),
    );
    let mut st = ImpairStats::default();
    for name in ImpairStats::NAMES {
        *st.get_mut(name).unwrap() = v["impair"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("impair --show has no {name}: {v}"));
    }
    st
}

/// One `roce perf write` run from sender 0 to the receiver for `secs` seconds over `qps` QPs;
/// returns (client JSON, server JSON, the client's trace).
fn write_flow(s: &Setup, cc: &str, qps: u32, secs: u32) -> (Value, Value, Trace) {
    write_flow_with(s, cc, "", qps, secs)
}

/// Where [`write_flow_with`] has the client write its trace.
fn trace_path(s: &Setup, cc: &str, extra: &str, qps: u32) -> PathBuf {
    let profile = extra.split_whitespace().collect::<Vec<_>>().join("_");
    s.guard.dir.join(format!("{cc}-{qps}{profile}.csv"))
}

/// [`write_flow`] with `extra` arguments for both ends (e.g. `--cc-profile software`).
fn write_flow_with(s: &Setup, cc: &str, extra: &str, qps: u32, secs: u32) -> (Value, Value, Trace) {
    let common = format!("perf write -s 65536 -t 32 -q {qps} --cc {cc} --line-rate 10gbit {extra}");
    let recv = &s.net.receiver;
    let server = spawn(&recv.netns, &args(&format!("{common} -d {}", recv.ifname)));
    let trace_path = trace_path(s, cc, extra, qps);
    let send = &s.net.senders[0];
    let client = finish(spawn(
        &send.netns,
        &args(&format!(
            "{common} -D {secs} --trace {} --trace-interval 5 -d {} {}",
            trace_path.display(),
            send.ifname,
            recv.ipv4
        )),
    ));
    let server = finish(server);
    let c = json_ok(&client, "perf write client");
    let sv = json_ok(&server, "perf write server");
    let text = fs::read_to_string(&trace_path).expect("the client wrote its trace");
    (c, sv, Trace::parse_csv(&text).expect("a valid trace"))
}

/// Sum of a counter over the QPs of a perf JSON report (`cc` is per QP; transport counters are
/// under `transport`).
fn qp_sum(v: &Value, path: &[&str]) -> u64 {
    v["cc"]
        .as_array()
        .expect("per-QP cc report")
        .iter()
        .map(|q| {
            let mut x = q;
            for p in path {
                x = &x[*p];
            }
            x.as_u64().unwrap_or_else(|| panic!("no {path:?} in {q}"))
        })
        .sum()
}

/// Bits/s QP `qpn` sent over the last `frac` of the trace.
fn tail_rate(t: &Trace, qpn: u64, frac: f64) -> f64 {
    let rows: Vec<_> = t
        .rows
        .iter()
        .filter(|r| u64::from(r.qpn.value()) == qpn)
        .collect();
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    let from_t = last.time.as_nanos()
        - ((last.time.as_nanos() - first.time.as_nanos()) as f64 * frac) as u64;
    let from = rows
        .iter()
        .find(|r| r.time.as_nanos() >= from_t)
        .expect("a sample in the tail");
    (last.bytes - from.bytes) as f64 * 8.0
        / ((last.time.as_nanos() - from.time.as_nanos()) as f64 / 1e9)
}

fn qpns(v: &Value) -> Vec<u64> {
    v["cc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["qpn"].as_u64().unwrap())
        .collect()
}

#[test]
fn write_converges_to_the_bottleneck_and_cnps_reconcile() {
    let s = setup("ccb", 91, 1);
    bottleneck_on(&s);
    let before = impair_stats(&s);
    let (c, sv, trace) = write_flow_with(&s, "on", SOFTWARE, 1, 8);
    let imp = impair_stats(&s).saturating_sub(&before);
    let qpn = qpns(&c)[0];
    let rate = tail_rate(&trace, qpn, 0.5);
    let marked = imp.bottleneck_marked;
    let ce_seen = qp_sum(&sv, &["np_ecn_marked_roce_packets"]);
    let cnp_sent = qp_sum(&sv, &["np_cnp_sent"]);
    let handled = qp_sum(&c, &["rp_cnp_handled"]);
    let ignored = qp_sum(&c, &["rp_cnp_ignored"]);
    eprintln!(
        "cc on: tail rate {:.1} Mb/s, goodput {:.1} Mb/s, impair {imp:?}, receiver CE {ce_seen} \
         CNPs sent {cnp_sent}; sender CNPs handled {handled} ignored {ignored}",
        rate / 1e6,
        c["gbit_per_sec"].as_f64().unwrap() * 1e3
    );
    assert!(
        (rate - BOTTLENECK_BPS).abs() <= 0.2 * BOTTLENECK_BPS,
        "the flow sent {:.1} Mb/s over the last half, not within 20 % of {BOTTLENECK}",
        rate / 1e6
    );
    // Marks flowed: the bottleneck marked, the receiver saw every mark, CNPs went back.
    assert!(marked > 0, "the bottleneck never marked: {imp:?}");
    assert_eq!(
        ce_seen, marked,
        "every CE mark the bottleneck made reached the receiver's NP"
    );
    assert!(cnp_sent > 0 && cnp_sent <= ce_seen);
    // Every CNP the receiver sent reached the sender's RP (the reverse path is not impaired and
    // the client reports after the server's last CNP had time to arrive): handled + ignored.
    let received = handled + ignored;
    assert!(
        received <= cnp_sent && received + 2 >= cnp_sent,
        "np_cnp_sent {cnp_sent} at the receiver vs rp_cnp_handled {handled} + rp_cnp_ignored \
         {ignored} at the sender"
    );
    assert!(handled > 0, "no CNP cut the rate");
    // The trace recorded the CNPs too.
    let last = trace
        .rows
        .iter()
        .rev()
        .find(|r| u64::from(r.qpn.value()) == qpn);
    assert_eq!(last.map(|r| r.cnps), Some(received));
    assert!(c["verified"].as_bool().unwrap() && sv["verified"].as_bool().unwrap());
}

#[test]
fn without_cc_the_bottleneck_drops_and_the_sender_retransmits() {
    let s = setup("ccd", 92, 1);
    bottleneck_on(&s);
    let b0 = impair_stats(&s);
    let (c_on, sv_on, _) = write_flow_with(&s, "on", SOFTWARE, 1, 5);
    let b1 = impair_stats(&s);
    let (c_off, sv_off, _) = write_flow(&s, "off", 1, 5);
    let b2 = impair_stats(&s);
    let on = b1.saturating_sub(&b0);
    let off = b2.saturating_sub(&b1);
    let retx = |c: &Value| qp_sum(c, &["transport", "completer_retry_err"]);
    let (retx_on, retx_off) = (retx(&c_on), retx(&c_off));
    let drops = |st: &ImpairStats| st.bottleneck_dropped + st.bottleneck_early_dropped;
    eprintln!(
        "cc on: {on:?}, {retx_on} retries; cc off: {off:?}, {retx_off} retries, goodput {:.1} \
         vs {:.1} Mb/s",
        c_off["gbit_per_sec"].as_f64().unwrap() * 1e3,
        c_on["gbit_per_sec"].as_f64().unwrap() * 1e3
    );
    assert!(
        drops(&off) > 0 && retx_off > 0,
        "without CC the bottleneck must drop and the sender retry: {off:?}, {retx_off} retries"
    );
    // Compared as fractions of what reached the queue: the CC run offers more packets (it is
    // not retransmitting), and it starts at line rate, so its first round trip overflows the
    // queue before the first CNP arrives; how many that drops depends on how fast the loaded
    // machine turns the CNP around (3,061 in a quiet run, 7,059 of 125,684 (5.6 %) in a loaded CI run), while
    // without CC more than half of everything is dropped (60-75 %).
    let fraction = |st: &ImpairStats| drops(st) as f64 / st.seen.max(1) as f64;
    eprintln!(
        "dropped with CC {:.1} %, without {:.1} %",
        100.0 * fraction(&on),
        100.0 * fraction(&off)
    );
    assert!(
        fraction(&off) > 5.0 * fraction(&on),
        "CC should keep the queue from dropping: {} of {} dropped with it ({:.1} %), {} of {} \
         without ({:.1} %)",
        drops(&on),
        on.seen,
        100.0 * fraction(&on),
        drops(&off),
        off.seen,
        100.0 * fraction(&off)
    );
    let (goodput_on, goodput_off) = (
        c_on["gbit_per_sec"].as_f64().unwrap(),
        c_off["gbit_per_sec"].as_f64().unwrap(),
    );
    assert!(
        goodput_on > 1.5 * goodput_off,
        "goodput {:.1} Mb/s with CC, {:.1} without",
        goodput_on * 1e3,
        goodput_off * 1e3
    );
    // Retries are compared per gigabit delivered, not as raw counts: go-back-N retries once per
    // loss event, not per lost packet, and the number of loss events follows how much the
    // sender got to offer. On a loaded machine the CC-off sender offers half as much (62,366
    // packets against 124,148 with CC in one CI run) while the slower CNP turnaround lets the CC
    // run overflow the queue more often, so the raw counts came out 479 without CC and 493 with
    // it, with goodput 16.8 vs 176.5 Mb/s over 5 s: 5,702 retries per delivered Gbit without
    // CC, 559 with it (10x). On a quiet machine the ratio is 30-80x; another loaded run, 6.8x.
    let gbit = |c: &Value| c["bytes"].as_u64().expect("perf reports bytes") as f64 * 8e-9;
    let (gbit_on, gbit_off) = (gbit(&c_on), gbit(&c_off));
    let (rate_on, rate_off) = (
        retx_on as f64 / gbit_on.max(1e-9),
        retx_off as f64 / gbit_off.max(1e-9),
    );
    assert!(
        rate_off > 2.0 * rate_on,
        "{retx_off} retries for {gbit_off:.2} Gbit delivered without CC ({rate_off:.0}/Gbit), \
         {retx_on} for {gbit_on:.2} Gbit with it ({rate_on:.0}/Gbit)"
    );
    // Without CC nothing is ECT, so nothing is marked (RED drops instead) and no CNP is sent;
    // with CC, ECT(0) data is marked, not dropped early.
    assert_eq!(off.bottleneck_marked, 0);
    assert!(
        on.bottleneck_marked > 0 && on.bottleneck_early_dropped == 0,
        "{on:?}"
    );
    assert_eq!(qp_sum(&sv_off, &["np_cnp_sent"]), 0);
    // Drops are recovered: both runs' data verified.
    for v in [&c_on, &sv_on, &c_off, &sv_off] {
        assert_eq!(v["verified"], true, "{v}");
    }
}

#[test]
fn two_flows_share_the_bottleneck_fairly() {
    let s = setup("ccf", 93, 1);
    bottleneck_on(&s);
    let (c, sv, trace) = write_flow_with(&s, "on", SOFTWARE, 2, 10);
    let q = qpns(&c);
    let rates: Vec<f64> = q.iter().map(|&n| tail_rate(&trace, n, 0.5)).collect();
    let total: f64 = rates.iter().sum();
    eprintln!(
        "two flows: {:.1} + {:.1} Mb/s over the last half",
        rates[0] / 1e6,
        rates[1] / 1e6
    );
    for r in &rates {
        let share = r / (total / 2.0);
        assert!(
            (0.7..=1.3).contains(&share),
            "a flow got {:.1} Mb/s, {share:.2} of its fair share (rates {rates:?})",
            r / 1e6
        );
    }
    assert!(
        (total - BOTTLENECK_BPS).abs() <= 0.2 * BOTTLENECK_BPS,
        "together {:.1} Mb/s",
        total / 1e6
    );
    assert!(qp_sum(&c, &["rp_cnp_handled"]) > 0);
    assert_eq!(sv["verified"], true);

    // The picture: `roce plot` draws this real trace, both QPs, with their CNPs.
    let csv = trace_path(&s, "on", SOFTWARE, 2);
    let svg = s.guard.dir.join("two-flows.svg");
    let plot: Vec<String> = [
        "plot",
        &csv.display().to_string(),
        "-o",
        &svg.display().to_string(),
        "--title",
        "DCQCN on veth: two WRITE flows into a 200 Mb/s roce impair bottleneck",
    ]
    .map(String::from)
    .to_vec();
    let v = json_ok(&finish(spawn("", &plot)), "roce plot");
    assert_eq!(v["qps"], 2, "{v}");
    assert_eq!(v["samples"].as_u64(), Some(trace.rows.len() as u64));
    let text = fs::read_to_string(&svg).unwrap();
    for qpn in &q {
        for what in ["rate", "target", "throughput (sent)"] {
            assert!(
                text.contains(&format!("QP {qpn} {what}")),
                "no QP {qpn} {what}"
            );
        }
    }
    assert!(text.matches("<circle").count() > 10, "CNP marks drawn");
    // `ROCE_SAVE_PLOT=DIR` keeps the trace and the picture (how docs/dcqcn-two-flows.svg was
    // made).
    if let Some(dir) = std::env::var_os("ROCE_SAVE_PLOT") {
        let dir = PathBuf::from(dir);
        fs::copy(&csv, dir.join("dcqcn-two-flows.csv")).unwrap();
        fs::copy(&svg, dir.join("dcqcn-two-flows.svg")).unwrap();
    }
}

/// A CPU hog (`yes > /dev/null`) at nice level `nice`, pinned to CPU 0 with `taskset`, killed
/// by its PID and reaped on drop, even when the test fails.
struct Hog(std::process::Child);

impl Hog {
    fn start(nice: i32) -> Self {
        let child = std::process::Command::new("nice")
            .args(["-n", &nice.to_string(), "taskset", "-c", "0", "yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the CPU hog (nice, taskset, yes)");
        // Let it take its core before traffic starts.
        std::thread::sleep(std::time::Duration::from_millis(200));
        Self(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 20: DCQCN on a busy host. With `nice -n 19 yes` pinned to one core beside the
/// endpoints, the software profile (`--cc-profile software`, docs/cc-software.md) and the
/// arrival stamps (CNPs by arrival time) still hold one WRITE flow within ±20 % of the
/// bottleneck over the last half of the run, and drop at most a fifth of the fraction the same
/// bottleneck drops with CC off under the same hog.
#[test]
fn software_profile_holds_the_bottleneck_beside_a_cpu_hog() {
    software_profile_beside_a_hog("cch", 94, 19);
}

/// The same beside a full-priority hog (`yes` at nice 0, pinned to CPU 0).
#[test]
fn software_profile_holds_the_bottleneck_beside_a_full_priority_hog() {
    software_profile_beside_a_hog("cci", 95, 0);
}

fn software_profile_beside_a_hog(name: &str, subnet: u8, nice: i32) {
    let s = setup(name, subnet, 1);
    bottleneck_on(&s);
    let _hog = Hog::start(nice);
    let drops = |st: &ImpairStats| st.bottleneck_dropped + st.bottleneck_early_dropped;
    let fraction = |st: &ImpairStats| drops(st) as f64 / st.seen.max(1) as f64;
    let b0 = impair_stats(&s);
    let (c_off, _, _) = write_flow(&s, "off", 1, 5);
    let b1 = impair_stats(&s);
    let (c_on, sv_on, trace) = write_flow_with(&s, "on", "--cc-profile software", 1, 8);
    let b2 = impair_stats(&s);
    let (off, on) = (b1.saturating_sub(&b0), b2.saturating_sub(&b1));
    let rate = tail_rate(&trace, qpns(&c_on)[0], 0.5);
    // The DCQCN rate (what the RP allowed) over the same half, to tell a rate that CC held
    // down from a sender the hog kept from the CPU.
    let half = &trace.rows[trace.rows.len() / 2..];
    let allowed = half.iter().map(|r| r.rate_bps as f64).sum::<f64>() / half.len().max(1) as f64;
    let ce_seen = qp_sum(&sv_on, &["np_ecn_marked_roce_packets"]);
    let cnp_sent = qp_sum(&sv_on, &["np_cnp_sent"]);
    let handled = qp_sum(&c_on, &["rp_cnp_handled"]);
    let ignored = qp_sum(&c_on, &["rp_cnp_ignored"]);
    eprintln!(
        "nice {nice} hog, software profile: tail rate {:.1} Mb/s (DCQCN rate {:.1}), goodput {:.1} Mb/s, dropped {} of \
         {} ({:.2} %), CE {ce_seen}, CNPs sent {cnp_sent}, handled {handled}, ignored \
         {ignored}; CC off: goodput {:.1} Mb/s, dropped {} of {} ({:.2} %)",
        rate / 1e6,
        allowed / 1e6,
        c_on["gbit_per_sec"].as_f64().unwrap() * 1e3,
        drops(&on),
        on.seen,
        100.0 * fraction(&on),
        c_off["gbit_per_sec"].as_f64().unwrap() * 1e3,
        drops(&off),
        off.seen,
        100.0 * fraction(&off),
    );
    assert!(
        (rate - BOTTLENECK_BPS).abs() <= 0.2 * BOTTLENECK_BPS,
        "the flow sent {:.1} Mb/s over the last half, not within 20 % of {BOTTLENECK}",
        rate / 1e6
    );
    assert!(
        fraction(&on) <= fraction(&off) / 5.0,
        "CC on dropped {:.2} %, more than a fifth of CC off's {:.2} %",
        100.0 * fraction(&on),
        100.0 * fraction(&off)
    );
    assert!(handled > 0 && cnp_sent > 0, "no CNP cut the rate");
    assert_eq!(c_on["verified"], true, "{c_on}");
    assert_eq!(sv_on["verified"], true, "{sv_on}");
}

/// A drop-tail FIFO that marks nothing: `tc`'s token bucket filter at [`DROP_TAIL`] on the
/// router's egress towards the receiver (a real queue, so queueing shows up as delay, which
/// `roce impair`'s virtual bottleneck does not add), 50 kB deep (4 ms at 100 Mb/s). It goes
/// with the router's namespace.
fn drop_tail_on(s: &Setup) {
    roce::netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &s.net.router_netns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            &s.net.bottleneck_if,
            "root",
            "tbf",
            "rate",
            DROP_TAIL,
            "burst",
            "32kb",
            "limit",
            "50kb",
        ],
    )
    .expect("tc qdisc replace ... tbf");
}

/// (packets sent, packets dropped) by the drop-tail queue so far.
fn drop_tail_stats(s: &Setup) -> (u64, u64) {
    let o = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &s.net.router_netns,
            "tc",
            "-s",
            "-j",
            "qdisc",
            "show",
            "dev",
            &s.net.bottleneck_if,
        ])
        .output()
        .expect("tc -s qdisc show");
    let v: Value = serde_json::from_slice(&o.stdout).expect("tc -j");
    let q = v
        .as_array()
        .and_then(|a| a.iter().find(|q| q["kind"] == "tbf"))
        .unwrap_or_else(|| panic!("no tbf qdisc: {v}"));
    (
        q["packets"].as_u64().expect("packets"),
        q["drops"].as_u64().expect("drops"),
    )
}

/// The fraction of the packets offered to the drop-tail queue that it dropped, from
/// [`drop_tail_stats`] deltas `(sent, dropped)`.
fn tail_drop_fraction((sent, dropped): (u64, u64)) -> f64 {
    dropped as f64 / (sent + dropped).max(1) as f64
}

/// Issue 20's rule for the delay-based CC: without CC the queue overflows, and Swift drops at
/// most a tenth of CC off's fraction.
fn swift_dropped_a_tenth(off: (u64, u64), on: (u64, u64)) {
    assert!(
        tail_drop_fraction(off) > 0.01,
        "CC off should overrun the queue: {off:?}"
    );
    assert!(
        tail_drop_fraction(on) <= tail_drop_fraction(off) / 10.0,
        "Swift dropped {:.3} %, more than a tenth of CC off's {:.2} %",
        100.0 * tail_drop_fraction(on),
        100.0 * tail_drop_fraction(off)
    );
}

/// Issue 20's rule for the delay-based CC's goodput: the verified bytes a perf client
/// `report` moved (all its QPs) within 20 % of the bottleneck.
fn swift_goodput_near_the_bottleneck(report: &Value) {
    let goodput = report["gbit_per_sec"].as_f64().expect("gbit_per_sec") * 1e9;
    assert!(
        goodput >= 0.8 * DROP_TAIL_BPS,
        "Swift's goodput {:.1} Mb/s is not within 20 % of {DROP_TAIL}",
        goodput / 1e6
    );
}

/// Issue 20: the delay-based CC towards a path that marks nothing. On a drop-tail queue (no
/// ECN), one Swift WRITE flow (`--cc-profile software`) keeps the queue short: it drops at
/// most a tenth of the fraction the same queue drops with CC off, and every byte is verified.
///
/// The profile matters: its `swift_persist` (500 µs) lets a delay over the target cut only
/// once every sample for that long was over it. With the paper's Swift (a cut on the first
/// sample over the target), one flow ran at 114-191 Mb/s of 200 in five runs on this loaded
/// 2-core machine: the RTT samples include the receiving process's delay before it ACKs, and
/// a scheduling stall there delivers a batch of late ACKs that read as queueing though no
/// queue grew (the trace showed its rate falling to 2-17 Mb/s and recovering). With the
/// profile: 193.8, 194.8 and 198.5 Mb/s at a load average of 3. Its goodput is held to the
/// issue's rule, within 20 % of the bottleneck: on Dec 6's morning, 188.0-189.2 Mb/s of 200
/// (tail rate 196.4-199.0) in four runs, two of them beside a full-priority `yes`. That
/// afternoon the same machine moved only 150-175 Mb/s without CC, so CC off no longer overran
/// a 200 Mb/s queue (one CI run: 0.31 % dropped, failing the premise) and Swift reached
/// 143-167: the queue is [`DROP_TAIL`] since, where three runs gave 92.8-94.5 Mb/s (tail rate
/// 96.7-99.4) and no drop, against 50-51 % dropped with CC off.
#[test]
fn swift_keeps_a_drop_tail_queue_short() {
    let s = setup("ccs", 116, 1);
    drop_tail_on(&s);
    let q0 = drop_tail_stats(&s);
    let (c_off, _, _) = write_flow(&s, "off", 1, 5);
    let q1 = drop_tail_stats(&s);
    let (c_on, sv_on, trace) = write_flow_with(&s, "swift", "--cc-profile software", 1, 8);
    let q2 = drop_tail_stats(&s);
    let (off, on) = ((q1.0 - q0.0, q1.1 - q0.1), (q2.0 - q1.0, q2.1 - q1.1));
    let rate = tail_rate(&trace, qpns(&c_on)[0], 0.5);
    eprintln!(
        "swift on a drop-tail queue: tail rate {:.1} Mb/s, goodput {:.1} Mb/s, dropped {} of {} \
         ({:.3} %); CC off: goodput {:.1} Mb/s, dropped {} of {} ({:.2} %)",
        rate / 1e6,
        c_on["gbit_per_sec"].as_f64().unwrap() * 1e3,
        on.1,
        on.0 + on.1,
        100.0 * tail_drop_fraction(on),
        c_off["gbit_per_sec"].as_f64().unwrap() * 1e3,
        off.1,
        off.0 + off.1,
        100.0 * tail_drop_fraction(off),
    );
    swift_dropped_a_tenth(off, on);
    swift_goodput_near_the_bottleneck(&c_on);
    assert!(
        (rate - DROP_TAIL_BPS).abs() <= 0.2 * DROP_TAIL_BPS,
        "the flow sent {:.1} Mb/s over the last half, not within 20 % of {DROP_TAIL}",
        rate / 1e6
    );
    assert_eq!(c_on["verified"], true, "{c_on}");
    assert_eq!(sv_on["verified"], true, "{sv_on}");
}

/// Issue 20: two Swift flows (`--cc-profile software`) on the same drop-tail queue share it
/// within 30 % of fair, drop at most a tenth of the fraction two flows without CC drop
/// there, and together move a goodput within 20 % of the bottleneck (their tail rates
/// 185.9-199.4 Mb/s together in four runs on Dec 6 at 200 Mb/s, two beside a full-priority
/// `yes`; at [`DROP_TAIL`], 47.3-52.3 Mb/s each and 94.5-94.6 Mb/s of goodput in three runs,
/// no drop against 67-70 % with CC off; see [`swift_keeps_a_drop_tail_queue_short`]).
#[test]
fn two_swift_flows_share_a_drop_tail_queue_fairly() {
    let s = setup("cct", 117, 1);
    drop_tail_on(&s);
    let q0 = drop_tail_stats(&s);
    let _ = write_flow(&s, "off", 2, 5);
    let q1 = drop_tail_stats(&s);
    let (c, sv, trace) = write_flow_with(&s, "swift", "--cc-profile software", 2, 10);
    let q2 = drop_tail_stats(&s);
    let (off, on) = ((q1.0 - q0.0, q1.1 - q0.1), (q2.0 - q1.0, q2.1 - q1.1));
    let rates: Vec<f64> = qpns(&c)
        .iter()
        .map(|&n| tail_rate(&trace, n, 0.5))
        .collect();
    let total: f64 = rates.iter().sum();
    eprintln!(
        "two swift flows on a drop-tail queue: {:.1} + {:.1} Mb/s over the last half, goodput \
         {:.1} Mb/s, dropped {} of {} ({:.3} %); CC off: dropped {} of {} ({:.2} %)",
        rates[0] / 1e6,
        rates[1] / 1e6,
        c["gbit_per_sec"].as_f64().unwrap_or(0.0) * 1e3,
        on.1,
        on.0 + on.1,
        100.0 * tail_drop_fraction(on),
        off.1,
        off.0 + off.1,
        100.0 * tail_drop_fraction(off),
    );
    swift_dropped_a_tenth(off, on);
    swift_goodput_near_the_bottleneck(&c);
    for r in &rates {
        let share = r / (total / 2.0);
        assert!(
            (0.7..=1.3).contains(&share),
            "a flow got {:.1} Mb/s, {share:.2} of its fair share (rates {rates:?})",
            r / 1e6
        );
    }
    assert_eq!(c["verified"], true, "{c}");
    assert_eq!(sv["verified"], true, "{sv}");
}
