//! `cargo xtask bench verbs`: Debian's unmodified perftest on the drop-in libibverbs against
//! `roce perf` on the same veth pair, in the same run (issue 17). Needs root, perftest
//! (`cargo xtask setup`) and the release `roce` with the library and its two stand-ins built
//! beside it (xtask builds them; or set ROCE_BIN to a `roce` that has them).
//!
//! - WRITE bandwidth: `ib_write_bw -D SECS -s 65536 -m 2048` with both ends started through
//!   `roce exec` (so on roce-xdp's libibverbs.so.1), against `roce perf write` with the same
//!   size, duration, path MTU and tx depth (128, perftest's default). perftest measures between
//!   its margins (`-f 1`: from 1 s after the start to 1 s before the end); `roce perf` over the
//!   whole run. Both report MB/s of 2^20 bytes. Target: at least 0.9x.
//! - WRITE latency: `ib_write_lat -s 2 -n ITERS` (its `t_typical`, the median half round trip)
//!   against `roce perf write --lat -s 2 -n ITERS` (its `latency_us.p50`, the same quantity).
//!   Target: at most 1.1x.
//!
//! Each perftest figure is taken with the library's default engine (`ROCE_ENGINE=inline`: the
//! program's threads drive the transport from `ibv_poll_cq`) and, for comparison, with
//! `roce exec --engine threads`. The runs are interleaved (roce perf, perftest inline, perftest
//! threads, repeated REPS times) and each figure is the median of its REPS runs, with min and
//! max.

use std::time::{Duration, Instant};

use roce::netns::{VethEnd, VethOptions, VethPair};
use roce_tests::{child, require_root, roce_bin, roce_ok, tag};
use serde_json::{Value, json};

const REPS: usize = 3;
/// Seconds of one bandwidth run (`-D`), for both programs.
const SECS: u32 = 4;
/// Round trips of one latency run (`-n`), for both programs.
const LAT_ITERS: u32 = 10_000;
/// The longest one run may take before it counts as stuck.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// The library's engine model in a perftest run (`roce exec --engine`).
#[derive(Clone, Copy)]
enum Engine {
    Inline,
    Threads,
}

impl Engine {
    const fn flag(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Threads => "threads",
        }
    }
}

/// Checks that the library and both stand-ins are built next to the `roce` under test (what
/// `roce exec` links into roce-verbs/), and that perftest is installed.
fn require_libraries() {
    let bin = roce_bin();
    let dir = bin.parent().expect("roce's folder");
    for lib in ["libibverbs.so", "libmlx5.so", "libefa.so"] {
        assert!(
            dir.join(lib).exists(),
            "{lib} is not built next to {} (cargo build --release -p roce-verbs \
             -p roce-verbs-mlx5 -p roce-verbs-efa)",
            bin.display()
        );
    }
    for tool in ["ib_write_bw", "ib_write_lat"] {
        assert!(
            std::path::Path::new("/usr/bin").join(tool).exists(),
            "no /usr/bin/{tool}: install perftest (cargo xtask setup)"
        );
    }
}

/// The IPv4 GID index of `end`'s interface (`roce gids`), what perftest's `-x` takes.
fn ipv4_gid_index(end: &VethEnd) -> String {
    let gids: Vec<Value> = serde_json::from_str(&roce_ok(&[
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

/// Waits until something in namespace `ns` listens on TCP `port` (the server of a run), at
/// most 20 s; panics with the server's output when it exits or never listens.
fn wait_listen(ns: &str, port: u16, server: &mut child::Reaper, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ss = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-Hltn"])
            .arg(format!("sport = :{port}"))
            .output()
            .expect("ss");
        if !String::from_utf8_lossy(&ss.stdout).trim().is_empty() {
            return;
        }
        let gone = std::fs::metadata(format!("/proc/{}", server.pid())).is_err();
        if gone || Instant::now() > deadline {
            let _ = server.kill();
            panic!("{what}: the server never listened on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `roce -j --netns NS ARGS` at both ends (server on `pair.a`, client on `pair.b`
/// connecting to it) on TCP `port`; returns (client output, server output) after checking
/// both exited 0.
fn run_pair(
    pair: &VethPair,
    port: u16,
    what: &str,
    args: &dyn Fn(&VethEnd, Option<&VethEnd>) -> Vec<String>,
) -> (String, String) {
    let mut server = child::spawn(&pair.a.netns, &args(&pair.a, None));
    wait_listen(&pair.a.netns, port, &mut server, what);
    let client = child::spawn(&pair.b.netns, &args(&pair.b, Some(&pair.a)));
    let c = child::finish_within(client, RUN_LIMIT, &format!("{what} client"));
    let s = child::finish_within(server, RUN_LIMIT, &format!("{what} server"));
    let (ct, st) = (text(&c), text(&s));
    assert!(
        c.status.success() && s.status.success(),
        "{what}: client {:?}, server {:?}\nclient:\n{ct}\nserver:\n{st}",
        c.status,
        s.status
    );
    (String::from_utf8_lossy(&c.stdout).into_owned(), st)
}

/// `roce perf ARGS` between the ends of `pair`: the client's JSON report.
fn perf(pair: &VethPair, port: u16, args: &str) -> Value {
    let what = format!("roce perf {args}");
    let (client, _) = run_pair(pair, port, &what, &|end, server| {
        let mut v = child::args(args);
        v.extend([
            "-d".to_owned(),
            end.ifname.clone(),
            "-p".to_owned(),
            port.to_string(),
        ]);
        v.extend(server.map(|s| s.ipv4.to_string()));
        v
    });
    serde_json::from_str(&client).unwrap_or_else(|e| panic!("{what}: bad JSON ({e}): {client}"))
}

/// The figure of perftest's one result row: `BW average[MB/sec]` (4th column) of a bandwidth
/// table, `t_typical[usec]` (5th) of a latency table; the row is the line of numbers after
/// the `#bytes` header whose first field is `size`.
fn perftest_figure(out: &str, size: u32) -> Option<f64> {
    let mut col = None;
    for line in out.lines() {
        let l = line.trim();
        if l.starts_with("#bytes") {
            col = Some(if l.contains("t_typical") { 4 } else { 3 });
            continue;
        }
        let Some(c) = col else { continue };
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&size.to_string().as_str()) {
            return f.get(c).and_then(|s| s.parse::<f64>().ok());
        }
    }
    None
}

/// Debian's `tool ARGS` between the ends of `pair`, both started through
/// `roce --netns NS exec --engine ENGINE -d IFACE`: the figure of the client's row for `size`,
/// checked positive.
fn perftest(pair: &VethPair, port: u16, engine: Engine, tool: &str, args: &str, size: u32) -> f64 {
    let what = format!("{tool} {args} (engine {})", engine.flag());
    let gids = (ipv4_gid_index(&pair.a), ipv4_gid_index(&pair.b));
    let (client, server) = run_pair(pair, port, &what, &|end, server| {
        let mut v: Vec<String> = [
            "exec",
            "--engine",
            engine.flag(),
            "-d",
            &end.ifname,
            "--",
            tool,
        ]
        .map(str::to_owned)
        .to_vec();
        let gid = if server.is_none() { &gids.0 } else { &gids.1 };
        v.extend([
            "-d".to_owned(),
            format!("roce_{}", end.ifname),
            "-x".to_owned(),
            gid.clone(),
            "-p".to_owned(),
            port.to_string(),
        ]);
        v.extend(child::args(args));
        v.extend(server.map(|s| s.ipv4.to_string()));
        v
    });
    let fig = perftest_figure(&client, size)
        .unwrap_or_else(|| panic!("{what}: no result row\nclient:\n{client}\nserver:\n{server}"));
    assert!(
        fig > 0.0 && fig.is_finite(),
        "{what}: result {fig}\nclient:\n{client}"
    );
    fig
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A row's target: its text, and whether a ratio meets it.
type Target = (&'static str, fn(f64) -> bool);

/// One measured row against its baseline.
struct Measure {
    name: String,
    unit: &'static str,
    runs: Vec<f64>,
    baseline: Vec<f64>,
    baseline_name: &'static str,
    /// The target as a bound on the ratio: (text, met?).
    target: Option<Target>,
}

fn main() {
    require_root();
    require_libraries();
    let pair = VethPair::new(
        &tag("bv"),
        &VethOptions {
            mtu: 3000,
            subnet: 97,
            ..VethOptions::default()
        },
    )
    .expect("veth");
    let mut port = 19_400u16;
    let mut next_port = || {
        port += 1;
        port
    };
    let size = 65_536;
    let bw_args = format!("-s {size} -D {SECS} -m 2048");
    let (mut perf_bw, mut bw_inline, mut bw_threads) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS {
        perf_bw.push(
            perf(&pair, next_port(), &format!("perf write {bw_args} -t 128"))["bw_mb_per_sec"]
                .as_f64()
                .expect("bw_mb_per_sec"),
        );
        for (engine, out) in [
            (Engine::Inline, &mut bw_inline),
            (Engine::Threads, &mut bw_threads),
        ] {
            out.push(perftest(
                &pair,
                next_port(),
                engine,
                "ib_write_bw",
                &format!("{bw_args} -f 1"),
                size,
            ));
        }
    }
    let lat_args = format!("-s 2 -n {LAT_ITERS} -m 2048");
    let (mut perf_lat, mut lat_inline, mut lat_threads) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS {
        perf_lat.push(
            perf(&pair, next_port(), &format!("perf write --lat {lat_args}"))["latency_us"]["p50"]
                .as_f64()
                .expect("latency_us.p50"),
        );
        for (engine, out) in [
            (Engine::Inline, &mut lat_inline),
            (Engine::Threads, &mut lat_threads),
        ] {
            out.push(perftest(
                &pair,
                next_port(),
                engine,
                "ib_write_lat",
                &lat_args,
                2,
            ));
        }
    }
    drop(pair);
    let measures = [
        Measure {
            name: "ib_write_bw 64 KiB, library engine inline".into(),
            unit: "MB/s",
            runs: bw_inline,
            baseline: perf_bw.clone(),
            baseline_name: "roce perf write",
            target: Some(("≥ 0.9x", |r| r >= 0.9)),
        },
        Measure {
            name: "ib_write_bw 64 KiB, library engine threads".into(),
            unit: "MB/s",
            runs: bw_threads,
            baseline: perf_bw,
            baseline_name: "roce perf write",
            target: None,
        },
        Measure {
            name: "ib_write_lat 2 B p50, library engine inline".into(),
            unit: "us",
            runs: lat_inline,
            baseline: perf_lat.clone(),
            baseline_name: "roce perf write --lat p50",
            target: Some(("≤ 1.1x", |r| r <= 1.1)),
        },
        Measure {
            name: "ib_write_lat 2 B p50, library engine threads".into(),
            unit: "us",
            runs: lat_threads,
            baseline: perf_lat,
            baseline_name: "roce perf write --lat p50",
            target: None,
        },
    ];
    let mut rows = Vec::new();
    let mut table = String::from(
        "| measure | perftest on the library (median, min..max) | baseline (median, min..max) | ratio | target |\n|---|---|---|---|---|\n",
    );
    for m in measures {
        let ((v, vmin, vmax), (b, bmin, bmax)) = (stats(m.runs), stats(m.baseline));
        let ratio = v / b.max(1e-9);
        let (target, met) = m.target.map_or(("-", ""), |(t, ok)| {
            (t, if ok(ratio) { " (met)" } else { " (NOT met)" })
        });
        table.push_str(&format!(
            "| {}, {} | {v:.2} ({vmin:.2}..{vmax:.2}) | {b:.2} ({bmin:.2}..{bmax:.2}) {} | {ratio:.2}x | {target}{met} |\n",
            m.name, m.unit, m.baseline_name
        ));
        rows.push(json!({"name": m.name, "value": v, "unit": m.unit, "baseline": b, "ratio": ratio, "target": target, "min": vmin, "max": vmax}));
    }
    print!("{table}");
    println!(
        "(median of {REPS}, interleaved; veth MTU 3000, path MTU 2048; bandwidth runs of {SECS} s, \
         latency runs of {LAT_ITERS} round trips)"
    );
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        std::fs::write(
            std::path::Path::new(&dir).join("verbs.json"),
            serde_json::to_string_pretty(&rows).unwrap(),
        )
        .unwrap();
    }
}
