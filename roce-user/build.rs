//! Builds the `roce-ebpf` object with aya-build (nightly, `bpfel-unknown-none`, bpf-linker) into
//! OUT_DIR, where `loader/mod.rs` embeds it.
//!
//! With `AYA_BUILD_SKIP=1`, aya-build builds nothing; we then write an empty stub object so that
//! `cargo build` and `cargo test` of the default members work without the BPF toolchain. Loading the
//! stub fails at run time with a message that says how to build the real object.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        for name in ["roce-ebpf", "xdp-pass", "roce-impair"] {
            let object = out_dir.join(name);
            fs::write(&object, []).with_context(|| format!("writing stub {}", object.display()))?;
        }
        println!("cargo:rustc-cfg=roce_ebpf_stub");
        println!("cargo:rustc-check-cfg=cfg(roce_ebpf_stub)");
        return Ok(());
    }
    println!("cargo:rustc-check-cfg=cfg(roce_ebpf_stub)");

    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "roce-ebpf")
        .ok_or_else(|| anyhow!("roce-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context(
        "building the eBPF object failed; run `cargo xtask setup` to install nightly rust-src and \
         bpf-linker, or set AYA_BUILD_SKIP=1 to build without it",
    )
}
