//! perftest's out-of-band exchange (linux-rdma/perftest `perftest_communication.c`), so that
//! `roce perf` and ib_write_bw/ib_read_bw/ib_send_bw/ib_atomic_bw can set each other up.
//!
//! Every step is a fixed-size exchange in which the client (the side given a server name)
//! writes, then reads, and the server reads, then writes (`ctx_xchg_data_ethernet`). The order
//! for a bandwidth test (`write_bw.c`):
//! 1. versions: 16 bytes, NUL-padded (`exchange_versions`);
//! 2. if the peer is 5.32 or newer: cycle buffer and cache line size, 4-byte big-endian ints
//!    (`check_sys_data`);
//! 3. if the peer is 5.1 or newer: the active MTU enum as decimal text, 2 bytes from 5.31 on
//!    (`check_mtu`);
//! 4. if the peer is 6.28 or newer: `negotiate_params`, a raw C struct that embeds
//!    `struct ibv_device_attr` (ABI-dependent binary). We announce [`COMPAT_VERSION`] 6.06, so a
//!    newer perftest skips this step towards us, as it does towards any older perftest; and we
//!    skip it towards everyone, as perftest 6.06 does.
//! 5. per QP, a 108-byte key message (`KEY_PRINT_FMT_GID`); then again after the QPs reach RTR
//!    (a sync), and once more before the test;
//! 6. after the test: a sync, then the bandwidth report (`xchg_bw_reports`: size and iters as
//!    u64, then bw_peak, bw_avg and msgRate_avg as big-endian doubles);
//! 7. a last sync (`ctx_close_connection`).
//!
//! With `-R` (RDMA CM) perftest runs the same steps over a control RC QP that RDMA CM connected
//! (`rdma_write_data`/`rdma_read_data`: one SEND each way per step, the same bytes) but for the
//! key messages, which then go as the binary `struct pingpong_dest` ([`KeyMsg::encode_binary`],
//! `rdma_write_keys`). [`Comm`] runs over any [`Link`]: a [`TcpStream`], or the caller's control QP
//! with [`KeyFormat::Binary`].

use std::{
    io::{Read, Write},
    net::TcpStream,
};

use super::{CmError, malformed};
use crate::wire::types::{Psn, Qpn, RKey};

/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// The perftest version we announce and speak (see the module docs).
pub const COMPAT_VERSION: &str = "6.06";
/// Length of the version message (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;
/// The multipath hint (docs/multipath.md, "Hints out of band"): a `roce perf --multipath`
/// writes these 8 bytes at [`MULTIPATH_HINT_AT`] of its version message, after the version
/// string's NUL, where perftest (which reads the message as a C string: `strverscmp`,
/// `atof`) and older roce-xdp (which stops at the NUL) never look; perftest's own message is
/// NUL-padded (`strncpy`) there.
pub const MULTIPATH_HINT: &[u8; 8] = b"roce-mp1";
/// Where [`MULTIPATH_HINT`] sits in the version message.
pub const MULTIPATH_HINT_AT: usize = VERSION_LEN - MULTIPATH_HINT.len();
/// Length of a key message with a GID (`KEY_MSG_SIZE_GID`), NUL included.
pub const KEY_MSG_LEN: usize = 108;
/// Length of the binary key message of an RDMA CM exchange: `sizeof(struct pingpong_dest)` on
/// a 64-bit Linux (seven 4-byte fields, a u64 and a 16-byte GID, with the padding before the
/// u64).
pub const KEY_BIN_LEN: usize = 56;

/// How [`Comm`] reads and writes one step's bytes: the TCP stream of perftest's ethernet
/// exchange, or an RDMA CM control QP (one SEND per message). Implement it for a control
/// channel of your own; [`Comm`] calls [`Link::send`] and [`Link::recv`] in perftest's order.
pub trait Link {
    /// Sends `msg` whole.
    ///
    /// # Errors
    /// The channel failed.
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError>;
    /// Receives exactly `buf.len()` bytes (one message of that length on a message channel).
    ///
    /// # Errors
    /// The channel failed or closed.
    fn recv(&mut self, buf: &mut [u8]) -> Result<(), CmError>;
}

impl Link for TcpStream {
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError> {
        Ok(self.write_all(msg)?)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<(), CmError> {
        Ok(self.read_exact(buf)?)
    }
}

/// How key messages travel: perftest's text over TCP, or its binary struct over RDMA CM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFormat {
    /// [`KeyMsg::encode`]: the 108-byte text of the ethernet exchange.
    Text,
    /// [`KeyMsg::encode_binary`]: the 56-byte struct of the RDMA CM exchange (`-R`).
    Binary,
}

/// Byte `i` of the data `roce perf` puts in QP `q`'s buffer (the QP's index in the test, from
/// 0). Both sides know it, so each can verify what it received, read, or had written into it.
#[must_use]
pub fn pattern_byte(q: u32, i: usize) -> u8 {
    (i as u32)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(q.wrapping_mul(97))
        .rotate_left(7) as u8
}

/// The first `len` bytes of QP `q`'s pattern (see [`pattern_byte`]).
#[must_use]
pub fn pattern(q: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(q, i)).collect()
}

/// One side of an exchange, over a TCP stream (perftest's default) or another [`Link`].
#[derive(Debug)]
pub struct Comm<L = TcpStream> {
    link: L,
    is_client: bool,
    keys: KeyFormat,
    /// Whether our version message carries [`MULTIPATH_HINT`] ([`Comm::offer_multipath`]).
    offer_multipath: bool,
    /// The peer's version string, once [`Comm::setup`] exchanged versions.
    pub remote_version: String,
    /// Whether the peer's version message carried [`MULTIPATH_HINT`]: its QPs allow the
    /// multipath extension. Known once [`Comm::setup`] exchanged versions.
    pub peer_multipath: bool,
}

/// perftest's `struct pingpong_dest`, the part that goes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyMsg {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READs / atomics the side accepts.
    pub out_reads: u16,
    /// QP number.
    pub qpn: Qpn,
    /// First PSN.
    pub psn: Psn,
    /// R_Key of the buffer.
    pub rkey: RKey,
    /// Virtual address of the buffer.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number (0: none).
    pub srqn: u32,
}

impl KeyMsg {
    /// The 108-byte message: `"%04x:%04x:%06x:%06x:%08x:%016llx:"`, 16 × `"%02x:"`, `"%08x:"`, NUL.
    #[must_use]
    pub fn encode(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.value(),
            self.psn.value(),
            self.rkey.value(),
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// The 56-byte binary form (`-R`, perftest's `rdma_write_keys`): `struct pingpong_dest` with
    /// each field big-endian (lid, out_reads, qpn, psn, rkey as 4-byte ints, 4 bytes of
    /// padding, vaddr as 8, the GID, srqn, and a gid_index of 0 the reader ignores).
    #[must_use]
    pub fn encode_binary(&self) -> [u8; KEY_BIN_LEN] {
        let mut out = [0u8; KEY_BIN_LEN];
        out[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        out[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        out[8..12].copy_from_slice(&self.qpn.value().to_be_bytes());
        out[12..16].copy_from_slice(&self.psn.value().to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.value().to_be_bytes());
        out[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        out[32..48].copy_from_slice(&self.gid);
        out[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        out
    }

    /// Parses the binary form ([`KeyMsg::encode_binary`]), as `rdma_read_keys` does (srqn is
    /// not read: perftest leaves it 0).
    ///
    /// # Errors
    /// [`CmError::Malformed`] for a message of another length.
    pub fn decode_binary(msg: &[u8]) -> Result<Self, CmError> {
        if msg.len() != KEY_BIN_LEN {
            return Err(malformed("perftest binary key message", msg));
        }
        let u32_at = |i: usize| u32::from_be_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&msg[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&msg[32..48]);
        Ok(Self {
            lid: u32_at(0) as u16,
            out_reads: u32_at(4) as u16,
            qpn: Qpn::new(u32_at(8) & 0x00ff_ffff),
            psn: Psn::new(u32_at(12) & 0x00ff_ffff),
            rkey: RKey::new(u32_at(16)),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: 0,
        })
    }

    /// Parses a key message.
    ///
    /// # Errors
    /// [`CmError::Malformed`] for anything else.
    pub fn decode(msg: &[u8]) -> Result<Self, CmError> {
        let bad = || malformed("perftest key message", msg);
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad())?;
        let f: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, SRQN, and the empty string after the last ':'.
        if f.len() != 24 || !f[23].is_empty() {
            return Err(bad());
        }
        let hex = |s: &str, w: usize| {
            if s.len() == w {
                u64::from_str_radix(s, 16).map_err(|_| bad())
            } else {
                Err(bad())
            }
        };
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(f[6 + i], 2)? as u8;
        }
        Ok(Self {
            lid: hex(f[0], 4)? as u16,
            out_reads: hex(f[1], 4)? as u16,
            qpn: Qpn::new(hex(f[2], 6)? as u32),
            psn: Psn::new(hex(f[3], 6)? as u32),
            rkey: RKey::new(hex(f[4], 8)? as u32),
            vaddr: hex(f[5], 16)?,
            gid,
            srqn: hex(f[22], 8)? as u32,
        })
    }
}

/// perftest's `struct bw_report_data`, the part that is exchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, MB/s.
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Average message rate, Mpps.
    pub msg_rate_avg: f64,
}

/// The numeric value of a perftest version string, as perftest's `atof` reads it.
#[must_use]
pub fn version_number(v: &str) -> f64 {
    let t: String = v
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    t.parse().unwrap_or(0.0)
}

impl Comm {
    /// Wraps a connected stream; `is_client` is the side that connected.
    #[must_use]
    pub const fn new(stream: TcpStream, is_client: bool) -> Self {
        Self::over(stream, is_client, KeyFormat::Text)
    }

    /// The stream, for the caller to close or time out.
    #[must_use]
    pub const fn stream(&self) -> &TcpStream {
        &self.link
    }
}

impl<L: Link> Comm<L> {
    /// Wraps a connected [`Link`] whose key messages go as `keys` (an RDMA CM control QP:
    /// [`KeyFormat::Binary`]); `is_client` is the side that connected.
    #[must_use]
    pub const fn over(link: L, is_client: bool, keys: KeyFormat) -> Self {
        Self {
            link,
            is_client,
            keys,
            offer_multipath: false,
            remote_version: String::new(),
            peer_multipath: false,
        }
    }

    /// Says, in our version message, that our QPs allow the multipath extension
    /// ([`MULTIPATH_HINT`]), so that a roce-xdp peer that allows it too can start its QPs
    /// with it on. Call it before [`Comm::setup`], and only if every QP connected through
    /// this exchange allows the extension (`--multipath`): a peer takes the hint as leave to
    /// send trailers from its first packet.
    pub const fn offer_multipath(&mut self, on: bool) {
        self.offer_multipath = on;
    }

    /// The same exchange over `f(link)` (e.g. the link wrapped in the caller's enum).
    pub fn map_link<M>(self, f: impl FnOnce(L) -> M) -> Comm<M> {
        Comm {
            link: f(self.link),
            is_client: self.is_client,
            keys: self.keys,
            offer_multipath: self.offer_multipath,
            remote_version: self.remote_version,
            peer_multipath: self.peer_multipath,
        }
    }

    /// The link, for the caller to read its state (a report).
    pub const fn link(&self) -> &L {
        &self.link
    }

    /// The link, for the caller to poll or close.
    pub const fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// One exchange of `mine.len()` bytes each way, client first.
    ///
    /// # Errors
    /// I/O errors.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), CmError> {
        if self.is_client {
            self.link.send(mine)?;
            self.link.recv(theirs)?;
        } else {
            self.link.recv(theirs)?;
            self.link.send(mine)?;
        }
        Ok(())
    }

    fn remote(&self) -> f64 {
        version_number(&self.remote_version)
    }

    /// Steps 1–3: versions, system data and MTU. Returns the MTU both sides use (the smaller
    /// of `mtu_enum` and the peer's, as perftest picks it).
    ///
    /// # Errors
    /// I/O errors, a malformed reply, or a peer older than 5.70.
    pub fn setup(
        &mut self,
        cycle_buffer: i32,
        cache_line: i32,
        mtu_enum: u8,
    ) -> Result<u8, CmError> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..COMPAT_VERSION.len()].copy_from_slice(COMPAT_VERSION.as_bytes());
        if self.offer_multipath {
            mine[MULTIPATH_HINT_AT..].copy_from_slice(MULTIPATH_HINT);
        }
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&mine, &mut theirs)?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        self.remote_version = String::from_utf8_lossy(&theirs[..end]).into_owned();
        // Only after the string's NUL: a version string never carries the hint.
        self.peer_multipath =
            end < MULTIPATH_HINT_AT && theirs[MULTIPATH_HINT_AT..] == *MULTIPATH_HINT;
        if self.remote() < 5.70 {
            return Err(CmError::OldPeer(self.remote_version.clone()));
        }
        let mut four = [0u8; 4];
        self.xchg(&cycle_buffer.to_be_bytes(), &mut four)?;
        self.xchg(&cache_line.to_be_bytes(), &mut four)?;
        let mine = [b'0' + mtu_enum.min(9), 0];
        let mut theirs = [0u8; 2];
        self.xchg(&mine, &mut theirs)?;
        let rem = match theirs {
            [d @ b'1'..=b'5', 0] => d - b'0',
            _ => return Err(malformed("MTU enum", &theirs)),
        };
        Ok(rem.min(mtu_enum))
    }

    /// One key exchange (`ctx_hand_shake`), also used as a sync point.
    ///
    /// # Errors
    /// I/O errors or a malformed key message.
    pub fn hand_shake(&mut self, mine: &KeyMsg) -> Result<KeyMsg, CmError> {
        match self.keys {
            KeyFormat::Text => {
                let mut theirs = [0u8; KEY_MSG_LEN];
                self.xchg(&mine.encode(), &mut theirs)?;
                KeyMsg::decode(&theirs)
            }
            KeyFormat::Binary => {
                let mut theirs = [0u8; KEY_BIN_LEN];
                self.xchg(&mine.encode_binary(), &mut theirs)?;
                KeyMsg::decode_binary(&theirs)
            }
        }
    }

    /// The bandwidth report exchange (`xchg_bw_reports`).
    ///
    /// # Errors
    /// I/O errors.
    pub fn xchg_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, CmError> {
        let mut eight = [0u8; 8];
        let mut r = BwReport::default();
        self.xchg(&mine.size.to_be_bytes(), &mut eight)?;
        r.size = u64::from_be_bytes(eight);
        if self.remote() >= 5.33 {
            self.xchg(&mine.iters.to_be_bytes(), &mut eight)?;
            r.iters = u64::from_be_bytes(eight);
        } else {
            let mut four = [0u8; 4];
            self.xchg(&(mine.iters as u32).to_be_bytes(), &mut four)?;
            r.iters = u64::from(u32::from_be_bytes(four));
        }
        for (m, t) in [
            (mine.bw_peak, &mut r.bw_peak),
            (mine.bw_avg, &mut r.bw_avg),
            (mine.msg_rate_avg, &mut r.msg_rate_avg),
        ] {
            self.xchg(&m.to_bits().to_be_bytes(), &mut eight)?;
            *t = f64::from_bits(u64::from_be_bytes(eight));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// From `samples/ib_write_bw-n10-s4096.oob.txt` (rxe ↔ rxe, perftest 6.06).
    const CLIENT_KEY: &[u8] = b"0000:0001:000011:3de54a:00000276:00005581ca343000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\0";

    #[test]
    fn key_message_matches_rxe_capture() {
        assert_eq!(CLIENT_KEY.len(), KEY_MSG_LEN);
        let k = KeyMsg::decode(CLIENT_KEY).unwrap();
        assert_eq!(k.out_reads, 1);
        assert_eq!(k.qpn, Qpn::new(0x11));
        assert_eq!(k.psn, Psn::new(0x3de54a));
        assert_eq!(k.rkey, RKey::new(0x276));
        assert_eq!(k.vaddr, 0x5581_ca34_3000);
        assert_eq!(
            k.gid,
            crate::cm::gid_from_ipv4("10.77.0.3".parse().unwrap())
        );
        assert_eq!(&k.encode()[..], CLIENT_KEY);
        assert!(KeyMsg::decode(&CLIENT_KEY[..60]).is_err());
        assert!(KeyMsg::decode(b"garbage").is_err());
    }

    #[test]
    fn versions_parse_like_atof() {
        assert!((version_number("6.06") - 6.06).abs() < 1e-9);
        assert!((version_number("6.30-foo") - 6.30).abs() < 1e-9);
        assert!(version_number("x") == 0.0);
    }

    /// Both roles of [`Comm`] against each other, byte for byte what the capture shows.
    #[test]
    fn client_and_server_agree() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let key = KeyMsg::decode(CLIENT_KEY).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut c = Comm::new(s, false);
            let mtu = c.setup(4096, 64, 5).unwrap();
            let k = c
                .hand_shake(&KeyMsg {
                    qpn: Qpn::new(0x22),
                    ..key
                })
                .unwrap();
            let r = c.xchg_bw_reports(&BwReport::default()).unwrap();
            (mtu, k, r, c.remote_version.clone())
        });
        let mut c = Comm::new(TcpStream::connect(addr).unwrap(), true);
        assert_eq!(c.setup(4096, 64, 3).unwrap(), 3);
        assert_eq!(c.hand_shake(&key).unwrap().qpn, Qpn::new(0x22));
        let mine = BwReport {
            size: 4096,
            iters: 10,
            bw_peak: 3.26,
            bw_avg: 2.13,
            msg_rate_avg: 0.0005,
        };
        c.xchg_bw_reports(&mine).unwrap();
        let (mtu, k, r, v) = server.join().unwrap();
        assert_eq!((mtu, k, r, v.as_str()), (3, key, mine, COMPAT_VERSION));
    }

    /// The multipath hint rides after the version string's NUL: a peer that offers it sees
    /// the other's, the version string is the same as without it, and a peer that does not
    /// offer it (perftest, older roce-xdp) sends a NUL-padded message without one.
    #[test]
    fn the_multipath_hint_rides_after_the_version_strings_nul() {
        for (client_offers, server_offers) in [(true, true), (true, false), (false, true)] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                if server_offers {
                    let mut c = Comm::new(s, false);
                    c.offer_multipath(true);
                    c.setup(4096, 64, 3).unwrap();
                    return (c.peer_multipath, c.remote_version);
                }
                // What perftest sends: the version, NUL-padded, and the rest of the setup.
                let mut theirs = [0u8; VERSION_LEN];
                s.read_exact(&mut theirs).unwrap();
                let mut mine = [0u8; VERSION_LEN];
                mine[..4].copy_from_slice(b"6.19");
                s.write_all(&mine).unwrap();
                for answer in [&[0, 0, 16, 0][..], &[0, 0, 0, 64], b"3\0"] {
                    let mut step = vec![0u8; answer.len()];
                    s.read_exact(&mut step).unwrap();
                    s.write_all(answer).unwrap();
                }
                let end = theirs.iter().position(|&b| b == 0).unwrap();
                (
                    theirs[MULTIPATH_HINT_AT..] == *MULTIPATH_HINT,
                    String::from_utf8_lossy(&theirs[..end]).into_owned(),
                )
            });
            let mut c = Comm::new(TcpStream::connect(addr).unwrap(), true);
            c.offer_multipath(client_offers);
            c.setup(4096, 64, 3).unwrap();
            let (server_saw, server_read_version) = server.join().unwrap();
            assert_eq!(c.peer_multipath, server_offers);
            assert_eq!(server_saw, client_offers);
            assert_eq!(
                server_read_version, COMPAT_VERSION,
                "the string is unchanged"
            );
            let want = if server_offers {
                COMPAT_VERSION
            } else {
                "6.19"
            };
            assert_eq!(c.remote_version, want);
        }
    }

    #[test]
    fn binary_key_message_is_perftests_big_endian_struct() {
        let key = KeyMsg::decode(CLIENT_KEY).unwrap();
        let b = key.encode_binary();
        assert_eq!(b.len(), KEY_BIN_LEN);
        assert_eq!(&b[8..12], &key.qpn.value().to_be_bytes());
        assert_eq!(&b[24..32], &key.vaddr.to_be_bytes());
        assert_eq!(&b[32..48], &key.gid);
        assert_eq!(
            KeyMsg::decode_binary(&b).unwrap(),
            KeyMsg { srqn: 0, ..key }
        );
        assert!(KeyMsg::decode_binary(&b[..40]).is_err());
    }
}
