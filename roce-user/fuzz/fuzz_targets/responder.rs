//! Fuzzes a device whose RC QP is in RTS with arbitrary incoming packets: raw frames, and
//! structured packets (any opcode, PSN near the expected one, any flags and extended-header
//! values, any payload) emitted as valid frames with a correct ICRC so they reach the QP logic.
//!
//! Checks after every packet: no panic; every bounded queue stays within its bound (control
//! responses, responder resources, receive queue, CQ, events); and memory the peer may not
//! write (a local-only region, a read-only region, a region of another PD) is never changed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::{
    transport::{
        Access, Device, Instant, LKey, MAX_FRAME_LEN, PKey, Psn, QpCap, Qpn, RKey, RecvWr, SendOp,
        SendWr, Sge,
        qp::MAX_PENDING_ACKS,
        sim::{Side, path},
    },
    wire::{
        AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr,
        ImmDtRepr, Msn, Opcode, QKey, RethRepr, RoceRepr, emit_frame,
    },
};

mod common;
use common::{Cursor, PEER, rc_device};

const RQ_PSN: u32 = 0xff_fff0;
const SQ_PSN: u32 = 0x10;
const CAP: QpCap = QpCap {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_sge: 2,
    max_inline_data: 0,
};
const CQ_DEPTH: usize = 64;

struct World {
    d: Device,
    qpn: Qpn,
    peer: Qpn,
    target: (LKey, RKey),
    canary: LKey,
    readonly: (LKey, RKey),
    /// A region of another protection domain, with every right.
    foreign: (LKey, RKey),
    now: Instant,
}

fn world() -> World {
    let (mut d, pd, qpn) = rc_device(CAP, CQ_DEPTH, 2, SQ_PSN, RQ_PSN);
    let peer = PEER;
    let t = d.reg_mr(pd, vec![0; 4096], 0x1000, Access::all()).unwrap();
    let c = d
        .reg_mr(pd, vec![0xcc; 4096], 0x3000, Access::LOCAL_WRITE)
        .unwrap();
    let r = d
        .reg_mr(pd, vec![0xee; 4096], 0x5000, Access::REMOTE_READ)
        .unwrap();
    let other = d.alloc_pd().unwrap();
    let o = d
        .reg_mr(other, vec![0xdd; 4096], 0x7000, Access::all())
        .unwrap();
    let mut w = World {
        foreign: (o.lkey, o.rkey),
        d,
        qpn,
        peer,
        target: (t.lkey, t.rkey),
        canary: c.lkey,
        readonly: (r.lkey, r.rkey),
        now: Instant::ZERO,
    };
    // Outstanding requests, so responses of every kind have something to match.
    let sg = |off: u64, len: u32| {
        vec![Sge {
            addr: 0x1000 + off,
            length: len,
            lkey: t.lkey,
        }]
    };
    let ops = [
        SendOp::Send,
        SendOp::Read {
            remote_addr: 0x9000,
            rkey: RKey::new(9),
        },
        SendOp::Write {
            remote_addr: 0x9000,
            rkey: RKey::new(9),
        },
        SendOp::FetchAdd {
            remote_addr: 0x9000,
            rkey: RKey::new(9),
            add: 1,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 600 };
        let _ = w.d.post_send(
            qpn,
            SendWr::new(i as u64, op, sg(2048 + 64 * i as u64, len)),
        );
    }
    for i in 0..4 {
        let _ = w.d.post_recv(
            qpn,
            RecvWr {
                wr_id: 100 + i,
                sg_list: sg(512 * i, 512),
            },
        );
    }
    w
}

fn structured(w: &mut World, c: &mut Cursor<'_>) -> Option<Vec<u8>> {
    let ops = Opcode::ALL;
    let op = ops[usize::from(c.u8()?) % ops.len()];
    let info = op.info()?;
    let flags = c.u8()?;
    let base = if info.is_response() { SQ_PSN } else { RQ_PSN };
    let psn = Psn::new(base)
        .wrapping_add(u32::from(c.u8()?))
        .wrapping_sub(8);
    let mut bth = BthRepr::new(
        op,
        if flags & 0x40 != 0 {
            Qpn::new(c.u32()?)
        } else {
            w.qpn
        },
        psn,
    );
    bth.ack_req = flags & 1 != 0;
    bth.solicited = flags & 2 != 0;
    bth.mig_req = flags & 4 != 0;
    if flags & 0x80 != 0 {
        bth.pkey = PKey::new(c.u16()?);
    }
    let mut h = RoceRepr::new(bth);
    // Addresses mostly near the regions, sometimes anywhere.
    let mut va = || -> Option<u64> {
        let v = c.u16()?;
        Some(match v >> 14 {
            0 => 0x1000 + u64::from(v & 0x1fff),
            1 => 0x5000 + u64::from(v & 0x1fff),
            2 if v & 1 == 0 => 0x3000 + u64::from(v & 0x1fff),
            2 => 0x7000 + u64::from(v & 0x1fff),
            _ => u64::MAX - u64::from(v & 0xff),
        })
    };
    let va1 = va()?;
    let va2 = va()?;
    let kb = c.u8()?;
    let key = match kb % 5 {
        0 => w.target.1,
        1 => w.readonly.1,
        4 => w.foreign.1,
        2 => RKey::new(w.target.1.value() ^ 1),
        _ => RKey::new(u32::from(kb) << 16),
    };
    let hdrs = info.hdrs;
    use roce_common::opcode::Hdrs;
    if hdrs.contains(Hdrs::RETH) {
        h.reth = Some(RethRepr {
            va: va1,
            rkey: key,
            dma_len: u32::from(c.u16()?),
        });
    }
    if hdrs.contains(Hdrs::ATOMIC_ETH) {
        h.atomic_eth = Some(AtomicEthRepr {
            va: va2,
            rkey: key,
            swap_add: c.u64()?,
            compare: c.u64()?,
        });
    }
    if hdrs.contains(Hdrs::AETH) {
        h.aeth = Some(AethRepr {
            syndrome: AethSyndrome::from_byte(c.u8()?),
            msn: Msn::new(c.u32()?),
        });
    }
    if hdrs.contains(Hdrs::ATOMIC_ACK_ETH) {
        h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: c.u64()? });
    }
    if hdrs.contains(Hdrs::IMMDT) {
        h.immdt = Some(ImmDtRepr { imm: c.u32()? });
    }
    if hdrs.contains(Hdrs::IETH) {
        h.ieth = Some(IethRepr { rkey: key });
    }
    if hdrs.contains(Hdrs::DETH) {
        h.deth = Some(DethRepr {
            qkey: QKey::new(c.u32()?),
            src_qp: Qpn::new(c.u32()?),
        });
    }
    if hdrs.contains(Hdrs::FETH) || hdrs.contains(Hdrs::CNP) {
        // Headers the transport never builds: leave such packets to the raw path.
        return None;
    }
    let repr = h;
    let plen = if info.payload {
        usize::from(c.u16()? % 600)
    } else {
        0
    };
    let payload = c.bytes(plen).to_vec();
    let mut frame = vec![0; MAX_FRAME_LEN];
    let n = emit_frame(&path(Side::A), &repr, &payload, &mut frame).ok()?;
    frame.truncate(n);
    Some(frame)
}

fn check(w: &mut World) {
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut sent = 0;
    while w.d.poll_transmit(w.now, &mut buf).is_some() {
        sent += 1;
        assert!(sent < 10_000, "poll_transmit must run dry");
    }
    let q = w.d.qp(w.qpn).unwrap();
    assert!(q.pending_acks() <= MAX_PENDING_ACKS);
    // A full control queue merges answers; it drops one only for a NAK before the newest
    // queued answer, which the responder never makes (issue 20: a NAK is never lost).
    assert_eq!(
        q.counters().ack_queue_full,
        0,
        "a control answer was dropped"
    );
    assert!(q.responder_resources() <= 2);
    assert!(q.recv_queue_len() <= CAP.max_recv_wr as usize);
    assert!(q.send_queue_len() <= CAP.max_send_wr as usize);
    let mrs = w.d.mrs();
    assert!(
        mrs.guard_violations().is_empty(),
        "a canary byte next to a region changed"
    );
    assert!(
        mrs.bytes(w.canary).unwrap().iter().all(|&b| b == 0xcc),
        "local-only region written"
    );
    assert!(
        mrs.bytes(w.readonly.0).unwrap().iter().all(|&b| b == 0xee),
        "read-only region written"
    );
    assert!(
        mrs.bytes(w.foreign.0).unwrap().iter().all(|&b| b == 0xdd),
        "another PD's region written"
    );
    let mut events = 0;
    while w.d.poll_event().is_some() {
        events += 1;
    }
    assert!(events <= 32);
    while w.d.poll_cq(roce::transport::CqId(0)).is_some() {}
}

fuzz_target!(|data: &[u8]| {
    let mut w = world();
    let mut c = Cursor(data);
    let _ = w.peer;
    while let Some(mode) = c.u8() {
        match mode % 8 {
            0 => {
                let n = usize::from(c.u16().unwrap_or(0)) % 1500;
                let raw = c.bytes(n).to_vec();
                w.d.handle_packet(w.now, &raw);
            }
            1 => {
                w.now =
                    w.now + core::time::Duration::from_micros(u64::from(c.u16().unwrap_or(0)) * 50);
                w.d.handle_timeout(w.now);
            }
            2 => {
                let off = u64::from(c.u8().unwrap_or(0)) * 16;
                let sg = vec![Sge {
                    addr: 0x1000 + off,
                    length: 256,
                    lkey: w.target.0,
                }];
                let _ = w.d.post_recv(
                    w.qpn,
                    RecvWr {
                        wr_id: 7,
                        sg_list: sg,
                    },
                );
            }
            _ => {
                if let Some(frame) = structured(&mut w, &mut c) {
                    w.d.handle_packet(w.now, &frame);
                }
            }
        }
        check(&mut w);
    }
});
