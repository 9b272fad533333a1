//! Congestion control wired into the transport: ECN on data, CNPs out, CNPs in, pacing.
//!
//! # Design
//! Every RC QP of a [`Device`] carries one [`QpCc`] (`Qp::cc`, boxed so that the QP's fixed
//! state stays small): a [`QpCongestion`] (DCQCN notification point and reaction point of
//! `crate::cc`) plus what the device needs around it, the QP's own [`DcqcnConfig`], the CNPs
//! due and the pacing wake-up. The device calls it at five points and nowhere else:
//! - [`Device::handle_decoded`]: a CNP (opcode 0x81) addressed to one of our RC QPs from its
//!   peer goes to the reaction point ([`QpCongestion::on_cnp_received`]); every other packet
//!   accepted by an RC QP goes to the notification point, which may decide a CNP to the peer's
//!   QP (at most one per QP per `min_time_between_cnps`);
//! - [`Device::poll_transmit`]: due CNPs leave first; then the QP's packets, data only when
//!   the reaction point's token bucket allows a frame of the QP's largest size (ACKs and NAKs
//!   are never held back, but they use tokens); each frame leaves with the configured ECN
//!   codepoint (ECT(0) by default; Not-ECT when the reaction point is off, RFC 3168) and DSCP,
//!   and is reported to the reaction point ([`QpCongestion::on_sent`]);
//! - [`Device::poll_timeout`] / [`Device::handle_timeout`]: the DCQCN timers (α, rate
//!   increase) and the moment the pacer will let the next data packet go.
//!
//! The transport's only change for this is a `data_ok` flag on the QP's `poll_transmit`
//! (transport/qp.rs): when false it returns control packets only.
//!
//! With [`CcAlgorithm::Swift`] ([`CcConfig::swift`], `--cc swift`) the DCQCN reaction point
//! is off and the QP also carries a [`Swift`] window and an [`RttSampler`]; the requester
//! reports each new request packet (`Qp::cc_on_request_sent`), each go back N
//! (`Qp::cc_on_go_back`, Karn's rule) and each retry (`Qp::cc_on_retry`), the completer each
//! acknowledged PSN (`Qp::cc_on_ack`, the RTT sample), and the requester sends no new PSN
//! while `Qp::cc_window` PSNs are unacknowledged (asking for an ACK every half window).
//!
//! With `loss_backoff` ([`DcqcnConfig::loss_backoff`]) a READ responder's QP also keeps an
//! ACK clock for its responses (`ReadClock`): `Qp::poll_transmit` sends an ACK-eliciting
//! probe after every few responses and holds the responses while a window of them is past
//! the newest probe the peer answered; the completer hands it the peer's ACKs
//! (`Qp::cc_on_peer_ack`).
//!
//! Time: the transport and `cc` share the core's one clock, [`crate::time::Instant`].

use super::{Device, DeviceError, Instant, Path, Qp, QpType, Qpn};
use crate::{
    cc::{
        CcAlgorithm, CcSnapshot, CcStats, ConfigError, DcqcnConfig, LossUndo, QpCongestion,
        RttSampler, Swift, SwiftConfig, SwiftUndo,
    },
    wire::{
        Ecn, IpPath, Psn, RoceRepr, emit_frame,
        multipath::{Entropy, PathFeedback},
    },
};
use roce_common::multipath::{RESV7_OFFER, RESV7_TRAILER};

/// How late a DCQCN timer may be served (see `QpCc::poll_timeout`).
pub const CC_TIMER_GRANULARITY: core::time::Duration = core::time::Duration::from_micros(50);

/// Congestion-control settings of a device, applied to every RC QP it creates
/// (part of [`super::DeviceConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcConfig {
    /// DCQCN parameters under their mlx5 names; `rp_enabled` and `np_enabled` both false turn
    /// congestion control off ([`CcConfig::off`]).
    pub dcqcn: DcqcnConfig,
    /// The rate a QP sends at while not limited, bits/s (the port speed).
    pub line_rate_bps: u64,
    /// The ECN codepoint of data packets while the reaction point is on: ECT(0) (default, as
    /// mlx5 sends) or ECT(1). Not-ECT or CE here means Not-ECT.
    pub data_ecn: Ecn,
    /// DSCP of every packet a QP sends except CNPs (whose DSCP is `dcqcn.cnp_dscp`); `None`
    /// keeps the DSCP of the QP's address vector.
    pub data_dscp: Option<u8>,
    /// What limits a QP's sending: DCQCN (default; `dcqcn.rp_enabled` false turns its
    /// reaction point off), Swift (the DCQCN reaction point is then off and data leaves
    /// Not-ECT; the notification point still answers a peer's marked packets with CNPs as
    /// `dcqcn.np_enabled` says), or nothing ([`CcAlgorithm::Off`] as [`CcConfig::off`]).
    pub algorithm: CcAlgorithm,
    /// Swift's parameters, used when `algorithm` is [`CcAlgorithm::Swift`].
    pub swift: SwiftConfig,
}

impl Default for CcConfig {
    fn default() -> Self {
        Self {
            dcqcn: DcqcnConfig::default(),
            line_rate_bps: 10_000_000_000,
            data_ecn: Ecn::Ect0,
            data_dscp: None,
            algorithm: CcAlgorithm::Dcqcn,
            swift: SwiftConfig::default(),
        }
    }
}

impl CcConfig {
    /// Congestion control off: no ECT on data, no CNPs, no rate limit.
    #[must_use]
    pub fn off() -> Self {
        Self {
            dcqcn: DcqcnConfig {
                rp_enabled: false,
                np_enabled: false,
                ..DcqcnConfig::default()
            },
            algorithm: CcAlgorithm::Off,
            ..Self::default()
        }
    }

    /// Swift on every QP ([`crate::cc::Swift`]): no DCQCN reaction point, data Not-ECT, the
    /// notification point on (a DCQCN peer still gets its CNPs).
    #[must_use]
    pub fn swift() -> Self {
        let mut c = Self::default();
        c.set_algorithm(CcAlgorithm::Swift);
        c
    }

    /// Switches to `algorithm`: `Dcqcn` turns the reaction point and the notification point
    /// on, `Swift` the reaction point off (and the notification point on), `Off` both off.
    /// Other settings stay.
    pub fn set_algorithm(&mut self, algorithm: CcAlgorithm) {
        self.algorithm = algorithm;
        let (rp, np) = match algorithm {
            CcAlgorithm::Dcqcn => (true, true),
            CcAlgorithm::Swift => (false, true),
            CcAlgorithm::Off => (false, false),
        };
        self.dcqcn.rp_enabled = rp;
        self.dcqcn.np_enabled = np;
    }

    /// Sets one parameter by name: a numeric DCQCN parameter ([`DcqcnConfig::NAMES`]), a
    /// Swift parameter ([`SwiftConfig::NAMES`], `swift_*`), or
    /// `rp_enabled` / `np_enabled` / `loss_backoff` / `hold_when_idle` (0 or 1), or `enabled`
    /// (0 or 1: RP and NP).
    ///
    /// # Errors
    /// [`ConfigError`] for an unknown name or a value out of range.
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), ConfigError> {
        let flag = |v: u64| {
            if v <= 1 {
                Ok(v == 1)
            } else {
                Err(ConfigError {
                    name: match name {
                        "rp_enabled" => "rp_enabled",
                        "np_enabled" => "np_enabled",
                        "loss_backoff" => "loss_backoff",
                        "hold_when_idle" => "hold_when_idle",
                        _ => "enabled",
                    },
                    value: v,
                    min: 0,
                    max: 1,
                    unit: "flag",
                })
            }
        };
        match name {
            "rp_enabled" => self.dcqcn.rp_enabled = flag(value)?,
            "np_enabled" => self.dcqcn.np_enabled = flag(value)?,
            "loss_backoff" => self.dcqcn.loss_backoff = flag(value)?,
            "hold_when_idle" => self.dcqcn.hold_when_idle = flag(value)?,
            "enabled" => {
                let on = flag(value)?;
                self.dcqcn.rp_enabled = on;
                self.dcqcn.np_enabled = on;
            }
            _ if name.starts_with("swift_") => self.swift.set(name, value)?,
            _ => self.dcqcn.set(name, value)?,
        }
        Ok(())
    }

    /// The settings a user chose by name: `algorithm` ([`CcConfig::set_algorithm`]), the DCQCN
    /// defaults of `profile` ([`DcqcnConfig::PROFILES`]: `mlx5` or `software`), then each
    /// `NAME=VALUE` of `pairs` in order ([`CcConfig::set_pair`]); the rest is
    /// [`CcConfig::default`]. Call once per device, with what `roce perf --cc --cc-profile
    /// --cc-set` or the drop-in library's `ROCE_CC`, `ROCE_CC_PROFILE` and `ROCE_CC_SET` say.
    ///
    /// # Errors
    /// [`CcSetError::Profile`] for an unknown profile, or the first pair that cannot be applied.
    pub fn choose<'a>(
        algorithm: CcAlgorithm,
        profile: &str,
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, CcSetError> {
        let unknown = || CcSetError::Profile(profile.to_owned());
        let mut c = Self {
            dcqcn: DcqcnConfig::profile(profile).ok_or_else(unknown)?,
            swift: SwiftConfig::profile(profile).ok_or_else(unknown)?,
            ..Self::default()
        };
        c.set_algorithm(algorithm);
        for pair in pairs {
            c.set_pair(pair)?;
        }
        Ok(c)
    }

    /// Sets one parameter from its `NAME=VALUE` text, as `roce perf --cc-set`, `roce exec
    /// --cc-set` and the drop-in library's `ROCE_CC_SET` give it; see [`CcConfig::set`].
    ///
    /// # Errors
    /// [`CcSetError`] naming the text that is not a pair, not a number, or not a parameter in
    /// range.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), CcSetError> {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CcSetError::NotPair(pair.to_owned()))?;
        let v: u64 = v
            .trim()
            .parse()
            .map_err(|_| CcSetError::NotNumber(pair.to_owned()))?;
        self.set(k.trim(), v).map_err(|reason| CcSetError::Param {
            pair: pair.to_owned(),
            reason,
        })
    }
}

/// A `NAME=VALUE` congestion-control setting that cannot be applied ([`CcConfig::set_pair`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CcSetError {
    /// No `=` in the text.
    #[error("{0:?} is not NAME=VALUE")]
    NotPair(String),
    /// The value is not a whole number.
    #[error("{0:?}: the value is not a number")]
    NotNumber(String),
    /// No DCQCN profile of that name ([`DcqcnConfig::PROFILES`]).
    #[error("no congestion-control profile {0:?} (mlx5 or software)")]
    Profile(String),
    /// An unknown name or a value out of range.
    #[error("{pair:?}: {reason}")]
    Param {
        /// The text given.
        pair: String,
        /// What is wrong with it (in the message itself, so that callers printing only this
        /// error, as the drop-in library does, say why).
        reason: ConfigError,
    },
}

/// The congestion state the device keeps for one RC QP.
#[derive(Debug, Clone)]
pub struct QpCc {
    config: CcConfig,
    cc: QpCongestion,
    /// The CNP to send (all CNPs of a QP are the same frame) and how many are due.
    cnp: Option<(Path, RoceRepr)>,
    cnps_due: u32,
    /// When the pacer lets the next data packet go, while it holds one back.
    wake: Option<Instant>,
    /// Counters of the DCQCN states replaced by [`Device::set_cc_param`].
    carried: CcStats,
    /// Swift's window and RTT samples, when the QP runs Swift.
    swift: Option<SwiftState>,
    /// The READ responses of the current episode: when and from which PSN the responder
    /// began sending them (the first response, the first after a pause of [`EPISODE_IDLE`],
    /// or the replay after the last loss), and the latest PSN it has sent since
    /// ([`Qp::cc_on_replay`]).
    resp_epoch: Option<RespEpoch>,
    /// The ACK clock of the QP's READ responses, with `loss_backoff` ([`ReadClock`]).
    clock: ReadClock,
    /// What the last retransmission timeout's cuts changed, while the timeout may still prove
    /// spurious ([`Qp::cc_undo_timeout`]).
    timeout_undo: TimeoutUndo,
}

/// See [`QpCc::timeout_undo`]: the DCQCN rate cut and the Swift window cut of a
/// retransmission timeout, each `None` when the timeout made none.
#[derive(Debug, Clone, Copy, Default)]
struct TimeoutUndo {
    rate: Option<LossUndo>,
    window: Option<SwiftUndo>,
}

/// See [`QpCc::resp_epoch`].
#[derive(Debug, Clone, Copy)]
struct RespEpoch {
    start: Instant,
    first: Psn,
    latest: Psn,
    /// When the latest READ response left.
    last_sent: Instant,
}

/// A pause in READ responses after which the next starts a new episode
/// ([`Qp::cc_on_read_response`]): long enough for what was sent before it to have drained
/// from any queue on the way.
const EPISODE_IDLE: core::time::Duration = core::time::Duration::from_millis(500);

/// Fewest READ responses the requester must have taken in order before a gap for the rate
/// it took them at to count ([`Qp::cc_on_replay`]): fewer say more about timing than rate.
const EPISODE_MIN_PSNS: u64 = 16;

/// Bytes a READ response frame carries besides its payload, over IPv4 without AETH (MIDDLE):
/// Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4.
const READ_RESPONSE_OVERHEAD: u64 = (crate::wire::ethernet::HEADER_LEN
    + crate::wire::ipv4::HEADER_LEN
    + crate::wire::udp::HEADER_LEN
    + crate::wire::bth::HEADER_LEN
    + roce_common::hdr::ICRC_LEN) as u64;

/// What a QP running Swift keeps.
#[derive(Debug, Clone)]
struct SwiftState {
    swift: Swift,
    rtt: RttSampler,
    /// The largest frame the QP sent (for the rate `roce stats` and traces show).
    frame: u32,
}

/// READ responses between two ACK-eliciting probes ([`ReadClock`]) at the full window; an
/// eighth of the window, at least 4, below it.
pub(crate) const PROBE_EVERY: u32 = 32;

/// The window of a READ responder ([`ReadClock`]), in response frames past the newest
/// answered probe, at its start and at most: eight probes' worth. Four QPs stay within a
/// 1000-frame queue (a tap's default `txqueuelen`), and one covers a round trip of 100 µs
/// at 80 Gb/s with 4 KiB frames, or the 8 ms of the answers of Dec 6's TCG guest at its
/// 23 MB/s. 128 held one QP's READs 7 % under what the guest took.
pub(crate) const PROBE_WINDOW: u64 = 8 * PROBE_EVERY as u64;

/// The smallest window ([`ReadClock`]).
const WINDOW_MIN: u64 = 8;

/// How long a probe may go unanswered before it counts as lost ([`ReadClock`]): longer than
/// a full 1000-frame queue takes to drain into a slow software peer (40 ms into Dec 6's TCG
/// guest). Fixed, as TCP's least retransmission timeout is: the answers of a software peer
/// vary too much for an estimate from them (1.5 to 29 ms from that guest, where an RFC 6298
/// timeout fired early, halved the window and held one QP's READs to half of rxe's speed).
pub(crate) const PROBE_TIMEOUT: core::time::Duration = core::time::Duration::from_millis(100);

/// Probe timeouts' worth of silence (no answer to any probe) after which a peer that
/// answered probes before counts as no longer answering them ([`ReadClock`]).
const SILENT_OFF: u32 = 3;

/// Most probes unanswered at once.
const PROBES_MAX: usize = 16;

/// An ACK clock for READ responses, which the requester never acknowledges (with
/// `loss_backoff`). The responder's QP sends an ACK-eliciting probe after every
/// [`PROBE_EVERY`] responses (fewer under a smaller window): a zero-length RDMA WRITE ONLY
/// duplicating the last PSN its peer has acknowledged. IBA Vol. 1 C9-105 has the peer's
/// responder acknowledge a duplicate without executing it (rxe `duplicate_request`), and the
/// answer can only leave after the probe arrived, behind the responses sent before it: it
/// says they left every queue on the way. At most a window of response frames goes past the
/// newest answered probe, so a burst of READs (perftest posts all of them at once) is
/// clocked by the receiver from its first frame, before any loss could tell.
///
/// The window starts at [`PROBE_WINDOW`], its most. A loss halves it (a probe unanswered
/// for [`PROBE_TIMEOUT`] that left after the last cut, or a replayed READ), down to
/// [`WINDOW_MIN`], and each answer grows it back by one probe's spacing per window (TCP's
/// congestion avoidance, RFC 5681).
/// A window that followed the probes' round trips instead (TCP Vegas' rule, growing while
/// they stayed within twice the smallest) held one QP's READs to 0.58x of rxe ↔ rxe against
/// Dec 6's TCG guest, whose answers vary twentyfold with nothing queued.
///
/// The answers all look alike (the peer acknowledges its last PSN each time), so they are
/// matched to the probes in order; a probe unanswered for [`PROBE_TIMEOUT`] counts as lost
/// and frees the window behind it. A peer that answers no probe at all (the first times
/// out), or stops answering (none for [`SILENT_OFF`] timeouts), turns the clock off for
/// the QP.
#[derive(Debug, Clone)]
struct ReadClock {
    /// READ response frames sent.
    sent: u64,
    /// Frames known to have left the way to the requester: `sent` when the newest answered
    /// (or expired) probe left.
    taken: u64,
    /// Frames sent since the last probe.
    since_probe: u32,
    /// The window, in frames.
    window: u64,
    /// The probes not yet answered, oldest first: `sent` when each left, and when.
    probes: std::collections::VecDeque<(u64, Instant)>,
    /// When the first probe expired since the last answer.
    silent_since: Option<Instant>,
    /// `sent` when the window was last halved: a lost probe sent before it is part of the
    /// loss that cut it (TCP halves once per window, RFC 5681).
    cut_at: u64,
    /// The peer answers no probes: no more, and no window.
    off: bool,
    /// Counters (`rp_probe_sent`, `rp_probe_answered`, `rp_probe_lost`).
    probes_sent: u64,
    probes_answered: u64,
    probes_lost: u64,
}

impl Default for ReadClock {
    fn default() -> Self {
        Self {
            sent: 0,
            taken: 0,
            since_probe: 0,
            window: PROBE_WINDOW,
            probes: std::collections::VecDeque::new(),
            silent_since: None,
            cut_at: 0,
            off: false,
            probes_sent: 0,
            probes_answered: 0,
            probes_lost: 0,
        }
    }
}

impl ReadClock {
    /// Responses between two probes at the current window.
    fn spacing(&self) -> u32 {
        u32::try_from(self.window / 8)
            .unwrap_or(PROBE_EVERY)
            .clamp(4, PROBE_EVERY)
    }

    /// Whether a probe is due (and may be sent: `Qp::can_probe`).
    fn probe_due(&self) -> bool {
        !self.off && self.since_probe >= self.spacing() && self.probes.len() < PROBES_MAX
    }

    fn on_probe_sent(&mut self, now: Instant) {
        self.probes_sent += 1;
        self.since_probe = 0;
        self.probes.push_back((self.sent, now));
    }

    fn on_response(&mut self) {
        self.sent += 1;
        self.since_probe = self.since_probe.saturating_add(1);
    }

    /// One probe's spacing per window: `spacing² / window` per answer.
    fn step(&self) -> u64 {
        let s = u64::from(self.spacing());
        (s * s / self.window).max(1)
    }

    /// An acknowledgement from the peer's responder: the oldest probe is answered.
    /// Returns whether one was waiting.
    fn on_ack(&mut self) -> bool {
        let Some((at, _)) = self.probes.pop_front() else {
            return false;
        };
        self.taken = self.taken.max(at);
        self.probes_answered += 1;
        self.silent_since = None;
        self.window = (self.window + self.step()).min(PROBE_WINDOW);
        true
    }

    /// A loss: the window halves.
    fn on_loss(&mut self) {
        self.window = (self.window / 2).max(WINDOW_MIN);
        self.cut_at = self.sent;
    }

    /// Expires (and counts as lost) the probes unanswered for [`PROBE_TIMEOUT`]. Call before
    /// asking [`Self::window_open`] and at the QP's timeout.
    fn expire(&mut self, now: Instant) {
        let mut newest = None;
        while let Some(&(at, t)) = self.probes.front()
            && now.saturating_duration_since(t) >= PROBE_TIMEOUT
        {
            self.probes.pop_front();
            self.probes_lost += 1;
            newest = Some(at);
            self.taken = self.taken.max(at);
        }
        let Some(at) = newest else {
            return;
        };
        let since = *self.silent_since.get_or_insert(now);
        if self.probes_answered == 0
            || now.saturating_duration_since(since) >= PROBE_TIMEOUT * (SILENT_OFF - 1)
        {
            // The peer does not answer duplicates, or no longer does (or the path drops
            // them): no clock.
            self.off = true;
            self.probes.clear();
            self.taken = self.sent;
        } else if at > self.cut_at {
            self.on_loss();
        }
    }

    /// Whether another response frame may go: fewer than a window past the newest answered
    /// probe.
    fn window_open(&self) -> bool {
        self.off || self.sent - self.taken < self.window
    }

    fn deadline(&self) -> Option<Instant> {
        self.probes.front().map(|&(_, t)| t + PROBE_TIMEOUT)
    }
}

impl QpCc {
    /// Fresh state with `config` (validated by the caller).
    #[must_use]
    pub fn new(config: &CcConfig) -> Self {
        Self {
            config: *config,
            cc: QpCongestion::new(&config.dcqcn, config.line_rate_bps, Instant::ZERO),
            cnp: None,
            cnps_due: 0,
            wake: None,
            carried: CcStats::default(),
            resp_epoch: None,
            clock: ReadClock::default(),
            timeout_undo: TimeoutUndo::default(),
            swift: (config.algorithm == CcAlgorithm::Swift).then(|| SwiftState {
                swift: Swift::new(&config.swift),
                rtt: RttSampler::new(),
                frame: 0,
            }),
        }
    }

    /// Swift's state, when the QP runs Swift.
    #[must_use]
    pub fn swift(&self) -> Option<&Swift> {
        self.swift.as_ref().map(|s| &s.swift)
    }

    /// The DCQCN state (its counters start again at each [`Device::set_cc_param`]; see
    /// [`Self::stats`] and [`Self::snapshot`]).
    #[must_use]
    pub const fn congestion(&self) -> &QpCongestion {
        &self.cc
    }

    /// The counters since the QP was created.
    #[must_use]
    pub fn stats(&self) -> CcStats {
        let mut s = self.algorithm_stats();
        s.rp_probe_sent += self.clock.probes_sent;
        s.rp_probe_answered += self.clock.probes_answered;
        s.rp_probe_lost += self.clock.probes_lost;
        s
    }

    /// The counters of the algorithms' states since the QP was created: [`Self::stats`] but
    /// the READ clock's, which a new state ([`Device::set_cc_param`]) takes over with the clock.
    fn algorithm_stats(&self) -> CcStats {
        let mut s = self.carried;
        s.add(&self.cc.stats());
        if let Some(w) = &self.swift {
            s.add(&w.swift.stats());
            s.swift_rtt_skipped += w.rtt.skipped();
        }
        s
    }

    /// Rate, target, α, stage and counters (since the QP was created).
    #[must_use]
    pub fn snapshot(&self) -> CcSnapshot {
        let mut s = self.cc.snapshot();
        s.stats = self.stats();
        s.algorithm = self.config.algorithm;
        if let Some(w) = &self.swift {
            // Swift's window as a rate, for `roce stats` and traces: the rate the window
            // gives at the last RTT (rate) and at the target delay (target), both capped at the
            // line rate; before the first RTT sample, the line rate.
            let line = self.config.line_rate_bps;
            let frame = f64::from(w.frame.max(1)) * 8.0 * 1e9;
            let at = |rtt_ns: f64| ((w.swift.cwnd() * frame / rtt_ns.max(1.0)) as u64).min(line);
            s.cwnd = Some(w.swift.cwnd());
            s.rtt_ns = w.swift.rtt().map(|r| r.as_nanos() as u64);
            s.rate_bps = s.rtt_ns.map_or(line, |r| at(r as f64));
            s.target_bps = at(w.swift.target_delay().as_nanos() as f64);
            s.limited = s.rate_bps < line;
            s.bytes = w.swift.bytes_sent();
        }
        s
    }

    /// The settings of this QP.
    #[must_use]
    pub const fn config(&self) -> &CcConfig {
        &self.config
    }

    fn on_cnp(&mut self, now: Instant) {
        self.cc.on_cnp_received(now);
    }

    fn on_loss(&mut self, now: Instant) {
        self.cc.on_loss(now);
    }

    /// The READ response `psn` left at `now`: see [`Qp::cc_on_read_response`].
    fn on_read_response(&mut self, now: Instant, psn: Psn) {
        let fresh = RespEpoch {
            start: now,
            first: psn,
            latest: psn,
            last_sent: now,
        };
        let e = self.resp_epoch.get_or_insert(fresh);
        if now.saturating_duration_since(e.last_sent) > EPISODE_IDLE {
            *e = fresh;
        }
        e.last_sent = now;
        if psn.distance(e.latest) > 0 {
            e.latest = psn;
        }
        self.clock.on_response();
    }

    /// Whether the READ responses' ACK clock wants a probe now ([`ReadClock`]).
    fn probe_due(&self) -> bool {
        self.config.dcqcn.loss_backoff && self.clock.probe_due()
    }

    /// Whether the next READ response may leave: the clock's window is open, or the clock is
    /// off (no `loss_backoff`, a peer that answers no probe) or cannot run now (`can_probe`
    /// false: the QP's requester has requests unacknowledged, whose ACKs the probes' would be
    /// mixed with, or the QP cannot send requests). Expires overdue probes first.
    fn responses_ok(&mut self, now: Instant, can_probe: bool) -> bool {
        self.clock.expire(now);
        !self.config.dcqcn.loss_backoff || !can_probe || self.clock.window_open()
    }

    /// A READ replayed from `psn` (the requester's first gap), its responses going again from
    /// `from`, on a path MTU of `mtu` bytes: see [`Qp::cc_on_replay`].
    fn on_replay(&mut self, now: Instant, psn: Psn, from: Psn, mtu: u32) {
        if self
            .resp_epoch
            .is_some_and(|e| psn.distance(e.first) >= 0 && psn.distance(e.latest) > 0)
        {
            // A PSN not sent again yet in this episode: the requester's go-back-N asking again
            // for the READs after the one it is missing, in the batch that started the episode
            // (rxe retries every request from its first gap). One loss, already counted.
            return;
        }
        self.clock.on_loss();
        let measured = self.resp_epoch.and_then(|e| {
            let n = u64::try_from(psn.distance(e.first)).ok()?;
            let took = now.saturating_duration_since(e.start);
            (n >= EPISODE_MIN_PSNS && !took.is_zero()).then_some((n, took))
        });
        match measured {
            Some((n, took)) => {
                let frame = u64::from(mtu) + READ_RESPONSE_OVERHEAD;
                let bits = u128::from(n * frame) * 8 * 1_000_000_000;
                let bps = u64::try_from(bits / took.as_nanos().max(1)).unwrap_or(u64::MAX);
                self.cc.on_loss_delivered(now, bps, took);
            }
            // A READ replay's cut keeps no undo record: only ACKs prove a timeout spurious
            // (`Qp::check_replayed`).
            None => {
                let _ = self.cc.on_loss(now);
            }
        }
        self.resp_epoch = Some(RespEpoch {
            start: now,
            first: from,
            latest: from.wrapping_sub(1),
            last_sent: now,
        });
    }

    /// `feedback`: the entropy of the packet, when the QP's multipath extension is on (the CNP
    /// it causes then names it, so the peer can retire that path).
    fn on_packet(
        &mut self,
        now: Instant,
        ce: bool,
        path: Option<&Path>,
        peer: Qpn,
        feedback: Option<Entropy>,
    ) {
        let ecn = if ce { Ecn::Ce } else { Ecn::NotEct };
        let Some(path) = path else {
            // No address vector (not yet RTR): the mark is counted by the transport; there is
            // nowhere to send a CNP.
            return;
        };
        if let Some(mut cnp) = self.cc.on_data_received(now, ecn, path, peer) {
            if let (Some(e), Some(c)) = (feedback, cnp.1.cnp.as_mut()) {
                c.reserved = PathFeedback { entropy: e }.reserved();
                cnp.1.bth.resv7 = RESV7_OFFER | RESV7_TRAILER;
            }
            self.cnp = Some(cnp);
            self.cnps_due = self.cnps_due.saturating_add(1);
        }
    }

    /// Writes a due CNP into `buf`; `Err(())` if it could not be emitted (counted by the caller).
    fn emit_cnp(&mut self, buf: &mut [u8]) -> Option<Result<usize, ()>> {
        if self.cnps_due == 0 {
            return None;
        }
        let (path, roce) = self.cnp.as_ref()?;
        self.cnps_due -= 1;
        Some(emit_frame(path, roce, &[], buf).map_err(|_| ()))
    }

    /// Whether a data frame of up to `max_frame` bytes may leave at `now`; if not, remembers
    /// when it may.
    fn data_ok(&mut self, now: Instant, max_frame: u32) -> bool {
        let mut at = self.cc.next_send_time(now, max_frame);
        if at > now {
            self.cc.on_paced(max_frame);
        }
        if let Some(w) = &self.swift {
            at = at.max(w.swift.next_send_time(now));
        }
        if at <= now {
            self.wake = None;
            true
        } else {
            self.wake = Some(at);
            false
        }
    }

    /// ECN and DSCP of the frames this QP sends.
    fn apply(&self, path: &mut Path) {
        path.ecn = match (self.cc.data_ecn(), self.config.data_ecn) {
            (Ecn::NotEct, _) | (_, Ecn::NotEct | Ecn::Ce) => Ecn::NotEct,
            (_, e) => e,
        };
        if let Some(d) = self.config.data_dscp {
            path.dscp = d & 0x3f;
        }
    }

    fn on_sent(&mut self, now: Instant, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.cc.on_sent(now, len);
        if let Some(w) = &mut self.swift {
            w.swift.on_sent(now, len);
            w.frame = w.frame.max(len);
        }
    }

    /// The DCQCN timers rounded up to [`CC_TIMER_GRANULARITY`] (the α timer runs every
    /// `dce_tcp_rtt`, 1 µs by default: a software endpoint serves it in batches; each tick is
    /// still applied at its own deadline by `ReactionPoint::handle_timeout`), and the exact
    /// pacing wake-up.
    fn poll_timeout(&self) -> Option<Instant> {
        let g = CC_TIMER_GRANULARITY.as_nanos() as u64;
        let t = self
            .cc
            .poll_timeout()
            .map(|t| Instant::from_nanos(t.as_nanos().div_ceil(g).saturating_mul(g)));
        [t, self.wake, self.clock.deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.clock.expire(now);
        if self.cc.poll_timeout().is_some_and(|t| t <= now) {
            self.cc.handle_timeout(now);
        }
        if self.wake.is_some_and(|t| t <= now) {
            self.wake = None;
        }
    }
}

impl Qp {
    /// The QP's congestion control (RC QPs), for `roce stats -s` and traces.
    #[must_use]
    pub fn congestion(&self) -> Option<&QpCc> {
        self.cc.as_deref()
    }

    /// Whether this QP's congestion control takes RTT samples from its responses' arrival
    /// (Swift, `Qp::cc_on_ack`): the QP's `roce_xdp` entry then asks for them to be
    /// timed (`roce_common::maps::QP_FLAG_TIME_RESPONSES`). Read it after creating the QP and
    /// after [`super::Device::set_cc_algorithm`].
    #[must_use]
    pub fn samples_rtt(&self) -> bool {
        self.cc.as_deref().is_some_and(|c| c.swift.is_some())
    }

    /// Hook of [`Device::handle_decoded`]: a packet (not a CNP) accepted for this QP, which
    /// arrived at `now` (its arrival stamp, [`Device::handle_packet_at`]: the NP's CNP
    /// interval counts arrivals, not handling).
    /// `udp_src_port`: the packet's entropy (0 if unknown), named in the CNP a mark causes
    /// when the multipath extension is on (docs/multipath.md, "Congestion control across
    /// paths").
    pub(crate) fn cc_on_packet(&mut self, now: Instant, ce: bool, udp_src_port: u16) {
        let feedback = if self.mp.is_on() {
            Entropy::new(udp_src_port)
        } else {
            None
        };
        if let Some(c) = self.cc.as_deref_mut() {
            c.on_packet(
                now,
                ce,
                self.attr.ah_attr.as_ref(),
                self.attr.dest_qp_num,
                feedback,
            );
        }
    }

    /// Hook of the responder's replay of a READ from `psn`, the requester's first gap (it
    /// asks again from there, rxe `rxe_comp.c`), its responses going again from `from`. Not
    /// for placed (multipath) responses, whose requester asks for ranges out of order. READ
    /// responses are never acknowledged: what the requester took in order before the gap,
    /// since the episode began (`resp_epoch`), is the only measure of its speed. With at least
    /// [`EPISODE_MIN_PSNS`] of them, the loss is [`QpCongestion::on_loss_delivered`] at
    /// that rate over the episode's length; else a plain [`QpCongestion::on_loss`]. The
    /// replay starts the next episode. A replay from a PSN the episode has not sent yet is no
    /// new loss: rxe's retry asks again for every READ after its first gap, one request
    /// each, and only the first names a loss.
    pub(crate) fn cc_on_replay(&mut self, now: Instant, psn: Psn, from: Psn) {
        let mtu = self.attr.path_mtu.bytes();
        if let Some(c) = self.cc.as_deref_mut() {
            c.on_replay(now, psn, from, mtu);
        }
    }

    /// Hook of the responder sending the READ response `psn`: the first one, and the first
    /// after the responder sent none for [`EPISODE_IDLE`], starts an episode
    /// ([`Self::cc_on_replay`]). A shorter pause does not: the responses sent before it may
    /// still be queued on their way, and the requester's speed over the episode counts them.
    pub(crate) fn cc_on_read_response(&mut self, now: Instant, psn: Psn) {
        if let Some(c) = self.cc.as_deref_mut() {
            c.on_read_response(now, psn);
        }
    }

    /// Whether the ACK clock of the QP's READ responses wants a probe now ([`ReadClock`]).
    pub(crate) fn cc_probe_due(&self) -> bool {
        self.cc.as_deref().is_some_and(QpCc::probe_due)
    }

    /// Hook of `Qp::probe`: the probe left at `now`.
    pub(crate) fn cc_on_probe_sent(&mut self, now: Instant) {
        if let Some(c) = self.cc.as_deref_mut() {
            c.clock.on_probe_sent(now);
        }
    }

    /// Hook of [`Self::poll_transmit`]: whether a READ response may leave now, as far as the
    /// ACK clock of [`ReadClock`] is concerned (the pacer is `data_ok`).
    pub(crate) fn cc_responses_ok(&mut self, now: Instant, can_probe: bool) -> bool {
        self.cc
            .as_deref_mut()
            .is_none_or(|c| c.responses_ok(now, can_probe))
    }

    /// Hook of the completer: an ACK from the peer's responder, which answers the oldest
    /// probe still waiting, if any ([`ReadClock`]). Returns whether one was waiting.
    pub(crate) fn cc_on_peer_ack(&mut self) -> bool {
        self.cc.as_deref_mut().is_some_and(|c| c.clock.on_ack())
    }

    /// Hook of the responder's replay of placed (multipath) READ responses (a go-back-N replay
    /// goes to [`Self::cc_on_replay`], the requester's retry to [`Self::cc_on_retry`]):
    /// packets were lost, so the reaction point backs off ([`QpCongestion::on_loss`]).
    pub(crate) fn cc_on_loss(&mut self, now: Instant) {
        if let Some(c) = self.cc.as_deref_mut() {
            c.on_loss(now);
        }
    }

    /// Hook of the requester (`commit_rc_request`): a request packet starting at `psn` and
    /// covering `psns` PSNs left at `now` (Swift times it, [`RttSampler::on_send`]).
    pub(crate) fn cc_on_request_sent(&mut self, now: Instant, psn: Psn, psns: u32) {
        if let Some(w) = self.cc.as_deref_mut().and_then(|c| c.swift.as_mut()) {
            w.rtt.on_send(now, psn, psns);
        }
    }

    /// Hook of the requester's go back N to `psn` (rxe `req_retry`), having sent up to
    /// `sent_psn`: the PSNs sent again are not timed (Karn's rule).
    pub(crate) fn cc_on_go_back(&mut self, psn: Psn, sent_psn: Psn) {
        if let Some(w) = self.cc.as_deref_mut().and_then(|c| c.swift.as_mut()) {
            w.rtt.on_go_back(psn, sent_psn);
        }
    }

    /// Hook of the completer: a response (ACK, NAK, READ response, atomic ACK) that arrived at
    /// `now` acknowledges every request PSN up to `psn`. Gives Swift its RTT sample
    /// ([`RttSampler::on_ack`], [`Swift::on_ack`]). Pass the response's arrival stamp, not
    /// the time it was handled: a batch this process got to late would otherwise carry its
    /// wait into every sample.
    pub(crate) fn cc_on_ack(&mut self, now: Instant, psn: Psn) {
        if let Some(w) = self.cc.as_deref_mut().and_then(|c| c.swift.as_mut())
            && let Some((rtt, acked)) = w.rtt.on_ack(now, psn)
        {
            w.swift.on_ack(now, rtt, acked);
        }
    }

    /// Hook of the completer's retry: `timeout` when the retransmission timer started it, else
    /// a NAK or a response past a gap did. Packets were lost, so the reaction point backs off
    /// ([`QpCongestion::on_loss`]) and Swift cuts its window (fast recovery after a NAK,
    /// [`Swift::on_timeout`] after the timeout).
    ///
    /// A timeout may prove spurious ([`Self::cc_undo_timeout`]), so what its cuts changed is
    /// kept until the next timeout. `again`: the timeout fired before what the last one
    /// replayed was acknowledged (the doubled timer of one stall): the record keeps the state
    /// from before the stall's first cut ([`LossUndo::followed_by`]), so that proof that the
    /// stall was spurious undoes all of its cuts. Any other timeout replaces the record.
    /// The undo applies only while no other cut came after the one recorded.
    pub(crate) fn cc_on_retry(&mut self, now: Instant, timeout: bool, again: bool) {
        let Some(c) = self.cc.as_deref_mut() else {
            return;
        };
        let rate = c.cc.on_loss(now);
        let window = c.swift.as_mut().and_then(|w| {
            if timeout {
                w.swift.on_timeout(now)
            } else {
                w.swift.on_nak_loss(now);
                None
            }
        });
        if timeout {
            let u = &mut c.timeout_undo;
            if again {
                u.rate = match (u.rate, rate) {
                    (Some(e), Some(l)) => Some(e.followed_by(&l)),
                    (e, l) => l.or(e),
                };
                u.window = match (u.window, window) {
                    (Some(e), Some(l)) => Some(e.followed_by(&l)),
                    (e, l) => l.or(e),
                };
            } else {
                *u = TimeoutUndo { rate, window };
            }
        }
    }

    /// Hook of the completer: the last retransmission timeout proved spurious (the peer
    /// reported a packet the timeout replayed as a duplicate, so every packet had arrived).
    /// Undoes its rate and window cuts, unless another cut came after them
    /// ([`QpCongestion::undo_loss`], [`Swift::undo_timeout`]).
    pub(crate) fn cc_undo_timeout(&mut self, now: Instant) {
        let Some(c) = self.cc.as_deref_mut() else {
            return;
        };
        let u = core::mem::take(&mut c.timeout_undo);
        if let Some(r) = u.rate {
            c.cc.undo_loss(now, &r);
        }
        if let (Some(w), Some(s)) = (u.window, c.swift.as_mut()) {
            s.swift.undo_timeout(&w);
        }
    }

    /// How many PSNs the QP's congestion control lets be unacknowledged (Swift's window), if
    /// it limits them.
    pub(crate) fn cc_window(&self) -> Option<u32> {
        self.cc.as_deref()?.swift.as_ref().map(|w| w.swift.window())
    }

    /// Hook of [`Device::poll_transmit`]: whether data may leave now.
    pub(crate) fn cc_data_ok(&mut self, now: Instant, max_frame: usize) -> bool {
        let max = u32::try_from(max_frame).unwrap_or(u32::MAX);
        self.cc.as_deref_mut().is_none_or(|c| c.data_ok(now, max))
    }

    /// Hook of [`Device::poll_transmit`]: ECN/DSCP of an outgoing frame.
    pub(crate) fn cc_apply(&self, path: &mut Path) {
        if let Some(c) = self.cc.as_deref() {
            c.apply(path);
        }
    }

    /// Hook of [`Device::poll_transmit`]: a frame of `len` bytes left.
    pub(crate) fn cc_on_sent(&mut self, now: Instant, len: usize) {
        if let Some(c) = self.cc.as_deref_mut() {
            c.on_sent(now, len);
        }
    }

    /// Hook of [`Device::poll_transmit`]: a due CNP, written into `buf`.
    pub(crate) fn cc_emit_cnp(&mut self, buf: &mut [u8]) -> Option<Result<usize, ()>> {
        self.cc.as_deref_mut()?.emit_cnp(buf)
    }

    pub(crate) fn cc_poll_timeout(&self) -> Option<Instant> {
        self.cc.as_deref().and_then(QpCc::poll_timeout)
    }

    pub(crate) fn cc_handle_timeout(&mut self, now: Instant) {
        if let Some(c) = self.cc.as_deref_mut() {
            c.handle_timeout(now);
        }
    }
}

/// (source, destination) of the frames the peer behind `av` sends us.
fn peer_addrs(av: &Path) -> (core::net::IpAddr, core::net::IpAddr) {
    use core::net::IpAddr;
    match av.ip {
        IpPath::V4 { src, dst } => (IpAddr::V4(dst), IpAddr::V4(src)),
        IpPath::V6 { src, dst, .. } => (IpAddr::V6(dst), IpAddr::V6(src)),
    }
}

/// The congestion state a new QP of `qp_type` gets on a device with `config`: RC QPs only.
pub(crate) fn for_qp(config: &CcConfig, qp_type: QpType) -> Option<Box<QpCc>> {
    (qp_type == QpType::Rc).then(|| Box::new(QpCc::new(config)))
}

impl Device {
    /// Hook of [`Device::handle_decoded`]: a CNP for `dest_qp`. CNPs for an unknown QP are
    /// counted in `rx_unknown_qp`; CNPs from another address than the QP's peer in the QP's
    /// `rx_dropped` (as any RC packet, rxe_recv.c check_addr).
    ///
    /// A CNP whose BTH says it carries path feedback, to a QP with the multipath extension on,
    /// also retires the entropy it names (docs/multipath.md, "Congestion control across
    /// paths": the mark cuts the QP's rate and moves its traffic off the marked path).
    pub(crate) fn cc_on_cnp(
        &mut self,
        now: Instant,
        pkt: &super::RxPkt<'_>,
        addrs: Option<(core::net::IpAddr, core::net::IpAddr)>,
    ) {
        let dest_qp = pkt.repr.bth.dest_qp;
        let Some(qp) = self.qps.get_mut(&dest_qp.value()) else {
            self.counters.rx_unknown_qp += 1;
            return;
        };
        if let (Some((src, dst)), Some(av)) = (addrs, qp.attr.ah_attr.as_ref())
            && (src, dst) != peer_addrs(av)
        {
            qp.counters.rx_dropped += 1;
            return;
        }
        qp.counters.rcvd_pkts += 1;
        if let Some(c) = qp.cc.as_deref_mut() {
            c.on_cnp(now);
        }
        if pkt.repr.bth.resv7 & RESV7_TRAILER != 0
            && qp.mp.is_on()
            && let Some(c) = pkt.repr.cnp
            && let Ok(f) = PathFeedback::from_reserved(&c.reserved)
        {
            qp.mp_on_marked(f.entropy, now);
        }
        self.sched.touch(qp);
    }

    /// Changes one congestion-control parameter of QP `qpn` (names as [`CcConfig::set`]). The
    /// QP's DCQCN state starts afresh (unlimited, at line rate) with the new settings; its
    /// counters go on. Call it before traffic, or to experiment live.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`], [`DeviceError::NoCongestionControl`] for a UD QP, or
    /// [`DeviceError::Cc`] for a bad name or value.
    pub fn set_cc_param(&mut self, qpn: Qpn, name: &str, value: u64) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        let c = qp
            .cc
            .as_deref_mut()
            .ok_or(DeviceError::NoCongestionControl(qpn))?;
        let mut config = c.config;
        config.set(name, value)?;
        let mut fresh = QpCc::new(&config);
        fresh.carried = c.algorithm_stats();
        // The READ clock measures the path, not the algorithm: it stays, with the probes
        // still waiting for their answers.
        fresh.clock = c.clock.clone();
        if let (Some(f), Some(old)) = (fresh.swift.as_mut(), c.swift.as_ref()) {
            // The samples of packets in flight stay valid; the window starts afresh.
            f.rtt = old.rtt.clone();
            f.rtt.clear_skipped();
        }
        fresh.cnp = c.cnp;
        fresh.cnps_due = c.cnps_due;
        *c = fresh;
        self.sched.touch(qp);
        Ok(())
    }

    /// Switches QP `qpn` to congestion control `algorithm` (`--cc dcqcn|swift|off` for one
    /// QP; [`CcConfig::set_algorithm`]). Its state starts afresh; its counters go on.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQp`], or [`DeviceError::NoCongestionControl`] for a UD QP.
    pub fn set_cc_algorithm(
        &mut self,
        qpn: Qpn,
        algorithm: CcAlgorithm,
    ) -> Result<(), DeviceError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(DeviceError::NoSuchQp(qpn))?;
        let c = qp
            .cc
            .as_deref_mut()
            .ok_or(DeviceError::NoCongestionControl(qpn))?;
        let mut config = c.config;
        config.set_algorithm(algorithm);
        let mut fresh = QpCc::new(&config);
        fresh.carried = c.algorithm_stats();
        fresh.clock = c.clock.clone();
        fresh.cnp = c.cnp;
        fresh.cnps_due = c.cnps_due;
        *c = fresh;
        self.sched.touch(qp);
        Ok(())
    }

    /// The DCQCN state of every RC QP, in QPN order.
    #[must_use]
    pub fn cc_snapshots(&self) -> Vec<(Qpn, CcSnapshot)> {
        self.qps
            .values()
            .filter_map(|q| Some((q.qpn, q.cc.as_deref()?.snapshot())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, rc::Rc};

    use super::*;
    use crate::{
        transport::{
            Access, CqId, DeviceConfig, MrInfo, Mtu, SendOp, SendWr, Sge, WcStatus,
            sim::{Link, Pair, RcConfig, Side, connect_rc},
        },
        wire::{Opcode, parse_frame},
    };

    type Log = Rc<RefCell<Vec<(Side, Vec<u8>)>>>;

    struct Setup {
        p: Pair,
        a: Qpn,
        b: Qpn,
        cq: CqId,
        ma: MrInfo,
        mb: MrInfo,
        log: Log,
    }

    /// A connected pair (MTU 1024) with a 1 MiB WRITE target on B; every frame entering the
    /// link is recorded with its time.
    fn setup(config: DeviceConfig, link: Link) -> Setup {
        let mut p = Pair::new(3, config, link);
        let (a, b) = connect_rc(
            &mut p,
            &RcConfig {
                mtu: Mtu::Mtu1024,
                ..RcConfig::default()
            },
        );
        let ma =
            p.a.reg_mr(a.pd, vec![7; 1 << 20], 0x10_0000, Access::empty())
                .unwrap();
        let mb =
            p.b.reg_mr(b.pd, vec![0; 1 << 20], 0x10_0000, Access::all())
                .unwrap();
        let log: Log = Rc::default();
        Setup {
            p,
            a: a.qpn,
            b: b.qpn,
            cq: a.cq,
            ma,
            mb,
            log,
        }
    }

    impl Setup {
        fn record(&mut self) {
            let l = Rc::clone(&self.log);
            self.p.filter = Some(Box::new(move |side, f| {
                l.borrow_mut().push((side, f.to_vec()));
                true
            }));
        }

        /// Posts a signalled WRITE of `len` bytes from A and runs until it completes.
        fn write(&mut self, len: u32) {
            let sg = vec![Sge {
                addr: self.ma.iova,
                length: len,
                lkey: self.ma.lkey,
            }];
            let op = SendOp::Write {
                remote_addr: self.mb.iova,
                rkey: self.mb.rkey,
            };
            let mut wr = SendWr::new(1, op, sg);
            wr.flags = crate::transport::SendFlags::SIGNALED;
            self.p.a.post_send(self.a, wr).unwrap();
            let cq = self.cq;
            assert!(
                self.p
                    .drive_until(1_000_000, |p| p.a.cq(cq).is_some_and(|c| !c.is_empty()))
            );
            assert_eq!(self.p.a.poll_cq(cq).unwrap().status, WcStatus::Success);
            // Send what the last input queued (a CNP for a marked ACK).
            self.p.step();
        }

        fn stats(&self, side: Side) -> CcStats {
            let (d, q) = match side {
                Side::A => (&self.p.a, self.a),
                Side::B => (&self.p.b, self.b),
            };
            d.qp(q).unwrap().congestion().unwrap().stats()
        }
    }

    #[test]
    fn ce_marks_make_cnps_that_cut_the_senders_rate() {
        let link = Link {
            ce: 1.0,
            ..Link::default()
        };
        let mut s = setup(DeviceConfig::default(), link);
        s.record();
        s.write(64 * 1024);
        let (na, nb) = (s.stats(Side::A), s.stats(Side::B));
        // B saw 64 marked WRITE packets and answered with CNPs, at most one per 2 µs.
        assert_eq!(nb.np_ecn_marked_roce_packets, 64);
        assert!(nb.np_cnp_sent >= 1, "{nb:?}");
        // Every CNP B sent reached A (the link loses nothing) and was handled or ignored.
        assert_eq!(na.rp_cnp_handled + na.rp_cnp_ignored, nb.np_cnp_sent);
        assert!(na.rp_cnp_handled >= 1);
        let snap = s.p.a.qp(s.a).unwrap().congestion().unwrap().snapshot();
        assert!(snap.limited && snap.rate_bps < 10_000_000_000, "{snap:?}");
        assert!(snap.alpha > 0.0);
        // On the wire: data left ECT(0); CNPs are opcode 0x81, BECN, DSCP 48, to the peer's QP.
        let mut cnps = [0u64; 2];
        for (side, f) in s.log.borrow().iter() {
            let fr = parse_frame(f).unwrap();
            assert!(fr.icrc_ok);
            if fr.roce.bth.opcode == Opcode::CNP {
                assert!(fr.roce.bth.becn);
                assert_eq!(fr.ip.dscp(), 48);
                let (peer, i) = match side {
                    Side::A => (s.b, 0),
                    Side::B => (s.a, 1),
                };
                assert_eq!(fr.roce.bth.dest_qp, peer);
                assert_eq!(f.len(), 14 + 20 + 8 + 12 + 16 + 4);
                cnps[i] += 1;
            } else {
                assert_eq!(fr.ecn(), Ecn::Ect0, "{:?}", fr.roce.bth.opcode);
            }
        }
        assert_eq!(
            cnps,
            [na.np_cnp_sent, nb.np_cnp_sent],
            "each CNP counted was sent"
        );
    }

    #[test]
    fn cc_off_sends_not_ect_and_no_cnps() {
        let link = Link {
            ce: 1.0,
            ..Link::default()
        };
        let config = DeviceConfig {
            cc: CcConfig::off(),
            ..DeviceConfig::default()
        };
        let mut s = setup(config, link);
        s.record();
        s.write(64 * 1024);
        let nb = s.stats(Side::B);
        // The link marks every ECN-capable frame; with CC off there are none.
        assert_eq!(nb.np_ecn_marked_roce_packets, 0);
        assert_eq!(nb.np_cnp_sent, 0);
        for (_, f) in s.log.borrow().iter() {
            let fr = parse_frame(f).unwrap();
            assert_ne!(fr.roce.bth.opcode, Opcode::CNP);
            assert_eq!(f[15] & 3, 0, "Not-ECT");
        }
        let snap = s.p.a.qp(s.a).unwrap().congestion().unwrap().snapshot();
        assert!(!snap.limited);
        assert_eq!(snap.rate_bps, 10_000_000_000);
    }

    #[test]
    fn a_cut_qp_is_paced_at_its_rate() {
        // The first CNP sets 100 Mb/s (rate_to_set_on_first_cnp); timers slow enough that
        // the rate barely recovers during the WRITE.
        let mut config = DeviceConfig::default();
        config.cc.set("rate_to_set_on_first_cnp", 100).unwrap();
        config.cc.set("rpg_time_reset", 131_071).unwrap();
        config.cc.set("rpg_byte_reset", 0).unwrap();
        let link = Link {
            ce: 1.0,
            ..Link::default()
        };
        let mut s = setup(config, link);
        s.write(1024);
        assert_eq!(s.stats(Side::A).rp_cnp_handled, 1);
        let rate =
            s.p.a
                .qp(s.a)
                .unwrap()
                .congestion()
                .unwrap()
                .snapshot()
                .rate_bps;
        assert_eq!(rate, 100_000_000);
        // Unmarked from now on: 256 KiB at 100 Mb/s takes about 21 ms (less one burst).
        s.p.link.ce = 0.0;
        let t0 = s.p.time;
        s.write(256 * 1024);
        let took = s.p.time.saturating_duration_since(t0).as_secs_f64();
        let frames = 256.0 * (1024.0 + 14.0 + 20.0 + 8.0 + 12.0 + 16.0 + 4.0);
        let expect = frames * 8.0 / 100e6;
        assert!(
            took > expect * 0.9 && took < expect * 1.1,
            "took {took} s, expected {expect} s"
        );
    }

    #[test]
    fn set_cc_param_validates_and_keeps_counters() {
        let link = Link {
            ce: 1.0,
            ..Link::default()
        };
        let mut s = setup(DeviceConfig::default(), link);
        s.write(4096);
        let before = s.stats(Side::B);
        assert!(before.np_cnp_sent > 0);
        let e = s.p.b.set_cc_param(s.b, "rpg_gd", 16).unwrap_err();
        assert!(e.to_string().contains("rpg_gd = 16"), "{e}");
        assert!(s.p.b.set_cc_param(s.b, "bogus", 1).is_err());
        assert!(s.p.b.set_cc_param(s.b, "np_enabled", 2).is_err());
        assert!(matches!(
            s.p.b.set_cc_param(Qpn::new(999), "rpg_gd", 11),
            Err(DeviceError::NoSuchQp(_))
        ));
        s.p.b.set_cc_param(s.b, "np_enabled", 0).unwrap();
        s.p.b
            .set_cc_param(s.b, "min_time_between_cnps", 50)
            .unwrap();
        let q = s.p.b.qp(s.b).unwrap().congestion().unwrap();
        assert!(!q.config().dcqcn.np_enabled);
        assert_eq!(q.config().dcqcn.min_time_between_cnps, 50);
        assert_eq!(s.stats(Side::B), before);
        s.write(4096);
        let after = s.stats(Side::B);
        assert_eq!(
            after.np_cnp_sent, before.np_cnp_sent,
            "NP off: no more CNPs"
        );
        assert_eq!(
            after.np_ecn_marked_roce_packets,
            before.np_ecn_marked_roce_packets + 4
        );
        assert_eq!(s.p.b.cc_snapshots().len(), 1);
    }

    /// READ response episodes ([`Qp::cc_on_replay`]), values by hand: PSNs 100..=1099 leave
    /// over 10 ms; a replay at 50 ms from PSN 600 says the requester took 500 frames of
    /// 1024 + 58 bytes in 50 ms, 86.56 Mb/s, and the rate goes to 7/8 of it, 75.74 Mb/s. The
    /// same retry's request for a later READ (PSN 800, not sent again yet) is no new loss.
    /// The next replay, from PSN 700 at 150 ms after 600..=899 went again, measures 100 frames
    /// in 100 ms, and cuts no lower than half (37.87 Mb/s); one right after it, 5 PSNs into
    /// the new episode, is a plain loss (halving, 18.935 Mb/s). After a pause longer than
    /// `EPISODE_IDLE` the next response starts an episode.
    #[test]
    fn replayed_reads_cut_the_rate_to_what_the_requester_took() {
        let mut config = CcConfig::default();
        config.set("loss_backoff", 1).unwrap();
        let mut c = QpCc::new(&config);
        let us = Instant::from_micros;
        for i in 0..1000u32 {
            c.on_read_response(us(u64::from(i) * 10), Psn::new(100 + i));
        }
        c.on_replay(us(50_000), Psn::new(600), Psn::new(600), 1024);
        assert_eq!(c.snapshot().rate_bps, 75_740_000);
        c.on_replay(us(50_010), Psn::new(800), Psn::new(800), 1024);
        assert_eq!(c.snapshot().rate_bps, 75_740_000);
        assert_eq!(
            (c.stats().rp_loss_handled, c.stats().rp_loss_ignored),
            (1, 0)
        );
        for i in 600..900u32 {
            c.on_read_response(us(60_000 + u64::from(i)), Psn::new(i));
        }
        c.on_replay(us(150_000), Psn::new(700), Psn::new(700), 1024);
        assert_eq!(c.snapshot().rate_bps, 37_870_000);
        for i in 700..=720u32 {
            c.on_read_response(us(150_100), Psn::new(i));
        }
        c.on_replay(us(150_200), Psn::new(705), Psn::new(705), 1024);
        assert_eq!(c.snapshot().rate_bps, 18_935_000);
        assert_eq!(c.stats().rp_loss_handled, 3);
        c.on_read_response(us(150_300), Psn::new(705));
        c.on_read_response(us(700_000), Psn::new(2000));
        let e = c.resp_epoch.unwrap();
        assert_eq!(
            (e.start, e.first, e.latest),
            (us(700_000), Psn::new(2000), Psn::new(2000))
        );
    }
}
