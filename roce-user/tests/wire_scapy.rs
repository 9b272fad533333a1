//! Cross-check against scapy (`scapy.contrib.roce`), both directions:
//!
//! 1. scapy builds a table of frames (every RC request and response kind, ACK/NAK syndromes,
//!    atomics, UD, UC, CNP; IPv4 and IPv6; with and without VLAN); our parser must read the
//!    same fields scapy dissects and accept scapy's ICRC.
//! 2. we emit a frame for every opcode of the table (IPv4 and IPv6, VLAN and QinQ); scapy must
//!    dissect the fields we meant and its own ICRC computation must match ours.
//!
//! python3 and scapy are required: if either is missing the test fails (it never skips).

mod wire_support;

use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
};

use roce::wire::{IpPath, IpRepr, PathRepr, RoceRepr, emit_frame, parse_frame};
use serde_json::{Map, Value, json};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("wire_scapy.py")
}

/// Runs the scapy helper; fails loudly if python3 or scapy is missing.
fn scapy(mode: &str, input: Option<&str>) -> Value {
    let mut child = Command::new("python3")
        .arg(script())
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("python3 is required for the scapy cross-check and could not be run ({e}); install python3 and `pip install scapy`")
        });
    {
        let mut stdin = child.stdin.take().unwrap();
        if let Some(s) = input {
            stdin.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "wire_scapy.py {mode} failed ({}): {stderr}\n(scapy is required: `pip install scapy`)",
        out.status
    );
    serde_json::from_slice(&out.stdout).expect("wire_scapy.py printed invalid JSON")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The flat field dict (the schema of wire_scapy.py `dissect`) for a frame described by a
/// path, a RoCE repr and a payload. `lens` overrides the IP and UDP length fields, `pad` the
/// pad bytes (both as parsed, in direction 1); otherwise they are what the frame must have.
fn fields(
    path: &PathRepr,
    roce: &RoceRepr,
    payload: &[u8],
    lens: Option<(u64, u64)>,
    pad: Option<&[u8]>,
) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    put("eth.dst", json!(path.dst_mac.to_string()));
    put("eth.src", json!(path.src_mac.to_string()));
    let vlans: Vec<Value> = path
        .vlan
        .iter()
        .flatten()
        .map(|t| json!([t.pcp(), u8::from(t.dei()), t.vid()]))
        .collect();
    put("vlan", json!(vlans));
    let padn = payload.len().wrapping_neg() & 3;
    let udp_len = 8 + roce.buffer_len(payload.len()) as u64;
    match path.ip {
        IpPath::V4 { src, dst } => {
            put("ip.version", json!(4));
            put("ip.src", json!(src.to_string()));
            put("ip.dst", json!(dst.to_string()));
            put("ip.id", json!(path.ipv4_ident));
            put("ip.df", json!(1));
            put("ip.len", json!(lens.map_or(20 + udp_len, |l| l.0)));
        }
        IpPath::V6 {
            src,
            dst,
            flow_label,
        } => {
            put("ip.version", json!(6));
            put("ip.src", json!(src.to_string()));
            put("ip.dst", json!(dst.to_string()));
            put("ip.fl", json!(flow_label));
            put("ip.len", json!(lens.map_or(udp_len, |l| l.0)));
        }
    }
    put("ip.tos", json!(path.tos()));
    put("ip.ttl", json!(path.ttl));
    put("udp.sport", json!(path.udp_src_port));
    put("udp.dport", json!(path.udp_dst_port));
    put("udp.len", json!(lens.map_or(udp_len, |l| l.1)));
    let b = &roce.bth;
    put("bth.opcode", json!(b.opcode.0));
    put("bth.se", json!(u8::from(b.solicited)));
    put("bth.migreq", json!(u8::from(b.mig_req)));
    put("bth.pad", json!(pad.map_or(padn, <[u8]>::len)));
    put("bth.pkey", json!(b.pkey.value()));
    put("bth.fecn", json!(u8::from(b.fecn)));
    put("bth.becn", json!(u8::from(b.becn)));
    put("bth.dqpn", json!(b.dest_qp.value()));
    put("bth.ackreq", json!(u8::from(b.ack_req)));
    put("bth.psn", json!(b.psn.value()));
    if let Some(h) = roce.deth {
        put("deth.qkey", json!(h.qkey.value()));
        put("deth.sqpn", json!(h.src_qp.value()));
    }
    if let Some(h) = roce.feth {
        put("feth.raw", json!(h.raw));
    }
    if let Some(h) = roce.reth {
        put("reth.va", json!(h.va));
        put("reth.rkey", json!(h.rkey.value()));
        put("reth.dlen", json!(h.dma_len));
    }
    if let Some(h) = roce.atomic_eth {
        put("atomiceth.va", json!(h.va));
        put("atomiceth.rkey", json!(h.rkey.value()));
        put("atomiceth.swap", json!(h.swap_add));
        put("atomiceth.cmp", json!(h.compare));
    }
    if let Some(h) = roce.aeth {
        put("aeth.syndrome", json!(h.syndrome.to_byte()));
        put("aeth.msn", json!(h.msn.value()));
    }
    if let Some(h) = roce.atomic_ack_eth {
        put("atomicacketh.orig", json!(h.orig));
    }
    if let Some(h) = roce.immdt {
        put("immdt.imm", json!(h.imm));
    }
    if let Some(h) = roce.ieth {
        put("ieth.rkey", json!(h.rkey.value()));
    }
    if roce.cnp.is_some() {
        put("cnp", json!(1));
    }
    put("payload", json!(hex(payload)));
    put("pad", json!(pad.map_or_else(|| hex(&vec![0; padn]), hex)));
    put(
        "has_payload",
        json!(u8::from(b.opcode.info().unwrap().payload)),
    );
    m
}

/// Our parser's view of a frame, in the same schema, with the ICRC as on the wire.
fn our_fields(buf: &[u8]) -> (Map<String, Value>, bool) {
    let f = parse_frame(buf).unwrap_or_else(|e| panic!("our parser rejected {}: {e}", hex(buf)));
    let (ip, lens) = match f.ip {
        IpRepr::V4(r) => (
            IpPath::V4 {
                src: r.src_addr,
                dst: r.dst_addr,
            },
            (u64::from(r.payload_len) + 20, u64::from(f.udp.length)),
        ),
        IpRepr::V6(r) => (
            IpPath::V6 {
                src: r.src_addr,
                dst: r.dst_addr,
                flow_label: r.flow_label,
            },
            (u64::from(r.payload_len), u64::from(f.udp.length)),
        ),
    };
    let mut path = PathRepr::new(f.eth.src_addr, f.eth.dst_addr, ip);
    path.vlan = f.eth.vlan;
    path.dscp = f.ip.dscp();
    path.ecn = f.ecn();
    path.ttl = f.ip.ttl();
    if let IpRepr::V4(r) = f.ip {
        path.ipv4_ident = r.ident;
    }
    path.udp_src_port = f.udp.src_port;
    path.udp_dst_port = f.udp.dst_port;
    let start = f.payload.as_ptr() as usize - buf.as_ptr() as usize;
    let end = start + f.payload.len();
    let pad = &buf[end..end + usize::from(f.roce.bth.pad_count)];
    let mut m = fields(&path, &f.roce, f.payload, Some(lens), Some(pad));
    m.insert("icrc_wire".into(), json!(hex(&f.icrc.to_le_bytes())));
    (m, f.icrc_ok)
}

#[test]
fn we_parse_what_scapy_builds() {
    let table = scapy("gen", None);
    let rows = table.as_array().expect("a JSON list");
    assert!(rows.len() >= 71, "scapy table too small: {}", rows.len());
    // scapy's cnp() reproduces the Mellanox golden vector of the reference byte for byte.
    let mellanox = rows
        .iter()
        .find(|r| r["name"] == "mellanox_cnp")
        .expect("mellanox_cnp row");
    let golden = "4589003c98c6400020116927161616081616160\
                  7dbae12b7002800008100ffff400000d20000000000000000000000000000000000000000dafc1bef";
    assert_eq!(
        &mellanox["hex"].as_str().unwrap()[28..],
        golden,
        "scapy's CNP is not the golden vector"
    );
    for row in rows {
        let name = row["name"].as_str().unwrap();
        let frame = unhex(row["hex"].as_str().unwrap());
        let theirs = row["fields"].as_object().unwrap();
        let (ours, icrc_ok) = our_fields(&frame);
        assert!(
            icrc_ok,
            "{name}: we reject scapy's ICRC {}",
            theirs["icrc_wire"]
        );
        assert_eq!(
            &ours, theirs,
            "{name}: fields differ (left: ours, right: scapy)"
        );
    }
}

#[test]
fn scapy_dissects_what_we_emit() {
    let table = wire_support::our_table();
    let mut items = Vec::new();
    for (name, path, roce, payload) in &table {
        let mut buf = vec![0u8; 2048];
        let n = emit_frame(path, roce, payload, &mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
        items.push(json!({"name": name, "hex": hex(&buf[..n])}));
    }
    let res = scapy("dissect", Some(&serde_json::to_string(&items).unwrap()));
    let res = res.as_array().unwrap();
    assert_eq!(res.len(), table.len());
    for ((name, path, roce, payload), r) in table.iter().zip(res) {
        assert_eq!(r["name"].as_str().unwrap(), name);
        assert_eq!(
            r["icrc_valid"],
            json!(true),
            "{name}: scapy computes a different ICRC"
        );
        let mut theirs = r["fields"].as_object().unwrap().clone();
        theirs.remove("icrc_wire").expect("icrc_wire");
        let want = fields(path, roce, payload, None, None);
        assert_eq!(
            theirs, want,
            "{name}: scapy dissects other fields (left: scapy, right: meant)"
        );
    }
}
