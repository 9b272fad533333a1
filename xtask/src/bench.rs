//! `cargo xtask bench [NAME...]`: runs the benchmark binaries (harness = false) and gathers
//! their rows into one table and one JSON file.
//!
//! Each benchmark measures its baseline in the same run and writes
//! `$ROCE_BENCH_OUT/<name>.json`: an array of rows `{name, value, unit, baseline, ratio, target,
//! min, max}`, where `value` is a median and `ratio` compares it with the baseline.

use std::{fmt::Write as _, fs};

use anyhow::{Context as _, bail};

use crate::{cargo, root, run};

/// (name, package, bench target, needs root)
const BENCHES: &[(&str, &str, &str, bool)] = &[
    ("xdp", "roce-tests", "xdp", true),
    ("wire", "roce-user", "wire", false),
    ("xsk", "roce-tests", "xsk", true),
];

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
    let out_dir = root().join("target/bench");
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
        let json = out_dir.join(format!("{name}.json"));
        let _ = fs::remove_file(&json);
        run(cargo().env("ROCE_BENCH_OUT", &out_dir).args([
            "bench",
            "--package",
            package,
            "--bench",
            bench,
        ]))?;
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
