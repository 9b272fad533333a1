//! Tests of the reassembly and selective-repeat states: examples, malformed input, and
//! proptests over random schedules of loss, duplication and reordering (docs/multipath.md,
//! "proptest on the reassembly state").

use core::time::Duration;
use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap},
};

use proptest::prelude::*;
use rand::{RngExt, SeedableRng, rngs::StdRng, seq::SliceRandom};

use super::*;
use crate::{
    time::Instant,
    wire::{
        Psn, RKey,
        multipath::{PlacementFlags, PlacementTrailer, SackTrailer, Ssn},
    },
};

const PMTU: u32 = 256;

/// One packet of a message stream: its PSN, trailer, data length and message index.
#[derive(Clone, Copy, Debug)]
struct Pkt {
    psn: Psn,
    t: PlacementTrailer,
    len: usize,
    msg: usize,
}

/// The packets of messages of `lens` bytes starting at `first`, alternating WRITE and SEND.
fn packets(first: Psn, lens: &[u32]) -> Vec<Pkt> {
    let mut out = Vec::new();
    let mut psn = first;
    let mut sends = 0;
    for (msg, &length) in lens.iter().enumerate() {
        let send = msg % 2 == 1;
        let flags = if send {
            PlacementFlags::SEND
        } else {
            PlacementFlags::WRITE
        };
        let n = length.div_ceil(PMTU).max(1);
        for i in 0..n {
            let offset = i * PMTU;
            out.push(Pkt {
                psn: psn.wrapping_add(i),
                t: PlacementTrailer {
                    first_psn: psn,
                    flags,
                    offset,
                    length,
                    va: if send { 0 } else { 0x1000 * msg as u64 },
                    rkey: RKey::new(if send { 0 } else { 0x77 }),
                    ssn: Ssn::new(sends),
                },
                len: (length - offset).min(PMTU) as usize,
                msg,
            });
        }
        psn = psn.wrapping_add(n);
        sends += u32::from(send);
    }
    out
}

/// Checks the SACK against the set of PSNs (as offsets from `first`) that arrived.
fn check_sack(r: &Reassembly, first: Psn, arrived: &BTreeSet<u32>) {
    let (cum, s) = r.sack();
    let cum_off = cum.wrapping_sub(first.value()).value().wrapping_add(1) & 0xff_ffff;
    // Everything before the expected PSN arrived, the expected PSN did not.
    assert_eq!(
        arrived.range(..cum_off).count() as u32,
        cum_off,
        "cumulative {cum:?}"
    );
    assert!(!arrived.contains(&cum_off));
    for i in 0..64u32 {
        assert_eq!(
            s.bitmap.covers(cum, cum.wrapping_add(i + 1)),
            arrived.contains(&(cum_off + i)),
            "bit {i}"
        );
    }
    assert_eq!(s.held as usize, arrived.range(cum_off..).count());
}

#[test]
fn in_order_message_places_and_completes_once() {
    let first = Psn::new(0xff_fffe);
    let pk = packets(first, &[700]);
    let mut r = Reassembly::new(first, 16, PMTU);
    for p in &pk {
        assert!(matches!(
            r.on_packet(p.psn, &p.t, p.len),
            Arrival::Place { .. }
        ));
    }
    let c = r.poll_completion().unwrap();
    assert_eq!(
        (c.first_psn, c.last_psn, c.length),
        (first, Psn::new(0), 700)
    );
    assert_eq!(r.poll_completion(), None);
    assert_eq!(r.epsn(), Psn::new(1));
    assert_eq!(
        r.on_packet(pk[1].psn, &pk[1].t, pk[1].len),
        Arrival::Duplicate
    );
    assert_eq!(r.counters().duplicates, 1);
}

#[test]
fn hole_then_fill_sacks_and_completes_in_order() {
    let first = Psn::new(10);
    let pk = packets(first, &[256, 256, 512]); // PSNs 10, 11, 12-13
    let mut r = Reassembly::new(first, 16, PMTU);
    for p in &pk[1..] {
        assert!(matches!(
            r.on_packet(p.psn, &p.t, p.len),
            Arrival::Place { .. }
        ));
    }
    assert_eq!(r.poll_completion(), None, "message 0 missing holds all");
    let (cum, s) = r.sack();
    assert_eq!(cum, Psn::new(9));
    assert_eq!(s.bitmap.0, 0b1110);
    assert_eq!(s.held, 3);
    assert_eq!(r.counters().ooo_placed, 3);
    assert!(matches!(
        r.on_packet(pk[0].psn, &pk[0].t, pk[0].len),
        Arrival::Place { .. }
    ));
    let got: Vec<Psn> = core::iter::from_fn(|| r.poll_completion())
        .map(|c| c.first_psn)
        .collect();
    assert_eq!(got, [Psn::new(10), Psn::new(11), Psn::new(12)]);
    assert_eq!(r.sack(), (Psn::new(13), SackTrailer::default()));
}

#[test]
fn beyond_window_and_inconsistent_packets_are_dropped_and_counted() {
    let first = Psn::new(0);
    let pk = packets(first, &[256 * 10]);
    let mut r = Reassembly::new(first, 4, PMTU);
    assert_eq!(
        r.on_packet(pk[4].psn, &pk[4].t, pk[4].len),
        Arrival::BeyondWindow
    );
    assert_eq!(r.counters().ooo_dropped_window, 1);
    assert!(matches!(
        r.on_packet(pk[2].psn, &pk[2].t, pk[2].len),
        Arrival::Place { .. }
    ));
    // The same message with another length.
    let mut t = pk[3].t;
    t.length += 1;
    assert!(matches!(
        r.on_packet(pk[3].psn, &t, pk[3].len),
        Arrival::Invalid(_)
    ));
    // A PSN that does not match the offset.
    assert!(matches!(
        r.on_packet(pk[1].psn, &pk[3].t, pk[3].len),
        Arrival::Invalid(_)
    ));
    // A second message overlapping the first.
    let other = packets(Psn::new(1), &[256])[0];
    assert!(matches!(
        r.on_packet(other.psn, &other.t, other.len),
        Arrival::Invalid(_)
    ));
    // Data longer than the trailer allows.
    assert!(matches!(
        r.on_packet(pk[1].psn, &pk[1].t, 300),
        Arrival::Invalid(_)
    ));
    assert_eq!(r.counters().invalid, 4);
    assert_eq!(r.counters().placed, 1, "nothing invalid was placed");
    assert_eq!(r.held(), 1);
}

#[test]
fn zero_length_message_completes() {
    let pk = packets(Psn::new(5), &[0, 256]);
    let mut r = Reassembly::new(Psn::new(5), 8, PMTU);
    assert_eq!(
        r.on_packet(pk[1].psn, &pk[1].t, pk[1].len),
        Arrival::Place {
            offset: 0,
            len: 256
        }
    );
    assert_eq!(
        r.on_packet(pk[0].psn, &pk[0].t, 0),
        Arrival::Place { offset: 0, len: 0 }
    );
    assert_eq!(r.poll_completion().map(|c| c.length), Some(0));
    assert_eq!(r.poll_completion().map(|c| c.length), Some(256));
}

/// Delivers the messages `lens` from `first` in rounds: each round the sender resends every
/// packet the last SACK does not cover, shuffled, each lost with probability `loss` and
/// duplicated with probability `dup`. Checks every invariant after every packet; returns the
/// rounds used.
fn run_reassembly(seed: u64, first: Psn, lens: &[u32], window: u32, loss: f64, dup: f64) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let pk = packets(first, lens);
    let mut r = Reassembly::new(first, window, PMTU);
    let mut arrived = BTreeSet::new();
    let mut placed: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0; l as usize]).collect();
    let mut completions = Vec::new();
    let mut rounds = 0;
    while completions.len() < lens.len() {
        rounds += 1;
        assert!(rounds < 10_000, "no progress");
        let (cum, s) = r.sack();
        let mut batch: Vec<Pkt> = pk
            .iter()
            .filter(|p| !s.bitmap.covers(cum, p.psn))
            .copied()
            .collect();
        batch.shuffle(&mut rng);
        for p in batch {
            if rng.random_bool(loss) {
                continue;
            }
            let copies = if rng.random_bool(dup) { 2 } else { 1 };
            for _ in 0..copies {
                let off = p.psn.wrapping_sub(first.value()).value();
                let in_window = p.psn.distance(r.epsn()) < r.window() as i32;
                match r.on_packet(p.psn, &p.t, p.len) {
                    Arrival::Place { offset, len } => {
                        assert!(arrived.insert(off), "placed twice: {:?}", p.psn);
                        for b in &mut placed[p.msg][offset as usize..(offset + len) as usize] {
                            *b += 1;
                        }
                    }
                    Arrival::Duplicate => assert!(arrived.contains(&off)),
                    Arrival::BeyondWindow => assert!(!in_window),
                    Arrival::Invalid(e) => panic!("valid packet refused: {e}"),
                    a @ (Arrival::Held | Arrival::BehindHeld) => panic!("no held request: {a:?}"),
                }
                check_sack(&r, first, &arrived);
                while let Some(c) = r.poll_completion() {
                    completions.push(c);
                }
            }
        }
    }
    // Completions in order, once each, each message's bytes placed exactly once.
    let firsts: Vec<Psn> = pk
        .iter()
        .filter(|p| p.t.offset == 0)
        .map(|p| p.psn)
        .collect();
    let got: Vec<Psn> = completions.iter().map(|c| c.first_psn).collect();
    assert_eq!(got, firsts);
    for (i, c) in completions.iter().enumerate() {
        assert_eq!(c.length, lens[i]);
        assert!(
            placed[i].iter().all(|&b| b == 1),
            "message {i}: bytes not placed once"
        );
    }
    assert_eq!(r.counters().placed as usize, pk.len());
    assert_eq!(r.held(), 0);
    rounds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any interleaving, duplication and loss-then-retransmit of a message sequence, across
    /// PSN wrap-around, places every byte once and completes every message once, in order,
    /// and the SACK always matches what arrived.
    #[test]
    fn reassembly_exactly_once_in_order(
        seed in any::<u64>(),
        first in 0xff_ff00u32..0x100_0040,
        lens in proptest::collection::vec(0u32..2000, 1..12),
        window in prop_oneof![Just(4u32), Just(16), Just(64), Just(200)],
        loss in 0.0f64..0.5,
        dup in 0.0f64..0.3,
    ) {
        run_reassembly(seed, Psn::new(first), &lens, window, loss, dup);
    }
}

#[test]
fn sr_resends_only_the_lost_packet_after_three_later_acks() {
    let mut s = SelectiveRepeat::new(
        Psn::MAX,
        SrConfig {
            window: 10,
            ..SrConfig::default()
        },
    );
    let t0 = Instant::ZERO;
    let sent: Vec<Psn> = (0..10).map(|_| s.on_send(t0).unwrap()).collect();
    assert_eq!(sent[1], Psn::new(0));
    assert!(!s.can_send() && s.on_send(t0).is_none(), "window of 10");
    // PSN sent[2] lost: the receiver acks sent[0..2] cumulatively and SACKs the rest one by one.
    let mut r = Reassembly::new(Psn::MAX, 64, PMTU);
    let pk = packets(Psn::MAX, &[PMTU; 10]);
    for (i, p) in pk.iter().enumerate() {
        if i == 2 {
            continue;
        }
        r.on_packet(p.psn, &p.t, p.len);
        let (cum, sack) = r.sack();
        s.on_ack(cum, Some(&sack));
        let got = s.poll_retransmit(t0);
        if i < 5 {
            assert_eq!(got, None, "after {i}: within the reordering tolerance");
        } else if i == 5 {
            assert_eq!(got, Some(sent[2]), "three later packets acked");
        } else {
            assert_eq!(got, None, "resent once");
        }
    }
    assert_eq!(s.counters().selective_retransmits, 1);
    assert!(s.is_sacked(sent[9]));
    assert_eq!(s.base(), sent[2]);
    r.on_packet(pk[2].psn, &pk[2].t, pk[2].len);
    let (cum, sack) = r.sack();
    assert_eq!(s.on_ack(cum, Some(&sack)), 1);
    assert_eq!(s.in_flight(), 0);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn sr_tail_loss_is_resent_on_timeout_and_bogus_acks_are_ignored() {
    let cfg = SrConfig {
        window: 4,
        rto: Duration::from_micros(100),
        ..SrConfig::default()
    };
    let mut s = SelectiveRepeat::new(Psn::new(0), cfg);
    let t0 = Instant::from_micros(1);
    for _ in 0..2 {
        s.on_send(t0);
    }
    s.on_ack(Psn::new(0), None);
    assert_eq!(s.on_ack(Psn::new(5), None), 0, "ack after anything sent");
    assert_eq!(s.counters().ack_invalid, 1);
    assert_eq!(s.poll_timeout(), Some(t0 + cfg.rto));
    s.handle_timeout(t0 + Duration::from_micros(99));
    assert_eq!(s.poll_retransmit(t0), None);
    let t1 = t0 + cfg.rto;
    s.handle_timeout(t1);
    assert_eq!(s.poll_retransmit(t1), Some(Psn::new(1)));
    assert_eq!(
        s.poll_timeout(),
        Some(t1 + cfg.rto),
        "re-armed from the resend"
    );
    assert_eq!(s.counters().timeouts, 1);
}

#[test]
fn bdp_window_rounds_up_and_clamps() {
    // 12.5 GB/s (100 Gb/s) over 10 us with 4096-byte packets: 125000 bytes = 31 packets.
    assert_eq!(
        bdp_window(12_500_000_000, Duration::from_micros(10), 4096, 4, 1024),
        31
    );
    assert_eq!(bdp_window(1, Duration::from_micros(1), 4096, 4, 1024), 4);
    assert_eq!(
        bdp_window(u64::MAX, Duration::from_secs(1), 1, 4, 1024),
        1024
    );
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Ev {
    /// Data packet index arrives at the receiver.
    Data(usize),
    /// An ACK arrives at the sender.
    Ack(u32, u64, u32),
}

/// Sender and receiver joined by a channel with random delay (reordering), loss and
/// duplication of data packets, and a lossless ACK channel. Returns (retransmits, time).
fn run_sr(seed: u64, n: usize, window: u32, loss: f64, dup: f64, jitter_ns: u64) -> (u64, Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let first = Psn::new(0xff_fff0);
    let pk = packets(first, &vec![PMTU; n]);
    let cfg = SrConfig {
        window,
        reorder_threshold: 3,
        rto: Duration::from_micros(200),
    };
    let mut s = SelectiveRepeat::new(first, cfg);
    let mut r = Reassembly::new(first, window, PMTU);
    let mut q: BinaryHeap<Reverse<(Instant, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut now = Instant::ZERO;
    let mut known = BTreeSet::new(); // PSNs the sender learnt were acknowledged
    let mut completed = 0usize;
    let delay = |rng: &mut StdRng| Duration::from_nanos(5_000 + rng.random_range(0..=jitter_ns));
    let send = |q: &mut BinaryHeap<_>, seq: &mut u64, rng: &mut StdRng, now: Instant, psn: Psn| {
        if rng.random_bool(loss) {
            return;
        }
        let idx = psn.wrapping_sub(first.value()).value() as usize;
        let copies = if rng.random_bool(dup) { 2 } else { 1 };
        for _ in 0..copies {
            *seq += 1;
            q.push(Reverse((now + delay(rng), *seq, Ev::Data(idx))));
        }
    };
    for _ in 0..1_000_000 {
        while let Some(psn) = s.poll_retransmit(now) {
            assert!(
                !known.contains(&psn.value()),
                "resent {psn:?}, which was acknowledged"
            );
            send(&mut q, &mut seq, &mut rng, now, psn);
        }
        while (s.next_psn().wrapping_sub(first.value()).value() as usize) < n && s.can_send() {
            let psn = s.on_send(now).unwrap();
            send(&mut q, &mut seq, &mut rng, now, psn);
        }
        assert!(s.in_flight() <= window);
        if completed == n {
            break;
        }
        let next_ev = q.peek().map(|Reverse((t, ..))| *t);
        let next = [next_ev, s.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("stuck");
        now = now.max(next);
        if s.poll_timeout().is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
        while q.peek().is_some_and(|Reverse((t, ..))| *t <= now) {
            let Some(Reverse((_, _, ev))) = q.pop() else {
                break;
            };
            match ev {
                Ev::Data(i) => {
                    let p = pk[i];
                    let a = r.on_packet(p.psn, &p.t, p.len);
                    assert!(!matches!(a, Arrival::Invalid(_)));
                    while let Some(c) = r.poll_completion() {
                        assert_eq!(c.first_psn, pk[completed].psn, "in order");
                        completed += 1;
                    }
                    let (cum, sack) = r.sack();
                    seq += 1;
                    q.push(Reverse((
                        now + Duration::from_micros(5),
                        seq,
                        Ev::Ack(cum.value(), sack.bitmap.0, sack.held),
                    )));
                }
                Ev::Ack(cum, bitmap, held) => {
                    let cum = Psn::new(cum);
                    let sack = SackTrailer {
                        bitmap: crate::wire::multipath::SackBitmap(bitmap),
                        held,
                    };
                    s.on_ack(cum, Some(&sack));
                    let cum_off =
                        cum.wrapping_sub(first.value()).value().wrapping_add(1) & 0xff_ffff;
                    for o in 0..cum_off.min(n as u32) {
                        known.insert(first.wrapping_add(o).value());
                    }
                    for p in sack.bitmap.psns(cum) {
                        known.insert(p.value());
                    }
                }
            }
        }
    }
    assert_eq!(completed, n, "all completed");
    assert_eq!(r.counters().placed as usize, n);
    (s.counters().selective_retransmits, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under any loss, duplication and reordering, every message completes once and in order,
    /// the window is never exceeded and no acknowledged PSN is ever resent.
    #[test]
    fn sr_with_reassembly_delivers_everything(
        seed in any::<u64>(),
        n in 1usize..300,
        window in 4u32..100,
        loss in 0.0f64..0.3,
        dup in 0.0f64..0.2,
        jitter_ns in 0u64..20_000,
    ) {
        run_sr(seed, n, window, loss, dup, jitter_ns);
    }

    /// Without loss and reordering, nothing is resent.
    #[test]
    fn sr_clean_channel_resends_nothing(seed in any::<u64>(), n in 1usize..300, window in 4u32..100) {
        prop_assert_eq!(run_sr(seed, n, window, 0.0, 0.0, 0).0, 0);
    }
}

#[test]
fn selective_repeat_resends_about_one_packet_per_loss() {
    // 1 % loss in a window of 64, in order: about one resend per loss (go-back-N would resend
    // the rest of the window, tens of packets, per loss).
    let (re, _) = run_sr(7, 2000, 64, 0.01, 0.0, 0);
    assert!(
        (5..=2000 / 100 * 3).contains(&re),
        "{re} retransmits for ~20 losses"
    );
}

// ------------------------------------------------------------ held READ requests and atomics

/// One message of a stream with held requests: data (a WRITE or SEND of `len` bytes) or a
/// READ request / atomic taking `psns` PSNs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Data(u32),
    Held(u32),
}

/// Delivers `kinds` from `first` in rounds as [`run_reassembly`] does, with READ requests and
/// atomics among the messages ([`Reassembly::on_held`]). The sender keeps the rule `on_held`
/// needs: nothing past a held request goes before the request is acknowledged. Checks after
/// every packet: each PSN placed or held once, never refused as invalid, a packet refused
/// behind a held request only while one before it waits; completions once each, in order;
/// and when a held request completes (executes), every message before it has completed and
/// no byte after it has been placed.
fn run_held(seed: u64, first: Psn, kinds: &[Kind], window: u32, loss: f64, dup: f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // (psn, held span or data packet, message index)
    let mut pk: Vec<(Psn, Option<u32>, Option<Pkt>, usize)> = Vec::new();
    let mut psn = first;
    let mut sends = 0;
    for (msg, k) in kinds.iter().enumerate() {
        match *k {
            Kind::Held(n) => {
                pk.push((psn, Some(n), None, msg));
                psn = psn.wrapping_add(n);
            }
            Kind::Data(len) => {
                for mut p in packets(psn, &[len]) {
                    p.msg = msg;
                    p.t.ssn = Ssn::new(sends);
                    pk.push((p.psn, None, Some(p), msg));
                }
                sends += 1;
                psn = psn.wrapping_add(len.div_ceil(PMTU).max(1));
            }
        }
    }
    let off = |p: Psn| p.wrapping_sub(first.value()).value();
    let mut r = Reassembly::new(first, window, PMTU);
    let mut arrived = BTreeSet::new();
    let mut placed_after: Vec<u32> = vec![0; kinds.len()];
    let mut completions: Vec<Completion> = Vec::new();
    let mut rounds = 0;
    while completions.len() < kinds.len() {
        rounds += 1;
        assert!(rounds < 20_000, "no progress");
        let (cum, s) = r.sack();
        let acked = |p: Psn| s.bitmap.covers(cum, p);
        // Everything not acknowledged, up to and including the first held request that is not.
        let stop = pk
            .iter()
            .position(|(p, h, ..)| h.is_some() && !acked(*p))
            .map_or(pk.len(), |i| i + 1);
        let mut batch: Vec<_> = pk[..stop].iter().filter(|x| !acked(x.0)).copied().collect();
        batch.shuffle(&mut rng);
        for (p, span, data, msg) in batch {
            if rng.random_bool(loss) {
                continue;
            }
            for _ in 0..if rng.random_bool(dup) { 2 } else { 1 } {
                let waiting = completions.len() < msg
                    && kinds[completions.len()..msg]
                        .iter()
                        .any(|k| matches!(k, Kind::Held(_)));
                let a = match (span, data) {
                    (Some(n), _) => r.on_held(p, n),
                    (_, Some(d)) => r.on_packet(p, &d.t, d.len),
                    _ => unreachable!(),
                };
                match a {
                    Arrival::Held => {
                        let n = span.unwrap_or(1);
                        for i in 0..n {
                            assert!(arrived.insert(off(p) + i), "held twice: {p:?}");
                        }
                    }
                    Arrival::Place { .. } => {
                        assert!(arrived.insert(off(p)), "placed twice: {p:?}");
                        placed_after[msg] += 1;
                    }
                    Arrival::Duplicate => assert!(arrived.contains(&off(p))),
                    Arrival::BeyondWindow => {
                        assert!(p.distance(r.epsn()) + span.unwrap_or(1) as i32 > window as i32);
                    }
                    Arrival::BehindHeld => assert!(waiting, "refused behind nothing: {p:?}"),
                    Arrival::Invalid(e) => panic!("valid packet refused: {e}"),
                }
                check_sack(&r, first, &arrived);
                while let Some(c) = r.poll_completion() {
                    let i = completions.len();
                    assert_eq!(c.held, matches!(kinds[i], Kind::Held(_)), "message {i}");
                    if c.held {
                        assert!(
                            placed_after[i + 1..].iter().all(|&n| n == 0),
                            "message {i} executes after data that follows it was placed"
                        );
                    }
                    completions.push(c);
                }
            }
        }
    }
    let firsts: Vec<Psn> = pk
        .iter()
        .filter(|x| x.2.is_none_or(|d| d.t.offset == 0))
        .map(|x| x.0)
        .collect();
    let got: Vec<Psn> = completions.iter().map(|c| c.first_psn).collect();
    assert_eq!(got, firsts, "once each, in order");
    let held = kinds.iter().filter(|k| matches!(k, Kind::Held(_))).count();
    assert_eq!(r.counters().held_requests as usize, held);
    assert_eq!(r.held(), 0);
    assert!(r.is_idle());
}

#[test]
fn a_held_read_executes_in_order_and_refuses_data_behind_it() {
    let first = Psn::new(0xff_fffe);
    let mut r = Reassembly::new(first, 64, PMTU);
    let w = packets(first, &[300]); // PSNs first, first + 1
    let read = first.wrapping_add(2); // 3 PSNs
    let after = packets(first.wrapping_add(5), &[100]);
    // The READ arrives before the WRITE's second packet: held, its PSNs SACKed.
    assert!(matches!(
        r.on_packet(w[0].psn, &w[0].t, w[0].len),
        Arrival::Place { .. }
    ));
    assert_eq!(r.on_held(read, 3), Arrival::Held);
    assert_eq!(r.on_held(read, 3), Arrival::Duplicate);
    let (cum, s) = r.sack();
    assert_eq!(cum, first);
    assert!((2..5).all(|i| s.bitmap.covers(cum, first.wrapping_add(i))));
    // Data after it is refused while it waits.
    assert_eq!(
        r.on_packet(after[0].psn, &after[0].t, after[0].len),
        Arrival::BehindHeld
    );
    assert!(r.poll_completion().is_none());
    // The hole fills: the WRITE completes, then the READ, in order.
    assert!(matches!(
        r.on_packet(w[1].psn, &w[1].t, w[1].len),
        Arrival::Place { .. }
    ));
    let c: Vec<(Psn, bool)> = core::iter::from_fn(|| r.poll_completion())
        .map(|c| (c.first_psn, c.held))
        .collect();
    assert_eq!(c, [(first, false), (read, true)]);
    assert_eq!(r.epsn(), first.wrapping_add(5));
    // Now the data after it is placed, and a late copy of the READ is a duplicate.
    assert!(matches!(
        r.on_packet(after[0].psn, &after[0].t, after[0].len),
        Arrival::Place { .. }
    ));
    assert_eq!(r.on_held(read, 3), Arrival::Duplicate);
    // A request after data that follows it breaks the sender's rule: refused.
    let mut r = Reassembly::new(first, 64, PMTU);
    let late = packets(first.wrapping_add(1), &[10]);
    assert!(matches!(
        r.on_packet(late[0].psn, &late[0].t, late[0].len),
        Arrival::Place { .. }
    ));
    assert!(matches!(r.on_held(first, 1), Arrival::Invalid(_)));
    assert!(r.is_idle() || r.held() == 1);
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        2 => (0u32..2000).prop_map(Kind::Data),
        1 => (1u32..9).prop_map(Kind::Held),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any interleaving, duplication and loss of a stream of WRITEs, SENDs, READ requests and
    /// atomics, across PSN wrap-around, with the sender's rule kept: every PSN placed or held
    /// once, every message completed once and in order, and no held request sees data that
    /// follows it.
    #[test]
    fn held_requests_execute_once_in_order_before_later_data(
        seed in any::<u64>(),
        first in 0xff_ff00u32..0x100_0040,
        kinds in proptest::collection::vec(arb_kind(), 1..12),
        window in prop_oneof![Just(16u32), Just(64), Just(200)],
        loss in 0.0f64..0.5,
        dup in 0.0f64..0.3,
    ) {
        run_held(seed, Psn::new(first), &kinds, window, loss, dup);
    }
}
