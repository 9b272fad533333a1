//! Debian's unmodified rdmacm-utils and perftest on the drop-in librdmacm (`roce exec`)
//! against the same programs on rxe and the kernel's CM in the Soft-RoCE VM, both directions,
//! in one VM boot (cases run in sequence; every failed case is named in the test's failure):
//! - `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R` (perftest connecting through RDMA
//!   CM: a control connection for its handshakes, then the data connection on the same port),
//!   server in the guest and client ours, and the reverse: the results table at both ends
//!   with every iteration and a bandwidth above zero;
//! - `ucmatose` (several connections, sends both ways) and `udaddy` (the UDP port space: UD
//!   QPs resolved by SIDR, sends both ways), both directions;
//! - `rdma_server`/`rdma_client` (librdmacm's synchronous mode), both directions;
//! - `roce perf write|read|send -R` (4096 bytes, 1000 messages) against the guest's
//!   `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R`, both directions: perftest's table
//!   at the guest's end, our JSON report at ours. With the guest's server no REQ is held back:
//!   `roce perf`'s client resends a data REQ that the guest rejects with reason 8 (the race
//!   below) a few milliseconds later, as a robust client does, so it copes by itself;
//! - over IPv6 (fd79:80::/64 GIDs): rping, ucmatose, udaddy and rdma_server/rdma_client both
//!   directions (perftest's `-R` resolves IPv4 only, whatever the GID).
//! - `roce pingpong -R` (roce itself, rping's protocol over RDMA CM) against the guest's
//!   `rping -v -V`, both directions, IPv4 (200 pings) and IPv6 (20): every ping in rping's
//!   output with rping's data, every ping checked in our summary.
//!
//! perftest with the server in the guest and the client ours runs with every CM REQ that
//! reaches the guest held back 500 ms (a u32 filter on the guest's eth0 ingress and netem on
//! an ifb; nothing else is delayed, and the test checks that the filter caught both of
//! perftest's REQs). Without it these cases fail, and would with any client faster than the
//! TCG guest, because of Debian's perftest 4.5-0.17 itself: after the control connection
//! both ends handshake, then the client connects the data QP at once while the server only
//! then creates, binds and listens on a new id for the same port (`create_rdma_cm_connection`,
//! `rdma_cm_server_connection` in src/perftest_communication.c). The server waits for the
//! ACK of its last handshake message before that, so a delay of the whole path does not help:
//! our REQ arrives under a millisecond after that ACK, while the guest needs more than 20 ms
//! to listen (measured: with 20 ms of netem on everything the guest sends, 5 of 6 cases still
//! failed). The guest's CM rejects the REQ with reason 8 (invalid service ID: no listener
//! yet), and perftest's retry (`rdma_cm_client_connection`) then reuses the ids and the event
//! channel that `rdma_cm_destroy_cma` has just destroyed (upstream perftest fixed it in
//! 3d9d8d0, "Fix crashes and logical flaws in RDMA CM connection retry", first released in
//! 26.04.17); on the drop-in library those calls fail with EINVAL and a message, so the
//! client exits with "Failed to destroy RDMA CM contexts" instead of retrying. A retry of our
//! own on that REJ would depart from the kernel's RDMA CM, which reports REJECTED at once.
//! `ROCE_RACE_DELAY_MS=0` shows the race. Our REQ, service ID and private data are not the
//! cause: the same connection is accepted when the guest listens first (the other direction,
//! and every rping and ucmatose case).
//!
//! After the cases, the guest's kernel must hold no RDMA CM id and no QP but QP 1, and every
//! CM message sent more than once in either direction must have been resent by the protocol's
//! timer or in answer to a duplicate: a capture of QP 1's MADs on the guest's tap (taken for
//! the whole suite) shows each copy and what came before it (`roce_tests::cm_trace`). The
//! guest's CM counters (`cm_tx_retries`, `cm_rx_duplicates`) may then be non-zero on a loaded
//! host (a TCG guest that takes longer than RDMA CM's 4.3 s to send its RTU gets our REP
//! again), but never without a copy on the wire that explains them.
//!
//! Root; boots the rxe-peer VM.

use std::{
    panic::AssertUnwindSafe,
    path::Path,
    time::{Duration, Instant},
};

use roce_tests::{
    Loaded, cm_trace, rdmacm, require_root,
    rxe::{Capture, Peer, PeerOptions},
    tag,
};

/// Runs `prog args` through `roce exec` on the peer's veth, in its namespace, line-buffered.
fn ours(peer: &Peer, prog: &str, args: &[String]) -> roce_tests::child::Reaper {
    rdmacm::exec_in(&peer.netns, &peer.ifname, &[], prog, args)
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// Whether a client's output says the server was not listening yet (the kernel's or our CM
/// rejected the connect with "invalid service ID", or the connect gave up).
fn not_listening_yet(out: &str) -> bool {
    out.contains("REJECTED")
        || out.contains("Unable to Connect")
        || out.contains("Unable to connect")
        || out.contains("Failed to connect")
        || out.contains("Couldn't connect")
        || out.contains("unreachable")
        || out.contains("UNREACHABLE")
        || out.contains("Connection refused")
}

/// perftest's iterations at `size` bytes: 1000, but 200 from 64 KiB on (13 MB per run, as the
/// perftest matrix's CI rows). Runs in which the guest sent much used to hang its transmit
/// path now and then (a lost virtio-net kick: see [`roce_tests::rxe::GUEST_SMP`]), so the
/// 64 KiB READ with the guest's server ran only in the full matrix; since the guest boots with
/// `maxcpus=2` that hang is gone and every case runs in CI.
const fn iters(size: u32) -> u32 {
    if size >= 65536 { 200 } else { 1000 }
}

/// How long the guest holds back each CM REQ that reaches it while perftest's server runs in
/// the guest and our client connects to it (see the module doc: Debian's perftest 4.5
/// server listens for its data connection only after its last handshake message).
const REQ_DELAY_MS: u32 = 500;

/// The peer's subnet: 10.79.80.0/24 and fd79:80::/64 (IPv6 is on for the IPv6 cases).
const SUBNET: u8 = 80;
/// Our address on fd79:[`SUBNET`]::/64.
const HOST6: &str = "fd79:80::1";
/// The guest's address on fd79:[`SUBNET`]::/64.
const GUEST6: &str = "fd79:80::2";

/// perftest's `tool -R` with the server in the guest and the client ours: our client is run
/// again while the guest's server has not listened yet.
fn perftest_guest_server(peer: &Peer, tool: &str, size: u32, port: u16) -> Result<(), String> {
    let delay = std::env::var("ROCE_RACE_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REQ_DELAY_MS);
    let set = peer.exec(&delay_reqs_script(delay), Duration::from_secs(60));
    if set.rc != 0 {
        return Err(format!(
            "delaying the CM REQs that reach the guest (rc {}):\n{}",
            set.rc, set.out
        ));
    }
    // A panic inside (a client killed at its timeout) must not leave the delay behind.
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        perftest_guest_server_delayed(peer, tool, size, port)
    }))
    .unwrap_or_else(|p| Err(panic_text(&*p)))
    .map_err(|e| format!("{e}\nrxe's counters: {:?}", peer.hw_counters()));
    let del = peer.exec(&undelay_reqs_script(), Duration::from_secs(60));
    if del.rc != 0 {
        return Err(format!(
            "removing the REQ delay in the guest (rc {}):\n{}\n(the case: {r:?})",
            del.rc, del.out
        ));
    }
    r?;
    // The control connection's REQ and the data connection's: both went through the delay.
    let delayed = redirected_packets(&del.out);
    if delayed.unwrap_or(0) < 2 {
        return Err(format!(
            "the guest's filter delayed {delayed:?} REQs, not the 2 of perftest's two \
             connections:\n{}",
            del.out
        ));
    }
    Ok(())
}

/// What a caught panic said.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panicked".into())
}

/// The packets that `tc -s filter show`'s mirred action redirected ("Sent B bytes N pkt").
fn redirected_packets(tc_out: &str) -> Option<u64> {
    let line = tc_out
        .lines()
        .find(|l| l.trim_start().starts_with("Sent "))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    (w.get(4) == Some(&"pkt")).then(|| w[3].parse().ok())?
}

/// A guest shell script that delays by `ms` every CM REQ reaching the guest, and nothing
/// else: a u32 filter on eth0's ingress picks UDP port 4791 (bytes 22-23 of an IPv4
/// packet without options), BTH destination QP 1 (the low 24 bits of bytes 32-35) and MAD
/// attribute ID 0x0010, ConnectRequest (bytes 64-65: after IPv4 20, UDP 8, BTH 12, DETH 8,
/// and 16 bytes of MAD header), and redirects it to [`IFB`], whose netem holds it back before
/// it goes on up eth0's receive path.
fn delay_reqs_script(ms: u32) -> String {
    format!(
        "set -e; modprobe ifb numifbs=0; ip link add {IFB} type ifb; ip link set {IFB} up; \
         tc qdisc add dev {IFB} root netem delay {ms}ms; \
         tc qdisc add dev eth0 handle ffff: ingress; \
         tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 \
           match ip protocol 17 0xff \
           match u32 0x000012b7 0x0000ffff at 20 \
           match u32 0x00000001 0x00ffffff at 32 \
           match u32 0x00100000 0xffff0000 at 64 \
           action mirred egress redirect dev {IFB}; \
         tc -s filter show dev eth0 parent ffff:"
    )
}

/// The ifb device that [`delay_reqs_script`] creates in the guest.
const IFB: &str = "ifbreq";

/// Undoes [`delay_reqs_script`], after printing how many REQs the filter delayed.
fn undelay_reqs_script() -> String {
    format!(
        "set -e; tc -s filter show dev eth0 parent ffff:; \
         tc qdisc del dev eth0 handle ffff: ingress; ip link del {IFB}"
    )
}

fn perftest_guest_server_delayed(
    peer: &Peer,
    tool: &str,
    size: u32,
    port: u16,
) -> Result<(), String> {
    let n = iters(size);
    let s = peer.spawn(&format!(
        "stdbuf -oL {tool} -R -d rxe0 -n {n} -s {size} -p {port}"
    ));
    let dev = format!("roce_{}", peer.ifname);
    let mut attempts = 0;
    let mut earlier = String::new();
    let client = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_millis(500));
        let c = roce_tests::child::finish_within(
            ours(
                peer,
                tool,
                &words(&format!(
                    "-R -d {dev} -n {n} -s {size} -p {port} {}",
                    peer.guest_ip
                )),
            ),
            Duration::from_secs(120),
            &format!("our {tool} client"),
        );
        let out = roce_tests::output_text(&c);
        // perftest reports a rejected control connection as "Unexpected CM event ... 8"
        // (RDMA_CM_EVENT_REJECTED): the server is not listening yet. A failure of the data
        // connection ("RDMA CM event error") leaves the server waiting for it: no retry.
        let early = (not_listening_yet(&out) || out.contains("Unexpected CM event bl blka 8"))
            && !out.contains("RDMA CM event error");
        if c.status.success() || !early || attempts >= 30 || s.done() {
            break (c.status.success(), out);
        }
        earlier.push_str(&format!("attempt {attempts}:\n{out}\n"));
    };
    // A server whose client failed may wait for it forever: not long, then.
    let wait = if client.0 { 120 } else { 10 };
    let server = peer.wait_or_kill(&s, Duration::from_secs(wait));
    if !client.0 || server.rc != 0 {
        return Err(format!(
            "our {tool} client (ok: {}, attempt {attempts}):\n{}\nguest's {tool} server \
             (rc {}):\n{}\nour client's earlier attempts:\n{earlier}",
            client.0, client.1, server.rc, server.out
        ));
    }
    rdmacm::check_bw_row(&format!("our {tool} client"), &client.1, size, n)?;
    rdmacm::check_bw_row(&format!("guest's {tool} server"), &server.out, size, n)
}

/// perftest's `tool -R` with our server and the guest's client: the guest's client is run
/// again while ours has not listened yet.
fn perftest_our_server(peer: &Peer, tool: &str, size: u32, port: u16) -> Result<(), String> {
    let n = iters(size);
    let dev = format!("roce_{}", peer.ifname);
    let ((gok, gout), (sok, st)) = we_serve(
        peer,
        (tool, &format!("-R -d {dev} -n {n} -s {size} -p {port}")),
        &format!(
            "{tool} -R -d rxe0 -n {n} -s {size} -p {port} {}",
            peer.host_ip
        ),
        "*REJECTED*|*nable*onnect*|*ailed*onnect*",
    );
    if !gok || !sok {
        return Err(format!(
            "guest's {tool} client (ok {gok}):\n{gout}\nour {tool} server (ok {sok}):\n{st}"
        ));
    }
    // The guest's output holds the failed attempts too: the last run's table counts.
    let last = gout
        .rsplit_once(" BW Test")
        .map_or(gout.as_str(), |(_, l)| l);
    rdmacm::check_bw_row(&format!("guest's {tool} client"), last, size, n)?;
    rdmacm::check_bw_row(&format!("our {tool} server"), &st, size, n)
}

/// `roce perf OP -R` (4096 bytes, 1000 messages, --no-verify: perftest's buffers hold random
/// bytes) on the peer's veth, towards `host` or serving without it.
fn roce_perf_r(
    peer: &Peer,
    op: &str,
    port: u16,
    host: Option<String>,
) -> roce_tests::child::Reaper {
    let mut a: Vec<String> = [
        op,
        "-R",
        "-d",
        &peer.ifname,
        "-s",
        "4096",
        "-n",
        "1000",
        "-p",
        &port.to_string(),
        "--no-verify",
    ]
    .map(String::from)
    .to_vec();
    a.extend(host);
    rdmacm::roce_perf_in(&peer.netns, &a)
}

/// `roce perf OP -R` serving the guest's `tool -R` client (run again while ours has not
/// listened yet): perftest's table at the guest's end, our JSON report at ours.
fn roce_perf_our_server(peer: &Peer, op: &str, tool: &str, port: u16) -> Result<(), String> {
    let s = roce_perf_r(peer, op, port, None);
    let c = peer.spawn(&format!(
        "for i in $(seq 30); do sleep 0.5; out=$(stdbuf -oL {tool} -R -d rxe0 -n 1000 -s 4096 \
         -p {port} {} 2>&1); rc=$?; echo \"$out\"; [ $rc = 0 ] && exit 0; \
         case \"$out\" in *REJECTED*|*nable*onnect*|*ailed*onnect*) ;; *) exit $rc;; esac; \
         done; exit 1",
        peer.host_ip
    ));
    let guest = peer.wait_or_kill(&c, Duration::from_secs(120));
    let ours = roce_tests::child::finish_within(
        s,
        Duration::from_secs(60),
        &format!(
            "our roce perf {op} server (the guest's client: {})",
            guest.out
        ),
    );
    let st = roce_tests::output_text(&ours);
    if guest.rc != 0 || !ours.status.success() {
        return Err(format!(
            "guest's {tool} client (rc {}):\n{}\nour roce perf {op} -R server ({}):\n{st}",
            guest.rc, guest.out, ours.status
        ));
    }
    let last = guest
        .out
        .rsplit_once(" BW Test")
        .map_or(guest.out.as_str(), |(_, l)| l);
    rdmacm::check_bw_row(&format!("guest's {tool} client"), last, 4096, 1000)?;
    rdmacm::check_perf_report(
        &format!("our roce perf {op} server"),
        &st,
        (4096, 1000),
        false,
    )
}

/// The guest's `tool -R` server and our `roce perf OP -R` client, with no REQ held back: our
/// client resends a data REQ that the guest rejects because its perftest does not listen yet
/// (the 4.5-0.17 race of the module doc), so it copes by itself. It is run again only while
/// the guest's server has not listened for the control connection yet.
fn roce_perf_guest_server(peer: &Peer, op: &str, tool: &str, port: u16) -> Result<(), String> {
    let s = peer.spawn(&format!(
        "stdbuf -oL {tool} -R -d rxe0 -n 1000 -s 4096 -p {port}"
    ));
    let mut attempts = 0;
    let (ok, out) = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_millis(500));
        let c = roce_tests::child::finish_within(
            roce_perf_r(peer, op, port, Some(peer.guest_ip.to_string())),
            Duration::from_secs(120),
            &format!("our roce perf {op} client"),
        );
        let out = roce_tests::output_text(&c);
        if c.status.success() || !out.contains("nobody listens there") || attempts >= 30 || s.done()
        {
            break (c.status.success(), out);
        }
    };
    let server = peer.wait_or_kill(&s, Duration::from_secs(if ok { 120 } else { 10 }));
    if !ok || server.rc != 0 {
        return Err(format!(
            "our roce perf {op} -R client (ok {ok}, attempt {attempts}):\n{out}\nguest's {tool} \
             server (rc {}):\n{}",
            server.rc, server.out
        ));
    }
    rdmacm::check_perf_report(
        &format!("our roce perf {op} client"),
        &out,
        (4096, 1000),
        false,
    )?;
    // How often the guest's late listen showed: data REQs our client sent again after REJ 8.
    let resent = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["rdma_cm_reqs_resent"].as_u64());
    eprintln!("roce perf {op} -R client: data REQs resent after REJ 8: {resent:?}");
    rdmacm::check_bw_row(&format!("guest's {tool} server"), &server.out, 4096, 1000)
}

/// How one end of a run ended: whether it exited with status 0, and its output.
type End = (bool, String);

/// Runs `server` (a shell command line) in the guest, then our `client` program with its
/// arguments, run again (up to 30 times) while the guest has not listened yet. Returns our
/// client's end, how many attempts it took, and the guest server's end.
fn guest_serves(peer: &Peer, server: &str, (prog, args): (&str, &str)) -> (End, u32, End) {
    let s = peer.spawn(&format!("stdbuf -oL {server}"));
    let mut attempts = 0;
    let client = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_millis(500));
        let c = roce_tests::child::finish_within(
            ours(peer, prog, &words(args)),
            Duration::from_secs(120),
            &format!("our {prog} client"),
        );
        let out = roce_tests::output_text(&c);
        if c.status.success() || !not_listening_yet(&out) || attempts >= 30 || s.done() {
            break (c.status.success(), out);
        }
    };
    // A server whose client failed may wait for it forever: not long, then.
    let server = peer.wait_or_kill(&s, Duration::from_secs(if client.0 { 60 } else { 10 }));
    (client, attempts, (server.rc == 0, server.out))
}

/// Runs our `server` program with its arguments, then `client` (a shell command line) in the
/// guest, run again (up to 30 times) while its output says ours has not listened yet
/// (`retry`: a shell `case` pattern such as `*REJECTED*|*refused*`). Returns the guest
/// client's end (its output holds every attempt) and our server's.
fn we_serve(peer: &Peer, (prog, args): (&str, &str), client: &str, retry: &str) -> (End, End) {
    let s = ours(peer, prog, &words(args));
    let c = peer.spawn(&format!(
        "for i in $(seq 30); do sleep 0.5; out=$(stdbuf -oL {client} 2>&1); rc=$?; \
         echo \"$out\"; [ $rc = 0 ] && exit 0; case \"$out\" in {retry}) ;; *) exit $rc;; esac; \
         done; exit 1"
    ));
    let mut guest = peer.wait_or_kill(&c, Duration::from_secs(120));
    if guest.rc != 0 {
        // rxe's counters tell a guest that stopped sending (`sent_pkts`) from one we NAKed.
        guest.out += &format!("\nrxe's counters: {:?}", peer.hw_counters());
    }
    let server = roce_tests::child::finish_within(
        s,
        Duration::from_secs(60),
        &format!("our {prog} server (the guest's client: {})", guest.out),
    );
    (
        (guest.rc == 0, guest.out),
        (server.status.success(), roce_tests::output_text(&server)),
    )
}

/// An rdmacm-utils program (`ucmatose`, `udaddy`) with the server in the guest (`server`
/// arguments) and the client ours (`client` arguments); ours is run again while the guest's
/// server has not listened yet.
fn util_guest_server(peer: &Peer, prog: &str, server: &str, client: &str) -> Result<(), String> {
    let (c, attempts, s) = guest_serves(peer, &format!("{prog} {server}"), (prog, client));
    check_util(prog, ("our client", &c, attempts), ("guest's server", &s))
}

/// An rdmacm-utils program with our server and the guest's client, run again while ours
/// has not listened yet.
fn util_our_server(peer: &Peer, prog: &str, server: &str, client: &str) -> Result<(), String> {
    let (c, s) = we_serve(
        peer,
        (prog, server),
        &format!("{prog} {client}"),
        "*REJECTED*|*UNREACHABLE*|*unreachable*|*refused*",
    );
    check_util(prog, ("guest's client", &c, 0), ("our server", &s))
}

/// Both ends of an rdmacm-utils run succeeded and completed their data transfers.
fn check_util(
    prog: &str,
    client: (&str, &(bool, String), u32),
    server: (&str, &(bool, String)),
) -> Result<(), String> {
    let done =
        |out: &str| out.contains("data transfers complete") && out.contains("return status 0");
    let (cw, (cok, cout), attempts) = client;
    let (sw, (sok, sout)) = server;
    if !cok || !sok || !done(cout) || !done(sout) {
        return Err(format!(
            "{prog}: {cw} (ok {cok}, attempts {attempts}):\n{cout}\n{sw} (ok {sok}):\n{sout}"
        ));
    }
    Ok(())
}

/// Debian's rdma_server and rdma_client (librdmacm's synchronous mode: `rdma_create_ep`,
/// `rdma_get_request`, the rdma_verbs.h helpers): the server in the guest and the client
/// ours (`guest_server`), or the other way round; each must end with status 0.
fn sync_pair(peer: &Peer, guest_server: bool, ipv6: bool) -> Result<(), String> {
    let (ip, port) = match (guest_server, ipv6) {
        (true, false) => (peer.guest_ip.to_string(), 7481),
        (false, false) => (peer.host_ip.to_string(), 7482),
        (true, true) => (GUEST6.to_owned(), 7483),
        (false, true) => (HOST6.to_owned(), 7484),
    };
    let args = format!("-s {ip} -p {port}");
    let (client, server) = if guest_server {
        let (c, _, s) = guest_serves(peer, &format!("rdma_server {args}"), ("rdma_client", &args));
        (c, s)
    } else {
        we_serve(
            peer,
            ("rdma_server", &args),
            &format!("rdma_client {args}"),
            "*refused*|*unreachable*",
        )
    };
    let ok =
        |prog: &str, (good, out): &(bool, String)| *good && out.contains(&format!("{prog}: end 0"));
    if ok("rdma_client", &client) && ok("rdma_server", &server) {
        Ok(())
    } else {
        Err(format!(
            "rdma_client (ok {}):\n{}\nrdma_server (ok {}):\n{}",
            client.0, client.1, server.0, server.1
        ))
    }
}

/// Debian's `rping -V -C count` (every ping's payload checked by the client, which exits
/// non-zero on a mismatch): the server in the guest and the client ours (`guest_server`), or
/// the other way round, over IPv6 or IPv4. Both ends must exit with status 0; with `verbose`
/// (`-v`) both must also print every ping (rping's `-v` output of a long run would not fit in
/// the pipe the test reads after the run).
fn rping_vs(
    peer: &Peer,
    guest_server: bool,
    ipv6: bool,
    count: usize,
    verbose: bool,
) -> Result<(), String> {
    let pings = |out: &str| {
        out.lines()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count()
    };
    let port = 7485 + u16::from(guest_server) + 2 * u16::from(ipv6);
    let v = if verbose { "-v " } else { "" };
    let at = match (guest_server, ipv6) {
        (true, true) => GUEST6.to_owned(),
        (false, true) => HOST6.to_owned(),
        (true, false) => peer.guest_ip.to_string(),
        (false, false) => peer.host_ip.to_string(),
    };
    let args = format!("{v}-V -a {at} -p {port} -C {count}");
    let ((cok, cout), (sok, sout)) = if guest_server {
        let (c, _, s) = guest_serves(
            peer,
            &format!("rping -s {args}"),
            ("rping", &format!("-c {args}")),
        );
        (c, s)
    } else {
        we_serve(
            peer,
            ("rping", &format!("-s {args}")),
            &format!("rping -c {args}"),
            "*REJECTED*",
        )
    };
    // The guest's client output holds its rejected attempts too: count the pings only.
    let counted = !verbose || (pings(&cout) == count && pings(&sout) == count);
    if cok && sok && counted && !cout.contains("mismatch") {
        Ok(())
    } else {
        Err(format!(
            "rping -c (ok {cok}, {} pings):\n{cout}\nrping -s (ok {sok}, {} pings):\n{sout}",
            pings(&cout),
            pings(&sout)
        ))
    }
}

/// `roce pingpong -R -c` (rping's protocol over RDMA CM, roce itself, not a program on the
/// library) against the guest's unmodified `rping -v -V`: the server in the guest and the
/// client ours (`guest_server`), or the other way round, over IPv6 or IPv4, `count` pings of
/// `size` bytes on `port`. rping's `-v` lines must be every ping, each rping's data, and our
/// JSON summary must count every ping, each checked.
fn pingpong_vs(
    peer: &Peer,
    guest_server: bool,
    ipv6: bool,
    (count, size, port): (usize, usize, u16),
) -> Result<(), String> {
    let at = match (guest_server, ipv6) {
        (true, true) => GUEST6.to_owned(),
        (false, true) => HOST6.to_owned(),
        (true, false) => peer.guest_ip.to_string(),
        (false, false) => peer.host_ip.to_string(),
    };
    let roce = |extra: &str| {
        words(&format!(
            "pingpong -R -c -d {} -s {size} -p {port} {extra}",
            peer.ifname
        ))
    };
    let rping = format!("rping -v -V -S {size} -a {at} -p {port}");
    let (role, (cok, cout), (sok, sout)) = if guest_server {
        let s = peer.spawn(&format!("stdbuf -oL {rping} -s"));
        let mut attempts = 0;
        let client = loop {
            attempts += 1;
            std::thread::sleep(Duration::from_millis(500));
            let c = roce_tests::child::finish_within(
                roce_tests::child::spawn(&peer.netns, &roce(&format!("-n {count} {at}"))),
                Duration::from_secs(120),
                "our roce pingpong -R client",
            );
            let out = roce_tests::output_text(&c);
            if c.status.success() || !not_listening_yet(&out) || attempts >= 30 || s.done() {
                break (c.status.success(), out);
            }
        };
        let server = peer.wait_or_kill(&s, Duration::from_secs(if client.0 { 60 } else { 10 }));
        ("client", client, (server.rc == 0, server.out))
    } else {
        let s = roce_tests::child::spawn(&peer.netns, &roce(""));
        let c = peer.spawn(&format!(
            "for i in $(seq 30); do sleep 0.5; out=$(stdbuf -oL {rping} -c -C {count} 2>&1); \
             rc=$?; echo \"$out\"; [ $rc = 0 ] && exit 0; \
             case \"$out\" in *REJECTED*) ;; *) exit $rc;; esac; done; exit 1"
        ));
        let guest = peer.wait_or_kill(&c, Duration::from_secs(120));
        let server = roce_tests::child::finish_within(
            s,
            Duration::from_secs(60),
            &format!(
                "our roce pingpong -R server (the guest's client: {})",
                guest.out
            ),
        );
        (
            "server",
            (guest.rc == 0, guest.out),
            (server.status.success(), roce_tests::output_text(&server)),
        )
    };
    let (guest, ours) = if guest_server {
        ((sok, &sout), (cok, &cout))
    } else {
        ((cok, &cout), (sok, &sout))
    };
    let checked =
        rdmacm::check_ping_lines("the guest's rping", guest.1, count, size).and_then(|()| {
            rdmacm::check_pingpong_summary("ours", ours.1, role, count as u64, size as u64)
        });
    match checked {
        Ok(()) if guest.0 && ours.0 => Ok(()),
        r => Err(format!(
            "{r:?}\nthe guest's rping (ok {}):\n{}\nour roce pingpong -R {role} (ok {}):\n{}",
            guest.0, guest.1, ours.0, ours.1
        )),
    }
}

/// What the guest's kernel holds after every case: no RDMA CM id and no QP but the GSI QP
/// (QP 1) may be left (every program has exited, every connection ended in DREQ/DREP or a
/// reject), and its CM counters show no retransmission either way (`cm_tx_retries`: the
/// kernel never had to resend for want of our answer; `cm_rx_duplicates`: we never resent
/// to it). Returns the non-zero CM counters, for the log.
fn guest_left_clean(peer: &Peer, cm_mads: &Path) -> Result<String, String> {
    let ids = peer.exec("rdma res show cm_id", Duration::from_secs(30));
    let qps = peer.exec("rdma res show qp", Duration::from_secs(30));
    let counters = peer.exec(
        "cd /sys/class/infiniband/rxe0/ports/1 && grep -H . cm_*/* | grep -v ':0$'",
        Duration::from_secs(30),
    );
    let left_ids: Vec<&str> = ids.out.lines().filter(|l| !l.trim().is_empty()).collect();
    let left_qps: Vec<&str> = qps
        .out
        .lines()
        .filter(|l| l.contains("lqpn") && !l.contains("lqpn 1 "))
        .collect();
    let resent: Vec<&str> = counters
        .out
        .lines()
        .filter(|l| l.starts_with("cm_tx_retries/") || l.starts_with("cm_rx_duplicates/"))
        .collect();
    // Every copy on the wire, explained or not; the counters only say that there were some.
    let copies = cm_trace::resends(&cm_trace::read(cm_mads)?);
    let faults: Vec<String> = copies
        .iter()
        .filter(|r| !r.justified())
        .map(ToString::to_string)
        .collect();
    if !faults.is_empty() || (!resent.is_empty() && copies.is_empty()) {
        return Err(format!(
            "CM messages were sent again without cause between the guest and us:\n{}\nthe \
             guest's counters of retransmissions: {resent:?}\nall non-zero CM counters:\n{}",
            if faults.is_empty() {
                "(no copy in the capture explains the counters)".to_owned()
            } else {
                faults.join("\n")
            },
            counters.out
        ));
    }
    for r in &copies {
        eprintln!("a CM message sent again, as the protocol wants: {r}");
    }
    // Rejections are part of the cases (a client of ours that connects before the guest's
    // server listens is rejected with reason 8 and tries again); listed for the log.
    for r in cm_trace::rejections(cm_mads)? {
        eprintln!("{r}");
    }
    if ids.rc != 0 || qps.rc != 0 || !left_ids.is_empty() || !left_qps.is_empty() {
        return Err(format!(
            "the guest kept RDMA resources: rdma res show cm_id (rc {}):\n{}\nrdma res show qp              (rc {}):\n{}",
            ids.rc, ids.out, qps.rc, qps.out
        ));
    }
    Ok(counters.out)
}

type Case<'a> = (String, Box<dyn Fn(&Peer) -> Result<(), String> + 'a>);

/// The mark of the cases that Debian's perftest 4.5-0.17 passes against the slow guest only
/// with the guest's CM REQs delayed (see the module doc).
const PERFTEST_RACE: &str = "(REQs delayed: perftest 4.5-0.17 race)";

/// The cases, in order; `ROCE_RDMACM_CASES=word,...` keeps only those whose name contains
/// one of the words (for a developer's rerun; CI runs all).
fn cases<'a>() -> Vec<Case<'a>> {
    let mut v: Vec<Case<'a>> = Vec::new();
    let mut port = 18600u16;
    for (tool, sizes) in [
        ("ib_write_bw", [4096u32, 65536]),
        ("ib_read_bw", [4096, 65536]),
        ("ib_send_bw", [1024, 65536]),
    ] {
        for size in sizes {
            port += 1;
            let p = port;
            v.push((
                format!("{tool}-R s{size}: guest server, our client {PERFTEST_RACE}"),
                Box::new(move |peer: &Peer| perftest_guest_server(peer, tool, size, p)),
            ));
            port += 1;
            let p = port;
            v.push((
                format!("{tool}-R s{size}: our server, guest client"),
                Box::new(move |peer: &Peer| perftest_our_server(peer, tool, size, p)),
            ));
        }
    }
    for (prog, extra) in [("ucmatose", "-c 4 -C 50"), ("udaddy", "-c 2 -C 20 -S 512")] {
        v.push((
            format!("{prog}: guest server, our client"),
            Box::new(move |peer: &Peer| {
                util_guest_server(
                    peer,
                    prog,
                    &format!("-b {} {extra}", peer.guest_ip),
                    &format!("-s {} {extra}", peer.guest_ip),
                )
            }),
        ));
        v.push((
            format!("{prog}: our server, guest client"),
            Box::new(move |peer: &Peer| {
                util_our_server(
                    peer,
                    prog,
                    &format!("-b {} {extra}", peer.host_ip),
                    &format!("-s {} {extra}", peer.host_ip),
                )
            }),
        ));
    }
    // librdmacm's synchronous mode: rdma_server's and rdma_client's one message each way.
    v.push((
        "rdma_server/rdma_client: guest server, our client".to_owned(),
        Box::new(|peer: &Peer| sync_pair(peer, true, false)),
    ));
    v.push((
        "rdma_server/rdma_client: our server, guest client".to_owned(),
        Box::new(|peer: &Peer| sync_pair(peer, false, false)),
    ));
    // rping's long run: 1000 pings (each an RDMA READ and WRITE plus two SENDs), verified.
    v.push((
        "rping -C 1000: guest server, our client".to_owned(),
        Box::new(|peer: &Peer| rping_vs(peer, true, false, 1000, false)),
    ));
    v.push((
        "rping -C 1000: our server, guest client".to_owned(),
        Box::new(|peer: &Peer| rping_vs(peer, false, false, 1000, false)),
    ));
    // roce perf -R against the guest's perftest -R
    for (i, (op, tool)) in rdmacm::PERF_R_TOOLS.into_iter().enumerate() {
        let p = 18620 + 2 * i as u16;
        v.push((
            format!("roce perf {op} -R: guest server ({tool} -R), our client"),
            Box::new(move |peer: &Peer| roce_perf_guest_server(peer, op, tool, p)),
        ));
        v.push((
            format!("roce perf {op} -R: our server, guest client ({tool} -R)"),
            Box::new(move |peer: &Peer| roce_perf_our_server(peer, op, tool, p + 1)),
        ));
    }
    // IPv6 (the GIDs of fd79:80::/64 on both sides): the same programs, both directions.
    // Not perftest: its `-R` looks addresses up with `ai_family = AF_INET` (`check_add_port`'s
    // hints in src/perftest_communication.c), so Debian's perftest cannot connect over IPv6.
    for (prog, extra) in [("ucmatose", "-c 2 -C 20"), ("udaddy", "-c 2 -C 10 -S 512")] {
        v.push((
            format!("IPv6 {prog}: guest server, our client"),
            Box::new(move |peer: &Peer| {
                util_guest_server(
                    peer,
                    prog,
                    &format!("-b {GUEST6} {extra}"),
                    &format!("-s {GUEST6} {extra}"),
                )
            }),
        ));
        v.push((
            format!("IPv6 {prog}: our server, guest client"),
            Box::new(move |peer: &Peer| {
                util_our_server(
                    peer,
                    prog,
                    &format!("-b {HOST6} {extra}"),
                    &format!("-s {HOST6} {extra}"),
                )
            }),
        ));
    }
    v.push((
        "IPv6 rping: guest server, our client".to_owned(),
        Box::new(|peer: &Peer| rping_vs(peer, true, true, 20, true)),
    ));
    v.push((
        "IPv6 rping: our server, guest client".to_owned(),
        Box::new(|peer: &Peer| rping_vs(peer, false, true, 20, true)),
    ));
    v.push((
        "IPv6 rdma_server/rdma_client: guest server, our client".to_owned(),
        Box::new(|peer: &Peer| sync_pair(peer, true, true)),
    ));
    v.push((
        "IPv6 rdma_server/rdma_client: our server, guest client".to_owned(),
        Box::new(|peer: &Peer| sync_pair(peer, false, true)),
    ));
    // roce pingpong -R against the guest's rping
    for (ipv6, count, port) in [(false, 200, 18640u16), (true, 20, 18642)] {
        let ip = if ipv6 { "IPv6 " } else { "" };
        v.push((
            format!("{ip}roce pingpong -R -C {count}: guest rping server, our client"),
            Box::new(move |peer: &Peer| pingpong_vs(peer, true, ipv6, (count, 64, port))),
        ));
        v.push((
            format!("{ip}roce pingpong -R -C {count}: our server, guest rping client"),
            Box::new(move |peer: &Peer| pingpong_vs(peer, false, ipv6, (count, 64, port + 1))),
        ));
    }
    if let Ok(only) = std::env::var("ROCE_RDMACM_CASES") {
        let only: Vec<&str> = only.split(',').collect();
        v.retain(|(name, _)| only.iter().any(|w| name.contains(w)));
    }
    v
}

/// Debian's perftest (`-R`) and rdmacm-utils on the drop-in librdmacm against rxe's, both
/// directions, one VM boot: see the module's documentation for the cases.
#[test]
fn rdmacm_programs_on_the_drop_in_library_connect_to_and_from_rxe() {
    require_root();
    // perftest links libmlx5 and libefa: `roce exec` puts the stand-ins beside the library.
    let bin = roce_tests::roce_bin();
    let dir = bin.parent().expect("roce's folder");
    for lib in ["libibverbs.so", "libmlx5.so", "libefa.so"] {
        assert!(
            dir.join(lib).exists(),
            "{lib} is not built next to {} (cargo build -p roce-verbs -p roce-verbs-mlx5 \
             -p roce-verbs-efa)",
            bin.display()
        );
    }
    let peer = Peer::boot(
        &tag("r1"),
        SUBNET,
        &PeerOptions {
            ipv6: true,
            ..PeerOptions::default()
        },
    );
    // A program killed at a timeout cannot unload what it loaded: the pins go with the test.
    let _unpin = Loaded::guard(&peer.ifname);
    let mut failed = Vec::new();
    // QP 1's MADs only: the perftest cases move gigabytes. The file goes with the peer's
    // shared directory.
    let pcap = peer.share.join("cm-mads.pcap");
    let cap = Capture::start_filtered(&peer.netns, &peer.tap, &pcap, Some(cm_trace::QP1_FILTER));
    let cases = cases();
    assert!(!cases.is_empty(), "ROCE_RDMACM_CASES selected no case");
    let n = cases.len();
    for (name, case) in cases {
        let t = Instant::now();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| case(&peer)))
            .unwrap_or_else(|p| Err(panic_text(&*p)));
        eprintln!(
            "case {name}: {} in {:.1} s",
            if r.is_ok() { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        if let Err(e) = r {
            // At once, so that a long run shows what went wrong as it goes.
            eprintln!("case {name}: {e}");
            failed.push(format!("case `{name}` failed: {e}"));
        }
    }
    // Every connection and id the cases made in the kernel is gone again.
    let cm_mads = cap.stop();
    match guest_left_clean(&peer, &cm_mads.path) {
        Ok(counters) => eprintln!("guest's CM counters (non-zero):\n{counters}"),
        Err(e) => failed.push(e),
    }
    assert!(
        failed.is_empty(),
        "{} of {n} cases failed:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
    drop(peer);
}
