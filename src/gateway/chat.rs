//! The gateway's API-neutral request: what the Anthropic and OpenAI front
//! ends parse into and what rendering, history matching and recording use.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::engine::SamplingParams;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A tool call: `arguments` is JSON text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message, flattened to text the way HF chat templates take it.
/// Serialised as the Responses store keeps conversations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The assistant's reasoning, when the client sent it back.
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// For a tool response: the call it answers.
    pub tool_call_id: Option<String>,
    /// For a tool response: the client marked it as an error.
    pub is_error: bool,
}

impl Message {
    pub fn text(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
        }
    }
}

/// A tool the client offers.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    /// Must call some tool.
    Any,
    /// Must call this tool.
    Tool(String),
    None,
}

/// A parsed request, whichever API it came through.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    pub stop: Vec<String>,
    pub params: SamplingParams,
    pub stream: bool,
}
