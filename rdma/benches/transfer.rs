//! Transfer-engine figures, printed as tables (run with
//! `cargo bench -p gyre-rdma --bench transfer`):
//!
//! 1. TCP throughput of a 1 GiB segment READ from a second process, next to
//!    `iperf3` on loopback in the same run;
//! 2. latency of a batch of 4,096 64 KiB KV-block READs (p50/p99 from batch
//!    submission to each completion);
//! 3. ring all-reduce time by gradient size and participant count.
//!
//! `GYRE_BENCH_QUICK=1` shrinks every size for a smoke run.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use gyre_rdma::collective::{Group, RingAllReduce};
use gyre_rdma::pattern::pattern;
use gyre_rdma::{ClusterSecret, PeerId, SegmentRef, TcpOptions, TransferEngine, TransferRequest};
use rand::SeedableRng;
use rand::seq::SliceRandom;

const SECRET: &str = "bench-cluster-secret-0123456789";

struct Peer {
    child: Child,
    addr: String,
    _stdin: ChildStdin,
}

impl Peer {
    fn spawn(args: &[&str]) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_transfer-peer"))
            .args(args)
            .env("GYRE_CLUSTER_SECRET", SECRET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn transfer-peer");
        let stdin = child.stdin.take().expect("stdin");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("peer's first line");
        let addr = first
            .trim()
            .strip_prefix("listening ")
            .expect("listening line")
            .to_string();
        Peer {
            child,
            addr,
            _stdin: stdin,
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn secret() -> ClusterSecret {
    ClusterSecret::new(SECRET).expect("secret")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// iperf3 over loopback, one run: GB/s received, or why it could not run.
fn iperf3(bytes: usize, streams: usize) -> Result<f64, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 not runnable ({e}); apt-get install iperf3"))?;
    // A readiness probe would use up the one-off server; give it time instead.
    thread::sleep(Duration::from_millis(500));
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            &bytes.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    let _ = server.wait();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 8e9)
        .ok_or_else(|| format!("no throughput in iperf3's report: {}", json["error"]))
}

fn read_whole(engine: &TransferEngine, seg: &SegmentRef, buf: Option<BytesMut>) -> (f64, BytesMut) {
    let start = Instant::now();
    let req = match buf {
        Some(b) => TransferRequest::read_into(seg, 0, b),
        None => TransferRequest::read(seg, 0, seg.len),
    };
    let done = engine
        .transfer(vec![req])
        .pop()
        .expect("one completion")
        .expect("read");
    let secs = start.elapsed().as_secs_f64();
    let data = done.data.expect("data");
    (
        seg.len as f64 / secs / 1e9,
        data.try_into_mut()
            .unwrap_or_else(|b| BytesMut::from(&b[..])),
    )
}

fn throughput(size: usize) {
    println!(
        "\n## 1. TCP READ of a {} MiB segment from a second process vs iperf3 (loopback)\n",
        size >> 20
    );
    let peer = Peer::spawn(&["--frozen", &format!("big:{size}:7")]);
    let expected = pattern(7, size);
    println!("| path | runs | median GB/s | best GB/s |");
    println!("|---|---|---|---|");
    for (label, connections) in [
        ("gyre TCP, 1 connection", 1),
        ("gyre TCP, 4 connections", 4),
    ] {
        let engine = TransferEngine::new("bench");
        let opts = TcpOptions {
            connections,
            ..TcpOptions::default()
        };
        let id = engine
            .connect_tcp(&peer.addr, &secret(), opts)
            .expect("connect");
        let seg = engine.open_segment(id, "big").expect("open");
        let (_, mut buf) = read_whole(&engine, &seg, None);
        assert!(buf[..] == expected[..], "the 1 GiB read is byte-exact");
        let mut rates = Vec::new();
        for _ in 0..5 {
            let (rate, b) = read_whole(&engine, &seg, Some(buf));
            buf = b;
            rates.push(rate);
        }
        let best = rates.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {label} (recycled buffer) | {} | {:.2} | {:.2} |",
            rates.len(),
            median(rates),
            best
        );
        let fresh: Vec<f64> = (0..3).map(|_| read_whole(&engine, &seg, None).0).collect();
        let best = fresh.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {label} (fresh buffer) | {} | {:.2} | {:.2} |",
            fresh.len(),
            median(fresh),
            best
        );
    }
    for streams in [1, 4] {
        let runs: Vec<Result<f64, String>> = (0..3).map(|_| iperf3(size, streams)).collect();
        match runs.iter().cloned().collect::<Result<Vec<f64>, String>>() {
            Ok(rates) => {
                let best = rates.iter().cloned().fold(0.0, f64::max);
                println!(
                    "| iperf3 -P {streams} | {} | {:.2} | {:.2} |",
                    rates.len(),
                    median(rates),
                    best
                );
            }
            Err(e) => println!("| iperf3 -P {streams} | – | {e} | |"),
        }
    }
}

fn kv_batch(blocks: usize, block: usize) {
    println!(
        "\n## 2. Batch of {blocks} KV-block READs of {} KiB from a second process\n",
        block >> 10
    );
    let peer = Peer::spawn(&["--frozen", &format!("kv:{}:3", blocks * block)]);
    let engine = TransferEngine::new("bench");
    let id: PeerId = engine
        .connect_tcp(&peer.addr, &secret(), TcpOptions::default())
        .expect("connect");
    let seg = engine.open_segment(id, "kv").expect("open");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut lat = Vec::new();
    let mut batch_ms = Vec::new();
    for round in 0..6 {
        let mut order: Vec<usize> = (0..blocks).collect();
        order.shuffle(&mut rng);
        let times = Arc::new(Mutex::new(Vec::with_capacity(blocks)));
        let (tx, rx) = std::sync::mpsc::channel();
        let start = Instant::now();
        for &b in &order {
            let (times, tx) = (times.clone(), tx.clone());
            engine.submit_with(
                TransferRequest::read(&seg, (b * block) as u64, block as u64),
                Box::new(move |c| {
                    let t = start.elapsed().as_secs_f64() * 1e3;
                    times.lock().expect("times").push(t);
                    let _ = tx.send(c.is_ok());
                }),
            );
        }
        let ok = (0..blocks).filter(|_| rx.recv().unwrap_or(false)).count();
        assert_eq!(ok, blocks, "every KV read succeeded");
        let total = start.elapsed().as_secs_f64() * 1e3;
        if round > 0 {
            batch_ms.push(total);
            lat.extend(times.lock().expect("times").iter().copied());
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let batch = median(batch_ms.clone());
    // One block at a time: the round trip without queueing behind a batch.
    let mut single: Vec<f64> = (0..400)
        .map(|i| {
            let start = Instant::now();
            let req =
                TransferRequest::read(&seg, ((i * 7919) % blocks * block) as u64, block as u64);
            engine
                .transfer(vec![req])
                .pop()
                .expect("one")
                .expect("read");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    single.sort_by(|a, b| a.total_cmp(b));
    println!(
        "| batches | batch time (median) | per-block p50 | per-block p99 | effective GB/s | one block alone p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} | {:.3} / {:.3} ms |",
        batch_ms.len(),
        batch,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        (blocks * block) as f64 / (batch / 1e3) / 1e9,
        percentile(&single, 0.5),
        percentile(&single, 0.99)
    );
}

fn mesh(n: usize, tag: &str) -> (Vec<Group>, Vec<gyre_rdma::TcpServer>) {
    let engines: Vec<_> = (0..n)
        .map(|i| TransferEngine::new(&format!("rank{i}")))
        .collect();
    let servers: Vec<_> = engines
        .iter()
        .map(|e| e.listen_tcp("127.0.0.1:0", &secret()).expect("listen"))
        .collect();
    let groups = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let peers = (0..n)
                .map(|j| {
                    (j != i).then(|| {
                        e.connect_tcp(servers[j].local_addr(), &secret(), TcpOptions::default())
                            .expect("connect")
                    })
                })
                .collect();
            Group::new(e.clone(), i, peers, tag).expect("group")
        })
        .collect();
    (groups, servers)
}

fn all_reduce(sizes: &[usize]) {
    println!("\n## 3. Ring all-reduce of f32 gradients (ranks on threads, TCP loopback)\n");
    println!("| participants | values | MiB | median ms per call | algorithm GB/s |");
    println!("|---|---|---|---|---|");
    for n in [2, 3, 4] {
        for &len in sizes {
            let (groups, _servers) = mesh(n, &format!("bench{n}-{len}"));
            let handles: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    thread::spawn(move || {
                        let mut ring = RingAllReduce::new(g, len).expect("ring");
                        let mut v = vec![1.0f32; len];
                        let mut times = Vec::new();
                        for call in 0..4 {
                            let start = Instant::now();
                            ring.all_reduce(&mut v).expect("all-reduce");
                            if call > 0 {
                                times.push(start.elapsed().as_secs_f64());
                            }
                        }
                        times
                    })
                })
                .collect();
            let per_rank: Vec<Vec<f64>> = handles
                .into_iter()
                .map(|h| h.join().expect("rank"))
                .collect();
            // A call ends when its slowest rank ends.
            let calls: Vec<f64> = (0..per_rank[0].len())
                .map(|c| per_rank.iter().map(|r| r[c]).fold(0.0, f64::max))
                .collect();
            let t = median(calls);
            let bytes = (len * 4) as f64;
            println!(
                "| {n} | {len} | {:.1} | {:.2} | {:.2} |",
                bytes / (1 << 20) as f64,
                t * 1e3,
                bytes / t / 1e9
            );
        }
    }
}

fn main() {
    let quick = std::env::var("GYRE_BENCH_QUICK").is_ok();
    println!(
        "# gyre-rdma transfer engine{}",
        if quick { " (quick)" } else { "" }
    );
    if quick {
        throughput(64 << 20);
        kv_batch(256, 64 << 10);
        all_reduce(&[1 << 12, 1 << 16]);
    } else {
        throughput(1 << 30);
        kv_batch(4096, 64 << 10);
        all_reduce(&[1 << 16, 1 << 20, 1 << 22]);
    }
}
