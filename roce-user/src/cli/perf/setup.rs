//! This side's half of the setup, before the peer is contacted: the device, a PD and a CQ per
//! transport, and the QPs with their buffers filled and (for SEND) their receives posted.

use std::collections::HashMap;

use anyhow::Context as _;

use roce::{
    api::{
        Access, CqId, Device, DeviceOptions, MrInfo, PdId, QpCap, QpInit, QpType, Qpn, RdmaDevice,
        RecvWr, Sge, Wc,
    },
    cm::perftest::{KeyMsg, pattern},
    netinfo::Gid,
    wire::types::Psn,
};

use super::{CcMode, PerfArgs, PerfOp, Plan};

/// perftest's cycle buffer (the page size it announces in the system data). A perftest client
/// advances the remote address by the message size (rounded up to a cache line) within one
/// cycle buffer when the size is at most half of it (`increase_rem_addr`), so the buffer we
/// expose must cover `max(size, CYCLE_BUFFER)` bytes, as perftest's own does (`BUFF_SIZE`).
const CYCLE_BUFFER: u32 = 4096;

pub(super) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    u32::from_le_bytes(b)
}

/// One QP of the test.
pub(super) struct QpCtx {
    pub(super) qpn: Qpn,
    pub(super) mr: MrInfo,
    /// Local buffer for READ results and atomic return values (the MR is the exposed one).
    pub(super) local: MrInfo,
    pub(super) psn: Psn,
    pub(super) remote: Option<KeyMsg>,
    /// Whose pattern its buffers hold: its own index, or 0 for every QP with `--shared-mr`.
    pub(super) pattern: u32,
}

/// Up to `max` completions from each of `cqs` (one per transport of a sharded device), polled
/// into `buf` ([`RdmaDevice::poll_cq_into`]): `buf` grows to `max * cqs.len()` entries on the
/// first call and is reused after, so a run's polling allocates nothing. Returns the
/// completions polled.
pub(super) fn poll_cqs<'b, D: RdmaDevice>(
    dev: &D,
    cqs: &[CqId],
    max: usize,
    buf: &'b mut Vec<Wc>,
) -> anyhow::Result<&'b [Wc]> {
    let want = max * cqs.len();
    if buf.len() < want {
        buf.resize(want, Wc::default());
    }
    let mut n = 0;
    for cq in cqs {
        n += dev.poll_cq_into(*cq, &mut buf[n..n + max])?;
    }
    Ok(&buf[..n])
}

/// How long a poll that found nothing may wait for a completion on a device where polling is
/// a round trip ([`RdmaDevice::wait_cq_into`]: `--engine`); short, so that a loop's deadline,
/// progress and interrupt checks still run.
pub(super) const IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// [`poll_cqs`] for a loop with nothing else to do until a completion comes: with one CQ,
/// [`RdmaDevice::wait_cq_into`] up to [`IDLE_WAIT`] (the in-process device polls exactly as
/// [`poll_cqs`] does; `roce engine` waits instead of answering at once, one round trip in
/// place of a busy loop of them).
pub(super) fn wait_cqs<'b, D: RdmaDevice>(
    dev: &D,
    cqs: &[CqId],
    max: usize,
    buf: &'b mut Vec<Wc>,
) -> anyhow::Result<&'b [Wc]> {
    let [cq] = cqs else {
        return poll_cqs(dev, cqs, max, buf);
    };
    if buf.len() < max {
        buf.resize(max, Wc::default());
    }
    let n = dev.wait_cq_into(*cq, &mut buf[..max], IDLE_WAIT)?;
    Ok(&buf[..n])
}

/// Each QP's position in `qps`, to find a completion's QP in constant time (a run may have
/// 1024 QPs and a completion per message).
pub(super) fn qp_index(qps: &[QpCtx]) -> HashMap<Qpn, usize> {
    qps.iter().enumerate().map(|(i, q)| (q.qpn, i)).collect()
}

/// The device's congestion-control settings from `--cc`, `--cc-profile`, `--cc-set` and
/// `--line-rate`.
fn cc_config(a: &PerfArgs) -> anyhow::Result<roce::transport::CcConfig> {
    let algorithm = match a.cc {
        CcMode::On => roce::cc::CcAlgorithm::Dcqcn,
        CcMode::Off => roce::cc::CcAlgorithm::Off,
        CcMode::Swift => roce::cc::CcAlgorithm::Swift,
    };
    let mut c = roce::transport::CcConfig::choose(
        algorithm,
        &a.cc_profile,
        a.cc_set.iter().map(String::as_str),
    )
    .context("--cc-profile/--cc-set")?;
    c.line_rate_bps = a.line_rate;
    Ok(c)
}

/// Opens the device with the options the arguments ask for. Call first, once the arguments
/// are checked ([`Plan::new`]).
pub(super) fn open_device(
    a: &PerfArgs,
    plan: &Plan,
    netns: Option<String>,
) -> anyhow::Result<Device> {
    let mut opts = DeviceOptions {
        netns,
        inline: a.inline && plan.client,
        sharded: a.sharded,
        log_level: a.log_level.into(),
        ..DeviceOptions::default()
    };
    opts.transport.cc = cc_config(a)?;
    opts.transport.multipath = a.multipath;
    opts.transport.multipath_entropies = a.entropies;
    opts.transport.max_qp = a.max_qp;
    opts.transport.max_inflight_pkts = a.max_inflight;
    opts.transport.coalesce_acks = !a.no_ack_coalescing;
    opts.engine.rx_usecs = std::time::Duration::from_micros(u64::from(a.rx_usecs));
    opts.transport.max_mr = a.max_mr;
    opts.transport.max_qp_rd_atom = opts.transport.max_qp_rd_atom.max(a.max_rd_atomic);
    Ok(Device::open(&a.dev, &opts)?)
}

/// What this side has set up before the key exchange.
pub(super) struct Local {
    /// The GID index the QPs use.
    pub(super) gid_idx: usize,
    /// That GID, announced in every key message.
    pub(super) gid: Gid,
    /// One CQ per transport of a sharded device (QP k completes on `cqs[k % shards]`).
    pub(super) cqs: Vec<CqId>,
    /// The QPs in INIT, in the order their keys are exchanged.
    pub(super) qps: Vec<QpCtx>,
}

/// What the QPs may be asked to do by the peer: everything, as perftest's.
fn remote_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

impl Local {
    /// Allocates a PD and a CQ per transport and `--qp` QPs in INIT with their buffers, and
    /// posts the receives of a SEND server (or of either side of `--lat`). Call once, after
    /// [`open_device`], before the key exchange.
    pub(super) fn new<D: RdmaDevice>(dev: &D, a: &PerfArgs, plan: &Plan) -> anyhow::Result<Self> {
        let shards = dev.shards();
        let pds = (0..shards)
            .map(|q| dev.alloc_pd_on(q))
            .collect::<Result<Vec<_>, _>>()?;
        let gid_idx = a.gid_idx.unwrap_or_else(|| dev.default_gid_index(true));
        let gid = dev.gid(gid_idx)?;
        dev.check_path_mtu(a.mtu, gid.ip.is_ipv6())?;
        // One CQ per transport, deep enough for the QPs it holds (QP k on queue k mod shards):
        // each QP's send queue, and its receive queue where receives are posted (SEND, --lat).
        let per_shard = a.qps.div_ceil(shards) as usize;
        let receives = a.op == PerfOp::Send || a.lat;
        let per_qp = plan.depth as usize + if receives { plan.rx_depth as usize } else { 0 };
        let cqs = (0..shards)
            .map(|q| dev.create_cq_on(q, per_qp * per_shard + 16))
            .collect::<Result<Vec<_>, _>>()?;
        // With --shared-mr, one exposed and one local region per transport, filled as QP 0's.
        let shared = if a.shared_mr {
            pds.iter()
                .map(|&pd| register_buffers(dev, a, plan, 0, pd).map(Some))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            vec![None; pds.len()]
        };
        let mut qps = Vec::with_capacity(a.qps as usize);
        for q in 0..a.qps {
            let s = (q % shards) as usize;
            qps.push(create_qp(dev, a, plan, q, (pds[s], cqs[s]), shared[s])?);
        }
        if a.op == PerfOp::Send && (!plan.client || a.lat) {
            post_receives(dev, plan, &qps)?;
        }
        Ok(Self {
            gid_idx,
            gid,
            cqs,
            qps,
        })
    }
}

/// Registers the exposed and the local buffer of QP `q` (or, with `--shared-mr`, of every QP
/// of `pd`, with `q` 0) and fills them as the operation and side want them.
fn register_buffers<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    plan: &Plan,
    q: u32,
    pd: PdId,
) -> anyhow::Result<(MrInfo, MrInfo)> {
    let (client, size, span, depth) = (plan.client, plan.size, plan.span, plan.depth);
    let mr = dev.reg_mr(
        pd,
        (size.max(CYCLE_BUFFER) as usize).max(span),
        remote_access(),
    )?;
    // Atomics return each WR's original value into a slot of its own (`run_client`).
    let local_len = if a.op == PerfOp::Atomic {
        8 * depth as usize
    } else {
        (size as usize).max(span)
    };
    let local = dev.reg_mr(pd, local_len, Access::LOCAL_WRITE)?;
    let full = (size as usize).max(span);
    // The exposed buffer starts with the pattern (READ sources it, WRITE/SEND overwrite it
    // with the same pattern from the client's local buffer).
    if client || a.op == PerfOp::Read {
        dev.mr_write(mr.lkey, 0, &pattern(q, size as usize))?;
    }
    if a.op == PerfOp::Atomic {
        dev.mr_write(mr.lkey, 0, &0u64.to_le_bytes())?;
    }
    if a.lat {
        // ib_write_lat zeroes its buffers: the polled last byte starts at 0.
        dev.mr_write(mr.lkey, 0, &vec![0u8; size as usize])?;
        dev.mr_write(local.lkey, 0, &pattern(q, size as usize))?;
    } else if client {
        if a.op != PerfOp::Atomic {
            dev.mr_write(local.lkey, 0, &pattern(q, full))?;
        }
    } else {
        dev.mr_write(mr.lkey, 0, &vec![0u8; full])?;
        if a.op == PerfOp::Read {
            dev.mr_write(mr.lkey, 0, &pattern(q, full))?;
        }
    }
    Ok((mr, local))
}

/// Creates QP `q` on its transport's PD and CQ, with its own buffers
/// ([`register_buffers`]) or the `shared` ones, and moves it to INIT.
fn create_qp<D: RdmaDevice>(
    dev: &D,
    a: &PerfArgs,
    plan: &Plan,
    q: u32,
    (pd, cq): (PdId, CqId),
    shared: Option<(MrInfo, MrInfo)>,
) -> anyhow::Result<QpCtx> {
    let qpn = dev.create_qp(QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: plan.depth,
            max_recv_wr: plan.rx_depth,
            max_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
    })?;
    let ((mr, local), pattern) = match shared {
        Some(bufs) => (bufs, 0),
        None => (register_buffers(dev, a, plan, q, pd)?, q),
    };
    dev.qp_to_init(qpn, remote_access())?;
    Ok(QpCtx {
        qpn,
        mr,
        local,
        psn: Psn::new(random_u32()),
        remote: None,
        pattern,
    })
}

/// Posts `rx_depth` receives on every QP.
fn post_receives<D: RdmaDevice>(dev: &D, plan: &Plan, qps: &[QpCtx]) -> anyhow::Result<()> {
    let (size, span) = (plan.size, plan.span);
    for qp in qps {
        for slot in 0..plan.rx_depth {
            // With --span each receive has a slot of its own (wr_id = slot), checked and
            // reposted by run_server; without it they all share the first `size` bytes.
            let off = if span == 0 {
                0
            } else {
                u64::from(slot) * u64::from(size)
            };
            dev.post_recv(
                qp.qpn,
                RecvWr {
                    wr_id: u64::from(slot),
                    sg_list: vec![Sge {
                        addr: qp.mr.iova + off,
                        length: size,
                        lkey: qp.mr.lkey,
                    }],
                },
            )?;
        }
    }
    Ok(())
}
