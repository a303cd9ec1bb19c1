//! `config.json` of a Hugging Face decoder, read into Gyre's configuration
//! and written back. Reading is lenient about what the families leave out
//! (their defaults apply) and strict about what Gyre would compute wrongly:
//! an unknown architecture, an activation other than SiLU, MLP biases,
//! sliding-window attention or an unknown RoPE scaling is refused, named.

use serde_json::{Map, Value, json};

use crate::error::ModelError;
use crate::model::config::{Arch, DecoderArch, Family, ModelConfig, RopeScaling};

/// What `config.json` says beyond the shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    pub model: ModelConfig,
    /// `max_position_embeddings`, before any cap on the context.
    pub max_positions: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn bad(m: String) -> ModelError {
    ModelError::Checkpoint(m)
}

fn family_of(cfg: &Map<String, Value>) -> Result<Family, ModelError> {
    let arch = cfg
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let model_type = cfg.get("model_type").and_then(Value::as_str);
    match (arch, model_type) {
        (Some("LlamaForCausalLM"), _) | (None, Some("llama")) => Ok(Family::Llama),
        (Some("Qwen3ForCausalLM"), _) | (None, Some("qwen3")) => Ok(Family::Qwen3),
        (Some(a), _) => Err(bad(format!(
            "unsupported architecture {a:?} (supported: LlamaForCausalLM, Qwen3ForCausalLM)"
        ))),
        (None, Some(t)) => Err(bad(format!(
            "unsupported model_type {t:?} (supported: llama, qwen3)"
        ))),
        (None, None) => Err(bad(
            "config.json names neither architectures nor model_type".into(),
        )),
    }
}

fn usize_field(cfg: &Map<String, Value>, key: &str) -> Result<Option<usize>, ModelError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            bad(format!(
                "config.json: {key} is not a non-negative integer: {v}"
            ))
        }),
    }
}

fn required(cfg: &Map<String, Value>, key: &str) -> Result<usize, ModelError> {
    usize_field(cfg, key)?.ok_or_else(|| bad(format!("config.json lacks {key}")))
}

fn f64_field(cfg: &Map<String, Value>, key: &str) -> Result<Option<f64>, ModelError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(format!("config.json: {key} is not a number: {v}"))),
    }
}

fn bool_field(cfg: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ModelError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(format!("config.json: {key} is not a boolean: {v}"))),
    }
}

/// One token id or a list of them (`eos_token_id` is either).
pub fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn rope_scaling(v: Option<&Value>) -> Result<Option<RopeScaling>, ModelError> {
    let Some(Value::Object(m)) = v else {
        return Ok(None);
    };
    let kind = m
        .get("rope_type")
        .or_else(|| m.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| -> Result<f64, ModelError> {
        m.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(format!("rope_scaling ({kind}) lacks {k}")))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
        })),
        other => Err(bad(format!(
            "unsupported rope_scaling type {other:?} (supported: default, linear, llama3)"
        ))),
    }
}

/// Reads `config.json`'s text; `max_context` caps the context (a 40 K
/// position model need not reserve KV blocks for 40 K tokens per request).
pub fn parse_config(text: &str, max_context: Option<usize>) -> Result<HfConfig, ModelError> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("config.json is not JSON: {e}")))?;
    let Value::Object(cfg) = v else {
        return Err(bad("config.json is not a JSON object".into()));
    };
    let family = family_of(&cfg)?;
    let act = cfg
        .get("hidden_act")
        .and_then(Value::as_str)
        .unwrap_or("silu");
    if act != "silu" {
        return Err(bad(format!(
            "unsupported hidden_act {act:?} (supported: silu)"
        )));
    }
    if bool_field(&cfg, "mlp_bias", false)? {
        return Err(bad("unsupported mlp_bias = true".into()));
    }
    if bool_field(&cfg, "use_sliding_window", false)? {
        return Err(bad("unsupported use_sliding_window = true".into()));
    }
    let heads = required(&cfg, "num_attention_heads")?;
    let width = required(&cfg, "hidden_size")?;
    // Newer transformers nest RoPE settings in rope_parameters.
    let rope_params = cfg.get("rope_parameters").and_then(Value::as_object);
    let rope_theta = match f64_field(&cfg, "rope_theta")? {
        Some(t) => t,
        None => rope_params
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0),
    };
    let scaling = match cfg.get("rope_scaling") {
        Some(Value::Object(_)) => rope_scaling(cfg.get("rope_scaling"))?,
        _ => rope_scaling(cfg.get("rope_parameters"))?,
    };
    let max_positions = usize_field(&cfg, "max_position_embeddings")?.unwrap_or(2048);
    let model = ModelConfig {
        vocab: required(&cfg, "vocab_size")?,
        layers: required(&cfg, "num_hidden_layers")?,
        heads,
        width,
        ffn: required(&cfg, "intermediate_size")?,
        context: max_context.map_or(max_positions, |c| c.min(max_positions)),
        arch: Arch::Decoder(DecoderArch {
            family,
            kv_heads: usize_field(&cfg, "num_key_value_heads")?.unwrap_or(heads),
            head_dim: usize_field(&cfg, "head_dim")?.unwrap_or(width / heads.max(1)),
            rope_theta,
            rope_scaling: scaling,
            norm_eps: f64_field(&cfg, "rms_norm_eps")?.unwrap_or(1e-6),
            tie_embeddings: bool_field(&cfg, "tie_word_embeddings", false)?,
            attention_bias: bool_field(&cfg, "attention_bias", false)?,
        }),
    };
    model.validate().map_err(|e| bad(e.to_string()))?;
    Ok(HfConfig {
        model,
        max_positions,
        bos_token_id: usize_field(&cfg, "bos_token_id")?.map(|x| x as u32),
        eos_token_ids: token_ids(cfg.get("eos_token_id")),
    })
}

/// `config.json` for a decoder configuration (F32 weights).
pub fn to_json(c: &HfConfig) -> Result<String, ModelError> {
    let Arch::Decoder(d) = &c.model.arch else {
        return Err(bad("only decoder configurations have a config.json".into()));
    };
    let (arch, model_type) = match d.family {
        Family::Llama => ("LlamaForCausalLM", "llama"),
        Family::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
    };
    let m = &c.model;
    let mut v = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": m.vocab,
        "hidden_size": m.width,
        "intermediate_size": m.ffn,
        "num_hidden_layers": m.layers,
        "num_attention_heads": m.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_positions,
        "rms_norm_eps": d.norm_eps,
        "rope_theta": d.rope_theta,
        "tie_word_embeddings": d.tie_embeddings,
        "attention_bias": d.attention_bias,
        "torch_dtype": "float32",
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids,
    });
    let scaling = match &d.rope_scaling {
        None => Value::Null,
        Some(RopeScaling::Linear { factor }) => json!({"rope_type": "linear", "factor": factor}),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    };
    v["rope_scaling"] = scaling;
    serde_json::to_string_pretty(&v).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3_06B: &str = r#"{
      "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
      "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
      "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
      "vocab_size": 151936
    }"#;

    #[test]
    fn qwen3_0_6b_config_reads() {
        let c = parse_config(QWEN3_06B, Some(4096)).unwrap();
        assert_eq!(c.model.context, 4096);
        assert_eq!(c.max_positions, 40960);
        assert_eq!(c.eos_token_ids, vec![151645]);
        let d = c.model.decoder().unwrap();
        assert_eq!((d.family, d.kv_heads, d.head_dim), (Family::Qwen3, 8, 128));
        assert!(d.tie_embeddings);
        assert_eq!(c.model.kv_width(), 1024);
        let back = parse_config(&to_json(&c).unwrap(), Some(4096)).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unsupported_settings_are_named() {
        let gpt2 = r#"{"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}"#;
        let e = parse_config(gpt2, None).unwrap_err().to_string();
        assert!(e.contains("GPT2LMHeadModel"), "{e}");
        let gelu = QWEN3_06B.replace("\"silu\"", "\"gelu\"");
        assert!(
            parse_config(&gelu, None)
                .unwrap_err()
                .to_string()
                .contains("gelu")
        );
        let yarn = QWEN3_06B.replace(
            "\"rope_scaling\": null",
            "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}",
        );
        assert!(
            parse_config(&yarn, None)
                .unwrap_err()
                .to_string()
                .contains("yarn")
        );
        let no_width = QWEN3_06B.replace("\"hidden_size\": 1024,", "");
        assert!(
            parse_config(&no_width, None)
                .unwrap_err()
                .to_string()
                .contains("hidden_size")
        );
    }
}
