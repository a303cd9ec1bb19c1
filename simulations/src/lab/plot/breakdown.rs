//! Where the GPU time went: per run, one stacked bar of GPU-hours by role
//! and phase (`breakdown.svg`), and the critical path of one step
//! (`critical_path.svg`): from the previous update, rolling out until the
//! batch's last group is taken, the training left after that (exposed on
//! the critical path), and the publication that ends a burst. The step
//! drawn is each run's steady-state mean (a burst's publication shared by
//! its steps), so the picture is typical, not the warm-up.

use std::path::Path;

use plotters::prelude::*;

use super::PlotError;
use crate::lab::breakdown::Phase;
use crate::lab::{Comparison, RunResult};

/// One colour per phase: rollout greens and greys, switching oranges,
/// training blues, waiting reds.
fn colour(p: Phase) -> RGBColor {
    match p {
        Phase::RolloutBusy => RGBColor(20, 140, 60),
        Phase::WaitingLastGroups => RGBColor(213, 94, 0),
        Phase::WaitingOnTraining => RGBColor(204, 121, 167),
        Phase::RolloutIdle => RGBColor(190, 190, 190),
        Phase::Switching => RGBColor(230, 159, 0),
        Phase::Returning => RGBColor(240, 200, 90),
        Phase::WarmupDrain => RGBColor(86, 180, 233),
        Phase::Training => RGBColor(0, 90, 181),
        Phase::Optimizer => RGBColor(0, 40, 110),
        Phase::Publication => RGBColor(120, 60, 160),
        Phase::TrainingIdle => RGBColor(150, 150, 150),
    }
}

/// Writes the stacked GPU-hours of every run of `c` to `path`.
pub fn draw_gpu_hours(c: &Comparison, path: &Path) -> Result<(), PlotError> {
    let err = PlotError::at(path);
    let root = SVGBackend::new(path, (1100, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (plot, legend) = root.split_horizontally(820);
    let n = c.results.len().max(1);
    let y_max = c
        .results
        .iter()
        .map(|r| r.gpu_hours.total)
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.08;
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!(
                "{}: GPU-hours by phase (E[d] = {}, {} steps)",
                c.scenario, c.staleness, c.steps
            ),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..n as f64, 0.0..y_max)
        .map_err(|e| err(e.to_string()))?;
    let names: Vec<String> = c.results.iter().map(|r| r.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.26 || x.fract() == 0.0 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("GPU-hours")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, r) in c.results.iter().enumerate() {
        let mut base = 0.0;
        for p in Phase::ALL {
            let h = r.gpu_hours.get(p);
            if h <= 0.0 {
                continue;
            }
            let x0 = i as f64 + 0.15;
            let x1 = i as f64 + 0.85;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, base), (x1, base + h)],
                    colour(p).filled(),
                )))
                .map_err(|e| err(e.to_string()))?;
            base += h;
        }
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{:.0} GPU-h, {:.1} h", r.gpu_hours.total, r.total_hours),
                (i as f64 + 0.18, base + y_max * 0.02),
                ("sans-serif", 14).into_font(),
            )))
            .map_err(|e| err(e.to_string()))?;
    }
    for (k, p) in Phase::ALL.iter().enumerate() {
        let y = 60 + 28 * k as i32;
        legend
            .draw(&Rectangle::new(
                [(10, y), (28, y + 16)],
                colour(*p).filled(),
            ))
            .map_err(|e| err(e.to_string()))?;
        legend
            .draw(&Text::new(
                p.name(),
                (36, y + 1),
                ("sans-serif", 15).into_font(),
            ))
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))
}

/// A steady-state step on average: hours rolling out until the batch is
/// complete, training exposed after it, and publication (a burst's
/// publication shared by its μ steps).
pub fn mean_step(r: &RunResult) -> Option<[f64; 3]> {
    let from = (r.steady_from as usize).min(r.step_paths.len().saturating_sub(1));
    let steady = r.step_paths.get(from..).filter(|s| !s.is_empty())?;
    let n = steady.len() as f64;
    let mut out = [0.0; 3];
    for p in steady {
        out[0] += (p.batch_complete - p.from) / n;
        out[1] += (p.update - p.batch_complete) / n;
        out[2] += p.published.map_or(0.0, |t| t - p.update) / n;
    }
    Some(out)
}

/// Writes each run's mean steady-state step as a bar of its critical path.
pub fn draw_critical_path(c: &Comparison, path: &Path) -> Result<(), PlotError> {
    let err = PlotError::at(path);
    let n = c.results.len().max(1);
    let height = 140 + 60 * n as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let typical: Vec<Option<[f64; 3]>> = c.results.iter().map(mean_step).collect();
    let x_max = typical
        .iter()
        .flatten()
        .map(|p| p.iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: critical path of a mean steady-state step (hours from the previous update)",
                c.scenario
            ),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(120)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(|e| err(e.to_string()))?;
    let names: Vec<String> = c
        .results
        .iter()
        .zip(&typical)
        .map(|(r, t)| match t {
            Some(p) => format!("{} ({:.2} h)", r.name, p.iter().sum::<f64>()),
            None => r.name.clone(),
        })
        .collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n + 1)
        .y_label_formatter(&|y| names.get(y.floor() as usize).cloned().unwrap_or_default())
        .x_desc("hours")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let parts = [
        (
            "rolling out until the batch is complete",
            colour(Phase::RolloutBusy),
        ),
        ("training exposed after it", colour(Phase::Training)),
        ("publication", colour(Phase::Publication)),
    ];
    for (i, t) in typical.iter().enumerate() {
        let Some(p) = t else { continue };
        let y0 = i as f64 + 0.25;
        let y1 = i as f64 + 0.75;
        let spans = [
            (0.0, p[0], parts[0].1),
            (p[0], p[0] + p[1], parts[1].1),
            (p[0] + p[1], p[0] + p[1] + p[2], parts[2].1),
        ];
        for (a, b, col) in spans {
            if b > a {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(a, y0), (b, y1)],
                        col.filled(),
                    )))
                    .map_err(|e| err(e.to_string()))?;
            }
        }
    }
    for (k, (label, col)) in parts.iter().enumerate() {
        let x = 140 + 300 * k as i32;
        let y = height as i32 - 24;
        root.draw(&Rectangle::new([(x, y), (x + 18, y + 14)], col.filled()))
            .map_err(|e| err(e.to_string()))?;
        root.draw(&Text::new(
            *label,
            (x + 24, y),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))
}
