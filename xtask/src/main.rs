//! Project tasks: `cargo xtask setup | test | check-layers | demo | bench`.
//!
//! `setup` installs what a fresh machine lacks (apt packages, nightly rust-src, bpf-linker,
//! cargo-fuzz, scapy) and is quick when everything is already there. `test` and `demo` run
//! `setup` first, so the README's two commands work on a fresh machine.

mod bench;
mod layers;
mod setup;
mod test;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "roce-xdp project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything the project needs (idempotent; seconds when already done).
    Setup,
    /// Set up, then run every test: lint, unit and property tests, scapy/tshark checks, fuzz
    /// smokes, and the privileged BPF_PROG_TEST_RUN and veth suites (needs root).
    Test {
        /// Skip the bounded fuzzing runs.
        #[arg(long)]
        no_fuzz: bool,
        /// Seconds per fuzz target.
        #[arg(long, default_value_t = 30)]
        fuzz_secs: u32,
        /// Also run the soak (tests/tests/soak.rs: minutes of mixed traffic at 1 % loss,
        /// memory and progress watched; `ROCE_SOAK_SECS` sets its length).
        #[arg(long)]
        soak: bool,
        /// Run the full matrices instead of CI's representative subsets: every perftest size
        /// at 1000 iterations against rxe (`ROCE_INTEROP_FULL=1`), perftest_verbs' full table
        /// (`ROCE_PERFTEST_FULL=1`) and every case of the fault matrix (its opt-in cases are
        /// `#[ignore]`d in the default run). Adds about half an hour.
        #[arg(long)]
        full: bool,
    },
    /// Check the sans-I/O rule: wire/, transport/, cc/, ibcm/, time.rs and stats.rs use no clock,
    /// socket, file, thread, lock, I/O crate or upper layer outside `#[cfg(test)]` code (also
    /// the first step of `test`).
    CheckLayers,
    /// Set up, build the release `roce`, and run `roce demo` on a veth pair it makes itself
    /// (needs root).
    Demo {
        /// Arguments passed to `roce demo`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run benchmarks (all, or the ones named) and print ratios against same-run baselines.
    Bench {
        /// Benchmarks to run (xdp, wire, xsk, ...); all when empty.
        names: Vec<String>,
    },
}

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Cargo's target folder: `$CARGO_TARGET_DIR` when set (as cargo itself resolves it, relative
/// to the workspace root, where [`run`] starts cargo), else `target/` of the workspace.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| root().join("target"), |d| root().join(d))
}

/// Runs a command in the workspace root, streaming its output, failing on a non-zero exit.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("xtask: $ {shown}");
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("failed to spawn {shown}"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Totals of `cargo test` runs, for the closing line of `cargo xtask test`.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
}

/// Runs a `cargo test` command like [`run`], echoing its output and adding its
/// `test result:` lines to `tally`.
pub(crate) fn run_tests(cmd: &mut Command, tally: &mut Tally) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader};
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("xtask: $ {shown}");
    let mut child = cmd
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to spawn {shown}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                for part in rest.split(['.', ';']) {
                    let mut words = part.split_whitespace();
                    if let (Some(n), Some(what)) = (words.next(), words.next())
                        && let Ok(n) = n.parse::<u64>()
                    {
                        match what {
                            "passed" => tally.passed += n,
                            "failed" => tally.failed += n,
                            "ignored" => tally.ignored += n,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// `cargo` with the PATH that setup relies on (~/.cargo/bin first).
pub(crate) fn cargo() -> Command {
    let mut c = Command::new("cargo");
    c.env("PATH", setup::path_with_cargo_bin());
    c
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Task::Setup => setup::ensure(),
        Task::Test {
            no_fuzz,
            fuzz_secs,
            soak,
            full,
        } => {
            setup::ensure()?;
            test::all(!no_fuzz, fuzz_secs, soak, full)
        }
        Task::CheckLayers => layers::check(&root()),
        Task::Demo { args } => {
            setup::ensure()?;
            // The release build: the demo shows what the endpoint does, and the debug build is
            // several times slower (on a fresh machine 81 MB/s WRITE and 592 µs per 4 KiB
            // ping-pong, issue 20).
            run(cargo().args([
                "build",
                "--release",
                "--package",
                "roce-user",
                "--bin",
                "roce",
            ]))?;
            let bin = target_dir().join("release/roce");
            run(Command::new(bin).arg("demo").args(args))
        }
        Task::Bench { names } => {
            setup::ensure()?;
            bench::all(&names)
        }
    }
}
