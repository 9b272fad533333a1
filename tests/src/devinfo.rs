//! `ibv_devinfo -v` of the drop-in libibverbs compared field by field with Linux Soft-RoCE's:
//! every field must be equal, or be one of the differences listed in [`EXPLAINED`] with its
//! reason. A field that differs and is not listed fails the comparison, so a new difference
//! has to be explained here before it lands.

use std::{collections::BTreeMap, fmt::Write as _};

/// Fields that may differ from rxe's, and why. Keys are `ibv_devinfo -v`'s, prefixed with
/// `port.` for the fields of port 1.
pub const EXPLAINED: &[(&str, &str)] = &[
    (
        "hca_id",
        "device name: rxe numbers its devices (rxe0); ours carry the interface (roce_<ifname>)",
    ),
    (
        "fw_ver",
        "rxe reports 0.0.0; ours names the library and its version",
    ),
    (
        "node_guid",
        "each side's own MAC as a modified EUI-64, by the same rule (checked)",
    ),
    ("sys_image_guid", "as node_guid"),
    (
        "max_qp",
        "the limits the engine enforces (DeviceConfig), not rxe's module parameters",
    ),
    ("max_qp_wr", "engine limit (DeviceConfig::max_qp_wr)"),
    ("max_cq", "engine limit (DeviceConfig::max_cq)"),
    ("max_cqe", "engine limit (DeviceConfig::max_cqe)"),
    ("max_mr", "engine limit (DeviceConfig::max_mr)"),
    ("max_pd", "engine limit (DeviceConfig::max_pd)"),
    (
        "max_qp_rd_atom",
        "engine limit (DeviceConfig::max_qp_rd_atom): the responder's READ/atomic resources per QP",
    ),
    ("max_qp_init_rd_atom", "as max_qp_rd_atom"),
    ("max_res_rd_atom", "max_qp x max_qp_rd_atom of the engine"),
    (
        "device_cap_flags",
        "rxe also claims bad P_Key/Q_Key counters, automatic path migration, changing the \
         physical port, UD AV port enforcement, port-active events, SRQ resize and memory \
         management extensions; ours claims what the engine does (RNR NAK generation, a system \
         image GUID, memory windows of type 1 and 2B)",
    ),
    ("device_cap_flags_ex", "as device_cap_flags"),
    (
        "max_mw",
        "engine limit: the window table is as large as the region table (DeviceConfig::max_mr)",
    ),
    (
        "max_mcast_grp",
        "no multicast (UD multicast groups are not offered)",
    ),
    ("max_mcast_qp_attach", "no multicast"),
    ("max_total_mcast_qp_attach", "no multicast"),
    (
        "max_ah",
        "address handles: the engine's own count, or 0 while UD address handles are not offered",
    ),
    (
        "max_srq",
        "shared receive queues: the engine's own limits, or 0 while they are not offered",
    ),
    ("max_srq_wr", "as max_srq (printed only when max_srq > 0)"),
    ("max_srq_sge", "as max_srq (printed only when max_srq > 0)"),
    (
        "max_pkeys",
        "one P_Key, the default 0xffff, is all RoCE uses; rxe sizes a table of 64",
    ),
    (
        "port.max_mtu",
        "rxe always says 4096; ours says what the link's MTU carries (1024 on a 1500-byte link)",
    ),
    (
        "port.max_msg_sz",
        "rxe's 8 MiB limit; the engine takes messages up to 2 GiB, the verbs maximum",
    ),
    (
        "port.gid_tbl_len",
        "rxe has 1024 slots; ours lists the interface's addresses, so the table is as long as \
         the list",
    ),
    (
        "port.GID",
        "each side lists its own interface's addresses (all RoCE v2, checked); rxe also has \
         the tap's IPv6 link-local address",
    ),
];

/// One side's `ibv_devinfo -v`: field → value, port fields prefixed with `port.`, GIDs as
/// `port.GID` (joined), device capability flag names dropped (the number is compared).
#[must_use]
pub fn parse(out: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut in_port = false;
    let mut gids = Vec::new();
    for line in out.lines() {
        let t = line.trim();
        if t.starts_with("port:") {
            in_port = true;
            continue;
        }
        if let Some(rest) = t.strip_prefix("GID[") {
            if let Some((_, v)) = rest.split_once(':') {
                gids.push(v.trim().to_owned());
            }
            continue;
        }
        let Some((k, v)) = t.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        // Sub-headings (odp caps, tso_caps, ...) and flag names carry no value of their own.
        if k.is_empty() || k.contains(' ') {
            continue;
        }
        let key = if in_port {
            format!("port.{k}")
        } else {
            k.to_owned()
        };
        fields.entry(key).or_insert_with(|| v.to_owned());
    }
    if !gids.is_empty() {
        fields.insert("port.GID".into(), gids.join("; "));
    }
    fields
}

/// The comparison of two `ibv_devinfo -v` outputs.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Fields equal on both sides.
    pub equal: Vec<String>,
    /// Fields that differ with a reason: (field, rxe's, ours, reason).
    pub explained: Vec<(String, String, String, &'static str)>,
    /// Fields that differ with no reason listed: (field, rxe's, ours).
    pub unexplained: Vec<(String, String, String)>,
}

impl Comparison {
    /// The report written next to the interop results.
    #[must_use]
    pub fn text(&self) -> String {
        let mut s = format!(
            "ibv_devinfo -v: {} fields equal, {} explained differences, {} unexplained\n",
            self.equal.len(),
            self.explained.len(),
            self.unexplained.len()
        );
        for (k, r, o, why) in &self.explained {
            let _ = writeln!(s, "  {k}: rxe {r:?}, ours {o:?}: {why}");
        }
        for (k, r, o) in &self.unexplained {
            let _ = writeln!(s, "  UNEXPLAINED {k}: rxe {r:?}, ours {o:?}");
        }
        let _ = writeln!(s, "  equal: {}", self.equal.join(", "));
        s
    }
}

/// Compares rxe's `ibv_devinfo -v` with ours, field by field.
#[must_use]
pub fn compare(rxe: &str, ours: &str) -> Comparison {
    let (r, o) = (parse(rxe), parse(ours));
    let mut c = Comparison::default();
    let keys: std::collections::BTreeSet<&String> = r.keys().chain(o.keys()).collect();
    let missing = String::from("(absent)");
    for k in keys {
        let (rv, ov) = (r.get(k).unwrap_or(&missing), o.get(k).unwrap_or(&missing));
        if rv == ov {
            c.equal.push(k.clone());
        } else if let Some((_, why)) = EXPLAINED.iter().find(|(e, _)| e == k) {
            c.explained.push((k.clone(), rv.clone(), ov.clone(), why));
        } else {
            c.unexplained.push((k.clone(), rv.clone(), ov.clone()));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sections_and_gids_are_parsed() {
        let out = "hca_id:\trxe0\n\ttransport:\t\tInfiniBand (0)\n\tdevice_cap_flags:\t0x1\n\
                   \t\t\t\t\tBAD_PKEY_CNTR\n\trc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\
                   \t\tport:\t1\n\t\t\tstate:\t\tPORT_ACTIVE (4)\n\
                   \t\t\tGID[  0]:\t\tfe80::1, RoCE v2\n\t\t\tGID[  1]:\t\t::ffff:10.0.0.2, RoCE v2\n";
        let f = parse(out);
        assert_eq!(f["hca_id"], "rxe0");
        assert_eq!(f["transport"], "InfiniBand (0)");
        assert_eq!(f["device_cap_flags"], "0x1");
        assert_eq!(f["port.state"], "PORT_ACTIVE (4)");
        assert_eq!(f["port.GID"], "fe80::1, RoCE v2; ::ffff:10.0.0.2, RoCE v2");
        assert!(!f.contains_key("BAD_PKEY_CNTR"));
        let c = compare(out, &out.replace("rxe0", "roce_x").replace("(4)", "(1)"));
        assert_eq!(c.explained.len(), 1);
        assert_eq!(c.unexplained.len(), 1);
        assert_eq!(c.unexplained[0].0, "port.state");
    }
}
