//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`) and the bind work request
//! of `ibv_post_send` (`IBV_WR_BIND_MW`). verbs.h makes the three verbs static inline calls of
//! `ibv_context.ops.alloc_mw`, `dealloc_mw` and `bind_mw`, so they are ops here, not exported
//! symbols (Debian's libibverbs.so.1 exports none of them either). Semantics are rxe's
//! (rxe_mw.c, rdma-core providers/rxe): type 1 and type 2B windows.

use core::{ffi::c_int, ptr};

use roce::api::{Access, BindMw, LKey, MwType, PdId, Qpn, RKey, SendFlags, SendOp};

use super::{
    guard,
    objects::{device_of, give, pd_parts, qp_dev},
};
use crate::sys;

/// Installs `ops.alloc_mw`, `ops.dealloc_mw` and `ops.bind_mw`.
pub(super) fn fill_ops(ops: &mut sys::ibv_context_ops) {
    ops.alloc_mw = Some(alloc_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    ops.bind_mw = Some(bind_mw);
}

/// A memory window.
#[repr(C)]
struct MwObj {
    ibv: sys::ibv_mw,
    pd: PdId,
}

/// The rights and the zero-based flag of a bind's `mw_access_flags`: the remote rights only
/// (a window grants nothing locally; rxe keeps the bits and checks the remote ones).
fn window_access(flags: u32) -> (Access, bool) {
    let rights = Access::from_bits_truncate(flags)
        & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
    (rights, flags & sys::IBV_ACCESS_ZERO_BASED != 0)
}

/// The transport's bind of `info` for window `mw` (current key `mw_rkey`), new key `new_rkey`.
///
/// # Safety
/// `info.mr` must be NULL or a live region of ours.
unsafe fn bind_of(mw_rkey: u32, new_rkey: u32, info: &sys::ibv_mw_bind_info) -> BindMw {
    let (access, zero_based) = window_access(info.mw_access_flags);
    let mr_lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: a live `ibv_mr` of ours (the caller's contract).
        unsafe { (*info.mr).lkey }
    };
    BindMw {
        mw_rkey: RKey::new(mw_rkey),
        new_key: new_rkey as u8,
        mr_lkey: LKey::new(mr_lkey),
        addr: info.addr,
        length: info.length,
        access,
        zero_based,
    }
}

/// The operation of an `IBV_WR_BIND_MW` work request: binds `wr.bind_mw.mw` with the new key
/// `wr.bind_mw.rkey` (its low 8 bits, rxe) to `wr.bind_mw.bind_info`. The window's `rkey`
/// field is the program's to update (rdma-core does not for type 2).
///
/// # Errors
/// `EINVAL` for a NULL window, or a region-less bind with a range (as `ibv_bind_mw` checks).
///
/// # Safety
/// `wr` must be a valid `IBV_WR_BIND_MW` request whose window and region are NULL or ours.
pub(super) unsafe fn bind_op(wr: &sys::ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: the opcode says the union holds `bind_mw` (the caller's contract).
    let b = unsafe { &wr.__bindgen_anon_2.bind_mw };
    if b.mw.is_null() {
        return Err(libc::EINVAL);
    }
    let info = &b.bind_info;
    if info.mr.is_null() && (info.addr != 0 || info.length != 0) {
        return Err(libc::EINVAL);
    }
    // SAFETY: `b.mw` is a live window of ours.
    let mw_rkey = unsafe { (*b.mw).rkey };
    // SAFETY: `info.mr` is NULL or ours.
    Ok(SendOp::BindMw(unsafe { bind_of(mw_rkey, b.rkey, info) }))
}

/// `ops.alloc_mw`: a type 1 or type 2 window in `pd`; NULL with errno EINVAL for another
/// type, ENOMEM when the window table is full.
unsafe extern "C" fn alloc_mw(pd: *mut sys::ibv_pd, type_: sys::ibv_mw_type) -> *mut sys::ibv_mw {
    guard(ptr::null_mut(), || {
        let made = (|| {
            if pd.is_null() {
                return Err(libc::EINVAL);
            }
            let ty = match type_ {
                sys::IBV_MW_TYPE_1 => MwType::One,
                sys::IBV_MW_TYPE_2 => MwType::Two,
                _ => return Err(libc::EINVAL),
            };
            // SAFETY: `pd` is a live `PdObj` of ours (the verbs contract).
            let (context, id) = unsafe { pd_parts(pd) };
            // SAFETY: the PD's context is live while the PD is.
            let dev = unsafe { device_of(context) }?;
            let rkey = dev.alloc_mw(id, ty).map_err(|e| e.errno())?;
            Ok(give(MwObj {
                ibv: sys::ibv_mw {
                    context,
                    pd,
                    rkey: rkey.value(),
                    handle: rkey.value() >> 16,
                    type_,
                },
                pd: id,
            }))
        })();
        super::or_null(made)
    })
}

/// `ops.dealloc_mw`: frees the window, bound or not (rxe `rxe_dealloc_mw`).
unsafe extern "C" fn dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    guard(libc::EINVAL, || {
        if mw.is_null() {
            return libc::EINVAL;
        }
        let obj = mw.cast::<MwObj>();
        // SAFETY: `mw` came from `alloc_mw` (an `MwObj`) and is not yet freed.
        let (context, pd, rkey) = unsafe { ((*obj).ibv.context, (*obj).pd, (*obj).ibv.rkey) };
        // SAFETY: the window's context is live while the window is.
        let r = unsafe { device_of(context) }
            .and_then(|d| d.dealloc_mw(pd, RKey::new(rkey)).map_err(|e| e.errno()));
        match r {
            Ok(()) => {
                // SAFETY: made by `give` in `alloc_mw`; C gives it up with this call.
                drop(unsafe { Box::from_raw(obj) });
                0
            }
            Err(e) => e,
        }
    })
}

/// `ops.bind_mw` (what verbs.h's `ibv_bind_mw` calls after its own checks), as rdma-core's
/// rxe provider does it: EINVAL for a zero-based bind (IBA o10-36.2.2), else an
/// `IBV_WR_BIND_MW` work request on `qp` with the new key `ibv_inc_rkey(mw->rkey)`, which is
/// written to `mw->rkey` once posted. The bind completes as `IBV_WC_BIND_MW`, or
/// `IBV_WC_MW_BIND_ERR` with rxe's checks (then the program undoes the key, as with rxe).
unsafe extern "C" fn bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    mw_bind: *mut sys::ibv_mw_bind,
) -> c_int {
    guard(libc::EINVAL, || {
        if mw.is_null() || mw_bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `qp` is a live QP of ours (the verbs contract).
        let dev = match unsafe { qp_dev(qp) } {
            Ok((_, dev)) => dev,
            Err(e) => return e,
        };
        // SAFETY: `qp` is live (checked non-NULL by `qp_dev`); C does not change these fields.
        let (qp_type, qp_num) = unsafe { ((*qp).qp_type, (*qp).qp_num) };
        if qp_type != sys::IBV_QPT_RC {
            return libc::EINVAL;
        }
        // SAFETY: the caller's `struct ibv_mw_bind` and live window.
        let (b, mw_rkey) = unsafe { (&*mw_bind, (*mw).rkey) };
        // SAFETY: `bind_info.mr` is NULL or ours (the verbs contract).
        let bind = unsafe { bind_of(mw_rkey, 0, &b.bind_info) };
        if bind.zero_based {
            return libc::EINVAL;
        }
        let mut flags = SendFlags::empty();
        if b.send_flags & sys::IBV_SEND_SIGNALED != 0 {
            flags |= SendFlags::SIGNALED;
        }
        match dev.bind_mw(Qpn::new(qp_num), b.wr_id, flags, bind) {
            Ok(k) => {
                // SAFETY: the live window; the program reads its key after this call.
                unsafe { (*mw).rkey = k.value() };
                0
            }
            Err(e) => e.errno(),
        }
    })
}
