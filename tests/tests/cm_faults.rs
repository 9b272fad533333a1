//! Faults in connection management (issue 18, item 3): two roce-xdp endpoints connect through
//! their CMs on QP 1 across a router (`roce_tests::routed::Impaired`) whose egress runs
//! `roce impair --mad <message>`, which drops or duplicates exactly the chosen CM message
//! (AF_XDP transmit skips the sender's own tc egress, so the faults sit on the router). Each
//! case checks the outcome at both ends and the impair counters:
//! - a lost REQ is resent and the connection established;
//! - a lost REP is recovered (the REQ resent, answered by the passive side's REP again, and its
//!   own REP timer), with one connect request at the passive side;
//! - a lost RTU is recovered by the passive side's REP resend, which the active side answers
//!   with its RTU again (cm.c `cm_dup_rep_handler`); our CM is not told of the QP's first
//!   packet, so this is the path that establishes it;
//! - with every REQ lost, the active side gets a clean `TimedOut` (RDMA CM's UNREACHABLE)
//!   after its retries and the passive side is left with nothing;
//! - a duplicated REQ makes one connection (cm.c `cm_dup_req_handler`), which works;
//! - unmodified `rping` on the drop-in librdmacm survives a lost REQ and a lost RTU, and then
//!   moves and verifies its data.
//!
//! The Rust API cases connect with a 268 ms CM response timeout (each resend after 2 × 1.07 s
//! packet lifetime + 268 ms, about 2.4 s), so each takes seconds; rping uses RDMA CM's
//! defaults (a resend after 6.4 s). A REQ to a port with no listener answered by REJ "invalid
//! service ID" is in tests/tests/cm_qp1.rs and interop_cm.rs. Veth subnets 140-149. Root.

use std::{net::IpAddr, sync::Arc, time::Duration};

use roce::{
    api::{CmAccept, CmConnect, CmEvent, CmState, CommId, Device, DeviceOptions, IbaTime},
    loader::Pins,
    netns::{self, VethEnd},
    transport::{Psn, Qpn},
};
use roce_common::impair::ImpairStats;
use roce_tests::{
    child::finish_within,
    output_text,
    rdmacm::{args, ours, servers_client_on},
    routed::{Impaired, roce_json},
};

/// The CM response timeout of the API cases: 268 ms.
const RESPONSE: u8 = 16;
/// Longest wait for one CM event: several resends at 2.4 s.
const WAIT: Duration = Duration::from_secs(15);
/// The port the server listens on.
const PORT: u16 = 7300;

fn open(end: &VethEnd) -> Arc<Device> {
    let ifname = end.ifname.clone();
    let dev = netns::in_netns(&end.netns, move || {
        Device::open(&ifname, &DeviceOptions::default())
    })
    .expect("enter namespace")
    .expect("open device");
    Arc::new(dev)
}

/// A topology, the client's and the server's devices, the server listening on [`PORT`].
struct Ends {
    a: Arc<Device>,
    b: Arc<Device>,
    // Last: the devices close before the topology goes.
    net: Impaired,
}

fn ends(name: &str, subnet: u8) -> Ends {
    let mut net = Impaired::new(name, subnet, 1500);
    for end in [net.client().clone(), net.server().clone()] {
        net.unload_on_drop(&end);
    }
    let (a, b) = (open(net.client()), open(net.server()));
    b.cm_listen(PORT).expect("listen");
    Ends { a, b, net }
}

impl Ends {
    /// A's request to B's listener, with the short response timeout and `retries` resends.
    fn connect(&self, retries: u8) -> CommId {
        let mut c = CmConnect::new(
            IpAddr::V4(self.net.server().ipv4),
            PORT,
            40100,
            Qpn::new(0x41),
            Psn::new(2),
        );
        c.cm_response_timeout = Some(IbaTime::new(RESPONSE));
        c.max_cm_retries = Some(retries);
        let d = Arc::clone(&self.a);
        netns::in_netns(&self.net.client().netns, move || d.cm_connect(&c))
            .expect("enter namespace")
            .expect("cm_connect")
    }

    /// B's one connect request, accepted; A's reply, answered with the RTU; both established.
    /// Returns (A's ID, B's ID).
    fn establish(&self, id_a: CommId) -> (CommId, CommId) {
        let id_b = match self.b.wait_cm_event(WAIT) {
            Some(CmEvent::ConnectRequest { id, req, .. }) => {
                assert_eq!(req.local_qpn, Qpn::new(0x41));
                id
            }
            e => panic!("no connect request at B: {e:?}"),
        };
        self.b
            .cm_accept(id_b, &CmAccept::new(Qpn::new(0x51), Psn::new(3)))
            .expect("accept");
        match self.a.wait_cm_event(WAIT) {
            Some(CmEvent::Reply { id, rep }) => {
                assert_eq!(id, id_a);
                assert_eq!(rep.local_qpn, Qpn::new(0x51));
            }
            e => panic!("no REP at A: {e:?}"),
        }
        self.a.cm_ready(id_a, &[]).expect("RTU");
        assert_eq!(
            self.a.wait_cm_event(WAIT),
            Some(CmEvent::Established { id: id_a })
        );
        assert_eq!(
            self.b.wait_cm_event(WAIT),
            Some(CmEvent::Established { id: id_b })
        );
        assert_eq!(self.a.cm_state(id_a), Some(CmState::Established));
        assert_eq!(self.b.cm_state(id_b), Some(CmState::Established));
        (id_a, id_b)
    }

    /// The connection works to its end: A disconnects, both see it and go through TimeWait;
    /// then no event is left at either end (no second connection, nothing late).
    fn disconnect(&self, (id_a, id_b): (CommId, CommId)) {
        self.a.cm_disconnect(id_a, b"bye").expect("disconnect");
        assert!(
            matches!(self.b.wait_cm_event(WAIT), Some(CmEvent::Disconnected { id, .. }) if id == id_b),
            "no DREQ at B"
        );
        assert!(
            matches!(self.a.wait_cm_event(WAIT), Some(CmEvent::Disconnected { id, .. }) if id == id_a),
            "no DREP at A"
        );
        assert_eq!(
            self.a.wait_cm_event(WAIT),
            Some(CmEvent::TimeWaitExit { id: id_a })
        );
        assert_eq!(
            self.b.wait_cm_event(WAIT),
            Some(CmEvent::TimeWaitExit { id: id_b })
        );
        self.quiet();
    }

    /// Neither end has an event left, for a second.
    fn quiet(&self) {
        assert_eq!(self.a.wait_cm_event(Duration::from_secs(1)), None, "at A");
        assert_eq!(self.b.poll_cm_event(), None, "at B");
    }

    fn impair(&mut self, towards_server: bool, settings: &str) -> String {
        let ifname = if towards_server {
            self.net.to_server()
        } else {
            self.net.to_client()
        };
        self.net.impair(&ifname, settings);
        ifname
    }

    fn stats(&self, ifname: &str) -> ImpairStats {
        self.net.impair_stats(ifname)
    }

    /// (retransmits, duplicates, unexpected, malformed) of a CM.
    fn cm(dev: &Device) -> (u64, u64, u64, u64) {
        let (c, _) = dev.cm_stats().expect("CM stats");
        (c.retransmits, c.duplicates, c.unexpected, c.malformed)
    }
}

#[test]
fn a_lost_req_is_resent_and_the_connection_established() {
    let mut e = ends("cmf1", 140);
    let ifname = e.impair(true, "--mad req --drop 1 --limit 1");
    let ids = e.establish(e.connect(3));
    let s = e.stats(&ifname);
    assert_eq!(s.dropped, 1, "{s:?}");
    assert_eq!(s.over_limit, 1, "the resent REQ went through: {s:?}");
    let show = roce_json(
        &e.net.net.router_netns,
        &format!("impair -i {ifname} --show"),
    );
    assert_eq!(show["limit_used"], 1, "{show}");
    assert_eq!(show["settings"]["mad_attr"], 0x10, "{show}");
    assert_eq!(Ends::cm(&e.a).0, 1, "A resent its REQ once");
    assert_eq!(Ends::cm(&e.b), (0, 0, 0, 0), "B saw one REQ");
    e.disconnect(ids);
}

#[test]
fn a_lost_rep_is_recovered_with_one_connection_at_the_passive_side() {
    let mut e = ends("cmf2", 141);
    let ifname = e.impair(false, "--mad rep --drop 1 --limit 1");
    let ids = e.establish(e.connect(3));
    let s = e.stats(&ifname);
    assert_eq!(s.dropped, 1, "{s:?}");
    assert!(s.over_limit >= 1, "a REP was resent: {s:?}");
    // A resent its REQ or B its REP first (both after 2.4 s): B answered a resent REQ as a
    // duplicate (with its REP again), never as a new request; establish saw exactly one.
    let (a_re, _, _, _) = Ends::cm(&e.a);
    let (b_re, b_dup, _, b_bad) = Ends::cm(&e.b);
    assert!(a_re + b_re >= 1, "nobody resent anything");
    assert_eq!(b_dup, a_re, "each resent REQ is a duplicate at B");
    assert_eq!(b_bad, 0);
    e.disconnect(ids);
}

#[test]
fn a_lost_rtu_is_recovered_by_the_rep_resend() {
    let mut e = ends("cmf3", 142);
    let ifname = e.impair(true, "--mad rtu --drop 1 --limit 1");
    let ids = e.establish(e.connect(3));
    let s = e.stats(&ifname);
    assert_eq!(s.dropped, 1, "{s:?}");
    assert_eq!(s.over_limit, 1, "the second RTU went through: {s:?}");
    // B resent its REP; A, established, took it as a duplicate and sent its RTU again.
    assert!(Ends::cm(&e.b).0 >= 1, "B never resent its REP");
    assert!(Ends::cm(&e.a).1 >= 1, "A saw no duplicate REP");
    e.disconnect(ids);
}

#[test]
fn with_every_req_lost_the_active_side_times_out_cleanly() {
    let mut e = ends("cmf4", 143);
    let ifname = e.impair(true, "--mad req --drop 1");
    let t = std::time::Instant::now();
    let id = e.connect(2);
    // One REQ and 2 resends, each waited for 2.4 s: about 7.2 s.
    assert_eq!(
        e.a.wait_cm_event(Duration::from_secs(20)),
        Some(CmEvent::TimedOut { id })
    );
    let took = t.elapsed();
    assert!(
        (Duration::from_secs(6)..Duration::from_secs(15)).contains(&took),
        "timed out after {took:?}"
    );
    assert_eq!(e.a.cm_state(id), None, "A keeps nothing");
    let s = e.stats(&ifname);
    assert_eq!((s.dropped, s.over_limit), (3, 0), "{s:?}");
    assert_eq!(Ends::cm(&e.a).0, 2);
    // B never heard of it: no event; A's REJ TIMEOUT (not a REQ, so it passed) names no
    // connection of B's and is dropped as unexpected.
    e.quiet();
    let (_, _, unexpected, malformed) = Ends::cm(&e.b);
    assert_eq!((unexpected, malformed), (1, 0), "B got A's REJ TIMEOUT");
    let (c, _) = e.b.cm_stats().expect("CM stats");
    assert_eq!(c.sent, 0, "B sent nothing");
}

#[test]
fn a_duplicated_req_makes_one_connection() {
    let mut e = ends("cmf5", 144);
    let ifname = e.impair(true, "--mad req --dup 1");
    let ids = e.establish(e.connect(3));
    let s = e.stats(&ifname);
    assert_eq!((s.duplicated, s.dropped), (1, 0), "{s:?}");
    // B took the copy as a duplicate of the request it was holding (cm.c: a duplicate REQ
    // in REQ_RCVD is dropped), so establish saw one connect request, and nothing else.
    assert_eq!(Ends::cm(&e.b).1, 1, "B counted the duplicate REQ");
    e.disconnect(ids);
}

fn rping(role: &str, ip: &str, port: u16) -> Vec<String> {
    args(&[
        role,
        "-v",
        "-V",
        "-S",
        "128",
        "-C",
        "10",
        "-p",
        &port.to_string(),
        "-a",
        ip,
    ])
}

fn pings(out: &str) -> usize {
    out.lines()
        .filter(|l| l.contains("ping data: rdma-ping-"))
        .count()
}

/// Unmodified rping on the drop-in librdmacm with the RTU lost: the server's library is
/// established by the REP resend (RDMA CM's 6.4 s), and all 10 pings go through and verify.
#[test]
fn rping_survives_a_lost_rtu() {
    let mut net = Impaired::new("cmf6", 145, 1500);
    let (client, server) = (net.client().clone(), net.server().clone());
    net.unload_on_drop(&client);
    net.unload_on_drop(&server);
    let ifname = net.to_server();
    net.impair(&ifname, "--mad rtu --drop 1 --limit 1");
    let ip = server.ipv4.to_string();
    let (c, s) = servers_client_on(
        (&server, ("rping", &rping("-s", &ip, 7301))),
        (&client, ("rping", &rping("-c", &ip, 7301))),
    );
    assert_eq!(pings(&c), 10, "client:\n{c}");
    assert_eq!(pings(&s), 10, "server:\n{s}");
    let st = net.impair_stats(&ifname);
    assert_eq!(st.dropped, 1, "{st:?}");
}

/// Unmodified rping with its first REQ lost: the library resends it after RDMA CM's 6.4 s and
/// the pings go through. The drop is set only once the server listens (its process holds QP 1),
/// so it hits the client's first REQ, not one sent before the listener was there.
#[test]
fn rping_survives_a_lost_req() {
    let mut net = Impaired::new("cmf7", 146, 1500);
    let (client, server) = (net.client().clone(), net.server().clone());
    net.unload_on_drop(&client);
    net.unload_on_drop(&server);
    let ip = server.ipv4.to_string();
    let srv = ours(&server, "rping", &rping("-s", &ip, 7302));
    let pins = Pins::new(&server.ifname);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !pins
        .qps()
        .is_ok_and(|q| q.get(&Qpn::GSI.value(), 0).is_ok())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the rping server never took QP 1"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // rdma_listen follows the bind that enabled the CM at once.
    std::thread::sleep(Duration::from_millis(500));
    let ifname = net.to_server();
    net.impair(&ifname, "--mad req --drop 1 --limit 1");
    let limit = Duration::from_secs(60);
    let c = finish_within(
        ours(&client, "rping", &rping("-c", &ip, 7302)),
        limit,
        "rping client",
    );
    let s = finish_within(srv, limit, "rping server");
    let (ct, st) = (output_text(&c), output_text(&s));
    assert!(
        c.status.success() && s.status.success(),
        "client ({}):\n{ct}\nserver ({}):\n{st}",
        c.status,
        s.status
    );
    assert_eq!(pings(&ct), 10, "client:\n{ct}");
    assert_eq!(pings(&st), 10, "server:\n{st}");
    let i = net.impair_stats(&ifname);
    assert_eq!((i.dropped, i.over_limit), (1, 1), "{i:?}");
}
