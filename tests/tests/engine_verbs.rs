//! Issue 22 with unmodified programs: Debian's ibverbs-utils pingpongs and perftest, server and
//! client on one interface of one namespace, each loading the drop-in libibverbs, which
//! reaches the interface through `roce engine` (docs/multiprocess.md, step 2). Their QPs meet
//! by loopback inside the engine. Root; the namespaces and veths are the test's own, and every
//! program and engine is killed by PID if the test fails.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    process::Output,
    thread,
    time::{Duration, Instant},
};

use nix::errno::Errno;
use roce::api::{
    Access, CqId, LKey, PdId, QpAttr, QpCap, QpInit, QpState, QpType, RecvWr, SendWr, Sge,
    remote::{
        EngineClient, EngineStatus, RemoteError, proto,
        verbs::{self, VerbCall, VerbOk},
    },
};
use roce_tests::{
    child::{Reaper, finish_within},
    engine::{EMPTY, exec_shared, start_engine, wait_status},
    ipv4_gid_index, require_root, veth_pair,
};

fn text(o: &Output) -> String {
    roce_tests::output_text(o)
}

/// Waits for the engine to leave after its last client, and checks it ended well.
fn engine_leaves(engine: Reaper) {
    let o = finish_within(
        engine,
        Duration::from_secs(20),
        "engine after its last client",
    );
    assert!(o.status.success(), "engine:\n{}", text(&o));
}

/// An RC QP's creation attributes: `pd`, both queues on `cq`, `depth` WRs each way, one SGE.
const fn rc_init(pd: PdId, cq: CqId, depth: u32) -> QpInit {
    QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
    }
}

/// Whether perftest's `out` has a result row of `iters` iterations (size, iterations, then
/// figures).
fn perftest_row(out: &str, iters: &str) -> bool {
    out.lines().any(|l| {
        let mut w = l.split_whitespace();
        matches!((w.next(), w.next()), (Some(size), Some(n))
            if size.parse::<u64>().is_ok() && n == iters)
    })
}

/// The first user story: the server and the client of `ibv_*_pingpong` and of
/// perftest on one host, against one device. Every ibverbs-utils pingpong (RC, UC, UD, SRQ)
/// with `-c` (each side checks every received buffer), RC also with `-e` (completion
/// channels, through the engine's events), and the perftest bandwidth tools for WRITE, READ,
/// SEND and atomics plus the WRITE, SEND and READ latency tools: every program exits 0 with
/// its report, and once they are gone the engine holds nothing of theirs.
#[test]
fn unmodified_programs_run_server_and_client_on_one_interface_through_the_engine() {
    require_root();
    let pair = veth_pair("engv", 205);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "2", Duration::from_secs(20));
    let mut watch = EngineClient::connect_at(&path).expect("watcher");
    let gid = ipv4_gid_index(&pair.a);
    let host = "127.0.0.1";
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "ibv_rc_pingpong",
            &["-n", "300", "-c", "-s", "8192"],
            "300 iters in",
        ),
        (
            "ibv_rc_pingpong",
            &["-n", "200", "-c", "-e"],
            "200 iters in",
        ),
        (
            "ibv_uc_pingpong",
            &["-n", "300", "-c", "-s", "1024"],
            "300 iters in",
        ),
        (
            "ibv_ud_pingpong",
            &["-n", "300", "-c", "-s", "1000"],
            "300 iters in",
        ),
        (
            "ibv_srq_pingpong",
            &["-n", "300", "-c", "-q", "4"],
            "300 iters in",
        ),
        ("ib_write_bw", &["-n", "300"], ""),
        ("ib_read_bw", &["-n", "300"], ""),
        ("ib_send_bw", &["-n", "300"], ""),
        ("ib_atomic_bw", &["-n", "300"], ""),
        ("ib_write_lat", &["-n", "200"], ""),
        ("ib_send_lat", &["-n", "200"], ""),
        ("ib_read_lat", &["-n", "200"], ""),
    ];
    for (i, (prog, extra, want)) in cases.iter().enumerate() {
        let port = (18700 + i).to_string();
        let gid_flag = if prog.starts_with("ibv_") { "-g" } else { "-x" };
        let mut args = vec![*prog, gid_flag, &gid, "-p", &port];
        args.extend_from_slice(extra);
        let server = exec_shared(&ns, &ifname, &args);
        let port_n: u16 = port.parse().expect("port");
        roce_tests::rxe::wait_host_listen(&ns, port_n, Duration::from_secs(30));
        args.push(host);
        let client = exec_shared(&ns, &ifname, &args);
        let limit = Duration::from_secs(90);
        let c = finish_within(client, limit, &format!("{prog} client"));
        let s = finish_within(server, limit, &format!("{prog} server"));
        for (who, o) in [("client", &c), ("server", &s)] {
            let out = text(o);
            assert!(o.status.success(), "{prog} {extra:?} {who}:\n{out}");
            if want.is_empty() {
                let iters = extra[1];
                // perftest prints its table on the client (and the server, for BW tools).
                if who == "client" {
                    assert!(
                        perftest_row(&out, iters),
                        "{prog} {who}: no row of {iters} iterations:\n{out}"
                    );
                }
            } else {
                assert!(out.contains(want), "{prog} {extra:?} {who}:\n{out}");
            }
        }
        // Each program's objects are gone once it exited, whatever it did.
        wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    }
    drop(watch);
    engine_leaves(engine);
}

/// A program on the library killed with SIGKILL in the middle of its run: another pair on
/// the same interface finishes every exchange with every buffer checked, and the engine
/// releases the dead one's QP, CQ, MR and PD while its peer still runs, then the peer's once
/// the test ends it.
#[test]
fn a_killed_drop_in_program_is_reclaimed_and_the_others_go_on() {
    require_root();
    let pair = veth_pair("engx", 206);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "2", Duration::from_secs(20));
    let mut watch = EngineClient::connect_at(&path).expect("watcher");
    let gid = ipv4_gid_index(&pair.a);
    let pingpong = |port: &str, iters: &str, client: bool| {
        let mut a = vec!["ibv_rc_pingpong", "-g", &gid, "-p", port, "-n", iters, "-c"];
        if client {
            a.push("127.0.0.1");
        }
        exec_shared(&ns, &ifname, &a)
    };
    // The victim's pair: far more exchanges than the test waits for.
    let victim_server = pingpong("18720", "100000000", false);
    roce_tests::rxe::wait_host_listen(&ns, 18720, Duration::from_secs(30));
    let mut victim = pingpong("18720", "100000000", true);
    let t0 = Instant::now();
    while watch.status().expect("status").qps < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the victim pair never made its QPs"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let server = pingpong("18721", "3000", false);
    roce_tests::rxe::wait_host_listen(&ns, 18721, Duration::from_secs(30));
    let client = pingpong("18721", "3000", true);
    // Both pairs run; then the victim dies without a word.
    while watch.status().expect("status").qps < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the second pair never made its QPs"
        );
        thread::sleep(Duration::from_millis(20));
    }
    victim.kill().expect("SIGKILL the victim");
    let limit = Duration::from_secs(90);
    let c = finish_within(client, limit, "client");
    let s = finish_within(server, limit, "server");
    for o in [&c, &s] {
        assert!(
            o.status.success() && text(o).contains("3000 iters in"),
            "{}",
            text(o)
        );
    }
    // The victim's objects are gone: what is left is its peer's (one QP, CQ, MR and PD), or
    // nothing if the peer's last send ended in a retry error and it exited. A peer that was
    // waiting for the dead client's next message waits on, as it would on rxe.
    let mut victim_server = victim_server;
    let t0 = Instant::now();
    loop {
        let st = watch.status().expect("status");
        let want = if victim_server.exited() {
            EMPTY
        } else {
            EngineStatus {
                clients: 2,
                qps: 1,
                pds: 1,
                cqs: 1,
                mrs: 1,
            }
        };
        if st == want {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "engine status {st:?}, want {want:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    victim_server.kill().expect("end the victim's peer");
    drop(victim_server);
    wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    drop(watch);
    engine_leaves(engine);
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, RemoteError>) -> i32 {
    r.expect_err("refused").errno()
}

/// Isolation of the library's verbs between the engine's programs: a connection that names
/// another's PD, CQ, QP, MR or window in any verb gets `EINVAL` (uverbs' answer to a handle it
/// does not know), as does a doorbell with a token nobody holds and events taken without a
/// subscription; a body that is no verb gets `EPROTO` and the connection goes on. The owner's
/// objects are untouched: its QP still moves to INIT and its CQ polls.
#[test]
fn library_verbs_reach_only_the_callers_objects() {
    require_root();
    let pair = veth_pair("engi", 207);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "1", Duration::from_secs(20));
    let mut owner = EngineClient::connect_at(&path).expect("owner");
    let mut other = EngineClient::connect_at(&path).expect("other");
    let call = |c: &mut EngineClient, v: VerbCall| c.verb(&v);
    let VerbOk::Pd(pd) = call(&mut owner, VerbCall::AllocPd).expect("pd") else {
        panic!("alloc_pd")
    };
    let VerbOk::Cq(cq) = call(&mut owner, VerbCall::CreateCq { depth: 16 }).expect("cq") else {
        panic!("create_cq")
    };
    let init = rc_init(pd, cq, 8);
    let VerbOk::Qp(qpn) = call(&mut owner, VerbCall::CreateQp { init, srq: None }).expect("qp")
    else {
        panic!("create_qp")
    };
    let buf = vec![0u8; 4096];
    let VerbOk::Mr(mr) = call(
        &mut owner,
        VerbCall::RegMr {
            pd,
            addr: buf.as_ptr() as u64,
            len: buf.len() as u64,
            iova: buf.as_ptr() as u64,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        },
    )
    .expect("mr") else {
        panic!("reg_mr")
    };
    let VerbOk::RKey(mw) = call(
        &mut owner,
        VerbCall::AllocMw {
            pd,
            ty: roce::api::MwType::Two,
        },
    )
    .expect("mw") else {
        panic!("alloc_mw")
    };
    let to_init = QpAttr::<roce::api::Path> {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let init_mask = roce::api::AttrMask::STATE
        | roce::api::AttrMask::PKEY_INDEX
        | roce::api::AttrMask::PORT
        | roce::api::AttrMask::ACCESS_FLAGS;
    let sge = Sge {
        addr: buf.as_ptr() as u64,
        length: 64,
        lkey: mr.lkey,
    };
    let foreign: Vec<(&str, VerbCall)> = vec![
        ("dealloc_pd", VerbCall::DeallocPd(pd)),
        ("destroy_cq", VerbCall::DestroyCq(cq)),
        ("poll_cq", VerbCall::PollCq { cq, max: 4 }),
        (
            "req_notify_cq",
            VerbCall::ReqNotifyCq {
                cq,
                solicited_only: false,
            },
        ),
        ("create_qp", VerbCall::CreateQp { init, srq: None }),
        ("destroy_qp", VerbCall::DestroyQp(qpn)),
        (
            "modify_qp",
            VerbCall::ModifyQp {
                qpn,
                attr: Box::new(to_init.clone()),
                mask: init_mask,
            },
        ),
        ("query_qp", VerbCall::QueryQp(qpn)),
        (
            "post_send",
            VerbCall::PostSend {
                qpn,
                wrs: vec![SendWr::send(1, vec![sge])],
                all: false,
            },
        ),
        (
            "post_recv",
            VerbCall::PostRecv {
                qpn,
                wr: RecvWr {
                    wr_id: 2,
                    sg_list: vec![sge],
                },
            },
        ),
        ("dereg_mr", VerbCall::DeregMr(mr.lkey)),
        ("dealloc_mw", VerbCall::DeallocMw { pd, rkey: mw }),
        (
            "reg_mr in another's PD",
            VerbCall::RegMr {
                pd,
                addr: buf.as_ptr() as u64,
                len: 64,
                iova: 0,
                access: Access::LOCAL_WRITE,
            },
        ),
        ("take_events unsubscribed", VerbCall::TakeEvents { max: 4 }),
    ];
    for (what, v) in foreign {
        assert_eq!(errno_of(other.verb(&v)), Errno::EINVAL as i32, "{what}");
    }
    // Handles nobody has.
    assert_eq!(
        errno_of(other.verb(&VerbCall::DestroyCq(CqId(9999)))),
        Errno::EINVAL as i32
    );
    assert_eq!(
        errno_of(other.verb(&VerbCall::DeregMr(LKey::new(0x1234_5678)))),
        Errno::EINVAL as i32
    );
    assert_eq!(
        errno_of(other.verb(&VerbCall::DeallocPd(PdId(77)))),
        Errno::EINVAL as i32
    );
    // A doorbell for a token nobody holds.
    let mut bell = EngineClient::connect_at(&path).expect("bell");
    assert_eq!(
        errno_of(bell.verb(&VerbCall::Doorbell {
            token: 42,
            cm: false
        })),
        Errno::EINVAL as i32
    );
    // Bytes that are no verb: EPROTO, and the connection is still served.
    let mut raw = UnixStream::connect(&path).expect("raw");
    let mut out = Vec::new();
    proto::encode_request(&mut out, 1, &proto::Request::Hello);
    proto::encode_request(&mut out, 2, &proto::Request::Verb(vec![0xfe, 0xff, 0x01]));
    let alloc = verbs::encode(&VerbCall::AllocPd).expect("encode");
    proto::encode_request(&mut out, 3, &proto::Request::Verb(alloc));
    raw.write_all(&out).expect("send");
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < 3 {
        let mut chunk = [0u8; 1024];
        let n = raw.read(&mut chunk).expect("reply");
        assert!(n > 0, "the engine closed the connection");
        got.extend_from_slice(&chunk[..n]);
        while let Some((f, used)) = proto::decode_reply(&got).expect("decodes") {
            got.drain(..used);
            replies.push(f);
        }
    }
    assert_eq!(replies[1].msg, proto::Reply::Err(Errno::EPROTO as i32));
    assert!(
        matches!(&replies[2].msg, proto::Reply::Ok(proto::Value::Verb(b))
            if matches!(verbs::decode::<VerbOk>(b), Ok(VerbOk::Pd(_)))),
        "{:?}",
        replies[2]
    );
    drop(raw);
    // The owner's objects were not disturbed.
    call(
        &mut owner,
        VerbCall::ModifyQp {
            qpn,
            attr: Box::new(to_init),
            mask: init_mask,
        },
    )
    .expect("owner's modify");
    let VerbOk::QpQuery(Some(q)) = call(&mut owner, VerbCall::QueryQp(qpn)).expect("query") else {
        panic!("query_qp")
    };
    assert_eq!((q.0, q.1), (QpType::Rc, QpState::Init));
    assert!(matches!(
        call(&mut owner, VerbCall::PollCq { cq, max: 4 }),
        Ok(VerbOk::Wcs(w)) if w.is_empty()
    ));
    drop((owner, other, bell));
    drop(buf);
    engine_leaves(engine);
}

/// `roce exec --engine shared -d IF -- stdbuf -oL prog ARGS` in `ns` (line-buffered, for the
/// rdmacm-utils' progress lines).
fn exec_shared_cm(ns: &str, ifname: &str, prog: &str, args: &[String]) -> Reaper {
    roce_tests::rdmacm::exec_in(ns, ifname, &["--engine", "shared"], prog, args)
}

/// RDMA CM through the engine: the server and the client of Debian's rdmacm-utils (`rping`
/// with `-V`, each side checking every ping, `ucmatose` over RC, `udaddy` over UD with SIDR)
/// and perftest's `-R` bandwidth tools on one interface, every program on the library and
/// reaching the device through the engine, whose CM routes each REQ to the program that
/// listens on its port and every later event to the program that owns the connection. Then
/// the isolation of the CM verbs: another program's connection is `EINVAL` to accept, reject,
/// disconnect, destroy or query, another's listen is not its to stop, and a connect names its
/// own QP only.
#[test]
fn rdma_cm_programs_run_server_and_client_on_one_interface_through_the_engine() {
    require_root();
    let pair = veth_pair("engc", 212);
    let (ns, ifname) = (pair.a.netns.clone(), pair.a.ifname.clone());
    let (engine, path, _socket) = start_engine(&ns, &ifname, "2", Duration::from_secs(20));
    let mut watch = EngineClient::connect_at(&path).expect("watcher");
    let ip = pair.a.ipv4.to_string();
    let a = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let dev = format!("roce_{ifname}");
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        (
            "rping",
            a(&[
                "-s", "-a", &ip, "-p", "18740", "-C", "20", "-S", "200", "-V", "-v",
            ]),
            a(&[
                "-c", "-a", &ip, "-p", "18740", "-C", "20", "-S", "200", "-V", "-v",
            ]),
        ),
        (
            "ucmatose",
            a(&["-b", &ip, "-p", "18741", "-c", "2", "-C", "20"]),
            a(&["-s", &ip, "-b", &ip, "-p", "18741", "-c", "2", "-C", "20"]),
        ),
        (
            "udaddy",
            // udaddy's -p is the port space; it listens on 7174.
            a(&["-b", &ip, "-c", "2", "-C", "20"]),
            a(&["-s", &ip, "-b", &ip, "-c", "2", "-C", "20"]),
        ),
        (
            "ib_write_bw",
            a(&["-d", &dev, "-R", "-p", "18743", "-n", "300"]),
            a(&["-d", &dev, "-R", "-p", "18743", "-n", "300", &ip]),
        ),
        (
            "ib_read_bw",
            a(&["-d", &dev, "-R", "-p", "18744", "-n", "300"]),
            a(&["-d", &dev, "-R", "-p", "18744", "-n", "300", &ip]),
        ),
        (
            "ib_send_bw",
            a(&["-d", &dev, "-R", "-p", "18745", "-n", "300"]),
            a(&["-d", &dev, "-R", "-p", "18745", "-n", "300", &ip]),
        ),
    ];
    for (prog, server, client) in &cases {
        let s = exec_shared_cm(&ns, &ifname, prog, server);
        let (c_out, s_out) = roce_tests::rdmacm::spawned_pair(
            (prog, s),
            (prog, &|| exec_shared_cm(&ns, &ifname, prog, client)),
        );
        if *prog == "rping" {
            roce_tests::rdmacm::check_ping_lines("client", &c_out, 20, 200)
                .and_then(|()| roce_tests::rdmacm::check_ping_lines("server", &s_out, 20, 200))
                .unwrap_or_else(|e| panic!("{e}"));
        } else if prog.starts_with("ib_") {
            roce_tests::rdmacm::check_bw_row("client", &c_out, 65536, 300)
                .unwrap_or_else(|e| panic!("{e}"));
        } else {
            for (who, out) in [("client", &c_out), ("server", &s_out)] {
                assert!(out.contains("test complete"), "{prog} {who}:\n{out}");
            }
        }
        wait_status(&mut watch, EMPTY, Duration::from_secs(10));
    }

    // Isolation of the CM verbs between two programs.
    let mut owner = EngineClient::connect_at(&path).expect("owner");
    let mut other = EngineClient::connect_at(&path).expect("other");
    for c in [&mut owner, &mut other] {
        let VerbOk::Token(_) = c.verb(&VerbCall::Subscribe).expect("subscribe") else {
            panic!("subscribe")
        };
        c.verb(&VerbCall::CmEnable).expect("cm_enable");
    }
    let VerbOk::Service(_) = owner
        .verb(&VerbCall::CmListen {
            port: 18746,
            ud: false,
        })
        .expect("listen")
    else {
        panic!("cm_listen")
    };
    // Another program's listen is not the other's to stop, nor to take over.
    assert!(matches!(
        other.verb(&VerbCall::CmUnlisten {
            port: 18746,
            ud: false
        }),
        Ok(VerbOk::Bool(false))
    ));
    assert_eq!(
        errno_of(other.verb(&VerbCall::CmListen {
            port: 18746,
            ud: false
        })),
        Errno::EADDRINUSE as i32
    );
    // The owner connects to its own listen through a QP of its own; the other cannot name
    // that QP, nor act on the owner's connection.
    let VerbOk::Pd(pd) = owner.verb(&VerbCall::AllocPd).expect("pd") else {
        panic!("pd")
    };
    let VerbOk::Cq(cq) = owner.verb(&VerbCall::CreateCq { depth: 8 }).expect("cq") else {
        panic!("cq")
    };
    let init = rc_init(pd, cq, 4);
    let VerbOk::Qp(qpn) = owner
        .verb(&VerbCall::CreateQp { init, srq: None })
        .expect("qp")
    else {
        panic!("qp")
    };
    let connect =
        roce::api::CmConnect::new(pair.a.ipv4.into(), 18746, 0, qpn, roce::api::Psn::new(1));
    assert_eq!(
        errno_of(other.verb(&VerbCall::CmConnect(Box::new(connect.clone())))),
        Errno::EINVAL as i32,
        "a connect through another's QP"
    );
    let VerbOk::Comm(id) = owner
        .verb(&VerbCall::CmConnect(Box::new(connect)))
        .expect("connect")
    else {
        panic!("cm_connect")
    };
    for v in [
        VerbCall::CmReject {
            id,
            private_data: vec![],
        },
        VerbCall::CmReady {
            id,
            private_data: vec![],
        },
        VerbCall::CmDisconnect {
            id,
            private_data: vec![],
        },
        VerbCall::CmState(id),
        VerbCall::CmDestroy(id),
        VerbCall::CmAccept {
            id,
            accept: Box::new(roce::api::CmAccept::new(qpn, roce::api::Psn::new(2))),
        },
    ] {
        let name = v.name();
        assert_eq!(errno_of(other.verb(&v)), Errno::EINVAL as i32, "{name}");
    }
    // The owner's connection is intact: its state is its own to read, and the REQ reached
    // its listen (the owner's CM queue gets the request).
    assert!(matches!(
        owner.verb(&VerbCall::CmState(id)),
        Ok(VerbOk::CmState(Some(_)))
    ));
    let t0 = Instant::now();
    loop {
        match owner.verb(&VerbCall::TakeCmEvents { max: 8 }) {
            Ok(VerbOk::CmEvents(e))
                if e.iter()
                    .any(|e| matches!(e, roce::api::CmEvent::ConnectRequest { .. })) =>
            {
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("take_cm_events: {e}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the REQ never reached its listener"
        );
        thread::sleep(Duration::from_millis(20));
    }
    assert!(matches!(
        other.verb(&VerbCall::TakeCmEvents { max: 8 }),
        Ok(VerbOk::CmEvents(e)) if e.is_empty()
    ));
    drop((owner, other, watch));
    engine_leaves(engine);
}
