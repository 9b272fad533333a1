//! The sender's entropies (docs/multipath.md, "Spraying: entropies per QP, recycled as REPS
//! does"; REPS, "Recycling Entropies for Packet Spraying", arXiv 2407.21625).
//!
//! An entropy is a UDP source port in RoCE v2's range 0xC000..=0xFFFF: an ECMP fabric hashes
//! it (with the rest of the 5-tuple) to one of its paths, so a QP whose packets take several
//! entropies is spread over several paths. [`Entropies`] keeps a FIFO of entropies that are
//! known good: each sprayed packet takes the oldest ([`Entropies::next`]); an entropy whose
//! packet comes back acknowledged goes back in ([`Entropies::on_acked`]); one whose packet was
//! lost (or, with path feedback, CE-marked) is retired for a cool-down and no longer used
//! ([`Entropies::on_bad`]). When the FIFO runs dry the sender draws a fresh random entropy,
//! so a QP never stalls for want of paths, and a bad path's entropies are weeded out while
//! the good ones keep circulating. Sans-I/O: time is an argument, the randomness a seeded
//! generator.

use core::time::Duration;
use std::collections::VecDeque;

use crate::{time::Instant, wire::multipath::Entropy};

/// The knobs of spraying.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EntropyConfig {
    /// Entropies a QP keeps in circulation (the design's `E`, default 8). 1 means no
    /// spraying: every packet keeps the QP's own UDP source port.
    pub count: u8,
    /// How long a retired entropy stays out of use (default 1 ms: a few RTTs of a software
    /// endpoint on a LAN).
    pub cooldown: Duration,
}

impl Default for EntropyConfig {
    fn default() -> Self {
        Self {
            count: 8,
            cooldown: Duration::from_millis(1),
        }
    }
}

/// What spraying counted.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct EntropyCounters {
    /// Entropies retired because one of their packets was lost or marked
    /// (`entropy_retired`).
    pub retired: u64,
    /// Fresh entropies drawn because the FIFO was empty.
    pub fresh: u64,
}

/// One QP's entropies. Create it when the QP starts to spray (its extension on, selective
/// repeat running); feed it every acknowledgement and loss of a sprayed packet.
#[derive(Clone, Debug)]
pub struct Entropies {
    cfg: EntropyConfig,
    /// Good entropies, oldest first; at most `cfg.count`.
    good: VecDeque<Entropy>,
    /// Retired entropies and when each may be used again; at most a few `cfg.count`.
    retired: VecDeque<(Entropy, Instant)>,
    rng: u64,
    counters: EntropyCounters,
}

impl Entropies {
    /// `cfg.count` fresh entropies drawn from a generator seeded with `seed` (the QP's
    /// number and first PSN, say: two QPs draw different ones).
    #[must_use]
    pub fn new(seed: u64, cfg: EntropyConfig, now: Instant) -> Self {
        let mut e = Self {
            cfg: EntropyConfig {
                count: cfg.count.max(1),
                ..cfg
            },
            good: VecDeque::with_capacity(usize::from(cfg.count.max(1))),
            retired: VecDeque::with_capacity(2 * usize::from(cfg.count.max(1))),
            // SplitMix64's finalizer spreads nearby seeds (QPNs) apart; xorshift's state
            // must not be 0.
            rng: splitmix64(seed) | 1,
            counters: EntropyCounters::default(),
        };
        for _ in 0..e.cfg.count {
            let fresh = e.draw(now);
            e.good.push_back(fresh);
        }
        e
    }

    /// The counters.
    #[must_use]
    pub const fn counters(&self) -> &EntropyCounters {
        &self.counters
    }

    /// The good entropies, oldest first (for tests and `roce stats`).
    pub fn good(&self) -> impl Iterator<Item = Entropy> + '_ {
        self.good.iter().copied()
    }

    /// The entropy for the next sprayed packet: the oldest good one, or a fresh one when none
    /// is left. A resend passes the entropy that lost the packet as `avoid`, so it takes
    /// another path if there is one. Call it once per packet sent.
    pub fn next(&mut self, now: Instant, avoid: Option<Entropy>) -> Entropy {
        let pick = match self.good.iter().position(|e| Some(*e) != avoid) {
            Some(i) => self.good.remove(i),
            None => None,
        };
        pick.unwrap_or_else(|| {
            self.counters.fresh += 1;
            self.draw(now)
        })
    }

    /// A packet sent on `e` was acknowledged without a mark: `e` goes back into the FIFO
    /// (unless it was retired meanwhile, or the FIFO is full).
    pub fn on_acked(&mut self, e: Entropy) {
        if self.good.len() < usize::from(self.cfg.count) && !self.is_retired(e) {
            self.good.push_back(e);
        }
    }

    /// A packet sent on `e` was lost (or CE-marked): `e` leaves the FIFO and stays out of use
    /// for the cool-down.
    pub fn on_bad(&mut self, e: Entropy, now: Instant) {
        self.good.retain(|g| *g != e);
        if self.is_retired(e) {
            return;
        }
        self.counters.retired += 1;
        if self.retired.len() >= 2 * usize::from(self.cfg.count) {
            self.retired.pop_front();
        }
        self.retired.push_back((e, now + self.cfg.cooldown));
    }

    fn is_retired(&self, e: Entropy) -> bool {
        self.retired.iter().any(|(r, _)| *r == e)
    }

    /// A random entropy that is not retired (and not in the FIFO), after forgetting the
    /// retirements whose cool-down is over.
    fn draw(&mut self, now: Instant) -> Entropy {
        while self.retired.front().is_some_and(|(_, until)| *until <= now) {
            self.retired.pop_front();
        }
        loop {
            // xorshift64 (Marsaglia 2003).
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let port = Entropy::MIN | (self.rng >> 48) as u16;
            let e = Entropy::new(port).unwrap_or(Entropy::new(Entropy::MIN).expect("in range"));
            if !self.is_retired(e) && !self.good.contains(&e) {
                return e;
            }
        }
    }
}

/// SplitMix64's output function (Steele, Lea and Flood, 2014).
const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t0() -> Instant {
        Instant::from_nanos(1_000_000)
    }

    #[test]
    fn starts_with_count_distinct_entropies_in_range() {
        let e = Entropies::new(42, EntropyConfig::default(), t0());
        let v: Vec<Entropy> = e.good().collect();
        assert_eq!(v.len(), 8);
        let mut d = v.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 8, "distinct: {v:?}");
        assert!(v.iter().all(|e| e.port() >= 0xc000));
        let other: Vec<Entropy> = Entropies::new(43, EntropyConfig::default(), t0())
            .good()
            .collect();
        assert_ne!(v, other, "another seed, other entropies");
    }

    #[test]
    fn acknowledged_entropies_circulate_and_lost_ones_retire() {
        let now = t0();
        let mut e = Entropies::new(7, EntropyConfig::default(), now);
        let first = e.next(now, None);
        // Acknowledged: it comes round again after the other seven.
        e.on_acked(first);
        let order: Vec<Entropy> = (0..8).map(|_| e.next(now, None)).collect();
        assert_eq!(order[7], first);
        // Lost: it never comes back while retired, however often it is acknowledged late.
        for x in &order {
            e.on_acked(*x);
        }
        e.on_bad(first, now);
        e.on_acked(first);
        assert_eq!(e.counters().retired, 1);
        for _ in 0..50 {
            let x = e.next(now, None);
            assert_ne!(x, first);
            e.on_acked(x);
        }
        // After the cool-down the retirement is forgotten at the next draw.
        assert!(e.is_retired(first));
        let _ = e.draw(now + EntropyConfig::default().cooldown);
        assert!(!e.is_retired(first));
    }

    #[test]
    fn a_resend_avoids_the_entropy_that_lost_it() {
        let now = t0();
        let mut e = Entropies::new(9, EntropyConfig::default(), now);
        let lost = e.good().next().unwrap();
        assert_ne!(e.next(now, Some(lost)), lost);
        // With one entropy only, a fresh one is drawn.
        let cfg = EntropyConfig {
            count: 1,
            ..EntropyConfig::default()
        };
        let mut one = Entropies::new(9, cfg, now);
        let only = one.good().next().unwrap();
        assert_ne!(one.next(now, Some(only)), only);
        assert_eq!(one.counters().fresh, 1);
    }

    #[test]
    fn an_empty_fifo_draws_fresh_entropies_so_sending_never_stalls() {
        let now = t0();
        let mut e = Entropies::new(11, EntropyConfig::default(), now);
        let mut seen = Vec::new();
        for _ in 0..100 {
            let x = e.next(now, None);
            seen.push(x);
            e.on_bad(x, now);
        }
        assert_eq!(e.counters().fresh, 92);
        assert_eq!(e.counters().retired, 100);
    }

    proptest! {
        /// Whatever the sequence of acknowledgements and losses, every entropy handed out is
        /// in RoCE's range, none is retired at the time, and the FIFO never grows past the
        /// count.
        #[test]
        fn entropies_stay_in_range_and_retired_ones_are_not_used(
            seed in any::<u64>(),
            ops in proptest::collection::vec((any::<bool>(), 0u64..3000), 1..300),
        ) {
            let mut now = t0();
            let mut e = Entropies::new(seed, EntropyConfig::default(), now);
            for (good, dt) in ops {
                now = now + Duration::from_micros(dt);
                let x = e.next(now, None);
                prop_assert!(x.port() >= 0xc000);
                prop_assert!(!e.retired.iter().any(|(r, until)| *r == x && *until > now));
                if good { e.on_acked(x) } else { e.on_bad(x, now) }
                prop_assert!(e.good.len() <= 8);
                prop_assert!(e.retired.len() <= 16);
            }
        }
    }
}
