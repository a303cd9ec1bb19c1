//! The GPU-time breakdown of a comparison, at a reduced scale: the phases of
//! every run add up to its GPU-hours (total hours × nodes × GPUs per node),
//! the policies lose time where SPEC 2/5 say they do (Async's fixed training
//! cells sit idle, Colocate stops rolling out while it trains, elastic keeps
//! rolling out while it trains), every step has a critical path in order,
//! and the breakdown plots are written as well-formed SVG.

use gyre_simulations::lab::breakdown::Phase;
use gyre_simulations::lab::plot::breakdown::{draw_critical_path, draw_gpu_hours};
use gyre_simulations::lab::{self, RunOptions};
use gyre_simulations::scenario::{self, Selection};

fn compare(name: &str, staleness: f64, steps: u64) -> (lab::Comparison, scenario::Scenario) {
    let s = scenario::load(name).unwrap().scaled_with(4, 32).unwrap();
    let runs = s.runs(&Selection::All, Some(staleness)).unwrap();
    let c = lab::compare(
        &s,
        &runs,
        staleness,
        &RunOptions::new(steps, 3),
        2,
        &|_, _| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (c, s)
}

#[test]
fn phases_sum_to_the_gpu_hours_of_every_run() {
    let (c, s) = compare("deepswe-122b", 1.5, 6);
    for r in &c.results {
        let g = &r.gpu_hours;
        let nodes = f64::from(r.cells * r.nodes_per_cell + r.pool_nodes);
        let expected = r.total_hours * nodes * f64::from(s.cluster.gpus_per_node);
        assert!(
            (g.total - expected).abs() < 1e-6 * expected,
            "{}: total {} against {expected}",
            r.name,
            g.total
        );
        assert!(
            (g.sum() - g.total).abs() < 1e-6 * g.total,
            "{}: phases sum to {} of {}",
            r.name,
            g.sum(),
            g.total
        );
        for p in Phase::ALL {
            assert!(g.get(p) >= 0.0, "{} {}", r.name, p.name());
        }
        let shares = r.shares();
        assert!(
            (shares.rollout + shares.training + shares.switching + shares.idle - 1.0).abs() < 1e-9
        );
        assert!(g.rollout_busy > 0.0 && g.training > 0.0, "{}", r.name);
        assert_eq!(r.step_paths.len() as u64, r.steps);
        for p in &r.step_paths {
            assert!(
                p.from <= p.batch_complete && p.batch_complete <= p.update,
                "{p:?}"
            );
            assert!(p.published.is_none_or(|t| t >= p.update), "{p:?}");
        }
        let bursts = r
            .step_paths
            .iter()
            .filter(|p| p.published.is_some())
            .count() as u64;
        assert!(
            bursts >= r.steps / u64::from(r.mu) - 1,
            "{}: {bursts} publications",
            r.name
        );
    }
    let of = |name: &str| &c.result(name).unwrap().gpu_hours;
    // Async's training cells switch once, at the start, never return, and
    // wait for batches; Colocate and elastic switch every burst.
    assert_eq!(of("async").switching_to_rollout, 0.0);
    assert!(of("async").switching_to_training < of("colocate").switching_to_training);
    assert!(of("async").training_idle > 0.0);
    assert!(of("colocate").switching_to_rollout > 0.0);
    assert!(of("elastic").switching_to_rollout > 0.0);
    assert_eq!(of("async").waiting_last_groups_movable, 0.0);
    for r in &c.results {
        let g = &r.gpu_hours;
        assert!(g.waiting_last_groups_movable <= g.waiting_last_groups + 1e-9);
    }
}

/// Well-formed XML, enough for SVG: every element closed in order, one root
/// `<svg>` element.
fn assert_well_formed_svg(text: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = text;
    let mut roots = 0;
    while let Some(open) = rest.find('<') {
        rest = &rest[open..];
        let close = rest.find('>').expect("an unclosed tag");
        let tag = &rest[1..close];
        rest = &rest[close + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '/')
            .collect();
        if stack.is_empty() {
            roots += 1;
            assert_eq!(name, "svg");
        }
        if !tag.ends_with('/') {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed elements {stack:?}");
    assert_eq!(roots, 1);
}

#[test]
fn breakdown_plots_are_well_formed_svg() {
    let (c, _) = compare("terminalbench-122b", 1.0, 4);
    let dir = std::env::temp_dir().join(format!("gyre-breakdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bars = dir.join("breakdown.svg");
    let path = dir.join("critical_path.svg");
    draw_gpu_hours(&c, &bars).unwrap();
    draw_critical_path(&c, &path).unwrap();
    let bars = std::fs::read_to_string(&bars).unwrap();
    assert_well_formed_svg(&bars);
    for r in &c.results {
        assert!(bars.contains(&r.name), "{} missing", r.name);
    }
    assert!(bars.contains("waiting_last_groups") && bars.contains("training_idle"));
    let path = std::fs::read_to_string(&path).unwrap();
    assert_well_formed_svg(&path);
    assert!(path.contains("training exposed after it") && path.contains(" h)"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_svg_check_catches_broken_files() {
    let broken = std::panic::catch_unwind(|| assert_well_formed_svg("<svg><g></svg>"));
    assert!(broken.is_err());
    assert_well_formed_svg("<?xml version=\"1.0\"?><svg a=\"1\"><g><rect/></g></svg>");
}
