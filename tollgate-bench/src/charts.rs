//! SVG charts a reader takes in at a glance; the full matrix stays in the report's tables.
//!
//! - `decisions.svg`: per workload, ns per decision on one thread as bars (lower is better)
//!   for tollgate, its floor and the peers; tollgate's bar in its own colour, each bar labelled
//!   with its time and a ratio (tollgate against its floor, a peer against tollgate).
//! - `scaling.svg`: the same subjects' throughput by thread count, on the workloads where
//!   threads share one key and where each has its own keys.
//! - `latency.svg`: the distribution of single calls at the most threads, same subjects.
//!
//! Every chart's caption names the CPU and the commit it was measured on.

use std::io;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Cell, Report};

/// The quantiles of the latency chart, and their labels.
const QUANTILES: &[(f64, &str)] =
    &[(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"), (0.9999, "p99.99"), (1.0, "max")];

/// The subjects the charts draw, in this order (top to bottom, left to right): the floor,
/// tollgate, the peers. The other subjects (tollgate's variants and algorithms) are in the
/// tables.
const SHOWN: &[&str] = &["floor", "tollgate", "governor", "governor-ahash", "mutex"];

/// The workloads of the scaling chart: every thread on one key, and each on keys of its own.
const SCALING: &[&str] = &["1-key", "1K-keys"];

const FONT: &str = "sans-serif";

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Draws every chart the report has data for into `dir`; returns the files written.
pub fn draw(report: &Report, dir: &Path, workloads: &[(&str, &str)]) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    // One load per workload: the first present (allow-heavy where there is one).
    let panels: Vec<Panel<'_>> = workloads
        .iter()
        .filter_map(|(name, _)| {
            let cells: Vec<&Cell> =
                report.cells.iter().filter(|c| c.workload == *name && SHOWN.contains(&c.subject)).collect();
            let load = cells.first()?.load;
            Some(Panel {
                workload: name,
                load: load.name(),
                cells: cells.into_iter().filter(|c| c.load == load).collect(),
            })
        })
        .collect();
    if panels.is_empty() {
        return Ok(written);
    }
    let machine =
        format!("{} ({} cores) · commit {}", report.machine.cpu, report.machine.cores, report.machine.commit);
    let runs = if report.reps == 1 { "1 run".to_owned() } else { format!("{} runs", report.reps) };
    let caption = format!("{machine} · each bar the median of {runs} of {:.0} ms", report.duration_ms);
    let path = dir.join("decisions.svg");
    decisions(&path, &panels, &caption).map_err(err)?;
    written.push(path);
    if report.threads.len() > 1 {
        let scaled: Vec<&Panel<'_>> =
            SCALING.iter().filter_map(|w| panels.iter().find(|p| p.workload == *w)).collect();
        if !scaled.is_empty() {
            let path = dir.join("scaling.svg");
            scaling(&path, &scaled, &caption).map_err(err)?;
            written.push(path);
        }
    }
    let path = dir.join("latency.svg");
    let caption = format!("{machine} · every single call of {runs}, timed alone, less the timer's own cost");
    latency(&path, &panels, &caption).map_err(err)?;
    written.push(path);
    Ok(written)
}

/// One workload's cells under one load, of the shown subjects.
struct Panel<'a> {
    workload: &'a str,
    load: &'a str,
    cells: Vec<&'a Cell>,
}

impl Panel<'_> {
    /// The shown subjects present, in `SHOWN`'s order.
    fn subjects(&self) -> Vec<&'static str> {
        SHOWN.iter().copied().filter(|s| self.cells.iter().any(|c| c.subject == *s)).collect()
    }

    fn cell(&self, subject: &str, threads: usize) -> Option<&Cell> {
        self.cells.iter().copied().find(|c| c.subject == subject && c.threads == threads)
    }

    fn threads(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self.cells.iter().map(|c| c.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    }
}

/// tollgate's colour, set apart; the floor a light grey; the peers muted blues and a dark
/// grey, so that the eye finds tollgate first.
fn color_of(subject: &str) -> RGBColor {
    match subject {
        "tollgate" => RGBColor(230, 85, 13),
        "floor" => RGBColor(189, 189, 189),
        "governor" => RGBColor(107, 142, 183),
        "governor-ahash" => RGBColor(158, 185, 214),
        "mutex" => RGBColor(99, 99, 99),
        _ => RGBColor(150, 150, 150),
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// The figure's title on top, the subjects' colours under it (when given), and its caption
/// (machine, commit, what a mark is) at the bottom; returns the area between them.
fn frame<'a>(
    root: &DrawingArea<SVGBackend<'a>, Shift>,
    title: &str,
    legend: &[&str],
    caption: &str,
) -> Result<DrawingArea<SVGBackend<'a>, Shift>, Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let (_, h) = root.dim_in_pixel();
    let head = if legend.is_empty() { HEAD } else { HEAD + 24 };
    let (top, rest) = root.split_vertically(head);
    let (body, bottom) = rest.split_vertically(h - head - FOOT);
    let left = |font: FontDesc<'static>| TextStyle::from(font).pos(Pos::new(HPos::Left, VPos::Center));
    top.draw(&Text::new(title.to_owned(), (12, 18), left((FONT, 18).into_font().style(FontStyle::Bold))))?;
    let mut x = 12;
    for subject in legend {
        let colour = color_of(subject);
        top.draw(&Rectangle::new([(x, 38), (x + 14, 50)], colour.filled()))?;
        let style = if *subject == "tollgate" {
            (FONT, 13).into_font().style(FontStyle::Bold)
        } else {
            (FONT, 13).into_font()
        };
        top.draw(&Text::new((*subject).to_owned(), (x + 19, 44), left(style)))?;
        // About 7 px a character at 13 px.
        x += 19 + 7 * i32::try_from(subject.len()).unwrap_or(20) + 22;
    }
    bottom.draw(&Text::new(
        caption.to_owned(),
        (12, 13),
        left((FONT, 12).into_font()).color(&RGBColor(90, 90, 90)),
    ))?;
    Ok(body)
}

/// The title band's height, and the caption's.
const HEAD: u32 = 36;
const FOOT: u32 = 26;

/// Nanoseconds on a latency axis: ns, µs or ms.
fn duration_label(ns: f64) -> String {
    match ns {
        x if x >= 1e6 => format!("{:.0} ms", x / 1e6),
        x if x >= 1e3 => format!("{:.0} µs", x / 1e3),
        x => format!("{x:.0} ns"),
    }
}

fn grid(n: usize, most_cols: usize) -> (usize, usize) {
    let cols = n.min(most_cols).max(1);
    (n.div_ceil(cols), cols)
}

/// ns per decision on one thread, per workload: horizontal bars, labelled.
fn decisions(path: &Path, panels: &[Panel<'_>], caption: &str) -> DrawResult {
    let (rows, cols) = grid(panels.len(), 2);
    let root =
        SVGBackend::new(path, (560 * cols as u32, HEAD + 200 * rows as u32 + FOOT)).into_drawing_area();
    let body = frame(&root, "ns per decision, one thread: shorter is faster", &[], caption)?;
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(panels) {
        let subjects = panel.subjects();
        let ns = |s: &str| panel.cell(s, 1).map(|c| c.ns.median);
        let bars: Vec<(&str, f64)> = subjects.iter().filter_map(|s| Some((*s, ns(s)?))).collect();
        if bars.is_empty() {
            continue;
        }
        let n = bars.len();
        let top = bars.iter().map(|b| b.1).fold(0.0, f64::max);
        let names: Vec<&str> = bars.iter().map(|b| b.0).collect();
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} ({})", panel.workload, panel.load), (FONT, 15))
            .margin(8)
            .margin_right(16)
            .x_label_area_size(22)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..top * 1.85, -0.6f64..(n as f64 - 0.4))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(235, 235, 235))
            .y_labels(n)
            .y_label_style((FONT, 13))
            .y_label_formatter(&|y| {
                let i = y.round();
                // Row 0 at the top.
                if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                    names[n - 1 - i as usize].to_owned()
                } else {
                    String::new()
                }
            })
            .x_labels(5)
            .x_label_formatter(&|x| format!("{x:.0} ns"))
            .draw()?;
        let tollgate = ns("tollgate");
        let floor = ns("floor");
        for (i, (subject, v)) in bars.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            let colour = color_of(subject);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.36), (*v, y + 0.36)],
                colour.filled(),
            )))?;
            let ratio = match (*subject, tollgate, floor) {
                ("tollgate", _, Some(f)) => format!(" · {:.2}× the floor", v / f),
                ("floor", ..) => String::new(),
                (_, Some(t), _) if *subject != "tollgate" => format!(" · {:.2}× tollgate's time", v / t),
                _ => String::new(),
            };
            let bold = *subject == "tollgate";
            let font =
                if bold { (FONT, 13).into_font().style(FontStyle::Bold) } else { (FONT, 13).into_font() };
            chart.draw_series(std::iter::once(Text::new(
                format!(" {v:.1} ns{ratio}"),
                (*v, y),
                TextStyle::from(font).pos(Pos::new(HPos::Left, VPos::Center)),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

/// Million decisions per second by thread count: grouped vertical bars, labelled.
fn scaling(path: &Path, panels: &[&Panel<'_>], caption: &str) -> DrawResult {
    let (rows, cols) = grid(panels.len(), 2);
    let legend: Vec<&str> =
        SHOWN.iter().copied().filter(|s| panels.iter().any(|p| p.subjects().contains(s))).collect();
    let root =
        SVGBackend::new(path, (520 * cols as u32, HEAD + 24 + 280 * rows as u32 + FOOT)).into_drawing_area();
    let body = frame(&root, "M decisions/s, all threads together: taller is faster", &legend, caption)?;
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(panels) {
        let subjects = panel.subjects();
        let threads = panel.threads();
        let top = panel.cells.iter().map(|c| c.mops.median).fold(0.0, f64::max);
        let m = subjects.len() as f64;
        let width = 0.8 / m;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} ({})", panel.workload, panel.load), (FONT, 15))
            .margin(8)
            .x_label_area_size(26)
            .y_label_area_size(44)
            .build_cartesian_2d(-0.5f64..(threads.len() as f64 - 0.5), 0f64..top.max(1.0) * 1.2)?;
        let labels: Vec<String> =
            threads.iter().map(|t| format!("{t} thread{}", if *t == 1 { "" } else { "s" })).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(235, 235, 235))
            .x_labels(threads.len())
            .x_label_style((FONT, 13))
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (j, subject) in subjects.iter().enumerate() {
            let colour = color_of(subject);
            let bars: Vec<(f64, f64)> = threads
                .iter()
                .enumerate()
                .filter_map(|(g, t)| {
                    let x = g as f64 + (j as f64 - (m - 1.0) / 2.0) * width;
                    Some((x, panel.cell(subject, *t)?.mops.median))
                })
                .collect();
            chart.draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new([(x - width * 0.45, 0.0), (x + width * 0.45, v)], colour.filled())
            }))?;
            chart.draw_series(bars.iter().map(|&(x, v)| {
                Text::new(
                    format!("{v:.0}"),
                    (x, v),
                    TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom)),
                )
            }))?;
        }
    }
    root.present()?;
    Ok(())
}

/// Single calls' latency quantiles at the most threads, one line per subject.
fn latency(path: &Path, panels: &[Panel<'_>], caption: &str) -> DrawResult {
    let (rows, cols) = grid(panels.len(), 3);
    let legend: Vec<&str> =
        SHOWN.iter().copied().filter(|s| panels.iter().any(|p| p.subjects().contains(s))).collect();
    let root =
        SVGBackend::new(path, (460 * cols as u32, HEAD + 24 + 300 * rows as u32 + FOOT)).into_drawing_area();
    let body =
        frame(&root, "time per decision by quantile, single calls: lower is faster", &legend, caption)?;
    let last = (QUANTILES.len() - 1) as f64;
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(panels) {
        let max_t = panel.threads().last().copied().unwrap_or(1);
        let cells: Vec<&Cell> = panel.cells.iter().copied().filter(|c| c.threads == max_t).collect();
        let curve = |c: &Cell| -> Vec<(f64, f64)> {
            QUANTILES
                .iter()
                .enumerate()
                .map(|(i, &(q, _))| (i as f64, (c.calls.value_at_quantile(q) as f64 / 1000.0).max(1.0)))
                .collect()
        };
        let lo = cells.iter().flat_map(|c| curve(c)).map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = cells.iter().flat_map(|c| curve(c)).map(|p| p.1).fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} ({}, {max_t} thread{})",
                    panel.workload,
                    panel.load,
                    if max_t == 1 { "" } else { "s" }
                ),
                (FONT, 15),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(
                -0.2f64..last + 0.2,
                ((lo * 0.7).max(1.0)..(hi * 1.5).max(10.0)).log_scale(),
            )?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(235, 235, 235))
            .x_labels(QUANTILES.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-9 && i >= 0.0 {
                    QUANTILES.get(i as usize).map_or(String::new(), |q| q.1.to_owned())
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| duration_label(*y))
            .draw()?;
        for subject in panel.subjects() {
            let Some(c) = cells.iter().find(|c| c.subject == subject) else { continue };
            let colour = color_of(subject);
            let stroke = if subject == "tollgate" { 3 } else { 2 };
            let pts = curve(c);
            chart.draw_series(LineSeries::new(pts.clone(), colour.stroke_width(stroke)))?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
        }
    }
    root.present()?;
    Ok(())
}
