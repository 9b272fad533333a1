//! `cargo xtask bench e2e`: the endpoint against a plain kernel UDP program over the same veth, in
//! the same run. Needs root and the release `roce` binary (xtask builds it; or set ROCE_BIN).
//!
//! - WRITE goodput (`roce perf write -D`) for 64 B, 1 KiB, 64 KiB and 1 MiB messages, against a UDP
//!   blaster whose datagrams carry the same payload per packet: the message size up to the
//!   path MTU (2048), so neither side fragments. Goodput is what the receiver got.
//! - Scaling: 64 KiB WRITEs over 1, 16, 256, 1024 and 16,384 QPs (`roce perf -q N -t 16
//!   --shared-mr`), against 1 QP in the same run, the client's peak RSS (`peak_rss_kib`) at each
//!   count and the RSS per QP, (RSS(N) - RSS(1)) / (N - 1).
//! - Ping-pong round trip of 64-byte messages, p50 and p99: `roce pingpong` against a UDP echo.
//! - Multi-queue: 64 KiB WRITEs over 16 and 1024 QPs on a veth pair with two queues per end,
//!   `--sharded` (one transport per queue) against 16 QPs sharing one transport.
//! - Programs through one engine per interface (issue 22, docs/multiprocess.md): 64 KiB WRITEs
//!   of one `roce perf --engine` program against the same program in process (what one
//!   program alone gets, before and after the engine), and eight programs at once through the
//!   same two engines, their aggregate against one program's.
//!
//! Each figure is the median of REPS runs, with min and max. `ROCE_BENCH_E2E=pingpong` runs the
//! ping-pong rows alone (under a minute); `ROCE_BENCH_E2E=engine` runs the
//! engine rows alone (about 2 minutes).

use std::{
    net::{SocketAddr, UdpSocket},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use roce::{
    loader::{self, LoadOptions},
    netns::{self, VethOptions, VethPair},
};
use roce_tests::{require_root, tag};
use serde_json::{Value, json};

const REPS: usize = 3;
/// The QP counts of the scaling rows: up to the device's default limit
/// (`DeviceConfig::max_qp`, issue 20).
const SCALING_QPS: [u32; 5] = [1, 16, 256, 1024, 16384];
const SECS: f64 = 2.0;

fn roce_bin() -> std::path::PathBuf {
    std::env::var_os("ROCE_BIN").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/roce"),
        std::path::PathBuf::from,
    )
}

fn pair_json(pair: &VethPair, args: &str) -> Value {
    let server = Command::new(roce_bin())
        .args(["-j", "--netns", &pair.b.netns])
        .args(args.split_whitespace())
        .args(["-d", &pair.b.ifname])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    std::thread::sleep(Duration::from_millis(300));
    let client = Command::new(roce_bin())
        .args(["-j", "--netns", &pair.a.netns])
        .args(args.split_whitespace())
        .args(["-d", &pair.a.ifname, &pair.b.ipv4.to_string()])
        .output()
        .expect("client");
    let s = server.wait_with_output().expect("server exit");
    assert!(
        client.status.success() && s.status.success(),
        "{args}: {}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    serde_json::from_slice(&client.stdout).expect("client JSON")
}

/// UDP goodput in MB/s (2^20) with `payload`-byte datagrams sent flat out for SECS.
fn udp_blast(pair: &VethPair, payload: usize) -> f64 {
    let (a_ip, b_ip) = (pair.a.ipv4, pair.b.ipv4);
    let rx = {
        let ns = pair.b.netns.clone();
        std::thread::spawn(move || {
            netns::enter(&ns).unwrap();
            let s = UdpSocket::bind(SocketAddr::from((b_ip, 9999))).unwrap();
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &(8 << 20));
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut buf = vec![0u8; 65536];
            let mut bytes = 0u64;
            let mut first: Option<Instant> = None;
            let mut last = Instant::now();
            loop {
                match s.recv(&mut buf) {
                    Ok(n) => {
                        first.get_or_insert_with(Instant::now);
                        last = Instant::now();
                        bytes += n as u64;
                    }
                    Err(_) if first.is_some() => break,
                    Err(_) => {}
                }
            }
            let secs = first.map_or(1.0, |f| (last - f).as_secs_f64().max(1e-6));
            bytes as f64 / secs / 1_048_576.0
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let ns = pair.a.netns.clone();
    netns::in_netns(&ns, move || {
        let s = UdpSocket::bind(SocketAddr::from((a_ip, 0))).unwrap();
        let buf = vec![0x5au8; payload];
        let end = Instant::now() + Duration::from_secs_f64(SECS);
        while Instant::now() < end {
            for _ in 0..64 {
                let _ = s.send_to(&buf, SocketAddr::from((b_ip, 9999)));
            }
        }
    })
    .unwrap();
    rx.join().unwrap()
}

/// UDP echo round trips of 64 bytes: (p50, p99) in µs.
fn udp_pingpong(pair: &VethPair, iters: usize) -> (f64, f64) {
    let (a_ip, b_ip) = (pair.a.ipv4, pair.b.ipv4);
    let ns_b = pair.b.netns.clone();
    let echo = std::thread::spawn(move || {
        netns::enter(&ns_b).unwrap();
        let s = UdpSocket::bind(SocketAddr::from((b_ip, 9998))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let ns_a = pair.a.netns.clone();
    let mut rtts = netns::in_netns(&ns_a, move || {
        let s = UdpSocket::bind(SocketAddr::from((a_ip, 0))).unwrap();
        s.connect(SocketAddr::from((b_ip, 9998))).unwrap();
        let mut buf = [0u8; 64];
        let mut rtts = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            s.send(&buf).unwrap();
            s.recv(&mut buf).unwrap();
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        rtts
    })
    .unwrap();
    echo.join().unwrap();
    rtts.sort_by(f64::total_cmp);
    (rtts[rtts.len() / 2], rtts[(rtts.len() * 99) / 100])
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// roce_xdp on both ends of `pair` for the whole run.
fn load_both(pair: &VethPair) {
    for end in [&pair.a, &pair.b] {
        let (ns, i) = (end.netns.clone(), end.ifname.clone());
        let opts = LoadOptions {
            netns: Some(ns.clone()),
            ..LoadOptions::default()
        };
        netns::in_netns(&ns, move || loader::load(&i, &opts))
            .unwrap()
            .unwrap();
    }
}

/// Median, min and max goodput (MB/s) of REPS runs of `args` over `pair`.
fn goodput(pair: &VethPair, args: &str) -> (f64, f64, f64) {
    stats(
        (0..REPS)
            .map(|_| pair_json(pair, args)["bw_mb_per_sec"].as_f64().unwrap())
            .collect(),
    )
}

fn main() {
    require_root();
    assert!(
        roce_bin().exists(),
        "no roce binary at {} (cargo build --release -p roce-user)",
        roce_bin().display()
    );
    if std::env::var("ROCE_BENCH_E2E").as_deref() == Ok("engine") {
        let (mut table, mut rows) = (String::new(), Vec::new());
        engine_rows(&mut table, &mut rows);
        print!("{table}");
        write_rows(&rows);
        return;
    }
    let pair = VethPair::new(
        &tag("be"),
        &VethOptions {
            mtu: 3000,
            subnet: 95,
            ..VethOptions::default()
        },
    )
    .expect("veth");
    load_both(&pair);
    let mut rows = Vec::new();
    let mut table = String::from(
        "| measure | roce (median, min..max) | UDP baseline | ratio | target |\n|---|---|---|---|---|\n",
    );
    if std::env::var("ROCE_BENCH_E2E").as_deref() == Ok("pingpong") {
        pingpong_rows(&pair, &mut table, &mut rows);
        for end in [&pair.a, &pair.b] {
            let _ = loader::unload(&end.ifname);
        }
        print!("{table}");
        write_rows(&rows);
        return;
    }
    for size in [64usize, 1024, 65536, 1 << 20] {
        let r: Vec<f64> = (0..REPS)
            .map(|_| {
                pair_json(
                    &pair,
                    &format!("perf write -s {size} -D {SECS} -m 2048 -t 128"),
                )["bw_mb_per_sec"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        let u: Vec<f64> = (0..REPS)
            .map(|_| udp_blast(&pair, size.min(2048)))
            .collect();
        let ((rm, rmin, rmax), (um, _, _)) = (stats(r), stats(u));
        let ratio = rm / um.max(1e-9);
        let target = if size >= 1024 { "≥ 1.0x" } else { "-" };
        let met = if size < 1024 {
            ""
        } else if ratio >= 1.0 {
            " (met)"
        } else {
            " (NOT met)"
        };
        table.push_str(&format!("| WRITE goodput {size} B, MB/s | {rm:.1} ({rmin:.1}..{rmax:.1}) | {um:.1} | {ratio:.2}x | {target}{met} |\n"));
        rows.push(json!({"name": format!("WRITE goodput {size} B"), "value": rm, "unit": "MB/s", "baseline": um, "ratio": ratio, "target": target, "min": rmin, "max": rmax}));
    }
    // Scaling: the same 64 KiB WRITE load spread over 1..16,384 QPs (16 WRs posted per QP),
    // against 1 QP in the same run; and the client's peak RSS at each count. All QPs share one
    // pair of buffers (`--shared-mr`), so what the RSS gains per QP is the QP's own memory.
    let mut one = (0.0, 0.0);
    for q in SCALING_QPS {
        let runs: Vec<Value> = (0..REPS)
            .map(|_| {
                pair_json(
                    &pair,
                    &format!(
                        "perf write -s 65536 -D {SECS} -m 2048 -t 16 -q {q} --max-qp {q} --shared-mr"
                    ),
                )
            })
            .collect();
        let bw = stats(
            runs.iter()
                .map(|v| v["bw_mb_per_sec"].as_f64().unwrap())
                .collect(),
        );
        let rss = stats(
            runs.iter()
                .map(|v| v["peak_rss_kib"].as_f64().unwrap() / 1024.0)
                .collect(),
        );
        if q == 1 {
            one = (bw.0, rss.0);
        }
        let ratio = bw.0 / one.0.max(1e-9);
        let (target, met) = if q >= 1024 {
            ("≥ 0.9x", if ratio >= 0.9 { " (met)" } else { " (NOT met)" })
        } else {
            ("-", "")
        };
        table.push_str(&format!(
            "| WRITE goodput 64 KiB over {q} QPs, MB/s | {:.1} ({:.1}..{:.1}) | {:.1} (1 QP) | {ratio:.2}x | {target}{met} |\n",
            bw.0, bw.1, bw.2, one.0
        ));
        rows.push(json!({"name": format!("WRITE goodput 64 KiB, {q} QPs"), "value": bw.0, "unit": "MB/s", "baseline": one.0, "ratio": ratio, "target": target, "min": bw.1, "max": bw.2}));
        let mem_ratio = rss.0 / one.1.max(1e-9);
        table.push_str(&format!(
            "| peak RSS of the client with {q} QPs, MiB | {:.1} ({:.1}..{:.1}) | {:.1} (1 QP) | {mem_ratio:.2}x | - |\n",
            rss.0, rss.1, rss.2, one.1
        ));
        rows.push(json!({"name": format!("peak RSS, {q} QPs"), "value": rss.0, "unit": "MiB", "baseline": one.1, "ratio": mem_ratio, "target": "-", "min": rss.1, "max": rss.2}));
        if q > 1 {
            // What each QP beyond the first adds: (RSS(N) - RSS(1)) / (N - 1).
            let per_qp = (rss.0 - one.1) * 1024.0 / f64::from(q - 1);
            let (target, met) = if q >= 1024 {
                (
                    "≤ 32 KiB",
                    if per_qp <= 32.0 {
                        " (met)"
                    } else {
                        " (NOT met)"
                    },
                )
            } else {
                ("-", "")
            };
            table.push_str(&format!(
                "| RSS per QP with {q} QPs, KiB | {per_qp:.1} | - | - | {target}{met} |\n"
            ));
            rows.push(json!({"name": format!("RSS per QP, {q} QPs"), "value": per_qp, "unit": "KiB", "baseline": null, "ratio": null, "target": target, "min": per_qp, "max": per_qp}));
        }
    }
    pingpong_rows(&pair, &mut table, &mut rows);
    for end in [&pair.a, &pair.b] {
        let _ = loader::unload(&end.ifname);
    }
    // Multi-queue: a pair with two RX/TX queues per end. The baseline is one transport that
    // both queues' engine threads share (the default); sharded, each queue's engine owns its
    // own transport (`--sharded`: QP k on queue k mod 2, no lock shared between queues).
    let mq = VethPair::new(
        &tag("bm"),
        &VethOptions {
            mtu: 3000,
            subnet: 96,
            queues: 2,
        },
    )
    .expect("two-queue veth");
    load_both(&mq);
    let write = |q: u32, extra: &str| {
        format!("perf write -s 65536 -D {SECS} -m 2048 -t 16 -q {q} --max-qp {q} {extra}")
    };
    let shared = goodput(&mq, &write(16, ""));
    for q in [16u32, 1024] {
        let (m, min, max) = goodput(&mq, &write(q, "--sharded"));
        let ratio = m / shared.0.max(1e-9);
        table.push_str(&format!(
            "| WRITE goodput 64 KiB over {q} QPs, 2 queues sharded, MB/s | {m:.1} ({min:.1}..{max:.1}) | {:.1} (16 QPs, one shared transport, {:.1}..{:.1}) | {ratio:.2}x | - |\n",
            shared.0, shared.1, shared.2
        ));
        rows.push(json!({"name": format!("WRITE goodput 64 KiB, {q} QPs, 2 queues sharded"), "value": m, "unit": "MB/s", "baseline": shared.0, "ratio": ratio, "target": "-", "min": min, "max": max}));
    }
    for end in [&mq.a, &mq.b] {
        let _ = loader::unload(&end.ifname);
    }
    engine_rows(&mut table, &mut rows);
    print!("{table}");
    println!(
        "(median of {REPS}; veth MTU 3000, path MTU 2048; UDP datagrams carry min(size, 2048) bytes)"
    );
    write_rows(&rows);
}

/// The ping-pong rows: REPS runs each of `roce pingpong -s 64 -n 2000` and of a kernel UDP
/// ping-pong of 64 bytes over `pair` (roce_xdp loaded on both ends), taking turns; p50 against
/// issue 20's target of 0.9x the kernel's, p99 without a target.
fn pingpong_rows(pair: &VethPair, table: &mut String, rows: &mut Vec<Value>) {
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut u50s = Vec::new();
    let mut u99s = Vec::new();
    for _ in 0..REPS {
        let v = pair_json(pair, "pingpong -s 64 -n 2000");
        p50s.push(v["latency_us"]["p50"].as_f64().unwrap());
        p99s.push(v["latency_us"]["p99"].as_f64().unwrap());
        let (u50, u99) = udp_pingpong(pair, 2000);
        u50s.push(u50);
        u99s.push(u99);
    }
    for (name, r, u) in [("ping-pong p50", p50s, u50s), ("ping-pong p99", p99s, u99s)] {
        let ((rm, rmin, rmax), (um, _, _)) = (stats(r), stats(u));
        let ratio = rm / um.max(1e-9);
        let target = if name.ends_with("p50") {
            "≤ 0.9x"
        } else {
            "-"
        };
        let met = if target == "-" {
            ""
        } else if ratio <= 0.9 {
            " (met)"
        } else {
            " (NOT met)"
        };
        table.push_str(&format!("| {name} 64 B, µs | {rm:.1} ({rmin:.1}..{rmax:.1}) | {um:.1} | {ratio:.2}x | {target}{met} |\n"));
        rows.push(json!({"name": format!("{name} 64 B"), "value": rm, "unit": "us", "baseline": um, "ratio": ratio, "target": target, "min": rmin, "max": rmax}));
    }
}

/// Writes `rows` to `$ROCE_BENCH_OUT/e2e.json` for `cargo xtask bench`, when it asks.
fn write_rows(rows: &[Value]) {
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        std::fs::write(
            std::path::Path::new(&dir).join("e2e.json"),
            serde_json::to_string_pretty(rows).unwrap(),
        )
        .unwrap();
    }
}

/// The WRITE test of the engine rows: 64 KiB messages, 16 in flight, for SECS.
const ENGINE_WRITE: &str = "perf write -s 65536 -t 16 -m 2048";

/// `n` `roce perf write` programs at once from `pair.a` to `pair.b` (ports from 18_800), each
/// with `extra` arguments; returns their goodputs (MB/s).
fn programs(pair: &VethPair, n: u16, extra: &str) -> Vec<f64> {
    let perf = |ns: &str, ifname: &str, port: u16, host: Option<String>| {
        Command::new(roce_bin())
            .args(["-j", "--netns", ns])
            .args(ENGINE_WRITE.split_whitespace())
            .args([
                "-D",
                &SECS.to_string(),
                "-p",
                &port.to_string(),
                "-d",
                ifname,
            ])
            .args(extra.split_whitespace())
            .args(host)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("roce perf")
    };
    let servers: Vec<_> = (0..n)
        .map(|i| {
            roce_tests::child::Reaper::from(perf(&pair.b.netns, &pair.b.ifname, 18_800 + i, None))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let clients: Vec<_> = (0..n)
        .map(|i| {
            perf(
                &pair.a.netns,
                &pair.a.ifname,
                18_800 + i,
                Some(pair.b.ipv4.to_string()),
            )
        })
        .collect();
    let bw: Vec<f64> = clients
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().expect("client");
            assert!(
                o.status.success(),
                "perf client: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let v: Value = serde_json::from_slice(&o.stdout).expect("client JSON");
            v["bw_mb_per_sec"].as_f64().expect("bw_mb_per_sec")
        })
        .collect();
    for s in servers {
        let o = roce_tests::child::finish_within(s, Duration::from_secs(30), "perf server");
        assert!(
            o.status.success(),
            "perf server: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    bw
}

/// Issue 22's rows: one program through the engines against the same program in process, and
/// eight programs through the same engines against one.
fn engine_rows(table: &mut String, rows: &mut Vec<Value>) {
    let pair = VethPair::new(
        &tag("bg"),
        &VethOptions {
            mtu: 3000,
            subnet: 97,
            ..VethOptions::default()
        },
    )
    .expect("veth");
    let alone = stats((0..REPS).map(|_| programs(&pair, 1, "")[0]).collect());
    // One engine per end, kept alive (its linger) between the runs that use it.
    let mut engines = Vec::new();
    for end in [&pair.a, &pair.b] {
        let c = Command::new(roce_bin())
            .args([
                "--netns",
                &end.netns,
                "engine",
                "-i",
                &end.ifname,
                "--linger",
                "30",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("roce engine");
        let mut r = roce_tests::child::Reaper::from(c);
        let path = roce_tests::engine::socket_path(&end.netns, &end.ifname);
        roce_tests::engine::wait_listening(&path, Duration::from_secs(20), &mut r);
        engines.push((r, roce_tests::engine::SocketGuard(path)));
    }
    let one = stats(
        (0..REPS)
            .map(|_| programs(&pair, 1, "--engine")[0])
            .collect(),
    );
    let eight = stats(
        (0..REPS)
            .map(|_| programs(&pair, 8, "--engine").iter().sum())
            .collect(),
    );
    drop(engines);
    for (name, v, base, base_name) in [
        (
            "WRITE goodput 64 KiB, 1 program through the engine",
            one,
            alone,
            "the same program in process",
        ),
        (
            "WRITE goodput 64 KiB, 8 programs through one engine, aggregate",
            eight,
            one,
            "1 program through the engine",
        ),
    ] {
        let ratio = v.0 / base.0.max(1e-9);
        table.push_str(&format!(
            "| {name}, MB/s | {:.1} ({:.1}..{:.1}) | {:.1} ({base_name}) | {ratio:.2}x | - |\n",
            v.0, v.1, v.2, base.0
        ));
        rows.push(json!({"name": name, "value": v.0, "unit": "MB/s", "baseline": base.0, "ratio": ratio, "target": "-", "min": v.1, "max": v.2}));
    }
}
