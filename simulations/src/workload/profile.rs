//! The workload's statistics, sampled straight from the model (no cluster),
//! beside the published targets of SPEC 5.
//!
//! Durations here are what the workload alone predicts at nominal model-call
//! latency; inside a simulated cluster the calls take what the loaded
//! engines make them take, and the run reports the realised durations.

use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::calls::{Context, draw};
use super::{Ending, WorkloadModel};

/// Published statistics a workload is calibrated to (SPEC 5); each is
/// optional, since only some were published for each workload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    pub mean_exec_hours: Option<f64>,
    pub mean_query_hours: Option<f64>,
    /// Share of queries whose slowest execution runs past 4 h.
    pub queries_over_4h: Option<f64>,
    /// Share of executions ended by the harness timeout.
    pub harness_timeouts: Option<f64>,
    /// Share of executions ended by the overall timeout.
    pub overall_timeouts: Option<f64>,
    /// Share of queries whose longest execution ended by the overall timeout.
    pub longest_by_overall_timeout: Option<f64>,
    /// Mean tokens over an execution's lifetime.
    pub lifetime_tokens: Option<f64>,
}

/// Statistics of sampled queries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub queries: u64,
    pub executions: u64,
    pub mean_exec_hours: f64,
    pub median_exec_hours: f64,
    pub p90_exec_hours: f64,
    pub mean_query_hours: f64,
    pub queries_over_4h: f64,
    pub harness_timeouts: f64,
    pub overall_timeouts: f64,
    pub longest_by_overall_timeout: f64,
    pub complete_failures: f64,
    pub partial_failures: f64,
    pub mean_calls: f64,
    /// Over the executions whose calls were sampled one by one.
    pub lifetime_tokens: f64,
    pub compactions: f64,
    pub peak_context: u64,
    /// Every sampled execution's duration, hours (for the histogram).
    #[serde(skip)]
    pub durations_h: Vec<f64>,
}

/// One line of the profile table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileRow {
    pub name: &'static str,
    /// A share of executions or queries (printed as a percentage).
    pub share: bool,
    pub value: f64,
    pub target: Option<f64>,
    /// |value − target| / target.
    pub rel_error: Option<f64>,
}

impl ProfileRow {
    /// Within `tolerance` (relative) of its target; true without a target.
    pub fn within(&self, tolerance: f64) -> bool {
        self.rel_error.is_none_or(|e| e <= tolerance)
    }
}

/// Samples `queries` groups of `group_size` executions; the calls of the
/// first `token_queries` groups are drawn one by one for the token counts.
pub fn sample(
    model: &WorkloadModel,
    group_size: u32,
    queries: u64,
    token_queries: u64,
    seed: u64,
) -> Profile {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n = group_size.max(1);
    let four_h = 4.0 * 3_600.0;
    let mut durations = Vec::with_capacity((queries * u64::from(n)) as usize);
    let (mut query_sum, mut over4, mut longest_hang) = (0.0, 0u64, 0u64);
    let (mut harness, mut overall, mut complete, mut partial) = (0u64, 0u64, 0u64, 0u64);
    let mut calls = 0u64;
    let (mut lifetime, mut compactions, mut peak, mut token_execs) = (0u128, 0u64, 0u64, 0u64);
    for qi in 0..queries {
        let q = model.draw_query(&mut rng);
        let mut longest: Option<(f64, Ending)> = None;
        for _ in 0..n {
            let e = model.draw_exec(&q, &mut rng);
            durations.push(e.duration_s / 3_600.0);
            calls += u64::from(e.calls);
            match e.ending {
                Ending::HarnessTimeout => harness += 1,
                Ending::Hang => overall += 1,
                Ending::CompleteFailure => complete += 1,
                Ending::PartialFailure => partial += 1,
                Ending::Completed => {}
            }
            if longest.is_none_or(|(d, _)| e.duration_s > d) {
                longest = Some((e.duration_s, e.ending));
            }
            if qi < token_queries {
                let mut c = Context::start(model, &mut rng);
                for _ in 0..e.calls {
                    c.next_prompt(model, &mut rng);
                    c.answered(draw(model.output_tokens, &mut rng));
                }
                lifetime += u128::from(c.lifetime);
                compactions += u64::from(c.compactions);
                peak = peak.max(c.peak);
                token_execs += 1;
            }
        }
        if let Some((d, ending)) = longest {
            query_sum += d;
            over4 += u64::from(d > four_h);
            longest_hang += u64::from(ending == Ending::Hang);
        }
    }
    let execs = durations.len() as u64;
    let share = |k: u64, of: u64| if of == 0 { 0.0 } else { k as f64 / of as f64 };
    let mut sorted = durations.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if sorted.is_empty() {
            0.0
        } else {
            sorted[((sorted.len() - 1) as f64 * p).round() as usize]
        }
    };
    Profile {
        queries,
        executions: execs,
        mean_exec_hours: durations.iter().sum::<f64>() / execs.max(1) as f64,
        median_exec_hours: pct(0.5),
        p90_exec_hours: pct(0.9),
        mean_query_hours: query_sum / 3_600.0 / queries.max(1) as f64,
        queries_over_4h: share(over4, queries),
        harness_timeouts: share(harness, execs),
        overall_timeouts: share(overall, execs),
        longest_by_overall_timeout: share(longest_hang, queries),
        complete_failures: share(complete, execs),
        partial_failures: share(partial, execs),
        mean_calls: share(calls, execs),
        lifetime_tokens: lifetime as f64 / token_execs.max(1) as f64,
        compactions: share(compactions, token_execs),
        peak_context: peak,
        durations_h: durations,
    }
}

impl Profile {
    /// Every statistic, with its target where one was published.
    pub fn rows(&self, t: &Targets) -> Vec<ProfileRow> {
        let row = |name: &'static str, value: f64, target: Option<f64>| ProfileRow {
            name,
            share: !(name.contains("(h)")
                || name.contains("tokens")
                || name.contains("per execution")),
            value,
            target,
            rel_error: target.map(|t| {
                if t == 0.0 {
                    value.abs()
                } else {
                    ((value - t) / t).abs()
                }
            }),
        };
        vec![
            row(
                "mean execution (h)",
                self.mean_exec_hours,
                t.mean_exec_hours,
            ),
            row("median execution (h)", self.median_exec_hours, None),
            row("p90 execution (h)", self.p90_exec_hours, None),
            row("mean query (h)", self.mean_query_hours, t.mean_query_hours),
            row("queries over 4 h", self.queries_over_4h, t.queries_over_4h),
            row(
                "harness timeouts",
                self.harness_timeouts,
                t.harness_timeouts,
            ),
            row(
                "overall timeouts",
                self.overall_timeouts,
                t.overall_timeouts,
            ),
            row(
                "longest execution by overall timeout",
                self.longest_by_overall_timeout,
                t.longest_by_overall_timeout,
            ),
            row("complete failures", self.complete_failures, None),
            row("partial failures", self.partial_failures, None),
            row("model calls per execution", self.mean_calls, None),
            row("lifetime tokens", self.lifetime_tokens, t.lifetime_tokens),
            row("compactions per execution", self.compactions, None),
            row("largest prompt (tokens)", self.peak_context as f64, None),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::model;

    #[test]
    fn shares_are_consistent_and_the_seed_decides() {
        let m = model();
        let a = sample(&m, 16, 2_000, 50, 1);
        let b = sample(&m, 16, 2_000, 50, 1);
        let c = sample(&m, 16, 2_000, 50, 2);
        assert_eq!(a, b);
        assert_ne!(a.mean_exec_hours, c.mean_exec_hours);
        assert_eq!(a.executions, 32_000);
        // A query lasts as long as its slowest execution.
        assert!(a.mean_query_hours > a.mean_exec_hours);
        // Only hangs outlast the 3 h harness timeout here, so a query over
        // 4 h always has one, and its longest execution is that hang.
        assert_eq!(a.queries_over_4h, a.longest_by_overall_timeout);
        assert!(a.overall_timeouts > 0.0 && a.harness_timeouts > 0.0);
        assert!(a.mean_calls >= f64::from(m.min_calls));
        let rows = a.rows(&Targets {
            mean_exec_hours: Some(a.mean_exec_hours * 1.05),
            ..Targets::default()
        });
        assert!(rows[0].within(0.06) && !rows[0].within(0.04));
        assert!(rows[1].within(0.0));
    }
}
