//! perftest's out-of-band exchange over TCP (see `roce::cm::perftest`), step for step as
//! perftest 6.06 does it, so that the peer can be ib_write_bw, ib_read_bw, ib_send_bw,
//! ib_atomic_bw, ib_write_lat or ib_send_lat: the setup (versions, system data, MTU), the key
//! exchanges that bring the QPs up, and after the run the reports and the closing sync. With
//! `-R` the same steps run over an RDMA CM control connection and the QPs are connected
//! through RDMA CM (`rdmacm.rs`).

use std::{
    net::{TcpListener, TcpStream},
    time::Duration,
};

use anyhow::Context as _;
use roce::{
    api::{CommId, Device, Mtu, Qpn, RcTarget, RdmaDevice, remote::proto::RcAttrs},
    cm::{
        CmError,
        perftest::{BwReport, Comm, KeyMsg, Link},
    },
};
use roce_common::counters::CmStats;

use super::{
    PerfArgs, PerfOp, Plan,
    rdmacm::{self, Control},
    report::PerfResult,
    setup::{Local, QpCtx},
};

/// What perftest's exchange runs over: its TCP socket, or (`-R`) an RDMA CM control QP.
pub(super) enum Channel<'d> {
    /// The ethernet exchange.
    Tcp(TcpStream),
    /// The RDMA CM exchange.
    Cm(Control<'d>),
}

impl Link for Channel<'_> {
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError> {
        match self {
            Self::Tcp(t) => t.send(msg),
            Self::Cm(c) => c.send(msg),
        }
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<(), CmError> {
        match self {
            Self::Tcp(t) => t.recv(buf),
            Self::Cm(c) => c.recv(buf),
        }
    }
}

impl Channel<'_> {
    /// Call before polling [`Channel::peer_spoke`] in a loop, and with `false` after.
    pub(super) fn watch(&mut self, on: bool) -> std::io::Result<()> {
        match self {
            Self::Tcp(t) => t.set_nonblocking(on),
            Self::Cm(_) => Ok(()),
        }
    }

    /// Whether the peer's next message is there, without waiting (more than 1 ms): the
    /// server's run ends at the client's first sync. An error when the peer closed.
    pub(super) fn peer_spoke(&mut self) -> anyhow::Result<bool> {
        match self {
            Self::Tcp(t) => match t.peek(&mut [0u8; 1]) {
                Ok(0) => anyhow::bail!("the client closed the connection"),
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
                Err(e) => Err(e.into()),
            },
            Self::Cm(c) => c.peer_spoke(),
        }
    }

    /// Bounds the wait of each read and write (TCP; the control QP has its own timers).
    fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        if let Self::Tcp(s) = self {
            s.set_read_timeout(t)?;
            s.set_write_timeout(t)?;
        }
        Ok(())
    }
}

/// The RDMA CM connections of a `-R` run.
pub(super) struct CmConns {
    /// The control connection.
    control: CommId,
    /// The data connections, with the peer's QPN of each, in the order of our QPs.
    data: Vec<(CommId, Qpn)>,
    /// Client: data REQs sent again after a REJ "invalid service ID" (the server did not
    /// listen yet).
    pub(super) reqs_resent: u32,
}

/// How long a connecting client may take over each step of perftest's setup exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for a client whose setup exchange (versions, system data, MTU) succeeds, and returns
/// it with the MTU agreed. Call it once, as the server, before the key exchange. Connections
/// whose exchange fails (garbage, an old version, closed early, silent for
/// [`SETUP_TIMEOUT`]) are refused: dropped, counted in `cm_refused`, and the server listens
/// on, so a flood of bad connection attempts costs one connection's memory at a time.
fn accept_client(
    l: &TcpListener,
    mtu_code: u8,
    multipath: bool,
    cm: &mut CmStats,
) -> anyhow::Result<(Comm, u8)> {
    loop {
        let (stream, _) = l.accept().context("accepting the client")?;
        cm.cm_accepted += 1;
        stream.set_read_timeout(Some(SETUP_TIMEOUT))?;
        stream.set_write_timeout(Some(SETUP_TIMEOUT))?;
        let mut comm = Comm::new(stream, false);
        comm.offer_multipath(multipath);
        match comm.setup(4096, 64, mtu_code) {
            Ok(used) => {
                // The run itself may pause between syncs for as long as the client runs.
                comm.stream().set_read_timeout(None)?;
                comm.stream().set_write_timeout(None)?;
                return Ok((comm, used));
            }
            Err(e) => {
                cm.cm_refused += 1;
                log::info!("refused a connection: {e}");
            }
        }
    }
}

/// With `--multipath`, and the peer's version message saying its QPs allow the extension
/// too ([`Comm::offer_multipath`]): every QP of `local` (in INIT) starts with it on, its
/// first window in selective repeat (docs/multipath.md, "Hints out of band"). Call it after
/// the setup exchange, before the QPs are connected.
fn take_multipath_hint<D: RdmaDevice, L>(
    dev: &D,
    a: &PerfArgs,
    comm: &Comm<L>,
    local: &Local,
) -> anyhow::Result<()> {
    if a.multipath && comm.peer_multipath {
        for qp in &local.qps {
            dev.set_multipath_peer(qp.qpn)?;
        }
    }
    Ok(())
}

/// The MTU perftest's exchange agreed on (its enum, 1 for 256 .. 5 for 4096), or `asked`.
fn mtu_of(code: u8, asked: Mtu) -> Mtu {
    [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .get(usize::from(code.saturating_sub(1)))
    .copied()
    .unwrap_or(asked)
}

/// The connection to the peer, from the setup exchange to the closing sync.
pub(super) struct Session<'d> {
    /// The TCP connection (or RDMA CM control QP) perftest's exchange runs over.
    pub(super) comm: Comm<Channel<'d>>,
    /// With `-R`: the RDMA CM connections.
    pub(super) rdma_cm: Option<CmConns>,
    /// Connections accepted and refused while waiting for the client (server).
    pub(super) cm: CmStats,
    /// The MTU both sides agreed on.
    pub(super) mtu: Mtu,
    /// `out_reads` of our key messages.
    out_reads: u16,
    /// Our GID, in every key message.
    gid: [u8; 16],
}

impl<'d> Session<'d> {
    /// Connects to the server (client) or waits for a client (server), runs perftest's setup
    /// and key exchanges, and brings every QP of `local` to RTS with the peer's keys. With
    /// `-R` (`cm_dev` is then this process's device) all of it goes through RDMA CM. Call once,
    /// after [`Local::new`]; the peer's keys are left in each [`QpCtx::remote`].
    pub(super) fn connect<D: RdmaDevice>(
        dev: &D,
        cm_dev: Option<&'d Device>,
        a: &PerfArgs,
        plan: &Plan,
        local: &mut Local,
    ) -> anyhow::Result<Self> {
        // perftest's setup: versions, system data, MTU, then one key message per QP.
        let mut cm = CmStats::default();
        if a.rdma_cm {
            let cm_dev = cm_dev.context("-R needs the device of this process (not --engine)")?;
            return Self::connect_cm(cm_dev, dev, a, plan, local);
        }
        let (comm, used_mtu) = match &a.host {
            Some(h) => {
                let mut comm = Comm::new(
                    roce::cm::connect_tcp(h, a.port, Duration::from_secs(5))?,
                    plan.client,
                );
                comm.offer_multipath(a.multipath);
                let used = comm.setup(4096, 64, plan.mtu_code)?;
                (comm, used)
            }
            None => {
                let l = TcpListener::bind(("::", a.port))
                    .or_else(|_| TcpListener::bind(("0.0.0.0", a.port)))
                    .with_context(|| format!("couldn't listen on port {}", a.port))?;
                accept_client(&l, plan.mtu_code, a.multipath, &mut cm)?
            }
        };
        take_multipath_hint(dev, a, &comm, local)?;
        let mut session = Self::new(
            comm.map_link(Channel::Tcp),
            cm,
            mtu_of(used_mtu, plan.mtu),
            a,
            local,
        );
        session.bring_up(dev, a, local)?;
        Ok(session)
    }

    /// [`Session::connect`] with `-R`: the control connection, perftest's setup over it, a
    /// sync, the data connections through RDMA CM, a sync, then the key exchanges (the QPs are
    /// in RTS already).
    fn connect_cm<D: RdmaDevice>(
        cm_dev: &'d Device,
        dev: &D,
        a: &PerfArgs,
        plan: &Plan,
        local: &mut Local,
    ) -> anyhow::Result<Self> {
        let (mut comm, dest) = rdmacm::control(cm_dev, a, local.gid_idx, plan.mtu)?;
        let control = comm.link_mut().id;
        let mut comm = comm.map_link(Channel::Cm);
        comm.offer_multipath(a.multipath);
        let used_mtu = comm.setup(4096, 64, plan.mtu_code)?;
        take_multipath_hint(dev, a, &comm, local)?;
        let mtu = mtu_of(used_mtu, plan.mtu);
        let mut session = Self::new(comm, CmStats::default(), mtu, a, local);
        // create_rdma_cm_connection: a sync, the data connections, a sync.
        session.sync(&local.qps)?;
        let data = match dest {
            Some(dest) => {
                let qps: Vec<_> = local.qps.iter().map(|q| (q.qpn, q.psn)).collect();
                rdmacm::connect_data(cm_dev, a, (dest, local.gid_idx, mtu), &qps)?
            }
            None => {
                let qpns: Vec<_> = local.qps.iter().map(|q| q.qpn).collect();
                (
                    rdmacm::accept_data(cm_dev, a, (local.gid_idx, mtu), &qpns)?,
                    0,
                )
            }
        };
        let (data, reqs_resent) = data;
        session.rdma_cm = Some(CmConns {
            control,
            data,
            reqs_resent,
        });
        session.sync(&local.qps)?;
        session.bring_up(dev, a, local)?;
        Ok(session)
    }

    /// The session once the setup exchange is done.
    fn new(comm: Comm<Channel<'d>>, cm: CmStats, mtu: Mtu, a: &PerfArgs, local: &Local) -> Self {
        Self {
            comm,
            rdma_cm: None,
            cm,
            mtu,
            // perftest announces its device's limit for READ and atomics, 1 otherwise; its
            // requester uses the peer's value as max_rd_atomic.
            out_reads: if matches!(a.op, PerfOp::Read | PerfOp::Atomic) {
                u16::from(a.max_rd_atomic)
            } else {
                1
            },
            gid: local.gid.raw,
        }
    }

    /// Our key message for `qp`.
    fn key(&self, qp: &QpCtx) -> KeyMsg {
        KeyMsg {
            lid: 0,
            out_reads: self.out_reads,
            qpn: qp.qpn,
            psn: qp.psn,
            rkey: qp.mr.rkey,
            vaddr: qp.mr.iova,
            gid: self.gid,
            srqn: 0,
        }
    }

    /// A sync: perftest exchanges a key message (the first QP's) and ignores the answer.
    fn sync(&mut self, qps: &[QpCtx]) -> anyhow::Result<()> {
        self.comm.hand_shake(&self.key(&qps[0]))?;
        Ok(())
    }

    /// The key exchanges of perftest's setup, with the QPs connected (RTR, RTS) in between.
    fn bring_up<D: RdmaDevice>(
        &mut self,
        dev: &D,
        a: &PerfArgs,
        local: &mut Local,
    ) -> anyhow::Result<()> {
        let qps = &mut local.qps;
        // write_lat.c exchanges keys once more before the per-QP exchange.
        if a.lat && a.op == PerfOp::Write {
            self.sync(qps)?;
        }
        for qp in qps.iter_mut() {
            qp.remote = Some(self.comm.hand_shake(&self.key(qp))?);
        }
        if let Some(conns) = &self.rdma_cm {
            // The CM connected the QPs already; the keys tell only the buffers. Pair each of
            // our QPs with the key of the QP the CM connected it to (perftest's server numbers
            // its QPs in the order the REQs came).
            let keys: Vec<KeyMsg> = qps.iter().filter_map(|q| q.remote).collect();
            for (qp, &(_, peer)) in qps.iter_mut().zip(&conns.data) {
                if let Some(k) = keys.iter().find(|k| k.qpn == peer) {
                    qp.remote = Some(*k);
                }
            }
        }
        for qp in qps.iter().filter(|_| self.rdma_cm.is_none()) {
            let r = qp.remote.context("missing remote key")?;
            let attrs = RcAttrs {
                max_dest_rd_atomic: a.max_rd_atomic,
                // Never more READs/atomics in flight than the responder accepts.
                max_rd_atomic: u8::try_from(r.out_reads.clamp(1, u16::from(a.max_rd_atomic)))
                    .unwrap_or(1),
                retry_cnt: a.retry_cnt,
                timeout: a.qp_timeout,
                ..RcAttrs::PINGPONG
            };
            dev.connect_rc(
                qp.qpn,
                &RcTarget {
                    gid_index: local.gid_idx,
                    remote_gid: r.gid,
                    dest_qpn: r.qpn,
                    path_mtu: self.mtu,
                    rq_psn: r.psn,
                    sq_psn: qp.psn,
                    attrs,
                },
            )?;
        }
        // ib_send_bw (send_bw.c) syncs once right after connecting, then exchanges the keys
        // again; write_bw.c, read_bw.c and atomic_bw.c go straight to the second key exchange.
        if a.op == PerfOp::Send {
            self.sync(qps)?;
        }
        for qp in qps.iter() {
            self.comm.hand_shake(&self.key(qp))?;
        }
        // "An additional handshake is required after moving qp to RTR."
        self.sync(qps)
    }

    /// After the test, for WRITE, READ and atomics: a sync and the reports (the half-duplex
    /// branch of write_bw.c, read_bw.c, atomic_bw.c). ib_send_bw exchanges no report unless
    /// bidirectional: each side reports what it measured itself. Then ctx_close_connection: the
    /// closing sync and "done" (perftest 6.06). Returns the peer's report (the default when
    /// none was exchanged). Call once, after the run.
    pub(super) fn finish(
        &mut self,
        a: &PerfArgs,
        plan: &Plan,
        qps: &[QpCtx],
        result: &PerfResult,
    ) -> anyhow::Result<BwReport> {
        let mut theirs = BwReport::default();
        if a.op != PerfOp::Send && !a.lat {
            self.sync(qps)?;
            // perftest's report carries the iterations of all QPs (`print_report_bw`:
            // `num_of_calculated_iters *= num_of_qps`).
            let mine = BwReport {
                size: u64::from(plan.size),
                iters: result.msgs,
                bw_peak: result.mb_per_sec,
                bw_avg: result.mb_per_sec,
                msg_rate_avg: result.mpps,
            };
            theirs = self.comm.xchg_bw_reports(&mine)?;
        }
        // write_lat.c ends right after its loop, without ctx_close_connection.
        if !(a.lat && a.op == PerfOp::Write) {
            self.sync(qps)?;
            // "done" goes over the TCP socket only.
            if matches!(self.comm.link_mut(), Channel::Tcp(_)) {
                let _ = self
                    .comm
                    .link_mut()
                    .set_timeouts(Some(Duration::from_secs(1)));
                let mut done = [0u8; 5];
                let _ = self.comm.xchg(b"done\0", &mut done);
            }
        }
        Ok(theirs)
    }

    /// With `-R`: the liveness probes the peer acknowledged on the control connection so far
    /// (`rdmacm.rs`); `None` over TCP. For the report.
    pub(super) const fn probes(&self) -> Option<u64> {
        match self.comm.link() {
            Channel::Cm(c) => Some(c.probes),
            Channel::Tcp(_) => None,
        }
    }

    /// With `-R`, after [`Session::finish`]: the client disconnects the RDMA CM connections,
    /// the server waits for that (`rdmacm::disconnect`). Call once, before the device closes.
    pub(super) fn close(&self, cm_dev: Option<&Device>, client: bool) {
        if let (Some(c), Some(dev)) = (&self.rdma_cm, cm_dev) {
            let data: Vec<_> = c.data.iter().map(|d| d.0).collect();
            rdmacm::disconnect(dev, client, &data, c.control);
        }
    }
}
