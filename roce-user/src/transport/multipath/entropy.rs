//! The sender's entropies (docs/multipath.md, "Spraying: entropies per QP"; in the spirit of
//! REPS, "Recycling Entropies for Packet Spraying", arXiv 2407.21625).
//!
//! An entropy is a UDP source port in RoCE v2's range 0xC000..=0xFFFF: an ECMP fabric hashes
//! it (with the rest of the 5-tuple) to one of its paths, so a QP whose packets take several
//! entropies is spread over several paths. [`Entropies`] keeps `count` of them in
//! circulation: packets take them in turn ([`Entropies::next`]); one whose packet was lost
//! (or, with path feedback, CE-marked) is retired for a cool-down and replaced by a fresh
//! random one ([`Entropies::on_bad`]). Entropies on good paths therefore stay, those on a
//! lossy or congested path are weeded out one loss at a time, and a replacement that lands on
//! the bad path again is weeded out again: the set converges on the good paths.
//!
//! Unlike REPS, an entropy goes back into circulation when its packet leaves, not when its
//! acknowledgement arrives: a window holds many more packets than a QP has entropies, and
//! waiting for acknowledgements would leave the sender drawing random fresh ones most of the
//! time (measured in the simulator: the lossy path then kept its random quarter of the
//! traffic). Sans-I/O: time is an argument, the randomness a seeded generator.

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
/// repeat running); tell it about every lost packet.
#[derive(Clone, Debug)]
pub struct Entropies {
    cfg: EntropyConfig,
    /// The entropies in circulation, next first; `cfg.count` of them.
    active: VecDeque<Entropy>,
    /// Retired entropies and when each may be used again; at most `2 * cfg.count`.
    retired: VecDeque<(Entropy, Instant)>,
    rng: u64,
    counters: EntropyCounters,
}

impl Entropies {
    /// `cfg.count` fresh entropies drawn from a generator seeded with `seed` (the QP's
    /// number and first PSN, say: two QPs draw different ones).
    #[must_use]
    pub fn new(seed: u64, cfg: EntropyConfig, now: Instant) -> Self {
        let count = usize::from(cfg.count.max(1));
        let mut e = Self {
            cfg: EntropyConfig {
                count: cfg.count.max(1),
                ..cfg
            },
            active: VecDeque::with_capacity(count),
            retired: VecDeque::with_capacity(2 * count),
            // SplitMix64's finalizer spreads nearby seeds (QPNs) apart; xorshift's state
            // must not be 0.
            rng: splitmix64(seed) | 1,
            counters: EntropyCounters::default(),
        };
        for _ in 0..count {
            let fresh = e.draw(now);
            e.active.push_back(fresh);
        }
        e
    }

    /// The counters.
    #[must_use]
    pub const fn counters(&self) -> &EntropyCounters {
        &self.counters
    }

    /// The entropies in circulation, next first (for tests and `roce stats`).
    pub fn active(&self) -> impl Iterator<Item = Entropy> + '_ {
        self.active.iter().copied()
    }

    /// The entropy for the next sprayed packet: the next in turn. A resend passes the
    /// entropy that lost the packet as `avoid`, so it takes another path if there is one
    /// (with a single entropy, a fresh one for this packet). Call it once per packet sent.
    pub fn next(&mut self, now: Instant, avoid: Option<Entropy>) -> Entropy {
        for _ in 0..self.active.len() {
            let Some(e) = self.active.pop_front() else {
                break;
            };
            self.active.push_back(e);
            if Some(e) != avoid {
                return e;
            }
        }
        self.counters.fresh += 1;
        self.draw(now)
    }

    /// A packet sent on `e` was lost (or CE-marked): `e` is retired for the cool-down and, if
    /// it was in circulation, replaced by a fresh entropy.
    pub fn on_bad(&mut self, e: Entropy, now: Instant) {
        if self.is_retired(e) {
            return;
        }
        self.counters.retired += 1;
        if self.retired.len() >= 2 * usize::from(self.cfg.count) {
            self.retired.pop_front();
        }
        self.retired.push_back((e, now + self.cfg.cooldown));
        if let Some(i) = self.active.iter().position(|a| *a == e) {
            let fresh = self.draw(now);
            self.counters.fresh += 1;
            self.active[i] = fresh;
        }
    }

    fn is_retired(&self, e: Entropy) -> bool {
        self.retired.iter().any(|(r, _)| *r == e)
    }

    /// A random entropy that is neither retired nor in circulation, after forgetting the
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
            if !self.is_retired(e) && !self.active.contains(&e) {
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
        let v: Vec<Entropy> = e.active().collect();
        assert_eq!(v.len(), 8);
        let mut d = v.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 8, "distinct: {v:?}");
        assert!(v.iter().all(|e| e.port() >= 0xc000));
        let other: Vec<Entropy> = Entropies::new(43, EntropyConfig::default(), t0())
            .active()
            .collect();
        assert_ne!(v, other, "another seed, other entropies");
    }

    #[test]
    fn packets_take_the_entropies_in_turn_and_a_lost_one_is_replaced() {
        let now = t0();
        let mut e = Entropies::new(7, EntropyConfig::default(), now);
        let round: Vec<Entropy> = (0..8).map(|_| e.next(now, None)).collect();
        let again: Vec<Entropy> = (0..8).map(|_| e.next(now, None)).collect();
        assert_eq!(round, again, "in turn");
        let bad = round[3];
        e.on_bad(bad, now);
        e.on_bad(bad, now);
        assert_eq!(e.counters().retired, 1, "retired once");
        let after: Vec<Entropy> = (0..8).map(|_| e.next(now, None)).collect();
        assert!(!after.contains(&bad), "{after:?}");
        assert_eq!(
            after.iter().filter(|x| round.contains(x)).count(),
            7,
            "only the lost one was replaced"
        );
        // After the cool-down the retirement is forgotten at the next draw.
        assert!(e.is_retired(bad));
        let _ = e.draw(now + EntropyConfig::default().cooldown);
        assert!(!e.is_retired(bad));
    }

    #[test]
    fn a_resend_avoids_the_entropy_that_lost_it() {
        let now = t0();
        let mut e = Entropies::new(9, EntropyConfig::default(), now);
        let lost = e.active().next().unwrap();
        assert_ne!(e.next(now, Some(lost)), lost);
        // With one entropy only, a fresh one is drawn for the resend.
        let cfg = EntropyConfig {
            count: 1,
            ..EntropyConfig::default()
        };
        let mut one = Entropies::new(9, cfg, now);
        let only = one.active().next().unwrap();
        assert_ne!(one.next(now, Some(only)), only);
        assert_eq!(one.counters().fresh, 1);
        assert_eq!(one.next(now, None), only, "and the one entropy stays");
    }

    proptest! {
        /// Whatever the losses, every entropy handed out is in RoCE's range and not retired
        /// at the time, and the set keeps its size.
        #[test]
        fn entropies_stay_in_range_and_retired_ones_are_not_used(
            seed in any::<u64>(),
            ops in proptest::collection::vec((any::<bool>(), 0u64..3000), 1..300),
        ) {
            let mut now = t0();
            let mut e = Entropies::new(seed, EntropyConfig::default(), now);
            for (lost, dt) in ops {
                now = now + Duration::from_micros(dt);
                let x = e.next(now, None);
                prop_assert!(x.port() >= 0xc000);
                prop_assert!(!e.retired.iter().any(|(r, until)| *r == x && *until > now));
                if lost { e.on_bad(x, now) }
                prop_assert_eq!(e.active.len(), 8);
                prop_assert!(e.retired.len() <= 16);
            }
        }
    }
}
