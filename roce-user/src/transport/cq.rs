//! Completion queues and work completions (`struct ibv_wc`).
//!
//! A CQ has a fixed depth. When a completion does not fit, the CQ is marked overflowed, the
//! completion is counted as lost and an `IBV_EVENT_CQ_ERR`-style [`super::Event::CqOverflow`]
//! is raised; the QP that produced it moves to ERR (rxe: CQ overflow is a QP error). Nothing is
//! dropped silently.

use std::collections::VecDeque;

use super::ids::{Qpn, RKey};

/// Status of a work completion (`enum ibv_wc_status`, same numeric values).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, Default, serde::Serialize, serde::Deserialize,
)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a receive buffer was too small, or a message too long.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error (rxe: also a failed local
    /// invalidation).
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_PROT_ERR`: a scatter/gather entry names a bad key, right or range.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP went to ERR before the WR completed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind failed (rxe `rxe_bind_mw`).
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response (opcode or length).
    BadRespErr = 7,
    /// `IBV_WC_REM_INV_REQ_ERR`: NAK invalid request.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: NAK remote access error.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: NAK remote operational error.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retries exhausted.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retries exhausted.
    RnrRetryExcErr = 13,
}

/// Opcode of a work completion (`enum ibv_wc_opcode`, same numeric values).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, Default, serde::Serialize, serde::Deserialize,
)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    #[default]
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv = 6,
    /// `IBV_WC_RECV`.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`.
    RecvRdmaWithImm = 129,
}

bitflags::bitflags! {
    /// Work completion flags (`enum ibv_wc_flags`).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize, serde::Deserialize)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold a GRH (UD).
        const GRH = 1;
        /// `IBV_WC_WITH_IMM`: `imm` is valid.
        const WITH_IMM = 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 8;
    }
}

/// A work completion (`struct ibv_wc`).
///
/// [`Wc::default`] is the all-zero `struct ibv_wc` (status `SUCCESS`, opcode `SEND`, no QP):
/// a filler for the slice that [`Device::poll_cq_into`](crate::api::Device::poll_cq_into)
/// writes, never a completion of its own; read only the entries the poll says it wrote.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Wc {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives; RDMA WRITE with immediate: the RETH length) or transferred.
    pub byte_len: u32,
    /// Immediate data (host order), valid with [`WcFlags::WITH_IMM`].
    pub imm: u32,
    /// The R_Key invalidated by a SEND with invalidate, valid with [`WcFlags::WITH_INV`].
    pub invalidated_rkey: RKey,
    /// The local QP.
    pub qp_num: Qpn,
    /// The remote QP (UD receives).
    pub src_qp: Qpn,
    /// Flags.
    pub wc_flags: WcFlags,
}

/// Identifies a CQ of a device.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct CqId(pub u32);

/// A completion queue of fixed depth.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<Wc>,
    depth: usize,
    overflowed: bool,
    lost: u64,
    /// Armed by `ibv_req_notify_cq`: `Some(solicited_only)`.
    notify: Option<bool>,
}

/// A completion could not be queued: the CQ is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("completion queue overflow")]
pub struct CqOverflow;

impl Cq {
    /// An empty CQ holding up to `depth` completions.
    #[must_use]
    pub fn new(depth: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(depth.min(4096)),
            depth,
            overflowed: false,
            lost: 0,
            notify: None,
        }
    }

    /// Arms a one-shot notification for the next completion (`ibv_req_notify_cq`); with
    /// `solicited_only`, only for a receive of a solicited message or an error completion.
    pub fn req_notify(&mut self, solicited_only: bool) {
        self.notify = Some(solicited_only);
    }

    /// Disarms and reports whether a completion with these properties fires the armed
    /// notification (IBA 11.4.2.2).
    pub(crate) fn take_notify(&mut self, solicited: bool, error: bool) -> bool {
        match self.notify {
            Some(only) if !only || solicited || error => {
                self.notify = None;
                true
            }
            _ => false,
        }
    }

    /// Queues `wc`.
    ///
    /// # Errors
    /// [`CqOverflow`] if the CQ is full; the CQ then reports [`Cq::overflowed`].
    pub fn push(&mut self, wc: Wc) -> Result<(), CqOverflow> {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            self.lost += 1;
            return Err(CqOverflow);
        }
        self.entries.push_back(wc);
        Ok(())
    }

    /// The oldest completion (`ibv_poll_cq` with one entry).
    pub fn pop(&mut self) -> Option<Wc> {
        self.entries.pop_front()
    }

    /// Completions queued.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no completion is queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a completion was ever lost to a full queue.
    #[must_use]
    pub const fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// How many completions were lost to a full queue.
    #[must_use]
    pub const fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cq_overflow_is_detected() {
        let wc = Wc {
            wr_id: 1,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: 0,
            invalidated_rkey: RKey::new(0),
            qp_num: Qpn::new(1),
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::default(),
        };
        let mut cq = Cq::new(2);
        cq.push(wc).unwrap();
        cq.push(wc).unwrap();
        assert_eq!(cq.push(wc), Err(CqOverflow));
        assert!(cq.overflowed());
        assert_eq!(cq.lost(), 1);
        assert_eq!(cq.pop(), Some(wc));
        assert_eq!(cq.len(), 1);
    }
}
