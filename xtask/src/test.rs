//! `cargo xtask test`: every test the project has, in order of cost. Any failure fails the run.
//! The privileged suites need root and fail (never skip) without it.

use std::process::Command;

use anyhow::bail;

use crate::{Tally, cargo, root, run, run_tests};

/// The fuzz targets under roce-user/fuzz, from its manifest.
fn fuzz_targets() -> Vec<String> {
    let manifest = root().join("roce-user/fuzz/Cargo.toml");
    let Ok(text) = std::fs::read_to_string(manifest) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin
            && line.starts_with("name")
            && let Some(name) = line.split('"').nth(1)
        {
            names.push(name.to_owned());
        }
    }
    names
}

/// The `#[ignore]`d cases of the privileged suite `test` (tests/tests/`test`.rs), with one
/// more test-harness flag.
fn ignored_cases(test: &str, flag: &str) -> Command {
    let mut c = cargo();
    c.env("ROCE_BIN", root().join("target/debug/roce")).args([
        "test",
        "--package",
        "roce-tests",
        "--test",
        test,
        "--",
        "--ignored",
        flag,
    ]);
    c
}

pub(crate) fn all(fuzz: bool, fuzz_secs: u32, soak: bool, full: bool) -> anyhow::Result<()> {
    let mut tally = Tally::default();
    // 1. Hygiene.
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // The sans-I/O core imports no clock, socket, thread, lock, I/O crate or upper layer.
    crate::layers::check(&root())?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Doc comments link where they say and render as written.
    run(cargo()
        .env("RUSTDOCFLAGS", "-D warnings")
        .args(["doc", "--workspace", "--no-deps"]))?;

    // 2. The default members build and test without the BPF toolchain (stub object).
    run_tests(
        cargo()
            .env("AYA_BUILD_SKIP", "1")
            .env("CARGO_TARGET_DIR", root().join("target/no-bpf"))
            .args([
                "test",
                "--package",
                "roce-common",
                "--package",
                "roce-user",
                "--lib",
            ]),
        &mut tally,
    )?;

    // 3. Unit, property, scapy, tshark and capture tests of the default members (real object).
    run_tests(
        cargo().args(["test", "--workspace", "--exclude", "roce-tests"]),
        &mut tally,
    )?;

    // The transport's full seeded schedule: 10,000 mixed messages up to 1 MiB under loss,
    // duplication and reordering (release, ~40 s; the debug suite above runs a smaller one).
    run_tests(
        cargo().args([
            "test",
            "--release",
            "--package",
            "roce-user",
            "--test",
            "transport_sim",
            "--",
            "--ignored",
        ]),
        &mut tally,
    )?;

    // 4. Bounded fuzzing.
    if fuzz {
        for target in fuzz_targets() {
            run(cargo()
                .args([
                    "+nightly",
                    "fuzz",
                    "run",
                    "--fuzz-dir",
                    "roce-user/fuzz",
                    &target,
                    "--",
                ])
                .arg(format!("-max_total_time={fuzz_secs}"))
                .arg("-rss_limit_mb=4096"))?;
        }
    }

    // 5. Privileged suites: BPF_PROG_TEST_RUN tables, veth and netns end-to-end tests.
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        bail!("the privileged tests (BPF_PROG_TEST_RUN, veth, AF_XDP) need root; run as root");
    }
    // The `roce` binary and the examples (tests/tests/handles.rs runs examples/rc_write and
    // tests/tests/async_api.rs examples/async_echo next to the binary, target/debug/examples).
    run(cargo().args([
        "build",
        "--package",
        "roce-user",
        "--bin",
        "roce",
        "--examples",
    ]))?;
    // The drop-in libibverbs.so and the stand-in libmlx5.so and libefa.so that Debian's
    // perftest needs to load, next to the binary (tests/tests/verbs.rs, perftest_verbs.rs).
    run(cargo().args([
        "build",
        "--package",
        "roce-verbs",
        "--package",
        "roce-verbs-mlx5",
        "--package",
        "roce-verbs-efa",
    ]))?;
    let mut suites = cargo();
    suites
        .env("ROCE_BIN", root().join("target/debug/roce"))
        .args(["test", "--package", "roce-tests", "--", "--test-threads=1"]);
    if full {
        suites
            .env("ROCE_INTEROP_FULL", "1")
            .env("ROCE_PERFTEST_FULL", "1");
    }
    run_tests(&mut suites, &mut tally)?;
    // 6. Opt-in: the fault matrix's remaining cases (CI runs 1 % loss, 1 % corruption and
    // all faults at once).
    if full {
        run_tests(
            &mut ignored_cases("fault_matrix", "--test-threads=1"),
            &mut tally,
        )?;
    }
    // 7. Opt-in: the soak, minutes of mixed traffic at 1 % loss (ignored in the run above).
    if soak {
        run_tests(&mut ignored_cases("soak", "--nocapture"), &mut tally)?;
    }
    eprintln!("xtask test: all suites passed ({} ignored)", tally.ignored);
    println!("tests: {} passed, {} failed", tally.passed, tally.failed);
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `cargo xtask test` smokes every target of the fuzz manifest: the wire parser, the
    /// responder and the completer.
    #[test]
    fn every_fuzz_target_is_smoked() {
        let t = super::fuzz_targets();
        for want in ["parse_frame", "responder", "completer"] {
            assert!(t.iter().any(|n| n == want), "{want} missing from {t:?}");
        }
    }
}
