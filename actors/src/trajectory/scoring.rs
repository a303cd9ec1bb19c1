//! Scoring outcomes (SPEC 3.3): what an execution's evaluation ended as, and
//! when its group is ready to train.
//!
//! An execution closes (completed, failed, timed out, cancelled); how it
//! closed never decides its reward. If anything usable was preserved it is
//! evaluated, also after a timeout (a valid score then carries `partial`).
//! An evaluator failure leaves the result *pending*: it may be retried on the
//! same preserved state until the execution's total time budget runs out,
//! after which the execution is *excluded*: its trajectories never train and
//! it never counts as a zero reward. A complete failure (nothing to evaluate)
//! gets a *dummy*: a zero reward placeholder so that group counts stay
//! complete. Every successful evaluation is bound to (execution, artifact
//! version, branch) and later evaluations never overwrite a binding.
//!
//! Critiques: text an evaluator or a critique call produces and a later
//! request consumes as input is never a training target. Text pasted into a
//! context is external by construction (see `insert.rs`); a critique produced
//! by a recorded model call is marked [`super::CallPurpose::Critique`] (or
//! withdrawn afterwards with `TrajectoryTree::exclude_call_outputs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where an execution's designated result stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// Still running.
    Open,
    /// Closed, evaluation not (yet) successful; `attempts` failed so far.
    Pending { attempts: u32 },
    /// A valid score; `partial` when the execution did not complete.
    Valid { score: f32, partial: bool },
    /// The time budget ran out with no valid score: never trains, never zero.
    Excluded { attempts: u32 },
    /// Complete failure: one zero-reward placeholder.
    Dummy,
}

impl Outcome {
    /// Nothing more will change it: the group may proceed.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Outcome::Valid { .. } | Outcome::Excluded { .. } | Outcome::Dummy
        )
    }

    /// The reward that enters the group statistics, if any.
    pub fn reward(&self) -> Option<f32> {
        match self {
            Outcome::Valid { score, .. } => Some(*score),
            Outcome::Dummy => Some(0.0),
            _ => None,
        }
    }

    /// Whether the execution's trajectories may become training rows.
    pub fn trains(&self) -> bool {
        matches!(self, Outcome::Valid { .. })
    }
}

/// How an execution ended. Recorded, never used as a reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Termination {
    Completed,
    TimedOut,
    Failed,
    Cancelled,
}

/// A reference to preserved work: artifact version and branch, and the
/// content hash of the state evaluated where the backend names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub version: u64,
    pub branch: String,
    /// Hex digest of the preserved content (a workspace's SHA-256); empty
    /// where nothing names it (the simulator, the built-in task).
    #[serde(default)]
    pub digest: String,
}

impl ArtifactRef {
    /// The execution's final state, not yet named: what is designated at
    /// close until a backend identifies the state it evaluated.
    pub fn unnamed() -> Self {
        ArtifactRef {
            version: 0,
            branch: String::new(),
            digest: String::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EvalResult {
    Scored { score: f32 },
    EvaluatorFailed { reason: String },
}

/// One evaluator answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub artifact: ArtifactRef,
    pub result: EvalResult,
    pub at_ns: u64,
}

/// A successful evaluation, bound for good.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalBinding {
    pub execution: String,
    pub artifact: ArtifactRef,
    pub score: f32,
    pub at_ns: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoringError {
    #[error("execution {execution} was already closed")]
    AlreadyClosed { execution: String },
    #[error("execution {execution} is not closed; nothing is frozen to evaluate yet")]
    NotClosed { execution: String },
    #[error("execution {execution} failed completely; it has nothing to evaluate")]
    NothingToEvaluate { execution: String },
    #[error(
        "execution {execution}: artifact {artifact:?} is already bound to score {existing}; bindings are never overwritten"
    )]
    AlreadyBound {
        execution: String,
        artifact: ArtifactRef,
        existing: f32,
    },
    #[error("execution {execution}: score {score} is not finite")]
    BadScore { execution: String, score: f32 },
}

/// One execution's scoring state. See the module doc.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionScoring {
    execution: String,
    deadline_ns: u64,
    outcome: Outcome,
    termination: Option<Termination>,
    designated: Option<ArtifactRef>,
    bindings: BTreeMap<ArtifactRef, EvalBinding>,
}

impl ExecutionScoring {
    /// `deadline_ns`: end of the execution's total time budget.
    pub fn new(execution: impl Into<String>, deadline_ns: u64) -> Self {
        ExecutionScoring {
            execution: execution.into(),
            deadline_ns,
            outcome: Outcome::Open,
            termination: None,
            designated: None,
            bindings: BTreeMap::new(),
        }
    }

    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    pub fn termination(&self) -> Option<Termination> {
        self.termination
    }

    pub fn designated(&self) -> Option<&ArtifactRef> {
        self.designated.as_ref()
    }

    pub fn bindings(&self) -> impl Iterator<Item = &EvalBinding> {
        self.bindings.values()
    }

    /// Freezes the execution. `artifact`: the usable state identified at
    /// close, or `None` after a complete failure (the result is a dummy).
    pub fn close(
        &mut self,
        termination: Termination,
        artifact: Option<ArtifactRef>,
    ) -> Result<&Outcome, ScoringError> {
        if self.termination.is_some() {
            return Err(ScoringError::AlreadyClosed {
                execution: self.execution.clone(),
            });
        }
        self.termination = Some(termination);
        self.outcome = match &artifact {
            None => Outcome::Dummy,
            Some(_) => Outcome::Pending { attempts: 0 },
        };
        self.designated = artifact;
        Ok(&self.outcome)
    }

    /// Names the designated state once a backend has identified it (the
    /// workspace's content hash and branch, taken on the frozen state):
    /// only while the state designated at close is [`ArtifactRef::unnamed`]
    /// and nothing is bound yet. Returns whether it took the name.
    pub fn identify(&mut self, artifact: ArtifactRef) -> bool {
        let unnamed = self.designated.as_ref() == Some(&ArtifactRef::unnamed());
        if !unnamed || !self.bindings.is_empty() || self.termination.is_none() {
            return false;
        }
        self.designated = Some(artifact);
        true
    }

    /// Takes one evaluator answer. A score for the designated artifact
    /// decides the result; a score for another artifact is only bound.
    pub fn on_evaluation(&mut self, eval: Evaluation) -> Result<&Outcome, ScoringError> {
        let execution = || self.execution.clone();
        if self.termination.is_none() {
            return Err(ScoringError::NotClosed {
                execution: execution(),
            });
        }
        if self.outcome == Outcome::Dummy {
            return Err(ScoringError::NothingToEvaluate {
                execution: execution(),
            });
        }
        let late = eval.at_ns > self.deadline_ns;
        let designated = self.designated.as_ref() == Some(&eval.artifact);
        match eval.result {
            EvalResult::Scored { score } => {
                if !score.is_finite() {
                    return Err(ScoringError::BadScore {
                        execution: execution(),
                        score,
                    });
                }
                if let Some(b) = self.bindings.get(&eval.artifact) {
                    return Err(ScoringError::AlreadyBound {
                        execution: execution(),
                        artifact: eval.artifact,
                        existing: b.score,
                    });
                }
                self.bindings.insert(
                    eval.artifact.clone(),
                    EvalBinding {
                        execution: execution(),
                        artifact: eval.artifact,
                        score,
                        at_ns: eval.at_ns,
                    },
                );
                if let (true, Outcome::Pending { attempts }) = (designated, &self.outcome) {
                    self.outcome = if late {
                        Outcome::Excluded {
                            attempts: *attempts,
                        }
                    } else {
                        Outcome::Valid {
                            score,
                            partial: self.termination != Some(Termination::Completed),
                        }
                    };
                }
            }
            EvalResult::EvaluatorFailed { .. } => {
                if let (true, Outcome::Pending { attempts }) = (designated, &self.outcome) {
                    let attempts = attempts + 1;
                    self.outcome = if late || eval.at_ns == self.deadline_ns {
                        Outcome::Excluded { attempts }
                    } else {
                        Outcome::Pending { attempts }
                    };
                }
            }
        }
        Ok(&self.outcome)
    }

    /// Called when the budget timer fires: a still-pending result is excluded.
    pub fn expire(&mut self, now_ns: u64) -> &Outcome {
        if let Outcome::Pending { attempts } = self.outcome
            && now_ns >= self.deadline_ns
        {
            self.outcome = Outcome::Excluded { attempts };
        }
        &self.outcome
    }

    /// Whether the evaluation should be (re)tried now.
    pub fn wants_evaluation(&self, now_ns: u64) -> bool {
        matches!(self.outcome, Outcome::Pending { .. }) && now_ns < self.deadline_ns
    }
}

/// A group is ready when no member is open or pending.
pub fn group_ready<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> bool {
    outcomes.into_iter().all(Outcome::is_final)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn art(v: u64) -> ArtifactRef {
        ArtifactRef {
            version: v,
            branch: "main".into(),
            digest: String::new(),
        }
    }

    #[test]
    fn an_unnamed_state_is_named_once_before_anything_is_bound() {
        let named = ArtifactRef {
            digest: "ab".repeat(32),
            ..art(0)
        };
        let mut s = ExecutionScoring::new("e", 100);
        assert!(!s.identify(named.clone()), "not closed yet");
        s.close(Termination::Completed, Some(ArtifactRef::unnamed()))
            .unwrap();
        assert!(s.identify(named.clone()));
        assert!(!s.identify(art(7)), "named once");
        assert_eq!(s.designated(), Some(&named));
        let eval = Evaluation {
            artifact: named.clone(),
            result: EvalResult::Scored { score: 0.5 },
            at_ns: 10,
        };
        s.on_evaluation(eval).unwrap();
        assert!(matches!(s.outcome(), Outcome::Valid { score, .. } if *score == 0.5));
        assert_eq!(s.bindings().next().unwrap().artifact, named);
        // A state named at close stays as it was.
        let mut t = ExecutionScoring::new("f", 100);
        t.close(Termination::Completed, Some(art(1))).unwrap();
        assert!(!t.identify(named));
    }

    fn scored(v: u64, score: f32, at_ns: u64) -> Evaluation {
        Evaluation {
            artifact: art(v),
            result: EvalResult::Scored { score },
            at_ns,
        }
    }

    fn failed(v: u64, at_ns: u64) -> Evaluation {
        Evaluation {
            artifact: art(v),
            result: EvalResult::EvaluatorFailed {
                reason: "oom".into(),
            },
            at_ns,
        }
    }

    #[test]
    fn timeout_still_scores_with_partial_credit() {
        let mut s = ExecutionScoring::new("e", 100);
        s.close(Termination::TimedOut, Some(art(3))).unwrap();
        let o = s.on_evaluation(scored(3, 0.4, 50)).unwrap();
        assert_eq!(
            o,
            &Outcome::Valid {
                score: 0.4,
                partial: true
            }
        );
    }

    #[test]
    fn evaluator_failures_retry_then_exclude() {
        let mut s = ExecutionScoring::new("e", 100);
        s.close(Termination::Completed, Some(art(1))).unwrap();
        assert_eq!(
            s.on_evaluation(failed(1, 10)).unwrap(),
            &Outcome::Pending { attempts: 1 }
        );
        assert!(s.wants_evaluation(20));
        assert_eq!(s.outcome().reward(), None);
        assert_eq!(s.expire(100), &Outcome::Excluded { attempts: 1 });
        assert!(!s.outcome().trains());
        assert_eq!(s.outcome().reward(), None);
        assert!(group_ready(&[s.outcome().clone()]));
    }

    #[test]
    fn retry_on_same_state_can_still_succeed() {
        let mut s = ExecutionScoring::new("e", 100);
        s.close(Termination::Completed, Some(art(1))).unwrap();
        s.on_evaluation(failed(1, 10)).unwrap();
        assert!(s.on_evaluation(scored(1, 1.0, 20)).unwrap().trains());
    }

    #[test]
    fn bindings_are_never_overwritten() {
        let mut s = ExecutionScoring::new("e", 100);
        s.close(Termination::Completed, Some(art(2))).unwrap();
        s.on_evaluation(scored(1, 0.2, 5)).unwrap(); // an older artifact
        assert_eq!(s.outcome(), &Outcome::Pending { attempts: 0 });
        s.on_evaluation(scored(2, 0.9, 6)).unwrap();
        let again = s.on_evaluation(scored(2, 0.1, 7));
        assert!(
            matches!(again, Err(ScoringError::AlreadyBound { existing, .. }) if existing == 0.9)
        );
        assert_eq!(s.outcome().reward(), Some(0.9));
        assert_eq!(s.bindings().count(), 2);
    }

    #[test]
    fn complete_failure_is_a_dummy_zero() {
        let mut s = ExecutionScoring::new("e", 100);
        assert!(!group_ready(&[s.outcome().clone()]));
        s.close(Termination::Failed, None).unwrap();
        assert_eq!(s.outcome(), &Outcome::Dummy);
        assert_eq!(s.outcome().reward(), Some(0.0));
        assert!(!s.outcome().trains());
        assert!(matches!(
            s.on_evaluation(scored(1, 1.0, 1)),
            Err(ScoringError::NothingToEvaluate { .. })
        ));
        assert!(matches!(
            s.close(Termination::Failed, None),
            Err(ScoringError::AlreadyClosed { .. })
        ));
    }

    #[test]
    fn pending_blocks_the_group() {
        let outcomes = [
            Outcome::Valid {
                score: 1.0,
                partial: false,
            },
            Outcome::Pending { attempts: 2 },
        ];
        assert!(!group_ready(&outcomes));
    }
}
