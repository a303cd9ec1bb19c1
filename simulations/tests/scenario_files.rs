//! The scenario files: every shipped scenario parses, validates and builds
//! a valid cluster for every run at both staleness targets; bad files are
//! rejected with an error that names the field at fault.

use gyre_actors::sched::Policy;
use gyre_actors::sched::maths::staleness::expected_staleness;
use gyre_simulations::scenario::{self, BUILTIN, Scenario, ScenarioError, Selection};

fn nl2repo_text() -> &'static str {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == "nl2repo-122b")
        .map(|(_, t)| *t)
        .unwrap()
}

/// `nl2repo-122b` with `key = …` in `[section]` replaced by `line`.
fn with_line(section: &str, key: &str, line: &str) -> String {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut replaced = false;
    for l in nl2repo_text().lines() {
        let t = l.trim_start();
        if t.starts_with('[') {
            current = t.trim_end_matches(|c: char| c != ']').to_owned();
        }
        if !replaced && current == section && t.starts_with(&format!("{key} ")) {
            out.push(line.to_owned());
            replaced = true;
        } else {
            out.push(l.to_owned());
        }
    }
    assert!(replaced, "no {key} in {section}");
    out.join("\n")
}

fn error_of(text: &str) -> ScenarioError {
    scenario::parse(text, "edited.toml").expect_err("the edit must be rejected")
}

#[test]
fn every_shipped_scenario_validates_and_builds_every_run() {
    assert_eq!(BUILTIN.len(), 5);
    for (name, _) in BUILTIN {
        let s = scenario::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&s.name, name);
        let targets: Vec<Option<f64>> = if s.variants.is_empty() {
            vec![Some(1.0), Some(1.5)]
        } else {
            vec![None]
        };
        for e_d in targets {
            let runs = s.runs(&Selection::All, e_d).unwrap();
            if s.variants.is_empty() {
                let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
                assert_eq!(names, ["elastic", "colocate", "async"]);
            } else {
                assert_eq!(runs.len(), 11, "{name}");
            }
            for run in &runs {
                // Equal staleness across the policies of a comparison.
                if let Some(e) = e_d {
                    assert_eq!(
                        expected_staleness(run.phi, run.mu),
                        e,
                        "{name} {}",
                        run.name
                    );
                }
                let cfg = scenario::cluster_config(&s, run, s.steps, 1);
                cfg.sched
                    .validate()
                    .unwrap_or_else(|e| panic!("{name} {}: {e}", run.name));
                assert!(cfg.costs.model.is_some());
            }
        }
        // The published switch costs (SPEC 2.5) are every scenario's.
        assert_eq!(s.switch.to_training_s, 8.52);
        assert_eq!(s.switch.to_rollout_s, 3.46);
    }
}

#[test]
fn over_sampling_is_set_apart_for_gyres_policy_and_for_the_baselines() {
    let mut s = scenario::load("deepswe-122b").unwrap();
    s.policies.oversample = 3;
    s.policies.baseline_oversample = 1;
    let runs = s.runs(&Selection::All, Some(1.5)).unwrap();
    let m: Vec<(&str, u32)> = runs
        .iter()
        .map(|r| {
            let cfg = scenario::cluster_config(&s, r, s.steps, 1);
            (r.name.as_str(), cfg.sched.oversample)
        })
        .collect();
    assert_eq!(m, [("elastic", 3), ("colocate", 1), ("async", 1)]);
    // In a file: the baselines' knob defaults to 0 whatever Gyre's is.
    let text = with_line("[policies]", "baseline_oversample", "");
    let text = text.replace("\noversample = 2\n", "\noversample = 5\n");
    let s = scenario::parse(&text, "edited.toml").unwrap();
    assert_eq!(s.policies.oversample_for(Policy::Elastic), 5);
    assert_eq!(s.policies.oversample_for(Policy::Colocate), 0);
    assert_eq!(
        s.policies.oversample_for(Policy::Async { train_cells: 4 }),
        0
    );
}

#[test]
fn the_ablation_holds_the_eleven_published_variants() {
    let s = scenario::load("ablation-nl2repo-122b").unwrap();
    let ids: Vec<&str> = s.variants.iter().map(|v| v.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2"
        ]
    );
    let runs = s.runs(&Selection::All, None).unwrap();
    let by = |id: &str| runs.iter().find(|r| r.name == id).unwrap();
    // Every variant uses the same 32 nodes.
    for r in &runs {
        assert_eq!(r.nodes(), 32, "{}", r.name);
    }
    assert_eq!(by("A0").policy, Policy::Async { train_cells: 4 });
    assert_eq!(by("A1").policy, Policy::Async { train_cells: 2 });
    assert_eq!((by("A2").phi, by("A2").mu), (0.5, 3));
    assert!(!by("A0").streaming && by("A3").streaming);
    assert_eq!((by("C1").cells, by("C1").pool_nodes), (7, 4));
    assert_eq!((by("C3").cells, by("C3").pool_nodes), (4, 16));
    assert_eq!(by("E0").policy, Policy::Elastic);
    assert_eq!((by("E1").phi, by("E1").mu), (1.5, 1));
    assert_eq!((by("E2").cells, by("E2").nodes_per_cell), (4, 8));
    // Picking variants by id.
    let two = s
        .runs(&Selection::parse("E0,A0"), None)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect::<Vec<_>>();
    assert_eq!(two, ["E0", "A0"]);
    assert!(s.runs(&Selection::parse("Z9"), None).is_err());
    assert!(s.runs(&Selection::All, Some(1.0)).is_err());
}

#[test]
fn an_unknown_key_is_rejected_by_name() {
    let text = nl2repo_text().replace("[cluster]\n", "[cluster]\ncell_capcity = 144\n");
    let e = error_of(&text).to_string();
    assert!(e.contains("cell_capcity"), "{e}");
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn a_missing_field_is_rejected_by_name() {
    let text = nl2repo_text().replace("batch_groups = 32", "");
    let e = error_of(&text).to_string();
    assert!(e.contains("missing field `batch_groups`"), "{e}");
}

#[test]
fn zero_cell_capacity_is_rejected_by_name() {
    let e = error_of(&with_line(
        "[cluster]",
        "cell_capacity",
        "cell_capacity = 0",
    ));
    assert_eq!(e.field(), Some("cluster.cell_capacity"), "{e}");
    assert!(e.to_string().contains("C_e"), "{e}");
}

#[test]
fn a_model_that_does_not_fit_a_cell_is_rejected_by_name() {
    let e = error_of(&with_line(
        "[model]",
        "params_billion",
        "params_billion = 2400",
    ));
    assert_eq!(e.field(), Some("model.params_billion"), "{e}");
    assert!(e.to_string().contains("does not fit a cell"), "{e}");
}

#[test]
fn impossible_values_name_their_field() {
    let cases = [
        (
            with_line(
                "[workload]",
                "overall_timeout_hours",
                "overall_timeout_hours = 2.0",
            ),
            "workload.overall_timeout_hours",
        ),
        (
            with_line("[policies]", "async_train_cells", "async_train_cells = 8"),
            "policies.async_train_cells",
        ),
        (
            with_line("[policies]", "rho_min", "rho_min = 1.5"),
            "policies.rho_min",
        ),
        (
            with_line("[transfer]", "read_gbps", "read_gbps = 0"),
            "transfer.read_gbps",
        ),
        (
            with_line("[workload]", "growth_tokens", "growth_tokens = [4000, 500]"),
            "workload.growth_tokens",
        ),
        (
            nl2repo_text().replace(
                "colocate = { phi = 0.0, mu = 4 }",
                "colocate = { phi = 0.0, mu = 3 }",
            ),
            "pairs[1].colocate",
        ),
    ];
    for (text, field) in cases {
        let e = error_of(&text);
        assert_eq!(e.field(), Some(field), "{e}");
    }
}

#[test]
fn a_scenario_file_on_disk_loads_and_an_unknown_name_lists_the_shipped_ones() {
    let dir = std::env::temp_dir().join(format!("gyre-scenario-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mine.toml");
    std::fs::write(&path, nl2repo_text().replace("steps = 48", "steps = 7")).unwrap();
    let s: Scenario = scenario::load(path.to_str().unwrap()).unwrap();
    assert_eq!(s.steps, 7);
    let e = scenario::load("nl2repo-999b").unwrap_err().to_string();
    assert!(
        e.contains("nl2repo-122b") && e.contains("ablation-nl2repo-122b"),
        "{e}"
    );
    let e = scenario::load(dir.join("absent.toml").to_str().unwrap()).unwrap_err();
    assert!(matches!(e, ScenarioError::Read { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_scaled_scenario_keeps_its_proportions() {
    let s = scenario::load("nl2repo-122b").unwrap();
    let q = s.scaled(8).unwrap();
    assert_eq!(q.cluster.batch_groups, 4);
    assert_eq!(q.cluster.cell_capacity, 18);
    // Eight times fewer groups per step, eight times fewer sampled tokens
    // per execution: the same training time per step.
    assert_eq!(
        q.training.node_ms_per_token,
        s.training.node_ms_per_token * 64.0
    );
    assert_eq!(q.workload.call_cycle_s, s.workload.call_cycle_s * 8.0);
    assert_eq!(s.scaled(1).unwrap(), s);
}
