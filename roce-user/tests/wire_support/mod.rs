//! Helpers shared by the `wire_*` integration tests: a minimal pcap reader and writer, and
//! locating the shared rxe samples.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};

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
