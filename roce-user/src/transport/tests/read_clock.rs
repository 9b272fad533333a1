//! The ACK clock of READ responses towards a peer that marks nothing (`loss_backoff`,
//! transport/cc.rs `ReadClock`): probes, the window and what ends it, with the peer's
//! requester and responder played by the test.

use super::*;
use crate::cc::{CcAlgorithm, CcStats};
use crate::transport::cc::{PROBE_EVERY, PROBE_TIMEOUT, PROBE_WINDOW};

/// A responder QP with `loss_backoff` on, MTU 256, asked for a READ of `frames` packets;
/// returns the harness after it has sent what the clock lets go.
fn reading(frames: u32) -> (H, Vec<(RoceRepr, Vec<u8>)>) {
    let mut cc = CcConfig::default();
    cc.set("loss_backoff", 1).unwrap();
    reading_with(cc, frames)
}

/// [`reading`] with the device's CC configuration `cc`.
fn reading_with(cc: CcConfig, frames: u32) -> (H, Vec<(RoceRepr, Vec<u8>)>) {
    let cfg = RcConfig {
        mtu: Mtu::Mtu256,
        ..RcConfig::default()
    };
    let mut h = h_on(
        &cfg,
        DeviceConfig {
            cc,
            ..DeviceConfig::default()
        },
    );
    let rkey = h.mr.rkey;
    h.rx(
        with_reth(
            hdr(Opcode::RC_RDMA_READ_REQUEST, RQ_PSN),
            BASE,
            rkey,
            frames * 256,
        ),
        &[],
    );
    let out = h.tx_paced();
    (h, out)
}

impl H {
    /// Everything the device sends until it stops, advancing time to each pacer release (but
    /// never to a probe's timeout).
    fn tx_paced(&mut self) -> Vec<(RoceRepr, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let got = self.tx();
            let stop = got.is_empty();
            out.extend(got);
            let next = self.d.poll_timeout();
            match next {
                Some(t) if t < self.now + PROBE_TIMEOUT && !(stop && t <= self.now) => {
                    self.now = t.max(self.now);
                    self.d.handle_timeout(self.now);
                    if stop && self.d.poll_timeout() == next {
                        return out;
                    }
                }
                _ => return out,
            }
        }
    }

    fn cc(&self) -> CcStats {
        self.d.qp(self.qpn).unwrap().congestion().unwrap().stats()
    }
}

fn is_probe(r: &RoceRepr) -> bool {
    r.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY
}

/// The peer's ACK of a probe, with PSN `psn`.
fn answer(h: &mut H, psn: u32) {
    h.rx(aeth_hdr(Opcode::RC_ACKNOWLEDGE, psn, ACK, 0), &[]);
}

#[test]
fn read_responses_wait_for_probes_the_peer_answers() {
    let (mut h, first) = reading(1000);
    let responses = first.iter().filter(|(r, _)| !is_probe(r)).count() as u64;
    let probes: Vec<_> = first.iter().filter(|(r, _)| is_probe(r)).collect();
    // The window: PROBE_WINDOW responses, a probe after every PROBE_EVERY of them, each a
    // zero-length WRITE ONLY with AckReq at the PSN before the QP's first (nothing of its own
    // was ever sent, so the peer has taken everything up to SQ_PSN - 1).
    assert_eq!(responses, PROBE_WINDOW);
    assert_eq!(probes.len() as u64, PROBE_WINDOW / u64::from(PROBE_EVERY));
    for (p, payload) in &probes {
        assert_eq!(p.bth.psn, Psn::new(SQ_PSN - 1));
        assert!(p.bth.ack_req);
        assert_eq!(p.reth.map(|r| r.dma_len), Some(0));
        assert!(payload.is_empty());
    }
    let at = |n: usize| first[..n].iter().filter(|(r, _)| !is_probe(r)).count();
    let positions: Vec<usize> = (0..first.len())
        .filter(|&i| is_probe(&first[i].0))
        .map(at)
        .collect();
    assert_eq!(positions, vec![32, 64, 96, 128, 160, 192, 224, 256]);

    // rxe answers a duplicate with its last acknowledged PSN, 0xffffff before it acknowledged
    // any request of ours: still the answer to the oldest probe, and no dropped packet.
    answer(&mut h, 0xff_ffff);
    let more = h.tx_paced();
    assert_eq!(more.iter().filter(|(r, _)| !is_probe(r)).count(), 32);
    assert_eq!(more.iter().filter(|(r, _)| is_probe(r)).count(), 1);
    // An answer with the PSN before ours (our own responder's, rxe's once it acknowledged one).
    answer(&mut h, SQ_PSN - 1);
    assert_eq!(
        h.tx_paced().iter().filter(|(r, _)| !is_probe(r)).count(),
        32
    );
    assert_eq!(h.c().rx_dropped, 0);
    let s = h.cc();
    assert_eq!(
        (s.rp_probe_sent, s.rp_probe_answered, s.rp_probe_lost),
        (10, 2, 0)
    );

    // Probes the peer stops answering count as lost after PROBE_TIMEOUT, each freeing the
    // window behind it, and the loss halves the window. The third timeout in a row with no
    // answer turns the clock off: the rest of the READ goes.
    let count = |out: Vec<(RoceRepr, Vec<u8>)>| out.iter().filter(|(r, _)| !is_probe(r)).count();
    h.now = h.now + PROBE_TIMEOUT;
    h.d.handle_timeout(h.now);
    let mut sent = 256 + 64 + count(h.tx_paced());
    assert_eq!(sent, 256 + 64 + 128, "half the window after the loss");
    assert_eq!(h.cc().rp_probe_lost, 8);
    let mut rounds = 0;
    while sent < 1000 {
        h.now = h.now + PROBE_TIMEOUT;
        h.d.handle_timeout(h.now);
        sent += count(h.tx_paced());
        rounds += 1;
        assert!(rounds < 3, "the READ stalled at {sent} of 1000 responses");
    }
    assert_eq!((sent, rounds), (1000, 2));
    assert_eq!(h.c().rx_dropped, 0);
}

#[test]
fn a_peer_that_answers_no_probe_turns_the_clock_off() {
    let (mut h, first) = reading(600);
    assert_eq!(
        first.iter().filter(|(r, _)| !is_probe(r)).count() as u64,
        PROBE_WINDOW
    );
    h.now = h.now + PROBE_TIMEOUT;
    h.d.handle_timeout(h.now);
    let rest = h.tx_paced();
    // The rest of the READ goes at once, with no more probes.
    assert_eq!(
        rest.iter().filter(|(r, _)| !is_probe(r)).count() as u64,
        600 - PROBE_WINDOW
    );
    assert!(rest.iter().all(|(r, _)| !is_probe(r)));
    assert_eq!(h.cc().rp_probe_lost, 8);
    // A late answer is no answer to anything: an old ACK, ignored.
    answer(&mut h, SQ_PSN - 1);
    assert_eq!(h.c().rx_dropped, 0);
}

#[test]
fn without_loss_backoff_there_are_no_probes() {
    let (_, out) = reading_with(CcConfig::default(), 600);
    assert_eq!(out.len(), 600);
    assert!(out.iter().all(|(r, _)| !is_probe(r)));
}

#[test]
fn a_parameter_change_keeps_the_clock_and_its_probes() {
    let (mut h, first) = reading(1000);
    assert_eq!(first.iter().filter(|(r, _)| is_probe(r)).count(), 8);
    h.d.set_cc_param(h.qpn, "rpg_ai_rate", 10).unwrap();
    h.d.set_cc_algorithm(h.qpn, CcAlgorithm::Dcqcn).unwrap();
    // The probes sent before still wait for their answers, and the window stays where it was.
    answer(&mut h, 0xff_ffff);
    assert_eq!(
        h.tx_paced().iter().filter(|(r, _)| !is_probe(r)).count(),
        32
    );
    assert_eq!(h.c().rx_dropped, 0);
    let s = h.cc();
    assert_eq!(
        (s.rp_probe_sent, s.rp_probe_answered, s.rp_probe_lost),
        (9, 1, 0)
    );
}
