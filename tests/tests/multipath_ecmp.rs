//! Issue 19 on a real ECMP fabric: a client and a server joined by two routers with four
//! equal-cost paths (`roce_tests::ecmp`: a Linux multipath route hashing on UDP ports). One
//! `roce perf write --multipath` QP sprays its packets over its entropies, so the first
//! router spreads it over all four paths; with one path dropping 2 % (`roce impair` on its
//! egress), the entropies that land there are retired as their packets are lost and the QP
//! moves to the other three. Every byte is checked at the far end (`--span`). Root.

use std::time::Duration;

use roce_tests::{Loaded, ecmp::Ecmp, require_root, roce_bin, tag};
use serde_json::Value;

/// Bytes each run writes, 64 KiB at a time.
const BYTES: u64 = 32 << 20;

/// One verified WRITE run from the client to the server, with `extra` perf flags; returns the
/// packets each path carried and the client's transport counters moved.
fn run(net: &Ecmp, extra: &str) -> (Vec<u64>, Value) {
    let stats = || {
        let o = std::process::Command::new(roce_bin())
            .args([
                "--netns",
                &net.client.netns,
                "stats",
                "-j",
                "-i",
                &net.client.ifname,
            ])
            .output()
            .expect("roce stats");
        let v: Value = serde_json::from_slice(&o.stdout).expect("stats JSON");
        v["transport"].clone()
    };
    let line = format!(
        "perf write -s 65536 -n {} --span {BYTES} -t 8 -m 2048 {extra}",
        BYTES / 65536
    );
    let before = (net.tx_packets(), stats());
    let c = net.verified_perf(&line, Duration::from_secs(120));
    let after = (net.tx_packets(), stats());
    let per_path = after.0.iter().zip(&before.0).map(|(a, b)| a - b).collect();
    let mut moved = serde_json::Map::new();
    for (k, v) in after.1.as_object().expect("transport counters") {
        let d = v.as_u64().unwrap_or(0) - before.1[k].as_u64().unwrap_or(0);
        moved.insert(k.clone(), d.into());
    }
    eprintln!(
        "{extra}: {:.1} MB/s, per path {per_path:?}",
        c["bw_mb_per_sec"].as_f64().unwrap_or(0.0)
    );
    (per_path, Value::Object(moved))
}

#[test]
fn one_qp_sprays_over_four_ecmp_paths_and_moves_off_a_lossy_one() {
    require_root();
    let net = Ecmp::new(&tag("mpe"), 45, 4, 3000);
    // Loaded for the whole test, so the counters of both runs stay in the pins.
    let _loaded = Loaded::on(&[&net.client, &net.server]);

    // Plain RoCE v2: one UDP source port, one path.
    let (plain, _) = run(&net, "");
    let total: u64 = plain.iter().sum();
    assert!(
        plain.iter().any(|&n| n * 10 >= total * 9),
        "one path carries the plain QP: {plain:?}"
    );

    // Sprayed over 32 entropies (8 random ones leave one of four paths unused about 40 % of
    // the time; with 32, the chance is 4 in 100,000): every path carries traffic, at least
    // the share of one entropy, and none most of it.
    let (sprayed, c) = run(&net, "--multipath --entropies 32");
    let total: u64 = sprayed.iter().sum();
    for (i, &n) in sprayed.iter().enumerate() {
        assert!(
            n * 40 >= total,
            "path {i} carried {n} of {total}: {sprayed:?}"
        );
        assert!(n * 2 <= total, "path {i} carried most: {sprayed:?}");
    }
    assert_eq!(c["entropy_retired"], 0, "no loss, nothing retired: {c}");

    // Path 0 drops 2 %: its entropies are retired as their packets are lost.
    let _impaired = net.impair(0, "--drop 0.02");
    let (moved, c) = run(&net, "--multipath --entropies 32");
    let total: u64 = moved.iter().sum();
    let share = moved[0] as f64 / total as f64;
    eprintln!("lossy path share {:.1} %, counters {c}", 100.0 * share);
    assert!(c["entropy_retired"].as_u64().unwrap_or(0) > 0, "{c}");
    assert!(
        share < 0.12,
        "the lossy path kept {:.1} % of the packets: {moved:?}",
        100.0 * share
    );
}
