//! The receiver's reassembly state (docs/multipath.md, "Placement out of order, completions
//! in order").
//!
//! PSNs are unwrapped internally to a 64-bit sequence (`seq`) anchored at the expected PSN,
//! so the window and the messages are ordered without wrap-around; every PSN that comes in or
//! goes out is a 24-bit [`Psn`] compared with serial arithmetic (IBA 9.7.1, rxe
//! `psn_compare`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::wire::{
    Psn, WireError,
    multipath::{PlacementFlags, PlacementTrailer, SackBitmap, SackTrailer, Ssn},
};

/// What the receiver does with one arriving packet, as [`Reassembly::on_packet`] decides.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arrival {
    /// New: place `len` bytes of the packet's data at `offset` of its message now (WRITE and
    /// READ response: `va + offset`; SEND: the receive WQE the trailer's SSN names). Returned
    /// once per PSN, never again.
    Place {
        /// Byte offset in the message.
        offset: u32,
        /// Bytes to place.
        len: u32,
    },
    /// Already received (before the cumulative PSN, or its bit set): not placed again;
    /// acknowledge it again (IBA 9.7.5.1.2, duplicate requests are ACKed).
    Duplicate,
    /// Beyond the window: dropped and counted; the sender will resend it.
    BeyondWindow,
    /// A READ request or an atomic ([`Reassembly::on_held`]), new: held until every PSN
    /// before it has arrived, then returned by [`Reassembly::poll_completion`] (with
    /// [`Completion::held`]) for the responder to execute, in PSN order, once.
    Held,
    /// A SEND or WRITE packet after a READ request or an atomic that is held and not executed
    /// yet: not placed (the held request must not see its data), dropped and counted; the
    /// sender resends it.
    BehindHeld,
    /// Inconsistent with its trailer or with the messages seen so far: dropped and counted.
    Invalid(WireError),
}

/// A message whose packets have all been placed and every earlier message has completed:
/// the receiver completes it now (a CQE for a SEND or a WRITE with immediate, the READ's
/// requester-side completion), as verbs require, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Completion {
    /// The message's first PSN.
    pub first_psn: Psn,
    /// The message's last PSN.
    pub last_psn: Psn,
    /// The message's length, which equals the bytes placed.
    pub length: u32,
    /// The kind of message.
    pub flags: PlacementFlags,
    /// Its send sequence number.
    pub ssn: Ssn,
    /// A READ request or an atomic recorded by [`Reassembly::on_held`] (`length` 0): the
    /// responder executes it now, every request before it having completed.
    pub held: bool,
}

/// What the reassembly state counted (docs/multipath.md "Counters").
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReassemblyCounters {
    /// Packets placed.
    pub placed: u64,
    /// Packets placed while a PSN before them was missing (`ooo_placed`).
    pub ooo_placed: u64,
    /// Duplicates acknowledged, not placed.
    pub duplicates: u64,
    /// Packets beyond the window, dropped (`ooo_dropped_window`).
    pub ooo_dropped_window: u64,
    /// Packets inconsistent with their trailer, dropped.
    pub invalid: u64,
    /// Messages completed.
    pub completed: u64,
    /// READ requests and atomics held ([`Arrival::Held`]).
    pub held_requests: u64,
    /// SEND and WRITE packets dropped behind a held request ([`Arrival::BehindHeld`]).
    pub behind_held: u64,
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    last_seq: u64,
    length: u32,
    flags: PlacementFlags,
    ssn: Ssn,
    placed_bytes: u64,
    held: bool,
}

/// The per-QP reassembly state of the receiver.
#[derive(Clone, Debug)]
pub struct Reassembly {
    /// The expected PSN: every PSN before it arrived.
    epsn: Psn,
    /// `epsn` unwrapped.
    epsn_seq: u64,
    pmtu: u32,
    /// `received[i]`: PSN `epsn + i` arrived. Always `window` long; `received[0]` is false.
    received: VecDeque<bool>,
    held: u32,
    /// Messages with at least one packet placed and not yet completed, by first `seq`.
    msgs: BTreeMap<u64, Msg>,
    /// The first `seq` of each held request of `msgs` ([`Reassembly::on_held`]).
    held_seqs: BTreeSet<u64>,
    ready: VecDeque<Completion>,
    counters: ReassemblyCounters,
}

impl Reassembly {
    /// The largest window: a quarter of the PSN space, so serial comparison stays exact.
    pub const MAX_WINDOW: u32 = 1 << 21;

    /// The state of a QP whose next expected PSN is `epsn` (the RTR transition's `rq_psn`),
    /// with a window of `window` PSNs (clamped to `1..=MAX_WINDOW`; the sender's window must
    /// not exceed it) and path MTU `pmtu` bytes. Call it when the extension turns on for the
    /// QP (docs/multipath.md, "Agreeing on the extension").
    #[must_use]
    pub fn new(epsn: Psn, window: u32, pmtu: u32) -> Self {
        let window = window.clamp(1, Self::MAX_WINDOW);
        Self {
            epsn,
            epsn_seq: 1 << 32,
            pmtu: pmtu.max(1),
            received: VecDeque::from(vec![false; window as usize]),
            held: 0,
            msgs: BTreeMap::new(),
            held_seqs: BTreeSet::new(),
            ready: VecDeque::new(),
            counters: ReassemblyCounters::default(),
        }
    }

    /// The next expected PSN (the AETH of the next ACK acknowledges the PSN before it).
    #[must_use]
    pub const fn epsn(&self) -> Psn {
        self.epsn
    }

    /// The window in PSNs.
    #[must_use]
    pub fn window(&self) -> u32 {
        self.received.len() as u32
    }

    /// Out-of-order packets held (arrived beyond a hole).
    #[must_use]
    pub const fn held(&self) -> u32 {
        self.held
    }

    /// Whether nothing is in progress: no packet held beyond a hole, no message partly
    /// placed, no completion waiting. Only then may the QP hand its receive side back to the
    /// in-order responder (a plain packet at the expected PSN), which takes up at
    /// [`Self::epsn`] with no message open.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.held == 0 && self.msgs.is_empty() && self.ready.is_empty()
    }

    /// The counters.
    #[must_use]
    pub const fn counters(&self) -> &ReassemblyCounters {
        &self.counters
    }

    fn psn_of(&self, seq: u64) -> Psn {
        self.epsn
            .wrapping_add(seq.wrapping_sub(self.epsn_seq) as u32)
    }

    /// Classifies a request (or READ response) packet with PSN `psn`, `data_len` bytes of
    /// data and placement trailer `t`, and records it. Call it for every such packet of a QP
    /// with the extension on, after the ICRC and the BTH checks, before touching memory:
    /// place the data only on [`Arrival::Place`] (after the R_Key and bounds checks of the
    /// range, as for the first packet of a message today), and send an ACK with
    /// [`Self::sack`] (at once when a hole appeared, docs/multipath.md "Selective
    /// acknowledgement"). Then take completions with [`Self::poll_completion`].
    pub fn on_packet(&mut self, psn: Psn, t: &PlacementTrailer, data_len: usize) -> Arrival {
        let d = psn.distance(self.epsn);
        if d < 0 {
            self.counters.duplicates += 1;
            return Arrival::Duplicate;
        }
        let d = d as u64;
        if d >= self.received.len() as u64 {
            self.counters.ooo_dropped_window += 1;
            return Arrival::BeyondWindow;
        }
        if self.received[d as usize] {
            self.counters.duplicates += 1;
            return Arrival::Duplicate;
        }
        if let Err(e) = t.check_packet(psn, data_len, self.pmtu) {
            return self.invalid(e);
        }
        let seq = self.epsn_seq + d;
        if self.held_before(seq) {
            self.counters.behind_held += 1;
            return Arrival::BehindHeld;
        }
        let first_seq = seq - u64::from(t.offset / self.pmtu);
        let npkts = u64::from(t.length.div_ceil(self.pmtu).max(1));
        let last_seq = first_seq + npkts - 1;
        if let Err(e) = self.admit_msg(first_seq, last_seq, t) {
            return self.invalid(e);
        }
        if let Some(m) = self.msgs.get_mut(&first_seq) {
            m.placed_bytes += data_len as u64;
        }
        self.received[d as usize] = true;
        self.counters.placed += 1;
        if d > 0 {
            self.held += 1;
            self.counters.ooo_placed += 1;
        } else {
            self.advance();
        }
        Arrival::Place {
            offset: t.offset,
            len: data_len as u32,
        }
    }

    /// Records a READ request or an atomic at `psn` that takes `psns` PSNs (a READ's response
    /// packets, 1 for an atomic; IBA 9.7.2), so it executes in PSN order however the packets
    /// arrive: it is held until every PSN before it has arrived and every message before it
    /// has completed, then [`Self::poll_completion`] returns it ([`Completion::held`]) and
    /// the responder executes it, once; its `psns` PSNs count as arrived from now on (the
    /// SACK shows them). Until it executes, SEND and WRITE packets after it are refused
    /// ([`Arrival::BehindHeld`]), so it never sees data written after it. Call it for every
    /// READ request and atomic of a QP whose requester stays in selective repeat across them;
    /// that requester must not send past such a request before it is acknowledged (a packet
    /// after it placed before it arrived would be seen by it: [`Arrival::Invalid`]). A
    /// request at or before a PSN that arrived is [`Arrival::Duplicate`]: the responder
    /// answers it from its READ/atomic resources, as a duplicate in order.
    pub fn on_held(&mut self, psn: Psn, psns: u32) -> Arrival {
        let psns = psns.max(1);
        let d = psn.distance(self.epsn);
        if d < 0 {
            self.counters.duplicates += 1;
            return Arrival::Duplicate;
        }
        let d = d as u64;
        if d + u64::from(psns) > self.received.len() as u64 {
            self.counters.ooo_dropped_window += 1;
            return Arrival::BeyondWindow;
        }
        if self.received[d as usize] {
            self.counters.duplicates += 1;
            return Arrival::Duplicate;
        }
        let first_seq = self.epsn_seq + d;
        let last_seq = first_seq + u64::from(psns) - 1;
        let span = d as usize..=(d as usize + psns as usize - 1);
        if self.received.range(span.clone()).any(|r| *r) {
            return self.invalid(WireError::Malformed(
                "a READ request or an atomic over PSNs that arrived",
            ));
        }
        if self
            .received
            .range(d as usize + psns as usize..)
            .any(|r| *r)
        {
            return self.invalid(WireError::Malformed(
                "a READ request or an atomic after packets that follow it",
            ));
        }
        let before = self.msgs.range(..first_seq).next_back();
        let after = self.msgs.range(first_seq..).next();
        if before.is_some_and(|(_, m)| m.last_seq >= first_seq)
            || after.is_some_and(|(&f, _)| f <= last_seq)
        {
            return self.invalid(WireError::Malformed(
                "a READ request or an atomic inside another message",
            ));
        }
        self.msgs.insert(
            first_seq,
            Msg {
                last_seq,
                length: 0,
                flags: PlacementFlags::WRITE,
                ssn: Ssn::new(0),
                placed_bytes: 0,
                held: true,
            },
        );
        self.held_seqs.insert(first_seq);
        for r in self.received.range_mut(span) {
            *r = true;
        }
        self.counters.held_requests += 1;
        // `held` counts the arrived PSNs beyond the expected one.
        if d > 0 {
            self.held += psns;
            self.counters.ooo_placed += 1;
        } else {
            self.held += psns - 1;
            self.advance();
        }
        Arrival::Held
    }

    /// Whether a held request ([`Self::on_held`]) before `seq` has not executed yet.
    fn held_before(&self, seq: u64) -> bool {
        self.held_seqs.first().is_some_and(|&f| f < seq)
    }

    fn invalid(&mut self, e: WireError) -> Arrival {
        self.counters.invalid += 1;
        Arrival::Invalid(e)
    }

    /// Finds or creates the message `first_seq..=last_seq`, checking it against the others.
    fn admit_msg(
        &mut self,
        first_seq: u64,
        last_seq: u64,
        t: &PlacementTrailer,
    ) -> Result<(), WireError> {
        if let Some(m) = self.msgs.get(&first_seq) {
            return if m.last_seq == last_seq
                && m.length == t.length
                && m.flags == t.flags
                && m.ssn == t.ssn
            {
                Ok(())
            } else {
                Err(WireError::Malformed(
                    "placement trailer disagrees with its message's other packets",
                ))
            };
        }
        // A new message must start at or after the expected PSN (its earlier packets would
        // have created it) and overlap no other.
        if first_seq < self.epsn_seq {
            return Err(WireError::Malformed(
                "placement trailer names a message before the expected PSN",
            ));
        }
        let before = self.msgs.range(..first_seq).next_back();
        let after = self.msgs.range(first_seq..).next();
        if before.is_some_and(|(_, m)| m.last_seq >= first_seq)
            || after.is_some_and(|(&f, _)| f <= last_seq)
        {
            return Err(WireError::Malformed(
                "placement trailer overlaps another message",
            ));
        }
        self.msgs.insert(
            first_seq,
            Msg {
                last_seq,
                length: t.length,
                flags: t.flags,
                ssn: t.ssn,
                placed_bytes: 0,
                held: false,
            },
        );
        Ok(())
    }

    /// Moves the expected PSN over every arrived PSN and completes the messages it passed.
    fn advance(&mut self) {
        while self.received.front() == Some(&true) {
            self.received.pop_front();
            self.received.push_back(false);
            self.epsn = self.epsn.next();
            self.epsn_seq += 1;
            if self.held > 0 && self.received.front() == Some(&true) {
                self.held -= 1;
            }
        }
        while let Some(entry) = self.msgs.first_entry() {
            if entry.get().last_seq >= self.epsn_seq {
                break;
            }
            let first_seq = *entry.key();
            let m = entry.remove();
            self.held_seqs.remove(&first_seq);
            debug_assert_eq!(m.placed_bytes, u64::from(m.length));
            self.counters.completed += 1;
            let c = Completion {
                first_psn: self.psn_of(first_seq),
                last_psn: self.psn_of(m.last_seq),
                length: m.length,
                flags: m.flags,
                ssn: m.ssn,
                held: m.held,
            };
            self.ready.push_back(c);
        }
    }

    /// The next completed message, in PSN order. Call it after [`Self::on_packet`] until it
    /// returns `None`.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.ready.pop_front()
    }

    /// The acknowledgement to send now: the AETH's cumulative PSN (the last in-order PSN,
    /// `epsn - 1`, IBA 9.7.5.1) and the SACK trailer (bit i: PSN `cumulative + 1 + i`
    /// arrived, UET PDS style; bit 0 is the hole at the expected PSN and so always 0).
    #[must_use]
    pub fn sack(&self) -> (Psn, SackTrailer) {
        let cum = self.epsn.wrapping_sub(1);
        let mut bitmap = SackBitmap::default();
        for (i, _) in self
            .received
            .iter()
            .take(SackBitmap::SPAN as usize)
            .enumerate()
            .filter(|(_, r)| **r)
        {
            bitmap.set(cum, cum.wrapping_add(i as u32 + 1));
        }
        (
            cum,
            SackTrailer {
                bitmap,
                held: self.held,
            },
        )
    }
}
