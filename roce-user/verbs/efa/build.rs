//! Links the stand-in as `libefa.so.1` with the version nodes of Debian 12's libefa
//! (libefa.map), so that binaries linked against rdma-core's find each symbol at its node.

use std::{env, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=libefa.map");
    let map =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("libefa.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libefa.so.1");
}
