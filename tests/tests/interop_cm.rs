//! The kernel's CM MADs against our codecs: two Soft-RoCE VMs run the real rdmacm tools
//! against each other (`rping` connect, transfer and disconnect, `rping` to a port with no
//! listener, `udaddy` for SIDR) while we capture the server VM's tap; every CM MAD in the
//! capture must decode with `roce::ibcm`, re-encode to the kernel's very bytes, and mean what
//! the tools did (RDMA CM service IDs and IP header, REP answering the REQ, REJ "invalid
//! service ID"). Then our own CM agent is given the kernel's REQs: it asks its consumer about
//! the one it listens for and rejects the other with the reason the kernel gave.
//!
//! And the other way: our agent's own MADs, sent from our veth as RoCE v2 UD SENDs to the
//! guest's QP1, must be accepted by the kernel's CM: REQ → REP, RTU → `rping -s` established,
//! DREQ → DREP, a REQ to a closed port → REJ "invalid service ID", with the guest's CM counters
//! matching message for message; and the kernel's `rping -c` connecting to our agent accepts
//! our REP (its RTU establishes our side) and our DREQ. Root; boots the rxe-peer VM (two of
//! them for the first test).

use std::{
    collections::BTreeSet,
    fs,
    net::{IpAddr, Ipv4Addr},
    path::Path,
    process::Command,
    time::Duration,
};

use roce::{
    ibcm::{
        AcceptParams, CaGuid, Cm, CmConfig, CmMad, CmMsg, CmaHdr, ConnectParams, Event, Gid,
        PortSpace, RejReason, ServiceId,
    },
    time::Instant,
    wire::{
        BthRepr, DethRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, QKey, Qpn, RoceRepr,
        emit_frame,
    },
};
use roce_tests::{
    RawPort, require_root,
    rxe::{Capture, Peer, PeerOptions},
    tag,
};

/// Every UD SEND_ONLY to QP1 in a capture: (source IP, 256-byte MAD).
fn qp1_mads(pcap: &Path) -> Vec<(std::net::IpAddr, Vec<u8>)> {
    let mut out = Vec::new();
    roce_tests::pcap::for_each_roce_frame(pcap, |f| {
        if f.roce.bth.opcode == Opcode::UD_SEND_ONLY && f.roce.bth.dest_qp == Qpn::GSI {
            let deth = f.roce.deth.expect("UD has a DETH");
            assert_eq!(deth.qkey, QKey::GSI);
            out.push((f.src_ip(), f.payload.to_vec()));
        }
    });
    out
}

#[test]
fn kernel_cm_mads_decode_and_reencode_exactly() {
    require_root();
    let server = Peer::boot(&tag("cm"), 71, &PeerOptions::default());
    let client = Peer::boot_beside(&server, &PeerOptions::default());
    let dir = std::env::temp_dir().join(format!("roce-interop-cm-{}", std::process::id()));
    let pcap = dir.join("cm.pcap");
    let cap = Capture::start(&server.netns, &server.tap, &pcap);
    let sip = server.guest_ip;
    // rping: connect, 3 ping-pongs (RC SEND, RDMA READ and WRITE), disconnect.
    let s = server.spawn(&format!("rping -s -a {sip} -p 7174 -C 3 -v"));
    std::thread::sleep(Duration::from_secs(3));
    let c = client.exec(
        &format!("rping -c -a {sip} -p 7174 -C 3 -v"),
        Duration::from_secs(120),
    );
    let s = server.wait_or_kill(&s, Duration::from_secs(60));
    assert_eq!(c.rc, 0, "rping client: {}", c.out);
    assert_eq!(s.rc, 0, "rping server: {}", s.out);
    // No listener on 7175: the kernel answers the REQ with REJ "invalid service ID".
    let n = client.exec(
        &format!("rping -c -a {sip} -p 7175 -C 1"),
        Duration::from_secs(60),
    );
    assert_ne!(
        n.rc, 0,
        "rping to a port nobody listens on succeeded: {}",
        n.out
    );
    // udaddy: SIDR_REQ/SIDR_REP in the UDP port space (default port 7174).
    let u = server.spawn("udaddy -C 2");
    std::thread::sleep(Duration::from_secs(3));
    let uc = client.exec(&format!("udaddy -s {sip} -C 2"), Duration::from_secs(120));
    let u = server.wait_or_kill(&u, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let captured = cap.stop();
    drop(client);
    drop(server);
    assert_eq!(uc.rc, 0, "udaddy client: {}", uc.out);
    assert_eq!(u.rc, 0, "udaddy server: {}", u.out);

    let mads = qp1_mads(&captured.path);
    let _ = fs::remove_dir_all(&dir);
    assert!(!mads.is_empty(), "no MAD to QP1 in the capture");
    let mut kinds = BTreeSet::new();
    let mut reqs = Vec::new();
    let tcp = ServiceId::rdma_cm(PortSpace::Tcp, 7174);
    let closed = ServiceId::rdma_cm(PortSpace::Tcp, 7175);
    let mut req_ids = Vec::new();
    let mut rep_answers = Vec::new();
    let mut kernel_rej_reason = None;
    for (i, (src, bytes)) in mads.iter().enumerate() {
        assert_eq!(bytes.len(), 256, "MAD {i}: {} bytes", bytes.len());
        let mad = CmMad::decode(bytes).unwrap_or_else(|e| panic!("MAD {i} from {src}: {e}"));
        let again = mad.encode().unwrap();
        // Bytes 6-7 (class specific) and 18-19 (reserved) of the header are zero from the
        // kernel and from us; everything else is a field we decode.
        assert_eq!(
            &again[..],
            &bytes[..],
            "MAD {i} ({}) does not re-encode to the kernel's bytes",
            mad.msg.name()
        );
        kinds.insert(mad.msg.name());
        match &mad.msg {
            CmMsg::Req(r) => {
                assert!(r.service_id == tcp || r.service_id == closed, "{r:?}");
                let h = CmaHdr::parse(&r.private_data).expect("RDMA CM IP header");
                assert_eq!(h.dst, std::net::IpAddr::V4(sip), "{h:?}");
                assert_eq!(h.src, *src, "{h:?}");
                assert_ne!(r.local_ca_guid, CaGuid(0));
                // The reserved byte that carries roce-xdp's multipath hint is zero.
                assert!(!r.multipath_hint, "a kernel REQ decodes as hinting: {r:?}");
                req_ids.push(r.local_comm_id);
                reqs.push((*src, bytes.clone(), r.service_id));
            }
            CmMsg::Rep(r) => {
                assert!(!r.multipath_hint, "a kernel REP decodes as hinting: {r:?}");
                rep_answers.push(r.remote_comm_id);
            }
            CmMsg::Rej(r) if r.reason == RejReason::INVALID_SERVICE_ID => {
                kernel_rej_reason = Some(r.reason);
            }
            _ => {}
        }
    }
    eprintln!(
        "{} CM MADs from the kernel, all decoded and re-encoded exactly: {kinds:?}",
        mads.len()
    );
    for k in [
        "REQ", "REP", "RTU", "DREQ", "DREP", "REJ", "SIDR_REQ", "SIDR_REP",
    ] {
        assert!(kinds.contains(k), "no {k} in the capture: {kinds:?}");
    }
    assert!(
        rep_answers.iter().all(|id| req_ids.contains(id)),
        "a REP answers no REQ"
    );
    assert_eq!(kernel_rej_reason, Some(RejReason::INVALID_SERVICE_ID));

    // Our agent, listening where rping -s listened, given the kernel's REQs.
    let mut ours = Cm::new(CmConfig::new(CaGuid(0x0200_00ff_fe00_0071)));
    ours.listen(tcp).unwrap();
    for (src, bytes, sid) in &reqs {
        let from = Gid::from_ip(*src);
        ours.handle_mad(Instant::ZERO, from, bytes).unwrap();
        if *sid == tcp {
            assert!(matches!(
                ours.poll_event(),
                Some(Event::ConnectRequest { from: f, .. }) if f == from
            ));
        } else {
            let t = ours.poll_transmit().expect("a REJ");
            let CmMsg::Rej(r) = CmMad::decode(&t.mad[..]).unwrap().msg else {
                panic!("expected a REJ")
            };
            assert_eq!(r.reason, RejReason::INVALID_SERVICE_ID);
        }
    }
}

fn mac_of(s: &str) -> EthernetAddress {
    let b: Vec<u8> = s
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad MAC {s:?}")))
        .collect();
    EthernetAddress(b.try_into().unwrap_or_else(|_| panic!("bad MAC {s:?}")))
}

/// Our veth's MAC (`ip -j link show`).
fn our_mac(netns: &str, ifname: &str) -> EthernetAddress {
    let o = Command::new("ip")
        .args(["-n", netns, "-j", "link", "show", ifname])
        .output()
        .expect("run ip");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ip -j JSON");
    mac_of(v[0]["address"].as_str().expect("address"))
}

/// One of the guest's CM counters (cm.c `cm_counter_groups`, in sysfs).
fn cm_counter(peer: &Peer, dir: &str, name: &str) -> u64 {
    let o = peer.exec(
        &format!("cat /sys/class/infiniband/rxe0/ports/1/{dir}/{name}"),
        Duration::from_secs(30),
    );
    assert_eq!(o.rc, 0, "{dir}/{name}: {}", o.out);
    o.out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{dir}/{name}: {:?}", o.out))
}

/// A RoCE v2 UD SEND_ONLY to QP1 carrying `mad`, as rxe would send it.
fn frame(
    (src_mac, src): (EthernetAddress, Ipv4Addr),
    (dst_mac, dst): (EthernetAddress, Ipv4Addr),
    mad: &[u8; 256],
) -> Vec<u8> {
    let mut path = PathRepr::new(src_mac, dst_mac, IpPath::V4 { src, dst });
    path.udp_src_port = roce::wire::frame::rxe_udp_src_port(Qpn::GSI);
    let mut r = RoceRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(0)));
    r.deth = Some(DethRepr {
        qkey: QKey::GSI,
        src_qp: Qpn::GSI,
    });
    let mut buf = vec![0u8; 1024];
    let n = emit_frame(&path, &r, mad, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

/// Sends what our agent queued, through `port`.
fn flush(
    cm: &mut Cm,
    port: &mut RawPort,
    us: (EthernetAddress, Ipv4Addr),
    guest: (EthernetAddress, Ipv4Addr),
) {
    while let Some(t) = cm.poll_transmit() {
        assert_eq!(t.dest, Gid::from_ip(IpAddr::V4(guest.1)));
        port.send(&frame(us, guest, &t.mad)).expect("send");
    }
}

/// Hands the guest's MADs to QP1 that arrive within `wait` to our agent.
fn receive(cm: &mut Cm, port: &mut RawPort, now: Instant, wait: Duration) {
    for f in port.recv(wait).expect("recv") {
        if let Ok(p) = roce::wire::parse_frame(&f)
            && p.roce.bth.opcode == Opcode::UD_SEND_ONLY
            && p.roce.bth.dest_qp == Qpn::GSI
        {
            assert!(p.icrc_ok);
            let _ = cm.handle_mad(now, Gid::from_ip(p.src_ip()), p.payload);
        }
    }
}

/// Runs our agent against the guest for up to `secs` seconds (receiving, resending on its
/// timers, with time from the host's clock since `t0`) until it has an event.
fn next_event(
    cm: &mut Cm,
    port: &mut RawPort,
    t0: std::time::Instant,
    us: (EthernetAddress, Ipv4Addr),
    guest: (EthernetAddress, Ipv4Addr),
    secs: u64,
) -> Option<Event> {
    let now = || Instant::from_nanos(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let end = t0.elapsed() + Duration::from_secs(secs);
    while t0.elapsed() < end {
        flush(cm, port, us, guest);
        receive(cm, port, now(), Duration::from_millis(200));
        cm.handle_timeout(now());
        flush(cm, port, us, guest);
        if let Some(e) = cm.poll_event() {
            return Some(e);
        }
    }
    None
}

/// Our MADs against the kernel's CM: our REQ to `rping -s` is answered with a REP, our RTU
/// establishes the connection (the guest's rping sees it), our DREQ is answered with a DREP,
/// and a REQ to a closed port gets REJ "invalid service ID"; the guest's CM counters show each
/// message received once, nothing duplicated and no retry.
#[test]
fn the_kernel_accepts_our_cm_mads() {
    require_root();
    let peer = Peer::boot(&tag("cq"), 72, &PeerOptions::default());
    let guest = (
        mac_of(peer.ready.get("RXE_MAC").expect("RXE_MAC")),
        peer.guest_ip,
    );
    let us = (our_mac(&peer.netns, &peer.ifname), peer.host_ip);
    let mut port = RawPort::open(&peer.netns, &peer.ifname).expect("raw port");
    // -d: rping logs its CM events (ESTABLISHED, DISCONNECT).
    let s = peer.spawn(&format!("rping -s -d -a {} -p 7174 -C 1", peer.guest_ip));
    let m = us.0.0;
    // A node GUID from our MAC (EUI-64), as rxe derives its own.
    let mut cm = Cm::new(CmConfig::new(CaGuid::from_mac(m)));
    let t0 = std::time::Instant::now();
    let now = || Instant::from_nanos(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    std::thread::sleep(Duration::from_secs(3));
    // Every REQ carries roce-xdp's multipath hint (docs/multipath.md, "Hints out of band"):
    // the kernel takes it as any REQ, and its REP does not hint back.
    let params = |port_no: u16| ConnectParams {
        multipath_hint: true,
        ..ConnectParams::rdma_cm(
            (us.1, 40000).into(),
            (guest.1, port_no).into(),
            Qpn::new(0x1234),
            Psn::new(0x42),
            &[],
        )
    };
    // rping -s listens some time after it starts (its stdout is a pipe, so it cannot tell us
    // when): until then the kernel rejects with "invalid service ID", and we try again.
    let mut attempts = 0u64;
    let (id, rep) = loop {
        attempts += 1;
        assert!(attempts <= 60, "rping -s never listened");
        let id = cm.connect(now(), &params(7174)).unwrap();
        match next_event(&mut cm, &mut port, t0, us, guest, 30) {
            Some(Event::Reply { id: rid, rep }) => {
                assert_eq!(rid, id);
                break (id, rep);
            }
            Some(Event::Rejected { reason, .. }) if reason == RejReason::INVALID_SERVICE_ID => {
                std::thread::sleep(Duration::from_secs(1));
            }
            e => panic!(
                "no REP from the kernel: {e:?}; guest: {}",
                peer.wait_or_kill(&s, Duration::ZERO).out
            ),
        }
    };
    assert_ne!(rep.local_qpn.value(), 0);
    assert!(!rep.multipath_hint, "the kernel's REP hints: {rep:?}");
    cm.ready_to_use(id, &[]).unwrap();
    assert_eq!(cm.poll_event(), Some(Event::Established { id }));
    flush(&mut cm, &mut port, us, guest);
    std::thread::sleep(Duration::from_secs(1));
    cm.disconnect(now(), id, &[]).unwrap();
    let drep = next_event(&mut cm, &mut port, t0, us, guest, 30);
    assert!(
        matches!(drep, Some(Event::Disconnected { id: d, .. }) if d == id),
        "no DREP from the kernel: {drep:?}"
    );
    let server = peer.wait_or_kill(&s, Duration::from_secs(30));
    // rping -s saw the connection come up, then the disconnection (before any data, so it
    // exits with an error: that is not ours to check).
    assert!(
        server.out.contains("ESTABLISHED") && server.out.contains("DISCONNECT EVENT"),
        "rping -s did not see the connection established and disconnected: {}",
        server.out
    );
    // A REQ to a port nobody listens on.
    let closed = cm.connect(now(), &params(7175)).unwrap();
    let rej = next_event(&mut cm, &mut port, t0, us, guest, 30);
    let no_listener = |e: &Event| {
        matches!(e, Event::Rejected { id, reason, .. }
            if *id == closed && *reason == RejReason::INVALID_SERVICE_ID)
    };
    assert!(rej.as_ref().is_some_and(no_listener), "{rej:?}");
    for (dir, name, want) in [
        ("cm_rx_msgs", "req", attempts + 1),
        ("cm_tx_msgs", "rep", 1),
        ("cm_rx_msgs", "rtu", 1),
        ("cm_rx_msgs", "dreq", 1),
        ("cm_tx_msgs", "drep", 1),
        ("cm_tx_msgs", "rej", attempts),
        ("cm_rx_duplicates", "req", 0),
        ("cm_tx_retries", "rep", 0),
    ] {
        assert_eq!(cm_counter(&peer, dir, name), want, "guest {dir}/{name}");
    }
    drop(port);
    drop(peer);
}

/// The passive side: the kernel's `rping -c` connects to our agent; the kernel accepts our
/// REP (it answers with an RTU, which establishes our side) and our DREQ (DREP).
#[test]
fn the_kernel_connects_to_our_cm() {
    require_root();
    let peer = Peer::boot(&tag("cp"), 73, &PeerOptions::default());
    let guest = (
        mac_of(peer.ready.get("RXE_MAC").expect("RXE_MAC")),
        peer.guest_ip,
    );
    let us = (our_mac(&peer.netns, &peer.ifname), peer.host_ip);
    let mut port = RawPort::open(&peer.netns, &peer.ifname).expect("raw port");
    let m = us.0.0;
    let mut cm = Cm::new(CmConfig::new(CaGuid::from_mac(m)));
    let sid = ServiceId::rdma_cm(PortSpace::Tcp, 7174);
    cm.listen(sid).unwrap();
    let t0 = std::time::Instant::now();
    let now = || Instant::from_nanos(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    // The client gives up once its first SEND finds no QP behind our QPN; that is expected.
    let c = peer.spawn(&format!("rping -c -d -a {} -p 7174 -C 1", peer.host_ip));
    let (id, req) = match next_event(&mut cm, &mut port, t0, us, guest, 60) {
        Some(Event::ConnectRequest { id, req, .. }) => (id, req),
        e => panic!(
            "no REQ from rping -c: {e:?}; guest: {}",
            peer.wait_or_kill(&c, Duration::ZERO).out
        ),
    };
    assert_eq!(req.service_id, sid);
    let h = CmaHdr::parse(&req.private_data).expect("RDMA CM IP header");
    assert_eq!(h.dst, IpAddr::V4(us.1));
    assert_eq!(h.src, IpAddr::V4(guest.1));
    let accept = AcceptParams {
        qpn: Qpn::new(0x1234),
        starting_psn: Psn::new(0x42),
        responder_resources: req.initiator_depth.min(1),
        initiator_depth: req.responder_resources.min(1),
        rnr_retry_count: 7,
        srq: false,
        target_ack_delay: 0,
        // Our QP "allows" the extension; the kernel's REQ did not hint, so the REP does not.
        multipath_hint: true,
        private_data: Vec::new(),
    };
    assert!(!req.multipath_hint, "the kernel's REQ hints: {req:?}");
    cm.accept(now(), id, &accept).unwrap();
    let est = next_event(&mut cm, &mut port, t0, us, guest, 30);
    assert_eq!(
        est,
        Some(Event::Established { id }),
        "our REP was not answered with an RTU"
    );
    cm.disconnect(now(), id, &[]).unwrap();
    let drep = next_event(&mut cm, &mut port, t0, us, guest, 30);
    assert!(
        matches!(drep, Some(Event::Disconnected { id: d, .. }) if d == id),
        "no DREP from the kernel: {drep:?}"
    );
    let client = peer.wait_or_kill(&c, Duration::from_secs(60));
    assert!(
        client.out.contains("ESTABLISHED"),
        "rping -c never saw the connection established: {}",
        client.out
    );
    for (dir, name, want) in [
        ("cm_tx_msgs", "req", 1),
        ("cm_rx_msgs", "rep", 1),
        ("cm_tx_msgs", "rtu", 1),
        ("cm_rx_msgs", "dreq", 1),
        ("cm_tx_msgs", "drep", 1),
        ("cm_tx_msgs", "rej", 0),
        ("cm_rx_duplicates", "rep", 0),
        ("cm_tx_retries", "req", 0),
    ] {
        assert_eq!(cm_counter(&peer, dir, name), want, "guest {dir}/{name}");
    }
    drop(port);
    drop(peer);
}
