//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`, `ibv_init_ah_from_wc`,
//! `ibv_create_ah_from_wc`) and the destination of a UD send (`wr.ud`).
//!
//! An AH is an `AhObj` whose first field is the `struct ibv_ah` C holds; it keeps the path
//! resolved once at creation (next hop's MAC, IPs, traffic class), as rxe resolves the MAC
//! when the AH is made (core/verbs.c `ib_resolve_eth_dmac`).

use core::{ffi::c_int, ptr};

use roce::{
    api::{Path, QKey, Qpn, UdDest},
    wire::frame::udp_src_port,
};

use super::{device::ctx_of, guard, objects::device_of, set_errno};
use crate::{
    ah::{apply_traffic_class, is_multicast, route_from_grh},
    sys,
};

/// An address handle.
#[repr(C)]
struct AhObj {
    ibv: sys::ibv_ah,
    path: Path,
}

/// `ibv_create_ah`'s work, errors as rxe's: EINVAL for a NULL argument, an AV without a GRH
/// (RoCE addresses by GID: core/verbs.c `rdma_check_ah_attr`), a port other than 1 or a bad
/// source GID index; EOPNOTSUPP for a multicast GID (roce-xdp has no multicast groups);
/// ENETUNREACH with no route to the GID and ETIMEDOUT when its next hop does not answer ARP or
/// ND, as the kernel's address resolution returns them.
///
/// # Safety
/// `pd` must be NULL or a live PD of ours, `attr` NULL or the caller's `struct ibv_ah_attr`.
unsafe fn create_ah(pd: *mut sys::ibv_pd, attr: *const sys::ibv_ah_attr) -> Result<AhObj, c_int> {
    if pd.is_null() || attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract; C keeps `ibv_pd` (our `PdObj`'s first field) unchanged.
    let (a, context) = unsafe { (&*attr, (*pd).context) };
    if a.is_global == 0 || a.port_num != 1 {
        return Err(libc::EINVAL);
    }
    // SAFETY: `ibv_gid` is a union of plain bytes; `raw` is always valid.
    let dgid = unsafe { a.grh.dgid.raw };
    if is_multicast(&dgid) {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: a live PD's context is live.
    let dev = unsafe { device_of(context) }?;
    let mut path = dev
        .path_to(
            usize::from(a.grh.sgid_index),
            &dgid,
            Qpn::new(0),
            Qpn::new(0),
        )
        .map_err(|e| {
            eprintln!("libibverbs (roce-xdp): ibv_create_ah: no path to the GID: {e:#}");
            e.errno()
        })?;
    apply_traffic_class(&mut path, a.grh.traffic_class);
    Ok(AhObj {
        ibv: sys::ibv_ah {
            context,
            pd,
            handle: 0,
        },
        path,
    })
}

export!(
    "IBVERBS_1.1",
    /// `ibv_create_ah`: resolves the destination GID to a path once (see `create_ah` for the
    /// errors); UD sends then name it in `wr.ud.ah`.
    fn ibv_create_ah(pd: *mut sys::ibv_pd, attr: *mut sys::ibv_ah_attr) -> *mut sys::ibv_ah {
        guard(ptr::null_mut(), || {
            // SAFETY: `pd` and `attr` are the caller's (the verbs contract).
            match unsafe { create_ah(pd, attr) } {
                Ok(ah) => Box::into_raw(Box::new(ah)).cast(),
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
    /// `ibv_destroy_ah`. Sends already posted with it keep their copy of the path.
    fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: made by `ibv_create_ah` (an `AhObj`); C gives it up with this call.
        drop(unsafe { Box::from_raw(ah.cast::<AhObj>()) });
        0
    }
);

/// The destination of UD send `wr` posted on QP `local`: its AH's path (with the UDP source
/// port of the QP pair), the remote QPN and Q_Key (a Q_Key with the high bit set means the
/// QP's own, which the transport applies, IBA 10.2.5).
///
/// # Errors
/// EINVAL for a NULL AH.
///
/// # Safety
/// `wr.wr.ud.ah` must be NULL or a live AH of ours.
pub(super) unsafe fn ud_dest(wr: &sys::ibv_send_wr, local: Qpn) -> Result<UdDest<Path>, c_int> {
    // SAFETY: for a UD QP the union holds `ud` (the verbs contract of ibv_post_send).
    let ud = unsafe { wr.wr.ud };
    // SAFETY: the caller's contract.
    unsafe { ud_dest_of(ud.ah, ud.remote_qpn, ud.remote_qkey, local) }
}

/// [`ud_dest`] from its parts (`ibv_wr_set_ud_addr`'s arguments).
///
/// # Safety
/// `ah` must be NULL or a live AH of ours.
pub(super) unsafe fn ud_dest_of(
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    local: Qpn,
) -> Result<UdDest<Path>, c_int> {
    if ah.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live `AhObj` (the caller's contract); only read.
    let mut path = unsafe { (*ah.cast::<AhObj>()).path };
    let remote_qpn = Qpn::new(remote_qpn & 0xff_ffff);
    path.udp_src_port = udp_src_port(local, remote_qpn);
    Ok(UdDest {
        path,
        remote_qpn,
        remote_qkey: QKey::new(remote_qkey),
    })
}

/// `ibv_init_ah_from_wc`'s work; the errno on failure.
///
/// # Safety
/// The pointers are NULL or the caller's live objects of these types; `grh` points at 40
/// readable bytes when the completion has `IBV_WC_GRH`.
unsafe fn init_ah_from_wc(
    context: *mut sys::ibv_context,
    port_num: u8,
    wc: *const sys::ibv_wc,
    grh: *const sys::ibv_grh,
    ah_attr: *mut sys::ibv_ah_attr,
) -> Result<(), c_int> {
    if wc.is_null() || ah_attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let (wc, out) = unsafe { (&*wc, &mut *ah_attr) };
    *out = sys::ibv_ah_attr {
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        port_num,
        ..Default::default()
    };
    if wc.wc_flags & sys::IBV_WC_GRH == 0 {
        return Ok(());
    }
    if grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `struct ibv_grh` is 40 bytes of plain data (bindgen's layout test), readable
    // by the caller's contract.
    let bytes = unsafe { &*grh.cast::<[u8; 40]>() };
    // SAFETY: `context` is NULL or a live context of ours.
    let ctx = unsafe { ctx_of(context) }.ok_or(libc::EINVAL)?;
    out.is_global = 1;
    // rdma-core sets the flow label before it knows the header's version.
    out.grh.flow_label = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & 0xf_ffff;
    let r = route_from_grh(bytes, &ctx.verbs.port.gids())?;
    out.grh.dgid = sys::ibv_gid { raw: r.dgid };
    out.grh.sgid_index = r.sgid_index;
    out.grh.hop_limit = r.hop_limit;
    out.grh.traffic_class = r.traffic_class;
    Ok(())
}

const _: () = assert!(size_of::<sys::ibv_grh>() == 40);

export!(
    "IBVERBS_1.1",
    /// `ibv_init_ah_from_wc`: the address vector back to the sender of a UD receive, from the
    /// GRH area at the start of its buffer (`grh`). 0, or -1 with errno (EPROTONOSUPPORT:
    /// not a RoCE v2 header; EINVAL: multicast destination; ENOENT: sent to an address that
    /// is not in our GID table).
    fn ibv_init_ah_from_wc(
        context: *mut sys::ibv_context,
        port_num: u8,
        wc: *mut sys::ibv_wc,
        grh: *mut sys::ibv_grh,
        ah_attr: *mut sys::ibv_ah_attr,
    ) -> c_int {
        guard(-1, || {
            // SAFETY: the verbs contract of ibv_init_ah_from_wc is `init_ah_from_wc`'s.
            match unsafe { init_ah_from_wc(context, port_num, wc, grh, ah_attr) } {
                Ok(()) => 0,
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
    /// `ibv_create_ah_from_wc`: `ibv_init_ah_from_wc`, then `ibv_create_ah`.
    fn ibv_create_ah_from_wc(
        pd: *mut sys::ibv_pd,
        wc: *mut sys::ibv_wc,
        grh: *mut sys::ibv_grh,
        port_num: u8,
    ) -> *mut sys::ibv_ah {
        guard(ptr::null_mut(), || {
            if pd.is_null() {
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
            let mut attr = sys::ibv_ah_attr::default();
            // SAFETY: `pd` is a live PD of ours; the rest are the caller's.
            let made = unsafe { init_ah_from_wc((*pd).context, port_num, wc, grh, &raw mut attr) }
                // SAFETY: `attr` was just filled.
                .and_then(|()| unsafe { create_ah(pd, &raw const attr) });
            super::or_null(made.map(|ah| Box::into_raw(Box::new(ah))))
        })
    }
);
