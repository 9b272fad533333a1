//! `roce demo`: two namespaces joined by a veth pair, an endpoint in each, real RC traffic between
//! them (ping-pong, WRITE, READ and SEND bandwidth, atomics), then the XDP classifier at work on
//! traffic of every kind, the counters of both ends, and everything removed again.

use std::{
    net::{SocketAddr, UdpSocket},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use roce::{
    loader::{self, AttachMode, EBPF_OBJECT, LoadOptions, Pins},
    netns::{self, VethOptions, VethPair},
    stats::{Section, Snapshot},
};
use roce_common::{
    ROCE_V2_UDP_PORT,
    counters::XdpStats,
    opcode::{Hdrs, Opcode},
};
use serde_json::json;

use super::Output;

/// The QP the demo registers as ours.
const OUR_QPN: u32 = 0x11;
/// A QP that is not ours.
const FOREIGN_QPN: u32 = 0x22;
/// A plain UDP port, to show that non-RoCE traffic still reaches kernel sockets.
const PLAIN_PORT: u16 = 9000;

/// Unloads roce_xdp when dropped, so the demo leaves nothing behind even on error.
struct Unloader(String);

impl Drop for Unloader {
    fn drop(&mut self) {
        if let Err(e) = loader::unload(&self.0) {
            eprintln!("roce demo: cleanup: {e}");
        }
    }
}

/// The UDP payload of a RoCE v2 packet: BTH, zeroed extended headers, `payload` bytes, pad and a
/// placeholder ICRC (roce_xdp does not check the ICRC; the endpoint does).
fn roce_payload(opcode: Opcode, tver: u8, dest_qp: u32, psn: u32, payload: usize) -> Vec<u8> {
    let ext = opcode.ext_len().unwrap_or(0);
    let pad = (4 - payload % 4) % 4;
    let mut p = Vec::with_capacity(12 + ext + payload + pad + 4);
    p.push(opcode.0);
    p.push(((pad as u8) << 4) | (tver & 0x0f));
    p.extend_from_slice(&0xffffu16.to_be_bytes());
    let becn = if opcode.info().is_some_and(|i| i.hdrs.contains(Hdrs::CNP)) {
        0x40
    } else {
        0
    };
    p.push(becn);
    p.extend_from_slice(&dest_qp.to_be_bytes()[1..]);
    p.push(0x80);
    p.extend_from_slice(&psn.to_be_bytes()[1..]);
    p.resize(p.len() + ext + payload + pad + 4, 0);
    p
}

/// One step of the demo: the same `roce` subcommand as server on B and client on A.
struct Step {
    name: &'static str,
    args: &'static str,
}

const STEPS: [Step; 5] = [
    Step {
        name: "ping-pong 4 KiB x1000, checked",
        args: "pingpong -s 4096 -n 1000 -m 2048 -c",
    },
    Step {
        name: "WRITE 64 KiB x1000 on 2 QPs",
        args: "perf write -s 65536 -n 1000 -q 2 -m 2048",
    },
    Step {
        name: "READ 64 KiB x1000 on 2 QPs",
        args: "perf read -s 65536 -n 1000 -q 2 -m 2048",
    },
    Step {
        name: "SEND 64 KiB x1000 on 2 QPs",
        args: "perf send -s 65536 -n 1000 -q 2 -m 2048",
    },
    Step {
        name: "fetch-and-add x10000 on 2 QPs",
        args: "perf atomic -n 10000 -q 2",
    },
];

/// The TCP port of every step's out-of-band exchange (perftest's and ibv_rc_pingpong's
/// default, which both `roce perf` and `roce pingpong` use).
const STEP_PORT: u16 = roce::cm::perftest::DEFAULT_PORT;

/// How long a step's server may take to listen: opening the device includes binding AF_XDP
/// sockets, which waits for the previous step's sockets to be released.
const LISTEN_WAIT: Duration = Duration::from_secs(30);

/// Waits until process `pid` listens on TCP `port`, read from its own network namespace's
/// `/proc/PID/net/tcp{,6}` (the LISTEN state is 0A). Call it between starting a step's server
/// and its client: the client's connect gives up after a few seconds.
///
/// # Errors
/// The process exited first, or `limit` passed.
fn wait_listening(
    server: &mut std::process::Child,
    port: u16,
    limit: Duration,
) -> anyhow::Result<()> {
    let needle = format!(":{port:04X} ");
    let t0 = Instant::now();
    loop {
        let listening = ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{}/net/{f}", server.id())).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() > 3 && format!("{} ", w[1]).ends_with(&needle) && w[3] == "0A"
                })
            })
        });
        if listening {
            return Ok(());
        }
        if let Some(st) = server.try_wait()? {
            bail!("the server exited ({st}) before it listened on port {port}");
        }
        if t0.elapsed() >= limit {
            bail!("the server did not listen on port {port} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_step(exe: &Path, pair: &VethPair, step: &Step) -> anyhow::Result<serde_json::Value> {
    let args: Vec<&str> = step.args.split(' ').collect();
    let mut server = Command::new(exe)
        .args(["-j", "--netns", &pair.b.netns])
        .args(&args)
        .args(["-d", &pair.b.ifname])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the server")?;
    if let Err(e) = wait_listening(&mut server, STEP_PORT, LISTEN_WAIT) {
        let _ = server.kill();
        let o = server
            .wait_with_output()
            .context("waiting for the server")?;
        bail!(
            "{}: {e:#}: {}{}",
            step.name,
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let client = Command::new(exe)
        .args(["-j", "--netns", &pair.a.netns])
        .args(&args)
        .args(["-d", &pair.a.ifname, &pair.b.ipv4.to_string()])
        .output()
        .context("running the client")?;
    let server = server
        .wait_with_output()
        .context("waiting for the server")?;
    for (who, o) in [("client", &client), ("server", &server)] {
        if !o.status.success() {
            bail!(
                "{}: the {who} failed: {}{}",
                step.name,
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
    let c: serde_json::Value = serde_json::from_slice(&client.stdout).context("client JSON")?;
    let s: serde_json::Value = serde_json::from_slice(&server.stdout).context("server JSON")?;
    Ok(json!({ "step": step.name, "client": c, "server": s }))
}

fn step_line(r: &serde_json::Value) -> String {
    let c = &r["client"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    if c.get("usec_per_iter").is_some() {
        format!(
            "  {:<32} {:>9.1} Mbit/s  {:>8.1} usec/iter  data checked",
            r["step"].as_str().unwrap_or(""),
            f(&c["mbit_per_sec"]),
            f(&c["usec_per_iter"])
        )
    } else {
        format!(
            "  {:<32} {:>9.1} MB/s  {:>8.4} Mpps  verified: client {}, server {}",
            r["step"].as_str().unwrap_or(""),
            f(&c["bw_mb_per_sec"]),
            f(&c["msg_rate_mpps"]),
            c["verified"],
            r["server"]["verified"]
        )
    }
}

pub(crate) fn run(out: Output, count: u32, mode: AttachMode) -> anyhow::Result<()> {
    loader::require_root()?;
    if EBPF_OBJECT.is_empty() {
        bail!(loader::LoadError::StubObject);
    }
    let started = Instant::now();
    let exe = std::env::current_exe().context("finding the roce binary")?;
    let prefix = format!("rdemo{}", std::process::id() % 100_000);
    let pair = VethPair::new(
        &prefix,
        &VethOptions {
            mtu: 3000,
            ..VethOptions::default()
        },
    )
    .context("creating the veth pair")?;
    for ns in [pair.a.netns.clone(), pair.b.netns.clone()] {
        super::on_signal_exit(move || {
            let _ = netns::run("ip", &["netns", "del", &ns]);
        });
    }
    for ifname in [pair.a.ifname.clone(), pair.b.ifname.clone()] {
        super::on_signal_exit(move || {
            let _ = loader::unload(&ifname);
        });
    }
    let say = |s: &str| {
        if !out.json {
            println!("{s}");
        }
    };
    say(&format!(
        "demo: namespaces {} and {}, veth {} ({}) <-> {} ({}), MTU 3000",
        pair.a.netns, pair.b.netns, pair.a.ifname, pair.a.ipv4, pair.b.ifname, pair.b.ipv4
    ));
    let mut unloaders = Vec::new();
    for end in [&pair.a, &pair.b] {
        let opts = LoadOptions {
            mode,
            netns: Some(end.netns.clone()),
            ..LoadOptions::default()
        };
        let ifname = end.ifname.clone();
        let r = netns::in_netns(&end.netns, move || loader::load(&ifname, &opts))??;
        unloaders.push(Unloader(end.ifname.clone()));
        say(&format!(
            "demo: roce_xdp attached to {} ({} mode, prog id {})",
            r.ifname,
            r.mode.as_str(),
            r.prog_id
        ));
    }

    say("demo: RDMA between the endpoints (path MTU 2048, the largest one AF_XDP frame carries):");
    let mut rdma = Vec::new();
    for step in &STEPS {
        if super::interrupted() {
            bail!("interrupted");
        }
        let r = run_step(&exe, &pair, step)?;
        say(&step_line(&r));
        rdma.push(r);
    }

    let classifier = classifier_mix(out, &pair, count)?;

    let mut counters = Vec::new();
    for end in [&pair.a, &pair.b] {
        let snap = super::xdp::snapshot(&Pins::new(&end.ifname), &end.ifname, false, false)?;
        say(&snap.to_text(true));
        counters.push(snap.to_json());
    }
    say(&format!(
        "demo: while an endpoint runs, `bpftool map dump pinned /sys/fs/bpf/roce/{}/ROCE_QP_STATS` shows its QPs",
        pair.a.ifname
    ));
    let secs = started.elapsed().as_secs_f64();
    say(&format!(
        "demo: done in {secs:.1} s; removing the programs, pins and namespaces"
    ));
    drop(unloaders);
    drop(pair);
    if out.json {
        out.emit(&json!({ "rdma": rdma, "classifier": classifier, "counters": counters, "seconds": secs }), "");
    }
    Ok(())
}

/// The XDP classifier at work: traffic of every kind from A to B, and what roce_xdp on B made
/// of it.
fn classifier_mix(out: Output, pair: &VethPair, count: u32) -> anyhow::Result<serde_json::Value> {
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let pins = Pins::new(&b.ifname);
    pins.add_qp(OUR_QPN, std::process::id())?;
    let before = pins.xdp_stats()?;

    // A kernel UDP socket in B, to show that traffic that is not RoCE still gets there.
    let b_ip = b.ipv4;
    let receiver = std::thread::spawn(move || -> anyhow::Result<u32> {
        netns::enter(&b.netns)?;
        let sock = UdpSocket::bind(SocketAddr::from((b_ip, PLAIN_PORT)))?;
        // Room for the whole burst even when this thread is slow to run (a loaded machine).
        let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
        sock.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while got < count {
            match sock.recv(&mut buf) {
                Ok(_) => got += 1,
                Err(_) => break,
            }
        }
        Ok(got)
    });
    std::thread::sleep(Duration::from_millis(100));

    let kinds: Vec<(&str, Vec<u8>, u8, u16)> = vec![
        (
            "RC SEND_ONLY to our QP",
            roce_payload(Opcode::RC_SEND_ONLY, 0, OUR_QPN, 1, 64),
            0,
            ROCE_V2_UDP_PORT,
        ),
        (
            "RC RDMA_WRITE_ONLY to our QP, CE-marked",
            roce_payload(Opcode::RC_RDMA_WRITE_ONLY, 0, OUR_QPN, 2, 256),
            0x3,
            ROCE_V2_UDP_PORT,
        ),
        (
            "CNP to our QP",
            roce_payload(Opcode::CNP, 0, OUR_QPN, 0, 0),
            0x2,
            ROCE_V2_UDP_PORT,
        ),
        (
            "RC SEND_ONLY to a foreign QP",
            roce_payload(Opcode::RC_SEND_ONLY, 0, FOREIGN_QPN, 1, 64),
            0,
            ROCE_V2_UDP_PORT,
        ),
        (
            "malformed: BTH TVer 1",
            roce_payload(Opcode::RC_SEND_ONLY, 1, OUR_QPN, 1, 64),
            0,
            ROCE_V2_UDP_PORT,
        ),
        (
            "malformed: unknown opcode 0x15",
            roce_payload(Opcode(0x15), 0, OUR_QPN, 1, 64),
            0,
            ROCE_V2_UDP_PORT,
        ),
        ("plain UDP to port 9000", vec![0x42; 100], 0, PLAIN_PORT),
    ];
    let a_ip = a.ipv4;
    let sent = kinds
        .iter()
        .map(|(name, _, _, _)| (*name).to_owned())
        .collect::<Vec<_>>();
    let to_send: Vec<(Vec<u8>, u8, u16)> = kinds
        .into_iter()
        .map(|(_, p, tos, port)| (p, tos, port))
        .collect();
    netns::in_netns(&a.netns, move || -> anyhow::Result<()> {
        for (payload, tos, port) in &to_send {
            let sock = UdpSocket::bind(SocketAddr::from((a_ip, 0)))?;
            nix::sys::socket::setsockopt(
                &sock,
                nix::sys::socket::sockopt::Ipv4Tos,
                &i32::from(*tos),
            )?;
            for _ in 0..count {
                sock.send_to(payload, SocketAddr::from((b_ip, *port)))?;
                // Paced so veth's 256-frame XDP ring never overflows on a busy machine.
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(())
    })??;
    let plain_received = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
    std::thread::sleep(Duration::from_millis(100));

    let delta = pins.xdp_stats()?.saturating_sub(&before);
    let snap = Snapshot {
        ifname: b.ifname.clone(),
        sections: vec![Section::from_names(
            "xdp",
            &XdpStats::NAMES,
            &delta.values(),
        )],
    };
    let mut text = format!(
        "demo: the XDP classifier, {count} of each kind from {} to {}:\n",
        a.ifname, b.ifname
    );
    for s in &sent {
        text.push_str(&format!("  - {s}\n"));
    }
    text.push_str(&format!(
        "demo: the kernel UDP socket on port {PLAIN_PORT} received {plain_received} of {count}\n"
    ));
    text.push_str("demo: roce_xdp's counters on the receiving end for this traffic (non-zero):\n");
    text.push_str(&snap.to_text(true));
    if !out.json {
        print!("{text}");
    }
    if plain_received != count {
        bail!("the kernel socket received {plain_received} of {count} plain UDP datagrams");
    }
    Ok(
        json!({ "sent_each": count, "kinds": sent, "plain_udp_received": plain_received, "xdp": snap.to_json()["xdp"] }),
    )
}
