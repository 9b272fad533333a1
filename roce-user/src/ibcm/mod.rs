//! The InfiniBand communication manager (IBTA vol 1, chapter 12), the protocol RDMA CM
//! (librdmacm, `rping`, `perftest -R`) speaks on RoCE: 256-byte CM MADs in UD SENDs to QP1.
//!
//! Sans-I/O like the transport: [`mad`] encodes and decodes the messages (REQ, MRA, REJ, REP,
//! RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, laid out as the kernel's ibta_vol1_c12.h), [`ip`] holds
//! RDMA CM's service IDs and the IP header it puts in a REQ's private data, and [`conn`] is the
//! connection state machine of one port ([`Cm`]), driven by received MADs and injected time,
//! with queues of MADs to send and events for the consumer. Carrying the MADs on QP1 of the
//! device is [`crate::transport::gsi`]; the drop-in librdmacm is a layer above (issue 18).
//!
//! Not to be confused with [`crate::cm`], the TCP out-of-band exchanges of the classic tools.
//!
//! # On QP1 of a device
//! [`crate::transport::gsi`] carries the agent on QP 1 of the transport's `Device`
//! (`Device::enable_gsi`): a received RoCE v2 UD SEND_ONLY to QP 1 with P_Key 0xFFFF, DETH
//! Q_Key 0x80010000 (`QKey::GSI`) and a 256-byte MAD goes to [`Cm::handle_mad`] with the
//! sender's GID ([`Gid::from_ip`] of the frame's source IP); anything else to QP 1 is a
//! counted drop. Each [`Transmit`] leaves as a UD SEND_ONLY to the peer's QP 1 (Q_Key GSI,
//! source QP 1) on the path the peer's last MAD came by, or on the path the consumer set from
//! the kernel's neighbour table before connecting, as rxe does (no SA on RoCE). The device's
//! `poll_timeout`/`handle_timeout` run [`Cm::handle_timeout`]. `roce::api::Device::cm_*` is
//! the API on top (it claims QPN 1 in roce_xdp's QP map, so the frames reach our sockets).
//!
//! # RDMA CM events
//! They map as: [`Event::ConnectRequest`] → `RDMA_CM_EVENT_CONNECT_REQUEST`;
//! [`Event::Reply`] → the library moves the QP to RTR/RTS and calls [`Cm::ready_to_use`]
//! (`RDMA_CM_EVENT_CONNECT_RESPONSE` only for a consumer without a QP);
//! [`Event::Established`] → `ESTABLISHED`; [`Event::Rejected`] → `REJECTED` (status =
//! reason); [`Event::TimedOut`] → `UNREACHABLE`; [`Event::Disconnected`] → `DISCONNECTED`;
//! [`Event::TimeWaitExit`] → `TIMEWAIT_EXIT`; [`Event::SidrReply`] → `ESTABLISHED` with the
//! UD QPN/Q_Key, or `UNREACHABLE` for a non-zero status.

pub mod conn;
pub mod ip;
pub mod mad;

pub use conn::{
    AcceptParams, Cm, CmConfig, CmError, CmStats, ConnectParams, Dropped, Event, State, Transmit,
};
pub use ip::{CmaHdr, CmaHdrError, PortSpace, RDMA_UDP_QKEY};
pub use mad::{
    AttrId, CaGuid, CmMad, CmMsg, CommId, Gid, IbaTime, MAD_LEN, MadError, PathMtu, RejReason,
    ServiceId, SidrStatus, Tid,
};

#[cfg(test)]
mod tests;
