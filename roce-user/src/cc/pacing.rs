//! A token bucket that paces a QP at its current DCQCN rate.

use core::time::Duration;

use super::Instant;

const NS_PER_S: u128 = 1_000_000_000;

/// A token bucket filled at a rate given on every call (the rate can change at any time; call
/// [`Pacer::advance`] with the old rate before changing it so that the past is accounted at the
/// rate that was in effect).
///
/// Tokens are bits scaled by 10^9, so that `rate_bps × elapsed_ns` adds exactly, without
/// rounding. The bucket holds at most `burst_bytes`; it starts full. Sending when told to wait
/// (ignoring [`Pacer::next_send_time`]) is allowed and puts the bucket into debt, which later
/// sends wait out.
#[derive(Debug, Clone)]
pub struct Pacer {
    capacity: i128,
    tokens: i128,
    last: Instant,
}

impl Pacer {
    /// A full bucket of `burst_bytes` at time `now`.
    #[must_use]
    pub fn new(now: Instant, burst_bytes: u32) -> Self {
        let capacity = i128::from(burst_bytes) * 8 * NS_PER_S as i128;
        Self {
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Adds the tokens earned at `rate_bps` from the last update to `now`. Times before the last
    /// update are ignored (time never runs backwards here).
    pub fn advance(&mut self, now: Instant, rate_bps: u64) {
        if now <= self.last {
            return;
        }
        let dt = i128::from(now.as_nanos() - self.last.as_nanos());
        self.tokens = self
            .tokens
            .saturating_add(dt.saturating_mul(i128::from(rate_bps)))
            .min(self.capacity);
        self.last = now;
    }

    /// The earliest time at which a packet of `bytes` may leave at `rate_bps`: `now` if the
    /// bucket holds enough tokens, else when it will. A packet larger than the bucket waits for
    /// a full bucket and then goes (the bucket goes into debt).
    #[must_use]
    pub fn next_send_time(&self, now: Instant, bytes: u32, rate_bps: u64) -> Instant {
        let mut tokens = self.tokens;
        if now > self.last {
            tokens = tokens
                .saturating_add(
                    i128::from(now.as_nanos() - self.last.as_nanos()) * i128::from(rate_bps),
                )
                .min(self.capacity);
        }
        let cost = (i128::from(bytes) * 8 * NS_PER_S as i128).min(self.capacity);
        if tokens >= cost {
            return now.max(self.last);
        }
        if rate_bps == 0 {
            return Instant::from_nanos(u64::MAX);
        }
        let deficit = (cost - tokens) as u128;
        let wait = deficit.div_ceil(u128::from(rate_bps));
        now.max(self.last) + Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// Takes the tokens of a packet of `bytes` sent at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u32, rate_bps: u64) {
        self.advance(now, rate_bps);
        self.tokens -= i128::from(bytes) * 8 * NS_PER_S as i128;
    }

    /// Fills the bucket (when the QP stops being rate limited).
    pub fn fill(&mut self, now: Instant) {
        self.tokens = self.capacity;
        self.last = self.last.max(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_at_the_rate_after_the_burst() {
        // 1000 B burst at 8 Mb/s: one 1000 B packet takes 1 ms of tokens.
        let rate = 8_000_000;
        let mut p = Pacer::new(Instant::from_nanos(0), 1000);
        assert_eq!(
            p.next_send_time(Instant::from_nanos(0), 1000, rate),
            Instant::from_nanos(0)
        );
        p.on_sent(Instant::from_nanos(0), 1000, rate);
        assert_eq!(
            p.next_send_time(Instant::from_nanos(0), 1000, rate),
            Instant::from_nanos(1_000_000)
        );
        assert_eq!(
            p.next_send_time(Instant::from_nanos(250_000), 500, rate),
            Instant::from_nanos(500_000)
        );
        p.on_sent(Instant::from_nanos(1_000_000), 1000, rate);
        assert_eq!(
            p.next_send_time(Instant::from_nanos(1_000_000), 100, rate),
            Instant::from_nanos(1_100_000)
        );
        // Idle for long: the bucket is capped at one burst.
        p.advance(Instant::from_nanos(100_000_000), rate);
        p.on_sent(Instant::from_nanos(100_000_000), 1000, rate);
        assert_eq!(
            p.next_send_time(Instant::from_nanos(100_000_000), 1, rate),
            Instant::from_nanos(100_001_000)
        );
    }

    #[test]
    fn rate_changes_apply_from_the_change_on() {
        let mut p = Pacer::new(Instant::from_nanos(0), 1000);
        p.on_sent(Instant::from_nanos(0), 1000, 8_000_000);
        // Half a millisecond at 8 Mb/s earns 500 B; then the rate drops to 4 Mb/s.
        p.advance(Instant::from_nanos(500_000), 8_000_000);
        assert_eq!(
            p.next_send_time(Instant::from_nanos(500_000), 1000, 4_000_000),
            Instant::from_nanos(1_500_000)
        );
        // An empty bucket at rate 0 never fills.
        let mut z = Pacer::new(Instant::from_nanos(0), 1000);
        z.on_sent(Instant::from_nanos(0), 1000, 0);
        assert_eq!(
            z.next_send_time(Instant::from_nanos(5), 1, 0),
            Instant::from_nanos(u64::MAX)
        );
    }
}
