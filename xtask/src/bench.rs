//! `cargo xtask bench [NAME...]`: runs the benchmark binaries (harness = false) and gathers
//! their rows into one table and one JSON file.
//!
//! Each benchmark measures its baseline in the same run and writes
//! `$ROCE_BENCH_OUT/<name>.json`: an array of rows `{name, value, unit, baseline, ratio, target,
//! min, max}`, where `value` is a median and `ratio` compares it with the baseline.

use std::{fmt::Write as _, fs};

use anyhow::{Context as _, bail};

use crate::{cargo, root, run, target_dir};

/// (name, package, bench target, needs root)
const BENCHES: &[(&str, &str, &str, bool)] = &[
    ("xdp", "roce-tests", "xdp", true),
    ("wire", "roce-user", "wire", false),
    ("xsk", "roce-tests", "xsk", true),
    ("e2e", "roce-tests", "e2e", true),
    ("interop", "roce-tests", "interop", true),
    ("verbs", "roce-tests", "verbs", true),
    ("xproc", "roce-tests", "xproc", false),
    ("multipath", "roce-tests", "multipath", true),
];

/// Why the Soft-RoCE peer cannot run here, if it cannot: the rxe-peer scripts
/// (`$RXE_PEER_TOOLS`, else `shared/rxe-peer` beside the repository or a parent) and a built
/// image (`$RXE_PEER_DIR/rootfs.img`, default /tmp/rxe-peer) must both exist. The bench does not
/// build the image (the interop tests do, in ~8 minutes).
fn peer_unavailable() -> Option<String> {
    let tools = std::env::var_os("RXE_PEER_TOOLS")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            root()
                .ancestors()
                .map(|d| d.join("shared/rxe-peer"))
                .find(|d| d.join("start-peer.sh").exists())
        });
    let Some(tools) = tools.filter(|t| t.join("start-peer.sh").exists()) else {
        return Some("no rxe-peer scripts (shared/rxe-peer beside the repository)".into());
    };
    let dir = std::env::var_os("RXE_PEER_DIR")
        .map_or_else(|| "/tmp/rxe-peer".into(), std::path::PathBuf::from);
    if !dir.join("rootfs.img").exists() {
        return Some(format!(
            "no image at {} (build it with {}/build-image.sh, or run the interop tests)",
            dir.join("rootfs.img").display(),
            tools.display()
        ));
    }
    None
}

fn exists(package: &str, bench: &str) -> bool {
    let dir = if package == "roce-tests" {
        "tests"
    } else {
        package
    };
    root()
        .join(dir)
        .join("benches")
        .join(format!("{bench}.rs"))
        .exists()
}

pub(crate) fn all(names: &[String]) -> anyhow::Result<()> {
    for n in names {
        if !BENCHES.iter().any(|(b, ..)| b == n) {
            let known: Vec<_> = BENCHES.iter().map(|b| b.0).collect();
            bail!("unknown benchmark {n:?}; known: {known:?}");
        }
    }
    // The end-to-end benchmarks run the release `roce` binary; the verbs benchmark also runs
    // perftest through `roce exec`, on the drop-in libibverbs and the libmlx5/libefa
    // stand-ins that cargo builds beside it.
    run(cargo().args([
        "build",
        "--release",
        "--package",
        "roce-user",
        "--bin",
        "roce",
    ]))?;
    // Separately: `--bin` would narrow this build to binaries. (The root Cargo.toml gives the
    // library one codegen unit in release, which its `.symver` directives need.)
    run(cargo().args([
        "build",
        "--release",
        "--package",
        "roce-verbs",
        "--package",
        "roce-verbs-mlx5",
        "--package",
        "roce-verbs-efa",
    ]))?;
    let out_dir = target_dir().join("bench");
    fs::create_dir_all(&out_dir)?;
    let mut rows = Vec::new();
    for &(name, package, bench, _root) in BENCHES {
        if !(names.is_empty() || names.iter().any(|n| n == name)) {
            continue;
        }
        if !exists(package, bench) {
            if names.is_empty() {
                eprintln!("xtask bench: {name}: not built yet, skipped");
                continue;
            }
            bail!("benchmark {name} does not exist yet");
        }
        if name == "interop"
            && let Some(why) = peer_unavailable()
        {
            if names.is_empty() {
                eprintln!(
                    "xtask bench: interop: skipped, the Soft-RoCE peer is not available: {why}"
                );
                continue;
            }
            bail!("benchmark interop needs the Soft-RoCE peer: {why}");
        }
        let json = out_dir.join(format!("{name}.json"));
        let _ = fs::remove_file(&json);
        run(cargo()
            .env("ROCE_BENCH_OUT", &out_dir)
            .env("ROCE_BIN", target_dir().join("release/roce"))
            .args(["bench", "--package", package, "--bench", bench]))?;
        let text = fs::read_to_string(&json)
            .with_context(|| format!("benchmark {name} wrote no {}", json.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        for row in v.as_array().cloned().unwrap_or_default() {
            rows.push((name.to_owned(), row));
        }
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| bench | measure | value (median) | min..max | baseline | ratio | target |\n|---|---|---|---|---|---|---|"
    );
    for (bench, r) in &rows {
        let f = |k: &str| {
            r[k].as_f64()
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
        };
        let _ = writeln!(
            table,
            "| {bench} | {} | {} {} | {}..{} | {} | {} | {} |",
            r["name"].as_str().unwrap_or("?"),
            f("value"),
            r["unit"].as_str().unwrap_or(""),
            f("min"),
            f("max"),
            f("baseline"),
            f("ratio"),
            r["target"].as_str().unwrap_or("-"),
        );
    }
    println!("{table}");
    let all: Vec<_> = rows
        .iter()
        .map(|(b, r)| {
            let mut r = r.clone();
            r["bench"] = b.clone().into();
            r
        })
        .collect();
    fs::write(
        out_dir.join("report.json"),
        serde_json::to_string_pretty(&all)?,
    )?;
    fs::write(out_dir.join("report.md"), &table)?;
    eprintln!(
        "xtask bench: wrote {}/report.json and report.md",
        out_dir.display()
    );
    Ok(())
}
