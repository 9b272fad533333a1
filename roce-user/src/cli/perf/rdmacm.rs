//! `roce perf -R`: perftest's exchange and QP connection through RDMA CM, as perftest's `-R`
//! does it (perftest 6.06, Debian 12's 4.5-0.17: `perftest_communication.c`), on this device's
//! CM ([`Device::cm_listen`], [`Device::cm_connect`]):
//!
//! 1. a control connection: the client connects one RC QP to the server's RDMA CM port, the
//!    server accepts it ([`Control`]); perftest's exchange then runs over it, one SEND per
//!    message each way, the key messages as perftest's binary `struct pingpong_dest`
//!    ([`roce::cm::perftest::KeyFormat::Binary`]);
//! 2. after the setup exchange and one sync, each data QP is connected through RDMA CM on the
//!    same port ([`connect_data`], [`accept_data`]): the CM's REQ/REP carry the QPNs and PSNs
//!    and the QPs go to RTR and RTS from them, as librdmacm's `rdma_connect`/`rdma_accept` move
//!    them; the key exchanges that follow only carry the buffers' addresses and keys;
//! 3. at the end the client disconnects the data connections (DREQ), as perftest's
//!    `rdma_cm_disconnect_nodes` does, and the server waits for that ([`disconnect`]).
//!
//! While it waits for the peer on the control connection (its next message, or the client's
//! sync that ends the server's run), [`Control`] notices a peer that is gone: one that closed
//! the connection (a DREQ; the kernel's CM sends it when a perftest process on rxe dies), and
//! one that stopped answering without a word (a program on a user-space CM, such as the
//! drop-in library, that was killed: nobody sends its DREQ). For the second it probes the
//! peer's control QP with a zero-length RDMA WRITE after each [`CTL_PROBE_EVERY`] without
//! news: the peer's responder acknowledges it without a receive (perftest keeps exactly one
//! posted for its next message, which a SEND would take) and without checking an R_Key (IBA
//! C9-88: none for a zero-length RDMA operation; rxe's `check_rkey` and ours); the RDMA CM
//! grants every connected QP remote write (the kernel's `cm_init_qp_init_attr`, the drop-in
//! library, our own control QP). A peer that is gone never acknowledges it, and the control
//! QP's own retries ([`CTL_QP_TIMEOUT`], [`CTL_RETRY_CNT`], not `-u` and `--retry-cnt`, whose
//! 7 retries forever) end in retry exceeded about 8.5 s later, so the run fails within about
//! 10 s of the peer's death.
//!
//! perftest's `-R` resolves names as IPv4 only (`AF_INET` hints), so a perftest peer needs an
//! IPv4 address; between two `roce perf -R` IPv6 works too.
//!
//! perftest 4.5-0.17's server listens for the data connections only once its sync SEND after
//! the setup completed, so a fast client's REQ can meet no listener and be rejected with
//! "invalid service ID" (reason 8). As client we therefore resend a data REQ rejected for that
//! reason up to [`DATA_REQ_TRIES`] times, [`DATA_REQ_BACKOFF`] apart (doubling, at most
//! 200 ms): the server is known to be there (the control connection is up) and about to
//! listen. As server we listen on the port from the start, so our client never races.

use std::{
    collections::VecDeque,
    net::{IpAddr, ToSocketAddrs as _},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use roce::{
    api::{
        Access, CmAccept, CmConnect, CmEvent, CmState, CommId, CqId, Device, MrInfo, Mtu, QpCap,
        QpInit, QpType, Qpn, RcTarget, RdmaDevice, RecvWr, RejReason, SendOp, SendWr, Sge, Wc,
        WcStatus, remote::proto::RcAttrs,
    },
    cm::{
        CmError,
        perftest::{Comm, KeyFormat, Link},
    },
    wire::types::{Psn, RKey},
};

use super::{PerfArgs, PerfOp, setup::random_u32};
use crate::cli::interrupted;

/// How long a CM step (the control connection's answer, a data connection's REP or RTU, a
/// client's data REQs) or the ACK of a control message may take before the run fails.
const CM_TIMEOUT: Duration = Duration::from_secs(20);
/// Data REQs sent while a perftest server does not listen yet (see the module docs).
pub(super) const DATA_REQ_TRIES: u32 = 40;
/// The first wait before a data REQ is resent after REJ "invalid service ID"; doubles, up to
/// 200 ms.
pub(super) const DATA_REQ_BACKOFF: Duration = Duration::from_millis(10);
/// Receives the control QP keeps posted (perftest posts one and never has two messages in
/// flight).
const CTL_RECVS: u32 = 4;
/// Bytes of each control receive slot (perftest's largest message is 56 bytes).
const CTL_SLOT: u32 = 256;
/// wr_id of the control QP's SENDs (receives use their slot number).
const CTL_SEND: u64 = u64::MAX;
/// wr_id of the control QP's liveness probes (zero-length RDMA WRITEs).
const CTL_PROBE: u64 = u64::MAX - 1;
/// How often a wait on the control connection looks whether the peer has closed it.
const CTL_STATE_EVERY: Duration = Duration::from_millis(50);
/// How long a wait on the control connection goes without a completion on it before it
/// probes whether the peer is still there (see the module docs).
const CTL_PROBE_EVERY: Duration = Duration::from_secs(1);
/// The control QP's local ACK timeout exponent: 4.096 µs × 2^15, 134 ms. The transport
/// doubles the wait after each expiry, up to 16-fold, so [`CTL_RETRY_CNT`] retries take
/// (1 + 2 + 4 + 8 + 16 + 16 + 16) × 134 ms, about 8.5 s, before a WR fails with retry
/// exceeded.
const CTL_QP_TIMEOUT: u8 = 15;
/// The control QP's transport retries (7 would retry forever).
const CTL_RETRY_CNT: u8 = 6;

/// A small ephemeral source port for our RDMA CM IP header.
fn src_port() -> u16 {
    49152 + (random_u32() % 16384) as u16
}

/// The perftest exchange's control channel: an RC QP connected through RDMA CM, sending each
/// message as one SEND and receiving it into one of [`CTL_RECVS`] posted slots.
pub(super) struct Control<'d> {
    dev: &'d Device,
    qpn: Qpn,
    cq: CqId,
    mr: MrInfo,
    /// The control connection.
    pub(super) id: CommId,
    /// Receive completions polled while waiting for something else, in order.
    pending: VecDeque<Wc>,
    wcs: Vec<Wc>,
    /// When [`Control::poll`] last looked at the connection's CM state.
    state_seen: Instant,
    /// When something last completed on the control QP (the peer answered).
    heard: Instant,
    /// When the probe in flight was posted.
    probe: Option<Instant>,
    /// When the SEND in flight was posted.
    sent: Option<Instant>,
    /// Probes the peer acknowledged (in the JSON report).
    pub(super) probes: u64,
}

impl<'d> Control<'d> {
    /// A control QP in INIT with its receives posted.
    fn new(dev: &'d Device) -> anyhow::Result<(Self, Psn)> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(2 * CTL_RECVS as usize + 4)?;
        let qpn = RdmaDevice::create_qp(
            dev,
            QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: CTL_RECVS,
                    max_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            },
        )?;
        let mr = dev.reg_mr(
            pd,
            (CTL_SLOT * (CTL_RECVS + 1)) as usize,
            Access::LOCAL_WRITE,
        )?;
        // Remote write for a peer's liveness probes (zero-length RDMA WRITEs, no MR).
        RdmaDevice::qp_to_init(dev, qpn, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let ctl = Self {
            dev,
            qpn,
            cq,
            mr,
            id: CommId::default(),
            pending: VecDeque::new(),
            wcs: vec![Wc::default(); 8],
            state_seen: Instant::now(),
            heard: Instant::now(),
            probe: None,
            sent: None,
            probes: 0,
        };
        for slot in 0..CTL_RECVS {
            ctl.post(u64::from(slot))?;
        }
        Ok((ctl, Psn::new(random_u32())))
    }

    /// Posts receive slot `slot` (slot k is at `(k + 1) × CTL_SLOT`; the SEND buffer at 0).
    fn post(&self, slot: u64) -> anyhow::Result<()> {
        RdmaDevice::post_recv(
            self.dev,
            self.qpn,
            RecvWr {
                wr_id: slot,
                sg_list: vec![Sge {
                    addr: self.mr.iova + (slot + 1) * u64::from(CTL_SLOT),
                    length: CTL_SLOT,
                    lkey: self.mr.lkey,
                }],
            },
        )?;
        Ok(())
    }

    /// Polls the control CQ once (waiting up to 1 ms): a SEND's completion is returned, a
    /// receive's queued in `pending`. When nothing completed, looks every [`CTL_STATE_EVERY`]
    /// whether the peer has closed the control connection (a DREQ, or perftest's process gone:
    /// its kernel sends the DREQ), and fails then: nothing will arrive on it any more, and our
    /// posted receives never complete in error by themselves. After [`CTL_PROBE_EVERY`]
    /// without a completion it probes the peer (see the module docs), which fails the wait
    /// once the peer stopped answering.
    fn poll(&mut self) -> anyhow::Result<Option<Wc>> {
        let got = self.poll_cq()?;
        if got.is_some()
            || !self.pending.is_empty()
            || self.id == CommId::default()
            || self.state_seen.elapsed() < CTL_STATE_EVERY
        {
            return Ok(got);
        }
        self.state_seen = Instant::now();
        if matches!(
            self.dev.cm_state(self.id),
            None | Some(CmState::DreqSent | CmState::TimeWait)
        ) {
            // What completed before the DREQ came in is still ours to take.
            let got = self.poll_cq()?;
            if got.is_none() && self.pending.is_empty() {
                bail!(
                    "the peer closed the RDMA CM control connection in the middle of the \
                     exchange (its program exited?)"
                );
            }
            return Ok(got);
        }
        if self.probe.is_none() && self.heard.elapsed() >= CTL_PROBE_EVERY {
            self.post_probe()?;
        }
        Ok(None)
    }

    /// Posts a liveness probe: a zero-length RDMA WRITE, which needs no receive, no memory
    /// and no R_Key at the peer (IBA C9-88).
    fn post_probe(&mut self) -> anyhow::Result<()> {
        RdmaDevice::post_send(
            self.dev,
            self.qpn,
            SendWr::new(
                CTL_PROBE,
                SendOp::Write {
                    remote_addr: 0,
                    rkey: RKey::new(0),
                },
                Vec::new(),
            ),
        )
        .context("probing the peer on the RDMA CM control connection")?;
        self.probe = Some(Instant::now());
        Ok(())
    }

    /// [`Control::poll`] without the look at the connection's state.
    fn poll_cq(&mut self) -> anyhow::Result<Option<Wc>> {
        if interrupted() {
            bail!("interrupted");
        }
        let n =
            RdmaDevice::wait_cq_into(self.dev, self.cq, &mut self.wcs, super::setup::IDLE_WAIT)?;
        let mut send = None;
        for wc in &self.wcs[..n] {
            if wc.status == WcStatus::RetryExcErr {
                let since = match wc.wr_id {
                    CTL_PROBE => self.probe,
                    CTL_SEND => self.sent,
                    _ => None,
                };
                bail!(
                    "the peer stopped answering: nothing acknowledged on the RDMA CM control \
                     connection for {:.1} s (retry exceeded; its program was killed, or the \
                     path to it is down)",
                    since.unwrap_or(self.heard).elapsed().as_secs_f64()
                );
            }
            if wc.status != WcStatus::Success {
                bail!(
                    "the RDMA CM control connection failed: {:?} (the peer is gone?)",
                    wc.status
                );
            }
            self.heard = Instant::now();
            match wc.wr_id {
                CTL_SEND => {
                    self.sent = None;
                    send = Some(*wc);
                }
                CTL_PROBE => {
                    self.probe = None;
                    self.probes += 1;
                }
                _ => self.pending.push_back(*wc),
            }
        }
        Ok(send)
    }

    /// Whether the peer's next message has arrived (without waiting more than 1 ms): for the
    /// server's run, which ends at the client's first sync.
    pub(super) fn peer_spoke(&mut self) -> anyhow::Result<bool> {
        if self.pending.is_empty() {
            self.poll()?;
        }
        Ok(!self.pending.is_empty())
    }
}

impl Link for Control<'_> {
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError> {
        let io = |e: anyhow::Error| CmError::Io(std::io::Error::other(format!("{e:#}")));
        self.dev
            .mr_write(self.mr.lkey, 0, msg)
            .map_err(|e| io(e.into()))?;
        let sge = Sge {
            addr: self.mr.iova,
            length: msg.len() as u32,
            lkey: self.mr.lkey,
        };
        RdmaDevice::post_send(
            self.dev,
            self.qpn,
            SendWr::new(CTL_SEND, SendOp::Send, vec![sge]),
        )
        .map_err(|e| io(e.into()))?;
        self.sent = Some(Instant::now());
        let deadline = Instant::now() + CM_TIMEOUT;
        loop {
            if self.poll().map_err(io)?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io(anyhow::anyhow!(
                    "the peer did not acknowledge a message of the RDMA CM control connection \
                     within {} s",
                    CM_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<(), CmError> {
        let io = |e: anyhow::Error| CmError::Io(std::io::Error::other(format!("{e:#}")));
        let wc = loop {
            if let Some(wc) = self.pending.pop_front() {
                break wc;
            }
            if self.poll().map_err(io)?.is_none() && self.pending.is_empty() {
                std::thread::sleep(Duration::from_micros(20));
            }
        };
        let off = (wc.wr_id + 1) * u64::from(CTL_SLOT);
        if wc.byte_len as usize != buf.len() {
            return Err(CmError::Malformed {
                what: "perftest message over RDMA CM (length)",
                text: format!("{} bytes, expected {}", wc.byte_len, buf.len()),
            });
        }
        self.dev
            .mr_read(self.mr.lkey, off as usize, buf)
            .map_err(|e| io(e.into()))?;
        self.post(wc.wr_id).map_err(io)
    }
}

/// The next CM event, or an error after `deadline`.
fn next_event(dev: &Device, deadline: Instant, what: &str) -> anyhow::Result<CmEvent> {
    loop {
        if interrupted() {
            bail!("interrupted");
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .with_context(|| format!("no answer from the RDMA CM peer while {what}"))?;
        if let Some(e) = dev.wait_cm_event(left.min(Duration::from_millis(100))) {
            return Ok(e);
        }
    }
}

/// The peer's address from `host` (an IP, or a name resolved as perftest would: its first
/// address; perftest's `-R` takes IPv4 only).
fn resolve(host: &str, port: u16) -> anyhow::Result<IpAddr> {
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .map(|a| a.ip())
        .min_by_key(IpAddr::is_ipv6)
        .with_context(|| format!("{host} has no address"))
}

/// What a data or control QP takes from the CM exchange to reach RTR and RTS.
struct Peer {
    gid: [u8; 16],
    qpn: Qpn,
    /// The PSN the peer sends from (our rq_psn is ours).
    psn: Psn,
    /// READs/atomics the peer accepts from us at once.
    responder_resources: u8,
    /// Our address the peer connected to (passive side, from the REQ's RDMA CM IP header).
    local_ip: Option<IpAddr>,
}

/// The GID index our QP sends from towards `peer` (without `-g`): the GID of the address the
/// peer's REQ was sent to (`peer.local_ip`), or else the first of the peer's family and scope
/// (link-local only towards a link-local peer), as the CM picks its source
/// ([`Device::cm_connect`]).
fn gid_index_for(dev: &Device, peer: &Peer) -> usize {
    let remote = std::net::Ipv6Addr::from(peer.gid).to_canonical();
    let link_local = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
    let mut first = None;
    for i in 0..256 {
        let Ok(g) = RdmaDevice::gid(dev, i) else {
            break;
        };
        let ip = g.ip.to_canonical();
        if Some(ip) == peer.local_ip {
            return i;
        }
        if first.is_none()
            && ip.is_ipv4() == remote.is_ipv4()
            && link_local(ip) == link_local(remote)
        {
            first = Some(i);
        }
    }
    first.unwrap_or_else(|| RdmaDevice::default_gid_index(dev, remote.is_ipv4()))
}

/// Which of a run's QPs a connection is for: the control QP retries on its own terms
/// ([`CTL_QP_TIMEOUT`], [`CTL_RETRY_CNT`]), the data QPs as `-u` and `--retry-cnt` say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Control,
    Data,
}

/// Moves `qpn` to RTR and RTS towards `peer`.
fn ready_qp(
    dev: &Device,
    a: &PerfArgs,
    (gid_index, mtu): (usize, Mtu),
    (role, qpn): (Role, Qpn),
    our_psn: Psn,
    peer: &Peer,
) -> anyhow::Result<()> {
    let gid_index = if a.gid_idx.is_some() {
        gid_index
    } else {
        gid_index_for(dev, peer)
    };
    let attrs = RcAttrs {
        max_dest_rd_atomic: a.max_rd_atomic,
        max_rd_atomic: peer.responder_resources.clamp(1, a.max_rd_atomic),
        retry_cnt: match role {
            Role::Control => CTL_RETRY_CNT,
            Role::Data => a.retry_cnt,
        },
        timeout: match role {
            Role::Control => CTL_QP_TIMEOUT,
            Role::Data => a.qp_timeout,
        },
        ..RcAttrs::PINGPONG
    };
    RdmaDevice::connect_rc(
        dev,
        qpn,
        &RcTarget {
            gid_index,
            remote_gid: peer.gid,
            dest_qpn: peer.qpn,
            path_mtu: mtu,
            rq_psn: our_psn,
            sq_psn: peer.psn,
            attrs,
        },
    )?;
    Ok(())
}

/// The READ/atomic depth a side offers in its REQ or REP: perftest's `out_reads` for READ and
/// atomics, 0 otherwise (perftest's `conn_param` leaves them 0).
fn rd_depth(a: &PerfArgs) -> u8 {
    if matches!(a.op, PerfOp::Read | PerfOp::Atomic) {
        a.max_rd_atomic
    } else {
        0
    }
}

/// Sends a REQ for `qpn` and, on the REP, brings the QP up and sends the RTU. A REJ "invalid
/// service ID" is retried for a data connection (see the module docs), counted in `resent`.
fn connect_one(
    dev: &Device,
    a: &PerfArgs,
    (dest, gid_index, mtu): (IpAddr, usize, Mtu),
    (role, qpn, psn): (Role, Qpn, Psn),
    resent: Option<&mut u32>,
) -> anyhow::Result<(CommId, Qpn)> {
    let retry_unlistened = role == Role::Data;
    let mut resent = resent;
    let mut backoff = DATA_REQ_BACKOFF;
    let mut tries = 0;
    loop {
        tries += 1;
        let mut c = CmConnect::new(dest, a.port, src_port(), qpn, psn);
        c.responder_resources = rd_depth(a);
        c.initiator_depth = rd_depth(a);
        c.retry_count = a.retry_cnt;
        c.rnr_retry_count = 7;
        let id = dev
            .cm_connect(&c)
            .with_context(|| format!("RDMA CM connect to {dest} port {}", a.port))?;
        let deadline = Instant::now() + CM_TIMEOUT;
        loop {
            match next_event(dev, deadline, "connecting")? {
                CmEvent::Reply { id: got, rep } if got == id => {
                    let peer = Peer {
                        gid: roce::ibcm::Gid::from_ip(dest).0,
                        qpn: rep.local_qpn,
                        psn: rep.starting_psn,
                        responder_resources: rep.responder_resources,
                        local_ip: None,
                    };
                    if let Err(e) = ready_qp(dev, a, (gid_index, mtu), (role, qpn), psn, &peer) {
                        let _ = dev.cm_reject(id, &[]);
                        return Err(e.context("bringing the QP up from the REP"));
                    }
                    dev.cm_ready(id, &[])?;
                    return Ok((id, peer.qpn));
                }
                CmEvent::Rejected {
                    id: got, reason, ..
                } if got == id => {
                    if retry_unlistened
                        && reason == RejReason::INVALID_SERVICE_ID
                        && tries < DATA_REQ_TRIES
                    {
                        log::info!("data REQ {tries} rejected: nobody listens yet; resending");
                        if let Some(r) = resent.as_deref_mut() {
                            *r += 1;
                        }
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(Duration::from_millis(200));
                        break;
                    }
                    bail!(
                        "RDMA CM connection to {dest} port {} rejected ({reason:?}{}) after {tries} \
                         REQ(s)",
                        a.port,
                        if reason == RejReason::INVALID_SERVICE_ID {
                            ": nobody listens there, is the server running with -R?"
                        } else {
                            ""
                        }
                    );
                }
                CmEvent::TimedOut { id: got } if got == id => {
                    bail!(
                        "RDMA CM connection to {dest} port {}: no answer (timed out)",
                        a.port
                    )
                }
                other => log::info!("RDMA CM event while connecting: {other:?}"),
            }
        }
    }
}

/// Waits for a REQ on our listened port and accepts it with `qpn` (brought up first).
fn accept_one(
    dev: &Device,
    a: &PerfArgs,
    (gid_index, mtu): (usize, Mtu),
    (role, qpn): (Role, Qpn),
    deadline: Option<Instant>,
) -> anyhow::Result<(CommId, Qpn)> {
    loop {
        let ev = match deadline {
            Some(d) => next_event(dev, d, "waiting for the data connections")?,
            None => loop {
                if interrupted() {
                    bail!("interrupted");
                }
                if let Some(e) = dev.wait_cm_event(Duration::from_millis(100)) {
                    break e;
                }
            },
        };
        match ev {
            CmEvent::ConnectRequest { id, from, req } => {
                if req.service_id.port() != a.port {
                    let _ = dev.cm_reject(id, &[]);
                    continue;
                }
                let psn = Psn::new(random_u32());
                let peer = Peer {
                    gid: from.0,
                    qpn: req.local_qpn,
                    psn: req.starting_psn,
                    responder_resources: req.responder_resources,
                    local_ip: roce::ibcm::CmaHdr::parse(&req.private_data)
                        .ok()
                        .map(|h| h.dst.to_canonical()),
                };
                if req.multipath_hint {
                    // The peer's QP allows the multipath extension (its REQ said so): ours, if
                    // it does too, starts with it on; the REP hints back (docs/multipath.md).
                    dev.set_multipath_peer(qpn)?;
                }
                if let Err(e) = ready_qp(dev, a, (gid_index, mtu), (role, qpn), psn, &peer) {
                    let _ = dev.cm_reject(id, &[]);
                    return Err(e.context("bringing the QP up from the REQ"));
                }
                let mut acc = CmAccept::new(qpn, psn);
                acc.responder_resources = rd_depth(a).min(req.initiator_depth);
                acc.initiator_depth = rd_depth(a).min(req.responder_resources);
                dev.cm_accept(id, &acc)?;
                return Ok((id, peer.qpn));
            }
            other => log::info!("RDMA CM event while waiting for a connection: {other:?}"),
        }
    }
}

/// The control connection: as client, connects to `host`; as server, listens on the port
/// (for the data connections too, until [`accept_data`]) and accepts the first REQ. Returns
/// the exchange over it and the peer's address (the client's data REQs go there).
pub(super) fn control<'d>(
    dev: &'d Device,
    a: &PerfArgs,
    gid_index: usize,
    mtu: Mtu,
) -> anyhow::Result<(Comm<Control<'d>>, Option<IpAddr>)> {
    let (mut ctl, psn) = Control::new(dev)?;
    let dest = match &a.host {
        Some(h) => {
            let dest = resolve(h, a.port)?;
            ctl.id = connect_one(
                dev,
                a,
                (dest, gid_index, mtu),
                (Role::Control, ctl.qpn, psn),
                None,
            )
            .context("the control connection")?
            .0;
            Some(dest)
        }
        None => {
            dev.cm_listen(a.port)
                .with_context(|| format!("listening on RDMA CM port {}", a.port))?;
            ctl.id = accept_one(dev, a, (gid_index, mtu), (Role::Control, ctl.qpn), None)?.0;
            None
        }
    };
    Ok((Comm::over(ctl, a.host.is_some(), KeyFormat::Binary), dest))
}

/// Client: connects every data QP (`qpns`, with their first PSNs) to the server through RDMA
/// CM, one after the other. Returns the connections with the peer's QPN of each, and how many
/// REQs were sent again after a REJ "invalid service ID" (see the module docs).
pub(super) fn connect_data(
    dev: &Device,
    a: &PerfArgs,
    (dest, gid_index, mtu): (IpAddr, usize, Mtu),
    qps: &[(Qpn, Psn)],
) -> anyhow::Result<(Vec<(CommId, Qpn)>, u32)> {
    let mut resent = 0;
    let conns = qps
        .iter()
        .map(|&(qpn, psn)| {
            connect_one(
                dev,
                a,
                (dest, gid_index, mtu),
                (Role::Data, qpn, psn),
                Some(&mut resent),
            )
            .context("a data connection")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((conns, resent))
}

/// Server: accepts a data connection for each of `qpns`, in the order the REQs come, then
/// stops listening. Returns the connections with the peer's QPN of each (the key exchange
/// that follows may list the peer's QPs in another order).
pub(super) fn accept_data(
    dev: &Device,
    a: &PerfArgs,
    (gid_index, mtu): (usize, Mtu),
    qpns: &[Qpn],
) -> anyhow::Result<Vec<(CommId, Qpn)>> {
    let deadline = Instant::now() + CM_TIMEOUT;
    let ids = qpns
        .iter()
        .map(|&q| accept_one(dev, a, (gid_index, mtu), (Role::Data, q), Some(deadline)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let _ = dev.cm_unlisten(a.port);
    Ok(ids)
}

/// The end of the run: the client disconnects the data connections and then the control
/// connection and waits (at most 3 s) for the peer's DREPs; the server waits as long for the
/// client's DREQs (answered by the CM). Whatever is left is disconnected when the device
/// closes.
pub(super) fn disconnect(dev: &Device, client: bool, data: &[CommId], control: CommId) {
    let mut open: Vec<CommId> = data.to_vec();
    if client {
        open.push(control);
        for &id in &open {
            let _ = dev.cm_disconnect(id, &[]);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while !open.is_empty() {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break;
        };
        match dev.wait_cm_event(left) {
            Some(CmEvent::Disconnected { id, .. }) => open.retain(|&o| o != id),
            Some(_) => {}
            None => break,
        }
    }
}
