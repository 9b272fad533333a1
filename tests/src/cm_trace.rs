//! The CM exchange between two ends, read back from a capture of QP 1's MADs, and the check
//! that every CM message sent more than once was resent by the protocol's timer.
//!
//! A CM retransmits a REQ, REP, DREQ or SIDR_REQ when the answer does not come within the
//! response timeout the peer announced plus two packet lifetimes (IBTA 12.7.27; cm.c
//! `cm_send_req`, `cm_send_rep`): a Soft-RoCE guest under TCG on a loaded host may well take
//! longer than that to send its RTU, and then the guest's `cm_rx_duplicates` counts our REP
//! twice. That is the protocol working, not a fault. A resend that comes before the shortest
//! timeout any CM here uses, or after the answer was already on the wire, is a fault: this
//! module tells the two apart, so a test can demand "no message resent without cause".

use std::{path::Path, process::Command};

use roce_common::mad::CmAttr;

/// A BPF filter for tcpdump that keeps the RoCE v2 frames to QP 1 (the CM's MADs), over IPv4
/// and IPv6 (BTH bytes 5-7, the destination QP, after the UDP header; IPv6 without extension
/// headers, as RoCE v2 sends it).
pub const QP1_FILTER: &str = "(ip and udp dst port 4791 and udp[12:4] & 0xffffff = 1) or \
     (ip6 and ip6[6] = 17 and udp dst port 4791 and ip6[52:4] & 0xffffff = 1)";

/// The shortest time any CM of these tests waits before it resends: the kernel's
/// `cm_convert_to_ms(20)` (4096 ms, for RDMA CM's `CMA_CM_RESPONSE_TIMEOUT` 20) less a margin for
/// the capture's clock. Ours waits 4.3 s plus two packet lifetimes of 1.07 s.
pub const MIN_RESEND_GAP_S: f64 = 4.0;

/// How long before a resend an answer may have been on the wire without making the resend a
/// fault: the resender's timer and the answer's arrival can cross while it is busy.
pub const CROSSING_S: f64 = 0.5;

/// One CM MAD seen in the capture.
#[derive(Clone, Debug, PartialEq)]
pub struct CmSeen {
    /// Seconds since the first frame of the capture.
    pub t: f64,
    /// The sender's IP address.
    pub src: String,
    /// The message.
    pub attr: CmAttr,
    /// The MAD's transaction ID (REQ, REP and RTU of one connection share it; DREQ and DREP
    /// share another; SIDR_REQ and SIDR_REP another).
    pub tid: u64,
}

/// A message sent again.
#[derive(Clone, Debug, PartialEq)]
pub struct Resend {
    /// The copy (the second or later) that was sent again.
    pub msg: CmSeen,
    /// Seconds since the previous copy.
    pub gap: f64,
    /// Seconds between the first answer seen on the wire and this copy, if an answer came
    /// before it.
    pub answered_before: Option<f64>,
    /// The peer had sent what this message answers at least as many times as this message has
    /// now been sent (a CM answers a duplicate REQ with its REP again, a duplicate REP with its
    /// RTU again, and so on).
    pub prompted: bool,
}

impl Resend {
    /// Whether the protocol explains this copy: it answers a copy the peer sent again, or
    /// the timer sent it: the previous copy went unanswered for at least
    /// [`MIN_RESEND_GAP_S`], and no answer was on the wire more than [`CROSSING_S`] before it.
    #[must_use]
    pub fn justified(&self) -> bool {
        self.prompted
            || (self.gap >= MIN_RESEND_GAP_S
                && self.answered_before.is_none_or(|a| a <= CROSSING_S))
    }
}

impl std::fmt::Display for Resend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} from {} (TID {:#x}) again at {:.3} s, {:.3} s after the previous copy",
            self.msg.attr.name(),
            self.msg.src,
            self.msg.tid,
            self.msg.t,
            self.gap
        )?;
        if self.prompted {
            return write!(f, ", answering a copy the peer sent again");
        }
        match self.answered_before {
            Some(a) => write!(f, ", {a:.3} s after its answer was on the wire"),
            None => write!(f, ", unanswered until then"),
        }
    }
}

/// The messages that answer `attr` (and so stop its retransmission), none for a message that
/// is not resent by a timer.
fn answers(attr: CmAttr) -> &'static [CmAttr] {
    match attr {
        CmAttr::Req => &[CmAttr::Rep, CmAttr::Mra, CmAttr::Rej],
        CmAttr::Rep => &[CmAttr::Rtu, CmAttr::Mra, CmAttr::Rej],
        CmAttr::Dreq => &[CmAttr::Drep],
        CmAttr::SidrReq => &[CmAttr::SidrRep],
        _ => &[],
    }
}

/// The messages `attr` answers: a copy of one of them from the peer makes the CM send `attr`
/// again.
fn answered_by(attr: CmAttr) -> &'static [CmAttr] {
    match attr {
        CmAttr::Rep => &[CmAttr::Req],
        CmAttr::Rtu => &[CmAttr::Rep],
        CmAttr::Mra | CmAttr::Rej => &[CmAttr::Req, CmAttr::Rep],
        CmAttr::Drep => &[CmAttr::Dreq],
        CmAttr::SidrRep => &[CmAttr::SidrReq],
        _ => &[],
    }
}

/// The fields `fields` of the frames of `pcap` that match the display filter `filter`, one
/// line per frame, `|` between fields; the frame's time and its sender's IPv4 and IPv6
/// addresses come first.
fn tshark_fields(pcap: &Path, filter: &str, fields: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"])
        .arg(pcap)
        .args(["-Y", filter, "-T", "fields", "-E", "separator=|"]);
    for f in ["frame.time_relative", "ip.src", "ipv6.src"]
        .iter()
        .chain(fields)
    {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().map_err(|e| format!("running tshark: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "tshark on {}: {}",
            pcap.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Reads the CM MADs of `pcap` (any capture; frames other than CM MADs are skipped) with tshark.
///
/// # Errors
/// tshark fails, or prints a line it should not.
pub fn read(pcap: &Path) -> Result<Vec<CmSeen>, String> {
    tshark_fields(
        pcap,
        "infiniband.mad.mgmtclass == 0x07",
        &["infiniband.mad.attributeid", "infiniband.mad.transactionid"],
    )?
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| parse_line(l).ok_or_else(|| format!("tshark printed `{l}`")))
    .collect()
}

/// Every REJ in `pcap`, one line each: when, who sent it, the message it rejects (0 REQ,
/// 1 REP, 2 other) and the reason code (IBTA table 112; 8 is "invalid service ID": no
/// listener yet), for a test's log.
///
/// # Errors
/// tshark fails.
pub fn rejections(pcap: &Path) -> Result<Vec<String>, String> {
    Ok(tshark_fields(
        pcap,
        "infiniband.cm.rej.reason",
        &["infiniband.cm.rej.msgrej", "infiniband.cm.rej.reason"],
    )?
    .lines()
    .map(|l| match l.split('|').collect::<Vec<_>>().as_slice() {
        [t, v4, v6, msg, reason] => format!(
            "REJ at {t} s from {}: message rejected {msg}, reason {reason}",
            if v4.is_empty() { v6 } else { v4 }
        ),
        _ => format!("REJ: {l}"),
    })
    .collect())
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

fn parse_line(l: &str) -> Option<CmSeen> {
    let f: Vec<&str> = l.split('|').collect();
    let [t, v4, v6, attr, tid] = f.as_slice() else {
        return None;
    };
    let src = if v4.is_empty() { v6 } else { v4 };
    Some(CmSeen {
        t: t.trim().parse().ok()?,
        src: (*src).to_owned(),
        attr: CmAttr::from_u16(u16::try_from(parse_hex(attr)?).ok()?)?,
        tid: parse_hex(tid)?,
    })
}

/// Every copy after the first of a message (same sender, attribute and TID), with the time
/// since the previous copy and whether an answer (same TID, from the other side) had come.
#[must_use]
pub fn resends(seen: &[CmSeen]) -> Vec<Resend> {
    let mut out = Vec::new();
    for (i, m) in seen.iter().enumerate() {
        let Some(prev) = seen[..i]
            .iter()
            .rev()
            .find(|p| p.src == m.src && p.attr == m.attr && p.tid == m.tid)
        else {
            continue;
        };
        // The k-th copy of an answer is prompted when the peer had sent what it answers at
        // least k times by then.
        let same = |p: &&CmSeen| p.src == m.src && p.attr == m.attr && p.tid == m.tid;
        let copies = seen[..=i].iter().filter(same).count();
        let asked = seen[..i]
            .iter()
            .filter(|p| p.src != m.src && p.tid == m.tid && answered_by(m.attr).contains(&p.attr))
            .count();
        let prompted = asked >= copies;
        let answer = seen[..i]
            .iter()
            .find(|a| a.src != m.src && a.tid == m.tid && answers(m.attr).contains(&a.attr));
        out.push(Resend {
            msg: m.clone(),
            gap: m.t - prev.t,
            answered_before: answer.map(|a| m.t - a.t),
            prompted,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(t: f64, src: &str, attr: CmAttr, tid: u64) -> CmSeen {
        CmSeen {
            t,
            src: src.into(),
            attr,
            tid,
        }
    }

    #[test]
    fn a_rep_resent_after_its_timeout_with_no_rtu_is_justified() {
        let seen = [
            m(0.0, "g", CmAttr::Req, 7),
            m(0.1, "h", CmAttr::Rep, 7),
            m(6.5, "h", CmAttr::Rep, 7),
            m(6.6, "g", CmAttr::Rtu, 7),
            m(6.7, "g", CmAttr::Rtu, 7),
        ];
        let r = resends(&seen);
        // The REP's second copy, and the RTU's (an answer to the duplicate REP: not timed).
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].msg.attr, CmAttr::Rep);
        assert!((r[0].gap - 6.4).abs() < 1e-9);
        assert_eq!(r[0].answered_before, None);
        assert!(!r[0].prompted);
        assert!(r[0].justified());
        assert_eq!(r[1].msg.attr, CmAttr::Rtu);
        assert!(r[1].prompted);
        assert!(r[1].justified());
        // An RTU sent twice with no REP in between is not.
        let twice = [
            m(0.0, "h", CmAttr::Rep, 5),
            m(0.1, "g", CmAttr::Rtu, 5),
            m(0.2, "g", CmAttr::Rtu, 5),
        ];
        assert!(!resends(&twice)[0].justified());
    }

    #[test]
    fn a_resend_too_soon_or_after_the_answer_is_a_fault() {
        let soon = [m(0.0, "h", CmAttr::Req, 1), m(1.0, "h", CmAttr::Req, 1)];
        assert!(!resends(&soon)[0].justified());
        let answered = [
            m(0.0, "h", CmAttr::Dreq, 2),
            m(0.2, "g", CmAttr::Drep, 2),
            m(9.0, "h", CmAttr::Dreq, 2),
        ];
        let r = resends(&answered);
        assert_eq!(r[0].answered_before.map(|a| (a * 10.0).round()), Some(88.0));
        assert!(!r[0].justified());
        // An answer with another TID, or from the same side, answers nothing.
        let other = [
            m(0.0, "h", CmAttr::Req, 3),
            m(0.1, "g", CmAttr::Rep, 4),
            m(0.2, "h", CmAttr::Rep, 3),
            m(5.0, "h", CmAttr::Req, 3),
        ];
        assert!(resends(&other)[0].justified());
    }

    #[test]
    fn tshark_lines_parse_for_ipv4_and_ipv6() {
        assert_eq!(
            parse_line("1.250000000|10.0.0.1||0x0013|0x0000000100000002"),
            Some(m(1.25, "10.0.0.1", CmAttr::Rep, 0x1_0000_0002))
        );
        assert_eq!(
            parse_line("0.5||fd79:80::1|0x0010|0x0000000000000009"),
            Some(m(0.5, "fd79:80::1", CmAttr::Req, 9))
        );
        assert_eq!(parse_line("x|1|2|3|4"), None);
        assert_eq!(parse_line("0.5|a||0x0099|0x1"), None);
    }
}
