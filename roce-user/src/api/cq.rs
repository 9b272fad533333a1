//! Waiting for completions: blocking ([`Device::wait_cq`]) and async ([`Device::cq_ready`],
//! and under it [`Device::poll_cq_or_wake`], on which [`super::asynch`] is built).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::{Duration, Instant as StdInstant},
};

use super::{CqId, Device, INLINE_IDLE_TURN, Wc};
use crate::engine::driver::{Inline, Shared};

impl Device {
    /// Waits up to `timeout` for a completion on `cq` (the blocking form of `ibv_get_cq_event`
    /// plus `ibv_poll_cq`).
    #[must_use]
    pub fn wait_cq(&self, cq: CqId, timeout: Duration) -> Option<Wc> {
        let deadline = StdInstant::now() + timeout;
        let (queue, cq) = self.split_cq(cq);
        let sh = &self.shards[queue as usize];
        if let Some(inline) = &self.inline {
            return Self::wait_cq_inline(sh, inline, cq, deadline);
        }
        let mut dev = sh.lock();
        loop {
            if let Some(wc) = dev.poll_cq(cq) {
                return Some(wc);
            }
            let left = deadline.checked_duration_since(StdInstant::now())?;
            dev = sh.wait_progress(dev, left.min(Duration::from_millis(50)));
        }
    }

    /// [`Device::wait_cq`] of an inline device: turns, then waits on the condition variable
    /// that turns notify (the helper thread's, on a frame's arrival; another thread's verb
    /// call), at most [`INLINE_IDLE_TURN`] at a time.
    fn wait_cq_inline(sh: &Shared, inline: &Inline, cq: CqId, deadline: StdInstant) -> Option<Wc> {
        loop {
            inline.turn_before_wait();
            let mut dev = sh.lock();
            if let Some(wc) = dev.poll_cq(cq) {
                return Some(wc);
            }
            let left = deadline.checked_duration_since(StdInstant::now())?;
            inline.app_blocks(sh);
            drop(sh.wait_progress(dev, left.min(INLINE_IDLE_TURN)));
        }
    }

    /// A future that resolves with the next completion of `cq` (async wait). It takes
    /// completions in CQ order, whoever posted them: one task per CQ should await it. For
    /// per-work-request futures use [`super::asynch`], which dispatches each completion to the
    /// future of its work request.
    #[must_use]
    pub fn cq_ready(&self, cq: CqId) -> CqReady<'_> {
        CqReady { dev: self, cq }
    }

    /// The poll step of every async wait for completions (`ibv_poll_cq` plus the arming half
    /// of `ibv_req_notify_cq`, in one atomic step): moves up to `out.len()` completions of
    /// `cq` into `out` and returns how many; when there are none, registers `waker` to be
    /// woken by the next engine turn that makes progress, before the CQ's lock is released,
    /// so a completion that arrives in between still wakes it. On an inline device
    /// ([`super::DeviceOptions::inline`]) it runs an engine turn first, as
    /// [`Device::poll_cq_into`] does.
    ///
    /// Call it from a `Future::poll` or `Stream::poll_next` with the context's waker, and keep
    /// calling it until it returns 0: only a call that returns 0 registers the waker. A waker
    /// is registered once however often it is offered (`Waker::will_wake`), and woken at most
    /// once per registration; an unknown CQ yields 0 and the waker waits for the next turn.
    pub fn poll_cq_or_wake(&self, cq: CqId, out: &mut [Wc], waker: &Waker) -> usize {
        self.drive();
        let (queue, raw) = self.split_cq(cq);
        let sh = &self.shards[queue as usize];
        let mut dev = sh.lock();
        let n = dev.poll_cq_into(raw, out);
        if n == 0 {
            // Register before releasing the device lock: engines notify only after they
            // released it following their own updates, so a completion cannot slip between the
            // check and this.
            let mut wakers = sh
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !wakers.iter().any(|w| w.will_wake(waker)) {
                wakers.push(waker.clone());
            }
            drop(wakers);
            // The task sleeps until a turn wakes it.
            self.app_blocks(sh);
        }
        drop(dev);
        n
    }
}

/// The future of [`Device::cq_ready`].
#[derive(Debug)]
pub struct CqReady<'a> {
    dev: &'a Device,
    cq: CqId,
}

impl Future for CqReady<'_> {
    type Output = Wc;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Wc> {
        let mut wc = [Wc::default(); 1];
        if self.dev.poll_cq_or_wake(self.cq, &mut wc, cx.waker()) == 1 {
            Poll::Ready(wc[0])
        } else {
            Poll::Pending
        }
    }
}
