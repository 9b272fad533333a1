//! Waiting for completions: blocking ([`Device::wait_cq`]) and async ([`Device::cq_ready`]).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
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
            dev = sh
                .progress
                .wait_timeout(dev, left.min(Duration::from_millis(50)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// [`Device::wait_cq`] of an inline device: turns, then waits on the condition variable
    /// that turns notify (the helper thread's, on a frame's arrival; another thread's verb
    /// call), at most [`INLINE_IDLE_TURN`] at a time.
    fn wait_cq_inline(sh: &Shared, inline: &Inline, cq: CqId, deadline: StdInstant) -> Option<Wc> {
        loop {
            inline.turn();
            let mut dev = sh.lock();
            if let Some(wc) = dev.poll_cq(cq) {
                return Some(wc);
            }
            let left = deadline.checked_duration_since(StdInstant::now())?;
            drop(
                sh.progress
                    .wait_timeout(dev, left.min(INLINE_IDLE_TURN))
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
    }

    /// A future that resolves with the next completion of `cq` (async wait).
    #[must_use]
    pub fn cq_ready(&self, cq: CqId) -> CqReady<'_> {
        CqReady { dev: self, cq }
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
        let (queue, cq) = self.dev.split_cq(self.cq);
        let sh = &self.dev.shards[queue as usize];
        let mut dev = sh.lock();
        if let Some(wc) = dev.poll_cq(cq) {
            return Poll::Ready(wc);
        }
        // Register before releasing the device lock: engines notify only while not holding it
        // after their own updates, so a completion cannot slip between the check and this.
        sh.wakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(cx.waker().clone());
        drop(dev);
        Poll::Pending
    }
}
