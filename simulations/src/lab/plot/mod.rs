//! SVG plots of a comparison, drawn with plotters:
//! - [`timeline`]: per-cell roles over time, one panel per run, burst
//!   boundaries marked;
//! - [`breakdown`]: GPU-hours by role and phase, and a step's critical path;
//! - [`steps`]: step time and cumulative speed-up per step;
//! - [`durations`]: the execution-length histogram against the calibration
//!   targets.

pub mod breakdown;
pub mod durations;
pub mod steps;
pub mod timeline;

use plotters::style::RGBColor;

/// A plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {message}")]
pub struct PlotError {
    pub path: String,
    pub message: String,
}

impl PlotError {
    pub(crate) fn at(path: &std::path::Path) -> impl Fn(String) -> PlotError + '_ {
        move |message| PlotError {
            path: path.display().to_string(),
            message,
        }
    }
}

/// A row of colour swatches with their labels across the top of a plot
/// (the timeline plots of the lab and of a replay share it), `step` pixels
/// apart.
pub(crate) fn draw_legend<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    items: &[(&str, RGBColor)],
    step: i32,
    err: impl Fn(String) -> PlotError,
) -> Result<(), PlotError> {
    use plotters::prelude::*;
    for (i, (label, col)) in items.iter().enumerate() {
        let x = 20 + step * i as i32;
        area.draw(&Rectangle::new([(x, 38), (x + 18, 52)], col.filled()))
            .map_err(|e| err(e.to_string()))?;
        area.draw(&Text::new(
            *label,
            (x + 24, 38),
            ("sans-serif", 15).into_font(),
        ))
        .map_err(|e| err(e.to_string()))?;
    }
    Ok(())
}

/// One colour per run, readable on white and distinct for colour-blind
/// readers (Okabe–Ito).
pub const RUN_COLOURS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

pub fn run_colour(i: usize) -> RGBColor {
    RUN_COLOURS[i % RUN_COLOURS.len()]
}
