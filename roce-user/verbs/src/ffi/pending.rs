//! Address handles and shared receive queues, as a provider without them answers (rdma-core's
//! `dummy_ops`: NULL with errno EOPNOTSUPP, or EOPNOTSUPP returned). perftest and librdmacm
//! import these, and with BIND_NOW a program does not load unless each is defined.
//!
//! Work in progress elsewhere replaces them: address handles (`ffi/ah.rs` of the UD work) and
//! SRQs (the SRQ work). When those land, delete the functions here that they define (the
//! linker refuses two definitions of one symbol, so a merge that keeps both does not build).

use core::ffi::c_int;
use core::ptr;

use super::set_errno;
use crate::sys;

export!(
    "IBVERBS_1.1",
    /// `ibv_create_ah`: NULL with errno EOPNOTSUPP (address handles not offered yet).
    fn ibv_create_ah(pd: *mut sys::ibv_pd, attr: *mut sys::ibv_ah_attr) -> *mut sys::ibv_ah {
        let _ = (pd, attr);
        set_errno(libc::EOPNOTSUPP);
        ptr::null_mut()
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_create_ah_from_wc`: NULL with errno EOPNOTSUPP, as `ibv_create_ah`.
    fn ibv_create_ah_from_wc(
        pd: *mut sys::ibv_pd,
        wc: *mut sys::ibv_wc,
        grh: *mut sys::ibv_grh,
        port_num: u8,
    ) -> *mut sys::ibv_ah {
        let _ = (pd, wc, grh, port_num);
        set_errno(libc::EOPNOTSUPP);
        ptr::null_mut()
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_destroy_ah`: EOPNOTSUPP (none can have been made).
    fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
        let _ = ah;
        libc::EOPNOTSUPP
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_create_srq`: NULL with errno EOPNOTSUPP (SRQs not offered yet).
    fn ibv_create_srq(
        pd: *mut sys::ibv_pd,
        attr: *mut sys::ibv_srq_init_attr,
    ) -> *mut sys::ibv_srq {
        let _ = (pd, attr);
        set_errno(libc::EOPNOTSUPP);
        ptr::null_mut()
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_destroy_srq`: EOPNOTSUPP (none can have been made).
    fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
        let _ = srq;
        libc::EOPNOTSUPP
    }
);
