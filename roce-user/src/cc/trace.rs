//! A trace of reaction-point state over time, as CSV: what `roce plot` draws.
//!
//! No I/O: rows are written into any [`core::fmt::Write`] and parsed from a `&str`; the caller
//! reads and writes files. The columns:
//!
//! ```text
//! time_ns,qpn,rate_bps,target_bps,alpha,cnps,bytes
//! ```
//!
//! `time_ns` is a [`Instant`] value, `qpn` the QP number in decimal, `alpha` a fraction in
//! [0, 1) (α/1024, printed exactly), `cnps` the CNPs the QP has received so far (handled and
//! ignored) and `bytes` the bytes it has sent so far.

use core::fmt;

use super::{Instant, ReactionPoint};
use crate::wire::Qpn;

/// The CSV header line (without the newline).
pub const CSV_HEADER: &str = "time_ns,qpn,rate_bps,target_bps,alpha,cnps,bytes";

/// One sample of one QP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    /// When.
    pub time: Instant,
    /// Which QP.
    pub qpn: Qpn,
    /// Current rate, bits/s.
    pub rate_bps: u64,
    /// Target rate, bits/s.
    pub target_bps: u64,
    /// α, a fraction.
    pub alpha: f64,
    /// CNPs received so far.
    pub cnps: u64,
    /// Bytes sent so far.
    pub bytes: u64,
}

impl TraceRow {
    /// A sample of `rp` at `now`.
    #[must_use]
    pub fn sample(now: Instant, qpn: Qpn, rp: &ReactionPoint) -> Self {
        Self {
            time: now,
            qpn,
            rate_bps: rp.rate_bps(),
            target_bps: rp.target_bps(),
            alpha: rp.alpha(),
            cnps: rp.cnps(),
            bytes: rp.bytes_sent(),
        }
    }
}

/// A line of a trace that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The first line is not [`CSV_HEADER`].
    #[error("not a roce cc trace: the header must be `{CSV_HEADER}`, found `{0}`")]
    Header(String),
    /// A row with the wrong number of fields or a field that is not a number.
    #[error("line {line}: {what}")]
    Row {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
}

/// A recorded trace: rows in the order they were recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The rows.
    pub rows: Vec<TraceRow>,
}

impl Trace {
    /// An empty trace.
    #[must_use]
    pub const fn new() -> Self {
        Self { rows: Vec::new() }
    }

    /// Appends a sample of `rp`.
    pub fn record(&mut self, now: Instant, qpn: Qpn, rp: &ReactionPoint) {
        self.rows.push(TraceRow::sample(now, qpn, rp));
    }

    /// Writes the header and every row.
    ///
    /// # Errors
    /// Whatever `out` fails with.
    pub fn write_csv(&self, out: &mut impl fmt::Write) -> fmt::Result {
        writeln!(out, "{CSV_HEADER}")?;
        for r in &self.rows {
            write_row(out, r)?;
        }
        Ok(())
    }

    /// The CSV text.
    #[must_use]
    pub fn to_csv(&self) -> String {
        let mut s = String::with_capacity(64 * (self.rows.len() + 1));
        // Writing into a String cannot fail.
        let _ = self.write_csv(&mut s);
        s
    }

    /// Parses CSV text written by [`Self::write_csv`] (blank lines are skipped).
    ///
    /// # Errors
    /// [`TraceError`] naming the first bad line.
    pub fn parse_csv(text: &str) -> Result<Self, TraceError> {
        let mut lines = text.lines().enumerate();
        let header = lines.next().map(|(_, l)| l.trim()).unwrap_or_default();
        if header != CSV_HEADER {
            return Err(TraceError::Header(header.to_owned()));
        }
        let mut rows = Vec::new();
        for (i, line) in lines {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            rows.push(parse_row(line).map_err(|what| TraceError::Row { line: i + 1, what })?);
        }
        Ok(Self { rows })
    }

    /// The distinct QPNs, in order of first appearance.
    #[must_use]
    pub fn qpns(&self) -> Vec<Qpn> {
        let mut out: Vec<Qpn> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.qpn) {
                out.push(r.qpn);
            }
        }
        out
    }
}

/// Writes one row (with its newline).
///
/// # Errors
/// Whatever `out` fails with.
pub fn write_row(out: &mut impl fmt::Write, r: &TraceRow) -> fmt::Result {
    writeln!(
        out,
        "{},{},{},{},{},{},{}",
        r.time.as_nanos(),
        r.qpn.value(),
        r.rate_bps,
        r.target_bps,
        r.alpha,
        r.cnps,
        r.bytes
    )
}

fn parse_row(line: &str) -> Result<TraceRow, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 7 {
        return Err(format!("expected 7 fields, found {}", f.len()));
    }
    let int = |i: usize, name: &str| {
        f[i].parse::<u64>()
            .map_err(|e| format!("{name} `{}`: {e}", f[i]))
    };
    let alpha: f64 = f[4].parse().map_err(|e| format!("alpha `{}`: {e}", f[4]))?;
    if !alpha.is_finite() {
        return Err(format!("alpha `{}` is not finite", f[4]));
    }
    let qpn = int(1, "qpn")?;
    Ok(TraceRow {
        time: Instant::from_nanos(int(0, "time_ns")?),
        qpn: Qpn::new(u32::try_from(qpn).map_err(|_| format!("qpn {qpn} too large"))?),
        rate_bps: int(2, "rate_bps")?,
        target_bps: int(3, "target_bps")?,
        alpha,
        cnps: int(5, "cnps")?,
        bytes: int(6, "bytes")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_and_errors() {
        let rows = vec![
            TraceRow {
                time: Instant::from_nanos(0),
                qpn: Qpn::new(17),
                rate_bps: 10_000_000_000,
                target_bps: 10_000_000_000,
                alpha: 1023.0 / 1024.0,
                cnps: 0,
                bytes: 0,
            },
            TraceRow {
                time: Instant::from_nanos(1500),
                qpn: Qpn::new(18),
                rate_bps: 5_002_441_406,
                target_bps: 10_000_000_000,
                alpha: 5.0 / 1024.0,
                cnps: 3,
                bytes: 4096,
            },
        ];
        let t = Trace { rows };
        let csv = t.to_csv();
        assert_eq!(
            csv,
            "time_ns,qpn,rate_bps,target_bps,alpha,cnps,bytes\n\
             0,17,10000000000,10000000000,0.9990234375,0,0\n\
             1500,18,5002441406,10000000000,0.0048828125,3,4096\n"
        );
        assert_eq!(Trace::parse_csv(&csv).unwrap(), t);
        assert_eq!(t.qpns(), vec![Qpn::new(17), Qpn::new(18)]);
        assert!(matches!(
            Trace::parse_csv("a,b\n"),
            Err(TraceError::Header(_))
        ));
        let e = Trace::parse_csv(&format!("{CSV_HEADER}\n1,2,3\n")).unwrap_err();
        assert_eq!(e.to_string(), "line 2: expected 7 fields, found 3");
        let e = Trace::parse_csv(&format!("{CSV_HEADER}\n\n1,2,x,4,0.5,0,0\n")).unwrap_err();
        assert!(e.to_string().starts_with("line 3: rate_bps `x`"), "{e}");
        assert!(Trace::parse_csv(&format!("{CSV_HEADER}\n1,2,3,4,NaN,0,0\n")).is_err());
    }
}
