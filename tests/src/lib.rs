//! Support for the privileged integration tests: a frame builder for BPF_PROG_TEST_RUN tables,
//! the privilege check, and the path of the `roce` binary.
//!
//! The frame builder writes headers byte by byte, independently of roce-user's wire module, so
//! the XDP program is checked against bytes that did not come from the code under test. It can
//! build what the wire module never emits: VLAN stacks, IPv4 options, IPv6 extension headers,
//! fragments and every kind of truncation.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use roce_common::opcode::Opcode;

pub use roce::netns;

pub mod bpftool;
pub mod child;
pub mod cm_trace;
pub mod devinfo;
pub mod ecmp;
pub mod engine;
pub mod pcap;
pub mod perftest_matrix;
pub mod rdmacm;
pub mod routed;
pub mod rxe;

/// Fails the test (never skips it) when it cannot run with the privileges it needs.
///
/// # Panics
/// When not root.
pub fn require_root() {
    let uid = nix::unistd::geteuid();
    assert!(
        uid.is_root(),
        "this test needs root (BPF_PROG_TEST_RUN, veth, AF_XDP); run it through `cargo xtask test` as root"
    );
}

/// The `roce` binary under test: `$ROCE_BIN`, else `target/debug/roce` of this workspace.
///
/// # Panics
/// When it does not exist.
#[must_use]
pub fn roce_bin() -> PathBuf {
    let p = std::env::var_os("ROCE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/roce"),
        PathBuf::from,
    );
    assert!(
        p.exists(),
        "roce binary not found at {} (build it: cargo build -p roce-user)",
        p.display()
    );
    p
}

/// Runs the `roce` binary under test with `args` and returns what it did.
///
/// # Panics
/// When it cannot be started.
#[must_use]
pub fn roce(args: &[&str]) -> Output {
    Command::new(roce_bin())
        .args(args)
        .output()
        .expect("run roce")
}

/// Runs the `roce` binary under test with `args` and returns its standard output.
///
/// # Panics
/// When it fails (with its output in the message).
#[track_caller]
pub fn roce_ok(args: &[&str]) -> String {
    let o = roce(args);
    assert!(
        o.status.success(),
        "roce {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A veth pair between two namespaces of its own, named after `test` (see [`tag`]), on
/// subnet `subnet`, with the default MTU and queues.
///
/// # Panics
/// When the pair cannot be made.
#[must_use]
pub fn veth_pair(test: &str, subnet: u8) -> netns::VethPair {
    netns::VethPair::new(
        &tag(test),
        &netns::VethOptions {
            subnet,
            ..netns::VethOptions::default()
        },
    )
    .expect("veth pair")
}

/// roce_xdp on some interfaces for the length of a test: loaded by the library in each
/// end's namespace ([`Loaded::on`]), or by the test some other way ([`Loaded::guard`]);
/// unloaded on drop, so a failing assertion leaves no program or pins behind.
pub struct Loaded(Vec<String>);

impl Loaded {
    /// Loads roce_xdp on each of `ends`, attached the default way.
    ///
    /// # Panics
    /// When a load fails.
    #[must_use]
    pub fn on(ends: &[&netns::VethEnd]) -> Self {
        Self::on_mode(ends, roce::loader::LoadOptions::default().mode)
    }

    /// Loads roce_xdp on each of `ends`, attached in `mode`.
    ///
    /// # Panics
    /// When a load fails.
    #[must_use]
    pub fn on_mode(ends: &[&netns::VethEnd], mode: roce::loader::AttachMode) -> Self {
        let mut names = Vec::new();
        for end in ends {
            let (n, i) = (end.netns.clone(), end.ifname.clone());
            let opts = roce::loader::LoadOptions {
                netns: Some(n.clone()),
                mode,
                ..roce::loader::LoadOptions::default()
            };
            netns::in_netns(&n, move || roce::loader::load(&i, &opts))
                .expect("enter namespace")
                .unwrap_or_else(|e| panic!("load roce_xdp on {}: {e}", end.ifname));
            names.push(end.ifname.clone());
        }
        Self(names)
    }

    /// roce_xdp on both ends of `pair`, attached the default way.
    ///
    /// # Panics
    /// When a load fails.
    #[must_use]
    pub fn both(pair: &netns::VethPair) -> Self {
        Self::on(&[&pair.a, &pair.b])
    }

    /// Only unloads, on drop, what the test loads itself on `ifname` (with `roce load`, or by
    /// a program it starts).
    #[must_use]
    pub fn guard(ifname: &str) -> Self {
        Self(vec![ifname.to_owned()])
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = roce::loader::unload(n);
        }
    }
}

/// The folder `roce exec` puts on LD_LIBRARY_PATH, with the drop-in `libibverbs.so.1` and
/// `librdmacm.so.1` in it (`roce exec` makes it next to the `roce` under test on first use;
/// this runs it once).
///
/// # Panics
/// When the library is not built next to `roce` (`cargo build -p roce-verbs`).
#[must_use]
pub fn drop_in_lib_dir() -> PathBuf {
    let bin = roce_bin();
    let dir = bin.parent().expect("roce's folder");
    assert!(
        dir.join("libibverbs.so").exists(),
        "the drop-in libibverbs is not built next to {} (cargo build -p roce-verbs)",
        bin.display()
    );
    let o = roce(&["exec", "--", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir.join("roce-verbs")
}

/// A finished program's stdout then stderr, as text (for assertion messages and searches).
#[must_use]
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The example `name` of roce-user (`roce-user/examples/NAME.rs`), built next to the `roce`
/// binary under test: `target/debug/examples/NAME` beside `target/debug/roce`.
///
/// # Panics
/// When it does not exist.
#[must_use]
pub fn example_bin(name: &str) -> PathBuf {
    let bin = roce_bin();
    let p = bin
        .parent()
        .map_or_else(|| PathBuf::from("examples"), |d| d.join("examples"))
        .join(name);
    assert!(
        p.exists(),
        "example {name} not found at {} (build it: cargo build -p roce-user --examples)",
        p.display()
    );
    p
}

/// A unique short tag for names of namespaces and interfaces made by one test.
#[must_use]
pub fn tag(test: &str) -> String {
    format!("{test}{}", std::process::id() % 10_000)
}

/// The IP layer of a test frame.
#[derive(Clone, Debug)]
pub enum Ip {
    /// IPv4 with the given options length (a multiple of 4, at most 40), TOS, and fragment field.
    V4 {
        /// Bytes of options after the 20-byte header.
        options: usize,
        /// TOS byte (DSCP and ECN).
        tos: u8,
        /// Flags and fragment offset, host order.
        frag: u16,
        /// Override of the IHL nibble (for malformed headers).
        ihl: Option<u8>,
    },
    /// IPv6 with a traffic class and a chain of extension headers (next-header codes).
    V6 {
        /// Traffic class.
        tc: u8,
        /// Extension headers in order: 0 hop-by-hop, 43 routing, 60 destination options,
        /// 44 fragment (atomic unless `frag` is set), 51 AH.
        ext: Vec<u8>,
        /// Fragment offset and M flag of a fragment header, host order.
        frag: u16,
    },
}

/// A test frame: Ethernet, optional VLAN tags, IP, UDP, then a BTH with zeroed extended
/// headers, a payload, pad and an ICRC placeholder.
#[derive(Clone, Debug)]
pub struct Frame {
    /// VLAN TPIDs, outermost first.
    pub vlans: Vec<u16>,
    /// EtherType after the tags (overrides the one implied by `ip`).
    pub ether_type: Option<u16>,
    /// IP layer.
    pub ip: Ip,
    /// IP protocol (17 for UDP).
    pub proto: u8,
    /// UDP destination port.
    pub dport: u16,
    /// Override of the UDP length field.
    pub udp_len: Option<u16>,
    /// BTH opcode.
    pub opcode: Opcode,
    /// BTH TVer.
    pub tver: u8,
    /// Override of the BTH pad count.
    pub pad: Option<u8>,
    /// Destination QP.
    pub dest_qp: u32,
    /// PSN.
    pub psn: u32,
    /// The BTH's `resv7` bits (the multipath extension's marks, `roce_common::multipath`).
    pub resv7: u8,
    /// Payload bytes after the extended headers.
    pub payload: usize,
}

impl Default for Frame {
    fn default() -> Self {
        Self {
            vlans: Vec::new(),
            ether_type: None,
            ip: Ip::V4 {
                options: 0,
                tos: 0,
                frag: 0x4000,
                ihl: None,
            },
            proto: 17,
            dport: roce_common::ROCE_V2_UDP_PORT,
            udp_len: None,
            opcode: Opcode::RC_SEND_ONLY,
            tver: 0,
            pad: None,
            dest_qp: 0x11,
            psn: 1,
            resv7: 0,
            payload: 32,
        }
    }
}

impl Frame {
    /// The UDP payload: BTH, extended headers (zero), payload (0xa5), pad, ICRC placeholder.
    #[must_use]
    pub fn roce_bytes(&self) -> Vec<u8> {
        let ext = self.opcode.ext_len().unwrap_or(0);
        let pad = self.pad.unwrap_or(((4 - self.payload % 4) % 4) as u8);
        let mut b = vec![
            self.opcode.0,
            (pad & 3) << 4 | (self.tver & 0xf),
            0xff,
            0xff,
        ];
        b.push(if self.opcode == Opcode::CNP { 0x40 } else { 0 });
        b.extend_from_slice(&self.dest_qp.to_be_bytes()[1..]);
        b.push(0x80 | (self.resv7 & 0x7f));
        b.extend_from_slice(&self.psn.to_be_bytes()[1..]);
        b.resize(12 + ext, 0);
        b.resize(12 + ext + self.payload, 0xa5);
        b.resize(12 + ext + self.payload + usize::from(pad & 3) + 4, 0);
        b
    }

    /// The whole frame.
    #[must_use]
    pub fn build(&self) -> Vec<u8> {
        let roce = self.roce_bytes();
        let udp_len = self.udp_len.unwrap_or((8 + roce.len()) as u16);
        let mut l4 = Vec::new();
        l4.extend_from_slice(&0xc000u16.to_be_bytes());
        l4.extend_from_slice(&self.dport.to_be_bytes());
        l4.extend_from_slice(&udp_len.to_be_bytes());
        l4.extend_from_slice(&[0, 0]);
        l4.extend_from_slice(&roce);

        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        let (ip_type, ip_bytes) = match &self.ip {
            Ip::V4 {
                options,
                tos,
                frag,
                ihl,
            } => {
                let hl = 20 + options;
                let mut h = vec![0x40 | ihl.unwrap_or((hl / 4) as u8), *tos];
                h.extend_from_slice(&((hl + l4.len()) as u16).to_be_bytes());
                h.extend_from_slice(&[0x12, 0x34]);
                h.extend_from_slice(&frag.to_be_bytes());
                h.extend_from_slice(&[64, self.proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
                h.resize(hl, 1); // NOP options
                h.extend_from_slice(&l4);
                (0x0800u16, h)
            }
            Ip::V6 { tc, ext, frag } => {
                let mut chain = Vec::new();
                for (i, &code) in ext.iter().enumerate() {
                    let next = ext.get(i + 1).copied().unwrap_or(self.proto);
                    match code {
                        44 => {
                            chain.extend_from_slice(&[next, 0]);
                            chain.extend_from_slice(&frag.to_be_bytes());
                            chain.extend_from_slice(&[0, 0, 0, 7]);
                        }
                        51 => chain.extend_from_slice(&[next, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                        _ => chain.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]),
                    }
                }
                let first = ext.first().copied().unwrap_or(self.proto);
                let mut h = vec![0x60 | (tc >> 4), (tc & 0xf) << 4, 0, 0];
                h.extend_from_slice(&((chain.len() + l4.len()) as u16).to_be_bytes());
                h.extend_from_slice(&[first, 64]);
                h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
                h.extend_from_slice(&chain);
                h.extend_from_slice(&l4);
                (0x86ddu16, h)
            }
        };
        let inner = self.ether_type.unwrap_or(ip_type);
        for (i, &tpid) in self.vlans.iter().enumerate() {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&[0, 10 + i as u8]);
        }
        f.extend_from_slice(&inner.to_be_bytes());
        f.extend_from_slice(&ip_bytes);
        f
    }

    /// Offset of the UDP header in [`Frame::build`]'s output.
    #[must_use]
    pub fn udp_offset(&self) -> usize {
        let l2 = 14 + 4 * self.vlans.len();
        match &self.ip {
            Ip::V4 { options, .. } => l2 + 20 + options,
            Ip::V6 { ext, .. } => {
                l2 + 40
                    + ext
                        .iter()
                        .map(|&c| if c == 51 { 12 } else { 8 })
                        .sum::<usize>()
            }
        }
    }
}

/// The attacker side of hostile-packet tests: an `AF_PACKET` raw socket on one interface of a
/// namespace, run by a small Python helper (stdlib only) so the test process keeps no raw
/// socket and needs no unsafe code. Frames go out exactly as given; every frame received on
/// the interface (not our own outgoing ones) is queued until [`RawPort::recv`] collects it.
/// Dropping it kills the helper.
pub struct RawPort {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

const RAW_PORT_PY: &str = r#"
import select, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "S":
        s.send(bytes.fromhex(arg))
        print("ok", flush=True)
    elif cmd == "B":
        for h in arg.split():
            s.send(bytes.fromhex(h))
        print("ok", flush=True)
    elif cmd == "R":
        end = time.monotonic() + int(arg) / 1000.0
        out = []
        while True:
            left = end - time.monotonic()
            r, _, _ = select.select([s], [], [], max(left, 0))
            if not r:
                break
            data, addr = s.recvfrom(65536)
            if addr[2] != socket.PACKET_OUTGOING:
                out.append(data.hex())
        print("frames " + " ".join(out), flush=True)
"#;

impl RawPort {
    /// Opens a raw socket on `ifname` in namespace `netns` (`ip netns exec` runs the helper;
    /// that is fine for Python, only `roce` itself needs `--netns`).
    ///
    /// # Errors
    /// If the helper cannot start or does not report ready.
    pub fn open(netns: &str, ifname: &str) -> std::io::Result<Self> {
        use std::{
            io::{BufRead, BufReader},
            process::{Command, Stdio},
        };
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                "python3",
                "-u",
                "-c",
                RAW_PORT_PY,
                ifname,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut port = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        let mut line = String::new();
        port.stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(std::io::Error::other(format!(
                "raw port helper said {line:?}"
            )));
        }
        Ok(port)
    }

    fn line(&mut self) -> std::io::Result<String> {
        use std::io::BufRead;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("raw port helper exited"));
        }
        Ok(line)
    }

    /// Sends one frame as it is.
    ///
    /// # Errors
    /// If the helper is gone or the kernel refused the frame.
    pub fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(self.stdin, "S {hex}")?;
        self.stdin.flush()?;
        let l = self.line()?;
        if l.trim() == "ok" {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("send: {l:?}")))
        }
    }

    /// Sends `frames` back to back, in order, in one tight loop of the helper (a burst: no
    /// round trip to the test between two frames, unlike [`RawPort::send`]).
    ///
    /// # Errors
    /// If the helper is gone or the kernel refused a frame.
    pub fn send_burst(&mut self, frames: &[Vec<u8>]) -> std::io::Result<()> {
        use std::{fmt::Write as _, io::Write};
        let mut line = String::from("B");
        for f in frames {
            line.push(' ');
            for b in f {
                let _ = write!(line, "{b:02x}");
            }
        }
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let l = self.line()?;
        if l.trim() == "ok" {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("send_burst: {l:?}")))
        }
    }

    /// Every frame received since the last call, and those arriving within `wait` from now.
    ///
    /// # Errors
    /// If the helper is gone.
    pub fn recv(&mut self, wait: std::time::Duration) -> std::io::Result<Vec<Vec<u8>>> {
        use std::io::Write;
        writeln!(self.stdin, "R {}", wait.as_millis())?;
        self.stdin.flush()?;
        let l = self.line()?;
        let rest = l
            .trim()
            .strip_prefix("frames")
            .ok_or_else(|| std::io::Error::other(format!("recv: {l:?}")))?;
        rest.split_whitespace()
            .map(|h| {
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&h[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(std::io::Error::other)
            })
            .collect()
    }
}

impl Drop for RawPort {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The index of the GID of `ip` on `ifname` in network namespace `netns` (`roce gids`): what
/// the pingpongs' `-g` and perftest's `-x` take.
///
/// # Panics
/// When `roce gids` fails or lists no GID of `ip`.
#[must_use]
pub fn gid_index(netns: &str, ifname: &str, ip: std::net::IpAddr) -> String {
    let gids: Vec<serde_json::Value> =
        serde_json::from_str(&roce_ok(&["--netns", netns, "-j", "gids", "-i", ifname]))
            .expect("gids JSON");
    gids.iter()
        .find(|g| g["ip"].as_str() == Some(&ip.to_string()))
        .map(|g| g["index"].to_string())
        .unwrap_or_else(|| panic!("no GID of {ip} on {ifname}"))
}

/// The IPv4 GID index of `end`'s interface ([`gid_index`]).
#[must_use]
pub fn ipv4_gid_index(end: &netns::VethEnd) -> String {
    gid_index(&end.netns, &end.ifname, end.ipv4.into())
}
