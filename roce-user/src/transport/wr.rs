//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`).

use super::ids::{QKey, Qpn, RKey};
use super::mr::{BindMw, Sge, sg_len};

/// What a send work request does (`enum ibv_wr_opcode` with its operands).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm {
        /// Immediate data (host order; sent big-endian).
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: the responder invalidates `invalidate_rkey`.
    SendWithInv {
        /// The peer's R_Key to invalidate.
        invalidate_rkey: RKey,
    },
    /// `IBV_WR_RDMA_WRITE`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: the SG list is where the data lands.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: the 8-byte SG list receives the original value.
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Compared with the remote value.
        compare: u64,
        /// Stored if equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Added to the remote value.
        add: u64,
    },
    /// `IBV_WR_BIND_MW` (and `ibv_bind_mw` of a type 1 window): a local operation that binds
    /// a memory window when the send queue reaches it; completes as `IBV_WC_BIND_MW`.
    BindMw(BindMw),
    /// `IBV_WR_LOCAL_INV`: a local operation that invalidates a region's key or a type 2
    /// window's R_Key; completes as `IBV_WC_LOCAL_INV`.
    LocalInv {
        /// The L_Key or R_Key to invalidate.
        invalidate_key: u32,
    },
}

impl SendOp {
    /// Whether this is an RDMA READ or an atomic (needs an initiator-depth slot, rxe
    /// `check_init_depth`).
    #[must_use]
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            Self::Read { .. } | Self::CompareSwap { .. } | Self::FetchAdd { .. }
        )
    }

    /// Whether the payload may be given inline (SEND and RDMA WRITE, with or without
    /// immediate data or invalidation: rxe's `WR_INLINE_MASK`).
    #[must_use]
    pub const fn takes_inline(&self) -> bool {
        !self.is_read_or_atomic() && !self.is_local()
    }

    /// Whether this is a local operation (bind, local invalidate): no packet, executed when
    /// it reaches the head of the send queue (rxe `rxe_do_local_ops`).
    #[must_use]
    pub const fn is_local(&self) -> bool {
        matches!(self, Self::BindMw(_) | Self::LocalInv { .. })
    }

    /// Whether this is an atomic.
    #[must_use]
    pub const fn is_atomic(&self) -> bool {
        matches!(self, Self::CompareSwap { .. } | Self::FetchAdd { .. })
    }
}

bitflags::bitflags! {
    /// Send flags (`enum ibv_send_flags`).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize, serde::Deserialize)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_SIGNALED`: post a completion on success too.
        const SIGNALED = 2;
        /// `IBV_SEND_SOLICITED`: set BTH.SE on the last packet.
        const SOLICITED = 4;
    }
}

/// Where a UD send goes (`wr.ud`): the address handle, the remote QP and its Q_Key.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct UdDest<P> {
    /// The path to the destination (an address handle).
    pub path: P,
    /// The remote QP number.
    pub remote_qpn: Qpn,
    /// The remote Q_Key.
    pub remote_qkey: QKey,
}

/// A send work request.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SendWr<P> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local buffers (gathered for SEND/WRITE, scattered for READ and atomics).
    pub sg_list: Vec<Sge>,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest<P>>,
    /// Inline data (`IBV_SEND_INLINE`): the message's bytes, copied from the program's
    /// buffers when the WR was posted, sent instead of gathering an SG list (which must then
    /// be empty; no L_Key is checked, as verbs specify: IBA 11.4.1.1, rxe `init_send_wqe`).
    /// SEND and RDMA WRITE only, at most the QP's `max_inline_data` bytes. The bytes stay
    /// with the WR until it completes, so a retransmission sends the same bytes whatever the
    /// program has done to its buffers since.
    pub inline_data: Option<Box<[u8]>>,
}

impl<P> SendWr<P> {
    /// The message length: the inline bytes, or the SG list's total.
    #[must_use]
    pub fn msg_len(&self) -> u64 {
        self.inline_data
            .as_ref()
            .map_or_else(|| sg_len(&self.sg_list), |d| d.len() as u64)
    }

    /// A signaled SEND of `sg_list`.
    #[must_use]
    pub fn send(wr_id: u64, sg_list: Vec<Sge>) -> Self {
        Self {
            wr_id,
            op: SendOp::Send,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
            inline_data: None,
        }
    }

    /// A signaled work request of `op`.
    #[must_use]
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> Self {
        Self {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
            inline_data: None,
        }
    }
}

/// A receive work request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where a received message is scattered.
    pub sg_list: Vec<Sge>,
}

/// A queued WR's scatter/gather list: one entry (what perftest and most programs post) is
/// held in place, more on the heap, so a queued one-SGE WR makes no allocation of its own
/// (a `Vec<Sge>` would cost a 32-byte heap block per WQE; see the memory bound on
/// [`super::Qp`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SgList {
    /// No entries (inline data, local operations, zero-length messages).
    Empty,
    /// One entry.
    One(Sge),
    /// Two or more.
    Many(Box<[Sge]>),
}

impl From<Vec<Sge>> for SgList {
    fn from(v: Vec<Sge>) -> Self {
        match v.as_slice() {
            [] => Self::Empty,
            [one] => Self::One(*one),
            _ => Self::Many(v.into_boxed_slice()),
        }
    }
}

impl core::ops::Deref for SgList {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            Self::Empty => &[],
            Self::One(s) => core::slice::from_ref(s),
            Self::Many(v) => v,
        }
    }
}

/// A send WR as the send queue keeps it, once posted: [`SendWr`] with its SG list in place
/// ([`SgList`]) and its UD destination (large, and UD QPs only) boxed.
#[derive(Debug)]
pub(crate) struct QueuedSendWr<P> {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sg_list: SgList,
    pub(crate) flags: SendFlags,
    pub(crate) ud: Option<Box<UdDest<P>>>,
    pub(crate) inline_data: Option<Box<[u8]>>,
}

impl<P> From<SendWr<P>> for QueuedSendWr<P> {
    fn from(wr: SendWr<P>) -> Self {
        Self {
            wr_id: wr.wr_id,
            op: wr.op,
            sg_list: wr.sg_list.into(),
            flags: wr.flags,
            ud: wr.ud.map(Box::new),
            inline_data: wr.inline_data,
        }
    }
}

/// A receive WR as a receive queue keeps it, once posted: [`RecvWr`] with its SG list in
/// place ([`SgList`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueuedRecvWr {
    pub(crate) wr_id: u64,
    pub(crate) sg_list: SgList,
}

impl From<RecvWr> for QueuedRecvWr {
    fn from(wr: RecvWr) -> Self {
        Self {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list.into(),
        }
    }
}
