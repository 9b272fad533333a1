//! Protection domains, memory regions, completion queues and queue pairs, and the data path
//! that programs reach through `ibv_context.ops` (post_send, post_recv, poll_cq).
//!
//! Each object C holds is the first field of a `#[repr(C)]` box of ours (`PdObj`, `MrObj`,
//! `CqObj`, `QpObj`), made by `Box::leak` and freed by its destroy verb, so a pointer C passes
//! back is also a pointer to our box. The engine behind the context is started by the first
//! `ibv_alloc_pd` (`Verbs::device`).

use core::{
    ffi::{c_int, c_void},
    ptr, slice,
};
use std::sync::Arc;

use roce::api::{
    ApiError, AttrMask, CqId, LKey, Path, PdId, QpCap, QpInit, QpType, Qpn, RKey, RawMem, RecvWr,
    SendFlags, SendOp, SendWr, Sge, VerbsDevice, Wc,
};

use super::{device::ctx_of, guard, qp_ex::QpEx, set_errno};
use crate::{
    sys,
    verbs::{Channel, access_from_ibv, qp_attr_from_ibv, wc_to_ibv},
};

/// Installs the data-path entries of `ibv_context.ops`, which verbs.h's inline
/// `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` call.
pub(super) fn fill_ops(ops: &mut sys::ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    super::mw::fill_ops(ops);
}

/// The engine of the context `context`, started if needed.
///
/// # Safety
/// `context` must be NULL or a live context of ours.
pub(super) unsafe fn device_of<'a>(
    context: *mut sys::ibv_context,
) -> Result<&'a dyn VerbsDevice, c_int> {
    // SAFETY: the caller's contract.
    unsafe { ctx_of(context) }
        .ok_or(libc::EINVAL)?
        .verbs
        .device()
}

/// Leaks `b` to C and returns its first field's address.
pub(super) fn give<T>(b: T) -> *mut T {
    Box::into_raw(Box::new(b))
}

/// A protection domain.
#[repr(C)]
pub(super) struct PdObj {
    pub(super) ibv: sys::ibv_pd,
    pub(super) id: PdId,
}

/// The context and the engine's id of a PD, for the verbs that create objects in it.
///
/// # Safety
/// `pd` is a live `ibv_pd` of ours (the first field of a [`PdObj`]), as verbs require of
/// every PD passed in.
pub(super) unsafe fn pd_parts(pd: *mut sys::ibv_pd) -> (*mut sys::ibv_context, PdId) {
    // SAFETY: the caller's contract.
    let obj = unsafe { &*pd.cast::<PdObj>() };
    (obj.ibv.context, obj.id)
}

export!(
    "IBVERBS_1.1",
    /// `ibv_alloc_pd`; the first call on a context starts its engine.
    fn ibv_alloc_pd(context: *mut sys::ibv_context) -> *mut sys::ibv_pd {
        guard(ptr::null_mut(), || {
            // SAFETY: `context` is NULL or a live context of ours (the verbs contract).
            let made =
                unsafe { device_of(context) }.and_then(|d| d.alloc_pd().map_err(|e| e.errno()));
            match made {
                Ok(id) => give(PdObj {
                    ibv: sys::ibv_pd {
                        context,
                        handle: id.0,
                    },
                    id,
                })
                .cast(),
                Err(e) => {
                    set_errno(e);
                    ptr::null_mut()
                }
            }
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_dealloc_pd`: EBUSY while regions or QPs use it (the PD stays valid then).
    fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
        if pd.is_null() {
            return libc::EINVAL;
        }
        let obj = pd.cast::<PdObj>();
        // SAFETY: `pd` came from `ibv_alloc_pd` (a `PdObj`) and is not yet freed.
        let (context, id) = unsafe { ((*obj).ibv.context, (*obj).id) };
        // SAFETY: the PD's context is live while the PD is.
        let r = unsafe { device_of(context) }.and_then(|d| d.dealloc_pd(id).map_err(|e| e.errno()));
        match r {
            Ok(()) => {
                // SAFETY: made by `give` in `ibv_alloc_pd`; C gives it up with this call.
                drop(unsafe { Box::from_raw(obj) });
                0
            }
            Err(e) => e,
        }
    }
);

/// A memory region over the program's memory.
#[repr(C)]
struct MrObj {
    ibv: sys::ibv_mr,
}

/// `ibv_reg_mr_iova2`'s work: registers `[addr, addr + length)` at `iova`.
///
/// # Safety
/// `pd` must be NULL or a live PD of ours, and the memory must stay valid until the region is
/// deregistered (the verbs contract of `ibv_reg_mr`).
unsafe fn reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut sys::ibv_mr {
    let made = (|| {
        if pd.is_null() {
            return Err(libc::EINVAL);
        }
        let obj = pd.cast::<PdObj>();
        // SAFETY: `pd` is a live `PdObj` (the caller's contract).
        let (context, id) = unsafe { ((*obj).ibv.context, (*obj).id) };
        let access = access_from_ibv(access)?;
        // SAFETY: the caller keeps `[addr, addr + length)` valid for reads and writes until
        // `ibv_dereg_mr` returns, which is `RawMem::new`'s contract.
        let mem = unsafe { RawMem::new(addr.cast(), length) }.ok_or(libc::EINVAL)?;
        // SAFETY: the PD's context is live while the PD is.
        let dev = unsafe { device_of(context) }?;
        let info = dev.reg_mr(id, mem, iova, access).map_err(|e| e.errno())?;
        Ok(give(MrObj {
            ibv: sys::ibv_mr {
                context,
                pd,
                addr,
                length,
                handle: info.lkey.value(),
                lkey: info.lkey.value(),
                rkey: info.rkey.value(),
            },
        }))
    })();
    super::or_null(made)
}

export!(
    "IBVERBS_1.1",
    /// `ibv_reg_mr` (with constant access flags verbs.h calls this one): the region's I/O
    /// virtual address is `addr`. The transport reads and writes the program's memory in
    /// place.
    fn ibv_reg_mr(
        pd: *mut sys::ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut sys::ibv_mr {
        // SAFETY: the verbs contract of `ibv_reg_mr` is `reg_mr`'s.
        guard(ptr::null_mut(), || unsafe {
            reg_mr(pd, addr, length, addr as u64, access as u32)
        })
    }
);

export!(
    "IBVERBS_1.7",
    /// `ibv_reg_mr_iova`: the region answers to `iova..iova + length`.
    fn ibv_reg_mr_iova(
        pd: *mut sys::ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: c_int,
    ) -> *mut sys::ibv_mr {
        // SAFETY: the verbs contract of `ibv_reg_mr_iova` is `reg_mr`'s.
        guard(ptr::null_mut(), || unsafe {
            reg_mr(pd, addr, length, iova, access as u32)
        })
    }
);

export!(
    "IBVERBS_1.8",
    /// `ibv_reg_mr_iova2` (verbs.h's `ibv_reg_mr` with non-constant flags calls this one).
    fn ibv_reg_mr_iova2(
        pd: *mut sys::ibv_pd,
        addr: *mut c_void,
        length: usize,
        iova: u64,
        access: u32,
    ) -> *mut sys::ibv_mr {
        // SAFETY: the verbs contract of `ibv_reg_mr_iova2` is `reg_mr`'s.
        guard(ptr::null_mut(), || unsafe {
            reg_mr(pd, addr, length, iova, access)
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_dereg_mr`: when it returns, no operation touches the memory any more.
    fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
        if mr.is_null() {
            return libc::EINVAL;
        }
        let obj = mr.cast::<MrObj>();
        // SAFETY: `mr` came from `reg_mr` (an `MrObj`) and is not yet freed.
        let (context, lkey) = unsafe { ((*obj).ibv.context, LKey::new((*obj).ibv.lkey)) };
        // SAFETY: the region's context is live while the region is.
        let r = unsafe { device_of(context) }.and_then(|d| d.dereg_mr(lkey).map_err(|e| e.errno()));
        match r {
            Ok(_) => {
                // SAFETY: made by `give` in `reg_mr`; C gives it up with this call.
                drop(unsafe { Box::from_raw(obj) });
                0
            }
            Err(e) => e,
        }
    }
);

/// A completion queue: an `ibv_cq_ex` whose first part is the `ibv_cq` that `ibv_create_cq`
/// returns (verbs.h's `ibv_cq_ex_to_cq` is that cast), so every CQ can be polled both ways:
/// `ibv_poll_cq` through `ops.poll_cq`, and `ibv_start_poll` and the `ibv_wc_read_*` calls
/// through the function pointers of the `ibv_cq_ex` (ffi/cq_ex.rs).
#[repr(C)]
pub(super) struct CqObj {
    pub(super) ibv: sys::ibv_cq_ex,
    pub(super) id: CqId,
    /// The completion `ibv_start_poll`/`ibv_next_poll` took, which the `ibv_wc_read_*` calls
    /// read.
    pub(super) cur: sys::ibv_wc,
    /// Held from a successful `ibv_start_poll` to `ibv_end_poll`, as providers lock the CQ
    /// over a polling batch, so that two threads never share `cur`.
    pub(super) polling: core::sync::atomic::AtomicBool,
}

/// Makes a CQ of `cqe` entries (`ibv_create_cq` and `ibv_create_cq_ex`); with a completion
/// channel, its events (armed by `ibv_req_notify_cq`) go to that channel.
///
/// # Safety
/// `context` is NULL or a live context of ours; `channel` is NULL or a live channel of ours.
pub(super) unsafe fn make_cq(
    context: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
) -> Result<*mut CqObj, c_int> {
    let depth = usize::try_from(cqe)
        .ok()
        .filter(|&d| d > 0)
        .ok_or(libc::EINVAL)?;
    // SAFETY: `context` is NULL or a live context of ours (the caller's contract).
    let dev = unsafe { device_of(context) }?;
    let chan = if channel.is_null() {
        None
    } else {
        // SAFETY: `channel` is a live channel of ours (the caller's contract).
        let obj = unsafe { &*channel.cast::<ChanObj>() };
        if obj.ibv.context != context {
            return Err(libc::EINVAL);
        }
        Some(Arc::clone(&obj.state))
    };
    let id = dev.create_cq(depth).map_err(|e| e.errno())?;
    // SAFETY: all zeroes is a valid `ibv_cq_ex` (null pointers, `None` functions, zero
    // integers and an all-zero, unused pthread mutex and condition).
    let mut ibv: sys::ibv_cq_ex = unsafe { core::mem::zeroed() };
    ibv.context = context;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.handle = id.0;
    ibv.cqe = cqe;
    super::cq_ex::fill(&mut ibv);
    let cq = give(CqObj {
        ibv,
        id,
        cur: sys::ibv_wc::default(),
        polling: core::sync::atomic::AtomicBool::new(false),
    });
    // SAFETY: `context` is live (`device_of` found it above).
    if let Some(ctx) = unsafe { ctx_of(context) } {
        ctx.verbs.add_cq(id, cq as usize);
    }
    if let Some(state) = chan {
        // SAFETY: `context` is live (`device_of` found it above).
        let ctx = unsafe { ctx_of(context) }.ok_or(libc::EINVAL)?;
        if let Err(e) = ctx.verbs.route(id, state, cq as usize) {
            let _ = dev.destroy_cq(id);
            // SAFETY: just made by `give`, never handed to C.
            drop(unsafe { Box::from_raw(cq) });
            return Err(e);
        }
        // SAFETY: `channel` is a live `ChanObj`; C does not write its refcnt.
        unsafe { (*channel).refcnt += 1 };
    }
    Ok(cq)
}

export!(
    "IBVERBS_1.1",
    /// `ibv_create_cq`; with a completion channel, its events (armed by
    /// `ibv_req_notify_cq`) go to that channel.
    fn ibv_create_cq(
        context: *mut sys::ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut sys::ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut sys::ibv_cq {
        let _ = comp_vector;
        guard(ptr::null_mut(), || {
            // SAFETY: `context` and `channel` are NULL or live objects of ours (the verbs
            // contract).
            super::or_null(unsafe { make_cq(context, cqe, cq_context, channel) })
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_destroy_cq`: EBUSY while a QP uses it.
    fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
        if cq.is_null() {
            return libc::EINVAL;
        }
        let obj = cq.cast::<CqObj>();
        // SAFETY: `cq` came from `ibv_create_cq` (a `CqObj`) and is not yet freed.
        let (context, id) = unsafe { ((*obj).ibv.context, (*obj).id) };
        // SAFETY: the CQ's context is live while the CQ is.
        let r = unsafe { device_of(context) }.and_then(|d| d.destroy_cq(id).map_err(|e| e.errno()));
        match r {
            Ok(()) => {
                // SAFETY: as above; the context is live.
                if let Some(ctx) = unsafe { ctx_of(context) } {
                    ctx.verbs.unroute(id, cq as usize);
                    ctx.verbs.remove_cq(id, cq as usize);
                }
                // SAFETY: made by `give` in `ibv_create_cq`; C gives it up with this call.
                let b = unsafe { Box::from_raw(obj) };
                if !b.ibv.channel.is_null() {
                    // SAFETY: a CQ's channel outlives it (destroying one in use is EBUSY).
                    unsafe { (*b.ibv.channel).refcnt -= 1 };
                }
                0
            }
            Err(e) => e,
        }
    }
);

/// `ops.poll_cq`: up to `num` completions into `wc`, without allocating; the count, or a
/// negative value on error.
unsafe extern "C" fn poll_cq(cq: *mut sys::ibv_cq, num: c_int, wc: *mut sys::ibv_wc) -> c_int {
    let Ok(num) = usize::try_from(num) else {
        return -1;
    };
    if cq.is_null() || (wc.is_null() && num > 0) {
        return -1;
    }
    let obj = cq.cast::<CqObj>();
    // SAFETY: `cq` is a live `CqObj` (the verbs contract).
    let (context, id) = unsafe { ((*obj).ibv.context, (*obj).id) };
    // SAFETY: the CQ's context is live while the CQ is.
    let Ok(dev) = (unsafe { device_of(context) }) else {
        return -1;
    };
    let mut buf = [Wc::default(); 32];
    let mut done = 0;
    while done < num {
        let want = (num - done).min(buf.len());
        let got = match dev.poll_cq(id, &mut buf[..want]) {
            Ok(n) => n,
            // The engine behind the device is gone: what was polled, or a failure.
            Err(_) if done > 0 => break,
            Err(_) => return -1,
        };
        for (i, w) in buf[..got].iter().enumerate() {
            // SAFETY: `wc` holds `num` entries (the caller's array); `done + i < num`.
            unsafe { wc.add(done + i).write(wc_to_ibv(w)) };
        }
        done += got;
        if got < want {
            break;
        }
    }
    c_int::try_from(done).unwrap_or(c_int::MAX)
}

/// `ops.req_notify_cq`: arms the CQ for one event on its channel.
unsafe extern "C" fn req_notify_cq(cq: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `cq` is a live `CqObj` (the verbs contract).
    let (context, id) = unsafe { ((*cq.cast::<CqObj>()).ibv.context, (*cq.cast::<CqObj>()).id) };
    // SAFETY: the CQ's context is live while the CQ is.
    match unsafe { device_of(context) } {
        Ok(d) => d
            .req_notify_cq(id, solicited_only != 0)
            .map_or_else(|e| e.errno(), |()| 0),
        Err(e) => e,
    }
}

/// A queue pair.
#[repr(C)]
pub(super) struct QpObj {
    pub(super) ibv: sys::ibv_qp,
    /// Continues `ibv` into a `struct ibv_qp_ex`, and the `ibv_wr_*` batch (ffi/qp_ex.rs).
    pub(super) ex: QpEx,
    pub(super) cap: sys::ibv_qp_cap,
    sq_sig_all: bool,
    /// The address vector of the last `ibv_modify_qp` with `IBV_QP_AV`, for `ibv_query_qp`.
    ah: Option<sys::ibv_ah_attr>,
}

export!(
    "IBVERBS_1.1",
    /// `ibv_create_qp`: RC, UC and UD, with or without an SRQ (`init_attr->srq`: the QP's
    /// receives are the SRQ's WQEs, `max_recv_wr` and `max_recv_sge` are ignored and read
    /// back 0, `ibv_post_recv` on it is EINVAL as in rxe). Inline data up to the device's
    /// limit (rxe's 400 bytes; more is EINVAL, as rxe `rxe_qp_chk_cap`). The actual
    /// capacities are written back to `init_attr->cap`.
    fn ibv_create_qp(
        pd: *mut sys::ibv_pd,
        init_attr: *mut sys::ibv_qp_init_attr,
    ) -> *mut sys::ibv_qp {
        guard(ptr::null_mut(), || {
            let made = (|| {
                if pd.is_null() || init_attr.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: `init_attr` is the caller's `struct ibv_qp_init_attr`.
                let init = unsafe { &mut *init_attr };
                // SAFETY: `pd` is a live `PdObj`.
                let (context, pd_id) = unsafe { pd_parts(pd) };
                let srq = if init.srq.is_null() {
                    None
                } else {
                    // SAFETY: `init.srq` is a live SRQ of ours (the verbs contract).
                    let s = unsafe { &*init.srq };
                    if s.context != context {
                        return Err(libc::EINVAL);
                    }
                    // SAFETY: as above; an `ibv_srq` of ours is the first field of an `SrqObj`.
                    Some(unsafe { (*init.srq.cast::<super::srq::SrqObj>()).id })
                };
                let qp_type = match init.qp_type {
                    sys::IBV_QPT_RC => QpType::Rc,
                    // UC: SEND and RDMA WRITE without ACKs (transport/qp/uc.rs); modify takes
                    // UC's attribute masks, READ/atomics are refused by post_send (EINVAL).
                    sys::IBV_QPT_UC => QpType::Uc,
                    sys::IBV_QPT_UD => QpType::Ud,
                    _ => return Err(libc::EOPNOTSUPP),
                };
                if init.send_cq.is_null() || init.recv_cq.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the CQs are live `CqObj`s of ours (the verbs contract).
                let (send_cq, recv_cq) = unsafe {
                    (
                        (*init.send_cq.cast::<CqObj>()).id,
                        (*init.recv_cq.cast::<CqObj>()).id,
                    )
                };
                if srq.is_some() {
                    // The SRQ's WQEs are the QP's receives: its own receive queue is unused.
                    init.cap.max_recv_wr = 0;
                    init.cap.max_recv_sge = 0;
                }
                let cap = QpCap {
                    max_send_wr: init.cap.max_send_wr,
                    max_recv_wr: init.cap.max_recv_wr,
                    max_sge: init.cap.max_send_sge.max(init.cap.max_recv_sge).max(1),
                    max_inline_data: init.cap.max_inline_data,
                };
                // SAFETY: `context` is the PD's, live.
                let dev = unsafe { device_of(context) }?;
                let qpn = dev
                    .create_qp(
                        QpInit {
                            cap,
                            sq_sig_all: init.sq_sig_all != 0,
                            send_cq,
                            recv_cq,
                            ..QpInit::new(qp_type, pd_id, send_cq)
                        },
                        srq,
                    )
                    .map_err(|e| e.errno())?;
                init.cap.max_send_sge = cap.max_sge;
                if srq.is_none() {
                    init.cap.max_recv_sge = cap.max_sge;
                }
                let ibv = sys::ibv_qp {
                    context,
                    qp_context: init.qp_context,
                    pd,
                    send_cq: init.send_cq,
                    recv_cq: init.recv_cq,
                    handle: qpn.value(),
                    qp_num: qpn.value(),
                    state: sys::IBV_QPS_RESET,
                    qp_type: init.qp_type,
                    srq: init.srq,
                    ..Default::default()
                };
                let qp = give(QpObj {
                    ibv,
                    ex: QpEx::default(),
                    cap: init.cap,
                    sq_sig_all: init.sq_sig_all != 0,
                    ah: None,
                });
                // SAFETY: `context` is live (`device_of` found it above).
                if let Some(ctx) = unsafe { ctx_of(context) } {
                    ctx.verbs.add_qp(qpn, qp as usize);
                }
                Ok(qp)
            })();
            super::or_null(made)
        })
    }
);

/// The QP's number and its context's engine.
///
/// # Safety
/// `qp` must be a live `QpObj` of ours.
pub(super) unsafe fn qp_dev<'a>(
    qp: *mut sys::ibv_qp,
) -> Result<(&'a mut QpObj, &'a dyn VerbsDevice), c_int> {
    if qp.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract; C does not touch our fields, and verbs forbid
    // concurrent modify/destroy of one QP.
    let obj = unsafe { &mut *qp.cast::<QpObj>() };
    // SAFETY: the QP's context is live while the QP is.
    let dev = unsafe { device_of(obj.ibv.context) }?;
    Ok((obj, dev))
}

export!(
    "IBVERBS_1.1",
    /// `ibv_destroy_qp`.
    fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
        // SAFETY: `qp` is NULL or a live QP of ours (the verbs contract).
        let (obj, dev) = match unsafe { qp_dev(qp) } {
            Ok(x) => x,
            Err(e) => return e,
        };
        match dev.destroy_qp(Qpn::new(obj.ibv.qp_num)) {
            Ok(()) => {
                // SAFETY: the QP's context is live while the QP is.
                if let Some(ctx) = unsafe { ctx_of(obj.ibv.context) } {
                    ctx.verbs.remove_qp(Qpn::new(obj.ibv.qp_num), qp as usize);
                }
                // SAFETY: made by `give` in `ibv_create_qp`; C gives it up with this call.
                drop(unsafe { Box::from_raw(ptr::from_mut(obj)) });
                0
            }
            Err(e) => e.errno(),
        }
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_modify_qp`: the address vector's GRH (destination GID, source GID index) is
    /// resolved to a path through the kernel's routes and neighbours, as rxe does.
    fn ibv_modify_qp(qp: *mut sys::ibv_qp, attr: *mut sys::ibv_qp_attr, attr_mask: c_int) -> c_int {
        guard(libc::EINVAL, || {
            // SAFETY: `qp` is NULL or a live QP of ours.
            let (obj, dev) = match unsafe { qp_dev(qp) } {
                Ok(x) => x,
                Err(e) => return e,
            };
            if attr.is_null() {
                return libc::EINVAL;
            }
            // SAFETY: `attr` is the caller's `struct ibv_qp_attr`.
            let a = unsafe { &*attr };
            let qpn = Qpn::new(obj.ibv.qp_num);
            let resolve = |ah: &sys::ibv_ah_attr| -> Result<Path, c_int> {
                // SAFETY: `ibv_gid` is a union of plain bytes; `raw` is always valid.
                let dgid = unsafe { ah.grh.dgid.raw };
                dev.path_to(
                    usize::from(ah.grh.sgid_index),
                    &dgid,
                    qpn,
                    Qpn::new(a.dest_qp_num & 0xff_ffff),
                )
                .map_err(|e: ApiError| {
                    eprintln!("libibverbs (roce-xdp): no path to the QP's destination: {e:#}");
                    e.errno()
                })
            };
            let (attr, mask) = match qp_attr_from_ibv(a, attr_mask, resolve) {
                Ok(x) => x,
                Err(e) => return e,
            };
            match dev.modify_qp(qpn, &attr, mask) {
                Ok(()) => {
                    if let Some(s) = dev.qp_state(qpn) {
                        obj.ibv.state = s.code();
                    }
                    if mask.contains(AttrMask::AV) {
                        obj.ah = Some(a.ah_attr);
                    }
                    0
                }
                Err(e) => e.errno(),
            }
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_query_qp`: every attribute, whatever the mask (as rxe), and the creation
    /// attributes.
    fn ibv_query_qp(
        qp: *mut sys::ibv_qp,
        attr: *mut sys::ibv_qp_attr,
        attr_mask: c_int,
        init_attr: *mut sys::ibv_qp_init_attr,
    ) -> c_int {
        // SAFETY: `qp` is NULL or a live QP of ours.
        let (obj, dev) = match unsafe { qp_dev(qp) } {
            Ok(x) => x,
            Err(e) => return e,
        };
        let _ = attr_mask;
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let Some((qp_type, state, a)) = (match dev.query_qp(Qpn::new(obj.ibv.qp_num)) {
            Ok(q) => q,
            Err(e) => return e.errno(),
        }) else {
            return libc::EINVAL;
        };
        let state = state.code();
        let mut out = sys::ibv_qp_attr {
            qp_state: state,
            cur_qp_state: state,
            cap: obj.cap,
            qp_access_flags: crate::verbs::access_to_ibv(a.qp_access_flags),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            path_mtu: a.path_mtu as u32,
            rq_psn: a.rq_psn.value(),
            sq_psn: a.sq_psn.value(),
            dest_qp_num: a.dest_qp_num.value(),
            // The address vector the program gave (rxe answers with the one it was given).
            ah_attr: obj.ah.unwrap_or_default(),
            ..Default::default()
        };
        // The attributes only RC has (UC and UD leave them 0, as rxe reports them), and UD's
        // Q_Key.
        match qp_type {
            QpType::Rc => {
                out.timeout = a.timeout;
                out.retry_cnt = a.retry_cnt;
                out.rnr_retry = a.rnr_retry;
                out.max_rd_atomic = a.max_rd_atomic;
                out.max_dest_rd_atomic = a.max_dest_rd_atomic;
                out.min_rnr_timer = a.min_rnr_timer;
            }
            QpType::Ud => out.qkey = a.qkey.value(),
            QpType::Uc => {}
        }
        let init = sys::ibv_qp_init_attr {
            qp_context: obj.ibv.qp_context,
            send_cq: obj.ibv.send_cq,
            recv_cq: obj.ibv.recv_cq,
            srq: obj.ibv.srq,
            cap: obj.cap,
            qp_type: obj.ibv.qp_type,
            sq_sig_all: c_int::from(obj.sq_sig_all),
        };
        // SAFETY: both point at the caller's structs of these types.
        unsafe {
            attr.write(out);
            init_attr.write(init);
        }
        0
    }
);

/// The scatter/gather list of a work request.
///
/// # Safety
/// `sg` must point at `n` entries when `n > 0`.
pub(super) unsafe fn sges(sg: *const sys::ibv_sge, n: c_int) -> Result<Vec<Sge>, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `n` entries at `sg`.
    let list = unsafe { slice::from_raw_parts(sg, n) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: LKey::new(s.lkey),
        })
        .collect())
}

/// The bytes of an `IBV_SEND_INLINE` request, copied now from the buffers its SG list names
/// (their L_Keys are not looked at, as verbs specify: IBA 11.4.1.1; rxe `init_send_wqe`), so
/// the program may reuse them as soon as the post returns. EINVAL (rxe
/// `validate_send_wr`) when they add up to more than the QP's `max_inline_data`, before
/// anything is read.
///
/// # Safety
/// `sg` must point at `n` entries when `n > 0`, each naming `length` readable bytes at `addr`
/// (the verbs contract of an inline send).
unsafe fn inline_bytes(sg: *const sys::ibv_sge, n: c_int, max: u32) -> Result<Box<[u8]>, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(Box::default());
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `n` entries at `sg`.
    let list = unsafe { slice::from_raw_parts(sg, n) };
    let total = list
        .iter()
        .try_fold(0u32, |t, s| t.checked_add(s.length))
        .filter(|&t| t <= max)
        .ok_or(libc::EINVAL)?;
    let mut out = Vec::with_capacity(total as usize);
    for s in list.iter().filter(|s| s.length > 0) {
        if s.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's contract: `length` readable bytes at `addr`; `out` has room
        // for all of them (`total` reserved), and they are copied, not kept.
        out.extend_from_slice(unsafe {
            slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
        });
    }
    Ok(out.into_boxed_slice())
}

/// One `struct ibv_send_wr` as the API's work request; inline data (`IBV_SEND_INLINE`) is
/// copied here, at most `max_inline` bytes (the QP's `max_inline_data`).
///
/// # Safety
/// `wr` must be a valid work request of the caller's list.
unsafe fn send_wr(wr: &sys::ibv_send_wr, max_inline: u32) -> Result<SendWr<Path>, c_int> {
    // SAFETY: the union members are plain integers; the opcode says which one is meant.
    let (rdma, atomic, imm) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.__bindgen_anon_1.imm_data) };
    let op = match wr.opcode {
        sys::IBV_WR_SEND => SendOp::Send,
        sys::IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm {
            imm: u32::from_be(imm),
        },
        sys::IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
        },
        sys::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
            imm: u32::from_be(imm),
        },
        sys::IBV_WR_RDMA_READ => SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
        },
        sys::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: RKey::new(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        sys::IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: RKey::new(atomic.rkey),
            add: atomic.compare_add,
        },
        sys::IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            // SAFETY: as above; SEND_WITH_INV means the union holds the R_Key.
            invalidate_rkey: RKey::new(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        },
        sys::IBV_WR_LOCAL_INV => SendOp::LocalInv {
            // SAFETY: as above; LOCAL_INV means the union holds the key.
            invalidate_key: unsafe { wr.__bindgen_anon_1.invalidate_rkey },
        },
        // SAFETY: `wr` is the caller's valid request; BIND_MW means `bind_mw` is meant.
        sys::IBV_WR_BIND_MW => unsafe { super::mw::bind_op(wr) }?,
        _ => return Err(libc::EINVAL),
    };
    let mut flags = SendFlags::empty();
    if wr.send_flags & sys::IBV_SEND_SIGNALED != 0 {
        flags |= SendFlags::SIGNALED;
    }
    if wr.send_flags & sys::IBV_SEND_SOLICITED != 0 {
        flags |= SendFlags::SOLICITED;
    }
    let (sg_list, inline_data) = if op.is_local() {
        // Local operations (bind, local invalidate) have no SG list: rdma-core's providers
        // ignore `sg_list`/`num_sge` for them.
        (Vec::new(), None)
    } else if wr.send_flags & sys::IBV_SEND_INLINE != 0 {
        if !op.takes_inline() {
            // Inline READ or atomic: rxe's kernel refuses it (WR_INLINE_MASK).
            return Err(libc::EINVAL);
        }
        // SAFETY: the request's own list (the caller's contract).
        let data = unsafe { inline_bytes(wr.sg_list, wr.num_sge, max_inline) }?;
        (Vec::new(), Some(data))
    } else {
        // SAFETY: the request's own list (the caller's contract).
        (unsafe { sges(wr.sg_list, wr.num_sge) }?, None)
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        sg_list,
        flags,
        ud: None,
        inline_data,
    })
}

/// `ops.post_send`: posts the list in order; on the first refusal `*bad_wr` names it and its
/// errno is returned (ENOMEM for a full queue, EINVAL for a bad request), as in rdma-core.
unsafe extern "C" fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is a live QP of ours (the verbs contract).
    let (obj, dev) = match unsafe { qp_dev(qp) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    let ud = obj.ibv.qp_type == sys::IBV_QPT_UD;
    let qpn = Qpn::new(obj.ibv.qp_num);
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the caller's list.
        let w = unsafe { &*cur };
        // SAFETY: `w` is a valid work request; on a UD QP its `wr.ud.ah` is an AH of ours.
        let r = unsafe { send_wr(w, obj.cap.max_inline_data) }
            .and_then(|mut s| {
                if ud {
                    // SAFETY: as above.
                    s.ud = Some(unsafe { super::ah::ud_dest(w, qpn) }?);
                }
                Ok(s)
            })
            .and_then(|s| dev.post_send(qpn, s).map_err(|e| e.errno()));
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: `bad_wr` is the caller's out pointer.
                unsafe { bad_wr.write(cur) };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ops.post_recv`: as [`post_send`], for receive work requests.
unsafe extern "C" fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is a live QP of ours (the verbs contract).
    let (obj, dev) = match unsafe { qp_dev(qp) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    let qpn = Qpn::new(obj.ibv.qp_num);
    // SAFETY: `wr` and `bad_wr` are the caller's (the verbs contract).
    unsafe { post_recv_list(wr, bad_wr, |r| dev.post_recv(qpn, r).map_err(|e| e.errno())) }
}

/// Posts a list of receive work requests in order with `post` (a QP's receive queue or an
/// SRQ); on the first refusal `*bad_wr` names it and its errno is returned, as rdma-core's
/// providers do.
///
/// # Safety
/// `wr` is NULL or the head of a valid `ibv_recv_wr` list whose SG lists are valid; `bad_wr`
/// is NULL or writable.
pub(super) unsafe fn post_recv_list(
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
    post: impl Fn(RecvWr) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the caller's list.
        let w = unsafe { &*cur };
        // SAFETY: the request's own list.
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|sg_list| {
            post(RecvWr {
                wr_id: w.wr_id,
                sg_list,
            })
        });
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: `bad_wr` is the caller's out pointer.
                unsafe { bad_wr.write(cur) };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// A completion channel: the C struct (its `fd` is the channel's eventfd) and the channel.
#[repr(C)]
struct ChanObj {
    ibv: sys::ibv_comp_channel,
    state: Arc<Channel>,
}

export!(
    "IBVERBS_1.0",
    /// `ibv_create_comp_channel`: its `fd` can be waited on with poll/epoll; starts the engine.
    fn ibv_create_comp_channel(context: *mut sys::ibv_context) -> *mut sys::ibv_comp_channel {
        guard(ptr::null_mut(), || {
            // SAFETY: `context` is NULL or a live context of ours.
            let made = unsafe { device_of(context) }.and_then(|_| Channel::new());
            match made {
                Ok(state) => give(ChanObj {
                    ibv: sys::ibv_comp_channel {
                        context,
                        fd: state.fd(),
                        refcnt: 0,
                    },
                    state,
                })
                .cast(),
                Err(e) => {
                    set_errno(e);
                    ptr::null_mut()
                }
            }
        })
    }
);

export!(
    "IBVERBS_1.0",
    /// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
    fn ibv_destroy_comp_channel(channel: *mut sys::ibv_comp_channel) -> c_int {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `channel` is a live `ChanObj` of ours (the verbs contract).
        if unsafe { (*channel).refcnt } > 0 {
            return libc::EBUSY;
        }
        // SAFETY: made by `give`; C gives it up with this call.
        drop(unsafe { Box::from_raw(channel.cast::<ChanObj>()) });
        0
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_get_cq_event`: waits for the channel's next event (unless its fd was made
    /// non-blocking: then -1 with EAGAIN) and names its CQ and the CQ's context. Re-arm the
    /// CQ with `ibv_req_notify_cq` for the next one. A cancellation point, as rdma-core's
    /// (its `read(2)`): `pthread_cancel` of a thread waiting here ends that thread, as
    /// `rping` does to its CQ thread when a connection fails; an `extern "C"` wait aborted
    /// the whole program instead ("panic in a function that cannot unwind").
    cancellable fn ibv_get_cq_event(
        channel: *mut sys::ibv_comp_channel,
        cq: *mut *mut sys::ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int {
        if channel.is_null() || cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `channel` is a live `ChanObj` of ours, and stays so while a thread waits on
        // it (the verbs contract: a channel is destroyed after its waits). Borrowed, not
        // cloned: nothing of this frame needs dropping if a cancellation unwinds it.
        let state: &Channel = unsafe { &(*channel.cast::<ChanObj>()).state };
        match state.next() {
            Ok(handle) => {
                let c = handle as *mut sys::ibv_cq;
                // SAFETY: `handle` is the address of a live CQ routed to this channel (a CQ
                // stops being routed before it is freed); the out pointers are the caller's.
                unsafe {
                    cq.write(c);
                    cq_context.write((*c).cq_context);
                }
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_ack_cq_events`: acknowledges events; nothing here waits on the count (rdma-core's
    /// `ibv_destroy_cq` does; ours stops the CQ's events when it unroutes it).
    fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, nevents: u32) -> () {
        let _ = (cq, nevents);
    }
);
