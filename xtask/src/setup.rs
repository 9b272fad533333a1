//! `cargo xtask setup`: install what a fresh machine lacks, and nothing twice.

use std::{
    env,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::run;

/// Debian packages the build and the tests use.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev", // bpf-linker links against LLVM 22
    "bpftool",     // tests compare `bpftool map dump` with `roce stats`
    "iproute2",    // ip netns, veth
    "ethtool",     // queue and offload settings in the veth tests
    "tcpdump",     // captures in the veth and interop tests
    "tshark",      // dissects our pcaps in the wire tests
    "python3-pip", // scapy
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const CARGO_FUZZ_VERSION: &str = "0.13.2";
const SCAPY_VERSION: &str = "2.8.0";

/// PATH with ~/.cargo/bin in front, where cargo installs bpf-linker and cargo-fuzz.
pub(crate) fn path_with_cargo_bin() -> String {
    let home = env::var("CARGO_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cargo",
            env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let path = env::var("PATH").unwrap_or_default();
    format!("{home}/bin:{path}")
}

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> String {
    cmd.stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn missing_apt() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let s = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]));
            !s.contains("install ok installed")
        })
        .collect()
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).trim() == "0"
}

pub(crate) fn ensure() -> anyhow::Result<()> {
    let path = path_with_cargo_bin();

    let missing = missing_apt();
    if !missing.is_empty() {
        if !is_root() {
            bail!("missing Debian packages {missing:?}; run `cargo xtask setup` as root");
        }
        eprintln!("xtask setup: installing {missing:?}");
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing))?;
    }

    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]));
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!(
            "no nightly Rust toolchain (needed to build the eBPF object with -Z build-std); \
             install one with `rustup toolchain install nightly --component rust-src`"
        );
    }
    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }

    let linker = output(
        Command::new("bpf-linker")
            .arg("--version")
            .env("PATH", &path),
    );
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22");
        run(Command::new("cargo")
            .env("PATH", format!("/usr/lib/llvm-22/bin:{path}"))
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
            ])
            .args(["--no-default-features", "--features", "llvm-22"]))?;
    }

    let fuzz = output(
        Command::new("cargo")
            .args(["fuzz", "--version"])
            .env("PATH", &path),
    );
    if !fuzz.contains(CARGO_FUZZ_VERSION) {
        eprintln!("xtask setup: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
        run(Command::new("cargo").env("PATH", &path).args([
            "install",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
            "--locked",
        ]))?;
    }

    if !quiet_ok(Command::new("python3").args(["-c", "import scapy.contrib.roce"])) {
        eprintln!("xtask setup: installing scapy {SCAPY_VERSION}");
        // Debian's python3 is "externally managed"; a pyenv or venv python is not. Try both ways.
        let plain = quiet_ok(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "-q",
            &format!("scapy=={SCAPY_VERSION}"),
        ]));
        if !plain {
            run(Command::new("python3").args([
                "-m",
                "pip",
                "install",
                "-q",
                "--break-system-packages",
                &format!("scapy=={SCAPY_VERSION}"),
            ]))?;
        }
        if !quiet_ok(Command::new("python3").args(["-c", "import scapy.contrib.roce"])) {
            bail!("scapy installed but `import scapy.contrib.roce` still fails");
        }
    }

    ensure_bpffs().context("mounting the BPF filesystem")?;
    eprintln!("xtask setup: everything is in place");
    Ok(())
}

/// Mounts bpffs at /sys/fs/bpf if it is not there yet (as systemd does at boot).
fn ensure_bpffs() -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts.lines().any(|l| {
        l.split_whitespace().nth(1) == Some("/sys/fs/bpf")
            && l.split_whitespace().nth(2) == Some("bpf")
    }) {
        return Ok(());
    }
    if !is_root() {
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}
