//! The C ABI: every exported `ibv_*` symbol, bound to its version node. The only part of the
//! library with `unsafe`; each block says why it is sound. What it calls is safe Rust
//! ([`crate::device`], [`crate::verbs`], the `roce` crate).

use core::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Exports `fn` under its own name, bound to version node `$node` as its default (`@@`)
/// version, as rdma-core's libibverbs.map.in places it.
macro_rules! export {
    ($node:literal,
     $(#[$m:meta])*
     fn $name:ident($($arg:ident: $t:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> $ret $body

        #[cfg(not(test))]
        core::arch::global_asm!(concat!(
            ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
        ));
    };
    // A call that blocks at a cancellation point (`read(2)`), as its rdma-core original does:
    // `extern "C-unwind"`, so that `pthread_cancel` of a thread waiting in it unwinds the
    // thread through it instead of aborting the process (an `extern "C"` frame may not be
    // unwound). Its body must hold nothing to drop (no guard, no `Arc`, no lock) while it
    // blocks: the forced unwind of a cancellation runs no Rust destructor.
    ($node:literal,
     $(#[$m:meta])*
     cancellable fn $name:ident($($arg:ident: $t:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C-unwind" fn $name($($arg: $t),*) -> $ret $body

        #[cfg(not(test))]
        core::arch::global_asm!(concat!(
            ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
        ));
    };
}

/// Runs `f`, turning a panic into `err` so that no unwinding crosses into C (a panic would be
/// a bug; the program gets an error return instead of an abort).
pub(super) fn guard<T>(err: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(err)
}

/// Sets the thread's `errno`, as rdma-core does for calls that return NULL.
pub(super) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid for writes.
    unsafe { *libc::__errno_location() = e };
}

/// What a creating verb returns: the object, or NULL with `errno` set to why not (rdma-core's
/// convention for `ibv_create_*`, `ibv_alloc_*` and `ibv_reg_mr`).
pub(super) fn or_null<T, U>(made: Result<*mut T, c_int>) -> *mut U {
    match made {
        Ok(p) => p.cast(),
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    }
}

mod ah;
mod async_event;
mod compat;
mod cq_ex;
mod device;
mod mw;
mod objects;
mod qp_ex;
mod rdmacm;
mod srq;
