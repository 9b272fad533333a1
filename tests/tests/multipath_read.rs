//! Issue 19, READ responses placed out of order (docs/multipath.md, "Placement out of
//! order"): two `roce perf read --multipath` peers on the four-path ECMP topology
//! (`roce_tests::ecmp`), the reader behind the second router so that its READ responses go
//! the way the first router spreads over the four paths. The responder sends every READ
//! response with its placement trailer and sprays them over its entropies; with one path
//! dropping 2 % (`roce impair` on its egress) the requester places what overtook a lost
//! packet, asks again only for what is missing, and checks every byte it read (`--span`);
//! the responder retires the entropies of what was asked again, so the lossy path keeps a
//! small share of the responses.
//! Captured by tcpdump on a clean path: every READ response there carries the trailer bit and
//! parses with its trailer. Root.

use std::{path::Path, time::Duration};

use roce::wire::multipath::{MpBthFlags, PlacementFlags, placement};
use roce_tests::{
    Loaded,
    ecmp::{Ecmp, PairRun},
    require_root, roce_bin,
    rxe::Capture,
    tag,
};
use serde_json::Value;

/// Bytes the run reads, 64 KiB at a time.
const BYTES: u64 = 16 << 20;

/// The READ response frames of a capture: for each, its BTH `resv7` and, when it has the
/// trailer bit, whether its placement trailer parses and says READ response.
fn read_responses(pcap: &Path) -> Vec<(u8, bool)> {
    let mut out = Vec::new();
    roce_tests::pcap::for_each_roce_frame(pcap, |f| {
        let is_resp = f
            .roce
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.operation == roce_common::opcode::Operation::ReadResponse);
        if is_resp {
            let t = placement::split(f.payload)
                .is_ok_and(|(_, t)| t.flags == PlacementFlags::READ_RESPONSE);
            out.push((f.roce.bth.resv7, t));
        }
    });
    out
}

/// The transport counters `roce stats` reports for `end`'s interface.
fn stats(netns: &str, ifname: &str) -> Value {
    let o = std::process::Command::new(roce_bin())
        .args(["--netns", netns, "stats", "-j", "-i", ifname])
        .output()
        .expect("roce stats");
    let v: Value = serde_json::from_slice(&o.stdout).expect("stats JSON");
    v["transport"].clone()
}

fn moved(after: &Value, before: &Value) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in after.as_object().expect("transport counters") {
        let d = v.as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
        m.insert(k.clone(), d.into());
    }
    Value::Object(m)
}

/// What one verified READ run did.
struct ReadRun {
    /// Packets each path carried from the first router (READ responses, mostly).
    per_path: Vec<u64>,
    /// The reader's (requester's) and the responder's transport counters, moved.
    reader: Value,
    responder: Value,
    /// READ response frames tcpdump saw on path `captured` (`resv7`, trailer parses).
    frames: Vec<(u8, bool)>,
    /// tshark's dissection of that capture.
    dissected: roce_tests::rxe::Dissection,
    mb_s: f64,
}

/// One `roce perf read LINE` run with every byte checked: the perf server (the responder) on
/// the topology's client end, the reader on its server end, so READ responses go first
/// router → paths → second router; tcpdump on the first router's path `capture`.
fn read_run(net: &Ecmp, extra: &str, capture: usize) -> ReadRun {
    let line = format!(
        "perf read -s 65536 -n {} --span {BYTES} -t 8 -m 2048 {extra}",
        BYTES / 65536
    );
    let pcap = std::env::temp_dir().join(format!("{}-read.pcap", tag("mpr")));
    let before = (
        net.tx_packets(),
        stats(&net.server.netns, &net.server.ifname),
        stats(&net.client.netns, &net.client.ifname),
    );
    let cap = Capture::start(&net.r1, &net.paths[capture], &pcap);
    // The reader (perf's client) behind the first router's four-way route for its READ
    // responses: it runs on the server's end, the responder on the client's.
    let (c, s) = net.roce_pair(&PairRun {
        reversed: true,
        limit: Duration::from_secs(120),
        ..PairRun::new(&line, &line)
    });
    let captured = cap.stop();
    let frames = read_responses(&captured.path);
    let dissected = roce_tests::rxe::dissect(&captured.path);
    let _ = std::fs::remove_file(&captured.path);
    assert_eq!(c["verified"], true, "the reader checked every byte: {c}");
    assert_eq!(s["verified"], true, "{s}");
    let per_path = net
        .tx_packets()
        .iter()
        .zip(&before.0)
        .map(|(a, b)| a - b)
        .collect();
    ReadRun {
        per_path,
        reader: moved(&stats(&net.server.netns, &net.server.ifname), &before.1),
        responder: moved(&stats(&net.client.netns, &net.client.ifname), &before.2),
        frames,
        dissected,
        mb_s: c["bw_mb_per_sec"].as_f64().unwrap_or(0.0),
    }
}

/// Response packets the responder sent beyond the `BYTES / 2048` a run needs.
fn resent(r: &ReadRun) -> u64 {
    r.responder["sent_pkts"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(BYTES / 2048)
}

fn log(what: &str, r: &ReadRun) {
    eprintln!(
        "{what}: {:.1} MB/s, per path {:?}, {} response packets resent, reader ooo_placed {} \
         implied_nak_seq_err {} local_ack_timeout_err {}, {} READ responses captured",
        r.mb_s,
        r.per_path,
        resent(r),
        r.reader["ooo_placed"],
        r.reader["implied_nak_seq_err"],
        r.reader["local_ack_timeout_err"],
        r.frames.len()
    );
}

#[test]
fn read_responses_are_sprayed_with_trailers_and_placed_out_of_order() {
    require_root();
    let net = Ecmp::new(&tag("mpr"), 216, 4, 3000);
    let _loaded = Loaded::on(&[&net.client, &net.server]);
    let pkts = BYTES / 2048;

    // Plain RoCE v2, clean: one UDP source port, so one path carries the responses.
    let plain = read_run(&net, "", 0);
    log("plain, clean", &plain);
    let (path, _) = plain
        .per_path
        .iter()
        .enumerate()
        .max_by_key(|p| p.1)
        .expect("four paths");

    // That path drops 2 %: the plain reader goes back to the first missing response of a
    // READ and the responder sends the rest of it again.
    let _impaired = net.impair(path, "--drop 0.02");
    let clean = (path + 1) % 4;
    let gbn = read_run(&net, "", path);
    log("plain, 2 % loss", &gbn);
    assert!(!gbn.frames.is_empty(), "the plain READ responses captured");
    assert!(
        gbn.frames.iter().all(|&(r, _)| r == 0),
        "plain READ responses: resv7 0"
    );

    // Both peers with the extension: responses sprayed over 32 entropies, each with its
    // trailer, placed out of order, only the missing ones asked for again.
    let mp = read_run(&net, "--multipath --entropies 32", clean);
    log("multipath, 2 % loss", &mp);
    // Every path carries responses, none nearly all of them; the responder retires the
    // entropies of the responses asked for again, so the lossy path keeps a small share
    // (some, but how few depends on how soon its entropies were retired: a CI run saw 1.8 %).
    let total: u64 = mp.per_path.iter().sum();
    for (i, &n) in mp.per_path.iter().enumerate() {
        if i == path {
            assert!(
                n > 0,
                "the lossy path {i} carried nothing: {:?}",
                mp.per_path
            );
        } else {
            assert!(n * 40 >= total, "clean path {i} carried {n} of {total}");
        }
        assert!(
            n * 10 <= total * 6,
            "path {i} carried most: {:?}",
            mp.per_path
        );
    }
    let share = mp.per_path[path] as f64 / total as f64;
    eprintln!(
        "lossy path share {:.1} %, responder entropy_retired {}",
        100.0 * share,
        mp.responder["entropy_retired"]
    );
    assert!(mp.responder["entropy_retired"].as_u64().unwrap_or(0) > 0);
    assert!(share < 0.2, "the lossy path kept {:.1} %", 100.0 * share);
    // Every READ response on a clean path carries its trailer, which parses.
    assert!(
        mp.frames.len() as u64 * 20 >= pkts,
        "{} captured",
        mp.frames.len()
    );
    let trailer = MpBthFlags::TRAILER.bits();
    assert!(
        mp.frames.iter().all(|&(r, t)| r & trailer != 0 && t),
        "every READ response with its trailer"
    );
    // tshark dissects them as plain RoCE v2 (the trailer is payload to it).
    assert!(
        mp.dissected.roce >= mp.frames.len() as u64,
        "{:?}",
        mp.dissected.opcodes
    );
    assert!(
        mp.dissected.problems.is_empty(),
        "tshark found problems: {:?}",
        mp.dissected.problems
    );
    assert!(
        mp.reader["ooo_placed"].as_u64().unwrap_or(0) > 0,
        "{}",
        mp.reader
    );
    assert!(
        resent(&mp) < resent(&gbn),
        "resent responses: {} placed against {} go-back-N",
        resent(&mp),
        resent(&gbn)
    );
}
