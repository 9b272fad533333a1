//! Which QPs the device must look at: a ready queue for transmission and a timer set ordered by
//! deadline, so that an engine turn costs what the touched QPs cost, not what every QP costs.
//!
//! The device marks a QP *ready* after every input that reached it (a received packet, a post,
//! a modify, a fired timer, a CNP, a congestion-control change): that input may have given it
//! something to send. [`Device::poll_transmit`](super::Device::poll_transmit) serves ready QPs
//! in round-robin order, one frame at a time, and drops a QP from the queue when it has nothing
//! more to send now. A QP whose pacer holds data back leaves the queue too; its pacer deadline
//! is in the timer set, and firing it makes the QP ready again.
//!
//! The timer set holds one `(deadline, QPN)` entry per QP with an armed timer (its
//! retransmission or RNR timer, or a DCQCN timer or pacer release), refreshed after every
//! input to that QP. `poll_timeout` is the set's first entry; `handle_timeout` visits only the
//! due QPs. quinn-proto keeps its connections' timers the same way (a heap of deadlines in the
//! endpoint driver), and so does the kernel's rxe, with one kernel timer per QP.

use std::collections::{BTreeSet, VecDeque};

use super::{qp::Qp, timer::Instant};

/// A QP's place in the [`Schedule`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QpSched {
    /// Whether the QP has an entry in the ready queue.
    pub(crate) queued: bool,
    /// The deadline of its entry in the timer set, if it has one.
    pub(crate) deadline: Option<Instant>,
}

/// The ready queue and the timer set of a device.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// QPNs that may have a frame to send, in service order. An entry whose QP is gone or no
    /// longer `queued` is skipped.
    ready: VecDeque<u32>,
    /// QPs passed over by the current `poll_transmit` call (their frames do not fit its
    /// buffer); put back at the end of the call. Kept here so its capacity is reused.
    deferred: Vec<u32>,
    /// `(deadline, QPN)` for every QP with an armed timer.
    timers: BTreeSet<(Instant, u32)>,
    /// Scratch list of the QPNs due in `handle_timeout`.
    due: Vec<u32>,
}

impl Schedule {
    /// Call after any input that reached `qp`: queues it for transmission and refreshes its
    /// timer entry.
    pub(crate) fn touch(&mut self, qp: &mut Qp) {
        if !qp.sched.queued {
            qp.sched.queued = true;
            self.ready.push_back(qp.qpn.value());
        }
        self.refresh(qp);
    }

    /// Call after `qp`'s timers may have changed without a reason to queue it (it was just
    /// served by `poll_transmit`).
    pub(crate) fn refresh(&mut self, qp: &mut Qp) {
        let next = qp.next_deadline();
        if next == qp.sched.deadline {
            return;
        }
        let k = qp.qpn.value();
        if let Some(old) = qp.sched.deadline {
            self.timers.remove(&(old, k));
        }
        if let Some(new) = next {
            self.timers.insert((new, k));
        }
        qp.sched.deadline = next;
    }

    /// Call when `qp` is destroyed: drops its timer entry (a stale ready entry is skipped).
    pub(crate) fn forget(&mut self, qp: &Qp) {
        if let Some(old) = qp.sched.deadline {
            self.timers.remove(&(old, qp.qpn.value()));
        }
    }

    /// The next QPN to serve, if any.
    pub(crate) fn pop_ready(&mut self) -> Option<u32> {
        self.ready.pop_front()
    }

    /// Puts a QP that just sent a frame at the back of the queue (it stays `queued`).
    pub(crate) fn requeue(&mut self, k: u32) {
        self.ready.push_back(k);
    }

    /// Passes over a QP for the rest of this `poll_transmit` call (it stays `queued`).
    pub(crate) fn defer(&mut self, k: u32) {
        self.deferred.push(k);
    }

    /// Call at the end of every `poll_transmit` call: the deferred QPs go back in the queue.
    pub(crate) fn end_transmit(&mut self) {
        self.ready.extend(self.deferred.drain(..));
    }

    /// The earliest deadline in the timer set.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Removes the entries due at `now` and returns their QPNs, to be handed back with
    /// [`Schedule::put_due`] after they are handled. Each due QP is listed once.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<u32> {
        let mut due = core::mem::take(&mut self.due);
        due.clear();
        while let Some(&(t, k)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            due.push(k);
        }
        due
    }

    /// Returns the list [`Schedule::take_due`] gave out, so its capacity is reused.
    pub(crate) fn put_due(&mut self, due: Vec<u32>) {
        self.due = due;
    }

    /// How many QPs are in the ready queue (stale entries included); for tests.
    #[cfg(test)]
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// How many timer entries there are; for tests.
    #[cfg(test)]
    pub(crate) fn timer_len(&self) -> usize {
        self.timers.len()
    }
}
