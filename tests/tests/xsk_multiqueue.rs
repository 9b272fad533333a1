//! Multi-queue: a veth with several RX/TX queues per end gets one socket and one engine per
//! queue. Sender sockets in B are bound to B's TX queues 0..N; veth hands a frame sent on TX
//! queue q to the peer's RX queue q, so A's engine q must receive exactly sender q's traffic on
//! its own socket (and its echoes return to B's queue q). Needs root and the real eBPF object.

mod xsk_support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use roce::{
    engine::{EchoHandler, EngineConfig, RoceTemplate, spawn_engines},
    loader::Pins,
    xsk::{XskConfig, XskQueue, rx_queue_count},
};
use xsk_support::*;

const QUEUES: u32 = 2;
const PER_QUEUE: u64 = 100_000;
const SEQ_SPACE: u64 = 1 << 40;

#[test]
fn each_queue_has_its_own_socket_and_engine() {
    let pair = Pair::new(QUEUES);
    let (a_if, b_if) = (pair.a().ifname.clone(), pair.b().ifname.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let a_stop = Arc::clone(&stop);
    let a = pair.in_a(move || {
        let prog = XdpProg::attach(&a_if, &[QPN]);
        // One socket per RX queue the interface has.
        assert_eq!(rx_queue_count(&a_if).expect("queue count"), QUEUES);
        let queues = XskQueue::open_all(&a_if, &XskConfig::default()).expect("open A queues");
        let pins = Pins::new(&a_if);
        for q in &queues {
            q.register(&pins).expect("register in ROCE_XSKS");
        }
        let fds: Vec<i32> = queues.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        let threads = spawn_engines(
            queues,
            |_| EchoHandler::default(),
            EngineConfig::default(),
            &a_stop,
        )
        .expect("spawn");
        ready_tx.send(fds).expect("ready");
        let out: Vec<_> = threads
            .into_iter()
            .map(|t| {
                let (r, e) = t.join().expect("engine thread").expect("engine");
                (r, *e.handler())
            })
            .collect();
        (out, prog.stats())
    });
    let fds = ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("engines A did not come up");
    assert_eq!(fds.len(), QUEUES as usize);
    assert!(fds[0] != fds[1], "one socket per queue");

    let gen_cfg = pair.b_to_a(128);
    let b = pair.in_b(move || {
        let mut prog = XdpProg::attach(&b_if, &[QPN]);
        let mut queues = Vec::new();
        for q in 0..QUEUES {
            let q = XskQueue::open(&b_if, q, &XskConfig::default()).expect("open B queue");
            prog.set_xsk(&q);
            queues.push(q);
        }
        let never = Arc::new(AtomicBool::new(false));
        let threads = spawn_engines(
            queues,
            |q| {
                // Each queue its own flow (source port) and sequence space.
                let mut g = gen_cfg.clone();
                g.src_port = 0xc000 + q as u16;
                let tmpl = RoceTemplate::new(&g);
                WindowSender::new(tmpl, u64::from(q) * SEQ_SPACE, PER_QUEUE, Some(128))
            },
            EngineConfig::default(),
            &never,
        )
        .expect("spawn");
        threads
            .into_iter()
            .map(|t| {
                let (r, e) = t.join().expect("sender thread").expect("sender");
                (r, e.handler().tally)
            })
            .collect::<Vec<_>>()
    });
    let b_res = b.join();
    stop.store(true, Ordering::Relaxed);
    let (a_out, a_xdp) = a.join().expect("A thread");
    let b_out = b_res.expect("B thread");

    for ((ra, echo), (rb, tally)) in a_out.iter().zip(&b_out) {
        println!(
            "queue {}: A echoed {} (rx {}), B got back {:?} in {:.2?}",
            ra.queue_id, echo.echoed, ra.stats.rx_packets, tally, rb.elapsed
        );
    }
    println!("A xdp: {a_xdp:?}");
    for ((ra, echo), (rb, tally)) in a_out.iter().zip(&b_out) {
        assert_eq!(ra.queue_id, rb.queue_id);
        // Queue q of A received exactly sender q's frames, on its own socket.
        assert_eq!(ra.stats.rx_packets, PER_QUEUE, "queue {}", ra.queue_id);
        assert_eq!(echo.echoed, PER_QUEUE, "queue {}", ra.queue_id);
        // And the echoes came back to B's socket q, intact.
        assert_eq!(tally.ok, PER_QUEUE, "queue {}: {tally:?}", rb.queue_id);
        assert_eq!(
            tally.corrupt + tally.duplicate + tally.foreign,
            0,
            "{tally:?}"
        );
        assert_eq!(ra.accounting.app + ra.accounting.kernel_tx, 0);
    }
    assert_eq!(a_xdp.redirected, u64::from(QUEUES) * PER_QUEUE);
}
