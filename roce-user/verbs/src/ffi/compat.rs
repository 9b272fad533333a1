//! The rest of what Debian's perftest binaries and librdmacm (which they link) import, so
//! that they load (everything there is linked with BIND_NOW: one missing symbol and the
//! program does not start): sysfs and kernel-ABI helpers, the P_Key lookup, ECE and multicast.
//! Each does what rdma-core 44 does for a device with roce-xdp's abilities: the helpers are
//! rdma-core's pure functions; ECE and multicast, which roce-xdp does not offer, answer
//! EOPNOTSUPP as rdma-core's `dummy_ops` do for a provider without them.

use core::ffi::{c_char, c_int};
use std::{ffi::CString, sync::OnceLock};

use super::device::ibv_query_pkey;
use crate::sys;

/// What [`ibv_get_sysfs_path`] returns: `SYSFS_PATH` from the environment (unless the program
/// runs set-user-ID), trailing slashes dropped, else `/sys` (rdma-core sysfs.c).
fn sysfs_path() -> &'static CString {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        let from_env = (nix::unistd::getuid() == nix::unistd::geteuid())
            .then(|| std::env::var_os("SYSFS_PATH"))
            .flatten()
            .and_then(|p| {
                let s = p.into_encoded_bytes();
                let end = s.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
                CString::new(&s[..end]).ok()
            });
        from_env.unwrap_or_else(|| c"/sys".to_owned())
    })
}

export!(
    "IBVERBS_1.0",
    /// `ibv_get_sysfs_path`: where sysfs is mounted, for `ibv_read_sysfs_file` users.
    fn ibv_get_sysfs_path() -> *const c_char {
        sysfs_path().as_ptr()
    }
);

/// `ibv_copy_ah_attr_from_kern`'s work (marshall.c).
fn ah_attr_from_kern(dst: &mut sys::ibv_ah_attr, src: &sys::ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

export!(
    "IBVERBS_1.1",
    /// `ibv_copy_ah_attr_from_kern`: an address vector as the kernel's uverbs ABI gives it
    /// (librdmacm's route answers) into `struct ibv_ah_attr`. NULL pointers are ignored.
    fn ibv_copy_ah_attr_from_kern(
        dst: *mut sys::ibv_ah_attr,
        src: *mut sys::ib_uverbs_ah_attr,
    ) -> () {
        // SAFETY: the caller passes its own structs of these types (or NULL, refused).
        if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
            ah_attr_from_kern(d, s);
        }
    }
);

export!(
    "IBVERBS_1.0",
    /// `ibv_copy_qp_attr_from_kern`: QP attributes from the kernel's uverbs ABI (librdmacm's
    /// `rdma_init_qp_attr`) into `struct ibv_qp_attr`, field by field as rdma-core does.
    fn ibv_copy_qp_attr_from_kern(
        dst: *mut sys::ibv_qp_attr,
        src: *mut sys::ib_uverbs_qp_attr,
    ) -> () {
        // SAFETY: the caller passes its own structs of these types (or NULL, refused).
        let Some((d, s)) = (unsafe { dst.as_mut().zip(src.as_ref()) }) else {
            return;
        };
        d.cur_qp_state = s.cur_qp_state;
        d.path_mtu = s.path_mtu;
        d.path_mig_state = s.path_mig_state;
        d.qkey = s.qkey;
        d.rq_psn = s.rq_psn;
        d.sq_psn = s.sq_psn;
        d.dest_qp_num = s.dest_qp_num;
        d.qp_access_flags = s.qp_access_flags;
        d.cap.max_send_wr = s.max_send_wr;
        d.cap.max_recv_wr = s.max_recv_wr;
        d.cap.max_send_sge = s.max_send_sge;
        d.cap.max_recv_sge = s.max_recv_sge;
        d.cap.max_inline_data = s.max_inline_data;
        ah_attr_from_kern(&mut d.ah_attr, &s.ah_attr);
        ah_attr_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
        d.pkey_index = s.pkey_index;
        d.alt_pkey_index = s.alt_pkey_index;
        d.en_sqd_async_notify = s.en_sqd_async_notify;
        d.sq_draining = s.sq_draining;
        d.max_rd_atomic = s.max_rd_atomic;
        d.max_dest_rd_atomic = s.max_dest_rd_atomic;
        d.min_rnr_timer = s.min_rnr_timer;
        d.port_num = s.port_num;
        d.timeout = s.timeout;
        d.retry_cnt = s.retry_cnt;
        d.rnr_retry = s.rnr_retry;
        d.alt_port_num = s.alt_port_num;
        d.alt_timeout = s.alt_timeout;
    }
);

export!(
    "IBVERBS_1.0",
    /// `ibv_copy_path_rec_from_kern`: a path record from the kernel's SA ABI into
    /// `struct ibv_sa_path_rec`, field by field as rdma-core does.
    fn ibv_copy_path_rec_from_kern(
        dst: *mut sys::ibv_sa_path_rec,
        src: *mut sys::ib_user_path_rec,
    ) -> () {
        // SAFETY: the caller passes its own structs of these types (or NULL, refused).
        let Some((d, s)) = (unsafe { dst.as_mut().zip(src.as_ref()) }) else {
            return;
        };
        d.dgid.raw = s.dgid;
        d.sgid.raw = s.sgid;
        d.dlid = s.dlid;
        d.slid = s.slid;
        // The narrowing assignments are C's implicit conversions, as in rdma-core's copy.
        d.raw_traffic = s.raw_traffic as c_int;
        d.flow_label = s.flow_label;
        d.hop_limit = s.hop_limit;
        d.traffic_class = s.traffic_class;
        d.reversible = s.reversible as c_int;
        d.numb_path = s.numb_path;
        d.pkey = s.pkey;
        d.sl = s.sl;
        d.mtu_selector = s.mtu_selector;
        d.mtu = s.mtu as u8;
        d.rate_selector = s.rate_selector;
        d.rate = s.rate;
        d.packet_life_time = s.packet_life_time;
        d.preference = s.preference;
        d.packet_life_time_selector = s.packet_life_time_selector;
    }
);

export!(
    "IBVERBS_1.5",
    /// `ibv_get_pkey_index`: the index of `pkey` (network order) in the port's P_Key table,
    /// found with `ibv_query_pkey` as rdma-core does; -1 when it is not there (the table has
    /// the default P_Key only).
    fn ibv_get_pkey_index(context: *mut sys::ibv_context, port_num: u8, pkey: u16) -> c_int {
        for i in 0.. {
            let mut found = 0u16;
            // SAFETY: `context` is the caller's live context; `found` is ours.
            let r = unsafe { ibv_query_pkey(context, port_num, i, &raw mut found) };
            if r < 0 {
                return r;
            }
            if found == pkey {
                return i;
            }
        }
        -1
    }
);

export!(
    "IBVERBS_1.10",
    /// `ibv_query_ece`: EOPNOTSUPP, roce-xdp has no enhanced connection establishment
    /// (rdma-core's answer for a provider without it; librdmacm then goes on without).
    fn ibv_query_ece(qp: *mut sys::ibv_qp, ece: *mut sys::ibv_ece) -> c_int {
        let _ = (qp, ece);
        libc::EOPNOTSUPP
    }
);

export!(
    "IBVERBS_1.10",
    /// `ibv_set_ece`: EOPNOTSUPP, also in errno (rdma-core sets it when the vendor id is 0,
    /// and a provider without ECE returns it).
    fn ibv_set_ece(qp: *mut sys::ibv_qp, ece: *mut sys::ibv_ece) -> c_int {
        let _ = (qp, ece);
        super::set_errno(libc::EOPNOTSUPP);
        libc::EOPNOTSUPP
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_attach_mcast`: EOPNOTSUPP, roce-xdp does not join multicast groups (rxe does; the
    /// README's feature table lists it as missing).
    fn ibv_attach_mcast(qp: *mut sys::ibv_qp, gid: *const sys::ibv_gid, lid: u16) -> c_int {
        let _ = (qp, gid, lid);
        libc::EOPNOTSUPP
    }
);

export!(
    "IBVERBS_1.1",
    /// `ibv_detach_mcast`: EOPNOTSUPP (no QP can have joined a group).
    fn ibv_detach_mcast(qp: *mut sys::ibv_qp, gid: *const sys::ibv_gid, lid: u16) -> c_int {
        let _ = (qp, gid, lid);
        libc::EOPNOTSUPP
    }
);

/// Runs at process exit (`exit(3)` or a return from `main`): undoes what the devices still
/// open set up in the kernel (their QPNs and sockets in roce_xdp's maps, and roce_xdp itself
/// where opening the device attached it), as `ibv_close_device` would have. Programs may exit
/// without closing their devices (perftest's `ib_atomic_lat` server returns from `main`
/// without it); the interface must not keep a stale QP claim or XDP program then. A device
/// closed before is already gone from the registry, so this does nothing for it.
extern "C" fn release_at_exit() {
    roce::api::release_all_for_exit();
}

/// Registers [`release_at_exit`] once; called when a device is opened.
pub(super) fn release_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `atexit` takes a plain `extern "C" fn()` with no captured state; glibc
        // registers it for this library (run at exit, or when the library is unloaded).
        if unsafe { libc::atexit(release_at_exit) } != 0 {
            eprintln!(
                "libibverbs (roce-xdp): cannot register the exit handler: a program that exits \
                 without ibv_close_device leaves roce_xdp attached (`roce unload` removes it)"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_qp_attributes_are_copied_field_by_field() {
        let mut s = sys::ib_uverbs_qp_attr {
            cur_qp_state: 3,
            path_mtu: 4,
            qkey: 0x1111,
            rq_psn: 7,
            sq_psn: 9,
            dest_qp_num: 0x42,
            max_inline_data: 64,
            max_rd_atomic: 2,
            timeout: 14,
            ..Default::default()
        };
        s.ah_attr.grh.dgid = [0xfe; 16];
        s.ah_attr.is_global = 1;
        s.ah_attr.grh.sgid_index = 3;
        let mut d = sys::ibv_qp_attr::default();
        // SAFETY: both are live locals of the right types.
        unsafe { ibv_copy_qp_attr_from_kern(&raw mut d, &raw mut s) };
        assert_eq!((d.cur_qp_state, d.path_mtu, d.qkey), (3, 4, 0x1111));
        assert_eq!((d.rq_psn, d.sq_psn, d.dest_qp_num), (7, 9, 0x42));
        assert_eq!(
            (d.cap.max_inline_data, d.max_rd_atomic, d.timeout),
            (64, 2, 14)
        );
        // SAFETY: `raw` is the union's plain-bytes view.
        assert_eq!(unsafe { d.ah_attr.grh.dgid.raw }, [0xfe; 16]);
        assert_eq!((d.ah_attr.is_global, d.ah_attr.grh.sgid_index), (1, 3));
        // NULL is ignored rather than followed.
        // SAFETY: NULL is allowed.
        unsafe { ibv_copy_qp_attr_from_kern(core::ptr::null_mut(), &raw mut s) };
    }

    #[test]
    fn sysfs_is_at_slash_sys_unless_the_environment_says_otherwise() {
        let p = sysfs_path().to_str().unwrap();
        assert!(!p.ends_with('/') || p == "/");
        if std::env::var_os("SYSFS_PATH").is_none() {
            assert_eq!(p, "/sys");
        }
    }
}
