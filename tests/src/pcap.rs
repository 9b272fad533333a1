//! The frames of the captures tests take with tcpdump (`rxe::Capture`: a classic pcap of
//! Ethernet frames), read in one place.

use std::{fs::File, io::BufReader, path::Path};

use pcap_file::{DataLink, pcap::PcapReader};

/// Hands every frame of the classic pcap at `pcap` to `each`, in order, with its index from 1
/// (what Wireshark calls the frame number). A last record that the end of tcpdump cut short
/// ends the walk.
///
/// # Panics
/// When the file cannot be opened or is not a pcap of Ethernet frames.
pub fn for_each_frame(pcap: &Path, mut each: impl FnMut(usize, &[u8])) {
    let file = File::open(pcap).unwrap_or_else(|e| panic!("open {}: {e}", pcap.display()));
    let mut r = PcapReader::new(BufReader::new(file))
        .unwrap_or_else(|e| panic!("{}: not a pcap: {e}", pcap.display()));
    assert_eq!(
        r.header().datalink,
        DataLink::ETHERNET,
        "{}: not Ethernet",
        pcap.display()
    );
    let mut idx = 0;
    while let Some(Ok(p)) = r.next_packet() {
        idx += 1;
        each(idx, &p.data);
    }
}

/// Hands every RoCE v2 frame of `pcap` ([`for_each_frame`]) to `each`, parsed, after checking
/// that its ICRC is good.
///
/// # Panics
/// As [`for_each_frame`], and at a RoCE frame whose ICRC is wrong.
pub fn for_each_roce_frame(pcap: &Path, mut each: impl FnMut(&roce::wire::Frame<'_>)) {
    for_each_frame(pcap, |idx, bytes| {
        if let Ok(f) = roce::wire::parse_frame(bytes) {
            assert!(f.icrc_ok, "{} frame {idx}: bad ICRC", pcap.display());
            each(&f);
        }
    });
}
