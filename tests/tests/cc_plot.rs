//! `roce plot` end to end: a trace from the deterministic DCQCN simulator, written as CSV by
//! the binary, read back, drawn as SVG. Needs no root (but the built `roce` binary).

use std::{fs, path::PathBuf, process::Command};

use roce::cc::{
    Trace,
    sim::{self, SimConfig},
};
use roce_tests::{roce_bin, tag};
use serde_json::Value;

struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let p = std::env::temp_dir().join(tag(&format!("roce-{test}-")));
        fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn roce(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(roce_bin())
        .args(args)
        .output()
        .expect("run roce");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn simulate_write_read_and_draw() {
    let dir = TempDir::new("plot-sim");
    let (csv, svg) = (dir.file("sim.csv"), dir.file("sim.svg"));
    let (code, out, err) = roce(&["-j", "plot", "--simulate", &csv, "-o", &svg]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["samples"], 2001, "20 ms every 10 µs");
    assert_eq!(v["qps"], 1);

    // The binary's trace is the library's, bit for bit: the simulator is deterministic.
    let text = fs::read_to_string(&csv).unwrap();
    let trace = Trace::parse_csv(&text).unwrap();
    let sim_cfg = SimConfig {
        stagger: std::time::Duration::from_millis(10),
        ..SimConfig::default()
    };
    assert_eq!(trace, sim::run(&sim_cfg).trace);
    let cnps = trace.rows.last().unwrap().cnps;
    assert!(cnps > 10, "{cnps} CNPs");

    // Draw the CSV file.
    let svg2 = dir.file("from-csv.svg");
    let (code, out, err) = roce(&["plot", &csv, "-o", &svg2, "--qpn", "0x11", "-t", "t"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("2001 samples of 1 QP(s)"), "{out}");
    let doc = fs::read_to_string(&svg2).unwrap();
    assert!(doc.starts_with("<svg") && doc.contains("</svg>"));
    assert!(doc.matches("<polyline").count() >= 3, "rate, target, alpha");
    // One CNP mark per sample in which CNPs arrived.
    let marked = trace
        .rows
        .windows(2)
        .filter(|w| w[1].cnps > w[0].cnps)
        .count();
    assert_eq!(
        doc.matches("<circle").count(),
        marked + 1,
        "marks plus the legend's"
    );
    assert!(doc.contains("QP 17 CNP"));
}

#[test]
fn parameters_change_the_curve_and_errors_are_clear() {
    let dir = TempDir::new("plot-params");
    let (a, b) = (dir.file("a.csv"), dir.file("b.csv"));
    let svg = dir.file("x.svg");
    let run = |csv: &str, ai: &str| {
        let (code, out, err) = roce(&[
            "plot",
            "--simulate",
            csv,
            "-o",
            &svg,
            "--flows",
            "2",
            "--ms",
            "10",
            "--set",
            ai,
        ]);
        assert_eq!(code, Some(0), "{out}{err}");
        Trace::parse_csv(&fs::read_to_string(csv).unwrap()).unwrap()
    };
    let slow = run(&a, "rpg_ai_rate=5");
    let fast = run(&b, "rpg_ai_rate=200");
    assert_eq!(slow.qpns().len(), 2);
    let bytes = |t: &Trace| t.rows.iter().map(|r| r.bytes).max().unwrap();
    assert!(
        bytes(&fast) > bytes(&slow),
        "a larger additive increase recovers faster"
    );

    let (code, _, err) = roce(&["plot", "--simulate", "-o", &svg, "--set", "dce_tcp_g=2000"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("DCQCN parameter dce_tcp_g = 2000 is out of range (allowed 0..=1023"),
        "{err}"
    );
    let (code, _, err) = roce(&["plot", "--simulate", "-o", &svg, "--set", "nosuch=1"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("rpg_time_reset"),
        "lists the parameters: {err}"
    );
    let bad = dir.file("bad.csv");
    fs::write(&bad, "a,b,c\n1,2,3\n").unwrap();
    let (code, out, _) = roce(&["-j", "plot", &bad, "-o", &svg]);
    assert_eq!(code, Some(1));
    let e: Value = serde_json::from_str(&out).unwrap();
    assert!(
        e["error"].as_str().unwrap().contains("not a roce cc trace"),
        "{e}"
    );
}
