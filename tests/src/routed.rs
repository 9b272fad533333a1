//! Two endpoints joined through a router namespace whose egress interfaces run `roce impair`
//! (AF_XDP transmit skips the sender's own tc egress, so faults sit on the router), cleaned up
//! on drop even when the test fails: roce_impair's links and pins on the router, roce_xdp on
//! the ends, then the namespaces. tests/tests/fault_matrix.rs and tests/tests/cm_faults.rs
//! use it.

use roce::netns::{Routed, VethEnd, VethOptions};
use roce_common::impair::ImpairStats;
use serde_json::Value;

use crate::{
    child::{args, finish, json_ok, spawn},
    require_root, roce_bin, tag,
};

/// `roce --netns ns <line> -j`, which must succeed; its JSON.
///
/// # Panics
/// When it fails or prints no JSON.
#[track_caller]
pub fn roce_json(ns: &str, line: &str) -> Value {
    json_ok(&finish(spawn(ns, &args(line))), line)
}

/// Removes `roce impair` from the router and `roce_xdp` from both endpoints on drop; the
/// namespaces go with [`Routed`]'s own drop, which runs after this one.
struct Guard {
    impaired: Vec<(String, String)>,
    loaded: Vec<(String, String)>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for (ns, ifname) in &self.impaired {
            let _ = std::process::Command::new(roce_bin())
                .args(["--netns", ns, "impair", "-i", ifname, "--off"])
                .output();
        }
        for (ns, ifname) in &self.loaded {
            let _ = std::process::Command::new(roce_bin())
                .args(["--netns", ns, "unload", "-i", ifname])
                .output();
        }
    }
}

/// A client, a router and a server (`Routed` with one sender), with what the test attached
/// removed on drop.
pub struct Impaired {
    // Field order: the guard cleans up before the namespaces go.
    guard: Guard,
    /// The topology.
    pub net: Routed,
}

impl Impaired {
    /// Client `<tag>-h0`, router `<tag>-r`, server `<tag>-d`, at `10.<subnet>.1.0/24` (client
    /// side) and `10.<subnet>.100.0/24` (server side), links of `mtu` bytes; `name` gets the
    /// process's [`tag`].
    ///
    /// # Panics
    /// When not root, or an `ip` command fails.
    #[must_use]
    pub fn new(name: &str, subnet: u8, mtu: u32) -> Self {
        require_root();
        let net = Routed::new(
            &tag(name),
            1,
            &VethOptions {
                mtu,
                subnet,
                ..VethOptions::default()
            },
        )
        .expect("routed topology");
        Self {
            guard: Guard {
                impaired: Vec::new(),
                loaded: Vec::new(),
            },
            net,
        }
    }

    /// The client end (the router's sender side).
    #[must_use]
    pub fn client(&self) -> &VethEnd {
        &self.net.senders[0]
    }

    /// The server end.
    #[must_use]
    pub fn server(&self) -> &VethEnd {
        &self.net.receiver
    }

    /// The router's interface towards the server: its egress carries what the client sends.
    #[must_use]
    pub fn to_server(&self) -> String {
        self.net.bottleneck_if.clone()
    }

    /// The router's interface towards the client: its egress carries what the server sends.
    #[must_use]
    pub fn to_client(&self) -> String {
        self.net.sender_side_ifs[0].clone()
    }

    /// Loads roce_xdp on both ends with `roce load` (it stays across the processes the test
    /// runs, so the ends' counters accumulate in the pins).
    ///
    /// # Panics
    /// When a load fails.
    pub fn load(&mut self) {
        for end in [self.client().clone(), self.server().clone()] {
            self.unload_on_drop(&end);
            roce_json(&end.netns, &format!("load -i {}", end.ifname));
        }
    }

    /// Unloads roce_xdp from `end` on drop (for what a process the test runs loads there).
    pub fn unload_on_drop(&mut self, end: &VethEnd) {
        let e = (end.netns.clone(), end.ifname.clone());
        if !self.guard.loaded.contains(&e) {
            self.guard.loaded.push(e);
        }
    }

    /// `roce impair -i <ifname> <settings>` on the router (attached, or its settings replaced);
    /// its JSON.
    ///
    /// # Panics
    /// When it fails.
    pub fn impair(&mut self, ifname: &str, settings: &str) -> Value {
        let e = (self.net.router_netns.clone(), ifname.to_owned());
        if !self.guard.impaired.contains(&e) {
            self.guard.impaired.push(e);
        }
        roce_json(
            &self.net.router_netns,
            &format!("impair -i {ifname} {settings}"),
        )
    }

    /// roce_impair's counters on the router's `ifname` (`roce impair --show`).
    ///
    /// # Panics
    /// When it is not attached there, or a counter is missing.
    #[must_use]
    pub fn impair_stats(&self, ifname: &str) -> ImpairStats {
        let v = roce_json(
            &self.net.router_netns,
            &format!("impair -i {ifname} --show"),
        );
        let mut st = ImpairStats::default();
        for name in ImpairStats::NAMES {
            *st.get_mut(name)
                .unwrap_or_else(|| panic!("no counter {name}")) = v["impair"][name]
                .as_u64()
                .unwrap_or_else(|| panic!("impair --show has no {name}: {v}"));
        }
        st
    }
}
