//! The one notion of time in the sans-I/O core (smoltcp's `time::Instant` shape).
//!
//! `wire`, `transport` and `cc` never read a clock: every entry point that needs the time takes
//! an [`Instant`], and only the engine turns the system's monotonic clock into one. Tests and
//! the simulators start at [`Instant::ZERO`] and advance by hand, so runs are deterministic.
//! Durations are [`core::time::Duration`].

use core::{fmt, ops::Add, time::Duration};

/// A point in time, in nanoseconds since an arbitrary epoch chosen by the caller (the engine
/// starts its clock at zero when it is created).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self(0);

    /// An instant `nanos` nanoseconds after the epoch.
    #[must_use]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// An instant `us` microseconds after the epoch (saturating).
    #[must_use]
    pub const fn from_micros(us: u64) -> Self {
        Self(us.saturating_mul(1000))
    }

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, zero if `earlier` is later.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at the end of time (`u64::MAX` ns, 584 years).
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        self + d
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    /// Saturating: a time past `u64::MAX` ns stays at the end of time.
    fn add(self, d: Duration) -> Self {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_past_the_end_of_time_saturates() {
        let end = Instant::from_nanos(u64::MAX - 1) + Duration::from_secs(1);
        assert_eq!(end.as_nanos(), u64::MAX);
        assert_eq!(Instant::from_micros(u64::MAX).as_nanos(), u64::MAX);
    }

    #[test]
    fn a_duration_back_in_time_is_zero() {
        let a = Instant::from_micros(5);
        let b = Instant::from_micros(7);
        assert_eq!(b.saturating_duration_since(a), Duration::from_micros(2));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
    }
}
