//! The proof that our CM MAD layouts are right: every CM MAD our CM agent sends in a whole
//! exchange (REQ, MRA, REP, RTU, REJ, DREQ, DREP, SIDR_REQ, SIDR_REP) is wrapped as RoCE v2
//! would carry it (Ethernet / IPv4 or IPv6 / UDP 4791 / BTH UD SEND_ONLY to QP1 / DETH with
//! the GSI Q_Key / the 256-byte MAD / ICRC), written to a pcap, and Wireshark's InfiniBand
//! dissector must decode the MAD header and the CM attribute fields to the values we meant,
//! with no malformed-packet or expert entry. tshark is required: the test fails if it is
//! missing.

mod wire_support;

use std::{net::IpAddr, process::Command};

use roce::{
    ibcm::{
        AcceptParams, CaGuid, Cm, CmConfig, CmMad, CmMsg, CmaHdr, CommId, ConnectParams, Event,
        Gid, PortSpace, ServiceId, SidrStatus,
    },
    time::Instant,
    wire::{
        BthRepr, DethRepr, IpPath, Opcode, PKey, PathRepr, Psn, QKey, Qpn, RoceRepr, emit_frame,
    },
};
use wire_support::{mac, which, write_pcap};

const IP_A: &str = "10.77.0.1";
const IP_B: &str = "10.77.0.2";
const IP6_A: &str = "fd00:77::1";
const IP6_B: &str = "fd00:77::2";

fn gid(ip: &str) -> Gid {
    Gid::from_ip(ip.parse().unwrap())
}

/// Runs a whole life of two agents and returns every MAD sent, as (source, destination, MAD).
fn exchange() -> Vec<(Gid, Gid, Box<[u8; 256]>)> {
    let (ga, gb) = (gid(IP_A), gid(IP_B));
    let mut a = Cm::new(CmConfig::new(CaGuid(0x0200_00ff_fe4d_0001)));
    let mut cb = CmConfig::new(CaGuid(0x0200_00ff_fe4d_0002));
    cb.comm_id_seed = 0x7000_0000;
    let mut b = Cm::new(cb);
    let sid = ServiceId::rdma_cm(PortSpace::Tcp, 7174);
    b.listen(sid).unwrap();
    let udp = ServiceId::rdma_cm(PortSpace::Udp, 7174);
    b.listen(udp).unwrap();
    let now = Instant::ZERO;
    let mut out = Vec::new();
    let pump = |a: &mut Cm, b: &mut Cm, out: &mut Vec<_>| loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit() {
            moved = true;
            let _ = b.handle_mad(now, ga, &t.mad[..]);
            out.push((ga, t.dest, t.mad));
        }
        while let Some(t) = b.poll_transmit() {
            moved = true;
            let _ = a.handle_mad(now, gb, &t.mad[..]);
            out.push((gb, t.dest, t.mad));
        }
        if !moved {
            break;
        }
    };
    let params = |qpn: u32, sid: ServiceId| ConnectParams {
        service_id: sid,
        starting_psn: Psn::new(0xabcdef),
        ..ConnectParams::rdma_cm(
            format!("{IP_A}:40000").parse().unwrap(),
            format!("{IP_B}:7174").parse().unwrap(),
            Qpn::new(qpn),
            Psn::new(0xabcdef),
            b"rping",
        )
    };
    // REQ, MRA, REP, RTU, DREQ, DREP.
    let id = a.connect(now, &params(0x11, sid)).unwrap();
    pump(&mut a, &mut b, &mut out);
    let Some(Event::ConnectRequest { id: bid, .. }) = b.poll_event() else {
        panic!("no connect request")
    };
    b.delay(bid).unwrap();
    let accept = AcceptParams {
        qpn: Qpn::new(0x22),
        starting_psn: Psn::new(0x123456),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        target_ack_delay: 0,
        multipath_hint: false,
        private_data: Vec::new(),
    };
    b.accept(now, bid, &accept).unwrap();
    pump(&mut a, &mut b, &mut out);
    a.ready_to_use(id, &[]).unwrap();
    pump(&mut a, &mut b, &mut out);
    a.disconnect(now, id, &[]).unwrap();
    pump(&mut a, &mut b, &mut out);
    // A REQ and a REP with the multipath hint (docs/multipath.md, "Hints out of band").
    let hinted = ConnectParams {
        multipath_hint: true,
        ..params(0x77, sid)
    };
    a.connect(now, &hinted).unwrap();
    pump(&mut a, &mut b, &mut out);
    let bid = std::iter::from_fn(|| b.poll_event())
        .find_map(|e| match e {
            Event::ConnectRequest { id, req, .. } if req.multipath_hint => Some(id),
            _ => None,
        })
        .expect("a hinted connect request");
    let accept_hinted = AcceptParams {
        multipath_hint: true,
        ..accept.clone()
    };
    b.accept(now, bid, &accept_hinted).unwrap();
    pump(&mut a, &mut b, &mut out);
    // REJ by the consumer, and REJ for no listener.
    a.connect(now, &params(0x33, sid)).unwrap();
    pump(&mut a, &mut b, &mut out);
    let bid = std::iter::from_fn(|| b.poll_event())
        .find_map(|e| match e {
            Event::ConnectRequest { id, .. } => Some(id),
            _ => None,
        })
        .unwrap();
    b.reject(bid, b"no").unwrap();
    pump(&mut a, &mut b, &mut out);
    a.connect(now, &params(0x44, ServiceId::rdma_cm(PortSpace::Tcp, 1)))
        .unwrap();
    pump(&mut a, &mut b, &mut out);
    // SIDR_REQ, SIDR_REP.
    a.sidr_request(now, gb, udp, PKey::DEFAULT, &[]).unwrap();
    pump(&mut a, &mut b, &mut out);
    let sid_req = std::iter::from_fn(|| b.poll_event())
        .find_map(|e| match e {
            Event::SidrRequest { id, .. } => Some(id),
            _ => None,
        })
        .unwrap();
    b.sidr_reply(
        sid_req,
        SidrStatus::SUCCESS,
        Qpn::new(0x55),
        QKey::new(0x1234),
        &[],
    )
    .unwrap();
    pump(&mut a, &mut b, &mut out);
    // Over IPv6: a REQ with an IPv6 RDMA CM header, rejected for want of a listener.
    let mut p6 = params(0x66, ServiceId::rdma_cm(PortSpace::Tcp, 2));
    p6.local = gid(IP6_A);
    p6.remote = gid(IP6_B);
    p6.private_data = CmaHdr {
        src_port: 40000,
        src: IP6_A.parse().unwrap(),
        dst: IP6_B.parse().unwrap(),
    }
    .with_user_data(&[]);
    a.connect(now, &p6).unwrap();
    while let Some(t) = a.poll_transmit() {
        let _ = b.handle_mad(now, gid(IP6_A), &t.mad[..]);
        out.push((gid(IP6_A), t.dest, t.mad));
    }
    while let Some(t) = b.poll_transmit() {
        out.push((gid(IP6_B), t.dest, t.mad));
    }
    out
}

fn frame(src: Gid, dst: Gid, mad: &[u8; 256], i: u32) -> Vec<u8> {
    let ip = match (src.to_ip(), dst.to_ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpPath::V4 { src, dst },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpPath::V6 {
            src,
            dst,
            flow_label: 0,
        },
        (s, d) => panic!("mixed families {s} -> {d}"),
    };
    let mut path = PathRepr::new(mac(0x0a), mac(0x0b), ip);
    path.udp_src_port = 0xc000 + i as u16;
    let mut roce = RoceRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(i)));
    roce.deth = Some(DethRepr {
        qkey: QKey::GSI,
        src_qp: Qpn::GSI,
    });
    let mut buf = vec![0u8; 1024];
    let n = emit_frame(&path, &roce, mad, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

const FIELDS: &[&str] = &[
    "infiniband.bth.destqp",
    "infiniband.deth.q_key",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.attributeid",
    "infiniband.mad.transactionid",
    // REQ
    "infiniband.cm.req",
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.localcaguid",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip6",
    "infiniband.cm.req.ip_cm.dip6",
    // REP
    "infiniband.cm.rep",
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rep.rnrretrcount",
    "infiniband.cm.rep.srq",
    "infiniband.cm.rep.reserved",
    // RTU, REJ, DREQ, DREP
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.rej.reason",
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.drsp.localcommid",
    "infiniband.invariant.crc",
    "_ws.malformed",
    "_ws.expert.message",
];

fn num(s: &str) -> u64 {
    let s = s.trim();
    s.strip_prefix("0x").map_or_else(
        || s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")),
        |h| u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("not hex: {s:?}")),
    )
}

#[test]
fn tshark_decodes_our_cm_mads() {
    let tshark = which("tshark").unwrap_or_else(|| {
        panic!("tshark is required for this test and is not on PATH; install it (Debian: apt-get install tshark)")
    });
    let mads = exchange();
    let kinds: std::collections::BTreeSet<&str> = mads
        .iter()
        .map(|(_, _, m)| CmMad::decode(&m[..]).unwrap().msg.name())
        .collect();
    for k in [
        "REQ", "MRA", "REP", "RTU", "REJ", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP",
    ] {
        assert!(kinds.contains(k), "the exchange sent no {k}: {kinds:?}");
    }
    let frames: Vec<Vec<u8>> = mads
        .iter()
        .enumerate()
        .map(|(i, (s, d, m))| frame(*s, *d, m, i as u32))
        .collect();
    let dir = std::env::temp_dir().join(format!("roce-cm-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("cm.pcap");
    write_pcap(&pcap, &frames);
    let mut cmd = Command::new(&tshark);
    cmd.arg("-n").arg("-r").arg(&pcap).args([
        "-d",
        "udp.port==4791,infiniband",
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-E",
        "occurrence=f",
    ]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tshark.display()));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), mads.len(), "one line per frame:\n{stdout}");
    let col = |cols: &[&str], name: &str| -> String {
        cols[FIELDS.iter().position(|f| *f == name).unwrap()].to_string()
    };
    let mut v6_reqs = 0;
    let mut reps_hinted = Vec::new();
    let reqs_hinted: Vec<bool> = mads
        .iter()
        .filter_map(|(_, _, m)| match CmMad::decode(&m[..]).unwrap().msg {
            CmMsg::Req(r) => Some(r.multipath_hint),
            _ => None,
        })
        .collect();
    assert!(
        reqs_hinted.contains(&true) && reqs_hinted.contains(&false),
        "{reqs_hinted:?}"
    );
    for ((line, (_, _, bytes)), f) in lines.iter().zip(&mads).zip(&frames) {
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols.len(), FIELDS.len(), "{line}");
        let mad = CmMad::decode(&bytes[..]).unwrap();
        let what = format!("{} ({line})", mad.msg.name());
        assert_eq!(num(&col(&cols, "infiniband.bth.destqp")), 1, "{what}");
        assert_eq!(
            num(&col(&cols, "infiniband.deth.q_key")),
            0x8001_0000,
            "{what}"
        );
        assert_eq!(num(&col(&cols, "infiniband.mad.mgmtclass")), 7, "{what}");
        assert_eq!(num(&col(&cols, "infiniband.mad.classversion")), 2, "{what}");
        assert_eq!(num(&col(&cols, "infiniband.mad.method")), 3, "{what}");
        assert_eq!(
            num(&col(&cols, "infiniband.mad.attributeid")),
            u64::from(mad.msg.attr_id() as u16),
            "{what}"
        );
        assert_eq!(
            num(&col(&cols, "infiniband.mad.transactionid")),
            mad.tid.0,
            "{what}"
        );
        let want_crc = u32::from_be_bytes(f[f.len() - 4..].try_into().unwrap());
        assert_eq!(
            num(&col(&cols, "infiniband.invariant.crc")),
            u64::from(want_crc),
            "{what}"
        );
        assert!(col(&cols, "_ws.malformed").is_empty(), "malformed: {what}");
        assert!(
            col(&cols, "_ws.expert.message").is_empty(),
            "expert info: {what}"
        );
        let id = |c: CommId| u64::from(c.0);
        match &mad.msg {
            CmMsg::Req(r) => {
                assert_eq!(num(&col(&cols, "infiniband.cm.req")), id(r.local_comm_id));
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.serviceid")),
                    r.service_id.0,
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.localqpn")),
                    u64::from(r.local_qpn.value()),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.startpsn")),
                    u64::from(r.starting_psn.value()),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.localcaguid")),
                    r.local_ca_guid.0,
                    "{what}"
                );
                let h = CmaHdr::parse(&r.private_data).unwrap();
                let (sip, dip) = if h.src.is_ipv4() {
                    (
                        "infiniband.cm.req.ip_cm.sip4",
                        "infiniband.cm.req.ip_cm.dip4",
                    )
                } else {
                    v6_reqs += 1;
                    (
                        "infiniband.cm.req.ip_cm.sip6",
                        "infiniband.cm.req.ip_cm.dip6",
                    )
                };
                assert_eq!(col(&cols, sip), h.src.to_string(), "{what}");
                assert_eq!(col(&cols, dip), h.dst.to_string(), "{what}");
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.ip_cm.sport")),
                    40000,
                    "{what}"
                );
            }
            CmMsg::Rep(r) => {
                assert_eq!(num(&col(&cols, "infiniband.cm.rep")), id(r.local_comm_id));
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.remotecommid")),
                    id(r.remote_comm_id),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.localqpn")),
                    u64::from(r.local_qpn.value()),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.startpsn")),
                    u64::from(r.starting_psn.value()),
                    "{what}"
                );
                // Byte 27: RNR retry count and SRQ where they were, the multipath hint in
                // the nibble tshark shows as reserved.
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.rnrretrcount")),
                    u64::from(r.rnr_retry_count),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.srq")),
                    u64::from(r.srq),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rep.reserved")),
                    u64::from(r.multipath_hint),
                    "{what}"
                );
                reps_hinted.push(r.multipath_hint);
            }
            CmMsg::Rtu(r) => assert_eq!(
                num(&col(&cols, "infiniband.cm.rtu.localcommid")),
                id(r.local_comm_id),
                "{what}"
            ),
            CmMsg::Rej(r) => {
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rej.localcommid")),
                    id(r.local_comm_id),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rej.remotecommid")),
                    id(r.remote_comm_id),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.rej.reason")),
                    u64::from(r.reason.0),
                    "{what}"
                );
            }
            CmMsg::Dreq(r) => {
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.dreq.localcommid")),
                    id(r.local_comm_id),
                    "{what}"
                );
                assert_eq!(
                    num(&col(&cols, "infiniband.cm.req.remoteqpneecn")),
                    u64::from(r.remote_qpn.value()),
                    "{what}"
                );
            }
            CmMsg::Drep(r) => assert_eq!(
                num(&col(&cols, "infiniband.cm.drsp.localcommid")),
                id(r.local_comm_id),
                "{what}"
            ),
            // Wireshark 4.0 names MRA and SIDR attributes but does not dissect their fields:
            // the header checks above are what it can confirm.
            CmMsg::Mra(_) | CmMsg::SidrReq(_) | CmMsg::SidrRep(_) => {}
        }
    }
    assert_eq!(v6_reqs, 1, "the IPv6 REQ was dissected");
    assert!(
        reps_hinted.contains(&true) && reps_hinted.contains(&false),
        "a REP with and one without the multipath hint: {reps_hinted:?}"
    );
}
