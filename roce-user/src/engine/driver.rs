//! The driver between the engines and the transport: one [`Shared`] transport per queue (one
//! per device unless sharded), the [`TransportHandler`] each queue's engine runs, and the
//! [`Inline`] engines that application threads drive themselves. A received frame goes from
//! the engine through this file to the transport and nowhere else.

use std::{
    os::fd::AsFd as _,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    task::Waker,
    time::Duration,
};

use nix::sys::eventfd::EventFd;

use super::{Clock, Engine, Handler, Instant, RxVerdict, TxSink};
use crate::{
    transport,
    xsk::{XskQueue, XskStats},
};

/// What the engines and the application threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) dev: Mutex<transport::Device>,
    /// Signalled by the engines after input that may have completed work.
    pub(crate) progress: Condvar,
    /// Async waiters, woken with `progress`.
    pub(crate) wakers: Mutex<Vec<Waker>>,
    /// Makes the engines' poll(2) return, after a post.
    pub(crate) wake: EventFd,
    /// The latest AF_XDP counters of each queue, as the engines report them.
    pub(crate) xsk: Mutex<std::collections::BTreeMap<u32, XskStats>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, transport::Device> {
        // A panic while holding the lock leaves the transport in an unknown state; the poison
        // is reported by the next call that sees it, here treated as fatal for the device.
        self.dev
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn notify(&self) {
        self.progress.notify_all();
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

/// The engines of an inline device and when one last ran.
pub(crate) struct Inline {
    pub(crate) engines: Mutex<Vec<Engine<TransportHandler>>>,
    pub(crate) clock: Clock,
    /// [`Clock`] time of the last turn.
    pub(crate) last_turn: AtomicU64,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline").finish_non_exhaustive()
    }
}

impl Inline {
    /// One turn of every queue's engine, unless another thread is running them right now
    /// (then that thread's turn serves this caller too). Returns whether it ran.
    pub(crate) fn turn(&self) -> bool {
        let Ok(mut engines) = self.engines.try_lock() else {
            return false;
        };
        let now = self.clock.now();
        for e in engines.iter_mut() {
            e.turn_and_report(now);
        }
        self.last_turn.store(now.as_nanos(), Ordering::Relaxed);
        true
    }

    /// Waits up to `timeout` for a frame on any queue (or transmit room); called with no
    /// engine running so that the caller's next turn handles it.
    pub(crate) fn wait(&self, timeout: Duration, wake: &EventFd) {
        let Ok(engines) = self.engines.lock() else {
            return;
        };
        let queues: Vec<&XskQueue> = engines.iter().map(Engine::queue).collect();
        let _ = XskQueue::wait_any(&queues, Some(timeout), Some(wake.as_fd()));
        // Cleared after the wait, as Handler::on_woken does: the caller's next turn sees what
        // was posted before the signal.
        let _ = wake.read();
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
}

impl TransportHandler {
    /// The transport that owns `frame`'s QP: this queue's, unless the device is sharded and
    /// the DestQP names another one ([`transport::Shard::of_qpn`]).
    fn owner(&self, frame: &[u8]) -> usize {
        let count = self.all.len();
        if count == 1 {
            return self.index;
        }
        crate::wire::peek::dest_qpn(frame).map_or(self.index, |qpn| {
            transport::Shard::of_qpn(count as u32, qpn) as usize
        })
    }
}

impl Handler for TransportHandler {
    fn on_rx(&mut self, now: Instant, frame: &mut [u8], _tx: &mut TxSink<'_>) -> RxVerdict {
        let owner = self.owner(frame);
        if owner == self.index {
            self.shared.lock().handle_packet_mut(now, frame);
            self.activity = true;
        } else {
            // Another queue's QP: its transport handles the frame, and its engine sends what
            // that produced (ACKs, responses) on its own queue.
            let other = &self.all[owner];
            {
                let mut dev = other.lock();
                dev.count_rx_other_queue();
                dev.handle_packet_mut(now, frame);
            }
            other.kick();
            other.notify();
        }
        RxVerdict::Recycle
    }

    fn poll_transmit(&mut self, now: Instant, tx: &mut TxSink<'_>) {
        let mut dev = self.shared.lock();
        while tx.room() > 0 {
            let mut sent = false;
            let _ = tx.send(|buf| match dev.poll_transmit(now, buf) {
                Some(t) => {
                    sent = true;
                    t.size
                }
                None => 0,
            });
            if !sent {
                break;
            }
            self.activity = true;
        }
        drop(dev);
        if std::mem::take(&mut self.activity) {
            self.shared.notify();
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
    }

    fn on_queue_stats(&mut self, queue_id: u32, stats: &XskStats) {
        self.shared
            .xsk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(queue_id, *stats);
    }
}
