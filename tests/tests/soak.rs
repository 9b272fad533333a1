//! Soak (issue #9): WRITE, READ, SEND and fetch-and-add flows at once, 2 QPs each, for several
//! minutes through a router that drops 1 % of the RoCE packets both ways (`roce impair` on each
//! of its egress interfaces). Every sampling interval each QP must have completed more work
//! requests (no stuck QP); after a warm-up the resident memory of every endpoint process must
//! stay within 5 % of what it was; at the end every posted work request has completed exactly
//! once, every byte and every atomic checks out, and no error counter moved.
//!
//! Opt-in, it takes minutes: `cargo test -p roce-tests --test soak -- --ignored --nocapture`
//! (as root), or `cargo xtask test --soak`. `ROCE_SOAK_SECS` sets the length of the flows
//! (default 420, at most 570, so that the whole test stays under 10 minutes).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use roce::netns::{Routed, VethOptions};
use roce_tests::{require_root, roce_bin, tag};
use serde_json::Value;

/// Seconds between two samples of progress and memory.
const SAMPLE_SECS: u64 = 15;
/// Samples before memory is taken as warmed up.
const WARMUP_SECS: u64 = 60;
/// The path's loss rate, both ways.
const LOSS: f64 = 0.01;

/// A `roce` endpoint process whose stderr (the `--progress` lines) and stdout are read as they
/// come; killed on drop if still running.
struct Endpoint {
    name: String,
    child: Option<Child>,
    progress: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<String>>,
    stdout: Option<thread::JoinHandle<Vec<u8>>>,
}

impl Endpoint {
    fn spawn(name: &str, ns: &str, line: &str) -> Self {
        let mut child = Command::new(roce_bin())
            .args(["-j", "--netns", ns])
            .args(line.split_whitespace())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn roce");
        let progress = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let (p, e) = (progress.clone(), stderr.clone());
        thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&l) {
                    Ok(v) if v.get("progress").is_some() => p.lock().unwrap().push(v),
                    _ => {
                        let mut s = e.lock().unwrap();
                        s.push_str(&l);
                        s.push('\n');
                    }
                }
            }
        });
        let mut out = child.stdout.take().expect("stdout");
        let stdout = thread::spawn(move || {
            let mut b = Vec::new();
            let _ = std::io::Read::read_to_end(&mut out, &mut b);
            b
        });
        Self {
            name: name.to_owned(),
            child: Some(child),
            progress,
            stderr,
            stdout: Some(stdout),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// VmRSS in KiB, from /proc/PID/status.
    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_else(|e| panic!("{} is gone ({e}): {}", self.name, self.stderr()));
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in /proc/{}/status", self.pid()))
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The last progress line's per-QP completions.
    fn done(&self) -> Option<Vec<u64>> {
        let p = self.progress.lock().unwrap();
        p.last().map(|v| {
            v["progress"]["done"]
                .as_array()
                .expect("done")
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect()
        })
    }

    /// Waits at most `limit` for the exit; returns the JSON report.
    fn finish(mut self, limit: Duration) -> Value {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not finish in {limit:?}: {}",
                    self.name,
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(50));
        };
        let out = self.stdout.take().unwrap().join().unwrap_or_default();
        assert!(
            status.success(),
            "{} failed: {}{}",
            self.name,
            String::from_utf8_lossy(&out),
            self.stderr()
        );
        serde_json::from_slice(&out).unwrap_or_else(|e| {
            panic!(
                "{}: bad JSON ({e}): {}",
                self.name,
                String::from_utf8_lossy(&out)
            )
        })
    }
}

impl Drop for Endpoint {
    /// A test that fails mid-run stops its endpoints with SIGTERM first, so they flush their
    /// QPs, detach and remove their pins; SIGKILL only if one is still there after 3 s.
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Removes `roce impair` from the router, and whatever roce_xdp pins an endpoint that had to
/// be killed left behind on the hosts, on drop (the namespaces go with [`Routed`]'s drop, which
/// runs after this one).
struct Guard {
    router_ns: String,
    ifs: Vec<String>,
    hosts: Vec<(String, String)>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for i in &self.ifs {
            let _ = Command::new(roce_bin())
                .args(["--netns", &self.router_ns, "impair", "-i", i, "--off"])
                .output();
        }
        for (ns, ifname) in &self.hosts {
            if roce::loader::pin_dir(ifname).exists() {
                let _ = Command::new(roce_bin())
                    .args(["--netns", ns, "unload", "-i", ifname])
                    .output();
            }
        }
    }
}

fn roce_ok(ns: &str, line: &str) -> Value {
    let o = Command::new(roce_bin())
        .args(["-j", "--netns", ns])
        .args(line.split_whitespace())
        .output()
        .expect("run roce");
    assert!(
        o.status.success(),
        "roce {line}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// Counters that must not move under loss: loss costs retransmissions, never a failed or
/// refused work request.
const NEVER: [&str; 13] = [
    "retry_exceeded_err",
    "req_transport_retries_exceeded",
    "retry_rnr_exceeded_err",
    "send_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "cq_overflow",
];

#[test]
#[ignore = "minutes long: cargo test -p roce-tests --test soak -- --ignored (as root)"]
#[allow(clippy::too_many_lines, reason = "one soak procedure")]
fn mixed_traffic_at_one_percent_loss() {
    require_root();
    let secs: u64 = std::env::var("ROCE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(420);
    assert!(
        (WARMUP_SECS + 3 * SAMPLE_SECS..=570).contains(&secs),
        "ROCE_SOAK_SECS is {secs}: at least {} (warm-up and three samples), at most 570",
        WARMUP_SECS + 3 * SAMPLE_SECS
    );
    // Eight hosts around one router: four client/server pairs, one per operation, each pair on
    // its own interfaces (one endpoint process per interface queue). Host 2i talks to host
    // 2i+1; both directions leave the router through an impaired interface.
    let net = Routed::new(
        &tag("soak"),
        8,
        &VethOptions {
            mtu: 3000,
            subnet: 68,
            ..VethOptions::default()
        },
    )
    .expect("routed topology");
    let guard = Guard {
        router_ns: net.router_netns.clone(),
        ifs: net.sender_side_ifs.clone(),
        hosts: net
            .senders
            .iter()
            .map(|h| (h.netns.clone(), h.ifname.clone()))
            .collect(),
    };
    for i in &guard.ifs {
        roce_ok(&net.router_netns, &format!("impair -i {i} --drop {LOSS}"));
    }
    let flows = [
        ("write", "-s 65536 --span 4194304"),
        ("read", "-s 65536 --span 4194304"),
        ("send", "-s 16384 --span 1048576"),
        ("atomic", ""),
    ];
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for (k, (op, extra)) in flows.iter().enumerate() {
        let (c, s) = (&net.senders[2 * k], &net.senders[2 * k + 1]);
        let common = format!("perf {op} {extra} -q 2 -m 2048");
        // The SEND server keeps more receives posted than the client has SENDs in flight.
        let srv_t = if *op == "send" { 32 } else { 8 };
        servers.push(Endpoint::spawn(
            &format!("{op} server"),
            &s.netns,
            &format!("{common} -t {srv_t} -d {}", s.ifname),
        ));
        thread::sleep(Duration::from_millis(300));
        clients.push(Endpoint::spawn(
            &format!("{op} client"),
            &c.netns,
            &format!(
                "{common} -t 8 -D {secs} --progress {SAMPLE_SECS} -d {} {}",
                c.ifname, s.ipv4
            ),
        ));
    }
    let start = Instant::now();
    let mut rss: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut last_done: Vec<Option<Vec<u64>>> = vec![None; clients.len()];
    let mut samples = 0;
    // Sample until the clients are near their end (the last progress line comes at most one
    // interval before it).
    while start.elapsed() < Duration::from_secs(secs - SAMPLE_SECS / 2) {
        thread::sleep(Duration::from_secs(SAMPLE_SECS));
        let t = start.elapsed().as_secs();
        if t >= secs {
            break;
        }
        samples += 1;
        for e in clients.iter_mut().chain(servers.iter_mut()) {
            assert!(e.running(), "{} exited early: {}", e.name, e.stderr());
            rss.entry(e.name.clone())
                .or_default()
                .push((t, e.rss_kib()));
        }
        // Progress: each QP completed more since the last sample.
        for (k, c) in clients.iter().enumerate() {
            let now = c.done();
            if let (Some(prev), Some(cur)) = (&last_done[k], &now) {
                for (q, (a, b)) in prev.iter().zip(cur).enumerate() {
                    assert!(
                        b > a,
                        "{} QP {q} is stuck: {a} completed at the last sample, {b} now \
                         ({t} s in): {}",
                        c.name,
                        c.stderr()
                    );
                }
            }
            if now.is_some() {
                last_done[k] = now;
            }
        }
        eprintln!(
            "soak {t:>4} s: completed {:?}; RSS KiB {:?}",
            last_done,
            rss.iter()
                .map(|(n, v)| (n.as_str(), v.last().map(|x| x.1)))
                .collect::<Vec<_>>()
        );
    }
    assert!(samples >= 3, "only {samples} samples");
    let mut reports = Vec::new();
    for (c, s) in clients.into_iter().zip(servers) {
        let name = c.name.clone();
        let cj = c.finish(Duration::from_secs(60));
        let sj = s.finish(Duration::from_secs(30));
        reports.push((name, cj, sj));
    }
    let total = start.elapsed();
    // Memory: after the warm-up, every endpoint stays within 5 % of its resident size then.
    let mut summary = Vec::new();
    for (name, v) in &rss {
        let base = v
            .iter()
            .find(|(t, _)| *t >= WARMUP_SECS)
            .unwrap_or_else(|| panic!("no sample after the warm-up for {name}"))
            .1;
        let max = v
            .iter()
            .filter(|(t, _)| *t >= WARMUP_SECS)
            .map(|x| x.1)
            .max()
            .unwrap();
        let last = v.last().unwrap().1;
        summary.push(format!(
            "{name}: {base} KiB after warm-up, max {max}, last {last} (+{:.2} %)",
            (max as f64 / base as f64 - 1.0) * 100.0
        ));
        assert!(
            (max as f64) < base as f64 * 1.05,
            "{name}'s RSS grew from {base} KiB to {max} KiB after the warm-up: {v:?}"
        );
    }
    // Completions, data and counters.
    for (name, c, s) in &reports {
        assert_eq!(c["verified"], true, "{name}: {c}");
        assert_eq!(s["verified"], true, "{name} server: {s}");
        assert_eq!(
            c["posted"], c["messages"],
            "{name}: posted != completed: {c}"
        );
        assert_eq!(c["atomic_mismatches"], 0, "{name}: {c}");
        assert_eq!(
            s["messages"], c["messages"],
            "{name}: the server counted {} messages, the client {}",
            s["messages"], c["messages"]
        );
        let mut retries = 0;
        for (side, v) in [("client", c), ("server", s)] {
            for q in v["cc"].as_array().expect("per-QP report") {
                for n in NEVER {
                    assert_eq!(
                        q["transport"][n], 0,
                        "{name} {side} QP {}: {n} moved: {q}",
                        q["qpn"]
                    );
                }
                retries += q["transport"]["completer_retry_err"].as_u64().unwrap_or(0);
            }
        }
        assert!(retries > 0, "{name}: 1 % loss and no retry at all");
        summary.push(format!(
            "{name}: {} WRs, {:.1} MB/s, {retries} retries",
            c["messages"], c["bw_mb_per_sec"]
        ));
    }
    let dropped: u64 = guard
        .ifs
        .iter()
        .map(|i| {
            roce_ok(&net.router_netns, &format!("impair -i {i} --show"))["impair"]["dropped"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(dropped > 0, "the router dropped nothing");
    eprintln!(
        "soak: {:.0} s in all, flows {secs} s, {samples} samples, {dropped} packets dropped by \
         the router\n  {}",
        total.as_secs_f64(),
        summary.join("\n  ")
    );
    drop(guard);
}
