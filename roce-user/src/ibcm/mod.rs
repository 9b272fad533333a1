//! The InfiniBand communication manager (IBTA vol 1, chapter 12), the protocol RDMA CM
//! (librdmacm, `rping`, `perftest -R`) speaks on RoCE: 256-byte CM MADs in UD SENDs to QP1.
//!
//! Sans-I/O like the transport: [`mad`] encodes and decodes the messages (REQ, MRA, REJ, REP,
//! RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, laid out as the kernel's ibta_vol1_c12.h), [`ip`] holds
//! RDMA CM's service IDs and the IP header it puts in a REQ's private data, and [`conn`] is the
//! connection state machine of one port ([`Cm`]), driven by received MADs and injected time,
//! with queues of MADs to send and events for the consumer. Carrying the MADs on QP1 of the
//! device and the drop-in librdmacm are layers above (issue 18).
//!
//! Not to be confused with [`crate::cm`], the TCP out-of-band exchanges of the classic tools.
//!
//! # Wiring it to QP1 (the layer above, not here yet)
//! - Receive: a RoCE v2 frame with opcode UD SEND_ONLY to QP 1, P_Key 0xFFFF and DETH Q_Key
//!   0x80010000 (`QKey::GSI`) carries a 256-byte MAD: pass it to [`Cm::handle_mad`] with the
//!   sender's GID ([`Gid::from_ip`] of the frame's source IP). A MAD of another management
//!   class comes back as [`MadError::BadClass`] and is the caller's to route or count.
//! - Send: each [`Transmit`] goes as a UD SEND_ONLY to QP 1 of `dest` with DETH (Q_Key GSI,
//!   source QP 1) from the interface whose IP is our GID; the MAC comes from the kernel's
//!   neighbour table, as rxe does (no SA on RoCE).
//! - Time: call [`Cm::handle_timeout`] when [`Cm::poll_timeout`] comes, then drain
//!   [`Cm::poll_transmit`] and [`Cm::poll_event`].
//! - RDMA CM events map as: [`Event::ConnectRequest`] → `RDMA_CM_EVENT_CONNECT_REQUEST`;
//!   [`Event::Reply`] → the library moves the QP to RTR/RTS and calls [`Cm::ready_to_use`]
//!   (`RDMA_CM_EVENT_CONNECT_RESPONSE` only for a consumer without a QP);
//!   [`Event::Established`] → `ESTABLISHED`; [`Event::Rejected`] → `REJECTED` (status =
//!   reason); [`Event::TimedOut`] → `UNREACHABLE`; [`Event::Disconnected`] → `DISCONNECTED`;
//!   [`Event::TimeWaitExit`] → `TIMEWAIT_EXIT`; [`Event::SidrReply`] → `ESTABLISHED` with the
//!   UD QPN/Q_Key, or `UNREACHABLE` for a non-zero status.

pub mod conn;
pub mod ip;
pub mod mad;

pub use conn::{
    AcceptParams, Cm, CmConfig, CmError, CmStats, ConnectParams, Dropped, Event, State, Transmit,
};
pub use ip::{CmaHdr, CmaHdrError, PortSpace};
pub use mad::{
    AttrId, CaGuid, CmMad, CmMsg, CommId, Gid, IbaTime, MAD_LEN, MadError, PathMtu, RejReason,
    ServiceId, SidrStatus, Tid,
};

#[cfg(test)]
mod tests;
