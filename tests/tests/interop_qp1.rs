//! The CM on QP 1 of a roce-xdp device, over the real data path, against the kernel's CM in
//! the Soft-RoCE VM: roce_xdp steers the guest's UD SENDs to QP 1 into our AF_XDP sockets
//! (QPN 1 claimed in its QP map by `Device::cm_enable`), the device's engine hands them to
//! the CM agent, and the agent's answers leave through the same sockets. No raw socket: what
//! our side sees is what QP 1's counters and the CM's events say.
//!
//! - The guest's `rping -c` to a port nobody listens on: our REJ "invalid service ID" reaches
//!   it (rping reports REJECTED, status 8), and QP 1 counted the REQ.
//! - The guest's `rping -c` to a port we listen on: the connect request names the service and
//!   carries the RDMA CM IP header (guest → us, our port); we accept; the guest answers our REP
//!   with an RTU and our side is established; our DREQ is answered with a DREP.
//! - Our `cm_connect` to the guest's `rping -s` (path from the neighbour table): the kernel
//!   answers with a REP, our RTU establishes it.
//!
//! - The guest's `udaddy -s` resolves our UD service (SIDR) on UDP port 7174.
//!
//! The data phase of rping is not run by the tests above (our QPs are not brought up from the
//! CM events there); the last test runs all of it, with Debian's unmodified `rping` on the
//! drop-in librdmacm (`roce exec`) at our end:
//! - our `rping -c -V` against the guest's `rping -s -V`, and the guest's `rping -c -V`
//!   against our `rping -s -V`: every ping verified at both ends, the counts checked, and the
//!   guest's CM counters show one connection each way with nothing retried.
//!
//! Root; boots the rxe-peer VM.

use std::{net::IpAddr, sync::Arc, time::Duration};

use roce::{
    api::{
        CmAccept, CmConnect, CmEvent, CmState, Device, DeviceOptions, RejReason, ServiceId,
        SidrStatus,
    },
    ibcm::{CmaHdr, Gid, PortSpace},
    loader::Pins,
    netns,
    transport::{Psn, QKey, Qpn},
};
use roce_tests::{
    Loaded, require_root,
    rxe::{Peer, PeerOptions},
    tag,
};

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

/// Our device on the peer's veth, opened in its namespace.
fn open(peer: &Peer) -> Arc<Device> {
    let ifname = peer.ifname.clone();
    let dev = netns::in_netns(&peer.netns, move || {
        Device::open(&ifname, &DeviceOptions::default())
    })
    .expect("enter the peer's namespace")
    .expect("open our device");
    Arc::new(dev)
}

/// QP 1's counters on our side: (received, sent, dropped).
fn qp1(dev: &Device) -> (u64, u64, u64) {
    let (_, qps) = dev.counters();
    let c = qps
        .iter()
        .find(|(q, _)| *q == Qpn::GSI)
        .map(|(_, c)| *c)
        .expect("QP 1 among the device's QPs");
    (c.rcvd_pkts, c.sent_pkts, c.rx_dropped)
}

/// The guest's `rping -c` reaches our CM through roce_xdp and QP 1: rejected while nobody
/// listens, accepted and established once we listen, then disconnected by us.
#[test]
fn the_guests_rping_connects_to_our_cm_on_qp1() {
    require_root();
    let peer = Peer::boot(&tag("q1"), 74, &PeerOptions::default());
    let dev = open(&peer);
    dev.cm_enable().expect("CM on QP 1");
    assert_eq!(qp1(&dev), (0, 0, 0));

    // Nobody listens on 7180: the kernel's rdma_connect gets our REJ "invalid service ID".
    let n = peer.exec(
        &format!("rping -c -a {} -p 7180 -C 1", peer.host_ip),
        Duration::from_secs(60),
    );
    assert_ne!(n.rc, 0, "rping to a closed port succeeded: {}", n.out);
    assert!(
        n.out.contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "rping did not report a reject with reason 8 (invalid service ID): {}",
        n.out
    );
    let (rx, tx, dropped) = qp1(&dev);
    assert_eq!(
        (rx, tx, dropped),
        (1, 1, 0),
        "QP 1: one REQ in, one REJ out"
    );
    let (cm, gsi) = dev.cm_stats().expect("CM stats");
    assert_eq!(cm.no_listener, 1, "{cm:?}");
    assert_eq!(gsi, Default::default());
    assert_eq!(cm_counter(&peer, "cm_tx_msgs", "req"), 1);
    assert_eq!(cm_counter(&peer, "cm_rx_msgs", "rej"), 1);
    assert_eq!(cm_counter(&peer, "cm_tx_retries", "req"), 0);

    // We listen on 7174: the request names the service and carries the RDMA CM IP header.
    let sid = dev.cm_listen(7174).expect("listen");
    assert_eq!(sid, ServiceId::rdma_cm(PortSpace::Tcp, 7174));
    // stdbuf: rping's debug log (stdout) must survive a kill.
    let c = peer.spawn(&format!(
        "stdbuf -oL rping -c -d -a {} -p 7174 -C 1",
        peer.host_ip
    ));
    let (id, from, req) = match dev.wait_cm_event(Duration::from_secs(60)) {
        Some(CmEvent::ConnectRequest { id, from, req }) => (id, from, req),
        e => panic!(
            "no connect request from rping -c: {e:?}; guest: {}",
            peer.wait_or_kill(&c, Duration::ZERO).out
        ),
    };
    assert_eq!(from, Gid::from_ip(IpAddr::V4(peer.guest_ip)));
    assert_eq!(req.service_id, sid);
    let h = CmaHdr::parse(&req.private_data).expect("RDMA CM IP header");
    assert_eq!(h.src, IpAddr::V4(peer.guest_ip));
    assert_eq!(h.dst, IpAddr::V4(peer.host_ip));
    assert_ne!(req.local_qpn.value(), 0);
    let mut accept = CmAccept::new(Qpn::new(0x1234), Psn::new(0x42));
    accept.responder_resources = req.initiator_depth.min(1);
    accept.initiator_depth = req.responder_resources.min(1);
    dev.cm_accept(id, &accept).expect("accept");
    assert_eq!(
        dev.wait_cm_event(Duration::from_secs(30)),
        Some(CmEvent::Established { id }),
        "our REP was not answered with an RTU"
    );
    assert_eq!(dev.cm_state(id), Some(CmState::Established));
    // rping's main thread checks that its state is CONNECTED once the ESTABLISHED event has
    // woken it (rping.c `rping_connect_client`); a DISCONNECTED event that the CM thread
    // handles before that check overwrites the state, and rping then gives up without
    // calling rdma_disconnect and waits for its CQ thread forever, so the kernel's DREP
    // only leaves when the process dies (cm.c `cm_destroy_id` in DREQ_RCVD). Disconnect
    // once rping is past that check: its first SEND (to the QPN we named, which no QP of
    // ours owns) has reached roce_xdp and gone on to the kernel as a foreign QP's packet.
    let pins = Pins::new(&peer.ifname);
    let foreign = |p: &Pins| p.xdp_stats().expect("roce_xdp's counters").pass_foreign_qp;
    let foreign_before = foreign(&pins);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while foreign(&pins) == foreign_before {
        assert!(
            std::time::Instant::now() < deadline,
            "rping -c sent no SEND after the connection was established: {}",
            peer.wait_or_kill(&c, Duration::ZERO).out
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Our DREQ: the kernel tells rping (DISCONNECTED), rping's wait for its SEND's answer
    // ends, and it calls rdma_disconnect, which sends the DREP (cma.c). A DREQ the kernel
    // has not answered within the CM response timeout is retransmitted (IBTA 12.9.6) and
    // counted there as a duplicate.
    dev.cm_disconnect(id, &[]).expect("disconnect");
    let drep = dev.wait_cm_event(Duration::from_secs(60));
    assert!(
        matches!(drep, Some(CmEvent::Disconnected { id: d, .. }) if d == id),
        "no DREP from the kernel: {drep:?}; CM {:?}",
        dev.cm_stats()
    );
    let client = peer.wait_or_kill(&c, Duration::from_secs(60));
    assert!(
        client.out.contains("ESTABLISHED") && client.out.contains("DISCONNECT EVENT"),
        "rping -c did not see the connection established and disconnected: {}",
        client.out
    );
    for (dir, name, want) in [
        ("cm_tx_msgs", "req", 2),
        ("cm_rx_msgs", "rep", 1),
        ("cm_tx_msgs", "rtu", 1),
        ("cm_tx_msgs", "drep", 1),
        ("cm_rx_msgs", "rej", 1),
        ("cm_rx_duplicates", "rep", 0),
        ("cm_tx_retries", "req", 0),
    ] {
        assert_eq!(cm_counter(&peer, dir, name), want, "guest {dir}/{name}");
    }
    let (cm, gsi) = dev.cm_stats().expect("CM stats");
    // Every DREQ we sent (first and retransmissions) reached the kernel's CM.
    assert_eq!(
        cm_counter(&peer, "cm_rx_msgs", "dreq"),
        1 + cm.retransmits,
        "{cm:?}"
    );
    // QP 1 received REQ, REQ, RTU, DREP and sent REJ, REP and the DREQs; nothing malformed,
    // nothing unexpected.
    assert_eq!(
        qp1(&dev),
        (4, 3 + cm.retransmits, 0),
        "QP 1 (received, sent, dropped); CM {cm:?}, GSI {gsi:?}; rping -c: {}",
        client.out
    );
    assert_eq!((cm.malformed, cm.unexpected), (0, 0), "{cm:?}");
    assert_eq!(gsi, Default::default());
    drop(dev);
    drop(peer);
}

/// Our `cm_connect` to the guest's `rping -s`: the path to the guest's QP 1 comes from the
/// neighbour table, the kernel answers our REQ with a REP, and our RTU establishes it.
#[test]
fn our_cm_connects_to_the_guests_rping_server_over_qp1() {
    require_root();
    let peer = Peer::boot(&tag("q2"), 75, &PeerOptions::default());
    let dev = open(&peer);
    let s = peer.spawn(&format!("rping -s -d -a {} -p 7174 -C 1", peer.guest_ip));
    std::thread::sleep(Duration::from_secs(3));
    let guest = IpAddr::V4(peer.guest_ip);
    // rping -s listens some time after it starts: until then the kernel rejects with
    // "invalid service ID", and we try again.
    let mut attempts = 0u64;
    let (id, rep) = loop {
        attempts += 1;
        assert!(attempts <= 60, "rping -s never listened");
        let d = Arc::clone(&dev);
        // In the peer's namespace: the path comes from its routing and neighbour tables.
        let id = netns::in_netns(&peer.netns, move || {
            d.cm_connect(&CmConnect::new(
                guest,
                7174,
                40000,
                Qpn::new(0x1234),
                Psn::new(7),
            ))
        })
        .expect("enter the peer's namespace")
        .expect("connect");
        match dev.wait_cm_event(Duration::from_secs(30)) {
            Some(CmEvent::Reply { id: rid, rep }) => {
                assert_eq!(rid, id);
                break (id, rep);
            }
            Some(CmEvent::Rejected { reason, .. }) if reason == RejReason::INVALID_SERVICE_ID => {
                std::thread::sleep(Duration::from_secs(1));
            }
            e => panic!(
                "no REP from the kernel: {e:?}; guest: {}",
                peer.wait_or_kill(&s, Duration::ZERO).out
            ),
        }
    };
    assert_ne!(rep.local_qpn.value(), 0);
    dev.cm_ready(id, &[]).expect("RTU");
    assert_eq!(
        dev.wait_cm_event(Duration::from_secs(5)),
        Some(CmEvent::Established { id })
    );
    std::thread::sleep(Duration::from_secs(1));
    dev.cm_disconnect(id, &[]).expect("disconnect");
    let drep = dev.wait_cm_event(Duration::from_secs(30));
    assert!(
        matches!(drep, Some(CmEvent::Disconnected { id: d, .. }) if d == id),
        "no DREP from the kernel: {drep:?}"
    );
    let server = peer.wait_or_kill(&s, Duration::from_secs(30));
    assert!(
        server.out.contains("ESTABLISHED"),
        "rping -s did not see the connection established: {}",
        server.out
    );
    for (dir, name, want) in [
        ("cm_rx_msgs", "req", attempts),
        ("cm_tx_msgs", "rep", 1),
        ("cm_rx_msgs", "rtu", 1),
        ("cm_rx_msgs", "dreq", 1),
        ("cm_tx_msgs", "drep", 1),
        ("cm_tx_msgs", "rej", attempts - 1),
        ("cm_rx_duplicates", "req", 0),
        ("cm_tx_retries", "rep", 0),
    ] {
        assert_eq!(cm_counter(&peer, dir, name), want, "guest {dir}/{name}");
    }
    let (rx, tx, dropped) = qp1(&dev);
    // In: a REJ per early attempt, the REP, the DREP. Out: the REQs, the RTU, the DREQ.
    assert_eq!((rx, tx, dropped), (attempts + 1, attempts + 2, 0));
    drop(dev);
    drop(peer);
}

/// The guest's `udaddy -s` asks our CM for the UD QP behind UDP port 7174 (SIDR, IBTA 12.11):
/// the SIDR_REQ reaches our listener through roce_xdp and QP 1 with the RDMA CM IP header, and
/// the kernel takes our SIDR_REP (RDMA CM's UDP Q_Key). udaddy's data phase is not ours here
/// (no UD QP behind the QPN we name), so the guest's run is cut short by `timeout` (its stdout
/// line-buffered so that what it printed survives).
#[test]
fn the_guests_udaddy_resolves_our_ud_service_over_qp1() {
    require_root();
    let peer = Peer::boot(&tag("q3"), 76, &PeerOptions::default());
    let dev = open(&peer);
    let sid = dev.cm_listen_ud(7174).expect("listen");
    let u = peer.spawn(&format!(
        "timeout 20 stdbuf -oL udaddy -s {} -C 1",
        peer.host_ip
    ));
    let (id, from, req) = match dev.wait_cm_event(Duration::from_secs(60)) {
        Some(CmEvent::SidrRequest { id, from, req }) => (id, from, req),
        e => panic!(
            "no SIDR_REQ from udaddy: {e:?}; guest: {}",
            peer.wait_or_kill(&u, Duration::ZERO).out
        ),
    };
    assert_eq!(from, Gid::from_ip(IpAddr::V4(peer.guest_ip)));
    assert_eq!(req.service_id, sid);
    let h = CmaHdr::parse(&req.private_data).expect("RDMA CM IP header");
    assert_eq!(
        (h.src, h.dst),
        (IpAddr::V4(peer.guest_ip), IpAddr::V4(peer.host_ip))
    );
    // RDMA CM's Q_Key for the UDP port space (RDMA_UDP_QKEY): the kernel checks it.
    dev.cm_sidr_reply(
        id,
        SidrStatus::SUCCESS,
        Qpn::new(0x1234),
        QKey::new(0x0123_4567),
        &[],
    )
    .expect("SIDR reply");
    let out = peer.wait_or_kill(&u, Duration::from_secs(60));
    assert_eq!(
        cm_counter(&peer, "cm_tx_msgs", "sidr_req"),
        1,
        "{}",
        out.out
    );
    assert_eq!(
        cm_counter(&peer, "cm_rx_msgs", "sidr_rep"),
        1,
        "{}",
        out.out
    );
    assert_eq!(cm_counter(&peer, "cm_tx_retries", "sidr_req"), 0);
    // udaddy starts its data phase only once every SIDR_REP was taken (its "resolved"
    // handler created the address handle from our QPN and Q_Key).
    assert!(
        out.out.contains("initiating data transfers"),
        "udaddy did not take our SIDR_REP: {}",
        out.out
    );
    assert_eq!(qp1(&dev), (1, 1, 0));
    drop(dev);
    drop(peer);
}

/// The ping lines `rping -v` printed (`ping data: rdma-ping-N: ...`, the server's prefixed
/// with "server").
fn rping_lines(out: &str) -> usize {
    out.lines()
        .filter(|l| l.contains("ping data: rdma-ping-"))
        .count()
}

/// Debian's unmodified `rping` on the drop-in librdmacm (`roce exec`) connects to rxe's and
/// rxe's connects to ours, over the kernel's CM in the guest: the connect request, reply and
/// RTU, RDMA READ and WRITE of every ping with `-V` (each side checks the payload), and the
/// disconnect. One VM for both directions.
#[test]
fn rping_on_the_drop_in_librdmacm_connects_to_and_from_rxe() {
    require_root();
    const COUNT: usize = 50;
    let peer = Peer::boot(&tag("q4"), 77, &PeerOptions::default());
    // A program killed at a timeout cannot unload what it loaded: the pins go with the test.
    let _unpin = Loaded::guard(&peer.ifname);
    let ours = |args: &[String]| {
        // Line-buffered, so that a stuck run's output says how far it got.
        let mut v: Vec<String> = ["exec", "-d", &peer.ifname, "--", "stdbuf", "-oL", "rping"]
            .map(String::from)
            .to_vec();
        v.extend(args.iter().cloned());
        roce_tests::child::spawn(&peer.netns, &v)
    };
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    // 1. Our client, the guest's server. The guest's rping listens some time after it
    // starts; until then its kernel rejects (invalid service ID) and our client exits with
    // an error: try again.
    let s = peer.spawn(&format!(
        "rping -s -v -V -a {} -p 7175 -C {COUNT}",
        peer.guest_ip
    ));
    std::thread::sleep(Duration::from_secs(2));
    let mut attempts = 0;
    let client = loop {
        attempts += 1;
        let rr = ours(&[
            "-c".into(),
            "-v".into(),
            "-V".into(),
            "-a".into(),
            peer.guest_ip.to_string(),
            "-p".into(),
            "7175".into(),
            "-C".into(),
            COUNT.to_string(),
        ]);
        let c = roce_tests::child::finish_within(rr, Duration::from_secs(60), "our rping -c");
        let out = text(&c);
        if c.status.success() || !out.contains("REJECTED") || attempts >= 20 {
            break (c.status.success(), out);
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let server = peer.wait_or_kill(&s, Duration::from_secs(60));
    assert!(
        client.0,
        "our rping -c failed:\n{}\nguest's rping -s:\n{}",
        client.1, server.out
    );
    assert_eq!(rping_lines(&client.1), COUNT, "our client:\n{}", client.1);
    assert_eq!(server.rc, 0, "guest's rping -s:\n{}", server.out);
    assert_eq!(
        rping_lines(&server.out),
        COUNT,
        "guest's server:\n{}",
        server.out
    );
    for (dir, name, want) in [
        ("cm_rx_msgs", "req", attempts),
        ("cm_tx_msgs", "rep", 1),
        ("cm_rx_msgs", "rtu", 1),
        ("cm_tx_retries", "rep", 0),
        ("cm_rx_duplicates", "req", 0),
    ] {
        assert_eq!(
            cm_counter(&peer, dir, name),
            want,
            "guest {dir}/{name}; our client:\n{}",
            client.1
        );
    }

    // 2. The guest's client, our server. Ours listens once its library has started the
    // engine: the guest's client retries while it is rejected.
    let server = ours(&[
        "-s".into(),
        "-v".into(),
        "-V".into(),
        "-a".into(),
        peer.host_ip.to_string(),
        "-p".into(),
        "7176".into(),
        "-C".into(),
        COUNT.to_string(),
    ]);
    let c = peer.spawn(&format!(
        "for i in $(seq 30); do out=$(rping -c -v -V -a {} -p 7176 -C {COUNT} 2>&1); rc=$?; \
         echo \"$out\"; case \"$out\" in *REJECTED*) sleep 1;; *) exit $rc;; esac; done; exit 1",
        peer.host_ip
    ));
    let guest = peer.wait_or_kill(&c, Duration::from_secs(120));
    let ours_out =
        roce_tests::child::finish_within(server, Duration::from_secs(60), "our rping -s");
    let ours_text = text(&ours_out);
    assert_eq!(
        guest.rc, 0,
        "guest's rping -c:\n{}\nour rping -s:\n{ours_text}",
        guest.out
    );
    assert!(ours_out.status.success(), "our rping -s:\n{ours_text}");
    assert_eq!(
        guest
            .out
            .lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        COUNT,
        "guest's client:\n{}",
        guest.out
    );
    assert_eq!(rping_lines(&ours_text), COUNT, "our server:\n{ours_text}");
    for (dir, name, want) in [
        ("cm_tx_msgs", "rep", 1),
        ("cm_rx_msgs", "rep", 1),
        ("cm_tx_msgs", "rtu", 1),
        ("cm_tx_retries", "req", 0),
        ("cm_rx_duplicates", "rep", 0),
    ] {
        assert_eq!(
            cm_counter(&peer, dir, name),
            want,
            "guest {dir}/{name}; our server:\n{ours_text}"
        );
    }
    drop(peer);
}
