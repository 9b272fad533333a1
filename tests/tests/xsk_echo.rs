//! Round trip without loss: a windowed sender in namespace B sends 1,000,000 RoCE-shaped
//! frames over AF_XDP to namespace A, where the engine echoes them (MAC and IP swapped) on its
//! own AF_XDP socket; B's `roce_xdp` steers the echoes back to B's socket, which checks every
//! byte. Needs root and the real eBPF object.

mod xsk_support;

use std::sync::atomic::{AtomicBool, Ordering};

use roce::{
    engine::{Engine, EngineConfig, RoceTemplate},
    loader::AttachMode,
    xsk::{BindMode, XskConfig, XskQueue},
};
use xsk_support::*;

const FRAMES: u64 = 1_000_000;
/// At most this many frames in flight: well within veth's per-queue XDP ring (VETH_RING_SIZE,
/// 256 entries, of which the consumer may hold a batch before freeing them), so a burst can
/// never overflow it and "none lost" is a real check.
const WINDOW: u64 = 128;

#[test]
fn echo_one_million_frames_byte_identical() {
    let pair = Pair::new(1);
    let b_if = pair.b().ifname.clone();
    let (a, stop) = echo_in_a(&pair, XskConfig::default(), AttachMode::Native);

    let gen_cfg = pair.b_to_a(128);
    let b = pair.in_b(move || {
        let mut prog = XdpProg::attach(&b_if, &[QPN]);
        let q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B queue 0");
        let start = q.accounting();
        prog.set_xsk(&q);
        let tmpl = RoceTemplate::new(&gen_cfg);
        let sender = WindowSender::new(tmpl, 0, FRAMES, Some(WINDOW));
        let mut e = Engine::new(q, sender, EngineConfig::default());
        let report = e.run(&AtomicBool::new(false)).expect("engine B");
        let (mut q, sender) = e.into_parts();
        q.refill();
        (report, start, q.accounting(), sender.tally, prog.stats())
    });
    let b_res = b.join();
    stop.store(true, Ordering::Relaxed);
    let EchoSide {
        report: ra,
        start: a_start,
        end: a_end,
        echo,
        xdp: a_xdp,
        bind: mode,
    } = a.join().expect("engine A thread");
    let (rb, b_start, b_end, tally, b_xdp) = b_res.expect("sender thread");

    for end in [pair.a(), pair.b()] {
        let s = roce::netns::run(
            "ip",
            &["netns", "exec", &end.netns, "ethtool", "-S", &end.ifname],
        )
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
        for line in s
            .lines()
            .filter(|l| l.contains("drop") && !l.ends_with(" 0"))
        {
            println!("{} {}", end.ifname, line.trim());
        }
    }
    let pps = tally.ok as f64 / rb.elapsed.as_secs_f64();
    println!(
        "echo: {} frames in {:.2?} ({pps:.0} pps round trip), A bound {mode}, A {:?}, B {:?}",
        tally.ok, rb.elapsed, ra.stats, rb.stats
    );
    // veth has no AF_XDP zero-copy: the Auto bind tried it and fell back to copy mode.
    assert_eq!(mode, BindMode::Copy);
    assert_eq!(tally.sent, FRAMES);
    assert_eq!(tally.corrupt, 0, "corrupted echoes: {tally:?}");
    assert_eq!(tally.duplicate, 0, "duplicated echoes: {tally:?}");
    assert_eq!(tally.foreign, 0, "unknown frames: {tally:?}");
    assert_eq!(tally.ok, FRAMES, "lost echoes: {tally:?}");
    assert_eq!(echo.echoed, FRAMES);
    assert_eq!(echo.short, 0);
    assert_eq!(ra.stats.rx_packets, FRAMES);
    assert_eq!(ra.stats.tx_packets, FRAMES);
    assert_eq!(ra.stats.tx_completed, FRAMES);
    assert_eq!(rb.stats.tx_completed, FRAMES);
    assert_eq!(ra.stats.bad_ring_addr + rb.stats.bad_ring_addr, 0);
    // Every frame roce_xdp redirected came with its arrival stamp (XDP metadata, copy mode),
    // or over its destination address where the kernel refuses the metadata helper (and the
    // address put back: the echoes above are byte-identical). The frames are unmarked SENDs,
    // whose arrival the transport does not use: their stamps carry no time
    // (`stamp::UNTIMED`, counted in `rx_untimed`).
    assert_eq!((ra.stats.rx_no_stamp, rb.stats.rx_no_stamp), (0, 0));
    assert_eq!((ra.stats.rx_untimed, rb.stats.rx_untimed), (FRAMES, FRAMES));
    assert_eq!(ra.stats.rx_invalid_descs + ra.stats.tx_invalid_descs, 0);
    assert_eq!(a_xdp.redirected, FRAMES, "A's roce_xdp: {a_xdp:?}");
    assert_eq!(b_xdp.redirected, FRAMES, "B's roce_xdp: {b_xdp:?}");
    // No frame leaked or duplicated: the UMEM accounting ends where it began.
    assert_eq!(a_end, a_start, "A's frames");
    assert_eq!(b_end, b_start, "B's frames");
    assert!(a_end.is_consistent() && b_end.is_consistent());
}
