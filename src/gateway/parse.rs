//! Output text → API content, incrementally: `<think>` reasoning, text, and
//! tool calls in the hermes/Qwen `<tool_call>{json}</tool_call>` format, the
//! Qwen3-coder XML inside the same tags (`<function=…><parameter=…>`), or
//! Llama-3's bare JSON (`{"name": …, "parameters": …}`, optionally after
//! `<|python_tag|>`). A malformed call becomes text, never an error.
//!
//! Text is held back only while it could still be the start of a tag, so
//! deltas leave as soon as the engine's tokens decode.

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` tags with JSON or Qwen3-coder XML inside.
    Hermes,
    /// Llama-3 JSON calls as the whole output.
    Llama3,
}

impl std::str::FromStr for ToolFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hermes" | "qwen" | "qwen3-coder" => Ok(ToolFormat::Hermes),
            "llama3" => Ok(ToolFormat::Llama3),
            other => Err(format!(
                "unknown tool-call format {other:?}; expected hermes, qwen3-coder or llama3"
            )),
        }
    }
}

/// A parsed tool call; `arguments` is compact JSON of an object.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Thinking(String),
    Text(String),
    Call(ParsedCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Start,
    Think,
    Text,
    Call,
    /// Llama-3: the output is a JSON call; buffer it all.
    Json,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// The streaming parser. Feed decoded text, then `finish`.
pub struct OutputParser {
    format: ToolFormat,
    mode: Mode,
    buf: String,
    /// Text seen so far is only whitespace (leading newlines are dropped).
    text_started: bool,
    think_started: bool,
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// Bytes of trailing whitespace in `s`.
fn trailing_ws(s: &str) -> usize {
    s.len() - s.trim_end().len()
}

impl OutputParser {
    pub fn new(format: ToolFormat) -> OutputParser {
        OutputParser {
            format,
            mode: Mode::Start,
            buf: String::new(),
            text_started: false,
            think_started: false,
        }
    }

    fn emit_text(&mut self, s: &str, out: &mut Vec<Piece>) {
        let s = if self.text_started { s } else { s.trim_start() };
        if !s.is_empty() {
            self.text_started = true;
            out.push(Piece::Text(s.to_string()));
        }
    }

    fn emit_thinking(&mut self, s: &str, out: &mut Vec<Piece>) {
        let s = if self.think_started {
            s
        } else {
            s.trim_start_matches('\n')
        };
        if !s.is_empty() {
            self.think_started = true;
            out.push(Piece::Thinking(s.to_string()));
        }
    }

    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Start => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return out;
                    }
                    if t.starts_with(THINK_OPEN) {
                        let skip = self.buf.len() - t.len() + THINK_OPEN.len();
                        self.buf.drain(..skip);
                        self.mode = Mode::Think;
                    } else if THINK_OPEN.starts_with(t)
                        || (self.format == ToolFormat::Llama3 && PYTHON_TAG.starts_with(t))
                    {
                        return out;
                    } else if self.format == ToolFormat::Llama3
                        && (t.starts_with('{') || t.starts_with(PYTHON_TAG))
                    {
                        self.mode = Mode::Json;
                    } else {
                        self.mode = Mode::Text;
                    }
                }
                Mode::Think => {
                    if let Some(i) = self.buf.find(THINK_CLOSE) {
                        let thinking = self.buf[..i].trim_end_matches('\n').to_string();
                        self.emit_thinking(&thinking, &mut out);
                        self.buf.drain(..i + THINK_CLOSE.len());
                        self.mode = if self.format == ToolFormat::Llama3 {
                            Mode::Start
                        } else {
                            Mode::Text
                        };
                        continue;
                    }
                    let partial = partial_tag(&self.buf, THINK_CLOSE);
                    let head = &self.buf[..self.buf.len() - partial];
                    let hold = partial + head.len() - head.trim_end_matches('\n').len();
                    let ready: String = self.buf.drain(..self.buf.len() - hold).collect();
                    self.emit_thinking(&ready, &mut out);
                    return out;
                }
                Mode::Text => {
                    if self.format == ToolFormat::Hermes
                        && let Some(i) = self.buf.find(CALL_OPEN)
                    {
                        let before: String = self.buf.drain(..i).collect();
                        self.emit_text(before.trim_end(), &mut out);
                        self.buf.drain(..CALL_OPEN.len());
                        self.mode = Mode::Call;
                        continue;
                    }
                    let hold = if self.format == ToolFormat::Hermes {
                        partial_tag(&self.buf, CALL_OPEN)
                    } else {
                        0
                    };
                    let hold = hold.max(trailing_ws(&self.buf[..self.buf.len() - hold]) + hold);
                    let ready: String = self.buf.drain(..self.buf.len() - hold).collect();
                    self.emit_text(&ready, &mut out);
                    return out;
                }
                Mode::Call => {
                    let Some(i) = self.buf.find(CALL_CLOSE) else {
                        return out;
                    };
                    let inner: String = self.buf.drain(..i).collect();
                    self.buf.drain(..CALL_CLOSE.len());
                    match parse_tagged_call(&inner) {
                        Some(call) => out.push(Piece::Call(call)),
                        None => {
                            let raw = format!("{CALL_OPEN}{inner}{CALL_CLOSE}");
                            self.emit_text(&raw, &mut out);
                        }
                    }
                    self.mode = Mode::Text;
                }
                Mode::Json => return out,
            }
        }
    }

    /// Flushes what was held back; unterminated calls become text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Start | Mode::Text => self.emit_text(rest.trim_end(), &mut out),
            Mode::Think => self.emit_thinking(rest.trim_end_matches('\n'), &mut out),
            Mode::Call => self.emit_text(format!("{CALL_OPEN}{rest}").trim_end(), &mut out),
            Mode::Json => match parse_llama3_calls(&rest) {
                Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                None => self.emit_text(rest.trim_end(), &mut out),
            },
        }
        out
    }
}

/// Parses a whole output at once (non-streamed responses and tests).
pub fn parse_all(format: ToolFormat, text: &str) -> Vec<Piece> {
    let mut p = OutputParser::new(format);
    let mut pieces = p.push(text);
    pieces.extend(p.finish());
    merge(pieces)
}

/// Joins adjacent text and thinking pieces.
pub fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (Some(Piece::Thinking(a)), Piece::Thinking(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

fn call_from_json(v: &Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None => "{}".to_string(),
        Some(Value::String(s)) => {
            let inner: Value = serde_json::from_str(s).ok()?;
            inner.is_object().then(|| inner.to_string())?
        }
        Some(a) if a.is_object() => a.to_string(),
        Some(_) => return None,
    };
    (!name.is_empty()).then_some(ParsedCall { name, arguments })
}

fn parse_tagged_call(inner: &str) -> Option<ParsedCall> {
    let t = inner.trim();
    if t.starts_with('{') {
        return call_from_json(&serde_json::from_str(t).ok()?);
    }
    parse_xml_call(t)
}

/// Qwen3-coder: `<function=NAME>` then `<parameter=P>VALUE</parameter>`s.
fn parse_xml_call(t: &str) -> Option<ParsedCall> {
    let rest = t.strip_prefix("<function=")?;
    let (name, mut body) = rest.split_once('>')?;
    body = body.trim().strip_suffix("</function>")?;
    let mut args = serde_json::Map::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            break;
        }
        let r = body.strip_prefix("<parameter=")?;
        let (pname, r) = r.split_once('>')?;
        let (value, r) = r.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let v = serde_json::from_str::<Value>(value)
            .ok()
            .filter(|v| !v.is_string())
            .unwrap_or_else(|| Value::String(value.to_string()));
        args.insert(pname.trim().to_string(), v);
        body = r;
    }
    let name = name.trim();
    (!name.is_empty()).then(|| ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

fn parse_llama3_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let t = text.trim();
    let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim();
    let mut calls = Vec::new();
    for part in serde_json::Deserializer::from_str(t).into_iter::<Value>() {
        calls.push(call_from_json(&part.ok()?)?);
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Piece {
        Piece::Call(ParsedCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

    #[test]
    fn hermes_think_text_and_call() {
        let text = "<think>\nplan it\n</think>\n\nI will list.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>";
        assert_eq!(
            parse_all(ToolFormat::Hermes, text),
            vec![
                Piece::Thinking("plan it".into()),
                Piece::Text("I will list.".into()),
                call("bash", r#"{"cmd":"ls"}"#)
            ]
        );
    }

    #[test]
    fn qwen3_coder_xml() {
        let text = "<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            parse_all(ToolFormat::Hermes, text),
            vec![call("write", r#"{"n":3,"path":"a.py"}"#)]
        );
    }

    #[test]
    fn llama3_json_calls() {
        let text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
        assert_eq!(
            parse_all(ToolFormat::Llama3, text),
            vec![call("f", r#"{"x":1}"#)]
        );
        assert_eq!(
            parse_all(ToolFormat::Llama3, "{not json"),
            vec![Piece::Text("{not json".into())]
        );
    }

    #[test]
    fn malformed_calls_become_text() {
        for text in [
            "<tool_call>{\"nam\": 1}</tool_call>",
            "<tool_call>{broken</tool_call>",
            "<tool_call>{\"name\": \"x\"",
            "<tool_call><function=x><parameter=a>1</function></tool_call>",
        ] {
            let pieces = parse_all(ToolFormat::Hermes, text);
            assert!(
                matches!(pieces.as_slice(), [Piece::Text(t)] if t.starts_with("<tool_call>")),
                "{text}: {pieces:?}"
            );
        }
    }

    #[test]
    fn streaming_by_characters_equals_whole() {
        let text = "<think>\na\nb\n</think>\n\nHi <tool there\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>bad</tool_call> end";
        let mut p = OutputParser::new(ToolFormat::Hermes);
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(p.push(&c.to_string()));
        }
        pieces.extend(p.finish());
        assert_eq!(merge(pieces), parse_all(ToolFormat::Hermes, text));
        assert_eq!(
            parse_all(ToolFormat::Hermes, text),
            vec![
                Piece::Thinking("a\nb".into()),
                Piece::Text("Hi <tool there".into()),
                call("f", "{}"),
                Piece::Text("<tool_call>bad</tool_call> end".into())
            ]
        );
    }
}
