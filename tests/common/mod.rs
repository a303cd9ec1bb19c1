//! Running the `gyre` binary the way a user does, for the CLI tests.
// Each test file uses the helpers it needs.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `gyre args`, logs at `warn` (the level bad-input reports use).
pub fn gyre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gyre runs")
}

/// Runs `gyre args` and requires success, showing stderr otherwise.
pub fn ok(args: &[&str]) -> Output {
    let out = gyre(args);
    assert!(
        out.status.success(),
        "gyre {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `gyre serve` child process on a free port, killed on drop.
pub struct Serve {
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

impl Serve {
    /// `gyre serve --model model_toml`, once its first line names the port.
    pub fn start(model_toml: &std::path::Path) -> Serve {
        let model = model_toml.to_string_lossy();
        Serve::with_args(&["--model", &model])
    }

    /// `gyre serve ARGS`, once its first line names the port.
    pub fn with_args(args: &[&str]) -> Serve {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("gyre serve starts");
        let out = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("first line");
        let addr = line
            .trim()
            .strip_prefix("gyre serve listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Serve {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// host:port
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A model file for `gyre serve`: Gyre's byte model, tiny, seeded.
pub fn tiny_serve_model(dir: &std::path::Path, context: usize) -> std::path::PathBuf {
    let p = dir.join("serve-model.toml");
    std::fs::write(
        &p,
        format!(
            "seed = 7\nmax_running = 8\ngyre_model = {{ vocab = 264, layers = 2, heads = 2, width = 32, ffn = 64, context = {context} }}\n"
        ),
    )
    .expect("write the model file");
    p
}

/// A tiny Qwen3-shaped checkpoint configuration: 300 ids, 2 layers,
/// width 32, 4 query / 2 KV heads of 16, tied head, context 64, EOS 5.
pub fn tiny_qwen3() -> gyre_gpu::model::hf::HfConfig {
    use gyre_gpu::model::{Arch, DecoderArch, Family, ModelConfig};
    gyre_gpu::model::hf::HfConfig {
        model: ModelConfig {
            vocab: 300,
            layers: 2,
            heads: 4,
            width: 32,
            ffn: 48,
            context: 64,
            arch: Arch::Decoder(DecoderArch {
                family: Family::Qwen3,
                kv_heads: 2,
                head_dim: 16,
                rope_theta: 1_000_000.0,
                rope_scaling: None,
                norm_eps: 1e-6,
                tie_embeddings: true,
                attention_bias: false,
            }),
        },
        max_positions: 64,
        bos_token_id: None,
        eos_token_ids: vec![5],
    }
}

/// The `version` of each update in a run's JSON report, in order.
pub fn versions(report: &serde_json::Value) -> Vec<u64> {
    report["updates"]
        .as_array()
        .expect("a report with updates")
        .iter()
        .map(|u| u["version"].as_u64().expect("a version"))
        .collect()
}

/// `s` without its ANSI colour codes (logs are coloured even when piped).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of ` key=value` in a log line.
pub fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    Some(line[at..].split_whitespace().next()?.to_string())
}
