//! Two roce-xdp devices, each running the CM on its QP 1, connect to each other over a veth
//! pair: every MAD goes through roce_xdp, AF_XDP and the engines (no raw socket). A REQ to a
//! port nobody listens on is rejected with "invalid service ID"; a REQ to a listener reaches
//! it with the RDMA CM IP header and the consumer's private data, the REP carries the
//! acceptor's, the RTU establishes both sides, a DREQ disconnects both, and TimeWait ends on
//! both (the CM's timers run by the engines). Root.

use std::{net::IpAddr, sync::Arc, time::Duration};

use roce::{
    api::{
        ApiError, CmAccept, CmConnect, CmEvent, CmState, Device, DeviceOptions, RejReason,
        SidrStatus,
    },
    ibcm::{
        CaGuid, Cm, CmConfig, CmMad, CmMsg, CmaHdr, ConnectParams, Gid, PortSpace, ServiceId,
        ip::CMA_HDR_LEN,
    },
    loader::Pins,
    netns::{self, VethEnd, VethOptions, VethPair},
    transport::{Psn, Qpn},
    wire::{
        BthRepr, DethRepr, EthernetAddress, IpPath, Opcode, PKey, PathRepr, QKey, RoceRepr,
        emit_frame,
    },
};
use roce_tests::{RawPort, require_root, tag, veth_pair};

fn open(end: &VethEnd, sharded: bool) -> Arc<Device> {
    let ifname = end.ifname.clone();
    let dev = netns::in_netns(&end.netns, move || {
        Device::open(
            &ifname,
            &DeviceOptions {
                sharded,
                ..DeviceOptions::default()
            },
        )
    })
    .expect("enter namespace")
    .expect("open device");
    Arc::new(dev)
}

/// `dev.cm_connect(c)` in `end`'s namespace (the path comes from its neighbour table).
fn connect(dev: &Arc<Device>, end: &VethEnd, c: CmConnect) -> roce::api::CommId {
    let d = Arc::clone(dev);
    netns::in_netns(&end.netns, move || d.cm_connect(&c))
        .expect("enter namespace")
        .expect("cm_connect")
}

fn qp1_counters(dev: &Device) -> (u64, u64, u64, u64) {
    let (_, qps) = dev.counters();
    let c = qps
        .iter()
        .find(|(q, _)| *q == Qpn::GSI)
        .map(|(_, c)| *c)
        .expect("QP 1 among the device's QPs");
    (c.rcvd_pkts, c.sent_pkts, c.rx_dropped, c.send_err)
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn two_roce_xdp_devices_connect_through_their_cms_on_qp1() {
    require_root();
    let pair = veth_pair("cq1", 231);
    connect_and_disconnect(&pair, false, false);
}

/// The same over IPv6 GIDs: the REQ's RDMA CM header names IPv6 addresses, and every MAD
/// goes in a RoCE v2 frame over IPv6.
#[test]
fn two_roce_xdp_devices_connect_through_their_cms_on_qp1_over_ipv6() {
    require_root();
    let pair = veth_pair("cq3", 233);
    connect_and_disconnect(&pair, false, true);
}

/// The same with two RX queues per end and one transport per queue: QP 1 lives in the
/// transport that owns QPN 1 (`Shard::of_qpn`), which the engines route MADs to whichever
/// queue receives them, and the API drives.
#[test]
fn cms_on_qp1_of_sharded_devices_connect() {
    require_root();
    let pair = VethPair::new(
        &tag("cq2"),
        &VethOptions {
            subnet: 232,
            queues: 2,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    connect_and_disconnect(&pair, true, false);
}

fn connect_and_disconnect(pair: &VethPair, sharded: bool, ipv6: bool) {
    let (a, b) = (open(&pair.a, sharded), open(&pair.b, sharded));
    if sharded {
        assert_eq!((a.shards(), b.shards()), (2, 2));
    }
    let (a_ip, b_ip) = if ipv6 {
        (IpAddr::V6(pair.a.ipv6), IpAddr::V6(pair.b.ipv6))
    } else {
        (IpAddr::V4(pair.a.ipv4), IpAddr::V4(pair.b.ipv4))
    };
    b.cm_enable().expect("B's CM");
    assert_ne!(a.node_guid(), b.node_guid());

    // Nobody listens on 7175 at B.
    let closed = connect(
        &a,
        &pair.a,
        CmConnect::new(b_ip, 7175, 40001, Qpn::new(0x40), Psn::new(1)),
    );
    match a.wait_cm_event(WAIT) {
        Some(CmEvent::Rejected { id, reason, .. }) => {
            assert_eq!(id, closed);
            assert_eq!(reason, RejReason::INVALID_SERVICE_ID);
        }
        e => panic!("no REJ for a closed port: {e:?}"),
    }
    assert_eq!(a.cm_state(closed), None);

    let (id_a, id_b) = establish(pair, (&a, a_ip), (&b, b_ip), 7174);

    // A disconnects: B gets the DREQ, A the DREP; both go through TimeWait.
    a.cm_disconnect(id_a, b"bye").expect("disconnect");
    match b.wait_cm_event(WAIT) {
        Some(CmEvent::Disconnected { id, private_data }) => {
            assert_eq!(id, id_b);
            assert_eq!(&private_data[..3], b"bye".as_slice());
        }
        e => panic!("no DREQ at B: {e:?}"),
    }
    assert!(
        matches!(a.wait_cm_event(WAIT), Some(CmEvent::Disconnected { id, .. }) if id == id_a),
        "no DREP at A"
    );
    assert_eq!(
        a.wait_cm_event(WAIT),
        Some(CmEvent::TimeWaitExit { id: id_a })
    );
    assert_eq!(
        b.wait_cm_event(WAIT),
        Some(CmEvent::TimeWaitExit { id: id_b })
    );
    assert_eq!((a.cm_state(id_a), b.cm_state(id_b)), (None, None));

    // A sent REQ, REQ, RTU, DREQ and received REJ, REP, DREP; B the other way round.
    // Nothing dropped, nothing unsendable, no retransmission.
    assert_eq!(qp1_counters(&a), (3, 4, 0, 0));
    assert_eq!(qp1_counters(&b), (4, 3, 0, 0));
    for d in [&a, &b] {
        let (cm, gsi) = d.cm_stats().expect("CM stats");
        assert_eq!((cm.retransmits, cm.malformed, cm.unexpected), (0, 0, 0));
        assert_eq!(gsi, Default::default());
    }
    assert_eq!(b.cm_stats().unwrap().0.no_listener, 1);
    drop(a);
    drop(b);
}

/// B listens on `port` and A connects to it through both CMs on QP 1, checking every step;
/// returns (A's ID, B's ID) once both are established.
fn establish(
    pair: &VethPair,
    (a, a_ip): (&Arc<Device>, IpAddr),
    (b, b_ip): (&Arc<Device>, IpAddr),
    port: u16,
) -> (roce::api::CommId, roce::api::CommId) {
    // B listens on `port`; A's request carries "hello" after the RDMA CM IP header.
    b.cm_listen(port).expect("listen");
    let mut c = CmConnect::new(b_ip, port, 40002, Qpn::new(0x41), Psn::new(2));
    c.private_data = b"hello".to_vec();
    let id_a = connect(a, &pair.a, c);
    let (id_b, from, req) = match b.wait_cm_event(WAIT) {
        Some(CmEvent::ConnectRequest { id, from, req }) => (id, from, req),
        e => panic!("no connect request at B: {e:?}"),
    };
    assert_eq!(from, Gid::from_ip(a_ip));
    let h = CmaHdr::parse(&req.private_data).expect("RDMA CM IP header");
    assert_eq!((h.src, h.dst, h.src_port), (a_ip, b_ip, 40002));
    assert_eq!(
        &req.private_data[CMA_HDR_LEN..CMA_HDR_LEN + 5],
        b"hello".as_slice()
    );
    assert_eq!(req.local_qpn, Qpn::new(0x41));
    assert_eq!(req.local_ca_guid, a.node_guid());
    let mut acc = CmAccept::new(Qpn::new(0x51), Psn::new(3));
    acc.private_data = b"world".to_vec();
    b.cm_accept(id_b, &acc).expect("accept");
    let rep = match a.wait_cm_event(WAIT) {
        Some(CmEvent::Reply { id, rep }) => {
            assert_eq!(id, id_a);
            rep
        }
        e => panic!("no REP at A: {e:?}"),
    };
    assert_eq!(rep.local_qpn, Qpn::new(0x51));
    assert_eq!(rep.local_ca_guid, b.node_guid());
    assert_eq!(&rep.private_data[..5], b"world".as_slice());
    a.cm_ready(id_a, &[]).expect("RTU");
    assert_eq!(
        a.wait_cm_event(WAIT),
        Some(CmEvent::Established { id: id_a })
    );
    assert_eq!(
        b.wait_cm_event(WAIT),
        Some(CmEvent::Established { id: id_b })
    );
    assert_eq!(a.cm_state(id_a), Some(CmState::Established));
    assert_eq!(b.cm_state(id_b), Some(CmState::Established));

    (id_a, id_b)
}

/// A device that closes ends its connections towards their peers as the kernel ends a
/// process's RDMA CM IDs at exit (cm.c `cm_destroy_id`): an established connection with a
/// DREQ, a request still unanswered with a REJ TIMEOUT naming its CA GUID, which the passive
/// side matches without knowing our ID.
#[test]
fn a_closing_device_ends_its_connections_towards_their_peers() {
    require_root();
    let pair = veth_pair("cq4", 234);
    let (a, b) = (open(&pair.a, false), open(&pair.b, false));
    let (a_ip, b_ip) = (IpAddr::V4(pair.a.ipv4), IpAddr::V4(pair.b.ipv4));
    b.cm_enable().expect("B's CM");
    let (_, id_b) = establish(&pair, (&a, a_ip), (&b, b_ip), 7176);
    // A second request that B holds without answering.
    b.cm_listen(7177).expect("listen");
    let _pending = connect(
        &a,
        &pair.a,
        CmConnect::new(b_ip, 7177, 40003, Qpn::new(0x42), Psn::new(4)),
    );
    let pending_b = match b.wait_cm_event(WAIT) {
        Some(CmEvent::ConnectRequest { id, .. }) => id,
        e => panic!("no second connect request at B: {e:?}"),
    };
    drop(a);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match b.wait_cm_event(WAIT) {
            Some(e) => seen.push(e),
            None => panic!("B heard only {seen:?} of A's close"),
        }
    }
    assert!(
        seen.iter()
            .any(|e| matches!(e, CmEvent::Disconnected { id, .. } if *id == id_b)),
        "no DREQ for the established connection: {seen:?}"
    );
    assert!(
        seen.iter().any(|e| matches!(
            e,
            CmEvent::Rejected { id, reason, .. } if *id == pending_b && *reason == RejReason::TIMEOUT
        )),
        "no REJ TIMEOUT for the pending request: {seen:?}"
    );
    assert_eq!(b.cm_state(pending_b), None);
    assert_eq!(b.cm_state(id_b), Some(CmState::TimeWait));
    let (cm, gsi) = b.cm_stats().expect("CM stats");
    assert_eq!((cm.malformed, cm.unexpected), (0, 0));
    assert_eq!(gsi, Default::default());
}

/// A RoCE v2 frame from A to B's QP 1 carrying `payload`, as rxe would send a MAD, with `edit`
/// applied to its headers first.
fn to_qp1(pair: &VethPair, payload: &[u8], edit: impl FnOnce(&mut RoceRepr)) -> Vec<u8> {
    let mut path = PathRepr::new(
        EthernetAddress(pair.a.mac),
        EthernetAddress(pair.b.mac),
        IpPath::V4 {
            src: pair.a.ipv4,
            dst: pair.b.ipv4,
        },
    );
    path.udp_src_port = roce::wire::frame::rxe_udp_src_port(Qpn::GSI);
    let mut r = RoceRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(0)));
    r.deth = Some(DethRepr {
        qkey: QKey::GSI,
        src_qp: Qpn::GSI,
    });
    edit(&mut r);
    let mut buf = vec![0u8; 1024];
    let n = emit_frame(&path, &r, payload, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

/// `n` REQs from a CM of our own (sans-I/O, on the test's side) to B's port `port`.
fn reqs(pair: &VethPair, port: u16, n: usize) -> Vec<[u8; 256]> {
    let mut cm = Cm::new(CmConfig::new(CaGuid(0x0200_00ff_fe00_0001)));
    let (a, b) = (IpAddr::V4(pair.a.ipv4), IpAddr::V4(pair.b.ipv4));
    (0..n)
        .map(|i| {
            let p = ConnectParams::rdma_cm(
                (a, 40000).into(),
                (b, port).into(),
                Qpn::new(0x100 + i as u32),
                Psn::new(1),
                &[],
            );
            cm.connect(roce::time::Instant::from_nanos(0), &p)
                .expect("REQ");
            *cm.poll_transmit().expect("a REQ to send").mad
        })
        .collect()
}

/// Hostile input to QP 1 over the real path (roce_xdp, AF_XDP, the engine): frames with the
/// wrong Q_Key, P_Key, length, opcode or management class are counted drops of QP 1 and
/// answered with nothing; a burst of REQs to a port nobody listens on gets one REJ each and
/// leaves no connection behind. Every frame went through roce_xdp's redirect. And QP 1 held by
/// another live process refuses the CM with `EBUSY`.
#[test]
fn hostile_mads_to_qp1_are_counted_drops_and_a_req_burst_is_rejected() {
    require_root();
    let pair = veth_pair("cq4", 234);
    let b = open(&pair.b, false);
    let pins = Pins::new(&pair.b.ifname);
    // QP 1 held by another live process (PID 1 stands for it): the CM is refused, EBUSY.
    pins.add_qp(Qpn::GSI.value(), 1)
        .expect("claim QP 1 for PID 1");
    let taken = b.cm_enable().expect_err("QP 1 is taken");
    assert!(
        matches!(taken, ApiError::CmTaken { owner: 1, .. }),
        "{taken}"
    );
    assert_eq!(taken.errno(), nix::libc::EBUSY);
    pins.remove_qp(Qpn::GSI.value()).expect("release QP 1");
    b.cm_enable().expect("B's CM");
    assert_eq!(
        pins.qps().unwrap().get(&Qpn::GSI.value(), 0).unwrap().owner,
        std::process::id()
    );
    b.cm_listen(7174).expect("listen");
    let xdp_before = pins.xdp_stats().expect("XDP stats");
    let mut port = RawPort::open(&pair.a.netns, &pair.a.ifname).expect("raw port");
    let good = reqs(&pair, 7174, 1)[0];
    let mut bad_class = good;
    bad_class[1] = 0x01; // subnet management, not the CM's class 0x07
    let bad = [
        to_qp1(&pair, &good, |r| {
            r.deth = Some(DethRepr {
                qkey: QKey::new(0x1234),
                src_qp: Qpn::GSI,
            });
        }),
        to_qp1(&pair, &good, |r| r.bth.pkey = PKey::new(0x7fff)),
        to_qp1(&pair, &good[..200], |_| {}),
        to_qp1(&pair, &bad_class, |_| {}),
        to_qp1(&pair, &good, |r| {
            *r = RoceRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::GSI, Psn::new(0)));
        }),
    ];
    port.send_burst(&bad).expect("send");
    std::thread::sleep(Duration::from_millis(500));
    let (_, gsi) = b.cm_stats().expect("CM stats");
    assert_eq!(
        (
            gsi.bad_qkey,
            gsi.bad_pkey,
            gsi.bad_length,
            gsi.not_cm,
            gsi.bad_opcode
        ),
        (1, 1, 1, 1, 1),
        "{gsi:?}"
    );
    assert_eq!(qp1_counters(&b), (0, 0, 5, 0));
    assert_eq!(b.poll_cm_event(), None);

    // A burst of REQs to a closed port: one REJ "invalid service ID" each, sent back to A.
    const BURST: usize = 100;
    let frames: Vec<Vec<u8>> = reqs(&pair, 7199, BURST)
        .iter()
        .map(|m| to_qp1(&pair, m, |_| {}))
        .collect();
    port.send_burst(&frames).expect("send");
    let mut rejs = 0;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while rejs < BURST && std::time::Instant::now() < end {
        for f in port.recv(Duration::from_millis(200)).expect("recv") {
            let Ok(p) = roce::wire::parse_frame(&f) else {
                continue;
            };
            if p.roce.bth.dest_qp == Qpn::GSI && p.icrc_ok {
                let mad = CmMad::decode(p.payload).expect("B's MAD decodes");
                match mad.msg {
                    CmMsg::Rej(r) if r.reason == RejReason::INVALID_SERVICE_ID => rejs += 1,
                    m => panic!("B sent {} instead of a REJ", m.name()),
                }
            }
        }
    }
    assert_eq!(rejs, BURST);
    let (cm, _) = b.cm_stats().expect("CM stats");
    assert_eq!(cm.no_listener, BURST as u64, "{cm:?}");
    assert_eq!(qp1_counters(&b), (BURST as u64, BURST as u64, 5, 0));
    assert_eq!(b.poll_cm_event(), None);
    // Every one of them came through roce_xdp's redirect to our socket, none to the kernel.
    let xdp = pins.xdp_stats().expect("XDP stats");
    assert_eq!(
        xdp.redirected - xdp_before.redirected,
        BURST as u64 + 5,
        "{xdp:?}"
    );
    assert_eq!(xdp.pass_foreign_qp, xdp_before.pass_foreign_qp);
    drop(port);
    drop(b);
}

/// SIDR (IBTA 12.11, what `udaddy` does) between two roce-xdp devices: a request to a UDP
/// port nobody serves is answered "unsupported"; one to a listener reaches it with the RDMA
/// CM IP header, and its reply gives the asker the UD QPN and Q_Key.
#[test]
fn sidr_between_two_roce_xdp_devices() {
    require_root();
    let pair = veth_pair("cq5", 235);
    let (a, b) = (open(&pair.a, false), open(&pair.b, false));
    let (a_ip, b_ip) = (IpAddr::V4(pair.a.ipv4), IpAddr::V4(pair.b.ipv4));
    b.cm_enable().expect("B's CM");
    let sidr = |port: u16, data: &'static [u8]| {
        let d = Arc::clone(&a);
        netns::in_netns(&pair.a.netns, move || {
            d.cm_sidr_request(b_ip, port, 40010, data)
        })
        .expect("enter namespace")
        .expect("SIDR request")
    };
    let closed = sidr(7175, b"");
    match a.wait_cm_event(WAIT) {
        Some(CmEvent::SidrReply { id, rep }) => {
            assert_eq!(id, closed);
            assert_eq!(rep.status, SidrStatus::UNSUPPORTED);
        }
        e => panic!("no SIDR_REP for a closed port: {e:?}"),
    }
    let sid = b.cm_listen_ud(7174).expect("listen");
    assert_eq!(sid, ServiceId::rdma_cm(PortSpace::Udp, 7174));
    let id_a = sidr(7174, b"ud?");
    let (id_b, req) = match b.wait_cm_event(WAIT) {
        Some(CmEvent::SidrRequest { id, from, req }) => {
            assert_eq!(from, Gid::from_ip(a_ip));
            (id, req)
        }
        e => panic!("no SIDR_REQ at B: {e:?}"),
    };
    assert_eq!(req.service_id, sid);
    let h = CmaHdr::parse(&req.private_data).expect("RDMA CM IP header");
    assert_eq!((h.src, h.dst, h.src_port), (a_ip, b_ip, 40010));
    assert_eq!(
        &req.private_data[CMA_HDR_LEN..CMA_HDR_LEN + 3],
        b"ud?".as_slice()
    );
    b.cm_sidr_reply(
        id_b,
        SidrStatus::SUCCESS,
        Qpn::new(0x77),
        QKey::new(0x1111_1111),
        b"ok",
    )
    .expect("SIDR reply");
    match a.wait_cm_event(WAIT) {
        Some(CmEvent::SidrReply { id, rep }) => {
            assert_eq!(id, id_a);
            assert_eq!(rep.status, SidrStatus::SUCCESS);
            assert_eq!(
                (rep.qpn, rep.qkey),
                (Qpn::new(0x77), QKey::new(0x1111_1111))
            );
            assert_eq!(&rep.private_data[..2], b"ok".as_slice());
        }
        e => panic!("no SIDR_REP at A: {e:?}"),
    }
    // A sent two SIDR_REQs and got two SIDR_REPs; nothing retransmitted or dropped.
    assert_eq!(qp1_counters(&a), (2, 2, 0, 0));
    assert_eq!(qp1_counters(&b), (2, 2, 0, 0));
    assert_eq!(a.cm_stats().unwrap().0.retransmits, 0);
    drop(a);
    drop(b);
}
