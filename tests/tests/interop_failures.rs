//! Failures in the other stack, against Linux Soft-RoCE in a VM. Root; boots rxe-peer VMs.
//!
//! - The VM dies mid-transfer (powered off under a `roce perf write --retry-cnt 3` to
//!   ib_write_bw): our QP gives up with retry exceeded (WC status RETRY_EXC_ERR, `retry_exceeded_err` counted) and the
//!   process says so and exits non-zero, within the QP's timeout × retries.
//! - Our endpoint dies mid-transfer (SIGKILL under ib_write_bw's WRITEs): rxe retransmits and
//!   says so in its counters (`completer_retry_err` keeps rising) but never fails the WR:
//!   perftest and ibv_rc_pingpong set retry_cnt 7, which rxe treats as infinite. A new endpoint
//!   on the same interface then serves the next ib_write_bw cleanly (its QPNs are reclaimed from
//!   the dead process, the XDP program never left).

use std::{
    thread,
    time::{Duration, Instant},
};

use roce_tests::{
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roce, Roles},
    tag,
};

#[test]
fn vm_killed_mid_transfer_ends_in_retry_exceeded() {
    require_root();
    let peer = Peer::boot(&tag("fk"), 64, &PeerOptions::default());
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let before = h.xdp.stats();
    let step = peer.spawn(&rxe::perftest_cmd(
        "ib_write_bw",
        19501,
        "-s 65536 -n 100000",
    ));
    peer.wait_listen(19501, &step, Duration::from_secs(60));
    let client = Roce::spawn(
        &peer.netns,
        &[
            "perf",
            "write",
            "-d",
            &peer.ifname,
            "-p",
            "19501",
            "-s",
            "65536",
            "-n",
            "100000",
            "-m",
            "1024",
            "--no-verify",
            // 7 would mean "retry forever" (as rxe reads it too).
            "--retry-cnt",
            "3",
            &peer.guest_ip.to_string(),
        ]
        .map(String::from),
    );
    // Let the transfer run, then the peer's host dies.
    thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    peer.kill_vm();
    let r = client.wait(Duration::from_secs(60));
    let took = t.elapsed();
    let e = r.expect_err("the transfer cannot succeed after the peer died");
    assert!(e.contains("RetryExcErr"), "{e}");
    // timeout 14 (67 ms) × (1 + retry_cnt 3) ≈ 0.27 s, plus the engine's poll granularity.
    assert!(took < Duration::from_secs(10), "gave up after {took:?}");
    let after = h.xdp.stats();
    let d = |k: &str| {
        after["transport"][k].as_u64().unwrap_or(0) - before["transport"][k].as_u64().unwrap_or(0)
    };
    assert_eq!(d("retry_exceeded_err"), 1, "{after}");
    assert!(d("completer_retry_err") >= 3, "{after}");
    // A guest step after the VM's end does not wait out its timeout: it fails at once, saying
    // the VM is gone (as when a VM's safety --timeout ends it under a long test).
    let t = Instant::now();
    let late = peer.spawn("true");
    assert!(late.wait_timeout(Duration::from_secs(30)).is_none());
    assert!(late.vm_gone());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let msg = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = late.wait(Duration::from_secs(30));
    }))
    .expect_err("waiting on a gone VM must fail");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("the VM is gone"), "{msg}");
    println!(
        "VM killed: roce perf gave up after {:.2} s; retry_exceeded_err {}, completer_retry_err {}, local_ack_timeout_err {}",
        took.as_secs_f64(),
        d("retry_exceeded_err"),
        d("completer_retry_err"),
        d("local_ack_timeout_err")
    );
}

#[test]
fn endpoint_killed_mid_transfer_rxe_reports_and_we_restart_cleanly() {
    require_root();
    let peer = Peer::boot(&tag("fe"), 65, &PeerOptions::default());
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let server = Roce::spawn(
        &peer.netns,
        &[
            "perf",
            "write",
            "-d",
            &peer.ifname,
            "-p",
            "19601",
            "-s",
            "65536",
            "-m",
            "1024",
            "--no-verify",
        ]
        .map(String::from),
    );
    rxe::wait_host_listen(&peer.netns, 19601, Duration::from_secs(30));
    // `-u 17`: a 537 ms ACK timeout in place of perftest's 67 ms. Under TCG the guest itself
    // is sometimes slower than 67 ms to take our ACK, rxe then retries before the kill, and in
    // 3 of 10 runs here its requester never sent again after that one retry (sent_pkts frozen
    // from before the kill on), so the test could not see the retries the kill causes. A
    // capture of such a hang (with -u 14, no kill) shows the guest's side: rxe stopped in the
    // middle of a message just after our ACK (correct PSN and MSN, 22 packets outstanding),
    // no PSN ever went back, nothing at all left the guest afterwards although its retry
    // counter rose, and its ib_write_bw could no longer be killed. The guest's transmit path
    // hung, not our ACKs: a lost virtio-net kick, gone since guests boot with `maxcpus=2`
    // ([`rxe::GUEST_SMP`]).
    let step = peer.spawn(&rxe::perftest_cmd(
        "ib_write_bw",
        19601,
        &format!("-s 65536 -n 100000 -u 17 {}", peer.host_ip),
    ));
    thread::sleep(Duration::from_secs(4));
    assert!(
        !step.done(),
        "the transfer ended too early: {}",
        step.output()
    );
    let c0 = peer.hw_counters();
    server.kill_hard();
    // rxe's requester now retransmits into the void. It never gives up: ib_write_bw (like
    // ibv_rc_pingpong) hard-codes retry_cnt 7, and rxe treats 7 as "retry forever"
    // (rxe_comp.c: `if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--`). What rxe reports is
    // its counters: completer_retry_err keeps rising, retry_exceeded_err stays 0.
    thread::sleep(Duration::from_secs(3));
    let c1 = peer.hw_counters();
    thread::sleep(Duration::from_secs(3));
    let c2 = peer.hw_counters();
    let retries = (
        c1["completer_retry_err"] - c0["completer_retry_err"],
        c2["completer_retry_err"] - c1["completer_retry_err"],
    );
    assert!(
        retries.0 > 0 && retries.1 > 0,
        "rxe must keep retrying: {retries:?}"
    );
    assert_eq!(c2["retry_exceeded_err"], c0["retry_exceeded_err"], "{c2:?}");
    assert!(!step.done(), "ib_write_bw ended: {}", step.output());
    println!(
        "endpoint killed: rxe completer_retry_err +{} then +{} over two 3 s windows, retry_exceeded_err +0; ib_write_bw gets no completion",
        retries.0, retries.1
    );
    let _ = peer.exec(
        "pkill -INT ib_write_bw; sleep 1; pkill -KILL ib_write_bw; true",
        Duration::from_secs(20),
    );
    let _ = step.wait(Duration::from_secs(30));
    // A new endpoint on the same interface serves the next run cleanly.
    let r = h.run(
        "restart-ib_write_bw-server_roce",
        &Roles::OurServer {
            ours: [
                "perf",
                "write",
                "-d",
                &peer.ifname,
                "-p",
                "19602",
                "-s",
                "4096",
                "-m",
                "1024",
                "--no-verify",
            ]
            .map(String::from)
            .to_vec(),
            guest: rxe::perftest_cmd(
                "ib_write_bw",
                19602,
                &format!("-s 4096 -n 500 {}", peer.host_ip),
            ),
        },
        19602,
    );
    assert!(r.ok(), "after the restart: {:?}", r.failures);
}
