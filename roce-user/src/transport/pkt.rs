//! The transport's view of one RoCE packet: the BTH fields and the extended headers it
//! carries, decoded. Frames are parsed into this and emitted from it by the `wire` module
//! (see [`super::Device::handle_packet`] and [`super::Device::poll_transmit`]); the QP logic
//! never touches bytes of headers.

use roce_common::opcode::{Hdrs, Opcode};

use super::ids::{Msn, PKey, Psn, QKey, Qpn, RKey};

/// RETH: the target of an RDMA WRITE or READ.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// DMA length of the whole message.
    pub len: u32,
}

/// AtomicETH.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP).
    pub compare: u64,
}

/// DETH (UD).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: QKey,
    /// Source QP.
    pub src_qp: Qpn,
}

/// AETH syndrome bytes and codes (rxe_hdr.h `enum aeth_syndrome`).
pub mod syndrome {
    /// Mask of the type bits.
    pub const TYPE_MASK: u8 = 0xe0;
    /// ACK type.
    pub const ACK: u8 = 0x00;
    /// RNR NAK type (value = RNR timer code).
    pub const RNR_NAK: u8 = 0x20;
    /// NAK type.
    pub const NAK: u8 = 0x60;
    /// ACK with invalid ("unlimited") credits, what rxe always sends.
    pub const ACK_UNLIMITED: u8 = 0x1f;
    /// NAK PSN sequence error.
    pub const NAK_PSN_SEQ_ERROR: u8 = 0x60;
    /// NAK invalid request.
    pub const NAK_INVALID_REQUEST: u8 = 0x61;
    /// NAK remote access error.
    pub const NAK_REMOTE_ACCESS_ERROR: u8 = 0x62;
    /// NAK remote operational error.
    pub const NAK_REMOTE_OPERATIONAL_ERROR: u8 = 0x63;
}

/// AETH.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Aeth {
    /// Syndrome byte, see [`syndrome`].
    pub syndrome: u8,
    /// Message sequence number.
    pub msn: Msn,
}

/// The decoded headers of a RoCE packet, BTH onward, without the payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PktHdr {
    /// BTH opcode.
    pub opcode: Opcode,
    /// BTH solicited event.
    pub se: bool,
    /// BTH P_Key.
    pub pkey: PKey,
    /// BTH FECN.
    pub fecn: bool,
    /// BTH BECN.
    pub becn: bool,
    /// BTH destination QP.
    pub dest_qp: Qpn,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH PSN.
    pub psn: Psn,
    /// RETH, if the opcode carries one.
    pub reth: Option<Reth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// Immediate data (host order).
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<RKey>,
    /// DETH.
    pub deth: Option<Deth>,
}

impl PktHdr {
    /// A header of `opcode` with the default P_Key and no extended header yet.
    #[must_use]
    pub fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            pkey: PKey::DEFAULT,
            dest_qp,
            psn,
            ..Self::default()
        }
    }

    /// Whether the extended headers present are exactly those the opcode table prescribes.
    #[must_use]
    pub fn headers_match_opcode(&self) -> bool {
        let Some(info) = self.opcode.info() else {
            return false;
        };
        let h = info.hdrs;
        h.contains(Hdrs::RETH) == self.reth.is_some()
            && h.contains(Hdrs::AETH) == self.aeth.is_some()
            && h.contains(Hdrs::ATOMIC_ETH) == self.atomic.is_some()
            && h.contains(Hdrs::ATOMIC_ACK_ETH) == self.atomic_ack.is_some()
            && h.contains(Hdrs::IMMDT) == self.imm.is_some()
            && h.contains(Hdrs::IETH) == self.ieth.is_some()
            && h.contains(Hdrs::DETH) == self.deth.is_some()
    }
}

/// A received packet as the QP logic sees it.
#[derive(Clone, Copy, Debug)]
pub struct RxPkt<'a> {
    /// Headers.
    pub hdr: PktHdr,
    /// Payload, pad and ICRC removed.
    pub payload: &'a [u8],
    /// Whether the IP header carried ECN Congestion Experienced.
    pub ce: bool,
}

use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr,
    ImmDtRepr, RethRepr, RoceRepr,
};

impl PktHdr {
    /// The transport's view of a parsed wire repr.
    #[must_use]
    #[inline]
    pub fn from_repr(r: &RoceRepr) -> Self {
        let b = &r.bth;
        Self {
            opcode: b.opcode,
            se: b.solicited,
            pkey: b.pkey,
            fecn: b.fecn,
            becn: b.becn,
            dest_qp: b.dest_qp,
            ack_req: b.ack_req,
            psn: b.psn,
            reth: r.reth.map(|h| Reth {
                va: h.va,
                rkey: h.rkey,
                len: h.dma_len,
            }),
            aeth: r.aeth.map(|h| Aeth {
                syndrome: h.syndrome.to_byte(),
                msn: h.msn,
            }),
            atomic: r.atomic_eth.map(|h| AtomicEth {
                va: h.va,
                rkey: h.rkey,
                swap_add: h.swap_add,
                compare: h.compare,
            }),
            atomic_ack: r.atomic_ack_eth.map(|h| h.orig),
            imm: r.immdt.map(|h| h.imm),
            ieth: r.ieth.map(|h| h.rkey),
            deth: r.deth.map(|h| Deth {
                qkey: h.qkey,
                src_qp: h.src_qp,
            }),
        }
    }

    /// The wire repr to emit for this header.
    #[must_use]
    #[inline]
    pub fn to_repr(&self) -> RoceRepr {
        let mut bth = BthRepr::new(self.opcode, self.dest_qp, self.psn);
        bth.solicited = self.se;
        bth.pkey = self.pkey;
        bth.fecn = self.fecn;
        bth.becn = self.becn;
        bth.ack_req = self.ack_req;
        let mut r = RoceRepr::new(bth);
        r.reth = self.reth.map(|h| RethRepr {
            va: h.va,
            rkey: h.rkey,
            dma_len: h.len,
        });
        r.aeth = self.aeth.map(|h| AethRepr {
            syndrome: AethSyndrome::from_byte(h.syndrome),
            msn: h.msn,
        });
        r.atomic_eth = self.atomic.map(|h| AtomicEthRepr {
            va: h.va,
            rkey: h.rkey,
            swap_add: h.swap_add,
            compare: h.compare,
        });
        r.atomic_ack_eth = self.atomic_ack.map(|orig| AtomicAckEthRepr { orig });
        r.immdt = self.imm.map(|imm| ImmDtRepr { imm });
        r.ieth = self.ieth.map(|rkey| IethRepr { rkey });
        r.deth = self.deth.map(|h| DethRepr {
            qkey: h.qkey,
            src_qp: h.src_qp,
        });
        r
    }
}
