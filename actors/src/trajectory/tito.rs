//! The TITO record: what the proxy writes down for every model call.
//!
//! Token-in, token-out: the exact input ids the engine saw, the exact output
//! ids it produced, the behaviour log-probability of every output token and
//! whether each output token was sampled by the engine or supplied from
//! outside (a forced prefix). Training later reuses these numbers as they are
//! (they are never recomputed), so a record is validated on its own before it
//! touches any tree. The same struct is the wire form (bincode through serde),
//! the storage form, and one line of the `gyre trace` JSONL format.

use serde::{Deserialize, Serialize};

/// Log-probabilities above this are rejected: a probability cannot exceed 1,
/// but engines' log-softmax may round a near-certain token a hair above 0.
pub const LOGPROB_TOLERANCE: f32 = 1e-4;

/// Who put an output token there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenSource {
    /// Drawn by the engine from the policy: a training target candidate.
    #[default]
    Sampled,
    /// Supplied from outside (a forced prefix, an injected token): context only.
    External,
}

/// Why the call was made; decides whether its outputs may ever be targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallPurpose {
    /// A policy turn of the harness.
    #[default]
    Policy,
    /// A critique later fed back as input: excluded from targets (SPEC 3.3).
    Critique,
}

/// One recorded model call.
///
/// Optional fields deserialise from a missing JSON key or `null`; the record
/// always serialises every field, because bincode's layout is positional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TitoRecord {
    /// The harness execution this call belongs to.
    pub execution: String,
    /// Unique within the execution.
    pub call_id: String,
    /// The agent thread (main agent, a sub-agent) that made the call.
    #[serde(default)]
    pub thread: Option<String>,
    /// Causal parent: the call whose output spawned this call's thread.
    #[serde(default)]
    pub parent_call: Option<String>,
    /// A class name that overrides the harness profile for the leaf this call
    /// produces (`main`, `main-summary`, `sub-agent`, `sub-agent-summary`).
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub purpose: CallPurpose,
    /// Policy version of the weights that served the call.
    pub policy_version: u64,
    /// The engine (cell, pool member) that served it.
    #[serde(default)]
    pub engine: Option<String>,
    /// Host time the call was accepted, in nanoseconds.
    #[serde(default)]
    pub start_ns: u64,
    /// Host time the call completed, in nanoseconds.
    #[serde(default)]
    pub end_ns: u64,
    /// Exact token ids of the serialised context.
    pub input_ids: Vec<u32>,
    /// Offsets into `input_ids` where each message ends (exclusive), for
    /// message-level statistics; empty when the proxy did not record them.
    #[serde(default)]
    pub input_message_ends: Vec<u32>,
    /// Exact token ids the engine returned.
    pub output_ids: Vec<u32>,
    /// Behaviour log-probability of each output token.
    pub output_logprobs: Vec<f32>,
    /// Per output token source; empty means every output token was sampled.
    #[serde(default)]
    pub output_sources: Vec<TokenSource>,
}

/// Why a record cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("record has an empty {field}")]
    Empty { field: &'static str },
    #[error(
        "call {call_id}: {outputs} output tokens but {logprobs} log-probabilities; they must be the same length"
    )]
    LogprobLength {
        call_id: String,
        outputs: usize,
        logprobs: usize,
    },
    #[error(
        "call {call_id}: {outputs} output tokens but {sources} output sources; give one per token or none"
    )]
    SourceLength {
        call_id: String,
        outputs: usize,
        sources: usize,
    },
    #[error("call {call_id}: output log-probability #{index} is {value}, not a finite value <= 0")]
    BadLogprob {
        call_id: String,
        index: usize,
        value: f32,
    },
    #[error(
        "call {call_id}: input_message_ends must increase strictly within 1..={input_len}; #{index} is {value}"
    )]
    BadMessageEnd {
        call_id: String,
        index: usize,
        value: u32,
        input_len: usize,
    },
    #[error("call {call_id}: end_ns {end_ns} is before start_ns {start_ns}")]
    BadTiming {
        call_id: String,
        start_ns: u64,
        end_ns: u64,
    },
    #[error("call {call_id}: {len} tokens do not fit a 32-bit position")]
    TooLong { call_id: String, len: usize },
}

impl TitoRecord {
    /// Checks everything a record can get wrong on its own. Trees call this
    /// before they change anything, so a bad record leaves no trace.
    pub fn validate(&self) -> Result<(), RecordError> {
        let call_id = || self.call_id.clone();
        if self.execution.is_empty() {
            return Err(RecordError::Empty { field: "execution" });
        }
        if self.call_id.is_empty() {
            return Err(RecordError::Empty { field: "call_id" });
        }
        if self.input_ids.is_empty() {
            return Err(RecordError::Empty { field: "input_ids" });
        }
        let total = self.input_ids.len() + self.output_ids.len();
        if u32::try_from(total).is_err() {
            return Err(RecordError::TooLong {
                call_id: call_id(),
                len: total,
            });
        }
        if self.output_logprobs.len() != self.output_ids.len() {
            return Err(RecordError::LogprobLength {
                call_id: call_id(),
                outputs: self.output_ids.len(),
                logprobs: self.output_logprobs.len(),
            });
        }
        if !self.output_sources.is_empty() && self.output_sources.len() != self.output_ids.len() {
            return Err(RecordError::SourceLength {
                call_id: call_id(),
                outputs: self.output_ids.len(),
                sources: self.output_sources.len(),
            });
        }
        if let Some((index, &value)) = self
            .output_logprobs
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v > LOGPROB_TOLERANCE)
        {
            return Err(RecordError::BadLogprob {
                call_id: call_id(),
                index,
                value,
            });
        }
        let mut previous = 0u32;
        for (index, &value) in self.input_message_ends.iter().enumerate() {
            if value <= previous || value as usize > self.input_ids.len() {
                return Err(RecordError::BadMessageEnd {
                    call_id: call_id(),
                    index,
                    value,
                    input_len: self.input_ids.len(),
                });
            }
            previous = value;
        }
        if self.end_ns < self.start_ns {
            return Err(RecordError::BadTiming {
                call_id: call_id(),
                start_ns: self.start_ns,
                end_ns: self.end_ns,
            });
        }
        Ok(())
    }

    /// The source of output token `i` (sampled when no sources were given).
    pub fn output_source(&self, i: usize) -> TokenSource {
        self.output_sources.get(i).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_runtime::{Bincode, Codec};

    fn record() -> TitoRecord {
        TitoRecord {
            execution: "e0".into(),
            call_id: "c0".into(),
            thread: Some("main".into()),
            parent_call: None,
            role: None,
            purpose: CallPurpose::Policy,
            policy_version: 3,
            engine: Some("cell-1".into()),
            start_ns: 10,
            end_ns: 20,
            input_ids: vec![1, 2, 3],
            input_message_ends: vec![2, 3],
            output_ids: vec![4, 5],
            output_logprobs: vec![-0.5, -1.0],
            output_sources: vec![],
        }
    }

    #[test]
    fn bincode_round_trip_keeps_every_field() {
        let r = record();
        let bytes = Bincode::encode(&r).unwrap();
        let back: TitoRecord = Bincode::decode(&bytes).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn json_minimal_line_fills_optional_fields() {
        let line = r#"{"execution":"e","call_id":"c","input_ids":[1],"output_ids":[2],
            "output_logprobs":[-0.1],"policy_version":0,"thread":null}"#;
        let r: TitoRecord = serde_json::from_str(line).unwrap();
        assert_eq!(r.thread, None);
        assert_eq!(r.output_source(0), TokenSource::Sampled);
        r.validate().unwrap();
    }

    #[test]
    fn mismatched_logprobs_are_rejected() {
        let mut r = record();
        r.output_logprobs.pop();
        assert!(matches!(
            r.validate(),
            Err(RecordError::LogprobLength {
                outputs: 2,
                logprobs: 1,
                ..
            })
        ));
    }

    #[test]
    fn bad_values_are_rejected() {
        let mut r = record();
        r.output_logprobs[1] = f32::NAN;
        assert!(matches!(
            r.validate(),
            Err(RecordError::BadLogprob { index: 1, .. })
        ));
        let mut r = record();
        r.output_logprobs[0] = 0.5;
        assert!(r.validate().is_err());
        let mut r = record();
        r.input_message_ends = vec![2, 2];
        assert!(matches!(
            r.validate(),
            Err(RecordError::BadMessageEnd { index: 1, .. })
        ));
        let mut r = record();
        r.input_message_ends = vec![4];
        assert!(r.validate().is_err());
        let mut r = record();
        r.end_ns = 1;
        assert!(matches!(r.validate(), Err(RecordError::BadTiming { .. })));
        let mut r = record();
        r.input_ids.clear();
        assert!(matches!(
            r.validate(),
            Err(RecordError::Empty { field: "input_ids" })
        ));
        let mut r = record();
        r.output_sources = vec![TokenSource::External];
        assert!(matches!(
            r.validate(),
            Err(RecordError::SourceLength { .. })
        ));
    }
}
