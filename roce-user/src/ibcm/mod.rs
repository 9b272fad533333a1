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
