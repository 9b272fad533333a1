//! `roce perf write|send --lat` against perftest's ib_write_lat and ib_send_lat on Linux
//! Soft-RoCE in a VM, both directions, 2 B and 4 KiB, 500 iterations each (1000 with
//! `ROCE_INTEROP_FULL=1`), each scenario captured and checked like the others, then the same
//! tool and size between two rxe VMs (a second one boots beside the first after the scenarios):
//! the rxe ↔ rxe reference of the same run. Root.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use roce_tests::{
    require_root,
    rxe::{self, Harness, Peer, PeerOptions, Roles, SceneReport},
    tag,
};

/// perftest's latency result line: (bytes, iterations, t_typical µs).
fn lat_line(out: &str) -> Option<(u64, u64, f64)> {
    let mut lines = out.lines();
    lines.find(|l| l.contains("#bytes"))?;
    let f: Vec<&str> = lines.next()?.split_whitespace().collect();
    Some((
        f.first()?.parse().ok()?,
        f.get(1)?.parse().ok()?,
        f.get(4)?.parse().ok()?,
    ))
}

#[test]
fn perftest_latency_both_directions() {
    require_root();
    let peer = Peer::boot(&tag("lt"), 66, &PeerOptions::default());
    let h = Harness::new(&peer, &rxe::out_dir().join("pcap"));
    let n: u32 = if rxe::full() { 1000 } else { 500 };
    let mut port = 19700;
    let mut rows: Vec<(String, SceneReport)> = Vec::new();
    for op in ["write", "send"] {
        for size in [2u32, 4096] {
            for guest_server in [true, false] {
                port += 1;
                let tool =
                    rxe::perftest_cmd(&format!("ib_{op}_lat"), port, &format!("-s {size} -n {n}"));
                let mut ours: Vec<String> = [
                    "perf",
                    op,
                    "--lat",
                    "-d",
                    &peer.ifname,
                    "-p",
                    &port.to_string(),
                    "-s",
                    &size.to_string(),
                    "-n",
                    &n.to_string(),
                    "-m",
                    "1024",
                    "--no-verify",
                ]
                .map(String::from)
                .to_vec();
                let roles = if guest_server {
                    ours.push(peer.guest_ip.to_string());
                    Roles::GuestServer { guest: tool, ours }
                } else {
                    Roles::OurServer {
                        ours,
                        guest: format!("{tool} {}", peer.host_ip),
                    }
                };
                let name = format!(
                    "ib_{op}_lat-server_{}-s{size}",
                    if guest_server { "rxe" } else { "roce" }
                );
                let mut r = h.run(&name, &roles, port);
                match lat_line(&r.guest.out) {
                    Some((_, it, _)) if it == u64::from(n) => {}
                    other => r.failures.push(format!(
                        "perftest latency line {other:?}, want {n} iterations"
                    )),
                }
                if let Ok(v) = &r.ours
                    && v["messages"].as_u64() != Some(u64::from(n))
                {
                    r.failures.push(format!("roce perf --lat said {v}"));
                }
                rows.push((format!("ib_{op}_lat"), r));
            }
        }
    }
    // rxe ↔ rxe: the same tool and size between two rxe VMs.
    let mut refs: BTreeMap<(String, u32), Result<f64, String>> = BTreeMap::new();
    {
        let second = Peer::boot_beside(&peer, &PeerOptions::default());
        for op in ["write", "send"] {
            for size in [2u32, 4096] {
                let v = rxe::twice(|| {
                    port += 1;
                    let tool = rxe::perftest_cmd(
                        &format!("ib_{op}_lat"),
                        port,
                        &format!("-s {size} -n {n}"),
                    );
                    let o = rxe::rxe_pair(&peer, &second, &tool, port, Duration::from_secs(120))?;
                    match lat_line(&o.out) {
                        Some((_, it, t)) if it == u64::from(n) => Ok(t),
                        other => Err(format!("latency line {other:?}: {}", o.out)),
                    }
                });
                refs.insert((format!("ib_{op}_lat"), size), v);
            }
        }
    }
    let mut text = String::from(
        "| tool | server | size | result | roce p50 µs | perftest t_typical µs | rxe↔rxe t_typical µs | packets |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (tool, r) in &rows {
        let size = r.name.rsplit("-s").next().unwrap_or("?");
        let reference = match refs.get(&(tool.clone(), size.parse().unwrap_or(0))) {
            Some(Ok(t)) => format!("{t:.1}"),
            Some(Err(_)) => "failed".into(),
            None => "-".into(),
        };
        let _ = writeln!(
            text,
            "| {tool} | {} | {size} | {} | {} | {} | {reference} | {} |",
            if r.name.contains("server_rxe") {
                "rxe"
            } else {
                "roce"
            },
            if r.ok() {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", r.failures.join("; ").replace('|', "/"))
            },
            r.ours
                .as_ref()
                .ok()
                .and_then(|v| v["latency_us"]["p50"].as_f64())
                .map_or("-".into(), |x| format!("{x:.1}")),
            lat_line(&r.guest.out).map_or("-".into(), |x| format!("{:.1}", x.2)),
            r.icrc.good
        );
    }
    println!("{text}");
    let _ = std::fs::create_dir_all(rxe::out_dir());
    let _ = std::fs::write(rxe::out_dir().join("latency-matrix.md"), &text);
    assert!(
        rows.iter().all(|(_, r)| r.ok()),
        "perftest latency interop failures:\n{text}"
    );
    rxe::assert_references(&refs, |(tool, _)| tool.clone());
}
