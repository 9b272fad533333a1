//! Issue 19, the multipath hint out of band (docs/multipath.md, "Hints out of band"): two
//! `roce perf --multipath` (and two `roce pingpong --multipath`) tell each other in their
//! exchange that their QPs allow the extension, so the client's very first request already
//! carries its placement trailer; a `--multipath` client facing a server without it sends no
//! trailer at all (only the offer bit) and the server's frames stay plain RoCE v2. Through a
//! router (`roce_tests::ecmp` with one path), captured by tcpdump on the router's path
//! interface; every byte checked at the far end. Root.

use std::path::Path;

use roce::wire::multipath::MpBthFlags;
use roce_tests::{
    Loaded,
    ecmp::{Ecmp, PairRun},
    require_root,
    rxe::Capture,
    tag,
};

/// The RoCE frames of a capture, in order: for each, whether it is a request (not a response
/// or an acknowledgement) and its BTH `resv7`.
fn roce_frames(pcap: &Path) -> Vec<(bool, u8)> {
    let mut out = Vec::new();
    roce_tests::pcap::for_each_roce_frame(pcap, |f| {
        let request = !f.roce.bth.opcode.info().is_some_and(|i| i.is_response());
        out.push((request, f.roce.bth.resv7));
    });
    out
}

/// Runs `server_line` on the server's end and `client_line` on the client's (both `roce`
/// command lines without `-d` and the host), capturing the first router's path interface;
/// returns both JSON reports and the RoCE frames seen.
fn captured(
    net: &Ecmp,
    server_line: &str,
    client_line: &str,
    name: &str,
) -> (serde_json::Value, serde_json::Value, Vec<(bool, u8)>) {
    let pcap = std::env::temp_dir().join(format!("{}-{name}.pcap", tag("mph")));
    let cap = Capture::start(&net.r1, &net.paths[0], &pcap);
    let (c, s) = net.roce_pair(&PairRun::new(server_line, client_line));
    let captured = cap.stop();
    let frames = roce_frames(&captured.path);
    let _ = std::fs::remove_file(&captured.path);
    (c, s, frames)
}

const OFFER: u8 = MpBthFlags::OFFER.bits();
const TRAILER: u8 = MpBthFlags::OFFER_TRAILER.bits();

#[test]
fn hinted_peers_send_trailers_from_the_first_packet_and_a_plain_peer_gets_none() {
    require_root();
    let net = Ecmp::new(&tag("mph"), 202, 1, 3000);
    let _loaded = Loaded::on(&[&net.client, &net.server]);
    let perf = "perf write -s 65536 -n 64 --span 4194304 -t 8 -m 2048";

    // Both offer: each side's exchange carries the hint, the client's first WRITE packet
    // its trailer (one entropy, so every request takes the one path captured).
    let mp = format!("{perf} --multipath --entropies 1");
    let (c, s, frames) = captured(&net, &mp, &mp, "both");
    assert_eq!(
        (c["verified"].clone(), s["verified"].clone()),
        (true.into(), true.into())
    );
    let requests: Vec<u8> = frames.iter().filter(|f| f.0).map(|f| f.1).collect();
    assert!(requests.len() >= 2048, "{} requests", requests.len());
    assert_eq!(
        requests[0], TRAILER,
        "the first request carries its trailer"
    );
    assert!(requests.iter().all(|&r| r == TRAILER), "every request does");

    // The server does not offer: no hint either way, the client's requests carry the offer
    // bit only, the server's frames (its ACKs) nothing.
    let (c, s, frames) = captured(&net, perf, &mp, "plain-server");
    assert_eq!(
        (c["verified"].clone(), s["verified"].clone()),
        (true.into(), true.into())
    );
    let requests: Vec<u8> = frames.iter().filter(|f| f.0).map(|f| f.1).collect();
    assert!(requests.len() >= 2048, "{} requests", requests.len());
    assert!(requests.iter().all(|&r| r == OFFER), "offer bit only");
    // One path: the server's ACKs come back through the interface captured.
    let acks: Vec<u8> = frames.iter().filter(|f| !f.0).map(|f| f.1).collect();
    assert!(!acks.is_empty(), "no ACK captured");
    assert!(acks.iter().all(|&r| r == 0), "plain ACKs: {acks:?}");

    // READs in selective repeat: the hint says the peer holds READ requests (`HOLD`), so
    // the client's READ requests go marked to be held from the first one, every byte checked.
    // (Learnt in band from the first response instead, a READ stream 8 deep never went
    // quiet enough to enter the mode: CI saw no marked request at all.)
    let rd = "perf read -s 65536 -n 64 --span 4194304 -t 8 -m 2048 --multipath --entropies 1";
    let (c, s, frames) = captured(&net, rd, rd, "read");
    assert_eq!(
        (c["verified"].clone(), s["verified"].clone()),
        (true.into(), true.into())
    );
    let hold = MpBthFlags::HOLD.bits();
    let held = frames.iter().filter(|f| f.0 && f.1 & hold != 0).count();
    let first = frames.iter().find(|f| f.0).expect("a READ request");
    assert_ne!(first.1 & hold, 0, "the first READ request is held");
    assert_eq!(
        held,
        frames.iter().filter(|f| f.0).count(),
        "every READ request is held"
    );
    // Every READ response (64 READs of 32 packets) came back through the one path captured.
    let responses: Vec<u8> = frames.iter().filter(|f| !f.0).map(|f| f.1).collect();
    assert!(responses.len() >= 2048, "{} responses", responses.len());
    assert!(responses.iter().all(|&r| r & hold != 0), "the server holds");

    // roce pingpong: the hint in upper-case hex; the client's first SEND has its trailer.
    let pp = "pingpong -n 20 -s 4096 -m 2048 -c --multipath";
    let (c, s, frames) = captured(&net, pp, pp, "pingpong");
    assert_eq!(
        (c["iters"].clone(), s["iters"].clone()),
        (20.into(), 20.into())
    );
    let first = frames.iter().find(|f| f.0).expect("a request");
    assert_eq!(
        first.1, TRAILER,
        "the client's first SEND carries its trailer"
    );
}
