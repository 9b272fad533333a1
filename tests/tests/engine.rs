//! `roce engine` (docs/multiprocess.md, step 1): one process owns an interface's device and
//! serves several programs over its Unix socket. Root; the namespaces and veths are the
//! test's own, the engine is killed by PID if the test fails.

use std::{
    io::{Read as _, Write as _},
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use nix::errno::Errno;
use roce::api::{
    Access, QpInit, QpState, QpType,
    remote::{EngineClient, RemoteError, proto},
};
use roce_tests::{
    child::{Reaper, finish_within, json_ok, spawn},
    engine::{
        EMPTY, SocketGuard, exec_shared, socket_path, start_engine, wait_listening, wait_status,
    },
    ipv4_gid_index, require_root, roce_bin, veth_pair,
};

/// Whether `ip link show` reports an XDP program on `ifname` in `ns`.
fn xdp_attached(ns: &str, ifname: &str) -> bool {
    let o = Command::new("ip")
        .args(["-n", ns, "link", "show", "dev", ifname])
        .output()
        .expect("ip link");
    assert!(o.status.success(), "ip link show {ifname}");
    String::from_utf8_lossy(&o.stdout).contains("prog/xdp")
}

/// `roce engine -i IF --status` run as `nobody` inside the namespace: (success, stderr).
fn status_as_nobody(ns: &str, ifname: &str) -> (bool, String) {
    let o = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{ns}"))
        .args(["--setuid", "65534", "--setgid", "65534", "--"])
        .arg(roce_bin())
        .args(["engine", "-i", ifname, "--status"])
        .output()
        .expect("nsenter");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[track_caller]
fn errno_of<T: std::fmt::Debug>(r: Result<T, RemoteError>) -> i32 {
    r.expect_err("the engine must refuse this").errno()
}

#[test]
fn engine_serves_several_programs_keeps_their_objects_apart_and_leaves_with_the_last() {
    require_root();
    let pair = veth_pair("eng", 91);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    assert!(
        !xdp_attached(&ns, &ifname),
        "a fresh veth has no XDP program"
    );
    let (engine, path, _socket) = start_engine(&ns, &ifname, "1", Duration::from_secs(20));
    let mode = std::fs::metadata(&path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the engine socket is root's alone");

    // The engine accepts once the device is open: the first Hello answered, roce_xdp is on.
    let mut a = EngineClient::connect_at(&path).expect("client a");
    assert!(xdp_attached(&ns, &ifname), "the engine loaded roce_xdp");

    // A second engine on the same interface is refused, and leaves the first one's socket.
    let second = Command::new(roce_bin())
        .args(["--netns", &ns, "engine", "-i", &ifname])
        .output()
        .expect("second engine");
    assert!(!second.status.success(), "a second engine must not start");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already serves"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(path.exists());

    // Two programs (two connections of this process; the engine tells them apart by
    // connection, as it tells processes apart).
    let mut b = EngineClient::connect_at(&path).expect("client b");
    assert_eq!(a.engine_pid(), engine.pid());
    let gid = a.query_gid(1).expect("GID 1");
    assert_eq!(
        &gid[12..],
        &pair.a.ipv4.octets(),
        "GID 1 is the IPv4-mapped address"
    );
    assert_eq!(errno_of(a.query_gid(1000)), Errno::EINVAL as i32);

    let pd = a.alloc_pd().expect("alloc_pd");
    // Memory of this process, registered through the engine, which reaches it with
    // the program's /proc/PID/mem (it read the first and last byte to accept it).
    let mut region = vec![0u8; 3 * 4096];
    let addr = region.as_mut_ptr() as u64;
    let (lkey, _rkey) = a
        .reg_mr(
            pd,
            addr,
            3 * 4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("reg_mr");
    let (lkey2, _) = a
        .reg_mr(pd, addr + 100, 10, Access::empty())
        .expect("a second region over part of the first");
    assert_ne!(lkey, lkey2);
    assert_eq!(
        errno_of(a.reg_mr(pd, 16, 64, Access::LOCAL_WRITE)),
        Errno::EFAULT as i32,
        "page 0 is not mapped in this process"
    );
    assert_eq!(
        errno_of(a.reg_mr(pd, u64::MAX - 8, 64, Access::LOCAL_WRITE)),
        Errno::EINVAL as i32,
        "a range that wraps"
    );
    a.dereg_mr(lkey2).expect("dereg_mr");
    assert_eq!(errno_of(a.dereg_mr(lkey2)), Errno::EINVAL as i32, "twice");
    let cq = a.create_cq(64).expect("create_cq");
    let qpn = a
        .create_qp(&QpInit::new(QpType::Rc, pd, cq))
        .expect("create_qp");
    assert_eq!(
        a.query_qp(qpn).expect("query"),
        (QpType::Rc, QpState::Reset)
    );
    a.qp_to_init(qpn, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .expect("to INIT");
    assert_eq!(a.query_qp(qpn).expect("query"), (QpType::Rc, QpState::Init));
    assert_eq!(
        errno_of(a.dealloc_pd(pd)),
        Errno::EBUSY as i32,
        "a QP uses the PD"
    );
    assert_eq!(
        errno_of(a.destroy_cq(cq)),
        Errno::EBUSY as i32,
        "a QP completes on it"
    );
    assert_eq!(errno_of(a.create_cq(0)), Errno::EINVAL as i32);

    // B cannot name A's objects, and makes its own.
    assert_eq!(errno_of(b.query_qp(qpn)), Errno::EINVAL as i32);
    assert_eq!(errno_of(b.destroy_qp(qpn)), Errno::EINVAL as i32);
    assert_eq!(errno_of(b.dealloc_pd(pd)), Errno::EINVAL as i32);
    assert_eq!(errno_of(b.destroy_cq(cq)), Errno::EINVAL as i32);
    assert_eq!(errno_of(b.dereg_mr(lkey)), Errno::EINVAL as i32);
    assert_eq!(
        errno_of(b.create_qp(&QpInit::new(QpType::Rc, pd, cq))),
        Errno::EINVAL as i32,
        "a QP in another program's PD"
    );
    let bpd = b.alloc_pd().expect("b pd");
    let bcq = b.create_cq(16).expect("b cq");
    let bqp = b
        .create_qp(&QpInit::new(QpType::Ud, bpd, bcq))
        .expect("b qp");
    assert_ne!(bqp, qpn);
    assert_eq!(b.status().expect("status").clients_qps(), (2, 2));

    // A garbage frame costs its sender its connection and nobody else anything.
    let mut raw = UnixStream::connect(&path).expect("raw");
    raw.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    raw.read_to_end(&mut got)
        .expect("the engine answers, then closes");
    let (f, _) = proto::decode_reply(&got).expect("decodes").expect("whole");
    assert_eq!(
        (f.kind, f.msg),
        (proto::REJECT, proto::Reply::Err(Errno::EPROTO as i32))
    );
    assert_eq!(
        b.query_qp(bqp).expect("b still served"),
        (QpType::Ud, QpState::Reset)
    );

    // Without root: the 0600 file stops the connect; past it, SO_PEERCRED refuses.
    let (ok, err) = status_as_nobody(&ns, &ifname);
    assert!(!ok && err.contains("Permission denied"), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let (ok, err) = status_as_nobody(&ns, &ifname);
    assert!(
        !ok && err.contains("engine refused the connection: Permission denied"),
        "{err}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // A leaves without cleaning up: the engine destroys its QP, MR, CQ and PD.
    drop(a);
    // The engine may touch `region` until it released A's MR: keep it until then.
    let t0 = Instant::now();
    loop {
        let (clients, qps) = b.status().expect("status").clients_qps();
        if (clients, qps) == (1, 1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "A's objects were not released: {clients} clients, {qps} QPs"
        );
        thread::sleep(Duration::from_millis(20));
    }
    drop(region);
    b.destroy_qp(bqp).expect("b destroys its QP");
    b.destroy_cq(bcq).expect("b destroys its CQ");
    b.dealloc_pd(bpd).expect("b frees its PD");
    assert_eq!(b.status().expect("status").clients_qps(), (1, 0));

    // The last program leaves: the engine lingers 1 s, exits, unloads, removes its socket.
    drop(b);
    let report = engine_report(
        engine,
        Duration::from_secs(10),
        "engine after its last client",
    );
    // a, b, the second engine's probe, the garbage sender and the nobody past the file mode.
    assert_eq!(report["connections"], 5, "{report}");
    assert_eq!(report["refused"], 1, "{report}");
    assert!(!path.exists(), "the socket file is removed");
    assert!(
        !path.parent().expect("folder").exists(),
        "and the namespace's folder, empty now"
    );
    assert!(
        !xdp_attached(&ns, &ifname),
        "the engine unloaded the roce_xdp it loaded"
    );
}

#[test]
fn engine_without_clients_exits_after_its_linger() {
    require_root();
    let pair = veth_pair("engl", 92);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let path = socket_path(&ns, &ifname);
    let t0 = Instant::now();
    let _socket = SocketGuard(path.clone());
    let mut engine = spawn(
        &ns,
        &["engine", "-i", &ifname, "--linger", "0.5"].map(String::from),
    );
    wait_listening(&path, Duration::from_secs(20), &mut engine);
    let _ = engine_report(engine, Duration::from_secs(10), "idle engine");
    assert!(t0.elapsed() >= Duration::from_millis(500));
    assert!(!path.exists());
    assert!(!path.parent().expect("folder").exists());
    assert!(!xdp_attached(&ns, &ifname));
}

/// Waits at most `limit` for `engine` (a `roce engine` started by the test) to exit, checks
/// it exited with status 0, and returns the JSON report it printed.
fn engine_report(engine: Reaper, limit: Duration, what: &str) -> serde_json::Value {
    let out = finish_within(engine, limit, what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("engine JSON")
}

/// Polls `cq` through `c` until one completion arrives, for at most five seconds.
fn one_wc(c: &mut EngineClient, cq: roce::api::CqId) -> proto::WireWc {
    let t0 = Instant::now();
    loop {
        let wcs = c.poll_cq(cq, 4).expect("poll_cq");
        if let Some(w) = wcs.first() {
            assert_eq!(wcs.len(), 1, "one WR, one completion: {wcs:?}");
            return *w;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no completion");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Data through the engine: two programs (two connections) with an RC QP each, connected
/// to each other on the same interface (loopback inside the one engine), WRITE, READ and
/// SEND between their registered memory, which the engine reaches through /proc/PID/mem; every
/// byte checked.
#[test]
fn engine_moves_data_between_two_programs_on_one_interface() {
    use roce::api::remote::proto::{WireOp, WireSendWr, WireSge};
    use roce::api::{Mtu, WcOpcode, WcStatus};
    require_root();
    let pair = veth_pair("engd", 93);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "1", Duration::from_secs(20));
    let mut a = EngineClient::connect_at(&path).expect("a");
    let mut b = EngineClient::connect_at(&path).expect("b");
    const N: usize = 8192;
    let mut mem_a: Vec<u8> = (0..N).map(|i| (i * 7 + 3) as u8).collect();
    let mut mem_b = vec![0u8; N];
    let (addr_a, addr_b) = (mem_a.as_mut_ptr() as u64, mem_b.as_mut_ptr() as u64);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let side = |c: &mut EngineClient, addr: u64| {
        let pd = c.alloc_pd().expect("pd");
        let (lkey, rkey) = c.reg_mr(pd, addr, N as u64, access).expect("mr");
        let cq = c.create_cq(16).expect("cq");
        let qpn = c.create_qp(&QpInit::new(QpType::Rc, pd, cq)).expect("qp");
        c.qp_to_init(qpn, access).expect("init");
        (lkey, rkey, cq, qpn)
    };
    let (lkey_a, rkey_a, cq_a, qp_a) = side(&mut a, addr_a);
    let (lkey_b, rkey_b, cq_b, qp_b) = side(&mut b, addr_b);
    let gid = a.query_gid(1).expect("gid");
    a.qp_connect(qp_a, 1, gid, qp_b, 200, 100, Mtu::Mtu1024)
        .expect("a connects");
    b.qp_connect(qp_b, 1, gid, qp_a, 100, 200, Mtu::Mtu1024)
        .expect("b connects");
    assert_eq!(a.query_qp(qp_a).expect("q"), (QpType::Rc, QpState::Rts));

    // A writes all of its region into B's (8 packets of 1024 bytes).
    let sge = |addr: u64, length: u32, lkey: roce::api::LKey| WireSge {
        addr,
        length,
        lkey: lkey.value(),
    };
    a.post_send(
        qp_a,
        WireSendWr {
            wr_id: 1,
            op: WireOp::Write {
                remote_addr: addr_b,
                rkey: rkey_b.value(),
            },
            signaled: true,
            sges: vec![sge(addr_a, N as u32, lkey_a)],
        },
    )
    .expect("post WRITE");
    let w = one_wc(&mut a, cq_a);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    std::hint::black_box(&mut mem_b);
    assert!(mem_b == mem_a, "B's memory holds what A wrote");

    // A changes its memory; B reads the first half back into its second half.
    for (i, x) in mem_a.iter_mut().enumerate() {
        *x = (i * 13 + 5) as u8;
    }
    std::hint::black_box(&mut mem_a);
    b.post_send(
        qp_b,
        WireSendWr {
            wr_id: 2,
            op: WireOp::Read {
                remote_addr: addr_a,
                rkey: rkey_a.value(),
            },
            signaled: true,
            sges: vec![sge(addr_b + (N / 2) as u64, (N / 2) as u32, lkey_b)],
        },
    )
    .expect("post READ");
    let w = one_wc(&mut b, cq_b);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    std::hint::black_box(&mut mem_b);
    assert!(mem_b[N / 2..] == mem_a[..N / 2], "B read A's new bytes");

    // SEND from A's first 1500 bytes into a receive B posted at its start.
    b.post_recv(qp_b, 3, vec![sge(addr_b, 2048, lkey_b)])
        .expect("post_recv");
    a.post_send(
        qp_a,
        WireSendWr {
            wr_id: 4,
            op: WireOp::Send,
            signaled: true,
            sges: vec![sge(addr_a, 1500, lkey_a)],
        },
    )
    .expect("post SEND");
    let w = one_wc(&mut a, cq_a);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (4, WcStatus::Success, WcOpcode::Send)
    );
    let w = one_wc(&mut b, cq_b);
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num),
        (3, WcStatus::Success, WcOpcode::Recv, 1500, qp_b.value())
    );
    std::hint::black_box(&mut mem_b);
    assert!(mem_b[..1500] == mem_a[..1500], "B received A's message");

    // A WRITE with B's rkey to a range outside B's region fails as a remote access error.
    a.post_send(
        qp_a,
        WireSendWr {
            wr_id: 5,
            op: WireOp::Write {
                remote_addr: addr_b + N as u64,
                rkey: rkey_b.value(),
            },
            signaled: true,
            sges: vec![sge(addr_a, 64, lkey_a)],
        },
    )
    .expect("post WRITE");
    let w = one_wc(&mut a, cq_a);
    assert_eq!((w.wr_id, w.status), (5, WcStatus::RemAccessErr));

    drop(a);
    drop(b);
    let _ = engine_report(
        engine,
        Duration::from_secs(10),
        "engine after its last client",
    );
    drop(mem_a);
    drop(mem_b);
}

/// The first proof, at the verbs level: two separate processes (the example
/// `engine_peer`, a writer and a target) on the same interface in the same namespace, both
/// through one engine; the writer's 64 KiB land in the target's memory, every byte checked.
#[test]
fn two_processes_write_through_one_engine() {
    require_root();
    let pair = veth_pair("engp", 94);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "1", Duration::from_secs(20));
    // A client at once: an engine without one leaves after its linger, and starting the two
    // programs may take longer than that on a loaded machine.
    let watch = EngineClient::connect_at(&path).expect("watcher");
    let dir = std::env::temp_dir().join(format!("roce-engp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("exchange folder");
    let peer = roce_tests::example_bin("engine_peer");
    let run = |role: &str| {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/var/run/netns/{ns}"))
            .arg("--")
            .arg(&peer)
            .arg(&path)
            .arg(&dir)
            .arg(role);
        roce_tests::child::spawn_command(cmd)
    };
    let target = run("target");
    let writer = run("writer");
    let w = finish_within(writer, Duration::from_secs(30), "writer");
    let t = finish_within(target, Duration::from_secs(30), "target");
    let _ = std::fs::remove_dir_all(&dir);
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(w.status.success(), "writer: {}", text(&w));
    assert!(t.status.success(), "target: {}", text(&t));
    let epid = engine.pid().to_string();
    assert!(
        text(&t).contains("all right") && text(&t).contains(&epid),
        "{}",
        text(&t)
    );
    assert!(text(&w).contains(&epid), "{}", text(&w));
    drop(watch);
    let report = engine_report(
        engine,
        Duration::from_secs(10),
        "engine after its last client",
    );
    assert_eq!(
        report["connections"], 3,
        "the two programs and the watcher: {report}"
    );
}

/// Lifecycle: a program holding a PD, an MR, a CQ and a QP in the engine is killed with
/// SIGKILL while another pair of programs runs a WRITE through the same engine: the pair
/// finishes with every byte right, and the dead program's QP is reclaimed.
#[test]
fn a_killed_program_is_reclaimed_and_the_others_go_on() {
    require_root();
    let pair = veth_pair("engk", 95);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "1", Duration::from_secs(20));
    // The watcher at once: an engine without a client leaves after its linger, and starting
    // the victim may take longer than that on a loaded machine.
    let mut watch = EngineClient::connect_at(&path).expect("watcher");
    let base = std::env::temp_dir().join(format!("roce-engk-{}", std::process::id()));
    let (vdir, pdir) = (base.join("victim"), base.join("pair"));
    for d in [&vdir, &pdir] {
        std::fs::create_dir_all(d).expect("exchange folder");
    }
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(base);
    let peer = roce_tests::example_bin("engine_peer");
    let run = |dir: &Path, role: &str| {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/var/run/netns/{ns}"))
            .arg("--")
            .arg(&peer)
            .arg(&path)
            .arg(dir)
            .arg(role);
        roce_tests::child::spawn_command(cmd)
    };
    let wait_path = |p: &Path| {
        let t0 = Instant::now();
        while !p.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "no {}", p.display());
            thread::sleep(Duration::from_millis(10));
        }
    };
    // The victim: a target whose writer never comes; its objects exist once its file does.
    let mut victim = run(&vdir, "target");
    wait_path(&vdir.join("target"));
    assert_eq!(watch.status().expect("status").clients_qps(), (2, 1));
    let target = run(&pdir, "target");
    wait_path(&pdir.join("target"));
    let writer = run(&pdir, "writer");
    victim.kill().expect("SIGKILL the victim");
    let w = finish_within(writer, Duration::from_secs(30), "writer");
    let t = finish_within(target, Duration::from_secs(30), "target");
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(w.status.success(), "writer: {}", text(&w));
    assert!(
        t.status.success() && text(&t).contains("all right"),
        "target: {}",
        text(&t)
    );
    let t0 = Instant::now();
    loop {
        let st = watch.status().expect("status").clients_qps();
        if st == (1, 0) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the victim's QP stays: {st:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    drop(watch);
    let _ = engine_report(
        engine,
        Duration::from_secs(10),
        "engine after its last client",
    );
}

/// Issue 22's first proof: `roce perf` server and client as two processes on one interface
/// of one namespace, both with `--engine`, so both reach the interface through one
/// `roce engine` (their QPs connect to each other by loopback inside the engine). WRITE,
/// READ and SEND with `--span` (every byte of every message checked where it landed),
/// one multi-packet WRITE size, fetch-and-add and compare-and-swap, and the WRITE and SEND
/// latency ping-pongs; each side's JSON says `verified: true`. Before the engine runs, `--engine` fails with the way to start one; the
/// engine served every perf process and leaves (taking roce_xdp with it) after the last.
/// Sizes are small: every post and poll is a round trip on the engine's socket.
#[test]
fn perf_server_and_client_share_one_interface_through_the_engine() {
    require_root();
    let pair = veth_pair("engf", 96);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let path = socket_path(&ns, &ifname);
    let _socket = SocketGuard(path.clone());
    let host = pair.a.ipv4.to_string();
    let perf = |args: &str, port: u16, client: bool| {
        let mut v: Vec<String> = args.split_whitespace().map(String::from).collect();
        v.extend(["-d", &ifname, "--engine", "-p", &port.to_string()].map(String::from));
        if client {
            v.push(host.clone());
        }
        spawn(&ns, &v)
    };

    // No engine yet: refused, saying how to start one.
    let o = finish_within(
        perf("perf write -n 1", 18_650, true),
        Duration::from_secs(20),
        "perf --engine without an engine",
    );
    assert!(!o.status.success(), "perf --engine ran without an engine");
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).expect("error JSON");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("roce engine -i {ifname}"))),
        "{err}"
    );

    let mut engine = spawn(
        &ns,
        &["engine", "-i", &ifname, "--linger", "5"].map(String::from),
    );
    wait_listening(&path, Duration::from_secs(20), &mut engine);
    let runs = [
        ("write", "perf write -s 4096 -n 400 -t 16 --span 65536"),
        ("write", "perf write -s 65536 -n 40 -t 4"),
        ("read", "perf read -s 4096 -n 400 -t 16 --span 65536"),
        ("send", "perf send -s 4096 -n 400 -t 16 -r 32 --span 131072"),
        ("atomic", "perf atomic -n 300 -t 16"),
        ("atomic", "perf atomic --cmp-swap -n 200 -t 16"),
        // The latency ping-pongs: WRITE polls the iteration number in memory, SEND waits.
        ("write", "perf write --lat -s 64 -n 100"),
        ("send", "perf send --lat -s 64 -n 100"),
    ];
    for (i, (op, args)) in runs.iter().enumerate() {
        let port = 18_651 + i as u16;
        let t0 = Instant::now();
        let server = perf(args, port, false);
        let c = finish_within(perf(args, port, true), Duration::from_secs(120), args);
        let s = finish_within(server, Duration::from_secs(30), args);
        let (c, s) = (
            roce_tests::child::json_ok(&c, &format!("client {args}")),
            roce_tests::child::json_ok(&s, &format!("server {args}")),
        );
        for (side, v) in [("client", &c), ("server", &s)] {
            assert_eq!(v["verified"], true, "{side} of {args}: {v}");
            assert_eq!(v["op"], *op, "{side} of {args}: {v}");
            assert_eq!(v["role"], side, "{v}");
            assert_eq!(v["atomic_mismatches"], 0, "{side} of {args}: {v}");
        }
        let n: u64 = args
            .split_whitespace()
            .skip_while(|w| *w != "-n")
            .nth(1)
            .and_then(|w| w.parse().ok())
            .expect("-n");
        assert_eq!(c["messages"], n, "{args}: {c}");
        eprintln!(
            "{args}: {:.1} s, client {:.2} MB/s",
            t0.elapsed().as_secs_f64(),
            c["bw_mb_per_sec"].as_f64().unwrap_or(0.0)
        );
    }
    let report = engine_report(
        engine,
        Duration::from_secs(30),
        "engine after its last client",
    );
    assert_eq!(
        report["connections"],
        2 * runs.len(),
        "every perf process went through the engine: {report}"
    );
    assert!(
        !xdp_attached(&ns, &ifname),
        "the engine unloads roce_xdp when it leaves"
    );
    assert!(!path.exists(), "the engine removed its socket");
}

/// `roce pingpong --engine` (ibv_rc_pingpong's test) with server and client on one interface
/// of one namespace, through one `roce engine`: before the engine runs, `--engine` fails
/// saying how to start one, and `-R` and the device options of this process are refused with
/// it; then 1 byte, 4 KiB, 64 KiB and 4 KiB with `-e` (completions waited for), every
/// exchange done on both sides, each side's QP the other's peer, and with `-c` every byte of
/// every message checked (at 1 byte `-c` has nothing to tell, so that run goes without). Then
/// Debian's unmodified ibv_rc_pingpong on the drop-in library through the same engine, as
/// the server (with its `-c`, which checks what our `-c` client sent) and as the client. After
/// each pair the engine holds nothing of theirs.
#[test]
fn pingpong_server_and_client_share_one_interface_through_the_engine() {
    require_root();
    let pair = veth_pair("engpp", 210);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let path = socket_path(&ns, &ifname);
    let _socket = SocketGuard(path.clone());
    let host = pair.a.ipv4.to_string();
    let pingpong = |args: &[&str], port: u16, client: bool| {
        let mut v: Vec<String> = ["pingpong", "-d", &ifname, "--engine", "-p"]
            .map(String::from)
            .to_vec();
        v.push(port.to_string());
        v.extend(args.iter().map(|a| (*a).to_owned()));
        if client {
            v.push(host.clone());
        }
        spawn(&ns, &v)
    };
    let error_of = |r: Reaper, what: &str| {
        let o = finish_within(r, Duration::from_secs(20), what);
        assert!(!o.status.success(), "{what} ran");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("error JSON");
        v["error"].as_str().unwrap_or_default().to_owned()
    };

    // No engine yet: refused, saying how to start one; -R and this process's device options
    // are refused before the engine is asked.
    let e = error_of(pingpong(&["-n", "1"], 18_736, true), "pingpong --engine");
    assert!(e.contains(&format!("roce engine -i {ifname}")), "{e}");
    let e = error_of(pingpong(&["-R"], 18_737, true), "pingpong --engine -R");
    assert!(e.contains("RDMA CM") && e.contains("engine"), "{e}");
    let e = error_of(
        pingpong(&["--threaded"], 18_737, true),
        "--engine --threaded",
    );
    assert!(e.contains("--threaded") && e.contains("engine's"), "{e}");

    let (engine, _, _guard) = start_engine(&ns, &ifname, "5", Duration::from_secs(20));
    let mut watch = EngineClient::connect_at(&path).expect("watcher");
    let runs: [(&[&str], u64, u64, bool); 4] = [
        (&["-s", "1", "-n", "500"], 1, 500, false),
        (&["-s", "4096", "-n", "300", "-c"], 4096, 300, true),
        (&["-s", "65536", "-n", "40", "-c"], 65_536, 40, true),
        (&["-s", "4096", "-n", "200", "-c", "-e"], 4096, 200, true),
    ];
    for (i, (args, size, iters, checked)) in runs.iter().enumerate() {
        let port = 18_730 + i as u16;
        let t0 = Instant::now();
        let server = pingpong(args, port, false);
        roce_tests::rxe::wait_host_listen(&ns, port, Duration::from_secs(30));
        let c = finish_within(
            pingpong(args, port, true),
            Duration::from_secs(120),
            "client",
        );
        let s = finish_within(server, Duration::from_secs(30), "server");
        let (c, s) = (
            json_ok(&c, &format!("client {args:?}")),
            json_ok(&s, &format!("server {args:?}")),
        );
        for (side, v) in [("client", &c), ("server", &s)] {
            assert_eq!(v["iters"], *iters, "{side} of {args:?}: {v}");
            assert_eq!(v["bytes"], 2 * size * iters, "{side} of {args:?}: {v}");
            assert_eq!(v["checked"], *checked, "{side} of {args:?}: {v}");
        }
        assert_eq!(c["remote"]["qpn"], s["local"]["qpn"], "{c} {s}");
        assert_eq!(s["remote"]["qpn"], c["local"]["qpn"], "{c} {s}");
        eprintln!(
            "pingpong {args:?}: {:.1} s, {:.0} us/iter",
            t0.elapsed().as_secs_f64(),
            c["usec_per_iter"].as_f64().unwrap_or(0.0)
        );
        wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    }

    // Against the unmodified ibv_rc_pingpong on the drop-in library, both ways. Its `-c`
    // server checks the first byte of every page of what our `-c` client sent (ours checks
    // every byte of each echo); its client checks nothing, and our server without `-c` takes
    // its bytes as they are.
    let gid = ipv4_gid_index(&pair.a);
    let ibv = |port: &str, client: bool| {
        let mut a = vec![
            "ibv_rc_pingpong",
            "-g",
            &gid,
            "-p",
            port,
            "-n",
            "300",
            "-s",
            "4096",
            "-c",
        ];
        if client {
            a.push(&host);
        }
        exec_shared(&ns, &ifname, &a)
    };
    let text = roce_tests::output_text;
    let t0 = Instant::now();
    let server = ibv("18734", false);
    roce_tests::rxe::wait_host_listen(&ns, 18_734, Duration::from_secs(30));
    let c = pingpong(&["-s", "4096", "-n", "300", "-c"], 18_734, true);
    let c = finish_within(c, Duration::from_secs(120), "roce pingpong client");
    let s = finish_within(server, Duration::from_secs(30), "ibv_rc_pingpong server");
    let c = json_ok(&c, "roce pingpong client of ibv_rc_pingpong");
    assert_eq!(
        (c["iters"].as_u64(), c["checked"].as_bool()),
        (Some(300), Some(true)),
        "{c}"
    );
    let out = text(&s);
    assert!(s.status.success() && out.contains("300 iters in"), "{out}");
    assert!(!out.contains("invalid data"), "{out}");
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));

    let server = pingpong(&["-s", "4096", "-n", "300"], 18_735, false);
    roce_tests::rxe::wait_host_listen(&ns, 18_735, Duration::from_secs(30));
    let c = finish_within(ibv("18735", true), Duration::from_secs(120), "ibv client");
    let s = finish_within(server, Duration::from_secs(30), "roce pingpong server");
    let out = text(&c);
    assert!(c.status.success() && out.contains("300 iters in"), "{out}");
    let s = json_ok(&s, "roce pingpong server of ibv_rc_pingpong");
    assert_eq!(s["iters"], 300, "{s}");
    assert_eq!(s["bytes"], 2 * 4096 * 300, "{s}");
    eprintln!("with ibv_rc_pingpong: {:.1} s", t0.elapsed().as_secs_f64());
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));

    drop(watch);
    let report = engine_report(engine, Duration::from_secs(30), "engine after its last");
    // The watcher, two per roce pair, one or more per library program (its doorbell).
    assert!(
        report["connections"].as_u64() >= Some(1 + 2 * runs.len() as u64 + 4),
        "every program went through the engine: {report}"
    );
    assert!(!xdp_attached(&ns, &ifname), "the engine unloads roce_xdp");
}

/// `roce engine --max-clients 2`: a third program is refused with a `REJECT` of `EAGAIN`
/// (`RemoteError::Refused`, its message naming `--max-clients`) and a log line, and gets in
/// once one has left; a doorbell never counts and is never refused at the limit: a program
/// admitted as the second one subscribes and gets its doorbell, and a connection let in on the
/// place kept for a doorbell that turns out to be a program is refused at its first verb.
/// One doorbell per subscription (a second is `EBUSY`). Then Debian's ibv_rc_pingpong, server
/// and client on the drop-in library (four connections, two programs), runs to the end at the
/// limit, and with the watcher holding a place the client is refused whole.
#[test]
fn engine_bounds_its_programs_but_never_refuses_a_doorbell() {
    use roce::api::remote::{
        server::FULL_ERRNO,
        verbs::{VerbCall, VerbOk},
    };
    require_root();
    let pair = veth_pair("engcap", 211);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let path = socket_path(&ns, &ifname);
    let _socket = SocketGuard(path.clone());
    let mut engine = spawn(
        &ns,
        &[
            "engine",
            "-i",
            &ifname,
            "--linger",
            "5",
            "--max-clients",
            "2",
        ]
        .map(String::from),
    );
    wait_listening(&path, Duration::from_secs(20), &mut engine);
    let connect = || EngineClient::connect_at(&path);
    let full = |r: Result<EngineClient, RemoteError>| {
        let e = r.expect_err("the engine is full");
        assert!(matches!(e, RemoteError::Refused(FULL_ERRNO)), "{e:?}");
        assert!(e.to_string().contains("--max-clients"), "{e}");
    };

    let mut a = connect().expect("first");
    let b = connect().expect("second");
    full(connect());
    assert_eq!(a.status().expect("status").clients, 2);
    // One leaves: there is room again.
    drop(b);
    let t0 = Instant::now();
    let mut b = loop {
        match connect() {
            Ok(c) => break c,
            Err(RemoteError::Refused(FULL_ERRNO)) if t0.elapsed() < Duration::from_secs(5) => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("no room after a program left: {e:?}"),
        }
    };

    // The second program subscribes to events, as the drop-in library does when it opens the
    // device: the engine now keeps a place for its doorbell.
    let token = match b.verb(&VerbCall::Subscribe).expect("subscribe") {
        VerbOk::Token(t) => t,
        other => panic!("subscribe answered {other:?}"),
    };
    // A program that takes that place is refused at its first verb (Hello passes)...
    let mut squatter = connect().expect("let in on probation");
    assert!(
        matches!(squatter.status(), Err(RemoteError::Refused(FULL_ERRNO))),
        "a program on a doorbell's place"
    );
    drop(squatter);
    // ...and the doorbells (the device's events and the CM's), at the limit, are served and
    // not counted.
    let mut bell = connect().expect("doorbell at the limit");
    let rung = bell.verb(&VerbCall::Doorbell { token, cm: false });
    assert!(matches!(rung, Ok(VerbOk::Done)), "{rung:?}");
    let mut cm_bell = connect().expect("CM doorbell at the limit");
    let rung = cm_bell.verb(&VerbCall::Doorbell { token, cm: true });
    assert!(matches!(rung, Ok(VerbOk::Done)), "{rung:?}");
    let t0 = Instant::now();
    while a.status().expect("status").clients != 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the doorbell counted"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // No place is kept once the doorbell came, and a second doorbell is refused.
    full(connect());
    drop(a);
    let mut second = {
        let t0 = Instant::now();
        loop {
            match connect() {
                Ok(c) => break c,
                Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("no room after a program left: {e:?}"),
            }
        }
    };
    assert_eq!(
        errno_of(second.verb(&VerbCall::Doorbell { token, cm: false })),
        Errno::EBUSY as i32
    );
    drop((second, bell, cm_bell, b));

    // Unmodified programs on the drop-in library: two programs, each with a doorbell, run at
    // a limit of two.
    let gid = ipv4_gid_index(&pair.a);
    let host = pair.a.ipv4.to_string();
    let ibv = |port: &str, client: bool| {
        let mut v = vec!["ibv_rc_pingpong", "-g", &gid, "-p", port, "-n", "200", "-c"];
        if client {
            v.push(&host);
        }
        exec_shared(&ns, &ifname, &v)
    };
    let mut watch = {
        let t0 = Instant::now();
        loop {
            match connect() {
                Ok(c) => break c,
                Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("watcher: {e:?}"),
            }
        }
    };
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    drop(watch);
    let server = ibv("18738", false);
    roce_tests::rxe::wait_host_listen(&ns, 18_738, Duration::from_secs(30));
    let c = finish_within(ibv("18738", true), Duration::from_secs(90), "ibv client");
    let s = finish_within(server, Duration::from_secs(30), "ibv server");
    for o in [&c, &s] {
        let out = roce_tests::output_text(o);
        assert!(o.status.success() && out.contains("200 iters in"), "{out}");
    }
    // With the watcher in one place and the server in the other, the client is refused whole:
    // at its start, not at its events.
    let t0 = Instant::now();
    let mut watch = loop {
        match connect() {
            Ok(c) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("watcher: {e:?}"),
        }
    };
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    let server = ibv("18739", false);
    roce_tests::rxe::wait_host_listen(&ns, 18_739, Duration::from_secs(30));
    let c = finish_within(
        ibv("18739", true),
        Duration::from_secs(30),
        "refused client",
    );
    let out = roce_tests::output_text(&c);
    assert!(!c.status.success(), "a third program ran: {out}");
    drop(server);
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    drop(watch);
    let e = finish_within(engine, Duration::from_secs(30), "engine");
    assert!(
        e.status.success(),
        "engine: {}",
        roce_tests::output_text(&e)
    );
    let report: serde_json::Value = serde_json::from_slice(&e.stdout).expect("engine JSON");
    let log = String::from_utf8_lossy(&e.stderr);
    assert!(log.contains("--max-clients allows"), "no log line: {log}");
    // At accept: the two full() and the client (and any retry above that came too early); at
    // its first verb: the squatter.
    assert!(report["full"].as_u64() >= Some(4), "{report}");
    eprintln!("the refused client said: {out}");
}
