//! A stand-in `libefa.so.1` for the drop-in libibverbs: what rdma-core's EFA direct-verbs
//! library answers for a device that is not an AWS EFA one, which no roce-xdp device is.
//!
//! Debian's perftest binaries need `libefa.so.1` (BIND_NOW), and the real one imports 21
//! symbols of libibverbs' private provider node `IBVERBS_PRIVATE_34`; why a stand-in rather
//! than those private symbols in the drop-in library is told in the sibling stand-in
//! `libmlx5.so.1` (roce-user/verbs/mlx5). This one exports, at the real version nodes,
//! exactly the two efadv symbols perftest imports, answering as rdma-core 44 does for a
//! device that is not EFA (`is_efa_dev` false). perftest calls them only for the SRD
//! transport (`-c SRD`), which roce-xdp does not offer.

use core::ffi::{c_int, c_void};

/// Exports `fn` under its own name as the default (`@@`) version at node `$node` of
/// libefa.map, where rdma-core's libefa.map puts it.
macro_rules! export {
    ($node:literal,
     $(#[$m:meta])*
     fn $name:ident($($arg:ident: $t:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $t),*) -> $ret $body

        #[cfg(not(test))]
        core::arch::global_asm!(concat!(
            ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
        ));
    };
}

export!(
    "EFA_1.1",
    /// `efadv_query_device`: EOPNOTSUPP (returned, as rdma-core does for a device that is not
    /// EFA); `attr` is left alone.
    fn efadv_query_device(context: *mut c_void, attr: *mut c_void, inlen: u32) -> c_int {
        let _ = (context, attr, inlen);
        libc::EOPNOTSUPP
    }
);

export!(
    "EFA_1.1",
    /// `efadv_create_qp_ex`: NULL with errno EOPNOTSUPP (not an EFA device).
    fn efadv_create_qp_ex(
        context: *mut c_void,
        attr_ex: *mut c_void,
        efa_attr: *mut c_void,
        inlen: u32,
    ) -> *mut c_void {
        let _ = (context, attr_ex, efa_attr, inlen);
        // SAFETY: `__errno_location` returns the calling thread's errno, valid for writes.
        unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
        core::ptr::null_mut()
    }
);
