//! Endpoint lifecycle: SIGTERM and SIGINT flush the QPs, detach what the process attached and
//! remove its pins; after SIGKILL, `roce unload` recovers the interface, and a restarted
//! endpoint serves again. Root; namespaces made here.

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use roce::{
    loader::pin_dir,
    netns::{self, VethOptions, VethPair},
};
use roce_tests::{Loaded, require_root, roce, roce_bin, roce_ok, tag, veth_pair};

struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(ns: &str, args: &str) -> Reaper {
    Reaper(
        Command::new(roce_bin())
            .args(["--netns", ns])
            .args(args.split_whitespace())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn roce"),
    )
}

fn signal(c: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

/// Waits up to `limit` for the child to exit; returns its exit code.
fn wait_exit(r: &mut Reaper, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = r.0.try_wait().unwrap() {
            return st.code();
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

fn xdp_attached(ns: &str, ifname: &str) -> bool {
    let o = netns::ip_in(ns, &["-d", "link", "show", "dev", ifname]).unwrap();
    String::from_utf8_lossy(&o.stdout).contains("prog/xdp")
}

#[test]
fn sigterm_while_waiting_for_a_peer_leaves_nothing_behind() {
    require_root();
    let pair = VethPair::new(
        &tag("lt"),
        &VethOptions {
            subnet: 91,
            ..VethOptions::default()
        },
    )
    .unwrap();
    let b = pair.b.clone();
    let mut server = spawn(&b.netns, &format!("pingpong -d {}", b.ifname));
    wait_for(
        "the server to load roce_xdp",
        Duration::from_secs(10),
        || xdp_attached(&b.netns, &b.ifname),
    );
    thread::sleep(Duration::from_millis(300)); // now blocked in accept()
    signal(&server.0, nix::sys::signal::Signal::SIGTERM);
    let code = wait_exit(&mut server, Duration::from_secs(8));
    assert_eq!(code, Some(130), "exit code after SIGTERM");
    assert!(!pin_dir(&b.ifname).exists(), "pins left behind");
    assert!(
        !xdp_attached(&b.netns, &b.ifname),
        "XDP program left attached"
    );
}

#[test]
fn sigint_mid_transfer_flushes_and_detaches() {
    require_root();
    let pair = VethPair::new(
        &tag("li"),
        &VethOptions {
            subnet: 92,
            ..VethOptions::default()
        },
    )
    .unwrap();
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let mut server = spawn(
        &b.netns,
        &format!("perf write -D 30 -s 65536 -d {}", b.ifname),
    );
    thread::sleep(Duration::from_millis(500));
    let mut client = spawn(
        &a.netns,
        &format!("perf write -D 30 -s 65536 -d {} {}", a.ifname, b.ipv4),
    );
    wait_for("traffic", Duration::from_secs(10), || {
        Command::new(roce_bin())
            .args(["stats", "-j", "-i", &b.ifname])
            .output()
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v["xdp"]["redirected"].as_u64())
            .is_some_and(|n| n > 1000)
    });
    signal(&client.0, nix::sys::signal::Signal::SIGINT);
    signal(&server.0, nix::sys::signal::Signal::SIGINT);
    for (who, r) in [("client", &mut client), ("server", &mut server)] {
        let code = wait_exit(r, Duration::from_secs(8));
        assert!(
            matches!(code, Some(130) | Some(1)),
            "{who} exit code {code:?}"
        );
    }
    for end in [&a, &b] {
        assert!(
            !pin_dir(&end.ifname).exists(),
            "pins left on {}",
            end.ifname
        );
        assert!(
            !xdp_attached(&end.netns, &end.ifname),
            "XDP left on {}",
            end.ifname
        );
    }
}

#[test]
fn after_sigkill_the_kernel_detaches_and_a_restarted_endpoint_serves() {
    require_root();
    let pair = VethPair::new(
        &tag("lk"),
        &VethOptions {
            subnet: 93,
            ..VethOptions::default()
        },
    )
    .unwrap();
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let mut server = spawn(&b.netns, &format!("pingpong -d {}", b.ifname));
    wait_for(
        "the server to load roce_xdp",
        Duration::from_secs(10),
        || xdp_attached(&b.netns, &b.ifname) && pin_dir(&b.ifname).join("ROCE_INFO").exists(),
    );
    // An endpoint holds the link of the roce_xdp it loaded instead of pinning it.
    assert!(!pin_dir(&b.ifname).join("link").exists());
    signal(&server.0, nix::sys::signal::Signal::SIGKILL);
    let _ = wait_exit(&mut server, Duration::from_secs(5));
    // The kernel detached the program with the process; its map pins wait for the next load.
    wait_for(
        "the kernel to detach roce_xdp",
        Duration::from_secs(5),
        || !xdp_attached(&b.netns, &b.ifname),
    );
    let status = Command::new(roce_bin())
        .args(["status", "-j"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let held = status
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ifname"] == b.ifname.as_str())
        .map(|s| s["held"].clone());
    assert_eq!(held, Some(serde_json::json!("stale")), "{status}");
    // A restarted endpoint loads afresh over the stale pins and serves.
    let server = spawn(&b.netns, &format!("pingpong -n 50 -d {}", b.ifname));
    thread::sleep(Duration::from_millis(500));
    let client = Command::new(roce_bin())
        .args([
            "--netns",
            &a.netns,
            "pingpong",
            "-n",
            "50",
            "-d",
            &a.ifname,
            &b.ipv4.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        client.status.success(),
        "restarted endpoint: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let mut server = server;
    assert_eq!(wait_exit(&mut server, Duration::from_secs(10)), Some(0));
    // Both endpoints loaded their own roce_xdp and removed it on exit.
    for end in [&a, &b] {
        assert!(!pin_dir(&end.ifname).exists(), "pins on {}", end.ifname);
        assert!(
            !xdp_attached(&end.netns, &end.ifname),
            "XDP on {}",
            end.ifname
        );
    }
}

/// The `held` word `roce status -j` gives `ifname`, if it lists it.
fn held_by(ifname: &str) -> Option<serde_json::Value> {
    let o = Command::new(roce_bin())
        .args(["status", "-j"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    status
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ifname"] == ifname)
        .map(|s| s["held"].clone())
}

/// An interface deleted under a pinned link (its namespace removed, as a killed test or
/// container leaves it) shows as `stale`, not `pin`, and `roce unload --stale` removes its
/// pins while a live pinned load elsewhere stays attached with its pins.
#[test]
fn pins_of_a_deleted_interface_are_stale_and_unload_stale_removes_them() {
    require_root();
    let gone = veth_pair("lg", 87);
    let live = veth_pair("ll", 88);
    let _loaded = Loaded::on(&[&gone.a, &live.a]);
    let gone_if = gone.a.ifname.clone();
    assert_eq!(held_by(&gone_if), Some(serde_json::json!("pin")));
    drop(gone);
    // The pinned link keeps its pins but is attached to nothing once the veth is gone.
    wait_for(
        "the deleted interface's pins to show as stale",
        Duration::from_secs(10),
        || held_by(&gone_if) == Some(serde_json::json!("stale")),
    );
    assert!(pin_dir(&gone_if).exists());
    assert_eq!(held_by(&live.a.ifname), Some(serde_json::json!("pin")));

    let out = roce_ok(&["unload", "--stale", "-j"]);
    let removed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = removed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["ifname"].as_str())
        .collect();
    assert!(names.contains(&gone_if.as_str()), "{out}");
    assert!(!names.contains(&live.a.ifname.as_str()), "{out}");
    assert!(!pin_dir(&gone_if).exists(), "pins of {gone_if} left");
    assert_eq!(held_by(&live.a.ifname), Some(serde_json::json!("pin")));
    assert!(xdp_attached(&live.a.netns, &live.a.ifname));
    // Nothing stale is left: a second run removes nothing, and says so.
    assert_eq!(
        roce_ok(&["unload", "--stale"]).trim(),
        "no stale roce_xdp pins"
    );
    // Without an interface or --stale, unload says what it needs.
    let o = roce(&["unload"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--iface"));
}
