//! The task's rules: its configuration, each query's target and how one
//! call is credited.
//!
//! Everything the harness and the evaluator must agree on lives here, so
//! the reward the evaluator computes is exactly the rule the harness's
//! feedback ("ok" / "retry") teaches in context.

use gyre_runtime::rng::mix64;
use serde::{Deserialize, Serialize};

use super::context::Context;

/// System prompt of the main agent.
pub const MAIN_SYSTEM: &str = "agent";
/// System prompt of a sub-agent: a different prefix, hence its own root.
pub const SUB_SYSTEM: &str = "helper";
/// Tool result after a main call whose first token was the target.
pub const TOOL_OK: &str = "ok";
/// Tool result after a main call that missed.
pub const TOOL_RETRY: &str = "retry";

/// Why a task configuration was refused; each names the offending field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskConfigError {
    #[error("task.{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(
        "task does not fit the model context: a prompt of {prompt} tokens plus max_new_tokens {max_new} exceeds {context} (lower task.turns, task.max_new_tokens or task.queries)"
    )]
    TooLong {
        prompt: usize,
        max_new: u32,
        context: usize,
    },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> TaskConfigError {
    TaskConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// The built-in agent task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// Q: query `q` is `group % Q`.
    pub queries: u64,
    /// Main-agent calls per execution.
    pub turns: u32,
    /// Generation limit of every call.
    pub max_new_tokens: u32,
    /// The harness compacts its context before main call number
    /// `compact_after` (0: only when the context is full).
    pub compact_after: u32,
    /// Chance that a main call is followed by a sub-agent call.
    pub sub_agent_p: f64,
    /// The harness's own timeout, counted in calls (main and sub-agent):
    /// reaching it ends the run with `HarnessTimeout`.
    pub max_calls: u32,
    /// Chance that one evaluation attempt fails (the evaluator retries).
    pub eval_failure_rate: f64,
    /// Half credit fades linearly to zero over this many bytes around the
    /// target (0: exact match only). Makes the reward dense enough for a
    /// randomly initialised byte model to find the target.
    pub shaping_width: u32,
    pub temperature: f32,
    pub top_p: f32,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            queries: 8,
            turns: 3,
            max_new_tokens: 4,
            compact_after: 2,
            sub_agent_p: 0.25,
            max_calls: 16,
            eval_failure_rate: 0.1,
            shaping_width: 16,
            temperature: 1.0,
            top_p: 1.0,
        }
    }
}

fn probability(field: &'static str, p: f64) -> Result<(), TaskConfigError> {
    if p.is_finite() && (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{p} is not a probability in [0, 1]"),
        ))
    }
}

impl TaskConfig {
    /// Checks the fields on their own (see [`TaskConfig::check_fits`] for
    /// the model context).
    pub fn validate(&self) -> Result<(), TaskConfigError> {
        for (field, v) in [
            ("queries", self.queries),
            ("turns", u64::from(self.turns)),
            ("max_new_tokens", u64::from(self.max_new_tokens)),
            ("max_calls", u64::from(self.max_calls)),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        probability("sub_agent_p", self.sub_agent_p)?;
        probability("eval_failure_rate", self.eval_failure_rate)?;
        if self.eval_failure_rate >= 1.0 {
            return Err(invalid(
                "eval_failure_rate",
                "must be below 1, or no execution is ever scored",
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(invalid("temperature", "must be positive and finite"));
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", "must be in (0, 1]"));
        }
        Ok(())
    }

    /// Checks that every prompt the harness may have to send after a
    /// compaction, and the first prompt of every query, leaves room for
    /// `max_new_tokens` in a model context of `context` tokens.
    pub fn check_fits(&self, context: usize) -> Result<(), TaskConfigError> {
        self.validate()?;
        let last = self.queries - 1;
        let longest = [
            Context::main(last).prompt_len(),
            Context::compacted(last, self.turns, self.turns).prompt_len(),
            Context::sub_agent(last).prompt_len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        if longest + self.max_new_tokens as usize > context {
            return Err(TaskConfigError::TooLong {
                prompt: longest,
                max_new: self.max_new_tokens,
                context,
            });
        }
        Ok(())
    }

    /// The query an execution of `group` works on.
    pub fn query(&self, group: u64) -> u64 {
        group % self.queries.max(1)
    }

    /// Credit of one main call in [0, 1].
    pub fn credit(&self, first: Option<u32>, target: u32) -> f64 {
        call_credit(first, target, self.shaping_width)
    }
}

/// The byte query `q` must start every main answer with.
pub fn target(q: u64) -> u32 {
    u32::from(b'a') + (q % 8) as u32
}

/// The user turn stating query `q`.
pub fn query_text(q: u64) -> String {
    format!("task {q}")
}

/// A uniform draw in [0, 1) fixed by `(seed, a, b)`: the same whatever
/// order runs and evaluations happen in.
pub fn unit_draw(seed: u64, a: u64, b: u64) -> f64 {
    let z = mix64(seed ^ mix64(a ^ mix64(b)));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// 1 for the target byte first; half credit fading over `width` bytes
/// around it; 0 otherwise (special tokens, no output).
pub fn call_credit(first: Option<u32>, target: u32, width: u32) -> f64 {
    let Some(first) = first else {
        return 0.0;
    };
    if first == target {
        return 1.0;
    }
    if width == 0 || first >= 256 {
        return 0.0;
    }
    let d = f64::from(first.abs_diff(target));
    (0.5 * (1.0 - d / f64::from(width))).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_fit_both_models() {
        let c = TaskConfig::default();
        c.validate().unwrap();
        c.check_fits(64).unwrap();
        c.check_fits(256).unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        type Break = fn(&mut TaskConfig);
        let cases: Vec<(Break, &str)> = vec![
            (|c| c.queries = 0, "task.queries"),
            (|c| c.turns = 0, "task.turns"),
            (|c| c.max_new_tokens = 0, "task.max_new_tokens"),
            (|c| c.max_calls = 0, "task.max_calls"),
            (|c| c.sub_agent_p = 1.5, "task.sub_agent_p"),
            (|c| c.sub_agent_p = f64::NAN, "task.sub_agent_p"),
            (|c| c.eval_failure_rate = 1.0, "task.eval_failure_rate"),
            (|c| c.temperature = 0.0, "task.temperature"),
            (|c| c.top_p = 1.5, "task.top_p"),
        ];
        for (break_it, field) in cases {
            let mut c = TaskConfig::default();
            break_it(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }

    #[test]
    fn too_long_for_the_context_is_refused() {
        let c = TaskConfig {
            max_new_tokens: 60,
            ..TaskConfig::default()
        };
        assert!(matches!(
            c.check_fits(64),
            Err(TaskConfigError::TooLong { context: 64, .. })
        ));
        c.check_fits(256).unwrap();
    }

    #[test]
    fn unknown_fields_are_refused_and_missing_ones_default() {
        let c: TaskConfig = serde_json::from_str(r#"{"turns": 5}"#).unwrap();
        assert_eq!(c.turns, 5);
        assert_eq!(c.queries, TaskConfig::default().queries);
        assert!(serde_json::from_str::<TaskConfig>(r#"{"turnz": 5}"#).is_err());
    }

    #[test]
    fn credit_is_exact_then_shaped() {
        let t = target(3);
        assert_eq!(t, u32::from(b'd'));
        assert_eq!(call_credit(Some(t), t, 16), 1.0);
        assert_eq!(call_credit(Some(t + 8), t, 16), 0.25);
        assert_eq!(call_credit(Some(t - 16), t, 16), 0.0);
        assert_eq!(call_credit(Some(t + 1), t, 0), 0.0);
        assert_eq!(call_credit(Some(256), 255, 16), 0.0);
        assert_eq!(call_credit(None, t, 16), 0.0);
        assert_eq!(target(11), target(3));
    }

    #[test]
    fn draws_are_fixed_by_their_key_and_spread() {
        assert_eq!(unit_draw(1, 2, 3), unit_draw(1, 2, 3));
        assert_ne!(unit_draw(1, 2, 3), unit_draw(1, 3, 2));
        let n = 4000;
        let below = (0..n).filter(|i| unit_draw(9, *i, 0) < 0.25).count();
        assert!((800..1200).contains(&below), "{below}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&unit_draw(9, i, 1))));
    }
}
