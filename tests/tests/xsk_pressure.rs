//! Pressure without corruption: the sender in B runs flat out against a slow echo in A whose
//! TX ring is tiny. The backpressure counters must rise (TX ring full, then the fill ring
//! running empty and the kernel dropping), no echo may be corrupted or duplicated, every frame
//! `roce_xdp` redirected must be either received or counted as dropped, no UMEM frame may leak,
//! and the same engine must then carry windowed traffic without loss. Needs root and the real
//! eBPF object.

mod xsk_support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use roce::{
    engine::{EchoHandler, Engine, EngineConfig, Handler, RoceTemplate, RxVerdict, TxSink},
    xsk::{XskConfig, XskQueue},
};
use xsk_support::*;

/// An echo that spends `spin` per frame, to be slower than the sender.
struct SlowEcho {
    echo: EchoHandler,
    spin: Duration,
}

impl Handler for SlowEcho {
    fn on_rx(
        &mut self,
        now: roce::time::Instant,
        frame: &mut [u8],
        tx: &mut TxSink<'_>,
    ) -> RxVerdict {
        let t = Instant::now();
        while t.elapsed() < self.spin {
            std::hint::spin_loop();
        }
        self.echo.on_rx(now, frame, tx)
    }
}

const FLOOD: u64 = 200_000;
const CALM: u64 = 50_000;

#[test]
fn pressure_raises_counters_without_corruption_and_recovers() {
    let pair = Pair::new(1);
    let (a_if, b_if) = (pair.a().ifname.clone(), pair.b().ifname.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let a_stop = Arc::clone(&stop);
    let a = pair.in_a(move || {
        let mut prog = XdpProg::attach(&a_if, &[QPN]);
        let cfg = XskConfig {
            frame_size: 2048,
            frame_count: 1024,
            fill_size: 256,
            comp_size: 256,
            rx_size: 256,
            tx_size: 16,
            ..XskConfig::default()
        };
        let q = XskQueue::open(&a_if, 0, &cfg).expect("open A queue 0");
        let start = q.accounting();
        prog.set_xsk(&q);
        ready_tx.send(()).expect("ready");
        let h = SlowEcho {
            echo: EchoHandler::default(),
            spin: Duration::from_micros(10),
        };
        let mut e = Engine::new(q, h, EngineConfig::default());
        let report = e.run(&a_stop).expect("engine A");
        let (mut q, h) = e.into_parts();
        q.refill();
        (report, start, q.accounting(), h.echo, prog.stats())
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("engine A did not come up");

    let gen_cfg = pair.b_to_a(256);
    let b = pair.in_b(move || {
        let mut prog = XdpProg::attach(&b_if, &[QPN]);
        let q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B queue 0");
        let start = q.accounting();
        prog.set_xsk(&q);
        let tmpl = RoceTemplate::new(&gen_cfg);
        let never = AtomicBool::new(false);

        // Flood: no window, stop one second after the last echo.
        let mut flood = WindowSender::new(tmpl.clone(), 0, FLOOD, None);
        flood.quiet = Duration::from_secs(1);
        let mut e = Engine::new(q, flood, EngineConfig::default());
        let r1 = e.run(&never).expect("flood");
        let (q, flood) = e.into_parts();

        // Calm: windowed, must be lossless on the same engine in A.
        let calm = WindowSender::new(tmpl, 10_000_000, CALM, Some(128));
        let mut e = Engine::new(q, calm, EngineConfig::default());
        let r2 = e.run(&never).expect("calm");
        let (mut q, calm) = e.into_parts();
        q.refill();
        (r1, flood.tally, r2, calm.tally, start, q.accounting())
    });
    let b_res = b.join();
    stop.store(true, Ordering::Relaxed);
    let (ra, a_start, a_end, echo, a_xdp) = a.join().expect("engine A thread");
    let (r1, flood, r2, calm, b_start, b_end) = b_res.expect("sender thread");

    println!(
        "flood: {flood:?} in {:.2?}; calm: {calm:?} in {:.2?}",
        r1.elapsed, r2.elapsed
    );
    println!("A: {:?}\nA xdp: {a_xdp:?}", ra.stats);
    let s = ra.stats;

    // The flood really was faster than A: the chain of backpressure counters moved.
    assert_eq!(flood.sent, FLOOD);
    assert!(s.tx_ring_full > 0, "A's TX ring never filled: {s:?}");
    assert!(
        s.rx_dropped > 0 && s.fill_ring_empty + s.rx_ring_full > 0,
        "A never dropped under a flood: {s:?}"
    );
    assert!(
        flood.ok < FLOOD,
        "nothing was lost, so there was no pressure: {flood:?}"
    );
    // ... and nothing was corrupted, duplicated or invented.
    for t in [flood, calm] {
        assert_eq!(t.corrupt, 0, "{t:?}");
        assert_eq!(t.duplicate, 0, "{t:?}");
        assert_eq!(t.foreign, 0, "{t:?}");
    }
    assert_eq!(
        s.bad_ring_addr + s.rx_invalid_descs + s.tx_invalid_descs,
        0,
        "{s:?}"
    );
    // Every frame roce_xdp redirected to A's socket was received or counted as dropped.
    assert_eq!(
        a_xdp.redirected,
        s.rx_packets + s.rx_dropped,
        "{a_xdp:?} {s:?}"
    );
    // Every frame A received was echoed, and every echo was sent and completed.
    assert_eq!(echo.echoed, s.rx_packets);
    assert_eq!(s.tx_packets, s.rx_packets);
    assert_eq!(s.tx_completed, s.tx_packets);
    assert_eq!(s.tx_dropped, 0);
    // Recovery: the same engine then carried windowed traffic without loss.
    assert_eq!(calm.ok, CALM, "not recovered: {calm:?}");
    // No frame leaked or duplicated on either side.
    assert_eq!(a_end, a_start, "A's frames");
    assert_eq!(b_end, b_start, "B's frames");
}
