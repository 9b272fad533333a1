//! Fixed header layouts that the eBPF program reads in place.
//!
//! Fields are byte arrays, so every struct has alignment 1 and no padding, and can sit at any
//! offset of a packet (the network-types convention). Multi-byte fields are big-endian on the wire;
//! the getters convert.

/// EtherType of IPv4.
pub const ETH_P_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// EtherType of an 802.1Q customer VLAN tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// EtherType of an 802.1ad service VLAN tag.
pub const ETH_P_8021AD: u16 = 0x88a8;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// How many VLAN tags the XDP program looks through (802.1ad outer plus 802.1Q inner).
pub const MAX_VLAN_TAGS: usize = 2;
/// How many IPv6 extension headers the XDP program skips before giving up on a packet.
pub const MAX_IPV6_EXT_HDRS: usize = 4;

/// Length of the RoCE v2 invariant CRC that ends every packet.
pub const ICRC_LEN: usize = 4;

/// Host-order getters of big-endian `u16` fields, for the headers' `impl` blocks: each
/// `name => field;` (after its doc comment) becomes an `#[inline(always)]`, `#[must_use]`
/// `pub const fn name(&self) -> u16` returning `u16::from_be_bytes(self.field)`.
macro_rules! be_u16_getters {
    ($( $(#[$doc:meta])* $name:ident => $field:ident; )*) => {
        $(
            $(#[$doc])*
            #[inline(always)]
            #[must_use]
            pub const fn $name(&self) -> u16 {
                u16::from_be_bytes(self.$field)
            }
        )*
    };
}

/// Ethernet II header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EthHdr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType (or TPID of a VLAN tag).
    pub ether_type: [u8; 2],
}

impl EthHdr {
    /// Header length.
    pub const LEN: usize = core::mem::size_of::<Self>();

    be_u16_getters! {
        /// EtherType, host order.
        ether_type => ether_type;
    }
}

/// The 4 bytes of an 802.1Q/802.1ad tag that follow the TPID: TCI and the inner EtherType.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VlanHdr {
    /// PCP, DEI and VLAN id.
    pub tci: [u8; 2],
    /// The EtherType that follows the tag.
    pub ether_type: [u8; 2],
}

impl VlanHdr {
    /// Header length.
    pub const LEN: usize = core::mem::size_of::<Self>();

    be_u16_getters! {
        /// Inner EtherType, host order.
        ether_type => ether_type;
    }
}

/// IPv4 header without options.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ipv4Hdr {
    /// Version (4 bits) and IHL in 32-bit words (4 bits).
    pub version_ihl: u8,
    /// DSCP (6 bits) and ECN (2 bits).
    pub tos: u8,
    /// Total length including the header.
    pub tot_len: [u8; 2],
    /// Identification.
    pub id: [u8; 2],
    /// Flags (3 bits) and fragment offset (13 bits).
    pub frag_off: [u8; 2],
    /// Time to live.
    pub ttl: u8,
    /// Protocol of the payload.
    pub proto: u8,
    /// Header checksum.
    pub check: [u8; 2],
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
}

impl Ipv4Hdr {
    /// Length of the header without options.
    pub const LEN: usize = core::mem::size_of::<Self>();
    /// More-fragments flag in `frag_off`.
    pub const MF: u16 = 0x2000;
    /// Don't-fragment flag in `frag_off`.
    pub const DF: u16 = 0x4000;
    /// Fragment offset mask in `frag_off`.
    pub const OFFSET_MASK: u16 = 0x1fff;

    /// IP version, expected 4.
    #[inline(always)]
    #[must_use]
    pub const fn version(&self) -> u8 {
        self.version_ihl >> 4
    }

    /// Header length in bytes, options included.
    #[inline(always)]
    #[must_use]
    pub const fn header_len(&self) -> usize {
        ((self.version_ihl & 0x0f) as usize) * 4
    }

    be_u16_getters! {
        /// Total length, host order.
        tot_len => tot_len;
        /// Flags and fragment offset, host order.
        frag_off => frag_off;
    }
}

/// IPv6 fixed header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ipv6Hdr {
    /// Version (4), traffic class (8) and flow label (20).
    pub vtc_flow: [u8; 4],
    /// Payload length (extension headers included).
    pub payload_len: [u8; 2],
    /// Next header.
    pub next_hdr: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
}

impl Ipv6Hdr {
    /// Header length.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// IP version, expected 6.
    #[inline(always)]
    #[must_use]
    pub const fn version(&self) -> u8 {
        self.vtc_flow[0] >> 4
    }

    /// Traffic class (DSCP and ECN).
    #[inline(always)]
    #[must_use]
    pub const fn traffic_class(&self) -> u8 {
        (self.vtc_flow[0] << 4) | (self.vtc_flow[1] >> 4)
    }

    be_u16_getters! {
        /// Payload length, host order.
        payload_len => payload_len;
    }
}

/// The first two bytes of an IPv6 extension header (hop-by-hop, routing, destination options,
/// fragment, AH).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ipv6ExtHdr {
    /// Next header.
    pub next_hdr: u8,
    /// Length in 8-octet units, not counting the first 8 (AH: 4-octet units minus 2).
    pub hdr_len: u8,
}

impl Ipv6ExtHdr {
    /// Hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing header.
    pub const ROUTING: u8 = 43;
    /// Fragment header.
    pub const FRAGMENT: u8 = 44;
    /// Authentication header.
    pub const AUTH: u8 = 51;
    /// Destination options.
    pub const DEST_OPTS: u8 = 60;
}

/// IPv6 fragment header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ipv6FragHdr {
    /// Next header.
    pub next_hdr: u8,
    /// Reserved.
    pub reserved: u8,
    /// Fragment offset (13 bits), reserved (2), M flag (1).
    pub frag_off: [u8; 2],
    /// Identification.
    pub id: [u8; 4],
}

/// UDP header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpHdr {
    /// Source port.
    pub src: [u8; 2],
    /// Destination port.
    pub dst: [u8; 2],
    /// Length, header included.
    pub len: [u8; 2],
    /// Checksum (0 for RoCE v2 over IPv4).
    pub check: [u8; 2],
}

impl UdpHdr {
    /// Header length.
    pub const LEN: usize = core::mem::size_of::<Self>();

    be_u16_getters! {
        /// Source port, host order (RoCE v2 senders put flow entropy there).
        src_port => src;
        /// Destination port, host order.
        dst_port => dst;
        /// Length field (header plus payload), host order.
        length => len;
    }
}

/// Base transport header (IBA 9.2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Bth {
    /// Opcode.
    pub opcode: u8,
    /// SE (0x80), MigReq (0x40), PadCnt (0x30), TVer (0x0f).
    pub flags: u8,
    /// Partition key.
    pub pkey: [u8; 2],
    /// FECN (0x80), BECN (0x40), reserved (0x3f).
    pub fecn_becn: u8,
    /// Destination QP number.
    pub dest_qp: [u8; 3],
    /// AckReq (0x80), reserved (0x7f).
    pub ack_req: u8,
    /// Packet sequence number.
    pub psn: [u8; 3],
}

impl Bth {
    /// Header length.
    pub const LEN: usize = core::mem::size_of::<Self>();

    /// Transport header version, must be 0.
    #[inline(always)]
    #[must_use]
    pub const fn tver(&self) -> u8 {
        self.flags & 0x0f
    }

    /// Pad count: bytes added to align the payload to 4.
    #[inline(always)]
    #[must_use]
    pub const fn pad_count(&self) -> u8 {
        (self.flags >> 4) & 0x3
    }

    /// Destination QP number, host order.
    #[inline(always)]
    #[must_use]
    pub const fn dest_qp(&self) -> u32 {
        ((self.dest_qp[0] as u32) << 16) | ((self.dest_qp[1] as u32) << 8) | self.dest_qp[2] as u32
    }

    /// The 7 reserved bits after AckReq (`resv7`): 0 but for the multipath extension's marks
    /// ([`crate::multipath`]).
    #[inline(always)]
    #[must_use]
    pub const fn resv7(&self) -> u8 {
        self.ack_req & 0x7f
    }

    /// Packet sequence number (24 bits), host order.
    #[inline(always)]
    #[must_use]
    pub const fn psn(&self) -> u32 {
        ((self.psn[0] as u32) << 16) | ((self.psn[1] as u32) << 8) | self.psn[2] as u32
    }
}

const _: () = assert!(EthHdr::LEN == 14);
const _: () = assert!(VlanHdr::LEN == 4);
const _: () = assert!(Ipv4Hdr::LEN == 20);
const _: () = assert!(Ipv6Hdr::LEN == 40);
const _: () = assert!(core::mem::size_of::<Ipv6FragHdr>() == 8);
const _: () = assert!(UdpHdr::LEN == 8);
const _: () = assert!(Bth::LEN == 12);
