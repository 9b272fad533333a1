//! ibv_rc_pingpong's exchange (rdma-core `libibverbs/examples/rc_pingpong.c`, `pingpong.c`):
//! TCP port 18515; the client writes its 52-byte `"%04x:%06x:%06x:%s\0"` message (LID, QPN, PSN,
//! GID as 32 hex digits), reads the server's, and writes `"done\0"`. The server reads the client's
//! message, connects its QP, writes its own, and reads `"done\0"`.
//!
//! The multipath hint (docs/multipath.md, "Hints out of band"): the message has no byte to
//! spare, so a `roce pingpong --multipath` writes its hex digits in upper case
//! ([`Dest::encode_hinted`]). ibv_rc_pingpong writes lower case and reads either (`sscanf`'s
//! `%x`), as older roce-xdp does; an upper-case digit is the hint ([`has_multipath_hint`]). A
//! message without a letter (a GID, QPN and PSN all of decimal digits) cannot carry it: the
//! QPs then agree in band, as without the hint.

use std::{
    io::{Read, Write},
    net::TcpStream,
};

use super::{CmError, gid_from_hex, gid_to_hex, malformed};
use crate::wire::types::{Psn, Qpn};

/// ibv_rc_pingpong's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Length of one address message, NUL included (`sizeof "0000:000000:000000:" + 32 hex`).
pub const MSG_LEN: usize = 52;
/// The closing message, NUL included.
pub const DONE: &[u8; 5] = b"done\0";

/// One side's address: what ibv_rc_pingpong calls `struct pingpong_dest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: Qpn,
    /// First PSN.
    pub psn: Psn,
    /// GID.
    pub gid: [u8; 16],
}

impl Dest {
    /// The 52-byte message.
    #[must_use]
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            gid_to_hex(&self.gid)
        );
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// [`Dest::encode`], with the hex digits in upper case if `hint` (our QP allows the
    /// multipath extension).
    #[must_use]
    pub fn encode_hinted(&self, hint: bool) -> [u8; MSG_LEN] {
        let mut out = self.encode();
        if hint {
            out.make_ascii_uppercase();
        }
        out
    }

    /// Parses a 52-byte message.
    ///
    /// # Errors
    /// [`CmError::Malformed`] for anything but `"%04x:%06x:%06x:<32 hex>"` and NULs.
    pub fn decode(msg: &[u8]) -> Result<Self, CmError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text =
            std::str::from_utf8(&msg[..end]).map_err(|_| malformed("pingpong address", msg))?;
        let parts: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = parts[..] else {
            return Err(malformed("pingpong address LID:QPN:PSN:GID", msg));
        };
        let hex = |s: &str, width: usize| {
            if s.len() == width {
                u32::from_str_radix(s, 16).map_err(|_| malformed("pingpong address", msg))
            } else {
                Err(malformed("pingpong address", msg))
            }
        };
        Ok(Self {
            lid: hex(lid, 4)? as u16,
            qpn: Qpn::new(hex(qpn, 6)?),
            psn: Psn::new(hex(psn, 6)?),
            gid: gid_from_hex(gid)?,
        })
    }
}

/// Whether an address message carries the multipath hint: an upper-case hex digit, which
/// ibv_rc_pingpong never writes ([`Dest::encode_hinted`]).
#[must_use]
pub fn has_multipath_hint(msg: &[u8]) -> bool {
    msg.iter().any(|b| (b'A'..=b'F').contains(b))
}

/// The client's side (`pp_client_exch_dest`): write ours (with the multipath hint if
/// `hint`), read the server's, write "done" at once (ibv_rc_pingpong connects its QP after
/// the exchange). Returns the server's address and whether it carried the hint.
///
/// # Errors
/// I/O errors and malformed messages.
pub fn client_exchange(
    stream: &mut TcpStream,
    mine: &Dest,
    hint: bool,
) -> Result<(Dest, bool), CmError> {
    stream.write_all(&mine.encode_hinted(hint))?;
    let mut buf = [0u8; MSG_LEN];
    stream.read_exact(&mut buf)?;
    let theirs = Dest::decode(&buf)?;
    stream.write_all(DONE)?;
    Ok((theirs, has_multipath_hint(&buf)))
}

/// The server's first step: read the client's address. Returns it and whether it carried
/// the multipath hint.
///
/// # Errors
/// I/O errors and malformed messages.
pub fn server_read(stream: &mut TcpStream) -> Result<(Dest, bool), CmError> {
    let mut buf = [0u8; MSG_LEN];
    stream.read_exact(&mut buf)?;
    Ok((Dest::decode(&buf)?, has_multipath_hint(&buf)))
}

/// The server's second step, once its QP is connected: write ours (with the multipath hint
/// if `hint`) and wait for "done".
///
/// # Errors
/// I/O errors, or something other than "done".
pub fn server_reply(stream: &mut TcpStream, mine: &Dest, hint: bool) -> Result<(), CmError> {
    stream.write_all(&mine.encode_hinted(hint))?;
    let mut done = [0u8; 5];
    stream.read_exact(&mut done)?;
    if &done[..4] != b"done" {
        return Err(malformed("\"done\"", &done));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of `samples/ibv_rc_pingpong-n10-s4096.oob.txt`, captured between two rxe peers.
    #[test]
    fn rxe_capture_round_trips() {
        let client = b"0000:000011:98f283:00000000000000000000ffff0a4d0003\0";
        let server = b"0000:000011:153cd6:00000000000000000000ffff0a4d0002\0";
        assert_eq!(client.len(), MSG_LEN);
        let c = Dest::decode(client).unwrap();
        assert_eq!(c.qpn, Qpn::new(0x11));
        assert_eq!(c.psn, Psn::new(0x98f283));
        assert_eq!(
            c.gid,
            crate::cm::gid_from_ipv4("10.77.0.3".parse().unwrap())
        );
        assert_eq!(&c.encode(), client);
        assert_eq!(&Dest::decode(server).unwrap().encode(), server);
    }

    /// The hint is the message in upper case: it parses to the same address (as
    /// ibv_rc_pingpong's `sscanf("%x")` reads it), and only a hinted message shows it.
    #[test]
    fn the_multipath_hint_is_upper_case_hex() {
        let plain = b"0000:000011:98f283:00000000000000000000ffff0a4d0003\0";
        let d = Dest::decode(plain).unwrap();
        assert!(!has_multipath_hint(plain));
        assert_eq!(&d.encode_hinted(false), plain);
        let hinted = d.encode_hinted(true);
        assert_eq!(
            &hinted,
            b"0000:000011:98F283:00000000000000000000FFFF0A4D0003\0"
        );
        assert!(has_multipath_hint(&hinted));
        assert_eq!(Dest::decode(&hinted).unwrap(), d);
        // No letter anywhere: no room for the hint, the QPs agree in band.
        let digits = Dest {
            gid: [0x20, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12],
            qpn: Qpn::new(0x11),
            psn: Psn::new(0x12_3456),
            lid: 0,
        };
        assert!(!has_multipath_hint(&digits.encode_hinted(true)));
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &b"0000:000011:98f283\0"[..],
            b"",
            b"00000:00011:98f283:00000000000000000000ffff0a4d0003",
            b"\xff\xfe",
        ] {
            assert!(Dest::decode(bad).is_err(), "{bad:?}");
        }
    }
}
