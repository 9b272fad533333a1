//! `roce pingpong -R`: rping's test (rdma-core `librdmacm/examples/rping.c`), connected
//! through RDMA CM, so that either side can be the real `rping` (rdmacm-utils).
//!
//! The connection: the client sends a REQ to the server's port of RDMA CM's TCP port space
//! (rping's default 7174) with no private data, one RDMA READ each way, 7 transport and 7 RNR
//! retries (`rping_init_conn_param`); the server accepts with one READ each way. The QP comes
//! to RTR and RTS from the REQ's or REP's QPN and PSN, as librdmacm's `rdma_accept` and
//! `rdma_connect` bring it (roce-user/verbs/src/ffi/rdmacm.rs does the same for C programs).
//!
//! Each ping, as rping does it: the client fills its start buffer with
//! `rdma-ping-<n>: ` and a rotating run of the letters `A`..`z` (the last byte NUL) and
//! SENDs the buffer's address, R_Key and size (16 bytes, big-endian: `struct
//! rping_rdma_info`); the server RDMA READs the buffer and SENDs a go-ahead (16 zero bytes);
//! the client SENDs the same for its sink buffer; the server RDMA WRITEs the ping back into
//! it (up to and including its NUL) and SENDs a go-ahead; the client checks the sink against
//! what it sent (`-c`, rping's `-V`). After `-n` pings the client disconnects (DREQ); the
//! server serves until its client disconnects, as `rping -s` does.

use std::{
    net::{IpAddr, ToSocketAddrs as _},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use roce::{
    api::{
        Access, AttrMask, CmAccept, CmConnect, CmEvent, CommId, CqId, Device, MrInfo, Mtu, QpAttr,
        QpCap, QpInit, QpState, QpType, Qpn, RKey, RcConnect, RecvWr, RejReason, SendOp, SendWr,
        Sge, Wc, WcOpcode, WcStatus,
    },
    ibcm::{CmaHdr, Gid},
};
use serde_json::json;

use super::{super::Output, PingpongArgs, random_psn};
use crate::cli::{interrupted, progress::Progress};

/// rping's default port (`rping -p`).
pub const DEFAULT_PORT: u16 = 7174;
/// rping's default ping size (`rping -S`).
pub const DEFAULT_SIZE: u32 = 64;
/// rping's smallest ping (`RPING_MIN_BUFSIZE`: room for `rdma-ping-<INT_MAX>: ` and its NUL).
pub const MIN_SIZE: u32 = 26;
/// rping's largest ping (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 65535;
/// The length of rping's buffer advertisement, `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// The local ACK timeout librdmacm gives RC QPs on RoCE (IBTA 9.7.6.1.3 code; as the
/// drop-in librdmacm).
const LOCAL_ACK_TIMEOUT: u8 = 18;
/// How long a step of the test (a completion, a CM answer) may take before we give up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the client keeps asking while the server is not listening yet (REJ "invalid
/// service ID"), as the TCP mode waits for its server.
const LISTEN_WAIT: Duration = Duration::from_secs(5);
/// How long the client waits for the answer to one connection request (the CM resends the
/// REQ meanwhile) before it gives up.
const CONNECT_WAIT: Duration = Duration::from_secs(20);

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const RDMA_WRID: u64 = 3;

/// A buffer advertisement (`struct rping_rdma_info`): address, R_Key and size, big-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// The buffer's address (our iova).
    pub buf: u64,
    /// Its R_Key.
    pub rkey: u32,
    /// Its size in bytes.
    pub size: u32,
}

impl Info {
    /// The 16 bytes on the wire.
    #[must_use]
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Reads a received advertisement; `None` unless it is exactly 16 bytes.
    #[must_use]
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; INFO_LEN] = b.try_into().ok()?;
        let (buf, rest) = b.split_at(8);
        let (rkey, size) = rest.split_at(4);
        Some(Self {
            buf: u64::from_be_bytes(buf.try_into().ok()?),
            rkey: u32::from_be_bytes(rkey.try_into().ok()?),
            size: u32::from_be_bytes(size.try_into().ok()?),
        })
    }
}

/// The bytes of rping's ping `n` of `size` bytes (`rping_test_client`): `rdma-ping-<n>: `,
/// then letters from `A` + n mod 58 on, each the next of `A`..`z` round, the last byte NUL.
#[must_use]
pub fn ping_data(n: u32, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{n}: ").into_bytes();
    v.truncate(size.saturating_sub(1));
    let mut c = 65 + (n % 58) as u8;
    while v.len() < size {
        v.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = v.last_mut() {
        *last = 0;
    }
    v
}

/// The text of a ping buffer up to its NUL, as rping's `printf("%s")` shows it.
fn as_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// What the wait for the next event brought.
enum Step {
    /// A completion (successful).
    Done(Wc),
    /// The peer disconnected (DREQ), or our QP's work requests were flushed.
    Disconnected,
}

/// One side's verbs objects.
struct Side<'a> {
    dev: &'a Device,
    cq: CqId,
    qpn: Qpn,
    /// The 16-byte receive buffer.
    recv: MrInfo,
    /// The 16-byte send buffer.
    send: MrInfo,
    /// The RDMA sink (client) or the READ target and WRITE source (server).
    rdma: MrInfo,
    /// The client's start buffer, READ by the server.
    start: Option<MrInfo>,
    events: bool,
    /// The connection, once there is one.
    id: Option<CommId>,
}

impl Side<'_> {
    fn post_recv(&self) -> anyhow::Result<()> {
        self.dev.post_recv(
            self.qpn,
            RecvWr {
                wr_id: RECV_WRID,
                sg_list: vec![sge(&self.recv, INFO_LEN as u32)],
            },
        )?;
        Ok(())
    }

    /// SENDs `info` (or rping's go-ahead, 16 zero bytes).
    fn send_info(&self, info: Option<Info>) -> anyhow::Result<()> {
        let b = info.map_or([0; INFO_LEN], |i| i.encode());
        self.dev.mr_write(self.send.lkey, 0, &b)?;
        self.dev.post_send(
            self.qpn,
            SendWr::send(SEND_WRID, vec![sge(&self.send, INFO_LEN as u32)]),
        )?;
        Ok(())
    }

    /// Waits for the next completion of `want` (SEND completions on the way are taken and
    /// dropped, as rping does), or for the peer's disconnect. `what` names the wait in errors.
    fn wait(&mut self, want: WcOpcode, what: &str) -> anyhow::Result<Step> {
        let mut last = Instant::now();
        loop {
            if interrupted() {
                bail!("interrupted while waiting for {what}");
            }
            let wc = if self.events {
                self.dev.wait_cq(self.cq, Duration::from_millis(20))
            } else {
                let mut b = [Wc::default(); 1];
                (self.dev.poll_cq_into(self.cq, &mut b) == 1).then_some(b[0])
            };
            if let Some(wc) = wc {
                last = Instant::now();
                if wc.status == WcStatus::WrFlushErr {
                    return Ok(Step::Disconnected);
                }
                if wc.status != WcStatus::Success {
                    bail!(
                        "{:?} completion failed with status {:?} ({}) while waiting for {what}",
                        wc.opcode,
                        wc.status,
                        wc.status as u32
                    );
                }
                if wc.opcode == want {
                    return Ok(Step::Done(wc));
                }
                if wc.opcode != WcOpcode::Send {
                    bail!(
                        "unexpected {:?} completion while waiting for {what}",
                        wc.opcode
                    );
                }
                continue;
            }
            while let Some(e) = self.dev.poll_cm_event() {
                match e {
                    CmEvent::Disconnected { id, .. } if Some(id) == self.id => {
                        return Ok(Step::Disconnected);
                    }
                    CmEvent::TimedOut { id } if Some(id) == self.id => {
                        bail!("the peer never confirmed the connection (the CM's REP timed out)")
                    }
                    CmEvent::Rejected { id, reason, .. } if Some(id) == self.id => {
                        bail!("the peer REJECTED the connection ({reason:?})")
                    }
                    CmEvent::ConnectRequest { id, .. } => {
                        // One connection at a time, as `rping -s` without -P.
                        let _ = self.dev.cm_reject(id, &[]);
                    }
                    _ => {}
                }
            }
            if last.elapsed() > STEP_TIMEOUT {
                bail!(
                    "nothing for {} s while waiting for {what} (QP state {:?})",
                    STEP_TIMEOUT.as_secs(),
                    self.dev.qp_state(self.qpn)
                );
            }
            if !self.events {
                std::hint::spin_loop();
            }
        }
    }

    /// Reads the advertisement a RECV completion brought, and posts the next receive.
    fn take_info(&self, wc: &Wc, from: &str) -> anyhow::Result<Info> {
        let mut b = [0u8; INFO_LEN];
        self.dev.mr_read(self.recv.lkey, 0, &mut b)?;
        let len = wc.byte_len as usize;
        self.post_recv()?;
        if len != INFO_LEN {
            bail!(
                "{from} sent a message of {len} bytes, not rping's {INFO_LEN}-byte buffer \
                 advertisement"
            );
        }
        Info::decode(&b).context("a 16-byte advertisement")
    }

    /// Moves the QP to the error state: its work requests are flushed (rping's disconnect).
    fn qp_to_error(&self) {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self.dev.modify_qp(self.qpn, &attr, AttrMask::STATE);
    }
}

fn sge(mr: &MrInfo, length: u32) -> Sge {
    Sge {
        addr: mr.iova,
        length,
        lkey: mr.lkey,
    }
}

/// A random source port for our REQ's RDMA CM IP header (Linux's ephemeral range).
fn ephemeral_port() -> u16 {
    32768 + (random_psn().value() % 28232) as u16
}

/// The largest path MTU at most `limit` bytes.
fn mtu_at_most(limit: u32) -> Mtu {
    [4096, 2048, 1024, 512]
        .into_iter()
        .find(|m| *m <= limit)
        .and_then(Mtu::from_bytes)
        .unwrap_or(Mtu::Mtu256)
}

/// The GID index to talk to `peer` from: `-g`, else the first GID of the peer's family (and
/// link-local scope), as the CM picks its own source.
fn gid_index_for(dev: &Device, a: &PingpongArgs, peer: IpAddr, ours: Option<IpAddr>) -> usize {
    if let Some(g) = a.gid_idx {
        return g;
    }
    let gids = &dev.info().gids;
    if let Some(i) = ours.and_then(|ip| gids.iter().position(|g| g.ip == ip)) {
        return i;
    }
    let link_local = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
    gids.iter()
        .position(|g| g.ip.is_ipv4() == peer.is_ipv4() && link_local(g.ip) == link_local(peer))
        .unwrap_or_else(|| dev.info().default_gid_index(peer.is_ipv4()))
}

/// `roce pingpong -R`: the client with a host, the server without.
pub(crate) fn run(out: Output, a: &PingpongArgs, netns: Option<String>) -> anyhow::Result<()> {
    if a.ib_port != 1 {
        bail!(
            "port {} does not exist: roce-xdp devices have one port, 1",
            a.ib_port
        );
    }
    // The client's pings are rping's default size; the server takes any rping size.
    let size = a.size.unwrap_or(if a.host.is_some() {
        DEFAULT_SIZE
    } else {
        MAX_SIZE
    });
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        bail!("invalid size {size} (rping's range is {MIN_SIZE} to {MAX_SIZE})");
    }
    if a.iters == 0 {
        bail!("--iters must be positive");
    }
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let dev = super::open_device(a, netns)?;
    let pd = dev.alloc_pd()?;
    let remote_access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let cq = dev.create_cq(32)?;
    let qpn = dev.create_qp(QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 2,
            max_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
    })?;
    dev.qp_to_init(qpn, Access::REMOTE_READ | Access::REMOTE_WRITE)?;
    let mut side = Side {
        dev: &dev,
        cq,
        qpn,
        recv: dev.reg_mr(pd, INFO_LEN, Access::LOCAL_WRITE)?,
        send: dev.reg_mr(pd, INFO_LEN, Access::empty())?,
        rdma: dev.reg_mr(pd, size as usize, remote_access)?,
        start: if a.host.is_some() {
            Some(dev.reg_mr(pd, size as usize, remote_access)?)
        } else {
            None
        },
        events: a.events,
        id: None,
    };
    side.post_recv()?;
    let r = match &a.host {
        Some(host) => client(out, a, &mut side, host, port, size),
        None => server(out, a, &mut side, port, size),
    };
    side.qp_to_error();
    dev.close();
    r
}

/// The latency percentiles of `rtts` (µs).
fn latency(mut rtts: Vec<f64>) -> serde_json::Value {
    rtts.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        rtts.get(((rtts.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    json!({ "p50": pct(0.5), "p99": pct(0.99), "max": rtts.last().copied().unwrap_or(0.0) })
}

fn client(
    out: Output,
    a: &PingpongArgs,
    side: &mut Side<'_>,
    host: &str,
    port: u16,
    size: u32,
) -> anyhow::Result<()> {
    let dev = side.dev;
    let dest = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))?
        .ip();
    let psn = random_psn();
    let first = Instant::now();
    let (id, rep) = loop {
        let mut c = CmConnect::new(dest, port, ephemeral_port(), side.qpn, psn);
        // rping's `rping_init_conn_param`: one READ each way, 7 retries of each kind.
        c.responder_resources = 1;
        c.initiator_depth = 1;
        let id = dev
            .cm_connect(&c)
            .with_context(|| format!("connecting to {dest} port {port}"))?;
        side.id = Some(id);
        let deadline = Instant::now() + CONNECT_WAIT;
        let ev = loop {
            if interrupted() {
                let _ = dev.cm_destroy(id);
                bail!("interrupted while connecting to {dest} port {port}");
            }
            match dev.wait_cm_event(Duration::from_millis(100)) {
                Some(
                    e @ (CmEvent::Reply { id: i, .. }
                    | CmEvent::Rejected { id: i, .. }
                    | CmEvent::TimedOut { id: i }),
                ) if i == id => break e,
                _ if Instant::now() > deadline => {
                    let _ = dev.cm_destroy(id);
                    bail!(
                        "{dest} port {port} is UNREACHABLE: no answer to our connection \
                         request in {} s",
                        CONNECT_WAIT.as_secs()
                    );
                }
                _ => {}
            }
        };
        match ev {
            CmEvent::Reply { rep, .. } => break (id, rep),
            CmEvent::Rejected { reason, .. }
                if reason == RejReason::INVALID_SERVICE_ID && first.elapsed() < LISTEN_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            CmEvent::Rejected { reason, .. } => bail!(
                "{dest} port {port} REJECTED the connection ({reason:?}{})",
                if reason == RejReason::INVALID_SERVICE_ID {
                    ": nobody listens on that port"
                } else {
                    ""
                }
            ),
            _ => bail!("{dest} port {port} is UNREACHABLE: the CM's REQ went unanswered"),
        }
    };
    let gid_idx = gid_index_for(dev, a, dest, None);
    let path = dev.path_to(gid_idx, &Gid::from_ip(dest).0, side.qpn, rep.local_qpn)?;
    let mut rc = RcConnect::new(
        path,
        mtu_at_most(dev.max_path_mtu(dest.is_ipv6())),
        rep.local_qpn,
        psn,
        rep.starting_psn,
    );
    rc.timeout = LOCAL_ACK_TIMEOUT;
    rc.rnr_retry = rep.rnr_retry_count;
    if let Err(e) = dev.qp_connect(side.qpn, &rc) {
        let _ = dev.cm_reject(id, &[]);
        return Err(e).context("the QP did not take the connection's attributes");
    }
    dev.cm_ready(id, &[])?;

    let start = side.start.context("the client's start buffer")?;
    let mut progress = Progress::new(&a.progress, out)?;
    let mut rtts = Vec::with_capacity(a.iters as usize);
    let t0 = Instant::now();
    let mut bad = 0u32;
    for n in 0..a.iters {
        if let Some(p) = crate::cli::progress::due(&mut progress) {
            let secs = p.secs();
            p.show(
                &format!("pingpong -R: {secs:.0} s, {n} of {} pings", a.iters),
                json!({ "secs": secs, "pings": n, "iters": a.iters }),
            );
        }
        let it = Instant::now();
        let ping = ping_data(n, size as usize);
        dev.mr_write(start.lkey, 0, &ping)?;
        side.send_info(Some(Info {
            buf: start.iova,
            rkey: start.rkey.value(),
            size,
        }))?;
        let what = format!("the server's go-ahead after its READ of ping {n}");
        let Step::Done(wc) = side.wait(WcOpcode::Recv, &what)? else {
            bail!("the server disconnected before {what}");
        };
        side.take_info(&wc, "the server")?;
        side.send_info(Some(Info {
            buf: side.rdma.iova,
            rkey: side.rdma.rkey.value(),
            size,
        }))?;
        let what = format!("the server's go-ahead after its WRITE of ping {n}");
        let Step::Done(wc) = side.wait(WcOpcode::Recv, &what)? else {
            bail!("the server disconnected before {what}");
        };
        side.take_info(&wc, "the server")?;
        rtts.push(it.elapsed().as_secs_f64() * 1e6);
        let mut got = vec![0u8; size as usize];
        dev.mr_read(side.rdma.lkey, 0, &mut got)?;
        if a.chk && got != ping {
            bad += 1;
            eprintln!("data mismatch in ping {n}");
        }
        if a.verbose && !out.json {
            println!("ping data: {}", as_text(&got));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(progress);
    // rping's end: rdma_disconnect (the QP to ERR, a DREQ), then the DREP.
    side.qp_to_error();
    dev.cm_disconnect(id, &[])?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut disconnected = false;
    while !disconnected && Instant::now() < deadline {
        disconnected = matches!(
            dev.wait_cm_event(Duration::from_millis(100)),
            Some(CmEvent::Disconnected { id: i, .. }) if i == id
        );
    }
    if !disconnected {
        eprintln!(
            "{dest} did not answer our DREQ within {} s",
            STEP_TIMEOUT.as_secs()
        );
    }
    if bad > 0 {
        bail!(
            "data mismatch: {bad} of {} pings came back changed",
            a.iters
        );
    }
    let v = json!({
        "role": "client", "peer": dest, "port": port, "size": size, "iters": a.iters,
        "seconds": secs, "usec_per_iter": secs * 1e6 / f64::from(a.iters),
        "checked": a.chk, "latency_us": latency(rtts),
        "local_qpn": side.qpn.value(), "remote_qpn": rep.local_qpn.value(),
    });
    let text = format!(
        "{} pings of {size} bytes to {dest} in {secs:.2} seconds = {:.2} usec/ping{}\n",
        a.iters,
        secs * 1e6 / f64::from(a.iters),
        if a.chk { ", every one verified" } else { "" }
    );
    out.emit(&v, &text);
    Ok(())
}

fn server(
    out: Output,
    a: &PingpongArgs,
    side: &mut Side<'_>,
    port: u16,
    size: u32,
) -> anyhow::Result<()> {
    let dev = side.dev;
    dev.cm_listen(port)
        .with_context(|| format!("listening on RDMA CM port {port}"))?;
    let (id, req, h) = loop {
        if interrupted() {
            bail!("interrupted while waiting for a connection on port {port}");
        }
        match dev.wait_cm_event(Duration::from_millis(100)) {
            Some(CmEvent::ConnectRequest { id, req, .. }) => match CmaHdr::parse(&req.private_data)
            {
                Ok(h) => break (id, req, h),
                Err(e) => {
                    eprintln!("rejecting a connection request without an RDMA CM header: {e}");
                    let _ = dev.cm_reject(id, &[]);
                }
            },
            _ => continue,
        }
    };
    let _ = dev.cm_unlisten(port);
    side.id = Some(id);
    if req.responder_resources == 0 {
        let _ = dev.cm_reject(id, &[]);
        bail!(
            "{} offers no RDMA READ responder resources: rping's server READs each ping",
            h.src
        );
    }
    let psn = random_psn();
    let gid_idx = gid_index_for(dev, a, h.src, Some(h.dst));
    let path = dev.path_to(gid_idx, &Gid::from_ip(h.src).0, side.qpn, req.local_qpn)?;
    let mtu = mtu_at_most(dev.max_path_mtu(h.src.is_ipv6()).min(req.path_mtu.bytes()));
    if req.multipath_hint {
        // The client's QP allows the multipath extension (its REQ said so): ours, with
        // --multipath, starts with it on; the REP hints back (docs/multipath.md).
        dev.set_multipath_peer(side.qpn)?;
    }
    let mut rc = RcConnect::new(path, mtu, req.local_qpn, psn, req.starting_psn);
    rc.timeout = LOCAL_ACK_TIMEOUT;
    rc.retry_cnt = req.retry_count;
    rc.rnr_retry = req.rnr_retry_count;
    if let Err(e) = dev.qp_connect(side.qpn, &rc) {
        let _ = dev.cm_reject(id, &[]);
        return Err(e).context("the QP did not take the connection's attributes");
    }
    let mut acc = CmAccept::new(side.qpn, psn);
    acc.responder_resources = req.initiator_depth.min(1);
    acc.initiator_depth = 1;
    dev.cm_accept(id, &acc)?;

    let mut progress = Progress::new(&a.progress, out)?;
    let mut rtts = Vec::new();
    let mut t0 = None;
    let mut bad = 0u32;
    let mut n = 0u32;
    let mut buf = vec![0u8; size as usize];
    // The size of the client's pings (the last one's).
    let mut ping_size = 0u32;
    loop {
        if let Some(p) = crate::cli::progress::due(&mut progress) {
            let secs = p.secs();
            p.show(
                &format!("pingpong -R: {secs:.0} s, {n} pings served"),
                json!({ "secs": secs, "pings": n }),
            );
        }
        let what = format!("the client's start buffer of ping {n}");
        let Step::Done(wc) = side.wait(WcOpcode::Recv, &what)? else {
            break;
        };
        let it = Instant::now();
        t0.get_or_insert(it);
        let src = side.take_info(&wc, "the client")?;
        if src.size > size || src.size == 0 {
            bail!(
                "the client's ping {n} is {} bytes; this server takes 1 to {size} (-s)",
                src.size
            );
        }
        let len = src.size as usize;
        ping_size = src.size;
        side.dev.post_send(
            side.qpn,
            SendWr::new(
                RDMA_WRID,
                SendOp::Read {
                    remote_addr: src.buf,
                    rkey: RKey::new(src.rkey),
                },
                vec![sge(&side.rdma, src.size)],
            ),
        )?;
        let what = format!("our RDMA READ of ping {n}");
        if !matches!(side.wait(WcOpcode::RdmaRead, &what)?, Step::Done(_)) {
            bail!("the client disconnected before {what} completed");
        }
        buf.resize(len, 0);
        dev.mr_read(side.rdma.lkey, 0, &mut buf)?;
        if a.chk && buf != ping_data(n, len) {
            bad += 1;
            eprintln!("ping {n} is not rping's: {:?}", as_text(&buf));
        }
        if a.verbose && !out.json {
            println!("server ping data: {}", as_text(&buf));
        }
        side.send_info(None)?;
        let what = format!("the client's sink buffer of ping {n}");
        let Step::Done(wc) = side.wait(WcOpcode::Recv, &what)? else {
            bail!("the client disconnected before sending {what}");
        };
        let sink = side.take_info(&wc, "the client")?;
        // rping writes the ping up to and including its NUL.
        let echo = buf.iter().position(|&c| c == 0).map_or(len, |p| p + 1) as u32;
        if echo > sink.size {
            bail!(
                "the client's sink of ping {n} is {} bytes, too small for the {echo}-byte ping",
                sink.size
            );
        }
        side.dev.post_send(
            side.qpn,
            SendWr::new(
                RDMA_WRID,
                SendOp::Write {
                    remote_addr: sink.buf,
                    rkey: RKey::new(sink.rkey),
                },
                vec![sge(&side.rdma, echo)],
            ),
        )?;
        let what = format!("our RDMA WRITE of ping {n}");
        if !matches!(side.wait(WcOpcode::RdmaWrite, &what)?, Step::Done(_)) {
            bail!("the client disconnected before {what} completed");
        }
        side.send_info(None)?;
        rtts.push(it.elapsed().as_secs_f64() * 1e6);
        n += 1;
    }
    drop(progress);
    let secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if bad > 0 {
        bail!("{bad} of {n} pings did not hold rping's data");
    }
    let v = json!({
        "role": "server", "peer": h.src, "port": port, "size": ping_size, "iters": n,
        "seconds": secs, "usec_per_iter": if n > 0 { secs * 1e6 / f64::from(n) } else { 0.0 },
        "checked": a.chk, "latency_us": latency(rtts),
        "local_qpn": side.qpn.value(), "remote_qpn": req.local_qpn.value(),
    });
    let text = format!(
        "served {n} pings of {ping_size} bytes from {} in {secs:.2} seconds{}\n",
        h.src,
        if a.chk {
            ", every one rping's data"
        } else {
            ""
        }
    );
    out.emit(&v, &text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_are_rpings() {
        let p = ping_data(0, 64);
        assert_eq!(p.len(), 64);
        assert!(p.starts_with(b"rdma-ping-0: ABC"));
        assert_eq!(p[63], 0);
        // The run starts one letter later each ping and wraps from `z` to `A`.
        let p = ping_data(57, 40);
        assert!(p.starts_with(b"rdma-ping-57: zABC"), "{:?}", as_text(&p));
        let p = ping_data(58, 40);
        assert!(p.starts_with(b"rdma-ping-58: ABC"));
        assert_eq!(as_text(&ping_data(3, 26)).len(), 25);
    }

    #[test]
    fn info_round_trips_big_endian() {
        let i = Info {
            buf: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            size: 64,
        };
        let b = i.encode();
        assert_eq!(b[0], 1);
        assert_eq!(b[8], 0x0a);
        assert_eq!(b[15], 64);
        assert_eq!(Info::decode(&b), Some(i));
        assert_eq!(Info::decode(&b[..15]), None);
    }
}
