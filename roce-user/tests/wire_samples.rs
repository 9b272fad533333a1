//! Real Soft-RoCE captures: every RoCE v2 packet in `shared/rxe-peer/samples/*.pcap` (rxe↔rxe
//! runs of ibv_rc_pingpong and perftest) parses, has a valid ICRC, follows the kernel's UDP
//! source-port rule, and re-emits byte for byte from its parsed representation.

mod wire_support;

use std::collections::BTreeSet;

use roce::wire::{self, IpPath, IpRepr, PathRepr, Qpn, frame::udp_src_port, parse_frame};
use wire_support::{LINKTYPE_ETHERNET, is_roce_udp, read_pcap, sample_pcaps};

#[test]
fn every_rxe_packet_parses_with_a_valid_icrc() {
    let mut total = 0;
    for path in sample_pcaps() {
        let (linktype, records) = read_pcap(&path);
        assert_eq!(linktype, LINKTYPE_ETHERNET, "{}", path.display());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut n = 0;
        let mut qpns = BTreeSet::new();
        let mut parsed = Vec::new();
        for rec in &records {
            assert_eq!(
                rec.data.len(),
                rec.orig_len,
                "{name} frame {}: snapped",
                rec.number
            );
            if let Some(q) = pingpong_qpn(&rec.data) {
                qpns.insert(q);
            }
            if !is_roce_udp(&rec.data) {
                // Everything else must not be taken for RoCE.
                assert!(
                    parse_frame(&rec.data).is_err(),
                    "{name} frame {} parsed as RoCE",
                    rec.number
                );
                continue;
            }
            let f = parse_frame(&rec.data)
                .unwrap_or_else(|e| panic!("{name} frame {}: {e}", rec.number));
            assert!(
                f.icrc_ok,
                "{name} frame {}: bad ICRC {:#010x}",
                rec.number, f.icrc
            );
            assert_eq!(
                f.udp.checksum, 0,
                "{name} frame {}: rxe sends UDP checksum 0",
                rec.number
            );
            assert_eq!(f.ecn(), wire::Ecn::NotEct, "{name} frame {}", rec.number);
            assert!(f.len <= rec.data.len());
            qpns.insert(f.roce.bth.dest_qp);
            parsed.push((rec.number, f));
            n += 1;
        }
        for (number, f) in &parsed {
            // The UDP source port follows rdma_flow_label_to_udp_sport(rdma_calc_flow_label(l, r)).
            let ok = qpns
                .iter()
                .any(|&other| udp_src_port(f.roce.bth.dest_qp, other) == f.udp.src_port);
            assert!(
                ok,
                "{name} frame {number}: UDP sport {:#x} not from the flow-label rule",
                f.udp.src_port
            );
            // Re-emit from the parsed representation: must give the captured bytes.
            let IpRepr::V4(ip) = f.ip else {
                panic!("{name} frame {number}: samples are IPv4")
            };
            let mut p = PathRepr::new(
                f.eth.src_addr,
                f.eth.dst_addr,
                IpPath::V4 {
                    src: ip.src_addr,
                    dst: ip.dst_addr,
                },
            );
            p.vlan = f.eth.vlan;
            p.dscp = f.ip.dscp();
            p.ecn = f.ecn();
            p.ttl = ip.ttl;
            p.ipv4_ident = ip.ident;
            p.udp_src_port = f.udp.src_port;
            p.udp_dst_port = f.udp.dst_port;
            let mut buf = vec![0u8; 9000];
            let len = wire::emit_frame(&p, &f.roce, f.payload, &mut buf).unwrap();
            let rec = &records[number - 1];
            assert_eq!(len, f.len, "{name} frame {number}");
            assert_eq!(
                &buf[..len],
                &rec.data[..len],
                "{name} frame {number}: re-emitted bytes differ"
            );
        }
        eprintln!("{name}: {n} RoCE packets, all ICRCs valid");
        if !name.starts_with("vm-client") {
            assert!(n > 0, "{name}: no RoCE packets found");
        }
        total += n;
    }
    assert!(
        total >= 250,
        "expected at least the 250 RoCE packets of the samples, found {total}"
    );
}

/// The QPN in an ibv_rc_pingpong out-of-band message ("LLLL:QQQQQQ:PPPPPP:GID", rc_pingpong.c)
/// carried in a TCP segment of the frame, if any: it names the QP that only sends, in a capture
/// where the other side never answers.
fn pingpong_qpn(frame: &[u8]) -> Option<Qpn> {
    let hex = |b: &[u8]| b.iter().all(u8::is_ascii_hexdigit);
    frame.windows(52).find_map(|w| {
        let shaped = w[4] == b':' && w[11] == b':' && w[18] == b':' && w[51] == 0;
        if !(shaped && hex(&w[..4]) && hex(&w[5..11]) && hex(&w[12..18]) && hex(&w[19..51])) {
            return None;
        }
        let q = u32::from_str_radix(std::str::from_utf8(&w[5..11]).ok()?, 16).ok()?;
        Some(Qpn::new(q))
    })
}
