//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq` and `ops.post_srq_recv` (what verbs.h's inline `ibv_post_srq_recv`
//! calls). An `ibv_srq` is the first field of a `#[repr(C)]` [`SrqObj`], as the other objects
//! of objects.rs. The rules (arrival order, RNR NAK when empty, the limit event) are the
//! transport's (roce-user/src/transport/srq.rs).

use core::{ffi::c_int, ptr};

use roce::api::{SrqAttr, SrqAttrMask, SrqId, VerbsDevice};

use super::{
    device::ctx_of,
    guard,
    objects::{device_of, give, pd_parts},
};
use crate::sys;

/// A shared receive queue: the C struct and the engine's id.
#[repr(C)]
pub(super) struct SrqObj {
    ibv: sys::ibv_srq,
    pub(super) id: SrqId,
}

/// Installs `ops.post_srq_recv`.
pub(super) fn fill_ops(ops: &mut sys::ibv_context_ops) {
    ops.post_srq_recv = Some(post_srq_recv);
}

/// The SRQ's id and its context's engine.
///
/// # Safety
/// `srq` must be NULL or a live `SrqObj` of ours.
unsafe fn srq_dev<'a>(srq: *mut sys::ibv_srq) -> Result<(SrqId, &'a dyn VerbsDevice), c_int> {
    if srq.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract; C does not write our fields.
    let (context, id) = unsafe { ((*srq).context, (*srq.cast::<SrqObj>()).id) };
    // SAFETY: the SRQ's context is live while the SRQ is.
    Ok((id, unsafe { device_of(context) }?))
}

/// The attributes as `struct ibv_srq_attr`.
const fn attr_to_ibv(a: SrqAttr) -> sys::ibv_srq_attr {
    sys::ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

export!(
    "IBVERBS_1.1",
    /// `ibv_create_srq`: an SRQ in `pd` of `attr.max_wr` WQEs of `attr.max_sge` SGEs; a
    /// non-zero `attr.srq_limit` arms the limit event at once, as rxe does. The actual sizes
    /// are written back to `init_attr->attr`. EINVAL for a size of 0 or beyond what
    /// `ibv_query_device` reports (`max_srq_wr`, `max_srq_sge`), ENOMEM beyond `max_srq`.
    fn ibv_create_srq(
        pd: *mut sys::ibv_pd,
        init_attr: *mut sys::ibv_srq_init_attr,
    ) -> *mut sys::ibv_srq {
        guard(ptr::null_mut(), || {
            let made = (|| {
                if pd.is_null() || init_attr.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: `init_attr` is the caller's `struct ibv_srq_init_attr`.
                let init = unsafe { &mut *init_attr };
                // SAFETY: `pd` is a live `PdObj` (the verbs contract).
                let (context, pd_id) = unsafe { pd_parts(pd) };
                // SAFETY: the PD's context is live.
                let dev = unsafe { device_of(context) }?;
                let attr = SrqAttr {
                    max_wr: init.attr.max_wr,
                    max_sge: init.attr.max_sge,
                    srq_limit: init.attr.srq_limit,
                };
                let id = dev.create_srq(pd_id, attr).map_err(|e| e.errno())?;
                let actual = dev.query_srq(id).map_err(|e| e.errno())?;
                init.attr = attr_to_ibv(actual);
                let srq = give(SrqObj {
                    ibv: sys::ibv_srq {
                        context,
                        srq_context: init.srq_context,
                        pd,
                        handle: id.0,
                        ..Default::default()
                    },
                    id,
                });
                // SAFETY: `context` is live (`device_of` found it).
                if let Some(ctx) = unsafe { ctx_of(context) } {
                    ctx.verbs.add_srq(id, srq as usize);
                }
                Ok(srq)
            })();
            super::or_null(made)
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event (0 disarms), `IBV_SRQ_MAX_WR`
    /// resizes the queue keeping its WQEs; EINVAL for what rxe refuses (unknown mask bits,
    /// a limit above the size, a size of 0, beyond `max_srq_wr`, below the limit or the WQEs
    /// queued).
    fn ibv_modify_srq(srq: *mut sys::ibv_srq, attr: *mut sys::ibv_srq_attr, mask: c_int) -> c_int {
        guard(libc::EINVAL, || {
            // SAFETY: `srq` is NULL or a live SRQ of ours.
            let (id, dev) = match unsafe { srq_dev(srq) } {
                Ok(x) => x,
                Err(e) => return e,
            };
            if attr.is_null() {
                return libc::EINVAL;
            }
            let Some(mask) = u32::try_from(mask).ok().and_then(SrqAttrMask::from_bits) else {
                return libc::EINVAL;
            };
            // SAFETY: `attr` is the caller's `struct ibv_srq_attr`.
            let a = unsafe { &*attr };
            let attr = SrqAttr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: a.srq_limit,
            };
            dev.modify_srq(id, &attr, mask)
                .map_or_else(|e| e.errno(), |()| 0)
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_query_srq`: `srq_limit` is 0 when the limit is not armed (or fired).
    fn ibv_query_srq(srq: *mut sys::ibv_srq, attr: *mut sys::ibv_srq_attr) -> c_int {
        guard(libc::EINVAL, || {
            // SAFETY: `srq` is NULL or a live SRQ of ours.
            let (id, dev) = match unsafe { srq_dev(srq) } {
                Ok(x) => x,
                Err(e) => return e,
            };
            if attr.is_null() {
                return libc::EINVAL;
            }
            match dev.query_srq(id) {
                Ok(a) => {
                    // SAFETY: `attr` points at the caller's `struct ibv_srq_attr`.
                    unsafe { attr.write(attr_to_ibv(a)) };
                    0
                }
                Err(e) => e.errno(),
            }
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_destroy_srq`: EBUSY while a QP receives through it; its WQEs go without
    /// completions, and its pending events are withdrawn.
    fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
        guard(libc::EINVAL, || {
            // SAFETY: `srq` is NULL or a live SRQ of ours.
            let (id, dev) = match unsafe { srq_dev(srq) } {
                Ok(x) => x,
                Err(e) => return e,
            };
            match dev.destroy_srq(id) {
                Ok(()) => {
                    // SAFETY: `srq` is live until freed below; its context too.
                    if let Some(ctx) = unsafe { ctx_of((*srq).context) } {
                        ctx.verbs.remove_srq(id, srq as usize);
                    }
                    // SAFETY: made by `give` in `ibv_create_srq`; C gives it up with this call.
                    drop(unsafe { Box::from_raw(srq.cast::<SrqObj>()) });
                    0
                }
                Err(e) => e.errno(),
            }
        })
    }
);

/// `ops.post_srq_recv`: posts the list in order; on the first refusal `*bad_wr` names it and
/// its errno is returned (ENOMEM when full, EINVAL for more SGEs than `max_sge`), as rxe.
unsafe extern "C" fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is a live SRQ of ours (the verbs contract).
    let (id, dev) = match unsafe { srq_dev(srq) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    // SAFETY: `wr` and `bad_wr` are the caller's (the verbs contract).
    unsafe {
        super::objects::post_recv_list(wr, bad_wr, |r| {
            dev.post_srq_recv(id, r).map_err(|e| e.errno())
        })
    }
}
