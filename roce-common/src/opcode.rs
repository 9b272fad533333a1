//! The BTH opcode table, data-driven: one row per opcode says which extended headers follow
//! the BTH, whether a payload follows them, where the packet sits in its message, and whether it
//! is a request or a response.
//!
//! Sources: Linux `include/rdma/ib_pack.h` (opcode values) and `drivers/infiniband/sw/rxe/rxe_opcode.c`
//! (which headers each opcode carries and in which order); RoCE v2 CNP from IBA Annex A17.9.3.
//! The header offsets are computed from the header set by [`Hdrs::offset_of`], never typed by hand:
//! hand-written offsets were a source of real bugs in rxe.

/// A BTH opcode byte. Any value can be held; [`Opcode::info`] says whether it is one we know.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct Opcode(pub u8);

/// A set of extended transport headers that follow the BTH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
#[repr(transparent)]
pub struct Hdrs(pub u16);

impl Hdrs {
    /// Datagram ETH (UD): Q_Key and source QP, 8 bytes.
    pub const DETH: Self = Self(1 << 0);
    /// Flush ETH (RC FLUSH), 4 bytes.
    pub const FETH: Self = Self(1 << 1);
    /// RDMA ETH: virtual address, R_Key, DMA length, 16 bytes.
    pub const RETH: Self = Self(1 << 2);
    /// Atomic ETH: VA, R_Key, swap/add, compare, 28 bytes.
    pub const ATOMIC_ETH: Self = Self(1 << 3);
    /// ACK ETH: syndrome and MSN, 4 bytes.
    pub const AETH: Self = Self(1 << 4);
    /// Atomic ACK ETH: the original remote value, 8 bytes.
    pub const ATOMIC_ACK_ETH: Self = Self(1 << 5);
    /// Immediate data, 4 bytes.
    pub const IMMDT: Self = Self(1 << 6);
    /// Invalidate ETH: the R_Key to invalidate, 4 bytes.
    pub const IETH: Self = Self(1 << 7);
    /// The 16 reserved bytes that follow the BTH of a RoCE v2 CNP.
    pub const CNP: Self = Self(1 << 8);

    /// The headers in the order they appear on the wire, with their sizes in bytes.
    pub const ORDER: [(Self, usize); 9] = [
        (Self::DETH, 8),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::ATOMIC_ETH, 28),
        (Self::AETH, 4),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMMDT, 4),
        (Self::IETH, 4),
        (Self::CNP, 16),
    ];

    /// The empty set.
    pub const NONE: Self = Self(0);

    /// The union of two sets.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every header of `other` is in this set.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length in bytes of the headers in this set.
    #[must_use]
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    /// Whether the set is empty.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `hdr` from the end of the BTH, if `hdr` is in this set.
    #[must_use]
    pub const fn offset_of(self, hdr: Self) -> Option<usize> {
        if !self.contains(hdr) || hdr.0.count_ones() != 1 {
            return None;
        }
        let mut off = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            let (h, len) = Self::ORDER[i];
            if h.0 == hdr.0 {
                return Some(off);
            }
            if self.contains(h) {
                off += len;
            }
            i += 1;
        }
        None
    }
}

/// The transport service an opcode belongs to (the top three bits of the opcode).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Transport {
    /// Reliable connection, 0x00-0x1f.
    Rc,
    /// Unreliable connection, 0x20-0x3f.
    Uc,
    /// Reliable datagram, 0x40-0x5f (not supported by roce-xdp).
    Rd,
    /// Unreliable datagram, 0x60-0x7f.
    Ud,
    /// Congestion notification, 0x80-0x9f.
    Cnp,
    /// Reserved or manufacturer-specific, 0xa0-0xff.
    Other,
}

/// Where a packet sits in its message (IBA 9.7.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// A packet between the first and the last.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// The only packet of a message.
    Only,
}

/// What an opcode does.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Operation {
    /// SEND (consumes a receive WQE).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Compare and swap.
    CompareSwap,
    /// Fetch and add.
    FetchAdd,
    /// Acknowledge (ACK or NAK).
    Acknowledge,
    /// Atomic acknowledge.
    AtomicAcknowledge,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite,
    /// RoCE v2 congestion notification packet.
    Cnp,
}

/// One row of the opcode table.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OpcodeInfo {
    /// The opcode's name as in `ib_pack.h`, for example `RC_SEND_FIRST`.
    pub name: &'static str,
    /// The extended headers that follow the BTH.
    pub hdrs: Hdrs,
    /// Whether a payload follows the extended headers.
    pub payload: bool,
    /// Where the packet sits in its message.
    pub position: Position,
    /// What the opcode does.
    pub operation: Operation,
    /// Whether the packet carries immediate data.
    pub immediate: bool,
    /// Whether the packet carries an IETH (SEND with invalidate).
    pub invalidate: bool,
}

impl OpcodeInfo {
    /// Whether this opcode is sent by a requester (as opposed to a responder's answer).
    #[must_use]
    pub const fn is_request(&self) -> bool {
        !self.is_response() && !matches!(self.operation, Operation::Cnp)
    }

    /// Whether this opcode is a responder's answer (READ response, ACK/NAK, atomic ACK).
    #[must_use]
    pub const fn is_response(&self) -> bool {
        matches!(
            self.operation,
            Operation::ReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
        )
    }

    /// Length in bytes of the extended headers after the BTH.
    #[must_use]
    pub const fn ext_len(&self) -> usize {
        self.hdrs.len()
    }

    /// Whether the packet starts a message (`First` or `Only`).
    #[must_use]
    pub const fn starts_message(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }

    /// Whether the packet ends a message (`Last` or `Only`).
    #[must_use]
    pub const fn ends_message(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
}

macro_rules! opcodes {
    ($( $name:ident = $val:literal => $op:ident, $pos:ident, [$($h:ident),*], payload $pl:literal, imm $imm:literal, inv $inv:literal; )*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($val), ").")]
                pub const $name: Self = Self($val);
            )*

            /// Every opcode in the table, in ascending order.
            pub const ALL: &'static [Self] = &[$(Self::$name),*];

            /// The table row of this opcode, or `None` for an opcode roce-xdp does not know
            /// (reserved values, RD, manufacturer-specific).
            #[must_use]
            pub const fn info(self) -> Option<OpcodeInfo> {
                match self.0 {
                    $(
                        $val => Some(OpcodeInfo {
                            name: stringify!($name),
                            hdrs: Hdrs::NONE$(.with(Hdrs::$h))*,
                            payload: $pl,
                            position: Position::$pos,
                            operation: Operation::$op,
                            immediate: $imm,
                            invalidate: $inv,
                        }),
                    )*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00 => Send, First, [], payload true, imm false, inv false;
    RC_SEND_MIDDLE = 0x01 => Send, Middle, [], payload true, imm false, inv false;
    RC_SEND_LAST = 0x02 => Send, Last, [], payload true, imm false, inv false;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03 => Send, Last, [IMMDT], payload true, imm true, inv false;
    RC_SEND_ONLY = 0x04 => Send, Only, [], payload true, imm false, inv false;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05 => Send, Only, [IMMDT], payload true, imm true, inv false;
    RC_RDMA_WRITE_FIRST = 0x06 => Write, First, [RETH], payload true, imm false, inv false;
    RC_RDMA_WRITE_MIDDLE = 0x07 => Write, Middle, [], payload true, imm false, inv false;
    RC_RDMA_WRITE_LAST = 0x08 => Write, Last, [], payload true, imm false, inv false;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09 => Write, Last, [IMMDT], payload true, imm true, inv false;
    RC_RDMA_WRITE_ONLY = 0x0a => Write, Only, [RETH], payload true, imm false, inv false;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b => Write, Only, [RETH, IMMDT], payload true, imm true, inv false;
    RC_RDMA_READ_REQUEST = 0x0c => ReadRequest, Only, [RETH], payload false, imm false, inv false;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d => ReadResponse, First, [AETH], payload true, imm false, inv false;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e => ReadResponse, Middle, [], payload true, imm false, inv false;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f => ReadResponse, Last, [AETH], payload true, imm false, inv false;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10 => ReadResponse, Only, [AETH], payload true, imm false, inv false;
    RC_ACKNOWLEDGE = 0x11 => Acknowledge, Only, [AETH], payload false, imm false, inv false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12 => AtomicAcknowledge, Only, [AETH, ATOMIC_ACK_ETH], payload false, imm false, inv false;
    RC_COMPARE_SWAP = 0x13 => CompareSwap, Only, [ATOMIC_ETH], payload false, imm false, inv false;
    RC_FETCH_ADD = 0x14 => FetchAdd, Only, [ATOMIC_ETH], payload false, imm false, inv false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16 => Send, Last, [IETH], payload true, imm false, inv true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17 => Send, Only, [IETH], payload true, imm false, inv true;
    RC_FLUSH = 0x1c => Flush, Only, [FETH, RETH], payload false, imm false, inv false;
    RC_ATOMIC_WRITE = 0x1d => AtomicWrite, Only, [RETH], payload true, imm false, inv false;
    UC_SEND_FIRST = 0x20 => Send, First, [], payload true, imm false, inv false;
    UC_SEND_MIDDLE = 0x21 => Send, Middle, [], payload true, imm false, inv false;
    UC_SEND_LAST = 0x22 => Send, Last, [], payload true, imm false, inv false;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23 => Send, Last, [IMMDT], payload true, imm true, inv false;
    UC_SEND_ONLY = 0x24 => Send, Only, [], payload true, imm false, inv false;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25 => Send, Only, [IMMDT], payload true, imm true, inv false;
    UC_RDMA_WRITE_FIRST = 0x26 => Write, First, [RETH], payload true, imm false, inv false;
    UC_RDMA_WRITE_MIDDLE = 0x27 => Write, Middle, [], payload true, imm false, inv false;
    UC_RDMA_WRITE_LAST = 0x28 => Write, Last, [], payload true, imm false, inv false;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29 => Write, Last, [IMMDT], payload true, imm true, inv false;
    UC_RDMA_WRITE_ONLY = 0x2a => Write, Only, [RETH], payload true, imm false, inv false;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b => Write, Only, [RETH, IMMDT], payload true, imm true, inv false;
    UD_SEND_ONLY = 0x64 => Send, Only, [DETH], payload true, imm false, inv false;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65 => Send, Only, [DETH, IMMDT], payload true, imm true, inv false;
    CNP = 0x81 => Cnp, Only, [CNP], payload false, imm false, inv false;
}

impl Opcode {
    /// The transport service, from the opcode's top three bits.
    #[must_use]
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            _ => Transport::Other,
        }
    }

    /// The length of the extended headers after the BTH, or `None` for an unknown opcode.
    ///
    /// The XDP program calls this to check that a packet holds its opcode's headers.
    #[must_use]
    pub const fn ext_len(self) -> Option<usize> {
        match self.info() {
            Some(info) => Some(info.ext_len()),
            None => None,
        }
    }

    /// The name from `ib_pack.h`, or `None` for an unknown opcode.
    #[must_use]
    pub const fn name(self) -> Option<&'static str> {
        match self.info() {
            Some(info) => Some(info.name),
            None => None,
        }
    }
}

impl core::fmt::Debug for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}"),
            None => write!(f, "UNKNOWN_OPCODE(0x{:02x})", self.0),
        }
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_positions() {
        for &op in Opcode::ALL {
            let info = op.info().unwrap();
            let pos = info.position;
            if info.name.contains("_FIRST") {
                assert_eq!(pos, Position::First, "{}", info.name);
            } else if info.name.contains("_MIDDLE") {
                assert_eq!(pos, Position::Middle, "{}", info.name);
            } else if info.name.contains("_LAST") {
                assert_eq!(pos, Position::Last, "{}", info.name);
            } else {
                assert_eq!(pos, Position::Only, "{}", info.name);
            }
            assert_eq!(
                info.immediate,
                info.hdrs.contains(Hdrs::IMMDT),
                "{}",
                info.name
            );
            assert_eq!(
                info.invalidate,
                info.hdrs.contains(Hdrs::IETH),
                "{}",
                info.name
            );
        }
    }

    #[test]
    fn header_lengths_match_rxe() {
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.ext_len(),
            Some(20)
        );
        assert_eq!(Opcode::RC_ATOMIC_ACKNOWLEDGE.ext_len(), Some(12));
        assert_eq!(Opcode::RC_COMPARE_SWAP.ext_len(), Some(28));
        assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.ext_len(), Some(12));
        assert_eq!(Opcode::CNP.ext_len(), Some(16));
        assert_eq!(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.ext_len(), Some(0));
        assert_eq!(Opcode(0x15).ext_len(), None);
        assert_eq!(Opcode(0x40).info(), None);
    }

    #[test]
    fn offsets_follow_wire_order() {
        let h = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            .info()
            .unwrap()
            .hdrs;
        assert_eq!(h.offset_of(Hdrs::RETH), Some(0));
        assert_eq!(h.offset_of(Hdrs::IMMDT), Some(16));
        let h = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().hdrs;
        assert_eq!(h.offset_of(Hdrs::AETH), Some(0));
        assert_eq!(h.offset_of(Hdrs::ATOMIC_ACK_ETH), Some(4));
        let h = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap().hdrs;
        assert_eq!(h.offset_of(Hdrs::DETH), Some(0));
        assert_eq!(h.offset_of(Hdrs::IMMDT), Some(8));
        assert_eq!(h.offset_of(Hdrs::RETH), None);
    }

    #[test]
    fn request_response_split() {
        assert!(Opcode::RC_RDMA_READ_REQUEST.info().unwrap().is_request());
        assert!(Opcode::RC_ACKNOWLEDGE.info().unwrap().is_response());
        assert!(!Opcode::CNP.info().unwrap().is_response());
        assert!(!Opcode::CNP.info().unwrap().is_request());
        assert_eq!(Opcode::CNP.transport(), Transport::Cnp);
        assert_eq!(Opcode::UD_SEND_ONLY.transport(), Transport::Ud);
        assert_eq!(Opcode::ALL.len(), 40);
    }

    #[test]
    fn unknown_opcode_has_a_name() {
        extern crate std;
        use std::format;
        assert_eq!(format!("{:?}", Opcode(0x15)), "UNKNOWN_OPCODE(0x15)");
        assert_eq!(format!("{}", Opcode::RC_SEND_ONLY), "RC_SEND_ONLY");
    }
}

/// Marks an unknown opcode in [`EXT_LEN_TABLE`].
pub const EXT_LEN_UNKNOWN: u8 = 0xff;

/// Extended-header length after the BTH for each opcode byte, [`EXT_LEN_UNKNOWN`] for opcodes
/// that are not in the table. The XDP program indexes this with the opcode: one load, no branches.
pub const EXT_LEN_TABLE: [u8; 256] = {
    let mut t = [EXT_LEN_UNKNOWN; 256];
    let mut i = 0;
    while i < 256 {
        if let Some(len) = Opcode(i as u8).ext_len() {
            t[i] = len as u8;
        }
        i += 1;
    }
    t
};

/// Bit of an [`XDP_OPCODE_TABLE`] entry set when the opcode carries no payload.
pub const XDP_NO_PAYLOAD: u8 = 0x40;

/// Bit of an [`XDP_OPCODE_TABLE`] entry set when the transport acts on a packet's arrival time
/// whether or not it carries a CE mark: responses (ACK/NAK, READ responses, atomic ACKs: Swift's
/// RTT sample ends at their arrival) and CNPs (the reaction point counts
/// `rate_reduce_monitor_period` between arrivals). `roce_xdp` reads the clock for CNPs, for
/// responses to a QP whose `ROCE_QPS` entry has [`crate::maps::QP_FLAG_TIME_RESPONSES`] (its
/// congestion control samples RTTs) and for CE-marked packets (the notification point's CNP
/// interval); any other frame gets [`crate::stamp::UNTIMED`], and no clock read.
pub const XDP_TIMED: u8 = 0x80;

/// The XDP program's opcode table: for each opcode byte, the extended-header length in the low
/// six bits, [`XDP_NO_PAYLOAD`] for opcodes without a payload (ACKs, READ requests, atomics,
/// CNPs) and [`XDP_TIMED`] for responses and CNPs, or [`EXT_LEN_UNKNOWN`] for opcodes not in
/// the table. One load per packet.
pub const XDP_OPCODE_TABLE: [u8; 256] = {
    let mut t = [EXT_LEN_UNKNOWN; 256];
    let mut i = 0;
    while i < 256 {
        if let Some(info) = Opcode(i as u8).info() {
            let flag = if info.payload { 0 } else { XDP_NO_PAYLOAD };
            let timed = if info.is_request() { 0 } else { XDP_TIMED };
            t[i] = info.ext_len() as u8 | flag | timed;
        }
        i += 1;
    }
    t
};

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn xdp_table_agrees_with_info() {
        for i in 0..=255u8 {
            let e = XDP_OPCODE_TABLE[i as usize];
            match Opcode(i).info() {
                Some(info) => {
                    assert!(info.ext_len() < 0x40);
                    assert_eq!((e & 0x3f) as usize, info.ext_len());
                    assert_eq!(e & XDP_NO_PAYLOAD == 0, info.payload);
                    assert_eq!(
                        e & XDP_TIMED != 0,
                        info.is_response() || Opcode(i) == Opcode::CNP,
                        "{i:#x}"
                    );
                    assert_ne!(e, EXT_LEN_UNKNOWN, "{i:#x}");
                }
                None => assert_eq!(e, EXT_LEN_UNKNOWN),
            }
        }
    }

    #[test]
    fn xdp_table_passes_every_uc_opcode() {
        // UC_SEND_FIRST (0x20) ..= UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE (0x2b): steered by QPN
        // like RC, so the program only has to know their header lengths.
        for i in 0x20..=0x2bu8 {
            assert_eq!(Opcode(i).transport(), Transport::Uc);
            assert_ne!(XDP_OPCODE_TABLE[i as usize], EXT_LEN_UNKNOWN, "{i:#x}");
        }
        assert_eq!(XDP_OPCODE_TABLE[0x2c], EXT_LEN_UNKNOWN);
    }

    #[test]
    fn ext_len_table_agrees_with_info() {
        for i in 0..=255u8 {
            match Opcode(i).ext_len() {
                Some(len) => assert_eq!(EXT_LEN_TABLE[i as usize] as usize, len),
                None => assert_eq!(EXT_LEN_TABLE[i as usize], EXT_LEN_UNKNOWN),
            }
        }
    }
}
