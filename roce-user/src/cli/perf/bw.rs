//! The bandwidth runs: the client posts WRITE, READ, SEND or atomic work requests on every QP
//! and checks each completion; the server waits for the client's next sync, and for SEND
//! receives, checks and reposts every message.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use anyhow::bail;
use roce::{
    api::{CqId, RdmaDevice, RecvWr, SendOp, SendWr, Sge, WcStatus},
    cm::perftest::{Comm, pattern},
    wire::types::RKey,
};
use serde_json::json;

use super::{
    PerfArgs, PerfOp, Progress,
    exchange::Channel,
    interrupted,
    lat::LatHist,
    report::PerfResult,
    setup::{QpCtx, poll_cqs, qp_index, wait_cqs},
    trace::Tracer,
    verify::{msg_offset, pattern_into, verify_len},
};

pub(super) fn run_client<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    cqs: &[CqId],
    qps: &[QpCtx],
    size: u32,
    tracer: &mut Option<Tracer>,
    progress: &mut Option<Progress>,
) -> anyhow::Result<PerfResult> {
    let depth = a.tx_depth as usize;
    let deadline = a
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let target = a.iters;
    let index = qp_index(qps);
    let mut posted = vec![0u64; qps.len()];
    let mut done = vec![0u64; qps.len()];
    let mut inflight: Vec<VecDeque<Instant>> = vec![VecDeque::new(); qps.len()];
    // A histogram, not a Vec of every WR's latency: a -D run of hours must not grow.
    let mut lats = LatHist::new();
    let mut fetched_ok = true;
    let mut atomic_mismatches = 0u64;
    // Completions are polled into this buffer, allocated on the first poll and reused.
    let mut wc_buf = Vec::new();
    let start = Instant::now();
    let mut last_progress = start;
    // The QPs to top up this turn: all at first, then those that just completed something,
    // so a turn costs what completed, not what exists (1024 QPs).
    let mut refill: Vec<usize> = (0..qps.len()).collect();
    let mut outstanding = 0usize;
    loop {
        if let Some(p) = super::super::progress::due(progress) {
            let secs = p.secs();
            let total: u64 = done.iter().sum();
            p.show(
                &format!(
                    "perf {:?}: {secs:.0} s, {} QP(s), {total} of {} WRs done, {:.1} MB/s",
                    a.op,
                    qps.len(),
                    posted.iter().sum::<u64>(),
                    total as f64 * f64::from(size) / secs.max(1e-9) / 1_048_576.0,
                ),
                json!({
                    "secs": secs,
                    "qpn": qps.iter().map(|q| q.qpn.value()).collect::<Vec<_>>(),
                    "posted": posted, "done": done,
                }),
            );
        }
        let stop_posting = deadline.is_some_and(|d| Instant::now() >= d);
        for i in refill.drain(..) {
            let qp = &qps[i];
            // At most `depth` (--tx-depth) WRs in flight per QP. For SEND, `Plan::new` holds it
            // to at most --rx-depth, the receives the server posted before it answered us and
            // reposts as they complete (`run_server`), so a SEND finds a receive waiting.
            let r = qp.remote.expect("remote keys exchanged");
            while inflight[i].len() < depth
                && !stop_posting
                && (deadline.is_some() || posted[i] < target)
            {
                let off = if a.op == PerfOp::Atomic {
                    (posted[i] % depth as u64) * 8
                } else {
                    msg_offset(a.span, posted[i], size)
                };
                let sge = Sge {
                    addr: qp.local.iova + off,
                    length: size,
                    lkey: qp.local.lkey,
                };
                let remote_addr = r.vaddr + if a.op == PerfOp::Atomic { 0 } else { off };
                let op = match a.op {
                    PerfOp::Write => SendOp::Write {
                        remote_addr,
                        rkey: r.rkey,
                    },
                    PerfOp::Read => SendOp::Read {
                        remote_addr,
                        rkey: r.rkey,
                    },
                    PerfOp::Send => SendOp::Send,
                    PerfOp::Atomic if a.cmp_swap => SendOp::CompareSwap {
                        remote_addr: r.vaddr,
                        rkey: RKey::new(r.rkey.value()),
                        compare: posted[i],
                        swap: posted[i] + 1,
                    },
                    PerfOp::Atomic => SendOp::FetchAdd {
                        remote_addr: r.vaddr,
                        rkey: RKey::new(r.rkey.value()),
                        add: 1,
                    },
                };
                dev.post_send(qp.qpn, SendWr::new(posted[i], op, vec![sge]))?;
                posted[i] += 1;
                inflight[i].push_back(Instant::now());
                outstanding += 1;
            }
        }
        if outstanding == 0
            && (stop_posting || posted.iter().all(|p| *p >= target) && deadline.is_none())
        {
            break;
        }
        if interrupted() {
            bail!("interrupted");
        }
        Tracer::poll(tracer, dev);
        let wcs = wait_cqs(dev, cqs, 64, &mut wc_buf)?;
        if wcs.is_empty() {
            if last_progress.elapsed() > Duration::from_secs(10) {
                bail!(
                    "no completion for 10 s ({} of {} done)",
                    done.iter().sum::<u64>(),
                    posted.iter().sum::<u64>()
                );
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for wc in wcs {
            if wc.status != WcStatus::Success {
                bail!(
                    "work request {} on QP {:?} failed: {:?}",
                    wc.wr_id,
                    wc.qp_num,
                    wc.status
                );
            }
            let Some(&i) = index.get(&wc.qp_num) else {
                bail!("a completion for QP {:?}, which is not ours", wc.qp_num);
            };
            // RC completes a QP's send WRs once each, in the order they were posted (IBA
            // 10.8.3.1): any other wr_id is a lost, duplicated or reordered completion.
            if wc.wr_id != done[i] || inflight[i].is_empty() {
                bail!(
                    "QP {:?} completed work request {} where {} was next ({} posted)",
                    wc.qp_num,
                    wc.wr_id,
                    done[i],
                    posted[i]
                );
            }
            if let Some(t) = inflight[i].pop_front() {
                lats.record(t.elapsed().as_secs_f64() * 1e6);
                outstanding -= 1;
            }
            done[i] += 1;
            if inflight[i].len() + 1 == depth {
                refill.push(i); // it was full: top it up next turn
            }
            if a.op == PerfOp::Read && done[i] == 1 {
                let ok = dev.with_mr(qps[i].local.lkey, |b| {
                    b.get(..size as usize)
                        == Some(pattern(qps[i].pattern, size as usize).as_slice())
                })?;
                fetched_ok &= ok;
            }
            if a.op == PerfOp::Atomic {
                // Linearizable atomics on one counter that starts at 0: the k-th fetch-and-add
                // (or compare-and-swap of k for k + 1) of this QP returns exactly k (IBA 9.4.5:
                // a responder executes each atomic once, in PSN order, and answers a duplicate
                // from its saved result).
                let mut b = [0u8; 8];
                dev.mr_read(
                    qps[i].local.lkey,
                    (wc.wr_id % depth as u64) as usize * 8,
                    &mut b,
                )?;
                let got = u64::from_le_bytes(b);
                if got != wc.wr_id {
                    atomic_mismatches += 1;
                    if atomic_mismatches == 1 {
                        eprintln!(
                            "atomic {} on QP {:?} returned {got}, not {}",
                            wc.wr_id, wc.qp_num, wc.wr_id
                        );
                    }
                }
            }
        }
    }
    // The run's time ends at its last completion, not after the wait for late ones below.
    let secs = start.elapsed().as_secs_f64();
    // Nothing may complete after the last expected completion: a late one is a duplicate.
    std::thread::sleep(Duration::from_millis(20));
    if let Some(wc) = poll_cqs(dev, cqs, 1, &mut wc_buf)?.first() {
        bail!(
            "QP {:?} completed work request {} after all its work requests had completed",
            wc.qp_num,
            wc.wr_id
        );
    }
    let msgs: u64 = done.iter().sum();
    let bytes = msgs as f64 * f64::from(size);
    let mut verified = fetched_ok && atomic_mismatches == 0;
    if a.op == PerfOp::Read {
        for (i, qp) in qps.iter().enumerate() {
            let n = verify_len(a.span, done[i], size);
            verified &= dev.with_mr(qp.local.lkey, |b| {
                b.get(..n) == Some(pattern(qp.pattern, n).as_slice())
            })?;
        }
    }
    Ok(PerfResult {
        msgs,
        secs,
        mb_per_sec: bytes / secs.max(1e-9) / 1_048_576.0,
        mpps: msgs as f64 / secs.max(1e-9) / 1e6,
        lat: (
            lats.percentile(0.5),
            lats.percentile(0.99),
            lats.percentile(0.999),
            lats.max,
        ),
        verified,
        posted: posted.iter().sum(),
        atomic_mismatches,
    })
}

/// The server's side of a bandwidth run: for WRITE, READ and atomics it only waits for the
/// client's next sync. For SEND it does what ib_send_bw's server does (perftest's
/// `run_iter_bw_server`): its `rx_depth` receives per QP were posted before the client
/// connected (`setup::Local::new`), and each receive that completes is checked and posted
/// again before the CQ is polled further, so the receive queue stays `rx_depth` deep less what
/// is in the batch at hand. The client keeps at most `tx_depth` ≤ `rx_depth` SENDs in flight
/// per QP, so a SEND finds its receive posted unless this loop falls `rx_depth − tx_depth`
/// messages behind (rxe's `check_resource` then answers with an RNR NAK, `send_rnr_err`). The
/// loop sleeps only when a pass completed nothing. Call once, after the exchange.
pub(super) fn run_server<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    cqs: &[CqId],
    qps: &[QpCtx],
    (size, rx_depth): (u32, u32),
    comm: &mut Comm<Channel<'_>>,
    (tracer, progress): (&mut Option<Tracer>, &mut Option<Progress>),
) -> anyhow::Result<PerfResult> {
    let mut wc_buf = Vec::new();
    // A pass takes up to a full receive queue's completions from each CQ.
    let batch = (rx_depth as usize).clamp(64, 1024);
    // What a message must hold, computed outside the transport's lock (`with_mr` holds it while
    // comparing): without --span every message of a QP carries the same bytes, computed once
    // per QP; with --span each receive's bytes go through `want`, reused.
    let same: Vec<Vec<u8>> = if a.span == 0 && a.op == PerfOp::Send && !a.no_verify {
        qps.iter()
            .map(|qp| pattern(qp.pattern, size as usize))
            .collect()
    } else {
        Vec::new()
    };
    let mut want = Vec::with_capacity(if a.span == 0 { 0 } else { size as usize });
    let start = Instant::now();
    let mut msgs = 0u64;
    let mut good = true;
    // With --span: receives completed per QP, which tells where in the pattern each one's
    // message came from (RC delivers a QP's messages once each, in order).
    let mut recvd = vec![0u64; qps.len()];
    let index = qp_index(qps);
    comm.link_mut().watch(true)?;
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut closing = false;
    loop {
        if interrupted() {
            bail!("interrupted");
        }
        if let Some(p) = super::super::progress::due(progress) {
            let secs = p.secs();
            let text = if a.op == PerfOp::Send {
                format!("perf server: {secs:.0} s, {msgs} SENDs received")
            } else {
                format!(
                    "perf server: {secs:.0} s, serving {:?} until the client is done",
                    a.op
                )
            };
            p.show(&text, json!({ "secs": secs, "received": msgs }));
        }
        Tracer::poll(tracer, dev);
        let mut busy = false;
        if a.op == PerfOp::Send {
            let wcs = wait_cqs(dev, cqs, batch, &mut wc_buf)?;
            busy = !wcs.is_empty();
            for wc in wcs {
                if wc.status != WcStatus::Success {
                    bail!("receive on QP {:?} failed: {:?}", wc.qp_num, wc.status);
                }
                let Some(&i) = index.get(&wc.qp_num) else {
                    continue;
                };
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                msgs += 1;
                let slot = if a.span == 0 {
                    0
                } else {
                    wc.wr_id * u64::from(size)
                };
                // --no-verify (a perftest peer, whose buffers hold random bytes): the length
                // only.
                let expected = if a.no_verify {
                    None
                } else if a.span == 0 {
                    Some(&same[i])
                } else {
                    let off = msg_offset(a.span, recvd[i], size) as usize;
                    pattern_into(qps[i].pattern, off, size as usize, &mut want);
                    Some(&want)
                };
                recvd[i] += 1;
                let ok = wc.byte_len == size
                    && match expected {
                        None => true,
                        Some(e) => dev.with_mr(qps[i].mr.lkey, |b| {
                            b.get(slot as usize..slot as usize + size as usize)
                                == Some(e.as_slice())
                        })?,
                    };
                if !ok && good {
                    eprintln!(
                        "SEND {} on QP {:?} ({} bytes) does not hold its data",
                        recvd[i] - 1,
                        wc.qp_num,
                        wc.byte_len
                    );
                }
                good &= ok;
                dev.post_recv(
                    qps[i].qpn,
                    RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![Sge {
                            addr: qps[i].mr.iova + slot,
                            length: size,
                            lkey: qps[i].mr.lkey,
                        }],
                    },
                )?;
            }
        }
        // The client syncs once all its SENDs are acknowledged, so each of them has its receive
        // completion on our CQs by then: drain them (a pass that finds none ends the run), even
        // when this loop has fallen behind by more than a pass.
        if closing && !busy {
            break;
        }
        if closing {
            continue;
        }
        if comm.link_mut().peer_spoke()? {
            closing = true;
        } else if !busy {
            // Receives are completing: straight back to the CQ; otherwise a pause.
            std::thread::sleep(Duration::from_micros(if a.op == PerfOp::Send {
                20
            } else if tracer.is_some() {
                100
            } else {
                2000
            }));
        }
    }
    comm.link_mut().watch(false)?;
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let bytes = msgs as f64 * f64::from(size);
    Ok(PerfResult {
        msgs,
        secs,
        mb_per_sec: if secs > 0.0 {
            bytes / secs / 1_048_576.0
        } else {
            0.0
        },
        mpps: if secs > 0.0 {
            msgs as f64 / secs / 1e6
        } else {
            0.0
        },
        lat: (0.0, 0.0, 0.0, 0.0),
        verified: good,
        posted: 0,
        atomic_mismatches: 0,
    })
}
