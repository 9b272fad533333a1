//! Counters for what the wire layer refuses, one per [`WireError`] kind plus bad ICRCs, so
//! that the engine turns every bad frame into a counted drop (rxe counts ICRC failures as
//! drops too, rxe_recv.c).

use super::{Frame, Result, WireError};

roce_common::counter_struct! {
    /// Frames refused by [`super::parse_frame`], by reason, and emits refused by
    /// [`super::emit_frame`].
    pub struct WireDrops {
        /// Received frames shorter than their headers or length fields say.
        rx_truncated,
        /// Received frames with a forbidden field value (IPv4 checksum, BTH TVer, pad count).
        rx_malformed,
        /// Received RoCE frames whose BTH opcode is not in the opcode table.
        rx_unknown_opcode,
        /// Received frames that are valid but unhandled (IP fragments or options, IPv6 extension headers, three VLAN tags).
        rx_unsupported,
        /// Received frames that are not RoCE v2 (EtherType, IP protocol or UDP port).
        rx_not_roce,
        /// Received RoCE frames whose ICRC does not match.
        rx_bad_icrc,
        /// Frames that could not be emitted (buffer too small or a repr inconsistent with its opcode).
        tx_invalid,
    }
}

impl WireDrops {
    /// Counts one refused frame or emit.
    pub fn record_error(&mut self, e: &WireError) {
        match e {
            WireError::Truncated => self.rx_truncated += 1,
            WireError::Malformed(_) => self.rx_malformed += 1,
            WireError::UnknownOpcode(_) => self.rx_unknown_opcode += 1,
            WireError::Unsupported(_) => self.rx_unsupported += 1,
            WireError::NotRoce(_) => self.rx_not_roce += 1,
            WireError::BufferTooSmall { .. } | WireError::InvalidRepr(_) => self.tx_invalid += 1,
        }
    }

    /// Counts the outcome of a parse and returns the frame if the transport should take it:
    /// parsed and with a valid ICRC. Call it on the result of [`super::parse_frame`].
    pub fn accept<'a>(&mut self, parsed: Result<Frame<'a>>) -> Option<Frame<'a>> {
        match parsed {
            Ok(f) if f.icrc_ok => Some(f),
            Ok(_) => {
                self.rx_bad_icrc += 1;
                None
            }
            Err(e) => {
                self.record_error(&e);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse_frame;

    #[test]
    fn counts_each_reason() {
        let mut d = WireDrops::default();
        let mut f = [0u8; 74];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14..].copy_from_slice(&crate::wire::icrc::MELLANOX_CNP);
        assert!(d.accept(parse_frame(&f)).is_some());
        assert!(d.accept(parse_frame(&f[..20])).is_none());
        let mut bad = f;
        bad[70] ^= 1;
        assert!(d.accept(parse_frame(&bad)).is_none());
        let mut arp = f;
        arp[13] = 0x06;
        assert!(d.accept(parse_frame(&arp)).is_none());
        assert_eq!(d.get("rx_truncated"), Some(1));
        assert_eq!(d.rx_bad_icrc, 1);
        assert_eq!(d.rx_not_roce, 1);
        assert_eq!(WireDrops::NAMES.len(), 7);
    }
}
