//! The role timeline: one panel per run, one row per cell (and the pool),
//! coloured by what the cell was doing; a rollout cell's green deepens with
//! its slot occupancy. Dashed vertical lines mark publications (burst
//! boundaries).

use std::path::Path;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use super::PlotError;
use crate::lab::Comparison;
use crate::lab::timeline::CellState;

const TRAINING: RGBColor = RGBColor(0, 90, 181);
const SWITCHING: RGBColor = RGBColor(230, 120, 0);
const IDLE: RGBColor = RGBColor(205, 205, 205);

/// Rollout green, lighter for emptier cells.
fn rollout(tenths: u8) -> RGBColor {
    let u = f64::from(tenths.min(10)) / 10.0;
    let mix = |full: f64, empty: f64| (empty + (full - empty) * u).round() as u8;
    RGBColor(mix(20.0, 200.0), mix(140.0, 235.0), mix(60.0, 200.0))
}

fn colour(state: CellState) -> RGBColor {
    match state {
        CellState::Rollout(0) => IDLE,
        CellState::Rollout(t) => rollout(t),
        CellState::Switching => SWITCHING,
        CellState::Training => TRAINING,
        CellState::Idle => IDLE,
    }
}

/// Writes the timeline of every run of `c` to `path`.
pub fn draw(c: &Comparison, path: &Path) -> Result<(), PlotError> {
    let err = PlotError::at(path);
    let rows_of = |i: usize| c.results[i].timeline.rows.len().max(1);
    let panel_h: Vec<u32> = (0..c.results.len())
        .map(|i| 70 + 26 * rows_of(i) as u32)
        .collect();
    let height = 60 + panel_h.iter().sum::<u32>();
    let t_max = c
        .results
        .iter()
        .map(|r| r.total_hours)
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.02;
    let root = SVGBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (title, mut rest) = root.split_vertically(60);
    title
        .draw(&Text::new(
            format!(
                "{}: cell roles over time (E[d] = {}, {} steps, seed {})",
                c.scenario, c.staleness, c.steps, c.seed
            ),
            (20, 10),
            ("sans-serif", 22).into_font(),
        ))
        .map_err(|e| err(e.to_string()))?;
    let legend = [
        ("rollout (full)", rollout(10)),
        ("rollout (half empty)", rollout(5)),
        ("switching", SWITCHING),
        ("training", TRAINING),
        ("idle", IDLE),
    ];
    super::draw_legend(&title, &legend, 200, &err)?;
    for (i, r) in c.results.iter().enumerate() {
        let (panel, next) = rest.split_vertically(panel_h[i]);
        rest = next;
        let n = rows_of(i) as u32;
        let labels: Vec<String> = r
            .timeline
            .rows
            .iter()
            .map(|row| row.label.clone())
            .collect();
        let mut chart = ChartBuilder::on(&panel)
            .caption(
                format!(
                    "{} (φ = {}, μ = {}): {:.1} h",
                    r.name, r.phi, r.mu, r.total_hours
                ),
                ("sans-serif", 18),
            )
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(110)
            .build_cartesian_2d(0.0..t_max, (0..n).into_segmented())
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .x_desc("hours")
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(k) | SegmentValue::Exact(k) => {
                    labels.get(*k as usize).cloned().unwrap_or_default()
                }
                SegmentValue::Last => String::new(),
            })
            .draw()
            .map_err(|e| err(e.to_string()))?;
        let h = |t: u64| t as f64 / 3.6e12;
        for (k, row) in r.timeline.rows.iter().enumerate() {
            let k = k as u32;
            chart
                .draw_series(row.segments.iter().map(|s| {
                    Rectangle::new(
                        [
                            (h(s.from), SegmentValue::Exact(k)),
                            (h(s.to), SegmentValue::Exact(k + 1)),
                        ],
                        colour(s.state).filled(),
                    )
                }))
                .map_err(|e| err(e.to_string()))?;
        }
        for p in &r.publications_hours {
            chart
                .draw_series(DashedLineSeries::new(
                    [(*p, SegmentValue::Exact(0)), (*p, SegmentValue::Exact(n))],
                    4,
                    3,
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    root.present().map_err(|e| err(e.to_string()))
}
