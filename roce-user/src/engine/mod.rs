//! The per-queue packet engine: one plain thread per AF_XDP queue runs
//! receive batch → handler → transmit batch → completions → poll(2), with the poll timeout taken
//! from the handler. The handler is where the transport plugs in; it sees frames only as
//! borrowed byte slices and queues transmits through a [`TxSink`], so nothing is allocated per
//! packet.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

pub mod capture;
pub(crate) mod driver;
pub(crate) mod exit;
mod r#gen;
pub(crate) mod publish;

pub use r#gen::{
    GenConfig, GenHandler, GenQueueReport, GenReport, MIN_FRAME, Rate, RoceTemplate, run_gen,
};

pub use crate::time::Instant;
use crate::xsk::{BindMode, FrameAccounting, XskError, XskQueue, XskStats};
pub use crate::xsk::{RxVerdict, TxError, TxSink};

/// The engine's clock, the only place the data path reads the system clock: CLOCK_MONOTONIC
/// ([`crate::xsk::monotonic_ns`], the clock of `bpf_ktime_get_ns` and so of the arrival stamps
/// `roce_xdp` writes) turned into the core's [`Instant`].
///
/// Every `Clock` of a process counts from the same origin (the first one made), so that the
/// times the engines, the inline device and the arrival stamps give the transport are on one
/// scale.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_ns: u64,
}

/// CLOCK_MONOTONIC at the first [`Clock::new`] of the process.
static CLOCK_BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

impl Clock {
    /// The process's clock (zero when the first one was made).
    #[must_use]
    pub fn new() -> Self {
        Self {
            base_ns: *CLOCK_BASE.get_or_init(crate::xsk::monotonic_ns),
        }
    }

    /// The current time.
    #[must_use]
    pub fn now(&self) -> Instant {
        self.from_monotonic_ns(crate::xsk::monotonic_ns())
    }

    /// The [`Instant`] of the CLOCK_MONOTONIC reading `ns` (an arrival stamp); a reading from
    /// before the clock's origin is its origin.
    #[must_use]
    pub const fn from_monotonic_ns(&self, ns: u64) -> Instant {
        Instant::from_nanos(ns.saturating_sub(self.base_ns))
    }

    /// The arrival time of a packet received at `now` with the arrival stamp `stamp_ns`
    /// ([`crate::xsk::RxBatch::for_each_stamped`]): the stamp, never later than `now`; `now`
    /// for a packet without one.
    #[must_use]
    pub fn arrival(&self, stamp_ns: Option<u64>, now: Instant) -> Instant {
        stamp_ns.map_or(now, |ns| self.from_monotonic_ns(ns).min(now))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// The per-frame callback of a receive batch: the frame from the Ethernet header on, writable in
/// place, its arrival time (the stamp `roce_xdp` put in front of it, or the batch's time when
/// it has none; see [`Clock::arrival`]), and the queue's transmit sink (see [`Handler::on_rx`]).
pub type RxFrameFn<'a> = dyn FnMut(&mut [u8], Instant, &mut TxSink<'_>) -> RxVerdict + 'a;

/// What runs on a queue: the transport, an echo, a generator.
pub trait Handler {
    /// Called for every received frame, in ring order. `frame` is the packet from the Ethernet
    /// header on, writable in place; return [`RxVerdict::Transmit`] to send it back out on
    /// this queue (e.g. after rewriting headers), or [`RxVerdict::Recycle`]. New frames
    /// (ACKs, responses) go through `tx`.
    fn on_rx(&mut self, now: Instant, frame: &mut [u8], tx: &mut TxSink<'_>) -> RxVerdict;

    /// Called once per turn for the turn's receive batch. `receive` takes the batch from the
    /// RX ring, calls its argument for every frame in ring order, and returns how many frames
    /// it took; return that count. The default hands each frame to [`Handler::on_rx`].
    /// Override it to do per-batch work once around the frames, as the transport driver does:
    /// it takes its transport's lock once per batch rather than once per frame, and hands
    /// frames of other queues' QPs over without locking anything.
    fn on_rx_batch(
        &mut self,
        now: Instant,
        receive: &mut dyn FnMut(&mut RxFrameFn<'_>) -> u32,
    ) -> u32 {
        receive(&mut |frame, _arrival, tx| self.on_rx(now, frame, tx))
    }

    /// Called once per turn after the receive batch: queue whatever is due. On
    /// [`TxError::Full`] stop and wait for the next turn.
    fn poll_transmit(&mut self, now: Instant, tx: &mut TxSink<'_>) {
        let _ = (now, tx);
    }

    /// The next time [`Handler::on_timeout`] must run, if any; bounds the poll(2) wait.
    fn next_timeout(&self) -> Option<Instant> {
        None
    }

    /// Called when `next_timeout` has passed.
    fn on_timeout(&mut self, now: Instant) {
        let _ = now;
    }

    /// A file descriptor that other threads make readable to wake the engine early (for
    /// example an eventfd signalled after posting work); polled next to the socket.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Called after each poll(2) wait, before the next turn: clear [`Handler::wake_fd`] here
    /// (read the eventfd). Clearing it only after a wait, never on every turn, costs no
    /// syscall per turn and loses no wake-up: whatever was posted before the signal is seen
    /// by the turn that follows, and a signal given during a turn makes the next wait return
    /// at once.
    fn on_woken(&mut self) {}

    /// Called with the queue's counters when the engine goes idle after moving frames (at most
    /// every [`IDLE_REPORT_EVERY`], so they are at most that stale), every 4096 busy turns, and
    /// at the end, so the handler can publish them while the engine runs.
    fn on_queue_stats(&mut self, queue_id: u32, stats: &XskStats) {
        let _ = (queue_id, stats);
    }

    /// True when the handler has finished its work and the engine should drain and stop.
    fn is_done(&self, now: Instant) -> bool {
        let _ = now;
        false
    }
}

/// Engine tuning.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Frames per receive batch.
    pub batch: u32,
    /// Most frames the handler may queue for transmit per turn (default 256). A turn that
    /// transmitted thousands of frames (1024 QPs with data to send) left received frames
    /// in the RX ring for milliseconds: the kernel found the fill ring empty and dropped the
    /// peer's ACKs (`fill_ring_empty`), which cost retransmissions. Transmit still goes
    /// through in batches, one flush per turn.
    pub tx_per_turn: u32,
    /// Longest poll(2) wait, so that the stop flag is seen.
    pub max_wait: Duration,
    /// How long to keep flushing and reaping after stop so that in-flight frames come home.
    pub drain_timeout: Duration,
    /// Receive moderation, as a NIC's interrupt moderation (`ethtool -C IFACE rx-usecs N`):
    /// when an idle engine's wait ends because a frame arrived, it waits this long more
    /// before it takes the frames, so that frames arriving tens of microseconds apart are
    /// handled in one turn (their ACKs coalesced per QP and sent together) for one wake-up.
    /// Each frame that wakes the engine waits up to this long (a wake-up for a post does
    /// not); a busy engine never waits. Zero (the default) takes every frame at once. For a
    /// host whose cores the peer shares (a Soft-RoCE VM on the same machine: each wake-up
    /// of ours takes CPU from the guest, and each ACK is an interrupt in it).
    pub rx_usecs: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            batch: 64,
            tx_per_turn: 256,
            max_wait: Duration::from_millis(50),
            drain_timeout: Duration::from_secs(1),
            rx_usecs: Duration::ZERO,
        }
    }
}

/// What an engine run did.
#[derive(Clone, Copy, Debug)]
pub struct EngineReport {
    /// Queue served.
    pub queue_id: u32,
    /// How its socket is bound.
    pub mode: BindMode,
    /// Loop turns.
    pub turns: u64,
    /// poll(2) waits.
    pub waits: u64,
    /// Waits for frames that moderation lengthened ([`EngineConfig::rx_usecs`]).
    pub moderated: u64,
    /// Counters at the end.
    pub stats: XskStats,
    /// Frame locations at the end (after draining): `app` and `kernel_tx` are 0 when every
    /// transmitted frame came back.
    pub accounting: FrameAccounting,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// One queue's engine: owns the socket and the handler.
pub struct Engine<H> {
    queue: XskQueue,
    handler: H,
    cfg: EngineConfig,
    clock: Clock,
    turns: u64,
    waits: u64,
    moderated: u64,
    /// When the counters were last handed over ([`Handler::on_queue_stats`]).
    last_report: Instant,
    /// Whether frames moved since then ([`Engine::run`]).
    unreported: bool,
    /// Whether frames wait in the TX ring for a kick ([`Engine::turn_and_report_with`]).
    kick_owed: bool,
}

/// How often [`Engine::turn_and_report`] hands the counters over while its turns stay idle:
/// reading them is a `getsockopt(XDP_STATISTICS)` syscall, too much for every idle turn of a
/// thread that polls in a loop; the stats thread publishes every 250 ms anyway.
pub const IDLE_REPORT_EVERY: Duration = Duration::from_millis(1);

impl<H: Handler> Engine<H> {
    /// An engine over an opened (and, for receive, registered in `ROCE_XSKS`) queue.
    pub fn new(mut queue: XskQueue, handler: H, cfg: EngineConfig) -> Self {
        queue.set_batch(cfg.batch);
        Self {
            queue,
            handler,
            cfg,
            clock: Clock::new(),
            turns: 0,
            waits: 0,
            moderated: 0,
            last_report: Instant::from_nanos(0),
            unreported: false,
            kick_owed: false,
        }
    }

    /// The queue.
    pub const fn queue(&self) -> &XskQueue {
        &self.queue
    }

    /// The handler.
    pub const fn handler(&self) -> &H {
        &self.handler
    }

    /// The handler, mutably (between runs).
    pub const fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }

    /// Gives back the queue and the handler.
    pub fn into_parts(self) -> (XskQueue, H) {
        (self.queue, self.handler)
    }

    /// One turn: completions, refill, a receive batch through the handler, the handler's own
    /// transmits, and the flush to the TX ring. Returns the number of frames moved.
    pub fn turn(&mut self, now: Instant) -> u64 {
        self.turn_with(now, false)
    }

    /// [`Engine::turn`]; with `defer_kick`, a turn that received frames leaves what it
    /// transmits in the TX ring unkicked ([`XskQueue::stage_tx`]) until the next turn, and
    /// [`Engine::kick_owed`] says so.
    fn turn_with(&mut self, now: Instant, defer_kick: bool) -> u64 {
        self.turns += 1;
        let q = &mut self.queue;
        let h = &mut self.handler;
        let completed = q.reap_completions();
        q.refill();
        let batch = self.cfg.batch;
        let clock = self.clock;
        let received = h.on_rx_batch(now, &mut |per_frame| {
            q.receive_stamped(batch, |frame, stamp, tx| {
                per_frame(frame, clock.arrival(stamp, now), tx)
            })
        });
        if h.next_timeout().is_some_and(|t| t <= now) {
            h.on_timeout(now);
        }
        q.with_tx_sink_limit(self.cfg.tx_per_turn as usize, |tx| h.poll_transmit(now, tx));
        let sent = q.stage_tx();
        self.kick_owed = defer_kick && received > 0;
        if !self.kick_owed {
            q.kick_tx();
        }
        u64::from(completed) + u64::from(received) + sent as u64
    }

    /// Whether the last turn left frames in the TX ring for the next one to kick.
    #[must_use]
    pub const fn kick_owed(&self) -> bool {
        self.kick_owed
    }

    /// [`Engine::turn`] for a thread that drives the engine itself between other work (an
    /// inline device): also hands the queue's AF_XDP counters to the handler every 4096 turns
    /// and after an idle turn, at most every [`IDLE_REPORT_EVERY`].
    pub fn turn_and_report(&mut self, now: Instant) -> u64 {
        self.turn_and_report_with(now, false)
    }

    /// [`Engine::turn_and_report`]; with `defer_kick`, a turn that received leaves what it
    /// transmits in the TX ring unkicked until the next turn. For an application thread that
    /// polls and, having received, is likely to post at once (the responder's ACK then leaves
    /// with the answer, one `sendto` for both: in copy mode each kick runs the whole transmit
    /// path, the peer's XDP receive included). Whoever drives the engine must turn again soon
    /// while [`Engine::kick_owed`].
    pub fn turn_and_report_with(&mut self, now: Instant, defer_kick: bool) -> u64 {
        let moved = self.turn_with(now, defer_kick);
        let idle_due =
            moved == 0 && now.saturating_duration_since(self.last_report) >= IDLE_REPORT_EVERY;
        if idle_due || self.turns.is_multiple_of(4096) {
            self.last_report = now;
            self.handler
                .on_queue_stats(self.queue.queue_id(), &self.queue.stats());
        }
        moved
    }

    /// Flushes what is left to transmit, as [`Engine::run`] does when it stops, and reports
    /// the queue's counters a last time. Call before dropping an engine driven with
    /// [`Engine::turn_and_report`].
    pub fn finish(&mut self) -> Result<(), XskError> {
        self.drain()?;
        self.handler
            .on_queue_stats(self.queue.queue_id(), &self.queue.stats());
        Ok(())
    }

    /// Runs until `stop` is set or the handler is done, then drains in-flight transmits.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<EngineReport, XskError> {
        let start = self.clock.now();
        loop {
            let now = self.clock.now();
            if stop.load(Ordering::Relaxed) || self.handler.is_done(now) {
                break;
            }
            let moved = self.turn(now);
            self.unreported |= moved > 0;
            // Before sleeping, hand over the counters if they changed, at most every
            // IDLE_REPORT_EVERY (the read is a getsockopt; a queue that empties thousands of
            // times a second would pay it each time); and every 4096 busy turns.
            let since = now.saturating_duration_since(self.last_report);
            let idle_due = moved == 0 && self.unreported && since >= IDLE_REPORT_EVERY;
            if idle_due || self.turns.is_multiple_of(4096) {
                self.last_report = now;
                self.unreported = false;
                self.handler
                    .on_queue_stats(self.queue.queue_id(), &self.queue.stats());
            }
            if moved == 0 {
                let mut wait = self.cfg.max_wait;
                if self.unreported {
                    // Come back to report what the last turns did.
                    wait = wait.min(IDLE_REPORT_EVERY.saturating_sub(since));
                }
                if let Some(t) = self.handler.next_timeout() {
                    wait = wait.min(t.saturating_duration_since(now));
                }
                if !wait.is_zero() {
                    self.waits += 1;
                    let woken = self.queue.wait_woken(Some(wait), self.handler.wake_fd())?;
                    self.handler.on_woken();
                    if woken.rx && !woken.wake && !self.cfg.rx_usecs.is_zero() {
                        // Receive moderation: let the frames that follow this one gather.
                        self.moderated += 1;
                        std::thread::sleep(self.cfg.rx_usecs);
                    }
                }
            }
        }
        self.drain()?;
        self.handler
            .on_queue_stats(self.queue.queue_id(), &self.queue.stats());
        let end = self.clock.now();
        Ok(EngineReport {
            queue_id: self.queue.queue_id(),
            mode: self.queue.bind_mode(),
            turns: self.turns,
            waits: self.waits,
            moderated: self.moderated,
            stats: self.queue.stats(),
            accounting: self.queue.accounting(),
            elapsed: end.saturating_duration_since(start),
        })
    }

    /// Takes the handler's last transmits, then flushes the backlog, reaps completions and
    /// hands the frames still in the RX ring to the handler, until nothing is in flight for
    /// transmit and the RX ring is empty, or the drain timeout passes.
    ///
    /// Frames the kernel put into the RX ring before the socket left `ROCE_XSKS` (the device
    /// unsets it before it stops its engines) go through the handler like any other, so that
    /// they are counted (received, or dropped for a QP that is gone) instead of vanishing with
    /// the socket. The handler's `poll_transmit` runs once, not in the loop: a handler that
    /// generates traffic must not go on generating it while the engine stops.
    fn drain(&mut self) -> Result<(), XskError> {
        // What the handler still has to send (the ACKs a QP destroyed just before the stop
        // owes its peer) goes into the ring first.
        let now = self.clock.now();
        let h = &mut self.handler;
        self.queue
            .with_tx_sink_limit(self.cfg.tx_per_turn as usize, |tx| h.poll_transmit(now, tx));
        let deadline = self.clock.now().saturating_add(self.cfg.drain_timeout);
        let batch = self.cfg.batch;
        loop {
            let q = &mut self.queue;
            let h = &mut self.handler;
            q.reap_completions();
            q.refill();
            let clock = self.clock;
            let now = clock.now();
            let received = h.on_rx_batch(now, &mut |per_frame| {
                q.receive_stamped(batch, |frame, stamp, tx| {
                    per_frame(frame, clock.arrival(stamp, now), tx)
                })
            });
            q.flush_tx();
            if (received == 0 && q.tx_idle()) || now >= deadline {
                break;
            }
            if received == 0 {
                q.wait(Some(Duration::from_millis(1)))?;
            }
        }
        self.queue.reap_completions();
        Ok(())
    }
}

/// A running engine thread; join it to get the engine back with its report.
pub type EngineThread<H> = JoinHandle<Result<(EngineReport, Engine<H>), XskError>>;

/// Starts one engine thread per queue, named `roce-q<N>`, each with the handler `make(queue_id)`.
/// They run until `stop` is set (or their handler is done).
pub fn spawn_engines<H, F>(
    queues: Vec<XskQueue>,
    mut make: F,
    cfg: EngineConfig,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<Vec<EngineThread<H>>>
where
    H: Handler + Send + 'static,
    F: FnMut(u32) -> H,
{
    queues
        .into_iter()
        .map(|q| {
            let h = make(q.queue_id());
            let stop = Arc::clone(stop);
            std::thread::Builder::new()
                .name(format!("roce-q{}", q.queue_id()))
                .spawn(move || {
                    let mut e = Engine::new(q, h, cfg);
                    let report = e.run(&stop)?;
                    Ok((report, e))
                })
        })
        .collect()
}

/// Echo (l2fwd): swaps the Ethernet and IPv4/IPv6 addresses and sends every frame back on its
/// queue. The UDP ports stay as they are, so a RoCE packet stays a RoCE packet for the peer.
/// Swapping addresses keeps the IPv4 header checksum valid (the one's-complement sum does not
/// depend on word order); UDP checksums are left as they are (RoCE v2 senders put 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoHandler {
    /// Frames echoed.
    pub echoed: u64,
    /// Frames too short to swap, recycled.
    pub short: u64,
}

impl Handler for EchoHandler {
    fn on_rx(&mut self, _now: Instant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        if swap_addresses(frame) {
            self.echoed += 1;
            RxVerdict::Transmit { len: frame.len() }
        } else {
            self.short += 1;
            RxVerdict::Recycle
        }
    }
}

/// Swaps Ethernet source/destination and, for untagged IPv4 or IPv6, the IP addresses.
/// Returns false (changing nothing) for frames shorter than their headers.
pub fn swap_addresses(frame: &mut [u8]) -> bool {
    use roce_common::hdr::{ETH_P_IPV4, ETH_P_IPV6, EthHdr, Ipv4Hdr, Ipv6Hdr};
    if frame.len() < EthHdr::LEN {
        return false;
    }
    let ether_type = u16::from_be_bytes([frame[12], frame[13]]);
    let (src, dst, len) = match ether_type {
        ETH_P_IPV4 => (EthHdr::LEN + 12, EthHdr::LEN + 16, 4),
        ETH_P_IPV6 => (EthHdr::LEN + 8, EthHdr::LEN + 24, 16),
        _ => (0, 0, 0),
    };
    let ip_len = match ether_type {
        ETH_P_IPV4 => Ipv4Hdr::LEN,
        ETH_P_IPV6 => Ipv6Hdr::LEN,
        _ => 0,
    };
    if frame.len() < EthHdr::LEN + ip_len {
        return false;
    }
    let (d, s) = frame.split_at_mut(6);
    d.swap_with_slice(&mut s[..6]);
    if len > 0 {
        let (a, b) = frame.split_at_mut(dst);
        a[src..src + len].swap_with_slice(&mut b[..len]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_ipv4_keeps_checksum_and_swaps_back() {
        let mut f = [0u8; 60];
        f[..6].copy_from_slice(&[1, 1, 1, 1, 1, 1]);
        f[6..12].copy_from_slice(&[2, 2, 2, 2, 2, 2]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[24..26].copy_from_slice(&[0xab, 0xcd]);
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        let orig = f;
        assert!(swap_addresses(&mut f));
        assert_eq!(&f[..6], &orig[6..12]);
        assert_eq!(&f[6..12], &orig[..6]);
        assert_eq!(&f[26..30], &orig[30..34]);
        assert_eq!(&f[30..34], &orig[26..30]);
        assert_eq!(&f[24..26], &orig[24..26]);
        assert!(swap_addresses(&mut f));
        assert_eq!(f, orig);
        assert!(!swap_addresses(&mut f[..20]));
    }
}
