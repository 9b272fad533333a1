//! The control protocol between programs and `roce engine` (docs/multiprocess.md, "Control
//! over the socket"), as a sans-I/O codec: bytes in, typed messages out, and back. No socket,
//! clock or thread here; [`super::server`] and [`super::EngineClient`] move the bytes.
//!
//! Every message is a frame: a 12-byte header, then a body of at most [`MAX_BODY`] bytes
//! ([`MAX_VERB_BODY`] for [`Request::Verb`] and its reply).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic [`MAGIC`], little-endian |
//! | 2 | 1 | protocol [`VERSION`] |
//! | 3 | 1 | kind: a request's verb, or that verb with [`REPLY_BIT`] set for its reply |
//! | 4 | 4 | sequence number, chosen by the client, echoed by the reply |
//! | 8 | 4 | body length |
//!
//! All integers are little-endian. A reply body starts with an `i32` errno: 0 and the verb's
//! result, or an errno (1..=4095, as the kernel's uverbs returns them) and nothing else, so a
//! C layer returns exactly what libibverbs would. A frame the engine cannot decode is answered
//! with a [`REJECT`] reply carrying the errno of [`ProtoError::errno`], and the connection is
//! closed: a program that speaks garbage loses its own connection, nothing else.
//!
//! Every field is validated on decode: the magic, the version (a client of another version gets
//! `EPROTONOSUPPORT`), the kind, the exact body length of that kind, enumerations (QP type and
//! state), booleans (0 or 1), access flags (only the bits [`Access`] knows) and errnos.

use super::EngineStatus;
use crate::transport::{Access, Mtu, QpState, QpType, WcOpcode, WcStatus};

/// The first two bytes of every frame: "RE" read as a little-endian u16.
pub const MAGIC: u16 = u16::from_le_bytes(*b"RE");
/// The protocol version this build speaks; the engine refuses any other with
/// `EPROTONOSUPPORT` (no negotiation yet: the engine and its programs are one build). Version 2
/// added the reliability attributes of [`Request::QpConnect`] ([`RcAttrs`]), the atomics of
/// [`WireOp`] and [`Request::WaitCq`], which `roce perf --engine` needs; version 3 the
/// device's PD, MR and CQ counts in [`Value::Status`]; version 4 [`Request::Verb`], every verb
/// of the drop-in libibverbs (`super::verbs`).
pub const VERSION: u8 = 4;
/// Bytes of a frame header.
pub const HEADER: usize = 12;
/// The largest body any message but [`Request::Verb`] and its reply has, with room to grow;
/// longer is refused (`EMSGSIZE`).
pub const MAX_BODY: usize = 256;
/// The largest body of a [`Request::Verb`] or its reply: a list of send WRs with inline data
/// (`ibv_wr_complete`), or a poll of many completions.
pub const MAX_VERB_BODY: usize = 1 << 20;
/// Set in the kind of a reply.
pub const REPLY_BIT: u8 = 0x80;
/// The kind of the reply to a frame that could not be decoded (no verb to echo).
pub const REJECT: u8 = 0xff;

/// Handles (`u32`) are the engine's ids: PD and CQ ids and QPNs as [`crate::api::Device`] gives
/// them; the engine checks that each names an object of the asking connection.
pub type Handle = u32;

/// A verb, from a program to the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A verb of the drop-in libibverbs: its [`super::verbs::VerbCall`] in postcard's encoding,
    /// decoded (and refused with `EPROTO` when it does not decode) by the engine.
    Verb(Vec<u8>),
    /// First message of a connection: the engine answers with what it serves.
    Hello,
    /// The engine's state: connected programs and live QPs (`roce engine --status`).
    Status,
    /// GID `index` of the interface's table (`ibv_query_gid`).
    QueryGid {
        /// Index in the table.
        index: u32,
    },
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd {
        /// The PD.
        pd: Handle,
    },
    /// `ibv_create_cq`.
    CreateCq {
        /// Entries.
        depth: u32,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// The CQ.
        cq: Handle,
    },
    /// `ibv_create_qp`.
    CreateQp(QpSpec),
    /// `ibv_destroy_qp`.
    DestroyQp {
        /// The QP.
        qpn: Handle,
    },
    /// `ibv_modify_qp` RESET → INIT with P_Key index 0, port 1 and these access flags.
    QpToInit {
        /// The QP.
        qpn: Handle,
        /// `qp_access_flags`.
        access: Access,
    },
    /// `ibv_query_qp`: type and state.
    QueryQp {
        /// The QP.
        qpn: Handle,
    },
    /// `ibv_reg_mr` of `len` bytes at `addr` in the asking process (the engine takes the pid
    /// from the socket's credentials, never from the request).
    RegMr {
        /// Protection domain.
        pd: Handle,
        /// Address in the program.
        addr: u64,
        /// Bytes (1 or more).
        len: u64,
        /// Access flags.
        access: Access,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// The region's lkey.
        lkey: u32,
    },
    /// INIT → RTR → RTS of an RC QP to `dest_qpn` at `dgid` from GID `gid_index`, with the
    /// reliability attributes `attrs` (ibv_rc_pingpong's are [`RcAttrs::PINGPONG`]).
    QpConnect {
        /// The QP.
        qpn: Handle,
        /// Local GID index.
        gid_index: u32,
        /// The peer's GID.
        dgid: [u8; 16],
        /// The peer's QPN.
        dest_qpn: u32,
        /// Our RQ PSN (the peer's first).
        rq_psn: u32,
        /// Our first PSN.
        sq_psn: u32,
        /// Path MTU.
        mtu: Mtu,
        /// What `ibv_modify_qp` gets besides the address for RTR and RTS.
        attrs: RcAttrs,
    },
    /// `ibv_post_send` of one WR.
    PostSend {
        /// The QP.
        qpn: Handle,
        /// The WR.
        wr: WireSendWr,
    },
    /// `ibv_post_recv` of one WR.
    PostRecv {
        /// The QP.
        qpn: Handle,
        /// `wr_id`.
        wr_id: u64,
        /// Scatter list.
        sges: Vec<WireSge>,
    },
    /// `ibv_poll_cq` of at most `max` completions (1..=[`MAX_POLL`]).
    PollCq {
        /// The CQ.
        cq: Handle,
        /// At most this many.
        max: u32,
    },
    /// [`Request::PollCq`] that, when the CQ is empty, waits up to `timeout_us`
    /// (1..=[`MAX_WAIT_US`]) for a completion before answering (with none if none came): the
    /// blocking `ibv_get_cq_event` + `ibv_poll_cq` of a program that has nothing else to do,
    /// one round trip instead of a busy loop of them. Answered as `PollCq` is.
    WaitCq {
        /// The CQ.
        cq: Handle,
        /// At most this many.
        max: u32,
        /// Longest wait in microseconds.
        timeout_us: u32,
    },
}

/// The longest [`Request::WaitCq`] wait: one second, so that a program's connection thread in
/// the engine is never held longer than that by one request.
pub const MAX_WAIT_US: u32 = 1_000_000;

/// The reliability attributes of an RC connection ([`Request::QpConnect`]), as
/// [`crate::api::RcConnect`] names them: what `ibv_modify_qp` sets for RTR
/// (`max_dest_rd_atomic`, `min_rnr_timer`) and RTS (`max_rd_atomic`, `timeout`, `retry_cnt`,
/// `rnr_retry`). The codec checks the ranges IBTA gives the fields (timer codes 0..=31, retry
/// counts 0..=7, IBA 9.7.5.2.8 and 9.7.6.1.6); the depths are checked by the engine's transport
/// against its limits, as `ibv_modify_qp` checks them against the device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcAttrs {
    /// READ/atomic responder resources.
    pub max_dest_rd_atomic: u8,
    /// Outstanding READs/atomics the QP may issue.
    pub max_rd_atomic: u8,
    /// RNR NAK timer code advertised (0..=31).
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent (0..=31: 4.096 µs × 2^timeout, 0 for none).
    pub timeout: u8,
    /// Transport retries (0..=7; 7 is "forever" to rxe).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 is forever).
    pub rnr_retry: u8,
}

impl RcAttrs {
    /// ibv_rc_pingpong's attributes, those of [`crate::api::RcConnect::new`].
    pub const PINGPONG: Self = Self {
        max_dest_rd_atomic: 1,
        max_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
    };
    /// Bytes on the wire.
    const LEN: usize = 6;

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[
            self.max_dest_rd_atomic,
            self.max_rd_atomic,
            self.min_rnr_timer,
            self.timeout,
            self.retry_cnt,
            self.rnr_retry,
        ]);
    }

    fn get(b: &[u8]) -> Result<Self, ProtoError> {
        let field = |field: &'static str, v: u8, max: u8| {
            if v <= max {
                Ok(v)
            } else {
                Err(ProtoError::Field {
                    field,
                    value: v.into(),
                })
            }
        };
        Ok(Self {
            max_dest_rd_atomic: b[0],
            max_rd_atomic: b[1],
            min_rnr_timer: field("min_rnr_timer", b[2], 31)?,
            timeout: field("timeout", b[3], 31)?,
            retry_cnt: field("retry_cnt", b[4], 7)?,
            rnr_retry: field("rnr_retry", b[5], 7)?,
        })
    }
}

/// Scatter/gather entries a WR may carry on the wire.
pub const MAX_SGE: usize = 4;
/// Completions one PollCq may return.
pub const MAX_POLL: usize = 8;

/// One scatter/gather entry (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireSge {
    /// Address (the iova of the region).
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// The region's lkey.
    pub lkey: u32,
}

/// The operations a [`Request::PostSend`] carries so far. On the wire: an opcode byte (0 SEND,
/// 1 WRITE, 2 READ, 3 compare-and-swap, 4 fetch-and-add), the remote address and rkey (zero
/// for SEND), and for the atomics two more u64 operands (compare and swap, or add and 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireOp {
    /// SEND.
    Send,
    /// RDMA WRITE to `remote_addr` under `rkey`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA READ from `remote_addr` under `rkey`.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` of the 8 bytes at `remote_addr`: the one SGE (8 bytes)
    /// receives the original value.
    CompareSwap {
        /// Remote address (8-byte aligned: the responder checks, IBA 9.4.5).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compared with the remote value.
        compare: u64,
        /// Stored when equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: the one SGE receives the original value.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Added to the remote value.
        add: u64,
    },
}

/// A send WR (`struct ibv_send_wr`, one of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireSendWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// The operation.
    pub op: WireOp,
    /// `IBV_SEND_SIGNALED`.
    pub signaled: bool,
    /// Gather (or, for READ, scatter) list, at most [`MAX_SGE`].
    pub sges: Vec<WireSge>,
}

/// One completion (`struct ibv_wc`, the fields step 1 carries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireWc {
    /// `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes.
    pub byte_len: u32,
    /// The local QP.
    pub qp_num: u32,
}

/// The attributes of [`Request::CreateQp`] (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSpec {
    /// Protection domain.
    pub pd: Handle,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// CQ of send completions.
    pub send_cq: Handle,
    /// CQ of receive completions.
    pub recv_cq: Handle,
    /// `cap.max_send_wr`.
    pub max_send_wr: u32,
    /// `cap.max_recv_wr`.
    pub max_recv_wr: u32,
    /// `cap.max_send_sge` (and receive).
    pub max_sge: u32,
    /// `cap.max_inline_data`.
    pub max_inline_data: u32,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
}

/// The result of a verb that succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// To [`Request::Verb`]: its [`super::verbs::VerbOk`] in postcard's encoding.
    Verb(Vec<u8>),
    /// To [`Request::Hello`].
    Hello {
        /// The engine's protocol version.
        version: u8,
        /// The engine's process id (for `roce engine --status` and for logs).
        pid: u32,
    },
    /// To [`Request::Status`]: the engine's connections and the objects alive in its
    /// device, across all programs.
    Status(EngineStatus),
    /// To [`Request::QueryGid`]: the 16 bytes of the GID.
    Gid([u8; 16]),
    /// To verbs with nothing to return.
    Done,
    /// A new object's handle: PD, CQ or QPN.
    Created(Handle),
    /// To [`Request::RegMr`]: the region's keys.
    Mr {
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// To [`Request::PollCq`]: at most [`MAX_POLL`] completions.
    Wcs(Vec<WireWc>),
    /// To [`Request::QueryQp`].
    QpInfo {
        /// Its type.
        qp_type: QpType,
        /// Its state.
        state: QpState,
    },
}

/// A reply: the verb's value, or an errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Success.
    Ok(Value),
    /// Failure with this errno (1..=4095).
    Err(i32),
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<T> {
    /// The sequence number.
    pub seq: u32,
    /// The kind byte as sent (a reply's includes [`REPLY_BIT`]).
    pub kind: u8,
    /// The message.
    pub msg: T,
}

/// Why a frame was refused. [`ProtoError::errno`] is what the engine answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The first two bytes are not [`MAGIC`].
    #[error("not a roce engine frame (magic {0:#06x})")]
    Magic(u16),
    /// Another protocol version.
    #[error("protocol version {0}, this side speaks {VERSION}")]
    Version(u8),
    /// No such verb (or a reply where a request was expected, and the reverse).
    #[error("unknown message kind {0:#04x}")]
    Kind(u8),
    /// A body longer than its kind allows ([`MAX_BODY`], [`MAX_VERB_BODY`]).
    #[error("body of {0} bytes, longer than its kind allows")]
    TooLong(u32),
    /// The body's length is not the one its kind has.
    #[error("body of {got} bytes for kind {kind:#04x}, which has {want}")]
    Length {
        /// The kind.
        kind: u8,
        /// Bytes sent.
        got: usize,
        /// Bytes that kind has.
        want: usize,
    },
    /// A [`Request::Verb`] body (or its reply's) that does not decode as a whole.
    #[error("a verb's body does not decode")]
    Encoding,
    /// A field out of its range.
    #[error("field {field}: {value} out of range")]
    Field {
        /// Which.
        field: &'static str,
        /// The value sent.
        value: u64,
    },
}

impl ProtoError {
    /// The errno the engine answers a frame with that fails this way: `EPROTONOSUPPORT` for a
    /// version, `EMSGSIZE` for a length, `EOPNOTSUPP` for an unknown verb, `EINVAL` for a
    /// field out of range (what uverbs returns for bad attributes), `EPROTO` otherwise.
    #[must_use]
    pub const fn errno(&self) -> i32 {
        match self {
            Self::Version(_) => libc::EPROTONOSUPPORT,
            Self::TooLong(_) => libc::EMSGSIZE,
            Self::Kind(_) => libc::EOPNOTSUPP,
            Self::Field { .. } => libc::EINVAL,
            Self::Magic(_) | Self::Length { .. } | Self::Encoding => libc::EPROTO,
        }
    }
}

const K_HELLO: u8 = 1;
const K_STATUS: u8 = 2;
const K_QUERY_GID: u8 = 3;
const K_ALLOC_PD: u8 = 4;
const K_DEALLOC_PD: u8 = 5;
const K_CREATE_CQ: u8 = 6;
const K_DESTROY_CQ: u8 = 7;
const K_CREATE_QP: u8 = 8;
const K_DESTROY_QP: u8 = 9;
const K_QP_TO_INIT: u8 = 10;
const K_QUERY_QP: u8 = 11;
const K_REG_MR: u8 = 12;
const K_DEREG_MR: u8 = 13;
const K_QP_CONNECT: u8 = 14;
const K_POST_SEND: u8 = 15;
const K_POST_RECV: u8 = 16;
const K_POLL_CQ: u8 = 17;
const K_WAIT_CQ: u8 = 18;
const K_VERB: u8 = 19;
/// The last verb's kind.
const K_LAST: u8 = K_VERB;

/// Bytes of a [`QpSpec`] body.
const QP_SPEC_LEN: usize = 4 + 1 + 4 * 6 + 1;

impl Request {
    /// The kind byte of this verb.
    #[must_use]
    pub const fn kind(&self) -> u8 {
        match self {
            Self::Hello => K_HELLO,
            Self::Status => K_STATUS,
            Self::QueryGid { .. } => K_QUERY_GID,
            Self::AllocPd => K_ALLOC_PD,
            Self::DeallocPd { .. } => K_DEALLOC_PD,
            Self::CreateCq { .. } => K_CREATE_CQ,
            Self::DestroyCq { .. } => K_DESTROY_CQ,
            Self::CreateQp(_) => K_CREATE_QP,
            Self::DestroyQp { .. } => K_DESTROY_QP,
            Self::QpToInit { .. } => K_QP_TO_INIT,
            Self::QueryQp { .. } => K_QUERY_QP,
            Self::RegMr { .. } => K_REG_MR,
            Self::DeregMr { .. } => K_DEREG_MR,
            Self::QpConnect { .. } => K_QP_CONNECT,
            Self::PostSend { .. } => K_POST_SEND,
            Self::PostRecv { .. } => K_POST_RECV,
            Self::PollCq { .. } => K_POLL_CQ,
            Self::WaitCq { .. } => K_WAIT_CQ,
            Self::Verb(_) => K_VERB,
        }
    }

    fn body(&self, out: &mut Vec<u8>) {
        match self {
            Self::Verb(bytes) => out.extend_from_slice(bytes),
            Self::Hello | Self::Status | Self::AllocPd => {}
            Self::QueryGid { index: v }
            | Self::DeallocPd { pd: v }
            | Self::CreateCq { depth: v }
            | Self::DestroyCq { cq: v }
            | Self::DestroyQp { qpn: v }
            | Self::QueryQp { qpn: v }
            | Self::DeregMr { lkey: v } => out.extend_from_slice(&v.to_le_bytes()),
            Self::QpConnect {
                qpn,
                gid_index,
                dgid,
                dest_qpn,
                rq_psn,
                sq_psn,
                mtu,
                attrs,
            } => {
                for v in [*qpn, *gid_index] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(dgid);
                for v in [*dest_qpn, *rq_psn, *sq_psn, mtu.bytes()] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                attrs.put(out);
            }
            Self::PostSend { qpn, wr } => {
                out.extend_from_slice(&qpn.to_le_bytes());
                out.extend_from_slice(&wr.wr_id.to_le_bytes());
                let (code, addr, rkey, operands) = match wr.op {
                    WireOp::Send => (0u8, 0, 0, None),
                    WireOp::Write { remote_addr, rkey } => (1, remote_addr, rkey, None),
                    WireOp::Read { remote_addr, rkey } => (2, remote_addr, rkey, None),
                    WireOp::CompareSwap {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => (3, remote_addr, rkey, Some((compare, swap))),
                    WireOp::FetchAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => (4, remote_addr, rkey, Some((add, 0))),
                };
                out.push(code);
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(&rkey.to_le_bytes());
                if let Some((a, b)) = operands {
                    out.extend_from_slice(&a.to_le_bytes());
                    out.extend_from_slice(&b.to_le_bytes());
                }
                out.push(u8::from(wr.signaled));
                put_sges(out, &wr.sges);
            }
            Self::PostRecv { qpn, wr_id, sges } => {
                out.extend_from_slice(&qpn.to_le_bytes());
                out.extend_from_slice(&wr_id.to_le_bytes());
                put_sges(out, sges);
            }
            Self::PollCq { cq, max } => {
                out.extend_from_slice(&cq.to_le_bytes());
                out.extend_from_slice(&max.to_le_bytes());
            }
            Self::WaitCq {
                cq,
                max,
                timeout_us,
            } => {
                for v in [*cq, *max, *timeout_us] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Self::RegMr {
                pd,
                addr,
                len,
                access,
            } => {
                out.extend_from_slice(&pd.to_le_bytes());
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&access.bits().to_le_bytes());
            }
            Self::QpToInit { qpn, access } => {
                out.extend_from_slice(&qpn.to_le_bytes());
                out.extend_from_slice(&access.bits().to_le_bytes());
            }
            Self::CreateQp(s) => {
                out.extend_from_slice(&s.pd.to_le_bytes());
                out.push(qp_type_code(s.qp_type));
                for v in [
                    s.send_cq,
                    s.recv_cq,
                    s.max_send_wr,
                    s.max_recv_wr,
                    s.max_sge,
                    s.max_inline_data,
                ] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.push(u8::from(s.sq_sig_all));
            }
        }
    }
}

/// Bytes of one SGE on the wire.
const SGE_LEN: usize = 16;
/// Bytes of one completion on the wire.
const WC_LEN: usize = 18;

fn put_sges(out: &mut Vec<u8>, sges: &[WireSge]) {
    out.push(u8::try_from(sges.len()).unwrap_or(u8::MAX));
    for g in sges {
        out.extend_from_slice(&g.addr.to_le_bytes());
        out.extend_from_slice(&g.length.to_le_bytes());
        out.extend_from_slice(&g.lkey.to_le_bytes());
    }
}

/// The SG list at the front of `b`: a count (at most [`MAX_SGE`]) and exactly that many.
fn get_sges(kind: u8, b: &[u8]) -> Result<Vec<WireSge>, ProtoError> {
    let Some((&n, rest)) = b.split_first() else {
        return Err(ProtoError::Length {
            kind,
            got: 0,
            want: 1,
        });
    };
    if usize::from(n) > MAX_SGE {
        return Err(ProtoError::Field {
            field: "num_sge",
            value: n.into(),
        });
    }
    exact(kind, rest, usize::from(n) * SGE_LEN)?;
    Ok(rest
        .chunks_exact(SGE_LEN)
        .map(|c| WireSge {
            addr: u64_at(c, 0),
            length: u32_at(c, 8),
            lkey: u32_at(c, 12),
        })
        .collect())
}

fn wc_status_from(code: u8) -> Result<WcStatus, ProtoError> {
    use WcStatus as S;
    [
        S::Success,
        S::LocLenErr,
        S::LocQpOpErr,
        S::LocProtErr,
        S::WrFlushErr,
        S::MwBindErr,
        S::BadRespErr,
        S::RemInvReqErr,
        S::RemAccessErr,
        S::RemOpErr,
        S::RetryExcErr,
        S::RnrRetryExcErr,
    ]
    .into_iter()
    .find(|s| *s as u8 == code)
    .ok_or(ProtoError::Field {
        field: "wc_status",
        value: code.into(),
    })
}

fn wc_opcode_from(code: u8) -> Result<WcOpcode, ProtoError> {
    use WcOpcode as O;
    [
        O::Send,
        O::RdmaWrite,
        O::RdmaRead,
        O::CompSwap,
        O::FetchAdd,
        O::BindMw,
        O::LocalInv,
        O::Recv,
        O::RecvRdmaWithImm,
    ]
    .into_iter()
    .find(|o| *o as u8 == code)
    .ok_or(ProtoError::Field {
        field: "wc_opcode",
        value: code.into(),
    })
}

const fn qp_type_code(t: QpType) -> u8 {
    match t {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud => 2,
    }
}

fn qp_type_from(code: u8) -> Result<QpType, ProtoError> {
    Ok(match code {
        0 => QpType::Rc,
        1 => QpType::Uc,
        2 => QpType::Ud,
        v => {
            return Err(ProtoError::Field {
                field: "qp_type",
                value: v.into(),
            });
        }
    })
}

fn qp_state_from(code: u8) -> Result<QpState, ProtoError> {
    Ok(match code {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        v => {
            return Err(ProtoError::Field {
                field: "qp_state",
                value: v.into(),
            });
        }
    })
}

fn write_frame(out: &mut Vec<u8>, kind: u8, seq: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = u32::try_from(out.len() - start - HEADER).unwrap_or(u32::MAX);
    out[start + 8..start + HEADER].copy_from_slice(&len.to_le_bytes());
}

/// Appends the frame of request `req` with sequence number `seq` to `out`.
pub fn encode_request(out: &mut Vec<u8>, seq: u32, req: &Request) {
    write_frame(out, req.kind(), seq, |o| req.body(o));
}

/// Appends the frame of the reply to a request of kind `kind` (or [`REJECT`]) to `out`.
/// An `Err` outside 1..=4095 is sent as `EIO`, so the receiver never sees a malformed errno.
pub fn encode_reply(out: &mut Vec<u8>, seq: u32, kind: u8, reply: &Reply) {
    write_frame(out, kind | REPLY_BIT, seq, |o| match reply {
        Reply::Err(e) => {
            let e = if (1..=4095).contains(e) {
                *e
            } else {
                libc::EIO
            };
            o.extend_from_slice(&e.to_le_bytes());
        }
        Reply::Ok(v) => {
            o.extend_from_slice(&0i32.to_le_bytes());
            match v {
                Value::Hello { version, pid } => {
                    o.push(*version);
                    o.extend_from_slice(&pid.to_le_bytes());
                }
                Value::Status(EngineStatus {
                    clients,
                    qps,
                    pds,
                    cqs,
                    mrs,
                }) => {
                    for n in [clients, qps, pds, cqs, mrs] {
                        o.extend_from_slice(&n.to_le_bytes());
                    }
                }
                Value::Gid(g) => o.extend_from_slice(g),
                Value::Verb(bytes) => o.extend_from_slice(bytes),
                Value::Done => {}
                Value::Created(h) => o.extend_from_slice(&h.to_le_bytes()),
                Value::Wcs(wcs) => {
                    o.push(u8::try_from(wcs.len()).unwrap_or(u8::MAX));
                    for w in wcs {
                        o.extend_from_slice(&w.wr_id.to_le_bytes());
                        o.push(w.status as u8);
                        o.push(w.opcode as u8);
                        o.extend_from_slice(&w.byte_len.to_le_bytes());
                        o.extend_from_slice(&w.qp_num.to_le_bytes());
                    }
                }
                Value::Mr { lkey, rkey } => {
                    o.extend_from_slice(&lkey.to_le_bytes());
                    o.extend_from_slice(&rkey.to_le_bytes());
                }
                Value::QpInfo { qp_type, state } => {
                    o.push(qp_type_code(*qp_type));
                    o.push(*state as u8);
                }
            }
        }
    });
}

/// A checked header: kind, sequence number and body length.
struct Header {
    kind: u8,
    seq: u32,
    len: usize,
}

/// Reads the header at the front of `buf`: `Ok(None)` until all of it has arrived.
fn header(buf: &[u8]) -> Result<Option<Header>, ProtoError> {
    let Some(h) = buf.get(..HEADER) else {
        // Refuse a wrong magic as soon as its two bytes are in.
        if let Some(m) = buf.get(..2) {
            let m = u16::from_le_bytes([m[0], m[1]]);
            if m != MAGIC {
                return Err(ProtoError::Magic(m));
            }
        }
        return Ok(None);
    };
    let magic = u16::from_le_bytes([h[0], h[1]]);
    if magic != MAGIC {
        return Err(ProtoError::Magic(magic));
    }
    if h[2] != VERSION {
        return Err(ProtoError::Version(h[2]));
    }
    let seq = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    let max = if h[3] & !REPLY_BIT == K_VERB {
        MAX_VERB_BODY
    } else {
        MAX_BODY
    };
    if len as usize > max {
        return Err(ProtoError::TooLong(len));
    }
    Ok(Some(Header {
        kind: h[3],
        seq,
        len: len as usize,
    }))
}

/// The sequence number of the frame at the front of `buf`, if its header is there (for the
/// [`REJECT`] answer to a frame that fails to decode).
#[must_use]
pub fn peek_seq(buf: &[u8]) -> u32 {
    buf.get(4..8)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn exact(kind: u8, body: &[u8], want: usize) -> Result<(), ProtoError> {
    if body.len() == want {
        Ok(())
    } else {
        Err(ProtoError::Length {
            kind,
            got: body.len(),
            want,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

fn access_from(bits: u32) -> Result<Access, ProtoError> {
    Access::from_bits(bits).ok_or(ProtoError::Field {
        field: "access",
        value: bits.into(),
    })
}

fn bool_from(field: &'static str, v: u8) -> Result<bool, ProtoError> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(ProtoError::Field {
            field,
            value: v.into(),
        }),
    }
}

/// Decodes the request at the front of `buf`. `Ok(None)` while the frame is incomplete (read
/// more); otherwise the request and the bytes it took. Call it on what the connection has
/// delivered so far; on `Err` answer [`REJECT`] and close.
///
/// # Errors
/// A [`ProtoError`]: wrong magic or version, unknown kind, wrong length, a field out of range.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Frame<Request>, usize)>, ProtoError> {
    let Some(h) = header(buf)? else {
        return Ok(None);
    };
    let Some(body) = buf.get(HEADER..HEADER + h.len) else {
        return Ok(None);
    };
    let k = h.kind;
    let one = |body: &[u8]| -> Result<u32, ProtoError> {
        exact(k, body, 4)?;
        Ok(u32_at(body, 0))
    };
    let msg = match k {
        K_HELLO | K_STATUS | K_ALLOC_PD => {
            exact(k, body, 0)?;
            match k {
                K_HELLO => Request::Hello,
                K_STATUS => Request::Status,
                _ => Request::AllocPd,
            }
        }
        K_QUERY_GID => Request::QueryGid { index: one(body)? },
        K_VERB => Request::Verb(body.to_vec()),
        K_DEALLOC_PD => Request::DeallocPd { pd: one(body)? },
        K_CREATE_CQ => Request::CreateCq { depth: one(body)? },
        K_DESTROY_CQ => Request::DestroyCq { cq: one(body)? },
        K_DESTROY_QP => Request::DestroyQp { qpn: one(body)? },
        K_QUERY_QP => Request::QueryQp { qpn: one(body)? },
        K_DEREG_MR => Request::DeregMr { lkey: one(body)? },
        K_QP_CONNECT => {
            exact(k, body, 8 + 16 + 16 + RcAttrs::LEN)?;
            let mut dgid = [0; 16];
            dgid.copy_from_slice(&body[8..24]);
            let bytes = u32_at(body, 36);
            Request::QpConnect {
                qpn: u32_at(body, 0),
                gid_index: u32_at(body, 4),
                dgid,
                dest_qpn: u32_at(body, 24),
                rq_psn: u32_at(body, 28),
                sq_psn: u32_at(body, 32),
                mtu: Mtu::from_bytes(bytes).ok_or(ProtoError::Field {
                    field: "mtu",
                    value: bytes.into(),
                })?,
                attrs: RcAttrs::get(&body[40..])?,
            }
        }
        K_POST_SEND => {
            if body.len() < 26 {
                return Err(ProtoError::Length {
                    kind: k,
                    got: body.len(),
                    want: 26,
                });
            }
            let (remote_addr, rkey) = (u64_at(body, 13), u32_at(body, 21));
            // The atomics carry two u64 operands between the rkey and the flags.
            let at = if matches!(body[12], 3 | 4) { 41 } else { 25 };
            if body.len() < at + 1 {
                return Err(ProtoError::Length {
                    kind: k,
                    got: body.len(),
                    want: at + 1,
                });
            }
            let op = match body[12] {
                0 if remote_addr == 0 && rkey == 0 => WireOp::Send,
                1 => WireOp::Write { remote_addr, rkey },
                2 => WireOp::Read { remote_addr, rkey },
                3 => WireOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: u64_at(body, 25),
                    swap: u64_at(body, 33),
                },
                // Fetch-and-add has one operand: the second is 0, so one WR has one encoding.
                4 if u64_at(body, 33) == 0 => WireOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: u64_at(body, 25),
                },
                4 => {
                    return Err(ProtoError::Field {
                        field: "fetch_add_swap",
                        value: u64_at(body, 33),
                    });
                }
                v => {
                    return Err(ProtoError::Field {
                        field: "opcode",
                        value: v.into(),
                    });
                }
            };
            Request::PostSend {
                qpn: u32_at(body, 0),
                wr: WireSendWr {
                    wr_id: u64_at(body, 4),
                    op,
                    signaled: bool_from("signaled", body[at])?,
                    sges: get_sges(k, &body[at + 1..])?,
                },
            }
        }
        K_POST_RECV => {
            if body.len() < 12 {
                return Err(ProtoError::Length {
                    kind: k,
                    got: body.len(),
                    want: 12,
                });
            }
            Request::PostRecv {
                qpn: u32_at(body, 0),
                wr_id: u64_at(body, 4),
                sges: get_sges(k, &body[12..])?,
            }
        }
        K_POLL_CQ => {
            exact(k, body, 8)?;
            let max = u32_at(body, 4);
            if max == 0 || max as usize > MAX_POLL {
                return Err(ProtoError::Field {
                    field: "max",
                    value: max.into(),
                });
            }
            Request::PollCq {
                cq: u32_at(body, 0),
                max,
            }
        }
        K_WAIT_CQ => {
            exact(k, body, 12)?;
            let (max, timeout_us) = (u32_at(body, 4), u32_at(body, 8));
            if max == 0 || max as usize > MAX_POLL {
                return Err(ProtoError::Field {
                    field: "max",
                    value: max.into(),
                });
            }
            if timeout_us == 0 || timeout_us > MAX_WAIT_US {
                return Err(ProtoError::Field {
                    field: "timeout_us",
                    value: timeout_us.into(),
                });
            }
            Request::WaitCq {
                cq: u32_at(body, 0),
                max,
                timeout_us,
            }
        }
        K_REG_MR => {
            exact(k, body, 24)?;
            let len = u64_at(body, 12);
            if len == 0 {
                return Err(ProtoError::Field {
                    field: "len",
                    value: 0,
                });
            }
            Request::RegMr {
                pd: u32_at(body, 0),
                addr: u64_at(body, 4),
                len,
                access: access_from(u32_at(body, 20))?,
            }
        }
        K_QP_TO_INIT => {
            exact(k, body, 8)?;
            Request::QpToInit {
                qpn: u32_at(body, 0),
                access: access_from(u32_at(body, 4))?,
            }
        }
        K_CREATE_QP => {
            exact(k, body, QP_SPEC_LEN)?;
            Request::CreateQp(QpSpec {
                pd: u32_at(body, 0),
                qp_type: qp_type_from(body[4])?,
                send_cq: u32_at(body, 5),
                recv_cq: u32_at(body, 9),
                max_send_wr: u32_at(body, 13),
                max_recv_wr: u32_at(body, 17),
                max_sge: u32_at(body, 21),
                max_inline_data: u32_at(body, 25),
                sq_sig_all: bool_from("sq_sig_all", body[29])?,
            })
        }
        other => return Err(ProtoError::Kind(other)),
    };
    Ok(Some((
        Frame {
            seq: h.seq,
            kind: k,
            msg,
        },
        HEADER + h.len,
    )))
}

/// Decodes the reply at the front of `buf`. Its value is read as the answer to a request of
/// the kind the reply names (so a client checks that kind and the sequence number against
/// what it sent). `Ok(None)` while incomplete.
///
/// # Errors
/// As [`decode_request`]; an errno outside 1..=4095 is a field error.
pub fn decode_reply(buf: &[u8]) -> Result<Option<(Frame<Reply>, usize)>, ProtoError> {
    let Some(h) = header(buf)? else {
        return Ok(None);
    };
    let Some(body) = buf.get(HEADER..HEADER + h.len) else {
        return Ok(None);
    };
    let k = h.kind;
    if k & REPLY_BIT == 0 || !(k == REJECT || (K_HELLO..=K_LAST).contains(&(k & !REPLY_BIT))) {
        return Err(ProtoError::Kind(k));
    }
    if body.len() < 4 {
        return Err(ProtoError::Length {
            kind: k,
            got: body.len(),
            want: 4,
        });
    }
    let errno = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    let rest = &body[4..];
    let reply = if errno != 0 {
        if !(1..=4095).contains(&errno) {
            return Err(ProtoError::Field {
                field: "errno",
                value: u64::from(errno.cast_unsigned()),
            });
        }
        exact(k, rest, 0)?;
        Reply::Err(errno)
    } else {
        Reply::Ok(match k & !REPLY_BIT {
            K_HELLO => {
                exact(k, rest, 5)?;
                Value::Hello {
                    version: rest[0],
                    pid: u32_at(rest, 1),
                }
            }
            K_STATUS => {
                exact(k, rest, 20)?;
                Value::Status(EngineStatus {
                    clients: u32_at(rest, 0),
                    qps: u32_at(rest, 4),
                    pds: u32_at(rest, 8),
                    cqs: u32_at(rest, 12),
                    mrs: u32_at(rest, 16),
                })
            }
            K_QUERY_GID => {
                exact(k, rest, 16)?;
                let mut g = [0; 16];
                g.copy_from_slice(rest);
                Value::Gid(g)
            }
            K_VERB => Value::Verb(rest.to_vec()),
            K_ALLOC_PD | K_CREATE_CQ | K_CREATE_QP => {
                exact(k, rest, 4)?;
                Value::Created(u32_at(rest, 0))
            }
            K_POLL_CQ | K_WAIT_CQ => {
                let Some((&n, wcs)) = rest.split_first() else {
                    return Err(ProtoError::Length {
                        kind: k,
                        got: 0,
                        want: 1,
                    });
                };
                if usize::from(n) > MAX_POLL {
                    return Err(ProtoError::Field {
                        field: "num_wc",
                        value: n.into(),
                    });
                }
                exact(k, wcs, usize::from(n) * WC_LEN)?;
                let mut v = Vec::with_capacity(n.into());
                for c in wcs.chunks_exact(WC_LEN) {
                    v.push(WireWc {
                        wr_id: u64_at(c, 0),
                        status: wc_status_from(c[8])?,
                        opcode: wc_opcode_from(c[9])?,
                        byte_len: u32_at(c, 10),
                        qp_num: u32_at(c, 14),
                    });
                }
                Value::Wcs(v)
            }
            K_REG_MR => {
                exact(k, rest, 8)?;
                Value::Mr {
                    lkey: u32_at(rest, 0),
                    rkey: u32_at(rest, 4),
                }
            }
            K_QUERY_QP => {
                exact(k, rest, 2)?;
                Value::QpInfo {
                    qp_type: qp_type_from(rest[0])?,
                    state: qp_state_from(rest[1])?,
                }
            }
            // A REJECT always carries an errno.
            0x7f => {
                return Err(ProtoError::Field {
                    field: "errno",
                    value: 0,
                });
            }
            _ => {
                exact(k, rest, 0)?;
                Value::Done
            }
        })
    };
    Ok(Some((
        Frame {
            seq: h.seq,
            kind: k,
            msg: reply,
        },
        HEADER + h.len,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn qp_type() -> impl Strategy<Value = QpType> {
        prop_oneof![Just(QpType::Rc), Just(QpType::Uc), Just(QpType::Ud)]
    }

    fn qp_state() -> impl Strategy<Value = QpState> {
        prop_oneof![
            Just(QpState::Reset),
            Just(QpState::Init),
            Just(QpState::Rtr),
            Just(QpState::Rts),
            Just(QpState::Sqd),
            Just(QpState::Sqe),
            Just(QpState::Err),
        ]
    }

    fn rc_attrs() -> impl Strategy<Value = RcAttrs> {
        (any::<[u8; 2]>(), 0u8..32, 0u8..32, 0u8..8, 0u8..8).prop_map(
            |(d, min_rnr_timer, timeout, retry_cnt, rnr_retry)| RcAttrs {
                max_dest_rd_atomic: d[0],
                max_rd_atomic: d[1],
                min_rnr_timer,
                timeout,
                retry_cnt,
                rnr_retry,
            },
        )
    }

    fn sges() -> impl Strategy<Value = Vec<WireSge>> {
        proptest::collection::vec(
            (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, length, lkey)| WireSge {
                addr,
                length,
                lkey,
            }),
            0..=MAX_SGE,
        )
    }

    fn wc() -> impl Strategy<Value = WireWc> {
        (
            any::<u64>(),
            0u8..14,
            prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 128, 129]),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_filter_map(
                "a status libibverbs defines",
                |(wr_id, st, op, byte_len, qp_num)| {
                    Some(WireWc {
                        wr_id,
                        status: wc_status_from(st).ok()?,
                        opcode: wc_opcode_from(op).ok()?,
                        byte_len,
                        qp_num,
                    })
                },
            )
    }

    fn request() -> impl Strategy<Value = Request> {
        let spec = (any::<u32>(), qp_type(), any::<[u32; 6]>(), any::<bool>()).prop_map(
            |(pd, qp_type, v, sq_sig_all)| {
                Request::CreateQp(QpSpec {
                    pd,
                    qp_type,
                    send_cq: v[0],
                    recv_cq: v[1],
                    max_send_wr: v[2],
                    max_recv_wr: v[3],
                    max_sge: v[4],
                    max_inline_data: v[5],
                    sq_sig_all,
                })
            },
        );
        prop_oneof![
            Just(Request::Hello),
            Just(Request::Status),
            Just(Request::AllocPd),
            proptest::collection::vec(any::<u8>(), 0..600).prop_map(Request::Verb),
            any::<u32>().prop_map(|index| Request::QueryGid { index }),
            any::<u32>().prop_map(|pd| Request::DeallocPd { pd }),
            any::<u32>().prop_map(|depth| Request::CreateCq { depth }),
            any::<u32>().prop_map(|cq| Request::DestroyCq { cq }),
            any::<u32>().prop_map(|qpn| Request::DestroyQp { qpn }),
            any::<u32>().prop_map(|qpn| Request::QueryQp { qpn }),
            (any::<u32>(), any::<u32>()).prop_map(|(qpn, a)| Request::QpToInit {
                qpn,
                access: Access::from_bits_truncate(a),
            }),
            spec,
            any::<u32>().prop_map(|lkey| Request::DeregMr { lkey }),
            (any::<[u32; 5]>(), any::<[u8; 16]>(), 0usize..5, rc_attrs()).prop_map(
                |(v, dgid, m, attrs)| Request::QpConnect {
                    qpn: v[0],
                    gid_index: v[1],
                    dgid,
                    dest_qpn: v[2],
                    rq_psn: v[3],
                    sq_psn: v[4],
                    mtu: Mtu::from_bytes(256 << m).unwrap(),
                    attrs,
                }
            ),
            (
                any::<u32>(),
                any::<u64>(),
                0u8..5,
                (any::<u64>(), any::<u32>(), any::<[u64; 2]>()),
                any::<bool>(),
                sges()
            )
                .prop_map(
                    |(qpn, wr_id, code, (remote_addr, rkey, v), signaled, sges)| {
                        let op = match code {
                            0 => WireOp::Send,
                            1 => WireOp::Write { remote_addr, rkey },
                            2 => WireOp::Read { remote_addr, rkey },
                            3 => WireOp::CompareSwap {
                                remote_addr,
                                rkey,
                                compare: v[0],
                                swap: v[1],
                            },
                            _ => WireOp::FetchAdd {
                                remote_addr,
                                rkey,
                                add: v[0],
                            },
                        };
                        Request::PostSend {
                            qpn,
                            wr: WireSendWr {
                                wr_id,
                                op,
                                signaled,
                                sges,
                            },
                        }
                    }
                ),
            (any::<u32>(), any::<u64>(), sges()).prop_map(|(qpn, wr_id, sges)| Request::PostRecv {
                qpn,
                wr_id,
                sges
            }),
            (any::<u32>(), 1..=MAX_POLL as u32).prop_map(|(cq, max)| Request::PollCq { cq, max }),
            (any::<u32>(), 1..=MAX_POLL as u32, 1..=MAX_WAIT_US).prop_map(
                |(cq, max, timeout_us)| Request::WaitCq {
                    cq,
                    max,
                    timeout_us
                }
            ),
            (any::<u32>(), any::<u64>(), 1..=u64::MAX, any::<u32>()).prop_map(
                |(pd, addr, len, a)| Request::RegMr {
                    pd,
                    addr,
                    len,
                    access: Access::from_bits_truncate(a),
                }
            ),
        ]
    }

    /// A reply that fits the kind of `req`, as the engine would send it.
    fn reply_for(kind: u8) -> BoxedStrategy<Reply> {
        let err = (1i32..=4095).prop_map(Reply::Err);
        let ok: BoxedStrategy<Value> = match kind {
            K_HELLO => (any::<u8>(), any::<u32>())
                .prop_map(|(version, pid)| Value::Hello { version, pid })
                .boxed(),
            K_STATUS => any::<[u32; 5]>()
                .prop_map(|[clients, qps, pds, cqs, mrs]| {
                    Value::Status(EngineStatus {
                        clients,
                        qps,
                        pds,
                        cqs,
                        mrs,
                    })
                })
                .boxed(),
            K_QUERY_GID => any::<[u8; 16]>().prop_map(Value::Gid).boxed(),
            K_VERB => proptest::collection::vec(any::<u8>(), 0..600)
                .prop_map(Value::Verb)
                .boxed(),
            K_POLL_CQ | K_WAIT_CQ => proptest::collection::vec(wc(), 0..=MAX_POLL)
                .prop_map(Value::Wcs)
                .boxed(),
            K_REG_MR => (any::<u32>(), any::<u32>())
                .prop_map(|(lkey, rkey)| Value::Mr { lkey, rkey })
                .boxed(),
            K_ALLOC_PD | K_CREATE_CQ | K_CREATE_QP => any::<u32>().prop_map(Value::Created).boxed(),
            K_QUERY_QP => (qp_type(), qp_state())
                .prop_map(|(qp_type, state)| Value::QpInfo { qp_type, state })
                .boxed(),
            _ => Just(Value::Done).boxed(),
        };
        prop_oneof![err, ok.prop_map(Reply::Ok)].boxed()
    }

    fn req_and_reply() -> impl Strategy<Value = (Request, Reply)> {
        request().prop_flat_map(|r| {
            let k = r.kind();
            (Just(r), reply_for(k))
        })
    }

    proptest! {
        #[test]
        fn requests_round_trip_whole_and_byte_by_byte(req in request(), seq in any::<u32>()) {
            let mut buf = Vec::new();
            encode_request(&mut buf, seq, &req);
            // Every strict prefix is incomplete, never an error or a wrong message.
            for n in 0..buf.len() {
                prop_assert_eq!(decode_request(&buf[..n]), Ok(None));
            }
            let (f, used) = decode_request(&buf).unwrap().unwrap();
            prop_assert_eq!(used, buf.len());
            prop_assert_eq!(f.seq, seq);
            prop_assert_eq!(f.kind, req.kind());
            prop_assert_eq!(f.msg, req);
        }

        #[test]
        fn replies_round_trip((req, reply) in req_and_reply(), seq in any::<u32>()) {
            let mut buf = Vec::new();
            encode_reply(&mut buf, seq, req.kind(), &reply);
            for n in 0..buf.len() {
                prop_assert_eq!(decode_reply(&buf[..n]), Ok(None));
            }
            let (f, used) = decode_reply(&buf).unwrap().unwrap();
            prop_assert_eq!(used, buf.len());
            prop_assert_eq!(f.seq, seq);
            prop_assert_eq!(f.kind, req.kind() | REPLY_BIT);
            prop_assert_eq!(f.msg, reply);
        }

        /// Two frames back to back decode one after the other (a stream socket may deliver
        /// them together).
        #[test]
        fn back_to_back_frames_split_where_they_meet(a in request(), b in request()) {
            let mut buf = Vec::new();
            encode_request(&mut buf, 1, &a);
            encode_request(&mut buf, 2, &b);
            let (fa, n) = decode_request(&buf).unwrap().unwrap();
            let (fb, m) = decode_request(&buf[n..]).unwrap().unwrap();
            prop_assert_eq!((fa.msg, fb.msg), (a, b));
            prop_assert_eq!(n + m, buf.len());
        }

        /// Arbitrary bytes never panic the decoders, and whatever they accept re-encodes to
        /// the same bytes (no two encodings of one message, no ignored garbage).
        #[test]
        fn arbitrary_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..64),
                                                  valid_header in any::<bool>()) {
            let mut buf = bytes;
            if valid_header && buf.len() >= HEADER {
                buf[..2].copy_from_slice(&MAGIC.to_le_bytes());
                buf[2] = VERSION;
                let len = (buf.len() - HEADER) as u32;
                buf[8..12].copy_from_slice(&len.to_le_bytes());
            }
            if let Ok(Some((f, used))) = decode_request(&buf) {
                let mut again = Vec::new();
                encode_request(&mut again, f.seq, &f.msg);
                prop_assert_eq!(&again[..], &buf[..used]);
            }
            if let Ok(Some((f, used))) = decode_reply(&buf) {
                let mut again = Vec::new();
                encode_reply(&mut again, f.seq, f.kind & !REPLY_BIT, &f.msg);
                prop_assert_eq!(&again[..], &buf[..used]);
            }
        }

        /// A flipped bit anywhere in a valid request either still decodes to a message that
        /// re-encodes to those bytes, or is refused with an errno; never a panic.
        #[test]
        fn bit_flips_are_refused_or_consistent(req in request(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut buf = Vec::new();
            encode_request(&mut buf, 7, &req);
            let i = at.index(buf.len());
            buf[i] ^= 1 << bit;
            match decode_request(&buf) {
                Ok(Some((f, used))) => {
                    let mut again = Vec::new();
                    encode_request(&mut again, f.seq, &f.msg);
                    prop_assert_eq!(&again[..], &buf[..used]);
                }
                Ok(None) => prop_assert!(i >= 8, "only a longer length field waits for more"),
                Err(e) => prop_assert!((1..=4095).contains(&e.errno())),
            }
        }
    }

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        write_frame(&mut v, kind, 9, |o| o.extend_from_slice(body));
        v
    }

    #[test]
    fn malformed_requests_get_the_errno_the_engine_answers() {
        let mut bad_magic = frame(K_HELLO, &[]);
        bad_magic[0] = b'X';
        assert_eq!(
            decode_request(&bad_magic[..2]).unwrap_err().errno(),
            libc::EPROTO,
            "a wrong magic is refused as soon as it is in"
        );
        let mut v1 = frame(K_HELLO, &[]);
        v1[2] = 1;
        assert_eq!(
            decode_request(&v1),
            Err(ProtoError::Version(1)),
            "another version (step 1's, without atomics and RC attributes)"
        );
        assert_eq!(ProtoError::Version(1).errno(), libc::EPROTONOSUPPORT);
        let mut long = frame(K_HELLO, &[]);
        long[8..12].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert_eq!(decode_request(&long).unwrap_err().errno(), libc::EMSGSIZE);
        assert_eq!(
            decode_request(&frame(0x40, &[])),
            Err(ProtoError::Kind(0x40))
        );
        assert_eq!(
            decode_request(&frame(K_ALLOC_PD | REPLY_BIT, &[0; 8])),
            Err(ProtoError::Kind(K_ALLOC_PD | REPLY_BIT)),
            "a reply is not a request"
        );
        assert_eq!(
            decode_request(&frame(K_HELLO, &[0])).unwrap_err().errno(),
            libc::EPROTO,
            "Hello has no body"
        );
        assert_eq!(
            decode_request(&frame(K_DEALLOC_PD, &[1, 0, 0]))
                .unwrap_err()
                .errno(),
            libc::EPROTO
        );
        let mut spec = Vec::new();
        Request::CreateQp(QpSpec {
            pd: 0,
            qp_type: QpType::Rc,
            send_cq: 0,
            recv_cq: 0,
            max_send_wr: 1,
            max_recv_wr: 1,
            max_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
        })
        .body(&mut spec);
        let mut t = spec.clone();
        t[4] = 3;
        assert_eq!(
            decode_request(&frame(K_CREATE_QP, &t)),
            Err(ProtoError::Field {
                field: "qp_type",
                value: 3
            })
        );
        let mut s = spec;
        s[29] = 2;
        assert_eq!(
            decode_request(&frame(K_CREATE_QP, &s)).unwrap_err().errno(),
            libc::EINVAL,
            "a boolean is 0 or 1"
        );
        let mut a = 5u32.to_le_bytes().to_vec();
        a.extend_from_slice(&0x8000_0000u32.to_le_bytes());
        assert_eq!(
            decode_request(&frame(K_QP_TO_INIT, &a)),
            Err(ProtoError::Field {
                field: "access",
                value: 0x8000_0000
            }),
            "access bits nobody defined"
        );
    }

    /// A connection with a timer code, a timeout or a retry count beyond what IBTA defines is
    /// refused (`EINVAL`, as `ibv_modify_qp` refuses it), and so is a fetch-and-add whose
    /// unused second operand is not 0, an atomic cut short, or a wait of no time, of more
    /// than a second or for no completions.
    #[test]
    fn rc_attributes_and_atomics_out_of_range_are_refused() {
        let connect = |attrs: RcAttrs| {
            let mut b = Vec::new();
            Request::QpConnect {
                qpn: 1,
                gid_index: 1,
                dgid: [0; 16],
                dest_qpn: 2,
                rq_psn: 0,
                sq_psn: 0,
                mtu: Mtu::Mtu1024,
                attrs,
            }
            .body(&mut b);
            b
        };
        let ok = connect(RcAttrs::PINGPONG);
        assert!(decode_request(&frame(K_QP_CONNECT, &ok)).unwrap().is_some());
        for (at, v, field) in [
            (42, 32, "min_rnr_timer"),
            (43, 32, "timeout"),
            (44, 8, "retry_cnt"),
            (45, 8, "rnr_retry"),
        ] {
            let mut b = ok.clone();
            b[at] = v;
            assert_eq!(
                decode_request(&frame(K_QP_CONNECT, &b)),
                Err(ProtoError::Field {
                    field,
                    value: v.into()
                })
            );
        }
        assert_eq!(
            decode_request(&frame(K_QP_CONNECT, &ok[..40]))
                .unwrap_err()
                .errno(),
            libc::EPROTO,
            "a step-1 connect without the attributes"
        );
        let mut fa = Vec::new();
        Request::PostSend {
            qpn: 1,
            wr: WireSendWr {
                wr_id: 1,
                op: WireOp::FetchAdd {
                    remote_addr: 8,
                    rkey: 2,
                    add: 1,
                },
                signaled: true,
                sges: vec![WireSge {
                    addr: 0,
                    length: 8,
                    lkey: 3,
                }],
            },
        }
        .body(&mut fa);
        assert!(decode_request(&frame(K_POST_SEND, &fa)).unwrap().is_some());
        let mut bad = fa.clone();
        bad[33] = 1;
        assert_eq!(
            decode_request(&frame(K_POST_SEND, &bad)),
            Err(ProtoError::Field {
                field: "fetch_add_swap",
                value: 1
            })
        );
        assert_eq!(
            decode_request(&frame(K_POST_SEND, &fa[..30]))
                .unwrap_err()
                .errno(),
            libc::EPROTO,
            "an atomic without its operands"
        );
        for (max, timeout_us, field, value) in [
            (1, 0, "timeout_us", 0),
            (1, MAX_WAIT_US + 1, "timeout_us", u64::from(MAX_WAIT_US) + 1),
            (0, 1000, "max", 0),
            (MAX_POLL as u32 + 1, 1000, "max", MAX_POLL as u64 + 1),
        ] {
            let mut w = 3u32.to_le_bytes().to_vec();
            w.extend_from_slice(&max.to_le_bytes());
            w.extend_from_slice(&timeout_us.to_le_bytes());
            assert_eq!(
                decode_request(&frame(K_WAIT_CQ, &w)),
                Err(ProtoError::Field { field, value }),
                "a wait of {timeout_us} µs for {max}"
            );
        }
        let mut op = fa;
        op[12] = 5;
        assert_eq!(
            decode_request(&frame(K_POST_SEND, &op)),
            Err(ProtoError::Field {
                field: "opcode",
                value: 5
            })
        );
    }

    #[test]
    fn a_registration_of_zero_bytes_is_refused() {
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&0x1000u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&Access::LOCAL_WRITE.bits().to_le_bytes());
        assert_eq!(
            decode_request(&frame(K_REG_MR, &b)),
            Err(ProtoError::Field {
                field: "len",
                value: 0
            })
        );
    }

    #[test]
    fn malformed_replies_are_refused() {
        let mut b = 0i32.to_le_bytes().to_vec();
        b.extend_from_slice(&[0, 7]);
        assert_eq!(
            decode_reply(&frame(K_QUERY_QP | REPLY_BIT, &b)),
            Err(ProtoError::Field {
                field: "qp_state",
                value: 7
            })
        );
        assert_eq!(
            decode_reply(&frame(K_ALLOC_PD | REPLY_BIT, &(-1i32).to_le_bytes()))
                .unwrap_err()
                .errno(),
            libc::EINVAL,
            "a negative errno"
        );
        let mut e = libc::EBUSY.to_le_bytes().to_vec();
        e.push(0);
        assert!(
            decode_reply(&frame(K_DEALLOC_PD | REPLY_BIT, &e)).is_err(),
            "an error carries nothing after its errno"
        );
        assert_eq!(
            decode_reply(&frame(K_ALLOC_PD, &[0; 8])),
            Err(ProtoError::Kind(K_ALLOC_PD)),
            "a request is not a reply"
        );
        assert!(
            decode_reply(&frame(REJECT, &0i32.to_le_bytes())).is_err(),
            "a REJECT carries an errno"
        );
        let mut out = Vec::new();
        encode_reply(&mut out, 3, REJECT, &Reply::Err(libc::EACCES));
        let (f, _) = decode_reply(&out).unwrap().unwrap();
        assert_eq!(
            (f.seq, f.kind, f.msg),
            (3, REJECT, Reply::Err(libc::EACCES))
        );
        let mut out = Vec::new();
        encode_reply(&mut out, 3, K_DEALLOC_PD, &Reply::Err(-5));
        assert_eq!(
            decode_reply(&out).unwrap().unwrap().0.msg,
            Reply::Err(libc::EIO),
            "an errno out of range goes out as EIO"
        );
    }
}
