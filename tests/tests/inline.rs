//! Run-to-completion devices ([`DeviceOptions::inline`]) across a veth pair: a polling
//! thread's turn that receives leaves its transmits (the responder's ACK) in the TX ring for
//! its next verb call, so that the ACK and the answer leave with one kick; when the program
//! then stops calling verbs instead, the device's helper thread must still send the ACK at
//! once, not leave the requester to its ACK timeout. Root.

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use roce::{
    api::{
        Access, Cq, Device, DeviceOptions, Mr, Mtu, Psn, Qp, QpCap, QpType, Qpn, RcConnect, RecvWr,
        SendWr, Wc, WcStatus,
    },
    netns,
};
use roce_tests::{require_root, veth_pair};

/// Rounds of one SEND each.
const ROUNDS: u64 = 20;
/// How long the receiver calls no verb after each message it polled.
const IDLE: Duration = Duration::from_millis(30);
/// The longest a SEND may take to complete: far under the ACK timeout a lost ACK would wait
/// for (timeout 14: 67 ms), far over a loaded machine's scheduling delays.
const ACKED_WITHIN: Duration = Duration::from_millis(20);

/// A QP's address for its peer, exchanged through a channel.
#[derive(Clone, Copy, Debug)]
struct Dest {
    qpn: u32,
    gid: [u8; 16],
}

/// Polls `cq` for one completion, 10 s at most.
fn poll_one(cq: &Cq<'_>) -> Wc {
    let mut wc = [Wc::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.poll(&mut wc) == 0 {
        assert!(Instant::now() < deadline, "no completion within 10 s");
        std::hint::spin_loop();
    }
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    wc[0]
}

/// Opens an inline device on `ifname`, makes an RC QP, swaps addresses through `tx`/`rx`,
/// connects, and runs `f` with the QP's CQ.
fn endpoint<T>(
    ifname: &str,
    tx: &mpsc::Sender<Dest>,
    rx: &mpsc::Receiver<Dest>,
    f: impl FnOnce(&Device, &Qp<'_>, &Mr<'_>, &Cq<'_>) -> T,
) -> T {
    let opts = DeviceOptions {
        inline: true,
        ..DeviceOptions::default()
    };
    let dev = Device::open(ifname, &opts).expect("open");
    let pd = dev.pd().expect("pd");
    let cq = dev.cq(64).expect("cq");
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).expect("mr");
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCap::default()
    };
    let qp = pd.create_qp(&cq, &cq, QpType::Rc, cap).expect("qp");
    qp.to_init(Access::LOCAL_WRITE).expect("init");
    let gid_index = dev.info().default_gid_index(true);
    tx.send(Dest {
        qpn: qp.qpn().value(),
        gid: dev.gid(gid_index).expect("gid").raw,
    })
    .expect("send address");
    let peer = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("peer address");
    let path = qp
        .path_to(gid_index, &peer.gid, Qpn::new(peer.qpn))
        .expect("path");
    qp.connect(&RcConnect::new(
        path,
        Mtu::Mtu1024,
        Qpn::new(peer.qpn),
        Psn::new(peer.qpn),
        Psn::new(qp.qpn().value()),
    ))
    .expect("connect");
    f(&dev, &qp, &mr, &cq)
}

/// The receiver polls for each SEND and then calls no verb for [`IDLE`]: the turn that took
/// the SEND in deferred its ACK's kick; the helper thread must send it. Every SEND completes
/// at the sender within [`ACKED_WITHIN`], and the sender retransmits nothing.
#[test]
fn an_inline_receiver_that_stops_calling_verbs_still_acknowledges_at_once() {
    require_root();
    let pair = veth_pair("inl", 241);
    let (a_tx, b_rx) = mpsc::channel::<Dest>();
    let (b_tx, a_rx) = mpsc::channel::<Dest>();
    // The receiver tells the sender when it polls.
    let (polling_tx, polling_rx) = mpsc::channel::<()>();
    let (nb, ib) = (pair.b.netns.clone(), pair.b.ifname.clone());
    let receiver = std::thread::spawn(move || {
        netns::in_netns(&nb, move || {
            endpoint(&ib, &b_tx, &b_rx, |_, qp, mr, cq| {
                for i in 0..ROUNDS {
                    qp.post_recv(RecvWr {
                        wr_id: i,
                        sg_list: vec![mr.sge(0, 64)],
                    })
                    .expect("post_recv");
                }
                for _ in 0..ROUNDS {
                    polling_tx.send(()).expect("polling");
                    poll_one(cq);
                    std::thread::sleep(IDLE);
                }
            });
        })
        .expect("netns b")
    });
    let (na, ia) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let times = netns::in_netns(&na, move || {
        endpoint(&ia, &a_tx, &a_rx, |dev, qp, mr, cq| {
            let mut times = Vec::new();
            for i in 0..ROUNDS {
                polling_rx
                    .recv_timeout(Duration::from_secs(10))
                    .expect("the receiver polls");
                // Let its polling loop run a few turns first.
                std::thread::sleep(Duration::from_millis(2));
                let t = Instant::now();
                qp.post_send(SendWr::send(i, vec![mr.sge(0, 64)]))
                    .expect("post_send");
                poll_one(cq);
                times.push(t.elapsed());
            }
            let (_, qps) = dev.counters();
            let resent: u64 = qps.iter().map(|(_, c)| c.local_ack_timeout_err).sum();
            (times, resent)
        })
    })
    .expect("netns a");
    receiver.join().expect("receiver");
    let (times, resent) = times;
    eprintln!("SEND completion times: {times:?}");
    let slowest = times.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < ACKED_WITHIN,
        "a SEND took {slowest:?} to complete: its ACK waited (times {times:?})"
    );
    assert_eq!(resent, 0, "the sender's ACK timer expired");
}
