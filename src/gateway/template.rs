//! HF chat templates through `minijinja`, set up the way `transformers`
//! renders them: trim_blocks and lstrip_blocks, loop controls, Python string
//! and dict methods (minijinja-contrib's pycompat), `raise_exception`, and a
//! `tojson` that writes what Python's `json.dumps` writes (", " and ": ").

use minijinja::value::Value as JValue;
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::{Value, json};

use super::chat::{Message, ToolSpec};

/// ChatML with hermes tool calls and `<think>` reasoning, append-only: the
/// template of the built-in tokeniser and the script engine.
pub const BUILTIN_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}{{ "\n" }}{{ tool | tojson }}{% endfor %}{{ "\n" }}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content }}
{%- for tc in message.tool_calls %}{% if not loop.first or message.content %}
{% endif %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}{{ "\n" }}<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template failed on this conversation: {0}")]
    Render(String),
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

/// Python's `json.dumps(v, ensure_ascii=False)` (keys in the map's order).
pub fn py_json(v: &Value, indent: Option<usize>, out: &mut String, level: usize) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, val)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                py_json(val, indent, out, level + 1);
            }
            newline(out, level);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, val) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_json(val, indent, out, level + 1);
            }
            newline(out, level);
            out.push(']');
        }
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
    }
}

fn tojson(value: JValue, kwargs: minijinja::value::Kwargs) -> Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<JValue> = kwargs.get("ensure_ascii")?;
    let _: Option<JValue> = kwargs.get("sort_keys")?;
    let _: Option<JValue> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let v: Value = serde_json::to_value(&value)
        .map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    py_json(&v, indent, &mut out, 0);
    Ok(JValue::from_safe_string(out))
}

fn raise_exception(message: String) -> Result<JValue, JError> {
    Err(JError::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    // Templates use it for a date line; a fixed date keeps renders stable,
    // which token-exact history needs more than the calendar.
    format
        .replace("%Y", "2026")
        .replace("%m", "01")
        .replace("%d", "01")
        .replace("%B", "January")
        .replace("%b", "Jan")
}

/// What templates see of a message, in the OpenAI/HF shape they expect.
fn message_value(m: &Message) -> Value {
    let mut v = json!({"role": m.role.as_str(), "content": m.content});
    if let Some(r) = &m.reasoning {
        v["reasoning_content"] = json!(r);
    }
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<Value>(&c.arguments)
                    .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": args}})
            })
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    v
}

fn tool_value(t: &ToolSpec) -> Value {
    json!({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}})
}

impl ChatTemplate {
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError::Compile(format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    pub fn builtin() -> ChatTemplate {
        match Self::new(BUILTIN_TEMPLATE, "", "<|im_end|>") {
            Ok(t) => t,
            // The built-in template is a constant covered by the tests.
            Err(e) => unreachable!("built-in chat template: {e}"),
        }
    }

    pub fn render(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let tools: Option<Vec<Value>> =
            (!tools.is_empty()).then(|| tools.iter().map(tool_value).collect());
        let ctx = json!({
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos,
            "eos_token": self.eos,
        });
        template
            .render(JValue::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| TemplateError::Render(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::chat::{Role, ToolCall};

    #[test]
    fn py_json_matches_python_separators() {
        let v = json!({"a": [1, 2], "b": {"c": "é"}, "d": {}});
        let mut s = String::new();
        py_json(&v, None, &mut s, 0);
        assert_eq!(s, r#"{"a": [1, 2], "b": {"c": "é"}, "d": {}}"#);
    }

    #[test]
    fn builtin_renders_a_tool_turn() {
        let t = ChatTemplate::builtin();
        let mut a = Message::text(Role::Assistant, "");
        a.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "bash".into(),
            arguments: r#"{"cmd":"ls"}"#.into(),
        });
        let mut tool = Message::text(Role::Tool, "a.txt");
        tool.tool_call_id = Some("c1".into());
        let msgs = vec![
            Message::text(Role::System, "sys"),
            Message::text(Role::User, "hi"),
            a,
            tool,
        ];
        let spec = ToolSpec {
            name: "bash".into(),
            description: "run".into(),
            parameters: json!({"type": "object"}),
        };
        let out = t.render(&msgs, &[spec], true).unwrap();
        assert!(
            out.starts_with("<|im_start|>system\nsys\n\n# Tools"),
            "{out}"
        );
        assert!(out.contains(r#"{"function": {"description": "run", "name": "bash", "parameters": {"type": "object"}}, "type": "function"}"#));
        assert!(out.contains("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call><|im_end|>\n"), "{out}");
        assert!(out.ends_with("<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{out}");
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no') }}", "", "").unwrap();
        assert!(matches!(
            t.render(&[], &[], true),
            Err(TemplateError::Render(_))
        ));
        assert!(ChatTemplate::new("{% if %}", "", "").is_err());
    }
}
