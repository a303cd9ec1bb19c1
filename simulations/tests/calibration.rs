//! Calibration: the workload model's statistics, sampled straight from the
//! model (no cluster), land within 10% (relative) of every SPEC 5 target
//! the scenario files carry, for two seeds.

use gyre_simulations::scenario;
use gyre_simulations::workload::profile;

#[test]
fn every_published_statistic_is_within_ten_percent() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for name in ["nl2repo-122b", "nl2repo-2.4t"] {
        let s = scenario::load(name).unwrap();
        for seed in [1, 2] {
            let p = profile::sample(&s.workload, s.cluster.group_size, 20_000, 200, seed);
            for row in p.rows(&s.targets) {
                let Some(target) = row.target else { continue };
                checked += 1;
                eprintln!(
                    "{name} seed {seed}: {:<38} {:>12.4} target {:>10.4} ({:.1}%)",
                    row.name,
                    row.value,
                    target,
                    row.rel_error.unwrap_or(0.0) * 100.0
                );
                if !row.within(0.10) {
                    failures.push(format!(
                        "{name} seed {seed}: {} {} vs {target}",
                        row.name, row.value
                    ));
                }
            }
        }
    }
    // 122B: mean execution, mean query, queries over 4 h, harness and
    // overall timeouts, lifetime tokens; 2.4T: queries over 4 h, longest
    // execution by overall timeout. Two seeds each.
    assert_eq!(checked, 2 * (6 + 2));
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn executions_make_hundreds_of_calls_with_compaction() {
    let s = scenario::load("nl2repo-122b").unwrap();
    let p = profile::sample(&s.workload, 16, 500, 500, 3);
    assert!(p.mean_calls > 100.0, "{}", p.mean_calls);
    assert!(p.compactions >= 1.0, "{}", p.compactions);
    assert!(p.peak_context <= s.workload.context_limit_tokens);
}
