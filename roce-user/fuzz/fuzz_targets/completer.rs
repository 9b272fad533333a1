//! Fuzzes the requester and completer: a device whose RC QP is in RTS with outstanding SEND,
//! WRITE, READ and atomic WRs is fed responses (ACKs with any syndrome and MSN, READ responses
//! first/middle/last/only, atomic ACKs) with PSNs around the ones it sent, raw frames, timer
//! expiries and new posts.
//!
//! Checks after every input step: no panic; each WR completes at most once, and only WRs that
//! were posted complete; bounded queues stay within their bounds; and no byte outside the
//! posted local buffers a response may fill (READ and atomic destinations) ever changes: the
//! rest of the target region (gaps between buffers, SEND/WRITE sources) keeps its pattern, and
//! a canary region of the same PD that no WR names is never written.

#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use roce::{
    transport::{
        Access, CqId, Device, Instant, LKey, MAX_FRAME_LEN, PKey, Psn, QpCap, Qpn, RKey, SendOp,
        SendWr, Sge,
        sim::{Side, path},
    },
    wire::{AethRepr, AethSyndrome, AtomicAckEthRepr, BthRepr, Msn, Opcode, RoceRepr, emit_frame},
};

mod common;
use common::{Cursor, rc_device};

/// Our send queue's first PSN: near the 24-bit wrap, so PSN arithmetic wraps during the run.
const SQ_PSN: u32 = 0xff_fffa;
const RQ_PSN: u32 = 0x100;
const CAP: QpCap = QpCap {
    max_send_wr: 16,
    max_recv_wr: 4,
    max_sge: 2,
    max_inline_data: 0,
};
const CQ_DEPTH: usize = 64;
/// Where the target region lives (VA) and its size.
const BASE: u64 = 0x10_0000;
const LEN: usize = 16 * 1024;
const PATTERN: u8 = 0xa5;
const CANARY: u8 = 0x5a;

struct World {
    d: Device,
    qpn: Qpn,
    target: LKey,
    canary: LKey,
    /// Byte offsets (into the target region) that a response may legitimately write.
    writable: Vec<bool>,
    /// wr_ids posted and accepted, not yet completed.
    outstanding: BTreeSet<u64>,
    /// wr_ids completed.
    done: BTreeSet<u64>,
    next_wr: u64,
    /// Next free offset in the target region for a new WR's buffers.
    next_off: usize,
    now: Instant,
}

impl World {
    /// Posts one WR of kind `k` with a local buffer of `len` bytes (atomics: 8) at the next
    /// free offset, leaving a 16-byte gap before it. Returns whether the post was accepted.
    fn post(&mut self, k: u8, len: u16) -> bool {
        let op = match k % 5 {
            0 => SendOp::Send,
            1 => SendOp::Write {
                remote_addr: 0x9000,
                rkey: RKey::new(9),
            },
            2 => SendOp::Read {
                remote_addr: 0x9000,
                rkey: RKey::new(9),
            },
            3 => SendOp::FetchAdd {
                remote_addr: 0x9000,
                rkey: RKey::new(9),
                add: 1,
            },
            _ => SendOp::CompareSwap {
                remote_addr: 0x9008,
                rkey: RKey::new(9),
                compare: 0,
                swap: 1,
            },
        };
        let len = if op.is_atomic() {
            8
        } else {
            usize::from(len % 1200)
        };
        // 8-byte aligned, after a 16-byte gap.
        let off = (self.next_off + 16 + 7) & !7;
        if off + len > LEN {
            return false;
        }
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let sg = if len == 0 {
            Vec::new()
        } else {
            vec![Sge {
                addr: BASE + off as u64,
                length: len as u32,
                lkey: self.target,
            }]
        };
        let fills = op.is_read_or_atomic();
        if self
            .d
            .post_send(self.qpn, SendWr::new(wr_id, op, sg))
            .is_ok()
        {
            self.next_off = off + len;
            if fills {
                self.writable[off..off + len].fill(true);
            }
            self.outstanding.insert(wr_id);
            true
        } else {
            false
        }
    }
}

fn world() -> World {
    let (mut d, pd, qpn) = rc_device(CAP, CQ_DEPTH, 4, SQ_PSN, RQ_PSN);
    let canary = d
        .reg_mr(pd, vec![CANARY; 4096], BASE - 0x1000, Access::all())
        .unwrap();
    let target = d
        .reg_mr(pd, vec![PATTERN; LEN], BASE, Access::all())
        .unwrap();
    let mut w = World {
        d,
        qpn,
        target: target.lkey,
        canary: canary.lkey,
        writable: vec![false; LEN],
        outstanding: BTreeSet::new(),
        done: BTreeSet::new(),
        next_wr: 1,
        next_off: 0,
        now: Instant::ZERO,
    };
    // One WR of each kind, so responses of every kind have something to match.
    for k in 0..5 {
        w.post(k, 700);
    }
    w
}

/// A response frame from the peer (Side A) built from the input.
fn response(w: &World, c: &mut Cursor<'_>) -> Option<Vec<u8>> {
    const OPS: [Opcode; 6] = [
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
    ];
    let sel = c.u8()?;
    let op = OPS[usize::from(sel) % OPS.len()];
    let info = op.info()?;
    let flags = c.u8()?;
    // PSNs mostly around what we sent, sometimes anywhere.
    let psn = if flags & 0x20 != 0 {
        Psn::new(c.u32()?)
    } else {
        Psn::new(SQ_PSN)
            .wrapping_add(u32::from(c.u8()?))
            .wrapping_sub(16)
    };
    let qpn = if flags & 0x40 != 0 {
        Qpn::new(c.u32()?)
    } else {
        w.qpn
    };
    let mut bth = BthRepr::new(op, qpn, psn);
    bth.ack_req = flags & 1 != 0;
    if flags & 0x80 != 0 {
        bth.pkey = PKey::new(c.u16()?);
    }
    let mut repr = RoceRepr::new(bth);
    use roce_common::opcode::Hdrs;
    if info.hdrs.contains(Hdrs::AETH) {
        // Syndromes: ACK with credits, RNR NAK, or a NAK code (0..=4 and beyond), or anything.
        let s = c.u8()?;
        let syndrome = match s >> 6 {
            0 => s & 0x1f,
            1 => 0x20 | (s & 0x1f),
            2 => 0x60 | (s & 0x07),
            _ => c.u8()?,
        };
        repr.aeth = Some(AethRepr {
            syndrome: AethSyndrome::from_byte(syndrome),
            msn: Msn::new(u32::from(c.u8()?)),
        });
    }
    if info.hdrs.contains(Hdrs::ATOMIC_ACK_ETH) {
        repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig: c.u64()? });
    }
    let plen = if info.payload {
        // Whole words mostly (the parser drops others), up to a little past MTU 256.
        let n = usize::from(c.u16()? % 320);
        if flags & 0x10 != 0 { n } else { n & !3 }
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
    while let Some(wc) = w.d.poll_cq(CqId(0)) {
        assert!(
            w.outstanding.remove(&wc.wr_id),
            "completion for wr_id {} that is not outstanding (already done: {})",
            wc.wr_id,
            w.done.contains(&wc.wr_id)
        );
        w.done.insert(wc.wr_id);
    }
    let q = w.d.qp(w.qpn).unwrap();
    assert!(q.send_queue_len() <= CAP.max_send_wr as usize);
    let mrs = w.d.mrs();
    assert!(
        mrs.guard_violations().is_empty(),
        "a canary byte next to a region changed"
    );
    let bytes = mrs.bytes(w.target).unwrap();
    for (i, (&b, &ok)) in bytes.iter().zip(&w.writable).enumerate() {
        assert!(
            ok || b == PATTERN,
            "byte {i} of the target region outside every posted READ/atomic buffer changed"
        );
    }
    assert!(
        mrs.bytes(w.canary).unwrap().iter().all(|&b| b == CANARY),
        "canary region written"
    );
    let mut events = 0;
    while w.d.poll_event().is_some() {
        events += 1;
    }
    assert!(events <= 32);
}

fuzz_target!(|data: &[u8]| {
    let mut w = world();
    check(&mut w);
    let mut c = Cursor(data);
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
                let k = c.u8().unwrap_or(0);
                let len = c.u16().unwrap_or(0);
                w.post(k, len);
            }
            _ => {
                if let Some(frame) = response(&w, &mut c) {
                    w.d.handle_packet(w.now, &frame);
                }
            }
        }
        check(&mut w);
    }
});
