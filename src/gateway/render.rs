//! Messages → prompt ids, reusing recorded ids where the history matches.
//!
//! A request whose history extends an earlier call (its messages plus the
//! assistant reply it produced) gets that call's exact input and output ids
//! (the model's sampled ids, never a re-tokenisation of their text), then
//! only the new messages rendered and tokenised. The new messages' text is
//! the template's render of `[previous assistant] + new` minus the render of
//! `[previous assistant]` alone, plus whatever the template writes after the
//! end-of-turn token (ChatML's newline): cost grows with what is new, and a
//! template that rewrites old turns (Qwen3 drops earlier reasoning) cannot
//! change tokens the model already saw.

use super::chat::{Message, ToolSpec};
use super::template::{ChatTemplate, TemplateError};
use super::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: {message}")]
    Config { path: String, message: String },
}

pub struct Renderer {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

/// An earlier call the request's history extends.
pub struct PriorCall<'a> {
    pub input_ids: &'a [u32],
    pub output_ids: &'a [u32],
    /// Messages of the request matched by that call and its reply.
    pub matched: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Leading ids copied from the prior call's record.
    pub reused: usize,
    /// Ids produced by the tokeniser for this request.
    pub tokenized: usize,
}

impl Renderer {
    pub fn builtin() -> Result<Renderer, RenderError> {
        Ok(Renderer {
            tokenizer: Tokenizer::builtin()?,
            template: ChatTemplate::builtin(),
        })
    }

    /// The model's own files: `tokenizer.json` and `tokenizer_config.json`
    /// (its `chat_template`, `bos_token`, `eos_token`) from `dir`; a
    /// `chat_template.jinja` beside them, as newer checkpoints ship it,
    /// is the template when `tokenizer_config.json` has none.
    pub fn from_dir(dir: &std::path::Path) -> Result<Renderer, RenderError> {
        let path = dir.join("tokenizer_config.json");
        let config = |message: String| RenderError::Config {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| config(e.to_string()))?;
        let cfg: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| config(format!("not JSON: {e}")))?;
        let token = |k: &str| match &cfg[k] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
        let template = cfg["chat_template"]
            .as_str()
            .or(jinja.as_deref())
            .ok_or_else(|| config("no chat_template string (nor chat_template.jinja)".into()))?;
        let eos = token("eos_token");
        Ok(Renderer {
            tokenizer: Tokenizer::from_file(&dir.join("tokenizer.json"), &eos)?,
            template: ChatTemplate::new(template, &token("bos_token"), &eos)?,
        })
    }

    /// The whole conversation rendered and tokenised (no reuse).
    pub fn full(&self, messages: &[Message], tools: &[ToolSpec]) -> Result<Prompt, RenderError> {
        let text = self.template.render(messages, tools, true)?;
        let ids = self.tokenizer.encode(&text)?;
        Ok(Prompt {
            tokenized: ids.len(),
            ids,
            reused: 0,
        })
    }

    /// Text the template adds for `messages[prior.matched..]` after the prior
    /// reply's tokens, when the template renders it append-only.
    fn suffix_text(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        matched: usize,
    ) -> Result<Option<String>, RenderError> {
        let stub = &messages[matched - 1..matched];
        let alone = self.template.render(stub, tools, false)?;
        let mut with_new = stub.to_vec();
        with_new.extend_from_slice(&messages[matched..]);
        let all = self.template.render(&with_new, tools, true)?;
        let Some(delta) = all.strip_prefix(alone.as_str()) else {
            return Ok(None);
        };
        let tail = alone
            .rfind(self.tokenizer.eos_text())
            .map(|i| &alone[i + self.tokenizer.eos_text().len()..])
            .unwrap_or("");
        Ok(Some(format!("{tail}{delta}")))
    }

    /// The prompt for `messages`, extending `prior` when given.
    pub fn prompt(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        prior: Option<PriorCall<'_>>,
    ) -> Result<Prompt, RenderError> {
        let Some(prior) = prior.filter(|p| p.matched > 0 && p.matched <= messages.len()) else {
            return self.full(messages, tools);
        };
        let Some(text) = self.suffix_text(messages, tools, prior.matched)? else {
            tracing::debug!("chat template is not append-only here; rendering the whole history");
            return self.full(messages, tools);
        };
        let mut ids = Vec::with_capacity(prior.input_ids.len() + prior.output_ids.len() + 64);
        ids.extend_from_slice(prior.input_ids);
        ids.extend_from_slice(prior.output_ids);
        if prior.output_ids.last() != Some(&self.tokenizer.eos()) {
            ids.push(self.tokenizer.eos());
        }
        let reused = ids.len();
        let new = self.tokenizer.encode(&text)?;
        ids.extend_from_slice(&new);
        Ok(Prompt {
            ids,
            reused,
            tokenized: new.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::chat::Role;

    #[test]
    fn extension_equals_full_render_for_an_append_only_template() {
        let r = Renderer::builtin().unwrap();
        let first = vec![
            Message::text(Role::System, "be brief"),
            Message::text(Role::User, "hi"),
        ];
        let p1 = r.full(&first, &[]).unwrap();
        let output = r.tokenizer.encode("hello there<|im_end|>").unwrap();
        let mut second = first.clone();
        second.push(Message::text(Role::Assistant, "hello there"));
        second.push(Message::text(Role::User, "more"));
        let p2 = r
            .prompt(
                &second,
                &[],
                Some(PriorCall {
                    input_ids: &p1.ids,
                    output_ids: &output,
                    matched: 3,
                }),
            )
            .unwrap();
        assert_eq!(
            p2,
            Prompt {
                reused: p1.ids.len() + output.len(),
                tokenized: p2.tokenized,
                ids: r.full(&second, &[]).unwrap().ids
            }
        );
        // "\n", <|im_start|>, "user\nmore", <|im_end|>, "\n", <|im_start|>, "assistant\n"
        assert_eq!(p2.tokenized, 1 + 1 + 9 + 1 + 1 + 1 + 10);
    }
}
