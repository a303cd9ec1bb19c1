//! A toy tokenizer and chat template for synthetic traces.
//!
//! Bytes map to ids `BYTE_BASE + byte`; a few special ids frame messages and
//! tool calls. What matters for the trajectory plane is only that rendering
//! is deterministic and that an assistant message in a later history renders
//! to exactly the generation prompt plus the tokens the model produced, as a
//! real chat template does when the payload is restored.

use super::super::tool_cache::{ChatMessage, Role, ToolCall};

pub const IM_START: u32 = 1;
pub const IM_END: u32 = 2;
pub const ROLE_SYSTEM: u32 = 3;
pub const ROLE_USER: u32 = 4;
pub const ROLE_ASSISTANT: u32 = 5;
pub const ROLE_TOOL: u32 = 6;
pub const CALL_START: u32 = 7;
pub const CALL_END: u32 = 8;
pub const SEP: u32 = 9;
pub const BYTE_BASE: u32 = 32;
/// Ids are below this.
pub const VOCAB: u32 = BYTE_BASE + 256;

pub fn encode_text(s: &str, out: &mut Vec<u32>) {
    out.extend(s.bytes().map(|b| BYTE_BASE + u32::from(b)));
}

pub fn encode(s: &str) -> Vec<u32> {
    let mut v = Vec::with_capacity(s.len());
    encode_text(s, &mut v);
    v
}

fn role_token(r: Role) -> u32 {
    match r {
        Role::System => ROLE_SYSTEM,
        Role::User => ROLE_USER,
        Role::Assistant => ROLE_ASSISTANT,
        Role::Tool => ROLE_TOOL,
    }
}

/// The payload text of a tool call, arguments inserted verbatim.
pub fn call_text(c: &ToolCall) -> String {
    format!(
        "{{\"id\":{},\"name\":{},\"arguments\":{}}}",
        serde_json::Value::String(c.id.clone()),
        serde_json::Value::String(c.name.clone()),
        c.arguments
    )
}

/// What follows the generation prompt: content, tool calls, end of turn.
pub fn render_output(content: &str, calls: &[ToolCall], out: &mut Vec<u32>) {
    encode_text(content, out);
    for c in calls {
        out.push(CALL_START);
        encode_text(&call_text(c), out);
        out.push(CALL_END);
    }
    out.push(IM_END);
}

pub const GENERATION_PROMPT: [u32; 2] = [IM_START, ROLE_ASSISTANT];

pub fn render_message(m: &ChatMessage, out: &mut Vec<u32>) {
    out.push(IM_START);
    out.push(role_token(m.role));
    if let Some(id) = &m.tool_call_id {
        encode_text(id, out);
        out.push(SEP);
    }
    render_output(&m.content, &m.tool_calls, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assistant_history_equals_prompt_plus_output() {
        let calls = vec![ToolCall {
            id: "c1".into(),
            name: "bash".into(),
            arguments: r#"{"command":"ls"}"#.into(),
        }];
        let mut out = GENERATION_PROMPT.to_vec();
        render_output("hi", &calls, &mut out);
        let mut hist = Vec::new();
        render_message(
            &ChatMessage {
                role: Role::Assistant,
                content: "hi".into(),
                tool_calls: calls,
                tool_call_id: None,
            },
            &mut hist,
        );
        assert_eq!(out, hist);
        assert!(hist.iter().all(|&t| t < VOCAB));
    }
}
