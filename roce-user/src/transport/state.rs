//! QP states, attributes and the `modify_qp` rules.
//!
//! The transition table and the required/optional attribute masks are those of the kernel's
//! `qp_state_table` (drivers/infiniband/core/verbs.c, `ib_modify_qp_is_ok`), for RC and UD; the
//! mask bits are `enum ibv_qp_attr_mask` of rdma-core (libibverbs/verbs.h).

use core::fmt;

use super::ids::{PKey, Psn, QKey, Qpn};
use super::mr::Access;

/// A queue pair state (IBA 10.3.1; `enum ibv_qp_state`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub enum QpState {
    /// Just created or reset: no packet is processed, no WR is accepted for sending.
    Reset = 0,
    /// Initialised: receive WRs may be posted; packets are still ignored.
    Init = 1,
    /// Ready to receive: the responder answers requests.
    Rtr = 2,
    /// Ready to send: requester and responder both run.
    Rts = 3,
    /// Send queue drain: no new send WR is started; those started finish.
    Sqd = 4,
    /// Send queue error (UD only): a send WR failed locally; receives continue.
    Sqe = 5,
    /// Error: every outstanding WR was flushed; new WRs complete with a flush error.
    Err,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        })
    }
}

impl QpState {
    /// Every state, in the order of `enum ibv_qp_state`: a state's index is its code.
    pub const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Err,
    ];

    /// The state's number in `enum ibv_qp_state` (`IBV_QPS_RESET` = 0 .. `IBV_QPS_ERR` = 6),
    /// as the published per-QP counter records and the drop-in libibverbs carry it.
    #[must_use]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The state numbered `code` in `enum ibv_qp_state`, if there is one (the inverse of
    /// [`QpState::code`]).
    #[must_use]
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// Whether the responder processes requests in this state (rxe: `resp.state == READY`).
    #[must_use]
    pub const fn responder_ready(self) -> bool {
        matches!(self, Self::Rtr | Self::Rts | Self::Sqd | Self::Sqe)
    }

    /// Whether the completer processes responses in this state (rxe: `req.state` READY..DRAINED).
    #[must_use]
    pub const fn requester_ready(self) -> bool {
        matches!(self, Self::Rts | Self::Sqd)
    }
}

/// The transport service of a QP.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection (IBA 9.7.5.1, 9.8.3): SEND and RDMA WRITE only, no ACKs, no
    /// retransmission; a message hit by loss is dropped whole by the responder
    /// (transport/qp/uc.rs).
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// A path MTU (`enum ibv_mtu`): the largest payload of one packet.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The payload size in bytes.
    #[must_use]
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of `bytes`, if it is one of 256, 512, 1024, 2048, 4096.
    #[must_use]
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        Some(match bytes {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }
}

bitflags::bitflags! {
    /// Which attributes of a [`QpAttr`] a `modify_qp` call sets (`enum ibv_qp_attr_mask`).
    /// Displayed as the names joined by `|` (`STATE|PORT`), `NONE` when empty.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize, serde::Deserialize)]
    pub struct AttrMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`.
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`.
        const RATE_LIMIT = 1 << 25;
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("NONE");
        }
        let mut first = true;
        for (name, _) in self.iter_names() {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
        }
        let rest = self.bits() & !Self::all().bits();
        if rest != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{rest:#x}")?;
        }
        Ok(())
    }
}

/// The attributes of a QP (`struct ibv_qp_attr`, the fields roce-xdp uses). A `modify_qp` call
/// reads only the fields its [`AttrMask`] names.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct QpAttr<P> {
    /// Target state (`IBV_QP_STATE`).
    pub qp_state: QpState,
    /// Asserted current state (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Remote access the responder allows (`IBV_QP_ACCESS_FLAGS`: REMOTE_WRITE/READ/ATOMIC).
    pub qp_access_flags: Access,
    /// Index into the P_Key table (`IBV_QP_PKEY_INDEX`); roce-xdp's table has one entry, 0xffff.
    pub pkey_index: u16,
    /// Port number (`IBV_QP_PORT`), must be 1.
    pub port_num: u8,
    /// UD Q_Key (`IBV_QP_QKEY`).
    pub qkey: QKey,
    /// Address vector: the path frames to the peer take (`IBV_QP_AV`).
    pub ah_attr: Option<P>,
    /// Path MTU (`IBV_QP_PATH_MTU`).
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent, 0..=31 (`IBV_QP_TIMEOUT`).
    pub timeout: u8,
    /// Transport retries, 0..=7 (`IBV_QP_RETRY_CNT`).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7, 7 = forever (`IBV_QP_RNR_RETRY`).
    pub rnr_retry: u8,
    /// First expected request PSN (`IBV_QP_RQ_PSN`).
    pub rq_psn: Psn,
    /// First PSN the requester sends (`IBV_QP_SQ_PSN`).
    pub sq_psn: Psn,
    /// Outstanding READ/ATOMIC this QP may issue (`IBV_QP_MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// READ/ATOMIC responder resources (`IBV_QP_MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code advertised to the peer, 0..=31 (`IBV_QP_MIN_RNR_TIMER`).
    pub min_rnr_timer: u8,
    /// The remote QP (`IBV_QP_DEST_QPN`).
    pub dest_qp_num: Qpn,
}

impl<P> Default for QpAttr<P> {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            qp_access_flags: Access::empty(),
            pkey_index: 0,
            port_num: 1,
            qkey: QKey::new(0),
            ah_attr: None,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            dest_qp_num: Qpn::new(0),
        }
    }
}

/// The P_Key table of a roce-xdp port: one full-membership default key.
pub const PKEY_TABLE: [PKey; 1] = [PKey::DEFAULT];

/// Why `modify_qp` refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The state table has no such transition for this QP type.
    #[error("illegal QP transition {from} -> {to} for a {qp_type:?} QP")]
    IllegalTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// QP type.
        qp_type: QpType,
    },
    /// The mask lacks attributes this transition requires.
    #[error("modify {from} -> {to} requires {missing} in the attribute mask")]
    MissingAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The required attributes that were not given.
        missing: AttrMask,
    },
    /// The mask has attributes this transition does not accept.
    #[error("modify {from} -> {to} does not accept {extra} in the attribute mask")]
    UnexpectedAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attributes that are neither required nor optional.
        extra: AttrMask,
    },
    /// `IBV_QP_CUR_STATE` was given but does not match, or is not allowed from this state.
    #[error("current state is {actual}, the caller asserted {asserted}")]
    CurrentStateMismatch {
        /// The QP's state.
        actual: QpState,
        /// The state in `cur_qp_state`.
        asserted: QpState,
    },
    /// An attribute value is out of range.
    #[error("invalid attribute {attr}: {reason}")]
    InvalidValue {
        /// The attribute.
        attr: AttrMask,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The attributes a transition requires and accepts, or `None` if the transition is illegal.
///
/// This is the kernel's `qp_state_table` (verbs.c) restricted to RC, UC and UD. UC takes RC's
/// connection attributes (access flags, address vector, path MTU, destination QP, PSNs) but
/// none of its reliability ones: no timeout, retry counts, RNR timer or READ/atomic depths
/// (ibv_modify_qp(3); reference/roce-v2.md "QP transitions").
#[must_use]
pub fn transition_masks(
    qp_type: QpType,
    from: QpState,
    to: QpState,
) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    let none = M::empty();
    let ty = qp_type;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => match ty {
            QpType::Rc | QpType::Uc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
            QpType::Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
        },
        (Init, Init) => match ty {
            QpType::Rc | QpType::Uc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            QpType::Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
        },
        (Init, Rtr) => match ty {
            QpType::Rc => (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            QpType::Uc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            QpType::Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match ty {
            QpType::Rc => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            QpType::Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            QpType::Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => match ty {
            QpType::Rc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
            QpType::Uc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            QpType::Ud => (none, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match ty {
            QpType::Rc => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            QpType::Uc => (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            QpType::Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Sqe, Rts) => match ty {
            QpType::Rc => return None,
            QpType::Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            QpType::Ud => (none, M::CUR_STATE | M::QKEY),
        },
        _ => return None,
    })
}

/// Checks a `modify_qp` request against the state table and the attribute ranges
/// (`ib_modify_qp_is_ok` plus rxe's `rxe_qp_chk_attr`). Returns the target state.
///
/// # Errors
/// A [`ModifyError`] naming the illegal transition, the missing or unexpected attributes, or the
/// out-of-range value.
pub fn check_modify<P>(
    qp_type: QpType,
    cur: QpState,
    attr: &QpAttr<P>,
    mask: AttrMask,
    max_rd_atomic: u8,
) -> Result<QpState, ModifyError> {
    let mut from = cur;
    if mask.contains(AttrMask::CUR_STATE) {
        let allowed = matches!(
            attr.cur_qp_state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if !allowed || attr.cur_qp_state != cur {
            return Err(ModifyError::CurrentStateMismatch {
                actual: cur,
                asserted: attr.cur_qp_state,
            });
        }
        from = attr.cur_qp_state;
    }
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        from
    };
    let (req, opt) = transition_masks(qp_type, from, to).ok_or(ModifyError::IllegalTransition {
        from,
        to,
        qp_type,
    })?;
    let body = mask.difference(AttrMask::STATE);
    let missing = req.difference(body);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes { from, to, missing });
    }
    let extra = body.difference(req | opt);
    if !extra.is_empty() {
        return Err(ModifyError::UnexpectedAttributes { from, to, extra });
    }
    let bad = |attr, reason| Err(ModifyError::InvalidValue { attr, reason });
    if mask.contains(AttrMask::PORT) && attr.port_num != 1 {
        return bad(AttrMask::PORT, "roce-xdp has one port, number 1");
    }
    if mask.contains(AttrMask::PKEY_INDEX) && usize::from(attr.pkey_index) >= PKEY_TABLE.len() {
        return bad(AttrMask::PKEY_INDEX, "index beyond the P_Key table");
    }
    if mask.contains(AttrMask::AV) && attr.ah_attr.is_none() {
        return bad(AttrMask::AV, "no address vector given");
    }
    if mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
        return bad(AttrMask::TIMEOUT, "must be 0..=31");
    }
    if mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad(AttrMask::RETRY_CNT, "must be 0..=7");
    }
    if mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad(AttrMask::RNR_RETRY, "must be 0..=7");
    }
    if mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad(AttrMask::MIN_RNR_TIMER, "must be 0..=31");
    }
    if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > max_rd_atomic {
        return bad(
            AttrMask::MAX_QP_RD_ATOMIC,
            "above the device's max_qp_rd_atom",
        );
    }
    if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > max_rd_atomic {
        return bad(
            AttrMask::MAX_DEST_RD_ATOMIC,
            "above the device's max_qp_rd_atom",
        );
    }
    if mask.contains(AttrMask::DEST_QPN) && attr.dest_qp_num.value() == 0 {
        return bad(AttrMask::DEST_QPN, "QP 0 is not used on RoCE");
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::QpState;

    #[test]
    fn state_codes_are_ibv_qp_state_and_round_trip() {
        assert_eq!(QpState::Reset.code(), 0);
        assert_eq!(QpState::Rts.code(), 3);
        assert_eq!(QpState::Err.code(), 6);
        for s in QpState::ALL {
            assert_eq!(QpState::from_code(s.code()), Some(s));
        }
        assert_eq!(QpState::from_code(7), None);
    }
}
