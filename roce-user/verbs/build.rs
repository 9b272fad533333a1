//! Generates the C structs of rdma-core's public verbs header with bindgen (so their layout is
//! exactly what the installed libibverbs-dev says, checked by bindgen's layout assertions), and
//! links the cdylib as `libibverbs.so.1` with Debian 12's version nodes (libibverbs.map).

use std::{env, path::PathBuf};

const HEADER: &str = "/usr/include/infiniband/verbs.h";
const CMA_HEADER: &str = "/usr/include/rdma/rdma_cma.h";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rerun-if-changed={HEADER}");
    println!("cargo:rerun-if-changed={CMA_HEADER}");
    if !std::path::Path::new(CMA_HEADER).exists() {
        panic!(
            "{CMA_HEADER} is missing: the drop-in librdmacm is generated from rdma-core's \
             headers. Install them with `cargo xtask setup` (Debian: apt-get install \
             librdmacm-dev)"
        );
    }
    if !std::path::Path::new(HEADER).exists() {
        panic!(
            "{HEADER} is missing: the drop-in libibverbs is generated from rdma-core's headers. \
             Install them with `cargo xtask setup` (Debian: apt-get install libibverbs-dev \
             libclang-dev)"
        );
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_.*")
        .allowlist_type("_compat_ibv_port_attr")
        .allowlist_type("ib_uverbs_qp_attr")
        .allowlist_type("ib_uverbs_ah_attr")
        .allowlist_type("ib_user_path_rec")
        .allowlist_var("IBV_.*")
        // librdmacm's structs (rdma_cma.h), for the drop-in librdmacm served by this library.
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*")
        .allowlist_var("RAI_.*")
        .allowlist_var("__VERBS_ABI_IS_EXTENDED")
        .blocklist_function(".*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen over infiniband/verbs.h")
        .write_to_file(out.join("verbs_sys.rs"))
        .expect("write verbs_sys.rs");

    let map =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("libibverbs.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
