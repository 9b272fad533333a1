//! Tests of the CM codecs (byte offsets derived from ibta_vol1_c12.h / IBTA Tables 106–120)
//! and of two CM agents driven against each other with injected time.

use core::time::Duration;

use proptest::prelude::*;

use super::conn::{AcceptParams, Cm, CmConfig, ConnectParams, Dropped, Event, State};
use super::ip::{CmaHdr, PortSpace};
use super::mad::*;
use crate::time::Instant;
use crate::wire::{PKey, Psn, QKey, Qpn};

fn sample_req() -> Req {
    Req {
        local_comm_id: CommId(0x1122_3344),
        service_id: ServiceId::rdma_cm(PortSpace::Tcp, 7174),
        local_ca_guid: CaGuid(0x0200_00ff_fe00_000a),
        local_qkey: QKey::new(0x0102_0304),
        local_qpn: Qpn::new(0x00ab_cdef),
        responder_resources: 0x10,
        local_eecn: 0x0012_3456,
        initiator_depth: 0x20,
        remote_eecn: 0x0065_4321,
        remote_cm_response_timeout: IbaTime::new(20),
        transport: TransportType::Uc,
        e2e_flow_control: true,
        starting_psn: Psn::new(0x00fe_dcba),
        local_cm_response_timeout: IbaTime::new(19),
        retry_count: 7,
        pkey: PKey::new(0xffff),
        path_mtu: PathMtu::MTU_1024,
        rdc_exists: false,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        srq: true,
        primary: ReqPath {
            local_lid: 0xffff,
            remote_lid: 0xfffe,
            local_gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            remote_gid: Gid::from_ip("10.0.0.2".parse().unwrap()),
            flow_label: 0xa_bcde,
            packet_rate: 0x2a,
            traffic_class: 0x68,
            hop_limit: 64,
            sl: 5,
            subnet_local: true,
            local_ack_timeout: IbaTime::new(19),
        },
        alternate: ReqPath::default(),
        sap_supported: false,
        multipath_hint: false,
        private_data: CmaHdr {
            src_port: 40000,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        }
        .with_user_data(b"user"),
    }
}

fn padded(mut v: Vec<u8>, len: usize) -> Vec<u8> {
    v.resize(len, 0);
    v
}

#[test]
fn req_fields_sit_at_the_kernel_offsets() {
    let req = sample_req();
    let b = CmMad::new(
        Tid(0x0102_0304_0506_0708),
        CmMsg::Req(Box::new(req.clone())),
    )
    .encode()
    .unwrap();
    // Common MAD header (IBTA 13.4.2).
    assert_eq!(&b[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[16..18], &[0x00, 0x10]);
    // Table 106, offsets + 24.
    assert_eq!(&b[24..28], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&b[32..40], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
    assert_eq!(&b[40..48], &[0x02, 0, 0, 0xff, 0xfe, 0, 0, 0x0a]);
    assert_eq!(&b[52..56], &[1, 2, 3, 4]);
    assert_eq!(&b[56..60], &[0xab, 0xcd, 0xef, 0x10]);
    assert_eq!(&b[60..64], &[0x12, 0x34, 0x56, 0x20]);
    // Remote EECN, then timeout 20 << 3 | UC (1) << 1 | e2e.
    assert_eq!(&b[64..68], &[0x65, 0x43, 0x21, (20 << 3) | (1 << 1) | 1]);
    assert_eq!(&b[68..72], &[0xfe, 0xdc, 0xba, (19 << 3) | 7]);
    assert_eq!(&b[72..74], &[0xff, 0xff]);
    assert_eq!(b[74], (3 << 4) | 6); // MTU 1024, no RDC, RNR retry 6
    assert_eq!(b[75], (15 << 4) | 0x08); // max CM retries, SRQ, ext transport 0
    assert_eq!(&b[76..80], &[0xff, 0xff, 0xff, 0xfe]);
    // Primary local GID: IPv4-mapped 10.0.0.1.
    assert_eq!(&b[80..96], &Gid::from_ip("10.0.0.1".parse().unwrap()).0);
    assert_eq!(&b[90..96], &[0xff, 0xff, 10, 0, 0, 1]);
    assert_eq!(&b[96..112], &Gid::from_ip("10.0.0.2".parse().unwrap()).0);
    // Flow label 0xabcde in the top 20 bits, packet rate in the low 6 bits.
    assert_eq!(&b[112..116], &[0xab, 0xcd, 0xe0, 0x2a]);
    assert_eq!(&b[116..120], &[0x68, 64, (5 << 4) | 0x08, 19 << 3]);
    assert_eq!(&b[120..164], &[0u8; 44]); // no alternate path
    // Private data at 140 + 24: the RDMA CM IP header.
    assert_eq!(&b[164..168], &[0x00, 0x40, 0x9c, 0x40]);
    assert_eq!(&b[180..184], &[10, 0, 0, 1]);
    assert_eq!(&b[196..200], &[10, 0, 0, 2]);
    assert_eq!(&b[200..204], b"user");
    let back = CmMad::decode(&b).unwrap();
    let CmMsg::Req(r) = back.msg else {
        panic!("not a REQ: {back:?}")
    };
    let mut want = req;
    want.private_data = padded(want.private_data, private_len::REQ);
    assert_eq!(*r, want);
    assert_eq!(back.tid, Tid(0x0102_0304_0506_0708));
}

fn every_message() -> Vec<CmMsg> {
    vec![
        CmMsg::Req(Box::new(sample_req())),
        CmMsg::Mra(Mra {
            local_comm_id: CommId(1),
            remote_comm_id: CommId(2),
            message: MsgMraed::Rep,
            service_timeout: IbaTime::new(24),
            private_data: vec![9; 5],
        }),
        CmMsg::Rej(Rej {
            local_comm_id: CommId(3),
            remote_comm_id: CommId(4),
            message: MsgRejected::Req,
            reason: RejReason::CONSUMER_DEFINED,
            ari: vec![1, 2, 3],
            private_data: b"busy".to_vec(),
        }),
        CmMsg::Rep(Rep {
            local_comm_id: CommId(5),
            remote_comm_id: CommId(6),
            local_qkey: QKey::new(0),
            local_qpn: Qpn::new(0x11_2233),
            local_eecn: 0,
            starting_psn: Psn::new(0x44_5566),
            responder_resources: 4,
            initiator_depth: 3,
            target_ack_delay: 17,
            failover_accepted: 1,
            e2e_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: CaGuid(0x0011_2233_4455_6677),
            multipath_hint: false,
            private_data: vec![0xaa; 196],
        }),
        CmMsg::Rtu(Rtu {
            local_comm_id: CommId(7),
            remote_comm_id: CommId(8),
            private_data: vec![],
        }),
        CmMsg::Dreq(Dreq {
            local_comm_id: CommId(9),
            remote_comm_id: CommId(10),
            remote_qpn: Qpn::new(0xab_cdef),
            private_data: vec![1],
        }),
        CmMsg::Drep(Drep {
            local_comm_id: CommId(11),
            remote_comm_id: CommId(12),
            private_data: vec![2; 224],
        }),
        CmMsg::SidrReq(SidrReq {
            request_id: CommId(13),
            pkey: PKey::new(0x8001),
            service_id: ServiceId::rdma_cm(PortSpace::Udp, 7174),
            private_data: vec![3; 36],
        }),
        CmMsg::SidrRep(SidrRep {
            request_id: CommId(14),
            status: SidrStatus::SUCCESS,
            qpn: Qpn::new(0x99),
            service_id: ServiceId::rdma_cm(PortSpace::Udp, 7174),
            qkey: QKey::new(0x1234_5678),
            add_info: vec![7; 72],
            private_data: vec![4; 10],
        }),
    ]
}

fn pad_private(m: &mut CmMsg) {
    match m {
        CmMsg::Req(x) => x.private_data = padded(x.private_data.clone(), private_len::REQ),
        CmMsg::Mra(x) => x.private_data = padded(x.private_data.clone(), private_len::MRA),
        CmMsg::Rej(x) => x.private_data = padded(x.private_data.clone(), private_len::REJ),
        CmMsg::Rep(x) => x.private_data = padded(x.private_data.clone(), private_len::REP),
        CmMsg::Rtu(x) => x.private_data = padded(x.private_data.clone(), private_len::RTU),
        CmMsg::Dreq(x) => x.private_data = padded(x.private_data.clone(), private_len::DREQ),
        CmMsg::Drep(x) => x.private_data = padded(x.private_data.clone(), private_len::DREP),
        CmMsg::SidrReq(x) => {
            x.private_data = padded(x.private_data.clone(), private_len::SIDR_REQ);
        }
        CmMsg::SidrRep(x) => {
            x.private_data = padded(x.private_data.clone(), private_len::SIDR_REP);
        }
    }
}

#[test]
fn every_message_round_trips() {
    for msg in every_message() {
        let mad = CmMad::new(Tid(42), msg);
        let bytes = mad.encode().unwrap();
        let back = CmMad::decode(&bytes).unwrap();
        let mut want = mad.clone();
        pad_private(&mut want.msg);
        assert_eq!(back, want, "{}", mad.msg.name());
        assert_eq!(back.encode().unwrap(), bytes, "{}", mad.msg.name());
    }
}

#[test]
fn short_messages_sit_at_the_kernel_offsets() {
    let msgs = every_message();
    let enc = |i: usize| CmMad::new(Tid(1), msgs[i].clone()).encode().unwrap();
    // MRA (Table 107): msg MRAed REP (1) in bits 7:6 of byte 8, service timeout bits 7:3 of 9.
    let b = enc(1);
    assert_eq!(&b[16..18], &[0, 0x11]);
    assert_eq!(&b[24..34], &[0, 0, 0, 1, 0, 0, 0, 2, 0x40, 24 << 3]);
    assert_eq!(&b[34..39], &[9; 5]);
    // REJ (Table 108): ARI length in bits 7:1 of byte 9, reason at 10, ARI at 12, private 84.
    let b = enc(2);
    assert_eq!(&b[32..36], &[0x00, 3 << 1, 0, 28]);
    assert_eq!(&b[36..39], &[1, 2, 3]);
    assert_eq!(&b[108..112], b"busy");
    // REP (Table 110): QPN at 12, PSN at 20, resources 24/25, flags 26/27, GUID at 28.
    let b = enc(3);
    assert_eq!(&b[16..18], &[0, 0x13]);
    assert_eq!(&b[36..40], &[0x11, 0x22, 0x33, 0]);
    assert_eq!(&b[44..48], &[0x44, 0x55, 0x66, 0]);
    assert_eq!(
        &b[48..52],
        &[4, 3, (17 << 3) | (1 << 1) | 1, (7 << 5) | 0x10]
    );
    assert_eq!(&b[52..60], &[0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
    assert_eq!(&b[60..256], &[0xaa; 196]);
    // DREQ (Table 112): remote QPN at 8.
    let b = enc(5);
    assert_eq!(&b[32..37], &[0xab, 0xcd, 0xef, 0, 1]);
    // SIDR_REQ (Table 119): P_Key at 4, service ID at 8.
    let b = enc(7);
    assert_eq!(&b[16..18], &[0, 0x17]);
    assert_eq!(&b[28..30], &[0x80, 0x01]);
    assert_eq!(&b[32..40], &[0, 0, 0, 0, 0x01, 0x11, 0x1c, 0x06]);
    // SIDR_REP (Table 120): status 4, info length 5, QPN 8, service ID 12, Q_Key 20,
    // additional information 24, private data 96.
    let b = enc(8);
    assert_eq!(&b[24..30], &[0, 0, 0, 14, 0, 72]);
    assert_eq!(&b[32..35], &[0, 0, 0x99]);
    assert_eq!(&b[36..44], &[0, 0, 0, 0, 0x01, 0x11, 0x1c, 0x06]);
    assert_eq!(&b[44..48], &[0x12, 0x34, 0x56, 0x78]);
    assert_eq!(&b[48..120], &[7; 72]);
    assert_eq!(&b[120..130], &[4; 10]);
}

#[test]
fn bad_mads_are_named_errors() {
    let good = CmMad::new(Tid(1), every_message()[4].clone())
        .encode()
        .unwrap();
    assert_eq!(CmMad::decode(&good[..255]), Err(MadError::Truncated(255)));
    assert_eq!(CmMad::decode(&[]), Err(MadError::Truncated(0)));
    let with = |at: usize, v: u8| {
        let mut b = good;
        b[at] = v;
        CmMad::decode(&b)
    };
    assert_eq!(with(0, 2), Err(MadError::BadBaseVersion(2)));
    assert_eq!(with(1, 0x81), Err(MadError::BadClass(0x81)));
    assert_eq!(with(2, 1), Err(MadError::BadClassVersion(1)));
    assert_eq!(with(3, 0x81), Err(MadError::BadMethod(0x81)));
    assert_eq!(with(17, 0x19), Err(MadError::UnsupportedAttribute(0x19)));
    assert_eq!(with(17, 0x42), Err(MadError::UnknownAttribute(0x42)));
    // A REQ with path MTU code 0 or 6.
    let req = CmMad::new(Tid(1), every_message()[0].clone())
        .encode()
        .unwrap();
    for code in [0u8, 6, 15] {
        let mut b = req;
        b[24 + 50] = (code << 4) | (b[24 + 50] & 0x0f);
        assert_eq!(
            CmMad::decode(&b),
            Err(MadError::Reserved {
                field: "path_mtu",
                value: u32::from(code)
            })
        );
    }
    // MRA "message MRAed" 3, REJ "message rejected" 3 and ARI length 73 are reserved.
    let mut b = CmMad::new(Tid(1), every_message()[1].clone())
        .encode()
        .unwrap();
    b[32] = 0xc0;
    assert!(matches!(CmMad::decode(&b), Err(MadError::Reserved { .. })));
    let mut b = CmMad::new(Tid(1), every_message()[2].clone())
        .encode()
        .unwrap();
    b[33] = 73 << 1;
    assert!(matches!(CmMad::decode(&b), Err(MadError::Reserved { .. })));
    // Too much private data is refused at encode.
    let mut rtu = every_message()[4].clone();
    if let CmMsg::Rtu(r) = &mut rtu {
        r.private_data = vec![0; 225];
    }
    assert_eq!(
        CmMad::new(Tid(1), rtu).encode(),
        Err(MadError::PrivateDataTooLong {
            msg: "RTU",
            max: 224,
            len: 225
        })
    );
}

proptest! {
    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMad::decode(&b);
    }

    /// Arbitrary attribute data behind a valid CM header never panics, and whatever decodes
    /// re-encodes to the same bytes modulo reserved bits (decode(encode(decode(x))) is stable).
    #[test]
    fn decoding_arbitrary_cm_data_is_stable(
        data in proptest::collection::vec(any::<u8>(), 232..=232),
        attr in 0x0fu16..0x1b,
    ) {
        let mut b = [0u8; MAD_LEN];
        b[..4].copy_from_slice(&[1, 7, 2, 3]);
        b[16..18].copy_from_slice(&attr.to_be_bytes());
        b[24..].copy_from_slice(&data);
        if let Ok(m) = CmMad::decode(&b) {
            let again = CmMad::decode(&m.encode().unwrap()).unwrap();
            prop_assert_eq!(again, m);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Two agents against each other.

const GUID_A: CaGuid = CaGuid(0x0200_00ff_fe00_000a);
const GUID_B: CaGuid = CaGuid(0x0200_00ff_fe00_000b);

fn gid_a() -> Gid {
    Gid::from_ip("10.0.0.1".parse().unwrap())
}
fn gid_b() -> Gid {
    Gid::from_ip("10.0.0.2".parse().unwrap())
}

fn sid() -> ServiceId {
    ServiceId::rdma_cm(PortSpace::Tcp, 7174)
}

struct Pair {
    a: Cm,
    b: Cm,
    now: Instant,
    /// Every MAD sent, in order: (from A, attribute ID).
    log: Vec<(bool, u16)>,
}

fn attr(m: &[u8; MAD_LEN]) -> u16 {
    u16::from_be_bytes([m[16], m[17]])
}

impl Pair {
    fn new() -> Self {
        let mut cb = CmConfig::new(GUID_B);
        cb.comm_id_seed = 0x5000;
        let mut b = Cm::new(cb);
        b.listen(sid()).unwrap();
        let mut ca = CmConfig::new(GUID_A);
        ca.comm_id_seed = 0x1000;
        Self {
            a: Cm::new(ca),
            b,
            now: Instant::ZERO,
            log: Vec::new(),
        }
    }

    /// Delivers queued MADs both ways until none is left; `lose` decides (from A?, attr,
    /// index of that attr from that side) which are lost.
    fn pump_lossy(&mut self, mut lose: impl FnMut(bool, u16) -> bool) {
        loop {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                assert_eq!(t.dest, gid_b());
                let at = attr(&t.mad);
                self.log.push((true, at));
                if !lose(true, at) {
                    let _ = self.b.handle_mad(self.now, gid_a(), &t.mad[..]);
                }
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                let at = attr(&t.mad);
                self.log.push((false, at));
                // Only A is on this network; MADs to a stranger go nowhere.
                if t.dest == gid_a() && !lose(false, at) {
                    let _ = self.a.handle_mad(self.now, gid_b(), &t.mad[..]);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn pump(&mut self) {
        self.pump_lossy(|_, _| false);
    }

    fn events(cm: &mut Cm) -> Vec<Event> {
        std::iter::from_fn(|| cm.poll_event()).collect()
    }

    /// Advances time to the earliest deadline of either side and runs both timers.
    fn tick(&mut self) -> Instant {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("a deadline");
        self.now = next;
        self.a.handle_timeout(next);
        self.b.handle_timeout(next);
        next
    }

    fn sent(&self, from_a: bool, at: AttrId) -> usize {
        self.log
            .iter()
            .filter(|&&(f, x)| f == from_a && x == at as u16)
            .count()
    }

    fn connect(&mut self) -> CommId {
        let id = self.a.connect(self.now, &connect_params(0x11)).unwrap();
        assert_eq!(self.a.state(id), Some(State::ReqSent));
        id
    }

    /// Runs a whole establishment; returns (A's ID, B's ID).
    fn establish(&mut self) -> (CommId, CommId) {
        let a_id = self.connect();
        self.pump();
        let b_id = expect_request(&mut self.b);
        self.b.accept(self.now, b_id, &accept_params()).unwrap();
        self.pump();
        expect_reply(&mut self.a, a_id);
        self.a.ready_to_use(a_id, &[]).unwrap();
        self.pump();
        assert_eq!(
            Self::events(&mut self.a),
            vec![Event::Established { id: a_id }]
        );
        assert_eq!(
            Self::events(&mut self.b),
            vec![Event::Established { id: b_id }]
        );
        (a_id, b_id)
    }
}

fn connect_params(qpn: u32) -> ConnectParams {
    let p = ConnectParams::rdma_cm(
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:7174".parse().unwrap(),
        Qpn::new(qpn),
        Psn::new(0x1234),
        b"hello",
    );
    assert_eq!((p.remote, p.local, p.service_id), (gid_b(), gid_a(), sid()));
    p
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: Qpn::new(0x22),
        starting_psn: Psn::new(0x5678),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        target_ack_delay: 0,
        multipath_hint: false,
        private_data: b"welcome".to_vec(),
    }
}

fn expect_request(b: &mut Cm) -> CommId {
    match Pair::events(b).as_slice() {
        [Event::ConnectRequest { id, from, req }] => {
            assert_eq!(*from, gid_a());
            assert_eq!(req.local_qpn, Qpn::new(0x11));
            assert_eq!(req.local_ca_guid, GUID_A);
            assert_eq!(req.service_id, sid());
            let h = CmaHdr::parse(&req.private_data).unwrap();
            assert_eq!(h.src_port, 40000);
            assert_eq!(&req.private_data[36..41], b"hello");
            *id
        }
        e => panic!("expected one connect request, got {e:?}"),
    }
}

fn expect_reply(a: &mut Cm, a_id: CommId) {
    match Pair::events(a).as_slice() {
        [Event::Reply { id, rep }] => {
            assert_eq!(*id, a_id);
            assert_eq!(rep.local_qpn, Qpn::new(0x22));
            assert_eq!(rep.starting_psn, Psn::new(0x5678));
            assert_eq!(rep.local_ca_guid, GUID_B);
            assert_eq!(&rep.private_data[..7], b"welcome");
        }
        e => panic!("expected one reply, got {e:?}"),
    }
}

#[test]
fn connect_accept_and_rtu_establish_both_sides() {
    let mut p = Pair::new();
    let (a, b) = p.establish();
    assert_eq!(p.a.state(a), Some(State::Established));
    assert_eq!(p.b.state(b), Some(State::Established));
    assert_eq!(p.sent(true, AttrId::Req), 1);
    assert_eq!(p.sent(false, AttrId::Rep), 1);
    assert_eq!(p.sent(true, AttrId::Rtu), 1);
    // Nothing left to resend.
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.b.poll_timeout(), None);
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.reject(b, b"not today").unwrap();
    p.pump();
    match Pair::events(&mut p.a).as_slice() {
        [
            Event::Rejected {
                id,
                reason,
                private_data,
                ..
            },
        ] => {
            assert_eq!(*id, a);
            assert_eq!(*reason, RejReason::CONSUMER_DEFINED);
            assert_eq!(&private_data[..9], b"not today");
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.a.connections(), 0);
    assert_eq!(p.b.connections(), 0);
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut p = Pair::new();
    assert!(p.b.unlisten(sid()));
    let a = p.connect();
    p.pump();
    match Pair::events(&mut p.a).as_slice() {
        [Event::Rejected { id, reason, .. }] => {
            assert_eq!(*id, a);
            assert_eq!(*reason, RejReason::INVALID_SERVICE_ID);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.b.connections(), 0);
    assert_eq!(p.b.stats().no_listener, 1);
    assert!(Pair::events(&mut p.b).is_empty());
}

#[test]
fn lost_rep_is_resent_and_the_duplicate_req_gets_one_connection() {
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump_lossy(|from_a, at| !from_a && at == AttrId::Rep as u16);
    assert!(Pair::events(&mut p.a).is_empty());
    // 2 × 1.07 s packet lifetime + 4.3 s CM response time.
    let t = p.tick();
    assert_eq!(t.as_nanos(), 2 * (4096 << 18) + (4096 << 20));
    p.pump();
    expect_reply(&mut p.a, a);
    // B's REP went out again (by its timer, and for A's resent REQ); B saw no second request.
    assert!(p.sent(false, AttrId::Rep) >= 2);
    assert!(Pair::events(&mut p.b).is_empty());
    assert_eq!(p.b.connections(), 1);
    p.a.ready_to_use(a, &[]).unwrap();
    p.pump();
    assert_eq!(p.b.state(b), Some(State::Established));
}

#[test]
fn lost_rtu_is_recovered_by_rep_retries() {
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump();
    expect_reply(&mut p.a, a);
    p.a.ready_to_use(a, &[]).unwrap();
    p.pump_lossy(|from_a, at| from_a && at == AttrId::Rtu as u16);
    assert_eq!(p.b.state(b), Some(State::RepSent));
    // B resends the REP; A, established, answers the duplicate with its RTU again.
    p.tick();
    p.pump();
    assert_eq!(p.b.state(b), Some(State::Established));
    assert_eq!(p.sent(true, AttrId::Rtu), 2);
    assert!(Pair::events(&mut p.b).contains(&Event::Established { id: b }));
}

#[test]
fn lost_rtu_first_packet_establishes_the_passive_side() {
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump();
    expect_reply(&mut p.a, a);
    p.a.ready_to_use(a, &[]).unwrap();
    p.pump_lossy(|from_a, at| from_a && at == AttrId::Rtu as u16);
    p.b.notify_established(b).unwrap();
    assert_eq!(Pair::events(&mut p.b), vec![Event::Established { id: b }]);
    assert_eq!(p.b.poll_timeout(), None, "no REP resend once established");
}

#[test]
fn mra_extends_the_req_timeout() {
    let mut p = Pair::new();
    let a = p.connect();
    let first_deadline = p.a.poll_timeout().unwrap();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.delay(b).unwrap();
    p.pump();
    assert_eq!(p.a.state(a), Some(State::MraReqRcvd));
    // The MRA's service timeout (24: 68.7 s) plus a packet lifetime replaces the REQ timer.
    let extended = p.a.poll_timeout().unwrap();
    assert_eq!(
        extended,
        p.now + IbaTime::new(24).duration() + IbaTime::new(18).duration()
    );
    assert!(extended > first_deadline);
    p.now = first_deadline + Duration::from_secs(1);
    p.a.handle_timeout(p.now);
    p.pump();
    assert_eq!(
        p.sent(true, AttrId::Req),
        1,
        "no resend within the MRA's time"
    );
    // A duplicate REQ (the resend after the extended timeout) is answered with the MRA.
    p.tick();
    p.pump();
    assert_eq!(p.sent(true, AttrId::Req), 2);
    assert_eq!(p.sent(false, AttrId::Mra), 2);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump();
    expect_reply(&mut p.a, a);
}

#[test]
fn unanswered_req_times_out_after_max_retries() {
    let mut p = Pair::new();
    let a = p.connect();
    p.pump_lossy(|_, _| true);
    for _ in 0..15 {
        p.tick();
        p.pump_lossy(|_, _| true);
    }
    assert!(Pair::events(&mut p.a).is_empty());
    p.tick();
    p.pump_lossy(|_, _| true);
    assert_eq!(Pair::events(&mut p.a), vec![Event::TimedOut { id: a }]);
    assert_eq!(p.sent(true, AttrId::Req), 16, "one REQ and 15 resends");
    assert_eq!(p.sent(true, AttrId::Rej), 1, "REJ TIMEOUT tells the peer");
    assert_eq!(p.a.connections(), 0);
    assert_eq!(p.a.poll_timeout(), None);
}

/// A connection's own response timeout and retry count (`ib_cm_req_param`'s) rule its REQ
/// resends and travel in the REQ, so the passive side resends its REP by them too.
#[test]
fn a_connection_sets_its_own_response_timeout_and_retries() {
    let mut p = Pair::new();
    let mut c = connect_params(0x11);
    c.cm_response_timeout = Some(IbaTime::new(16));
    c.max_cm_retries = Some(2);
    let a = p.a.connect(p.now, &c).unwrap();
    let every = IbaTime::new(18).duration() * 2 + IbaTime::new(16).duration();
    assert_eq!(p.a.poll_timeout(), Some(p.now + every));
    // The REQ reaches B, which accepts; every REP is lost, so B resends it by the REQ's
    // fields and A resends its REQ by its own, each twice, then both give up.
    p.pump();
    let b = match Pair::events(&mut p.b).as_slice() {
        [Event::ConnectRequest { id, req, .. }] => {
            assert_eq!(req.local_cm_response_timeout, IbaTime::new(16));
            assert_eq!(req.remote_cm_response_timeout, IbaTime::new(16));
            assert_eq!(req.max_cm_retries, 2);
            *id
        }
        e => panic!("{e:?}"),
    };
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump_lossy(|from_a, _| !from_a);
    let start = p.now;
    while p.a.state(a).is_some() || p.b.state(b).is_some() {
        p.tick();
        p.pump_lossy(|from_a, _| !from_a);
        assert!(
            p.now.saturating_duration_since(start) < every * 4,
            "still connecting at {:?}",
            p.now
        );
    }
    assert_eq!(p.sent(true, AttrId::Req), 3, "one REQ and 2 resends");
    assert!(Pair::events(&mut p.a).contains(&Event::TimedOut { id: a }));
    assert_eq!(p.a.connections(), 0);
}

#[test]
fn disconnect_goes_through_timewait_to_idle() {
    let mut p = Pair::new();
    let (a, b) = p.establish();
    p.a.disconnect(p.now, a, b"bye").unwrap();
    assert_eq!(p.a.state(a), Some(State::DreqSent));
    p.pump();
    match Pair::events(&mut p.b).as_slice() {
        [Event::Disconnected { id, private_data }] => {
            assert_eq!(*id, b);
            assert_eq!(&private_data[..3], b"bye");
        }
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        Pair::events(&mut p.a).as_slice(),
        [Event::Disconnected { .. }]
    ));
    assert_eq!(p.a.state(a), Some(State::TimeWait));
    assert_eq!(p.b.state(b), Some(State::TimeWait));
    // TimeWait: the local ACK timeout (packet lifetime + 1 = 19: 2.1 s).
    let t = p.tick();
    assert_eq!(t, Instant::ZERO + IbaTime::new(19).duration());
    assert_eq!(Pair::events(&mut p.a), vec![Event::TimeWaitExit { id: a }]);
    assert_eq!(Pair::events(&mut p.b), vec![Event::TimeWaitExit { id: b }]);
    assert_eq!(p.a.connections(), 0);
    assert_eq!(p.b.connections(), 0);
}

/// `destroy` tells the peer as the kernel's `cm_destroy_id` does, in each state it can meet.
#[test]
fn destroy_tells_the_peer_in_every_state() {
    // Established: one DREQ; the peer answers with a DREP and disconnects; we are in TimeWait
    // at once, without waiting for the DREP, and raise no event of our own.
    let mut p = Pair::new();
    let (a, b) = p.establish();
    p.a.destroy(p.now, a).unwrap();
    assert_eq!(p.a.state(a), Some(State::TimeWait));
    p.pump();
    assert_eq!(p.sent(true, AttrId::Dreq), 1);
    assert_eq!(p.sent(false, AttrId::Drep), 1);
    assert!(matches!(
        Pair::events(&mut p.b).as_slice(),
        [Event::Disconnected { id, .. }] if *id == b
    ));
    assert!(Pair::events(&mut p.a).is_empty());
    assert_eq!(p.b.state(b), Some(State::TimeWait));
    // No DREQ is resent: the next deadlines are the two TimeWaits.
    let t = p.tick();
    assert_eq!(t, Instant::ZERO + IbaTime::new(19).duration());
    assert_eq!(p.sent(true, AttrId::Dreq), 1);
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));
    p.a.check_invariants();

    // REQ sent, no answer yet: REJ TIMEOUT with our CA GUID; the peer forgets the REQ.
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.a.destroy(p.now, a).unwrap();
    p.pump();
    assert_eq!(p.a.state(a), None);
    assert_eq!(p.b.state(b), None);
    match Pair::events(&mut p.b).as_slice() {
        [
            Event::Rejected {
                id, reason, ari, ..
            },
        ] => {
            assert_eq!(*id, b);
            assert_eq!(*reason, RejReason::TIMEOUT);
            assert_eq!(ari[..], GUID_A.0.to_be_bytes());
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.a.poll_timeout(), None, "no REQ left to resend");

    // A REQ received and not answered: REJ CONSUMER_DEFINED.
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.destroy(p.now, b).unwrap();
    p.pump();
    assert!(matches!(
        Pair::events(&mut p.a).as_slice(),
        [Event::Rejected { id, reason, .. }] if *id == a && *reason == RejReason::CONSUMER_DEFINED
    ));
    assert_eq!((p.a.connections(), p.b.connections()), (0, 0));

    // Our REP not yet acknowledged: REJ CONSUMER_DEFINED, and the REP is not resent.
    let mut p = Pair::new();
    let a = p.connect();
    p.pump();
    let b = expect_request(&mut p.b);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    // The REP is lost; B gives up before A hears anything.
    p.pump_lossy(|from_a, at| !from_a && at == AttrId::Rep as u16);
    p.b.destroy(p.now, b).unwrap();
    p.pump();
    assert!(matches!(
        Pair::events(&mut p.a).as_slice(),
        [Event::Rejected { id, .. }] if *id == a
    ));
    assert_eq!(p.b.poll_timeout(), None);
    assert_eq!(p.sent(false, AttrId::Rep), 1);

    // Unknown IDs are refused.
    assert_eq!(p.b.destroy(p.now, b), Err(super::CmError::UnknownId(b)));
}

#[test]
fn lost_drep_is_answered_again_from_timewait() {
    let mut p = Pair::new();
    let (a, b) = p.establish();
    p.a.disconnect(p.now, a, &[]).unwrap();
    p.pump_lossy(|from_a, at| !from_a && at == AttrId::Drep as u16);
    assert_eq!(p.b.state(b), Some(State::TimeWait));
    assert_eq!(p.a.state(a), Some(State::DreqSent));
    // A's DREQ resend (2.1 s + 4.3 s) comes after B's TimeWait (2.1 s) ends: B no longer
    // knows the connection and still answers with a DREP.
    p.tick();
    p.tick();
    p.pump();
    assert_eq!(p.a.state(a), Some(State::TimeWait));
    assert_eq!(p.sent(false, AttrId::Drep), 2);
}

/// Both ends disconnect at once, one of them by destroying its ID: the passive side is in
/// TimeWait when the active side's DREQ crosses its own, and answers it with a DREP, never
/// with its REP again (a Linux peer counts that as a duplicate REP and sends its RTU again).
#[test]
fn crossing_dreqs_get_dreps_never_the_rep_again() {
    let mut p = Pair::new();
    let (a, b) = p.establish();
    p.b.destroy(p.now, b).unwrap();
    p.a.disconnect(p.now, a, &[]).unwrap();
    assert_eq!(p.b.state(b), Some(State::TimeWait));
    p.pump();
    assert_eq!(
        p.sent(false, AttrId::Rep),
        1,
        "the REP of the connection only"
    );
    assert_eq!(p.sent(false, AttrId::Drep), 1, "B answers A's DREQ");
    assert_eq!(p.sent(true, AttrId::Drep), 1, "A answers B's DREQ");
    assert_eq!(p.a.state(a), Some(State::TimeWait));
    assert_eq!(p.b.stats().duplicates, 1);
    // The same when B entered TimeWait by A's DREP to its disconnect.
    let mut p = Pair::new();
    let (a, b) = p.establish();
    p.b.disconnect(p.now, b, &[]).unwrap();
    p.pump();
    assert_eq!(p.b.state(b), Some(State::TimeWait));
    let dreq = CmMad::new(
        Tid(0x77),
        CmMsg::Dreq(Dreq {
            local_comm_id: a,
            remote_comm_id: b,
            remote_qpn: accept_params().qpn,
            private_data: Vec::new(),
        }),
    );
    p.b.handle_mad(p.now, gid_a(), &dreq.encode().unwrap()[..])
        .unwrap();
    let t = p.b.poll_transmit().expect("a DREP");
    assert_eq!(
        u16::from_be_bytes([t.mad[16], t.mad[17]]),
        AttrId::Drep as u16
    );
    assert!(p.b.poll_transmit().is_none());
}

#[test]
fn stale_connection_is_rejected_and_the_old_one_disconnected() {
    let mut p = Pair::new();
    let (_, b) = p.establish();
    // A restarts (same CA GUID, new comm IDs) and reuses its QPN for a new connection.
    let mut ca = CmConfig::new(GUID_A);
    ca.comm_id_seed = 0x9000;
    p.a = Cm::new(ca);
    let a2 = p.connect();
    p.pump();
    match Pair::events(&mut p.a).as_slice() {
        [Event::Rejected { id, reason, .. }] => {
            assert_eq!(*id, a2);
            assert_eq!(*reason, RejReason::STALE_CONN);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.b.stats().stale, 1);
    // B sent a DREQ on the old connection (the new A answers it with a DREP for no one).
    assert_eq!(p.sent(false, AttrId::Dreq), 1);
    assert_eq!(p.b.state(b), Some(State::TimeWait));
}

#[test]
fn a_duplicated_req_makes_one_connection() {
    let mut p = Pair::new();
    p.connect();
    let t = p.a.poll_transmit().unwrap();
    p.b.handle_mad(p.now, gid_a(), &t.mad[..]).unwrap();
    p.b.handle_mad(p.now, gid_a(), &t.mad[..]).unwrap();
    expect_request(&mut p.b);
    assert_eq!(p.b.connections(), 1);
    assert_eq!(p.b.stats().duplicates, 1);
}

#[test]
fn malformed_and_unknown_mads_are_counted_drops() {
    let mut p = Pair::new();
    assert!(matches!(
        p.b.handle_mad(p.now, gid_a(), &[0u8; 10]),
        Err(Dropped::Malformed(MadError::Truncated(10)))
    ));
    // A REP for no connection: REJ INVALID_COMM_ID answers it.
    let rep = CmMad::new(Tid(5), every_message()[3].clone())
        .encode()
        .unwrap();
    assert!(matches!(
        p.b.handle_mad(p.now, gid_a(), &rep),
        Err(Dropped::UnknownId("REP"))
    ));
    let t = p.b.poll_transmit().unwrap();
    match CmMad::decode(&t.mad[..]).unwrap().msg {
        CmMsg::Rej(r) => assert_eq!(r.reason, RejReason::INVALID_COMM_ID),
        m => panic!("{m:?}"),
    }
    // An RTU for no connection is dropped silently.
    let rtu = CmMad::new(Tid(5), every_message()[4].clone())
        .encode()
        .unwrap();
    assert!(p.b.handle_mad(p.now, gid_a(), &rtu).is_err());
    assert!(p.b.poll_transmit().is_none());
    assert_eq!(p.b.stats().malformed, 1);
    assert_eq!(p.b.stats().unexpected, 2);
}

#[test]
fn sidr_resolves_a_ud_service_and_no_listener_is_unsupported() {
    let mut p = Pair::new();
    let udp = ServiceId::rdma_cm(PortSpace::Udp, 7174);
    p.b.listen(udp).unwrap();
    let a =
        p.a.sidr_request(p.now, gid_b(), udp, PKey::DEFAULT, b"who")
            .unwrap();
    p.pump();
    let b = match Pair::events(&mut p.b).as_slice() {
        [Event::SidrRequest { id, req, .. }] => {
            assert_eq!(req.service_id, udp);
            *id
        }
        e => panic!("{e:?}"),
    };
    p.b.sidr_reply(
        b,
        SidrStatus::SUCCESS,
        Qpn::new(0x99),
        QKey::new(0x1111_2222),
        &[],
    )
    .unwrap();
    p.pump();
    match Pair::events(&mut p.a).as_slice() {
        [Event::SidrReply { id, rep }] => {
            assert_eq!(*id, a);
            assert_eq!(rep.status, SidrStatus::SUCCESS);
            assert_eq!(rep.qpn, Qpn::new(0x99));
            assert_eq!(rep.qkey, QKey::new(0x1111_2222));
        }
        e => panic!("{e:?}"),
    }
    let none = ServiceId::rdma_cm(PortSpace::Udp, 1);
    let a =
        p.a.sidr_request(p.now, gid_b(), none, PKey::DEFAULT, &[])
            .unwrap();
    p.pump();
    match Pair::events(&mut p.a).as_slice() {
        [Event::SidrReply { id, rep }] => {
            assert_eq!(*id, a);
            assert_eq!(rep.status, SidrStatus::UNSUPPORTED);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn a_req_flood_is_bounded_by_the_table_and_answered() {
    let mut cfg = CmConfig::new(GUID_B);
    cfg.max_connections = 100;
    let mut b = Cm::new(cfg);
    b.listen(sid()).unwrap();
    let mut a = Cm::new(CmConfig::new(GUID_A));
    let mut rejected = 0;
    for i in 0..10_000u32 {
        let id = a
            .connect(Instant::ZERO, &connect_params(0x100 + i))
            .unwrap();
        let t = a.poll_transmit().unwrap();
        b.handle_mad(Instant::ZERO, gid_a(), &t.mad[..]).unwrap();
        if let Some(t) = b.poll_transmit() {
            let CmMsg::Rej(r) = CmMad::decode(&t.mad[..]).unwrap().msg else {
                panic!("expected a REJ")
            };
            assert_eq!(r.reason, RejReason::NO_RESOURCES);
            assert_eq!(r.remote_comm_id, id);
            rejected += 1;
        }
        // A gives up on each at once (its table would fill too), as a flood source would not.
        let _ = a.poll_event();
        a = Cm::new(CmConfig::new(CaGuid(u64::from(i) + 0x1_0000)));
    }
    assert_eq!(b.connections(), 100);
    assert_eq!(rejected, 10_000 - 100);
    b.check_invariants();
}

/// Ten thousand REQs that nobody answers, started 1 µs apart: the timer index serves each
/// connection's retransmissions and its time-out at its own deadline (the earliest first,
/// whatever the order of the IDs), and is empty when they are all gone.
#[test]
fn ten_thousand_unanswered_reqs_time_out_each_at_its_deadline() {
    const N: u32 = 10_000;
    let mut cfg = CmConfig::new(GUID_A);
    cfg.max_connections = N as usize;
    let mut a = Cm::new(cfg);
    let step = core::time::Duration::from_micros(1);
    let mut ids = Vec::new();
    let mut first = None;
    for i in 0..N {
        let now = Instant::ZERO + step * i;
        ids.push(a.connect(now, &connect_params(0x100 + i)).unwrap());
        // The first REQ's retransmission stays the earliest deadline.
        let t = a.poll_timeout();
        assert_eq!(t, *first.get_or_insert(t));
    }
    assert_eq!(std::iter::from_fn(|| a.poll_transmit()).count(), N as usize);
    a.check_invariants();
    let mut timed_out = Vec::new();
    let mut sent = 0usize;
    let mut last = Instant::ZERO;
    while let Some(t) = a.poll_timeout() {
        assert!(t >= last, "time went back: {t:?} after {last:?}");
        last = t;
        a.handle_timeout(t);
        sent += std::iter::from_fn(|| a.poll_transmit()).count();
        timed_out.extend(std::iter::from_fn(|| a.poll_event()).map(|e| match e {
            Event::TimedOut { id } => id,
            e => panic!("unexpected {e:?}"),
        }));
    }
    a.check_invariants();
    // Each REQ was resent max_cm_retries times, then a REJ TIMEOUT went out.
    let per = usize::from(cfg.max_cm_retries) + 1;
    assert_eq!(per, 16);
    assert_eq!(sent, N as usize * per);
    // They time out in the order they were started, which is their deadlines' order.
    assert_eq!(timed_out, ids);
    assert_eq!(a.connections(), 0);
}

/// MADs to mutate: one of each message with made-up IDs, and what A sends through a whole
/// life against B (REQ, RTU, DREQ, SIDR_REQ, with IDs that B knows).
fn mad_corpus() -> Vec<[u8; MAD_LEN]> {
    let mut out: Vec<[u8; MAD_LEN]> = every_message()
        .into_iter()
        .map(|m| CmMad::new(Tid(1), m).encode().unwrap())
        .collect();
    let mut p = Pair::new();
    let a = p.a.connect(p.now, &connect_params(0x11)).unwrap();
    let req = p.a.poll_transmit().unwrap();
    out.push(*req.mad);
    p.b.handle_mad(p.now, gid_a(), &req.mad[..]).unwrap();
    let b = expect_request(&mut p.b);
    p.b.accept(p.now, b, &accept_params()).unwrap();
    p.pump();
    p.a.ready_to_use(a, &[]).unwrap();
    p.a.disconnect(p.now, a, b"x").unwrap();
    p.a.sidr_request(p.now, gid_b(), sid(), PKey::DEFAULT, &[])
        .unwrap();
    out.extend(std::iter::from_fn(|| p.a.poll_transmit()).map(|t| *t.mad));
    out
}

#[derive(Clone, Debug)]
enum Step {
    /// Deliver corpus MAD `n` to B with bytes `(at, value)` changed, from A or a stranger.
    Mad(usize, Vec<(usize, u8)>, bool),
    /// Advance time by this many milliseconds and run both timers.
    Wait(u32),
    /// A consumer call on B's n-th known connection: accept, reject, delay, disconnect,
    /// notify_established, ready_to_use.
    Call(usize, u8),
    /// A connects to B, and all queued MADs are delivered.
    Connect,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0usize..64,
            proptest::collection::vec((24usize..256, any::<u8>()), 0..4),
            any::<bool>()
        )
            .prop_map(|(n, m, s)| Step::Mad(n, m, s)),
        (0u32..20_000).prop_map(Step::Wait),
        (0usize..8, 0u8..6).prop_map(|(n, c)| Step::Call(n, c)),
        Just(Step::Connect),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Hostile input: mutated MADs, arbitrary consumer calls and timers in any order never
    /// panic either agent or break its indexes, and every timer eventually drains.
    #[test]
    fn hostile_sequences_never_panic(steps in proptest::collection::vec(step(), 1..40)) {
        let corpus = mad_corpus();
        let mut p = Pair::new();
        let mut ids: Vec<CommId> = Vec::new();
        for s in steps {
            match s {
                Step::Mad(n, muts, stranger) => {
                    let mut m = corpus[n % corpus.len()];
                    for (at, v) in muts {
                        m[at] = v;
                    }
                    let from = if stranger {
                        Gid::from_ip("10.9.9.9".parse().unwrap())
                    } else {
                        gid_a()
                    };
                    let _ = p.b.handle_mad(p.now, from, &m);
                    while p.b.poll_transmit().is_some() {}
                }
                Step::Wait(ms) => {
                    p.now = p.now + Duration::from_millis(u64::from(ms));
                    p.a.handle_timeout(p.now);
                    p.b.handle_timeout(p.now);
                    p.pump();
                }
                Step::Call(n, c) => {
                    if let Some(&id) = ids.get(n) {
                        let _ = match c {
                            0 => p.b.accept(p.now, id, &accept_params()),
                            1 => p.b.reject(id, b"no"),
                            2 => p.b.delay(id),
                            3 => p.b.disconnect(p.now, id, &[]),
                            4 => p.b.notify_established(id),
                            _ => p.b.ready_to_use(id, &[]),
                        };
                        p.pump();
                    }
                }
                Step::Connect => {
                    let _ = p.a.connect(p.now, &connect_params(0x11 + ids.len() as u32));
                    p.pump();
                }
            }
            for e in std::iter::from_fn(|| p.b.poll_event()) {
                if let Event::ConnectRequest { id, .. } = e {
                    ids.push(id);
                }
            }
            while p.a.poll_event().is_some() {}
            p.a.check_invariants();
            p.b.check_invariants();
        }
        // Every timer drains: retransmissions give up, TimeWaits end.
        for _ in 0..200 {
            let next = [p.a.poll_timeout(), p.b.poll_timeout()];
            let Some(t) = next.into_iter().flatten().min() else {
                break;
            };
            p.now = t;
            p.a.handle_timeout(t);
            p.b.handle_timeout(t);
            while p.a.poll_transmit().is_some() {}
            while p.b.poll_transmit().is_some() {}
        }
        prop_assert_eq!(p.a.poll_timeout(), None);
        prop_assert_eq!(p.b.poll_timeout(), None);
    }
}

/// Ten thousand connections in a row between two agents, one a millisecond, each established,
/// disconnected (DREQ, DREP) and left to its TimeWait, as `rping -s -P` serves them: about two
/// thousand are in TimeWait at once (2.1 s), both sides' QPNs come round again every 4,096
/// connections (after their TimeWait, so never stale), nothing is resent, dropped or
/// unexpected, and once the last TimeWait ends every table of both agents is empty again.
#[test]
fn ten_thousand_connections_in_a_row_leave_every_table_empty() {
    let mut p = Pair::new();
    let mut most = 0;
    for n in 0..10_000u32 {
        p.now = p.now + Duration::from_millis(1);
        let (now, qpn) = (p.now, 0x100 + n % 4096);
        p.a.handle_timeout(now);
        p.b.handle_timeout(now);
        let a_id = p.a.connect(now, &connect_params(qpn)).unwrap();
        p.pump();
        let b_id = Pair::events(&mut p.b)
            .into_iter()
            .find_map(|e| match e {
                Event::ConnectRequest { id, req, .. } => {
                    assert_eq!(req.local_qpn, Qpn::new(qpn));
                    Some(id)
                }
                Event::TimeWaitExit { .. } => None,
                e => panic!("connection {n}: {e:?}"),
            })
            .unwrap_or_else(|| panic!("connection {n}: no request"));
        // The passive side's QPNs come round too (a QPN still in TimeWait would be stale).
        let acc = AcceptParams {
            qpn: Qpn::new(0x1_0000 + n % 4096),
            ..accept_params()
        };
        p.b.accept(now, b_id, &acc).unwrap();
        p.pump();
        p.a.ready_to_use(a_id, &[]).unwrap();
        p.pump();
        p.a.disconnect(now, a_id, &[]).unwrap();
        p.pump();
        assert_eq!(p.a.state(a_id), Some(State::TimeWait), "connection {n}");
        assert_eq!(p.b.state(b_id), Some(State::TimeWait), "connection {n}");
        for cm in [&mut p.a, &mut p.b] {
            for e in Pair::events(cm) {
                assert!(
                    matches!(
                        e,
                        Event::Reply { .. }
                            | Event::Established { .. }
                            | Event::Disconnected { .. }
                            | Event::TimeWaitExit { .. }
                    ),
                    "connection {n}: {e:?}"
                );
            }
        }
        most = most.max(p.b.connections());
    }
    // 2.1 s of TimeWait at one connection a millisecond.
    assert!(
        (2000..2200).contains(&most),
        "{most} connections held at most"
    );
    while p.a.poll_timeout().is_some() || p.b.poll_timeout().is_some() {
        p.tick();
    }
    for cm in [&mut p.a, &mut p.b] {
        let _ = Pair::events(cm);
        cm.check_invariants();
        assert_eq!(cm.table_sizes(), [0; 8]);
        let s = cm.stats();
        assert_eq!(
            (
                s.retransmits,
                s.duplicates,
                s.malformed,
                s.unexpected,
                s.stale
            ),
            (0, 0, 0, 0, 0),
            "{s:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The multipath hint in the REQ and REP (docs/multipath.md, "Hints out of band")
// ---------------------------------------------------------------------------------------

/// The REP of [`every_message`].
fn sample_rep() -> Rep {
    match every_message().swap_remove(3) {
        CmMsg::Rep(r) => r,
        m => panic!("every_message()[3] is a {}", m.name()),
    }
}

/// The hint is bit 0 of attribute byte 27 (MAD byte 51) of a REQ and of a REP, and nothing
/// else moves: with the hint clear, the bytes are those of a MAD without it.
#[test]
fn the_multipath_hint_is_bit_0_of_byte_27_of_a_req_and_a_rep() {
    let plain_req = CmMad::new(Tid(7), CmMsg::Req(Box::new(sample_req())))
        .encode()
        .unwrap();
    // Reserved bytes 24-27 of the REQ (MAD 48-51) are zero without the hint.
    assert_eq!(&plain_req[48..52], &[0, 0, 0, 0]);
    let mut req = sample_req();
    req.multipath_hint = true;
    let hinted_req = CmMad::new(Tid(7), CmMsg::Req(Box::new(req.clone())))
        .encode()
        .unwrap();
    assert_eq!(
        hinted_req[MAD_HDR_LEN + MULTIPATH_HINT_AT],
        MULTIPATH_HINT_BIT
    );
    let diff: Vec<usize> = (0..MAD_LEN)
        .filter(|&i| plain_req[i] != hinted_req[i])
        .collect();
    assert_eq!(diff, vec![51], "only the hint bit differs in the REQ");
    let CmMsg::Req(back) = CmMad::decode(&hinted_req).unwrap().msg else {
        panic!("not a REQ")
    };
    assert!(back.multipath_hint);
    let CmMsg::Req(back) = CmMad::decode(&plain_req).unwrap().msg else {
        panic!("not a REQ")
    };
    assert!(!back.multipath_hint);

    let plain_rep = CmMad::new(Tid(7), CmMsg::Rep(sample_rep()))
        .encode()
        .unwrap();
    let mut rep = sample_rep();
    rep.multipath_hint = true;
    let hinted_rep = CmMad::new(Tid(7), CmMsg::Rep(rep)).encode().unwrap();
    // RNR retry 7 and SRQ stay in the high nibble; the hint takes bit 0 of the reserved one.
    assert_eq!(plain_rep[51], (7 << 5) | 0x10);
    assert_eq!(hinted_rep[51], (7 << 5) | 0x10 | 0x01);
    let diff: Vec<usize> = (0..MAD_LEN)
        .filter(|&i| plain_rep[i] != hinted_rep[i])
        .collect();
    assert_eq!(diff, vec![51], "only the hint bit differs in the REP");
    let CmMsg::Rep(back) = CmMad::decode(&hinted_rep).unwrap().msg else {
        panic!("not a REP")
    };
    assert!(back.multipath_hint);
    assert_eq!(back.rnr_retry_count, 7);
    assert!(back.srq);
}

/// A REQ and a REP as Linux's CM builds them (cm.c `cm_format_req`/`cm_format_rep` into a
/// zeroed MAD; rdma_cm's usual parameters, ECE vendor ID set as ib_cm 5.9+ may send it) carry
/// no hint, and neither do the other reserved bits of byte 27 or the ECE bytes.
#[test]
fn linux_style_mads_carry_no_multipath_hint() {
    // A REQ as rxe's rdma_cm sends for rping: built field by field at the kernel offsets.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, MGMT_CLASS_CM, 2, 0x03]);
    b[8..16].copy_from_slice(&0x0000_0001_2345_6789u64.to_be_bytes());
    b[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    let d = MAD_HDR_LEN;
    b[d..d + 4].copy_from_slice(&0x7a5c_0001u32.to_be_bytes());
    // ECE vendor ID (REQ bytes 5-7): Mellanox's OUI, as mlx5 peers send it.
    b[d + 5..d + 8].copy_from_slice(&[0x00, 0x02, 0xc9]);
    b[d + 8..d + 16].copy_from_slice(&ServiceId::rdma_cm(PortSpace::Tcp, 7174).0.to_be_bytes());
    b[d + 16..d + 24].copy_from_slice(&0x5254_00ff_fe12_3456u64.to_be_bytes());
    b[d + 32..d + 36].copy_from_slice(&[0x00, 0x00, 0x11, 1]);
    b[d + 39] = 1;
    b[d + 43] = 20 << 3;
    b[d + 44..d + 47].copy_from_slice(&[0x12, 0x34, 0x56]);
    b[d + 47] = (20 << 3) | 7;
    b[d + 48..d + 50].copy_from_slice(&[0xff, 0xff]);
    b[d + 50] = (3 << 4) | 7;
    b[d + 51] = 15 << 4;
    b[d + 52..d + 56].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    b[d + 93] = 64;
    b[d + 95] = 19 << 3;
    let CmMsg::Req(req) = CmMad::decode(&b).unwrap().msg else {
        panic!("not a REQ")
    };
    assert!(!req.multipath_hint);
    assert_eq!(req.local_qpn, Qpn::new(0x11));

    // A REP with every defined bit of byte 27 set (RNR retry 7, SRQ) and the ECE vendor ID
    // bytes (15, 19, 23) set: still no hint.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, MGMT_CLASS_CM, 2, 0x03]);
    b[16..18].copy_from_slice(&0x0013u16.to_be_bytes());
    b[d + 12..d + 15].copy_from_slice(&[0, 0, 0x22]);
    b[d + 15] = 0x00;
    b[d + 19] = 0x02;
    b[d + 23] = 0xc9;
    b[d + 27] = (7 << 5) | 0x10;
    let CmMsg::Rep(rep) = CmMad::decode(&b).unwrap().msg else {
        panic!("not a REP")
    };
    assert!(!rep.multipath_hint);
    assert!(rep.srq);
}

/// Between two agents: a REQ that hints and an accept whose QP allows the extension give a
/// REP that hints and a Reply that says so; every other combination gives no hint, and a
/// REP that hints back to a REQ that did not is ignored.
#[test]
fn the_cm_hints_back_only_when_both_sides_allow_the_extension() {
    for (offer, allow) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut p = Pair::new();
        let mut c = connect_params(0x11);
        c.multipath_hint = offer;
        let a_id = p.a.connect(p.now, &c).unwrap();
        assert_eq!(p.a.req_multipath_hint(a_id), offer);
        p.pump();
        let b_id = match Pair::events(&mut p.b).as_slice() {
            [Event::ConnectRequest { id, req, .. }] => {
                assert_eq!(req.multipath_hint, offer);
                *id
            }
            e => panic!("expected one connect request, got {e:?}"),
        };
        assert_eq!(p.b.req_multipath_hint(b_id), offer);
        let mut acc = accept_params();
        acc.multipath_hint = allow;
        p.b.accept(p.now, b_id, &acc).unwrap();
        p.pump();
        match Pair::events(&mut p.a).as_slice() {
            [Event::Reply { id, rep }] => {
                assert_eq!(*id, a_id);
                assert_eq!(
                    rep.multipath_hint,
                    offer && allow,
                    "offer {offer} allow {allow}"
                );
            }
            e => panic!("expected one reply, got {e:?}"),
        }
        assert_eq!(p.a.local_qpn(a_id), Some(Qpn::new(0x11)));
        assert_eq!(p.b.local_qpn(b_id), Some(Qpn::new(0x22)));
    }
}

/// A REP whose hint bit is set although our REQ did not hint (a confused or hostile peer)
/// reaches the consumer without the hint: our QP never hears that its peer allows it.
#[test]
fn a_rep_hinting_to_an_unhinted_req_is_ignored() {
    let mut p = Pair::new();
    let a_id = p.connect();
    let mut req_mad = None;
    while let Some(t) = p.a.poll_transmit() {
        req_mad = Some(t.mad);
    }
    let req = CmMad::decode(&req_mad.expect("a REQ")[..]).unwrap();
    let CmMsg::Req(req) = req.msg else {
        panic!("not a REQ")
    };
    assert!(!req.multipath_hint);
    let mut rep = sample_rep();
    rep.remote_comm_id = a_id;
    rep.local_comm_id = CommId(0x77);
    rep.multipath_hint = true;
    let mad = CmMad::new(Tid(1), CmMsg::Rep(rep)).encode().unwrap();
    p.a.handle_mad(p.now, gid_b(), &mad).unwrap();
    match Pair::events(&mut p.a).as_slice() {
        [Event::Reply { rep, .. }] => assert!(!rep.multipath_hint),
        e => panic!("expected one reply, got {e:?}"),
    }
}
