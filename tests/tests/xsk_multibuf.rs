//! AF_XDP multi-buffer (`XDP_USE_SG`) on a 9000-byte veth, `roce_xdp` in generic (skb) mode on
//! both ends (native XDP on a veth refuses such an MTU). RoCE frames longer than a UMEM frame
//! holds on receive (4096 - 256 bytes of headroom) go from B to A split over several TX
//! descriptors, come in joined from several RX descriptors, are echoed by A the same way, and
//! B checks every echo byte for byte; every frame comes home on both sides. Without
//! multi-buffer the same frames are dropped by the kernel and counted. Needs root and the real
//! eBPF object.

mod xsk_support;

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use roce::{
    engine::{Engine, EngineConfig, RoceTemplate},
    loader::AttachMode,
    xsk::{XskConfig, XskQueue},
};
use xsk_support::*;

const MTU: u32 = 9000;
/// Frame lengths: one byte-group past a receive frame (two RX descriptors, one TX descriptor),
/// two TX descriptors, and the longest frame the link carries (three of each).
const SIZES: [usize; 3] = [3900, 6000, 9000];
const FRAMES: u64 = 3000;
const WINDOW: u64 = 64;

fn multi() -> XskConfig {
    XskConfig {
        multi_buffer: true,
        ..XskConfig::default()
    }
}

#[test]
fn multi_buffer_frames_cross_split_and_joined_byte_for_byte() {
    let pair = Pair::with_mtu(1, MTU);
    let b_if = pair.b().ifname.clone();
    let (a, stop) = echo_in_a(&pair, multi(), AttachMode::Skb);
    let gens: Vec<_> = SIZES.iter().map(|s| pair.b_to_a(*s)).collect();
    let b = pair.in_b(move || {
        let mut prog = XdpProg::attach_mode(&b_if, &[QPN], AttachMode::Skb);
        let mut q = XskQueue::open(&b_if, 0, &multi()).expect("open B queue 0");
        let start = q.accounting();
        prog.set_xsk(&q);
        let mut out = Vec::new();
        for (k, g) in gens.iter().enumerate() {
            let tmpl = RoceTemplate::new(g);
            let len = tmpl.len();
            let sender = WindowSender::new(tmpl, k as u64 * FRAMES, FRAMES, Some(WINDOW));
            let mut e = Engine::new(q, sender, EngineConfig::default());
            let report = e.run(&AtomicBool::new(false)).expect("engine B");
            let (back, sender) = e.into_parts();
            q = back;
            out.push((len, sender.tally, report.stats));
        }
        q.refill();
        (out, start, q.accounting(), q.stats())
    });
    let b_res = b.join();
    stop.store(true, Ordering::Relaxed);
    let EchoSide {
        report: ra,
        start: a_start,
        end: a_end,
        echo,
        ..
    } = a.join().expect("engine A thread");
    let (runs, b_start, b_end, b_stats) = b_res.expect("sender thread");

    let total = FRAMES * SIZES.len() as u64;
    println!("A {:?}\nB {b_stats:?}", ra.stats);
    for (len, tally, _) in &runs {
        println!("{len}-byte frames: {tally:?}");
        assert!(*len > 3840, "frame of {len} bytes fits one receive frame");
        assert_eq!(tally.sent, FRAMES, "{len}: {tally:?}");
        assert_eq!(
            (tally.corrupt, tally.duplicate, tally.foreign),
            (0, 0, 0),
            "{len}: {tally:?}"
        );
        assert_eq!(tally.ok, FRAMES, "{len}: lost echoes: {tally:?}");
    }
    assert_eq!(echo.echoed, total);
    // Every frame of every size is longer than a receive frame: joined on both sides.
    assert_eq!(ra.stats.rx_packets, total);
    assert_eq!(ra.stats.rx_multi_buffer, total);
    assert_eq!(b_stats.rx_multi_buffer, total);
    // 3900 bytes fit one TX frame (4096); 6000 and 9000 do not.
    let split = FRAMES * 2;
    assert_eq!(ra.stats.tx_multi_buffer, split);
    assert_eq!(b_stats.tx_multi_buffer, split);
    // Descriptors: 1 + 2 + 3 per frame of each size.
    assert_eq!(ra.stats.tx_packets, FRAMES * 6);
    assert_eq!(ra.stats.tx_completed, FRAMES * 6);
    assert_eq!(b_stats.tx_completed, FRAMES * 6);
    for s in [&ra.stats, &b_stats] {
        assert_eq!(s.rx_oversize + s.bad_ring_addr + s.tx_dropped, 0, "{s:?}");
        // Joined packets carry the arrival stamp of their first descriptor (in metadata, or
        // over the destination address where the kernel refuses roce_xdp the metadata helper).
        assert_eq!(s.rx_no_stamp, 0, "{s:?}");
        assert_eq!(
            s.rx_invalid_descs + s.tx_invalid_descs + s.rx_dropped,
            0,
            "{s:?}"
        );
    }
    assert_eq!(a_end, a_start, "A's frames");
    assert_eq!(b_end, b_start, "B's frames");
    assert!(a_end.is_consistent() && b_end.is_consistent());
}

/// The same long frames to a socket bound without multi-buffer: the kernel cannot put them in
/// one frame, drops each one and counts it in the socket's `rx_dropped` (XDP_STATISTICS);
/// nothing reaches the handler.
#[test]
fn without_multi_buffer_long_frames_are_counted_drops() {
    const N: u64 = 200;
    let pair = Pair::with_mtu(1, MTU);
    let b_if = pair.b().ifname.clone();
    let (a, stop) = echo_in_a(&pair, XskConfig::default(), AttachMode::Skb);
    let g = pair.b_to_a(6000);
    let b = pair.in_b(move || {
        let _prog = XdpProg::attach_mode(&b_if, &[QPN], AttachMode::Skb);
        let q = XskQueue::open(&b_if, 0, &multi()).expect("open B queue 0");
        let mut sender = WindowSender::new(RoceTemplate::new(&g), 0, N, None);
        sender.quiet = Duration::from_secs(1);
        let mut e = Engine::new(q, sender, EngineConfig::default());
        let report = e.run(&AtomicBool::new(false)).expect("engine B");
        (report, e.into_parts().1.tally)
    });
    let (rb, tally) = b.join().expect("sender thread");
    // Let A's idle turns read the socket's counters after the last frame.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let EchoSide {
        report: ra,
        xdp: a_xdp,
        ..
    } = a.join().expect("engine A thread");
    println!(
        "A {:?}\nA xdp {a_xdp:?}\nB {:?}\n{tally:?}",
        ra.stats, rb.stats
    );
    assert_eq!(tally.sent, N);
    assert_eq!(tally.ok, 0);
    assert_eq!(rb.stats.tx_completed, N * 2);
    assert_eq!(a_xdp.redirected, N, "A's roce_xdp steered them: {a_xdp:?}");
    assert_eq!(ra.stats.rx_packets, 0);
    assert_eq!(ra.stats.rx_dropped, N, "kernel drops: {:?}", ra.stats);
}
