//! `roce top`: a live view of every interface with roce_xdp in this namespace (or one), in the
//! spirit of top and bpftop: per interface and per QP the packet rates (per interface the byte
//! rates too), retransmissions, NAKs, RNR NAKs, CNPs, the DCQCN rate and α, and the XDP
//! program's drop reasons, refreshed every interval.
//!
//! The counters are read by [`super::xdp::snapshot`], as `roce stats -s` and the exporter read
//! them; the rates, rows and order come from [`roce::stats::top`] (pure, unit-tested). This file
//! only reads, draws (ratatui on crossterm) and takes keys.

use std::{
    collections::HashMap,
    io::IsTerminal as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use ratatui::{
    DefaultTerminal, Frame,
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Alignment, Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Cell, Paragraph, Row, Table},
};
use roce::{
    loader::{self, Pins},
    stats::{
        Snapshot,
        top::{self, IFACE_COLUMNS, QP_COLUMNS, SortKey, View},
    },
};

use super::{Output, interrupted};

/// Flags of `roce top`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
roce top                        every interface with roce_xdp in this namespace, live\n  \
roce top -i eth0 -d 0.5         one interface, refreshed twice a second\n  \
roce --netns nsA top --sort retrans\n                                  \
the interfaces of namespace nsA, QPs with the most retransmissions first\n  \
roce -j top --once              one JSON snapshot (rates over one interval), for scripts\n  \
roce top -n 5 | less            five refreshes as plain text\n\n\
Keys: q (or Esc, Ctrl-C) quits; < and > (or the arrow keys) move the sort column; 1-9 pick it \
(QPN, TX, RX, RETX, NAK, RNR, CNP rx, rate, alpha); r reverses the order.\n\n\
Columns: pkt/s and B/s are rates over the last interval. The interface's RX counts come from \
the XDP program (every frame it saw), its TX from the AF_XDP queues, its CNP rx are the CNPs the \
program saw arrive. RETX/s is completer_retry_err (retries the requester started), NAK/s the \
sequence-error and error NAKs sent and received, RNR/s the RNR NAKs sent and received, CNP rx/s \
and CNP tx/s the CNPs a QP acted on (or ignored) and sent. DCQCN rate and alpha are the QP's \
current congestion-control state (the rate is the line rate while not limited). A QP's rates \
are packets: the transport counts packets per QP, not bytes. The XDP drops line \
lists every drop reason that is not zero, with its total and rate. The same counters, in full: \
`roce stats -i IFACE -s`.\n\n\
When its output is not a terminal, or with -j, --once or -n, roce top prints each refresh \
(plain text, or one JSON object per line) instead of drawing.")]
pub struct TopArgs {
    /// Only this interface (default: every interface with roce_xdp in this namespace).
    #[arg(short, long)]
    pub iface: Option<String>,
    /// Seconds between two refreshes.
    #[arg(short = 'd', long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,
    /// Print N refreshes (text, or JSON lines with -j) and exit, instead of drawing.
    #[arg(short = 'n', long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Print one refresh and exit (as -n 1).
    #[arg(long, conflicts_with = "iterations")]
    pub once: bool,
    /// The column the QPs are sorted by.
    #[arg(short, long, value_enum, default_value_t = SortKey::Tx)]
    pub sort: SortKey,
    /// Smallest first.
    #[arg(long)]
    pub ascending: bool,
}

/// Reads every interface in scope once. An interface unloaded between the listing and the read
/// is left out; the error is returned only when `only` was asked for.
fn read_all(only: Option<&str>) -> anyhow::Result<Vec<Snapshot>> {
    let mut snaps = Vec::new();
    for ifname in super::xdp::attached_here(only)? {
        match super::xdp::snapshot(&Pins::new(&ifname), &ifname, false, true) {
            Ok(s) => snaps.push(s),
            Err(e) if only.is_some() => {
                return Err(e).with_context(|| format!("reading the counters of {ifname}"));
            }
            Err(_) => {}
        }
    }
    Ok(snaps)
}

/// The counters between refreshes: the last snapshot of every interface and when it was taken.
struct Sampler {
    only: Option<String>,
    prev: HashMap<String, Snapshot>,
    at: Instant,
}

impl Sampler {
    fn new(only: Option<String>) -> anyhow::Result<Self> {
        let first = read_all(only.as_deref())?;
        Ok(Self {
            only,
            prev: first.into_iter().map(|s| (s.ifname.clone(), s)).collect(),
            at: Instant::now(),
        })
    }

    /// Reads again and returns the view of what changed since the last call.
    fn refresh(&mut self, key: SortKey, descending: bool) -> anyhow::Result<View> {
        let now = read_all(self.only.as_deref())?;
        let t = Instant::now();
        let secs = t.duration_since(self.at).as_secs_f64();
        let pairs: Vec<_> = now.iter().map(|s| (s, self.prev.get(&s.ifname))).collect();
        let v = top::view(&pairs, secs, key, descending);
        self.prev = now.into_iter().map(|s| (s.ifname.clone(), s)).collect();
        self.at = t;
        Ok(v)
    }
}

/// Sleeps `d`, waking early when interrupted.
fn sleep_unless_interrupted(d: Duration) {
    let end = Instant::now() + d;
    while !interrupted() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// `roce top`.
///
/// # Errors
/// Not root, a bad interval, no interface with roce_xdp in this namespace (or not `-i`), the
/// maps cannot be read, or the terminal cannot be set up.
pub(crate) fn run(out: Output, a: &TopArgs) -> anyhow::Result<()> {
    if !(a.interval.is_finite() && a.interval >= 0.05) {
        bail!(
            "--interval takes a number of seconds, at least 0.05, not {}",
            a.interval
        );
    }
    loader::require_root()?;
    if let Some(i) = &a.iface {
        loader::check_ifname(i)?;
    }
    if super::xdp::attached_here(a.iface.as_deref())?.is_empty() {
        match &a.iface {
            Some(i) => bail!(
                "roce_xdp is not attached to {i} in this network namespace (see `roce status`; \
                 `roce load -i {i}` attaches it)"
            ),
            None => bail!(
                "roce_xdp is not attached to any interface in this network namespace, nothing \
                 to show (see `roce status`; `roce load -i IFACE` attaches it)"
            ),
        }
    }
    let interval = Duration::from_secs_f64(a.interval);
    let mut sampler = Sampler::new(a.iface.clone())?;
    let count = if a.once { Some(1) } else { a.iterations };
    if out.json || count.is_some() || !std::io::stdout().is_terminal() {
        let mut n = 0u64;
        while count.is_none_or(|c| n < c) {
            sleep_unless_interrupted(interval);
            if interrupted() {
                break;
            }
            let v = sampler.refresh(a.sort, !a.ascending)?;
            out.emit(&serde_json::to_value(&v)?, &top::to_text(&v));
            n += 1;
        }
        return Ok(());
    }
    let mut terminal = ratatui::try_init().context("setting up the terminal")?;
    let r = live(&mut terminal, &mut sampler, interval, a.sort, !a.ascending);
    ratatui::try_restore().context("restoring the terminal")?;
    r
}

/// The live view: draws, refreshes every `interval`, takes keys until q, Esc, Ctrl-C or a
/// signal.
fn live(
    terminal: &mut DefaultTerminal,
    sampler: &mut Sampler,
    interval: Duration,
    mut key: SortKey,
    mut descending: bool,
) -> anyhow::Result<()> {
    // The first frame comes at once, with the rates since the sampler started.
    let mut view = sampler.refresh(key, descending)?;
    let mut next = Instant::now() + interval;
    loop {
        terminal
            .draw(|f| draw(f, &view, interval))
            .context("drawing")?;
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        if event::poll(wait).context("reading the terminal")?
            && let Event::Key(k) = event::read().context("reading the terminal")?
            && k.kind != KeyEventKind::Release
        {
            match k.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                    return Ok(());
                }
                KeyCode::Char('>' | '.') | KeyCode::Right => key = key.next(),
                KeyCode::Char('<' | ',') | KeyCode::Left => key = key.prev(),
                KeyCode::Char('r') => descending = !descending,
                KeyCode::Char(c @ '1'..='9') => {
                    let i = c as usize - '1' as usize;
                    key = SortKey::ALL.get(i).copied().unwrap_or(key);
                }
                _ => {}
            }
            view.sort = key;
            view.descending = descending;
            top::sort(&mut view.qps, key, descending);
        }
        if interrupted() {
            return Ok(());
        }
        if Instant::now() >= next {
            view = sampler.refresh(key, descending)?;
            next += interval;
            if next < Instant::now() {
                next = Instant::now() + interval;
            }
        }
    }
}

/// A table row whose first `left` cells (names) are aligned left and the numbers right.
fn row(cells: &[String], left: usize) -> Row<'static> {
    Row::new(cells.iter().enumerate().map(|(i, c)| {
        let align = if i < left {
            Alignment::Left
        } else {
            Alignment::Right
        };
        Cell::from(Line::from(c.clone()).alignment(align))
    }))
}

fn widths(headers: &[&str], rows: &[Vec<String>]) -> Vec<Constraint> {
    headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let w = rows
                .iter()
                .filter_map(|r| r.get(i))
                .map(String::len)
                .chain([h.len() + 1])
                .max()
                .unwrap_or(8);
            Constraint::Length(u16::try_from(w).unwrap_or(u16::MAX))
        })
        .collect()
}

fn draw(f: &mut Frame, v: &View, interval: Duration) {
    let ifaces: Vec<Vec<String>> = v.interfaces.iter().map(top::iface_cells).collect();
    let qps: Vec<Vec<String>> = v.qps.iter().map(top::qp_cells).collect();
    let n_if = u16::try_from(v.interfaces.len()).unwrap_or(u16::MAX);
    let [head, if_area, drop_area, qp_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(n_if.saturating_add(3)),
        Constraint::Length(n_if.saturating_add(2)),
        Constraint::Min(3),
    ])
    .areas(f.area());
    let arrow = if v.descending { "▼" } else { "▲" };
    f.render_widget(
        Paragraph::new(Line::from(format!(
            "roce top - {} interface(s), {} QP(s), every {:.1} s, sorted by {} {arrow}   \
             q quit  < > sort  r reverse",
            v.interfaces.len(),
            v.qps.len(),
            interval.as_secs_f64(),
            v.sort.title(),
        ))),
        head,
    );
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let if_table = Table::new(
        ifaces.iter().map(|r| row(r, 1)),
        widths(&IFACE_COLUMNS, &ifaces),
    )
    .header(row(&IFACE_COLUMNS.map(str::to_owned), 1).style(bold))
    .block(Block::bordered().title(" Interfaces "));
    f.render_widget(if_table, if_area);
    let drops: Vec<Line> = v
        .interfaces
        .iter()
        .map(|i| Line::from(format!("{}: {}", i.ifname, top::drops_line(i))))
        .collect();
    f.render_widget(
        Paragraph::new(drops).block(Block::bordered().title(" XDP drops (total, rate) ")),
        drop_area,
    );
    let sorted = v.sort.column();
    let header: Vec<String> = QP_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, h)| {
            if i == sorted {
                format!("{h}{arrow}")
            } else {
                (*h).to_owned()
            }
        })
        .collect();
    let qp_table = Table::new(qps.iter().map(|r| row(r, 3)), widths(&QP_COLUMNS, &qps))
        .header(row(&header, 3).style(bold))
        .block(Block::bordered().title(" QPs "));
    f.render_widget(qp_table, qp_area);
}
