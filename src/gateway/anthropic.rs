//! Anthropic Messages API: `POST /v1/messages` (plain and streamed, with
//! the exact event sequence) and `/v1/messages/count_tokens`, errors as
//! `{"type":"error","error":{…}}`. Fields Gyre does not use (thinking,
//! context_management, output_config, cache_control, metadata, betas) are
//! accepted and ignored.

use bytes::Bytes;
use serde_json::{Value, json};

use super::chat::{ChatRequest, Message, Role, ToolCall, ToolChoice, ToolSpec};
use super::engine::SamplingParams;
use super::fields::*;
use super::service::CallError;
use super::turn::{Delta, Outcome, Stop};

pub fn error_body(e: &CallError) -> Value {
    let kind = match e {
        CallError::InvalidRequest(_) => "invalid_request_error",
        CallError::Authentication(_) => "authentication_error",
        CallError::Permission(_) => "permission_error",
        CallError::NotFound(_) => "not_found_error",
        CallError::TooLarge(_) => "request_too_large",
        CallError::Overloaded(_) => "overloaded_error",
        CallError::Timeout(_) | CallError::Internal(_) => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message()}})
}

/// Text of a string or a list of blocks (text only; images refused).
fn text_of(v: &Value, path: &str) -> Result<String, CallError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let p = format!("{path}.{i}");
                let b = as_obj(b, &p)?;
                match req_str(b, "type", &format!("{p}.type"))? {
                    "text" => parts.push(req_str(b, "text", &format!("{p}.text"))?.to_string()),
                    "image" | "document" => return Err(no_vision(&p)),
                    other => {
                        return Err(bad(format!(
                            "{p}: block type {other:?} is not allowed here"
                        )));
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        other => Err(bad(format!(
            "{path}: expected a string or an array of content blocks, got {other}"
        ))),
    }
}

fn no_vision(path: &str) -> CallError {
    bad(format!(
        "{path}: image and document input is not supported: the model has no vision"
    ))
}

fn user_blocks(blocks: &[Value], path: &str, out: &mut Vec<Message>) -> Result<(), CallError> {
    let mut text = Vec::new();
    let mut any_result = false;
    for (i, b) in blocks.iter().enumerate() {
        let p = format!("{path}.{i}");
        let b = as_obj(b, &p)?;
        match req_str(b, "type", &format!("{p}.type"))? {
            "text" => text.push(req_str(b, "text", &format!("{p}.text"))?.to_string()),
            "tool_result" => {
                any_result = true;
                let id = req_str(b, "tool_use_id", &format!("{p}.tool_use_id"))?;
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{p}.content"))?,
                };
                let mut m = Message::text(Role::Tool, content);
                m.tool_call_id = Some(id.to_string());
                m.is_error = opt_bool(b, "is_error", &format!("{p}.is_error"))?.unwrap_or(false);
                out.push(m);
            }
            "image" | "document" => return Err(no_vision(&p)),
            "thinking" | "redacted_thinking" => {}
            other => {
                return Err(bad(format!(
                    "{p}: block type {other:?} is not allowed in a user message"
                )));
            }
        }
    }
    if !text.is_empty() || !any_result {
        out.push(Message::text(Role::User, text.join("\n")));
    }
    Ok(())
}

fn assistant_blocks(blocks: &[Value], path: &str) -> Result<Message, CallError> {
    let mut m = Message::text(Role::Assistant, "");
    let mut text = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let p = format!("{path}.{i}");
        let b = as_obj(b, &p)?;
        match req_str(b, "type", &format!("{p}.type"))? {
            "text" => text.push(req_str(b, "text", &format!("{p}.text"))?.to_string()),
            "thinking" => {
                m.reasoning = Some(req_str(b, "thinking", &format!("{p}.thinking"))?.to_string())
            }
            "redacted_thinking" => {}
            "tool_use" => {
                let input = b.get("input").cloned().unwrap_or(json!({}));
                if !input.is_object() {
                    return Err(bad(format!("{p}.input: expected an object")));
                }
                m.tool_calls.push(ToolCall {
                    id: req_str(b, "id", &format!("{p}.id"))?.to_string(),
                    name: req_str(b, "name", &format!("{p}.name"))?.to_string(),
                    arguments: input.to_string(),
                });
            }
            other => {
                return Err(bad(format!(
                    "{p}: block type {other:?} is not allowed in an assistant message"
                )));
            }
        }
    }
    m.content = text.join("\n");
    Ok(m)
}

/// Parses a Messages request; `need_max_tokens` is false for count_tokens.
pub fn parse(
    body: &Obj,
    default_max: u32,
    need_max_tokens: bool,
) -> Result<ChatRequest, CallError> {
    let model = req_str(body, "model", "model")?.to_string();
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|v| !v.is_null()) {
        messages.push(Message::text(Role::System, text_of(system, "system")?));
    }
    let list = req_array(body, "messages", "messages")?;
    if list.is_empty() {
        return Err(bad("messages: at least one message is required"));
    }
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages.{i}");
        let m = as_obj(m, &p)?;
        let content = m
            .get("content")
            .ok_or_else(|| bad(format!("{p}.content: field required")))?;
        let cp = format!("{p}.content");
        match req_str(m, "role", &format!("{p}.role"))? {
            "user" => match content {
                Value::String(s) => messages.push(Message::text(Role::User, s.clone())),
                Value::Array(b) => user_blocks(b, &cp, &mut messages)?,
                _ => {
                    return Err(bad(format!(
                        "{cp}: expected a string or an array of content blocks"
                    )));
                }
            },
            "assistant" => messages.push(match content {
                Value::String(s) => Message::text(Role::Assistant, s.clone()),
                Value::Array(b) => assistant_blocks(b, &cp)?,
                _ => {
                    return Err(bad(format!(
                        "{cp}: expected a string or an array of content blocks"
                    )));
                }
            }),
            "system" => messages.push(Message::text(Role::System, text_of(content, &cp)?)),
            other => {
                return Err(bad(format!(
                    "{p}.role: {other:?} is not one of user, assistant, system"
                )));
            }
        }
    }
    let mut tools = Vec::new();
    for (i, t) in opt_array(body, "tools", "tools")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("tools.{i}");
        let t = as_obj(t, &p)?;
        let name = req_str(t, "name", &format!("{p}.name"))?;
        let Some(schema) = t.get("input_schema") else {
            // Server tools (web search and the like) have a type and no schema.
            continue;
        };
        tools.push(ToolSpec {
            name: name.to_string(),
            description: opt_str(t, "description", &format!("{p}.description"))?
                .unwrap_or("")
                .to_string(),
            parameters: schema.clone(),
        });
    }
    let tool_choice = match opt_obj(body, "tool_choice", "tool_choice")? {
        None => ToolChoice::Auto,
        Some(c) => match req_str(c, "type", "tool_choice.type")? {
            "auto" => ToolChoice::Auto,
            "any" => ToolChoice::Any,
            "none" => ToolChoice::None,
            "tool" => ToolChoice::Tool(req_str(c, "name", "tool_choice.name")?.to_string()),
            other => {
                return Err(bad(format!(
                    "tool_choice.type: {other:?} is not one of auto, any, tool, none"
                )));
            }
        },
    };
    let max_tokens = match opt_u64(body, "max_tokens", "max_tokens")? {
        Some(0) => return Err(bad("max_tokens: must be at least 1")),
        Some(n) => n.min(u32::MAX as u64) as u32,
        None if need_max_tokens => return Err(bad("max_tokens: field required")),
        None => default_max,
    };
    Ok(ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        stop: str_or_list(body, "stop_sequences", "stop_sequences")?,
        params: SamplingParams {
            max_tokens,
            temperature: opt_f32(body, "temperature", "temperature")?,
            top_p: opt_f32(body, "top_p", "top_p")?,
            top_k: opt_u64(body, "top_k", "top_k")?.map(|k| k as u32),
            seed: None,
        },
        stream: opt_bool(body, "stream", "stream")?.unwrap_or(false),
    })
}

fn stop_reason(s: &Stop) -> (&'static str, Value) {
    match s {
        Stop::EndTurn => ("end_turn", Value::Null),
        Stop::ToolUse => ("tool_use", Value::Null),
        Stop::MaxTokens => ("max_tokens", Value::Null),
        Stop::StopSequence(q) => ("stop_sequence", json!(q)),
    }
}

pub fn message_id(execution: &str, call_index: u64) -> String {
    format!("msg_{}_{call_index}", execution.trim_start_matches("ex-"))
}

/// The non-streamed response.
pub fn response(id: &str, model: &str, o: &Outcome) -> Value {
    let mut content = Vec::new();
    if let Some(r) = &o.reply.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": "gyre"}));
    }
    if !o.reply.content.is_empty() {
        content.push(json!({"type": "text", "text": o.reply.content}));
    }
    for c in &o.reply.tool_calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
    }
    let (reason, seq) = stop_reason(&o.stop);
    json!({"id": id, "type": "message", "role": "assistant", "model": model,
           "content": content, "stop_reason": reason, "stop_sequence": seq,
           "usage": {"input_tokens": o.input_tokens, "output_tokens": o.output_tokens}})
}

pub fn frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// Streamed event writer: blocks open and close as deltas change kind.
pub struct StreamWriter {
    id: String,
    model: String,
    index: usize,
    open: Option<Open>,
}

impl StreamWriter {
    pub fn new(id: &str, model: &str) -> StreamWriter {
        StreamWriter {
            id: id.to_string(),
            model: model.to_string(),
            index: 0,
            open: None,
        }
    }

    pub fn start(&mut self, input_tokens: usize) -> Vec<Bytes> {
        let msg = json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
        vec![
            frame("message_start", &msg),
            frame("ping", &json!({"type": "ping"})),
        ]
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        if let Some(kind) = self.open.take() {
            if kind == Open::Thinking {
                out.push(frame("content_block_delta", &json!({"type": "content_block_delta",
                    "index": self.index, "delta": {"type": "signature_delta", "signature": "gyre"}})));
            }
            out.push(frame(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn open(&mut self, kind: Open, block: Value, out: &mut Vec<Bytes>) {
        if self.open != Some(kind) {
            self.close(out);
            out.push(frame(
                "content_block_start",
                &json!({"type": "content_block_start",
                "index": self.index, "content_block": block}),
            ));
            self.open = Some(kind);
        }
    }

    pub fn delta(&mut self, d: &Delta) -> Vec<Bytes> {
        let mut out = Vec::new();
        match d {
            Delta::Thinking(t) => {
                self.open(
                    Open::Thinking,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    &mut out,
                );
                out.push(frame(
                    "content_block_delta",
                    &json!({"type": "content_block_delta",
                    "index": self.index, "delta": {"type": "thinking_delta", "thinking": t}}),
                ));
            }
            Delta::Text(t) => {
                self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
                out.push(frame(
                    "content_block_delta",
                    &json!({"type": "content_block_delta",
                    "index": self.index, "delta": {"type": "text_delta", "text": t}}),
                ));
            }
            Delta::Call(c) => {
                self.close(&mut out);
                out.push(frame("content_block_start", &json!({"type": "content_block_start",
                    "index": self.index,
                    "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
                out.push(frame("content_block_delta", &json!({"type": "content_block_delta",
                    "index": self.index, "delta": {"type": "input_json_delta", "partial_json": c.arguments}})));
                out.push(frame(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": self.index}),
                ));
                self.index += 1;
            }
            Delta::Token(_) => {}
        }
        out
    }

    pub fn finish(&mut self, o: &Outcome) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.close(&mut out);
        let (reason, seq) = stop_reason(&o.stop);
        out.push(frame(
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": {"input_tokens": o.input_tokens, "output_tokens": o.output_tokens}}),
        ));
        out.push(frame("message_stop", &json!({"type": "message_stop"})));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Obj {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn claude_code_shapes_parse() {
        let body = obj(json!({
        "model": "claude-opus", "max_tokens": 128000, "stream": true,
        "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
        "output_config": {"effort": "medium"}, "metadata": {"user_id": "{}"},
        "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "b"}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "env"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": "ok"}], "is_error": true, "cache_control": {}}]}
        ]}));
        let r = parse(&body, 10, true).unwrap();
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::System,
                Role::Assistant,
                Role::Tool
            ]
        );
        assert_eq!(r.messages[0].content, "a\nb");
        assert_eq!(r.messages[3].tool_calls[0].arguments, r#"{"c":1}"#);
        assert!(r.messages[4].is_error);
        assert_eq!(r.tools.len(), 1);
        assert!(r.stream);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                json!({"max_tokens": 1, "messages": []}),
                "model: field required",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens: field required",
            ),
            (
                json!({"model": "m", "max_tokens": "1", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens: expected an integer",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "bot", "content": "x"}]}),
                "messages.0.role",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {}}]}]}),
                "no vision",
            ),
        ];
        for (body, want) in cases {
            let e = parse(&obj(body), 1, true).unwrap_err();
            assert!(e.message().contains(want), "{} !~ {want}", e.message());
            assert_eq!(e.status(), 400);
        }
    }
}
