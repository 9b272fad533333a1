//! `--lat`: the latency ping-pong of ib_write_lat and ib_send_lat, and the latency histogram
//! the bandwidth runs keep per work request.

use std::time::{Duration, Instant};

use anyhow::bail;
use roce::api::{CqId, RdmaDevice, RecvWr, SendOp, SendWr, Sge, WcStatus};

use super::{
    PerfArgs, PerfOp, Progress, interrupted,
    report::PerfResult,
    setup::{QpCtx, poll_cqs, wait_cqs},
};

/// The latency ping-pong of ib_write_lat (`run_iter_lat_write`) and ib_send_lat
/// (`run_iter_lat_send`), message for message: for WRITE the server sends first and each side
/// waits for the last byte of its buffer to read the iteration number (mod 256) before writing
/// the next; for SEND the client sends first and each side waits for a receive completion.
/// Latency is half the time between two of our posts, as perftest reports it.
pub(super) fn run_lat<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    cqs: &[CqId],
    qp: &QpCtx,
    size: u32,
    client: bool,
    progress: &mut Option<Progress>,
) -> anyhow::Result<PerfResult> {
    let r = qp.remote.expect("remote keys exchanged");
    let n = a.iters;
    let last = size as usize - 1;
    let first = match a.op {
        PerfOp::Write => !client,
        _ => client,
    };
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let (mut sends_done, mut recvs_done) = (0u64, 0u64);
    let mut posts = Vec::with_capacity(n as usize);
    let start = Instant::now();
    // Polls the CQ once: counts send and receive completions, reposts receives.
    let mut wcs = Vec::new();
    let mut pump = |sends_done: &mut u64, recvs_done: &mut u64| -> anyhow::Result<()> {
        // WRITE latency waits for a byte in memory, not a completion: poll, never wait.
        let wcs = if a.op == PerfOp::Send {
            wait_cqs(dev, cqs, 16, &mut wcs)?
        } else {
            poll_cqs(dev, cqs, 16, &mut wcs)?
        };
        for wc in wcs {
            if wc.status != WcStatus::Success {
                bail!("work request {} failed: {:?}", wc.wr_id, wc.status);
            }
            if wc.opcode == roce::api::WcOpcode::Recv {
                *recvs_done += 1;
                dev.post_recv(
                    qp.qpn,
                    RecvWr {
                        wr_id: 0,
                        sg_list: vec![Sge {
                            addr: qp.mr.iova,
                            length: size,
                            lkey: qp.mr.lkey,
                        }],
                    },
                )?;
            } else {
                *sends_done += 1;
            }
        }
        Ok(())
    };
    let mut wait = |what: &str,
                    done: &mut dyn FnMut(u64, u64) -> anyhow::Result<bool>,
                    sends_done: &mut u64,
                    recvs_done: &mut u64|
     -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            pump(sends_done, recvs_done)?;
            if done(*sends_done, *recvs_done)? {
                return Ok(());
            }
            if interrupted() {
                bail!("interrupted");
            }
            if Instant::now() > deadline {
                bail!(
                    "no {what} for 10 s ({} sends and {} receives completed)",
                    *sends_done,
                    *recvs_done
                );
            }
            std::thread::yield_now();
        }
    };
    while scnt < n || rcnt < n || sends_done < n {
        if let Some(p) = super::super::progress::due(progress) {
            let secs = p.secs();
            p.show(
                &format!(
                    "perf {:?} latency: {secs:.0} s, {scnt} of {n} iterations",
                    a.op
                ),
                serde_json::json!({ "secs": secs, "iters": scnt, "of": n }),
            );
        }
        if rcnt < n && !(scnt < 1 && first) {
            rcnt += 1;
            let want = rcnt;
            match a.op {
                PerfOp::Write => wait(
                    "write from the peer",
                    &mut |_, _| Ok(dev.with_mr(qp.mr.lkey, |b| b[last])? == want as u8),
                    &mut sends_done,
                    &mut recvs_done,
                )?,
                _ => wait(
                    "message from the peer",
                    &mut |_, r| Ok(r >= want),
                    &mut sends_done,
                    &mut recvs_done,
                )?,
            }
        }
        if scnt < n {
            scnt += 1;
            let sge = Sge {
                addr: qp.local.iova,
                length: size,
                lkey: qp.local.lkey,
            };
            let op = if a.op == PerfOp::Write {
                dev.mr_write(qp.local.lkey, last, &[scnt as u8])?;
                SendOp::Write {
                    remote_addr: r.vaddr,
                    rkey: r.rkey,
                }
            } else {
                SendOp::Send
            };
            posts.push(Instant::now());
            dev.post_send(qp.qpn, SendWr::new(scnt, op, vec![sge]))?;
            let want = scnt;
            wait(
                "send completion",
                &mut |s, _| Ok(s >= want),
                &mut sends_done,
                &mut recvs_done,
            )?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut lats: Vec<f64> = posts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    lats.sort_by(f64::total_cmp);
    let bytes = (scnt + rcnt) as f64 * f64::from(size);
    Ok(PerfResult {
        msgs: scnt,
        secs,
        mb_per_sec: bytes / secs.max(1e-9) / 1_048_576.0,
        mpps: scnt as f64 / secs.max(1e-9) / 1e6,
        lat: (
            percentile(&lats, 0.5),
            percentile(&lats, 0.99),
            percentile(&lats, 0.999),
            lats.last().copied().unwrap_or(0.0),
        ),
        verified: true,
        posted: scnt,
        atomic_mismatches: 0,
    })
}

/// Latencies in µs as counts in logarithmic buckets 1 % wide (1 µs to about 20 minutes),
/// so memory stays fixed however long a run lasts; percentiles are within 1 %.
pub(super) struct LatHist {
    pub(super) counts: Vec<u64>,
    pub(super) total: u64,
    pub(super) max: f64,
}

impl LatHist {
    /// Bucket i holds [1.01^i, 1.01^(i+1)) µs; the last one everything longer.
    const BUCKETS: usize = 2100;

    pub(super) fn new() -> Self {
        Self {
            counts: vec![0; Self::BUCKETS],
            total: 0,
            max: 0.0,
        }
    }

    pub(super) fn record(&mut self, us: f64) {
        let i = if us <= 1.0 {
            0
        } else {
            ((us.ln() / 1.01f64.ln()) as usize).min(Self::BUCKETS - 1)
        };
        self.counts[i] += 1;
        self.total += 1;
        self.max = self.max.max(us);
    }

    /// The `p` quantile (0..=1): the middle of the bucket holding it, at most the maximum.
    pub(super) fn percentile(&self, p: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((self.total - 1) as f64 * p).round() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return (1.01f64.powi(i as i32) * 1.005).min(self.max);
            }
        }
        self.max
    }
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_histogram_percentiles_are_within_one_percent() {
        let mut h = LatHist::new();
        for us in 1..=10_000 {
            h.record(f64::from(us));
        }
        for (p, exact) in [(0.5, 5000.0), (0.99, 9900.0), (0.999, 9990.0)] {
            let got = h.percentile(p);
            assert!(
                (got - exact).abs() <= exact * 0.01 + 1.0,
                "p{p}: {got}, exactly {exact}"
            );
        }
        assert!((h.max - 10_000.0).abs() < f64::EPSILON);
        assert!(h.percentile(1.0) <= h.max);
        // Fixed memory: a million more samples add no bucket.
        for _ in 0..1_000_000 {
            h.record(42.0);
        }
        assert_eq!(h.counts.len(), LatHist::BUCKETS);
        assert_eq!(h.total, 1_010_000);
        assert_eq!(LatHist::new().percentile(0.5), 0.0);
    }
}
