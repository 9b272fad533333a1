//! Base transport header (BTH, IBA 9.2), 12 bytes.
//!
//! Layout (rxe_hdr.h): opcode(8) | SE 0x80, MigReq 0x40, PadCnt 0x30, TVer 0x0f | P_Key(16) |
//! FECN 0x80, BECN 0x40, reserved 0x3f | DestQP(24) | AckReq 0x80, reserved 0x7f | PSN(24).

use super::{Opcode, PKey, Psn, Qpn, Result, WireError, be16, be24, fixed_view, put16, put24};

mod field {
    use crate::wire::Field;
    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: Field = 2..4;
    pub(super) const FECN_BECN: usize = 4;
    pub(super) const DEST_QP: Field = 5..8;
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: Field = 9..12;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// Byte offset of the FECN/BECN/reserved byte, which the ICRC masks with 0xff.
pub const FECN_BECN_OFFSET: usize = field::FECN_BECN;

fixed_view!(
    /// A view over a BTH.
    len = field::PSN.end
);

const _: () = assert!(HEADER_LEN == roce_common::hdr::Bth::LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode (any value, known or not).
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited event.
    #[must_use]
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    /// Migration request (rxe sends 0; ConnectX-3 sends 1).
    #[must_use]
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }
    /// Pad count, 0..=3.
    #[must_use]
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> 4
    }
    /// Transport header version (must be 0).
    #[must_use]
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }
    /// Partition key.
    #[must_use]
    pub fn pkey(&self) -> PKey {
        PKey::new(be16(self.buffer.as_ref(), field::PKEY.start))
    }
    /// Forward explicit congestion notification.
    #[must_use]
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & FECN != 0
    }
    /// Backward explicit congestion notification (set on RoCE v2 CNPs).
    #[must_use]
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & BECN != 0
    }
    /// Destination QP.
    #[must_use]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be24(self.buffer.as_ref(), field::DEST_QP.start))
    }
    /// Acknowledge request.
    #[must_use]
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }
    /// The seven reserved bits below AckReq (`resv7`), as received. IBA 9.2 has senders write
    /// 0 and receivers ignore them; the multipath extension reads its flags here
    /// ([`super::multipath::MpBthFlags`]).
    #[must_use]
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & !ACK_REQ
    }
    /// Packet sequence number.
    #[must_use]
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.buffer.as_ref(), field::PSN.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.0;
    }
    /// Sets the flags byte: SE, MigReq, pad count (masked to 2 bits) and TVer.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        let mut b = ((pad_count & 0x3) << 4) | (tver & TVER_MASK);
        if solicited {
            b |= SE;
        }
        if mig_req {
            b |= MIG_REQ;
        }
        self.buffer.as_mut()[field::FLAGS] = b;
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: PKey) {
        put16(self.buffer.as_mut(), field::PKEY.start, v.value());
    }
    /// Sets FECN and BECN and clears the reserved bits.
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::FECN_BECN] =
            if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
    }
    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, v: Qpn) {
        put24(self.buffer.as_mut(), field::DEST_QP.start, v.value());
    }
    /// Sets AckReq and clears the reserved bits.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = if v { ACK_REQ } else { 0 };
    }
    /// Sets the seven reserved bits below AckReq (`resv7`, IBA 9.2: transmitted as 0), keeping
    /// AckReq. Only the multipath extension between two roce-xdp QPs writes them
    /// ([`super::multipath::MpBthFlags`], docs/multipath.md "Agreeing on the extension"); call
    /// it after [`Self::set_ack_req`], which clears them.
    pub fn set_resv7(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::ACK_REQ];
        *b = (*b & ACK_REQ) | (v & !ACK_REQ);
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        put24(self.buffer.as_mut(), field::PSN.start, v.value());
    }
}

/// A parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count. [`super::RoceRepr::emit`] overwrites it from the payload length.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
    /// The seven reserved bits below AckReq (`resv7`, byte 8), as received; 0 on every packet
    /// roce-xdp sends except those of a QP that allows the multipath extension, which puts
    /// its bits here ([`super::multipath::MpBthFlags`], docs/multipath.md "Agreeing on the
    /// extension"). IBA 9.2 transmits reserved fields as 0 and has receivers ignore them, and
    /// nothing but the multipath negotiation reads this field.
    pub resv7: u8,
}

impl BthRepr {
    /// A BTH with rxe's defaults (P_Key 0xffff, no flags) for `opcode` to `dest_qp` at `psn`.
    #[must_use]
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
            resv7: 0,
        }
    }

    /// Reads a BTH. Rejects a transport version other than 0, as rxe_recv.c does; any opcode,
    /// known or not, is accepted here. Reserved bits are not checked; `resv7` is kept for the
    /// multipath negotiation, the others are ignored.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(WireError::Malformed("BTH transport version is not 0"));
        }
        Ok(Self {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
            resv7: p.resv7(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH with TVer 0, `resv7` as in the repr (0 unless the multipath extension
    /// set it) and the other reserved bits cleared.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_fecn_becn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_resv7(self.resv7);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The BTH of the Mellanox CNP example: 81 00 ffff 40 0000d2 00 000000.
    static CNP_BTH: [u8; 12] = [0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x00, 0xd2, 0, 0, 0, 0];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&CNP_BTH[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::CNP);
        assert!(p.becn() && !p.fecn());
        assert_eq!(p.dest_qp(), Qpn::new(0xd2));
        assert_eq!(p.pkey(), PKey::DEFAULT);
        assert_eq!(p.psn(), Psn::new(0));
    }

    #[test]
    fn construct() {
        let mut r = BthRepr::new(
            Opcode::RC_SEND_ONLY,
            Qpn::new(0x12_3456),
            Psn::new(0xab_cdef),
        );
        r.solicited = true;
        r.pad_count = 3;
        r.ack_req = true;
        r.fecn = true;
        let mut out = [0xa5u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            out,
            [
                0x04, 0xb0, 0xff, 0xff, 0x80, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef
            ]
        );
        assert_eq!(
            BthRepr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn rejects_tver_and_short() {
        let mut b = CNP_BTH;
        b[1] = 0x01;
        assert!(BthRepr::parse(&Packet::new_checked(&b[..]).unwrap()).is_err());
        assert_eq!(
            Packet::new_checked(&b[..11]).unwrap_err(),
            WireError::Truncated
        );
    }
}
