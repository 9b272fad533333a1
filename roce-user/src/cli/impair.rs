//! `roce impair`: attach roce_impair to an interface's egress, change its settings live, show
//! its counters, take it away.

use std::fmt::Write as _;

use anyhow::bail;
use roce::{
    impair::{self, Bottleneck, ImpairSettings},
    stats::{Section, Snapshot},
};
use roce_common::{impair::ImpairStats, mad::CmAttr};
use serde_json::json;

use super::Output;

/// Options of `roce impair`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  roce impair -i veth0 --drop 0.01 --reorder 0.001\n  \
roce impair -i veth0 --bottleneck 1gbit --kmin 10k --kmax 100k --pmax 0.01\n  \
roce impair -i veth0 --mad req --drop 1 --limit 1    # drop exactly the next CM REQ\n  \
roce impair -i veth0 --mad rtu --dup 1               # send every RTU twice\n  \
roce impair -i veth0 --show -j\n  roce impair -i veth0 --off\n\n\
Running it again on an attached interface replaces all settings at once (unset ones become 0)\n\
and starts the --limit count again; counters go on. Pins: /sys/fs/bpf/roce-impair/<ifname>/ (bpftool map dump pinned .../ROCE_IMPAIR_STATS)."
)]
pub struct ImpairArgs {
    /// Interface whose egress is impaired.
    #[arg(short, long)]
    pub iface: String,
    /// Detach roce_impair and remove its pins.
    #[arg(long, conflicts_with_all = ["show", "drop", "dup", "reorder", "corrupt", "ce", "bottleneck", "mad", "limit"])]
    pub off: bool,
    /// Show the settings and counters.
    #[arg(long, conflicts_with_all = ["drop", "dup", "reorder", "corrupt", "ce", "bottleneck", "mad", "limit"])]
    pub show: bool,
    /// With --show: only counters that are not zero.
    #[arg(short = 'z', long, requires = "show")]
    pub nonzero: bool,
    /// Drop RoCE packets with probability P.
    #[arg(long, value_name = "P", value_parser = parse_prob)]
    pub drop: Option<f64>,
    /// Send RoCE packets twice with probability P (the copy goes first).
    #[arg(long, value_name = "P", value_parser = parse_prob)]
    pub dup: Option<f64>,
    /// Hold RoCE packets back with probability P until the next RoCE packet has gone out.
    #[arg(long, value_name = "P", value_parser = parse_prob)]
    pub reorder: Option<f64>,
    /// Flip one bit after the BTH with probability P (the ICRC is left wrong).
    #[arg(long, value_name = "P", value_parser = parse_prob)]
    pub corrupt: Option<f64>,
    /// Set ECN to CE with probability P.
    #[arg(long, value_name = "P", value_parser = parse_prob, conflicts_with = "bottleneck")]
    pub ce: Option<f64>,
    /// A virtual bottleneck at RATE (e.g. 1gbit, 500mbit, 10G, or bits/s) that CE-marks
    /// ECN-capable packets RED-style (drops the Not-ECT ones it would mark, RFC 3168) and
    /// drops past its buffer.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bottleneck: Option<u64>,
    /// Bottleneck: no marks at or below this backlog (bytes; k/m suffixes = 10^3/10^6).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, requires = "bottleneck")]
    pub kmin: Option<u64>,
    /// Bottleneck: every packet marked above this backlog.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, requires = "bottleneck")]
    pub kmax: Option<u64>,
    /// Bottleneck: marking probability at Kmax.
    #[arg(long, value_name = "P", value_parser = parse_prob, requires = "bottleneck")]
    pub pmax: Option<f64>,
    /// Bottleneck: drop packets past this backlog.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, requires = "bottleneck")]
    pub max_backlog: Option<u64>,
    /// Impair only the communication manager's MADs of one message: req, mra, rej, rep, rtu,
    /// dreq, drep, sidr-req, sidr-rep, or an attribute ID (e.g. 0x19); a MAD is a UD SEND to
    /// QP 1 of management class CM. Every other RoCE packet passes untouched (counted as
    /// unselected). Default: every RoCE packet.
    #[arg(long, value_name = "MSG", value_parser = parse_mad)]
    pub mad: Option<u16>,
    /// Impair at most N packets, then pass everything (counted as over_limit): with a
    /// probability of 1, exactly the first N (chosen) packets. Not netem's queue limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with = "bottleneck")]
    pub limit: Option<u64>,
    /// UDP destination port taken to be RoCE v2.
    #[arg(long, default_value_t = roce_common::ROCE_V2_UDP_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
}

/// A CM message name (any case, `-` or `_` in the SIDR ones) or an attribute ID (decimal or
/// 0x hex, above 0).
fn parse_mad(s: &str) -> Result<u16, String> {
    if let Some(a) = CmAttr::from_name(s) {
        return Ok(a.id());
    }
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => s.parse(),
    };
    match n {
        Ok(v) if v != 0 => Ok(v),
        _ => Err(format!(
            "{s:?} is no CM message: one of {} or an attribute ID above 0",
            CmAttr::ALL
                .iter()
                .map(|a| a.name().to_ascii_lowercase().replace('_', "-"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn parse_prob(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{s}: a probability is between 0 and 1"))
    }
}

/// A number with an optional decimal suffix (k, m, g, t), then `suffix_tail`s allowed.
fn parse_scaled(s: &str, tails: &[&str]) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let mut body = lower.as_str();
    for t in tails {
        if let Some(b) = body.strip_suffix(t) {
            body = b;
            break;
        }
    }
    let (num, mult) = match body.char_indices().last() {
        Some((i, 'k')) => (&body[..i], 1e3),
        Some((i, 'm')) => (&body[..i], 1e6),
        Some((i, 'g')) => (&body[..i], 1e9),
        Some((i, 't')) => (&body[..i], 1e12),
        _ => (body, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number with an optional k/m/g/t suffix"))?;
    let v = v * mult;
    if !(1.0..1.8e19).contains(&v) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

fn parse_rate(s: &str) -> Result<u64, String> {
    parse_scaled(s, &["bit/s", "bps", "bit", "b/s"])
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_scaled(s, &["bytes", "b"])
}

pub(crate) fn run(out: Output, a: &ImpairArgs) -> anyhow::Result<()> {
    if a.off {
        let r = impair::off(&a.iface)?;
        let text = format!(
            "roce_impair {} {}; removed pins: {}\n",
            if r.detached {
                "detached from"
            } else {
                "was not attached to"
            },
            r.ifname,
            r.removed.join(" ")
        );
        out.emit(&serde_json::to_value(&r)?, &text);
        return Ok(());
    }
    if a.show {
        return show(out, &a.iface, a.nonzero);
    }
    let nothing = [a.drop, a.dup, a.reorder, a.corrupt, a.ce]
        .iter()
        .all(Option::is_none)
        && a.bottleneck.is_none();
    if nothing {
        bail!(
            "say what to do: --drop, --dup, --reorder, --corrupt, --ce or --bottleneck (or --show, --off)"
        );
    }
    let bottleneck = a.bottleneck.map(|rate| {
        let d = Bottleneck::at(rate);
        Bottleneck {
            rate_bps: rate,
            kmin_bytes: a.kmin.unwrap_or(d.kmin_bytes),
            kmax_bytes: a.kmax.unwrap_or(d.kmax_bytes),
            pmax: a.pmax.unwrap_or(d.pmax),
            max_backlog_bytes: a.max_backlog.unwrap_or(d.max_backlog_bytes),
        }
    });
    let settings = ImpairSettings {
        port: a.port,
        drop: a.drop.unwrap_or(0.0),
        dup: a.dup.unwrap_or(0.0),
        reorder: a.reorder.unwrap_or(0.0),
        corrupt: a.corrupt.unwrap_or(0.0),
        ce: a.ce.unwrap_or(0.0),
        bottleneck,
        mad_attr: a.mad,
        limit: a.limit.unwrap_or(0),
    };
    let r = impair::apply(&a.iface, &settings)?;
    let text = format!(
        "roce_impair {} {} egress{}: {}\npinned in {}\n",
        if r.attached {
            "attached to"
        } else {
            "updated on"
        },
        r.ifname,
        r.prog_id
            .map_or(String::new(), |id| format!(" (prog id {id})")),
        describe(&r.settings),
        r.pin_dir
    );
    out.emit(&serde_json::to_value(&r)?, &text);
    Ok(())
}

fn describe(s: &ImpairSettings) -> String {
    let mut parts = Vec::new();
    for (name, p) in [
        ("drop", s.drop),
        ("dup", s.dup),
        ("reorder", s.reorder),
        ("corrupt", s.corrupt),
        ("ce", s.ce),
    ] {
        if p > 0.0 {
            parts.push(format!("{name} {p}"));
        }
    }
    if let Some(b) = s.bottleneck {
        parts.push(format!(
            "bottleneck {} bit/s (kmin {} B, kmax {} B, pmax {}, max backlog {} B)",
            b.rate_bps, b.kmin_bytes, b.kmax_bytes, b.pmax, b.max_backlog_bytes
        ));
    }
    if parts.is_empty() {
        parts.push("nothing (count only)".into());
    }
    if s.limit != 0 {
        parts.push(format!("at most {} packets", s.limit));
    }
    let mut t = parts.join(", ");
    if let Some(id) = s.mad_attr {
        let _ = match CmAttr::from_u16(id) {
            Some(a) => write!(t, "; only CM {} MADs ({id:#06x})", a.name()),
            None => write!(t, "; only CM MADs with attribute {id:#06x}"),
        };
    }
    let _ = write!(t, "; RoCE port {}", s.port);
    t
}

fn show(out: Output, iface: &str, nonzero: bool) -> anyhow::Result<()> {
    let s = impair::show(iface)?;
    let snap = Snapshot {
        ifname: iface.to_owned(),
        sections: vec![Section::from_names(
            "impair",
            &ImpairStats::NAMES,
            &s.stats.values(),
        )],
    };
    let mut v = snap.to_json();
    v["settings"] = serde_json::to_value(s.settings)?;
    v["backlog_bytes"] = json!(s.backlog_bytes);
    v["limit_used"] = json!(s.limit_used);
    v["prog_id"] = json!(s.prog_id);
    v["link_id"] = json!(s.link_id);
    let mut text = format!("roce_impair on {}: {}\n", iface, describe(&s.settings));
    if s.settings.bottleneck.is_some() {
        let _ = writeln!(text, "  virtual backlog now: {} bytes", s.backlog_bytes);
    }
    if s.settings.limit != 0 {
        let _ = writeln!(
            text,
            "  impaired under the limit: {} of {}",
            s.limit_used, s.settings.limit
        );
    }
    text.push_str(&snap.to_text(nonzero));
    out.emit(&v, &text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_bytes_and_probabilities_parse() {
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("500mbit"), Ok(500_000_000));
        assert_eq!(parse_rate("10G"), Ok(10_000_000_000));
        assert_eq!(parse_rate("2.5gbps"), Ok(2_500_000_000));
        assert_eq!(parse_rate("8000000"), Ok(8_000_000));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0").is_err());
        assert_eq!(parse_bytes("10k"), Ok(10_000));
        assert_eq!(parse_bytes("1m"), Ok(1_000_000));
        assert_eq!(parse_bytes("1500"), Ok(1500));
        assert_eq!(parse_prob("0.5"), Ok(0.5));
        assert!(parse_prob("1.01").is_err());
        assert!(parse_prob("-0").is_ok());
        assert!(parse_prob("x").is_err());
        assert_eq!(parse_mad("req"), Ok(0x10));
        assert_eq!(parse_mad("RTU"), Ok(0x14));
        assert_eq!(parse_mad("sidr-req"), Ok(0x17));
        assert_eq!(parse_mad("0x19"), Ok(0x19));
        assert_eq!(parse_mad("18"), Ok(18));
        assert!(parse_mad("0").is_err());
        assert!(parse_mad("syn").unwrap_err().contains("sidr-rep"));
    }
}
