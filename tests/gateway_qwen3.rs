//! HF rendering with the real Qwen3 tokenizer.json and chat template (from
//! npm, see `qwen3_dir`): exact ChatML and hermes tool-call rendering, and
//! token-exact history with a template that is not append-only (Qwen3
//! drops earlier turns' reasoning when it re-renders the history).

mod gateway;

use gateway::*;
use gyre::gateway::chat::{Message, Role, ToolCall, ToolSpec};
use gyre::gateway::render::{PriorCall, Renderer};
use serde_json::json;

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "bash".into(),
        description: "run".into(),
        parameters: json!({"type": "object"}),
    }]
}

#[test]
fn qwen3_template_and_tokenizer_render_exactly() {
    let Some(dir) = qwen3_dir() else { return };
    let r = Renderer::from_dir(&dir).expect("Qwen3 files load");
    assert_eq!(r.tokenizer.eos(), 151645);
    let mut a = Message::text(Role::Assistant, "");
    a.tool_calls.push(ToolCall {
        id: "c".into(),
        name: "bash".into(),
        arguments: r#"{"cmd": "ls"}"#.into(),
    });
    let mut t = Message::text(Role::Tool, "a.txt");
    t.tool_call_id = Some("c".into());
    let msgs = vec![
        Message::text(Role::System, "sys"),
        Message::text(Role::User, "hi"),
        a,
        t,
    ];
    let text = r.template.render(&msgs, &tools(), true).unwrap();
    let want_tools = "<|im_start|>system\nsys\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"function\": {\"description\": \"run\", \"name\": \"bash\", \"parameters\": {\"type\": \"object\"}}, \"type\": \"function\"}\n</tools>";
    assert!(text.starts_with(want_tools), "{text}");
    assert!(text.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{text}");
    let ids = r
        .tokenizer
        .encode("<|im_start|>user\nhello world<|im_end|>")
        .unwrap();
    assert_eq!(ids[0], 151644);
    assert_eq!(*ids.last().unwrap(), 151645);
    assert_eq!(
        r.tokenizer.decode(&ids),
        "<|im_start|>user\nhello world<|im_end|>"
    );
}

#[test]
fn qwen3_history_keeps_the_tokens_the_model_saw() {
    let Some(dir) = qwen3_dir() else { return };
    let r = Renderer::from_dir(&dir).unwrap();
    let first = vec![Message::text(Role::User, "2+2?")];
    let p1 = r.full(&first, &[]).unwrap();
    let output = r
        .tokenizer
        .encode("<think>\nadd them\n</think>\n\n4<|im_end|>")
        .unwrap();
    let mut reply = Message::text(Role::Assistant, "4");
    reply.reasoning = Some("add them".into());
    let mut second = first.clone();
    second.push(reply);
    second.push(Message::text(Role::User, "and 3+3?"));
    let mut seen = p1.ids.clone();
    seen.extend(&output);
    // Re-rendering drops the earlier reasoning: the tokens would not match.
    let rerendered = r.full(&second, &[]).unwrap();
    assert_ne!(
        &rerendered.ids[..seen.len().min(rerendered.ids.len())],
        &seen[..seen.len().min(rerendered.ids.len())]
    );
    // The gateway's prompt keeps them and tokenises only what is new.
    let p2 = r
        .prompt(
            &second,
            &[],
            Some(PriorCall {
                input_ids: &p1.ids,
                output_ids: &output,
                matched: 2,
            }),
        )
        .unwrap();
    assert_eq!(&p2.ids[..seen.len()], &seen[..]);
    assert_eq!(p2.reused, seen.len());
    let new = r.tokenizer.decode(&p2.ids[seen.len()..]);
    assert_eq!(
        new,
        "\n<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn gateway_serves_with_the_qwen3_tokenizer() {
    let Some(qdir) = qwen3_dir() else { return };
    let dir = temp_dir("gw-qwen3");
    let script = vec![
        json!({"thinking": "check", "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]}),
        json!({"text": "One file."}),
    ];
    let g = start(&[
        "--engine",
        &write_script(&dir, &script),
        "--tokenizer",
        qdir.to_str().unwrap(),
    ]);
    let (id, key) = execution(&g);
    let tools = json!([{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]);
    let mut messages = vec![json!({"role": "user", "content": "what is here?"})];
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 200, "tools": tools, "messages": messages}),
    );
    assert_eq!(s, 200, "{b}");
    let r: serde_json::Value = serde_json::from_str(&b).unwrap();
    let use_ = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap()
        .clone();
    messages.push(json!({"role": "assistant", "content": [use_]}));
    messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_["id"], "content": "a.txt"}]}));
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 200, "tools": tools, "messages": messages, "stream": true}),
    );
    assert_eq!(s, 200, "{b}");
    assert_eq!(sse_text(&b), "One file.", "{b}");
    let records = trace(&g, &id);
    assert_extends(&records);
    assert_eq!(records[0]["input_ids"][0], 151644);
}
