//! The in-band agreement on the extension (docs/multipath.md, "Agreeing on the extension"):
//! one state per QP, driven by the BTH `resv7` bits of the packets it receives. Sans-I/O; each
//! QP holds one (`Qp::mp`, driven from `Device::handle_decoded_at` and `Device::transmit_qp`).
//! A QP falls back on the bits alone: a packet without `OFFER` from a peer that was on
//! ([`Negotiation::on_receive`]; the QP then ends selective repeat and goes back N, plain).
//! NAKs do not turn the extension off: a sequence error NAK also comes, by design, from a
//! peer that is still on (its in-order path answers a plain message or a resend after an RNR
//! wait), which the simulator's proptests showed when falling back on NAKs was tried.

use crate::wire::multipath::MpBthFlags;

/// Where a QP stands with the extension.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MpState {
    /// Not allowed on this QP (the default): plain RoCE v2, no bits sent.
    Disabled,
    /// Allowed, the peer's answer not seen yet: `OFFER` on every packet, nothing else changes.
    Offering,
    /// Both ends agreed: `OFFER` on every packet, trailers on, selective repeat.
    On,
    /// Turned off after it was on (the peer stopped offering): plain RoCE v2 for the rest of
    /// the QP's life, no bits sent.
    FellBack,
}

/// What to do with a received packet, from its multipath bits ([`Negotiation::on_receive`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RxDecision {
    /// A plain RoCE v2 packet: handle it as today (reserved bits ignored, IBA 9.2).
    Plain,
    /// It ends in a trailer: split it off ([`crate::wire::multipath::placement::split`] or
    /// [`crate::wire::multipath::sack::split`]) before handling the packet.
    Trailer,
    /// It carries a trailer the QP no longer agrees to (it fell back): drop and count it, so
    /// the trailer's bytes are never taken for data; the sender falls back on our packets
    /// that no longer offer, and resends plain.
    Drop,
}

/// The per-QP agreement state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Negotiation {
    state: MpState,
    /// The peer's packets carry [`MpBthFlags::HOLD`]: its responder holds READ requests and
    /// atomics, so ours may go in selective repeat.
    peer_holds: bool,
}

impl Negotiation {
    /// The state of a new QP: [`MpState::Offering`] if the extension is allowed on it
    /// (`--multipath`, a `DeviceOptions` field, `ROCE_MULTIPATH`), else
    /// [`MpState::Disabled`]. Call it when the QP reaches RTR.
    #[must_use]
    pub const fn new(allowed: bool) -> Self {
        Self {
            state: if allowed {
                MpState::Offering
            } else {
                MpState::Disabled
            },
            peer_holds: false,
        }
    }

    /// Takes in an out-of-band hint that the peer QP allows the extension too (its side of
    /// `roce perf`'s or `roce pingpong`'s exchange said so, docs/multipath.md, "Hints out of
    /// band"): an [`MpState::Offering`] QP turns [`MpState::On`] at once, so its very first
    /// packet may carry a trailer and the first window is in selective repeat; any other
    /// state is kept (a QP that does not allow the extension never turns it on). Falling back
    /// is as before: a packet without `OFFER` from the peer turns it off. Call it before the
    /// QP sends or receives its first packet, and only on a hint the peer itself sent: a
    /// trailer must never reach a QP that does not allow the extension.
    ///
    /// The hint is version 1 of the extension (`roce-mp1`), and every peer that sends it
    /// holds READ requests and atomics marked [`MpBthFlags::HOLD`]: the hinted QP knows it
    /// from the start, so its first READ or atomic may already go in selective repeat (a QP
    /// that reads without pause would otherwise never be quiet long enough to enter the mode
    /// once the peer's first response had shown `HOLD`).
    pub const fn on_hint(&mut self) {
        if matches!(self.state, MpState::Offering) {
            self.state = MpState::On;
            self.peer_holds = true;
        }
    }

    /// The state.
    #[must_use]
    pub const fn state(self) -> MpState {
        self.state
    }

    /// Whether trailers, spraying and selective repeat are on.
    #[must_use]
    pub const fn is_on(self) -> bool {
        matches!(self.state, MpState::On)
    }

    /// Takes in the bits of a response or acknowledgement from the peer QP: with
    /// [`MpBthFlags::HOLD`] (and the extension on) its responder holds READ requests and
    /// atomics marked so until the cumulative PSN reaches them. Call it for every response
    /// packet, after [`Self::on_receive`].
    pub const fn on_response(&mut self, flags: MpBthFlags) {
        if self.is_on() && flags.contains(MpBthFlags::HOLD) {
            self.peer_holds = true;
        }
    }

    /// Whether the extension is on and the peer's responder holds READ requests and atomics
    /// until the cumulative PSN reaches them ([`MpBthFlags::HOLD`] on its responses), so the
    /// requester may keep them in selective repeat, marked with the bit.
    #[must_use]
    pub const fn peer_holds(self) -> bool {
        self.is_on() && self.peer_holds
    }

    /// The bits to put into the BTH of a packet being sent; `trailer` says whether the packet
    /// would carry one (only honoured when the extension is on). Call it for every packet
    /// the QP sends, after `BthRepr::emit` ([`MpBthFlags::emit`]).
    #[must_use]
    pub const fn tx_flags(self, trailer: bool) -> MpBthFlags {
        match self.state {
            MpState::Disabled | MpState::FellBack => MpBthFlags::NONE,
            MpState::Offering => MpBthFlags::OFFER,
            MpState::On if trailer => MpBthFlags::OFFER_TRAILER,
            MpState::On => MpBthFlags::OFFER,
        }
    }

    /// Takes in the bits of a packet received from the peer QP (after the ICRC and BTH
    /// checks, before anything else) and says how to handle it: an `OFFER` while offering
    /// turns the extension on (the packet may already carry a trailer); a packet without
    /// `OFFER` while on means the peer fell back, so this QP falls back too.
    pub fn on_receive(&mut self, flags: MpBthFlags) -> RxDecision {
        let offer = flags.contains(MpBthFlags::OFFER);
        let trailer = flags.contains(MpBthFlags::TRAILER);
        match self.state {
            MpState::Disabled => RxDecision::Plain,
            MpState::Offering | MpState::On if offer => {
                self.state = MpState::On;
                if trailer {
                    RxDecision::Trailer
                } else {
                    RxDecision::Plain
                }
            }
            MpState::On => {
                self.state = MpState::FellBack;
                self.fell_back_decision(trailer)
            }
            MpState::Offering | MpState::FellBack => self.fell_back_decision(trailer),
        }
    }

    const fn fell_back_decision(self, trailer: bool) -> RxDecision {
        if trailer {
            RxDecision::Drop
        } else {
            RxDecision::Plain
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: MpBthFlags = MpBthFlags::OFFER_TRAILER;

    #[test]
    fn both_allowed_agree_in_one_round_trip_and_fall_back_when_the_peer_stops_offering() {
        let (mut a, mut b) = (Negotiation::new(true), Negotiation::new(true));
        assert_eq!(
            a.tx_flags(true),
            MpBthFlags::OFFER,
            "no trailer before the answer"
        );
        assert_eq!(b.on_receive(a.tx_flags(true)), RxDecision::Plain);
        assert!(b.is_on());
        assert_eq!(b.tx_flags(true), T);
        assert_eq!(
            a.on_receive(b.tx_flags(true)),
            RxDecision::Trailer,
            "first answer may carry one"
        );
        assert!(a.is_on());
        // The peer lost its state (a restarted process on the same QPN): plain packets.
        assert_eq!(a.on_receive(MpBthFlags::NONE), RxDecision::Plain);
        assert_eq!(a.state(), MpState::FellBack);
        assert_eq!(a.tx_flags(true), MpBthFlags::NONE);
        assert_eq!(
            a.on_receive(T),
            RxDecision::Drop,
            "a trailer is never taken for data"
        );
        assert_eq!(b.on_receive(MpBthFlags::NONE), RxDecision::Plain);
        assert_eq!(b.state(), MpState::FellBack);
    }

    #[test]
    fn a_peer_that_does_not_offer_gets_plain_roce() {
        let (mut a, mut b) = (Negotiation::new(true), Negotiation::new(false));
        for _ in 0..3 {
            assert_eq!(b.on_receive(a.tx_flags(true)), RxDecision::Plain);
            assert_eq!(a.on_receive(b.tx_flags(true)), RxDecision::Plain);
        }
        assert_eq!(a.state(), MpState::Offering);
        assert_eq!(b.state(), MpState::Disabled);
        assert_eq!(
            b.tx_flags(true),
            MpBthFlags::NONE,
            "a disabled QP sends no bit"
        );
        assert_eq!(
            a.tx_flags(true),
            MpBthFlags::OFFER,
            "and never gets a trailer"
        );
    }

    #[test]
    fn a_hint_turns_an_offering_qp_on_before_any_packet() {
        let (mut a, mut b) = (Negotiation::new(true), Negotiation::new(true));
        a.on_hint();
        assert!(a.is_on());
        assert_eq!(a.tx_flags(true), T, "a trailer from the first packet on");
        assert_eq!(
            b.on_receive(a.tx_flags(true)),
            RxDecision::Trailer,
            "an offering peer takes it"
        );
        assert!(b.is_on());
        // A hinted peer holds READs and atomics (the hint is version 1, which has `HOLD`);
        // one agreed in band learns it from the peer's responses.
        assert!(a.peer_holds(), "hinted: holds from the start");
        assert!(!b.peer_holds(), "in band: not yet");
        b.on_response(MpBthFlags::from_resv7(T.bits() | MpBthFlags::HOLD.bits()));
        assert!(b.peer_holds());
        // A QP that does not allow the extension ignores a hint.
        let mut off = Negotiation::new(false);
        off.on_hint();
        assert_eq!(off.state(), MpState::Disabled);
        assert_eq!(off.tx_flags(true), MpBthFlags::NONE);
        // Hinted, but the peer's packets come without the offer: plain from then on.
        let mut c = Negotiation::new(true);
        c.on_hint();
        assert_eq!(c.on_receive(MpBthFlags::NONE), RxDecision::Plain);
        assert_eq!(c.state(), MpState::FellBack);
        assert_eq!(c.tx_flags(true), MpBthFlags::NONE);
    }

    #[derive(Clone, Copy, Debug)]
    enum Step {
        Send(bool),
        Deliver(bool, usize),
        Lose(bool, usize),
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            any::<bool>().prop_map(Step::Send),
            (any::<bool>(), any::<usize>()).prop_map(|(s, i)| Step::Deliver(s, i)),
            (any::<bool>(), any::<usize>()).prop_map(|(s, i)| Step::Lose(s, i)),
        ]
    }

    proptest! {
        /// Any schedule of sends, reordered deliveries and losses: a trailer only ever reaches
        /// a QP that offered, is never handled as plain data, and once the schedule ends and
        /// each side's packets get through, both ends are on exactly when both allowed it;
        /// otherwise neither is on.
        /// An out-of-band hint (`hinted`) reaches a side only from a peer that allows the
        /// extension, as the exchanges send it.
        #[test]
        fn agreement_is_safe_and_converges(
            allowed in any::<(bool, bool)>(),
            hinted in any::<(bool, bool)>(),
            steps in proptest::collection::vec(arb_step(), 0..60),
        ) {
            let mut n = [Negotiation::new(allowed.0), Negotiation::new(allowed.1)];
            if hinted.0 && allowed.1 {
                n[0].on_hint();
            }
            if hinted.1 && allowed.0 {
                n[1].on_hint();
            }
            // In flight towards side 0 and side 1.
            let mut q: [Vec<MpBthFlags>; 2] = [Vec::new(), Vec::new()];
            let deliver = |n: &mut [Negotiation; 2], to: usize, f: MpBthFlags| {
                let before = n[to].state();
                let d = n[to].on_receive(f);
                if f.contains(MpBthFlags::TRAILER) {
                    assert_ne!(before, MpState::Disabled, "trailer to a QP that never offered");
                    assert_ne!(d, RxDecision::Plain, "trailer taken for data");
                }
            };
            for s in steps {
                match s {
                    Step::Send(from) => {
                        let from = usize::from(from);
                        let f = n[from].tx_flags(true);
                        q[1 - from].push(f);
                    }
                    Step::Deliver(to, i) | Step::Lose(to, i) => {
                        let to = usize::from(to);
                        if q[to].is_empty() {
                            continue;
                        }
                        let f = q[to].remove(i % q[to].len());
                        if matches!(s, Step::Deliver(..)) {
                            deliver(&mut n, to, f);
                        }
                    }
                }
            }
            // Settle: what is in flight arrives, then each side's packets get through twice.
            for (to, q) in q.iter_mut().enumerate() {
                for f in core::mem::take(q) {
                    deliver(&mut n, to, f);
                }
            }
            for _ in 0..2 {
                for from in 0..2 {
                    let f = n[from].tx_flags(true);
                    deliver(&mut n, 1 - from, f);
                }
            }
            let both_on = n[0].is_on() && n[1].is_on();
            prop_assert_eq!(n[0].is_on(), n[1].is_on(), "{:?}", n);
            prop_assert_eq!(both_on, allowed.0 && allowed.1, "{:?}", n);
        }
    }
}
