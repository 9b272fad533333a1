//! Wire-format benchmark (plain `std::time`, no harness):
//!
//! - parse + ICRC verify of a whole RC SEND_ONLY frame (IPv4) with a 64 B and a 1 KiB payload,
//!   in ns per packet;
//! - the same with `parse_frame_in_place` (ICRC masked in place, no copy at all);
//! - ICRC throughput of `wire::icrc::compute` (masked headers copied to the stack, payload in
//!   place) and `wire::icrc::compute_in_place` (what `emit_frame` uses), each as a ratio to raw
//!   `crc32fast::hash` over the same bytes measured in the same run (target: at least 0.8x).
//!
//! Every figure is the median of several repetitions, with min and max. Run with
//! `AYA_BUILD_SKIP=1 cargo bench -p roce-user --bench wire`; with `ROCE_BENCH_OUT=dir` set,
//! the rows are also written to `dir/wire.json` as
//! `{name, value, unit, baseline, ratio, target, min, max}`.

use std::{hint::black_box, net::Ipv4Addr, time::Instant};

use roce::wire::{
    BthRepr, EthernetAddress, IpPath, Opcode, PathRepr, Psn, Qpn, RoceRepr, emit_frame, icrc,
    parse_frame, parse_frame_in_place,
};

const REPS: usize = 15;

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

/// Runs `a` and `b` `iters` times each, alternating, in every repetition (so both see the
/// same machine load), and returns their ns per call plus the median of the per-repetition
/// ratios `b / a` (time of b over time of a: a's speed relative to b).
fn measure_pair(iters: u64, mut a: impl FnMut(), mut b: impl FnMut()) -> (Stat, Stat, f64) {
    let once = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed().as_nanos() as f64 / iters as f64
    };
    once(&mut a);
    once(&mut b);
    let (mut ta, mut tb, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS {
        let x = once(&mut a);
        let y = once(&mut b);
        ta.push(x);
        tb.push(y);
        r.push(y / x);
    }
    let stat = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        Stat {
            median: v[REPS / 2],
            min: v[0],
            max: v[REPS - 1],
        }
    };
    r.sort_by(f64::total_cmp);
    (stat(ta), stat(tb), r[REPS / 2])
}

/// Runs `f` `iters` times per repetition and returns ns per call over `REPS` repetitions.
fn measure(iters: u64, mut f: impl FnMut()) -> Stat {
    for _ in 0..iters / 10 {
        f();
    }
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    Stat {
        median: v[REPS / 2],
        min: v[0],
        max: v[REPS - 1],
    }
}

fn frame(payload_len: usize) -> Vec<u8> {
    let path = PathRepr::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
        IpPath::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        },
    );
    let roce = RoceRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11),
        Psn::new(1),
    ));
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let mut buf = vec![0u8; 9000];
    let n = emit_frame(&path, &roce, &payload, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    baseline: Option<f64>,
    ratio: Option<f64>,
    target: Option<f64>,
    min: f64,
    max: f64,
}

fn main() {
    let mut rows = Vec::new();
    for payload in [64usize, 1024] {
        let mut f = frame(payload);
        let s = measure(200_000, || {
            let p = parse_frame(black_box(&f)).expect("parse");
            assert!(p.icrc_ok);
            black_box(p.payload.len());
        });
        rows.push(Row {
            name: format!("parse_verify_{payload}B"),
            value: s.median,
            unit: "ns/pkt",
            baseline: None,
            ratio: None,
            target: None,
            min: s.min,
            max: s.max,
        });
        let s = measure(200_000, || {
            let p = parse_frame_in_place(black_box(&mut f)).expect("parse");
            assert!(p.icrc_ok);
            black_box(p.payload.len());
        });
        rows.push(Row {
            name: format!("parse_verify_in_place_{payload}B"),
            value: s.median,
            unit: "ns/pkt",
            baseline: None,
            ratio: None,
            target: None,
            min: s.min,
            max: s.max,
        });
    }
    for payload in [1024usize, 4096] {
        let f = frame(payload);
        // The ICRC covers the IP header to the pad: 14 B of Ethernet and 4 B of ICRC are not.
        let (ip, rest) = f[14..].split_at(20);
        let (udp, roce) = rest.split_at(8);
        let roce = &roce[..roce.len() - 4];
        let covered = (20 + 8 + roce.len()) as f64;
        let raw_bytes = &f[14..f.len() - 4];
        let iters = 2_000_000 / payload as u64 * 10;
        let mut l3 = f[14..f.len() - 4].to_vec();
        let gbps = |ns: f64| covered / ns;
        let (ours, base, r1) = measure_pair(
            iters,
            || {
                black_box(icrc::compute(black_box(ip), black_box(udp), black_box(roce)).unwrap());
            },
            || {
                black_box(crc32fast::hash(black_box(raw_bytes)));
            },
        );
        let (in_place, base2, r2) = measure_pair(
            iters,
            || {
                black_box(icrc::compute_in_place(black_box(&mut l3)).unwrap());
            },
            || {
                black_box(crc32fast::hash(black_box(raw_bytes)));
            },
        );
        for (name, s, b, ratio) in [
            ("icrc", ours, base, r1),
            ("icrc_in_place", in_place, base2, r2),
        ] {
            rows.push(Row {
                name: format!("{name}_{payload}B"),
                value: gbps(s.median),
                unit: "GB/s",
                baseline: Some(gbps(b.median)),
                ratio: Some(ratio),
                target: Some(0.8),
                min: gbps(s.max),
                max: gbps(s.min),
            });
        }
    }

    println!(
        "{:<28} {:>10} {:<7} {:>10} {:>7} {:>7} {:>10} {:>10}",
        "name", "median", "unit", "baseline", "ratio", "target", "min", "max"
    );
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    for r in &rows {
        println!(
            "{:<28} {:>10.3} {:<7} {:>10} {:>7} {:>7} {:>10.3} {:>10.3}",
            r.name,
            r.value,
            r.unit,
            opt(r.baseline),
            opt(r.ratio),
            opt(r.target),
            r.min,
            r.max
        );
    }
    if let Some(dir) = std::env::var_os("ROCE_BENCH_OUT") {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "value": r.value, "unit": r.unit, "baseline": r.baseline,
                    "ratio": r.ratio, "target": r.target, "min": r.min, "max": r.max,
                })
            })
            .collect();
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("create ROCE_BENCH_OUT");
        let path = dir.join("wire.json");
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap())
            .expect("write wire.json");
        println!("wrote {}", path.display());
    }
}
