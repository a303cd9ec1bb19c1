//! Step time and cumulative speed-up, per run: the left panel shows how long
//! each step took (bursts show as a step-time pattern), the right one each
//! run's cumulative speed-up over the first baseline at every step.

use std::path::Path;

use plotters::prelude::*;

use super::{PlotError, run_colour};
use crate::lab::Comparison;
use crate::lab::report::baselines;

pub fn draw(c: &Comparison, path: &Path) -> Result<(), PlotError> {
    let err = PlotError::at(path);
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (left, right) = root.split_horizontally(700);
    let steps = c
        .results
        .iter()
        .map(|r| r.step_end_hours.len())
        .max()
        .unwrap_or(0);
    let step_h = |r: &crate::lab::RunResult| -> Vec<f64> {
        let mut prev = 0.0;
        r.step_end_hours
            .iter()
            .map(|e| {
                let d = e - prev;
                prev = *e;
                d
            })
            .collect()
    };
    let y_max = c
        .results
        .iter()
        .flat_map(&step_h)
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!("{}: time per step (E[d] = {})", c.scenario, c.staleness),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..(steps as f64 + 0.5), 0.0..y_max)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("hours")
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, r) in c.results.iter().enumerate() {
        let col = run_colour(i);
        chart
            .draw_series(LineSeries::new(
                step_h(r)
                    .into_iter()
                    .enumerate()
                    .map(|(k, d)| ((k + 1) as f64, d)),
                col.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(format!("{} ({:.1} h total)", r.name, r.total_hours))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(e.to_string()))?;

    let Some(base) = baselines(c).into_iter().next() else {
        return root.present().map_err(|e| err(e.to_string()));
    };
    let base_ends = c
        .result(&base)
        .map(|r| r.step_end_hours.clone())
        .unwrap_or_default();
    let curve = |r: &crate::lab::RunResult| -> Vec<(f64, f64)> {
        r.step_end_hours
            .iter()
            .zip(&base_ends)
            .enumerate()
            .filter(|(_, (t, _))| **t > 0.0)
            .map(|(k, (t, b))| ((k + 1) as f64, b / t))
            .collect()
    };
    let (lo, hi) = c
        .results
        .iter()
        .flat_map(&curve)
        .fold((1.0f64, 1.0f64), |(lo, hi), (_, v)| (lo.min(v), hi.max(v)));
    let mut chart = ChartBuilder::on(&right)
        .caption(
            format!("cumulative speed-up over {base}"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..(steps as f64 + 0.5), (lo * 0.95)..(hi * 1.05))
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(format!("{base} hours / run hours, up to the step"))
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, r) in c.results.iter().enumerate() {
        let col = run_colour(i);
        let pts = curve(r);
        let last = pts.last().map(|p| p.1).unwrap_or(1.0);
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(format!("{} ({last:.2}x)", r.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))
}
