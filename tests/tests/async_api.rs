//! The async API (`roce::api::asynch`) on real devices: its example `async_echo`, a server and
//! a client over 16 RC QPs across a veth pair, every reply checked; and cancellation on one
//! device whose QPs are connected to each other (loopback): futures dropped before their
//! completion keep their buffers registered until it comes (or their QP goes), and the
//! completions after them reach their own futures. Root.

use std::{future::Future, time::Duration};

use roce::{
    api::{
        Access, AttrMask, Device, DeviceOptions, Mtu, Psn, QpAttr, QpCap, QpState, QpType, RKey,
        RcConnect, RecvWr, Sge, WcOpcode, WcStatus,
        asynch::{AsyncDevice, AsyncError, AsyncQp, LocalMr, RemoteMr},
    },
    netns::{self, VethPair},
};
use roce_tests::{
    child::{finish_within, spawn_in},
    example_bin, require_root, veth_pair,
};

fn veth(t: &str, subnet: u8) -> VethPair {
    require_root();
    veth_pair(t, subnet)
}

/// `f`, or a failed test after 10 s instead of a hang.
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within 10 s"))
}

/// `async_echo` as two processes: the server in one namespace, the client with 16 QPs and 40
/// requests on each in the other. The client checks every reply (header and the bytes the
/// server RDMA WROTE back) and both must exit 0 having served and checked all 640.
#[test]
fn async_echo_example_serves_16_qps_across_a_veth_pair() {
    let pair = veth("ae", 164);
    let bin = example_bin("async_echo");
    let server = spawn_in(&pair.b.netns, &bin, std::slice::from_ref(&pair.b.ifname));
    let client = spawn_in(
        &pair.a.netns,
        &bin,
        &[
            pair.a.ifname.clone(),
            pair.b.ipv4.to_string(),
            "16".into(),
            "40".into(),
        ],
    );
    let limit = Duration::from_secs(150);
    let c = finish_within(client, limit, "async_echo client");
    let s = finish_within(server, limit, "async_echo server");
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(c.status.success(), "client failed: {}", text(&c));
    assert!(s.status.success(), "server failed: {}", text(&s));
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("client: 16 QPs, 640 replies checked"),
        "client: {}",
        text(&c)
    );
    assert!(
        String::from_utf8_lossy(&s.stdout).contains("server: served 640 requests on 16 QPs"),
        "server: {}",
        text(&s)
    );
}

/// Connects `a` and `b`, two RC QPs of one device, to each other.
fn connect_pair(dev: &Device, a: &AsyncQp, b: &AsyncQp) {
    let gid_index = dev.info().default_gid_index(true);
    let gid = dev.gid(gid_index).expect("gid").raw;
    for (me, peer) in [(a, b), (b, a)] {
        let path = me.path_to(gid_index, &gid, peer.qpn()).expect("path");
        me.connect(&RcConnect::new(
            path,
            Mtu::Mtu1024,
            peer.qpn(),
            Psn::new(peer.qpn().value()),
            Psn::new(me.qpn().value()),
        ))
        .expect("connect");
    }
}

/// Whether the region of `lkey` is still registered.
fn registered(dev: &Device, mr: roce::api::LKey) -> bool {
    dev.mr_read(mr, 0, &mut [0u8; 1]).is_ok()
}

/// Futures dropped before their completions, on a device whose QPs `a` and `b` are connected
/// to each other: a dropped receive keeps its buffer registered until a message lands in it,
/// and the next receive gets the next message; sends dropped in flight still go, in order, and
/// their buffers are freed once their completions come; a dropped receive of a QP that is
/// destroyed is freed with the QP; the application's own `wr_id`s come out of the CQ's stream;
/// an error completion and the flush after it reach their futures; the handle API's
/// `Cq::ready` wakes on a flush another thread's modify causes. Nothing hangs or leaks.
#[test]
fn dropped_futures_keep_their_buffers_until_completion_and_later_completions_reach_their_waiters() {
    cancellation("ac", 165, DeviceOptions::default());
}

/// The same on an inline device ([`DeviceOptions::inline`]): no engine threads; each poll of a
/// future runs an engine turn, and the inline helper thread's turns wake the waiting tasks.
#[test]
fn cancellation_and_dispatch_hold_on_an_inline_device() {
    cancellation(
        "ai",
        166,
        DeviceOptions {
            inline: true,
            ..DeviceOptions::default()
        },
    );
}

fn cancellation(t: &str, subnet: u8, opts: DeviceOptions) {
    let pair = veth(t, subnet);
    let ifname = pair.a.ifname.clone();
    netns::in_netns(&pair.a.netns, move || {
        let adev = AsyncDevice::new(Device::open(&ifname, &opts).expect("open"));
        let dev = std::sync::Arc::clone(adev.device());
        let pd = adev.pd().unwrap();
        let (scq, rcq) = (adev.cq(64).unwrap(), adev.cq(64).unwrap());
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            ..QpCap::default()
        };
        let qp = || {
            let q = pd.create_qp(&scq, &rcq, QpType::Rc, cap).unwrap();
            q.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
            q
        };
        let (a, b) = (qp(), qp());
        connect_pair(&dev, &a, &b);
        let buf = || pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            // 1. A receive dropped before its message: the message lands in its buffer, which
            //    is freed then; the next receive gets the next message.
            let first = buf();
            let first_key = first.lkey();
            let dropped = a.recv(first);
            let kept = a.recv(buf());
            drop(dropped);
            assert_eq!(rcq.abandoned(), 1);
            assert!(registered(&dev, first_key), "abandoned, not freed");
            let mut m = buf();
            for msg in [&b"first"[..], b"second"] {
                m.write(0, msg).unwrap();
                let (r, back) = within("send", b.send(m, msg.len() as u32)).await;
                assert_eq!(r.expect("send").opcode, WcOpcode::Send);
                m = back;
            }
            let (r, got) = within("the kept receive", kept).await;
            let wc = r.expect("receive");
            assert_eq!((wc.byte_len, wc.qp_num), (6, a.qpn()));
            assert_eq!(got.to_vec(0, 6).unwrap(), b"second");
            assert_eq!(
                rcq.abandoned(),
                0,
                "the first message released the dropped receive"
            );
            assert!(
                !registered(&dev, first_key),
                "and its buffer is deregistered"
            );

            // 2. Sends dropped while in flight still go, in order, and are freed once their
            //    completions come; the receives get every message.
            let recvs: Vec<_> = (0..8).map(|_| a.recv(buf())).collect();
            let mut keys = Vec::new();
            for i in 0..8u8 {
                let s = buf();
                s.write(0, &[b'm', b'0' + i]).unwrap();
                keys.push(s.lkey());
                drop(b.send(s, 2));
            }
            for (i, f) in recvs.into_iter().enumerate() {
                let (r, got) = within("a receive", f).await;
                assert_eq!(r.expect("receive").byte_len, 2);
                assert_eq!(got.to_vec(0, 2).unwrap(), [b'm', b'0' + i as u8]);
            }
            // A send awaited after them drains their completions (RC completes in order).
            m.write(0, b"last").unwrap();
            let last = a.recv(buf());
            let (r, _m) = within("the last send", b.send(m, 4)).await;
            r.expect("last send");
            assert_eq!(
                within("last receive", last).await.0.expect("recv").byte_len,
                4
            );
            assert_eq!(scq.abandoned(), 0);
            assert!(
                keys.iter().all(|k| !registered(&dev, *k)),
                "dropped sends freed"
            );

            // 3. A receive that never gets a message, dropped (a timeout), is freed with its
            //    QP.
            let c = qp();
            let lonely = buf();
            let key = lonely.lkey();
            let timed_out = tokio::time::timeout(Duration::from_millis(20), c.recv(lonely)).await;
            assert!(timed_out.is_err(), "no message can come");
            assert_eq!(rcq.abandoned(), 1);
            assert!(registered(&dev, key));
            drop(c);
            assert_eq!(rcq.abandoned(), 0);
            assert!(!registered(&dev, key), "freed with its QP");

            // 4. The application's own wr_ids come out of the CQ's stream; bit 63 is refused.
            let own = buf();
            let sge = Sge {
                addr: own.addr(),
                length: 64,
                lkey: own.lkey(),
            };
            let refused = a.post_recv(RecvWr {
                wr_id: 1 << 63,
                sg_list: vec![sge],
            });
            assert!(matches!(refused, Err(AsyncError::ReservedWrId(_))));
            a.post_recv(RecvWr {
                wr_id: 7,
                sg_list: vec![sge],
            })
            .unwrap();
            let mut m = buf();
            m.write(0, b"stream").unwrap();
            let (r, back) = within("send", b.send(m, 6)).await;
            r.unwrap();
            m = back;
            let mut stream = rcq.unclaimed();
            let wc = within("the stream", stream.next_wc()).await;
            assert_eq!(
                (wc.wr_id, wc.byte_len, wc.status),
                (7, 6, WcStatus::Success)
            );
            assert_eq!(own.to_vec(0, 6).unwrap(), b"stream");

            // 5. An RDMA WRITE to a key the peer never gave fails with its completion, and a
            //    receive posted after it is flushed: both reach their futures.
            let bogus = RemoteMr {
                addr: 0x10,
                rkey: RKey::new(0x00ab_cd00),
                len: 64,
            };
            let (r, _m) = within("a bad write", b.write(m, 0, 16, bogus)).await;
            match r {
                Err(AsyncError::Completion(wc)) => {
                    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
                }
                other => panic!("expected an access error, got {other:?}"),
            }
            let (r, _): (_, LocalMr) = within("a flushed receive", b.recv(buf())).await;
            match r {
                Err(AsyncError::Completion(wc)) => assert_eq!(wc.status, WcStatus::WrFlushErr),
                other => panic!("expected a flush, got {other:?}"),
            }
            // A region too short for what is asked is refused before anything is posted.
            let (r, _) = within("a refused post", a.send(buf(), 65)).await;
            assert!(matches!(r, Err(AsyncError::Range { len: 65, .. })), "{r:?}");
        });
        assert_eq!(scq.stale() + rcq.stale(), 0);

        // 6. The handle API's future (`Cq::ready`, on `Device::poll_cq_or_wake` as the async
        //    API is) wakes when another thread's modify to ERR flushes a receive.
        {
            let hpd = dev.pd().unwrap();
            let hcq = dev.cq(4).unwrap();
            let hqp = hpd
                .create_qp(&hcq, &hcq, QpType::Rc, QpCap::default())
                .unwrap();
            hqp.to_init(Access::LOCAL_WRITE).unwrap();
            let mr = hpd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
            hqp.post_recv(RecvWr {
                wr_id: 42,
                sg_list: vec![mr.sge(0, 64)],
            })
            .unwrap();
            let wc = std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    let err = QpAttr {
                        qp_state: QpState::Err,
                        ..QpAttr::default()
                    };
                    hqp.modify(&err, AttrMask::STATE).unwrap();
                });
                rt.block_on(within("Cq::ready", hcq.ready()))
            });
            assert_eq!((wc.wr_id, wc.status), (42, WcStatus::WrFlushErr));
        }
        drop((a, b));
        assert_eq!(rcq.abandoned() + scq.abandoned(), 0);
    })
    .expect("enter the namespace");
}
