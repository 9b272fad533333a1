//! The multipath extension's transport state (docs/multipath.md; issue 19), sans-I/O: no
//! clock (time is an argument), no I/O, no frames. Built and tested here on their own (step 1
//! of the design's order of work); the QPs use them (step 2: `transport/qp/multipath.rs`,
//! negotiation in `qp.rs`).
//!
//! - [`Negotiation`] (one per QP): the in-band agreement by the BTH `resv7` bits, and the
//!   fall back to plain RoCE v2.
//! - [`Reassembly`] (receiver, one per QP): which PSNs beyond the cumulative one arrived,
//!   each packet placed exactly once, completions in PSN order, the SACK to send.
//! - [`SelectiveRepeat`] (sender, one per QP): per-packet state of the window, which PSNs to
//!   resend (only missing ones, after a reordering tolerance or a timeout), the window bounded
//!   by the bandwidth-delay product, and the entropy of each sprayed packet that was lost.
//! - [`Entropies`] (sender, one per spraying QP): the UDP source ports its packets take in
//!   turn, each retired and replaced when one of its packets is lost.
//!
//! Why here: the codecs of the trailers these use are wire formats and live with the other
//! headers in [`crate::wire::multipath`]; the state that reads them is transport state and
//! lives beside the QPs that own it (the import graph runs transport -> wire).
//! The simulator's several paths are in [`super::sim`] ([`super::sim::Pair::set_paths`]).

mod entropy;
mod negotiation;
mod reassembly;
mod selective;

pub use entropy::{Entropies, EntropyConfig, EntropyCounters};
pub use negotiation::{MpState, Negotiation, RxDecision};
pub use reassembly::{Arrival, Completion, Reassembly, ReassemblyCounters};
pub use selective::{SelectiveRepeat, SrConfig, SrCounters, bdp_window};

#[cfg(test)]
mod tests;
