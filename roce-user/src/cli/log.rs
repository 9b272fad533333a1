//! `roce log`: streams the aya-log records of the roce_xdp (and roce_impair) program already
//! attached to an interface, as text or JSON lines. It switches the programs' `ROCE_LOG_LEVEL`
//! on while it runs and back off when it ends, Ctrl-C included.

use std::{
    io::Write as _,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use aya_log::EbpfLogger;
use roce::loader::{
    self,
    ebpf_log::{LevelMap, LogError, LogLevel, LogRecord, Program},
};
use tokio::io::{Interest, unix::AsyncFd};

use super::Output;

/// Level of the records `roce log` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StreamLevel {
    /// Malformed frames dropped, redirects that fell back to the kernel.
    Warn,
    /// Also foreign-QP drops and what roce_impair did to frames (dropped, corrupted, ...).
    Info,
    /// Also roce_impair's CE marks.
    Debug,
}

impl From<StreamLevel> for LogLevel {
    fn from(l: StreamLevel) -> Self {
        match l {
            StreamLevel::Warn => Self::Warn,
            StreamLevel::Info => Self::Info,
            StreamLevel::Debug => Self::Debug,
        }
    }
}

/// Level `roce load --log-level` starts roce_xdp with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LoadLevel {
    /// No records (the default).
    #[default]
    Off,
    /// Malformed frames dropped, redirects that fell back to the kernel.
    Warn,
    /// Also foreign-QP drops.
    Info,
    /// Everything.
    Debug,
}

impl From<LoadLevel> for LogLevel {
    fn from(l: LoadLevel) -> Self {
        match l {
            LoadLevel::Off => Self::Off,
            LoadLevel::Warn => Self::Warn,
            LoadLevel::Info => Self::Info,
            LoadLevel::Debug => Self::Debug,
        }
    }
}

/// The long help of `roce log`.
pub(crate) const LONG_ABOUT: &str = "Stream the log records of the roce_xdp program attached to an interface, and of \
roce_impair when `roce impair` has attached it there too. Each record is one rare event: a frame \
dropped (with the name of the counter it was counted under, e.g. drop_bad_tver), a redirect that \
fell back to the kernel because no AF_XDP socket serves the queue, or what roce_impair did to a \
frame; with the frame's IP addresses, UDP source port and the BTH's QPN, opcode and PSN.\n\n\
The programs log nothing by default. This command switches them on at --level while it runs \
(a map the programs read: no reload) and off again when it ends, also on Ctrl-C. Records are \
read from the programs' aya-log ring buffers; when records come faster than they are read, the \
ring buffer fills and further records are lost (the counters of `roce stats` never are).";

/// The examples under `roce log --help`.
pub(crate) const EXAMPLES: &str = "Examples:\n  roce log -i eth0                 drops, fallbacks, roce_impair's actions as text, until Ctrl-C\n  \
roce log -i eth0 --level warn    only malformed drops and fallbacks\n  \
roce -j log -i eth0 | jq .qpn    JSON lines: program, level, event, reason, src, dst, sport, qpn, opcode, psn\n  \
roce load -i eth0 --log-level warn   start logging at load time (read later with roce log)";

/// Arguments of `roce log`.
#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Interface the programs are attached to.
    #[arg(short, long)]
    pub iface: String,
    /// Most verbose level of the records to write.
    #[arg(short, long, value_enum, default_value_t = StreamLevel::Info)]
    pub level: StreamLevel,
}

/// Prints each record as it comes: text, or one JSON object per line.
#[derive(Clone, Copy)]
struct Sink {
    out: Output,
}

fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl log::Log for Sink {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args().to_string();
        let time = unix_time();
        let line = if self.out.json {
            let mut v = match LogRecord::parse(record.level(), &message) {
                Some(r) => serde_json::to_value(r).unwrap_or_default(),
                None => serde_json::json!({
                    "program": record.target(),
                    "level": record.level().as_str().to_ascii_lowercase(),
                    "message": message,
                }),
            };
            if let Some(o) = v.as_object_mut() {
                o.insert("time".into(), serde_json::json!(time));
            }
            self.out.render(&v)
        } else {
            let (program, text) = match LogRecord::parse(record.level(), &message) {
                Some(r) => (r.program.clone(), r.to_string()),
                None => (record.target().to_owned(), message),
            };
            format!("{time:.6} {:<5} {program}: {text}", record.level())
        };
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`roce log | head`) ends the stream at the next check.
        if writeln!(stdout, "{line}").is_err() {
            BROKEN_PIPE.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn flush(&self) {
        let _ = std::io::stdout().flush();
    }
}

static BROKEN_PIPE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Discards records: used once to empty a ring buffer of what an earlier session left behind.
struct Discard;

impl log::Log for Discard {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        false
    }
    fn log(&self, _: &log::Record<'_>) {}
    fn flush(&self) {}
}

/// Switches the log of every program of `iface` off (what the end of `roce log` and its signal
/// path both do; idempotent).
fn switch_off(iface: &str) {
    for p in Program::ALL {
        if let Ok(mut m) = LevelMap::open(p, iface) {
            let _ = m.set(LogLevel::Off);
        }
    }
}

type Reader = AsyncFd<EbpfLogger<Sink>>;

/// The next readiness of `fd`; never, when there is no such program.
async fn readable(
    fd: &mut Option<Reader>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, EbpfLogger<Sink>>> {
    match fd {
        Some(fd) => fd.readable_mut().await,
        None => std::future::pending().await,
    }
}

pub(crate) fn run(out: Output, args: &LogArgs) -> anyhow::Result<()> {
    loader::require_root()?;
    loader::check_ifname(&args.iface)?;
    let mut maps = Vec::new();
    for p in Program::ALL {
        match LevelMap::open(p, &args.iface) {
            Ok(m) => maps.push(m),
            Err(LogError::NotAttached { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if maps.is_empty() {
        bail!(
            "neither roce_xdp nor roce_impair is attached to {0}: run `roce load -i {0}` (or `roce impair -i {0} ...`) first",
            args.iface
        );
    }
    // Records an earlier session left in the ring buffers are not this session's.
    for m in &maps {
        m.logger(Discard)?.flush();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    // AsyncFd registers with the runtime it is created in.
    let _in_runtime = rt.enter();
    let sink = Sink { out };
    let mut readers = Vec::new();
    for m in &maps {
        let logger = m.logger(sink)?;
        // As aya-log's documentation drives its logger. tokio 1.54 deprecates this safe
        // constructor in favour of an `unsafe` one whose contract this use meets: the ring
        // buffer's fd is owned by the logger, which the AsyncFd owns, so it stays open and the
        // same for the AsyncFd's whole life. (`unsafe` is kept out of the CLI by check-layers.)
        #[expect(
            deprecated,
            reason = "see above: the fd is owned by the wrapped logger"
        )]
        let reader = AsyncFd::with_interest(logger, Interest::READABLE)
            .context("watching the log ring buffer")?;
        readers.push(Some(reader));
    }
    let iface = args.iface.clone();
    super::on_signal_exit(move || switch_off(&iface));
    let level = LogLevel::from(args.level);
    for m in &mut maps {
        m.set(level)?;
    }
    if !out.json {
        let names: Vec<_> = maps.iter().map(|m| m.program().name()).collect();
        eprintln!(
            "roce: logging {} on {} at {}; Ctrl-C to stop",
            names.join(" and "),
            args.iface,
            level.as_str()
        );
    }
    let result = rt.block_on(stream(&mut readers));
    for m in &mut maps {
        let _ = m.set(LogLevel::Off);
    }
    // What was written before the switch went off.
    for r in readers.iter_mut().flatten() {
        r.get_mut().flush();
    }
    result
}

/// Prints records as aya-log's readers become readable, until Ctrl-C (or a closed stdout).
async fn stream(readers: &mut [Option<Reader>]) -> anyhow::Result<()> {
    let (first, rest) = readers.split_at_mut(1);
    let a = &mut first[0];
    let mut none = None;
    let b = rest.first_mut().unwrap_or(&mut none);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tokio::select! {
            g = readable(a) => {
                let mut g = g.context("waiting for log records")?;
                g.get_inner_mut().flush();
                g.clear_ready();
            }
            g = readable(b) => {
                let mut g = g.context("waiting for log records")?;
                g.get_inner_mut().flush();
                g.clear_ready();
            }
            _ = tick.tick() => {
                if super::interrupted() || BROKEN_PIPE.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    }
}
