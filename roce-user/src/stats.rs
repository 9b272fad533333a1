//! Counter snapshots, deltas and rates, and their rendering as `ethtool -S` style text, JSON and
//! Prometheus exposition text.
//!
//! Pure: the caller reads the counters (from pinned maps, the engine, the transport) and hands
//! them over as sections of `(name, value)` pairs whose names come from the counter structs'
//! `NAMES` tables, so there is one source of truth for every name.

use std::fmt::Write as _;

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
}

impl Section {
    /// A section from a counter struct's `NAMES` and `values()`.
    #[must_use]
    pub fn from_names(name: &str, names: &[&'static str], values: &[u64]) -> Self {
        Self {
            name: name.to_owned(),
            labels: Vec::new(),
            counters: names.iter().copied().zip(values.iter().copied()).collect(),
        }
    }

    /// Adds a Prometheus label.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_owned(), value.to_owned()));
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

    /// Renders Prometheus exposition text: `roce_<section>_<name>_total{ifname=..,..} value`.
    #[must_use]
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        for s in &self.sections {
            let section = sanitize(&s.name);
            for (n, v) in &s.counters {
                let metric = format!("roce_{section}_{n}_total");
                let _ = writeln!(out, "# TYPE {metric} counter");
                let mut labels = format!("ifname=\"{}\"", escape(&self.ifname));
                for (k, val) in &s.labels {
                    let _ = write!(labels, ",{}=\"{}\"", sanitize(k), escape(val));
                }
                let _ = writeln!(out, "{metric}{{{labels}}} {v}");
            }
        }
        out
    }
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
            t.contains("# TYPE roce_qp_17_sent_pkts_total counter\n"),
            "{t}"
        );
        assert!(
            t.contains("roce_qp_17_sent_pkts_total{ifname=\"ve\\\"th\",qpn=\"17\"} 3\n"),
            "{t}"
        );
    }
}
