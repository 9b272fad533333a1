//! The rows of `roce top`: rates from two counter snapshots, per interface and per QP, and
//! their order. Pure: the caller reads the snapshots (the same [`Snapshot`]s `roce stats -s`
//! and the Prometheus exporter read from the pinned maps) and says how far apart they were;
//! the terminal view and the JSON of `roce top -j` are built from what this returns.
//!
//! What the columns count, in the transport's counter names (`QpCounters`, `CcStats`; the
//! interface's come from [`XdpStats`] and the AF_XDP queues' [`XskStats`]):
//! - retransmissions: `completer_retry_err`, the retries the requester started (timeout, NAK or
//!   implied NAK; rxe's counter of the same name);
//! - NAKs: sequence-error and error NAKs received (`rcvd_seq_err`, `req_remote_invalid_request`,
//!   `req_remote_access_errors`) and sent (`out_of_seq_request`, `resp_invalid_request`,
//!   `resp_remote_access_errors`), RNR NAKs apart;
//! - RNR: RNR NAKs received and sent (`rcvd_rnr_err`, `send_rnr_err`);
//! - CNPs: received (`rp_cnp_handled` + `rp_cnp_ignored` per QP, the XDP program's `cnp` per
//!   interface) and sent (`np_cnp_sent`);
//! - the DCQCN rate (bits/s) and α (the QP's `alpha_1024` / 1024) are the current gauges.

use roce_common::counters::{DropReason, XdpStats, XskStats};
use serde::Serialize;

use super::{Section, Snapshot};

/// The counters summed into the NAK column (sent and received, RNR NAKs apart).
pub const NAK_COUNTERS: [&str; 6] = [
    "rcvd_seq_err",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "out_of_seq_request",
    "resp_invalid_request",
    "resp_remote_access_errors",
];
/// The counters summed into the RNR column.
pub const RNR_COUNTERS: [&str; 2] = ["rcvd_rnr_err", "send_rnr_err"];
/// The counter of the retransmission column.
pub const RETRY_COUNTER: &str = "completer_retry_err";
/// The counters summed into a QP's CNPs received.
pub const CNP_RX_COUNTERS: [&str; 2] = ["rp_cnp_handled", "rp_cnp_ignored"];
/// The counter of CNPs sent.
pub const CNP_TX_COUNTER: &str = "np_cnp_sent";

/// One XDP drop reason of an interface: its counter, its total and its rate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Drop {
    /// The counter's name in [`XdpStats`] (`drop_bad_tver`, ...).
    pub reason: &'static str,
    /// Packets dropped for it since the program was loaded.
    pub total: u64,
    /// Packets per second over the last interval.
    pub per_sec: f64,
}

/// One interface's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IfaceRow {
    /// Interface.
    pub ifname: String,
    /// Frames the XDP program saw, per second.
    pub rx_pps: f64,
    /// Their bytes per second.
    pub rx_bytes_per_sec: f64,
    /// RoCE packets redirected to AF_XDP, per second.
    pub redirected_pps: f64,
    /// Frames placed on the AF_XDP TX rings, per second (every queue).
    pub tx_pps: f64,
    /// Their bytes per second.
    pub tx_bytes_per_sec: f64,
    /// Retransmissions per second, summed over the QPs.
    pub retrans_per_sec: f64,
    /// NAKs per second (sent and received, RNR apart), summed over the QPs.
    pub naks_per_sec: f64,
    /// RNR NAKs per second (sent and received), summed over the QPs.
    pub rnr_per_sec: f64,
    /// CNPs the XDP program saw arrive, per second.
    pub cnp_rx_per_sec: f64,
    /// CNPs sent, per second, summed over the QPs.
    pub cnp_tx_per_sec: f64,
    /// Packets the XDP program dropped (every reason), per second.
    pub drops_per_sec: f64,
    /// QPs with counters on this interface.
    pub qps: usize,
    /// Every drop reason of the XDP program, in [`XdpStats`] order, zero ones too.
    pub drops: Vec<Drop>,
}

/// One QP's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QpRow {
    /// Interface.
    pub ifname: String,
    /// QP number.
    pub qpn: u32,
    /// State (`RTS`, ...), as `roce stats -s` shows it.
    pub state: String,
    /// PID of the process that owns the QP.
    pub owner: String,
    /// Packets sent per second (requests and responses).
    pub tx_pps: f64,
    /// Packets received per second.
    pub rx_pps: f64,
    /// RoCE payload bytes sent per second (`tx_payload_bytes`).
    pub tx_bytes_per_sec: f64,
    /// RoCE payload bytes received per second (`rx_payload_bytes`).
    pub rx_bytes_per_sec: f64,
    /// Retransmissions per second.
    pub retrans_per_sec: f64,
    /// NAKs per second (sent and received, RNR apart).
    pub naks_per_sec: f64,
    /// RNR NAKs per second (sent and received).
    pub rnr_per_sec: f64,
    /// CNPs received per second.
    pub cnp_rx_per_sec: f64,
    /// CNPs sent per second.
    pub cnp_tx_per_sec: f64,
    /// DCQCN current rate, bits/s (the line rate while not limited; 0 without congestion
    /// control).
    pub rate_bps: u64,
    /// DCQCN α, 0 to 1.
    pub alpha: f64,
    /// Packets sent since the QP was created.
    pub tx_total: u64,
    /// Packets received since the QP was created.
    pub rx_total: u64,
}

/// The columns the QP table can be sorted by, in the order `<` and `>` walk them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SortKey {
    /// Interface, then QPN.
    Qpn,
    /// Packets sent per second.
    Tx,
    /// Packets received per second.
    Rx,
    /// Payload bytes sent per second.
    TxBytes,
    /// Payload bytes received per second.
    RxBytes,
    /// Retransmissions per second.
    Retrans,
    /// NAKs per second.
    Naks,
    /// RNR NAKs per second.
    Rnr,
    /// CNPs received per second.
    Cnp,
    /// DCQCN rate.
    Rate,
    /// DCQCN α.
    Alpha,
}

impl SortKey {
    /// Every key, in column order.
    pub const ALL: [Self; 11] = [
        Self::Qpn,
        Self::Tx,
        Self::Rx,
        Self::TxBytes,
        Self::RxBytes,
        Self::Retrans,
        Self::Naks,
        Self::Rnr,
        Self::Cnp,
        Self::Rate,
        Self::Alpha,
    ];

    /// The next column to the right (`>`), wrapping.
    #[must_use]
    pub fn next(self) -> Self {
        let i = Self::ALL.iter().position(|k| *k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }

    /// The next column to the left (`<`), wrapping.
    #[must_use]
    pub fn prev(self) -> Self {
        let i = Self::ALL.iter().position(|k| *k == self).unwrap_or(0);
        Self::ALL[(i + Self::ALL.len() - 1) % Self::ALL.len()]
    }

    /// The header of the column.
    #[must_use]
    pub const fn title(self) -> &'static str {
        match self {
            Self::Qpn => "QPN",
            Self::Tx => "TX pkt/s",
            Self::Rx => "RX pkt/s",
            Self::TxBytes => "TX B/s",
            Self::RxBytes => "RX B/s",
            Self::Retrans => "RETX/s",
            Self::Naks => "NAK/s",
            Self::Rnr => "RNR/s",
            Self::Cnp => "CNP rx/s",
            Self::Rate => "DCQCN rate",
            Self::Alpha => "alpha",
        }
    }

    fn value(self, r: &QpRow) -> f64 {
        match self {
            Self::Qpn => f64::from(r.qpn),
            Self::Tx => r.tx_pps,
            Self::Rx => r.rx_pps,
            Self::TxBytes => r.tx_bytes_per_sec,
            Self::RxBytes => r.rx_bytes_per_sec,
            Self::Retrans => r.retrans_per_sec,
            Self::Naks => r.naks_per_sec,
            Self::Rnr => r.rnr_per_sec,
            Self::Cnp => r.cnp_rx_per_sec,
            Self::Rate => r.rate_bps as f64,
            Self::Alpha => r.alpha,
        }
    }
}

/// What one refresh shows: the interfaces, then the QPs in the asked order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct View {
    /// Seconds between the two snapshots the rates come from.
    pub interval_s: f64,
    /// The column the QPs are sorted by.
    pub sort: SortKey,
    /// Largest first.
    pub descending: bool,
    /// One row per interface, in the order the snapshots came.
    pub interfaces: Vec<IfaceRow>,
    /// One row per QP of every interface, sorted.
    pub qps: Vec<QpRow>,
}

/// The per-second rate of counter `name` between two sections (saturating at zero: a counter
/// that went back, because its map was recreated, reads as no traffic rather than a wrap).
fn rate(now: &Section, before: Option<&Section>, name: &str, secs: f64) -> f64 {
    let n = now.get(name).unwrap_or(0);
    let b = before.and_then(|s| s.get(name)).unwrap_or(0);
    n.saturating_sub(b) as f64 / secs
}

fn rate_sum(now: &Section, before: Option<&Section>, names: &[&str], secs: f64) -> f64 {
    names.iter().map(|n| rate(now, before, n, secs)).sum()
}

fn section<'a>(snap: &'a Snapshot, name: &str) -> Option<&'a Section> {
    snap.sections.iter().find(|s| s.name == name)
}

fn info<'a>(s: &'a Section, key: &str) -> Option<&'a str> {
    s.info
        .as_ref()
        .and_then(|i| i.labels.iter().find(|(k, _)| k == key))
        .map(|(_, v)| v.as_str())
}

fn label<'a>(s: &'a Section, key: &str) -> Option<&'a str> {
    s.labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The QP sections of a snapshot (those with a `qpn` label), with their QPN.
fn qp_sections(snap: &Snapshot) -> impl Iterator<Item = (u32, &Section)> {
    snap.sections
        .iter()
        .filter_map(|s| label(s, "qpn")?.parse().ok().map(|q| (q, s)))
}

/// The AF_XDP queue sections of a snapshot (those with a `queue` label).
fn queue_sections(snap: &Snapshot) -> impl Iterator<Item = &Section> {
    snap.sections.iter().filter(|s| label(s, "queue").is_some())
}

/// The rows of one interface, from its snapshot `now` and the one taken `secs` seconds before
/// (`None` on the first refresh: rates then count from zero). Call it once per interface and
/// refresh; `secs` is clamped away from zero.
#[must_use]
pub fn rows(now: &Snapshot, before: Option<&Snapshot>, secs: f64) -> (IfaceRow, Vec<QpRow>) {
    let secs = if secs.is_finite() && secs > 1e-6 {
        secs
    } else {
        1e-6
    };
    let empty = Section::new("");
    let xdp = section(now, "xdp").unwrap_or(&empty);
    let xdp_b = before.and_then(|b| section(b, "xdp"));
    let transport = section(now, "transport").unwrap_or(&empty);
    let transport_b = before.and_then(|b| section(b, "transport"));
    let cc = section(now, "cc").unwrap_or(&empty);
    let cc_b = before.and_then(|b| section(b, "cc"));
    let mut drops = Vec::new();
    for name in XdpStats::NAMES {
        let is_drop =
            name == "drop_foreign_qp" || DropReason::ALL.iter().any(|r| r.counter_name() == name);
        if is_drop {
            drops.push(Drop {
                reason: name,
                total: xdp.get(name).unwrap_or(0),
                per_sec: rate(xdp, xdp_b, name, secs),
            });
        }
    }
    let (mut tx_pps, mut tx_bytes) = (0.0, 0.0);
    for q in queue_sections(now) {
        let qb = before.and_then(|b| section(b, &q.name));
        tx_pps += rate(q, qb, XskStats::NAMES[2], secs);
        tx_bytes += rate(q, qb, XskStats::NAMES[3], secs);
    }
    let mut qps = Vec::new();
    for (qpn, s) in qp_sections(now) {
        let b = before.and_then(|b| section(b, &s.name));
        let gauge = |name: &str| s.get(name).unwrap_or(0);
        qps.push(QpRow {
            ifname: now.ifname.clone(),
            qpn,
            state: info(s, "state").unwrap_or("?").to_owned(),
            owner: info(s, "owner").unwrap_or("?").to_owned(),
            tx_pps: rate(s, b, "sent_pkts", secs),
            rx_pps: rate(s, b, "rcvd_pkts", secs),
            tx_bytes_per_sec: rate(s, b, "tx_payload_bytes", secs),
            rx_bytes_per_sec: rate(s, b, "rx_payload_bytes", secs),
            retrans_per_sec: rate(s, b, RETRY_COUNTER, secs),
            naks_per_sec: rate_sum(s, b, &NAK_COUNTERS, secs),
            rnr_per_sec: rate_sum(s, b, &RNR_COUNTERS, secs),
            cnp_rx_per_sec: rate_sum(s, b, &CNP_RX_COUNTERS, secs),
            cnp_tx_per_sec: rate(s, b, CNP_TX_COUNTER, secs),
            rate_bps: gauge("rate_bps"),
            alpha: gauge("alpha_1024") as f64 / 1024.0,
            tx_total: gauge("sent_pkts"),
            rx_total: gauge("rcvd_pkts"),
        });
    }
    let iface = IfaceRow {
        ifname: now.ifname.clone(),
        rx_pps: rate(xdp, xdp_b, "rx_packets", secs),
        rx_bytes_per_sec: rate(xdp, xdp_b, "rx_bytes", secs),
        redirected_pps: rate(xdp, xdp_b, "redirected", secs),
        tx_pps,
        tx_bytes_per_sec: tx_bytes,
        retrans_per_sec: rate(transport, transport_b, RETRY_COUNTER, secs),
        naks_per_sec: rate_sum(transport, transport_b, &NAK_COUNTERS, secs),
        rnr_per_sec: rate_sum(transport, transport_b, &RNR_COUNTERS, secs),
        cnp_rx_per_sec: rate(xdp, xdp_b, "cnp", secs),
        cnp_tx_per_sec: rate(cc, cc_b, CNP_TX_COUNTER, secs),
        drops_per_sec: drops.iter().map(|d| d.per_sec).sum(),
        qps: qps.len(),
        drops,
    };
    (iface, qps)
}

/// Sorts QP rows by `key` (largest first when `descending`), ties by interface and QPN so the
/// order is stable from one refresh to the next.
pub fn sort(qps: &mut [QpRow], key: SortKey, descending: bool) {
    qps.sort_by(|a, b| {
        let by_key = key.value(a).total_cmp(&key.value(b));
        let by_key = if descending { by_key.reverse() } else { by_key };
        by_key
            .then_with(|| a.ifname.cmp(&b.ifname))
            .then_with(|| a.qpn.cmp(&b.qpn))
    });
}

/// One refresh: every interface's `(now, before)` pair (`before` is `None` for an interface
/// seen for the first time), `secs` apart, sorted by `key`.
#[must_use]
pub fn view(
    pairs: &[(&Snapshot, Option<&Snapshot>)],
    secs: f64,
    key: SortKey,
    descending: bool,
) -> View {
    let mut interfaces = Vec::new();
    let mut qps = Vec::new();
    for (now, before) in pairs {
        let (i, q) = rows(now, *before, secs);
        interfaces.push(i);
        qps.extend(q);
    }
    sort(&mut qps, key, descending);
    View {
        interval_s: secs,
        sort: key,
        descending,
        interfaces,
        qps,
    }
}

/// A rate or count for a narrow column: `0`, `12.5`, `1.2k`, `3.40M`, `10.0G` (SI prefixes).
#[must_use]
pub fn human(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        return "0".to_owned();
    }
    let (scaled, unit) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if unit.is_empty() && scaled.fract() == 0.0 {
        format!("{scaled:.0}")
    } else if scaled >= 100.0 {
        format!("{scaled:.0}{unit}")
    } else {
        format!("{scaled:.1}{unit}")
    }
}

/// The headers of the interface table.
pub const IFACE_COLUMNS: [&str; 13] = [
    "IFACE", "RX pkt/s", "RX B/s", "REDIR/s", "TX pkt/s", "TX B/s", "RETX/s", "NAK/s", "RNR/s",
    "CNP rx/s", "CNP tx/s", "DROP/s", "QPs",
];

/// The cells of an interface's row, under [`IFACE_COLUMNS`].
#[must_use]
pub fn iface_cells(r: &IfaceRow) -> Vec<String> {
    let mut c = vec![r.ifname.clone()];
    c.extend(
        [
            r.rx_pps,
            r.rx_bytes_per_sec,
            r.redirected_pps,
            r.tx_pps,
            r.tx_bytes_per_sec,
            r.retrans_per_sec,
            r.naks_per_sec,
            r.rnr_per_sec,
            r.cnp_rx_per_sec,
            r.cnp_tx_per_sec,
            r.drops_per_sec,
        ]
        .map(human),
    );
    c.push(r.qps.to_string());
    c
}

/// The headers of the QP table.
pub const QP_COLUMNS: [&str; 14] = [
    "IFACE",
    "QPN",
    "STATE",
    "TX pkt/s",
    "RX pkt/s",
    "TX B/s",
    "RX B/s",
    "RETX/s",
    "NAK/s",
    "RNR/s",
    "CNP rx/s",
    "CNP tx/s",
    "DCQCN rate",
    "alpha",
];

impl SortKey {
    /// The column of [`QP_COLUMNS`] this key sorts by.
    #[must_use]
    pub const fn column(self) -> usize {
        match self {
            Self::Qpn => 1,
            Self::Tx => 3,
            Self::Rx => 4,
            Self::TxBytes => 5,
            Self::RxBytes => 6,
            Self::Retrans => 7,
            Self::Naks => 8,
            Self::Rnr => 9,
            Self::Cnp => 10,
            Self::Rate => 12,
            Self::Alpha => 13,
        }
    }
}

/// The cells of a QP's row, under [`QP_COLUMNS`]: the QPN in hex as `roce stats -s` names its
/// section, the DCQCN rate in bits/s with an SI prefix, α to three places.
#[must_use]
pub fn qp_cells(r: &QpRow) -> Vec<String> {
    let mut c = vec![
        r.ifname.clone(),
        format!("0x{:06x}", r.qpn),
        r.state.clone(),
    ];
    c.extend(
        [
            r.tx_pps,
            r.rx_pps,
            r.tx_bytes_per_sec,
            r.rx_bytes_per_sec,
            r.retrans_per_sec,
            r.naks_per_sec,
            r.rnr_per_sec,
            r.cnp_rx_per_sec,
            r.cnp_tx_per_sec,
        ]
        .map(human),
    );
    c.push(format!("{}bit/s", human(r.rate_bps as f64)));
    c.push(format!("{:.3}", r.alpha));
    c
}

/// The drop reasons of an interface that are not zero, as `name total (rate/s)`, or `none`.
#[must_use]
pub fn drops_line(r: &IfaceRow) -> String {
    let d: Vec<String> = r
        .drops
        .iter()
        .filter(|d| d.total != 0)
        .map(|d| format!("{} {} ({}/s)", d.reason, d.total, human(d.per_sec)))
        .collect();
    if d.is_empty() {
        "none".to_owned()
    } else {
        d.join(", ")
    }
}

/// Renders a table: the first `left` columns (names) aligned left, the numbers right.
fn table(out: &mut String, headers: &[&str], left: usize, rows: &[Vec<String>]) {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = w.get_mut(i) {
                *w = (*w).max(c.len());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let width = w.get(i).copied().unwrap_or(0);
            let sep = if i == 0 { "" } else { "  " };
            if i < left {
                l.push_str(&format!("{sep}{c:<width$}"));
            } else {
                l.push_str(&format!("{sep}{c:>width$}"));
            }
        }
        l.trim_end().to_owned()
    };
    out.push_str(&line(&mut headers.iter().copied()));
    out.push('\n');
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
        out.push('\n');
    }
}

/// The view as plain text, for `roce top` when its output is not a terminal: the interface
/// table, the drop reasons, the QP table.
#[must_use]
pub fn to_text(v: &View) -> String {
    let mut out = format!(
        "roce top: {} interface(s), {} QP(s), rates over {:.1} s, QPs sorted by {}{}\n",
        v.interfaces.len(),
        v.qps.len(),
        v.interval_s,
        v.sort.title(),
        if v.descending { " (descending)" } else { "" }
    );
    let rows: Vec<_> = v.interfaces.iter().map(iface_cells).collect();
    table(&mut out, &IFACE_COLUMNS, 1, &rows);
    for i in &v.interfaces {
        out.push_str(&format!("XDP drops {}: {}\n", i.ifname, drops_line(i)));
    }
    let rows: Vec<_> = v.qps.iter().map(qp_cells).collect();
    table(&mut out, &QP_COLUMNS, 3, &rows);
    out
}

#[cfg(test)]
mod tests {
    use roce_common::counters::{CcStats, QpCounters};

    use super::*;

    fn qp(qpn: u32, sent: u64, retry: u64, cnp_handled: u64, alpha: u64) -> Section {
        let c = QpCounters {
            sent_pkts: sent,
            rcvd_pkts: sent / 2,
            completer_retry_err: retry,
            rcvd_seq_err: retry,
            out_of_seq_request: 1,
            send_rnr_err: retry * 3,
            tx_payload_bytes: sent * 1000,
            rx_payload_bytes: sent * 10,
            ..Default::default()
        };
        let cc = CcStats {
            rp_cnp_handled: cnp_handled,
            rp_cnp_ignored: 1,
            np_cnp_sent: 2,
            ..Default::default()
        };
        Section::new(&format!("qp_0x{qpn:06x}"))
            .with_gauges(
                "qp",
                &["rate_bps", "target_bps", "alpha_1024"],
                &[],
                &[1_000_000_000, 2, alpha],
            )
            .with("qp_cc", &CcStats::NAMES, &CcStats::HELP, &cc.values())
            .with("qp", &QpCounters::NAMES, &QpCounters::HELP, &c.values())
            .label("qpn", &qpn.to_string())
            .info("qp", "", "state", "RTS")
            .info("qp", "", "owner", "42")
    }

    fn snap(ifname: &str, rx: u64, tx: u64, bad_tver: u64, qps: Vec<Section>) -> Snapshot {
        let x = XdpStats {
            rx_packets: rx,
            rx_bytes: rx * 100,
            cnp: rx / 10,
            drop_bad_tver: bad_tver,
            ..Default::default()
        };
        let q = XskStats {
            tx_packets: tx,
            tx_bytes: tx * 1000,
            ..Default::default()
        };
        let mut transport = QpCounters::default();
        let mut cc = CcStats::default();
        for s in &qps {
            for (n, v) in &s.counters {
                if let Some(t) = transport.get_mut(n) {
                    *t += v;
                }
                if let Some(t) = cc.get_mut(n) {
                    *t += v;
                }
            }
        }
        let mut sections = vec![
            Section::new("xdp").with("xdp", &XdpStats::NAMES, &XdpStats::HELP, &x.values()),
            Section::new("transport").with(
                "transport",
                &QpCounters::NAMES,
                &QpCounters::HELP,
                &transport.values(),
            ),
            Section::new("cc").with("cc", &CcStats::NAMES, &CcStats::HELP, &cc.values()),
            Section::new("xsk_q0")
                .with("xsk", &XskStats::NAMES, &XskStats::HELP, &q.values())
                .label("queue", "0"),
        ];
        sections.extend(qps);
        Snapshot {
            ifname: ifname.into(),
            sections,
        }
    }

    #[test]
    fn column_counters_exist() {
        for n in NAK_COUNTERS
            .iter()
            .chain(&RNR_COUNTERS)
            .chain([&RETRY_COUNTER])
        {
            assert!(QpCounters::NAMES.contains(n), "{n}");
        }
        for n in CNP_RX_COUNTERS.iter().chain([&CNP_TX_COUNTER]) {
            assert!(CcStats::NAMES.contains(n), "{n}");
        }
        assert_eq!(XskStats::NAMES[2], "tx_packets");
        assert_eq!(XskStats::NAMES[3], "tx_bytes");
    }

    /// Two snapshots two seconds apart: every interface and QP column is the counter's change
    /// over two seconds, the gauges are the current values, the drop reasons list every XDP
    /// drop counter with its total and rate.
    #[test]
    fn rates_from_two_snapshots() {
        let before = snap("veth0", 1000, 500, 4, vec![qp(17, 100, 1, 0, 0)]);
        let now = snap("veth0", 3000, 1500, 10, vec![qp(17, 300, 5, 8, 512)]);
        let (i, q) = rows(&now, Some(&before), 2.0);
        assert_eq!(i.ifname, "veth0");
        assert_eq!(i.rx_pps, 1000.0);
        assert_eq!(i.rx_bytes_per_sec, 100_000.0);
        assert_eq!(i.tx_pps, 500.0);
        assert_eq!(i.tx_bytes_per_sec, 500_000.0);
        assert_eq!(i.cnp_rx_per_sec, 100.0);
        assert_eq!(i.retrans_per_sec, 2.0);
        // rcvd_seq_err 1 -> 5; out_of_seq_request stays 1.
        assert_eq!(i.naks_per_sec, 2.0);
        assert_eq!(i.rnr_per_sec, 6.0);
        assert_eq!(i.cnp_tx_per_sec, 0.0);
        assert_eq!(i.drops_per_sec, 3.0);
        assert_eq!(i.qps, 1);
        let names: Vec<_> = i.drops.iter().map(|d| d.reason).collect();
        assert!(names.contains(&"drop_foreign_qp"));
        assert_eq!(names.len(), DropReason::ALL.len() + 1);
        let tver = i
            .drops
            .iter()
            .find(|d| d.reason == "drop_bad_tver")
            .unwrap();
        assert_eq!((tver.total, tver.per_sec), (10, 3.0));
        assert_eq!(q.len(), 1);
        let r = &q[0];
        assert_eq!(
            (r.qpn, r.state.as_str(), r.owner.as_str()),
            (17, "RTS", "42")
        );
        assert_eq!((r.tx_pps, r.rx_pps), (100.0, 50.0));
        // Payload bytes: 100,000 -> 300,000 sent and 1,000 -> 3,000 received in 2 s.
        assert_eq!(
            (r.tx_bytes_per_sec, r.rx_bytes_per_sec),
            (100_000.0, 1_000.0)
        );
        assert_eq!(r.retrans_per_sec, 2.0);
        assert_eq!(r.naks_per_sec, 2.0);
        assert_eq!(r.rnr_per_sec, 6.0);
        assert_eq!(r.cnp_rx_per_sec, 4.0);
        assert_eq!(r.cnp_tx_per_sec, 0.0);
        assert_eq!(r.rate_bps, 1_000_000_000);
        assert_eq!(r.alpha, 0.5);
        assert_eq!((r.tx_total, r.rx_total), (300, 150));
    }

    /// The first refresh has no earlier snapshot: rates count from zero; a counter that went
    /// back (a map recreated) reads as zero, never as a wrap to 2^64; a zero interval is
    /// clamped, not a division by zero.
    #[test]
    fn first_refresh_and_counters_that_went_back() {
        let now = snap("veth0", 10, 0, 0, vec![qp(17, 4, 0, 0, 0)]);
        let (i, q) = rows(&now, None, 1.0);
        assert_eq!(i.rx_pps, 10.0);
        assert_eq!(q[0].tx_pps, 4.0);
        let later = snap("veth0", 5, 0, 0, vec![qp(17, 2, 0, 0, 0)]);
        let (i, q) = rows(&later, Some(&now), 1.0);
        assert_eq!((i.rx_pps, q[0].tx_pps), (0.0, 0.0));
        let (i, _) = rows(&now, Some(&now), 0.0);
        assert!(i.rx_pps.is_finite());
        // A QP that appeared between the snapshots counts from zero.
        let two = snap(
            "veth0",
            10,
            0,
            0,
            vec![qp(17, 4, 0, 0, 0), qp(18, 6, 0, 0, 0)],
        );
        let (_, q) = rows(&two, Some(&now), 2.0);
        assert_eq!(
            q.iter().map(|r| (r.qpn, r.tx_pps)).collect::<Vec<_>>(),
            [(17, 0.0), (18, 3.0)]
        );
    }

    /// Sorting by each column, both ways, ties by interface and QPN; `<` and `>` walk every
    /// column and wrap.
    #[test]
    fn sorting() {
        let a0 = snap("a", 0, 0, 0, vec![qp(17, 0, 0, 0, 0), qp(18, 0, 0, 0, 0)]);
        let a1 = snap(
            "a",
            0,
            0,
            0,
            vec![qp(17, 10, 3, 0, 100), qp(18, 30, 0, 0, 900)],
        );
        let b0 = snap("b", 0, 0, 0, vec![qp(17, 0, 0, 0, 0)]);
        let b1 = snap("b", 0, 0, 0, vec![qp(17, 20, 1, 5, 10)]);
        let pairs = [(&a1, Some(&a0)), (&b1, Some(&b0))];
        let order = |key, desc| {
            view(&pairs, 1.0, key, desc)
                .qps
                .iter()
                .map(|r| format!("{}/{}", r.ifname, r.qpn))
                .collect::<Vec<_>>()
        };
        assert_eq!(order(SortKey::Tx, true), ["a/18", "b/17", "a/17"]);
        assert_eq!(order(SortKey::Tx, false), ["a/17", "b/17", "a/18"]);
        assert_eq!(order(SortKey::Retrans, true), ["a/17", "b/17", "a/18"]);
        assert_eq!(order(SortKey::Alpha, true), ["a/18", "a/17", "b/17"]);
        assert_eq!(order(SortKey::Cnp, true), ["b/17", "a/17", "a/18"]);
        // Equal keys (every rate the same): interface, then QPN.
        assert_eq!(order(SortKey::Rate, true), ["a/17", "a/18", "b/17"]);
        assert_eq!(order(SortKey::Qpn, false), ["a/17", "b/17", "a/18"]);
        let v = view(&pairs, 1.0, SortKey::Tx, true);
        assert_eq!(v.interfaces.len(), 2);
        assert_eq!(v.interfaces[0].qps, 2);
        let mut k = SortKey::Qpn;
        for _ in 0..SortKey::ALL.len() {
            assert_eq!(k.next().prev(), k);
            k = k.next();
        }
        assert_eq!(k, SortKey::Qpn);
        assert_eq!(SortKey::Qpn.prev(), SortKey::Alpha);
    }

    #[test]
    fn json_has_the_rows() {
        let a0 = snap("a", 0, 0, 0, vec![qp(17, 0, 0, 0, 0)]);
        let a1 = snap("a", 7, 0, 0, vec![qp(17, 10, 0, 0, 0)]);
        let v = serde_json::to_value(view(&[(&a1, Some(&a0))], 1.0, SortKey::Tx, true)).unwrap();
        assert_eq!(v["sort"], "tx");
        assert_eq!(v["interfaces"][0]["ifname"], "a");
        assert_eq!(v["interfaces"][0]["rx_pps"], 7.0);
        assert_eq!(v["qps"][0]["qpn"], 17);
        assert_eq!(v["qps"][0]["tx_pps"], 10.0);
        assert_eq!(v["interfaces"][0]["drops"][0]["reason"], "drop_foreign_qp");
    }

    /// The cells line up with their headers, the sort key names its own column, the text has
    /// both tables and the drop line.
    #[test]
    fn cells_and_text() {
        let a0 = snap("veth0", 0, 0, 0, vec![qp(17, 0, 0, 0, 0)]);
        let a1 = snap("veth0", 2000, 10, 3, vec![qp(17, 1500, 0, 0, 256)]);
        let v = view(&[(&a1, Some(&a0))], 1.0, SortKey::Tx, true);
        let i = iface_cells(&v.interfaces[0]);
        assert_eq!(i.len(), IFACE_COLUMNS.len());
        assert_eq!(&i[..2], ["veth0", "2.0k"]);
        let q = qp_cells(&v.qps[0]);
        assert_eq!(q.len(), QP_COLUMNS.len());
        assert_eq!(&q[..4], ["veth0", "0x000011", "RTS", "1.5k"]);
        assert_eq!(q[12], "1.0Gbit/s");
        assert_eq!(q[13], "0.250");
        for k in SortKey::ALL {
            assert_eq!(QP_COLUMNS[k.column()], k.title(), "{k:?}");
        }
        assert_eq!(drops_line(&v.interfaces[0]), "drop_bad_tver 3 (3/s)");
        let t = to_text(&v);
        assert!(
            t.contains("XDP drops veth0: drop_bad_tver 3 (3/s)\n"),
            "{t}"
        );
        let qp_line = t.lines().find(|l| l.contains("0x000011")).unwrap();
        assert!(qp_line.starts_with("veth0  0x000011  RTS"), "{t}");
        assert_eq!(
            t.lines().filter(|l| l.starts_with("IFACE")).count(),
            2,
            "{t}"
        );
    }

    #[test]
    fn human_numbers() {
        assert_eq!(human(0.0), "0");
        assert_eq!(human(-1.0), "0");
        assert_eq!(human(f64::NAN), "0");
        assert_eq!(human(7.0), "7");
        assert_eq!(human(2.5), "2.5");
        assert_eq!(human(1234.0), "1.2k");
        assert_eq!(human(345_600.0), "346k");
        assert_eq!(human(3_400_000.0), "3.4M");
        assert_eq!(human(10e9), "10.0G");
    }
}
