//! Zero allocations per packet in steady state (issue #10), counted through a global
//! allocator hook.
//!
//! Two [`Device`]s are joined back to back (every frame one endpoint's `poll_transmit` writes
//! into a fixed buffer is handed to the other's `handle_packet` at once), so the measured path
//! is exactly the engine's per-packet work: frame parse and ICRC check (`wire`), the
//! responder, the completer, ACK generation, DCQCN bookkeeping (on by default), segmentation,
//! the gather of payload from the memory region, and frame emission with its ICRC.
//!
//! After a warm-up that lets every queue (send and receive queues, the CQ, the ACK queue,
//! responder resources) reach its steady-state capacity, the test runs rounds of WRITE
//! (4 packets), SEND (2 packets) and READ (1 request, 4 responses) in both directions and
//! asserts that the allocator saw no allocation and no reallocation in the whole window.
//!
//! Work requests carry their scatter/gather list in a `Vec` (the verbs-like API's shape), which
//! is an allocation per *work request* made by the application when it builds the WR, not by
//! the transport. They are built before the window and moved in; dropping them when they
//! complete is a deallocation, which is allowed.
//!
//! The allocator hook is `stats_alloc` (no `unsafe` in this file); it counts every thread, so
//! this binary holds this one test.

use std::alloc::System;

use roce::transport::{
    Access, Device, DeviceConfig, LKey, Mtu, RKey, RecvWr, SendOp, SendWr, Sge, WcStatus,
    sim::{Endpoint, Link, Pair, RcConfig, connect_rc},
    timer::Instant,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const MR_LEN: usize = 1 << 20;
const IOVA: u64 = 0x10_0000;
const MSG: u64 = 4096;
const SEND_MSG: u64 = 2048;

struct Side {
    ep: Endpoint,
    mr: (LKey, RKey),
}

fn sge(mr: (LKey, RKey), off: u64, len: u64) -> Vec<Sge> {
    vec![Sge {
        addr: IOVA + off,
        length: u32::try_from(len).unwrap(),
        lkey: mr.0,
    }]
}

/// The WRs of one round from `from` to `to`: a WRITE, a SEND (and the receive it consumes at
/// `to`) and a READ, each of [`MSG`] / [`SEND_MSG`] bytes, at offsets that vary with `round`.
fn round_wrs(round: u64, from: &Side, to: &Side) -> ([SendWr<roce::transport::Path>; 3], RecvWr) {
    let off = (round % 16) * MSG;
    let write = SendWr::new(
        round * 3,
        SendOp::Write {
            remote_addr: IOVA + 0x8_0000 + off,
            rkey: to.mr.1,
        },
        sge(from.mr, off, MSG),
    );
    let send = SendWr::send(round * 3 + 1, sge(from.mr, 0x4_0000 + off, SEND_MSG));
    let read = SendWr::new(
        round * 3 + 2,
        SendOp::Read {
            remote_addr: IOVA + off,
            rkey: to.mr.1,
        },
        sge(from.mr, 0xc_0000 + off, MSG),
    );
    let recv = RecvWr {
        wr_id: round,
        sg_list: sge(to.mr, 0x6_0000 + off, SEND_MSG),
    };
    ([write, send, read], recv)
}

/// Moves frames between the two devices until neither has anything to send; returns how many
/// frames moved. Allocates nothing itself: one fixed frame buffer.
fn pump(a: &mut Device, b: &mut Device, now: Instant, buf: &mut [u8]) -> u64 {
    let mut moved = 0;
    loop {
        let before = moved;
        // A to B as the engine does it (`handle_packet_mut`, ICRC checked in place), B to A
        // through the copying `handle_packet`: both receive paths are measured.
        while let Some(t) = a.poll_transmit(now, buf) {
            b.handle_packet_mut(now, &mut buf[..t.size]);
            moved += 1;
        }
        while let Some(t) = b.poll_transmit(now, buf) {
            a.handle_packet(now, &buf[..t.size]);
            moved += 1;
        }
        if moved == before {
            return moved;
        }
    }
}

/// Completions of a round: 3 send WRs on each side, 1 receive on each side.
const WC_PER_ROUND: u64 = 8;

struct Bench {
    pair: Pair,
    a: Side,
    b: Side,
    now: Instant,
    buf: Vec<u8>,
}

impl Bench {
    fn new() -> Self {
        let mut pair = Pair::new(1, DeviceConfig::default(), Link::default());
        let cfg = RcConfig {
            mtu: Mtu::Mtu1024,
            ..RcConfig::default()
        };
        let (ea, eb) = connect_rc(&mut pair, &cfg);
        let mr = |d: &mut Device, pd, fill: u8| {
            let m = d
                .reg_mr(pd, vec![fill; MR_LEN], IOVA, Access::all())
                .unwrap();
            (m.lkey, m.rkey)
        };
        let ma = mr(&mut pair.a, ea.pd, 0xa5);
        let mb = mr(&mut pair.b, eb.pd, 0x5a);
        Self {
            pair,
            a: Side { ep: ea, mr: ma },
            b: Side { ep: eb, mr: mb },
            now: Instant::ZERO,
            buf: vec![0; roce::transport::MAX_FRAME_LEN],
        }
    }

    /// Runs `wrs` (built beforehand) to completion; returns (frames moved, completions).
    fn run(&mut self, wrs: Vec<WrsOfRound>) -> (u64, u64) {
        let (mut frames, mut wcs) = (0, 0);
        for (a_wrs, a_recv, b_wrs, b_recv) in wrs {
            let p = &mut self.pair;
            p.b.post_recv(self.b.ep.qpn, a_recv).unwrap();
            p.a.post_recv(self.a.ep.qpn, b_recv).unwrap();
            for wr in a_wrs {
                p.a.post_send(self.a.ep.qpn, wr).unwrap();
            }
            for wr in b_wrs {
                p.b.post_send(self.b.ep.qpn, wr).unwrap();
            }
            self.now = self.now + core::time::Duration::from_micros(10);
            frames += pump(&mut p.a, &mut p.b, self.now, &mut self.buf);
            for (d, cq) in [(&mut p.a, self.a.ep.cq), (&mut p.b, self.b.ep.cq)] {
                while let Some(wc) = d.poll_cq(cq) {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    wcs += 1;
                }
            }
            // Timers fire only if an ACK went missing, which a lossless link never does.
            assert!(
                p.a.poll_timeout().is_none_or(|t| t > self.now)
                    && p.b.poll_timeout().is_none_or(|t| t > self.now)
            );
        }
        (frames, wcs)
    }

    fn wrs(&self, rounds: core::ops::Range<u64>) -> Vec<WrsOfRound> {
        rounds
            .map(|r| {
                let (aw, ar) = round_wrs(r, &self.a, &self.b);
                let (bw, br) = round_wrs(r, &self.b, &self.a);
                (aw, ar, bw, br)
            })
            .collect()
    }
}

type WrsOfRound = (
    [SendWr<roce::transport::Path>; 3],
    RecvWr,
    [SendWr<roce::transport::Path>; 3],
    RecvWr,
);

#[test]
fn steady_state_write_send_read_allocates_nothing_per_packet() {
    const WARMUP: u64 = 64;
    const ROUNDS: u64 = 512;
    let mut bench = Bench::new();
    let warm = bench.wrs(0..WARMUP);
    let (frames, wcs) = bench.run(warm);
    assert_eq!(wcs, WARMUP * WC_PER_ROUND);
    assert!(frames > 0);

    let measured = bench.wrs(WARMUP..WARMUP + ROUNDS);
    let region = Region::new(GLOBAL);
    let (frames, wcs) = bench.run(measured);
    let stats = region.change();

    assert_eq!(wcs, ROUNDS * WC_PER_ROUND, "every WR completed");
    // Per direction and round: WRITE 4 packets, SEND 2, READ request 1 and 4 responses,
    // plus the ACKs: at least one, as the WRITE's and the SEND's arrive in one batch and
    // are coalesced (`DeviceConfig::coalesce_acks`).
    assert!(
        frames >= ROUNDS * 2 * (4 + 2 + 1 + 4 + 1),
        "{frames} frames for {ROUNDS} rounds"
    );
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "{} allocations and {} reallocations ({} bytes) over {frames} frames",
        stats.allocations,
        stats.reallocations,
        stats.bytes_allocated
    );
    // The data went where it was sent: A's bytes (0xa5) in the targets of A's WRITEs and SENDs
    // and of B's READs (all in B's region), and B's bytes (0x5a) in A's region likewise.
    let span = |d: &Device, lkey, off: u64, len: u64| -> Vec<u8> {
        let off = usize::try_from(off).unwrap();
        d.mrs().bytes(lkey).unwrap()[off..off + usize::try_from(len).unwrap()].to_vec()
    };
    for (dst, dst_lkey, fill) in [
        (&bench.pair.b, bench.b.mr.0, 0xa5),
        (&bench.pair.a, bench.a.mr.0, 0x5a),
    ] {
        assert!(
            span(dst, dst_lkey, 0x8_0000, 16 * MSG)
                .iter()
                .all(|&x| x == fill)
        );
        assert!(
            span(dst, dst_lkey, 0x6_0000, SEND_MSG)
                .iter()
                .all(|&x| x == fill)
        );
        assert!(
            span(dst, dst_lkey, 0xc_0000, 16 * MSG)
                .iter()
                .all(|&x| x == fill)
        );
    }
}
