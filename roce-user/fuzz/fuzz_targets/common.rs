//! What the fuzz targets share: a cursor over the fuzzer's bytes and the device with one RC
//! QP in RTS that the completer and responder targets start from.

#![allow(dead_code)] // each target uses a different part

use roce::transport::{
    Device, DeviceConfig, Mtu, PdId, Psn, QpCap, QpInit, QpType, Qpn,
    sim::{RcConfig, Side, bring_up},
};

/// The fuzzer's input, read front to back; every read is `None` once it runs out.
pub struct Cursor<'a>(pub &'a [u8]);

impl Cursor<'_> {
    pub fn u8(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from(self.u16()?) << 16 | u32::from(self.u16()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from(self.u32()?) << 32 | u64::from(self.u32()?))
    }
    pub fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// The peer QP the targets play (Side A of `sim::path`).
pub const PEER: Qpn = Qpn::new(0x77);

/// A device (at most 32 queued events) with one RC QP of `cap`, signalling every send, brought
/// up to RTS as Side B at MTU 256 with `rd_atomic` outstanding READ/atomics, our send queue
/// starting at `sq_psn` and the peer's at `rq_psn`. Returns the device, the QP's PD and the QP.
pub fn rc_device(
    cap: QpCap,
    cq_depth: usize,
    rd_atomic: u8,
    sq_psn: u32,
    rq_psn: u32,
) -> (Device, PdId, Qpn) {
    let mut d = Device::new(DeviceConfig {
        max_events: 32,
        ..DeviceConfig::default()
    });
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(cq_depth).unwrap();
    let qpn = d
        .create_qp(QpInit {
            cap,
            sq_sig_all: true,
            ..QpInit::new(QpType::Rc, pd, cq)
        })
        .unwrap();
    let cfg = RcConfig {
        cap,
        cq_depth,
        rd_atomic,
        mtu: Mtu::Mtu256,
        ..RcConfig::default()
    };
    bring_up(
        &mut d,
        qpn,
        Side::B,
        PEER,
        Psn::new(sq_psn),
        Psn::new(rq_psn),
        &cfg,
    );
    (d, pd, qpn)
}
