//! Simulated time and the per-QP timer table (quinn-proto's `TimerTable` shape).
//!
//! The transport never reads a clock: every entry point takes `now: Instant`, and the caller
//! asks [`crate::transport::Device::poll_timeout`] when to call `handle_timeout` next.

use core::time::Duration;

pub use crate::time::Instant;
use crate::wire::RnrTimer;

/// The timers of one queue pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Timer {
    /// The local ACK timeout (IBA 9.7.6.1.3; rxe `retransmit_timer`): armed while requests are
    /// unacknowledged, fires a retry.
    Retransmit = 0,
    /// The RNR back-off after an RNR NAK (rxe `rnr_nak_timer`): the requester is stalled until
    /// it fires, then resends from the NAKed PSN.
    RnrRetry = 1,
}

impl Timer {
    /// Every timer, in the order `handle_timeout` services them.
    pub const VALUES: [Self; 2] = [Self::Retransmit, Self::RnrRetry];
}

/// One deadline per [`Timer`].
#[derive(Clone, Copy, Default, Debug)]
pub struct TimerTable {
    data: [Option<Instant>; 2],
}

impl TimerTable {
    /// Arms `timer` to fire at `at`, replacing an earlier deadline.
    pub fn set(&mut self, timer: Timer, at: Instant) {
        self.data[timer as usize] = Some(at);
    }

    /// The deadline of `timer`, if armed.
    #[must_use]
    pub fn get(&self, timer: Timer) -> Option<Instant> {
        self.data[timer as usize]
    }

    /// Disarms `timer`.
    pub fn stop(&mut self, timer: Timer) {
        self.data[timer as usize] = None;
    }

    /// Disarms every timer.
    pub fn stop_all(&mut self) {
        self.data = [None; 2];
    }

    /// The earliest deadline.
    #[must_use]
    pub fn next_timeout(&self) -> Option<Instant> {
        self.data.iter().flatten().min().copied()
    }

    /// Whether `timer` is armed and its deadline is at or before `now`.
    #[must_use]
    pub fn is_expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|t| t <= now)
    }
}

/// The local ACK timeout for the QP attribute `timeout` (0..=31): 4.096 µs × 2^timeout, or
/// `None` for 0, which disables the timer (rxe_qp.c: "timeout = 4.096 * 2 ^ attr->timeout \[us\]").
#[must_use]
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    Some(Duration::from_nanos(4096u64 << timeout.min(31)))
}

/// How long a requester waits after an RNR NAK with `timer` before it retries (IBA 9.7.5.2.8,
/// table 46; the code table is [`crate::wire::aeth::RNR_TIMER_US`]).
#[must_use]
pub fn rnr_timer(timer: RnrTimer) -> Duration {
    Duration::from_micros(u64::from(timer.micros()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_table_next_timeout_is_the_minimum() {
        let mut t = TimerTable::default();
        assert_eq!(t.next_timeout(), None);
        t.set(Timer::Retransmit, Instant::from_nanos(50));
        t.set(Timer::RnrRetry, Instant::from_nanos(20));
        assert_eq!(t.next_timeout(), Some(Instant::from_nanos(20)));
        assert!(t.is_expired(Timer::RnrRetry, Instant::from_nanos(20)));
        assert!(!t.is_expired(Timer::Retransmit, Instant::from_nanos(20)));
        t.stop(Timer::RnrRetry);
        assert_eq!(t.next_timeout(), Some(Instant::from_nanos(50)));
    }

    #[test]
    fn local_ack_timeout_is_4096ns_shifted() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(4096 << 14))
        );
        assert_eq!(rnr_timer(RnrTimer::new(12)), Duration::from_micros(640));
        assert_eq!(rnr_timer(RnrTimer::new(0)), Duration::from_micros(655_360));
    }
}
