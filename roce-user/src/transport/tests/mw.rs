//! Memory windows and local invalidation end to end over the simulated link
//! (transport/sim.rs): binds on the send queue, remote access through a window's R_Key inside
//! and outside its range, after `IBV_WR_LOCAL_INV`, after a SEND with invalidate and after
//! dealloc, and a type 2 window reached from another QP (rxe_mw.c, rxe_req.c, rxe_resp.c).

use super::*;
use crate::transport::sim::Endpoint;

const RW: Access = Access::REMOTE_READ.union(Access::REMOTE_WRITE);

fn bind_op(mw: RKey, mr: &MrInfo, addr: u64, length: u64) -> SendOp {
    SendOp::BindMw(BindMw {
        mw_rkey: mw,
        new_key: (mw.value() as u8).wrapping_add(1),
        mr_lkey: mr.lkey,
        addr,
        length,
        access: RW,
        zero_based: false,
    })
}

/// The window's key after [`bind_op`].
fn bound_key(mw: RKey) -> RKey {
    RKey::new((mw.value() & !0xff) | u32::from((mw.value() as u8).wrapping_add(1)))
}

fn completions(d: &mut Device, cq: CqId) -> Vec<(u64, WcStatus, WcOpcode)> {
    core::iter::from_fn(|| d.poll_cq(cq))
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect()
}

/// B (the peer) writes 16 bytes of 0xab at `va` through `rkey` with WR `id`; returns its
/// completion status.
fn peer_write(p: &mut Pair, b: &Endpoint, src: &MrInfo, id: u64, va: u64, rkey: RKey) -> WcStatus {
    p.b.post_send(b.qpn, signaled(id, write(va, rkey), 0x9000, 16, src.lkey))
        .unwrap();
    assert!(p.drive(10_000));
    let c = completions(&mut p.b, b.cq);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].0, id);
    c[0].1
}

fn setup() -> (Pair, Endpoint, Endpoint, MrInfo, MrInfo) {
    let mut p = Pair::new(3, DeviceConfig::default(), Link::default());
    let (a, b) = connect_rc(&mut p, &RcConfig::default());
    let target =
        p.a.reg_mr(a.pd, vec![0; 4096], 0x1000, Access::all())
            .unwrap();
    let src =
        p.b.reg_mr(b.pd, vec![0xab; 4096], 0x9000, Access::LOCAL_WRITE)
            .unwrap();
    (p, a, b, target, src)
}

/// A connection whose A side has a window of type `ty` bound over `[addr, addr + length)` of
/// its region, the bind completed; returns the window's key too.
fn with_window(
    ty: MwType,
    addr: u64,
    length: u64,
) -> (Pair, Endpoint, Endpoint, MrInfo, MrInfo, RKey) {
    let (mut p, a, b, target, src) = setup();
    let w = p.a.alloc_mw(a.pd, ty).unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(1, bind_op(w, &target, addr, length), vec![]),
    )
    .unwrap();
    assert!(p.drive(1000));
    assert_eq!(
        completions(&mut p.a, a.cq),
        [(1, WcStatus::Success, WcOpcode::BindMw)]
    );
    (p, a, b, target, src, bound_key(w))
}

fn local_inv(p: &mut Pair, a: &Endpoint, id: u64, key: u32) -> Vec<(u64, WcStatus, WcOpcode)> {
    p.a.post_send(
        a.qpn,
        SendWr::new(
            id,
            SendOp::LocalInv {
                invalidate_key: key,
            },
            vec![],
        ),
    )
    .unwrap();
    assert!(p.drive(1000));
    completions(&mut p.a, a.cq)
}

#[test]
fn type_1_window_bound_on_the_send_queue_reaches_only_its_range() {
    let (mut p, a, b, target, src, k) = with_window(MwType::One, 0x1100, 256);
    assert_eq!(
        peer_write(&mut p, &b, &src, 10, 0x1100, k),
        WcStatus::Success
    );
    assert_eq!(
        &p.a.mrs().bytes(target.lkey).unwrap()[0x100..0x110],
        &[0xab; 16]
    );
    // A type 1 window cannot be invalidated: the LOCAL_INV fails with LOC_QP_OP_ERR and the
    // QP enters the error state (rxe `rxe_do_local_ops`).
    assert_eq!(
        local_inv(&mut p, &a, 2, k.value()),
        [(2, WcStatus::LocQpOpErr, WcOpcode::LocalInv)]
    );
    assert_eq!(p.a.qp(a.qpn).unwrap().state(), QpState::Err);
    // Inside the region, outside the window, by 8 bytes: REM_ACCESS_ERR, nothing written.
    let (mut p, _a, b, target, src, k) = with_window(MwType::One, 0x1100, 256);
    assert_eq!(
        peer_write(&mut p, &b, &src, 11, 0x1100 + 256 - 8, k),
        WcStatus::RemAccessErr
    );
    assert!(
        p.a.mrs()
            .bytes(target.lkey)
            .unwrap()
            .iter()
            .all(|&x| x == 0)
    );
    assert!(p.a.mrs().guard_violations().is_empty());
}

#[test]
fn type_2_window_dies_with_local_inv_send_with_inv_and_dealloc() {
    // Not bound yet: nothing reaches through it.
    let (mut p, a, b, _target, src) = setup();
    let w = p.a.alloc_mw(a.pd, MwType::Two).unwrap();
    assert_eq!(
        peer_write(&mut p, &b, &src, 9, 0x1000, w),
        WcStatus::RemAccessErr
    );
    // A bind of a window outside the region fails with MW_BIND_ERR.
    let (mut p, a, _b, target, _src) = setup();
    let w = p.a.alloc_mw(a.pd, MwType::Two).unwrap();
    let bad = SendWr::new(1, bind_op(w, &target, 0x1000 + 4000, 256), vec![]);
    p.a.post_send(a.qpn, bad).unwrap();
    assert!(p.drive(1000));
    assert_eq!(
        completions(&mut p.a, a.cq),
        [(1, WcStatus::MwBindErr, WcOpcode::BindMw)]
    );
    // Bound: WRITE and READ through it; LOCAL_INV; bound again; SEND with invalidate.
    let (mut p, a, b, target, src, k) = with_window(MwType::Two, 0x1000, 64);
    assert_eq!(
        peer_write(&mut p, &b, &src, 10, 0x1000, k),
        WcStatus::Success
    );
    p.b.post_send(b.qpn, signaled(11, read(0x1000, k), 0x9100, 16, src.lkey))
        .unwrap();
    assert!(p.drive(10_000));
    assert_eq!(
        completions(&mut p.b, b.cq),
        [(11, WcStatus::Success, WcOpcode::RdmaRead)]
    );
    assert_eq!(
        local_inv(&mut p, &a, 2, k.value()),
        [(2, WcStatus::Success, WcOpcode::LocalInv)]
    );
    p.a.post_send(
        a.qpn,
        SendWr::new(3, bind_op(k, &target, 0x1000, 64), vec![]),
    )
    .unwrap();
    p.a.post_recv(
        a.qpn,
        RecvWr {
            wr_id: 4,
            sg_list: vec![Sge {
                addr: 0x1800,
                length: 64,
                lkey: target.lkey,
            }],
        },
    )
    .unwrap();
    assert!(p.drive(1000));
    let k2 = bound_key(k);
    let inv = SendOp::SendWithInv {
        invalidate_rkey: k2,
    };
    p.b.post_send(b.qpn, signaled(12, inv, 0x9000, 8, src.lkey))
        .unwrap();
    assert!(p.drive(10_000));
    let ca: Vec<_> = core::iter::from_fn(|| p.a.poll_cq(a.cq)).collect();
    assert_eq!(ca.len(), 2, "{ca:?}");
    assert_eq!((ca[0].wr_id, ca[0].opcode), (3, WcOpcode::BindMw));
    assert_eq!((ca[1].wr_id, ca[1].status), (4, WcStatus::Success));
    assert!(ca[1].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(ca[1].invalidated_rkey, k2);
    assert_eq!(
        completions(&mut p.b, b.cq),
        [(12, WcStatus::Success, WcOpcode::Send)]
    );
    assert_eq!(
        peer_write(&mut p, &b, &src, 13, 0x1000, k2),
        WcStatus::RemAccessErr
    );
    assert!(
        p.a.mrs().bytes(target.lkey).unwrap()[16..0x800]
            .iter()
            .all(|&x| x == 0)
    );
    // After LOCAL_INV alone: REM_ACCESS_ERR.
    let (mut p, a, b, target, src, k) = with_window(MwType::Two, 0x1000, 64);
    assert_eq!(
        local_inv(&mut p, &a, 2, k.value()),
        [(2, WcStatus::Success, WcOpcode::LocalInv)]
    );
    assert_eq!(
        peer_write(&mut p, &b, &src, 14, 0x1000, k),
        WcStatus::RemAccessErr
    );
    assert!(
        p.a.mrs()
            .bytes(target.lkey)
            .unwrap()
            .iter()
            .all(|&x| x == 0)
    );
    // The region cannot go while a window is bound (rxe: EINVAL); after dealloc of the bound
    // window its key is dead and the region can go.
    let (mut p, a, b, target, src, k) = with_window(MwType::Two, 0x1000, 64);
    assert_eq!(
        p.a.dereg_mr(target.lkey).err(),
        Some(MrError::WindowsBound(target.lkey, 1))
    );
    p.a.dealloc_mw(k).unwrap();
    assert_eq!(
        peer_write(&mut p, &b, &src, 15, 0x1000, k),
        WcStatus::RemAccessErr
    );
    let _ = a;
    p.a.dereg_mr(target.lkey).unwrap();
}

#[test]
fn type_2_window_is_reached_only_through_the_qp_that_bound_it() {
    let mut p = Pair::new(4, DeviceConfig::default(), Link::default());
    let cfg = RcConfig::default();
    let (a, b) = connect_rc(&mut p, &cfg);
    // A second connection between the same devices, in the same PD on A.
    let cq2 = p.a.create_cq(64).unwrap();
    let a2 = p.a.create_qp(QpInit::new(QpType::Rc, a.pd, cq2)).unwrap();
    let pd_b2 = p.b.alloc_pd().unwrap();
    let cq_b2 = p.b.create_cq(64).unwrap();
    let b2 =
        p.b.create_qp(QpInit::new(QpType::Rc, pd_b2, cq_b2))
            .unwrap();
    let (pa, pb) = (Psn::new(100), Psn::new(200));
    bring_up(&mut p.a, a2, Side::A, b2, pa, pb, &cfg);
    bring_up(&mut p.b, b2, Side::B, a2, pb, pa, &cfg);
    let target =
        p.a.reg_mr(a.pd, vec![0; 4096], 0x1000, Access::all())
            .unwrap();
    let src2 =
        p.b.reg_mr(pd_b2, vec![0xcd; 64], 0x9000, Access::LOCAL_WRITE)
            .unwrap();
    let w = p.a.alloc_mw(a.pd, MwType::Two).unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(1, bind_op(w, &target, 0x1000, 64), vec![]),
    )
    .unwrap();
    assert!(p.drive(1000));
    let k = bound_key(w);
    // Through b2 -> a2: same PD on A, but not the QP the window is bound to.
    p.b.post_send(b2, signaled(20, write(0x1000, k), 0x9000, 16, src2.lkey))
        .unwrap();
    assert!(p.drive(10_000));
    assert_eq!(
        completions(&mut p.b, cq_b2),
        [(20, WcStatus::RemAccessErr, WcOpcode::RdmaWrite)]
    );
    assert!(
        p.a.mrs()
            .bytes(target.lkey)
            .unwrap()
            .iter()
            .all(|&x| x == 0)
    );
    // Through its own QP it works.
    let src =
        p.b.reg_mr(b.pd, vec![0xcd; 64], 0x9000, Access::LOCAL_WRITE)
            .unwrap();
    assert_eq!(
        peer_write(&mut p, &b, &src, 21, 0x1000, k),
        WcStatus::Success
    );
    // Destroying the QP frees its type 2 windows: the key dies, the region can go.
    p.a.destroy_qp(a.qpn).unwrap();
    assert_eq!(p.a.mrs().mw_info(k), Some((k, MwType::Two, false)));
    p.a.dereg_mr(target.lkey).unwrap();
}
