//! `roce demo`: two namespaces joined by a veth pair, roce_xdp on one end, traffic of every kind
//! from the other, the counters printed, everything removed again.

use std::{
    net::{SocketAddr, UdpSocket},
    time::Duration,
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

pub(crate) fn run(out: Output, count: u32, mode: AttachMode) -> anyhow::Result<()> {
    loader::require_root()?;
    if EBPF_OBJECT.is_empty() {
        bail!(loader::LoadError::StubObject);
    }
    let prefix = format!("rdemo{}", std::process::id() % 100_000);
    let pair = VethPair::new(&prefix, &VethOptions::default()).context("creating the veth pair")?;
    let (a, b) = (pair.a.clone(), pair.b.clone());
    if !out.json {
        println!(
            "demo: namespaces {} and {}, veth {} ({}) <-> {} ({})",
            a.netns, b.netns, a.ifname, a.ipv4, b.ifname, b.ipv4
        );
    }

    let opts = LoadOptions {
        mode,
        netns: Some(b.netns.clone()),
        ..LoadOptions::default()
    };
    let ifname = b.ifname.clone();
    let report = netns::in_netns(&b.netns, move || loader::load(&ifname, &opts))??;
    let _unload = Unloader(b.ifname.clone());
    if !out.json {
        println!(
            "demo: roce_xdp attached to {} ({} mode, prog id {})",
            report.ifname,
            report.mode.as_str(),
            report.prog_id
        );
    }
    let pins = Pins::new(&b.ifname);
    pins.add_qp(OUR_QPN, std::process::id())?;
    let before = pins.xdp_stats()?;

    // A kernel UDP socket in B, to show that traffic that is not RoCE still gets there.
    let b_ip = b.ipv4;
    let receiver = std::thread::spawn(move || -> anyhow::Result<u32> {
        netns::enter(&b.netns)?;
        let sock = UdpSocket::bind(SocketAddr::from((b_ip, PLAIN_PORT)))?;
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
        ifname: report.ifname.clone(),
        sections: vec![Section::from_names(
            "xdp",
            &XdpStats::NAMES,
            &delta.values(),
        )],
    };
    let mut text = String::from("demo: sent from the peer namespace, each kind x");
    text.push_str(&format!("{count}:\n"));
    for s in &sent {
        text.push_str(&format!("  - {s}\n"));
    }
    text.push_str(&format!(
        "demo: the kernel UDP socket on port {PLAIN_PORT} received {plain_received} of {count}\n"
    ));
    text.push_str("demo: roce_xdp counters (non-zero, this run):\n");
    text.push_str(&snap.to_text(true));
    text.push_str(&format!(
        "demo: while loaded, `bpftool map dump pinned {}/ROCE_XDP_STATS` shows the same counters\n",
        report.pin_dir
    ));
    let v = json!({
        "veth": { "a": a.ifname, "b": report.ifname },
        "sent_each": count,
        "kinds": sent,
        "plain_udp_received": plain_received,
        "xdp": snap.to_json()["xdp"],
    });
    out.emit(&v, &text);
    if plain_received != count {
        bail!("the kernel socket received {plain_received} of {count} plain UDP datagrams");
    }
    Ok(())
}
