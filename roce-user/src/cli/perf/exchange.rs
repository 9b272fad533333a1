//! perftest's out-of-band exchange over TCP (see `roce::cm::perftest`), step for step as
//! perftest 6.06 does it, so that the peer can be ib_write_bw, ib_read_bw, ib_send_bw,
//! ib_atomic_bw, ib_write_lat or ib_send_lat: the setup (versions, system data, MTU), the key
//! exchanges that bring the QPs up, and after the run the reports and the closing sync.

use std::{net::TcpListener, time::Duration};

use anyhow::Context as _;
use roce::{
    api::{Mtu, RcTarget, RdmaDevice, remote::proto::RcAttrs},
    cm::perftest::{BwReport, Comm, KeyMsg},
};
use roce_common::counters::CmStats;

use super::{
    PerfArgs, PerfOp, Plan,
    report::PerfResult,
    setup::{Local, QpCtx},
};

/// How long a connecting client may take over each step of perftest's setup exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for a client whose setup exchange (versions, system data, MTU) succeeds, and returns
/// it with the MTU agreed. Call it once, as the server, before the key exchange. Connections
/// whose exchange fails (garbage, an old version, closed early, silent for
/// [`SETUP_TIMEOUT`]) are refused: dropped, counted in `cm_refused`, and the server listens
/// on, so a flood of bad connection attempts costs one connection's memory at a time.
fn accept_client(l: &TcpListener, mtu_code: u8, cm: &mut CmStats) -> anyhow::Result<(Comm, u8)> {
    loop {
        let (stream, _) = l.accept().context("accepting the client")?;
        cm.cm_accepted += 1;
        stream.set_read_timeout(Some(SETUP_TIMEOUT))?;
        stream.set_write_timeout(Some(SETUP_TIMEOUT))?;
        let mut comm = Comm::new(stream, false);
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

/// The connection to the peer, from the setup exchange to the closing sync.
pub(super) struct Session {
    /// The TCP connection perftest's exchange runs over.
    pub(super) comm: Comm,
    /// Connections accepted and refused while waiting for the client (server).
    pub(super) cm: CmStats,
    /// The MTU both sides agreed on.
    pub(super) mtu: Mtu,
    /// `out_reads` of our key messages.
    out_reads: u16,
    /// Our GID, in every key message.
    gid: [u8; 16],
}

impl Session {
    /// Connects to the server (client) or waits for a client (server), runs perftest's setup
    /// and key exchanges, and brings every QP of `local` to RTS with the peer's keys. Call once,
    /// after [`Local::new`]; the peer's keys are left in each [`QpCtx::remote`].
    pub(super) fn connect<D: RdmaDevice>(
        dev: &D,
        a: &PerfArgs,
        plan: &Plan,
        local: &mut Local,
    ) -> anyhow::Result<Self> {
        // perftest's setup: versions, system data, MTU, then one key message per QP.
        let mut cm = CmStats::default();
        let (comm, used_mtu) = match &a.host {
            Some(h) => {
                let mut comm = Comm::new(
                    roce::cm::connect_tcp(h, a.port, Duration::from_secs(5))?,
                    plan.client,
                );
                let used = comm.setup(4096, 64, plan.mtu_code)?;
                (comm, used)
            }
            None => {
                let l = TcpListener::bind(("::", a.port))
                    .or_else(|_| TcpListener::bind(("0.0.0.0", a.port)))
                    .with_context(|| format!("couldn't listen on port {}", a.port))?;
                accept_client(&l, plan.mtu_code, &mut cm)?
            }
        };
        let mtu = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .get(usize::from(used_mtu.saturating_sub(1)))
        .copied()
        .unwrap_or(plan.mtu);
        let mut session = Self {
            comm,
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
        };
        session.bring_up(dev, a, local)?;
        Ok(session)
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
        for qp in qps.iter() {
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
            let _ = self
                .comm
                .stream()
                .set_read_timeout(Some(Duration::from_secs(1)));
            let mut done = [0u8; 5];
            let _ = self.comm.xchg(b"done\0", &mut done);
        }
        Ok(theirs)
    }
}
