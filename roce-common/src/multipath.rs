//! The multipath extension's marks that the XDP program and user space both read
//! (docs/multipath.md, "The wire format of the extension"). Only between two roce-xdp QPs that
//! agreed in band; towards anyone else every packet is plain RoCE v2.

/// Bit 0 of the BTH's `resv7` field (byte 8, below AckReq): the sending QP allows the
/// extension (IBA 9.2 sends reserved fields as 0 and has receivers ignore them).
pub const RESV7_OFFER: u8 = 0x01;

/// Bit 1 of the BTH's `resv7` field: the packet ends in a multipath trailer (placement on
/// requests and READ responses, SACK on ACKs, path feedback in CNPs).
pub const RESV7_TRAILER: u8 = 0x02;

/// Bit 2 of the BTH's `resv7` field, on every packet of a QP with the extension on: its
/// responder holds READ requests and atomics that arrive beyond a hole until the cumulative
/// PSN reaches them, so the peer's requester may keep them in selective repeat
/// (docs/multipath.md). A peer that never sets it (an older roce-xdp) gets them plain and in
/// order, as before.
pub const RESV7_HOLD: u8 = 0x04;

/// Bit 3 of the BTH's `resv7` field, on a READ request marked [`RESV7_HOLD`]: the requester
/// places the READ's response packets on its own, so the responder sends them with placement
/// trailers and sprays them (docs/multipath.md, "Placement out of order"). An older roce-xdp
/// requester, which takes a READ response only in order and plain, never sets it and gets its
/// responses plain.
pub const RESV7_READ_PLACED: u8 = 0x08;

/// Bytes of the SACK trailer, the only payload an ACKNOWLEDGE may carry (with
/// [`RESV7_TRAILER`]): a 64-bit bitmap and a 32-bit count of packets held.
pub const SACK_TRAILER_LEN: usize = 12;
