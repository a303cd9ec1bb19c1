//! A standalone transfer-engine node: registers pattern-filled segments,
//! serves them over TCP and reports what it is told. Tests and benchmarks
//! run it as the second process; it exits when its stdin closes.
//!
//! ```text
//! GYRE_CLUSTER_SECRET=... transfer-peer [--listen ADDR] [--name NAME]
//!     [--frozen NAME:LEN:SEED]... [--mutable NAME:LEN:SEED]...
//! ```
//! It prints `listening ADDR`, then `note FROM TOPIC PAYLOAD` for each
//! notification on topic `peer`, and re-registers segment NAME (a new
//! version, same bytes) on a notification `reregister NAME`, printing
//! `reregistered NAME VERSION`.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use bytes::Bytes;
use gyre_rdma::pattern::pattern;
use gyre_rdma::{ClusterSecret, TransferEngine};

struct Spec {
    name: String,
    len: usize,
    seed: u64,
    mutable: bool,
}

fn parse_spec(arg: &str, mutable: bool) -> Result<Spec, String> {
    let parts: Vec<&str> = arg.split(':').collect();
    let [name, len, seed] = parts[..] else {
        return Err(format!("segment `{arg}` is not NAME:LEN:SEED"));
    };
    Ok(Spec {
        name: name.to_string(),
        len: len
            .parse()
            .map_err(|e| format!("segment `{arg}`: length: {e}"))?,
        seed: seed
            .parse()
            .map_err(|e| format!("segment `{arg}`: seed: {e}"))?,
        mutable,
    })
}

fn run() -> Result<(), String> {
    let mut listen = "127.0.0.1:0".to_string();
    let mut name = "peer".to_string();
    let mut specs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--name" => name = value()?,
            "--frozen" => specs.push(parse_spec(&value()?, false)?),
            "--mutable" => specs.push(parse_spec(&value()?, true)?),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let secret = std::env::var("GYRE_CLUSTER_SECRET")
        .map_err(|_| "GYRE_CLUSTER_SECRET is not set".to_string())?;
    let secret = ClusterSecret::new(secret).map_err(|e| e.to_string())?;
    let engine = TransferEngine::new(&name);
    let register = {
        let engine = engine.clone();
        move |s: &Spec| {
            let bytes = pattern(s.seed, s.len);
            if s.mutable {
                engine.register_mutable(&s.name, bytes)
            } else {
                engine.register_frozen(&s.name, Bytes::from(bytes))
            }
            .map_err(|e| e.to_string())
        }
    };
    for s in &specs {
        register(s)?;
    }
    let server = engine
        .listen_tcp(&listen, &secret)
        .map_err(|e| e.to_string())?;
    let notes = engine.subscribe("peer");
    let stdout = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let say = {
        let stdout = stdout.clone();
        move |line: String| {
            let mut out = stdout.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    say(format!("listening {}", server.local_addr()));
    std::thread::spawn(move || {
        for note in notes {
            let text = String::from_utf8_lossy(&note.payload).into_owned();
            if let Some(target) = text.strip_prefix("reregister ") {
                match specs.iter().find(|s| s.name == target).map(&register) {
                    Some(Ok(info)) => say(format!("reregistered {} {}", info.name, info.version)),
                    Some(Err(e)) => say(format!("error {e}")),
                    None => say(format!("error no segment {target}")),
                }
            } else {
                say(format!("note {} {} {}", note.from, note.topic, text));
            }
        }
    });
    // Live until the parent closes our stdin (or dies).
    for _ in std::io::stdin().lock().lines() {}
    drop(server);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
