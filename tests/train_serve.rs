//! `gyre train` with its engines as `gyre serve` processes behind the
//! SGLang adapter: the first update is bit for bit the in-process run's
//! (the servers sample the trainer's weights with the same seeds), the
//! loop learns over 40 steps, moved executions recompute their prefix
//! (counted) instead of adopting KV blocks, and every server ends on a
//! published version.

mod common;

use common::{Serve, ok, tiny_serve_model};
use gyre::backends::sglang::{ClientConfig, SglangClient};
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

#[test]
fn the_first_update_through_spawned_servers_equals_the_in_process_one() {
    let inproc = json(&ok(&["train", "--tiny", "--steps", "2", "--json"]));
    let served = json(&ok(&[
        "train",
        "--tiny",
        "--steps",
        "2",
        "--engines",
        "serve",
        "--json",
    ]));
    assert_eq!(served["steps"], 2);
    assert_eq!(inproc["updates"][0], served["updates"][0]);
    assert!(served["updates"][0]["targets"].as_u64().unwrap() > 0);
}

#[test]
fn training_through_sglang_engines_learns_and_publishes_by_version() {
    let dir = std::env::temp_dir().join(format!("gyre-train-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The servers' own weights are overwritten by the adapter at start-up.
    let model = tiny_serve_model(&dir, 64);
    let servers: Vec<Serve> = (0..3).map(|_| Serve::start(&model)).collect();
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let r = json(&ok(&[
        "train",
        "--tiny",
        "--json",
        "--engine-urls",
        &urls.join(","),
    ]));
    assert_eq!(r["steps"], 40);
    let early = r["early_reward"].as_f64().unwrap();
    let late = r["late_reward"].as_f64().unwrap();
    assert!(late > 2.0 * early, "reward {early} → {late}");
    let e = &r["elasticity"];
    assert!(e["transitions"].as_u64().unwrap() > 0);
    assert!(e["kv_recomputed"].as_u64().unwrap() > 0, "{e}");
    assert_eq!(e["kv_adopted"], 0);
    assert!(r["served"].as_u64().unwrap() > 0);
    for u in r["updates"].as_array().unwrap() {
        assert!(u["targets"].as_u64().unwrap() > 0, "{u}");
    }
    // Publications reached the servers by version: the pool's server
    // (always in rollout) serves the last one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let versions: Vec<u64> = servers
        .iter()
        .map(|s| {
            let c = SglangClient::new(&s.url, ClientConfig::default()).unwrap();
            rt.block_on(c.get_weight_version())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(versions[2], 40, "{versions:?}");
    assert!(versions.iter().all(|&v| v > 0), "{versions:?}");
}

/// `gyre train --host live --engines serve`: real time, the adapters'
/// HTTP calls on the live host's blocking pool, versions published to the
/// servers as checkpoint directories on disk; the run ends with its steps
/// trained and every server that holds its memory on the last version.
#[test]
fn the_live_host_trains_through_spawned_servers_publishing_by_disk() {
    let dir = std::env::temp_dir().join(format!("gyre-live-serve-{}", std::process::id()));
    let r = json(&ok(&[
        "train",
        "--tiny",
        "--steps",
        "4",
        "--host",
        "live",
        "--engines",
        "serve",
        "--publish",
        "disk",
        "--publish-dir",
        dir.to_str().unwrap(),
        "--reject-retries",
        "2",
        "--json",
    ]));
    assert_eq!(r["steps"], 4, "{r}");
    let updates = r["updates"].as_array().unwrap();
    assert_eq!(updates.len(), 4, "{r}");
    for u in updates {
        assert!(u["targets"].as_u64().unwrap() > 0, "{u}");
    }
    assert!(r["executions"].as_u64().unwrap() > 0);
    // Each server has its own directory of versions; the pool's (always
    // in rollout) holds only the last one, written whole.
    let left: Vec<String> = std::fs::read_dir(dir.join("pool"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["v00000004"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without `--publish-dir` the versions go to a directory of the run's
/// own under the temp dir, removed when the run ends.
#[test]
fn a_publication_directory_the_run_chose_is_removed_after_it() {
    let tmp = std::env::temp_dir().join(format!("gyre-publish-owned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["train", "--tiny", "--steps", "2", "--engines", "serve"])
        .args(["--publish", "disk", "--json"])
        .env("TMPDIR", &tmp)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&out);
    assert_eq!(r["steps"], 2, "{r}");
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("gyre-publish"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn publication_flags_without_sglang_engines_are_refused_by_name() {
    let out = common::gyre(&["train", "--tiny", "--publish", "disk"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--publish") && err.contains("--engines serve"),
        "{err}"
    );
}
