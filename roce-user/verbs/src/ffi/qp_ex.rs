//! The new post-send API: `ibv_create_qp_ex` (through `verbs_context.create_qp_ex`) with
//! `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, `ibv_qp_to_qp_ex`, and the `ibv_wr_*` table of
//! `struct ibv_qp_ex`, with the semantics of rdma-core's rxe provider (providers/rxe/rxe.c):
//! `ibv_wr_start` opens a batch, each builder (`ibv_wr_send`, `ibv_wr_rdma_write`, ...) adds a
//! WR from `qpx->wr_id` and `qpx->wr_flags`, the setters (`ibv_wr_set_sge`,
//! `ibv_wr_set_sge_list`, `ibv_wr_set_ud_addr`) complete the last one, and `ibv_wr_complete`
//! posts the batch, all or none, returning the first error a builder or the post met;
//! `ibv_wr_abort` discards it. `ibv_wr_set_inline_data*` copy the bytes at once.
//!
//! Layout: a QP's `QpObj` starts with its `struct ibv_qp`, followed by a [`QpEx`] whose first
//! field is room for the rest of `struct ibv_qp_ex`, so a QP's address is also the address of
//! its `ibv_qp_ex` (rdma-core's `verbs_qp` union does the same); the assertions below check
//! that against bindgen's layout.

use core::{
    ffi::{c_int, c_void},
    mem::{offset_of, size_of},
    ptr, slice,
};

use roce::api::{LKey, Path, Qpn, RKey, SendFlags, SendOp, SendWr, Sge};

use super::{
    ah::ud_dest_of,
    guard,
    objects::{QpObj, ibv_create_qp, qp_dev},
};
use crate::sys;

/// Bytes of `struct ibv_qp_ex` after its `qp_base`.
const TAIL: usize = size_of::<sys::ibv_qp_ex>() - size_of::<sys::ibv_qp>();

/// Storage for the fields of `struct ibv_qp_ex` after `qp_base`, written and read through
/// the QP's `*mut ibv_qp_ex` only. Zero is every field's initial value (NULL functions).
#[repr(C, align(8))]
struct ExTail([u8; TAIL]);

/// The `ibv_qp_ex` part of a QP and its `ibv_wr_*` batch.
#[repr(C)]
pub(super) struct QpEx {
    /// Must stay first: it continues the QP's `ibv_qp` into an `ibv_qp_ex`.
    tail: ExTail,
    /// Made by `ibv_create_qp_ex` (rdma-core's `VERBS_QP_EX`): `ibv_qp_to_qp_ex` answers.
    is_ex: bool,
    /// The WRs built since `ibv_wr_start`.
    batch: Vec<SendWr<Path>>,
    /// The first error a builder or setter met since `ibv_wr_start`.
    err: c_int,
}

impl Default for QpEx {
    fn default() -> Self {
        Self {
            tail: ExTail([0; TAIL]),
            is_ex: false,
            batch: Vec::new(),
            err: 0,
        }
    }
}

// `qp_base` is followed directly by the tail, and `QpObj` places the tail right after its
// `ibv_qp`: the QP's address is its `ibv_qp_ex`.
const _: () = assert!(offset_of!(sys::ibv_qp_ex, qp_base) == 0);
const _: () = assert!(offset_of!(sys::ibv_qp_ex, comp_mask) == size_of::<sys::ibv_qp>());
const _: () = assert!(align_of::<sys::ibv_qp_ex>() <= align_of::<ExTail>());
const _: () = assert!(offset_of!(QpObj, ex) == size_of::<sys::ibv_qp>());
const _: () = assert!(offset_of!(QpEx, tail) == 0);

/// What `ibv_create_qp_ex` takes besides `IBV_QP_INIT_ATTR_PD`, as rxe
/// (`RXE_QP_COMP_MASK_SUP`).
const COMP_MASK_SUP: u32 = sys::IBV_QP_INIT_ATTR_PD
    | sys::IBV_QP_INIT_ATTR_CREATE_FLAGS
    | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// The `ibv_wr_*` builders offered on RC QPs: rxe's set less memory windows, local
/// invalidate, flush and atomic write, which roce-xdp does not offer.
const RC_SEND_OPS: u64 = (sys::IBV_QP_EX_WITH_RDMA_WRITE
    | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | sys::IBV_QP_EX_WITH_SEND
    | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
    | sys::IBV_QP_EX_WITH_RDMA_READ
    | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | sys::IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

/// The builders on UD QPs (rxe's `RXE_SUP_UD_QP_SEND_OPS_FLAGS`).
const UD_SEND_OPS: u64 = (sys::IBV_QP_EX_WITH_SEND | sys::IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;

/// `verbs_context.create_qp_ex`, what verbs.h's inline `ibv_create_qp_ex` calls when the
/// attributes have more than a PD: EOPNOTSUPP for comp_mask bits, create flags or send ops
/// that are not offered (rxe's `check_qp_init_attr`), EINVAL without a PD; otherwise as
/// `ibv_create_qp`, and with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` the `ibv_wr_*` table filled
/// for the asked builders.
pub(super) unsafe extern "C" fn create_qp_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: `attr` is NULL or the caller's `struct ibv_qp_init_attr_ex`.
        let made = unsafe { create(context, attr) };
        super::or_null(made)
    })
}

/// [`create_qp_ex`]'s work.
///
/// # Safety
/// `attr` must be NULL or the caller's `struct ibv_qp_init_attr_ex`; its PD and CQs ours.
unsafe fn create(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> Result<*mut sys::ibv_qp, c_int> {
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !COMP_MASK_SUP != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let ops = if a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let offered = match a.qp_type {
            sys::IBV_QPT_RC => RC_SEND_OPS,
            sys::IBV_QPT_UD => UD_SEND_OPS,
            _ => 0,
        };
        if a.send_ops_flags & !offered != 0 || offered == 0 {
            return Err(libc::EOPNOTSUPP);
        }
        Some(a.send_ops_flags)
    } else {
        None
    };
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a PD of ours; C does not change its context.
    if unsafe { (*a.pd).context } != context {
        return Err(libc::EINVAL);
    }
    // The classic attributes are the first fields of the extended ones.
    let mut init = sys::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: `a.pd` is the caller's PD, `init` a valid init_attr.
    let qp = unsafe { ibv_create_qp(a.pd, &raw mut init) };
    if qp.is_null() {
        // ibv_create_qp set errno.
        // SAFETY: reading the thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    a.cap = init.cap;
    // SAFETY: `qp` was just made by ibv_create_qp: a `QpObj`, not yet shared.
    unsafe { (*qp.cast::<QpObj>()).ex.is_ex = true };
    if let Some(flags) = ops {
        // SAFETY: the QP's address is its `ibv_qp_ex` (layout asserted above).
        unsafe { fill_table(qp.cast::<sys::ibv_qp_ex>(), flags) };
    }
    Ok(qp)
}

/// Installs the builders `flags` asks for and the setters and batch calls.
///
/// # Safety
/// `qpx` must be a QP of ours not yet in use.
unsafe fn fill_table(qpx: *mut sys::ibv_qp_ex, flags: u64) {
    let has = |f: u32| flags & u64::from(f) != 0;
    // SAFETY: `qpx` is a valid `ibv_qp_ex` (the caller's contract); plain field writes.
    let t = unsafe { &mut *qpx };
    if has(sys::IBV_QP_EX_WITH_SEND) {
        t.wr_send = Some(wr_send);
    }
    if has(sys::IBV_QP_EX_WITH_SEND_WITH_IMM) {
        t.wr_send_imm = Some(wr_send_imm);
    }
    if has(sys::IBV_QP_EX_WITH_SEND_WITH_INV) {
        t.wr_send_inv = Some(wr_send_inv);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_WRITE) {
        t.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        t.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(sys::IBV_QP_EX_WITH_RDMA_READ) {
        t.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        t.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        t.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    t.wr_set_ud_addr = Some(wr_set_ud_addr);
    t.wr_set_sge = Some(wr_set_sge);
    t.wr_set_sge_list = Some(wr_set_sge_list);
    t.wr_set_inline_data = Some(wr_set_inline_data);
    t.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    t.wr_start = Some(wr_start);
    t.wr_complete = Some(wr_complete);
    t.wr_abort = Some(wr_abort);
}

export!(
    "IBVERBS_1.6",
    /// `ibv_qp_to_qp_ex`: the QP as an `ibv_qp_ex` if it was made by `ibv_create_qp_ex`
    /// with more than a PD, else NULL (rdma-core's `VERBS_QP_EX` check).
    fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
        if qp.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: `qp` is a live QP of ours, a `QpObj`.
        if unsafe { (*qp.cast::<QpObj>()).ex.is_ex } {
            qp.cast()
        } else {
            ptr::null_mut()
        }
    }
);

/// The batch state of the QP at `qpx`.
///
/// # Safety
/// `qpx` must be a live QP of ours, used by one thread between `ibv_wr_start` and
/// `ibv_wr_complete`/`ibv_wr_abort` (the verbs rule for a QP's send side).
unsafe fn ex<'a>(qpx: *mut sys::ibv_qp_ex) -> &'a mut QpEx {
    // SAFETY: the caller's contract; `QpObj.ex` follows the `ibv_qp` at the QP's address.
    // The reference covers our fields; the `ibv_qp_ex` fields C writes are read through
    // `qpx` before it is taken.
    unsafe { &mut (*qpx.cast::<QpObj>()).ex }
}

/// A builder: appends a WR of `op` with the QP's current `wr_id` and `wr_flags`.
///
/// # Safety
/// As [`ex`].
unsafe fn build(qpx: *mut sys::ibv_qp_ex, op: SendOp) {
    // SAFETY: `qpx` is a live `ibv_qp_ex`; the program set these two fields.
    let (wr_id, wr_flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    // SAFETY: the caller's contract.
    let e = unsafe { ex(qpx) };
    if e.err != 0 {
        return;
    }
    let mut flags = SendFlags::empty();
    if wr_flags & sys::IBV_SEND_SIGNALED != 0 {
        flags |= SendFlags::SIGNALED;
    }
    if wr_flags & sys::IBV_SEND_SOLICITED != 0 {
        flags |= SendFlags::SOLICITED;
    }
    e.batch.push(SendWr {
        wr_id,
        op,
        sg_list: Vec::new(),
        flags,
        ud: None,
        inline_data: None,
    });
}

/// A setter: changes the last WR built, or records EINVAL when there is none.
///
/// # Safety
/// As [`ex`].
unsafe fn set(qpx: *mut sys::ibv_qp_ex, f: impl FnOnce(&mut SendWr<Path>) -> Result<(), c_int>) {
    // SAFETY: the caller's contract.
    let e = unsafe { ex(qpx) };
    if e.err != 0 {
        return;
    }
    let r = e.batch.last_mut().ok_or(libc::EINVAL).and_then(f);
    if let Err(err) = r {
        e.err = err;
    }
}

// The table's entries. Each is called by the program through `struct ibv_qp_ex` on a QP of
// ours (the verbs contract), which is what [`ex`] needs; none unwinds into C.

unsafe extern "C" fn wr_send(qpx: *mut sys::ibv_qp_ex) {
    // SAFETY: see above.
    guard((), || unsafe { build(qpx, SendOp::Send) });
}

unsafe extern "C" fn wr_send_imm(qpx: *mut sys::ibv_qp_ex, imm_data: u32) {
    let imm = u32::from_be(imm_data);
    // SAFETY: see above.
    guard((), || unsafe { build(qpx, SendOp::SendWithImm { imm }) });
}

unsafe extern "C" fn wr_send_inv(qpx: *mut sys::ibv_qp_ex, invalidate_rkey: u32) {
    let invalidate_rkey = RKey::new(invalidate_rkey);
    // SAFETY: see above.
    guard((), || unsafe {
        build(qpx, SendOp::SendWithInv { invalidate_rkey });
    });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = RKey::new(rkey);
    // SAFETY: see above.
    guard((), || unsafe {
        build(qpx, SendOp::Write { remote_addr, rkey })
    });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    let (rkey, imm) = (RKey::new(rkey), u32::from_be(imm_data));
    // SAFETY: see above.
    guard((), || unsafe {
        build(
            qpx,
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
        );
    });
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = RKey::new(rkey);
    // SAFETY: see above.
    guard((), || unsafe {
        build(qpx, SendOp::Read { remote_addr, rkey })
    });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let rkey = RKey::new(rkey);
    // SAFETY: see above.
    guard((), || unsafe {
        build(
            qpx,
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        );
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let rkey = RKey::new(rkey);
    // SAFETY: see above.
    guard((), || unsafe {
        build(
            qpx,
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            },
        );
    });
}

/// `ibv_wr_set_ud_addr`: the last WR goes to `remote_qpn` (Q_Key `remote_qkey`) through `ah`.
unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: `qpx` is a live QP of ours; its `qp_num` is set at creation.
    let local = Qpn::new(unsafe { (*qpx).qp_base.qp_num });
    // SAFETY: see above; `ah` is an AH of ours or NULL (the verbs contract).
    guard((), || unsafe {
        set(qpx, |wr| {
            wr.ud = Some(ud_dest_of(ah, remote_qpn, remote_qkey, local)?);
            Ok(())
        });
    });
}

/// `ibv_wr_set_sge`: the last WR's one buffer (none for a zero length, as rxe).
unsafe extern "C" fn wr_set_sge(qpx: *mut sys::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: see above.
    guard((), || unsafe {
        set(qpx, |wr| {
            wr.sg_list.clear();
            if length > 0 {
                wr.sg_list.push(Sge {
                    addr,
                    length,
                    lkey: LKey::new(lkey),
                });
            }
            Ok(())
        });
    });
}

/// `ibv_wr_set_sge_list`: the last WR's buffers; ENOSPC for more than the QP's
/// `max_send_sge` (rxe).
unsafe extern "C" fn wr_set_sge_list(
    qpx: *mut sys::ibv_qp_ex,
    num_sge: usize,
    sg_list: *const sys::ibv_sge,
) {
    // SAFETY: `qpx` is a live `QpObj`; `cap` is ours, read only.
    let max = unsafe { (*qpx.cast::<QpObj>()).cap.max_send_sge } as usize;
    // SAFETY: see above; `sg_list` holds `num_sge` entries (the verbs contract).
    guard((), || unsafe {
        set(qpx, |wr| {
            if num_sge > max {
                return Err(libc::ENOSPC);
            }
            if num_sge > 0 && sg_list.is_null() {
                return Err(libc::EINVAL);
            }
            let list = if num_sge == 0 {
                &[][..]
            } else {
                slice::from_raw_parts(sg_list, num_sge)
            };
            wr.sg_list = list
                .iter()
                .map(|s| Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: LKey::new(s.lkey),
                })
                .collect();
            Ok(())
        });
    });
}

/// `ibv_wr_set_inline_data`: the last WR's bytes, copied now (the program may reuse the
/// buffer at once); EINVAL past the QP's `max_inline_data` (rxe).
unsafe extern "C" fn wr_set_inline_data(
    qpx: *mut sys::ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    let buf = sys::ibv_data_buf { addr, length };
    // SAFETY: `qpx` is a live `QpObj`; `buf` is one entry naming the program's bytes.
    unsafe { wr_set_inline_data_list(qpx, 1, &buf) };
}

/// `ibv_wr_set_inline_data_list`: the last WR's bytes, gathered and copied now from
/// `num_buf` buffers; EINVAL when they add up to more than the QP's `max_inline_data`.
unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut sys::ibv_qp_ex,
    num_buf: usize,
    buf_list: *const sys::ibv_data_buf,
) {
    // SAFETY: `qpx` is a live `QpObj`; `cap` is ours, read only.
    let max = unsafe { (*qpx.cast::<QpObj>()).cap.max_inline_data } as usize;
    // SAFETY: see above; `buf_list` holds `num_buf` entries, each naming `length` readable
    // bytes (the verbs contract); they are copied, not kept.
    guard((), || unsafe {
        set(qpx, |wr| {
            if num_buf > 0 && buf_list.is_null() {
                return Err(libc::EINVAL);
            }
            let list = if num_buf == 0 {
                &[][..]
            } else {
                slice::from_raw_parts(buf_list, num_buf)
            };
            let total = list
                .iter()
                .try_fold(0usize, |t, b| t.checked_add(b.length))
                .filter(|&t| t <= max)
                .ok_or(libc::EINVAL)?;
            let mut out = Vec::with_capacity(total);
            for b in list.iter().filter(|b| b.length > 0) {
                if b.addr.is_null() {
                    return Err(libc::EINVAL);
                }
                out.extend_from_slice(slice::from_raw_parts(b.addr.cast::<u8>(), b.length));
            }
            wr.sg_list.clear();
            wr.inline_data = Some(out.into_boxed_slice());
            Ok(())
        });
    });
}

/// `ibv_wr_start`: opens a new batch.
unsafe extern "C" fn wr_start(qpx: *mut sys::ibv_qp_ex) {
    guard((), || {
        // SAFETY: see above.
        let e = unsafe { ex(qpx) };
        e.batch.clear();
        e.err = 0;
    });
}

/// `ibv_wr_complete`: posts the batch, all or none; 0, the first error of a builder or
/// setter, or the post's (ENOMEM for a full send queue, EINVAL for a bad WR).
unsafe extern "C" fn wr_complete(qpx: *mut sys::ibv_qp_ex) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: see above.
        let e = unsafe { ex(qpx) };
        let batch = std::mem::take(&mut e.batch);
        let err = std::mem::replace(&mut e.err, 0);
        if err != 0 {
            return err;
        }
        if batch.is_empty() {
            return 0;
        }
        // SAFETY: see above: a live QP of ours.
        let (obj, dev) = match unsafe { qp_dev(qpx.cast()) } {
            Ok(x) => x,
            Err(e) => return e,
        };
        match dev.post_send_all(Qpn::new(obj.ibv.qp_num), batch) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_wr_abort`: discards the batch.
unsafe extern "C" fn wr_abort(qpx: *mut sys::ibv_qp_ex) {
    guard((), || {
        // SAFETY: see above.
        let e = unsafe { ex(qpx) };
        e.batch.clear();
        e.err = 0;
    });
}
