//! OpenAI Chat Completions: `POST /v1/chat/completions` (plain and
//! streamed as `chat.completion.chunk`s ending in `[DONE]`), `GET
//! /v1/models`, errors as `{"error":{"message","type","param","code"}}`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::chat::{ChatRequest, Message, Role, ToolCall, ToolChoice, ToolSpec};
use super::engine::SamplingParams;
use super::fields::*;
use super::service::CallError;
use super::tokenizer::Tokenizer;
use super::turn::{Delta, Outcome, SampledToken, Stop};

/// OpenAI's status for an error (its clients retry 429 and 5xx).
pub fn status(e: &CallError) -> u16 {
    match e {
        CallError::Overloaded(_) => 503,
        other => other.status(),
    }
}

pub fn error_body(e: &CallError) -> Value {
    let (kind, code) = match e {
        CallError::InvalidRequest(m) if m.starts_with("prompt is too long") => {
            ("invalid_request_error", json!("context_length_exceeded"))
        }
        CallError::InvalidRequest(_) | CallError::TooLarge(_) => {
            ("invalid_request_error", Value::Null)
        }
        CallError::Authentication(_) => ("invalid_request_error", json!("invalid_api_key")),
        CallError::Permission(_) => ("permission_error", Value::Null),
        CallError::NotFound(_) => ("invalid_request_error", json!("not_found")),
        CallError::Overloaded(_) => ("server_error", json!("overloaded")),
        CallError::Timeout(_) | CallError::Internal(_) => ("server_error", Value::Null),
    };
    json!({"error": {"message": e.message(), "type": kind, "param": null, "code": code}})
}

/// The text of a content value as both OpenAI APIs send it: a string,
/// null, or text parts; media parts are refused by path.
pub(super) fn content_text(v: Option<&Value>, path: &str) -> Result<String, CallError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let p = format!("{path}.{i}");
                let part = as_obj(part, &p)?;
                match req_str(part, "type", &format!("{p}.type"))? {
                    "text" | "input_text" | "output_text" => {
                        out.push(req_str(part, "text", &format!("{p}.text"))?.to_string())
                    }
                    "image_url" | "input_image" | "input_audio" | "file" | "input_file" => {
                        return Err(bad(format!(
                            "{p}: image, audio and file input is not supported: the model has no vision"
                        )));
                    }
                    other => {
                        return Err(bad(format!(
                            "{p}: content part type {other:?} is not supported"
                        )));
                    }
                }
            }
            Ok(out.join("\n"))
        }
        Some(_) => Err(bad(format!(
            "{path}: expected a string, an array of content parts or null"
        ))),
    }
}

fn tool_calls(m: &Obj, path: &str) -> Result<Vec<ToolCall>, CallError> {
    let mut out = Vec::new();
    for (i, c) in opt_array(m, "tool_calls", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("{path}.{i}");
        let c = as_obj(c, &p)?;
        let f = opt_obj(c, "function", &format!("{p}.function"))?
            .ok_or_else(|| bad(format!("{p}.function: field required")))?;
        out.push(ToolCall {
            id: req_str(c, "id", &format!("{p}.id"))?.to_string(),
            name: req_str(f, "name", &format!("{p}.function.name"))?.to_string(),
            arguments: opt_str(f, "arguments", &format!("{p}.function.arguments"))?
                .unwrap_or("{}")
                .to_string(),
        });
    }
    Ok(out)
}

pub fn parse_tools(body: &Obj) -> Result<Vec<ToolSpec>, CallError> {
    let mut tools = Vec::new();
    for (i, t) in opt_array(body, "tools", "tools")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("tools.{i}");
        let t = as_obj(t, &p)?;
        // Chat Completions nests under "function"; Responses is flat.
        let f = opt_obj(t, "function", &format!("{p}.function"))?.unwrap_or(t);
        if opt_str(t, "type", &format!("{p}.type"))?.is_some_and(|ty| ty != "function") {
            continue;
        }
        tools.push(ToolSpec {
            name: req_str(f, "name", &format!("{p}.function.name"))?.to_string(),
            description: opt_str(f, "description", &format!("{p}.function.description"))?
                .unwrap_or("")
                .to_string(),
            parameters: f
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object"})),
        });
    }
    Ok(tools)
}

pub fn parse_tool_choice(body: &Obj) -> Result<ToolChoice, CallError> {
    Ok(match body.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Any,
            "none" => ToolChoice::None,
            other => {
                return Err(bad(format!(
                    "tool_choice: {other:?} is not one of auto, required, none"
                )));
            }
        },
        Some(Value::Object(o)) => {
            let f = opt_obj(o, "function", "tool_choice.function")?.unwrap_or(o);
            ToolChoice::Tool(req_str(f, "name", "tool_choice.function.name")?.to_string())
        }
        Some(_) => return Err(bad("tool_choice: expected a string or an object")),
    })
}

pub fn parse(body: &Obj, default_max: u32) -> Result<ChatRequest, CallError> {
    let model = req_str(body, "model", "model")?.to_string();
    let list = req_array(body, "messages", "messages")?;
    if list.is_empty() {
        return Err(bad("messages: at least one message is required"));
    }
    if opt_u64(body, "n", "n")?.is_some_and(|n| n != 1) {
        return Err(bad("n: only one choice per request is supported"));
    }
    let mut messages = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages.{i}");
        let m = as_obj(m, &p)?;
        let content = content_text(m.get("content"), &format!("{p}.content"))?;
        let msg = match req_str(m, "role", &format!("{p}.role"))? {
            "system" | "developer" => Message::text(Role::System, content),
            "user" => Message::text(Role::User, content),
            "assistant" => {
                let mut a = Message::text(Role::Assistant, content);
                a.tool_calls = tool_calls(m, &format!("{p}.tool_calls"))?;
                a.reasoning = opt_str(m, "reasoning_content", &format!("{p}.reasoning_content"))?
                    .map(str::to_string);
                a
            }
            "tool" => {
                let mut t = Message::text(Role::Tool, content);
                t.tool_call_id =
                    Some(req_str(m, "tool_call_id", &format!("{p}.tool_call_id"))?.to_string());
                t
            }
            other => {
                return Err(bad(format!(
                    "{p}.role: {other:?} is not one of system, developer, user, assistant, tool"
                )));
            }
        };
        messages.push(msg);
    }
    let max_tokens = opt_u64(body, "max_completion_tokens", "max_completion_tokens")?
        .or(opt_u64(body, "max_tokens", "max_tokens")?)
        .map(|n| n.min(u32::MAX as u64) as u32)
        .unwrap_or(default_max);
    if max_tokens == 0 {
        return Err(bad("max_tokens: must be at least 1"));
    }
    Ok(ChatRequest {
        model,
        messages,
        tools: parse_tools(body)?,
        tool_choice: parse_tool_choice(body)?,
        stop: str_or_list(body, "stop", "stop")?,
        params: SamplingParams {
            max_tokens,
            temperature: opt_f32(body, "temperature", "temperature")?,
            top_p: opt_f32(body, "top_p", "top_p")?,
            top_k: None,
            seed: opt_u64(body, "seed", "seed")?,
        },
        stream: opt_bool(body, "stream", "stream")?.unwrap_or(false),
    })
}

/// Options only Chat Completions has.
pub struct ChatOptions {
    pub include_usage: bool,
    pub logprobs: bool,
}

pub fn options(body: &Obj) -> Result<ChatOptions, CallError> {
    let include_usage = match opt_obj(body, "stream_options", "stream_options")? {
        Some(o) => opt_bool(o, "include_usage", "stream_options.include_usage")?.unwrap_or(false),
        None => false,
    };
    let logprobs = opt_bool(body, "logprobs", "logprobs")?.unwrap_or(false);
    opt_u64(body, "top_logprobs", "top_logprobs")?;
    Ok(ChatOptions {
        include_usage,
        logprobs,
    })
}

fn finish_reason(s: &Stop) -> &'static str {
    match s {
        Stop::EndTurn | Stop::StopSequence(_) => "stop",
        Stop::ToolUse => "tool_calls",
        Stop::MaxTokens => "length",
    }
}

fn usage(o: &Outcome) -> Value {
    json!({"prompt_tokens": o.input_tokens, "completion_tokens": o.output_tokens,
           "total_tokens": o.input_tokens + o.output_tokens})
}

fn calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

fn token_json(text: &str, logprob: f32) -> Value {
    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes(), "top_logprobs": []})
}

fn logprobs_json(tok: &Tokenizer, o: &Outcome) -> Value {
    let content: Vec<Value> = o
        .output_ids
        .iter()
        .zip(&o.output_logprobs)
        .map(|(&id, &lp)| token_json(&tok.decode(&[id]), lp))
        .collect();
    json!({"content": content})
}

pub fn response(
    id: &str,
    model: &str,
    created: u64,
    o: &Outcome,
    opts: &ChatOptions,
    tok: &Tokenizer,
) -> Value {
    let mut message = json!({"role": "assistant",
        "content": if o.reply.content.is_empty() && !o.reply.tool_calls.is_empty() { Value::Null } else { json!(o.reply.content) }});
    if let Some(r) = &o.reply.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if !o.reply.tool_calls.is_empty() {
        message["tool_calls"] = json!(calls_json(&o.reply.tool_calls));
    }
    let logprobs = if opts.logprobs {
        logprobs_json(tok, o)
    } else {
        Value::Null
    };
    json!({"id": id, "object": "chat.completion", "created": created, "model": model,
           "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                        "finish_reason": finish_reason(&o.stop)}],
           "usage": usage(o)})
}

pub fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Streamed chunks. With `logprobs`, each chunk carries the log-probs of
/// the tokens sampled since the previous chunk (the finish chunk those
/// left, such as the end-of-turn token), so a stream's log-probs are
/// exactly the output's, as in the non-streamed response.
pub struct ChunkWriter {
    id: String,
    model: String,
    created: u64,
    calls: usize,
    logprobs: Option<Vec<SampledToken>>,
}

impl ChunkWriter {
    pub fn new(id: &str, model: &str, created: u64, logprobs: bool) -> ChunkWriter {
        ChunkWriter {
            id: id.to_string(),
            model: model.to_string(),
            created,
            calls: 0,
            logprobs: logprobs.then(Vec::new),
        }
    }

    pub fn start(&mut self) -> Vec<Bytes> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)]
    }

    fn chunk(&mut self, delta: Value, finish: Value) -> Bytes {
        let logprobs = match &mut self.logprobs {
            Some(pending) => {
                let content: Vec<Value> = pending
                    .drain(..)
                    .map(|t| token_json(&t.text, t.logprob))
                    .collect();
                json!({"content": content})
            }
            None => Value::Null,
        };
        data(
            &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}),
        )
    }

    pub fn delta(&mut self, d: &Delta) -> Vec<Bytes> {
        let delta = match d {
            Delta::Token(t) => {
                if let Some(pending) = &mut self.logprobs {
                    pending.push(t.clone());
                }
                return Vec::new();
            }
            Delta::Text(t) => json!({"content": t}),
            Delta::Thinking(t) => json!({"reasoning_content": t}),
            Delta::Call(c) => {
                self.calls += 1;
                json!({"tool_calls": [{"index": self.calls - 1, "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}}]})
            }
        };
        vec![self.chunk(delta, Value::Null)]
    }

    pub fn finish(&mut self, o: &Outcome, include_usage: bool) -> Vec<Bytes> {
        let mut out = vec![self.chunk(json!({}), json!(finish_reason(&o.stop)))];
        if include_usage {
            out.push(data(
                &json!({"id": self.id, "object": "chat.completion.chunk",
                "created": self.created, "model": self.model, "choices": [], "usage": usage(o)}),
            ));
        }
        out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_messages_parse_and_errors_name_fields() {
        let body = json!({"model": "m", "max_completion_tokens": 5, "stop": "X",
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "developer", "content": "d"},
                {"role": "user", "content": [{"type": "text", "text": "u"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
        let o = body.as_object().unwrap();
        let r = parse(o, 9).unwrap();
        assert_eq!(r.params.max_tokens, 5);
        assert_eq!(r.stop, ["X"]);
        assert_eq!(r.messages[2].tool_calls[0].name, "f");
        assert!(options(o).unwrap().include_usage);
        let bad = json!({"model": "m", "messages": [{"role": "tool", "content": "r"}]});
        let e = parse(bad.as_object().unwrap(), 9).unwrap_err();
        assert!(
            e.message()
                .contains("messages.0.tool_call_id: field required")
        );
    }
}
