//! Batch guards on a real socket: an uncommitted TX batch rolls back (nothing sent, frames still
//! queued and held), an RX batch dropped before reading leaves its descriptors on the ring, and
//! the frame accounting adds up at every step. Needs root and the real eBPF object.

mod xsk_support;

use std::time::{Duration, Instant};

use roce::{
    engine::{Engine, EngineConfig, Handler, Instant as EngineInstant, RoceTemplate, RxVerdict},
    loader::AttachMode,
    xsk::{FrameAccounting, TxSink, XskConfig, XskQueue, monotonic_ns},
};
use xsk_support::*;

const N: u64 = 100;

#[track_caller]
fn settle(q: &mut XskQueue, done: impl Fn(&XskQueue) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(q) {
        assert!(
            Instant::now() < deadline,
            "did not settle: {:?}",
            q.accounting()
        );
        q.reap_completions();
        q.flush_tx();
        q.wait(Some(Duration::from_millis(5))).expect("poll");
    }
}

/// roce_xdp on A with [`QPN`] registered and an A socket on queue 0 in `ROCE_XSKS`, made
/// inside A's namespace.
fn receiver_in_a(pair: &Pair) -> (XdpProg, XskQueue) {
    let a_if = pair.a().ifname.clone();
    pair.in_a(move || {
        let mut prog = XdpProg::attach(&a_if, &[QPN]);
        let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
        prog.set_xsk(&q);
        (prog, q)
    })
    .join()
    .expect("A setup")
}

/// Waits until roce_xdp on A has redirected `n` frames.
#[track_caller]
fn await_redirected(prog: &XdpProg, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while prog.stats().redirected < n {
        assert!(
            Instant::now() < deadline,
            "frames did not arrive: {:?}",
            prog.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn tx_rollback_and_rx_unread_stay_put() {
    let pair = Pair::new(1);
    let b_if = pair.b().ifname.clone();
    let tmpl = RoceTemplate::new(&pair.b_to_a(128));

    // A: the frames wait on the RX ring; a batch dropped unread leaves them there.
    let (prog, mut q) = receiver_in_a(&pair);
    let start: FrameAccounting = q.accounting();

    // B: queue frames, roll a batch back, then send them for real.
    let sender = pair.in_b(move || {
        let mut q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B");
        let start = q.accounting();
        q.with_tx_sink(|tx| {
            for seq in 0..N {
                tx.send(|buf| tmpl.write(buf, seq)).expect("room");
            }
        });
        let queued = q.accounting();
        assert_eq!(queued.app, N as u32);
        assert_eq!(q.backlog_len(), N as usize);
        {
            let mut b = q.tx_batch(N as u32);
            assert_eq!(b.stage_backlog(), N as usize);
            // Dropped without commit: rolled back.
        }
        assert_eq!(q.accounting(), queued, "rollback moved frames");
        assert_eq!(q.backlog_len(), N as usize);
        assert_eq!(q.stats().tx_packets, 0);
        // Now for real.
        assert_eq!(q.flush_tx(), N as usize);
        settle(&mut q, XskQueue::tx_idle);
        let s = q.stats();
        assert_eq!((s.tx_packets, s.tx_completed), (N, N));
        assert_eq!(q.accounting(), start);
        start
    });

    sender.join().expect("sender");
    await_redirected(&prog, N);
    {
        let b = q.rx_batch(N as u32);
        assert_eq!(u64::from(b.capacity()), N);
        // Dropped without reading: every descriptor stays on the ring.
    }
    {
        let b = q.rx_batch(N as u32);
        b.commit(); // Committing an unread batch releases nothing.
    }
    assert_eq!(q.accounting(), start, "unread batches moved frames");
    let mut seen = 0;
    let got = q.receive(N as u32 * 2, |frame, _tx| {
        assert_eq!(RoceTemplate::seq_of(frame), Some(seen));
        seen += 1;
        RxVerdict::Recycle
    });
    assert_eq!(u64::from(got), N);
    assert_eq!(q.stats().rx_packets, N);
    let after = q.accounting();
    assert!(after.is_consistent());
    assert_eq!((after.app, after.kernel_tx), (0, 0));
    assert_eq!(after.kernel_rx, start.kernel_rx - N as u32);
    q.refill();
    assert_eq!(q.accounting(), start);
    drop(q);
    drop(prog);
}

/// Counts the frames handed to it, in sequence order.
#[derive(Default)]
struct Counter {
    seen: u64,
    out_of_order: u64,
}

impl Handler for Counter {
    fn on_rx(&mut self, _now: EngineInstant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        if RoceTemplate::seq_of(frame) != Some(self.seen) {
            self.out_of_order += 1;
        }
        self.seen += 1;
        RxVerdict::Recycle
    }
}

/// Frames the kernel put into the RX ring before an engine stops reach its handler in the
/// engine's drain, so that they are counted (received, or dropped for a QP that is gone)
/// rather than closed away with the socket. A device unsets its sockets in `ROCE_XSKS` before
/// it stops its engines, so after the drain no frame can land in the ring unseen.
#[test]
fn frames_waiting_at_stop_reach_the_handler_in_the_drain() {
    let pair = Pair::new(1);
    let b_if = pair.b().ifname.clone();
    let tmpl = RoceTemplate::new(&pair.b_to_a(128));
    let (prog, q) = receiver_in_a(&pair);
    let sender = pair.in_b(move || {
        let mut q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B");
        q.with_tx_sink(|tx| {
            for seq in 0..N {
                tx.send(|buf| tmpl.write(buf, seq)).expect("room");
            }
        });
        q.flush_tx();
        settle(&mut q, XskQueue::tx_idle);
    });
    sender.join().expect("sender");
    await_redirected(&prog, N);
    // The engine never ran a turn: everything is still on the RX ring when it stops.
    let mut e = Engine::new(q, Counter::default(), EngineConfig::default());
    e.finish().expect("drain");
    let (q, counter) = e.into_parts();
    assert_eq!(counter.seen, N, "frames left on the RX ring at the stop");
    assert_eq!(counter.out_of_order, 0);
    assert_eq!(q.stats().rx_packets, N);
    drop(q);
    drop(prog);
}

/// Issue 20: every frame roce_xdp redirects reaches the socket with its arrival stamp in front
/// of it (XDP metadata, which copy-mode AF_XDP copies into the UMEM frame), in native XDP on
/// veth and in generic (SKB) XDP. The clock is read for the frames whose arrival the transport
/// uses: here the CE-marked ones, every other frame of the sequence, whose stamps lie between
/// the send and the receive and rise with the sequence. The unmarked SENDs between them carry
/// `stamp::UNTIMED` (no time, counted in `rx_untimed`), and no frame counts as unstamped
/// (`rx_no_stamp`). Frames held on the RX ring for a while keep the time they arrived, not the
/// time they were taken. Where the kernel refuses roce_xdp `bpf_xdp_adjust_meta`, the stamp
/// comes over the frame's destination address, which the socket puts back
/// (`FLAG_STAMP_IN_PLACE`): every frame reaches the handler byte for byte as it was sent.
#[test]
fn received_frames_carry_their_arrival_stamp() {
    for mode in [AttachMode::Native, AttachMode::Skb] {
        let pair = Pair::new(1);
        let (a_if, b_if) = (pair.a().ifname.clone(), pair.b().ifname.clone());
        let tmpl = RoceTemplate::new(&pair.b_to_a(128));
        let sent = tmpl.clone();
        let (prog, mut q) = pair
            .in_a(move || {
                let mut prog = XdpProg::attach_mode(&a_if, &[QPN], mode);
                let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
                prog.set_xsk(&q);
                (prog, q)
            })
            .join()
            .expect("A setup");
        let sent_from = monotonic_ns();
        let sender = pair.in_b(move || {
            let mut q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B");
            q.with_tx_sink(|tx| {
                for seq in 0..N {
                    tx.send(|buf| {
                        let len = tmpl.write(buf, seq);
                        if seq % 2 == 0 {
                            mark_ce(buf);
                        }
                        len
                    })
                    .expect("room");
                }
            });
            q.flush_tx();
            settle(&mut q, XskQueue::tx_idle);
        });
        sender.join().expect("sender");
        await_redirected(&prog, N);
        let sent_by = monotonic_ns();
        // The frames wait on the ring: their stamps must say when they came, not now.
        std::thread::sleep(Duration::from_millis(20));
        let (mut seen, mut last) = (0, 0);
        let got = q.receive_stamped(N as u32, |frame, stamp, _tx| {
            assert_eq!(RoceTemplate::seq_of(frame), Some(seen));
            let mut want = vec![0; 2048];
            let len = sent.write(&mut want, seen);
            if seen % 2 == 0 {
                mark_ce(&mut want);
            }
            assert_eq!(
                frame,
                &want[..len],
                "{mode:?}: frame {seen} reaches the socket as it was sent"
            );
            if seen % 2 == 1 {
                // An unmarked SEND: the transport takes no time from it.
                assert_eq!(stamp, None, "{mode:?}: frame {seen} is untimed");
                seen += 1;
                return RxVerdict::Recycle;
            }
            let at = stamp.unwrap_or_else(|| panic!("{mode:?}: frame {seen} has no stamp"));
            assert!(
                (sent_from..=sent_by).contains(&at) && at >= last,
                "{mode:?}: frame {seen} stamped {at}, sent in [{sent_from}, {sent_by}], \
                 previous {last}"
            );
            last = at;
            seen += 1;
            RxVerdict::Recycle
        });
        assert_eq!(u64::from(got), N);
        let s = q.stats();
        assert_eq!(
            (s.rx_packets, s.rx_no_stamp, s.rx_untimed),
            (N, 0, N / 2),
            "{mode:?}"
        );
        drop(q);
        drop(prog);
    }
}

/// Issue 20: a response's arrival is timed only for a QP whose congestion control samples RTTs
/// from its responses (Swift; `QP_FLAG_TIME_RESPONSES` in its `ROCE_QPS` entry, which
/// `api::Device` sets from the QP's algorithm): ACKs to a QP without the flag carry
/// `stamp::UNTIMED` but for the CE-marked ones (the notification point's rule, for every QP),
/// and the same ACKs after the flag is set all carry their arrival times.
#[test]
fn responses_are_timed_only_for_qps_that_sample_rtts() {
    let pair = Pair::new(1);
    let a_if = pair.a().ifname.clone();
    // 62 bytes: a BTH, four bytes where an ACK has its AETH, the ICRC.
    let tmpl = RoceTemplate::new(&pair.b_to_a(62));
    let (prog, mut q) = pair
        .in_a(move || {
            let mut prog = XdpProg::attach(&a_if, &[QPN]);
            let q = XskQueue::open(&a_if, 0, &XskConfig::default()).expect("open A");
            prog.set_xsk(&q);
            (prog, q)
        })
        .join()
        .expect("A setup");
    let mut redirected = 0;
    for (flags, ce_every_other) in [
        (0, true),
        (roce_common::maps::QP_FLAG_TIME_RESPONSES, false),
    ] {
        prog.set_qp_flags(QPN, flags);
        let (b_if, tmpl) = (pair.b().ifname.clone(), tmpl.clone());
        let sent_from = monotonic_ns();
        pair.in_b(move || {
            let mut q = XskQueue::open(&b_if, 0, &XskConfig::default()).expect("open B");
            q.with_tx_sink(|tx| {
                for seq in 0..N {
                    tx.send(|buf| {
                        let len = tmpl.write(buf, seq);
                        buf[42] = roce::wire::Opcode::RC_ACKNOWLEDGE.0;
                        if ce_every_other && seq % 2 == 0 {
                            mark_ce(buf);
                        }
                        len
                    })
                    .expect("room");
                }
            });
            q.flush_tx();
            settle(&mut q, XskQueue::tx_idle);
        })
        .join()
        .expect("sender");
        redirected += N;
        await_redirected(&prog, redirected);
        let sent_by = monotonic_ns();
        let untimed_before = q.stats().rx_untimed;
        let mut seen = 0;
        let got = q.receive_stamped(N as u32, |_frame, stamp, _tx| {
            let timed = !ce_every_other || seen % 2 == 0;
            match stamp {
                Some(at) => assert!(
                    timed && (sent_from..=sent_by).contains(&at),
                    "flags {flags}: ACK {seen} stamped {at}, sent in [{sent_from}, {sent_by}]"
                ),
                None => assert!(!timed, "flags {flags}: ACK {seen} has no time"),
            }
            seen += 1;
            RxVerdict::Recycle
        });
        assert_eq!(u64::from(got), N);
        let untimed = if ce_every_other { N / 2 } else { 0 };
        assert_eq!(
            q.stats().rx_untimed - untimed_before,
            untimed,
            "flags {flags}"
        );
        assert_eq!(q.stats().rx_no_stamp, 0);
    }
    drop(q);
    drop(prog);
}

/// A `roce_xdp` pinned by a build from before the stamp went over the destination address
/// (`FLAG_STAMP_PUSHED`: it pushes 8 bytes in front of each frame) can outlive an upgrade; a
/// socket refuses its interface with an error that says to load the program again, rather
/// than read every frame 8 bytes off.
#[test]
fn a_socket_refuses_a_program_that_pushes_its_stamp() {
    let pair = Pair::new(1);
    let a_if = pair.a().ifname.clone();
    pair.in_a(move || {
        let _prog = XdpProg::attach(&a_if, &[QPN]);
        let path = roce::loader::pin_dir(&a_if).join(roce_common::maps::MAP_INFO);
        let pin = aya::maps::MapData::from_pin(&path).expect("ROCE_INFO pin");
        let mut info: aya::maps::Array<_, roce_common::maps::LoadInfo> =
            aya::maps::Array::try_from(aya::maps::Map::Array(pin)).expect("ROCE_INFO");
        let mut record = info.get(&0, 0).expect("load record");
        record.flags |= roce_common::maps::FLAG_STAMP_PUSHED;
        info.set(0, record, 0).expect("write the load record");
        let Err(err) = XskQueue::open(&a_if, 0, &XskConfig::default()) else {
            panic!("a socket opened on a program that pushes its stamp");
        };
        assert!(
            matches!(err, roce::xsk::XskError::StaleProgram(ref i) if *i == a_if),
            "{err}"
        );
        assert!(err.to_string().contains("roce load -i"), "{err}");
    })
    .join()
    .expect("A");
}

/// Marks the IPv4 frame in `buf` (no VLAN tag) Congestion Experienced and mends its header
/// checksum; the ICRC masks the ECN bits, so it stays valid.
fn mark_ce(buf: &mut [u8]) {
    let mut ip = roce::wire::ipv4::Packet::new_unchecked(&mut buf[14..34]);
    ip.set_tos(ip.tos() | 0x3);
    ip.fill_checksum();
}
