//! The replay's timeline SVG: the recorded run above, the replay below,
//! one row per cell, coloured by role (rollout, switching, training), with
//! each step's end marked, on one time axis so the two line up by eye.

use std::path::Path;

use gyre_runtime::Nanos;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use super::run::ReplayReport;
use super::schema::{Role, Switch};
use crate::lab::plot::PlotError;

const ROLLOUT: RGBColor = RGBColor(20, 140, 60);
const TRAINING: RGBColor = RGBColor(0, 90, 181);
const SWITCHING: RGBColor = RGBColor(230, 120, 0);

/// (from, to, colour) segments of one cell until `end`.
fn segments(switches: &[Switch], cell: u32, end: Nanos) -> Vec<(Nanos, Nanos, RGBColor)> {
    let mut mine: Vec<&Switch> = switches.iter().filter(|s| s.cell == cell).collect();
    mine.sort_by_key(|s| s.begin_ns);
    let mut out = Vec::new();
    let (mut at, mut role) = (0, ROLLOUT);
    for s in mine {
        out.push((at, s.begin_ns, role));
        out.push((s.begin_ns, s.end_ns, SWITCHING));
        at = s.end_ns;
        role = match s.to {
            Role::Training => TRAINING,
            Role::Rollout => ROLLOUT,
        };
    }
    out.push((at, end.max(at), role));
    out
}

/// Writes both timelines of `r` to `path`, a row per cell each.
pub fn draw(r: &ReplayReport, path: &Path) -> Result<(), PlotError> {
    let (cells, rec_ends, sim_ends) = (r.cells, &r.recorded_ends[..], &r.simulated_ends[..]);
    let err = PlotError::at(path);
    let end = rec_ends
        .last()
        .copied()
        .unwrap_or(0)
        .max(sim_ends.last().copied().unwrap_or(0))
        .max(1);
    let ms = |t: Nanos| t as f64 / 1e6;
    let t_max = ms(end) * 1.02;
    let panel = 80 + 30 * cells.max(1);
    let root = SVGBackend::new(path, (1400, 60 + 2 * panel)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (title, rest) = root.split_vertically(60);
    title
        .draw(&Text::new(
            format!(
                "replay of a {} run (seed {}): cell roles, recorded and simulated; per-step error mean {:.1}%, max {:.1}%",
                r.host,
                r.seed,
                r.mean_abs_error * 100.0,
                r.max_abs_error * 100.0
            ),
            (20, 10),
            ("sans-serif", 20).into_font(),
        ))
        .map_err(|e| err(e.to_string()))?;
    let legend = [
        ("rollout", ROLLOUT),
        ("switching", SWITCHING),
        ("training", TRAINING),
    ];
    crate::lab::plot::draw_legend(&title, &legend, 160, &err)?;
    let (top, bottom) = rest.split_vertically(panel);
    let panels = [
        (top, "recorded", &r.recorded_switches, rec_ends),
        (
            bottom,
            "simulated (replay)",
            &r.simulated_switches,
            sim_ends,
        ),
    ];
    for (area, name, switches, ends) in panels {
        let mut chart = ChartBuilder::on(&area)
            .caption(name, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..t_max, (0..cells.max(1)).into_segmented())
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .x_desc("ms")
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(k) | SegmentValue::Exact(k) => format!("cell {k}"),
                SegmentValue::Last => String::new(),
            })
            .draw()
            .map_err(|e| err(e.to_string()))?;
        for c in 0..cells {
            chart
                .draw_series(segments(switches, c, end).into_iter().map(|(a, b, col)| {
                    Rectangle::new(
                        [
                            (ms(a), SegmentValue::Exact(c)),
                            (ms(b), SegmentValue::Exact(c + 1)),
                        ],
                        col.filled(),
                    )
                }))
                .map_err(|e| err(e.to_string()))?;
        }
        for e in ends {
            chart
                .draw_series(DashedLineSeries::new(
                    [
                        (ms(*e), SegmentValue::Exact(0)),
                        (ms(*e), SegmentValue::Exact(cells)),
                    ],
                    4,
                    3,
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    root.present().map_err(|e| err(e.to_string()))
}
