//! Progress of the commands that run for more than a few seconds (`roce perf`, `roce pingpong`),
//! on stderr, by one rule: on by default when both stdout and stderr are terminals and -j is
//! not given (one line redrawn in place, every second), off when either is piped or with -j;
//! `--progress SECS` forces it on (JSON lines with -j, plain lines when stderr is not a
//! terminal), `--no-progress` forces it off.

use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant},
};

use anyhow::bail;

use super::Output;

/// The progress flags every long-running command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ProgressArgs {
    /// Show progress on stderr every SECS seconds, even when the output is piped or with -j
    /// (then as JSON lines, `{"progress": {...}}`). Default: every second on a terminal, never
    /// when stdout or stderr is piped or with -j.
    #[arg(long, value_name = "SECS", conflicts_with = "no_progress")]
    pub progress: Option<f64>,
    /// Never show progress, even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// One line on a terminal, redrawn in place and erased at the end.
    Redraw,
    /// A line of text per report.
    Lines,
    /// A JSON object per line.
    Json,
}

/// Whether and how to show progress: the rule of this module, from the flags, -j, and whether
/// stdout and stderr are terminals.
///
/// # Errors
/// `--progress` with a number of seconds that is not positive.
pub(crate) fn plan(
    a: &ProgressArgs,
    json: bool,
    stdout_tty: bool,
    stderr_tty: bool,
) -> anyhow::Result<Option<(Duration, Style)>> {
    if a.no_progress {
        return Ok(None);
    }
    let style = if json {
        Style::Json
    } else if stderr_tty {
        Style::Redraw
    } else {
        Style::Lines
    };
    match a.progress {
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some((Duration::from_secs_f64(s), style))),
        Some(s) => bail!("--progress takes a positive number of seconds, not {s}"),
        None if !json && stdout_tty && stderr_tty => Ok(Some((Duration::from_secs(1), style))),
        None => Ok(None),
    }
}

/// A progress reporter: ask [`Progress::due`] in the loop, then [`Progress::show`].
pub(crate) struct Progress {
    every: Duration,
    style: Style,
    next: Instant,
    start: Instant,
    drawn: bool,
}

impl Progress {
    /// The reporter for these flags and this output, or `None` when progress is off.
    ///
    /// # Errors
    /// See [`plan`].
    pub(crate) fn new(a: &ProgressArgs, out: Output) -> anyhow::Result<Option<Self>> {
        let plan = plan(
            a,
            out.json,
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        )?;
        let now = Instant::now();
        Ok(plan.map(|(every, style)| Self {
            every,
            style,
            next: now + every,
            start: now,
            drawn: false,
        }))
    }

    /// Whether a report is due now (then the next one is one interval later).
    pub(crate) fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next += self.every;
        if self.next < now {
            self.next = now + self.every;
        }
        true
    }

    /// Seconds since the reporter was made.
    pub(crate) fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Shows one report: `text` for people, `json` (the value of `"progress"`) with -j.
    pub(crate) fn show(&mut self, text: &str, json: serde_json::Value) {
        let mut e = std::io::stderr().lock();
        let _ = match self.style {
            Style::Redraw => {
                self.drawn = true;
                write!(e, "\r\x1b[2K{text}")
            }
            Style::Lines => writeln!(e, "{text}"),
            Style::Json => writeln!(e, "{}", serde_json::json!({ "progress": json })),
        };
        let _ = e.flush();
    }

    /// Erases the redrawn line, before the command prints its result.
    pub(crate) fn clear(&mut self) {
        if self.drawn {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.drawn = false;
        }
    }
}

/// The reporter when one is on and a report is due: `if let Some(p) = progress::due(&mut p)`.
pub(crate) fn due(p: &mut Option<Progress>) -> Option<&mut Progress> {
    let p = p.as_mut()?;
    if p.due() { Some(p) } else { None }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(progress: Option<f64>, no_progress: bool) -> ProgressArgs {
        ProgressArgs {
            progress,
            no_progress,
        }
    }

    /// The rule: on by default only with both ends on a terminal and no -j; --progress forces
    /// it on in the style the output allows; --no-progress forces it off.
    #[test]
    fn the_rule() {
        let s1 = Duration::from_secs(1);
        let p = |a: &ProgressArgs, json, o, e| plan(a, json, o, e).unwrap();
        let none = args(None, false);
        assert_eq!(p(&none, false, true, true), Some((s1, Style::Redraw)));
        assert_eq!(p(&none, false, false, true), None, "stdout piped");
        assert_eq!(p(&none, false, true, false), None, "stderr piped");
        assert_eq!(p(&none, true, true, true), None, "-j");
        let forced = args(Some(2.0), false);
        let s2 = Duration::from_secs(2);
        assert_eq!(p(&forced, true, false, false), Some((s2, Style::Json)));
        assert_eq!(p(&forced, false, false, false), Some((s2, Style::Lines)));
        assert_eq!(p(&forced, false, true, true), Some((s2, Style::Redraw)));
        assert_eq!(p(&args(None, true), false, true, true), None);
        assert!(plan(&args(Some(0.0), false), false, true, true).is_err());
        assert!(plan(&args(Some(f64::NAN), false), false, true, true).is_err());
    }
}
