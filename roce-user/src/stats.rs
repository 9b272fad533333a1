//! Counter snapshots, deltas and rates, and their rendering as `ethtool -S` style text, JSON and
//! Prometheus exposition text.
//!
//! Pure: the caller reads the counters (from pinned maps, the engine, the transport) and hands
//! them over as sections of `(name, value)` pairs whose names and help texts come from the counter
//! structs' `NAMES` and `HELP` tables, so there is one source of truth for every name.

pub mod top;

use std::{collections::HashMap, fmt::Write as _};

/// How Prometheus is to read a value (exposition format `# TYPE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until the process or map that keeps it restarts): rendered `..._total`.
    Counter,
    /// A current value that goes up and down (a rate, a level).
    Gauge,
}

/// What the Prometheus exposition needs about one value besides its name and number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Metric family: the part of the metric name between `roce_` and the counter name
    /// (`xdp`, `transport`, `qp`, ...), shared by every interface, queue and QP so that they
    /// differ only in their labels.
    pub family: String,
    /// The one-line help (the counter struct's `HELP` entry), or empty.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
}

/// A named group of counters, for example `xdp` or `qp 0x000011`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Section {
    /// Section name.
    pub name: String,
    /// Labels for Prometheus (the section name is not one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<(String, String)>,
    /// Counters in their struct's field order.
    pub counters: Vec<(&'static str, u64)>,
    /// One entry per counter, in the same order: family, help and kind for Prometheus.
    #[serde(skip)]
    pub meta: Vec<Meta>,
    /// Attributes that may change while the counters go on (a QP's state), for Prometheus.
    #[serde(skip)]
    pub info: Option<Info>,
}

/// Attributes of a section that may change while its counters go on (a QP's state): in
/// Prometheus the labels of an info gauge `roce_<family>_info{<section labels>,<these>} 1`
/// rather than labels of every counter, whose series would otherwise restart at each change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// Metric family (`qp` gives `roce_qp_info`).
    pub family: String,
    /// The info gauge's help text.
    pub help: &'static str,
    /// The attributes, as labels.
    pub labels: Vec<(String, String)>,
}

impl Section {
    /// A section without counters yet; add them with [`Section::with`] and
    /// [`Section::with_gauges`].
    #[must_use]
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            labels: Vec::new(),
            counters: Vec::new(),
            meta: Vec::new(),
            info: None,
        }
    }

    /// A section from a counter struct's `NAMES` and `values()`, without help texts; its
    /// Prometheus family is the section name.
    #[must_use]
    pub fn from_names(name: &str, names: &[&'static str], values: &[u64]) -> Self {
        let family = sanitize(name);
        Self::new(name).push(&family, names, &[], values, Kind::Counter)
    }

    /// Appends counters from a counter struct's `NAMES`, `HELP` and `values()`, in the
    /// Prometheus family `family`.
    #[must_use]
    pub fn with(
        self,
        family: &str,
        names: &[&'static str],
        help: &[&'static str],
        values: &[u64],
    ) -> Self {
        self.push(family, names, help, values, Kind::Counter)
    }

    /// Appends gauges (current values, not counts), in the Prometheus family `family`.
    #[must_use]
    pub fn with_gauges(
        self,
        family: &str,
        names: &[&'static str],
        help: &[&'static str],
        values: &[u64],
    ) -> Self {
        self.push(family, names, help, values, Kind::Gauge)
    }

    fn push(
        mut self,
        family: &str,
        names: &[&'static str],
        help: &[&'static str],
        values: &[u64],
        kind: Kind,
    ) -> Self {
        for (i, (n, v)) in names.iter().zip(values).enumerate() {
            self.counters.push((n, *v));
            self.meta.push(Meta {
                family: family.to_owned(),
                help: help.get(i).copied().unwrap_or(""),
                kind,
            });
        }
        self
    }

    /// Adds a Prometheus label.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds an attribute that may change while the counters go on, rendered in Prometheus as
    /// a label of the info gauge `roce_<family>_info` (value 1), described by `help`.
    #[must_use]
    pub fn info(mut self, family: &str, help: &'static str, key: &str, value: &str) -> Self {
        self.info
            .get_or_insert_with(|| Info {
                family: family.to_owned(),
                help,
                labels: Vec::new(),
            })
            .labels
            .push((key.to_owned(), value.to_owned()));
        self
    }

    /// The value of `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
}

/// Counters of one interface at one moment.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Interface.
    pub ifname: String,
    /// Sections, in display order.
    pub sections: Vec<Section>,
}

impl Snapshot {
    /// `self - earlier`, per counter (saturating; sections matched by name).
    #[must_use]
    pub fn delta(&self, earlier: &Self) -> Self {
        let sections = self
            .sections
            .iter()
            .map(|s| {
                let before = earlier.sections.iter().find(|e| e.name == s.name);
                let counters = s
                    .counters
                    .iter()
                    .map(|(n, v)| {
                        let old = before.and_then(|b| b.get(n)).unwrap_or(0);
                        (*n, v.saturating_sub(old))
                    })
                    .collect();
                Section {
                    name: s.name.clone(),
                    labels: s.labels.clone(),
                    counters,
                    meta: s.meta.clone(),
                    info: s.info.clone(),
                }
            })
            .collect();
        Self {
            ifname: self.ifname.clone(),
            sections,
        }
    }

    /// Renders `ethtool -S` style text: a header line, then `     name: value` per counter.
    /// With `only_nonzero`, counters at zero are left out.
    #[must_use]
    pub fn to_text(&self, only_nonzero: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "RoCE statistics for {}:", self.ifname);
        for s in &self.sections {
            let _ = writeln!(out, "  {}:", s.name);
            for (n, v) in &s.counters {
                if !only_nonzero || *v != 0 {
                    let _ = writeln!(out, "     {n}: {v}");
                }
            }
        }
        out
    }

    /// Renders text with per-second rates next to the delta over `secs`.
    #[must_use]
    pub fn to_rate_text(&self, earlier: &Self, secs: f64) -> String {
        let d = self.delta(earlier);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "RoCE statistics for {} (over {secs:.1} s):",
            self.ifname
        );
        for s in &d.sections {
            let _ = writeln!(out, "  {}:", s.name);
            for (n, v) in &s.counters {
                if *v != 0 {
                    let rate = *v as f64 / secs.max(f64::EPSILON);
                    let _ = writeln!(out, "     {n}: {v} ({rate:.1}/s)");
                }
            }
        }
        out
    }

    /// Renders JSON: `{"ifname": .., "<section>": {"<name>": value, ..}, ..}`.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("ifname".into(), self.ifname.clone().into());
        for s in &self.sections {
            let mut inner = serde_json::Map::new();
            for (n, v) in &s.counters {
                inner.insert((*n).to_owned(), (*v).into());
            }
            obj.insert(s.name.clone(), inner.into());
        }
        obj.into()
    }

    /// Renders Prometheus exposition text for this interface alone; see [`prometheus`].
    #[must_use]
    pub fn to_prometheus(&self) -> String {
        prometheus(std::slice::from_ref(self))
    }
}

/// Renders the counters of any number of interfaces as one Prometheus exposition page (text
/// format 0.0.4): one family per metric, each introduced once by its `# HELP` and `# TYPE`
/// lines and followed by its samples for every interface, queue and QP, which differ only in
/// their labels (`ifname`, then the section's: `queue`, `qpn`, ...). Counters are named
/// `roce_<family>_<name>_total`, gauges `roce_<family>_<name>`.
///
/// Call it with every snapshot of one scrape: a family split over two calls would repeat its
/// `# TYPE` line, which the format forbids.
#[must_use]
pub fn prometheus(snapshots: &[Snapshot]) -> String {
    struct Family {
        metric: String,
        help: String,
        kind: Kind,
        samples: String,
    }
    let mut families: Vec<Family> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for snap in snapshots {
        for s in &snap.sections {
            let mut labels = format!("ifname=\"{}\"", escape(&snap.ifname));
            for (k, val) in &s.labels {
                let _ = write!(labels, ",{}=\"{}\"", sanitize(k), escape(val));
            }
            let mut add = |metric: String, help: String, kind: Kind, labels: &str, v: u64| {
                let at = *index.entry(metric.clone()).or_insert_with(|| {
                    families.push(Family {
                        metric,
                        help,
                        kind,
                        samples: String::new(),
                    });
                    families.len() - 1
                });
                let f = &mut families[at];
                let _ = writeln!(f.samples, "{}{{{labels}}} {v}", f.metric);
            };
            if let Some(Info {
                family,
                help,
                labels: attrs,
            }) = &s.info
            {
                let mut all = labels.clone();
                for (k, val) in attrs {
                    let _ = write!(all, ",{}=\"{}\"", sanitize(k), escape(val));
                }
                let family = sanitize(family);
                add(
                    format!("roce_{family}_info"),
                    escape_help(help),
                    Kind::Gauge,
                    &all,
                    1,
                );
            }
            for (i, (n, v)) in s.counters.iter().enumerate() {
                let (family, help, kind) = s.meta.get(i).map_or_else(
                    || (sanitize(&s.name), "", Kind::Counter),
                    |m| (sanitize(&m.family), m.help, m.kind),
                );
                let suffix = if kind == Kind::Counter { "_total" } else { "" };
                let help = if help.is_empty() {
                    format!("roce-xdp {family} {n}")
                } else {
                    escape_help(help)
                };
                add(
                    format!("roce_{family}_{}{suffix}", sanitize(n)),
                    help,
                    kind,
                    &labels,
                    *v,
                );
            }
        }
    }
    let mut out = String::new();
    for f in &families {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {}", f.metric, f.help);
        let _ = writeln!(out, "# TYPE {} {kind}", f.metric);
        out.push_str(&f.samples);
    }
    out
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Escapes a `# HELP` text (exposition format: backslash and line feed).
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Escapes a label value (exposition format: backslash, double quote and line feed).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use roce_common::counters::XdpStats;

    use super::*;

    fn snap(rx: u64) -> Snapshot {
        let s = XdpStats {
            rx_packets: rx,
            cnp: 2,
            ..Default::default()
        };
        Snapshot {
            ifname: "veth0".into(),
            sections: vec![Section::from_names("xdp", &XdpStats::NAMES, &s.values())],
        }
    }

    #[test]
    fn text_is_ethtool_style() {
        let t = snap(5).to_text(false);
        assert!(
            t.starts_with("RoCE statistics for veth0:\n  xdp:\n     rx_packets: 5\n"),
            "{t}"
        );
        assert!(t.contains("     drop_bad_tver: 0\n"));
        let nz = snap(5).to_text(true);
        assert!(!nz.contains("drop_bad_tver"));
        assert!(nz.contains("     cnp: 2\n"));
    }

    #[test]
    fn json_has_every_counter() {
        let j = snap(7).to_json();
        assert_eq!(j["ifname"], "veth0");
        assert_eq!(j["xdp"]["rx_packets"], 7);
        assert_eq!(j["xdp"].as_object().unwrap().len(), XdpStats::COUNT);
    }

    #[test]
    fn delta_and_rate() {
        let d = snap(10).delta(&snap(4));
        assert_eq!(d.sections[0].get("rx_packets"), Some(6));
        assert_eq!(d.sections[0].get("cnp"), Some(0));
        let r = snap(10).to_rate_text(&snap(4), 2.0);
        assert!(r.contains("rx_packets: 6 (3.0/s)"), "{r}");
    }

    #[test]
    fn prometheus_lines() {
        let p = Snapshot {
            ifname: "ve\"th".into(),
            sections: vec![Section::from_names("qp 17", &["sent_pkts"], &[3]).label("qpn", "17")],
        };
        let t = p.to_prometheus();
        assert!(
            t.starts_with(
                "# HELP roce_qp_17_sent_pkts_total roce-xdp qp_17 sent_pkts\n\
                 # TYPE roce_qp_17_sent_pkts_total counter\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("roce_qp_17_sent_pkts_total{ifname=\"ve\\\"th\",qpn=\"17\"} 3\n"),
            "{t}"
        );
    }

    /// Several interfaces, queues and QPs on one page: each family once with its HELP and TYPE
    /// (from the counter struct), its samples told apart by labels; gauges without `_total`; the
    /// same counter name in two families stays two metrics.
    #[test]
    fn prometheus_page_groups_families() {
        let snap = |ifname: &str, rx: u64| Snapshot {
            ifname: ifname.into(),
            sections: vec![
                Section::new("xdp").with(
                    "xdp",
                    &XdpStats::NAMES,
                    &XdpStats::HELP,
                    &XdpStats {
                        rx_packets: rx,
                        ..Default::default()
                    }
                    .values(),
                ),
                Section::new("qp_0x000011")
                    .with_gauges("qp", &["rate_bps"], &["Current rate."], &[100])
                    .with("qp_cc", &["np_ecn_marked_roce_packets"], &["cc help"], &[1])
                    .with("qp", &["np_ecn_marked_roce_packets"], &["qp help"], &[2])
                    .label("qpn", "17")
                    .info("qp", "QP attributes.", "state", "RTS"),
            ],
        };
        let t = prometheus(&[snap("a", 5), snap("b", 6)]);
        let help = format!(
            "# HELP roce_xdp_rx_packets_total {}\n# TYPE roce_xdp_rx_packets_total counter\n",
            XdpStats::HELP[0]
        );
        assert_eq!(XdpStats::NAMES[0], "rx_packets");
        assert_eq!(t.matches(&help).count(), 1, "{t}");
        assert!(
            t.contains(&format!(
                "{help}roce_xdp_rx_packets_total{{ifname=\"a\"}} 5\n\
                 roce_xdp_rx_packets_total{{ifname=\"b\"}} 6\n"
            )),
            "{t}"
        );
        assert_eq!(t.matches("# TYPE roce_qp_rate_bps gauge\n").count(), 1);
        assert!(t.contains("roce_qp_rate_bps{ifname=\"b\",qpn=\"17\"} 100\n"));
        assert!(
            t.contains("roce_qp_cc_np_ecn_marked_roce_packets_total{ifname=\"a\",qpn=\"17\"} 1\n")
        );
        assert!(
            t.contains("roce_qp_np_ecn_marked_roce_packets_total{ifname=\"a\",qpn=\"17\"} 2\n")
        );
        assert!(t.contains(
            "# HELP roce_qp_info QP attributes.\n# TYPE roce_qp_info gauge\n\
             roce_qp_info{ifname=\"a\",qpn=\"17\",state=\"RTS\"} 1\n"
        ));
        assert!(
            !t.contains("state=\"RTS\"} 2"),
            "the state is not a label of counters"
        );
        assert_eq!(t.matches("# TYPE ").count(), XdpStats::COUNT + 4);
    }
}
