//! Issue 19, the multipath hint in the CM exchange (docs/multipath.md, "Hints out of band"):
//! QPs connected through RDMA CM (`roce perf -R`, `roce pingpong -R`) hint the extension in
//! bit 0 of byte 27 of the REQ and the REP (reserved bytes Linux's CM neither sets nor reads),
//! so two `--multipath` sides start their QPs with it on and the first request packet of a
//! connection already carries its placement trailer; the control QP of `roce perf -R` too,
//! which no other exchange hints. A side without `--multipath` neither hints nor answers a
//! hint: its peer's requests carry the offer bit only and its own frames stay plain RoCE v2.
//! Through a router (`roce_tests::ecmp`, one path, subnet 218), captured by tcpdump on the
//! router's path interface, every MAD and RoCE frame read back. Root.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use roce::netns::VethEnd;
use roce::{
    ibcm::mad::{MAD_HDR_LEN, MULTIPATH_HINT_AT, MULTIPATH_HINT_BIT},
    wire::multipath::MpBthFlags,
};
use roce_tests::{
    Loaded,
    child::{Reaper, args, finish_within, spawn},
    ecmp::{Ecmp, PairRun},
    require_root,
    rxe::Capture,
    tag,
};

/// One RoCE frame of the capture.
#[derive(Debug)]
struct Seen {
    /// Sent by the client (else by the server).
    from_client: bool,
    /// A CM MAD (to QP 1): its attribute ID and whether it hints the extension.
    mad: Option<(u16, bool)>,
    /// A request of an RC QP (not a response, an acknowledgement or a MAD).
    rc_request: bool,
    /// The BTH's `resv7`.
    resv7: u8,
    /// The BTH's opcode.
    opcode: u8,
}

/// The RoCE frames of a capture, in order.
fn frames(pcap: &Path, client: Ipv4Addr) -> Vec<Seen> {
    let mut out = Vec::new();
    roce_tests::pcap::for_each_roce_frame(pcap, |f| {
        let from_client = f.ip.src_addr() == IpAddr::V4(client);
        let mad = (f.roce.bth.dest_qp.value() == 1 && f.payload.len() >= 256).then(|| {
            (
                u16::from_be_bytes([f.payload[16], f.payload[17]]),
                f.payload[MAD_HDR_LEN + MULTIPATH_HINT_AT] & MULTIPATH_HINT_BIT != 0,
            )
        });
        let response = f.roce.bth.opcode.info().is_some_and(|i| i.is_response());
        out.push(Seen {
            from_client,
            rc_request: mad.is_none() && !response,
            mad,
            resv7: f.roce.bth.resv7,
            opcode: f.roce.bth.opcode.0,
        });
    });
    out
}

/// Starts a capture on the first router's path interface (removed with the frames read).
fn capture(net: &Ecmp, name: &str) -> Capture {
    let pcap = std::env::temp_dir().join(format!("{}-{name}.pcap", tag("mpc")));
    Capture::start(&net.r1, &net.paths[0], &pcap)
}

/// Runs `server_line` on the server's end and `client_line` on the client's (both `roce`
/// command lines without `-d` and the host), capturing the first router's path interface;
/// returns both JSON reports and the frames seen.
fn captured(
    net: &Ecmp,
    server_line: &str,
    client_line: &str,
    name: &str,
) -> (serde_json::Value, serde_json::Value, Vec<Seen>) {
    let cap = capture(net, name);
    // The server listens on QP 1 before the client's REQ (the client resends a REQ that met
    // no listener, but a capture is clearer without).
    let (c, s) = net.roce_pair(&PairRun {
        settle: Duration::from_millis(500),
        ..PairRun::new(server_line, client_line)
    });
    let captured = cap.stop();
    let seen = frames(&captured.path, net.client.ipv4);
    let _ = std::fs::remove_file(&captured.path);
    (c, s, seen)
}

const OFFER: u8 = MpBthFlags::OFFER.bits();
const TRAILER: u8 = MpBthFlags::OFFER_TRAILER.bits();
const REQ: u16 = 0x10;
const REP: u16 = 0x13;

/// The hint bits of the REQs the client sent and of the REPs the server sent.
fn hints(seen: &[Seen]) -> (Vec<bool>, Vec<bool>) {
    let of = |attr: u16, client: bool| -> Vec<bool> {
        seen.iter()
            .filter(|s| s.from_client == client)
            .filter_map(|s| s.mad.filter(|m| m.0 == attr).map(|m| m.1))
            .collect()
    };
    (of(REQ, true), of(REP, false))
}

/// There are REQs and REPs (a resend is one more), the REQs' hints all `want.0`, the REPs'
/// all `want.1`.
fn assert_all(reqs: &[bool], reps: &[bool], want: (bool, bool)) {
    assert!(!reqs.is_empty() && !reps.is_empty(), "{reqs:?} {reps:?}");
    assert!(reqs.iter().all(|&h| h == want.0), "REQ hints {reqs:?}");
    assert!(reps.iter().all(|&h| h == want.1), "REP hints {reps:?}");
}

/// The `resv7` of every RC request one side sent, in order.
fn requests(seen: &[Seen], client: bool) -> Vec<u8> {
    seen.iter()
        .filter(|s| s.from_client == client && s.rc_request)
        .map(|s| s.resv7)
        .collect()
}

#[test]
fn rdma_cm_peers_hint_in_the_req_and_rep_and_send_trailers_from_the_first_packet() {
    require_root();
    let net = Ecmp::new(&tag("mpc"), 218, 1, 3000);
    let _loaded = Loaded::on(&[&net.client, &net.server]);
    let perf = "perf write -R -p 18950 -s 65536 -n 64 --span 4194304 -t 8 -m 2048";

    // Both offer: every REQ (control and data connection) and every REP hints, and every
    // request either side sends, from the first, carries its trailer: the control QP's
    // first SEND (which nothing but the CM exchange hints) and the data QP's first WRITE.
    let mp = format!("{perf} --multipath --entropies 1");
    let (c, s, seen) = captured(&net, &mp, &mp, "perf-both");
    assert_eq!(
        (c["verified"].clone(), s["verified"].clone()),
        (true.into(), true.into())
    );
    let (reqs, reps) = hints(&seen);
    assert!(reqs.len() >= 2 && reps.len() >= 2, "{reqs:?} {reps:?}");
    assert!(reqs.iter().chain(&reps).all(|&h| h), "{reqs:?} {reps:?}");
    let client = requests(&seen, true);
    assert!(client.len() >= 2048, "{} requests", client.len());
    assert_eq!(
        client[0], TRAILER,
        "the client's first request has its trailer"
    );
    assert!(client.iter().all(|&r| r == TRAILER), "every request does");
    let server = requests(&seen, false);
    assert!(!server.is_empty(), "the server's control SENDs");
    assert!(server.iter().all(|&r| r == TRAILER), "{server:?}");

    // The server does not offer: the client's REQs hint, the REPs do not; the client's
    // requests carry the offer bit only, and every frame of the server is plain.
    let (c, s, seen) = captured(&net, perf, &mp, "perf-plain-server");
    assert_eq!(
        (c["verified"].clone(), s["verified"].clone()),
        (true.into(), true.into())
    );
    let (reqs, reps) = hints(&seen);
    assert!(!reqs.is_empty() && !reps.is_empty(), "{reqs:?} {reps:?}");
    assert!(reqs.iter().all(|&h| h), "{reqs:?}");
    assert!(reps.iter().all(|&h| !h), "{reps:?}");
    let client = requests(&seen, true);
    assert!(client.len() >= 2048, "{} requests", client.len());
    assert!(client.iter().all(|&r| r == OFFER), "offer bit only");
    assert!(
        seen.iter().filter(|s| !s.from_client).all(|s| s.resv7 == 0),
        "the server's frames are plain"
    );

    // roce pingpong -R (rping's exchange, which runs after the connection and hints
    // nothing): the client's first SEND has its trailer.
    let pp = "pingpong -R -p 18951 -n 20 -s 4096 -m 2048 -c --multipath";
    let (c, s, seen) = captured(&net, pp, pp, "pingpong-both");
    assert_eq!(
        (c["iters"].clone(), s["iters"].clone()),
        (20.into(), 20.into())
    );
    let (reqs, reps) = hints(&seen);
    assert_all(&reqs, &reps, (true, true));
    let client = requests(&seen, true);
    assert_eq!(
        client.first(),
        Some(&TRAILER),
        "the client's first SEND carries its trailer"
    );
    assert!(client.iter().all(|&r| r & TRAILER == TRAILER), "{client:?}");

    // A client without --multipath: its REQ does not hint, so the offering server's REP does
    // not either, and the client's frames stay plain RoCE v2 from first to last.
    let plain = "pingpong -R -p 18952 -n 20 -s 4096 -m 2048 -c";
    let pp_server = "pingpong -R -p 18952 -n 20 -s 4096 -m 2048 -c --multipath";
    let (c, s, seen) = captured(&net, pp_server, plain, "pingpong-plain-client");
    assert_eq!(
        (c["iters"].clone(), s["iters"].clone()),
        (20.into(), 20.into())
    );
    let (reqs, reps) = hints(&seen);
    assert_all(&reqs, &reps, (false, false));
    assert!(
        seen.iter().filter(|s| s.from_client).all(|s| s.resv7 == 0),
        "the client's frames are plain"
    );
    assert!(
        requests(&seen, false)
            .iter()
            .all(|&r| r & TRAILER != TRAILER),
        "the server sends no trailer"
    );
}

/// Debian's rping on `end` through the drop-in librdmacm (`roce exec`), with
/// `ROCE_MULTIPATH=1` (`roce exec --multipath`) if `multipath`.
fn rping(end: &VethEnd, multipath: bool, role: &str, server: Ipv4Addr, port: u16) -> Reaper {
    let mut v = vec!["exec"];
    if multipath {
        v.push("--multipath");
    }
    let (server, port) = (server.to_string(), port.to_string());
    v.extend([
        "-d",
        &end.ifname,
        "--",
        "rping",
        role,
        "-V",
        "-S",
        "128",
        "-C",
        "20",
        "-p",
        &port,
        "-a",
        &server,
    ]);
    spawn(&end.netns, &args(&v.join(" ")))
}

/// rping server and client on the library, each with or without `--multipath`; both must
/// succeed (every ping verified, `-V`). Returns the frames captured.
fn rping_pair(net: &Ecmp, (server_mp, client_mp): (bool, bool), port: u16) -> Vec<Seen> {
    let cap = capture(net, &format!("rping-{port}"));
    let server = rping(&net.server, server_mp, "-s", net.server.ipv4, port);
    std::thread::sleep(Duration::from_secs(1));
    let client = rping(&net.client, client_mp, "-c", net.server.ipv4, port);
    let client = finish_within(client, Duration::from_secs(60), "rping -c");
    let server = finish_within(server, Duration::from_secs(20), "rping -s");
    for (o, what) in [(&client, "rping -c"), (&server, "rping -s")] {
        assert!(o.status.success(), "{what}: {}", roce_tests::output_text(o));
    }
    let captured = cap.stop();
    let seen = frames(&captured.path, net.client.ipv4);
    // tshark's InfiniBand dissector takes the MADs, hinted or not, as it takes Linux's: every
    // frame to QP 1 a CM MAD, no REQ or REP malformed or warned about.
    let qp1 = "infiniband.bth.destqp == 1";
    let mads = tshark_count(&captured.path, qp1);
    assert!(mads >= 5, "{mads} frames to QP 1");
    assert_eq!(
        tshark_count(
            &captured.path,
            &format!("{qp1} && infiniband.mad.mgmtclass == 0x07")
        ),
        mads
    );
    for attr in [REQ, REP] {
        let f = format!("{qp1} && infiniband.mad.attributeid == {attr:#06x}");
        assert!(tshark_count(&captured.path, &f) >= 1, "{f}");
    }
    for bad in ["_ws.malformed", "_ws.expert.severity >= warning"] {
        assert_eq!(
            tshark_count(&captured.path, &format!("{qp1} && {bad}")),
            0,
            "{bad}"
        );
    }
    let _ = std::fs::remove_file(&captured.path);
    seen
}

/// `tshark -r FILE` with a display filter: the number of frames it matches.
fn tshark_count(file: &Path, filter: &str) -> usize {
    let o = std::process::Command::new("tshark")
        .args(["-n", "-r"])
        .arg(file)
        .args(["-Y", filter, "-T", "fields", "-e", "frame.number"])
        .output()
        .expect("tshark (Debian's tshark package) must be installed");
    assert!(
        o.status.success(),
        "tshark {filter}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).lines().count()
}

/// The drop-in librdmacm with `ROCE_MULTIPATH=1` at both ends: Debian's rping hints in its
/// REQ and REP (`rdma_connect` and `rdma_accept` on the Rust CM), the client's first SEND
/// carries its trailer, and the server's first RDMA READ request is already marked to be
/// held (`HOLD`), which only a hint taken before RTR in `rdma_accept` gives it (in band the
/// server would learn that its peer holds READs from the client's first response, after
/// that READ). A server without the variable hints nothing back: plain offers only. tshark
/// dissects the hinted REQ and REP without a warning.
#[test]
fn rping_on_the_drop_in_librdmacm_hints_in_the_req_and_rep() {
    require_root();
    let net = Ecmp::new(&tag("mpl"), 219, 1, 3000);
    let _loaded = Loaded::on(&[&net.client, &net.server]);
    let seen = rping_pair(&net, (true, true), 18960);
    let (reqs, reps) = hints(&seen);
    assert_all(&reqs, &reps, (true, true));
    let client = requests(&seen, true);
    assert_eq!(
        client.first(),
        Some(&TRAILER),
        "the client's first SEND carries its trailer"
    );
    let hold = MpBthFlags::HOLD.bits();
    let reads: Vec<u8> = seen
        .iter()
        .filter(|s| !s.from_client && s.rc_request && s.opcode == 0x0c)
        .map(|s| s.resv7)
        .collect();
    assert_eq!(reads.len(), 20, "one READ request per ping");
    assert_ne!(reads[0] & hold, 0, "the server's first READ is held");
    assert!(reads.iter().all(|&r| r & hold != 0), "{reads:?}");

    let seen = rping_pair(&net, (false, true), 18961);
    let (reqs, reps) = hints(&seen);
    assert_all(&reqs, &reps, (true, false));
    let client = requests(&seen, true);
    assert!(
        !client.is_empty() && client.iter().all(|&r| r == OFFER),
        "{client:?}"
    );
    assert!(
        seen.iter().filter(|s| !s.from_client).all(|s| s.resv7 == 0),
        "the server's frames are plain"
    );
}
