//! What a head keeps in the run's checkpoint directory so that the head
//! resumed after it (`--resume`) finds the node agents it left running.
//!
//! A resumable run's agents wait for a new head when they lose theirs
//! (`gyre node --head-wait-s`); to join it they must reach it where the
//! lost head listened and prove the same secret, and the new head must
//! know their processes to adopt them (watch, fence, stop) rather than
//! start new ones. So the head writes, next to `core.ckpt` and
//! `run.jsonl`:
//! - `cluster.secret`: the cluster secret, hex, owner-only (0600);
//! - `head.addr`: the address its node agents dial;
//! - `agents.json`: each node's process as the launcher started or adopted
//!   it (`srun`'s under Slurm), by node id.
//!
//! Each is written atomically (a temporary file renamed over the old one).
//! A resumed head reads them; a damaged file is refused naming it, and one
//! that is missing (a run from before these files) means a fresh secret,
//! any address and no agents to adopt.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gyre_runtime::NodeId;

use super::ClusterError;
use crate::cluster::node::{from_hex, to_hex};

const SECRET: &str = "cluster.secret";
const ADDR: &str = "head.addr";
const AGENTS: &str = "agents.json";

fn state_error(path: &Path, what: impl std::fmt::Display) -> ClusterError {
    ClusterError::State {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

/// Writes `text` to `dir/name` atomically, readable by the owner only.
fn write(dir: &Path, name: &str, text: &str) -> Result<(), ClusterError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|e| state_error(&path, e))
}

/// `dir/name`'s text, `None` if there is no such file.
fn read(dir: &Path, name: &str) -> Result<Option<String>, ClusterError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(state_error(&path, e)),
    }
}

/// The head's state files, in a resumable run's checkpoint directory.
#[derive(Debug, Clone)]
pub(super) struct HeadState {
    dir: PathBuf,
}

impl HeadState {
    /// The state of a run with checkpoints in `dir` (none without).
    pub(super) fn new(dir: Option<&Path>) -> Option<Self> {
        dir.map(|d| Self {
            dir: d.to_path_buf(),
        })
    }

    /// The cluster secret: a resumed run's as the lost head wrote it, or a
    /// new one, written for the heads after this one.
    pub(super) fn secret(&self, resume: bool) -> Result<[u8; 32], ClusterError> {
        if resume && let Some(text) = read(&self.dir, SECRET)? {
            let path = self.dir.join(SECRET);
            let bytes = from_hex(&text).map_err(|e| state_error(&path, e))?;
            return <[u8; 32]>::try_from(bytes.as_slice())
                .map_err(|_| state_error(&path, format!("{} bytes, not 32", bytes.len())));
        }
        let secret: [u8; 32] = rand::random();
        write(&self.dir, SECRET, &(to_hex(&secret) + "\n"))?;
        Ok(secret)
    }

    /// Where a resumed head listens: where the lost one did, unless the
    /// user named a port.
    pub(super) fn listen(
        &self,
        resume: bool,
        asked: SocketAddr,
    ) -> Result<SocketAddr, ClusterError> {
        if !resume || asked.port() != 0 {
            return Ok(asked);
        }
        match read(&self.dir, ADDR)? {
            Some(text) => text
                .trim()
                .parse()
                .map_err(|e| state_error(&self.dir.join(ADDR), e)),
            None => Ok(asked),
        }
    }

    pub(super) fn remember_listen(&self, addr: SocketAddr) -> Result<(), ClusterError> {
        write(&self.dir, ADDR, &format!("{addr}\n"))
    }

    /// Each node's process as the last head knew it.
    pub(super) fn agents(&self) -> Result<BTreeMap<NodeId, u32>, ClusterError> {
        let Some(text) = read(&self.dir, AGENTS)? else {
            return Ok(BTreeMap::new());
        };
        let by_id: BTreeMap<u32, u32> =
            serde_json::from_str(&text).map_err(|e| state_error(&self.dir.join(AGENTS), e))?;
        Ok(by_id.into_iter().map(|(n, p)| (NodeId(n), p)).collect())
    }

    /// A new run: no agent of an earlier one is its to adopt.
    pub(super) fn forget_agents(&self) -> Result<(), ClusterError> {
        let path = self.dir.join(AGENTS);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(state_error(&path, e)),
            _ => Ok(()),
        }
    }

    /// Records that `node`'s process is `pid` now.
    pub(super) fn remember_agent(&self, node: NodeId, pid: u32) -> Result<(), ClusterError> {
        let mut by_id: BTreeMap<u32, u32> = self
            .agents()
            .unwrap_or_default()
            .into_iter()
            .map(|(n, p)| (n.0, p))
            .collect();
        by_id.insert(node.0, pid);
        let text = serde_json::to_string(&by_id).map_err(|e| state_error(&self.dir, e))?;
        write(&self.dir, AGENTS, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_head_reads_what_the_lost_one_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let state = HeadState::new(Some(dir.path())).unwrap();
        let secret = state.secret(false).unwrap();
        assert_eq!(state.secret(true).unwrap(), secret, "a resume keeps it");
        assert_ne!(state.secret(false).unwrap(), secret, "a new run draws one");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(SECRET))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only");

        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(
            state.listen(true, any).unwrap(),
            any,
            "nothing recorded yet"
        );
        let at: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        state.remember_listen(at).unwrap();
        assert_eq!(state.listen(true, any).unwrap(), at);
        assert_eq!(state.listen(false, any).unwrap(), any, "a new run");
        let named: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(state.listen(true, named).unwrap(), named, "the user's port");

        assert!(state.agents().unwrap().is_empty());
        state.remember_agent(NodeId(10), 111).unwrap();
        state.remember_agent(NodeId(11), 222).unwrap();
        state.remember_agent(NodeId(10), 333).unwrap();
        assert_eq!(
            state.agents().unwrap(),
            BTreeMap::from([(NodeId(10), 333), (NodeId(11), 222)])
        );
        state.forget_agents().unwrap();
        assert!(state.agents().unwrap().is_empty());
        state.forget_agents().unwrap();
    }

    #[test]
    fn damaged_state_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = HeadState::new(Some(dir.path())).unwrap();
        std::fs::write(dir.path().join(SECRET), "abcd\n").unwrap();
        let e = state.secret(true).unwrap_err().to_string();
        assert!(e.contains(SECRET) && e.contains("2 bytes"), "{e}");
        std::fs::write(dir.path().join(SECRET), "zz").unwrap();
        assert!(state.secret(true).unwrap_err().to_string().contains("hex"));
        std::fs::write(dir.path().join(ADDR), "not an address").unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(
            state
                .listen(true, any)
                .unwrap_err()
                .to_string()
                .contains(ADDR)
        );
        std::fs::write(dir.path().join(AGENTS), "{\"10\": -1}").unwrap();
        assert!(state.agents().unwrap_err().to_string().contains(AGENTS));
    }
}
