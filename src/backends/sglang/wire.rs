//! The JSON of SGLang's native API. Requests are what SGLang's
//! `GenerateReqInput` and `SamplingParams` take (token ids in, never text,
//! from Gyre's side); responses are written in SGLang's current shape
//! (`meta_info.output_token_logprobs` as `[logprob, token_id, text]`
//! triples, `finish_reason` as `{type: stop|length|abort, …}`,
//! `weight_version`) and read back from any of the shapes SGLang versions
//! have used: pairs or triples, a bare string finish reason, `output_ids`
//! absent (then taken from the log-prob entries), `id` or `rid`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `sampling_params` of `/generate`: the fields Gyre sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// −1 (or absent) keeps every token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
    /// SGLang names it `sampling_seed`; both are read.
    #[serde(
        default,
        alias = "sampling_seed",
        skip_serializing_if = "Option::is_none"
    )]
    pub seed: Option<u64>,
    /// Stop strings need a tokenizer on the server; Gyre sends ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Value>,
}

/// A `/generate` body for one prompt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub sampling_params: Sampling,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<String>,
    #[serde(default)]
    pub return_logprob: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub return_text_in_logprobs: bool,
    #[serde(default)]
    pub stream: bool,
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// A stop token (`matched`, when the server says which) or EOS.
    Stop { matched: Option<u32> },
    /// `max_new_tokens` or the context.
    Length,
    /// Aborted (by `/abort_request`, a weight update that aborts, or the
    /// server); the output is what was generated until then.
    Abort { message: Option<String> },
}

impl Finish {
    pub fn to_json(&self, output_len: usize) -> Value {
        match self {
            Finish::Stop { matched } => json!({"type": "stop", "matched": matched}),
            Finish::Length => json!({"type": "length", "length": output_len}),
            Finish::Abort { message } => json!({"type": "abort", "message": message}),
        }
    }

    /// `{type: …}` objects, or the bare strings of older versions.
    pub fn from_json(v: &Value) -> Option<Finish> {
        let (kind, obj) = match v {
            Value::String(s) => (s.as_str(), None),
            Value::Object(m) => (m.get("type").and_then(Value::as_str)?, Some(m)),
            _ => return None,
        };
        Some(match kind {
            "stop" | "eos" => Finish::Stop {
                matched: obj
                    .and_then(|m| m.get("matched"))
                    .and_then(Value::as_u64)
                    .map(|x| x as u32),
            },
            "length" => Finish::Length,
            "abort" => Finish::Abort {
                message: obj
                    .and_then(|m| m.get("message"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
            _ => return None,
        })
    }
}

/// One generation as read from a response (or a stream chunk, cumulative).
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub rid: Option<String>,
    pub text: String,
    pub output_ids: Vec<u32>,
    /// Behaviour log-prob of each output token (empty unless
    /// `return_logprob` was set).
    pub logprobs: Vec<f32>,
    /// `None` while a stream is still generating.
    pub finish: Option<Finish>,
    pub weight_version: Option<String>,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
}

/// `meta_info` of a response as `gyre serve` writes it.
#[derive(Clone, Debug)]
pub struct MetaOut<'a> {
    pub rid: &'a str,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub weight_version: &'a str,
    pub finish: Option<&'a Finish>,
    /// `(logprob, token id, text)` per output token, when asked for.
    pub logprobs: Option<Vec<(f32, u32, Option<String>)>>,
    pub e2e_latency: Option<f64>,
}

/// A `/generate` response (or stream chunk) body.
pub fn response_json(text: &str, output_ids: &[u32], m: &MetaOut<'_>) -> Value {
    let mut meta = json!({
        "id": m.rid,
        "finish_reason": m.finish.map(|f| f.to_json(output_ids.len())),
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": output_ids.len(),
        "cached_tokens": m.cached_tokens,
        "weight_version": m.weight_version,
    });
    if let Some(lp) = &m.logprobs {
        meta["output_token_logprobs"] = Value::Array(
            lp.iter()
                .map(|(l, t, s)| json!([l, t, s]))
                .collect::<Vec<_>>(),
        );
    }
    if let Some(e) = m.e2e_latency {
        meta["e2e_latency"] = json!(e);
    }
    json!({"text": text, "output_ids": output_ids, "meta_info": meta})
}

fn as_usize(v: Option<&Value>) -> Option<usize> {
    v.and_then(Value::as_u64).map(|x| x as usize)
}

/// Reads a `/generate` response or stream chunk in any SGLang shape.
pub fn parse_generation(v: &Value) -> Result<Generation, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("a generation must be a JSON object, got {v}"))?;
    let meta = obj
        .get("meta_info")
        .and_then(Value::as_object)
        .ok_or("response has no meta_info object")?;
    let mut ids = Vec::new();
    let mut logprobs = Vec::new();
    if let Some(entries) = meta.get("output_token_logprobs") {
        let entries = entries
            .as_array()
            .ok_or("meta_info.output_token_logprobs is not a list")?;
        for (i, e) in entries.iter().enumerate() {
            let e = e
                .as_array()
                .filter(|a| a.len() == 2 || a.len() == 3)
                .ok_or_else(|| {
                    format!("output_token_logprobs[{i}] is not [logprob, token_id(, text)]: {e}")
                })?;
            // A null log-prob (SGLang gives one for tokens it did not
            // score) cannot be a behaviour probability.
            let lp = e[0]
                .as_f64()
                .ok_or_else(|| format!("output_token_logprobs[{i}] has no log-prob: {}", e[0]))?;
            let id = e[1]
                .as_u64()
                .ok_or_else(|| format!("output_token_logprobs[{i}] has no token id: {}", e[1]))?;
            logprobs.push(lp as f32);
            ids.push(id as u32);
        }
    }
    let output_ids = match obj.get("output_ids") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|x| x as u32))
            .collect::<Option<Vec<_>>>()
            .ok_or("output_ids holds something other than token ids")?,
        _ => ids.clone(),
    };
    if !logprobs.is_empty() && ids != output_ids {
        return Err(format!(
            "output_ids ({} tokens) disagree with output_token_logprobs ({} tokens)",
            output_ids.len(),
            ids.len()
        ));
    }
    let finish = match meta.get("finish_reason") {
        None | Some(Value::Null) => None,
        Some(f) => Some(Finish::from_json(f).ok_or_else(|| format!("unknown finish_reason {f}"))?),
    };
    let weight_version = match meta.get("weight_version") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    Ok(Generation {
        rid: meta
            .get("id")
            .or_else(|| meta.get("rid"))
            .and_then(Value::as_str)
            .map(str::to_string),
        text: obj
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        output_ids,
        logprobs,
        finish,
        weight_version,
        prompt_tokens: as_usize(meta.get("prompt_tokens")),
        cached_tokens: as_usize(meta.get("cached_tokens")),
    })
}

/// The memory tags of `/release_memory_occupation`.
pub const TAG_WEIGHTS: &str = "weights";
pub const TAG_KV_CACHE: &str = "kv_cache";

/// `/update_weights_from_tensor`'s `load_format` for Gyre's flat
/// versioned parameter buffer (`GYREPRM1` bytes, base64, as the one entry
/// of `serialized_named_tensors`).
pub const GYRE_PARAM_BUFFER: &str = "gyre_param_buffer";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_reads_back_as_written() {
        let f = Finish::Abort {
            message: Some("aborted by rid".into()),
        };
        let m = MetaOut {
            rid: "r1",
            prompt_tokens: 3,
            cached_tokens: 0,
            weight_version: "4",
            finish: Some(&f),
            logprobs: Some(vec![(-0.5, 7, Some("a".into())), (-1.25, 9, None)]),
            e2e_latency: Some(0.1),
        };
        let g = parse_generation(&response_json("ab", &[7, 9], &m)).unwrap();
        assert_eq!(g.output_ids, vec![7, 9]);
        assert_eq!(g.logprobs, vec![-0.5, -1.25]);
        assert_eq!(g.finish, Some(f));
        assert_eq!(g.weight_version.as_deref(), Some("4"));
        assert_eq!(g.rid.as_deref(), Some("r1"));
    }

    /// SGLang 0.5: output_ids, triples, finish dict with `matched`,
    /// weight_version.
    const V05: &str = r#"{"text": "Paris.", "output_ids": [12366, 13],
        "meta_info": {"id": "9f2c", "finish_reason": {"type": "stop", "matched": 13},
        "prompt_tokens": 6, "weight_version": "default", "completion_tokens": 2,
        "cached_tokens": 3, "e2e_latency": 0.08,
        "output_token_logprobs": [[-0.25, 12366, null], [-0.0625, 13, null]]}}"#;
    /// SGLang 0.3/0.4: no output_ids, no weight_version, texts in triples.
    const V03: &str = r#"{"text": " Paris", "meta_info": {"prompt_tokens": 6,
        "completion_tokens": 2, "completion_tokens_wo_jump_forward": 2, "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": 2}, "id": "abc",
        "input_token_logprobs": [[null, 128000, null]],
        "output_token_logprobs": [[-0.5, 12366, " Paris"], [-1.5, 13, "."]],
        "normalized_prompt_logprob": -2.1}}"#;
    /// Early SGLang: a bare string finish reason, pairs, `rid`.
    const V01: &str = r#"{"text": "ab", "meta_info": {"rid": "x", "prompt_tokens": 2,
        "completion_tokens": 2, "finish_reason": "length",
        "output_token_logprobs": [[-0.5, 97], [-0.75, 98]]}}"#;
    /// An abort, as SGLang reports one, without log-probs asked for.
    const ABORT: &str = r#"{"text": "", "output_ids": [5], "meta_info": {"id": "r",
        "finish_reason": {"type": "abort", "message": "Abort before prefill",
        "status_code": 400}, "prompt_tokens": 4, "completion_tokens": 1,
        "weight_version": 7}}"#;

    fn read(s: &str) -> Generation {
        parse_generation(&serde_json::from_str(s).unwrap()).unwrap()
    }

    #[test]
    fn every_documented_sglang_shape_reads() {
        let g = read(V05);
        assert_eq!(g.output_ids, vec![12366, 13]);
        assert_eq!(g.logprobs, vec![-0.25, -0.0625]);
        assert_eq!(g.finish, Some(Finish::Stop { matched: Some(13) }));
        assert_eq!(g.weight_version.as_deref(), Some("default"));
        assert_eq!((g.prompt_tokens, g.cached_tokens), (Some(6), Some(3)));
        let g = read(V03);
        assert_eq!(g.output_ids, vec![12366, 13]);
        assert_eq!(g.logprobs, vec![-0.5, -1.5]);
        assert_eq!(g.finish, Some(Finish::Length));
        assert_eq!(g.weight_version, None);
        let g = read(V01);
        assert_eq!((g.output_ids, g.rid.as_deref()), (vec![97, 98], Some("x")));
        assert_eq!(g.finish, Some(Finish::Length));
        let g = read(ABORT);
        assert_eq!(
            g.finish,
            Some(Finish::Abort {
                message: Some("Abort before prefill".into())
            })
        );
        assert!(g.logprobs.is_empty());
        assert_eq!(g.weight_version.as_deref(), Some("7"));
    }

    #[test]
    fn inconsistent_or_foreign_responses_are_refused_naming_the_field() {
        let bad = |s: &str| parse_generation(&serde_json::from_str(s).unwrap()).unwrap_err();
        assert!(bad(r#"{"text": "x"}"#).contains("meta_info"));
        assert!(
            bad(r#"{"output_ids": [1], "meta_info": {"output_token_logprobs": [[-1, 2]]}}"#)
                .contains("disagree")
        );
        assert!(
            bad(r#"{"meta_info": {"output_token_logprobs": [[null, 2]]}}"#).contains("log-prob")
        );
        assert!(
            bad(r#"{"meta_info": {"finish_reason": {"type": "exploded"}}}"#)
                .contains("finish_reason")
        );
    }

    #[test]
    fn sampling_reads_sglang_names_and_drops_unset_fields() {
        let s: Sampling =
            serde_json::from_str(r#"{"max_new_tokens": 4, "sampling_seed": 9, "top_k": -1}"#)
                .unwrap();
        assert_eq!(
            (s.max_new_tokens, s.seed, s.top_k),
            (Some(4), Some(9), Some(-1))
        );
        let out = serde_json::to_value(Sampling::default()).unwrap();
        assert_eq!(out, json!({}));
    }
}
