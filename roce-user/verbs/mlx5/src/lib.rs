//! A stand-in `libmlx5.so.1` for the drop-in libibverbs: what rdma-core's mlx5 direct-verbs
//! library answers for a device that is not a Mellanox/NVIDIA one, which every roce-xdp device
//! is (vendor id 0xffffff, as rxe).
//!
//! # Why a stand-in
//! Debian's perftest binaries (and other programs built with mlx5dv support) list
//! `libmlx5.so.1` as a needed library and are linked with `BIND_NOW`. The real library imports
//! 61 symbols of libibverbs' private node `IBVERBS_PRIVATE_34` (the provider interface:
//! `verbs_register_driver_34`, `ibv_cmd_*`, ...), so with the drop-in libibverbs first on the
//! library path the program fails to load. Two ways out were weighed:
//! - define those private symbols in the drop-in libibverbs: 61 (and 21 for libefa) internal
//!   entry points of rdma-core's provider ABI, most of which cannot mean anything without a
//!   kernel uverbs device; the real libmlx5 would register itself as a provider from its
//!   constructor, and its `mlx5dv_*` calls would cast our contexts to mlx5 ones. Every
//!   rdma-core release changes that private ABI (the node's number is its version).
//! - ship this library instead, found first through the same `LD_LIBRARY_PATH` as the
//!   drop-in libibverbs (`roce exec`): it exports, at the real version nodes, exactly the
//!   mlx5dv symbols perftest imports (and `mlx5dv_is_supported`, the check programs make
//!   first), each answering as rdma-core 44 does for a device that is not mlx5. It depends on
//!   nothing of libibverbs, so it loads whatever the libibverbs.
//!
//! The second is smaller, honest about what exists, and does not tie the drop-in library to
//! rdma-core's private ABI, so it is the one taken. perftest calls these only for mlx5-only
//! features (DC transport, AES-XTS data encryption, DEVX queries), which it offers only on a
//! device it recognises as Mellanox: on ours it never reaches them, and if forced it gets the
//! same EOPNOTSUPP it would get on rxe.

use core::ffi::{c_int, c_void};

/// Exports `fn` under its own name as the default (`@@`) version at node `$node` of
/// libmlx5.map, where rdma-core's libmlx5.map puts it.
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

/// Sets the calling thread's `errno`, as rdma-core does before returning NULL.
fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid for writes.
    unsafe { *libc::__errno_location() = e };
}

export!(
    "MLX5_1.8",
    /// `mlx5dv_is_supported`: false, the device is not an mlx5 one (rdma-core:
    /// `is_mlx5_dev(device)`).
    fn mlx5dv_is_supported(device: *mut c_void) -> bool {
        let _ = device;
        false
    }
);

export!(
    "MLX5_1.7",
    /// `mlx5dv_open_device`: NULL with errno EOPNOTSUPP for a device that is not mlx5
    /// (rdma-core mlx5.c). Programs then open it with `ibv_open_device`.
    fn mlx5dv_open_device(device: *mut c_void, attr: *mut c_void) -> *mut c_void {
        let _ = (device, attr);
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    }
);

export!(
    "MLX5_1.3",
    /// `mlx5dv_create_qp`: NULL with errno EOPNOTSUPP, the context has no mlx5 operations
    /// (rdma-core verbs.c: `mlx5_get_dv_ops` is NULL).
    fn mlx5dv_create_qp(
        context: *mut c_void,
        qp_attr: *mut c_void,
        mlx5_attr: *mut c_void,
    ) -> *mut c_void {
        let _ = (context, qp_attr, mlx5_attr);
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    }
);

export!(
    "MLX5_1.10",
    /// `mlx5dv_qp_ex_from_ibv_qp_ex`: rdma-core computes the address of the mlx5 QP around
    /// `qp` without a check, which for a QP that is not mlx5's would point at memory that is
    /// no such thing; here NULL with errno EOPNOTSUPP, since no QP of ours is mlx5's.
    fn mlx5dv_qp_ex_from_ibv_qp_ex(qp: *mut c_void) -> *mut c_void {
        let _ = qp;
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    }
);

export!(
    "MLX5_1.7",
    /// `mlx5dv_devx_general_cmd`: EOPNOTSUPP (returned, as rdma-core does), no DEVX here.
    fn mlx5dv_devx_general_cmd(
        context: *mut c_void,
        cmd_in: *const c_void,
        inlen: usize,
        out: *mut c_void,
        outlen: usize,
    ) -> c_int {
        let _ = (context, cmd_in, inlen, out, outlen);
        libc::EOPNOTSUPP
    }
);

export!(
    "MLX5_1.10",
    /// `mlx5dv_create_mkey`: NULL with errno EOPNOTSUPP (no mlx5 operations).
    fn mlx5dv_create_mkey(init_attr: *mut c_void) -> *mut c_void {
        let _ = init_attr;
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    }
);

export!(
    "MLX5_1.10",
    /// `mlx5dv_destroy_mkey`: EOPNOTSUPP (no mkey can have been made).
    fn mlx5dv_destroy_mkey(mkey: *mut c_void) -> c_int {
        let _ = mkey;
        libc::EOPNOTSUPP
    }
);

export!(
    "MLX5_1.21",
    /// `mlx5dv_crypto_login`: EOPNOTSUPP (returned, as rdma-core does).
    fn mlx5dv_crypto_login(context: *mut c_void, login_attr: *mut c_void) -> c_int {
        let _ = (context, login_attr);
        libc::EOPNOTSUPP
    }
);

export!(
    "MLX5_1.21",
    /// `mlx5dv_dek_create`: NULL with errno EOPNOTSUPP.
    fn mlx5dv_dek_create(context: *mut c_void, init_attr: *mut c_void) -> *mut c_void {
        let _ = (context, init_attr);
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    }
);

export!(
    "MLX5_1.21",
    /// `mlx5dv_dek_destroy`: EOPNOTSUPP (no key can have been made).
    fn mlx5dv_dek_destroy(dek: *mut c_void) -> c_int {
        let _ = dek;
        libc::EOPNOTSUPP
    }
);
