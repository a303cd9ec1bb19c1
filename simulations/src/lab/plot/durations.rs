//! The execution-length histogram against the calibration targets: the
//! lengths the workload model draws (bars), the lengths realised inside the
//! simulated cluster (one line per run), and markers at the targets (mean
//! execution, the 4 h line, the timeouts), with each target beside the
//! model's value in the legend.

use std::path::Path;

use plotters::prelude::*;

use super::{PlotError, run_colour};
use crate::lab::Comparison;
use crate::workload::WorkloadModel;
use crate::workload::profile::{Profile, Targets};

const BIN_H: f64 = 0.25;

fn pct(v: f64) -> String {
    format!("{:.2}%", v * 100.0)
}

/// " (target X)" when a target was published.
fn target_note(target: Option<f64>, fmt: impl Fn(f64) -> String) -> String {
    target.map_or(String::new(), |t| format!(" (target {})", fmt(t)))
}

fn shares(hours: &[f64], bins: usize) -> Vec<f64> {
    let mut counts = vec![0u64; bins];
    for h in hours {
        let b = ((h / BIN_H).floor().max(0.0) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let n = hours.len().max(1) as f64;
    counts.into_iter().map(|c| c as f64 / n).collect()
}

pub fn draw(
    profile: &Profile,
    model: &WorkloadModel,
    targets: &Targets,
    comparison: Option<&Comparison>,
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let err = PlotError::at(path);
    let x_max = (model.overall_timeout_hours + 0.5).max(4.5);
    let bins = (x_max / BIN_H).ceil() as usize;
    let model_shares = shares(&profile.durations_h, bins);
    let runs: Vec<(String, Vec<f64>)> = comparison
        .map(|c| {
            c.results
                .iter()
                .map(|r| (r.name.clone(), shares(&r.execution_hours, bins)))
                .collect()
        })
        .unwrap_or_default();
    let y_max = model_shares
        .iter()
        .chain(runs.iter().flat_map(|(_, s)| s))
        .fold(0.0f64, |a, b| a.max(*b))
        .max(1e-6)
        * 1.7; // headroom for the legend above the bars
    let root = SVGBackend::new(path, (1200, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: execution length, model vs targets"),
            ("sans-serif", 22),
        )
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("execution length (hours)")
        .light_line_style(WHITE)
        .y_desc(format!("share of executions per {BIN_H} h"))
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let bar = RGBColor(150, 170, 200);
    chart
        .draw_series(model_shares.iter().enumerate().map(|(i, s)| {
            let x0 = i as f64 * BIN_H;
            Rectangle::new([(x0, 0.0), (x0 + BIN_H * 0.95, *s)], bar.filled())
        }))
        .map_err(|e| err(e.to_string()))?
        .label(format!(
            "workload model: mean {:.2} h{}, harness timeouts {:.2}%{}, overall timeouts {:.2}%{}",
            profile.mean_exec_hours,
            target_note(targets.mean_exec_hours, |t| format!("{t} h")),
            profile.harness_timeouts * 100.0,
            target_note(targets.harness_timeouts, pct),
            profile.overall_timeouts * 100.0,
            target_note(targets.overall_timeouts, pct),
        ))
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], bar.filled()));
    for (i, (name, s)) in runs.iter().enumerate() {
        let col = run_colour(i);
        chart
            .draw_series(LineSeries::new(
                s.iter()
                    .enumerate()
                    .map(|(k, v)| ((k as f64 + 0.5) * BIN_H, *v)),
                col.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(format!("realised in the cluster: {name}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(3)));
    }
    let mut marks: Vec<(f64, String, RGBColor)> = vec![
        (
            model.harness_timeout_hours,
            format!("harness timeout ({} h)", model.harness_timeout_hours),
            RGBColor(120, 50, 160),
        ),
        (
            model.overall_timeout_hours,
            format!(
                "overall timeout ({} h): longest execution of {:.1}% of queries{}",
                model.overall_timeout_hours,
                profile.longest_by_overall_timeout * 100.0,
                target_note(targets.longest_by_overall_timeout, pct)
            ),
            RGBColor(180, 0, 0),
        ),
        (
            4.0,
            format!(
                "4 h: {:.2}% of queries run past it{}",
                profile.queries_over_4h * 100.0,
                target_note(targets.queries_over_4h, pct)
            ),
            RGBColor(90, 90, 90),
        ),
    ];
    if let Some(t) = targets.mean_exec_hours {
        marks.push((t, format!("target mean {t} h"), BLACK));
    }
    for (x, label, col) in marks {
        chart
            .draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, y_max)],
                6,
                4,
                col.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(label)
            .legend(move |(lx, ly)| {
                PathElement::new(vec![(lx, ly), (lx + 18, ly)], col.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))
}
