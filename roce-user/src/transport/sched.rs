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
//! The in-flight budget bounds the PSNs sent and not yet acknowledged over all QPs, each QP
//! counting the rest of the message it is sending too
//! ([`DeviceConfig::max_inflight_pkts`](super::DeviceConfig::max_inflight_pkts)). Each QP's
//! count is refreshed with its timer entry; a QP with a new message to start while the sum is
//! at the limit waits in a blocked list until ACKs bring the sum down. Started messages,
//! retransmissions, ACKs and READ responses are never held back by it, so the sum may pass
//! the limit by up to one window per QP that started a message just under it.
//!
//! The timer set holds at most one `(deadline, QPN)` entry per QP, no later than the QP's
//! earliest armed timer (its retransmission or RNR timer, or a DCQCN timer or pacer release),
//! refreshed after every input to that QP. An entry is moved only when the QP's deadline comes
//! earlier; one left early fires, finds nothing due and is put back at the real deadline. `poll_timeout` is the set's first entry; `handle_timeout` visits only the
//! due QPs. quinn-proto keeps its connections' timers the same way (a heap of deadlines in the
//! endpoint driver), and so does the kernel's rxe, with one kernel timer per QP.

use std::collections::{BTreeSet, VecDeque};

use super::{qp::Qp, timer::Instant};

/// A QP's place in the [`Schedule`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QpSched {
    /// Whether the QP has an entry in the ready queue.
    pub(crate) queued: bool,
    /// The deadline of its entry in the timer set, if it has one: no later than its earliest
    /// armed timer (earlier if that timer moved later or stopped since).
    pub(crate) deadline: Option<Instant>,
    /// Whether it waits in the blocked list for the in-flight budget.
    pub(crate) blocked: bool,
    /// Its unacknowledged PSNs as last counted into [`Schedule::inflight`].
    pub(crate) inflight: u32,
}

/// The ready queue, the timer set and the in-flight budget of a device.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// Unacknowledged PSNs over all QPs (the sum of their `QpSched::inflight`).
    inflight: u64,
    /// `DeviceConfig::max_inflight_pkts` (0: no limit).
    max_inflight: u32,
    /// QPs that had a new message to start when the budget was used up, in the order they
    /// asked; while the sum is under the limit they go back to the ready queue one at a time
    /// (each refresh releases one), not all at once: releasing every waiting QP on each ACK
    /// had each of them refused again, an O(QPs) cost per ACK with 1024 QPs.
    blocked: VecDeque<u32>,
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
    /// An empty schedule whose in-flight budget is `max_inflight` PSNs (0: no limit).
    pub(crate) fn new(max_inflight: u32) -> Self {
        Self {
            max_inflight,
            ..Self::default()
        }
    }

    /// Whether QPs may send packets with new PSNs: the in-flight sum is under the budget.
    pub(crate) fn fresh_ok(&self) -> bool {
        self.max_inflight == 0 || self.inflight < u64::from(self.max_inflight)
    }

    /// Call when `qp` had new packets to send but [`Schedule::fresh_ok`] said no: it waits in
    /// the blocked list (it stays out of the ready queue until then).
    pub(crate) fn block(&mut self, qp: &mut Qp) {
        if !qp.sched.blocked {
            qp.sched.blocked = true;
            self.blocked.push_back(qp.qpn.value());
        }
    }

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
        let unacked = qp.unacked_psns();
        let was = qp.sched.inflight;
        if unacked != was {
            self.inflight = self.inflight + u64::from(unacked) - u64::from(was);
            qp.sched.inflight = unacked;
        }
        self.release_one();
        // Entries are lazy: one that is due no later than the QP's real deadline stays (it
        // fires, finds nothing due, and is put back at the real deadline). The retransmission
        // timer moves later on every ACK, and re-keying the set for each cost more than the
        // old scan of one QP did.
        let Some(next) = qp.next_deadline() else {
            return;
        };
        if qp.sched.deadline.is_some_and(|old| old <= next) {
            return;
        }
        let k = qp.qpn.value();
        if let Some(old) = qp.sched.deadline {
            self.timers.remove(&(old, k));
        }
        self.timers.insert((next, k));
        qp.sched.deadline = Some(next);
    }

    /// If the budget has room, moves the longest-waiting blocked QP back to the ready queue (it
    /// keeps its `blocked` mark until it is served). Called by every [`Self::refresh`]; call it
    /// also where a ready entry is dropped without serving its QP (destroyed, or already
    /// served to exhaustion): that entry may have been this release, and a release that serves
    /// nobody would be a lost wake-up. A blocked-list entry goes stale when its QP is served
    /// through the ready queue first (an ACK touched it); once the ACKs stop, only a release
    /// passed on this way reaches the QPs still waiting behind it.
    pub(crate) fn release_one(&mut self) {
        if self.fresh_ok()
            && let Some(k) = self.blocked.pop_front()
        {
            self.ready.push_back(k);
        }
    }

    /// Call when `qp` is destroyed: drops its timer entry and its share of the in-flight sum
    /// (a stale ready or blocked entry is skipped).
    pub(crate) fn forget(&mut self, qp: &Qp) {
        if let Some(old) = qp.sched.deadline {
            self.timers.remove(&(old, qp.qpn.value()));
        }
        self.inflight -= u64::from(qp.sched.inflight);
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
        if !self.deferred.is_empty() {
            self.ready.extend(self.deferred.drain(..));
        }
    }

    /// The earliest entry of the timer set, which may be stale (earlier than its QP's real
    /// deadline): see [`Schedule::rekey`].
    pub(crate) fn first_timer(&self) -> Option<(Instant, u32)> {
        self.timers.first().copied()
    }

    /// Replaces the stale first entry `(t, k)` with the QP's real deadline `real` (none: the
    /// entry goes). `qp` is QP `k`, if it still exists.
    pub(crate) fn rekey(&mut self, t: Instant, k: u32, qp: Option<&mut Qp>, real: Option<Instant>) {
        self.timers.remove(&(t, k));
        let Some(qp) = qp else { return };
        qp.sched.deadline = real;
        if let Some(r) = real {
            self.timers.insert((r, k));
        }
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

    /// The in-flight sum; for tests.
    #[cfg(test)]
    pub(crate) fn inflight(&self) -> u64 {
        self.inflight
    }

    /// How many timer entries there are; for tests.
    #[cfg(test)]
    pub(crate) fn timer_len(&self) -> usize {
        self.timers.len()
    }
}
