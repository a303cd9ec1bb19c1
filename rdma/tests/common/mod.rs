//! A second process for the tests: the `transfer-peer` binary, with its
//! stdout lines readable and its lifetime tied to the handle.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use gyre_rdma::ClusterSecret;

pub const SECRET: &str = "test-cluster-secret-0123456789";

pub fn secret() -> ClusterSecret {
    ClusterSecret::new(SECRET).unwrap()
}

pub struct Peer {
    pub child: Child,
    pub addr: String,
    pub lines: Receiver<String>,
    _stdin: ChildStdin,
}

impl Peer {
    /// Starts a peer with the given segment arguments (`--frozen n:len:seed`).
    pub fn spawn(args: &[&str]) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_transfer-peer"))
            .args(args)
            .env("GYRE_CLUSTER_SECRET", SECRET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn transfer-peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("peer started");
        let addr = first
            .strip_prefix("listening ")
            .expect("listening line")
            .to_string();
        Peer {
            child,
            addr,
            lines,
            _stdin: stdin,
        }
    }

    pub fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line from the peer")
    }

    /// Sends SIGSTOP and waits until the kernel reports the process stopped
    /// (signal delivery is asynchronous).
    pub fn freeze(&self) {
        self.signal("-STOP");
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&stat).unwrap_or_default();
            // The state follows the parenthesised command name.
            let state = text
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            if state == Some("T") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "peer did not stop: {text}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
