//! `roce pingpong`: ibv_rc_pingpong's test, on the wire and on the command line. With no host it
//! is the server; with a host it is the client. The out-of-band exchange, the QP attributes, the
//! SEND/RECV ping-pong and the summary lines are ibv_rc_pingpong's (rdma-core
//! `libibverbs/examples/rc_pingpong.c`), so either side can be the real tool.
//!
//! With `--engine` it runs on the device of `roce engine` ([`RdmaDevice`], as `roce perf
//! --engine`), so its server and client can share one interface.
//!
//! With `-R` it connects through RDMA CM instead. ibv_rc_pingpong has no RDMA CM mode, so
//! `-R` speaks the protocol of rping (rdmacm-utils), RDMA CM's ping-pong tool: see [`rping`].

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Args;
use roce::{
    api::{
        Access, Device, DeviceOptions, Mtu, QpCap, QpInit, QpType, RcTarget, RdmaDevice, RecvWr,
        SendWr, Sge, Wc, WcStatus, remote::proto::RcAttrs,
    },
    cm::pingpong::{self, Dest},
    wire::types::Psn,
};
use serde_json::json;

use super::{Output, interrupted, progress::Progress};

mod rping;

/// Opens the device the ping-pong runs on, with the options both protocols share (inline
/// engine unless `--events`/`--threaded`, log level, multipath).
fn open_device(a: &PingpongArgs, netns: Option<String>) -> anyhow::Result<Device> {
    let mut opts = DeviceOptions {
        netns,
        inline: !a.events && !a.threaded,
        log_level: a.log_level.into(),
        ..DeviceOptions::default()
    };
    opts.transport.multipath = a.multipath;
    Ok(Device::open(&a.dev, &opts)?)
}

/// Flags of ibv_rc_pingpong.
#[derive(Debug, Args)]
pub struct PingpongArgs {
    /// Server to connect to; without it, wait for a client.
    pub host: Option<String>,
    /// Listen on / connect to TCP port PORT (default 18515); with -R, RDMA CM port PORT
    /// (default 7174, rping's).
    #[arg(short, long)]
    pub port: Option<u16>,
    /// Use interface DEV (ibv_rc_pingpong: IB device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: String,
    /// If this run loads roce_xdp itself, start it with its log records on at this level
    /// (read them with `roce log -i DEV`).
    #[arg(long, value_enum, default_value_t = crate::cli::log::LoadLevel::Off)]
    pub log_level: crate::cli::log::LoadLevel,
    /// Use port PORT of the device (roce-xdp devices have one port, 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Size of message to exchange (default 4096); with -R, rping's ping size (its -S: 26 to
    /// 65535, default 64), and at the server the largest ping it takes (default 65535).
    #[arg(short, long)]
    pub size: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096, at most what the link's MTU carries (1024 on a
    /// 1500-byte link). 4096 needs a jumbo link, where the AF_XDP sockets take multi-buffer
    /// packets (Linux 6.6+); a path MTU the device cannot carry is refused up front.
    #[arg(short, long, default_value_t = 1024)]
    pub mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Number of exchanges (with -R: pings, rping's -C; the -R server serves until its client
    /// disconnects, as `rping -s` does).
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
    /// Fill each message with a pattern and check every received one (with -R, rping's -V:
    /// the client checks every ping that comes back, the server that each ping it READs is
    /// rping's).
    #[arg(short = 'c', long)]
    pub chk: bool,
    /// Connect through RDMA CM and speak rping's protocol (rdma-core
    /// librdmacm/examples/rping.c) instead of ibv_rc_pingpong's: a server without a host
    /// takes `rping -c`, a client with one connects to `rping -s`. Each ping is an RDMA READ
    /// by the server of the client's buffer, then an RDMA WRITE of it back, announced by
    /// SENDs of rping's 16-byte buffer advertisements. -m and -r are not used: the path MTU
    /// is the largest the device and the CM's REQ allow, and one receive is posted at a time,
    /// as rping does. ibv_rc_pingpong has no RDMA CM mode, so this is roce-xdp's own flag.
    #[arg(short = 'R', long = "rdma-cm")]
    pub rdma_cm: bool,
    /// With -R, print each ping's data as rping's -v does (`ping data: ...` at the client,
    /// `server ping data: ...` at the server; not with --json).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Hand the AF_XDP queues to an engine thread each (as `roce perf` does) instead of
    /// driving them from this thread. Without it (and without -e), the polling loop runs to
    /// completion: each poll of the CQ is also a turn of the queues, so no thread wakes another
    /// per message (p50 ~2.5x lower on veth). With -e the engine threads are always used.
    /// roce-xdp's own flag, not ibv_rc_pingpong's.
    #[arg(long)]
    pub threaded: bool,
    /// Offer the multipath extension (docs/multipath.md): with a roce-xdp peer that offers it
    /// too, out-of-order placement and selective repeat; with any other peer, plain RoCE v2
    /// but for one reserved BTH bit. roce-xdp's own flag.
    #[arg(long)]
    pub multipath: bool,
    /// Use the device of `roce engine -i DEV`, started beforehand in this namespace, instead
    /// of opening the interface in this process: the server and the client (or any number of
    /// programs) then share the interface (docs/multiprocess.md). Every post and poll is a
    /// round trip on the engine's socket, far slower than the in-process default. The device
    /// options (--threaded, --multipath, --log-level) are the engine's and are refused here,
    /// and so is -R (the engine offers no RDMA CM to programs yet). roce-xdp's own flag.
    #[arg(long)]
    pub engine: bool,
    /// Progress on stderr (iterations done).
    #[command(flatten)]
    pub progress: super::progress::ProgressArgs,
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

/// The bytes of message `i` with `-c`. The first byte of every 4 KiB page is 0, which is what
/// ibv_rc_pingpong's server checks with its `-c` (`buf[i] = i / page_size % sizeof(char)`), so
/// a `roce pingpong -c` client passes that check while checking every byte of each echo itself.
fn pattern(i: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| {
            if j % 4096 == 0 {
                0
            } else {
                (j as u32).wrapping_mul(31).wrapping_add(i) as u8
            }
        })
        .collect()
}

/// With `--engine`, the arguments that set up a device of this process, which the engine's
/// device does not take from a program: refused, rather than silently ignored.
fn check_engine_args(a: &PingpongArgs) -> anyhow::Result<()> {
    if a.rdma_cm {
        bail!(super::engine::NO_CM_THROUGH_ENGINE);
    }
    super::engine::refuse_own_device_options(&[
        (a.threaded, "--threaded"),
        (a.multipath, "--multipath"),
        (
            a.log_level != crate::cli::log::LoadLevel::Off,
            "--log-level",
        ),
    ])
}

/// `roce pingpong`: checks the arguments, opens the device (in this process, or the engine's
/// with `--engine`) and runs ibv_rc_pingpong's test on it, or rping's with `-R`.
pub(crate) fn run(out: Output, a: &PingpongArgs, netns: Option<String>) -> anyhow::Result<()> {
    if a.engine {
        check_engine_args(a)?;
    }
    if a.rdma_cm {
        return rping::run(out, a, netns);
    }
    if a.verbose {
        bail!("-v (rping's ping data) needs -R");
    }
    if a.ib_port != 1 {
        bail!(
            "port {} does not exist: roce-xdp devices have one port, 1",
            a.ib_port
        );
    }
    let mtu = Mtu::from_bytes(a.mtu)
        .with_context(|| format!("invalid MTU {} (256, 512, 1024, 2048 or 4096)", a.mtu))?;
    if a.size == Some(0) || a.rx_depth == 0 || a.iters == 0 {
        bail!("--size, --rx-depth and --iters must be positive");
    }
    if a.engine {
        let dev = super::engine::connect_device(&a.dev)?;
        return run_on(out, a, mtu, &dev);
    }
    let dev = open_device(a, netns)?;
    let r = run_on(out, a, mtu, &dev);
    dev.close();
    r
}

/// ibv_rc_pingpong's test on an open device: QP setup, the out-of-band exchange, the
/// ping-pong, the summary.
fn run_on<D: RdmaDevice>(out: Output, a: &PingpongArgs, mtu: Mtu, dev: &D) -> anyhow::Result<()> {
    let (size_arg, port) = (
        a.size.unwrap_or(4096),
        a.port.unwrap_or(pingpong::DEFAULT_PORT),
    );
    let pd = dev.alloc_pd_on(0)?;
    let gid_idx = a.gid_idx.unwrap_or_else(|| dev.default_gid_index(true));
    let local_gid = dev.gid(gid_idx)?;
    dev.check_path_mtu(a.mtu, local_gid.ip.is_ipv6())?;
    let size = size_arg as usize;
    let mr = dev.reg_mr(pd, size, Access::LOCAL_WRITE)?;
    let cq = dev.create_cq_on(0, (a.rx_depth + 1) as usize)?;
    let qpn = dev.create_qp(QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: a.rx_depth,
            max_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
    })?;
    dev.qp_to_init(qpn, Access::empty())?;
    let sge = Sge {
        addr: mr.iova,
        length: size_arg,
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
        stream = roce::cm::connect_tcp(host, port, Duration::from_secs(5))?;
        pingpong::client_exchange(&mut stream, &mine, a.multipath)?
    } else {
        let l = TcpListener::bind(("::", port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
            .with_context(|| format!("couldn't listen on port {port}"))?;
        stream = l.accept().context("accepting the client")?.0;
        pingpong::server_read(&mut stream)?
    };
    let (remote, peer_multipath) = remote;
    if a.multipath && peer_multipath {
        // The peer's QP allows the extension too: ours starts with it on (docs/multipath.md,
        // "Hints out of band").
        dev.set_multipath_peer(qpn)?;
    }
    dev.connect_rc(
        qpn,
        &RcTarget {
            gid_index: gid_idx,
            remote_gid: remote.gid,
            dest_qpn: remote.qpn,
            path_mtu: mtu,
            rq_psn: remote.psn,
            sq_psn: mine.psn,
            attrs: RcAttrs::PINGPONG,
        },
    )?;
    if a.host.is_none() {
        pingpong::server_reply(&mut stream, &mine, a.multipath)?;
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
    let mut empty_polls = 0u32;
    let mut progress = Progress::new(&a.progress, out)?;
    // Completions are polled into this buffer (`ibv_poll_cq` into an array), allocated once.
    let mut wc_buf = [Wc::default(); 16];
    // Start of each iteration (each send the client posts), for round-trip percentiles.
    let mut iter_starts: Vec<Instant> = Vec::with_capacity(a.iters as usize + 1);
    iter_starts.push(Instant::now());
    while rcnt < a.iters || scnt < a.iters {
        if interrupted() {
            bail!("interrupted after {scnt} sends and {rcnt} receives");
        }
        if let Some(p) = super::progress::due(&mut progress) {
            let secs = p.secs();
            p.show(
                &format!(
                    "pingpong: {secs:.0} s, {rcnt} of {} messages received",
                    a.iters
                ),
                json!({ "secs": secs, "sent": scnt, "received": rcnt, "iters": a.iters }),
            );
        }
        let n = if a.events {
            dev.sleep_cq_into(cq, &mut wc_buf, Duration::from_millis(100))?
        } else {
            // In process a plain poll; through the engine, a poll that waits there up to
            // 1 ms when the CQ is empty rather than a busy loop of round trips.
            dev.wait_cq_into(cq, &mut wc_buf, Duration::from_millis(1))?
        };
        if n == 0 {
            // The clock is read once per 4096 empty polls: a read per poll was a tenth of the
            // polling loop's time.
            empty_polls = empty_polls.wrapping_add(1);
            if empty_polls.is_multiple_of(4096) && last_progress.elapsed() > Duration::from_secs(10)
            {
                bail!(
                    "no completion for 10 s after {scnt} sends and {rcnt} receives (QP state {:?})",
                    dev.qp_state(qpn)
                );
            }
            if !a.events {
                std::hint::spin_loop();
                // With engine threads, give them the CPU (two cores hold two processes' pollers
                // and engines; without the yield a poller keeps its core for a whole time
                // slice, ~4 ms, and the p99 shows it). Run to completion, the poller is the
                // engine: a sched_yield per empty poll only adds ~7 µs to the p50.
                if a.threaded {
                    std::thread::yield_now();
                }
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in &wc_buf[..n] {
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
                iter_starts.push(Instant::now());
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    iter_starts.push(Instant::now());
    drop(progress);
    let mut rtts: Vec<f64> = iter_starts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6)
        .collect();
    rtts.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        rtts.get(((rtts.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let bytes = u64::from(size_arg) * u64::from(a.iters) * 2;
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
        "latency_us": { "p50": pct(0.5), "p99": pct(0.99), "max": rtts.last().copied().unwrap_or(0.0) },
    });
    out.emit(&v, &text);
    drop(stream);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        pingpong: PingpongArgs,
    }

    fn engine_args(args: &str) -> anyhow::Result<()> {
        let cli = Cli::try_parse_from(std::iter::once("pingpong").chain(args.split_whitespace()))?;
        check_engine_args(&cli.pingpong)
    }

    #[test]
    fn engine_refuses_the_options_of_a_device_of_this_process_and_rdma_cm() {
        // ibv_rc_pingpong's own options, -e and -c included, go through the engine.
        engine_args("-d x --engine -s 1 -n 10 -r 8 -m 1024 -g 1 -c -e 10.0.0.1").unwrap();
        for (args, named) in [
            ("-d x --engine --threaded", "--threaded"),
            ("-d x --engine --multipath", "--multipath"),
            ("-d x --engine --log-level info", "--log-level"),
        ] {
            let e = engine_args(args).expect_err(args).to_string();
            assert!(e.contains(named) && e.contains("engine's"), "{args}: {e}");
        }
        let e = engine_args("-d x --engine -R").expect_err("-R").to_string();
        assert!(e.contains("RDMA CM") && e.contains("engine"), "{e}");
    }

    #[test]
    fn the_check_pattern_passes_ibv_rc_pingpongs_page_check() {
        for i in [0, 1, 255, 256, 1000] {
            let p = pattern(i, 3 * 4096 + 7);
            assert!(p.iter().step_by(4096).all(|b| *b == 0), "message {i}");
            // Messages differ from each other everywhere else.
            assert_ne!(p, pattern(i + 1, 3 * 4096 + 7));
        }
    }
}
