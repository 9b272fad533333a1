//! Two roce-xdp devices, each running the CM on its QP 1, connect to each other over a veth
//! pair: every MAD goes through roce_xdp, AF_XDP and the engines (no raw socket). A REQ to a
//! port nobody listens on is rejected with "invalid service ID"; a REQ to a listener reaches
//! it with the RDMA CM IP header and the consumer's private data, the REP carries the
//! acceptor's, the RTU establishes both sides, a DREQ disconnects both, and TimeWait ends on
//! both (the CM's timers run by the engines). Root.

use std::{net::IpAddr, sync::Arc, time::Duration};

use roce::{
    api::{CmAccept, CmConnect, CmEvent, CmState, Device, DeviceOptions, RejReason},
    ibcm::{CmaHdr, Gid, ip::CMA_HDR_LEN},
    netns::{self, VethEnd, VethOptions, VethPair},
    transport::{Psn, Qpn},
};
use roce_tests::{require_root, tag, veth_pair};

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

    // B listens on 7174; A's request carries "hello" after the RDMA CM IP header.
    b.cm_listen(7174).expect("listen");
    let mut c = CmConnect::new(b_ip, 7174, 40002, Qpn::new(0x41), Psn::new(2));
    c.private_data = b"hello".to_vec();
    let id_a = connect(&a, &pair.a, c);
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
