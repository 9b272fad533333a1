//! Whole Ethernet frames: the layer the transport uses.
//!
//! [`parse_frame`] takes a received frame (Ethernet, up to two VLAN tags, IPv4 or IPv6, UDP,
//! RoCE) and returns a [`Frame`]: the L2/L3/L4 fields the transport needs (addresses, ECN),
//! the RoCE repr, the payload slice and whether the ICRC is right. [`emit_frame`] builds a
//! frame from a [`PathRepr`] (what a QP's address vector says), a [`RoceRepr`] and a payload,
//! computing every length, the IPv4 header checksum, the IPv6 UDP checksum and the ICRC.
//! [`FrameTemplate`] writes the same bytes from the path's headers built once.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce_common::{
    ROCE_V2_UDP_PORT,
    hdr::{ETH_P_IPV4, ETH_P_IPV6, ICRC_LEN, IPPROTO_UDP, Ipv6ExtHdr, MAX_VLAN_TAGS},
};

use super::{
    EthernetAddress, EthernetRepr, Ipv4Repr, Ipv6Repr, Qpn, Result, RocePacket, RoceRepr, UdpRepr,
    VlanTag, WireError, bth, ethernet, icrc, ipv4, ipv6, roce::pad_len, udp,
};

/// The ECN codepoint: the low two bits of the IPv4 TOS / IPv6 traffic class (RFC 3168).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Ecn {
    /// 00: not ECN-capable.
    #[default]
    NotEct,
    /// 01: ECN-capable, ECT(1).
    Ect1,
    /// 10: ECN-capable, ECT(0).
    Ect0,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// From the low two bits of a TOS / traffic-class byte.
    #[must_use]
    pub const fn from_tos(tos: u8) -> Self {
        match tos & 3 {
            0 => Self::NotEct,
            1 => Self::Ect1,
            2 => Self::Ect0,
            _ => Self::Ce,
        }
    }
    /// The two-bit value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            Self::NotEct => 0,
            Self::Ect1 => 1,
            Self::Ect0 => 2,
            Self::Ce => 3,
        }
    }
}

/// The IP addresses of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IpPath {
    /// RoCE v2 over IPv4.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
    },
    /// RoCE v2 over IPv6.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Flow label (20 bits; rxe puts the address vector's flow label here).
        flow_label: u32,
    },
}

/// Everything below the BTH that a sender chooses: a QP's address vector in wire terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathRepr {
    /// Source MAC.
    pub src_mac: EthernetAddress,
    /// Destination MAC.
    pub dst_mac: EthernetAddress,
    /// VLAN tags, outermost first.
    pub vlan: [Option<VlanTag>; MAX_VLAN_TAGS],
    /// IP addresses.
    pub ip: IpPath,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN codepoint (ECT(0) or ECT(1) to take part in DCQCN).
    pub ecn: Ecn,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 identification (any value: DF is set, RFC 6864). Ignored for IPv6.
    pub ipv4_ident: u16,
    /// UDP source port (see [`udp_src_port`]).
    pub udp_src_port: u16,
    /// UDP destination port, normally [`ROCE_V2_UDP_PORT`].
    pub udp_dst_port: u16,
}

impl PathRepr {
    /// A path without VLAN, DSCP 0, Not-ECT, TTL 64, UDP ports 0xc000 → 4791.
    #[must_use]
    pub const fn new(src_mac: EthernetAddress, dst_mac: EthernetAddress, ip: IpPath) -> Self {
        Self {
            src_mac,
            dst_mac,
            vlan: [None; MAX_VLAN_TAGS],
            ip,
            dscp: 0,
            ecn: Ecn::NotEct,
            ttl: 64,
            ipv4_ident: 0,
            udp_src_port: 0xc000,
            udp_dst_port: ROCE_V2_UDP_PORT,
        }
    }

    /// The TOS / traffic-class byte.
    #[must_use]
    pub const fn tos(&self) -> u8 {
        (self.dscp << 2) | self.ecn.bits()
    }

    fn eth(&self) -> EthernetRepr {
        EthernetRepr {
            dst_addr: self.dst_mac,
            src_addr: self.src_mac,
            vlan: self.vlan,
            ethertype: match self.ip {
                IpPath::V4 { .. } => ETH_P_IPV4,
                IpPath::V6 { .. } => ETH_P_IPV6,
            },
        }
    }

    const fn ip_header_len(&self) -> usize {
        match self.ip {
            IpPath::V4 { .. } => ipv4::HEADER_LEN,
            IpPath::V6 { .. } => ipv6::HEADER_LEN,
        }
    }

    /// Where the BTH starts in a frame on this path: the length of the Ethernet header with
    /// its VLAN tags, the IP header and the UDP header. Call it to know where a packet's
    /// payload will go before its headers are written (after the BTH and the extended headers
    /// of the opcode, [`RoceRepr::header_len`]).
    #[must_use]
    pub fn bth_offset(&self) -> usize {
        self.eth().buffer_len() + self.ip_header_len() + udp::HEADER_LEN
    }
}

/// The IP header of a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Source address.
    #[must_use]
    pub fn src_addr(&self) -> IpAddr {
        match self {
            Self::V4(r) => IpAddr::V4(r.src_addr),
            Self::V6(r) => IpAddr::V6(r.src_addr),
        }
    }
    /// Destination address.
    #[must_use]
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            Self::V4(r) => IpAddr::V4(r.dst_addr),
            Self::V6(r) => IpAddr::V6(r.dst_addr),
        }
    }
    /// TOS / traffic-class byte.
    #[must_use]
    pub const fn tos(&self) -> u8 {
        match self {
            Self::V4(r) => r.tos,
            Self::V6(r) => r.traffic_class,
        }
    }
    /// DSCP.
    #[must_use]
    pub const fn dscp(&self) -> u8 {
        self.tos() >> 2
    }
    /// ECN codepoint.
    #[must_use]
    pub const fn ecn(&self) -> Ecn {
        Ecn::from_tos(self.tos())
    }
    /// TTL or hop limit.
    #[must_use]
    pub const fn ttl(&self) -> u8 {
        match self {
            Self::V4(r) => r.ttl,
            Self::V6(r) => r.hop_limit,
        }
    }

    /// The 40 bytes a UD receive buffer starts with (the GRH area, IBA 11.4.1.1) for a packet
    /// that came with this header, as rxe fills it for RoCE v2 (rxe_resp.c
    /// `build_rdma_network_hdr`, `union rdma_network_hdr`): an IPv6 header whole; an IPv4
    /// header in the last 20 bytes, the first 20 zero. `ibv_init_ah_from_wc` reads the
    /// sender's address back from it. Call it when a UD receive completes.
    #[must_use]
    pub fn network_header(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        match self {
            // The header parsed without options (Ipv4Repr::parse refuses them), so writing it
            // again gives the bytes received, checksum included.
            Self::V4(r) => {
                let _ = r.emit(&mut ipv4::Packet::new_unchecked(&mut out[20..]));
            }
            Self::V6(r) => r.emit(&mut ipv6::Packet::new_unchecked(&mut out[..])),
        }
        out
    }
}

/// A parsed RoCE v2 frame; borrows the payload from the received buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Ethernet header and VLAN tags.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and extended headers.
    pub roce: RoceRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC as received.
    pub icrc: u32,
    /// Whether the ICRC is right. rxe drops packets where it is not (rxe_recv.c); so should
    /// the caller, counting the drop.
    pub icrc_ok: bool,
    /// Bytes of the buffer the frame occupies: up to the end of the IP packet, so Ethernet
    /// padding is excluded. (Bytes between the end of the UDP datagram and the end of the IP
    /// packet are ignored, as Linux's UDP and rxe ignore them.)
    pub len: usize,
}

impl Frame<'_> {
    /// ECN codepoint of the IP header (the DCQCN notification point looks for `Ce`).
    #[must_use]
    pub const fn ecn(&self) -> Ecn {
        self.ip.ecn()
    }
    /// Source IP.
    #[must_use]
    pub fn src_ip(&self) -> IpAddr {
        self.ip.src_addr()
    }
    /// Destination IP.
    #[must_use]
    pub fn dst_ip(&self) -> IpAddr {
        self.ip.dst_addr()
    }

    /// A path back to the sender of this frame: MACs and IPs swapped, same VLAN tags, DSCP,
    /// UDP ports swapped back (the peer's source port is the flow's port, since both ends
    /// derive it from the same QP pair) and destination port the one this frame was sent to.
    /// ECN is Not-ECT and the TTL 64. A connected QP should use its own configured path; this is
    /// for answering before one exists (or for tests).
    #[must_use]
    pub fn reply_path(&self) -> PathRepr {
        let ip = match self.ip {
            IpRepr::V4(r) => IpPath::V4 {
                src: r.dst_addr,
                dst: r.src_addr,
            },
            IpRepr::V6(r) => IpPath::V6 {
                src: r.dst_addr,
                dst: r.src_addr,
                flow_label: r.flow_label,
            },
        };
        let mut p = PathRepr::new(self.eth.dst_addr, self.eth.src_addr, ip);
        p.vlan = self.eth.vlan;
        p.dscp = self.ip.dscp();
        p.udp_src_port = self.udp.src_port;
        p.udp_dst_port = self.udp.dst_port;
        p
    }
}

/// Parses a RoCE v2 frame sent to UDP port 4791. Call it on every frame the AF_XDP socket
/// delivers. See [`parse_frame_with_port`].
pub fn parse_frame(buf: &[u8]) -> Result<Frame<'_>> {
    parse_frame_with_port(buf, ROCE_V2_UDP_PORT)
}

/// Parses a RoCE v2 frame sent to UDP port `port`.
///
/// Errors: not IPv4/IPv6, not UDP, not `port` → [`WireError::NotRoce`]; IP fragments, IPv4
/// options, IPv6 extension headers, more than two VLAN tags → [`WireError::Unsupported`];
/// short or inconsistent lengths, a bad IPv4 header checksum, BTH TVer ≠ 0 →
/// [`WireError::Truncated`]/[`WireError::Malformed`]; an opcode not in the table →
/// [`WireError::UnknownOpcode`]. A bad ICRC is not an error: it is reported in
/// [`Frame::icrc_ok`]. The UDP checksum is not verified (rxe sends 0 over IPv4; the ICRC
/// covers the same bytes).
pub fn parse_frame_with_port(buf: &[u8], port: u16) -> Result<Frame<'_>> {
    parse_inner(buf, port, true).map(|(f, _)| f)
}

/// Like [`parse_frame`], but verifies the ICRC by masking the header fields in place and
/// restoring them (one pass, no copy; [`icrc::compute_in_place`]). Use it where the frame is
/// writable, as the engine's received UMEM frames are. The buffer is unchanged afterwards.
pub fn parse_frame_in_place(buf: &mut [u8]) -> Result<Frame<'_>> {
    parse_frame_in_place_with_port(buf, ROCE_V2_UDP_PORT)
}

/// [`parse_frame_in_place`] for UDP port `port`.
pub fn parse_frame_in_place_with_port(buf: &mut [u8], port: u16) -> Result<Frame<'_>> {
    let (head, icrc_range, payload_range) = {
        let (f, icrc_range) = parse_inner(buf, port, false)?;
        let end = icrc_range.end - ICRC_LEN - usize::from(f.roce.bth.pad_count);
        let head = Frame {
            eth: f.eth,
            ip: f.ip,
            udp: f.udp,
            roce: f.roce,
            payload: &[],
            icrc: f.icrc,
            icrc_ok: false,
            len: f.len,
        };
        (head, icrc_range, end - f.payload.len()..end)
    };
    let icrc_ok = icrc::verify_in_place(&mut buf[icrc_range]);
    let buf = &*buf;
    Ok(Frame {
        payload: &buf[payload_range],
        icrc_ok,
        ..head
    })
}

/// Parses the headers; verifies the ICRC (copying the masked headers) if `verify`. Also
/// returns the range of `buf` the ICRC covers plus the ICRC itself (IP header to the end of
/// the UDP datagram).
fn parse_inner(
    buf: &[u8],
    port: u16,
    verify: bool,
) -> Result<(Frame<'_>, core::ops::Range<usize>)> {
    let (eth, l3) = EthernetRepr::parse(buf)?;
    let rest = &buf[l3..];
    let (ip, ip_hdr, ip_payload) = match eth.ethertype {
        ETH_P_IPV4 => {
            let r = Ipv4Repr::parse(rest)?;
            if r.protocol != IPPROTO_UDP {
                return Err(WireError::NotRoce("IPv4 protocol is not UDP"));
            }
            let end = ipv4::HEADER_LEN + usize::from(r.payload_len);
            (
                IpRepr::V4(r),
                &rest[..ipv4::HEADER_LEN],
                &rest[ipv4::HEADER_LEN..end],
            )
        }
        ETH_P_IPV6 => {
            let r = Ipv6Repr::parse(rest)?;
            match r.next_header {
                IPPROTO_UDP => {}
                Ipv6ExtHdr::HOP_BY_HOP
                | Ipv6ExtHdr::ROUTING
                | Ipv6ExtHdr::FRAGMENT
                | Ipv6ExtHdr::AUTH
                | Ipv6ExtHdr::DEST_OPTS => {
                    return Err(WireError::Unsupported("IPv6 extension header"));
                }
                _ => return Err(WireError::NotRoce("IPv6 next header is not UDP")),
            }
            let end = ipv6::HEADER_LEN + usize::from(r.payload_len);
            (
                IpRepr::V6(r),
                &rest[..ipv6::HEADER_LEN],
                &rest[ipv6::HEADER_LEN..end],
            )
        }
        _ => return Err(WireError::NotRoce("EtherType is not IPv4 or IPv6")),
    };
    let udp_p = udp::Packet::new_checked(ip_payload)?;
    let udp = UdpRepr::parse(&udp_p, ip_payload.len())?;
    if udp.dst_port != port {
        return Err(WireError::NotRoce("UDP destination port"));
    }
    let udp_hdr = &ip_payload[..udp::HEADER_LEN];
    let udp_payload = &ip_payload[udp::HEADER_LEN..usize::from(udp.length)];
    let pkt = RocePacket::new_checked(udp_payload)?;
    let roce = RoceRepr::parse(&pkt)?;
    let icrc_ok = verify && icrc::verify(ip_hdr, udp_hdr, udp_payload);
    let len = l3 + ip_hdr.len() + ip_payload.len();
    let covered = l3..l3 + ip_hdr.len() + usize::from(udp.length);
    let f = Frame {
        eth,
        ip,
        udp,
        roce,
        icrc: pkt.icrc(),
        payload: pkt.into_payload(),
        icrc_ok,
        len,
    };
    Ok((f, covered))
}

/// The length of the frame [`emit_frame`] would write (no Ethernet minimum-size padding:
/// NICs pad short frames on transmit).
pub fn frame_len(path: &PathRepr, roce: &RoceRepr, payload_len: usize) -> usize {
    path.eth().buffer_len() + path.ip_header_len() + udp::HEADER_LEN + roce.buffer_len(payload_len)
}

/// Writes a whole frame into `buf` and returns its length. Call it for every packet the
/// transport sends, with the QP's path.
///
/// Lengths, the IPv4 header checksum (DF set, as rxe) and the ICRC are computed here; the ICRC
/// in one pass over the written bytes, masking in place ([`icrc::compute_in_place`]). The UDP
/// checksum is 0 over IPv4, as rxe writes it (rxe_net.c `prepare_udp_hdr`). Over IPv6 it is
/// computed: rxe also writes 0 there (the same `prepare_udp_hdr`) and accepts 0 because its
/// tunnel socket is created without `use_udp6_rx_checksums` (so `no_check6_rx` is set), but
/// RFC 8200 §8.1 forbids a zero UDP checksum over IPv6 and ordinary receivers drop it; a
/// correct non-zero checksum is accepted by rxe's UDP stack and by everyone else.
/// No Ethernet minimum-size padding is added (NICs pad short frames on transmit).
pub fn emit_frame(
    path: &PathRepr,
    roce: &RoceRepr,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<usize> {
    // The same bytes as a QP's kept template, built for this one frame.
    roce.validate(payload.len())?;
    FrameTemplate::new(path)?.emit(roce, payload, buf)
}

/// The most bytes below the BTH: Ethernet with [`MAX_VLAN_TAGS`] tags, IPv6, UDP.
pub const MAX_BTH_OFFSET: usize = ethernet::HEADER_LEN
    + MAX_VLAN_TAGS * ethernet::VLAN_TAG_LEN
    + ipv6::HEADER_LEN
    + udp::HEADER_LEN;

/// The Ethernet, IP and UDP headers of one path, built once; [`Self::emit`] and
/// [`Self::emit_around_payload`] then write frames identical to [`emit_frame`]'s, patching only
/// what varies per packet: the IPv4 total length and header checksum (the checksum from a sum
/// of the other header words kept here, RFC 1071), the IPv6 payload length, the UDP length and,
/// over IPv6, the UDP checksum; then the BTH, extended headers, pad and ICRC.
///
/// Keep one per sender and call [`Self::for_path`] with the path of each packet: it rebuilds
/// the headers only when the path differs from the one they were built for (a new address
/// vector, or congestion control changing the ECN or DSCP bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameTemplate {
    path: PathRepr,
    /// Ethernet, IP and UDP headers; lengths and checksums zero.
    hdrs: [u8; MAX_BTH_OFFSET],
    /// Where the IP header starts (at most 22).
    l3: u8,
    /// Where the BTH starts (`path.bth_offset()`, at most [`MAX_BTH_OFFSET`]).
    bth_off: u8,
    /// IPv4: the one's-complement sum (unfolded: ten words, at most 20 bits) of the header's
    /// words, with the total length and the checksum zero.
    ipv4_sum: u32,
}

impl FrameTemplate {
    /// Builds the headers of `path`. Errors as [`emit_frame`] for a path it cannot write (an
    /// inner VLAN tag without an outer one: [`WireError::InvalidRepr`]).
    pub fn new(path: &PathRepr) -> Result<Self> {
        let mut hdrs = [0u8; MAX_BTH_OFFSET];
        let eth = path.eth();
        let l3 = eth.emit(&mut hdrs)?;
        let ip_len = path.ip_header_len();
        let (ip_buf, l4) = hdrs[l3..].split_at_mut(ip_len);
        let mut ipv4_sum = 0;
        match path.ip {
            IpPath::V4 { src, dst } => {
                let mut p = ipv4::Packet::new_unchecked(&mut *ip_buf);
                Ipv4Repr {
                    src_addr: src,
                    dst_addr: dst,
                    tos: path.tos(),
                    ident: path.ipv4_ident,
                    dont_frag: true,
                    ttl: path.ttl,
                    protocol: IPPROTO_UDP,
                    payload_len: 0,
                }
                .emit(&mut p)?;
                p.set_total_len(0);
                p.set_checksum(0);
                ipv4_sum = ipv4::sum(ip_buf, 0) as u32;
            }
            IpPath::V6 {
                src,
                dst,
                flow_label,
            } => Ipv6Repr {
                src_addr: src,
                dst_addr: dst,
                traffic_class: path.tos(),
                flow_label,
                next_header: IPPROTO_UDP,
                hop_limit: path.ttl,
                payload_len: 0,
            }
            .emit(&mut ipv6::Packet::new_unchecked(&mut *ip_buf)),
        }
        UdpRepr {
            src_port: path.udp_src_port,
            dst_port: path.udp_dst_port,
            length: 0,
            checksum: 0,
        }
        .emit(&mut udp::Packet::new_unchecked(&mut l4[..udp::HEADER_LEN]));
        // Both fit a byte: the headers are at most MAX_BTH_OFFSET (70) bytes.
        Ok(Self {
            path: *path,
            hdrs,
            l3: l3 as u8,
            bth_off: (l3 + ip_len + udp::HEADER_LEN) as u8,
            ipv4_sum,
        })
    }

    /// The template in `slot` if it was built for `path`, else a new one put there. Call it
    /// for every packet, with the path the packet goes on (after congestion control set its
    /// ECN and DSCP); it costs one comparison of paths when nothing changed, and two when
    /// only the UDP source port did (a sprayed QP's entropy, issue 19: every packet's), whose
    /// two bytes are then written into the template: the port is in no checksum the template
    /// keeps (IPv4's covers the IP header only; the UDP checksum over IPv6 and the ICRC are
    /// computed per frame). Errors as [`Self::new`], leaving `slot` alone.
    pub fn for_path<'a>(slot: &'a mut Option<Self>, path: &PathRepr) -> Result<&'a Self> {
        match slot {
            Some(t) if t.path == *path => {}
            Some(t)
                if PathRepr {
                    udp_src_port: path.udp_src_port,
                    ..t.path
                } == *path =>
            {
                let at = usize::from(t.bth_off) - udp::HEADER_LEN;
                t.hdrs[at..at + 2].copy_from_slice(&path.udp_src_port.to_be_bytes());
                t.path.udp_src_port = path.udp_src_port;
            }
            _ => *slot = Some(Self::new(path)?),
        }
        // Never the error: `slot` was just filled (returning the borrow from the test above
        // is what the borrow checker refuses).
        slot.as_ref()
            .ok_or(WireError::InvalidRepr("frame template missing"))
    }

    /// The path the headers were built for.
    #[must_use]
    pub const fn path(&self) -> &PathRepr {
        &self.path
    }

    /// Where the BTH starts ([`PathRepr::bth_offset`] of [`Self::path`]).
    #[must_use]
    pub const fn bth_offset(&self) -> usize {
        self.bth_off as usize
    }

    /// Writes a whole frame into `buf` and returns its length: the same bytes, and the same
    /// errors, as [`emit_frame`] with this template's path.
    pub fn emit(&self, roce: &RoceRepr, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
        let at = self.bth_offset() + roce.header_len();
        let range = at..at + payload.len();
        if let Some(dst) = buf.get_mut(range.clone()) {
            dst.copy_from_slice(payload);
        }
        self.emit_around_payload(roce, range, buf)
    }

    /// [`Self::emit`] for a payload that is already in `buf`, at `payload`. Call it after
    /// gathering the payload straight into the frame buffer (one copy, memory region to
    /// frame), best at `self.bth_offset() + roce.header_len()`, where it goes: from anywhere
    /// else it is moved there first (one more copy, for a sender that guessed the headers'
    /// length wrong). Otherwise the payload bytes are only read (for the ICRC and UDP
    /// checksum). Errors as [`Self::emit`]; a `payload` range past the end of `buf` is
    /// [`WireError::BufferTooSmall`].
    pub fn emit_around_payload(
        &self,
        roce: &RoceRepr,
        payload: core::ops::Range<usize>,
        buf: &mut [u8],
    ) -> Result<usize> {
        let payload_len = payload.len();
        let info = roce.validate(payload_len)?;
        let hl = bth::HEADER_LEN + info.ext_len();
        let roce_len = hl + payload_len + pad_len(payload_len) + ICRC_LEN;
        let udp_len = udp::HEADER_LEN + roce_len;
        let udp_len16 = u16::try_from(udp_len)
            .map_err(|_| WireError::InvalidRepr("UDP datagram over 65535 bytes"))?;
        let (l3, bth_off) = (usize::from(self.l3), self.bth_offset());
        let total = bth_off + roce_len;
        let have = buf.len();
        if total > have || payload.end > have {
            return Err(WireError::BufferTooSmall {
                needed: total.max(payload.end),
                have,
            });
        }
        let at = bth_off + hl;
        if payload_len != 0 && payload.start != at {
            buf.copy_within(payload, at);
        }
        let buf = &mut buf[..total];
        buf[..bth_off].copy_from_slice(&self.hdrs[..bth_off]);
        let l4 = bth_off - udp::HEADER_LEN;
        let (ip_buf, l4_buf) = buf[l3..].split_at_mut(l4 - l3);
        match self.path.ip {
            IpPath::V4 { .. } => {
                let tot_len = u16::try_from(udp_len + ipv4::HEADER_LEN)
                    .map_err(|_| WireError::InvalidRepr("IPv4 packet over 65535 bytes"))?;
                let mut p = ipv4::Packet::new_unchecked(ip_buf);
                p.set_total_len(tot_len);
                // RFC 1071: the sum of the other words, kept, plus the one that changed.
                p.set_checksum(!ipv4::fold(u64::from(self.ipv4_sum) + u64::from(tot_len)));
            }
            IpPath::V6 { .. } => ipv6::Packet::new_unchecked(ip_buf).set_payload_len(udp_len16),
        }
        let (udp_buf, roce_buf) = l4_buf.split_at_mut(udp::HEADER_LEN);
        udp::Packet::new_unchecked(udp_buf).set_length(udp_len16);
        roce.emit_headers(info.hdrs, roce_buf, hl + payload_len);
        let crc = icrc::compute_in_place(&mut buf[l3..total - ICRC_LEN])?;
        let (udp_buf, roce_buf) = buf[l4..].split_at_mut(udp::HEADER_LEN);
        RocePacket::new_unchecked(&mut *roce_buf).set_icrc(crc);
        if let IpPath::V6 { src, dst, .. } = self.path.ip {
            let c = udp6_checksum(&src, &dst, udp_buf, roce_buf);
            udp::Packet::new_unchecked(&mut *udp_buf).set_checksum(c);
        }
        Ok(total)
    }
}

/// The UDP checksum over IPv6 (RFC 8200 §8.1): pseudo header (addresses, length, next header
/// 17) plus the UDP header (checksum field zero) and payload; 0 is sent as 0xffff.
#[must_use]
pub fn udp6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, udp_hdr: &[u8], udp_payload: &[u8]) -> u16 {
    let len = (udp_hdr.len() + udp_payload.len()) as u64;
    let mut acc = ipv4::sum(&src.octets(), 0);
    acc = ipv4::sum(&dst.octets(), acc);
    acc += (len >> 16) + (len & 0xffff) + u64::from(IPPROTO_UDP);
    // The checksum field is covered as zero.
    let mut h = [0u8; udp::HEADER_LEN];
    let n = udp_hdr.len().min(udp::HEADER_LEN);
    h[..n].copy_from_slice(&udp_hdr[..n]);
    h[udp::CHECKSUM_OFFSET] = 0;
    h[udp::CHECKSUM_OFFSET + 1] = 0;
    acc = ipv4::sum(&h, acc);
    acc = ipv4::sum(udp_payload, acc);
    match !ipv4::fold(acc) {
        0 => 0xffff,
        c => c,
    }
}

/// The flow label every RoCE v2 driver should derive from a QP pair
/// (`rdma_calc_flow_label` in include/rdma/ib_verbs.h): `v = lqpn * rqpn; v ^= v >> 20;
/// v ^= v >> 40; v & 0xfffff`.
#[must_use]
pub const fn rdma_calc_flow_label(lqpn: Qpn, rqpn: Qpn) -> u32 {
    let mut v = lqpn.value() as u64 * rqpn.value() as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// The UDP source port for a flow label (`rdma_flow_label_to_udp_sport` in ib_verbs.h):
/// `((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)) | 0xc000`, always in 0xc000..=0xffff.
#[must_use]
pub const fn rdma_flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let fl_low = flow_label & 0x3fff;
    let fl_high = (flow_label & 0xf_c000) >> 14;
    ((fl_low ^ fl_high) | 0xc000) as u16
}

/// The UDP source port for a connection between `lqpn` and `rqpn` under the kernel's common
/// convention (flow label from the QP pair, then port from the flow label). Use it when the
/// address vector has no flow label.
#[must_use]
pub const fn udp_src_port(lqpn: Qpn, rqpn: Qpn) -> u16 {
    rdma_flow_label_to_udp_sport(rdma_calc_flow_label(lqpn, rqpn))
}

/// The UDP source port rxe picks for a QP (rxe_qp.c: `RXE_ROCE_V2_SPORT + (hash_32(qpn, 14)
/// & 0x3fff)`, with the kernel's `hash_32` = `(qpn * 0x61c88647) >> (32 - 14)`).
#[must_use]
pub const fn rxe_udp_src_port(qpn: Qpn) -> u16 {
    let h = qpn.value().wrapping_mul(0x61c8_8647) >> (32 - 14);
    0xc000 + (h & 0x3fff) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AethRepr, AethSyndrome, BthRepr, Msn, Opcode, Psn, RKey, RethRepr};

    const MAC_A: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
    const MAC_B: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);

    fn golden_frame() -> [u8; 74] {
        let mut f = [0u8; 74];
        f[..6].copy_from_slice(&MAC_B.0);
        f[6..12].copy_from_slice(&MAC_A.0);
        f[12..14].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
        f[14..].copy_from_slice(&icrc::MELLANOX_CNP);
        f
    }

    #[test]
    fn parse_golden_cnp_frame() {
        let f = golden_frame();
        let fr = parse_frame(&f).unwrap();
        assert!(fr.icrc_ok);
        assert_eq!(fr.icrc, 0xef1b_fcda);
        assert_eq!(fr.roce, RoceRepr::cnp(Qpn::new(0xd2)));
        assert_eq!(fr.ecn(), Ecn::Ect1);
        assert_eq!(fr.ip.dscp(), 34);
        assert_eq!(fr.udp.src_port, 56238);
        assert_eq!(fr.src_ip(), IpAddr::V4(Ipv4Addr::new(22, 22, 22, 8)));
        assert_eq!(fr.len, 74);
        assert!(fr.payload.is_empty());
    }

    #[test]
    fn emit_golden_cnp_frame() {
        let mut path = PathRepr::new(
            MAC_A,
            MAC_B,
            IpPath::V4 {
                src: Ipv4Addr::new(22, 22, 22, 8),
                dst: Ipv4Addr::new(22, 22, 22, 7),
            },
        );
        path.dscp = 34;
        path.ecn = Ecn::Ect1;
        path.ttl = 0x20;
        path.ipv4_ident = 0x98c6;
        path.udp_src_port = 56238;
        let roce = RoceRepr::cnp(Qpn::new(0xd2));
        let mut buf = [0xa5u8; 128];
        let n = emit_frame(&path, &roce, &[], &mut buf).unwrap();
        assert_eq!(n, frame_len(&path, &roce, 0));
        assert_eq!(&buf[..n], &golden_frame()[..]);
    }

    #[test]
    fn ipv6_vlan_round_trip() {
        let mut path = PathRepr::new(
            MAC_A,
            MAC_B,
            IpPath::V6 {
                src: "fd00::a".parse().unwrap(),
                dst: "fd00::b".parse().unwrap(),
                flow_label: 0x12345,
            },
        );
        path.vlan[0] = Some(VlanTag::dot1q(3, 100));
        path.ecn = Ecn::Ect0;
        path.dscp = 26;
        let mut roce = RoceRepr::new(BthRepr::new(
            Opcode::RC_RDMA_WRITE_FIRST,
            Qpn::new(0x42),
            Psn::new(0xff_ffff),
        ));
        roce.reth = Some(RethRepr {
            va: 0x7000,
            rkey: RKey::new(9),
            dma_len: 4096,
        });
        let payload = [7u8; 1024];
        let mut buf = [0u8; 1200];
        let n = emit_frame(&path, &roce, &payload, &mut buf).unwrap();
        let fr = parse_frame(&buf[..n]).unwrap();
        assert!(fr.icrc_ok);
        assert_eq!(fr.payload, &payload[..]);
        assert_eq!(fr.roce, roce);
        assert_eq!(fr.eth.vlan[0], Some(VlanTag::dot1q(3, 100)));
        assert_eq!(fr.ecn(), Ecn::Ect0);
        assert_eq!(fr.ip.dscp(), 26);
        // The UDP checksum verifies: summing the pseudo header and datagram gives 0xffff.
        let IpRepr::V6(ip) = fr.ip else {
            panic!("not v6")
        };
        let l4 = &buf[18 + 40..n];
        assert_ne!(fr.udp.checksum, 0);
        assert_eq!(
            udp6_checksum(&ip.src_addr, &ip.dst_addr, &l4[..8], &l4[8..]),
            fr.udp.checksum
        );
        // A CE mark by a switch keeps the ICRC valid.
        buf[18 + 1] |= 0x30;
        assert!(parse_frame(&buf[..n]).unwrap().icrc_ok);
        // Corruption does not.
        buf[n - 10] ^= 0xff;
        assert!(!parse_frame(&buf[..n]).unwrap().icrc_ok);
    }

    #[test]
    fn in_place_parse_agrees() {
        let mut f = golden_frame();
        let orig = f;
        let a = parse_frame(&orig).unwrap();
        let b = parse_frame_in_place(&mut f).unwrap();
        assert_eq!(a, b);
        assert!(b.icrc_ok);
        assert_eq!(f, orig);
        f[60] ^= 1; // a CNP reserved byte
        assert!(!parse_frame_in_place(&mut f).unwrap().icrc_ok);
        f[60] ^= 1;
        f[40] ^= 1; // the UDP checksum: masked
        assert!(parse_frame_in_place(&mut f).unwrap().icrc_ok);
    }

    #[test]
    fn ack_with_ethernet_padding() {
        let path = PathRepr::new(
            MAC_A,
            MAC_B,
            IpPath::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
            },
        );
        let roce = RoceRepr::ack(
            Qpn::new(0x11),
            Psn::new(5),
            AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: Msn::new(1),
            },
        );
        let mut buf = [0u8; 80];
        let n = emit_frame(&path, &roce, &[], &mut buf).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 16 + 4);
        let fr = parse_frame(&buf[..n + 6]).unwrap();
        assert!(fr.icrc_ok);
        assert_eq!(fr.len, n);
        assert_eq!(fr.roce, roce);
    }

    #[test]
    fn template_errors_as_emit_frame() {
        let mut path = PathRepr::new(
            MAC_A,
            MAC_B,
            IpPath::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
            },
        );
        let roce = RoceRepr::new(BthRepr::new(
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Qpn::new(0x11),
            Psn::new(5),
        ));
        let mut a = vec![0u8; 70_000];
        let mut b = a.clone();
        // An IPv4 packet over 65535 bytes, then a UDP datagram over 65535 bytes.
        for n in [65_500, 65_600] {
            let payload = vec![1u8; n];
            let t = FrameTemplate::new(&path).unwrap();
            let want = emit_frame(&path, &roce, &payload, &mut b);
            assert!(matches!(want, Err(WireError::InvalidRepr(_))));
            assert_eq!(t.emit(&roce, &payload, &mut a), want);
        }
        // A payload on an opcode that carries none.
        let ack = RoceRepr::ack(
            Qpn::new(0x11),
            Psn::new(5),
            AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: Msn::new(1),
            },
        );
        let t = FrameTemplate::new(&path).unwrap();
        assert_eq!(
            t.emit(&ack, &[1, 2, 3, 4], &mut a),
            emit_frame(&path, &ack, &[1, 2, 3, 4], &mut b)
        );
        // An inner VLAN tag without an outer one: no template, as emit_frame fails.
        path.vlan[1] = Some(VlanTag::dot1q(0, 7));
        let want = emit_frame(&path, &ack, &[], &mut b);
        assert!(want.is_err());
        assert_eq!(FrameTemplate::new(&path).map(|_| 0), want);
        let mut slot = None;
        assert!(FrameTemplate::for_path(&mut slot, &path).is_err());
        assert!(slot.is_none());
    }

    #[test]
    fn reply_path_swaps_ends() {
        let f = golden_frame();
        let fr = parse_frame(&f).unwrap();
        let p = fr.reply_path();
        assert_eq!(p.src_mac, MAC_B);
        assert_eq!(p.dst_mac, MAC_A);
        assert_eq!(
            p.ip,
            IpPath::V4 {
                src: Ipv4Addr::new(22, 22, 22, 7),
                dst: Ipv4Addr::new(22, 22, 22, 8)
            }
        );
        assert_eq!(p.dscp, 34);
        assert_eq!(p.ecn, Ecn::NotEct);
        assert_eq!((p.udp_src_port, p.udp_dst_port), (56238, ROCE_V2_UDP_PORT));
    }

    #[test]
    fn not_roce() {
        let mut f = golden_frame();
        f[14 + 23] = 0x12; // dst port 0x1212
        assert!(matches!(parse_frame(&f), Err(WireError::NotRoce(_))));
        let mut f = golden_frame();
        f[12] = 0x08;
        f[13] = 0x06;
        assert!(matches!(parse_frame(&f), Err(WireError::NotRoce(_))));
    }

    #[test]
    fn udp_source_ports() {
        // rdma_flow_label_to_udp_sport keeps the dynamic range.
        for fl in [0u32, 1, 0x3fff, 0x4000, 0xf_ffff, 0x1234] {
            assert!(rdma_flow_label_to_udp_sport(fl) >= 0xc000);
        }
        assert_eq!(rdma_flow_label_to_udp_sport(0x4001), 0xc000);
        assert_eq!(
            rdma_calc_flow_label(Qpn::new(0x11), Qpn::new(0x12)),
            0x11 * 0x12
        );
        let big = rdma_calc_flow_label(Qpn::new(0xff_ffff), Qpn::new(0xff_ffff));
        let v = 0xff_ffffu64 * 0xff_ffff;
        let v = v ^ (v >> 20);
        let v = v ^ (v >> 40);
        assert_eq!(u64::from(big), v & 0xf_ffff);
        assert_eq!(rxe_udp_src_port(Qpn::new(0)), 0xc000);
        assert!(rxe_udp_src_port(Qpn::new(0x11)) >= 0xc000);
    }
}
