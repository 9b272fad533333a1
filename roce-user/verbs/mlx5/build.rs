//! Links the stand-in as `libmlx5.so.1` with the version nodes of Debian 12's libmlx5
//! (libmlx5.map), so that binaries linked against rdma-core's find each symbol at its node.

use std::{env, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=libmlx5.map");
    let map =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("libmlx5.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmlx5.so.1");
}
