//! `roce dump`: a capture of what the endpoints process, checked against their own counters and
//! against Wireshark's dissectors (tshark). Two namespaces joined by a veth pair made here,
//! roce_xdp on both ends, `roce perf` processes as the endpoints. Root.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pcap_file::pcapng::{Block, PcapNgReader};
use roce::{
    engine::capture::capture_dir,
    netns::{self, VethOptions, VethPair},
};
use roce_tests::{
    Loaded,
    child::{Reaper, finish, finish_within, json_ok, spawn},
    rdmacm::{args, server_and_client},
    require_root, roce_bin, tag,
};
use serde_json::Value;

/// Removes the capture files of the test's interfaces, whatever happened.
struct CaptureFiles(Vec<PathBuf>);

impl Drop for CaptureFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn setup(t: &str, subnet: u8) -> (VethPair, Loaded) {
    require_root();
    let pair = VethPair::new(
        &tag(t),
        &VethOptions {
            mtu: 1500,
            subnet,
            ..VethOptions::default()
        },
    )
    .expect("veth pair");
    let l = Loaded::both(&pair);
    (pair, l)
}

/// Runs `args` as server in B and client in A and checks that the client verified the data.
fn perf(pair: &VethPair, args: &str) {
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    let mut s_args = args.clone();
    s_args.extend(["-d".into(), pair.b.ifname.clone()]);
    let server = spawn(&pair.b.netns, &s_args);
    let mut c_args = args;
    c_args.extend(["-d".into(), pair.a.ifname.clone(), pair.b.ipv4.to_string()]);
    let client = finish_within(
        spawn(&pair.a.netns, &c_args),
        Duration::from_secs(60),
        "perf client",
    );
    let server = finish_within(server, Duration::from_secs(30), "perf server");
    let c = json_ok(&client, &format!("client {c_args:?}"));
    let _ = json_ok(&server, &format!("server {s_args:?}"));
    assert_eq!(c["verified"], true, "{c}");
}

/// `roce dump ARGS` in `ns`, once it has announced itself (its `dump-<pid>` file exists).
fn start_dump(ns: &str, ifname: &str, args: &[&str]) -> Reaper {
    let mut a = vec!["dump".to_owned(), "-i".to_owned(), ifname.to_owned()];
    a.extend(args.iter().map(|s| (*s).to_owned()));
    let r = spawn(ns, &a);
    let announce = capture_dir(ifname).join(format!("dump-{}", r.pid()));
    let t0 = Instant::now();
    while !announce.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "roce dump {a:?} did not announce itself at {}",
            announce.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    r
}

/// `roce dump -w FILE` at both ends of `pair`, into `/tmp/<name>-<pid>-{a,b}.pcapng`: the
/// files (removed when the guard drops) and the running dumps.
fn capture_both(pair: &VethPair, name: &str) -> (Vec<PathBuf>, CaptureFiles, [Reaper; 2]) {
    let dir = std::env::temp_dir();
    let files: Vec<PathBuf> = ["a", "b"]
        .iter()
        .map(|e| dir.join(format!("{name}-{}-{e}.pcapng", std::process::id())))
        .collect();
    let dumps = [(&pair.a, &files[0]), (&pair.b, &files[1])]
        .map(|(end, file)| start_dump(&end.netns, &end.ifname, &["-w", file.to_str().unwrap()]));
    (files.clone(), CaptureFiles(files), dumps)
}

/// Sends SIGINT, as Ctrl-C does.
fn interrupt(r: &Reaper) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(r.pid()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
}

/// Ends a dump as Ctrl-C does and returns its JSON summary.
fn stop_dump(r: Reaper, what: &str) -> Value {
    interrupt(&r);
    let o = finish_within(r, Duration::from_secs(10), what);
    json_ok(&o, what)
}

/// One captured frame: inbound or not, and its comment.
#[derive(Debug)]
struct Captured {
    inbound: bool,
    comment: String,
    len: usize,
}

fn read_pcapng(path: &Path) -> Vec<Captured> {
    read_pcapng_bytes(&std::fs::read(path).unwrap())
}

fn read_pcapng_bytes(bytes: &[u8]) -> Vec<Captured> {
    let mut r = PcapNgReader::new(bytes).expect("a pcapng section header");
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.expect("a well-formed pcapng block") {
            let mut flags = None;
            let mut comment = String::new();
            for o in &p.options {
                match o {
                    pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Flags(f) => {
                        flags = Some(*f);
                    }
                    pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Comment(
                        c,
                    ) => comment = c.to_string(),
                    _ => {}
                }
            }
            let dir = flags.expect("every frame has its direction (epb_flags)") & 3;
            assert!(dir == 1 || dir == 2, "direction bits {dir}");
            out.push(Captured {
                inbound: dir == 1,
                comment,
                len: p.data.len(),
            });
        }
    }
    out
}

/// `tshark -r FILE` with a display filter: the number of frames it matches.
fn tshark_count(file: &Path, filter: &str) -> usize {
    let o = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(file)
        .args(["-Y", filter, "-T", "fields", "-e", "frame.number"])
        .output()
        .expect("tshark (Debian's tshark package) must be installed");
    assert!(
        o.status.success(),
        "tshark {filter}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).lines().count()
}

fn transport(ifname: &str, name: &str) -> u64 {
    let o = Command::new(roce_bin())
        .args(["stats", "-j", "-i", ifname])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["transport"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{ifname} transport {name}: {v}"))
}

/// A capture on each end during verified WRITE, READ, SEND and atomic traffic (a new pair of
/// perf processes each) holds exactly the frames the transports counted as sent and received,
/// each with its direction, queue and QP, none lost; tshark decodes every one of them as
/// InfiniBand over UDP 4791 and finds no malformed packet.
#[test]
fn capture_matches_the_counters_and_tshark_finds_nothing_malformed() {
    let (pair, _l) = setup("dmc", 98);
    let (files, _cleanup, dumps) = capture_both(&pair, "roce-dump");
    for args in [
        "perf write -s 4096 -n 100 -m 1024 -t 16",
        "perf read -s 4096 -n 100 -m 1024 -t 16",
        "perf send -s 4096 -n 100 -m 1024 -t 16",
        "perf atomic -n 200 -m 1024",
        "perf atomic --cmp-swap -n 100 -m 1024",
    ] {
        perf(&pair, args);
    }
    // The rings of the perf processes, closed when they exited, are drained within 50 ms.
    std::thread::sleep(Duration::from_millis(300));
    let [da, db] = dumps;
    let summaries = [stop_dump(da, "dump a"), stop_dump(db, "dump b")];
    for ((end, file), summary) in [&pair.a, &pair.b].iter().zip(&files).zip(&summaries) {
        let frames = read_pcapng(file);
        let rx = frames.iter().filter(|f| f.inbound).count() as u64;
        let tx = frames.len() as u64 - rx;
        let (sent, rcvd) = (
            transport(&end.ifname, "sent_pkts"),
            transport(&end.ifname, "rcvd_pkts"),
        );
        assert_eq!(summary["lost"], 0, "{}: {summary}", end.ifname);
        assert_eq!(summary["dropped"], 0, "{}: {summary}", end.ifname);
        // Five perf runs, one process (one ring) each.
        assert_eq!(summary["rings"], 5, "{}: {summary}", end.ifname);
        assert_eq!(
            (tx, rx),
            (sent, rcvd),
            "{}: captured (tx, rx) vs the transport's (sent_pkts, rcvd_pkts)",
            end.ifname
        );
        assert_eq!(summary["frames"], frames.len() as u64);
        // The client's requests: 400 WRITE, 100 READ request, 400 SEND and 300 atomic packets.
        let floor = if end.ifname == pair.a.ifname {
            1200
        } else {
            300
        };
        assert!(sent >= floor, "{}: sent {sent}", end.ifname);
        for f in &frames {
            assert!(
                f.comment.starts_with("queue 0, QP "),
                "{}: comment {:?}",
                end.ifname,
                f.comment
            );
            assert!(f.len >= 14 + 20 + 8 + 12 + 4, "{f:?}");
        }
        // tshark: every frame is RoCE v2 (the ib dissector on UDP 4791), none malformed.
        assert_eq!(tshark_count(file, "infiniband"), frames.len(), "{file:?}");
        assert_eq!(tshark_count(file, "_ws.malformed"), 0, "{file:?}");
        assert_eq!(tshark_count(file, "_ws.expert.severity >= error"), 0);
        // Direction as Wireshark reads it (epb_flags): inbound frames are the received ones.
        assert_eq!(
            tshark_count(file, "frame.packet_flags_direction == 1") as u64,
            rx
        );
        // The opcodes of every run are there, in both directions' captures.
        for (op, what) in [
            (6, "RDMA WRITE First"),
            (8, "RDMA WRITE Last"),
            (12, "RDMA READ Request"),
            (15, "RDMA READ response Last"),
            (0, "SEND First"),
            (2, "SEND Last"),
            (17, "Acknowledge"),
            (18, "Atomic Acknowledge"),
            (19, "CompareSwap"),
            (20, "FetchAdd"),
        ] {
            let n = tshark_count(file, &format!("infiniband.bth.opcode == {op}"));
            assert!(
                n > 0,
                "{}: no {what} (opcode {op}) in the capture",
                end.ifname
            );
        }
    }
    // Both ends saw the same conversation from opposite sides.
    assert_eq!(
        transport(&pair.a.ifname, "sent_pkts"),
        transport(&pair.b.ifname, "rcvd_pkts")
    );
}

/// `--qp` and `--tx` keep only that QP's transmitted frames; `--rx -c N` prints N received
/// frames as JSON lines and stops on its own; `-w -` pipes pcapng into `tshark -r -`.
#[test]
fn filters_count_and_stdout() {
    let (pair, _l) = setup("dmf", 99);
    let first = roce_common::maps::FIRST_QPN;
    // Two QPs per process: FIRST_QPN and FIRST_QPN + 1 on each end (a fresh process claims
    // from FIRST_QPN on). Keep the second one's transmits only.
    let file = std::env::temp_dir().join(format!("roce-dump-{}-qp.pcapng", std::process::id()));
    let _cleanup = CaptureFiles(vec![file.clone()]);
    let qp = (first + 1).to_string();
    let d = start_dump(
        &pair.a.netns,
        &pair.a.ifname,
        &["-w", file.to_str().unwrap(), "--tx", "--qp", &qp],
    );
    let sent_before = transport(&pair.a.ifname, "sent_pkts");
    perf(&pair, "perf write -q 2 -s 4096 -n 50 -m 1024 -t 8");
    std::thread::sleep(Duration::from_millis(300));
    let summary = stop_dump(d, "dump --qp --tx");
    let sent = transport(&pair.a.ifname, "sent_pkts") - sent_before;
    let frames = read_pcapng(&file);
    // 50 WRITEs of 4 packets from that QP; the other QP's and every received frame filtered.
    assert!(frames.len() >= 200, "{} frames: {summary}", frames.len());
    assert!((frames.len() as u64) < sent, "{summary}, sent {sent}");
    assert_eq!(summary["frames"], frames.len() as u64);
    assert!(summary["filtered"].as_u64().unwrap() > 0, "{summary}");
    for f in &frames {
        assert!(!f.inbound, "{f:?}");
        assert!(f.comment.contains(&format!("QP {qp}")), "{f:?}");
    }

    // --rx -c 5: five JSON lines, then the dump ends by itself while traffic goes on.
    let d = start_dump(&pair.a.netns, &pair.a.ifname, &["--rx", "-c", "5"]);
    perf(&pair, "perf write -s 4096 -n 50 -m 1024 -t 8");
    let o = finish_within(d, Duration::from_secs(10), "dump -c 5");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    for l in &lines {
        assert_eq!(l["dir"], "rx", "{l}");
        assert_eq!(l["queue"], 0);
        assert!(l["opcode"].is_string() && l["psn"].is_u64(), "{l}");
        assert_eq!(l["drop"], Value::Null);
    }

    // -w - -c 20 | tshark -r -: twenty frames, decoded.
    let d = start_dump(&pair.a.netns, &pair.a.ifname, &["-w", "-", "-c", "20"]);
    perf(&pair, "perf write -s 4096 -n 50 -m 1024 -t 8");
    let o = finish_within(d, Duration::from_secs(10), "dump -w - -c 20");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read_pcapng_bytes(&o.stdout).len(), 20);
    let mut ts = Command::new("tshark")
        .args([
            "-n",
            "-r",
            "-",
            "-Y",
            "infiniband",
            "-T",
            "fields",
            "-e",
            "frame.number",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("tshark");
    ts.stdin.take().unwrap().write_all(&o.stdout).unwrap();
    let t = ts.wait_with_output().unwrap();
    assert!(t.status.success());
    assert_eq!(String::from_utf8_lossy(&t.stdout).lines().count(), 20);

    // One capture per interface: a second dump is refused with a clear error.
    let d = start_dump(&pair.a.netns, &pair.a.ifname, &["-c", "1"]);
    let second = finish(spawn(
        &pair.a.netns,
        &["dump".into(), "-i".into(), pair.a.ifname.clone()],
    ));
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stdout).contains("another roce dump"),
        "{second:?}"
    );
    // Interrupted: it ends cleanly and takes its announcement away.
    let announce = capture_dir(&pair.a.ifname).join(format!("dump-{}", d.pid()));
    interrupt(&d);
    let o = finish_within(d, Duration::from_secs(10), "dump -c 1");
    assert!(o.status.success(), "{o:?}");
    assert!(!announce.exists());
}

/// A frame the transport drops is in the capture, inbound, with the name of the counter that
/// counted it: three RoCE SENDs to a live QP of an in-process device, sent from B's raw socket
/// with a zero ICRC (roce_xdp does not check the ICRC, so they reach the transport, which counts
/// them in `rx_malformed`).
#[test]
fn frames_the_transport_drops_carry_the_counter_name() {
    use roce::api::{Device, DeviceOptions, QpInit, QpType};
    let (pair, _l) = setup("dmd", 100);
    let file = std::env::temp_dir().join(format!("roce-dump-{}-drop.pcapng", std::process::id()));
    let _cleanup = CaptureFiles(vec![file.clone()]);
    let d = start_dump(
        &pair.a.netns,
        &pair.a.ifname,
        &["-w", file.to_str().unwrap()],
    );
    let mut port = roce_tests::RawPort::open(&pair.b.netns, &pair.b.ifname).expect("raw socket");
    let a_if = pair.a.ifname.clone();
    let malformed = netns::in_netns(&pair.a.netns, move || {
        let dev = Device::open(&a_if, &DeviceOptions::default()).expect("open A");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(16).expect("cq");
        let qpn = dev.create_qp(QpInit::new(QpType::Rc, pd, cq)).expect("qp");
        for psn in 0..3 {
            let f = roce_tests::Frame {
                dest_qp: qpn.value(),
                psn,
                ..roce_tests::Frame::default()
            };
            port.send(&f.build()).expect("send");
        }
        let t0 = Instant::now();
        loop {
            let n = dev.counters().0.rx_malformed;
            if n >= 3 || t0.elapsed() > Duration::from_secs(5) {
                // Past the device's close the capture ring is drained by the dump.
                return n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .unwrap();
    assert_eq!(malformed, 3);
    std::thread::sleep(Duration::from_millis(300));
    let summary = stop_dump(d, "dump of dropped frames");
    let frames = read_pcapng(&file);
    let dropped: Vec<_> = frames
        .iter()
        .filter(|f| {
            f.comment
                .ends_with("dropped by the transport: rx_malformed")
        })
        .collect();
    assert_eq!(dropped.len(), 3, "{frames:?}");
    assert!(dropped.iter().all(|f| f.inbound));
    assert_eq!(summary["dropped"], 3, "{summary}");
    assert_eq!(summary["lost"], 0, "{summary}");
}

/// Loopback: the `loopback` example connects two QPs of one device; each of its frames is in
/// the capture twice, outbound and inbound with the same bytes, marked `loopback`, and the
/// counts are the transport's `sent_pkts` and `rcvd_pkts`.
#[test]
fn looped_back_frames_appear_once_each_way() {
    let (pair, _l) = setup("dml", 101);
    let file = std::env::temp_dir().join(format!("roce-dump-{}-loop.pcapng", std::process::id()));
    let _cleanup = CaptureFiles(vec![file.clone()]);
    let d = start_dump(
        &pair.a.netns,
        &pair.a.ifname,
        &["-w", file.to_str().unwrap()],
    );
    let bin = roce_tests::example_bin("loopback");
    let run =
        roce_tests::child::spawn_in(&pair.a.netns, &bin, std::slice::from_ref(&pair.a.ifname));
    let o = finish_within(run, Duration::from_secs(60), "loopback");
    assert!(o.status.success(), "loopback: {o:?}");
    std::thread::sleep(Duration::from_millis(300));
    let summary = stop_dump(d, "dump of loopback");
    let frames = read_pcapng(&file);
    let bytes = read_pcapng_bytes_data(&std::fs::read(&file).unwrap());
    let (sent, rcvd) = (
        transport(&pair.a.ifname, "sent_pkts"),
        transport(&pair.a.ifname, "rcvd_pkts"),
    );
    let rx = frames.iter().filter(|f| f.inbound).count() as u64;
    assert_eq!((frames.len() as u64 - rx, rx), (sent, rcvd), "{summary}");
    // 64 WRITE packets, the READ and its 64 responses, a SEND, two atomics and the ACKs.
    assert!(sent > 130, "{sent}");
    assert!(frames.iter().all(|f| f.comment.contains("loopback")));
    // Each frame sent is the next one received: the same bytes, out then in.
    for (i, pair_of) in bytes.chunks(2).enumerate() {
        assert_eq!(pair_of.len(), 2, "frame {i} has no twin");
        assert!(!pair_of[0].0 && pair_of[1].0, "frame {i}: out then in");
        assert_eq!(pair_of[0].1, pair_of[1].1, "frame {i}: the same bytes");
    }
    assert_eq!(tshark_count(&file, "_ws.malformed"), 0);
    assert_eq!(tshark_count(&file, "infiniband"), frames.len());
}

/// (inbound, frame bytes) of every packet of a pcapng capture, in file order.
fn read_pcapng_bytes_data(bytes: &[u8]) -> Vec<(bool, Vec<u8>)> {
    let mut r = PcapNgReader::new(bytes).expect("a pcapng section header");
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.expect("a well-formed pcapng block") {
            let inbound = p.options.iter().any(|o| {
                matches!(
                    o,
                    pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Flags(1)
                )
            });
            out.push((inbound, p.data.to_vec()));
        }
    }
    out
}

/// A capture that falls behind loses capture records, counted, never traffic: the dump writes
/// into a pipe no one reads while a verified WRITE of 25 MiB (25,600 packets, three times what
/// the 8 MiB ring holds) runs; then the pipe is read. Every frame the transport counted is either
/// in the capture or counted as lost, and the WRITE's data arrived intact.
#[test]
fn a_capture_that_falls_behind_loses_records_counted_never_traffic() {
    let (pair, _l) = setup("dmx", 102);
    let d = start_dump(&pair.a.netns, &pair.a.ifname, &["-w", "-"]);
    perf(&pair, "perf write -s 65536 -n 400 -m 1024 -t 16");
    // Read the pipe from now on (finish_within drains it) and stop the dump 2 s later.
    let pid = d.pid();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGINT,
        );
    });
    let o = finish_within(d, Duration::from_secs(30), "dump into a stalled pipe");
    stopper.join().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let captured = read_pcapng_bytes(&o.stdout).len() as u64;
    let lost: u64 = err
        .split(", ")
        .find_map(|part| part.strip_suffix(" capture records lost"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no lost count in the summary: {err}"));
    let (sent, rcvd) = (
        transport(&pair.a.ifname, "sent_pkts"),
        transport(&pair.a.ifname, "rcvd_pkts"),
    );
    eprintln!(
        "captured {captured}, lost {lost}, of {} frames",
        sent + rcvd
    );
    assert!(sent >= 25_600, "{sent}");
    assert!(lost > 0, "the ring never filled: {err}");
    assert!(captured > 0, "{err}");
    assert_eq!(
        captured + lost,
        sent + rcvd,
        "captured + lost vs sent_pkts + rcvd_pkts: {err}"
    );
}

/// What Debian's rping and ucmatose on the drop-in librdmacm send and receive through QP 1,
/// captured at both ends: every frame to or from QP 1 is a MAD of the Communication Management
/// class that tshark's InfiniBand dissector decodes with no warning or error (so the kernel's
/// CM, which parses the same fields, gets what it expects), and the whole exchange is there:
/// REQ, REP, RTU, DREQ and DREP (REJ too while the server was not listening yet).
#[test]
fn the_librarys_cm_mads_dissect_in_tshark_without_a_warning() {
    let (pair, _l) = setup("dcm", 99);
    let (files, _cleanup, dumps) = capture_both(&pair, "roce-dump-cm");
    let server_ip = pair.a.ipv4.to_string();
    let (c, _) = server_and_client(
        &pair,
        "rping",
        &args(&["-s", "-V", "-C", "20", "-p", "7176", "-a", &server_ip]),
        &args(&["-c", "-V", "-v", "-C", "20", "-p", "7176", "-a", &server_ip]),
    );
    assert_eq!(c.matches("ping data: rdma-ping-").count(), 20, "{c}");
    let (c, _) = server_and_client(
        &pair,
        "ucmatose",
        &args(&["-b", &server_ip, "-p", "7177", "-c", "2", "-C", "10"]),
        &args(&["-s", &server_ip, "-p", "7177", "-c", "2", "-C", "10"]),
    );
    assert!(c.contains("return status 0"), "{c}");
    std::thread::sleep(Duration::from_millis(300));
    let [da, db] = dumps;
    let summaries = [stop_dump(da, "dump a"), stop_dump(db, "dump b")];
    for (file, summary) in files.iter().zip(&summaries) {
        assert_eq!(summary["lost"], 0, "{summary}");
        let qp1 = "infiniband.bth.destqp == 1";
        let mads = tshark_count(file, qp1);
        assert!(mads >= 5, "{file:?}: {mads} frames to QP 1");
        assert_eq!(
            tshark_count(file, &format!("{qp1} && infiniband.mad.mgmtclass == 0x07")),
            mads,
            "{file:?}: a frame to QP 1 that is not a CM MAD"
        );
        assert_eq!(tshark_count(file, "_ws.malformed"), 0, "{file:?}");
        assert_eq!(
            tshark_count(file, "_ws.expert.severity >= warning"),
            0,
            "{file:?}"
        );
        // IBTA 16.7.2 attribute IDs, in each end's capture: three connections each made with
        // a REQ, REP and RTU; each ended with DREQs and DREPs (how many of each end's depends
        // on who disconnects first: both ends of ucmatose do, and crossing DREQs are each
        // answered).
        for (id, what, least) in [
            (0x10, "REQ", 3),
            (0x13, "REP", 3),
            (0x14, "RTU", 3),
            (0x15, "DREQ", 1),
            (0x16, "DREP", 1),
        ] {
            let n = tshark_count(
                file,
                &format!("{qp1} && infiniband.mad.attributeid == {id:#06x}"),
            );
            assert!(n >= least, "{file:?}: {n} {what}");
        }
    }
}
