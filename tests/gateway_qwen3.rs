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

/// The `tool_use` block of an Anthropic reply `body`, appended to
/// `messages` as the assistant's turn with a tool result after it.
fn answer_with_tool_result(body: &str, messages: &mut Vec<serde_json::Value>) -> serde_json::Value {
    let r: serde_json::Value = serde_json::from_str(body).unwrap();
    let use_ = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap_or_else(|| panic!("a tool_use block in {body}"))
        .clone();
    messages.push(json!({"role": "assistant", "content": [use_]}));
    messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_["id"], "content": "a.txt"}]}));
    use_
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
    answer_with_tool_result(&b, &mut messages);
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

/// A tiny Qwen3-shaped checkpoint (width 16, the real tokenizer's
/// 151,669-id vocabulary) whose weights force one output: every layer
/// computes, but its attention and MLP outputs are scaled down to a
/// thousandth, so the residual stream is the current token's embedding;
/// each token of `chain` but the last embeds as its own basis vector and
/// the head row of its successor points along it, 48 logits above the
/// rest. The model therefore continues `chain[0]` with exactly
/// `chain[1..]` at any temperature.
fn forcing_checkpoint(dir: &std::path::Path, qwen3: &std::path::Path, chain: &[u32]) {
    use gyre_gpu::model::ParamBuffer;
    use gyre_gpu::model::hf;
    use gyre_gpu::model::params::ParamLayout;
    let vocab = 151_669;
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "tie_word_embeddings": false, "attention_bias": false,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "float32",
    });
    let cfg = hf::parse_config(&config.to_string(), None).unwrap();
    let layout = ParamLayout::new(&cfg.model).unwrap();
    let mut params = ParamBuffer::init(&cfg.model, 7).unwrap();
    let width = cfg.model.width;
    assert!(chain.len() <= width + 1, "one basis vector per link");
    for s in &layout.specs {
        if s.name.ends_with("o_proj.weight") || s.name.ends_with("down_proj.weight") {
            for x in &mut params.data[s.offset..s.offset + s.len] {
                *x *= 1e-3;
            }
        }
    }
    let row = |name: &str, id: u32| {
        let s = layout.spec(name).unwrap();
        s.offset + id as usize * width
    };
    for (k, w) in chain.windows(2).enumerate() {
        let e = row("model.embed_tokens.weight", w[0]);
        let h = row("lm_head.weight", w[1]);
        for j in 0..width {
            params.data[e + j] = if j == k { 1.0 } else { 0.0 };
            // RMSNorm turns the basis vector into 4·e_k: logit 48.
            params.data[h + j] = if j == k { 12.0 } else { 0.0 };
        }
    }
    hf::save(dir, &cfg, &params, 1).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(qwen3.join(f), dir.join(f)).unwrap();
    }
}

#[test]
fn gateway_embedded_qwen3_checkpoint_calls_a_tool_with_exact_ids() {
    let Some(qdir) = qwen3_dir() else { return };
    let r = Renderer::from_dir(&qdir).unwrap();
    let tools = json!([{"name": "ls", "description": "list", "input_schema": {"type": "object"}}]);
    let user = json!({"role": "user", "content": "what is here?"});
    // The rendered prompt ends with the assistant header's newline; the
    // model is made to answer it with this tool call.
    let answer = r#"<tool_call>{"name":"ls","arguments":{}}</tool_call><|im_end|>"#;
    let header = r.tokenizer.encode("<|im_start|>assistant\n").unwrap();
    let mut chain = vec![*header.last().unwrap()];
    chain.extend(r.tokenizer.encode(answer).unwrap());
    let mut seen = chain.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        chain.len(),
        "each forced token has one successor"
    );

    let dir = temp_dir("gw-qwen3-ckpt");
    forcing_checkpoint(&dir.join("ckpt"), &qdir, &chain);
    let toml = dir.join("qwen3.toml");
    std::fs::write(&toml, "checkpoint = \"ckpt\"\nmax_context = 1024\n").unwrap();
    let g = start(&["--engine", &format!("embedded={}", toml.display())]);
    let (id, key) = execution(&g);
    let mut messages = vec![user];
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 50, "tools": tools, "messages": messages}),
    );
    assert_eq!(s, 200, "{b}");
    let reply: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(reply["stop_reason"], "tool_use", "{b}");
    let use_ = answer_with_tool_result(&b, &mut messages);
    assert_eq!(use_["name"], "ls");
    assert_eq!(use_["input"], json!({}));
    let (s, b) = post(
        &g,
        "/v1/messages",
        &key,
        &json!({"model": "m", "max_tokens": 50, "tools": tools, "messages": messages, "stream": true}),
    );
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("\"tool_use\""), "{b}");

    let records = trace(&g, &id);
    assert_eq!(records.len(), 2);
    assert_extends(&records);
    let spec = ToolSpec {
        name: "ls".into(),
        description: "list".into(),
        parameters: json!({"type": "object"}),
    };
    let rendered = r
        .full(&[Message::text(Role::User, "what is here?")], &[spec])
        .unwrap();
    let want: Vec<u64> = rendered.ids.iter().map(|&t| t as u64).collect();
    assert_eq!(
        ids(&records[0]["input_ids"]),
        want,
        "the prompt as the template renders it"
    );
    for rec in &records {
        let input = ids(&rec["input_ids"]);
        assert_eq!(input[0], 151644, "<|im_start|> opens the prompt");
        assert_eq!(*input.last().unwrap(), chain[0] as u64);
        let output = ids(&rec["output_ids"]);
        let forced: Vec<u64> = chain[1..].iter().map(|&t| t as u64).collect();
        assert_eq!(output, forced, "the record holds the sampled ids");
        let lps = rec["output_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), output.len());
        for lp in lps {
            let lp = lp.as_f64().unwrap();
            assert!(
                (-1e-3..=0.0).contains(&lp),
                "forced tokens are near-certain: {lp}"
            );
        }
    }
}
