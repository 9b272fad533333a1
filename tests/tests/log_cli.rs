//! `roce log` against a roce_xdp attached by `roce load` on a veth pair between two namespaces
//! this test makes: malformed frames sent from the peer come out as JSON lines with their reason,
//! QPN, opcode and PSN; the level map is on while `roce log` runs and off after Ctrl-C; nothing
//! is written when it is off; `roce load --log-level` starts the program logging. Needs root.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use nix::{sys::signal, unistd::Pid};
use roce::loader::{
    Pins,
    ebpf_log::{LevelMap, LogLevel, Program},
    pin_dir,
};
use roce_common::{counters::DropReason, opcode::Opcode};
use roce_tests::{Frame, Loaded, RawPort, require_root, roce, roce_bin, roce_ok, veth_pair};

/// Kills the `roce log` it holds on drop (by its PID), if it is still running.
struct Streaming(Child);

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn level(ifname: &str) -> LogLevel {
    LevelMap::open(Program::RoceXdp, ifname)
        .expect("level map pinned")
        .get()
        .unwrap()
}

#[test]
fn roce_log_streams_drops_as_json_and_switches_the_level() {
    require_root();
    let pair = veth_pair("lg", 77);
    let b = pair.b.clone();
    roce_ok(&["--netns", &b.netns, "load", "-i", &b.ifname]);
    let _guard = Loaded::guard(&b.ifname);
    assert_eq!(level(&b.ifname), LogLevel::Off, "off by default");
    Pins::new(&b.ifname)
        .add_qp(0x11, std::process::id())
        .unwrap();

    let mut child = Command::new(roce_bin())
        .args(["--netns", &b.netns, "-j", "log", "-i", &b.ifname])
        .args(["--level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce log");
    let stdout = child.stdout.take().unwrap();
    let log = Streaming(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while level(&b.ifname) != LogLevel::Warn {
        assert!(Instant::now() < deadline, "roce log never set the level");
        std::thread::sleep(Duration::from_millis(20));
    }

    let d = Frame::default();
    let cases: Vec<(Frame, DropReason)> = vec![
        (
            Frame {
                tver: 1,
                psn: 101,
                ..d.clone()
            },
            DropReason::BadTver,
        ),
        (
            Frame {
                opcode: Opcode(0x15),
                psn: 102,
                ..d.clone()
            },
            DropReason::UnknownOpcode,
        ),
        (
            Frame {
                dest_qp: 0,
                psn: 103,
                ..d.clone()
            },
            DropReason::ReservedQpn,
        ),
        (
            Frame {
                payload: 30,
                pad: Some(0),
                psn: 104,
                ..d.clone()
            },
            DropReason::BadLength,
        ),
        (
            Frame {
                opcode: Opcode::RC_ACKNOWLEDGE,
                payload: 4,
                psn: 105,
                ..d.clone()
            },
            DropReason::UnexpectedPayload,
        ),
        (
            Frame {
                udp_len: Some(1000),
                psn: 106,
                ..d.clone()
            },
            DropReason::UdpLength,
        ),
    ];
    let mut port = RawPort::open(&pair.a.netns, &pair.a.ifname).expect("raw socket in A");
    for (f, _) in &cases {
        port.send(&f.build()).unwrap();
    }
    // Also a frame for our QP: no AF_XDP socket, so it falls back to the kernel (warn).
    port.send(
        &Frame {
            psn: 107,
            ..d.clone()
        }
        .build(),
    )
    .unwrap();

    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while records.len() < cases.len() + 1 && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
            records.push(v);
        }
    }
    for (f, reason) in &cases {
        let r = records
            .iter()
            .find(|r| r["psn"] == f.psn)
            .unwrap_or_else(|| panic!("no record for {reason:?}: {records:?}"));
        assert_eq!(r["program"], "roce_xdp", "{r}");
        assert_eq!(r["level"], "warn", "{r}");
        assert_eq!(r["event"], "drop", "{r}");
        assert_eq!(r["reason"], reason.counter_name(), "{r}");
        assert_eq!(r["qpn"], f.dest_qp, "{r}");
        assert_eq!(r["opcode"], f.opcode.0, "{r}");
        assert_eq!(r["src"], "10.0.0.1", "{r}");
        assert_eq!(r["dst"], "10.0.0.2", "{r}");
        assert!(r["time"].as_f64().is_some(), "{r}");
    }
    let fb = records
        .iter()
        .find(|r| r["psn"] == 107)
        .unwrap_or_else(|| panic!("no fallback record: {records:?}"));
    assert_eq!(fb["event"], "fallback", "{fb}");
    assert_eq!(fb["reason"], "redirect_fallback_pass", "{fb}");
    // Kernel traffic (IPv6 neighbour discovery) is never logged: only ours came out.
    assert_eq!(records.len(), cases.len() + 1, "{records:?}");

    // Ctrl-C: roce log ends cleanly and switches the program off again.
    let mut log = log;
    signal::kill(Pid::from_raw(log.0.id() as i32), signal::Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = log.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "roce log did not end on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "roce log exit: {status}");
    assert_eq!(level(&b.ifname), LogLevel::Off, "level restored on Ctrl-C");

    // Off: the same frames are dropped and counted, and no record is written.
    let map = LevelMap::open(Program::RoceXdp, &b.ifname).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut reader = map.logger(Collect(seen.clone())).unwrap();
    reader.flush();
    seen.lock().unwrap().clear();
    let before = Pins::new(&b.ifname).xdp_stats().unwrap();
    for (f, _) in &cases {
        port.send(&f.build()).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = Pins::new(&b.ifname).xdp_stats().unwrap();
        if after.drop_bad_tver > before.drop_bad_tver
            && after.drop_udp_length > before.drop_udp_length
        {
            break;
        }
        assert!(Instant::now() < deadline, "frames not dropped: {after:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.flush();
    assert!(
        seen.lock().unwrap().is_empty(),
        "records while off: {:?}",
        seen.lock().unwrap()
    );

    // `roce load --log-level` starts with the level set.
    roce_ok(&["unload", "-i", &b.ifname]);
    roce_ok(&[
        "--netns",
        &b.netns,
        "load",
        "-i",
        &b.ifname,
        "--log-level",
        "info",
    ]);
    assert_eq!(level(&b.ifname), LogLevel::Info);

    // An endpoint that loads roce_xdp itself starts it at its `--log-level`, and takes the
    // program away when it ends.
    roce_ok(&["unload", "-i", &b.ifname]);
    let server = Streaming(
        Command::new(roce_bin())
            .args(["--netns", &b.netns, "pingpong", "-d", &b.ifname])
            .args(["-p", "18781", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn roce pingpong"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let warn_now = |ifname: &str| {
        LevelMap::open(Program::RoceXdp, ifname)
            .and_then(|m| m.get())
            .is_ok_and(|l| l == LogLevel::Warn)
    };
    while !warn_now(&b.ifname) {
        assert!(
            Instant::now() < deadline,
            "roce pingpong --log-level warn did not load roce_xdp at warn"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Ctrl-C: it unloads what it loaded on its way out.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.0.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pin_dir(&b.ifname).exists() {
        assert!(
            Instant::now() < deadline,
            "roce pingpong left roce_xdp behind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);

    // Without a program, roce log says what to do.
    let o = roce(&["--netns", &b.netns, "log", "-i", &b.ifname]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("roce load -i"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Keeps every record message.
struct Collect(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl log::Log for Collect {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0.lock().unwrap().push(r.args().to_string());
    }
    fn flush(&self) {}
}
