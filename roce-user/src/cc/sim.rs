//! A deterministic bottleneck simulator for DCQCN: senders with [`ReactionPoint`]s share one
//! switch queue that drains at the bottleneck rate and ECN-marks RED-style (DCQCN §4: no mark
//! below Kmin, probability rising linearly to Pmax at Kmax, every packet above Kmax); the
//! receiver's [`NotificationPoint`]s answer marks with CNPs that reach the sender one
//! propagation delay later.
//!
//! It exists to test the cc module end to end and to draw the DCQCN sawtooth (`roce plot`):
//! same configuration and seed, same trace, on any machine. Time is simulated; the random
//! marking draws come from a seeded xorshift generator inside the simulator.

use core::time::Duration;
use std::{cmp::Reverse, collections::BinaryHeap};

use super::{CcStats, DcqcnConfig, Instant, NotificationPoint, ReactionPoint, Trace};
use crate::wire::{Ecn, Qpn};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// DCQCN parameters of every QP.
    pub dcqcn: DcqcnConfig,
    /// Number of senders (one QP each).
    pub flows: u32,
    /// QPN of the first sender; the others follow.
    pub first_qpn: u32,
    /// Line rate of every sender, bits/s.
    pub line_rate_bps: u64,
    /// Drain rate of the bottleneck queue, bits/s.
    pub bottleneck_bps: u64,
    /// Packet size on the wire, bytes.
    pub packet_bytes: u32,
    /// One-way propagation delay from the queue to the receiver and from the receiver back.
    pub prop_delay: Duration,
    /// RED: no marks at or below this backlog, bytes.
    pub kmin_bytes: u64,
    /// RED: every packet is marked above this backlog, bytes.
    pub kmax_bytes: u64,
    /// RED: marking probability at Kmax.
    pub pmax: f64,
    /// Backlog past which packets are dropped, bytes.
    pub max_backlog_bytes: u64,
    /// Sender `i` starts at `i × stagger`.
    pub stagger: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// Trace sampling period.
    pub sample_every: Duration,
    /// Seed of the marking draws.
    pub seed: u64,
}

impl Default for SimConfig {
    /// One 10 Gb/s sender into a 4 Gb/s bottleneck with the DCQCN paper's switch settings
    /// (Kmin 10 KB, Kmax 100 KB, Pmax 1 %) and timers (55 µs), 20 ms, sampled every 10 µs.
    fn default() -> Self {
        Self {
            dcqcn: DcqcnConfig {
                rpg_time_reset: 55,
                dce_tcp_rtt: 55,
                min_time_between_cnps: 50,
                rpg_threshold: 5,
                rpg_byte_reset: 10_000_000,
                rpg_ai_rate: 40,
                rpg_hai_rate: 200,
                ..DcqcnConfig::default()
            },
            flows: 1,
            first_qpn: 17,
            line_rate_bps: 10_000_000_000,
            bottleneck_bps: 4_000_000_000,
            packet_bytes: 1100,
            prop_delay: Duration::from_micros(2),
            kmin_bytes: 10_000,
            kmax_bytes: 100_000,
            pmax: 0.01,
            max_backlog_bytes: 1_000_000,
            stagger: Duration::from_millis(5),
            duration: Duration::from_millis(20),
            sample_every: Duration::from_micros(10),
            seed: 1,
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// Samples of every sender.
    pub trace: Trace,
    /// Bytes each sender got through the bottleneck.
    pub delivered_bytes: Vec<u64>,
    /// Packets marked CE by the queue.
    pub marked: u64,
    /// Packets dropped by the queue.
    pub dropped: u64,
    /// Largest backlog seen, bytes.
    pub max_backlog_bytes: u64,
    /// NP and RP counters summed over QPs.
    pub stats: CcStats,
}

struct Flow {
    qpn: Qpn,
    rp: ReactionPoint,
    np: NotificationPoint,
    start: Instant,
    /// The sender's link is free again at this time.
    link_free: Instant,
}

/// xorshift64* (Vigna 2016): small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn tx_time(bytes: u32, rate_bps: u64) -> Duration {
    Duration::from_nanos((u64::from(bytes) * 8 * 1_000_000_000).div_ceil(rate_bps.max(1)))
}

/// Runs the simulation.
#[must_use]
pub fn run(cfg: &SimConfig) -> SimResult {
    let end = Instant::ZERO + cfg.duration;
    let mut flows: Vec<Flow> = (0..cfg.flows)
        .map(|i| {
            let start = Instant::ZERO + cfg.stagger * i;
            Flow {
                qpn: Qpn::new(cfg.first_qpn + i),
                rp: ReactionPoint::new(&cfg.dcqcn, cfg.line_rate_bps, start),
                np: NotificationPoint::new(&cfg.dcqcn),
                start,
                link_free: start,
            }
        })
        .collect();
    let mut rng = Rng(cfg.seed.max(1));
    let mut cnps: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let mut queue_empty_at = Instant::ZERO;
    let mut trace = Trace::new();
    let mut delivered = vec![0u64; flows.len()];
    let (mut marked, mut dropped, mut max_backlog) = (0u64, 0u64, 0u64);
    let mut next_sample = Instant::ZERO;
    let pkt = cfg.packet_bytes;
    let service = tx_time(pkt, cfg.bottleneck_bps);

    loop {
        // The next event of each kind; ties go CNP, timer, sample, send.
        let cnp_at = cnps.peek().map(|Reverse((t, _))| *t);
        let timer = flows
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.rp.poll_timeout().map(|t| (t, i)))
            .min();
        let send = flows
            .iter()
            .enumerate()
            .map(|(i, f)| (f.rp.next_send_time(f.link_free, pkt), i))
            .min();
        let mut t = next_sample;
        for c in [cnp_at, timer.map(|x| x.0), send.map(|x| x.0)]
            .into_iter()
            .flatten()
        {
            t = t.min(c);
        }
        if t > end {
            break;
        }
        if cnp_at == Some(t) {
            if let Some(Reverse((_, i))) = cnps.pop() {
                flows[i].rp.on_cnp(t);
            }
        } else if let Some((at, i)) = timer.filter(|x| x.0 == t) {
            flows[i].rp.handle_timeout(at);
        } else if t == next_sample {
            for f in &flows {
                if t >= f.start {
                    trace.record(t, f.qpn, &f.rp);
                }
            }
            next_sample = t + cfg.sample_every;
        } else if let Some((_, i)) = send {
            let f = &mut flows[i];
            f.rp.on_sent(t, pkt);
            f.link_free = t + tx_time(pkt, cfg.line_rate_bps);
            // Every flow always has data: its next packet waiting on the pacer is the rate
            // limiting it.
            if f.rp.next_send_time(f.link_free, pkt) > f.link_free {
                f.rp.on_paced(pkt);
            }
            // The switch queue, as the time it drains empty.
            let start_service = queue_empty_at.max(t);
            let backlog = u64::try_from(
                u128::from(start_service.as_nanos() - t.as_nanos())
                    * u128::from(cfg.bottleneck_bps)
                    / 8_000_000_000,
            )
            .unwrap_or(u64::MAX);
            max_backlog = max_backlog.max(backlog);
            if backlog + u64::from(pkt) > cfg.max_backlog_bytes {
                dropped += 1;
                continue;
            }
            let p = if backlog <= cfg.kmin_bytes {
                0.0
            } else if backlog <= cfg.kmax_bytes {
                cfg.pmax * (backlog - cfg.kmin_bytes) as f64
                    / (cfg.kmax_bytes - cfg.kmin_bytes).max(1) as f64
            } else {
                1.0
            };
            let ce = p > 0.0 && rng.next_f64() < p;
            marked += u64::from(ce);
            queue_empty_at = start_service + service;
            let arrival = queue_empty_at + cfg.prop_delay;
            delivered[i] += u64::from(pkt);
            let ecn = if ce { Ecn::Ce } else { Ecn::Ect0 };
            if f.np.on_packet(arrival, ecn) {
                cnps.push(Reverse((arrival + cfg.prop_delay, i)));
            }
        }
    }
    let mut stats = CcStats::default();
    for f in &flows {
        stats.add(&f.np.stats());
        stats.add(&f.rp.stats());
    }
    SimResult {
        trace,
        delivered_bytes: delivered,
        marked,
        dropped,
        max_backlog_bytes: max_backlog,
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flow_converges_below_the_bottleneck_with_a_sawtooth() {
        let cfg = SimConfig::default();
        let r = run(&cfg);
        assert!(r.stats.np_cnp_sent > 10, "{:?}", r.stats);
        assert_eq!(
            r.stats.np_cnp_sent,
            r.stats.rp_cnp_handled + r.stats.rp_cnp_ignored
        );
        assert!(r.marked >= r.stats.np_cnp_sent);
        assert_eq!(r.dropped, 0);
        // The queue never grows past Kmax by much: DCQCN holds it near the marking band.
        assert!(r.max_backlog_bytes < 300_000, "{}", r.max_backlog_bytes);
        // Throughput over the last 10 ms: at least 80 % of the bottleneck, never above it.
        let rows = &r.trace.rows;
        let at = |ms: u64| {
            rows.iter()
                .find(|x| x.time >= Instant::from_micros(ms * 1000))
                .unwrap()
        };
        let bytes = at(20).bytes - at(10).bytes;
        let gbps = bytes as f64 * 8.0 / 0.010 / 1e9;
        assert!((3.2..=4.1).contains(&gbps), "{gbps} Gb/s");
        // A sawtooth: the rate goes down and up many times.
        let ups = rows
            .windows(2)
            .filter(|w| w[1].rate_bps > w[0].rate_bps)
            .count();
        let downs = rows
            .windows(2)
            .filter(|w| w[1].rate_bps < w[0].rate_bps)
            .count();
        assert!(ups > 10 && downs > 10, "ups {ups} downs {downs}");
        // Deterministic.
        assert_eq!(run(&cfg).trace, r.trace);
    }

    #[test]
    fn two_flows_share_the_bottleneck() {
        let cfg = SimConfig {
            flows: 2,
            stagger: Duration::from_millis(2),
            duration: Duration::from_millis(40),
            ..SimConfig::default()
        };
        let r = run(&cfg);
        let total: u64 = r.delivered_bytes.iter().sum();
        let gbps = total as f64 * 8.0 / 0.040 / 1e9;
        assert!(gbps <= 4.05, "{gbps}");
        assert!(r.delivered_bytes.iter().all(|&b| b > 0));
        assert_eq!(r.trace.qpns(), vec![Qpn::new(17), Qpn::new(18)]);
    }
}
