//! Connection setup: the TCP out-of-band exchanges of the classic RDMA tools, so that `roce
//! pingpong` talks to `ibv_rc_pingpong` and `roce perf` to perftest (reference/roce-v2.md §3).
//!
//! Message encoding and decoding are pure functions, tested against the exchanges captured between
//! two Linux Soft-RoCE peers (`../shared/rxe-peer/samples/*.oob.txt`). The exchanges themselves are
//! blocking reads and writes on a `std::net::TcpStream`: connection setup is not on the data path.

pub mod perftest;
pub mod pingpong;

use std::io;

/// Why an out-of-band exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The TCP connection failed or closed early.
    #[error("out-of-band connection: {0}")]
    Io(#[from] io::Error),
    /// A message did not have the expected format.
    #[error("malformed out-of-band message ({what}): {text:?}")]
    Malformed {
        /// What we expected.
        what: &'static str,
        /// What we got (lossy text).
        text: String,
    },
    /// The peer speaks a version we cannot talk to.
    #[error("peer perftest version {0:?} is older than 5.70, which perftest itself refuses")]
    OldPeer(String),
}

fn malformed(what: &'static str, bytes: &[u8]) -> CmError {
    CmError::Malformed {
        what,
        text: String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// A GID as ibv_rc_pingpong writes it: 32 hex digits, the 16 bytes in order
/// (`gid_to_wire_gid`, four big-endian words).
#[must_use]
pub fn gid_to_hex(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`gid_to_hex`]'s output.
///
/// # Errors
/// [`CmError::Malformed`] unless it is 32 hex digits.
pub fn gid_from_hex(s: &str) -> Result<[u8; 16], CmError> {
    let b = s.as_bytes();
    if b.len() != 32 || !b.iter().all(u8::is_ascii_hexdigit) {
        return Err(malformed("GID of 32 hex digits", b));
    }
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| malformed("GID", b))?;
    }
    Ok(gid)
}

/// The RoCE v2 GID of an IPv4 address: `::ffff:a.b.c.d` (IPv4-mapped).
#[must_use]
pub fn gid_from_ipv4(ip: std::net::Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The IP address a RoCE v2 GID stands for: IPv4 for an IPv4-mapped GID, else IPv6.
#[must_use]
pub fn gid_to_ip(gid: &[u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    v6.to_ipv4_mapped()
        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_round_trip() {
        let gid = gid_from_ipv4("10.77.0.3".parse().unwrap());
        assert_eq!(gid_to_hex(&gid), "00000000000000000000ffff0a4d0003");
        assert_eq!(
            gid_from_hex("00000000000000000000ffff0a4d0003").unwrap(),
            gid
        );
        assert_eq!(
            gid_to_ip(&gid),
            "10.77.0.3".parse::<std::net::IpAddr>().unwrap()
        );
        let v6: std::net::Ipv6Addr = "fd00:77::2".parse().unwrap();
        assert_eq!(gid_to_ip(&v6.octets()), std::net::IpAddr::V6(v6));
        assert!(gid_from_hex("zz000000000000000000ffff0a4d0003").is_err());
        assert!(gid_from_hex("00").is_err());
    }
}
