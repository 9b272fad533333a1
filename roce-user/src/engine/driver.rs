//! The driver between the engines and the transport: one [`Shared`] transport per queue (one
//! per device unless sharded), the [`TransportHandler`] each queue's engine runs, and the
//! [`Inline`] engines that application threads drive themselves. A received frame goes from
//! the engine through this file to the transport and nowhere else.

use std::{
    os::fd::AsFd as _,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::Waker,
};

use crossbeam_queue::ArrayQueue;
use nix::sys::eventfd::EventFd;

use super::{Clock, Engine, Handler, Instant, RxFrameFn, RxVerdict, TxSink, capture::Capture};
use crate::{
    transport::{self, DropCounter},
    xsk::{
        XskStats,
        capture::{DIR_LOOPBACK, DIR_RX, DIR_TX, NO_QPN, reason_device, reason_qp},
    },
};

/// What the engines and the application threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) dev: Mutex<transport::Device>,
    /// Signalled by the engines after input that may have completed work; wait on it with
    /// [`Shared::wait_progress`].
    pub(crate) progress: Condvar,
    /// Threads waiting on `progress` now: a turn with nothing to wake skips the notify's
    /// futex call, one system call per turn on a polling thread's path.
    pub(crate) progress_sleepers: AtomicUsize,
    /// Async waiters, woken with `progress`.
    pub(crate) wakers: Mutex<Vec<Waker>>,
    /// Signalled by the engines after a turn that left an event queued in the transport, for
    /// the threads in `api::Device::wait_event` (so they sleep through turns without events).
    pub(crate) events: Condvar,
    /// Makes the engines' poll(2) return, after a post.
    pub(crate) wake: EventFd,
    /// The latest AF_XDP counters of each queue, as the engines report them.
    pub(crate) xsk: Mutex<std::collections::BTreeMap<u32, XskStats>>,
    /// Frames of this transport's QPs that other queues received (sharded devices).
    pub(crate) inbox: Inbox,
}

/// How many frames a queue's hand-over ring holds: two receive batches of the default size
/// from each other queue fit, and a burst beyond that is dropped and counted
/// (`rx_other_queue_dropped`), as a full RX ring would drop it.
pub(crate) const INBOX_SLOTS: usize = 256;

/// A bounded lock-free hand-over of received frames to the queue whose transport owns their QP
/// (ARCHITECTURE.md: "handed over through a lock-free channel, never a shared lock on the hot
/// path"). Any queue's engine pushes, only the owner's pops.
///
/// Its buffers are allocated once, when the device opens, and circulate between `free` and
/// `full`, so a hand-over copies the frame once and allocates nothing.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// Empty buffers, each with room for `slot_len` bytes.
    free: ArrayQueue<Vec<u8>>,
    /// Frames handed over, oldest first, with their arrival times.
    full: ArrayQueue<(Vec<u8>, Instant)>,
    slot_len: usize,
}

impl Inbox {
    /// A ring of `slots` frames of up to `slot_len` bytes each (the longest frame the queue can
    /// receive).
    pub(crate) fn new(slots: usize, slot_len: usize) -> Self {
        let free = ArrayQueue::new(slots.max(1));
        for _ in 0..slots.max(1) {
            let _ = free.push(Vec::with_capacity(slot_len));
        }
        Self {
            free,
            full: ArrayQueue::new(slots.max(1)),
            slot_len,
        }
    }

    /// Copies `frame`, which arrived at `arrival`, into the ring for the owner to handle in its
    /// own turn. Returns false, and keeps nothing, when every slot is taken or the frame is
    /// longer than a slot: the caller counts the drop.
    pub(crate) fn push(&self, frame: &[u8], arrival: Instant) -> bool {
        if frame.len() > self.slot_len {
            return false;
        }
        let Some(mut buf) = self.free.pop() else {
            return false;
        };
        buf.clear();
        buf.extend_from_slice(frame);
        // Cannot fail: a buffer popped from `free` always has a place in `full`, which holds
        // as many as there are buffers. Should it ever, the buffer goes back to `free`.
        if let Err((buf, _)) = self.full.push((buf, arrival)) {
            let _ = self.free.push(buf);
            return false;
        }
        true
    }

    /// Hands every frame waiting in the ring to `handle` with its arrival time, oldest first,
    /// and returns how many there were. Call it from the owner's engine only.
    pub(crate) fn drain(&self, mut handle: impl FnMut(&mut [u8], Instant)) -> usize {
        let mut n = 0;
        while let Some((mut buf, arrival)) = self.full.pop() {
            handle(&mut buf, arrival);
            let _ = self.free.push(buf);
            n += 1;
        }
        n
    }

    /// Whether no frame is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.full.is_empty()
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, transport::Device> {
        // A panic while holding the lock leaves the transport in an unknown state; the poison
        // is reported by the next call that sees it, here treated as fatal for the device.
        self.dev
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sleeps on `progress` for at most `timeout`, holding `dev` (this transport's lock, in
    /// which the caller found nothing to take) until the wait releases it; returns it again.
    pub(crate) fn wait_progress<'a>(
        &self,
        dev: MutexGuard<'a, transport::Device>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, transport::Device> {
        // Counted under the lock: an engine changes the transport under it and reads the
        // count after releasing it, so it sees this waiter whenever the change came after
        // the caller's check.
        self.progress_sleepers.fetch_add(1, Ordering::SeqCst);
        let dev = self
            .progress
            .wait_timeout(dev, timeout)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
        self.progress_sleepers.fetch_sub(1, Ordering::SeqCst);
        dev
    }

    /// Call after a turn that may have completed work, with the transport's lock released:
    /// wakes the threads in [`Shared::wait_progress`] and the async waiters.
    pub(crate) fn notify(&self) {
        if self.progress_sleepers.load(Ordering::SeqCst) > 0 {
            self.progress.notify_all();
        }
        let wakers = std::mem::take(
            &mut *self
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for w in wakers {
            w.wake();
        }
    }

    pub(crate) fn kick(&self) {
        let _ = self.wake.write(1);
    }
}

/// The engines of an inline device, when one last ran, and the sockets' second descriptors
/// its helper thread sleeps on.
pub(crate) struct Inline {
    pub(crate) engines: Mutex<Vec<Engine<TransportHandler>>>,
    pub(crate) clock: Clock,
    /// [`Clock`] time of the last turn, by any thread.
    pub(crate) last_turn: AtomicU64,
    /// [`Clock`] time of the last turn by an application thread (a verb call); 0 once an
    /// application thread is about to block ([`Inline::app_blocks`]).
    pub(crate) last_app_turn: AtomicU64,
    /// Whether the helper thread sleeps on the kicks only, leaving arriving frames to an
    /// application thread that polls (`api::inline_helper`).
    pub(crate) watching: AtomicBool,
    /// Whether an application thread's turn left frames in a TX ring unkicked
    /// ([`Engine::turn_and_report_with`]): the next turn, of whichever thread, sends them.
    pub(crate) kick_owed: AtomicBool,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline").finish_non_exhaustive()
    }
}

impl Inline {
    /// One turn of every queue's engine from an application thread (a verb call), unless
    /// another thread is running them right now (then that thread's turn serves this caller
    /// too, or the caller kicks the helper). Returns whether it ran.
    pub(crate) fn turn(&self) -> bool {
        self.run(true, true)
    }

    /// [`Inline::turn`] right after a post: what the turn transmits is kicked at once.
    pub(crate) fn turn_to_send(&self) -> bool {
        self.run(true, false)
    }

    /// Call from an application thread about to sleep until something arrives (a CQ armed
    /// for an event, a wait for a completion, a CM or async event, an async task's waker
    /// registered): no application thread is taken to be polling any more, and a helper
    /// that was leaving arriving frames to it is kicked (on `sh`, any of the device's
    /// transports) to sleep on the sockets again, so the frame this thread waits for is
    /// handled when it comes rather than at the helper's next look; so is a helper that
    /// owes the TX rings a kick this thread's last turn left ([`Inline::kick_owed`]).
    pub(crate) fn app_blocks(&self, sh: &Shared) {
        // SeqCst against the helper's store of `watching` before its load of
        // `last_app_turn`: either it sees this 0, or this sees it watching and kicks.
        self.last_app_turn.store(0, Ordering::SeqCst);
        if self.watching.load(Ordering::SeqCst) || self.kick_owed.load(Ordering::SeqCst) {
            sh.kick();
        }
    }

    /// [`Inline::turn`] from an application thread that sleeps next if the turn brings it
    /// nothing (`wait_cq`, `wait_event`, `wait_cm_event`): it does not count as polling, so
    /// the helper keeps sleeping on the sockets for it.
    pub(crate) fn turn_before_wait(&self) -> bool {
        self.run(false, false)
    }

    /// [`Inline::turn`] from the device's helper thread.
    pub(crate) fn helper_turn(&self) -> bool {
        self.run(false, false)
    }

    /// One turn of every engine: `app` for an application thread's (counted as polling),
    /// `defer_kick` to leave what a receiving turn transmits for the next turn's kick.
    fn run(&self, app: bool, defer_kick: bool) -> bool {
        let Ok(mut engines) = self.engines.try_lock() else {
            return false;
        };
        let now = self.clock.now();
        let mut owed = false;
        for e in engines.iter_mut() {
            // An application thread's turn that received leaves its transmits for the
            // thread's next verb call (its answer, most often), one kick for both.
            e.turn_and_report_with(now, defer_kick);
            owed |= e.kick_owed();
        }
        self.kick_owed.store(owed, Ordering::SeqCst);
        self.last_turn.store(now.as_nanos(), Ordering::Relaxed);
        if app {
            self.last_app_turn.store(now.as_nanos(), Ordering::Relaxed);
        }
        true
    }
}

/// The engine handler that drives the transport: frames in, frames out, timers.
pub(crate) struct TransportHandler {
    /// This queue's transport.
    pub(crate) shared: Arc<Shared>,
    /// This queue's place in `all`.
    pub(crate) index: usize,
    /// Every transport of the device (one unless sharded), for frames of other queues' QPs.
    pub(crate) all: Arc<[Arc<Shared>]>,
    pub(crate) activity: bool,
    /// The interface's MAC: a frame the transport addresses to it loops back.
    pub(crate) mac: [u8; 6],
    /// The AF_XDP queue this handler serves, as capture records name it.
    pub(crate) queue: u32,
    /// The device's capture state (`roce dump`), read once per batch.
    pub(crate) capture: Arc<Capture>,
}

/// The capture record's drop code of a transport drop counter.
fn drop_code(d: DropCounter) -> u8 {
    match d {
        DropCounter::Device(i) => reason_device(i),
        DropCounter::Qp(i) => reason_qp(i),
    }
}

/// How many loopback frames one transmit pass hands back to the receive path at most, so a
/// large loopback transfer does not keep a turn from its other work.
const LOOPBACK_PER_TURN: usize = 64;

impl TransportHandler {
    /// The transport that owns `frame`'s QP: this queue's, unless the device is sharded and
    /// the DestQP names another one ([`transport::Shard::of_qpn`]).
    fn owner(&self, frame: &[u8]) -> usize {
        let count = self.all.len();
        if count == 1 {
            return self.index;
        }
        crate::wire::peek::dest_qpn(frame).map_or(self.index, |qpn| {
            transport::Shard::of_qpn(count as u32, transport::Qpn::new(qpn)) as usize
        })
    }
}

impl TransportHandler {
    /// Handles one received frame with this queue's transport, locked at most once for the
    /// whole batch (`dev` holds the guard from the first frame that needs it on). A frame of
    /// another queue's QP is copied into that queue's [`Inbox`] and `kick` gets the queue's
    /// bit, so that its engine is woken once after the batch.
    ///
    /// `capture` is `Some(flags)` while `roce dump` captures (read once per batch): the frame
    /// is then recorded as received, with `flags` ([`DIR_LOOPBACK`] for a looped-back frame)
    /// and the name of the counter that counted it as dropped, if one did.
    ///
    /// `arrival` is when the frame arrived (its arrival stamp, see [`super::Clock::arrival`];
    /// `now` for a frame without one or with an untimed one): the transport's notification
    /// and reaction points and Swift's RTT samples go by it.
    #[allow(clippy::too_many_arguments, reason = "the per-frame state of a batch")]
    fn route<'a>(
        &'a self,
        now: Instant,
        arrival: Instant,
        frame: &mut [u8],
        dev: &mut Option<MutexGuard<'a, transport::Device>>,
        kick: &mut u64,
        capture: Option<u8>,
    ) {
        let owner = self.owner(frame);
        let mut reason = 0;
        if owner == self.index {
            let d = dev.get_or_insert_with(|| self.shared.lock());
            if capture.is_some() {
                reason = d
                    .handle_packet_traced_at(now, arrival, frame)
                    .map_or(0, drop_code);
            } else {
                d.handle_packet_at(now, arrival, frame);
            }
        } else if self.all[owner].inbox.push(frame, arrival) {
            *kick |= 1u64 << (owner % 64);
        } else {
            let d = dev.get_or_insert_with(|| self.shared.lock());
            let before = *d.device_counters();
            d.count_rx_other_queue_dropped();
            reason = DropCounter::device_delta(&before, d.device_counters()).map_or(0, drop_code);
        }
        if let Some(flags) = capture {
            let qpn = crate::wire::peek::dest_qpn(frame).unwrap_or(NO_QPN);
            self.capture
                .record(self.queue, DIR_RX | flags, qpn, reason, frame);
        }
    }

    /// Wakes the engines of the queues whose bits are set in `kick`.
    fn kick(&self, kick: u64) {
        if kick == 0 {
            return;
        }
        for (i, other) in self.all.iter().enumerate() {
            if kick & (1u64 << (i % 64)) != 0 {
                other.kick();
            }
        }
    }

    /// Handles the frames other queues handed to this one, with this queue's transport
    /// (locked at most once), and counts them (`rx_other_queue`).
    fn drain_inbox<'a>(
        &'a self,
        now: Instant,
        dev: &mut Option<MutexGuard<'a, transport::Device>>,
    ) -> bool {
        let inbox = &self.shared.inbox;
        if inbox.is_empty() {
            return false;
        }
        let dev = dev.get_or_insert_with(|| self.shared.lock());
        inbox.drain(|frame, arrival| {
            dev.count_rx_other_queue();
            dev.handle_packet_at(now, arrival, frame);
        }) > 0
    }
}

impl Handler for TransportHandler {
    fn on_rx(&mut self, now: Instant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        let (mut dev, mut kick) = (None, 0);
        let capture = self.capture.active().then_some(0);
        self.route(now, now, frame, &mut dev, &mut kick, capture);
        let activity = dev.is_some();
        drop(dev);
        self.kick(kick);
        self.activity |= activity;
        RxVerdict::Recycle
    }

    /// The receive path: this queue's transport is locked once for the batch (and not at all
    /// for a batch with nothing for it), frames of other queues' QPs go to their owners'
    /// rings without a lock, and the frames other queues handed over are handled here.
    fn on_rx_batch(
        &mut self,
        now: Instant,
        receive: &mut dyn FnMut(&mut RxFrameFn<'_>) -> u32,
    ) -> u32 {
        let (mut dev, mut kick) = (None, 0u64);
        let this = &*self;
        let capture = this.capture.active().then_some(0);
        let n = receive(&mut |frame, arrival, _tx| {
            this.route(now, arrival, frame, &mut dev, &mut kick, capture);
            RxVerdict::Recycle
        });
        let handed = this.drain_inbox(now, &mut dev);
        let activity = dev.is_some() || handed;
        drop(dev);
        self.kick(kick);
        self.activity |= activity;
        n
    }

    /// The transmit path. A frame addressed to this interface's own MAC (a QP connected to
    /// another QP of this device: loopback, as rxe serves it through its own receive path,
    /// rxe_net.c `rxe_loopback`) goes straight back into the receive path instead of onto
    /// the wire, where no one would bring it back; at most [`LOOPBACK_PER_TURN`] per turn, and
    /// the engine is woken for the rest.
    fn poll_transmit(&mut self, now: Instant, tx: &mut TxSink<'_>) {
        let this = &*self;
        let (mut dev, mut kick) = (Some(this.shared.lock()), 0u64);
        let (mut looped, mut active) = (0, false);
        let capture = this.capture.active();
        while tx.room() > 0 && looped < LOOPBACK_PER_TURN {
            let (mut sent, mut back) = (false, false);
            let _ = tx.send(|buf| {
                let Some(t) = dev.as_mut().and_then(|d| d.poll_transmit(now, buf)) else {
                    return 0;
                };
                sent = true;
                let frame = &mut buf[..t.size];
                let loopback = frame.get(..6) == Some(&this.mac[..]);
                if capture {
                    let dir = if loopback {
                        DIR_TX | DIR_LOOPBACK
                    } else {
                        DIR_TX
                    };
                    this.capture
                        .record(this.queue, dir, t.qpn.value(), 0, frame);
                }
                if loopback {
                    back = true;
                    let capture = capture.then_some(DIR_LOOPBACK);
                    this.route(now, now, frame, &mut dev, &mut kick, capture);
                    return 0;
                }
                t.size
            });
            if !sent {
                break;
            }
            looped += usize::from(back);
            active = true;
        }
        if looped == LOOPBACK_PER_TURN {
            // More may be waiting to loop back: come back at once rather than after a sleep.
            this.shared.kick();
        }
        let dev = dev.unwrap_or_else(|| this.shared.lock());
        this.kick(kick);
        let events = dev.has_events();
        drop(dev);
        self.activity |= active;
        if std::mem::take(&mut self.activity) {
            self.shared.notify();
        }
        if events {
            self.shared.events.notify_all();
        }
    }

    fn next_timeout(&self) -> Option<Instant> {
        self.shared.lock().poll_timeout()
    }

    fn on_timeout(&mut self, now: Instant) {
        self.shared.lock().handle_timeout(now);
        self.activity = true;
    }

    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.shared.wake.as_fd())
    }

    fn on_woken(&mut self) {
        // Everything posted before the signal is visible to the next turn, under the lock.
        let _ = self.shared.wake.read();
        // A verb call kicked: it may have completed work without a frame (a modify to ERR
        // flushes WRs into the CQs, a post to a QP in ERR completes at once), so the turn
        // notifies the waiters (threads in `wait_cq`, async tasks) even if it sends nothing.
        self.activity = true;
    }

    fn on_queue_stats(&mut self, queue_id: u32, stats: &XskStats) {
        self.shared
            .xsk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(queue_id, *stats);
    }
}

#[cfg(test)]
mod tests {
    use super::{Inbox, Instant};

    const T: Instant = Instant::from_nanos(7);

    #[test]
    fn inbox_hands_frames_over_in_order_and_counts_a_full_ring_as_refused() {
        let inbox = Inbox::new(2, 8);
        assert!(inbox.is_empty());
        assert!(inbox.push(b"one", T));
        assert!(inbox.push(b"two", T));
        // Full: the third frame is refused (the caller counts it), nothing is overwritten.
        assert!(!inbox.push(b"three", T));
        let mut seen = Vec::new();
        assert_eq!(
            inbox.drain(|f, at| {
                assert_eq!(at, T);
                seen.push(f.to_vec());
            }),
            2
        );
        assert_eq!(seen, [b"one".to_vec(), b"two".to_vec()]);
        assert!(inbox.is_empty());
        // The buffers came back: the ring takes two more.
        assert!(inbox.push(b"3", T));
        assert!(inbox.push(b"4", T));
        assert_eq!(inbox.drain(|_, _| {}), 2);
    }

    #[test]
    fn inbox_refuses_a_frame_longer_than_a_slot_and_never_reallocates() {
        let inbox = Inbox::new(1, 4);
        assert!(!inbox.push(b"12345", T));
        assert!(inbox.push(b"1234", T));
        inbox.drain(|f, _| {
            assert_eq!(f, b"1234");
        });
    }

    #[test]
    fn inbox_is_shared_by_producer_threads_without_a_lock() {
        let inbox = std::sync::Arc::new(Inbox::new(64, 16));
        let producers: Vec<_> = (0..2u8)
            .map(|t| {
                let inbox = std::sync::Arc::clone(&inbox);
                std::thread::spawn(move || (0..32u8).filter(|i| inbox.push(&[t, *i], T)).count())
            })
            .collect();
        let pushed: usize = producers.into_iter().map(|p| p.join().unwrap()).sum();
        let mut per_producer = [Vec::new(), Vec::new()];
        let drained = inbox.drain(|f, _| per_producer[usize::from(f[0])].push(f[1]));
        assert_eq!((pushed, drained), (64, 64));
        // Each producer's frames arrive in the order it sent them.
        for seq in per_producer {
            assert_eq!(seq, (0..32).collect::<Vec<u8>>());
        }
    }
}
