//! Repeatable hot-path workloads for instruction counts under callgrind (not timed, not part of
//! the `cargo xtask bench` table). Each workload runs `N` times inside a function named
//! `run_<workload>`, so callgrind can count just that function and its callees:
//!
//! ```sh
//! AYA_BUILD_SKIP=1 cargo bench -p roce-user --bench hotpath --no-run
//! valgrind --tool=callgrind --toggle-collect='hotpath::run_*' --callgrind-out-file=cg.out \
//!     target/release/deps/hotpath-<hash> icrc_in_place 100000
//! callgrind_annotate cg.out | head
//! ```
//!
//! Divide the total instruction count (`Ir`) by the packet count the run prints.
//!
//! - `crc32fast`: raw `crc32fast::hash` over the 1064 bytes an ICRC of a 1 KiB SEND covers
//!   (the baseline of the wire bench);
//! - `icrc_in_place`: `wire::icrc::compute_in_place` over the same datagram (what emit and the
//!   engine's receive path use);
//! - `icrc`: `wire::icrc::compute` (masked headers copied to the stack);
//! - `parse_in_place`: `wire::parse_frame_in_place` of the whole 1 KiB SEND frame;
//! - `transport`: two `transport::Device`s back to back moving 1 KiB RDMA WRITEs (one packet
//!   and one ACK each): post, emit with ICRC, parse with ICRC check, responder, ACK, completer,
//!   poll_cq. The count printed is frames (WRITE packets + ACKs).
//! - `qp_memory`: not a callgrind workload: creates `N` connected RC QPs, once with the default
//!   caps (256 send and 256 receive WRs of up to 4 SGEs) and once with perftest's (`ib_write_bw`:
//!   128 send and 512 receive WRs of 1 SGE), and prints the heap bytes per QP, counted by the
//!   `stats_alloc` global allocator: idle, with the send queue full and with both queues full
//!   (one SGE per WR).

use std::{alloc::System, hint::black_box, net::Ipv4Addr};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

use roce::transport::{
    Access, Device, DeviceConfig, MAX_FRAME_LEN, Mtu, SendOp, SendWr, Sge, WcStatus,
    sim::{Link, Pair, RcConfig, connect_rc},
    timer::Instant,
};
use roce::wire::{
    BthRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, Qpn, RoceRepr, emit_frame, icrc,
    parse_frame_in_place,
};

fn frame(payload_len: usize) -> Vec<u8> {
    let path = PathRepr::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
        IpPath::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        },
    );
    let roce = RoceRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11),
        Psn::new(1),
    ));
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let mut buf = vec![0u8; 9000];
    let n = emit_frame(&path, &roce, &payload, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

#[inline(never)]
fn run_crc32fast(l3: &[u8], n: u64) -> u64 {
    for _ in 0..n {
        black_box(crc32fast::hash(black_box(l3)));
    }
    n
}

#[inline(never)]
fn run_icrc_in_place(l3: &mut [u8], n: u64) -> u64 {
    for _ in 0..n {
        black_box(icrc::compute_in_place(black_box(&mut *l3)).expect("icrc"));
    }
    n
}

#[inline(never)]
fn run_icrc(l3: &[u8], n: u64) -> u64 {
    let (ip, rest) = l3.split_at(20);
    let (udp, roce) = rest.split_at(8);
    for _ in 0..n {
        black_box(icrc::compute(black_box(ip), black_box(udp), black_box(roce)).expect("icrc"));
    }
    n
}

#[inline(never)]
fn run_parse_in_place(f: &mut [u8], n: u64) -> u64 {
    for _ in 0..n {
        let p = parse_frame_in_place(black_box(&mut *f)).expect("parse");
        assert!(p.icrc_ok);
        black_box(p.payload.len());
    }
    n
}

struct Transport {
    pair: Pair,
    qpn: roce::transport::Qpn,
    cqs: [roce::transport::CqId; 2],
    lkey: roce::transport::LKey,
    rkey: roce::transport::RKey,
    buf: Vec<u8>,
    wrs: Vec<SendWr<roce::transport::Path>>,
}

fn transport(n: u64) -> Transport {
    let mut pair = Pair::new(1, DeviceConfig::default(), Link::default());
    let cfg = RcConfig {
        mtu: Mtu::Mtu1024,
        ..RcConfig::default()
    };
    let (a, b) = connect_rc(&mut pair, &cfg);
    let la = pair
        .a
        .reg_mr(a.pd, vec![7; 1 << 16], 0x1_0000, Access::all())
        .unwrap();
    let lb = pair
        .b
        .reg_mr(b.pd, vec![0; 1 << 16], 0x1_0000, Access::all())
        .unwrap();
    // Built up front: a WR's SG list is the application's allocation, not the transport's.
    let wrs = (0..n)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::Write {
                    remote_addr: 0x1_0000 + (i % 32) * 1024,
                    rkey: lb.rkey,
                },
                vec![Sge {
                    addr: 0x1_0000,
                    length: 1024,
                    lkey: la.lkey,
                }],
            )
        })
        .collect();
    Transport {
        pair,
        qpn: a.qpn,
        cqs: [a.cq, b.cq],
        lkey: la.lkey,
        rkey: lb.rkey,
        buf: vec![0; MAX_FRAME_LEN],
        wrs,
    }
}

fn pump(a: &mut Device, b: &mut Device, now: Instant, buf: &mut [u8]) -> u64 {
    let mut moved = 0;
    loop {
        let before = moved;
        while let Some(t) = a.poll_transmit(now, buf) {
            b.handle_packet(now, &buf[..t.size]);
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

#[inline(never)]
fn run_transport(t: &mut Transport) -> u64 {
    let mut frames = 0;
    let mut now = Instant::ZERO;
    let wrs = std::mem::take(&mut t.wrs);
    for wr in wrs {
        t.pair.a.post_send(t.qpn, wr).expect("post");
        now = now + core::time::Duration::from_micros(1);
        frames += pump(&mut t.pair.a, &mut t.pair.b, now, &mut t.buf);
        while let Some(wc) = t.pair.a.poll_cq(t.cqs[0]) {
            assert_eq!(wc.status, WcStatus::Success);
        }
    }
    frames
}

/// Heap bytes held now minus at `r`'s start. (`stats_alloc` adds a realloc's growth to
/// `bytes_allocated` and its shrinking to `bytes_deallocated`, and both again to
/// `bytes_reallocated`, so that one is not added: it would count a queue grown by
/// reallocation twice.)
fn held(r: &Region<'_, System>) -> i64 {
    let c = r.change();
    i64::try_from(c.bytes_allocated).unwrap() - i64::try_from(c.bytes_deallocated).unwrap()
}

/// Heap bytes per QP for `n` connected RC QPs of `caps`: idle, with the send queue full of
/// one-SGE WRs (what `ib_write_bw` keeps posted), and with both queues full.
fn qp_memory_at(n: u64, caps: roce::transport::QpCap, what: &str) {
    use roce::transport::{RecvWr, sim};
    let config = DeviceConfig {
        max_qp: usize::try_from(n).unwrap() + 1,
        ..DeviceConfig::default()
    };
    let mut pair = Pair::new(1, config, Link::default());
    let cfg = RcConfig::default();
    let (a, _) = connect_rc(&mut pair, &cfg);
    let r = Region::new(GLOBAL);
    let mut qpns = Vec::with_capacity(usize::try_from(n).unwrap());
    let before_vec = held(&r);
    for _ in 0..n {
        let qpn = pair
            .a
            .create_qp(roce::transport::QpInit {
                pd: a.pd,
                qp_type: roce::transport::QpType::Rc,
                send_cq: a.cq,
                recv_cq: a.cq,
                cap: caps,
                sq_sig_all: false,
            })
            .expect("create qp");
        sim::bring_up(
            &mut pair.a,
            qpn,
            sim::Side::A,
            roce::transport::Qpn::new(0x100),
            Psn::new(0),
            Psn::new(0),
            &cfg,
        );
        qpns.push(qpn);
    }
    let empty = held(&r) - before_vec;
    let sge = Sge {
        addr: 0x1_0000,
        length: 8,
        lkey: roce::transport::LKey::new(1),
    };
    for &q in &qpns {
        for i in 0..caps.max_send_wr {
            let wr = SendWr::send(u64::from(i), vec![sge]);
            pair.a.post_send(q, wr).expect("post send");
        }
    }
    let send_full = held(&r) - before_vec;
    for &q in &qpns {
        for i in 0..caps.max_recv_wr {
            let wr = RecvWr {
                wr_id: u64::from(i),
                sg_list: vec![sge],
            };
            pair.a.post_recv(q, wr).expect("post recv");
        }
    }
    let full = held(&r) - before_vec;
    let n = i64::try_from(n).unwrap();
    println!(
        "qp_memory ({what}: {} send, {} recv WRs of up to {} SGEs): {n} QPs; heap per QP: {} B idle, {} B with the send queue full, {} B with both queues full (one SGE per WR)",
        caps.max_send_wr,
        caps.max_recv_wr,
        caps.max_sge,
        empty / n,
        send_full / n,
        full / n,
    );
}

fn qp_memory(n: u64) {
    use roce::transport::QpCap;
    qp_memory_at(n, QpCap::default(), "default caps");
    // ib_write_bw's defaults: tx depth 128, rx depth 512, one SGE each way (perftest
    // `ctx_qp_create`: max_send_wr = tx_depth, max_recv_wr = rx_depth, MAX_SEND_SGE 1).
    let perftest = QpCap {
        max_send_wr: 128,
        max_recv_wr: 512,
        max_sge: 1,
        max_inline_data: 0,
    };
    qp_memory_at(n, perftest, "perftest's depths");
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let (Some(what), n) = (args.next(), args.next()) else {
        println!(
            "usage: hotpath crc32fast|icrc_in_place|icrc|parse_in_place|transport [N] (see the file's docs)"
        );
        return;
    };
    let n: u64 = n.map_or(100_000, |s| s.parse().expect("N"));
    let mut f = frame(1024);
    let end = f.len() - 4;
    let packets = match what.as_str() {
        "crc32fast" => run_crc32fast(&f[14..end], n),
        "icrc_in_place" => run_icrc_in_place(&mut f[14..end], n),
        "icrc" => run_icrc(&f[14..end], n),
        "parse_in_place" => run_parse_in_place(&mut f, n),
        "transport" => {
            let mut t = transport(n);
            let frames = run_transport(&mut t);
            let _ = (t.lkey, t.rkey, t.cqs[1]);
            frames
        }
        "qp_memory" => {
            qp_memory(n);
            return;
        }
        other => panic!("unknown workload {other}"),
    };
    println!("{what}: {packets} packets");
}
