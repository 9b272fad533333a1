//! The kernel's CM MADs against our codecs: two Soft-RoCE VMs run the real rdmacm tools
//! against each other (`rping` connect, transfer and disconnect, `rping` to a port with no
//! listener, `udaddy` for SIDR) while we capture the server VM's tap; every CM MAD in the
//! capture must decode with `roce::ibcm`, re-encode to the kernel's very bytes, and mean what
//! the tools did (RDMA CM service IDs and IP header, REP answering the REQ, REJ "invalid
//! service ID"). Then our own CM agent is given the kernel's REQs: it asks its consumer about
//! the one it listens for and rejects the other with the reason the kernel gave. Root; boots
//! two rxe-peer VMs.

use std::{collections::BTreeSet, fs, path::Path, time::Duration};

use roce::{
    ibcm::{
        CaGuid, Cm, CmConfig, CmMad, CmMsg, CmaHdr, Event, Gid, PortSpace, RejReason, ServiceId,
    },
    time::Instant,
    wire::{Opcode, QKey, Qpn},
};
use roce_tests::{
    require_root,
    rxe::{Capture, Peer, PeerOptions},
    tag,
};

/// Every UD SEND_ONLY to QP1 in a little-endian Ethernet pcap: (source IP, 256-byte MAD).
fn qp1_mads(pcap: &Path) -> Vec<(std::net::IpAddr, Vec<u8>)> {
    let b = fs::read(pcap).expect("read pcap");
    assert!(b.len() >= 24, "pcap too short");
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        let start = off + 16;
        let end = (start + incl).min(b.len());
        off = start + incl;
        if let Ok(f) = roce::wire::parse_frame(&b[start..end])
            && f.roce.bth.opcode == Opcode::UD_SEND_ONLY
            && f.roce.bth.dest_qp == Qpn::GSI
        {
            assert!(f.icrc_ok, "a kernel MAD with a bad ICRC");
            let deth = f.roce.deth.expect("UD has a DETH");
            assert_eq!(deth.qkey, QKey::GSI);
            out.push((f.src_ip(), f.payload.to_vec()));
        }
    }
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
                req_ids.push(r.local_comm_id);
                reqs.push((*src, bytes.clone(), r.service_id));
            }
            CmMsg::Rep(r) => rep_answers.push(r.remote_comm_id),
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
