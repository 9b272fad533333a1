//! `cargo xtask bench xdp`: roce_xdp's cost per packet under BPF_PROG_TEST_RUN, as a ratio to a
//! trivial XDP_PASS program run on the same bytes in the same process. Needs root.
//!
//! Each figure is the median of REPS runs of `repeat` iterations (the kernel reports the mean
//! duration of one iteration); min and max are shown next to it.

use std::{fmt::Write as _, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use roce::loader::{EBPF_OBJECT, XDP_PASS_OBJECT};
use roce_common::{
    maps::{MAP_QPS, PROG_ROCE_XDP, QpEntry},
    opcode::Opcode,
};
use roce_tests::{Frame, Ip, require_root};

const REPS: usize = 9;
const REPEAT: u32 = 200_000;

fn load(object: &[u8], prog: &str) -> Ebpf {
    let mut ebpf = EbpfLoader::new().load(object).expect("load object");
    let p: &mut Xdp = ebpf.program_mut(prog).unwrap().try_into().unwrap();
    p.load().expect("verifier");
    ebpf
}

fn ns_per_packet(ebpf: &Ebpf, prog: &str, frame: &[u8]) -> Vec<f64> {
    let p: &Xdp = ebpf.program(prog).unwrap().try_into().unwrap();
    (0..REPS)
        .map(|_| {
            let opts = TestRunOptions {
                data_in: Some(frame),
                repeat: REPEAT,
                ..TestRunOptions::default()
            };
            let d: Duration = p.test_run(opts).expect("test run").duration;
            d.as_nanos() as f64
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    require_root();
    assert!(
        !EBPF_OBJECT.is_empty() && !XDP_PASS_OBJECT.is_empty(),
        "built with AYA_BUILD_SKIP=1"
    );
    let mut roce = load(EBPF_OBJECT, PROG_ROCE_XDP);
    let mut qps: Array<_, QpEntry> = Array::try_from(roce.map_mut(MAP_QPS).unwrap()).unwrap();
    qps.set(0x11, QpEntry { owner: 1, flags: 0 }, 0).unwrap();
    let pass = load(XDP_PASS_OBJECT, "xdp_pass");
    // A real AF_XDP socket (bound to queue 0 of a veth in a namespace made here) in the XSKS slot
    // of queue 0, so "our QP" packets take the redirect path they take in production; under
    // BPF_PROG_TEST_RUN the redirect is decided but not carried out.
    let pair = roce::netns::VethPair::new(
        &roce_tests::tag("bx"),
        &roce::netns::VethOptions {
            subnet: 96,
            ..Default::default()
        },
    )
    .expect("veth pair");
    let ifname = pair.b.ifname.clone();
    let sock = roce::netns::in_netns(&pair.b.netns, move || {
        roce::xsk::XskQueue::open(&ifname, 0, &roce::xsk::XskConfig::default())
    })
    .expect("enter namespace")
    .expect("AF_XDP socket");
    let mut xsks: aya::maps::XskMap<_> =
        aya::maps::XskMap::try_from(roce.map_mut(roce_common::maps::MAP_XSKS).unwrap()).unwrap();
    xsks.set(0, std::os::fd::AsRawFd::as_raw_fd(&sock), 0)
        .unwrap();

    let cases = [
        (
            "RoCE RC SEND_ONLY 1 KiB, IPv4, our QP",
            Frame {
                payload: 1024,
                ..Frame::default()
            },
            "≤ 1.5x",
        ),
        (
            "RoCE RDMA_WRITE_ONLY 64 B, IPv6, our QP",
            Frame {
                opcode: Opcode::RC_RDMA_WRITE_ONLY,
                payload: 64,
                ip: Ip::V6 {
                    tc: 0,
                    ext: vec![],
                    frag: 0,
                },
                ..Frame::default()
            },
            "≤ 1.5x",
        ),
        (
            "RoCE for a foreign QP",
            Frame {
                dest_qp: 0x22,
                ..Frame::default()
            },
            "-",
        ),
        (
            "UDP to another port (not RoCE)",
            Frame {
                dport: 53,
                ..Frame::default()
            },
            "-",
        ),
    ];
    let mut rows = Vec::new();
    let mut table = String::from(
        "| packet | roce_xdp ns/pkt (min..max) | XDP_PASS ns/pkt | ratio | target |\n|---|---|---|---|---|\n",
    );
    for (name, f, target) in cases {
        let frame = f.build();
        let mut r = ns_per_packet(&roce, PROG_ROCE_XDP, &frame);
        let mut b = ns_per_packet(&pass, "xdp_pass", &frame);
        let (rmin, rmax) = (
            r.iter().copied().fold(f64::MAX, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        );
        let (rm, bm) = (median(&mut r), median(&mut b));
        let ratio = rm / bm.max(1.0);
        let met = if target == "-" {
            ""
        } else if ratio <= 1.5 {
            " (met)"
        } else {
            " (NOT met)"
        };
        let _ = writeln!(
            table,
            "| {name} | {rm:.1} ({rmin:.0}..{rmax:.0}) | {bm:.1} | {ratio:.2}x | {target}{met} |"
        );
        rows.push(serde_json::json!({
            "name": format!("roce_xdp ns/packet: {name}"), "value": rm, "unit": "ns",
            "baseline": bm, "ratio": ratio, "target": target, "min": rmin, "max": rmax,
        }));
    }
    drop(sock);
    drop(pair);
    print!("{table}");
    println!(
        "(median of {REPS} BPF_PROG_TEST_RUN calls of {REPEAT} iterations each; XDP_PASS baseline on the same bytes)"
    );
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        let path = std::path::Path::new(&dir).join("xdp.json");
        std::fs::write(&path, serde_json::to_string_pretty(&rows).unwrap())
            .expect("write xdp.json");
    }
}
