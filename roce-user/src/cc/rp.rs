//! The DCQCN reaction point: the rate of one QP.

use core::time::Duration;

use super::{CcStats, DcqcnConfig, Instant, Pacer, config::mbps};

/// α is kept in 1024ths (10 fractional bits), as mlx5 firmware keeps it.
const ALPHA_ONE: u32 = 1024;
/// The largest α (initial_alpha_value's upper bound).
const ALPHA_MAX: u32 = 1023;

/// Which increase rule the stage counters select (DCQCN §3.2, htsim `increaseRate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not rate limited: sending at line rate, no timers.
    Unlimited,
    /// `max(T, BC) ≤ F`: the rate goes half way back to the target.
    FastRecovery,
    /// Past F on one counter: the target grows by `rpg_ai_rate` per event.
    AdditiveIncrease,
    /// Past F on both counters: the target grows by `rpg_hai_rate` per stage past F.
    HyperIncrease,
}

impl Phase {
    /// The name used in traces and `roce stats -s`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unlimited => "unlimited",
            Self::FastRecovery => "fast_recovery",
            Self::AdditiveIncrease => "additive_increase",
            Self::HyperIncrease => "hyper_increase",
        }
    }
}

/// The RP's increase stage: the timer and byte counters since the last cut and the phase they
/// put the next increase in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Stage {
    /// Timer events since the last cut (DCQCN T).
    pub timer: u32,
    /// Byte-counter events since the last cut (DCQCN BC).
    pub bytes: u32,
    /// The phase.
    pub phase: Phase,
}

/// The two timers of the RP (quinn-proto `TimerTable` style).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// α decay, every `dce_tcp_rtt` without a CNP.
    Alpha = 0,
    /// Rate increase, every `rpg_time_reset` without a CNP.
    Increase = 1,
}

/// DCQCN rate control of one QP (the side that sends data).
///
/// The algorithm is the paper's (Zhu et al., SIGCOMM 2015, Fig. 5; the same as htsim
/// `DCQCNSrc`), with the knobs and fixed-point arithmetic of mlx5 ([`DcqcnConfig`]):
/// - A QP starts unlimited, at `line_rate_bps`, with no timers.
/// - A CNP (at most one per `rate_reduce_monitor_period`; others count as `rp_cnp_ignored`)
///   sets the target to the current rate and cuts the current rate by `rate·α/2^rpg_gd`
///   (α/2 with the default gd 11), but never below `rate·rpg_min_dec_fac/100` nor
///   `rpg_min_rate`; then `α ← α·g/1024 + (1024 − g)`, the counters T and BC go to 0 and both
///   timers restart. The first CNP of an unlimited QP starts from α = `initial_alpha_value`,
///   and sets the rate to `rate_to_set_on_first_cnp` instead of cutting, unless that is 0.
/// - Every `dce_tcp_rtt` without a CNP: `α ← α·g/1024`.
/// - Every `rpg_time_reset` without a CNP, T += 1; every `rpg_byte_reset` bytes sent, BC += 1;
///   each such event (after counting it) increases the rate: with F = `rpg_threshold`, if
///   `max(T, BC) ≤ F` fast recovery; else if `min(T, BC) ≤ F` additive increase (target +=
///   `rpg_ai_rate`); else hyper increase (target += `(min(T, BC) − F) · rpg_hai_rate`); then
///   `rate ← ⌈(target + rate)/2⌉`. Both are clamped to the line rate. With the byte counter
///   off (`rpg_byte_reset` 0), max = T and min = T − 1: F fast-recovery events, one additive
///   increase, then hyper increase, as in the Mellanox model.
/// - When rate and target are back at the line rate the QP is unlimited again and its timers
///   stop (mlx5 releases the rate limiter).
///
/// Rounding: rates are bits/s in `u64`; cuts round the cut amount down, increases round the
/// average up (so fast recovery reaches the target instead of stopping one bit/s short), α
/// updates round down.
#[derive(Debug, Clone)]
pub struct ReactionPoint {
    enabled: bool,
    loss_backoff: bool,
    hold_when_idle: bool,
    /// `bytes_sent` when the increase timer last fired or was armed: what the QP sent in the
    /// current period is the difference ([`DcqcnConfig::hold_when_idle`]).
    period_start_bytes: u64,
    /// With `hold_when_idle`: the last timer period ended unused, so the byte counter's
    /// events do not increase the rate either until a period is used again.
    idle: bool,
    /// The pacer held a packet back in the current period ([`Self::on_paced`]): the rate was
    /// what limited the QP, so the period counts as used however little it sent.
    paced: bool,
    /// The length of the packet the pacer holds back, until the QP sends: while the pacer would
    /// still hold it at a period's end, that period is used too (the wait of a packet paced at
    /// a low rate can span many periods); once the pacer would let it go, a QP that does not
    /// send it (a thread stalled) is idle, not rate limited.
    waiting: Option<u32>,
    /// The last cut was for a loss: increases stay additive until a CNP or line rate.
    loss_limited: bool,
    /// Set by [`Self::on_loss_delivered`]: how long that loss took to show; `Some` only while
    /// `loss_limited` (a CNP, line rate and [`Self::on_loss`] clear it). While it is set, the
    /// increase timer runs at this period instead of `time_reset` and the
    /// byte counter does not increase the rate (one additive step per feedback interval, as
    /// TCP's congestion avoidance adds one segment per round trip, RFC 5681 §3.1).
    loss_period: Option<Duration>,
    line_rate: u64,
    rate: u64,
    target: u64,
    alpha: u32,
    limited: bool,
    timer_stage: u32,
    byte_stage: u32,
    byte_count: u64,
    last_cut: Option<Instant>,
    /// Cuts made so far (CNPs and losses): a [`LossUndo`] applies only while no cut followed
    /// the one it records.
    cuts: u64,
    timers: [Option<Instant>; 2],
    pacer: Pacer,
    cnps: u64,
    bytes_sent: u64,
    stats: CcStats,
    // Copied from the config.
    time_reset: Duration,
    alpha_period: Duration,
    monitor_period: Duration,
    byte_reset: u64,
    threshold: u32,
    ai: u64,
    hai: u64,
    gd: u32,
    min_dec_fac: u64,
    min_rate: u64,
    first_cnp_rate: u64,
    g: u32,
    initial_alpha: u32,
}

/// The state a loss cut changed ([`ReactionPoint::on_loss`]), to put back if the loss proves
/// spurious ([`ReactionPoint::undo_loss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossUndo {
    /// The cut's number ([`ReactionPoint`]'s count of cuts, this one included).
    cut: u64,
    rate: u64,
    target: u64,
    limited: bool,
    loss_limited: bool,
    loss_period: Option<Duration>,
    timer_stage: u32,
    byte_stage: u32,
    last_cut: Option<Instant>,
}

impl LossUndo {
    /// The record of two cuts in a row that one cause made (the doubled retransmission timer of
    /// one stall): this one's state from before the first, valid while no cut follows
    /// `later`.
    #[must_use]
    pub const fn followed_by(self, later: &Self) -> Self {
        Self {
            cut: later.cut,
            ..self
        }
    }
}

/// Longest increase period after a loss whose delivered rate is known
/// ([`ReactionPoint::on_loss_delivered`]).
pub const LOSS_PERIOD_MAX: Duration = Duration::from_millis(100);

/// Most byte-counter increase events one [`ReactionPoint::on_sent`] call applies.
const MAX_BYTE_EVENTS: u64 = 64;

/// Pacing bucket size when none is given: two 4096-byte MTU packets with headers.
pub const DEFAULT_PACING_BURST: u32 = 2 * 4200;

impl ReactionPoint {
    /// An unlimited reaction point for a QP on a link of `line_rate_bps`, created at `now`.
    /// `config` should be validated ([`DcqcnConfig::validate`]); values out of range are
    /// clamped into it rather than trusted.
    #[must_use]
    pub fn new(config: &DcqcnConfig, line_rate_bps: u64, now: Instant) -> Self {
        Self::with_burst(config, line_rate_bps, now, DEFAULT_PACING_BURST)
    }

    /// As [`Self::new`], with a pacing bucket of `burst_bytes`.
    #[must_use]
    pub fn with_burst(
        config: &DcqcnConfig,
        line_rate_bps: u64,
        now: Instant,
        burst_bytes: u32,
    ) -> Self {
        let line_rate = line_rate_bps.max(1);
        Self {
            enabled: config.rp_enabled,
            loss_backoff: config.loss_backoff,
            hold_when_idle: config.hold_when_idle,
            period_start_bytes: 0,
            idle: false,
            paced: false,
            waiting: None,
            loss_limited: false,
            loss_period: None,
            line_rate,
            rate: line_rate,
            target: line_rate,
            alpha: config.initial_alpha_value.min(ALPHA_MAX),
            limited: false,
            timer_stage: 0,
            byte_stage: 0,
            byte_count: 0,
            last_cut: None,
            cuts: 0,
            timers: [None; 2],
            pacer: Pacer::new(now, burst_bytes),
            cnps: 0,
            bytes_sent: 0,
            stats: CcStats::default(),
            time_reset: config.time_reset().max(Duration::from_micros(1)),
            alpha_period: config.alpha_period().max(Duration::from_micros(1)),
            monitor_period: config.monitor_period(),
            byte_reset: u64::from(config.rpg_byte_reset),
            threshold: config.rpg_threshold.max(1),
            ai: mbps(config.rpg_ai_rate),
            hai: mbps(config.rpg_hai_rate),
            gd: config.rpg_gd.clamp(1, 15),
            min_dec_fac: u64::from(config.rpg_min_dec_fac.clamp(1, 100)),
            min_rate: mbps(config.rpg_min_rate).min(line_rate),
            first_cnp_rate: mbps(config.rate_to_set_on_first_cnp),
            g: config.dce_tcp_g.min(ALPHA_MAX),
            initial_alpha: config.initial_alpha_value.min(ALPHA_MAX),
        }
    }

    /// Call for every CNP received for this QP (BTH opcode 0x81 to our QPN).
    pub fn on_cnp(&mut self, now: Instant) {
        self.cnps += 1;
        if self.enabled && self.may_cut(now) {
            self.stats.rp_cnp_handled += 1;
            self.react(now);
        } else {
            self.stats.rp_cnp_ignored += 1;
        }
    }

    /// Call when the transport detects a loss on this QP: the requester starts a retry (go
    /// back N) or the responder replays a READ (with a measure of what the requester took:
    /// [`Self::on_loss_delivered`]). roce-xdp's own addition to DCQCN, for a peer
    /// that marks nothing (Linux Soft-RoCE) behind a path that marks nothing (a VM's tap, a
    /// software switch): such a peer never sends a CNP, and without a reaction to loss a burst
    /// to a slow receiver loops through drop, retry and replay at line rate.
    ///
    /// With `loss_backoff` on (`DcqcnConfig::loss_backoff`, off by default), a loss (at most
    /// one per `rate_reduce_monitor_period`) halves the rate and sets the target to the new
    /// rate, as TCP halves its window once per loss episode (RFC 5681 §3.1: multiplicative
    /// decrease by 1/2); until the next CNP, increases
    /// are additive only (`rpg_ai_rate` per timer or byte-counter event), never fast recovery
    /// back to the rate that lost packets, nor hyper increase. DCQCN's own cut would not do:
    /// with mlx5's α timer (1 µs) α has decayed to nothing by the time a loss is detected,
    /// and fast recovery returns to the lossy rate within five timer periods. The transport
    /// starts at most one retry sequence per lost PSN (rxe `started_retry`), so one loss is
    /// one event.
    ///
    /// Returns what the cut changed, if it cut: keep it while the loss may still prove
    /// spurious, and give it to [`Self::undo_loss`] if it does.
    pub fn on_loss(&mut self, now: Instant) -> Option<LossUndo> {
        let undo = self.loss_cut(now, self.rate / 2)?;
        self.loss_period = None;
        Some(undo)
    }

    /// Puts back the rate, target and increase stage from before the loss cut `undo` records,
    /// when the loss proved spurious: the transport's retransmission timeout fired while the
    /// peer still had every packet (its ACKs were only late), which it learns when the peer
    /// reports a replayed packet as a duplicate (RFC 3708). As the Eifel response restores
    /// TCP's window after a spurious timeout (RFC 4015 §3), the QP goes back to where it was,
    /// its increase timer starting a fresh period; a rate that has since grown past the one
    /// recorded is kept. Does nothing, and returns false, if another cut (a CNP or a loss)
    /// came after the recorded one: that one was a real signal.
    pub fn undo_loss(&mut self, now: Instant, undo: &LossUndo) -> bool {
        if undo.cut != self.cuts || self.rate >= undo.rate {
            return false;
        }
        self.stats.rp_loss_undone += 1;
        self.pacer.advance(now, self.rate);
        self.last_cut = undo.last_cut;
        self.timer_stage = undo.timer_stage;
        self.byte_stage = undo.byte_stage;
        self.byte_count = 0;
        self.period_start_bytes = self.bytes_sent;
        self.idle = false;
        if undo.limited {
            self.rate = undo.rate;
            self.target = undo.target.max(undo.rate);
            self.loss_limited = undo.loss_limited;
            self.loss_period = undo.loss_period;
            self.timers[Timer::Increase as usize] = Some(now + self.increase_period());
        } else {
            self.limited = false;
            self.loss_limited = false;
            self.loss_period = None;
            self.rate = self.line_rate;
            self.target = self.line_rate;
            self.timers[Timer::Increase as usize] = None;
            self.pacer.fill(now);
        }
        true
    }

    /// As [`Self::on_loss`], for a loss whose sender knows what the receiver got before it: a
    /// responder replaying a READ from PSN p knows that the requester took the responses from
    /// the start of the episode up to p in order (it asks again from its first gap, rxe
    /// `rxe_comp.c`), `delivered_bps` over `feedback`, the time from the first of them to the
    /// request asking again. READ responses are never acknowledged, so this is the only
    /// measure of the receiver's speed there is.
    ///
    /// The cut goes to seven eighths of the delivered rate when that is below the rate (as
    /// TCP Westwood sets its window to the bandwidth it measured, Mascolo et al., MobiCom
    /// 2001; the eighth less drains the queue that overflowed), else halves as
    /// [`Self::on_loss`]. Only the first such cut may go below half the rate: a later
    /// episode's measure can be low for reasons that are not the receiver's speed (the
    /// requester waited for its ACK timer to ask again), and a QP already near the receiver's
    /// speed needs no more than TCP's halving.
    ///
    /// Until the next CNP or line rate the target then increases once per feedback interval,
    /// `feedback` clamped to `rpg_time_reset..=100 ms` (`LOSS_PERIOD_MAX`), by `rpg_ai_rate`
    /// or a sixteenth of the rate, whichever is more, and not per byte counter event. DCQCN's
    /// increase timer assumes a loop of microseconds; a receiver behind a 1000-frame tap queue
    /// reports a loss tens of milliseconds late, and an increase per `rpg_time_reset` would take
    /// the rate back over the receiver's before the next report. The sixteenth brings a rate
    /// that a low measure cut too far back to the receiver's in tens of intervals, not
    /// hundreds.
    pub fn on_loss_delivered(&mut self, now: Instant, delivered_bps: u64, feedback: Duration) {
        let to = if delivered_bps < self.rate {
            delivered_bps - delivered_bps / 8
        } else {
            self.rate / 2
        };
        let to = if self.loss_period.is_some() {
            to.max(self.rate / 2)
        } else {
            to
        };
        if self.loss_cut(now, to).is_some() {
            self.loss_period =
                Some(feedback.clamp(self.time_reset, LOSS_PERIOD_MAX.max(self.time_reset)));
            self.timers[Timer::Increase as usize] = Some(now + self.increase_period());
        }
    }

    /// The increase timer's period: `time_reset`, or the feedback interval of the last loss
    /// while the QP is loss limited ([`Self::on_loss_delivered`]).
    fn increase_period(&self) -> Duration {
        self.loss_period.unwrap_or(self.time_reset)
    }

    /// The cut both losses make, to `to` (at least `rpg_min_rate`), returning what it
    /// changed; `None` if the loss is not acted on (RP or `loss_backoff` off, or within
    /// `rate_reduce_monitor_period` of a cut).
    fn loss_cut(&mut self, now: Instant, to: u64) -> Option<LossUndo> {
        if !(self.enabled && self.loss_backoff && self.may_cut(now)) {
            self.stats.rp_loss_ignored += 1;
            return None;
        }
        self.stats.rp_loss_handled += 1;
        self.cuts += 1;
        let undo = LossUndo {
            cut: self.cuts,
            rate: self.rate,
            target: self.target,
            limited: self.limited,
            loss_limited: self.loss_limited,
            loss_period: self.loss_period,
            timer_stage: self.timer_stage,
            byte_stage: self.byte_stage,
            last_cut: self.last_cut,
        };
        self.pacer.advance(now, self.rate);
        self.limited = true;
        self.loss_limited = true;
        self.rate = to.max(self.min_rate);
        self.target = self.rate;
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.byte_count = 0;
        self.last_cut = Some(now);
        self.timers[Timer::Increase as usize] = Some(now + self.time_reset);
        self.period_start_bytes = self.bytes_sent;
        self.idle = false;
        Some(undo)
    }

    /// Whether `rate_reduce_monitor_period` has passed since the last cut.
    fn may_cut(&self, now: Instant) -> bool {
        self.last_cut
            .is_none_or(|t| now.saturating_duration_since(t) >= self.monitor_period)
    }

    /// The DCQCN reaction to a CNP.
    fn react(&mut self, now: Instant) {
        self.cuts += 1;
        self.loss_limited = false;
        self.loss_period = None;
        self.pacer.advance(now, self.rate);
        if !self.limited {
            self.limited = true;
            self.alpha = self.initial_alpha;
            if self.first_cnp_rate != 0 {
                self.target = self.rate;
                self.rate = self.first_cnp_rate.clamp(self.min_rate, self.line_rate);
            } else {
                self.cut();
            }
        } else {
            self.cut();
        }
        self.alpha = ((self.alpha * self.g) >> 10) + (ALPHA_ONE - self.g);
        self.alpha = self.alpha.min(ALPHA_MAX);
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.byte_count = 0;
        self.last_cut = Some(now);
        self.timers[Timer::Alpha as usize] = Some(now + self.alpha_period);
        self.timers[Timer::Increase as usize] = Some(now + self.time_reset);
        self.period_start_bytes = self.bytes_sent;
        self.idle = false;
    }

    /// Whether the increase period that ends now was used ([`DcqcnConfig::hold_when_idle`];
    /// RFC 7661 §4.3's "validated" window, with DCQCN's rate in place of TCP's window): the
    /// pacer held a packet back in it or into it ([`Self::on_paced`]: the rate limited the
    /// QP, as Linux TCP's `is_cwnd_limited`), or the QP sent at least half of what its rate
    /// allowed in `time_reset`. The first rule matters at low rates, where one packet takes
    /// longer than a period to pace. `end` is the period's end; starts the next period.
    fn period_used(&mut self, end: Instant) -> bool {
        let sent = self.bytes_sent - self.period_start_bytes;
        self.period_start_bytes = self.bytes_sent;
        let held = self
            .waiting
            .is_some_and(|b| self.pacer.next_send_time(end, b, self.rate) > end);
        let paced = core::mem::take(&mut self.paced) || held;
        let allowed = u128::from(self.rate) * self.increase_period().as_nanos() / 8_000_000_000;
        paced || 2 * u128::from(sent) >= allowed
    }

    fn cut(&mut self) {
        self.target = self.rate;
        let by = ((u128::from(self.rate) * u128::from(self.alpha)) >> self.gd) as u64;
        let floor = (self.rate * self.min_dec_fac / 100).max(self.min_rate);
        self.rate = self.rate.saturating_sub(by).max(floor);
    }

    /// (max, min) of the counters that drive increases. With the byte counter off, the timer
    /// alone drives the stages as in the Mellanox model (HPCC simulator `rdma-hw.cc`): F fast
    /// recovery events, one additive increase, then hyper increase; that is (T, T − 1).
    fn counters(&self) -> (u32, u32) {
        if self.byte_reset == 0 {
            (self.timer_stage, self.timer_stage.saturating_sub(1))
        } else {
            (
                self.timer_stage.max(self.byte_stage),
                self.timer_stage.min(self.byte_stage),
            )
        }
    }

    fn phase_of(&self, hi: u32, lo: u32) -> Phase {
        if hi <= self.threshold {
            Phase::FastRecovery
        } else if lo <= self.threshold {
            Phase::AdditiveIncrease
        } else {
            Phase::HyperIncrease
        }
    }

    /// One increase event (a counter has just been incremented).
    fn increase(&mut self) {
        let (hi, lo) = self.counters();
        let phase = if self.loss_limited {
            Phase::AdditiveIncrease
        } else {
            self.phase_of(hi, lo)
        };
        match phase {
            Phase::FastRecovery | Phase::Unlimited => {}
            Phase::AdditiveIncrease if self.loss_period.is_some() => {
                self.target = self.target.saturating_add(self.ai.max(self.rate / 16));
            }
            Phase::AdditiveIncrease => self.target = self.target.saturating_add(self.ai),
            Phase::HyperIncrease => {
                let stages = u64::from(lo - self.threshold);
                self.target = self.target.saturating_add(stages.saturating_mul(self.hai));
            }
        }
        self.target = self.target.min(self.line_rate);
        // ⌈(target + rate)/2⌉ without overflow.
        let (t, r) = (self.target, self.rate);
        self.rate = (t / 2 + r / 2 + (t % 2 + r % 2).div_ceil(2)).min(self.line_rate);
        if self.rate >= self.line_rate && self.target >= self.line_rate {
            self.limited = false;
            self.loss_limited = false;
            self.loss_period = None;
            self.rate = self.line_rate;
            self.timers = [None; 2];
        }
    }

    /// Call after each packet of this QP is handed to the NIC/ring: `bytes` is its length on
    /// the wire (the frame). Feeds the pacer and the byte counter.
    pub fn on_sent(&mut self, now: Instant, bytes: u32) {
        self.bytes_sent += u64::from(bytes);
        self.waiting = None;
        if !self.limited {
            return;
        }
        if self.timers[Timer::Increase as usize].is_none() {
            // Held idle ([`DcqcnConfig::hold_when_idle`]): sending starts a new period.
            self.timers[Timer::Increase as usize] = Some(now + self.increase_period());
            self.period_start_bytes = self.bytes_sent - u64::from(bytes);
        }
        self.pacer.on_sent(now, bytes, self.rate);
        if self.byte_reset == 0 || self.loss_period.is_some() {
            return;
        }
        self.byte_count += u64::from(bytes);
        let events = self.byte_count / self.byte_reset;
        self.byte_count %= self.byte_reset;
        if events > 0 {
            self.pacer.advance(now, self.rate);
        }
        // A packet worth more than MAX_BYTE_EVENTS counters (a byte counter set absurdly low)
        // counts as that many: the loop stays short whatever the configuration.
        for _ in 0..events.min(MAX_BYTE_EVENTS) {
            if !self.limited {
                break;
            }
            if self.idle {
                self.stats.rp_increase_held += 1;
                continue;
            }
            self.byte_stage = self.byte_stage.saturating_add(1);
            self.increase();
        }
        if !self.limited {
            self.byte_count = 0;
            self.pacer.fill(now);
        }
    }

    /// The earliest time a packet of `bytes` may be sent: `now` when not rate limited, else
    /// when the pacing bucket (filled at the current rate) holds `bytes`. Call before emitting
    /// each packet; if it is later than `now`, wake up then.
    #[must_use]
    pub fn next_send_time(&self, now: Instant, bytes: u32) -> Instant {
        if self.limited {
            self.pacer.next_send_time(now, bytes, self.rate)
        } else {
            now
        }
    }

    /// The next time [`Self::handle_timeout`] must be called, if any (quinn-proto style). It
    /// changes after `on_cnp`, `on_sent` and `handle_timeout`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.iter().flatten().min().copied()
    }

    /// Fires every timer that is due at `now`, in time order, each at its own deadline (so a
    /// late call gives the same result as calls on time). Spurious calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        loop {
            let due = [Timer::Alpha, Timer::Increase]
                .into_iter()
                .filter_map(|t| self.timers[t as usize].map(|at| (at, t)))
                .filter(|(at, _)| *at <= now)
                .min_by_key(|(at, t)| (*at, *t as u8));
            let Some((at, timer)) = due else { break };
            match timer {
                Timer::Alpha => {
                    self.alpha = (self.alpha * self.g) >> 10;
                    // α stays 0 once there; its timer stops until the next CNP.
                    self.timers[Timer::Alpha as usize] =
                        (self.alpha > 0).then(|| at + self.alpha_period);
                }
                Timer::Increase => {
                    self.pacer.advance(at, self.rate);
                    self.idle = !self.period_used(at) && self.hold_when_idle;
                    if self.idle {
                        // The timer stops until the QP sends again ([`Self::on_sent`] starts a
                        // new period): a QP with nothing to send neither increases nor wakes
                        // anyone up, and a stall of many periods is one held increase.
                        self.stats.rp_increase_held += 1;
                        self.timers[Timer::Increase as usize] = None;
                        continue;
                    }
                    self.timers[Timer::Increase as usize] = Some(at + self.increase_period());
                    self.timer_stage = self.timer_stage.saturating_add(1);
                    self.increase();
                    if !self.limited {
                        self.pacer.fill(at);
                    }
                }
            }
        }
    }

    /// Call when a packet of `bytes` was ready but [`Self::next_send_time`] put it later than
    /// now: the QP is rate limited, so the increase periods until it is sent count as used
    /// while the pacer holds it, even if the rate lets the QP send less than half of them
    /// ([`DcqcnConfig::hold_when_idle`]).
    pub fn on_paced(&mut self, bytes: u32) {
        self.paced = true;
        self.waiting = Some(bytes);
    }

    /// The current rate in bits/s (the line rate when not limited).
    #[must_use]
    pub const fn rate_bps(&self) -> u64 {
        self.rate
    }

    /// The target rate in bits/s.
    #[must_use]
    pub const fn target_bps(&self) -> u64 {
        self.target
    }

    /// α in 1024ths.
    #[must_use]
    pub const fn alpha_fixed(&self) -> u32 {
        self.alpha
    }

    /// α as a fraction in [0, 1).
    #[must_use]
    pub fn alpha(&self) -> f64 {
        f64::from(self.alpha) / f64::from(ALPHA_ONE)
    }

    /// The line rate in bits/s.
    #[must_use]
    pub const fn line_rate_bps(&self) -> u64 {
        self.line_rate
    }

    /// Whether the QP is rate limited (a CNP cut it and it has not recovered to line rate).
    #[must_use]
    pub const fn is_limited(&self) -> bool {
        self.limited
    }

    /// The increase stage.
    #[must_use]
    pub fn stage(&self) -> Stage {
        let phase = if self.loss_limited {
            Phase::AdditiveIncrease
        } else if self.limited {
            let (hi, lo) = self.counters();
            self.phase_of(hi, lo)
        } else {
            Phase::Unlimited
        };
        Stage {
            timer: self.timer_stage,
            bytes: self.byte_stage,
            phase,
        }
    }

    /// CNPs received (handled and ignored).
    #[must_use]
    pub const fn cnps(&self) -> u64 {
        self.cnps
    }

    /// Bytes reported through [`Self::on_sent`].
    #[must_use]
    pub const fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// RP counters (`rp_*`; the `np_*` fields stay zero).
    #[must_use]
    pub const fn stats(&self) -> CcStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    //! Expected values are written out: they were computed by hand from the algorithm as
    //! documented on [`ReactionPoint`] (an independent Python model, not this code), e.g. the
    //! first cut at line rate 10 Gb/s with α = 1023/1024 and gd 11:
    //! `10e9 − ⌊10e9·1023/2048⌋ = 10e9 − 4_995_117_187 = 5_004_882_813`.
    use super::*;

    const LINE: u64 = 10_000_000_000;
    const FIRST_CUT: u64 = 5_004_882_813;

    fn us(v: u64) -> Instant {
        Instant::from_micros(v)
    }

    /// A config whose timers do not fire unless a test wants them to.
    fn quiet() -> DcqcnConfig {
        DcqcnConfig {
            rpg_time_reset: 131_071,
            dce_tcp_rtt: 131_071,
            rpg_byte_reset: 0,
            ..DcqcnConfig::default()
        }
    }

    #[test]
    fn with_hold_when_idle_a_stalled_qp_keeps_its_cut_rate_and_a_busy_one_still_increases() {
        let cfg = DcqcnConfig {
            rpg_time_reset: 1500,
            rpg_byte_reset: 0,
            hold_when_idle: true,
            ..DcqcnConfig::default()
        };
        let mlx5 = DcqcnConfig {
            hold_when_idle: false,
            ..cfg
        };
        let t = cfg.time_reset();
        // A CNP, then a stall of 100 periods in which nothing was sent, handled at once.
        let mut held = ReactionPoint::new(&cfg, LINE, us(0));
        let mut plain = ReactionPoint::new(&mlx5, LINE, us(0));
        for rp in [&mut held, &mut plain] {
            rp.on_cnp(us(0));
            assert_eq!(rp.rate_bps(), FIRST_CUT);
            rp.handle_timeout(us(0) + t * 100);
        }
        assert_eq!(
            held.rate_bps(),
            FIRST_CUT,
            "no increase for periods it did not use"
        );
        // One held increase: the first unused period stops the timer, so the stall costs no
        // wakeups either.
        assert_eq!(held.stats.rp_increase_held, 1);
        assert_eq!(held.poll_timeout(), held.timers[Timer::Alpha as usize]);
        assert!(held.timers[Timer::Increase as usize].is_none());
        assert_eq!(
            plain.rate_bps(),
            LINE,
            "mlx5's timer: hyper increase back to line rate"
        );
        assert_eq!(plain.stats.rp_increase_held, 0);
        // A QP that sends what its rate allows in each period increases exactly as without.
        let (mut busy, mut twin) = (
            ReactionPoint::new(&cfg, LINE, us(0)),
            ReactionPoint::new(&mlx5, LINE, us(0)),
        );
        busy.on_cnp(us(0));
        twin.on_cnp(us(0));
        for k in 1..=6u32 {
            let allowed = u128::from(busy.rate_bps()) * t.as_nanos() / 8_000_000_000;
            let now = us(0) + t * (k - 1) + t / 2;
            for _ in 0..allowed.div_ceil(4200) {
                busy.on_sent(now, 4200);
                twin.on_sent(now, 4200);
            }
            busy.handle_timeout(us(0) + t * k);
            twin.handle_timeout(us(0) + t * k);
            assert_eq!(busy.rate_bps(), twin.rate_bps(), "period {k}");
        }
        assert!(busy.rate_bps() > FIRST_CUT);
        assert_eq!(busy.stats.rp_increase_held, 0);
        // Half the allowance is enough; less is not.
        let mut half = ReactionPoint::new(&cfg, LINE, us(0));
        half.on_cnp(us(0));
        let allowed = u128::from(half.rate_bps()) * t.as_nanos() / 8_000_000_000;
        half.on_sent(us(1), u32::try_from(allowed / 2 - 1).unwrap());
        half.handle_timeout(us(0) + t);
        assert_eq!(
            (half.rate_bps(), half.stats.rp_increase_held),
            (FIRST_CUT, 1)
        );
        // Sending again starts a new period, at the send.
        half.on_sent(us(0) + t + t / 2, u32::try_from(allowed / 2 + 1).unwrap());
        assert_eq!(
            half.timers[Timer::Increase as usize],
            Some(us(0) + t + t / 2 + t)
        );
        half.handle_timeout(us(0) + t * 2);
        assert_eq!(half.rate_bps(), FIRST_CUT);
        half.handle_timeout(us(0) + t * 5 / 2);
        assert!(half.rate_bps() > FIRST_CUT);
    }

    #[test]
    fn with_hold_when_idle_a_packet_the_pacer_holds_makes_its_periods_used() {
        // At 1-2 Mb/s a 4200-byte frame takes 17-34 ms to pace, more than 11 periods of
        // 1500 µs: the QP sends far less than half of a period's allowance, yet the rate is
        // what limits it.
        let cfg = DcqcnConfig {
            rpg_time_reset: 1500,
            rpg_byte_reset: 0,
            rate_to_set_on_first_cnp: 2,
            hold_when_idle: true,
            ..DcqcnConfig::default()
        };
        let t = cfg.time_reset();
        let (mut paced, mut idle) = (
            ReactionPoint::with_burst(&cfg, LINE, us(0), 4200),
            ReactionPoint::with_burst(&cfg, LINE, us(0), 4200),
        );
        let mut cut = 0;
        for rp in [&mut paced, &mut idle] {
            rp.on_cnp(us(0));
            assert_eq!(rp.rate_bps(), 2_000_000);
            rp.on_sent(us(1), 4200);
            // A second CNP cuts below the 2 Mb/s target and starts a period with nothing sent.
            rp.on_cnp(us(10));
            cut = rp.rate_bps();
            assert!(cut < 2_000_000);
            assert!(rp.next_send_time(us(11), 4200) > us(10) + t * 2);
        }
        // `paced` has its next frame ready and waiting; `idle` has nothing to send.
        paced.on_paced(4200);
        paced.handle_timeout(us(10) + t);
        idle.handle_timeout(us(10) + t);
        assert!(paced.rate_bps() > cut, "a used period");
        assert_eq!(paced.stats.rp_increase_held, 0);
        assert_eq!((idle.rate_bps(), idle.stats.rp_increase_held), (cut, 1));
        // Every period until the pacer lets the frame go (sooner as the rate rises) is used.
        let mut now = us(10) + t;
        let mut periods = 1;
        loop {
            let ready = paced.next_send_time(now, 4200);
            if ready <= now {
                break;
            }
            let timer = paced.timers[Timer::Increase as usize].unwrap();
            now = ready.min(timer);
            periods += usize::from(now == timer);
            paced.handle_timeout(now);
        }
        assert!(periods > 2, "{periods}");
        assert_eq!(paced.stats.rp_increase_held, 0);
        // Sending it ends the wait: the period with the send is used, the next one, with
        // nothing ready, is idle and stops the timer.
        paced.on_sent(now, 4200);
        let end = paced.timers[Timer::Increase as usize].unwrap();
        paced.handle_timeout(end);
        let rate = paced.rate_bps();
        paced.handle_timeout(end + t);
        assert_eq!(paced.rate_bps(), rate);
        assert_eq!(paced.stats.rp_increase_held, 1);
        assert!(paced.timers[Timer::Increase as usize].is_none());
    }

    #[test]
    fn with_hold_when_idle_the_byte_counter_waits_for_a_used_period() {
        let cfg = DcqcnConfig {
            rpg_time_reset: 1500,
            rpg_byte_reset: 32_768,
            hold_when_idle: true,
            ..DcqcnConfig::default()
        };
        let t = cfg.time_reset();
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        // Before any period ended: the byte counter counts as in mlx5.
        rp.on_sent(us(1), 32_768);
        let after_one = rp.rate_bps();
        assert!(after_one > FIRST_CUT);
        // A period with (almost) nothing sent: idle; ten byte counter events then count for
        // nothing.
        rp.handle_timeout(us(0) + t);
        assert_eq!(rp.stats.rp_increase_held, 1);
        for _ in 0..10 {
            rp.on_sent(us(0) + t + t / 2, 32_768);
        }
        assert_eq!((rp.rate_bps(), rp.stats.rp_increase_held), (after_one, 11));
        // A used period ends the hold, for both counters.
        let allowed = u128::from(rp.rate_bps()) * t.as_nanos() / 8_000_000_000;
        for _ in 0..allowed.div_ceil(32_768) {
            rp.on_sent(us(0) + t + t / 2, 32_768);
        }
        // (The first send after the idle period started that period, at t + t/2.)
        rp.handle_timeout(us(0) + t * 5 / 2);
        let after_period = rp.rate_bps();
        assert!(after_period > after_one);
        rp.on_sent(us(0) + t * 3, 32_768);
        assert!(rp.rate_bps() > after_period);
    }

    #[test]
    fn a_loss_halves_rate_and_target_then_increases_are_additive_only() {
        let cfg = DcqcnConfig {
            loss_backoff: true,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_loss(us(10));
        assert_eq!((rp.rate_bps(), rp.target_bps()), (LINE / 2, LINE / 2));
        assert!(rp.is_limited());
        assert_eq!(rp.stage().phase, Phase::AdditiveIncrease);
        // Within rate_reduce_monitor_period (4 µs) of the cut: ignored.
        rp.on_loss(us(13));
        assert_eq!(rp.rate_bps(), LINE / 2);
        rp.on_loss(us(14));
        assert_eq!((rp.rate_bps(), rp.target_bps()), (LINE / 4, LINE / 4));
        assert_eq!((rp.stats.rp_loss_handled, rp.stats.rp_loss_ignored), (2, 1));
        // Timer events past rpg_threshold would be hyper increase after a CNP; after a loss
        // each adds rpg_ai_rate (5 Mb/s) to the target, and the rate goes half way to it.
        let t = rp.poll_timeout().unwrap();
        assert_eq!(t, us(14) + cfg.time_reset());
        for k in 1..=4u64 {
            rp.handle_timeout(us(14) + cfg.time_reset() * k as u32);
            assert_eq!(rp.target_bps(), LINE / 4 + k * 5_000_000);
        }
        // ⌈(t + r)/2⌉ each event: 2.5e9 + 2.5e6, + 6.25e6, + 10.625e6, + 15.3125e6.
        assert_eq!(rp.rate_bps(), 2_515_312_500);
        // A CNP is DCQCN's own signal: the usual cut and stages from then on.
        rp.on_cnp(us(2_000_000));
        assert_eq!(rp.stage().phase, Phase::FastRecovery);
        // With loss_backoff off (the default) or the RP off, losses are counted and ignored.
        for cfg in [
            quiet(),
            DcqcnConfig {
                rp_enabled: false,
                loss_backoff: true,
                ..quiet()
            },
        ] {
            let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
            rp.on_loss(us(10));
            assert_eq!(rp.rate_bps(), LINE);
            assert!(!rp.is_limited());
            assert_eq!((rp.stats.rp_loss_handled, rp.stats.rp_loss_ignored), (0, 1));
        }
    }

    /// [`ReactionPoint::on_loss_delivered`], values by hand: 10 Gb/s, a replay showing the
    /// receiver took 200 Mb/s over 40 ms: the rate goes to 7/8 of it, 175 Mb/s; one increase per
    /// 40 ms of max(5 Mb/s, 175/16 = 10.9375 Mb/s): target 185.9375 Mb/s, rate
    /// ⌈(185.9375 + 175)/2⌉ = 180.46875 Mb/s; the byte counter adds nothing meanwhile. A second
    /// replay measuring 100 Mb/s cuts no lower than half: 90.234375 Mb/s.
    #[test]
    fn a_measured_loss_cuts_to_the_delivered_rate_and_increases_once_per_feedback_interval() {
        let cfg = DcqcnConfig {
            loss_backoff: true,
            ..DcqcnConfig::default()
        };
        let ms = |v: u64| us(v * 1000);
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_loss_delivered(ms(40), 200_000_000, Duration::from_millis(40));
        assert_eq!((rp.rate_bps(), rp.target_bps()), (175_000_000, 175_000_000));
        assert_eq!(rp.stage().phase, Phase::AdditiveIncrease);
        assert_eq!(rp.poll_timeout(), Some(ms(80)));
        // 1000 frames of 1082 bytes: 33 byte-counter events at 32767 bytes, none counted.
        for _ in 0..1000 {
            rp.on_sent(ms(50), 1082);
        }
        assert_eq!(rp.rate_bps(), 175_000_000);
        rp.handle_timeout(ms(80));
        assert_eq!(rp.target_bps(), 185_937_500);
        assert_eq!(rp.rate_bps(), 180_468_750);
        assert_eq!(rp.poll_timeout(), Some(ms(120)));
        rp.on_loss_delivered(ms(100), 100_000_000, Duration::from_millis(20));
        assert_eq!((rp.rate_bps(), rp.target_bps()), (90_234_375, 90_234_375));
        assert_eq!(rp.poll_timeout(), Some(ms(120)));
        assert_eq!(rp.stats.rp_loss_handled, 2);
        // A CNP: DCQCN's own cut and timers from then on.
        rp.on_cnp(ms(200));
        assert_eq!(rp.loss_period, None);
        assert_eq!(
            rp.timers[Timer::Increase as usize],
            Some(ms(200) + cfg.time_reset())
        );

        // Delivered at or above the rate: halve. The interval is clamped to
        // rpg_time_reset..=LOSS_PERIOD_MAX.
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_loss_delivered(us(10), 20_000_000_000, Duration::from_micros(1));
        assert_eq!(rp.rate_bps(), LINE / 2);
        assert_eq!(rp.poll_timeout(), Some(us(10) + cfg.time_reset()));
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_loss_delivered(us(10), 100_000_000, Duration::from_secs(3));
        assert_eq!(rp.rate_bps(), 87_500_000);
        assert_eq!(rp.poll_timeout(), Some(us(10) + LOSS_PERIOD_MAX));

        // Without loss_backoff: counted and ignored.
        let mut rp = ReactionPoint::new(&DcqcnConfig::default(), LINE, us(0));
        rp.on_loss_delivered(us(10), 100_000_000, Duration::from_millis(40));
        assert_eq!(rp.rate_bps(), LINE);
        assert_eq!((rp.stats.rp_loss_handled, rp.stats.rp_loss_ignored), (0, 1));
    }

    #[test]
    fn starts_unlimited_without_timers() {
        let rp = ReactionPoint::new(&DcqcnConfig::default(), LINE, us(0));
        assert_eq!(rp.rate_bps(), LINE);
        assert_eq!(rp.target_bps(), LINE);
        assert!(!rp.is_limited());
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.next_send_time(us(7), 1_000_000), us(7));
        assert_eq!(rp.stage().phase, Phase::Unlimited);
    }

    #[test]
    fn first_cnp_cuts_by_half_alpha() {
        let mut rp = ReactionPoint::new(&DcqcnConfig::default(), LINE, us(0));
        rp.on_cnp(us(100));
        assert_eq!(rp.rate_bps(), FIRST_CUT);
        assert_eq!(rp.target_bps(), LINE);
        // α = ⌊1023·1019/1024⌋ + 5 = 1018 + 5.
        assert_eq!(rp.alpha_fixed(), 1023);
        assert!(rp.is_limited());
        // Timers: α after dce_tcp_rtt (1 µs), increase after rpg_time_reset (300 µs).
        assert_eq!(rp.poll_timeout(), Some(us(101)));
        assert_eq!(rp.stats().rp_cnp_handled, 1);
        assert_eq!(
            rp.stage(),
            Stage {
                timer: 0,
                bytes: 0,
                phase: Phase::FastRecovery
            }
        );
    }

    #[test]
    fn first_cnp_sets_rate_to_set_on_first_cnp() {
        let cfg = DcqcnConfig {
            rate_to_set_on_first_cnp: 1000,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        assert_eq!(rp.rate_bps(), 1_000_000_000);
        assert_eq!(rp.target_bps(), LINE);
        // The second CNP (after the monitor period) cuts as usual: 1e9 − ⌊1e9·1023/2048⌋.
        rp.on_cnp(us(10));
        assert_eq!(rp.rate_bps(), 500_488_282);
        assert_eq!(rp.target_bps(), 1_000_000_000);
    }

    #[test]
    fn alpha_decays_without_cnps_and_late_calls_catch_up() {
        let cfg = DcqcnConfig {
            dce_tcp_rtt: 55,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        let mut late = rp.clone();
        let want = [1018, 1013, 1008, 1003, 998, 993];
        for (k, a) in (1u64..).zip(want) {
            assert_eq!(rp.poll_timeout(), Some(us(55 * k)));
            rp.handle_timeout(us(55 * k) + Duration::from_nanos(0));
            assert_eq!(rp.alpha_fixed(), a, "after {k} periods");
        }
        // One call 6 periods late gives the same α.
        late.handle_timeout(us(55 * 6 + 54));
        assert_eq!(late.alpha_fixed(), 993);
        assert_eq!(late.poll_timeout(), Some(us(55 * 7)));
        // Spurious calls do nothing; α does not touch the rate.
        rp.handle_timeout(us(330));
        assert_eq!(rp.alpha_fixed(), 993);
        assert_eq!(rp.rate_bps(), FIRST_CUT);
    }

    #[test]
    fn alpha_timer_stops_at_zero() {
        let cfg = DcqcnConfig {
            dce_tcp_g: 0, // α ← 0 at the first tick
            dce_tcp_rtt: 10,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        // With g = 0 a CNP sets α = min(0 + 1024, 1023).
        assert_eq!(rp.alpha_fixed(), 1023);
        rp.handle_timeout(us(10));
        assert_eq!(rp.alpha_fixed(), 0);
        // Only the increase timer is left.
        assert_eq!(rp.poll_timeout(), Some(us(131_071)));
    }

    #[test]
    fn timer_drives_fast_recovery_then_additive_then_hyper() {
        // F = 2, byte counter off: T = 1, 2 fast recovery; 3 additive; 4.. hyper.
        let cfg = DcqcnConfig {
            rpg_threshold: 2,
            rpg_time_reset: 55,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        rp.on_cnp(us(10));
        // target = 5_004_882_813, rate = 5_004_882_813 − ⌊5_004_882_813·1023/2048⌋.
        assert_eq!(rp.target_bps(), FIRST_CUT);
        assert_eq!(rp.rate_bps(), 2_504_885_197);
        assert_eq!(rp.stats().rp_cnp_handled, 2);
        let want = [
            (Phase::FastRecovery, 3_754_884_005, 5_004_882_813),
            (Phase::FastRecovery, 4_379_883_409, 5_004_882_813),
            (Phase::AdditiveIncrease, 4_694_883_111, 5_009_882_813),
            (Phase::HyperIncrease, 4_877_382_962, 5_059_882_813),
            (Phase::HyperIncrease, 5_018_632_888, 5_159_882_813),
            (Phase::HyperIncrease, 5_164_257_851, 5_309_882_813),
        ];
        for (k, (phase, rate, target)) in (1u64..).zip(want) {
            let at = us(10 + 55 * k);
            assert_eq!(rp.poll_timeout(), Some(at));
            rp.handle_timeout(at);
            assert_eq!(
                (rp.stage().phase, rp.rate_bps(), rp.target_bps()),
                (phase, rate, target),
                "T = {k}"
            );
            assert_eq!(rp.stage().timer, k as u32);
        }
    }

    #[test]
    fn byte_counter_drives_increases() {
        let cfg = DcqcnConfig {
            rpg_byte_reset: 10_000,
            rpg_threshold: 1,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        rp.on_sent(us(1), 9_999);
        assert_eq!(rp.rate_bps(), FIRST_CUT, "one byte short of the counter");
        rp.on_sent(us(2), 1);
        // BC = 1, T = 0: fast recovery, ⌈(10e9 + 5_004_882_813)/2⌉.
        assert_eq!(rp.rate_bps(), 7_502_441_407);
        assert_eq!(rp.stage().phase, Phase::FastRecovery);
        // 25 000 bytes: two more events (BC = 2, 3: additive, target clamped at line rate),
        // 5 000 bytes carried over.
        rp.on_sent(us(3), 25_000);
        assert_eq!(rp.rate_bps(), 9_375_610_352);
        assert_eq!(rp.target_bps(), LINE);
        assert_eq!(rp.stage().bytes, 3);
        assert_eq!(rp.stage().phase, Phase::AdditiveIncrease);
        rp.on_sent(us(4), 5_000);
        assert_eq!(rp.rate_bps(), 9_687_805_176);
        assert_eq!(rp.bytes_sent(), 9_999 + 1 + 25_000 + 5_000);
    }

    #[test]
    fn one_send_applies_at_most_64_byte_counter_events() {
        let cfg = DcqcnConfig {
            rpg_byte_reset: 1,
            rpg_threshold: 1,
            ..quiet()
        };
        let line = 400_000_000_000;
        let mut rp = ReactionPoint::new(&cfg, line, us(0));
        rp.on_cnp(us(0));
        rp.on_cnp(us(10));
        // target = 400e9 − ⌊400e9·1023/2048⌋ = 200_195_312_500 after the second cut.
        assert_eq!(rp.target_bps(), 200_195_312_500);
        rp.on_sent(us(11), 4096);
        // 64 events: one fast recovery (BC = 1), then 63 additive increases of 5 Mb/s.
        assert_eq!(rp.stage().bytes, 64);
        assert_eq!(rp.target_bps(), 200_510_312_500);
    }

    #[test]
    fn recovers_to_line_rate_and_stops_its_timers() {
        let cfg = DcqcnConfig {
            rpg_time_reset: 10,
            rpg_threshold: 1,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        // ⌈(L + r)/2⌉ halves the gap each event: 5e9 → 2.5e9 → ... → 0 in at most 33 events.
        let mut t = 0;
        while rp.is_limited() {
            t += 10;
            rp.handle_timeout(us(t));
            assert!(t <= 340, "never recovered");
        }
        assert_eq!(rp.rate_bps(), LINE);
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.stage().phase, Phase::Unlimited);
        // A later CNP starts over from initial_alpha_value.
        rp.on_cnp(us(1000));
        assert_eq!(rp.rate_bps(), FIRST_CUT);
    }

    #[test]
    fn min_rate_and_min_dec_fac_floor_the_cut() {
        // gd 10: the cut is rate·α (almost all of it); min_dec_fac 50 keeps half.
        let cfg = DcqcnConfig {
            rpg_gd: 10,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        assert_eq!(rp.rate_bps(), 5_000_000_000);
        // min_dec_fac 1 lets it fall to rpg_min_rate (1 Mb/s) and no further.
        let cfg = DcqcnConfig {
            rpg_gd: 10,
            rpg_min_dec_fac: 1,
            ..quiet()
        };
        let mut rp = ReactionPoint::new(&cfg, 10_000_000, us(0));
        for k in 0..5 {
            rp.on_cnp(us(10 * k));
            assert_eq!(rp.rate_bps(), 1_000_000, "CNP {k}");
        }
        assert_eq!(rp.stats().rp_cnp_handled, 5);
    }

    #[test]
    fn monitor_period_allows_one_cut_per_period() {
        let mut rp = ReactionPoint::new(&quiet(), LINE, us(0));
        rp.on_cnp(us(0));
        rp.on_cnp(us(2));
        rp.on_cnp(Instant::from_nanos(3_999));
        assert_eq!(rp.rate_bps(), FIRST_CUT);
        rp.on_cnp(us(4));
        // 5_004_882_813 − ⌊5_004_882_813·1023/2048⌋
        assert_eq!(rp.rate_bps(), 2_504_885_197);
        rp.on_cnp(us(5));
        let s = rp.stats();
        assert_eq!((s.rp_cnp_handled, s.rp_cnp_ignored), (2, 3));
        assert_eq!(rp.cnps(), 5);
    }

    #[test]
    fn disabled_never_limits() {
        let cfg = DcqcnConfig {
            rp_enabled: false,
            ..DcqcnConfig::default()
        };
        let mut rp = ReactionPoint::new(&cfg, LINE, us(0));
        rp.on_cnp(us(0));
        rp.on_sent(us(0), 1_000_000);
        assert_eq!(rp.rate_bps(), LINE);
        assert_eq!(rp.next_send_time(us(0), 1_000_000), us(0));
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.stats().rp_cnp_ignored, 1);
    }

    #[test]
    fn paces_at_the_current_rate() {
        // 1 Gb/s after the first CNP: a 1000 B packet is 8 µs of tokens; burst 1000 B.
        let cfg = DcqcnConfig {
            rate_to_set_on_first_cnp: 1000,
            ..quiet()
        };
        let mut rp = ReactionPoint::with_burst(&cfg, LINE, us(0), 1000);
        rp.on_cnp(us(0));
        assert_eq!(rp.next_send_time(us(0), 1000), us(0));
        rp.on_sent(us(0), 1000);
        assert_eq!(rp.next_send_time(us(0), 1000), us(8));
        assert_eq!(rp.next_send_time(us(2), 500), us(4));
        let mut t = us(8);
        for _ in 0..100 {
            t = rp.next_send_time(t, 1000);
            rp.on_sent(t, 1000);
        }
        // 100 more packets at 8 µs each.
        assert_eq!(t, us(8 + 99 * 8));
    }
}
