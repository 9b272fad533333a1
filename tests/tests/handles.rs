//! The handle API (`roce::api::{Pd, Mr, Cq, Qp}`) on a real device, and its example
//! `roce-user/examples/rc_write.rs` run as two processes over a veth pair. Root.

use std::time::Duration;

use nix::libc;
use roce::{
    api::{
        Access, ApiError, AttrMask, Device, DeviceOptions, Event, MemBuf, Memory, QpAttr, QpCap,
        QpState, QpType, RecvWr, Wc, WcStatus,
    },
    netns::{self, VethOptions, VethPair},
    transport::DeviceError,
};
use roce_tests::{
    child::{finish_within, spawn_in},
    example_bin, require_root, tag,
};

fn veth(t: &str, subnet: u8, queues: u32) -> VethPair {
    require_root();
    VethPair::new(
        &tag(t),
        &VethOptions {
            subnet,
            queues,
            ..VethOptions::default()
        },
    )
    .expect("veth pair")
}

/// Handles free what they hold when dropped, in the order the borrows force; while they live,
/// the id-based calls refuse to free a PD with a region or QP and a CQ with a QP (`EBUSY`);
/// a CQ polls into a slice; and the explicit releases report what drop only logs.
#[test]
fn handles_release_on_drop_and_objects_in_use_are_busy() {
    let pair = veth("hd", 150, 1);
    let ifname = pair.a.ifname.clone();
    netns::in_netns(&pair.a.netns, move || {
        let dev = Device::open(&ifname, &DeviceOptions::default()).expect("open");
        let (pd_id, cq_id, qpn, lkey) = {
            let pd = dev.pd().unwrap();
            let cq = dev.cq(8).unwrap();
            let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
            let qp = pd
                .create_qp(&cq, &cq, QpType::Rc, QpCap::default())
                .unwrap();
            let busy = dev.dealloc_pd(pd.id()).unwrap_err();
            assert!(
                matches!(busy, ApiError::PdBusy(p) if p == pd.id()),
                "{busy}"
            );
            assert_eq!(busy.errno(), libc::EBUSY);
            let busy = dev.destroy_cq(cq.id()).unwrap_err();
            assert!(
                matches!(busy, ApiError::CqBusy(c) if c == cq.id()),
                "{busy}"
            );
            assert_eq!(busy.errno(), libc::EBUSY);

            mr.write(100, b"handle").unwrap();
            let mut back = [0u8; 6];
            mr.read(100, &mut back).unwrap();
            assert_eq!(&back, b"handle");
            // A buffer the application filled is registered in place and comes back with
            // what was written into it while registered.
            let owned = pd
                .reg_buf(MemBuf::from_slice(b"owned bytes"), Access::LOCAL_WRITE)
                .unwrap();
            assert_eq!(owned.len(), 11);
            owned.write(0, b"O").unwrap();
            let Memory::Owned(buf) = owned.dereg().unwrap() else {
                panic!("a registered buffer comes back as the buffer")
            };
            assert_eq!(&buf[..], b"Owned bytes");

            // Three receives, flushed by ERR, come back through a slice of two.
            qp.to_init(Access::empty()).unwrap();
            for wr_id in 1..=3 {
                let sg_list = vec![mr.sge(0, 64)];
                qp.post_recv(RecvWr { wr_id, sg_list }).unwrap();
            }
            // Armed, the CQ reports its next completion as one event (ibv_req_notify_cq).
            dev.req_notify_cq(cq.id(), false).unwrap();
            assert_eq!(dev.wait_event(Duration::from_millis(50)), None);
            let err = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            qp.modify(&err, AttrMask::STATE).unwrap();
            assert_eq!(
                dev.wait_event(Duration::from_secs(5)),
                Some(Event::CqNotify { cq: cq.id() })
            );
            assert_eq!(qp.state(), Some(QpState::Err));
            let mut wcs = [Wc::default(); 2];
            assert_eq!(cq.poll(&mut wcs), 2);
            assert_eq!(
                wcs.map(|w| (w.wr_id, w.status)),
                [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
            );
            assert_eq!(dev.poll_cq_into(cq.id(), &mut wcs), 1);
            assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (3, qp.qpn()));
            assert_eq!(cq.poll(&mut wcs), 0);
            (pd.id(), cq.id(), qp.qpn(), mr.lkey())
        };
        // Everything went with the handles.
        assert_eq!(dev.qp_state(qpn), None);
        assert!(dev.mr_read(lkey, 0, &mut [0u8; 1]).is_err());
        assert!(matches!(
            dev.dealloc_pd(pd_id),
            Err(ApiError::Device(DeviceError::NoSuchPd(p))) if p == pd_id
        ));
        assert!(matches!(
            dev.destroy_cq(cq_id),
            Err(ApiError::Device(DeviceError::NoSuchCq(c))) if c == cq_id
        ));
        // A new CQ takes the freed slot, and a new QP works in a new PD.
        let pd = dev.pd().unwrap();
        let cq = dev.cq(8).unwrap();
        assert_eq!(cq.id(), cq_id);
        let qp = pd
            .create_qp(&cq, &cq, QpType::Rc, QpCap::default())
            .unwrap();
        qp.to_init(Access::empty()).unwrap();
        qp.destroy().unwrap();
        // A region made through the id calls keeps the PD: the explicit release says so.
        let mr = dev.reg_mr(pd.id(), 64, Access::empty()).unwrap();
        let pd_id = pd.id();
        assert!(matches!(pd.dealloc(), Err(ApiError::PdBusy(p)) if p == pd_id));
        dev.dereg_mr(mr.lkey).unwrap();
        dev.dealloc_pd(pd_id).unwrap();
        cq.destroy().unwrap();
    })
    .expect("enter the namespace");
}

/// On a sharded device the id calls find the PD's and CQ's queue, and the busy errors name
/// the ids the application holds, not a transport's own numbers.
#[test]
fn sharded_dealloc_and_destroy_find_the_queue_of_the_id() {
    let pair = veth("hs", 151, 2);
    let ifname = pair.a.ifname.clone();
    netns::in_netns(&pair.a.netns, move || {
        let opts = DeviceOptions {
            sharded: true,
            ..DeviceOptions::default()
        };
        let dev = Device::open(&ifname, &opts).expect("open");
        assert_eq!(dev.shards(), 2);
        let pd = dev.pd_on(1).unwrap();
        let cq = dev.cq_on(1, 8).unwrap();
        let qp = pd
            .create_qp(&cq, &cq, QpType::Rc, QpCap::default())
            .unwrap();
        assert!(matches!(dev.dealloc_pd(pd.id()), Err(ApiError::PdBusy(p)) if p == pd.id()));
        assert!(matches!(dev.destroy_cq(cq.id()), Err(ApiError::CqBusy(c)) if c == cq.id()));
        qp.destroy().unwrap();
        cq.destroy().unwrap();
        pd.dealloc().unwrap();
    })
    .expect("enter the namespace");
}

/// The api docs' example, `rc_write`, as two processes: the server in one namespace, the
/// client in the other. Both must exit 0 (the server checks the WRITE's and the SEND's bytes
/// itself) and say what moved.
#[test]
fn rc_write_example_writes_and_sends_across_a_veth_pair() {
    let pair = veth("hx", 152, 1);
    let bin = example_bin("rc_write");
    let server = spawn_in(&pair.b.netns, &bin, std::slice::from_ref(&pair.b.ifname));
    let client = spawn_in(
        &pair.a.netns,
        &bin,
        &[pair.a.ifname.clone(), pair.b.ipv4.to_string()],
    );
    let limit = Duration::from_secs(60);
    let c = finish_within(client, limit, "rc_write client");
    let s = finish_within(server, limit, "rc_write server");
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
        String::from_utf8_lossy(&c.stdout).contains("client: wrote 8192 bytes and sent 27 bytes"),
        "client: {}",
        text(&c)
    );
    assert!(
        String::from_utf8_lossy(&s.stdout)
            .contains("server: received a 8192-byte WRITE and a 27-byte SEND"),
        "server: {}",
        text(&s)
    );
    assert!(
        String::from_utf8_lossy(&s.stdout).contains("data ok"),
        "server: {}",
        text(&s)
    );
}

/// Memory window handles on a real device: a type 1 window bound with [`Mw::bind`] and a
/// type 2 window bound with [`Mw::bind_wr`] complete as `BindMw` on the send CQ with the keys
/// the handles predicted, a `LocalInv` of the type 2 window completes as `LocalInv`, the
/// region cannot be deregistered while a window is bound (EINVAL, as rxe), and dropping the
/// windows frees them so that it can. Binds are local operations: the peer QP need not exist.
#[test]
fn memory_window_handles_bind_invalidate_and_free() {
    use roce::api::{Mtu, MwType, Psn, Qpn, RcConnect, SendOp, SendWr, WcOpcode};
    let pair = veth("hw", 153, 1);
    let ifname = pair.a.ifname.clone();
    let peer_ip = pair.b.ipv4;
    netns::in_netns(&pair.a.netns, move || {
        let dev = Device::open(&ifname, &DeviceOptions::default()).expect("open");
        let pd = dev.pd().unwrap();
        let cq = dev.cq(16).unwrap();
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mr = pd
            .reg_mr(4096, Access::LOCAL_WRITE | rw | Access::MW_BIND)
            .unwrap();
        let qp = pd
            .create_qp(&cq, &cq, QpType::Rc, QpCap::default())
            .unwrap();
        qp.to_init(rw).unwrap();
        let gidx = dev.info().default_gid_index(true);
        let gid = peer_ip.to_ipv6_mapped().octets();
        let path = qp.path_to(gidx, &gid, Qpn::new(0x99)).expect("path");
        let c = RcConnect::new(path, Mtu::Mtu1024, Qpn::new(0x99), Psn::new(1), Psn::new(2));
        qp.connect(&c).expect("connect");
        let wait = |what: &str| {
            let wc = cq
                .wait(Duration::from_secs(5))
                .unwrap_or_else(|| panic!("no completion for {what}"));
            assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
            wc
        };

        let mut w1 = pd.alloc_mw(MwType::One).unwrap();
        let old = w1.rkey();
        let k1 = w1.bind(&qp, 1, &mr, 256, 512, rw).unwrap();
        assert_eq!(wait("bind type 1").opcode, WcOpcode::BindMw);
        assert_ne!(k1, old);
        assert_eq!(k1.value() & !0xff, old.value() & !0xff);

        let mut w2 = pd.alloc_mw(MwType::Two).unwrap();
        let (wr, k2) = w2.bind_wr(2, &mr, 1024, 512, rw);
        qp.post_send(wr).unwrap();
        assert_eq!(wait("bind type 2").opcode, WcOpcode::BindMw);
        w2.set_rkey(k2);

        let busy = dev.dereg_mr(mr.lkey()).unwrap_err();
        assert_eq!(busy.errno(), libc::EINVAL, "{busy}");

        let inv = SendOp::LocalInv {
            invalidate_key: k2.value(),
        };
        qp.post_send(SendWr::new(3, inv, Vec::new())).unwrap();
        assert_eq!(wait("local invalidate").opcode, WcOpcode::LocalInv);

        drop(w1);
        drop(w2);
        mr.dereg().expect("no window bound any more");
    })
    .expect("enter the namespace");
}

/// Loopback (issue 22's first part): the `loopback` example connects two RC QPs of one device
/// to each other through the interface's own GID and runs WRITE and READ of 64 KiB, a SEND
/// with immediate data and both atomics, checking every byte itself. Its frames loop back
/// inside the engine, as rxe loops them back: none reaches the wire (the veth's peer receives
/// nothing of them), and the transport counts them as sent and received.
#[test]
fn loopback_example_connects_two_qps_of_one_device() {
    let pair = veth("hl", 154, 1);
    let rx_at_peer = || -> u64 {
        let o = std::process::Command::new("ip")
            .args([
                "-n",
                &pair.b.netns,
                "-j",
                "-s",
                "link",
                "show",
                "dev",
                &pair.b.ifname,
            ])
            .output()
            .expect("ip -s link");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ip's JSON");
        v[0]["stats64"]["rx"]["packets"]
            .as_u64()
            .expect("rx packets")
    };
    let before = rx_at_peer();
    let bin = example_bin("loopback");
    let run = spawn_in(&pair.a.netns, &bin, std::slice::from_ref(&pair.a.ifname));
    let o = finish_within(run, Duration::from_secs(60), "loopback");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "loopback failed: {out}");
    assert!(
        out.contains("WRITE and READ of 65536 bytes, SEND with immediate, fetch-add and compare-swap, data ok"),
        "{out}"
    );
    // 64 WRITE packets, 64 READ responses and their requests and ACKs would be well over a
    // hundred frames; what the peer may see is the odd IPv6 or ARP packet.
    let seen = rx_at_peer() - before;
    assert!(
        seen < 16,
        "{seen} frames reached the peer: loopback went on the wire"
    );
}
