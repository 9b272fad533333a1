//! Fuzzes the whole-frame parser. Run from the repository root:
//!
//! ```sh
//! AYA_BUILD_SKIP=1 cargo +nightly fuzz run --fuzz-dir roce-user/fuzz parse_frame -- -max_total_time=30
//! ```
//!
//! Starting from the committed seeds (frames built by scapy and real rxe frames, one per
//! opcode) gets much deeper quickly; libFuzzer writes new inputs to the first directory only:
//!
//! ```sh
//! mkdir -p roce-user/fuzz/corpus/parse_frame
//! AYA_BUILD_SKIP=1 cargo +nightly fuzz run --fuzz-dir roce-user/fuzz parse_frame \
//!     roce-user/fuzz/corpus/parse_frame roce-user/fuzz/seeds/parse_frame -- -max_total_time=30
//! ```
//!
//! Under `cfg(fuzzing)` the IPv4 header checksum and the ICRC are not checked (smoltcp style),
//! so the fuzzer reaches the transport headers. Beyond "never panics", every accepted frame must
//! keep its invariants: it fits the input, its payload is a slice of it, and emitting it again
//! from the parsed representation gives a frame that parses to the same representation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::{IpPath, IpRepr, PathRepr, emit_frame, frame_len, parse_frame};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = parse_frame(data) else {
        return;
    };
    assert!(f.len <= data.len());
    let start = f.payload.as_ptr() as usize - data.as_ptr() as usize;
    assert!(start + f.payload.len() <= f.len);

    let ip = match f.ip {
        IpRepr::V4(r) => IpPath::V4 { src: r.src_addr, dst: r.dst_addr },
        IpRepr::V6(r) => IpPath::V6 { src: r.src_addr, dst: r.dst_addr, flow_label: r.flow_label },
    };
    let mut path = PathRepr::new(f.eth.src_addr, f.eth.dst_addr, ip);
    path.vlan = f.eth.vlan;
    path.dscp = f.ip.dscp();
    path.ecn = f.ecn();
    path.ttl = f.ip.ttl();
    if let IpRepr::V4(r) = f.ip {
        path.ipv4_ident = r.ident;
    }
    path.udp_src_port = f.udp.src_port;
    path.udp_dst_port = f.udp.dst_port;
    let mut buf = [0u8; 70_000];
    let n = emit_frame(&path, &f.roce, f.payload, &mut buf).expect("a parsed frame re-emits");
    assert_eq!(n, frame_len(&path, &f.roce, f.payload.len()));
    // Equal unless the UDP length is shorter than the IP payload (trailing bytes are ignored).
    assert!(n <= f.len, "re-emitted frame is longer than the parsed one");
    let ip_payload = match f.ip {
        IpRepr::V4(r) => r.payload_len,
        IpRepr::V6(r) => r.payload_len,
    };
    if f.udp.length == ip_payload {
        assert_eq!(n, f.len, "re-emitted length differs");
    }
    let g = parse_frame(&buf[..n]).expect("a re-emitted frame parses");
    let mut want = f.roce;
    want.bth.pad_count = g.roce.bth.pad_count;
    assert_eq!(g.roce, want);
    assert_eq!(g.payload, f.payload);
    assert_eq!(g.eth, f.eth);
    assert_eq!(g.ip.tos(), f.ip.tos());
});
