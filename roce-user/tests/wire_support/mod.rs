//! Helpers shared by the `wire_*` integration tests: a minimal pcap reader and writer, and
//! locating the shared rxe samples.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use roce::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpRepr, CreditCode,
    DethRepr, Ecn, EthernetAddress, FethRepr, IethRepr, ImmDtRepr, IpPath, Msn, NakCode, Opcode,
    PKey, PathRepr, Psn, QKey, Qpn, RKey, RethRepr, RnrTimer, RoceRepr, VlanTag,
};

/// Link type of Ethernet frames in a pcap file.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// One captured frame.
pub struct Record {
    /// Frame number, 1-based like Wireshark's.
    pub number: usize,
    /// The captured bytes.
    pub data: Vec<u8>,
    /// The length on the wire.
    pub orig_len: usize,
}

/// Reads a classic pcap file (either byte order, micro- or nanosecond timestamps).
/// Panics with a clear message on a malformed file: these are test fixtures.
pub fn read_pcap(path: &Path) -> (u32, Vec<Record>) {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        bytes.len() >= 24,
        "{}: shorter than a pcap header",
        path.display()
    );
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        0x0a0d_0d0a => return read_pcapng(path, &bytes),
        m => panic!("{}: neither pcap nor pcapng (magic {m:#x})", path.display()),
    };
    let u32_at = |off: usize| {
        let a: [u8; 4] = bytes[off..off + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = u32_at(20);
    let mut off = 24;
    let mut out = Vec::new();
    while off < bytes.len() {
        assert!(
            off + 16 <= bytes.len(),
            "{}: truncated record header",
            path.display()
        );
        let incl = u32_at(off + 8) as usize;
        let orig = u32_at(off + 12) as usize;
        off += 16;
        assert!(
            off + incl <= bytes.len(),
            "{}: truncated record",
            path.display()
        );
        out.push(Record {
            number: out.len() + 1,
            data: bytes[off..off + incl].to_vec(),
            orig_len: orig,
        });
        off += incl;
    }
    (linktype, out)
}

/// Reads a pcapng file: section header, interface description and enhanced/simple packet
/// blocks (pcapng draft, IETF opsawg). All interfaces must share one link type.
fn read_pcapng(path: &Path, bytes: &[u8]) -> (u32, Vec<Record>) {
    let mut le = true;
    let mut linktype = None;
    let mut out = Vec::new();
    let mut off = 0;
    while off + 12 <= bytes.len() {
        let raw = |o: usize| -> [u8; 4] { bytes[o..o + 4].try_into().unwrap() };
        let btype = u32::from_le_bytes(raw(off));
        if btype == 0x0a0d_0d0a {
            le = match u32::from_le_bytes(raw(off + 8)) {
                0x1a2b_3c4d => true,
                0x4d3c_2b1a => false,
                m => panic!("{}: bad pcapng byte-order magic {m:#x}", path.display()),
            };
        }
        let u32_at = |o: usize| {
            if le {
                u32::from_le_bytes(raw(o))
            } else {
                u32::from_be_bytes(raw(o))
            }
        };
        let btype = u32_at(off);
        let blen = u32_at(off + 4) as usize;
        assert!(
            blen >= 12 && off + blen <= bytes.len(),
            "{}: bad pcapng block at {off}",
            path.display()
        );
        let body = off + 8;
        match btype {
            1 => {
                let lt = if le {
                    u16::from_le_bytes([bytes[body], bytes[body + 1]])
                } else {
                    u16::from_be_bytes([bytes[body], bytes[body + 1]])
                } as u32;
                assert!(
                    linktype.is_none_or(|l| l == lt),
                    "{}: mixed link types",
                    path.display()
                );
                linktype = Some(lt);
            }
            6 => {
                let caplen = u32_at(body + 12) as usize;
                let orig = u32_at(body + 16) as usize;
                let data = &bytes[body + 20..body + 20 + caplen];
                out.push(Record {
                    number: out.len() + 1,
                    data: data.to_vec(),
                    orig_len: orig,
                });
            }
            3 => {
                let orig = u32_at(body) as usize;
                let caplen = orig.min(blen - 16);
                let data = &bytes[body + 4..body + 4 + caplen];
                out.push(Record {
                    number: out.len() + 1,
                    data: data.to_vec(),
                    orig_len: orig,
                });
            }
            _ => {}
        }
        off += blen;
    }
    (
        linktype.unwrap_or_else(|| panic!("{}: no interface block", path.display())),
        out,
    )
}

/// Writes Ethernet frames as a little-endian microsecond pcap file, one millisecond apart.
pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&0i32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        let usec = i as u32 * 1000;
        b.extend_from_slice(&(usec / 1_000_000).to_le_bytes());
        b.extend_from_slice(&(usec % 1_000_000).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// The rxe samples directory: `shared/rxe-peer/samples` in the nearest ancestor of the repo
/// that has it (CI clones the repo next to `shared/`, so that is `<repo>/../shared`; a git
/// worktree one level deeper finds it too), or `$ROCE_RXE_SAMPLES` if set. Panics with a
/// clear message if it is missing.
pub fn samples_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ROCE_RXE_SAMPLES") {
        return PathBuf::from(d);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = manifest.parent().expect("roce-user has a parent directory");
    let rel = Path::new("shared").join("rxe-peer").join("samples");
    repo.ancestors()
        .skip(1)
        .map(|a| a.join(&rel))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "the Soft-RoCE samples are missing: expected {} (shared/ next to the repo) or \
                 ROCE_RXE_SAMPLES pointing at them",
                repo.join("..").join(&rel).display()
            )
        })
}

/// Every `*.pcap` in the samples directory, sorted.
pub fn sample_pcaps() -> Vec<PathBuf> {
    let dir = samples_dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.pcap in {}", dir.display());
    v
}

/// Whether an Ethernet frame is a UDP datagram to port 4791 (looked at independently of the
/// parser under test: a plain walk over Ethernet, VLAN, IPv4/IPv6 and UDP).
pub fn is_roce_udp(f: &[u8]) -> bool {
    let mut off = 12;
    let mut et = u16::from_be_bytes([f[12], f[13]]);
    while et == 0x8100 || et == 0x88a8 {
        off += 4;
        if f.len() < off + 2 {
            return false;
        }
        et = u16::from_be_bytes([f[off], f[off + 1]]);
    }
    off += 2;
    let udp = match et {
        0x0800 if f.len() >= off + 20 && f[off + 9] == 17 => off + usize::from(f[off] & 0xf) * 4,
        0x86dd if f.len() >= off + 40 && f[off + 6] == 17 => off + 40,
        _ => return false,
    };
    f.len() >= udp + 4 && u16::from_be_bytes([f[udp + 2], f[udp + 3]]) == 4791
}

/// Finds a program on PATH.
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

pub fn mac(last: u8) -> EthernetAddress {
    EthernetAddress([0x02, 0, 0, 0, 0, last])
}

/// A repr for `op` with every extended header its opcode needs, values varied by `i`.
pub fn repr_for(op: Opcode, i: u32) -> RoceRepr {
    let info = op.info().unwrap();
    let mut bth = BthRepr::new(
        op,
        Qpn::new(0x10 + i * 0x1_0101),
        Psn::new(0xff_fff0u32.wrapping_add(i * 5)),
    );
    bth.solicited = i.is_multiple_of(3);
    bth.ack_req = i.is_multiple_of(2);
    bth.fecn = i % 5 == 1;
    bth.becn = op == Opcode::CNP || i % 7 == 2;
    bth.mig_req = i % 11 == 4;
    bth.pkey = if i.is_multiple_of(4) {
        PKey::new(0x8001)
    } else {
        PKey::DEFAULT
    };
    let mut r = RoceRepr::new(bth);
    use roce_common::opcode::Hdrs;
    let h = info.hdrs;
    let syndromes = [
        AethSyndrome::ACK_UNLIMITED,
        AethSyndrome::Ack {
            credits: CreditCode::new(7),
        },
        AethSyndrome::RnrNak {
            timer: RnrTimer::new(14),
        },
        AethSyndrome::Nak(NakCode::PsnSequenceError),
        AethSyndrome::Nak(NakCode::InvalidRequest),
        AethSyndrome::Nak(NakCode::RemoteAccessError),
        AethSyndrome::Nak(NakCode::RemoteOperationalError),
        AethSyndrome::Nak(NakCode::InvalidRdRequest),
    ];
    if h.contains(Hdrs::DETH) {
        r.deth = Some(DethRepr {
            qkey: if i.is_multiple_of(2) {
                QKey::GSI
            } else {
                QKey::new(0x1234_5678 + i)
            },
            src_qp: Qpn::new(0xab_0000 + i),
        });
    }
    if h.contains(Hdrs::FETH) {
        r.feth = Some(FethRepr { raw: 0x11 });
    }
    if h.contains(Hdrs::RETH) {
        r.reth = Some(RethRepr {
            va: 0x7f00_0000_0000 + u64::from(i) * 0x1000,
            rkey: RKey::new(0x100 + i),
            dma_len: 4096 * (i + 1),
        });
    }
    if h.contains(Hdrs::ATOMIC_ETH) {
        r.atomic_eth = Some(AtomicEthRepr {
            va: 0x1_0000 + u64::from(i) * 8,
            rkey: RKey::new(0xdead_0000 + i),
            swap_add: 0x0102_0304_0506_0708,
            compare: u64::from(i),
        });
    }
    if h.contains(Hdrs::AETH) {
        r.aeth = Some(AethRepr {
            syndrome: syndromes[i as usize % syndromes.len()],
            msn: Msn::new(0xff_fff0 + i),
        });
    }
    if h.contains(Hdrs::ATOMIC_ACK_ETH) {
        r.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig: u64::MAX - u64::from(i),
        });
    }
    if h.contains(Hdrs::IMMDT) {
        r.immdt = Some(ImmDtRepr {
            imm: 0xc0de_0000 + i,
        });
    }
    if h.contains(Hdrs::IETH) {
        r.ieth = Some(IethRepr {
            rkey: RKey::new(0xbeef + i),
        });
    }
    if h.contains(Hdrs::CNP) {
        r.cnp = Some(CnpRepr::default());
    }
    r
}

/// The frames we emit: every opcode of the table, over IPv4 and IPv6, with several payload
/// lengths (all four pad counts), VLAN and QinQ, all ECN codepoints.
pub fn our_table() -> Vec<(String, PathRepr, RoceRepr, Vec<u8>)> {
    let mut out = Vec::new();
    for (k, v6) in [false, true].into_iter().enumerate() {
        for (i, &op) in Opcode::ALL.iter().enumerate() {
            let i = i as u32 + k as u32 * 3;
            let ip = if v6 {
                IpPath::V6 {
                    src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x0a),
                    dst: "fe80::5054:ff:fe4e:1".parse().unwrap(),
                    flow_label: (0x1_2345 * (i + 1)) & 0xf_ffff,
                }
            } else {
                IpPath::V4 {
                    src: Ipv4Addr::new(10, 77, 0, 1),
                    dst: Ipv4Addr::new(10, 77, 0, 2 + i as u8),
                }
            };
            let mut p = PathRepr::new(mac(0x0a), mac(0x0b), ip);
            p.dscp = [0, 26, 46, 48][i as usize % 4];
            p.ecn = [Ecn::NotEct, Ecn::Ect0, Ecn::Ect1, Ecn::Ce][(i as usize / 4) % 4];
            p.ttl = 16 + (i as u8).wrapping_mul(13) % 240;
            p.ipv4_ident = 0x4000 + i as u16;
            p.udp_src_port = roce::wire::frame::udp_src_port(Qpn::new(i + 1), Qpn::new(0x11));
            match i % 6 {
                2 => p.vlan[0] = Some(VlanTag::dot1q((i % 8) as u8, 100 + i as u16)),
                5 => {
                    p.vlan[0] = Some(VlanTag {
                        tpid: 0x88a8,
                        tci: 0x0200 + i as u16,
                    });
                    p.vlan[1] = Some(VlanTag::dot1q(5, 7));
                }
                _ => {}
            }
            let payload: Vec<u8> = if op.info().unwrap().payload {
                let len = [0usize, 1, 2, 3, 4, 7, 256, 1024][i as usize % 8];
                (0..len).map(|j| (j as u32 * 31 + i) as u8).collect()
            } else {
                Vec::new()
            };
            out.push((
                format!("v{}_{op:?}", if v6 { 6 } else { 4 }),
                p,
                repr_for(op, i),
                payload,
            ));
        }
    }
    out
}
