//! roce_xdp fuzzed through BPF_PROG_TEST_RUN with mutated real packets: the RoCE packets of the
//! Soft-RoCE captures in `../shared/rxe-peer/samples`, with bytes after the UDP header flipped,
//! cut or added (IP and UDP lengths and the IPv4 checksum kept consistent, so that only the RoCE
//! part is hostile). For every mutant, roce_xdp's verdict is compared with the independent
//! user-space parser (`roce::wire::parse_frame`): a packet is steered to us exactly when it is
//! well-formed RoCE for one of our QPs. Root.

use std::collections::BTreeSet;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, PerCpuArray},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use roce::loader::EBPF_OBJECT;
use roce_common::{
    counters::XdpStats,
    maps::{GLOBAL_FLAGS, MAP_QPS, MAP_XDP_STATS, MAX_QPS, PROG_ROCE_XDP, QpEntry},
};
use roce_tests::require_root;

const MUTANTS: usize = 20_000;

/// The classic-pcap records (pcapng files are covered by the wire tests).
fn capture_frames() -> Vec<Vec<u8>> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/rxe-peer/samples");
    let mut frames = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("Soft-RoCE samples at {}: {e}", dir.display()));
    for e in entries {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        if data.len() < 24 || data[..4] != [0xd4, 0xc3, 0xb2, 0xa1] {
            continue;
        }
        let mut off = 24;
        while off + 16 <= data.len() {
            let caplen = u32::from_le_bytes(data[off + 8..off + 12].try_into().unwrap()) as usize;
            let start = off + 16;
            if start + caplen > data.len() {
                break;
            }
            let f = &data[start..start + caplen];
            // IPv4 UDP to 4791.
            if f.len() > 42 && f[12..14] == [0x08, 0x00] && f[23] == 17 && f[36..38] == [0x12, 0xb7]
            {
                frames.push(f.to_vec());
            }
            off = start + caplen;
        }
    }
    assert!(
        frames.len() >= 200,
        "expected the 250 RoCE packets of the samples, found {}",
        frames.len()
    );
    frames
}

/// xorshift64*, seeded: mutants are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Rewrites IPv4 total length, header checksum and UDP length after the frame changed size.
fn fix_lengths(f: &mut [u8]) {
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let mut sum = 0u32;
    for w in f[14..34].chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp_len = (f.len() - 34) as u16;
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
}

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut f = base.to_vec();
    for _ in 0..=rng.below(3) {
        let kind = if f.len() > 42 { rng.below(4) } else { 3 };
        match kind {
            // Flip bits anywhere in the RoCE part (BTH, extended headers, payload, ICRC).
            0 | 1 => {
                let i = 42 + rng.below(f.len() - 42);
                f[i] ^= 1 << rng.below(8);
            }
            // A whole random byte in the BTH, where the classifier looks.
            2 => {
                let i = 42 + rng.below(12.min(f.len() - 42));
                f[i] = rng.next() as u8;
            }
            // Cut the RoCE part short, or grow it.
            _ => {
                if rng.below(2) == 0 && f.len() > 42 {
                    let keep = 42 + rng.below(f.len() - 42);
                    f.truncate(keep);
                } else {
                    for _ in 0..1 + rng.below(8) {
                        f.push(rng.next() as u8);
                    }
                }
                fix_lengths(&mut f);
            }
        }
    }
    f
}

fn stats(ebpf: &Ebpf) -> XdpStats {
    let arr: PerCpuArray<_, XdpStats> =
        PerCpuArray::try_from(ebpf.map(MAP_XDP_STATS).unwrap()).unwrap();
    roce::loader::sum_per_cpu(&arr.get(&0, 0).unwrap())
}

#[test]
fn mutated_rxe_packets_are_steered_exactly_when_well_formed_for_our_qps() {
    require_root();
    assert!(!EBPF_OBJECT.is_empty(), "built with AYA_BUILD_SKIP=1");
    let frames = capture_frames();
    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_FLAGS, &roce::loader::xdp_flags(false), true)
        .load(EBPF_OBJECT)
        .expect("load roce_xdp");
    let prog: &mut Xdp = ebpf.program_mut(PROG_ROCE_XDP).unwrap().try_into().unwrap();
    prog.load().unwrap();
    // Half of the QPs in the captures are ours.
    let all: BTreeSet<u32> = frames
        .iter()
        .map(|f| u32::from_be_bytes([0, f[47], f[48], f[49]]))
        .collect();
    let ours: BTreeSet<u32> = all
        .iter()
        .copied()
        .step_by(2)
        .filter(|q| *q < MAX_QPS)
        .collect();
    let mut qps: Array<_, QpEntry> = Array::try_from(ebpf.map_mut(MAP_QPS).unwrap()).unwrap();
    for q in &ours {
        qps.set(*q, QpEntry { owner: 1, flags: 0 }, 0).unwrap();
    }
    let seed = std::env::var("ROCE_XDP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_u64);
    println!("seed {seed} (replay with ROCE_XDP_FUZZ_SEED={seed})");
    let mut rng = Rng(seed | 1);
    let prog: &Xdp = ebpf.program(PROG_ROCE_XDP).unwrap().try_into().unwrap();
    let (mut steered, mut dropped, mut mismatches) = (0usize, 0usize, Vec::new());
    for n in 0..MUTANTS {
        let base = &frames[rng.below(frames.len())];
        let m = if n < frames.len() {
            base.clone()
        } else {
            mutate(&mut rng, base)
        };
        let before = stats(&ebpf);
        let mut out = vec![0u8; m.len() + 256];
        prog.test_run(TestRunOptions {
            data_in: Some(&m),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .unwrap();
        let d = stats(&ebpf).saturating_sub(&before);
        let xdp_ours = d.redirected + d.redirect_fallback_pass == 1;
        let dropped_here = XdpStats::NAMES
            .iter()
            .filter(|n| n.starts_with("drop_"))
            .any(|n| d.get(n) == Some(1));
        steered += usize::from(xdp_ours);
        dropped += usize::from(dropped_here);
        let wire_ours =
            roce::wire::parse_frame(&m).is_ok_and(|f| ours.contains(&f.roce.bth.dest_qp.value()));
        if xdp_ours != wire_ours && mismatches.len() < 5 {
            let why = roce::wire::parse_frame(&m).err().map(|e| e.to_string());
            mismatches.push(format!(
                "mutant {n}: xdp ours={xdp_ours} wire ours={wire_ours} ({why:?}) {:02x?}",
                &m[42..m.len().min(80)]
            ));
        }
    }
    println!("{MUTANTS} mutants: {steered} steered to us, {dropped} dropped as malformed");
    assert!(
        mismatches.is_empty(),
        "roce_xdp and the wire parser disagree:\n{}",
        mismatches.join("\n")
    );
    assert!(
        steered > 1000 && dropped > 1000,
        "the mutants should exercise both paths ({steered} steered, {dropped} dropped)"
    );
}
