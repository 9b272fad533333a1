//! The extended CQ: `ibv_create_cq_ex` (`verbs_context.create_cq_ex`) and the polling
//! interface that verbs.h's inline `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and
//! `ibv_wc_read_*` reach through the function pointers of `struct ibv_cq_ex`. Every CQ of the
//! library is an `ibv_cq_ex` ([`CqObj`]), so a CQ made either way can be polled either way.
//!
//! As rxe (rdma-core providers/rxe `rxe_create_cq_ex`): the standard `wc_flags`
//! (`IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp, slid, sl, dlid_path_bits) and no
//! others (EOPNOTSUPP: no completion timestamps, CVLAN, flow tag or tag matching);
//! `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` is EOPNOTSUPP as rxe's kernel side answers it;
//! `ibv_start_poll` on an empty CQ is ENOENT.

use core::{
    ffi::{c_int, c_uint},
    ptr,
    sync::atomic::Ordering,
};

use roce::api::Wc;

use super::{
    guard,
    objects::{CqObj, device_of, make_cq},
};
use crate::{sys, verbs::wc_to_ibv};

/// The `wc_flags` an extended CQ can report (rxe's `RXE_SUPPORTED_WC_FLAGS`).
const SUPPORTED_WC_FLAGS: u64 = sys::IBV_WC_STANDARD_FLAGS as u64;

/// The `comp_mask` bits of `ibv_cq_init_attr_ex` that verbs.h defines.
const KNOWN_INIT_MASK: u32 = sys::IBV_CQ_INIT_ATTR_MASK_FLAGS | sys::IBV_CQ_INIT_ATTR_MASK_PD;

/// Installs the polling functions of an extended CQ (every CQ of ours).
pub(super) fn fill(cq: &mut sys::ibv_cq_ex) {
    cq.start_poll = Some(start_poll);
    cq.next_poll = Some(next_poll);
    cq.end_poll = Some(end_poll);
    cq.read_opcode = Some(read_opcode);
    cq.read_vendor_err = Some(read_vendor_err);
    cq.read_byte_len = Some(read_byte_len);
    cq.read_imm_data = Some(read_imm_data);
    cq.read_qp_num = Some(read_qp_num);
    cq.read_src_qp = Some(read_src_qp);
    cq.read_wc_flags = Some(read_wc_flags);
    cq.read_slid = Some(read_slid);
    cq.read_sl = Some(read_sl);
    cq.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// `verbs_context.create_cq_ex`, what verbs.h's inline `ibv_create_cq_ex` calls: a CQ of
/// `attr.cqe` entries on `attr.channel`, or NULL with errno: EINVAL for unknown `comp_mask`
/// bits or a bad size, EOPNOTSUPP for `wc_flags` beyond the standard ones, a parent domain
/// (`IBV_CQ_INIT_ATTR_MASK_PD`) or `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`.
///
/// # Safety
/// `context` is a context of ours and `attr` NULL or valid for reads (the verbs contract).
pub(super) unsafe extern "C" fn create_cq_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    guard(ptr::null_mut(), || {
        let made = (|| {
            if attr.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: non-null and valid for reads (the caller's contract).
            let a = unsafe { *attr };
            if a.comp_mask & !KNOWN_INIT_MASK != 0 {
                return Err(libc::EINVAL);
            }
            if a.wc_flags & !SUPPORTED_WC_FLAGS != 0
                || a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_PD != 0
            {
                return Err(libc::EOPNOTSUPP);
            }
            let flags = if a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_FLAGS == 0 {
                0
            } else {
                a.flags
            };
            // Single-threaded is a hint (no lock needed); ignoring overruns is not offered.
            if flags & !sys::IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
            // SAFETY: `context` is ours and `a.channel` NULL or a channel of ours (the caller's
            // contract).
            unsafe { make_cq(context, cqe, a.cq_context, a.channel) }
        })();
        super::or_null(made)
    })
}

/// `ibv_start_poll`: takes the CQ for a polling batch and its oldest completion, 0; or ENOENT
/// when it has none (the batch then ends here, without `ibv_end_poll`); EINVAL for a
/// `comp_mask` (reserved, must be zero).
unsafe extern "C" fn start_poll(
    cq: *mut sys::ibv_cq_ex,
    attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `attr` is NULL or valid for reads (the verbs contract).
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    let obj = cq.cast::<CqObj>();
    // SAFETY: `cq` is a live `CqObj` (every CQ of ours is one); `polling` is an atomic.
    let polling = unsafe { &(*obj).polling };
    while polling
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let r = next(obj);
    if r != 0 {
        polling.store(false, Ordering::Release);
    }
    r
}

/// `ibv_next_poll`: the next completion of the batch, 0; or ENOENT.
unsafe extern "C" fn next_poll(cq: *mut sys::ibv_cq_ex) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    next(cq.cast::<CqObj>())
}

/// `ibv_end_poll`: ends the batch a successful `ibv_start_poll` began.
unsafe extern "C" fn end_poll(cq: *mut sys::ibv_cq_ex) {
    if !cq.is_null() {
        // SAFETY: `cq` is a live `CqObj`; `polling` is an atomic.
        unsafe { &(*cq.cast::<CqObj>()).polling }.store(false, Ordering::Release);
    }
}

/// Takes the CQ's oldest completion into `cur`, `status` and `wr_id`: 0, or ENOENT.
fn next(obj: *mut CqObj) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: `obj` is a live `CqObj`, held by this thread's polling batch.
        let (context, id) = unsafe { ((*obj).ibv.context, (*obj).id) };
        // SAFETY: the CQ's context is live while the CQ is.
        let Ok(dev) = (unsafe { device_of(context) }) else {
            return libc::EINVAL;
        };
        let mut w = [Wc::default(); 1];
        match dev.poll_cq(id, &mut w) {
            Ok(0) => return libc::ENOENT,
            Ok(_) => {}
            Err(e) => return e.errno(),
        }
        let wc = wc_to_ibv(&w[0]);
        // SAFETY: as above; only the batch's holder writes these fields, and C reads them
        // only after this call returns.
        unsafe {
            (*obj).cur = wc;
            (*obj).ibv.status = wc.status;
            (*obj).ibv.wr_id = wc.wr_id;
        }
        0
    })
}

/// The completion of the current batch step.
///
/// # Safety
/// `cq` is a live CQ of ours inside a polling batch (the verbs contract of `ibv_wc_read_*`).
unsafe fn cur<'a>(cq: *mut sys::ibv_cq_ex) -> &'a sys::ibv_wc {
    // SAFETY: the caller's contract; `cur` was written by this thread's last poll.
    unsafe { &(*cq.cast::<CqObj>()).cur }
}

/// `ibv_wc_read_opcode`.
unsafe extern "C" fn read_opcode(cq: *mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.opcode
}

/// `ibv_wc_read_vendor_err`.
unsafe extern "C" fn read_vendor_err(cq: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.vendor_err
}

/// `ibv_wc_read_byte_len`.
unsafe extern "C" fn read_byte_len(cq: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.byte_len
}

/// `ibv_wc_read_imm_data`: the immediate data (big-endian, as in `ibv_wc`), or the
/// invalidated R_Key of a SEND with invalidate, which shares its place.
unsafe extern "C" fn read_imm_data(cq: *mut sys::ibv_cq_ex) -> sys::__be32 {
    // SAFETY: the verbs contract ([`cur`]); both members of the union are a u32.
    unsafe { cur(cq).__bindgen_anon_1.imm_data }
}

/// `ibv_wc_read_qp_num`.
unsafe extern "C" fn read_qp_num(cq: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.qp_num
}

/// `ibv_wc_read_src_qp`.
unsafe extern "C" fn read_src_qp(cq: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.src_qp
}

/// `ibv_wc_read_wc_flags`.
unsafe extern "C" fn read_wc_flags(cq: *mut sys::ibv_cq_ex) -> c_uint {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.wc_flags
}

/// `ibv_wc_read_slid` (0 on RoCE, as in `ibv_wc`).
unsafe extern "C" fn read_slid(cq: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the verbs contract ([`cur`]).
    u32::from(unsafe { cur(cq) }.slid)
}

/// `ibv_wc_read_sl`.
unsafe extern "C" fn read_sl(cq: *mut sys::ibv_cq_ex) -> u8 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.sl
}

/// `ibv_wc_read_dlid_path_bits`.
unsafe extern "C" fn read_dlid_path_bits(cq: *mut sys::ibv_cq_ex) -> u8 {
    // SAFETY: the verbs contract ([`cur`]).
    unsafe { cur(cq) }.dlid_path_bits
}
