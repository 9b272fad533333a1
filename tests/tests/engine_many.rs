//! Issue 22's second proof: eight programs on one interface through one `roce engine`, each
//! with verified WRITE or READ traffic of its own, some to peers across the veth (served by
//! the engine of the other end), some in loopback pairs on the same interface; one of them
//! killed with SIGKILL mid-run. The other seven finish with every byte checked, and the
//! engine reclaims what the dead one held: its connection, QP, CQ, MR and PD (the engine's
//! status counts go back to what they were before the first program), and its QPN leaves the
//! counters the engine publishes. Root; the namespaces and veths are the test's own, every
//! process is killed by PID if the test fails.

use std::{
    io::{BufRead as _, BufReader},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use roce::api::remote::{EngineClient, EngineStatus};
use roce_tests::{
    child::{Reaper, finish_within, json_ok, spawn},
    engine::start_engine,
    require_root, roce, veth_pair,
};
use serde_json::Value;

/// Polls `c`'s engine until its status is `want`, for at most `limit`.
fn wait_status(c: &mut EngineClient, want: EngineStatus, limit: Duration, what: &str) {
    let t0 = Instant::now();
    loop {
        let st = c.status().expect("status");
        if st == want {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: the engine holds {st:?}, not {want:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `roce stats --qps` JSON `v` has the section of QP `qpn` (`qp_0x0000NN`).
fn mentions_qpn(v: &Value, qpn: u64) -> bool {
    v.get(format!("qp_0x{qpn:06x}")).is_some()
}

/// Polls `roce stats -i ifname` in `ns` until the QP `qpn` is (`present`) or is not among the
/// counters the engine publishes, for at most `limit`.
fn wait_published(ns: &str, ifname: &str, qpn: u64, present: bool, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let o = roce(&["-j", "--netns", ns, "stats", "--qps", "-i", ifname]);
        assert!(
            o.status.success(),
            "roce stats: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_slice(&o.stdout).expect("stats JSON");
        if mentions_qpn(&v, qpn) == present {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "QP {qpn:#x} {} the published counters: {v}",
            if present { "never reached" } else { "stays in" }
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// What a client's progress lines said: its QPN and WRs done, from the first report on.
struct Progress {
    rx: mpsc::Receiver<(u64, u64)>,
    qpn: Option<u64>,
    done: u64,
}

impl Progress {
    /// Reads the `{"progress": ...}` lines of `child`'s stderr on a thread of its own.
    fn watch(child: &mut Reaper) -> Self {
        let err = child.take_stderr().expect("stderr");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("{line}");
                    continue;
                };
                let p = &v["progress"];
                let first = |k: &str| p[k].get(0).and_then(Value::as_u64);
                if let (Some(q), Some(d)) = (first("qpn"), first("done"))
                    && tx.send((q, d)).is_err()
                {
                    break;
                }
            }
        });
        Self {
            rx,
            qpn: None,
            done: 0,
        }
    }

    /// Takes in what came since the last call.
    fn update(&mut self) {
        while let Ok((q, d)) = self.rx.try_recv() {
            self.qpn = Some(q);
            self.done = d;
        }
    }
}

/// One `roce perf` test: its server and its client, and where each runs.
struct Run {
    what: String,
    server: Reaper,
    client: Reaper,
    progress: Progress,
    iters: u64,
}

/// Eight programs on end A's interface: four clients to servers on end B (two WRITE, two
/// READ; one WRITE client is the victim) and two loopback pairs on A (a WRITE and a READ,
/// server and client both on A). Every survivor verifies every byte (`--span`). The victim
/// runs far more messages than it can finish and is killed once it and every survivor
/// reported completed work, so it dies mid-run with the others running beside it.
#[test]
fn eight_programs_share_one_interface_and_one_killed_is_reclaimed() {
    require_root();
    let t_start = Instant::now();
    let pair = veth_pair("engm", 110);
    let (a, b) = (&pair.a, &pair.b);
    let limit = Duration::from_secs(30);
    // Each engine gets its watcher at once: an engine without a client leaves after its
    // linger, and the other engine's start may take longer than that on a loaded machine.
    let (engine_a, path_a, _ga) = start_engine(&a.netns, &a.ifname, "2", limit);
    let mut watch_a = EngineClient::connect_at(&path_a).expect("watcher of A");
    let (engine_b, path_b, _gb) = start_engine(&b.netns, &b.ifname, "2", limit);
    let mut watch_b = EngineClient::connect_at(&path_b).expect("watcher of B");
    // What the engines hold before any program: the watcher, no object.
    let base_a = watch_a.status().expect("status A");
    let base_b = watch_b.status().expect("status B");
    let empty = EngineStatus {
        clients: 1,
        ..EngineStatus::default()
    };
    assert_eq!(base_a, empty, "engine A before the first program");
    assert_eq!(base_b, empty, "engine B before the first program");

    let perf = |ns: &str, ifname: &str, args: &str, port: u16, host: Option<String>| {
        let mut v: Vec<String> = args.split_whitespace().map(String::from).collect();
        v.extend(["-d", ifname, "--engine", "-p", &port.to_string()].map(String::from));
        v.extend(host);
        spawn(ns, &v)
    };
    let write = "perf write -s 4096 -n 4000 -t 16 --span 65536";
    let read = "perf read -s 4096 -n 4000 -t 16 --span 65536";
    let victim_args = "perf write -s 4096 -n 100000000 -t 16 --span 65536";
    let b_ip = Some(b.ipv4.to_string());
    let a_ip = Some(a.ipv4.to_string());
    // (args, server on B (true) or A, victim)
    let plan = [
        (victim_args, true, true),
        (write, true, false),
        (read, true, false),
        (read, true, false),
        (write, false, false),
        (read, false, false),
    ];
    let mut runs: Vec<Run> = Vec::new();
    for (i, (args, remote, _)) in plan.iter().enumerate() {
        let port = 18_710 + i as u16;
        let server = if *remote {
            perf(&b.netns, &b.ifname, args, port, None)
        } else {
            perf(&a.netns, &a.ifname, args, port, None)
        };
        let client_args = format!("{args} --progress 0.1");
        let mut client = perf(
            &a.netns,
            &a.ifname,
            &client_args,
            port,
            if *remote { b_ip.clone() } else { a_ip.clone() },
        );
        let progress = Progress::watch(&mut client);
        let iters = args
            .split_whitespace()
            .skip_while(|w| *w != "-n")
            .nth(1)
            .and_then(|w| w.parse().ok())
            .expect("-n");
        runs.push(Run {
            what: format!(
                "{args} ({})",
                if *remote { "A to B" } else { "loopback on A" }
            ),
            server,
            client,
            progress,
            iters,
        });
    }

    // Eight programs on A: the victim, three clients to B, two loopback pairs. Wait until
    // the victim and every client still running reported work done.
    let t0 = Instant::now();
    loop {
        let st = watch_a.status().expect("status A");
        for r in &mut runs {
            r.progress.update();
        }
        let started = runs
            .iter_mut()
            .all(|r| r.progress.done > 0 || r.client.exited());
        if runs[0].progress.done > 0 && started {
            eprintln!("all started: engine A holds {st:?}");
            break;
        }
        assert!(
            !runs[0].client.exited(),
            "the victim exited before it was killed"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the eight programs did not all start: {st:?}, done {:?}",
            runs.iter().map(|r| r.progress.done).collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(10));
    }
    let victim_qpn = runs[0].progress.qpn.expect("the victim's QPN");
    wait_published(&a.netns, &a.ifname, victim_qpn, true, limit);
    let mut running = 0;
    for r in &mut runs[1..] {
        if !r.client.exited() {
            running += 1;
        }
    }
    let before = watch_a.status().expect("status A");
    runs[0].client.kill().expect("SIGKILL the victim");
    eprintln!(
        "killed the victim (QP {victim_qpn:#x}, {} WRs done) at {:.1} s with {running} of 5 \
         surviving clients still running; engine A held {before:?}",
        runs[0].progress.done,
        t_start.elapsed().as_secs_f64()
    );

    // The engine lets go of the dead program's QP while the others run on.
    wait_published(&a.netns, &a.ifname, victim_qpn, false, limit);
    let mut still = 0;
    for r in &mut runs[1..] {
        if !r.client.exited() {
            still += 1;
        }
    }
    eprintln!(
        "QP {victim_qpn:#x} gone from the published counters at {:.1} s, {still} of 5 \
         surviving clients still running",
        t_start.elapsed().as_secs_f64()
    );

    // The seven others finish, every byte right.
    let victim = runs.remove(0);
    for r in runs {
        let c = finish_within(r.client, Duration::from_secs(80), &r.what);
        let s = finish_within(r.server, Duration::from_secs(30), &r.what);
        let (c, s) = (
            json_ok(&c, &format!("client {}", r.what)),
            json_ok(&s, &format!("server {}", r.what)),
        );
        for (side, v) in [("client", &c), ("server", &s)] {
            assert_eq!(v["verified"], true, "{side} of {}: {v}", r.what);
            assert_eq!(v["role"], side, "{v}");
        }
        assert_eq!(c["messages"], r.iters, "{}: {c}", r.what);
        eprintln!(
            "{}: verified, client {:.2} MB/s",
            r.what,
            c["bw_mb_per_sec"].as_f64().unwrap_or(0.0)
        );
    }

    // The victim's peer on B lost its client; it is ours to end.
    let mut vserver = victim.server;
    vserver.kill().expect("kill the victim's server");

    // Everything the dead program held is gone: the engines hold what they held before the
    // first program, and the victim's QPN left the published counters.
    wait_status(&mut watch_a, base_a, limit, "engine A after all");
    wait_status(&mut watch_b, base_b, limit, "engine B after all");
    drop((watch_a, watch_b));
    for (engine, want, what) in [(engine_a, 9, "engine A"), (engine_b, 5, "engine B")] {
        let out = finish_within(engine, Duration::from_secs(30), what);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("engine JSON");
        assert_eq!(report["connections"], want, "{what}: {report}");
    }
    eprintln!("whole test: {:.1} s", t_start.elapsed().as_secs_f64());
}
