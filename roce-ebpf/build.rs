//! Rebuild the eBPF object when bpf-linker changes: cargo cannot see that dependency itself
//! (rust-lang/cargo#12385), so the linker's path is a rerun trigger.
use which::which;

fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
