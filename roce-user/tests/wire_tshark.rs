//! Cross-check against Wireshark's InfiniBand dissector: a pcap that our emitter wrote,
//! covering every opcode we emit over IPv4 and IPv6 (with VLAN and QinQ), must dissect as
//! InfiniBand over UDP 4791 with the opcode, destination QP and PSN we wrote, and without any
//! malformed-packet or expert-info entry. tshark is required: the test fails if it is missing.

mod wire_support;

use std::process::Command;

use roce::wire::{Opcode, emit_frame};
use wire_support::{is_roce_udp, our_table, read_pcap, sample_pcaps, which, write_pcap};

fn tshark() -> std::path::PathBuf {
    which("tshark").unwrap_or_else(|| {
        panic!("tshark is required for this test and is not on PATH; install it (Debian: apt-get install tshark)")
    })
}

#[test]
fn tshark_dissects_our_frames_as_infiniband() {
    let tshark = tshark();
    let table = our_table();
    let frames: Vec<Vec<u8>> = table
        .iter()
        .map(|(name, path, roce, payload)| {
            let mut buf = vec![0u8; 2048];
            let n =
                emit_frame(path, roce, payload, &mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
            buf.truncate(n);
            buf
        })
        .collect();
    let covered: std::collections::BTreeSet<u8> = table.iter().map(|t| t.2.bth.opcode.0).collect();
    for op in Opcode::ALL {
        assert!(
            covered.contains(&op.0),
            "{op:?} is not in the emitted table"
        );
    }
    let dir = std::env::temp_dir().join(format!("roce-wire-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("emitted.pcap");
    write_pcap(&pcap, &frames);
    // Our payloads are synthetic bytes: keep upper-layer heuristics (RPC-over-RDMA, iSER,
    // SMB Direct, ...) from guessing at them; the InfiniBand transport headers are what we check.
    let heur = Command::new(&tshark)
        .args(["-G", "heuristic-decodes"])
        .output()
        .expect("tshark -G");
    let mut disable = Vec::new();
    for l in String::from_utf8_lossy(&heur.stdout).lines() {
        let mut it = l.split('\t');
        match (it.next(), it.next()) {
            (Some("infiniband.payload"), Some(proto)) if proto != "ethertype" => {
                disable.push("--disable-protocol".to_string());
                disable.push(proto.to_string());
            }
            _ => {}
        }
    }
    let out = Command::new(&tshark)
        .args(&disable)
        .arg("-n")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-E",
            "separator=|",
        ])
        .args([
            "-e",
            "frame.number",
            "-e",
            "frame.protocols",
            "-e",
            "infiniband.bth.opcode",
        ])
        .args([
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "_ws.malformed",
        ])
        .args(["-e", "_ws.expert.severity", "-e", "_ws.expert.message"])
        .args(["-e", "infiniband.invariant.crc"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tshark.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        table.len(),
        "tshark printed {} lines for {} frames:\n{stdout}",
        lines.len(),
        table.len()
    );
    for (line, (name, _, roce, _)) in lines.iter().zip(&table) {
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols.len(), 9, "{name}: {line}");
        assert!(
            cols[1].ends_with(":udp:infiniband") || cols[1].contains(":udp:infiniband:"),
            "{name}: protocols {}",
            cols[1]
        );
        assert_eq!(
            cols[2].parse::<u8>().ok(),
            Some(roce.bth.opcode.0),
            "{name}: opcode ({line})"
        );
        let qpn = u32::from_str_radix(cols[3].trim_start_matches("0x"), 16).ok();
        assert_eq!(
            qpn,
            Some(roce.bth.dest_qp.value()),
            "{name}: destination QP ({line})"
        );
        assert_eq!(
            cols[4].parse::<u32>().ok(),
            Some(roce.bth.psn.value()),
            "{name}: PSN ({line})"
        );
        assert!(
            cols[5].is_empty(),
            "{name}: tshark marks the frame malformed ({line})"
        );
        // tshark finds our ICRC where we put it (it reads the four wire bytes big-endian).
        let frame = &frames[lines.iter().position(|l| l == line).unwrap()];
        let want = u32::from_be_bytes(frame[frame.len() - 4..].try_into().unwrap());
        if cols[8].is_empty() {
            // Wireshark 4.0 does not know the IBA 1.5 opcodes and the RoCE v2 CNP, and stops
            // after their BTH.
            let op = roce.bth.opcode;
            assert!(
                op == Opcode::RC_FLUSH || op == Opcode::RC_ATOMIC_WRITE || op == Opcode::CNP,
                "{name}: no invariant CRC ({line})"
            );
        } else {
            let got = u32::from_str_radix(cols[8].trim_start_matches("0x"), 16).ok();
            assert_eq!(got, Some(want), "{name}: invariant CRC ({line})");
        }
        // Any expert entry at all (error, warning, note, chat) fails: our frames must be clean.
        assert!(
            cols[6].is_empty() && cols[7].is_empty(),
            "{name}: tshark expert info: {line}"
        );
    }
}

/// On the real rxe captures, tshark and our parser agree on opcode, destination QP and PSN of
/// every RoCE packet (ICMP errors quoting a RoCE packet are not RoCE packets).
#[test]
fn tshark_and_we_agree_on_rxe_samples() {
    let tshark = tshark();
    for path in sample_pcaps() {
        let out = Command::new(&tshark)
            .arg("-n")
            .arg("-r")
            .arg(&path)
            .args([
                "-Y",
                "infiniband && !icmp",
                "-T",
                "fields",
                "-E",
                "separator=|",
            ])
            .args([
                "-e",
                "frame.number",
                "-e",
                "infiniband.bth.opcode",
                "-e",
                "infiniband.bth.destqp",
            ])
            .args(["-e", "infiniband.bth.psn"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", tshark.display()));
        assert!(out.status.success(), "tshark failed on {}", path.display());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let (_, records) = read_pcap(&path);
        let ours: Vec<_> = records
            .iter()
            .filter(|r| is_roce_udp(&r.data))
            .map(|r| {
                let f = roce::wire::parse_frame(&r.data).unwrap();
                format!(
                    "{}|{}|{:#08x}|{}",
                    r.number,
                    f.roce.bth.opcode.0,
                    f.roce.bth.dest_qp.value(),
                    f.roce.bth.psn.value()
                )
            })
            .collect();
        let theirs: Vec<&str> = stdout.lines().collect();
        assert!(!ours.is_empty() || path.to_string_lossy().contains("vm-client"));
        assert_eq!(
            theirs,
            ours,
            "{}: tshark (left) and we (right) disagree",
            path.display()
        );
    }
}
