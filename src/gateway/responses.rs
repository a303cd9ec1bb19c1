//! OpenAI Responses: `POST /v1/responses` with instructions, input items
//! (message, function_call, function_call_output), tools, and
//! `previous_response_id` resolved against the responses this execution
//! stored; streamed as `response.created` … `response.output_text.delta`,
//! `response.function_call_arguments.delta`, `response.output_item.done`,
//! `response.completed`. Errors use OpenAI's shape.

use bytes::Bytes;
use serde_json::{Value, json};

use super::chat::{ChatRequest, Message, Role, ToolCall};
use super::engine::SamplingParams;
use super::fields::*;
use super::openai::{parse_tool_choice, parse_tools};
use super::service::CallError;
use super::turn::{Delta, Outcome, Stop};

pub struct ResponsesOptions {
    pub previous_response_id: Option<String>,
    pub store: bool,
}

/// Appends one input item; consecutive function calls join one assistant turn.
fn push_item(item: &Obj, path: &str, out: &mut Vec<Message>) -> Result<(), CallError> {
    let kind = opt_str(item, "type", &format!("{path}.type"))?.unwrap_or("message");
    match kind {
        "message" => {
            let text =
                super::openai::content_text(item.get("content"), &format!("{path}.content"))?;
            let role = match req_str(item, "role", &format!("{path}.role"))? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" | "developer" => Role::System,
                other => {
                    return Err(bad(format!(
                        "{path}.role: {other:?} is not one of user, assistant, system, developer"
                    )));
                }
            };
            out.push(Message::text(role, text));
        }
        "function_call" => {
            let call = ToolCall {
                id: req_str(item, "call_id", &format!("{path}.call_id"))?.to_string(),
                name: req_str(item, "name", &format!("{path}.name"))?.to_string(),
                arguments: req_str(item, "arguments", &format!("{path}.arguments"))?.to_string(),
            };
            match out.last_mut() {
                Some(m) if m.role == Role::Assistant => m.tool_calls.push(call),
                _ => {
                    let mut m = Message::text(Role::Assistant, "");
                    m.tool_calls.push(call);
                    out.push(m);
                }
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                other => super::openai::content_text(other, &format!("{path}.output"))?,
            };
            let mut m = Message::text(Role::Tool, output);
            m.tool_call_id =
                Some(req_str(item, "call_id", &format!("{path}.call_id"))?.to_string());
            out.push(m);
        }
        "reasoning" => {}
        other => {
            return Err(bad(format!(
                "{path}.type: input item type {other:?} is not supported"
            )));
        }
    }
    Ok(())
}

/// Parses a Responses request; `previous` yields a stored conversation.
pub fn parse(
    body: &Obj,
    default_max: u32,
    previous: &dyn Fn(&str) -> Result<Vec<Message>, CallError>,
) -> Result<(ChatRequest, ResponsesOptions), CallError> {
    let model = req_str(body, "model", "model")?.to_string();
    let previous_response_id =
        opt_str(body, "previous_response_id", "previous_response_id")?.map(str::to_string);
    let mut messages = match &previous_response_id {
        Some(id) => previous(id)?,
        None => Vec::new(),
    };
    if let Some(instructions) = opt_str(body, "instructions", "instructions")? {
        if messages.first().is_some_and(|m| m.role == Role::System) {
            messages[0] = Message::text(Role::System, instructions);
        } else {
            messages.insert(0, Message::text(Role::System, instructions));
        }
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(Message::text(Role::User, s.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let p = format!("input.{i}");
                push_item(as_obj(item, &p)?, &p, &mut messages)?;
            }
        }
        None | Some(Value::Null) => return Err(bad("input: field required")),
        Some(_) => return Err(bad("input: expected a string or an array of input items")),
    }
    let max_tokens = match opt_u64(body, "max_output_tokens", "max_output_tokens")? {
        Some(0) => return Err(bad("max_output_tokens: must be at least 1")),
        Some(n) => n.min(u32::MAX as u64) as u32,
        None => default_max,
    };
    let req = ChatRequest {
        model,
        messages,
        tools: parse_tools(body)?,
        tool_choice: parse_tool_choice(body)?,
        stop: Vec::new(),
        params: SamplingParams {
            max_tokens,
            temperature: opt_f32(body, "temperature", "temperature")?,
            top_p: opt_f32(body, "top_p", "top_p")?,
            top_k: None,
            seed: None,
        },
        stream: opt_bool(body, "stream", "stream")?.unwrap_or(false),
    };
    let store = opt_bool(body, "store", "store")?.unwrap_or(true);
    Ok((
        req,
        ResponsesOptions {
            previous_response_id,
            store,
        },
    ))
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{id}"),
           "summary": [{"type": "summary_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant",
           "content": if status == "completed" {
               json!([{"type": "output_text", "text": text, "annotations": []}]) } else { json!([]) }})
}

fn call_item(c: &ToolCall, status: &str, arguments: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", c.id), "call_id": c.id, "name": c.name,
           "arguments": arguments, "status": status})
}

/// The response object; `o` is None while in progress.
pub fn response_object(
    id: &str,
    model: &str,
    created: u64,
    previous: &Option<String>,
    o: Option<&Outcome>,
) -> Value {
    let (status, output, usage, incomplete) = match o {
        None => ("in_progress", json!([]), Value::Null, Value::Null),
        Some(o) => {
            let mut output = Vec::new();
            if let Some(r) = &o.reply.reasoning {
                output.push(reasoning_item(id, r));
            }
            if !o.reply.content.is_empty() {
                output.push(message_item(id, &o.reply.content, "completed"));
            }
            for c in &o.reply.tool_calls {
                output.push(call_item(c, "completed", &c.arguments));
            }
            let (status, incomplete) = match o.stop {
                Stop::MaxTokens => ("incomplete", json!({"reason": "max_output_tokens"})),
                _ => ("completed", Value::Null),
            };
            let usage = json!({"input_tokens": o.input_tokens, "output_tokens": o.output_tokens,
                "total_tokens": o.input_tokens + o.output_tokens,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}});
            (status, json!(output), usage, incomplete)
        }
    };
    json!({"id": id, "object": "response", "created_at": created, "status": status, "model": model,
           "output": output, "usage": usage, "incomplete_details": incomplete, "error": null,
           "previous_response_id": previous, "parallel_tool_calls": true, "tool_choice": "auto",
           "tools": [], "text": {"format": {"type": "text"}}})
}

#[derive(PartialEq)]
enum Open {
    None,
    Message,
}

/// Streamed events; reasoning is sent as a whole item when it ends.
pub struct EventWriter {
    id: String,
    model: String,
    created: u64,
    previous: Option<String>,
    seq: u64,
    index: usize,
    open: Open,
    text: String,
    thinking: String,
}

impl EventWriter {
    pub fn new(id: &str, model: &str, created: u64, previous: Option<String>) -> EventWriter {
        EventWriter {
            id: id.to_string(),
            model: model.to_string(),
            created,
            previous,
            seq: 0,
            index: 0,
            open: Open::None,
            text: String::new(),
            thinking: String::new(),
        }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    }

    pub fn previous(&self) -> &Option<String> {
        &self.previous
    }

    pub fn start(&mut self) -> Vec<Bytes> {
        let r = response_object(&self.id, &self.model, self.created, &self.previous, None);
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn flush_thinking(&mut self, out: &mut Vec<Bytes>) {
        if self.thinking.is_empty() {
            return;
        }
        let item = reasoning_item(&self.id, &std::mem::take(&mut self.thinking));
        let i = self.index;
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        ));
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        ));
        self.index += 1;
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        if self.open != Open::Message {
            return;
        }
        self.open = Open::None;
        let text = std::mem::take(&mut self.text);
        let (i, item_id) = (self.index, format!("msg_{}", self.id));
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": i, "content_index": 0, "text": text}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": i, "content_index": 0, "part": part}),
        ));
        let item = message_item(&self.id, &text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        ));
        self.index += 1;
    }

    pub fn delta(&mut self, d: &Delta) -> Vec<Bytes> {
        let mut out = Vec::new();
        match d {
            Delta::Thinking(t) => self.thinking.push_str(t),
            Delta::Token(_) => {}
            Delta::Text(t) => {
                self.flush_thinking(&mut out);
                let (i, item_id) = (self.index, format!("msg_{}", self.id));
                if self.open != Open::Message {
                    self.open = Open::Message;
                    let item = message_item(&self.id, "", "in_progress");
                    out.push(self.event(
                        "response.output_item.added",
                        json!({"output_index": i, "item": item}),
                    ));
                    out.push(self.event(
                        "response.content_part.added",
                        json!({"item_id": item_id, "output_index": i, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}),
                    ));
                }
                self.text.push_str(t);
                out.push(self.event(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "delta": t}),
                ));
            }
            Delta::Call(c) => {
                self.flush_thinking(&mut out);
                self.close_message(&mut out);
                let i = self.index;
                let item_id = format!("fc_{}", c.id);
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": i, "item": call_item(c, "in_progress", "")}),
                ));
                out.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": i, "delta": c.arguments}),
                ));
                out.push(self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": i, "arguments": c.arguments}),
                ));
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": i, "item": call_item(c, "completed", &c.arguments)}),
                ));
                self.index += 1;
            }
        }
        out
    }

    pub fn finish(&mut self, o: &Outcome) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.flush_thinking(&mut out);
        self.close_message(&mut out);
        let r = response_object(&self.id, &self.model, self.created, &self.previous, Some(o));
        let kind = if r["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({"response": r})));
        out
    }

    pub fn error(&mut self, e: &CallError) -> Vec<Bytes> {
        vec![self.event(
            "error",
            json!({"code": null, "message": e.message(), "param": null}),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_messages() {
        let body = json!({"model": "m", "instructions": "sys", "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"},
            {"type": "function_call_output", "call_id": "c2", "output": "r2"}]});
        let none = |_: &str| Err(bad("none"));
        let (r, o) = parse(body.as_object().unwrap(), 9, &none).unwrap();
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(r.messages[2].tool_calls.len(), 2);
        assert!(o.store);
        let body = json!({"model": "m", "previous_response_id": "resp_x", "input": "more"});
        assert!(parse(body.as_object().unwrap(), 9, &none).is_err());
    }
}
