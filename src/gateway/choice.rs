//! `tool_choice` enforcement (Anthropic auto/any/tool/none, OpenAI
//! auto/required/named/none), as far as an engine that only takes prompt
//! ids allows:
//!
//! - `none`: the tools are left out of the render, so the model is not
//!   offered them;
//! - `any`/`required` and a named tool: the assistant turn is started for
//!   the model with the opening of a tool call, exactly as the model's own
//!   chat template writes one (rendered from the template: what it writes
//!   after the generation prompt up to the tool's name, or up to the
//!   arguments for a named tool). Those forced tokens end the call's input
//!   ids (they are the proxy's, not sampled), the model samples the rest,
//!   and the output parser reads forced text + output, so the reply is that
//!   call. Arguments stay the model's: a call that does not parse is text,
//!   as everywhere in the gateway (no grammar-constrained decoding here).
//!
//! A named tool missing from `tools`, or any/required without tools, is a
//! 400 naming the field.

use super::chat::{Message, Role, ToolCall, ToolChoice, ToolSpec};
use super::parse::ToolFormat;
use super::service::CallError;
use super::template::ChatTemplate;

const NAME_MARK: &str = "GYRE_FORCED_TOOL_NAME";
const ARGS_MARK: &str = "GYRE_FORCED_TOOL_ARGUMENTS";

/// What a call's `tool_choice` does to its prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Render without the tools.
    pub hide_tools: bool,
    /// Text that starts the assistant's turn (empty: none).
    pub forced: String,
}

/// The rules above for one request.
pub fn enforce(
    choice: &ToolChoice,
    tools: &[ToolSpec],
    template: &ChatTemplate,
    format: ToolFormat,
) -> Result<Enforced, CallError> {
    let name = match choice {
        ToolChoice::Auto => return Ok(Enforced::default()),
        ToolChoice::None => {
            return Ok(Enforced {
                hide_tools: true,
                forced: String::new(),
            });
        }
        ToolChoice::Any if tools.is_empty() => {
            return Err(CallError::InvalidRequest(
                "tool_choice: a tool call is required but the request offers no tools".into(),
            ));
        }
        ToolChoice::Any if tools.len() == 1 => Some(tools[0].name.as_str()),
        ToolChoice::Any => None,
        ToolChoice::Tool(n) => {
            if !tools.iter().any(|t| &t.name == n) {
                return Err(CallError::InvalidRequest(format!(
                    "tool_choice: the tool {n:?} is not among the request's tools"
                )));
            }
            Some(n.as_str())
        }
    };
    let forced = from_template(template, tools, name).unwrap_or_else(|| fallback(format, name));
    Ok(Enforced {
        hide_tools: false,
        forced,
    })
}

/// What the template writes between the generation prompt and the named
/// tool's arguments (or the tool's name when any tool will do); `None`
/// when the template does not render that append-only.
fn from_template(
    template: &ChatTemplate,
    tools: &[ToolSpec],
    name: Option<&str>,
) -> Option<String> {
    let user = Message::text(Role::User, "x");
    let prompt = template
        .render(std::slice::from_ref(&user), tools, true)
        .ok()?;
    let mut call = Message::text(Role::Assistant, "");
    call.tool_calls.push(ToolCall {
        id: "call_forced".into(),
        name: name.unwrap_or(NAME_MARK).to_string(),
        arguments: ARGS_MARK.into(),
    });
    let turn = template.render(&[user, call], tools, false).ok()?;
    let rest = turn.strip_prefix(prompt.as_str())?;
    let mark = if name.is_some() { ARGS_MARK } else { NAME_MARK };
    let at = rest.find(mark)?;
    // A template that writes the arguments with tojson quotes the marker.
    let head = &rest[..at];
    let head = if name.is_some() {
        head.strip_suffix('"').unwrap_or(head)
    } else {
        head
    };
    (!head.is_empty()).then(|| head.to_string())
}

fn fallback(format: ToolFormat, name: Option<&str>) -> String {
    match (format, name) {
        (ToolFormat::Hermes, Some(n)) => {
            format!("<tool_call>\n{{\"name\": \"{n}\", \"arguments\": ")
        }
        (ToolFormat::Hermes, None) => "<tool_call>\n{\"name\": \"".into(),
        (ToolFormat::Llama3, Some(n)) => format!("{{\"name\": \"{n}\", \"parameters\": "),
        (ToolFormat::Llama3, None) => "{\"name\": \"".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::parse::{OutputParser, Piece};
    use serde_json::json;

    fn tools() -> Vec<ToolSpec> {
        ["bash", "read"]
            .iter()
            .map(|n| ToolSpec {
                name: n.to_string(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            })
            .collect()
    }

    #[test]
    fn the_forced_opening_is_the_templates_own() {
        let t = ChatTemplate::builtin();
        let named = enforce(
            &ToolChoice::Tool("read".into()),
            &tools(),
            &t,
            ToolFormat::Hermes,
        )
        .unwrap();
        assert_eq!(
            named.forced,
            "<tool_call>\n{\"name\": \"read\", \"arguments\": "
        );
        let any = enforce(&ToolChoice::Any, &tools(), &t, ToolFormat::Hermes).unwrap();
        assert_eq!(any.forced, "<tool_call>\n{\"name\": \"");
        // One tool offered: `any` names it.
        let one = enforce(&ToolChoice::Any, &tools()[..1], &t, ToolFormat::Hermes).unwrap();
        assert!(
            one.forced.ends_with("\"bash\", \"arguments\": "),
            "{}",
            one.forced
        );
        let none = enforce(&ToolChoice::None, &tools(), &t, ToolFormat::Hermes).unwrap();
        assert!(none.hide_tools && none.forced.is_empty());
        assert_eq!(
            enforce(&ToolChoice::Auto, &tools(), &t, ToolFormat::Hermes).unwrap(),
            Enforced::default()
        );
        // The embedded model's own template.
        let e = crate::gateway::embedded::renderer().unwrap().template;
        let named = enforce(
            &ToolChoice::Tool("bash".into()),
            &tools(),
            &e,
            ToolFormat::Hermes,
        )
        .unwrap();
        assert_eq!(
            named.forced,
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": "
        );
    }

    #[test]
    fn forced_text_plus_sampled_arguments_parse_as_the_call() {
        let t = ChatTemplate::builtin();
        let named = enforce(
            &ToolChoice::Tool("bash".into()),
            &tools(),
            &t,
            ToolFormat::Hermes,
        )
        .unwrap();
        let mut p = OutputParser::new(ToolFormat::Hermes);
        let mut pieces = p.push(&named.forced);
        pieces.extend(p.push("{\"cmd\": \"ls\"}}\n</tool_call>"));
        pieces.extend(p.finish());
        let calls: Vec<_> = pieces
            .iter()
            .filter_map(|x| match x {
                Piece::Call(c) => Some((c.name.as_str(), c.arguments.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(calls, [("bash", "{\"cmd\":\"ls\"}")]);
    }

    #[test]
    fn impossible_choices_are_refused_by_field() {
        let t = ChatTemplate::builtin();
        let e = enforce(&ToolChoice::Any, &[], &t, ToolFormat::Hermes).unwrap_err();
        assert!(e.message().starts_with("tool_choice:"), "{e:?}");
        let e = enforce(
            &ToolChoice::Tool("nope".into()),
            &tools(),
            &t,
            ToolFormat::Hermes,
        )
        .unwrap_err();
        assert!(e.message().contains("\"nope\""), "{e:?}");
        assert_eq!(
            fallback(ToolFormat::Llama3, Some("f")),
            "{\"name\": \"f\", \"parameters\": "
        );
    }
}
