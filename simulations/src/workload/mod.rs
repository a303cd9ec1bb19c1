//! The calibrated workload model: what one long-horizon agent execution does,
//! drawn so that the statistics of many of them match the published runs
//! (SPEC 5).
//!
//! A query has a difficulty that all N executions of its group share, so the
//! executions of one query finish close together (clustered completions) and
//! hard queries are slow for everyone; each execution adds its own variation,
//! and a small share of executions draws a heavy (Pareto) tail on top of the
//! log-normal body. An execution then ends one of five ways: it completes, it
//! runs into the harness's own timeout (the work done is still scored), the
//! harness crashes midway (partial credit), nothing can run at all (a
//! complete failure, a dummy), or a tool call hangs past the harness timeout
//! in a flaky environment and the overall timeout kills it (no valid reward).
//!
//! Each execution is a sequence of model calls separated by tool and think
//! time; the call count follows the execution's length (one call per
//! `call_cycle_s` of wall time) and the contexts grow by tool results and
//! outputs until compaction rewrites them ([`calls`]). Nothing here holds
//! tokens: an execution is a handful of numbers, and calls are drawn one at
//! a time from a stream.
//!
//! [`profile`] samples many queries straight from the model, without a
//! cluster, and sets the statistics beside the SPEC 5 targets.

pub mod calls;
pub mod normal;
pub mod profile;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::scenario::error::{FieldError, check};

/// Parameters of the workload, in the units a scenario file uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadModel {
    /// Median natural length of an execution, hours (the log-normal's scale).
    pub median_hours: f64,
    /// Log-scale spread of query difficulty, shared by a group.
    pub query_sigma: f64,
    /// Log-scale spread of one execution around its query.
    pub exec_sigma: f64,
    /// Share of executions whose length is multiplied by a Pareto factor.
    pub tail_share: f64,
    /// Pareto shape of that factor (smaller: heavier tail).
    pub tail_alpha: f64,
    /// The harness stops on its own after this long; the work is scored.
    pub harness_timeout_hours: f64,
    /// The execution's total time budget; past it there is no valid reward.
    pub overall_timeout_hours: f64,
    /// Share of queries whose environment can hang a tool call.
    pub hang_query_share: f64,
    /// In such a query, the chance that one execution hangs.
    pub hang_exec_share: f64,
    /// Nothing could run (e.g. the image could not be pulled): a dummy.
    pub complete_failure_share: f64,
    /// The harness crashed midway: the completed part is scored.
    pub partial_failure_share: f64,
    /// Wall time per model call at nominal load: tool and think time plus
    /// the call itself.
    pub call_cycle_s: f64,
    /// The model call's part of a cycle at the load the workload was
    /// measured under; the rest is tool and think time.
    pub nominal_call_s: f64,
    /// Fewest calls an execution that runs at all makes.
    pub min_calls: u32,
    /// System prompt plus task, tokens `[min, max]`.
    pub first_prompt_tokens: [u64; 2],
    /// Tokens added to the context before each call (tool results, new
    /// instructions) `[min, max]`.
    pub growth_tokens: [u64; 2],
    /// Tokens the model samples per call `[min, max]`.
    pub output_tokens: [u64; 2],
    /// The harness compacts its context when a prompt would exceed this.
    pub context_limit_tokens: u64,
    /// Size of the context after compaction `[min, max]`.
    pub compacted_tokens: [u64; 2],
}

/// How an execution ends, as the workload alone decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ending {
    Completed,
    /// The harness's own timeout: still scored.
    HarnessTimeout,
    /// Crashed midway: scored on what it produced.
    PartialFailure,
    /// Nothing ran: a zero-reward dummy.
    CompleteFailure,
    /// A tool call hangs after `hang_after` calls; the overall timeout ends
    /// it with no valid reward.
    Hang,
}

/// The draws a query's executions share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Query {
    /// z_q: the query's difficulty, a standard normal draw.
    pub difficulty: f64,
    /// Its environment can hang a tool call.
    pub flaky: bool,
}

/// One execution, as a few numbers (never its tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExecPlan {
    pub ending: Ending,
    /// Length the execution would have without any timeout, seconds.
    pub natural_s: f64,
    /// Length the workload alone predicts at nominal load, seconds.
    pub duration_s: f64,
    /// Calls it makes before it ends (for a hang: before the hang).
    pub calls: u32,
    /// Calls its natural length holds, timeouts aside.
    pub total_calls: u32,
    /// Mean tool and think time before each call, seconds.
    pub gap_s: f64,
}

impl WorkloadModel {
    /// Rejects parameters that cannot describe a workload, naming the field.
    pub fn validate(&self, at: &str) -> Result<(), FieldError> {
        let f = |name: &str| format!("{at}.{name}");
        check(self.median_hours > 0.0, f("median_hours"), "must be > 0")?;
        for (name, v) in [
            ("query_sigma", self.query_sigma),
            ("exec_sigma", self.exec_sigma),
        ] {
            check((0.0..=5.0).contains(&v), f(name), "must lie in [0, 5]")?;
        }
        for (name, v) in [
            ("tail_share", self.tail_share),
            ("hang_query_share", self.hang_query_share),
            ("hang_exec_share", self.hang_exec_share),
            ("complete_failure_share", self.complete_failure_share),
            ("partial_failure_share", self.partial_failure_share),
        ] {
            check((0.0..=1.0).contains(&v), f(name), "must lie in [0, 1]")?;
        }
        check(
            self.complete_failure_share + self.partial_failure_share <= 1.0,
            f("partial_failure_share"),
            "complete and partial failure shares add up to more than 1",
        )?;
        check(
            self.tail_alpha > 1.0,
            f("tail_alpha"),
            "must be > 1 (finite mean)",
        )?;
        check(
            self.harness_timeout_hours > 0.0,
            f("harness_timeout_hours"),
            "must be > 0",
        )?;
        check(
            self.overall_timeout_hours > self.harness_timeout_hours,
            f("overall_timeout_hours"),
            "must exceed harness_timeout_hours",
        )?;
        check(self.call_cycle_s > 0.0, f("call_cycle_s"), "must be > 0")?;
        check(
            (0.0..=self.call_cycle_s).contains(&self.nominal_call_s),
            f("nominal_call_s"),
            "must lie in [0, call_cycle_s]",
        )?;
        check(self.min_calls >= 1, f("min_calls"), "must be at least 1")?;
        for (name, r) in [
            ("first_prompt_tokens", self.first_prompt_tokens),
            ("growth_tokens", self.growth_tokens),
            ("output_tokens", self.output_tokens),
            ("compacted_tokens", self.compacted_tokens),
        ] {
            check(r[0] <= r[1], f(name), "is [min, max] with min ≤ max")?;
        }
        check(
            self.output_tokens[1] > 0,
            f("output_tokens"),
            "max must be > 0",
        )?;
        check(
            self.compacted_tokens[1] < self.context_limit_tokens
                && self.first_prompt_tokens[1] < self.context_limit_tokens,
            f("context_limit_tokens"),
            "must exceed the first prompt and the compacted context",
        )?;
        Ok(())
    }

    pub fn harness_timeout_s(&self) -> f64 {
        self.harness_timeout_hours * 3_600.0
    }

    pub fn overall_timeout_s(&self) -> f64 {
        self.overall_timeout_hours * 3_600.0
    }

    pub fn draw_query(&self, rng: &mut impl Rng) -> Query {
        Query {
            difficulty: normal::standard(rng),
            flaky: rng.random_bool(self.hang_query_share),
        }
    }

    /// Calls made over `seconds` of work.
    fn calls_for(&self, seconds: f64) -> u32 {
        let n = (seconds / self.call_cycle_s).round();
        (n.min(f64::from(u32::MAX)) as u32).max(self.min_calls)
    }

    /// One execution of query `q`.
    pub fn draw_exec(&self, q: &Query, rng: &mut impl Rng) -> ExecPlan {
        let z = self.query_sigma * q.difficulty + self.exec_sigma * normal::standard(rng);
        let mut natural = self.median_hours * 3_600.0 * z.exp();
        if rng.random_bool(self.tail_share) {
            // Pareto(α) ≥ 1 by inversion.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            natural *= u.powf(-1.0 / self.tail_alpha);
        }
        let total_calls = self.calls_for(natural);
        let gap_s = (natural / f64::from(total_calls) - self.nominal_call_s).max(0.0);
        let cycle = gap_s + self.nominal_call_s;
        let h = self.harness_timeout_s();
        // Calls that fit before the harness timeout.
        let by_timeout = ((h / cycle.max(1e-9)).ceil().min(f64::from(u32::MAX)) as u32).max(1);
        let roll: f64 = rng.random();
        let plan = |ending, duration_s, calls| ExecPlan {
            ending,
            natural_s: natural,
            duration_s,
            calls,
            total_calls,
            gap_s,
        };
        if roll < self.complete_failure_share {
            return plan(Ending::CompleteFailure, 0.0, 0);
        }
        if q.flaky && rng.random_bool(self.hang_exec_share) {
            let before = total_calls.min(by_timeout);
            let hang_after = rng.random_range(1..=before.max(1));
            return plan(Ending::Hang, self.overall_timeout_s(), hang_after);
        }
        if natural > h {
            return plan(Ending::HarnessTimeout, h, by_timeout.min(total_calls));
        }
        if roll < self.complete_failure_share + self.partial_failure_share {
            let done: f64 = rng.random_range(0.05..0.95);
            let calls = ((f64::from(total_calls) * done).round() as u32).max(1);
            return plan(Ending::PartialFailure, f64::from(calls) * cycle, calls);
        }
        plan(Ending::Completed, natural, total_calls)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::SeedableRng;

    pub(crate) fn model() -> WorkloadModel {
        WorkloadModel {
            median_hours: 1.5,
            query_sigma: 0.5,
            exec_sigma: 0.4,
            tail_share: 0.02,
            tail_alpha: 1.5,
            harness_timeout_hours: 3.0,
            overall_timeout_hours: 5.0,
            hang_query_share: 0.15,
            hang_exec_share: 0.05,
            complete_failure_share: 0.01,
            partial_failure_share: 0.02,
            call_cycle_s: 30.0,
            nominal_call_s: 12.0,
            min_calls: 3,
            first_prompt_tokens: [4_000, 12_000],
            growth_tokens: [500, 4_000],
            output_tokens: [200, 1_400],
            context_limit_tokens: 160_000,
            compacted_tokens: [15_000, 30_000],
        }
    }

    #[test]
    fn every_ending_happens_and_respects_the_timeouts() {
        let m = model();
        m.validate("workload").unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            let q = m.draw_query(&mut rng);
            let e = m.draw_exec(&q, &mut rng);
            seen.insert(format!("{:?}", e.ending));
            match e.ending {
                Ending::CompleteFailure => assert_eq!(e.calls, 0),
                Ending::Hang => {
                    assert!(q.flaky);
                    assert_eq!(e.duration_s, m.overall_timeout_s());
                }
                Ending::HarnessTimeout => {
                    assert!(e.natural_s > m.harness_timeout_s());
                    assert_eq!(e.duration_s, m.harness_timeout_s());
                }
                Ending::Completed | Ending::PartialFailure => {
                    assert!(e.duration_s <= m.harness_timeout_s() + 1e-6);
                    assert!(e.calls >= 1);
                }
            }
        }
        assert_eq!(seen.len(), 5, "{seen:?}");
    }

    #[test]
    fn executions_of_one_query_are_alike() {
        // Clustered completions: the spread inside a group is the
        // execution's σ, smaller than the spread across queries.
        let m = WorkloadModel {
            tail_share: 0.0,
            ..model()
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (mut within, mut across) = (0.0, Vec::new());
        for _ in 0..400 {
            let q = m.draw_query(&mut rng);
            let logs: Vec<f64> = (0..16)
                .map(|_| m.draw_exec(&q, &mut rng).natural_s.ln())
                .collect();
            let mean = logs.iter().sum::<f64>() / 16.0;
            within += logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 15.0;
            across.push(mean);
        }
        let within = (within / 400.0).sqrt();
        let mu = across.iter().sum::<f64>() / 400.0;
        let across = (across.iter().map(|a| (a - mu).powi(2)).sum::<f64>() / 399.0).sqrt();
        assert!((within - 0.4).abs() < 0.05, "within {within}");
        assert!(across > within, "across {across} within {within}");
    }

    #[test]
    fn bad_parameters_name_their_field() {
        let mut m = model();
        m.overall_timeout_hours = 2.0;
        let e = m.validate("workload").unwrap_err();
        assert_eq!(e.field, "workload.overall_timeout_hours");
        let mut m = model();
        m.growth_tokens = [10, 5];
        assert_eq!(
            m.validate("workload").unwrap_err().field,
            "workload.growth_tokens"
        );
    }
}
