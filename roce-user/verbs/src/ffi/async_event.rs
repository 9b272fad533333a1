//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event` and
//! `ibv_event_type_str`. The queue and its fd (`ibv_context.async_fd`, pollable) are
//! [`crate::events`]; the engine's events reach it through the context's event thread
//! (`Verbs`), which names each event's QP, CQ or SRQ by the C struct the program holds.

use core::ffi::{c_char, c_int};

use super::{device::ctx_of, guard, set_errno};
use crate::{events::Element, sys};

export!(
    "IBVERBS_1.1",
    /// `ibv_get_async_event`: the context's next event, waiting for one unless the program
    /// made `async_fd` non-blocking (then -1 with EAGAIN). Events: QP fatal (the transport
    /// moved the QP to ERR, as on retry exceeded), communication established, SQ drained,
    /// last WQE reached, CQ error (overflow), SRQ limit reached, port active and port error.
    fn ibv_get_async_event(
        context: *mut sys::ibv_context,
        event: *mut sys::ibv_async_event,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: `context` is NULL or a live context of ours (the verbs contract).
            let Some(ctx) = (unsafe { ctx_of(context) }) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            if event.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            match ctx.verbs.events.next() {
                Ok(e) => {
                    let element = match e.element {
                        Element::Qp(p) => sys::ibv_async_event__bindgen_ty_1 {
                            qp: p as *mut sys::ibv_qp,
                        },
                        Element::Cq(p) => sys::ibv_async_event__bindgen_ty_1 {
                            cq: p as *mut sys::ibv_cq,
                        },
                        Element::Srq(p) => sys::ibv_async_event__bindgen_ty_1 {
                            srq: p as *mut sys::ibv_srq,
                        },
                        Element::Port(n) => sys::ibv_async_event__bindgen_ty_1 { port_num: n },
                    };
                    // SAFETY: `event` points at the caller's `struct ibv_async_event`; the
                    // element is the address of a live object (destroying one withdraws its
                    // events first).
                    unsafe {
                        event.write(sys::ibv_async_event {
                            element,
                            event_type: e.kind,
                        });
                    }
                    0
                }
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_ack_async_event`: nothing to release. rdma-core counts acknowledgements so that
    /// destroying a QP, CQ or SRQ waits for those of its events; here destroying an object
    /// withdraws its events not yet taken instead, and never waits.
    fn ibv_ack_async_event(event: *mut sys::ibv_async_event) -> () {
        let _ = event;
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_event_type_str`: rdma-core's name of the event type.
    fn ibv_event_type_str(event: sys::ibv_event_type) -> *const c_char {
        let s: &'static core::ffi::CStr = match event {
            sys::IBV_EVENT_CQ_ERR => c"CQ error",
            sys::IBV_EVENT_QP_FATAL => c"local work queue catastrophic error",
            sys::IBV_EVENT_QP_REQ_ERR => c"invalid request local work queue error",
            sys::IBV_EVENT_QP_ACCESS_ERR => c"local access violation work queue error",
            sys::IBV_EVENT_COMM_EST => c"communication established",
            sys::IBV_EVENT_SQ_DRAINED => c"send queue drained",
            sys::IBV_EVENT_PATH_MIG => c"path migrated",
            sys::IBV_EVENT_PATH_MIG_ERR => c"path migration request error",
            sys::IBV_EVENT_DEVICE_FATAL => c"local catastrophic error",
            sys::IBV_EVENT_PORT_ACTIVE => c"port active",
            sys::IBV_EVENT_PORT_ERR => c"port error",
            sys::IBV_EVENT_LID_CHANGE => c"LID change",
            sys::IBV_EVENT_PKEY_CHANGE => c"P_Key change",
            sys::IBV_EVENT_SM_CHANGE => c"SM change",
            sys::IBV_EVENT_SRQ_ERR => c"SRQ catastrophic error",
            sys::IBV_EVENT_SRQ_LIMIT_REACHED => c"SRQ limit reached",
            sys::IBV_EVENT_QP_LAST_WQE_REACHED => c"last WQE reached",
            sys::IBV_EVENT_CLIENT_REREGISTER => c"client reregistration",
            sys::IBV_EVENT_GID_CHANGE => c"GID table change",
            sys::IBV_EVENT_WQ_FATAL => c"WQ fatal",
            _ => c"unknown",
        };
        s.as_ptr()
    }
);
