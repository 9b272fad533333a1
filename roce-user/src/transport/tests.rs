//! One test per responder and completer rule of reference/roce-v2.md §2, on the simulator.

use super::sim::{Endpoint, Pair, RcConfig, Side, connect_rc, frame_opcode_psn};
use super::*;

pub(crate) fn setup(cfg: &RcConfig) -> (Pair, Endpoint, Endpoint) {
    let mut p = Pair::new(1, DeviceConfig::default(), sim::Link::default());
    let (a, b) = connect_rc(&mut p, cfg);
    (p, a, b)
}

pub(crate) fn mr(d: &mut Device, len: usize, fill: u8) -> MrInfo {
    d.reg_mr(vec![fill; len], 0x1000, Access::all())
        .expect("reg_mr")
}

pub(crate) fn sge(m: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: m.iova + off,
        length: len,
        lkey: m.lkey,
    }
}

pub(crate) fn wcs(d: &mut Device, cq: CqId) -> Vec<Wc> {
    core::iter::from_fn(|| d.poll_cq(cq)).collect()
}

#[test]
fn send_multi_packet_message_arrives_intact() {
    let (mut p, a, b) = setup(&RcConfig::default());
    let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let ma = p.a.reg_mr(src.clone(), 0x1000, Access::empty()).unwrap();
    let mb = mr(&mut p.b, 8192, 0);
    p.b.post_recv(
        b.qpn,
        RecvWr {
            wr_id: 7,
            sg_list: vec![sge(&mb, 0, 8192)],
        },
    )
    .unwrap();
    p.a.post_send(a.qpn, SendWr::send(1, vec![sge(&ma, 0, 5000)]))
        .unwrap();
    assert!(p.drive(10_000));
    let wa = wcs(&mut p.a, a.cq);
    let wb = wcs(&mut p.b, b.cq);
    assert_eq!(wa.len(), 1, "{wa:?}");
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(&p.b.mrs().bytes(mb.lkey).unwrap()[..5000], &src[..]);
    let _ = (Side::A, frame_opcode_psn);
}
