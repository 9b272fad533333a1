//! Seeded random schedules on the two-endpoint simulator: mixed SEND / SEND with immediate /
//! WRITE / WRITE with immediate / READ / compare-and-swap / fetch-and-add, sizes 0 B..1 MiB,
//! over a link with 0-20 % loss, duplication and reordering, plus corruption and CE marks of
//! ECN-capable frames, with DCQCN on (CNPs, rate cuts, pacing of requests and READ responses).
//!
//! Invariant checked for every seed: either every WR completes exactly once, in order, with
//! success and byte-identical data (atomics checked against a model), or, when the transport
//! retries run out, the requester QP ends in ERR with exactly one RETRY_EXC_ERR (or
//! RNR_RETRY_EXC_ERR) completion followed by WR_FLUSH_ERR for every later WR, and nothing lost.
//!
//! Every test prints its seed. Replay one with `ROCE_SIM_SEED=<seed>`; `ROCE_SIM_MESSAGES=<n>`
//! sets the number of messages per seed, `ROCE_SIM_TIMEOUT=<code>` the local ACK timeout (default
//! 8, ~1 ms) and `ROCE_SIM_CC=off` turns congestion control off. In debug builds the suite runs 4 seeds of 1,500
//! messages each (6,000 in all, ~10-15 s on 2 cores) with sizes above 4 KiB scaled down 8x
//! (1 MiB -> 128 KiB), 3 seeds x 2 links with few retries, and 8 QP pairs sharing one link.
//! The full run (10,000 messages, real sizes up to 1 MiB, ~45 s) is `full_10k_messages_release`,
//! which CI runs with `cargo test --release -p roce-user --test transport_sim -- --ignored`.

use rand::{RngExt, SeedableRng, rngs::StdRng};
use roce::transport::{
    Access, Device, DeviceConfig, LKey, QpState, RKey, RecvWr, SendOp, SendWr, Sge, WcFlags,
    WcOpcode, WcStatus,
    sim::{Endpoint, Link, Pair, RcConfig, connect_rc},
};

const CAP: u64 = 8 << 20;
const COUNTER_OFF: u64 = 0;
const DATA_OFF: u64 = 64;

#[derive(Clone, Copy, Debug)]
enum Op {
    Send { imm: Option<u32> },
    Write { imm: Option<u32> },
    Read,
    Cas { compare: u64, swap: u64 },
    Fadd { add: u64 },
}

#[derive(Debug)]
struct Msg {
    id: u64,
    op: Op,
    len: u64,
    a_off: u64,
    b_off: u64,
    /// Atomics: the original value the model predicts.
    expect_orig: u64,
}

fn pat(seed: u64, id: u64, off: u64) -> u8 {
    (seed ^ id.wrapping_mul(0x9e37_79b9) ^ off.wrapping_mul(7)).wrapping_add(off >> 8) as u8
}

struct Run {
    seed: u64,
    pair: Pair,
    a: Endpoint,
    b: Endpoint,
    ma: (LKey, RKey),
    mb: (LKey, RKey),
    rng: StdRng,
    counter: u64,
    next_id: u64,
    scale: u64,
    bidir: bool,
}

fn sge(mr: (LKey, RKey), off: u64, len: u64) -> Vec<Sge> {
    vec![Sge {
        addr: 0x1_0000 + off,
        length: len as u32,
        lkey: mr.0,
    }]
}

#[derive(Debug, Default)]
struct Outcome {
    completed: u64,
    failed_at: Option<(u64, WcStatus)>,
}

impl Run {
    fn new(seed: u64, link: Link, cfg: &RcConfig, scale: u64) -> Self {
        // Congestion control on, as the endpoint runs: data ECT(0), the link CE-marks up to 5 %
        // of it, CNPs flow both ways and DCQCN paces both requesters and READ responders
        // (`ROCE_SIM_CC=off` runs the same schedules without it).
        let config = DeviceConfig {
            cc: if std::env::var("ROCE_SIM_CC").is_ok_and(|v| v == "off") {
                roce::transport::CcConfig::off()
            } else {
                roce::transport::CcConfig::default()
            },
            ..DeviceConfig::default()
        };
        let mut pair = Pair::new(seed, config, link);
        let (a, b) = connect_rc(&mut pair, cfg);
        let mr = |d: &mut Device, pd| {
            let m = d
                .reg_mr(pd, vec![0; CAP as usize], 0x1_0000, Access::all())
                .unwrap();
            (m.lkey, m.rkey)
        };
        let ma = mr(&mut pair.a, a.pd);
        let mb = mr(&mut pair.b, b.pd);
        Self {
            seed,
            pair,
            a,
            b,
            ma,
            mb,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
            counter: 0,
            next_id: 1,
            scale,
            bidir: false,
        }
    }

    fn size(&mut self) -> u64 {
        let r = self.rng.random_range(0..100u32);
        let s = match r {
            0..5 => 0,
            5..60 => self.rng.random_range(1..=4096),
            60..90 => self.rng.random_range(4097..=65536),
            _ => self.rng.random_range(65537..=1 << 20),
        };
        if s > 4096 { s / self.scale } else { s }
    }

    fn op(&mut self) -> Op {
        let imm = || Some(0xfeed_0000);
        match self.rng.random_range(0..100u32) {
            0..25 => Op::Send { imm: None },
            25..35 => Op::Send { imm: imm() },
            35..55 => Op::Write { imm: None },
            55..65 => Op::Write { imm: imm() },
            65..85 => Op::Read,
            85..93 => Op::Cas {
                compare: if self.rng.random_bool(0.5) {
                    self.counter
                } else {
                    self.counter ^ 1
                },
                swap: self.rng.random_range(0..1000),
            },
            _ => Op::Fadd {
                add: self.rng.random_range(1..100),
            },
        }
    }

    /// Posts a batch, drives it to completion and checks it. Returns how many WRs of the
    /// batch succeeded, and the first failure.
    fn batch(&mut self, n: u64) -> Outcome {
        let mut msgs = Vec::new();
        let (mut a_off, mut b_off) = (DATA_OFF, DATA_OFF);
        for _ in 0..n {
            let op = self.op();
            let len = match op {
                Op::Cas { .. } | Op::Fadd { .. } => 8,
                _ => self.size(),
            };
            if a_off + len > CAP || b_off + len > CAP {
                break;
            }
            let id = self.next_id;
            self.next_id += 1;
            let expect_orig = self.counter;
            match op {
                Op::Cas { compare, swap } if self.counter == compare => self.counter = swap,
                Op::Fadd { add } => self.counter = self.counter.wrapping_add(add),
                _ => {}
            }
            msgs.push(Msg {
                id,
                op,
                len,
                a_off,
                b_off,
                expect_orig,
            });
            a_off = (a_off + len + 7) & !7;
            b_off = (b_off + len + 7) & !7;
        }
        let seed = self.seed;
        let mut recvs = Vec::new();
        for m in &msgs {
            let (la, lb) = (self.ma.0, self.mb.0);
            let (src_dev, src_lkey, src_off) = match m.op {
                Op::Read => (&mut self.pair.b, lb, m.b_off),
                _ => (&mut self.pair.a, la, m.a_off),
            };
            let mem = src_dev.mrs_mut().bytes_mut(src_lkey).unwrap();
            for i in 0..m.len {
                mem[(src_off + i) as usize] = pat(seed, m.id, i);
            }
            let rb = self.mb.1;
            let remote = 0x1_0000 + m.b_off;
            let (op, sg) = match m.op {
                Op::Send { imm } => (
                    imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm }),
                    sge(self.ma, m.a_off, m.len),
                ),
                Op::Write { imm } => (
                    match imm {
                        Some(imm) => SendOp::WriteWithImm {
                            remote_addr: remote,
                            rkey: rb,
                            imm,
                        },
                        None => SendOp::Write {
                            remote_addr: remote,
                            rkey: rb,
                        },
                    },
                    sge(self.ma, m.a_off, m.len),
                ),
                Op::Read => (
                    SendOp::Read {
                        remote_addr: remote,
                        rkey: rb,
                    },
                    sge(self.ma, m.a_off, m.len),
                ),
                Op::Cas { compare, swap } => (
                    SendOp::CompareSwap {
                        remote_addr: 0x1_0000 + COUNTER_OFF,
                        rkey: rb,
                        compare,
                        swap,
                    },
                    sge(self.ma, m.a_off, 8),
                ),
                Op::Fadd { add } => (
                    SendOp::FetchAdd {
                        remote_addr: 0x1_0000 + COUNTER_OFF,
                        rkey: rb,
                        add,
                    },
                    sge(self.ma, m.a_off, 8),
                ),
            };
            match m.op {
                Op::Send { .. } => recvs.push(RecvWr {
                    wr_id: m.id,
                    sg_list: sge(self.mb, m.b_off, m.len),
                }),
                Op::Write { imm: Some(_) } => recvs.push(RecvWr {
                    wr_id: m.id,
                    sg_list: vec![],
                }),
                _ => {}
            }
            self.pair
                .a
                .post_send(self.a.qpn, SendWr::new(m.id, op, sg))
                .unwrap();
        }
        let want_b = msgs
            .iter()
            .filter(|m| matches!(m.op, Op::Send { .. } | Op::Write { imm: Some(_) }))
            .count();
        // Reverse traffic: B sends to A at the same time, so both QPs are requester and
        // responder at once.
        let mut rev = Vec::new();
        if self.bidir {
            for _ in 0..self.rng.random_range(0..4u32) {
                let len = self.rng.random_range(0..=8192u64);
                if a_off + len > CAP || b_off + len > CAP {
                    break;
                }
                let id = (1 << 40) | self.next_id;
                self.next_id += 1;
                let mem = self.pair.b.mrs_mut().bytes_mut(self.mb.0).unwrap();
                for i in 0..len {
                    mem[(b_off + i) as usize] = pat(seed, id, i);
                }
                self.pair
                    .a
                    .post_recv(
                        self.a.qpn,
                        RecvWr {
                            wr_id: id,
                            sg_list: sge(self.ma, a_off, len),
                        },
                    )
                    .unwrap();
                self.pair
                    .b
                    .post_send(self.b.qpn, SendWr::send(id, sge(self.mb, b_off, len)))
                    .unwrap();
                rev.push((id, len, a_off));
                a_off = (a_off + len + 7) & !7;
                b_off = (b_off + len + 7) & !7;
            }
        }
        // Late receives: the responder has no receive WQE at first, so SENDs meet RNR NAKs.
        let late = self.rng.random_bool(0.25);
        if !late {
            for r in recvs.drain(..) {
                self.pair.b.post_recv(self.b.qpn, r).unwrap();
            }
        }
        let (a, b) = (self.a, self.b);
        let mut wa = Vec::new();
        let mut wb = Vec::new();
        let mut wa_recv = Vec::new();
        let mut wb_send = Vec::new();
        let mut steps = 0u64;
        let done = self.pair.drive_until(50_000_000, |p| {
            steps += 1;
            if steps == 300 {
                for r in recvs.drain(..) {
                    p.b.post_recv(b.qpn, r).unwrap();
                }
            }
            for w in core::iter::from_fn(|| p.a.poll_cq(a.cq)) {
                if w.opcode == WcOpcode::Recv {
                    wa_recv.push(w)
                } else {
                    wa.push(w)
                }
            }
            for w in core::iter::from_fn(|| p.b.poll_cq(b.cq)) {
                if w.opcode == WcOpcode::Send {
                    wb_send.push(w)
                } else {
                    wb.push(w)
                }
            }
            let a_err = p.a.qp(a.qpn).unwrap().state() == QpState::Err;
            (wa.len() == msgs.len()
                && wb.len() == want_b
                && wa_recv.len() == rev.len()
                && wb_send.len() == rev.len())
                || (a_err && wa.len() == msgs.len())
        });
        assert!(
            done,
            "seed {seed}: batch did not finish: {} of {} requester completions, {} of {want_b} \
             receive completions, link {:?}, sim time {:?}, A {:?}, A's DCQCN {:?}, B's {:?}, B {:?}",
            wa.len(),
            msgs.len(),
            wb.len(),
            self.pair.stats,
            self.pair.time,
            self.pair.a.qp(a.qpn).unwrap().counters(),
            self.pair.a.cc_snapshots(),
            self.pair.b.cc_snapshots(),
            self.pair.b.qp(b.qpn).unwrap().counters(),
        );
        if self.pair.a.qp(a.qpn).unwrap().state() != QpState::Err {
            // The reverse direction: exactly once, in order, byte-identical.
            let ids: Vec<u64> = wb_send.iter().map(|w| w.wr_id).collect();
            let want: Vec<u64> = rev.iter().map(|r| r.0).collect();
            assert_eq!(ids, want, "seed {seed}: reverse sends");
            assert!(
                wb_send.iter().all(|w| w.status == WcStatus::Success),
                "seed {seed}"
            );
            let ids: Vec<u64> = wa_recv.iter().map(|w| w.wr_id).collect();
            assert_eq!(ids, want, "seed {seed}: reverse receives");
            let mem = self.pair.a.mrs().bytes(self.ma.0).unwrap();
            for (w, &(id, len, off)) in wa_recv.iter().zip(&rev) {
                assert_eq!(u64::from(w.byte_len), len, "seed {seed}");
                for i in 0..len {
                    assert_eq!(
                        mem[(off + i) as usize],
                        pat(seed, id, i),
                        "seed {seed}: reverse {id}"
                    );
                }
            }
        }
        assert_ne!(
            self.pair.b.qp(b.qpn).unwrap().state(),
            QpState::Err,
            "seed {seed}: the responder must never fail"
        );
        // Exactly once, in order.
        let ids: Vec<u64> = wa.iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = msgs.iter().map(|m| m.id).collect();
        assert_eq!(ids, want, "seed {seed}: requester completions out of order");
        let mut out = Outcome::default();
        for (w, m) in wa.iter().zip(&msgs) {
            match (out.failed_at, w.status) {
                (None, WcStatus::Success) => {
                    out.completed += 1;
                    self.check_data(m);
                }
                (None, s @ (WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr)) => {
                    out.failed_at = Some((m.id, s));
                }
                (Some(_), WcStatus::WrFlushErr) => {}
                (f, s) => panic!("seed {seed}: WR {} got {s:?} after {f:?}", m.id),
            }
        }
        if out.failed_at.is_none() {
            // Receive side: exactly once, in order, with the right lengths and immediates.
            let recv: Vec<&Msg> = msgs
                .iter()
                .filter(|m| matches!(m.op, Op::Send { .. } | Op::Write { imm: Some(_) }))
                .collect();
            assert_eq!(wb.len(), recv.len(), "seed {seed}");
            for (w, m) in wb.iter().zip(recv) {
                assert_eq!(
                    w.wr_id, m.id,
                    "seed {seed}: receive completions out of order"
                );
                assert_eq!(w.status, WcStatus::Success, "seed {seed}");
                assert_eq!(u64::from(w.byte_len), m.len, "seed {seed}: WR {}", m.id);
                match m.op {
                    Op::Send { imm } => {
                        assert_eq!(w.opcode, WcOpcode::Recv);
                        assert_eq!(imm.is_some(), w.wc_flags.contains(WcFlags::WITH_IMM));
                    }
                    _ => assert_eq!(w.opcode, WcOpcode::RecvRdmaWithImm),
                }
            }
            let c = self.pair.b.mrs().bytes(self.mb.0).unwrap();
            let got = u64::from_le_bytes(c[..8].try_into().unwrap());
            assert_eq!(got, self.counter, "seed {seed}: atomic counter");
        }
        out
    }

    fn check_data(&self, m: &Msg) {
        let seed = self.seed;
        let (mem, off) = match m.op {
            Op::Read => (self.pair.a.mrs().bytes(self.ma.0).unwrap(), m.a_off),
            Op::Send { .. } | Op::Write { .. } => {
                (self.pair.b.mrs().bytes(self.mb.0).unwrap(), m.b_off)
            }
            Op::Cas { .. } | Op::Fadd { .. } => {
                let a = self.pair.a.mrs().bytes(self.ma.0).unwrap();
                let o = m.a_off as usize;
                let got = u64::from_le_bytes(a[o..o + 8].try_into().unwrap());
                assert_eq!(got, m.expect_orig, "seed {seed}: WR {} {:?}", m.id, m.op);
                return;
            }
        };
        for i in 0..m.len {
            let (g, w) = (mem[(off + i) as usize], pat(seed, m.id, i));
            assert_eq!(
                g, w,
                "seed {seed}: WR {} {:?} of {} bytes differs at byte {i}",
                m.id, m.op, m.len
            );
        }
    }
}

fn link_for(seed: u64) -> Link {
    let mut r = StdRng::seed_from_u64(seed);
    Link {
        loss: r.random_range(0.0..0.2),
        dup: r.random_range(0.0..0.2),
        reorder: r.random_range(0.0..0.2),
        corrupt: r.random_range(0.0..0.01),
        ce: r.random_range(0.0..0.05),
        ..Link::default()
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `messages` messages on `seed`; returns (completed, failure).
fn run_seed(seed: u64, messages: u64, scale: u64, retry_cnt: u8, reorder: bool) -> Outcome {
    let mut link = link_for(seed);
    if !reorder {
        // Loss only: retries then run out on timeouts alone, deep into the run.
        link.reorder = 0.0;
        link.dup = 0.0;
    }
    let cfg = RcConfig {
        retry_cnt,
        timeout: env_u64("ROCE_SIM_TIMEOUT").map_or(8, |t| t as u8),
        ..RcConfig::default()
    };
    println!("seed {seed}: link {link:?}, retry_cnt {retry_cnt}, {messages} messages");
    let mut run = Run::new(seed, link, &cfg, scale);
    // Reverse traffic only where retries never run out: a failed A would stall B forever.
    run.bidir = retry_cnt == 7;
    let mut total = Outcome::default();
    while total.completed < messages {
        let n = (messages - total.completed).min(24);
        let o = run.batch(n);
        total.completed += o.completed;
        if o.failed_at.is_some() {
            total.failed_at = o.failed_at;
            println!(
                "seed {seed}: requester counters at the failure: {:?}",
                run.pair.a.qp(run.a.qpn).unwrap().counters()
            );
            let st = run.pair.a.qp(run.a.qpn).unwrap().state();
            assert_eq!(
                st,
                QpState::Err,
                "seed {seed}: a failed WR leaves the QP in ERR"
            );
            break;
        }
    }
    println!(
        "seed {seed}: {} completed, failure {:?}, link {:?}, sim time {:?}",
        total.completed, total.failed_at, run.pair.stats, run.pair.time
    );
    total
}

fn seeds(default: &[u64]) -> Vec<u64> {
    env_u64("ROCE_SIM_SEED").map_or_else(|| default.to_vec(), |s| vec![s])
}

#[test]
fn random_schedules_complete_exactly_once_in_order() {
    let (messages, scale) = if cfg!(debug_assertions) {
        (1500, 8)
    } else {
        (2000, 1)
    };
    let messages = env_u64("ROCE_SIM_MESSAGES").unwrap_or(messages);
    for seed in seeds(&[1, 2, 3, 4]) {
        // retry_cnt 7 retries forever (rxe), so every WR must succeed.
        let o = run_seed(seed, messages, scale, 7, true);
        assert_eq!(o.failed_at, None, "seed {seed}");
        assert!(o.completed >= messages, "seed {seed}");
    }
}

#[test]
fn random_schedules_with_few_retries_end_in_err_with_the_right_statuses() {
    let messages = env_u64("ROCE_SIM_MESSAGES").unwrap_or(400);
    for seed in seeds(&[11, 12, 13]) {
        // retry_cnt 2 over a lossy link: either all succeed or the QP fails cleanly; the
        // statuses are checked in `batch`.
        for reorder in [true, false] {
            let o = run_seed(seed, messages, 16, 2, reorder);
            println!("seed {seed}: reorder {reorder}, outcome {o:?}");
        }
    }
}

#[test]
#[ignore = "full 10,000-message run: cargo test --release -p roce-user --test transport_sim -- --ignored"]
fn full_10k_messages_release() {
    let messages = env_u64("ROCE_SIM_MESSAGES").unwrap_or(10_000);
    for seed in seeds(&[101]) {
        let o = run_seed(seed, messages, 1, 7, true);
        assert_eq!(o.failed_at, None, "seed {seed}");
    }
}

#[test]
fn many_qps_share_a_lossy_link_and_stay_isolated() {
    for seed in seeds(&[21]) {
        let link = link_for(seed);
        println!("seed {seed}: link {link:?}, 8 QP pairs");
        let mut pair = Pair::new(seed, DeviceConfig::default(), link);
        let mut rng = StdRng::seed_from_u64(seed);
        let cfg = RcConfig::default();
        const N: u64 = 40;
        const SPAN: u64 = 16 << 10;
        let mut conns = Vec::new();
        for _ in 0..8 {
            let (a, b) = connect_rc(&mut pair, &cfg);
            let ma = pair
                .a
                .reg_mr(a.pd, vec![0; (N * SPAN) as usize], 0x1_0000, Access::all())
                .unwrap();
            let mb = pair
                .b
                .reg_mr(b.pd, vec![0; (N * SPAN) as usize], 0x1_0000, Access::all())
                .unwrap();
            conns.push((a, b, (ma.lkey, ma.rkey), (mb.lkey, mb.rkey)));
        }
        let mut lens = Vec::new();
        for (q, &(a, b, ma, mb)) in conns.iter().enumerate() {
            let mut l = Vec::new();
            for i in 0..N {
                let len = rng.random_range(0..=SPAN);
                let id = (q as u64) << 32 | i;
                let mem = pair.a.mrs_mut().bytes_mut(ma.0).unwrap();
                for k in 0..len {
                    mem[(i * SPAN + k) as usize] = pat(seed, id, k);
                }
                let sg = sge(ma, i * SPAN, len);
                let op = if i % 2 == 0 {
                    pair.b
                        .post_recv(
                            b.qpn,
                            RecvWr {
                                wr_id: id,
                                sg_list: sge(mb, i * SPAN, SPAN),
                            },
                        )
                        .unwrap();
                    SendOp::Send
                } else {
                    SendOp::Write {
                        remote_addr: 0x1_0000 + i * SPAN,
                        rkey: mb.1,
                    }
                };
                pair.a.post_send(a.qpn, SendWr::new(id, op, sg)).unwrap();
                l.push(len);
            }
            lens.push(l);
        }
        let mut got: Vec<Vec<u64>> = vec![Vec::new(); conns.len()];
        let done = pair.drive_until(50_000_000, |p| {
            for (q, &(a, ..)) in conns.iter().enumerate() {
                while let Some(w) = p.a.poll_cq(a.cq) {
                    assert_eq!(w.status, WcStatus::Success, "seed {seed}");
                    assert_eq!(w.qp_num, a.qpn);
                    got[q].push(w.wr_id);
                }
            }
            got.iter().all(|g| g.len() as u64 == N)
        });
        assert!(
            done,
            "seed {seed}: {:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        for (q, &(_, b, _, mb)) in conns.iter().enumerate() {
            let want: Vec<u64> = (0..N).map(|i| (q as u64) << 32 | i).collect();
            assert_eq!(got[q], want, "seed {seed}: QP {q} completions in order");
            let mem = pair.b.mrs().bytes(mb.0).unwrap();
            for i in 0..N {
                let id = (q as u64) << 32 | i;
                for k in 0..lens[q][i as usize] {
                    assert_eq!(
                        mem[(i * SPAN + k) as usize],
                        pat(seed, id, k),
                        "seed {seed}"
                    );
                }
            }
            let recvs: Vec<_> = core::iter::from_fn(|| pair.b.poll_cq(b.cq)).collect();
            assert_eq!(recvs.len() as u64, N / 2, "seed {seed}: QP {q}");
        }
        println!("seed {seed}: link {:?}", pair.stats);
    }
}
