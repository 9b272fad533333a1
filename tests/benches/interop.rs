//! `cargo xtask bench interop`: ib_write_bw from a Linux Soft-RoCE VM to roce-xdp, against
//! ib_write_bw between that VM and a second Soft-RoCE VM booted beside it on the same bridge
//! (`Peer::boot_beside`, once roce-xdp's runs are done), in the same run. Needs root, the
//! rxe-peer image (`$RXE_PEER_DIR/rootfs.img`, see docs/interop.md) and the release `roce`
//! binary (xtask builds it; or set ROCE_BIN). xtask runs it only when the peer is available.
//!
//! Both figures are perftest's own (the client's `BW average`), 64 KiB messages at path MTU
//! 1024, 1 QP; each is the median of REPS runs, with min and max. Under TCG the guest's CPU
//! bounds both, so the ratio says whether roce-xdp is the bottleneck.

use std::time::Duration;

use roce_tests::{
    require_root,
    rxe::{self, Peer, PeerOptions, Roce, StepOut, wait_host_listen},
};
use serde_json::json;

const REPS: usize = 3;
const SIZE: u32 = 65536;
const ITERS: u32 = 500;

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    require_root();
    // The endpoint under test: xtask points ROCE_BIN at the release build.
    let _ = roce_tests::roce_bin();
    let peer = Peer::boot(&roce_tests::tag("bi"), 66, &PeerOptions::default());
    // The guest's ib_write_bw, the same for both measurements (a client adds the server).
    let tool = |port: u16| rxe::perftest_cmd("ib_write_bw", port, &format!("-s {SIZE} -n {ITERS}"));
    let mut ours = Vec::new();
    for rep in 0..REPS {
        let port = 19600 + rep as u16;
        let server = Roce::spawn(
            &peer.netns,
            &[
                "perf",
                "write",
                "-d",
                &peer.ifname,
                "-p",
                &port.to_string(),
                "-s",
                &SIZE.to_string(),
                "-n",
                &ITERS.to_string(),
                "-m",
                "1024",
                "--no-verify",
            ]
            .map(String::from),
        );
        wait_host_listen(&peer.netns, port, Duration::from_secs(30));
        let g = peer
            .spawn(&format!("{} {}", tool(port), peer.host_ip))
            .wait_timeout(Duration::from_secs(120))
            .unwrap_or(StepOut {
                rc: -1,
                out: "(timeout)".into(),
            });
        let s = server.wait(Duration::from_secs(30));
        let bw = rxe::perftest_bw_line(&g.out).map(|x| x.3);
        assert!(
            g.rc == 0 && s.is_ok() && bw.is_some(),
            "ib_write_bw rxe -> roce failed (rc {}): {}\nroce: {s:?}",
            g.rc,
            g.out
        );
        ours.extend(bw);
    }
    let second = Peer::boot_beside(&peer, &PeerOptions::default());
    let mut theirs = Vec::new();
    for rep in 0..REPS {
        let port = 19650 + rep as u16;
        let out = rxe::rxe_pair(&second, &peer, &tool(port), port, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("rxe ↔ rxe reference: {e}"));
        let bw = rxe::perftest_bw_line(&out.out).map(|x| x.3);
        theirs.push(bw.unwrap_or_else(|| panic!("rxe ↔ rxe: no result line: {}", out.out)));
    }
    drop(second);
    drop(peer);
    let ((om, omin, omax), (tm, _, _)) = (stats(ours), stats(theirs.clone()));
    let ratio = om / tm.max(1e-9);
    let (tmin, tmax) = (
        theirs.iter().copied().fold(f64::INFINITY, f64::min),
        theirs.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "| ib_write_bw {SIZE} B, rxe VM -> roce-xdp vs rxe VM -> rxe VM, MB/s | {om:.2} ({omin:.2}..{omax:.2}) | {tm:.2} ({tmin:.2}..{tmax:.2}) | {ratio:.2}x | ≥ 1.0x{} |",
        if ratio >= 1.0 { " (met)" } else { " (NOT met)" }
    );
    println!("(median of {REPS}; path MTU 1024, 1 QP, {ITERS} iterations, perftest's BW average)");
    let rows = vec![json!({
        "name": format!("ib_write_bw {SIZE} B rxe VM -> roce-xdp (baseline: rxe VM -> rxe VM)"),
        "value": om, "unit": "MB/s", "baseline": tm, "ratio": ratio, "target": "≥ 1.0x",
        "min": omin, "max": omax, "baseline_min": tmin, "baseline_max": tmax,
    })];
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        std::fs::write(
            std::path::Path::new(&dir).join("interop.json"),
            serde_json::to_string_pretty(&rows).unwrap(),
        )
        .unwrap();
    }
}
