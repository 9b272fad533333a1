//! `roce gen` end to end: the binary sends a counted, rate-limited stream from namespace B;
//! the engine in A receives every frame on its AF_XDP socket, each one a well-formed RoCE
//! SEND_ONLY to our QP with the expected sequence numbers. Needs root and the real eBPF object.

mod xsk_support;

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use roce::{
    engine::{Engine, EngineConfig, Handler, Instant, RoceTemplate, RxVerdict, TxSink},
    xsk::{XskConfig, XskQueue},
};
use xsk_support::*;

const COUNT: u64 = 20_000;
const RATE: u64 = 100_000;

/// Checks each frame against the template the generator uses.
struct Checker {
    tmpl: RoceTemplate,
    scratch: Vec<u8>,
    seen: Vec<bool>,
    ok: u64,
    bad: u64,
}

impl Handler for Checker {
    fn on_rx(&mut self, _now: Instant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        let good = RoceTemplate::seq_of(frame).is_some_and(|seq| {
            let len = self.tmpl.write(&mut self.scratch, seq);
            let fresh = self.seen.get(seq as usize).is_some_and(|s| !s);
            if fresh && frame == &self.scratch[..len] {
                self.seen[seq as usize] = true;
                true
            } else {
                false
            }
        });
        if good {
            self.ok += 1;
        } else {
            self.bad += 1;
        }
        RxVerdict::Recycle
    }
}

#[test]
fn roce_gen_sends_counted_rate_limited_roce_frames() {
    let bin = roce_tests::roce_bin();
    let pair = Pair::new(1);
    let a_if = pair.a().ifname.clone();
    let mut g = pair.b_to_a(128);
    g.flows = 1;
    let tmpl = RoceTemplate::new(&g);
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let a_stop = Arc::clone(&stop);
    let a = pair.in_a(move || {
        let mut prog = XdpProg::attach(&a_if, &[QPN]);
        let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
        prog.set_xsk(&q);
        ready_tx.send(()).expect("ready");
        let checker = Checker {
            scratch: vec![0; tmpl.len()],
            tmpl,
            seen: vec![false; COUNT as usize],
            ok: 0,
            bad: 0,
        };
        let mut e = Engine::new(q, checker, EngineConfig::default());
        e.run(&a_stop).expect("engine A");
        let (_, c) = e.into_parts();
        (c.ok, c.bad)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("engine A did not come up");

    let (b, a_end) = (pair.b(), pair.a());
    let out = Command::new(&bin)
        .args([
            "-j",
            "--netns",
            &b.netns,
            "gen",
            "-i",
            &b.ifname,
            "--dst-mac",
            &fmt_mac(a_end.mac),
            "--src-ip",
            &b.ipv4.to_string(),
            "--dst-ip",
            &a_end.ipv4.to_string(),
            "--size",
            "128",
            "--rate",
            &RATE.to_string(),
            "--count",
            &COUNT.to_string(),
        ])
        .output()
        .expect("run roce gen");
    assert!(
        out.status.success(),
        "roce gen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (ok, bad) = a.join().expect("engine A thread");

    println!("roce gen: {v}");
    assert_eq!(v["completed"], COUNT, "{v}");
    assert_eq!(v["queues"][0]["mode"], "copy", "{v}");
    let secs = v["elapsed_s"].as_f64().expect("elapsed_s");
    let expect = COUNT as f64 / RATE as f64;
    assert!(
        secs >= expect * 0.9 && secs < expect * 3.0 + 0.2,
        "rate not held: {COUNT} frames at {RATE} pps took {secs} s"
    );
    assert_eq!(bad, 0, "malformed or duplicate frames");
    assert_eq!(ok, COUNT, "frames missing at A");
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
