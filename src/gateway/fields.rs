//! Reading request JSON field by field, so a wrong type or a missing field
//! is reported by its path (`messages.2.content`), and unknown fields pass.

use serde_json::{Map, Value};

use super::service::CallError;

pub type Obj = Map<String, Value>;

pub fn bad(msg: impl Into<String>) -> CallError {
    CallError::InvalidRequest(msg.into())
}

pub fn parse_body(body: &[u8]) -> Result<Obj, CallError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the request body is not valid JSON: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(bad("the request body must be a JSON object")),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(path: &str, want: &str, v: &Value) -> CallError {
    bad(format!("{path}: expected {want}, got {}", type_name(v)))
}

fn present<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

pub fn opt_str<'a>(o: &'a Obj, key: &str, path: &str) -> Result<Option<&'a str>, CallError> {
    match present(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(path, "a string", v)),
    }
}

pub fn req_str<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a str, CallError> {
    opt_str(o, key, path)?.ok_or_else(|| bad(format!("{path}: field required")))
}

pub fn opt_f32(o: &Obj, key: &str, path: &str) -> Result<Option<f32>, CallError> {
    match present(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64().map(|f| f as f32)),
        Some(v) => Err(wrong(path, "a number", v)),
    }
}

pub fn opt_u64(o: &Obj, key: &str, path: &str) -> Result<Option<u64>, CallError> {
    match present(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("{path}: expected a non-negative integer, got {n}"))),
        Some(v) => Err(wrong(path, "an integer", v)),
    }
}

pub fn opt_bool(o: &Obj, key: &str, path: &str) -> Result<Option<bool>, CallError> {
    match present(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(path, "a boolean", v)),
    }
}

pub fn opt_array<'a>(
    o: &'a Obj,
    key: &str,
    path: &str,
) -> Result<Option<&'a Vec<Value>>, CallError> {
    match present(o, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(wrong(path, "an array", v)),
    }
}

pub fn req_array<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a Vec<Value>, CallError> {
    opt_array(o, key, path)?.ok_or_else(|| bad(format!("{path}: field required")))
}

pub fn as_obj<'a>(v: &'a Value, path: &str) -> Result<&'a Obj, CallError> {
    v.as_object().ok_or_else(|| wrong(path, "an object", v))
}

pub fn opt_obj<'a>(o: &'a Obj, key: &str, path: &str) -> Result<Option<&'a Obj>, CallError> {
    present(o, key).map(|v| as_obj(v, path)).transpose()
}

/// A string, or a list of strings (`stop`).
pub fn str_or_list(o: &Obj, key: &str, path: &str) -> Result<Vec<String>, CallError> {
    match present(o, key) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong(&format!("{path}.{i}"), "a string", v))
            })
            .collect(),
        Some(v) => Err(wrong(path, "a string or an array of strings", v)),
    }
}

/// Sampling values every engine can take, or a 400 naming the field.
pub fn check_sampling(p: &super::engine::SamplingParams) -> Result<(), CallError> {
    if let Some(t) = p.temperature
        && !(t.is_finite() && t >= 0.0)
    {
        return Err(bad(format!("temperature: {t} is not a number >= 0")));
    }
    if let Some(t) = p.top_p
        && !(t > 0.0 && t <= 1.0)
    {
        return Err(bad(format!("top_p: {t} is not in (0, 1]")));
    }
    Ok(())
}
