//! SVG charts: throughput against threads, and the latency distribution of single calls, one
//! panel per workload, one line per subject.

use std::io;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::{Cell, Report};

/// The quantiles of the latency chart, and their labels.
const QUANTILES: &[(f64, &str)] =
    &[(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"), (0.9999, "p99.99"), (1.0, "max")];

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Draws every chart the report has data for into `dir`; returns the files written.
pub fn draw(report: &Report, dir: &Path, workloads: &[(&str, &str)]) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    // One load per workload: the first present (allow-heavy where there is one).
    let panels: Vec<(&str, Vec<&Cell>)> = workloads
        .iter()
        .filter_map(|(name, _)| {
            let cells: Vec<&Cell> = report.cells.iter().filter(|c| c.workload == *name).collect();
            let load = cells.first()?.load;
            Some((*name, cells.into_iter().filter(|c| c.load == load).collect()))
        })
        .collect();
    if panels.is_empty() {
        return Ok(written);
    }
    // One colour per subject across every panel and both charts.
    let all: Vec<&Cell> = report.cells.iter().collect();
    let palette = subjects(&all);
    if report.threads.len() > 1 {
        let path = dir.join("throughput.svg");
        throughput(&path, &panels, &palette).map_err(err)?;
        written.push(path);
    }
    let path = dir.join("latency.svg");
    latency(&path, &panels, &palette).map_err(err)?;
    written.push(path);
    Ok(written)
}

fn subjects<'a>(cells: &[&'a Cell]) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for c in cells {
        if !v.contains(&c.subject) {
            v.push(c.subject);
        }
    }
    v
}

fn grid(n: usize) -> (usize, usize) {
    let cols = if n <= 2 { n } else { 3 };
    (n.div_ceil(cols), cols)
}

/// A fixed colour per subject, the same in every panel and run: tollgate's warm, the peers'
/// cold, the floor grey.
fn color_of(palette: &[&str], subject: &str) -> RGBColor {
    match subject {
        "floor" => RGBColor(130, 130, 130),
        "floor-coarse" => RGBColor(190, 190, 190),
        "floor-coarse-select" => RGBColor(160, 160, 160),
        "tollgate" => RGBColor(213, 94, 0),
        "tollgate-coarse" => RGBColor(230, 159, 0),
        "tollgate-batch" => RGBColor(204, 121, 167),
        "tollgate-prefetch" => RGBColor(150, 80, 120),
        "tollgate-evict" => RGBColor(170, 30, 60),
        "tollgate-counters" => RGBColor(240, 100, 60),
        "tollgate-nginx" => RGBColor(0, 158, 115),
        "tollgate-fixed-window" => RGBColor(86, 180, 233),
        "tollgate-sliding-window" => RGBColor(0, 90, 60),
        "governor" => RGBColor(0, 114, 178),
        "governor-ahash" => RGBColor(100, 60, 160),
        "mutex" => RGBColor(0, 0, 0),
        _ => {
            let i = palette.iter().position(|s| *s == subject).unwrap_or(palette.len());
            let (r, g, b) = Palette99::pick(i).to_rgba().rgb();
            RGBColor(r, g, b)
        }
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// The series' legend, in the upper left corner over a translucent box.
fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> DrawResult
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

fn throughput(path: &Path, panels: &[(&str, Vec<&Cell>)], palette: &[&str]) -> DrawResult {
    let (rows, cols) = grid(panels.len());
    let root = SVGBackend::new(path, (460 * cols as u32, 340 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, (name, cells)) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let max_t = cells.iter().map(|c| c.threads).max().unwrap_or(1);
        let top = cells.iter().map(|c| c.mops.max).fold(0.0, f64::max) * 1.15;
        let load = cells.first().map_or("", |c| c.load.name());
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{name} ({load})"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.8f64..(max_t as f64 + 0.2), 0f64..top.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("threads")
            .y_desc("M decisions/s, all threads")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_labels(max_t + 1)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-9 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .draw()?;
        for s in subjects(cells) {
            let c = color_of(palette, s);
            let mut pts: Vec<(f64, f64)> =
                cells.iter().filter(|x| x.subject == s).map(|x| (x.threads as f64, x.mops.median)).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(s)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
            // The spread of the repetitions, as a vertical bar.
            chart.draw_series(cells.iter().filter(|x| x.subject == s).map(|x| {
                PathElement::new(
                    vec![(x.threads as f64, x.mops.min), (x.threads as f64, x.mops.max)],
                    c.stroke_width(1),
                )
            }))?;
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

fn latency(path: &Path, panels: &[(&str, Vec<&Cell>)], palette: &[&str]) -> DrawResult {
    let (rows, cols) = grid(panels.len());
    let root = SVGBackend::new(path, (460 * cols as u32, 340 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let last = (QUANTILES.len() - 1) as f64;
    for (area, (name, cells)) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let max_t = cells.iter().map(|c| c.threads).max().unwrap_or(1);
        let cells: Vec<&Cell> = cells.iter().copied().filter(|c| c.threads == max_t).collect();
        let curve = |c: &Cell| -> Vec<(f64, f64)> {
            QUANTILES
                .iter()
                .enumerate()
                .map(|(i, &(q, _))| (i as f64, (c.calls.value_at_quantile(q) as f64 / 1000.0).max(0.1)))
                .collect()
        };
        let lo = cells.iter().flat_map(|c| curve(c)).map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = cells.iter().flat_map(|c| curve(c)).map(|p| p.1).fold(0.0, f64::max);
        let load = cells.first().map_or("", |c| c.load.name());
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{name} ({load}, {max_t} thread{})", if max_t == 1 { "" } else { "s" }),
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(
                -0.2f64..last + 0.2,
                ((lo * 0.7).max(0.1)..(hi * 1.5).max(1.0)).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_labels(QUANTILES.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-9 && i >= 0.0 {
                    QUANTILES.get(i as usize).map_or(String::new(), |q| q.1.to_owned())
                } else {
                    String::new()
                }
            })
            .y_desc("ns per decision (single calls)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for c in &cells {
            let col = color_of(palette, c.subject);
            let pts = curve(c);
            chart
                .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                .label(c.subject)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, col.filled())))?;
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}
