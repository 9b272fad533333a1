//! AF_XDP benchmark (`cargo bench -p roce-tests --bench xsk`, as root, real eBPF object).
//!
//! Everything runs between two namespaces joined by a veth pair, in one run, so each ratio
//! compares two paths against the same sender or receiver:
//! - `rx_engine_drop` vs `rx_udp_recvmmsg`: the AF_XDP generator in B floods A flat out; A
//!   receives and drops with the engine (roce_xdp redirecting to its socket), or with a kernel
//!   UDP socket and recvmmsg(64) (no XDP program on A). Received packets per second.
//! - `tx_gen` vs `tx_udp_sendmmsg`: B sends flat out with `roce gen`'s engine (AF_XDP TX) or
//!   with sendmmsg(64) on a connected UDP socket, the same RoCE frame; A's roce_xdp drops
//!   every frame (`--drop-foreign`, no QP). Sent packets per second.
//! - `echo_l2fwd`: windowed echo through the engine in A, verified by B. Round trips per second.
//!
//! Each is the median of `REPS` runs of `RUN` with min and max. Set `ROCE_BENCH_OUT` to also
//! write `$ROCE_BENCH_OUT/xsk.json`.

#[path = "../tests/xsk_support/mod.rs"]
mod xsk_support;

use std::{
    io::IoSlice,
    io::IoSliceMut,
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use nix::sys::socket::{
    MsgFlags, MultiHeaders, SockaddrIn, recvmmsg, sendmmsg, setsockopt, sockopt,
};
use roce::{
    engine::{
        EchoHandler, Engine, EngineConfig, GenConfig, Handler, Rate, RoceTemplate, RxVerdict,
        TxSink, run_gen,
    },
    xsk::{XskConfig, XskQueue},
};
use roce_common::ROCE_V2_UDP_PORT;
use xsk_support::*;

const REPS: usize = 5;
const RUN: Duration = Duration::from_secs(1);
/// Frame size on the wire (RoCE SEND_ONLY with a 4-byte payload: 62 bytes).
const SIZE: usize = 64;
const BATCH: usize = 64;
/// Echo frames carry the sequence number in their payload: 126 bytes on the wire.
const ECHO_SIZE: usize = 128;

/// Receive-and-drop handler counting into a shared counter.
struct DropCounter(Arc<AtomicU64>);

impl Handler for DropCounter {
    fn on_rx(
        &mut self,
        _now: roce::time::Instant,
        _frame: &mut [u8],
        _tx: &mut TxSink<'_>,
    ) -> RxVerdict {
        self.0.fetch_add(1, Ordering::Relaxed);
        RxVerdict::Recycle
    }
}

fn gen_cfg(pair: &Pair) -> GenConfig {
    let mut g = pair.b_to_a(SIZE);
    g.rate = Rate::FlatOut;
    g.duration = Some(RUN);
    g
}

/// Runs the AF_XDP generator in B for `RUN`; returns (completed frames, elapsed).
fn gen_in_b(pair: &Pair, icrc: bool) -> (u64, Duration) {
    let mut cfg = gen_cfg(pair);
    cfg.icrc = icrc;
    let r = pair
        .in_b(move || {
            run_gen(
                &cfg,
                &XskConfig::default(),
                &Arc::new(AtomicBool::new(false)),
            )
            .expect("generator")
        })
        .join()
        .expect("generator thread");
    (r.completed, r.elapsed)
}

/// Starts a receiver in A that counts into the returned counter until the flag is set.
fn receiver_in_a<F>(
    pair: &Pair,
    body: F,
) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<()>)
where
    F: FnOnce(Arc<AtomicBool>, Arc<AtomicU64>, mpsc::Sender<()>) + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let (s, c) = (Arc::clone(&stop), Arc::clone(&count));
    let t = pair.in_a(move || body(s, c, tx));
    rx.recv_timeout(Duration::from_secs(20))
        .expect("receiver did not come up");
    (stop, count, t)
}

/// Floods A for `RUN`; returns (received pps, offered pps).
fn measure_rx(pair: &Pair, count: &AtomicU64) -> (f64, f64) {
    let c0 = count.load(Ordering::Relaxed);
    let (sent, elapsed) = gen_in_b(pair, false);
    std::thread::sleep(Duration::from_millis(50));
    let n = count.load(Ordering::Relaxed) - c0;
    let secs = elapsed.as_secs_f64();
    (n as f64 / secs, sent as f64 / secs)
}

fn rx_engine(pair: &Pair) -> (f64, f64) {
    let a_if = pair.a().ifname.clone();
    let (stop, count, t) = receiver_in_a(pair, move |stop, count, ready| {
        let mut prog = XdpProg::attach(&a_if, &[QPN]);
        let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
        prog.set_xsk(&q);
        ready.send(()).expect("ready");
        Engine::new(q, DropCounter(count), EngineConfig::default())
            .run(&stop)
            .expect("engine");
    });
    let pps = measure_rx(pair, &count);
    stop.store(true, Ordering::Relaxed);
    t.join().expect("engine thread");
    pps
}

fn rx_udp(pair: &Pair) -> (f64, f64) {
    let a_ip = pair.a().ipv4;
    let (stop, count, t) = receiver_in_a(pair, move |stop, count, ready| {
        let sock = UdpSocket::bind(SocketAddrV4::new(a_ip, ROCE_V2_UDP_PORT)).expect("bind UDP");
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let _ = setsockopt(&sock, sockopt::RcvBuf, &(8 << 20));
        ready.send(()).expect("ready");
        let mut bufs = vec![[0u8; 2048]; BATCH];
        let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BATCH, None);
        while !stop.load(Ordering::Relaxed) {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
                bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
            if let Ok(r) = recvmmsg(
                sock.as_raw_fd(),
                &mut headers,
                iovs.iter_mut(),
                MsgFlags::MSG_WAITFORONE,
                None,
            ) {
                count.fetch_add(r.count() as u64, Ordering::Relaxed);
            }
        }
    });
    let pps = measure_rx(pair, &count);
    stop.store(true, Ordering::Relaxed);
    t.join().expect("UDP thread");
    pps
}

/// A's roce_xdp dropping every RoCE frame (no QP registered, drop-foreign), until stopped.
fn drop_all_in_a(pair: &Pair) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let a_if = pair.a().ifname.clone();
    let (stop, _count, t) = receiver_in_a(pair, move |stop, _count, ready| {
        let _prog = XdpProg::attach_with(&a_if, &[], true);
        ready.send(()).expect("ready");
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    (stop, t)
}

fn tx_gen(pair: &Pair) -> f64 {
    let (n, elapsed) = gen_in_b(pair, true);
    n as f64 / elapsed.as_secs_f64()
}

fn tx_sendmmsg(pair: &Pair) -> f64 {
    let tmpl = RoceTemplate::new(&gen_cfg(pair));
    let (a_ip, b_ip) = (pair.a().ipv4, pair.b().ipv4);
    let mut frame = vec![0u8; tmpl.len()];
    tmpl.write(&mut frame, 0);
    // The UDP payload: BTH, payload, ICRC (the kernel adds Ethernet, IPv4 and UDP).
    let payload = frame[14 + 20 + 8..].to_vec();
    pair.in_b(move || {
        let sock = UdpSocket::bind(SocketAddrV4::new(b_ip, 0xc000)).expect("bind");
        sock.connect(SocketAddrV4::new(a_ip, ROCE_V2_UDP_PORT))
            .expect("connect");
        let _ = setsockopt(&sock, sockopt::SndBuf, &(8 << 20));
        let iovs: Vec<[IoSlice<'_>; 1]> = (0..BATCH).map(|_| [IoSlice::new(&payload)]).collect();
        let addrs = vec![None::<SockaddrIn>; BATCH];
        let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BATCH, None);
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < RUN {
            if let Ok(r) = sendmmsg(
                sock.as_raw_fd(),
                &mut headers,
                iovs.iter(),
                &addrs,
                [],
                MsgFlags::empty(),
            ) {
                sent += r.count() as u64;
            }
        }
        sent as f64 / start.elapsed().as_secs_f64()
    })
    .join()
    .expect("sendmmsg thread")
}

fn echo(pair: &Pair) -> f64 {
    const FRAMES: u64 = 300_000;
    let (a_if, b_if) = (pair.a().ifname.clone(), pair.b().ifname.clone());
    let gen_cfg = pair.b_to_a(ECHO_SIZE);
    let (stop, _count, t) = receiver_in_a(pair, move |stop, _count, ready| {
        let mut prog = XdpProg::attach(&a_if, &[QPN]);
        let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
        prog.set_xsk(&q);
        ready.send(()).expect("ready");
        Engine::new(q, EchoHandler::default(), EngineConfig::default())
            .run(&stop)
            .expect("engine");
    });
    let (ok, elapsed) = pair
        .in_b(move || {
            let mut prog = XdpProg::attach(&b_if, &[QPN]);
            let q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B");
            prog.set_xsk(&q);
            let tmpl = RoceTemplate::new(&gen_cfg);
            let mut e = Engine::new(
                q,
                WindowSender::new(tmpl, 0, FRAMES, Some(128)),
                EngineConfig::default(),
            );
            let r = e.run(&AtomicBool::new(false)).expect("sender");
            let t = e.handler().tally;
            assert_eq!(t.corrupt + t.duplicate + t.foreign, 0, "{t:?}");
            (t.ok, r.elapsed)
        })
        .join()
        .expect("echo sender");
    stop.store(true, Ordering::Relaxed);
    t.join().expect("echo engine");
    ok as f64 / elapsed.as_secs_f64()
}

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    let pair = Pair::new(1);

    let (mut rx_e, mut rx_u, mut tx_g, mut tx_m, mut ech) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut off_e, mut off_u) = (vec![], vec![]);
    for _ in 0..REPS {
        let (got, offered) = rx_engine(&pair);
        rx_e.push(got);
        off_e.push(offered);
        let (got, offered) = rx_udp(&pair);
        rx_u.push(got);
        off_u.push(offered);
    }
    let (stop, t) = drop_all_in_a(&pair);
    for _ in 0..REPS {
        tx_g.push(tx_gen(&pair));
        tx_m.push(tx_sendmmsg(&pair));
    }
    stop.store(true, Ordering::Relaxed);
    t.join().expect("drop thread");
    for _ in 0..REPS {
        ech.push(echo(&pair));
    }

    let (rx_e, rx_u, tx_g, tx_m, ech) = (stat(rx_e), stat(rx_u), stat(tx_g), stat(tx_m), stat(ech));
    let rows = [
        ("rx_engine_drop", &rx_e, Some(&rx_u), Some(1.0)),
        ("rx_udp_recvmmsg", &rx_u, None, None),
        ("tx_gen", &tx_g, Some(&tx_m), Some(1.3)),
        ("tx_udp_sendmmsg", &tx_m, None, None),
        ("echo_l2fwd", &ech, None, None),
    ];
    println!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7}",
        "name", "pps", "min", "max", "baseline", "ratio", "target"
    );
    let mut json = Vec::new();
    for (name, s, base, target) in rows {
        let baseline = base.map(|b| b.median);
        let ratio = baseline.map(|b| s.median / b);
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_owned(), |v| format!("{v:.p$}"));
        println!(
            "{name:<18} {:>12.0} {:>12.0} {:>12.0} {:>12} {:>7} {:>7}",
            s.median,
            s.min,
            s.max,
            opt(baseline, 0),
            opt(ratio, 2),
            opt(target, 1)
        );
        json.push(serde_json::json!({
            "name": name,
            "value": s.median,
            "unit": "pps",
            "baseline": baseline,
            "ratio": ratio,
            "target": target,
            "min": s.min,
            "max": s.max,
        }));
    }
    let (off_e, off_u) = (stat(off_e), stat(off_u));
    println!(
        "offered by the AF_XDP generator during the rx runs (median pps): {:.0} to the engine, \
         {:.0} to the UDP socket",
        off_e.median, off_u.median
    );
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        let path = std::path::Path::new(&dir).join("xsk.json");
        std::fs::create_dir_all(&dir).expect("create ROCE_BENCH_OUT");
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    }
}
