//! Wire codecs of the communication manager's MADs (IBTA vol 1, 12.6 "Communication management
//! messages"), laid out as the kernel lays them out (include/rdma/ibta_vol1_c12.h,
//! drivers/infiniband/core/cm_msgs.h).
//!
//! A CM MAD is 256 bytes: the 24-byte common MAD header (IBTA 13.4.2) and 232 bytes of CM
//! attribute data. Offsets below are from the start of the attribute data (the kernel's
//! `CM_FIELD*_LOC(struct, byte_offset, width)`, to which the header length is added); a field
//! of `width` bits starts at the most significant bit of its first byte (big-endian, IBTA 12.6
//! "all fields are in network byte order").
//!
//! Message sections are those of IBTA vol 1 chapter 12 (12.6.5 REQ to 12.6.11 DREP, 12.11
//! SIDR); table numbers are the ones ibta_vol1_c12.h names.
//!
//! Call [`CmMad::decode`] on the payload of every UD SEND that reached QP1 with the CM class;
//! it never panics and names what was wrong with a bad MAD. Call [`CmMad::encode`] to build the
//! 256 bytes of one to send.

use core::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::wire::{PKey, Psn, QKey, Qpn};

pub use roce_common::mad::{MAD_HDR_LEN, MAD_LEN, MGMT_CLASS_CM};
/// Length of the CM attribute data that follows the header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// `BaseVersion` of every MAD (IBTA 13.4.2, `IB_MGMT_BASE_VERSION`).
pub const BASE_VERSION: u8 = 1;
/// `ClassVersion` the CM speaks (IBTA 12.11.1; `IB_CM_CLASS_VERSION` in cm_msgs.h).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` of every CM message: CM messages are unsolicited SENDs (IBTA 12.11.1,
/// `IB_MGMT_METHOD_SEND`).
pub const METHOD_SEND: u8 = 0x03;

/// Why bytes are not a CM MAD we accept. Every variant names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// Fewer than 256 bytes.
    #[error("CM MAD truncated: {0} bytes, a MAD is 256 (IBTA 13.4.1)")]
    Truncated(usize),
    /// `BaseVersion` is not 1.
    #[error("MAD base version {0}, expected 1 (IBTA 13.4.2)")]
    BadBaseVersion(u8),
    /// Not the CM management class.
    #[error("management class {0:#04x} is not the communication manager (0x07)")]
    BadClass(u8),
    /// A CM class version we do not speak.
    #[error("CM class version {0}, we speak 2 (IBTA 12.11.1)")]
    BadClassVersion(u8),
    /// Not method SEND.
    #[error("CM method {0:#04x}, CM messages use SEND (0x03)")]
    BadMethod(u8),
    /// An attribute ID that is no CM message.
    #[error("attribute {0:#06x} is not a CM message (IBTA 12.11.2)")]
    UnknownAttribute(u16),
    /// LAP, APR, ClassPortInfo: CM attributes we do not implement (no path migration).
    #[error("CM attribute {0:#06x} is not supported (no alternate path migration)")]
    UnsupportedAttribute(u16),
    /// A field holds a value the specification reserves.
    #[error("{field} = {value} is reserved (IBTA 12.6)")]
    Reserved {
        /// The field, as the kernel names it.
        field: &'static str,
        /// The value found.
        value: u32,
    },
    /// More private data than the message carries.
    #[error("{len} bytes of private data, a {msg} carries at most {max}")]
    PrivateDataTooLong {
        /// The message.
        msg: &'static str,
        /// Its private data capacity.
        max: usize,
        /// What was given.
        len: usize,
    },
}

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($ty:ty), $w:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
        pub struct $name(pub $ty);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#0", $w, "x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!("{:#0", $w, "x}"), self.0)
            }
        }
    };
}

newtype!(
    /// A communication ID (IBTA 12.6.5 "LocalCommID"): the handle each side gives a
    /// connection; never 0 on the wire except as "unknown" in a REJ of a REQ.
    CommId(u32), 10
);
newtype!(
    /// A 64-bit service ID (IBTA 12.7.3, Annex A3): what a REQ or SIDR_REQ asks for and a
    /// listener listens on. RDMA CM builds it from a port space and a port
    /// ([`ServiceId::rdma_cm`]).
    ServiceId(u64), 18
);
newtype!(
    /// A channel adapter's GUID (IBTA 4.1.1), the node GUID the CM sends as LocalCAGUID;
    /// with the QPN it identifies a connection for stale-connection detection (IBTA 12.4.1).
    CaGuid(u64), 18
);
impl CaGuid {
    /// The node GUID of an Ethernet port: its MAC as a modified EUI-64 (RFC 4291 appendix A:
    /// `ff:fe` in the middle, the universal/local bit flipped), as rxe derives its node GUID
    /// (`rxe_init_device_param` via `addrconf_addr_eui48`). Stable for the interface, never 0.
    #[must_use]
    pub const fn from_mac(m: [u8; 6]) -> Self {
        Self(u64::from_be_bytes([
            m[0] ^ 2,
            m[1],
            m[2],
            0xff,
            0xfe,
            m[3],
            m[4],
            m[5],
        ]))
    }
}

newtype!(
    /// A MAD transaction ID (IBTA 13.4.6.4): a request and its responses share it.
    Tid(u64), 18
);

/// A 5-bit IBA time value: `4.096 µs × 2^t` (IBTA 12.7.13 "CM response timeout" and 9.7.6.1.3
/// for the encoding). Values above 31 are masked.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Debug,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct IbaTime(u8);

impl IbaTime {
    /// `t` masked to 5 bits.
    #[must_use]
    pub const fn new(t: u8) -> Self {
        Self(t & 0x1f)
    }

    /// The exponent.
    #[must_use]
    pub const fn value(self) -> u8 {
        self.0
    }

    /// `4.096 µs × 2^t`, exact (up to 2.4 hours for t = 31).
    #[must_use]
    pub const fn duration(self) -> core::time::Duration {
        core::time::Duration::from_nanos(4096u64 << self.0)
    }
}

/// A GID (IBTA 4.1.1). On RoCE v2 it is the IP address: an IPv6 address, or an IPv4 address
/// mapped into `::ffff:0:0/96` (IBTA Annex A17.4.5.1, as rxe's `rdma_ip2gid`).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4-mapped for IPv4).
    #[must_use]
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Self(v6.octets()),
        }
    }

    /// The IP address the GID stands for (an IPv4-mapped GID gives the IPv4 address).
    #[must_use]
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}

/// The CM attribute IDs (IBTA 12.11.2 Table 123; `CM_*_ATTR_ID` in cm_msgs.h): the table in
/// `roce_common::mad`, which `roce_impair`'s `--mad` selector reads too.
pub use roce_common::mad::CmAttr as AttrId;

/// The attribute for an ID as [`CmMad::decode_hdr`] takes it: LAP (0x19), APR (0x1A) and
/// ClassPortInfo (0x01) are CM attributes we do not implement, anything else is no CM message.
///
/// # Errors
/// [`MadError::UnsupportedAttribute`] or [`MadError::UnknownAttribute`].
pub fn attr_id(v: u16) -> Result<AttrId, MadError> {
    match AttrId::from_u16(v) {
        Some(a) => Ok(a),
        None if roce_common::mad::CM_ATTRS_UNSUPPORTED.contains(&v) => {
            Err(MadError::UnsupportedAttribute(v))
        }
        None => Err(MadError::UnknownAttribute(v)),
    }
}

/// The common MAD header of a CM MAD (IBTA 13.4.2, Figure 146): what varies is the
/// transaction ID, the attribute and its modifier (the kernel may carry ECE data there).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MadHdr {
    /// `Status` (0 in CM messages; kept as received).
    pub status: u16,
    /// `TransactionID`.
    pub tid: Tid,
    /// `AttributeID`.
    pub attr_id: AttrId,
    /// `AttributeModifier`.
    pub attr_mod: u32,
}

/// Big-endian field access on the attribute data (offsets as in ibta_vol1_c12.h).
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }
    fn u24(&self, at: usize) -> u32 {
        u32::from_be_bytes([0, self.0[at], self.0[at + 1], self.0[at + 2]])
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
    fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }
    fn gid(&self, at: usize) -> Gid {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[at..at + 16]);
        Gid(g)
    }
    fn bytes(&self, at: usize, len: usize) -> Vec<u8> {
        self.0[at..at + len].to_vec()
    }
}

struct Wr<'a>(&'a mut [u8]);

impl Wr<'_> {
    fn u8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    fn u24(&mut self, at: usize, v: u32) {
        self.0[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, at: usize, b: &[u8]) {
        self.0[at..at + b.len()].copy_from_slice(b);
    }
}

/// The transport service type of a REQ (IBTA 12.6.5 Table 106 "Transport Service Type";
/// with `Extended` the extended transport type field says which, 1 = XRC).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum TransportType {
    /// Reliable connection (0).
    Rc,
    /// Unreliable connection (1).
    Uc,
    /// Reliable datagram (2).
    Rd,
    /// Extended (3): the extended transport type names it (1 = XRC, IBA Annex A14).
    Extended(u8),
}

/// Path MTU of a REQ (IBTA 12.6.5 "Path Packet Payload MTU", encoded as in 9.7.6.1.2 /
/// `enum ib_mtu`: 1 = 256 … 5 = 4096). 0 and 6–15 are reserved.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct PathMtu(u8);

impl PathMtu {
    /// 1024 bytes (the `ib_mtu` code 3).
    pub const MTU_1024: Self = Self(3);
    /// 4096 bytes (code 5).
    pub const MTU_4096: Self = Self(5);

    /// The MTU for an `ib_mtu` code.
    ///
    /// # Errors
    /// [`MadError::Reserved`] for codes outside 1..=5.
    pub const fn from_code(code: u8) -> Result<Self, MadError> {
        if code >= 1 && code <= 5 {
            Ok(Self(code))
        } else {
            Err(MadError::Reserved {
                field: "path_mtu",
                value: code as u32,
            })
        }
    }

    /// The code.
    #[must_use]
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The MTU in bytes (`128 << code`).
    #[must_use]
    pub const fn bytes(self) -> u32 {
        128 << self.0
    }
}

/// One path of a REQ (primary at attribute offset 52, alternate at 96; IBTA 12.6.5 Table 106).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, permissive, on RoCE: the kernel's `cm_format_req`).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (our IP on RoCE).
    pub local_gid: Gid,
    /// Remote port GID (the peer's IP).
    pub remote_gid: Gid,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// 6-bit packet rate (the `enum ib_rate` encoding).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// 4-bit service level.
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// 5-bit local ACK timeout (IBA time).
    pub local_ack_timeout: IbaTime,
}

impl ReqPath {
    const LEN: usize = 44;

    fn read(r: &Rd<'_>, at: usize) -> Self {
        Self {
            local_lid: r.u16(at),
            remote_lid: r.u16(at + 2),
            local_gid: r.gid(at + 4),
            remote_gid: r.gid(at + 20),
            flow_label: r.u32(at + 36) >> 12,
            packet_rate: r.u8(at + 39) & 0x3f,
            traffic_class: r.u8(at + 40),
            hop_limit: r.u8(at + 41),
            sl: r.u8(at + 42) >> 4,
            subnet_local: r.u8(at + 42) & 0x08 != 0,
            local_ack_timeout: IbaTime::new(r.u8(at + 43) >> 3),
        }
    }

    fn write(&self, w: &mut Wr<'_>, at: usize) {
        w.u16(at, self.local_lid);
        w.u16(at + 2, self.remote_lid);
        w.bytes(at + 4, &self.local_gid.0);
        w.bytes(at + 20, &self.remote_gid.0);
        w.u32(
            at + 36,
            ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f),
        );
        w.u8(at + 40, self.traffic_class);
        w.u8(at + 41, self.hop_limit);
        w.u8(
            at + 42,
            ((self.sl & 0xf) << 4) | (u8::from(self.subnet_local) << 3),
        );
        w.u8(at + 43, self.local_ack_timeout.value() << 3);
    }
}

/// REQ, the connection request (IBTA 12.6.5, Table 106; `struct cm_req_msg`).
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Req {
    /// The requester's communication ID.
    pub local_comm_id: CommId,
    /// The service asked for.
    pub service_id: ServiceId,
    /// The requester's CA GUID.
    pub local_ca_guid: CaGuid,
    /// The requester's Q_Key (RD only; 0 otherwise).
    pub local_qkey: QKey,
    /// The requester's QPN.
    pub local_qpn: Qpn,
    /// RDMA READ / atomic requests the requester accepts at once.
    pub responder_resources: u8,
    /// The requester's EE context number (RD only).
    pub local_eecn: u32,
    /// RDMA READ / atomic requests the requester sends at once.
    pub initiator_depth: u8,
    /// The remote EE context number (RD only).
    pub remote_eecn: u32,
    /// How long the responder takes to answer a CM message (IBTA 12.7.13).
    pub remote_cm_response_timeout: IbaTime,
    /// Transport service type.
    pub transport: TransportType,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// The requester's starting PSN (the responder's expected PSN).
    pub starting_psn: Psn,
    /// How long the requester takes to answer (the REP's retransmit time).
    pub local_cm_response_timeout: IbaTime,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// RDC exists (RD only).
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Times a CM message may be resent (4 bits, IBTA 12.7.27).
    pub max_cm_retries: u8,
    /// The requester uses an SRQ.
    pub srq: bool,
    /// The primary path.
    pub primary: ReqPath,
    /// The alternate path (all zero when none, which is what RoCE sends).
    pub alternate: ReqPath,
    /// SAP supported (byte 139 bit 2).
    pub sap_supported: bool,
    /// The requester's QP allows the multipath extension ([`MULTIPATH_HINT_AT`]; never set
    /// by Linux's CM). Not carried by serde (the engine protocol's layout predates it).
    #[serde(skip)]
    pub multipath_hint: bool,
    /// Private data: 92 bytes on the wire (RDMA CM puts its IP header first,
    /// [`super::ip::CmaHdr`]).
    pub private_data: Vec<u8>,
}

/// MRA: message receipt acknowledgement (IBTA 12.6.6, Table 107).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: CommId,
    /// The receiver's communication ID.
    pub remote_comm_id: CommId,
    /// Which message is acknowledged.
    pub message: MsgMraed,
    /// How much longer the sender needs (IBTA 12.6.6 "ServiceTimeout").
    pub service_timeout: IbaTime,
    /// Private data (222 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// The message an MRA acknowledges (Table 107 "Message MRAed").
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum MsgMraed {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// A LAP (2).
    Lap,
}

/// The message a REJ rejects (Table 108 "Message REJected").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MsgRejected {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// Another message, or none (2).
    Other,
}

/// A REJ reason (IBTA 12.6.7.2 Table 109; `enum ib_cm_rej_reason` in include/rdma/ib_cm.h).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available (1).
    pub const NO_QP: Self = Self(1);
    /// Out of resources (3).
    pub const NO_RESOURCES: Self = Self(3);
    /// The sender timed out waiting for a reply (4; ARI carries the sender's CA GUID).
    pub const TIMEOUT: Self = Self(4);
    /// The REQ asks for something unsupported (5).
    pub const UNSUPPORTED: Self = Self(5);
    /// The communication ID names no connection (6).
    pub const INVALID_COMM_ID: Self = Self(6);
    /// Invalid communication instance (7).
    pub const INVALID_COMM_INSTANCE: Self = Self(7);
    /// No one listens on the service ID (8).
    pub const INVALID_SERVICE_ID: Self = Self(8);
    /// Transport type not supported (9).
    pub const INVALID_TRANSPORT_TYPE: Self = Self(9);
    /// Stale connection: the CA GUID and QPN are still in use (10, IBTA 12.4.1).
    pub const STALE_CONN: Self = Self(10);
    /// Path MTU not supported (26).
    pub const INVALID_MTU: Self = Self(26);
    /// The consumer rejected; the private data says why (28).
    pub const CONSUMER_DEFINED: Self = Self(28);
    /// Duplicate local communication ID (30).
    pub const DUPLICATE_LOCAL_COMM_ID: Self = Self(30);
    /// Class version not supported (31).
    pub const INVALID_CLASS_VERSION: Self = Self(31);
}

impl fmt::Debug for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            1 => "NO_QP",
            3 => "NO_RESOURCES",
            4 => "TIMEOUT",
            5 => "UNSUPPORTED",
            6 => "INVALID_COMM_ID",
            7 => "INVALID_COMM_INSTANCE",
            8 => "INVALID_SERVICE_ID",
            9 => "INVALID_TRANSPORT_TYPE",
            10 => "STALE_CONN",
            26 => "INVALID_MTU",
            28 => "CONSUMER_DEFINED",
            30 => "DUPLICATE_LOCAL_COMM_ID",
            31 => "INVALID_CLASS_VERSION",
            _ => return write!(f, "RejReason({})", self.0),
        };
        write!(f, "{name}({})", self.0)
    }
}

/// REJ (IBTA 12.6.7, Table 108).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: CommId,
    /// The receiver's communication ID (0 if a REQ is rejected before one was known).
    pub remote_comm_id: CommId,
    /// Which message is rejected.
    pub message: MsgRejected,
    /// Why.
    pub reason: RejReason,
    /// Additional reject information (up to 72 bytes; its length is on the wire).
    pub ari: Vec<u8>,
    /// Private data (148 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// REP (IBTA 12.6.8, Table 110).
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Rep {
    /// The responder's communication ID.
    pub local_comm_id: CommId,
    /// The requester's communication ID.
    pub remote_comm_id: CommId,
    /// The responder's Q_Key (RD only).
    pub local_qkey: QKey,
    /// The responder's QPN.
    pub local_qpn: Qpn,
    /// The responder's EE context (RD only).
    pub local_eecn: u32,
    /// The responder's starting PSN.
    pub starting_psn: Psn,
    /// RDMA READ / atomic requests the responder accepts at once.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the responder sends at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The responder uses an SRQ.
    pub srq: bool,
    /// The responder's CA GUID.
    pub local_ca_guid: CaGuid,
    /// The responder's QP allows the multipath extension and the REQ hinted it too
    /// ([`MULTIPATH_HINT_AT`]; never set by Linux's CM). Not carried by serde (the engine
    /// protocol's layout predates it).
    #[serde(skip)]
    pub multipath_hint: bool,
    /// Private data (196 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// RTU (IBTA 12.6.9, Table 111).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rtu {
    /// The requester's communication ID.
    pub local_comm_id: CommId,
    /// The responder's communication ID.
    pub remote_comm_id: CommId,
    /// Private data (224 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// DREQ (IBTA 12.6.10, Table 112).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: CommId,
    /// The receiver's communication ID.
    pub remote_comm_id: CommId,
    /// The receiver's QPN (checked against the connection, IBTA 12.6.10).
    pub remote_qpn: Qpn,
    /// Private data (220 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// DREP (IBTA 12.6.11, Table 113).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: CommId,
    /// The receiver's communication ID.
    pub remote_comm_id: CommId,
    /// Private data (224 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// SIDR_REQ (IBTA 12.11, Table 119): which UD QP serves a service ID.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct SidrReq {
    /// The requester's request ID.
    pub request_id: CommId,
    /// Partition key.
    pub pkey: PKey,
    /// The service asked for.
    pub service_id: ServiceId,
    /// Private data (216 bytes on the wire; RDMA CM puts its IP header first).
    pub private_data: Vec<u8>,
}

/// SIDR_REP status (Table 120 "Status"; `enum ib_cm_sidr_status`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid (0).
    pub const SUCCESS: Self = Self(0);
    /// No one serves the service ID (1).
    pub const UNSUPPORTED: Self = Self(1);
    /// The consumer rejected the request (2).
    pub const REJECT: Self = Self(2);
    /// No QP available (3).
    pub const NO_QP: Self = Self(3);
}

/// SIDR_REP (Table 120).
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct SidrRep {
    /// The request ID of the SIDR_REQ answered.
    pub request_id: CommId,
    /// Status.
    pub status: SidrStatus,
    /// The QPN that serves the service.
    pub qpn: Qpn,
    /// The service ID.
    pub service_id: ServiceId,
    /// The Q_Key to send with.
    pub qkey: QKey,
    /// Additional information (up to 72 bytes; its length is on the wire).
    pub add_info: Vec<u8>,
    /// Private data (136 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// A CM message (the attribute data of one CM MAD).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum CmMsg {
    /// REQ.
    Req(Box<Req>),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Rtu),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Drep),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

/// Private data capacity of each message (Tables 106–120).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// Length of the ARI of a REJ and the additional information of a SIDR_REP (72 bytes).
pub const ARI_LEN: usize = 72;

/// Where a REQ and a REP carry the multipath hint (docs/multipath.md, "Hints out of band"):
/// bit [`MULTIPATH_HINT_BIT`] of attribute byte 27, in both messages. In a REQ, byte 27 is the
/// last of the 32 reserved bits between LocalCAGUID and LocalQ_Key (IBTA 12.6.5 Table 106,
/// offsets 24-27); in a REP, the low nibble of byte 27 is reserved after the RNR retry count
/// and SRQ bits (Table 110). Linux's CM neither sets, reads, checks nor echoes either (its
/// ibta_vol1_c12.h names no field there; ECE's vendor ID took REQ bytes 5-7 and REP bytes 15,
/// 19 and 23, not these), it zeroes every MAD it builds, and tshark skips the REQ's bytes and
/// shows the REP's nibble as "Reserved".
pub const MULTIPATH_HINT_AT: usize = 27;
/// The hint bit in byte [`MULTIPATH_HINT_AT`]: "the sender's QP allows version 1 of the
/// multipath extension" (with `HOLD`, as the `roce-mp1` of perftest's version message). The
/// other reserved bits stay 0 and are ignored.
pub const MULTIPATH_HINT_BIT: u8 = 0x01;

fn reserved(field: &'static str, value: u8) -> MadError {
    MadError::Reserved {
        field,
        value: u32::from(value),
    }
}

fn check_private(msg: &'static str, max: usize, data: &[u8]) -> Result<(), MadError> {
    if data.len() > max {
        Err(MadError::PrivateDataTooLong {
            msg,
            max,
            len: data.len(),
        })
    } else {
        Ok(())
    }
}

impl CmMsg {
    /// The attribute ID of this message.
    #[must_use]
    pub const fn attr_id(&self) -> AttrId {
        match self {
            Self::Req(_) => AttrId::Req,
            Self::Mra(_) => AttrId::Mra,
            Self::Rej(_) => AttrId::Rej,
            Self::Rep(_) => AttrId::Rep,
            Self::Rtu(_) => AttrId::Rtu,
            Self::Dreq(_) => AttrId::Dreq,
            Self::Drep(_) => AttrId::Drep,
            Self::SidrReq(_) => AttrId::SidrReq,
            Self::SidrRep(_) => AttrId::SidrRep,
        }
    }

    /// The message's name as the kernel's CM counters spell it.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        self.attr_id().name()
    }

    fn decode_data(attr: AttrId, d: &[u8]) -> Result<Self, MadError> {
        let r = Rd(d);
        Ok(match attr {
            AttrId::Req => {
                let b43 = r.u8(43);
                let b51 = r.u8(51);
                let transport = match (b43 >> 1) & 3 {
                    0 => TransportType::Rc,
                    1 => TransportType::Uc,
                    2 => TransportType::Rd,
                    _ => TransportType::Extended(b51 & 7),
                };
                let b50 = r.u8(50);
                Self::Req(Box::new(Req {
                    local_comm_id: CommId(r.u32(0)),
                    service_id: ServiceId(r.u64(8)),
                    local_ca_guid: CaGuid(r.u64(16)),
                    local_qkey: QKey::new(r.u32(28)),
                    local_qpn: Qpn::new(r.u24(32)),
                    responder_resources: r.u8(35),
                    local_eecn: r.u24(36),
                    initiator_depth: r.u8(39),
                    remote_eecn: r.u24(40),
                    remote_cm_response_timeout: IbaTime::new(b43 >> 3),
                    transport,
                    e2e_flow_control: b43 & 1 != 0,
                    starting_psn: Psn::new(r.u24(44)),
                    local_cm_response_timeout: IbaTime::new(r.u8(47) >> 3),
                    retry_count: r.u8(47) & 7,
                    pkey: PKey::new(r.u16(48)),
                    path_mtu: PathMtu::from_code(b50 >> 4)?,
                    rdc_exists: b50 & 0x08 != 0,
                    rnr_retry_count: b50 & 7,
                    max_cm_retries: b51 >> 4,
                    srq: b51 & 0x08 != 0,
                    primary: ReqPath::read(&r, 52),
                    alternate: ReqPath::read(&r, 52 + ReqPath::LEN),
                    sap_supported: r.u8(139) & 0x04 != 0,
                    multipath_hint: r.u8(MULTIPATH_HINT_AT) & MULTIPATH_HINT_BIT != 0,
                    private_data: r.bytes(140, private_len::REQ),
                }))
            }
            AttrId::Mra => {
                let message = match r.u8(8) >> 6 {
                    0 => MsgMraed::Req,
                    1 => MsgMraed::Rep,
                    2 => MsgMraed::Lap,
                    v => return Err(reserved("mra.message_mraed", v)),
                };
                Self::Mra(Mra {
                    local_comm_id: CommId(r.u32(0)),
                    remote_comm_id: CommId(r.u32(4)),
                    message,
                    service_timeout: IbaTime::new(r.u8(9) >> 3),
                    private_data: r.bytes(10, private_len::MRA),
                })
            }
            AttrId::Rej => {
                let message = match r.u8(8) >> 6 {
                    0 => MsgRejected::Req,
                    1 => MsgRejected::Rep,
                    2 => MsgRejected::Other,
                    v => return Err(reserved("rej.message_rejected", v)),
                };
                let ari_len = r.u8(9) >> 1;
                if usize::from(ari_len) > ARI_LEN {
                    return Err(reserved("rej.rejected_info_length", ari_len));
                }
                Self::Rej(Rej {
                    local_comm_id: CommId(r.u32(0)),
                    remote_comm_id: CommId(r.u32(4)),
                    message,
                    reason: RejReason(r.u16(10)),
                    ari: r.bytes(12, usize::from(ari_len)),
                    private_data: r.bytes(84, private_len::REJ),
                })
            }
            AttrId::Rep => {
                let b26 = r.u8(26);
                let b27 = r.u8(27);
                Self::Rep(Rep {
                    local_comm_id: CommId(r.u32(0)),
                    remote_comm_id: CommId(r.u32(4)),
                    local_qkey: QKey::new(r.u32(8)),
                    local_qpn: Qpn::new(r.u24(12)),
                    local_eecn: r.u24(16),
                    starting_psn: Psn::new(r.u24(20)),
                    responder_resources: r.u8(24),
                    initiator_depth: r.u8(25),
                    target_ack_delay: b26 >> 3,
                    failover_accepted: (b26 >> 1) & 3,
                    e2e_flow_control: b26 & 1 != 0,
                    rnr_retry_count: b27 >> 5,
                    srq: b27 & 0x10 != 0,
                    local_ca_guid: CaGuid(r.u64(28)),
                    multipath_hint: b27 & MULTIPATH_HINT_BIT != 0,
                    private_data: r.bytes(36, private_len::REP),
                })
            }
            AttrId::Rtu => Self::Rtu(Rtu {
                local_comm_id: CommId(r.u32(0)),
                remote_comm_id: CommId(r.u32(4)),
                private_data: r.bytes(8, private_len::RTU),
            }),
            AttrId::Dreq => Self::Dreq(Dreq {
                local_comm_id: CommId(r.u32(0)),
                remote_comm_id: CommId(r.u32(4)),
                remote_qpn: Qpn::new(r.u24(8)),
                private_data: r.bytes(12, private_len::DREQ),
            }),
            AttrId::Drep => Self::Drep(Drep {
                local_comm_id: CommId(r.u32(0)),
                remote_comm_id: CommId(r.u32(4)),
                private_data: r.bytes(8, private_len::DREP),
            }),
            AttrId::SidrReq => Self::SidrReq(SidrReq {
                request_id: CommId(r.u32(0)),
                pkey: PKey::new(r.u16(4)),
                service_id: ServiceId(r.u64(8)),
                private_data: r.bytes(16, private_len::SIDR_REQ),
            }),
            AttrId::SidrRep => {
                let info_len = r.u8(5);
                if usize::from(info_len) > ARI_LEN {
                    return Err(reserved("sidr_rep.additional_information_length", info_len));
                }
                Self::SidrRep(SidrRep {
                    request_id: CommId(r.u32(0)),
                    status: SidrStatus(r.u8(4)),
                    qpn: Qpn::new(r.u24(8)),
                    service_id: ServiceId(r.u64(12)),
                    qkey: QKey::new(r.u32(20)),
                    add_info: r.bytes(24, usize::from(info_len)),
                    private_data: r.bytes(96, private_len::SIDR_REP),
                })
            }
        })
    }

    fn encode_data(&self, d: &mut [u8]) -> Result<(), MadError> {
        let mut w = Wr(d);
        match self {
            Self::Req(m) => {
                check_private("REQ", private_len::REQ, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u64(8, m.service_id.0);
                w.u64(16, m.local_ca_guid.0);
                w.u32(28, m.local_qkey.value());
                w.u24(32, m.local_qpn.value());
                w.u8(35, m.responder_resources);
                w.u24(36, m.local_eecn & 0xff_ffff);
                w.u8(39, m.initiator_depth);
                w.u24(40, m.remote_eecn & 0xff_ffff);
                let (tt, ext) = match m.transport {
                    TransportType::Rc => (0, 0),
                    TransportType::Uc => (1, 0),
                    TransportType::Rd => (2, 0),
                    TransportType::Extended(x) => (3, x & 7),
                };
                w.u8(
                    43,
                    (m.remote_cm_response_timeout.value() << 3)
                        | (tt << 1)
                        | u8::from(m.e2e_flow_control),
                );
                w.u24(44, m.starting_psn.value());
                w.u8(
                    47,
                    (m.local_cm_response_timeout.value() << 3) | (m.retry_count & 7),
                );
                w.u16(48, m.pkey.value());
                w.u8(
                    50,
                    (m.path_mtu.code() << 4)
                        | (u8::from(m.rdc_exists) << 3)
                        | (m.rnr_retry_count & 7),
                );
                w.u8(
                    51,
                    ((m.max_cm_retries & 0xf) << 4) | (u8::from(m.srq) << 3) | ext,
                );
                m.primary.write(&mut w, 52);
                m.alternate.write(&mut w, 52 + ReqPath::LEN);
                let b139 = w.0[139] | (u8::from(m.sap_supported) << 2);
                w.u8(139, b139);
                if m.multipath_hint {
                    w.u8(MULTIPATH_HINT_AT, MULTIPATH_HINT_BIT);
                }
                w.bytes(140, &m.private_data);
            }
            Self::Mra(m) => {
                check_private("MRA", private_len::MRA, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                let v = match m.message {
                    MsgMraed::Req => 0,
                    MsgMraed::Rep => 1,
                    MsgMraed::Lap => 2,
                };
                w.u8(8, v << 6);
                w.u8(9, m.service_timeout.value() << 3);
                w.bytes(10, &m.private_data);
            }
            Self::Rej(m) => {
                check_private("REJ", private_len::REJ, &m.private_data)?;
                if m.ari.len() > ARI_LEN {
                    return Err(MadError::PrivateDataTooLong {
                        msg: "REJ ARI",
                        max: ARI_LEN,
                        len: m.ari.len(),
                    });
                }
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                let v = match m.message {
                    MsgRejected::Req => 0,
                    MsgRejected::Rep => 1,
                    MsgRejected::Other => 2,
                };
                w.u8(8, v << 6);
                // Fits: checked against ARI_LEN (72) above.
                w.u8(9, (m.ari.len() as u8) << 1);
                w.u16(10, m.reason.0);
                w.bytes(12, &m.ari);
                w.bytes(84, &m.private_data);
            }
            Self::Rep(m) => {
                check_private("REP", private_len::REP, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                w.u32(8, m.local_qkey.value());
                w.u24(12, m.local_qpn.value());
                w.u24(16, m.local_eecn & 0xff_ffff);
                w.u24(20, m.starting_psn.value());
                w.u8(24, m.responder_resources);
                w.u8(25, m.initiator_depth);
                w.u8(
                    26,
                    ((m.target_ack_delay & 0x1f) << 3)
                        | ((m.failover_accepted & 3) << 1)
                        | u8::from(m.e2e_flow_control),
                );
                const _: () = assert!(MULTIPATH_HINT_AT == 27 && MULTIPATH_HINT_BIT & 0xf0 == 0);
                w.u8(
                    27,
                    ((m.rnr_retry_count & 7) << 5)
                        | (u8::from(m.srq) << 4)
                        | if m.multipath_hint {
                            MULTIPATH_HINT_BIT
                        } else {
                            0
                        },
                );
                w.u64(28, m.local_ca_guid.0);
                w.bytes(36, &m.private_data);
            }
            Self::Rtu(m) => {
                check_private("RTU", private_len::RTU, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                w.bytes(8, &m.private_data);
            }
            Self::Dreq(m) => {
                check_private("DREQ", private_len::DREQ, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                w.u24(8, m.remote_qpn.value());
                w.bytes(12, &m.private_data);
            }
            Self::Drep(m) => {
                check_private("DREP", private_len::DREP, &m.private_data)?;
                w.u32(0, m.local_comm_id.0);
                w.u32(4, m.remote_comm_id.0);
                w.bytes(8, &m.private_data);
            }
            Self::SidrReq(m) => {
                check_private("SIDR_REQ", private_len::SIDR_REQ, &m.private_data)?;
                w.u32(0, m.request_id.0);
                w.u16(4, m.pkey.value());
                w.u64(8, m.service_id.0);
                w.bytes(16, &m.private_data);
            }
            Self::SidrRep(m) => {
                check_private("SIDR_REP", private_len::SIDR_REP, &m.private_data)?;
                if m.add_info.len() > ARI_LEN {
                    return Err(MadError::PrivateDataTooLong {
                        msg: "SIDR_REP additional information",
                        max: ARI_LEN,
                        len: m.add_info.len(),
                    });
                }
                w.u32(0, m.request_id.0);
                w.u8(4, m.status.0);
                // Fits: checked against ARI_LEN (72) above.
                w.u8(5, m.add_info.len() as u8);
                w.u24(8, m.qpn.value());
                w.u64(12, m.service_id.0);
                w.u32(20, m.qkey.value());
                w.bytes(24, &m.add_info);
                w.bytes(96, &m.private_data);
            }
        }
        Ok(())
    }
}

/// A whole CM MAD: header and message.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CmMad {
    /// The transaction ID (IBTA 13.4.6.4; the CM reuses a connection's TID for the REQ, REP,
    /// RTU, MRA and REJ of its establishment, and the DREQ's TID for its DREP).
    pub tid: Tid,
    /// `AttributeModifier` (0 from us; the kernel may carry ECE there, kept as received).
    pub attr_mod: u32,
    /// `Status` (0 from us; kept as received).
    pub status: u16,
    /// The message.
    pub msg: CmMsg,
}

impl CmMad {
    /// A MAD carrying `msg` in transaction `tid`.
    #[must_use]
    pub const fn new(tid: Tid, msg: CmMsg) -> Self {
        Self {
            tid,
            attr_mod: 0,
            status: 0,
            msg,
        }
    }

    /// Reads the common MAD header of a CM MAD and checks that it is one (base version 1,
    /// class CM, class version 2, method SEND, a CM message attribute: IBTA 13.4.2, 12.11).
    ///
    /// # Errors
    /// The first check that fails, as a [`MadError`].
    pub fn decode_hdr(buf: &[u8]) -> Result<MadHdr, MadError> {
        if buf.len() < MAD_LEN {
            return Err(MadError::Truncated(buf.len()));
        }
        let r = Rd(buf);
        if r.u8(0) != BASE_VERSION {
            return Err(MadError::BadBaseVersion(r.u8(0)));
        }
        if r.u8(1) != MGMT_CLASS_CM {
            return Err(MadError::BadClass(r.u8(1)));
        }
        if r.u8(2) != CM_CLASS_VERSION {
            return Err(MadError::BadClassVersion(r.u8(2)));
        }
        if r.u8(3) != METHOD_SEND {
            return Err(MadError::BadMethod(r.u8(3)));
        }
        Ok(MadHdr {
            status: r.u16(4),
            tid: Tid(r.u64(8)),
            attr_id: attr_id(r.u16(16))?,
            attr_mod: r.u32(20),
        })
    }

    /// Decodes a CM MAD: the payload of a UD SEND received on QP1 (its first 256 bytes; a
    /// longer buffer's tail is ignored, as the MAD layer reads one MAD). Call it for every
    /// such payload; it never panics.
    ///
    /// # Errors
    /// A [`MadError`] naming the bad field: truncated, wrong base/class/version/method,
    /// unknown or unsupported attribute, reserved value.
    pub fn decode(buf: &[u8]) -> Result<Self, MadError> {
        let hdr = Self::decode_hdr(buf)?;
        let msg = CmMsg::decode_data(hdr.attr_id, &buf[MAD_HDR_LEN..MAD_LEN])?;
        Ok(Self {
            tid: hdr.tid,
            attr_mod: hdr.attr_mod,
            status: hdr.status,
            msg,
        })
    }

    /// Encodes the MAD into 256 bytes (reserved fields and unused private data zero).
    ///
    /// # Errors
    /// [`MadError::PrivateDataTooLong`] if the message's private data, ARI or additional
    /// information exceeds what the layout holds.
    pub fn encode(&self) -> Result<[u8; MAD_LEN], MadError> {
        let mut buf = [0u8; MAD_LEN];
        {
            let mut w = Wr(&mut buf);
            w.u8(0, BASE_VERSION);
            w.u8(1, MGMT_CLASS_CM);
            w.u8(2, CM_CLASS_VERSION);
            w.u8(3, METHOD_SEND);
            w.u16(4, self.status);
            w.u64(8, self.tid.0);
            w.u16(16, self.msg.attr_id() as u16);
            w.u32(20, self.attr_mod);
        }
        self.msg.encode_data(&mut buf[MAD_HDR_LEN..])?;
        Ok(buf)
    }
}
