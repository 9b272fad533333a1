//! Devices and contexts: the device list, open and close, and the queries of the device, the
//! port, its GIDs and P_Key.
//!
//! An `ibv_device` is the first field of a [`Dev`] that lives as long as the process (rdma-core
//! keeps its devices alive across list frees too), and an `ibv_context` is the last field of
//! the `verbs_context` that starts a [`Ctx`], so a context pointer leads back to its `Ctx`
//! (rdma-core's own `verbs_get_ctx` layout, the "extended" ABI with `abi_compat` and `sz`).

use core::{
    ffi::{CStr, c_char, c_int, c_uint, c_void},
    mem::{offset_of, size_of},
    ptr,
};
use std::sync::{Mutex, PoisonError};

use roce::{netinfo::IfInfo, transport::DeviceConfig};

use super::{guard, objects, set_errno};
use crate::{
    device::{self, Port},
    sys,
    verbs::Verbs,
};

/// A device: the `ibv_device` C sees, and the interface behind it.
#[repr(C)]
struct Dev {
    /// First, so a `*mut ibv_device` is a `*mut Dev`.
    ibv: sys::ibv_device,
    ifname: String,
}

/// Every device made in this process, by interface; never freed (C keeps the pointers).
static DEVICES: Mutex<Vec<&'static mut Dev>> = Mutex::new(Vec::new());

/// Copies `s` into the C string field `dst`, truncated to fit with its NUL.
fn set_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n..].fill(0);
}

/// The device of interface `ifname`, made on first use.
fn device_of(ifname: &str) -> *mut sys::ibv_device {
    let mut all = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(d) = all.iter_mut().find(|d| d.ifname == ifname) {
        return &raw mut d.ibv;
    }
    let mut ibv = sys::ibv_device {
        node_type: sys::IBV_NODE_CA,
        transport_type: sys::IBV_TRANSPORT_IB,
        ..Default::default()
    };
    let name = device::device_name(ifname);
    set_cstr(&mut ibv.name, &name);
    set_cstr(&mut ibv.dev_name, &name);
    let dev: &'static mut Dev = Box::leak(Box::new(Dev {
        ibv,
        ifname: ifname.to_owned(),
    }));
    let p = &raw mut dev.ibv;
    all.push(dev);
    p
}

/// The interface of a device pointer C gave back, if it is one of ours.
fn ifname_of(dev: *const sys::ibv_device) -> Option<String> {
    let all = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    all.iter()
        .find(|d| ptr::eq(&raw const d.ibv, dev))
        .map(|d| d.ifname.clone())
}

/// An open device context.
#[repr(C)]
pub(super) struct Ctx {
    /// First, with `ibv_context` as its last field: what C holds.
    vctx: sys::verbs_context,
    /// The engine and the interface.
    pub(super) verbs: Verbs,
    /// The limits the engine enforces (what `ibv_query_device` reports).
    pub(super) config: DeviceConfig,
}

/// The `Ctx` of a context pointer C gave back.
///
/// # Safety
/// `ctx` must be NULL or a pointer returned by [`ibv_open_device`] and not yet closed.
pub(super) unsafe fn ctx_of<'a>(ctx: *mut sys::ibv_context) -> Option<&'a Ctx> {
    if ctx.is_null() {
        return None;
    }
    let off = offset_of!(Ctx, vctx) + offset_of!(sys::verbs_context, context);
    // SAFETY: by the caller's contract `ctx` points at `vctx.context` of a live `Ctx`, `off`
    // bytes after its start (a `#[repr(C)]` layout), so stepping back stays in that object.
    Some(unsafe { &*ctx.cast::<u8>().sub(off).cast::<Ctx>() })
}

export!(
    "IBVERBS_1.1",
    /// `ibv_get_device_list`: a NULL-terminated array of the devices ([`device::interfaces`]),
    /// freed with [`ibv_free_device_list`]; `*num_devices` gets their count when non-NULL.
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut sys::ibv_device {
        guard(ptr::null_mut(), || {
            let devs: Vec<*mut sys::ibv_device> =
                device::interfaces().iter().map(|i| device_of(i)).collect();
            // SAFETY: calloc of n+1 pointers; a NULL result is handled below.
            let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut sys::ibv_device>()) }
                .cast::<*mut sys::ibv_device>();
            if list.is_null() {
                set_errno(libc::ENOMEM);
                return ptr::null_mut();
            }
            for (i, d) in devs.iter().enumerate() {
                // SAFETY: `list` holds `devs.len() + 1` pointers, zeroed (the last stays NULL).
                unsafe { list.add(i).write(*d) };
            }
            if !num_devices.is_null() {
                // SAFETY: the caller passes NULL or a pointer to an int it owns.
                unsafe { num_devices.write(c_int::try_from(devs.len()).unwrap_or(c_int::MAX)) };
            }
            list
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_free_device_list`: frees the array (the devices stay valid, as in rdma-core).
    fn ibv_free_device_list(list: *mut *mut sys::ibv_device) -> () {
        // SAFETY: `list` came from `ibv_get_device_list`'s calloc (or is NULL).
        unsafe { libc::free(list.cast()) }
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_get_device_name`: the device's name (`roce_<ifname>`).
    fn ibv_get_device_name(dev: *mut sys::ibv_device) -> *const c_char {
        if dev.is_null() {
            set_errno(libc::EINVAL);
            return ptr::null();
        }
        // SAFETY: `dev` is a device pointer C got from us; its name is NUL-terminated.
        unsafe { (*dev).name.as_ptr() }
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_get_device_guid`: the node GUID in network order ([`device::node_guid`]).
    fn ibv_get_device_guid(dev: *mut sys::ibv_device) -> u64 {
        guard(0, || {
            ifname_of(dev)
                .and_then(|i| IfInfo::query(&i).ok())
                .map_or(0, |info| u64::from_ne_bytes(device::node_guid(info.mac)))
        })
    }
);

export!(
    "IBVERBS_1.9",
    /// `ibv_get_device_index`: the interface index stands for the device index (rxe's is the
    /// ib_device's; ours has none), or -1.
    fn ibv_get_device_index(dev: *mut sys::ibv_device) -> c_int {
        guard(-1, || {
            ifname_of(dev)
                .and_then(|i| IfInfo::query(&i).ok())
                .map_or(-1, |info| c_int::try_from(info.ifindex).unwrap_or(-1))
        })
    }
);

/// Registers, once, the exit handler that releases what the process's open devices set up
/// in the kernel (pins, QPN claims, XSK map entries) when a program exits without closing
/// its contexts, as programs do on their error paths. The XDP program itself goes with the
/// process in any case (its link is held, not pinned); see `roce::api::release_all_for_exit`.
fn release_at_exit() {
    extern "C" fn on_exit() {
        roce::api::release_all_for_exit();
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `on_exit` is a plain function of this library that takes no arguments and
        // does not unwind (release_all_for_exit ignores every error).
        unsafe { libc::atexit(on_exit) };
    });
}

export!(
    "IBVERBS_1.1",
    /// `ibv_open_device`: a context for the device. It reads the interface; nothing is
    /// attached yet (see the crate doc). NULL with errno ENODEV if the interface is gone.
    fn ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
        guard(ptr::null_mut(), || {
            release_at_exit();
            let Some(ifname) = ifname_of(dev) else {
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            };
            let info = match IfInfo::query(&ifname) {
                Ok(i) => i,
                Err(e) => {
                    eprintln!("libibverbs (roce-xdp): {ifname}: {e}");
                    set_errno(libc::ENODEV);
                    return ptr::null_mut();
                }
            };
            let mut vctx = sys::verbs_context {
                sz: size_of::<sys::verbs_context>(),
                query_port: Some(query_port_ex),
                create_qp_ex: Some(super::qp_ex::create_qp_ex),
                create_cq_ex: Some(super::cq_ex::create_cq_ex),
                ..Default::default()
            };
            objects::fill_ops(&mut vctx.context.ops);
            super::srq::fill_ops(&mut vctx.context.ops);
            let verbs = match Verbs::new(Port { info }) {
                Ok(v) => v,
                Err(e) => {
                    set_errno(e);
                    return ptr::null_mut();
                }
            };
            vctx.context.device = dev;
            vctx.context.cmd_fd = -1;
            // Readable while an asynchronous event waits (crate::events).
            vctx.context.async_fd = verbs.events.fd();
            vctx.context.num_comp_vectors = 1;
            // `__VERBS_ABI_IS_EXTENDED`: the verbs_context ops before `context` are valid.
            vctx.context.abi_compat = usize::MAX as *mut c_void;
            let ctx = Box::new(Ctx {
                vctx,
                verbs,
                config: DeviceConfig::default(),
            });
            let ctx = Box::leak(ctx);
            super::compat::release_at_exit_once();
            &raw mut ctx.vctx.context
        })
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_close_device`: frees the context.
    fn ibv_close_device(context: *mut sys::ibv_context) -> c_int {
        // SAFETY: `context` came from `ibv_open_device` and is closed once (the verbs rule).
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        let p = ptr::from_ref(ctx).cast_mut();
        // SAFETY: `p` is the `Box::leak`ed `Ctx` of `ibv_open_device`; C no longer uses it.
        drop(unsafe { Box::from_raw(p) });
        0
    }
);

/// The device attributes: what the engine enforces ([`DeviceConfig`]), rxe's values where
/// roce-xdp has no limit of its own (rxe_param.h).
fn device_attr(ctx: &Ctx) -> sys::ibv_device_attr {
    let c = &ctx.config;
    let guid = u64::from_ne_bytes(device::node_guid(ctx.verbs.port.info.mac));
    let clamp = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
    let mut a = sys::ibv_device_attr {
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: device::VENDOR_ID,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: clamp(c.max_qp),
        max_qp_wr: c_int::try_from(c.max_qp_wr).unwrap_or(c_int::MAX),
        max_sge: c_int::try_from(c.max_sge).unwrap_or(c_int::MAX),
        max_sge_rd: c_int::try_from(c.max_sge).unwrap_or(c_int::MAX),
        max_cq: clamp(c.max_cq),
        max_cqe: clamp(c.max_cqe),
        max_mr: clamp(c.max_mr),
        max_pd: clamp(c.max_pd),
        max_qp_rd_atom: c_int::from(c.max_qp_rd_atom),
        max_qp_init_rd_atom: c_int::from(c.max_qp_rd_atom),
        max_res_rd_atom: clamp(c.max_qp.saturating_mul(usize::from(c.max_qp_rd_atom))),
        atomic_cap: sys::IBV_ATOMIC_HCA,
        // What the engine does of rxe's list: RNR NAKs for SENDs without a receive, one
        // system image GUID (the node GUID), and memory windows of type 1 and 2B.
        device_cap_flags: sys::IBV_DEVICE_RC_RNR_NAK_GEN
            | sys::IBV_DEVICE_SYS_IMAGE_GUID
            | sys::IBV_DEVICE_MEM_WINDOW
            | sys::IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        // The window table is as large as the region table (MrTable).
        max_mw: clamp(c.max_mr),
        max_srq: clamp(c.max_srq),
        max_srq_wr: c_int::try_from(c.max_srq_wr).unwrap_or(c_int::MAX),
        max_srq_sge: c_int::try_from(c.max_srq_sge).unwrap_or(c_int::MAX),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        ..Default::default()
    };
    set_cstr(
        &mut a.fw_ver,
        concat!("roce-xdp ", env!("CARGO_PKG_VERSION")),
    );
    a
}

export!(
    "IBVERBS_1.1",
    /// `ibv_query_device`.
    fn ibv_query_device(context: *mut sys::ibv_context, attr: *mut sys::ibv_device_attr) -> c_int {
        // SAFETY: `context` is a live context of ours (the verbs contract).
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `attr` points at a `struct ibv_device_attr` the caller owns.
        unsafe { attr.write(device_attr(ctx)) };
        0
    }
);

/// The attributes of port 1: RoCE (link layer Ethernet), active while the interface is up, with
/// a connection manager (`IBV_PORT_CM_SUP`, as rxe sets it): the same library is the drop-in
/// librdmacm, which runs the device's CM on QP 1 (`rdmacm.rs`).
fn port_attr(ctx: &Ctx) -> sys::ibv_port_attr {
    let up = ctx.verbs.port.is_up();
    let mtu = ctx.verbs.port.active_mtu_code();
    sys::ibv_port_attr {
        state: if up {
            sys::IBV_PORT_ACTIVE
        } else {
            sys::IBV_PORT_DOWN
        },
        max_mtu: mtu,
        active_mtu: mtu,
        gid_tbl_len: c_int::try_from(ctx.verbs.port.gids().len().max(1)).unwrap_or(c_int::MAX),
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1,
        active_speed: 1,
        phys_state: if up { 5 } else { 3 },
        link_layer: sys::IBV_LINK_LAYER_ETHERNET as u8,
        port_cap_flags: sys::IBV_PORT_CM_SUP,
        ..Default::default()
    }
}

/// Copies the first `size` bytes of `attr` (at most its size) to `out`.
///
/// # Safety
/// `out` must be valid for `size` bytes of writes.
unsafe fn write_port_attr(out: *mut u8, size: usize, attr: &sys::ibv_port_attr) {
    let n = size.min(size_of::<sys::ibv_port_attr>());
    // SAFETY: `attr` is `n` readable bytes; `out` is valid for `size >= n` bytes (caller).
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(attr).cast::<u8>(), out, n) };
}

/// `verbs_context.query_port`, what the inline `ibv_query_port` of verbs.h calls.
unsafe extern "C" fn query_port_ex(
    context: *mut sys::ibv_context,
    port_num: u8,
    attr: *mut sys::ibv_port_attr,
    size: usize,
) -> c_int {
    // SAFETY: `context` is a live context of ours (the verbs contract).
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        return libc::EINVAL;
    };
    if port_num != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the header's inline passes `sizeof(*port_attr)` of the caller's struct.
    unsafe { write_port_attr(attr.cast(), size, &port_attr(ctx)) };
    0
}

export!(
    "IBVERBS_1.1",
    /// `ibv_query_port`, the exported form (old binaries, and the inline's fallback): the
    /// compat struct is the prefix of `ibv_port_attr`.
    fn ibv_query_port(
        context: *mut sys::ibv_context,
        port_num: u8,
        attr: *mut sys::_compat_ibv_port_attr,
    ) -> c_int {
        // SAFETY: `attr` is a caller-owned `_compat_ibv_port_attr`; passing its size keeps
        // the write inside it.
        unsafe {
            query_port_ex(
                context,
                port_num,
                attr.cast(),
                size_of::<sys::_compat_ibv_port_attr>(),
            )
        }
    }
);

/// The GID at `index` of port 1: `Ok(None)` for an empty entry inside the table.
fn gid_at(ctx: &Ctx, port_num: u32, index: u32) -> Result<Option<[u8; 16]>, c_int> {
    let gids = ctx.verbs.port.gids();
    if port_num != 1 || index as usize >= gids.len().max(1) {
        return Err(libc::EINVAL);
    }
    Ok(gids.get(index as usize).copied())
}

export!(
    "IBVERBS_1.1",
    /// `ibv_query_gid`: an empty entry inside the table reads as zeros, as in rdma-core.
    fn ibv_query_gid(
        context: *mut sys::ibv_context,
        port_num: u8,
        index: c_int,
        gid: *mut sys::ibv_gid,
    ) -> c_int {
        // SAFETY: `context` is a live context of ours (the verbs contract).
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return -1;
        };
        let Ok(index) = u32::try_from(index) else {
            return -1;
        };
        match (gid_at(ctx, u32::from(port_num), index), gid.is_null()) {
            (Ok(g), false) => {
                // SAFETY: `gid` points at a caller-owned 16-byte `union ibv_gid`.
                unsafe { (*gid).raw = g.unwrap_or([0; 16]) };
                0
            }
            _ => -1,
        }
    }
);

/// `enum ibv_gid_type_sysfs` of rdma-core's driver.h (private ABI): RoCE v2.
const GID_TYPE_SYSFS_ROCE_V2: c_uint = 1;

export!(
    "IBVERBS_PRIVATE_34",
    /// `ibv_query_gid_type` (private node, used by ibv_devinfo): every GID is RoCE v2.
    fn ibv_query_gid_type(
        context: *mut sys::ibv_context,
        port_num: u8,
        index: c_uint,
        kind: *mut c_uint,
    ) -> c_int {
        // SAFETY: `context` is a live context of ours (the verbs contract).
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return -1;
        };
        match gid_at(ctx, u32::from(port_num), index) {
            Ok(_) if !kind.is_null() => {
                // SAFETY: `kind` points at the caller's enum (an unsigned int).
                unsafe { kind.write(GID_TYPE_SYSFS_ROCE_V2) };
                0
            }
            _ => -1,
        }
    }
);

export!(
    "IBVERBS_1.11",
    /// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): ENODATA for an empty entry.
    fn _ibv_query_gid_ex(
        context: *mut sys::ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut sys::ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int {
        // SAFETY: `context` is a live context of ours (the verbs contract).
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry.is_null() || entry_size < size_of::<sys::ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match gid_at(ctx, port_num, gid_index) {
            Err(e) => e,
            Ok(None) => libc::ENODATA,
            Ok(Some(raw)) => {
                let mut e = sys::ibv_gid_entry {
                    gid_index,
                    port_num,
                    gid_type: sys::IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: ctx.verbs.port.info.ifindex,
                    ..Default::default()
                };
                e.gid.raw = raw;
                // SAFETY: `entry` is a caller-owned entry of at least our size (checked).
                unsafe { entry.write(e) };
                0
            }
        }
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_query_pkey`: one entry, the default P_Key 0xffff (in network order).
    fn ibv_query_pkey(
        context: *mut sys::ibv_context,
        port_num: u8,
        index: c_int,
        pkey: *mut u16,
    ) -> c_int {
        // SAFETY: `context` is a live context of ours (the verbs contract).
        if unsafe { ctx_of(context) }.is_none() || port_num != 1 || index != 0 || pkey.is_null() {
            return -1;
        }
        // SAFETY: `pkey` points at the caller's `__be16`.
        unsafe { pkey.write(0xffff_u16.to_be()) };
        0
    }
);

export!(
    "IBVERBS_1.0",
    /// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated, a trailing newline
    /// dropped) and returns its length, or -1; what rdma-core does.
    fn ibv_read_sysfs_file(
        dir: *const c_char,
        file: *const c_char,
        buf: *mut c_char,
        size: usize,
    ) -> c_int {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return -1;
        }
        // SAFETY: the caller passes NUL-terminated strings.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", dir.to_string_lossy(), file.to_string_lossy());
        let Ok(mut text) = std::fs::read(path) else {
            return -1;
        };
        text.truncate(size - 1);
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        // SAFETY: `buf` holds `size` bytes (caller); we write `text.len() + 1 <= size`.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            buf.add(text.len()).write(0);
        }
        c_int::try_from(text.len()).unwrap_or(-1)
    }
);

/// Exports a `*_str` function of verbs.h that names a code with rdma-core's strings.
macro_rules! export_str {
    ($name:ident, $t:ty, [$($code:literal => $s:literal),* $(,)?], $unknown:literal) => {
        export!("IBVERBS_1.1",
            /// The name rdma-core gives the code (verbs.h `*_str`).
            fn $name(code: $t) -> *const c_char {
                match code {
                    $($code => $s.as_ptr(),)*
                    _ => $unknown.as_ptr(),
                }
            }
        );
    };
}

export_str!(ibv_node_type_str, c_int, [
    1 => c"InfiniBand channel adapter", 2 => c"InfiniBand switch", 3 => c"InfiniBand router",
    4 => c"iWARP NIC", 5 => c"usNIC", 6 => c"usNIC UDP", 7 => c"unspecified",
], c"unknown");

export_str!(ibv_port_state_str, c_uint, [
    0 => c"no state change (NOP)", 1 => c"down", 2 => c"init", 3 => c"armed",
    4 => c"active", 5 => c"active defer",
], c"unknown");

export_str!(ibv_wc_status_str, c_uint, [
    0 => c"success", 1 => c"local length error", 2 => c"local QP operation error",
    3 => c"local EE context operation error", 4 => c"local protection error",
    5 => c"Work Request Flushed Error", 6 => c"memory management operation error",
    7 => c"bad response error", 8 => c"local access error", 9 => c"remote invalid request error",
    10 => c"remote access error", 11 => c"remote operation error",
    12 => c"transport retry counter exceeded", 13 => c"RNR retry counter exceeded",
    14 => c"local RDD violation error", 15 => c"remote invalid RD request",
    16 => c"aborted error", 17 => c"invalid EE context number",
    18 => c"invalid EE context state", 19 => c"fatal error", 20 => c"response timeout error",
    21 => c"general error", 22 => c"TM error", 23 => c"TM software rendezvous",
], c"unknown");
