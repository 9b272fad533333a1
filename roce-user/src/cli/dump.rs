//! `roce dump`: a packet capture of what the endpoint processes, for Wireshark and tshark.
//!
//! tcpdump sees none of roce-xdp's traffic on the endpoint's interface (received frames are
//! redirected at the XDP hook before any tap, AF_XDP transmits skip the taps). The endpoints'
//! engines copy the frames they receive, send and loop back into a per-process shared-memory
//! ring ([`roce::xsk::capture`]) while a dump runs; this command finds those rings under
//! `/run/roce/capture/<ifname>/`, takes the records out and writes pcapng (the pcap-file
//! crate): each frame with its direction (the `epb_flags` inbound/outbound bits), and a
//! comment naming its queue, its local QP and, for a frame the transport dropped, the counter
//! that counted the drop. Design: docs/capture.md.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};
use roce::{
    engine::capture::{capture_dir, live_dumps},
    loader::process_alive,
    xsk::capture::{CaptureRing, DIR_LOOPBACK, DIR_RX, DIR_TX, NO_QPN, RecordMeta, reason_name},
};
use serde_json::json;

use super::{Output, interrupted, on_signal_exit};

/// Options of `roce dump`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  roce dump -i eth0 -w rdma.pcapng          \
capture until Ctrl-C, open in Wireshark\n  roce dump -i eth0 -w - | tshark -r - -V    \
decode live with tshark (the ib dissector, UDP 4791)\n  roce dump -i eth0 --qp 17 --rx -c 10      \
print the first 10 frames received for QP 17\n\n\
The capture holds what the endpoints on IFACE process (roce perf, roce pingpong, programs on the \
drop-in libibverbs): frames received from the AF_XDP RX rings, sent into the TX rings, and looped \
back. A capture that falls behind loses capture records (counted in `lost`), never traffic.")]
pub struct DumpArgs {
    /// Interface whose endpoints to capture.
    #[arg(short, long)]
    pub iface: String,
    /// Write pcapng to FILE (`-` for standard output) instead of printing one line per frame.
    #[arg(short = 'w', long, value_name = "FILE")]
    pub write: Option<String>,
    /// Stop after COUNT frames (after filtering).
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<u64>,
    /// Only the frames of this local QP (received for it, or sent by it).
    #[arg(long, value_name = "QPN")]
    pub qp: Option<u32>,
    /// Only received frames.
    #[arg(long, conflicts_with = "tx")]
    pub rx: bool,
    /// Only transmitted frames.
    #[arg(long)]
    pub tx: bool,
}

/// Where frames go.
enum Sink {
    Pcap(PcapNgWriter<Box<dyn Write>>),
    Lines(Output),
}

/// What a dump saw.
#[derive(Debug, Default)]
struct Totals {
    frames: u64,
    rx: u64,
    tx: u64,
    dropped: u64,
    filtered: u64,
    lost: u64,
    rings: u64,
}

/// One endpoint's ring being drained.
struct Source {
    ring: CaptureRing,
    /// `lost` when this dump opened the ring (a ring left by an earlier dump may count some).
    lost_base: u64,
}

/// Removes the announcement when the dump ends.
struct Announcement(PathBuf);

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The PID of a ring file `<pid>-<n>.ring`.
fn ring_pid(name: &str) -> Option<u32> {
    name.strip_suffix(".ring")?.split('-').next()?.parse().ok()
}

/// Runs `roce dump`.
///
/// # Errors
/// No such interface, another dump already capturing it, the output cannot be written.
pub fn run(out: Output, args: &DumpArgs) -> anyhow::Result<()> {
    roce::netinfo::IfInfo::query(&args.iface)
        .with_context(|| format!("roce dump: interface {}", args.iface))?;
    let dir = capture_dir(&args.iface);
    let me = std::process::id();
    let announce = dir.join(format!("dump-{me}"));
    // An endpoint removes the folder when its last ring goes: try again if it just did.
    let mut tries = 0;
    loop {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        match std::fs::write(&announce, b"") {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("announcing the capture in {}", announce.display()));
            }
        }
    }
    let announcement = Announcement(announce.clone());
    if let Some(other) = live_dumps(&dir).into_iter().find(|p| *p != me) {
        bail!(
            "another roce dump (pid {other}) is capturing {}; one capture per interface at a time",
            args.iface
        );
    }
    // Rings of processes that are gone, left without a dump to drain them.
    for e in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = ring_pid(&name).or_else(|| ring_pid(&name.replace(".tmp", ".ring")));
        if pid.is_some_and(|p| !process_alive(p)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    on_signal_exit(move || {
        let _ = std::fs::remove_file(&announce);
    });

    let mut sink = match args.write.as_deref() {
        Some(path) => {
            let w: Box<dyn Write> = if path == "-" {
                Box::new(std::io::BufWriter::new(std::io::stdout()))
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path).with_context(|| format!("creating {path}"))?,
                ))
            };
            let mut w = PcapNgWriter::new(w).context("writing the pcapng header")?;
            w.write_pcapng_block(InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 0,
                options: vec![
                    InterfaceDescriptionOption::IfName(Cow::Borrowed(args.iface.as_str())),
                    InterfaceDescriptionOption::IfTsResol(9),
                ],
            })
            .context("writing the pcapng interface block")?;
            w.get_mut().flush()?;
            Sink::Pcap(w)
        }
        None => Sink::Lines(out),
    };

    let mut sources: BTreeMap<PathBuf, Source> = BTreeMap::new();
    let mut totals = Totals::default();
    let mut last_scan = None::<std::time::Instant>;
    let done = |t: &Totals| args.count.is_some_and(|c| t.frames >= c);
    loop {
        let stopping = interrupted();
        if last_scan.is_none_or(|t| t.elapsed() >= Duration::from_millis(50)) || stopping {
            last_scan = Some(std::time::Instant::now());
            scan(&dir, &mut sources);
        }
        let mut moved = 0;
        let mut finished = Vec::new();
        for (path, src) in &mut sources {
            // Read `closed` (and whether the owner lives) before draining: whatever it pushed
            // before closing is published by then, so this drain takes the last records.
            let gone = src.ring.closed() || !process_alive(src.ring.pid());
            moved += drain(src, args, &mut sink, &mut totals)?;
            if gone {
                finished.push(path.clone());
            }
            if done(&totals) {
                break;
            }
        }
        for path in finished {
            if let Some(src) = sources.remove(&path) {
                totals.lost += src.ring.lost().saturating_sub(src.lost_base);
                totals.rings += 1;
                let _ = std::fs::remove_file(&path);
            }
        }
        if let Sink::Pcap(w) = &mut sink
            && moved > 0
        {
            w.get_mut().flush()?;
        }
        if stopping || done(&totals) {
            break;
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for src in sources.values() {
        totals.lost += src.ring.lost().saturating_sub(src.lost_base);
        totals.rings += 1;
    }
    if let Sink::Pcap(w) = &mut sink {
        w.get_mut().flush()?;
    }
    drop(announcement);
    // The folder goes when nothing is left in it (an endpoint's ring may still be).
    let _ = std::fs::remove_dir(&dir);
    report(out, args, &totals);
    Ok(())
}

/// Opens the rings that appeared in `dir`.
fn scan(dir: &Path, sources: &mut BTreeMap<PathBuf, Source>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let path = e.path();
        if sources.contains_key(&path) || path.extension().is_none_or(|x| x != "ring") {
            continue;
        }
        match CaptureRing::open(&path) {
            Ok(ring) => {
                let lost_base = ring.lost();
                sources.insert(path, Source { ring, lost_base });
            }
            Err(e) => log::warn!("{}: {e}", path.display()),
        }
    }
}

/// Takes every record out of one ring into the sink; returns how many.
fn drain(
    src: &mut Source,
    args: &DumpArgs,
    sink: &mut Sink,
    totals: &mut Totals,
) -> anyhow::Result<usize> {
    let mut err = None;
    let n = src.ring.pop(|meta, frame| {
        if err.is_some() || args.count.is_some_and(|c| totals.frames >= c) {
            // Past -c: taken out of the ring, not written.
            return;
        }
        let rx = meta.dir & DIR_RX != 0;
        if (args.rx && !rx) || (args.tx && rx) || args.qp.is_some_and(|q| q != meta.qpn) {
            totals.filtered += 1;
            return;
        }
        totals.frames += 1;
        if rx {
            totals.rx += 1;
        } else {
            totals.tx += 1;
        }
        totals.dropped += u64::from(meta.reason != 0);
        if let Err(e) = write_frame(sink, meta, frame) {
            err = Some(e);
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    match n {
        Ok(n) => Ok(n),
        Err(e) => {
            log::warn!("{e}");
            Ok(0)
        }
    }
}

/// The comment a frame gets: queue, local QP, loopback, and the drop counter.
fn comment(meta: &RecordMeta) -> String {
    let mut c = format!("queue {}", meta.queue);
    if meta.qpn != NO_QPN {
        c.push_str(&format!(", QP {}", meta.qpn));
    }
    if meta.dir & DIR_LOOPBACK != 0 {
        c.push_str(", loopback");
    }
    if let Some(r) = reason_name(meta.reason) {
        c.push_str(&format!(", dropped by the transport: {r}"));
    }
    c
}

fn write_frame(sink: &mut Sink, meta: &RecordMeta, frame: &[u8]) -> anyhow::Result<()> {
    match sink {
        Sink::Pcap(w) => {
            // epb_flags bits 0-1: 01 inbound, 10 outbound (pcapng, Enhanced Packet Block).
            let flags = if meta.dir & DIR_TX != 0 { 2 } else { 1 };
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_nanos(meta.ts_ns),
                original_len: u32::try_from(frame.len()).unwrap_or(u32::MAX),
                data: Cow::Borrowed(frame),
                options: vec![
                    EnhancedPacketOption::Flags(flags),
                    EnhancedPacketOption::Comment(Cow::Owned(comment(meta))),
                ],
            })
            .context("writing a packet")?;
        }
        Sink::Lines(out) => {
            let parsed = roce::wire::parse_frame(frame).ok();
            let opcode = parsed
                .as_ref()
                .map(|f| f.roce.bth.opcode.name().unwrap_or("?").to_owned());
            let psn = parsed.as_ref().map(|f| f.roce.bth.psn.value());
            let dir = if meta.dir & DIR_TX != 0 { "tx" } else { "rx" };
            let drop = reason_name(meta.reason);
            if out.json {
                let v = json!({
                    "ts_ns": meta.ts_ns,
                    "dir": dir,
                    "loopback": meta.dir & DIR_LOOPBACK != 0,
                    "queue": meta.queue,
                    "qpn": (meta.qpn != NO_QPN).then_some(meta.qpn),
                    "len": frame.len(),
                    "opcode": opcode,
                    "psn": psn,
                    "drop": drop,
                });
                println!("{}", out.render(&v));
            } else {
                let secs = meta.ts_ns / 1_000_000_000;
                let micros = (meta.ts_ns % 1_000_000_000) / 1000;
                println!(
                    "{}.{micros:06} {dir} {} len {} {} psn {}",
                    secs,
                    comment(meta),
                    frame.len(),
                    opcode.as_deref().unwrap_or("(not RoCE)"),
                    psn.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                );
            }
            std::io::stdout().flush()?;
        }
    }
    Ok(())
}

/// The closing summary: on stdout as JSON with -j (unless the capture itself goes there), on
/// stderr otherwise, as tcpdump does.
fn report(out: Output, args: &DumpArgs, t: &Totals) {
    let v = json!({
        "iface": args.iface,
        "frames": t.frames,
        "rx": t.rx,
        "tx": t.tx,
        "dropped": t.dropped,
        "filtered": t.filtered,
        "lost": t.lost,
        "rings": t.rings,
    });
    let to_stdout = args.write.as_deref().is_some_and(|w| w != "-");
    if out.json && to_stdout {
        println!("{}", out.render(&v));
    } else {
        eprintln!(
            "{} frames captured ({} rx, {} tx, {} dropped by the transport), {} filtered out, {} capture records lost, {} endpoint ring(s)",
            t.frames, t.rx, t.tx, t.dropped, t.filtered, t.lost, t.rings
        );
    }
}
