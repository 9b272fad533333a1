//! `roce plot`: draws a congestion-control trace (CSV from `roce::cc::trace`) as an SVG: rate
//! and target rate of every QP over time with a mark at every CNP, and α below: the DCQCN
//! sawtooth. `roce plot --simulate` first runs the deterministic bottleneck simulator
//! (`roce::cc::sim`) so parameters can be tried without a network. `roce plot --paths` draws
//! the traffic of several paths over time instead, from samples of their byte counters (what
//! the multipath bench records at its first router, docs/multipath.md).

use std::{fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, bail};
use plotters::{
    coord::Shift,
    prelude::{
        BLACK, ChartBuilder, Circle, DrawingArea, IntoDrawingArea, LineSeries, Palette, Palette99,
        PathElement, RGBColor, SVGBackend, WHITE,
    },
    style::{Color as _, ShapeStyle},
};
use roce::cc::{
    DcqcnConfig, Trace, TraceRow,
    sim::{self, SimConfig},
};
use serde_json::json;

use super::Output;

/// Options of `roce plot`.
#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// The trace to draw (CSV: time_ns,qpn,rate_bps,target_bps,alpha,cnps,bytes). With
    /// --simulate, where to write the simulated trace (optional).
    #[arg(value_name = "FILE.csv")]
    pub input: Option<String>,
    /// The SVG to write.
    #[arg(short, long, value_name = "FILE.svg")]
    pub output: String,
    /// Draw only this QP (decimal or 0x hex).
    #[arg(short, long, value_parser = parse_u32)]
    pub qpn: Option<u32>,
    /// Title of the plot.
    #[arg(short, long)]
    pub title: Option<String>,
    /// Width and height in pixels.
    #[arg(long, num_args = 2, value_names = ["W", "H"], default_values_t = [1200, 800])]
    pub size: Vec<u32>,
    /// Draw only samples from this many milliseconds after the trace's start.
    #[arg(long, value_name = "MS")]
    pub from_ms: Option<f64>,
    /// Draw only samples up to this many milliseconds after the trace's start.
    #[arg(long, value_name = "MS")]
    pub to_ms: Option<f64>,
    /// Top of the rate axis in Gb/s (default: the largest value drawn), to zoom in on a
    /// sawtooth far below the line rate.
    #[arg(long, value_name = "GBPS")]
    pub y_max: Option<f64>,
    /// Run the bottleneck simulator and plot its trace instead of reading one.
    #[arg(long)]
    pub simulate: bool,
    /// Read FILE.csv as samples of paths' byte counters (CSV: time_ns,path,bytes; `path` a
    /// name, `bytes` a counter that only grows) and draw each path's rate over time.
    #[arg(long, conflicts_with_all = ["simulate", "qpn", "y_max"])]
    pub paths: bool,
    /// With --simulate: number of senders.
    #[arg(long, default_value_t = 1, requires = "simulate")]
    pub flows: u32,
    /// With --simulate: bottleneck rate in Gb/s (senders have 10 Gb/s links).
    #[arg(long, default_value_t = 4.0, requires = "simulate")]
    pub bottleneck_gbps: f64,
    /// With --simulate: simulated milliseconds.
    #[arg(long, default_value_t = 20, requires = "simulate")]
    pub ms: u64,
    /// With --simulate: a DCQCN parameter under its mlx5 name, e.g. `--set rpg_ai_rate=10`
    /// (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE", requires = "simulate")]
    pub set: Vec<String>,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

pub(crate) fn run(out: Output, args: &PlotArgs) -> anyhow::Result<()> {
    let &[w, h] = args.size.as_slice() else {
        bail!("--size takes a width and a height");
    };
    if !(200..=10_000).contains(&w) || !(200..=10_000).contains(&h) {
        bail!("--size {w} {h}: each must be between 200 and 10000 pixels");
    }
    if args.paths {
        return run_paths(out, args, (w, h));
    }
    let trace = if args.simulate {
        let cfg = sim_config(args)?;
        let r = sim::run(&cfg);
        if let Some(csv) = &args.input {
            fs::write(csv, r.trace.to_csv()).with_context(|| format!("writing {csv}"))?;
        }
        r.trace
    } else {
        let Some(input) = &args.input else {
            bail!("give a trace FILE.csv, or --simulate");
        };
        let text = fs::read_to_string(input).with_context(|| format!("reading {input}"))?;
        Trace::parse_csv(&text).with_context(|| format!("reading {input}"))?
    };
    let title = args.title.clone().unwrap_or_else(|| {
        if args.simulate {
            format!(
                "DCQCN, {} flow(s) into {} Gb/s (simulated)",
                args.flows, args.bottleneck_gbps
            )
        } else {
            let name = args.input.as_deref().map_or("trace", |p| {
                Path::new(p)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or(p)
            });
            format!("DCQCN rate: {name}")
        }
    });
    let view = View {
        qpn: args.qpn,
        from_ms: args.from_ms,
        to_ms: args.to_ms,
        y_max_gbps: args.y_max,
        origin_ns: None,
    };
    for (name, v) in [
        ("--from-ms", args.from_ms),
        ("--to-ms", args.to_ms),
        ("--y-max", args.y_max),
    ] {
        if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) || (name == "--y-max" && v == Some(0.0))
        {
            bail!("{name} takes a positive number");
        }
    }
    let view = View {
        origin_ns: trace.rows.iter().map(|r| r.time.as_nanos()).min(),
        ..view
    };
    let trace = view.window(&trace);
    let svg = render_svg(&trace, &title, (w, h), &view)?;
    fs::write(&args.output, &svg).with_context(|| format!("writing {}", args.output))?;
    let rows = trace
        .rows
        .iter()
        .filter(|r| args.qpn.is_none_or(|q| r.qpn.value() == q))
        .count();
    let qps = trace.qpns().len();
    let text = format!("{rows} samples of {qps} QP(s) drawn to {}\n", args.output);
    out.emit(
        &json!({ "output": args.output, "samples": rows, "qps": qps, "bytes": svg.len() }),
        &text,
    );
    Ok(())
}

fn sim_config(args: &PlotArgs) -> anyhow::Result<SimConfig> {
    let mut cfg = SimConfig::default();
    if !(args.flows >= 1 && args.flows <= 64) {
        bail!("--flows must be 1..=64");
    }
    if !(args.bottleneck_gbps > 0.0 && args.bottleneck_gbps <= 10.0) {
        bail!("--bottleneck-gbps must be in (0, 10]");
    }
    if !(1..=1000).contains(&args.ms) {
        bail!("--ms must be 1..=1000");
    }
    cfg.flows = args.flows;
    cfg.bottleneck_bps = (args.bottleneck_gbps * 1e9) as u64;
    cfg.duration = Duration::from_millis(args.ms);
    cfg.stagger = cfg.duration / (2 * args.flows);
    for s in &args.set {
        let Some((name, value)) = s.split_once('=') else {
            bail!(
                "--set {s}: expected NAME=VALUE, NAME one of {}",
                DcqcnConfig::NAMES.join(", ")
            );
        };
        let value: u64 = value
            .trim()
            .parse()
            .with_context(|| format!("--set {s}: the value is not a number"))?;
        cfg.dcqcn.set(name.trim(), value).with_context(|| {
            format!("--set {s} (parameters: {})", DcqcnConfig::NAMES.join(", "))
        })?;
    }
    Ok(cfg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// What part of a trace to draw, and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    /// Only this QP.
    pub qpn: Option<u32>,
    /// Only samples at least this long after the origin.
    pub from_ms: Option<f64>,
    /// Only samples at most this long after the origin.
    pub to_ms: Option<f64>,
    /// Top of the rate axis.
    pub y_max_gbps: Option<f64>,
    /// Time zero of the x axis (default: the first sample drawn).
    pub origin_ns: Option<u64>,
}

impl View {
    /// The rows between `from_ms` and `to_ms` after the trace's first sample.
    fn window(&self, t: &Trace) -> Trace {
        let t0 = self
            .origin_ns
            .or_else(|| t.rows.iter().map(|r| r.time.as_nanos()).min())
            .unwrap_or(0);
        let ms = |r: &TraceRow| r.time.as_nanos().saturating_sub(t0) as f64 / 1e6;
        Trace {
            rows: t
                .rows
                .iter()
                .filter(|r| self.from_ms.is_none_or(|f| ms(r) >= f))
                .filter(|r| self.to_ms.is_none_or(|e| ms(r) <= e))
                .copied()
                .collect(),
        }
    }
}

/// Throughput of one QP's samples (in time order) as (time ns, bits/s) points: the bytes sent
/// between samples at least `window_ns` apart, over the time between them, placed at the end of
/// each window. Counters that go backwards (a new QP with the same number) restart the window.
fn throughput(rows: &[&TraceRow], window_ns: u64) -> Vec<(u64, f64)> {
    let points: Vec<(u64, u64)> = rows.iter().map(|r| (r.time.as_nanos(), r.bytes)).collect();
    counter_rate(&points, window_ns)
}

/// The rate of a byte counter sampled at (time ns, bytes) points, in time order, as [`throughput`]
/// computes it for a QP.
fn counter_rate(points: &[(u64, u64)], window_ns: u64) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    let Some(&(mut t_from, mut b_from)) = points.first() else {
        return out;
    };
    for &(t, b) in points.iter().skip(1) {
        if b < b_from || t < t_from {
            (t_from, b_from) = (t, b);
            continue;
        }
        let dt = t - t_from;
        if dt >= window_ns.max(1) {
            out.push((t, (b - b_from) as f64 * 8.0 / (dt as f64 / 1e9)));
            (t_from, b_from) = (t, b);
        }
    }
    out
}

/// Samples of paths' byte counters: (path name, its (time ns, bytes) points in file order).
type PathSamples = Vec<(String, Vec<(u64, u64)>)>;

/// Parses `time_ns,path,bytes` lines (a header line starting with `time_ns` is skipped).
///
/// # Errors
/// A line that is not three fields, a time or byte count that is not a number, or no sample.
fn parse_paths_csv(text: &str) -> anyhow::Result<PathSamples> {
    let mut paths: PathSamples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (i == 0 && line.starts_with("time_ns")) {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let &[t, name, b] = f.as_slice() else {
            bail!("line {}: want time_ns,path,bytes, got {line:?}", i + 1);
        };
        let t: u64 = t
            .trim()
            .parse()
            .with_context(|| format!("line {}: time {t:?}", i + 1))?;
        let b: u64 = b
            .trim()
            .parse()
            .with_context(|| format!("line {}: bytes {b:?}", i + 1))?;
        let name = name.trim();
        match paths.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push((t, b)),
            None => paths.push((name.to_owned(), vec![(t, b)])),
        }
    }
    if paths.is_empty() {
        bail!("no samples");
    }
    Ok(paths)
}

/// `roce plot --paths`: reads the samples, draws them, says what it drew.
fn run_paths(out: Output, args: &PlotArgs, size: (u32, u32)) -> anyhow::Result<()> {
    let Some(input) = &args.input else {
        bail!("give the samples FILE.csv");
    };
    let text = fs::read_to_string(input).with_context(|| format!("reading {input}"))?;
    let paths = parse_paths_csv(&text).with_context(|| format!("reading {input}"))?;
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| format!("traffic per path: {input}"));
    let svg = render_paths_svg(&paths, &title, size, (args.from_ms, args.to_ms))?;
    fs::write(&args.output, &svg).with_context(|| format!("writing {}", args.output))?;
    let samples: usize = paths.iter().map(|(_, v)| v.len()).sum();
    out.emit(
        &json!({ "output": args.output, "samples": samples, "paths": paths.len(), "bytes": svg.len() }),
        &format!(
            "{samples} samples of {} path(s) drawn to {}\n",
            paths.len(),
            args.output
        ),
    );
    Ok(())
}

/// Renders each path's rate (Mb/s, over windows of 1/100 of the samples' span, at least one
/// sample gap) against time since the first sample, between `from_ms` and `to_ms` if given.
///
/// # Errors
/// Fewer than two samples of every path (no rate to draw), or a drawing failure.
fn render_paths_svg(
    paths: &PathSamples,
    title: &str,
    size: (u32, u32),
    (from_ms, to_ms): (Option<f64>, Option<f64>),
) -> anyhow::Result<String> {
    let all = paths.iter().flat_map(|(_, v)| v.iter().map(|p| p.0));
    let t0 = all.clone().min().unwrap_or(0);
    let t1 = all.max().unwrap_or(0);
    let window = (t1 - t0) / 100;
    let ms = |t: u64| (t - t0) as f64 / 1e6;
    let keep = |x: f64| from_ms.is_none_or(|f| x >= f) && to_ms.is_none_or(|t| x <= t);
    let rates: Vec<Vec<(f64, f64)>> = paths
        .iter()
        .map(|(_, v)| {
            counter_rate(v, window)
                .into_iter()
                .map(|(t, bps)| (ms(t), bps / 1e6))
                .filter(|p| keep(p.0))
                .collect()
        })
        .collect();
    if rates.iter().all(Vec::is_empty) {
        bail!("nothing to draw: no path has two samples in the window");
    }
    let x_min = from_ms.unwrap_or(0.0);
    let x_max = to_ms.unwrap_or_else(|| ms(t1)).max(x_min + 1e-3);
    let y_max = rates.iter().flatten().map(|p| p.1).fold(1e-9, f64::max) * 1.05;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(draw_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..x_max, 0f64..y_max)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("Mb/s")
            .draw()
            .map_err(draw_err)?;
        for (i, ((name, _), r)) in paths.iter().zip(&rates).enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(
                    r.iter().copied(),
                    ShapeStyle::from(&c).stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(format!("path {name}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

fn color(i: usize) -> RGBColor {
    let (r, g, b) = Palette99::COLORS[i % Palette99::COLORS.len()];
    RGBColor(r, g, b)
}

/// Renders `trace` (only QP `qpn` if given) as an SVG document.
///
/// # Errors
/// An empty trace (nothing to draw) or a drawing failure.
pub fn render_svg(
    trace: &Trace,
    title: &str,
    size: (u32, u32),
    view: &View,
) -> anyhow::Result<String> {
    let qpn = view.qpn;
    let rows: Vec<&TraceRow> = trace
        .rows
        .iter()
        .filter(|r| qpn.is_none_or(|q| r.qpn.value() == q))
        .collect();
    if rows.is_empty() {
        bail!(
            "nothing to draw: the trace has no samples{}",
            qpn.map_or(String::new(), |q| format!(" of QP {q}"))
        );
    }
    let qpns: Vec<u32> = {
        let mut v: Vec<u32> = Vec::new();
        for r in &rows {
            if !v.contains(&r.qpn.value()) {
                v.push(r.qpn.value());
            }
        }
        v
    };
    let first = rows.iter().map(|r| r.time.as_nanos()).min().unwrap_or(0);
    let t0 = view.origin_ns.unwrap_or(first).min(first);
    let t1 = rows.iter().map(|r| r.time.as_nanos()).max().unwrap_or(0);
    let ms = |t: u64| (t - t0) as f64 / 1e6;
    let x_min = ms(first);
    let x_max = ms(t1).max(x_min + 1e-3);
    // Throughput averaged over 1/100 of the run (at least one sample gap).
    let window = (t1 - first) / 100;
    let tput: Vec<Vec<(f64, f64)>> = qpns
        .iter()
        .map(|q| {
            let mine: Vec<&TraceRow> = rows
                .iter()
                .filter(|r| r.qpn.value() == *q)
                .copied()
                .collect();
            throughput(&mine, window)
                .into_iter()
                .map(|(t, bps)| (ms(t), bps / 1e9))
                .collect()
        })
        .collect();
    let y_max = rows
        .iter()
        .map(|r| r.rate_bps.max(r.target_bps) as f64 / 1e9)
        .chain(tput.iter().flatten().map(|p| p.1))
        .fold(1e-9, f64::max)
        * 1.05;
    let y_max = view.y_max_gbps.unwrap_or(y_max);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(draw_err)?;
        let (top, bottom): (Area<'_>, Area<'_>) = root.split_vertically(size.1 * 62 / 100);

        let mut rate = ChartBuilder::on(&top)
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..x_max, 0f64..y_max.max(1e-6))
            .map_err(draw_err)?;
        rate.configure_mesh()
            .x_desc("time (ms)")
            .y_desc("Gb/s")
            .draw()
            .map_err(draw_err)?;
        for (i, q) in qpns.iter().enumerate() {
            let mine: Vec<&&TraceRow> = rows.iter().filter(|r| r.qpn.value() == *q).collect();
            let c = color(i);
            rate.draw_series(LineSeries::new(
                mine.iter()
                    .map(|r| (ms(r.time.as_nanos()), r.rate_bps as f64 / 1e9)),
                ShapeStyle::from(&c).stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("QP {q} rate"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            let faded = c.mix(0.45);
            rate.draw_series(LineSeries::new(
                mine.iter()
                    .map(|r| (ms(r.time.as_nanos()), r.target_bps as f64 / 1e9)),
                faded.stroke_width(1),
            ))
            .map_err(draw_err)?
            .label(format!("QP {q} target"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], faded));
            if tput[i].len() > 1 {
                let dark = RGBColor(c.0 / 2, c.1 / 2, c.2 / 2);
                rate.draw_series(LineSeries::new(
                    tput[i].iter().copied(),
                    ShapeStyle::from(&dark).stroke_width(1),
                ))
                .map_err(draw_err)?
                .label(format!("QP {q} throughput (sent)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], dark));
            }
            // A mark where CNPs arrived since the previous sample.
            let marks: Vec<(f64, f64)> = mine
                .windows(2)
                .filter(|w| w[1].cnps > w[0].cnps)
                .map(|w| (ms(w[1].time.as_nanos()), w[1].rate_bps as f64 / 1e9))
                .collect();
            let n = marks.len();
            rate.draw_series(
                marks
                    .into_iter()
                    .map(|p| Circle::new(p, 3, BLACK.mix(0.7).filled())),
            )
            .map_err(draw_err)?
            .label(format!("QP {q} CNP ({n})"))
            .legend(|(x, y)| Circle::new((x + 10, y), 3, BLACK.mix(0.7).filled()));
        }
        rate.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;

        let mut alpha = ChartBuilder::on(&bottom)
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..x_max, 0f64..1.0f64)
            .map_err(draw_err)?;
        alpha
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("alpha")
            .draw()
            .map_err(draw_err)?;
        for (i, q) in qpns.iter().enumerate() {
            let c = color(i);
            alpha
                .draw_series(LineSeries::new(
                    rows.iter()
                        .filter(|r| r.qpn.value() == *q)
                        .map(|r| (ms(r.time.as_nanos()), r.alpha)),
                    c.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(format!("QP {q} alpha"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        }
        alpha
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    let _ = writeln!(svg, "<!-- roce plot: {} samples -->", rows.len());
    Ok(svg)
}

fn draw_err<E: std::error::Error + Send + Sync>(
    e: plotters::drawing::DrawingAreaErrorKind<E>,
) -> anyhow::Error {
    anyhow::anyhow!("drawing failed: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_the_simulated_sawtooth() {
        let r = sim::run(&SimConfig::default());
        let svg = render_svg(&r.trace, "test", (1000, 700), &View::default()).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.contains("</svg>"));
        // Rate, target and α lines, one CNP circle per sample with new CNPs, labels.
        assert!(svg.matches("<polyline").count() >= 3);
        let circles = svg.matches("<circle").count();
        assert!(circles > 10, "{circles} CNP marks");
        for text in ["time (ms)", "Gb/s", "alpha", "QP 17 rate", "QP 17 target"] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        // The rate polyline has a point per sample.
        assert!(svg.len() > 50_000, "{} bytes", svg.len());
    }

    #[test]
    fn throughput_is_bytes_over_each_window() {
        let q = roce::wire::Qpn::new(17);
        let row = |t_ms: u64, bytes: u64| TraceRow {
            time: roce::time::Instant::from_nanos(t_ms * 1_000_000),
            qpn: q,
            rate_bps: 0,
            target_bps: 0,
            alpha: 0.0,
            cnps: 0,
            bytes,
        };
        let rows = [
            row(0, 0),
            row(1, 1000),
            row(2, 2500),
            row(3, 100),
            row(5, 350),
        ];
        let refs: Vec<&TraceRow> = rows.iter().collect();
        // 2 ms windows: 2500 B in 2 ms = 10 Mb/s; the counter restarts at 3 ms; 250 B in 2 ms.
        assert_eq!(
            throughput(&refs, 2_000_000),
            [(2_000_000, 10_000_000.0), (5_000_000, 1_000_000.0)]
        );
        assert!(throughput(&refs[..1], 1).is_empty());
    }

    #[test]
    fn paths_are_parsed_and_drawn_one_line_each() {
        let mut csv = String::from("time_ns,path,bytes\n");
        for i in 0..50u64 {
            // Path p0 carries 1 MB per ms, p1 nothing after 20 ms.
            csv.push_str(&format!("{},p0,{}\n", i * 1_000_000, i * 1_000_000));
            csv.push_str(&format!("{},p1,{}\n", i * 1_000_000, i.min(20) * 500_000));
        }
        let paths = parse_paths_csv(&csv).unwrap();
        assert_eq!(paths.len(), 2);
        assert_eq!(paths[1].0, "p1");
        assert_eq!(paths[1].1[3], (3_000_000, 1_500_000));
        // 1 MB per ms is 8000 Mb/s; p1 drops to 0 after 20 ms.
        let r0 = counter_rate(&paths[0].1, 1_000_000);
        assert!(r0.iter().all(|p| (p.1 - 8e9).abs() < 1.0), "{r0:?}");
        let r1 = counter_rate(&paths[1].1, 1_000_000);
        assert_eq!(r1.last().map(|p| p.1), Some(0.0));
        let svg = render_paths_svg(&paths, "t", (800, 600), (None, None)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
        // A line per path and its legend sample: one path fewer draws two polylines fewer
        // (the mesh is drawn with polylines too).
        let one = render_paths_svg(&paths[..1].to_vec(), "t", (800, 600), (None, None)).unwrap();
        assert_eq!(
            svg.matches("<polyline").count(),
            one.matches("<polyline").count() + 2
        );
        for text in ["path p0", "path p1", "Mb/s", "time (ms)"] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        // A window with no sample pair draws nothing.
        let e = render_paths_svg(&paths, "t", (800, 600), (Some(500.0), None)).unwrap_err();
        assert!(e.to_string().contains("nothing to draw"), "{e}");
    }

    #[test]
    fn a_bad_paths_line_is_refused_with_its_number() {
        for (csv, want) in [
            ("time_ns,path,bytes\n1,p0,2\n2,p0\n", "line 3"),
            ("1,p0,x\n", "line 1: bytes"),
            ("-1,p0,2\n", "line 1: time"),
            ("time_ns,path,bytes\n", "no samples"),
        ] {
            let e = format!("{:#}", parse_paths_csv(csv).unwrap_err());
            assert!(e.contains(want), "{csv:?}: {e}");
        }
    }

    #[test]
    fn filters_by_qpn_and_refuses_empty() {
        let r = sim::run(&SimConfig {
            flows: 2,
            duration: Duration::from_millis(4),
            stagger: Duration::from_millis(1),
            ..SimConfig::default()
        });
        let both = render_svg(&r.trace, "t", (800, 600), &View::default()).unwrap();
        assert!(both.contains("QP 18 rate") && both.contains("QP 17 rate"));
        let one = render_svg(
            &r.trace,
            "t",
            (800, 600),
            &View {
                qpn: Some(18),
                ..View::default()
            },
        )
        .unwrap();
        assert!(one.contains("QP 18 rate") && !one.contains("QP 17 rate"));
        let e = render_svg(
            &r.trace,
            "t",
            (800, 600),
            &View {
                qpn: Some(99),
                ..View::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("no samples of QP 99"), "{e}");
        assert!(render_svg(&Trace::new(), "t", (800, 600), &View::default()).is_err());
    }
}
