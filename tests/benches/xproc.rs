//! The building blocks of several processes per interface (issue 22, docs/multiprocess.md),
//! measured before choosing (`cargo bench -p roce-tests --bench xproc`; no root needed).
//!
//! A transport serving another process's QPs must reach that process's registered memory and
//! hear of its posted work. This measures, in one run, each way against what one process does
//! today:
//! - Placing payload into a registered region: `memcpy` within the process (today's path, the
//!   baseline) against `process_vm_writev(2)` into a child process (one packet per call, and
//!   64 packets per call as an engine batch would) and `pwrite(2)` on `/proc/PID/mem`, for
//!   1024- and 4096-byte packets (RoCE's common path MTUs). GB/s.
//! - Telling the engine about posted work and hearing back: an eventfd ping-pong between two
//!   threads (today's kick of the engine thread, the baseline) against a message ping-pong on a
//!   `SOCK_SEQPACKET` Unix socket pair (a control channel between processes). Round trips per
//!   second.
//!
//! A shared mapping (a memfd both processes map) costs what `memcpy` costs once it is mapped,
//! so it has no row of its own; what it costs is the remapping at registration
//! (docs/multiprocess.md). Each row is the median of `REPS` runs of `RUN`, with min and max.
//! Set `ROCE_BENCH_OUT` to also write `$ROCE_BENCH_OUT/xproc.json`.

use std::{
    fs::OpenOptions,
    io::{BufRead, BufReader, IoSlice, Read, Write},
    os::fd::AsRawFd,
    os::unix::fs::FileExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::{
        eventfd::{EfdFlags, EventFd},
        socket::{AddressFamily, MsgFlags, SockFlag, SockType, recv, send, socketpair},
        uio::{RemoteIoVec, process_vm_writev},
    },
    unistd::Pid,
};

const REPS: usize = 5;
const RUN: Duration = Duration::from_millis(300);
/// The region written into, in both processes: larger than the caches.
const REGION: usize = 64 << 20;
/// Packets per `process_vm_writev` call in the batched row (an engine's receive batch).
const BATCH: usize = 64;
/// Written to the eventfd peer to make it leave its loop.
const STOP: u64 = 1 << 32;
/// Set in the child's environment.
const CHILD_ENV: &str = "ROCE_XPROC_CHILD";

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// Runs `step` (which moves `bytes` bytes, or one round trip when `bytes` is 0) for `RUN`;
/// returns GB/s, or round trips per second.
fn rate(bytes: usize, mut step: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    let mut i = 0usize;
    while start.elapsed() < RUN {
        for _ in 0..64 {
            step(i);
            i += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if bytes == 0 {
        i as f64 / secs
    } else {
        (i * bytes) as f64 / secs / 1e9
    }
}

/// The child: owns a region like an application's registered buffer, says where it is, and
/// waits until its stdin closes; then checks that the parent's writes arrived.
fn child() {
    let region = vec![0u8; REGION];
    println!("{} {}", region.as_ptr() as usize, region.len());
    std::io::stdout().flush().expect("stdout");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    // The parent writes 0xa5 everywhere it wrote; the first packet is always written.
    let ok = region[..1024].iter().all(|&b| b == 0xa5);
    std::process::exit(if ok { 0 } else { 3 });
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child();
    }
    let mut kid = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut line = String::new();
    BufReader::new(kid.stdout.take().expect("child stdout"))
        .read_line(&mut line)
        .expect("child's address");
    let mut it = line
        .split_whitespace()
        .map(|x| x.parse::<usize>().expect("number"));
    let (base, len) = (it.next().expect("base"), it.next().expect("len"));
    assert_eq!(len, REGION);
    let pid = Pid::from_raw(i32::try_from(kid.id()).expect("pid"));
    let mem = OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .expect("open /proc/PID/mem (needs ptrace rights over the child: same user)");

    let src = vec![0xa5u8; REGION];
    let mut dst = vec![0u8; REGION];
    let mut rows: Vec<(String, Stat, Option<usize>, &str)> = Vec::new();
    for pkt in [1024usize, 4096] {
        let slots = REGION / pkt;
        let at = |i: usize| (i % slots) * pkt;
        let mut m = Vec::new();
        let mut pv = Vec::new();
        let mut pvb = Vec::new();
        let mut pm = Vec::new();
        for _ in 0..REPS {
            m.push(rate(pkt, |i| {
                let o = at(i);
                dst[o..o + pkt].copy_from_slice(std::hint::black_box(&src[o..o + pkt]));
                std::hint::black_box(&mut dst[o..o + pkt]);
            }));
            pv.push(rate(pkt, |i| {
                let o = at(i);
                let n = process_vm_writev(
                    pid,
                    &[IoSlice::new(&src[o..o + pkt])],
                    &[RemoteIoVec {
                        base: base + o,
                        len: pkt,
                    }],
                )
                .expect("process_vm_writev");
                assert_eq!(n, pkt);
            }));
            pvb.push(rate(pkt * BATCH, |i| {
                let locals: Vec<IoSlice<'_>> = (0..BATCH)
                    .map(|k| {
                        let o = at(i * BATCH + k);
                        IoSlice::new(&src[o..o + pkt])
                    })
                    .collect();
                let remotes: Vec<RemoteIoVec> = (0..BATCH)
                    .map(|k| RemoteIoVec {
                        base: base + at(i * BATCH + k),
                        len: pkt,
                    })
                    .collect();
                let n = process_vm_writev(pid, &locals, &remotes).expect("process_vm_writev");
                assert_eq!(n, pkt * BATCH);
            }));
            pm.push(rate(pkt, |i| {
                let o = at(i);
                mem.write_all_at(&src[o..o + pkt], (base + o) as u64)
                    .expect("pwrite /proc/PID/mem");
            }));
        }
        let base_row = rows.len();
        rows.push((format!("memcpy_{pkt}"), stat(m), None, "GB/s"));
        rows.push((
            format!("process_vm_writev_{pkt}"),
            stat(pv),
            Some(base_row),
            "GB/s",
        ));
        rows.push((
            format!("process_vm_writev_{pkt}_x{BATCH}"),
            stat(pvb),
            Some(base_row),
            "GB/s",
        ));
        rows.push((
            format!("proc_pid_mem_{pkt}"),
            stat(pm),
            Some(base_row),
            "GB/s",
        ));
    }

    // Control: eventfd ping-pong between threads against a seqpacket socket pair.
    let mut ev = Vec::new();
    let mut us = Vec::new();
    for _ in 0..REPS {
        let (ping, pong) = (
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC).expect("eventfd"),
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC).expect("eventfd"),
        );
        std::thread::scope(|s| {
            let (ping, pong) = (&ping, &pong);
            s.spawn(move || {
                // Strict alternation: each read sees 1, except the stop value.
                while ping.read().expect("read") < STOP {
                    pong.write(1).expect("write");
                }
            });
            ev.push(rate(0, |_| {
                ping.write(1).expect("write");
                pong.read().expect("read");
            }));
            ping.write(STOP).expect("write");
        });
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .expect("socketpair");
        let peer = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match recv(b.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        send(b.as_raw_fd(), &buf[..n], MsgFlags::empty()).expect("send");
                    }
                }
            }
        });
        let msg = [7u8; 48];
        let mut buf = [0u8; 64];
        us.push(rate(0, |_| {
            send(a.as_raw_fd(), &msg, MsgFlags::empty()).expect("send");
            recv(a.as_raw_fd(), &mut buf, MsgFlags::empty()).expect("recv");
        }));
        drop(a);
        peer.join().expect("socket peer");
    }
    let base_row = rows.len();
    rows.push(("eventfd_pingpong".into(), stat(ev), None, "round trips/s"));
    rows.push((
        "seqpacket_pingpong".into(),
        stat(us),
        Some(base_row),
        "round trips/s",
    ));

    drop(kid.stdin.take());
    let status = kid.wait().expect("wait child");
    assert!(
        status.success(),
        "the child did not see the bytes written into it: {status}"
    );

    println!(
        "{:<28} {:>14} {:>12} {:>12} {:>12} {:>7}",
        "name", "value", "min", "max", "baseline", "ratio"
    );
    let mut json = Vec::new();
    for (name, s, base, unit) in &rows {
        let baseline = base.map(|b| rows[b].1.median);
        let ratio = baseline.map(|b| s.median / b);
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_owned(), |v| format!("{v:.p$}"));
        println!(
            "{name:<28} {:>14.3} {:>12.3} {:>12.3} {:>12} {:>7}  {unit}",
            s.median,
            s.min,
            s.max,
            opt(baseline, 3),
            opt(ratio, 2)
        );
        json.push(serde_json::json!({
            "name": name,
            "value": s.median,
            "unit": unit,
            "baseline": baseline,
            "ratio": ratio,
            "target": null,
            "min": s.min,
            "max": s.max,
        }));
    }
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        let path = std::path::Path::new(&dir).join("xproc.json");
        std::fs::create_dir_all(&dir).expect("create ROCE_BENCH_OUT");
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    }
}
