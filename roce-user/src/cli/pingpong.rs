//! `roce pingpong`: ibv_rc_pingpong's test, on the wire and on the command line. With no host it
//! is the server; with a host it is the client. The out-of-band exchange, the QP attributes, the
//! SEND/RECV ping-pong and the summary lines are ibv_rc_pingpong's (rdma-core
//! `libibverbs/examples/rc_pingpong.c`), so either side can be the real tool.

use std::{
    net::{TcpListener, TcpStream, ToSocketAddrs as _},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Args;
use roce::{
    api::{
        Access, AttrMask, Device, DeviceOptions, Mtu, QpAttr, QpCap, QpInit, QpState, QpType,
        RecvWr, SendWr, Sge, WcStatus,
    },
    cm::pingpong::{self, Dest},
    wire::types::Psn,
};
use serde_json::json;

use super::{Output, interrupted};

/// Flags of ibv_rc_pingpong.
#[derive(Debug, Args)]
pub struct PingpongArgs {
    /// Server to connect to; without it, wait for a client.
    pub host: Option<String>,
    /// Listen on / connect to TCP port PORT.
    #[arg(short, long, default_value_t = pingpong::DEFAULT_PORT)]
    pub port: u16,
    /// Use interface DEV (ibv_rc_pingpong: IB device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: String,
    /// Use port PORT of the device (roce-xdp devices have one port, 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Size of message to exchange.
    #[arg(short, long, default_value_t = 4096)]
    pub size: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short, long, default_value_t = 1024)]
    pub mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// Service level value (accepted for compatibility; RoCE v2 carries no SL).
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events instead of polling.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Local GID index (`roce gids -i DEV` lists them).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<usize>,
    /// Fill each message with a pattern and check every received one.
    #[arg(short = 'c', long)]
    pub chk: bool,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn fmt_dest(d: &Dest) -> String {
    format!(
        "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn.value(),
        d.psn.value(),
        std::net::Ipv6Addr::from(d.gid)
    )
}

fn random_psn() -> Psn {
    let mut b = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    Psn::new(u32::from_le_bytes(b))
}

fn connect(host: &str, port: u16) -> anyhow::Result<TcpStream> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for a in &addrs {
            if let Ok(s) = TcpStream::connect_timeout(a, Duration::from_secs(1)) {
                return Ok(s);
            }
        }
        if Instant::now() >= deadline {
            bail!("couldn't connect to {host}:{port}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pattern(i: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

pub(crate) fn run(out: Output, a: &PingpongArgs, netns: Option<String>) -> anyhow::Result<()> {
    if a.ib_port != 1 {
        bail!(
            "port {} does not exist: roce-xdp devices have one port, 1",
            a.ib_port
        );
    }
    let mtu = Mtu::from_bytes(a.mtu)
        .with_context(|| format!("invalid MTU {} (256, 512, 1024, 2048 or 4096)", a.mtu))?;
    if a.size == 0 || a.rx_depth == 0 || a.iters == 0 {
        bail!("--size, --rx-depth and --iters must be positive");
    }
    let dev = Device::open(
        &a.dev,
        &DeviceOptions {
            netns,
            ..DeviceOptions::default()
        },
    )?;
    let pd = dev.alloc_pd()?;
    let gid_idx = a
        .gid_idx
        .unwrap_or_else(|| dev.info().default_gid_index(true));
    let local_gid = dev.gid(gid_idx)?;
    dev.check_path_mtu(a.mtu, local_gid.ip.is_ipv6())?;
    let size = a.size as usize;
    let mr = dev.reg_mr(pd, size, Access::LOCAL_WRITE)?;
    let cq = dev.create_cq((a.rx_depth + 1) as usize)?;
    let qpn = dev.create_qp(QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: a.rx_depth,
            max_sge: 1,
        },
        sq_sig_all: true,
    })?;
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    dev.modify_qp(
        qpn,
        &init,
        AttrMask::STATE
            .with(AttrMask::PKEY_INDEX)
            .with(AttrMask::PORT)
            .with(AttrMask::ACCESS_FLAGS),
    )?;
    let sge = Sge {
        addr: mr.iova,
        length: a.size,
        lkey: mr.lkey,
    };
    for _ in 0..a.rx_depth {
        dev.post_recv(
            qpn,
            RecvWr {
                wr_id: RECV_WRID,
                sg_list: vec![sge],
            },
        )?;
    }
    let mine = Dest {
        lid: 0,
        qpn,
        psn: random_psn(),
        gid: local_gid.raw,
    };

    // Out-of-band exchange, then RTR/RTS exactly as rc_pingpong's pp_connect_ctx.
    let mut stream;
    let remote = if let Some(host) = &a.host {
        stream = connect(host, a.port)?;
        pingpong::client_exchange(&mut stream, &mine)?
    } else {
        let l = TcpListener::bind(("::", a.port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", a.port)))
            .with_context(|| format!("couldn't listen on port {}", a.port))?;
        stream = l.accept().context("accepting the client")?.0;
        pingpong::server_read(&mut stream)?
    };
    let path = dev.path_to(gid_idx, &remote.gid, qpn, remote.qpn)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: Some(path),
        ..QpAttr::default()
    };
    dev.modify_qp(
        qpn,
        &rtr,
        AttrMask::STATE
            .with(AttrMask::AV)
            .with(AttrMask::PATH_MTU)
            .with(AttrMask::DEST_QPN)
            .with(AttrMask::RQ_PSN)
            .with(AttrMask::MAX_DEST_RD_ATOMIC)
            .with(AttrMask::MIN_RNR_TIMER),
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: mine.psn,
        max_rd_atomic: 1,
        ..rtr
    };
    dev.modify_qp(
        qpn,
        &rts,
        AttrMask::STATE
            .with(AttrMask::TIMEOUT)
            .with(AttrMask::RETRY_CNT)
            .with(AttrMask::RNR_RETRY)
            .with(AttrMask::SQ_PSN)
            .with(AttrMask::MAX_QP_RD_ATOMIC),
    )?;
    if a.host.is_none() {
        pingpong::server_reply(&mut stream, &mine)?;
    }
    if !out.json {
        println!("  local address:  {}", fmt_dest(&mine));
        println!("  remote address: {}", fmt_dest(&remote));
    }

    // The ping-pong: rc_pingpong's main loop, with its `pending` bits.
    let start = Instant::now();
    let (mut scnt, mut rcnt, mut routs) = (0u32, 0u32, a.rx_depth);
    let mut bad = 0u32;
    let post_send = |i: u32| -> anyhow::Result<()> {
        if a.chk {
            dev.mr_write(mr.lkey, 0, &pattern(i, size))?;
        }
        dev.post_send(qpn, SendWr::send(SEND_WRID, vec![sge]))?;
        Ok(())
    };
    let mut pending = RECV_WRID;
    if a.host.is_some() {
        post_send(0)?;
        pending |= SEND_WRID;
    }
    let mut last_progress = Instant::now();
    while rcnt < a.iters || scnt < a.iters {
        if interrupted() {
            bail!("interrupted after {scnt} sends and {rcnt} receives");
        }
        let wcs = if a.events {
            dev.wait_cq(cq, Duration::from_millis(100))
                .into_iter()
                .collect()
        } else {
            dev.poll_cq(cq, 16)
        };
        if wcs.is_empty() {
            if last_progress.elapsed() > Duration::from_secs(10) {
                bail!(
                    "no completion for 10 s after {scnt} sends and {rcnt} receives (QP state {:?})",
                    dev.qp_state(qpn)
                );
            }
            if !a.events {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in wcs {
            if wc.status != WcStatus::Success {
                bail!(
                    "Failed status {:?} ({}) for wr_id {}",
                    wc.status,
                    wc.status as u32,
                    wc.wr_id
                );
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if a.chk {
                        let mut got = vec![0u8; size];
                        dev.mr_read(mr.lkey, 0, &mut got)?;
                        if got != pattern(rcnt, size) {
                            bad += 1;
                        }
                    }
                    routs -= 1;
                    if routs <= 1 {
                        for _ in routs..a.rx_depth {
                            dev.post_recv(
                                qpn,
                                RecvWr {
                                    wr_id: RECV_WRID,
                                    sg_list: vec![sge],
                                },
                            )?;
                        }
                        routs = a.rx_depth;
                    }
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {other}"),
            }
            pending &= !wc.wr_id;
            if scnt < a.iters && pending == 0 {
                // The server answers with the message it received; the client sends the next one.
                let next = if a.host.is_some() { scnt } else { rcnt - 1 };
                if a.chk && a.host.is_none() {
                    // Echo back exactly what arrived (it is already in the buffer).
                    dev.post_send(qpn, SendWr::send(SEND_WRID, vec![sge]))?;
                } else {
                    post_send(next)?;
                }
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = u64::from(a.size) * u64::from(a.iters) * 2;
    if bad > 0 {
        bail!(
            "{bad} of {} received messages did not match the pattern",
            a.iters
        );
    }
    let text = format!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec\n{} iters in {:.2} seconds = {:.2} usec/iter\n",
        usec / 1e6,
        bytes as f64 * 8.0 / usec,
        a.iters,
        usec / 1e6,
        usec / f64::from(a.iters)
    );
    let v = json!({
        "local": { "qpn": mine.qpn.value(), "psn": mine.psn.value(), "gid": local_gid.ip },
        "remote": { "qpn": remote.qpn.value(), "psn": remote.psn.value(), "gid": roce::cm::gid_to_ip(&remote.gid) },
        "bytes": bytes, "seconds": usec / 1e6, "mbit_per_sec": bytes as f64 * 8.0 / usec,
        "iters": a.iters, "usec_per_iter": usec / f64::from(a.iters), "checked": a.chk,
    });
    out.emit(&v, &text);
    drop(stream);
    dev.close();
    Ok(())
}
