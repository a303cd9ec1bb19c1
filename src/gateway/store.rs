//! Durable state in redb: executions, committed calls and the Responses
//! API's stored conversations (`store: true`, found again by
//! `previous_response_id` after a restart). A call is
//! committed (fsynced) before the last byte of its response leaves, so an
//! answered call survives kill -9; a call cut off before its commit leaves
//! nothing. On start the gateway reads everything back in commit order.
//!
//! Calls are group-committed: one writer thread takes every call waiting
//! when it is free and commits them in one transaction, so concurrent calls
//! share a transaction and its fsync while each is still answered only
//! after its own data is durable.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use tokio::sync::oneshot;

use redb::{Database, ReadableTable, TableDefinition};

use super::chat::Message;
use super::execution::{ExecutionMeta, StoredCall};

const EXECUTIONS: TableDefinition<&str, &str> = TableDefinition::new("executions");
/// (execution, commit sequence) → StoredCall JSON; the sequence is global,
/// so it orders calls within each execution.
const CALLS: TableDefinition<(&str, u64), &str> = TableDefinition::new("calls");
/// (execution, response id) → the conversation as JSON messages (its
/// input then the reply), what a later `previous_response_id` continues.
const RESPONSES: TableDefinition<(&str, &str), &str> = TableDefinition::new("responses");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store database: {0}")]
    Db(String),
    #[error("store row is not valid: {0}")]
    Row(#[from] serde_json::Error),
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

pub struct Store {
    db: Database,
}

/// Everything read back on start.
pub struct Loaded {
    pub executions: Vec<ExecutionMeta>,
    /// Per execution, in commit order.
    pub calls: Vec<(String, StoredCall)>,
    /// One past the highest commit sequence stored.
    pub next_seq: u64,
    /// (execution, response id, conversation) of stored Responses.
    pub responses: Vec<(String, String, Vec<Message>)>,
}

impl Store {
    /// Opens (or creates) `DIR/gateway.redb`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(db)?;
        let database = Database::create(dir.join("gateway.redb")).map_err(db)?;
        Self::init(database)
    }

    /// A store that lives in memory only.
    pub fn temporary() -> Result<Store, StoreError> {
        let database = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(db)?;
        Self::init(database)
    }

    fn init(database: Database) -> Result<Store, StoreError> {
        let tx = database.begin_write().map_err(db)?;
        tx.open_table(EXECUTIONS).map_err(db)?;
        tx.open_table(CALLS).map_err(db)?;
        tx.open_table(RESPONSES).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(Store { db: database })
    }

    pub fn put_execution(&self, meta: &ExecutionMeta) -> Result<(), StoreError> {
        let json = serde_json::to_string(meta)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(EXECUTIONS)
            .map_err(db)?
            .insert(meta.id.as_str(), json.as_str())
            .map_err(db)?;
        tx.commit().map_err(db)
    }

    /// Keeps a Responses conversation durably (fsynced on return).
    pub fn put_response(
        &self,
        execution: &str,
        id: &str,
        conversation: &[Message],
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(conversation)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(RESPONSES)
            .map_err(db)?
            .insert((execution, id), json.as_str())
            .map_err(db)?;
        tx.commit().map_err(db)
    }

    /// Commits calls in one transaction, each under its sequence number.
    pub fn put_calls(&self, calls: &[(u64, &StoredCall)]) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        {
            let mut table = tx.open_table(CALLS).map_err(db)?;
            for (seq, call) in calls {
                let json = serde_json::to_string(call)?;
                table
                    .insert((call.record.execution.as_str(), *seq), json.as_str())
                    .map_err(db)?;
            }
        }
        tx.commit().map_err(db)
    }

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let mut executions = Vec::new();
        for row in tx.open_table(EXECUTIONS).map_err(db)?.iter().map_err(db)? {
            let (_, v) = row.map_err(db)?;
            executions.push(serde_json::from_str(v.value())?);
        }
        let mut calls = Vec::new();
        let mut next_seq = 0;
        for row in tx.open_table(CALLS).map_err(db)?.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            let (exec, seq) = k.value();
            next_seq = next_seq.max(seq + 1);
            calls.push((seq, exec.to_string(), serde_json::from_str(v.value())?));
        }
        calls.sort_by_key(|(seq, _, _)| *seq);
        let calls = calls.into_iter().map(|(_, e, c)| (e, c)).collect();
        let mut responses = Vec::new();
        for row in tx.open_table(RESPONSES).map_err(db)?.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            let (exec, id) = k.value();
            responses.push((
                exec.to_string(),
                id.to_string(),
                serde_json::from_str(v.value())?,
            ));
        }
        Ok(Loaded {
            executions,
            calls,
            next_seq,
            responses,
        })
    }
}

struct Job {
    call: StoredCall,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// The handle of the group-commit writer thread.
pub struct Committer {
    jobs: std_mpsc::Sender<Job>,
}

fn write_batches(store: Arc<Store>, jobs: std_mpsc::Receiver<Job>, mut next_seq: u64) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let rows: Vec<(u64, &StoredCall)> = batch
            .iter()
            .enumerate()
            .map(|(i, j)| (next_seq + i as u64, &j.call))
            .collect();
        let result = store.put_calls(&rows);
        if result.is_ok() {
            next_seq += batch.len() as u64;
        }
        for j in batch {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::Db(e.to_string())),
            };
            let _ = j.done.send(r);
        }
    }
}

impl Committer {
    pub fn start(store: Arc<Store>, next_seq: u64) -> Result<Committer, StoreError> {
        let (tx, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("gateway-store-writer".into())
            .spawn(move || write_batches(store, rx, next_seq))
            .map_err(db)?;
        Ok(Committer { jobs: tx })
    }

    /// Durable when this returns Ok.
    pub async fn commit(&self, call: StoredCall) -> Result<StoredCall, StoreError> {
        let (done, wait) = oneshot::channel();
        let keep = call.clone();
        self.jobs
            .send(Job { call, done })
            .map_err(|_| StoreError::Db("the store writer has stopped".into()))?;
        wait.await
            .map_err(|_| StoreError::Db("the store writer has stopped".into()))??;
        Ok(keep)
    }
}
